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
      throw Error(fmt::format("batch_idx[{}] = {} is out of range [0, {})", b, slots[b],
                              cache.maxBatch()));
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

} // namespace

PhysicalBlockMask convertLogicalBlockMask(const PagedKVCache &cache, const BlockMask &mask,
                                          const std::vector<int32_t> &batchIdx,
                                          const std::vector<int32_t> &kvLength) {
  validateBlockMask(mask);
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
  auto blockEnd = [&](int64_t block) {
    return std::min<int64_t>((block + 1) * mask.kvBlockSize, mask.kvLength);
  };

  // Pass 1: the columns the converted rows need.
  int64_t columns = mask.maxKvBlocks;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t i = 0; i < mask.numQBlocks; ++i) {
        int64_t partial = 0;
        for (int32_t k = 0; k < mask.partialCount(b, h, i); ++k)
          partial += int64_t(mask.partialRow(b, h, i)[k]) * mask.kvBlockSize < bound[b];
        for (int32_t k = 0; k < mask.fullCount(b, h, i); ++k) {
          const int64_t block = mask.fullRow(b, h, i)[k];
          partial += block * mask.kvBlockSize < bound[b] && blockEnd(block) > bound[b];
        }
        columns = std::max(columns, partial);
      }

  PhysicalBlockMask result;
  result.indexSpace = physical ? PhysicalBlockMask::IndexSpace::PhysicalPages
                               : PhysicalBlockMask::IndexSpace::LogicalBlocks;
  result.slots = slots;
  result.kvLength = kvLength;
  result.pageSize = pageSize;
  result.pageTableStride = stride;
  result.pageTable = cache.densePageTable(slots, stride);

  BlockMask &out = result.mask;
  out.batch = batch;
  out.heads = mask.heads;
  out.qLength = mask.qLength;
  out.kvLength = physical ? cache.numPages() * pageSize : mask.kvLength;
  out.qBlockSize = mask.qBlockSize;
  out.kvBlockSize = mask.kvBlockSize;
  out.numQBlocks = mask.numQBlocks;
  out.maxKvBlocks = columns;
  const size_t rows = static_cast<size_t>(batch * mask.heads * mask.numQBlocks);
  out.kvNumBlocks.resize(rows);
  out.fullKvNumBlocks.resize(rows);
  out.kvIndices.resize(rows * static_cast<size_t>(columns));
  out.fullKvIndices.resize(rows * static_cast<size_t>(columns));

  // Pass 2: keep live blocks, demote straddling full blocks, translate.
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t> &table = cache.pageTable(slots[b]);
    auto translate = [&](int32_t block) { return physical ? table[block] : block; };
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t i = 0; i < mask.numQBlocks; ++i) {
        const int64_t row = out.rowIndex(b, h, i);
        int32_t *partial = out.kvIndices.data() + row * columns;
        int32_t *full = out.fullKvIndices.data() + row * columns;
        int32_t partialCount = 0, fullCount = 0;
        for (int32_t k = 0; k < mask.partialCount(b, h, i); ++k) {
          const int32_t block = mask.partialRow(b, h, i)[k];
          if (int64_t(block) * mask.kvBlockSize < bound[b])
            partial[partialCount++] = translate(block);
        }
        for (int32_t k = 0; k < mask.fullCount(b, h, i); ++k) {
          const int32_t block = mask.fullRow(b, h, i)[k];
          if (int64_t(block) * mask.kvBlockSize >= bound[b])
            continue;
          if (blockEnd(block) > bound[b])
            partial[partialCount++] = translate(block);
          else
            full[fullCount++] = translate(block);
        }
        out.kvNumBlocks[row] = partialCount;
        out.fullKvNumBlocks[row] = fullCount;
      }
  }
  return result;
}

//===----------------------------------------------------------------------===//
// Physical index views
//===----------------------------------------------------------------------===//

PhysicalIndexMap::PhysicalIndexMap(const PagedKVCache &cache, std::vector<int32_t> slots,
                                   std::vector<int32_t> kvLength)
    : cache_(cache), slots_(checkedSlots(cache, std::move(slots))),
      kvLength_(std::move(kvLength)) {
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
