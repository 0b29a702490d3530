//===- CudaJitTest.cpp - Variant index and code generator plugin ----------===//

#include "pagedc/CudaJit.h"
#include "pagedc/Error.h"
#include "support/CudaTestSupport.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

using namespace pagedc;
namespace fs = std::filesystem;

namespace {

using pagedc::test::ScopedEnv;
using pagedc::test::TempDir;

constexpr const char *kProgram = R"(const LIMIT = 4096
param softcap: f32 = 30.0
buffer slopes: f32[H]
buffer doc: i32[B, S]
mask causal(b, h, q, kv) = (q >= kv) & (q - kv <= LIMIT)
mask document(b, h, q, kv) = doc[b, q] == doc[b, kv]
score capped(s, b, h, q, kv) {
  let x = s + slopes[h] * (kv - q)
  softcap * tanh(x / softcap)
}
)";

/// The cheapest kernel to compile: the block-mask builder.
CudaJitRequest cheapRequest() {
  CudaJitRequest request;
  request.source = kProgram;
  request.fileName = "test.attn";
  request.mask = "causal";
  request.score = "capped";
  KernelConfig config;
  config.kind = KernelKind::BlockMaskBuilder;
  request.configs = {config};
  request.options.arch = "sm_80";
  return request;
}

/// Every test points the runtime at this build's plugin.
class CudaJit : public ::testing::Test {
protected:
  ScopedEnv plugin{"PAGEDC_CODEGEN_PLUGIN", PAGEDC_TEST_PLUGIN};
};

std::string readFile(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)),
                     std::istreambuf_iterator<char>());
}

