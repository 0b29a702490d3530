//===- KVCache.h - A paged key/value cache ---------------------*- C++ -*-===//
//
// PagedKVCache stores the keys and values of many sequences ("slots") in a
// pool of fixed-size pages and keeps, per slot, the page table that maps
// logical pages (position / page_size) to physical pages. Allocation follows
// PyTorch's PagedAttention exactly (free list, reserve, erase, assign), with
// prefix sharing (fork + copy-on-write) and memory that grows with use.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_KVCACHE_H
#define PAGEDC_KVCACHE_H

#include "pagedc/Tensor.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace pagedc {

//===----------------------------------------------------------------------===//
// Storage seam
//===----------------------------------------------------------------------===//

/// The memory operations the cache needs from the device its pages live on.
/// The CPU implementation is built in (hostKVMemory()) and so is CUDA's; an
/// application can place the caches of a device kind in memory of its own by
/// registering a factory with setKVMemoryFactory().
class KVMemory {
public:
  virtual ~KVMemory() = default;
  /// The device this memory lives on.
  virtual Device device() const = 0;
  /// Allocates `bytes` of zero-filled device memory; throws pagedc::Error
  /// when the device is out of memory.
  virtual void *allocate(size_t bytes) = 0;
  /// Frees memory returned by allocate().
  virtual void deallocate(void *data, size_t bytes) noexcept = 0;
  /// Copies `bytes` between two ranges of this device's memory.
  virtual void copy(void *dst, const void *src, size_t bytes) = 0;
  /// Copies `bytes` from host memory `src` to this device's `dst`: how an
  /// 8-bit float cache's codes, quantized on the host, reach the device.
  /// The default throws pagedc::Error (the memory takes no host data; such
  /// a cache then refuses assign()).
  virtual void upload(void *dst, const void *src, size_t bytes);
  /// Scatters rows: for every b, h, s, copies `values[b, h, s, :]` to
  /// `cache[h, slots[b * S + s], :]`. `values` ([B, H, S, D], any strides)
  /// and `cache` ([H, rows, D], compact) are on this device and have the same
  /// element type; `slots` is host memory with B * S entries, all valid.
  /// When two entries name the same slot, the later one wins.
  virtual void scatterRows(const TensorView &values, const TensorView &cache,
                           const int64_t *slots) = 0;
};

/// Checks scatterRows()' arguments against each other and throws
/// pagedc::Error naming the first mismatch: ranks, dtypes, `cache`'s H and D
/// against `values`', a compact `cache`, and every slot below `cache`'s row
/// count. scatterRows() is a public entry point, and a cache view with fewer
/// heads, narrower rows or fewer rows than `values` and `slots` reach would
/// otherwise be written past its end; every KVMemory calls this first.
void checkScatterRows(const TensorView &values, const TensorView &cache, const int64_t *slots);

/// The built-in host (CPU) memory.
std::shared_ptr<KVMemory> hostKVMemory();

/// Creates the memory of a device of one kind, for caches constructed
/// without explicit memory.
using KVMemoryFactory = std::function<std::shared_ptr<KVMemory>(Device)>;
/// Registers the factory for a device kind, used in place of the built-in
/// memory by caches constructed afterwards without explicit memory. Not
/// thread-safe with cache construction.
void setKVMemoryFactory(DeviceKind kind, KVMemoryFactory factory);

//===----------------------------------------------------------------------===//
// PagedKVCache
//===----------------------------------------------------------------------===//

/// Shape and placement of a cache.
struct KVCacheConfig {
  int64_t numPages = 0;
  /// Tokens per page: a power of two from 1 to 1024, independent of the
  /// kernels' kv tile size.
  int64_t pageSize = 16;
  /// Number of sequence slots (the seed's max_batch_size).
  int64_t maxBatch = 1;
  /// KV heads (Hkv).
  int64_t heads = 1;
  /// Key head dim (D) and value head dim (Dv).
  int64_t headDim = 64;
  int64_t valueHeadDim = 64;
  /// f32, f16, bf16, or an 8-bit float (F8E4M3, F8E5M2: the CPU backend, and
  /// flexAttention's CUDA decode and mma.sync prefill kernels).
  DType dtype = DType::F32;
  Device device = Device::cpu();
  /// Scales of an 8-bit float cache, one value for all KV heads or one per
  /// head (finite, > 0): a stored code c of head h means c * kScale[h] (K) or
  /// c * vScale[h] (V), and assign() stores round(x / scale). Required for
  /// 8-bit caches, refused for the others.
  std::vector<float> kScale, vScale;
};

