//===- BlockMask.h - FlexAttention block-sparse masks ----------*- C++ -*-===//
//
// A BlockMask classifies Q_BLOCK x KV_BLOCK tiles of the (q, kv) plane per
// (batch, head, q block): "partial" tiles (kv_indices) need mask_mod per
// element; "full" tiles (full_kv_indices) are kept whole and skip mask_mod;
// tiles in neither list are skipped. Indices are *logical* kv block numbers:
// pagedc kernels translate them through the page table themselves.
// createBlockMask() builds one from a compiled mask mod; convertLogical-
// BlockMask() (PhysicalBlockMask.h) maps one onto a paged KV cache.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BLOCKMASK_H
#define PAGEDC_BLOCKMASK_H

#include "pagedc/ModABI.h"

#include <cstdint>
#include <vector>

namespace pagedc {

struct BlockMask {
  /// Batch and head extents of the mask. A value of 1 broadcasts over the
  /// batch (or heads) of the attention call.
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t qLength = 0;  // Q_LEN the mask was built for
  int64_t kvLength = 0; // KV_LEN the mask was built for
  int32_t qBlockSize = 128;
  int32_t kvBlockSize = 128;
  /// The first q block the mask's rows cover: row i is q block
  /// firstQBlock + i (positions from firstQBlock * qBlockSize on). 0 for a
  /// mask of every query row; a decode step's mask (createBlockMaskRows())
  /// covers only the call's rows, so its size is O(KV_LEN / kvBlockSize).
  /// Host side only so far: the CUDA backend takes masks with 0 here.
  int64_t firstQBlock = 0;
  int64_t numQBlocks = 0;  // ceil(qLength / qBlockSize) - firstQBlock
  int64_t maxKvBlocks = 0; // columns of the index arrays
  /// True when the indices are physical page numbers (a mask converted by
  /// convertLogicalBlockMask() with block size == page size); such a mask is
  /// for physical-index consumers only and flexAttention() rejects it.
  bool physicalIndices = false;

  /// [batch, heads, numQBlocks]
  std::vector<int32_t> kvNumBlocks;
  /// [batch, heads, numQBlocks, maxKvBlocks]; entries past the row's count
  /// are unspecified.
  std::vector<int32_t> kvIndices;
  /// [batch, heads, numQBlocks]
  std::vector<int32_t> fullKvNumBlocks;
  /// [batch, heads, numQBlocks, maxKvBlocks]
  std::vector<int32_t> fullKvIndices;

