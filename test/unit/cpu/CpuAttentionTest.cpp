//===- CpuAttentionTest.cpp - Paged CPU attention vs the float64 reference -===//
//
// Every case draws fresh random inputs (seeded per case), lays K/V out on
// shuffled pages, poisons the outputs with NaN and compares every element
// with the float64 reference.
//
//===----------------------------------------------------------------------===//
#include "AttentionCheck.h"
#include "TestMods.h"

#include "cpu/Reference.h"
#include "pagedc/Attention.h"
#include "pagedc/Error.h"

#include <gtest/gtest.h>

#include <random>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>

using namespace pagedc;
using namespace pagedc::testutil;

namespace {

/// Runs one configuration with the named mods and expects a match.
AttentionCheckResult expectMatch(const std::string &mask, const std::string &score,
                                 const AttentionConfig &config) {
  int64_t length = config.qLength;
  for (int32_t kv : config.kvLengths)
    length = std::max<int64_t>(length, kv);
  for (int32_t offset : config.qOffsets)
    length = std::max<int64_t>(length, offset + config.qLength);
  TestBindings bindings(config.batch, config.qHeads, length, config.seed + 101);
  CompiledMods mods = makeTestMods(mask, score);
  AttentionCheckResult result = checkPagedAttention(mods, bindings.context(), config);
  EXPECT_TRUE(result.ok()) << "mask '" << mask << "' score '" << score << "': "
                           << result.describe();
  EXPECT_GT(result.rows, 0);
  return result;
}

//===----------------------------------------------------------------------===//
// Prefill: every mod, page sizes, GQA ratios
//===----------------------------------------------------------------------===//

struct ModPair {
  const char *mask;
  const char *score;
};

void PrintTo(const ModPair &p, std::ostream *os) {
  *os << "mask '" << p.mask << "' score '" << p.score << "'";
}

class PrefillMods : public ::testing::TestWithParam<ModPair> {};

TEST_P(PrefillMods, MatchesReferenceWithAndWithoutBlockMask) {
  ModPair mods = GetParam();
  AttentionConfig config;
  config.batch = 2;
  config.qHeads = 6;
  config.kvHeads = 2;
  config.qLength = 75; // not a multiple of page, tile or block sizes
  config.kvLengths = {75, 75};
  config.pageSize = 16;
  config.seed = 1000 + std::hash<std::string>()(std::string(mods.mask) + mods.score) % 1000;
  expectMatch(mods.mask, mods.score, config);
  config.withBlockMask = true;
  config.seed += 1;
  expectMatch(mods.mask, mods.score, config);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, PrefillMods,
    ::testing::Values(ModPair{"", ""}, ModPair{"causal", ""}, ModPair{"sliding", ""},
                      ModPair{"document", ""}, ModPair{"holes", ""}, ModPair{"", "alibi"},
                      ModPair{"", "softcap"}, ModPair{"causal", "alibi"},
                      ModPair{"sliding", "softcap"}, ModPair{"document", "alibi"},
                      ModPair{"holes", "softcap"}),
    [](const ::testing::TestParamInfo<ModPair> &info) {
      std::string name = std::string(info.param.mask[0] ? info.param.mask : "nomask") + "_" +
                         (info.param.score[0] ? info.param.score : "noscore");
      return name;
    });

struct Layout {
  int32_t pageSize;
  int64_t group; // Hq / Hkv
};

void PrintTo(const Layout &p, std::ostream *os) {
  *os << "page size " << p.pageSize << ", Hq/Hkv " << p.group;
}

class PrefillLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(PrefillLayouts, CausalAlibiMatchesReference) {
  Layout layout = GetParam();
  AttentionConfig config;
  config.batch = 3;
  config.kvHeads = 2;
  config.qHeads = 2 * layout.group;
  config.qLength = 90;
  // Lengths differ per sequence and are not multiples of the page size; the
  // queries are end-aligned so every row has a key.
  config.kvLengths = {90, 131, 257};
  config.qOffsetAtEnd = true;
  config.pageSize = layout.pageSize;
  config.seed = 17 + layout.pageSize * 13 + layout.group;
  expectMatch("causal", "alibi", config);
  config.withBlockMask = true;
  config.qBlockSize = 64;
  config.kvBlockSize = 48;
  config.seed += 1;
  expectMatch("sliding", "", config);
}

INSTANTIATE_TEST_SUITE_P(Cpu, PrefillLayouts,
                         ::testing::Values(Layout{1, 1}, Layout{1, 4}, Layout{16, 1},
                                           Layout{16, 3}, Layout{16, 8}, Layout{128, 4},
                                           Layout{128, 3}, Layout{4, 8}),
                         [](const ::testing::TestParamInfo<Layout> &info) {
                           return "page" + std::to_string(info.param.pageSize) + "_gqa" +
                                  std::to_string(info.param.group);
                         });

//===----------------------------------------------------------------------===//
// Decode
//===----------------------------------------------------------------------===//

struct DecodeCase {
  int64_t qLength;
  int32_t pageSize;
  int64_t group;
  int threads;
};

void PrintTo(const DecodeCase &p, std::ostream *os) {
  *os << "Lq " << p.qLength << ", page size " << p.pageSize << ", Hq/Hkv " << p.group
      << ", threads " << p.threads;
}

class Decode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(Decode, EndAlignedQueriesMatchReference) {
  DecodeCase param = GetParam();
  AttentionConfig config;
  config.batch = 3;
  config.kvHeads = 2;
  config.qHeads = 2 * param.group;
  config.qLength = param.qLength;
  config.dim = 128;
  config.vDim = 128;
  config.kvLengths = {1, 700, 1299};
  config.qOffsetAtEnd = true;
  config.pageSize = param.pageSize;
  config.threads = param.threads;
  config.seed = 300 + param.qLength * 7 + param.pageSize + param.group * 3 + param.threads;
  expectMatch("causal", "", config);
  config.seed += 1;
  expectMatch("sliding", "alibi", config);
  config.withBlockMask = true;
  config.qBlockSize = 128;
  config.kvBlockSize = 128;
  config.seed += 1;
  expectMatch("document", "softcap", config);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Decode,
                         ::testing::Values(DecodeCase{1, 16, 4, 2}, DecodeCase{1, 1, 8, 3},
                                           DecodeCase{1, 128, 1, 4}, DecodeCase{3, 16, 3, 2},
                                           DecodeCase{3, 128, 4, 1}, DecodeCase{1, 16, 1, 1}),
                         [](const ::testing::TestParamInfo<DecodeCase> &info) {
                           return "lq" + std::to_string(info.param.qLength) + "_page" +
                                  std::to_string(info.param.pageSize) + "_gqa" +
                                  std::to_string(info.param.group) + "_threads" +
                                  std::to_string(info.param.threads);
                         });

TEST(CpuAttention, LongSingleSequenceDecodeSplitsTheKvRange) {
  // One sequence and one KV head leave threads idle, so the kernel splits the
  // 5000 keys and merges the parts by their logsumexp.
  AttentionConfig config;
  config.batch = 1;
  config.qHeads = 1;
  config.kvHeads = 1;
  config.qLength = 1;
  config.kvLengths = {5000};
  config.qOffsetAtEnd = true;
  config.threads = 4;
  config.scale = 0.5f; // peaked weights
  config.seed = 77;
  expectMatch("", "alibi", config);
  config.seed = 78;
  expectMatch("sliding", "", config); // most splits see nothing
}

//===----------------------------------------------------------------------===//
// Masking semantics
//===----------------------------------------------------------------------===//

TEST(CpuAttention, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  AttentionConfig config;
  config.qLength = 40;
  config.kvLengths = {40, 0}; // the second sequence has no keys at all
  config.seed = 5;
  AttentionCheckResult holes = expectMatch("holes", "", config);
  EXPECT_GE(holes.maskedRows, config.qLength * config.qHeads); // batch 1 + holes
  config.withBlockMask = true;
  config.seed = 6;
  expectMatch("holes", "alibi", config);
  config.seed = 7;
  AttentionCheckResult never = expectMatch("never", "softcap", config);
  EXPECT_EQ(never.maskedRows, never.rows);
  config.withBlockMask = false;
  config.seed = 8;
  expectMatch("never", "", config);
}

TEST(CpuAttention, FullBlocksSkipTheMaskModAndAbsentBlocksAreSkipped) {
  // A block mask that marks every block full must win over a mask mod that
  // keeps nothing, and one that lists no block must mask every row.
  TestBindings bindings(1, 2, 64, 3);
  CompiledMods never = makeTestMods("never", "");
  CompiledMods none = makeTestMods("", "");
  BlockMask allFull =
      buildDenseBlockMask(none, bindings.context(), 1, 1, 50, 64, 16, 32);
  BlockMask empty = allFull;
  std::fill(empty.fullKvNumBlocks.begin(), empty.fullKvNumBlocks.end(), 0);

  std::mt19937 rng(9);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<float> q(1 * 2 * 50 * 8), k(1 * 1 * 64 * 8), v(1 * 1 * 64 * 8);
  for (auto *data : {&q, &k, &v})
    for (float &x : *data)
      x = uniform(rng);
  cpu::PagedCache cache = cpu::buildPagedCache(TensorView(k.data(), DType::F32, {1, 1, 64, 8}),
                                               TensorView(v.data(), DType::F32, {1, 1, 64, 8}),
                                               nullptr, 16, DType::F32, 4);
  int32_t kvLength[] = {61};
  std::vector<float> out(2 * 50 * 8), lse(2 * 50);
  cpu::PagedAttentionArgs args;
  args.q = TensorView(q.data(), DType::F32, {1, 2, 50, 8});
  args.kCache = cache.kCache.view();
  args.vCache = cache.vCache.view();
  args.pageTable = cache.pageTable.data();
  args.pageTableStride = cache.pageTableStride;
  args.pageSize = cache.pageSize;
  args.kvLength = kvLength;
  args.mods = &never;
  args.context = bindings.context();
  args.scale = 0.3f;
  args.out = TensorView(out.data(), DType::F32, {1, 2, 50, 8});
  args.lse = TensorView(lse.data(), DType::F32, {1, 2, 50});

  cpu::ReferenceArgs referenceArgs;
  referenceArgs.q = args.q;
  referenceArgs.k = TensorView(k.data(), DType::F32, {1, 1, 64, 8});
  referenceArgs.v = TensorView(v.data(), DType::F32, {1, 1, 64, 8});
  referenceArgs.kvLength = kvLength;
  referenceArgs.mods = &none;
  referenceArgs.scale = 0.3;
  cpu::ReferenceResult reference = cpu::referenceAttention(referenceArgs);

  args.blockMask = &allFull;
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  cpu::pagedAttention(args);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 50; ++i) {
      EXPECT_NEAR(lse[h * 50 + i], reference.lseAt(0, h, i), 1e-4);
      for (int64_t d = 0; d < 8; ++d)
        EXPECT_NEAR(out[(h * 50 + i) * 8 + d], reference.outAt(0, h, i, d), 1e-5);
    }

