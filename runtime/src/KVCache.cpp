//===- KVCache.cpp - A paged key/value cache ------------------------------===//
#include "pagedc/KVCache.h"
#include "pagedc/Error.h"

#include "KVMemory.h"
#include "TensorChecks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace pagedc {

namespace {

bool isPowerOfTwo(int64_t value) { return value > 0 && (value & (value - 1)) == 0; }

/// Reads element i of a rank-1 or the (i, j) element of a rank-2 integer view.
int64_t readIndex(const TensorView &view, int64_t offset) {
  if (view.dtype() == DType::I32)
    return view.dataAs<const int32_t>()[offset];
  return view.dataAs<const int64_t>()[offset];
}

void checkIndexTensor(const TensorView &view, const char *name, int rank) {
  if (view.rank() != rank)
    throw Error(
        fmt::format("{} must have rank {} but has shape {}", name, rank, view.shapeString()));
  if (view.dtype() != DType::I32 && view.dtype() != DType::I64)
    throw Error(fmt::format("{} must be i32 or i64 but is {}", name, dtypeName(view.dtype())));
  if (view.device().kind != DeviceKind::CPU)
    throw Error(
        fmt::format("{} must be in host memory but is on {}", name, deviceName(view.device())));
  if (view.data() == nullptr && view.numel() != 0)
    throw Error(fmt::format("{} has no data", name));
}

} // namespace

//===----------------------------------------------------------------------===//
// Construction
//===----------------------------------------------------------------------===//

/// Codes of `values` [B, H, S, D] (f32, f16 or bf16, host, any strides) as
/// the 8-bit float `type`, element (b, h, s, d) divided by scale[h] first;
/// compact [B, H, S, D].
static HostTensor quantizeRows(const TensorView &values, const std::vector<float> &scale,
                               DType type) {
  HostTensor codes(type, values.shape());
  uint8_t *out = codes.dataAs<uint8_t>();
  auto load = [&](int64_t offset) -> float {
    switch (values.dtype()) {
    case DType::BF16: return bf16ToFloat(values.dataAs<const uint16_t>()[offset]);
    case DType::F16: return halfToFloat(values.dataAs<const uint16_t>()[offset]);
    default: return values.dataAs<const float>()[offset];
    }
  };
  int64_t next = 0;
  for (int64_t b = 0; b < values.size(0); ++b)
    for (int64_t h = 0; h < values.size(1); ++h)
      for (int64_t i = 0; i < values.size(2); ++i)
        for (int64_t d = 0; d < values.size(3); ++d)
          out[next++] = floatToFloat8(load(b * values.stride(0) + h * values.stride(1) +
                                           i * values.stride(2) + d * values.stride(3)) /
                                          scale[static_cast<size_t>(h)],
                                      type);
  return codes;
}

static void checkConfig(const KVCacheConfig &config) {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  if (!isPowerOfTwo(config.pageSize) || config.pageSize > 1024)
    throw Error(
        fmt::format("page size must be a power of two from 1 to 1024 but is {}", config.pageSize));
  if (config.numPages < 1 || config.numPages > kMaxInt32 / config.pageSize)
    throw Error(fmt::format("number of pages must be from 1 to {} for page size {} but is {}",
                            kMaxInt32 / config.pageSize, config.pageSize, config.numPages));
  if (config.maxBatch < 1 || config.maxBatch > kMaxInt32)
    throw Error(fmt::format("max batch must be at least 1 but is {}", config.maxBatch));
  if (config.heads < 1)
    throw Error(fmt::format("number of KV heads must be at least 1 but is {}", config.heads));
  if (config.headDim < 1 || config.valueHeadDim < 1)
    throw Error(fmt::format("head dims must be at least 1 but are D={} and Dv={}", config.headDim,
                            config.valueHeadDim));
  if (config.dtype != DType::F32 && config.dtype != DType::F16 && config.dtype != DType::BF16 &&
      !isFloat8(config.dtype))
    throw Error(fmt::format("KV cache dtype must be f32, f16, bf16, f8e4m3 or f8e5m2 but is {}",
                            dtypeName(config.dtype)));
  detail::checkedScales(config.kScale, config.dtype, config.heads, "k_scale");
  detail::checkedScales(config.vScale, config.dtype, config.heads, "v_scale");
  // Bytes of the larger of K and V, computed without overflow, must fit
  // int64 (and so size_t); the same product gives every index the cache uses.
  int64_t bytes = 0;
  if (__builtin_mul_overflow(config.heads, config.numPages, &bytes) ||
      __builtin_mul_overflow(bytes, config.pageSize, &bytes) ||
      __builtin_mul_overflow(bytes, std::max(config.headDim, config.valueHeadDim), &bytes) ||
      __builtin_mul_overflow(bytes, static_cast<int64_t>(dtypeSize(config.dtype)), &bytes))
    throw Error(fmt::format("KV cache is too large to address: heads {} x pages {} x page size "
                            "{} x head dim {} x {} bytes overflows 64 bits",
                            config.heads, config.numPages, config.pageSize,
                            std::max(config.headDim, config.valueHeadDim),
                            dtypeSize(config.dtype)));
}

