//===- BlockMaskTest.cpp - createBlockMask and friends --------------------===//
#include "pagedc/BlockMask.h"
#include "pagedc/Mods.h"

#include "TestMods.h"
#include "TestUtil.h"

#include <random>

using namespace pagedc;
using namespace pagedc::test;

namespace {

const PagedcModContext kNoContext{nullptr, nullptr};

/// The mask mod evaluated on every element: [B, H, Q, KV].
std::vector<uint8_t> evaluateDense(const CompiledMods &mods, const PagedcModContext &context,
                                   int64_t batch, int64_t heads, int64_t qLength,
                                   int64_t kvLength) {
  std::vector<uint8_t> dense(batch * heads * qLength * kvLength);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t q = 0; q < qLength; ++q)
        for (int64_t kv = 0; kv < kvLength; ++kv) // one element per call on purpose
          mods.maskRow(&context, b, h, q, kv, 1,
                       &dense[((b * heads + h) * qLength + q) * kvLength + kv]);
  return dense;
}

/// Block classes straight from the definition, [B, H, numQ, numKv].
std::vector<uint8_t> referenceClasses(const std::vector<uint8_t> &dense, int64_t batch,
                                      int64_t heads, int64_t qLength, int64_t kvLength,
                                      int64_t qBlock, int64_t kvBlock) {
  const int64_t numQ = (qLength + qBlock - 1) / qBlock, numKv = (kvLength + kvBlock - 1) / kvBlock;
  std::vector<uint8_t> classes(batch * heads * numQ * numKv);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < numQ; ++i)
        for (int64_t j = 0; j < numKv; ++j) {
          bool any = false, all = true;
          for (int64_t q = i * qBlock; q < std::min((i + 1) * qBlock, qLength); ++q)
            for (int64_t kv = j * kvBlock; kv < std::min((j + 1) * kvBlock, kvLength); ++kv) {
              const bool keep = dense[((b * heads + h) * qLength + q) * kvLength + kv] != 0;
              any |= keep;
              all &= keep;
            }
          classes[((b * heads + h) * numQ + i) * numKv + j] =
              all ? FullBlock : (any ? PartialBlock : EmptyBlock);
        }
  return classes;
}

/// The mask's classes expanded over B and H (undoing broadcast).
std::vector<uint8_t> expandedClasses(const BlockMask &mask, int64_t batch, int64_t heads) {
  const std::vector<uint8_t> blocks = toDenseBlocks(mask);
  const int64_t numKv = mask.numKvBlocks();
  std::vector<uint8_t> expanded;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < mask.numQBlocks; ++i) {
        const uint8_t *row = blocks.data() + mask.rowIndex(b, h, i) * numKv;
        expanded.insert(expanded.end(), row, row + numKv);
      }
  return expanded;
}

std::vector<int32_t> partialRow(const BlockMask &mask, int64_t b, int64_t h, int64_t i) {
  return std::vector<int32_t>(mask.partialRow(b, h, i),
                              mask.partialRow(b, h, i) + mask.partialCount(b, h, i));
}
std::vector<int32_t> fullRow(const BlockMask &mask, int64_t b, int64_t h, int64_t i) {
  return std::vector<int32_t>(mask.fullRow(b, h, i),
                              mask.fullRow(b, h, i) + mask.fullCount(b, h, i));
}

} // namespace

TEST(CreateBlockMask, Causal512By512) {
  const CompiledMods mods = maskMods(causalRow, nullptr, false, false, /*diagonal=*/true);
  const BlockMask mask = createBlockMask(mods, kNoContext, 2, 1, 512, 512);
  EXPECT_EQ(mask.batch, 1); // causal reads neither b nor h
  EXPECT_EQ(mask.heads, 1);
  EXPECT_EQ(mask.numQBlocks, 4);
  EXPECT_EQ(mask.maxKvBlocks, 4);
  EXPECT_EQ(mask.kvNumBlocks, (std::vector<int32_t>{1, 1, 1, 1}));
  EXPECT_EQ(mask.fullKvNumBlocks, (std::vector<int32_t>{0, 1, 2, 3}));
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(partialRow(mask, 0, 0, i), (std::vector<int32_t>{static_cast<int32_t>(i)}));
    std::vector<int32_t> full;
    for (int32_t j = 0; j < i; ++j)
      full.push_back(j);
    EXPECT_EQ(fullRow(mask, 1, 0, i), full); // b = 1 broadcasts to row 0
  }
}

