//===- KeyBounds.cpp - Keys a mask keeps, bounded by its classifier --------===//
//
// Both bounds search the granules by bisection. Every bound returned was
// proven by a classifier call, so it is exact for any classifier, and as
// tight as the granules for one whose answer only widens with the interval
// (interval arithmetic's). Each tries first where a causal mask's bound
// lies, which it then answers in two or three calls.
//
//===----------------------------------------------------------------------===//
#include "KeyBounds.h"

namespace pagedc::detail {

namespace {

/// Whether every key of [kvLo, kvHi] is masked for every row of [qLo, qHi].
bool masked(const CompiledMods &mods, int32_t b, int32_t qLo, int32_t qHi, int32_t kvLo,
            int32_t kvHi) {
  const PagedcModContext none{nullptr, nullptr};
  return mods.maskBlockClass(&none, b, 0, qLo, qHi, kvLo, kvHi) == 0;
}

/// The largest count k in [0, most] of granules for which `holds(k)`, where
/// holds(0) is true and holds is taken to fall to false past some k; the
/// count `guess` is tried first (and the one after it).
template <typename Holds> int32_t largestHolding(int32_t most, int32_t guess, Holds holds) {
  int32_t lo = 0, hi = most + 1; // holds(lo) is known; hi is past what holds
  if (guess >= 1 && guess <= most) {
    if (holds(guess)) {
      lo = guess;
      if (guess == most || !holds(guess + 1))
        return guess;
      lo = guess + 1;
    } else {
      hi = guess;
    }
  }
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (holds(mid))
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

} // namespace

bool classifiesAtPlan(const CompiledMods &mods) {
  const ModDependence &d = mods.maskDependence;
  return mods.hasMask() && mods.maskBlockClass && d.params.empty() && d.buffers.empty() && !d.h;
}

int32_t firstKeyKept(const CompiledMods &mods, int32_t b, int32_t qLo, int32_t qHi, int32_t from,
                     int32_t to) {
  if (to <= from)
    return from;
  if (masked(mods, b, qLo, qHi, from, to - 1))
    return to;
  // k granules from `from` are masked; the last whole granule ends at or
  // before `to`, and all of [from, to) is not masked (above).
  // (A causal mask keeps the first key: one granule answers it.)
  const int32_t granules = (to - from) / kKeyGranule;
  const int32_t k = largestHolding(granules, 1, [&](int32_t count) {
    return count * kKeyGranule < to - from &&
           masked(mods, b, qLo, qHi, from, from + count * kKeyGranule - 1);
  });
  return from + k * kKeyGranule;
}

int32_t endOfKeysKept(const CompiledMods &mods, int32_t b, int32_t qLo, int32_t qHi, int32_t from,
                      int32_t to) {
  if (to <= from)
    return to;
  if (masked(mods, b, qLo, qHi, from, to - 1))
    return from;
  // The candidate ends are the granule starts above `from`, counted down
  // from the one holding key to - 1 (so that a tile's keys end on a tile of
  // the kernels'): end k is base - (k - 1) granules.
  const int32_t base = (to - 1) / kKeyGranule * kKeyGranule;
  if (base <= from)
    return to;
  const int32_t ends = (base - from - 1) / kKeyGranule + 1; // those above `from`
  auto endOf = [&](int32_t k) { return base - (k - 1) * kKeyGranule; };
  // (A causal mask keeps the keys up to the last row's: the end is the
  // first granule start past it.)
  const int32_t past = (qHi + kKeyGranule) / kKeyGranule * kKeyGranule;
  const int32_t guess = past <= base ? (base - past) / kKeyGranule + 1 : 0;
  const int32_t k = largestHolding(ends, guess, [&](int32_t count) {
    return masked(mods, b, qLo, qHi, endOf(count), to - 1);
  });
  return k == 0 ? to : endOf(k);
}

} // namespace pagedc::detail
