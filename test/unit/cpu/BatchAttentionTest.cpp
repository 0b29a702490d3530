//===- BatchAttentionTest.cpp - The batch call vs the float64 reference ---===//
//
// BatchAttention on the CPU backend: random mixed steps (decode, speculative
// verification, chunked prefill at the end of a longer context, whole
// prompts, sequences with no new tokens) in each of the four cache layouts,
// each laid out in one engine-style allocation that the call reads in place,
// against the float64 reference; merge_state against attention over the
// whole key range; and every bad argument refused with nothing written.
//
//===----------------------------------------------------------------------===//
#include "BatchStep.h"
#include "TestMods.h"
#include "KeyBounds.h"
#include "cpu/CpuAttention.h"
#include "cpu/Reference.h"

#include "pagedc/BatchAttention.h"
#include "pagedc/Error.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

namespace {

using namespace pagedc;

using Seq = testutil::BatchSeq;
using StepCase = testutil::BatchStepCase;
using StepCheck = testutil::BatchStepCheck;
using ModBindings = testutil::StepBindings;
using testutil::EngineCache;
using testutil::nanTensor;
using testutil::randomValue;

/// Runs one step through BatchAttention on the CPU and compares it with the
/// float64 reference.
StepCheck checkStep(const StepCase &c) {
  testutil::BatchStep step(c);
  BatchAttention attention(step.mods, step.config());
  step.plan(attention);

  HostTensor out = nanTensor(c.outType, {step.q.shape()[0], c.qHeads, c.vDim});
  HostTensor lse = nanTensor(DType::F32, {step.q.shape()[0], c.qHeads});
  const void *kData = step.cache->k.data();
  BatchRunOptions options;
  options.out = out.view();
  options.lse = lse.view();
  options.sinks = step.sinksView();
  if (c.scale > 0.0f)
    options.scale = c.scale;
  TensorView kView = step.cache->kView(), vView = step.cache->vView();
  if (c.kvFloat8) {
    options.kScale = c.perHeadScale ? step.kScale : std::vector<float>{step.kScale[0]};
    options.vScale = c.perHeadScale ? step.vScale : std::vector<float>{step.vScale[0]};
    if (c.asU8) {
      options.kvDtype = *c.kvFloat8;
      auto bytes = [](const TensorView &v) {
        return v.data() ? TensorView(v.data(), DType::U8, v.shape(), v.strides(), v.device())
                        : v;
      };
      kView = bytes(kView);
      vView = bytes(vView);
    }
  }
  AttentionResult result =
      attention.run(step.q.view(), kView, vView, step.bindings->bindings, options);
  EXPECT_EQ(result.out.data(), out.data());
  EXPECT_EQ(step.cache->kView().data(), kData);
  StepCheck check = step.compare(out.view(), lse.view());
  EXPECT_EQ(check.rowsPastWritten, 0);
  return check;
}
/// A mixed step: decode, speculative verification, chunked prefills at the
/// end of longer contexts, whole prompts (seqLen == qLen), no new tokens.
std::vector<Seq> mixedStep() {
  return {{1, 150}, {5, 77},   {0, 40},   {37, 300}, {1, 1},
          {61, 61}, {300, 421}, {3, 129}, {1, 700},  {0, 0}};
}

const KVLayout kLayouts[] = {KVLayout::Pagedc, KVLayout::NHD, KVLayout::HND, KVLayout::VLLM};

TEST(BatchAttention, MixedStepEveryLayoutMatchesFloat64) {
  uint64_t seed = 11;
  for (KVLayout layout : kLayouts) {
    for (const char *mask : {"", "document", "holes", "prefix_lm"}) {
      StepCase c;
      c.seqs = mixedStep();
      c.layout = layout;
      c.mask = mask;
      c.score = std::string(mask) == "document" ? "alibi" : "";
      c.seed = ++seed;
      StepCheck check = checkStep(c);
      SCOPED_TRACE(std::string(kvLayoutName(layout)) + " mask '" + mask + "'");
      EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0)
          << check.describe();
      if (std::string(mask) == "holes") {
        EXPECT_GT(check.maskedRows, 0) << check.describe();
      }
    }
  }
}

TEST(BatchAttention, MixedStepWithSinksMatchesFloat64) {
  // Per query head a sink near the rows' lse, one above every score, one
  // far below and none (-inf); fully masked rows give out 0 and lse sinks[h].
  uint64_t seed = 41;
  for (KVLayout layout : {KVLayout::NHD, KVLayout::VLLM}) {
    for (const char *mask : {"", "document", "holes", "prefix_lm"}) {
      StepCase c;
      c.seqs = mixedStep();
      c.layout = layout;
      c.mask = mask;
      c.score = std::string(mask) == "document" ? "alibi" : "";
      c.sinks = true;
      c.seed = ++seed;
      StepCheck check = checkStep(c);
      SCOPED_TRACE(std::string(kvLayoutName(layout)) + " mask '" + mask + "'");
      EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0) << check.describe();
      if (std::string(mask) == "holes") {
        EXPECT_GT(check.maskedRows, 0) << check.describe();
      }
    }
  }
  // bf16 output and more query heads than the sink cycle, one thread.
  StepCase c;
  c.seqs = {{1, 900}, {17, 40}, {2, 2}};
  c.qHeads = 12;
  c.kvHeads = 4;
  c.outType = DType::BF16;
  c.threads = 1;
  c.sinks = true;
  c.seed = 60;
  StepCheck check = checkStep(c);
  EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0) << check.describe();
}

