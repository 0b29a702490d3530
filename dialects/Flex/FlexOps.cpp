//===- FlexOps.cpp - Operations of the flex dialect -----------------------===//
//
// Custom syntax, verifiers and folders of the flex operations.
//
//===----------------------------------------------------------------------===//

#include "Flex/FlexArithmetic.h"
#include "Flex/FlexDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Interfaces/FunctionImplementation.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace pagedc::flex;

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

/// True for the types scalar declarations (constants, params) may have.
static bool isScalarDeclType(Type type, bool allowI64) {
  return type.isInteger(1) || type.isInteger(32) ||
         (allowI64 && type.isInteger(64)) || type.isF32();
}

/// True if `value` is an integer or float attribute whose type is `type`.
static bool isScalarAttrOfType(Attribute value, Type type) {
  auto typed = llvm::dyn_cast<TypedAttr>(value);
  return typed && typed.getType() == type &&
         (llvm::isa<IntegerAttr>(value) || llvm::isa<FloatAttr>(value));
}

/// Parses `[dim, ...]` where a dim is an integer, a bare name or `?`.
static ParseResult parseBufferDims(OpAsmParser &parser, ArrayAttr &dims) {
  Builder &builder = parser.getBuilder();
  SmallVector<Attribute> elements;
  auto parseDim = [&]() -> ParseResult {
    if (succeeded(parser.parseOptionalQuestion())) {
      elements.push_back(builder.getUnitAttr());
      return success();
    }
    int64_t size = 0;
    OptionalParseResult integer = parser.parseOptionalInteger(size);
    if (integer.has_value()) {
      if (failed(*integer))
        return failure();
      elements.push_back(builder.getI64IntegerAttr(size));
      return success();
    }
    StringRef name;
    if (succeeded(parser.parseOptionalKeyword(&name))) {
      elements.push_back(builder.getStringAttr(name));
      return success();
    }
    return parser.emitError(parser.getCurrentLocation(),
                            "expected a dimension: an integer, a name or '?'");
  };
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Square, parseDim))
    return failure();
  dims = builder.getArrayAttr(elements);
  return success();
}

/// Prints `[dim, ...]`; the inverse of parseBufferDims.
static void printBufferDims(OpAsmPrinter &printer, Operation *,
                            ArrayAttr dims) {
  printer << "[";
  llvm::interleaveComma(dims, printer, [&](Attribute dim) {
    if (auto size = llvm::dyn_cast<IntegerAttr>(dim))
      printer << size.getInt();
    else if (auto name = llvm::dyn_cast<StringAttr>(dim))
      printer.printKeywordOrString(name.getValue());
    else
      printer << "?";
  });
  printer << "]";
}

//===----------------------------------------------------------------------===//
// ConstDeclOp, ParamOp, BufferOp
//===----------------------------------------------------------------------===//

LogicalResult ConstDeclOp::verify() {
  Type type = getValue().getType();
  if (!isScalarDeclType(type, /*allowI64=*/true) ||
      !isScalarAttrOfType(getValue(), type))
    return emitOpError("value must be an i1, i32, i64 or f32 constant, got ")
           << getValue();
  return success();
}

LogicalResult ParamOp::verify() {
  Type type = getType();
  if (!isScalarDeclType(type, /*allowI64=*/false))
    return emitOpError("type must be i32, f32 or i1, got ") << type;
  if (std::optional<TypedAttr> value = getDefaultValue())
    if (!isScalarAttrOfType(*value, type))
      return emitOpError("default value ")
             << *value << " does not have the param's type " << type;
  return success();
}

LogicalResult BufferOp::verify() {
  Type element = getElementType();
  if (!(element.isInteger(32) || element.isInteger(64) || element.isF32() ||
        element.isF16() || element.isBF16() || element.isInteger(1)))
    return emitOpError("element type must be i32, i64, f32, f16, bf16 or i1, "
                       "got ")
           << element;
  if (getRank() < 1 || getRank() > 4)
    return emitOpError("rank must be 1 to 4, got ") << getRank();
  for (Attribute dim : getDims()) {
    if (auto size = llvm::dyn_cast<IntegerAttr>(dim)) {
      if (size.getInt() <= 0)
        return emitOpError("fixed dimensions must be positive, got ")
               << size.getInt();
    } else if (auto name = llvm::dyn_cast<StringAttr>(dim)) {
      if (name.getValue().empty())
        return emitOpError("dimension names must not be empty");
    } else if (!llvm::isa<UnitAttr>(dim)) {
      return emitOpError("a dimension must be an integer, a name or unit "
                         "(any size), got ")
             << dim;
    }
  }
  return success();
}

