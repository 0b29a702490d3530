//===- KVMemory.h - The default KV memory of a device ----------*- C++ -*-===//
#ifndef PAGEDC_RUNTIME_KVMEMORY_H
#define PAGEDC_RUNTIME_KVMEMORY_H

#include "pagedc/KVCache.h"

#include <memory>

namespace pagedc {

/// The memory of a cache on `device` built without explicit memory: the
/// host's, a registered factory's, or the CUDA backend's. Throws
/// pagedc::Error saying why when the device has none (no CUDA driver).
std::shared_ptr<KVMemory> memoryFor(Device device);

} // namespace pagedc

#endif // PAGEDC_RUNTIME_KVMEMORY_H
