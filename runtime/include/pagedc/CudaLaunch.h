//===- CudaLaunch.h - Grid, shared memory and arguments of launches -*- C++ -*-===//
//
// Planning a launch needs no GPU: planAttention() checks the call against
// the kernel's configuration, picks the grid (and the decode split count),
// and packs the argument blocks exactly as cuLaunchKernel takes them. The
// plan is then launched with launchPlan() on a machine with a driver; tests
// without one stop after planning (the "dry run").
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CUDALAUNCH_H
#define PAGEDC_CUDALAUNCH_H

#include "pagedc/CudaDriver.h"
#include "pagedc/KernelArgs.h"
#include "pagedc/KernelSource.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pagedc {

/// One kernel launch, fully described.
struct KernelLaunch {
  std::string kernel;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned sharedMemoryBytes = 0;
  /// Kernel parameters in order, each as the bytes of its value.
  std::vector<std::vector<unsigned char>> arguments;
  /// cuLaunchKernel's kernelParams: pointers into `arguments`, valid while
  /// this object is alive and unchanged.
  std::vector<void *> parameterPointers();
};

/// The launches of one attention call.
struct AttentionLaunchPlan {
  /// Prefill: one launch. Decode: the split kernel, then the merge kernel
  /// when there is more than one split.
  std::vector<KernelLaunch> launches;
  PagedcAttentionKernelArgs args{};
  int headDim = 0;
  /// f32 workspace the decode splits need (0 for prefill or one split):
  /// partial_out [B, Hq, Lq, splits, D] then partial_lse [B, Hq, Lq, splits].
  size_t workspaceBytes = 0;
  /// Points the decode partials at a workspace of workspaceBytes at `base`
  /// and repacks the launch arguments.
  void setWorkspace(cu::DevicePointer base);
};

/// Checks `args` (device pointers, strides, sizes; partial_* and
/// num_splits/split_size are filled here) against `config`, chooses the
/// decode split count for `multiprocessors` SMs and the longest sequence
/// `maxKvLength`, and packs `params` (pagedc_mods::Params bytes, see
/// ParamsLayout). Throws pagedc::Error naming the first mismatch.
AttentionLaunchPlan planAttention(const KernelConfig &config,
                                  const PagedcAttentionKernelArgs &args,
                                  const std::vector<unsigned char> &params,
                                  int maxKvLength, int multiprocessors);

/// The block-mask builder's launch: grid (num_q_blocks, heads, batch).
KernelLaunch planBlockMaskBuild(const PagedcBlockMaskKernelArgs &args,
                                const std::vector<unsigned char> &params);

/// Launches `launch` on `stream` (`function` from the kernel's module).
void launchKernel(const CudaDriver &driver, cu::Function function,
                  KernelLaunch &launch, cu::Stream stream);

} // namespace pagedc

#endif // PAGEDC_CUDALAUNCH_H
