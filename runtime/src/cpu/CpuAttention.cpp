//===- CpuAttention.cpp - Paged flex attention on the CPU -----------------===//
//
// Work is split into items (batch, KV head, row tile, KV split). A row tile
// holds up to kMaxTileRows query rows of the Hq / Hkv query heads that read
// one KV head, so each K/V tile loaded serves all of them. Per KV tile of
// kKvTile logical positions an item:
//   1. classifies the tile per row (skipped, mask mod needed, full) from the
//      block mask, the mask's block classifier or nothing;
//   2. computes scores S^T[kv][row] = K . (scale Q)^T with a GEMM that reads K
//      straight from its pages (the kv-major layout keeps the query rows in
//      vector lanes, so the softmax below is vectorised across rows);
//   3. runs the score mod and mask mod on contiguous logical kv runs;
//   4. does one online-softmax step and accumulates P . V.
// Items of one (batch, KV head, row tile) that split the KV range are merged
// by their logsumexp afterwards.
//
// Row tiles of at most kMaxDotRows rows (decode) take a bandwidth-minded
// path instead of the two GEMMs: scores are dot products along the head
// dimension (scoresDecode), each K vector loaded once for up to 4 rows, kept
// row-major so that the softmax's vectors run along kv (softmaxRows); the next
// tile's K and V rows are prefetched a few at a time, K while this tile is
// scored and V during its P . V (pages are scattered, so the hardware
// prefetcher cannot guess them); and P . V streams each V row once for two
// rows at a time (pvDecode).
//
//===----------------------------------------------------------------------===//
#include "cpu/CpuAttention.h"
#include "cpu/ThreadPool.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PAGEDC_CPU_X86_VARIANTS 1
#endif

