//===- BatchAttentionBench.cpp - The serving batch call on the CPU --------===//
//
// Two studies of BatchAttention (docs/serving.md), medians over --reps runs:
//   plan: host time of plan() for a step of 256 sequences and 8192 tokens
//         (224 decodes, 32 chunks of 249 tokens; contexts up to 4k, page 16);
//   mixed: one step of decodes and prefill chunks (Hq 32, Hkv 8, D 128,
//         page 16, causal with its block classifier) as one BatchAttention
//         run, against the same rows as two flexAttention calls (the decodes
//         as one batch, the chunks as another) over the same pages. The
//         ratio is separate / mixed: above 1 the mixed step is faster.
// With --cuda, in their place, on the CUDA device the driver gives (the SIMT
// emulator's with PAGEDC_CUDA_DRIVER=emu), for the plan study's step (bf16,
// causal, NHD):
//   cuda-plan: host time of plan(), its synchronous uploads included;
//   cuda-run:  host time of run() with the stream being captured, so that
//         each launch is recorded into the graph, not executed: pagedc's own
//         host work (checks, argument packing) and the driver's recording,
//         each plan's own grids and the fixed grid's;
//   cuda-run-eager (a GPU's driver only): host time of run() outside a
//         capture, the driver's cuLaunchKernel included;
//   cuda-graph-replay (a GPU's driver only): host time of one launch of the
//         step captured into a graph.
//
// Usage: pagedc-bench-serving [--reps N] [--threads T] [--json FILE] [--cuda]
//
//===----------------------------------------------------------------------===//
#include "BenchJson.h"
#include "cuda/CudaGraph.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Attention.h"
#include "pagedc/BatchAttention.h"
#include "pagedc/Error.h"
#include "pagedc/KVCache.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace pagedc;

namespace {

void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kv, int32_t count,
               uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kv + i;
}
int32_t causalClass(const PagedcModContext *, int32_t, int32_t, int32_t qLow, int32_t qHigh,
                    int32_t kvLow, int32_t kvHigh) {
  return qHigh < kvLow ? 0 : (qLow >= kvHigh ? 2 : 1);
}

/// A window of the 1,024 keys ending at each query, a constant of the mod:
/// its exact classifier lets plan() start each sequence at its window.
constexpr int32_t kPlanWindow = 1024;
void windowRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kv, int32_t count,
               uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kv + i && q - (kv + i) < kPlanWindow;
}
int32_t windowClass(const PagedcModContext *, int32_t, int32_t, int32_t qLow, int32_t qHigh,
                    int32_t kvLow, int32_t kvHigh) {
  if (qHigh < kvLow || qLow - kvHigh >= kPlanWindow)
    return 0;
  return qLow >= kvHigh && qHigh - kvLow < kPlanWindow ? 2 : 1;
}

/// A mask of index arithmetic on q and kv alone, with its exact classifier
/// and what the compiler's dependence analysis says of such a mask (q and
/// kv, through their difference): as a compiled mask, its classifier bounds
/// keys when plan() runs.
CompiledMods classifiedMask(const char *name, PagedcMaskRowFn row, PagedcBlockClassFn classify) {
  CompiledMods mods;
  mods.maskName = name;
  mods.maskRow = row;
  mods.maskBlockClass = classify;
  mods.maskDependence = {false, false, true, true, true, {}, {}};
  return mods;
}

CompiledMods windowMods() { return classifiedMask("window", windowRow, windowClass); }
CompiledMods causalMods() { return classifiedMask("causal", causalRow, causalClass); }

