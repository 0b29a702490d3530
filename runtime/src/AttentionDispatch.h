//===- AttentionDispatch.h - Device backends of flexAttention --*- C++ -*-===//
//
// flexAttention() validates a call and describes it as a
// cpu::PagedAttentionArgs (device-neutral: tensors on the call's device,
// host-side page table, lengths and offsets). The CPU backend runs it
// directly; other devices run through a backend registered here, which is
// the seam the CUDA backend plugs into.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_ATTENTIONDISPATCH_H
#define PAGEDC_RUNTIME_ATTENTIONDISPATCH_H

#include "cpu/CpuAttention.h"

#include "pagedc/KernelOptions.h"

#include <functional>

namespace pagedc::detail {

/// Runs one validated call on `device` and `stream` (options.stream: a
/// CUstream for CUDA, null = the default stream) with the call's kernel
/// options (options.kernel). `args.pageTable`,
/// `args.kvLength` and `args.qOffset` point to host memory valid for the
/// duration of the call; every tensor is on `device`; `args.threads` is
/// meaningless there.
using DeviceAttentionFn =
    std::function<void(const cpu::PagedAttentionArgs &args, Device device, void *stream,
                       const KernelOptions &kernel)>;

/// Registers the backend for a device kind other than the CPU (replacing
/// any earlier one). Without one, CUDA calls run on the built-in backend
/// (cuda/CudaAttention.h) and calls on other kinds throw
/// "<KIND> execution is not available in this build".
void setAttentionBackend(DeviceKind kind, DeviceAttentionFn backend);

} // namespace pagedc::detail

#endif // PAGEDC_RUNTIME_ATTENTIONDISPATCH_H
