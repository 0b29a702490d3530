//===- HardeningTest.cpp - Sizes, overflow and scale of the runtime API ---===//
//
// Issue 10: block masks of only the call's query rows (a decode step's mask is
// O(kv / block)), the block-mask memory budget, overflow-safe sizes in the
// KV cache and tensors with no state change on failure, page tables that grow
// in amortised O(1).
//
//===----------------------------------------------------------------------===//
#include "pagedc/Attention.h"
#include "pagedc/BatchAttention.h"
#include "pagedc/BlockMask.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"
#include "pagedc/KVCache.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include "TestMods.h"
#include "TestUtil.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <functional>
#include <numeric>
#include <random>

using namespace pagedc;
using namespace pagedc::test;

namespace {

const PagedcModContext kNoContext{nullptr, nullptr};

/// causalRow counting the elements it evaluates.
std::atomic<int64_t> evaluated{0};
void countingCausalRow(const PagedcModContext *context, int32_t b, int32_t h, int32_t q,
                       int32_t kvBegin, int32_t count, uint8_t *out) {
  evaluated += count;
  causalRow(context, b, h, q, kvBegin, count, out);
}

int64_t maskEntries(const BlockMask &mask) {
  return static_cast<int64_t>(mask.kvIndices.size() + mask.fullKvIndices.size() +
                              mask.kvNumBlocks.size() + mask.fullKvNumBlocks.size());
}

/// Rows [firstQBlock, ...) of `full` as dense block classes.
std::vector<uint8_t> suffixClasses(const BlockMask &full, int64_t firstQBlock) {
  const std::vector<uint8_t> all = toDenseBlocks(full);
  const size_t rowSize = static_cast<size_t>(full.numKvBlocks());
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < full.batch; ++b)
    for (int64_t h = 0; h < full.heads; ++h)
      for (int64_t i = firstQBlock; i < full.numQBlocks; ++i) {
        const auto begin = all.begin() + full.rowIndex(b, h, i) * rowSize;
        out.insert(out.end(), begin, begin + rowSize);
      }
  return out;
}

} // namespace

// Every method, random lengths, block sizes and first rows: the rows mask is
// exactly the full mask's rows from firstQBlock on.
TEST(CreateBlockMaskRows, EqualsTheFullMasksRowsForEveryMethod) {
  std::mt19937 rng(77);
  std::vector<PagedcParamSlot> params(1);
  const PagedcModContext context{nullptr, params.data()};
  const int32_t sizes[] = {1, 3, 4, 8, 16, 32};
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t qLength = std::uniform_int_distribution<int64_t>(1, 120)(rng);
    const int64_t kvLength = std::uniform_int_distribution<int64_t>(1, 120)(rng);
    const int64_t qBegin = std::uniform_int_distribution<int64_t>(0, qLength - 1)(rng);
    const int32_t qBlock = sizes[rng() % 6];
    const int32_t kvBlock = trial % 2 ? qBlock : sizes[rng() % 6];
    params[0].i32 = std::uniform_int_distribution<int32_t>(1, 60)(rng);
    for (auto [row, cls] :
         {std::pair{&causalRow, &causalClass}, std::pair{&slidingWindowRow, &slidingWindowClass}}) {
      const CompiledMods variants[] = {maskMods(row), maskMods(row, cls),
                                       maskMods(row, nullptr, false, false, true),
                                       maskMods(row, cls, false, false, true)};
      for (const CompiledMods &mods : variants) {
        const BlockMask full =
            createBlockMask(mods, context, 1, 1, qLength, kvLength, qBlock, kvBlock);
        const BlockMask rows = createBlockMaskRows(mods, context, 1, 1, qBegin, qLength,
                                                   kvLength, qBlock, kvBlock);
        ASSERT_NO_THROW(validateBlockMask(rows));
        EXPECT_EQ(rows.firstQBlock, qBegin / qBlock);
        EXPECT_EQ(toDenseBlocks(rows), suffixClasses(full, qBegin / qBlock))
            << "trial " << trial << " q " << qLength << " kv " << kvLength << " from " << qBegin
            << " blocks " << qBlock << "x" << kvBlock << " classifier "
            << (mods.maskBlockClass != nullptr) << " diagonal " << mods.maskDependence.diagonal;
        // toDense: rows before the first covered block are 0, the rest agree.
        const std::vector<uint8_t> denseFull = toDense(full, &mods, &context);
        const std::vector<uint8_t> denseRows = toDense(rows, &mods, &context);
        const int64_t from = rows.firstQBlock * qBlock * kvLength;
        EXPECT_TRUE(std::equal(denseRows.begin() + from, denseRows.end(), denseFull.begin() + from));
        EXPECT_TRUE(std::all_of(denseRows.begin(), denseRows.begin() + from,
                                [](uint8_t x) { return x == 0; }));
      }
    }
  }
}