namespace pagedc::cpu {
namespace {

//===----------------------------------------------------------------------===//
// Tile primitives, one copy per instruction set
//===----------------------------------------------------------------------===//

/// The vectorised primitives of one instruction set.
struct TileOps {
  int lanes;
  void (*gemm)(int64_t rows, int64_t cols, int64_t depth, const float *const *aRows,
               int64_t aStep, const float *const *bRows, float *c, int64_t ldc,
               bool accumulate);
  void (*scoresDecode)(int64_t n, int64_t rows, int64_t depth, const float *const *kRows,
                       const float *qRows, float *scores, int64_t ld, const char *const *prefetch,
                       int64_t nPrefetch, int64_t prefetchBytes);
  void (*pvDecode)(int64_t n, int64_t rows, int64_t ld, const float *p, const float *const *vRows,
                   int64_t vDim, float *acc, const char *const *prefetch, int64_t nPrefetch,
                   int64_t prefetchBytes);
  void (*softmaxTile)(float *tile, int64_t n, int64_t width, float *m, float *l,
                      float *alpha);
  void (*softmaxRows)(float *p, int64_t n, int64_t rows, int64_t ld, float *m, float *l,
                      float *alpha);
  void (*scaleRow)(float *row, int64_t n, float factor);
  void (*transpose)(const float *src, int64_t srcLd, float *dst, int64_t dstLd, int64_t rows,
                    int64_t cols);
};

namespace generic {
using Vec = float __attribute__((vector_size(16)));
constexpr int kLanes = 4;
constexpr int kRowBlock = 6;
static inline Vec fmadd(Vec a, Vec b, Vec c) { return a * b + c; }
#include "AttentionTiles.inc"
} // namespace generic

#ifdef PAGEDC_CPU_X86_VARIANTS
// Each instruction set's copy is compiled for that set only (the others
// run on any x86-64); cpuSupports() picks one at run time. GCC takes a
// target pragma, clang an attribute applied to every function in the region.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {
using Vec = float __attribute__((vector_size(32)));
constexpr int kLanes = 8;
constexpr int kRowBlock = 6;
static inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
#include "AttentionTiles.inc"
} // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
namespace avx512 {
using Vec = float __attribute__((vector_size(64)));
constexpr int kLanes = 16;
constexpr int kRowBlock = 8;
static inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
#include "AttentionTiles.inc"
} // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

bool cpuSupports(KernelVariant variant) {
  switch (variant) {
  case KernelVariant::Auto:
  case KernelVariant::Generic:
    return true;
#ifdef PAGEDC_CPU_X86_VARIANTS
  case KernelVariant::Avx2:
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  case KernelVariant::Avx512:
    return __builtin_cpu_supports("avx512f");
#else
  case KernelVariant::Avx2:
  case KernelVariant::Avx512:
    return false;
#endif
  }
  return false;
}

const TileOps &selectTileOps(KernelVariant requested) {
  if (requested == KernelVariant::Auto || !cpuSupports(requested)) {
    static const KernelVariant best = [] {
      if (cpuSupports(KernelVariant::Avx512))
        return KernelVariant::Avx512;
      if (cpuSupports(KernelVariant::Avx2))
        return KernelVariant::Avx2;
      return KernelVariant::Generic;
    }();
    requested = best;
  }
#ifdef PAGEDC_CPU_X86_VARIANTS
  if (requested == KernelVariant::Avx512)
    return avx512::kTileOps;
  if (requested == KernelVariant::Avx2)
    return avx2::kTileOps;
#endif
  return generic::kTileOps;
}

//===----------------------------------------------------------------------===//
// Planning
//===----------------------------------------------------------------------===//

/// Logical kv positions per tile.
constexpr int64_t kKvTile = 64;
/// Query rows (across the heads of one KV group) per row tile.
constexpr int64_t kMaxTileRows = 64;
/// Up to this many rows per tile, the decode path (scoresDecode, pvDecode)
/// replaces the GEMMs.
constexpr int64_t kMaxDotRows = 8;
/// A KV split is never shorter than this many positions.
constexpr int64_t kMinSplitLength = 256;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// How a tile column range is treated for one query row.
enum BlockStatus : uint8_t { Skip = 0, Partial = 1, Full = 2 };

/// One unit of work: the query rows [rowTile * tileRows, + rows) of the
/// group rows (query row i of head g at i * group + g) of batch entry b that
/// read KV head kvHead, against the keys [kvBegin, kvEnd).
struct WorkItem {
  int64_t b, kvHead, rowTile, rows;
  int64_t kvBegin, kvEnd;
  /// First row of its partial results when its sequence's keys are split,
  /// else -1 (the item writes its rows itself).
  int64_t partial;
};

/// The splits of one (b, kvHead, rowTile), merged after every item ran:
/// their partials are rows [firstPartial + s * tileRows] for s < splits.
struct MergeGroup {
  int64_t b, kvHead, rowTile, rows;
  int64_t firstPartial, splits;
};

struct Plan {
  int64_t batch, qHeads, dim, kvHeads, vDim, group;
  int64_t tileRows;
  std::vector<WorkItem> items;
  std::vector<MergeGroup> merges;
  int64_t partialRows = 0;
  bool anyRows = false;
};

/// Query rows of batch entry b.
inline int64_t queryRows(const PagedAttentionArgs &args, int64_t b) {
  return args.qStart ? args.qStart[b + 1] - args.qStart[b] : args.q.size(2);
}

/// Offset of element (b, h, row i, 0) of q, out or lse (rank 3 or 4) for
/// the call's layout, padded or packed.
inline int64_t rowOffset(const PagedAttentionArgs &args, const TensorView &view, int64_t b,
                         int64_t h, int64_t i) {
  if (args.qStart)
    return h * view.stride(1) + (args.qStart[b] + i) * view.stride(2);
  return b * view.stride(0) + h * view.stride(1) + i * view.stride(2);
}

Plan makePlan(const PagedAttentionArgs &args, int threads) {
  Plan plan;
  plan.batch = args.qStart ? args.batch : args.q.size(0);
  plan.qHeads = args.q.size(1);
  plan.dim = args.q.size(3);
  plan.kvHeads = args.kCache.size(0);
  plan.vDim = args.vCache.size(3);
  plan.group = plan.kvHeads > 0 ? plan.qHeads / plan.kvHeads : 0;
  if (plan.qHeads == 0 || plan.kvHeads == 0)
    return plan;
  int64_t maxGroupRows = 0, baseItems = 0;
  for (int64_t b = 0; b < plan.batch; ++b)
    maxGroupRows = std::max(maxGroupRows, queryRows(args, b) * plan.group);
  if (maxGroupRows == 0)
    return plan;
  plan.anyRows = true;
  plan.tileRows = std::min(maxGroupRows, kMaxTileRows);
  auto rowTilesOf = [&](int64_t b) {
    return (queryRows(args, b) * plan.group + plan.tileRows - 1) / plan.tileRows;
  };
  for (int64_t b = 0; b < plan.batch; ++b)
    baseItems += rowTilesOf(b) * plan.kvHeads;
  // Split a sequence's keys only when the other dimensions leave threads
  // idle (decode of a few long sequences).
  int64_t wanted = 4 * static_cast<int64_t>(threads);
  int64_t target = threads > 1 && baseItems < wanted ? (wanted + baseItems - 1) / baseItems : 1;
  std::vector<int64_t> splitLength(plan.batch), splits(plan.batch);
  for (int64_t b = 0; b < plan.batch; ++b) {
    int64_t begin = args.kvBegin ? args.kvBegin[b] : 0;
    int64_t length = std::max<int64_t>(0, args.kvLength[b] - begin);
    int64_t n = std::max<int64_t>(1, std::min(target, length / kMinSplitLength));
    splitLength[b] =
        std::max<int64_t>(kKvTile, ((length + n - 1) / n + kKvTile - 1) / kKvTile * kKvTile);
    splits[b] = std::max<int64_t>(1, (length + splitLength[b] - 1) / splitLength[b]);
  }

  plan.items.reserve(static_cast<size_t>(baseItems * (target > 1 ? target : 1)));
  // Latest row tiles first (the heaviest under causal masks), then by the
  // number of keys an item reads, so long items do not start last.
  int64_t maxRowTiles = (maxGroupRows + plan.tileRows - 1) / plan.tileRows;
  for (int64_t rowTile = maxRowTiles - 1; rowTile >= 0; --rowTile) {
    for (int64_t b = 0; b < plan.batch; ++b) {
      if (rowTile >= rowTilesOf(b))
        continue;
      int64_t rows = std::min(plan.tileRows,
                              queryRows(args, b) * plan.group - rowTile * plan.tileRows);
      int64_t begin = args.kvBegin ? args.kvBegin[b] : 0;
      int64_t end = std::max<int64_t>(begin, args.kvLength[b]);
      for (int64_t kvHead = 0; kvHead < plan.kvHeads; ++kvHead) {
        if (splits[b] == 1) {
          plan.items.push_back({b, kvHead, rowTile, rows, begin, end, -1});
          continue;
        }
        plan.merges.push_back({b, kvHead, rowTile, rows, plan.partialRows, splits[b]});
        for (int64_t s = 0; s < splits[b]; ++s) {
          int64_t from = begin + s * splitLength[b];
          plan.items.push_back({b, kvHead, rowTile, rows, from,
                                std::min(end, from + splitLength[b]), plan.partialRows});
          plan.partialRows += plan.tileRows;
        }
      }
    }
  }
  // One thread runs the items in any order alike.
  if (threads > 1)
    std::stable_sort(plan.items.begin(), plan.items.end(),
                     [](const WorkItem &x, const WorkItem &y) {
                       return x.rows * (x.kvEnd - x.kvBegin) > y.rows * (y.kvEnd - y.kvBegin);
                     });
  return plan;
}

//===----------------------------------------------------------------------===//
// Element access
//===----------------------------------------------------------------------===//

inline float loadElement(const void *base, DType dtype, int64_t offset) {
  if (dtype == DType::BF16)
    return bf16ToFloat(static_cast<const uint16_t *>(base)[offset]);
  return static_cast<const float *>(base)[offset];
}

inline void storeElement(void *base, DType dtype, int64_t offset, float value) {
  if (dtype == DType::BF16)
    static_cast<uint16_t *>(base)[offset] = floatToBF16(value);
  else
    static_cast<float *>(base)[offset] = value;
}

/// A run [begin, end) of logical kv positions with one status for a row.
struct Segment {
  int32_t begin, end;
  BlockStatus status;
};

/// Per-thread scratch, kept between calls.
struct Workspace {
  int64_t padded = 0;        // the item's rows rounded up to whole vectors
  std::vector<float> qT;     // [dim][padded], scale folded in (gemm tiles)
  std::vector<float> qRows;  // [rows rounded up to 4][dim] (decode tiles)
  // Score tile: [kKvTile][padded] for gemm tiles, [rows][kKvTile] for
  // decode tiles; element (kv j, row r) is at j * kvStride + r * rowStride.
  std::vector<float> scores;
  int64_t kvStride = 0, rowStride = 0;
  std::vector<float> acc;    // [tileRows][vDim]
  std::vector<float> rowMax, rowSum, alpha; // [padded]
  std::vector<float> kConverted, vConverted; // [kKvTile][dim | vDim]
  std::vector<const float *> kRows, vRows, qTRows, scoreRows;
  std::vector<const char *> prefetch, prefetchV; // rows to request (decode)
  std::vector<float> rowScores;  // [padded][kKvTile]: a GEMM tile's scores by row
  std::vector<uint8_t> modMask;  // [kKvTile]
  std::vector<int32_t> rowHead, rowQuery, rowPosition, rowBatch; // [tileRows]
  std::vector<const uint8_t *> rowBlockStatus;         // [tileRows]
  std::vector<int64_t> statusKeys;
  std::vector<std::vector<uint8_t>> statusRows;
  std::vector<Segment> segments;
  std::vector<int64_t> segmentStart; // [tileRows + 1]
  std::vector<BlockStatus> headClass; // [group]
};

/// The calling thread's workspace, kept between calls so that a call
/// allocates scratch only when it needs more than an earlier one did. Not
/// inlined: once the compiler sees that every item gets this one object, it
/// addresses its fields through a TLS lookup (__tls_get_addr in a shared
/// library) at each use instead of once through the reference.
__attribute__((noinline)) Workspace &threadWorkspace() {
  static thread_local Workspace ws;
  return ws;
}

template <typename T> void ensureSize(std::vector<T> &v, size_t n) {
  if (v.size() < n)
    v.resize(n);
}

//===----------------------------------------------------------------------===//
// The attention kernel
//===----------------------------------------------------------------------===//

class Kernel {
public:
  Kernel(const PagedAttentionArgs &args, const TileOps &ops, const Plan &plan)
      : args_(args), ops_(ops), plan_(plan) {
    const CompiledMods *mods = args.mods;
    hasMask_ = mods && mods->hasMask() && mods->maskRow;
    hasScore_ = mods && mods->hasScore() && mods->scoreRow;
    blockClass_ = hasMask_ ? mods->maskBlockClass : nullptr;
    context_ = args.context ? args.context : &emptyContext_;
    // Bytes to prefetch per K or V row (the wider of the two).
    auto bytes = [](const TensorView &cache, int64_t width) {
      return width * static_cast<int64_t>(dtypeSize(cache.dtype())) * cache.stride(3);
    };
    rowBytes_ = std::max(bytes(args.kCache, plan.dim), bytes(args.vCache, plan.vDim));
    if (plan.partialRows > 0) {
      partialMax_.assign(plan.partialRows, kNegInf);
      partialSum_.assign(plan.partialRows, 0.0f);
      partialAcc_.assign(plan.partialRows * plan.vDim, 0.0f);
    }
  }

