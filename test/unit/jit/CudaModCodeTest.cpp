//===- CudaModCodeTest.cpp - compileModsFromSource's CUDA mod code --------===//
//
// SourceCompileOptions::withCuda fills CompiledMods::cuda.modCode (and only
// then); the code matches the selection's declarations (the TU checks the
// Params size) and NVRTC compiles it into a prefill kernel.
//
//===----------------------------------------------------------------------===//

#include "JIT/CompileSource.h"
#include "pagedc/KernelCache.h"
#include "pagedc/KernelSource.h"
#include "pagedc/Nvrtc.h"

#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

using namespace pagedc;

namespace {

const char *const kSource = R"(
const WINDOW = 4
param softcap: f32 = 20.0
buffer slopes: f32[H]

mask sliding(b, h, q, kv) = (q >= kv) & (q - kv <= WINDOW)
score capped(s, b, h, q, kv) {
  let x = s + slopes[h] * (kv - q)
  softcap * tanh(x / softcap)
}
)";

CompiledMods compile(llvm::StringRef mask, llvm::StringRef score,
                     bool withCuda) {
  jit::SourceCompileOptions options;
  options.withCuda = withCuda;
  std::string diagnostics;
  llvm::raw_string_ostream stream(diagnostics);
  auto mods = jit::compileModsFromSource("test.attn", kSource, mask, score,
                                         options, stream);
  if (!mods) {
    ADD_FAILURE() << llvm::toString(mods.takeError()) << "\n" << diagnostics;
    return {};
  }
  return std::move(*mods);
}

TEST(CudaModCode, OnlyWhenAsked) {
  ASSERT_TRUE(jit::cudaCodeGenAvailable());
  CompiledMods cpuOnly = compile("sliding", "capped", false);
  EXPECT_TRUE(cpuOnly.cuda.empty());
  EXPECT_NE(cpuOnly.maskRow, nullptr);

  CompiledMods both = compile("sliding", "capped", true);
  // The CPU side is the same as without CUDA code.
  EXPECT_NE(both.maskRow, nullptr);
  EXPECT_NE(both.scoreRow, nullptr);
  ASSERT_EQ(both.buffers.size(), 1u);
  ASSERT_EQ(both.params.size(), 1u);
  const std::string &code = both.cuda.modCode;
  EXPECT_NE(code.find("namespace pagedc_mods"), std::string::npos) << code;
  EXPECT_NE(code.find("mask sliding, score capped"), std::string::npos)
      << code;
  EXPECT_EQ(both.cuda.bundle, nullptr);
}

TEST(CudaModCode, EachSelectionHasItsOwnCode) {
  std::string maskOnly = compile("sliding", "", true).cuda.modCode;
  std::string scoreOnly = compile("", "capped", true).cuda.modCode;
  std::string none = compile("", "", true).cuda.modCode;
  EXPECT_FALSE(maskOnly.empty());
  EXPECT_FALSE(scoreOnly.empty());
  EXPECT_FALSE(none.empty());
  EXPECT_NE(maskOnly, scoreOnly);
  EXPECT_NE(maskOnly, none);
  EXPECT_EQ(none.find("slopes"), std::string::npos) << none;
}

TEST(CudaModCode, NvrtcCompilesIt) {
  std::string why;
  if (!Nvrtc::available(&why))
    GTEST_SKIP() << "no NVRTC: " << why;
  for (auto [mask, score] : {std::pair{"sliding", "capped"},
                             std::pair{"", ""}}) {
    CompiledMods mods = compile(mask, score, true);
    KernelConfig config;
    config.kind = KernelKind::Prefill;
    config.elementType = DType::BF16;
    config.headDim = 64;
    config.returnLse = true;
    // The TU static_asserts that its Params has the host layout's size.
    config.paramsSize =
        ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
    KernelCache cache(""); // memory only
    CompileOptions options;
    options.arch = "sm_80";
    options.output = CompileOptions::Output::Ptx;
    std::shared_ptr<const CompiledKernel> kernel;
    try {
      kernel = cache.getOrCompile(config, mods.cuda.modCode, options);
    } catch (const std::exception &error) {
      FAIL() << "mask '" << mask << "' score '" << score
             << "': " << error.what();
    }
    ASSERT_NE(kernel, nullptr);
    EXPECT_FALSE(kernel->image.empty());
  }
}

} // namespace
