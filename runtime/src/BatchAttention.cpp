//===- BatchAttention.cpp - The serving engine's batch call ---------------===//
//
// plan() checks a step's metadata and copies it into storage sized at
// construction; run() checks the tensors, views the engine's cache as the
// kernels' [Hkv, pages, pageSize, D] through strides alone (no copy), and
// runs the CPU kernel over the packed rows or enqueues the CUDA one
// (cuda/CudaBatchAttention.cpp).
//
//===----------------------------------------------------------------------===//
#include "pagedc/BatchAttention.h"

#include "KeyBounds.h"
#include "TensorChecks.h"
#include "cpu/CpuAttention.h"
#include "cuda/CudaBatchAttention.h"
#include "cuda/CudaMergeState.h"
#include "pagedc/Error.h"
#include "pagedc/KernelSource.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <utility>

namespace pagedc {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using detail::checkedScales;
using detail::checkReadable;
using detail::checkWritable;
using detail::isCpuFloat;
using detail::isProvided;
using detail::shapeText;

/// A host int32 vector argument of plan().
void checkHostIndexTensor(const TensorView &view, const char *name, int rank) {
  if (view.device().kind != DeviceKind::CPU)
    throw Error(fmt::format("{} must be in host memory but is on {}", name,
                            deviceName(view.device())));
  if (view.dtype() != DType::I32)
    throw Error(fmt::format("{} must be int32 but is {}", name, dtypeName(view.dtype())));
  if (view.rank() != rank)
    throw Error(fmt::format("{} must have rank {} but has shape {}", name, rank,
                            view.shapeString()));
  for (int d = 0; d < view.rank(); ++d)
    if (view.stride(d) < 0)
      throw Error(fmt::format("{} has negative stride {} in dimension {}", name,
                              view.stride(d), d));
  if (view.data() == nullptr && view.numel() != 0)
    throw Error(fmt::format("{} has no data", name));
}

/// A cache tensor of the configured layout as the kernel's
/// [Hkv, pages, pageSize, width] view. `part` selects K (0) or V (1) of the
/// combined vLLM tensor.
TensorView kernelCacheView(const TensorView &cache, KVLayout layout, int part, Device device) {
  const std::vector<int64_t> s = cache.strides();
  const std::vector<int64_t> n = cache.shape();
  switch (layout) {
  case KVLayout::Pagedc:
    return cache;
  case KVLayout::NHD: // [pages, pageSize, Hkv, D]
    return TensorView(cache.data(), cache.dtype(), {n[2], n[0], n[1], n[3]},
                      {s[2], s[0], s[1], s[3]}, device);
  case KVLayout::HND: // [pages, Hkv, pageSize, D]
    return TensorView(cache.data(), cache.dtype(), {n[1], n[0], n[2], n[3]},
                      {s[1], s[0], s[2], s[3]}, device);
  case KVLayout::VLLM: { // [2, pages, pageSize, Hkv, D]
    char *base = static_cast<char *>(cache.data()) +
                 part * s[0] * static_cast<int64_t>(dtypeSize(cache.dtype()));
    return TensorView(base, cache.dtype(), {n[3], n[1], n[2], n[4]}, {s[3], s[1], s[2], s[4]},
                      device);
  }
  }
  return cache;
}

/// The shape a layout's cache tensor must have, with -1 for the page count.
std::vector<int64_t> layoutShape(KVLayout layout, int64_t heads, int64_t pageSize,
                                 int64_t width) {
  switch (layout) {
  case KVLayout::Pagedc: return {heads, -1, pageSize, width};
  case KVLayout::NHD: return {-1, pageSize, heads, width};
  case KVLayout::HND: return {-1, heads, pageSize, width};
  case KVLayout::VLLM: return {2, -1, pageSize, heads, width};
  }
  return {};
}

const char *layoutDims(KVLayout layout) {
  switch (layout) {
  case KVLayout::Pagedc: return "[Hkv, pages, page_size, D]";
  case KVLayout::NHD: return "[pages, page_size, Hkv, D]";
  case KVLayout::HND: return "[pages, Hkv, page_size, D]";
  case KVLayout::VLLM: return "[2, pages, page_size, Hkv, D]";
  }
  return "?";
}

/// The element type a cache tensor is read as: its own, or the 8-bit float
/// type options.kvDtype names for a u8 tensor.
DType storedType(const TensorView &cache, const char *name, const BatchRunOptions &options) {
  if (!options.kvDtype)
    return cache.dtype();
  if (!isFloat8(*options.kvDtype))
    throw Error(fmt::format("kv_dtype must be an 8-bit float type (f8e4m3, f8e5m2) but is {}",
                            dtypeName(*options.kvDtype)));
  if (cache.dtype() != DType::U8 && cache.dtype() != *options.kvDtype)
    throw Error(fmt::format("kv_dtype {} reads u8 caches, but {} is {}",
                            dtypeName(*options.kvDtype), name, dtypeName(cache.dtype())));
  return *options.kvDtype;
}

/// Checks one cache tensor against its layout; returns its page count.
/// `cudaType`: the element type the CUDA kernels were built to read (CPU:
/// nullopt).
int64_t checkCacheTensor(const TensorView &cache, const char *name, KVLayout layout, int64_t heads,
                         int64_t pageSize, int64_t width, Device device, DType stored,
                         std::optional<DType> cudaType) {
  if (!isProvided(cache))
    throw Error(fmt::format("{} is required for kv_layout '{}'", name, kvLayoutName(layout)));
  if (cache.device() != device)
    throw Error(fmt::format("{} is on {} but the call runs on {}", name,
                            deviceName(cache.device()), deviceName(device)));
  if (cudaType) {
    if (stored != *cudaType)
      throw Error(fmt::format("{} stores {}, but the CUDA kernels were built for {} caches ({})",
                              name, dtypeName(stored), dtypeName(*cudaType),
                              isFloat8(*cudaType) ? "kv_dtype"
                                                  : "dtype; kv_dtype f8e4m3 or f8e5m2 in the "
                                                    "configuration builds them for 8-bit caches"));
  } else if (!isCpuFloat(stored) && !isFloat8(stored))
    throw Error(fmt::format("{} stores {}, which the CPU backend does not read (f32, bf16, "
                            "f8e4m3 or f8e5m2; u8 with kv_dtype)",
                            name, dtypeName(stored)));
  std::vector<int64_t> want = layoutShape(layout, heads, pageSize, width);
  bool match = cache.rank() == static_cast<int>(want.size());
  int64_t pages = -1;
  for (int d = 0; match && d < cache.rank(); ++d) {
    if (want[d] == -1)
      pages = cache.size(d);
    else if (cache.size(d) != want[d])
      match = false;
  }
  if (!match) {
    std::string expected = "[";
    for (size_t d = 0; d < want.size(); ++d)
      expected += (d ? ", " : "") + (want[d] < 0 ? std::string("pages") : std::to_string(want[d]));
    expected += "]";
    throw Error(fmt::format("{} must be {} = {} for kv_layout '{}' but has shape {}", name,
                            layoutDims(layout), expected, kvLayoutName(layout),
                            cache.shapeString()));
  }
  checkReadable(cache, name);
  return pages;
}

/// The CUDA kernel's demands on a tensor beyond its shape: a contiguous
/// last dimension, the other strides (of dimensions longer than 1)
/// multiples of `granule` elements, the data `alignment`-byte aligned
/// (16-byte copies of q and K/V; pairs of elements stored to out).
void checkCudaStrides(const TensorView &view, const char *name, int64_t granule,
                      uintptr_t alignment) {
  const int last = view.rank() - 1;
  if (view.size(last) > 1 && view.stride(last) != 1)
    throw Error(fmt::format("{}'s last dimension must be contiguous on CUDA but has stride {}",
                            name, view.stride(last)));
  for (int d = 0; d < last; ++d)
    if (view.size(d) > 1 && view.stride(d) % granule != 0)
      throw Error(fmt::format("{}'s stride {} in dimension {} is not a multiple of {} elements "
                              "(the CUDA kernel moves {}-byte chunks)",
                              name, view.stride(d), d, granule, alignment));
  if (reinterpret_cast<uintptr_t>(view.data()) % alignment != 0)
    throw Error(fmt::format("{}'s data is not {}-byte aligned (the CUDA kernel moves {}-byte "
                            "chunks)",
                            name, alignment, alignment));
}

} // namespace

