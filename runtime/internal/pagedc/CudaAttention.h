//===- CudaAttention.h - Paged flex attention on CUDA devices --*- C++ -*-===//
//
// The CUDA execution path of the runtime, with no LLVM and no CUDA headers:
// the driver is loaded at run time (CudaDriver.h), kernels come either from
// a kernel bundle (cubins + manifest, no compiler needed) or from the kernel
// cache (NVRTC on the generated mod code the compiler puts into
// CompiledMods::cuda). On a machine without a driver every entry point
// throws pagedc::Error with the driver's reason ("no NVIDIA driver: ...").
//
// Two levels:
//  * flexAttention() (Attention.h) on CUDA tensors runs through the backend
//    here: it uploads the call's page table, lengths and block mask, picks
//    and loads the kernel, launches on options.stream and waits for it.
//  * CudaAttentionLaunch plans a call once on device-resident arguments and
//    enqueues it any number of times (benchmarks, fixed-shape decode loops).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CUDAATTENTION_H
#define PAGEDC_CUDAATTENTION_H

#include "pagedc/BlockMask.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/CudaLaunch.h"
#include "pagedc/KVCache.h"
#include "pagedc/KernelBundle.h"
#include "pagedc/Mods.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pagedc {

//===----------------------------------------------------------------------===//
// Devices and memory
//===----------------------------------------------------------------------===//

/// Makes the primary context of CUDA device `index` current on the calling
/// thread (retained once per process) and returns the driver. Throws
/// pagedc::Error with the reason when there is no driver or no such device.
const CudaDriver &cudaUseDevice(int index);

/// The description of device `index` (queried once per process).
const CudaDeviceInfo &cudaDeviceInfo(int index);

/// Device memory from cuMemAlloc on the current context, freed on
/// destruction. Move-only.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  /// Allocates `bytes` (at least 1) on device `deviceIndex`; throws
  /// pagedc::Error naming the size when the device is out of memory.
  DeviceBuffer(size_t bytes, int deviceIndex);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer &&other) noexcept;
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;

  cu::DevicePointer address() const { return address_; }
  void *data() const { return reinterpret_cast<void *>(address_); }
  size_t size() const { return bytes_; }
  int device() const { return device_; }

  /// Copies `bytes` from host `source` to offset `offset` (synchronous).
  void upload(const void *source, size_t bytes, size_t offset = 0);
  /// Copies `bytes` from offset `offset` to host `target` (synchronous).
  void download(void *target, size_t bytes, size_t offset = 0) const;
  /// Sets every byte to `value` (0xff: NaN in f32, f16 and bf16).
  void fill(unsigned char value);

private:
  cu::DevicePointer address_ = 0;
  size_t bytes_ = 0;
  int device_ = 0;
};

/// KV-cache memory on CUDA device `index`: cuMemAlloc'd zero-filled pages,
/// device-to-device copies for copy-on-write, and assign's scatter as
/// stream-ordered device-to-device copies of runs of consecutive rows
/// (one copy per (b, h, run of positions that land in consecutive slots)).
/// PagedKVCache uses it for configs with device cuda:N.
std::shared_ptr<KVMemory> cudaKVMemory(int index);

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

/// A loaded kernel module and its entry points.
struct CudaKernel {
  KernelConfig config;
  std::string arch;
  int device = 0;
  std::shared_ptr<CudaModule> module;
  /// The module of `merge` when it is not `module` (a decode compiled from
  /// mod code: KernelCache::getOrCompileModules); else null.
  std::shared_ptr<CudaModule> mergeModule;
  /// pagedc_prefill, pagedc_decode or pagedc_build_block_mask.
  cu::Function main = nullptr;
  /// pagedc_decode_merge (decode modules only).
  cu::Function merge = nullptr;
  /// CTAs of `main` resident per SM (the driver's occupancy at the kernel's
  /// block size and shared memory; decode splits are planned for it).
  int residentCtasPerSm = 0;
};

