//===- CudaSourceTest.cpp - flex modules to CUDA hook code ----------------===//
//
// generateModCode / buildKernelSource on hand-written flex modules: the
// hoisting split, the neutral hooks, errors, and (when NVRTC can be loaded)
// that the assembled translation units compile for sm_80 and sm_90. The exact
// text of the generated functions is checked by the lit tests in
// test/Target; the whole corpus by the Corpus suite.
//
//===----------------------------------------------------------------------===//

#include "Target/CudaSource.h"

#include "Flex/FlexDialect.h"

#include "pagedc/Error.h"
#include "pagedc/Nvrtc.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

namespace {

/// A context with the flex dialects.
class CudaSourceTest : public ::testing::Test {
protected:
  CudaSourceTest() {
    mlir::DialectRegistry registry;
    registry.insert<pagedc::flex::FlexDialect, mlir::arith::ArithDialect,
                    mlir::math::MathDialect>();
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  mlir::OwningOpRef<mlir::ModuleOp> parse(llvm::StringRef text) {
    auto module = mlir::parseSourceString<mlir::ModuleOp>(text, &context);
    EXPECT_TRUE(module) << text.str();
    return module;
  }

  /// The generated code, or "" after reporting a test failure.
  std::string lower(llvm::StringRef text, llvm::StringRef mask,
                    llvm::StringRef score) {
    auto module = parse(text);
    if (!module)
      return {};
    llvm::Expected<std::string> code =
        pagedc::generateModCode(*module, mask, score);
    if (!code) {
      ADD_FAILURE() << llvm::toString(code.takeError());
      return {};
    }
    return *code;
  }

  /// The text of the hook function `name` (from its signature to the
  /// closing brace), or "".
  static std::string function(const std::string &code, llvm::StringRef name) {
    size_t start = code.find((" " + name + "(").str());
    if (start == std::string::npos)
      return {};
    size_t end = code.find("\n}\n", start);
    return code.substr(start, end - start);
  }

  mlir::MLIRContext context;
};

constexpr llvm::StringLiteral kProgram = R"mlir(
flex.param @softcap : f32 = 3.000000e+01 : f32
flex.buffer @slopes : f32 [H]
flex.buffer @doc : i32 [B, S]
flex.buffer @bias : bf16 [?]
flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}
flex.mod mask @document(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %0 = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
  %1 = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
  %2 = arith.cmpi eq, %0, %1 : i32
  flex.yield %2 : i1
}
flex.mod score @capped(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %0 = flex.buffer_load @slopes[%h] : (i32) -> f32
  %1 = arith.subi %kv, %q : i32
  %2 = arith.sitofp %1 : i32 to f32
  %3 = arith.mulf %0, %2 : f32
  %4 = arith.addf %s, %3 : f32
  %cap = flex.param_ref @softcap : f32
  %5 = arith.divf %4, %cap : f32
  %6 = flex.tanh_approx %5 : f32
  %7 = arith.mulf %cap, %6 : f32
  flex.yield %7 : f32
}
flex.mod score @natten_bias(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c32 = arith.constant 32 : i32
  %0 = flex.floordiv %q, %c32 : i32
  %1 = flex.floormod %kv, %c32 : i32
  %2 = arith.subi %0, %1 : i32
  %3 = math.absi %2 : i32
  %4 = flex.buffer_load @bias[%3] : (i32) -> f32
  %5 = math.exp %4 : f32
  %6 = arith.addf %s, %5 : f32
  flex.yield %6 : f32
}
)mlir";

TEST_F(CudaSourceTest, ParamsFollowDeclarationOrder) {
  std::string code = lower(kProgram, "causal", "");
  EXPECT_NE(code.find("struct Params {\n"
                      "  float softcap;\n"
                      "  const float* slopes;\n"
                      "  int64_t slopes_stride[1];\n"
                      "  int64_t slopes_size[1];\n"
                      "  const int32_t* doc;\n"
                      "  int64_t doc_stride[2];\n"
                      "  int64_t doc_size[2];\n"
                      "  const pagedc_bf16* bias;\n"
                      "  int64_t bias_stride[1];\n"
                      "  int64_t bias_size[1];\n"
                      "};"),
            std::string::npos)
      << code;
}

TEST_F(CudaSourceTest, KvIndependentLoadsMoveToTheRowFunction) {
  std::string code = lower(kProgram, "document", "capped");
  // doc[b, q] is read once per row; doc[b, kv] per element.
  std::string maskRow = function(code, "mask_row");
  std::string mask = function(code, "mask");
  EXPECT_NE(maskRow.find("flex_load(v1.doc,"), std::string::npos) << maskRow;
  EXPECT_EQ(mask.find("doc_stride[0]"), mask.rfind("doc_stride[0]")) << mask;
  EXPECT_NE(mask.find("v2.r0"), std::string::npos) << mask;
  // slopes[h] likewise; the param is read where it is used.
  std::string scoreRow = function(code, "score_row");
  std::string score = function(code, "score");
  EXPECT_NE(scoreRow.find("flex_load(v1.slopes,"), std::string::npos)
      << scoreRow;
  EXPECT_EQ(score.find("slopes"), std::string::npos) << score;
  EXPECT_NE(score.find("pagedc::tanh_approx("), std::string::npos) << score;
  EXPECT_NE(score.find(".softcap"), std::string::npos) << score;
  EXPECT_NE(code.find("constexpr bool kHasMask = true;"), std::string::npos);
  EXPECT_NE(code.find("constexpr bool kHasScore = true;"), std::string::npos);
}