//===----------------------------------------------------------------------===//
// Layout names
//===----------------------------------------------------------------------===//

const char *kvLayoutName(KVLayout layout) {
  switch (layout) {
  case KVLayout::Pagedc: return "pagedc";
  case KVLayout::NHD: return "NHD";
  case KVLayout::HND: return "HND";
  case KVLayout::VLLM: return "vllm";
  }
  return "?";
}

KVLayout parseKVLayout(const std::string &name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (KVLayout layout : {KVLayout::Pagedc, KVLayout::NHD, KVLayout::HND, KVLayout::VLLM}) {
    std::string candidate = kvLayoutName(layout);
    std::transform(candidate.begin(), candidate.end(), candidate.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == candidate)
      return layout;
  }
  throw Error(fmt::format("unknown kv_layout '{}'; valid layouts: NHD, HND, vllm, pagedc", name));
}

//===----------------------------------------------------------------------===//
// BatchAttention
//===----------------------------------------------------------------------===//

BatchAttention::BatchAttention(const CompiledMods &mods, const BatchAttentionConfig &config)
    : mods_(mods), config_(config) {
  BatchAttentionConfig &c = config_;
  if (c.valueHeadDim == 0)
    c.valueHeadDim = c.headDim;
  auto positive = [](int64_t value, const char *name) {
    if (value < 1)
      throw Error(fmt::format("{} must be at least 1 but is {}", name, value));
  };
  positive(c.numQHeads, "num_q_heads");
  positive(c.numKVHeads, "num_kv_heads");
  positive(c.headDim, "head_dim");
  positive(c.valueHeadDim, "value_head_dim");
  positive(c.pageSize, "page_size");
  positive(c.maxNumSeqs, "max_num_seqs");
  positive(c.maxNumTokens, "max_num_tokens");
  positive(c.maxBlocksPerSeq, "max_blocks_per_seq");
  if (c.numQHeads % c.numKVHeads != 0)
    throw Error(fmt::format("num_q_heads {} is not a multiple of num_kv_heads {}", c.numQHeads,
                            c.numKVHeads));
  if (c.layout == KVLayout::VLLM && c.valueHeadDim != c.headDim)
    throw Error(fmt::format("kv_layout 'vllm' holds K and V in one tensor, so value_head_dim "
                            "{} must equal head_dim {}",
                            c.valueHeadDim, c.headDim));
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  // The product is checked for overflow: a wrapped one could pass the bound.
  int64_t keysPerSeq = 0;
  if (c.maxNumTokens > kInt32Max || c.maxNumSeqs >= kInt32Max ||
      __builtin_mul_overflow(c.maxBlocksPerSeq, c.pageSize, &keysPerSeq) || keysPerSeq > kInt32Max)
    throw Error(fmt::format("max_num_tokens {}, max_num_seqs {} and max_blocks_per_seq {} x "
                            "page_size {} must each fit int32",
                            c.maxNumTokens, c.maxNumSeqs, c.maxBlocksPerSeq, c.pageSize));
  if (c.threads < 0)
    throw Error(fmt::format("threads must not be negative but is {}", c.threads));
  if (c.device.kind == DeviceKind::CPU) {
    if (mods_.hasMask() && !mods_.maskRow)
      throw Error(fmt::format("mask mod '{}' has no CPU function", mods_.maskName));
    if (mods_.hasScore() && !mods_.scoreRow)
      throw Error(fmt::format("score mod '{}' has no CPU function", mods_.scoreName));
  }
  // Each factor is under 2^31 (checked above), so the table's size fits
  // int64; limits too large for memory are an error naming them, not
  // std::bad_alloc.
  try {
    queryStart_.assign(static_cast<size_t>(c.maxNumSeqs + 1), 0);
    kvBegin_.assign(static_cast<size_t>(c.maxNumSeqs), 0);
    kvLength_.assign(static_cast<size_t>(c.maxNumSeqs), 0);
    qOffset_.assign(static_cast<size_t>(c.maxNumSeqs), 0);
    pageTable_.assign(static_cast<size_t>(c.maxNumSeqs * c.maxBlocksPerSeq), -1);
  } catch (const std::bad_alloc &) {
    throw Error(fmt::format("out of memory allocating the plan's page table of max_num_seqs {} "
                            "x max_blocks_per_seq {} entries",
                            c.maxNumSeqs, c.maxBlocksPerSeq));
  } catch (const std::length_error &) {
    throw Error(fmt::format("max_num_seqs {} x max_blocks_per_seq {} page-table entries are "
                            "more than one vector can hold",
                            c.maxNumSeqs, c.maxBlocksPerSeq));
  }
  if (c.device.kind == DeviceKind::CUDA)
    cuda_ = std::make_unique<detail::CudaBatchBackend>(mods_, c);
}

