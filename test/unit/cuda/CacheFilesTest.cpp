//===- CacheFilesTest.cpp - Cache files of every size and type ------------===//
//
// Every file the kernel cache reads (kernel entries, emulator images inside
// them, variant files through the same reader) and the bundle reader, given
// files that are truncated, extended, sparse at 64 GiB, FIFOs, directories
// or symlinks: a cache file is dropped and rebuilt, a bundle file is an
// error naming it; nothing aborts, blocks or sizes a buffer from the file.
// Emulator images are checked as ELF objects before they are sealed and
// when read back.
//
//===----------------------------------------------------------------------===//

#include "SealedFile.h"
#include "TestHooks.h"

#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"
#include "pagedc/KernelBundle.h"
#include "pagedc/KernelCache.h"
#include "support/CudaTestSupport.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

using namespace pagedc;
namespace fs = std::filesystem;
using pagedc::test::TempDir;

namespace {

std::string readFile(const fs::path &path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

void writeFile(const fs::path &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// A file of `size` bytes that occupies no disk blocks.
void writeSparse(const fs::path &path, uint64_t size) {
  writeFile(path, "");
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0);
}

/// Each way a cache file can be damaged, given its intact bytes.
using Damage = std::function<void(const fs::path &, const std::string &)>;
std::map<std::string, Damage> damages() {
  return {
      {"truncated",
       [](const fs::path &p, const std::string &b) { writeFile(p, b.substr(0, b.size() / 2)); }},
      {"extended",
       [](const fs::path &p, const std::string &b) { writeFile(p, b + std::string(4096, '\0')); }},
      {"sparse-64g",
       [](const fs::path &p, const std::string &) { writeSparse(p, uint64_t(64) << 30); }},
      {"fifo",
       [](const fs::path &p, const std::string &) { ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0); }},
      {"directory",
       [](const fs::path &p, const std::string &) { fs::create_directories(p / "sub"); }},
      {"symlink-dev-zero",
       [](const fs::path &p, const std::string &) { fs::create_symlink("/dev/zero", p); }},
  };
}

KernelConfig cheapConfig() {
  KernelConfig config;
  config.kind = KernelKind::BlockMaskBuilder;
  return config;
}
std::string cheapMods() { return std::string(embeddedTemplate("testing/causal.cuh")); }

CompileOptions emulatorOptions() {
  CompileOptions options;
  options.arch = std::string(kEmulatorArch);
  return options;
}

/// Sets an environment variable for the scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string name, const std::string &value) : name(std::move(name)) {
    ::setenv(this->name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

} // namespace

// The reader every cache file goes through: the size and type come from
// fstat before a byte is read or a buffer sized.
TEST(SealedFileRead, RefusesWhatIsNotABoundedRegularFile) {
  TempDir dir("pagedc-cache-files");
  const fs::path base = dir.path();
  std::string bytes;
  writeFile(base / "small", "12345");
  EXPECT_EQ(sealed::readEntryFile(base / "small", bytes, 5), sealed::ReadStatus::Read);
  EXPECT_EQ(bytes, "12345");
  EXPECT_EQ(sealed::readEntryFile(base / "small", bytes, 4), sealed::ReadStatus::TooLarge);

  writeSparse(base / "sparse", uint64_t(64) << 30);
  bytes = "untouched";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sealed::readEntryFile(base / "sparse", bytes, KernelCache::kMaxEntryBytes),
            sealed::ReadStatus::TooLarge);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(bytes, "untouched"); // no buffer was sized from the file

  ASSERT_EQ(::mkfifo((base / "fifo").c_str(), 0600), 0); // no writer: a blocking open hangs
  EXPECT_EQ(sealed::readEntryFile(base / "fifo", bytes, 100), sealed::ReadStatus::NotRegular);
  fs::create_directory(base / "dir");
  EXPECT_EQ(sealed::readEntryFile(base / "dir", bytes, 100), sealed::ReadStatus::NotRegular);
  fs::create_symlink(base / "small", base / "link");
  EXPECT_EQ(sealed::readEntryFile(base / "link", bytes, 100), sealed::ReadStatus::NotRegular);
  EXPECT_EQ(sealed::readEntryFile(base / "none", bytes, 100), sealed::ReadStatus::Missing);
  EXPECT_TRUE(sealed::isCorrupt(sealed::ReadStatus::TooLarge));
  EXPECT_TRUE(sealed::isCorrupt(sealed::ReadStatus::NotRegular));
  EXPECT_FALSE(sealed::isCorrupt(sealed::ReadStatus::Missing));
}

// Kernel entries holding emulator images (built by the host compiler, so
// the test needs no NVRTC), damaged each way: a miss, the file removed and
// rebuilt, the rebuilt entry a disk hit for the next cache.
TEST(CacheFiles, DamagedEmulatorEntriesAreDroppedAndRebuilt) {
  TempDir dir("pagedc-cache-files");
  std::string key;
  {
    KernelCache cache(dir.path());
    key = cache.getOrCompile(cheapConfig(), cheapMods(), emulatorOptions())->key;
  }
  const fs::path path = KernelCache(dir.path()).entryPath(key);
  const std::string intact = readFile(path);
  ASSERT_GT(intact.size(), 1000u);
  for (const auto &[name, damage] : damages()) {
    SCOPED_TRACE(name);
    fs::remove_all(path);
    damage(path, intact);
    KernelCache cache(dir.path());
    auto kernel = cache.getOrCompile(cheapConfig(), cheapMods(), emulatorOptions());
    EXPECT_EQ(cache.stats().corruptEntries, 1u);
    EXPECT_EQ(cache.stats().compiles, 1u);
    EXPECT_EQ(checkEmulatorImage(kernel->image), "");
    struct stat info;
    ASSERT_EQ(::lstat(path.c_str(), &info), 0);
    EXPECT_TRUE(S_ISREG(info.st_mode));
    EXPECT_LT(info.st_size, 1 << 24);
    KernelCache again(dir.path());
    again.getOrCompile(cheapConfig(), cheapMods(), emulatorOptions());
    EXPECT_EQ(again.stats().diskHits, 1u);
  }
}

