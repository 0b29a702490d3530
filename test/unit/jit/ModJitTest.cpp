//===- ModJitTest.cpp - JIT'd mods against the float64 evaluator ----------===//
//
// Hand-written flex modules (the form the pipeline produces) compiled by
// compileMods(): every row function is compared element by element with the
// float64 reference evaluator on random indices and random buffer contents,
// the reference itself is checked against plain C++ formulas, and the block
// classifier is checked to be sound (and exact where it can be).
//
//===----------------------------------------------------------------------===//

#include "JIT/ModJit.h"

#include "Flex/FlexDialect.h"
#include "pagedc/Tensor.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

using namespace mlir;

namespace {

/// Buffers and params of the test programs, with random contents.
struct Bindings {
  static constexpr int kBatch = 3, kHeads = 4, kLength = 300;
  std::vector<int32_t> documents;  // i32 [B, S], sorted per batch
  std::vector<float> slopes;       // f32 [H]
  std::vector<uint16_t> biasHalf;  // f16 [S]
  std::vector<uint16_t> biasBF16;  // bf16 [H, S] (column-major strides)
  std::vector<int64_t> offsets;    // i64 [S]
  std::vector<uint8_t> flags;      // bool [S]
  std::vector<PagedcBufferRef> buffers;
  std::vector<PagedcParamSlot> params;

  explicit Bindings(std::mt19937 &random) {
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    for (int b = 0; b < kBatch; ++b) {
      int document = 0;
      for (int s = 0; s < kLength; ++s) {
        if (std::uniform_int_distribution<int>(0, 40)(random) == 0)
          ++document;
        documents.push_back(document);
      }
    }
    for (int h = 0; h < kHeads; ++h)
      slopes.push_back(uniform(random));
    for (int s = 0; s < kLength; ++s) {
      // A finite half in (-2, 2): random sign, exponent 10..15, mantissa.
      uint16_t sign = std::uniform_int_distribution<int>(0, 1)(random) << 15;
      uint16_t exponent = std::uniform_int_distribution<int>(10, 15)(random);
      uint16_t mantissa = std::uniform_int_distribution<int>(0, 1023)(random);
      biasHalf.push_back(sign | (exponent << 10) | mantissa);
      offsets.push_back(std::uniform_int_distribution<int64_t>(-50, 50)(random));
      flags.push_back(std::uniform_int_distribution<int>(0, 1)(random));
    }
    biasBF16.resize(kHeads * kLength);
    for (uint16_t &value : biasBF16)
      value = pagedc::floatToBF16(uniform(random));
  }

