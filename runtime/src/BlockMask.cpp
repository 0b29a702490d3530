//===- BlockMask.cpp - Building and checking block masks ------------------===//
//
// createBlockMask() has three ways to classify a block, from fastest to most
// general:
//  * diagonal: the mask reads q and kv only through q - kv, so a block's
//    class is a function of the set of differences it covers. With equal
//    block sizes every interior block on one block diagonal covers the same
//    set, so each diagonal is classified once; edge blocks (partial last q or
//    kv block) and unequal block sizes use a prefix sum over a table of the
//    mask per difference, which needs only qLength + kvLength evaluations.
//  * block classifier: the compiler's interval classification, per block.
//  * element-wise: maskRow over every (q, kv) pair.
//
//===----------------------------------------------------------------------===//
#include "Arithmetic.h"
#include "pagedc/BlockMask.h"
#include "pagedc/Error.h"
#include "pagedc/Mods.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace pagedc {

namespace {

constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();

/// Block geometry of one mask.
/// Rows i = 0 .. numQ - 1 of a mask are the q blocks firstQ + i.
struct Geometry {
  int64_t qLength, kvLength;
  int64_t qBlock, kvBlock;
  int64_t firstQ; // the first q block the mask covers
  int64_t numQ, numKv;

  Geometry(int64_t qLength, int64_t kvLength, int64_t qBlock, int64_t kvBlock,
           int64_t firstQ = 0)
      : qLength(qLength), kvLength(kvLength), qBlock(qBlock), kvBlock(kvBlock), firstQ(firstQ),
        numQ(ceilDiv(qLength, qBlock) - firstQ), numKv(ceilDiv(kvLength, kvBlock)) {}
  /// The first q position the mask covers.
  int64_t qBegin() const { return firstQ * qBlock; }
  int64_t qLo(int64_t i) const { return (firstQ + i) * qBlock; }
  int64_t qHi(int64_t i) const { return std::min((firstQ + i + 1) * qBlock, qLength) - 1; }
  int64_t kvLo(int64_t j) const { return j * kvBlock; }
  int64_t kvHi(int64_t j) const { return std::min((j + 1) * kvBlock, kvLength) - 1; }
};

void checkSizes(int64_t batch, int64_t heads, int64_t qLength, int64_t kvLength, int64_t qBlockSize,
                int64_t kvBlockSize, int64_t qBegin = 0) {
  if (batch < 1 || heads < 1)
    throw Error(fmt::format("block mask batch and heads must be at least 1 but are B={} and "
                            "H={}",
                            batch, heads));
  if (qLength < 1 || kvLength < 1 || qLength > kMaxIndex || kvLength > kMaxIndex)
    throw Error(fmt::format("block mask lengths must be from 1 to {} but are Q_LEN={} and "
                            "KV_LEN={}",
                            kMaxIndex, qLength, kvLength));
  if (qBlockSize < 1 || kvBlockSize < 1)
    throw Error(
        fmt::format("block sizes must be at least 1 but are {} x {}", qBlockSize, kvBlockSize));
  if (qBegin < 0 || qBegin >= qLength)
    throw Error(fmt::format("block mask first query position must be in [0, Q_LEN={}) but is {}",
                            qLength, qBegin));
}

/// Entries of a mask's index arrays and its bytes, refused beyond the budget
/// (and on any overflow) before anything is allocated.
void checkMaskBudget(int64_t batch, int64_t heads, const Geometry &g) {
  int64_t rows = 0, entries = 0, bytes = 0;
  const bool overflow = __builtin_mul_overflow(batch, heads, &rows) ||
                        __builtin_mul_overflow(rows, g.numQ, &rows) ||
                        __builtin_mul_overflow(rows, g.numKv + 1, &entries) ||
                        __builtin_mul_overflow(entries, int64_t(2 * sizeof(int32_t)), &bytes);
  if (overflow || bytes > kBlockMaskMaxBytes)
    throw Error(fmt::format(
        "the block mask would need {} for {} x {} rows of {} q blocks x {} kv blocks ({} x {} "
        "blocks over Q_LEN={} from position {}, KV_LEN={}), more than the block-mask memory "
        "budget of {} bytes; use larger blocks or fewer query rows",
        overflow ? std::string("more than 2^63 bytes") : fmt::format("{} bytes", bytes), batch,
        heads, g.numQ, g.numKv, g.qBlock, g.kvBlock, g.qLength, g.qBegin(), g.kvLength,
        kBlockMaskMaxBytes));
}

/// Shapes `mask` for the given extents, reusing its storage: counts and
/// indices are left for the builder to write (every row's counts are).
void shapeMask(BlockMask &mask, int64_t batch, int64_t heads, const Geometry &geometry) {
  mask.batch = batch;
  mask.heads = heads;
  mask.qLength = geometry.qLength;
  mask.kvLength = geometry.kvLength;
  mask.qBlockSize = static_cast<int32_t>(geometry.qBlock);
  mask.kvBlockSize = static_cast<int32_t>(geometry.kvBlock);
  mask.firstQBlock = geometry.firstQ;
  mask.numQBlocks = geometry.numQ;
  mask.maxKvBlocks = geometry.numKv;
  const size_t rows = static_cast<size_t>(batch * heads * geometry.numQ);
  mask.kvNumBlocks.resize(rows);
  mask.fullKvNumBlocks.resize(rows);
  mask.kvIndices.resize(rows * static_cast<size_t>(geometry.numKv));
  mask.fullKvIndices.resize(rows * static_cast<size_t>(geometry.numKv));
}

BlockMask allocateMask(int64_t batch, int64_t heads, const Geometry &geometry) {
  BlockMask mask;
  shapeMask(mask, batch, heads, geometry);
  return mask;
}

/// Appends blocks to one row of a mask under construction.
class RowWriter {
public:
  RowWriter(BlockMask &mask, int64_t row)
      : mask_(mask), row_(row), partial_(mask.kvIndices.data() + row * mask.maxKvBlocks),
        full_(mask.fullKvIndices.data() + row * mask.maxKvBlocks) {}
  ~RowWriter() {
    mask_.kvNumBlocks[row_] = partialCount_;
    mask_.fullKvNumBlocks[row_] = fullCount_;
  }
  void add(int64_t kvBlock, BlockClass cls) {
    if (cls == PartialBlock)
      partial_[partialCount_++] = static_cast<int32_t>(kvBlock);
    else if (cls == FullBlock)
      full_[fullCount_++] = static_cast<int32_t>(kvBlock);
  }
  void addFull(int64_t kvBlock) { full_[fullCount_++] = static_cast<int32_t>(kvBlock); }
  void addPartial(int64_t kvBlock) { partial_[partialCount_++] = static_cast<int32_t>(kvBlock); }

private:
  BlockMask &mask_;
  int64_t row_;
  int32_t *partial_;
  int32_t *full_;
  int32_t partialCount_ = 0, fullCount_ = 0;
};

void buildMask(const CompiledMods &mods, const PagedcModContext &context, int64_t batch,
               int64_t heads, const Geometry &geometry, BlockMaskMethod method, BlockMask &mask);

BlockClass classFromCount(int64_t trueCount, int64_t total) {
  if (trueCount == 0)
    return EmptyBlock;
  return trueCount == total ? FullBlock : PartialBlock;
}

BlockClass classFromClassifier(int32_t answer) {
  if (answer == 0)
    return EmptyBlock;
  return answer == 2 ? FullBlock : PartialBlock; // anything else: must run the mod
}

//===----------------------------------------------------------------------===//
// The three classification methods
//===----------------------------------------------------------------------===//

void buildElementWise(BlockMask &mask, const Geometry &g, const CompiledMods &mods,
                      const PagedcModContext &context) {
  std::vector<uint8_t> values(static_cast<size_t>(g.kvLength));
  std::vector<int64_t> trueCounts(static_cast<size_t>(g.numKv));
  for (int64_t b = 0; b < mask.batch; ++b)
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t i = 0; i < g.numQ; ++i) {
        std::fill(trueCounts.begin(), trueCounts.end(), 0);
        for (int64_t q = g.qLo(i); q <= g.qHi(i); ++q) {
          mods.maskRow(&context, static_cast<int32_t>(b), static_cast<int32_t>(h),
                       static_cast<int32_t>(q), 0, static_cast<int32_t>(g.kvLength), values.data());
          for (int64_t j = 0; j < g.numKv; ++j) {
            int64_t count = 0;
            for (int64_t kv = g.kvLo(j); kv <= g.kvHi(j); ++kv)
              count += values[kv] != 0;
            trueCounts[j] += count;
          }
        }
        RowWriter row(mask, mask.rowIndex(b, h, i));
        const int64_t rows = g.qHi(i) - g.qLo(i) + 1;
        for (int64_t j = 0; j < g.numKv; ++j)
          row.add(j, classFromCount(trueCounts[j], rows * (g.kvHi(j) - g.kvLo(j) + 1)));
      }
}

