//===- KVMemory.cpp - Where a paged KV cache's pages live -----------------===//
//
// The storage seam of PagedKVCache (pagedc/KVCache.h): the built-in host
// memory, the factories an application registers, and the default memory
// of each device kind. The cache itself knows no backend; it asks
// memoryFor() for the memory of its device.
//
//===----------------------------------------------------------------------===//
#include "KVMemory.h"
#include "HostMemory.h"
#include "pagedc/Error.h"

#include "cuda/CudaAttention.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <mutex>

namespace pagedc {

void checkScatterRows(const TensorView &values, const TensorView &cache, const int64_t *slots) {
  if (values.rank() != 4)
    throw Error(fmt::format("scatterRows: values must be [B, H, S, D] but has shape {}",
                            values.shapeString()));
  if (cache.rank() != 3)
    throw Error(fmt::format("scatterRows: cache must be [H, rows, D] but has shape {}",
                            cache.shapeString()));
  if (values.dtype() != cache.dtype())
    throw Error(fmt::format("scatterRows: values are {} but the cache is {}",
                            dtypeName(values.dtype()), dtypeName(cache.dtype())));
  if (cache.size(0) != values.size(1) || cache.size(2) != values.size(3))
    throw Error(fmt::format("scatterRows: cache {} must have values' H = {} and D = {} (values "
                            "are {})",
                            cache.shapeString(), values.size(1), values.size(3),
                            values.shapeString()));
  if (!cache.isContiguous())
    throw Error("scatterRows: cache must be compact (row-major)");
  const int64_t count = values.size(0) * values.size(2);
  if (count == 0 || values.size(1) == 0 || values.size(3) == 0)
    return;
  if (values.data() == nullptr || cache.data() == nullptr || slots == nullptr)
    throw Error("scatterRows: values, cache and slots must have data");
  for (int64_t i = 0; i < count; ++i)
    if (slots[i] < 0 || slots[i] >= cache.size(1))
      throw Error(fmt::format("scatterRows: slots[{}] = {} is out of range [0, {}) (the cache's "
                              "rows)",
                              i, slots[i], cache.size(1)));
}

namespace {

class HostKVMemory final : public KVMemory {
public:
  Device device() const override { return Device::cpu(); }

  // Zeroed, and in huge pages when large (HostMemory.h): filling 512 MB of
  // fresh 4 KiB pages costs more in page faults than the copy itself.
  void *allocate(size_t bytes) override {
    void *data = allocateZeroedHost(bytes);
    if (!data)
      throw Error(fmt::format("out of host memory allocating {} bytes for the KV cache", bytes));
    return data;
  }

  void upload(void *dst, const void *src, size_t bytes) override {
    if (bytes)
      std::memcpy(dst, src, bytes);
  }

  void deallocate(void *data, size_t bytes) noexcept override { freeHost(data, bytes); }

  void copy(void *dst, const void *src, size_t bytes) override { std::memmove(dst, src, bytes); }

  void scatterRows(const TensorView &values, const TensorView &cache,
                   const int64_t *slots) override {
    checkScatterRows(values, cache, slots);
    const size_t elementSize = dtypeSize(values.dtype());
    const int64_t batch = values.size(0), heads = values.size(1), seqLen = values.size(2),
                  dim = values.size(3);
    const int64_t rows = cache.size(1);
    const auto *source = static_cast<const unsigned char *>(values.data());
    auto *target = static_cast<unsigned char *>(cache.data());
    const size_t rowBytes = static_cast<size_t>(dim) * elementSize;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t s = 0; s < seqLen; ++s) {
          const unsigned char *from =
              source + (b * values.stride(0) + h * values.stride(1) + s * values.stride(2)) *
                           static_cast<int64_t>(elementSize);
          unsigned char *to = target + ((h * rows + slots[b * seqLen + s]) * dim) *
                                           static_cast<int64_t>(elementSize);
          if (values.stride(3) == 1) {
            std::memcpy(to, from, rowBytes);
            continue;
          }
          for (int64_t d = 0; d < dim; ++d)
            std::memcpy(to + d * elementSize,
                        from + d * values.stride(3) * static_cast<int64_t>(elementSize),
                        elementSize);
        }
  }
};

std::mutex registryMutex;
std::map<DeviceKind, KVMemoryFactory> &memoryFactories() {
  static std::map<DeviceKind, KVMemoryFactory> factories;
  return factories;
}

} // namespace

std::shared_ptr<KVMemory> memoryFor(Device device) {
  if (device.kind == DeviceKind::CPU)
    return hostKVMemory();
  KVMemoryFactory factory;
  {
    std::lock_guard<std::mutex> lock(registryMutex);
    auto it = memoryFactories().find(device.kind);
    if (it != memoryFactories().end())
      factory = it->second;
  }
  if (!factory && device.kind == DeviceKind::CUDA)
    return cuda::kvMemory(device); // throws the driver's reason without one
  if (!factory)
    throw Error(
        fmt::format("KV cache memory on {} is not available in this build", deviceName(device)));
  return factory(device);
}

void KVMemory::upload(void *, const void *, size_t) {
  throw Error(fmt::format("the KV memory of {} takes no host data", deviceName(device())));
}

std::shared_ptr<KVMemory> hostKVMemory() {
  static std::shared_ptr<KVMemory> memory = std::make_shared<HostKVMemory>();
  return memory;
}

void setKVMemoryFactory(DeviceKind kind, KVMemoryFactory factory) {
  std::lock_guard<std::mutex> lock(registryMutex);
  memoryFactories()[kind] = std::move(factory);
}

} // namespace pagedc