  args.blockMask = &empty;
  args.mods = &none;
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  cpu::pagedAttention(args);
  for (float x : out)
    EXPECT_EQ(x, 0.0f);
  for (float x : lse)
    EXPECT_TRUE(std::isinf(x) && x < 0);
}

TEST(CpuAttention, BroadcastBlockMaskRows) {
  AttentionConfig config;
  config.qLength = 70;
  config.withBlockMask = true;
  config.broadcastMaskBatch = true;
  config.broadcastMaskHeads = true;
  config.qBlockSize = 16;
  config.kvBlockSize = 16;
  config.seed = 44;
  expectMatch("causal", "softcap", config);
  config.broadcastMaskHeads = false; // holes depends on h but not on b
  config.seed = 45;
  expectMatch("holes", "", config);
}

TEST(CpuAttention, BlockClassifierWithoutBlockMask) {
  // causal carries an exact block classifier, which the kernel uses to skip
  // and to trust tiles when no block mask is given.
  AttentionConfig config;
  config.batch = 1;
  config.qHeads = 4;
  config.kvHeads = 4;
  config.qLength = 300;
  config.seed = 51;
  expectMatch("causal", "", config);
  config.qOffsets = {41};
  config.kvLengths = {341};
  config.seed = 52;
  expectMatch("causal", "alibi", config);
}

