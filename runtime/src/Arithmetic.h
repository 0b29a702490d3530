//===- Arithmetic.h - Integer helpers shared by the runtime -----*- C++ -*-===//
//
// Internal to the runtime library (not installed).
//
//===----------------------------------------------------------------------===//

#ifndef PAGEDC_RUNTIME_ARITHMETIC_H
#define PAGEDC_RUNTIME_ARITHMETIC_H

#include <cstdint>

namespace pagedc {

/// ceil(a / b) for b > 0 and any a, without overflow: `(a + b - 1) / b`
/// overflowed for a near INT64_MAX, which callers reach before they have
/// validated their lengths.
inline int64_t ceilDiv(int64_t a, int64_t b) { return a / b + (a % b > 0); }

} // namespace pagedc

#endif // PAGEDC_RUNTIME_ARITHMETIC_H
