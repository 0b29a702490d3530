//===- RuntimeBench.cpp - Host overhead of the runtime bookkeeping --------===//
//
// bench/README.md targets §2: the per-call cost of reserve, erase, assign,
// convertLogicalBlockMask and createBlockMask at B = 256 sequences of a 32k
// context with 16-token pages, and createBlockMask for causal and
// sliding-window 128k x 128k masks (diagonal flag set, as the compiler sets
// it). Per-sequence figures are reported as items (time per item = time per
// sequence op). The element-wise and per-block classifier paths run as
// contrast. See bench/runtime/run.sh for the JSON output.
//
//===----------------------------------------------------------------------===//
#include "pagedc/BlockMask.h"
#include "pagedc/KVCache.h"
#include "pagedc/Mods.h"
#include "pagedc/PhysicalBlockMask.h"

#include <benchmark/benchmark.h>

#include <chrono>
#include <vector>

using namespace pagedc;

namespace {

constexpr int64_t kBatch = 256;
constexpr int64_t kContext = 32 * 1024;
constexpr int64_t kPageSize = 16;

//===- Hand-written mods with the compiled-mod ABI ------------------------===//

void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kvBegin,
               int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kvBegin + i;
}
int32_t causalClass(const PagedcModContext *, int32_t, int32_t, int32_t qLo, int32_t qHi,
                    int32_t kvLo, int32_t kvHi) {
  return qHi < kvLo ? 0 : (qLo >= kvHi ? 2 : 1);
}
/// 0 <= q - kv < param 0.
void windowRow(const PagedcModContext *context, int32_t, int32_t, int32_t q, int32_t kvBegin,
               int32_t count, uint8_t *out) {
  const int32_t window = context->params[0].i32;
  for (int32_t i = 0; i < count; ++i) {
    const int32_t distance = q - (kvBegin + i);
    out[i] = distance >= 0 && distance < window;
  }
}

CompiledMods maskMods(PagedcMaskRowFn row, bool diagonal, PagedcBlockClassFn blockClass) {
  CompiledMods mods;
  mods.maskName = "mask";
  mods.maskRow = row;
  mods.maskBlockClass = blockClass;
  mods.maskDependence.b = false;
  mods.maskDependence.h = false;
  mods.maskDependence.diagonal = diagonal;
  return mods;
}

KVCacheConfig servingConfig(int64_t heads, int64_t headDim, int64_t context = kContext) {
  KVCacheConfig config;
  config.numPages = kBatch * context / kPageSize;
  config.pageSize = kPageSize;
  config.maxBatch = kBatch;
  config.heads = heads;
  config.headDim = headDim;
  config.valueHeadDim = headDim;
  return config;
}

double seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

//===- KV cache bookkeeping -----------------------------------------------===//

