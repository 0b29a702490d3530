//===- AttentionApiTest.cpp - flexAttention: validation and dispatch ------===//
//
// The numerics of the CPU kernels are tested with them (test/unit/cpu); here
// a small naive attention over the values the test wrote checks that
// flexAttention() hands the kernels the right slots, page tables, lengths,
// offsets, heads and masks, and every validation error is checked by name.
//
//===----------------------------------------------------------------------===//
#include "pagedc/Attention.h"
#include "pagedc/CudaDriver.h"

#include "TestMods.h"
#include "TestUtil.h"

#include <cmath>
#include <random>

using namespace pagedc;
using namespace pagedc::test;

namespace {

const PagedcModContext kNoContext{nullptr, nullptr};

/// A cache filled with random K/V whose logical contents the test keeps.
struct FilledCache {
  FilledCache(int64_t heads, int64_t headDim, int64_t valueHeadDim, int64_t pageSize,
              std::vector<int64_t> lengths, uint32_t seed)
      : heads(heads), headDim(headDim), valueHeadDim(valueHeadDim), lengths(lengths),
        cache(config(heads, headDim, valueHeadDim, pageSize, lengths)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    // Reserve page by page, round robin, so that the slots' pages interleave.
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    for (int64_t reserved = pageSize; reserved < longest + pageSize; reserved += pageSize)
      for (size_t slot = 0; slot < lengths.size(); ++slot)
        cache.reserve(static_cast<int64_t>(slot), std::min(reserved, lengths[slot]));
    for (size_t slot = 0; slot < lengths.size(); ++slot) {
      const int64_t length = lengths[slot];
      keys.emplace_back(heads * length * headDim);
      values.emplace_back(heads * length * valueHeadDim);
      for (float &x : keys.back())
        x = uniform(rng);
      for (float &x : values.back())
        x = uniform(rng);
      if (length == 0)
        continue;
      std::vector<int32_t> batchIdx = {static_cast<int32_t>(slot)};
      std::vector<int32_t> positions(length);
      for (int64_t i = 0; i < length; ++i)
        positions[i] = static_cast<int32_t>(length - 1 - i); // any order works
      // Keys are stored [H, length, D]; present them as [1, H, S, D] with S
      // reversed through the positions (row s holds position length-1-s).
      std::vector<float> k(keys.back().size()), v(values.back().size());
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t s = 0; s < length; ++s) {
          const int64_t position = length - 1 - s;
          std::copy_n(&keys.back()[(h * length + position) * headDim], headDim,
                      &k[(h * length + s) * headDim]);
          std::copy_n(&values.back()[(h * length + position) * valueHeadDim], valueHeadDim,
                      &v[(h * length + s) * valueHeadDim]);
        }
      cache.assign(i32View(batchIdx), i32View(positions, {1, length}),
                   TensorView(k.data(), DType::F32, {1, heads, length, headDim}),
                   TensorView(v.data(), DType::F32, {1, heads, length, valueHeadDim}));
    }
  }

  static KVCacheConfig config(int64_t heads, int64_t headDim, int64_t valueHeadDim,
                              int64_t pageSize, const std::vector<int64_t> &lengths) {
    KVCacheConfig config;
    int64_t pages = 2;
    for (int64_t length : lengths)
      pages += (length + pageSize - 1) / pageSize;
    config.numPages = pages;
    config.pageSize = pageSize;
    config.maxBatch = static_cast<int64_t>(lengths.size());
    config.heads = heads;
    config.headDim = headDim;
    config.valueHeadDim = valueHeadDim;
    return config;
  }

  const float *key(int64_t slot, int64_t h, int64_t position) const {
    return &keys[slot][(h * lengths[slot] + position) * headDim];
  }
  const float *value(int64_t slot, int64_t h, int64_t position) const {
    return &values[slot][(h * lengths[slot] + position) * valueHeadDim];
  }

  int64_t heads, headDim, valueHeadDim;
  std::vector<int64_t> lengths;
  PagedKVCache cache;
  std::vector<std::vector<float>> keys, values; // per slot, [H, length, D]
};

