//===- ConstantEvaluator.cpp - Folding of constant expressions ------------===//

#include "ConstantEvaluator.h"

#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <limits>

using namespace pagedc;
using namespace pagedc::ast;

int64_t pagedc::floorDivide(int64_t a, int64_t b) {
  int64_t quotient = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0)))
    --quotient;
  return quotient;
}

int64_t pagedc::floorModulo(int64_t a, int64_t b) {
  int64_t remainder = a % b;
  if (remainder != 0 && ((remainder < 0) != (b < 0)))
    remainder += b;
  return remainder;
}

double pagedc::floorDivide(double a, double b) { return std::floor(a / b); }

double pagedc::floorModulo(double a, double b) {
  double remainder = std::fmod(a, b);
  if (remainder != 0.0 && ((remainder < 0.0) != (b < 0.0)))
    remainder += b;
  return remainder;
}

std::optional<ConstantValue>
ConstantEvaluator::fail(const Expr &expr, const llvm::Twine &message) {
  if (diags)
    diags->error(expr.getRange(), message);
  return std::nullopt;
}

static double asDouble(const ConstantValue &value) {
  switch (value.type) {
  case Type::F32:
    return value.floatValue;
  case Type::Bool:
    return value.boolValue ? 1.0 : 0.0;
  default:
    return static_cast<double>(value.intValue);
  }
}

std::optional<ConstantValue> ConstantEvaluator::evaluate(const Expr &expr) {
  switch (expr.getKind()) {
  case Expr::Kind::IntegerLiteral:
    return ConstantValue::ofInt(
        llvm::cast<IntegerLiteralExpr>(expr).getValue());
  case Expr::Kind::FloatLiteral:
    return ConstantValue::ofFloat(
        llvm::cast<FloatLiteralExpr>(expr).getValue());
  case Expr::Kind::BoolLiteral:
    return ConstantValue::ofBool(llvm::cast<BoolLiteralExpr>(expr).getValue());
  case Expr::Kind::Name: {
    const auto &name = llvm::cast<NameExpr>(expr);
    if (name.getRefKind() != NameExpr::RefKind::Const ||
        name.getConst()->getValue().type == Type::Unknown)
      return std::nullopt;
    return name.getConst()->getValue();
  }
  case Expr::Kind::Cast: {
    const auto &cast = llvm::cast<CastExpr>(expr);
    std::optional<ConstantValue> operand = evaluate(*cast.getOperand());
    if (!operand)
      return std::nullopt;
    if (cast.getType() == Type::F32)
      return ConstantValue::ofFloat(asDouble(*operand));
    if (operand->type == Type::F32) {
      double value = std::trunc(operand->floatValue);
      if (!(std::fabs(value) < 9.2e18))
        return fail(
            expr,
            "float value out of the range of ints in a constant expression");
      return ConstantValue::ofInt(static_cast<int64_t>(value));
    }
    if (operand->type == Type::Bool)
      return ConstantValue::ofInt(operand->boolValue ? 1 : 0);
    return operand;
  }
  case Expr::Kind::Unary: {
    const auto &unary = llvm::cast<UnaryExpr>(expr);
    std::optional<ConstantValue> operand = evaluate(*unary.getOperand());
    if (!operand)
      return std::nullopt;
    switch (unary.getOp()) {
    case UnaryOp::LogicalNot:
      return ConstantValue::ofBool(!operand->boolValue);
    case UnaryOp::BitNot:
      return ConstantValue::ofInt(~operand->intValue);
    case UnaryOp::Neg:
      if (operand->type == Type::F32)
        return ConstantValue::ofFloat(-operand->floatValue);
      if (operand->intValue == std::numeric_limits<int64_t>::min())
        return fail(expr, "integer overflow in constant expression");
      return ConstantValue::ofInt(-operand->intValue);
    }
    return std::nullopt;
  }
  case Expr::Kind::Binary:
    return evaluateBinary(llvm::cast<BinaryExpr>(expr));
  case Expr::Kind::Call:
    return evaluateCall(llvm::cast<CallExpr>(expr));
  case Expr::Kind::Index:
    return std::nullopt;
  }
  return std::nullopt;
}

