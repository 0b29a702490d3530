//===- AST.cpp - Names of types, operators and builtins -------------------===//

#include "AST.h"

#include "llvm/Support/ErrorHandling.h"

using namespace pagedc::ast;

llvm::StringRef pagedc::ast::typeName(Type type) {
  switch (type) {
  case Type::Unknown:
    return "<unknown>";
  case Type::Bool:
    return "bool";
  case Type::I32:
    return "i32";
  case Type::I64:
    return "i64";
  case Type::F32:
    return "f32";
  }
  llvm_unreachable("unknown type");
}

llvm::StringRef pagedc::ast::elementTypeName(ElementType type) {
  switch (type) {
  case ElementType::I32:
    return "i32";
  case ElementType::I64:
    return "i64";
  case ElementType::F32:
    return "f32";
  case ElementType::F16:
    return "f16";
  case ElementType::BF16:
    return "bf16";
  case ElementType::Bool:
    return "bool";
  }
  llvm_unreachable("unknown element type");
}

Type pagedc::ast::readType(ElementType type) {
  switch (type) {
  case ElementType::I32:
    return Type::I32;
  case ElementType::I64:
    return Type::I64;
  case ElementType::F32:
  case ElementType::F16:
  case ElementType::BF16:
    return Type::F32;
  case ElementType::Bool:
    return Type::Bool;
  }
  llvm_unreachable("unknown element type");
}

llvm::StringRef pagedc::ast::unaryOpSpelling(UnaryOp op) {
  switch (op) {
  case UnaryOp::Neg:
    return "-";
  case UnaryOp::BitNot:
    return "~";
  case UnaryOp::LogicalNot:
    return "not";
  }
  llvm_unreachable("unknown unary operator");
}

llvm::StringRef pagedc::ast::binaryOpSpelling(BinaryOp op) {
  switch (op) {
  case BinaryOp::Add:
    return "+";
  case BinaryOp::Sub:
    return "-";
  case BinaryOp::Mul:
    return "*";
  case BinaryOp::TrueDiv:
    return "/";
  case BinaryOp::FloorDiv:
    return "//";
  case BinaryOp::Mod:
    return "%";
  case BinaryOp::Pow:
    return "**";
  case BinaryOp::BitAnd:
    return "&";
  case BinaryOp::BitOr:
    return "|";
  case BinaryOp::BitXor:
    return "^";
  case BinaryOp::Shl:
    return "<<";
  case BinaryOp::Shr:
    return ">>";
  case BinaryOp::LogicalAnd:
    return "and";
  case BinaryOp::LogicalOr:
    return "or";
  case BinaryOp::Eq:
    return "==";
  case BinaryOp::Ne:
    return "!=";
  case BinaryOp::Lt:
    return "<";
  case BinaryOp::Le:
    return "<=";
  case BinaryOp::Gt:
    return ">";
  case BinaryOp::Ge:
    return ">=";
  }
  llvm_unreachable("unknown binary operator");
}

bool pagedc::ast::isComparison(BinaryOp op) {
  switch (op) {
  case BinaryOp::Eq:
  case BinaryOp::Ne:
  case BinaryOp::Lt:
  case BinaryOp::Le:
  case BinaryOp::Gt:
  case BinaryOp::Ge:
    return true;
  default:
    return false;
  }
}

namespace {
struct BuiltinEntry {
  Builtin builtin;
  const char *name;
};
constexpr BuiltinEntry kBuiltins[] = {
    {Builtin::Abs, "abs"},     {Builtin::Min, "min"},
    {Builtin::Max, "max"},     {Builtin::Clamp, "clamp"},
    {Builtin::Exp, "exp"},     {Builtin::Exp2, "exp2"},
    {Builtin::Log, "log"},     {Builtin::Log2, "log2"},
    {Builtin::Sqrt, "sqrt"},   {Builtin::Rsqrt, "rsqrt"},
    {Builtin::Tanh, "tanh"},   {Builtin::Sigmoid, "sigmoid"},
    {Builtin::Sin, "sin"},     {Builtin::Cos, "cos"},
    {Builtin::Tan, "tan"},     {Builtin::TanhApprox, "tanh_approx"},
    {Builtin::Floor, "floor"}, {Builtin::Ceil, "ceil"},
    {Builtin::Round, "round"}, {Builtin::Where, "where"},
    {Builtin::Float, "float"}, {Builtin::Int, "int"},
};
} // namespace

llvm::StringRef pagedc::ast::builtinName(Builtin builtin) {
  for (const BuiltinEntry &entry : kBuiltins)
    if (entry.builtin == builtin)
      return entry.name;
  llvm_unreachable("unknown builtin");
}

bool pagedc::ast::lookupBuiltin(llvm::StringRef name, Builtin &result) {
  for (const BuiltinEntry &entry : kBuiltins) {
    if (name == entry.name) {
      result = entry.builtin;
      return true;
    }
  }
  return false;
}

std::vector<llvm::StringRef> pagedc::ast::builtinNames() {
  std::vector<llvm::StringRef> names;
  for (const BuiltinEntry &entry : kBuiltins)
    names.push_back(entry.name);
  return names;
}

template <typename T>
static const T *findByName(const std::vector<std::unique_ptr<T>> &items,
                           llvm::StringRef name) {
  for (const std::unique_ptr<T> &item : items)
    if (item->getName() == name)
      return item.get();
  return nullptr;
}

const ModDecl *Program::findMod(llvm::StringRef name) const {
  return findByName(mods, name);
}
const ConstDecl *Program::findConst(llvm::StringRef name) const {
  return findByName(consts, name);
}
const ParamDecl *Program::findParam(llvm::StringRef name) const {
  return findByName(params, name);
}
const BufferDecl *Program::findBuffer(llvm::StringRef name) const {
  return findByName(buffers, name);
}
