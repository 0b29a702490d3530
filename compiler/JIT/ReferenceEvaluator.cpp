//===- ReferenceEvaluator.cpp - Float64 evaluation of flex mods -----------===//

#include "JIT/ReferenceEvaluator.h"

#include "Flex/FlexArithmetic.h"
#include "pagedc/Tensor.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstring>

using namespace mlir;
using namespace pagedc::jit;

namespace {

enum class Opcode : uint8_t {
  // Constants and declarations.
  ConstInt, ConstReal, LoadBuffer, ParamInt, ParamReal, ParamBool,
  // Integers (int64).
  AddI, SubI, MulI, DivSI, RemSI, FloorDivI, FloorModI, CeilDivSI, AndI, OrI,
  XOrI, ShLI, ShRSI, ShRUI, MaxSI, MinSI, AbsI, IPowI,
  // Reals (double).
  AddF, SubF, MulF, DivF, RemF, FloorDivF, FloorModF, NegF, MaxF, MinF, PowF,
  Atan2, CopySign, FPowI, UnaryF,
  // Comparisons, select, casts.
  CmpI, CmpF, Select, IntToReal, UnsignedToReal, RealToInt, ExtSI, ExtUI,
  TruncI,
  Copy,
};

/// math functions of one double argument.
enum class UnaryFunction : uint8_t {
  Abs, Exp, Exp2, Expm1, Log, Log2, Log10, Log1p, Sqrt, Rsqrt, Tanh, Sinh,
  Cosh, Sin, Cos, Tan, Asin, Acos, Atan, Erf, Floor, Ceil, Round, RoundEven,
  Trunc, Cbrt,
};

double applyUnary(UnaryFunction function, double x) {
  switch (function) {
  case UnaryFunction::Abs: return std::fabs(x);
  case UnaryFunction::Exp: return std::exp(x);
  case UnaryFunction::Exp2: return std::exp2(x);
  case UnaryFunction::Expm1: return std::expm1(x);
  case UnaryFunction::Log: return std::log(x);
  case UnaryFunction::Log2: return std::log2(x);
  case UnaryFunction::Log10: return std::log10(x);
  case UnaryFunction::Log1p: return std::log1p(x);
  case UnaryFunction::Sqrt: return std::sqrt(x);
  case UnaryFunction::Rsqrt: return 1.0 / std::sqrt(x);
  case UnaryFunction::Tanh: return std::tanh(x);
  case UnaryFunction::Sinh: return std::sinh(x);
  case UnaryFunction::Cosh: return std::cosh(x);
  case UnaryFunction::Sin: return std::sin(x);
  case UnaryFunction::Cos: return std::cos(x);
  case UnaryFunction::Tan: return std::tan(x);
  case UnaryFunction::Asin: return std::asin(x);
  case UnaryFunction::Acos: return std::acos(x);
  case UnaryFunction::Atan: return std::atan(x);
  case UnaryFunction::Erf: return std::erf(x);
  case UnaryFunction::Floor: return std::floor(x);
  case UnaryFunction::Ceil: return std::ceil(x);
  case UnaryFunction::Round: return std::round(x);
  case UnaryFunction::RoundEven: return std::nearbyint(x);
  case UnaryFunction::Trunc: return std::trunc(x);
  case UnaryFunction::Cbrt: return std::cbrt(x);
  }
  return x;
}

/// The opcode of each supported operation, by name.
const llvm::StringMap<Opcode> &binaryAndCastOpcodes() {
  static const llvm::StringMap<Opcode> table = {
      {"arith.addi", Opcode::AddI},         {"arith.subi", Opcode::SubI},
      {"arith.muli", Opcode::MulI},         {"arith.divsi", Opcode::DivSI},
      {"arith.remsi", Opcode::RemSI},       {"arith.floordivsi", Opcode::FloorDivI},
      {"arith.ceildivsi", Opcode::CeilDivSI}, {"arith.andi", Opcode::AndI},
      {"arith.ori", Opcode::OrI},           {"arith.xori", Opcode::XOrI},
      {"arith.shli", Opcode::ShLI},         {"arith.shrsi", Opcode::ShRSI},
      {"arith.shrui", Opcode::ShRUI},       {"arith.maxsi", Opcode::MaxSI},
      {"arith.minsi", Opcode::MinSI},       {"math.absi", Opcode::AbsI},
      {"math.ipowi", Opcode::IPowI},        {"arith.addf", Opcode::AddF},
      {"arith.subf", Opcode::SubF},         {"arith.mulf", Opcode::MulF},
      {"arith.divf", Opcode::DivF},         {"arith.remf", Opcode::RemF},
      {"arith.negf", Opcode::NegF},         {"arith.maximumf", Opcode::MaxF},
      {"arith.maxnumf", Opcode::MaxF},      {"arith.minimumf", Opcode::MinF},
      {"arith.minnumf", Opcode::MinF},      {"math.powf", Opcode::PowF},
      {"math.atan2", Opcode::Atan2},        {"math.copysign", Opcode::CopySign},
      {"math.fpowi", Opcode::FPowI},        {"arith.select", Opcode::Select},
      {"arith.sitofp", Opcode::IntToReal},  {"arith.uitofp", Opcode::UnsignedToReal},
      {"arith.fptosi", Opcode::RealToInt},  {"arith.fptoui", Opcode::RealToInt},
      {"arith.extsi", Opcode::ExtSI},       {"arith.extui", Opcode::ExtUI},
      {"arith.trunci", Opcode::TruncI},     {"arith.extf", Opcode::Copy},
      {"arith.truncf", Opcode::Copy},       {"flex.tanh_approx", Opcode::UnaryF},
  };
  return table;
}

const llvm::StringMap<UnaryFunction> &unaryFunctions() {
  static const llvm::StringMap<UnaryFunction> table = {
      {"math.absf", UnaryFunction::Abs},     {"math.exp", UnaryFunction::Exp},
      {"math.exp2", UnaryFunction::Exp2},    {"math.expm1", UnaryFunction::Expm1},
      {"math.log", UnaryFunction::Log},      {"math.log2", UnaryFunction::Log2},
      {"math.log10", UnaryFunction::Log10},  {"math.log1p", UnaryFunction::Log1p},
      {"math.sqrt", UnaryFunction::Sqrt},    {"math.rsqrt", UnaryFunction::Rsqrt},
      {"math.tanh", UnaryFunction::Tanh},    {"flex.tanh_approx", UnaryFunction::Tanh},
      {"math.sinh", UnaryFunction::Sinh},    {"math.cosh", UnaryFunction::Cosh},
      {"math.sin", UnaryFunction::Sin},      {"math.cos", UnaryFunction::Cos},
      {"math.tan", UnaryFunction::Tan},      {"math.asin", UnaryFunction::Asin},
      {"math.acos", UnaryFunction::Acos},    {"math.atan", UnaryFunction::Atan},
      {"math.erf", UnaryFunction::Erf},      {"math.floor", UnaryFunction::Floor},
      {"math.ceil", UnaryFunction::Ceil},    {"math.round", UnaryFunction::Round},
      {"math.roundeven", UnaryFunction::RoundEven},
      {"math.trunc", UnaryFunction::Trunc},  {"math.cbrt", UnaryFunction::Cbrt},
  };
  return table;
}

/// The width in bits of an integer type (64 for anything else).
unsigned widthOf(Type type) {
  if (auto integer = dyn_cast<IntegerType>(type))
    return integer.getWidth();
  return 64;
}

/// `value` wrapped to a signed integer of `width` bits.
int64_t wrapSigned(int64_t value, unsigned width) {
  if (width >= 64)
    return value;
  if (width == 1)
    return value & 1;
  uint64_t mask = (uint64_t(1) << width) - 1;
  uint64_t bits = uint64_t(value) & mask;
  if (bits >> (width - 1))
    bits |= ~mask;
  return int64_t(bits);
}

/// `value` as an unsigned integer of `width` bits.
uint64_t asUnsigned(int64_t value, unsigned width) {
  if (width >= 64)
    return uint64_t(value);
  return uint64_t(value) & ((uint64_t(1) << width) - 1);
}

bool compareIntegers(arith::CmpIPredicate predicate, int64_t x, int64_t y,
                     unsigned width) {
  using P = arith::CmpIPredicate;
  uint64_t ux = asUnsigned(x, width), uy = asUnsigned(y, width);
  switch (predicate) {
  case P::eq: return x == y;
  case P::ne: return x != y;
  case P::slt: return x < y;
  case P::sle: return x <= y;
  case P::sgt: return x > y;
  case P::sge: return x >= y;
  case P::ult: return ux < uy;
  case P::ule: return ux <= uy;
  case P::ugt: return ux > uy;
  case P::uge: return ux >= uy;
  }
  return false;
}

bool compareReals(arith::CmpFPredicate predicate, double x, double y) {
  using P = arith::CmpFPredicate;
  bool unordered = std::isnan(x) || std::isnan(y);
  switch (predicate) {
  case P::AlwaysFalse: return false;
  case P::OEQ: return !unordered && x == y;
  case P::OGT: return !unordered && x > y;
  case P::OGE: return !unordered && x >= y;
  case P::OLT: return !unordered && x < y;
  case P::OLE: return !unordered && x <= y;
  case P::ONE: return !unordered && x != y;
  case P::ORD: return !unordered;
  case P::UEQ: return unordered || x == y;
  case P::UGT: return unordered || x > y;
  case P::UGE: return unordered || x >= y;
  case P::ULT: return unordered || x < y;
  case P::ULE: return unordered || x <= y;
  case P::UNE: return unordered || x != y;
  case P::UNO: return unordered;
  case P::AlwaysTrue: return true;
  }
  return false;
}

} // namespace

