//===- Prelude.cuh - Helpers called by generated mod code -------*- CUDA -*-===//
//
// Generated mod code (flex -> EmitC -> C++) calls these helpers for the
// operations whose PyTorch semantics C does not have: floor division and
// modulo with the sign of the divisor, NaN-propagating min/max, the hardware
// tanh. The text is embedded in the compiler and placed ahead of the generated
// functions. It relies on templates/Prelude.cuh, which starts every kernel TU
// (fixed-width integers, pagedc::tanh_approx, pagedc::to_float).
//
// Numerics follow PyTorch's f32 CUDA kernels: precise expf/tanhf/... (no fast
// math); only `tanh_approx` uses the approximate hardware instruction.
//
//===----------------------------------------------------------------------===//
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif

namespace pagedc_mods {

/// The unsigned type of the same width, for arithmetic that wraps.
template <typename Int> struct flex_unsigned;
template <> struct flex_unsigned<int32_t> { using type = uint32_t; };
template <> struct flex_unsigned<int64_t> { using type = uint64_t; };

/// Python's `a // b` on integers: the quotient rounded toward -infinity.
/// Edge cases as docs/language.md defines them (never a trap, never UB):
/// `a // 0 == 0`, `a // -1 == -a` (MIN // -1 wraps to MIN).
template <typename Int>
__device__ __forceinline__ Int flex_floordiv_int(Int a, Int b) {
  using U = typename flex_unsigned<Int>::type;
  if (b == 0)
    return 0;
  if (b == -1)
    return static_cast<Int>(U(0) - static_cast<U>(a));
  Int quotient = a / b;
  Int remainder = a % b;
  return (remainder != 0 && ((remainder < 0) != (b < 0))) ? quotient - 1
                                                          : quotient;
}
__device__ __forceinline__ int32_t flex_floordiv(int32_t a, int32_t b) {
  return flex_floordiv_int(a, b);
}
__device__ __forceinline__ int64_t flex_floordiv(int64_t a, int64_t b) {
  return flex_floordiv_int(a, b);
}

/// Python's `a // b` on floats (PyTorch's floor_divide): computed from fmod
/// so that `a == b * (a // b) + a % b` holds as closely as floats allow.
__device__ __forceinline__ float flex_floordiv(float a, float b) {
  if (b == 0.0f)
    return a / b;
  float remainder = fmodf(a, b);
  float quotient = (a - remainder) / b;
  if (remainder != 0.0f && ((b < 0.0f) != (remainder < 0.0f)))
    quotient -= 1.0f;
  if (quotient == 0.0f)
    return copysignf(0.0f, a / b);
  float floored = floorf(quotient);
  return quotient - floored > 0.5f ? floored + 1.0f : floored;
}

/// Python's `a % b` on integers: the remainder takes the sign of the divisor.
/// `a % 0 == a`, `a % -1 == 0`.
template <typename Int>
__device__ __forceinline__ Int flex_floormod_int(Int a, Int b) {
  if (b == 0)
    return a;
  if (b == -1)
    return 0;
  Int remainder = a % b;
  return (remainder != 0 && ((remainder < 0) != (b < 0))) ? remainder + b
                                                          : remainder;
}
__device__ __forceinline__ int32_t flex_floormod(int32_t a, int32_t b) {
  return flex_floormod_int(a, b);
}
__device__ __forceinline__ int64_t flex_floormod(int64_t a, int64_t b) {
  return flex_floormod_int(a, b);
}

/// Python's `a % b` on floats (PyTorch's remainder).
__device__ __forceinline__ float flex_floormod(float a, float b) {
  float remainder = fmodf(a, b);
  return (remainder != 0.0f && ((b < 0.0f) != (remainder < 0.0f)))
             ? remainder + b
             : remainder;
}

/// Integer min/max/abs for any width (CUDA's overloads are ambiguous for
/// int64_t = long).
template <typename Int> __device__ __forceinline__ Int flex_min(Int a, Int b) {
  return b < a ? b : a;
}
template <typename Int> __device__ __forceinline__ Int flex_max(Int a, Int b) {
  return a < b ? b : a;
}
template <typename Int> __device__ __forceinline__ Int flex_abs(Int a) {
  using U = typename flex_unsigned<Int>::type;
  return a < 0 ? static_cast<Int>(U(0) - static_cast<U>(a)) : a; // abs(MIN) == MIN
}

/// Buffer reads (docs/language.md, "Buffer reads"): an index outside
/// [0, size) of its dimension makes the read give 0 without touching memory.
/// (A size is never negative, so one unsigned compare tests both ends.)
__device__ __forceinline__ bool flex_index_ok(int64_t index, int64_t size) {
  return static_cast<uint64_t>(index) < static_cast<uint64_t>(size);
}
/// index * stride for an index in range, else 0 (no overflow either way).
__device__ __forceinline__ int64_t flex_index_term(int64_t index, bool ok,
                                                   int64_t stride) {
  return ok ? index * stride : 0;
}
#ifdef __CUDA_ARCH__
/// One predicated read (PTX `@p ld.global.nc`): with `ok` false it gives 0
/// and reads nothing. Written as `ok ? data[offset] : 0`, the reads of the
/// bias mods made ptxas spill the warpgroup prefill's 128-key tile (8-36
/// bytes at head dim 128, 55 of the corpus's 313 selections; the key_bias
/// trip round the KV-tile loop stored and reloaded 4 registers); written
/// this way none spills (bench/README.md, "Buffer reads as predicated
/// loads"). Not volatile and without a memory clobber: a buffer is
/// read-only while a kernel runs.
// NAME(p, ok): `mov.MOV v, 0; @ok ld.global.nc.LD v, [p]` into a TYPE held
// in a register of constraint CONSTRAINT.
#define PAGEDC_FLEX_READ(NAME, TYPE, MOV, LD, CONSTRAINT)                          \
  __device__ __forceinline__ TYPE NAME(const void *p, bool ok) {                   \
    TYPE v;                                                                        \
    asm("{\n .reg .pred q;\n setp.ne.u32 q, %2, 0;\n mov." MOV " %0, 0;\n"          \
        " @q ld.global.nc." LD " %0, [%1];\n}"                                      \
        : "=" CONSTRAINT(v) : "l"(p), "r"(static_cast<uint32_t>(ok)));             \
    return v;                                                                      \
  }
PAGEDC_FLEX_READ(flex_read_b16, uint16_t, "b16", "b16", "h")
PAGEDC_FLEX_READ(flex_read_b32, uint32_t, "b32", "b32", "r")
PAGEDC_FLEX_READ(flex_read_b64, uint64_t, "b64", "b64", "l")
PAGEDC_FLEX_READ(flex_read_u8, uint32_t, "b32", "u8", "r")
#undef PAGEDC_FLEX_READ
__device__ __forceinline__ int32_t flex_load(const int32_t *data, bool ok, int64_t offset) {
  return static_cast<int32_t>(flex_read_b32(data + offset, ok));
}
__device__ __forceinline__ int64_t flex_load(const int64_t *data, bool ok, int64_t offset) {
  return static_cast<int64_t>(flex_read_b64(data + offset, ok));
}
__device__ __forceinline__ float flex_load(const float *data, bool ok, int64_t offset) {
  return __uint_as_float(flex_read_b32(data + offset, ok));
}
__device__ __forceinline__ bool flex_load(const bool *data, bool ok, int64_t offset) {
  return flex_read_u8(data + offset, ok) != 0;
}
__device__ __forceinline__ float flex_load(const pagedc_f16 *data, bool ok,
                                           int64_t offset) {
  return pagedc::to_float(pagedc_f16{flex_read_b16(data + offset, ok)});
}
__device__ __forceinline__ float flex_load(const pagedc_bf16 *data, bool ok,
                                           int64_t offset) {
  return pagedc::to_float(pagedc_bf16{flex_read_b16(data + offset, ok)});
}
#else
template <typename T>
__device__ __forceinline__ T flex_load(const T *data, bool ok, int64_t offset) {
  return ok ? data[offset] : T(0);
}
__device__ __forceinline__ float flex_load(const pagedc_f16 *data, bool ok,
                                           int64_t offset) {
  return ok ? pagedc::to_float(data[offset]) : 0.0f;
}
__device__ __forceinline__ float flex_load(const pagedc_bf16 *data, bool ok,
                                           int64_t offset) {
  return ok ? pagedc::to_float(data[offset]) : 0.0f;
}
#endif

/// `a << s`: 0 when s < 0 or s >= the width (PyTorch's rule); wraps.
template <typename Int>
__device__ __forceinline__ Int flex_shl(Int a, Int s) {
  using U = typename flex_unsigned<Int>::type;
  constexpr Int width = sizeof(Int) * 8;
  return (s < 0 || s >= width) ? Int(0)
                               : static_cast<Int>(static_cast<U>(a) << s);
}

/// `a >> s`, arithmetic: s < 0 or s >= the width shifts by width - 1.
template <typename Int>
__device__ __forceinline__ Int flex_shr(Int a, Int s) {
  constexpr Int width = sizeof(Int) * 8;
  return a >> ((s < 0 || s >= width) ? width - 1 : s);
}

/// `int(x)`: truncation toward zero, saturating at the i32 limits (+-inf
/// included); NaN gives 0.
__device__ __forceinline__ int32_t flex_float_to_int(float x) {
  if (x != x)
    return 0;
  if (x >= 2147483648.0f)
    return 2147483647;
  if (x < -2147483648.0f)
    return -2147483647 - 1;
  return static_cast<int32_t>(x);
}

/// torch.minimum / torch.maximum: a NaN operand gives NaN (fminf/fmaxf would
/// return the other operand).
__device__ __forceinline__ float flex_minimum(float a, float b) {
  return (a != a || b != b) ? NAN : fminf(a, b);
}
__device__ __forceinline__ float flex_maximum(float a, float b) {
  return (a != a || b != b) ? NAN : fmaxf(a, b);
}

/// Integer power by squaring, wrapping on overflow; a negative exponent
/// gives 1 for base 1, +-1 for base -1 and 0 otherwise (0 ** -n too).
template <typename Int>
__device__ __forceinline__ Int flex_ipow(Int base, Int exponent) {
  using U = typename flex_unsigned<Int>::type;
  if (exponent < 0) {
    if (base == 1)
      return 1;
    if (base == -1)
      return (exponent & 1) ? -1 : 1;
    return 0;
  }
  U result = 1, square = static_cast<U>(base);
  for (U e = static_cast<U>(exponent); e != 0; e >>= 1) {
    if (e & 1)
      result *= square;
    square *= square;
  }
  return static_cast<Int>(result);
}

/// Bit counts on 32- and 64-bit integers.
__device__ __forceinline__ int32_t flex_popcount(int32_t x) {
  return __popc(static_cast<unsigned>(x));
}
__device__ __forceinline__ int64_t flex_popcount(int64_t x) {
  return __popcll(static_cast<unsigned long long>(x));
}
__device__ __forceinline__ int32_t flex_clz(int32_t x) { return __clz(x); }
__device__ __forceinline__ int64_t flex_clz(int64_t x) {
  return __clzll(static_cast<long long>(x));
}
__device__ __forceinline__ int32_t flex_ctz(int32_t x) {
  return x == 0 ? 32 : __ffs(x) - 1;
}
__device__ __forceinline__ int64_t flex_ctz(int64_t x) {
  return x == 0 ? 64 : __ffsll(static_cast<long long>(x)) - 1;
}

} // namespace pagedc_mods
