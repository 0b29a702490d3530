//===- FlexToCPU.cpp - flex mods to ModABI row functions ------------------===//
//
// Each selected mod becomes a row function: a prelude that reads the params
// and buffer descriptors the mod uses from the PagedcModContext, then an
// scf.for over the `count` kv indices whose body is the mod's body with the
// flex operations rewritten to arith/math and LLVM loads. Mask mods also get
// a block classifier that evaluates the mod over intervals of q and kv.
//
//===----------------------------------------------------------------------===//

#include "Conversion/CPU/FlexToCPU.h"
#include "Conversion/CPU/LowerToLLVM.h"

#include "Flex/FlexDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

#include <limits>

using namespace mlir;
using pagedc::flex::ModOp;

std::string pagedc::cpuMaskRowSymbol(llvm::StringRef name) {
  return ("mask_row_" + name).str();
}
std::string pagedc::cpuScoreRowSymbol(llvm::StringRef name) {
  return ("score_row_" + name).str();
}
std::string pagedc::cpuMaskBlockClassSymbol(llvm::StringRef name) {
  return ("mask_block_class_" + name).str();
}

namespace {

//===----------------------------------------------------------------------===//
// Declarations and the context ABI
//===----------------------------------------------------------------------===//

/// The ABI positions of the buffers and params the selected mods read.
struct DeclarationTable {
  llvm::StringMap<std::pair<unsigned, pagedc::flex::BufferOp>> buffers;
  llvm::StringMap<std::pair<unsigned, pagedc::flex::ParamOp>> params;
  llvm::StringMap<pagedc::flex::ConstDeclOp> constants;

  DeclarationTable(ModuleOp module, const pagedc::ModInterface &interface) {
    for (unsigned i = 0; i < interface.buffers.size(); ++i) {
      pagedc::flex::BufferOp buffer = interface.buffers[i];
      buffers[buffer.getSymName()] = {i, buffer};
    }
    for (unsigned i = 0; i < interface.params.size(); ++i) {
      pagedc::flex::ParamOp param = interface.params[i];
      params[param.getSymName()] = {i, param};
    }
    for (auto constant : module.getOps<pagedc::flex::ConstDeclOp>())
      constants[constant.getSymName()] = constant;
  }
};

/// Reads params and buffer descriptors from a `const PagedcModContext *`.
/// Every read is emitted once, at the prelude insertion point (before the
/// row loop), and reused.
class ContextReader {
public:
  ContextReader(const DeclarationTable &declarations, Value context,
                OpBuilder prelude)
      : declarations(declarations), context(context), prelude(prelude) {
    MLIRContext *mlirContext = context.getContext();
    pointerType = LLVM::LLVMPointerType::get(mlirContext);
    Type i64 = IntegerType::get(mlirContext, 64);
    // struct PagedcBufferRef { const void *data; int64_t sizes[4], strides[4]; }
    bufferRefType = LLVM::LLVMStructType::getLiteral(
        mlirContext, {pointerType, LLVM::LLVMArrayType::get(i64, 4),
                      LLVM::LLVMArrayType::get(i64, 4)});
    // struct PagedcModContext { const PagedcBufferRef *buffers;
    //                           const PagedcParamSlot *params; }
    contextType = LLVM::LLVMStructType::getLiteral(mlirContext,
                                                   {pointerType, pointerType});
  }

  /// The value of param `name`: f32 as f32, i32 as i32, bool as i1.
  FailureOr<Value> param(Operation *user, StringRef name) {
    auto found = declarations.params.find(name);
    if (found == declarations.params.end())
      return user->emitError("unknown param @") << name;
    unsigned index = found->second.first;
    if (Value cached = paramValues.lookup(index))
      return cached;
    Location loc = user->getLoc();
    pagedc::flex::ParamOp declaration = found->second.second;
    Type type = declaration.getType();
    Value slots = loadField(loc, /*field=*/1, paramSlots);
    Type slotType = type.isF32() ? Type(prelude.getF32Type())
                                 : Type(prelude.getI32Type());
    Value address = prelude.create<LLVM::GEPOp>(
        loc, pointerType, slotType, slots,
        ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(index)});
    Value value = prelude.create<LLVM::LoadOp>(loc, slotType, address);
    if (type.isInteger(1)) {
      Value zero = prelude.create<arith::ConstantIntOp>(loc, 0, 32);
      value = prelude.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne,
                                            value, zero);
    }
    paramValues[index] = value;
    return value;
  }

  /// Loads `buffer[indices]` at the builder's insertion point, converting the
  /// element to the load type (f16/bf16 -> f32, bool -> i1).
  FailureOr<Value> loadElement(OpBuilder &builder, Operation *user,
                               StringRef name, ValueRange indices) {
    auto found = declarations.buffers.find(name);
    if (found == declarations.buffers.end())
      return user->emitError("unknown buffer @") << name;
    unsigned index = found->second.first;
    pagedc::flex::BufferOp buffer = found->second.second;
    if (indices.size() != buffer.getRank())
      return user->emitError("expected ")
             << buffer.getRank() << " indices for @" << name;
    Location loc = user->getLoc();
    Type i64 = builder.getI64Type();
    // Every read is bounds-checked against the sizes of the bound buffer:
    // an index outside [0, size) reads 0 (false for bool) from a zeroed
    // scratch word instead of memory outside the buffer (docs/language.md,
    // "Buffer reads"). The offset is computed from in-range indices only.
    Value offset;
    Value inBounds;
    for (auto [dim, index64] : llvm::enumerate(indices)) {
      Value wide = index64;
      if (!wide.getType().isInteger(64))
        wide = builder.create<arith::ExtSIOp>(loc, i64, wide);
      Value fits = builder.create<arith::CmpIOp>(
          loc, arith::CmpIPredicate::ult, wide,
          size(loc, index, static_cast<unsigned>(dim)));
      inBounds =
          inBounds ? builder.create<arith::AndIOp>(loc, inBounds, fits) : fits;
      Value term = builder.create<arith::MulIOp>(
          loc, wide, stride(loc, index, static_cast<unsigned>(dim)));
      offset = offset ? builder.create<arith::AddIOp>(loc, offset, term)
                      : term;
    }
    Value zeroOffset = builder.create<arith::ConstantIntOp>(loc, 0, 64);
    offset = builder.create<arith::SelectOp>(loc, inBounds, offset, zeroOffset);
    Type element = buffer.getElementType();
    Type storage = element;
    if (element.isF16() || element.isBF16())
      storage = builder.getI16Type();
    else if (element.isInteger(1))
      storage = builder.getI8Type();
    Value inside = builder.create<LLVM::GEPOp>(
        loc, pointerType, storage, data(loc, index), ValueRange{offset});
    Value address =
        builder.create<arith::SelectOp>(loc, inBounds, inside, zeroSlot(loc));
    Value raw = builder.create<LLVM::LoadOp>(loc, storage, address);
    if (element.isF16()) {
      Value half = builder.create<arith::BitcastOp>(loc, builder.getF16Type(),
                                                    raw);
      return builder.create<arith::ExtFOp>(loc, builder.getF32Type(), half)
          .getResult();
    }
    if (element.isBF16()) {
      // bf16 is the upper half of an f32.
      Value wide = builder.create<arith::ExtUIOp>(loc, builder.getI32Type(),
                                                  raw);
      Value sixteen = builder.create<arith::ConstantIntOp>(loc, 16, 32);
      Value bits = builder.create<arith::ShLIOp>(loc, wide, sixteen);
      return builder.create<arith::BitcastOp>(loc, builder.getF32Type(), bits)
          .getResult();
    }
    if (element.isInteger(1)) {
      Value zero = builder.create<arith::ConstantIntOp>(loc, 0, 8);
      return builder
          .create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, raw, zero)
          .getResult();
    }
    return raw;
  }