  void runItem(const WorkItem &item, Workspace &ws);
  void mergeSplits(const MergeGroup &group);

private:
  void prepareRows(Workspace &ws, int64_t b, int64_t kvHead, int64_t rowTile,
                   int64_t rows);
  void writeRows(int64_t b, int64_t kvHead, int64_t rowTile, int64_t rows, const float *acc,
                 const float *maxScore, const float *sum);
  bool classifyTile(Workspace &ws, int64_t b, int64_t rows, int64_t kv0, int64_t n);
  const float *const *gatherRows(Workspace &ws, const TensorView &cache, const float *scale,
                                 std::vector<float> &converted,
                                 std::vector<const float *> &rowPointers, int64_t b,
                                 int64_t kvHead, int64_t kv0, int64_t n, int64_t width);
  void prefetchRows(int64_t b, int64_t kvHead, int64_t kv0, int64_t n) const;
  void applyMods(Workspace &ws, int64_t b, int64_t rows, int64_t kv0, int64_t n);
  void writeRow(int64_t b, int64_t h, int64_t i, const float *acc, float maxScore,
                float sum);

  const PagedAttentionArgs &args_;
  const TileOps &ops_;
  const Plan &plan_;
  bool hasMask_ = false, hasScore_ = false;
  PagedcBlockClassFn blockClass_ = nullptr;
  PagedcModContext emptyContext_{nullptr, nullptr};
  const PagedcModContext *context_;
  int64_t rowBytes_ = 0;
  // Split partials: [item][tileRows] and [item][tileRows][vDim].
  std::vector<float> partialMax_, partialSum_, partialAcc_;
};

void Kernel::prepareRows(Workspace &ws, int64_t b, int64_t kvHead, int64_t rowTile,
                         int64_t rows) {
  const Plan &plan = plan_;
  const TensorView &q = args_.q;
  ws.padded = (rows + ops_.lanes - 1) / ops_.lanes * ops_.lanes;
  int64_t padded = ws.padded;
  int64_t qOffset = args_.qOffset ? args_.qOffset[b] : 0;
  ensureSize(ws.rowHead, rows);
  ensureSize(ws.rowQuery, rows);
  ensureSize(ws.rowPosition, rows);
  ensureSize(ws.rowBatch, rows);
  const int64_t firstToken = args_.qStart ? args_.qStart[b] : 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t groupRow = rowTile * plan.tileRows + r;
    ws.rowQuery[r] = static_cast<int32_t>(groupRow / plan.group);
    ws.rowHead[r] = static_cast<int32_t>(kvHead * plan.group + groupRow % plan.group);
    const int64_t token = firstToken + ws.rowQuery[r];
    ws.rowPosition[r] = args_.tokenPosition ? args_.tokenPosition[token]
                                            : static_cast<int32_t>(qOffset + ws.rowQuery[r]);
    ws.rowBatch[r] = args_.tokenBatch ? args_.tokenBatch[token] : static_cast<int32_t>(b);
  }

