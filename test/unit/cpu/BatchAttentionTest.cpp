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
#include "TestMods.h"
#include "cpu/CpuAttention.h"
#include "cpu/Reference.h"

#include "pagedc/BatchAttention.h"
#include "pagedc/Error.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>

namespace {

using namespace pagedc;

struct Seq {
  int32_t qLen, seqLen;
};

/// A step and how it is stored.
struct StepCase {
  std::vector<Seq> seqs;
  int64_t qHeads = 8, kvHeads = 2, dim = 64, vDim = 64;
  int32_t pageSize = 16;
  KVLayout layout = KVLayout::NHD;
  DType storage = DType::F32;
  DType outType = DType::F32;
  /// 8-bit float K/V (F8E4M3, F8E5M2): stored as codes with per-head scales
  /// (one shared scale when perHeadScale is false); q stays `storage`. The
  /// cache tensors are u8 read through kvDtype when asU8.
  std::optional<DType> kvFloat8;
  bool perHeadScale = true;
  bool asU8 = false;
  std::string mask, score;
  int threads = 2;
  uint64_t seed = 1;
};

float randomValue(std::mt19937 &rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  float value = uniform(rng);
  return value == 0.0f ? 0.5f : value;
}

void storeAs(HostTensor &tensor, int64_t offset, float value) {
  if (isFloat8(tensor.dtype()))
    tensor.dataAs<uint8_t>()[offset] = floatToFloat8(value, tensor.dtype());
  else if (tensor.dtype() == DType::BF16)
    tensor.dataAs<uint16_t>()[offset] = floatToBF16(value);
  else
    tensor.dataAs<float>()[offset] = value;
}

float roundTo(DType type, float value) {
  return type == DType::BF16 ? bf16ToFloat(floatToBF16(value)) : value;
}

HostTensor nanTensor(DType type, std::vector<int64_t> shape) {
  HostTensor tensor(type, std::move(shape));
  for (int64_t i = 0; i < tensor.numel(); ++i)
    storeAs(tensor, i, std::numeric_limits<float>::quiet_NaN());
  return tensor;
}

/// The engine's cache: one allocation per tensor the layout has, every slot
/// NaN until a sequence's key or value is written there.
struct EngineCache {
  KVLayout layout;
  int64_t pages, pageSize, heads, dim, vDim;
  HostTensor k, v; // v unused for KVLayout::VLLM

  EngineCache(KVLayout layout, int64_t pages, int64_t pageSize, int64_t heads, int64_t dim,
              int64_t vDim, DType type)
      : layout(layout), pages(pages), pageSize(pageSize), heads(heads), dim(dim), vDim(vDim) {
    k = nanTensor(type, shape(0));
    if (layout != KVLayout::VLLM)
      v = nanTensor(type, shape(1));
  }
  std::vector<int64_t> shape(int part) const {
    int64_t width = part == 0 ? dim : vDim;
    switch (layout) {
    case KVLayout::Pagedc: return {heads, pages, pageSize, width};
    case KVLayout::NHD: return {pages, pageSize, heads, width};
    case KVLayout::HND: return {pages, heads, pageSize, width};
    case KVLayout::VLLM: return {2, pages, pageSize, heads, width};
    }
    return {};
  }
  /// Writes element d of the key (part 0) or value (part 1) of `head` at
  /// `slot` of `page`.
  void set(int part, int64_t page, int64_t slot, int64_t head, int64_t d, float value) {
    int64_t width = part == 0 ? dim : vDim;
    int64_t offset = 0;
    switch (layout) {
    case KVLayout::Pagedc: offset = ((head * pages + page) * pageSize + slot) * width + d; break;
    case KVLayout::NHD: offset = ((page * pageSize + slot) * heads + head) * width + d; break;
    case KVLayout::HND: offset = ((page * heads + head) * pageSize + slot) * width + d; break;
    case KVLayout::VLLM:
      offset = (((part * pages + page) * pageSize + slot) * heads + head) * width + d;
      break;
    }
    storeAs(layout == KVLayout::VLLM || part == 0 ? k : v, offset, value);
  }
  TensorView kView() { return k.view(); }
  TensorView vView() { return layout == KVLayout::VLLM ? TensorView() : v.view(); }
};

/// Bindings of the test mods' declarations (TestMods.h), per sequence.
struct ModBindings {
  std::vector<int32_t> documents; // [B, S]
  std::vector<float> slopes;      // [Hq]
  Bindings bindings;
  ModBindings(int64_t batch, int64_t heads, int64_t length, std::mt19937 &rng) {
    std::uniform_int_distribution<int32_t> run(1, 48);
    documents.resize(std::max<int64_t>(1, batch * length));
    for (int64_t b = 0; b < batch; ++b) {
      int32_t id = 0;
      for (int64_t position = 0; position < length; ++id)
        for (int32_t i = 0, n = run(rng); i < n && position < length; ++i)
          documents[b * length + position++] = id;
    }
    for (int64_t h = 0; h < heads; ++h)
      slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(heads)));
    bindings.buffers["doc"] = TensorView(documents.data(), DType::I32, {batch, length});
    bindings.buffers["slopes"] = TensorView(slopes.data(), DType::F32, {heads});
    bindings.params["window"] = ParamValue::ofI32(37);
    bindings.params["temperature"] = ParamValue::ofF32(1.5f);
    bindings.params["softcap"] = ParamValue::ofF32(2.0f);
  }
};