BatchAttention::~BatchAttention() = default;
BatchAttention::BatchAttention(BatchAttention &&) noexcept = default;
BatchAttention &BatchAttention::operator=(BatchAttention &&) noexcept = default;

BatchPlanShape BatchAttention::planShape() const {
  return cuda_ ? cuda_->planShape() : BatchPlanShape{};
}

void BatchAttention::uploadScales(const std::vector<float> &kScale,
                                  const std::vector<float> &vScale) const {
  const BatchAttentionConfig &c = config_;
  if (cuda_ && !c.kvDtype)
    throw Error(fmt::format("k_scale and v_scale apply to 8-bit caches, but this BatchAttention's "
                            "caches hold {} (kv_dtype unset)",
                            dtypeName(c.dtype)));
  // The CPU learns the caches' type at run(); the values are checked as an
  // 8-bit cache's would be.
  const DType stored = c.kvDtype.value_or(DType::F8E4M3);
  const std::vector<float> k = checkedScales(kScale, stored, c.numKVHeads, "k_scale");
  const std::vector<float> v = checkedScales(vScale, stored, c.numKVHeads, "v_scale");
  if (cuda_)
    cuda_->uploadScales(k, v);
}

std::pair<const void *, const void *> BatchAttention::kernelCacheAddresses() const {
  if (!cuda_)
    return {nullptr, nullptr};
  return cuda_->lastCacheAddresses();
}

namespace {

/// plan()'s checks of the optional per-token positions and batch indices:
/// [T] int32 on the host, every value >= 0.
void checkTokenMaps(const TensorView &positions, const TensorView &batches, int64_t tokens) {
  for (auto [view, name] :
       {std::pair{&positions, "token_positions"}, std::pair{&batches, "token_batch"}}) {
    if (!isProvided(*view))
      continue;
    checkHostIndexTensor(*view, name, 1);
    if (view->size(0) != tokens)
      throw Error(fmt::format("{} has {} entries but the step has {} tokens "
                              "(query_start_loc[B])",
                              name, view->size(0), tokens));
    for (int64_t i = 0; i < tokens; ++i)
      if (const int32_t value = view->dataAs<const int32_t>()[i * view->stride(0)]; value < 0)
        throw Error(fmt::format("{}[{}] = {} is negative", name, i, value));
  }
}

} // namespace