private:
  /// ctx->buffers (field 0) or ctx->params (field 1), loaded once.
  Value loadField(Location loc, int32_t field, Value &cache) {
    if (cache)
      return cache;
    Value address = prelude.create<LLVM::GEPOp>(
        loc, pointerType, contextType, context,
        ArrayRef<LLVM::GEPArg>{0, field});
    cache = prelude.create<LLVM::LoadOp>(loc, pointerType, address);
    return cache;
  }

  Value data(Location loc, unsigned buffer) {
    Value &cached = bufferData[buffer];
    if (cached)
      return cached;
    Value refs = loadField(loc, 0, bufferRefs);
    Value address = prelude.create<LLVM::GEPOp>(
        loc, pointerType, bufferRefType, refs,
        ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(buffer), 0});
    cached = prelude.create<LLVM::LoadOp>(loc, pointerType, address);
    return cached;
  }

  /// A zeroed 8-byte stack slot, the target of out-of-range reads.
  Value zeroSlot(Location loc) {
    if (zeroScratch)
      return zeroScratch;
    Value one = prelude.create<arith::ConstantIntOp>(loc, 1, 64);
    zeroScratch = prelude.create<LLVM::AllocaOp>(
        loc, pointerType, prelude.getI64Type(), one, /*alignment=*/8);
    Value zero = prelude.create<arith::ConstantIntOp>(loc, 0, 64);
    prelude.create<LLVM::StoreOp>(loc, zero, zeroScratch);
    return zeroScratch;
  }

  /// The size of dimension `dim` of a bound buffer (PagedcBufferRef::sizes).
  Value size(Location loc, unsigned buffer, unsigned dim) {
    return bufferRefField(loc, buffer, kSizesField, dim, bufferSizes);
  }

  /// The stride of dimension `dim` (PagedcBufferRef::strides).
  Value stride(Location loc, unsigned buffer, unsigned dim) {
    return bufferRefField(loc, buffer, kStridesField, dim, bufferStrides);
  }

  const DeclarationTable &declarations;
  Value context;
  OpBuilder prelude;
  Type pointerType, bufferRefType, contextType;
  Value bufferRefs, paramSlots;
  llvm::DenseMap<unsigned, Value> paramValues;
  llvm::DenseMap<unsigned, Value> bufferData;
  llvm::DenseMap<std::pair<unsigned, unsigned>, Value> bufferStrides;
  llvm::DenseMap<std::pair<unsigned, unsigned>, Value> bufferSizes;

  /// PagedcBufferRef's fields: data, sizes, strides.
  static constexpr int32_t kSizesField = 1, kStridesField = 2;

  /// Element `dim` of array field `field` of the bound buffer `buffer`'s
  /// PagedcBufferRef, loaded once in the prelude and cached in `cache`.
  Value
  bufferRefField(Location loc, unsigned buffer, int32_t field, unsigned dim,
                 llvm::DenseMap<std::pair<unsigned, unsigned>, Value> &cache) {
    Value &cached = cache[{buffer, dim}];
    if (cached)
      return cached;
    Value refs = loadField(loc, 0, bufferRefs);
    Value address = prelude.create<LLVM::GEPOp>(
        loc, pointerType, bufferRefType, refs,
        ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(buffer), field,
                               static_cast<int32_t>(dim)});
    cached = prelude.create<LLVM::LoadOp>(loc, prelude.getI64Type(), address);
    return cached;
  }
  Value zeroScratch;
};

//===----------------------------------------------------------------------===//
// PyTorch floor division and remainder in arith
//===----------------------------------------------------------------------===//

/// What integer floor division and floor remainder share: the divisor with
/// 0 and -1 replaced by 1 (so `divsi`/`remsi` never trap: x86's idiv faults
/// on a zero divisor and on MIN / -1), the truncated remainder, and whether
/// the truncated result must move one step toward negative infinity
/// (inexact, and the remainder's sign differs from the divisor's). The
/// callers select the defined results for 0 and -1 (docs/language.md).
/// With `withQuotient`, the truncated quotient is emitted too (before the
/// remainder, so the IR reads in the natural order).
struct TruncatedRemainder {
  Value divisor;
  Value quotient; // null unless asked for
  Value remainder;
  Value adjust;
  Value one;
  Value zero;
  Value divisorIsZero;
  Value divisorIsMinusOne;
};

TruncatedRemainder emitTruncatedRemainder(OpBuilder &b, Location loc,
                                          Value lhs, Value rhs,
                                          bool withQuotient) {
  Type type = lhs.getType();
  Value zero = b.create<arith::ConstantOp>(loc, b.getIntegerAttr(type, 0));
  Value one = b.create<arith::ConstantOp>(loc, b.getIntegerAttr(type, 1));
  Value minusOne = b.create<arith::ConstantOp>(loc, b.getIntegerAttr(type, -1));
  Value isZero =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, rhs, zero);
  Value isMinusOne =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, rhs, minusOne);
  Value special = b.create<arith::OrIOp>(loc, isZero, isMinusOne);
  Value divisor = b.create<arith::SelectOp>(loc, special, one, rhs);
  Value quotient =
      withQuotient ? b.create<arith::DivSIOp>(loc, lhs, divisor) : Value();
  Value remainder = b.create<arith::RemSIOp>(loc, lhs, divisor);
  Value inexact =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ne, remainder, zero);
  Value remainderNegative =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, remainder, zero);
  Value divisorNegative =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, divisor, zero);
  Value signsDiffer =
      b.create<arith::XOrIOp>(loc, remainderNegative, divisorNegative);
  Value adjust = b.create<arith::AndIOp>(loc, inexact, signsDiffer);
  return {divisor, quotient, remainder, adjust, one, zero, isZero, isMinusOne};
}

