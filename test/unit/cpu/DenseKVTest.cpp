//===- DenseKVTest.cpp - flexAttention on dense K/V read in place ---------===//
//
// The dense overload of flexAttention() reads k [B, Hkv, S, D] and v where
// they lie, as pages of S tokens. These cases compare it with the float64
// reference (odd S, GQA, batch > 1, strided k and v, bf16, masks, fully
// masked rows, lse), check that it reads the caller's memory rather than a
// copy, and check its refusals.
//
//===----------------------------------------------------------------------===//
#include "AttentionCheck.h"
#include "TestMods.h"

#include "pagedc/Attention.h"
#include "pagedc/Error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

using namespace pagedc;
using namespace pagedc::testutil;

namespace {

void expectDenseMatch(const std::string &mask, const std::string &score, AttentionConfig config) {
  config.denseKV = true;
  int64_t length = config.qLength;
  for (int32_t kv : config.kvLengths)
    length = std::max<int64_t>(length, kv);
  TestBindings bindings(config.batch, config.qHeads, length, config.seed + 101);
  CompiledMods mods = makeTestMods(mask, score);
  AttentionCheckResult result = checkPagedAttention(mods, bindings.context(), config);
  EXPECT_TRUE(result.ok()) << "mask '" << mask << "' score '" << score
                           << "': " << result.describe();
  EXPECT_GT(result.rows, 0);
}

struct DenseCase {
  bool transposed;
  DType storage;
};

class DenseKV : public ::testing::TestWithParam<DenseCase> {};

TEST_P(DenseKV, PrefillGqaBatchMatchesReference) {
  AttentionConfig config;
  config.transposedKVLayout = GetParam().transposed;
  config.storage = config.outType = GetParam().storage;
  config.batch = 2;
  config.qHeads = 6;
  config.kvHeads = 2;
  config.qLength = 75; // S = 75 tokens a "page": not a power of two
  config.kvLengths = {75, 75};
  config.seed = 11 + config.transposedKVLayout;
  expectDenseMatch("causal", "alibi", config);
  // Lengths below S (the rest of k is NaN and must not be read), a block
  // mask, rows that see no key.
  config.kvLengths = {75, 40};
  config.withBlockMask = true;
  config.seed += 2;
  expectDenseMatch("sliding", "softcap", config);
  config.withBlockMask = false;
  config.seed += 2;
  expectDenseMatch("holes", "", config);
}

TEST_P(DenseKV, DecodeGqaMatchesReferenceOnEveryVariant) {
  for (cpu::KernelVariant variant : cpu::supportedKernelVariants()) {
    SCOPED_TRACE(cpu::kernelVariantName(variant));
    AttentionConfig config;
    config.variant = variant;
    config.transposedKVLayout = GetParam().transposed;
    config.storage = config.outType = GetParam().storage;
    config.batch = 3;
    config.kvHeads = 2;
    config.qHeads = 8;
    config.qLength = 1;
    config.dim = config.vDim = 128;
    config.kvLengths = {1000, 37, 1};
    config.qOffsetAtEnd = true;
    config.seed = 40 + static_cast<int>(variant) * 4 + config.transposedKVLayout;
    expectDenseMatch("", "", config);
    config.seed += 1;
    expectDenseMatch("holes", "softcap", config);
    config.withBlockMask = true;
    config.qBlockSize = config.kvBlockSize = 128;
    config.seed += 1;
    expectDenseMatch("document", "alibi", config);
    // Every entry reads all of k (kvLength left to its default), S = 37.
    config.withBlockMask = false;
    config.kvLengths = {37, 37, 37};
    config.seed += 1;
    expectDenseMatch("causal", "", config);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, DenseKV,
                         ::testing::Values(DenseCase{false, DType::F32},
                                           DenseCase{true, DType::F32},
                                           DenseCase{true, DType::BF16}),
                         [](const ::testing::TestParamInfo<DenseCase> &info) {
                           return std::string(info.param.transposed ? "strided_" : "compact_") +
                                  dtypeName(info.param.storage);
                         });

//===----------------------------------------------------------------------===//
// No copy
//===----------------------------------------------------------------------===//

// The score mod below rewrites the caller's k and v the first time it runs,
// after the call has set up and scored the first tile: a kernel that reads
// them in place sees the new values, one that reads a copy does not.
float *gMutableK = nullptr;
float *gMutableV = nullptr;
int64_t gKeys = 0, gDim = 0;
bool gMutated = false;

void mutateOnFirstCall(const PagedcModContext *, int32_t, int32_t, int32_t, int32_t, int32_t,
                       float *) {
  if (gMutated)
    return;
  gMutated = true;
  for (int64_t j = 0; j < gKeys; ++j)
    for (int64_t d = 0; d < gDim; ++d) {
      gMutableV[j * gDim + d] = 0.5f;
      if (j >= 64) // past the first 64-key tile, which is scored already
        gMutableK[j * gDim + d] = 0.0f;
    }
}

TEST(DenseKVNoCopy, TheKernelReadsTheCallersKAndV) {
  constexpr int64_t kKeys = 200, kDim = 16;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  HostTensor q(DType::F32, {1, 2, 1, kDim}), k(DType::F32, {1, 1, kKeys, kDim}),
      v(DType::F32, {1, 1, kKeys, kDim});
  for (HostTensor *t : {&q, &k, &v})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->dataAs<float>()[i] = uniform(rng);
  // The lse a kernel reading the rewritten k must give: the first tile's
  // original scores, and score 0 for every later key.
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  std::vector<double> expectedLse;
  for (int64_t h = 0; h < 2; ++h) {
    double sum = static_cast<double>(kKeys - 64);
    for (int64_t j = 0; j < 64; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < kDim; ++d)
        dot +=
            static_cast<double>(q.dataAs<float>()[h * kDim + d]) * k.dataAs<float>()[j * kDim + d];
      sum += std::exp(scale * dot);
    }
    expectedLse.push_back(std::log(sum));
  }

  CompiledMods mods;
  mods.scoreName = "mutate_on_first_call";
  mods.scoreRow = mutateOnFirstCall;
  gMutableK = k.dataAs<float>();
  gMutableV = v.dataAs<float>();
  gKeys = kKeys;
  gDim = kDim;
  gMutated = false;
  AttentionOptions options;
  options.returnLse = true;
  options.threads = 1; // one work item: the mod's first call precedes every V read
  AttentionResult result = flexAttention(q.view(), k.view(), v.view(), nullptr, mods, {}, options);
  ASSERT_TRUE(gMutated);
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_NEAR(result.lse.dataAs<float>()[h], expectedLse[h], 1e-5) << "head " << h;
    for (int64_t d = 0; d < kDim; ++d)
      EXPECT_NEAR(result.out.dataAs<float>()[h * kDim + d], 0.5f, 1e-5)
          << "head " << h << " d " << d;
  }
}