void BatchAttention::plan(const TensorView &queryStartLoc, const TensorView &seqLens,
                          const TensorView &blockTable, const TensorView &kvStart,
                          const TensorView &kvEnd, const TensorView &tokenPositions,
                          const TensorView &tokenBatch) {
  const BatchAttentionConfig &c = config_;
  checkHostIndexTensor(queryStartLoc, "query_start_loc", 1);
  checkHostIndexTensor(seqLens, "seq_lens", 1);
  checkHostIndexTensor(blockTable, "block_table", 2);
  const int64_t batch = queryStartLoc.size(0) - 1;
  if (batch < 0)
    throw Error("query_start_loc must have B + 1 entries (at least 1) but is empty");
  if (batch > c.maxNumSeqs)
    throw Error(fmt::format("query_start_loc describes {} sequences but max_num_seqs is {}",
                            batch, c.maxNumSeqs));
  if (seqLens.size(0) != batch)
    throw Error(fmt::format("seq_lens has {} entries but query_start_loc describes {} "
                            "sequences",
                            seqLens.size(0), batch));
  if (blockTable.size(0) < batch)
    throw Error(fmt::format("block_table has {} rows but the step has {} sequences",
                            blockTable.size(0), batch));
  for (auto [view, name] : {std::pair{&kvStart, "kv_start"}, std::pair{&kvEnd, "kv_end"}}) {
    if (!isProvided(*view))
      continue;
    checkHostIndexTensor(*view, name, 1);
    if (view->size(0) != batch)
      throw Error(fmt::format("{} has {} entries but query_start_loc describes {} sequences",
                              name, view->size(0), batch));
  }
  auto qsl = [&](int64_t i) { return queryStartLoc.dataAs<const int32_t>()[i * queryStartLoc.stride(0)]; };
  auto len = [&](int64_t b) { return seqLens.dataAs<const int32_t>()[b * seqLens.stride(0)]; };
  auto entry = [&](int64_t b, int64_t j) {
    return blockTable.dataAs<const int32_t>()[b * blockTable.stride(0) + j * blockTable.stride(1)];
  };
  auto start = [&](int64_t b) {
    return isProvided(kvStart) ? kvStart.dataAs<const int32_t>()[b * kvStart.stride(0)] : 0;
  };
  auto end = [&](int64_t b) {
    return isProvided(kvEnd) ? kvEnd.dataAs<const int32_t>()[b * kvEnd.stride(0)] : len(b);
  };
  if (qsl(0) != 0)
    throw Error(fmt::format("query_start_loc[0] must be 0 but is {}", qsl(0)));
  for (int64_t b = 0; b < batch; ++b)
    if (qsl(b + 1) < qsl(b))
      throw Error(fmt::format("query_start_loc decreases at index {}: {} then {}", b + 1, qsl(b),
                              qsl(b + 1)));
  const int64_t tokens = qsl(batch);
  if (tokens > c.maxNumTokens)
    throw Error(fmt::format("query_start_loc[{}] = {} tokens exceeds max_num_tokens {}", batch,
                            tokens, c.maxNumTokens));
  checkTokenMaps(tokenPositions, tokenBatch, tokens);
  const bool positioned = isProvided(tokenPositions);
  int32_t maxEntry = -1;
  const bool mlaOnCuda = cuda_ && detail::isMlaDecode(c);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t qLength = qsl(b + 1) - qsl(b);
    if (mlaOnCuda && qLength > detail::kBatchDecodeTokens)
      throw Error(fmt::format("sequence {} has {} new tokens; MLA decode on CUDA (head_dim 576) "
                              "takes at most {} a sequence (decode and speculative steps)",
                              b, qLength, detail::kBatchDecodeTokens));
    if (!positioned && len(b) < qLength)
      throw Error(fmt::format("seq_lens[{}] = {} is less than the sequence's {} new tokens "
                              "(query_start_loc[{}] - query_start_loc[{}])",
                              b, len(b), qLength, b + 1, b));
    if (start(b) < 0 || start(b) > end(b) || end(b) > len(b))
      throw Error(fmt::format("sequence {} reads keys [kv_start, kv_end) = [{}, {}), which must "
                              "satisfy 0 <= kv_start <= kv_end <= seq_lens[{}] = {}",
                              b, start(b), end(b), b, len(b)));
    // The pages holding keys [kv_start, kv_end) must be valid; the kernel
    // reads no other.
    const int64_t pages = (static_cast<int64_t>(end(b)) + c.pageSize - 1) / c.pageSize;
    const int64_t firstPage = start(b) == end(b) ? pages : start(b) / c.pageSize;
    if (pages > c.maxBlocksPerSeq)
      throw Error(fmt::format("sequence {} reads keys up to {} (seq_lens, or kv_end), which need "
                              "{} pages of {} but max_blocks_per_seq is {}",
                              b, end(b), pages, c.pageSize, c.maxBlocksPerSeq));
    if (pages > blockTable.size(1))
      throw Error(fmt::format("sequence {} reads keys up to {} (seq_lens, or kv_end), which need "
                              "{} pages of {} but block_table has {} columns",
                              b, end(b), pages, c.pageSize, blockTable.size(1)));
    for (int64_t j = firstPage; j < pages; ++j) {
      if (entry(b, j) < 0)
        throw Error(fmt::format("block_table[{}, {}] = {} is negative; the first {} entries of "
                                "row {} must be pages",
                                b, j, entry(b, j), pages, b));
      maxEntry = std::max(maxEntry, entry(b, j));
    }
  }

  // Valid: replace the plan.
  for (int64_t b = 0; b <= batch; ++b)
    queryStart_[b] = qsl(b);
  // Token maps give rows positions and batch indices of their own: the
  // sequences and tiles then keep their keys.
  const bool classified =
      detail::classifiesAtPlan(mods_) && !positioned && !isProvided(tokenBatch);
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t qLength = qsl(b + 1) - qsl(b);
    kvBegin_[b] = classified && qLength > 0
                      ? detail::firstKeyKept(mods_, static_cast<int32_t>(b), len(b) - qLength,
                                     len(b) - 1, start(b), end(b))
                      : start(b);
    kvLength_[b] = end(b);
    qOffset_[b] = len(b) - (qsl(b + 1) - qsl(b));
    const int64_t pages = (static_cast<int64_t>(end(b)) + c.pageSize - 1) / c.pageSize;
    int32_t *row = pageTable_.data() + b * c.maxBlocksPerSeq;
    for (int64_t j = 0; j < pages; ++j)
      row[j] = entry(b, j);
  }
  tokenPositions_ = positioned;
  tokenBatches_ = isProvided(tokenBatch);
  for (auto [view, target] : {std::pair{&tokenPositions, &tokenPosition_},
                              std::pair{&tokenBatch, &tokenBatch_}}) {
    if (!isProvided(*view))
      continue;
    target->resize(static_cast<size_t>(tokens));
    for (int64_t i = 0; i < tokens; ++i)
      (*target)[i] = view->dataAs<const int32_t>()[i * view->stride(0)];
  }
  if (cuda_)
    cuda_->plan(queryStart_.data(), kvLength_.data(), qOffset_.data(), pageTable_.data(), batch,
                kvBegin_.data(), positioned ? tokenPosition_.data() : nullptr,
                tokenBatches_ ? tokenBatch_.data() : nullptr, classified ? &mods_ : nullptr);
  numSeqs_ = batch;
  numTokens_ = tokens;
  maxPageEntry_ = maxEntry;
  planned_ = true;
}

namespace {
void checkPlannedSequence(int64_t b, int64_t sequences) {
  if (b < 0 || b >= sequences)
    throw Error(fmt::format("sequence {} is not in the plan, which has {} sequences", b,
                            sequences));
}
} // namespace

int32_t BatchAttention::keyBegin(int64_t b) const {
  checkPlannedSequence(b, numSeqs_);
  return kvBegin_[b];
}

int32_t BatchAttention::keyEnd(int64_t b) const {
  checkPlannedSequence(b, numSeqs_);
  return kvLength_[b];
}

