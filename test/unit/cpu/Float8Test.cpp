//===- Float8Test.cpp - 8-bit floats: codes, quantization, FP8 caches ----===//
//
// The two OCP 8-bit formats against values worked out from their fields
// here (every one of the 256 codes of each), the rounding and saturation
// rules of PTX's cvt.rn.satfinite, PagedKVCache's quantizing assign, and
// flexAttention over 8-bit caches against the float64 reference on the
// dequantized values.
//
//===----------------------------------------------------------------------===//
#include "TestMods.h"
#include "cpu/Reference.h"

#include "pagedc/Attention.h"
#include "pagedc/Error.h"
#include "pagedc/KVCache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace {

using namespace pagedc;

/// The value of a code from its sign, exponent and mantissa fields.
double fieldValue(uint8_t code, int exponentBits, int mantissaBits) {
  const int bias = (1 << (exponentBits - 1)) - 1;
  const int exponent = (code >> mantissaBits) & ((1 << exponentBits) - 1);
  const int mantissa = code & ((1 << mantissaBits) - 1);
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa, 1 - bias - mantissaBits)
                    : std::ldexp(mantissa + (1 << mantissaBits), exponent - bias - mantissaBits);
  return (code & 0x80) ? -magnitude : magnitude;
}

TEST(Float8, EveryCodeOfBothFormats) {
  for (int code = 0; code < 256; ++code) {
    const uint8_t c = static_cast<uint8_t>(code);
    // e4m3fn: S.1111.111 is NaN, every other code finite.
    const float e4 = float8ToFloat(c, DType::F8E4M3);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(e4)) << code;
    } else {
      EXPECT_EQ(e4, fieldValue(c, 4, 3)) << code;
    }
    // e5m2: exponent 11111 is infinity (mantissa 0) or NaN.
    const float e5 = float8ToFloat(c, DType::F8E5M2);
    if ((code & 0x7c) == 0x7c) {
      if ((code & 0x03) == 0) {
        EXPECT_EQ(e5, (code & 0x80) ? -INFINITY : INFINITY) << code;
      } else {
        EXPECT_TRUE(std::isnan(e5)) << code;
      }
    } else {
      EXPECT_EQ(e5, fieldValue(c, 5, 2)) << code;
    }
  }
  // Anchors a reader can check by hand.
  EXPECT_EQ(float8ToFloat(0x7e, DType::F8E4M3), 448.0f);
  EXPECT_EQ(float8ToFloat(0x01, DType::F8E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(float8ToFloat(0x38, DType::F8E4M3), 1.0f);
  EXPECT_EQ(float8ToFloat(0x7b, DType::F8E5M2), 57344.0f);
  EXPECT_EQ(float8ToFloat(0x01, DType::F8E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(float8ToFloat(0x3c, DType::F8E5M2), 1.0f);
}

TEST(Float8, QuantizationRoundsToNearestEvenAndSaturates) {
  for (DType type : {DType::F8E4M3, DType::F8E5M2}) {
    SCOPED_TRACE(dtypeName(type));
    const uint8_t maxCode = type == DType::F8E4M3 ? 0x7e : 0x7b;
    const float maxValue = float8ToFloat(maxCode, type);
    // Every finite code comes back as itself.
    for (int code = 0; code < 256; ++code) {
      const float value = float8ToFloat(static_cast<uint8_t>(code), type);
      if (std::isfinite(value)) {
        EXPECT_EQ(floatToFloat8(value, type), code) << code;
      }
    }
    // Between two neighbours: the nearer; halfway: the even code.
    for (int code = 0; code < maxCode; ++code) {
      const float low = float8ToFloat(static_cast<uint8_t>(code), type);
      const float high = float8ToFloat(static_cast<uint8_t>(code + 1), type);
      const float middle = (low + high) / 2;
      EXPECT_EQ(floatToFloat8(middle, type), (code % 2 == 0) ? code : code + 1) << code;
      EXPECT_EQ(floatToFloat8(std::nextafter(middle, 0.0f), type), code) << code;
      EXPECT_EQ(floatToFloat8(std::nextafter(middle, INFINITY), type), code + 1) << code;
      EXPECT_EQ(floatToFloat8(-middle, type), 0x80 | ((code % 2 == 0) ? code : code + 1));
    }
    // satfinite: past the largest finite value, infinity included, stays
    // at it with its sign; NaN is the canonical NaN; -0 keeps its sign.
    for (float big : {maxValue * 1.01f, maxValue * 1e6f, 1e30f, INFINITY}) {
      EXPECT_EQ(floatToFloat8(big, type), maxCode) << big;
      EXPECT_EQ(floatToFloat8(-big, type), 0x80 | maxCode) << big;
    }
    EXPECT_EQ(floatToFloat8(std::numeric_limits<float>::quiet_NaN(), type), 0x7f);
    EXPECT_EQ(floatToFloat8(-0.0f, type), 0x80);
    EXPECT_EQ(floatToFloat8(1e-30f, type), 0x00);
  }
}

KVCacheConfig float8Config(DType type, std::vector<float> kScale, std::vector<float> vScale) {
  KVCacheConfig config;
  config.numPages = 100;
  config.pageSize = 16;
  config.maxBatch = 3;
  config.heads = 2;
  config.headDim = config.valueHeadDim = 32;
  config.dtype = type;
  config.kScale = std::move(kScale);
  config.vScale = std::move(vScale);
  return config;
}

template <typename F> void expectError(F call, const std::string &needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(Float8, CacheConfigurationErrors) {
  expectError([] { PagedKVCache c(float8Config(DType::F8E4M3, {}, {1.0f})); },
              "an f8e4m3 cache needs k_scale");
  expectError([] { PagedKVCache c(float8Config(DType::F8E5M2, {1.0f}, {0.0f})); },
              "v_scale[0] = 0 must be finite and greater than 0");
  expectError([] { PagedKVCache c(float8Config(DType::F8E4M3, {1.0f, NAN}, {1.0f})); },
              "k_scale[1] = nan");
  expectError([] { PagedKVCache c(float8Config(DType::F8E4M3, {1, 2, 3}, {1.0f})); },
              "k_scale has 3 values; give one, or one per KV head (2)");
  expectError([] { PagedKVCache c(float8Config(DType::F32, {1.0f}, {})); },
              "k_scale applies to 8-bit float caches only");
}

/// Writes random values into every slot's first `length` positions and
/// returns them dequantized from the cache's own codes, [B, Hkv, L, D].
struct Float8Fill {
  HostTensor k, v; // the dequantized dense K / V, f64
};

Float8Fill fillCache(PagedKVCache &cache, const std::vector<int32_t> &lengths, std::mt19937 &rng) {
  const int64_t batch = static_cast<int64_t>(lengths.size()), heads = cache.heads();
  const int64_t dim = cache.headDim();
  int64_t longest = 0;
  for (int32_t n : lengths)
    longest = std::max<int64_t>(longest, n);
  // Reserve in turns, a page at a time, so the slots' pages interleave.
  for (int64_t n = cache.pageSize(); n < longest + cache.pageSize(); n += cache.pageSize())
    for (int64_t b = batch - 1; b >= 0; --b)
      cache.reserve(b, std::min<int64_t>(n, lengths[b]));
  Float8Fill fill{HostTensor(DType::F64, {batch, heads, longest, dim}),
                  HostTensor(DType::F64, {batch, heads, longest, dim})};
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = lengths[b];
    HostTensor k(DType::F32, {1, heads, n, dim}), v(DType::F32, {1, heads, n, dim});
    for (HostTensor *t : {&k, &v})
      for (int64_t i = 0; i < t->numel(); ++i)
        t->dataAs<float>()[i] = normal(rng);
    std::vector<int32_t> slot{static_cast<int32_t>(b)}, positions(n);
    for (int64_t i = 0; i < n; ++i)
      positions[i] = static_cast<int32_t>(i);
    cache.assign(TensorView(slot.data(), DType::I32, {1}),
                 TensorView(positions.data(), DType::I32, {1, n}), k.view(), v.view());
    // Read the codes back and check them against the rule.
    const std::vector<int32_t> &table = cache.pageTable(b);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < dim; ++d) {
          const int64_t row = (h * cache.numPages() + table[i / cache.pageSize()]) *
                                  cache.pageSize() + i % cache.pageSize();
          const uint8_t kCode = cache.kCache().dataAs<uint8_t>()[row * dim + d];
          const uint8_t vCode = cache.vCache().dataAs<uint8_t>()[row * dim + d];
          const float kx = k.dataAs<float>()[(h * n + i) * dim + d];
          const float vx = v.dataAs<float>()[(h * n + i) * dim + d];
          EXPECT_EQ(kCode, floatToFloat8(kx / cache.kScale()[h], cache.dtype()));
          EXPECT_EQ(vCode, floatToFloat8(vx / cache.vScale()[h], cache.dtype()));
          fill.k.dataAs<double>()[((b * heads + h) * longest + i) * dim + d] =
              double(float8ToFloat(kCode, cache.dtype())) * cache.kScale()[h];
          fill.v.dataAs<double>()[((b * heads + h) * longest + i) * dim + d] =
              double(float8ToFloat(vCode, cache.dtype())) * cache.vScale()[h];
        }
  }
  return fill;
}

TEST(Float8, FlexAttentionOverFloat8CachesMatchesFloat64) {
  // Prefill, decode, 3-token decode and long decodes whose keys are split
  // (2 threads), both formats, per-tensor and per-head scales, GQA 1 and 4.
  std::mt19937 rng(23);
  struct Case {
    DType type;
    bool perHead;
    int64_t qHeads, qLength;
    std::vector<int32_t> lengths;
  };
  const Case cases[] = {
      {DType::F8E4M3, true, 2, 45, {45, 61, 50}},
      {DType::F8E5M2, false, 8, 1, {300, 17, 290}},
      {DType::F8E4M3, false, 8, 3, {129, 64, 77}},
      {DType::F8E5M2, true, 2, 1, {600, 599, 37}},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(std::string(dtypeName(c.type)) + (c.perHead ? " per-head" : " per-tensor") +
                 " Lq " + std::to_string(c.qLength));
    std::vector<float> kScale = c.perHead ? std::vector<float>{0.011f, 0.017f}
                                          : std::vector<float>{0.013f};
    std::vector<float> vScale = c.perHead ? std::vector<float>{0.009f, 0.021f}
                                          : std::vector<float>{0.019f};
    PagedKVCache cache(float8Config(c.type, kScale, vScale));
    Float8Fill fill = fillCache(cache, c.lengths, rng);
    const int64_t batch = static_cast<int64_t>(c.lengths.size());
    HostTensor q(DType::F32, {batch, c.qHeads, c.qLength, 32});
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < q.numel(); ++i)
      q.dataAs<float>()[i] = uniform(rng);
    CompiledMods mods = testutil::makeTestMods("causal", "softcap");
    testutil::TestBindings bindings(batch, c.qHeads, 700, 5);
    Bindings named;
    named.params["softcap"] = ParamValue::ofF32(2.0f);
    named.params["window"] = ParamValue::ofI32(17);
    named.params["temperature"] = ParamValue::ofF32(1.5f);
    std::vector<float> slopes(c.qHeads, 0.5f);
    std::vector<int32_t> docs(batch * 700, 0);
    named.buffers["doc"] = TensorView(docs.data(), DType::I32, {batch, 700});
    named.buffers["slopes"] = TensorView(slopes.data(), DType::F32, {c.qHeads});
    AttentionOptions options;
    options.kvLength = c.lengths;
    for (int32_t n : c.lengths)
      options.qOffset.push_back(n - static_cast<int32_t>(c.qLength));
    options.returnLse = true;
    options.threads = 2;
    AttentionResult result = flexAttention(q.view(), cache, nullptr, mods, named, options);

    ResolvedBindings resolved = resolveBindings(mods, named, Device::cpu());
    cpu::ReferenceArgs ref;
    ref.q = q.view();
    ref.k = fill.k.view();
    ref.v = fill.v.view();
    ref.kvLength = options.kvLength.data();
    ref.qOffset = options.qOffset.data();
    ref.mods = &mods;
    ref.context = &resolved.context();
    ref.scale = 1.0 / std::sqrt(32.0);
    cpu::ReferenceResult expected = cpu::referenceAttention(ref);
    double maxOut = 0, maxLse = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < c.qHeads; ++h)
        for (int64_t i = 0; i < c.qLength; ++i) {
          const int64_t row = (b * c.qHeads + h) * c.qLength + i;
          maxLse = std::max(maxLse, std::abs(result.lse.dataAs<float>()[row] -
                                             expected.lseAt(b, h, i)));
          for (int64_t d = 0; d < 32; ++d)
            maxOut = std::max(maxOut, std::abs(result.out.dataAs<float>()[row * 32 + d] -
                                               expected.outAt(b, h, i, d)));
        }
    EXPECT_LE(maxOut, 1e-4);
    EXPECT_LE(maxLse, 1e-4);
  }
}

TEST(Float8, AssignTakesFloatValuesOnly) {
  PagedKVCache cache(float8Config(DType::F8E4M3, {1.0f}, {1.0f}));
  cache.reserve(0, 4);
  std::vector<int32_t> slot{0}, positions{0, 1, 2, 3};
  std::vector<int32_t> ints(2 * 4 * 32);
  expectError(
      [&] {
        cache.assign(TensorView(slot.data(), DType::I32, {1}),
                     TensorView(positions.data(), DType::I32, {1, 4}),
                     TensorView(ints.data(), DType::I32, {1, 2, 4, 32}),
                     TensorView(ints.data(), DType::I32, {1, 2, 4, 32}));
      },
      "an f8e4m3 cache takes f32, f16 or bf16 values and quantizes them");
}

} // namespace