//===----------------------------------------------------------------------===//
// Batch entries and refusals
//===----------------------------------------------------------------------===//

/// q [2, 4, 3, 16]; k and v [3, 2, 70, 16], random.
struct DenseCall {
  HostTensor q{DType::F32, {2, 4, 3, 16}};
  HostTensor k{DType::F32, {3, 2, 70, 16}};
  HostTensor v{DType::F32, {3, 2, 70, 16}};
  DenseCall() {
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (HostTensor *t : {&q, &k, &v})
      for (int64_t i = 0; i < t->numel(); ++i)
        t->dataAs<float>()[i] = uniform(rng);
  }
};

TEST(DenseKVBatch, BatchIdxPicksEntriesOfK) {
  DenseCall call;
  AttentionOptions options;
  options.batchIdx = {2, 0};
  options.kvLength = {70, 33};
  options.qOffset = {67, 30};
  options.returnLse = true;
  AttentionResult picked = flexAttention(call.q.view(), call.k.view(), call.v.view(), nullptr,
                                         CompiledMods(), {}, options);
  // The same call on copies of k's entries 2 and 0.
  HostTensor k2(DType::F32, {2, 2, 70, 16}), v2(DType::F32, {2, 2, 70, 16});
  const int64_t entry = 2 * 70 * 16;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < entry; ++i) {
      const int64_t from = options.batchIdx[b] * entry + i;
      k2.dataAs<float>()[b * entry + i] = call.k.dataAs<float>()[from];
      v2.dataAs<float>()[b * entry + i] = call.v.dataAs<float>()[from];
    }
  options.batchIdx.clear();
  AttentionResult copied =
      flexAttention(call.q.view(), k2.view(), v2.view(), nullptr, CompiledMods(), {}, options);
  for (int64_t i = 0; i < picked.out.numel(); ++i)
    ASSERT_NEAR(picked.out.dataAs<float>()[i], copied.out.dataAs<float>()[i], 1e-6) << i;
  for (int64_t i = 0; i < picked.lse.numel(); ++i)
    ASSERT_NEAR(picked.lse.dataAs<float>()[i], copied.lse.dataAs<float>()[i], 1e-6) << i;
}