namespace {

/// run()'s checks of q: on the call's device, [T, Hq, D] with at least the
/// plan's tokens, of a dtype the backend reads.
void checkRunQuery(const TensorView &q, const BatchAttentionConfig &c, bool onCuda,
                   int64_t plannedTokens) {
  if (q.device() != c.device)
    throw Error(fmt::format("q is on {} but the call runs on {}", deviceName(q.device()),
                            deviceName(c.device)));
  if (q.rank() != 3)
    throw Error(fmt::format("q must be [T, Hq, D] but has shape {}", q.shapeString()));
  if (onCuda && q.dtype() != c.dtype)
    throw Error(fmt::format("q must be {} (the configured dtype) on CUDA but is {}",
                            dtypeName(c.dtype), dtypeName(q.dtype())));
  if (!onCuda && !isCpuFloat(q.dtype()))
    throw Error(fmt::format("q must be f32 or bf16 on the CPU but is {}", dtypeName(q.dtype())));
  if (q.size(1) != c.numQHeads || q.size(2) != c.headDim)
    throw Error(fmt::format("q must be [T, {}, {}] (num_q_heads, head_dim) but has shape {}",
                            c.numQHeads, c.headDim, q.shapeString()));
  if (q.size(0) < plannedTokens)
    throw Error(fmt::format("q has {} token rows but the plan has {} tokens", q.size(0),
                            plannedTokens));
  checkReadable(q, "q");
  if (onCuda)
    checkCudaStrides(q, "q", 8, 16);
}

/// The K and V caches as run() reads them: their stored types and scales,
/// checked against the layout, the configuration and the plan's pages.
struct CheckedCaches {
  DType kStored, vStored;
  std::vector<float> kScale, vScale;
};

CheckedCaches checkRunCaches(const TensorView &kCache, const TensorView &vCache,
                             const BatchAttentionConfig &c, const BatchRunOptions &options,
                             bool onCuda, int32_t maxPageEntry) {
  const std::optional<DType> cudaType =
      onCuda ? std::optional<DType>(c.kvDtype.value_or(c.dtype)) : std::optional<DType>();
  int64_t pages;
  CheckedCaches caches;
  caches.kStored = caches.vStored = storedType(kCache, "k_cache", options);
  if (c.layout == KVLayout::VLLM) {
    if (isProvided(vCache))
      throw Error("kv_layout 'vllm' takes the combined [2, pages, page_size, Hkv, D] tensor as "
                  "k_cache; v_cache must be empty (None)");
    pages = checkCacheTensor(kCache, "k_cache", c.layout, c.numKVHeads, c.pageSize, c.headDim,
                             c.device, caches.kStored, cudaType);
  } else {
    pages = checkCacheTensor(kCache, "k_cache", c.layout, c.numKVHeads, c.pageSize, c.headDim,
                             c.device, caches.kStored, cudaType);
    caches.vStored = storedType(vCache, "v_cache", options);
    const int64_t vPages = checkCacheTensor(vCache, "v_cache", c.layout, c.numKVHeads, c.pageSize,
                                            c.valueHeadDim, c.device, caches.vStored, cudaType);
    if (vPages != pages)
      throw Error(fmt::format("k_cache has {} pages but v_cache has {}", pages, vPages));
  }
  caches.kScale = checkedScales(options.kScale, caches.kStored, c.numKVHeads, "k_scale");
  caches.vScale = checkedScales(options.vScale, caches.vStored, c.numKVHeads, "v_scale");
  if (maxPageEntry >= pages)
    throw Error(fmt::format("block_table holds page {} but the cache has {} pages",
                            maxPageEntry, pages));
  if (onCuda && detail::isMlaDecode(c))
    detail::checkMlaCaches(kCache, vCache);
  if (onCuda) {
    // 16-byte copies: 8 elements, or 16 codes of an 8-bit cache.
    const int64_t perCopy = c.kvDtype ? 16 : 8;
    checkCudaStrides(kCache, "k_cache", perCopy, 16);
    if (isProvided(vCache))
      checkCudaStrides(vCache, "v_cache", perCopy, 16);
  }
  return caches;
}

/// run()'s checks of the caller's out and lse ([T, Hq, Dv] and [T, Hq]);
/// on CUDA they must be given, since run() allocates no device memory.
void checkRunOutputs(const BatchRunOptions &options, const BatchAttentionConfig &c,
                     int64_t rowsT, bool onCuda, bool returnLse) {
  const Device device = c.device;
  const std::vector<int64_t> outShape = {rowsT, c.numQHeads, c.valueHeadDim};
  const std::vector<int64_t> lseShape = {rowsT, c.numQHeads};
  if (isProvided(options.out)) {
    const TensorView &out = options.out;
    if (out.shape() != outShape)
      throw Error(fmt::format("out must be {} ([T, Hq, Dv]) but has shape {}",
                              shapeText(outShape), out.shapeString()));
    if (out.device() != device)
      throw Error(fmt::format("out is on {} but the call runs on {}", deviceName(out.device()),
                              deviceName(device)));
    const DType cudaOut = c.outDtype.value_or(c.dtype);
    if (onCuda && out.dtype() != cudaOut)
      throw Error(fmt::format("out is {} but must be {} (the configured {}) on CUDA",
                              dtypeName(out.dtype()), dtypeName(cudaOut),
                              c.outDtype ? "out_dtype" : "dtype"));
    if (!onCuda && !isCpuFloat(out.dtype()))
      throw Error(fmt::format("out is {} but must be f32 or bf16", dtypeName(out.dtype())));
    checkWritable(out, "out");
    // Pairs of elements stored at once: 4 bytes, or 8 of f32.
    if (onCuda)
      checkCudaStrides(out, "out", 2, cudaOut == DType::F32 ? 8 : 4);
  } else if (onCuda) {
    throw Error("out is required on CUDA: run() allocates no device memory (pass "
                "options.out [T, Hq, Dv])");
  }
  if (isProvided(options.lse)) {
    const TensorView &lse = options.lse;
    if (lse.shape() != lseShape)
      throw Error(fmt::format("lse must be {} ([T, Hq]) but has shape {}", shapeText(lseShape),
                              lse.shapeString()));
    if (lse.device() != device)
      throw Error(fmt::format("lse is on {} but the call runs on {}", deviceName(lse.device()),
                              deviceName(device)));
    if (lse.dtype() != DType::F32)
      throw Error(fmt::format("lse is {} but must be f32", dtypeName(lse.dtype())));
    checkWritable(lse, "lse");
    if (onCuda &&
        ((rowsT > 1 && lse.stride(0) != c.numQHeads) || (c.numQHeads > 1 && lse.stride(1) != 1)))
      throw Error(fmt::format("lse must be contiguous on CUDA but has strides [{}, {}]",
                              lse.stride(0), lse.stride(1)));
  } else if (onCuda && returnLse) {
    throw Error("return_lse on CUDA needs options.lse [T, Hq] (f32): run() allocates no device "
                "memory");
  }
}

} // namespace