void buildWithClassifier(BlockMask &mask, const Geometry &g, const CompiledMods &mods,
                         const PagedcModContext &context) {
  for (int64_t b = 0; b < mask.batch; ++b)
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t i = 0; i < g.numQ; ++i) {
        RowWriter row(mask, mask.rowIndex(b, h, i));
        for (int64_t j = 0; j < g.numKv; ++j)
          row.add(j, classFromClassifier(mods.maskBlockClass(
                         &context, static_cast<int32_t>(b), static_cast<int32_t>(h),
                         static_cast<int32_t>(g.qLo(i)), static_cast<int32_t>(g.qHi(i)),
                         static_cast<int32_t>(g.kvLo(j)), static_cast<int32_t>(g.kvHi(j)))));
      }
}

/// Classifies rectangles of a mask that reads q and kv only through q - kv,
/// for one (b, h).
class DiagonalClassifier {
public:
  DiagonalClassifier(const CompiledMods &mods, const PagedcModContext &context, const Geometry &g,
                     int32_t b, int32_t h)
      : mods_(mods), context_(context), g_(g), b_(b), h_(h) {
    if (mods.maskBlockClass)
      return; // the classifier answers rectangles directly
    // mask(q, kv) = f(q - kv) for q - kv in [-(kvLength - 1), qLength - 1];
    // prefix_[t + 1] counts the true values of f at differences up to
    // t - (kvLength - 1). Row q covers t in [q, q + kvLength - 1], in
    // increasing t as kv decreases; rows 0, kvLength, 2 kvLength, ...,
    // qLength - 1 cover every t, and each t is taken from the first row
    // that reaches it. Counts stay below 2^32.
    // Only rows from g.qBegin() on are covered: t = q - kv + offset counts
    // from the smallest difference of those rows, so the table is
    // O(Q_LEN - qBegin + KV_LEN) (a decode step's is O(KV_LEN)).
    const int64_t offset = g.kvLength - 1 - g.qBegin();
    std::vector<uint8_t> values(static_cast<size_t>(g.kvLength));
    prefix_.resize(static_cast<size_t>(g.qLength - g.qBegin() + g.kvLength));
    prefix_[0] = 0;
    uint32_t running = 0;
    int64_t next = 0; // the first t not counted yet
    for (int64_t q = g.qBegin();; q = std::min(q + g.kvLength, g.qLength - 1)) {
      mods.maskRow(&context, b, h, static_cast<int32_t>(q), 0, static_cast<int32_t>(g.kvLength),
                   values.data());
      for (int64_t t = next; t <= q + offset; ++t) {
        running += values[q + offset - t] != 0;
        prefix_[t + 1] = running;
      }
      next = q + offset + 1;
      if (q == g.qLength - 1)
        break;
    }
  }

