//===- JitLatency.cpp - How long a kernel variant takes to get ------------===//
//
// bench/README.md targets §1, for the decode and prefill kernels (bf16, D=128,
// page 16, causal + ALiBi test mod, sm_90):
//   cold      assemble + NVRTC -> cubin into an empty cache, the modules a
//             launch loads (KernelCache::getOrCompileModules: decode's split
//             kernel and merge units side by side), median of 5
//   nvcc      `nvcc -cubin -arch=sm_90` on the identical sources (decode's
//             two units side by side), median of 5
//   warm      the same variant from the on-disk cache in a new process,
//             median of 5 (whole process, and the lookup inside it)
//   in-proc   a hit in the in-process map (Google Benchmark, and a median
//             of 5 batches for the table)
// Prints a table and writes bench/results/jit.json.
//
//===----------------------------------------------------------------------===//

#include "BenchArgs.h"
#include "BenchJson.h"
#include "JitBench.h"
#include "pagedc/KernelCache.h"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

using namespace pagedc;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

extern char **environ;

namespace {

using bench::median;

constexpr int kRepetitions = 5;

std::string loadAverage() {
  std::ifstream file("/proc/loadavg");
  std::string first;
  file >> first;
  return first;
}

std::string benchMods() { return std::string(embeddedTemplate("testing/alibi.cuh")); }

/// Runs this binary as `--warm-child KIND DIR` and returns its wall time;
/// the child's own lookup time comes back through `lookup`.
double runWarmChild(const std::string &self, const std::string &kind, const std::string &dir,
                    double &lookup) {
  std::string resultFile = dir + "/lookup.txt";
  std::string flag = "--warm-child";
  char *argv[] = {const_cast<char *>(self.c_str()), flag.data(), const_cast<char *>(kind.c_str()),
                  const_cast<char *>(dir.c_str()), nullptr};
  auto start = Clock::now();
  pid_t child;
  if (posix_spawn(&child, self.c_str(), nullptr, nullptr, argv, environ) != 0)
    throw std::runtime_error("posix_spawn failed");
  int status = 0;
  waitpid(child, &status, 0);
  double wall = bench::secondsSince(start);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("warm child failed");
  std::ifstream(resultFile) >> lookup;
  return wall;
}

/// The child: one disk lookup, which must be a hit.
int warmChild(const std::string &kind, const std::string &dir) {
  auto start = Clock::now();
  KernelCache cache(dir);
  const KernelConfig config =
      bench::jitBenchConfig(kind == "decode" ? KernelKind::Decode : KernelKind::Prefill);
  auto modules = cache.getOrCompileModules(config, benchMods(), bench::jitBenchOptions());
  double lookup = bench::secondsSince(start);
  if (cache.stats().diskHits != (modules.merge ? 2u : 1u) || cache.stats().compiles != 0 ||
      modules.main->image.empty())
    return 2;
  std::ofstream(dir + "/lookup.txt") << lookup;
  return 0;
}

struct KindResult {
  std::string kind;
  std::vector<double> cold, coldCpu, nvcc, nvccCpu, warmProcess, warmLookup, inProcess;
  int registers = 0;
};

KindResult measure(KernelKind kind, const std::string &self) {
  KindResult result;
  result.kind = kernelKindName(kind);
  KernelConfig config = bench::jitBenchConfig(kind);
  std::string mods = benchMods();
  std::string warmDir;
  for (int i = 0; i < kRepetitions; ++i) {
    std::string dir = bench::freshDirectory("cold");
    KernelCache cache(dir);
    auto start = Clock::now();
    double cpu = bench::processCpuSeconds();
    cache.getOrCompileModules(config, mods, bench::jitBenchOptions());
    result.cold.push_back(bench::secondsSince(start));
    result.coldCpu.push_back(bench::processCpuSeconds() - cpu);
    if (i == 0)
      warmDir = dir;
    else
      fs::remove_all(dir);
    // nvcc on the identical sources, in the same round, so that both see
    // the same machine (its speed drifts over a run).
    bench::timeNvcc(PAGEDC_BENCH_NVCC, bench::moduleSources(config, mods), 1, result.nvcc,
                    result.nvccCpu);
  }
  for (int i = 0; i < kRepetitions; ++i) {
    double lookup = 0;
    result.warmProcess.push_back(runWarmChild(self, result.kind, warmDir, lookup));
    result.warmLookup.push_back(lookup);
  }
  fs::remove_all(warmDir);
  // In-process: batches of hits.
  KernelCache cache("");
  cache.getOrCompile(config, mods, bench::jitBenchOptions());
  for (int i = 0; i < kRepetitions; ++i) {
    constexpr int kHits = 20000;
    auto start = Clock::now();
    for (int j = 0; j < kHits; ++j)
      benchmark::DoNotOptimize(cache.getOrCompile(config, mods, bench::jitBenchOptions()));
    result.inProcess.push_back(bench::secondsSince(start) / kHits);
  }
  return result;
}

void inProcessHit(benchmark::State &state) {
  static KernelCache cache("");
  KernelConfig config =
      bench::jitBenchConfig(state.range(0) ? KernelKind::Decode : KernelKind::Prefill);
  std::string mods = benchMods();
  CompileOptions options = bench::jitBenchOptions();
  cache.getOrCompile(config, mods, options);
  for (auto _ : state)
    benchmark::DoNotOptimize(cache.getOrCompile(config, mods, options));
}
BENCHMARK(inProcessHit)->Arg(0)->Arg(1)->ArgName("decode");

} // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::string(argv[1]) == "--warm-child")
    return warmChild(argv[2], argv[3]);
  if (int status = bench::readBenchmarkArgs(
          argc, argv, "pagedc-bench-jit",
          "How long a kernel variant takes to get, for the decode and prefill kernels (bf16,\n"
          "D 128, page 16, the causal + ALiBi test mod, sm_90): a cold NVRTC compile into an\n"
          "empty cache against nvcc -cubin on the same source, the variant from the on-disk\n"
          "cache in a new process, and a hit in the in-process map; medians of 5. Prints a\n"
          "table and writes bench/results/jit.json in the source tree.");
      status >= 0)
    return status;
  std::string reason;
  if (!Nvrtc::available(&reason)) {
    fmt::print(stderr, "pagedc-bench-jit: NVRTC unavailable: {}\n", reason);
    return 1;
  }
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<KindResult> results;
  for (KernelKind kind : {KernelKind::Decode, KernelKind::Prefill})
    results.push_back(measure(kind, self));

  fmt::print("\nload average at the end: {}\n", loadAverage());
  fmt::print("\nJIT latency, bf16 D=128 page 16, causal+alibi mod, sm_90, NVRTC {}.{}, "
             "median of {} (min..max)\n",
             Nvrtc::get().majorVersion(), Nvrtc::get().minorVersion(), kRepetitions);
  fmt::print("{:<8} {:>22} {:>22} {:>7} {:>9} {:>9} {:>6} {:>20} {:>18} {:>10}\n", "kernel",
             "cold NVRTC wall s", "nvcc -cubin wall s", "ratio", "cold cpu", "nvcc cpu",
             "ratio", "warm process ms", "warm lookup ms", "in-proc us");
  auto range = [](const std::vector<double> &v, double scale) {
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return fmt::format("{:.3f} ({:.3f}..{:.3f})", median(v) * scale, *lo * scale, *hi * scale);
  };
  bench::Json kernels = bench::Json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const KindResult &r = results[i];
    double ratio = median(r.cold) / median(r.nvcc);
    double cpuRatio = median(r.coldCpu) / median(r.nvccCpu);
    fmt::print("{:<8} {:>22} {:>22} {:>7.2f} {:>9.3f} {:>9.3f} {:>6.2f} {:>20} {:>18} {:>10.3f}\n",
               r.kind, range(r.cold, 1), range(r.nvcc, 1), ratio, median(r.coldCpu),
               median(r.nvccCpu), cpuRatio, range(r.warmProcess, 1e3), range(r.warmLookup, 1e3),
               median(r.inProcess) * 1e6);
    auto list = [](const std::vector<double> &v) {
      bench::Json values = bench::Json::array();
      for (double x : v)
        values.push_back(bench::rounded(x, 9));
      return values;
    };
    kernels.push_back({{"kernel", r.kind},
                       {"cold_nvrtc_s", list(r.cold)},
                       {"nvcc_s", list(r.nvcc)},
                       {"cold_over_nvcc", bench::rounded(ratio, 3)},
                       {"cold_nvrtc_cpu_s", list(r.coldCpu)},
                       {"nvcc_cpu_s", list(r.nvccCpu)},
                       {"cold_over_nvcc_cpu", bench::rounded(cpuRatio, 3)},
                       {"warm_process_s", list(r.warmProcess)},
                       {"warm_lookup_s", list(r.warmLookup)},
                       {"in_process_hit_s", list(r.inProcess)}});
  }
  std::string out = std::string(PAGEDC_BENCH_RESULTS_DIR) + "/jit.json";
  fs::create_directories(PAGEDC_BENCH_RESULTS_DIR);
  bench::writeJson("results", out,
                   {{"benchmark", "jit-latency"},
                    {"nvrtc", fmt::format("{}.{}", Nvrtc::get().majorVersion(),
                                          Nvrtc::get().minorVersion())},
                    {"arch", "sm_90"},
                    {"repetitions", kRepetitions},
                    {"load_average", loadAverage()},
                    {"kernels", kernels},
                    {"targets",
                     {{"cold_nvrtc_s", 1.0},
                      {"cold_over_nvcc", 0.8},
                      {"warm_process_s", 0.020},
                      {"in_process_hit_s", 5e-6}}}});
  fmt::print("wrote {}\n\n", out);

  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
