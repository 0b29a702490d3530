//===- RunSupport.cpp - Helpers of `pagedc run` and `pagedc demo` ---------===//

#include "RunSupport.h"

#include <cstdlib>

#include "JIT/CompileSource.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>
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

std::unique_ptr<PagedKVCache>
pagedc::driver::buildCache(const HostTensor &k, const HostTensor &v,
                           const std::vector<int64_t> &lengths,
                           int64_t pageSize, std::optional<uint64_t> shuffleSeed,
                           DType dtype, Device device) {
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
  } else {
    for (int64_t b = 0; b < batch; ++b)
      cache->reserve(b, lengths[b]);
  }
  // The rows assign() reads: K/V in the cache's dtype, on its device. The
  // CUDA assign synchronises before returning, so the uploads may go after.
  HostTensor kValues = fromF32(k, dtype), vValues = fromF32(v, dtype);
  const char *kBase = static_cast<const char *>(kValues.data());
  const char *vBase = static_cast<const char *>(vValues.data());
  DeviceBuffer kDevice, vDevice;
  if (device.kind == DeviceKind::CUDA) {
    const size_t kBytes = kValues.numel() * dtypeSize(dtype);
    const size_t vBytes = vValues.numel() * dtypeSize(dtype);
    kDevice = DeviceBuffer(kBytes, device.index);
    vDevice = DeviceBuffer(vBytes, device.index);
    kDevice.upload(kValues.data(), kBytes);
    vDevice.upload(vValues.data(), vBytes);
    kBase = static_cast<const char *>(kDevice.data());
    vBase = static_cast<const char *>(vDevice.data());
  }
  const int64_t elementSize = static_cast<int64_t>(dtypeSize(dtype));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t tokens = lengths[b];
    if (tokens == 0)
      continue;
    HostTensor batchIdx(DType::I32, {1});
    batchIdx.dataAs<int32_t>()[0] = static_cast<int32_t>(b);
    HostTensor positions(DType::I32, {1, tokens});
    std::iota(positions.dataAs<int32_t>(), positions.dataAs<int32_t>() + tokens, 0);
    auto rows = [&](const HostTensor &t, const char *data) {
      const auto &s = t.shape();
      const char *base = data + b * s[1] * s[2] * s[3] * elementSize;
      return TensorView(const_cast<char *>(base), dtype,
                        {1, s[1], tokens, s[3]},
                        {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1}, device);
    };
    cache->assign(batchIdx.view(), positions.view(), rows(k, kBase),
                  rows(v, vBase));
  }
  return cache;
}

void pagedc::driver::writeFilesAtomically(
    const std::vector<std::pair<std::string, std::vector<uint8_t>>> &files) {
  std::vector<std::string> temporaries;
  auto cleanUp = [&] {
    for (const std::string &path : temporaries)
      std::remove(path.c_str());
  };
  for (const auto &[path, bytes] : files) {
    std::string temporary =
        path + ".tmp-" + std::to_string(static_cast<long>(::getpid()));
    FILE *file = std::fopen(temporary.c_str(), "wb");
    if (!file) {
      int error = errno;
      cleanUp();
      throw Error("cannot write '" + path + "': " + std::strerror(error));
    }
    temporaries.push_back(temporary);
    bool ok = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
    ok = std::fclose(file) == 0 && ok;
    if (!ok) {
      cleanUp();
      throw Error("cannot write '" + path + "': write failed");
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (std::rename(temporaries[i].c_str(), files[i].first.c_str()) != 0) {
      int error = errno;
      // Files already renamed stay (they are complete); the rest go.
      for (size_t j = i; j < temporaries.size(); ++j)
        std::remove(temporaries[j].c_str());
      throw Error("cannot write '" + files[i].first + "': " +
                  std::strerror(error));
    }
  }
}
