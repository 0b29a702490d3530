//===- MLIRGen.cpp - Lowering of the .attn AST to the flex dialect --------===//
//
// A direct walk of the checked AST: Sema made every conversion explicit and
// gave both operands of every operator the same type, so each AST node maps
// to one (or, for sigmoid and clamp, a few) operations chosen by its type.
//
//===----------------------------------------------------------------------===//

#include "Frontend/MLIRGen.h"

#include "Frontend/AST.h"

#include "Flex/FlexDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/DenseMap.h"

using namespace mlir;
using namespace pagedc;

namespace {

/// Builds the flex module of one program.
class MLIRGenerator {
public:
  MLIRGenerator(MLIRContext &context, const ast::Program &program)
      : builder(&context), program(program),
        fileName(builder.getStringAttr(
            program.fileName.empty() ? "<input>" : program.fileName)) {}

  OwningOpRef<ModuleOp> generate() {
    OwningOpRef<ModuleOp> module = ModuleOp::create(loc(ast::SourceLoc{1, 1, 0}));
    builder.setInsertionPointToEnd(module->getBody());
    for (const auto &decl : program.consts)
      builder.create<flex::ConstDeclOp>(loc(decl->getNameRange().begin),
                                        decl->getName(),
                                        constantAttr(decl->getValue()));
    for (const auto &decl : program.params) {
      TypedAttr defaultValue;
      if (decl->hasDefaultValue())
        defaultValue = constantAttr(decl->getDefaultValue());
      builder.create<flex::ParamOp>(loc(decl->getNameRange().begin),
                                    builder.getStringAttr(decl->getName()),
                                    TypeAttr::get(type(decl->getType())),
                                    defaultValue);
    }
    for (const auto &decl : program.buffers)
      builder.create<flex::BufferOp>(
          loc(decl->getNameRange().begin), builder.getStringAttr(decl->getName()),
          TypeAttr::get(elementType(decl->getElementType())),
          dimsAttr(decl->getDims()));
    for (const auto &mod : program.mods)
      generateMod(*mod);

    if (failed(verify(*module)))
      return nullptr;
    return module;
  }

private:
  //===--------------------------------------------------------------------===//
  // Types, locations, attributes
  //===--------------------------------------------------------------------===//

  Location loc(ast::SourceLoc where) {
    return FileLineColLoc::get(fileName, where.line, where.column);
  }

  Type type(ast::Type t) {
    switch (t) {
    case ast::Type::Bool:
      return builder.getI1Type();
    case ast::Type::I32:
      return builder.getI32Type();
    case ast::Type::I64:
      return builder.getI64Type();
    case ast::Type::F32:
    case ast::Type::Unknown: // Sema never leaves Unknown; f32 keeps going.
      return builder.getF32Type();
    }
    llvm_unreachable("unknown ast::Type");
  }

  Type elementType(ast::ElementType t) {
    switch (t) {
    case ast::ElementType::I32:
      return builder.getI32Type();
    case ast::ElementType::I64:
      return builder.getI64Type();
    case ast::ElementType::F32:
      return builder.getF32Type();
    case ast::ElementType::F16:
      return builder.getF16Type();
    case ast::ElementType::BF16:
      return builder.getBF16Type();
    case ast::ElementType::Bool:
      return builder.getI1Type();
    }
    llvm_unreachable("unknown ast::ElementType");
  }

  TypedAttr constantAttr(const ast::ConstantValue &value) {
    switch (value.type) {
    case ast::Type::Bool:
      return builder.getBoolAttr(value.boolValue);
    case ast::Type::F32:
      return builder.getF32FloatAttr(static_cast<float>(value.floatValue));
    case ast::Type::I64:
      return builder.getI64IntegerAttr(value.intValue);
    default:
      return builder.getI32IntegerAttr(static_cast<int32_t>(value.intValue));
    }
  }

