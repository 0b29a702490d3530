//===- CudaAttention.cpp - Paged flex attention on CUDA devices -----------===//
//
// Devices, device memory, the KV cache's CUDA storage, kernel loading (from
// bundles or the kernel cache), device block masks and the backend that
// flexAttention() dispatches CUDA calls to. Everything goes through the
// driver loaded at run time, so without one each entry point throws the
// driver's reason before doing anything else.
//
//===----------------------------------------------------------------------===//

#include "Arithmetic.h"
#include "cuda/CudaAttention.h"

#include "pagedc/CudaAttention.h"
#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>

namespace pagedc {

namespace {

/// The most query tokens the decode kernel takes (KernelConfig::validate).
constexpr int kMaxDecodeTokens = 8;

struct DeviceState {
  cu::Context context = nullptr;
  CudaDeviceInfo info;
};

std::mutex deviceMutex;
std::map<int, DeviceState> &deviceStates() {
  static std::map<int, DeviceState> states;
  return states;
}

const DeviceState &deviceState(int index) {
  const CudaDriver &driver = CudaDriver::get();
  std::lock_guard<std::mutex> lock(deviceMutex);
  auto found = deviceStates().find(index);
  if (found != deviceStates().end())
    return found->second;
  const int count = driver.deviceCount();
  if (index < 0 || index >= count)
    throw Error(fmt::format("cuda:{} does not exist: the driver reports {} CUDA device{}",
                            index, count, count == 1 ? "" : "s"));
  DeviceState state;
  state.info = driver.deviceInfo(index);
  cu::Device device = 0;
  driver.check(driver.api().deviceGet(&device, index), "cuDeviceGet");
  driver.check(driver.api().primaryCtxRetain(&state.context, device),
               fmt::format("cuDevicePrimaryCtxRetain(cuda:{})", index));
  return deviceStates().emplace(index, state).first->second;
}

} // namespace

//===----------------------------------------------------------------------===//
// Devices and memory
//===----------------------------------------------------------------------===//

const CudaDriver &cudaUseDevice(int index) {
  const CudaDriver &driver = CudaDriver::get();
  const DeviceState &state = deviceState(index);
  driver.check(driver.api().ctxSetCurrent(state.context), "cuCtxSetCurrent");
  return driver;
}

const CudaDeviceInfo &cudaDeviceInfo(int index) { return deviceState(index).info; }

DeviceBuffer::DeviceBuffer(size_t bytes, int deviceIndex) : bytes_(bytes), device_(deviceIndex) {
  const CudaDriver &driver = cudaUseDevice(deviceIndex);
  cu::Result result = driver.api().memAlloc(&address_, std::max<size_t>(bytes, 1));
  if (result != 0) {
    address_ = 0;
    driver.check(result, fmt::format("cuMemAlloc of {} bytes on cuda:{}", bytes, deviceIndex));
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (!address_)
    return;
  const CudaDriver &driver = CudaDriver::get();
  try {
    cudaUseDevice(device_);
  } catch (const Error &) {
  }
  driver.api().memFree(address_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer &&other) noexcept
    : address_(other.address_), bytes_(other.bytes_), device_(other.device_) {
  other.address_ = 0;
  other.bytes_ = 0;
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    address_ = other.address_;
    bytes_ = other.bytes_;
    device_ = other.device_;
    other.address_ = 0;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void *source, size_t bytes, size_t offset) {
  // Not offset + bytes > bytes_: that sum wraps for offsets near SIZE_MAX.
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw Error(fmt::format("DeviceBuffer::upload of {} bytes at {} overruns {} bytes", bytes,
                            offset, bytes_));
  if (bytes == 0)
    return;
  const CudaDriver &driver = cudaUseDevice(device_);
  driver.check(driver.api().memcpyHtoD(address_ + offset, source, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void *target, size_t bytes, size_t offset) const {
  // Not offset + bytes > bytes_: that sum wraps for offsets near SIZE_MAX.
  if (offset > bytes_ || bytes > bytes_ - offset)
    throw Error(fmt::format("DeviceBuffer::download of {} bytes at {} overruns {} bytes", bytes,
                            offset, bytes_));
  if (bytes == 0)
    return;
  const CudaDriver &driver = cudaUseDevice(device_);
  driver.check(driver.api().memcpyDtoH(target, address_ + offset, bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::fill(unsigned char value) {
  const CudaDriver &driver = cudaUseDevice(device_);
  driver.check(driver.api().memsetD8(address_, value, std::max<size_t>(bytes_, 1)), "cuMemsetD8");
}

namespace {

/// KV pages in device memory.
class CudaKVMemory final : public KVMemory {
public:
  explicit CudaKVMemory(int index) : index_(index) { cudaUseDevice(index); }

  Device device() const override { return Device::cuda(index_); }

  void *allocate(size_t bytes) override {
    const CudaDriver &driver = cudaUseDevice(index_);
    cu::DevicePointer address = 0;
    cu::Result result = driver.api().memAlloc(&address, std::max<size_t>(bytes, 1));
    if (result != 0)
      driver.check(result, fmt::format("cuMemAlloc of {} bytes for the KV cache on cuda:{}",
                                       bytes, index_));
    result = driver.api().memsetD8(address, 0, std::max<size_t>(bytes, 1));
    if (result != 0) {
      driver.api().memFree(address);
      driver.check(result, "cuMemsetD8 (zero-filling the KV cache)");
    }
    return reinterpret_cast<void *>(address);
  }

  void deallocate(void *data, size_t) noexcept override {
    if (!data)
      return;
    try {
      const CudaDriver &driver = cudaUseDevice(index_);
      driver.api().memFree(reinterpret_cast<cu::DevicePointer>(data));
    } catch (const Error &) {
    }
  }

  void copy(void *dst, const void *src, size_t bytes) override {
    if (bytes == 0)
      return;
    const CudaDriver &driver = cudaUseDevice(index_);
    driver.check(driver.api().memcpyDtoD(reinterpret_cast<cu::DevicePointer>(dst),
                                         reinterpret_cast<cu::DevicePointer>(src), bytes),
                 "cuMemcpyDtoD (KV cache page copy)");
  }

  void upload(void *dst, const void *src, size_t bytes) override {
    if (bytes == 0)
      return;
    const CudaDriver &driver = cudaUseDevice(index_);
    driver.check(driver.api().memcpyHtoD(reinterpret_cast<cu::DevicePointer>(dst), src, bytes),
                 "cuMemcpyHtoD (KV cache codes)");
  }

  void scatterRows(const TensorView &values, const TensorView &cache,
                   const int64_t *slots) override {
    checkScatterRows(values, cache, slots);
    const CudaDriver &driver = cudaUseDevice(index_);
    const auto elementSize = static_cast<int64_t>(dtypeSize(values.dtype()));
    const int64_t batch = values.size(0), heads = values.size(1), seqLen = values.size(2),
                  dim = values.size(3);
    const int64_t rows = cache.size(1);
    const auto source = reinterpret_cast<cu::DevicePointer>(values.data());
    const auto target = reinterpret_cast<cu::DevicePointer>(cache.data());
    const bool rowContiguous = values.stride(3) == 1 || dim == 1;
    // Stream-ordered on the legacy default stream, so that the copies are
    // ordered after earlier work on any blocking stream and before the next
    // attention call; one synchronisation at the end. Positions are copied
    // in order, so a later duplicate slot overwrites an earlier one.
    cu::Stream stream = nullptr;
    auto copy = [&](int64_t from, int64_t to, int64_t bytes) {
      driver.check(driver.api().memcpyDtoDAsync(target + static_cast<cu::DevicePointer>(to),
                                                source + static_cast<cu::DevicePointer>(from),
                                                static_cast<size_t>(bytes), stream),
                   "cuMemcpyDtoDAsync (KV cache assign)");
    };
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t s = 0; s < seqLen;) {
          const int64_t slot = slots[b * seqLen + s];
          const int64_t from =
              (b * values.stride(0) + h * values.stride(1) + s * values.stride(2)) * elementSize;
          const int64_t to = (h * rows + slot) * dim * elementSize;
          if (!rowContiguous) {
            for (int64_t d = 0; d < dim; ++d)
              copy(from + d * values.stride(3) * elementSize, to + d * elementSize, elementSize);
            ++s;
            continue;
          }
          // Extend the run while source rows and target slots are both
          // consecutive.
          int64_t run = 1;
          if (values.stride(2) == dim)
            while (s + run < seqLen && slots[b * seqLen + s + run] == slot + run)
              ++run;
          copy(from, to, run * dim * elementSize);
          s += run;
        }
    driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize (KV cache assign)");
  }

private:
  int index_;
};

} // namespace

std::shared_ptr<KVMemory> cudaKVMemory(int index) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<KVMemory>> memories;
  std::lock_guard<std::mutex> lock(mutex);
  auto &memory = memories[index];
  if (!memory)
    memory = std::make_shared<CudaKVMemory>(index);
  return memory;
}

//===----------------------------------------------------------------------===//
// Kernels
//===----------------------------------------------------------------------===//

std::shared_ptr<const CudaKernel> loadCudaKernel(const KernelConfig &config,
                                                 const std::string &arch,
                                                 const std::string &image, int deviceIndex,
                                                 const std::string *mergeImage) {
  config.validate();
  if (mergeImage && !hasSeparateMergeUnit(config))
    throw Error(fmt::format("the {} kernel has no merge unit of its own", config.describe()));
  const CudaDriver &driver = cudaUseDevice(deviceIndex);
  const CudaDeviceInfo &info = cudaDeviceInfo(deviceIndex);
  auto kernel = std::make_shared<CudaKernel>();
  kernel->config = config;
  kernel->arch = arch;
  kernel->device = deviceIndex;
  kernel->module = std::make_shared<CudaModule>(driver, image);
  if (mergeImage)
    kernel->mergeModule = std::make_shared<CudaModule>(driver, *mergeImage);
  const int shared = config.sharedMemoryBytes();
  if (shared > info.maxSharedMemoryPerBlockOptin)
    throw Error(fmt::format("the {} kernel needs {} bytes of shared memory but cuda:{} ({}) "
                            "allows {} per block",
                            kernelKindName(config.kind), shared, deviceIndex, info.name,
                            info.maxSharedMemoryPerBlockOptin));
  switch (config.kind) {
  case KernelKind::Prefill:
    if (config.groupRows) {
      kernel->main = kernel->module->function("pagedc_prefill_group", shared);
      kernel->merge = kernel->module->function("pagedc_prefill_group_merge");
    } else {
      kernel->main =
          kernel->module->function("pagedc_prefill", shared, config.prefillCtasPerSm > 1);
    }
    break;
  case KernelKind::Decode:
    kernel->main = kernel->module->function("pagedc_decode", shared);
    kernel->merge =
        (mergeImage ? kernel->mergeModule : kernel->module)->function("pagedc_decode_merge");
    break;
  case KernelKind::BlockMaskBuilder:
    kernel->main = kernel->module->function("pagedc_build_block_mask");
    break;
  }
  int resident = 0;
  driver.check(driver.api().occupancyMaxActiveBlocksPerMultiprocessor(
                   &resident, kernel->main, config.threadsPerCta(), size_t(shared)),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  kernel->residentCtasPerSm = resident;
  return kernel;
}

namespace {

std::string modsLabel(const CompiledMods &mods) {
  return fmt::format("mask '{}', score '{}'", mods.hasMask() ? mods.maskName : "none",
                     mods.hasScore() ? mods.scoreName : "none");
}

/// cudaKernelFor's kernels, by mods, config and device, and their configs
/// in load order (cudaLoadedKernelConfigs); under loadedKernelsMutex().
std::mutex &loadedKernelsMutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<std::string, std::shared_ptr<const CudaKernel>> &loadedKernels() {
  static std::map<std::string, std::shared_ptr<const CudaKernel>> loaded;
  return loaded;
}
std::vector<KernelConfig> &loadedKernelOrder() {
  static std::vector<KernelConfig> order;
  return order;
}

/// Whether a bundle module built for `module` serves a launch that wants
/// `wanted`: the same kernel but for the params' size, where a module that
/// takes launches with and without a block mask also serves one built for
/// launches without (bundles hold the former).
bool moduleServes(const KernelConfig &module, const KernelConfig &wanted) {
  KernelConfig left = module, right = wanted;
  left.paramsSize = right.paramsSize = 0;
  if (right.noBlockMask)
    left.noBlockMask = true;
  return left == right;
}

/// Whether a bundle module built for `moduleArch` runs on a device of
/// `deviceArch`: the same architecture, or sm_90a code (the warpgroup
/// prefill) on an sm_90 device.
bool bundleArchRuns(const std::string &moduleArch, const std::string &deviceArch) {
  return moduleArch == deviceArch || (deviceArch == "sm_90" && moduleArch == "sm_90a");
}

} // namespace

std::shared_ptr<const CudaKernel> cudaKernelFor(const CompiledMods &mods,
                                                const KernelConfig &config, int deviceIndex) {
  cudaUseDevice(deviceIndex);
  const CudaDeviceInfo &info = cudaDeviceInfo(deviceIndex);
  const std::string arch = info.arch();

  std::mutex &mutex = loadedKernelsMutex();
  std::map<std::string, std::shared_ptr<const CudaKernel>> &loaded = loadedKernels();
  std::string key;
  if (mods.cuda.bundle)
    key = fmt::format("bundle {} {}", static_cast<const void *>(mods.cuda.bundle.get()),
                      mods.cuda.bundleLabel);
  else if (!mods.cuda.modCode.empty())
    key = fmt::format("code {:016x} {}", contentHash64(mods.cuda.modCode), mods.cuda.modCode.size());
  else
    throw Error(fmt::format("the mods ({}) have no CUDA kernels: CompiledMods::cuda holds "
                            "neither generated mod code nor a kernel bundle",
                            modsLabel(mods)));
  key += fmt::format(" | {} | cuda:{}", config.describe(), deviceIndex);
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = loaded.find(key);
    if (found != loaded.end())
      return found->second;
  }

  std::shared_ptr<const CudaKernel> kernel;
  if (mods.cuda.bundle) {
    const BundleModule *module = nullptr;
    for (const BundleModule &candidate : mods.cuda.bundle->modules)
      if (candidate.mods == mods.cuda.bundleLabel && bundleArchRuns(candidate.arch, arch) &&
          moduleServes(candidate.config, config) &&
          (candidate.config.paramsSize < 0 || candidate.config.paramsSize == config.paramsSize))
        module = &candidate;
    if (!module)
      throw Error(fmt::format("the kernel bundle has no {} module labelled '{}' for {} ({})",
                              config.describe(), mods.cuda.bundleLabel, arch, info.name));
    kernel = loadCudaKernel(module->config, module->arch, module->image, deviceIndex);
  } else {
    // Warpgroup tiles use wgmma and setmaxnreg: the sm_90a target of an
    // sm_90 device. The FA2-shaped prefill tile is compiled with ptxas's
    // report, as settlePrefillShape compiled it.
    CompileOptions options = cudaCompileOptions(config, arch);
    if (config.needsSm90a() && arch != "sm_90" && !isEmulatorArch(arch))
      throw Error(fmt::format("warpgroup prefill tiles (kernel option prefill_shape ...x64) "
                              "need an sm_90 device; {} is {}",
                              info.name, arch));
    const KernelCache::Modules compiled =
        KernelCache::global().getOrCompileModules(config, mods.cuda.modCode, options);
    kernel = loadCudaKernel(compiled.main->config, compiled.main->arch, compiled.main->image,
                            deviceIndex, compiled.merge ? &compiled.merge->image : nullptr);
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto [at, added] = loaded.emplace(key, kernel);
  if (added)
    loadedKernelOrder().push_back(kernel->config);
  return at->second;
}

std::vector<KernelConfig> cudaLoadedKernelConfigs() {
  std::lock_guard<std::mutex> lock(loadedKernelsMutex());
  return loadedKernelOrder();
}

KernelConfig chooseCudaAttentionConfig(const CompiledMods &mods, DType elementType, int headDim,
                                       int pageSize, int groupSize, int queryLength, bool returnLse,
                                       const std::string &arch, int kvBlockSize,
                                       const KernelOptions &options, int valueHeadDim,
                                       std::optional<DType> kvFloat8) {
  const int64_t paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
  if (kvFloat8 && mods.cuda.bundle)
    throw Error(fmt::format("kernel bundles hold no kernels for {} caches: compile the mods "
                            "(CompiledMods::cuda's mod code) to run them",
                            dtypeName(*kvFloat8)));
  if (!mods.cuda.bundle) {
    KernelConfig config;
    config.elementType = elementType;
    config.kvFloat8 = kvFloat8;
    config.headDim = headDim;
    config.valueHeadDim = valueHeadDim == headDim ? 0 : valueHeadDim;
    config.pageSize = pageSize;
    config.groupSize = groupSize;
    config.returnLse = returnLse;
    config.paramsSize = paramsSize;
    if (queryLength <= kMaxDecodeTokens) {
      config.kind = KernelKind::Decode;
      config.queryTokens = std::max(queryLength, 1);
    } else {
      // Prefill reads the GQA ratio at run time: one kernel for every ratio.
      config.kind = KernelKind::Prefill;
      config.groupSize = 1;
      // 8-bit codes: the warpgroup tiles on sm_90 (their producer converts
      // the codes), the mma.sync tiles of choosePrefillShape elsewhere (the
      // 128 x 32 tile of sm_80 at head dim 128 does not read them).
      if (kvFloat8 && arch != "sm_90a" && arch != "sm_90")
        config.choosePrefillShape(options);
      else
        config.choosePrefillShapeFor(arch, options);
      config.fitPrefillTileToBlocks(kvBlockSize);
    }
    // Without a block mask the kernel need not carry its paths: a faster
    // compile (KernelConfig::noBlockMask).
    config.noBlockMask = kvBlockSize <= 0;
    config.linkedMods = options.linksMods();
    if (config.linkedMods)
      config.paramsSize = linkedParamsCapacity(paramsSize);
    config.validate();
    // Prefill: 128 x 32 with 32 rows per warp where it compiles without
    // spills (any other config is returned as it is).
    return settlePrefillShape(config, mods.cuda.modCode, arch);
  }

  const BundleModule *decode = nullptr, *prefill = nullptr;
  for (const BundleModule &module : mods.cuda.bundle->modules) {
    const KernelConfig &c = module.config;
    if (module.mods != mods.cuda.bundleLabel || !bundleArchRuns(module.arch, arch) || c.kvFloat8 ||
        c.elementType != elementType || c.headDim != headDim ||
        c.valueDim() != (valueHeadDim ? valueHeadDim : headDim) || c.pageSize != pageSize ||
        c.returnLse != returnLse ||
        // A kernel with linked mods takes Params up to its room.
        (c.paramsSize >= 0 && (c.linkedMods ? paramsSize > c.paramsSize
                                            : c.paramsSize != paramsSize)) ||
        (c.noBlockMask && kvBlockSize > 0))
      continue;
    if (c.kind == KernelKind::Decode && c.groupSize == groupSize &&
        c.queryTokens >= queryLength &&
        (!decode || c.queryTokens < decode->config.queryTokens))
      decode = &module;
    // Prefill: of the modules whose KV tile divides the block mask's blocks
    // (all without a mask), the one with the widest tile (a bundle holds a
    // narrower one for calls under narrower blocks); else the first.
    if (c.kind == KernelKind::Prefill) {
      auto divides = [&](const KernelConfig &k) {
        return kvBlockSize <= 0 || kvBlockSize % k.blockN == 0;
      };
      if (!prefill || (divides(c) && (!divides(prefill->config) ||
                                      c.blockN > prefill->config.blockN)))
        prefill = &module;
    }
  }
  const BundleModule *chosen = queryLength <= kMaxDecodeTokens && decode ? decode : prefill;
  if (!chosen) {
    std::string have;
    for (const BundleModule &module : mods.cuda.bundle->modules)
      if (module.mods == mods.cuda.bundleLabel)
        have += fmt::format("\n  {} {}", module.arch, module.config.describe());
    throw Error(fmt::format(
        "the kernel bundle has no kernel for this call: mods '{}', {}, {} head dim {}, page "
        "size {}, {} query heads per KV head, {} query tokens, lse {}, params {} bytes; it "
        "has:{}",
        mods.cuda.bundleLabel, arch, dtypeName(elementType), headDim, pageSize, groupSize,
        queryLength, returnLse ? "yes" : "no", paramsSize, have.empty() ? " nothing" : have));
  }
  KernelConfig config = chosen->config;
  // (Linked mods: the module's room, to which the launch pads the Params.)
  if (config.paramsSize >= 0 && !config.linkedMods)
    config.paramsSize = paramsSize;
  return config;
}

//===----------------------------------------------------------------------===//
// Block masks on the device
//===----------------------------------------------------------------------===//

namespace {
size_t maskRowCount(const DeviceBlockMask &mask) {
  return static_cast<size_t>(mask.batch * mask.heads * mask.numQBlocks);
}
DeviceBlockMask allocateMask(int64_t batch, int64_t heads, int64_t qLength, int64_t kvLength,
                             int32_t qBlockSize, int32_t kvBlockSize, int deviceIndex) {
  DeviceBlockMask mask;
  mask.batch = batch;
  mask.heads = heads;
  mask.qLength = qLength;
  mask.kvLength = kvLength;
  mask.qBlockSize = qBlockSize;
  mask.kvBlockSize = kvBlockSize;
  mask.numQBlocks = ceilDiv(qLength, qBlockSize);
  mask.maxKvBlocks = std::max<int64_t>(1, ceilDiv(kvLength, kvBlockSize));
  const size_t rows = maskRowCount(mask);
  mask.storage = DeviceBuffer(rows * 2 * (1 + mask.maxKvBlocks) * sizeof(int32_t), deviceIndex);
  return mask;
}
} // namespace

int32_t *DeviceBlockMask::kvNumBlocks() const { return static_cast<int32_t *>(storage.data()); }
int32_t *DeviceBlockMask::fullKvNumBlocks() const { return kvNumBlocks() + maskRowCount(*this); }
int32_t *DeviceBlockMask::kvIndices() const {
  return fullKvNumBlocks() + maskRowCount(*this);
}
int32_t *DeviceBlockMask::fullKvIndices() const {
  return kvIndices() + maskRowCount(*this) * static_cast<size_t>(maxKvBlocks);
}

DeviceBlockMask DeviceBlockMask::upload(const BlockMask &host, int deviceIndex) {
  validateBlockMask(host);
  DeviceBlockMask mask;
  mask.batch = host.batch;
  mask.heads = host.heads;
  mask.qLength = host.qLength;
  mask.kvLength = host.kvLength;
  mask.qBlockSize = host.qBlockSize;
  mask.kvBlockSize = host.kvBlockSize;
  mask.numQBlocks = host.numQBlocks;
  mask.firstQBlock = host.firstQBlock;
  mask.maxKvBlocks = std::max<int64_t>(host.maxKvBlocks, 1);
  const size_t rows = maskRowCount(mask);
  std::vector<int32_t> staging(rows * 2 * (1 + mask.maxKvBlocks), 0);
  std::copy(host.kvNumBlocks.begin(), host.kvNumBlocks.end(), staging.begin());
  if (!host.fullKvNumBlocks.empty())
    std::copy(host.fullKvNumBlocks.begin(), host.fullKvNumBlocks.end(), staging.begin() + rows);
  // Re-pack index rows to maxKvBlocks columns (a host mask may have none).
  for (size_t row = 0; row < rows; ++row)
    for (int64_t column = 0; column < host.maxKvBlocks; ++column) {
      const size_t from = row * host.maxKvBlocks + column;
      const size_t to = row * mask.maxKvBlocks + column;
      staging[2 * rows + to] = host.kvIndices[from];
      if (!host.fullKvIndices.empty())
        staging[2 * rows + rows * mask.maxKvBlocks + to] = host.fullKvIndices[from];
    }
  mask.storage = DeviceBuffer(staging.size() * sizeof(int32_t), deviceIndex);
  mask.storage.upload(staging.data(), staging.size() * sizeof(int32_t));
  return mask;
}

BlockMask DeviceBlockMask::download() const {
  if (firstQBlock != 0)
    throw Error(fmt::format("DeviceBlockMask::download: the mask holds only the rows from q "
                            "block {} on (createBlockMaskRows); download takes full masks",
                            firstQBlock));
  const size_t rows = maskRowCount(*this);
  std::vector<int32_t> staging(rows * 2 * (1 + maxKvBlocks));
  storage.download(staging.data(), staging.size() * sizeof(int32_t));
  auto begin = staging.begin();
  std::vector<int32_t> counts(begin, begin + rows), fullCounts(begin + rows, begin + 2 * rows);
  std::vector<int32_t> indices(begin + 2 * rows, begin + 2 * rows + rows * maxKvBlocks);
  std::vector<int32_t> fullIndices(begin + 2 * rows + rows * maxKvBlocks, staging.end());
  return blockMaskFromKvBlocks(std::move(counts), std::move(indices), std::move(fullCounts),
                               std::move(fullIndices), batch, heads, maxKvBlocks, qLength,
                               kvLength, qBlockSize, kvBlockSize);
}

void DeviceBlockMask::bind(PagedcAttentionKernelArgs &args) const {
  args.kv_num_blocks = kvNumBlocks();
  args.kv_indices = kvIndices();
  args.full_kv_num_blocks = fullKvNumBlocks();
  args.full_kv_indices = fullKvIndices();
  args.mask_batch = static_cast<int32_t>(batch);
  args.mask_heads = static_cast<int32_t>(heads);
  args.num_q_blocks = static_cast<int32_t>(numQBlocks);
  args.max_kv_blocks = static_cast<int32_t>(maxKvBlocks);
  args.q_block_size = qBlockSize;
  args.kv_block_size = kvBlockSize;
  args.first_q_block = static_cast<int32_t>(firstQBlock);
}

DeviceBlockMask buildBlockMaskCuda(const CudaKernel &builder,
                                   const std::vector<unsigned char> &params, int64_t batch,
                                   int64_t heads, int64_t qLength, int64_t kvLength,
                                   int32_t qBlockSize, int32_t kvBlockSize, cu::Stream stream) {
  if (builder.config.kind != KernelKind::BlockMaskBuilder)
    throw Error(fmt::format("buildBlockMaskCuda needs a block-mask builder kernel, not {}",
                            kernelKindName(builder.config.kind)));
  if (batch < 1 || heads < 1 || qLength < 1 || kvLength < 1 || qBlockSize < 1 ||
      kvBlockSize < 1 || qLength > INT32_MAX || kvLength > INT32_MAX)
    throw Error(fmt::format("buildBlockMaskCuda: batch {}, heads {}, lengths {} x {} and "
                            "blocks {} x {} must be positive and within int32",
                            batch, heads, qLength, kvLength, qBlockSize, kvBlockSize));
  DeviceBlockMask mask = allocateMask(batch, heads, qLength, kvLength, qBlockSize, kvBlockSize,
                                      builder.device);
  PagedcBlockMaskKernelArgs args{};
  args.kv_num_blocks = mask.kvNumBlocks();
  args.kv_indices = mask.kvIndices();
  args.full_kv_num_blocks = mask.fullKvNumBlocks();
  args.full_kv_indices = mask.fullKvIndices();
  args.batch = static_cast<int32_t>(batch);
  args.heads = static_cast<int32_t>(heads);
  args.q_len = static_cast<int32_t>(qLength);
  args.kv_len = static_cast<int32_t>(kvLength);
  args.q_block_size = qBlockSize;
  args.kv_block_size = kvBlockSize;
  args.num_q_blocks = static_cast<int32_t>(mask.numQBlocks);
  args.max_kv_blocks = static_cast<int32_t>(mask.maxKvBlocks);
  KernelLaunch launch = planBlockMaskBuild(args, params);
  const CudaDriver &driver = cudaUseDevice(builder.device);
  launchKernel(driver, builder.main, launch, stream);
  return mask;
}

//===----------------------------------------------------------------------===//
// Launching
//===----------------------------------------------------------------------===//

CudaAttentionLaunch::CudaAttentionLaunch(std::shared_ptr<const CudaKernel> kernel,
                                         const PagedcAttentionKernelArgs &args,
                                         std::vector<unsigned char> params, int maxKvLength,
                                         int64_t maxVisibleKv, const KernelOptions &options)
    : kernel_(std::move(kernel)), options_(options) {
  checkKernelOptions(options_);
  const CudaDeviceInfo &info = cudaDeviceInfo(kernel_->device);
  plan_ = planAttention(kernel_->config, args, params, maxKvLength, info.multiprocessors,
                        std::max(kernel_->residentCtasPerSm, 1), maxVisibleKv, options_);
  // The merge of sm_90 code waits for the split kernel in-kernel
  // (griddepcontrol.wait, templates/Decode.cuh), so it may launch while the
  // splits drain; the emulator runs launches one after the other.
  const std::string &arch = kernel_->arch;
  const bool hopper = archHasSm90Features(arch);
  for (KernelLaunch &launch : plan_.launches)
    if (launch.kernel == "pagedc_decode_merge")
      launch.programmaticDependent = hopper;
  if (plan_.workspaceBytes) {
    workspace_ = DeviceBuffer(plan_.workspaceBytes, kernel_->device);
    plan_.setWorkspace(workspace_.address());
  }
}

std::string CudaAttentionLaunch::applyLaunchOptions(int64_t kPages, int64_t vPages,
                                                   bool visitsGrow) {
  const int64_t slots = int64_t(cudaDeviceInfo(kernel_->device).multiprocessors) *
                        std::max(kernel_->residentCtasPerSm, 1);
  return applyKernelOptions(&cudaUseDevice(kernel_->device), kernel_->config, kernel_->arch, plan_,
                            kPages, vPages, slots, visitsGrow, options_, [&] {
                              if (!tileCounter_.size()) {
                                tileCounter_ = DeviceBuffer(sizeof(int32_t), kernel_->device);
                                tileCounterZeroed_ = false; // on the first enqueue's stream
                              }
                              return tileCounter_.address();
                            });
}

void CudaAttentionLaunch::enqueue(cu::Stream stream) {
  for (size_t i = 0; i < plan_.launches.size(); ++i)
    enqueueLaunch(i, stream);
}

void CudaAttentionLaunch::enqueueLaunch(size_t index, cu::Stream stream) {
  if (index >= plan_.launches.size())
    throw Error(fmt::format("attention launch: launch {} of a plan of {}", index,
                            plan_.launches.size()));
  const CudaDriver &driver = cudaUseDevice(kernel_->device);
  // The work counter starts at zero, set on the launch's own stream: a
  // cuMemsetD8 would go to the legacy default stream, which a non-blocking
  // stream does not wait for. Each launch then leaves it at zero.
  if (index == 0 && tileCounter_.size() && !tileCounterZeroed_) {
    driver.check(driver.api().memsetD8Async(tileCounter_.address(), 0, tileCounter_.size(),
                                            stream),
                 "cuMemsetD8Async (tile counter)");
    tileCounterZeroed_ = true;
  }
  KernelLaunch &launch = plan_.launches[index];
  cu::Function function = launch.kernel == "pagedc_decode_merge" ? kernel_->merge
                                                                 : kernel_->main;
  launchKernel(driver, function, launch, stream);
}

CudaTimer::CudaTimer(int deviceIndex) : driver_(cudaUseDevice(deviceIndex)) {
  driver_.check(driver_.api().eventCreate(&start_, 0), "cuEventCreate");
  driver_.check(driver_.api().eventCreate(&stop_, 0), "cuEventCreate");
}

CudaTimer::~CudaTimer() {
  driver_.api().eventDestroy(start_);
  driver_.api().eventDestroy(stop_);
}

void CudaTimer::start(cu::Stream stream) {
  driver_.check(driver_.api().eventRecord(start_, stream), "cuEventRecord");
}

void CudaTimer::stop(cu::Stream stream) {
  driver_.check(driver_.api().eventRecord(stop_, stream), "cuEventRecord");
}

float CudaTimer::elapsedMilliseconds() {
  driver_.check(driver_.api().eventSynchronize(stop_), "cuEventSynchronize");
  float milliseconds = 0;
  driver_.check(driver_.api().eventElapsedTime(&milliseconds, start_, stop_),
                "cuEventElapsedTime");
  return milliseconds;
}

//===----------------------------------------------------------------------===//
// The flexAttention backend
//===----------------------------------------------------------------------===//

namespace cuda {

std::shared_ptr<KVMemory> kvMemory(Device device) {
  std::string reason;
  if (!CudaDriver::available(&reason))
    throw Error(fmt::format("KV cache memory on {} is not available: {}", deviceName(device),
                            reason));
  return cudaKVMemory(device.index);
}

namespace {

bool isCompact(const TensorView &view) {
  int64_t expected = 1;
  for (int d = view.rank() - 1; d >= 0; --d) {
    if (view.size(d) != 1 && view.stride(d) != expected)
      return false;
    expected *= view.size(d);
  }
  return true;
}

/// The CUDA kernels' layout demands beyond flexAttention's common checks.
void checkCudaLayout(const cpu::PagedAttentionArgs &args) {
  const TensorView &q = args.q, &out = args.out;
  const int64_t headDim = q.size(3);
  if (headDim == KernelConfig::kMlaKeyDim)
    throw Error(fmt::format("the CUDA kernels of flexAttention take head dims that are {}, not "
                            "{}; MLA decode (head dim {}, the values the latent rows' first {} "
                            "columns) runs through BatchAttention (docs/serving.md, \"MLA "
                            "decode\")",
                            cudaHeadDimsText(), headDim, KernelConfig::kMlaKeyDim,
                            KernelConfig::kMlaValueDim));
  if (!isCudaHeadDim(headDim))
    throw Error(fmt::format("the CUDA kernels take head dims that are {}, not {}",
                            cudaHeadDimsText(), headDim));
  if (!isCudaHeadDim(args.vCache.size(3)))
    throw Error(fmt::format("the CUDA kernels take value head dims that are {}, not {}",
                            cudaHeadDimsText(), args.vCache.size(3)));
  // 16-byte loads of q rows.
  for (int d = 0; d < 3; ++d)
    if (q.size(d) > 1 && q.stride(d) % 8 != 0)
      throw Error(fmt::format("q's stride {} in dimension {} is not a multiple of 8 elements "
                              "(the CUDA kernels load 16-byte chunks)",
                              q.stride(d), d));
  if (reinterpret_cast<uintptr_t>(q.data()) % 16 != 0)
    throw Error("q's data is not 16-byte aligned (the CUDA kernels load 16-byte chunks)");
  // Outputs are stored as pairs of elements.
  if (out.stride(3) != 1)
    throw Error(fmt::format("options.out's last dimension must be contiguous on CUDA but has "
                            "stride {}",
                            out.stride(3)));
  for (int d = 0; d < 3; ++d)
    if (out.size(d) > 1 && out.stride(d) % 2 != 0)
      throw Error(fmt::format("options.out's stride {} in dimension {} is odd (the CUDA "
                              "kernels store pairs of elements)",
                              out.stride(d), d));
  if (reinterpret_cast<uintptr_t>(out.data()) % 4 != 0)
    throw Error("options.out's data is not 4-byte aligned");
  if (args.lse.data() && !isCompact(args.lse))
    throw Error(fmt::format("options.lse must be contiguous on CUDA, but has strides {}",
                            TensorView(nullptr, DType::F32, args.lse.strides()).shapeString()));
  for (const TensorView *cache : {&args.kCache, &args.vCache})
    if (!isCompact(*cache))
      throw Error("the KV cache storage must be compact on CUDA");
}

} // namespace

namespace {

/// One staging upload of the call's page table, kv_len and q_offset (and
/// an 8-bit cache's K and V scales, as bits), enqueued on `stream`; points
/// kernelArgs at them. The buffer must outlive the launch.
DeviceBuffer uploadCallData(const cpu::PagedAttentionArgs &args, const KernelConfig &config,
                            Device device, cu::Stream stream,
                            PagedcAttentionKernelArgs &kernelArgs) {
  const int batch = static_cast<int>(args.q.size(0));
  const int headsKv = static_cast<int>(args.kCache.size(0));
  std::vector<int32_t> staging(args.pageTable, args.pageTable + batch * args.pageTableStride);
  const size_t kvLenAt = staging.size();
  staging.insert(staging.end(), args.kvLength, args.kvLength + batch);
  const size_t qOffsetAt = staging.size();
  if (args.qOffset)
    staging.insert(staging.end(), args.qOffset, args.qOffset + batch);
  else
    staging.insert(staging.end(), static_cast<size_t>(batch), 0);
  const size_t kScaleAt = staging.size();
  if (config.kvFloat8) {
    if (!args.kScale || !args.vScale)
      throw Error(fmt::format("the KV cache stores {} but the call has no K and V scales",
                              dtypeName(args.kCache.dtype())));
    for (const float *scales : {args.kScale, args.vScale})
      for (int h = 0; h < headsKv; ++h) {
        int32_t bits;
        std::memcpy(&bits, &scales[h], sizeof(bits));
        staging.push_back(bits);
      }
  }
  DeviceBuffer callData(staging.size() * sizeof(int32_t), device.index);
  const CudaDriver &driver = CudaDriver::get();
  driver.check(driver.api().memcpyHtoDAsync(callData.address(), staging.data(),
                                            staging.size() * sizeof(int32_t), stream),
               "cuMemcpyHtoDAsync (page table, kv_len, q_offset)");
  auto *deviceInts = static_cast<int32_t *>(callData.data());
  kernelArgs.page_table = deviceInts;
  kernelArgs.kv_len = deviceInts + kvLenAt;
  kernelArgs.q_offset = deviceInts + qOffsetAt;
  if (config.kvFloat8) {
    kernelArgs.k_scale = reinterpret_cast<const float *>(deviceInts + kScaleAt);
    kernelArgs.v_scale = reinterpret_cast<const float *>(deviceInts + kScaleAt + headsKv);
  }
  return callData;
}

/// ModLinking::LinkedFirst's compiles on background threads: the inlined
/// kernels by mods and config, and the kernel units shared by a shape's
/// linked variants, by config. Each is started once; a failed one is
/// rethrown to every call that asks for it.
struct BackgroundCompiles {
  std::mutex mutex;
  std::map<std::string, std::shared_future<KernelConfig>> inlined;
  std::map<std::string, std::shared_future<void>> linkedUnits;

  /// Made after what the compile threads use (the global cache, and for
  /// the first call's `arch` the compiler's identity and, on a GPU, the
  /// loaded NVRTC), so destroyed before them at exit: the maps' last
  /// futures wait for their threads.
  static BackgroundCompiles &get(const std::string &arch) {
    static BackgroundCompiles &compiles = [&]() -> BackgroundCompiles & {
      KernelCache::global();
      CompileOptions options;
      options.arch = arch;
      KernelCache::diskKey("", options);
      if (!isEmulatorArch(arch)) {
        try {
          Nvrtc::get();
        } catch (const Error &) {
          // The compile that needs it throws the reason to the calls.
        }
      }
      return instance();
    }();
    return compiles;
  }
  /// The maps, made on first use (get() makes them in the right order).
  static BackgroundCompiles &instance() {
    static BackgroundCompiles compiles;
    return compiles;
  }
};

/// ModLinking::LinkedFirst: the inlined kernel of the call whose linked
/// config is `linked`, compiled on a background thread that the first call
/// asking for it starts; null while that compile runs, unless `wait`.
std::shared_ptr<const CudaKernel> inlinedKernelWhenReady(const CompiledMods &mods,
                                                         const KernelConfig &linked,
                                                         const std::string &arch,
                                                         int deviceIndex, bool wait) {
  BackgroundCompiles &compiles = BackgroundCompiles::get(arch);
  KernelCache &cache = KernelCache::global();
  KernelConfig inlined = linked;
  inlined.linkedMods = false;
  inlined.paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
  const std::string key =
      fmt::format("{:016x} {} | {} | {}", contentHash64(mods.cuda.modCode),
                  mods.cuda.modCode.size(), inlined.describe(), arch);
  std::shared_future<KernelConfig> compiled;
  {
    std::lock_guard<std::mutex> lock(compiles.mutex);
    auto found = compiles.inlined.find(key);
    if (found == compiles.inlined.end()) {
      auto compile = [&cache, modCode = mods.cuda.modCode, inlined, arch] {
        // The tile a call with inlined mods would run (narrowed on spills).
        const KernelConfig settled = settlePrefillShape(inlined, modCode, arch, cache);
        cache.getOrCompileModules(settled, modCode, cudaCompileOptions(settled, arch));
        return settled;
      };
      found =
          compiles.inlined.emplace(key, std::async(std::launch::async, compile).share()).first;
    }
    compiled = found->second;
  }
  if (!wait && compiled.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return nullptr;
  return cudaKernelFor(mods, compiled.get(), deviceIndex);
}

/// ModLinking::LinkedFirst: builds, on a background thread, the kernel
/// unit that the linked variants of `linked`'s shape share.
void prepareLinkedUnitInBackground(const CompiledMods &mods, const KernelConfig &linked,
                                   const CompileOptions &options) {
  BackgroundCompiles &compiles = BackgroundCompiles::get(options.arch);
  KernelCache &cache = KernelCache::global();
  const std::string key = linked.describe() + " | " + options.key();
  std::lock_guard<std::mutex> lock(compiles.mutex);
  if (compiles.linkedUnits.count(key) != 0)
    return;
  compiles.linkedUnits.emplace(
      key, std::async(std::launch::async, [&cache, modCode = mods.cuda.modCode, linked, options] {
             cache.prepareLinkedKernelUnit(linked, modCode, options);
           }).share());
}

} // namespace

void pagedAttention(const cpu::PagedAttentionArgs &args, Device device, void *streamHandle,
                    const KernelOptions &kernelOptions) {
  checkKernelOptions(kernelOptions);
  std::string reason;
  if (!CudaDriver::available(&reason))
    throw Error(fmt::format("CUDA execution is not available: {}", reason));
  const CudaDriver &driver = cudaUseDevice(device.index);
  const CudaDeviceInfo &info = cudaDeviceInfo(device.index);
  auto stream = static_cast<cu::Stream>(streamHandle);
  const CompiledMods emptyMods;
  const CompiledMods &mods = args.mods ? *args.mods : emptyMods;
  checkCudaLayout(args);

  const TensorView &q = args.q;
  const int batch = static_cast<int>(q.size(0)), headsQ = static_cast<int>(q.size(1)),
            queryLength = static_cast<int>(q.size(2)), headDim = static_cast<int>(q.size(3));
  const int headsKv = static_cast<int>(args.kCache.size(0));
  const DType kvType = args.kCache.dtype();
  KernelConfig config = chooseCudaAttentionConfig(
      mods, q.dtype(), headDim, args.pageSize, headsQ / headsKv, queryLength,
      args.lse.data() != nullptr, info.arch(),
      args.blockMask ? static_cast<int>(args.blockMask->kvBlockSize) : 0, kernelOptions,
      static_cast<int>(args.vCache.size(3)),
      isFloat8(kvType) ? std::optional<DType>(kvType) : std::nullopt);
  std::shared_ptr<const CudaKernel> kernel;
  // (A bundle's kernels are what it was built with: nothing compiles.)
  if (config.linkedMods && kernelOptions.linkMods == ModLinking::LinkedFirst &&
      !mods.cuda.bundle) {
    kernel = inlinedKernelWhenReady(mods, config, info.arch(), device.index, false);
    // The first variant of a shape: its linked kernel would need the
    // shape's kernel unit, a compile as long as the inlined kernel's. That
    // call waits for the inlined kernel; the shape's unit is built after
    // it, for the variants that follow.
    if (!kernel) {
      const CompileOptions linkedOptions = cudaCompileOptions(config, info.arch());
      if (!KernelCache::global().linkedKernelUnitKnown(config, mods.cuda.modCode,
                                                       linkedOptions)) {
        kernel = inlinedKernelWhenReady(mods, config, info.arch(), device.index, true);
        prepareLinkedUnitInBackground(mods, config, linkedOptions);
      }
    }
    if (kernel)
      config = kernel->config;
  }
  if (!kernel)
    kernel = cudaKernelFor(mods, config, device.index);
  const BlockMask *mask = args.blockMask;
  if (mask) {
    const int tile = config.kind == KernelKind::Decode ? kDecodeKvTile : config.blockN;
    if (mask->kvBlockSize % tile != 0)
      throw Error(fmt::format("the block mask's kv block size {} is not a multiple of the CUDA "
                              "{} kernel's KV tile {}",
                              mask->kvBlockSize, kernelKindName(config.kind), tile));
  }

  // Params: bound values and device buffer addresses.
  PagedcModContext noContext{nullptr, nullptr};
  const ParamsLayout layout = ParamsLayout::forDeclarations(mods.params, mods.buffers);
  std::vector<unsigned char> params =
      layout.pack(mods.params, mods.buffers, args.context ? *args.context : noContext);
  // A kernel with linked mods takes Params of its capacity; the tail is
  // never read.
  if (config.linkedMods)
    params.resize(static_cast<size_t>(config.paramsSize), 0);

  PagedcAttentionKernelArgs kernelArgs{};
  kernelArgs.q = q.data();
  kernelArgs.k_cache = args.kCache.data();
  kernelArgs.v_cache = args.vCache.data();
  kernelArgs.out = args.out.data();
  kernelArgs.lse = static_cast<float *>(args.lse.data());
  // Read in place on the device (null: no sinks); nothing to upload.
  kernelArgs.sinks = static_cast<const float *>(args.sinks.data());
  // The staging buffer dies with this call, after its synchronisation.
  const DeviceBuffer callData = uploadCallData(args, config, device, stream, kernelArgs);
  for (int d = 0; d < 3; ++d) {
    kernelArgs.q_stride[d] = q.stride(d);
    kernelArgs.out_stride[d] = args.out.stride(d);
  }
  // [Hkv, pages, pageSize, D] compact (checkCudaLayout): strides per
  // (head, page, slot), from the shape, since a view's stride of a
  // dimension of size 1 may be anything.
  for (const auto &[cache, strides] :
       {std::pair{&args.kCache, kernelArgs.k_stride}, std::pair{&args.vCache, kernelArgs.v_stride}}) {
    strides[2] = cache->size(3);
    strides[1] = cache->size(2) * strides[2];
    strides[0] = cache->size(1) * strides[1];
  }
  kernelArgs.page_table_stride = args.pageTableStride;
  kernelArgs.batch = batch;
  kernelArgs.heads_q = headsQ;
  kernelArgs.heads_kv = headsKv;
  kernelArgs.q_len = queryLength;
  kernelArgs.scale = args.scale;
  kernelArgs.mask_batch = 1;
  kernelArgs.mask_heads = 1;
  DeviceBlockMask deviceMask;
  if (mask) {
    deviceMask = DeviceBlockMask::upload(*mask, device.index);
    deviceMask.bind(kernelArgs);
  }
  int maxKvLength = 1;
  for (int b = 0; b < batch; ++b)
    maxKvLength = std::max(maxKvLength, args.kvLength[b]);

  // Decode splits divide what the rows see: bound it from the host mask.
  int64_t maxVisibleKv = -1;
  if (mask && config.kind == KernelKind::Decode)
    maxVisibleKv = decodeVisibleSpan(*mask, batch, headsQ, queryLength, args.kvLength,
                                     args.qOffset);
  CudaAttentionLaunch launch(kernel, kernelArgs, std::move(params), maxKvLength, maxVisibleKv,
                             kernelOptions);
  launch.applyLaunchOptions(args.kCache.size(1), args.vCache.size(1),
                            !mask || blockMaskVisitsGrow(*mask));
  launch.enqueue(stream);
  driver.check(driver.api().streamSynchronize(stream), "cuStreamSynchronize (attention)");
}

} // namespace cuda

void cudaWaitForBackgroundCompiles() {
  cuda::BackgroundCompiles &compiles = cuda::BackgroundCompiles::instance();
  std::vector<std::shared_future<KernelConfig>> inlined;
  std::vector<std::shared_future<void>> linkedUnits;
  {
    std::lock_guard<std::mutex> lock(compiles.mutex);
    for (const auto &[key, future] : compiles.inlined)
      inlined.push_back(future);
    for (const auto &[key, future] : compiles.linkedUnits)
      linkedUnits.push_back(future);
  }
  for (const auto &future : inlined)
    future.wait();
  for (const auto &future : linkedUnits)
    future.wait();
}

} // namespace pagedc