TEST(CreateBlockMask, NoMaskModMeansEveryBlockIsFull) {
  CompiledMods mods;
  const BlockMask mask = createBlockMask(mods, kNoContext, 4, 8, 300, 200, 128, 64);
  EXPECT_EQ(mask.batch, 1);
  EXPECT_EQ(mask.heads, 1);
  EXPECT_EQ(mask.numQBlocks, 3);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(mask.partialCount(3, 7, i), 0);
    EXPECT_EQ(fullRow(mask, 3, 7, i), (std::vector<int32_t>{0, 1, 2, 3}));
  }
}

TEST(CreateBlockMask, BroadcastFollowsTheDependenceAnalysis) {
  const CompiledMods byHead = maskMods(causalRow, nullptr, /*b=*/false, /*h=*/true);
  BlockMask mask = createBlockMask(byHead, kNoContext, 3, 2, 64, 64, 16, 16);
  EXPECT_EQ(mask.batch, 1);
  EXPECT_EQ(mask.heads, 2);
  EXPECT_EQ(mask.kvNumBlocks.size(), 2u * 4u);
  const CompiledMods byBatch = maskMods(causalRow, nullptr, /*b=*/true, /*h=*/false);
  mask = createBlockMask(byBatch, kNoContext, 3, 2, 64, 64, 16, 16);
  EXPECT_EQ(mask.batch, 3);
  EXPECT_EQ(mask.heads, 1);
  // B = 1 given explicitly broadcasts even when the mask reads b.
  mask = createBlockMask(byBatch, kNoContext, 1, 5, 64, 64, 16, 16);
  EXPECT_EQ(mask.batch, 1);
  EXPECT_EQ(mask.heads, 1);
}

TEST(CreateBlockMask, EveryMethodMatchesTheDefinitionForCausalAndWindows) {
  std::vector<PagedcParamSlot> params(1);
  const PagedcModContext context{nullptr, params.data()};
  struct Case {
    int64_t q, kv, qBlock, kvBlock, window;
  };
  const Case cases[] = {{64, 64, 16, 16, 20},  {70, 53, 16, 16, 1},   {53, 70, 8, 8, 9},
                        {64, 100, 16, 32, 33}, {100, 64, 32, 16, 16}, {37, 37, 64, 64, 5},
                        {1, 90, 16, 16, 40},   {90, 1, 4, 4, 3},      {128, 128, 32, 32, 64}};
  for (const Case &c : cases) {
    params[0].i32 = static_cast<int32_t>(c.window);
    for (auto [row, blockClass] :
         {std::pair{&causalRow, &causalClass}, std::pair{&slidingWindowRow, &slidingWindowClass}}) {
      const std::vector<uint8_t> expected =
          referenceClasses(evaluateDense(maskMods(row), context, 1, 1, c.q, c.kv), 1, 1, c.q, c.kv,
                           c.qBlock, c.kvBlock);
      const CompiledMods variants[] = {
          maskMods(row),                                  // element-wise
          maskMods(row, blockClass),                      // classifier per block
          maskMods(row, nullptr, false, false, true),     // diagonal, difference table
          maskMods(row, blockClass, false, false, true)}; // diagonal, classifier
      for (const CompiledMods &mods : variants) {
        const BlockMask mask =
            createBlockMask(mods, context, 1, 1, c.q, c.kv, static_cast<int32_t>(c.qBlock),
                            static_cast<int32_t>(c.kvBlock));
        EXPECT_NO_THROW(validateBlockMask(mask));
        EXPECT_EQ(toDenseBlocks(mask), expected)
            << "q " << c.q << " kv " << c.kv << " blocks " << c.qBlock << "x" << c.kvBlock
            << " window " << c.window << " classifier " << (mods.maskBlockClass != nullptr)
            << " diagonal " << mods.maskDependence.diagonal;
      }
    }
  }
}

