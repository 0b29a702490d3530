//===- KVCacheTest.cpp - PagedKVCache: the reference vectors and more -----===//
#include "pagedc/KVCache.h"

#include "TestUtil.h"

#include <numeric>

using namespace pagedc;
using namespace pagedc::test;

namespace {

KVCacheConfig makeConfig(int64_t numPages, int64_t pageSize, int64_t maxBatch, int64_t heads = 1,
                         int64_t headDim = 4, int64_t valueHeadDim = 4) {
  KVCacheConfig config;
  config.numPages = numPages;
  config.pageSize = pageSize;
  config.maxBatch = maxBatch;
  config.heads = heads;
  config.headDim = headDim;
  config.valueHeadDim = valueHeadDim;
  return config;
}

std::vector<int64_t> capacities(const PagedKVCache &cache) {
  std::vector<int64_t> result;
  for (int64_t slot = 0; slot < cache.maxBatch(); ++slot)
    result.push_back(cache.capacity(slot));
  return result;
}

/// The reference's dense physical_to_logical[slot, page] for slots 0..B-1.
std::vector<std::vector<int32_t>> physicalToLogicalTable(const PagedKVCache &cache) {
  std::vector<std::vector<int32_t>> table;
  for (int64_t slot = 0; slot < cache.maxBatch(); ++slot) {
    table.emplace_back();
    for (int64_t page = 0; page < cache.numPages(); ++page)
      table.back().push_back(cache.physicalToLogical(slot, page));
  }
  return table;
}

using Rows = std::vector<std::vector<int32_t>>;

Rows densePageTableRows(const PagedKVCache &cache, int64_t columns) {
  std::vector<int32_t> slots(cache.maxBatch());
  std::iota(slots.begin(), slots.end(), 0);
  std::vector<int32_t> dense = cache.densePageTable(slots, columns);
  Rows rows;
  for (int64_t b = 0; b < cache.maxBatch(); ++b)
    rows.emplace_back(dense.begin() + b * columns, dense.begin() + (b + 1) * columns);
  return rows;
}

} // namespace

//===----------------------------------------------------------------------===//
// Spec test vectors 1-4 (the reference implementation's own tests)
//===----------------------------------------------------------------------===//

TEST(KVCacheVectors, AllocationFailureChangesNothing) {
  PagedKVCache cache(makeConfig(12, 4, 3));
  cache.reserve(0, 8);
  cache.reserve(1, 24);
  cache.reserve(2, 16);
  EXPECT_EQ(cache.freePageCount(), 0);
  Rows before = densePageTableRows(cache, 12);
  EXPECT_PAGEDC_ERROR(cache.reserve(0, 16), "requested 2 pages but there are only 0 empty pages");
  EXPECT_EQ(capacities(cache), (std::vector<int64_t>{8, 24, 16}));
  EXPECT_EQ(densePageTableRows(cache, 12), before);
  cache.erase(1);
  cache.reserve(0, 16);
  EXPECT_EQ(capacities(cache), (std::vector<int64_t>{16, 0, 16}));
  EXPECT_EQ(cache.freePageCount(), 4);
}