/// `a // b` on integers, rounding toward negative infinity; `a // 0 == 0`,
/// `a // -1 == -a` (wraps: MIN // -1 == MIN).
Value emitIntFloorDiv(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  TruncatedRemainder parts =
      emitTruncatedRemainder(b, loc, lhs, rhs, /*withQuotient=*/true);
  Value minusOne = b.create<arith::SubIOp>(loc, parts.quotient, parts.one);
  Value result =
      b.create<arith::SelectOp>(loc, parts.adjust, minusOne, parts.quotient);
  Value negated = b.create<arith::SubIOp>(loc, parts.zero, lhs);
  result =
      b.create<arith::SelectOp>(loc, parts.divisorIsMinusOne, negated, result);
  return b.create<arith::SelectOp>(loc, parts.divisorIsZero, parts.zero,
                                   result);
}

/// `a % b` on integers: the remainder takes the sign of the divisor;
/// `a % 0 == a`, `a % -1 == 0`.
Value emitIntFloorMod(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  TruncatedRemainder parts =
      emitTruncatedRemainder(b, loc, lhs, rhs, /*withQuotient=*/false);
  Value shifted = b.create<arith::AddIOp>(loc, parts.remainder, parts.divisor);
  Value result =
      b.create<arith::SelectOp>(loc, parts.adjust, shifted, parts.remainder);
  // With the divisor replaced by 1 the remainder is already 0 for -1.
  return b.create<arith::SelectOp>(loc, parts.divisorIsZero, lhs, result);
}

//===----------------------------------------------------------------------===//
// Integer edge cases: shifts, int() of floats, integer powers
//===----------------------------------------------------------------------===//

Value intConstant(OpBuilder &b, Location loc, Type type, int64_t value) {
  return b.create<arith::ConstantOp>(loc, b.getIntegerAttr(type, value));
}

/// `a << s`: 0 when s < 0 or s >= width.
Value emitShiftLeft(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  Type type = lhs.getType();
  unsigned width = type.getIntOrFloatBitWidth();
  Value inRange = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, rhs,
                                          intConstant(b, loc, type, width));
  Value safeShift = b.create<arith::SelectOp>(loc, inRange, rhs,
                                              intConstant(b, loc, type, 0));
  Value shifted = b.create<arith::ShLIOp>(loc, lhs, safeShift);
  return b.create<arith::SelectOp>(loc, inRange, shifted,
                                   intConstant(b, loc, type, 0));
}

/// `a >> s` (arithmetic): s < 0 or s >= width shifts by width - 1.
Value emitShiftRight(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  Type type = lhs.getType();
  unsigned width = type.getIntOrFloatBitWidth();
  Value inRange = b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::ult, rhs,
                                          intConstant(b, loc, type, width));
  Value safeShift = b.create<arith::SelectOp>(
      loc, inRange, rhs, intConstant(b, loc, type, width - 1));
  return b.create<arith::ShRSIOp>(loc, lhs, safeShift);
}

/// `int(x)` of a float: truncation, saturating at the integer limits; NaN
/// gives 0.
Value emitFloatToInt(OpBuilder &b, Location loc, Value input, Type type) {
  unsigned width = type.getIntOrFloatBitWidth();
  FloatType floatType = cast<FloatType>(input.getType());
  double limit = std::ldexp(1.0, int(width) - 1);
  Value upper =
      b.create<arith::ConstantOp>(loc, b.getFloatAttr(floatType, limit));
  Value lower =
      b.create<arith::ConstantOp>(loc, b.getFloatAttr(floatType, -limit));
  Value tooHigh =
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGE, input, upper);
  Value tooLow =
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, input, lower);
  Value inRange = b.create<arith::AndIOp>(
      loc,
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, input, upper),
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OGE, input, lower));
  Value zero = b.create<arith::ConstantOp>(loc, b.getFloatAttr(floatType, 0));
  Value safe = b.create<arith::SelectOp>(loc, inRange, input, zero);
  Value result = b.create<arith::FPToSIOp>(loc, type, safe);
  APInt max = APInt::getSignedMaxValue(width);
  APInt min = APInt::getSignedMinValue(width);
  result = b.create<arith::SelectOp>(
      loc, tooHigh,
      b.create<arith::ConstantOp>(loc, b.getIntegerAttr(type, max)), result);
  return b.create<arith::SelectOp>(
      loc, tooLow,
      b.create<arith::ConstantOp>(loc, b.getIntegerAttr(type, min)), result);
}

/// `a ** e` on integers, branch-free: square-and-multiply over every bit of
/// the exponent (wrapping on overflow); a negative exponent gives 1 for
/// a == 1, +-1 for a == -1 and 0 otherwise.
Value emitIntPower(OpBuilder &b, Location loc, Value base, Value exponent) {
  Type type = base.getType();
  unsigned width = type.getIntOrFloatBitWidth();
  Value zero = intConstant(b, loc, type, 0);
  Value one = intConstant(b, loc, type, 1);
  Value result = one;
  Value square = base;
  for (unsigned bit = 0; bit + 1 < width; ++bit) {
    Value mask = intConstant(b, loc, type, int64_t(1) << bit);
    Value set = b.create<arith::CmpIOp>(
        loc, arith::CmpIPredicate::ne,
        b.create<arith::AndIOp>(loc, exponent, mask), zero);
    Value product = b.create<arith::MulIOp>(loc, result, square);
    result = b.create<arith::SelectOp>(loc, set, product, result);
    if (bit + 2 < width)
      square = b.create<arith::MulIOp>(loc, square, square);
  }
  // Negative exponents.
  Value minusOne = intConstant(b, loc, type, -1);
  Value odd = b.create<arith::CmpIOp>(
      loc, arith::CmpIPredicate::ne,
      b.create<arith::AndIOp>(loc, exponent, one), zero);
  Value baseIsOne =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, base, one);
  Value baseIsMinusOne =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::eq, base, minusOne);
  Value negativeResult = b.create<arith::SelectOp>(
      loc, baseIsOne, one,
      b.create<arith::SelectOp>(
          loc, baseIsMinusOne,
          b.create<arith::SelectOp>(loc, odd, minusOne, one), zero));
  Value negative =
      b.create<arith::CmpIOp>(loc, arith::CmpIPredicate::slt, exponent, zero);
  return b.create<arith::SelectOp>(loc, negative, negativeResult, result);
}