TEST(CreateBlockMask, DiagonalFastPathEqualsElementWiseOnRandomDifferenceMasks) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t qLength = std::uniform_int_distribution<int64_t>(1, 150)(rng);
    const int64_t kvLength = std::uniform_int_distribution<int64_t>(1, 150)(rng);
    const int32_t blockSizes[] = {1, 4, 8, 16, 32, 64};
    const int32_t qBlock = blockSizes[rng() % 6];
    const int32_t kvBlock = trial % 2 ? qBlock : blockSizes[rng() % 6];
    // Difference table with long runs, so that whole blocks are full or empty.
    std::vector<uint8_t> table(qLength + kvLength - 1);
    uint8_t value = rng() % 2;
    for (auto &entry : table) {
      if (rng() % 23 == 0)
        value = !value;
      entry = (rng() % 50 == 0) ? !value : value;
    }
    PagedcBufferRef buffer{
        table.data(), {static_cast<int64_t>(table.size()), 1, 1, 1}, {1, 0, 0, 0}};
    PagedcParamSlot offset;
    offset.i32 = static_cast<int32_t>(kvLength - 1);
    const PagedcModContext context{&buffer, &offset};
    const CompiledMods mods = maskMods(differenceTableRow, nullptr, false, false, true);
    const BlockMask fast = createBlockMask(mods, context, 1, 1, qLength, kvLength, qBlock, kvBlock);
    const BlockMask slow = createBlockMask(mods, context, 1, 1, qLength, kvLength, qBlock, kvBlock,
                                           BlockMaskMethod::ElementWise);
    const std::vector<uint8_t> expected =
        referenceClasses(evaluateDense(mods, context, 1, 1, qLength, kvLength), 1, 1, qLength,
                         kvLength, qBlock, kvBlock);
    EXPECT_EQ(toDenseBlocks(slow), expected) << "trial " << trial;
    EXPECT_EQ(toDenseBlocks(fast), expected) << "trial " << trial;
    // Same lists in the same (ascending) order.
    EXPECT_EQ(fast.kvNumBlocks, slow.kvNumBlocks);
    EXPECT_EQ(fast.fullKvNumBlocks, slow.fullKvNumBlocks);
    for (int64_t i = 0; i < fast.numQBlocks; ++i) {
      EXPECT_EQ(partialRow(fast, 0, 0, i), partialRow(slow, 0, 0, i));
      EXPECT_EQ(fullRow(fast, 0, 0, i), fullRow(slow, 0, 0, i));
    }
  }
}

TEST(CreateBlockMask, RandomBatchAndHeadDependentMasksMatchDenseEvaluation) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 25; ++trial) {
    const int64_t batch = 1 + rng() % 3, heads = 1 + rng() % 3;
    const int64_t qLength = 1 + rng() % 80, kvLength = 1 + rng() % 80;
    const int32_t blockSizes[] = {2, 4, 8, 16};
    const int32_t qBlock = blockSizes[rng() % 4], kvBlock = blockSizes[rng() % 4];
    std::vector<PagedcParamSlot> params(3);
    params[0].i32 = 1 + rng() % 20; // region sizes, unrelated to the block sizes
    params[1].i32 = 1 + rng() % 20;
    params[2].i32 = static_cast<int32_t>(rng());
    const PagedcModContext context{nullptr, params.data()};
    const CompiledMods mods = maskMods(regionHashRow, nullptr, true, true);
    const BlockMask mask =
        createBlockMask(mods, context, batch, heads, qLength, kvLength, qBlock, kvBlock);
    ASSERT_EQ(mask.batch, batch);
    ASSERT_EQ(mask.heads, heads);
    const std::vector<uint8_t> dense =
        evaluateDense(mods, context, batch, heads, qLength, kvLength);
    EXPECT_EQ(toDenseBlocks(mask),
              referenceClasses(dense, batch, heads, qLength, kvLength, qBlock, kvBlock))
        << "trial " << trial;
    // Full blocks, skipped blocks and the mod in partial blocks give the mask back.
    EXPECT_EQ(toDense(mask, &mods, &context), dense) << "trial " << trial;
    // The dense converter agrees too.
    const BlockMask fromDense =
        denseToBlockMask(dense.data(), batch, heads, qLength, kvLength, qBlock, kvBlock);
    EXPECT_EQ(toDenseBlocks(fromDense), toDenseBlocks(mask)) << "trial " << trial;
  }
}

TEST(CreateBlockMask, ExpandedBroadcastMatchesPerBatchEvaluation) {
  const CompiledMods mods = maskMods(causalRow, causalClass);
  const BlockMask mask = createBlockMask(mods, kNoContext, 3, 4, 40, 50, 8, 16);
  const std::vector<uint8_t> dense = evaluateDense(mods, kNoContext, 3, 4, 40, 50);
  EXPECT_EQ(expandedClasses(mask, 3, 4), referenceClasses(dense, 3, 4, 40, 50, 8, 16));
}

