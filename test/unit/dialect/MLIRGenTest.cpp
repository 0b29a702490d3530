//===- MLIRGenTest.cpp - MLIRGen and the pipeline on small programs -------===//

#include "Frontend/Frontend.h"
#include "Frontend/MLIRGen.h"
#include "Pipeline.h"

#include "Flex/FlexArithmetic.h"
#include "Flex/FlexDialect.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace mlir;
using namespace pagedc;

namespace {

/// Parses, checks and generates `source`; fails the test on any error.
class MLIRGenTest : public ::testing::Test {
protected:
  MLIRGenTest() {
    DialectRegistry registry;
    registerFlexDialects(registry);
    context.appendDialectRegistry(registry);
  }

  OwningOpRef<ModuleOp> generate(llvm::StringRef source,
                                 FrontendOptions options = {}) {
    std::string errors;
    llvm::raw_string_ostream errorStream(errors);
    pagedc::DiagnosticEngine diags("test.attn", source, errorStream);
    program = parseAndAnalyze(diags, options);
    errorStream.flush();
    EXPECT_TRUE(program) << errors;
    if (!program)
      return nullptr;
    OwningOpRef<ModuleOp> module = mlirGen(context, *program);
    EXPECT_TRUE(module);
    return module;
  }

  /// Runs buildPipeline(options) over `module`.
  bool runPipeline(ModuleOp module, PipelineOptions options = {}) {
    PassManager pm(&context);
    buildPipeline(pm, options);
    return succeeded(pm.run(module));
  }

  static flex::ModOp findMod(ModuleOp module, llvm::StringRef name) {
    return module.lookupSymbol<flex::ModOp>(name);
  }

  /// The names of the ops in the body of `mod`, in order.
  static std::vector<std::string> opNames(flex::ModOp mod) {
    std::vector<std::string> names;
    for (Operation &op : mod.getBody().front())
      names.push_back(op.getName().getStringRef().str());
    return names;
  }

  static std::vector<std::string> stringArray(Operation *op,
                                              llvm::StringRef name) {
    std::vector<std::string> values;
    auto array = op->getAttrOfType<ArrayAttr>(name);
    if (!array)
      return {"<missing>"};
    for (Attribute element : array) {
      if (auto string = llvm::dyn_cast<StringAttr>(element))
        values.push_back(string.getValue().str());
      else if (auto ref = llvm::dyn_cast<FlatSymbolRefAttr>(element))
        values.push_back(ref.getValue().str());
    }
    return values;
  }