/// `torch.remainder` on floats: fmod moved to the sign of the divisor.
Value emitFloatFloorMod(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  Value zero = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0.0f));
  Value remainder = b.create<arith::RemFOp>(loc, lhs, rhs);
  Value nonZero = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNE,
                                          remainder, zero);
  Value remainderNegative = b.create<arith::CmpFOp>(
      loc, arith::CmpFPredicate::OLT, remainder, zero);
  Value divisorNegative =
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, rhs, zero);
  Value signsDiffer =
      b.create<arith::XOrIOp>(loc, remainderNegative, divisorNegative);
  Value adjust = b.create<arith::AndIOp>(loc, nonZero, signsDiffer);
  Value shifted = b.create<arith::AddFOp>(loc, remainder, rhs);
  return b.create<arith::SelectOp>(loc, adjust, shifted, remainder);
}

/// `torch.floor_divide` on floats, computed as PyTorch does (through fmod).
Value emitFloatFloorDiv(OpBuilder &b, Location loc, Value lhs, Value rhs) {
  Value zero = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0.0f));
  Value one = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(1.0f));
  Value half = b.create<arith::ConstantOp>(loc, b.getF32FloatAttr(0.5f));
  Value plainQuotient = b.create<arith::DivFOp>(loc, lhs, rhs);
  Value remainder = b.create<arith::RemFOp>(loc, lhs, rhs);
  Value quotient = b.create<arith::DivFOp>(
      loc, b.create<arith::SubFOp>(loc, lhs, remainder), rhs);
  Value nonZero = b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::UNE,
                                          remainder, zero);
  Value remainderNegative = b.create<arith::CmpFOp>(
      loc, arith::CmpFPredicate::OLT, remainder, zero);
  Value divisorNegative =
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OLT, rhs, zero);
  Value signsDiffer =
      b.create<arith::XOrIOp>(loc, remainderNegative, divisorNegative);
  Value adjust = b.create<arith::AndIOp>(loc, nonZero, signsDiffer);
  quotient = b.create<arith::SelectOp>(
      loc, adjust, b.create<arith::SubFOp>(loc, quotient, one), quotient);
  Value floored = b.create<math::FloorOp>(loc, quotient);
  Value roundUp = b.create<arith::CmpFOp>(
      loc, arith::CmpFPredicate::OGT,
      b.create<arith::SubFOp>(loc, quotient, floored), half);
  floored = b.create<arith::SelectOp>(
      loc, roundUp, b.create<arith::AddFOp>(loc, floored, one), floored);
  Value quotientIsZero =
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, quotient, zero);
  Value signedZero = b.create<math::CopySignOp>(loc, zero, plainQuotient);
  Value result =
      b.create<arith::SelectOp>(loc, quotientIsZero, signedZero, floored);
  Value divisorIsZero =
      b.create<arith::CmpFOp>(loc, arith::CmpFPredicate::OEQ, rhs, zero);
  return b.create<arith::SelectOp>(loc, divisorIsZero, plainQuotient, result);
}

//===----------------------------------------------------------------------===//
// Row functions
//===----------------------------------------------------------------------===//

/// The ModABI row signature: (ctx, b, h, q, kv_begin, count, out).
FunctionType rowFunctionType(MLIRContext *context) {
  Type pointer = LLVM::LLVMPointerType::get(context);
  Type i32 = IntegerType::get(context, 32);
  return FunctionType::get(context, {pointer, i32, i32, i32, i32, i32, pointer},
                           {});
}

/// Clones the body of `mod` (minus its yield) at the builder's insertion
/// point with `mapping` holding the mod's arguments, rewriting flex ops.
/// Returns the value the mod yields.
FailureOr<Value> cloneModBody(OpBuilder &builder, ModOp mod,
                              ContextReader &reader,
                              const DeclarationTable &declarations,
                              IRMapping &mapping) {
  for (Operation &op : mod.getBody().front().getOperations()) {
    Location loc = op.getLoc();
    auto operand = [&](unsigned i) {
      return mapping.lookup(op.getOperand(i));
    };
    if (auto yield = dyn_cast<pagedc::flex::YieldOp>(op))
      return mapping.lookup(yield.getValue());
    if (auto load = dyn_cast<pagedc::flex::BufferLoadOp>(op)) {
      SmallVector<Value> indices;
      for (Value index : load.getIndices())
        indices.push_back(mapping.lookup(index));
      FailureOr<Value> value =
          reader.loadElement(builder, &op, load.getBuffer(), indices);
      if (failed(value))
        return failure();
      mapping.map(load.getResult(), *value);
      continue;
    }
    if (auto param = dyn_cast<pagedc::flex::ParamRefOp>(op)) {
      FailureOr<Value> value = reader.param(&op, param.getName());
      if (failed(value))
        return failure();
      mapping.map(param.getResult(), *value);
      continue;
    }
    if (auto constant = dyn_cast<pagedc::flex::ConstRefOp>(op)) {
      auto found = declarations.constants.find(constant.getName());
      if (found == declarations.constants.end())
        return op.emitError("unknown constant @") << constant.getName();
      pagedc::flex::ConstDeclOp declaration = found->second;
      Value value = builder.create<arith::ConstantOp>(
          loc, cast<TypedAttr>(declaration.getValue()));
      mapping.map(constant.getResult(), value);
      continue;
    }
    if (auto floorDiv = dyn_cast<pagedc::flex::FloorDivOp>(op)) {
      Value value =
          floorDiv.getType().isF32()
              ? emitFloatFloorDiv(builder, loc, operand(0), operand(1))
              : emitIntFloorDiv(builder, loc, operand(0), operand(1));
      mapping.map(floorDiv.getResult(), value);
      continue;
    }
    if (auto floorMod = dyn_cast<pagedc::flex::FloorModOp>(op)) {
      Value value =
          floorMod.getType().isF32()
              ? emitFloatFloorMod(builder, loc, operand(0), operand(1))
              : emitIntFloorMod(builder, loc, operand(0), operand(1));
      mapping.map(floorMod.getResult(), value);
      continue;
    }
    // Integer operations whose LLVM forms trap or give poison on some
    // inputs get the language's defined results instead.
    if (isa<arith::ShLIOp, arith::ShRSIOp, math::IPowIOp>(op) &&
        op.getResult(0).getType().isSignlessInteger() &&
        !op.getResult(0).getType().isInteger(1)) {
      Value value = isa<arith::ShLIOp>(op)
                        ? emitShiftLeft(builder, loc, operand(0), operand(1))
                    : isa<arith::ShRSIOp>(op)
                        ? emitShiftRight(builder, loc, operand(0), operand(1))
                        : emitIntPower(builder, loc, operand(0), operand(1));
      mapping.map(op.getResult(0), value);
      continue;
    }
    if (isa<arith::DivSIOp, arith::RemSIOp>(op) &&
        !op.getResult(0).getType().isInteger(1)) {
      // Not produced by MLIRGen; defined like floor division at 0 and -1.
      TruncatedRemainder parts =
          emitTruncatedRemainder(builder, loc, operand(0), operand(1),
                                 /*withQuotient=*/isa<arith::DivSIOp>(op));
      Value value = isa<arith::DivSIOp>(op)
                        ? emitIntFloorDiv(builder, loc, operand(0), operand(1))
                        : emitIntFloorMod(builder, loc, operand(0), operand(1));
      Value truncated =
          isa<arith::DivSIOp>(op) ? parts.quotient : parts.remainder;
      Value special = builder.create<arith::OrIOp>(loc, parts.divisorIsZero,
                                                   parts.divisorIsMinusOne);
      mapping.map(op.getResult(0), builder.create<arith::SelectOp>(
                                       loc, special, value, truncated));
      continue;
    }
    if (auto toInt = dyn_cast<arith::FPToSIOp>(op)) {
      mapping.map(toInt.getResult(),
                  emitFloatToInt(builder, loc, operand(0), toInt.getType()));
      continue;
    }
    if (auto tanh = dyn_cast<pagedc::flex::TanhApproxOp>(op)) {
      // The CPU has no fast hardware tanh: use the exact one.
      mapping.map(tanh.getResult(),
                  builder.create<math::TanhOp>(loc, operand(0)));
      continue;
    }
    if (isa<pagedc::flex::CallOp>(op))
      return op.emitError("flex.call remains: run -flex-inline-mods before "
                          "the CPU conversion");
    if (op.getDialect() && op.getDialect()->getNamespace() == "flex")
      return op.emitError("the CPU conversion cannot lower this operation");
    if (op.getNumRegions() != 0)
      return op.emitError("operations with regions are not supported in mods");
    builder.clone(op, mapping);
  }
  return mod.emitError("mod body has no flex.yield");
}