double seconds(const std::function<void()> &body) {
  auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double medianOf(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// Median seconds of `reps` runs of `body`.
double median(int reps, const std::function<void()> &body) {
  std::vector<double> times;
  for (int i = 0; i < reps; ++i)
    times.push_back(seconds(body));
  return medianOf(times);
}

/// Host seconds of each of `reps` calls of `body`, which enqueues work on
/// `stream` of a GPU's driver, after one untimed call. The stream is
/// drained every 32 calls, outside the timed ones, so that the launch
/// queue never fills (a full queue would block the launches).
std::vector<double> drainedTimes(const CudaDriver &driver, cu::Stream stream, int reps,
                                 const std::function<void()> &body) {
  constexpr int kDrainEvery = 32;
  body();
  driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    times.push_back(seconds(body));
    if ((i + 1) % kDrainEvery == 0)
      driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
  }
  driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize");
  return times;
}

struct Options {
  int reps = 20;
  int threads = 0;
  std::string json;
  bool cuda = false;
};

/// The plan studies' step: 256 sequences, 224 decodes and 32 chunks of 249
/// tokens (8192 tokens), contexts up to 4k keys on pages of 16, block
/// table [256, 256] whose entries cycle through `pages` pages.
struct PlanStep {
  static constexpr int64_t seqs = 256, pageSize = 16, columns = 256;
  std::vector<int32_t> qsl{0}, lens, table;

  explicit PlanStep(int32_t pages) : table(seqs * columns) {
    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> context(64, 4096 - 249);
    for (int64_t b = 0; b < seqs; ++b) {
      const int32_t newTokens = b < 224 ? 1 : 249;
      qsl.push_back(qsl.back() + newTokens);
      lens.push_back(context(rng) + newTokens);
    }
    for (size_t i = 0; i < table.size(); ++i)
      table[i] = static_cast<int32_t>(i % static_cast<size_t>(pages));
  }
  BatchAttentionConfig config() const {
    BatchAttentionConfig config;
    config.numQHeads = 32;
    config.numKVHeads = 8;
    config.headDim = 128;
    config.pageSize = pageSize;
    config.maxNumSeqs = seqs;
    config.maxNumTokens = 8192;
    config.maxBlocksPerSeq = columns;
    return config;
  }
  void plan(BatchAttention &attention) {
    attention.plan(TensorView(qsl.data(), DType::I32, {seqs + 1}),
                   TensorView(lens.data(), DType::I32, {seqs}),
                   TensorView(table.data(), DType::I32, {seqs, columns}));
  }
};

bench::Json planStudy(const Options &options) {
  PlanStep step(60000);
  BatchAttention attention(CompiledMods{}, step.config());
  const double seconds =
      median(std::max(options.reps, 1) * 50, [&] { step.plan(attention); });
  fmt::print("plan   256 sequences, {} tokens, block table [256, 256]: {:.1f} us (median)\n",
             attention.numTokens(), seconds * 1e6);
  // The same step under a 1,024-key window that plan() bounds with the
  // mask's classifier: a few calls a sequence.
  BatchAttention windowed(windowMods(), step.config());
  const double windowSeconds =
      median(std::max(options.reps, 1) * 50, [&] { step.plan(windowed); });
  int64_t keysFrom = 0;
  for (int64_t b = 0; b < step.seqs; ++b)
    keysFrom += windowed.keyBegin(b) > 0;
  fmt::print("plan   the same under a {}-key window bounded at plan(): {:.1f} us (median), {} of "
             "256 sequences start past key 0\n",
             kPlanWindow, windowSeconds * 1e6, keysFrom);
  return {{"study", "plan"},
          {"sequences", 256},
          {"tokens", attention.numTokens()},
          {"median_us", bench::rounded(seconds * 1e6, 2)},
          {"window_median_us", bench::rounded(windowSeconds * 1e6, 2)},
          {"window_sequences_bounded", keysFrom}};
}

bench::Json mixedStudy(const Options &options, int64_t decodes, int64_t decodeContext,
                       int64_t chunks, int64_t chunkTokens, int64_t chunkContext) {
  const int64_t qHeads = 32, kvHeads = 8, dim = 128, pageSize = 16;
  const int64_t seqs = decodes + chunks;
  const int64_t decodePages = (decodeContext + pageSize - 1) / pageSize;
  const int64_t chunkPages = (chunkContext + pageSize - 1) / pageSize;
  KVCacheConfig cacheConfig;
  cacheConfig.numPages = decodes * decodePages + chunks * chunkPages;
  cacheConfig.pageSize = pageSize;
  cacheConfig.maxBatch = seqs;
  cacheConfig.heads = kvHeads;
  cacheConfig.headDim = cacheConfig.valueHeadDim = dim;
  PagedKVCache cache(cacheConfig);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (const TensorView *t : {&cache.kCache(), &cache.vCache()})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->dataAs<float>()[i] = uniform(rng);
  for (int64_t b = 0; b < seqs; ++b)
    cache.reserve(b, b < decodes ? decodeContext : chunkContext);

  // The packed step: decodes first, then the chunks at the end of their
  // contexts.
  const int64_t tokens = decodes + chunks * chunkTokens;
  std::vector<float> q(tokens * qHeads * dim), out(tokens * qHeads * dim);
  for (float &x : q)
    x = uniform(rng);
  std::vector<int32_t> qsl{0}, lens, slots(seqs);
  for (int64_t b = 0; b < seqs; ++b) {
    slots[b] = static_cast<int32_t>(b);
    qsl.push_back(qsl.back() + static_cast<int32_t>(b < decodes ? 1 : chunkTokens));
    lens.push_back(static_cast<int32_t>(b < decodes ? decodeContext : chunkContext));
  }
  std::vector<int32_t> table = cache.densePageTable(slots);
  const int64_t columns = static_cast<int64_t>(table.size()) / seqs;
  BatchAttentionConfig config;
  config.numQHeads = qHeads;
  config.numKVHeads = kvHeads;
  config.headDim = dim;
  config.pageSize = pageSize;
  config.layout = KVLayout::Pagedc;
  config.maxNumSeqs = seqs;
  config.maxNumTokens = tokens;
  config.maxBlocksPerSeq = columns;
  config.threads = options.threads;
  CompiledMods mods = causalMods();
  BatchAttention attention(mods, config);
  attention.plan(TensorView(qsl.data(), DType::I32, {seqs + 1}),
                 TensorView(lens.data(), DType::I32, {seqs}),
                 TensorView(table.data(), DType::I32, {seqs, columns}));
  BatchRunOptions runOptions;
  runOptions.out = TensorView(out.data(), DType::F32, {tokens, qHeads, dim});
  const TensorView qView(q.data(), DType::F32, {tokens, qHeads, dim});
  auto runMixed = [&] { attention.run(qView, cache.kCache(), cache.vCache(), {}, runOptions); };

  // The same rows as two padded calls: decodes [decodes, Hq, 1, D] and
  // chunks [chunks, Hq, chunkTokens, D], views into the packed q and out.
  auto call = [&](int64_t first, int64_t count, int64_t rows, int64_t context) {
    AttentionOptions o;
    o.batchIdx.assign(slots.begin() + first, slots.begin() + first + count);
    o.kvLength.assign(count, static_cast<int32_t>(context));
    o.qOffset.assign(count, static_cast<int32_t>(context - rows));
    o.threads = options.threads;
    const int64_t row0 = first < decodes ? first : decodes + (first - decodes) * chunkTokens;
    o.out = TensorView(out.data() + row0 * qHeads * dim, DType::F32, {count, qHeads, rows, dim},
                       {rows * qHeads * dim, dim, qHeads * dim, 1}, Device::cpu());
    TensorView qPart(q.data() + row0 * qHeads * dim, DType::F32, {count, qHeads, rows, dim},
                     {rows * qHeads * dim, dim, qHeads * dim, 1}, Device::cpu());
    flexAttention(qPart, cache, nullptr, mods, {}, o);
  };
  auto runSeparate = [&] {
    if (decodes > 0)
      call(0, decodes, 1, decodeContext);
    if (chunks > 0)
      call(decodes, chunks, chunkTokens, chunkContext);
  };
  // Alternated, so load from other work on the machine falls on both.
  runMixed();
  runSeparate();
  std::vector<double> mixedTimes, separateTimes;
  for (int i = 0; i < options.reps; ++i) {
    mixedTimes.push_back(seconds(runMixed));
    separateTimes.push_back(seconds(runSeparate));
  }
  const double mixed = medianOf(mixedTimes), separate = medianOf(separateTimes);
  const std::string name = fmt::format("{}x decode@{} + {}x chunk {}@{}", decodes, decodeContext,
                                       chunks, chunkTokens, chunkContext);
  fmt::print("mixed  {:<36} mixed {:8.2f} ms  separate {:8.2f} ms  separate/mixed {:.3f}\n",
             name, mixed * 1e3, separate * 1e3, separate / mixed);
  return {{"study", "mixed"},
          {"case", name},
          {"mixed_ms", bench::rounded(mixed * 1e3, 4)},
          {"separate_ms", bench::rounded(separate * 1e3, 4)},
          {"ratio", bench::rounded(separate / mixed, 4)}};
}

/// Causal in the generated mods' CUDA form (no params, no buffers).
constexpr const char *kCausalCuda = R"(namespace pagedc_mods {
struct Params {};
constexpr bool kHasMask = true;
constexpr bool kHasScore = false;
struct MaskRow {
  int32_t q;
};
__device__ __forceinline__ MaskRow mask_row(const Params &, int, int, int q) { return {q}; }
__device__ __forceinline__ bool mask(const Params &, const MaskRow &row, int, int, int, int kv) {
  return row.q >= kv;
}
struct ScoreRow {};
__device__ __forceinline__ ScoreRow score_row(const Params &, int, int, int) { return {}; }
__device__ __forceinline__ float score(const Params &, const ScoreRow &, float s, int, int, int,
                                       int) {
  return s;
}
PAGEDC_MASK_COL_UNSPLIT()
} // namespace pagedc_mods
)";

