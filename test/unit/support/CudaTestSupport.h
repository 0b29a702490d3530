//===- CudaTestSupport.h - Shared helpers of the CUDA-path unit tests -*- C++ -*-===//
//
// Header-only; test binaries include it as "support/CudaTestSupport.h"
// (pagedc_add_unittest puts test/unit on their include path).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TEST_SUPPORT_CUDATESTSUPPORT_H
#define PAGEDC_TEST_SUPPORT_CUDATESTSUPPORT_H

#include "pagedc/KernelArgs.h"
#include "pagedc/Nvrtc.h"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdlib>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

/// Skips the current test, with the reason, when NVRTC cannot be loaded.
#define REQUIRE_NVRTC()                                                        \
  do {                                                                         \
    std::string reason;                                                        \
    if (!::pagedc::Nvrtc::available(&reason))                                  \
      GTEST_SKIP() << "NVRTC unavailable: " << reason;                         \
  } while (0)

namespace pagedc::test {

/// Sets (or, with a null value, unsets) an environment variable for the
/// scope's lifetime and restores what it was.
class ScopedEnv {
public:
  ScopedEnv(const char *name, const char *value) : name_(name) {
    const char *saved = std::getenv(name);
    hadValue_ = saved != nullptr;
    if (saved)
      saved_ = saved;
    set(value);
  }
  ~ScopedEnv() { set(hadValue_ ? saved_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv &) = delete;
  ScopedEnv &operator=(const ScopedEnv &) = delete;
  void set(const char *value) const {
    if (value)
      setenv(name_, value, 1);
    else
      unsetenv(name_);
  }

private:
  const char *name_;
  std::string saved_;
  bool hadValue_ = false;
};

/// A fresh, empty directory under the system's temporary directory, removed
/// with everything in it at the end of the scope.
class TempDir {
public:
  explicit TempDir(const std::string &prefix = "pagedc-test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (!mkdtemp(pattern.data()))
      throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  const std::string &path() const { return path_; }

private:
  std::string path_;
};

/// Device-looking addresses: never dereferenced on the host.
template <typename T> T *fakeDevicePointer(uintptr_t address) {
  return reinterpret_cast<T *>(address);
}

/// Attention kernel arguments with fake device pointers (q, caches, out,
/// page table, kv_len), for launch plans that are never launched: page
/// table stride 2048, scale 0.125, compact caches of 2048 pages of
/// `pageSize` rows x `headDim` per KV head, q and out strides left zero.
inline PagedcAttentionKernelArgs fakeAttentionArgs(int batch, int headsQ, int headsKv,
                                                   int qLen, int pageSize = 16,
                                                   int headDim = 128) {
  PagedcAttentionKernelArgs args{};
  args.q = fakeDevicePointer<void>(0x7f0000100000);
  args.k_cache = fakeDevicePointer<void>(0x7f0000200000);
  args.v_cache = fakeDevicePointer<void>(0x7f0000300000);
  args.out = fakeDevicePointer<void>(0x7f0000400000);
  args.page_table = fakeDevicePointer<int32_t>(0x7f0000500000);
  args.kv_len = fakeDevicePointer<int32_t>(0x7f0000600000);
  args.batch = batch;
  args.heads_q = headsQ;
  args.heads_kv = headsKv;
  args.q_len = qLen;
  args.page_table_stride = 2048;
  args.scale = 0.125f;
  for (int64_t *stride : {args.k_stride, args.v_stride}) {
    stride[2] = headDim;
    stride[1] = int64_t(pageSize) * headDim;
    stride[0] = 2048 * stride[1];
  }
  return args;
}

} // namespace pagedc::test

#endif // PAGEDC_TEST_SUPPORT_CUDATESTSUPPORT_H