  // Decode tiles (scoresDecode) read q row-major, rounded up to whole
  // blocks of 4 rows; the others (gemm) read Q^T. Only the layout the tile
  // reads is built: on a tiny decode step, filling both costs more than the
  // scores. The scale is folded in and padding stays zero.
  const bool decodeTile = rows <= kMaxDotRows;
  if (decodeTile) {
    // Rows [0, rows) are written below; only the padding rows need zeros.
    const int64_t blockRows = (rows + 3) / 4 * 4;
    ensureSize(ws.qRows, blockRows * plan.dim);
    std::fill(ws.qRows.begin() + rows * plan.dim, ws.qRows.begin() + blockRows * plan.dim, 0.0f);
  } else {
    ws.qT.assign(plan.dim * padded, 0.0f);
    ensureSize(ws.qTRows, plan.dim);
    for (int64_t d = 0; d < plan.dim; ++d)
      ws.qTRows[d] = ws.qT.data() + d * padded;
  }
  for (int64_t r = 0; r < rows; ++r) {
    int64_t base = rowOffset(args_, q, b, ws.rowHead[r], ws.rowQuery[r]);
    for (int64_t d = 0; d < plan.dim; ++d) {
      float value = args_.scale * loadElement(q.data(), q.dtype(), base + d * q.stride(3));
      if (decodeTile)
        ws.qRows[r * plan.dim + d] = value;
      else
        ws.qT[d * padded + r] = value;
    }
  }

  // Dense per-kv-block status of every block-mask row the tile touches.
  ensureSize(ws.rowBlockStatus, rows);
  ws.statusKeys.clear();
  const BlockMask *mask = args_.blockMask;
  if (!mask)
    return;
  int64_t kvLength = args_.kvLength[b];
  int64_t kvBlocks = (kvLength + mask->kvBlockSize - 1) / mask->kvBlockSize;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t qBlock = ws.rowPosition[r] / mask->qBlockSize - mask->firstQBlock;
    if (ws.rowPosition[r] < 0 || qBlock < 0 || qBlock >= mask->numQBlocks) {
      ws.rowBlockStatus[r] = nullptr; // outside the mask: nothing visible
      continue;
    }
    int64_t key = mask->rowIndex(b, ws.rowHead[r], qBlock);
    size_t slot = std::find(ws.statusKeys.begin(), ws.statusKeys.end(), key) -
                  ws.statusKeys.begin();
    if (slot == ws.statusKeys.size()) {
      ws.statusKeys.push_back(key);
      if (ws.statusRows.size() < ws.statusKeys.size())
        ws.statusRows.emplace_back();
      std::vector<uint8_t> &status = ws.statusRows[slot];
      status.assign(kvBlocks, Skip);
      const int32_t *partial = mask->kvIndices.data() + key * mask->maxKvBlocks;
      for (int32_t k = 0, e = mask->kvNumBlocks[key]; k < e; ++k)
        if (partial[k] >= 0 && partial[k] < kvBlocks)
          status[partial[k]] = Partial;
      if (!mask->fullKvNumBlocks.empty()) {
        const int32_t *full = mask->fullKvIndices.data() + key * mask->maxKvBlocks;
        for (int32_t k = 0, e = mask->fullKvNumBlocks[key]; k < e; ++k)
          if (full[k] >= 0 && full[k] < kvBlocks)
            status[full[k]] = Full;
      }
    }
    ws.rowBlockStatus[r] = ws.statusRows[slot].data();
  }
}