/// plan() and run() host time on the CUDA device, with and without a fixed
/// grid. run() is timed while the stream is captured: the driver records
/// each launch instead of running it, so the time is pagedc's own host
/// work plus the recording, not the GPU's (nor a real driver's
/// cuLaunchKernel, which the capture replaces).
std::vector<bench::Json> cudaHostStudies(const Options &options) {
  std::string reason;
  if (!CudaDriver::available(&reason))
    throw Error("--cuda: no CUDA driver (" + reason +
                "); PAGEDC_CUDA_DRIVER=emu selects the SIMT emulator's");
  const CudaDriver &driver = CudaDriver::get();
  const std::string deviceText = driver.emulated() ? "emu" : "gpu";
  // 1024 pages of 16 slots, which the table's entries cycle through: the
  // kernels are never run, only enqueued.
  constexpr int32_t kPages = 1024;
  PlanStep step(kPages);
  CompiledMods mods = causalMods();
  mods.cuda.modCode = kCausalCuda;
  const Device device = Device::cuda(0);
  const int64_t tokens = step.qsl.back();
  const int64_t heads = 32, kvHeads = 8, dim = 128;
  DeviceBuffer q(static_cast<size_t>(tokens * heads * dim) * 2, 0);
  DeviceBuffer out(q.size(), 0), lse(static_cast<size_t>(tokens * heads) * 4, 0);
  const size_t cacheBytes = static_cast<size_t>(kPages * step.pageSize * kvHeads * dim) * 2;
  DeviceBuffer k(cacheBytes, 0), v(cacheBytes, 0);
  const TensorView qView(q.data(), DType::BF16, {tokens, heads, dim}, device);
  const TensorView outView(out.data(), DType::BF16, {tokens, heads, dim}, device);
  const TensorView lseView(lse.data(), DType::F32, {tokens, heads}, device);
  const std::vector<int64_t> cacheShape{kPages, step.pageSize, kvHeads, dim};
  const TensorView kView(k.data(), DType::BF16, cacheShape, device);
  const TensorView vView(v.data(), DType::BF16, cacheShape, device);
  cu::Stream stream = nullptr;
  driver.check(driver.api().streamCreate(&stream, 0), "cuStreamCreate");

  std::vector<bench::Json> rows;
  for (bool fixedGrid : {false, true}) {
    BatchAttentionConfig config = step.config();
    config.device = device;
    config.dtype = DType::BF16;
    config.layout = KVLayout::NHD;
    config.fixedGrid = fixedGrid;
    BatchAttention attention(mods, config);
    const int reps = std::max(options.reps, 1) * 50;
    const double planSeconds = median(reps, [&] { step.plan(attention); });
    const BatchPlanShape shape = attention.planShape();
    BatchRunOptions run;
    run.out = outView;
    run.lse = lseView;
    run.stream = stream;
    std::vector<double> times;
    {
      // Discarded unended: nothing recorded is ever run.
      CudaStreamCapture capture(driver, stream);
      for (int i = 0; i < reps; ++i)
        times.push_back(
            seconds([&] { attention.run(qView, kView, vView, Bindings{}, run); }));
    }
    const double runSeconds = medianOf(times);
    // On a GPU's driver only (the emulator's launches run the kernels on
    // the CPU): run() as an engine calls it outside a capture, the driver's
    // launches included, and the step captured once and replayed, as an
    // engine runs its decode steps.
    std::vector<double> eagerTimes, replayTimes;
    if (!driver.emulated()) {
      eagerTimes = drainedTimes(driver, stream, reps, [&] {
        attention.run(qView, kView, vView, Bindings{}, run);
      });
      CudaGraphExec graph = captureGraph(
          driver, stream, [&] { attention.run(qView, kView, vView, Bindings{}, run); });
      replayTimes = drainedTimes(driver, stream, reps, [&] { graph.launch(stream); });
    }
    const int launches = 2 + (shape.decodeSplits > 1);
    const char *grid = fixedGrid ? "fixed grid" : "own grids";
    fmt::print("cuda-plan ({}, {}) 256 sequences, {} tokens: {:.1f} us (median)\n", deviceText,
               grid, tokens, planSeconds * 1e6);
    fmt::print("cuda-run  ({}, {}) {} launches recorded by a capture: {:.2f} us (median)\n",
               deviceText, grid, launches, runSeconds * 1e6);
    if (!eagerTimes.empty())
      fmt::print("cuda-run  ({}, {}) {} launches enqueued, no capture: {:.2f} us (median)\n",
                 deviceText, grid, launches, medianOf(eagerTimes) * 1e6);
    if (!replayTimes.empty())
      fmt::print("cuda-run  ({}, {}) the captured step replayed (one graph launch): {:.2f} us "
                 "(median)\n",
                 deviceText, grid, medianOf(replayTimes) * 1e6);
    rows.push_back({{"study", "cuda-plan"},
                    {"driver", deviceText},
                    {"fixed_grid", fixedGrid},
                    {"sequences", 256},
                    {"tokens", tokens},
                    {"median_us", bench::rounded(planSeconds * 1e6, 2)}});
    rows.push_back({{"study", "cuda-run"},
                    {"driver", deviceText},
                    {"fixed_grid", fixedGrid},
                    {"sequences", 256},
                    {"tokens", tokens},
                    {"launches", launches},
                    {"prefill_tiles", shape.prefillTiles},
                    {"decode_splits", shape.decodeSplits},
                    {"median_us", bench::rounded(runSeconds * 1e6, 3)}});
    if (!eagerTimes.empty()) {
      std::vector<double> sorted = eagerTimes;
      std::sort(sorted.begin(), sorted.end());
      rows.push_back({{"study", "cuda-run-eager"},
                      {"driver", deviceText},
                      {"fixed_grid", fixedGrid},
                      {"sequences", 256},
                      {"tokens", tokens},
                      {"launches", launches},
                      {"calls", static_cast<int64_t>(sorted.size())},
                      {"median_us", bench::rounded(medianOf(eagerTimes) * 1e6, 3)},
                      {"p90_us", bench::rounded(sorted[sorted.size() * 9 / 10] * 1e6, 3)},
                      {"max_us", bench::rounded(sorted.back() * 1e6, 3)}});
    }
    if (!replayTimes.empty())
      rows.push_back({{"study", "cuda-graph-replay"},
                      {"driver", deviceText},
                      {"fixed_grid", fixedGrid},
                      {"sequences", 256},
                      {"tokens", tokens},
                      {"launches", launches},
                      {"calls", static_cast<int64_t>(replayTimes.size())},
                      {"median_us", bench::rounded(medianOf(replayTimes) * 1e6, 3)}});
  }
  driver.check(driver.api().streamDestroy(stream), "cuStreamDestroy");
  return rows;
}

} // namespace

