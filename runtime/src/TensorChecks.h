//===- TensorChecks.h - Argument checks shared by the calls ----*- C++ -*-===//
//
// The checks flexAttention, BatchAttention and mergeState make of their
// tensor arguments, and of 8-bit caches' scales, with the same messages.
// Internal to the runtime library (not installed).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_TENSORCHECKS_H
#define PAGEDC_RUNTIME_TENSORCHECKS_H

#include "pagedc/Error.h"
#include "pagedc/Tensor.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace pagedc::detail {

/// A default-constructed view means "not given".
inline bool isProvided(const TensorView &view) {
  return view.data() != nullptr || view.rank() != 0;
}

/// The element types the CPU backend computes with.
inline bool isCpuFloat(DType type) { return type == DType::F32 || type == DType::BF16; }

/// "[2, 3]": any shape, also one no tensor may have (the .npy reader names
/// those in its errors); TensorView::shapeString writes a tensor's with it.
inline std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

/// Inputs may broadcast (stride 0) but not run backwards, and need data.
inline void checkReadable(const TensorView &view, const char *name) {
  for (int d = 0; d < view.rank(); ++d)
    if (view.stride(d) < 0)
      throw Error(fmt::format("{} has negative stride {} in dimension {}", name, view.stride(d),
                              d));
  if (view.data() == nullptr && view.numel() != 0)
    throw Error(fmt::format("{} has no data", name));
}

/// Output tensors must not alias themselves: every dimension longer than 1
/// needs a positive stride.
inline void checkWritable(const TensorView &view, const char *name) {
  for (int d = 0; d < view.rank(); ++d)
    if (view.size(d) > 1 && view.stride(d) < 1)
      throw Error(fmt::format("{} has stride {} in dimension {}; outputs need positive strides",
                              name, view.stride(d), d));
}

/// Attention sinks, when given: f32 [heads], contiguous, on `device`, with
/// data. The values are not read here (on a GPU they are in device memory):
/// -inf is "no sink" for that head and NaN gives NaN rows.
inline void checkSinks(const TensorView &sinks, int64_t heads, Device device, const char *name) {
  if (!isProvided(sinks))
    return;
  if (sinks.rank() != 1 || sinks.size(0) != heads)
    throw Error(fmt::format("{} must be [Hq] = [{}] (one logit per query head) but has shape {}",
                            name, heads, sinks.shapeString()));
  if (sinks.dtype() != DType::F32)
    throw Error(fmt::format("{} is {} but must be f32", name, dtypeName(sinks.dtype())));
  if (sinks.device() != device)
    throw Error(fmt::format("{} is on {} but the call runs on {}", name, deviceName(sinks.device()),
                            deviceName(device)));
  if (heads > 1 && sinks.stride(0) != 1)
    throw Error(fmt::format("{} must be contiguous but has stride {}", name, sinks.stride(0)));
  if (sinks.data() == nullptr && heads != 0)
    throw Error(fmt::format("{} has no data", name));
  // The kernels load them as floats where they lie.
  if (reinterpret_cast<uintptr_t>(sinks.data()) % alignof(float) != 0)
    throw Error(fmt::format("{}' data is not {}-byte aligned", name, alignof(float)));
}

/// The scales of a cache of `stored` type, one per head: required (one
/// value, or one per head; finite, > 0) for 8-bit floats, refused for the
/// others (then empty).
inline std::vector<float> checkedScales(const std::vector<float> &given, DType stored,
                                        int64_t heads, const char *name) {
  if (!isFloat8(stored)) {
    if (!given.empty())
      throw Error(fmt::format("{} applies to 8-bit float caches only; the cache stores {}", name,
                              dtypeName(stored)));
    return {};
  }
  if (given.size() != 1 && static_cast<int64_t>(given.size()) != heads)
    throw Error(given.empty()
                    ? fmt::format("an {} cache needs {}: one value, or one per KV head ({})",
                                  dtypeName(stored), name, heads)
                    : fmt::format("{} has {} values; give one, or one per KV head ({})", name,
                                  given.size(), heads));
  for (size_t h = 0; h < given.size(); ++h)
    if (!std::isfinite(given[h]) || !(given[h] > 0.0f))
      throw Error(fmt::format("{}[{}] = {} must be finite and greater than 0", name, h,
                              given[h]));
  return given.size() == 1 ? std::vector<float>(static_cast<size_t>(heads), given[0]) : given;
}

} // namespace pagedc::detail

#endif // PAGEDC_RUNTIME_TENSORCHECKS_H
