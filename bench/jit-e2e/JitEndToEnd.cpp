//===- JitEndToEnd.cpp - DSL -> cubin latency with generated code ---------===//
//
// performance.md section 1 on real generated code: examples/mods.attn with
// mask `causal` and score `alibi`, bf16, D=128, page 16, sm_90, for the
// decode (GQA 4) and prefill kernels:
//   cold     .attn text -> front end -> MLIRGen -> pipeline -> EmitC -> C++
//            -> assembleKernel -> NVRTC cubin, empty on-disk cache, fresh
//            MLIRContext, median of 5 (the DSL part is also reported alone)
//   nvcc     `nvcc -cubin -arch=sm_90` on the identical generated source
//   warm     a new process: the DSL path again (to know the key) plus an
//            on-disk cache hit; median of 5, process wall and in-process time
//   hit      in-process KernelCache hit for already generated mod code
//            (Google Benchmark; the table shows a median of 5 batches)
// Prints a table and writes bench/results/jit-e2e.json.
//
//===----------------------------------------------------------------------===//

#include "Target/CudaSource.h"

#include "Conversion/CUDA/FlexToEmitC.h"
#include "Frontend/Frontend.h"
#include "Frontend/MLIRGen.h"
#include "Pipeline.h"

#include "pagedc/KernelCache.h"
#include "pagedc/Nvrtc.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/MemoryBuffer.h"

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <stdexcept>

using namespace pagedc;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

extern char **environ;

