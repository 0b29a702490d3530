//===- CudaBatchAttention.cpp - BatchAttention's CUDA backend -------------===//
//
// The packed-batch prefill kernel (templates/Prefill.cuh with kPackedBatch)
// over a work list of (sequence, query tile) entries: one launch covers
// the whole mixed step, and a sequence with no new tokens has no entry.
//
//===----------------------------------------------------------------------===//
#include "cuda/CudaBatchAttention.h"

#include "pagedc/CudaLaunch.h"
#include "pagedc/Error.h"
#include "pagedc/KernelSource.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace pagedc::detail {

namespace {

/// The packed-batch kernel for `config`: 64-row query tiles with 16 rows
/// per warp, 64 keys per KV tile (32 at head dim 256). A step's short
/// sequences (decode, speculative verification) each fill one tile alone,
/// so a 64-row tile wastes half of what choosePrefillShape's 128-row tile
/// at head dim 64 would on them; and these are choosePrefillShape's
/// spill-free shapes at head dims 128 and 256. mma.sync tiles on every
/// target: the warpgroup prefill has no work-list path.
KernelConfig packedBatchKernelConfig(const CompiledMods &mods, const BatchAttentionConfig &c) {
  KernelConfig config;
  config.kind = KernelKind::Prefill;
  config.elementType = c.dtype;
  config.headDim = static_cast<int>(c.headDim);
  config.pageSize = static_cast<int>(c.pageSize);
  config.blockM = 64;
  config.warpRows = 16;
  config.blockN = c.headDim == 256 ? 32 : 64;
  config.groupSize = 1; // prefill reads the GQA ratio at run time
  // Always with lse: a call that wants none gets it written to the
  // backend's own buffer, so one kernel serves both.
  config.returnLse = true;
  config.paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
  config.packedBatch = true;
  config.validate();
  return config;
}

} // namespace

CudaBatchBackend::CudaBatchBackend(const CompiledMods &mods, const BatchAttentionConfig &config)
    : config_(config) {
  const BatchAttentionConfig &c = config_;
  if (c.dtype != DType::BF16 && c.dtype != DType::F16)
    throw Error(fmt::format("dtype must be bf16 or f16 on CUDA but is {}", dtypeName(c.dtype)));
  if (c.headDim != 64 && c.headDim != 128 && c.headDim != 256)
    throw Error(fmt::format("head_dim must be 64, 128 or 256 on CUDA but is {}", c.headDim));
  if (c.valueHeadDim != c.headDim)
    throw Error(
        fmt::format("value_head_dim {} must equal head_dim {} on CUDA", c.valueHeadDim, c.headDim));
  if ((c.pageSize & (c.pageSize - 1)) != 0 || c.pageSize > 1024)
    throw Error(
        fmt::format("page_size must be a power of two in [1, 1024] on CUDA but is {}", c.pageSize));
  std::string reason;
  if (!CudaDriver::available(&reason))
    throw Error(
        fmt::format("BatchAttention on {} is not available: {}", deviceName(c.device), reason));
  const KernelConfig kernelConfig = packedBatchKernelConfig(mods, c);
  kernel_ = cudaKernelFor(mods, kernelConfig, c.device.index);

  // Each tile holds at least one token, and at most one tile per sequence
  // is partial.
  const int64_t rows = kernelConfig.blockM;
  maxWorkTiles_ = std::min(c.maxNumTokens, c.maxNumTokens / rows + c.maxNumSeqs);
  if (maxWorkTiles_ * c.numQHeads > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("max_num_tokens {} and max_num_seqs {} allow {} query tiles x {} "
                            "heads, more CTAs than a grid holds (2^31 - 1)",
                            c.maxNumTokens, c.maxNumSeqs, maxWorkTiles_, c.numQHeads));
  const size_t ints = static_cast<size_t>(c.maxNumSeqs * c.maxBlocksPerSeq);
  kvLenAt_ = ints;
  qOffsetAt_ = kvLenAt_ + static_cast<size_t>(c.maxNumSeqs);
  qStartAt_ = qOffsetAt_ + static_cast<size_t>(c.maxNumSeqs);
  workAt_ = qStartAt_ + static_cast<size_t>(c.maxNumSeqs + 1);
  // (f32 after int32: 4-byte aligned.)
  lseAt_ = workAt_ + static_cast<size_t>(2 * maxWorkTiles_);
  const size_t bytes = (lseAt_ + static_cast<size_t>(c.maxNumTokens * c.numQHeads)) * 4;
  storage_ = DeviceBuffer(bytes, c.device.index);
  work_.assign(static_cast<size_t>(2 * maxWorkTiles_), 0);
  ordered_.assign(static_cast<size_t>(2 * maxWorkTiles_), 0);
  weight_.assign(static_cast<size_t>(maxWorkTiles_), 0);
  order_.assign(static_cast<size_t>(maxWorkTiles_), 0);
}