/// Emits `NAME_row(ctx, b, h, q, kv_begin, count, out)` for `mod`.
LogicalResult buildRowFunction(ModOp mod, const DeclarationTable &declarations,
                               OpBuilder &moduleBuilder) {
  MLIRContext *context = mod.getContext();
  Location loc = mod.getLoc();
  std::string symbol = mod.isMask() ? pagedc::cpuMaskRowSymbol(mod.getSymName())
                                    : pagedc::cpuScoreRowSymbol(mod.getSymName());
  auto function = moduleBuilder.create<func::FuncOp>(loc, symbol,
                                                     rowFunctionType(context));
  // The output row never overlaps the context, buffers or params.
  function.setArgAttr(6, LLVM::LLVMDialect::getNoAliasAttrName(),
                      UnitAttr::get(context));
  Block *entry = function.addEntryBlock();
  OpBuilder builder = OpBuilder::atBlockBegin(entry);
  Value zero = builder.create<arith::ConstantIndexOp>(loc, 0);
  Value one = builder.create<arith::ConstantIndexOp>(loc, 1);
  Value count = builder.create<arith::IndexCastOp>(loc, builder.getIndexType(),
                                                   function.getArgument(5));
  auto loop = builder.create<scf::ForOp>(loc, zero, count, one);
  builder.create<func::ReturnOp>(loc);

  ContextReader reader(declarations, function.getArgument(0),
                       OpBuilder(loop)); // prelude: just before the loop

  builder.setInsertionPointToStart(loop.getBody());
  Value i = loop.getInductionVar();
  Value i32 = builder.create<arith::IndexCastOp>(loc, builder.getI32Type(), i);
  Value kv = builder.create<arith::AddIOp>(loc, function.getArgument(4), i32);
  Value i64 = builder.create<arith::IndexCastOp>(loc, builder.getI64Type(), i);
  Type pointer = LLVM::LLVMPointerType::get(context);
  Type element = mod.isMask() ? Type(builder.getI8Type())
                              : Type(builder.getF32Type());
  Value address = builder.create<LLVM::GEPOp>(
      loc, pointer, element, function.getArgument(6), ValueRange{i64});

  IRMapping mapping;
  if (mod.isScore())
    mapping.map(mod.getScoreArg(),
                builder.create<LLVM::LoadOp>(loc, element, address));
  mapping.map(mod.getB(), function.getArgument(1));
  mapping.map(mod.getH(), function.getArgument(2));
  mapping.map(mod.getQ(), function.getArgument(3));
  mapping.map(mod.getKV(), kv);
  FailureOr<Value> result =
      cloneModBody(builder, mod, reader, declarations, mapping);
  if (failed(result)) {
    function.erase();
    return failure();
  }
  Value stored = *result;
  if (mod.isMask())
    stored = builder.create<arith::ExtUIOp>(loc, builder.getI8Type(), stored);
  builder.create<LLVM::StoreOp>(loc, stored, address);
  return success();
}

//===----------------------------------------------------------------------===//
// Block classification by interval arithmetic
//===----------------------------------------------------------------------===//

/// An abstract value of the interval analysis, as IR values of the
/// classifier: an i32 value lies in [lo, hi] (two i64 values); a boolean is
/// described by (mayBeTrue, mayBeFalse). Anything else is `Unknown`.
struct AbstractValue {
  enum Kind { Unknown, Int, Bool } kind = Unknown;
  Value first, second; // Int: lo, hi. Bool: mayBeTrue, mayBeFalse.
};

/// Emits the interval evaluation of a mask body. Every transfer function is
/// sound: the true result set of an operation over the input intervals is
/// always inside the output interval. Anything not understood becomes the
/// full range of its type, so the classifier can only lose precision.
class IntervalEmitter {
public:
  IntervalEmitter(OpBuilder &builder, Location loc, ContextReader &reader)
      : b(builder), loc(loc), reader(reader) {}

  AbstractValue intRange(Value lo, Value hi) {
    return {AbstractValue::Int, lo, hi};
  }
  AbstractValue point(Value value32) {
    Value wide = b.create<arith::ExtSIOp>(loc, b.getI64Type(), value32);
    return intRange(wide, wide);
  }
  AbstractValue boolean(Value mayBeTrue, Value mayBeFalse) {
    return {AbstractValue::Bool, mayBeTrue, mayBeFalse};
  }
  /// The abstraction of a value nothing is known about.
  AbstractValue top(Type type) {
    if (type.isInteger(1))
      return boolean(constBool(true), constBool(true));
    if (type.isInteger(32))
      return intRange(constI64(std::numeric_limits<int32_t>::min()),
                      constI64(std::numeric_limits<int32_t>::max()));
    return {};
  }

