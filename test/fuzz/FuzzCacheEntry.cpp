//===- FuzzCacheEntry.cpp - libFuzzer target: kernel-cache file readers ---===//
//
// The on-disk kernel cache holds two kinds of sealed files (SealedFile.h):
// kernel entries (KernelCache.cpp) and variant files (CudaJit.cpp), whose
// payload starts with the mod declarations (parseModDeclarations). Each
// input is read two ways:
//
//  - raw: the bytes are a cache file as found on disk, given to
//    sealed::open() and to the entry and variant parsers (TestHooks.h);
//  - resealed: the bytes up to the first empty line are header lines and the
//    rest is the payload; they are sealed with correct checksums (and this
//    build's id for variants) before parsing, so the fuzzer gets past the
//    checksums to the field handling.
//
// Declarations that parse are serialized and parsed again and must come back
// the same. Findings: a crash, a sanitizer report, any exception (these
// readers answer false, they do not throw); an accepted file whose fields
// break what the callers rely on; an unstable declaration round trip.
//
//===----------------------------------------------------------------------===//

#include "SealedFile.h"
#include "TestHooks.h"

#include "pagedc/CudaJit.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

using namespace pagedc;

namespace {

[[noreturn]] void finding(const std::string &what) {
  std::fprintf(stderr, "pagedc-fuzz-cache-entry: FINDING: %s\n", what.c_str());
  std::abort();
}

void checkDeclarations(const std::string &text) {
  std::vector<ParamDecl> params;
  std::vector<BufferDecl> buffers;
  if (!parseModDeclarations(text, params, buffers))
    return;
  std::string written = serializeModDeclarations(params, buffers);
  std::vector<ParamDecl> params2;
  std::vector<BufferDecl> buffers2;
  if (!parseModDeclarations(written, params2, buffers2))
    finding("serializeModDeclarations() output is rejected:\n" + written);
  if (serializeModDeclarations(params2, buffers2) != written)
    finding("declarations -> parse -> serialize is not stable:\n" + written);
}

/// The key a file claims, for the parsers that compare it with the one asked.
std::string claimedKey(std::string_view bytes, std::string_view magic) {
  std::map<std::string, std::string> fields;
  std::string_view payload;
  if (!sealed::open(bytes, magic, fields, payload))
    return "";
  if (payload.data() < bytes.data() ||
      payload.data() + payload.size() > bytes.data() + bytes.size())
    finding("sealed::open() returned a payload outside the file");
  return fields["key"];
}

void readEntry(const std::string &bytes) {
  std::string key = claimedKey(bytes, testing::kernelCacheEntryMagic());
  for (const std::string &asked : {key, std::string("0123456789abcdef")}) {
    CompiledKernel kernel;
    if (!testing::parseKernelCacheEntry(bytes, asked, kernel))
      continue;
    if (kernel.key != asked)
      finding("an entry was accepted for another key");
    if (kernel.kernelNames.empty())
      finding("an entry without kernel names was accepted");
  }
}

void readVariant(const std::string &bytes) {
  std::string key = claimedKey(bytes, testing::variantFileMagic());
  testing::VariantFields variant;
  if (!testing::parseVariantFile(bytes, key, variant))
    return;
  if (variant.kernelKeys.empty())
    finding("a variant without kernel keys was accepted");
  if (variant.modCode.empty())
    finding("a variant without mod code was accepted");
  checkDeclarations(variant.declarations);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string bytes(reinterpret_cast<const char *>(data), size);
  readEntry(bytes);
  readVariant(bytes);
  checkDeclarations(bytes);

  size_t split = bytes.find("\n\n");
  std::string header =
      split == std::string::npos ? bytes : bytes.substr(0, split + 1);
  std::string payload =
      split == std::string::npos ? std::string() : bytes.substr(split + 2);
  if (!header.empty() && header.back() != '\n')
    header += '\n';
  readEntry(sealed::seal(testing::kernelCacheEntryMagic(), header, payload));
  std::string variantHeader = header;
  if (variantHeader.find("build=") == std::string::npos)
    variantHeader += "build=" + codegenBuildId() + "\n";
  readVariant(
      sealed::seal(testing::variantFileMagic(), variantHeader, payload));
  return 0;
}
