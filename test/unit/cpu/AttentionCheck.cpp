//===- AttentionCheck.cpp - Paged CPU attention vs the float64 reference --===//
#include "AttentionCheck.h"

#include "cuda/CudaAttention.h"
#include "pagedc/CudaAttention.h"

#include "cpu/Reference.h"
#include "pagedc/Attention.h"
#include "pagedc/Error.h"
#include "pagedc/KernelOptions.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <limits>
#include <random>

namespace pagedc::testutil {

std::string AttentionCheckResult::describe() const {
  return fmt::format("max |out err| {:.3g} ({} over tolerance), max |lse err| {:.3g} "
                     "({} over tolerance), {} non-finite outputs, {} of {} rows fully masked",
                     maxOutError, outViolations, maxLseError, lseViolations, nonFinite,
                     maskedRows, rows);
}

BlockMask buildDenseBlockMask(const CompiledMods &mods, const PagedcModContext *context,
                              int64_t batch, int64_t heads, int64_t qLength,
                              int64_t kvLength, int32_t qBlockSize, int32_t kvBlockSize) {
  BlockMask mask;
  mask.batch = batch;
  mask.heads = heads;
  mask.qLength = qLength;
  mask.kvLength = kvLength;
  mask.qBlockSize = qBlockSize;
  mask.kvBlockSize = kvBlockSize;
  mask.numQBlocks = (qLength + qBlockSize - 1) / qBlockSize;
  int64_t kvBlocks = (kvLength + kvBlockSize - 1) / kvBlockSize;
  mask.maxKvBlocks = std::max<int64_t>(kvBlocks, 1);
  int64_t rows = batch * heads * mask.numQBlocks;
  mask.kvNumBlocks.assign(rows, 0);
  mask.fullKvNumBlocks.assign(rows, 0);
  // Unused index entries hold garbage on purpose: kernels must not read them.
  mask.kvIndices.assign(rows * mask.maxKvBlocks, 999999);
  mask.fullKvIndices.assign(rows * mask.maxKvBlocks, -999999);
  PagedcModContext empty{nullptr, nullptr};
  const PagedcModContext &ctx = context ? *context : empty;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t qBlock = 0; qBlock < mask.numQBlocks; ++qBlock) {
        int64_t row = mask.rowIndex(b, h, qBlock);
        for (int64_t kvBlock = 0; kvBlock < kvBlocks; ++kvBlock) {
          int64_t kept = 0, total = 0;
          for (int64_t q = qBlock * qBlockSize; q < std::min(qLength, (qBlock + 1) * qBlockSize); ++q)
            for (int64_t kv = kvBlock * kvBlockSize;
                 kv < std::min(kvLength, (kvBlock + 1) * kvBlockSize); ++kv) {
              ++total;
              kept += !mods.hasMask() ||
                      mods.maskReference(ctx, static_cast<int32_t>(b), static_cast<int32_t>(h),
                                         static_cast<int32_t>(q), static_cast<int32_t>(kv));
            }
          if (kept == 0)
            continue;
          if (kept == total)
            mask.fullKvIndices[row * mask.maxKvBlocks + mask.fullKvNumBlocks[row]++] =
                static_cast<int32_t>(kvBlock);
          else
            mask.kvIndices[row * mask.maxKvBlocks + mask.kvNumBlocks[row]++] =
                static_cast<int32_t>(kvBlock);
        }
      }
  return mask;
}

namespace {

/// A random tensor of `dtype` (F32 or BF16) with values in [-range, range],
/// never exactly zero.
HostTensor randomTensor(DType dtype, std::vector<int64_t> shape, float range,
                        std::mt19937 &rng) {
  HostTensor tensor(dtype, std::move(shape));
  std::uniform_real_distribution<float> uniform(-range, range);
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    float value = uniform(rng);
    if (value == 0.0f)
      value = range * 0.5f;
    if (dtype == DType::BF16)
      tensor.dataAs<uint16_t>()[i] = floatToBF16(value);
    else if (dtype == DType::F16)
      tensor.dataAs<uint16_t>()[i] = floatToHalf(value);
    else
      tensor.dataAs<float>()[i] = value;
  }
  return tensor;
}

