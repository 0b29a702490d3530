//===- DeviceStep.h - A batch step's tensors on the device -------*- C++ -*-===//
//
// Shared by the CUDA tests that run BatchAttention steps (cpu/BatchStep.h)
// on the device: q, the cache's K and V in one allocation as an engine
// holds them, out and lse poisoned with NaN, the mods' buffers.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_UNIT_CUDA_DEVICESTEP_H
#define PAGEDC_TEST_UNIT_CUDA_DEVICESTEP_H

#include "BatchStep.h"

#include "pagedc/CudaAttention.h"

#include <gtest/gtest.h>

#include <utility>

namespace pagedc::test {

/// Tensors of a step on the device, the cache's K and V in one allocation
/// as the engine holds them.
struct DeviceStep {
  DeviceBuffer q, cache, out, lse, doc, slopes;
  TensorView qView, kView, vView, outView, lseView;
  Bindings bindings;
  const void *kernelK = nullptr, *kernelV = nullptr; // what the kernel must read

  static size_t bytesOf(const HostTensor &t) {
    return static_cast<size_t>(t.numel()) * dtypeSize(t.dtype());
  }

  explicit DeviceStep(testutil::BatchStep &step) {
    const Device device = Device::cuda(0);
    const testutil::BatchStepCase &c = step.c;
    q = DeviceBuffer(bytesOf(step.q), 0);
    q.upload(step.q.data(), bytesOf(step.q));
    qView = TensorView(q.data(), c.storage, step.q.shape(), step.q.view().strides(), device);
    // K then V (the vLLM layout's one tensor holds both already).
    const size_t kBytes = bytesOf(step.cache->k);
    const size_t vBytes = c.layout == KVLayout::VLLM ? 0 : bytesOf(step.cache->v);
    cache = DeviceBuffer(kBytes + vBytes, 0);
    cache.upload(step.cache->k.data(), kBytes);
    if (vBytes)
      cache.upload(step.cache->v.data(), vBytes, kBytes);
    auto *base = static_cast<char *>(cache.data());
    kView =
        TensorView(base, c.storage, step.cache->k.shape(), step.cache->k.view().strides(), device);
    kernelK = base;
    if (c.layout == KVLayout::VLLM) {
      kernelV = base + kBytes / 2;
    } else {
      vView = TensorView(base + kBytes, c.storage, step.cache->v.shape(),
                         step.cache->v.view().strides(), device);
      kernelV = base + kBytes;
    }
    const int64_t rows = step.q.shape()[0];
    out = DeviceBuffer(static_cast<size_t>(rows * c.qHeads * c.vDim) * dtypeSize(c.storage), 0);
    out.fill(0xff); // NaN
    outView = TensorView(out.data(), c.storage, {rows, c.qHeads, c.vDim}, device);
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
  }

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
    const size_t vBytes = step.c.layout == KVLayout::VLLM ? 0 : bytesOf(step.cache->v);
    ASSERT_EQ(bytesOf(step.q), q.size());
    ASSERT_EQ(kBytes + vBytes, cache.size());
    ASSERT_EQ(step.bindings->documents.size() * 4, doc.size());
    q.upload(step.q.data(), bytesOf(step.q));
    cache.upload(step.cache->k.data(), kBytes);
    if (vBytes)
      cache.upload(step.cache->v.data(), vBytes, kBytes);
    doc.upload(step.bindings->documents.data(), doc.size());
    slopes.upload(step.bindings->slopes.data(), slopes.size());
    out.fill(0xff);
    lse.fill(0xff);
  }
};

} // namespace pagedc::test

#endif // PAGEDC_TEST_UNIT_CUDA_DEVICESTEP_H