void CudaBatchBackend::plan(const int32_t *queryStart, const int32_t *kvLength,
                            const int32_t *qOffset, const int32_t *pageTable, int64_t batch) {
  const BatchAttentionConfig &c = config_;
  const int rows = tileRows();
  // The work list, heaviest tiles first (the keys a tile's last row may
  // see: under a causal mask, what it costs), so that light tiles fill the
  // launch's tail.
  int64_t tiles = 0;
  int32_t maxKv = 1;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t qLength = queryStart[b + 1] - queryStart[b];
    maxKv = std::max(maxKv, kvLength[b]);
    for (int32_t row = 0; row < qLength; row += rows) {
      weight_[tiles] =
          std::min<int64_t>(kvLength[b], int64_t(qOffset[b]) + row + std::min(rows, qLength - row));
      work_[2 * tiles] = static_cast<int32_t>(b);
      work_[2 * tiles + 1] = row;
      ++tiles;
    }
  }
  std::iota(order_.begin(), order_.begin() + tiles, 0);
  std::stable_sort(order_.begin(), order_.begin() + tiles,
                   [&](int32_t a, int32_t b) { return weight_[a] > weight_[b]; });
  int32_t *ordered = ordered_.data();
  for (int64_t i = 0; i < tiles; ++i) {
    ordered[2 * i] = work_[2 * order_[i]];
    ordered[2 * i + 1] = work_[2 * order_[i] + 1];
  }

  const size_t pageInts = static_cast<size_t>(batch * c.maxBlocksPerSeq);
  storage_.upload(pageTable, pageInts * 4, 0);
  storage_.upload(kvLength, static_cast<size_t>(batch) * 4, kvLenAt_ * 4);
  storage_.upload(qOffset, static_cast<size_t>(batch) * 4, qOffsetAt_ * 4);
  storage_.upload(queryStart, static_cast<size_t>(batch + 1) * 4, qStartAt_ * 4);
  storage_.upload(ordered, static_cast<size_t>(2 * tiles) * 4, workAt_ * 4);
  batch_ = batch;
  workTiles_ = tiles;
  maxKvLength_ = maxKv;
}

void CudaBatchBackend::run(const CudaBatchCall &call) const {
  const BatchAttentionConfig &c = config_;
  {
    std::lock_guard<std::mutex> lock(lastMutex_);
    lastK_ = call.kCache.data();
    lastV_ = call.vCache.data();
  }
  if (workTiles_ == 0)
    return;
  auto *ints = static_cast<int32_t *>(storage_.data());
  PagedcAttentionKernelArgs args{};
  args.q = call.q.data();
  args.k_cache = call.kCache.data();
  args.v_cache = call.vCache.data();
  args.out = call.out.data();
  args.lse = call.lse.data() ? static_cast<float *>(call.lse.data())
                             : reinterpret_cast<float *>(ints + lseAt_);
  args.page_table = ints;
  args.kv_len = ints + kvLenAt_;
  args.q_offset = ints + qOffsetAt_;
  args.q_start = ints + qStartAt_;
  args.work_tiles = ints + workAt_;
  args.num_work_tiles = static_cast<int32_t>(workTiles_);
  // Rows are packed: no batch stride; (b, h, row).
  args.q_stride[0] = 0;
  args.q_stride[1] = call.q.stride(1);
  args.q_stride[2] = call.q.stride(0);
  args.out_stride[0] = 0;
  args.out_stride[1] = call.out.stride(1);
  args.out_stride[2] = call.out.stride(0);
  for (int d = 0; d < 3; ++d) {
    args.k_stride[d] = call.kCache.stride(d);
    args.v_stride[d] = call.vCache.stride(d);
  }
  args.page_table_stride = c.maxBlocksPerSeq;
  args.batch = static_cast<int32_t>(batch_);
  args.heads_q = static_cast<int32_t>(c.numQHeads);
  args.heads_kv = static_cast<int32_t>(c.numKVHeads);
  args.q_len = 1; // (per sequence from q_start)
  args.mask_batch = 1;
  args.mask_heads = 1;
  args.num_splits = 1;
  args.split_size = static_cast<int32_t>(maxKvLength_);
  args.scale = call.scale;

  const KernelConfig &config = kernel_->config;
  KernelLaunch launch;
  launch.kernel = "pagedc_prefill";
  launch.grid[0] = static_cast<unsigned>(workTiles_ * c.numQHeads);
  launch.block[0] = static_cast<unsigned>(config.threadsPerCta());
  launch.sharedMemoryBytes = static_cast<unsigned>(config.sharedMemoryBytes());
  launch.arguments.resize(2);
  launch.arguments[0].resize(sizeof(args));
  std::memcpy(launch.arguments[0].data(), &args, sizeof(args));
  launch.arguments[1] = call.params;
  const CudaDriver &driver = cudaUseDevice(kernel_->device);
  launchKernel(driver, kernel_->main, launch, static_cast<cu::Stream>(call.stream));
}

std::pair<const void *, const void *> CudaBatchBackend::lastCacheAddresses() const {
  std::lock_guard<std::mutex> lock(lastMutex_);
  return {lastK_, lastV_};
}

} // namespace pagedc::detail