/// Fills ws.segments for the tile [kv0, kv0 + n); returns whether any row
/// sees any position of it.
bool Kernel::classifyTile(Workspace &ws, int64_t b, int64_t rows, int64_t kv0,
                          int64_t n) {
  ws.segments.clear();
  ensureSize(ws.segmentStart, rows + 1);
  const BlockMask *mask = args_.blockMask;
  BlockStatus unmasked = hasMask_ ? Partial : Full;
  int32_t begin = static_cast<int32_t>(kv0), end = static_cast<int32_t>(kv0 + n);
  bool anyVisible = false;
  size_t rowFirstSegment = 0; // runs never merge across rows
  auto add = [&](int32_t from, int32_t to, BlockStatus status) {
    if (status == Partial && !hasMask_)
      status = Full;
    if (status != Skip)
      anyVisible = true;
    if (ws.segments.size() > rowFirstSegment && ws.segments.back().end == from &&
        ws.segments.back().status == status)
      ws.segments.back().end = to;
    else
      ws.segments.push_back({from, to, status});
  };

  if (!mask && blockClass_) {
    // Rows of one head in a tile hold consecutive query positions.
    ensureSize(ws.headClass, plan_.group);
    int64_t firstHead = ws.rowHead[0] - ws.rowHead[0] % plan_.group;
    for (int64_t g = 0; g < plan_.group; ++g) {
      int32_t head = static_cast<int32_t>(firstHead + g);
      int32_t qLow = std::numeric_limits<int32_t>::max();
      int32_t qHigh = std::numeric_limits<int32_t>::min();
      int32_t batchOfRows = -1; // the rows' one batch index, or -2 if several
      for (int64_t r = 0; r < rows; ++r) {
        if (ws.rowHead[r] != head)
          continue;
        qLow = std::min(qLow, ws.rowPosition[r]);
        qHigh = std::max(qHigh, ws.rowPosition[r]);
        batchOfRows = batchOfRows == -1 || batchOfRows == ws.rowBatch[r] ? ws.rowBatch[r] : -2;
      }
      ws.headClass[g] = Skip; // no row of this head in the tile
      // A classifier answers for one batch index: rows of several (a
      // cascade level's) are masked per element.
      if (qLow <= qHigh)
        ws.headClass[g] =
            batchOfRows < 0
                ? Partial
                : static_cast<BlockStatus>(std::clamp(
                      blockClass_(context_, batchOfRows, head, qLow, qHigh, begin, end - 1), 0,
                      2));
    }
  }

  for (int64_t r = 0; r < rows; ++r) {
    ws.segmentStart[r] = static_cast<int64_t>(ws.segments.size());
    rowFirstSegment = ws.segments.size();
    if (mask) {
      const uint8_t *status = ws.rowBlockStatus[r];
      if (!status) {
        add(begin, end, Skip);
      } else {
        int32_t blockSize = mask->kvBlockSize;
        for (int32_t block = begin / blockSize; block * blockSize < end; ++block) {
          int32_t from = std::max(begin, block * blockSize);
          int32_t to = std::min(end, (block + 1) * blockSize);
          add(from, to, static_cast<BlockStatus>(status[block]));
        }
      }
    } else if (blockClass_) {
      add(begin, end, ws.headClass[ws.rowHead[r] % plan_.group]);
    } else {
      add(begin, end, unmasked);
    }
  }
  ws.segmentStart[rows] = static_cast<int64_t>(ws.segments.size());
  return anyVisible;
}

/// Row pointers of the logical positions [kv0, kv0 + n) of one KV head,
/// read in place when the cache holds contiguous f32 rows and converted into
/// `converted` otherwise (8-bit codes through their value table, times the
/// head's scale).
const float *const *Kernel::gatherRows(Workspace &ws, const TensorView &cache,
                                       const float *scale, std::vector<float> &converted,
                                       std::vector<const float *> &rowPointers,
                                       int64_t b, int64_t kvHead, int64_t kv0, int64_t n,
                                       int64_t width) {
  ensureSize(rowPointers, kKvTile);
  bool direct = cache.dtype() == DType::F32 && cache.stride(3) == 1;
  if (!direct)
    ensureSize(converted, kKvTile * width);
  const int32_t *pages = args_.pageTable + b * args_.pageTableStride;
  const int64_t pageSize = args_.pageSize;
  const int64_t headBase = kvHead * cache.stride(0);
  // One page table lookup (and one division) per page, not per row: a
  // decode tile's rows are few and the divisions were a fair part of them.
  int64_t slot = kv0 % pageSize;
  int64_t pageBase = headBase + pages[kv0 / pageSize] * cache.stride(1);
  for (int64_t j = 0; j < n; ++j, ++slot) {
    if (slot == pageSize) {
      slot = 0;
      pageBase = headBase + pages[(kv0 + j) / pageSize] * cache.stride(1);
    }
    const int64_t base = pageBase + slot * cache.stride(2);
    if (direct) {
      rowPointers[j] = cache.dataAs<const float>() + base;
      continue;
    }
    float *row = converted.data() + j * width;
    if (isFloat8(cache.dtype())) {
      const float *values = float8Values(cache.dtype());
      const uint8_t *codes = cache.dataAs<const uint8_t>() + base;
      const float factor = scale[kvHead];
      for (int64_t d = 0; d < width; ++d)
        row[d] = values[codes[d * cache.stride(3)]] * factor;
    } else {
      for (int64_t d = 0; d < width; ++d)
        row[d] = loadElement(cache.data(), cache.dtype(), base + d * cache.stride(3));
    }
    rowPointers[j] = row;
  }
  return rowPointers.data();
}

