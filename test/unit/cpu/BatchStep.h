//===- BatchStep.h - One serving step and its float64 reference -*- C++ -*-===//
//
// The BatchAttention tests' shared half, for the CPU backend
// (cpu/BatchAttentionTest.cpp) and the CUDA one on the emulator
// (cuda/CudaBatchAttentionTest.cpp): a random mixed step (sequences with
// their own new tokens and contexts), its packed q, the engine's cache in
// one of the four layouts on shuffled pages (every other slot NaN), the
// block table and metadata, the test mods' bindings per sequence, and the
// comparison of a result with the float64 reference.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CPU_BATCHSTEP_H
#define PAGEDC_TEST_UNIT_CPU_BATCHSTEP_H

#include "pagedc/BatchAttention.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace pagedc::testutil {

struct BatchSeq {
  int32_t qLen, seqLen;
};

/// A step and how it is stored.
struct BatchStepCase {
  std::vector<BatchSeq> seqs;
  int64_t qHeads = 8, kvHeads = 2, dim = 64, vDim = 64;
  int32_t pageSize = 16;
  KVLayout layout = KVLayout::NHD;
  DType storage = DType::F32;
  DType outType = DType::F32;
  /// 8-bit float K/V (F8E4M3, F8E5M2): stored as codes with per-head scales
  /// (one shared scale when perHeadScale is false); q stays `storage`. The
  /// cache tensors are u8 read through kvDtype when asU8.
  std::optional<DType> kvFloat8;
  bool perHeadScale = true;
  bool asU8 = false;
  std::string mask, score;
  /// Attention sinks, one per query head, cycling through a logit near the
  /// rows' lse, 9 (above every score for D <= 64: |q.k| / sqrt(D) <= 8 with
  /// inputs in [-1, 1]), -9 and -inf (none).
  bool sinks = false;
  int threads = 2;
  uint64_t seed = 1;
  /// Keys [0, sharedPrefix) of every sequence are sequence 0's, and their
  /// whole pages are sequence 0's pages (as fork() leaves a shared prefix;
  /// a partial last page is each sequence's own copy). Every sequence must
  /// have at least this many keys.
  int32_t sharedPrefix = 0;
  /// MLA's shared latent cache: V is the first vDim columns of each K row
  /// (vDim <= dim). The cache has no V tensor; run() is given a view of the
  /// K cache as v_cache (the same data pointer and strides, vDim wide).
  bool valuesInKeys = false;
  /// run()'s scale, which the reference uses too; 0: 1 / sqrt(dim) (the
  /// call's default).
  float scale = 0.0f;
};

/// A value in [-1, 1], never 0.
float randomValue(std::mt19937 &rng);
/// Stores `value` at element `offset` of a f32, bf16, f16 or 8-bit float
/// tensor.
void storeAs(HostTensor &tensor, int64_t offset, float value);
/// `value` as `type` holds it (bf16, f16; others unchanged).
float roundTo(DType type, float value);
HostTensor nanTensor(DType type, std::vector<int64_t> shape);

/// The engine's cache: one allocation per tensor the layout has, every slot
/// NaN until a sequence's key or value is written there.
struct EngineCache {
  KVLayout layout;
  int64_t pages, pageSize, heads, dim, vDim;
  /// V is the first vDim columns of K (MLA); v is then unused.
  bool valuesInKeys;
  HostTensor k, v; // v unused for KVLayout::VLLM

  EngineCache(KVLayout layout, int64_t pages, int64_t pageSize, int64_t heads, int64_t dim,
              int64_t vDim, DType type, bool valuesInKeys = false);
  std::vector<int64_t> shape(int part) const;
  /// Writes element d of the key (part 0) or value (part 1) of `head` at
  /// `slot` of `page`.
  void set(int part, int64_t page, int64_t slot, int64_t head, int64_t d, float value);
  TensorView kView() { return k.view(); }
  /// The V cache run() is given: none for KVLayout::VLLM, a vDim-wide view
  /// of K's memory for valuesInKeys.
  TensorView vView();
};

/// Bindings of the test mods' declarations (TestMods.h), per sequence.
struct StepBindings {
  std::vector<int32_t> documents; // [B, S]
  std::vector<float> slopes;      // [Hq]
  /// [B]: each sequence's prefix of the "prefix_lm" mask (bound as
  /// "prefix" by BatchStep for that mask only, which alone declares it).
  std::vector<int32_t> prefix;
  Bindings bindings;
  StepBindings(int64_t batch, int64_t heads, int64_t length, std::mt19937 &rng);
};

struct BatchStepCheck {
  int64_t rows = 0, maskedRows = 0, outViolations = 0, lseViolations = 0, nonFinite = 0;
  /// lse entries of rows past the plan's tokens that were written.
  int64_t rowsPastWritten = 0;
  double maxOutError = 0, maxLseError = 0;
  std::string describe() const;
};

/// One step's host data, built from a case with its seed.
struct BatchStep {
  explicit BatchStep(const BatchStepCase &c);

  BatchStepCase c;
  int64_t batch = 0, maxQ = 1, maxKv = 1, tokens = 0, columns = 1;
  /// Dense logical inputs (rounded to the storage type, which the reference
  /// reads too): q4 [B, Hq, maxQ, D], k4 / v4 [B, Hkv, maxKv, D].
  HostTensor q4, k4, v4;
  /// The packed q [max(T, 1), Hq, D] of c.storage.
  HostTensor q;
  std::vector<float> kScale, vScale;
  /// [Hq] when c.sinks, else empty.
  std::vector<float> sinks;
  std::unique_ptr<EngineCache> cache;
  std::vector<int32_t> blockTable; // [B, columns]
  std::vector<int32_t> queryStartLoc, seqLens, kvLength, qOffset;
  CompiledMods mods;
  std::unique_ptr<StepBindings> bindings;

  /// The configuration the step fits: heads, dims, page size, layout,
  /// limits with some room.
  BatchAttentionConfig config() const;
  /// attention.plan() of the step's metadata.
  void plan(BatchAttention &attention) const;
  /// The sinks as a host f32 [Hq] view, or an empty view without them.
  TensorView sinksView() const;
  /// The scale the reference uses and run() is given (c.scale, or
  /// 1 / sqrt(dim)).
  double scale() const;
  /// Compares out [T', Hq, Dv] and lse [T', Hq] (host tensors; lse rows past
  /// the plan's tokens must still be NaN) with the float64 reference,
  /// within the CPU kernels' tolerance or, with `cudaTolerance`, the CUDA
  /// kernels' (f16 / bf16 probabilities).
  BatchStepCheck compare(const TensorView &out, const TensorView &lse,
                         bool cudaTolerance = false) const;
};

} // namespace pagedc::testutil

#endif // PAGEDC_TEST_UNIT_CPU_BATCHSTEP_H
