//===- Reference.cpp - Float64 reference attention and test caches --------===//
#include "cpu/Reference.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

namespace pagedc::cpu {

double readAsDouble(const TensorView &view, int64_t offset) {
  const void *data = view.data();
  switch (view.dtype()) {
  case DType::F32: return static_cast<const float *>(data)[offset];
  case DType::F64: return static_cast<const double *>(data)[offset];
  case DType::F16: return halfToFloat(static_cast<const uint16_t *>(data)[offset]);
  case DType::BF16: return bf16ToFloat(static_cast<const uint16_t *>(data)[offset]);
  case DType::I32: return static_cast<const int32_t *>(data)[offset];
  case DType::I64: return static_cast<double>(static_cast<const int64_t *>(data)[offset]);
  case DType::U8: return static_cast<const uint8_t *>(data)[offset];
  case DType::Bool: return static_cast<const uint8_t *>(data)[offset] != 0;
  case DType::F8E4M3:
  case DType::F8E5M2:
    return float8ToFloat(static_cast<const uint8_t *>(data)[offset], view.dtype());
  }
  return 0.0;
}

/// Offset of element (i0, i1, i2, i3) of a rank-4 view.
static int64_t offset4(const TensorView &t, int64_t i0, int64_t i1, int64_t i2,
                       int64_t i3) {
  return i0 * t.stride(0) + i1 * t.stride(1) + i2 * t.stride(2) + i3 * t.stride(3);
}

ReferenceResult referenceAttention(const ReferenceArgs &args) {
  const TensorView &q = args.q, &k = args.k, &v = args.v;
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    throw Error("referenceAttention: q, k and v must be rank 4");
  int64_t batch = q.size(0), qHeads = q.size(1), qLength = q.size(2), dim = q.size(3);
  int64_t kvHeads = k.size(1), kvCapacity = k.size(2), vDim = v.size(3);
  if (k.size(0) != batch || v.size(0) != batch || k.size(3) != dim ||
      v.size(1) != kvHeads || v.size(2) != kvCapacity || kvHeads == 0 ||
      qHeads % kvHeads != 0)
    throw Error(fmt::format("referenceAttention: inconsistent shapes q {} k {} v {}",
                            q.shapeString(), k.shapeString(), v.shapeString()));
  int64_t group = qHeads / kvHeads;
  const CompiledMods *mods = args.mods;
  bool hasMask = mods && mods->hasMask();
  bool hasScore = mods && mods->hasScore();
  PagedcModContext emptyContext{nullptr, nullptr};
  const PagedcModContext &context = args.context ? *args.context : emptyContext;

  ReferenceResult result;
  result.batch = batch;
  result.heads = qHeads;
  result.qLength = qLength;
  result.vDim = vDim;
  result.out.assign(batch * qHeads * qLength * vDim, 0.0);
  result.lse.assign(batch * qHeads * qLength, -std::numeric_limits<double>::infinity());

  std::vector<double> scores(kvCapacity);
  std::vector<char> kept(kvCapacity);
  // The rows in double, read once (a KV head's K and V for its query heads,
  // a query row for its keys): the same values and sums as reading each
  // element where it is used.
  std::vector<double> kRows, vRows, qRow(dim);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t kvLength = args.kvLength ? std::min<int64_t>(args.kvLength[b], kvCapacity)
                                     : kvCapacity;
    int64_t qOffset = args.qOffset ? args.qOffset[b] : 0;
    for (int64_t h = 0; h < qHeads; ++h) {
      int64_t kvHead = h / group;
      if (h % group == 0) {
        kRows.resize(kvLength * dim);
        vRows.resize(kvLength * vDim);
        for (int64_t j = 0; j < kvLength; ++j) {
          for (int64_t d = 0; d < dim; ++d)
            kRows[j * dim + d] = readAsDouble(k, offset4(k, b, kvHead, j, d));
          for (int64_t d = 0; d < vDim; ++d)
            vRows[j * vDim + d] = readAsDouble(v, offset4(v, b, kvHead, j, d));
        }
      }
      for (int64_t i = 0; i < qLength; ++i) {
        int32_t qPos = static_cast<int32_t>(qOffset + i);
        for (int64_t d = 0; d < dim; ++d)
          qRow[d] = readAsDouble(q, offset4(q, b, h, i, d));
        double maxScore = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < kvLength; ++j) {
          int32_t kv = static_cast<int32_t>(j);
          kept[j] = !hasMask || mods->maskReference(context, static_cast<int32_t>(b),
                                                    static_cast<int32_t>(h), qPos, kv);
          if (!kept[j])
            continue;
          double dot = 0.0;
          const double *kRow = &kRows[j * dim];
          for (int64_t d = 0; d < dim; ++d)
            dot += qRow[d] * kRow[d];
          double score = args.scale * dot;
          if (hasScore)
            score = mods->scoreReference(context, score, static_cast<int32_t>(b),
                                         static_cast<int32_t>(h), qPos, kv);
          scores[j] = score;
          maxScore = std::max(maxScore, score);
        }
        // The sink is a key of value zero: it raises the max and the sum
        // only.
        const double sink = args.sinks ? static_cast<double>(args.sinks[h])
                                       : -std::numeric_limits<double>::infinity();
        double *outRow = &result.out[((b * qHeads + h) * qLength + i) * vDim];
        if (std::isnan(sink)) {
          std::fill(outRow, outRow + vDim, sink);
          result.lse[(b * qHeads + h) * qLength + i] = sink;
          continue;
        }
        maxScore = std::max(maxScore, sink);
        if (maxScore == -std::numeric_limits<double>::infinity())
          continue; // fully masked, no sink: out stays 0, lse -inf
        double sum = std::exp(sink - maxScore);
        for (int64_t j = 0; j < kvLength; ++j) {
          if (!kept[j])
            continue;
          double weight = std::exp(scores[j] - maxScore);
          sum += weight;
          const double *vRow = &vRows[j * vDim];
          for (int64_t d = 0; d < vDim; ++d)
            outRow[d] += weight * vRow[d];
        }
        for (int64_t d = 0; d < vDim; ++d)
          outRow[d] /= sum;
        result.lse[(b * qHeads + h) * qLength + i] = maxScore + std::log(sum);
      }
    }
  }
  return result;
}