/// Asks for the V rows of the tile [kv0, kv0 + n) and the K rows of the next
/// tile to be brought into cache while this tile's scores are computed: pages
/// are scattered, so the hardware prefetcher cannot guess them.
void Kernel::prefetchRows(int64_t b, int64_t kvHead, int64_t kv0, int64_t n) const {
  const int32_t *pages = args_.pageTable + b * args_.pageTableStride;
  int64_t pageSize = args_.pageSize;
  auto prefetch = [&](const TensorView &cache, int64_t position, int64_t width) {
    int64_t page = pages[position / pageSize];
    const char *row = static_cast<const char *>(cache.data()) +
                      (kvHead * cache.stride(0) + page * cache.stride(1) +
                       (position % pageSize) * cache.stride(2)) *
                          static_cast<int64_t>(dtypeSize(cache.dtype()));
    int64_t bytes = width * static_cast<int64_t>(dtypeSize(cache.dtype())) * cache.stride(3);
    for (int64_t offset = 0; offset < bytes; offset += 64)
      __builtin_prefetch(row + offset);
  };
  for (int64_t j = 0; j < n; ++j)
    prefetch(args_.vCache, kv0 + j, plan_.vDim);
  int64_t nextEnd = std::min<int64_t>(kv0 + n + kKvTile, args_.kvLength[b]);
  for (int64_t position = kv0 + n; position < nextEnd; ++position)
    prefetch(args_.kCache, position, plan_.dim);
}

/// Appends the addresses of the rows [from, to) of one KV head of `cache`
/// to `list`, one page table lookup per page.
void appendRowAddresses(const TensorView &cache, const int32_t *pages, int64_t pageSize,
                        int64_t kvHead, int64_t from, int64_t to,
                        std::vector<const char *> &list) {
  int64_t elementSize = static_cast<int64_t>(dtypeSize(cache.dtype()));
  const char *base = static_cast<const char *>(cache.data()) +
                     kvHead * cache.stride(0) * elementSize;
  for (int64_t position = from; position < to;) {
    int64_t page = pages[position / pageSize];
    int64_t slot = position % pageSize;
    int64_t end = std::min(to, position + pageSize - slot);
    const char *pageBase = base + page * cache.stride(1) * elementSize;
    for (; position < end; ++position, ++slot)
      list.push_back(pageBase + slot * cache.stride(2) * elementSize);
  }
}

/// Runs the score mod and mask mod over the visible runs of every row of the
/// tile [kv0, kv0 + n) and sets skipped or masked scores to -inf. The mods
/// take a row's scores contiguous: a decode tile is row-major already; a
/// GEMM tile ([kv][row]) is transposed into ws.rowScores and back, a block
/// of vectors at a time, which costs far less than gathering and scattering
/// each row's column one score at a time.
void Kernel::applyMods(Workspace &ws, int64_t b, int64_t rows, int64_t kv0, int64_t n) {
  if (!hasScore_ && std::all_of(ws.segments.begin(), ws.segments.end(),
                                [](const Segment &s) { return s.status == Full; }))
    return;
  const bool gemmTile = ws.kvStride != 1;
  const int64_t kvPadded = (n + ops_.lanes - 1) / ops_.lanes * ops_.lanes;
  float *rowMajor = ws.scores.data();
  int64_t ld = ws.rowStride;
  if (gemmTile) {
    ensureSize(ws.rowScores, ws.padded * kKvTile);
    ops_.transpose(ws.scores.data(), ws.padded, ws.rowScores.data(), kKvTile, kvPadded,
                   ws.padded);
    rowMajor = ws.rowScores.data();
    ld = kKvTile;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = ws.segmentStart[r]; s < ws.segmentStart[r + 1]; ++s) {
      const Segment &segment = ws.segments[s];
      int32_t count = segment.end - segment.begin;
      float *run = rowMajor + r * ld + (segment.begin - kv0);
      if (segment.status == Skip) {
        std::fill(run, run + count, kNegInf);
        continue;
      }
      if (hasScore_)
        args_.mods->scoreRow(context_, ws.rowBatch[r], ws.rowHead[r], ws.rowPosition[r],
                             segment.begin, count, run);
      if (segment.status == Partial) {
        uint8_t *keep = ws.modMask.data();
        args_.mods->maskRow(context_, ws.rowBatch[r], ws.rowHead[r], ws.rowPosition[r],
                            segment.begin, count, keep);
        // A select, not a branch: along a causal diagonal the kept runs
        // change length from row to row and a branch mispredicts.
        for (int32_t j = 0; j < count; ++j)
          run[j] = keep[j] ? run[j] : kNegInf;
      }
    }
  }
  if (gemmTile)
    ops_.transpose(ws.rowScores.data(), kKvTile, ws.scores.data(), ws.padded, ws.padded,
                   kvPadded);
}

