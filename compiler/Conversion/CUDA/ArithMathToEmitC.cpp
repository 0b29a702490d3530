//===- ArithMathToEmitC.cpp - arith and math ops to CUDA EmitC ------------===//
//
// MLIR 19 converts most of `arith` to EmitC (populateArithToEmitCPatterns)
// but has no math -> EmitC conversion, and leaves out min/max, remf and the
// rounding divisions. These patterns fill the gaps with calls of CUDA's f32
// math library (precise, as PyTorch's kernels) and of the prelude helpers
// (Prelude.cuh), and print ordered float comparisons as plain C operators.
//
//===----------------------------------------------------------------------===//

#include "Conversion/CUDA/FlexToEmitC.h"

#include "mlir/Conversion/ArithToEmitC/ArithToEmitC.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Transforms/DialectConversion.h"

#include <cstdint>
#include <cstdio>

using namespace mlir;

namespace {

/// How a source op maps to a callee: one name for f32 operands, another for
/// integer operands (either may be empty: that operand kind is rejected).
struct CalleeNames {
  StringRef f32;
  StringRef integer;
};

/// Replaces `SourceOp` with `emitc.call_opaque` of a function chosen by the
/// element type of its first operand.
template <typename SourceOp>
class CallOpaqueLowering : public OpConversionPattern<SourceOp> {
public:
  CallOpaqueLowering(const TypeConverter &typeConverter, MLIRContext *context,
                     CalleeNames names, unsigned benefit = 1)
      : OpConversionPattern<SourceOp>(typeConverter, context, benefit),
        names(names) {}

  LogicalResult
  matchAndRewrite(SourceOp op, typename SourceOp::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Type operandType = op->getOperand(0).getType();
    StringRef callee;
    if (operandType.isF32())
      callee = names.f32;
    else if (operandType.isSignlessInteger(32) ||
             operandType.isSignlessInteger(64))
      callee = names.integer;
    if (callee.empty())
      return rewriter.notifyMatchFailure(op, "no CUDA function for this type");
    Type resultType =
        this->getTypeConverter()->convertType(op->getResult(0).getType());
    if (!resultType)
      return rewriter.notifyMatchFailure(op, "unsupported result type");
    rewriter.replaceOpWithNewOp<emitc::CallOpaqueOp>(
        op, TypeRange{resultType}, callee, adaptor.getOperands());
    return success();
  }

private:
  CalleeNames names;
};

/// `arith.cmpf` with an ordered predicate (or `une`) on f32 is exactly the C
/// operator: C comparisons are false on NaN except `!=`. MLIR's generic
/// lowering spells out the NaN checks; this one keeps the generated code
/// readable. Other predicates fall through to MLIR's pattern.
class SimpleCmpFLowering : public OpConversionPattern<arith::CmpFOp> {
public:
  SimpleCmpFLowering(const TypeConverter &typeConverter, MLIRContext *context)
      : OpConversionPattern(typeConverter, context, /*benefit=*/2) {}

  LogicalResult
  matchAndRewrite(arith::CmpFOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    if (!op.getLhs().getType().isF32())
      return rewriter.notifyMatchFailure(op, "not f32");
    std::optional<emitc::CmpPredicate> predicate;
    switch (op.getPredicate()) {
    case arith::CmpFPredicate::OEQ:
      predicate = emitc::CmpPredicate::eq;
      break;
    case arith::CmpFPredicate::UNE:
      predicate = emitc::CmpPredicate::ne;
      break;
    case arith::CmpFPredicate::OLT:
      predicate = emitc::CmpPredicate::lt;
      break;
    case arith::CmpFPredicate::OLE:
      predicate = emitc::CmpPredicate::le;
      break;
    case arith::CmpFPredicate::OGT:
      predicate = emitc::CmpPredicate::gt;
      break;
    case arith::CmpFPredicate::OGE:
      predicate = emitc::CmpPredicate::ge;
      break;
    default:
      return rewriter.notifyMatchFailure(op, "needs explicit NaN checks");
    }
    rewriter.replaceOpWithNewOp<emitc::CmpOp>(op, rewriter.getI1Type(),
                                              *predicate, adaptor.getLhs(),
                                              adaptor.getRhs());
    return success();
  }
};

/// Adds the call lowering of `SourceOp`.
template <typename SourceOp>
void addCallLowering(TypeConverter &typeConverter, RewritePatternSet &patterns,
                     StringRef f32, StringRef integer = {},
                     unsigned benefit = 1) {
  patterns.add<CallOpaqueLowering<SourceOp>>(
      typeConverter, patterns.getContext(), CalleeNames{f32, integer}, benefit);
}

/// Scalar i1, i32 and f32 constants become C literals printed where they are
/// used (`q - kv <= 1024`) instead of one variable each. Floats print with
/// nine significant digits, which round-trips every f32 exactly.
class ConstantLiteralLowering : public OpConversionPattern<arith::ConstantOp> {
public:
  ConstantLiteralLowering(const TypeConverter &typeConverter,
                          MLIRContext *context)
      : OpConversionPattern(typeConverter, context, /*benefit=*/2) {}