/// Naive attention on the test's own copy of the sequences.
void naiveAttention(const FilledCache &data, const std::vector<float> &q, int64_t batch,
                    int64_t queryHeads, int64_t queryLength, const std::vector<int32_t> &slots,
                    const std::vector<int32_t> &kvLength, const std::vector<int32_t> &qOffset,
                    bool causal, float scale, std::vector<float> &out, std::vector<float> &lse) {
  const int64_t ratio = queryHeads / data.heads, d = data.headDim, dv = data.valueHeadDim;
  out.assign(batch * queryHeads * queryLength * dv, 0.0f);
  lse.assign(batch * queryHeads * queryLength, -INFINITY);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < queryHeads; ++h)
      for (int64_t row = 0; row < queryLength; ++row) {
        const float *query = &q[((b * queryHeads + h) * queryLength + row) * d];
        const int64_t position = qOffset[b] + row;
        std::vector<double> logits;
        std::vector<int64_t> kept;
        for (int64_t kv = 0; kv < kvLength[b]; ++kv) {
          if (causal && kv > position)
            continue;
          const float *key = data.key(slots[b], h / ratio, kv);
          double dot = 0;
          for (int64_t i = 0; i < d; ++i)
            dot += double(query[i]) * key[i];
          logits.push_back(scale * dot);
          kept.push_back(kv);
        }
        if (kept.empty())
          continue;
        const double top = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (double &logit : logits)
          sum += (logit = std::exp(logit - top));
        float *o = &out[((b * queryHeads + h) * queryLength + row) * dv];
        for (size_t k = 0; k < kept.size(); ++k) {
          const float *value = data.value(slots[b], h / ratio, kept[k]);
          for (int64_t i = 0; i < dv; ++i)
            o[i] += static_cast<float>(logits[k] / sum * value[i]);
        }
        lse[(b * queryHeads + h) * queryLength + row] = static_cast<float>(top + std::log(sum));
      }
}

std::vector<float> randomVector(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(size);
  for (float &x : values)
    x = uniform(rng);
  return values;
}

