//===- HostMemory.cpp - Large zeroed host allocations ---------------------===//
#include "HostMemory.h"

#include <algorithm>
#include <cstdlib>

#include <sys/mman.h>

namespace pagedc {

namespace {
/// Blocks this large or larger are mapped (and advised for huge pages).
constexpr size_t kMappedBytes = size_t(4) << 20;
} // namespace

void *allocateZeroedHost(size_t bytes) noexcept {
  if (bytes >= kMappedBytes) {
    void *data =
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED)
      return nullptr;
#ifdef MADV_HUGEPAGE
    ::madvise(data, bytes, MADV_HUGEPAGE); // only advice: failure changes nothing
#endif
    return data;
  }
  return std::calloc(std::max<size_t>(bytes, 1), 1);
}

void freeHost(void *data, size_t bytes) noexcept {
  if (!data)
    return;
  if (bytes >= kMappedBytes)
    ::munmap(data, bytes);
  else
    std::free(data);
}

} // namespace pagedc