  Value constI64(int64_t value) {
    return b.create<arith::ConstantIntOp>(loc, value, 64);
  }
  Value constBool(bool value) {
    return b.create<arith::ConstantIntOp>(loc, value, 1);
  }
  Value min(Value x, Value y) { return b.create<arith::MinSIOp>(loc, x, y); }
  Value max(Value x, Value y) { return b.create<arith::MaxSIOp>(loc, x, y); }
  Value cmp(arith::CmpIPredicate predicate, Value x, Value y) {
    return b.create<arith::CmpIOp>(loc, predicate, x, y);
  }
  Value both(Value x, Value y) { return b.create<arith::AndIOp>(loc, x, y); }
  Value either(Value x, Value y) { return b.create<arith::OrIOp>(loc, x, y); }
  Value select(Value c, Value x, Value y) {
    return b.create<arith::SelectOp>(loc, c, x, y);
  }

  /// An i32 operation's exact i64 interval, widened to the full i32 range
  /// when it leaves i32 (the JIT'd code wraps around there).
  AbstractValue wrapI32(Value lo, Value hi) {
    Value outside =
        either(cmp(arith::CmpIPredicate::slt, lo,
                   constI64(std::numeric_limits<int32_t>::min())),
               cmp(arith::CmpIPredicate::sgt, hi,
                   constI64(std::numeric_limits<int32_t>::max())));
    AbstractValue full = top(b.getI32Type());
    return intRange(select(outside, full.first, lo),
                    select(outside, full.second, hi));
  }

  /// The abstraction of `op`'s result given its operands' abstractions.
  AbstractValue transfer(Operation &op, ArrayRef<AbstractValue> in) {
    Type type = op.getResult(0).getType();
    auto allKinds = [&](AbstractValue::Kind kind) {
      return llvm::all_of(in,
                          [&](const AbstractValue &v) { return v.kind == kind; });
    };
    if (auto constant = dyn_cast<arith::ConstantOp>(op)) {
      if (auto integer = dyn_cast<IntegerAttr>(constant.getValue())) {
        if (type.isInteger(1))
          return boolean(constBool(integer.getValue().getBoolValue()),
                         constBool(!integer.getValue().getBoolValue()));
        if (type.isInteger(32)) {
          Value value = constI64(integer.getValue().getSExtValue());
          return intRange(value, value);
        }
      }
      return top(type);
    }
    if (type.isInteger(32) && allKinds(AbstractValue::Int)) {
      if (isa<arith::AddIOp>(op))
        return wrapI32(b.create<arith::AddIOp>(loc, in[0].first, in[1].first),
                       b.create<arith::AddIOp>(loc, in[0].second, in[1].second));
      if (isa<arith::SubIOp>(op))
        return wrapI32(
            b.create<arith::SubIOp>(loc, in[0].first, in[1].second),
            b.create<arith::SubIOp>(loc, in[0].second, in[1].first));
      if (isa<arith::MulIOp>(op)) {
        Value p1 = b.create<arith::MulIOp>(loc, in[0].first, in[1].first);
        Value p2 = b.create<arith::MulIOp>(loc, in[0].first, in[1].second);
        Value p3 = b.create<arith::MulIOp>(loc, in[0].second, in[1].first);
        Value p4 = b.create<arith::MulIOp>(loc, in[0].second, in[1].second);
        return wrapI32(min(min(p1, p2), min(p3, p4)),
                       max(max(p1, p2), max(p3, p4)));
      }
      if (isa<arith::MaxSIOp>(op))
        return intRange(max(in[0].first, in[1].first),
                        max(in[0].second, in[1].second));
      if (isa<arith::MinSIOp>(op))
        return intRange(min(in[0].first, in[1].first),
                        min(in[0].second, in[1].second));
      if (isa<math::AbsIOp>(op)) {
        // [lo, hi] >= 0: itself; <= 0: [-hi, -lo]; else [0, max(-lo, hi)].
        Value zero = constI64(0);
        Value negLo = b.create<arith::SubIOp>(loc, zero, in[0].first);
        Value negHi = b.create<arith::SubIOp>(loc, zero, in[0].second);
        Value nonNegative = cmp(arith::CmpIPredicate::sge, in[0].first, zero);
        Value nonPositive = cmp(arith::CmpIPredicate::sle, in[0].second, zero);
        Value lo = select(nonNegative, in[0].first,
                          select(nonPositive, negHi, zero));
        Value hi = select(nonNegative, in[0].second,
                          select(nonPositive, negLo, max(negLo, in[0].second)));
        return wrapI32(lo, hi); // abs(INT32_MIN) wraps
      }
      if (isa<pagedc::flex::FloorDivOp>(op))
        return floorDivInterval(in[0], in[1]);
      if (isa<pagedc::flex::FloorModOp>(op))
        return floorModInterval(in[0], in[1]);
    }
    if (auto select = dyn_cast<arith::SelectOp>(op)) {
      if (in[0].kind != AbstractValue::Bool || in[1].kind != in[2].kind ||
          in[1].kind == AbstractValue::Unknown)
        return top(type);
      Value onlyTrue = both(in[0].first, negate(in[0].second));
      Value onlyFalse = both(in[0].second, negate(in[0].first));
      if (in[1].kind == AbstractValue::Int) {
        Value lo = this->select(
            onlyTrue, in[1].first,
            this->select(onlyFalse, in[2].first, min(in[1].first, in[2].first)));
        Value hi = this->select(
            onlyTrue, in[1].second,
            this->select(onlyFalse, in[2].second,
                         max(in[1].second, in[2].second)));
        return intRange(lo, hi);
      }
      Value mayTrue = this->select(
          onlyTrue, in[1].first,
          this->select(onlyFalse, in[2].first, either(in[1].first, in[2].first)));
      Value mayFalse = this->select(
          onlyTrue, in[1].second,
          this->select(onlyFalse, in[2].second,
                       either(in[1].second, in[2].second)));
      return boolean(mayTrue, mayFalse);
    }
    if (auto compare = dyn_cast<arith::CmpIOp>(op)) {
      if (allKinds(AbstractValue::Int))
        return compareIntervals(compare.getPredicate(), in[0], in[1]);
      if (allKinds(AbstractValue::Bool))
        return compareBooleans(compare.getPredicate(), in[0], in[1]);
      return top(type);
    }
    if (type.isInteger(1) && allKinds(AbstractValue::Bool)) {
      const AbstractValue &x = in[0], &y = in[1];
      if (isa<arith::AndIOp>(op))
        return boolean(both(x.first, y.first), either(x.second, y.second));
      if (isa<arith::OrIOp>(op))
        return boolean(either(x.first, y.first), both(x.second, y.second));
      if (isa<arith::XOrIOp>(op))
        return boolean(either(both(x.first, y.second), both(x.second, y.first)),
                       either(both(x.first, y.first), both(x.second, y.second)));
    }
    if (auto param = dyn_cast<pagedc::flex::ParamRefOp>(op)) {
      FailureOr<Value> value = reader.param(&op, param.getName());
      if (succeeded(value)) {
        if (type.isInteger(32))
          return point(*value);
        if (type.isInteger(1))
          return boolean(*value, negate(*value));
      }
      return top(type);
    }
    return top(type);
  }

private:
  Value negate(Value flag) {
    return b.create<arith::XOrIOp>(loc, flag, constBool(true));
  }

