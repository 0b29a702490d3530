//===- TestMods.h - Hand-written mods matching ModABI.h --------*- C++ -*-===//
//
// Ordinary C++ functions with the ABI of compiled mods, so the runtime tests
// need no compiler.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_RUNTIME_TESTMODS_H
#define PAGEDC_TEST_UNIT_RUNTIME_TESTMODS_H

#include "pagedc/ModABI.h"
#include "pagedc/Mods.h"

#include <algorithm>
#include <cstdint>

namespace pagedc::test {

/// q >= kv.
inline void causalRow(const PagedcModContext *, int32_t, int32_t, int32_t q, int32_t kvBegin,
                      int32_t count, uint8_t *out) {
  for (int32_t i = 0; i < count; ++i)
    out[i] = q >= kvBegin + i;
}
inline int32_t causalClass(const PagedcModContext *, int32_t, int32_t, int32_t qLo, int32_t qHi,
                           int32_t kvLo, int32_t kvHi) {
  if (qLo >= kvHi)
    return 2;
  if (qHi < kvLo)
    return 0;
  return 1;
}

/// 0 <= q - kv < window, window = param 0 (i32).
inline void slidingWindowRow(const PagedcModContext *context, int32_t, int32_t, int32_t q,
                             int32_t kvBegin, int32_t count, uint8_t *out) {
  const int32_t window = context->params[0].i32;
  for (int32_t i = 0; i < count; ++i) {
    const int64_t distance = static_cast<int64_t>(q) - (kvBegin + i);
    out[i] = distance >= 0 && distance < window;
  }
}
inline int32_t slidingWindowClass(const PagedcModContext *context, int32_t, int32_t, int32_t qLo,
                                  int32_t qHi, int32_t kvLo, int32_t kvHi) {
  const int64_t window = context->params[0].i32;
  const int64_t minDistance = static_cast<int64_t>(qLo) - kvHi;
  const int64_t maxDistance = static_cast<int64_t>(qHi) - kvLo;
  if (minDistance >= 0 && maxDistance < window)
    return 2;
  if (maxDistance < 0 || minDistance >= window)
    return 0;
  return 1;
}

/// A mask of q - kv alone read from buffer 0 (u8, indexed by q - kv + param 0).
inline void differenceTableRow(const PagedcModContext *context, int32_t, int32_t, int32_t q,
                               int32_t kvBegin, int32_t count, uint8_t *out) {
  const auto *table = static_cast<const uint8_t *>(context->buffers[0].data);
  const int32_t offset = context->params[0].i32;
  for (int32_t i = 0; i < count; ++i)
    out[i] = table[q - (kvBegin + i) + offset];
}

/// A mask with runs of full, empty and mixed regions that depends on b and h:
/// region (q / param 0, kv / param 1) picks a kind by hash; mixed regions
/// hash every element.
inline uint32_t mixHash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
inline void regionHashRow(const PagedcModContext *context, int32_t b, int32_t h, int32_t q,
                          int32_t kvBegin, int32_t count, uint8_t *out) {
  const uint32_t qRegion = context->params[0].i32, kvRegion = context->params[1].i32;
  const uint32_t seed = context->params[2].i32;
  for (int32_t i = 0; i < count; ++i) {
    const uint32_t kv = kvBegin + i;
    const uint32_t region = mixHash(seed ^ mixHash(b * 131u + h * 17u) ^
                                    mixHash((q / qRegion) * 7919u + kv / kvRegion));
    const uint32_t kind = region % 3;
    if (kind == 0)
      out[i] = 0;
    else if (kind == 1)
      out[i] = 1;
    else
      out[i] = mixHash(region ^ (q * 2654435761u) ^ kv) % 2;
  }
}

/// A CompiledMods with a mask mod and the given dependence.
inline CompiledMods maskMods(PagedcMaskRowFn row, PagedcBlockClassFn blockClass = nullptr,
                             bool dependsOnB = false, bool dependsOnH = false,
                             bool diagonal = false) {
  CompiledMods mods;
  mods.maskName = "mask";
  mods.maskRow = row;
  mods.maskBlockClass = blockClass;
  mods.maskDependence.b = dependsOnB;
  mods.maskDependence.h = dependsOnH;
  mods.maskDependence.diagonal = diagonal;
  return mods;
}

} // namespace pagedc::test

#endif // PAGEDC_TEST_UNIT_RUNTIME_TESTMODS_H