  ArrayAttr dimsAttr(const std::vector<ast::BufferDim> &dims) {
    SmallVector<Attribute> attrs;
    for (const ast::BufferDim &dim : dims) {
      switch (dim.kind) {
      case ast::BufferDim::Kind::Fixed:
        attrs.push_back(builder.getI64IntegerAttr(dim.size));
        break;
      case ast::BufferDim::Kind::Named:
        attrs.push_back(builder.getStringAttr(dim.name));
        break;
      case ast::BufferDim::Kind::Any:
        attrs.push_back(builder.getUnitAttr());
        break;
      }
    }
    return builder.getArrayAttr(attrs);
  }

  //===--------------------------------------------------------------------===//
  // Mods
  //===--------------------------------------------------------------------===//

  void generateMod(const ast::ModDecl &mod) {
    OpBuilder::InsertionGuard guard(builder);
    auto kind = mod.isMask() ? flex::ModKind::Mask : flex::ModKind::Score;
    auto modOp = builder.create<flex::ModOp>(loc(mod.getNameRange().begin),
                                             mod.getName(), kind);
    Block &entry = modOp.getBody().front();
    // Give each block argument the location of its parameter.
    for (auto [argument, param] :
         llvm::zip(entry.getArguments(), mod.getParams()))
      argument.setLoc(loc(param.range.begin));
    builder.setInsertionPointToStart(&entry);

    arguments = entry.getArguments();
    letValues.clear();
    for (const auto &let : mod.getLets())
      letValues[let.get()] = generate(let->init.get());
    Value result = generate(mod.getResult());
    builder.create<flex::YieldOp>(loc(mod.getResult()->getLoc()), result);
  }

  //===--------------------------------------------------------------------===//
  // Expressions
  //===--------------------------------------------------------------------===//

  Value generate(const ast::Expr *expr) {
    switch (expr->getKind()) {
    case ast::Expr::Kind::IntegerLiteral: {
      auto literal = llvm::cast<ast::IntegerLiteralExpr>(expr);
      Type t = type(expr->getType());
      return builder.create<arith::ConstantOp>(
          loc(expr->getLoc()), builder.getIntegerAttr(t, literal->getValue()));
    }
    case ast::Expr::Kind::FloatLiteral: {
      auto literal = llvm::cast<ast::FloatLiteralExpr>(expr);
      return builder.create<arith::ConstantOp>(
          loc(expr->getLoc()),
          builder.getF32FloatAttr(static_cast<float>(literal->getValue())));
    }
    case ast::Expr::Kind::BoolLiteral:
      return builder.create<arith::ConstantOp>(
          loc(expr->getLoc()),
          builder.getBoolAttr(llvm::cast<ast::BoolLiteralExpr>(expr)->getValue()));
    case ast::Expr::Kind::Name:
      return generateName(llvm::cast<ast::NameExpr>(expr));
    case ast::Expr::Kind::Unary:
      return generateUnary(llvm::cast<ast::UnaryExpr>(expr));
    case ast::Expr::Kind::Binary:
      return generateBinary(llvm::cast<ast::BinaryExpr>(expr));
    case ast::Expr::Kind::Call:
      return generateCall(llvm::cast<ast::CallExpr>(expr));
    case ast::Expr::Kind::Index:
      return generateIndex(llvm::cast<ast::IndexExpr>(expr));
    case ast::Expr::Kind::Cast:
      return generateCast(llvm::cast<ast::CastExpr>(expr));
    }
    llvm_unreachable("unknown expression kind");
  }

  Value generateName(const ast::NameExpr *name) {
    Location where = loc(name->getLoc());
    Type t = type(name->getType());
    switch (name->getRefKind()) {
    case ast::NameExpr::RefKind::ModArgument:
      return arguments[name->getArgumentIndex()];
    case ast::NameExpr::RefKind::Let:
      return letValues.lookup(name->getLet());
    case ast::NameExpr::RefKind::Const:
      return builder.create<flex::ConstRefOp>(
          where, t, name->getConst()->getName());
    case ast::NameExpr::RefKind::Param:
      return builder.create<flex::ParamRefOp>(
          where, t, name->getParam()->getName());
    case ast::NameExpr::RefKind::Unresolved:
      break;
    }
    llvm_unreachable("MLIRGen needs names resolved by Sema");
  }