  /// The class of the rectangle [qLo, qHi] x [kvLo, kvHi]. Every difference
  /// between qLo - kvHi and qHi - kvLo occurs in it.
  BlockClass classify(int64_t qLo, int64_t qHi, int64_t kvLo, int64_t kvHi) const {
    if (mods_.maskBlockClass)
      return classFromClassifier(mods_.maskBlockClass(
          &context_, b_, h_, static_cast<int32_t>(qLo), static_cast<int32_t>(qHi),
          static_cast<int32_t>(kvLo), static_cast<int32_t>(kvHi)));
    const int64_t offset = g_.kvLength - 1 - g_.qBegin();
    const int64_t lo = qLo - kvHi + offset, hi = qHi - kvLo + offset;
    return classFromCount(int64_t(prefix_[hi + 1] - prefix_[lo]), hi - lo + 1);
  }

private:
  const CompiledMods &mods_;
  const PagedcModContext &context_;
  const Geometry &g_;
  int32_t b_, h_;
  std::vector<uint32_t> prefix_;
};

void buildDiagonal(BlockMask &mask, const Geometry &g, const CompiledMods &mods,
                   const PagedcModContext &context) {
  for (int64_t b = 0; b < mask.batch; ++b)
    for (int64_t h = 0; h < mask.heads; ++h) {
      DiagonalClassifier classifier(mods, context, g, static_cast<int32_t>(b),
                                    static_cast<int32_t>(h));
      auto classifyBlock = [&](int64_t i, int64_t j) {
        return classifier.classify(g.qLo(i), g.qHi(i), g.kvLo(j), g.kvHi(j));
      };
      if (g.qBlock != g.kvBlock) {
        for (int64_t i = 0; i < g.numQ; ++i) {
          RowWriter row(mask, mask.rowIndex(b, h, i));
          for (int64_t j = 0; j < g.numKv; ++j)
            row.add(j, classifyBlock(i, j));
        }
        continue;
      }
      // Equal block sizes: interior block (a, j) (a = firstQ + i, the
      // absolute q block) has the class of diagonal d = j - a. Rows
      // [firstQ, wholeRows) and columns [0, wholeCols) hold whole blocks;
      // the partial last row or column is classified block by block.
      const int64_t wholeRows = g.qLength / g.qBlock, wholeCols = g.kvLength / g.kvBlock;
      std::vector<int64_t> fullDiagonals, partialDiagonals;
      if (wholeRows > g.firstQ && wholeCols > 0)
        for (int64_t d = -(wholeRows - 1); d <= wholeCols - 1 - g.firstQ; ++d) {
          // A whole block of a covered row on this diagonal.
          const int64_t a = std::max(g.firstQ, -d);
          const BlockClass cls = classifyBlock(a - g.firstQ, a + d);
          if (cls == FullBlock)
            fullDiagonals.push_back(d);
          else if (cls == PartialBlock)
            partialDiagonals.push_back(d);
        }
      for (int64_t i = 0; i < g.numQ; ++i) {
        RowWriter row(mask, mask.rowIndex(b, h, i));
        const int64_t a = g.firstQ + i;
        if (a >= wholeRows) {
          for (int64_t j = 0; j < g.numKv; ++j)
            row.add(j, classifyBlock(i, j));
          continue;
        }
        // Diagonals d with 0 <= a + d < wholeCols, in increasing j order.
        for (auto it = std::lower_bound(partialDiagonals.begin(), partialDiagonals.end(), -a);
             it != partialDiagonals.end() && a + *it < wholeCols; ++it)
          row.addPartial(a + *it);
        for (auto it = std::lower_bound(fullDiagonals.begin(), fullDiagonals.end(), -a);
             it != fullDiagonals.end() && a + *it < wholeCols; ++it)
          row.addFull(a + *it);
        if (wholeCols < g.numKv)
          row.add(wholeCols, classifyBlock(i, wholeCols));
      }
    }
}

} // namespace

