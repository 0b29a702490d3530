//===- KernelCacheTest.cpp - In-process and on-disk kernel cache ----------===//

#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"
#include "pagedc/KernelCache.h"
#include "support/CudaTestSupport.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

using namespace pagedc;
namespace fs = std::filesystem;

extern char **environ;

namespace {

using pagedc::test::TempDir;

/// The cheapest kernel to compile: the block-mask builder with a causal mod.
KernelConfig cheapConfig() {
  KernelConfig config;
  config.kind = KernelKind::BlockMaskBuilder;
  return config;
}
std::string cheapMods() { return std::string(embeddedTemplate("testing/causal.cuh")); }
/// NVRTC and nvJitLink, which kernels with linked mods need, or skip.
#define REQUIRE_NVRTC_AND_NVJITLINK()                                          \
  do {                                                                         \
    REQUIRE_NVRTC();                                                           \
    std::string reason;                                                        \
    if (!::pagedc::NvJitLink::available(&reason))                              \
      GTEST_SKIP() << "nvJitLink unavailable: " << reason;                     \
  } while (0)

/// cheapMods() under a window: another variant with the same mods present.
std::string windowMods() {
  std::string window = cheapMods();
  window.replace(window.find("return row.q >= kv;"), 19, "return row.q >= kv && row.q - kv < 8;");
  return window;
}
/// The decode kernel the LinkedMods tests link (head dim 64, GQA 4).
KernelConfig linkedDecodeConfig() {
  KernelConfig decode;
  decode.kind = KernelKind::Decode;
  decode.groupSize = 4;
  decode.headDim = 64;
  decode.noBlockMask = true;
  decode.linkedMods = true;
  decode.paramsSize = 64;
  return decode;
}

std::vector<fs::path> filesIn(const std::string &dir) {
  std::vector<fs::path> files;
  for (const auto &entry : fs::directory_iterator(dir))
    files.push_back(entry.path());
  return files;
}

std::string readFile(const fs::path &path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

/// Waits for `child` at most `limit`; on time-out kills it, reaps it and
/// returns false.
bool waitForChild(pid_t child, std::chrono::seconds limit, int &status) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child)
      return true;
    if (done < 0)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return false;
}

} // namespace

TEST(ContentHash, KnownValueAndKeys) {
  // XXH3-64 of the empty input (xxHash's published value), and seeds and
  // contents that change the hash; keys are 32 hex digits and see the
  // boundary between parts.
  EXPECT_EQ(contentHash64(""), 0x2d06800538d394c2ull);
  EXPECT_NE(contentHash64("a"), contentHash64("b"));
  EXPECT_NE(contentHash64("a", 1), contentHash64("a", 2));
  EXPECT_EQ(contentKey128({"ab", "c"}).size(), 32u);
  EXPECT_NE(contentKey128({"ab", "c"}), contentKey128({"a", "bc"}));
  EXPECT_EQ(contentKey128({"ab", "c"}), contentKey128({"ab", "c"}));
}

TEST(KernelCache, MissThenMemoryHitThenDiskHitInANewCache) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cache");
  CompileOptions options;
  std::shared_ptr<const CompiledKernel> first;
  {
    KernelCache cache(dir.path());
    first = cache.getOrCompile(cheapConfig(), cheapMods(), options);
    EXPECT_EQ(cache.stats().compiles, 1u);
    EXPECT_EQ(cache.stats().diskHits, 0u);
    auto again = cache.getOrCompile(cheapConfig(), cheapMods(), options);
    EXPECT_EQ(again.get(), first.get());
    EXPECT_EQ(cache.stats().memoryHits, 1u);
    EXPECT_EQ(cache.stats().compiles, 1u);
  }
  ASSERT_EQ(filesIn(dir.path()).size(), 1u);
  EXPECT_EQ(filesIn(dir.path())[0].filename().string(), first->key + ".kernel");
  EXPECT_EQ(first->kernelNames, std::vector<std::string>{"pagedc_build_block_mask"});
  EXPECT_EQ(first->image.compare(0, 4, "\x7f" "ELF"), 0);

  KernelCache fresh(dir.path());
  auto loaded = fresh.getOrCompile(cheapConfig(), cheapMods(), options);
  EXPECT_EQ(fresh.stats().compiles, 0u);
  EXPECT_EQ(fresh.stats().corruptEntries, 0u);
  EXPECT_EQ(fresh.stats().diskHits, 1u);
  EXPECT_EQ(loaded->image, first->image);
  EXPECT_EQ(loaded->key, first->key);
  EXPECT_EQ(loaded->kernelNames, first->kernelNames);
  EXPECT_EQ(loaded->arch, "sm_90");
}

TEST(KernelCache, ArchOptionsAndSourceChangeTheKey) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cache");
  KernelCache cache(dir.path());
  CompileOptions sm90, sm80, verbose, ptx;
  sm80.arch = "sm_80";
  verbose.ptxasVerbose = true;
  ptx.output = CompileOptions::Output::Ptx;
  std::string code = assembleKernel(cheapConfig(), cheapMods()).code;
  std::string keys[] = {KernelCache::diskKey(code, sm90), KernelCache::diskKey(code, sm80),
                        KernelCache::diskKey(code, verbose), KernelCache::diskKey(code, ptx),
                        KernelCache::diskKey(code + "\n", sm90)};
  for (int i = 0; i < 5; ++i)
    for (int j = i + 1; j < 5; ++j)
      EXPECT_NE(keys[i], keys[j]) << i << " vs " << j;
  EXPECT_EQ(keys[0], KernelCache::diskKey(code, sm90)); // deterministic
  EXPECT_EQ(keys[0].size(), 32u);

  auto a = cache.getOrCompile(cheapConfig(), cheapMods(), sm90);
  auto b = cache.getOrCompile(cheapConfig(), cheapMods(), sm80);
  auto c = cache.getOrCompile(cheapConfig(), cheapMods(), verbose);
  EXPECT_EQ(cache.stats().compiles, 3u);
  EXPECT_EQ(filesIn(dir.path()).size(), 3u);
  EXPECT_NE(a->image, b->image);
  EXPECT_EQ(b->arch, "sm_80");
  EXPECT_NE(c->log.find("ptxas info"), std::string::npos);
}

