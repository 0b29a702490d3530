//===- EdgeCaseTest.cpp - Run-time integer edge cases and buffer bounds ---===//
//
// Generated sweeps over the run-time integer edge cases of docs/language.md
// ("Integer edge cases") and over out-of-range buffer indices ("Buffer
// reads"): the CPU JIT and the float64 reference evaluator must both give
// the documented result, computed here by an independent model; the CUDA
// prelude helpers, compiled as host C++, must give it too, and the
// generated CUDA code must call those helpers.
//
//===----------------------------------------------------------------------===//

#include "JIT/CompileSource.h"

#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

// The CUDA helpers, compiled for the host (with the storage types and
// conversions of templates/Prelude.cuh that they use).
struct pagedc_f16 {
  uint16_t bits;
};
struct pagedc_bf16 {
  uint16_t bits;
};
namespace pagedc {
inline float to_float(pagedc_bf16 v) {
  uint32_t bits = uint32_t(v.bits) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}
inline float to_float(pagedc_f16 v) {
  int exponent = (v.bits >> 10) & 31, mantissa = v.bits & 1023;
  float magnitude = exponent == 0    ? std::ldexp(float(mantissa), -24)
                    : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                     : std::ldexp(float(1024 + mantissa), exponent - 25);
  return (v.bits & 0x8000) ? -magnitude : magnitude;
}
} // namespace pagedc
#define __device__
#define __forceinline__ inline
namespace pagedc_mods {
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll((unsigned long long)x);
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
} // namespace pagedc_mods
#include "Conversion/CUDA/Prelude.cuh"
#undef __device__
#undef __forceinline__

using namespace pagedc;