TEST(CreateBlockMask, Validation) {
  const CompiledMods mods = maskMods(causalRow);
  EXPECT_PAGEDC_ERROR(createBlockMask(mods, kNoContext, 0, 1, 8, 8),
                      "block mask batch and heads must be at least 1 but are B=0 and H=1");
  EXPECT_PAGEDC_ERROR(createBlockMask(mods, kNoContext, 1, 1, 0, 8),
                      "block mask lengths must be from 1 to 2147483647 but are Q_LEN=0");
  EXPECT_PAGEDC_ERROR(createBlockMask(mods, kNoContext, 1, 1, 8, 8, 0, 8),
                      "block sizes must be at least 1 but are 0 x 8");
  CompiledMods noFunction = mods;
  noFunction.maskRow = nullptr;
  EXPECT_PAGEDC_ERROR(createBlockMask(noFunction, kNoContext, 1, 1, 8, 8),
                      "mask mod 'mask' has no CPU function");
}

TEST(BlockMaskFromKvBlocks, ChecksStructure) {
  // B = 1, H = 1, 2 q blocks, kv length 24 with blocks of 8: 3 kv blocks.
  auto make = [](std::vector<int32_t> num, std::vector<int32_t> idx, std::vector<int32_t> fullNum,
                 std::vector<int32_t> fullIdx) {
    return blockMaskFromKvBlocks(num, idx, fullNum, fullIdx, 1, 1, 3, 16, 24, 8, 8);
  };
  const BlockMask mask = make({1, 2}, {2, 0, 0, 0, 1, 0}, {1, 0}, {0, 0, 0, 0, 0, 0});
  EXPECT_EQ(toDenseBlocks(mask), (std::vector<uint8_t>{FullBlock, EmptyBlock, PartialBlock,
                                                       PartialBlock, PartialBlock, EmptyBlock}));
  EXPECT_PAGEDC_ERROR(make({1}, {0, 0, 0}, {}, {}),
                      "kvNumBlocks has 1 entries but its shape needs 2");
  EXPECT_PAGEDC_ERROR(make({1, 1}, {0, 0, 0, 0, 0}, {}, {}),
                      "kvIndices has 5 entries but its shape needs 6");
  EXPECT_PAGEDC_ERROR(make({4, 0}, {0, 1, 2, 0, 0, 0}, {}, {}),
                      "row 0 has 4 partial blocks; the count must be from 0 to 3");
  EXPECT_PAGEDC_ERROR(make({1, 1}, {3, 0, 0, 0, 0, 0}, {}, {}),
                      "row 0 lists partial kv block 3, outside [0, 3)");
  EXPECT_PAGEDC_ERROR(make({2, 0}, {1, 1, 0, 0, 0, 0}, {}, {}), "row 0 lists kv block 1 twice");
  EXPECT_PAGEDC_ERROR(make({1, 0}, {1, 0, 0, 0, 0, 0}, {1, 0}, {1, 0, 0, 0, 0, 0}),
                      "row 0 lists kv block 1 twice"); // partial and full
  EXPECT_PAGEDC_ERROR(make({1, 0}, {1, 0, 0, 0, 0, 0}, {0, 1}, {}),
                      "full block counts and indices must be given together");
  // No full blocks at all is fine.
  EXPECT_EQ(make({0, 1}, {0, 0, 0, 2, 0, 0}, {}, {}).fullCount(0, 0, 1), 0);
}

TEST(DenseToBlockMask, ClassifiesHandWrittenBlocks) {
  // 4 x 6 mask, blocks 2 x 3: block (0,0) full, (0,1) partial, (1,0) empty,
  // (1,1) full.
  const std::vector<uint8_t> dense = {1, 1, 1, 0, 1, 0, //
                                      1, 1, 1, 0, 0, 0, //
                                      0, 0, 0, 1, 1, 1, //
                                      0, 0, 0, 1, 1, 1};
  const BlockMask mask = denseToBlockMask(dense.data(), 1, 1, 4, 6, 2, 3);
  EXPECT_EQ(toDenseBlocks(mask),
            (std::vector<uint8_t>{FullBlock, PartialBlock, EmptyBlock, FullBlock}));
  EXPECT_EQ(partialRow(mask, 0, 0, 0), (std::vector<int32_t>{1}));
  EXPECT_EQ(fullRow(mask, 0, 0, 1), (std::vector<int32_t>{1}));
  // Without mods, partial blocks read as all-true.
  std::vector<uint8_t> expected = dense;
  for (int64_t q = 0; q < 2; ++q)
    for (int64_t kv = 3; kv < 6; ++kv)
      expected[q * 6 + kv] = 1;
  EXPECT_EQ(toDense(mask), expected);
}