void writeFile(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

/// Runs the runtime-only tool in a new process; returns its exit status and
/// its --stats line as name -> value.
int runTool(const std::string &args, std::map<std::string, std::string> &stats,
            std::string &errors, const std::string &dir,
            const std::string &pluginEnv = PAGEDC_TEST_PLUGIN) {
  std::string statsPath = dir + "/stats.txt", errorPath = dir + "/stderr.txt";
  std::error_code ignored;
  fs::remove(statsPath, ignored);
  std::string command = fmt::format(
      "env PAGEDC_CODEGEN_PLUGIN='{}' '{}' {} --cache-dir='{}' --stats='{}' "
      "2>'{}'",
      pluginEnv, PAGEDC_TEST_JIT_TOOL, args, dir, statsPath, errorPath);
  int status = std::system(command.c_str());
  errors = readFile(errorPath);
  std::istringstream words(readFile(statsPath));
  stats.clear();
  for (std::string word; words >> word;) {
    size_t equals = word.find('=');
    if (equals != std::string::npos)
      stats[word.substr(0, equals)] = word.substr(equals + 1);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(CudaJitDeclarations, RoundTrip) {
  std::vector<ParamDecl> params(3);
  params[0].name = "softcap";
  params[0].type = ScalarKind::F32;
  params[0].defaultValue = ParamValue::ofF32(-0.1f);
  params[1].name = "n";
  params[1].type = ScalarKind::I32;
  params[1].defaultValue = ParamValue::ofI32(-7);
  params[2].name = "flag";
  params[2].type = ScalarKind::Bool;
  std::vector<BufferDecl> buffers(1);
  buffers[0].name = "doc";
  buffers[0].elementType = DType::BF16;
  buffers[0].dims.resize(3);
  buffers[0].dims[0].kind = BufferDim::Fixed;
  buffers[0].dims[0].size = 128;
  buffers[0].dims[1].kind = BufferDim::Named;
  buffers[0].dims[1].name = "S";
  buffers[0].dims[2].kind = BufferDim::Any;
  std::string text = serializeModDeclarations(params, buffers);
  std::vector<ParamDecl> parsedParams;
  std::vector<BufferDecl> parsedBuffers;
  ASSERT_TRUE(parseModDeclarations(text, parsedParams, parsedBuffers)) << text;
  EXPECT_EQ(serializeModDeclarations(parsedParams, parsedBuffers), text);
  ASSERT_EQ(parsedParams.size(), 3u);
  EXPECT_EQ(parsedParams[0].defaultValue->f32, -0.1f);
  EXPECT_EQ(parsedParams[1].defaultValue->i32, -7);
  EXPECT_FALSE(parsedParams[2].defaultValue.has_value());
  ASSERT_EQ(parsedBuffers.size(), 1u);
  EXPECT_EQ(parsedBuffers[0].elementType, DType::BF16);
  EXPECT_EQ(parsedBuffers[0].dims[1].name, "S");
  EXPECT_EQ(parsedBuffers[0].dims[2].kind, BufferDim::Any);
  for (const char *bad : {"param x f64\n", "buffer 1x f32 4\n", "oops a b\n",
                          "param x f32 f32:zz\n", "buffer b f32 4,-\n"})
    EXPECT_FALSE(parseModDeclarations(bad, parsedParams, parsedBuffers)) << bad;
}

TEST_F(CudaJit, MissCompilesThenNewCacheHitsTheVariant) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  CudaJitRequest request = cheapRequest();
  KernelCache first(dir.path());
  CudaJitResult generated = loadCudaMods(request, first);
  EXPECT_EQ(generated.outcome, CudaJitOutcome::Generated);
  EXPECT_TRUE(generated.usedPlugin);
  EXPECT_EQ(first.stats().compiles, 1u);
  EXPECT_TRUE(codegenPluginLoaded());
  ASSERT_EQ(generated.kernels.size(), 1u);
  EXPECT_FALSE(generated.kernels[0]->image.empty());
  EXPECT_TRUE(fs::exists(generated.variantPath));
  EXPECT_NE(generated.mods.cuda.modCode.find("pagedc_mods"), std::string::npos);
  // The selection's declarations (`doc` is read by no selected mod).
  ASSERT_EQ(generated.mods.params.size(), 1u);
  EXPECT_EQ(generated.mods.params[0].name, "softcap");
  ASSERT_EQ(generated.mods.buffers.size(), 1u);
  EXPECT_EQ(generated.mods.buffers[0].name, "slopes");
  ASSERT_EQ(generated.mods.buffers[0].dims.size(), 1u);
  EXPECT_EQ(generated.mods.buffers[0].dims[0].name, "H");
  // paramsSize was filled in from them.
  EXPECT_EQ(generated.kernels[0]->config.paramsSize,
            ParamsLayout::forDeclarations(generated.mods.params,
                                          generated.mods.buffers)
                .size);

  KernelCache second(dir.path());
  CudaJitResult hit = loadCudaMods(request, second);
  EXPECT_EQ(hit.outcome, CudaJitOutcome::VariantHit);
  EXPECT_FALSE(hit.usedPlugin);
  EXPECT_EQ(second.stats().diskHits, 1u);
  EXPECT_EQ(second.stats().compiles, 0u);
  EXPECT_EQ(hit.variantKey, generated.variantKey);
  EXPECT_EQ(hit.kernels[0]->image, generated.kernels[0]->image);
  EXPECT_EQ(hit.kernels[0]->key, generated.kernels[0]->key);
  EXPECT_EQ(hit.kernels[0]->config, generated.kernels[0]->config);
  EXPECT_EQ(hit.mods.cuda.modCode, generated.mods.cuda.modCode);
  EXPECT_EQ(serializeModDeclarations(hit.mods.params, hit.mods.buffers),
            serializeModDeclarations(generated.mods.params,
                                     generated.mods.buffers));
  // The in-process map learned the kernel: getOrCompile is a memory hit.
  second.getOrCompile(hit.kernels[0]->config, hit.mods.cuda.modCode,
                      request.options);
  EXPECT_EQ(second.stats().memoryHits, 1u);
  EXPECT_EQ(second.stats().compiles, 0u);
}

TEST_F(CudaJit, HitNeedsNoPlugin) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  CudaJitRequest request = cheapRequest();
  KernelCache first(dir.path());
  loadCudaMods(request, first);
  // With the plugin unfindable, a hit still serves the request (a miss
  // would throw: see PluginNotFoundIsAClearError).
  ScopedEnv missing("PAGEDC_CODEGEN_PLUGIN", (dir.path() + "/no-such-plugin.so").c_str());
  EXPECT_EQ(findCodegenPlugin(), "");
  KernelCache second(dir.path());
  CudaJitResult hit = loadCudaMods(request, second);
  EXPECT_EQ(hit.outcome, CudaJitOutcome::VariantHit);
  EXPECT_FALSE(hit.usedPlugin);
  EXPECT_EQ(second.stats().compiles, 0u);
}

TEST_F(CudaJit, ChangedInputsMiss) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  CudaJitRequest base = cheapRequest();
  KernelCache cache(dir.path());
  CudaJitResult original = loadCudaMods(base, cache);
  std::vector<std::pair<std::string, CudaJitRequest>> changes;
  CudaJitRequest text = base;
  text.source += "# a comment\n";
  changes.push_back({"program text", text});
  CudaJitRequest override = base;
  override.overrides = {{"LIMIT", "128"}};
  changes.push_back({"override", override});
  CudaJitRequest config = base;
  config.configs[0].headDim = 64;
  changes.push_back({"config", config});
  CudaJitRequest arch = base;
  arch.options.arch = "sm_90";
  changes.push_back({"arch", arch});
  CudaJitRequest mask = base;
  mask.mask = "document";
  changes.push_back({"mask", mask});
  for (auto &[what, request] : changes) {
    SCOPED_TRACE(what);
    KernelCache fresh(dir.path());
    CudaJitResult result = loadCudaMods(request, fresh);
    EXPECT_NE(result.variantKey, original.variantKey);
    EXPECT_EQ(result.outcome, CudaJitOutcome::Generated);
    EXPECT_TRUE(result.usedPlugin);
    // ... and is a hit the second time.
    KernelCache again(dir.path());
    EXPECT_EQ(loadCudaMods(request, again).outcome, CudaJitOutcome::VariantHit);
  }
  // The override reaches the generated code; a comment does not.
  KernelCache check(dir.path());
  EXPECT_EQ(loadCudaMods(changes[0].second, check).mods.cuda.modCode,
            original.mods.cuda.modCode);
  EXPECT_NE(loadCudaMods(changes[1].second, check).mods.cuda.modCode,
            original.mods.cuda.modCode);
  // Another mask brings its own declarations.
  CudaJitResult document = loadCudaMods(changes[4].second, check);
  EXPECT_EQ(document.outcome, CudaJitOutcome::VariantHit);
  ASSERT_EQ(document.mods.buffers.size(), 2u);
  EXPECT_EQ(document.mods.buffers[1].name, "doc");
}

