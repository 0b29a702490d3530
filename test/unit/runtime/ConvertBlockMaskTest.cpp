//===- ConvertBlockMaskTest.cpp - convertLogicalBlockMask and views -------===//
#include "pagedc/PhysicalBlockMask.h"

#include "TestMods.h"
#include "TestUtil.h"

#include <cmath>

using namespace pagedc;
using namespace pagedc::test;

namespace {

const PagedcModContext kNoContext{nullptr, nullptr};

KVCacheConfig makeConfig(int64_t numPages, int64_t pageSize, int64_t maxBatch) {
  KVCacheConfig config;
  config.numPages = numPages;
  config.pageSize = pageSize;
  config.maxBatch = maxBatch;
  config.heads = 1;
  config.headDim = 2;
  config.valueHeadDim = 2;
  return config;
}

std::vector<int32_t> partialRow(const BlockMask &mask, int64_t b, int64_t h, int64_t i) {
  return std::vector<int32_t>(mask.partialRow(b, h, i),
                              mask.partialRow(b, h, i) + mask.partialCount(b, h, i));
}
std::vector<int32_t> fullRow(const BlockMask &mask, int64_t b, int64_t h, int64_t i) {
  return std::vector<int32_t>(mask.fullRow(b, h, i),
                              mask.fullRow(b, h, i) + mask.fullCount(b, h, i));
}
using Rows = std::vector<std::vector<int32_t>>;
Rows partialRows(const BlockMask &mask, int64_t b) {
  Rows rows;
  for (int64_t i = 0; i < mask.numQBlocks; ++i)
    rows.push_back(partialRow(mask, b, 0, i));
  return rows;
}
Rows fullRows(const BlockMask &mask, int64_t b) {
  Rows rows;
  for (int64_t i = 0; i < mask.numQBlocks; ++i)
    rows.push_back(fullRow(mask, b, 0, i));
  return rows;
}

/// Spec vector 3's cache: 8 pages of 128, tables [[0,3,5,7], [2,1,4,6]].
void reserveVector3(PagedKVCache &cache) {
  for (auto [a, b] : {std::pair{100, 200}, {150, 300}, {300, 512}, {512, 512}}) {
    cache.reserve(0, a);
    cache.reserve(1, b);
  }
}

void expectVector3(const PhysicalBlockMask &converted) {
  const BlockMask &mask = converted.mask;
  EXPECT_EQ(converted.indexSpace, PhysicalBlockMask::IndexSpace::PhysicalPages);
  EXPECT_EQ(mask.batch, 2);
  EXPECT_EQ(mask.heads, 1);
  EXPECT_EQ(mask.kvLength, 8 * 128);
  EXPECT_EQ(mask.maxKvBlocks, 4); // the logical mask's columns, not numPages
  EXPECT_EQ(mask.kvNumBlocks, (std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(mask.fullKvNumBlocks, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(partialRows(mask, 0), (Rows{{0}, {3}, {5}, {7}}));
  EXPECT_EQ(partialRows(mask, 1), (Rows{{2}, {1}, {4}, {6}}));
  EXPECT_EQ(fullRows(mask, 0), (Rows{{}, {0}, {0, 3}, {0, 3, 5}}));
  EXPECT_EQ(fullRows(mask, 1), (Rows{{}, {2}, {2, 1}, {2, 1, 4}}));
  EXPECT_NO_THROW(validateBlockMask(mask));
}

} // namespace

TEST(ConvertLogicalBlockMask, SpecVector3) {
  PagedKVCache cache(makeConfig(8, 128, 2));
  reserveVector3(cache);
  // A causal mask built with batch extent 2 (a mask that reads b) ...
  const CompiledMods perBatch = maskMods(causalRow, nullptr, /*b=*/true);
  const BlockMask logical = createBlockMask(perBatch, kNoContext, 2, 1, 512, 512);
  ASSERT_EQ(logical.batch, 2);
  expectVector3(convertLogicalBlockMask(cache, logical));
  // ... and a broadcast one expanded by an explicit batch_idx agree.
  const CompiledMods causal = maskMods(causalRow, nullptr, false, false, true);
  const BlockMask broadcast = createBlockMask(causal, kNoContext, 2, 1, 512, 512);
  ASSERT_EQ(broadcast.batch, 1);
  expectVector3(convertLogicalBlockMask(cache, broadcast, {0, 1}));

  // The physical-index causal mask.
  const PhysicalMaskView view(cache, &causal, nullptr, {0, 1});
  EXPECT_TRUE(view(0, 0, 256, 384));
  EXPECT_TRUE(view(0, 1, 256, 384));
  EXPECT_FALSE(view(1, 0, 256, 384)); // page 3 is not batch 1's
  EXPECT_TRUE(view(1, 0, 64, 270));   // page 2 = batch 1's logical page 0: kv 14
  EXPECT_FALSE(view(1, 0, 10, 270));  // logical kv 14 > q 10
  EXPECT_FALSE(view(0, 0, 0, -1));
  EXPECT_FALSE(view(0, 0, 0, 8 * 128));
  EXPECT_PAGEDC_ERROR(view(2, 0, 0, 0), "batch row 2 is out of range [0, 2)");
}

TEST(ConvertLogicalBlockMask, BatchIndexOrderSelectsThoseSlotsTables) {
  PagedKVCache cache(makeConfig(64, 16, 8));
  // Give every slot a distinct, interleaved table.
  for (int round = 1; round <= 4; ++round)
    for (int64_t slot = 7; slot >= 0; --slot)
      cache.reserve(slot, round * 16);
  const CompiledMods causal = maskMods(causalRow, nullptr, false, false, true);
  const BlockMask logical = createBlockMask(causal, kNoContext, 1, 1, 64, 64, 16, 16);
  const std::vector<int32_t> batchIdx = {3, 7, 1};
  const PhysicalBlockMask converted = convertLogicalBlockMask(cache, logical, batchIdx);
  ASSERT_EQ(converted.mask.batch, 3);
  EXPECT_EQ(converted.slots, batchIdx);
  for (int64_t b = 0; b < 3; ++b) {
    const std::vector<int32_t> &table = cache.pageTable(batchIdx[b]);
    EXPECT_EQ(
        std::vector<int32_t>(converted.pageTable.begin() + b * converted.pageTableStride,
                             converted.pageTable.begin() + (b + 1) * converted.pageTableStride),
        table);
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(partialRow(converted.mask, b, 0, i), (std::vector<int32_t>{table[i]}));
      std::vector<int32_t> full;
      for (int64_t j = 0; j < i; ++j)
        full.push_back(table[j]);
      EXPECT_EQ(fullRow(converted.mask, b, 0, i), full);
    }
  }
}

TEST(ConvertLogicalBlockMask, KvLengthDropsAndDemotesBlocks) {
  PagedKVCache cache(makeConfig(16, 16, 2));
  cache.reserve(0, 64); // pages [3, 2, 1, 0]
  cache.reserve(1, 32); // pages [5, 4]
  CompiledMods none;    // every block full
  const BlockMask logical = createBlockMask(none, kNoContext, 1, 1, 16, 64, 16, 16);
  // Row 0: length 40 keeps blocks 0 and 1 whole, block 2 only partly (32..39),
  // drops block 3. Row 1: no length given, its capacity 32 bounds it.
  const PhysicalBlockMask converted = convertLogicalBlockMask(cache, logical, {0, 1}, {40, 32});
  const std::vector<int32_t> &table0 = cache.pageTable(0);
  const std::vector<int32_t> &table1 = cache.pageTable(1);
  EXPECT_EQ(fullRow(converted.mask, 0, 0, 0), (std::vector<int32_t>{table0[0], table0[1]}));
  EXPECT_EQ(partialRow(converted.mask, 0, 0, 0), (std::vector<int32_t>{table0[2]}));
  EXPECT_EQ(fullRow(converted.mask, 1, 0, 0), (std::vector<int32_t>{table1[0], table1[1]}));
  EXPECT_EQ(partialRow(converted.mask, 1, 0, 0), (std::vector<int32_t>{}));
  EXPECT_EQ(converted.pageTableStride, 3);

  // The physical view masks past the length: block 2 holds logical 32..47.
  const PhysicalMaskView view(cache, &none, nullptr, {0, 1}, {40, 32});
  EXPECT_TRUE(view(0, 0, 0, table0[2] * 16 + 7));  // logical 39
  EXPECT_FALSE(view(0, 0, 0, table0[2] * 16 + 8)); // logical 40
  EXPECT_FALSE(view(0, 0, 0, table0[3] * 16));     // logical 48
  EXPECT_TRUE(view(1, 0, 0, table1[1] * 16 + 15)); // logical 31
  EXPECT_FALSE(view(1, 0, 0, table0[0] * 16));     // slot 0's page

  // Without kv_len, blocks past a slot's capacity are dropped.
  const PhysicalBlockMask capped = convertLogicalBlockMask(cache, logical, {1});
  EXPECT_EQ(fullRow(capped.mask, 0, 0, 0), (std::vector<int32_t>{table1[0], table1[1]}));
}

TEST(ConvertLogicalBlockMask, BlockLargerThanPageKeepsLogicalBlocks) {
  PagedKVCache cache(makeConfig(32, 16, 2));
  cache.reserve(1, 16);
  cache.reserve(0, 100); // 7 pages
  const CompiledMods causal = maskMods(causalRow, nullptr, false, false, true);
  const BlockMask logical = createBlockMask(causal, kNoContext, 1, 1, 128, 128, 64, 64);
  const PhysicalBlockMask converted = convertLogicalBlockMask(cache, logical, {0}, {100});
  EXPECT_EQ(converted.indexSpace, PhysicalBlockMask::IndexSpace::LogicalBlocks);
  EXPECT_EQ(converted.mask.kvLength, 128);
  // Block 1 covers 64..127 but only 64..99 are live: row 1 keeps it partial.
  EXPECT_EQ(fullRow(converted.mask, 0, 0, 1), (std::vector<int32_t>{0}));
  EXPECT_EQ(partialRow(converted.mask, 0, 0, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(converted.pageTableStride, 7);
  EXPECT_EQ(std::vector<int32_t>(converted.pageTable.begin(), converted.pageTable.end()),
            cache.pageTable(0));
}

TEST(ConvertLogicalBlockMask, PageLargerThanBlockKeepsLogicalBlocks) {
  PagedKVCache cache(makeConfig(4, 64, 2));
  cache.reserve(0, 64);
  cache.reserve(1, 128);
  const CompiledMods causal = maskMods(causalRow, nullptr, false, false, true);
  const BlockMask logical = createBlockMask(causal, kNoContext, 1, 1, 128, 128, 16, 16);
  const PhysicalBlockMask converted = convertLogicalBlockMask(cache, logical, {1, 0}, {128, 40});
  EXPECT_EQ(converted.indexSpace, PhysicalBlockMask::IndexSpace::LogicalBlocks);
  // Batch row 1 (slot 0, length 40): q block 7 keeps blocks 0, 1 full, block
  // 2 (32..47) partial, nothing past.
  EXPECT_EQ(fullRow(converted.mask, 1, 0, 7), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(partialRow(converted.mask, 1, 0, 7), (std::vector<int32_t>{2}));
  // Batch row 0 (slot 1, length 128) is the logical mask itself.
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(fullRow(converted.mask, 0, 0, i), fullRow(logical, 0, 0, i));
    EXPECT_EQ(partialRow(converted.mask, 0, 0, i), partialRow(logical, 0, 0, i));
  }
  EXPECT_EQ(converted.pageTableStride, 2);
  EXPECT_EQ(converted.pageTable, (std::vector<int32_t>{cache.pageTable(1)[0], cache.pageTable(1)[1],
                                                       cache.pageTable(0)[0], -1}));
}

TEST(ConvertLogicalBlockMask, Validation) {
  PagedKVCache cache(makeConfig(8, 16, 3));
  cache.reserve(0, 32);
  const CompiledMods perBatch = maskMods(causalRow, nullptr, true);
  const BlockMask logical = createBlockMask(perBatch, kNoContext, 2, 1, 32, 32, 16, 16);
  EXPECT_PAGEDC_ERROR(convertLogicalBlockMask(cache, logical, {0, 1, 2}),
                      "block mask has batch extent 2 but batch_idx has 3 entries");
  EXPECT_PAGEDC_ERROR(convertLogicalBlockMask(cache, logical, {0, 3}),
                      "batch_idx[1] = 3 is out of range [0, 3)");
  EXPECT_PAGEDC_ERROR(convertLogicalBlockMask(cache, logical, {0, 1}, {32}),
                      "kv_len has 1 entries but there are 2 batch rows");
  EXPECT_PAGEDC_ERROR(convertLogicalBlockMask(cache, logical, {0, 1}, {32, 1}),
                      "kv_len[1] = 1 is outside slot 1's capacity [0, 0]");
  const PhysicalBlockMask converted = convertLogicalBlockMask(cache, logical, {0, 1});
  EXPECT_TRUE(converted.mask.physicalIndices);
  EXPECT_PAGEDC_ERROR(convertLogicalBlockMask(cache, converted.mask, {0, 1}),
                      "the block mask is already converted");
  BlockMask broken = logical;
  broken.kvIndices.pop_back();
  EXPECT_PAGEDC_ERROR(convertLogicalBlockMask(cache, broken, {0, 1}), "kvIndices has");
}

TEST(PhysicalScoreView, TranslatesOrGivesMinusInfinity) {
  PagedKVCache cache(makeConfig(4, 4, 2));
  cache.reserve(1, 8); // pages [1, 0]
  CompiledMods mods;
  mods.scoreName = "add_kv";
  mods.scoreRow = [](const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kvBegin,
                     int32_t count, float *scores) {
    for (int32_t i = 0; i < count; ++i)
      scores[i] += 1000.0f * q + (kvBegin + i);
  };
  const PhysicalScoreView view(cache, &mods, nullptr, {1}, {6});
  EXPECT_EQ(view(0.5f, 0, 0, 2, 1 * 4 + 1), 2001.5f);      // page 1 = logical page 0
  EXPECT_EQ(view(0.5f, 0, 0, 2, 0 * 4 + 1), 2005.5f);      // page 0 = logical page 1: kv 5
  EXPECT_TRUE(std::isinf(view(0.5f, 0, 0, 2, 0 * 4 + 2))); // kv 6 >= kv_len
  EXPECT_TRUE(std::isinf(view(0.5f, 0, 0, 2, 3 * 4)));     // page 3 is free
  const PhysicalScoreView identity(cache, nullptr, nullptr, {1});
  EXPECT_EQ(identity(0.25f, 0, 0, 0, 0 * 4 + 3), 0.25f);
}

TEST(ConvertLogicalBlockMask, IntoReusesTheResultAndKeepsItOnError) {
  PagedKVCache cache(makeConfig(8, 128, 2));
  reserveVector3(cache);
  const CompiledMods causal = maskMods(causalRow, nullptr, false, false, true);
  const BlockMask broadcast = createBlockMask(causal, kNoContext, 2, 1, 512, 512);
  PhysicalBlockMask reused;
  // A different conversion first, then vector 3's into the same object.
  convertLogicalBlockMaskInto(cache, broadcast, {1}, {300}, reused);
  EXPECT_EQ(reused.mask.batch, 1);
  EXPECT_EQ(reused.slots, (std::vector<int32_t>{1}));
  convertLogicalBlockMaskInto(cache, broadcast, {0, 1}, {}, reused);
  expectVector3(reused);
  const std::vector<int32_t> indicesBefore = reused.mask.kvIndices;
  EXPECT_PAGEDC_ERROR(convertLogicalBlockMaskInto(cache, broadcast, {0, 5}, {}, reused),
                      "batch_idx[1] = 5 is out of range");
  EXPECT_EQ(reused.mask.kvIndices, indicesBefore);
  expectVector3(reused);
}