//===----------------------------------------------------------------------===//
// Public entry points
//===----------------------------------------------------------------------===//

BlockMask createBlockMask(const CompiledMods &mods, const PagedcModContext &context, int64_t batch,
                          int64_t heads, int64_t qLength, int64_t kvLength, int32_t qBlockSize,
                          int32_t kvBlockSize, BlockMaskMethod method) {
  BlockMask mask;
  createBlockMaskInto(mods, context, batch, heads, qLength, kvLength, qBlockSize, kvBlockSize,
                      method, mask);
  return mask;
}

void createBlockMaskInto(const CompiledMods &mods, const PagedcModContext &context, int64_t batch,
                         int64_t heads, int64_t qLength, int64_t kvLength, int32_t qBlockSize,
                         int32_t kvBlockSize, BlockMaskMethod method, BlockMask &mask) {
  createBlockMaskRowsInto(mods, context, batch, heads, 0, qLength, kvLength, qBlockSize,
                          kvBlockSize, method, mask);
}

BlockMask createBlockMaskRows(const CompiledMods &mods, const PagedcModContext &context,
                              int64_t batch, int64_t heads, int64_t qBegin, int64_t qLength,
                              int64_t kvLength, int32_t qBlockSize, int32_t kvBlockSize,
                              BlockMaskMethod method) {
  BlockMask mask;
  createBlockMaskRowsInto(mods, context, batch, heads, qBegin, qLength, kvLength, qBlockSize,
                          kvBlockSize, method, mask);
  return mask;
}