  /// Flat offset of row (b, h, qBlock) in the *NumBlocks arrays, applying the
  /// broadcast of a batch or head extent of 1; qBlock counts from
  /// firstQBlock (it is the row, not the absolute q block).
  int64_t rowIndex(int64_t b, int64_t h, int64_t qBlock) const {
    int64_t bb = batch == 1 ? 0 : b;
    int64_t hh = heads == 1 ? 0 : h;
    return (bb * heads + hh) * numQBlocks + qBlock;
  }
  const int32_t *partialRow(int64_t b, int64_t h, int64_t qBlock) const {
    return kvIndices.data() + rowIndex(b, h, qBlock) * maxKvBlocks;
  }
  const int32_t *fullRow(int64_t b, int64_t h, int64_t qBlock) const {
    return fullKvIndices.data() + rowIndex(b, h, qBlock) * maxKvBlocks;
  }
  int32_t partialCount(int64_t b, int64_t h, int64_t qBlock) const {
    return kvNumBlocks[rowIndex(b, h, qBlock)];
  }
  int32_t fullCount(int64_t b, int64_t h, int64_t qBlock) const {
    return fullKvNumBlocks.empty() ? 0 : fullKvNumBlocks[rowIndex(b, h, qBlock)];
  }
  /// ceil(kvLength / kvBlockSize): the kv blocks the mask's indices range over.
  int64_t numKvBlocks() const {
    return kvBlockSize > 0 ? (kvLength + kvBlockSize - 1) / kvBlockSize : 0;
  }
};

struct CompiledMods;

/// The most memory a mask built by createBlockMask*() may take (its index
/// arrays, both lists): 2 GiB. Beyond it the call fails with an error that
/// gives the size, instead of running out of memory (e.g. 1x1 blocks over a
/// 1M x 1M prefill).
constexpr int64_t kBlockMaskMaxBytes = int64_t(2) << 30;

/// How createBlockMask() classifies blocks.
enum class BlockMaskMethod : uint8_t {
  /// The fastest exact method the mods allow: whole diagonals when the mask's
  /// dependence says it reads q and kv only through q - kv, else the
  /// compiler's block classifier when there is one, else element-wise.
  Auto,
  /// Evaluate mods.maskRow on every (q, kv) pair (the general path).
  ElementWise,
};

/// Builds the block mask of `mods`' mask mod for a B x H x qLength x kvLength
/// attention with blocks of qBlockSize x kvBlockSize. A batch or head extent
/// of 1 broadcasts; when the mask's dependence analysis says it reads
/// neither b nor h, the mask is built with extent 1 there whatever B and H
/// are. A last partial q or kv block is classified from its in-range indices
/// only. Without a mask mod every block is full. Throws pagedc::Error for
/// non-positive sizes, lengths beyond int32, or a mask mod with no CPU
/// function, or a mask larger than kBlockMaskMaxBytes.
BlockMask createBlockMask(const CompiledMods &mods, const PagedcModContext &context, int64_t batch,
                          int64_t heads, int64_t qLength, int64_t kvLength,
                          int32_t qBlockSize = 128, int32_t kvBlockSize = 128,
                          BlockMaskMethod method = BlockMaskMethod::Auto);

/// createBlockMask() for the query positions [qBegin, qLength) only: the
/// mask's rows start at q block qBegin / qBlockSize (BlockMask::firstQBlock),
/// so a decode step at q offset 1M builds one row of q blocks, not 1M / 128.
/// Its Q_LEN is still qLength (the end of the call's rows). The diagonal
/// table and the element-wise evaluation cover only those rows too.
BlockMask createBlockMaskRows(const CompiledMods &mods, const PagedcModContext &context,
                              int64_t batch, int64_t heads, int64_t qBegin, int64_t qLength,
                              int64_t kvLength, int32_t qBlockSize = 128,
                              int32_t kvBlockSize = 128,
                              BlockMaskMethod method = BlockMaskMethod::Auto);
void createBlockMaskRowsInto(const CompiledMods &mods, const PagedcModContext &context,
                             int64_t batch, int64_t heads, int64_t qBegin, int64_t qLength,
                             int64_t kvLength, int32_t qBlockSize, int32_t kvBlockSize,
                             BlockMaskMethod method, BlockMask &mask);

/// createBlockMask() writing into `mask`, whose storage is reused: building
/// masks of the same shape again allocates nothing. `mask` is unchanged
/// when the arguments are invalid.
void createBlockMaskInto(const CompiledMods &mods, const PagedcModContext &context, int64_t batch,
                         int64_t heads, int64_t qLength, int64_t kvLength, int32_t qBlockSize,
                         int32_t kvBlockSize, BlockMaskMethod method, BlockMask &mask);

/// Builds a block mask from FlexAttention-style block lists (from_kv_blocks):
/// `kvNumBlocks` [batch, heads, numQBlocks], `kvIndices` [..., maxKvBlocks],
/// and optionally the full-block pair (both empty for none). Checks every
/// size, count and valid index (in range, no block listed twice in a row).
BlockMask blockMaskFromKvBlocks(std::vector<int32_t> kvNumBlocks, std::vector<int32_t> kvIndices,
                                std::vector<int32_t> fullKvNumBlocks,
                                std::vector<int32_t> fullKvIndices, int64_t batch, int64_t heads,
                                int64_t maxKvBlocks, int64_t qLength, int64_t kvLength,
                                int32_t qBlockSize = 128, int32_t kvBlockSize = 128);

/// Builds a block mask from a dense element mask `dense` [batch, heads,
/// qLength, kvLength] (nonzero = keep): all-true blocks are full, mixed ones
/// partial, all-false ones absent. A null `dense` is a pagedc::Error.
BlockMask denseToBlockMask(const uint8_t *dense, int64_t batch, int64_t heads, int64_t qLength,
                           int64_t kvLength, int32_t qBlockSize = 128, int32_t kvBlockSize = 128);

/// Checks a block mask's structure (the invariants blockMaskFromKvBlocks()
/// checks); throws pagedc::Error naming the first violation.
void validateBlockMask(const BlockMask &mask);

/// Block classes: 0 = skipped, 1 = partial, 2 = full.
enum BlockClass : uint8_t { EmptyBlock = 0, PartialBlock = 1, FullBlock = 2 };

/// The mask's block classes as a dense [batch, heads, numQBlocks,
/// numKvBlocks] array of BlockClass values (rows from firstQBlock on).
std::vector<uint8_t> toDenseBlocks(const BlockMask &mask);

/// Whether each (batch, head) row of the mask visits at least as many kv
/// blocks (partial and full) in every q block as in the one before it: as
/// causal and sliding-window masks do, and a document mask does not. Then
/// the prefill's query tiles, numbered from the last q block to the first,
/// are numbered heaviest first, which is what the warpgroup prefill's
/// persistent CTAs assume when they are chosen by default
/// (applyPrefillPersistentRequest, CudaLaunch.h).
bool blockMaskVisitsGrow(const BlockMask &mask);

/// The element mask the block mask stands for, [batch, heads, qLength,
/// kvLength] of 0/1 (rows before firstQBlock are 0): full blocks are 1,
/// skipped blocks 0, and partial blocks
/// evaluate `mods`' mask mod (1 everywhere when mods is null or has none).
std::vector<uint8_t> toDense(const BlockMask &mask, const CompiledMods *mods = nullptr,
                             const PagedcModContext *context = nullptr);

} // namespace pagedc

#endif // PAGEDC_BLOCKMASK_H