  AbstractValue compareIntervals(arith::CmpIPredicate predicate,
                                 const AbstractValue &x,
                                 const AbstractValue &y) {
    using P = arith::CmpIPredicate;
    Value xlo = x.first, xhi = x.second, ylo = y.first, yhi = y.second;
    switch (predicate) {
    case P::slt:
      return boolean(cmp(P::slt, xlo, yhi), cmp(P::sge, xhi, ylo));
    case P::sle:
      return boolean(cmp(P::sle, xlo, yhi), cmp(P::sgt, xhi, ylo));
    case P::sgt:
      return boolean(cmp(P::sgt, xhi, ylo), cmp(P::sle, xlo, yhi));
    case P::sge:
      return boolean(cmp(P::sge, xhi, ylo), cmp(P::slt, xlo, yhi));
    case P::eq:
    case P::ne: {
      Value overlap = both(cmp(P::sle, xlo, yhi), cmp(P::sle, ylo, xhi));
      Value samePoint = both(both(cmp(P::eq, xlo, xhi), cmp(P::eq, ylo, yhi)),
                             cmp(P::eq, xlo, ylo));
      Value mayEqual = overlap, mayDiffer = negate(samePoint);
      return predicate == P::eq ? boolean(mayEqual, mayDiffer)
                                : boolean(mayDiffer, mayEqual);
    }
    default:
      return top(b.getI1Type());
    }
  }

  AbstractValue compareBooleans(arith::CmpIPredicate predicate,
                                const AbstractValue &x,
                                const AbstractValue &y) {
    using P = arith::CmpIPredicate;
    Value mayEqual =
        either(both(x.first, y.first), both(x.second, y.second));
    Value mayDiffer =
        either(both(x.first, y.second), both(x.second, y.first));
    if (predicate == P::eq)
      return boolean(mayEqual, mayDiffer);
    if (predicate == P::ne)
      return boolean(mayDiffer, mayEqual);
    return top(b.getI1Type());
  }

  /// x // d is monotone in x for a fixed d; sound only for a point divisor.
  AbstractValue floorDivInterval(const AbstractValue &x,
                                 const AbstractValue &d) {
    using P = arith::CmpIPredicate;
    Value divisor = d.first;
    Value isPoint = cmp(P::eq, d.first, d.second);
    Value positive = both(isPoint, cmp(P::sgt, divisor, constI64(0)));
    Value negative = both(isPoint, cmp(P::slt, divisor, constI64(0)));
    Value safe = select(either(positive, negative), divisor, constI64(1));
    Value atLo = emitIntFloorDiv(b, loc, x.first, safe);
    Value atHi = emitIntFloorDiv(b, loc, x.second, safe);
    AbstractValue full = top(b.getI32Type());
    Value lo = select(positive, atLo, select(negative, atHi, full.first));
    Value hi = select(positive, atHi, select(negative, atLo, full.second));
    return wrapI32(lo, hi); // INT32_MIN // -1 wraps
  }

  /// x % d for d > 0 lies in [0, d.hi - 1]; for a point divisor and a range
  /// of x that does not wrap around a multiple of d, [x.lo % d, x.hi % d].
  AbstractValue floorModInterval(const AbstractValue &x,
                                 const AbstractValue &d) {
    using P = arith::CmpIPredicate;
    Value zero = constI64(0), one = constI64(1);
    Value positive = cmp(P::sgt, d.first, zero);
    Value isPoint = cmp(P::eq, d.first, d.second);
    Value safe = select(positive, d.first, one);
    Value atLo = emitIntFloorMod(b, loc, x.first, safe);
    Value atHi = emitIntFloorMod(b, loc, x.second, safe);
    Value span = b.create<arith::SubIOp>(loc, x.second, x.first);
    Value noWrap = both(both(isPoint, positive),
                        both(cmp(P::slt, span, safe), cmp(P::sle, atLo, atHi)));
    Value boundHi = b.create<arith::SubIOp>(loc, d.second, one);
    AbstractValue full = top(b.getI32Type());
    Value lo = select(noWrap, atLo, select(positive, zero, full.first));
    Value hi = select(noWrap, atHi, select(positive, boundHi, full.second));
    return intRange(lo, hi);
  }

  OpBuilder &b;
  Location loc;
  ContextReader &reader;
};

} // namespace

bool pagedc::isIntervalClassifiable(flex::ModOp mod) {
  if (!mod.isMask())
    return false;
  // The classifier is straight-line code about ten times the size of the
  // mask; LLVM's code generation is superlinear in the size of one block, so
  // very long masks (thousands of `let`s) get none: the runtime's
  // element-wise path is exact, only slower.
  constexpr size_t kMaxClassifiedOps = 512;
  if (mod.getBody().front().getOperations().size() > kMaxClassifiedOps)
    return false;
  for (Operation &op : mod.getBody().front().getOperations()) {
    bool integerOrBool = llvm::all_of(op.getResultTypes(), [](Type type) {
      return type.isInteger(32) || type.isInteger(1);
    });
    if (isa<flex::YieldOp>(op))
      continue;
    if (!integerOrBool)
      return false;
    if (isa<arith::XOrIOp, arith::AndIOp, arith::OrIOp>(op)) {
      if (!op.getResult(0).getType().isInteger(1)) // bitwise on ints
        return false;
      continue;
    }
    if (!isa<arith::ConstantOp, arith::AddIOp, arith::SubIOp, arith::MulIOp,
             arith::MaxSIOp, arith::MinSIOp, math::AbsIOp, flex::FloorDivOp,
             flex::FloorModOp, arith::SelectOp, arith::CmpIOp,
             flex::ParamRefOp>(op))
      return false;
  }
  return true;
}