AttentionResult BatchAttention::run(const TensorView &q, const TensorView &kCache,
                                    const TensorView &vCache, const Bindings &bindings,
                                    const BatchRunOptions &options) const {
  const BatchAttentionConfig &c = config_;
  if (!planned_)
    throw Error("run() needs a plan: call plan(query_start_loc, seq_lens, block_table) first");
  const Device device = c.device;
  const bool onCuda = cuda_ != nullptr;
  checkRunQuery(q, c, onCuda, numTokens_);
  const int64_t rowsT = q.size(0);
  const CheckedCaches caches = checkRunCaches(kCache, vCache, c, options, onCuda, maxPageEntry_);
  const DType kStored = caches.kStored, vStored = caches.vStored;
  const std::vector<float> &kScale = caches.kScale, &vScale = caches.vScale;
  const float scale =
      options.scale.value_or(1.0f / std::sqrt(static_cast<float>(c.headDim)));
  if (!std::isfinite(scale))
    throw Error(fmt::format("scale must be finite but is {}", scale));
  detail::checkSinks(options.sinks, c.numQHeads, device, "sinks");
  const bool returnLse = options.returnLse || isProvided(options.lse);
  checkRunOutputs(options, c, rowsT, onCuda, returnLse);
  const std::vector<int64_t> outShape = {rowsT, c.numQHeads, c.valueHeadDim};
  const std::vector<int64_t> lseShape = {rowsT, c.numQHeads};
  const ResolvedBindings resolved = resolveBindings(mods_, bindings, device);

  // Everything is valid.
  AttentionResult result;
  if (isProvided(options.out)) {
    result.out = options.out;
  } else {
    result.ownedOut = HostTensor(q.dtype(), outShape);
    result.out = result.ownedOut.view();
  }
  if (returnLse) {
    if (isProvided(options.lse)) {
      result.lse = options.lse;
    } else {
      result.ownedLse = HostTensor(DType::F32, lseShape);
      float *lse = result.ownedLse.dataAs<float>();
      std::fill(lse, lse + result.ownedLse.numel(), kNegInf);
      result.lse = result.ownedLse.view();
    }
  }
  // (A fixed grid launches even an empty step's kernels, whose CTAs all
  // exit: a graph captured on it must replay later plans' work.)
  if (numTokens_ == 0 && !(onCuda && c.fixedGrid))
    return result;

  auto as = [&](const TensorView &view, DType type) {
    return TensorView(view.data(), type, view.shape(), view.strides(), device);
  };
  if (onCuda) {
    detail::CudaBatchCall call;
    call.q = q;
    call.kCache = kernelCacheView(kCache, c.layout, 0, device);
    call.vCache =
        kernelCacheView(c.layout == KVLayout::VLLM ? kCache : vCache, c.layout, 1, device);
    call.out = result.out;
    if (returnLse)
      call.lse = result.lse;
    call.params = ParamsLayout::forDeclarations(mods_.params, mods_.buffers)
                      .pack(mods_.params, mods_.buffers, resolved.context());
    call.scale = scale;
    call.sinks = options.sinks;
    call.kScale = &kScale;
    call.vScale = &vScale;
    call.stream = options.stream;
    cuda_->run(call);
    return result;
  }

  // The packed rows as the kernel's [1, Hq, T, *] views.
  auto packed = [&](const TensorView &view, int64_t width) {
    if (width < 0)
      return TensorView(view.data(), view.dtype(), {1, view.size(1), view.size(0)},
                        {0, view.stride(1), view.stride(0)}, device);
    return TensorView(view.data(), view.dtype(), {1, view.size(1), view.size(0), width},
                      {0, view.stride(1), view.stride(0), view.stride(2)}, device);
  };
  cpu::PagedAttentionArgs args;
  args.q = packed(q, c.headDim);
  args.kCache = kernelCacheView(as(kCache, kStored), c.layout, 0, device);
  args.vCache = kernelCacheView(as(c.layout == KVLayout::VLLM ? kCache : vCache, vStored),
                                c.layout, 1, device);
  if (!kScale.empty())
    args.kScale = kScale.data();
  if (!vScale.empty())
    args.vScale = vScale.data();
  args.pageTable = pageTable_.data();
  args.pageTableStride = c.maxBlocksPerSeq;
  args.pageSize = static_cast<int32_t>(c.pageSize);
  args.kvBegin = kvBegin_.data();
  if (tokenPositions_)
    args.tokenPosition = tokenPosition_.data();
  if (tokenBatches_)
    args.tokenBatch = tokenBatch_.data();
  args.kvLength = kvLength_.data();
  args.qOffset = qOffset_.data();
  args.qStart = queryStart_.data();
  args.batch = numSeqs_;
  args.mods = &mods_;
  args.context = &resolved.context();
  args.scale = scale;
  args.sinks = options.sinks;
  args.out = packed(result.out, c.valueHeadDim);
  if (returnLse)
    args.lse = packed(result.lse, -1);
  args.threads = c.threads;
  cpu::pagedAttention(args);
  return result;
}