Type BufferOp::getLoadType() {
  Type element = getElementType();
  if (llvm::isa<FloatType>(element))
    return Float32Type::get(getContext());
  return element;
}

//===----------------------------------------------------------------------===//
// ModOp
//===----------------------------------------------------------------------===//

FunctionType ModOp::getSignature(MLIRContext *context, ModKind kind) {
  Type i32 = IntegerType::get(context, 32);
  Type f32 = Float32Type::get(context);
  if (kind == ModKind::Mask)
    return FunctionType::get(context, {i32, i32, i32, i32},
                             {IntegerType::get(context, 1)});
  return FunctionType::get(context, {f32, i32, i32, i32, i32}, {f32});
}

ArrayRef<StringRef> ModOp::getArgNames(ModKind kind) {
  static const StringRef names[] = {"s", "b", "h", "q", "kv"};
  if (kind == ModKind::Mask)
    return ArrayRef<StringRef>(names).drop_front();
  return names;
}

void ModOp::build(OpBuilder &builder, OperationState &state, StringRef name,
                  ModKind kind) {
  FunctionType type = getSignature(builder.getContext(), kind);
  state.addAttribute(getSymNameAttrName(state.name),
                     builder.getStringAttr(name));
  state.addAttribute(getKindAttrName(state.name),
                     ModKindAttr::get(builder.getContext(), kind));
  state.addAttribute(getFunctionTypeAttrName(state.name),
                     TypeAttr::get(type));
  Region *body = state.addRegion();
  Block *entry = new Block();
  body->push_back(entry);
  for (Type input : type.getInputs())
    entry->addArgument(input, state.location);
}

YieldOp ModOp::getYield() {
  return llvm::cast<YieldOp>(getBody().front().getTerminator());
}

ParseResult ModOp::parse(OpAsmParser &parser, OperationState &result) {
  Builder &builder = parser.getBuilder();
  StringRef kindName;
  SMLoc kindLoc = parser.getCurrentLocation();
  if (parser.parseKeyword(&kindName))
    return failure();
  std::optional<ModKind> kind = symbolizeModKind(kindName);
  if (!kind)
    return parser.emitError(kindLoc, "expected 'mask' or 'score', got '")
           << kindName << "'";
  result.addAttribute(getKindAttrName(result.name),
                      ModKindAttr::get(builder.getContext(), *kind));

  StringAttr name;
  if (parser.parseSymbolName(name, getSymNameAttrName(result.name),
                             result.attributes))
    return failure();

  SmallVector<OpAsmParser::Argument> arguments;
  SmallVector<Type> resultTypes;
  SmallVector<DictionaryAttr> resultAttrs;
  bool isVariadic = false;
  if (function_interface_impl::parseFunctionSignature(
          parser, /*allowVariadic=*/false, arguments, isVariadic, resultTypes,
          resultAttrs))
    return failure();
  SmallVector<Type> argumentTypes;
  for (OpAsmParser::Argument &argument : arguments)
    argumentTypes.push_back(argument.type);
  result.addAttribute(
      getFunctionTypeAttrName(result.name),
      TypeAttr::get(builder.getFunctionType(argumentTypes, resultTypes)));
  function_interface_impl::addArgAndResultAttrs(
      builder, result, arguments, resultAttrs, getArgAttrsAttrName(result.name),
      getResAttrsAttrName(result.name));

  if (parser.parseOptionalAttrDictWithKeyword(result.attributes))
    return failure();
  return parser.parseRegion(*result.addRegion(), arguments,
                            /*enableNameShadowing=*/false);
}

void ModOp::print(OpAsmPrinter &printer) {
  printer << " " << stringifyModKind(getKind()) << " ";
  printer.printSymbolName(getSymName());
  function_interface_impl::printFunctionSignature(
      printer, *this, getArgumentTypes(), /*isVariadic=*/false,
      getResultTypes());
  printer.printOptionalAttrDictWithKeyword(
      (*this)->getAttrs(),
      {getSymNameAttrName(), getKindAttrName(), getFunctionTypeAttrName(),
       getArgAttrsAttrName(), getResAttrsAttrName()});
  printer << " ";
  printer.printRegion(getBody(), /*printEntryBlockArgs=*/false,
                      /*printBlockTerminators=*/true);
}