TEST(KernelCache, CorruptEntriesAreDetectedAndRebuilt) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cache");
  CompileOptions options;
  std::string key, original;
  {
    KernelCache cache(dir.path());
    auto kernel = cache.getOrCompile(cheapConfig(), cheapMods(), options);
    key = kernel->key;
    original = kernel->image;
  }
  std::string path = KernelCache(dir.path()).entryPath(key);
  std::string intact = readFile(path);

  // Each damage: truncated image, a flipped image byte, a flipped header
  // byte, an empty file, an extra trailing byte.
  std::vector<std::string> damaged;
  damaged.push_back(intact.substr(0, intact.size() - 100));
  damaged.push_back(intact);
  damaged.back()[intact.size() - 50] ^= 0x40;
  damaged.push_back(intact);
  damaged.back()[30] ^= 0x01;
  damaged.push_back("");
  damaged.push_back(intact + "x");
  for (size_t i = 0; i < damaged.size(); ++i) {
    {
      std::ofstream file(path, std::ios::binary | std::ios::trunc);
      file << damaged[i];
    }
    KernelCache cache(dir.path());
    auto kernel = cache.getOrCompile(cheapConfig(), cheapMods(), options);
    EXPECT_EQ(cache.stats().corruptEntries, 1u) << "damage " << i;
    EXPECT_EQ(cache.stats().compiles, 1u) << "damage " << i;
    EXPECT_EQ(kernel->image, original) << "damage " << i;
    EXPECT_EQ(readFile(path), intact) << "damage " << i << ": entry not rewritten";
  }
}

// Threads that ask for a kernel another thread is compiling wait for it
// without holding the cache's lock (the compiling thread needs the lock to
// finish; a waiter that held it deadlocked the cache). Each round starts
// eight threads on an empty cache, so several of them arrive while the first
// compiles; a deadlock is reported after a minute instead of hanging.
TEST(KernelCache, ConcurrentThreadsCompileOnce) {
  REQUIRE_NVRTC();
  constexpr int kRounds = 10, kThreads = 8;
  for (int round = 0; round < kRounds; ++round) {
    auto cache = std::make_shared<KernelCache>("");
    auto results = std::make_shared<std::vector<std::shared_ptr<const CompiledKernel>>>(kThreads);
    auto finished = std::make_shared<std::promise<void>>();
    auto remaining = std::make_shared<std::atomic<int>>(kThreads);
    std::future<void> allDone = finished->get_future();
    for (int i = 0; i < kThreads; ++i)
      // Detached, holding shared state: a deadlocked thread must not keep
      // the test from reporting.
      std::thread([=] {
        (*results)[i] = cache->getOrCompile(cheapConfig(), cheapMods(), CompileOptions{});
        if (--*remaining == 0)
          finished->set_value();
      }).detach();
    if (allDone.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      ADD_FAILURE() << "round " << round << ": " << remaining->load()
                    << " threads still waiting after 60 s (deadlock)";
      std::fflush(nullptr);
      std::_Exit(1); // the stuck threads cannot be joined
    }
    EXPECT_EQ(cache->stats().compiles, 1u) << "round " << round;
    EXPECT_EQ(cache->stats().memoryHits, kThreads - 1u) << "round " << round;
    for (int i = 1; i < kThreads; ++i)
      EXPECT_EQ((*results)[i].get(), (*results)[0].get()) << "round " << round;
  }
}

TEST(KernelCache, FailedCompileIsReportedAndRetried) {
  REQUIRE_NVRTC();
  KernelCache cache("");
  EXPECT_THROW(cache.getOrCompile(cheapConfig(), "this is not C++", CompileOptions{}), Error);
  EXPECT_THROW(cache.getOrCompile(cheapConfig(), "this is not C++", CompileOptions{}), Error);
  EXPECT_EQ(cache.stats().memoryHits, 0u);
}

TEST(KernelCache, CompilesPrefillAndDecodeTogether) {
  REQUIRE_NVRTC();
  KernelCache cache(""); // memory only
  KernelConfig prefill, decode;
  decode.kind = KernelKind::Decode;
  decode.groupSize = 4;
  prefill.headDim = decode.headDim = 64;
  std::string mods = cheapMods();
  auto kernels = cache.getOrCompileAll({{prefill, mods, {}}, {decode, mods, {}}});
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0]->kernelNames[0], "pagedc_prefill");
  EXPECT_EQ(kernels[1]->kernelNames[0], "pagedc_decode");
  EXPECT_EQ(cache.stats().compiles, 2u);
}