//===----------------------------------------------------------------------===//
// Storage types, layouts, variants
//===----------------------------------------------------------------------===//

TEST(CpuAttention, Bf16StorageAndOutput) {
  // The reference reads the same bf16-rounded inputs, so f32 output keeps the
  // f32 tolerance; bf16 output adds half an ulp of each value.
  AttentionConfig config;
  config.storage = DType::BF16;
  config.qLength = 50;
  config.kvLengths = {50, 33};
  config.seed = 61;
  expectMatch("causal", "alibi", config);
  config.outType = DType::BF16;
  config.seed = 62;
  expectMatch("document", "", config);
  config.qLength = 1;
  config.kvLengths = {400, 129};
  config.qOffsetAtEnd = true;
  config.dim = config.vDim = 128;
  config.seed = 63;
  expectMatch("sliding", "softcap", config);
}

TEST(CpuAttention, StridedQueryAndOutputWithoutLse) {
  AttentionConfig config;
  config.transposedQueryLayout = true;
  config.withLse = false;
  config.qLength = 33;
  config.seed = 71;
  expectMatch("causal", "", config);
  config.storage = DType::BF16;
  config.outType = DType::BF16;
  config.seed = 72;
  expectMatch("", "alibi", config);
}

TEST(CpuAttention, OddHeadDimensionsAndValueDim) {
  AttentionConfig config;
  config.dim = 24;
  config.vDim = 40;
  config.qLength = 29;
  config.seed = 81;
  expectMatch("causal", "softcap", config);
  config.dim = 3;
  config.vDim = 5;
  config.seed = 82;
  expectMatch("document", "alibi", config);
  config.dim = 256;
  config.vDim = 256;
  config.seed = 83;
  expectMatch("sliding", "", config);
}

