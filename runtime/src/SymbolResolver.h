//===- SymbolResolver.h - Entry points of a dlopened library ---*- C++ -*-===//
//
// The CUDA libraries (the driver, NVRTC, nvJitLink) are loaded at run time
// so that pagedc builds and runs without them; each loader fills a struct
// of function pointers through one of these.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_SYMBOLRESOLVER_H
#define PAGEDC_RUNTIME_SYMBOLRESOLVER_H

#include <dlfcn.h>

#include <string>
#include <type_traits>

namespace pagedc {

/// Sets function-pointer slots from `handle`'s symbols; a missing symbol
/// leaves its slot null and its name in `missing` (" name" each).
struct SymbolResolver {
  void *handle;
  std::string missing;

  template <typename Slot> void operator()(Slot &slot, const char *name) {
    void *symbol = dlsym(handle, name);
    if (!symbol)
      missing += std::string(" ") + name;
    slot = reinterpret_cast<std::remove_reference_t<Slot>>(symbol);
  }
};

} // namespace pagedc

#endif // PAGEDC_RUNTIME_SYMBOLRESOLVER_H
