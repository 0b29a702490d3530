//===- JitEndToEnd.cpp - DSL -> cubin latency with generated code ---------===//
//
// bench/README.md targets §1 on real generated code: examples/mods.attn with
// mask `causal` and score `alibi`, bf16, D=128, page 16, sm_90, for the
// decode (GQA 4) and prefill kernels:
//   cold     .attn text -> front end -> MLIRGen -> pipeline -> EmitC -> C++
//            -> assembleKernel -> NVRTC cubin, empty on-disk cache, fresh
//            MLIRContext, median of 5 (the DSL part is also reported alone);
//            the modules a launch loads (KernelCache::getOrCompileModules:
//            decode's split kernel unit and its merge unit side by side);
//            alternating with it, the same kernel compiled as one unit
//   nvcc     `nvcc -cubin -arch=sm_90` on the identical generated sources
//            (decode's two units side by side, and, for comparison, the
//            whole decode unit alone), each round right after cold's, so
//            both see the same machine; also its CPU seconds (it and its
//            tools, RUSAGE_CHILDREN), so cold/nvcc can be read on CPU
//            seconds on a loaded machine
//   (every kernel is the one a call without a block mask compiles; "with
//            block-mask paths" times the kernel that also takes them, cold
//            and nvcc, for comparison)
//   first    a new process of the runtime-only tool pagedc-jit on an empty
//            cache directory: variant miss, the code generator plugin
//            (libpagedc-codegen.so) is loaded, generates the mod code, NVRTC
//            compiles it and the variant is recorded; median of 5
//   warm     the product's warm path: a new process of pagedc-jit (links the
//            runtime only, no LLVM) reads the .attn file and calls
//            loadCudaMods(); the variant index hits, so the kernel's modules
//            come from the on-disk cache with no compiler loaded. Each run
//            must report outcome=variant-hit, a disk hit per module (decode:
//            2), 0 compiles, plugin not loaded, libLLVM not mapped. Median
//            of 5, process wall (spawn to exit) and time inside the process
//   warm via compiler   the previous warm figure, kept for comparison: a new
//            process of this (LLVM-linked) binary runs the DSL path again to
//            know the kernel key, then hits the on-disk kernel cache
//   hit      in-process KernelCache hit for already generated mod code
//            (Google Benchmark; the table shows a median of 5 batches)
//   stages   where a cold compile goes: .attn -> mod code, source assembly,
//            and NVRTC's own times (--time: C++ front end, NVVM optimizer,
//            PTX -> SASS), each a median of 5 plain compiles of the main
//            unit (decode: the split kernel's)
//   second   a new process of this binary: a cold compile (empty cache),
//            then a second variant (`sliding` + `capped`: .attn -> mod code
//            -> the modules a launch loads; decode's merge unit is the
//            first variant's) timed in that warm process; median of 5
//            processes; and the same with linked mods (kernel option
//            link_mods: the second variant compiles its mods' unit and links)
// Prints a table and writes bench/results/jit-e2e.json (in the source tree).
//
//===----------------------------------------------------------------------===//

#include "BenchArgs.h"
#include "JitBench.h"
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
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
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

using bench::median;

constexpr int kRepetitions = 5;
constexpr const char *kProgram = PAGEDC_BENCH_EXAMPLES_DIR "/mods.attn";
constexpr const char *kMask = "causal";
constexpr const char *kScore = "alibi";
/// The second variant of a warm process.
constexpr const char *kSecondMask = "sliding";
constexpr const char *kSecondScore = "capped";

/// The whole compiler front: .attn file -> generated mod code, in a fresh
/// MLIRContext (what a new variant costs before NVRTC).
std::string generateFromSource(const char *mask = kMask, const char *score = kScore) {
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
  options.keepMods = {mask, score};
  mlir::PassManager pm(&context);
  buildPipeline(pm, options);
  if (mlir::failed(pm.run(*module)))
    throw std::runtime_error("pipeline failed");
  llvm::Expected<std::string> code = generateModCode(*module, mask, score);
  if (!code)
    throw std::runtime_error(llvm::toString(code.takeError()));
  return *code;
}