void Kernel::writeRow(int64_t b, int64_t h, int64_t i, const float *acc, float maxScore,
                      float sum) {
  const TensorView &out = args_.out;
  int64_t base = rowOffset(args_, out, b, h, i);
  // The sink is one more key of the row's softmax with a zero value: it
  // joins the running (max, sum) here, once per row after every split is
  // merged, and adds nothing to acc. A NaN sink must reach out and lse, so
  // it wins the max (std::max would drop it).
  float keep = 1.0f;
  if (args_.sinks.data()) {
    const float sink = args_.sinks.dataAs<const float>()[h];
    const float top = std::isnan(sink) || sink > maxScore ? sink : maxScore;
    if (top != kNegInf) {
      keep = maxScore == kNegInf ? 0.0f : std::exp(maxScore - top);
      sum = sum * keep + std::exp(sink - top);
      maxScore = top;
    }
  }
  bool empty = maxScore == kNegInf;
  float inverse = empty ? 0.0f : keep / sum;
  if (out.dtype() == DType::F32 && out.stride(3) == 1) {
    // The common layout, in a loop the compiler vectorises.
    float *row = out.dataAs<float>() + base;
    for (int64_t d = 0; d < plan_.vDim; ++d)
      row[d] = empty ? 0.0f : acc[d] * inverse;
  } else {
    for (int64_t d = 0; d < plan_.vDim; ++d)
      storeElement(out.data(), out.dtype(), base + d * out.stride(3),
                   empty ? 0.0f : acc[d] * inverse);
  }
  const TensorView &lse = args_.lse;
  if (lse.data())
    lse.dataAs<float>()[rowOffset(args_, lse, b, h, i)] =
        empty ? kNegInf : maxScore + std::log(sum);
}

/// Writes the rows of a row tile: group row g = rowTile * tileRows + r is
/// query row g / group of head kvHead * group + g % group.
void Kernel::writeRows(int64_t b, int64_t kvHead, int64_t rowTile, int64_t rows,
                       const float *acc, const float *maxScore, const float *sum) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t groupRow = rowTile * plan_.tileRows + r;
    writeRow(b, kvHead * plan_.group + groupRow % plan_.group, groupRow / plan_.group,
             acc + r * plan_.vDim, maxScore[r], sum[r]);
  }
}

void Kernel::runItem(const WorkItem &item, Workspace &ws) {
  const Plan &plan = plan_;
  const int64_t b = item.b, kvHead = item.kvHead, rowTile = item.rowTile, rows = item.rows;
  const bool decodeTile = rows <= kMaxDotRows;

  prepareRows(ws, b, kvHead, rowTile, rows);
  const int64_t padded = ws.padded;
  ws.rowMax.assign(padded, kNegInf);
  ws.rowSum.assign(padded, 0.0f);
  ensureSize(ws.alpha, padded);
  ws.acc.assign(rows * plan.vDim, 0.0f);
  ensureSize(ws.scores, kKvTile * padded);
  ensureSize(ws.modMask, kKvTile);
  ws.kvStride = decodeTile ? 1 : padded;
  ws.rowStride = decodeTile ? kKvTile : 1;
  if (!decodeTile) {
    ensureSize(ws.scoreRows, rows);
    for (int64_t r = 0; r < rows; ++r)
      ws.scoreRows[r] = ws.scores.data() + r;
  }

  const int64_t kvBegin = item.kvBegin, kvEnd = item.kvEnd;
  for (int64_t kv0 = kvBegin; kv0 < kvEnd; kv0 += kKvTile) {
    int64_t n = std::min(kKvTile, kvEnd - kv0);
    if (!classifyTile(ws, b, rows, kv0, n))
      continue;
    const float *const *kRows =
        gatherRows(ws, args_.kCache, args_.kScale, ws.kConverted, ws.kRows, b, kvHead, kv0, n,
                   plan.dim);
    if (decodeTile) {
      // Decode: the next tile's K rows are requested while this tile is
      // scored and its V rows while this tile's P . V runs, so memory stays
      // busy in both phases (the first tile's V is requested with the scores).
      ws.prefetch.clear();
      const int32_t *pages = args_.pageTable + b * args_.pageTableStride;
      int64_t nextEnd = std::min(kvEnd, kv0 + n + kKvTile);
      if (kv0 == kvBegin)
        appendRowAddresses(args_.vCache, pages, args_.pageSize, kvHead, kv0, kv0 + n,
                           ws.prefetch);
      appendRowAddresses(args_.kCache, pages, args_.pageSize, kvHead, kv0 + n, nextEnd,
                         ws.prefetch);
      ws.prefetchV.clear();
      appendRowAddresses(args_.vCache, pages, args_.pageSize, kvHead, kv0 + n, nextEnd,
                         ws.prefetchV);
      ops_.scoresDecode(n, rows, plan.dim, kRows, ws.qRows.data(), ws.scores.data(), kKvTile,
                        ws.prefetch.data(), static_cast<int64_t>(ws.prefetch.size()), rowBytes_);
    } else {
      prefetchRows(b, kvHead, kv0, n);
      ops_.gemm(n, padded, plan.dim, kRows, 1, ws.qTRows.data(), ws.scores.data(), padded,
                /*accumulate=*/false);
    }
    applyMods(ws, b, rows, kv0, n);
    if (decodeTile)
      ops_.softmaxRows(ws.scores.data(), n, rows, kKvTile, ws.rowMax.data(), ws.rowSum.data(),
                       ws.alpha.data());
    else
      ops_.softmaxTile(ws.scores.data(), n, padded, ws.rowMax.data(), ws.rowSum.data(),
                       ws.alpha.data());
    for (int64_t r = 0; r < rows; ++r)
      if (ws.alpha[r] != 1.0f)
        ops_.scaleRow(ws.acc.data() + r * plan.vDim, plan.vDim, ws.alpha[r]);
    const float *const *vRows =
        gatherRows(ws, args_.vCache, args_.vScale, ws.vConverted, ws.vRows, b, kvHead, kv0, n,
                   plan.vDim);
    if (decodeTile)
      ops_.pvDecode(n, rows, kKvTile, ws.scores.data(), vRows, plan.vDim, ws.acc.data(),
                    ws.prefetchV.data(), static_cast<int64_t>(ws.prefetchV.size()), rowBytes_);
    else
      ops_.gemm(rows, plan.vDim, n, ws.scoreRows.data(), padded, vRows, ws.acc.data(),
                plan.vDim, /*accumulate=*/true);
  }

  if (item.partial < 0) {
    writeRows(b, kvHead, rowTile, rows, ws.acc.data(), ws.rowMax.data(), ws.rowSum.data());
    return;
  }
  int64_t base = item.partial;
  std::copy(ws.rowMax.begin(), ws.rowMax.begin() + rows, partialMax_.begin() + base);
  std::copy(ws.rowSum.begin(), ws.rowSum.begin() + rows, partialSum_.begin() + base);
  std::copy(ws.acc.begin(), ws.acc.begin() + rows * plan.vDim,
            partialAcc_.begin() + base * plan.vDim);
}