TEST(BatchAttention, PageSizesGroupsAndHeadDims) {
  struct Shape {
    int32_t pageSize;
    int64_t qHeads, kvHeads, dim;
    KVLayout layout;
    DType storage, out;
  };
  const Shape shapes[] = {
      {1, 4, 4, 64, KVLayout::HND, DType::F32, DType::F32},
      {16, 8, 2, 128, KVLayout::NHD, DType::BF16, DType::BF16},
      {128, 8, 1, 64, KVLayout::VLLM, DType::BF16, DType::F32},
      {128, 4, 1, 256, KVLayout::Pagedc, DType::F32, DType::BF16},
      {16, 4, 4, 256, KVLayout::VLLM, DType::BF16, DType::BF16},
  };
  uint64_t seed = 100;
  for (const Shape &shape : shapes) {
    StepCase c;
    // One 1000-token chunk in the first shape; the float64 reference's cost
    // grows with chunk x context, so the rest stay shorter.
    const bool longChunk = &shape == shapes;
    c.seqs = {{1, 1000}, {7, 263}, {129, 129}, {0, 17}, {longChunk ? 1000 : 300, 1100}};
    c.pageSize = shape.pageSize;
    c.qHeads = shape.qHeads;
    c.kvHeads = shape.kvHeads;
    c.dim = c.vDim = shape.dim;
    c.layout = shape.layout;
    c.storage = shape.storage;
    c.outType = shape.out;
    c.mask = "causal";
    c.score = "softcap";
    c.seed = ++seed;
    StepCheck check = checkStep(c);
    SCOPED_TRACE("page " + std::to_string(shape.pageSize) + " Hq " +
                 std::to_string(shape.qHeads) + " Hkv " + std::to_string(shape.kvHeads) +
                 " D " + std::to_string(shape.dim) + " " + kvLayoutName(shape.layout));
    EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0)
        << check.describe();
  }
}

TEST(BatchAttention, ValueWidthDiffersFromKeyWidth) {
  StepCase c;
  c.seqs = mixedStep();
  c.dim = 96;
  c.vDim = 48;
  c.layout = KVLayout::HND;
  c.mask = "sliding";
  StepCheck check = checkStep(c);
  EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0) << check.describe();
}

/// MLA decode (DeepSeek-V2/V3 after weight absorption): every query head
/// has a 576-wide query (512 latent + 64 rope), the cache one latent head
/// of 576 columns per token, and the values are the first 512 columns of
/// the same rows: v_cache is a view of k_cache (same pointer, same strides,
/// 512 wide), so no value is stored or copied. The caller gives the scale
/// (DeepSeek's 1 / sqrt(192), not 1 / sqrt(576)).
StepCase mlaCase(int64_t qHeads, std::vector<Seq> seqs, int32_t pageSize, KVLayout layout,
                 const char *mask, const char *score, uint64_t seed) {
  StepCase c;
  c.seqs = std::move(seqs);
  c.qHeads = qHeads;
  c.kvHeads = 1;
  c.dim = 576;
  c.vDim = 512;
  c.valuesInKeys = true;
  c.scale = 1.0f / std::sqrt(192.0f);
  c.pageSize = pageSize;
  c.layout = layout;
  c.mask = mask;
  c.score = score;
  c.seed = seed;
  return c;
}

TEST(BatchAttention, MlaDecodeReadsValuesFromTheLatentCache) {
  // 1-token decodes and 3-token speculative steps, contexts off the page
  // grid, a sequence with no new tokens; pages of 1, 16 and 64 shuffled.
  const std::vector<Seq> step16 = {{1, 300}, {3, 177}, {0, 20}, {1, 65}, {3, 3}, {1, 1000}};
  struct Variant {
    int64_t qHeads;
    int32_t pageSize;
    KVLayout layout;
    const char *mask, *score;
    DType storage;
  };
  const Variant variants[] = {
      {16, 16, KVLayout::NHD, "causal", "softcap", DType::F32},
      {16, 1, KVLayout::Pagedc, "holes", "alibi", DType::BF16},
      {16, 64, KVLayout::HND, "holes", "softcap", DType::F32},
      {128, 64, KVLayout::NHD, "causal", "alibi", DType::BF16},
      {128, 16, KVLayout::NHD, "holes", "softcap", DType::F32},
  };
  uint64_t seed = 70;
  for (const Variant &v : variants) {
    // Hq 128 on a shorter step: the float64 reference's cost grows with it.
    StepCase c = mlaCase(v.qHeads, v.qHeads > 16 ? std::vector<Seq>{{1, 211}, {3, 97}, {1, 1}}
                                                 : step16,
                         v.pageSize, v.layout, v.mask, v.score, ++seed);
    c.storage = v.storage;
    c.outType = v.storage;
    SCOPED_TRACE(fmt::format("Hq {} page {} {} {} + {}", v.qHeads, v.pageSize,
                             kvLayoutName(v.layout), v.mask, v.score));
    testutil::BatchStep step(c);
    // The values are K's memory itself: no V tensor exists.
    EXPECT_EQ(step.cache->vView().data(), step.cache->kView().data());
    EXPECT_EQ(step.cache->vView().strides(), step.cache->kView().strides());
    EXPECT_TRUE(step.cache->v.shape().empty());
    StepCheck check = checkStep(c);
    EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0)
        << check.describe();
    if (std::string(v.mask) == "holes") {
      EXPECT_GT(check.maskedRows, 0) << check.describe();
    }
  }
}

