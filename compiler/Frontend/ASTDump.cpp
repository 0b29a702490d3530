//===- ASTDump.cpp - Text form of the AST (pagedc --emit=ast) -------------===//

#include "Frontend.h"

#include "llvm/Support/Format.h"

#include <cmath>

using namespace pagedc;
using namespace pagedc::ast;

namespace {

class Dumper {
public:
  explicit Dumper(llvm::raw_ostream &os) : os(os) {}

  void dump(const Program &program);

private:
  llvm::raw_ostream &indent(unsigned depth) { return os.indent(depth * 2); }
  void printFloat(double value) {
    if (std::isinf(value))
      os << (value < 0 ? "-inf" : "inf");
    else
      os << llvm::format("%.9g", value);
  }
  void printValue(const ConstantValue &value) {
    switch (value.type) {
    case Type::I32:
      os << value.intValue;
      break;
    case Type::F32:
      printFloat(value.floatValue);
      break;
    case Type::Bool:
      os << (value.boolValue ? "true" : "false");
      break;
    default:
      os << "<unknown>";
      break;
    }
  }
  void printType(const Expr &expr) {
    if (expr.getType() != Type::Unknown)
      os << " : " << typeName(expr.getType());
  }
  void dumpExpr(const Expr &expr, unsigned depth);

  llvm::raw_ostream &os;
};

void Dumper::dump(const Program &program) {
  os << "Program '" << program.fileName << "'\n";
  for (const auto &decl : program.consts) {
    indent(1) << "Const " << decl->getName();
    if (decl->getValue().type != Type::Unknown) {
      os << " = ";
      printValue(decl->getValue());
      os << " : " << typeName(decl->getValue().type);
    }
    if (decl->isOverridden())
      os << " (set by -D)";
    os << "\n";
    dumpExpr(*decl->getInit(), 2);
  }
  for (const auto &param : program.params) {
    indent(1) << "Param " << param->getName() << " : "
              << typeName(param->getType());
    if (param->hasDefaultValue()) {
      os << " = ";
      printValue(param->getDefaultValue());
    }
    os << " [slot " << param->getIndex() << "]\n";
  }
  for (const auto &buffer : program.buffers) {
    indent(1) << "Buffer " << buffer->getName() << " : "
              << elementTypeName(buffer->getElementType()) << "[";
    bool first = true;
    for (const BufferDim &dim : buffer->getDims()) {
      if (!first)
        os << ", ";
      first = false;
      switch (dim.kind) {
      case BufferDim::Kind::Fixed:
        os << dim.size;
        break;
      case BufferDim::Kind::Named:
        os << dim.name;
        break;
      case BufferDim::Kind::Any:
        os << "?";
        break;
      }
    }
    os << "] [slot " << buffer->getIndex() << "]\n";
  }
  for (const auto &mod : program.mods) {
    indent(1) << (mod->isMask() ? "Mask " : "Score ") << mod->getName() << "(";
    bool first = true;
    for (const ModParam &param : mod->getParams()) {
      if (!first)
        os << ", ";
      first = false;
      os << param.name;
    }
    os << ") -> " << typeName(mod->getResultType()) << "\n";
    for (const auto &let : mod->getLets()) {
      indent(2) << "Let " << let->name;
      if (let->init->getType() != Type::Unknown)
        os << " : " << typeName(let->init->getType());
      os << "\n";
      dumpExpr(*let->init, 3);
    }
    indent(2) << "Result\n";
    dumpExpr(*mod->getResult(), 3);
  }
}

void Dumper::dumpExpr(const Expr &expr, unsigned depth) {
  indent(depth);
  switch (expr.getKind()) {
  case Expr::Kind::IntegerLiteral:
    os << "IntegerLiteral " << llvm::cast<IntegerLiteralExpr>(expr).getValue();
    printType(expr);
    os << "\n";
    return;
  case Expr::Kind::FloatLiteral:
    os << "FloatLiteral ";
    printFloat(llvm::cast<FloatLiteralExpr>(expr).getValue());
    printType(expr);
    os << "\n";
    return;
  case Expr::Kind::BoolLiteral:
    os << "BoolLiteral "
       << (llvm::cast<BoolLiteralExpr>(expr).getValue() ? "true" : "false");
    printType(expr);
    os << "\n";
    return;
  case Expr::Kind::Name: {
    const auto &name = llvm::cast<NameExpr>(expr);
    os << "Name " << name.getName();
    printType(expr);
    switch (name.getRefKind()) {
    case NameExpr::RefKind::Unresolved:
      break;
    case NameExpr::RefKind::ModArgument:
      os << " [argument " << name.getArgumentIndex() << "]";
      break;
    case NameExpr::RefKind::Let:
      os << " [let]";
      break;
    case NameExpr::RefKind::Const:
      os << " [const = ";
      printValue(name.getConst()->getValue());
      os << "]";
      break;
    case NameExpr::RefKind::Param:
      os << " [param slot " << name.getParam()->getIndex() << "]";
      break;
    }
    os << "\n";
    return;
  }
  case Expr::Kind::Unary: {
    const auto &unary = llvm::cast<UnaryExpr>(expr);
    os << "Unary " << unaryOpSpelling(unary.getOp());
    printType(expr);
    os << "\n";
    dumpExpr(*unary.getOperand(), depth + 1);
    return;
  }
  case Expr::Kind::Binary: {
    const auto &binary = llvm::cast<BinaryExpr>(expr);
    os << "Binary " << binaryOpSpelling(binary.getOp());
    printType(expr);
    os << "\n";
    dumpExpr(*binary.getLHS(), depth + 1);
    dumpExpr(*binary.getRHS(), depth + 1);
    return;
  }
  case Expr::Kind::Call: {
    const auto &call = llvm::cast<CallExpr>(expr);
    os << "Call " << call.getCalleeName();
    printType(expr);
    if (call.isBuiltin())
      os << " [builtin]";
    else if (call.getCallee())
      os << " [" << (call.getCallee()->isMask() ? "mask" : "score") << " mod]";
    os << "\n";
    for (unsigned i = 0; i < call.getNumArgs(); ++i)
      dumpExpr(*call.getArg(i), depth + 1);
    return;
  }
  case Expr::Kind::Index: {
    const auto &index = llvm::cast<IndexExpr>(expr);
    os << "Index " << index.getBufferName();
    printType(expr);
    if (index.getBuffer())
      os << " [buffer slot " << index.getBuffer()->getIndex() << ", "
         << elementTypeName(index.getBuffer()->getElementType()) << "]";
    os << "\n";
    for (unsigned i = 0; i < index.getNumIndices(); ++i)
      dumpExpr(*index.getIndex(i), depth + 1);
    return;
  }
  case Expr::Kind::Cast: {
    const auto &cast = llvm::cast<CastExpr>(expr);
    os << "Cast " << typeName(cast.getOperand()->getType()) << " -> "
       << typeName(cast.getType()) << (cast.isImplicit() ? " (implicit)" : "")
       << "\n";
    dumpExpr(*cast.getOperand(), depth + 1);
    return;
  }
  }
}

} // namespace

void pagedc::dumpAST(const Program &program, llvm::raw_ostream &os) {
  Dumper(os).dump(program);
}