/// The child of the warm measurement: DSL -> mod code, then one disk lookup
/// that must hit. Writes its own elapsed time to DIR/lookup.txt.
int warmChild(const std::string &kind, const std::string &dir) {
  auto start = Clock::now();
  KernelCache cache(dir);
  std::string mods = generateFromSource();
  auto modules = cache.getOrCompileModules(
      bench::jitBenchConfig(kind == "decode" ? KernelKind::Decode : KernelKind::Prefill),
      mods, bench::jitBenchOptions());
  double elapsed = bench::secondsSince(start);
  if (cache.stats().diskHits != (modules.merge ? 2u : 1u) || cache.stats().compiles != 0 ||
      modules.main->image.empty())
    return 2;
  std::ofstream(dir + "/lookup.txt") << elapsed;
  return 0;
}

/// The child of the second-variant measurement: a cold compile, then a
/// second variant in the same (now warm) process. Writes the second
/// variant's time to DIR/second.txt. KIND "decode+linked" / "prefill+linked":
/// kernels with linked mods (KernelConfig::linkedMods; Params room of 64
/// bytes, linkedParamsCapacity of both variants' Params), whose cold compile
/// is the kernel's unit and the mods' unit and whose second variant
/// compiles the mods' unit and links.
int secondChild(const std::string &kind, const std::string &dir) {
  const bool linked = kind.size() > 7 && kind.compare(kind.size() - 7, 7, "+linked") == 0;
  const std::string base = linked ? kind.substr(0, kind.size() - 7) : kind;
  KernelConfig config =
      bench::jitBenchConfig(base == "decode" ? KernelKind::Decode : KernelKind::Prefill);
  if (linked) {
    config.linkedMods = true;
    config.paramsSize = linkedParamsCapacity(0);
  }
  CompileOptions options = bench::jitBenchOptions();
  KernelCache cache(dir);
  auto first = cache.getOrCompileModules(config, generateFromSource(), options);
  const uint64_t units = (first.merge ? 2 : 1) + (linked ? 1 : 0);
  if (cache.stats().compiles != units || first.main->image.empty())
    return 2;

  auto start = Clock::now();
  auto second =
      cache.getOrCompileModules(config, generateFromSource(kSecondMask, kSecondScore), options);
  double elapsed = bench::secondsSince(start);
  if (cache.stats().compiles != units + 1 || second.main->image.empty() ||
      second.main->image == first.main->image || second.merge != first.merge ||
      cache.stats().links != (linked ? 2u : 0u))
    return 3;
  std::ofstream(dir + "/second.txt") << elapsed;
  return 0;
}