  /// Lays out the buffers named in `order` (a compiled program's ABI order).
  PagedcModContext context(const pagedc::CompiledMods &mods) {
    buffers.clear();
    params.clear();
    for (const pagedc::BufferDecl &decl : mods.buffers) {
      if (decl.name == "doc")
        buffers.push_back({documents.data(), {kBatch, kLength}, {kLength, 1}});
      else if (decl.name == "slopes")
        buffers.push_back({slopes.data(), {kHeads}, {1}});
      else if (decl.name == "bias_half")
        buffers.push_back({biasHalf.data(), {kLength}, {1}});
      else if (decl.name == "bias_bf16") // a transposed view
        buffers.push_back({biasBF16.data(), {kHeads, kLength}, {1, kHeads}});
      else if (decl.name == "offsets")
        buffers.push_back({offsets.data(), {kLength}, {1}});
      else if (decl.name == "flags")
        buffers.push_back({flags.data(), {kLength}, {1}});
      else
        ADD_FAILURE() << "unexpected buffer " << decl.name;
    }
    for (const pagedc::ParamDecl &decl : mods.params) {
      PagedcParamSlot slot;
      if (decl.name == "softcap")
        slot.f32 = 7.5f;
      else if (decl.name == "window")
        slot.i32 = 37;
      else if (decl.name == "enabled")
        slot.i32 = 1;
      else
        ADD_FAILURE() << "unexpected param " << decl.name;
      params.push_back(slot);
    }
    return {buffers.data(), params.data()};
  }
};

/// A program covering the operations the front end emits. Written in the
/// form the pipeline leaves: calls inlined, constants folded.
constexpr const char *kProgram = R"mlir(
flex.param @softcap : f32 = 3.000000e+01 : f32
flex.param @window : i32
flex.param @enabled : i1 = true
flex.buffer @doc : i32 [B, S]
flex.buffer @slopes : f32 [H]
flex.buffer @bias_half : f16 [S]
flex.buffer @bias_bf16 : bf16 [H, S]
flex.buffer @offsets : i64 [S]
flex.buffer @flags : i1 [S]

flex.mod mask @causal(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1
    attributes {flex.reads = ["q", "kv"], flex.diagonal} {
  %0 = arith.cmpi sge, %q, %kv : i32
  flex.yield %0 : i1
}
flex.mod mask @sliding(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %w = flex.param_ref @window : i32
  %0 = arith.cmpi sge, %q, %kv : i32
  %1 = arith.subi %q, %kv : i32
  %2 = arith.cmpi sle, %1, %w : i32
  %3 = arith.andi %0, %2 : i1
  flex.yield %3 : i1
}
flex.mod mask @dilated(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c8 = arith.constant 8 : i32
  %c3 = arith.constant 3 : i32
  %c0 = arith.constant 0 : i32
  %0 = arith.subi %q, %kv : i32
  %1 = math.absi %0 : i32
  %2 = arith.cmpi sle, %1, %c8 : i32
  %3 = flex.floormod %0, %c3 : i32
  %4 = arith.cmpi eq, %3, %c0 : i32
  %5 = arith.andi %2, %4 : i1
  flex.yield %5 : i1
}
flex.mod mask @negative_division(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c5 = arith.constant 5 : i32
  %c2 = arith.constant 2 : i32
  %cm4 = arith.constant -4 : i32
  %cm3 = arith.constant -3 : i32
  %d = arith.subi %q, %kv : i32
  %e = arith.subi %kv, %q : i32
  %0 = flex.floormod %d, %c5 : i32
  %1 = arith.cmpi slt, %0, %c2 : i32
  %2 = flex.floordiv %e, %cm4 : i32
  %3 = arith.cmpi sge, %2, %cm3 : i32
  %4 = arith.xori %1, %3 : i1
  flex.yield %4 : i1
}
flex.mod mask @natten(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c16 = arith.constant 16 : i32
  %c2 = arith.constant 2 : i32
  %c1 = arith.constant 1 : i32
  %c13 = arith.constant 13 : i32
  %qx = flex.floordiv %q, %c16 : i32
  %qy = flex.floormod %q, %c16 : i32
  %kx = flex.floordiv %kv, %c16 : i32
  %ky = flex.floormod %kv, %c16 : i32
  %cx0 = arith.maxsi %qx, %c2 : i32
  %cx = arith.minsi %cx0, %c13 : i32
  %cy0 = arith.maxsi %qy, %c1 : i32
  %cy = arith.minsi %cy0, %c13 : i32
  %dx = arith.subi %cx, %kx : i32
  %dy = arith.subi %cy, %ky : i32
  %ax = math.absi %dx : i32
  %ay = math.absi %dy : i32
  %0 = arith.cmpi sle, %ax, %c2 : i32
  %1 = arith.cmpi sle, %ay, %c1 : i32
  %2 = arith.andi %0, %1 : i1
  flex.yield %2 : i1
}
flex.mod mask @document(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %dq = flex.buffer_load @doc[%b, %q] : (i32, i32) -> i32
  %dk = flex.buffer_load @doc[%b, %kv] : (i32, i32) -> i32
  %0 = arith.cmpi eq, %dq, %dk : i32
  %1 = arith.cmpi sge, %q, %kv : i32
  %2 = arith.andi %0, %1 : i1
  %on = flex.param_ref @enabled : i1
  %f = flex.buffer_load @flags[%kv] : (i32) -> i1
  %true = arith.constant true
  %nf = arith.xori %f, %true : i1
  %3 = arith.ori %2, %nf : i1
  %4 = arith.andi %3, %on : i1
  flex.yield %4 : i1
}
flex.mod mask @bits(%b: i32, %h: i32, %q: i32, %kv: i32) -> i1 {
  %c3 = arith.constant 3 : i32
  %c1 = arith.constant 1 : i32
  %c0 = arith.constant 0 : i32
  %0 = arith.shrsi %q, %c3 : i32
  %1 = arith.shli %kv, %c1 : i32
  %2 = arith.xori %0, %1 : i32
  %3 = arith.andi %2, %c3 : i32
  %4 = arith.cmpi ne, %3, %c0 : i32
  %5 = arith.cmpi sgt, %h, %b : i32
  %6 = arith.xori %4, %5 : i1
  flex.yield %6 : i1
}
flex.mod score @alibi_softcap(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %slope = flex.buffer_load @slopes[%h] : (i32) -> f32
  %cap = flex.param_ref @softcap : f32
  %0 = arith.subi %kv, %q : i32
  %1 = arith.sitofp %0 : i32 to f32
  %2 = arith.mulf %slope, %1 : f32
  %3 = arith.addf %s, %2 : f32
  %4 = arith.divf %3, %cap : f32
  %5 = flex.tanh_approx %4 : f32
  %6 = arith.mulf %cap, %5 : f32
  flex.yield %6 : f32
}
flex.mod score @biases(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %bh = flex.buffer_load @bias_half[%kv] : (i32) -> f32
  %bb = flex.buffer_load @bias_bf16[%h, %q] : (i32, i32) -> f32
  %off = flex.buffer_load @offsets[%q] : (i32) -> i64
  %offf = arith.sitofp %off : i64 to f32
  %0 = arith.mulf %s, %bh : f32
  %1 = arith.addf %0, %bb : f32
  %c001 = arith.constant 0.01 : f32
  %2 = arith.mulf %offf, %c001 : f32
  %3 = arith.addf %1, %2 : f32
  flex.yield %3 : f32
}
flex.mod score @floats(%s: f32, %b: i32, %h: i32, %q: i32, %kv: i32) -> f32 {
  %c07 = arith.constant 0.7 : f32
  %cm13 = arith.constant -1.3 : f32
  %c2 = arith.constant 2 : i32
  %c1 = arith.constant 1 : i32
  %c05 = arith.constant 0.5 : f32
  %c20 = arith.constant 2.0 : f32
  %0 = flex.floordiv %s, %c07 : f32
  %1 = flex.floormod %s, %cm13 : f32
  %2 = arith.addf %0, %1 : f32
  %d = arith.subi %kv, %q : i32
  %ad = math.absi %d : i32
  %m = flex.floormod %ad, %c2 : i32
  %odd = arith.cmpi eq, %m, %c1 : i32
  %half = arith.mulf %s, %c05 : f32
  %twice = arith.mulf %s, %c20 : f32
  %3 = arith.select %odd, %half, %twice : f32
  %4 = arith.addf %2, %3 : f32
  %cs = math.cos %s : f32
  %sc = math.sin %cs : f32
  %bf = arith.sitofp %b : i32 to f32
  %tb = math.tan %bf : f32
  %5 = arith.addf %sc, %tb : f32
  %6 = arith.addf %4, %5 : f32
  %e = math.exp2 %c05 : f32
  %sq = arith.mulf %s, %s : f32
  %r = math.rsqrt %e : f32
  %7 = arith.mulf %sq, %r : f32
  %8 = arith.addf %6, %7 : f32
  %qf = arith.sitofp %q : i32 to f32
  %c4 = arith.constant 4.0 : f32
  %s4 = arith.mulf %s, %c4 : f32
  %fl = math.floor %s4 : f32
  %qi = arith.fptosi %s4 : f32 to i32
  %qs = arith.subi %q, %qi : i32
  %qsf = arith.sitofp %qs : i32 to f32
  %9 = arith.maximumf %8, %qsf : f32
  %10 = arith.addf %9, %fl : f32
  %11 = arith.addf %10, %qf : f32
  flex.yield %11 : f32
}
)mlir";

class ModJitTest : public ::testing::Test {
protected:
  ModJitTest() : random(1234), bindings(random) {
    context.loadDialect<pagedc::flex::FlexDialect, arith::ArithDialect,
                        math::MathDialect, func::FuncDialect>();
    module = parseSourceString<ModuleOp>(kProgram, &context);
  }