/// Loads a module image (cubin or PTX) on device `deviceIndex` and resolves
/// its kernels, raising the main kernel's dynamic shared-memory limit.
/// `mergeImage` non-null: a decode's merge kernel is in that module (its
/// merge unit) instead of `image`'s.
std::shared_ptr<const CudaKernel> loadCudaKernel(const KernelConfig &config,
                                                 const std::string &arch,
                                                 const std::string &image,
                                                 int deviceIndex,
                                                 const std::string *mergeImage = nullptr);

/// The kernel of `config` for `mods` on device `deviceIndex`, loaded once per
/// process: from mods.cuda.bundle (module labelled mods.cuda.bundleLabel
/// for the device's architecture) when there is one, else compiled by
/// KernelCache::global() from mods.cuda.modCode. Throws pagedc::Error when
/// neither source has it.
std::shared_ptr<const CudaKernel> cudaKernelFor(const CompiledMods &mods,
                                                const KernelConfig &config,
                                                int deviceIndex);
/// The configs of the kernels cudaKernelFor has loaded in this process, in
/// the order they were loaded: which kernel served a call (tests).
std::vector<KernelConfig> cudaLoadedKernelConfigs();
/// Waits for the compiles that kernel option link_mods=first started on
/// background threads (tests); their failures are left to the calls that
/// ask for their kernels.
void cudaWaitForBackgroundCompiles();

/// The kernel configuration the backend uses for a call: decode for up to 8
/// query tokens when a decode kernel is available (always with mod code; in
/// a bundle, a decode module of the call's group size with enough query
/// tokens), prefill otherwise. The element type, head dim, page size, group
/// size, lse flag and params size come from the call; block sizes from the
/// bundle module found (defaults with mod code). `arch` is the device's.
/// `kvBlockSize`: the call's block mask's KV block size (0: no block mask,
/// and with mod code a kernel built without its paths,
/// KernelConfig::noBlockMask); prefill takes a KV tile that divides it
/// where it can (KernelConfig::fitPrefillTileToBlocks; in a bundle, the
/// prefill module with the widest tile that divides it, else the first).
/// `options`: the call's kernel options (with mod code, prefillShape picks
/// the prefill tile; a bundle's modules are what they are). `valueHeadDim`: Dv, 0 for
/// Dv = headDim. `kvFloat8`: the cache's 8-bit float type
/// (KernelConfig::kvFloat8), whose prefill takes the mma.sync tiles on every
/// target (choosePrefillShape); bundles hold no such kernels (pagedc::Error).
KernelConfig chooseCudaAttentionConfig(const CompiledMods &mods, DType elementType, int headDim,
                                       int pageSize, int groupSize, int queryLength, bool returnLse,
                                       const std::string &arch, int kvBlockSize = 0,
                                       const KernelOptions &options = {}, int valueHeadDim = 0,
                                       std::optional<DType> kvFloat8 = std::nullopt);

//===----------------------------------------------------------------------===//
// Block masks on the device
//===----------------------------------------------------------------------===//

/// A BlockMask (BlockMask.h layout, logical indices) in device memory.
struct DeviceBlockMask {
  int64_t batch = 1, heads = 1, qLength = 0, kvLength = 0;
  int32_t qBlockSize = 128, kvBlockSize = 128;
  int64_t numQBlocks = 0, maxKvBlocks = 0;
  /// The q block of the first row (BlockMask::firstQBlock; 0 for a full
  /// mask, and for every mask built on the device).
  int64_t firstQBlock = 0;
  /// kvNumBlocks, fullKvNumBlocks ([batch, heads, numQBlocks] each), then
  /// kvIndices, fullKvIndices ([..., maxKvBlocks] each), int32.
  DeviceBuffer storage;

  int32_t *kvNumBlocks() const;
  int32_t *fullKvNumBlocks() const;
  int32_t *kvIndices() const;
  int32_t *fullKvIndices() const;

  /// Copies a host mask to device `deviceIndex`.
  static DeviceBlockMask upload(const BlockMask &mask, int deviceIndex);
  /// Copies the mask back (synchronous).
  BlockMask download() const;
  /// Points a kernel argument block at this mask.
  void bind(PagedcAttentionKernelArgs &args) const;
};

