//===- KeyBounds.h - Keys a mask keeps, bounded by its classifier -*- C++ -*-===//
//
// BatchAttention's plan() narrows the keys a sequence, or a prefill tile of
// its rows, reads to those its mask may keep, by the mask's block classifier
// (CompiledMods::maskBlockClass): the keys left out are proven masked for
// every row, so results do not change.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_KEYBOUNDS_H
#define PAGEDC_RUNTIME_KEYBOUNDS_H

#include "pagedc/Mods.h"

#include <cstdint>

namespace pagedc::detail {

/// Keys a classifier answer covers: whole 64-key tiles, as the kernels read
/// a range from the tile that holds its first key.
constexpr int32_t kKeyGranule = 64;

/// Whether the mask's block classifier can bound keys when plan() runs: it
/// reads no params or buffers (bound only at run()) and not the head (one
/// bound serves every head).
bool classifiesAtPlan(const CompiledMods &mods);

/// The first key of [from, to) that the mask may keep for a row of
/// positions [qLo, qHi] of sequence b: every key before it is proven masked
/// (class 0); `to` when every key is. In whole granules from `from`.
int32_t firstKeyKept(const CompiledMods &mods, int32_t b, int32_t qLo, int32_t qHi, int32_t from,
                     int32_t to);

/// One past the last key of [from, to) that the mask may keep for a row of
/// positions [qLo, qHi] of sequence b: every key from it on is proven
/// masked; `from` when every key is. A multiple of the granule (or `to`).
int32_t endOfKeysKept(const CompiledMods &mods, int32_t b, int32_t qLo, int32_t qHi, int32_t from,
                      int32_t to);

} // namespace pagedc::detail

#endif // PAGEDC_RUNTIME_KEYBOUNDS_H