TEST(DenseKVBatch, BadInputIsRefusedAndNothingIsWritten) {
  DenseCall call;
  HostTensor out(DType::F32, {2, 4, 3, 16}), lse(DType::F32, {2, 4, 3});
  for (HostTensor *t : {&out, &lse})
    std::fill(t->dataAs<float>(), t->dataAs<float>() + t->numel(),
              std::numeric_limits<float>::quiet_NaN());
  HostTensor halves(DType::F16, {3, 2, 70, 16});
  const TensorView k = call.k.view(), v = call.v.view();
  const TensorView shortV(call.v.data(), DType::F32, {3, 2, 69, 16});
  const TensorView narrowK(call.k.data(), DType::F32, {3, 2, 70, 8});
  const TensorView rank3(call.k.data(), DType::F32, {3, 140, 16});
  const TensorView backwards(call.k.data(), DType::F32, {3, 2, 70, 16},
                             {2 * 70 * 16, 70 * 16, -16, 1}, Device::cpu());
  struct Bad {
    TensorView k, v;
    std::vector<int32_t> batchIdx, kvLength;
    bool onCuda;
    const char *message;
  };
  const Bad cases[] = {
      {rank3, v, {}, {}, false, "k must be [B, Hkv, S, D] but has shape"},
      {k, shortV, {}, {}, false, "batch, heads and length must match"},
      {halves.view(), v, {}, {}, false, "v is f32 but k is f16"},
      {halves.view(), halves.view(), {}, {}, false, "k is f16, which the CPU backend does not"},
      {narrowK, v, {}, {}, false, "q has head dim D=16 but k has D=8"},
      {backwards, v, {}, {}, false, "k has negative stride -16 in dimension 2"},
      {k, v, {}, {70, 71}, false, "options.kvLength[1] = 71 is outside [0, 70], k's length S"},
      {k, v, {0, 3}, {}, false, "options.batchIdx[1] = 3 is out of range [0, 3)"},
      {k, v, {}, {}, true, "dense k and v are read in place on the CPU only"},
  };
  for (const Bad &bad : cases) {
    AttentionOptions options;
    options.out = out.view();
    options.lse = lse.view();
    options.batchIdx = bad.batchIdx;
    options.kvLength = bad.kvLength;
    if (bad.onCuda)
      options.device = Device::cuda(0);
    try {
      flexAttention(call.q.view(), bad.k, bad.v, nullptr, CompiledMods(), {}, options);
      ADD_FAILURE() << "no error; expected '" << bad.message << "'";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(bad.message), std::string::npos) << error.what();
    }
  }
  // A q batch larger than k's needs batchIdx.
  HostTensor bigQ(DType::F32, {4, 4, 3, 16});
  try {
    flexAttention(bigQ.view(), k, v, nullptr, CompiledMods(), {}, AttentionOptions());
    ADD_FAILURE() << "no error for a q batch larger than k's";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("q has batch B=4 but k has batch 3"),
              std::string::npos)
        << error.what();
  }
  for (HostTensor *t : {&out, &lse})
    for (int64_t i = 0; i < t->numel(); ++i)
      ASSERT_TRUE(std::isnan(t->dataAs<float>()[i])) << "element " << i << " was written";
}

} // namespace
