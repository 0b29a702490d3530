//===- CudaMergeState.cpp - mergeState on CUDA devices --------------------===//
#include "cuda/CudaMergeState.h"

#include "pagedc/CudaAttention.h"
#include "pagedc/CudaLaunch.h"
#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"
#include "pagedc/KernelSource.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace pagedc::detail {

namespace {

/// Threads of a merge CTA (templates/MergeState.cuh, kMergeThreads).
constexpr unsigned kMergeThreads = 64;

struct MergeKernel {
  std::shared_ptr<CudaModule> module;
  cu::Function function = nullptr;
};

KernelSource mergeStateSource() {
  KernelSource source;
  source.code = "// pagedc kernel: merge_state\n";
  for (const char *name : {"Prelude.cuh", "KernelArgs.h", "MergeState.cuh"}) {
    source.code += fmt::format("// ---- {} ----\n", name);
    source.code += embeddedTemplate(name);
    if (source.code.back() != '\n')
      source.code += '\n';
  }
  source.kernelNames = {"pagedc_merge_state"};
  return source;
}

const MergeKernel &mergeKernelFor(int deviceIndex) {
  static std::mutex mutex;
  static std::map<int, MergeKernel> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find(deviceIndex);
  if (found != loaded.end())
    return found->second;
  const CudaDriver &driver = cudaUseDevice(deviceIndex);
  CompileOptions options;
  options.arch = cudaDeviceInfo(deviceIndex).arch();
  std::shared_ptr<const CompiledKernel> compiled =
      KernelCache::global().getOrCompile(mergeStateSource(), options);
  MergeKernel kernel;
  kernel.module = std::make_shared<CudaModule>(driver, compiled->image);
  kernel.function = kernel.module->function("pagedc_merge_state");
  return loaded.emplace(deviceIndex, std::move(kernel)).first->second;
}

} // namespace

void cudaMergeStates(const PagedcMergeStateArgs &args, int deviceIndex, void *stream) {
  const MergeKernel &kernel = mergeKernelFor(deviceIndex);
  const CudaDriver &driver = cudaUseDevice(deviceIndex);
  if (args.tokens == 0 || args.heads == 0)
    return;
  KernelLaunch launch;
  launch.kernel = "pagedc_merge_state";
  launch.grid[0] = static_cast<unsigned>(args.tokens);
  launch.grid[1] = static_cast<unsigned>(args.heads);
  launch.block[0] = kMergeThreads;
  launch.arguments.emplace_back(sizeof(args));
  std::memcpy(launch.arguments.back().data(), &args, sizeof(args));
  const auto cuStream = static_cast<cu::Stream>(stream);
  launchKernel(driver, kernel.function, launch, cuStream);
  if (!stream)
    driver.check(driver.api().streamSynchronize(cuStream), "cuStreamSynchronize (merge_state)");
}

} // namespace pagedc::detail