void createBlockMaskRowsInto(const CompiledMods &mods, const PagedcModContext &context,
                             int64_t batch, int64_t heads, int64_t qBegin, int64_t qLength,
                             int64_t kvLength, int32_t qBlockSize, int32_t kvBlockSize,
                             BlockMaskMethod method, BlockMask &mask) {
  checkSizes(batch, heads, qLength, kvLength, qBlockSize, kvBlockSize, qBegin);
  if (mods.hasMask() && !mods.maskRow)
    throw Error(
        fmt::format("mask mod '{}' has no CPU function to build a block mask with", mods.maskName));
  const Geometry geometry(qLength, kvLength, qBlockSize, kvBlockSize, qBegin / qBlockSize);
  const ModDependence &dependence = mods.maskDependence;
  const bool perB = mods.hasMask() && dependence.b, perH = mods.hasMask() && dependence.h;
  checkMaskBudget(perB ? batch : 1, perH ? heads : 1, geometry);
  try {
    buildMask(mods, context, batch, heads, geometry, method, mask);
  } catch (const std::bad_alloc &) {
    throw Error(fmt::format("out of memory building a block mask of {} x {} rows x {} kv blocks",
                            perB ? batch : 1, perH ? heads : 1, geometry.numQ, geometry.numKv));
  }
}

namespace {
void buildMask(const CompiledMods &mods, const PagedcModContext &context, int64_t batch,
               int64_t heads, const Geometry &geometry, BlockMaskMethod method, BlockMask &mask) {
  if (!mods.hasMask()) {
    shapeMask(mask, 1, 1, geometry);
    for (int64_t i = 0; i < geometry.numQ; ++i) {
      RowWriter row(mask, i);
      for (int64_t j = 0; j < geometry.numKv; ++j)
        row.addFull(j);
    }
    return;
  }
  const ModDependence &dependence = mods.maskDependence;
  shapeMask(mask, dependence.b ? batch : 1, dependence.h ? heads : 1, geometry);
  if (method == BlockMaskMethod::ElementWise)
    buildElementWise(mask, geometry, mods, context);
  else if (dependence.diagonal)
    buildDiagonal(mask, geometry, mods, context);
  else if (mods.maskBlockClass)
    buildWithClassifier(mask, geometry, mods, context);
  else
    buildElementWise(mask, geometry, mods, context);
}
} // namespace