/// A paged K/V cache.
///
/// Layout: K is stored as `[Hkv, numPages, pageSize, D]` and V as
/// `[Hkv, numPages, pageSize, Dv]`, compact. One head's page is a contiguous
/// `pageSize x D` block, which is what the kernels stream, and viewing the
/// storage as `[Hkv, numPages * pageSize, D]` gives the reference design's
/// `(1, H, MAX_S, D)` cache, so slot numbers `page * pageSize + offset` agree
/// with it.
///
/// Allocation (the reference semantics): the free list starts as
/// `[numPages-1, ..., 1, 0]`; reserve() of n pages takes the list's last n
/// entries and appends them, in list order, to the slot's page table; erase() returns a slot's
/// pages to the tail in logical order. Pages shared by fork() are reference counted and return to
/// the free list when their last owner lets go.
///
/// Memory grows with use: a slot's page table is a vector of its used length
/// and the physical-to-logical map is one record per page (its logical page
/// number, the same for every owner), so nothing is max_batch x numPages.
/// Every operation costs O(pages touched + tokens copied).
///
/// Errors: every operation checks all of its input first and throws
/// pagedc::Error naming the problem; a failed operation changes nothing.
///
/// Thread safety: not thread-safe. Concurrent const calls are fine; any
/// mutation must be externally synchronised with every other call, including
/// attention calls that read the cache.
class PagedKVCache {
public:
  /// A cache that owns its storage, allocated zero-filled from `memory`
  /// (default: the memory registered for config.device; host memory for the
  /// CPU).
  explicit PagedKVCache(const KVCacheConfig &config, std::shared_ptr<KVMemory> memory = nullptr);
  /// A cache over user storage: `kCache` [Hkv, numPages, pageSize, D] and
  /// `vCache` [Hkv, numPages, pageSize, Dv], compact, of config's dtype and
  /// device. The views must outlive the cache.
  PagedKVCache(const KVCacheConfig &config, const TensorView &kCache, const TensorView &vCache,
               std::shared_ptr<KVMemory> memory = nullptr);
  ~PagedKVCache();
  PagedKVCache(const PagedKVCache &) = delete;
  PagedKVCache &operator=(const PagedKVCache &) = delete;

  // Configuration.
  const KVCacheConfig &config() const { return config_; }
  int64_t numPages() const { return config_.numPages; }
  int64_t pageSize() const { return config_.pageSize; }
  int64_t maxBatch() const { return config_.maxBatch; }
  int64_t heads() const { return config_.heads; }
  int64_t headDim() const { return config_.headDim; }
  int64_t valueHeadDim() const { return config_.valueHeadDim; }
  DType dtype() const { return config_.dtype; }
  /// The per-head K and V scales of an 8-bit float cache ([Hkv] each, a
  /// single configured value repeated); empty for other caches.
  const std::vector<float> &kScale() const { return kScale_; }
  const std::vector<float> &vScale() const { return vScale_; }
  Device device() const { return config_.device; }

  /// The storage, `[Hkv, numPages, pageSize, D]` and `[..., Dv]`.
  const TensorView &kCache() const { return kCache_; }
  const TensorView &vCache() const { return vCache_; }

  //===--------------------------------------------------------------------===//
  // Allocation
  //===--------------------------------------------------------------------===//

