//===- Attention.cpp - Validate and dispatch paged flex attention ---------===//
#include "pagedc/Attention.h"
#include "pagedc/Error.h"

#include "TensorChecks.h"
#include "cpu/CpuAttention.h"
#include "cuda/CudaAttention.h"
#include "pagedc/CudaDriver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace pagedc {

//===----------------------------------------------------------------------===//
// Validation
//===----------------------------------------------------------------------===//

namespace {

using detail::checkReadable;
using detail::checkWritable;
using detail::isCpuFloat;
using detail::isProvided;
using detail::shapeText;

bool isGpuFloat(DType type) { return type == DType::F16 || type == DType::BF16; }

/// The call's facts once its inputs are checked.
struct CheckedCall {
  Device device;
  int64_t batch, queryHeads, queryLength, headDim, valueHeadDim;
  std::vector<int32_t> slots, kvLength, qOffset;
  float scale;
  bool returnLse;
};

/// What the call reads its keys and values from: a paged cache, or dense
/// k [B', Hkv, S, D] and v [B', Hkv, S, Dv] tensors, whose batch entries
/// take the place of the cache's slots (each S long).
struct KeySource {
  const PagedKVCache *cache = nullptr;
  Device device;
  DType dtype = DType::F32;
  int64_t heads = 0, headDim = 0, valueHeadDim = 0;
  /// Slots, or k's batch B'.
  int64_t entries = 0;
  /// Dense tensors: S.
  int64_t length = 0;