// The runtime's decode modules: the split kernel's unit per variant and one
// merge unit per shape, which a second variant finds in memory; the cubins
// hold the kernels their names say. A kind without a merge unit of its own
// is one module.
TEST(KernelCache, DecodeModulesShareTheMergeUnit) {
  REQUIRE_NVRTC();
  KernelCache cache(""); // memory only
  KernelConfig decode;
  decode.kind = KernelKind::Decode;
  decode.groupSize = 4;
  decode.headDim = 64;
  decode.noBlockMask = true;
  const std::string causal = cheapMods();
  const std::string alibi(embeddedTemplate("testing/alibi.cuh"));
  KernelCache::Modules first = cache.getOrCompileModules(decode, causal, {});
  ASSERT_TRUE(first.main && first.merge);
  EXPECT_EQ(first.main->kernelNames, std::vector<std::string>{"pagedc_decode"});
  EXPECT_EQ(first.merge->kernelNames, std::vector<std::string>{"pagedc_decode_merge"});
  EXPECT_EQ(first.main->image.find("pagedc_decode_merge"), std::string::npos);
  EXPECT_NE(first.main->image.find("pagedc_decode"), std::string::npos);
  EXPECT_NE(first.merge->image.find("pagedc_decode_merge"), std::string::npos);
  EXPECT_EQ(cache.stats().compiles, 2u);

  KernelConfig masked = decode;
  masked.noBlockMask = false;
  KernelCache::Modules second = cache.getOrCompileModules(masked, alibi, {});
  EXPECT_EQ(second.merge, first.merge);
  EXPECT_NE(second.main, first.main);
  EXPECT_EQ(cache.stats().compiles, 3u);
  // The whole unit is another kernel of the cache, not the split one.
  EXPECT_EQ(cache.getOrCompileModules(decode, causal, {}).main, first.main);
  std::shared_ptr<const CompiledKernel> whole = cache.getOrCompile(decode, causal, {});
  EXPECT_NE(whole, first.main);
  EXPECT_EQ(whole->kernelNames,
            (std::vector<std::string>{"pagedc_decode", "pagedc_decode_merge"}));

  KernelCache::Modules builder = cache.getOrCompileModules(cheapConfig(), causal, {});
  EXPECT_EQ(builder.merge, nullptr);
  EXPECT_EQ(builder.main->kernelNames, std::vector<std::string>{"pagedc_build_block_mask"});
}

TEST(LinkedMods, HooksFollowTheModsPresentAndCheckTheVariant) {
  const std::string causal = cheapMods();
  const std::string hooks = linkedModHooks(causal, 64);
  EXPECT_NE(hooks.find("constexpr bool kHasMask = true;"), std::string::npos);
  EXPECT_NE(hooks.find("constexpr bool kHasScore = false;"), std::string::npos);
  EXPECT_NE(hooks.find("struct alignas(8) Params {\n  unsigned char bytes[64];"),
            std::string::npos);
  // The absent score is inlined, the present mask called across the link.
  EXPECT_NE(hooks.find("return pagedc_linked_mask(&p, &row, b, h, q, kv);"), std::string::npos);
  EXPECT_EQ(hooks.find("pagedc_linked_score(&p"), std::string::npos);
  // The kernel depends on the mod code through its flags alone.
  const std::string window = windowMods();
  EXPECT_EQ(linkedModHooks(window, 64), hooks);
  EXPECT_NE(linkedModHooks(std::string(embeddedTemplate("testing/alibi.cuh")), 64), hooks);
  EXPECT_THROW(linkedModHooks("namespace pagedc_mods {}", 64), Error);
  EXPECT_EQ(linkedParamsCapacity(1), 64);
  EXPECT_EQ(linkedParamsCapacity(64), 64);
  EXPECT_EQ(linkedParamsCapacity(65), 128);

  KernelConfig decode;
  decode.kind = KernelKind::Decode;
  decode.linkedMods = true;
  EXPECT_THROW(assembleKernel(decode, causal), Error); // no Params size
  decode.paramsSize = 64;
  const KernelSource kernel = assembleKernel(decode, causal);
  EXPECT_NE(kernel.code.find(hooks), std::string::npos);
  EXPECT_EQ(kernel.code.find("return row.q >= kv;"), std::string::npos);
  const KernelSource mods = assembleLinkedMods(decode, window);
  EXPECT_EQ(mods.kernelNames.size(), 4u);
  EXPECT_NE(mods.code.find("return row.q >= kv && row.q - kv < 8;"), std::string::npos);
  EXPECT_NE(mods.code.find("extern \"C\" __device__ float pagedc_linked_score("),
            std::string::npos);
  decode.linkedMods = false;
  EXPECT_THROW(assembleLinkedMods(decode, causal), Error);
  KernelConfig builder = cheapConfig();
  builder.linkedMods = true;
  builder.paramsSize = 64;
  EXPECT_THROW(assembleKernel(builder, causal), Error);
}

TEST(LinkedMods, ANewVariantCompilesOnlyItsModsAndLinks) {
  REQUIRE_NVRTC_AND_NVJITLINK();
  TempDir dir;
  KernelCache cache(dir.path());
  KernelConfig decode = linkedDecodeConfig();
  const std::string causal = cheapMods(), window = windowMods();
  CompileOptions options;
  options.ptxasVerbose = true;

  KernelCache::Modules first = cache.getOrCompileModules(decode, causal, options);
  ASSERT_TRUE(first.main && first.merge);
  // The kernel's unit, the mods' unit and the merge unit; one link.
  EXPECT_EQ(cache.stats().compiles, 3u);
  EXPECT_EQ(cache.stats().links, 1u);
  EXPECT_EQ(first.main->kernelNames, std::vector<std::string>{"pagedc_decode"});
  EXPECT_NE(first.main->image.find("pagedc_decode"), std::string::npos);
  EXPECT_NE(first.main->image.find("pagedc_linked_mask"), std::string::npos);
  EXPECT_NE(first.main->log.find("Used"), std::string::npos); // the kernel's ptxas report

  KernelCache::Modules second = cache.getOrCompileModules(decode, window, options);
  EXPECT_EQ(cache.stats().compiles, 4u); // the mods' unit alone
  EXPECT_EQ(cache.stats().links, 2u);
  EXPECT_EQ(second.merge, first.merge);
  EXPECT_NE(second.main->key, first.main->key);
  EXPECT_NE(second.main->image, first.main->image);
  // In memory the second time; in a new cache, the linked entry from disk.
  EXPECT_EQ(cache.getOrCompileModules(decode, window, options).main, second.main);
  KernelCache fresh(dir.path());
  std::shared_ptr<const CompiledKernel> again = fresh.getOrCompileModules(decode, window, options).main;
  EXPECT_EQ(fresh.stats().compiles, 0u);
  EXPECT_EQ(fresh.stats().corruptEntries, 0u);
  EXPECT_EQ(fresh.stats().links, 0u);
  EXPECT_EQ(again->image, second.main->image);

  // Row values over the kernel's room for them: the mods' unit says so.
  std::string wide = causal;
  wide.replace(wide.find("  int32_t q;\n"), 12, "  int32_t q;\n  float pad[15];\n");
  try {
    cache.getOrCompileModules(decode, wide, options);
    ADD_FAILURE() << "row values of 64 bytes were linked";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("without link_mods"), std::string::npos)
        << error.what();
  }
  // PTX cannot be linked.
  CompileOptions ptx;
  ptx.output = CompileOptions::Output::Ptx;
  EXPECT_THROW(cache.getOrCompile(decode, window, ptx), Error);
}

