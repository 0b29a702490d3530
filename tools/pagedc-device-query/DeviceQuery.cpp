//===- DeviceQuery.cpp - List CUDA devices --------------------------------===//
//
// Prints one line per device, "cuda:N <name> sm_XY <memory> GiB <SMs> SMs",
// and exits 0; or prints why there is no usable device and exits 1. It takes
// no arguments but --help.
//
//===----------------------------------------------------------------------===//

#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <cstdio>
#include <string>

int main(int argc, char **argv) {
  if (argc > 1) {
    const std::string arg = argv[1];
    if (arg == "-h" || arg == "--help") {
      fmt::print("usage: pagedc-device-query [--help]\n\n"
                 "Lists the CUDA devices the NVIDIA driver reports, one line each:\n"
                 "  cuda:N <name> sm_XY <memory> GiB <SMs> SMs\n"
                 "\nEXIT STATUS: 0 with a device listed; 1 without a driver or a device (the\n"
                 "reason on standard error); 2 on a usage error.\n");
      return 0;
    }
    fmt::print(stderr, "pagedc-device-query: unknown argument '{}' (it takes none; --help)\n",
               arg);
    return 2;
  }
  std::string reason;
  if (!pagedc::CudaDriver::available(&reason)) {
    fmt::print(stderr, "pagedc-device-query: {}\n", reason);
    return 1;
  }
  try {
    const pagedc::CudaDriver &driver = pagedc::CudaDriver::get();
    int count = driver.deviceCount();
    if (count == 0) {
      fmt::print(stderr, "pagedc-device-query: the NVIDIA driver reports no devices\n");
      return 1;
    }
    for (int i = 0; i < count; ++i) {
      pagedc::CudaDeviceInfo info = driver.deviceInfo(i);
      fmt::print("cuda:{} {} {} {:.1f} GiB {} SMs\n", i, info.name, info.arch(),
                 static_cast<double>(info.totalMemoryBytes) / (1u << 30),
                 info.multiprocessors);
    }
  } catch (const pagedc::Error &error) {
    fmt::print(stderr, "pagedc-device-query: {}\n", error.what());
    return 1;
  }
  return 0;
}