namespace {

constexpr int kRepetitions = 5;
constexpr const char *kProgram = PAGEDC_BENCH_EXAMPLES_DIR "/mods.attn";
constexpr const char *kMask = "causal";
constexpr const char *kScore = "alibi";

double seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

KernelConfig benchConfig(KernelKind kind) {
  KernelConfig config;
  config.kind = kind;
  config.elementType = DType::BF16;
  config.headDim = 128;
  config.pageSize = 16;
  config.groupSize = kind == KernelKind::Decode ? 4 : 1;
  return config;
}

CompileOptions benchOptions() {
  CompileOptions options;
  options.arch = "sm_90";
  return options;
}

/// The whole compiler front: .attn file -> generated mod code, in a fresh
/// MLIRContext (what a new variant costs before NVRTC).
std::string generateFromSource() {
  auto buffer = llvm::MemoryBuffer::getFile(kProgram, /*IsText=*/true);
  if (!buffer)
    throw std::runtime_error(std::string("cannot read ") + kProgram);
  std::string messages;
  llvm::raw_string_ostream diagnostics(messages);
  DiagnosticEngine diags(kProgram, (*buffer)->getBuffer(), diagnostics);
  auto program = parseAndAnalyze(diags, FrontendOptions());
  if (!program)
    throw std::runtime_error(messages);
  mlir::DialectRegistry registry;
  registerFlexDialects(registry);
  registerCudaLoweringDialects(registry);
  mlir::MLIRContext context(registry);
  mlir::OwningOpRef<mlir::ModuleOp> module = mlirGen(context, *program);
  if (!module)
    throw std::runtime_error("MLIRGen failed");
  PipelineOptions options;
  options.keepMods = {kMask, kScore};
  mlir::PassManager pm(&context);
  buildPipeline(pm, options);
  if (mlir::failed(pm.run(*module)))
    throw std::runtime_error("pipeline failed");
  llvm::Expected<std::string> code = generateModCode(*module, kMask, kScore);
  if (!code)
    throw std::runtime_error(llvm::toString(code.takeError()));
  return *code;
}

/// CPU seconds of this process, all threads (NVRTC included).
double processCpu() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

std::string freshDirectory(const char *tag) {
  std::string pattern =
      (fs::temp_directory_path() / fmt::format("pagedc-e2e-{}-XXXXXX", tag))
          .string();
  return mkdtemp(pattern.data());
}

/// The child of the warm measurement: DSL -> mod code, then one disk lookup
/// that must hit. Writes its own elapsed time to DIR/lookup.txt.
int warmChild(const std::string &kind, const std::string &dir) {
  auto start = Clock::now();
  KernelCache cache(dir);
  std::string mods = generateFromSource();
  auto kernel = cache.getOrCompile(
      benchConfig(kind == "decode" ? KernelKind::Decode : KernelKind::Prefill),
      mods, benchOptions());
  double elapsed = seconds(start);
  if (cache.stats().diskHits != 1 || kernel->image.empty())
    return 2;
  std::ofstream(dir + "/lookup.txt") << elapsed;
  return 0;
}

double runWarmChild(const std::string &self, const std::string &kind,
                    const std::string &dir, double &inChild) {
  std::string flag = "--warm-child";
  char *argv[] = {const_cast<char *>(self.c_str()), flag.data(),
                  const_cast<char *>(kind.c_str()),
                  const_cast<char *>(dir.c_str()), nullptr};
  auto start = Clock::now();
  pid_t child;
  if (posix_spawn(&child, self.c_str(), nullptr, nullptr, argv, environ) != 0)
    throw std::runtime_error("posix_spawn failed");
  int status = 0;
  waitpid(child, &status, 0);
  double wall = seconds(start);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("warm child failed (no disk hit?)");
  std::ifstream(dir + "/lookup.txt") >> inChild;
  return wall;
}

struct KindResult {
  std::string kind;
  std::vector<double> cold, coldCpu, dsl, nvcc, warmProcess, warmInChild, hit;
};

KindResult measure(KernelKind kind, const std::string &self) {
  KindResult result;
  result.kind = kernelKindName(kind);
  KernelConfig config = benchConfig(kind);
  std::string warmDir, mods;
  for (int i = 0; i < kRepetitions; ++i) {
    std::string dir = freshDirectory("cold");
    auto start = Clock::now();
    double cpu = processCpu();
    KernelCache cache(dir);
    mods = generateFromSource();
    result.dsl.push_back(seconds(start));
    auto kernel = cache.getOrCompile(config, mods, benchOptions());
    result.cold.push_back(seconds(start));
    result.coldCpu.push_back(processCpu() - cpu);
    if (cache.stats().compiles != 1 || kernel->image.empty())
      throw std::runtime_error("cold compile did not compile");
    if (i == 0)
      warmDir = dir;
    else
      fs::remove_all(dir);
  }

  std::string work = freshDirectory("nvcc");
  std::string path = work + "/kernel.cu";
  std::ofstream(path) << assembleKernel(config, mods).code;
  std::string command =
      fmt::format("{} -cubin -arch=sm_90 -std=c++17 {} -o {}/kernel.cubin",
                  PAGEDC_BENCH_NVCC, path, work);
  for (int i = 0; i < kRepetitions; ++i) {
    auto start = Clock::now();
    if (std::system(command.c_str()) != 0)
      throw std::runtime_error("nvcc failed: " + command);
    result.nvcc.push_back(seconds(start));
  }
  fs::remove_all(work);

  for (int i = 0; i < kRepetitions; ++i) {
    double inChild = 0;
    result.warmProcess.push_back(
        runWarmChild(self, result.kind, warmDir, inChild));
    result.warmInChild.push_back(inChild);
  }
  fs::remove_all(warmDir);

  KernelCache cache("");
  cache.getOrCompile(config, mods, benchOptions());
  for (int i = 0; i < kRepetitions; ++i) {
    constexpr int kHits = 20000;
    auto start = Clock::now();
    for (int j = 0; j < kHits; ++j)
      benchmark::DoNotOptimize(
          cache.getOrCompile(config, mods, benchOptions()));
    result.hit.push_back(seconds(start) / kHits);
  }
  return result;
}

void inProcessHit(benchmark::State &state) {
  static KernelCache cache("");
  static std::string mods = generateFromSource();
  KernelConfig config =
      benchConfig(state.range(0) ? KernelKind::Decode : KernelKind::Prefill);
  cache.getOrCompile(config, mods, benchOptions());
  for (auto _ : state)
    benchmark::DoNotOptimize(cache.getOrCompile(config, mods, benchOptions()));
}
BENCHMARK(inProcessHit)->Arg(0)->Arg(1)->ArgName("decode");

void dslToModCode(benchmark::State &state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(generateFromSource());
}
BENCHMARK(dslToModCode)->Unit(benchmark::kMillisecond);

std::string list(const std::vector<double> &values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i)
    text += fmt::format("{}{:.6g}", i ? ", " : "", values[i]);
  return text + "]";
}

} // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::string(argv[1]) == "--warm-child")
    return warmChild(argv[2], argv[3]);
  std::string reason;
  if (!Nvrtc::available(&reason)) {
    fmt::print(stderr, "pagedc-bench-jit-e2e: NVRTC unavailable: {}\n", reason);
    return 1;
  }
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string load;
  std::ifstream("/proc/loadavg") >> load;
  std::vector<KindResult> results;
  for (KernelKind kind : {KernelKind::Decode, KernelKind::Prefill})
    results.push_back(measure(kind, self));

  fmt::print("JIT latency with generated code ({} {}+{}, bf16 d128 page16 "
             "sm_90), medians of {}; load average {}\n",
             kProgram, kMask, kScore, kRepetitions, load);
  fmt::print("{:<8} {:>10} {:>10} {:>10} {:>10} {:>8} {:>12} {:>12} {:>10}\n",
             "kernel", "cold s", "cold cpu s", "dsl s", "nvcc s", "cold/nvcc",
             "warm proc ms", "warm in ms", "hit us");
  std::string json = "{\n  \"benchmark\": \"jit-e2e\",\n  \"program\": "
                     "\"examples/mods.attn causal+alibi\",\n  \"load\": " +
                     load + ",\n  \"kernels\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const KindResult &r = results[i];
    double ratio = median(r.cold) / median(r.nvcc);
    fmt::print(
        "{:<8} {:>10.3f} {:>10.3f} {:>10.4f} {:>10.3f} {:>8.2f} {:>12.2f} "
        "{:>12.2f} {:>10.3f}\n",
        r.kind, median(r.cold), median(r.coldCpu), median(r.dsl),
        median(r.nvcc), ratio, median(r.warmProcess) * 1e3,
        median(r.warmInChild) * 1e3, median(r.hit) * 1e6);
    json += fmt::format(
        "    {{\"kernel\": \"{}\", \"cold_s\": {}, \"cold_cpu_s\": {}, "
        "\"dsl_to_mod_code_s\": {}, "
        "\"nvcc_s\": {}, \"cold_over_nvcc\": {:.3f}, \"warm_process_s\": {}, "
        "\"warm_in_process_s\": {}, \"in_process_hit_s\": {}}}{}\n",
        r.kind, list(r.cold), list(r.coldCpu), list(r.dsl), list(r.nvcc), ratio,
        list(r.warmProcess), list(r.warmInChild), list(r.hit),
        i + 1 < results.size() ? "," : "");
  }
  json += "  ],\n  \"targets\": {\"cold_s\": 1.0, \"cold_over_nvcc\": 0.8, "
          "\"warm_process_s\": 0.020, \"in_process_hit_s\": 5e-6}\n}\n";
  fs::create_directories(PAGEDC_BENCH_RESULTS_DIR);
  std::ofstream(std::string(PAGEDC_BENCH_RESULTS_DIR) + "/jit-e2e.json")
      << json;

  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