// link_mods=first builds a shape's kernel unit ahead of its variants: once
// prepared (in this process or on disk) a variant compiles only its mods.
TEST(LinkedMods, APreparedShapeLinksItsFirstVariantAtOnce) {
  REQUIRE_NVRTC_AND_NVJITLINK();
  TempDir dir;
  KernelCache cache(dir.path());
  KernelConfig decode = linkedDecodeConfig();
  const std::string causal = cheapMods(), window = windowMods();
  const CompileOptions options;

  EXPECT_FALSE(cache.linkedKernelUnitKnown(decode, window, options));
  cache.prepareLinkedKernelUnit(decode, causal, options);
  EXPECT_EQ(cache.stats().compiles, 1u);
  EXPECT_EQ(cache.stats().links, 0u);
  // Known for every variant with the same mods present and Params room.
  EXPECT_TRUE(cache.linkedKernelUnitKnown(decode, window, options));
  KernelConfig widerRoom = decode;
  widerRoom.paramsSize = 128;
  EXPECT_FALSE(cache.linkedKernelUnitKnown(widerRoom, window, options));
  const std::string alibi(embeddedTemplate("testing/alibi.cuh"));
  EXPECT_FALSE(cache.linkedKernelUnitKnown(decode, alibi, options)); // a score present
  cache.getOrCompileModules(decode, window, options);
  EXPECT_EQ(cache.stats().compiles, 3u); // the mods' unit and the merge unit
  EXPECT_EQ(cache.stats().links, 1u);
  // A later process finds it on disk; a cache without the directory not.
  KernelCache fresh(dir.path());
  EXPECT_TRUE(fresh.linkedKernelUnitKnown(decode, causal, options));
  KernelCache memoryOnly("");
  EXPECT_FALSE(memoryOnly.linkedKernelUnitKnown(decode, causal, options));
  // The emulator compiles each variant whole: preparing compiles nothing.
  CompileOptions emulator;
  emulator.arch = std::string(kEmulatorArch);
  EXPECT_FALSE(memoryOnly.linkedKernelUnitKnown(decode, causal, emulator));
  memoryOnly.prepareLinkedKernelUnit(decode, causal, emulator);
  EXPECT_TRUE(memoryOnly.linkedKernelUnitKnown(decode, window, emulator));
  EXPECT_EQ(memoryOnly.stats().compiles, 0u);
  // Inlined mods share no unit.
  KernelConfig inlined = decode;
  inlined.linkedMods = false;
  EXPECT_THROW(cache.linkedKernelUnitKnown(inlined, causal, options), Error);
}

/// Run only as a child of ConcurrentProcessesShareOneEntry.
TEST(DISABLED_CacheChild, CompileOnce) {
  const char *dir = std::getenv("PAGEDC_TEST_CHILD_CACHE");
  ASSERT_NE(dir, nullptr);
  KernelCache cache(dir);
  auto kernel = cache.getOrCompile(cheapConfig(), cheapMods(), CompileOptions{});
  ASSERT_FALSE(kernel->image.empty());
}

TEST(KernelCache, ConcurrentProcessesShareOneEntry) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cache");
  std::string variable = "PAGEDC_TEST_CHILD_CACHE=" + dir.path();
  std::vector<char *> environment;
  for (char **e = environ; *e; ++e)
    environment.push_back(*e);
  environment.push_back(variable.data());
  environment.push_back(nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=DISABLED_CacheChild.CompileOnce";
  std::string disabled = "--gtest_also_run_disabled_tests";
  char *argv[] = {self.data(), filter.data(), disabled.data(), nullptr};
  pid_t children[2];
  for (pid_t &child : children)
    ASSERT_EQ(posix_spawn(&child, self.c_str(), nullptr, nullptr, argv,
                          environment.data()),
              0);
  // Each child compiles one small kernel (about a second); a child that has
  // not finished after two minutes is killed and reported, so a hang shows up
  // as a named failure instead of a stalled test run.
  for (pid_t child : children) {
    int status = 0;
    EXPECT_TRUE(waitForChild(child, std::chrono::seconds(120), status))
        << "child " << child << " still running after 120 s; killed";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  // One complete entry, no temporary files left behind.
  auto files = filesIn(dir.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].extension(), ".kernel");
  KernelCache cache(dir.path());
  auto kernel = cache.getOrCompile(cheapConfig(), cheapMods(), CompileOptions{});
  EXPECT_EQ(cache.stats().diskHits, 1u);
  EXPECT_EQ(cache.stats().corruptEntries, 0u);
}

TEST(KernelCache, DefaultDirectoryHonoursEnvironment) {
  const char *saved = std::getenv("PAGEDC_CACHE_DIR");
  std::string savedValue = saved ? saved : "";
  setenv("PAGEDC_CACHE_DIR", "/tmp/pagedc-test-dir", 1);
  EXPECT_EQ(KernelCache::defaultDirectory(), "/tmp/pagedc-test-dir");
  unsetenv("PAGEDC_CACHE_DIR");
  const char *home = std::getenv("HOME");
  if (home && *home)
    EXPECT_EQ(KernelCache::defaultDirectory(), std::string(home) + "/.cache/pagedc");
  if (saved)
    setenv("PAGEDC_CACHE_DIR", savedValue.c_str(), 1);
}