PagedKVCache::PagedKVCache(const KVCacheConfig &config, std::shared_ptr<KVMemory> memory)
    : config_(config) {
  checkConfig(config);
  kScale_ = detail::checkedScales(config.kScale, config.dtype, config.heads, "k_scale");
  vScale_ = detail::checkedScales(config.vScale, config.dtype, config.heads, "v_scale");
  memory_ = memory ? std::move(memory) : memoryFor(config.device);
  if (memory_->device() != config.device)
    throw Error(fmt::format("KV cache memory is on {} but the cache is configured for {}",
                            deviceName(memory_->device()), deviceName(config.device)));
  allocateStorage();
}

PagedKVCache::PagedKVCache(const KVCacheConfig &config, const TensorView &kCache,
                           const TensorView &vCache, std::shared_ptr<KVMemory> memory)
    : config_(config) {
  checkConfig(config);
  kScale_ = detail::checkedScales(config.kScale, config.dtype, config.heads, "k_scale");
  vScale_ = detail::checkedScales(config.vScale, config.dtype, config.heads, "v_scale");
  const std::vector<int64_t> kShape = {config.heads, config.numPages, config.pageSize,
                                       config.headDim};
  const std::vector<int64_t> vShape = {config.heads, config.numPages, config.pageSize,
                                       config.valueHeadDim};
  auto check = [&](const TensorView &view, const std::vector<int64_t> &shape, const char *name) {
    if (view.shape() != shape)
      throw Error(fmt::format("{} storage must have shape {} ([Hkv, numPages, pageSize, D]) "
                              "but has {}",
                              name, TensorView(nullptr, config.dtype, shape).shapeString(),
                              view.shapeString()));
    if (view.dtype() != config.dtype)
      throw Error(fmt::format("{} storage is {} but the cache is {}", name, dtypeName(view.dtype()),
                              dtypeName(config.dtype)));
    if (view.device() != config.device)
      throw Error(fmt::format("{} storage is on {} but the cache is configured for {}", name,
                              deviceName(view.device()), deviceName(config.device)));
    if (!view.isContiguous())
      throw Error(fmt::format("{} storage must be compact (row-major) but has strides that "
                              "are not",
                              name));
    if (view.data() == nullptr)
      throw Error(fmt::format("{} storage has no data", name));
  };
  check(kCache, kShape, "K");
  check(vCache, vShape, "V");
  memory_ = memory ? std::move(memory) : memoryFor(config.device);
  if (memory_->device() != config.device)
    throw Error(fmt::format("KV cache memory is on {} but the cache is configured for {}",
                            deviceName(memory_->device()), deviceName(config.device)));
  kCache_ = TensorView(kCache.data(), config.dtype, kShape, config.device);
  vCache_ = TensorView(vCache.data(), config.dtype, vShape, config.device);
  try {
    freePages_.reserve(static_cast<size_t>(config.numPages));
  } catch (const std::bad_alloc &) {
    throw Error(fmt::format("out of host memory for the page lists of {} pages",
                            config.numPages));
  }
  for (int64_t page = config.numPages - 1; page >= 0; --page)
    freePages_.push_back(static_cast<int32_t>(page));
  refCount_.assign(static_cast<size_t>(config.numPages), 0);
  pageLogical_.assign(static_cast<size_t>(config.numPages), -1);
}

