//===- FlexArithmetic.h - PyTorch floor division and remainder -*- C++ -*-===//
//
// The scalar semantics of flex.floordiv and flex.floormod, shared by the
// folders and by anything that evaluates mods on the host (reference
// evaluators, tests), so that every evaluation agrees with PyTorch.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_DIALECTS_FLEX_FLEXARITHMETIC_H
#define PAGEDC_DIALECTS_FLEX_FLEXARITHMETIC_H

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace pagedc::flex {

/// Python/PyTorch `a // b` on integers: the quotient rounded toward negative
/// infinity. Requires b != 0 and not (a == min && b == -1).
template <typename Int>
std::enable_if_t<std::is_integral_v<Int>, Int> floorDiv(Int a, Int b) {
  Int quotient = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0)))
    --quotient;
  return quotient;
}

/// Python/PyTorch `a % b` on integers: the remainder takes the sign of the
/// divisor. Requires b != 0.
template <typename Int>
std::enable_if_t<std::is_integral_v<Int>, Int> floorMod(Int a, Int b) {
  Int remainder = a % b;
  if (remainder != 0 && ((remainder < 0) != (b < 0)))
    remainder += b;
  return remainder;
}

/// `torch.floor_divide` on floats: floor of the quotient computed via fmod,
/// which rounds better than floor(a / b). Division by zero gives a / b.
template <typename Float>
std::enable_if_t<std::is_floating_point_v<Float>, Float> floorDiv(Float a,
                                                                   Float b) {
  if (b == 0)
    return a / b;
  Float remainder = std::fmod(a, b);
  Float quotient = (a - remainder) / b;
  if (remainder != 0 && ((b < 0) != (remainder < 0)))
    quotient -= 1;
  if (quotient == 0)
    return std::copysign(Float(0), a / b);
  Float floored = std::floor(quotient);
  if (quotient - floored > Float(0.5))
    floored += 1;
  return floored;
}

/// `torch.remainder` on floats: fmod adjusted to take the sign of the
/// divisor. A zero divisor gives NaN.
template <typename Float>
std::enable_if_t<std::is_floating_point_v<Float>, Float> floorMod(Float a,
                                                                   Float b) {
  Float remainder = std::fmod(a, b);
  if (remainder != 0 && ((b < 0) != (remainder < 0)))
    remainder += b;
  return remainder;
}

//===----------------------------------------------------------------------===//
// Run-time integer semantics of the language, with every edge case defined
// (docs/language.md, "Integer edge cases"). Values are signed integers of
// `width` bits (32 or 64) held in int64; results wrap to `width` bits. The
// CPU JIT (FlexToCPU), the CUDA helpers (compiler/Conversion/CUDA/
// Prelude.cuh) and the float64 reference evaluator all give these results;
// none of them ever traps.
//===----------------------------------------------------------------------===//

/// `value` wrapped to a signed integer of `width` bits (two's complement).
inline int64_t wrapToWidth(uint64_t value, unsigned width) {
  if (width >= 64)
    return static_cast<int64_t>(value);
  uint64_t mask = (uint64_t(1) << width) - 1;
  uint64_t bits = value & mask;
  if (bits >> (width - 1))
    bits |= ~mask;
  return static_cast<int64_t>(bits);
}

/// `a // b`: floor division; `x // 0 == 0`; `MIN // -1 == MIN` (wraps).
inline int64_t intFloorDiv(int64_t a, int64_t b, unsigned width) {
  if (b == 0)
    return 0;
  if (b == -1)
    return wrapToWidth(uint64_t(0) - uint64_t(a), width);
  return wrapToWidth(uint64_t(floorDiv(a, b)), width);
}

/// `a % b`: floor modulo; `x % 0 == x` (so `a == (a // b) * b + a % b`
/// still holds); `x % -1 == 0`.
inline int64_t intFloorMod(int64_t a, int64_t b, unsigned width) {
  if (b == 0)
    return wrapToWidth(uint64_t(a), width);
  if (b == -1)
    return 0;
  return wrapToWidth(uint64_t(floorMod(a, b)), width);
}

/// `a << b`: 0 when `b < 0` or `b >= width` (PyTorch's rule); wraps.
inline int64_t intShiftLeft(int64_t a, int64_t b, unsigned width) {
  if (b < 0 || b >= int64_t(width))
    return 0;
  return wrapToWidth(uint64_t(a) << b, width);
}

/// `a >> b` (arithmetic): `b < 0` or `b >= width` shifts by `width - 1`,
/// i.e. gives 0 or -1 by the sign of `a` (PyTorch's rule).
inline int64_t intShiftRight(int64_t a, int64_t b, unsigned width) {
  a = wrapToWidth(uint64_t(a), width);
  if (b < 0 || b >= int64_t(width))
    b = width - 1;
  return a >> b;
}

/// `int(x)` of a float: truncation toward zero, saturating at the limits of
/// `width` bits (+-inf included); NaN gives 0.
inline int64_t floatToInt(double x, unsigned width) {
  if (std::isnan(x))
    return 0;
  double limit = std::ldexp(1.0, int(width) - 1); // 2^(width-1)
  if (x >= limit)
    return wrapToWidth((uint64_t(1) << (width - 1)) - 1, width);
  if (x < -limit)
    return wrapToWidth(uint64_t(1) << (width - 1), width);
  return static_cast<int64_t>(std::trunc(x));
}

/// `a ** b` on integers: by squaring, wrapping on overflow. A negative
/// exponent gives the true value truncated toward zero: 1 for `a == 1`,
/// +-1 for `a == -1`, 0 otherwise (also for `a == 0`, like `x // 0`).
inline int64_t intPower(int64_t a, int64_t b, unsigned width) {
  if (b < 0) {
    if (a == 1)
      return 1;
    if (a == -1)
      return (b & 1) ? -1 : 1;
    return 0;
  }
  uint64_t result = 1, base = uint64_t(a);
  for (uint64_t e = uint64_t(b); e != 0; e >>= 1) {
    if (e & 1)
      result *= base;
    base *= base;
  }
  return wrapToWidth(result, width);
}

} // namespace pagedc::flex

#endif // PAGEDC_DIALECTS_FLEX_FLEXARITHMETIC_H