  pagedc::CompiledMods compile(llvm::StringRef mask, llvm::StringRef score) {
    auto mods = pagedc::jit::compileMods(*module, mask, score);
    if (!mods) {
      ADD_FAILURE() << llvm::toString(mods.takeError());
      return {};
    }
    return *mods;
  }

  int32_t randomIndex(int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(random);
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> module;
  std::mt19937 random;
  Bindings bindings;
};

/// Every mask row matches the reference, element by element, and the block
/// classifier never claims more than is true.
void checkMask(ModJitTest &test, pagedc::CompiledMods &mods,
               PagedcModContext modContext, std::mt19937 &random) {
  ASSERT_TRUE(mods.maskRow);
  ASSERT_TRUE(mods.maskReference);
  auto pick = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(random);
  };
  int kept = 0, dropped = 0;
  for (int trial = 0; trial < 300; ++trial) {
    int32_t b = pick(0, Bindings::kBatch - 1);
    int32_t h = pick(0, Bindings::kHeads - 1);
    int32_t q = pick(0, Bindings::kLength - 1);
    int32_t count = pick(1, 70);
    int32_t begin = pick(0, Bindings::kLength - count);
    std::vector<uint8_t> row(count, 0xAB);
    mods.maskRow(&modContext, b, h, q, begin, count, row.data());
    for (int32_t i = 0; i < count; ++i) {
      bool expected = mods.maskReference(modContext, b, h, q, begin + i);
      ASSERT_EQ(row[i], expected ? 1 : 0)
          << mods.maskName << " b=" << b << " h=" << h << " q=" << q
          << " kv=" << begin + i;
      (expected ? kept : dropped) += 1;
    }
  }
  // A test that only ever sees one answer proves little.
  EXPECT_GT(kept, 0) << mods.maskName;
  EXPECT_GT(dropped, 0) << mods.maskName;

