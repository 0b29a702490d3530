//===- TestHooks.h - Test-only entry points of cache readers -*- C++ -*-===//
//
// The parsers of kernel-cache entries (KernelCache.cpp) and variant files
// (CudaJit.cpp) are private to their files; the runtime reaches them only
// through files on disk. These functions call exactly those parsers on
// bytes in memory, for the fuzz target test/fuzz/FuzzCacheEntry.cpp and
// unit tests. Not part of the runtime's API (the header is not installed);
// nothing in the runtime calls them.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_KERNELS_TESTHOOKS_H
#define PAGEDC_KERNELS_TESTHOOKS_H

#include "pagedc/KernelCache.h"

#include <string>
#include <string_view>
#include <vector>

namespace pagedc::testing {

/// The magic line of kernel-cache entries and of variant files.
std::string_view kernelCacheEntryMagic();
std::string_view variantFileMagic();

/// KernelCache's entry parser: true and `kernel` filled when `bytes` is a
/// well-formed entry for `key`.
bool parseKernelCacheEntry(const std::string &bytes, const std::string &key,
                           CompiledKernel &kernel);

/// What a variant file records (CudaJit.cpp's Variant).
struct VariantFields {
  std::string plugin, mask, score;
  std::vector<std::string> kernelKeys;
  std::string declarations;
  std::string modCode;
};

/// The variant file parser of loadCudaMods(): true and `variant` filled when
/// `bytes` is a well-formed variant file for `key` written by this build
/// (its `build` field is codegenBuildId()).
bool parseVariantFile(const std::string &bytes, const std::string &key,
                      VariantFields &variant);

} // namespace pagedc::testing

#endif // PAGEDC_KERNELS_TESTHOOKS_H