void expectNear(const TensorView &actual, const std::vector<float> &expected, float tolerance,
                const std::string &what) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << what;
  ASSERT_TRUE(actual.isContiguous()) << what;
  const float *data = actual.dataAs<const float>();
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::isinf(expected[i])) {
      EXPECT_TRUE(std::isinf(data[i]) && data[i] < 0) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(data[i], expected[i], tolerance) << what << " at " << i;
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// Dispatch: slots, page tables, lengths, offsets, heads
//===----------------------------------------------------------------------===//

class GqaRatio : public ::testing::TestWithParam<int> {};

TEST_P(GqaRatio, OutOfOrderSlotsAndRaggedLengthsMatchNaiveAttention) {
  const int64_t ratio = GetParam(), kvHeads = 2, queryHeads = kvHeads * ratio;
  const int64_t headDim = 8, valueHeadDim = 4, pageSize = 4, queryLength = 3;
  // Slot lengths are not multiples of the page size (4) or block size (8).
  FilledCache data(kvHeads, headDim, valueHeadDim, pageSize, {7, 16, 13, 5}, 7 + ratio);
  const std::vector<int32_t> slots = {2, 0, 1};
  const std::vector<int32_t> kvLength = {13, 7, 15};
  const std::vector<int32_t> qOffset = {10, 4, 13};
  const int64_t batch = 3;
  std::vector<float> q = randomVector(batch * queryHeads * queryLength * headDim, 99);

  const CompiledMods causal = maskMods(causalRow, causalClass, false, false, true);
  const BlockMask mask = createBlockMask(causal, kNoContext, batch, queryHeads, 16, 16, 8, 8);
  AttentionOptions options;
  options.batchIdx = slots;
  options.kvLength = kvLength;
  options.qOffset = qOffset;
  options.returnLse = true;
  options.threads = 2;
  AttentionResult result =
      flexAttention(TensorView(q.data(), DType::F32, {batch, queryHeads, queryLength, headDim}),
                    data.cache, &mask, causal, Bindings(), options);
  std::vector<float> out, lse;
  naiveAttention(data, q, batch, queryHeads, queryLength, slots, kvLength, qOffset, true,
                 1.0f / std::sqrt(float(headDim)), out, lse);
  EXPECT_EQ(result.out.shape(), (std::vector<int64_t>{batch, queryHeads, queryLength, valueHeadDim}));
  expectNear(result.out, out, 2e-5f, "out");
  expectNear(result.lse, lse, 2e-5f, "lse");
}

INSTANTIATE_TEST_SUITE_P(Ratios, GqaRatio, ::testing::Values(1, 3, 4, 8));

TEST(FlexAttention, NoMaskNoModsDefaultSlotsAndExplicitScale) {
  FilledCache data(1, 4, 4, 2, {5, 3}, 3);
  std::vector<float> q = randomVector(2 * 3 * 2 * 4, 5);
  AttentionOptions options;
  options.kvLength = {5, 3};
  options.scale = 0.7f;
  CompiledMods none;
  AttentionResult result = flexAttention(TensorView(q.data(), DType::F32, {2, 3, 2, 4}),
                                         data.cache, nullptr, none, Bindings(), options);
  EXPECT_EQ(result.lse.data(), nullptr); // not requested
  std::vector<float> out, lse;
  naiveAttention(data, q, 2, 3, 2, {0, 1}, {5, 3}, {0, 0}, false, 0.7f, out, lse);
  expectNear(result.out, out, 2e-5f, "out");
}

TEST(FlexAttention, EmptyKvGivesZeroAndMinusInfinityIntoCallerOutputs) {
  FilledCache data(1, 4, 4, 2, {4}, 3);
  std::vector<float> q = randomVector(1 * 1 * 2 * 4, 5);
  std::vector<float> out(2 * 4, 123.0f), lse(2, 123.0f);
  AttentionOptions options;
  options.kvLength = {0};
  options.out = TensorView(out.data(), DType::F32, {1, 1, 2, 4});
  options.lse = TensorView(lse.data(), DType::F32, {1, 1, 2});
  CompiledMods none;
  AttentionResult result = flexAttention(TensorView(q.data(), DType::F32, {1, 1, 2, 4}),
                                         data.cache, nullptr, none, Bindings(), options);
  EXPECT_EQ(result.out.data(), out.data());
  EXPECT_EQ(result.lse.data(), lse.data());
  for (float x : out)
    EXPECT_EQ(x, 0.0f);
  for (float x : lse)
    EXPECT_TRUE(std::isinf(x) && x < 0);
}

//===----------------------------------------------------------------------===//
// Validation: every message, and nothing written
//===----------------------------------------------------------------------===//

namespace {

/// A valid call (B = 2, Hq = 4, Hkv = 2, Lq = 3, D = 8, Dv = 4) that each
/// test breaks in one way.
struct ValidationFixture : ::testing::Test {
  ValidationFixture()
      : data(2, 8, 4, 4, {12, 9, 0}, 11), q(randomVector(2 * 4 * 3 * 8, 1)),
        out(2 * 4 * 3 * 4, 42.0f), lse(2 * 4 * 3, 42.0f) {
    options.batchIdx = {1, 0};
    options.kvLength = {9, 12};
    options.qOffset = {6, 9};
    options.out = TensorView(out.data(), DType::F32, {2, 4, 3, 4});
    options.lse = TensorView(lse.data(), DType::F32, {2, 4, 3});
    mods = maskMods(causalRow, nullptr, false, false, true);
    mods.buffers = {{"bias", DType::F32, {}}};
    mods.buffers[0].dims.resize(1);
    mods.buffers[0].dims[0].kind = BufferDim::Fixed;
    mods.buffers[0].dims[0].size = 4;
    bindings.buffers["bias"] = TensorView(bias.data(), DType::F32, {4});
    mask = createBlockMask(mods, kNoContext, 2, 4, 16, 16, 8, 8);
  }
  TensorView qView() { return TensorView(q.data(), DType::F32, {2, 4, 3, 8}); }
  void run() { flexAttention(qView(), data.cache, &mask, mods, bindings, options); }
  void runWithQ(const TensorView &view) {
    flexAttention(view, data.cache, &mask, mods, bindings, options);
  }
  bool outputsUntouched() const {
    return std::all_of(out.begin(), out.end(), [](float x) { return x == 42.0f; }) &&
           std::all_of(lse.begin(), lse.end(), [](float x) { return x == 42.0f; });
  }

  FilledCache data;
  std::vector<float> q, out, lse;
  std::vector<float> bias = {0, 0, 0, 0};
  AttentionOptions options;
  CompiledMods mods;
  Bindings bindings;
  BlockMask mask;
};

} // namespace

TEST_F(ValidationFixture, TheValidCallRuns) {
  run();
  EXPECT_FALSE(outputsUntouched());
}

TEST_F(ValidationFixture, ShapesDtypesDevicesAndStrides) {
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(q.data(), DType::F32, {2, 4, 24})),
                      "q must be [B, Hq, Lq, D] but has shape [2, 4, 24]");
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(q.data(), DType::F16, {2, 4, 3, 8})),
                      "q must be f32 or bf16 on the CPU but is f16");
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(q.data(), DType::F32, {2, 4, 6, 4})),
                      "q has head dim D=4 but the KV cache has D=8");
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(q.data(), DType::F32, {2, 3, 4, 8})),
                      "query heads Hq=3 are not a multiple of the KV cache's heads Hkv=2");
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(q.data(), DType::F32, {2, 4, 3, 8}, {96, 24, 8, -1},
                                          Device::cpu())),
                      "q has negative stride -1 in dimension 3");
  // Without a driver the CUDA backend says why; with one, the CPU cache is refused.
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(q.data(), DType::F32, {2, 4, 3, 8}, Device::cuda(0))),
                      CudaDriver::available() ? "the KV cache is on cpu but the call runs on cuda:0"
                                              : "CUDA execution is not available: ");
  options.device = Device::cpu();
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(q.data(), DType::F32, {2, 4, 3, 8}, Device::cuda(0))),
                      "q is on cuda:0 but the call runs on cpu");
  EXPECT_TRUE(outputsUntouched());
}