TEST(KVCacheVectors, Capacities) {
  PagedKVCache cache(makeConfig(12, 4, 3));
  cache.reserve(0, 3);
  cache.reserve(1, 11);
  cache.reserve(2, 8);
  EXPECT_EQ(capacities(cache), (std::vector<int64_t>{4, 12, 8}));
  EXPECT_EQ(cache.freePageCount(), 12 - 6);
  cache.erase(1);
  EXPECT_EQ(capacities(cache), (std::vector<int64_t>{4, 0, 8}));
  cache.reserve(0, 7);
  cache.reserve(1, 2);
  cache.reserve(2, 10);
  EXPECT_EQ(capacities(cache), (std::vector<int64_t>{8, 4, 12}));
  for (int64_t slot = 0; slot < 3; ++slot)
    cache.erase(slot);
  EXPECT_EQ(capacities(cache), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(cache.freePageCount(), 12);
}

TEST(KVCacheVectors, PageTableAndPhysicalToLogical) {
  PagedKVCache cache(makeConfig(8, 128, 2));
  for (auto [a, b] : {std::pair{100, 200}, {150, 300}, {300, 512}, {512, 512}}) {
    cache.reserve(0, a);
    cache.reserve(1, b);
  }
  EXPECT_EQ(capacities(cache), (std::vector<int64_t>{512, 512}));
  EXPECT_EQ(densePageTableRows(cache, 8),
            (Rows{{0, 3, 5, 7, -1, -1, -1, -1}, {2, 1, 4, 6, -1, -1, -1, -1}}));
  EXPECT_EQ(physicalToLogicalTable(cache),
            (Rows{{0, -1, -1, 1, -1, 2, -1, 3}, {-1, 1, 0, -1, 2, -1, 3, -1}}));
}

TEST(KVCacheVectors, AssignScattersRowsToPhysicalSlots) {
  PagedKVCache cache(makeConfig(6, 2, 2, /*heads=*/2, /*headDim=*/3, /*valueHeadDim=*/3));
  for (auto [a, b] : {std::pair{1, 3}, {4, 5}, {6, 6}}) {
    cache.reserve(0, a);
    cache.reserve(1, b);
  }
  EXPECT_EQ(densePageTableRows(cache, 6), (Rows{{0, 3, 5, -1, -1, -1}, {2, 1, 4, -1, -1, -1}}));

  std::vector<float> k(2 * 2 * 6 * 3);
  std::iota(k.begin(), k.end(), 0.0f);
  std::vector<float> v(k.size());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = -k[i];
  std::vector<int32_t> batchIdx = {0, 1};
  std::vector<int32_t> positions = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5};
  cache.assign(i32View(batchIdx), i32View(positions, {2, 6}),
               TensorView(k.data(), DType::F32, {2, 2, 6, 3}),
               TensorView(v.data(), DType::F32, {2, 2, 6, 3}));

  const std::vector<std::vector<float>> head0 = {
      {0, 1, 2}, {3, 4, 5},   {42, 43, 44}, {45, 46, 47}, {36, 37, 38}, {39, 40, 41},
      {6, 7, 8}, {9, 10, 11}, {48, 49, 50}, {51, 52, 53}, {12, 13, 14}, {15, 16, 17}};
  const float *kCache = cache.kCache().dataAs<const float>();
  const float *vCache = cache.vCache().dataAs<const float>();
  for (int64_t head = 0; head < 2; ++head)
    for (int64_t slot = 0; slot < 12; ++slot)
      for (int64_t d = 0; d < 3; ++d) {
        const float expected = head0[slot][d] + 18.0f * head;
        const int64_t offset = (head * 12 + slot) * 3 + d;
        EXPECT_EQ(kCache[offset], expected) << "head " << head << " slot " << slot;
        EXPECT_EQ(vCache[offset], -expected) << "head " << head << " slot " << slot;
      }
}

//===----------------------------------------------------------------------===//
// Configuration and validation
//===----------------------------------------------------------------------===//

TEST(KVCache, PageSizeMustBeAPowerOfTwoUpTo1024) {
  for (int64_t pageSize : {1, 2, 16, 256, 1024})
    EXPECT_NO_THROW(PagedKVCache(makeConfig(2, pageSize, 1)));
  for (int64_t pageSize : {0, -4, 3, 48, 2048})
    EXPECT_PAGEDC_ERROR(PagedKVCache(makeConfig(2, pageSize, 1)),
                        "page size must be a power of two from 1 to 1024 but is " +
                            std::to_string(pageSize));
}

TEST(KVCache, RejectsBadConfigurations) {
  EXPECT_PAGEDC_ERROR(PagedKVCache(makeConfig(0, 4, 1)), "number of pages");
  EXPECT_PAGEDC_ERROR(PagedKVCache(makeConfig(4, 4, 0)), "max batch must be at least 1");
  EXPECT_PAGEDC_ERROR(PagedKVCache(makeConfig(4, 4, 1, 0)), "number of KV heads");
  EXPECT_PAGEDC_ERROR(PagedKVCache(makeConfig(4, 4, 1, 1, 0, 4)), "head dims must be at least 1");
  KVCacheConfig config = makeConfig(4, 4, 1);
  config.dtype = DType::I32;
  EXPECT_PAGEDC_ERROR(PagedKVCache{config}, "KV cache dtype must be f32, f16, bf16, f8e4m3 or f8e5m2 but is i32");
  config = makeConfig(4, 4, 1);
  config.device = Device::cuda(0);
  EXPECT_PAGEDC_ERROR(PagedKVCache{config}, "KV cache memory on cuda:0 is not available");
}