TEST(CpuAttention, EveryKernelVariantMatches) {
  for (cpu::KernelVariant variant : cpu::supportedKernelVariants()) {
    SCOPED_TRACE(cpu::kernelVariantName(variant));
    AttentionConfig config;
    config.variant = variant;
    config.qLength = 67;
    config.kvLengths = {67, 150};
    config.qOffsetAtEnd = true;
    config.seed = 90 + static_cast<int>(variant);
    expectMatch("causal", "alibi", config);
    config.qLength = 1;
    config.dim = config.vDim = 128;
    config.withBlockMask = true;
    expectMatch("document", "softcap", config);
  }
}

TEST(CpuAttention, DecodeRowBlocksOddDimensionsAndLengthsOnEveryVariant) {
  // The decode scorer takes query rows one at a time (a single-row tile),
  // in pairs (two rows) or in blocks of 4, with kLanes / rows-per-block K
  // rows per pass: 1, 2, 3, 4, 5, 6 and 8 rows, head dims that are not a
  // multiple of any vector width, odd context lengths (partial tiles and
  // pages), no mods and bf16 storage.
  struct Shape {
    int64_t qLength, group, dim, vDim;
    int32_t pageSize;
  };
  const Shape shapes[] = {{1, 4, 128, 128, 16}, {1, 1, 3, 5, 1},     {1, 3, 24, 40, 7},
                          {2, 3, 72, 16, 256},  {2, 4, 128, 64, 16}, {1, 6, 20, 20, 3},
                          {1, 8, 128, 128, 64}, {1, 2, 64, 64, 16},  {1, 5, 17, 9, 5},
                          {1, 1, 64, 32, 16}};
  for (cpu::KernelVariant variant : cpu::supportedKernelVariants()) {
    for (const Shape &shape : shapes) {
      SCOPED_TRACE(::testing::Message()
                   << cpu::kernelVariantName(variant) << " Lq " << shape.qLength << " group "
                   << shape.group << " D " << shape.dim << "/" << shape.vDim << " page "
                   << shape.pageSize);
      AttentionConfig config;
      config.variant = variant;
      config.batch = 2;
      config.kvHeads = 2;
      config.qHeads = 2 * shape.group;
      config.qLength = shape.qLength;
      config.dim = shape.dim;
      config.vDim = shape.vDim;
      config.pageSize = shape.pageSize;
      config.kvLengths = {1, 333};
      config.qOffsetAtEnd = true;
      config.seed = static_cast<uint64_t>(400 + shape.dim + shape.group);
      expectMatch("", "", config);
      config.seed += 1;
      expectMatch("causal", "", config);
      config.seed += 1;
      config.kvLengths = {131, 67};
      config.storage = DType::BF16;
      expectMatch("sliding", "alibi", config);
    }
  }
}

