//===- DeviceStep.h - A batch step's tensors on the device -------*- C++ -*-===//
//
// Shared by the CUDA tests that run BatchAttention steps (cpu/BatchStep.h)
// on the device: q, the cache's K and V in one allocation as an engine
// holds them (8-bit caches as their codes, with their scales; MLA's values
// as a view of K), out and lse poisoned with NaN, the mods' buffers, the
// case's sinks and scale.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CUDA_DEVICESTEP_H
#define PAGEDC_TEST_UNIT_CUDA_DEVICESTEP_H

#include "BatchStep.h"

#include "pagedc/BatchAttention.h"
#include "pagedc/CudaAttention.h"

#include <gtest/gtest.h>

#include <optional>
#include <utility>
#include <vector>

namespace pagedc::test {

/// Tensors of a step on the device, the cache's K and V in one allocation
/// as the engine holds them (an 8-bit cache as its codes, u8 with
/// kv_dtype when the case says so, and its scales).
struct DeviceStep {
  DeviceBuffer q, cache, out, lse, doc, slopes, prefix;
  std::optional<float> scale; // the case's, when it gives one
  DeviceBuffer sinks;         // the step's sinks (c.sinks), on the device
  TensorView sinksView;
  TensorView qView, kView, vView, outView, lseView;
  Bindings bindings;
  const void *kernelK = nullptr, *kernelV = nullptr; // what the kernel must read
  std::vector<float> kScale, vScale;
  std::optional<DType> kvDtype;

  static size_t bytesOf(const HostTensor &t) {
    return static_cast<size_t>(t.numel()) * dtypeSize(t.dtype());
  }

  /// `outType`: out's element type (default: q's).
  explicit DeviceStep(testutil::BatchStep &step, std::optional<DType> outType = std::nullopt) {
    const Device device = Device::cuda(0);
    const testutil::BatchStepCase &c = step.c;
    const DType outElement = outType.value_or(c.storage);
    const DType cacheType = c.kvFloat8 ? (c.asU8 ? DType::U8 : *c.kvFloat8) : c.storage;
    kScale = step.kScale;
    vScale = step.vScale;
    if (c.kvFloat8 && !c.perHeadScale) {
      kScale.resize(1);
      vScale.resize(1);
    }
    if (c.asU8)
      kvDtype = c.kvFloat8;
    if (c.scale > 0.0f)
      scale = c.scale;
    if (!step.sinks.empty()) {
      sinks = DeviceBuffer(step.sinks.size() * 4, 0);
      sinks.upload(step.sinks.data(), step.sinks.size() * 4);
      sinksView = TensorView(sinks.data(), DType::F32, {c.qHeads}, device);
    }
    q = DeviceBuffer(bytesOf(step.q), 0);
    q.upload(step.q.data(), bytesOf(step.q));
    qView = TensorView(q.data(), c.storage, step.q.shape(), step.q.view().strides(), device);
    // K then V (the vLLM layout's one tensor holds both already).
    const size_t kBytes = bytesOf(step.cache->k);
    const size_t vBytes =
        c.layout == KVLayout::VLLM || c.valuesInKeys ? 0 : bytesOf(step.cache->v);
    cache = DeviceBuffer(kBytes + vBytes, 0);
    cache.upload(step.cache->k.data(), kBytes);
    if (vBytes)
      cache.upload(step.cache->v.data(), vBytes, kBytes);
    auto *base = static_cast<char *>(cache.data());
    kView =
        TensorView(base, cacheType, step.cache->k.shape(), step.cache->k.view().strides(), device);
    kernelK = base;
    if (c.layout == KVLayout::VLLM) {
      kernelV = base + kBytes / 2;
    } else if (c.valuesInKeys) {
      // MLA: V is a view of K's memory, its first vDim columns.
      std::vector<int64_t> vShape = step.cache->k.shape();
      vShape.back() = c.vDim;
      vView = TensorView(base, cacheType, vShape, step.cache->k.view().strides(), device);
      kernelV = base;
    } else {
      vView = TensorView(base + kBytes, cacheType, step.cache->v.shape(),
                         step.cache->v.view().strides(), device);
      kernelV = base + kBytes;
    }
    const int64_t rows = step.q.shape()[0];
    out = DeviceBuffer(static_cast<size_t>(rows * c.qHeads * c.vDim) * dtypeSize(outElement), 0);
    out.fill(0xff); // NaN
    outView = TensorView(out.data(), outElement, {rows, c.qHeads, c.vDim}, device);
    lse = DeviceBuffer(static_cast<size_t>(rows * c.qHeads) * 4, 0);
    lse.fill(0xff);
    lseView = TensorView(lse.data(), DType::F32, {rows, c.qHeads}, device);
    // The per-sequence document ids and the slopes, on the device.
    const std::vector<int32_t> &documents = step.bindings->documents;
    doc = DeviceBuffer(documents.size() * 4, 0);
    doc.upload(documents.data(), documents.size() * 4);
    const std::vector<float> &slopeValues = step.bindings->slopes;
    slopes = DeviceBuffer(slopeValues.size() * 4, 0);
    slopes.upload(slopeValues.data(), slopeValues.size() * 4);
    bindings = step.bindings->bindings;
    bindings.buffers["doc"] = TensorView(doc.data(), DType::I32, {step.batch, step.maxKv}, device);
    bindings.buffers["slopes"] = TensorView(slopes.data(), DType::F32, {c.qHeads}, device);
    // The prefix_lm mask's per-sequence prefix ends.
    if (bindings.buffers.count("prefix")) {
      const std::vector<int32_t> &ends = step.bindings->prefix;
      prefix = DeviceBuffer(ends.size() * 4, 0);
      prefix.upload(ends.data(), ends.size() * 4);
      bindings.buffers["prefix"] = TensorView(prefix.data(), DType::I32, {step.batch}, device);
    }
  }

