//===- BlockMask.h - FlexAttention block-sparse masks ----------*- C++ -*-===//
//
// A BlockMask classifies Q_BLOCK x KV_BLOCK tiles of the (q, kv) plane per
// (batch, head, q block): "partial" tiles (kv_indices) need mask_mod per
// element; "full" tiles (full_kv_indices) are kept whole and skip mask_mod;
// tiles in neither list are skipped. Indices are *logical* kv block numbers:
// pagedc kernels translate them through the page table themselves.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BLOCKMASK_H
#define PAGEDC_BLOCKMASK_H

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
  int64_t numQBlocks = 0;  // ceil(qLength / qBlockSize)
  int64_t maxKvBlocks = 0; // columns of the index arrays

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
  /// broadcast of a batch or head extent of 1.
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
};

} // namespace pagedc

#endif // PAGEDC_BLOCKMASK_H