  MLIRContext context;
  std::unique_ptr<ast::Program> program;
};

TEST_F(MLIRGenTest, DeclarationsKeepSourceOrderTypesAndValues) {
  auto module = generate("const W = 4 * 256\n"
                         "const SCALE = 0.5\n"
                         "param softcap: f32 = 30\n"
                         "param flag: bool\n"
                         "buffer doc: i32[B, 128, ?]\n"
                         "buffer bias: bf16[S]\n"
                         "mask m(b, h, q, kv) = q - kv <= W\n");
  ASSERT_TRUE(module);
  auto consts = llvm::to_vector(module->getOps<flex::ConstDeclOp>());
  ASSERT_EQ(consts.size(), 2u);
  EXPECT_EQ(consts[0].getSymName(), "W");
  EXPECT_EQ(llvm::cast<IntegerAttr>(consts[0].getValue()).getInt(), 1024);
  EXPECT_TRUE(consts[1].getValue().getType().isF32());

  auto params = llvm::to_vector(module->getOps<flex::ParamOp>());
  ASSERT_EQ(params.size(), 2u);
  EXPECT_TRUE(params[0].getType().isF32());
  ASSERT_TRUE(params[0].getDefaultValue().has_value());
  EXPECT_EQ(
      llvm::cast<FloatAttr>(*params[0].getDefaultValue()).getValueAsDouble(),
      30.0);
  EXPECT_TRUE(params[1].getType().isInteger(1));
  EXPECT_FALSE(params[1].getDefaultValue().has_value());

  auto buffers = llvm::to_vector(module->getOps<flex::BufferOp>());
  ASSERT_EQ(buffers.size(), 2u);
  ArrayAttr dims = buffers[0].getDims();
  ASSERT_EQ(dims.size(), 3u);
  EXPECT_EQ(llvm::cast<StringAttr>(dims[0]).getValue(), "B");
  EXPECT_EQ(llvm::cast<IntegerAttr>(dims[1]).getInt(), 128);
  EXPECT_TRUE(llvm::isa<UnitAttr>(dims[2]));
  EXPECT_TRUE(buffers[1].getElementType().isBF16());
  EXPECT_TRUE(buffers[1].getLoadType().isF32());
}

TEST_F(MLIRGenTest, ConstOverridesReachTheModule) {
  FrontendOptions options;
  options.constOverrides.push_back({"W", "4096"});
  auto module = generate("const W = 1024\n"
                         "mask m(b, h, q, kv) = q - kv <= W\n",
                         options);
  ASSERT_TRUE(module);
  auto decl = module->lookupSymbol<flex::ConstDeclOp>("W");
  ASSERT_TRUE(decl);
  EXPECT_EQ(llvm::cast<IntegerAttr>(decl.getValue()).getInt(), 4096);
}

TEST_F(MLIRGenTest, LocationsPointIntoTheSource) {
  auto module = generate("# comment\n"
                         "mask m(b, h, q, kv) = q >= kv\n");
  ASSERT_TRUE(module);
  flex::ModOp mod = findMod(*module, "m");
  ASSERT_TRUE(mod);
  auto modLoc = llvm::dyn_cast<FileLineColLoc>(mod.getLoc());
  ASSERT_TRUE(modLoc);
  EXPECT_EQ(modLoc.getFilename().getValue(), "test.attn");
  EXPECT_EQ(modLoc.getLine(), 2u);
  EXPECT_EQ(modLoc.getColumn(), 6u);
  // The comparison points at its operator.
  Operation &compare = mod.getBody().front().front();
  auto compareLoc = llvm::dyn_cast<FileLineColLoc>(compare.getLoc());
  ASSERT_TRUE(compareLoc);
  EXPECT_EQ(compareLoc.getLine(), 2u);
  EXPECT_EQ(compareLoc.getColumn(), 25u);
}

TEST_F(MLIRGenTest, CallsAndConstantsStayUntilThePipeline) {
  auto module = generate("const W = 8\n"
                         "mask causal(b, h, q, kv) = q >= kv\n"
                         "mask sliding(b, h, q, kv) = "
                         "causal(b, h, q, kv) & (q - kv <= W)\n");
  ASSERT_TRUE(module);
  flex::ModOp sliding = findMod(*module, "sliding");
  ASSERT_TRUE(sliding);
  EXPECT_EQ(opNames(sliding),
            (std::vector<std::string>{"flex.call", "arith.subi",
                                      "flex.const_ref", "arith.cmpi",
                                      "arith.andi", "flex.yield"}));
  ASSERT_TRUE(runPipeline(*module));
  for (const std::string &name : opNames(sliding)) {
    EXPECT_NE(name, "flex.call");
    EXPECT_NE(name, "flex.const_ref");
  }
  EXPECT_TRUE(sliding->hasAttr(flex::FlexDialect::kDiagonalAttrName));
  EXPECT_EQ(stringArray(sliding, flex::FlexDialect::kReadsAttrName),
            (std::vector<std::string>{"q", "kv"}));
}

TEST_F(MLIRGenTest, PromotionsAndTrueDivision) {
  // int / int is true division in f32; int + float promotes the int.
  auto module = generate("score s(s, b, h, q, kv) = s + q / 2 + h\n");
  ASSERT_TRUE(module);
  flex::ModOp mod = findMod(*module, "s");
  std::vector<std::string> names = opNames(mod);
  EXPECT_EQ(std::count(names.begin(), names.end(), "arith.sitofp"), 3);
  EXPECT_EQ(std::count(names.begin(), names.end(), "arith.divf"), 1);
  EXPECT_EQ(std::count(names.begin(), names.end(), "arith.addf"), 2);
}

TEST_F(MLIRGenTest, PyTorchOperators) {
  auto module = generate(
      "buffer slopes: f16[H]\n"
      "score s(s, b, h, q, kv) {\n"
      "  let a = (q // 3) % 4\n"
      "  let c = where(abs(q - kv) % 2 == 1, s * 0.5, s * 2.0)\n"
      "  let d = round(c) + sigmoid(c) + tanh_approx(c) + slopes[h]\n"
      "  d + int(c)\n"
      "}\n");
  ASSERT_TRUE(module);
  std::vector<std::string> names = opNames(findMod(*module, "s"));
  auto has = [&](llvm::StringRef name) {
    return std::find(names.begin(), names.end(), name.str()) != names.end();
  };
  EXPECT_TRUE(has("flex.floordiv"));
  EXPECT_TRUE(has("flex.floormod"));
  EXPECT_TRUE(has("math.absi"));
  EXPECT_TRUE(has("arith.select"));
  EXPECT_TRUE(has("math.roundeven"));
  EXPECT_TRUE(has("math.exp")); // sigmoid, expanded
  EXPECT_TRUE(has("flex.tanh_approx"));
  EXPECT_TRUE(has("flex.buffer_load"));
  EXPECT_TRUE(has("arith.fptosi")); // int() truncates toward zero
}

TEST_F(MLIRGenTest, DependenceResultsOfTheSpecification) {
  auto module = generate("buffer slopes: f32[H]\n"
                         "buffer doc: i32[B, S]\n"
                         "mask causal(b, h, q, kv) = q >= kv\n"
                         "mask document(b, h, q, kv) = "
                         "doc[b, q] == doc[b, kv]\n"
                         "score alibi(s, b, h, q, kv) = "
                         "s + slopes[h] * (kv - q)\n");
  ASSERT_TRUE(module);
  ASSERT_TRUE(runPipeline(*module));
  using Names = std::vector<std::string>;
  const char *reads = flex::FlexDialect::kReadsAttrName.data();
  const char *buffers = flex::FlexDialect::kBuffersAttrName.data();
  flex::ModOp causal = findMod(*module, "causal");
  EXPECT_EQ(stringArray(causal, reads), (Names{"q", "kv"}));
  EXPECT_EQ(stringArray(causal, buffers), Names{});
  flex::ModOp alibi = findMod(*module, "alibi");
  EXPECT_EQ(stringArray(alibi, reads), (Names{"h", "q", "kv"}));
  EXPECT_EQ(stringArray(alibi, buffers), Names{"slopes"});
  EXPECT_TRUE(alibi->hasAttr(flex::FlexDialect::kDiagonalAttrName));
  flex::ModOp document = findMod(*module, "document");
  EXPECT_EQ(stringArray(document, reads), (Names{"b", "q", "kv"}));
  EXPECT_EQ(stringArray(document, buffers), Names{"doc"});
  EXPECT_FALSE(document->hasAttr(flex::FlexDialect::kDiagonalAttrName));
}

TEST_F(MLIRGenTest, KeepModsDropsTheRest) {
  auto module = generate("buffer slopes: f32[H]\n"
                         "param cap: f32 = 1.0\n"
                         "mask causal(b, h, q, kv) = q >= kv\n"
                         "mask sliding(b, h, q, kv) = "
                         "causal(b, h, q, kv) & (q - kv <= 4)\n"
                         "score alibi(s, b, h, q, kv) = "
                         "s + slopes[h] * (kv - q) * cap\n");
  ASSERT_TRUE(module);
  PipelineOptions options;
  options.keepMods = {"sliding"};
  ASSERT_TRUE(runPipeline(*module, options));
  EXPECT_TRUE(findMod(*module, "sliding"));
  EXPECT_FALSE(findMod(*module, "alibi"));
  EXPECT_FALSE(module->lookupSymbol("slopes"));
  EXPECT_FALSE(module->lookupSymbol("cap"));
}

/// The shared scalar semantics against Python's, including the cases where
/// C++'s / and % differ.
TEST(FlexArithmeticTest, MatchesPython) {
  using flex::floorDiv;
  using flex::floorMod;
  EXPECT_EQ(floorDiv(-7, 2), -4);
  EXPECT_EQ(floorDiv(7, -2), -4);
  EXPECT_EQ(floorDiv(-7, -2), 3);
  EXPECT_EQ(floorDiv(6, 3), 2);
  EXPECT_EQ(floorMod(-7, 2), 1);
  EXPECT_EQ(floorMod(7, -2), -1);
  EXPECT_EQ(floorMod(-6, 3), 0);
  EXPECT_EQ(floorMod(int64_t(-1), int64_t(1) << 40), (int64_t(1) << 40) - 1);
  EXPECT_EQ(floorDiv(-7.5f, 2.0f), -4.0f);
  EXPECT_EQ(floorMod(-7.5f, 2.0f), 0.5f);
  EXPECT_EQ(floorMod(7.5, -2.0), -0.5);
  EXPECT_TRUE(std::signbit(floorDiv(-0.5, 4.0))); // -0.0, as torch gives
  EXPECT_TRUE(std::isinf(floorDiv(1.0f, 0.0f)));
  EXPECT_TRUE(std::isnan(floorMod(1.0f, 0.0f)));
}

} // namespace