TEST_F(ValidationFixture, SlotsLengthsAndOffsets) {
  AttentionOptions saved = options;
  options.batchIdx = {1};
  EXPECT_PAGEDC_ERROR(run(), "options.batchIdx has 1 entries but q has batch B=2");
  options.batchIdx = {1, 3};
  EXPECT_PAGEDC_ERROR(run(), "options.batchIdx[1] = 3 is out of range [0, 3)");
  options = saved;
  options.kvLength = {};
  EXPECT_PAGEDC_ERROR(run(), "options.kvLength is required: one valid KV length per batch entry");
  options.kvLength = {9};
  EXPECT_PAGEDC_ERROR(run(), "options.kvLength has 1 entries but q has batch B=2");
  options.kvLength = {13, 12};
  EXPECT_PAGEDC_ERROR(run(), "options.kvLength[0] = 13 is outside [0, 12], the capacity of cache "
                             "slot 1");
  options = saved;
  options.qOffset = {1, 2, 3};
  EXPECT_PAGEDC_ERROR(run(), "options.qOffset has 3 entries but q has batch B=2");
  options.qOffset = {-1, 0};
  EXPECT_PAGEDC_ERROR(run(), "options.qOffset[0] = -1 is negative");
  options = saved;
  options.scale = NAN;
  EXPECT_PAGEDC_ERROR(run(), "scale must be finite but is nan");
  options = saved;
  options.threads = -2;
  EXPECT_PAGEDC_ERROR(run(), "options.threads must not be negative but is -2");
  options = saved;
  options.batchIdx = {};
  options.kvLength = {12, 9};
  EXPECT_NO_THROW(run()); // default slots 0, 1
  EXPECT_TRUE(std::isfinite(lse[0]));
}

TEST_F(ValidationFixture, DefaultSlotsNeedEnoughCacheSlots) {
  std::vector<float> bigQ(4 * 4 * 3 * 8);
  options = AttentionOptions();
  options.kvLength = {1, 1, 1, 1};
  EXPECT_PAGEDC_ERROR(runWithQ(TensorView(bigQ.data(), DType::F32, {4, 4, 3, 8})),
                      "q has batch B=4 but the KV cache has only 3 slots; pass options.batchIdx");
}