//===----------------------------------------------------------------------===//
// mergeState
//===----------------------------------------------------------------------===//

namespace {

float loadValue(const TensorView &view, int64_t offset) {
  if (view.dtype() == DType::BF16)
    return bf16ToFloat(view.dataAs<const uint16_t>()[offset]);
  if (view.dtype() == DType::F16)
    return halfToFloat(view.dataAs<const uint16_t>()[offset]);
  return view.dataAs<const float>()[offset];
}

void storeValue(const TensorView &view, int64_t offset, float value) {
  if (view.dtype() == DType::BF16)
    view.dataAs<uint16_t>()[offset] = floatToBF16(value);
  else if (view.dtype() == DType::F16)
    view.dataAs<uint16_t>()[offset] = floatToHalf(value);
  else
    view.dataAs<float>()[offset] = value;
}

/// A merge runs where its first value tensor is (`device`); every other
/// tensor must be there too.
void checkMergeDevice(const TensorView &view, const char *name, Device device) {
  if (view.device() != device)
    throw Error(fmt::format("{} is on {} but the merge runs on {} (where v_a, or v, is)", name,
                            deviceName(view.device()), deviceName(device)));
}

void checkMergeValue(const TensorView &v, const char *name, int rank, Device device) {
  checkMergeDevice(v, name, device);
  if (v.rank() != rank)
    throw Error(fmt::format("{} must have rank {} but has shape {}", name, rank,
                            v.shapeString()));
  if (v.dtype() != DType::F32 && v.dtype() != DType::BF16 && v.dtype() != DType::F16)
    throw Error(fmt::format("{} must be f32, bf16 or f16 but is {}", name, dtypeName(v.dtype())));
  checkReadable(v, name);
}

void checkMergeLse(const TensorView &s, const char *name, const std::vector<int64_t> &shape,
                   Device device) {
  checkMergeDevice(s, name, device);
  if (s.dtype() != DType::F32)
    throw Error(fmt::format("{} must be f32 but is {}", name, dtypeName(s.dtype())));
  if (s.shape() != shape)
    throw Error(fmt::format("{} must be {} but has shape {}", name, shapeText(shape),
                            s.shapeString()));
  checkReadable(s, name);
}

/// The merge kernel's code of an element type (templates/MergeState.cuh).
int32_t mergeElementCode(DType type) {
  return type == DType::F16 ? 1 : type == DType::BF16 ? 2 : 0;
}

/// The bounds of the merge kernel's grid (tokens, heads) and int32 sizes.
void checkMergeGrid(int64_t tokens, int64_t heads, int64_t dim) {
  if (tokens > std::numeric_limits<int32_t>::max() || heads > 65535 ||
      dim > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("a merge on CUDA takes at most 2^31 - 1 tokens and 65535 heads "
                            "(its grid) but has {} tokens and {} heads",
                            tokens, heads));
}

/// Points source `index` of a merge launch at [T, parts, H, D] values and
/// [T, parts, H] lse given as strides (t, part, h, d) and (t, part, h).
void setMergeSource(PagedcMergeStateArgs &args, int index, const TensorView &v,
                    const int64_t (&vStrides)[4], const TensorView &s, const int64_t (&sStrides)[3],
                    int64_t parts) {
  args.v[index] = v.data();
  args.s[index] = s.dataAs<const float>();
  for (int d = 0; d < 4; ++d)
    args.v_stride[index][d] = vStrides[d];
  for (int d = 0; d < 3; ++d)
    args.s_stride[index][d] = sStrides[d];
  args.parts[index] = static_cast<int32_t>(parts);
  args.value_type[index] = mergeElementCode(v.dtype());
}

void setMergeOutput(PagedcMergeStateArgs &args, const TensorView &vOut, const TensorView &sOut) {
  args.v_out = vOut.data();
  for (int d = 0; d < 3; ++d)
    args.v_out_stride[d] = vOut.stride(d);
  args.s_out = sOut.dataAs<float>();
  args.s_out_stride[0] = sOut.stride(0);
  args.s_out_stride[1] = sOut.stride(1);
  args.out_type = mergeElementCode(vOut.dtype());
  args.tokens = static_cast<int32_t>(vOut.size(0));
  args.heads = static_cast<int32_t>(vOut.size(1));
  args.dim = static_cast<int32_t>(vOut.size(2));
}

/// Merges the `parts` partial results of every row (t, h): lseOf(t, p, h)
/// is part p's logsumexp and valueOf(t, p, h, d) its value. Each row's parts
/// are read before the row is written, so the output may alias one part.
template <typename Lse, typename Value>
void mergeRows(int64_t tokens, int64_t heads, int64_t dim, int64_t parts, Lse lseOf,
               Value valueOf, const TensorView &vOut, const TensorView &sOut) {
  std::vector<float> acc(static_cast<size_t>(dim));
  std::vector<float> lse(static_cast<size_t>(parts));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float maxLse = kNegInf;
      for (int64_t p = 0; p < parts; ++p) {
        lse[p] = lseOf(t, p, h);
        maxLse = std::max(maxLse, lse[p]);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float total = kNegInf;
      if (maxLse != kNegInf) {
        double sum = 0.0;
        for (int64_t p = 0; p < parts; ++p)
          if (lse[p] != kNegInf)
            sum += std::exp(static_cast<double>(lse[p]) - maxLse);
        total = static_cast<float>(maxLse + std::log(sum));
        for (int64_t p = 0; p < parts; ++p) {
          if (lse[p] == kNegInf)
            continue;
          const float weight = static_cast<float>(std::exp(static_cast<double>(lse[p]) - total));
          for (int64_t d = 0; d < dim; ++d)
            acc[d] += weight * valueOf(t, p, h, d);
        }
      }
      const int64_t outBase = t * vOut.stride(0) + h * vOut.stride(1);
      for (int64_t d = 0; d < dim; ++d)
        storeValue(vOut, outBase + d * vOut.stride(2), acc[d]);
      sOut.dataAs<float>()[t * sOut.stride(0) + h * sOut.stride(1)] = total;
    }
  }
}

} // namespace