int main(int argc, char **argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (arg == "--reps")
      options.reps = std::max(1, std::atoi(value().c_str()));
    else if (arg == "--threads")
      options.threads = std::max(0, std::atoi(value().c_str()));
    else if (arg == "--json")
      options.json = value();
    else if (arg == "--cuda")
      options.cuda = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--reps N] [--threads T] [--json FILE] [--cuda]\n"
                   "  plan() host time at 256 sequences / 8192 tokens, and mixed steps\n"
                   "  against the same work as separate prefill and decode calls (CPU);\n"
                   "  --cuda: instead, plan() and run() host time on the CUDA device\n"
                   "  (PAGEDC_CUDA_DRIVER=emu: the SIMT emulator's driver)\n",
                   argv[0]);
      return arg == "--help" ? 0 : 1;
    }
  }
  bench::Json rows = bench::Json::array();
  if (!options.cuda) {
    rows.push_back(planStudy(options));
    rows.push_back(mixedStudy(options, 64, 2048, 2, 256, 1024));
    rows.push_back(mixedStudy(options, 16, 4096, 1, 512, 2048));
    rows.push_back(mixedStudy(options, 120, 1024, 0, 0, 0));
  } else {
    try {
      for (bench::Json &row : cudaHostStudies(options))
        rows.push_back(std::move(row));
    } catch (const Error &error) {
      std::fprintf(stderr, "%s\n", error.what());
      return 1;
    }
  }
  if (!options.json.empty()) {
    try {
      bench::writeJson("--json", options.json, rows);
    } catch (const Error &error) {
      std::fprintf(stderr, "%s\n", error.what());
      return 1;
    }
  }
  return 0;
}
