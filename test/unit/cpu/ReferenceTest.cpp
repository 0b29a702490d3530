//===- ReferenceTest.cpp - The float64 reference and the test cache --------===//
#include "TestMods.h"
#include "cpu/Reference.h"
#include "pagedc/Error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace pagedc;
using namespace pagedc::cpu;

namespace {

TEST(Reference, MatchesClosedFormForTwoKeys) {
  // One query [1, 0] against keys [1, 0] and [0, 1]: weights e^1 and e^0.
  float q[] = {1, 0};
  float k[] = {1, 0, 0, 1};
  float v[] = {1, 2, 3, 4};
  ReferenceArgs args;
  args.q = TensorView(q, DType::F32, {1, 1, 1, 2});
  args.k = TensorView(k, DType::F32, {1, 1, 2, 2});
  args.v = TensorView(v, DType::F32, {1, 1, 2, 2});
  args.scale = 1.0;
  ReferenceResult result = referenceAttention(args);
  double e = std::exp(1.0);
  EXPECT_NEAR(result.outAt(0, 0, 0, 0), (e * 1 + 3) / (e + 1), 1e-15);
  EXPECT_NEAR(result.outAt(0, 0, 0, 1), (e * 2 + 4) / (e + 1), 1e-15);
  EXPECT_NEAR(result.lseAt(0, 0, 0), std::log(e + 1), 1e-15);
}

TEST(Reference, KvLengthAndMaskGiveZeroAndMinusInfinity) {
  // Causal with kvLength 2 and queries at offset 0: row 0 sees key 0 only;
  // a kvLength of 0 masks every row.
  float q[] = {0.5f, -1, 2, 0.25f};
  float k[] = {1, 2, 3, 4, 5, 6};
  float v[] = {7, 8, 9};
  int32_t kvLength[] = {2, 0};
  int32_t qOffset[] = {0, 0};
  CompiledMods mods = testutil::makeTestMods("causal", "");
  ReferenceArgs args;
  args.q = TensorView(q, DType::F32, {2, 1, 2, 1});
  args.k = TensorView(k, DType::F32, {2, 1, 3, 1});
  args.v = TensorView(v, DType::F32, {1, 1, 3, 1}); // batch mismatch: rejected
  args.kvLength = kvLength;
  args.qOffset = qOffset;
  args.mods = &mods;
  EXPECT_THROW(referenceAttention(args), Error);
  float v2[] = {7, 8, 9, 10, 11, 12};
  args.v = TensorView(v2, DType::F32, {2, 1, 3, 1});
  ReferenceResult result = referenceAttention(args);
  EXPECT_DOUBLE_EQ(result.outAt(0, 0, 0, 0), 7.0); // only key 0 visible
  EXPECT_DOUBLE_EQ(result.lseAt(0, 0, 0), 0.5 * 1);
  double w0 = std::exp(-1.0 * 1), w1 = std::exp(-1.0 * 2);
  EXPECT_NEAR(result.outAt(0, 0, 1, 0), (w0 * 7 + w1 * 8) / (w0 + w1), 1e-12);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(result.outAt(1, 0, i, 0), 0.0);
    EXPECT_TRUE(std::isinf(result.lseAt(1, 0, i)) && result.lseAt(1, 0, i) < 0);
  }
}

TEST(Reference, PagedCacheHoldsEveryLogicalRowOnShuffledPages) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1, 1);
  const int64_t batch = 3, heads = 2, capacity = 21, dim = 5, vDim = 3;
  std::vector<float> k(batch * heads * capacity * dim), v(batch * heads * capacity * vDim);
  for (float &x : k)
    x = uniform(rng);
  for (float &x : v)
    x = uniform(rng);
  int32_t lengths[] = {21, 7, 16};
  for (int32_t pageSize : {1, 4, 16}) {
    for (DType storage : {DType::F32, DType::BF16}) {
      PagedCache cache = buildPagedCache(
          TensorView(k.data(), DType::F32, {batch, heads, capacity, dim}),
          TensorView(v.data(), DType::F32, {batch, heads, capacity, vDim}), lengths, pageSize,
          storage, 11);
      std::vector<bool> used(cache.numPages, false);
      bool identity = true;
      int64_t logical = 0;
      for (int64_t b = 0; b < batch; ++b) {
        int64_t pages = (lengths[b] + pageSize - 1) / pageSize;
        for (int64_t p = 0; p < cache.pageTableStride; ++p) {
          int32_t page = cache.pageTable[b * cache.pageTableStride + p];
          if (p >= pages) {
            EXPECT_EQ(page, -1);
            continue;
          }
          ASSERT_GE(page, 0);
          ASSERT_LT(page, cache.numPages);
          EXPECT_FALSE(used[page]) << "page " << page << " given twice";
          used[page] = true;
          identity &= page == logical++;
        }
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t j = 0; j < capacity; ++j) {
            int64_t page = j < lengths[b] ? cache.pageTable[b * cache.pageTableStride + j / pageSize] : -1;
            for (int64_t d = 0; d < dim; ++d) {
              if (page < 0)
                continue;
              int64_t slot = ((h * cache.numPages + page) * pageSize + j % pageSize) * dim + d;
              double expected = k[((b * heads + h) * capacity + j) * dim + d];
              if (storage == DType::BF16)
                expected = bf16ToFloat(floatToBF16(static_cast<float>(expected)));
              EXPECT_EQ(readAsDouble(cache.kCache.view(), slot), expected);
            }
          }
      }
      EXPECT_FALSE(identity) << "page table was not shuffled (page size " << pageSize << ")";
      // The spare pages are poisoned.
      for (int64_t page = 0; page < cache.numPages; ++page)
        if (!used[page]) {
          EXPECT_TRUE(std::isnan(readAsDouble(cache.vCache.view(), page * pageSize * vDim)));
        }
    }
  }
}

} // namespace