TEST(KVCache, AdoptsUserStorage) {
  KVCacheConfig config = makeConfig(3, 2, 1, 2, 4, 2);
  std::vector<float> k(2 * 3 * 2 * 4), v(2 * 3 * 2 * 2);
  PagedKVCache cache(config, TensorView(k.data(), DType::F32, {2, 3, 2, 4}),
                     TensorView(v.data(), DType::F32, {2, 3, 2, 2}));
  EXPECT_EQ(cache.kCache().data(), k.data());
  cache.reserve(0, 1); // page 0
  std::vector<int32_t> batchIdx = {0}, positions = {1};
  std::vector<float> kRow = {1, 2, 3, 4, 5, 6, 7, 8}, vRow = {9, 10, 11, 12};
  cache.assign(i32View(batchIdx), i32View(positions, {1, 1}),
               TensorView(kRow.data(), DType::F32, {1, 2, 1, 4}),
               TensorView(vRow.data(), DType::F32, {1, 2, 1, 2}));
  // Head 1, page 0, row 1 of K lives at ((1 * 3 + 0) * 2 + 1) * 4.
  EXPECT_EQ(k[((1 * 3 + 0) * 2 + 1) * 4 + 3], 8.0f);
  EXPECT_EQ(v[((1 * 3 + 0) * 2 + 1) * 2 + 0], 11.0f);

  EXPECT_PAGEDC_ERROR(PagedKVCache(config, TensorView(k.data(), DType::F32, {2, 3, 4, 2}),
                                   TensorView(v.data(), DType::F32, {2, 3, 2, 2})),
                      "K storage must have shape [2, 3, 2, 4]");
  EXPECT_PAGEDC_ERROR(PagedKVCache(config, TensorView(k.data(), DType::F32, {2, 3, 2, 4}),
                                   TensorView(v.data(), DType::BF16, {2, 3, 2, 2})),
                      "V storage is bf16 but the cache is f32");
}

TEST(KVCache, ReserveAndEraseValidateSlots) {
  PagedKVCache cache(makeConfig(4, 4, 2));
  EXPECT_PAGEDC_ERROR(cache.reserve(2, 4), "reserve: slot 2 is out of range [0, 2)");
  EXPECT_PAGEDC_ERROR(cache.reserve(-1, 4), "slot -1 is out of range");
  EXPECT_PAGEDC_ERROR(cache.reserve(0, -1), "must not be negative");
  EXPECT_PAGEDC_ERROR(cache.erase(5), "erase: slot 5 is out of range");
  EXPECT_EQ(cache.freePageCount(), 4);
  cache.reserve(0, 0); // nothing to do
  EXPECT_EQ(cache.capacity(0), 0);
}