void PagedKVCache::allocateStorage() {
  const size_t elementSize = dtypeSize(config_.dtype);
  const size_t rows = static_cast<size_t>(config_.heads * config_.numPages * config_.pageSize);
  kBytes_ = rows * static_cast<size_t>(config_.headDim) * elementSize;
  vBytes_ = rows * static_cast<size_t>(config_.valueHeadDim) * elementSize;
  void *k = memory_->allocate(kBytes_);
  void *v = nullptr;
  try {
    v = memory_->allocate(vBytes_);
    freePages_.reserve(static_cast<size_t>(config_.numPages));
    refCount_.assign(static_cast<size_t>(config_.numPages), 0);
    pageLogical_.assign(static_cast<size_t>(config_.numPages), -1);
  } catch (const std::bad_alloc &) {
    memory_->deallocate(k, kBytes_);
    if (v)
      memory_->deallocate(v, vBytes_);
    throw Error(fmt::format("out of host memory for the K/V storage and page lists of {} pages "
                            "({} + {} bytes)",
                            config_.numPages, kBytes_, vBytes_));
  } catch (...) {
    memory_->deallocate(k, kBytes_);
    if (v)
      memory_->deallocate(v, vBytes_);
    throw;
  }
  for (int64_t page = config_.numPages - 1; page >= 0; --page)
    freePages_.push_back(static_cast<int32_t>(page));
  ownsStorage_ = true;
  kCache_ = TensorView(k, config_.dtype,
                       {config_.heads, config_.numPages, config_.pageSize, config_.headDim},
                       config_.device);
  vCache_ = TensorView(v, config_.dtype,
                       {config_.heads, config_.numPages, config_.pageSize, config_.valueHeadDim},
                       config_.device);
}

PagedKVCache::~PagedKVCache() {
  if (ownsStorage_) {
    memory_->deallocate(kCache_.data(), kBytes_);
    memory_->deallocate(vCache_.data(), vBytes_);
  }
}

//===----------------------------------------------------------------------===//
// Allocation
//===----------------------------------------------------------------------===//

void PagedKVCache::checkSlot(int64_t slot, const char *what) const {
  if (slot < 0 || slot >= config_.maxBatch)
    throw Error(fmt::format("{} slot {} is out of range [0, {})", what, slot, config_.maxBatch));
}

void PagedKVCache::checkPage(int64_t page) const {
  if (page < 0 || page >= config_.numPages)
    throw Error(fmt::format("page {} is out of range [0, {})", page, config_.numPages));
}

static Error outOfPages(int64_t requested, int64_t available) {
  return Error(
      fmt::format("requested {} pages but there are only {} empty pages", requested, available));
}

const std::vector<int32_t> &PagedKVCache::slotTable(int64_t slot) const {
  static const std::vector<int32_t> kEmpty;
  auto found = tables_.find(slot);
  return found == tables_.end() ? kEmpty : found->second;
}

std::vector<int32_t> &PagedKVCache::writableSlotTable(int64_t slot, const char *what) {
  try {
    return tables_[slot];
  } catch (const std::bad_alloc &) {
    throw Error(fmt::format("{}: out of host memory for the page table of slot {}", what, slot));
  }
}

int32_t PagedKVCache::takeFreePage() {
  int32_t page = freePages_.back();
  freePages_.pop_back();
  refCount_[page] = 1;
  return page;
}

