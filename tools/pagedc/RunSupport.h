//===- RunSupport.h - Helpers of `pagedc run` and `pagedc demo` -*- C++ -*-===//
#ifndef PAGEDC_TOOLS_RUNSUPPORT_H
#define PAGEDC_TOOLS_RUNSUPPORT_H

#include "pagedc/CudaAttention.h"
#include "pagedc/KVCache.h"
#include "pagedc/Mods.h"
#include "pagedc/Npy.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pagedc::driver {

/// "[2, 8, 128, 64]"
std::string shapeToString(const std::vector<int64_t> &shape);

/// A copy of `tensor` as f32 (f32 tensors are moved through unchanged).
HostTensor toF32(HostTensor tensor);

/// " (they read: a, b)" or " (they read none)", for error messages.
std::string declaredList(const std::vector<BufferDecl> &decls);
std::string declaredList(const std::vector<ParamDecl> &decls);

/// The page size that stores a sequence of `length` tokens in one page:
/// the next power of two, at most 1024.
int64_t contiguousPageSize(int64_t length);

/// Reserves `tokens` more positions for `slot`, one page at a time, in an
/// order drawn from `random` together with the other growing slots: see
/// buildCache(). Used by the demo's decode loop as well.
class PageShuffler {
public:
  /// `scratchSlot` is a slot of `cache` no sequence uses.
  PageShuffler(PagedKVCache &cache, int64_t scratchSlot, uint64_t seed);
  /// Grows every slot `s` to `lengths[s]` tokens (slots in `slots`),
  /// interleaving their pages at random with pages that the scratch slot
  /// takes and gives back, so that physical pages end up scattered and out
  /// of order in every page table.
  void reserve(const std::vector<int64_t> &slots,
               const std::vector<int64_t> &lengths);

private:
  uint64_t next(uint64_t bound);
  PagedKVCache &cache_;
  int64_t scratch_;
  uint64_t state_;
};

/// Makes CUDA execution use the SIMT emulator (--device emu): call before
/// anything touches the CUDA driver.
void selectEmulatorDriver();

/// Whether attention can run on CUDA at all: this build generates CUDA mod
/// code, the driver loads and reports a device. Sets `reason` when not.
bool cudaExecutionUsable(std::string &reason);

/// A compact copy of a host tensor in the memory of a CUDA device.
struct DeviceTensor {
  DeviceBuffer buffer;
  TensorView view;
};
DeviceTensor uploadTensor(const HostTensor &tensor, int device);

/// A copy of the f32 `tensor` in `dtype` (f32, f16 or bf16).
HostTensor fromF32(const HostTensor &tensor, DType dtype);

/// K or V rows for buildCache(): a [B, H, L, D] f32, f16 or bf16 array in
/// memory or in a .npy file (read piece by piece, never as a whole).
class KVRows {
public:
  explicit KVRows(const HostTensor &tensor);
  explicit KVRows(const NpyFile &file);
  const std::vector<int64_t> &shape() const { return shape_; }
  /// Tokens [t0, t0 + n) of head h of sequence b, converted to `target`
  /// (f32, f16 or bf16), to `out` (n * D elements).
  void read(int64_t b, int64_t h, int64_t t0, int64_t n, DType target, void *out) const;
  /// The dtype the rows are stored in.
  DType dtype() const { return dtype_; }

private:
  const HostTensor *tensor_ = nullptr;
  const NpyFile *file_ = nullptr;
  DType dtype_;
  std::vector<int64_t> shape_;
  mutable std::vector<uint8_t> scratch_;
};

/// A new PagedKVCache of `dtype` on `device` holding K and V (sequence b has
/// lengths[b] tokens) in slots 0..B-1, written with reserve + assign a
/// bounded number of tokens at a time (converted to `dtype` and, on a CUDA
/// device, uploaded piece by piece), so that the only full copy of K/V is
/// the cache's. With `shuffleSeed`, pages are reserved through a
/// PageShuffler (and the cache has spare pages and one scratch slot);
/// without, in slot order: each sequence's whole length at once, which the
/// allocator serves with consecutive pages in descending order, or, with
/// `pagesPerReserve` N > 0, N pages at a time: runs of N consecutive pages in
/// descending order, each run above the one before (N = 1: consecutive
/// pages in ascending order).
std::unique_ptr<PagedKVCache>
buildCache(const KVRows &k, const KVRows &v,
           const std::vector<int64_t> &lengths, int64_t pageSize,
           std::optional<uint64_t> shuffleSeed, DType dtype = DType::F32,
           Device device = Device::cpu(), int64_t pagesPerReserve = 0);

/// Writes every (path, bytes) through pagedc::files::writeAll (the
/// runtime's OutputFiles.h): temporary files next to their targets renamed
/// into place together, devices and FIFOs written in place, symlinks written
/// through; on any failure removes the temporaries and throws pagedc::Error
/// naming the file.
void writeFilesAtomically(
    const std::vector<std::pair<std::string, std::vector<uint8_t>>> &files);

} // namespace pagedc::driver

#endif // PAGEDC_TOOLS_RUNSUPPORT_H