TEST(BatchAttention, OneThreadAndManyDecodesSplitTheKeys) {
  // 2 threads and 3 long decodes leave threads idle, so keys are split and
  // merged; 1 thread never splits. Both must agree with the reference.
  for (int threads : {1, 2}) {
    StepCase c;
    c.seqs = {{1, 2000}, {1, 1500}, {2, 900}};
    c.threads = threads;
    c.mask = "sliding";
    c.score = "alibi";
    c.seed = 40 + static_cast<uint64_t>(threads);
    StepCheck check = checkStep(c);
    EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0)
        << "threads " << threads << ": " << check.describe();
  }
}

/// The first key plan() leaves a sequence under the "window" test mask (the
/// 100 keys ending at each query, a constant): the start of the 64-key
/// granule holding its first new token's first kept key.
int32_t windowKeyBegin(const Seq &s) {
  const int32_t first = s.seqLen - s.qLen - 99;
  return first > 0 ? first / 64 * 64 : 0;
}

TEST(BatchAttention, ClassifierStartsEachSequenceAtItsWindow) {
  // Long contexts under a fixed window: each sequence's keys start at its
  // window's granule, and the step still matches the reference.
  StepCase c;
  c.seqs = {{1, 2000}, {3, 700}, {37, 300}, {61, 61}, {0, 40}, {1, 150}, {9, 164}};
  c.mask = "window";
  c.score = "alibi";
  c.seed = 51;
  {
    testutil::BatchStep step(c);
    BatchAttention attention(step.mods, step.config());
    step.plan(attention);
    for (size_t b = 0; b < c.seqs.size(); ++b) {
      const Seq &s = c.seqs[b];
      EXPECT_EQ(attention.keyBegin(b), s.qLen > 0 ? windowKeyBegin(s) : 0) << "sequence " << b;
      EXPECT_EQ(attention.keyEnd(b), s.seqLen) << "sequence " << b;
    }
    EXPECT_EQ(attention.keyBegin(0), 1856); // 1999 - 99 = 1900, in the granule from 1856
    EXPECT_THROW(attention.keyBegin(static_cast<int64_t>(c.seqs.size())), Error);
  }
  StepCheck check = checkStep(c);
  EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0) << check.describe();
}

TEST(BatchAttention, ClassifierBoundsOnlyWhatItCanAtPlan) {
  const std::vector<Seq> seqs = {{1, 900}, {20, 400}, {0, 30}};
  auto begins = [&](const char *mask) {
    StepCase c;
    c.seqs = seqs;
    c.mask = mask;
    testutil::BatchStep step(c);
    BatchAttention attention(step.mods, step.config());
    step.plan(attention);
    std::vector<int32_t> out;
    for (size_t b = 0; b < seqs.size(); ++b)
      out.push_back(attention.keyBegin(b));
    return out;
  };
  // Causal keeps key 0 for every row: nothing moves.
  EXPECT_EQ(begins("causal"), (std::vector<int32_t>{0, 0, 0}));
  // The param window is bound only at run(): no classifier at plan().
  EXPECT_EQ(begins("sliding"), (std::vector<int32_t>{0, 0, 0}));
  // A mask that keeps nothing leaves its sequences no key (the one with no
  // new tokens keeps its kv_start).
  EXPECT_EQ(begins("never"), (std::vector<int32_t>{900, 400, 0}));
  StepCase c;
  c.seqs = seqs;
  c.mask = "never";
  StepCheck check = checkStep(c);
  EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0) << check.describe();
}