  /// run()'s options: out and lse into `out` and `lse`, the cache's scales.
  BatchRunOptions options(const TensorView &outInto, const TensorView &lseInto) const {
    BatchRunOptions options;
    options.out = outInto;
    options.lse = lseInto;
    options.kScale = kScale;
    options.vScale = vScale;
    options.kvDtype = kvDtype;
    options.scale = scale;
    options.sinks = sinksView;
    return options;
  }
  BatchRunOptions options() const { return options(outView, lseView); }

  /// out and lse, downloaded.
  std::pair<HostTensor, HostTensor> results() const {
    HostTensor hostOut(outView.dtype(), outView.shape());
    out.download(hostOut.data(), out.size());
    HostTensor hostLse(DType::F32, lseView.shape());
    lse.download(hostLse.data(), lse.size());
    return {std::move(hostOut), std::move(hostLse)};
  }

  /// Another step's inputs into this step's buffers (same sizes: a step of
  /// the same sequences in another order), out and lse back to NaN: what an
  /// engine does before it replays a captured step.
  void reload(const testutil::BatchStep &step) {
    const size_t kBytes = bytesOf(step.cache->k);
    const size_t vBytes = step.c.layout == KVLayout::VLLM || step.c.valuesInKeys
                              ? 0
                              : bytesOf(step.cache->v);
    ASSERT_EQ(bytesOf(step.q), q.size());
    ASSERT_EQ(kBytes + vBytes, cache.size());
    ASSERT_EQ(step.bindings->documents.size() * 4, doc.size());
    q.upload(step.q.data(), bytesOf(step.q));
    cache.upload(step.cache->k.data(), kBytes);
    if (vBytes)
      cache.upload(step.cache->v.data(), vBytes, kBytes);
    doc.upload(step.bindings->documents.data(), doc.size());
    slopes.upload(step.bindings->slopes.data(), slopes.size());
    if (prefix.size()) {
      ASSERT_EQ(step.bindings->prefix.size() * 4, prefix.size());
      prefix.upload(step.bindings->prefix.data(), prefix.size());
    }
    out.fill(0xff);
    lse.fill(0xff);
  }
};

} // namespace pagedc::test

#endif // PAGEDC_TEST_UNIT_CUDA_DEVICESTEP_H