  /// An integer or float constant of type `t`.
  Value constant(Location where, Type t, double value) {
    if (llvm::isa<FloatType>(t))
      return builder.create<arith::ConstantOp>(
          where, builder.getFloatAttr(t, value));
    return builder.create<arith::ConstantOp>(
        where, builder.getIntegerAttr(t, static_cast<int64_t>(value)));
  }

  Value generateUnary(const ast::UnaryExpr *unary) {
    Value operand = generate(unary->getOperand());
    Location where = loc(unary->getOpRange().begin);
    Type t = operand.getType();
    switch (unary->getOp()) {
    case ast::UnaryOp::Neg:
      if (llvm::isa<FloatType>(t))
        return builder.create<arith::NegFOp>(where, operand);
      return builder.create<arith::SubIOp>(where, constant(where, t, 0),
                                           operand);
    case ast::UnaryOp::BitNot:
    case ast::UnaryOp::LogicalNot:
      // ~x == x ^ -1 on ints; on i1, -1 is true.
      return builder.create<arith::XOrIOp>(
          where, operand,
          builder.create<arith::ConstantOp>(where,
                                            builder.getIntegerAttr(t, -1)));
    }
    llvm_unreachable("unknown unary operator");
  }

  Value generateBinary(const ast::BinaryExpr *binary) {
    Value lhs = generate(binary->getLHS());
    Value rhs = generate(binary->getRHS());
    Location where = loc(binary->getOpRange().begin);
    bool isFloat = llvm::isa<FloatType>(lhs.getType());
    switch (binary->getOp()) {
    case ast::BinaryOp::Add:
      return isFloat ? Value(builder.create<arith::AddFOp>(where, lhs, rhs))
                     : Value(builder.create<arith::AddIOp>(where, lhs, rhs));
    case ast::BinaryOp::Sub:
      return isFloat ? Value(builder.create<arith::SubFOp>(where, lhs, rhs))
                     : Value(builder.create<arith::SubIOp>(where, lhs, rhs));
    case ast::BinaryOp::Mul:
      return isFloat ? Value(builder.create<arith::MulFOp>(where, lhs, rhs))
                     : Value(builder.create<arith::MulIOp>(where, lhs, rhs));
    case ast::BinaryOp::TrueDiv:
      return builder.create<arith::DivFOp>(where, lhs, rhs);
    case ast::BinaryOp::FloorDiv:
      return builder.create<flex::FloorDivOp>(where, lhs, rhs);
    case ast::BinaryOp::Mod:
      return builder.create<flex::FloorModOp>(where, lhs, rhs);
    case ast::BinaryOp::Pow:
      return isFloat ? Value(builder.create<math::PowFOp>(where, lhs, rhs))
                     : Value(builder.create<math::IPowIOp>(where, lhs, rhs));
    case ast::BinaryOp::BitAnd:
    case ast::BinaryOp::LogicalAnd:
      return builder.create<arith::AndIOp>(where, lhs, rhs);
    case ast::BinaryOp::BitOr:
    case ast::BinaryOp::LogicalOr:
      return builder.create<arith::OrIOp>(where, lhs, rhs);
    case ast::BinaryOp::BitXor:
      return builder.create<arith::XOrIOp>(where, lhs, rhs);
    case ast::BinaryOp::Shl:
      return builder.create<arith::ShLIOp>(where, lhs, rhs);
    case ast::BinaryOp::Shr:
      return builder.create<arith::ShRSIOp>(where, lhs, rhs);
    case ast::BinaryOp::Eq:
    case ast::BinaryOp::Ne:
    case ast::BinaryOp::Lt:
    case ast::BinaryOp::Le:
    case ast::BinaryOp::Gt:
    case ast::BinaryOp::Ge:
      return generateComparison(binary->getOp(), where, lhs, rhs, isFloat);
    }
    llvm_unreachable("unknown binary operator");
  }