TEST(KeyBounds, MatchWhatABruteForceFindsOverTheGranules) {
  // For random rows and key ranges under causal and the fixed window, the
  // bounds are the tightest granules every key outside of which is masked
  // for every row (the test mods' classifiers are exact).
  std::mt19937 rng(7);
  for (const char *mask : {"causal", "window", "never"}) {
    const CompiledMods mods = testutil::makeTestMods(mask, "");
    ASSERT_TRUE(detail::classifiesAtPlan(mods)) << mask;
    auto keptByAny = [&](int32_t qLo, int32_t qHi, int32_t kv) {
      for (int32_t q = qLo; q <= qHi; ++q)
        if (mods.maskReference(PagedcModContext{nullptr, nullptr}, 0, 0, q, kv))
          return true;
      return false;
    };
    for (int trial = 0; trial < 300; ++trial) {
      const int32_t to = std::uniform_int_distribution<int32_t>(0, 700)(rng);
      const int32_t from = std::uniform_int_distribution<int32_t>(0, to)(rng);
      const int32_t qHi = std::uniform_int_distribution<int32_t>(0, 800)(rng);
      const int32_t qLo = std::max(0, qHi - std::uniform_int_distribution<int32_t>(0, 70)(rng));
      // First key: the largest from + k granules (or `to`) below which no
      // key is kept.
      int32_t first = from;
      for (int32_t k = 1; from + k * detail::kKeyGranule <= to; ++k) {
        bool none = true;
        for (int32_t kv = from; kv < from + k * detail::kKeyGranule && none; ++kv)
          none = !keptByAny(qLo, qHi, kv);
        if (none)
          first = from + k * detail::kKeyGranule;
      }
      bool anyKept = false;
      for (int32_t kv = from; kv < to && !anyKept; ++kv)
        anyKept = keptByAny(qLo, qHi, kv);
      if (!anyKept)
        first = to;
      EXPECT_EQ(detail::firstKeyKept(mods, 0, qLo, qHi, from, to), first)
          << mask << " rows [" << qLo << ", " << qHi << "] keys [" << from << ", " << to << ")";
      // End: the smallest granule start above `from` (or `to`) from which on
      // no key is kept; `from` when none is.
      int32_t end = to;
      if (!anyKept) {
        end = from;
      } else {
        for (int32_t e = (to - 1) / detail::kKeyGranule * detail::kKeyGranule; e > from;
             e -= detail::kKeyGranule) {
          bool none = true;
          for (int32_t kv = e; kv < to && none; ++kv)
            none = !keptByAny(qLo, qHi, kv);
          if (!none)
            break;
          end = e;
        }
      }
      EXPECT_EQ(detail::endOfKeysKept(mods, 0, qLo, qHi, from, to), end)
          << mask << " rows [" << qLo << ", " << qHi << "] keys [" << from << ", " << to << ")";
    }
  }
}

TEST(BatchAttention, Float8CachesMatchFloat64OnDequantizedValues) {
  // Both formats, per-head and per-tensor scales, native 8-bit and u8 +
  // kv_dtype tensors, pages 1 / 16 / 128, GQA 1 and 4; the long decodes with
  // 2 threads split their keys.
  struct Case {
    DType type;
    bool perHead, asU8;
    int32_t pageSize;
    int64_t kvHeads;
    KVLayout layout;
  };
  const Case cases[] = {
      {DType::F8E4M3, true, false, 16, 2, KVLayout::NHD},
      {DType::F8E4M3, false, true, 1, 8, KVLayout::HND},
      {DType::F8E5M2, true, true, 128, 2, KVLayout::VLLM},
      {DType::F8E5M2, false, false, 16, 8, KVLayout::Pagedc},
  };
  uint64_t seed = 300;
  for (const Case &k : cases) {
    StepCase c;
    c.seqs = {{1, 700}, {3, 400}, {37, 300}, {61, 61}, {0, 12}, {1, 1500}};
    c.kvFloat8 = k.type;
    c.perHeadScale = k.perHead;
    c.asU8 = k.asU8;
    c.pageSize = k.pageSize;
    c.kvHeads = k.kvHeads;
    c.layout = k.layout;
    c.mask = "holes";
    c.score = "alibi";
    c.seed = ++seed;
    StepCheck check = checkStep(c);
    SCOPED_TRACE(std::string(dtypeName(k.type)) + (k.perHead ? " per-head" : " per-tensor") +
                 (k.asU8 ? " u8" : "") + " page " + std::to_string(k.pageSize));
    EXPECT_EQ(check.outViolations + check.lseViolations + check.nonFinite, 0)
        << check.describe();
    EXPECT_GT(check.maskedRows, 0);
  }
}

TEST(BatchAttention, EmptyStep) {
  StepCase c;
  c.seqs = {{0, 5}, {0, 0}};
  StepCheck check = checkStep(c);
  EXPECT_EQ(check.rows, 0);
}

