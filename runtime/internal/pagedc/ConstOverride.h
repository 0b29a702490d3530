//===- ConstOverride.h - Strict parsing of -D NAME=VALUE values -*- C++ -*-===//
//
// The one parser of `-D` values, shared by `pagedc`, `pagedc run`, the
// front end (Sema) and `pagedc-jit`. Header-only and free of LLVM so that
// runtime-only tools can use it.
//
// The whole value must be one of (no spaces, no '+', at most one '-'):
//
//   value = [ "-" ] ( INT | FLOAT | "inf" )
//   INT   = digit { digit }                      (must fit in i32)
//   FLOAT = digits "." [ digits ] [ exponent ] | "." digits [ exponent ]
//         | digits exponent                      (must be within f32's
//                                                 finite range)
//   exponent = ( "e" | "E" ) [ "+" | "-" ] digits
//
// i.e. the literals of the language with an optional leading minus.
// Constants are ints or floats, so `true`/`false` are not values.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CONSTOVERRIDE_H
#define PAGEDC_CONSTOVERRIDE_H

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>

namespace pagedc {

/// Float constants are f32 on every backend. A double whose magnitude is at
/// least FLT_MAX + half an ulp of it (2^128 - 2^103) rounds to infinity in
/// f32, so a literal or -D value that large would silently become inf;
/// these are errors instead. Values that round to zero stay allowed.
inline constexpr double kF32RoundsToInfinity = 0x1.ffffffp+127;

/// How errors state the range of a float: "(f32: magnitude at most
/// 3.40282347e+38; use inf for infinity)".
inline constexpr const char *kF32RangeText =
    "(f32: magnitude at most 3.40282347e+38; use inf for infinity)";

/// Whether `value` (a finite double, or +-inf from a decimal literal that
/// overflowed double) rounds outside f32's finite range.
inline bool outsideF32Range(double value) {
  return !std::isnan(value) && std::fabs(value) >= kF32RoundsToInfinity;
}

/// A parsed `-D` value.
struct ConstOverrideValue {
  bool isInt = true;
  int32_t intValue = 0;
  double floatValue = 0;
};

/// Parses `text` as a `-D` value. Returns an empty string on success, else
/// the reason ("is not an int or float literal", "does not fit in i32",
/// "is out of the range of a float").
inline std::string parseConstOverride(std::string_view text,
                                      ConstOverrideValue &result) {
  const std::string malformed =
      "is not an int or float literal (e.g. 4096, -1, 0.5, 1e-3, inf)";
  bool negative = !text.empty() && text.front() == '-';
  std::string_view body = negative ? text.substr(1) : text;
  if (body == "inf") {
    result.isInt = false;
    result.floatValue = negative ? -INFINITY : INFINITY;
    return "";
  }
  auto isDigit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0;
  auto digits = [&]() {
    size_t start = i;
    while (i < body.size() && isDigit(body[i]))
      ++i;
    return i - start;
  };
  size_t intDigits = digits();
  bool isFloat = false;
  if (i < body.size() && body[i] == '.') {
    ++i;
    size_t fractionDigits = digits();
    if (intDigits == 0 && fractionDigits == 0)
      return malformed;
    isFloat = true;
  } else if (intDigits == 0) {
    return malformed;
  }
  if (i < body.size() && (body[i] == 'e' || body[i] == 'E')) {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-'))
      ++i;
    if (digits() == 0)
      return malformed;
    isFloat = true;
  }
  if (i != body.size())
    return malformed;

  const char *first = text.data();
  const char *last = text.data() + text.size();
  if (!isFloat) {
    int64_t value = 0;
    auto [end, error] = std::from_chars(first, last, value);
    if (error == std::errc::result_out_of_range || end != last ||
        value < std::numeric_limits<int32_t>::min() ||
        value > std::numeric_limits<int32_t>::max())
      return "does not fit in i32 (-2147483648 to 2147483647)";
    if (error != std::errc())
      return malformed;
    result.isInt = true;
    result.intValue = static_cast<int32_t>(value);
    return "";
  }
  double value = 0;
  auto [end, error] = std::from_chars(first, last, value);
  // from_chars says out-of-range both for overflow and for underflow and
  // then leaves `value` unset; strtod (the language's lexer's reader) gives
  // inf for the one and the rounded tiny value for the other, which stays
  // allowed as in the language.
  if (error == std::errc::result_out_of_range)
    value = std::strtod(std::string(text).c_str(), nullptr);
  else if (error != std::errc() || end != last)
    return malformed;
  if (outsideF32Range(value))
    return std::string("is out of the range of a float ") + kF32RangeText;
  result.isInt = false;
  result.floatValue = value;
  return "";
}

} // namespace pagedc

#endif // PAGEDC_CONSTOVERRIDE_H
