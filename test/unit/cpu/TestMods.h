//===- TestMods.h - Hand-written mods for the CPU attention tests -*- C++ -*-===//
//
// A small "program" of mask and score mods written directly against the mod
// ABI, each with its float64 reference twin, so the CPU kernels can be tested
// without the compiler. Every mod reads the same declarations:
//   buffer doc: i32[B, S]      document id per (batch, position)
//   buffer slopes: f32[H]      ALiBi slope per query head
//   param window: i32          sliding window size
//   param temperature: f32     multiplies the score in alibi
//   param softcap: f32         tanh soft-capping bound
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CPU_TESTMODS_H
#define PAGEDC_TEST_UNIT_CPU_TESTMODS_H

#include "pagedc/ModABI.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pagedc::testutil {

/// Mask mods: "" (none), "causal", "sliding", "document" (document and
/// causal), "holes" (causal, and rows with (q + h) % 3 == 0 fully masked),
/// "window" (causal, the 100 keys ending at the query: a constant, not the
/// param; with a block classifier), "never" (masks everything; its
/// classifier answers 0), "prefix_lm" (kv < prefix[b] or causal; it
/// alone also declares `buffer prefix: i32[B]`, bound per sequence).
/// Score mods: "" (none), "alibi" (s * temperature + slopes[h] * (kv - q)),
/// "softcap" (softcap * tanh(s / softcap)).
/// Throws pagedc::Error for an unknown name. The mods carry their CUDA code
/// too (CompiledMods::cuda.modCode, for the CUDA kernels on the emulator).
CompiledMods makeTestMods(const std::string &mask, const std::string &score);

/// Owns the buffers and params the test mods read, laid out in declaration
/// order, and the context that points at them.
class TestBindings {
public:
  /// Documents of random lengths (1 .. 2 * meanDocument) per batch over
  /// `length` positions; slopes 2^(-8 (h + 1) / heads).
  TestBindings(int64_t batch, int64_t heads, int64_t length, uint64_t seed,
               int32_t window = 17, float temperature = 1.5f, float softcap = 2.0f,
               int32_t meanDocument = 24);
  TestBindings(const TestBindings &) = delete;
  TestBindings &operator=(const TestBindings &) = delete;

  const PagedcModContext *context() const { return &context_; }
  const std::vector<int32_t> &documents() const { return documents_; }

private:
  std::vector<int32_t> documents_; // [batch, length]
  std::vector<float> slopes_;      // [heads]
  PagedcBufferRef buffers_[2];
  PagedcParamSlot params_[3];
  PagedcModContext context_;
};

} // namespace pagedc::testutil

#endif // PAGEDC_TEST_UNIT_CPU_TESTMODS_H
