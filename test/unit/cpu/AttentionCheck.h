//===- AttentionCheck.h - Paged CPU attention vs the float64 reference -*- C++ -*-===//
//
// The reusable core of the attention correctness tests: given compiled mods,
// their bound context and a configuration, builds fresh random inputs, a
// paged cache with a shuffled page table and (optionally) a block mask by
// dense evaluation, runs cpu::pagedAttention with NaN-poisoned outputs and
// compares with cpu::referenceAttention. Library: pagedc_cpu_testing.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CPU_ATTENTIONCHECK_H
#define PAGEDC_TEST_UNIT_CPU_ATTENTIONCHECK_H

#include "cpu/CpuAttention.h"
#include "pagedc/BlockMask.h"
#include "pagedc/Mods.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pagedc::testutil {

struct AttentionConfig {
  int64_t batch = 2;
  int64_t qHeads = 4;
  int64_t kvHeads = 2;
  int64_t qLength = 37;
  int64_t dim = 64;
  int64_t vDim = 64;
  /// Per batch; empty = qLength for every sequence.
  std::vector<int32_t> kvLengths;
  /// Per batch; empty = 0 (or kvLength - qLength with qOffsetAtEnd).
  std::vector<int32_t> qOffsets;
  bool qOffsetAtEnd = false;
  int32_t pageSize = 16;
  /// Storage of q, K and V: F32, BF16 or F16. The reference reads the same
  /// (rounded) values.
  DType storage = DType::F32;
  /// F8E4M3 or F8E5M2: K and V are stored as 8-bit float codes with a scale
  /// per KV head instead (random values quantized, round to nearest even and
  /// saturating, as PagedKVCache::assign does); the reference reads the
  /// dequantized values (code x scale), q and out stay in `storage`.
  std::optional<DType> kvFloat8;
  /// Where the paged attention runs: the CPU backend, or cuda:N through the
  /// runtime's CUDA backend (the GPU kernels; on a machine without a GPU, the
  /// SIMT emulator's driver). CUDA needs storage and outType BF16 or F16
  /// (outType is then taken equal to storage) and mods with CUDA code.
  Device device = Device::cpu();
  DType outType = DType::F32;
  bool withLse = true;
  /// Builds a block mask by evaluating maskReference densely.
  bool withBlockMask = false;
  int32_t qBlockSize = 32;
  int32_t kvBlockSize = 32;
  /// Build the mask with batch / head extent 1 (valid when the mask does not
  /// depend on b / h).
  bool broadcastMaskBatch = false;
  bool broadcastMaskHeads = false;
  /// 0 = 1 / sqrt(dim).
  float scale = 0.0f;
  /// Attention sinks [qHeads]; empty = none.
  std::vector<float> sinks;
  /// Inputs are uniform in [-range, range].
  float range = 1.0f;
  /// Hand q and out to the kernel as strided [B, Lq, Hq, D] buffers.
  bool transposedQueryLayout = false;
  /// Run the public flexAttention() on dense k [B, Hkv, S, D] and v
  /// (S = the longest kv length, every key finite) instead of a paged cache.
  bool denseKV = false;
  /// With denseKV: k and v stored as [B, S, Hkv, D] and handed over through
  /// strides (what k.transpose(1, 2) of a [B, S, Hkv, D] tensor is).
  bool transposedKVLayout = false;
  int threads = 2;
  cpu::KernelVariant variant = cpu::KernelVariant::Auto;
  uint64_t seed = 1;
};

struct AttentionCheckResult {
  double maxOutError = 0;     ///< max |out - reference|
  double maxLseError = 0;     ///< over rows where both are finite
  int64_t outViolations = 0;  ///< elements beyond their tolerance
  int64_t lseViolations = 0;  ///< rows beyond tolerance or -inf on one side only
  int64_t nonFinite = 0;      ///< NaN/inf outputs (poison left unwritten included)
  int64_t maskedRows = 0;     ///< rows the reference masks fully
  int64_t rows = 0;
  bool ok() const { return outViolations == 0 && lseViolations == 0 && nonFinite == 0; }
  std::string describe() const;
};

/// Runs the comparison described above.
AttentionCheckResult checkPagedAttention(const CompiledMods &mods,
                                         const PagedcModContext *context,
                                         const AttentionConfig &config);

/// A block mask for `mods` by dense evaluation of maskReference over
/// q in [0, qLength), kv in [0, kvLength): blocks with every element kept are
/// full, some kept partial, none kept absent. Without a mask mod every block
/// is full.
BlockMask buildDenseBlockMask(const CompiledMods &mods, const PagedcModContext *context,
                              int64_t batch, int64_t heads, int64_t qLength,
                              int64_t kvLength, int32_t qBlockSize, int32_t kvBlockSize);

} // namespace pagedc::testutil

#endif // PAGEDC_TEST_UNIT_CPU_ATTENTIONCHECK_H