TEST(CpuAttention, ScratchReusedAcrossChangingCallsStaysCorrect) {
  // Each thread keeps its scratch between calls and a decode tile writes
  // only the parts it reads (the query rows, the -inf padding of each
  // score row): calls that shrink and grow rows, head dims, tiles and
  // dtypes, on one and two threads, back to back, must each match the
  // reference with nothing left over from the call before.
  struct Step {
    int64_t qLength, group, dim, vDim;
    DType storage;
    int threads;
    std::vector<int32_t> kvLengths;
  };
  const Step steps[] = {
      {1, 8, 128, 128, DType::F32, 1, {200, 77}}, {1, 1, 64, 64, DType::F32, 1, {16, 9}},
      {1, 3, 20, 36, DType::BF16, 1, {65, 3}},    {37, 2, 64, 64, DType::F32, 2, {40, 90}},
      {1, 2, 72, 8, DType::F32, 2, {300, 1}},     {1, 1, 64, 64, DType::BF16, 1, {16, 16}},
      {1, 8, 128, 128, DType::F32, 2, {129, 64}}, {1, 1, 64, 64, DType::F32, 1, {5, 16}}};
  uint64_t seed = 700;
  for (const Step &step : steps) {
    SCOPED_TRACE(::testing::Message()
                 << "Lq " << step.qLength << " group " << step.group << " D " << step.dim << "/"
                 << step.vDim << " threads " << step.threads);
    AttentionConfig config;
    config.batch = 2;
    config.kvHeads = 2;
    config.qHeads = 2 * step.group;
    config.qLength = step.qLength;
    config.dim = step.dim;
    config.vDim = step.vDim;
    config.storage = step.storage;
    config.threads = step.threads;
    config.kvLengths = step.kvLengths;
    config.qOffsetAtEnd = step.qLength <= step.kvLengths[0] && step.qLength <= step.kvLengths[1];
    config.seed = seed++;
    expectMatch("causal", "", config);
  }
}

TEST(CpuAttention, NoModsOnOneAndTwoThreads) {
  AttentionConfig config;
  config.qLength = 20;
  config.seed = 95;
  expectMatch("", "", config);
  config.threads = 1;
  expectMatch("", "", config);
}

//===----------------------------------------------------------------------===//
// Attention sinks
//===----------------------------------------------------------------------===//

/// Per query head, in turn: a logit near the rows' lse (it shifts both out
/// and lse), one above every score (|q.k| scale <= D / sqrt(D) = 8 for
/// D = 64 and inputs in [-1, 1]; 11.3 for D = 128), one far below them (its
/// weight is under f32 resolution) and -inf (no sink).
std::vector<float> mixedSinks(int64_t heads, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> nearLse(0.5f, 4.0f);
  std::vector<float> sinks;
  for (int64_t h = 0; h < heads; ++h) {
    const float fixed[] = {12.0f, -30.0f, -std::numeric_limits<float>::infinity()};
    sinks.push_back(h % 4 == 0 ? nearLse(rng) : fixed[h % 4 - 1]);
  }
  return sinks;
}