TEST_F(CudaJit, CorruptOrTruncatedVariantIsRebuilt) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  CudaJitRequest request = cheapRequest();
  KernelCache cache(dir.path());
  CudaJitResult original = loadCudaMods(request, cache);
  std::string bytes = readFile(original.variantPath);
  ASSERT_GT(bytes.size(), 100u);
  std::string flipped = bytes;
  flipped[flipped.size() - 10] ^= 0x20; // in the mod code
  std::string header = bytes;
  header[20] ^= 0x01; // in the header
  for (const std::string &damaged :
       {bytes.substr(0, bytes.size() / 2), flipped, header, std::string()}) {
    writeFile(original.variantPath, damaged);
    KernelCache fresh(dir.path());
    CudaJitResult rebuilt = loadCudaMods(request, fresh);
    EXPECT_EQ(rebuilt.outcome, CudaJitOutcome::Generated);
    EXPECT_TRUE(rebuilt.usedPlugin);
    EXPECT_EQ(fresh.stats().compiles, 0u); // the kernel entry was fine
    EXPECT_EQ(readFile(original.variantPath), bytes); // rewritten
    KernelCache again(dir.path());
    EXPECT_EQ(loadCudaMods(request, again).outcome, CudaJitOutcome::VariantHit);
  }
}

