//===- KernelBundleTest.cpp - Bundle manifest writer and reader -----------===//

#include "pagedc/Error.h"
#include "pagedc/KernelBundle.h"
#include "support/CudaTestSupport.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

using namespace pagedc;
namespace fs = std::filesystem;

namespace {

using pagedc::test::TempDir;

/// A compiled kernel with fake image bytes (the bundle code never looks
/// inside the image), so these tests need no NVRTC.
CompiledKernel fakeKernel(KernelKind kind, std::string image) {
  CompiledKernel kernel;
  kernel.config.kind = kind;
  kernel.config.elementType = DType::F16;
  kernel.config.headDim = 64;
  kernel.config.pageSize = 128;
  kernel.config.groupSize = 4;
  kernel.config.returnLse = true;
  kernel.arch = "sm_90";
  kernel.key = kind == KernelKind::Prefill ? "00112233445566778899aabbccddeeff"
                                           : "ffeeddccbbaa99887766554433221100";
  kernel.kernelNames = kind == KernelKind::Prefill
                           ? std::vector<std::string>{"pagedc_prefill"}
                           : std::vector<std::string>{"pagedc_decode", "pagedc_decode_merge"};
  kernel.image = std::move(image);
  return kernel;
}

} // namespace

TEST(KernelBundle, WritesAndReadsBack) {
  TempDir dir("pagedc-bundle");
  KernelBundle bundle;
  bundle.add(fakeKernel(KernelKind::Prefill, std::string("\x7f" "ELF\0prefill", 12)), "causal \"v2\"");
  // A packed-batch decode (BatchAttention's) of an f32 out: its flags come
  // back too.
  CompiledKernel packedDecode = fakeKernel(KernelKind::Decode, "\x7f"
                                                               "ELFdecode bytes");
  packedDecode.config.packedBatch = true;
  packedDecode.config.outputF32 = true;
  packedDecode.config.noBlockMask = true;
  bundle.add(packedDecode, "causal \"v2\"");
  // A warpgroup prefill with a 2-stage ring, two CTAs an SM: its limit and
  // CTAs come back too.
  CompiledKernel ring = fakeKernel(KernelKind::Prefill, "\x7f" "ELFring");
  ring.config.headDim = 128;
  ring.config.blockM = 64;
  ring.config.blockN = 64;
  ring.config.warpRows = 64;
  ring.config.prefillStageLimit = 2;
  ring.config.prefillCtasPerSm = 2;
  ring.key = "0123456789abcdef0123456789abcdef";
  bundle.add(ring, "causal \"v2\"");
  // A decode of an 8-bit float cache: its type comes back too.
  CompiledKernel float8 = fakeKernel(KernelKind::Decode, "\x7f" "ELFf8");
  float8.config.kvFloat8 = DType::F8E5M2;
  float8.key = "fedcba9876543210fedcba9876543210";
  bundle.add(float8, "causal \"v2\"");
  bundle.write(dir.path());
  EXPECT_TRUE(fs::exists(fs::path(dir.path()) / "manifest.json"));

  KernelBundle loaded = KernelBundle::read(dir.path());
  ASSERT_EQ(loaded.modules.size(), 4u);
  EXPECT_EQ(loaded.modules[3].config.kvFloat8, std::optional<DType>(DType::F8E5M2));
  EXPECT_FALSE(loaded.modules[1].config.kvFloat8);
  EXPECT_TRUE(loaded.modules[1].config.packedBatch);
  EXPECT_TRUE(loaded.modules[1].config.outputF32);
  EXPECT_FALSE(loaded.modules[0].config.packedBatch);
  EXPECT_FALSE(loaded.modules[0].config.outputF32);
  EXPECT_TRUE(loaded.modules[1].config.noBlockMask);
  EXPECT_FALSE(loaded.modules[0].config.noBlockMask);
  EXPECT_EQ(loaded.modules[2].config.prefillStageLimit, 2);
  EXPECT_EQ(loaded.modules[2].config.prefillCtasPerSm, 2);
  EXPECT_EQ(loaded.modules[0].config.prefillCtasPerSm, 1);
  EXPECT_EQ(loaded.modules[2].sharedMemoryBytes, ring.config.sharedMemoryBytes());
  for (size_t i = 0; i < 4; ++i) {
    const BundleModule &a = bundle.modules[i], &b = loaded.modules[i];
    EXPECT_EQ(a.file, b.file);
    EXPECT_EQ(a.arch, b.arch);
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.checksum, b.checksum);
    EXPECT_EQ(a.kernelNames, b.kernelNames);
    EXPECT_EQ(a.threads, b.threads);
    EXPECT_EQ(a.sharedMemoryBytes, b.sharedMemoryBytes);
    EXPECT_TRUE(a.config == b.config);
    EXPECT_EQ(a.mods, "causal \"v2\"");
    EXPECT_EQ(b.mods, a.mods);
    EXPECT_EQ(a.image, b.image);
  }
  KernelConfig decode = bundle.modules[1].config;
  EXPECT_EQ(loaded.find("causal \"v2\"", decode, "sm_90"), &loaded.modules[1]);
  EXPECT_EQ(loaded.find("causal \"v2\"", decode, "sm_80"), nullptr);
  EXPECT_EQ(loaded.find("alibi", decode, "sm_90"), nullptr);
  EXPECT_EQ(loaded.modules[1].sharedMemoryBytes, decode.sharedMemoryBytes());
}

