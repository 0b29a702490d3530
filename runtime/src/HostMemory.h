//===- HostMemory.h - Large zeroed host allocations -------------*- C++ -*-===//
//
// The host memory behind pagedc's own buffers (HostTensor, the host KV
// cache). Blocks of 4 MiB or more are anonymous mappings advised for
// transparent huge pages: attention streams them, and with 4 KiB pages every
// 4 KiB of a K or V stream is a TLB miss and a restart of the hardware
// prefetcher, while a fresh 2 MiB page is also one fault instead of 512.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_HOSTMEMORY_H
#define PAGEDC_RUNTIME_HOSTMEMORY_H

#include <cstddef>

namespace pagedc {

/// `bytes` zeroed bytes (at least one, so the pointer is never null), or
/// nullptr when the system has no memory for them.
void *allocateZeroedHost(size_t bytes) noexcept;
/// Frees a block of allocateZeroedHost(bytes) (nullptr is ignored).
void freeHost(void *data, size_t bytes) noexcept;

} // namespace pagedc

#endif
