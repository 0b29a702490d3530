//===- RunSupport.cpp - Helpers of `pagedc run` and `pagedc demo` ---------===//

#include "RunSupport.h"

#include <cstdlib>

#include "JIT/CompileSource.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"
#include "OutputFiles.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <tuple>
#include <unistd.h>

using namespace pagedc;
using namespace pagedc::driver;

std::string pagedc::driver::shapeToString(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

HostTensor pagedc::driver::toF32(HostTensor tensor) {
  if (tensor.dtype() == DType::F32)
    return tensor;
  HostTensor result(DType::F32, tensor.shape());
  const auto *bits = tensor.dataAs<uint16_t>();
  float *values = result.dataAs<float>();
  for (int64_t i = 0; i < tensor.numel(); ++i)
    values[i] = tensor.dtype() == DType::F16 ? halfToFloat(bits[i])
                                             : bf16ToFloat(bits[i]);
  return result;
}

void pagedc::driver::selectEmulatorDriver() {
  // Read by CudaDriver at its first use, which has not happened yet.
  ::setenv("PAGEDC_CUDA_DRIVER", "emu", 1);
}

bool pagedc::driver::cudaExecutionUsable(std::string &reason) {
  if (!jit::cudaCodeGenAvailable()) {
    reason = "this build of pagedc has no CUDA code generator";
    return false;
  }
  if (!CudaDriver::available(&reason))
    return false;
  if (CudaDriver::get().deviceCount() == 0) {
    reason = "the driver reports no CUDA device";
    return false;
  }
  return true;
}

DeviceTensor pagedc::driver::uploadTensor(const HostTensor &tensor,
                                          int device) {
  const size_t bytes = tensor.numel() * dtypeSize(tensor.dtype());
  DeviceTensor result{DeviceBuffer(bytes, device), TensorView()};
  if (bytes)
    result.buffer.upload(tensor.data(), bytes);
  std::vector<int64_t> strides(tensor.shape().size(), 1);
  for (int d = static_cast<int>(strides.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * tensor.shape()[d + 1];
  result.view = TensorView(result.buffer.data(), tensor.dtype(),
                           tensor.shape(), strides, Device::cuda(device));
  return result;
}

HostTensor pagedc::driver::fromF32(const HostTensor &tensor, DType dtype) {
  HostTensor result(dtype, tensor.shape());
  const float *values = tensor.dataAs<float>();
  if (dtype == DType::F32) {
    std::copy_n(values, tensor.numel(), result.dataAs<float>());
    return result;
  }
  if (dtype != DType::F16 && dtype != DType::BF16)
    throw Error(std::string("cannot convert f32 to ") + dtypeName(dtype));
  auto *bits = result.dataAs<uint16_t>();
  for (int64_t i = 0; i < tensor.numel(); ++i)
    bits[i] = dtype == DType::F16 ? floatToHalf(values[i])
                                  : floatToBF16(values[i]);
  return result;
}

template <typename Decl>
static std::string listNames(const std::vector<Decl> &decls) {
  if (decls.empty())
    return " (they read none)";
  std::string text = " (they read: ";
  for (size_t i = 0; i < decls.size(); ++i)
    text += (i ? ", " : "") + decls[i].name;
  return text + ")";
}
std::string pagedc::driver::declaredList(const std::vector<BufferDecl> &decls) {
  return listNames(decls);
}
std::string pagedc::driver::declaredList(const std::vector<ParamDecl> &decls) {
  return listNames(decls);
}

int64_t pagedc::driver::contiguousPageSize(int64_t length) {
  int64_t size = 1;
  while (size < length && size < 1024)
    size *= 2;
  return size;
}

PageShuffler::PageShuffler(PagedKVCache &cache, int64_t scratchSlot,
                           uint64_t seed)
    : cache_(cache), scratch_(scratchSlot),
      state_(seed * 0x9E3779B97F4A7C15ull + 1) {}

uint64_t PageShuffler::next(uint64_t bound) {
  // splitmix64: the same sequence on every platform.
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) % bound;
}

void PageShuffler::reserve(const std::vector<int64_t> &slots,
                           const std::vector<int64_t> &lengths) {
  const int64_t pageSize = cache_.pageSize();
  auto pagesMissing = [&](size_t i) {
    int64_t needed = (lengths[i] + pageSize - 1) / pageSize;
    return std::max<int64_t>(0, needed - cache_.capacity(slots[i]) / pageSize);
  };
  for (;;) {
    std::vector<size_t> growing;
    int64_t missing = 0;
    for (size_t i = 0; i < slots.size(); ++i)
      if (int64_t pages = pagesMissing(i)) {
        growing.push_back(i);
        missing += pages;
      }
    if (growing.empty())
      break;
    // The scratch slot may take a page while that leaves enough for the rest.
    bool scratchMayTake = cache_.freePageCount() > missing;
    uint64_t pick = next(growing.size() + (scratchMayTake ? 1 : 0));
    int64_t slot = pick < growing.size() ? slots[growing[pick]] : scratch_;
    cache_.reserve(slot, cache_.capacity(slot) + pageSize);
    // Giving the scratch pages back puts them at the free list's tail in
    // their order, so later pages come out in reverse: tables lose order.
    if (next(3) == 0)
      cache_.erase(scratch_);
  }
  cache_.erase(scratch_);
}

KVRows::KVRows(const HostTensor &tensor)
    : tensor_(&tensor), dtype_(tensor.dtype()), shape_(tensor.shape()) {}
KVRows::KVRows(const NpyFile &file)
    : file_(&file), dtype_(file.dtype()), shape_(file.shape()) {}

void KVRows::read(int64_t b, int64_t h, int64_t t0, int64_t n, DType target,
                  void *out) const {
  const int64_t dim = shape_[3];
  const int64_t count = n * dim;
  const size_t sourceSize = dtypeSize(dtype_);
  const int64_t first = ((b * shape_[1] + h) * shape_[2] + t0) * dim;
  const void *source = nullptr;
  if (tensor_) {
    source = static_cast<const char *>(tensor_->data()) + first * sourceSize;
  } else if (dtype_ == target) {
    file_->readData(first * sourceSize, out, count * sourceSize);
    return;
  } else {
    scratch_.resize(count * sourceSize);
    file_->readData(first * sourceSize, scratch_.data(), count * sourceSize);
    source = scratch_.data();
  }
  if (dtype_ == target) {
    std::memcpy(out, source, count * sourceSize);
    return;
  }
  auto load = [&](int64_t i) -> float {
    if (dtype_ == DType::F32)
      return static_cast<const float *>(source)[i];
    uint16_t bits = static_cast<const uint16_t *>(source)[i];
    return dtype_ == DType::F16 ? halfToFloat(bits) : bf16ToFloat(bits);
  };
  for (int64_t i = 0; i < count; ++i) {
    float value = load(i);
    if (target == DType::F32)
      static_cast<float *>(out)[i] = value;
    else
      static_cast<uint16_t *>(out)[i] =
          target == DType::F16 ? floatToHalf(value) : floatToBF16(value);
  }
}

std::unique_ptr<PagedKVCache>
pagedc::driver::buildCache(const KVRows &k, const KVRows &v,
                           const std::vector<int64_t> &lengths,
                           int64_t pageSize, std::optional<uint64_t> shuffleSeed,
                           DType dtype, Device device, int64_t pagesPerReserve) {
  const auto &ks = k.shape(), &vs = v.shape();
  const int64_t batch = ks[0], heads = ks[1];
  int64_t pages = 0;
  for (int64_t tokens : lengths)
    pages += (tokens + pageSize - 1) / pageSize;
  KVCacheConfig config;
  config.pageSize = pageSize;
  config.heads = heads;
  config.headDim = ks[3];
  config.valueHeadDim = vs[3];
  config.dtype = dtype;
  config.device = device;
  config.maxBatch = batch + (shuffleSeed ? 1 : 0);
  config.numPages = shuffleSeed ? pages + pages / 2 + 2 : std::max<int64_t>(pages, 1);
  auto cache = std::make_unique<PagedKVCache>(config);

  std::vector<int64_t> slots(batch);
  std::iota(slots.begin(), slots.end(), 0);
  if (shuffleSeed) {
    PageShuffler shuffler(*cache, batch, *shuffleSeed);
    shuffler.reserve(slots, lengths);
  } else if (pagesPerReserve > 0) {
    // The free list's tail is its lowest page: each reserve takes the next
    // pagesPerReserve pages, handed out in descending order (one page per
    // reserve climbs).
    const int64_t step = pagesPerReserve * pageSize;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t tokens = step; tokens < lengths[b] + step; tokens += step)
        cache->reserve(b, std::min(tokens, lengths[b]));
  } else {
    for (int64_t b = 0; b < batch; ++b)
      cache->reserve(b, lengths[b]);
  }
  // On the CPU, rows already in the cache's dtype are read straight into
  // the pages the slots own (one read per head and page, no staging copy):
  // what assign() would do, as the cache's layout is [Hkv, pages, pageSize,
  // D] and each page holds consecutive positions of one slot.
  if (device.kind == DeviceKind::CPU && k.dtype() == dtype && v.dtype() == dtype) {
    const int64_t elementSize = static_cast<int64_t>(dtypeSize(dtype));
    const int64_t numPages = cache->numPages();
    for (const auto &[rows, storage, dim] :
         {std::tuple{&k, cache->kCache(), ks[3]}, std::tuple{&v, cache->vCache(), vs[3]}}) {
      auto *base = static_cast<char *>(storage.data());
      for (int64_t b = 0; b < batch; ++b) {
        const std::vector<int32_t> &table = cache->pageTable(b);
        for (int64_t p = 0; p * pageSize < lengths[b]; ++p) {
          const int64_t n = std::min(pageSize, lengths[b] - p * pageSize);
          for (int64_t h = 0; h < heads; ++h)
            rows->read(b, h, p * pageSize, n, dtype,
                       base + (h * numPages + table[p]) * pageSize * dim * elementSize);
        }
      }
    }
    return cache;
  }
  // assign() a bounded piece at a time (about 8 MiB of K and of V), so the
  // input never exists a second time in full: rows of K/V in the cache's
  // dtype, on its device (the CUDA assign synchronises before returning, so
  // the staging buffers may be reused right after).
  const int64_t elementSize = static_cast<int64_t>(dtypeSize(dtype));
  const int64_t rowBytes = heads * std::max(ks[3], vs[3]) * elementSize;
  const int64_t chunk = std::max<int64_t>(1, (int64_t(8) << 20) / rowBytes);
  const int64_t maxTokens = std::min(chunk, ks[2]);
  std::vector<uint8_t> kHost(heads * maxTokens * ks[3] * elementSize);
  std::vector<uint8_t> vHost(heads * maxTokens * vs[3] * elementSize);
  DeviceBuffer kDevice, vDevice;
  if (device.kind == DeviceKind::CUDA) {
    kDevice = DeviceBuffer(kHost.size(), device.index);
    vDevice = DeviceBuffer(vHost.size(), device.index);
  }
  HostTensor batchIdx(DType::I32, {1});
  HostTensor positions(DType::I32, {1, maxTokens});
  for (int64_t b = 0; b < batch; ++b) {
    batchIdx.dataAs<int32_t>()[0] = static_cast<int32_t>(b);
    for (int64_t t0 = 0; t0 < lengths[b]; t0 += maxTokens) {
      const int64_t n = std::min(maxTokens, lengths[b] - t0);
      for (int64_t h = 0; h < heads; ++h) {
        k.read(b, h, t0, n, dtype, kHost.data() + h * n * ks[3] * elementSize);
        v.read(b, h, t0, n, dtype, vHost.data() + h * n * vs[3] * elementSize);
      }
      void *kData = kHost.data(), *vData = vHost.data();
      if (device.kind == DeviceKind::CUDA) {
        kDevice.upload(kHost.data(), heads * n * ks[3] * elementSize);
        vDevice.upload(vHost.data(), heads * n * vs[3] * elementSize);
        kData = kDevice.data();
        vData = vDevice.data();
      }
      std::iota(positions.dataAs<int32_t>(), positions.dataAs<int32_t>() + n,
                static_cast<int32_t>(t0));
      TensorView pos(positions.data(), DType::I32, {1, n});
      cache->assign(batchIdx.view(), pos, TensorView(kData, dtype, {1, heads, n, ks[3]}, device),
                    TensorView(vData, dtype, {1, heads, n, vs[3]}, device));
    }
  }
  return cache;
}

void pagedc::driver::writeFilesAtomically(
    const std::vector<std::pair<std::string, std::vector<uint8_t>>> &files) {
  std::vector<files::OutputFile> outputs;
  for (const auto &[path, bytes] : files)
    outputs.push_back({{"output", path}, bytes});
  files::writeAll(outputs);
}