TEST(KernelBundle, CorruptModuleIsRejected) {
  TempDir dir("pagedc-bundle");
  KernelBundle bundle;
  bundle.add(fakeKernel(KernelKind::Prefill, "0123456789"), "none");
  bundle.write(dir.path());
  {
    std::ofstream file(fs::path(dir.path()) / bundle.modules[0].file,
                       std::ios::binary | std::ios::trunc);
    file << "0123456788";
  }
  try {
    KernelBundle::read(dir.path());
    FAIL() << "corrupt module accepted";
  } catch (const Error &error) {
    EXPECT_NE(std::string(error.what()).find("is corrupt"), std::string::npos);
  }
}

TEST(KernelBundle, MalformedManifestsNameTheProblem) {
  KernelBundle bundle;
  bundle.add(fakeKernel(KernelKind::Decode, "x"), "none");
  std::string good = bundle.manifestJson();
  EXPECT_NO_THROW(KernelBundle::parseManifest(good));

  auto expectError = [](const std::string &text, const std::string &needle) {
    try {
      KernelBundle::parseManifest(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << error.what() << " (wanted " << needle << ")";
    }
  };
  auto replaced = [&](const std::string &from, const std::string &to) {
    std::string text = good;
    size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  expectError("{", "invalid JSON");
  expectError("[]", "must be a JSON object");
  expectError(replaced("\"version\": 1", "\"version\": 7"), "version 7");
  expectError(replaced("\"threads\": 128", "\"threads\": \"many\""), "modules[0].threads must be an integer");
  expectError(replaced("\"head_dim\": 64", "\"head_dim\": 72"), "head dim 72");
  expectError(replaced("\"kind\": \"decode\"", "\"kind\": \"sideways\""), "unknown kernel kind 'sideways'");
  expectError(replaced("\"checksum\"", "\"checksun\""), "missing field 'checksum'");
  std::string file = bundle.modules[0].file;
  expectError(replaced("\"" + file + "\"", "\"../etc/passwd\""), "plain file name");
  expectError(good + "x", "expected end of input");
  // Integral numbers beyond int64 are errors, never an undefined conversion
  // (the bundle fuzzer's 8.3e57).
  for (const char *big : {"8.3e57", "1e19", "9223372036854775808.0", "-1e300"})
    expectError(replaced("\"threads\": 128", std::string("\"threads\": ") + big),
                "modules[0].threads is out of the range of a 64-bit integer");
  EXPECT_NO_THROW(KernelBundle::parseManifest(replaced("\"threads\": 128", "\"threads\": 128.0")));
}

// Issue 47: a file where the bundle directory should be, or a path below
// one, is a pagedc::Error (not a std::filesystem::filesystem_error), and the
// file is left as it was; a write into a fresh nested directory works.
TEST(KernelBundle, WriteRefusesAFileInPlaceOfTheDirectory) {
  TempDir dir("pagedc-bundle");
  KernelBundle bundle;
  bundle.add(fakeKernel(KernelKind::Decode, "\x7f" "ELFdecode"), "causal");
  const std::string file = (fs::path(dir.path()) / "program.attn").string();
  std::ofstream(file) << "mask m(b, h, q, kv) = q >= kv\n";
  for (const std::string &target : {file, file + "/sub", file + "/sub/deeper"}) {
    try {
      bundle.write(target);
      ADD_FAILURE() << "no error for " << target;
    } catch (const Error &error) {
      EXPECT_NE(std::string(error.what()).find("exists and is not a directory"),
                std::string::npos)
          << error.what();
    }
  }
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "mask m(b, h, q, kv) = q >= kv\n");
  EXPECT_NO_THROW(bundle.write((fs::path(dir.path()) / "a" / "b").string()));
  EXPECT_TRUE(fs::exists(fs::path(dir.path()) / "a" / "b" / "manifest.json"));
  // No temporary files next to what was written.
  for (const auto &entry : fs::recursive_directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
        << entry.path();
}