// A decode step (1 query at the end of the context): the mask's memory and
// its mask-mod evaluations grow linearly with kv, whatever the method.
TEST(CreateBlockMaskRows, DecodeStepMaskIsLinearInKvLength) {
  for (bool diagonal : {false, true})
    for (int64_t kv : {int64_t(1) << 10, int64_t(1) << 14, int64_t(1) << 17, int64_t(1) << 20}) {
      const CompiledMods mods = maskMods(countingCausalRow, nullptr, false, false, diagonal);
      evaluated = 0;
      const BlockMask mask = createBlockMaskRows(mods, kNoContext, 1, 1, kv - 1, kv, kv);
      const int64_t blocks = (kv + 127) / 128;
      EXPECT_EQ(mask.numQBlocks, 1);
      EXPECT_LE(maskEntries(mask), 2 * blocks + 2) << "kv " << kv;
      // One q block of rows at most (element-wise), or one table of q + kv
      // differences (diagonal).
      EXPECT_LE(evaluated.load(), 128 * kv + 2 * kv) << "kv " << kv;
      EXPECT_EQ(mask.partialCount(0, 0, 0) + mask.fullCount(0, 0, 0), blocks);
    }
  // 1x1 blocks at 1M keys: one row of 1M blocks (8 MB), not 1M rows.
  const CompiledMods causal = maskMods(causalRow, causalClass);
  const BlockMask oneByOne =
      createBlockMaskRows(causal, kNoContext, 1, 1, (1 << 20) - 1, 1 << 20, 1 << 20, 1, 1);
  EXPECT_EQ(oneByOne.numQBlocks, 1);
  EXPECT_EQ(oneByOne.fullCount(0, 0, 0), 1 << 20);
}

