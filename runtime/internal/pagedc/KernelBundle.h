//===- KernelBundle.h - Precompiled kernels the runtime loads --*- C++ -*-===//
//
// A bundle is a directory of cubins plus `manifest.json`, written by the
// compiler side (or `pagedc --emit=bundle`) and read by an application that
// ships the runtime alone, without NVRTC:
//
//   {
//     "format": "pagedc-kernel-bundle", "version": 1,
//     "modules": [
//       { "file": "decode-<key>.cubin", "arch": "sm_90", "key": "<32 hex>",
//         "checksum": "<16 hex XXH3-64 of the file>", "image": "cubin",
//         "kernels": ["pagedc_decode", "pagedc_decode_merge"],
//         "threads": 128, "shared_memory": 83456,
//         "config": { "kind": "decode", "dtype": "bf16", "head_dim": 128,
//                     "page_size": 16, "block_m": 64, "block_n": 64,
//                     "group_size": 4, "query_tokens": 1,
//                     "return_lse": false, "params_size": -1 },
//         "mods": "causal" }
//     ]
//   }
//
// `mods` is a free-form label naming the mod program a module was built
// from (the runtime matches it with the application's own name).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_KERNELBUNDLE_H
#define PAGEDC_KERNELBUNDLE_H

#include "pagedc/KernelCache.h"

#include <string>
#include <string_view>
#include <vector>

namespace pagedc {

struct BundleModule {
  std::string file;
  std::string arch;
  std::string key;
  std::string checksum;
  CompileOptions::Output output = CompileOptions::Output::Cubin;
  std::vector<std::string> kernelNames;
  int threads = 0;
  int sharedMemoryBytes = 0;
  KernelConfig config;
  std::string mods;
  /// The module's bytes (filled by KernelBundle::read, or by add()).
  std::string image;
};

class KernelBundle {
public:
  std::vector<BundleModule> modules;

  /// Adds a compiled kernel under a mod-program label.
  void add(const CompiledKernel &kernel, std::string modsLabel);
  /// The module for (mods label, config, arch), or null.
  const BundleModule *find(std::string_view modsLabel, const KernelConfig &config,
                           std::string_view arch) const;

  /// The manifest text.
  std::string manifestJson() const;
  /// Parses a manifest (images left empty). Throws pagedc::Error naming the
  /// field on malformed input.
  static KernelBundle parseManifest(std::string_view json);

  /// Writes the module files and manifest.json into `directory` (created if
  /// needed) through the runtime's one output writer: temporary files renamed
  /// into place together, so on failure none of them appears. Throws
  /// pagedc::Error naming the path when checkBundleDirectory() refuses it or
  /// a write fails.
  void write(const std::string &directory) const;
  /// Throws pagedc::Error unless `directory` is a writable directory or can
  /// be created (its nearest existing ancestor is a writable directory): an
  /// existing file in its place is refused, never replaced.
  static void checkBundleDirectory(const std::string &directory);
  /// The largest manifest or module file read(): a module is one kernel's
  /// cubin or PTX (under a megabyte). A larger file, or one that is not a
  /// regular file (a FIFO is never waited on), is an error naming it.
  static constexpr uint64_t kMaxFileBytes = uint64_t(64) << 20;
  /// Reads manifest.json and every module, verifying each checksum.
  static KernelBundle read(const std::string &directory);
};

} // namespace pagedc

#endif // PAGEDC_KERNELBUNDLE_H