TEST_F(CudaJit, MissingOrCorruptKernelEntryIsRebuilt) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  CudaJitRequest request = cheapRequest();
  KernelCache cache(dir.path());
  CudaJitResult original = loadCudaMods(request, cache);
  std::string entry = cache.entryPath(original.kernels[0]->key);
  ASSERT_TRUE(fs::exists(entry));
  std::string entryBytes = readFile(entry);
  for (bool remove : {true, false}) {
    SCOPED_TRACE(remove ? "missing" : "corrupt");
    if (remove)
      fs::remove(entry);
    else
      writeFile(entry, entryBytes.substr(0, entryBytes.size() - 7));
    KernelCache fresh(dir.path());
    CudaJitResult rebuilt = loadCudaMods(request, fresh);
    EXPECT_EQ(rebuilt.outcome, CudaJitOutcome::KernelsRebuilt);
    EXPECT_FALSE(rebuilt.usedPlugin); // the variant's mod code was compiled
    EXPECT_EQ(fresh.stats().compiles, 1u);
    EXPECT_EQ(fresh.stats().corruptEntries, remove ? 0u : 1u);
    EXPECT_EQ(rebuilt.kernels[0]->image, original.kernels[0]->image);
    EXPECT_TRUE(fs::exists(entry));
    KernelCache again(dir.path());
    EXPECT_EQ(loadCudaMods(request, again).outcome, CudaJitOutcome::VariantHit);
  }
}

// A decode request yields the modules the CUDA backend loads: the split
// kernel's unit and the merge unit, both recorded by the variant; a hit
// reads both and teaches the in-process map both; a missing merge entry is
// rebuilt alone.
TEST_F(CudaJit, DecodeVariantRecordsBothModules) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  CudaJitRequest request = cheapRequest();
  request.configs[0].kind = KernelKind::Decode;
  request.configs[0].groupSize = 4;
  request.configs[0].headDim = 64;
  KernelCache first(dir.path());
  CudaJitResult generated = loadCudaMods(request, first);
  EXPECT_EQ(first.stats().compiles, 2u);
  ASSERT_EQ(generated.kernels.size(), 1u);
  ASSERT_EQ(generated.mergeKernels.size(), 1u);
  ASSERT_TRUE(generated.mergeKernels[0]);
  EXPECT_EQ(generated.kernels[0]->kernelNames, std::vector<std::string>{"pagedc_decode"});
  EXPECT_EQ(generated.mergeKernels[0]->kernelNames,
            std::vector<std::string>{"pagedc_decode_merge"});

  KernelCache second(dir.path());
  CudaJitResult hit = loadCudaMods(request, second);
  EXPECT_EQ(hit.outcome, CudaJitOutcome::VariantHit);
  EXPECT_EQ(second.stats().diskHits, 2u);
  EXPECT_EQ(hit.kernels[0]->key, generated.kernels[0]->key);
  ASSERT_TRUE(hit.mergeKernels[0]);
  EXPECT_EQ(hit.mergeKernels[0]->key, generated.mergeKernels[0]->key);
  KernelCache::Modules modules =
      second.getOrCompileModules(hit.kernels[0]->config, hit.mods.cuda.modCode, request.options);
  EXPECT_EQ(modules.main, hit.kernels[0]);
  EXPECT_EQ(modules.merge, hit.mergeKernels[0]);
  EXPECT_EQ(second.stats().compiles, 0u);

  fs::remove(second.entryPath(generated.mergeKernels[0]->key));
  KernelCache third(dir.path());
  CudaJitResult rebuilt = loadCudaMods(request, third);
  EXPECT_EQ(rebuilt.outcome, CudaJitOutcome::KernelsRebuilt);
  EXPECT_EQ(third.stats().compiles, 1u);
  EXPECT_EQ(rebuilt.mergeKernels[0]->key, generated.mergeKernels[0]->key);
  KernelCache fourth(dir.path());
  EXPECT_EQ(loadCudaMods(request, fourth).outcome, CudaJitOutcome::VariantHit);
}

TEST_F(CudaJit, ProgramErrorsNameTheirPlace) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  CudaJitRequest request = cheapRequest();
  request.source = "mask causal(b, h, q, kv) = q >= nowhere\n";
  request.score = "";
  KernelCache cache(dir.path());
  try {
    loadCudaMods(request, cache);
    FAIL() << "no error";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("test.attn:1:"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("nowhere"), std::string::npos)
        << error.what();
  }
  request = cheapRequest();
  request.score = "missing";
  try {
    loadCudaMods(request, cache);
    FAIL() << "no error";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("no score mod named 'missing'"),
              std::string::npos)
        << error.what();
  }
  // Nothing was recorded for either.
  for (const auto &file : fs::directory_iterator(dir.path()))
    EXPECT_NE(file.path().extension(), ".variant") << file.path();
}