double runSecondChild(const std::string &self, const std::string &kind) {
  std::string dir = bench::freshDirectory("second");
  std::string flag = "--second-child";
  char *argv[] = {const_cast<char *>(self.c_str()), flag.data(), const_cast<char *>(kind.c_str()),
                  dir.data(), nullptr};
  pid_t child;
  if (posix_spawn(&child, self.c_str(), nullptr, nullptr, argv, environ) != 0)
    throw std::runtime_error("posix_spawn failed");
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(
        fmt::format("second-variant child failed (exit {}; 2: the cold compile did not "
                    "compile, 3: the second variant compiled no new main unit, or did not "
                    "take its merge unit from memory)",
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  double elapsed = 0;
  std::ifstream(dir + "/second.txt") >> elapsed;
  fs::remove_all(dir);
  return elapsed;
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
  double wall = bench::secondsSince(start);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("warm child failed (no disk hit?)");
  std::ifstream(dir + "/lookup.txt") >> inChild;
  return wall;
}

/// Runs the runtime-only tool pagedc-jit for `kind` on cache `dir`; returns
/// the process wall time and its --stats line as name -> value.
double runJitTool(const std::string &kind, const std::string &dir,
                  bool requireHit, std::map<std::string, std::string> &stats) {
  std::string statsPath = dir + "/stats.txt";
  std::vector<std::string> args = {
      PAGEDC_BENCH_JIT_TOOL, kProgram, std::string("--mask=") + kMask,
      std::string("--score=") + kScore, "--kernel=" + kind,
      kind == "decode" ? "--gqa=4" : "--gqa=1", "--arch=sm_90", "--dtype=bf16",
      "--head-dim=128", "--page-size=16", "--no-block-mask", "--cache-dir=" + dir,
      "--stats=" + statsPath};
  if (requireHit)
    args.push_back("--require-hit");
  std::vector<char *> argv;
  for (std::string &arg : args)
    argv.push_back(arg.data());
  argv.push_back(nullptr);
  auto start = Clock::now();
  pid_t child;
  if (posix_spawn(&child, PAGEDC_BENCH_JIT_TOOL, nullptr, nullptr, argv.data(),
                  environ) != 0)
    throw std::runtime_error("posix_spawn pagedc-jit failed");
  int status = 0;
  waitpid(child, &status, 0);
  double wall = bench::secondsSince(start);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format(
        "pagedc-jit failed (exit {}; a warm run must hit the variant index)",
        WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  std::ifstream file(statsPath);
  stats.clear();
  for (std::string word; file >> word;)
    if (size_t equals = word.find('='); equals != std::string::npos)
      stats[word.substr(0, equals)] = word.substr(equals + 1);
  return wall;
}

struct KindResult {
  std::string kind;
  std::vector<double> cold, coldCpu, dsl, nvcc, firstProcess, firstInProcess, nvccCpu, warmProcess,
      warmInProcess, warmCompilerProcess, warmCompilerInChild, hit, assemble, frontEnd, optimizer,
      ptxToSass, nvrtc, secondVariant, secondLinked, coldWithMaskPaths, nvccWithMaskPaths, nvccWhole, coldWhole;
};

KindResult measure(KernelKind kind, const std::string &self) {
  KindResult result;
  result.kind = kernelKindName(kind);
  KernelConfig config = bench::jitBenchConfig(kind);
  std::string warmDir, mods;
  for (int i = 0; i < kRepetitions; ++i) {
    std::string dir = bench::freshDirectory("cold");
    auto start = Clock::now();
    double cpu = bench::processCpuSeconds();
    KernelCache cache(dir);
    mods = generateFromSource();
    result.dsl.push_back(bench::secondsSince(start));
    auto modules = cache.getOrCompileModules(config, mods, bench::jitBenchOptions());
    result.cold.push_back(bench::secondsSince(start));
    result.coldCpu.push_back(bench::processCpuSeconds() - cpu);
    if (cache.stats().compiles != (modules.merge ? 2u : 1u) || modules.main->image.empty())
      throw std::runtime_error("cold compile did not compile");
    if (i == 0)
      warmDir = dir;
    else
      fs::remove_all(dir);
    // The same kernel as one unit (bundles, pagedc --emit), alternating
    // with the modules so that both see the same machine.
    std::string wholeDir = bench::freshDirectory("whole");
    start = Clock::now();
    KernelCache wholeCache(wholeDir);
    wholeCache.getOrCompile(config, generateFromSource(), bench::jitBenchOptions());
    result.coldWhole.push_back(bench::secondsSince(start));
    fs::remove_all(wholeDir);
    // nvcc on the identical sources, in the same round: the machine's speed
    // drifts over a run, and a ratio of medians taken minutes apart would
    // carry that drift.
    bench::timeNvcc(PAGEDC_BENCH_NVCC, bench::moduleSources(config, mods), 1, result.nvcc,
                    result.nvccCpu);
    std::vector<double> wholeCpu;
    bench::timeNvcc(PAGEDC_BENCH_NVCC, {assembleKernel(config, mods).code}, 1, result.nvccWhole,
                    wholeCpu);
  }

  // Where the cold time goes: NVRTC's own stage times on plain compiles.
  for (int i = 0; i < kRepetitions; ++i) {
    auto start = Clock::now();
    KernelSource source = assembleKernel(
        config, mods, hasSeparateMergeUnit(config) ? KernelUnit::DecodeSplit : KernelUnit::Whole);
    result.assemble.push_back(bench::secondsSince(start));
    CompileOptions options = bench::jitBenchOptions();
    options.timeStages = true;
    CompileResult compiled = Nvrtc::get().compile(source.code, "stages.cu", options, &source);
    result.frontEnd.push_back(compiled.stages.frontEnd);
    result.optimizer.push_back(compiled.stages.optimizer);
    result.ptxToSass.push_back(compiled.stages.ptxToSass);
    result.nvrtc.push_back(compiled.seconds);
  }

  for (int i = 0; i < kRepetitions; ++i) {
    result.secondVariant.push_back(runSecondChild(self, result.kind));
    result.secondLinked.push_back(runSecondChild(self, result.kind + "+linked"));
  }

  // The kernel that also takes block masks, alternating with nvcc on its
  // source so that both see the same machine.
  const KernelConfig withMaskPaths = bench::jitBenchConfig(kind, /*blockMaskPaths=*/true);
  const std::vector<std::string> withMaskPathsSources = bench::moduleSources(withMaskPaths, mods);
  for (int i = 0; i < kRepetitions; ++i) {
    std::string dir = bench::freshDirectory("masks");
    auto start = Clock::now();
    KernelCache cache(dir);
    auto modules =
        cache.getOrCompileModules(withMaskPaths, generateFromSource(), bench::jitBenchOptions());
    result.coldWithMaskPaths.push_back(bench::secondsSince(start));
    if (cache.stats().compiles != (modules.merge ? 2u : 1u) || modules.main->image.empty())
      throw std::runtime_error("cold compile (with block-mask paths) did not compile");
    fs::remove_all(dir);
    std::vector<double> cpu;
    bench::timeNvcc(PAGEDC_BENCH_NVCC, withMaskPathsSources, 1, result.nvccWithMaskPaths, cpu);
  }

  for (int i = 0; i < kRepetitions; ++i) {
    double inChild = 0;
    result.warmCompilerProcess.push_back(
        runWarmChild(self, result.kind, warmDir, inChild));
    result.warmCompilerInChild.push_back(inChild);
  }
  fs::remove_all(warmDir);

  // The runtime-only path: a variant miss in a new process (plugin + NVRTC),
  // then warm hits of the variant index.
  std::string variantDir;
  std::map<std::string, std::string> stats;
  const std::string units = hasSeparateMergeUnit(config) ? "2" : "1";
  for (int i = 0; i < kRepetitions; ++i) {
    std::string dir = bench::freshDirectory("first");
    result.firstProcess.push_back(runJitTool(result.kind, dir, false, stats));
    if (stats["outcome"] != "generated" || stats["plugin_loaded"] != "1" ||
        stats["compiles"] != units)
      throw std::runtime_error("the first pagedc-jit run did not generate");
    result.firstInProcess.push_back(std::stod(stats["seconds"]));
    if (i == 0)
      variantDir = dir;
    else
      fs::remove_all(dir);
  }
  for (int i = 0; i < kRepetitions; ++i) {
    result.warmProcess.push_back(runJitTool(result.kind, variantDir, true, stats));
    if (stats["outcome"] != "variant-hit" || stats["disk_hits"] != units ||
        stats["compiles"] != "0" || stats["plugin_loaded"] != "0" ||
        stats["llvm_mapped"] != "0")
      throw std::runtime_error("a warm pagedc-jit run was not a clean variant hit");
    result.warmInProcess.push_back(std::stod(stats["seconds"]));
  }
  fs::remove_all(variantDir);

  KernelCache cache("");
  cache.getOrCompile(config, mods, bench::jitBenchOptions());
  for (int i = 0; i < kRepetitions; ++i) {
    constexpr int kHits = 20000;
    auto start = Clock::now();
    for (int j = 0; j < kHits; ++j)
      benchmark::DoNotOptimize(
          cache.getOrCompile(config, mods, bench::jitBenchOptions()));
    result.hit.push_back(bench::secondsSince(start) / kHits);
  }
  return result;
}

void inProcessHit(benchmark::State &state) {
  static KernelCache cache("");
  static std::string mods = generateFromSource();
  KernelConfig config =
      bench::jitBenchConfig(state.range(0) ? KernelKind::Decode : KernelKind::Prefill);
  cache.getOrCompile(config, mods, bench::jitBenchOptions());
  for (auto _ : state)
    benchmark::DoNotOptimize(cache.getOrCompile(config, mods, bench::jitBenchOptions()));
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
  if (argc == 4 && std::string(argv[1]) == "--second-child")
    return secondChild(argv[2], argv[3]);
  if (int status = bench::readBenchmarkArgs(
          argc, argv, "pagedc-bench-jit-e2e",
          "JIT latency with generated code: examples/mods.attn (mask causal, score alibi),\n"
          "bf16, D 128, page 16, sm_90, decode (GQA 4) and prefill, as a call without a\n"
          "block mask compiles them. .attn -> cubin cold against nvcc -cubin on the same\n"
          "generated source, the first and the warm run of pagedc-jit in a new process, an\n"
          "in-process hit, where a cold compile goes (NVRTC's stage split), a second variant\n"
          "in a warm process, and cold and nvcc for the kernels with the block-mask paths;\n"
          "medians of 5. Prints the tables and writes bench/results/jit-e2e.json in the\n"
          "source tree.");
      status >= 0)
    return status;
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
  fmt::print("{:<8} {:>8} {:>10} {:>8} {:>8} {:>9} {:>9} {:>12} {:>10} "
             "{:>13} {:>8}\n",
             "kernel", "cold s", "cold cpu s", "dsl s", "nvcc s", "cold/nvcc",
             "first s", "warm proc ms", "warm in ms", "via LLVM ms", "hit us");
  std::string json =
      "{\n  \"benchmark\": \"jit-e2e\",\n  \"program\": "
      "\"examples/mods.attn causal+alibi\",\n  \"warm\": \"new process of "
      "pagedc-jit (runtime only, no LLVM): variant-index hit, a disk hit per module (decode: 2), "
      "0 compiles, code generator plugin not loaded\",\n  \"load\": " +
      load + ",\n  \"kernels\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const KindResult &r = results[i];
    double ratio = median(r.cold) / median(r.nvcc);
    fmt::print(
        "{:<8} {:>8.3f} {:>10.3f} {:>8.4f} {:>8.3f} {:>9.2f} {:>9.3f} {:>12.2f} "
        "{:>10.2f} {:>13.2f} {:>8.3f}\n",
        r.kind, median(r.cold), median(r.coldCpu), median(r.dsl),
        median(r.nvcc), ratio, median(r.firstProcess),
        median(r.warmProcess) * 1e3, median(r.warmInProcess) * 1e3,
        median(r.warmCompilerProcess) * 1e3, median(r.hit) * 1e6);
    json += fmt::format(
        "    {{\"kernel\": \"{}\", \"cold_s\": {}, \"cold_cpu_s\": {}, "
        "\"dsl_to_mod_code_s\": {}, "
        "\"nvcc_s\": {}, \"cold_over_nvcc\": {:.3f}, \"nvcc_cpu_s\": {}, "
        "\"cold_cpu_over_nvcc_cpu\": {:.3f}, "
        "\"first_process_s\": {}, \"first_in_process_s\": {}, "
        "\"warm_process_s\": {}, \"warm_in_process_s\": {}, "
        "\"warm_process_median_s\": {:.6g}, "
        "\"warm_via_compiler_process_s\": {}, "
        "\"warm_via_compiler_in_process_s\": {}, "
        "\"in_process_hit_s\": {}, "
        "\"stages\": {{\"assemble_s\": {}, \"nvrtc_front_end_s\": {}, "
        "\"nvrtc_optimizer_s\": {}, \"nvrtc_ptx_to_sass_s\": {}, \"nvrtc_s\": {}}}, "
        "\"second_variant_s\": {}, \"second_variant_linked_mods_s\": {}, "
        "\"nvcc_whole_unit_s\": {}, \"cold_whole_unit_s\": {}, "
        "\"with_block_mask_paths\": {{\"cold_s\": {}, \"nvcc_s\": {}}}}}{}\n",
        r.kind, list(r.cold), list(r.coldCpu), list(r.dsl), list(r.nvcc), ratio, list(r.nvccCpu),
        median(r.coldCpu) / median(r.nvccCpu), list(r.firstProcess), list(r.firstInProcess),
        list(r.warmProcess), list(r.warmInProcess), median(r.warmProcess),
        list(r.warmCompilerProcess), list(r.warmCompilerInChild), list(r.hit), list(r.assemble),
        list(r.frontEnd), list(r.optimizer), list(r.ptxToSass), list(r.nvrtc),
        list(r.secondVariant), list(r.secondLinked), list(r.nvccWhole), list(r.coldWhole), list(r.coldWithMaskPaths),
        list(r.nvccWithMaskPaths),
        i + 1 < results.size() ? "," : "");
  }
  fmt::print("\nwhere the cold compile goes (s, medians of {}; NVRTC's --time, the main unit), "
             "a second variant in a warm process (new process each), nvcc and cold on the whole "
             "unit\n",
             kRepetitions);
  fmt::print("{:<8} {:>7} {:>8} {:>9} {:>9} {:>9} {:>8} | {:>11} | {:>10} {:>14} | {:>12} "
             "{:>15} | {:>12} {:>10}\n",
             "kernel", "dsl", "assemble", "front end", "optimizer", "ptx->sass", "nvrtc",
             "2nd variant", "nvcc cpu", "cold/nvcc cpu", "nvcc whole s", "cold/nvcc whole",
             "cold whole s", "cold/whole");
  for (const KindResult &r : results)
    fmt::print("{:<8} {:>7.3f} {:>8.4f} {:>9.3f} {:>9.3f} {:>9.3f} {:>8.3f} | {:>11.3f} | "
               "{:>10.3f} {:>14.2f} | {:>12.3f} {:>15.2f} | {:>12.3f} {:>10.2f}\n",
               r.kind, median(r.dsl), median(r.assemble), median(r.frontEnd), median(r.optimizer),
               median(r.ptxToSass), median(r.nvrtc), median(r.secondVariant), median(r.nvccCpu),
               median(r.coldCpu) / median(r.nvccCpu), median(r.nvccWhole),
               median(r.cold) / median(r.nvccWhole), median(r.coldWhole),
               median(r.cold) / median(r.coldWhole));
  fmt::print("\na second variant in a warm process, inlined mods against linked mods "
             "(kernel option link_mods: the mods' unit and a link), s, medians of {}\n",
             kRepetitions);
  fmt::print("{:<8} {:>9} {:>9}\n", "kernel", "inlined", "linked");
  for (const KindResult &r : results)
    fmt::print("{:<8} {:>9.3f} {:>9.3f}\n", r.kind, median(r.secondVariant),
               median(r.secondLinked));
  fmt::print("\nthe kernels with block-mask paths (calls with a block mask, bundles): cold "
             "and nvcc alternating, medians of {}\n",
             kRepetitions);
  fmt::print("{:<8} {:>8} {:>8} {:>9} {:>20}\n", "kernel", "cold s", "nvcc s", "cold/nvcc",
             "cold without/with");
  for (const KindResult &r : results)
    fmt::print("{:<8} {:>8.3f} {:>8.3f} {:>9.2f} {:>20.2f}\n", r.kind,
               median(r.coldWithMaskPaths), median(r.nvccWithMaskPaths),
               median(r.coldWithMaskPaths) / median(r.nvccWithMaskPaths),
               median(r.cold) / median(r.coldWithMaskPaths));
  std::ifstream("/proc/loadavg") >> load;
  fmt::print("load average at the end {}\n", load);
  json += "  ],\n  \"load_at_end\": " + load +
          ",\n  \"targets\": {\"cold_s\": 1.0, \"cold_over_nvcc\": 0.8, "
          "\"warm_process_s\": 0.020, \"in_process_hit_s\": 5e-6}\n}\n";
  fs::create_directories(PAGEDC_BENCH_RESULTS_DIR);
  std::ofstream(std::string(PAGEDC_BENCH_RESULTS_DIR) + "/jit-e2e.json")
      << json;

  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