TEST_F(ValidationFixture, BlockMaskAgreement) {
  const BlockMask saved = mask;
  mask = createBlockMask(maskMods(causalRow, nullptr, true, true), kNoContext, 3, 4, 16, 16, 8, 8);
  EXPECT_PAGEDC_ERROR(run(), "block mask has batch extent 3 but the call has B=2 (the extent must "
                             "be 1 or B)");
  mask = createBlockMask(maskMods(causalRow, nullptr, true, true), kNoContext, 2, 2, 16, 16, 8, 8);
  EXPECT_PAGEDC_ERROR(run(), "block mask has head extent 2 but the call has Hq=4 (the extent must "
                             "be 1 or Hq)");
  mask = createBlockMask(mods, kNoContext, 2, 4, 11, 16, 8, 8);
  EXPECT_PAGEDC_ERROR(run(), "block mask was built for Q_LEN=11 but batch entry 1 has query "
                             "positions up to 11 (q offset 9 + Lq 3)");
  mask = createBlockMask(mods, kNoContext, 2, 4, 16, 10, 8, 8);
  EXPECT_PAGEDC_ERROR(run(), "block mask was built for KV_LEN=10 but options.kvLength[1] = 12");
  mask = saved;
  mask.physicalIndices = true;
  EXPECT_PAGEDC_ERROR(run(), "the block mask holds physical page indices");
  mask = saved;
  mask.kvIndices.push_back(0);
  EXPECT_PAGEDC_ERROR(run(), "block mask kvIndices has");
  mask = saved;
  // Any block size works, including ones that differ from the page size.
  mask = createBlockMask(mods, kNoContext, 2, 4, 12, 12, 2, 16);
  EXPECT_NO_THROW(run());
}

TEST_F(ValidationFixture, ModsAndBindings) {
  CompiledMods saved = mods;
  mods.maskRow = nullptr;
  EXPECT_PAGEDC_ERROR(run(), "mask mod 'mask' has no CPU function");
  mods = saved;
  mods.scoreName = "bias_score";
  EXPECT_PAGEDC_ERROR(run(), "score mod 'bias_score' has no CPU function");
  mods = saved;
  bindings.buffers.clear();
  EXPECT_PAGEDC_ERROR(run(), "missing binding for buffer 'bias'");
  bindings.buffers["bias"] = TensorView(bias.data(), DType::F32, {3});
  EXPECT_PAGEDC_ERROR(run(), "buffer 'bias' dimension 0 must be 4");
  EXPECT_TRUE(outputsUntouched());
}

TEST_F(ValidationFixture, Outputs) {
  AttentionOptions saved = options;
  options.out = TensorView(out.data(), DType::F32, {2, 4, 3, 8});
  EXPECT_PAGEDC_ERROR(run(), "options.out must be [2, 4, 3, 4] ([B, Hq, Lq, Dv]) but has shape "
                             "[2, 4, 3, 8]");
  options.out = TensorView(out.data(), DType::F16, {2, 4, 3, 4});
  EXPECT_PAGEDC_ERROR(run(), "options.out is f16 but must be f32 or bf16");
  options.out = TensorView(out.data(), DType::F32, {2, 4, 3, 4}, Device::cuda(0));
  EXPECT_PAGEDC_ERROR(run(), "options.out is on cuda:0 but the call runs on cpu");
  options.out = TensorView(out.data(), DType::F32, {2, 4, 3, 4}, {0, 12, 4, 1}, Device::cpu());
  EXPECT_PAGEDC_ERROR(run(), "options.out has stride 0 in dimension 0; outputs need positive "
                             "strides");
  options = saved;
  options.lse = TensorView(lse.data(), DType::F32, {2, 4});
  EXPECT_PAGEDC_ERROR(run(), "options.lse must be [2, 4, 3] ([B, Hq, Lq]) but has shape [2, 4]");
  options.lse = TensorView(lse.data(), DType::BF16, {2, 4, 3});
  EXPECT_PAGEDC_ERROR(run(), "options.lse is bf16 but must be f32");
  EXPECT_TRUE(outputsUntouched());
}

TEST_F(ValidationFixture, AllocatesOutputsOfQsDtype) {
  options.out = TensorView();
  options.lse = TensorView();
  options.returnLse = false;
  AttentionResult result = flexAttention(qView(), data.cache, &mask, mods, bindings, options);
  EXPECT_EQ(result.out.dtype(), DType::F32);
  EXPECT_EQ(result.out.data(), result.ownedOut.data());
  EXPECT_EQ(result.lse.data(), nullptr);
  AttentionResult moved = std::move(result);
  EXPECT_EQ(moved.out.data(), moved.ownedOut.data());
}