TEST(BatchAttention, SharedPrefixAndSuffixPlansMergeToTheWhole) {
  // Eight sequences share a 96-token prefix on the same pages (as fork()
  // leaves them) and have suffixes of their own; each brings 1 to 40 new
  // tokens. A plan over keys [0, 96) and one over [96, seq_len), merged,
  // equal the plan over all keys.
  std::mt19937 rng(5);
  const int64_t heads = 4, kvHeads = 2, dim = 64, pageSize = 16, prefix = 96, seqs = 8;
  const int64_t prefixPages = prefix / pageSize, columns = 12;
  EngineCache cache(KVLayout::HND, prefixPages + seqs * 6, pageSize, kvHeads, dim, dim,
                    DType::F32);
  std::vector<int32_t> table(seqs * columns, -1), qsl{0}, lens;
  for (int64_t b = 0; b < seqs; ++b) {
    const int32_t own = 1 + static_cast<int32_t>(rng() % 80), newTokens = 1 + (b * 13) % 40;
    lens.push_back(static_cast<int32_t>(prefix) + own);
    qsl.push_back(qsl.back() + std::min(newTokens, own));
    for (int64_t j = 0; j < (lens.back() + pageSize - 1) / pageSize; ++j)
      table[b * columns + j] =
          static_cast<int32_t>(j < prefixPages ? j : prefixPages + b * 6 + (j - prefixPages));
  }
  for (int64_t page = 0; page < cache.pages; ++page)
    for (int64_t slot = 0; slot < pageSize; ++slot)
      for (int64_t h = 0; h < kvHeads; ++h)
        for (int64_t d = 0; d < dim; ++d)
          for (int part : {0, 1})
            cache.set(part, page, slot, h, d, randomValue(rng));
  const int64_t tokens = qsl.back();
  HostTensor q(DType::F32, {tokens, heads, dim});
  for (int64_t i = 0; i < q.numel(); ++i)
    q.dataAs<float>()[i] = randomValue(rng);

  BatchAttentionConfig config;
  config.numQHeads = heads;
  config.numKVHeads = kvHeads;
  config.headDim = dim;
  config.pageSize = pageSize;
  config.layout = KVLayout::HND;
  config.maxNumSeqs = seqs;
  config.maxNumTokens = tokens;
  config.maxBlocksPerSeq = columns;
  CompiledMods mods = testutil::makeTestMods("causal", "alibi");
  ModBindings modBindings(seqs, heads, 256, rng);
  std::vector<int32_t> prefixEnd(seqs, static_cast<int32_t>(prefix));
  TensorView qslView(qsl.data(), DType::I32, {seqs + 1});
  TensorView lensView(lens.data(), DType::I32, {seqs});
  TensorView tableView(table.data(), DType::I32, {seqs, columns});
  TensorView prefixView(prefixEnd.data(), DType::I32, {seqs});
  BatchRunOptions withLse;
  withLse.returnLse = true;

  BatchAttention whole(mods, config), shared(mods, config), own(mods, config);
  whole.plan(qslView, lensView, tableView);
  shared.plan(qslView, lensView, tableView, {}, prefixView);
  own.plan(qslView, lensView, tableView, prefixView, {});
  // With sinks, one part of the keys (here the sequence's own) carries them
  // and the merge equals the whole with them.
  std::vector<float> sinks = {2.0f, 9.0f, -std::numeric_limits<float>::infinity(), -1.0f};
  std::vector<float> plainLse;
  for (bool withSinks : {false, true}) {
    SCOPED_TRACE(withSinks ? "with sinks" : "without sinks");
    BatchRunOptions sunk = withLse;
    if (withSinks)
      sunk.sinks = TensorView(sinks.data(), DType::F32, {heads});
    AttentionResult all =
        whole.run(q.view(), cache.kView(), cache.vView(), modBindings.bindings, sunk);
    AttentionResult a =
        shared.run(q.view(), cache.kView(), cache.vView(), modBindings.bindings, withLse);
    AttentionResult b = own.run(q.view(), cache.kView(), cache.vView(), modBindings.bindings, sunk);
    mergeStateInPlace(a.out, a.lse, b.out, b.lse);
    double maxError = 0, maxLseError = 0;
    for (int64_t i = 0; i < all.out.numel(); ++i)
      maxError = std::max(maxError,
                          double(std::abs(a.out.dataAs<float>()[i] - all.out.dataAs<float>()[i])));
    for (int64_t i = 0; i < all.lse.numel(); ++i)
      maxLseError = std::max(
          maxLseError, double(std::abs(a.lse.dataAs<float>()[i] - all.lse.dataAs<float>()[i])));
    EXPECT_LE(maxError, 1e-5);
    EXPECT_LE(maxLseError, 1e-5);
    // The sinks count once: lse is the plain one merged with sinks[h].
    const float *lse = all.lse.dataAs<float>();
    if (!withSinks) {
      plainLse.assign(lse, lse + all.lse.numel());
      continue;
    }
    double maxSinkError = 0;
    for (int64_t i = 0; i < all.lse.numel(); ++i) {
      const double plain = plainLse[i], sink = sinks[i % heads];
      const double expected =
          std::isinf(sink) ? plain
                           : std::max(plain, sink) + std::log1p(std::exp(-std::abs(plain - sink)));
      maxSinkError = std::max(maxSinkError, std::abs(lse[i] - expected));
    }
    EXPECT_LE(maxSinkError, 1e-5);
  }

  // Key ranges outside [0, seq_len] are refused, naming the sequence.
  std::vector<int32_t> tooFar(seqs, lens[0] + 1);
  try {
    own.plan(qslView, lensView, tableView, {}, TensorView(tooFar.data(), DType::I32, {seqs}));
    ADD_FAILURE() << "no error";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("sequence 0 reads keys [kv_start, kv_end)"),
              std::string::npos)
        << error.what();
  }
}

//===----------------------------------------------------------------------===//
// Bad arguments
//===----------------------------------------------------------------------===//