void storeNaN(const TensorView &view, int64_t offset) {
  if (view.dtype() == DType::F32)
    view.dataAs<float>()[offset] = std::numeric_limits<float>::quiet_NaN();
  else
    view.dataAs<uint16_t>()[offset] = view.dtype() == DType::BF16 ? 0x7fc0 : 0x7e00;
}

void fillNaN(HostTensor &tensor) {
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    if (tensor.dtype() == DType::BF16)
      tensor.dataAs<uint16_t>()[i] = 0x7fc0;
    else if (tensor.dtype() == DType::F16)
      tensor.dataAs<uint16_t>()[i] = 0x7e00;
    else
      tensor.dataAs<float>()[i] = std::numeric_limits<float>::quiet_NaN();
  }
}

/// Runs `args` (host tensors) through the runtime's CUDA backend on
/// `device`: q, the caches, the mod buffers and poisoned out / lse go to
/// device memory, the results come back into `args.out` / `args.lse`.
void runOnCuda(const cpu::PagedAttentionArgs &hostArgs, const CompiledMods &mods,
               const PagedcModContext *context, Device device) {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  auto upload = [&](const TensorView &view) {
    const size_t bytes = static_cast<size_t>(view.numel()) * dtypeSize(view.dtype());
    buffers.push_back(std::make_unique<DeviceBuffer>(bytes, device.index));
    buffers.back()->upload(view.data(), bytes);
    return TensorView(buffers.back()->data(), view.dtype(), view.shape(), view.strides(),
                      device);
  };
  cpu::PagedAttentionArgs args = hostArgs;
  args.q = upload(hostArgs.q);
  args.kCache = upload(hostArgs.kCache);
  args.vCache = upload(hostArgs.vCache);
  args.out = upload(hostArgs.out);
  if (hostArgs.lse.data())
    args.lse = upload(hostArgs.lse);
  if (hostArgs.sinks.data())
    args.sinks = upload(hostArgs.sinks);
  // Mod buffers live in device memory too.
  std::vector<PagedcBufferRef> deviceRefs;
  PagedcModContext deviceContext{nullptr, nullptr};
  if (context) {
    deviceContext = *context;
    for (size_t i = 0; i < mods.buffers.size(); ++i) {
      PagedcBufferRef ref = context->buffers[i];
      int64_t numel = 1;
      for (size_t d = 0; d < mods.buffers[i].dims.size(); ++d)
        numel *= ref.sizes[d];
      const size_t bytes =
          static_cast<size_t>(std::max<int64_t>(numel, 1)) * dtypeSize(mods.buffers[i].elementType);
      buffers.push_back(std::make_unique<DeviceBuffer>(bytes, device.index));
      buffers.back()->upload(ref.data, bytes);
      ref.data = buffers.back()->data();
      deviceRefs.push_back(ref);
    }
    deviceContext.buffers = deviceRefs.data();
    args.context = &deviceContext;
  }
  // The test binary's edge: the kernel options its environment asks for
  // (the $PAGEDC_* variables a ctest ENVIRONMENT or script sets).
  cuda::pagedAttention(args, device, nullptr, kernelOptionsFromEnvironment());
  buffers[3]->download(hostArgs.out.data(), buffers[3]->size());
  if (hostArgs.lse.data())
    buffers[4]->download(hostArgs.lse.data(), buffers[4]->size());
}

/// The public call's bindings for the values `context` points at: each
/// declared buffer viewed with the context's sizes and strides, each param
/// with its declared type.
Bindings bindingsOf(const CompiledMods &mods, const PagedcModContext *context) {
  Bindings bindings;
  if (!context)
    return bindings;
  for (size_t i = 0; i < mods.buffers.size(); ++i) {
    const PagedcBufferRef &ref = context->buffers[i];
    const size_t rank = mods.buffers[i].dims.size();
    bindings.buffers[mods.buffers[i].name] =
        TensorView(const_cast<void *>(ref.data), mods.buffers[i].elementType,
                   std::vector<int64_t>(ref.sizes, ref.sizes + rank),
                   std::vector<int64_t>(ref.strides, ref.strides + rank), Device::cpu());
  }
  for (size_t i = 0; i < mods.params.size(); ++i) {
    const PagedcParamSlot &slot = context->params[i];
    switch (mods.params[i].type) {
    case ScalarKind::I32:
      bindings.params[mods.params[i].name] = ParamValue::ofI32(slot.i32);
      break;
    case ScalarKind::F32:
      bindings.params[mods.params[i].name] = ParamValue::ofF32(slot.f32);
      break;
    case ScalarKind::Bool:
      bindings.params[mods.params[i].name] = ParamValue::ofBool(slot.i32 != 0);
      break;
    }
  }
  return bindings;
}

