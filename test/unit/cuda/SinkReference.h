//===- SinkReference.h - Attention sinks applied to a float64 result -*- C++ -*-===//
//
// The expected result of attention with sinks, from the float64 reference
// without them: a sink is one more key of logit `sink` and value zero, so
// a row's (out, lse) merges with the state (0, sink):
//   lse' = log(exp(lse) + exp(sink)),  out' = out * exp(lse - lse').
// A fully masked row (lse = -inf, out 0) gives out 0 and lse = sink.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CUDA_SINKREFERENCE_H
#define PAGEDC_TEST_UNIT_CUDA_SINKREFERENCE_H

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace pagedc::testutil {

/// Applies `sink` to one row: `lse` and its `width` outputs at `out`.
inline void applySink(double sink, double &lse, double *out, int64_t width) {
  const double top = std::max(lse, sink);
  const double merged = top + std::log(std::exp(lse - top) + std::exp(sink - top));
  const double weight = std::isinf(lse) ? 0.0 : std::exp(lse - merged);
  for (int64_t d = 0; d < width; ++d)
    out[d] *= weight;
  lse = merged;
}

} // namespace pagedc::testutil

#endif // PAGEDC_TEST_UNIT_CUDA_SINKREFERENCE_H