namespace {

constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
constexpr int32_t kMax = std::numeric_limits<int32_t>::max();

//===--- The documented semantics, modelled independently -----------------===//

int32_t wrap(int64_t v) {
  return static_cast<int32_t>(static_cast<uint32_t>(v));
}

int32_t modelFloorDiv(int32_t a, int32_t b) {
  if (b == 0)
    return 0;
  int64_t q = int64_t(a) / b;
  if (int64_t(a) % b != 0 && ((a < 0) != (b < 0)))
    --q;
  return wrap(q); // MIN // -1 = 2^31 wraps to MIN
}
int32_t modelFloorMod(int32_t a, int32_t b) {
  if (b == 0)
    return a;
  int64_t r = int64_t(a) % b;
  if (r != 0 && ((r < 0) != (b < 0)))
    r += b;
  return wrap(r);
}
int32_t modelShl(int32_t a, int32_t s) {
  return (s < 0 || s >= 32) ? 0 : wrap(int64_t(uint64_t(uint32_t(a)) << s));
}
int32_t modelShr(int32_t a, int32_t s) {
  if (s < 0 || s >= 32)
    return a < 0 ? -1 : 0;
  return wrap(int64_t(a) >> s);
}
int32_t modelPow(int32_t a, int32_t e) {
  if (e < 0)
    return a == 1 ? 1 : a == -1 ? ((e % 2) ? -1 : 1) : 0;
  uint32_t r = 1;
  for (int32_t i = 0; i < e; ++i) { // plain repeated multiplication, mod 2^32
    r *= uint32_t(a);
    if (r == 0)
      break;
  }
  return int32_t(r);
}
int32_t modelToInt(float x) {
  if (std::isnan(x))
    return 0;
  if (x >= 2147483648.0f)
    return kMax;
  if (x < -2147483648.0f)
    return kMin;
  return int32_t(std::trunc(double(x)));
}

std::vector<int32_t> interestingInts() {
  std::vector<int32_t> values = {kMin, kMin + 1, kMax, kMax - 1};
  for (int32_t v = -34; v <= 34; ++v)
    values.push_back(v);
  for (int32_t v : {63, 64, 65, 1000, -1000, 65536, -65536, 46341, -46341})
    values.push_back(v);
  return values;
}

//===--- Compiling and running one mask on both CPU evaluators ------------===//

CompiledMods compile(const std::string &source, bool withCuda = false) {
  jit::SourceCompileOptions options;
  options.withCuda = withCuda;
  std::string diagnostics;
  llvm::raw_string_ostream stream(diagnostics);
  auto mods =
      jit::compileModsFromSource("edge.attn", source, "m", "", options, stream);
  if (!mods) {
    ADD_FAILURE() << llvm::toString(mods.takeError()) << "\n" << diagnostics;
    return {};
  }
  return std::move(*mods);
}

/// Both the JIT row and the reference for (q, kv) with these params.
void evaluate(const CompiledMods &mods,
              const std::vector<PagedcParamSlot> &slots, int32_t q, int32_t kv,
              bool &jit, bool &reference) {
  PagedcModContext context{nullptr, slots.data()};
  uint8_t out = 7;
  mods.maskRow(&context, 0, 0, q, kv, 1, &out);
  jit = out != 0;
  reference = mods.maskReference(context, 0, 0, q, kv);
}

struct BinaryCase {
  const char *op;
  int32_t (*model)(int32_t, int32_t);
  int32_t (*cuda)(int32_t, int32_t);
};

TEST(IntegerEdgeCases, CpuJitAndReferenceGiveTheDocumentedResults) {
  const BinaryCase cases[] = {
      {"//", modelFloorDiv,
       [](int32_t a, int32_t b) { return pagedc_mods::flex_floordiv(a, b); }},
      {"%", modelFloorMod,
       [](int32_t a, int32_t b) { return pagedc_mods::flex_floormod(a, b); }},
      {"<<", modelShl,
       [](int32_t a, int32_t b) { return pagedc_mods::flex_shl(a, b); }},
      {">>", modelShr,
       [](int32_t a, int32_t b) { return pagedc_mods::flex_shr(a, b); }},
      {"**", modelPow,
       [](int32_t a, int32_t b) { return pagedc_mods::flex_ipow(a, b); }},
  };
  std::vector<int32_t> values = interestingInts();
  for (const BinaryCase &c : cases) {
    // A and B are params (run-time values, never folded); the mask says
    // whether A op B equals E.
    CompiledMods mods = compile(std::string("param A: i32\nparam B: i32\n"
                                            "param E: i32\n"
                                            "mask m(b, h, q, kv) = (A ") +
                                c.op + " B) == E\n");
    ASSERT_TRUE(mods.maskRow && mods.maskReference) << c.op;
    unsigned checked = 0;
    for (int32_t a : values) {
      for (int32_t b : values) {
        if (std::string(c.op) == "**" && b > 70)
          continue; // the model multiplies b times
        int32_t expected = c.model(a, b);
        EXPECT_EQ(c.cuda(a, b), expected)
            << "CUDA helper: " << a << " " << c.op << " " << b;
        for (int32_t e : {expected, int32_t(uint32_t(expected) + 1)}) {
          std::vector<PagedcParamSlot> slots(3);
          slots[0].i32 = a;
          slots[1].i32 = b;
          slots[2].i32 = e;
          bool jit = false, reference = false;
          evaluate(mods, slots, 0, 0, jit, reference);
          EXPECT_EQ(jit, e == expected)
              << "CPU JIT: " << a << " " << c.op << " " << b << " should be "
              << expected;
          EXPECT_EQ(reference, e == expected)
              << "reference: " << a << " " << c.op << " " << b << " should be "
              << expected;
        }
        ++checked;
      }
    }
    EXPECT_GT(checked, 1000u);
  }
}

TEST(IntegerEdgeCases, KeyValuesAsDocumented) {
  EXPECT_EQ(modelFloorDiv(kMin, -1), kMin);
  EXPECT_EQ(modelFloorMod(kMin, -1), 0);
  EXPECT_EQ(modelFloorDiv(7, 0), 0);
  EXPECT_EQ(modelFloorMod(7, 0), 7);
  EXPECT_EQ(modelShl(1, 32), 0);
  EXPECT_EQ(modelShl(1, -1), 0);
  EXPECT_EQ(modelShr(-8, 40), -1);
  EXPECT_EQ(modelShr(8, -1), 0);
  EXPECT_EQ(modelPow(2, 31), kMin);
  EXPECT_EQ(modelPow(2, -1), 0);
  EXPECT_EQ(modelPow(-1, -3), -1);
  EXPECT_EQ(modelToInt(NAN), 0);
  EXPECT_EQ(modelToInt(INFINITY), kMax);
  EXPECT_EQ(modelToInt(-INFINITY), kMin);
}

TEST(IntegerEdgeCases, IntOfFloats) {
  CompiledMods mods = compile("param X: f32\nparam E: i32\n"
                              "mask m(b, h, q, kv) = int(X) == E\n");
  ASSERT_TRUE(mods.maskRow && mods.maskReference);
  std::vector<float> values = {
      NAN,   -NAN,          INFINITY,       -INFINITY,     3e9f,
      -3e9f, 2147483648.0f, -2147483648.0f, 2147483520.0f, -2147483520.0f,
      1e30f, -1e30f,        0.0f,           -0.0f,         2.7f,
      -2.7f, 0.5f,          -0.5f,          16777217.0f};
  for (float x : values) {
    int32_t expected = modelToInt(x);
    EXPECT_EQ(pagedc_mods::flex_float_to_int(x), expected) << "CUDA: " << x;
    for (int32_t e : {expected, int32_t(uint32_t(expected) + 1)}) {
      std::vector<PagedcParamSlot> slots(2);
      slots[0].f32 = x;
      slots[1].i32 = e;
      bool jit = false, reference = false;
      evaluate(mods, slots, 0, 0, jit, reference);
      EXPECT_EQ(jit, e == expected) << "CPU JIT: int(" << x << ")";
      EXPECT_EQ(reference, e == expected) << "reference: int(" << x << ")";
    }
  }
}

TEST(IntegerEdgeCases, GeneratedCudaCallsTheDefinedHelpers) {
  if (!jit::cudaCodeGenAvailable())
    GTEST_SKIP() << "no CUDA code generator in this build";
  CompiledMods mods = compile(
      "param A: i32\nparam B: i32\nparam X: f32\n"
      "mask m(b, h, q, kv) = ((A // B) + (A % B) + (A << B) + (A >> B) + "
      "(A ** B) + int(X)) == 0\n",
      /*withCuda=*/true);
  const std::string &code = mods.cuda.modCode;
  for (const char *helper : {"flex_floordiv(", "flex_floormod(", "flex_shl(",
                             "flex_shr(", "flex_ipow(", "flex_float_to_int("})
    EXPECT_NE(code.find(helper), std::string::npos) << helper << "\n" << code;
  // In the generated hooks (after the prelude): no raw C shift, which would
  // be undefined for these inputs.
  size_t hooks = code.find("mask_row");
  ASSERT_NE(hooks, std::string::npos) << code;
  std::string generated = code.substr(hooks);
  EXPECT_EQ(generated.find("<<"), std::string::npos) << generated;
  EXPECT_EQ(generated.find(">>"), std::string::npos) << generated;
}

//===--- Buffer reads out of range
//-----------------------------------------===//

TEST(BufferBounds, OutOfRangeReadsZeroOnBothCpuEvaluators) {
  // kv walks far past the end (and q is any index): reads outside [0, size)
  // give 0, inside they give the element.
  CompiledMods mods = compile("buffer d: i32[?]\nparam E: i32\n"
                              "mask m(b, h, q, kv) = d[kv + q] == E\n");
  ASSERT_TRUE(mods.maskRow && mods.maskReference);
  for (int64_t size : {0, 1, 5, 64}) {
    std::vector<int32_t> data(size_t(size) + 1, 0);
    for (int64_t i = 0; i < size; ++i)
      data[i] = int32_t(1000 + i);
    // Beyond the buffer: a value that must never be read.
    data[size] = 424242;
    PagedcBufferRef ref{};
    ref.data = size == 0 ? nullptr : data.data();
    ref.sizes[0] = size;
    ref.strides[0] = 1;
    for (int32_t q : {0, -1, -70, kMin, kMax - 100, 2000000000}) {
      for (int32_t e : {0, 1000, 1003, 424242}) {
        std::vector<PagedcParamSlot> slots(1);
        slots[0].i32 = e;
        PagedcModContext context{&ref, slots.data()};
        constexpr int32_t count = 96;
        uint8_t out[count];
        mods.maskRow(&context, 0, 0, q, 0, count, out);
        for (int32_t kv = 0; kv < count; ++kv) {
          int64_t index = int64_t(wrap(int64_t(kv) + q));
          int32_t value = (index >= 0 && index < size) ? data[index] : 0;
          EXPECT_EQ(out[kv] != 0, value == e)
              << "JIT: size " << size << " index " << index << " E " << e;
          EXPECT_EQ(mods.maskReference(context, 0, 0, q, kv), value == e)
              << "reference: size " << size << " index " << index;
        }
      }
    }
  }
}

TEST(BufferBounds, EveryDimensionIsChecked) {
  CompiledMods mods =
      compile("buffer t: f32[?, ?]\nmask m(b, h, q, kv) = t[q, kv] > 0.5\n");
  ASSERT_TRUE(mods.maskRow && mods.maskReference);
  // 3 x 4, all ones; row-major.
  std::vector<float> data(12, 1.0f);
  data.push_back(1.0f); // past the end
  PagedcBufferRef ref{};
  ref.data = data.data();
  ref.sizes[0] = 3;
  ref.sizes[1] = 4;
  ref.strides[0] = 4;
  ref.strides[1] = 1;
  PagedcModContext context{&ref, nullptr};
  for (int32_t q = -2; q < 6; ++q) {
    uint8_t out[8];
    mods.maskRow(&context, 0, 0, q, -2, 8, out);
    for (int32_t i = 0; i < 8; ++i) {
      int32_t kv = i - 2;
      bool inside = q >= 0 && q < 3 && kv >= 0 && kv < 4;
      EXPECT_EQ(out[i] != 0, inside) << q << ", " << kv;
      EXPECT_EQ(mods.maskReference(context, 0, 0, q, kv), inside)
          << q << ", " << kv;
    }
  }
}

TEST(BufferBounds, CudaHelpersReadZeroOutsideAndNeverTouchMemory) {
  // Every index against sizes 0..3: in range it reads data[index * stride],
  // outside it gives 0 through a null pointer (so any touch would crash).
  const int32_t ints[3] = {7, -8, 9};
  const float floats[3] = {0.5f, -1.5f, 2.25f};
  const pagedc_bf16 bf16s[3] = {{0x3f80}, {0xc000}, {0x4040}}; // 1, -2, 3
  for (int64_t size = 0; size <= 3; ++size)
    for (int64_t index : {int64_t(kMin), int64_t(-1), int64_t(0), int64_t(1),
                          int64_t(2), int64_t(3), int64_t(kMax),
                          std::numeric_limits<int64_t>::max()}) {
      bool ok = pagedc_mods::flex_index_ok(index, size);
      EXPECT_EQ(ok, index >= 0 && index < size) << index << " of " << size;
      int64_t offset = pagedc_mods::flex_index_term(index, ok, 1);
      EXPECT_EQ(offset, ok ? index : 0);
      EXPECT_EQ(pagedc_mods::flex_load(ok ? ints : nullptr, ok, offset),
                ok ? ints[index] : 0);
      EXPECT_EQ(pagedc_mods::flex_load(ok ? floats : nullptr, ok, offset),
                ok ? floats[index] : 0.0f);
      EXPECT_EQ(pagedc_mods::flex_load(ok ? bf16s : nullptr, ok, offset),
                ok ? float(1 + index) * (index == 1 ? -1.0f : 1.0f) : 0.0f);
    }
  // A huge index times a stride would overflow: out of range, the term is 0.
  EXPECT_EQ(pagedc_mods::flex_index_term(std::numeric_limits<int64_t>::max(),
                                         false, 1 << 20),
            0);
}

TEST(BufferBounds, GeneratedCudaChecksEveryIndex) {
  if (!jit::cudaCodeGenAvailable())
    GTEST_SKIP() << "no CUDA code generator in this build";
  CompiledMods mods = compile(
      "buffer t: f32[?, ?]\nmask m(b, h, q, kv) = t[q, kv] > 0.5\n",
      /*withCuda=*/true);
  const std::string &code = mods.cuda.modCode;
  size_t hooks = code.find("mask_row");
  ASSERT_NE(hooks, std::string::npos) << code;
  std::string generated = code.substr(hooks);
  EXPECT_NE(code.find("int64_t t_size[2];"), std::string::npos) << code;
  for (const char *use : {"t_size[0]", "t_size[1]", "flex_load("})
    EXPECT_NE(generated.find(use), std::string::npos) << use << "\n" << generated;
  // The only read of the buffer is through flex_load.
  EXPECT_EQ(generated.find(".t["), std::string::npos) << generated;
}

} // namespace