LogicalResult ModOp::verify() {
  FunctionType expected = getSignature(getContext(), getKind());
  FunctionType actual = getFunctionType();
  StringRef kind = stringifyModKind(getKind());
  if (actual.getNumInputs() != expected.getNumInputs())
    return emitOpError() << "a " << kind << " mod takes "
                         << expected.getNumInputs() << " arguments, got "
                         << actual.getNumInputs();
  if (actual.getInputs() != expected.getInputs())
    return emitOpError() << "a " << kind << " mod takes arguments of types ("
                         << expected.getInputs() << "), got ("
                         << actual.getInputs() << ")";
  if (actual.getResults() != expected.getResults())
    return emitOpError() << "a " << kind << " mod yields "
                         << expected.getResults() << ", got "
                         << actual.getResults();
  return success();
}

void ModOp::getAsmBlockArgumentNames(Region &region,
                                     OpAsmSetValueNameFn setNameFn) {
  if (&region != &getBody() || region.empty())
    return;
  ArrayRef<StringRef> names = getArgNames(getKind());
  if (region.getNumArguments() != names.size())
    return;
  for (auto [argument, name] : llvm::zip(region.getArguments(), names))
    setNameFn(argument, name);
}

//===----------------------------------------------------------------------===//
// YieldOp
//===----------------------------------------------------------------------===//

LogicalResult YieldOp::verify() {
  auto mod = (*this)->getParentOfType<ModOp>();
  ArrayRef<Type> results = mod.getResultTypes();
  if (results.size() != 1 || results.front() != getValue().getType())
    return emitOpError() << "yields " << getValue().getType()
                         << " but the enclosing mod yields " << results;
  return success();
}

//===----------------------------------------------------------------------===//
// Symbol uses: CallOp, ConstRefOp, ParamRefOp, BufferLoadOp
//===----------------------------------------------------------------------===//

/// Looks up `name` from `user` and checks that it is an `OpTy`; emits an error
/// naming `what` otherwise.
template <typename OpTy>
static OpTy lookupDecl(Operation *user, SymbolTableCollection &symbolTable,
                       FlatSymbolRefAttr name, StringRef what) {
  Operation *symbol = symbolTable.lookupNearestSymbolFrom(user, name);
  if (!symbol) {
    user->emitOpError() << "refers to '@" << name.getValue()
                        << "', which is not defined";
    return nullptr;
  }
  auto decl = llvm::dyn_cast<OpTy>(symbol);
  if (!decl)
    user->emitOpError() << "refers to '@" << name.getValue()
                        << "', which is not a " << what;
  return decl;
}

LogicalResult CallOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto callee =
      lookupDecl<ModOp>(*this, symbolTable, getCalleeAttr(), "flex.mod");
  if (!callee)
    return failure();
  if (getOperands().getTypes() != callee.getArgumentTypes())
    return emitOpError() << "passes (" << getOperands().getTypes()
                         << ") but '@" << getCallee() << "' takes ("
                         << callee.getArgumentTypes() << ")";
  if (ArrayRef<Type>(getResult().getType()) != callee.getResultTypes())
    return emitOpError() << "expects " << getResult().getType() << " but '@"
                         << getCallee() << "' yields "
                         << callee.getResultTypes();
  auto caller = (*this)->getParentOfType<ModOp>();
  if (caller && caller.isScore() && callee.isMask())
    return emitOpError() << "a score mod may not call the mask mod '@"
                         << getCallee() << "'";
  return success();
}

LogicalResult
ConstRefOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto decl = lookupDecl<ConstDeclOp>(*this, symbolTable, getNameAttr(),
                                      "flex.const_decl");
  if (!decl)
    return failure();
  if (decl.getValue().getType() != getType())
    return emitOpError() << "has type " << getType() << " but '@" << getName()
                         << "' has type " << decl.getValue().getType();
  return success();
}

LogicalResult
ParamRefOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto param =
      lookupDecl<ParamOp>(*this, symbolTable, getNameAttr(), "flex.param");
  if (!param)
    return failure();
  if (param.getType() != getType())
    return emitOpError() << "has type " << getType() << " but '@" << getName()
                         << "' has type " << param.getType();
  return success();
}