TEST(KVCache, EraseReturnsPagesToTheTailInLogicalOrder) {
  PagedKVCache cache(makeConfig(6, 1, 2));
  cache.reserve(0, 2); // takes [1, 0] -> table [1, 0]
  cache.reserve(1, 1); // takes [2]
  EXPECT_EQ(cache.pageTable(0), (std::vector<int32_t>{1, 0}));
  cache.erase(0);
  EXPECT_EQ(cache.freePages(), (std::vector<int32_t>{5, 4, 3, 1, 0}));
  cache.reserve(1, 3); // takes [1, 0] again, in list order
  EXPECT_EQ(cache.pageTable(1), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(cache.physicalToLogical(0, 1), -1);
  EXPECT_EQ(cache.physicalToLogical(1, 1), 1);
  EXPECT_EQ(cache.pageRefCount(0), 1);
  EXPECT_EQ(cache.pageRefCount(5), 0);
}

//===----------------------------------------------------------------------===//
// assign
//===----------------------------------------------------------------------===//

namespace {

struct AssignFixture : ::testing::Test {
  AssignFixture() : cache(makeConfig(4, 2, 2, /*heads=*/2, /*headDim=*/3, /*valueHeadDim=*/2)) {
    cache.reserve(0, 3);
    cache.reserve(1, 2);
    k.assign(2 * 2 * 2 * 3, 1.0f);
    v.assign(2 * 2 * 2 * 2, 2.0f);
  }
  void assign(std::vector<int64_t> kShape, std::vector<int64_t> vShape, DType dtype = DType::F32) {
    cache.assign(i32View(batchIdx), i32View(positions, {2, 2}), TensorView(k.data(), dtype, kShape),
                 TensorView(v.data(), dtype, vShape));
  }
  std::vector<float> snapshot() const {
    const float *data = cache.kCache().dataAs<const float>();
    std::vector<float> all(data, data + cache.kCache().numel());
    const float *values = cache.vCache().dataAs<const float>();
    all.insert(all.end(), values, values + cache.vCache().numel());
    return all;
  }
  PagedKVCache cache;
  std::vector<float> k, v;
  std::vector<int32_t> batchIdx = {0, 1};
  std::vector<int32_t> positions = {0, 3, 0, 1};
};

} // namespace

TEST_F(AssignFixture, ErrorsNameTheMismatchAndWriteNothing) {
  const std::vector<float> before = snapshot();
  EXPECT_PAGEDC_ERROR(assign({2, 3, 2, 3}, {2, 2, 2, 2}),
                      "Expect val and cache has the same number of heads but got H=3 and H=2.");
  EXPECT_PAGEDC_ERROR(assign({1, 2, 2, 3}, {1, 2, 2, 2}),
                      "Expect val and batch_idx have the same batch size but got B=1 and B=2.");
  EXPECT_PAGEDC_ERROR(assign({2, 2, 1, 3}, {2, 2, 1, 2}),
                      "Expect val and input_pos has the same length but got S=1 and S=2.");
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 2}, {2, 2, 2, 2}),
                      "Expect k_val and k_cache has the same hidden dim but got D=2 and D=3.");
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 3}, {2, 2, 2, 3}),
                      "Expect v_val and v_cache has the same hidden dim but got D=3 and D=2.");
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 3}, {2, 2, 1, 2}), "they must agree in B, H and S");
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 3}, {2, 2, 2, 2}, DType::BF16),
                      "assign: k is bf16 but the cache stores f32");
  // Position 3 of slot 1 lies past its capacity of 2: no row may be written,
  // including the valid ones of slot 0.
  positions = {0, 1, 0, 3};
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 3}, {2, 2, 2, 2}),
                      "input_pos[1, 1] = 3 is outside slot 1's reserved capacity [0, 2)");
  positions = {-1, 1, 0, 1};
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 3}, {2, 2, 2, 2}), "input_pos[0, 0] = -1");
  positions = {0, 1, 0, 1};
  batchIdx = {0, 2};
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 3}, {2, 2, 2, 2}),
                      "assign: batch_idx[1] = 2 is out of range [0, 2)");
  EXPECT_EQ(snapshot(), before);
  // An unreserved slot has capacity 0.
  cache.erase(1);
  batchIdx = {0, 1};
  EXPECT_PAGEDC_ERROR(assign({2, 2, 2, 3}, {2, 2, 2, 2}), "reserved capacity [0, 0)");
  EXPECT_EQ(snapshot(), before);
}

