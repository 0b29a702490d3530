//===- CudaBatchAttention.h - BatchAttention's CUDA backend ----*- C++ -*-===//
//
// Internal: what BatchAttention keeps for a CUDA device. Built at
// construction (the kernel compiled and loaded, every device buffer
// allocated), filled by plan() (the step's metadata and work list
// uploaded), launched by run() (one kernel enqueued, nothing allocated,
// nothing synchronised).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CUDA_CUDABATCHATTENTION_H
#define PAGEDC_RUNTIME_CUDA_CUDABATCHATTENTION_H

#include "pagedc/BatchAttention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/KernelArgs.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace pagedc::detail {

/// One run() of a planned step, every tensor checked and on the device.
struct CudaBatchCall {
  /// [T', Hq, D]; rows are packed.
  TensorView q;
  /// The caches as the kernel's [Hkv, pages, pageSize, D] views of the
  /// engine's memory (strides only, no copy).
  TensorView kCache, vCache;
  /// [T', Hq, D]; lse [T', Hq] contiguous, or empty (the backend's own).
  TensorView out, lse;
  /// pagedc_mods::Params bytes (ParamsLayout::pack).
  std::vector<unsigned char> params;
  float scale = 1.0f;
  /// A CUstream; null: the legacy default stream.
  void *stream = nullptr;
};

class CudaBatchBackend {
public:
  /// Compiles (or takes from the kernel cache) and loads the packed-batch
  /// prefill kernel for `config` and allocates the plan's device storage,
  /// sized by its limits. Throws pagedc::Error naming the problem.
  CudaBatchBackend(const CompiledMods &mods, const BatchAttentionConfig &config);

  /// Rows per query tile of the kernel (the work list's granule).
  int tileRows() const { return kernel_->config.blockM; }

  /// Uploads a validated plan of `batch` sequences: queryStart [B + 1],
  /// kvLength, qOffset [B], pageTable [B, maxBlocksPerSeq], and the work
  /// list built from them.
  void plan(const int32_t *queryStart, const int32_t *kvLength, const int32_t *qOffset,
            const int32_t *pageTable, int64_t batch);

  /// Enqueues the planned step's kernel on call.stream (none when the step
  /// has no work).
  void run(const CudaBatchCall &call) const;

  /// The K and V cache addresses the last run() passed its kernel.
  std::pair<const void *, const void *> lastCacheAddresses() const;

private:
  BatchAttentionConfig config_;
  std::shared_ptr<const CudaKernel> kernel_;
  int64_t maxWorkTiles_ = 0;
  // One allocation: page table [maxNumSeqs, maxBlocksPerSeq], kv_len and
  // q_offset [maxNumSeqs], q_start [maxNumSeqs + 1], work tiles
  // [maxWorkTiles, 2], then the lse the kernel writes when the caller
  // wants none [maxNumTokens, Hq] (f32).
  DeviceBuffer storage_;
  size_t kvLenAt_ = 0, qOffsetAt_ = 0, qStartAt_ = 0, workAt_ = 0, lseAt_ = 0;
  // The plan.
  int64_t batch_ = 0, workTiles_ = 0, maxKvLength_ = 1;
  // Sized at construction: the work list in step order, its weights, the
  // heaviest-first order and the list in that order (uploaded).
  std::vector<int32_t> work_;    // [maxWorkTiles, 2]
  std::vector<int32_t> ordered_; // [maxWorkTiles, 2]
  std::vector<int64_t> weight_;
  std::vector<int32_t> order_;
  mutable std::mutex lastMutex_;
  mutable const void *lastK_ = nullptr, *lastV_ = nullptr;
};

} // namespace pagedc::detail

#endif // PAGEDC_RUNTIME_CUDA_CUDABATCHATTENTION_H
