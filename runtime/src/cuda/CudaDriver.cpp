//===- CudaDriver.cpp - The CUDA driver API, loaded at run time -----------===//

#include "pagedc/CudaDriver.h"
#include "Environment.h"
#include "SymbolResolver.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <mutex>
#include <type_traits>

namespace pagedc {

namespace {

struct Loaded {
  CudaDriver::Api api{};
  std::string path;
  std::string error; // non-empty: no usable driver
  int version = 0;
  bool emulated = false;
};

bool isRegularFile(const std::string &path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

std::string errorText(const CudaDriver::Api &api, cu::Result result) {
  const char *name = nullptr, *text = nullptr;
  if (api.getErrorName)
    api.getErrorName(result, &name);
  if (api.getErrorString)
    api.getErrorString(result, &text);
  return fmt::format("{} ({})", name ? name : fmt::format("CUDA error {}", result),
                     text ? text : "no description");
}

/// Opens the driver library PAGEDC_CUDA_DRIVER names (the emulator's for
/// "emu"), or the system's libcuda; null with `result.error` set if none
/// loads.
void *openDriverLibrary(Loaded &result) {
  // The driver is installed with the kernel module, on the linker's path;
  // the toolkit's lib64/stubs/libcuda.so is a link-time stub and is never
  // loaded.
  void *handle = nullptr;
  const char *chosen = env::get(env::Setting::CudaDriver);
  if (chosen && std::string_view(chosen) == "emu") {
    std::string tried;
    for (const std::string &candidate : emulatorDriverCandidates()) {
      tried += "\n  " + candidate;
      if (!isRegularFile(candidate))
        continue;
      handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) {
        result.path = candidate;
        break;
      }
      tried += fmt::format(" ({})", dlerror());
    }
    if (!handle) {
      result.error = "the SIMT emulator's driver (libpagedc-emu-cuda.so) was not found; "
                     "set PAGEDC_EMU_DRIVER to its path. Tried:" +
                     tried;
      return nullptr;
    }
  } else if (chosen && *chosen) {
    handle = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char *why = dlerror();
      result.error = fmt::format("the CUDA driver named by PAGEDC_CUDA_DRIVER ({}) did not "
                                 "load: {}",
                                 chosen, why ? why : "unknown error");
      return nullptr;
    }
    result.path = chosen;
  } else {
    for (const char *name : {"libcuda.so.1", "libcuda.so"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle) {
        result.path = name;
        break;
      }
    }
    if (!handle) {
      result.error = "no NVIDIA driver: libcuda.so.1 not found";
      if (const char *why = dlerror())
        result.error += fmt::format(" ({})", why);
      return nullptr;
    }
  }
  return handle;
}

/// Resolves the entry points into `api`; returns the names of required
/// ones the library lacks (empty if none).
std::string resolveDriverApi(void *handle, CudaDriver::Api &api) {
  SymbolResolver resolve{handle, {}};
  resolve(api.init, "cuInit");
  resolve(api.driverGetVersion, "cuDriverGetVersion");
  resolve(api.getErrorName, "cuGetErrorName");
  resolve(api.getErrorString, "cuGetErrorString");
  resolve(api.deviceGetCount, "cuDeviceGetCount");
  resolve(api.deviceGet, "cuDeviceGet");
  resolve(api.deviceGetName, "cuDeviceGetName");
  resolve(api.deviceGetAttribute, "cuDeviceGetAttribute");
  resolve(api.deviceTotalMem, "cuDeviceTotalMem_v2");
  resolve(api.primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  resolve(api.primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  resolve(api.ctxSetCurrent, "cuCtxSetCurrent");
  resolve(api.ctxSynchronize, "cuCtxSynchronize");
  resolve(api.moduleLoadData, "cuModuleLoadData");
  resolve(api.moduleUnload, "cuModuleUnload");
  resolve(api.moduleGetFunction, "cuModuleGetFunction");
  resolve(api.funcSetAttribute, "cuFuncSetAttribute");
  resolve(api.occupancyMaxActiveBlocksPerMultiprocessor,
          "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  resolve(api.launchKernel, "cuLaunchKernel");
  resolve(api.memAlloc, "cuMemAlloc_v2");
  resolve(api.memFree, "cuMemFree_v2");
  resolve(api.memcpyHtoD, "cuMemcpyHtoD_v2");
  resolve(api.memcpyDtoH, "cuMemcpyDtoH_v2");
  resolve(api.memsetD8, "cuMemsetD8_v2");
  resolve(api.streamCreate, "cuStreamCreate");
  resolve(api.streamDestroy, "cuStreamDestroy_v2");
  resolve(api.streamSynchronize, "cuStreamSynchronize");
  resolve(api.memcpyDtoD, "cuMemcpyDtoD_v2");
  resolve(api.memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  resolve(api.memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  resolve(api.memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
  resolve(api.memsetD8Async, "cuMemsetD8Async");
  resolve(api.memGetInfo, "cuMemGetInfo_v2");
  resolve(api.eventCreate, "cuEventCreate");
  resolve(api.eventDestroy, "cuEventDestroy_v2");
  resolve(api.eventRecord, "cuEventRecord");
  resolve(api.eventSynchronize, "cuEventSynchronize");
  // CUDA 12.8+ exports the _v2 name (cuda.h maps to it); older drivers
  // only the original.
  if (void *symbol = dlsym(handle, "cuEventElapsedTime_v2"))
    api.eventElapsedTime = reinterpret_cast<decltype(api.eventElapsedTime)>(symbol);
  else
    resolve(api.eventElapsedTime, "cuEventElapsedTime");
  // Optional: programmatic dependent launches fall back to cuLaunchKernel.
  api.launchKernelEx =
      reinterpret_cast<decltype(api.launchKernelEx)>(dlsym(handle, "cuLaunchKernelEx"));
  // Optional: without it the warpgroup prefill gathers every tile.
  api.tensorMapEncodeTiled = reinterpret_cast<decltype(api.tensorMapEncodeTiled)>(
      dlsym(handle, "cuTensorMapEncodeTiled"));
  // Optional: stream capture and graphs, all or none (CudaGraph.h).
  {
    bool complete = true;
    auto optional = [&](auto &slot, const char *name) {
      void *symbol = dlsym(handle, name);
      complete = complete && symbol;
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
    };
    optional(api.streamBeginCapture, "cuStreamBeginCapture_v2");
    optional(api.streamEndCapture, "cuStreamEndCapture");
    optional(api.streamIsCapturing, "cuStreamIsCapturing");
    optional(api.graphInstantiate, "cuGraphInstantiateWithFlags");
    optional(api.graphLaunch, "cuGraphLaunch");
    optional(api.graphExecDestroy, "cuGraphExecDestroy");
    optional(api.graphDestroy, "cuGraphDestroy");
    if (!complete) {
      api.streamBeginCapture = nullptr;
      api.streamEndCapture = nullptr;
      api.streamIsCapturing = nullptr;
      api.graphInstantiate = nullptr;
      api.graphLaunch = nullptr;
      api.graphExecDestroy = nullptr;
      api.graphDestroy = nullptr;
    }
  }
  return resolve.missing;
}

const Loaded &loadDriver() {
  static Loaded loaded = [] {
    Loaded result;
    void *handle = openDriverLibrary(result);
    if (!handle)
      return result;
    result.emulated = dlsym(handle, "pagedcEmuDriverVersion") != nullptr;
    CudaDriver::Api &api = result.api;
    const std::string missing = resolveDriverApi(handle, api);
    if (!missing.empty()) {
      result.error = fmt::format("the NVIDIA driver {} lacks:{}", result.path, missing);
      return result;
    }
    cu::Result status = api.init(0);
    if (status != 0) {
      // The emulator's cuInit fails on PAGEDC_EMU_* settings that do not
      // parse; its description names the variable and the valid values.
      result.error = fmt::format("the {} did not initialise: cuInit failed with {}",
                                 result.emulated ? "SIMT emulator's driver" : "NVIDIA driver",
                                 errorText(api, status));
      return result;
    }
    api.driverGetVersion(&result.version);
    return result;
  }();
  return loaded;
}

} // namespace

std::string CudaDeviceInfo::arch() const {
  return emulated ? std::string("emu") : fmt::format("sm_{}{}", major, minor);
}

std::vector<std::string> emulatorDriverCandidates() {
  std::vector<std::string> candidates;
  if (const char *path = env::get(env::Setting::EmuDriver)) {
    candidates.push_back(path);
    return candidates;
  }
  char self[4096];
  ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length > 0) {
    std::string exe(self, static_cast<size_t>(length));
    candidates.push_back(exe.substr(0, exe.rfind('/')) + "/../lib/libpagedc-emu-cuda.so");
  }
#ifdef PAGEDC_EMU_DRIVER_BUILD
  candidates.push_back(PAGEDC_EMU_DRIVER_BUILD);
#endif
#ifdef PAGEDC_EMU_DRIVER_INSTALL
  candidates.push_back(PAGEDC_EMU_DRIVER_INSTALL);
#endif
  return candidates;
}

bool CudaDriver::available(std::string *reason) {
  const Loaded &loaded = loadDriver();
  if (!loaded.error.empty() && reason)
    *reason = loaded.error;
  return loaded.error.empty();
}

const CudaDriver &CudaDriver::get() {
  static std::once_flag once;
  static CudaDriver instance;
  const Loaded &loaded = loadDriver();
  if (!loaded.error.empty())
    throw Error(loaded.error);
  std::call_once(once, [&] {
    instance.api_ = &loaded.api;
    instance.version_ = loaded.version;
    instance.path_ = loaded.path;
    instance.emulated_ = loaded.emulated;
  });
  return instance;
}

void CudaDriver::check(cu::Result result, std::string_view what) const {
  if (result != 0)
    throw Error(fmt::format("{} failed: {}", what, errorText(*api_, result)));
}

int CudaDriver::deviceCount() const {
  int count = 0;
  check(api_->deviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

CudaDeviceInfo CudaDriver::deviceInfo(int index) const {
  CudaDeviceInfo info;
  info.index = index;
  info.emulated = emulated_;
  cu::Device device = 0;
  check(api_->deviceGet(&device, index), "cuDeviceGet");
  char name[256] = {};
  check(api_->deviceGetName(name, sizeof(name) - 1, device), "cuDeviceGetName");
  info.name = name;
  check(api_->deviceGetAttribute(&info.major, cu::kAttributeComputeCapabilityMajor, device),
        "cuDeviceGetAttribute");
  check(api_->deviceGetAttribute(&info.minor, cu::kAttributeComputeCapabilityMinor, device),
        "cuDeviceGetAttribute");
  check(api_->deviceGetAttribute(&info.multiprocessors, cu::kAttributeMultiprocessorCount, device),
        "cuDeviceGetAttribute");
  check(api_->deviceGetAttribute(&info.maxSharedMemoryPerBlockOptin,
                                 cu::kAttributeMaxSharedMemoryPerBlockOptin, device),
        "cuDeviceGetAttribute");
  check(api_->deviceTotalMem(&info.totalMemoryBytes, device), "cuDeviceTotalMem");
  return info;
}

CudaModule::CudaModule(const CudaDriver &driver, const std::string &image)
    : driver_(driver) {
  driver_.check(driver_.api().moduleLoadData(&module_, image.data()), "cuModuleLoadData");
}

CudaModule::~CudaModule() {
  if (module_)
    driver_.api().moduleUnload(module_);
}

cu::Function CudaModule::function(const std::string &name, int dynamicSharedBytes,
                                  bool maxSharedCarveout) const {
  cu::Function function = nullptr;
  driver_.check(driver_.api().moduleGetFunction(&function, module_, name.c_str()),
                "cuModuleGetFunction(" + name + ")");
  if (dynamicSharedBytes > 48 * 1024)
    driver_.check(driver_.api().funcSetAttribute(
                      function, cu::kFunctionAttributeMaxDynamicSharedSizeBytes,
                      dynamicSharedBytes),
                  "cuFuncSetAttribute(max dynamic shared memory of " + name + ")");
  if (maxSharedCarveout)
    driver_.check(driver_.api().funcSetAttribute(
                      function, cu::kFunctionAttributePreferredSharedMemoryCarveout,
                      cu::kSharedCarveoutMaxShared),
                  "cuFuncSetAttribute(shared memory carveout of " + name + ")");
  return function;
}

} // namespace pagedc