/// One interpreted operation: result slot, up to three operand slots and the
/// operation's static data.
struct ReferenceMod::Instruction {
  Opcode opcode;
  unsigned result = 0;
  unsigned operands[3] = {0, 0, 0};
  unsigned width = 64;           // integer result (or operand) width
  int64_t integer = 0;           // ConstInt, param/buffer index, predicate
  double real = 0.0;             // ConstReal
  UnaryFunction function = UnaryFunction::Abs;
  pagedc::DType elementType = pagedc::DType::F32; // LoadBuffer
  unsigned rank = 0;             // LoadBuffer
  unsigned indices[4] = {0, 0, 0, 0};
};

ReferenceMod::~ReferenceMod() = default;

static llvm::Error unsupported(Operation *op, const llvm::Twine &why) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getLoc() << ": the float64 reference evaluator " << why << ": '"
     << op->getName() << "'";
  return llvm::createStringError(llvm::inconvertibleErrorCode(), os.str());
}

static std::optional<pagedc::DType> dtypeOf(Type type) {
  if (type.isF32()) return pagedc::DType::F32;
  if (type.isF16()) return pagedc::DType::F16;
  if (type.isBF16()) return pagedc::DType::BF16;
  if (type.isInteger(32)) return pagedc::DType::I32;
  if (type.isInteger(64)) return pagedc::DType::I64;
  if (type.isInteger(1)) return pagedc::DType::Bool;
  return std::nullopt;
}