  static KeySource of(const PagedKVCache &cache) {
    KeySource keys;
    keys.cache = &cache;
    keys.device = cache.device();
    keys.dtype = cache.dtype();
    keys.heads = cache.heads();
    keys.headDim = cache.headDim();
    keys.valueHeadDim = cache.valueHeadDim();
    keys.entries = cache.maxBatch();
    return keys;
  }
  const char *name() const { return cache ? "the KV cache" : "k"; }
  int64_t capacity(int32_t entry) const { return cache ? cache->capacity(entry) : length; }
  std::string capacityText(int32_t entry) const {
    return cache ? fmt::format("the capacity of cache slot {}", entry)
                 : std::string("k's length S");
  }
};

/// The call's slots, KV lengths and query offsets from `options`, each
/// checked against q's batch and the source's slots and capacities.
void checkBatchEntries(const KeySource &keys, const AttentionOptions &options, CheckedCall &call) {
  const int64_t batch = call.batch;
  if (options.batchIdx.empty()) {
    if (batch > keys.entries)
      throw Error(keys.cache ? fmt::format("q has batch B={} but the KV cache has only {} "
                                           "slots; pass options.batchIdx",
                                           batch, keys.entries)
                             : fmt::format("q has batch B={} but k has batch {}; pass "
                                           "options.batchIdx",
                                           batch, keys.entries));
    for (int64_t b = 0; b < batch; ++b)
      call.slots.push_back(static_cast<int32_t>(b));
  } else {
    if (static_cast<int64_t>(options.batchIdx.size()) != batch)
      throw Error(fmt::format("options.batchIdx has {} entries but q has batch B={}",
                              options.batchIdx.size(), batch));
    for (int64_t b = 0; b < batch; ++b)
      if (options.batchIdx[b] < 0 || options.batchIdx[b] >= keys.entries)
        throw Error(fmt::format("options.batchIdx[{}] = {} is out of range [0, {})", b,
                                options.batchIdx[b], keys.entries));
    call.slots = options.batchIdx;
  }
  if (static_cast<int64_t>(options.kvLength.size()) != batch)
    throw Error(options.kvLength.empty()
                    ? fmt::format("options.kvLength is required: one valid KV length per batch "
                                  "entry (B={})",
                                  batch)
                    : fmt::format("options.kvLength has {} entries but q has batch B={}",
                                  options.kvLength.size(), batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t capacity = keys.capacity(call.slots[b]);
    if (options.kvLength[b] < 0 || options.kvLength[b] > capacity)
      throw Error(fmt::format("options.kvLength[{}] = {} is outside [0, {}], {}", b,
                              options.kvLength[b], capacity, keys.capacityText(call.slots[b])));
  }
  call.kvLength = options.kvLength;
  if (options.qOffset.empty()) {
    call.qOffset.assign(static_cast<size_t>(batch), 0);
  } else {
    if (static_cast<int64_t>(options.qOffset.size()) != batch)
      throw Error(fmt::format("options.qOffset has {} entries but q has batch B={}",
                              options.qOffset.size(), batch));
    for (int64_t b = 0; b < batch; ++b)
      if (options.qOffset[b] < 0 ||
          options.qOffset[b] + call.queryLength > std::numeric_limits<int32_t>::max())
        throw Error(fmt::format("options.qOffset[{}] = {} is negative or puts query positions "
                                "past the int32 range",
                                b, options.qOffset[b]));
    call.qOffset = options.qOffset;
  }
}

/// A logical block mask's extents and coverage against the call's batch,
/// heads, query positions and KV lengths.
void checkBlockMaskForCall(const BlockMask &blockMask, const CheckedCall &call) {
  validateBlockMask(blockMask);
  if (blockMask.physicalIndices)
    throw Error("the block mask holds physical page indices (from convertLogicalBlockMask); "
                "flexAttention takes the logical mask");
  if (blockMask.batch != 1 && blockMask.batch != call.batch)
    throw Error(fmt::format("block mask has batch extent {} but the call has B={} (the extent "
                            "must be 1 or B)",
                            blockMask.batch, call.batch));
  if (blockMask.heads != 1 && blockMask.heads != call.queryHeads)
    throw Error(fmt::format("block mask has head extent {} but the call has Hq={} (the extent "
                            "must be 1 or Hq)",
                            blockMask.heads, call.queryHeads));
  for (int64_t b = 0; b < call.batch; ++b) {
    const int64_t lastPosition = call.qOffset[b] + call.queryLength;
    if (call.queryLength > 0 && lastPosition > blockMask.qLength)
      throw Error(fmt::format("block mask was built for Q_LEN={} but batch entry {} has query "
                              "positions up to {} (q offset {} + Lq {})",
                              blockMask.qLength, b, lastPosition - 1, call.qOffset[b],
                              call.queryLength));
    const int64_t firstCovered = blockMask.firstQBlock * blockMask.qBlockSize;
    if (call.queryLength > 0 && call.qOffset[b] < firstCovered)
      throw Error(fmt::format("block mask covers query positions from {} (q block {}) but "
                              "batch entry {} starts at position {} (its q offset)",
                              firstCovered, blockMask.firstQBlock, b, call.qOffset[b]));
    if (call.kvLength[b] > blockMask.kvLength)
      throw Error(fmt::format("block mask was built for KV_LEN={} but options.kvLength[{}] = "
                              "{}",
                              blockMask.kvLength, b, call.kvLength[b]));
  }
}

/// The caller's out and lse against the call's shapes and device (on a
/// GPU both must be given: the runtime allocates outputs only on the CPU).
void checkCallOutputs(const TensorView &q, const AttentionOptions &options,
                      const CheckedCall &call) {
  const bool onCpu = call.device.kind == DeviceKind::CPU;
  const int64_t batch = call.batch;
  const std::vector<int64_t> outShape = {batch, call.queryHeads, call.queryLength,
                                         call.valueHeadDim};
  const std::vector<int64_t> lseShape = {batch, call.queryHeads, call.queryLength};
  if (isProvided(options.out)) {
    const TensorView &out = options.out;
    if (out.shape() != outShape)
      throw Error(fmt::format("options.out must be {} ([B, Hq, Lq, Dv]) but has shape {}",
                              shapeText(outShape), out.shapeString()));
    if (out.device() != call.device)
      throw Error(fmt::format("options.out is on {} but the call runs on {}",
                              deviceName(out.device()), deviceName(call.device)));
    if (onCpu ? !isCpuFloat(out.dtype()) : out.dtype() != q.dtype())
      throw Error(fmt::format("options.out is {} but must be {}", dtypeName(out.dtype()),
                              onCpu ? "f32 or bf16" : dtypeName(q.dtype())));
    if (out.data() == nullptr && out.numel() != 0)
      throw Error("options.out has no data");
    checkWritable(out, "options.out");
  } else if (!onCpu) {
    throw Error(fmt::format("on {} pass options.out (the runtime allocates outputs only on the "
                            "CPU)",
                            deviceName(call.device)));
  }
  if (isProvided(options.lse)) {
    const TensorView &lse = options.lse;
    if (lse.shape() != lseShape)
      throw Error(fmt::format("options.lse must be {} ([B, Hq, Lq]) but has shape {}",
                              shapeText(lseShape), lse.shapeString()));
    if (lse.device() != call.device)
      throw Error(fmt::format("options.lse is on {} but the call runs on {}",
                              deviceName(lse.device()), deviceName(call.device)));
    if (lse.dtype() != DType::F32)
      throw Error(fmt::format("options.lse is {} but must be f32", dtypeName(lse.dtype())));
    if (lse.data() == nullptr && lse.numel() != 0)
      throw Error("options.lse has no data");
    checkWritable(lse, "options.lse");
  } else if (call.returnLse && !onCpu) {
    throw Error(fmt::format("on {} pass options.lse to get the lse", deviceName(call.device)));
  }
}

CheckedCall checkCall(const TensorView &q, const KeySource &keys, const BlockMask *blockMask,
                      const CompiledMods &mods, const AttentionOptions &options) {
  CheckedCall call;
  call.device = options.device.value_or(q.device());
  const bool onCpu = call.device.kind == DeviceKind::CPU;

  // Devices.
  if (q.device() != call.device)
    throw Error(fmt::format("q is on {} but the call runs on {}", deviceName(q.device()),
                            deviceName(call.device)));
  if (keys.device != call.device)
    throw Error(fmt::format("{} is on {} but the call runs on {}", keys.name(),
                            deviceName(keys.device), deviceName(call.device)));

  // q and the cache.
  if (q.rank() != 4)
    throw Error(fmt::format("q must be [B, Hq, Lq, D] but has shape {}", q.shapeString()));
  checkReadable(q, "q");
  if (onCpu && !isCpuFloat(q.dtype()))
    throw Error(fmt::format("q must be f32 or bf16 on the CPU but is {}", dtypeName(q.dtype())));
  if (onCpu && !isCpuFloat(keys.dtype) && !(keys.cache && isFloat8(keys.dtype)))
    throw Error(keys.cache ? fmt::format("the KV cache stores {}, which the CPU backend does "
                                         "not support (f32, bf16, f8e4m3 or f8e5m2)",
                                         dtypeName(keys.dtype))
                           : fmt::format("k is {}, which the CPU backend does not read in "
                                         "place (f32 or bf16)",
                                         dtypeName(keys.dtype)));
  if (!onCpu && !isGpuFloat(q.dtype()))
    throw Error(fmt::format("q must be f16 or bf16 on {} but is {}", deviceName(call.device),
                            dtypeName(q.dtype())));
  if (!onCpu && keys.dtype != q.dtype() && !isFloat8(keys.dtype))
    throw Error(fmt::format("q is {} but the KV cache stores {}; on {} they must match (or the "
                            "cache holds f8e4m3 or f8e5m2)",
                            dtypeName(q.dtype()), dtypeName(keys.dtype), deviceName(call.device)));
  if (!onCpu && q.stride(3) != 1)
    throw Error(fmt::format("q's last dimension must be contiguous on {} but has stride {}",
                            deviceName(call.device), q.stride(3)));
  call.batch = q.size(0);
  call.queryHeads = q.size(1);
  call.queryLength = q.size(2);
  call.headDim = q.size(3);
  call.valueHeadDim = keys.valueHeadDim;
  if (call.headDim != keys.headDim)
    throw Error(fmt::format("q has head dim D={} but {} has D={}", call.headDim, keys.name(),
                            keys.headDim));
  if (keys.heads == 0 || call.queryHeads % keys.heads != 0)
    throw Error(fmt::format("query heads Hq={} are not a multiple of {}'s heads Hkv={}",
                            call.queryHeads, keys.cache ? "the KV cache" : "k", keys.heads));
  if (call.queryLength > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("q length Lq={} exceeds the int32 index range", call.queryLength));

  // Batch slots, lengths, offsets.
  checkBatchEntries(keys, options, call);

  // Scale.
  call.scale = options.scale.value_or(
      call.headDim > 0 ? 1.0f / std::sqrt(static_cast<float>(call.headDim)) : 1.0f);
  if (!std::isfinite(call.scale))
    throw Error(fmt::format("scale must be finite but is {}", call.scale));
  if (options.threads < 0)
    throw Error(fmt::format("options.threads must not be negative but is {}", options.threads));

  if (blockMask)
    checkBlockMaskForCall(*blockMask, call);

  // Mods (bindings are resolved by the caller).
  if (onCpu && mods.hasMask() && !mods.maskRow)
    throw Error(fmt::format("mask mod '{}' has no CPU function", mods.maskName));
  if (onCpu && mods.hasScore() && !mods.scoreRow)
    throw Error(fmt::format("score mod '{}' has no CPU function", mods.scoreName));

  detail::checkSinks(options.sinks, call.queryHeads, call.device, "options.sinks");
  call.returnLse = options.returnLse || isProvided(options.lse);
  checkCallOutputs(q, options, call);
  return call;
}

/// Dense k [B', Hkv, S, D] and v [B', Hkv, S, Dv] against each other, as
/// the source the call reads in place.
KeySource checkDenseKeys(const TensorView &k, const TensorView &v) {
  if (k.rank() != 4)
    throw Error(fmt::format("k must be [B, Hkv, S, D] but has shape {}", k.shapeString()));
  if (v.rank() != 4)
    throw Error(fmt::format("v must be [B, Hkv, S, Dv] but has shape {}", v.shapeString()));
  if (v.size(0) != k.size(0) || v.size(1) != k.size(1) || v.size(2) != k.size(2))
    throw Error(fmt::format("v has shape {} but k has {}; batch, heads and length must match",
                            v.shapeString(), k.shapeString()));
  if (v.dtype() != k.dtype())
    throw Error(fmt::format("v is {} but k is {}; they must match", dtypeName(v.dtype()),
                            dtypeName(k.dtype())));
  if (v.device() != k.device())
    throw Error(
        fmt::format("v is on {} but k is on {}", deviceName(v.device()), deviceName(k.device())));
  if (k.size(2) > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("k's length S={} exceeds the int32 index range", k.size(2)));
  checkReadable(k, "k");
  checkReadable(v, "v");
  KeySource keys;
  keys.device = k.device();
  keys.dtype = k.dtype();
  keys.heads = k.size(1);
  keys.headDim = k.size(3);
  keys.valueHeadDim = v.size(3);
  keys.entries = k.size(0);
  keys.length = k.size(2);
  return keys;
}

/// The outputs the call writes: the caller's, or new host tensors.
AttentionResult makeOutputs(const TensorView &q, const CheckedCall &call,
                            const AttentionOptions &options) {
  AttentionResult result;
  if (!isProvided(options.out)) {
    result.ownedOut =
        HostTensor(q.dtype(), {call.batch, call.queryHeads, call.queryLength, call.valueHeadDim});
    result.out = result.ownedOut.view();
  } else {
    result.out = options.out;
  }
  if (call.returnLse) {
    if (!isProvided(options.lse)) {
      result.ownedLse = HostTensor(DType::F32, {call.batch, call.queryHeads, call.queryLength});
      result.lse = result.ownedLse.view();
    } else {
      result.lse = options.lse;
    }
  }
  return result;
}

/// The kernel arguments every source shares; the caller adds K/V and pages.
cpu::PagedAttentionArgs commonArgs(const TensorView &q, const CheckedCall &call,
                                   const BlockMask *blockMask, const CompiledMods &mods,
                                   const ResolvedBindings &resolved,
                                   const AttentionOptions &options, const AttentionResult &result) {
  cpu::PagedAttentionArgs args;
  args.q = q;
  args.kvLength = call.kvLength.data();
  args.qOffset = call.qOffset.data();
  args.blockMask = blockMask;
  args.mods = &mods;
  args.context = &resolved.context();
  args.scale = call.scale;
  args.out = result.out;
  args.lse = result.lse;
  args.sinks = options.sinks;
  args.threads = options.threads;
  return args;
}

void checkDriver(const TensorView &q, const AttentionOptions &options) {
  const Device device = options.device.value_or(q.device());
  if (device.kind == DeviceKind::CUDA) {
    // Without a driver, say why before checking anything else.
    std::string reason;
    if (!CudaDriver::available(&reason))
      throw Error(fmt::format("CUDA execution is not available: {}", reason));
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// flexAttention
//===----------------------------------------------------------------------===//

AttentionResult flexAttention(const TensorView &q, const PagedKVCache &cache,
                              const BlockMask *blockMask, const CompiledMods &mods,
                              const Bindings &bindings, const AttentionOptions &options) {
  checkDriver(q, options);
  const CheckedCall call = checkCall(q, KeySource::of(cache), blockMask, mods, options);
  checkKernelOptions(options.kernel);
  const ResolvedBindings resolved = resolveBindings(mods, bindings, call.device);

  // Everything is valid: allocate outputs and build the call's page table,
  // row b holding the pages of slot batchIdx[b] that kvLength[b] reaches.
  AttentionResult result = makeOutputs(q, call, options);
  const int64_t batch = call.batch;
  if (batch == 0 || call.queryHeads == 0 || call.queryLength == 0)
    return result;

  const int64_t pageSize = cache.pageSize();
  int64_t stride = 1;
  for (int64_t b = 0; b < batch; ++b)
    stride = std::max<int64_t>(stride, (call.kvLength[b] + pageSize - 1) / pageSize);
  std::vector<int32_t> pageTable(static_cast<size_t>(batch * stride), -1);
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int32_t> &table = cache.pageTable(call.slots[b]);
    const int64_t pages = (call.kvLength[b] + pageSize - 1) / pageSize;
    std::copy(table.begin(), table.begin() + pages, pageTable.begin() + b * stride);
  }

  cpu::PagedAttentionArgs args = commonArgs(q, call, blockMask, mods, resolved, options, result);
  args.kCache = cache.kCache();
  args.vCache = cache.vCache();
  if (isFloat8(cache.dtype())) {
    args.kScale = cache.kScale().data();
    args.vScale = cache.vScale().data();
  }
  args.pageTable = pageTable.data();
  args.pageTableStride = stride;
  args.pageSize = static_cast<int32_t>(pageSize);
  if (call.device.kind == DeviceKind::CPU)
    cpu::pagedAttention(args);
  else
    cuda::pagedAttention(args, call.device, options.stream, options.kernel);
  return result;
}

AttentionResult flexAttention(const TensorView &q, const TensorView &k, const TensorView &v,
                              const BlockMask *blockMask, const CompiledMods &mods,
                              const Bindings &bindings, const AttentionOptions &options) {
  const KeySource keys = checkDenseKeys(k, v);
  const Device device = options.device.value_or(q.device());
  if (device.kind != DeviceKind::CPU)
    throw Error(fmt::format("dense k and v are read in place on the CPU only; on {} store "
                            "them in a PagedKVCache (the CUDA kernels read its compact "
                            "pages)",
                            deviceName(device)));
  AttentionOptions withLengths;
  const AttentionOptions *checked = &options;
  if (options.kvLength.empty()) {
    // Every batch entry reads all S keys by default.
    withLengths = options;
    withLengths.kvLength.assign(static_cast<size_t>(q.rank() == 4 ? q.size(0) : 0),
                                static_cast<int32_t>(keys.length));
    checked = &withLengths;
  }
  const CheckedCall call = checkCall(q, keys, blockMask, mods, *checked);
  checkKernelOptions(options.kernel);
  const ResolvedBindings resolved = resolveBindings(mods, bindings, call.device);

  AttentionResult result = makeOutputs(q, call, options);
  if (call.batch == 0 || call.queryHeads == 0 || call.queryLength == 0)
    return result;

  // Batch entry e of k is page e of a cache whose pages hold S tokens:
  // [Hkv, B', S, D] is k itself with its first two strides swapped, and the
  // page table maps the call's entry b to page batchIdx[b]. The kernels
  // address a row as head * stride(0) + page * stride(1) + slot * stride(2),
  // which reads k and v where they lie, whatever their strides.
  auto pagedView = [](const TensorView &dense) {
    return TensorView(
        dense.data(), dense.dtype(),
        std::vector<int64_t>{dense.size(1), dense.size(0), dense.size(2), dense.size(3)},
        std::vector<int64_t>{dense.stride(1), dense.stride(0), dense.stride(2), dense.stride(3)},
        dense.device());
  };
  cpu::PagedAttentionArgs args = commonArgs(q, call, blockMask, mods, resolved, options, result);
  args.kCache = pagedView(k);
  args.vCache = pagedView(v);
  args.pageTable = call.slots.data();
  args.pageTableStride = 1;
  args.pageSize = static_cast<int32_t>(std::max<int64_t>(keys.length, 1));
  cpu::pagedAttention(args);
  return result;
}

} // namespace pagedc