TEST(CreateBlockMask, IntoReusesTheResultAndKeepsItOnError) {
  std::vector<PagedcParamSlot> params(1);
  params[0].i32 = 24;
  const PagedcModContext context{nullptr, params.data()};
  const CompiledMods window = maskMods(slidingWindowRow, nullptr, false, false, true);
  const CompiledMods causal = maskMods(causalRow, causalClass);
  BlockMask reused;
  // Shapes that grow, shrink and repeat must each equal a fresh build.
  const int64_t lengths[][2] = {{200, 300}, {64, 64}, {200, 300}, {1, 500}};
  for (const auto &length : lengths)
    for (const CompiledMods *mods : {&window, &causal}) {
      createBlockMaskInto(*mods, context, 2, 2, length[0], length[1], 16, 32, BlockMaskMethod::Auto,
                          reused);
      const BlockMask fresh = createBlockMask(*mods, context, 2, 2, length[0], length[1], 16, 32);
      EXPECT_EQ(toDenseBlocks(reused), toDenseBlocks(fresh));
      EXPECT_EQ(reused.kvNumBlocks, fresh.kvNumBlocks);
      EXPECT_EQ(reused.fullKvNumBlocks, fresh.fullKvNumBlocks);
    }
  const std::vector<uint8_t> before = toDenseBlocks(reused);
  EXPECT_PAGEDC_ERROR(
      createBlockMaskInto(causal, context, 1, 1, 0, 8, 16, 16, BlockMaskMethod::Auto, reused),
      "block mask lengths");
  CompiledMods noFunction = causal;
  noFunction.maskRow = nullptr;
  EXPECT_PAGEDC_ERROR(
      createBlockMaskInto(noFunction, context, 1, 1, 8, 8, 16, 16, BlockMaskMethod::Auto, reused),
      "has no CPU function");
  EXPECT_EQ(toDenseBlocks(reused), before);
}

// Whether every row's visits (partial + full blocks) grow from q block to
// q block: causal, sliding-window and full masks yes, a document mask (a
// new document restarts the count) and a mask whose one head shrinks no.
TEST(BlockMaskVisitsGrow, CausalAndSlidingYesDocumentNo) {
  const int64_t length = 1000, block = 128; // 8 q blocks, the last partial
  auto maskOf = [&](int64_t heads, auto keep) {
    std::vector<uint8_t> dense(size_t(heads * length * length));
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t q = 0; q < length; ++q)
        for (int64_t kv = 0; kv < length; ++kv)
          dense[size_t((h * length + q) * length + kv)] = keep(h, q, kv) ? 1 : 0;
    return denseToBlockMask(dense.data(), 1, heads, length, length, block, block);
  };
  EXPECT_TRUE(blockMaskVisitsGrow(maskOf(1, [](int64_t, int64_t q, int64_t kv) { return kv <= q; })));
  EXPECT_TRUE(blockMaskVisitsGrow(
      maskOf(1, [](int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < 300; })));
  EXPECT_TRUE(blockMaskVisitsGrow(maskOf(1, [](int64_t, int64_t, int64_t) { return true; })));
  // Documents of 400 and 600 rows: q block 3 (rows 384-511) sees blocks
  // 0-3, q block 4 (512-639) only blocks 3-4.
  const auto document = [](int64_t, int64_t q, int64_t kv) {
    return kv <= q && (q < 400) == (kv < 400);
  };
  EXPECT_FALSE(blockMaskVisitsGrow(maskOf(1, document)));
  // Causal on head 0, anti-causal on head 1 (its visits shrink).
  EXPECT_FALSE(blockMaskVisitsGrow(maskOf(2, [](int64_t h, int64_t q, int64_t kv) {
    return h == 0 ? kv <= q : kv >= q;
  })));
  // An empty mask (no visits anywhere) does not shrink.
  EXPECT_TRUE(blockMaskVisitsGrow(maskOf(1, [](int64_t, int64_t, int64_t) { return false; })));
}
