//===- PhysicalBlockMask.h - Block masks mapped onto a KV cache -*- C++ -*-===//
//
// The reference design converts a logical block mask to physical page
// indices (convert_logical_block_mask) and wraps mods so that they take
// physical kv indices (get_mask_mod / get_score_mod). pagedc's own kernels
// read logical masks and translate through the page table themselves; these
// conversions are for users who need the physical form.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_PHYSICALBLOCKMASK_H
#define PAGEDC_PHYSICALBLOCKMASK_H

#include "pagedc/BlockMask.h"
#include "pagedc/KVCache.h"
#include "pagedc/Mods.h"

#include <cstdint>
#include <vector>

namespace pagedc {

/// A block mask converted for one batch of cache slots.
///
/// When the mask's kv block size equals the cache's page size (the reference
/// design's only case), `indexSpace` is PhysicalPages: every index in
/// `mask.kvIndices` / `mask.fullKvIndices` is a physical page number and
/// `mask.kvLength` is numPages * pageSize, as in the reference. When they
/// differ, a kv block does not map to one page, so the indices stay logical
/// kv blocks (`indexSpace` LogicalBlocks) and `pageTable` carries the page
/// table rows to translate positions with.
///
/// Either way the mask has one batch row per entry of `slots` (a logical
/// mask with batch extent 1 is expanded), rows keep the logical mask's
/// column count (never padded to numPages), and blocks at or past a batch
/// row's length (kvLength[b], else the slot's capacity) are dropped while a
/// full block that straddles the length becomes partial, so that the mod
/// wrappers below mask it past the end.
struct PhysicalBlockMask {
  enum class IndexSpace : uint8_t { PhysicalPages, LogicalBlocks };
  IndexSpace indexSpace = IndexSpace::PhysicalPages;
  BlockMask mask;
  /// The cache slot of each batch row.
  std::vector<int32_t> slots;
  /// Valid kv length per batch row; empty when none was given.
  std::vector<int32_t> kvLength;
  int64_t pageSize = 0;
  /// [slots.size(), pageTableStride] page table rows of the slots, -1
  /// padded, covering the pages any row of the mask reaches.
  std::vector<int32_t> pageTable;
  int64_t pageTableStride = 0;
};

/// Converts `mask` for the cache slots `batchIdx` (default 0..mask.batch-1;
/// any order, any slots) with optional per-row valid lengths `kvLength`. The
/// mask's batch extent must be 1 or batchIdx.size(). Throws pagedc::Error on
/// slot, length or shape mismatches.
PhysicalBlockMask convertLogicalBlockMask(const PagedKVCache &cache, const BlockMask &mask,
                                          const std::vector<int32_t> &batchIdx = {},
                                          const std::vector<int32_t> &kvLength = {});

/// convertLogicalBlockMask() writing into `out`, whose storage is reused:
/// repeated conversions of the same shape (a decode loop) allocate nothing.
/// `out` is left unchanged when the inputs are invalid.
void convertLogicalBlockMaskInto(const PagedKVCache &cache, const BlockMask &mask,
                                 const std::vector<int32_t> &batchIdx,
                                 const std::vector<int32_t> &kvLength, PhysicalBlockMask &out);

/// Translates physical kv indices back to logical ones for a batch of slots:
/// the reference's get_mask_mod / get_score_mod logic, one element at a
/// time. It reads the cache's current page tables, so the cache must outlive
/// it and not change while it is used.
class PhysicalIndexMap {
public:
  /// `slots[b]` is batch row b's cache slot; `kvLength` (empty or one per
  /// slot) bounds the valid logical indices.
  PhysicalIndexMap(const PagedKVCache &cache, std::vector<int32_t> slots,
                   std::vector<int32_t> kvLength = {});
  /// The logical kv index that physical index `physicalKv` (page *
  /// pageSize + offset) holds for batch row `b`, or -1 when that page is not
  /// the row's or the index is at or past its kv length.
  int64_t logicalIndex(int32_t b, int64_t physicalKv) const;

private:
  const PagedKVCache &cache_;
  std::vector<int32_t> slots_;
  std::vector<int32_t> kvLength_;
};

/// A mask mod over physical kv indices: the logical mask's answer at the
/// translated index, or false when the index is not live for the row.
class PhysicalMaskView {
public:
  /// `mods` without a mask mod (or null) keeps every live index.
  PhysicalMaskView(const PagedKVCache &cache, const CompiledMods *mods,
                   const PagedcModContext *context, std::vector<int32_t> slots,
                   std::vector<int32_t> kvLength = {});
  bool operator()(int32_t b, int32_t h, int32_t q, int64_t physicalKv) const;

private:
  PhysicalIndexMap map_;
  const CompiledMods *mods_;
  const PagedcModContext *context_;
};

/// A score mod over physical kv indices: the logical score mod's result at
/// the translated index, or -inf when the index is not live for the row.
class PhysicalScoreView {
public:
  /// `mods` without a score mod (or null) returns the score unchanged.
  PhysicalScoreView(const PagedKVCache &cache, const CompiledMods *mods,
                    const PagedcModContext *context, std::vector<int32_t> slots,
                    std::vector<int32_t> kvLength = {});
  float operator()(float score, int32_t b, int32_t h, int32_t q, int64_t physicalKv) const;

private:
  PhysicalIndexMap map_;
  const CompiledMods *mods_;
  const PagedcModContext *context_;
};

} // namespace pagedc

#endif // PAGEDC_PHYSICALBLOCKMASK_H