LogicalResult
BufferLoadOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto buffer =
      lookupDecl<BufferOp>(*this, symbolTable, getBufferAttr(), "flex.buffer");
  if (!buffer)
    return failure();
  if (getIndices().size() != buffer.getRank())
    return emitOpError() << "has " << getIndices().size() << " indices but '@"
                         << getBuffer() << "' has rank " << buffer.getRank();
  if (getType() != buffer.getLoadType())
    return emitOpError() << "reads " << getType() << " but elements of '@"
                         << getBuffer() << "' (" << buffer.getElementType()
                         << ") read as " << buffer.getLoadType();
  return success();
}

//===----------------------------------------------------------------------===//
// Folders
//===----------------------------------------------------------------------===//

/// Folds an integer floordiv/floormod of two constants with `compute`, which
/// works on int64_t; gives up where the result is undefined or does not fit.
template <typename Compute>
static Attribute foldIntegerBinary(Type type, Attribute lhs, Attribute rhs,
                                   Compute compute) {
  auto lhsInt = llvm::dyn_cast_if_present<IntegerAttr>(lhs);
  auto rhsInt = llvm::dyn_cast_if_present<IntegerAttr>(rhs);
  if (!lhsInt || !rhsInt)
    return {};
  int64_t a = lhsInt.getValue().getSExtValue();
  int64_t b = rhsInt.getValue().getSExtValue();
  if (b == 0 || (b == -1 && a == std::numeric_limits<int64_t>::min()))
    return {};
  int64_t value = compute(a, b);
  unsigned width = type.getIntOrFloatBitWidth();
  if (width < 64 && (value < -(int64_t(1) << (width - 1)) ||
                     value >= (int64_t(1) << (width - 1))))
    return {};
  return IntegerAttr::get(type, value);
}

/// Folds an f32 floordiv/floormod of two constants with `compute`.
template <typename Compute>
static Attribute foldFloatBinary(Type type, Attribute lhs, Attribute rhs,
                                 Compute compute) {
  auto lhsFloat = llvm::dyn_cast_if_present<FloatAttr>(lhs);
  auto rhsFloat = llvm::dyn_cast_if_present<FloatAttr>(rhs);
  if (!lhsFloat || !rhsFloat)
    return {};
  float a = lhsFloat.getValue().convertToFloat();
  float b = rhsFloat.getValue().convertToFloat();
  return FloatAttr::get(type, compute(a, b));
}

/// True if `attr` is the integer constant `value`.
static bool isIntegerConstant(Attribute attr, int64_t value) {
  auto integer = llvm::dyn_cast_if_present<IntegerAttr>(attr);
  return integer && integer.getValue().getSExtValue() == value;
}

OpFoldResult FloorDivOp::fold(FoldAdaptor adaptor) {
  Type type = getType();
  if (type.isF32())
    return foldFloatBinary(type, adaptor.getLhs(), adaptor.getRhs(),
                           [](float a, float b) { return floorDiv(a, b); });
  // x // 1 == x
  if (isIntegerConstant(adaptor.getRhs(), 1))
    return getLhs();
  return foldIntegerBinary(type, adaptor.getLhs(), adaptor.getRhs(),
                           [](int64_t a, int64_t b) { return floorDiv(a, b); });
}

OpFoldResult FloorModOp::fold(FoldAdaptor adaptor) {
  Type type = getType();
  if (type.isF32())
    return foldFloatBinary(type, adaptor.getLhs(), adaptor.getRhs(),
                           [](float a, float b) { return floorMod(a, b); });
  // x % 1 == x % -1 == 0
  if (isIntegerConstant(adaptor.getRhs(), 1) ||
      isIntegerConstant(adaptor.getRhs(), -1))
    return IntegerAttr::get(type, 0);
  return foldIntegerBinary(type, adaptor.getLhs(), adaptor.getRhs(),
                           [](int64_t a, int64_t b) { return floorMod(a, b); });
}

OpFoldResult TanhApproxOp::fold(FoldAdaptor adaptor) {
  auto operand = llvm::dyn_cast_if_present<FloatAttr>(adaptor.getOperand());
  if (!operand)
    return {};
  return FloatAttr::get(getType(),
                        std::tanh(operand.getValue().convertToFloat()));
}

#define GET_OP_CLASSES
#include "Flex/FlexOps.cpp.inc"