// An entry whose checksums are intact but whose emulator image is a
// truncated shared object (sealed by a build without the check, or by a
// compiler that wrote half a file): dlopen of it faults with SIGBUS, so the
// reader checks the ELF object and drops the entry.
TEST(CacheFiles, SealedTruncatedEmulatorImageIsDropped) {
  TempDir dir("pagedc-cache-files");
  std::string key;
  {
    KernelCache cache(dir.path());
    key = cache.getOrCompile(cheapConfig(), cheapMods(), emulatorOptions())->key;
  }
  const fs::path path = KernelCache(dir.path()).entryPath(key);
  std::map<std::string, std::string> fields;
  std::string_view image;
  const std::string intact = readFile(path);
  ASSERT_TRUE(sealed::open(intact, pagedc::testing::kernelCacheEntryMagic(), fields, image));
  ASSERT_EQ(checkEmulatorImage(image), "");
  // Half the library, behind an image header that records the half.
  const size_t kept = (image.size() - 24) / 2;
  std::string truncated(image.substr(0, 16));
  for (int i = 0; i < 8; ++i)
    truncated += static_cast<char>((uint64_t(kept) >> (8 * i)) & 0xff);
  truncated += image.substr(24, kept);
  EXPECT_NE(checkEmulatorImage(truncated), "");
  std::string header;
  for (const char *name : {"key", "arch", "kernels", "config", "image", "spills"})
    header += std::string(name) + "=" + fields[name] + "\n";
  writeFile(path, sealed::seal(pagedc::testing::kernelCacheEntryMagic(), header, truncated));

  KernelCache cache(dir.path());
  auto kernel = cache.getOrCompile(cheapConfig(), cheapMods(), emulatorOptions());
  EXPECT_EQ(cache.stats().corruptEntries, 1u);
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(checkEmulatorImage(kernel->image), "");
}

// A host compiler that leaves a truncated library (killed, or out of disk
// space, mid-write): the build fails with an error naming the problem and
// nothing is sealed into the cache.
TEST(CacheFiles, TruncatedEmulatorLibraryIsNeverSealed) {
  TempDir dir("pagedc-cache-files");
  const std::string wrapper = dir.path() + "/truncating-c++";
  writeFile(wrapper, "#!/bin/sh\n"
                     "c++ \"$@\" || exit $?\n"
                     "case \" $* \" in *\" -shared \"*) ;; *) exit 0 ;; esac\n"
                     "while [ $# -gt 1 ]; do [ \"$1\" = -o ] && out=$2; shift; done\n"
                     "size=$(wc -c < \"$out\")\n"
                     "truncate -s $((size / 2)) \"$out\"\n");
  fs::permissions(wrapper, fs::perms::owner_all);
  const std::string cache = dir.path() + "/cache";
  ScopedEnv compiler("PAGEDC_EMU_CXX", wrapper);
  KernelCache kernels(cache);
  try {
    kernels.getOrCompile(cheapConfig(), cheapMods(), emulatorOptions());
    ADD_FAILURE() << "a truncated library was accepted";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("damaged emulator image"), std::string::npos)
        << error.what();
  }
  EXPECT_TRUE(!fs::exists(cache) || fs::is_empty(cache)) << "an entry was sealed";
}

TEST(CacheFiles, EmulatorImageChecks) {
  EXPECT_NE(checkEmulatorLibrary(""), "");
  EXPECT_NE(checkEmulatorLibrary(std::string(64, 'x')), "");
  EXPECT_NE(checkEmulatorImage("PAGEDC-EMU-IMG1\n"), "");
  // This test binary is a position-independent executable: ELF type
  // ET_DYN for this machine, like a shared object.
  const std::string self = readFile("/proc/self/exe");
  ASSERT_EQ(checkEmulatorLibrary(self), "");
  EXPECT_NE(checkEmulatorLibrary(self.substr(0, self.size() - 1)), "");
  EXPECT_NE(checkEmulatorLibrary(self.substr(0, self.size() / 2)).find("truncated"),
            std::string::npos);
  std::string otherMachine = self;
  otherMachine[18] ^= 0x01; // e_machine, little-endian
  EXPECT_NE(checkEmulatorLibrary(otherMachine).find("machine"), std::string::npos);
  std::string otherClass = self;
  otherClass[4] = 1; // EI_CLASS: ELFCLASS32
  EXPECT_NE(checkEmulatorLibrary(otherClass), "");
}

// Bundles are inputs, not cache files: a bad manifest or module file is an
// error naming it, at once, never a hang or an allocation sized from it.
TEST(CacheFiles, BundleFilesAreBoundedRegularFiles) {
  for (const auto &[name, damage] : damages()) {
    if (name == "truncated" || name == "extended")
      continue; // parsed or checksummed: KernelBundleTest
    SCOPED_TRACE(name);
    TempDir dir("pagedc-bundle-files");
    damage(fs::path(dir.path()) / "manifest.json", "{}");
    const auto start = std::chrono::steady_clock::now();
    try {
      KernelBundle::read(dir.path());
      ADD_FAILURE() << "read";
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find("manifest.json"), std::string::npos) << error.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
}