TEST(CpuAttentionSinks, PrefillGqaBatchMatchesReference) {
  AttentionConfig config;
  config.batch = 3;
  config.qHeads = 8;
  config.kvHeads = 2;
  config.qLength = 37;
  config.kvLengths = {45, 100, 37};
  config.qOffsetAtEnd = true;
  config.sinks = mixedSinks(config.qHeads, 1);
  config.seed = 501;
  expectMatch("causal", "alibi", config);
  config.withBlockMask = true;
  config.seed = 502;
  expectMatch("document", "softcap", config);
  // Rows of 64 and more take the GEMM path.
  config.withBlockMask = false;
  config.qLength = 130;
  config.kvLengths = {130, 200, 131};
  config.seed = 503;
  expectMatch("sliding", "", config);
  config.outType = DType::BF16;
  config.storage = DType::BF16;
  config.seed = 504;
  expectMatch("causal", "", config);
}

TEST(CpuAttentionSinks, DecodeAndSplitKeysMatchReference) {
  AttentionConfig config;
  config.batch = 3;
  config.qHeads = 8;
  config.kvHeads = 2;
  config.qLength = 1;
  config.dim = config.vDim = 128;
  config.kvLengths = {1, 700, 1299};
  config.qOffsetAtEnd = true;
  config.sinks = mixedSinks(config.qHeads, 2);
  config.seed = 511;
  expectMatch("causal", "", config);
  config.qLength = 3;
  config.seed = 512;
  expectMatch("sliding", "alibi", config);
  // One sequence and one KV head: the keys are split over the threads and
  // the sink joins once, after the parts are merged.
  config.batch = 1;
  config.qHeads = 4;
  config.kvHeads = 1;
  config.qLength = 1;
  config.kvLengths = {5000};
  config.threads = 4;
  config.sinks = mixedSinks(config.qHeads, 3);
  config.seed = 513;
  expectMatch("", "alibi", config);
}

TEST(CpuAttentionSinks, FullyMaskedRowsGiveZeroAndTheSink) {
  AttentionConfig config;
  config.qHeads = 8;
  config.qLength = 40;
  config.kvLengths = {40, 0}; // the second sequence has no keys at all
  config.sinks = mixedSinks(config.qHeads, 4);
  config.seed = 521;
  AttentionCheckResult holes = expectMatch("holes", "", config);
  EXPECT_GE(holes.maskedRows, config.qLength * config.qHeads);
  config.withBlockMask = true;
  config.seed = 522;
  AttentionCheckResult never = expectMatch("never", "softcap", config);
  EXPECT_EQ(never.maskedRows, never.rows);
}

TEST(CpuAttentionSinks, SinkAboveEveryScoreTakesNearlyAllTheWeight) {
  // Every score is at most 8 here: a sink of 20 leaves the keys a weight of
  // at most n e^-12, so out is near 0 and lse near 20.
  AttentionConfig config;
  config.qHeads = 4;
  config.qLength = 33;
  config.kvLengths = {50, 90};
  config.qOffsetAtEnd = true;
  config.sinks.assign(config.qHeads, 20.0f);
  config.seed = 531;
  expectMatch("causal", "", config);
  config.qLength = 1;
  config.seed = 532;
  expectMatch("", "alibi", config);
}

/// A random f32 cache of 2 slots (kvLength 70 and 33) and q [2, 4, Lq, 32].
struct SmallCall {
  PagedKVCache cache;
  HostTensor q;
  AttentionOptions options;
  explicit SmallCall(int64_t qLength) : cache(config()), q(DType::F32, {2, 4, qLength, 32}) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    cache.reserve(0, 70);
    cache.reserve(1, 33);
    for (const TensorView &t : {cache.kCache(), cache.vCache()})
      for (int64_t i = 0; i < t.numel(); ++i)
        t.dataAs<float>()[i] = uniform(rng);
    for (int64_t i = 0; i < q.numel(); ++i)
      q.dataAs<float>()[i] = uniform(rng);
    options.kvLength = {70, 33};
    options.qOffset = {static_cast<int32_t>(70 - qLength), static_cast<int32_t>(33 - qLength)};
    options.returnLse = true;
    options.threads = 2;
  }
  static KVCacheConfig config() {
    KVCacheConfig c;
    c.numPages = 16;
    c.pageSize = 8;
    c.maxBatch = 2;
    c.heads = 2;
    c.headDim = c.valueHeadDim = 32;
    return c;
  }
  AttentionResult run(const AttentionOptions &with) {
    return flexAttention(q.view(), cache, nullptr, CompiledMods(), {}, with);
  }
};