llvm::Expected<std::shared_ptr<const ReferenceMod>>
ReferenceMod::compile(flex::ModOp mod, llvm::ArrayRef<flex::BufferOp> buffers,
                      llvm::ArrayRef<flex::ParamOp> params) {
  std::shared_ptr<ReferenceMod> result(new ReferenceMod());
  result->isScore_ = mod.isScore();
  llvm::DenseMap<Value, unsigned> slots;
  // Slots 0..4: s, b, h, q, kv.
  if (mod.isScore())
    slots[mod.getScoreArg()] = 0;
  for (unsigned i = 0; i < 4; ++i)
    slots[mod.getIndexArg(i)] = 1 + i;
  unsigned nextSlot = 5;

  auto bufferIndex = [&](StringRef name) -> int64_t {
    for (size_t i = 0; i < buffers.size(); ++i)
      if (flex::BufferOp(buffers[i]).getSymName() == name)
        return int64_t(i);
    return -1;
  };
  auto paramIndex = [&](StringRef name) -> int64_t {
    for (size_t i = 0; i < params.size(); ++i)
      if (flex::ParamOp(params[i]).getSymName() == name)
        return int64_t(i);
    return -1;
  };

  bool sawYield = false;
  for (Operation &op : mod.getBody().front().getOperations()) {
    if (auto yield = dyn_cast<flex::YieldOp>(op)) {
      result->resultSlot_ = slots.lookup(yield.getValue());
      sawYield = true;
      break;
    }
    if (op.getNumResults() != 1 || op.getNumOperands() > 4 ||
        op.getNumRegions() != 0)
      return unsupported(&op, "cannot evaluate");
    Instruction instruction{};
    instruction.result = nextSlot;
    Type resultType = op.getResult(0).getType();
    instruction.width = widthOf(resultType);
    for (auto [i, operand] : llvm::enumerate(op.getOperands())) {
      if (i < 3)
        instruction.operands[i] = slots.lookup(operand);
      if (i < 4)
        instruction.indices[i] = slots.lookup(operand);
    }
    StringRef name = op.getName().getStringRef();

    if (auto constant = dyn_cast<arith::ConstantOp>(op)) {
      if (auto integer = dyn_cast<IntegerAttr>(constant.getValue())) {
        instruction.opcode = Opcode::ConstInt;
        instruction.integer = resultType.isInteger(1)
                                  ? int64_t(integer.getValue().getBoolValue())
                                  : integer.getValue().getSExtValue();
      } else if (auto real = dyn_cast<FloatAttr>(constant.getValue())) {
        instruction.opcode = Opcode::ConstReal;
        instruction.real = real.getValueAsDouble();
      } else {
        return unsupported(&op, "cannot evaluate a non-scalar constant");
      }
    } else if (auto load = dyn_cast<flex::BufferLoadOp>(op)) {
      int64_t index = bufferIndex(load.getBuffer());
      if (index < 0)
        return unsupported(&op, "found no declaration for the buffer of");
      flex::BufferOp buffer = buffers[index];
      std::optional<DType> type = dtypeOf(buffer.getElementType());
      if (!type || buffer.getRank() != load.getIndices().size() ||
          buffer.getRank() > 4)
        return unsupported(&op, "cannot read this buffer in");
      instruction.opcode = Opcode::LoadBuffer;
      instruction.integer = index;
      instruction.elementType = *type;
      instruction.rank = buffer.getRank();
    } else if (auto param = dyn_cast<flex::ParamRefOp>(op)) {
      int64_t index = paramIndex(param.getName());
      if (index < 0)
        return unsupported(&op, "found no declaration for the param of");
      instruction.integer = index;
      Type type = flex::ParamOp(params[index]).getType();
      instruction.opcode = type.isF32()          ? Opcode::ParamReal
                           : type.isInteger(1) ? Opcode::ParamBool
                                               : Opcode::ParamInt;
    } else if (isa<flex::ConstRefOp>(op)) {
      return unsupported(&op, "expects folded constants (run the pipeline) "
                              "and found");
    } else if (auto floorDiv = dyn_cast<flex::FloorDivOp>(op)) {
      instruction.opcode = resultType.isF32() ? Opcode::FloorDivF
                                              : Opcode::FloorDivI;
    } else if (auto floorMod = dyn_cast<flex::FloorModOp>(op)) {
      instruction.opcode = resultType.isF32() ? Opcode::FloorModF
                                              : Opcode::FloorModI;
    } else if (auto compare = dyn_cast<arith::CmpIOp>(op)) {
      instruction.opcode = Opcode::CmpI;
      instruction.integer = int64_t(compare.getPredicate());
      instruction.width = widthOf(compare.getLhs().getType());
    } else if (auto compare = dyn_cast<arith::CmpFOp>(op)) {
      instruction.opcode = Opcode::CmpF;
      instruction.integer = int64_t(compare.getPredicate());
    } else if (auto unary = unaryFunctions().find(name);
               unary != unaryFunctions().end()) {
      instruction.opcode = Opcode::UnaryF;
      instruction.function = unary->second;
    } else if (auto other = binaryAndCastOpcodes().find(name);
               other != binaryAndCastOpcodes().end()) {
      instruction.opcode = other->second;
      if (instruction.opcode == Opcode::ExtUI ||
          instruction.opcode == Opcode::ExtSI ||
          instruction.opcode == Opcode::IntToReal ||
          instruction.opcode == Opcode::UnsignedToReal)
        instruction.width = widthOf(op.getOperand(0).getType());
    } else {
      return unsupported(&op, "does not support");
    }
    result->instructions_.push_back(instruction);
    slots[op.getResult(0)] = nextSlot++;
  }
  if (!sawYield)
    return unsupported(mod, "found no flex.yield in");
  result->slotCount_ = nextSlot;
  return std::shared_ptr<const ReferenceMod>(std::move(result));
}