void PagedKVCache::copyPage(int32_t dst, int32_t src) {
  const int64_t elementSize = static_cast<int64_t>(dtypeSize(config_.dtype));
  auto copyIn = [&](const TensorView &storage, int64_t dim) {
    auto *base = static_cast<unsigned char *>(storage.data());
    const int64_t pageBytes = config_.pageSize * dim * elementSize;
    for (int64_t h = 0; h < config_.heads; ++h)
      memory_->copy(base + (h * config_.numPages + dst) * pageBytes,
                    base + (h * config_.numPages + src) * pageBytes,
                    static_cast<size_t>(pageBytes));
  };
  copyIn(kCache_, config_.headDim);
  copyIn(vCache_, config_.valueHeadDim);
}

void PagedKVCache::reserve(int64_t slot, int64_t seqLen) {
  checkSlot(slot, "reserve:");
  if (seqLen < 0)
    throw Error(fmt::format("reserve: sequence length must not be negative but is {}", seqLen));
  const int64_t capacity = static_cast<int64_t>(slotTable(slot).size()) * config_.pageSize;
  if (seqLen <= capacity)
    return;
  // No overflow for any seqLen up to INT64_MAX: seqLen - capacity > 0.
  const int64_t missing = seqLen - capacity;
  const int64_t needed = missing / config_.pageSize + (missing % config_.pageSize != 0);
  if (needed > freePageCount())
    throw outOfPages(needed, freePageCount());
  std::vector<int32_t> &table = writableSlotTable(slot, "reserve");
  // Grow the table geometrically: reserving exactly table.size() + needed
  // reallocated it on every call, so growing a slot one page at a time (a
  // decode loop, --page-size 1) was quadratic in its length. This is the only
  // step that may throw, and it changes nothing visible.
  const size_t wanted = table.size() + static_cast<size_t>(needed);
  if (wanted > table.capacity()) {
    try {
      table.reserve(std::max(wanted, std::min(2 * table.capacity(),
                                              static_cast<size_t>(config_.numPages))));
    } catch (const std::bad_alloc &) {
      throw Error(fmt::format("reserve: out of host memory growing slot {}'s page table to {} "
                              "pages",
                              slot, wanted));
    }
  }
  // Like the reference, take the free list's last `needed` entries in list
  // order: the first of them becomes the lowest new logical page.
  const size_t first = freePages_.size() - static_cast<size_t>(needed);
  for (size_t i = first; i < freePages_.size(); ++i) {
    const int32_t page = freePages_[i];
    refCount_[page] = 1;
    pageLogical_[page] = static_cast<int32_t>(table.size());
    table.push_back(page);
  }
  freePages_.resize(first);
}

void PagedKVCache::erase(int64_t slot) {
  checkSlot(slot, "erase:");
  auto found = tables_.find(slot);
  if (found == tables_.end())
    return; // holds no pages
  for (int32_t page : found->second) {
    if (--refCount_[page] == 0) {
      pageLogical_[page] = -1;
      freePages_.push_back(page); // capacity is numPages: never reallocates
    }
  }
  tables_.erase(found);
}

void PagedKVCache::fork(int64_t src, int64_t dst, int64_t length) {
  checkSlot(src, "fork: source");
  checkSlot(dst, "fork: destination");
  if (src == dst)
    throw Error(fmt::format("fork: source and destination are the same slot {}", src));
  if (!slotTable(dst).empty())
    throw Error(fmt::format("fork: destination slot {} is not empty (capacity {}); erase it "
                            "first",
                            dst, capacity(dst)));
  if (length < 0 || length > capacity(src))
    throw Error(fmt::format("fork: length {} is outside the source slot {}'s capacity [0, {}]",
                            length, src, capacity(src)));
  const int64_t sharedPages = length / config_.pageSize;
  const bool partial = length % config_.pageSize != 0;
  if (partial && freePageCount() < 1)
    throw outOfPages(1, freePageCount());
  std::vector<int32_t> &target = writableSlotTable(dst, "fork");
  const std::vector<int32_t> &source = slotTable(src);
  target.reserve(static_cast<size_t>(sharedPages + (partial ? 1 : 0)));
  for (int64_t i = 0; i < sharedPages; ++i) {
    ++refCount_[source[i]];
    target.push_back(source[i]);
  }
  if (partial) {
    int32_t page = takeFreePage();
    pageLogical_[page] = static_cast<int32_t>(sharedPages);
    copyPage(page, source[sharedPages]);
    target.push_back(page);
  }
}