  /// Comparisons as in PyTorch: ordered for floats, except `!=`, which is
  /// true when either side is NaN.
  Value generateComparison(ast::BinaryOp op, Location where, Value lhs,
                           Value rhs, bool isFloat) {
    if (isFloat) {
      arith::CmpFPredicate predicate;
      switch (op) {
      case ast::BinaryOp::Eq: predicate = arith::CmpFPredicate::OEQ; break;
      case ast::BinaryOp::Ne: predicate = arith::CmpFPredicate::UNE; break;
      case ast::BinaryOp::Lt: predicate = arith::CmpFPredicate::OLT; break;
      case ast::BinaryOp::Le: predicate = arith::CmpFPredicate::OLE; break;
      case ast::BinaryOp::Gt: predicate = arith::CmpFPredicate::OGT; break;
      default: predicate = arith::CmpFPredicate::OGE; break;
      }
      return builder.create<arith::CmpFOp>(where, predicate, lhs, rhs);
    }
    arith::CmpIPredicate predicate;
    switch (op) {
    case ast::BinaryOp::Eq: predicate = arith::CmpIPredicate::eq; break;
    case ast::BinaryOp::Ne: predicate = arith::CmpIPredicate::ne; break;
    case ast::BinaryOp::Lt: predicate = arith::CmpIPredicate::slt; break;
    case ast::BinaryOp::Le: predicate = arith::CmpIPredicate::sle; break;
    case ast::BinaryOp::Gt: predicate = arith::CmpIPredicate::sgt; break;
    default: predicate = arith::CmpIPredicate::sge; break;
    }
    return builder.create<arith::CmpIOp>(where, predicate, lhs, rhs);
  }

  Value generateCall(const ast::CallExpr *call) {
    Location where = loc(call->getLoc());
    SmallVector<Value> args;
    for (unsigned i = 0; i < call->getNumArgs(); ++i)
      args.push_back(generate(call->getArg(i)));

    if (!call->isBuiltin()) {
      const ast::ModDecl *callee = call->getCallee();
      assert(callee && "MLIRGen needs calls resolved by Sema");
      return builder.create<flex::CallOp>(where, type(callee->getResultType()),
                                          callee->getName(), args);
    }

    Type t = type(call->getType());
    bool isFloat = llvm::isa<FloatType>(t);
    switch (call->getBuiltin()) {
    case ast::Builtin::Abs:
      return isFloat ? Value(builder.create<math::AbsFOp>(where, args[0]))
                     : Value(builder.create<math::AbsIOp>(where, args[0]));
    case ast::Builtin::Min:
      return minimum(where, args[0], args[1]);
    case ast::Builtin::Max:
      return maximum(where, args[0], args[1]);
    case ast::Builtin::Clamp:
      return minimum(where, maximum(where, args[0], args[1]), args[2]);
    case ast::Builtin::Exp:
      return builder.create<math::ExpOp>(where, args[0]);
    case ast::Builtin::Exp2:
      return builder.create<math::Exp2Op>(where, args[0]);
    case ast::Builtin::Log:
      return builder.create<math::LogOp>(where, args[0]);
    case ast::Builtin::Log2:
      return builder.create<math::Log2Op>(where, args[0]);
    case ast::Builtin::Sqrt:
      return builder.create<math::SqrtOp>(where, args[0]);
    case ast::Builtin::Rsqrt:
      return builder.create<math::RsqrtOp>(where, args[0]);
    case ast::Builtin::Tanh:
      return builder.create<math::TanhOp>(where, args[0]);
    case ast::Builtin::Sigmoid: {
      // sigmoid(x) = 1 / (1 + exp(-x))
      Value one = constant(where, t, 1.0);
      Value negated = builder.create<arith::NegFOp>(where, args[0]);
      Value exp = builder.create<math::ExpOp>(where, negated);
      Value denominator = builder.create<arith::AddFOp>(where, one, exp);
      return builder.create<arith::DivFOp>(where, one, denominator);
    }
    case ast::Builtin::Sin:
      return builder.create<math::SinOp>(where, args[0]);
    case ast::Builtin::Cos:
      return builder.create<math::CosOp>(where, args[0]);
    case ast::Builtin::Tan:
      return builder.create<math::TanOp>(where, args[0]);
    case ast::Builtin::TanhApprox:
      return builder.create<flex::TanhApproxOp>(where, args[0]);
    case ast::Builtin::Floor:
      return isFloat ? Value(builder.create<math::FloorOp>(where, args[0]))
                     : args[0];
    case ast::Builtin::Ceil:
      return isFloat ? Value(builder.create<math::CeilOp>(where, args[0]))
                     : args[0];
    case ast::Builtin::Round:
      // torch.round rounds half to even.
      return isFloat ? Value(builder.create<math::RoundEvenOp>(where, args[0]))
                     : args[0];
    case ast::Builtin::Where:
      return builder.create<arith::SelectOp>(where, args[0], args[1], args[2]);
    case ast::Builtin::Float:
    case ast::Builtin::Int:
      break;
    }
    llvm_unreachable("float() and int() are CastExprs after Sema");
  }