// Masks beyond the budget fail with an Error naming it, before allocating.
TEST(CreateBlockMask, RefusesMasksBeyondTheMemoryBudget) {
  const CompiledMods causal = maskMods(causalRow, causalClass);
  const CompiledMods byHead = maskMods(causalRow, causalClass, true, true);
  struct Case {
    const CompiledMods *mods;
    int64_t batch, heads, q, kv;
    int32_t qBlock, kvBlock;
  };
  const Case cases[] = {{&causal, 1, 1, 1 << 20, 1 << 20, 1, 1},
                        {&causal, 1, 1, INT32_MAX, INT32_MAX, 1, 1},
                        {&byHead, 1 << 20, 1 << 20, 1 << 16, 1 << 16, 64, 64},
                        {&byHead, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 1, 1},
                        {&causal, 1, 1, 1 << 17, 1 << 17, 1, 8}};
  for (const Case &c : cases) {
    try {
      createBlockMask(*c.mods, kNoContext, c.batch, c.heads, c.q, c.kv, c.qBlock, c.kvBlock);
      ADD_FAILURE() << "no error for " << c.q << " x " << c.kv;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find("block-mask memory budget"), std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(createBlockMaskRows(causal, kNoContext, 1, 1, 10, 10, 10), Error); // qBegin
  EXPECT_THROW(createBlockMaskRows(causal, kNoContext, 1, 1, -1, 10, 10), Error);
}

// An empty mask (Q_LEN or KV_LEN 0) over 2^30 x 2^30 (b, h) pairs densifies
// to nothing at once: toDense and toDenseBlocks looped over every pair (2^60
// iterations; the runtime-API fuzzer's timeout).
TEST(BlockMaskHardening, EmptyMasksOverHugeBatchesDensifyAtOnce) {
  const int64_t huge = int64_t(1) << 30;
  for (int64_t kv : {10, 0}) { // Q_LEN 0: no rows (any other Q_LEN needs 2^60 row counts)
    BlockMask mask = blockMaskFromKvBlocks({}, {}, {}, {}, huge, huge, kv == 0 ? 0 : 1, 0, kv,
                                           16, 16);
    EXPECT_TRUE(toDenseBlocks(mask).empty());
    EXPECT_TRUE(toDense(mask).empty());
  }
}

// Validating a mask of few blocks per row over KV_LEN 2^31 - 1 with 1-token
// blocks needs no memory per kv block (it allocated 16 GB of duplicate marks:
// the runtime-API fuzzer's third long run); duplicates are still found,
// within a list and across a row's partial and full lists.
TEST(BlockMaskHardening, SparseRowsOverHugeKvLengthsValidateWithoutMarks) {
  const int64_t kv = INT32_MAX;
  auto make = [&](std::vector<int32_t> num, std::vector<int32_t> idx, std::vector<int32_t> fullNum,
                  std::vector<int32_t> fullIdx) {
    return blockMaskFromKvBlocks(num, idx, fullNum, fullIdx, 1, 1, 2, 1, kv, 1, 1);
  };
  BlockMask ok = make({2}, {0, INT32_MAX - 1}, {1}, {7, 0});
  EXPECT_EQ(ok.partialCount(0, 0, 0), 2);
  EXPECT_EQ(ok.fullCount(0, 0, 0), 1);
  EXPECT_PAGEDC_ERROR(make({2}, {5, 5}, {}, {}), "row 0 lists kv block 5 twice");
  EXPECT_PAGEDC_ERROR(make({1}, {7, 0}, {1}, {7, 0}), "row 0 lists kv block 7 twice");
  EXPECT_PAGEDC_ERROR(make({1}, {INT32_MAX, 0}, {}, {}), "outside [0, 2147483647)");
}

// Page tables exist only for slots that hold pages: a cache configured for
// 2^31 - 1 slots costs what its pages cost, whichever slot ids are used (it
// used to allocate 51 GB of empty tables up front, which ASan reported as out
// of memory and which an overcommitting host could OOM-kill), and every query
// and operation on a slot that holds nothing sees an empty table.
TEST(KVCacheHardening, ManySlotsCostNothingUntilUsed) {
  KVCacheConfig config;
  config.numPages = 8;
  config.pageSize = 4;
  config.maxBatch = INT32_MAX;
  config.heads = 1;
  config.headDim = 4;
  config.valueHeadDim = 4;
  PagedKVCache cache(config);
  const int64_t far = int64_t(1) << 30;
  EXPECT_EQ(cache.capacity(far), 0);
  EXPECT_TRUE(cache.pageTable(INT32_MAX - 1).empty());
  EXPECT_EQ(cache.physicalToLogical(far, 0), -1);
  cache.erase(far); // nothing to free
  EXPECT_EQ(cache.freePageCount(), 8);
  cache.reserve(7, 9);
  EXPECT_EQ(cache.capacity(7), 12);
  EXPECT_EQ(cache.freePageCount(), 5);
  // Growing the tables for the destination must not invalidate the source.
  cache.fork(7, 4000, 6);
  EXPECT_EQ(cache.capacity(4000), 8);
  EXPECT_EQ(cache.pageTable(4000)[0], cache.pageTable(7)[0]);
  EXPECT_NE(cache.pageTable(4000)[1], cache.pageTable(7)[1]); // the partial page is copied
  EXPECT_EQ(cache.freePageCount(), 4);
  // A fork of nothing from a slot never reserved leaves the destination empty.
  cache.fork(far, 5000, 0);
  EXPECT_EQ(cache.capacity(5000), 0);
  const std::vector<int32_t> dense = cache.densePageTable({7, 4000, static_cast<int32_t>(far)}, -1);
  ASSERT_EQ(dense.size(), 9u);
  EXPECT_EQ(dense[6], -1);
  cache.erase(4000);
  cache.erase(7);
  EXPECT_EQ(cache.freePageCount(), 8);
  // The highest slot ids cost one table each.
  cache.reserve(INT32_MAX - 1, 5);
  cache.fork(INT32_MAX - 1, far, 5);
  EXPECT_EQ(cache.capacity(far), 8);
  EXPECT_EQ(cache.freePageCount(), 5);
  cache.erase(INT32_MAX - 1);
  cache.erase(far);
  EXPECT_EQ(cache.freePageCount(), 8);
  EXPECT_THROW(cache.reserve(INT32_MAX, 1), Error); // one past the last slot
}

// The attention call reads a rows mask like the full one, and refuses one
// that does not cover its first query row.
TEST(FlexAttention, RowsMaskGivesTheSameOutputAsTheFullMask) {
  KVCacheConfig config;
  config.numPages = 64;
  config.pageSize = 16;
  config.maxBatch = 2;
  config.heads = 2;
  config.headDim = 8;
  config.valueHeadDim = 8;
  PagedKVCache cache(config);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int64_t kv = 300, lq = 5;
  std::vector<float> k(2 * 2 * kv * 8), v(k.size()), q(2 * 4 * lq * 8);
  for (std::vector<float> *x : {&k, &v, &q})
    for (float &value : *x)
      value = uniform(rng);
  std::vector<int32_t> positions(kv);
  for (int64_t b = 0; b < 2; ++b) {
    cache.reserve(b, kv);
    std::iota(positions.begin(), positions.end(), 0);
    int32_t slot = static_cast<int32_t>(b);
    cache.assign(TensorView(&slot, DType::I32, {1}),
                 TensorView(positions.data(), DType::I32, {1, kv}),
                 TensorView(&k[b * 2 * kv * 8], DType::F32, {1, 2, kv, 8}),
                 TensorView(&v[b * 2 * kv * 8], DType::F32, {1, 2, kv, 8}));
  }
  const CompiledMods mods = maskMods(causalRow, causalClass);
  for (int64_t offset : {int64_t(0), int64_t(37), kv - lq}) {
    AttentionOptions options;
    options.kvLength = {static_cast<int32_t>(kv), static_cast<int32_t>(kv)};
    options.qOffset = {static_cast<int32_t>(offset), static_cast<int32_t>(offset)};
    const TensorView qView(q.data(), DType::F32, {2, 4, lq, 8});
    const BlockMask full = createBlockMask(mods, kNoContext, 2, 4, offset + lq, kv, 16, 32);
    const BlockMask rows =
        createBlockMaskRows(mods, kNoContext, 2, 4, offset, offset + lq, kv, 16, 32);
    AttentionResult a = flexAttention(qView, cache, &full, mods, {}, options);
    AttentionResult b = flexAttention(qView, cache, &rows, mods, {}, options);
    const float *x = a.out.dataAs<const float>(), *y = b.out.dataAs<const float>();
    EXPECT_TRUE(std::equal(x, x + a.out.numel(), y)) << "offset " << offset;
    if (rows.firstQBlock > 0) {
      options.qOffset = {0, 0};
      EXPECT_THROW(flexAttention(qView, cache, &rows, mods, {}, options), Error);
    }
  }
}

// reserve() with lengths up to INT64_MAX: an Error and no state change.
TEST(KVCacheHardening, ReserveOverflowsAreErrorsWithNoStateChange) {
  for (int64_t pageSize : {1, 16, 1024}) {
    KVCacheConfig config;
    config.numPages = 8;
    config.pageSize = pageSize;
    config.maxBatch = 2;
    config.heads = 1;
    config.headDim = 4;
    config.valueHeadDim = 4;
    PagedKVCache cache(config);
    cache.reserve(1, pageSize + 1);
    const int64_t free = cache.freePageCount();
    const std::vector<int32_t> table = cache.pageTable(1);
    for (int64_t length : {INT64_MAX, INT64_MAX - 1, INT64_MAX - std::max<int64_t>(pageSize - 2, 0),
                           INT64_MAX / 2 + 1, (int64_t(1) << 62), 9 * pageSize,
                           8 * pageSize + 1})
      for (int64_t slot : {0, 1}) {
        EXPECT_THROW(cache.reserve(slot, length), Error) << length;
        EXPECT_EQ(cache.freePageCount(), free);
        EXPECT_EQ(cache.capacity(0), 0);
        EXPECT_EQ(cache.pageTable(1), table);
      }
    EXPECT_THROW(cache.densePageTable({0, 1}, INT64_MAX), Error);
    EXPECT_THROW(cache.densePageTable({0, 1}, INT64_MAX / 2), Error);
    EXPECT_THROW(cache.densePageTable({0, 1}, cache.numPages() + 1), Error);
    EXPECT_EQ(cache.densePageTable({0, 1}, cache.numPages()).size(),
              2 * static_cast<size_t>(cache.numPages()));
  }
}

// Configurations whose byte size overflows are errors (never a crash).
TEST(KVCacheHardening, ConfigSizeProductsThatOverflowAreErrors) {
  const int64_t big[] = {int64_t(1) << 20, int64_t(1) << 31, INT32_MAX, INT64_MAX / 3};
  for (int64_t heads : big)
    for (int64_t dim : big) {
      KVCacheConfig config;
      config.numPages = INT32_MAX / 1024;
      config.pageSize = 1024;
      config.maxBatch = 1;
      config.heads = heads;
      config.headDim = dim;
      config.valueHeadDim = 1;
      EXPECT_THROW(PagedKVCache{config}, Error) << heads << " x " << dim;
    }
}

// Growing a slot one page at a time reallocates its table O(log n) times,
// not n times (growth was quadratic: --page-size 1 at 1M tokens took 169 s).
TEST(KVCacheHardening, OnePageAtATimeGrowthIsAmortisedLinear) {
  KVCacheConfig config;
  config.numPages = 1 << 16;
  config.pageSize = 1;
  config.maxBatch = 1;
  config.heads = 1;
  config.headDim = 1;
  config.valueHeadDim = 1;
  PagedKVCache cache(config);
  int reallocations = 0;
  const int32_t *data = nullptr;
  for (int64_t length = 1; length <= config.numPages; ++length) {
    cache.reserve(0, length);
    if (cache.pageTable(0).data() != data) {
      ++reallocations;
      data = cache.pageTable(0).data();
    }
  }
  EXPECT_LE(reallocations, 20);
}

// Shapes whose element or byte count overflows are Errors, not crashes.
TEST(TensorHardening, OverflowingShapesAreErrors) {
  const std::vector<std::vector<int64_t>> shapes = {{INT64_MAX, 2},
                                                    {int64_t(1) << 32, int64_t(1) << 32},
                                                    {3, int64_t(1) << 62},
                                                    {int64_t(1) << 21, int64_t(1) << 21,
                                                     int64_t(1) << 21}};
  for (const auto &shape : shapes) {
    EXPECT_THROW(TensorView(nullptr, DType::F32, shape), Error);
    EXPECT_THROW(HostTensor(DType::F32, shape), Error);
  }
  // Fits int64 elements but not bytes: HostTensor refuses, no bad_alloc.
  EXPECT_THROW(HostTensor(DType::F64, {int64_t(1) << 61}), Error);
  EXPECT_THROW(HostTensor(DType::F32, {int64_t(1) << 62}), Error);
}

// Host tensors start zeroed and own their bytes: a copy is deep and a moved
// one is empty, both below and above the size where storage is mapped in
// huge pages (4 MiB).
TEST(HostTensorStorage, ZeroedDeepCopiesAndEmptyAfterMove) {
  for (int64_t elements : {int64_t(3), int64_t(1) << 20, (int64_t(1) << 21) + 5}) {
    SCOPED_TRACE(elements);
    HostTensor a(DType::F32, {elements});
    float *data = a.dataAs<float>();
    ASSERT_NE(data, nullptr);
    EXPECT_TRUE(std::all_of(data, data + elements, [](float x) { return x == 0.0f; }));
    data[0] = 1.5f;
    data[elements - 1] = -2.5f;
    HostTensor copy = a;
    ASSERT_NE(copy.data(), a.data());
    EXPECT_EQ(copy.dataAs<float>()[0], 1.5f);
    EXPECT_EQ(copy.dataAs<float>()[elements - 1], -2.5f);
    copy.dataAs<float>()[0] = 7.0f;
    EXPECT_EQ(data[0], 1.5f);
    HostTensor moved = std::move(a);
    EXPECT_EQ(moved.data(), data);
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_TRUE(a.shape().empty());
    copy = std::move(moved);
    EXPECT_EQ(copy.data(), data);
    EXPECT_EQ(copy.shape(), std::vector<int64_t>{elements});
  }
  HostTensor none(DType::F32, {4, 0});
  EXPECT_EQ(none.data(), nullptr);
  EXPECT_EQ(none.numel(), 0);
  HostTensor copyOfNone = none;
  EXPECT_EQ(copyOfNone.data(), nullptr);
}

// Issue 47: a null dense array is an Error for every valid shape, not a read
// through null.
TEST(BlockMaskHardening, DenseToBlockMaskRefusesNull) {
  // Named sizes, not a structured binding: the check's lambda captures them.
  for (const std::array<int64_t, 4> &sizes :
       std::vector<std::array<int64_t, 4>>{{1, 1, 1, 1}, {2, 3, 5, 7}, {1, 1, 4096, 1}}) {
    EXPECT_PAGEDC_ERROR(denseToBlockMask(nullptr, sizes[0], sizes[1], sizes[2], sizes[3], 2, 2),
                        "denseToBlockMask: dense is null");
  }
  // Invalid sizes are still reported as such.
  EXPECT_PAGEDC_ERROR(denseToBlockMask(nullptr, 0, 1, 1, 1, 2, 2),
                      "block mask batch and heads must be at least 1");
}

namespace {

/// Storage for an output view with a guard region after the view's
/// elements: a write past the view's end changes the guard.
struct GuardedFloats {
  explicit GuardedFloats(int64_t elements)
      : data(static_cast<size_t>(elements + kGuard), kMarker), elements(elements) {}
  bool guardIntact() const {
    return std::all_of(data.begin() + elements, data.end(),
                       [](float x) { return x == kMarker; });
  }
  bool untouched() const {
    return std::all_of(data.begin(), data.end(), [](float x) { return x == kMarker; });
  }
  static constexpr int64_t kGuard = 4096;
  static constexpr float kMarker = 42.0f;
  std::vector<float> data;
  int64_t elements;
};

int64_t product(const std::vector<int64_t> &shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<int64_t>());
}

/// `shape` with dimension `d` one smaller (at least 0).
std::vector<int64_t> shrunk(std::vector<int64_t> shape, size_t d) {
  shape[d] = std::max<int64_t>(shape[d] - 1, 0);
  return shape;
}

} // namespace

// Issue 47: every entry point that writes into a caller's view refuses one
// smaller than the call's shape (each dimension shrunk in turn) before it
// writes anything, and leaves the memory after the view alone.
TEST(OutputViewHardening, ViewsSmallerThanTheCallAreRefusedUnwritten) {
  KVCacheConfig config;
  config.numPages = 8;
  config.pageSize = 4;
  config.maxBatch = 2;
  config.heads = 2;
  config.headDim = 8;
  config.valueHeadDim = 8;
  PagedKVCache cache(config);
  std::vector<float> k(2 * 2 * 9 * 8, 0.25f), v(k.size(), 0.5f), q(2 * 4 * 3 * 8, 0.125f);
  std::vector<int32_t> positions(9);
  std::iota(positions.begin(), positions.end(), 0);
  for (int32_t b = 0; b < 2; ++b) {
    cache.reserve(b, 9);
    int32_t slot = b;
    cache.assign(TensorView(&slot, DType::I32, {1}), TensorView(positions.data(), DType::I32, {1, 9}),
                 TensorView(&k[b * 2 * 9 * 8], DType::F32, {1, 2, 9, 8}),
                 TensorView(&v[b * 2 * 9 * 8], DType::F32, {1, 2, 9, 8}));
  }
  const CompiledMods mods = maskMods(causalRow, causalClass);
  const BlockMask mask = createBlockMask(mods, kNoContext, 2, 4, 9, 9, 4, 4);
  const TensorView qView(q.data(), DType::F32, {2, 4, 3, 8});
  AttentionOptions base;
  base.kvLength = {9, 9};
  base.qOffset = {6, 6};

  // flexAttention: options.out [B, Hq, Lq, Dv] and options.lse [B, Hq, Lq].
  const std::vector<int64_t> outShape = {2, 4, 3, 8}, lseShape = {2, 4, 3};
  for (size_t d = 0; d < outShape.size(); ++d) {
    GuardedFloats out(product(outShape));
    AttentionOptions options = base;
    options.out = TensorView(out.data.data(), DType::F32, shrunk(outShape, d));
    EXPECT_PAGEDC_ERROR(flexAttention(qView, cache, &mask, mods, {}, options),
                        "options.out must be [2, 4, 3, 8]");
    EXPECT_TRUE(out.untouched()) << "options.out, dimension " << d;
  }
  for (size_t d = 0; d < lseShape.size(); ++d) {
    GuardedFloats out(product(outShape)), lse(product(lseShape));
    AttentionOptions options = base;
    options.out = TensorView(out.data.data(), DType::F32, outShape);
    options.lse = TensorView(lse.data.data(), DType::F32, shrunk(lseShape, d));
    EXPECT_PAGEDC_ERROR(flexAttention(qView, cache, &mask, mods, {}, options),
                        "options.lse must be [2, 4, 3]");
    EXPECT_TRUE(out.untouched() && lse.untouched()) << "options.lse, dimension " << d;
  }
  {
    // The right shapes are written, up to their ends and no further.
    GuardedFloats out(product(outShape)), lse(product(lseShape));
    AttentionOptions options = base;
    options.out = TensorView(out.data.data(), DType::F32, outShape);
    options.lse = TensorView(lse.data.data(), DType::F32, lseShape);
    flexAttention(qView, cache, &mask, mods, {}, options);
    EXPECT_FALSE(out.untouched());
    EXPECT_TRUE(out.guardIntact() && lse.guardIntact());
  }

  // KVMemory::scatterRows: the cache view [H, rows, D] against values
  // [B, H, S, D] and the slots.
  const std::vector<int64_t> rowsShape = {2, 12, 8};
  std::vector<int64_t> slots = {0, 5, 11};
  const TensorView values(k.data(), DType::F32, {1, 2, 3, 8});
  for (size_t d = 0; d < rowsShape.size(); ++d) {
    if (d == 1)
      continue; // fewer rows: the slot check below
    GuardedFloats rows(product(rowsShape));
    EXPECT_PAGEDC_ERROR(hostKVMemory()->scatterRows(
                            values, TensorView(rows.data.data(), DType::F32, shrunk(rowsShape, d)),
                            slots.data()),
                        "scatterRows: cache [");
    EXPECT_TRUE(rows.untouched()) << "scatterRows cache, dimension " << d;
  }
  {
    GuardedFloats rows(product(rowsShape));
    EXPECT_PAGEDC_ERROR(hostKVMemory()->scatterRows(
                            values, TensorView(rows.data.data(), DType::F32, shrunk(rowsShape, 1)),
                            slots.data()),
                        "scatterRows: slots[2] = 11 is out of range [0, 11)");
    slots[1] = -1;
    EXPECT_PAGEDC_ERROR(hostKVMemory()->scatterRows(
                            values, TensorView(rows.data.data(), DType::F32, rowsShape),
                            slots.data()),
                        "scatterRows: slots[1] = -1 is out of range [0, 12)");
    EXPECT_TRUE(rows.untouched());
    slots[1] = 5;
    hostKVMemory()->scatterRows(values, TensorView(rows.data.data(), DType::F32, rowsShape),
                                slots.data());
    EXPECT_FALSE(rows.untouched());
    EXPECT_TRUE(rows.guardIntact());
  }

  // mergeState / mergeStates: v_out [T, H, D] and s_out [T, H].
  const std::vector<int64_t> vShape = {3, 2, 8}, sShape = {3, 2};
  std::vector<float> va(product(vShape), 1.0f), vb(va.size(), 2.0f), sa(product(sShape), 0.5f),
      sb(sa.size(), 0.25f), vParts(2 * va.size(), 1.0f), sParts(2 * sa.size(), 0.5f);
  const TensorView vaView(va.data(), DType::F32, vShape), vbView(vb.data(), DType::F32, vShape);
  const TensorView saView(sa.data(), DType::F32, sShape), sbView(sb.data(), DType::F32, sShape);
  const TensorView vPartsView(vParts.data(), DType::F32, {3, 2, 2, 8});
  const TensorView sPartsView(sParts.data(), DType::F32, {3, 2, 2});
  for (size_t d = 0; d < vShape.size(); ++d) {
    GuardedFloats vOut(product(vShape)), sOut(product(sShape));
    const TensorView small(vOut.data.data(), DType::F32, shrunk(vShape, d));
    const TensorView sView(sOut.data.data(), DType::F32, sShape);
    EXPECT_PAGEDC_ERROR(mergeState(vaView, saView, vbView, sbView, small, sView), "v_out must");
    EXPECT_PAGEDC_ERROR(mergeStates(vPartsView, sPartsView, small, sView), "v_out must");
    EXPECT_TRUE(vOut.untouched() && sOut.untouched()) << "v_out, dimension " << d;
  }
  for (size_t d = 0; d < sShape.size(); ++d) {
    GuardedFloats vOut(product(vShape)), sOut(product(sShape));
    const TensorView vView(vOut.data.data(), DType::F32, vShape);
    const TensorView small(sOut.data.data(), DType::F32, shrunk(sShape, d));
    EXPECT_PAGEDC_ERROR(mergeState(vaView, saView, vbView, sbView, vView, small), "s_out must");
    EXPECT_PAGEDC_ERROR(mergeStates(vPartsView, sPartsView, vView, small), "s_out must");
    EXPECT_TRUE(vOut.untouched() && sOut.untouched()) << "s_out, dimension " << d;
  }

  // PagedKVCache over caller storage [Hkv, numPages, pageSize, D].
  const std::vector<int64_t> storageShape = {2, 8, 4, 8};
  for (size_t d = 0; d < storageShape.size(); ++d) {
    GuardedFloats kStorage(product(storageShape)), vStorage(product(storageShape));
    EXPECT_PAGEDC_ERROR(
        PagedKVCache(config, TensorView(kStorage.data.data(), DType::F32, shrunk(storageShape, d)),
                     TensorView(vStorage.data.data(), DType::F32, storageShape)),
        "K storage must have shape [2, 8, 4, 8]");
    EXPECT_PAGEDC_ERROR(
        PagedKVCache(config, TensorView(kStorage.data.data(), DType::F32, storageShape),
                     TensorView(vStorage.data.data(), DType::F32, shrunk(storageShape, d))),
        "V storage must have shape [2, 8, 4, 8]");
    EXPECT_TRUE(kStorage.untouched() && vStorage.untouched());
  }
}

// A device buffer's copies are bounded without overflow: an offset near
// SIZE_MAX made `offset + bytes` wrap below the size and pass the check.
TEST(OutputViewHardening, DeviceBufferCopiesRefuseWrappingOffsets) {
  std::string reason;
  if (!CudaDriver::available(&reason) || CudaDriver::get().deviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: " << reason;
  DeviceBuffer buffer(64, 0);
  std::vector<uint8_t> host(64, 7);
  for (size_t offset : {SIZE_MAX, SIZE_MAX - 1, size_t(65)}) {
    EXPECT_PAGEDC_ERROR(buffer.upload(host.data(), 2, offset), "overruns 64 bytes");
    EXPECT_PAGEDC_ERROR(buffer.download(host.data(), 2, offset), "overruns 64 bytes");
  }
  EXPECT_PAGEDC_ERROR(buffer.upload(host.data(), 1, 64), "overruns 64 bytes");
  EXPECT_PAGEDC_ERROR(buffer.download(host.data(), SIZE_MAX, 1), "overruns 64 bytes");
  buffer.upload(host.data(), 64, 0);
  buffer.download(host.data(), 0, 64);
}

// Issue 47's hostile-input sweep, C++ side (the CLI and Python sides are
// test/CLI/hostile-sweep.test): calls a program could make by accident, each
// an Error naming the problem, never a crash, std::bad_alloc or a write.
namespace {

BatchAttentionConfig smallBatchConfig() {
  BatchAttentionConfig config;
  config.numQHeads = 2;
  config.numKVHeads = 2;
  config.headDim = 8;
  config.pageSize = 4;
  config.maxNumSeqs = 4;
  config.maxNumTokens = 64;
  config.maxBlocksPerSeq = 4;
  return config;
}

} // namespace

TEST(HostileInputs, BatchLimitsWhoseProductWrapsAreRefused) {
  // 2^33 blocks of 2^31 keys: the product wraps to 0 in int64, which once
  // passed the int32 bound and sized the page table from 2^35 entries.
  BatchAttentionConfig config = smallBatchConfig();
  config.maxBlocksPerSeq = int64_t(1) << 33;
  config.pageSize = int64_t(1) << 31;
  EXPECT_PAGEDC_ERROR(BatchAttention(CompiledMods{}, config), "must each fit int32");
  config.maxBlocksPerSeq = INT64_MAX;
  config.pageSize = 2;
  EXPECT_PAGEDC_ERROR(BatchAttention(CompiledMods{}, config), "must each fit int32");
  config = smallBatchConfig();
  config.maxNumSeqs = INT32_MAX;
  EXPECT_PAGEDC_ERROR(BatchAttention(CompiledMods{}, config), "must each fit int32");
  config = smallBatchConfig();
  config.threads = -3;
  EXPECT_PAGEDC_ERROR(BatchAttention(CompiledMods{}, config), "threads must not be negative");
}

TEST(HostileInputs, PlanMetadataOfTheWrongKindIsRefused) {
  BatchAttention attention(CompiledMods{}, smallBatchConfig());
  std::vector<int32_t> starts = {0, 2}, lengths = {2}, table = {0, 1, 2, 3};
  std::vector<int64_t> wide = {2};
  // Rank, element type, negative strides, missing data.
  EXPECT_PAGEDC_ERROR(
      attention.plan(i32View(starts, {1, 2}), i32View(lengths), i32View(table, {1, 4})),
      "query_start_loc must have rank 1");
  EXPECT_PAGEDC_ERROR(attention.plan(i32View(starts), TensorView(wide.data(), DType::I64, {1}),
                                     i32View(table, {1, 4})),
                      "seq_lens must be int32 but is i64");
  EXPECT_PAGEDC_ERROR(
      attention.plan(i32View(starts), i32View(lengths),
                     TensorView(table.data() + 3, DType::I32, {1, 4}, {4, -1}, Device::cpu())),
      "block_table has negative stride -1 in dimension 1");
  EXPECT_PAGEDC_ERROR(
      attention.plan(i32View(starts), i32View(lengths), TensorView(nullptr, DType::I32, {1, 4})),
      "block_table has no data");
  EXPECT_FALSE(attention.planned());
}

TEST(HostileInputs, PlanValuesThatCannotDescribeAStepAreRefused) {
  BatchAttention attention(CompiledMods{}, smallBatchConfig());
  std::vector<int32_t> table = {0, 1, 2, 3};
  auto plan = [&](std::vector<int32_t> starts, std::vector<int32_t> lengths) {
    attention.plan(i32View(starts), i32View(lengths), i32View(table, {1, 4}));
  };
  EXPECT_PAGEDC_ERROR(plan({5, 7}, {2}), "query_start_loc[0] must be 0 but is 5");
  EXPECT_PAGEDC_ERROR(plan({0, 2}, {-9}), "seq_lens[0] = -9 is less than");
  EXPECT_PAGEDC_ERROR(plan({0, INT32_MAX}, {INT32_MAX}), "exceeds max_num_tokens 64");
  // 4 pages of 4 hold 16 keys; a 17th needs a fifth column.
  EXPECT_PAGEDC_ERROR(plan({0, 1}, {17}), "max_blocks_per_seq is 4");
  std::vector<int32_t> negative = {0, -2, 1, 1};
  std::vector<int32_t> starts = {0, 1}, lengths = {8};
  EXPECT_PAGEDC_ERROR(attention.plan(i32View(starts), i32View(lengths), i32View(negative, {1, 4})),
                      "block_table[0, 1] = -2 is negative");
  EXPECT_FALSE(attention.planned());
}

TEST(HostileInputs, RunRefusesQueriesThatRunBackwardsOrAreMissing) {
  BatchAttention attention(CompiledMods{}, smallBatchConfig());
  std::vector<int32_t> starts = {0, 2}, lengths = {2}, table = {0, 0, 0, 0};
  attention.plan(i32View(starts), i32View(lengths), i32View(table, {1, 4}));
  HostTensor q(DType::F32, {2, 2, 8}), cache(DType::F32, {2, 1, 4, 8});
  HostTensor out(DType::F32, {2, 2, 8});
  std::fill(out.dataAs<float>(), out.dataAs<float>() + out.numel(), 7.0f);
  BatchRunOptions options;
  options.out = out.view();
  const TensorView backwards(q.dataAs<float>() + 8, DType::F32, {2, 2, 8}, {16, -8, 1},
                             Device::cpu());
  EXPECT_PAGEDC_ERROR(attention.run(backwards, cache.view(), cache.view(), {}, options),
                      "negative stride");
  EXPECT_PAGEDC_ERROR(attention.run(TensorView(nullptr, DType::F32, {2, 2, 8}), cache.view(),
                                    cache.view(), {}, options),
                      "no data");
  EXPECT_PAGEDC_ERROR(attention.run(TensorView(q.data(), DType::F32, {2, 2, 8, 1}), cache.view(),
                                    cache.view(), {}, options),
                      "q must be [T, Hq, D]");
  EXPECT_TRUE(std::all_of(out.dataAs<float>(), out.dataAs<float>() + out.numel(),
                          [](float x) { return x == 7.0f; }));
}

TEST(HostileInputs, TensorViewsThatDescribeNoTensorAreRefused) {
  float data[8] = {};
  EXPECT_PAGEDC_ERROR(TensorView(data, DType::F32, {2, -3}), "negative extent -3 in dimension 1");
  EXPECT_PAGEDC_ERROR(TensorView(data, DType::F32, {1, 1, 1, 1, 1, 1, 1}),
                      "tensor rank 7 exceeds the supported maximum of 6");
  EXPECT_PAGEDC_ERROR(TensorView(data, DType::F32, {2, 4}, {4, 1, 1}, Device::cpu()),
                      "shape has 2 dimensions but strides have 3");
  EXPECT_PAGEDC_ERROR(TensorView(data, DType::F32, {INT64_MAX / 2, 3}, {3, 1}, Device::cpu()),
                      "more elements than int64 can count");
}

TEST(HostileInputs, MalformedDLPackTensorsAreRefused) {
  float data[8] = {};
  int64_t shape[2] = {2, 4};
  PagedcDLTensor tensor{};
  tensor.data = data;
  tensor.device = {1, 0};
  tensor.ndim = 2;
  tensor.dtype = {2, 32, 1};
  tensor.shape = shape;
  ASSERT_EQ(TensorView::fromDLPack(tensor).numel(), 8);
  PagedcDLTensor bad = tensor;
  bad.dtype.lanes = 4;
  EXPECT_PAGEDC_ERROR(TensorView::fromDLPack(bad), "DLPack tensors with 4 lanes");
  bad = tensor;
  bad.device.device_type = 7;
  EXPECT_PAGEDC_ERROR(TensorView::fromDLPack(bad), "unsupported DLPack device type 7");
  bad = tensor;
  bad.ndim = -2;
  EXPECT_PAGEDC_ERROR(TensorView::fromDLPack(bad), "negative rank");
  bad = tensor;
  bad.ndim = 40;
  EXPECT_PAGEDC_ERROR(TensorView::fromDLPack(bad), "tensor rank 40 exceeds");
  bad = tensor;
  bad.shape = nullptr;
  EXPECT_PAGEDC_ERROR(TensorView::fromDLPack(bad), "has no shape");
  bad = tensor;
  bad.dtype = {2, 24, 1};
  EXPECT_PAGEDC_ERROR(TensorView::fromDLPack(bad), "unsupported DLPack dtype (code 2, 24 bits)");
}

TEST(HostileInputs, KVCacheMisuseChangesNothing) {
  KVCacheConfig config;
  config.numPages = 4;
  config.pageSize = 4;
  config.maxBatch = 2;
  config.heads = 1;
  config.headDim = 4;
  config.valueHeadDim = 4;
  PagedKVCache cache(config);
  cache.reserve(0, 6);
  const int64_t free = cache.freePageCount();
  EXPECT_PAGEDC_ERROR(cache.reserve(-1, 4), "slot -1 is out of range [0, 2)");
  EXPECT_PAGEDC_ERROR(cache.erase(INT64_MAX), "is out of range [0, 2)");
  EXPECT_PAGEDC_ERROR(cache.fork(0, 0, 4), "fork: source and destination are the same slot 0");
  EXPECT_PAGEDC_ERROR(cache.fork(0, 1, 9), "fork: length 9 is outside");
  EXPECT_PAGEDC_ERROR(cache.fork(0, 1, -1), "fork: length -1 is outside");
  EXPECT_PAGEDC_ERROR(cache.pageRefCount(-1), "page -1 is out of range [0, 4)");
  EXPECT_PAGEDC_ERROR(cache.physicalToLogical(0, 4), "page 4 is out of range [0, 4)");
  EXPECT_EQ(cache.freePageCount(), free);
  EXPECT_EQ(cache.capacity(0), 8);
  EXPECT_EQ(cache.capacity(1), 0);
}

TEST(HostileInputs, KVCacheAssignOfTheWrongKindWritesNothing) {
  KVCacheConfig config;
  config.numPages = 4;
  config.pageSize = 4;
  config.maxBatch = 2;
  config.heads = 1;
  config.headDim = 4;
  config.valueHeadDim = 4;
  PagedKVCache cache(config);
  cache.reserve(0, 4);
  const std::vector<uint8_t> before(static_cast<const uint8_t *>(cache.kCache().data()),
                                    static_cast<const uint8_t *>(cache.kCache().data()) +
                                        cache.kCache().numel() * 4);
  HostTensor k(DType::F32, {1, 1, 2, 4});
  std::fill(k.dataAs<float>(), k.dataAs<float>() + k.numel(), 3.0f);
  std::vector<int32_t> slots = {0};
  std::vector<int32_t> farSlot = {5};
  std::vector<int32_t> positions = {0, 1}, pastCapacity = {3, 4}, negative = {-1, 0};
  EXPECT_PAGEDC_ERROR(
      cache.assign(i32View(farSlot), i32View(positions, {1, 2}), k.view(), k.view()),
      "assign: batch_idx[0] = 5 is out of range [0, 2)");
  EXPECT_PAGEDC_ERROR(
      cache.assign(i32View(slots), i32View(pastCapacity, {1, 2}), k.view(), k.view()),
      "input_pos[0, 1] = 4 is outside slot 0's reserved capacity [0, 4)");
  EXPECT_PAGEDC_ERROR(cache.assign(i32View(slots), i32View(negative, {1, 2}), k.view(), k.view()),
                      "input_pos[0, 0] = -1 is outside slot 0's reserved capacity [0, 4)");
  HostTensor wrongHeads(DType::F32, {1, 3, 2, 4});
  EXPECT_PAGEDC_ERROR(cache.assign(i32View(slots), i32View(positions, {1, 2}), wrongHeads.view(),
                                   wrongHeads.view()),
                      "same number of heads");
  const std::vector<uint8_t> after(static_cast<const uint8_t *>(cache.kCache().data()),
                                   static_cast<const uint8_t *>(cache.kCache().data()) +
                                       cache.kCache().numel() * 4);
  EXPECT_EQ(before, after);
}