/// Builds the block mask of the mask mod compiled into `builder` (a
/// BlockMaskBuilder kernel) on the device: grid (q blocks, heads, batch),
/// `params` the packed pagedc_mods::Params (device buffer addresses).
/// Enqueued on `stream`; synchronise before download().
DeviceBlockMask buildBlockMaskCuda(const CudaKernel &builder,
                                   const std::vector<unsigned char> &params,
                                   int64_t batch, int64_t heads, int64_t qLength,
                                   int64_t kvLength, int32_t qBlockSize,
                                   int32_t kvBlockSize, cu::Stream stream);

//===----------------------------------------------------------------------===//
// Launching
//===----------------------------------------------------------------------===//

/// One attention call planned on device-resident arguments: the plan
/// (grids, packed arguments) and the decode workspace it owns. enqueue()
/// may be called any number of times; the argument memory must stay valid.
class CudaAttentionLaunch {
public:
  /// Plans `args` (device pointers; see KernelArgs.h) for `kernel`;
  /// `maxKvLength` is the longest kv_len of the call, `maxVisibleKv` the
  /// longest span its block mask lets a decode row see (decodeVisibleSpan;
  /// negative: maxKvLength) and `options` the call's kernel options (kept
  /// for applyLaunchOptions; checkKernelOptions refusing them throws).
  CudaAttentionLaunch(std::shared_ptr<const CudaKernel> kernel,
                      const PagedcAttentionKernelArgs &args,
                      std::vector<unsigned char> params, int maxKvLength,
                      int64_t maxVisibleKv = -1, const KernelOptions &options = {});
  /// The launch's options from the constructor's KernelOptions, for caches
  /// of `kPages` and `vPages` pages. The warpgroup prefill: tensor maps of
  /// the caches (prefillTma, bindPrefillTensorMaps), persistent CTAs
  /// (prefillPersistent and prefillPersistentCtas,
  /// applyPrefillPersistentRequest: unless prefillPersistent says, where
  /// `visitsGrow` (the call has no block mask or blockMaskVisitsGrow of it)
  /// and the tiles outnumber the slots; one per SM and resident CTA unless
  /// prefillPersistentCtas says; with a work counter this object owns
  /// unless prefillTileCounter is false, so its calls must not overlap:
  /// enqueue on one stream) and ping-pong consumers (prefillPingPong,
  /// setPrefillPingPong). Decode: tensor maps (decodeTma,
  /// bindDecodeTensorMaps). Returns the main launch's
  /// note ("tensor maps", "gather (<why>)", the prefill's either + ",
  /// persistent (N CTAs)" + ", tile counter" + ", ping-pong" where on), or "" for other
  /// kernels.
  std::string applyLaunchOptions(int64_t kPages, int64_t vPages, bool visitsGrow);
  /// Launches the call's kernels on `stream` (checks each launch).
  void enqueue(cu::Stream stream);
  /// Launches plan().launches[index] alone on `stream` (the first zeroes
  /// the work counter as enqueue does): what a caller uses to put its own
  /// work, an event say, between the launches of one call. Their order is
  /// the caller's to keep.
  void enqueueLaunch(size_t index, cu::Stream stream);
  const AttentionLaunchPlan &plan() const { return plan_; }

private:
  std::shared_ptr<const CudaKernel> kernel_;
  KernelOptions options_;
  AttentionLaunchPlan plan_;
  DeviceBuffer workspace_;
  /// The persistent prefill's work counter, allocated by applyLaunchOptions
  /// when it is used and zeroed by the first enqueue on its stream (each
  /// launch leaves it at zero).
  DeviceBuffer tileCounter_;
  bool tileCounterZeroed_ = false;
};

/// cuEvent pair for timing work on a stream.
class CudaTimer {
public:
  explicit CudaTimer(int deviceIndex);
  ~CudaTimer();
  CudaTimer(const CudaTimer &) = delete;
  CudaTimer &operator=(const CudaTimer &) = delete;
  void start(cu::Stream stream);
  void stop(cu::Stream stream);
  /// Waits for the stop event; milliseconds between the two.
  float elapsedMilliseconds();

private:
  const CudaDriver &driver_;
  cu::Event start_ = nullptr, stop_ = nullptr;
};

} // namespace pagedc

#endif // PAGEDC_CUDAATTENTION_H