void validateBlockMask(const BlockMask &mask) {
  if (mask.batch < 1 || mask.heads < 1)
    throw Error(fmt::format("block mask batch and heads must be at least 1 but are B={} and "
                            "H={}",
                            mask.batch, mask.heads));
  if (mask.qBlockSize < 1 || mask.kvBlockSize < 1)
    throw Error(fmt::format("block mask block sizes must be at least 1 but are {} x {}",
                            mask.qBlockSize, mask.kvBlockSize));
  if (mask.qLength < 0 || mask.kvLength < 0 || mask.qLength > kMaxIndex ||
      mask.kvLength > kMaxIndex)
    throw Error(fmt::format("block mask lengths must be from 0 to {} but are Q_LEN={} and "
                            "KV_LEN={}",
                            kMaxIndex, mask.qLength, mask.kvLength));
  const int64_t totalQBlocks = ceilDiv(mask.qLength, mask.qBlockSize);
  if (mask.firstQBlock < 0 || (mask.firstQBlock > 0 && mask.firstQBlock >= totalQBlocks))
    throw Error(fmt::format("block mask first q block {} is outside [0, {}) (Q_LEN={}, q block "
                            "size {})",
                            mask.firstQBlock, totalQBlocks, mask.qLength, mask.qBlockSize));
  if (mask.numQBlocks != totalQBlocks - mask.firstQBlock)
    throw Error(fmt::format("block mask has {} q blocks but Q_LEN={} with q block size {} from q "
                            "block {} needs {}",
                            mask.numQBlocks, mask.qLength, mask.qBlockSize, mask.firstQBlock,
                            totalQBlocks - mask.firstQBlock));
  if (mask.maxKvBlocks < 0)
    throw Error(
        fmt::format("block mask maxKvBlocks must not be negative but is {}", mask.maxKvBlocks));
  int64_t rows = 0, entries = 0;
  if (__builtin_mul_overflow(mask.batch, mask.heads, &rows) ||
      __builtin_mul_overflow(rows, mask.numQBlocks, &rows) ||
      __builtin_mul_overflow(rows, mask.maxKvBlocks, &entries))
    throw Error(fmt::format("block mask shape B={} x H={} x {} q blocks x maxKvBlocks={} "
                            "overflows 64 bits",
                            mask.batch, mask.heads, mask.numQBlocks, mask.maxKvBlocks));
  auto checkSize = [](const std::vector<int32_t> &array, int64_t expected, const char *name) {
    if (static_cast<int64_t>(array.size()) != expected)
      throw Error(fmt::format("block mask {} has {} entries but its shape needs {}", name,
                              array.size(), expected));
  };
  checkSize(mask.kvNumBlocks, rows, "kvNumBlocks");
  checkSize(mask.kvIndices, entries, "kvIndices");
  const bool hasFull = !mask.fullKvNumBlocks.empty() || !mask.fullKvIndices.empty();
  if (hasFull) {
    checkSize(mask.fullKvNumBlocks, rows, "fullKvNumBlocks");
    checkSize(mask.fullKvIndices, entries, "fullKvIndices");
  }
  const int64_t numKv = mask.numKvBlocks();
  // Duplicates within a row: a mark per kv block when there are not many
  // more kv blocks than a row can list (every mask createBlockMask builds),
  // else a sorted copy of each row, so a user mask of few blocks per row over
  // KV_LEN 2^31 with 1-token blocks does not allocate 16 GB of marks.
  const bool marks = rows > 0 && numKv <= std::max<int64_t>(4096, 4 * mask.maxKvBlocks);
  std::vector<int64_t> seenInRow(marks ? static_cast<size_t>(numKv) : 0, -1);
  std::vector<int32_t> sorted;
  auto checkList = [&](int64_t row, int32_t count, const int32_t *indices, const char *name) {
    if (count < 0 || count > mask.maxKvBlocks)
      throw Error(fmt::format("block mask row {} has {} {} blocks; the count must be from 0 to "
                              "{}",
                              row, count, name, mask.maxKvBlocks));
    for (int32_t k = 0; k < count; ++k) {
      const int32_t block = indices[k];
      if (block < 0 || block >= numKv)
        throw Error(fmt::format("block mask row {} lists {} kv block {}, outside [0, {})", row,
                                name, block, numKv));
      if (!marks)
        continue;
      if (seenInRow[block] == row)
        throw Error(fmt::format("block mask row {} lists kv block {} twice", row, block));
      seenInRow[block] = row;
    }
    if (!marks)
      sorted.insert(sorted.end(), indices, indices + count);
  };
  for (int64_t row = 0; row < rows; ++row) {
    sorted.clear();
    checkList(row, mask.kvNumBlocks[row], mask.kvIndices.data() + row * mask.maxKvBlocks,
              "partial");
    if (hasFull)
      checkList(row, mask.fullKvNumBlocks[row], mask.fullKvIndices.data() + row * mask.maxKvBlocks,
                "full");
    if (sorted.size() > 1) { // the row's partial and full lists, without marks
      std::sort(sorted.begin(), sorted.end());
      auto twice = std::adjacent_find(sorted.begin(), sorted.end());
      if (twice != sorted.end())
        throw Error(fmt::format("block mask row {} lists kv block {} twice", row, *twice));
    }
  }
}