/// reserve(b, 32k) from empty for all 256 sequences (2048 pages each).
void BM_Reserve32kPerSequence(benchmark::State &state) {
  PagedKVCache cache(servingConfig(1, 1));
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < kBatch; ++b)
      cache.reserve(b, kContext);
    state.SetIterationTime(seconds(start));
    for (int64_t b = 0; b < kBatch; ++b)
      cache.erase(b);
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_Reserve32kPerSequence)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// erase(b) of 256 sequences holding 32k tokens each.
void BM_Erase32kPerSequence(benchmark::State &state) {
  PagedKVCache cache(servingConfig(1, 1));
  for (auto _ : state) {
    for (int64_t b = 0; b < kBatch; ++b)
      cache.reserve(b, kContext);
    auto start = std::chrono::steady_clock::now();
    for (int64_t b = 0; b < kBatch; ++b)
      cache.erase(b);
    state.SetIterationTime(seconds(start));
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_Erase32kPerSequence)->UseManualTime()->Unit(benchmark::kMicrosecond);

/// A decode step's reserve(b, length + 1) for 256 sequences near 32k (a new
/// page every 16 steps).
void BM_DecodeStepReservePerSequence(benchmark::State &state) {
  PagedKVCache cache(servingConfig(1, 1));
  const int64_t start = kContext - 4096;
  int64_t length = start;
  for (auto _ : state) {
    if (length == kContext) {
      state.PauseTiming();
      for (int64_t b = 0; b < kBatch; ++b)
        cache.erase(b);
      length = start;
      state.ResumeTiming();
    }
    ++length;
    for (int64_t b = 0; b < kBatch; ++b)
      cache.reserve(b, length);
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_DecodeStepReservePerSequence)->Unit(benchmark::kMicrosecond);

/// assign() of one decode token for 256 sequences: arguments Hkv, D and the
/// context (1 x 1 at 32k isolates the bookkeeping; 8 x 128 adds a realistic
/// copy, at a 1k context to keep the cache at 270 MB).
void BM_DecodeStepAssignPerSequence(benchmark::State &state) {
  const int64_t heads = state.range(0), headDim = state.range(1), context = state.range(2);
  PagedKVCache cache(servingConfig(heads, headDim, context));
  for (int64_t b = 0; b < kBatch; ++b)
    cache.reserve(b, context);
  std::vector<int32_t> batchIdx(kBatch), positions(kBatch);
  for (int64_t b = 0; b < kBatch; ++b)
    batchIdx[b] = static_cast<int32_t>(b);
  std::vector<float> k(kBatch * heads * headDim, 1.0f), v(k.size(), 2.0f);
  const TensorView batchView(batchIdx.data(), DType::I32, {kBatch});
  const TensorView positionView(positions.data(), DType::I32, {kBatch, 1});
  const TensorView kView(k.data(), DType::F32, {kBatch, heads, 1, headDim});
  const TensorView vView(v.data(), DType::F32, {kBatch, heads, 1, headDim});
  // A serving cache is written long before any given decode step: touch
  // every page once first, so the loop measures steady-state assigns and not
  // the kernel zeroing fresh (transparent huge) pages on first write, which
  // a new 270 MB cache pays once (~0.3 s here) and a loop of a few
  // iterations would otherwise count as per-call cost.
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t p = 0; p < context; p += std::max<int64_t>(1, 4096 / (heads * headDim * 4))) {
      positions[b] = static_cast<int32_t>(p);
      const TensorView one(&batchIdx[b], DType::I32, {1});
      const TensorView onePosition(&positions[b], DType::I32, {1, 1});
      cache.assign(one, onePosition, TensorView(k.data(), DType::F32, {1, heads, 1, headDim}),
                   TensorView(v.data(), DType::F32, {1, heads, 1, headDim}));
    }
  int32_t position = 0;
  for (auto _ : state) {
    for (int64_t b = 0; b < kBatch; ++b)
      positions[b] = static_cast<int32_t>((position + 37 * b) % context);
    position = (position + 1) % context;
    cache.assign(batchView, positionView, kView, vView);
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_DecodeStepAssignPerSequence)
    ->ArgNames({"Hkv", "D", "context"})
    ->Args({1, 1, kContext})
    ->Args({8, 128, 1024})
    ->Unit(benchmark::kMicrosecond);

//===- Block masks ----------------------------------------------------------===//

/// convertLogicalBlockMask of a causal decode-shaped mask (one 128-row q
/// block, KV_LEN 32k, kv block = page = 16) for 256 sequences.
void BM_ConvertLogicalBlockMaskPerSequence(benchmark::State &state) {
  PagedKVCache cache(servingConfig(1, 1));
  // Interleave the pages of all sequences as a serving engine would.
  for (int64_t length = kPageSize; length <= kContext; length += kPageSize)
    for (int64_t b = 0; b < kBatch; ++b)
      cache.reserve(b, length);
  const CompiledMods causal = maskMods(causalRow, true, causalClass);
  const PagedcModContext context{nullptr, nullptr};
  const BlockMask logical =
      createBlockMask(causal, context, 1, 1, kContext, kContext, 128, kPageSize);
  // Keep the last q block only: the rows a decode step at ~32k reads.
  BlockMask decode;
  {
    const int64_t row = logical.numQBlocks - 1;
    std::vector<int32_t> num = {logical.kvNumBlocks[row]};
    std::vector<int32_t> full = {logical.fullKvNumBlocks[row]};
    std::vector<int32_t> indices(logical.partialRow(0, 0, row),
                                 logical.partialRow(0, 0, row) + logical.maxKvBlocks);
    std::vector<int32_t> fullIndices(logical.fullRow(0, 0, row),
                                     logical.fullRow(0, 0, row) + logical.maxKvBlocks);
    decode = blockMaskFromKvBlocks(num, indices, full, fullIndices, 1, 1, logical.maxKvBlocks, 128,
                                   kContext, 128, kPageSize);
  }
  std::vector<int32_t> batchIdx(kBatch), kvLength(kBatch);
  for (int64_t b = 0; b < kBatch; ++b) {
    batchIdx[b] = static_cast<int32_t>(kBatch - 1 - b);
    kvLength[b] = static_cast<int32_t>(kContext - b);
  }
  // Argument 0: 1 = convert into one reused PhysicalBlockMask (a decode
  // loop), 0 = a fresh result every call.
  const bool reuse = state.range(0) == 1;
  PhysicalBlockMask reused;
  for (auto _ : state) {
    if (reuse) {
      convertLogicalBlockMaskInto(cache, decode, batchIdx, kvLength, reused);
      benchmark::DoNotOptimize(reused.mask.kvIndices.data());
    } else {
      PhysicalBlockMask converted = convertLogicalBlockMask(cache, decode, batchIdx, kvLength);
      benchmark::DoNotOptimize(converted.mask.kvIndices.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
}
BENCHMARK(BM_ConvertLogicalBlockMaskPerSequence)
    ->ArgNames({"reuse"})
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond);

enum MaskKind { Causal = 0, SlidingWindow = 1 };
enum Method { Diagonal = 0, DiagonalWithClassifier = 1, Classifier = 2, ElementWise = 3 };

/// createBlockMask(length x length, blocks 128): arguments the length, the
/// mask kind, the method and whether the result is reused (createBlockMask-
/// Into one BlockMask: no allocation) or fresh every call.
void BM_CreateBlockMask(benchmark::State &state) {
  const int64_t length = state.range(0);
  const bool window = state.range(1) == SlidingWindow;
  const Method method = static_cast<Method>(state.range(2));
  const bool reuse = state.range(3) == 1;
  PagedcParamSlot windowSize;
  windowSize.i32 = 4096;
  const PagedcModContext context{nullptr, &windowSize};
  CompiledMods mods;
  if (window)
    mods = maskMods(windowRow, method != Classifier, nullptr);
  else
    mods =
        maskMods(causalRow, method == Diagonal || method == DiagonalWithClassifier,
                 method == DiagonalWithClassifier || method == Classifier ? causalClass : nullptr);
  const BlockMaskMethod how =
      method == ElementWise ? BlockMaskMethod::ElementWise : BlockMaskMethod::Auto;
  BlockMask reused;
  for (auto _ : state) {
    if (reuse) {
      createBlockMaskInto(mods, context, kBatch, 32, length, length, 128, 128, how, reused);
      benchmark::DoNotOptimize(reused.kvIndices.data());
      continue;
    }
    BlockMask mask = createBlockMask(mods, context, kBatch, 32, length, length, 128, 128, how);
    benchmark::DoNotOptimize(mask.kvIndices.data());
  }
  state.SetLabel(std::string(window ? "sliding window 4096" : "causal") + ", " +
                 (method == Diagonal                 ? "diagonal"
                  : method == DiagonalWithClassifier ? "diagonal + classifier"
                  : method == Classifier             ? "classifier per block"
                                                     : "element-wise") +
                 (reuse ? ", reused result" : ""));
}
BENCHMARK(BM_CreateBlockMask)
    ->ArgNames({"len", "kind", "method", "reuse"})
    ->Args({32 * 1024, Causal, Diagonal, 0})
    ->Args({32 * 1024, SlidingWindow, Diagonal, 0})
    ->Args({128 * 1024, Causal, Diagonal, 0})
    ->Args({128 * 1024, Causal, Diagonal, 1})
    ->Args({128 * 1024, Causal, DiagonalWithClassifier, 0})
    ->Args({128 * 1024, Causal, DiagonalWithClassifier, 1})
    ->Args({128 * 1024, SlidingWindow, Diagonal, 0})
    ->Args({128 * 1024, SlidingWindow, Diagonal, 1})
    ->Args({128 * 1024, Causal, Classifier, 1})
    ->Args({8 * 1024, Causal, ElementWise, 1})
    ->Args({8 * 1024, SlidingWindow, ElementWise, 1})
    ->Unit(benchmark::kMicrosecond);

/// Document masking over a document-id buffer (documents of 4096 tokens):
/// doc[q] == doc[kv] and q >= kv.
void documentRow(const PagedcModContext *context, int32_t, int32_t, int32_t q, int32_t kvBegin,
                 int32_t count, uint8_t *out) {
  const auto *doc = static_cast<const int32_t *>(context->buffers[0].data);
  for (int32_t i = 0; i < count; ++i)
    out[i] = doc[q] == doc[kvBegin + i] && q >= kvBegin + i;
}

/// One decode step (1 query row at q offset kv - 1) against a kv-token
/// context with createBlockMaskRows: the mask's memory and time must grow
/// with kv, not kv^2 (bench/README.md targets §6). Arguments: kv length,
/// mask kind (0 causal with the diagonal flag, 1 document, element-wise over
/// a buffer). Counter mask_bytes: the mask's index arrays.
void BM_DecodeStepBlockMaskRows(benchmark::State &state) {
  const int64_t kvLength = state.range(0);
  const bool document = state.range(1) == 1;
  std::vector<int32_t> docIds(static_cast<size_t>(kvLength));
  for (int64_t i = 0; i < kvLength; ++i)
    docIds[static_cast<size_t>(i)] = static_cast<int32_t>(i / 4096);
  PagedcBufferRef docRef{};
  docRef.data = docIds.data();
  docRef.sizes[0] = kvLength;
  docRef.strides[0] = 1;
  const PagedcModContext context{&docRef, nullptr};
  CompiledMods mods = document ? maskMods(documentRow, false, nullptr)
                               : maskMods(causalRow, true, nullptr);
  int64_t bytes = 0;
  for (auto _ : state) {
    BlockMask mask = createBlockMaskRows(mods, context, 1, 1, kvLength - 1, kvLength, kvLength,
                                         128, 128);
    bytes = static_cast<int64_t>(
        sizeof(int32_t) * (mask.kvNumBlocks.size() + mask.kvIndices.size() +
                           mask.fullKvNumBlocks.size() + mask.fullKvIndices.size()));
    benchmark::DoNotOptimize(mask.kvIndices.data());
  }
  state.counters["mask_bytes"] = static_cast<double>(bytes);
  state.SetLabel(document ? "document (element-wise over a buffer)" : "causal, diagonal");
}
BENCHMARK(BM_DecodeStepBlockMaskRows)
    ->ArgNames({"kv", "kind"})
    ->Args({256 * 1024, 0})
    ->Args({1024 * 1024, 0})
    ->Args({4096 * 1024, 0})
    ->Args({256 * 1024, 1})
    ->Args({1024 * 1024, 1})
    ->Args({4096 * 1024, 1})
    ->Unit(benchmark::kMicrosecond);

} // namespace

BENCHMARK_MAIN();