namespace {

/// assign()'s checks of its arguments against the cache's configuration
/// (the error texts for shape mismatches are the seed's).
void checkAssignArguments(const KVCacheConfig &config, const TensorView &batchIdx,
                          const TensorView &inputPos, const TensorView &k,
                          const TensorView &v) {
  checkIndexTensor(batchIdx, "assign: batch_idx", 1);
  checkIndexTensor(inputPos, "assign: input_pos", 2);
  if (k.rank() != 4)
    throw Error(fmt::format("assign: k must be [B, H, S, D] but has shape {}", k.shapeString()));
  if (v.rank() != 4)
    throw Error(fmt::format("assign: v must be [B, H, S, Dv] but has shape {}", v.shapeString()));
  const int64_t batch = k.size(0), heads = k.size(1), seqLen = k.size(2);
  if (batch != batchIdx.size(0))
    throw Error(fmt::format("Expect val and batch_idx have the same batch size but got B={} "
                            "and B={}.",
                            batch, batchIdx.size(0)));
  if (heads != config.heads)
    throw Error(fmt::format("Expect val and cache has the same number of heads but got H={} "
                            "and H={}.",
                            heads, config.heads));
  if (inputPos.size(0) != batch)
    throw Error(fmt::format("Expect val and input_pos have the same batch size but got B={} "
                            "and B={}.",
                            batch, inputPos.size(0)));
  if (seqLen != inputPos.size(1))
    throw Error(fmt::format("Expect val and input_pos has the same length but got S={} and "
                            "S={}.",
                            seqLen, inputPos.size(1)));
  if (k.size(3) != config.headDim)
    throw Error(fmt::format("Expect k_val and k_cache has the same hidden dim but got D={} and "
                            "D={}.",
                            k.size(3), config.headDim));
  if (v.size(3) != config.valueHeadDim)
    throw Error(fmt::format("Expect v_val and v_cache has the same hidden dim but got D={} and "
                            "D={}.",
                            v.size(3), config.valueHeadDim));
  if (v.size(0) != batch || v.size(1) != heads || v.size(2) != seqLen)
    throw Error(fmt::format("assign: k has shape {} but v has shape {}; they must agree in B, "
                            "H and S",
                            k.shapeString(), v.shapeString()));
  const bool quantize = isFloat8(config.dtype);
  for (const auto &[view, name] : {std::make_pair(&k, "k"), std::make_pair(&v, "v")}) {
    if (quantize && view->dtype() != DType::F32 && view->dtype() != DType::F16 &&
        view->dtype() != DType::BF16)
      throw Error(fmt::format("assign: {} is {}; an {} cache takes f32, f16 or bf16 values and "
                              "quantizes them",
                              name, dtypeName(view->dtype()), dtypeName(config.dtype)));
    if (!quantize && view->dtype() != config.dtype)
      throw Error(fmt::format("assign: {} is {} but the cache stores {} (no conversion is done)",
                              name, dtypeName(view->dtype()), dtypeName(config.dtype)));
    // Codes are computed on the host: an 8-bit cache on a device takes host
    // values and uploads their codes.
    if (quantize && config.device.kind != DeviceKind::CPU) {
      if (view->device().kind != DeviceKind::CPU)
        throw Error(fmt::format("assign: {} is on {}; an {} cache on {} takes values in host "
                                "memory (they are quantized there)",
                                name, deviceName(view->device()), dtypeName(config.dtype),
                                deviceName(config.device)));
    } else if (view->device() != config.device)
      throw Error(fmt::format("assign: {} is on {} but the cache is on {}", name,
                              deviceName(view->device()), deviceName(config.device)));
    if (view->data() == nullptr && view->numel() != 0)
      throw Error(fmt::format("assign: {} has no data", name));
  }

}

/// The slots batch_idx names, each checked, with every position of
/// input_pos inside its slot's reserved capacity.
std::vector<int64_t> assignedSlots(const PagedKVCache &cache, const TensorView &batchIdx,
                                   const TensorView &inputPos) {
  const int64_t batch = batchIdx.size(0), seqLen = inputPos.size(1);
  const int64_t maxBatch = cache.config().maxBatch;
  std::vector<int64_t> slots(static_cast<size_t>(batch), 0);
  for (int64_t b = 0; b < batch; ++b) {
    int64_t slot = readIndex(batchIdx, b * batchIdx.stride(0));
    if (slot < 0 || slot >= maxBatch)
      throw Error(fmt::format("assign: batch_idx[{}] = {} is out of range [0, {})", b, slot,
                              maxBatch));
    slots[b] = slot;
    const int64_t cap = cache.capacity(slot);
    for (int64_t s = 0; s < seqLen; ++s) {
      int64_t pos = readIndex(inputPos, b * inputPos.stride(0) + s * inputPos.stride(1));
      if (pos < 0 || pos >= cap)
        throw Error(fmt::format("assign: input_pos[{}, {}] = {} is outside slot {}'s reserved "
                                "capacity [0, {})",
                                b, s, pos, slot, cap));
    }
  }
  return slots;
}

} // namespace