namespace {

/// Emits `mask_block_class_NAME(ctx, b, h, q_lo, q_hi, kv_lo, kv_hi) -> i32`.
void buildBlockClassFunction(ModOp mod, const DeclarationTable &declarations,
                             OpBuilder &moduleBuilder) {
  MLIRContext *context = mod.getContext();
  Location loc = mod.getLoc();
  Type pointer = LLVM::LLVMPointerType::get(context);
  Type i32 = IntegerType::get(context, 32);
  auto type = FunctionType::get(context, {pointer, i32, i32, i32, i32, i32, i32},
                                {i32});
  auto function = moduleBuilder.create<func::FuncOp>(
      loc, pagedc::cpuMaskBlockClassSymbol(mod.getSymName()), type);
  Block *entry = function.addEntryBlock();
  OpBuilder builder = OpBuilder::atBlockBegin(entry);
  ContextReader reader(declarations, function.getArgument(0), builder);
  IntervalEmitter emitter(builder, loc, reader);

  llvm::DenseMap<Value, AbstractValue> abstraction;
  abstraction[mod.getB()] = emitter.point(function.getArgument(1));
  abstraction[mod.getH()] = emitter.point(function.getArgument(2));
  auto range = [&](unsigned lo, unsigned hi) {
    return emitter.intRange(
        builder.create<arith::ExtSIOp>(loc, builder.getI64Type(),
                                       function.getArgument(lo)),
        builder.create<arith::ExtSIOp>(loc, builder.getI64Type(),
                                       function.getArgument(hi)));
  };
  abstraction[mod.getQ()] = range(3, 4);
  abstraction[mod.getKV()] = range(5, 6);

  AbstractValue result;
  for (Operation &op : mod.getBody().front().getOperations()) {
    if (auto yield = dyn_cast<pagedc::flex::YieldOp>(op)) {
      result = abstraction.lookup(yield.getValue());
      break;
    }
    if (op.getNumResults() != 1)
      continue;
    SmallVector<AbstractValue> in;
    for (Value operand : op.getOperands())
      in.push_back(abstraction.lookup(operand));
    abstraction[op.getResult(0)] = emitter.transfer(op, in);
  }
  Value classification;
  if (result.kind == AbstractValue::Bool) {
    // mayBeTrue ? (mayBeFalse ? 1 : 2) : (mayBeFalse ? 0 : 1)
    Value zero = builder.create<arith::ConstantIntOp>(loc, 0, 32);
    Value one = builder.create<arith::ConstantIntOp>(loc, 1, 32);
    Value two = builder.create<arith::ConstantIntOp>(loc, 2, 32);
    Value ifTrue =
        builder.create<arith::SelectOp>(loc, result.second, one, two);
    Value ifNotTrue =
        builder.create<arith::SelectOp>(loc, result.second, zero, one);
    classification =
        builder.create<arith::SelectOp>(loc, result.first, ifTrue, ifNotTrue);
  } else {
    classification = builder.create<arith::ConstantIntOp>(loc, 1, 32);
  }
  builder.create<func::ReturnOp>(loc, classification);
}

//===----------------------------------------------------------------------===//
// The pass
//===----------------------------------------------------------------------===//

struct ConvertFlexToCpuPass
    : public PassWrapper<ConvertFlexToCpuPass, OperationPass<ModuleOp>> {
  MLIR_DEFINE_EXPLICIT_INTERNAL_INLINE_TYPE_ID(ConvertFlexToCpuPass)
  ConvertFlexToCpuPass() = default;
  ConvertFlexToCpuPass(const ConvertFlexToCpuPass &other)
      : PassWrapper(other) {}

  StringRef getArgument() const final { return "convert-flex-to-cpu"; }
  StringRef getDescription() const final {
    return "Replace flex mods by ModABI row functions (func/scf/arith/math/"
           "llvm) for the CPU JIT";
  }
  void getDependentDialects(DialectRegistry &registry) const override {
    registry.insert<arith::ArithDialect, func::FuncDialect, LLVM::LLVMDialect,
                    math::MathDialect, scf::SCFDialect>();
  }
  void runOnOperation() override {
    ModuleOp module = getOperation();
    OpBuilder builder(&getContext());
    OwningOpRef<ModuleOp> converted = ModuleOp::create(module.getLoc());
    pagedc::FlexToCpuOptions options;
    options.mods.assign(mods.begin(), mods.end());
    options.blockClass = blockClass;
    if (failed(pagedc::convertFlexModsToCpu(module, options, *converted)))
      return signalPassFailure();
    module.getBody()->clear();
    module.getBody()->getOperations().splice(
        module.getBody()->end(), converted->getBody()->getOperations());
  }

  ListOption<std::string> mods{*this, "mods",
                               llvm::cl::desc("Names of the mods to convert "
                                              "(default: all)")};
  Option<bool> blockClass{*this, "block-class",
                          llvm::cl::desc("Generate block classifiers for "
                                         "mask mods"),
                          llvm::cl::init(true)};
};

} // namespace

pagedc::ModInterface
pagedc::collectModInterface(ModuleOp module, ArrayRef<flex::ModOp> mods) {
  llvm::StringSet<> usedBuffers, usedParams;
  for (flex::ModOp mod : mods) {
    mod.walk([&](Operation *op) {
      if (auto load = dyn_cast<flex::BufferLoadOp>(op))
        usedBuffers.insert(load.getBuffer());
      else if (auto param = dyn_cast<flex::ParamRefOp>(op))
        usedParams.insert(param.getName());
    });
  }
  ModInterface interface;
  for (Operation &op : module.getBody()->getOperations()) {
    if (auto buffer = dyn_cast<flex::BufferOp>(op)) {
      if (usedBuffers.contains(buffer.getSymName()))
        interface.buffers.push_back(buffer);
    } else if (auto param = dyn_cast<flex::ParamOp>(op)) {
      if (usedParams.contains(param.getSymName()))
        interface.params.push_back(param);
    }
  }
  return interface;
}

LogicalResult pagedc::convertFlexModsToCpu(ModuleOp flexModule,
                                           const FlexToCpuOptions &options,
                                           ModuleOp target) {
  SmallVector<ModOp> selected;
  if (options.mods.empty()) {
    for (ModOp mod : flexModule.getOps<ModOp>())
      selected.push_back(mod);
  } else {
    for (const std::string &name : options.mods) {
      auto mod = dyn_cast_or_null<ModOp>(
          SymbolTable::lookupSymbolIn(flexModule, name));
      if (!mod)
        return flexModule.emitError("no mod named '") << name << "'";
      selected.push_back(mod);
    }
  }
  DeclarationTable declarations(flexModule,
                                collectModInterface(flexModule, selected));
  OpBuilder builder = OpBuilder::atBlockEnd(target.getBody());
  for (ModOp mod : selected) {
    if (failed(buildRowFunction(mod, declarations, builder)))
      return failure();
    if (mod.isMask() && options.blockClass && isIntervalClassifiable(mod))
      buildBlockClassFunction(mod, declarations, builder);
  }
  return success();
}

std::unique_ptr<Pass> pagedc::createConvertFlexToCpuPass() {
  return std::make_unique<ConvertFlexToCpuPass>();
}

void pagedc::registerFlexToCpuPasses() {
  PassRegistration<ConvertFlexToCpuPass>();
  PassPipelineRegistration<>(
      "pagedc-lower-cpu-to-llvm",
      "Lower the output of convert-flex-to-cpu to the LLVM dialect",
      [](OpPassManager &pm) { addLowerToLLVMPasses(pm); });
}
