//===- Attention.h - The paged flex-attention call -------------*- C++ -*-===//
//
// flexAttention() computes softmax(score_mod(scale * q.k), masked) . v for a
// batch of queries against sequences stored in a PagedKVCache. It checks
// every input before doing any work and then runs on the device the tensors
// live on: the CPU backend, or CUDA (pagedc/CudaAttention.h) through the
// driver loaded at run time.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_ATTENTION_H
#define PAGEDC_ATTENTION_H

#include "pagedc/BlockMask.h"
#include "pagedc/KVCache.h"
#include "pagedc/KernelOptions.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace pagedc {

/// Per-call settings of flexAttention(). Per-batch vectors are indexed by
/// the call's batch index b (q's first dimension).
struct AttentionOptions {
  /// The cache slot of each batch entry, any order (default 0..B-1).
  std::vector<int32_t> batchIdx;
  /// The valid KV length of each batch entry: keys at logical positions
  /// >= kvLength[b] are never read. Required; each at most the slot's
  /// capacity.
  std::vector<int32_t> kvLength;
  /// Position of q's first row per batch entry (default all 0): mods see
  /// q = qOffset[b] + row, and the block mask row holding that position is
  /// used. A decode step passes kvLength[b] - Lq.
  std::vector<int32_t> qOffset;
  /// Multiplies q.k before the score mod (default 1/sqrt(D)).
  std::optional<float> scale;
  /// Also return the natural-log logsumexp [B, Hq, Lq] (f32).
  bool returnLse = false;
  /// Optional output [B, Hq, Lq, Dv] to write into; when left
  /// default-constructed the result owns a new tensor of q's dtype.
  TensorView out;
  /// Optional lse output [B, Hq, Lq] f32 (default-constructed: none);
  /// giving one implies returnLse.
  TensorView lse;
  /// Attention sinks (default-constructed: none): an f32 tensor [Hq] on the
  /// call's device. Query head h's softmax gains one extra key whose logit is
  /// sinks[h] (in the units of the scores after scale and score mod) and
  /// whose value is zero: the weights of a row sum to less than 1, lse
  /// includes the sink, and a fully masked row gives out 0 and lse sinks[h].
  TensorView sinks;
  /// CPU worker threads; 0 = every core, or the calling thread alone when
  /// the call is too small to gain from more.
  int threads = 0;
  /// The device to run on; by default q's. Every tensor must be on it.
  std::optional<Device> device;
  /// CUDA: the CUstream to run on (null = the legacy default stream). The
  /// call returns when its work on the stream is done.
  void *stream = nullptr;
  /// CUDA: which kernel runs and how it is launched (pagedc/KernelOptions.h;
  /// every field unset: the runtime decides). The runtime reads these from
  /// here alone, never from the environment. Checked on every device
  /// (checkKernelOptions), used on CUDA only.
  KernelOptions kernel;
};

/// The outputs of flexAttention(). `out` and `lse` view either the caller's
/// tensors or the storage this object owns, so it is move-only.
struct AttentionResult {
  TensorView out; ///< [B, Hq, Lq, Dv]
  TensorView lse; ///< [B, Hq, Lq] f32, or empty when not requested

  HostTensor ownedOut; ///< storage of `out` when the call allocated it
  HostTensor ownedLse; ///< storage of `lse` when the call allocated it

  AttentionResult() = default;
  AttentionResult(AttentionResult &&) = default;
  AttentionResult &operator=(AttentionResult &&) = default;
  AttentionResult(const AttentionResult &) = delete;
  AttentionResult &operator=(const AttentionResult &) = delete;
};

/// Paged flex attention of `q` [B, Hq, Lq, D] against `cache`.
///
/// With GQA/MQA, query head h reads KV head h / (Hq / Hkv) for any Hq that
/// is a multiple of Hkv; mods receive the query head h, the call's batch
/// index b, q = qOffset[b] + row and the logical kv index. `blockMask` (may
/// be null: every block is visited) is a logical mask whose batch and head
/// extents are 1 or B and Hq and whose Q_LEN / KV_LEN cover every query
/// position and kv length of the call. A fully masked query row gives out 0
/// and lse -inf.
///
/// Every shape, dtype, device, stride, binding and length is checked first;
/// a mismatch throws pagedc::Error naming it and nothing is written.
/// Reads the cache: do not modify it concurrently.
AttentionResult flexAttention(const TensorView &q, const PagedKVCache &cache,
                              const BlockMask *blockMask, const CompiledMods &mods,
                              const Bindings &bindings, const AttentionOptions &options);

/// Flex attention of `q` [B, Hq, Lq, D] against dense keys `k`
/// [B', Hkv, S, D] and values `v` [B', Hkv, S, Dv], read where they lie: no
/// copy is made, whatever their strides (negative strides are refused; a
/// unit last stride with f32 elements is the fast path, others are
/// converted a tile at a time). Batch entry b reads k's entry
/// options.batchIdx[b] (default b) up to options.kvLength[b] (default S for
/// every entry); everything else is as for the cache call above.
///
/// CPU only: on a CUDA device this throws pagedc::Error (the CUDA kernels
/// read a PagedKVCache's compact pages; copy k and v into one). k and v
/// are f32 or bf16, of one dtype, and must not change during the call.
AttentionResult flexAttention(const TensorView &q, const TensorView &k, const TensorView &v,
                              const BlockMask *blockMask, const CompiledMods &mods,
                              const Bindings &bindings, const AttentionOptions &options);

} // namespace pagedc

#endif // PAGEDC_ATTENTION_H
