//===- CudaMergeState.h - mergeState on CUDA devices ------------*- C++ -*-===//
//
// The launch of templates/MergeState.cuh, which mergeState(),
// mergeStateInPlace() and mergeStates() use for device tensors. The unit
// holds no mod code, so it is compiled once per device and process (kernel
// cache: memory, disk, then NVRTC or the emulator build).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CUDA_CUDAMERGESTATE_H
#define PAGEDC_CUDA_CUDAMERGESTATE_H

#include "pagedc/KernelArgs.h"

namespace pagedc::detail {

/// Enqueues one merge of `args` (checked by the caller: shapes, types,
/// device memory of device `deviceIndex`) on `stream` (a CUstream; null:
/// the legacy default stream, and the call waits for the merge to end).
/// Throws pagedc::Error when the kernel cannot be built or launched.
void cudaMergeStates(const PagedcMergeStateArgs &args, int deviceIndex, void *stream);

} // namespace pagedc::detail

#endif // PAGEDC_CUDA_CUDAMERGESTATE_H