void PagedKVCache::assign(const TensorView &batchIdx, const TensorView &inputPos,
                          const TensorView &k, const TensorView &v) {
  checkAssignArguments(config_, batchIdx, inputPos, k, v);
  const int64_t batch = k.size(0), heads = k.size(1), seqLen = k.size(2);
  const bool quantize = isFloat8(config_.dtype);
  const std::vector<int64_t> slots = assignedSlots(*this, batchIdx, inputPos);

  // Copy-on-write: every shared page about to be written needs a fresh page.
  // Simulate reference drops so two writers of one page copy it only once.
  std::vector<std::pair<int64_t, int64_t>> copies; // (slot, logical page)
  std::unordered_map<int32_t, int32_t> dropped;
  std::unordered_set<int64_t> seen; // slot * numPages + logical page
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t> &table = slotTable(slots[b]);
    for (int64_t s = 0; s < seqLen; ++s) {
      int64_t pos = readIndex(inputPos, b * inputPos.stride(0) + s * inputPos.stride(1));
      int64_t logical = pos / config_.pageSize;
      int32_t page = table[logical];
      if (refCount_[page] <= 1)
        continue;
      if (!seen.insert(slots[b] * config_.numPages + logical).second)
        continue;
      if (refCount_[page] - dropped[page] > 1) {
        copies.emplace_back(slots[b], logical);
        ++dropped[page];
      }
    }
  }
  if (static_cast<int64_t>(copies.size()) > freePageCount())
    throw Error(fmt::format("assign: copy-on-write of shared pages requested {} pages but there "
                            "are only {} empty pages",
                            copies.size(), freePageCount()));
  std::vector<int64_t> rows(static_cast<size_t>(batch * seqLen));
  for (const auto &[slot, logical] : copies) {
    std::vector<int32_t> &table = tables_.at(slot); // holds the shared page
    int32_t shared = table[logical];
    int32_t page = takeFreePage();
    pageLogical_[page] = static_cast<int32_t>(logical);
    copyPage(page, shared);
    --refCount_[shared];
    table[logical] = page;
  }
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t> &table = slotTable(slots[b]);
    for (int64_t s = 0; s < seqLen; ++s) {
      int64_t pos = readIndex(inputPos, b * inputPos.stride(0) + s * inputPos.stride(1));
      rows[b * seqLen + s] =
          static_cast<int64_t>(table[pos / config_.pageSize]) * config_.pageSize +
          pos % config_.pageSize;
    }
  }
  if (rows.empty() || heads == 0)
    return;
  const int64_t totalRows = config_.numPages * config_.pageSize;
  TensorView kRows(kCache_.data(), config_.dtype, {config_.heads, totalRows, config_.headDim},
                   config_.device);
  TensorView vRows(vCache_.data(), config_.dtype, {config_.heads, totalRows, config_.valueHeadDim},
                   config_.device);
  if (quantize) {
    const HostTensor kCodes = quantizeRows(k, kScale_, config_.dtype);
    const HostTensor vCodes = quantizeRows(v, vScale_, config_.dtype);
    // On a device the codes go through one staging allocation there.
    const size_t kBytes = static_cast<size_t>(kCodes.numel()),
                 vBytes = static_cast<size_t>(vCodes.numel());
    const bool onHost = config_.device.kind == DeviceKind::CPU;
    void *staging = onHost ? nullptr : memory_->allocate(kBytes + vBytes);
    struct Release {
      KVMemory *memory;
      void *data;
      size_t bytes;
      ~Release() {
        if (data)
          memory->deallocate(data, bytes);
      }
    } release{memory_.get(), staging, kBytes + vBytes};
    auto codesOn = [&](const HostTensor &codes, size_t offset) {
      if (onHost)
        return TensorView(const_cast<void *>(codes.data()), config_.dtype, codes.shape());
      void *at = static_cast<char *>(staging) + offset;
      memory_->upload(at, codes.data(), static_cast<size_t>(codes.numel()));
      return TensorView(at, config_.dtype, codes.shape(), config_.device);
    };
    memory_->scatterRows(codesOn(kCodes, 0), kRows, rows.data());
    memory_->scatterRows(codesOn(vCodes, kBytes), vRows, rows.data());
    return;
  }
  memory_->scatterRows(k, kRows, rows.data());
  memory_->scatterRows(v, vRows, rows.data());
}

