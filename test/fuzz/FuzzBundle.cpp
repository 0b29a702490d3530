//===- FuzzBundle.cpp - libFuzzer target: the bundle manifest reader ------===//
//
// The input is the text of a bundle's manifest.json (KernelBundle.h).
// KernelBundle::parseManifest() either throws pagedc::Error or returns
// modules whose fields passed its checks. Every accepted manifest is then
// written back (manifestJson()) and parsed again, and each module must be
// found by its own (mods, config, arch). When the manifest names few, small
// modules, the bundle is also written to a directory and read back with
// KernelBundle::read() (checksums of the module files included).
//
// Findings: a crash, a sanitizer report or any exception but pagedc::Error;
// an accepted module with an invalid config or an unsafe file name; a
// manifest that does not survive the round trip; a module find() misses.
//
//===----------------------------------------------------------------------===//

#include "pagedc/Error.h"
#include "pagedc/KernelBundle.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

using namespace pagedc;

namespace {

[[noreturn]] void finding(const std::string &what) {
  std::fprintf(stderr, "pagedc-fuzz-bundle: FINDING: %s\n", what.c_str());
  std::abort();
}

/// A private directory for the read() round trip, removed at exit.
const std::string &scratchDirectory() {
  // Never destroyed, so the exit handler below can still use it.
  static const std::string *directory = [] {
    std::string base = std::filesystem::temp_directory_path().string() +
                       "/pagedc-fuzz-bundle-XXXXXX";
    if (!mkdtemp(base.data()))
      std::abort();
    return new std::string(base);
  }();
  static const bool cleanup = [] {
    return std::atexit([] {
             std::error_code ignored;
             std::filesystem::remove_all(*directory, ignored);
           }) == 0;
  }();
  (void)cleanup;
  return *directory;
}

void checkModule(const KernelBundle &bundle, const BundleModule &module) {
  if (module.file.empty() || module.file.find('/') != std::string::npos ||
      module.file == "." || module.file == "..")
    finding("accepted a module file name that is not a plain name: " +
            module.file);
  if (module.kernelNames.empty())
    finding("accepted a module without kernels");
  try {
    module.config.validate();
  } catch (const Error &error) {
    finding(std::string("accepted an invalid config: ") + error.what());
  }
  if (!bundle.find(module.mods, module.config, module.arch))
    finding("find() misses a module of the bundle");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view text(reinterpret_cast<const char *>(data), size);
  KernelBundle bundle;
  try {
    bundle = KernelBundle::parseManifest(text);
  } catch (const Error &) {
    return 0;
  }
  for (const BundleModule &module : bundle.modules)
    checkModule(bundle, module);

  std::string written = bundle.manifestJson();
  KernelBundle again;
  try {
    again = KernelBundle::parseManifest(written);
  } catch (const Error &error) {
    finding(std::string("manifestJson() output is rejected: ") + error.what());
  }
  if (again.manifestJson() != written)
    finding("manifest -> parse -> manifest is not stable");

  // The directory form, for small bundles: module images are the file names.
  if (bundle.modules.size() > 8)
    return 0;
  for (BundleModule &module : bundle.modules)
    module.image = module.file;
  const std::string &directory = scratchDirectory();
  std::error_code ignored;
  for (const auto &entry : std::filesystem::directory_iterator(directory))
    std::filesystem::remove(entry.path(), ignored);
  try {
    bundle.write(directory);
    KernelBundle::read(directory);
  } catch (const Error &) {
    // Checksums that do not match the written images: an ordinary rejection.
  }
  return 0;
}
