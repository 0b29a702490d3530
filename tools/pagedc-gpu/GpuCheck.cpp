//===- GpuCheck.cpp - Running a pack on a GPU (or planning it) ------------===//

#include "GpuCheck.h"

#include "pagedc/EmulatorBuild.h"

#include "pagedc/Attention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/Error.h"
#include "pagedc/KernelBundle.h"
#include "pagedc/Npy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <ostream>

namespace pagedc::gpu {

namespace fs = std::filesystem;

//===----------------------------------------------------------------------===//
// Cubin validation
//===----------------------------------------------------------------------===//

namespace {

template <typename T> T readAt(const std::string &image, size_t offset) {
  T value{};
  if (offset + sizeof(T) <= image.size())
    std::memcpy(&value, image.data() + offset, sizeof(T));
  return value;
}

} // namespace

std::string validateCubin(const std::string &image, const std::string &arch,
                          const std::vector<std::string> &kernels) {
  if (image.size() < 64 || image.compare(0, 4, "\x7f" "ELF") != 0)
    return "not an ELF file";
  if (image[4] != 2 || image[5] != 1)
    return "not a 64-bit little-endian ELF";
  const auto machine = readAt<uint16_t>(image, 18);
  if (machine != 190)
    return fmt::format("ELF machine {} is not EM_CUDA (190)", machine);
  int sm = 0;
  if (arch.rfind("sm_", 0) != 0 || (sm = std::atoi(arch.c_str() + 3)) <= 0)
    return fmt::format("manifest arch '{}' is not sm_NN", arch);
  // The SM number is in bits 8..15 of e_flags (bits 0..7 with older ABIs).
  const auto flags = readAt<uint32_t>(image, 48);
  if (static_cast<int>((flags >> 8) & 0xff) != sm && static_cast<int>(flags & 0xff) != sm)
    return fmt::format("ELF flags 0x{:x} do not name {}", flags, arch);
  // Symbols: find SHT_SYMTAB and its string table.
  const auto sectionOffset = readAt<uint64_t>(image, 40);
  const auto sectionSize = readAt<uint16_t>(image, 58);
  const auto sectionCount = readAt<uint16_t>(image, 60);
  if (sectionSize < 64 || sectionOffset + uint64_t(sectionCount) * sectionSize > image.size())
    return "section headers lie outside the file";
  std::vector<std::string> names;
  for (unsigned i = 0; i < sectionCount; ++i) {
    const size_t header = sectionOffset + size_t(i) * sectionSize;
    if (readAt<uint32_t>(image, header + 4) != 2) // SHT_SYMTAB
      continue;
    const auto offset = readAt<uint64_t>(image, header + 24);
    const auto size = readAt<uint64_t>(image, header + 32);
    const auto link = readAt<uint32_t>(image, header + 40);
    const auto entry = readAt<uint64_t>(image, header + 56);
    if (link >= sectionCount || entry < 24 || offset + size > image.size())
      return "malformed symbol table";
    const size_t strings = sectionOffset + size_t(link) * sectionSize;
    const auto stringsOffset = readAt<uint64_t>(image, strings + 24);
    const auto stringsSize = readAt<uint64_t>(image, strings + 32);
    if (stringsOffset + stringsSize > image.size())
      return "malformed string table";
    for (uint64_t at = offset; at + entry <= offset + size; at += entry) {
      const auto name = readAt<uint32_t>(image, at);
      if (name < stringsSize)
        names.emplace_back(image.c_str() + stringsOffset + name);
    }
  }
  for (const std::string &kernel : kernels)
    if (std::find(names.begin(), names.end(), kernel) == names.end())
      return fmt::format("no symbol '{}' in the cubin", kernel);
  return "";
}

//===----------------------------------------------------------------------===//
// Shared pieces
//===----------------------------------------------------------------------===//

namespace {

/// Simulated device addresses for dry runs: distinct, 256-byte aligned,
/// never dereferenced.
class FakeAddresses {
public:
  void *take(size_t bytes) {
    void *address = reinterpret_cast<void *>(next_);
    next_ += (std::max<size_t>(bytes, 1) + 255) / 256 * 256 + 256;
    return address;
  }

private:
  uintptr_t next_ = 0x7f0000000000ull;
};

std::string describeLaunch(const KernelLaunch &launch) {
  size_t bytes = 0;
  for (const auto &argument : launch.arguments)
    bytes += argument.size();
  return fmt::format("{} grid ({}, {}, {}) block {} smem {} args {} B{}{}", launch.kernel,
                     launch.grid[0], launch.grid[1], launch.grid[2], launch.block[0],
                     launch.sharedMemoryBytes, bytes, launch.note.empty() ? "" : ", ",
                     launch.note);
}

/// Bundles read once per pack, every module's cubin validated.
class BundleCache {
public:
  explicit BundleCache(const Pack &pack) : pack_(pack) {}
  std::shared_ptr<const KernelBundle> get(const std::string &relative) {
    auto &entry = bundles_[relative];
    if (entry)
      return entry;
    const fs::path directory = fs::path(pack_.directory) / relative;
    auto bundle = std::make_shared<KernelBundle>(KernelBundle::read(directory.string()));
    for (const BundleModule &module : bundle->modules) {
      if (module.output != CompileOptions::Output::Cubin)
        continue;
      // Emulator images are checked by the emulator's loader.
      std::string problem =
          isEmulatorArch(module.arch)
              ? (module.image.compare(0, 16, "PAGEDC-EMU-IMG1\n") == 0
                     ? ""
                     : "not an emulator image")
              : validateCubin(module.image, module.arch, module.kernelNames);
      if (!problem.empty())
        throw Error(fmt::format("{}/{}: {}", directory.string(), module.file, problem));
    }
    entry = bundle;
    return entry;
  }

private:
  const Pack &pack_;
  std::map<std::string, std::shared_ptr<const KernelBundle>> bundles_;
};

KernelConfig builderConfigFor(const CompiledMods &mods) {
  KernelConfig config;
  config.kind = KernelKind::BlockMaskBuilder;
  config.paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
  return config;
}

/// The bundle module for a builder (any block sizes) or null.
const BundleModule *findBuilder(const KernelBundle &bundle, const std::string &label,
                                const std::string &arch) {
  for (const BundleModule &module : bundle.modules)
    if (module.mods == label && module.arch == arch &&
        module.config.kind == KernelKind::BlockMaskBuilder)
      return &module;
  return nullptr;
}

/// Buffers of a case or bench configuration, read from .npy.
std::vector<HostTensor> readBuffers(const fs::path &base, const std::vector<CaseBuffer> &buffers) {
  std::vector<HostTensor> tensors;
  for (const CaseBuffer &buffer : buffers) {
    NpyReadOptions read;
    read.uint16AsBF16 = buffer.decl.elementType == DType::BF16;
    read.expectDType = buffer.decl.elementType;
    tensors.push_back(readNpy((base / buffer.file).string(), read));
  }
  return tensors;
}

/// Params and buffers as Bindings over `views` (device or fake addresses).
Bindings makeBindings(const std::vector<CaseParam> &params,
                      const std::vector<CaseBuffer> &buffers,
                      const std::vector<TensorView> &views) {
  Bindings bindings;
  for (const CaseParam &param : params)
    bindings.params[param.decl.name] = param.value;
  for (size_t i = 0; i < buffers.size(); ++i)
    bindings.buffers[buffers[i].decl.name] = views[i];
  return bindings;
}

/// The architecture the pack's kernels run on: the device's (made current)
/// or, in a dry run, the pack's.
std::string runArchitecture(const Pack &pack, const RunOptions &options) {
  if (options.dryRun)
    return pack.arch;
  cudaUseDevice(options.device);
  return cudaDeviceInfo(options.device).arch();
}

/// Row-major strides of `shape`.
std::vector<int64_t> contiguousStrides(const std::vector<int64_t> &shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(strides.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

/// Views of the mods' buffers at fake addresses (a dry run).
std::vector<TensorView> fakeViews(FakeAddresses &fake, const std::vector<HostTensor> &tensors) {
  std::vector<TensorView> views;
  for (const HostTensor &tensor : tensors)
    views.emplace_back(fake.take(tensor.numel() * dtypeSize(tensor.dtype())), tensor.dtype(),
                       tensor.shape(), contiguousStrides(tensor.shape()), Device::cuda(0));
  return views;
}

/// The mods' buffers uploaded to `device` (kept alive in `storage`), as
/// views.
std::vector<TensorView> deviceViews(const std::vector<HostTensor> &tensors, const Device &device,
                                    std::vector<DeviceBuffer> &storage) {
  std::vector<TensorView> views;
  for (const HostTensor &tensor : tensors) {
    storage.emplace_back(tensor.numel() * dtypeSize(tensor.dtype()), device.index);
    storage.back().upload(tensor.data(), storage.back().size());
    views.emplace_back(storage.back().data(), tensor.dtype(), tensor.shape(),
                       contiguousStrides(tensor.shape()), device);
  }
  return views;
}

/// The kernel arguments' shape of a call on q, out [B, Hq, Lq, D] and a
/// cache of `numPages` pages [pages, Hkv, page, D] per head (K and V
/// alike), a page table of `tableSize` entries; no mask.
PagedcAttentionKernelArgs shapedArgs(int batch, int headsQ, int headsKv, int queryLength,
                                     int headDim, int64_t numPages, int pageSize, size_t tableSize,
                                     float scale) {
  PagedcAttentionKernelArgs args{};
  args.q_stride[0] = int64_t(headsQ) * queryLength * headDim;
  args.q_stride[1] = int64_t(queryLength) * headDim;
  args.q_stride[2] = headDim;
  std::copy(args.q_stride, args.q_stride + 3, args.out_stride);
  args.k_stride[0] = numPages * pageSize * headDim;
  args.k_stride[1] = int64_t(pageSize) * headDim;
  args.k_stride[2] = headDim;
  std::copy(args.k_stride, args.k_stride + 3, args.v_stride);
  args.page_table_stride = static_cast<int64_t>(tableSize) / batch;
  args.batch = batch;
  args.heads_q = headsQ;
  args.heads_kv = headsKv;
  args.q_len = queryLength;
  args.scale = scale;
  args.mask_batch = args.mask_heads = 1;
  return args;
}

/// A dry run's block mask of `batch` x `heads` rows of query blocks, at
/// fake addresses; the builder's launch is described into `launches` and
/// the attention arguments read the mask.
void planFakeMask(FakeAddresses &fake, int64_t batch, int64_t heads, int64_t qLength,
                  int32_t kvLength, int32_t qBlock, int32_t kvBlock,
                  const std::vector<unsigned char> &params, PagedcAttentionKernelArgs &args,
                  std::vector<std::string> &launches) {
  PagedcBlockMaskKernelArgs maskArgs{};
  const int64_t qBlocks = (qLength + qBlock - 1) / qBlock;
  const int64_t kvBlocks = (kvLength + kvBlock - 1) / kvBlock;
  const size_t rows = size_t(batch * heads * qBlocks);
  maskArgs.kv_num_blocks = static_cast<int32_t *>(fake.take(rows * 4));
  maskArgs.full_kv_num_blocks = static_cast<int32_t *>(fake.take(rows * 4));
  maskArgs.kv_indices = static_cast<int32_t *>(fake.take(rows * kvBlocks * 4));
  maskArgs.full_kv_indices = static_cast<int32_t *>(fake.take(rows * kvBlocks * 4));
  maskArgs.batch = static_cast<int32_t>(batch);
  maskArgs.heads = static_cast<int32_t>(heads);
  maskArgs.q_len = static_cast<int32_t>(qLength);
  maskArgs.kv_len = kvLength;
  maskArgs.q_block_size = qBlock;
  maskArgs.kv_block_size = kvBlock;
  maskArgs.num_q_blocks = static_cast<int32_t>(qBlocks);
  maskArgs.max_kv_blocks = static_cast<int32_t>(kvBlocks);
  launches.push_back(describeLaunch(planBlockMaskBuild(maskArgs, params)));
  args.kv_num_blocks = maskArgs.kv_num_blocks;
  args.kv_indices = maskArgs.kv_indices;
  args.full_kv_num_blocks = maskArgs.full_kv_num_blocks;
  args.full_kv_indices = maskArgs.full_kv_indices;
  args.mask_batch = maskArgs.batch;
  args.mask_heads = maskArgs.heads;
  args.num_q_blocks = maskArgs.num_q_blocks;
  args.max_kv_blocks = maskArgs.max_kv_blocks;
  args.q_block_size = qBlock;
  args.kv_block_size = kvBlock;
}

/// A dry run's launch plan, described into `launches`. The dry run has no
/// mask contents: a masked call is planned as one whose visits do not grow
/// (a CTA per tile unless prefill_persistent=1; the warpgroup prefill holds
/// one CTA per SM).
AttentionLaunchPlan planDryRun(const KernelConfig &config, const PagedcAttentionKernelArgs &args,
                               const std::vector<unsigned char> &params, int maxKv, bool masked,
                               const RunOptions &options, std::vector<std::string> &launches) {
  AttentionLaunchPlan plan =
      planAttention(config, args, params, maxKv, options.multiprocessors, 2, -1, options.kernel);
  applyPrefillPersistentRequest(config, plan, options.multiprocessors, !masked, options.kernel);
  for (const KernelLaunch &launch : plan.launches)
    launches.push_back(describeLaunch(launch));
  return plan;
}

} // namespace

//===----------------------------------------------------------------------===//
// check
//===----------------------------------------------------------------------===//

namespace {

struct Comparison {
  double relativeError = 0, lseMaxError = 0;
  int64_t nonFinite = 0, elements = 0;
  std::string problem;
};

Comparison compare(const PackCase &c, const std::vector<uint16_t> &out,
                   const std::vector<float> &lse, const HostTensor &refOut,
                   const HostTensor &refLse) {
  Comparison result;
  const float *ref = refOut.dataAs<float>();
  double errorSquared = 0, refSquared = 0;
  result.elements = static_cast<int64_t>(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const double value = fromBits16(out[i], c.dtype);
    if (!std::isfinite(value)) {
      ++result.nonFinite;
      continue;
    }
    errorSquared += (value - ref[i]) * (value - ref[i]);
    refSquared += double(ref[i]) * ref[i];
  }
  result.relativeError = refSquared > 0 ? std::sqrt(errorSquared / refSquared)
                                        : std::sqrt(errorSquared);
  if (c.returnLse) {
    const float *refL = refLse.dataAs<float>();
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(refL[i]) && refL[i] < 0) {
        if (!(std::isinf(lse[i]) && lse[i] < 0) && result.problem.empty())
          result.problem = fmt::format("lse[{}] = {} but the row is fully masked (-inf)", i,
                                       lse[i]);
        continue;
      }
      if (!std::isfinite(lse[i])) {
        ++result.nonFinite;
        continue;
      }
      result.lseMaxError = std::max(result.lseMaxError, std::fabs(double(lse[i]) - refL[i]));
    }
  }
  return result;
}

} // namespace

std::vector<CaseResult> checkPack(const Pack &pack, const RunOptions &options,
                                  std::ostream &log) {
  std::vector<CaseResult> results;
  BundleCache bundles(pack);
  const std::string arch = runArchitecture(pack, options);
  if (arch != pack.arch)
    log << fmt::format("note: the pack was built for {} but cuda:{} is {}\n", pack.arch,
                       options.device, arch);
  for (const PackCase &c : pack.cases) {
    if (!nameMatches(c.name, options.filter))
      continue;
    const fs::path caseDir = fs::path(pack.directory) / "cases" / c.name;
    std::vector<std::string> variants = {"dense"};
    if (c.qBlock)
      variants.insert(variants.begin(), "block-mask");
    for (const std::string &variant : variants) {
      CaseResult result;
      result.name = c.name;
      result.variant = variant;
      try {
        // Inputs, references, bundle, kernel choice: the same in both modes.
        CaseInputs inputs = generateInputs(c);
        if (inputs.checksum != c.inputChecksum)
          throw Error(fmt::format("regenerated inputs have checksum {} but the pack says {}",
                                  inputs.checksum, c.inputChecksum));
        NpyReadOptions refRead;
        refRead.expectDType = DType::F32;
        refRead.expectShape = std::vector<int64_t>{c.batch, c.headsQ, c.queryLength, c.headDim};
        HostTensor refOut = readNpy((caseDir / "ref_out.npy").string(), refRead);
        refRead.expectShape = std::vector<int64_t>{c.batch, c.headsQ, c.queryLength};
        HostTensor refLse = readNpy((caseDir / "ref_lse.npy").string(), refRead);
        std::vector<HostTensor> hostBuffers = readBuffers(caseDir, c.buffers);

        CompiledMods mods = c.declaredMods();
        mods.cuda.bundle = bundles.get(c.bundle);
        mods.cuda.bundleLabel = c.label;
        const bool useMask = variant == "block-mask";
        const KernelConfig config = chooseCudaAttentionConfig(
            mods, c.dtype, c.headDim, c.pageSize, c.headsQ / c.headsKv, c.queryLength,
            c.returnLse, arch, useMask ? c.kvBlock : 0, options.kernel);
        if (config.kind != c.kind)
          throw Error(fmt::format("the case wants the {} kernel but the bundle gives {}",
                                  kindName(c.kind), kindName(config.kind)));
        result.kernel = config.describe();
        const BundleModule *builder =
            useMask ? findBuilder(*mods.cuda.bundle, c.label, arch) : nullptr;
        if (useMask && !builder)
          throw Error("the bundle has no block-mask builder for " + c.label);
        int64_t maskQLength = 0;
        for (int b = 0; b < c.batch; ++b)
          maskQLength = std::max<int64_t>(maskQLength, c.qOffset[b] + c.queryLength);
        const int64_t maskBatch = c.maskReadsB ? c.batch : 1;
        const int64_t maskHeads = c.maskReadsH ? c.headsQ : 1;

        // The cache's bookkeeping (host side of the device cache).
        const Device device = options.dryRun ? Device::cpu() : Device::cuda(options.device);
        KVCacheConfig cacheConfig;
        cacheConfig.numPages = c.numPages;
        cacheConfig.pageSize = c.pageSize;
        cacheConfig.maxBatch = c.maxBatch;
        cacheConfig.heads = c.headsKv;
        cacheConfig.headDim = cacheConfig.valueHeadDim = c.headDim;
        cacheConfig.dtype = c.dtype;
        cacheConfig.device = device;
        PagedKVCache cache(cacheConfig);
        for (auto [slot, length] : c.reserves)
          cache.reserve(slot, length);
        for (int b = 0; b < c.batch; ++b)
          if (cache.capacity(c.batchIdx[b]) < c.kvLength[b])
            throw Error(fmt::format("the reserves leave slot {} with capacity {} < kv_len {}",
                                    c.batchIdx[b], cache.capacity(c.batchIdx[b]),
                                    c.kvLength[b]));

        if (options.dryRun) {
          FakeAddresses fake;
          Bindings bindings = makeBindings(c.params, c.buffers, fakeViews(fake, hostBuffers));
          ResolvedBindings resolved = resolveBindings(mods, bindings, Device::cuda(0));
          const ParamsLayout layout = ParamsLayout::forDeclarations(mods.params, mods.buffers);
          std::vector<unsigned char> params =
              layout.pack(mods.params, mods.buffers, resolved.context());
          // The page table the backend would upload, in call-batch order.
          std::vector<int32_t> table = cache.densePageTable(c.batchIdx);
          PagedcAttentionKernelArgs args =
              shapedArgs(c.batch, c.headsQ, c.headsKv, c.queryLength, c.headDim, c.numPages,
                         c.pageSize, table.size(), c.scale);
          args.q = fake.take(inputs.q16.numel() * 2);
          args.k_cache = fake.take(1);
          args.v_cache = fake.take(1);
          args.out = fake.take(inputs.q16.numel() * 2);
          args.lse = c.returnLse ? static_cast<float *>(fake.take(refLse.numel() * 4)) : nullptr;
          args.page_table = static_cast<const int32_t *>(fake.take(table.size() * 4));
          args.kv_len = static_cast<const int32_t *>(fake.take(c.batch * 4));
          args.q_offset = static_cast<const int32_t *>(fake.take(c.batch * 4));
          if (useMask) {
            if (builder->config.paramsSize >= 0 &&
                builder->config.paramsSize != static_cast<int64_t>(params.size()))
              throw Error("the builder was compiled for another params layout");
            planFakeMask(fake, maskBatch, maskHeads, maskQLength, c.maxKvLength, c.qBlock,
                         c.kvBlock, params, args, result.launches);
          }
          const int maxKv = *std::max_element(c.kvLength.begin(), c.kvLength.end());
          AttentionLaunchPlan plan =
              planDryRun(config, args, params, maxKv, useMask, options, result.launches);
          if (plan.workspaceBytes)
            result.launches.push_back(fmt::format("workspace {} B", plan.workspaceBytes));
          result.status = "planned";
          result.elements = refOut.numel();
          results.push_back(result);
          continue;
        }

        // On the device: K/V through assign, poisoned outputs, the call.
        const int dev = options.device;
        DeviceBuffer kDevice(inputs.k16.numel() * 2, dev), vDevice(inputs.v16.numel() * 2, dev);
        kDevice.upload(inputs.k16.data(), kDevice.size());
        vDevice.upload(inputs.v16.data(), vDevice.size());
        const std::vector<int64_t> kvStrides = {int64_t(c.headsKv) * c.maxKvLength * c.headDim,
                                                int64_t(c.maxKvLength) * c.headDim, c.headDim, 1};
        for (int b = 0; b < c.batch; ++b) {
          int32_t slot = c.batchIdx[b];
          std::vector<int32_t> positions(static_cast<size_t>(c.kvLength[b]));
          for (int i = 0; i < c.kvLength[b]; ++i)
            positions[i] = i;
          const size_t offset = size_t(b) * kvStrides[0] * 2;
          const std::vector<int64_t> shape = {1, c.headsKv, c.kvLength[b], c.headDim};
          cache.assign(TensorView(&slot, DType::I32, {1}),
                       TensorView(positions.data(), DType::I32, {1, c.kvLength[b]}),
                       TensorView(static_cast<char *>(kDevice.data()) + offset, c.dtype, shape,
                                  kvStrides, device),
                       TensorView(static_cast<char *>(vDevice.data()) + offset, c.dtype, shape,
                                  kvStrides, device));
        }
        DeviceBuffer qDevice(inputs.q16.numel() * 2, dev);
        qDevice.upload(inputs.q16.data(), qDevice.size());
        DeviceBuffer outDevice(inputs.q16.numel() * 2, dev);
        outDevice.fill(0xff); // NaN in f16 and bf16
        DeviceBuffer lseDevice(std::max<size_t>(refLse.numel() * 4, 4), dev);
        lseDevice.fill(0xff);
        std::vector<DeviceBuffer> bufferDevice;
        Bindings bindings =
            makeBindings(c.params, c.buffers, deviceViews(hostBuffers, device, bufferDevice));
        BlockMask hostMask;
        if (useMask) {
          ResolvedBindings resolved = resolveBindings(mods, bindings, device);
          const ParamsLayout layout = ParamsLayout::forDeclarations(mods.params, mods.buffers);
          std::shared_ptr<const CudaKernel> builderKernel =
              cudaKernelFor(mods, builderConfigFor(mods), dev);
          DeviceBlockMask deviceMask = buildBlockMaskCuda(
              *builderKernel, layout.pack(mods.params, mods.buffers, resolved.context()),
              maskBatch, maskHeads, maskQLength, c.maxKvLength, c.qBlock, c.kvBlock, nullptr);
          const CudaDriver &driver = cudaUseDevice(dev);
          driver.check(driver.api().ctxSynchronize(), "cuCtxSynchronize (block-mask build)");
          hostMask = deviceMask.download();
        }
        AttentionOptions attention;
        attention.batchIdx = c.batchIdx;
        attention.kvLength = c.kvLength;
        attention.qOffset = c.qOffset;
        attention.scale = c.scale;
        attention.kernel = options.kernel;
        attention.out = TensorView(outDevice.data(), c.dtype,
                                   {c.batch, c.headsQ, c.queryLength, c.headDim}, device);
        if (c.returnLse)
          attention.lse =
              TensorView(lseDevice.data(), DType::F32, {c.batch, c.headsQ, c.queryLength}, device);
        TensorView q(qDevice.data(), c.dtype, {c.batch, c.headsQ, c.queryLength, c.headDim},
                     device);
        flexAttention(q, cache, useMask ? &hostMask : nullptr, mods, bindings, attention);
        std::vector<uint16_t> out(static_cast<size_t>(inputs.q16.numel()));
        outDevice.download(out.data(), out.size() * 2);
        std::vector<float> lse;
        if (c.returnLse) {
          lse.resize(static_cast<size_t>(refLse.numel()));
          lseDevice.download(lse.data(), lse.size() * 4);
        }
        Comparison comparison = compare(c, out, lse, refOut, refLse);
        result.relativeError = comparison.relativeError;
        result.lseMaxError = comparison.lseMaxError;
        result.nonFinite = comparison.nonFinite;
        result.elements = comparison.elements;
        result.message = comparison.problem;
        const bool pass = comparison.nonFinite == 0 && comparison.problem.empty() &&
                          comparison.relativeError <= c.tolerance &&
                          comparison.lseMaxError <= 2 * c.tolerance;
        result.status = pass ? "pass" : "fail";
        if (!pass && result.message.empty())
          result.message = fmt::format("{} non-finite or unwritten elements, relative error "
                                       "{:.3g} (tolerance {}), lse error {:.3g}",
                                       comparison.nonFinite, comparison.relativeError,
                                       c.tolerance, comparison.lseMaxError);
      } catch (const std::exception &error) {
        result.status = "error";
        result.message = error.what();
      }
      log << fmt::format("{:<8} {} [{}] {}\n", result.status, result.name, result.variant,
                         result.status == "planned" ? result.kernel : result.message);
      results.push_back(std::move(result));
    }
  }
  return results;
}

//===----------------------------------------------------------------------===//
// bench
//===----------------------------------------------------------------------===//

double copyBandwidth(int device, size_t bytes, int iterations) {
  const CudaDriver &driver = cudaUseDevice(device);
  DeviceBuffer source(bytes, device), target(bytes, device);
  source.fill(0x5a);
  CudaTimer timer(device);
  std::vector<float> times;
  for (int i = 0; i < iterations + 2; ++i) {
    timer.start(nullptr);
    driver.check(driver.api().memcpyDtoDAsync(target.address(), source.address(), bytes, nullptr),
                 "cuMemcpyDtoDAsync");
    timer.stop(nullptr);
    const float ms = timer.elapsedMilliseconds();
    if (i >= 2)
      times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return 2.0 * double(bytes) / (times[times.size() / 2] * 1e-3);
}

namespace {

/// `count` calls queued on the null stream without waiting between them,
/// each after an asynchronous write of all of `flush` (which evicts L2).
/// A call is `parts` pieces (`part(i)` enqueues piece i) with an event
/// before, between and after them; returns the milliseconds of each piece,
/// call by call (count vectors of `parts`). The host enqueues the next call
/// while the GPU writes the flush, so the events time the GPU's work, not
/// the submission.
std::vector<std::vector<float>> timeQueuedParts(int device, const DeviceBuffer &flush,
                                                int count, size_t parts,
                                                const std::function<void(size_t)> &part) {
  const CudaDriver &driver = cudaUseDevice(device);
  struct Events {
    const CudaDriver &driver;
    std::vector<cu::Event> list;
    ~Events() {
      for (cu::Event event : list)
        driver.api().eventDestroy(event);
    }
  } events{driver, {}};
  const size_t perCall = parts + 1;
  for (size_t i = 0; i < perCall * size_t(count); ++i) {
    cu::Event event = nullptr;
    driver.check(driver.api().eventCreate(&event, 0), "cuEventCreate");
    events.list.push_back(event);
  }
  for (int i = 0; i < count; ++i) {
    driver.check(driver.api().memsetD8Async(flush.address(), static_cast<unsigned char>(i),
                                            flush.size(), nullptr),
                 "cuMemsetD8Async (L2 flush)");
    for (size_t p = 0; p < parts; ++p) {
      driver.check(driver.api().eventRecord(events.list[perCall * i + p], nullptr),
                   "cuEventRecord");
      part(p);
    }
    driver.check(driver.api().eventRecord(events.list[perCall * i + parts], nullptr),
                 "cuEventRecord");
  }
  driver.check(driver.api().eventSynchronize(events.list.back()), "cuEventSynchronize");
  std::vector<std::vector<float>> times;
  for (int i = 0; i < count; ++i) {
    std::vector<float> call;
    for (size_t p = 0; p < parts; ++p) {
      float ms = 0;
      driver.check(driver.api().eventElapsedTime(&ms, events.list[perCall * i + p],
                                                 events.list[perCall * i + p + 1]),
                   "cuEventElapsedTime");
      call.push_back(ms);
    }
    times.push_back(std::move(call));
  }
  return times;
}

/// " (launches a + b ms)" for a result with launch times, else "".
std::string launchTimesText(const BenchResult &result) {
  if (result.launchQueuedMedianMs.empty())
    return "";
  std::string text;
  for (double ms : result.launchQueuedMedianMs)
    text += fmt::format("{}{:.4f}", text.empty() ? "" : " + ", ms);
  return " (launches " + text + " ms)";
}

/// `count` calls of `call` queued as timeQueuedParts queues them, each one
/// piece: milliseconds per call.
std::vector<float> timeQueued(int device, const DeviceBuffer &flush, int count,
                              const std::function<void()> &call) {
  std::vector<float> times;
  for (const std::vector<float> &parts :
       timeQueuedParts(device, flush, count, 1, [&](size_t) { call(); }))
    times.push_back(parts.front());
  return times;
}

} // namespace

bool nameMatches(const std::string &name, const std::string &filter) {
  size_t from = 0;
  while (true) {
    const size_t comma = filter.find(',', from);
    const std::string text = filter.substr(from, comma == std::string::npos ? comma : comma - from);
    if (name.find(text) != std::string::npos)
      return true;
    if (comma == std::string::npos)
      return false;
    from = comma + 1;
  }
}

std::vector<BenchResult> benchPack(const Pack &pack, const RunOptions &options,
                                   std::ostream &log) {
  std::vector<BenchResult> results;
  BundleCache bundles(pack);
  const std::string arch = runArchitecture(pack, options);
  // A 64 MiB random pattern (bf16 in [-1, 1)) that fills caches and q.
  std::vector<uint16_t> pattern;
  if (!options.dryRun) {
    pattern.resize(size_t(32) << 20);
    PackRandom random(12345);
    for (uint16_t &value : pattern)
      value = toBits16(random.uniform(-1.0f, 1.0f), DType::BF16);
  }
  const int dev = options.device;
  // The queued timing's L2 flush target, allocated at the first timed case.
  std::unique_ptr<DeviceBuffer> flush;
  auto fillRandom = [&](void *data, size_t bytes) {
    const CudaDriver &driver = cudaUseDevice(dev);
    const size_t chunk = pattern.size() * 2;
    for (size_t at = 0; at < bytes; at += chunk)
      driver.check(driver.api().memcpyHtoD(reinterpret_cast<cu::DevicePointer>(data) + at,
                                           pattern.data(), std::min(chunk, bytes - at)),
                   "cuMemcpyHtoD (bench data)");
  };

  for (const BenchCase &b : pack.bench) {
    if (!nameMatches(b.name, options.filter))
      continue;
    BenchResult result;
    result.name = b.name;
    result.kind = kindName(b.kind);
    result.batch = b.batch;
    result.kvLength = b.kvLength;
    result.queryLength = b.queryLength;
    result.pageSize = b.pageSize;
    const double elementBytes = 2;
    if (b.kind == KernelKind::Decode)
      result.bytes = elementBytes * (2.0 * b.batch * b.headsKv * b.kvLength * b.keptFraction *
                                         b.headDim +
                                     2.0 * b.batch * b.headsQ * b.queryLength * b.headDim);
    result.flops = 4.0 * b.batch * b.headsQ * double(b.queryLength) * b.kvLength * b.headDim *
                   b.keptFraction;
    try {
      CompiledMods mods;
      mods.maskName = b.mask;
      mods.scoreName = b.score;
      for (const CaseParam &param : b.params)
        mods.params.push_back(param.decl);
      for (const CaseBuffer &buffer : b.buffers)
        mods.buffers.push_back(buffer.decl);
      mods.maskDependence.b = mods.maskDependence.h = false;
      mods.cuda.bundle = bundles.get(b.bundle);
      mods.cuda.bundleLabel = b.label;
      const KernelConfig config =
          chooseCudaAttentionConfig(mods, DType::BF16, b.headDim, b.pageSize,
                                    b.headsQ / b.headsKv, b.queryLength, false, arch,
                                    b.qBlock ? b.kvBlock : 0, options.kernel);
      if (config.kind != b.kind)
        throw Error(fmt::format("wants the {} kernel, the bundle gives {}", kindName(b.kind),
                                kindName(config.kind)));
      if (b.qBlock && !findBuilder(*mods.cuda.bundle, b.label, arch))
        throw Error("the bundle has no block-mask builder for " + b.label);
      std::vector<HostTensor> hostBuffers = readBuffers(pack.directory, b.buffers);
      const int pagesPerSequence = (b.kvLength + b.pageSize - 1) / b.pageSize;
      const int stored = options.kvSequences > 0 ? std::min(options.kvSequences, b.batch)
                                                 : b.batch;
      const int numPages = stored * pagesPerSequence + stored;
      const int64_t qElements = int64_t(b.batch) * b.headsQ * b.queryLength * b.headDim;
      const int32_t qOffset = b.kind == KernelKind::Decode ? b.kvLength - b.queryLength : 0;

      // The cache bookkeeping: slots grow four pages at a time, round robin,
      // so every page table is scattered over the pool.
      KVCacheConfig cacheConfig;
      cacheConfig.numPages = numPages;
      cacheConfig.pageSize = b.pageSize;
      cacheConfig.maxBatch = stored;
      cacheConfig.heads = b.headsKv;
      cacheConfig.headDim = cacheConfig.valueHeadDim = b.headDim;
      cacheConfig.dtype = DType::BF16;
      cacheConfig.device = options.dryRun ? Device::cpu() : Device::cuda(dev);
      std::unique_ptr<PagedKVCache> cache;
      if (options.dryRun) {
        // Only the tables matter: adopt a 1-byte-per-page stand-in storage.
        cacheConfig.headDim = cacheConfig.valueHeadDim = 1;
        cacheConfig.heads = 1;
      }
      cache = std::make_unique<PagedKVCache>(cacheConfig);
      for (int reserved = 0; reserved < b.kvLength;) {
        reserved = std::min(b.kvLength, reserved + 4 * b.pageSize);
        for (int s = 0; s < stored; ++s)
          cache->reserve(s, reserved);
      }
      std::vector<int32_t> slots(static_cast<size_t>(b.batch));
      for (int s = 0; s < b.batch; ++s)
        slots[s] = s % stored;
      std::vector<int32_t> table = cache->densePageTable(slots);
      std::vector<int32_t> callInts = table;
      callInts.insert(callInts.end(), static_cast<size_t>(b.batch), b.kvLength);
      callInts.insert(callInts.end(), static_cast<size_t>(b.batch), qOffset);

      PagedcAttentionKernelArgs args =
          shapedArgs(b.batch, b.headsQ, b.headsKv, b.queryLength, b.headDim, numPages, b.pageSize,
                     table.size(), 1.0f / std::sqrt(float(b.headDim)));
      const ParamsLayout layout = ParamsLayout::forDeclarations(mods.params, mods.buffers);

      if (options.dryRun) {
        FakeAddresses fake;
        Bindings bindings = makeBindings(b.params, b.buffers, fakeViews(fake, hostBuffers));
        ResolvedBindings resolved = resolveBindings(mods, bindings, Device::cuda(0));
        std::vector<unsigned char> params =
            layout.pack(mods.params, mods.buffers, resolved.context());
        args.q = fake.take(qElements * 2);
        args.out = fake.take(qElements * 2);
        args.k_cache = fake.take(1);
        args.v_cache = fake.take(1);
        args.page_table = static_cast<const int32_t *>(fake.take(callInts.size() * 4));
        args.kv_len = args.page_table + table.size();
        args.q_offset = args.kv_len + b.batch;
        if (b.qBlock)
          planFakeMask(fake, 1, 1, qOffset + b.queryLength, b.kvLength, b.qBlock, b.kvBlock, params,
                       args, result.launches);
        planDryRun(config, args, params, b.kvLength, b.qBlock != 0, options, result.launches);
        result.status = "planned";
      } else {
        const Device device = Device::cuda(dev);
        fillRandom(cache->kCache().data(), size_t(cache->kCache().numel()) * 2);
        fillRandom(cache->vCache().data(), size_t(cache->vCache().numel()) * 2);
        DeviceBuffer qDevice(qElements * 2, dev), outDevice(qElements * 2, dev);
        fillRandom(qDevice.data(), qDevice.size());
        DeviceBuffer callData(callInts.size() * 4, dev);
        callData.upload(callInts.data(), callData.size());
        std::vector<DeviceBuffer> bufferDevice;
        Bindings bindings =
            makeBindings(b.params, b.buffers, deviceViews(hostBuffers, device, bufferDevice));
        ResolvedBindings resolved = resolveBindings(mods, bindings, device);
        std::vector<unsigned char> params =
            layout.pack(mods.params, mods.buffers, resolved.context());
        args.q = qDevice.data();
        args.out = outDevice.data();
        args.k_cache = cache->kCache().data();
        args.v_cache = cache->vCache().data();
        args.page_table = static_cast<const int32_t *>(callData.data());
        args.kv_len = args.page_table + table.size();
        args.q_offset = args.kv_len + b.batch;
        DeviceBlockMask mask;
        if (b.qBlock) {
          std::shared_ptr<const CudaKernel> builder =
              cudaKernelFor(mods, builderConfigFor(mods), dev);
          mask = buildBlockMaskCuda(*builder, params, 1, 1, qOffset + b.queryLength, b.kvLength,
                                    b.qBlock, b.kvBlock, nullptr);
          mask.bind(args);
        }
        // As flexAttention does from its host mask: the span decode rows
        // see bounds the split plan (the mask comes back once, untimed).
        // A prefill's persistent CTAs by default where the mask's visits grow
        // (flexAttention decides from its host mask the same way).
        int64_t maxVisibleKv = -1;
        bool visitsGrow = true;
        if (b.qBlock) {
          const CudaDriver &driver = cudaUseDevice(dev);
          driver.check(driver.api().ctxSynchronize(), "cuCtxSynchronize (block mask)");
          const BlockMask hostMask = mask.download();
          if (b.kind == KernelKind::Decode) {
            const std::vector<int32_t> lengths(size_t(b.batch), b.kvLength),
                offsets(size_t(b.batch), qOffset);
            maxVisibleKv = decodeVisibleSpan(hostMask, b.batch, b.headsQ, b.queryLength,
                                             lengths.data(), offsets.data());
          } else {
            visitsGrow = blockMaskVisitsGrow(hostMask);
          }
        }
        std::shared_ptr<const CudaKernel> kernel = cudaKernelFor(mods, config, dev);
        CudaAttentionLaunch launch(kernel, args, params, b.kvLength, maxVisibleKv,
                                   options.kernel);
        launch.applyLaunchOptions(cache->kCache().size(1), cache->vCache().size(1), visitsGrow);
        for (const KernelLaunch &planned : launch.plan().launches)
          result.launches.push_back(describeLaunch(planned));
        CudaTimer timer(dev);
        for (int i = 0; i < options.warmup; ++i)
          launch.enqueue(nullptr);
        std::vector<float> times;
        for (int i = 0; i < options.iterations; ++i) {
          timer.start(nullptr);
          launch.enqueue(nullptr);
          timer.stop(nullptr);
          times.push_back(timer.elapsedMilliseconds());
        }
        const CudaDriver &driver = cudaUseDevice(dev);
        driver.check(driver.api().ctxSynchronize(), "cuCtxSynchronize (bench)");
        std::sort(times.begin(), times.end());
        result.medianMs = times[times.size() / 2];
        result.minMs = times.front();
        result.maxMs = times.back();
        if (options.queued) {
          if (!flush)
            flush = std::make_unique<DeviceBuffer>(options.flushBytes, dev);
          std::vector<float> queued = timeQueued(dev, *flush, options.iterations,
                                                 [&] { launch.enqueue(nullptr); });
          std::sort(queued.begin(), queued.end());
          result.queuedMedianMs = queued[queued.size() / 2];
          result.queuedMinMs = queued.front();
          result.queuedMaxMs = queued.back();
        }
        // (A call of one launch has its queued time already.)
        if (options.launchTimes && launch.plan().launches.size() > 1) {
          if (!flush)
            flush = std::make_unique<DeviceBuffer>(options.flushBytes, dev);
          const size_t parts = launch.plan().launches.size();
          std::vector<std::vector<float>> calls =
              timeQueuedParts(dev, *flush, options.iterations, parts,
                              [&](size_t index) { launch.enqueueLaunch(index, nullptr); });
          for (size_t p = 0; p < parts; ++p) {
            std::vector<float> times;
            for (const std::vector<float> &call : calls)
              times.push_back(call[p]);
            std::sort(times.begin(), times.end());
            result.launchQueuedMedianMs.push_back(times[times.size() / 2]);
          }
        }
        result.status = "ok";
      }
    } catch (const std::exception &error) {
      result.status = "error";
      result.message = error.what();
    }
    log << fmt::format("{:<8} {} {}\n", result.status, result.name,
                       result.status != "ok" ? result.message
                       : result.queuedMedianMs > 0
                           ? fmt::format("{:.4f} ms (queued {:.4f} ms){}", result.medianMs,
                                         result.queuedMedianMs, launchTimesText(result))
                           : fmt::format("{:.4f} ms{}", result.medianMs,
                                         launchTimesText(result)));
    results.push_back(std::move(result));
  }
  return results;
}

} // namespace pagedc::gpu