// One case per binary operator and operand type, each a few lines that must
// fold exactly as the generated code computes (i32 wrap, division by zero,
// f32 rounding): kept as one switch so the cases can be read side by side.
std::optional<ConstantValue>
ConstantEvaluator::evaluateBinary(const BinaryExpr &expr) {
  std::optional<ConstantValue> lhs = evaluate(*expr.getLHS());
  if (!lhs)
    return std::nullopt;
  std::optional<ConstantValue> rhs = evaluate(*expr.getRHS());
  if (!rhs)
    return std::nullopt;
  BinaryOp op = expr.getOp();
  llvm::StringRef spelling = binaryOpSpelling(op);

  if (lhs->type == Type::Bool) {
    bool a = lhs->boolValue, b = rhs->boolValue;
    switch (op) {
    case BinaryOp::BitAnd:
    case BinaryOp::LogicalAnd:
      return ConstantValue::ofBool(a && b);
    case BinaryOp::BitOr:
    case BinaryOp::LogicalOr:
      return ConstantValue::ofBool(a || b);
    case BinaryOp::BitXor:
    case BinaryOp::Ne:
      return ConstantValue::ofBool(a != b);
    case BinaryOp::Eq:
      return ConstantValue::ofBool(a == b);
    default:
      return std::nullopt;
    }
  }

  if (lhs->type == Type::F32) {
    double a = lhs->floatValue, b = rhs->floatValue;
    switch (op) {
    case BinaryOp::Add:
      return ConstantValue::ofFloat(a + b);
    case BinaryOp::Sub:
      return ConstantValue::ofFloat(a - b);
    case BinaryOp::Mul:
      return ConstantValue::ofFloat(a * b);
    case BinaryOp::TrueDiv:
      if (b == 0.0)
        return fail(*expr.getRHS(), "division by zero in constant expression");
      return ConstantValue::ofFloat(a / b);
    case BinaryOp::FloorDiv:
      if (b == 0.0)
        return fail(*expr.getRHS(), "division by zero in constant expression");
      return ConstantValue::ofFloat(floorDivide(a, b));
    case BinaryOp::Mod:
      if (b == 0.0)
        return fail(*expr.getRHS(), "modulo by zero in constant expression");
      return ConstantValue::ofFloat(floorModulo(a, b));
    case BinaryOp::Pow:
      return ConstantValue::ofFloat(std::pow(a, b));
    case BinaryOp::Eq:
      return ConstantValue::ofBool(a == b);
    case BinaryOp::Ne:
      return ConstantValue::ofBool(a != b);
    case BinaryOp::Lt:
      return ConstantValue::ofBool(a < b);
    case BinaryOp::Le:
      return ConstantValue::ofBool(a <= b);
    case BinaryOp::Gt:
      return ConstantValue::ofBool(a > b);
    case BinaryOp::Ge:
      return ConstantValue::ofBool(a >= b);
    default:
      return std::nullopt;
    }
  }

  int64_t a = lhs->intValue, b = rhs->intValue, result = 0;
  auto overflow = [&]() {
    return fail(expr,
                "integer overflow in constant expression ('" + spelling + "')");
  };
  switch (op) {
  case BinaryOp::Add:
    if (llvm::AddOverflow(a, b, result))
      return overflow();
    return ConstantValue::ofInt(result);
  case BinaryOp::Sub:
    if (llvm::SubOverflow(a, b, result))
      return overflow();
    return ConstantValue::ofInt(result);
  case BinaryOp::Mul:
    if (llvm::MulOverflow(a, b, result))
      return overflow();
    return ConstantValue::ofInt(result);
  case BinaryOp::TrueDiv: // Sema casts both operands to f32; ints never get
                          // here.
    return std::nullopt;
  case BinaryOp::FloorDiv:
    if (b == 0)
      return fail(*expr.getRHS(), "division by zero in constant expression");
    if (a == std::numeric_limits<int64_t>::min() && b == -1)
      return overflow();
    return ConstantValue::ofInt(floorDivide(a, b));
  case BinaryOp::Mod:
    if (b == 0)
      return fail(*expr.getRHS(), "modulo by zero in constant expression");
    if (b == -1)
      return ConstantValue::ofInt(0);
    return ConstantValue::ofInt(floorModulo(a, b));
  case BinaryOp::Pow: {
    if (b < 0)
      return fail(*expr.getRHS(),
                  "integers cannot be raised to a negative power; use a float "
                  "base, e.g. '2.0 ** -1'");
    int64_t power = 1;
    for (int64_t i = 0; i < b; ++i) {
      if (llvm::MulOverflow(power, a, power))
        return overflow();
      if (power == 0 || power == 1)
        break;
    }
    if (power == 1 && a == -1 && (b % 2) == 1)
      power = -1;
    return ConstantValue::ofInt(power);
  }
  case BinaryOp::BitAnd:
    return ConstantValue::ofInt(a & b);
  case BinaryOp::BitOr:
    return ConstantValue::ofInt(a | b);
  case BinaryOp::BitXor:
    return ConstantValue::ofInt(a ^ b);
  case BinaryOp::Shl:
  case BinaryOp::Shr:
    if (b < 0 || b > 62)
      return fail(*expr.getRHS(), "shift count " + llvm::Twine(b) +
                                      " out of range in constant expression");
    if (op == BinaryOp::Shr)
      return ConstantValue::ofInt(a >> b);
    if (a != 0 && (a > (std::numeric_limits<int64_t>::max() >> b) ||
                   a < (std::numeric_limits<int64_t>::min() >> b)))
      return overflow();
    return ConstantValue::ofInt(
        static_cast<int64_t>(static_cast<uint64_t>(a) << b));
  case BinaryOp::Eq:
    return ConstantValue::ofBool(a == b);
  case BinaryOp::Ne:
    return ConstantValue::ofBool(a != b);
  case BinaryOp::Lt:
    return ConstantValue::ofBool(a < b);
  case BinaryOp::Le:
    return ConstantValue::ofBool(a <= b);
  case BinaryOp::Gt:
    return ConstantValue::ofBool(a > b);
  case BinaryOp::Ge:
    return ConstantValue::ofBool(a >= b);
  case BinaryOp::LogicalAnd:
  case BinaryOp::LogicalOr:
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<ConstantValue>
ConstantEvaluator::evaluateCall(const CallExpr &expr) {
  if (!expr.isBuiltin())
    return std::nullopt;
  std::vector<ConstantValue> args;
  for (unsigned i = 0; i < expr.getNumArgs(); ++i) {
    std::optional<ConstantValue> arg = evaluate(*expr.getArg(i));
    if (!arg)
      return std::nullopt;
    args.push_back(*arg);
  }
  auto unaryFloat = [&](double (*fn)(double)) -> std::optional<ConstantValue> {
    return ConstantValue::ofFloat(fn(asDouble(args[0])));
  };
  bool isFloat = !args.empty() && args.back().type == Type::F32;
  auto less = [](const ConstantValue &a, const ConstantValue &b) {
    return a.type == Type::F32 ? a.floatValue < b.floatValue
                               : a.intValue < b.intValue;
  };
  switch (expr.getBuiltin()) {
  case Builtin::Abs:
    if (isFloat)
      return ConstantValue::ofFloat(std::fabs(args[0].floatValue));
    if (args[0].intValue == std::numeric_limits<int64_t>::min())
      return fail(expr, "integer overflow in constant expression ('abs')");
    return ConstantValue::ofInt(std::llabs(args[0].intValue));
  case Builtin::Min:
    return less(args[1], args[0]) ? args[1] : args[0];
  case Builtin::Max:
    return less(args[0], args[1]) ? args[1] : args[0];
  case Builtin::Clamp: {
    ConstantValue value = less(args[0], args[1]) ? args[1] : args[0];
    return less(args[2], value) ? args[2] : value;
  }
  case Builtin::Exp:
    return unaryFloat([](double x) { return std::exp(x); });
  case Builtin::Exp2:
    return unaryFloat([](double x) { return std::exp2(x); });
  case Builtin::Log:
    return unaryFloat([](double x) { return std::log(x); });
  case Builtin::Log2:
    return unaryFloat([](double x) { return std::log2(x); });
  case Builtin::Sqrt:
    return unaryFloat([](double x) { return std::sqrt(x); });
  case Builtin::Rsqrt:
    return unaryFloat([](double x) { return 1.0 / std::sqrt(x); });
  case Builtin::Tanh:
  case Builtin::TanhApprox:
    return unaryFloat([](double x) { return std::tanh(x); });
  case Builtin::Sigmoid:
    return unaryFloat([](double x) { return 1.0 / (1.0 + std::exp(-x)); });
  case Builtin::Sin:
    return unaryFloat([](double x) { return std::sin(x); });
  case Builtin::Cos:
    return unaryFloat([](double x) { return std::cos(x); });
  case Builtin::Tan:
    return unaryFloat([](double x) { return std::tan(x); });
  case Builtin::Floor:
    return isFloat ? ConstantValue::ofFloat(std::floor(args[0].floatValue))
                   : args[0];
  case Builtin::Ceil:
    return isFloat ? ConstantValue::ofFloat(std::ceil(args[0].floatValue))
                   : args[0];
  case Builtin::Round:
    // Half to even, as torch.round.
    return isFloat ? ConstantValue::ofFloat(std::nearbyint(args[0].floatValue))
                   : args[0];
  case Builtin::Where:
    return args[0].boolValue ? args[1] : args[2];
  case Builtin::Float:
  case Builtin::Int:
    return std::nullopt; // Sema replaced these by casts.
  }
  return std::nullopt;
}