  /// Grows slot `slot` to hold at least `seqLen` tokens: a no-op when its
  /// capacity already suffices, else takes ceil((seqLen - capacity) /
  /// pageSize) pages from the free list. Out of pages: throws with
  /// "requested N pages but there are only M empty pages".
  void reserve(int64_t slot, int64_t seqLen);
  /// Releases all of a slot's pages (shared pages only drop a reference);
  /// its capacity becomes 0.
  void erase(int64_t slot);
  /// Writes `k` [B, H, S, D] and `v` [B, H, S, Dv] (any strides, the cache's
  /// dtype and device) for the slots `batchIdx` [B] at positions `inputPos`
  /// [B, S] (i32 or i64, host): K/V row (b, h, s) goes to physical slot
  /// `pageTable[batchIdx[b]][p / pageSize] * pageSize + p % pageSize` with
  /// p = inputPos[b, s]. Elements are copied as they are (no conversion),
  /// except into an 8-bit float cache: k and v are then f32, f16 or bf16 on
  /// the host, and each element x of head h is stored as the code nearest to
  /// x / scale[h] (round to nearest even, saturating at the format's largest
  /// finite value, floatToFloat8()).
  /// Positions must be below the slot's capacity. Writing into a page that
  /// other slots share first gives the writer its own copy (copy-on-write),
  /// which needs free pages.
  void assign(const TensorView &batchIdx, const TensorView &inputPos, const TensorView &k,
              const TensorView &v);
  /// Makes empty slot `dst` share the first `length` tokens of slot `src`:
  /// src's full pages below `length` are shared (reference counted); a last
  /// partial page is copied to a fresh page for dst. dst's capacity becomes
  /// ceil(length / pageSize) * pageSize.
  void fork(int64_t src, int64_t dst, int64_t length);
  /// fork() of src's whole capacity (every page shared).
  void fork(int64_t src, int64_t dst) { fork(src, dst, capacity(src)); }

  //===--------------------------------------------------------------------===//
  // Queries
  //===--------------------------------------------------------------------===//

  /// Tokens slot `slot` can hold (a multiple of pageSize).
  int64_t capacity(int64_t slot) const;
  /// Number of pages on the free list.
  int64_t freePageCount() const { return static_cast<int64_t>(freePages_.size()); }
  /// The free list, its tail being the next page reserve() hands out.
  const std::vector<int32_t> &freePages() const { return freePages_; }
  /// Slot `slot`'s page table: physical page of each logical page, of the
  /// slot's used length (capacity / pageSize).
  const std::vector<int32_t> &pageTable(int64_t slot) const;
  /// The page tables of `slots` as a dense int32 [slots.size(), columns]
  /// row-major array padded with -1. `columns` < 0 means the longest table;
  /// more than numPages() is an error (no table is that long).
  std::vector<int32_t> densePageTable(const std::vector<int32_t> &slots,
                                      int64_t columns = -1) const;
  /// The logical page that physical page `page` holds for slot `slot`, or -1
  /// when the slot does not own it.
  int32_t physicalToLogical(int64_t slot, int64_t page) const;
  /// Number of slots owning physical page `page` (0 when free).
  int32_t pageRefCount(int64_t page) const;

private:
  void checkSlot(int64_t slot, const char *what) const;
  void checkPage(int64_t page) const;
  void allocateStorage();
  /// Pops the free list's tail page and sets its reference count to 1.
  int32_t takeFreePage();
  void copyPage(int32_t dst, int32_t src);
  /// The page table of a checked slot (empty for a slot never reserved).
  const std::vector<int32_t> &slotTable(int64_t slot) const;
  /// The same, writable: the slot's table is created if it has none, with an
  /// allocation failure as pagedc::Error naming `what`. References to other
  /// slots' tables stay valid.
  std::vector<int32_t> &writableSlotTable(int64_t slot, const char *what);

  KVCacheConfig config_;
  std::vector<float> kScale_, vScale_;
  std::shared_ptr<KVMemory> memory_;
  bool ownsStorage_ = false;
  size_t kBytes_ = 0, vBytes_ = 0;
  TensorView kCache_, vCache_;

  // The page table of each slot that holds pages (a slot without an entry
  // has an empty table), used length. Kept by slot id, so a cache configured
  // for 2^31 slots costs only the slots in use, whichever ids they have.
  std::unordered_map<int64_t, std::vector<int32_t>> tables_;
  std::vector<int32_t> freePages_;
  std::vector<int32_t> refCount_;    // per physical page
  std::vector<int32_t> pageLogical_; // per physical page, -1 when free
};

} // namespace pagedc

#endif // PAGEDC_KVCACHE_H