  /// min and max as torch.minimum / torch.maximum: NaN propagates.
  Value minimum(Location where, Value lhs, Value rhs) {
    if (llvm::isa<FloatType>(lhs.getType()))
      return builder.create<arith::MinimumFOp>(where, lhs, rhs);
    return builder.create<arith::MinSIOp>(where, lhs, rhs);
  }
  Value maximum(Location where, Value lhs, Value rhs) {
    if (llvm::isa<FloatType>(lhs.getType()))
      return builder.create<arith::MaximumFOp>(where, lhs, rhs);
    return builder.create<arith::MaxSIOp>(where, lhs, rhs);
  }

  Value generateIndex(const ast::IndexExpr *index) {
    SmallVector<Value> indices;
    for (unsigned i = 0; i < index->getNumIndices(); ++i)
      indices.push_back(generate(index->getIndex(i)));
    return builder.create<flex::BufferLoadOp>(
        loc(index->getLoc()), type(index->getType()),
        index->getBuffer()->getName(), indices);
  }

  Value generateCast(const ast::CastExpr *cast) {
    Value operand = generate(cast->getOperand());
    Location where = loc(cast->getLoc());
    Type from = operand.getType();
    Type to = type(cast->getType());
    if (from == to)
      return operand;
    bool fromFloat = llvm::isa<FloatType>(from);
    bool toFloat = llvm::isa<FloatType>(to);
    if (from.isInteger(1)) // bool -> 0 or 1
      return toFloat ? Value(builder.create<arith::UIToFPOp>(where, to, operand))
                     : Value(builder.create<arith::ExtUIOp>(where, to, operand));
    if (!fromFloat && toFloat)
      return builder.create<arith::SIToFPOp>(where, to, operand);
    if (fromFloat && !toFloat) // truncates toward zero, like .int()
      return builder.create<arith::FPToSIOp>(where, to, operand);
    if (from.getIntOrFloatBitWidth() < to.getIntOrFloatBitWidth())
      return builder.create<arith::ExtSIOp>(where, to, operand);
    return builder.create<arith::TruncIOp>(where, to, operand);
  }

  OpBuilder builder;
  const ast::Program &program;
  StringAttr fileName;
  /// The arguments of the mod being generated.
  Block::BlockArgListType arguments;
  /// The values of its `let` bindings.
  llvm::DenseMap<const ast::LetStmt *, Value> letValues;
};

} // namespace

OwningOpRef<ModuleOp> pagedc::mlirGen(MLIRContext &context,
                                      const ast::Program &program) {
  context.getOrLoadDialect<flex::FlexDialect>();
  context.getOrLoadDialect<arith::ArithDialect>();
  context.getOrLoadDialect<math::MathDialect>();
  return MLIRGenerator(context, program).generate();
}