  LogicalResult
  matchAndRewrite(arith::ConstantOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    std::optional<std::string> text = literalText(op.getValue());
    if (!text)
      return rewriter.notifyMatchFailure(op, "not a scalar i1/i32/f32");
    rewriter.replaceOpWithNewOp<emitc::LiteralOp>(op, op.getType(), *text);
    return success();
  }

private:
  static std::optional<std::string> literalText(Attribute value) {
    if (auto integer = dyn_cast<IntegerAttr>(value)) {
      Type type = integer.getType();
      if (type.isInteger(1))
        return std::string(integer.getValue().isZero() ? "false" : "true");
      if (!type.isInteger(32))
        return std::nullopt;
      int64_t number = integer.getValue().getSExtValue();
      if (number == INT32_MIN)
        return std::string("(-2147483647 - 1)");
      std::string digits = std::to_string(number);
      return number < 0 ? "(" + digits + ")" : digits;
    }
    auto real = dyn_cast<FloatAttr>(value);
    if (!real || !real.getType().isF32())
      return std::nullopt;
    const APFloat &number = real.getValue();
    if (number.isNaN())
      return std::string("NAN");
    if (number.isInfinity())
      return std::string(number.isNegative() ? "(-INFINITY)" : "INFINITY");
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.9g", number.convertToFloat());
    std::string digits = buffer;
    if (digits.find_first_of(".e") == std::string::npos)
      digits += ".0";
    digits += "f";
    return number.isNegative() ? "(" + digits + ")" : digits;
  }
};

/// Integer add/sub/mul as the plain C operators on the signed type. MLIR's
/// lowering goes through unsigned casts to avoid C's undefined signed
/// overflow; mods compute indices far below 2^31, PyTorch's own CUDA kernels
/// use signed arithmetic for them, and the plain form keeps the generated
/// code readable.
template <typename SourceOp, typename TargetOp>
class SignedIntegerLowering : public OpConversionPattern<SourceOp> {
public:
  SignedIntegerLowering(const TypeConverter &typeConverter,
                        MLIRContext *context)
      : OpConversionPattern<SourceOp>(typeConverter, context,
                                      /*benefit=*/2) {}

  LogicalResult
  matchAndRewrite(SourceOp op, typename SourceOp::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    Type type = op.getType();
    if (!type.isSignlessInteger(32) && !type.isSignlessInteger(64))
      return rewriter.notifyMatchFailure(op, "not i32 or i64");
    rewriter.replaceOpWithNewOp<TargetOp>(op, type, adaptor.getLhs(),
                                          adaptor.getRhs());
    return success();
  }
};

} // namespace

