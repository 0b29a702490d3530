//===- PhysicalBlockMask.cpp - Block masks mapped onto a KV cache ---------===//
#include "pagedc/PhysicalBlockMask.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace pagedc {

namespace {

const PagedcModContext kEmptyContext{nullptr, nullptr};

std::vector<int32_t> checkedSlots(const PagedKVCache &cache, std::vector<int32_t> slots) {
  for (size_t b = 0; b < slots.size(); ++b)
    if (slots[b] < 0 || slots[b] >= cache.maxBatch())
      throw Error(
          fmt::format("batch_idx[{}] = {} is out of range [0, {})", b, slots[b], cache.maxBatch()));
  return slots;
}

void checkKvLength(const PagedKVCache &cache, const std::vector<int32_t> &slots,
                   const std::vector<int32_t> &kvLength) {
  if (kvLength.empty())
    return;
  if (kvLength.size() != slots.size())
    throw Error(fmt::format("kv_len has {} entries but there are {} batch rows", kvLength.size(),
                            slots.size()));
  for (size_t b = 0; b < slots.size(); ++b)
    if (kvLength[b] < 0 || kvLength[b] > cache.capacity(slots[b]))
      throw Error(fmt::format("kv_len[{}] = {} is outside slot {}'s capacity [0, {}]", b,
                              kvLength[b], slots[b], cache.capacity(slots[b])));
}

struct RowCounts {
  int32_t partial = 0, full = 0;
};

/// Converts row (b, h, i) of `mask` for a sequence of valid length `bound`:
/// blocks starting at or past it are dropped, a full block reaching past it
/// becomes partial, and with Physical every block becomes its page.
template <bool Physical>
RowCounts convertRow(const BlockMask &mask, int64_t b, int64_t h, int64_t i, int64_t bound,
                     const int32_t *table, int32_t *partial, int32_t *full) {
  RowCounts counts;
  const int64_t blockSize = mask.kvBlockSize;
  const int32_t *source = mask.partialRow(b, h, i);
  for (int32_t k = 0, e = mask.partialCount(b, h, i); k < e; ++k) {
    const int32_t block = source[k];
    if (int64_t(block) * blockSize < bound)
      partial[counts.partial++] = Physical ? table[block] : block;
  }
  source = mask.fullRow(b, h, i);
  for (int32_t k = 0, e = mask.fullCount(b, h, i); k < e; ++k) {
    const int32_t block = source[k];
    const int64_t begin = int64_t(block) * blockSize;
    if (begin >= bound)
      continue;
    const int32_t index = Physical ? table[block] : block;
    if (std::min<int64_t>(begin + blockSize, mask.kvLength) > bound)
      partial[counts.partial++] = index;
    else
      full[counts.full++] = index;
  }
  return counts;
}

} // namespace

PhysicalBlockMask convertLogicalBlockMask(const PagedKVCache &cache, const BlockMask &mask,
                                          const std::vector<int32_t> &batchIdx,
                                          const std::vector<int32_t> &kvLength) {
  PhysicalBlockMask result;
  convertLogicalBlockMaskInto(cache, mask, batchIdx, kvLength, result);
  return result;
}

void convertLogicalBlockMaskInto(const PagedKVCache &cache, const BlockMask &mask,
                                 const std::vector<int32_t> &batchIdx,
                                 const std::vector<int32_t> &kvLength, PhysicalBlockMask &result) {
  validateBlockMask(mask);
  if (mask.physicalIndices)
    throw Error("the block mask is already converted (it holds physical page indices)");
  std::vector<int32_t> slots = batchIdx;
  if (slots.empty())
    for (int64_t b = 0; b < mask.batch; ++b)
      slots.push_back(static_cast<int32_t>(b));
  slots = checkedSlots(cache, std::move(slots));
  const int64_t batch = static_cast<int64_t>(slots.size());
  if (mask.batch != 1 && mask.batch != batch)
    throw Error(fmt::format("block mask has batch extent {} but batch_idx has {} entries; the "
                            "extent must be 1 or {}",
                            mask.batch, batch, batch));
  checkKvLength(cache, slots, kvLength);

  const int64_t pageSize = cache.pageSize();
  const bool physical = mask.kvBlockSize == pageSize;
  std::vector<int64_t> bound(static_cast<size_t>(batch));
  int64_t stride = 0;
  for (int64_t b = 0; b < batch; ++b) {
    bound[b] = kvLength.empty() ? cache.capacity(slots[b]) : kvLength[b];
    stride = std::max(stride, (bound[b] + pageSize - 1) / pageSize);
  }
  // Columns: the logical mask's, plus one when a row's partial list is full
  // already and a straddling full block could join it (at most one block
  // per row holds the length).
  int64_t columns = mask.maxKvBlocks;
  for (int32_t count : mask.kvNumBlocks)
    columns = std::max<int64_t>(columns, int64_t(count) + 1);
  columns = std::min<int64_t>(columns, std::max<int64_t>(mask.maxKvBlocks, mask.numKvBlocks()));

  // Everything is checked: from here on only `result` changes. Resizing to
  // the sizes of a previous call reuses its storage.
  result.indexSpace = physical ? PhysicalBlockMask::IndexSpace::PhysicalPages
                               : PhysicalBlockMask::IndexSpace::LogicalBlocks;
  result.slots = std::move(slots);
  result.kvLength = kvLength;
  result.pageSize = pageSize;
  result.pageTableStride = stride;
  result.pageTable.resize(static_cast<size_t>(batch * stride));
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t> &table = cache.pageTable(result.slots[b]);
    const int64_t used = std::min<int64_t>(stride, static_cast<int64_t>(table.size()));
    int32_t *row = result.pageTable.data() + b * stride;
    std::copy(table.begin(), table.begin() + used, row);
    std::fill(row + used, row + stride, -1);
  }

  BlockMask &out = result.mask;
  out.batch = batch;
  out.heads = mask.heads;
  out.qLength = mask.qLength;
  out.kvLength = physical ? cache.numPages() * pageSize : mask.kvLength;
  out.qBlockSize = mask.qBlockSize;
  out.kvBlockSize = mask.kvBlockSize;
  out.firstQBlock = mask.firstQBlock;
  out.numQBlocks = mask.numQBlocks;
  out.maxKvBlocks = columns;
  out.physicalIndices = physical;
  const size_t rows = static_cast<size_t>(batch * mask.heads * mask.numQBlocks);
  out.kvNumBlocks.resize(rows);
  out.fullKvNumBlocks.resize(rows);
  out.kvIndices.resize(rows * static_cast<size_t>(columns));
  out.fullKvIndices.resize(rows * static_cast<size_t>(columns));

  // Keep live blocks, demote straddling full blocks, translate.
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t *table = cache.pageTable(result.slots[b]).data();
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t i = 0; i < mask.numQBlocks; ++i) {
        const int64_t row = out.rowIndex(b, h, i);
        const RowCounts counts = physical
                                     ? convertRow<true>(mask, b, h, i, bound[b], table,
                                                        out.kvIndices.data() + row * columns,
                                                        out.fullKvIndices.data() + row * columns)
                                     : convertRow<false>(mask, b, h, i, bound[b], table,
                                                         out.kvIndices.data() + row * columns,
                                                         out.fullKvIndices.data() + row * columns);
        out.kvNumBlocks[row] = counts.partial;
        out.fullKvNumBlocks[row] = counts.full;
      }
  }
}

