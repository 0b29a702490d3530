//===- CpuAttention.h - Paged flex attention on the CPU --------*- C++ -*-===//
//
// The CPU backend of the attention call: a tiled, multi-threaded flash
// attention over a paged KV cache that calls compiled mods row-vectorised on
// logical kv indices. The public flexAttention() validates its inputs and
// then calls pagedAttention(); nothing here checks user input again.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CPU_CPUATTENTION_H
#define PAGEDC_RUNTIME_CPU_CPUATTENTION_H

#include "pagedc/BlockMask.h"
#include "pagedc/ModABI.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <vector>

namespace pagedc::cpu {

/// Instruction-set variants of the vectorised tile kernels. Auto picks the
/// widest one the running CPU supports; the others exist so that tests and
/// benchmarks can exercise each.
enum class KernelVariant : uint8_t { Auto, Generic, Avx2, Avx512 };

/// The variants the running CPU can execute (Generic always).
std::vector<KernelVariant> supportedKernelVariants();
/// "auto", "generic", "avx2", "avx512".
const char *kernelVariantName(KernelVariant variant);

/// Everything one attention call needs. The caller has validated shapes,
/// dtypes, devices (all CPU), page tables and bindings. Tensors may be
/// strided in any dimension.
struct PagedAttentionArgs {
  /// [B, Hq, Lq, D], f32 or bf16.
  TensorView q;
  /// [Hkv, numPages, pageSize, D], f32, bf16 or 8-bit float storage.
  TensorView kCache;
  /// [Hkv, numPages, pageSize, Dv], f32, bf16 or 8-bit float storage.
  TensorView vCache;
  /// [Hkv] each, for 8-bit float caches: a code c of KV head h means
  /// c * kScale[h] (K) or c * vScale[h] (V). Null for other caches.
  const float *kScale = nullptr;
  const float *vScale = nullptr;
  /// [B, pageTableStride]: row b maps the call's batch b from logical page
  /// to physical page. Only the first ceil(kvLength[b] / pageSize) entries of
  /// a row are read.
  const int32_t *pageTable = nullptr;
  int64_t pageTableStride = 0;
  int32_t pageSize = 0;
  /// [B]: keys at logical index >= kvLength[b] are masked out (never read).
  const int32_t *kvLength = nullptr;
  /// [B] or null (= 0): mods see q = qOffset[b] + row.
  const int32_t *qOffset = nullptr;
  /// Packed queries of different lengths: null, or [B + 1] non-decreasing
  /// row starts. When set, q is [1, Hq, T, D], out [1, Hq, T, Dv] and lse
  /// [1, Hq, T] over the T packed token rows, batch entry b owns rows
  /// [qStart[b], qStart[b + 1]) and `batch` gives B. When null, q's first
  /// and third dimensions are B and the common Lq.
  const int32_t *qStart = nullptr;
  int64_t batch = 0;
  /// [B] or null (= 0): keys at logical index < kvBegin[b] are not visible,
  /// so a call can cover one part of a sequence's keys (a shared prefix, a
  /// suffix) whose results mergeState() combines.
  const int32_t *kvBegin = nullptr;
  /// Packed queries only, each [T] or null: the query position and the
  /// batch index the mods see for each token row (in place of
  /// qOffset[b] + row and b). A cascade level batches the queries of many
  /// sequences against their shared pages as one entry and keeps each
  /// query's own position and sequence this way.
  const int32_t *tokenPosition = nullptr;
  const int32_t *tokenBatch = nullptr;
  /// Logical block mask or null (no block sparsity). The row used for query
  /// position p is p / qBlockSize; batch and head extents of 1 broadcast.
  /// Positions must lie inside the mask's numQBlocks * qBlockSize.
  const BlockMask *blockMask = nullptr;
  /// Mods to apply; either mod may be absent, and mods itself may be null.
  const CompiledMods *mods = nullptr;
  /// Bound buffers and params passed to every mod call (may be null when the
  /// mods read none).
  const PagedcModContext *context = nullptr;
  /// Multiplies q.k before the score mod.
  float scale = 1.0f;
  /// [B, Hq, Lq, Dv], f32 or bf16. Every element is written.
  TensorView out;
  /// [B, Hq, Lq] f32 natural-log logsumexp of the modded scores, or empty.
  TensorView lse;
  /// [Hq] f32 attention sinks (AttentionOptions::sinks) on the call's
  /// device, or empty (none): query head h's softmax has one more key, of
  /// logit sinks[h] (after scale and score mod) and value zero. On the CPU
  /// it is folded into each row's final normalisation; -inf adds nothing.
  TensorView sinks;
  /// Worker threads; 0 = hardware concurrency, or the calling thread alone
  /// for calls too small to gain from more.
  int threads = 0;
  /// Tile-kernel instruction set; an unsupported choice falls back to Auto.
  KernelVariant variant = KernelVariant::Auto;
};

/// Computes softmax(score_mod(scale * q.k) masked) . v for every query row.
/// Query head h reads KV head h / (Hq / Hkv). Full blocks of the block mask
/// skip the mask mod, partial blocks apply it and blocks in neither list are
/// skipped. A fully masked row gives out = 0 and lse = -inf, or with sinks
/// lse = sinks[h].
void pagedAttention(const PagedAttentionArgs &args);

} // namespace pagedc::cpu

#endif // PAGEDC_RUNTIME_CPU_CPUATTENTION_H