void pagedc::populateCudaArithMathToEmitCPatterns(TypeConverter &typeConverter,
                                                  RewritePatternSet &patterns) {
  MLIRContext *context = patterns.getContext();
  populateArithToEmitCPatterns(typeConverter, patterns);
  patterns.add<SimpleCmpFLowering, ConstantLiteralLowering,
               SignedIntegerLowering<arith::AddIOp, emitc::AddOp>,
               SignedIntegerLowering<arith::SubIOp, emitc::SubOp>,
               SignedIntegerLowering<arith::MulIOp, emitc::MulOp>>(
      typeConverter, context);

  // arith ops MLIR 19 does not convert.
  addCallLowering<arith::MinimumFOp>(typeConverter, patterns, "flex_minimum");
  addCallLowering<arith::MaximumFOp>(typeConverter, patterns, "flex_maximum");
  addCallLowering<arith::MinNumFOp>(typeConverter, patterns, "fminf");
  addCallLowering<arith::MaxNumFOp>(typeConverter, patterns, "fmaxf");
  addCallLowering<arith::MinSIOp>(typeConverter, patterns, "", "flex_min");
  addCallLowering<arith::MaxSIOp>(typeConverter, patterns, "", "flex_max");
  addCallLowering<arith::RemFOp>(typeConverter, patterns, "fmodf");
  addCallLowering<arith::FloorDivSIOp>(typeConverter, patterns, "",
                                       "flex_floordiv");
  // Shifts and int() of floats with every edge case defined (Prelude.cuh);
  // ahead of MLIR's own patterns, which leave them undefined.
  addCallLowering<arith::ShLIOp>(typeConverter, patterns, "", "flex_shl",
                                 /*benefit=*/2);
  addCallLowering<arith::ShRSIOp>(typeConverter, patterns, "", "flex_shr",
                                  /*benefit=*/2);
  addCallLowering<arith::FPToSIOp>(typeConverter, patterns, "flex_float_to_int",
                                   "", /*benefit=*/2);

  // math: f32 CUDA math library calls (precise versions), integer helpers.
  addCallLowering<math::AbsFOp>(typeConverter, patterns, "fabsf");
  addCallLowering<math::AbsIOp>(typeConverter, patterns, "", "flex_abs");
  addCallLowering<math::AcosOp>(typeConverter, patterns, "acosf");
  addCallLowering<math::AcoshOp>(typeConverter, patterns, "acoshf");
  addCallLowering<math::AsinOp>(typeConverter, patterns, "asinf");
  addCallLowering<math::AsinhOp>(typeConverter, patterns, "asinhf");
  addCallLowering<math::AtanOp>(typeConverter, patterns, "atanf");
  addCallLowering<math::AtanhOp>(typeConverter, patterns, "atanhf");
  addCallLowering<math::Atan2Op>(typeConverter, patterns, "atan2f");
  addCallLowering<math::CbrtOp>(typeConverter, patterns, "cbrtf");
  addCallLowering<math::CeilOp>(typeConverter, patterns, "ceilf");
  addCallLowering<math::CopySignOp>(typeConverter, patterns, "copysignf");
  addCallLowering<math::CosOp>(typeConverter, patterns, "cosf");
  addCallLowering<math::CoshOp>(typeConverter, patterns, "coshf");
  addCallLowering<math::SinOp>(typeConverter, patterns, "sinf");
  addCallLowering<math::SinhOp>(typeConverter, patterns, "sinhf");
  addCallLowering<math::TanOp>(typeConverter, patterns, "tanf");
  addCallLowering<math::TanhOp>(typeConverter, patterns, "tanhf");
  addCallLowering<math::ErfOp>(typeConverter, patterns, "erff");
  addCallLowering<math::ExpOp>(typeConverter, patterns, "expf");
  addCallLowering<math::Exp2Op>(typeConverter, patterns, "exp2f");
  addCallLowering<math::ExpM1Op>(typeConverter, patterns, "expm1f");
  addCallLowering<math::FloorOp>(typeConverter, patterns, "floorf");
  addCallLowering<math::FmaOp>(typeConverter, patterns, "fmaf");
  addCallLowering<math::LogOp>(typeConverter, patterns, "logf");
  addCallLowering<math::Log10Op>(typeConverter, patterns, "log10f");
  addCallLowering<math::Log1pOp>(typeConverter, patterns, "log1pf");
  addCallLowering<math::Log2Op>(typeConverter, patterns, "log2f");
  addCallLowering<math::PowFOp>(typeConverter, patterns, "powf");
  addCallLowering<math::IPowIOp>(typeConverter, patterns, "", "flex_ipow");
  addCallLowering<math::RsqrtOp>(typeConverter, patterns, "rsqrtf");
  addCallLowering<math::SqrtOp>(typeConverter, patterns, "sqrtf");
  // torch.round rounds half to even: rintf in the default rounding mode.
  addCallLowering<math::RoundEvenOp>(typeConverter, patterns, "rintf");
  addCallLowering<math::RoundOp>(typeConverter, patterns, "roundf");
  addCallLowering<math::TruncOp>(typeConverter, patterns, "truncf");
  addCallLowering<math::CtPopOp>(typeConverter, patterns, "", "flex_popcount");
  addCallLowering<math::CountLeadingZerosOp>(typeConverter, patterns, "",
                                             "flex_clz");
  addCallLowering<math::CountTrailingZerosOp>(typeConverter, patterns, "",
                                              "flex_ctz");
}

void pagedc::configureCudaEmitCTypeConverter(TypeConverter &typeConverter) {
  // Builtin integer and float types are EmitC types already; index is
  // printed as size_t.
  typeConverter.addConversion([](Type type) -> std::optional<Type> {
    if (emitc::isSupportedEmitCType(type))
      return type;
    return std::nullopt;
  });
  typeConverter.addConversion([](IndexType type) -> Type {
    return emitc::SizeTType::get(type.getContext());
  });
}