TEST_F(CudaJit, PluginSearchOrder) {
  {
    ScopedEnv set("PAGEDC_CODEGEN_PLUGIN", "/nonexistent/libpagedc-codegen.so");
    std::vector<std::string> tried;
    EXPECT_EQ(findCodegenPlugin(&tried), "");
    ASSERT_EQ(tried.size(), 1u); // when set, the only place
    EXPECT_EQ(tried[0], "/nonexistent/libpagedc-codegen.so");
  }
  unsetenv("PAGEDC_CODEGEN_PLUGIN");
  // Unset: next to the executable first (bin/../lib in the build tree).
  std::vector<std::string> tried;
  std::string found = findCodegenPlugin(&tried);
  ASSERT_FALSE(tried.empty());
  EXPECT_NE(tried[0].find("/../lib/libpagedc-codegen.so"), std::string::npos);
  EXPECT_EQ(found, tried.back());
  EXPECT_TRUE(fs::equivalent(found, PAGEDC_TEST_PLUGIN));
}

TEST_F(CudaJit, PluginNotFoundIsAClearError) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  std::string attn = dir.path() + "/test.attn";
  writeFile(attn, kProgram);
  std::map<std::string, std::string> stats;
  std::string errors;
  int status = runTool(fmt::format("'{}' --mask=causal --kernel=prefill", attn),
                       stats, errors, dir.path(),
                       dir.path() + "/missing/libpagedc-codegen.so");
  EXPECT_EQ(status, 1);
  EXPECT_NE(errors.find("code generator plugin libpagedc-codegen.so was not found"),
            std::string::npos)
      << errors;
  EXPECT_NE(errors.find(dir.path() + "/missing/libpagedc-codegen.so"),
            std::string::npos)
      << errors;
}

TEST_F(CudaJit, NewProcessHitsWithoutLlvm) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  std::string attn = dir.path() + "/test.attn";
  writeFile(attn, kProgram);
  std::string args = fmt::format(
      "'{}' --mask=causal --score=capped --kernel=decode --gqa=4 --arch=sm_80 "
      "-D LIMIT=2048",
      attn);
  std::map<std::string, std::string> stats;
  std::string errors;
  ASSERT_EQ(runTool(args + " --require-hit", stats, errors, dir.path()), 3)
      << errors;
  EXPECT_EQ(stats["outcome"], "generated");
  EXPECT_EQ(stats["plugin_loaded"], "1");
  EXPECT_EQ(stats["llvm_mapped"], "1"); // the plugin brings LLVM along
  // The split kernel's unit and its merge unit (KernelCache::Modules).
  EXPECT_EQ(stats["compiles"], "2");

  ASSERT_EQ(runTool(args + " --require-hit", stats, errors, dir.path()), 0)
      << errors;
  EXPECT_EQ(stats["outcome"], "variant-hit");
  EXPECT_EQ(stats["disk_hits"], "2");
  EXPECT_EQ(stats["compiles"], "0");
  EXPECT_EQ(stats["plugin_loaded"], "0");
  EXPECT_EQ(stats["llvm_mapped"], "0");

  // The same request from this process finds the variant the tool wrote.
  CudaJitRequest request;
  request.source = kProgram;
  request.mask = "causal";
  request.score = "capped";
  request.overrides = {{"LIMIT", "2048"}};
  KernelConfig config;
  config.kind = KernelKind::Decode;
  config.groupSize = 4;
  request.configs = {config};
  request.options.arch = "sm_80";
  EXPECT_EQ(cudaVariantKey(request), stats["variant"]);
}

TEST_F(CudaJit, VariantOfAnotherPluginFileIsRegenerated) {
  REQUIRE_NVRTC();
  TempDir dir("pagedc-cudajit");
  std::string attn = dir.path() + "/test.attn";
  writeFile(attn, kProgram);
  // Another build of the code generator: same build id, another file.
  std::string other = dir.path() + "/other/libpagedc-codegen.so";
  fs::create_directories(dir.path() + "/other");
  fs::copy_file(PAGEDC_TEST_PLUGIN, other);
  std::string args = fmt::format("'{}' --mask=causal --kernel=prefill", attn);
  std::map<std::string, std::string> stats;
  std::string errors;
  ASSERT_EQ(runTool(args, stats, errors, dir.path()), 0) << errors;
  EXPECT_EQ(stats["outcome"], "generated");
  ASSERT_EQ(runTool(args, stats, errors, dir.path(), other), 0) << errors;
  EXPECT_EQ(stats["outcome"], "generated"); // recorded by the other file
  EXPECT_EQ(stats["plugin_loaded"], "1");
  EXPECT_EQ(stats["compiles"], "0"); // same mod code, same kernel entry
  ASSERT_EQ(runTool(args, stats, errors, dir.path(), other), 0) << errors;
  EXPECT_EQ(stats["outcome"], "variant-hit");
  EXPECT_EQ(stats["plugin_loaded"], "0");
}