  // Masks reading buffers or using bitwise integer operations get no
  // classifier (it would say "partial" for nearly every block).
  bool expectClassifier =
      mods.maskName != "document" && mods.maskName != "bits";
  ASSERT_EQ(bool(mods.maskBlockClass), expectClassifier);
  if (!expectClassifier)
    return;
  for (int trial = 0; trial < 300; ++trial) {
    int32_t b = pick(0, Bindings::kBatch - 1);
    int32_t h = pick(0, Bindings::kHeads - 1);
    int32_t qLo = pick(0, Bindings::kLength - 1);
    int32_t qHi = std::min(Bindings::kLength - 1, qLo + pick(0, 40));
    int32_t kvLo = pick(0, Bindings::kLength - 1);
    int32_t kvHi = std::min(Bindings::kLength - 1, kvLo + pick(0, 40));
    int32_t answer =
        mods.maskBlockClass(&modContext, b, h, qLo, qHi, kvLo, kvHi);
    ASSERT_TRUE(answer >= 0 && answer <= 2);
    if (answer == 1)
      continue;
    for (int32_t q = qLo; q <= qHi; ++q)
      for (int32_t kv = kvLo; kv <= kvHi; ++kv)
        ASSERT_EQ(mods.maskReference(modContext, b, h, q, kv), answer == 2)
            << mods.maskName << " claimed class " << answer << " for q ["
            << qLo << ", " << qHi << "] kv [" << kvLo << ", " << kvHi
            << "] but (" << q << ", " << kv << ") disagrees";
  }
}

TEST_F(ModJitTest, MaskRowsMatchReferenceAndBlockClassesAreSound) {
  for (const char *name :
       {"causal", "sliding", "dilated", "negative_division", "natten",
        "document", "bits"}) {
    SCOPED_TRACE(name);
    pagedc::CompiledMods mods = compile(name, "");
    checkMask(*this, mods, bindings.context(mods), random);
  }
}

TEST_F(ModJitTest, ScoreRowsMatchReference) {
  for (const char *name : {"alibi_softcap", "biases", "floats"}) {
    SCOPED_TRACE(name);
    pagedc::CompiledMods mods = compile("", name);
    ASSERT_TRUE(mods.scoreRow);
    ASSERT_TRUE(mods.scoreReference);
    PagedcModContext modContext = bindings.context(mods);
    std::uniform_real_distribution<float> uniform(-6.0f, 6.0f);
    double worst = 0.0;
    for (int trial = 0; trial < 300; ++trial) {
      int32_t b = randomIndex(0, Bindings::kBatch - 1);
      int32_t h = randomIndex(0, Bindings::kHeads - 1);
      int32_t q = randomIndex(0, Bindings::kLength - 1);
      int32_t count = randomIndex(1, 70);
      int32_t begin = randomIndex(0, Bindings::kLength - count);
      std::vector<float> scores(count);
      for (float &score : scores)
        score = uniform(random);
      std::vector<float> original = scores;
      mods.scoreRow(&modContext, b, h, q, begin, count, scores.data());
      for (int32_t i = 0; i < count; ++i) {
        double expected = mods.scoreReference(modContext, original[i], b, h,
                                              q, begin + i);
        ASSERT_TRUE(std::isfinite(scores[i]));
        double error = std::abs(scores[i] - expected) /
                       std::max(1.0, std::abs(expected));
        worst = std::max(worst, error);
        ASSERT_LE(error, 2e-6)
            << name << " s=" << original[i] << " b=" << b << " h=" << h
            << " q=" << q << " kv=" << begin + i << " got " << scores[i]
            << " expected " << expected;
      }
    }
    RecordProperty(std::string("worst_relative_error_") + name,
                   std::to_string(worst));
  }
}

TEST_F(ModJitTest, ReferenceFollowsPythonSemantics) {
  // natten and dilated use // and % on negative numbers; check the evaluator
  // against the formulas written out in C++ with Python's rounding.
  pagedc::CompiledMods mods = compile("dilated", "");
  PagedcModContext none{nullptr, nullptr};
  auto pythonMod = [](int64_t a, int64_t m) { return ((a % m) + m) % m; };
  for (int32_t q = 0; q < 40; ++q)
    for (int32_t kv = 0; kv < 40; ++kv) {
      bool expected = std::abs(q - kv) <= 8 && pythonMod(q - kv, 3) == 0;
      ASSERT_EQ(mods.maskReference(none, 0, 0, q, kv), expected);
    }

  pagedc::CompiledMods softcap = compile("", "alibi_softcap");
  PagedcModContext modContext = bindings.context(softcap);
  for (int trial = 0; trial < 100; ++trial) {
    double s = std::uniform_real_distribution<double>(-50, 50)(random);
    int32_t h = randomIndex(0, Bindings::kHeads - 1);
    int32_t q = randomIndex(0, 100), kv = randomIndex(0, 100);
    double x = s + double(bindings.slopes[h]) * (kv - q);
    double expected = 7.5 * std::tanh(x / 7.5);
    ASSERT_NEAR(softcap.scoreReference(modContext, s, 0, h, q, kv), expected,
                1e-12);
  }
}

TEST_F(ModJitTest, BlockClassifierIsExactOnDiagonalMasks) {
  pagedc::CompiledMods causal = compile("causal", "");
  PagedcModContext none{nullptr, nullptr};
  // 64x64 blocks of a 512x512 causal mask: below the diagonal every block is
  // full, above it empty, on it partial.
  for (int32_t qb = 0; qb < 8; ++qb)
    for (int32_t kb = 0; kb < 8; ++kb) {
      int32_t expected = kb < qb ? 2 : (kb > qb ? 0 : 1);
      EXPECT_EQ(causal.maskBlockClass(&none, 0, 0, qb * 64, qb * 64 + 63,
                                      kb * 64, kb * 64 + 63),
                expected)
          << "block (" << qb << ", " << kb << ")";
    }
  pagedc::CompiledMods sliding = compile("sliding", "");
  PagedcModContext modContext = bindings.context(sliding); // window = 37
  EXPECT_EQ(sliding.maskBlockClass(&modContext, 0, 0, 100, 115, 90, 99), 2);
  EXPECT_EQ(sliding.maskBlockClass(&modContext, 0, 0, 100, 115, 20, 30), 0);
  EXPECT_EQ(sliding.maskBlockClass(&modContext, 0, 0, 100, 115, 60, 70), 1);
}

TEST_F(ModJitTest, DeclarationsAndDependencesDescribeTheSelection) {
  pagedc::CompiledMods mods = compile("document", "alibi_softcap");
  // Only what the two mods read, in declaration order.
  ASSERT_EQ(mods.buffers.size(), 3u);
  EXPECT_EQ(mods.buffers[0].name, "doc");
  EXPECT_EQ(mods.buffers[0].elementType, pagedc::DType::I32);
  ASSERT_EQ(mods.buffers[0].dims.size(), 2u);
  EXPECT_EQ(mods.buffers[0].dims[0].kind, pagedc::BufferDim::Named);
  EXPECT_EQ(mods.buffers[0].dims[0].name, "B");
  EXPECT_EQ(mods.buffers[1].name, "slopes");
  EXPECT_EQ(mods.buffers[2].name, "flags");
  EXPECT_EQ(mods.buffers[2].elementType, pagedc::DType::Bool);
  ASSERT_EQ(mods.params.size(), 2u);
  EXPECT_EQ(mods.params[0].name, "softcap");
  ASSERT_TRUE(mods.params[0].defaultValue.has_value());
  EXPECT_EQ(mods.params[0].defaultValue->f32, 30.0f);
  EXPECT_EQ(mods.params[1].name, "enabled");
  EXPECT_EQ(mods.params[1].type, pagedc::ScalarKind::Bool);
  EXPECT_EQ(mods.maskDependence.buffers,
            (std::vector<std::string>{"doc", "flags"}));
  EXPECT_EQ(mods.scoreDependence.params,
            (std::vector<std::string>{"softcap"}));

  pagedc::CompiledMods causal = compile("causal", "");
  EXPECT_FALSE(causal.maskDependence.b);
  EXPECT_FALSE(causal.maskDependence.h);
  EXPECT_TRUE(causal.maskDependence.q);
  EXPECT_TRUE(causal.maskDependence.diagonal);
  EXPECT_TRUE(causal.buffers.empty());
}

TEST_F(ModJitTest, ErrorsNameTheProblem) {
  auto missing = pagedc::jit::compileMods(*module, "nope", "");
  ASSERT_FALSE(bool(missing));
  std::string message = llvm::toString(missing.takeError());
  EXPECT_NE(message.find("no mask mod named 'nope'"), std::string::npos)
      << message;
  EXPECT_NE(message.find("causal"), std::string::npos) << message;

  auto wrongKind = pagedc::jit::compileMods(*module, "alibi_softcap", "");
  ASSERT_FALSE(bool(wrongKind));
  message = llvm::toString(wrongKind.takeError());
  EXPECT_NE(message.find("'alibi_softcap' is a score mod, not a mask mod"),
            std::string::npos)
      << message;
}

TEST_F(ModJitTest, CacheReturnsTheSameCompilation) {
  pagedc::jit::clearJitCache();
  auto before = pagedc::jit::jitCacheStatistics();
  pagedc::CompiledMods first = compile("natten", "floats");
  pagedc::CompiledMods second = compile("natten", "floats");
  auto after = pagedc::jit::jitCacheStatistics();
  EXPECT_EQ(after.misses - before.misses, 1u);
  EXPECT_EQ(after.hits - before.hits, 1u);
  EXPECT_EQ(first.maskRow, second.maskRow);
  EXPECT_EQ(first.scoreRow, second.scoreRow);
  // Clearing the cache keeps handed-out functions alive.
  pagedc::jit::clearJitCache();
  std::vector<uint8_t> row(5);
  first.maskRow(nullptr, 0, 0, 40, 20, 5, row.data());
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(row[i], first.maskReference({nullptr, nullptr}, 0, 0, 40, 20 + i));
}

} // namespace