/// Combines the KV splits of one (b, kvHead, rowTile) by their logsumexp
/// and writes the final rows.
void Kernel::mergeSplits(const MergeGroup &group) {
  const Plan &plan = plan_;
  const int64_t rows = group.rows;
  std::vector<float> acc(rows * plan.vDim, 0.0f), maxScore(rows, kNegInf), sum(rows, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = 0; s < group.splits; ++s)
      maxScore[r] =
          std::max(maxScore[r], partialMax_[group.firstPartial + s * plan.tileRows + r]);
    if (maxScore[r] == kNegInf)
      continue;
    for (int64_t s = 0; s < group.splits; ++s) {
      int64_t row = group.firstPartial + s * plan.tileRows + r;
      if (partialMax_[row] == kNegInf)
        continue;
      float weight = std::exp(partialMax_[row] - maxScore[r]);
      sum[r] += weight * partialSum_[row];
      const float *partial = partialAcc_.data() + row * plan.vDim;
      for (int64_t d = 0; d < plan.vDim; ++d)
        acc[r * plan.vDim + d] += weight * partial[d];
    }
  }
  writeRows(group.b, group.kvHead, group.rowTile, rows, acc.data(), maxScore.data(),
            sum.data());
}

} // namespace

std::vector<KernelVariant> supportedKernelVariants() {
  std::vector<KernelVariant> variants{KernelVariant::Generic};
  for (KernelVariant variant : {KernelVariant::Avx2, KernelVariant::Avx512})
    if (cpuSupports(variant))
      variants.push_back(variant);
  return variants;
}

const char *kernelVariantName(KernelVariant variant) {
  switch (variant) {
  case KernelVariant::Auto: return "auto";
  case KernelVariant::Generic: return "generic";
  case KernelVariant::Avx2: return "avx2";
  case KernelVariant::Avx512: return "avx512";
  }
  return "?";
}

/// Multiply-adds under which a call left to choose its threads runs on the
/// calling thread alone: waking the pool's workers costs about 10 us a call,
/// more than a second core saves on this much work.
constexpr int64_t kSerialWork = int64_t(1) << 17;

/// The threads a call runs on: its request, or for 0 every core unless the
/// call is too small to gain from them.
int chooseThreads(const PagedAttentionArgs &args) {
  if (args.threads != 0)
    return ThreadPool::resolveThreads(args.threads);
  const int64_t batch = args.qStart ? args.batch : args.q.size(0);
  const int64_t width = args.q.size(3) + args.vCache.size(3);
  int64_t work = 0;
  for (int64_t b = 0; b < batch && work < kSerialWork; ++b) {
    const int64_t keys = args.kvLength[b] - (args.kvBegin ? args.kvBegin[b] : 0);
    work += queryRows(args, b) * args.q.size(1) * std::max<int64_t>(keys, 0) * width;
  }
  return work < kSerialWork ? 1 : ThreadPool::resolveThreads(0);
}

void pagedAttention(const PagedAttentionArgs &args) {
  const TileOps &ops = selectTileOps(args.variant);
  int threads = chooseThreads(args);
  Plan plan = makePlan(args, threads);
  if (!plan.anyRows)
    return;
  Kernel kernel(args, ops, plan);
  if (threads == 1 || plan.items.size() == 1) {
    // Small calls (a decode step of a few short sequences) run here: no
    // pool hand-off, one workspace lookup for every item.
    Workspace &ws = threadWorkspace();
    for (const WorkItem &item : plan.items)
      kernel.runItem(item, ws);
    for (const MergeGroup &group : plan.merges)
      kernel.mergeSplits(group);
    return;
  }
  ThreadPool &pool = ThreadPool::global();
  pool.parallelFor(static_cast<int64_t>(plan.items.size()), threads,
                   [&](int64_t item, int) { kernel.runItem(plan.items[item], threadWorkspace()); });
  if (!plan.merges.empty())
    pool.parallelFor(static_cast<int64_t>(plan.merges.size()), threads,
                     [&](int64_t group, int) { kernel.mergeSplits(plan.merges[group]); });
}

} // namespace pagedc::cpu