//===----------------------------------------------------------------------===//
// Queries
//===----------------------------------------------------------------------===//

int64_t PagedKVCache::capacity(int64_t slot) const {
  checkSlot(slot, "capacity:");
  return static_cast<int64_t>(slotTable(slot).size()) * config_.pageSize;
}

const std::vector<int32_t> &PagedKVCache::pageTable(int64_t slot) const {
  checkSlot(slot, "page table:");
  return slotTable(slot);
}

std::vector<int32_t> PagedKVCache::densePageTable(const std::vector<int32_t> &slots,
                                                  int64_t columns) const {
  // No slot's table is longer than the cache has pages: wider is padding
  // only (columns = 2^31 was an 8 GB request for nothing).
  if (columns > config_.numPages)
    throw Error(fmt::format("page table: {} columns is more than the cache's {} pages (no slot "
                            "can hold more)",
                            columns, config_.numPages));
  int64_t width = columns;
  for (int32_t slot : slots) {
    checkSlot(slot, "page table:");
    if (columns < 0)
      width = std::max<int64_t>(width, static_cast<int64_t>(slotTable(slot).size()));
  }
  width = std::max<int64_t>(width, 0);
  int64_t entries = 0;
  if (__builtin_mul_overflow(static_cast<int64_t>(slots.size()), width, &entries) ||
      entries > (int64_t(1) << 40))
    throw Error(fmt::format("page table: {} slots x {} columns is too large", slots.size(),
                            width));
  std::vector<int32_t> dense;
  try {
    dense.assign(static_cast<size_t>(entries), -1);
  } catch (const std::bad_alloc &) {
    throw Error(fmt::format("page table: out of host memory for {} slots x {} columns",
                            slots.size(), width));
  }
  for (size_t row = 0; row < slots.size(); ++row) {
    const std::vector<int32_t> &table = slotTable(slots[row]);
    const size_t count = std::min(table.size(), static_cast<size_t>(width));
    std::copy(table.begin(), table.begin() + count, dense.begin() + row * width);
  }
  return dense;
}

int32_t PagedKVCache::physicalToLogical(int64_t slot, int64_t page) const {
  checkSlot(slot, "physical to logical:");
  checkPage(page);
  const int32_t logical = pageLogical_[page];
  if (logical < 0)
    return -1;
  const std::vector<int32_t> &table = slotTable(slot);
  return static_cast<size_t>(logical) < table.size() && table[logical] == page ? logical : -1;
}

int32_t PagedKVCache::pageRefCount(int64_t page) const {
  checkPage(page);
  return refCount_[page];
}

} // namespace pagedc
