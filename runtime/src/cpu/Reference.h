//===- Reference.h - Float64 reference attention and test caches -*- C++ -*-===//
//
// The obvious, untiled definition of the attention call in double precision,
// against which the CPU and CUDA kernels are checked, and a helper that lays
// dense K/V out as a paged cache with a shuffled page table.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CPU_REFERENCE_H
#define PAGEDC_RUNTIME_CPU_REFERENCE_H

#include "pagedc/ModABI.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <vector>

namespace pagedc::cpu {

/// Reads element `offset` (in elements from the view's data) of any dtype as
/// a double.
double readAsDouble(const TensorView &view, int64_t offset);

/// Inputs of referenceAttention(). K and V are dense and logical: no pages.
struct ReferenceArgs {
  TensorView q; ///< [B, Hq, Lq, D], any floating dtype.
  TensorView k; ///< [B, Hkv, Lkv, D], any floating dtype.
  TensorView v; ///< [B, Hkv, Lkv, Dv], any floating dtype.
  /// [B] or null (= Lkv): keys at index >= kvLength[b] are masked out.
  const int32_t *kvLength = nullptr;
  /// [B] or null (= 0): mods see q = qOffset[b] + row.
  const int32_t *qOffset = nullptr;
  /// Uses maskReference / scoreReference (double); null = no mods.
  const CompiledMods *mods = nullptr;
  const PagedcModContext *context = nullptr;
  double scale = 1.0;
  /// [Hq] or null: query head h's softmax has one more key, of logit
  /// sinks[h] and value zero (-inf: none; NaN gives NaN rows).
  const float *sinks = nullptr;
};

/// Outputs of referenceAttention(), row-major.
struct ReferenceResult {
  int64_t batch = 0, heads = 0, qLength = 0, vDim = 0;
  std::vector<double> out; ///< [B, Hq, Lq, Dv]; 0 for fully masked rows.
  /// [B, Hq, Lq]; -inf for fully masked rows (with sinks: sinks[h]).
  std::vector<double> lse;

  double outAt(int64_t b, int64_t h, int64_t i, int64_t d) const {
    return out[((b * heads + h) * qLength + i) * vDim + d];
  }
  double lseAt(int64_t b, int64_t h, int64_t i) const {
    return lse[(b * heads + h) * qLength + i];
  }
};

/// out = softmax over kv of score_mod(scale * q.k) where the mask mod holds
/// and kv < kvLength[b], the sink (if any) taking part in the softmax as a
/// key of value zero; query head h reads KV head h / (Hq / Hkv). Two
/// passes per row, every intermediate in double.
ReferenceResult referenceAttention(const ReferenceArgs &args);

/// A paged KV cache built from dense K/V, for tests and benchmarks.
struct PagedCache {
  HostTensor kCache;              ///< [Hkv, numPages, pageSize, D]
  HostTensor vCache;              ///< [Hkv, numPages, pageSize, Dv]
  std::vector<int32_t> pageTable; ///< [B, pageTableStride]; -1 = no page
  int64_t pageTableStride = 0;
  int32_t pageSize = 0;
  int64_t numPages = 0;
};

/// Copies dense K [B, Hkv, Lkv, D] and V [B, Hkv, Lkv, Dv] (any floating
/// dtype) into a cache of `storage` dtype (F32 or BF16). Sequence b gets
/// ceil(kvLength[b] / pageSize) pages (kvLength null = Lkv), drawn from a
/// permutation of all pages shuffled with `seed`; `sparePages` extra pages
/// stay unused. Unused slots hold NaN so that reading them shows up, and
/// unused page-table entries hold -1.
PagedCache buildPagedCache(const TensorView &k, const TensorView &v,
                           const int32_t *kvLength, int32_t pageSize,
                           DType storage, uint64_t seed,
                           int64_t sparePages = 3);

} // namespace pagedc::cpu

#endif // PAGEDC_RUNTIME_CPU_REFERENCE_H
