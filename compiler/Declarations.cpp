//===- Declarations.cpp - flex declarations as the runtime sees them ------===//

#include "Declarations.h"

#include "llvm/Support/raw_ostream.h"

#include <optional>

using namespace mlir;

namespace pagedc {
namespace {

std::optional<DType> elementDType(Type type) {
  if (type.isF32()) return DType::F32;
  if (type.isF16()) return DType::F16;
  if (type.isBF16()) return DType::BF16;
  if (type.isInteger(32)) return DType::I32;
  if (type.isInteger(64)) return DType::I64;
  if (type.isInteger(1)) return DType::Bool;
  return std::nullopt;
}

std::optional<ScalarKind> scalarKind(Type type) {
  if (type.isF32()) return ScalarKind::F32;
  if (type.isInteger(32)) return ScalarKind::I32;
  if (type.isInteger(1)) return ScalarKind::Bool;
  return std::nullopt;
}

/// "file:line:col: message" for a declaration the runtime cannot take.
llvm::Error declarationError(Operation *op, const llvm::Twine &message) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << op->getLoc() << ": " << message;
  return llvm::createStringError(llvm::inconvertibleErrorCode(), os.str());
}

} // namespace

llvm::Expected<BufferDecl> describeBuffer(flex::BufferOp buffer) {
  BufferDecl decl;
  decl.name = buffer.getSymName().str();
  std::optional<DType> type = elementDType(buffer.getElementType());
  if (!type)
    return declarationError(buffer, "buffer '" + decl.name +
                                        "' has an unsupported element type");
  decl.elementType = *type;
  for (Attribute dim : buffer.getDims()) {
    BufferDim out;
    if (auto size = dyn_cast<IntegerAttr>(dim)) {
      out.kind = BufferDim::Fixed;
      out.size = size.getInt();
    } else if (auto name = dyn_cast<StringAttr>(dim)) {
      out.kind = BufferDim::Named;
      out.name = name.str();
    } else {
      out.kind = BufferDim::Any;
    }
    decl.dims.push_back(std::move(out));
  }
  return decl;
}

llvm::Expected<ParamDecl> describeParam(flex::ParamOp param) {
  ParamDecl decl;
  decl.name = param.getSymName().str();
  std::optional<ScalarKind> kind = scalarKind(param.getType());
  if (!kind)
    return declarationError(param, "param '" + decl.name +
                                       "' is not i32, f32 or bool");
  decl.type = *kind;
  if (std::optional<TypedAttr> value = param.getDefaultValue()) {
    if (auto real = dyn_cast<FloatAttr>(*value))
      decl.defaultValue =
          ParamValue::ofF32(static_cast<float>(real.getValueAsDouble()));
    else if (auto integer = dyn_cast<IntegerAttr>(*value))
      decl.defaultValue =
          *kind == ScalarKind::Bool
              ? ParamValue::ofBool(integer.getValue().getBoolValue())
              : ParamValue::ofI32(
                    static_cast<int32_t>(integer.getValue().getSExtValue()));
  }
  return decl;
}

llvm::Expected<ModuleDeclarations> collectDeclarations(ModuleOp module) {
  ModuleDeclarations result;
  for (flex::ParamOp param : module.getOps<flex::ParamOp>()) {
    llvm::Expected<ParamDecl> decl = describeParam(param);
    if (!decl)
      return decl.takeError();
    result.params.push_back(std::move(*decl));
  }
  for (flex::BufferOp buffer : module.getOps<flex::BufferOp>()) {
    llvm::Expected<BufferDecl> decl = describeBuffer(buffer);
    if (!decl)
      return decl.takeError();
    result.buffers.push_back(std::move(*decl));
  }
  return result;
}

} // namespace pagedc