// PAGEDC_CACHE_DIR set but empty is not the default directory (a script's
// unset variable would otherwise fill ~/.cache/pagedc): an error.
TEST(KernelCache, EmptyCacheDirVariableIsAnError) {
  const char *saved = std::getenv("PAGEDC_CACHE_DIR");
  std::string savedValue = saved ? saved : "";
  setenv("PAGEDC_CACHE_DIR", "", 1);
  try {
    KernelCache::defaultDirectory();
    ADD_FAILURE() << "an empty PAGEDC_CACHE_DIR was accepted";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("PAGEDC_CACHE_DIR is set but empty"),
              std::string::npos)
        << error.what();
  }
  if (saved)
    setenv("PAGEDC_CACHE_DIR", savedValue.c_str(), 1);
  else
    unsetenv("PAGEDC_CACHE_DIR");
}

// A directory that cannot hold the cache is refused by name when the cache
// is made, and nothing is created in its place; a missing one is created.
TEST(KernelCache, DirectoryThatIsNotOneIsRefused) {
  TempDir dir("pagedc-cache-dir");
  const fs::path file = fs::path(dir.path()) / "file";
  std::ofstream(file) << "not a directory\n";
  const fs::path fifo = fs::path(dir.path()) / "fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const fs::path dangling = fs::path(dir.path()) / "dangling";
  fs::create_symlink(fs::path(dir.path()) / "no-such-target", dangling);
  struct Case {
    fs::path path;
    std::string why;
  };
  for (const Case &c : {Case{file, "it is a regular file, not a directory"},
                        Case{fifo, "it is a FIFO, not a directory"},
                        Case{dangling, "it is a dangling symbolic link"},
                        Case{file / "cache", "'" + file.string() + "' is a regular file"},
                        Case{dangling / "cache", "'" + dangling.string() + "' is a dangling"}}) {
    try {
      KernelCache cache(c.path.string());
      ADD_FAILURE() << c.path << " was accepted";
    } catch (const Error &error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("kernel cache directory '" + c.path.string() + "': "),
                std::string::npos)
          << message;
      EXPECT_NE(message.find(c.why), std::string::npos) << message;
    }
  }
  EXPECT_FALSE(fs::exists(fs::path(dir.path()) / "no-such-target"));
  const fs::path created = fs::path(dir.path()) / "a" / "b";
  KernelCache cache(created.string());
  EXPECT_TRUE(fs::is_directory(created));
  EXPECT_TRUE(cache.writable());
  EXPECT_FALSE(KernelCache("").writable());
}

// The spill bytes of a cubin compiled with ptxas's report travel with the
// disk entry (settlePrefillShape reads them on a disk hit, where the log is
// empty); without the report they are unknown.
TEST(KernelCache, SpillBytesSurviveADiskHit) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cache");
  CompileOptions verbose;
  verbose.arch = "sm_80";
  verbose.ptxasVerbose = true;
  int compiled = -2;
  {
    KernelCache cache(dir.path());
    compiled = cache.getOrCompile(cheapConfig(), cheapMods(), verbose)->spillBytes;
    CompileOptions quiet;
    quiet.arch = "sm_80";
    EXPECT_EQ(cache.getOrCompile(cheapConfig(), cheapMods(), quiet)->spillBytes, -1);
  }
  EXPECT_EQ(compiled, 0);
  KernelCache fresh(dir.path());
  auto loaded = fresh.getOrCompile(cheapConfig(), cheapMods(), verbose);
  EXPECT_EQ(fresh.stats().diskHits, 1u);
  EXPECT_TRUE(loaded->log.empty());
  EXPECT_EQ(loaded->spillBytes, 0);
}

/// Spill store bytes ptxas reports for `config` with `mods` on sm_80.
int directSpills(const KernelConfig &config, const std::string &mods,
                 const std::string &arch = "sm_80") {
  CompileOptions verbose;
  verbose.arch = arch;
  verbose.ptxasVerbose = true;
  KernelSource source = assembleKernel(config, mods);
  CompileResult direct = Nvrtc::get().compile(source.code, "direct.cu", verbose, &source);
  int spills = 0;
  for (const PtxasKernelReport &report : parsePtxasReport(direct.log))
    spills += report.spillStoreBytes;
  return spills;
}

/// A mask with two row values (the natten mask's clamped window centre, as
/// the generator writes it): the 128 x 32 tile with 32 rows per warp at head
/// dim 128 spills holding them for a thread's four rows, and compiles without
/// spills recomputing them per KV tile.
std::string rowStateMods() {
  return R"(namespace pagedc_mods {
struct Params {};
constexpr bool kHasMask = true;
constexpr bool kHasScore = false;
struct MaskRow {
  int32_t x;
  int32_t y;
};
__device__ __forceinline__ int32_t clamp_centre(int32_t v) { return v < 3 ? 3 : v > 28 ? 28 : v; }
__device__ __forceinline__ int32_t distance(int32_t a, int32_t b) { return a > b ? a - b : b - a; }
__device__ __forceinline__ MaskRow mask_row(const Params &, int, int, int q) {
  return {clamp_centre(q >> 5), clamp_centre(q & 31)};
}
__device__ __forceinline__ bool mask(const Params &, const MaskRow &row, int, int, int, int kv) {
  return (distance(row.x, kv >> 5) <= 3) & (distance(row.y, kv & 31) <= 3);
}
struct ScoreRow {};
__device__ __forceinline__ ScoreRow score_row(const Params &, int, int, int) { return {}; }
__device__ __forceinline__ float score(const Params &, const ScoreRow &, float s, int, int, int,
                                       int) {
  return s;
}
PAGEDC_MASK_COL_UNSPLIT()
} // namespace pagedc_mods
)";
}