class BatchAttentionErrors : public ::testing::Test {
protected:
  void SetUp() override {
    config.numQHeads = 4;
    config.numKVHeads = 2;
    config.headDim = 16;
    config.pageSize = 4;
    config.layout = KVLayout::NHD;
    config.maxNumSeqs = 3;
    config.maxNumTokens = 10;
    config.maxBlocksPerSeq = 4;
    k = HostTensor(DType::F32, {8, 4, 2, 16});
    v = HostTensor(DType::F32, {8, 4, 2, 16});
    q = HostTensor(DType::F32, {6, 4, 16});
  }
  /// Expects `call` to throw pagedc::Error whose message contains `needle`.
  template <typename F> void expectError(F call, const std::string &needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "message: " << error.what() << "\nexpected: " << needle;
    }
  }
  void plan(BatchAttention &attention, std::vector<int32_t> qsl, std::vector<int32_t> lens,
            std::vector<int32_t> table, int64_t columns) {
    attention.plan(TensorView(qsl.data(), DType::I32, {static_cast<int64_t>(qsl.size())}),
                   TensorView(lens.data(), DType::I32, {static_cast<int64_t>(lens.size())}),
                   TensorView(table.data(), DType::I32,
                              {static_cast<int64_t>(table.size()) / columns, columns}));
  }
  BatchAttentionConfig config;
  CompiledMods mods;
  HostTensor k, v, q;
};

TEST_F(BatchAttentionErrors, PlanRefusesBadMetadataAndKeepsThePreviousPlan) {
  BatchAttention attention(mods, config);
  expectError([&] { attention.run(q.view(), k.view(), v.view(), {}); }, "needs a plan");
  plan(attention, {0, 1, 6}, {3, 9}, {0, 1, -1, -1, 2, 3, 4, -1}, 4);
  ASSERT_EQ(attention.numTokens(), 6);
  expectError([&] { plan(attention, {0, 3, 2}, {3, 9}, {0, 1, 2, 3, 4, 5, 6, 7}, 4); },
              "query_start_loc decreases at index 2");
  expectError([&] { plan(attention, {1, 3}, {3}, {0, 1, 2, 3}, 4); }, "query_start_loc[0]");
  expectError([&] { plan(attention, {0, 4}, {3}, {0, 1, 2, 3}, 4); },
              "seq_lens[0] = 3 is less than the sequence's 4 new tokens");
  expectError([&] { plan(attention, {0, 1}, {17}, {0, 1, 2, 3}, 4); }, "max_blocks_per_seq");
  expectError([&] { plan(attention, {0, 1}, {9}, {0, 1}, 2); }, "block_table has 2 columns");
  expectError([&] { plan(attention, {0, 1}, {9}, {0, -1, 2, 3}, 4); },
              "block_table[0, 1] = -1");
  expectError([&] { plan(attention, {0, 11}, {11}, {0, 1, 2, 3}, 4); }, "max_num_tokens");
  expectError([&] { plan(attention, {0, 1, 2, 3, 4}, {1, 1, 1, 1}, std::vector<int32_t>(16, 0), 4); },
              "max_num_seqs");
  expectError([&] { plan(attention, {0, 1}, {1, 2}, {0, 1, 2, 3}, 4); }, "seq_lens has 2");
  std::vector<int64_t> wide{0, 1};
  expectError(
      [&] {
        std::vector<int32_t> lens{1}, table{0, 0, 0, 0};
        attention.plan(TensorView(wide.data(), DType::I64, {2}),
                       TensorView(lens.data(), DType::I32, {1}),
                       TensorView(table.data(), DType::I32, {1, 4}));
      },
      "query_start_loc must be int32");
  EXPECT_EQ(attention.numTokens(), 6);
  EXPECT_EQ(attention.numSeqs(), 2);
}