/// Runs the public dense-K/V call on `args`' q, outputs, lengths and
/// offsets with k and v read in place.
void runDense(const cpu::PagedAttentionArgs &args, const TensorView &k, const TensorView &v,
              const std::vector<int32_t> &kvLengths, const CompiledMods &mods,
              const PagedcModContext *context) {
  AttentionOptions options;
  // Equal lengths of S: leave kvLength to its default (all of k).
  if (std::any_of(kvLengths.begin(), kvLengths.end(),
                  [&](int32_t length) { return length != k.size(2); }))
    options.kvLength = kvLengths;
  options.qOffset.assign(args.qOffset, args.qOffset + k.size(0));
  options.scale = args.scale;
  options.out = args.out;
  options.lse = args.lse;
  options.sinks = args.sinks;
  options.threads = args.threads;
  flexAttention(args.q, k, v, args.blockMask, mods, bindingsOf(mods, context), options);
}

} // namespace

AttentionCheckResult checkPagedAttention(const CompiledMods &mods,
                                         const PagedcModContext *context,
                                         const AttentionConfig &config) {
  const AttentionConfig &c = config;
  if (c.kvHeads <= 0 || c.qHeads % c.kvHeads != 0)
    throw Error("checkPagedAttention: qHeads must be a multiple of kvHeads");
  std::vector<int32_t> kvLengths = c.kvLengths;
  if (kvLengths.empty())
    kvLengths.assign(c.batch, static_cast<int32_t>(c.qLength));
  std::vector<int32_t> qOffsets = c.qOffsets;
  if (qOffsets.empty()) {
    qOffsets.assign(c.batch, 0);
    if (c.qOffsetAtEnd)
      for (int64_t b = 0; b < c.batch; ++b)
        qOffsets[b] = std::max<int32_t>(0, kvLengths[b] - static_cast<int32_t>(c.qLength));
  }
  int64_t kvCapacity = *std::max_element(kvLengths.begin(), kvLengths.end());
  kvCapacity = std::max<int64_t>(kvCapacity, 1);

  std::mt19937 rng(static_cast<uint32_t>(c.seed * 7919 + 17));
  // q: either compact [B, Hq, Lq, D] or stored [B, Lq, Hq, D] and viewed
  // through strides.
  std::vector<int64_t> qStorageShape = c.transposedQueryLayout
                                           ? std::vector<int64_t>{c.batch, c.qLength, c.qHeads, c.dim}
                                           : std::vector<int64_t>{c.batch, c.qHeads, c.qLength, c.dim};
  HostTensor q = randomTensor(c.storage, qStorageShape, c.range, rng);
  if (c.denseKV && c.kvFloat8)
    throw Error("checkPagedAttention: denseKV and kvFloat8 do not combine");
  const DType kvValues = c.kvFloat8 ? DType::F32 : c.storage;
  HostTensor k = randomTensor(kvValues, {c.batch, c.kvHeads, kvCapacity, c.dim}, c.range, rng);
  HostTensor v = randomTensor(kvValues, {c.batch, c.kvHeads, kvCapacity, c.vDim}, c.range, rng);
  // Dense keys stored [B, S, Hkv, D]: the same random values, and views
  // [B, Hkv, S, D] of them through strides.
  HostTensor kStored, vStored;
  TensorView kView = k.view(), vView = v.view();
  if (c.denseKV && c.transposedKVLayout) {
    auto transposed = [&](HostTensor &stored, int64_t inner) {
      stored = randomTensor(c.storage, {c.batch, kvCapacity, c.kvHeads, inner}, c.range, rng);
      return TensorView(stored.data(), stored.dtype(), {c.batch, c.kvHeads, kvCapacity, inner},
                        {kvCapacity * c.kvHeads * inner, inner, c.kvHeads * inner, 1},
                        Device::cpu());
    };
    kView = transposed(kStored, c.dim);
    vView = transposed(vStored, c.vDim);
  }
  if (c.denseKV) {
    // Keys past a sequence's length are NaN: reading one shows up.
    for (const TensorView &view : {kView, vView})
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.kvHeads; ++h)
          for (int64_t j = kvLengths[b]; j < kvCapacity; ++j)
            for (int64_t d = 0; d < view.size(3); ++d)
              storeNaN(view, b * view.stride(0) + h * view.stride(1) + j * view.stride(2) +
                                 d * view.stride(3));
  }
  // An 8-bit cache: k and v become the codes' values (exact in f32, what
  // the cache stores) and kDequantized / vDequantized code x scale (the
  // reference's). Scales differ per KV head and put the values' codes well
  // inside both formats' normal range.
  std::vector<float> kScale, vScale;
  HostTensor kDequantized, vDequantized;
  if (c.kvFloat8) {
    if (!isFloat8(*c.kvFloat8))
      throw Error("checkPagedAttention: kvFloat8 must be f8e4m3 or f8e5m2");
    for (int64_t h = 0; h < c.kvHeads; ++h) {
      kScale.push_back(c.range / 100.0f * (1.0f + 0.5f * static_cast<float>(h)));
      vScale.push_back(c.range / 60.0f * (1.0f + 0.25f * static_cast<float>(h)));
    }
    auto quantize = [&](HostTensor &values, const std::vector<float> &scales) {
      HostTensor dequantized(DType::F64, values.shape());
      const int64_t perHead = values.shape()[2] * values.shape()[3];
      for (int64_t i = 0; i < values.numel(); ++i) {
        const float scale = scales[(i / perHead) % c.kvHeads];
        const float code = float8ToFloat(
            floatToFloat8(values.dataAs<float>()[i] / scale, *c.kvFloat8), *c.kvFloat8);
        values.dataAs<float>()[i] = code;
        dequantized.dataAs<double>()[i] = static_cast<double>(code) * scale;
      }
      return dequantized;
    };
    kDequantized = quantize(k, kScale);
    vDequantized = quantize(v, vScale);
  }
  auto logicalView = [&](HostTensor &tensor, int64_t inner) {
    if (!c.transposedQueryLayout)
      return tensor.view();
    return TensorView(tensor.data(), tensor.dtype(), {c.batch, c.qHeads, c.qLength, inner},
                      {c.qLength * c.qHeads * inner, inner, c.qHeads * inner, 1}, Device::cpu());
  };
  TensorView qView = logicalView(q, c.dim);

  cpu::PagedCache cache;
  if (!c.denseKV)
    cache = cpu::buildPagedCache(k.view(), v.view(), kvLengths.data(), c.pageSize, kvValues,
                                 c.seed);
  if (c.kvFloat8)
    for (HostTensor *tensor : {&cache.kCache, &cache.vCache}) {
      // The codes of the values (unused slots' NaN: the NaN code).
      HostTensor codes(*c.kvFloat8, tensor->shape());
      for (int64_t i = 0; i < tensor->numel(); ++i)
        codes.dataAs<uint8_t>()[i] = floatToFloat8(tensor->dataAs<float>()[i], *c.kvFloat8);
      *tensor = std::move(codes);
    }

  BlockMask blockMask;
  if (c.withBlockMask) {
    int64_t maskQLength = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      maskQLength = std::max<int64_t>(maskQLength, qOffsets[b] + c.qLength);
    blockMask = buildDenseBlockMask(mods, context, c.broadcastMaskBatch ? 1 : c.batch,
                                    c.broadcastMaskHeads ? 1 : c.qHeads, maskQLength,
                                    kvCapacity, c.qBlockSize, c.kvBlockSize);
  }

  const bool onCuda = c.device.kind == DeviceKind::CUDA;
  const DType outType = onCuda ? c.storage : c.outType;
  HostTensor out(outType, c.transposedQueryLayout
                                ? std::vector<int64_t>{c.batch, c.qLength, c.qHeads, c.vDim}
                                : std::vector<int64_t>{c.batch, c.qHeads, c.qLength, c.vDim});
  HostTensor lse(DType::F32, {c.batch, c.qHeads, c.qLength});
  fillNaN(out);
  fillNaN(lse);
  float scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.dim));

  cpu::PagedAttentionArgs args;
  args.q = qView;
  args.kCache = cache.kCache.view();
  args.vCache = cache.vCache.view();
  if (c.kvFloat8) {
    args.kScale = kScale.data();
    args.vScale = vScale.data();
  }
  args.pageTable = cache.pageTable.data();
  args.pageTableStride = cache.pageTableStride;
  args.pageSize = cache.pageSize;
  args.kvLength = kvLengths.data();
  args.qOffset = qOffsets.data();
  args.blockMask = c.withBlockMask ? &blockMask : nullptr;
  args.mods = &mods;
  args.context = context;
  args.scale = scale;
  args.out = logicalView(out, c.vDim);
  if (c.withLse)
    args.lse = lse.view();
  if (!c.sinks.empty()) {
    if (static_cast<int64_t>(c.sinks.size()) != c.qHeads)
      throw Error("checkPagedAttention: sinks must hold one value per query head");
    args.sinks = TensorView(const_cast<float *>(c.sinks.data()), DType::F32, {c.qHeads});
  }
  args.threads = c.threads;
  args.variant = c.variant;
  if (c.denseKV)
    runDense(args, kView, vView, kvLengths, mods, context);
  else if (onCuda)
    runOnCuda(args, mods, context, c.device);
  else
    cpu::pagedAttention(args);

  cpu::ReferenceArgs referenceArgs;
  referenceArgs.q = qView;
  referenceArgs.k = c.kvFloat8 ? kDequantized.view() : kView;
  referenceArgs.v = c.kvFloat8 ? vDequantized.view() : vView;
  referenceArgs.kvLength = kvLengths.data();
  referenceArgs.qOffset = qOffsets.data();
  referenceArgs.mods = &mods;
  referenceArgs.context = context;
  referenceArgs.scale = scale;
  referenceArgs.sinks = c.sinks.empty() ? nullptr : c.sinks.data();
  cpu::ReferenceResult reference = cpu::referenceAttention(referenceArgs);

  AttentionCheckResult result;
  TensorView outView = logicalView(out, c.vDim);
  bool bf16Out = outType == DType::BF16;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.qHeads; ++h)
      for (int64_t i = 0; i < c.qLength; ++i) {
        ++result.rows;
        double expectedLse = reference.lseAt(b, h, i);
        // Every key masked: lse -inf, or exactly the sink.
        bool masked = std::isinf(expectedLse) ||
                      (!c.sinks.empty() && expectedLse == static_cast<double>(c.sinks[h]));
        result.maskedRows += masked;
        for (int64_t d = 0; d < c.vDim; ++d) {
          double expected = reference.outAt(b, h, i, d);
          double actual = cpu::readAsDouble(
              outView, b * outView.stride(0) + h * outView.stride(1) + i * outView.stride(2) +
                           d * outView.stride(3));
          if (!std::isfinite(actual)) {
            ++result.nonFinite;
            continue;
          }
          double error = std::abs(actual - expected);
          // bf16 output rounds to 8 significant bits: half an ulp is at most
          // 2^-8 of the value. The CUDA kernels also round the probabilities
          // to the element type for P.V (relative 2^-8 of the weighted sum,
          // at most the inputs' range) and use ex2.approx.
          double tolerance = onCuda ? 1e-2 * c.range + std::ldexp(std::abs(expected), -7)
                                    : 1e-4 + (bf16Out ? std::ldexp(std::abs(expected), -8) : 0.0);
          result.maxOutError = std::max(result.maxOutError, error);
          result.outViolations += error > tolerance;
        }
        if (!c.withLse)
          continue;
        double actualLse = lse.dataAs<float>()[(b * c.qHeads + h) * c.qLength + i];
        if (std::isnan(actualLse)) {
          ++result.nonFinite;
        } else if (std::isinf(expectedLse) || std::isinf(actualLse)) {
          result.lseViolations +=
              !(std::isinf(expectedLse) && actualLse < 0 && std::isinf(actualLse));
        } else {
          double error = std::abs(actualLse - expectedLse);
          result.maxLseError = std::max(result.maxLseError, error);
          result.lseViolations +=
              error > (onCuda ? 1e-2 : 1e-4) * std::max(1.0, std::abs(expectedLse));
        }
      }
  return result;
}

} // namespace pagedc::testutil