void mergeState(const TensorView &vA, const TensorView &sA, const TensorView &vB,
                const TensorView &sB, const TensorView &vOut, const TensorView &sOut,
                const MergeStateOptions &options) {
  const Device device = vA.device();
  checkMergeValue(vA, "v_a", 3, device);
  checkMergeValue(vB, "v_b", 3, device);
  if (vB.shape() != vA.shape())
    throw Error(fmt::format("v_b must have v_a's shape {} but has shape {}", vA.shapeString(),
                            vB.shapeString()));
  const std::vector<int64_t> lseShape = {vA.size(0), vA.size(1)};
  checkMergeLse(sA, "s_a", lseShape, device);
  checkMergeLse(sB, "s_b", lseShape, device);
  checkMergeValue(vOut, "v_out", 3, device);
  if (vOut.shape() != vA.shape())
    throw Error(fmt::format("v_out must have v_a's shape {} but has shape {}",
                            vA.shapeString(), vOut.shapeString()));
  checkWritable(vOut, "v_out");
  checkMergeLse(sOut, "s_out", lseShape, device);
  checkWritable(sOut, "s_out");

  if (device.kind == DeviceKind::CUDA) {
    checkMergeGrid(vA.size(0), vA.size(1), vA.size(2));
    // Each source as one part: [T, 1, H, D] and [T, 1, H].
    PagedcMergeStateArgs args{};
    setMergeSource(args, 0, vA, {vA.stride(0), 0, vA.stride(1), vA.stride(2)}, sA,
                   {sA.stride(0), 0, sA.stride(1)}, 1);
    setMergeSource(args, 1, vB, {vB.stride(0), 0, vB.stride(1), vB.stride(2)}, sB,
                   {sB.stride(0), 0, sB.stride(1)}, 1);
    setMergeOutput(args, vOut, sOut);
    detail::cudaMergeStates(args, device.index, options.stream);
    return;
  }
  const TensorView *values[2] = {&vA, &vB};
  const TensorView *lses[2] = {&sA, &sB};
  mergeRows(
      vA.size(0), vA.size(1), vA.size(2), 2,
      [&](int64_t t, int64_t p, int64_t h) {
        const TensorView &s = *lses[p];
        return s.dataAs<const float>()[t * s.stride(0) + h * s.stride(1)];
      },
      [&](int64_t t, int64_t p, int64_t h, int64_t d) {
        const TensorView &v = *values[p];
        return loadValue(v, t * v.stride(0) + h * v.stride(1) + d * v.stride(2));
      },
      vOut, sOut);
}

AttentionResult mergeState(const TensorView &vA, const TensorView &sA, const TensorView &vB,
                           const TensorView &sB) {
  checkMergeValue(vA, "v_a", 3, vA.device());
  if (vA.device().kind != DeviceKind::CPU)
    throw Error(fmt::format("v_a is on {}: merge_state into new tensors runs on the CPU; on a "
                            "device pass v_out and s_out",
                            deviceName(vA.device())));
  AttentionResult result;
  result.ownedOut = HostTensor(vA.dtype(), vA.shape());
  result.ownedLse = HostTensor(DType::F32, {vA.size(0), vA.size(1)});
  result.out = result.ownedOut.view();
  result.lse = result.ownedLse.view();
  mergeState(vA, sA, vB, sB, result.out, result.lse);
  return result;
}

void mergeStateInPlace(const TensorView &v, const TensorView &s, const TensorView &vOther,
                       const TensorView &sOther, const MergeStateOptions &options) {
  mergeState(v, s, vOther, sOther, v, s, options);
}

void mergeStates(const TensorView &v, const TensorView &s, const TensorView &vOut,
                 const TensorView &sOut, const MergeStateOptions &options) {
  const Device device = v.device();
  checkMergeValue(v, "v", 4, device);
  const int64_t tokens = v.size(0), parts = v.size(1), heads = v.size(2), dim = v.size(3);
  checkMergeLse(s, "s", {tokens, parts, heads}, device);
  checkMergeValue(vOut, "v_out", 3, device);
  if (vOut.shape() != std::vector<int64_t>{tokens, heads, dim})
    throw Error(fmt::format("v_out must be {} but has shape {}",
                            shapeText({tokens, heads, dim}), vOut.shapeString()));
  checkWritable(vOut, "v_out");
  checkMergeLse(sOut, "s_out", {tokens, heads}, device);
  checkWritable(sOut, "s_out");
  if (device.kind == DeviceKind::CUDA) {
    checkMergeGrid(tokens, heads, dim);
    if (parts > std::numeric_limits<int32_t>::max())
      throw Error(fmt::format("v has {} parts, more than a merge on CUDA takes (2^31 - 1)", parts));
    PagedcMergeStateArgs args{};
    setMergeSource(args, 0, v, {v.stride(0), v.stride(1), v.stride(2), v.stride(3)}, s,
                   {s.stride(0), s.stride(1), s.stride(2)}, parts);
    // The second source is unused (no parts); its pointers stay null.
    setMergeOutput(args, vOut, sOut);
    detail::cudaMergeStates(args, device.index, options.stream);
    return;
  }
  mergeRows(
      tokens, heads, dim, parts,
      [&](int64_t t, int64_t p, int64_t h) {
        return s.dataAs<const float>()[t * s.stride(0) + p * s.stride(1) + h * s.stride(2)];
      },
      [&](int64_t t, int64_t p, int64_t h, int64_t d) {
        return loadValue(v, t * v.stride(0) + p * v.stride(1) + h * v.stride(2) +
                                d * v.stride(3));
      },
      vOut, sOut);
}

} // namespace pagedc