/// A score mod no 128 x 32 tile with 32 rows per warp holds without spills
/// at head dim 128, with or without recomputed rows: each element reads 24
/// row values (96 registers for a thread's four rows).
std::string wideRowMods() {
  return R"(namespace pagedc_mods {
struct Params {
  const float *w;
  int64_t w_stride[1];
};
constexpr bool kHasMask = false;
constexpr bool kHasScore = true;
struct MaskRow {};
__device__ __forceinline__ MaskRow mask_row(const Params &, int, int, int) { return {}; }
__device__ __forceinline__ bool mask(const Params &, const MaskRow &, int, int, int, int) {
  return true;
}
struct ScoreRow {
  float r[24];
};
__device__ __forceinline__ ScoreRow score_row(const Params &p, int, int, int q) {
  ScoreRow row;
  for (int i = 0; i < 24; ++i)
    row.r[i] = p.w[(q * 24 + i) * p.w_stride[0]];
  return row;
}
__device__ __forceinline__ float score(const Params &, const ScoreRow &row, float s, int, int,
                                       int, int kv) {
  float sum = s;
  for (int i = 0; i < 24; ++i)
    sum += (kv >> i & 1) ? row.r[i] : -row.r[i];
  return sum;
}
PAGEDC_MASK_COL_UNSPLIT()
} // namespace pagedc_mods
)";
}

/// The mod code of the settle tests' mods: the embedded testing mods, plus
/// "row-state" and "wide-row" (row values a tile must hold).
std::string settleTestMods(const std::string &name) {
  if (name == "wide-row")
    return wideRowMods();
  if (name == "row-state")
    return rowStateMods();
  return std::string(embeddedTemplate("testing/" + name + ".cuh"));
}

/// The six mods the settle tests compile.
constexpr const char *kSettleTestMods[] = {"causal",   "alibi",     "softcap",
                                           "document", "row-state", "wide-row"};

/// Which outcomes of the cache's spill figures a settle test has checked
/// against a direct compile.
struct SpillCrossChecks {
  bool none = false, some = false;
};

/// The spill bytes ptxas reported for `config`, from the compile `cache`
/// already holds (a miss fails the test: settlePrefillShape must have
/// compiled every tile it tried). The first tile of a test without spills
/// and the first with some are checked against a direct compile's report,
/// so that the others need not compile each tile twice.
int cachedSpills(KernelCache &cache, const KernelConfig &config, const std::string &mods,
                 const std::string &arch, SpillCrossChecks &checked) {
  const unsigned before = cache.stats().compiles;
  std::shared_ptr<const CompiledKernel> kernel =
      cache.getOrCompile(config, mods, cudaCompileOptions(config, arch));
  EXPECT_EQ(cache.stats().compiles, before) << "not compiled by settle: " << config.describe();
  EXPECT_GE(kernel->spillBytes, 0) << config.describe();
  bool &done = kernel->spillBytes == 0 ? checked.none : checked.some;
  if (!done) {
    done = true;
    EXPECT_EQ(kernel->spillBytes, directSpills(config, mods, config.compileArchFor(arch)))
        << config.describe();
  }
  return kernel->spillBytes;
}

// settlePrefillShape keeps the FA2-shaped tile (128 x 32, 32 rows per warp,
// head dim 128) exactly where ptxas compiles it without spills, holding the
// mods' row values or else recomputing them per KV tile: its choice for each
// test mod agrees with ptxas's reports of the tiles it compiled, and the
// kernel it compiled last is the one the runtime's options then find in the
// cache.
TEST(SettlePrefillShape, KeepsTheWideTileOnlyWithoutSpills) {
  REQUIRE_NVRTC();
  int recomputed = 0, fellBack = 0;
  SpillCrossChecks crossChecks;
  for (const char *name : kSettleTestMods) {
    SCOPED_TRACE(name);
    const std::string mods = settleTestMods(name);
    KernelConfig config;
    config.kind = KernelKind::Prefill;
    config.headDim = 128;
    config.choosePrefillShapeFor("sm_80");
    ASSERT_TRUE(config.prefillFallsBackOnSpills()) << config.describe();
    ASSERT_FALSE(config.recomputeModRows);
    KernelCache cache("");
    const KernelConfig settled = settlePrefillShape(config, mods, "sm_80", cache);
    const unsigned settleCompiles = cache.stats().compiles;

    KernelConfig expected = config;
    unsigned tries = 1;
    if (cachedSpills(cache, config, mods, "sm_80", crossChecks) != 0) {
      expected.usePrefillSpillFallback();
      ASSERT_TRUE(expected.recomputeModRows);
      ASSERT_TRUE(expected.prefillFallsBackOnSpills());
      ++tries;
      if (cachedSpills(cache, expected, mods, "sm_80", crossChecks) != 0) {
        expected.usePrefillSpillFallback();
        EXPECT_EQ(expected.blockM, 64);
        EXPECT_EQ(expected.blockN, 64);
        EXPECT_EQ(expected.warpRows, 16);
        EXPECT_FALSE(expected.recomputeModRows);
        EXPECT_FALSE(expected.prefillFallsBackOnSpills());
        ++fellBack;
      } else {
        ++recomputed;
      }
    }
    EXPECT_EQ(settled, expected) << settled.describe();
    EXPECT_EQ(settleCompiles, tries);
    cache.getOrCompile(settled, mods, cudaCompileOptions(settled, "sm_80"));
    if (settled.prefillFallsBackOnSpills())
      EXPECT_EQ(cache.stats().compiles, tries) << "settle's compile was not reused";
  }
  // Each step of the chain was taken by some mod (with CUDA 13.0's NVRTC:
  // row-state recomputes its rows, wide-row falls back).
  EXPECT_GE(recomputed, 1);
  EXPECT_GE(fellBack, 1);
}