TEST(CpuAttentionSinks, FlexAttentionMergesTheSinkAsAKeyOfValueZero) {
  // Through the public call: out and lse with sinks are the call's without
  // them merged with (0, sinks[h]); -inf changes nothing and NaN gives NaN.
  for (int64_t qLength : {1, 9}) {
    SCOPED_TRACE(qLength);
    SmallCall call(qLength);
    AttentionResult plain = call.run(call.options);
    std::vector<float> sinks = {1.5f, -std::numeric_limits<float>::infinity(), 25.0f,
                                std::numeric_limits<float>::quiet_NaN()};
    AttentionOptions with = call.options;
    with.sinks = TensorView(sinks.data(), DType::F32, {4});
    AttentionResult sunk = call.run(with);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < qLength; ++i) {
          const int64_t row = (b * 4 + h) * qLength + i;
          const double lse = plain.lse.dataAs<float>()[row];
          const double sink = sinks[h];
          const double expectedLse =
              std::isnan(sink) ? sink
                               : std::max(lse, sink) + std::log1p(std::exp(-std::abs(lse - sink)));
          const float actualLse = sunk.lse.dataAs<float>()[row];
          if (std::isnan(sink)) {
            EXPECT_TRUE(std::isnan(actualLse));
          } else if (std::isinf(sink)) {
            EXPECT_EQ(actualLse, plain.lse.dataAs<float>()[row]);
          } else {
            EXPECT_NEAR(actualLse, expectedLse, 1e-5 * std::abs(expectedLse));
          }
          const double weight = std::exp(lse - expectedLse);
          for (int64_t d = 0; d < 32; ++d) {
            const float actual = sunk.out.dataAs<float>()[row * 32 + d];
            const double plainOut = plain.out.dataAs<float>()[row * 32 + d];
            if (std::isnan(sink))
              EXPECT_TRUE(std::isnan(actual));
            else if (std::isinf(sink))
              EXPECT_EQ(actual, static_cast<float>(plainOut));
            else
              EXPECT_NEAR(actual, plainOut * weight, 1e-6 + 1e-5 * std::abs(plainOut * weight));
          }
        }
  }
}

TEST(CpuAttentionSinks, BadSinksAreRefusedAndNothingIsWritten) {
  SmallCall call(5);
  HostTensor out(DType::F32, {2, 4, 5, 32}), lse(DType::F32, {2, 4, 5});
  for (HostTensor *t : {&out, &lse})
    std::fill(t->dataAs<float>(), t->dataAs<float>() + t->numel(),
              std::numeric_limits<float>::quiet_NaN());
  std::vector<float> values(8, 1.0f);
  std::vector<uint16_t> halves(4, 0);
  struct Bad {
    TensorView sinks;
    const char *message;
  };
  const Bad cases[] = {
      {TensorView(values.data(), DType::F32, {3}), "options.sinks must be [Hq] = [4]"},
      {TensorView(values.data(), DType::F32, {1, 4}), "options.sinks must be [Hq] = [4]"},
      {TensorView(halves.data(), DType::BF16, {4}), "options.sinks is bf16 but must be f32"},
      {TensorView(values.data(), DType::F32, {4}, {2}, Device::cpu()),
       "options.sinks must be contiguous but has stride 2"},
      {TensorView(values.data(), DType::F32, {4}, {1}, Device::cuda(0)),
       "options.sinks is on cuda:0 but the call runs on cpu"},
      {TensorView(nullptr, DType::F32, {4}), "options.sinks has no data"},
  };
  for (const Bad &bad : cases) {
    AttentionOptions options = call.options;
    options.out = out.view();
    options.lse = lse.view();
    options.sinks = bad.sinks;
    try {
      call.run(options);
      ADD_FAILURE() << "no error; expected '" << bad.message << "'";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(bad.message), std::string::npos) << error.what();
    }
  }
  for (HostTensor *t : {&out, &lse})
    for (int64_t i = 0; i < t->numel(); ++i)
      ASSERT_TRUE(std::isnan(t->dataAs<float>()[i])) << "element " << i << " was written";
}

} // namespace
