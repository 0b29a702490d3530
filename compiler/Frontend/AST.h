//===- AST.h - Abstract syntax tree of the .attn language ------*- C++ -*-===//
//
// The parser builds this tree; Sema checks it and annotates it in place.
//
// What Sema guarantees once `analyze()` returned true (MLIRGen relies on it):
//
//  * Names are resolved. Every NameExpr says what it refers to (a mod
//    argument by position, a `let` binding, a `const`, or a `param`); every
//    CallExpr is either a builtin (`CallExpr::getBuiltin()`) or a call of a
//    mod (`CallExpr::getCallee()`), never both; every IndexExpr points at its
//    BufferDecl. There is no recursion among mods, a mask mod calls only mask
//    mods and a score mod calls only score mods.
//  * Every Expr has a type (Type::I32, I64, F32 or Bool), never Unknown.
//  * Implicit conversions are explicit CastExpr nodes. After Sema:
//      - both operands of a BinaryExpr have the same type; arithmetic and
//        bitwise results have that type too, comparisons give Bool;
//      - TrueDiv operands are F32 (int / int is cast to F32 first);
//      - `&`, `|`, `^` (BitAnd/BitOr/BitXor) on Bool operands are the logical
//        operations; LogicalAnd/LogicalOr only ever see Bool;
//      - `~x` on a Bool was rewritten to UnaryOp::LogicalNot, so BitNot only
//        sees ints; Neg sees I32, I64 or F32;
//      - the builtins `float(x)` and `int(x)` were replaced by CastExpr;
//      - every argument of a builtin call already has the type the builtin
//        computes in (see Builtin below), `where`'s condition is Bool;
//      - arguments of a mod call are cast to the callee's parameter types
//        (mask: i32 x4; score: f32, i32 x4);
//      - buffer indices are I32 or I64 (each one as it is, not unified);
//      - the result expression of a mask is Bool, of a score F32.
//  * `const` references stay NameExprs of kind Const; the ConstDecl carries
//    the folded value (`ConstDecl::getValue()`, with -D overrides applied)
//    and the reference's type is I32 (int constant) or F32 (float constant).
//    Integer constants and integer literals in mods fit in i32.
//  * A literal's type is I32 (IntegerLiteral), F32 (FloatLiteral) or Bool.
//
// Semantics of every operation are documented in docs/language.md.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_FRONTEND_AST_H
#define PAGEDC_FRONTEND_AST_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Casting.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pagedc {
namespace ast {

//===----------------------------------------------------------------------===//
// Locations and types
//===----------------------------------------------------------------------===//

/// A position in the source: 1-based line and column, 0-based byte offset.
struct SourceLoc {
  uint32_t line = 0;
  uint32_t column = 0;
  uint32_t offset = 0;
};

/// A half-open range of source text [begin, end).
struct SourceRange {
  SourceLoc begin;
  SourceLoc end;
};

/// The type of a value in a mod body.
enum class Type : uint8_t { Unknown, Bool, I32, I64, F32 };

/// The element type of a captured buffer.
enum class ElementType : uint8_t { I32, I64, F32, F16, BF16, Bool };

/// "bool", "i32", "i64", "f32" ("<unknown>" for Unknown).
llvm::StringRef typeName(Type type);
/// "i32", "i64", "f32", "f16", "bf16", "bool".
llvm::StringRef elementTypeName(ElementType type);
/// The type a read of a buffer with this element type produces: f16/bf16/f32
/// read as F32, i32 as I32, i64 as I64, bool as Bool.
Type readType(ElementType type);
/// True for I32 and I64.
inline bool isInteger(Type type) {
  return type == Type::I32 || type == Type::I64;
}
/// True for I32, I64 and F32.
inline bool isNumeric(Type type) {
  return isInteger(type) || type == Type::F32;
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

class Expr;
using ExprPtr = std::unique_ptr<Expr>;
class ConstDecl;
class ParamDecl;
class BufferDecl;
class ModDecl;
struct LetStmt;

/// Base of every expression node. Use llvm::isa / dyn_cast / cast on it.
class Expr {
public:
  enum class Kind : uint8_t {
    IntegerLiteral,
    FloatLiteral,
    BoolLiteral,
    Name,
    Unary,
    Binary,
    Call,
    Index,
    Cast,
  };

  virtual ~Expr() = default;
  Kind getKind() const { return kind; }
  /// The source text this expression covers.
  SourceRange getRange() const { return range; }
  SourceLoc getLoc() const { return range.begin; }
  /// The type Sema gave this expression (Unknown before Sema).
  Type getType() const { return type; }
  void setType(Type newType) { type = newType; }
  /// The height of the tree under this node as the parser built it (a leaf
  /// is 1). The parser keeps it at most kMaxExpressionDepth.
  unsigned getDepth() const { return depth; }
  void setDepth(unsigned newDepth) { depth = newDepth; }

protected:
  Expr(Kind kind, SourceRange range) : kind(kind), range(range) {}

private:
  Kind kind;
  Type type = Type::Unknown;
  unsigned depth = 1;
  SourceRange range;
};

/// The deepest expression tree (and the deepest nesting of parentheses,
/// prefix operators, calls and subscripts) the parser accepts. Every later
/// stage walks expressions recursively; a chain of binary operators is a
/// left-deep tree, so `a + a + ... + a` with more operators than this is
/// rejected too (bind parts with `let`). Chosen so that every recursive
/// stage stays far from the stack limit, sanitizers included.
constexpr unsigned kMaxExpressionDepth = 256;

/// An integer literal: `42`. Held as int64; Sema requires it to fit in i32
/// inside a mod body.
class IntegerLiteralExpr : public Expr {
public:
  IntegerLiteralExpr(SourceRange range, int64_t value)
      : Expr(Kind::IntegerLiteral, range), value(value) {}
  int64_t getValue() const { return value; }
  static bool classof(const Expr *e) {
    return e->getKind() == Kind::IntegerLiteral;
  }

private:
  int64_t value;
};

/// A float literal: `1.5`, `1e-3`, `inf`. Typed F32; the value is kept in
/// double precision (rounded to f32 where it is used).
class FloatLiteralExpr : public Expr {
public:
  FloatLiteralExpr(SourceRange range, double value)
      : Expr(Kind::FloatLiteral, range), value(value) {}
  double getValue() const { return value; }
  static bool classof(const Expr *e) {
    return e->getKind() == Kind::FloatLiteral;
  }

private:
  double value;
};

/// `true` or `false`.
class BoolLiteralExpr : public Expr {
public:
  BoolLiteralExpr(SourceRange range, bool value)
      : Expr(Kind::BoolLiteral, range), value(value) {}
  bool getValue() const { return value; }
  static bool classof(const Expr *e) {
    return e->getKind() == Kind::BoolLiteral;
  }

private:
  bool value;
};

/// A use of a name as a value. Sema says what it refers to.
class NameExpr : public Expr {
public:
  enum class RefKind : uint8_t {
    Unresolved,
    ModArgument, ///< the getArgumentIndex()'th parameter of the enclosing mod
    Let,         ///< a `let` binding of the enclosing mod: getLet()
    Const,       ///< a `const` item: getConst()
    Param,       ///< a `param` item: getParam()
  };

  NameExpr(SourceRange range, std::string name)
      : Expr(Kind::Name, range), name(std::move(name)) {}
  llvm::StringRef getName() const { return name; }
  RefKind getRefKind() const { return refKind; }
  unsigned getArgumentIndex() const { return argumentIndex; }
  const LetStmt *getLet() const { return let; }
  const ConstDecl *getConst() const { return constDecl; }
  const ParamDecl *getParam() const { return paramDecl; }

  void resolveToArgument(unsigned index) {
    refKind = RefKind::ModArgument;
    argumentIndex = index;
  }
  void resolveToLet(const LetStmt *binding) {
    refKind = RefKind::Let;
    let = binding;
  }
  void resolveToConst(const ConstDecl *decl) {
    refKind = RefKind::Const;
    constDecl = decl;
  }
  void resolveToParam(const ParamDecl *decl) {
    refKind = RefKind::Param;
    paramDecl = decl;
  }

  static bool classof(const Expr *e) { return e->getKind() == Kind::Name; }

private:
  std::string name;
  RefKind refKind = RefKind::Unresolved;
  unsigned argumentIndex = 0;
  const LetStmt *let = nullptr;
  const ConstDecl *constDecl = nullptr;
  const ParamDecl *paramDecl = nullptr;
};

/// Prefix operators.
enum class UnaryOp : uint8_t {
  Neg,        ///< `-x`
  BitNot,     ///< `~x` on ints (Sema turns `~` on bool into LogicalNot)
  LogicalNot, ///< `not x`, and `~x` on bool
};

/// "-", "~", "not".
llvm::StringRef unaryOpSpelling(UnaryOp op);

class UnaryExpr : public Expr {
public:
  UnaryExpr(SourceRange range, UnaryOp op, SourceRange opRange, ExprPtr operand)
      : Expr(Kind::Unary, range), op(op), opRange(opRange),
        operand(std::move(operand)) {}
  UnaryOp getOp() const { return op; }
  void setOp(UnaryOp newOp) { op = newOp; }
  SourceRange getOpRange() const { return opRange; }
  const Expr *getOperand() const { return operand.get(); }
  /// The owning slot of the operand (Sema wraps it in casts).
  ExprPtr &operandSlot() { return operand; }
  static bool classof(const Expr *e) { return e->getKind() == Kind::Unary; }

private:
  UnaryOp op;
  SourceRange opRange;
  ExprPtr operand;
};

/// Infix operators.
enum class BinaryOp : uint8_t {
  Add,
  Sub,
  Mul,
  TrueDiv,  ///< `/`: always f32 (PyTorch true division)
  FloorDiv, ///< `//`: rounds toward negative infinity
  Mod,      ///< `%`: result has the sign of the divisor
  Pow,      ///< `**`
  BitAnd,
  BitOr,
  BitXor, ///< `& | ^`: bitwise on ints, logical on bool
  Shl,
  Shr, ///< `<< >>` (ints; `>>` is arithmetic)
  LogicalAnd,
  LogicalOr, ///< `and`, `or`
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
};

/// The operator as written: "+", "//", "and", "<=", ...
llvm::StringRef binaryOpSpelling(BinaryOp op);
/// True for == != < <= > >=.
bool isComparison(BinaryOp op);

class BinaryExpr : public Expr {
public:
  BinaryExpr(SourceRange range, BinaryOp op, SourceRange opRange, ExprPtr lhs,
             ExprPtr rhs)
      : Expr(Kind::Binary, range), op(op), opRange(opRange),
        lhs(std::move(lhs)), rhs(std::move(rhs)) {}
  BinaryOp getOp() const { return op; }
  SourceRange getOpRange() const { return opRange; }
  const Expr *getLHS() const { return lhs.get(); }
  const Expr *getRHS() const { return rhs.get(); }
  ExprPtr &lhsSlot() { return lhs; }
  ExprPtr &rhsSlot() { return rhs; }
  static bool classof(const Expr *e) { return e->getKind() == Kind::Binary; }

private:
  BinaryOp op;
  SourceRange opRange;
  ExprPtr lhs, rhs;
};

/// The builtin functions. The types in brackets are the argument types after
/// Sema's casts and the result type.
enum class Builtin : uint8_t {
  Abs,   ///< abs(x)           [T] -> T, T numeric
  Min,   ///< min(a, b)        [T, T] -> T, T numeric (common type)
  Max,   ///< max(a, b)        [T, T] -> T
  Clamp, ///< clamp(x, lo, hi) [T, T, T] -> T  == min(max(x, lo), hi)
  Exp,
  Exp2,
  Log,
  Log2,
  Sqrt,
  Rsqrt,
  Tanh,
  Sigmoid,
  Sin,
  Cos,
  Tan,
  TanhApprox, ///< tanh_approx(x): fast tanh on the GPU, tanh elsewhere
              ///< (all of the above: [F32] -> F32; int arguments are cast)
  Floor,
  Ceil,
  Round, ///< [T] -> T; the identity on ints; round is half-to-even
  Where, ///< where(c, a, b)   [Bool, T, T] -> T, T any type (common type)
  Float, ///< float(x): replaced by a CastExpr to F32 in Sema
  Int,   ///< int(x): replaced by a CastExpr to I32 in Sema
};

/// The name a builtin is called by ("abs", "tanh_approx", ...).
llvm::StringRef builtinName(Builtin builtin);
/// Looks a builtin up by name; false if there is none.
bool lookupBuiltin(llvm::StringRef name, Builtin &result);
/// The names of all builtins, in declaration order.
std::vector<llvm::StringRef> builtinNames();

/// `name(args...)`: a builtin or a call of another mod (inlined later).
class CallExpr : public Expr {
public:
  CallExpr(SourceRange range, std::string callee, SourceRange calleeRange,
           std::vector<ExprPtr> args)
      : Expr(Kind::Call, range), calleeName(std::move(callee)),
        calleeRange(calleeRange), args(std::move(args)) {}
  llvm::StringRef getCalleeName() const { return calleeName; }
  SourceRange getCalleeRange() const { return calleeRange; }
  unsigned getNumArgs() const { return args.size(); }
  const Expr *getArg(unsigned i) const { return args[i].get(); }
  ExprPtr &argSlot(unsigned i) { return args[i]; }

  /// True when this calls a builtin; getBuiltin() says which.
  bool isBuiltin() const { return builtinCall; }
  /// The builtin called (meaningful only when isBuiltin()).
  Builtin getBuiltin() const { return builtin; }
  /// The mod called (nullptr for builtins or before Sema).
  const ModDecl *getCallee() const { return callee; }
  void resolveToBuiltin(Builtin b) {
    builtinCall = true;
    builtin = b;
  }
  void resolveToMod(const ModDecl *mod) { callee = mod; }

  static bool classof(const Expr *e) { return e->getKind() == Kind::Call; }

private:
  std::string calleeName;
  SourceRange calleeRange;
  std::vector<ExprPtr> args;
  bool builtinCall = false;
  Builtin builtin = Builtin::Abs;
  const ModDecl *callee = nullptr;
};

/// `buffer[i, j, ...]`: reads one element of a captured buffer.
class IndexExpr : public Expr {
public:
  IndexExpr(SourceRange range, std::string bufferName, SourceRange nameRange,
            std::vector<ExprPtr> indices)
      : Expr(Kind::Index, range), bufferName(std::move(bufferName)),
        nameRange(nameRange), indices(std::move(indices)) {}
  llvm::StringRef getBufferName() const { return bufferName; }
  SourceRange getNameRange() const { return nameRange; }
  unsigned getNumIndices() const { return indices.size(); }
  const Expr *getIndex(unsigned i) const { return indices[i].get(); }
  ExprPtr &indexSlot(unsigned i) { return indices[i]; }
  /// The buffer read (nullptr before Sema).
  const BufferDecl *getBuffer() const { return buffer; }
  void resolve(const BufferDecl *decl) { buffer = decl; }
  static bool classof(const Expr *e) { return e->getKind() == Kind::Index; }

private:
  std::string bufferName;
  SourceRange nameRange;
  std::vector<ExprPtr> indices;
  const BufferDecl *buffer = nullptr;
};

/// A conversion, made explicit by Sema (implicit promotion, `float(x)`,
/// `int(x)`). The target is getType(); the source is getOperand()->getType().
///   int -> f32: signed conversion;  f32 -> int: truncation toward zero;
///   bool -> int/f32: 0 or 1;  i32 -> i64: sign extension;  i64 -> i32:
///   truncation (wraps);  -> bool is never produced.
class CastExpr : public Expr {
public:
  CastExpr(SourceRange range, ExprPtr operand, Type to, bool isImplicit)
      : Expr(Kind::Cast, range), operand(std::move(operand)),
        implicit(isImplicit) {
    setType(to);
  }
  const Expr *getOperand() const { return operand.get(); }
  ExprPtr &operandSlot() { return operand; }
  /// True when Sema inserted it for a promotion, false for float()/int().
  bool isImplicit() const { return implicit; }
  static bool classof(const Expr *e) { return e->getKind() == Kind::Cast; }

private:
  ExprPtr operand;
  bool implicit;
};

//===----------------------------------------------------------------------===//
// Items
//===----------------------------------------------------------------------===//

/// A compile-time value: the folded value of a `const`, or a param default.
struct ConstantValue {
  Type type =
      Type::Unknown; ///< I32, F32 or Bool (bool only for param defaults)
  int64_t intValue = 0;
  double floatValue = 0.0;
  bool boolValue = false;

  static ConstantValue ofInt(int64_t v) {
    ConstantValue c;
    c.type = Type::I32;
    c.intValue = v;
    return c;
  }
  static ConstantValue ofFloat(double v) {
    ConstantValue c;
    c.type = Type::F32;
    c.floatValue = v;
    return c;
  }
  static ConstantValue ofBool(bool v) {
    ConstantValue c;
    c.type = Type::Bool;
    c.boolValue = v;
    return c;
  }
};

/// `const NAME = expr`
class ConstDecl {
public:
  ConstDecl(SourceRange range, std::string name, SourceRange nameRange,
            ExprPtr init)
      : range(range), nameRange(nameRange), name(std::move(name)),
        init(std::move(init)) {}
  llvm::StringRef getName() const { return name; }
  SourceRange getRange() const { return range; }
  SourceRange getNameRange() const { return nameRange; }
  /// The initializer as written (not evaluated when overridden by -D).
  const Expr *getInit() const { return init.get(); }
  ExprPtr &initSlot() { return init; }
  /// The folded value (valid after Sema; I32 or F32).
  const ConstantValue &getValue() const { return value; }
  void setValue(ConstantValue v) { value = v; }
  /// True when a -D override replaced the initializer.
  bool isOverridden() const { return overridden; }
  void setOverridden(bool v) { overridden = v; }

private:
  SourceRange range, nameRange;
  std::string name;
  ExprPtr init;
  ConstantValue value;
  bool overridden = false;
};

/// `param NAME: TYPE (= literal)?` -- a runtime scalar bound at launch.
class ParamDecl {
public:
  ParamDecl(SourceRange range, std::string name, SourceRange nameRange,
            Type type, bool hasDefault, ConstantValue defaultValue)
      : range(range), nameRange(nameRange), name(std::move(name)), type(type),
        hasDefault(hasDefault), defaultValue(defaultValue) {}
  llvm::StringRef getName() const { return name; }
  SourceRange getRange() const { return range; }
  SourceRange getNameRange() const { return nameRange; }
  /// I32, F32 or Bool.
  Type getType() const { return type; }
  bool hasDefaultValue() const { return hasDefault; }
  /// The default, converted to getType() by Sema (an int literal default of
  /// an f32 param becomes a float).
  const ConstantValue &getDefaultValue() const { return defaultValue; }
  void setDefaultValue(ConstantValue v) { defaultValue = v; }
  /// Position among the params of the program (the ABI slot).
  unsigned getIndex() const { return index; }
  void setIndex(unsigned i) { index = i; }

private:
  SourceRange range, nameRange;
  std::string name;
  Type type;
  bool hasDefault;
  ConstantValue defaultValue;
  unsigned index = 0;
};

/// One dimension of a buffer declaration: `128`, `S` or `?`.
struct BufferDim {
  enum class Kind : uint8_t { Fixed, Named, Any };
  Kind kind = Kind::Any;
  int64_t size = 0; ///< Fixed
  std::string name; ///< Named
  SourceRange range;
};

/// `buffer NAME: ELEM[d0, ...]` -- a captured tensor of rank 1-4.
class BufferDecl {
public:
  BufferDecl(SourceRange range, std::string name, SourceRange nameRange,
             ElementType elementType, std::vector<BufferDim> dims)
      : range(range), nameRange(nameRange), name(std::move(name)),
        elementType(elementType), dims(std::move(dims)) {}
  llvm::StringRef getName() const { return name; }
  SourceRange getRange() const { return range; }
  SourceRange getNameRange() const { return nameRange; }
  ElementType getElementType() const { return elementType; }
  const std::vector<BufferDim> &getDims() const { return dims; }
  unsigned getRank() const { return dims.size(); }
  /// Position among the buffers of the program (the ABI slot).
  unsigned getIndex() const { return index; }
  void setIndex(unsigned i) { index = i; }

private:
  SourceRange range, nameRange;
  std::string name;
  ElementType elementType;
  std::vector<BufferDim> dims;
  unsigned index = 0;
};

/// `let NAME = expr` inside a mod's block.
struct LetStmt {
  std::string name;
  SourceRange nameRange;
  ExprPtr init;
};

/// A formal parameter of a mod.
struct ModParam {
  std::string name;
  SourceRange range;
};

/// `mask NAME(b, h, q, kv) = expr` or `score NAME(s, b, h, q, kv) { ... }`.
/// Parameters: mask (b, h, q, kv) all I32; score (score F32, b, h, q, kv I32).
class ModDecl {
public:
  enum class ModKind : uint8_t { Mask, Score };

  ModDecl(SourceRange range, ModKind kind, std::string name,
          SourceRange nameRange, std::vector<ModParam> params,
          std::vector<std::unique_ptr<LetStmt>> lets, ExprPtr result)
      : range(range), nameRange(nameRange), kind(kind), name(std::move(name)),
        params(std::move(params)), lets(std::move(lets)),
        result(std::move(result)) {}
  llvm::StringRef getName() const { return name; }
  SourceRange getRange() const { return range; }
  SourceRange getNameRange() const { return nameRange; }
  ModKind getModKind() const { return kind; }
  bool isMask() const { return kind == ModKind::Mask; }
  bool isScore() const { return kind == ModKind::Score; }
  const std::vector<ModParam> &getParams() const { return params; }
  /// The type of the i'th parameter.
  Type getParamType(unsigned i) const {
    return (isScore() && i == 0) ? Type::F32 : Type::I32;
  }
  /// The number of parameters a mod of this kind has (4 or 5).
  unsigned getExpectedArity() const { return isMask() ? 4 : 5; }
  /// `let` bindings in source order (empty for the `= expr` form).
  const std::vector<std::unique_ptr<LetStmt>> &getLets() const { return lets; }
  /// The result expression: Bool for a mask, F32 for a score.
  const Expr *getResult() const { return result.get(); }
  ExprPtr &resultSlot() { return result; }
  /// The type the result must have.
  Type getResultType() const { return isMask() ? Type::Bool : Type::F32; }

private:
  SourceRange range, nameRange;
  ModKind kind;
  std::string name;
  std::vector<ModParam> params;
  std::vector<std::unique_ptr<LetStmt>> lets;
  ExprPtr result;
};

/// One .attn file. Items of each kind are kept in source order (the ABI
/// order of params and buffers).
class Program {
public:
  std::string fileName;
  std::vector<std::unique_ptr<ConstDecl>> consts;
  std::vector<std::unique_ptr<ParamDecl>> params;
  std::vector<std::unique_ptr<BufferDecl>> buffers;
  std::vector<std::unique_ptr<ModDecl>> mods;
  /// Names of items the parser dropped because of syntax errors. Sema does
  /// not report uses of these names, so one typo gives one error.
  std::vector<std::string> droppedItemNames;

  /// Lookups by name; nullptr when absent.
  const ModDecl *findMod(llvm::StringRef name) const;
  const ConstDecl *findConst(llvm::StringRef name) const;
  const ParamDecl *findParam(llvm::StringRef name) const;
  const BufferDecl *findBuffer(llvm::StringRef name) const;
};

} // namespace ast
} // namespace pagedc

#endif // PAGEDC_FRONTEND_AST_H