BlockMask blockMaskFromKvBlocks(std::vector<int32_t> kvNumBlocks, std::vector<int32_t> kvIndices,
                                std::vector<int32_t> fullKvNumBlocks,
                                std::vector<int32_t> fullKvIndices, int64_t batch, int64_t heads,
                                int64_t maxKvBlocks, int64_t qLength, int64_t kvLength,
                                int32_t qBlockSize, int32_t kvBlockSize) {
  if (fullKvNumBlocks.empty() != fullKvIndices.empty())
    throw Error("full block counts and indices must be given together");
  BlockMask mask;
  mask.batch = batch;
  mask.heads = heads;
  mask.qLength = qLength;
  mask.kvLength = kvLength;
  mask.qBlockSize = qBlockSize;
  mask.kvBlockSize = kvBlockSize;
  mask.numQBlocks = qBlockSize > 0 ? ceilDiv(qLength, qBlockSize) : 0;
  mask.maxKvBlocks = maxKvBlocks;
  mask.kvNumBlocks = std::move(kvNumBlocks);
  mask.kvIndices = std::move(kvIndices);
  mask.fullKvNumBlocks = std::move(fullKvNumBlocks);
  mask.fullKvIndices = std::move(fullKvIndices);
  validateBlockMask(mask);
  return mask;
}

BlockMask denseToBlockMask(const uint8_t *dense, int64_t batch, int64_t heads, int64_t qLength,
                           int64_t kvLength, int32_t qBlockSize, int32_t kvBlockSize) {
  checkSizes(batch, heads, qLength, kvLength, qBlockSize, kvBlockSize);
  // checkSizes() leaves at least one element to read, so there is no shape
  // for which a null array is valid.
  if (dense == nullptr)
    throw Error(fmt::format("denseToBlockMask: dense is null but must point to the [{}, {}, {}, "
                            "{}] element mask",
                            batch, heads, qLength, kvLength));
  const Geometry g(qLength, kvLength, qBlockSize, kvBlockSize);
  BlockMask mask = allocateMask(batch, heads, g);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < g.numQ; ++i) {
        RowWriter row(mask, mask.rowIndex(b, h, i));
        for (int64_t j = 0; j < g.numKv; ++j) {
          int64_t count = 0;
          for (int64_t q = g.qLo(i); q <= g.qHi(i); ++q) {
            const uint8_t *values = dense + ((b * heads + h) * qLength + q) * kvLength;
            for (int64_t kv = g.kvLo(j); kv <= g.kvHi(j); ++kv)
              count += values[kv] != 0;
          }
          row.add(j,
                  classFromCount(count, (g.qHi(i) - g.qLo(i) + 1) * (g.kvHi(j) - g.kvLo(j) + 1)));
        }
      }
  return mask;
}