TEST_F(CudaSourceTest, AbsentModsGetNeutralHooks) {
  std::string code = lower(kProgram, "", "");
  EXPECT_NE(code.find("constexpr bool kHasMask = false;"), std::string::npos);
  EXPECT_NE(code.find("constexpr bool kHasScore = false;"), std::string::npos);
  EXPECT_NE(function(code, "mask").find("return true;"), std::string::npos)
      << code;
  EXPECT_NE(function(code, "score").find("return v3;"), std::string::npos)
      << code;
}

TEST_F(CudaSourceTest, PythonDivisionAndHalfBuffers) {
  std::string code = lower(kProgram, "", "natten_bias");
  std::string scoreRow = function(code, "score_row");
  std::string score = function(code, "score");
  EXPECT_NE(scoreRow.find("flex_floordiv("), std::string::npos) << scoreRow;
  EXPECT_NE(score.find("flex_floormod("), std::string::npos) << score;
  // The bf16 buffer is read (and widened to float) by flex_load.
  EXPECT_NE(score.find("float v13 = flex_load(v1.bias,"), std::string::npos)
      << score;
  EXPECT_NE(score.find("expf("), std::string::npos) << score;
}

TEST_F(CudaSourceTest, UnknownOrMismatchedModsAreErrors) {
  auto module = parse(kProgram);
  ASSERT_TRUE(module);
  llvm::Expected<std::string> missing =
      pagedc::generateModCode(*module, "nope", "");
  ASSERT_FALSE(missing);
  EXPECT_NE(
      llvm::toString(missing.takeError()).find("no mask mod named 'nope'"),
      std::string::npos);
  llvm::Expected<std::string> wrongKind =
      pagedc::generateModCode(*module, "capped", "");
  ASSERT_FALSE(wrongKind);
  EXPECT_NE(
      llvm::toString(wrongKind.takeError()).find("'capped' is not a mask mod"),
      std::string::npos);
}

TEST_F(CudaSourceTest, DeclarationsMatchTheRuntimeView) {
  auto module = parse(kProgram);
  ASSERT_TRUE(module);
  llvm::Expected<pagedc::ModuleDeclarations> declarations =
      pagedc::collectDeclarations(*module);
  ASSERT_TRUE(bool(declarations)) << llvm::toString(declarations.takeError());
  ASSERT_EQ(declarations->params.size(), 1u);
  EXPECT_EQ(declarations->params[0].name, "softcap");
  ASSERT_TRUE(declarations->params[0].defaultValue.has_value());
  EXPECT_EQ(declarations->params[0].defaultValue->f32, 30.0f);
  ASSERT_EQ(declarations->buffers.size(), 3u);
  EXPECT_EQ(declarations->buffers[1].name, "doc");
  EXPECT_EQ(declarations->buffers[1].dims.size(), 2u);
  EXPECT_EQ(declarations->buffers[1].dims[1].kind, pagedc::BufferDim::Named);
  EXPECT_EQ(declarations->buffers[2].elementType, pagedc::DType::BF16);
  EXPECT_EQ(declarations->buffers[2].dims[0].kind, pagedc::BufferDim::Any);
}

/// Every hook combination of kProgram, assembled into prefill and decode
/// kernels and compiled by NVRTC for both architectures.
TEST_F(CudaSourceTest, AssembledKernelsCompileWithNvrtc) {
  std::string reason;
  if (!pagedc::Nvrtc::available(&reason))
    GTEST_SKIP() << "NVRTC not available: " << reason;
  auto module = parse(kProgram);
  ASSERT_TRUE(module);
  struct Case {
    const char *mask, *score;
    pagedc::KernelKind kind;
    const char *arch;
  };
  const Case cases[] = {
      {"document", "capped", pagedc::KernelKind::Prefill, "sm_80"},
      {"causal", "natten_bias", pagedc::KernelKind::Decode, "sm_90"},
  };
  for (const Case &c : cases) {
    pagedc::KernelConfig config;
    config.kind = c.kind;
    config.elementType = pagedc::DType::F16;
    config.headDim = 64;
    llvm::Expected<pagedc::KernelSource> source =
        pagedc::buildKernelSource(*module, c.mask, c.score, config);
    ASSERT_TRUE(bool(source)) << llvm::toString(source.takeError());
    pagedc::CompileOptions options;
    options.arch = c.arch;
    try {
      pagedc::CompileResult result = pagedc::Nvrtc::get().compile(
          source->code, "generated.cu", options, &*source);
      EXPECT_FALSE(result.image.empty());
    } catch (const pagedc::Error &error) {
      ADD_FAILURE() << c.mask << " + " << c.score << ": " << error.what();
    }
  }
}

} // namespace