// On sm_90 at head dims 64 and 128 the 128-key warpgroup tile is kept
// exactly where ptxas compiles it without spills, else the 128 x 64 one,
// which does not spill; the runtime's compile is the one it settled on.
TEST(SettlePrefillShape, KeepsTheWarpgroupWideTileOnlyWithoutSpills) {
  REQUIRE_NVRTC();
  int kept = 0, fellBack = 0;
  SpillCrossChecks crossChecks;
  for (int headDim : {64, 128})
  for (const char *name : kSettleTestMods) {
    SCOPED_TRACE(std::string(name) + " d" + std::to_string(headDim));
    const std::string mods = settleTestMods(name);
    KernelConfig config;
    config.kind = KernelKind::Prefill;
    config.headDim = headDim;
    config.choosePrefillShapeFor("sm_90");
    EXPECT_EQ(config.blockM, 128);
    EXPECT_EQ(config.blockN, 128);
    EXPECT_EQ(config.warpRows, 64);
    ASSERT_TRUE(config.prefillFallsBackOnSpills()) << config.describe();
    const std::string arch = config.compileArchFor("sm_90");
    ASSERT_EQ(arch, "sm_90a");
    KernelCache cache("");
    const KernelConfig settled = settlePrefillShape(config, mods, "sm_90", cache);

    // One compile either way: the 128 x 64 tile is not checked.
    EXPECT_EQ(cache.stats().compiles, 1u);
    KernelConfig expected = config;
    if (cachedSpills(cache, config, mods, "sm_90", crossChecks) != 0) {
      expected.usePrefillSpillFallback();
      EXPECT_EQ(expected.blockM, 128);
      EXPECT_EQ(expected.blockN, 64);
      EXPECT_EQ(expected.warpRows, 64);
      EXPECT_FALSE(expected.prefillFallsBackOnSpills());
      EXPECT_EQ(directSpills(expected, mods, arch), 0);
      ++fellBack;
    } else {
      ++kept;
    }
    EXPECT_EQ(settled, expected) << settled.describe();
    EXPECT_EQ(cache.stats().compiles, 1u);
    cache.getOrCompile(settled, mods, cudaCompileOptions(settled, "sm_90"));
    if (settled.prefillFallsBackOnSpills())
      EXPECT_EQ(cache.stats().compiles, 1u) << "settle's compile was not reused";
  }
  // Both outcomes occur (with CUDA 13.0's NVRTC: causal keeps the tile, the
  // wide row values spill it).
  EXPECT_GE(kept, 1);
  EXPECT_GE(fellBack, 1);
  // Head dim 256: two consumer warpgroups on 64-key tiles where they
  // compile without spills (causal does), else one on 32-key tiles, which
  // is not checked.
  KernelConfig other;
  other.kind = KernelKind::Prefill;
  other.headDim = 256;
  for (const char *arch : {"sm_90a", "sm_90"}) {
    other.choosePrefillShapeFor(arch);
    EXPECT_EQ(other.warpRows, 64) << arch;
    EXPECT_EQ(other.blockM, 128) << arch;
    EXPECT_EQ(other.blockN, 64) << arch;
    EXPECT_TRUE(other.prefillFallsBackOnSpills()) << arch;
  }
  KernelConfig narrow = other;
  narrow.usePrefillSpillFallback();
  EXPECT_EQ(narrow.warpRows, 64);
  EXPECT_EQ(narrow.blockM, 64);
  EXPECT_EQ(narrow.blockN, 32);
  EXPECT_FALSE(narrow.prefillFallsBackOnSpills());
  KernelCache cache("");
  const std::string mods = settleTestMods(kSettleTestMods[0]);
  ASSERT_EQ(directSpills(other, mods, "sm_90a"), 0);
  EXPECT_EQ(settlePrefillShape(other, mods, "sm_90", cache), other);
}