bool blockMaskVisitsGrow(const BlockMask &mask) {
  for (int64_t b = 0; b < mask.batch; ++b)
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t q = 1; q < mask.numQBlocks; ++q)
        if (int64_t(mask.partialCount(b, h, q)) + mask.fullCount(b, h, q) <
            int64_t(mask.partialCount(b, h, q - 1)) + mask.fullCount(b, h, q - 1))
          return false;
  return true;
}

std::vector<uint8_t> toDenseBlocks(const BlockMask &mask) {
  validateBlockMask(mask);
  const int64_t numKv = mask.numKvBlocks();
  // No rows or no columns: nothing to write, whatever batch x heads says (a
  // Q_LEN 0 mask of 2^31 x 2^31 (b, h) pairs looped 2^62 times).
  if (mask.numQBlocks == 0 || numKv == 0)
    return {};
  std::vector<uint8_t> blocks(
      static_cast<size_t>(mask.batch * mask.heads * mask.numQBlocks * numKv), EmptyBlock);
  for (int64_t b = 0; b < mask.batch; ++b)
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t i = 0; i < mask.numQBlocks; ++i) {
        uint8_t *row = blocks.data() + mask.rowIndex(b, h, i) * numKv;
        for (int32_t k = 0; k < mask.partialCount(b, h, i); ++k)
          row[mask.partialRow(b, h, i)[k]] = PartialBlock;
        for (int32_t k = 0; k < mask.fullCount(b, h, i); ++k)
          row[mask.fullRow(b, h, i)[k]] = FullBlock;
      }
  return blocks;
}

std::vector<uint8_t> toDense(const BlockMask &mask, const CompiledMods *mods,
                             const PagedcModContext *context) {
  const std::vector<uint8_t> blocks = toDenseBlocks(mask);
  const bool applyMod = mods && mods->hasMask();
  if (applyMod && !mods->maskRow)
    throw Error(fmt::format("mask mod '{}' has no CPU function", mods->maskName));
  const PagedcModContext emptyContext{nullptr, nullptr};
  const Geometry g(mask.qLength, mask.kvLength, mask.qBlockSize, mask.kvBlockSize,
                   mask.firstQBlock);
  if (g.numQ == 0 || g.numKv == 0)
    return {}; // empty, however many (b, h) pairs
  std::vector<uint8_t> dense(static_cast<size_t>(mask.batch * mask.heads * g.qLength * g.kvLength),
                             0);
  for (int64_t b = 0; b < mask.batch; ++b)
    for (int64_t h = 0; h < mask.heads; ++h)
      for (int64_t i = 0; i < g.numQ; ++i)
        for (int64_t j = 0; j < g.numKv; ++j) {
          const uint8_t cls = blocks[mask.rowIndex(b, h, i) * g.numKv + j];
          if (cls == EmptyBlock)
            continue;
          for (int64_t q = g.qLo(i); q <= g.qHi(i); ++q) {
            uint8_t *out = dense.data() + ((b * mask.heads + h) * g.qLength + q) * g.kvLength;
            const int64_t begin = g.kvLo(j), count = g.kvHi(j) - g.kvLo(j) + 1;
            if (cls == FullBlock || !applyMod) {
              std::fill(out + begin, out + begin + count, 1);
              continue;
            }
            mods->maskRow(context ? context : &emptyContext, static_cast<int32_t>(b),
                          static_cast<int32_t>(h), static_cast<int32_t>(q),
                          static_cast<int32_t>(begin), static_cast<int32_t>(count), out + begin);
            for (int64_t k = 0; k < count; ++k)
              out[begin + k] = out[begin + k] != 0;
          }
        }
  return dense;
}

} // namespace pagedc