TEST_F(BatchAttentionErrors, RunRefusesBadTensorsAndWritesNothing) {
  BatchAttention attention(mods, config);
  plan(attention, {0, 1, 6}, {3, 9}, {0, 1, -1, -1, 2, 3, 7, -1}, 4);
  HostTensor out = nanTensor(DType::F32, {6, 4, 16});
  BatchRunOptions options;
  options.out = out.view();
  auto untouched = [&] {
    for (int64_t i = 0; i < out.numel(); ++i)
      if (!std::isnan(out.dataAs<float>()[i]))
        return false;
    return true;
  };
  HostTensor smallPool(DType::F32, {7, 4, 2, 16});
  expectError([&] { attention.run(q.view(), smallPool.view(), smallPool.view(), {}, options); },
              "block_table holds page 7 but the cache has 7 pages");
  HostTensor hnd(DType::F32, {8, 2, 4, 16});
  expectError([&] { attention.run(q.view(), hnd.view(), v.view(), {}, options); },
              "k_cache must be [pages, page_size, Hkv, D]");
  HostTensor bf(DType::BF16, {8, 4, 2, 16});
  EXPECT_NO_THROW(attention.run(q.view(), bf.view(), v.view(), {}, {}));
  HostTensor i32(DType::I32, {8, 4, 2, 16});
  expectError([&] { attention.run(q.view(), i32.view(), v.view(), {}, options); },
              "k_cache stores i32");
  HostTensor shortQ(DType::F32, {5, 4, 16});
  expectError([&] { attention.run(shortQ.view(), k.view(), v.view(), {}, options); },
              "q has 5 token rows but the plan has 6 tokens");
  HostTensor wrongHeads(DType::F32, {6, 2, 16});
  expectError([&] { attention.run(wrongHeads.view(), k.view(), v.view(), {}, options); },
              "q must be [T, 4, 16]");
  HostTensor smallOut(DType::F32, {5, 4, 16});
  BatchRunOptions bad;
  bad.out = smallOut.view();
  expectError([&] { attention.run(q.view(), k.view(), v.view(), {}, bad); },
              "out must be [6, 4, 16]");
  HostTensor badLse(DType::F32, {6, 3});
  bad = options;
  bad.lse = badLse.view();
  expectError([&] { attention.run(q.view(), k.view(), v.view(), {}, bad); },
              "lse must be [6, 4]");
  expectError([&] { attention.run(q.view(), k.view(), TensorView(), {}, options); },
              "v_cache is required");
  HostTensor fewerPages(DType::F32, {9, 4, 2, 16});
  expectError([&] { attention.run(q.view(), k.view(), fewerPages.view(), {}, options); },
              "k_cache has 8 pages but v_cache has 9");
  std::vector<float> sinkValues(8, 1.0f);
  std::vector<uint16_t> sinkHalves(4, 0);
  const std::pair<TensorView, const char *> badSinks[] = {
      {TensorView(sinkValues.data(), DType::F32, {5}), "sinks must be [Hq] = [4]"},
      {TensorView(sinkHalves.data(), DType::BF16, {4}), "sinks is bf16 but must be f32"},
      {TensorView(sinkValues.data(), DType::F32, {4}, {2}, Device::cpu()),
       "sinks must be contiguous"},
      {TensorView(sinkValues.data(), DType::F32, {4}, {1}, Device::cuda(0)),
       "sinks is on cuda:0 but the call runs on cpu"},
  };
  for (const auto &[sinks, message] : badSinks) {
    bad = options;
    bad.sinks = sinks;
    expectError([&] { attention.run(q.view(), k.view(), v.view(), {}, bad); }, message);
  }
  EXPECT_TRUE(untouched());
}

TEST_F(BatchAttentionErrors, ConfigurationAndLayoutNames) {
  BatchAttentionConfig c = config;
  c.numQHeads = 3;
  expectError([&] { BatchAttention(mods, c); }, "num_q_heads 3 is not a multiple");
  c = config;
  c.maxNumTokens = 0;
  expectError([&] { BatchAttention(mods, c); }, "max_num_tokens must be at least 1");
  c = config;
  c.layout = KVLayout::VLLM;
  c.valueHeadDim = 8;
  expectError([&] { BatchAttention(mods, c); }, "value_head_dim 8 must equal head_dim 16");
  c = config;
  c.device = Device::cuda(0);
  expectError([&] { BatchAttention(mods, c); },
              "head_dim on CUDA must be one of the multiples of 16 from 32 to 256");
  EXPECT_EQ(parseKVLayout("nhd"), KVLayout::NHD);
  EXPECT_EQ(parseKVLayout("vLLM"), KVLayout::VLLM);
  expectError([] { parseKVLayout("NDH"); }, "valid layouts: NHD, HND, vllm, pagedc");
  // The combined vLLM tensor comes alone.
  c = config;
  c.layout = KVLayout::VLLM;
  BatchAttention attention(mods, c);
  plan(attention, {0, 1}, {3}, {0, 0, 0, 0}, 4);
  HostTensor combined(DType::F32, {2, 8, 4, 2, 16});
  expectError([&] { attention.run(q.view(), combined.view(), v.view(), {}); },
              "v_cache must be empty");
  EXPECT_NO_THROW(attention.run(q.view(), combined.view(), TensorView(), {}));
}

//===----------------------------------------------------------------------===//
// merge_state
//===----------------------------------------------------------------------===//