PagedCache buildPagedCache(const TensorView &k, const TensorView &v,
                           const int32_t *kvLength, int32_t pageSize,
                           DType storage, uint64_t seed, int64_t sparePages) {
  if (k.rank() != 4 || v.rank() != 4 || pageSize <= 0)
    throw Error("buildPagedCache: k and v must be rank 4 and pageSize positive");
  if (storage != DType::F32 && storage != DType::BF16 && storage != DType::F16)
    throw Error(fmt::format("buildPagedCache: unsupported storage dtype {}",
                            dtypeName(storage)));
  int64_t batch = k.size(0), kvHeads = k.size(1), capacity = k.size(2);
  int64_t dim = k.size(3), vDim = v.size(3);
  std::vector<int64_t> pagesPerSequence(batch);
  int64_t maxPages = 0, usedPages = 0;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t length = kvLength ? kvLength[b] : capacity;
    if (length > capacity)
      throw Error(fmt::format("buildPagedCache: kvLength[{}] = {} exceeds Lkv = {}", b,
                              length, capacity));
    pagesPerSequence[b] = (length + pageSize - 1) / pageSize;
    maxPages = std::max(maxPages, pagesPerSequence[b]);
    usedPages += pagesPerSequence[b];
  }

  PagedCache cache;
  cache.pageSize = pageSize;
  cache.numPages = usedPages + sparePages;
  cache.pageTableStride = std::max<int64_t>(maxPages, 1);
  cache.pageTable.assign(batch * cache.pageTableStride, -1);
  cache.kCache = HostTensor(storage, {kvHeads, cache.numPages, pageSize, dim});
  cache.vCache = HostTensor(storage, {kvHeads, cache.numPages, pageSize, vDim});

  auto store = [storage](HostTensor &tensor, int64_t index, double value) {
    if (storage == DType::F32)
      tensor.dataAs<float>()[index] = static_cast<float>(value);
    else if (storage == DType::F16)
      tensor.dataAs<uint16_t>()[index] = floatToHalf(static_cast<float>(value));
    else
      tensor.dataAs<uint16_t>()[index] = floatToBF16(static_cast<float>(value));
  };
  double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t i = 0; i < cache.kCache.numel(); ++i)
    store(cache.kCache, i, nan);
  for (int64_t i = 0; i < cache.vCache.numel(); ++i)
    store(cache.vCache, i, nan);

  std::vector<int32_t> physical(cache.numPages);
  std::iota(physical.begin(), physical.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(physical.begin(), physical.end(), rng);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t length = kvLength ? kvLength[b] : capacity;
    for (int64_t p = 0; p < pagesPerSequence[b]; ++p)
      cache.pageTable[b * cache.pageTableStride + p] = physical[next++];
    for (int64_t h = 0; h < kvHeads; ++h) {
      for (int64_t j = 0; j < length; ++j) {
        int64_t page = cache.pageTable[b * cache.pageTableStride + j / pageSize];
        int64_t slot = (h * cache.numPages + page) * pageSize + j % pageSize;
        for (int64_t d = 0; d < dim; ++d)
          store(cache.kCache, slot * dim + d, readAsDouble(k, offset4(k, b, h, j, d)));
        for (int64_t d = 0; d < vDim; ++d)
          store(cache.vCache, slot * vDim + d, readAsDouble(v, offset4(v, b, h, j, d)));
      }
    }
  }
  return cache;
}

} // namespace pagedc::cpu