/// An IEEE binary16 value, exactly.
static double halfToDouble(uint16_t bits) {
  int exponent = (bits >> 10) & 0x1f;
  int mantissa = bits & 0x3ff;
  double magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(double(mantissa), -24); // subnormal
  else if (exponent == 31)
    magnitude = mantissa ? NAN : INFINITY;
  else
    magnitude = std::ldexp(double(mantissa | 0x400), exponent - 25);
  return (bits & 0x8000) ? -magnitude : magnitude;
}

/// Reads element `offset` of a buffer of `type` as int64 or double.
static void readElement(const void *data, int64_t offset, pagedc::DType type,
                        int64_t &integer, double &real) {
  switch (type) {
  case pagedc::DType::F32:
    real = static_cast<const float *>(data)[offset];
    return;
  case pagedc::DType::F16:
    real = halfToDouble(static_cast<const uint16_t *>(data)[offset]);
    return;
  case pagedc::DType::BF16:
    real = pagedc::bf16ToFloat(static_cast<const uint16_t *>(data)[offset]);
    return;
  case pagedc::DType::I32:
    integer = static_cast<const int32_t *>(data)[offset];
    return;
  case pagedc::DType::I64:
    integer = static_cast<const int64_t *>(data)[offset];
    return;
  case pagedc::DType::Bool:
    integer = static_cast<const uint8_t *>(data)[offset] != 0;
    return;
  default:
    return;
  }
}