TEST(MergeState, TwoHalvesOfTheKeysEqualTheWhole) {
  // The CPU kernel computes attention over keys [0, split) and, with
  // kvBegin, over [split, L); their merge must equal the float64 attention
  // over [0, L).
  std::mt19937 rng(7);
  const int64_t heads = 4, kvHeads = 2, dim = 32, tokens = 5, length = 300;
  HostTensor q(DType::F32, {1, heads, tokens, dim});
  HostTensor k(DType::F32, {1, kvHeads, length, dim});
  HostTensor v(DType::F32, {1, kvHeads, length, dim});
  for (HostTensor *t : {&q, &k, &v})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->dataAs<float>()[i] = randomValue(rng);
  const int32_t fullLength = static_cast<int32_t>(length);
  cpu::PagedCache cache = cpu::buildPagedCache(k.view(), v.view(), &fullLength, 16, DType::F32, 3);
  const int32_t qOffset = fullLength - static_cast<int32_t>(tokens);
  CompiledMods mods = testutil::makeTestMods("", "alibi");
  ModBindings modBindings(1, heads, length, rng);
  ResolvedBindings resolved = resolveBindings(mods, modBindings.bindings, Device::cpu());

  cpu::ReferenceArgs ref;
  ref.q = q.view();
  ref.k = k.view();
  ref.v = v.view();
  ref.qOffset = &qOffset;
  ref.mods = &mods;
  ref.context = &resolved.context();
  ref.scale = 1.0 / std::sqrt(static_cast<double>(dim));
  cpu::ReferenceResult whole = cpu::referenceAttention(ref);

  for (int32_t split : {1, 64, 100, 299}) {
    // Parts as [T, H, D] / [T, H], written through [1, H, T, *] views.
    HostTensor va(DType::F32, {tokens, heads, dim}), vb(DType::F32, {tokens, heads, dim});
    HostTensor sa(DType::F32, {tokens, heads}), sb(DType::F32, {tokens, heads});
    auto part = [&](HostTensor &vOut, HostTensor &sOut, int32_t begin, int32_t end) {
      cpu::PagedAttentionArgs args;
      args.q = q.view();
      args.kCache = cache.kCache.view();
      args.vCache = cache.vCache.view();
      args.pageTable = cache.pageTable.data();
      args.pageTableStride = cache.pageTableStride;
      args.pageSize = cache.pageSize;
      args.kvLength = &end;
      args.kvBegin = &begin;
      args.qOffset = &qOffset;
      args.mods = &mods;
      args.context = &resolved.context();
      args.scale = static_cast<float>(ref.scale);
      args.out = TensorView(vOut.data(), DType::F32, {1, heads, tokens, dim},
                            {0, dim, heads * dim, 1}, Device::cpu());
      args.lse = TensorView(sOut.data(), DType::F32, {1, heads, tokens}, {0, 1, heads},
                            Device::cpu());
      args.threads = 2;
      cpu::pagedAttention(args);
    };
    part(va, sa, 0, split);
    part(vb, sb, split, fullLength);
    AttentionResult merged = mergeState(va.view(), sa.view(), vb.view(), sb.view());
    double maxError = 0, maxLseError = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        maxLseError = std::max(maxLseError, std::abs(merged.lse.dataAs<float>()[t * heads + h] -
                                                     whole.lseAt(0, h, t)));
        for (int64_t d = 0; d < dim; ++d)
          maxError = std::max(maxError,
                              std::abs(merged.out.dataAs<float>()[(t * heads + h) * dim + d] -
                                       whole.outAt(0, h, t, d)));
      }
    EXPECT_LE(maxError, 1e-5) << "split " << split;
    EXPECT_LE(maxLseError, 1e-5) << "split " << split;

    // In place gives the same bits.
    mergeStateInPlace(va.view(), sa.view(), vb.view(), sb.view());
    for (int64_t i = 0; i < va.numel(); ++i)
      ASSERT_EQ(va.dataAs<float>()[i], merged.out.dataAs<float>()[i]);
  }
}

TEST(MergeState, EmptyPartsAndNWay) {
  const int64_t tokens = 2, heads = 1, dim = 2;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> va{1, 2, 3, 4}, sa{-inf, 0.5f}, vb{5, 6, 7, 8}, sb{-inf, -inf};
  AttentionResult r = mergeState(TensorView(va.data(), DType::F32, {tokens, heads, dim}),
                                 TensorView(sa.data(), DType::F32, {tokens, heads}),
                                 TensorView(vb.data(), DType::F32, {tokens, heads, dim}),
                                 TensorView(sb.data(), DType::F32, {tokens, heads}));
  EXPECT_EQ(r.out.dataAs<float>()[0], 0.0f); // both parts empty
  EXPECT_EQ(r.out.dataAs<float>()[1], 0.0f);
  EXPECT_EQ(r.lse.dataAs<float>()[0], -inf);
  EXPECT_EQ(r.out.dataAs<float>()[2], 3.0f); // only part a
  EXPECT_EQ(r.lse.dataAs<float>()[1], 0.5f);

  // Three parts of weights e^0, e^1, e^2.
  std::vector<float> v{1, 0, 0, 1, 2, 2}, s{0, 1, 2}, vOut(2), sOut(1);
  mergeStates(TensorView(v.data(), DType::F32, {1, 3, 1, 2}),
              TensorView(s.data(), DType::F32, {1, 3, 1}),
              TensorView(vOut.data(), DType::F32, {1, 1, 2}),
              TensorView(sOut.data(), DType::F32, {1, 1}));
  double z = 1 + std::exp(1.0) + std::exp(2.0);
  EXPECT_NEAR(vOut[0], (1 + 2 * std::exp(2.0)) / z, 1e-6);
  EXPECT_NEAR(vOut[1], (std::exp(1.0) + 2 * std::exp(2.0)) / z, 1e-6);
  EXPECT_NEAR(sOut[0], std::log(z), 1e-6);

  // Bad shapes name the argument; nothing is written.
  std::vector<float> sShort{0};
  std::vector<float> before = vOut;
  try {
    mergeState(TensorView(va.data(), DType::F32, {tokens, heads, dim}),
               TensorView(sShort.data(), DType::F32, {1, 1}),
               TensorView(vb.data(), DType::F32, {tokens, heads, dim}),
               TensorView(sb.data(), DType::F32, {tokens, heads}),
               TensorView(vOut.data(), DType::F32, {tokens, heads, dim}),
               TensorView(sOut.data(), DType::F32, {tokens, heads}));
    ADD_FAILURE() << "no error";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("s_a must be [2, 1]"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(vOut, before);
}

} // namespace