//===----------------------------------------------------------------------===//
// Physical index views
//===----------------------------------------------------------------------===//

PhysicalIndexMap::PhysicalIndexMap(const PagedKVCache &cache, std::vector<int32_t> slots,
                                   std::vector<int32_t> kvLength)
    : cache_(cache), slots_(checkedSlots(cache, std::move(slots))), kvLength_(std::move(kvLength)) {
  if (!kvLength_.empty() && kvLength_.size() != slots_.size())
    throw Error(fmt::format("kv_len has {} entries but there are {} batch rows", kvLength_.size(),
                            slots_.size()));
}

int64_t PhysicalIndexMap::logicalIndex(int32_t b, int64_t physicalKv) const {
  if (b < 0 || static_cast<size_t>(b) >= slots_.size())
    throw Error(fmt::format("batch row {} is out of range [0, {})", b, slots_.size()));
  const int64_t pageSize = cache_.pageSize();
  if (physicalKv < 0 || physicalKv >= cache_.numPages() * pageSize)
    return -1;
  const int32_t logicalPage = cache_.physicalToLogical(slots_[b], physicalKv / pageSize);
  if (logicalPage < 0)
    return -1;
  const int64_t logical = int64_t(logicalPage) * pageSize + physicalKv % pageSize;
  if (!kvLength_.empty() && logical >= kvLength_[b])
    return -1;
  return logical;
}

PhysicalMaskView::PhysicalMaskView(const PagedKVCache &cache, const CompiledMods *mods,
                                   const PagedcModContext *context, std::vector<int32_t> slots,
                                   std::vector<int32_t> kvLength)
    : map_(cache, std::move(slots), std::move(kvLength)), mods_(mods),
      context_(context ? context : &kEmptyContext) {
  if (mods && mods->hasMask() && !mods->maskRow)
    throw Error(fmt::format("mask mod '{}' has no CPU function", mods->maskName));
}

bool PhysicalMaskView::operator()(int32_t b, int32_t h, int32_t q, int64_t physicalKv) const {
  const int64_t logical = map_.logicalIndex(b, physicalKv);
  if (logical < 0)
    return false;
  if (!mods_ || !mods_->hasMask())
    return true;
  uint8_t keep = 0;
  mods_->maskRow(context_, b, h, q, static_cast<int32_t>(logical), 1, &keep);
  return keep != 0;
}

PhysicalScoreView::PhysicalScoreView(const PagedKVCache &cache, const CompiledMods *mods,
                                     const PagedcModContext *context, std::vector<int32_t> slots,
                                     std::vector<int32_t> kvLength)
    : map_(cache, std::move(slots), std::move(kvLength)), mods_(mods),
      context_(context ? context : &kEmptyContext) {
  if (mods && mods->hasScore() && !mods->scoreRow)
    throw Error(fmt::format("score mod '{}' has no CPU function", mods->scoreName));
}

float PhysicalScoreView::operator()(float score, int32_t b, int32_t h, int32_t q,
                                    int64_t physicalKv) const {
  const int64_t logical = map_.logicalIndex(b, physicalKv);
  if (logical < 0)
    return -std::numeric_limits<float>::infinity();
  if (!mods_ || !mods_->hasScore())
    return score;
  mods_->scoreRow(context_, b, h, q, static_cast<int32_t>(logical), 1, &score);
  return score;
}

} // namespace pagedc
