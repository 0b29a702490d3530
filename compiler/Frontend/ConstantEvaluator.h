//===- ConstantEvaluator.h - Folding of constant expressions ---*- C++ -*-===//
//
// Evaluates expressions made of literals, `const` references, operators and
// builtins, with the language's (PyTorch's) semantics: ints in 64 bits with
// overflow checks, floats in double. Sema uses it for `const` items (with
// errors reported) and to spot constant zero divisors in mods (silently).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_FRONTEND_CONSTANTEVALUATOR_H
#define PAGEDC_FRONTEND_CONSTANTEVALUATOR_H

#include "AST.h"
#include "Diagnostics.h"

#include <optional>

namespace pagedc {

/// Floor division on ints: rounds toward negative infinity (-7 // 2 == -4).
/// `b` must not be 0, and INT64_MIN // -1 is the caller's to avoid.
int64_t floorDivide(int64_t a, int64_t b);
/// Remainder with the sign of the divisor (-7 % 2 == 1, 7 % -2 == -1).
int64_t floorModulo(int64_t a, int64_t b);
/// floor(a / b) on floats, as Python computes it (-7.5 // 2.0 == -4.0).
double floorDivide(double a, double b);
/// Float remainder with the sign of the divisor (-7.5 % 2.0 == 0.5).
double floorModulo(double a, double b);

/// Evaluates typed expressions (run Sema's type checking first: operands
/// must already have their casts).
class ConstantEvaluator {
public:
  /// With `diags`, problems (division by zero, overflow, ...) are reported;
  /// without, evaluation just fails.
  explicit ConstantEvaluator(DiagnosticEngine *diags) : diags(diags) {}

  /// The value of `expr`, or nothing when it is not constant or fails.
  /// Int results use ConstantValue::intValue (any int64), floats floatValue.
  std::optional<ast::ConstantValue> evaluate(const ast::Expr &expr);

private:
  std::optional<ast::ConstantValue> fail(const ast::Expr &expr,
                                         const llvm::Twine &message);
  std::optional<ast::ConstantValue> evaluateBinary(const ast::BinaryExpr &expr);
  std::optional<ast::ConstantValue> evaluateCall(const ast::CallExpr &expr);

  DiagnosticEngine *diags;
};

} // namespace pagedc

#endif // PAGEDC_FRONTEND_CONSTANTEVALUATOR_H