TEST_F(AssignFixture, StridedValuesAndI64Indices) {
  // k is a transposed view: stored [B, S, H, D], viewed [B, H, S, D].
  std::vector<float> stored(2 * 2 * 2 * 3);
  std::iota(stored.begin(), stored.end(), 0.0f);
  TensorView kView(stored.data(), DType::F32, {2, 2, 2, 3}, {12, 3, 6, 1}, Device::cpu());
  std::vector<int64_t> batch64 = {1, 0}, positions64 = {1, 0, 2, 1};
  cache.assign(TensorView(batch64.data(), DType::I64, {2}),
               TensorView(positions64.data(), DType::I64, {2, 2}), kView,
               TensorView(v.data(), DType::F32, {2, 2, 2, 2}));
  // Slot 0's table is [1, 0]; slot 1's is [2].
  // Batch entry 0 -> slot 1, s = 0 at position 1 (page 2, offset 1 = row 5):
  // k[b=0, h=1, s=0] = stored[0 * 12 + 0 * 6 + 1 * 3].
  const float *kCache = cache.kCache().dataAs<const float>();
  auto row = [&](int64_t head, int64_t physicalSlot) {
    return std::vector<float>(kCache + (head * 8 + physicalSlot) * 3,
                              kCache + (head * 8 + physicalSlot) * 3 + 3);
  };
  EXPECT_EQ(cache.pageTable(0), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(cache.pageTable(1), (std::vector<int32_t>{2}));
  EXPECT_EQ(row(1, 2 * 2 + 1), (std::vector<float>{3, 4, 5}));
  // Batch entry 1 -> slot 0, s = 0 at position 2 (logical page 1 = page 0,
  // offset 0): k[b=1, h=0, s=0] = stored[12 + 0 + 0].
  EXPECT_EQ(row(0, 0 * 2 + 0), (std::vector<float>{12, 13, 14}));
  // s = 1 at position 1 (page 1, offset 1): k[b=1, h=1, s=1] = stored[12 + 6 + 3].
  EXPECT_EQ(row(1, 1 * 2 + 1), (std::vector<float>{21, 22, 23}));
}

//===----------------------------------------------------------------------===//
// fork and copy-on-write
//===----------------------------------------------------------------------===//

TEST(KVCacheFork, SharesFullPagesAndCopiesThePartialPage) {
  PagedKVCache cache(makeConfig(8, 2, 3, 1, 1, 1));
  cache.reserve(0, 6); // pages [2, 1, 0]
  std::vector<float> k = {10, 11, 12, 13, 14}, v = {20, 21, 22, 23, 24};
  std::vector<int32_t> batchIdx = {0}, positions = {0, 1, 2, 3, 4};
  cache.assign(i32View(batchIdx), i32View(positions, {1, 5}),
               TensorView(k.data(), DType::F32, {1, 1, 5, 1}),
               TensorView(v.data(), DType::F32, {1, 1, 5, 1}));
  cache.fork(0, 1, 5);
  const std::vector<int32_t> &source = cache.pageTable(0);
  const std::vector<int32_t> &forked = cache.pageTable(1);
  ASSERT_EQ(forked.size(), 3u);
  EXPECT_EQ(forked[0], source[0]);
  EXPECT_EQ(forked[1], source[1]);
  EXPECT_NE(forked[2], source[2]); // the partial page was copied
  EXPECT_EQ(cache.pageRefCount(source[0]), 2);
  EXPECT_EQ(cache.pageRefCount(forked[2]), 1);
  EXPECT_EQ(cache.physicalToLogical(1, forked[2]), 2);
  EXPECT_EQ(cache.physicalToLogical(1, source[0]), 0);
  EXPECT_EQ(cache.freePageCount(), 4);
  const float *kCache = cache.kCache().dataAs<const float>();
  EXPECT_EQ(kCache[forked[2] * 2], 14.0f);

  // dst appends at position 5 in its own page; src keeps writing position 5
  // in its own page too.
  std::vector<int32_t> one = {1}, pos5 = {5};
  std::vector<float> k1 = {99}, v1 = {98};
  cache.assign(i32View(one), i32View(pos5, {1, 1}), TensorView(k1.data(), DType::F32, {1, 1, 1, 1}),
               TensorView(v1.data(), DType::F32, {1, 1, 1, 1}));
  EXPECT_EQ(kCache[forked[2] * 2 + 1], 99.0f);
  EXPECT_EQ(kCache[source[2] * 2 + 1], 0.0f);

  // Erasing the source keeps the shared pages alive for the fork.
  cache.erase(0);
  EXPECT_EQ(cache.pageRefCount(forked[0]), 1);
  EXPECT_EQ(cache.freePageCount(), 5);
  EXPECT_EQ(kCache[forked[1] * 2], 12.0f);
  cache.erase(1);
  EXPECT_EQ(cache.freePageCount(), 8);
}

TEST(KVCacheFork, WritingASharedPageCopiesItFirst) {
  PagedKVCache cache(makeConfig(4, 2, 3, 1, 1, 1));
  cache.reserve(0, 4); // pages [1, 0]
  std::vector<float> k = {1, 2, 3, 4}, v = {5, 6, 7, 8};
  std::vector<int32_t> batchIdx = {0}, positions = {0, 1, 2, 3};
  cache.assign(i32View(batchIdx), i32View(positions, {1, 4}),
               TensorView(k.data(), DType::F32, {1, 1, 4, 1}),
               TensorView(v.data(), DType::F32, {1, 1, 4, 1}));
  cache.fork(0, 1); // whole capacity: both pages shared
  cache.fork(0, 2);
  EXPECT_EQ(cache.pageRefCount(1), 3);
  EXPECT_EQ(cache.freePageCount(), 2);
  // Slot 1 overwrites position 1 (page 1): it gets a private copy.
  std::vector<int32_t> slot1 = {1}, pos1 = {1};
  std::vector<float> k1 = {-2}, v1 = {-6};
  cache.assign(i32View(slot1), i32View(pos1, {1, 1}),
               TensorView(k1.data(), DType::F32, {1, 1, 1, 1}),
               TensorView(v1.data(), DType::F32, {1, 1, 1, 1}));
  const float *kCache = cache.kCache().dataAs<const float>();
  const int32_t copy = cache.pageTable(1)[0];
  EXPECT_NE(copy, 1);
  EXPECT_EQ(kCache[copy * 2 + 0], 1.0f);  // copied
  EXPECT_EQ(kCache[copy * 2 + 1], -2.0f); // written
  EXPECT_EQ(kCache[1 * 2 + 1], 2.0f);     // the original is untouched
  EXPECT_EQ(cache.pageRefCount(1), 2);
  EXPECT_EQ(cache.physicalToLogical(1, copy), 0);
  EXPECT_EQ(cache.physicalToLogical(1, 1), -1);

  // Once slot 1 is gone, slots 0 and 2 share both pages. Both write into
  // logical page 1 in one call: a single copy suffices (the last writer keeps
  // the original page).
  cache.erase(1);
  EXPECT_EQ(cache.freePageCount(), 2);
  std::vector<int32_t> both = {0, 2}, posBoth = {2, 3};
  std::vector<float> k2 = {7, 8}, v2 = {7, 8};
  cache.assign(i32View(both), i32View(posBoth, {2, 1}),
               TensorView(k2.data(), DType::F32, {2, 1, 1, 1}),
               TensorView(v2.data(), DType::F32, {2, 1, 1, 1}));
  EXPECT_EQ(cache.freePageCount(), 1);
  EXPECT_NE(cache.pageTable(0)[1], cache.pageTable(2)[1]);
  EXPECT_EQ(kCache[cache.pageTable(0)[1] * 2 + 0], 7.0f);
  EXPECT_EQ(kCache[cache.pageTable(0)[1] * 2 + 1], 4.0f);
  EXPECT_EQ(kCache[cache.pageTable(2)[1] * 2 + 0], 3.0f);
  EXPECT_EQ(kCache[cache.pageTable(2)[1] * 2 + 1], 8.0f);
  // No pages left: a write that needs a copy fails and changes nothing.
  cache.reserve(1, 2);
  EXPECT_EQ(cache.freePageCount(), 0);
  std::vector<int32_t> slot2 = {2}, pos0 = {0};
  EXPECT_PAGEDC_ERROR(cache.assign(i32View(slot2), i32View(pos0, {1, 1}),
                                   TensorView(k1.data(), DType::F32, {1, 1, 1, 1}),
                                   TensorView(v1.data(), DType::F32, {1, 1, 1, 1})),
                      "copy-on-write of shared pages requested 1 pages but there are only 0");
  EXPECT_EQ(cache.pageTable(2)[0], 1);
  EXPECT_EQ(kCache[1 * 2 + 0], 1.0f);
  EXPECT_EQ(cache.pageRefCount(1), 2);
}

TEST(KVCacheFork, Validation) {
  PagedKVCache cache(makeConfig(3, 4, 3));
  cache.reserve(0, 8);
  cache.reserve(1, 1);
  EXPECT_PAGEDC_ERROR(cache.fork(0, 1, 4), "fork: destination slot 1 is not empty (capacity 4)");
  EXPECT_PAGEDC_ERROR(cache.fork(0, 0, 4), "same slot 0");
  EXPECT_PAGEDC_ERROR(cache.fork(0, 2, 9), "fork: length 9 is outside the source slot 0's");
  EXPECT_PAGEDC_ERROR(cache.fork(0, 3, 4), "fork: destination slot 3 is out of range");
  EXPECT_PAGEDC_ERROR(cache.fork(0, 2, 6), "requested 1 pages but there are only 0 empty pages");
  EXPECT_EQ(cache.capacity(2), 0);
  cache.fork(0, 2, 4); // one full page, nothing to copy
  EXPECT_EQ(cache.capacity(2), 4);
  cache.erase(2);
  cache.fork(0, 2, 0);
  EXPECT_EQ(cache.capacity(2), 0);
}
