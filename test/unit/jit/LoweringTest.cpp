//===- LoweringTest.cpp - Hand-built row functions through the JIT --------===//
//
// Builds ModABI row functions directly in func/scf/arith/math (plus LLVM
// dialect loads and stores), lowers them with the CPU pipeline's tail and
// calls them through the C function pointer types of ModABI.h.
//
//===----------------------------------------------------------------------===//

#include "Conversion/CPU/LowerToLLVM.h"
#include "JIT/JitEngine.h"
#include "pagedc/ModABI.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace mlir;

namespace {

/// The ABI's six leading arguments plus the output pointer.
FunctionType rowFunctionType(MLIRContext *context) {
  Type ptr = LLVM::LLVMPointerType::get(context);
  Type i32 = IntegerType::get(context, 32);
  return FunctionType::get(context, {ptr, i32, i32, i32, i32, i32, ptr}, {});
}

/// Emits `for i in [0, count): body(i, kv_begin + i)` into `function`.
void buildRowLoop(OpBuilder &builder, func::FuncOp function,
                  function_ref<void(OpBuilder &, Value i, Value kv)> body) {
  Location loc = builder.getUnknownLoc();
  Block *entry = function.addEntryBlock();
  builder.setInsertionPointToStart(entry);
  Value zero = builder.create<arith::ConstantIndexOp>(loc, 0);
  Value one = builder.create<arith::ConstantIndexOp>(loc, 1);
  Value count = builder.create<arith::IndexCastOp>(
      loc, builder.getIndexType(), entry->getArgument(5));
  auto loop = builder.create<scf::ForOp>(loc, zero, count, one);
  builder.setInsertionPointToStart(loop.getBody());
  Value i = loop.getInductionVar();
  Value i32 = builder.create<arith::IndexCastOp>(loc, builder.getI32Type(), i);
  Value kv = builder.create<arith::AddIOp>(loc, entry->getArgument(4), i32);
  body(builder, i, kv);
  builder.setInsertionPointAfter(loop);
  builder.create<func::ReturnOp>(loc);
}

class LoweringTest : public ::testing::Test {
protected:
  LoweringTest() {
    DialectRegistry registry;
    pagedc::registerCpuLoweringDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }
  MLIRContext context;
};

TEST_F(LoweringTest, CausalMaskRowRunsThroughTheJit) {
  OpBuilder builder(&context);
  Location loc = builder.getUnknownLoc();
  auto module = ModuleOp::create(loc);
  builder.setInsertionPointToEnd(module.getBody());
  auto function = builder.create<func::FuncOp>(loc, "causal_row",
                                               rowFunctionType(&context));
  buildRowLoop(builder, function, [&](OpBuilder &b, Value i, Value kv) {
    Value q = function.getArgument(3);
    Value keep = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::sge, q, kv);
    Value byte = b.create<arith::ExtUIOp>(loc, b.getI8Type(), keep);
    Value offset = b.create<arith::IndexCastOp>(loc, b.getI64Type(), i);
    Value address = b.create<LLVM::GEPOp>(
        loc, LLVM::LLVMPointerType::get(&context), b.getI8Type(),
        function.getArgument(6), ValueRange{offset});
    b.create<LLVM::StoreOp>(loc, byte, address);
  });
  ASSERT_TRUE(succeeded(pagedc::lowerToLLVMDialect(module)));
  auto engine = pagedc::jit::JitEngine::create(module);
  ASSERT_TRUE(bool(engine)) << llvm::toString(engine.takeError());
  auto symbol = (*engine)->lookup("causal_row");
  ASSERT_TRUE(bool(symbol)) << llvm::toString(symbol.takeError());
  auto row = reinterpret_cast<PagedcMaskRowFn>(*symbol);

  std::mt19937 random(7);
  for (int trial = 0; trial < 50; ++trial) {
    int32_t q = std::uniform_int_distribution<int32_t>(0, 300)(random);
    int32_t begin = std::uniform_int_distribution<int32_t>(0, 300)(random);
    int32_t count = std::uniform_int_distribution<int32_t>(1, 67)(random);
    std::vector<uint8_t> out(count, 7);
    row(nullptr, 0, 0, q, begin, count, out.data());
    for (int32_t i = 0; i < count; ++i)
      ASSERT_EQ(out[i], q >= begin + i ? 1 : 0) << "q=" << q << " kv=" << begin + i;
  }
  module.erase();
}