struct StepCheck {
  int64_t rows = 0, maskedRows = 0, outViolations = 0, lseViolations = 0, nonFinite = 0;
  double maxOutError = 0, maxLseError = 0;
  std::string describe() const {
    return "rows " + std::to_string(rows) + ", fully masked " + std::to_string(maskedRows) +
           ", out violations " + std::to_string(outViolations) + " (max err " +
           std::to_string(maxOutError) + "), lse violations " + std::to_string(lseViolations) +
           " (max err " + std::to_string(maxLseError) + "), non-finite " +
           std::to_string(nonFinite);
  }
};

/// Runs one step through BatchAttention and the float64 reference.
StepCheck checkStep(const StepCase &c) {
  std::mt19937 rng(static_cast<uint32_t>(c.seed));
  const int64_t batch = static_cast<int64_t>(c.seqs.size());
  int64_t maxQ = 1, maxKv = 1, totalPages = 3, tokens = 0;
  for (const Seq &s : c.seqs) {
    maxQ = std::max<int64_t>(maxQ, s.qLen);
    maxKv = std::max<int64_t>(maxKv, s.seqLen);
    totalPages += (s.seqLen + c.pageSize - 1) / c.pageSize;
    tokens += s.qLen;
  }

  // Dense logical inputs (rounded to the storage type, which the reference
  // reads too), the packed q, and the cache on shuffled pages.
  HostTensor q4(DType::F64, {batch, c.qHeads, maxQ, c.dim});
  HostTensor k4(DType::F64, {batch, c.kvHeads, maxKv, c.dim});
  HostTensor v4(DType::F64, {batch, c.kvHeads, maxKv, c.vDim});
  for (HostTensor *t : {&q4, &k4, &v4})
    for (int64_t i = 0; i < t->numel(); ++i)
      t->dataAs<double>()[i] = roundTo(c.storage, randomValue(rng));
  // 8-bit K/V: each value becomes what its code means (code * scale), which
  // is what the reference reads; scales differ per head and are not powers
  // of two, so the scale is really applied.
  std::vector<float> kScale, vScale;
  if (c.kvFloat8) {
    for (int64_t h = 0; h < c.kvHeads; ++h) {
      kScale.push_back(c.perHeadScale ? 0.0137f * static_cast<float>(h + 1) : 0.0211f);
      vScale.push_back(c.perHeadScale ? 0.0093f * static_cast<float>(h + 2) : 0.0173f);
    }
    for (auto [t, scale] : {std::pair{&k4, &kScale}, std::pair{&v4, &vScale}}) {
      const int64_t perHead = t->numel() / (batch * c.kvHeads);
      for (int64_t i = 0; i < t->numel(); ++i) {
        const float factor = (*scale)[(i / perHead) % c.kvHeads];
        const uint8_t code =
            floatToFloat8(static_cast<float>(t->dataAs<double>()[i]) / factor, *c.kvFloat8);
        t->dataAs<double>()[i] = static_cast<double>(float8ToFloat(code, *c.kvFloat8)) * factor;
      }
    }
  }
  const DType cacheType = c.kvFloat8 ? *c.kvFloat8 : c.storage;
  std::vector<int32_t> pageOrder(static_cast<size_t>(totalPages));
  std::iota(pageOrder.begin(), pageOrder.end(), 0);
  std::shuffle(pageOrder.begin(), pageOrder.end(), rng);
  EngineCache cache(c.layout, totalPages, c.pageSize, c.kvHeads, c.dim, c.vDim, cacheType);
  int64_t columns = 1;
  for (const Seq &s : c.seqs)
    columns = std::max<int64_t>(columns, (s.seqLen + c.pageSize - 1) / c.pageSize + 1);
  std::vector<int32_t> blockTable(static_cast<size_t>(batch * columns), -1);
  std::vector<int32_t> queryStartLoc{0}, seqLens, kvLength, qOffset;
  HostTensor q(c.storage, {std::max<int64_t>(tokens, 1), c.qHeads, c.dim});
  size_t nextPage = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const Seq &s = c.seqs[b];
    for (int64_t j = 0; j < (s.seqLen + c.pageSize - 1) / c.pageSize; ++j)
      blockTable[b * columns + j] = pageOrder[nextPage++];
    for (int64_t pos = 0; pos < s.seqLen; ++pos)
      for (int64_t h = 0; h < c.kvHeads; ++h) {
        int64_t page = blockTable[b * columns + pos / c.pageSize], slot = pos % c.pageSize;
        for (int64_t d = 0; d < c.dim; ++d)
          cache.set(0, page, slot, h, d,
                    static_cast<float>(k4.dataAs<double>()[((b * c.kvHeads + h) * maxKv + pos) *
                                                               c.dim + d]) /
                        (c.kvFloat8 ? kScale[h] : 1.0f));
        for (int64_t d = 0; d < c.vDim; ++d)
          cache.set(1, page, slot, h, d,
                    static_cast<float>(v4.dataAs<double>()[((b * c.kvHeads + h) * maxKv + pos) *
                                                               c.vDim + d]) /
                        (c.kvFloat8 ? vScale[h] : 1.0f));
      }
    for (int64_t i = 0; i < s.qLen; ++i)
      for (int64_t h = 0; h < c.qHeads; ++h)
        for (int64_t d = 0; d < c.dim; ++d)
          storeAs(q, ((queryStartLoc.back() + i) * c.qHeads + h) * c.dim + d,
                  static_cast<float>(
                      q4.dataAs<double>()[((b * c.qHeads + h) * maxQ + i) * c.dim + d]));
    queryStartLoc.push_back(queryStartLoc.back() + s.qLen);
    seqLens.push_back(s.seqLen);
    kvLength.push_back(s.seqLen);
    qOffset.push_back(s.seqLen - s.qLen);
  }

  CompiledMods mods = testutil::makeTestMods(c.mask, c.score);
  ModBindings modBindings(batch, c.qHeads, maxKv, rng);
  BatchAttentionConfig config;
  config.numQHeads = c.qHeads;
  config.numKVHeads = c.kvHeads;
  config.headDim = c.dim;
  config.valueHeadDim = c.vDim;
  config.pageSize = c.pageSize;
  config.layout = c.layout;
  config.maxNumSeqs = batch + 2;
  config.maxNumTokens = tokens + 5;
  config.maxBlocksPerSeq = columns;
  config.threads = c.threads;
  BatchAttention attention(mods, config);
  attention.plan(TensorView(queryStartLoc.data(), DType::I32, {batch + 1}),
                 TensorView(seqLens.data(), DType::I32, {batch}),
                 TensorView(blockTable.data(), DType::I32, {batch, columns}));

  HostTensor out = nanTensor(c.outType, {q.shape()[0], c.qHeads, c.vDim});
  HostTensor lse = nanTensor(DType::F32, {q.shape()[0], c.qHeads});
  const void *kData = cache.k.data();
  BatchRunOptions options;
  options.out = out.view();
  options.lse = lse.view();
  TensorView kView = cache.kView(), vView = cache.vView();
  if (c.kvFloat8) {
    options.kScale = c.perHeadScale ? kScale : std::vector<float>{kScale[0]};
    options.vScale = c.perHeadScale ? vScale : std::vector<float>{vScale[0]};
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
  AttentionResult result = attention.run(q.view(), kView, vView, modBindings.bindings, options);
  EXPECT_EQ(result.out.data(), out.data());
  EXPECT_EQ(cache.kView().data(), kData);

  // The reference, one sequence at a time (its own rows and keys only, so
  // it costs what the step holds, not B x the longest chunk x the longest
  // context); sequence b's row of the per-sequence buffer is bound as a
  // batch of one, so the mods read what they read in the call.
  std::vector<cpu::ReferenceResult> references;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qLen = c.seqs[b].qLen;
    Bindings one = modBindings.bindings;
    one.buffers["doc"] =
        TensorView(modBindings.documents.data() + b * maxKv, DType::I32, {1, maxKv});
    ResolvedBindings resolved = resolveBindings(mods, one, Device::cpu());
    auto rows = [&](HostTensor &t, int64_t heads, int64_t length, int64_t width) {
      return TensorView(t.dataAs<double>() + b * heads * length * width, DType::F64,
                        {1, heads, qLen > 0 && &t == &q4 ? qLen : length, width},
                        {heads * length * width, length * width, width, 1}, Device::cpu());
    };
    cpu::ReferenceArgs ref;
    ref.q = rows(q4, c.qHeads, maxQ, c.dim);
    ref.k = rows(k4, c.kvHeads, maxKv, c.dim);
    ref.v = rows(v4, c.kvHeads, maxKv, c.vDim);
    ref.kvLength = &kvLength[b];
    ref.qOffset = &qOffset[b];
    ref.mods = &mods;
    ref.context = &resolved.context();
    ref.scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
    references.push_back(qLen > 0 ? cpu::referenceAttention(ref) : cpu::ReferenceResult{});
  }

  StepCheck check;
  const bool bf16Out = c.outType == DType::BF16;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < c.seqs[b].qLen; ++i)
      for (int64_t h = 0; h < c.qHeads; ++h) {
        const int64_t row = queryStartLoc[b] + i;
        ++check.rows;
        const cpu::ReferenceResult &reference = references[b];
        const double expectedLse = reference.lseAt(0, h, i);
        const bool masked = std::isinf(expectedLse);
        check.maskedRows += masked;
        for (int64_t d = 0; d < c.vDim; ++d) {
          const double expected = reference.outAt(0, h, i, d);
          const double actual =
              cpu::readAsDouble(out.view(), (row * c.qHeads + h) * c.vDim + d);
          if (!std::isfinite(actual)) {
            ++check.nonFinite;
            continue;
          }
          const double error = std::abs(actual - expected);
          check.maxOutError = std::max(check.maxOutError, error);
          check.outViolations +=
              error > 1e-4 + (bf16Out ? std::ldexp(std::abs(expected), -8) : 0.0);
        }
        const double actualLse = lse.dataAs<float>()[row * c.qHeads + h];
        if (std::isnan(actualLse)) {
          ++check.nonFinite;
        } else if (masked || std::isinf(actualLse)) {
          check.lseViolations += !(masked && std::isinf(actualLse) && actualLse < 0);
        } else {
          const double error = std::abs(actualLse - expectedLse);
          check.maxLseError = std::max(check.maxLseError, error);
          check.lseViolations += error > 1e-4 * std::max(1.0, std::abs(expectedLse));
        }
      }
  // Rows past the plan's tokens are not written.
  for (int64_t row = tokens; row < q.shape()[0]; ++row)
    for (int64_t h = 0; h < c.qHeads; ++h)
      EXPECT_TRUE(std::isnan(lse.dataAs<float>()[row * c.qHeads + h]));
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
    for (const char *mask : {"", "document", "holes"}) {
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
  AttentionResult all = whole.run(q.view(), cache.kView(), cache.vView(), modBindings.bindings,
                                  withLse);
  AttentionResult a = shared.run(q.view(), cache.kView(), cache.vView(), modBindings.bindings,
                                 withLse);
  AttentionResult b = own.run(q.view(), cache.kView(), cache.vView(), modBindings.bindings,
                              withLse);
  mergeStateInPlace(a.out, a.lse, b.out, b.lse);
  double maxError = 0, maxLseError = 0;
  for (int64_t i = 0; i < all.out.numel(); ++i)
    maxError = std::max(maxError, double(std::abs(a.out.dataAs<float>()[i] -
                                                  all.out.dataAs<float>()[i])));
  for (int64_t i = 0; i < all.lse.numel(); ++i)
    maxLseError = std::max(maxLseError, double(std::abs(a.lse.dataAs<float>()[i] -
                                                        all.lse.dataAs<float>()[i])));
  EXPECT_LE(maxError, 1e-5);
  EXPECT_LE(maxLseError, 1e-5);

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
  expectError([&] { BatchAttention(mods, c); }, "not supported by the batch call yet");
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