// The float64 reference's interpreter loop: one case per operation of the
// lowered mod, kept in one switch so the reference reads as the semantics
// the CPU JIT and the CUDA code are checked against.
ReferenceMod::Slot ReferenceMod::run(const PagedcModContext &context,
                                     double score, int32_t b, int32_t h,
                                     int32_t q, int32_t kv) const {
  llvm::SmallVector<Slot, 64> slots(slotCount_);
  slots[0].real = score;
  slots[1].integer = b;
  slots[2].integer = h;
  slots[3].integer = q;
  slots[4].integer = kv;
  for (const Instruction &in : instructions_) {
    const Slot &x = slots[in.operands[0]];
    const Slot &y = slots[in.operands[1]];
    const Slot &z = slots[in.operands[2]];
    Slot &out = slots[in.result];
    switch (in.opcode) {
    case Opcode::ConstInt: out.integer = in.integer; break;
    case Opcode::ConstReal: out.real = in.real; break;
    case Opcode::LoadBuffer: {
      // Bounds-checked like the compiled code: an index outside
      // [0, size) reads 0 (false for bool).
      const PagedcBufferRef &buffer = context.buffers[in.integer];
      int64_t offset = 0;
      bool inBounds = true;
      for (unsigned d = 0; d < in.rank; ++d) {
        int64_t index = slots[in.indices[d]].integer;
        inBounds = inBounds && index >= 0 && index < buffer.sizes[d];
        offset += index * buffer.strides[d];
      }
      int64_t integer = 0;
      double real = 0.0;
      if (inBounds)
        readElement(buffer.data, offset, in.elementType, integer, real);
      if (in.elementType == DType::F32 || in.elementType == DType::F16 ||
          in.elementType == DType::BF16)
        out.real = real;
      else
        out.integer = integer;
      break;
    }
    case Opcode::ParamInt: out.integer = context.params[in.integer].i32; break;
    case Opcode::ParamReal: out.real = context.params[in.integer].f32; break;
    case Opcode::ParamBool:
      out.integer = context.params[in.integer].i32 != 0;
      break;
    // Integer results wrap to the width of their type, as the compiled code
    // does (the language defines two's complement wrap-around).
    case Opcode::AddI:
      out.integer = wrapSigned(
          int64_t(uint64_t(x.integer) + uint64_t(y.integer)), in.width);
      break;
    case Opcode::SubI:
      out.integer = wrapSigned(
          int64_t(uint64_t(x.integer) - uint64_t(y.integer)), in.width);
      break;
    case Opcode::MulI:
      out.integer = wrapSigned(
          int64_t(uint64_t(x.integer) * uint64_t(y.integer)), in.width);
      break;
    case Opcode::DivSI: // truncating; same edge cases as floor division
      out.integer = (y.integer == 0 || y.integer == -1)
                        ? flex::intFloorDiv(x.integer, y.integer, in.width)
                        : x.integer / y.integer;
      break;
    case Opcode::RemSI:
      out.integer = (y.integer == 0 || y.integer == -1)
                        ? flex::intFloorMod(x.integer, y.integer, in.width)
                        : x.integer % y.integer;
      break;
    case Opcode::FloorDivI:
      out.integer = flex::intFloorDiv(x.integer, y.integer, in.width);
      break;
    case Opcode::FloorModI:
      out.integer = flex::intFloorMod(x.integer, y.integer, in.width);
      break;
    case Opcode::CeilDivSI:
      out.integer =
          y.integer
              ? wrapSigned(-flex::floorDiv(-x.integer, y.integer), in.width)
              : 0;
      break;
    case Opcode::AndI: out.integer = x.integer & y.integer; break;
    case Opcode::OrI: out.integer = x.integer | y.integer; break;
    case Opcode::XOrI:
      out.integer = in.width == 1 ? (x.integer ^ y.integer) & 1
                                  : x.integer ^ y.integer;
      break;
    case Opcode::ShLI:
      out.integer = flex::intShiftLeft(x.integer, y.integer, in.width);
      break;
    case Opcode::ShRSI:
      out.integer = flex::intShiftRight(x.integer, y.integer, in.width);
      break;
    case Opcode::ShRUI:
      out.integer = (y.integer >= 0 && y.integer < int64_t(in.width))
                        ? wrapSigned(int64_t(asUnsigned(x.integer, in.width) >>
                                             y.integer),
                                     in.width)
                        : 0;
      break;
    case Opcode::MaxSI: out.integer = std::max(x.integer, y.integer); break;
    case Opcode::MinSI: out.integer = std::min(x.integer, y.integer); break;
    case Opcode::AbsI: // abs(MIN) == MIN
      out.integer =
          wrapSigned(int64_t(x.integer < 0 ? uint64_t(0) - uint64_t(x.integer)
                                           : uint64_t(x.integer)),
                     in.width);
      break;
    case Opcode::IPowI:
      out.integer = flex::intPower(x.integer, y.integer, in.width);
      break;
    case Opcode::AddF: out.real = x.real + y.real; break;
    case Opcode::SubF: out.real = x.real - y.real; break;
    case Opcode::MulF: out.real = x.real * y.real; break;
    case Opcode::DivF: out.real = x.real / y.real; break;
    case Opcode::RemF: out.real = std::fmod(x.real, y.real); break;
    case Opcode::FloorDivF: out.real = flex::floorDiv(x.real, y.real); break;
    case Opcode::FloorModF: out.real = flex::floorMod(x.real, y.real); break;
    case Opcode::NegF: out.real = -x.real; break;
    case Opcode::MaxF:
      out.real = (std::isnan(x.real) || std::isnan(y.real))
                     ? NAN
                     : std::max(x.real, y.real);
      break;
    case Opcode::MinF:
      out.real = (std::isnan(x.real) || std::isnan(y.real))
                     ? NAN
                     : std::min(x.real, y.real);
      break;
    case Opcode::PowF: out.real = std::pow(x.real, y.real); break;
    case Opcode::Atan2: out.real = std::atan2(x.real, y.real); break;
    case Opcode::CopySign: out.real = std::copysign(x.real, y.real); break;
    case Opcode::FPowI: out.real = std::pow(x.real, double(y.integer)); break;
    case Opcode::UnaryF: out.real = applyUnary(in.function, x.real); break;
    case Opcode::CmpI:
      out.integer = compareIntegers(arith::CmpIPredicate(in.integer),
                                    x.integer, y.integer, in.width);
      break;
    case Opcode::CmpF:
      out.integer =
          compareReals(arith::CmpFPredicate(in.integer), x.real, y.real);
      break;
    case Opcode::Select: out = (x.integer & 1) ? y : z; break;
    case Opcode::IntToReal: // i1 true is -1 as a signed integer
      out.real = in.width == 1 ? -double(x.integer & 1) : double(x.integer);
      break;
    case Opcode::UnsignedToReal:
      out.real = double(asUnsigned(x.integer, in.width));
      break;
    case Opcode::RealToInt:
      // int(): truncation toward zero, saturating; NaN gives 0.
      out.integer = flex::floatToInt(x.real, in.width);
      break;
    case Opcode::ExtSI: // i1 true sign-extends to -1
      out.integer = in.width == 1 ? -(x.integer & 1) : x.integer;
      break;
    case Opcode::ExtUI:
      out.integer = int64_t(asUnsigned(x.integer, in.width));
      break;
    case Opcode::TruncI: out.integer = wrapSigned(x.integer, in.width); break;
    case Opcode::Copy: out = x; break;
    }
  }
  return slots[resultSlot_];
}

bool ReferenceMod::evaluateMask(const PagedcModContext &context, int32_t b,
                                int32_t h, int32_t q, int32_t kv) const {
  return (run(context, 0.0, b, h, q, kv).integer & 1) != 0;
}

double ReferenceMod::evaluateScore(const PagedcModContext &context,
                                   double score, int32_t b, int32_t h,
                                   int32_t q, int32_t kv) const {
  return run(context, score, b, h, q, kv).real;
}