// Nothing is compiled for other tiles, the emulator, or a tile that
// KernelOptions::prefillShape asked for.
TEST(SettlePrefillShape, LeavesOtherTilesAlone) {
  KernelOptions asked; // KernelOptions::prefillShape
  KernelConfig config;
  config.kind = KernelKind::Prefill;
  config.headDim = 128;
  config.choosePrefillShapeFor("emu", asked);
  EXPECT_EQ(config.warpRows, 16);
  KernelCache cache("");
  EXPECT_EQ(settlePrefillShape(config, cheapMods(), "emu", cache), config);
  config.choosePrefillShapeFor("sm_80", asked);
  EXPECT_EQ(settlePrefillShape(config, cheapMods(), "emu", cache), config);
  config.headDim = 64;
  config.choosePrefillShapeFor("sm_80", asked);
  EXPECT_FALSE(config.prefillFallsBackOnSpills());
  EXPECT_EQ(settlePrefillShape(config, cheapMods(), "sm_80", cache), config);
  EXPECT_EQ(cache.stats().compiles, 0u);
  asked.prefillShape = "128x32x32";
  config.headDim = 128;
  config.choosePrefillShapeFor("sm_80", asked);
  EXPECT_FALSE(config.prefillFallsBackOnSpills());
  EXPECT_FALSE(config.recomputeModRows);
  asked.prefillShape = "128x32x32r";
  config.choosePrefillShapeFor("sm_80", asked);
  EXPECT_FALSE(config.prefillFallsBackOnSpills());
  EXPECT_TRUE(config.recomputeModRows);
  EXPECT_EQ(config.warpRows, 32);
  asked.prefillShape = "128x128x64";
  config.choosePrefillShapeFor("sm_90a", asked);
  EXPECT_EQ(config.blockN, 128);
  EXPECT_EQ(config.warpRows, 64);
  EXPECT_FALSE(config.prefillFallsBackOnSpills());
  EXPECT_EQ(config.prefillStageLimit, 4);
  EXPECT_EQ(config.prefillStages(), 3); // 128 x 128 at D 128: 3 stages, one Q tile
  EXPECT_EQ(config.prefillQBuffers(), 1);
  // "sK": at most K stages; at 2 a second Q tile fits (FlashAttention-3's ring).
  asked.prefillShape = "128x128x64s2";
  config.choosePrefillShapeFor("sm_90a", asked);
  EXPECT_EQ(config.blockN, 128);
  EXPECT_EQ(config.prefillStageLimit, 2);
  EXPECT_EQ(config.prefillStages(), 2);
  EXPECT_EQ(config.prefillQBuffers(), 2);
  EXPECT_EQ(config.sharedMemoryBytes(), 1024 + (2 * 128 + 2 * 2 * 128) * 256 + 128);
  EXPECT_NE(config.describe().find("m128w64s2 n128"), std::string::npos) << config.describe();
  config.validate();
  asked.prefillShape = "128x64x64s3";
  config.choosePrefillShapeFor("sm_90a", asked);
  EXPECT_EQ(config.prefillStages(), 3);
  asked.prefillShape.reset();
  config.choosePrefillShapeFor("sm_90a", asked); // the default again: no limit left over
  EXPECT_EQ(config.prefillStageLimit, 4);
  EXPECT_EQ(config.prefillStages(), 3);
  // "c2": two CTAs an SM, one consumer warpgroup; the ring and Q tiles fit
  // half the SM's shared memory (at D 128 and 64 keys: 2 stages, two Q tiles).
  asked.prefillShape = "64x64x64c2";
  config.choosePrefillShapeFor("sm_90a", asked);
  EXPECT_EQ(config.blockM, 64);
  EXPECT_EQ(config.prefillCtasPerSm, 2);
  EXPECT_EQ(config.prefillStageLimit, 4);
  EXPECT_EQ(config.prefillStages(), 2);
  EXPECT_EQ(config.prefillQBuffers(), 2);
  EXPECT_EQ(config.sharedMemoryBytes(), 1024 + (2 * 64 + 2 * 2 * 64) * 256 + 128);
  EXPECT_LE(config.sharedMemoryBytes(), 228 * 1024 / 2 - 1024);
  EXPECT_NE(config.describe().find("m64w64c2 n64"), std::string::npos) << config.describe();
  config.validate();
  asked.prefillShape = "64x64x64s2c2";
  config.choosePrefillShapeFor("sm_90a", asked);
  EXPECT_EQ(config.prefillStageLimit, 2);
  EXPECT_EQ(config.prefillCtasPerSm, 2);
  EXPECT_NE(config.describe().find("m64w64s2c2 n64"), std::string::npos) << config.describe();
  config.validate();
  config.headDim = 256; // a D 256 wgmma's accumulators do not fit 128 registers
  config.blockN = 32;
  EXPECT_THROW(config.validate(), Error);
  config.headDim = 128;
  config.blockN = 128; // 64 x 128: two stages are 148,608 bytes, over the half
  EXPECT_THROW(config.validate(), Error);
  asked.prefillShape = "128x64x64c2"; // two consumer warpgroups
  config.choosePrefillShapeFor("sm_90a", asked);
  EXPECT_THROW(config.validate(), Error);
  asked.prefillShape.reset();
  config.choosePrefillShapeFor("sm_90a", asked); // the default again: one CTA an SM
  EXPECT_EQ(config.prefillCtasPerSm, 1);
  config.validate();
  config.prefillStageLimit = 1;
  EXPECT_THROW(config.validate(), Error);
  config.prefillStageLimit = 2;
  config.warpRows = 32;
  config.blockN = 32;
  EXPECT_THROW(config.validate(), Error); // mma.sync tiles have no ring
  for (const char *bad : {"128x32x32q", "128x32x32rr", "128x32", "128x32x32s2", "128x128x64s5",
                          "128x128x64s1", "128x128x64s", "128x128x64s2r", "128x128x64s22",
                          "64x64x32c2", "64x64x64c3", "64x64x64c2s2", "64x64x64c", "64x64x64rc2",
                          "64x64x64c2c2"}) {
    asked.prefillShape = bad;
    EXPECT_THROW(config.choosePrefillShapeFor("sm_80", asked), Error) << bad;
  }
  // Per head dim: "dD=" entries at D, the plain entry elsewhere; "dD="
  // alone keeps the default tile at D.
  asked.prefillShape = "128x128x64,d256=128x64x64";
  config.headDim = 128;
  config.choosePrefillShapeFor("emu", asked);
  EXPECT_EQ(config.blockN, 128);
  EXPECT_EQ(config.warpRows, 64);
  config.headDim = 256;
  config.choosePrefillShapeFor("emu", asked);
  EXPECT_EQ(config.blockM, 128);
  EXPECT_EQ(config.blockN, 64);
  EXPECT_EQ(config.warpRows, 64);
  EXPECT_FALSE(config.prefillFallsBackOnSpills());
  asked.prefillShape = "d256=,d64=128x64x64";
  config.choosePrefillShapeFor("sm_90a", asked); // D 256: the default, 128 x 64 that may fall back
  EXPECT_EQ(config.blockN, 64);
  EXPECT_TRUE(config.prefillFallsBackOnSpills());
  config.headDim = 128;
  config.choosePrefillShapeFor("sm_90a", asked); // not named, no plain entry: the default
  EXPECT_EQ(config.blockN, 128);
  EXPECT_TRUE(config.prefillFallsBackOnSpills());
  config.headDim = 64;
  config.choosePrefillShapeFor("sm_90a", asked);
  EXPECT_EQ(config.blockN, 64);
  EXPECT_FALSE(config.prefillFallsBackOnSpills());
  for (const char *bad : {"128x64x64,128x128x64", "d256=128x64x64,d256=64x32x64",
                          "128x64x64,", "x256=128x64x64", "d=128x64x64", "d25x=128x64x64",
                          "d256=128x64"}) {
    asked.prefillShape = bad;
    config.headDim = 256;
    EXPECT_THROW(config.choosePrefillShapeFor("sm_90a", asked), Error) << bad;
  }
  asked.prefillShape.reset();
}