TEST_F(LoweringTest, SoftcapAlibiScoreRowReadsBufferAndMatchesDouble) {
  // scores[i] = 20 * tanh((scores[i] + slopes[h] * (kv - q)) / 20) + tan(s)/8
  OpBuilder builder(&context);
  Location loc = builder.getUnknownLoc();
  auto module = ModuleOp::create(loc);
  builder.setInsertionPointToEnd(module.getBody());
  auto function = builder.create<func::FuncOp>(loc, "score_row",
                                               rowFunctionType(&context));
  Type ptr = LLVM::LLVMPointerType::get(&context);
  buildRowLoop(builder, function, [&](OpBuilder &b, Value i, Value kv) {
    Value context = function.getArgument(0);
    Value h = function.getArgument(2);
    Value q = function.getArgument(3);
    // ctx->buffers[0].data
    Value buffers = b.create<LLVM::LoadOp>(loc, ptr, context);
    Value data = b.create<LLVM::LoadOp>(loc, ptr, buffers);
    Value h64 = b.create<arith::ExtSIOp>(loc, b.getI64Type(), h);
    Value slopeAddress = b.create<LLVM::GEPOp>(loc, ptr, b.getF32Type(), data,
                                               ValueRange{h64});
    Value slope = b.create<LLVM::LoadOp>(loc, b.getF32Type(), slopeAddress);
    Value offset = b.create<arith::IndexCastOp>(loc, b.getI64Type(), i);
    Value scoreAddress = b.create<LLVM::GEPOp>(
        loc, ptr, b.getF32Type(), function.getArgument(6), ValueRange{offset});
    Value s = b.create<LLVM::LoadOp>(loc, b.getF32Type(), scoreAddress);
    Value distance = b.create<arith::SIToFPOp>(
        loc, b.getF32Type(), b.create<arith::SubIOp>(loc, kv, q));
    Value biased = b.create<arith::AddFOp>(
        loc, s, b.create<arith::MulFOp>(loc, slope, distance));
    Value cap = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(20.0f));
    Value eighth = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0.125f));
    Value capped = b.create<arith::MulFOp>(
        loc, cap,
        b.create<math::TanhOp>(loc, b.create<arith::DivFOp>(loc, biased, cap)));
    Value tangent = b.create<arith::MulFOp>(
        loc, eighth, b.create<math::TanOp>(loc, s));
    b.create<LLVM::StoreOp>(loc, b.create<arith::AddFOp>(loc, capped, tangent),
                            scoreAddress);
  });
  ASSERT_TRUE(succeeded(pagedc::lowerToLLVMDialect(module)));
  auto engine = pagedc::jit::JitEngine::create(module);
  ASSERT_TRUE(bool(engine)) << llvm::toString(engine.takeError());
  auto symbol = (*engine)->lookup("score_row");
  ASSERT_TRUE(bool(symbol)) << llvm::toString(symbol.takeError());
  auto row = reinterpret_cast<PagedcScoreRowFn>(*symbol);

  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> slopes(8);
  for (float &slope : slopes)
    slope = uniform(random);
  PagedcBufferRef buffer{slopes.data(), {8, 0, 0, 0}, {1, 0, 0, 0}};
  PagedcModContext modContext{&buffer, nullptr};
  for (int trial = 0; trial < 50; ++trial) {
    int32_t h = trial % 8;
    int32_t q = std::uniform_int_distribution<int32_t>(0, 100)(random);
    int32_t begin = std::uniform_int_distribution<int32_t>(0, 100)(random);
    int32_t count = std::uniform_int_distribution<int32_t>(1, 45)(random);
    std::vector<float> scores(count);
    for (float &score : scores)
      score = 8.0f * uniform(random);
    std::vector<float> original = scores;
    row(&modContext, 0, h, q, begin, count, scores.data());
    for (int32_t i = 0; i < count; ++i) {
      double s = original[i];
      double expected = 20.0 * std::tanh((s + double(slopes[h]) *
                                                  (begin + i - q)) / 20.0) +
                        std::tan(s) / 8.0;
      ASSERT_NEAR(scores[i], expected, 1e-4 * std::max(1.0, std::abs(expected)))
          << "h=" << h << " q=" << q << " kv=" << begin + i;
    }
  }
  module.erase();
}

} // namespace
