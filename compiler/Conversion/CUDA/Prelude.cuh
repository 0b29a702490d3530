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

/// Python's `a // b` on integers: the quotient rounded toward -infinity.
/// Division by zero is undefined, as for C's `/`.
template <typename Int>
__device__ __forceinline__ Int flex_floordiv_int(Int a, Int b) {
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
template <typename Int>
__device__ __forceinline__ Int flex_floormod_int(Int a, Int b) {
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
  return a < 0 ? -a : a;
}

/// torch.minimum / torch.maximum: a NaN operand gives NaN (fminf/fmaxf would
/// return the other operand).
__device__ __forceinline__ float flex_minimum(float a, float b) {
  return (a != a || b != b) ? NAN : fminf(a, b);
}
__device__ __forceinline__ float flex_maximum(float a, float b) {
  return (a != a || b != b) ? NAN : fmaxf(a, b);
}

/// Integer power by squaring; a negative exponent gives 0 except for bases
/// 1 and -1 (MLIR's math.ipowi semantics).
template <typename Int>
__device__ __forceinline__ Int flex_ipow(Int base, Int exponent) {
  if (exponent < 0) {
    if (base == 1)
      return 1;
    if (base == -1)
      return (exponent & 1) ? -1 : 1;
    return 0;
  }
  Int result = 1;
  while (exponent != 0) {
    if (exponent & 1)
      result *= base;
    base *= base;
    exponent >>= 1;
  }
  return result;
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
