//===- CudaAttention.h - The CUDA backend of flexAttention -----*- C++ -*-===//
//
// Internal: the function flexAttention() dispatches CUDA calls to, and the
// memory factory PagedKVCache uses for cuda:N caches. The public API is
// pagedc/CudaAttention.h.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CUDA_CUDAATTENTION_H
#define PAGEDC_RUNTIME_CUDA_CUDAATTENTION_H

#include "cpu/CpuAttention.h"

#include "pagedc/KVCache.h"
#include "pagedc/KernelOptions.h"
#include "pagedc/Tensor.h"

#include <memory>

namespace pagedc::cuda {

/// Runs one validated call (flexAttention's checks done; every tensor on
/// `device`; page table, lengths and offsets in host memory) on `stream`
/// (a CUstream, null = the legacy default stream) with the kernel choices
/// of `kernel` (AttentionOptions::kernel) and waits for it. Throws
/// pagedc::Error naming the problem (no driver, no kernel for the mods, a
/// stride the kernels cannot take, kernel options checkKernelOptions
/// refuses) before anything is launched.
void pagedAttention(const cpu::PagedAttentionArgs &args, Device device, void *stream,
                    const KernelOptions &kernel);

/// The KV memory of `device` (a CUDA device); throws pagedc::Error with the
/// driver's reason when there is none.
std::shared_ptr<KVMemory> kvMemory(Device device);

} // namespace pagedc::cuda

#endif // PAGEDC_RUNTIME_CUDA_CUDAATTENTION_H
