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

} // namespace pagedc::flex

#endif // PAGEDC_DIALECTS_FLEX_FLEXARITHMETIC_H