/// The address space this process has mapped now (/proc/self/status).
uint64_t mappedBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.compare(0, 7, "VmSize:") == 0)
      return std::strtoull(line.c_str() + 7, nullptr, 10) * 1024;
  return 0;
}

/// The file of the libLLVM this process has mapped, or "" if none.
std::string mappedLlvm() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    size_t at = line.find('/');
    if (at != std::string::npos && line.find("/libLLVM", at) != std::string::npos)
      return line.substr(at);
  }
  return "";
}

// Out of memory inside the plugin's code generation is a pagedc::Error, not
// an abort of the host. The child runs with LLVM's new-handler installed (a
// host that ran InitLLVM does so), which sends every failed allocation, like
// LLVM's own safe_malloc, to llvm::report_bad_alloc_error: without a handler
// from the plugin it prints "LLVM ERROR: out of memory" and aborts. The
// program's mods double at each level when inlined, so code generation runs
// into any address-space limit, here 128 MiB above what is mapped.
TEST_F(CudaJit, OutOfMemoryInCodeGenerationIsAnError) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory does not fit an address-space limit";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "AddressSanitizer's shadow memory does not fit an address-space limit";
#endif
#endif
  TempDir dir("pagedc-cudajit-oom");
  // Load the plugin, and libLLVM with it, on a program that fails at once.
  CudaJitRequest broken = cheapRequest();
  broken.source = "mask m(b, h, q, kv) = (\n";
  broken.mask = "m";
  broken.score = "";
  KernelCache memoryOnly("");
  EXPECT_THROW(loadCudaMods(broken, memoryOnly), Error);
  const std::string llvm = mappedLlvm();
  ASSERT_FALSE(llvm.empty()) << "the plugin did not map libLLVM";
  std::string program = "mask m0(b, h, q, kv) = q >= kv\n";
  for (int i = 1; i <= 40; ++i)
    program += fmt::format("mask m{}(b, h, q, kv) = m{}(b, h, q + 1, kv) & m{}(b, h, q * 3, kv)\n",
                           i, i - 1, i - 1);
  const std::string messagePath = dir.path() + "/message.txt";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    void *library = dlopen(llvm.c_str(), RTLD_NOW | RTLD_NOLOAD);
    auto install = library ? reinterpret_cast<void (*)()>(
                                 dlsym(library, "_ZN4llvm33install_out_of_memory_new_handlerEv"))
                           : nullptr;
    if (!install)
      _exit(10);
    install();
    const rlim_t bytes = mappedBytes() + (rlim_t(128) << 20);
    struct rlimit limit = {bytes, bytes};
    if (setrlimit(RLIMIT_AS, &limit) != 0)
      _exit(11);
    CudaJitRequest request = cheapRequest();
    request.source = program;
    request.mask = "m40";
    request.score = "";
    try {
      loadCudaMods(request, memoryOnly);
      _exit(12);
    } catch (const Error &error) {
      std::ofstream(messagePath) << error.what();
      _exit(0);
    } catch (...) {
      _exit(13);
    }
  }
  int status = 0;
  bool done = false;
  for (int tenths = 0; tenths < 1200 && !done; ++tenths) {
    done = waitpid(child, &status, WNOHANG) == child;
    if (!done)
      usleep(100000);
  }
  if (!done) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  ASSERT_TRUE(done) << "still generating after 120 s";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? fmt::format("killed by signal {}", WTERMSIG(status))
                              : fmt::format("exit {}", WEXITSTATUS(status)));
  const std::string message = readFile(messagePath);
  EXPECT_NE(message.find("test.attn: out of memory during code generation"), std::string::npos)
      << message;
}

} // namespace
