//===- JitBench.h - What the two JIT latency benchmarks share -------------===//
//
// pagedc-bench-jit (hand-written test mods) and pagedc-bench-jit-e2e (mods
// generated from examples/mods.attn) time the same kernels the same way:
// bf16, head dim 128, pages of 16, decode with GQA 4, sm_90, for launches
// without a block mask; wall and CPU seconds, medians, fresh cache
// directories, and nvcc -cubin on the identical source as the anchor.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BENCH_JITBENCH_H
#define PAGEDC_BENCH_JITBENCH_H

#include "pagedc/KernelSource.h"
#include "pagedc/Nvrtc.h"

#include <fmt/format.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace pagedc::bench {

using Clock = std::chrono::steady_clock;

/// The kernel both benchmarks compile: bf16, D 128, page 16, GQA 4 decode,
/// built as a call without a block mask builds it (KernelConfig::noBlockMask);
/// with `blockMaskPaths`, the kernel that also takes block masks (a call with
/// one, and bundles).
inline KernelConfig jitBenchConfig(KernelKind kind, bool blockMaskPaths = false) {
  KernelConfig config;
  config.noBlockMask = !blockMaskPaths;
  config.kind = kind;
  config.elementType = DType::BF16;
  config.headDim = 128;
  config.pageSize = 16;
  config.groupSize = kind == KernelKind::Decode ? 4 : 1;
  return config;
}

inline CompileOptions jitBenchOptions() {
  CompileOptions options;
  options.arch = "sm_90";
  return options;
}

inline double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// CPU seconds of this process, all threads (NVRTC runs in it).
inline double processCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

/// CPU seconds of the waited-for children (nvcc and the tools it runs).
inline double childrenCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_CHILDREN, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

/// A new empty directory under the temporary directory.
inline std::string freshDirectory(const char *tag) {
  std::string pattern = (std::filesystem::temp_directory_path() /
                         fmt::format("pagedc-bench-{}-XXXXXX", tag))
                            .string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("cannot create a directory like " + pattern);
  return pattern;
}

/// `nvcc` -cubin -arch=sm_90 on `sources`, `repetitions` times: the wall
/// and the CPU seconds (nvcc and its tools) of each. Several sources are
/// compiled side by side (one nvcc each, started together), as the runtime
/// compiles a decode's two units (KernelCache::getOrCompileModules).
inline void timeNvcc(const std::string &nvcc, const std::vector<std::string> &sources,
                     int repetitions, std::vector<double> &wall, std::vector<double> &cpu) {
  const std::string work = freshDirectory("nvcc");
  std::string command = "status=0;", waits;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string path = fmt::format("{}/unit{}.cu", work, i);
    std::ofstream(path) << sources[i];
    command += fmt::format(" {} -cubin -arch=sm_90 -std=c++17 {} -o {}/unit{}.cubin & job{}=$!;",
                           nvcc, path, work, i, i);
    waits += fmt::format(" wait $job{} || status=1;", i);
  }
  command += waits + " exit $status";
  for (int i = 0; i < repetitions; ++i) {
    auto start = Clock::now();
    const double before = childrenCpuSeconds();
    if (std::system(command.c_str()) != 0)
      throw std::runtime_error("nvcc failed: " + command);
    wall.push_back(secondsSince(start));
    cpu.push_back(childrenCpuSeconds() - before);
  }
  std::filesystem::remove_all(work);
}

/// The sources of the modules a launch of `config` loads (KernelCache::
/// getOrCompileModules): the split kernel's unit and its merge unit for a
/// split-KV decode, else the whole unit.
inline std::vector<std::string> moduleSources(const KernelConfig &config,
                                              const std::string &modCode) {
  if (!hasSeparateMergeUnit(config))
    return {assembleKernel(config, modCode).code};
  return {assembleKernel(config, modCode, KernelUnit::DecodeSplit).code,
          assembleKernel(decodeMergeConfig(config), "", KernelUnit::DecodeMerge).code};
}

} // namespace pagedc::bench

#endif // PAGEDC_BENCH_JITBENCH_H
