//===- Sema.cpp - Names, types and checks of a .attn program --------------===//
//
// Resolves names, gives every expression a type, makes promotions explicit
// (CastExpr), folds `const` items (with -D overrides), and reports every
// independent error: an expression whose operand already failed gets type
// Unknown and no second message.
//
//===----------------------------------------------------------------------===//

#include "ConstantEvaluator.h"
#include "Frontend.h"
#include "pagedc/ConstOverride.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

using namespace pagedc;
using namespace pagedc::ast;

namespace {

/// The usual promotion: f32 beats ints, i64 beats i32.
Type commonNumericType(Type a, Type b) {
  if (a == Type::F32 || b == Type::F32)
    return Type::F32;
  if (a == Type::I64 || b == Type::I64)
    return Type::I64;
  return Type::I32;
}

/// Wraps the expression in `slot` in an implicit cast to `to` when needed.
void coerce(ExprPtr &slot, Type to) {
  Type from = slot->getType();
  if (from == to || from == Type::Unknown || to == Type::Unknown)
    return;
  SourceRange range = slot->getRange();
  slot = std::make_unique<CastExpr>(range, std::move(slot), to,
                                    /*isImplicit=*/true);
}

/// A global item as Sema sees it while checking names.
struct GlobalItem {
  enum class Kind { Const, Param, Buffer, Mod } kind;
  llvm::StringRef name;
  SourceRange nameRange;
  const void *decl;
};

/// The names visible while checking one expression.
struct Scope {
  /// The mod being checked; null inside a `const` initializer.
  ModDecl *mod = nullptr;
  /// The `const` being checked (only earlier constants are visible).
  const ConstDecl *currentConst = nullptr;
  /// `let` bindings defined so far, in order (for suggestions).
  std::vector<const LetStmt *> lets;
  /// The same bindings by name: name lookups stay O(1) in long blocks.
  llvm::StringMap<const LetStmt *> letByName;
};

class Sema {
public:
  Sema(Program &program, DiagnosticEngine &diags,
       const FrontendOptions &options)
      : program(program), diags(diags), options(options) {}

  bool run();

private:
  void collectGlobals();
  void checkParams();
  void checkConsts();
  void checkMod(ModDecl &mod);
  void checkRecursion();

  Type check(ExprPtr &slot, Scope &scope);
  Type checkName(NameExpr &expr, Scope &scope);
  Type checkUnary(UnaryExpr &expr, Scope &scope);
  Type checkBinary(BinaryExpr &expr, Scope &scope);
  Type checkCall(ExprPtr &slot, CallExpr &expr, Scope &scope);
  Type checkBuiltin(ExprPtr &slot, CallExpr &expr, Scope &scope);
  Type checkIndex(IndexExpr &expr, Scope &scope);

  /// True when `name` is a parameter or `let` of the mod being checked.
  static bool isLocalName(const Scope &scope, llvm::StringRef name) {
    if (!scope.mod)
      return false;
    if (scope.letByName.count(name))
      return true;
    for (const ModParam &param : scope.mod->getParams())
      if (param.name == name)
        return true;
    return false;
  }
  const GlobalItem *findGlobal(llvm::StringRef name) const {
    auto it = globals.find(name);
    return it == globals.end() ? nullptr : &it->second;
  }
  bool isDropped(llvm::StringRef name) const {
    return droppedNames.contains(name);
  }
  std::string suggest(llvm::StringRef name, const Scope &scope,
                      bool functions) const;
  void reportUnknown(SourceRange range, llvm::StringRef name,
                     const Scope &scope, bool functions);
  static llvm::StringRef kindName(GlobalItem::Kind kind) {
    switch (kind) {
    case GlobalItem::Kind::Const:
      return "constant";
    case GlobalItem::Kind::Param:
      return "param";
    case GlobalItem::Kind::Buffer:
      return "buffer";
    case GlobalItem::Kind::Mod:
      return "mod";
    }
    return "item";
  }

  Program &program;
  DiagnosticEngine &diags;
  const FrontendOptions &options;
  llvm::StringMap<GlobalItem> globals;
  llvm::StringSet<> droppedNames;
  /// Constants whose value could not be computed: uses stay silent.
  llvm::DenseMap<const ConstDecl *, bool> brokenConsts;
  /// Calls of mods, per caller, for the recursion check.
  struct CallEdge {
    const ModDecl *callee;
    SourceRange range;
  };
  llvm::DenseMap<const ModDecl *, std::vector<CallEdge>> callGraph;
};

bool Sema::run() {
  for (const std::string &name : program.droppedItemNames)
    droppedNames.insert(name);
  collectGlobals();
  checkParams();
  checkConsts();
  for (std::unique_ptr<ModDecl> &mod : program.mods) {
    if (diags.shouldStop())
      break;
    checkMod(*mod);
  }
  if (!diags.shouldStop())
    checkRecursion();
  return !diags.hasErrors();
}

//===----------------------------------------------------------------------===//
// Items
//===----------------------------------------------------------------------===//

void Sema::collectGlobals() {
  std::vector<GlobalItem> items;
  for (auto &c : program.consts)
    items.push_back(
        {GlobalItem::Kind::Const, c->getName(), c->getNameRange(), c.get()});
  for (auto &p : program.params)
    items.push_back(
        {GlobalItem::Kind::Param, p->getName(), p->getNameRange(), p.get()});
  for (auto &b : program.buffers)
    items.push_back(
        {GlobalItem::Kind::Buffer, b->getName(), b->getNameRange(), b.get()});
  for (auto &m : program.mods)
    items.push_back(
        {GlobalItem::Kind::Mod, m->getName(), m->getNameRange(), m.get()});
  std::stable_sort(items.begin(), items.end(),
                   [](const GlobalItem &a, const GlobalItem &b) {
                     return a.nameRange.begin.offset < b.nameRange.begin.offset;
                   });

  for (const GlobalItem &item : items) {
    Builtin builtin;
    if (lookupBuiltin(item.name, builtin)) {
      diags.error(item.nameRange, "'" + item.name +
                                      "' is the name of a builtin function; "
                                      "choose another name");
      droppedNames.insert(item.name);
      continue;
    }
    auto [it, inserted] = globals.try_emplace(item.name, item);
    if (!inserted) {
      diags.error(item.nameRange, "redefinition of '" + item.name + "'");
      diags.note(it->second.nameRange, "previous definition is here");
    }
  }

  unsigned index = 0;
  for (auto &p : program.params)
    p->setIndex(index++);
  index = 0;
  for (auto &b : program.buffers)
    b->setIndex(index++);
}

void Sema::checkParams() {
  for (auto &param : program.params) {
    if (!param->hasDefaultValue())
      continue;
    ConstantValue value = param->getDefaultValue();
    Type want = param->getType();
    if (want == Type::F32 && value.type == Type::I32) {
      param->setDefaultValue(
          ConstantValue::ofFloat(static_cast<double>(value.intValue)));
      continue;
    }
    if (want == Type::I32 && value.type == Type::I32) {
      if (value.intValue > std::numeric_limits<int32_t>::max() ||
          value.intValue < std::numeric_limits<int32_t>::min())
        diags.error(param->getRange(), "default value of param '" +
                                           param->getName() +
                                           "' does not fit in i32");
      continue;
    }
    if (want == value.type)
      continue;
    diags.error(param->getRange(),
                "default value of param '" + param->getName() + "' must be " +
                    typeName(want) + ", got " + typeName(value.type));
  }
}

void Sema::checkConsts() {
  // -D overrides: each must name a constant and carry a number.
  llvm::StringMap<ConstantValue> overrides;
  for (const ConstOverride &override : options.constOverrides) {
    ConstantValue value;
    if (!program.findConst(override.name)) {
      diags.error("-D " + override.name + "=" + override.value +
                  ": there is no constant named '" + override.name + "'");
      continue;
    }
    std::string reason;
    if (!parseOverrideValue(override.value, value, &reason)) {
      diags.error("-D " + override.name + "=" + override.value +
                  ": the value '" + override.value + "' " + reason);
      continue;
    }
    if (value.type == Type::I32 &&
        (value.intValue > std::numeric_limits<int32_t>::max() ||
         value.intValue < std::numeric_limits<int32_t>::min())) {
      diags.error("-D " + override.name + "=" + override.value +
                  ": the value does not fit in i32");
      continue;
    }
    overrides[override.name] = value; // the last -D of a name wins
  }

  for (auto &decl : program.consts) {
    if (diags.shouldStop())
      return;
    auto found = overrides.find(decl->getName());
    if (found != overrides.end()) {
      decl->setValue(found->second);
      decl->setOverridden(true);
      continue;
    }
    Scope scope;
    scope.currentConst = decl.get();
    Type type = check(decl->initSlot(), scope);
    std::optional<ConstantValue> value;
    if (type == Type::Bool) {
      diags.error(decl->getInit()->getRange(),
                  "constant '" + decl->getName() +
                      "' must be an int or a float, got bool");
    } else if (type != Type::Unknown) {
      ConstantEvaluator evaluator(&diags);
      value = evaluator.evaluate(*decl->getInit());
      if (value && value->type == Type::I32 &&
          (value->intValue > std::numeric_limits<int32_t>::max() ||
           value->intValue < std::numeric_limits<int32_t>::min())) {
        diags.error(decl->getInit()->getRange(),
                    "constant '" + decl->getName() + "' = " +
                        llvm::Twine(value->intValue) + " does not fit in i32");
        value.reset();
      }
      // A finite value folded from finite operands (1e38 * 10) that f32
      // cannot hold; an infinite one came from inf and is meant.
      if (value && value->type == Type::F32 &&
          std::isfinite(value->floatValue) &&
          outsideF32Range(value->floatValue)) {
        char text[32];
        std::snprintf(text, sizeof(text), "%.9g", value->floatValue);
        diags.error(decl->getInit()->getRange(),
                    "constant '" + decl->getName() + "' = " + text +
                        " is out of the range of a float " + kF32RangeText);
        value.reset();
      }
      if (value && value->type == Type::F32 && std::isnan(value->floatValue)) {
        diags.error(decl->getInit()->getRange(),
                    "constant '" + decl->getName() + "' evaluates to NaN");
        value.reset();
      }
    }
    if (value)
      decl->setValue(*value);
    else
      brokenConsts[decl.get()] = true;
  }
}

void Sema::checkMod(ModDecl &mod) {
  llvm::StringRef kind = mod.isMask() ? "mask" : "score";
  const std::vector<ModParam> &params = mod.getParams();
  if (params.size() != mod.getExpectedArity()) {
    SourceRange range = mod.getNameRange();
    if (!params.empty())
      range = SourceRange{params.front().range.begin, params.back().range.end};
    diags.error(range,
                "a " + kind + " mod takes " +
                    llvm::Twine(mod.getExpectedArity()) + " parameters (" +
                    (mod.isMask() ? "b, h, q, kv" : "score, b, h, q, kv") +
                    "), but '" + mod.getName() + "' has " +
                    llvm::Twine(params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (params[i].name == params[j].name) {
        diags.error(params[i].range,
                    "redefinition of parameter '" + params[i].name + "'");
        diags.note(params[j].range, "previous definition is here");
        break;
      }
    }
  }

  Scope scope;
  scope.mod = &mod;
  for (const std::unique_ptr<LetStmt> &let : mod.getLets()) {
    LetStmt &binding = const_cast<LetStmt &>(*let);
    check(binding.init, scope);
    // A `let` may not rebind a parameter or an earlier `let`.
    bool clash = false;
    for (const ModParam &param : params) {
      if (param.name == binding.name) {
        diags.error(binding.nameRange,
                    "redefinition of '" + binding.name + "'");
        diags.note(param.range,
                   "previous definition is here (a parameter of '" +
                       mod.getName() + "')");
        clash = true;
        break;
      }
    }
    auto [earlier, inserted] =
        scope.letByName.try_emplace(binding.name, &binding);
    if (!clash && !inserted) {
      diags.error(binding.nameRange, "redefinition of '" + binding.name + "'");
      diags.note(earlier->second->nameRange, "previous definition is here");
      clash = true;
    }
    earlier->second = &binding; // later uses see the latest binding
    scope.lets.push_back(&binding);
  }

  Type result = check(mod.resultSlot(), scope);
  if (result == Type::Unknown)
    return;
  if (mod.isMask() && result != Type::Bool) {
    diags.error(mod.getResult()->getRange(),
                "mask mod '" + mod.getName() +
                    "' must return bool, but its result has type " +
                    typeName(result));
  } else if (mod.isScore() && result == Type::Bool) {
    diags.error(
        mod.getResult()->getRange(),
        "score mod '" + mod.getName() +
            "' must return a number (f32), but its result has type bool");
  } else if (mod.isScore()) {
    coerce(mod.resultSlot(), Type::F32);
  }
}

void Sema::checkRecursion() {
  // Depth-first search; an edge back to a mod on the stack closes a cycle.
  // Iterative: a chain of thousands of mods calling each other must not
  // overflow the native stack.
  enum class State { Unvisited, OnStack, Done };
  llvm::DenseMap<const ModDecl *, State> state;
  struct Frame {
    const ModDecl *mod;
    size_t nextEdge;
  };
  std::vector<Frame> frames;
  std::vector<const ModDecl *> stack; // the mods of `frames`, for messages

  auto push = [&](const ModDecl *mod) {
    state[mod] = State::OnStack;
    frames.push_back({mod, 0});
    stack.push_back(mod);
  };
  for (const std::unique_ptr<ModDecl> &root : program.mods) {
    if (state.lookup(root.get()) != State::Unvisited)
      continue;
    push(root.get());
    while (!frames.empty()) {
      Frame &frame = frames.back();
      const ModDecl *mod = frame.mod;
      auto edges = callGraph.find(mod);
      if (edges == callGraph.end() || frame.nextEdge >= edges->second.size()) {
        state[mod] = State::Done;
        frames.pop_back();
        stack.pop_back();
        continue;
      }
      const CallEdge &edge = edges->second[frame.nextEdge++];
      State calleeState = state.lookup(edge.callee);
      if (calleeState == State::OnStack) {
        if (edge.callee == mod) {
          diags.error(edge.range,
                      "mod '" + mod->getName() +
                          "' calls itself; recursion is not allowed");
        } else {
          std::string cycle;
          auto start = std::find(stack.begin(), stack.end(), edge.callee);
          for (auto it = start; it != stack.end(); ++it)
            cycle += "'" + (*it)->getName().str() + "' -> ";
          cycle += "'" + edge.callee->getName().str() + "'";
          diags.error(edge.range, "recursive call: " + cycle +
                                      "; recursion is not allowed");
        }
      } else if (calleeState == State::Unvisited) {
        push(edge.callee); // invalidates `frame`
      }
    }
  }
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

std::string Sema::suggest(llvm::StringRef name, const Scope &scope,
                          bool functions) const {
  std::vector<llvm::StringRef> candidates;
  if (functions) {
    for (auto &mod : program.mods)
      candidates.push_back(mod->getName());
    for (llvm::StringRef builtin : builtinNames())
      candidates.push_back(builtin);
  } else {
    for (const LetStmt *let : scope.lets)
      candidates.push_back(let->name);
    if (scope.mod)
      for (const ModParam &param : scope.mod->getParams())
        candidates.push_back(param.name);
    for (auto &c : program.consts)
      candidates.push_back(c->getName());
    if (scope.mod) {
      for (auto &p : program.params)
        candidates.push_back(p->getName());
      for (auto &b : program.buffers)
        candidates.push_back(b->getName());
    }
  }
  llvm::StringRef best;
  unsigned bestDistance = 3;
  for (llvm::StringRef candidate : candidates) {
    unsigned distance = name.edit_distance(candidate, true, bestDistance);
    if (distance < bestDistance &&
        distance < std::max<size_t>(name.size(), 2)) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best.str();
}

void Sema::reportUnknown(SourceRange range, llvm::StringRef name,
                         const Scope &scope, bool functions) {
  std::string suggestion = suggest(name, scope, functions);
  std::string message =
      (functions ? "unknown function '" : "unknown name '") + name.str() + "'";
  if (!suggestion.empty())
    message += "; did you mean '" + suggestion + "'?";
  diags.error(range, message);
}

Type Sema::check(ExprPtr &slot, Scope &scope) {
  Expr &expr = *slot;
  Type type = Type::Unknown;
  switch (expr.getKind()) {
  case Expr::Kind::IntegerLiteral: {
    auto &literal = llvm::cast<IntegerLiteralExpr>(expr);
    type = Type::I32;
    if (scope.mod && literal.getValue() > std::numeric_limits<int32_t>::max()) {
      diags.error(expr.getRange(), "integer literal " +
                                       llvm::Twine(literal.getValue()) +
                                       " does not fit in i32");
      type = Type::Unknown;
    }
    break;
  }
  case Expr::Kind::FloatLiteral:
    type = Type::F32;
    break;
  case Expr::Kind::BoolLiteral:
    type = Type::Bool;
    break;
  case Expr::Kind::Name:
    type = checkName(llvm::cast<NameExpr>(expr), scope);
    break;
  case Expr::Kind::Unary:
    type = checkUnary(llvm::cast<UnaryExpr>(expr), scope);
    break;
  case Expr::Kind::Binary:
    type = checkBinary(llvm::cast<BinaryExpr>(expr), scope);
    break;
  case Expr::Kind::Call:
    // May replace `slot` (float(x) / int(x) become casts).
    return checkCall(slot, llvm::cast<CallExpr>(expr), scope);
  case Expr::Kind::Index:
    type = checkIndex(llvm::cast<IndexExpr>(expr), scope);
    break;
  case Expr::Kind::Cast:
    type = expr.getType();
    break;
  }
  expr.setType(type);
  return type;
}

Type Sema::checkName(NameExpr &expr, Scope &scope) {
  llvm::StringRef name = expr.getName();
  if (scope.mod) {
    auto let = scope.letByName.find(name);
    if (let != scope.letByName.end()) {
      expr.resolveToLet(let->second);
      return let->second->init->getType();
    }
    const std::vector<ModParam> &params = scope.mod->getParams();
    for (unsigned i = 0; i < params.size(); ++i) {
      if (params[i].name == name) {
        expr.resolveToArgument(i);
        // Extra parameters (already reported) read as i32.
        return i < scope.mod->getExpectedArity() ? scope.mod->getParamType(i)
                                                 : Type::I32;
      }
    }
  }
  if (isDropped(name))
    return Type::Unknown;
  const GlobalItem *global = findGlobal(name);
  if (!global) {
    Builtin builtin;
    if (lookupBuiltin(name, builtin)) {
      diags.error(expr.getRange(), "'" + name +
                                       "' is a builtin function; call it: '" +
                                       name + "(...)'");
      return Type::Unknown;
    }
    reportUnknown(expr.getRange(), name, scope, /*functions=*/false);
    return Type::Unknown;
  }

  switch (global->kind) {
  case GlobalItem::Kind::Const: {
    const auto *decl = static_cast<const ConstDecl *>(global->decl);
    if (scope.currentConst && decl->getRange().begin.offset >=
                                  scope.currentConst->getRange().begin.offset) {
      if (decl == scope.currentConst)
        diags.error(expr.getRange(),
                    "constant '" + name + "' is used in its own definition");
      else
        diags.error(expr.getRange(),
                    "constant '" + name +
                        "' is used before its definition; a constant may "
                        "use only earlier constants");
      return Type::Unknown;
    }
    expr.resolveToConst(decl);
    if (brokenConsts.lookup(decl))
      return Type::Unknown;
    return decl->getValue().type;
  }
  case GlobalItem::Kind::Param: {
    if (!scope.mod) {
      diags.error(expr.getRange(), "a constant cannot use param '" + name +
                                       "'; params are bound at launch");
      return Type::Unknown;
    }
    const auto *decl = static_cast<const ParamDecl *>(global->decl);
    expr.resolveToParam(decl);
    return decl->getType();
  }
  case GlobalItem::Kind::Buffer:
    diags.error(expr.getRange(), "buffer '" + name +
                                     "' cannot be used as a value; read an "
                                     "element: '" +
                                     name + "[...]'");
    return Type::Unknown;
  case GlobalItem::Kind::Mod:
    diags.error(expr.getRange(),
                "mod '" + name + "' must be called with arguments, e.g. '" +
                    name + "(" +
                    (static_cast<const ModDecl *>(global->decl)->isMask()
                         ? "b, h, q, kv"
                         : "score, b, h, q, kv") +
                    ")'");
    return Type::Unknown;
  }
  return Type::Unknown;
}

Type Sema::checkUnary(UnaryExpr &expr, Scope &scope) {
  Type operand = check(expr.operandSlot(), scope);
  if (operand == Type::Unknown)
    return Type::Unknown;
  switch (expr.getOp()) {
  case UnaryOp::Neg:
    if (!isNumeric(operand)) {
      diags.error(expr.getRange(), "unary '-' needs a number, got " +
                                       typeName(operand) +
                                       "; use 'not' for bool");
      return Type::Unknown;
    }
    return operand;
  case UnaryOp::BitNot:
    if (operand == Type::Bool) {
      expr.setOp(UnaryOp::LogicalNot);
      return Type::Bool;
    }
    if (!isInteger(operand)) {
      diags.error(expr.getRange(),
                  "'~' needs a bool or an integer, got " + typeName(operand));
      return Type::Unknown;
    }
    return operand;
  case UnaryOp::LogicalNot:
    if (operand != Type::Bool) {
      diags.error(expr.getRange(),
                  "'not' needs a bool, got " + typeName(operand));
      return Type::Unknown;
    }
    return Type::Bool;
  }
  return Type::Unknown;
}

Type Sema::checkBinary(BinaryExpr &expr, Scope &scope) {
  Type lhs = check(expr.lhsSlot(), scope);
  Type rhs = check(expr.rhsSlot(), scope);
  if (lhs == Type::Unknown || rhs == Type::Unknown)
    return Type::Unknown;
  BinaryOp op = expr.getOp();
  llvm::StringRef spelling = binaryOpSpelling(op);
  auto mismatch = [&](const llvm::Twine &needs) {
    diags.error(expr.getOpRange(), "operator '" + spelling + "' needs " +
                                       needs + ", got " + typeName(lhs) +
                                       " and " + typeName(rhs));
    return Type::Unknown;
  };

  switch (op) {
  case BinaryOp::Add:
  case BinaryOp::Sub:
  case BinaryOp::Mul:
  case BinaryOp::FloorDiv:
  case BinaryOp::Mod:
  case BinaryOp::Pow:
  case BinaryOp::TrueDiv: {
    if (!isNumeric(lhs) || !isNumeric(rhs))
      return mismatch("numbers" +
                      llvm::Twine(lhs == Type::Bool || rhs == Type::Bool
                                      ? " (convert a bool with int(...))"
                                      : ""));
    Type type =
        op == BinaryOp::TrueDiv ? Type::F32 : commonNumericType(lhs, rhs);
    coerce(expr.lhsSlot(), type);
    coerce(expr.rhsSlot(), type);
    if (op == BinaryOp::TrueDiv || op == BinaryOp::FloorDiv ||
        op == BinaryOp::Mod || op == BinaryOp::Pow) {
      // Catch constant zero divisors (and negative int powers) in mods; in
      // constants the evaluator reports them.
      if (scope.mod) {
        ConstantEvaluator folder(nullptr);
        std::optional<ConstantValue> divisor = folder.evaluate(*expr.getRHS());
        bool zero =
            divisor && (divisor->type == Type::F32 ? divisor->floatValue == 0.0
                                                   : divisor->intValue == 0);
        if (op != BinaryOp::Pow && zero) {
          diags.error(expr.getRHS()->getRange(),
                      llvm::Twine(op == BinaryOp::Mod ? "modulo" : "division") +
                          " by zero");
          return Type::Unknown;
        }
        if (op == BinaryOp::Pow && divisor && isInteger(type) &&
            divisor->intValue < 0) {
          diags.error(expr.getRHS()->getRange(),
                      "integers cannot be raised to a negative power; use a "
                      "float base, e.g. "
                      "'2.0 ** -1'");
          return Type::Unknown;
        }
      }
    }
    return type;
  }
  case BinaryOp::BitAnd:
  case BinaryOp::BitOr:
  case BinaryOp::BitXor:
    if (lhs == Type::Bool && rhs == Type::Bool)
      return Type::Bool;
    if (isInteger(lhs) && isInteger(rhs)) {
      Type type = commonNumericType(lhs, rhs);
      coerce(expr.lhsSlot(), type);
      coerce(expr.rhsSlot(), type);
      return type;
    }
    return mismatch("two bools or two integers");
  case BinaryOp::Shl:
  case BinaryOp::Shr:
    if (isInteger(lhs) && isInteger(rhs)) {
      Type type = commonNumericType(lhs, rhs);
      coerce(expr.lhsSlot(), type);
      coerce(expr.rhsSlot(), type);
      return type;
    }
    return mismatch("integers");
  case BinaryOp::LogicalAnd:
  case BinaryOp::LogicalOr:
    if (lhs == Type::Bool && rhs == Type::Bool)
      return Type::Bool;
    return mismatch("bools");
  case BinaryOp::Eq:
  case BinaryOp::Ne:
  case BinaryOp::Lt:
  case BinaryOp::Le:
  case BinaryOp::Gt:
  case BinaryOp::Ge:
    if (isNumeric(lhs) && isNumeric(rhs)) {
      Type type = commonNumericType(lhs, rhs);
      coerce(expr.lhsSlot(), type);
      coerce(expr.rhsSlot(), type);
      return Type::Bool;
    }
    if (lhs == Type::Bool && rhs == Type::Bool &&
        (op == BinaryOp::Eq || op == BinaryOp::Ne))
      return Type::Bool;
    if (lhs == Type::Bool && rhs == Type::Bool)
      return mismatch("numbers (bools compare only with '==' and '!=')");
    return mismatch("two numbers or two bools");
  }
  return Type::Unknown;
}

Type Sema::checkCall(ExprPtr &slot, CallExpr &expr, Scope &scope) {
  llvm::StringRef name = expr.getCalleeName();
  const GlobalItem *global = findGlobal(name);
  Builtin builtin;
  if (global && global->kind == GlobalItem::Kind::Mod) {
    // Arguments first: their errors are independent of the callee.
    std::vector<Type> argTypes;
    for (unsigned i = 0; i < expr.getNumArgs(); ++i)
      argTypes.push_back(check(expr.argSlot(i), scope));
    const auto *callee = static_cast<const ModDecl *>(global->decl);
    expr.resolveToMod(callee);
    Type result = callee->getResultType();
    expr.setType(result);
    if (!scope.mod) {
      diags.error(expr.getCalleeRange(),
                  "a constant cannot call mod '" + name + "'");
      expr.setType(Type::Unknown);
      return Type::Unknown;
    }
    if (callee->getModKind() != scope.mod->getModKind()) {
      llvm::StringRef callerKind = scope.mod->isMask() ? "mask" : "score";
      llvm::StringRef calleeKind = callee->isMask() ? "mask" : "score";
      diags.error(expr.getCalleeRange(),
                  callerKind + " mod '" + scope.mod->getName() +
                      "' cannot call " + calleeKind + " mod '" + name +
                      "'; a " + callerKind + " mod may call only " +
                      callerKind + " mods");
      diags.note(callee->getNameRange(), "'" + name + "' is defined here");
      expr.setType(Type::Unknown);
      return Type::Unknown;
    }
    callGraph[scope.mod].push_back(CallEdge{callee, expr.getCalleeRange()});
    unsigned arity = callee->getExpectedArity();
    if (expr.getNumArgs() != arity) {
      diags.error(expr.getRange(),
                  "'" + name + "' takes " + llvm::Twine(arity) +
                      " arguments, but " + llvm::Twine(expr.getNumArgs()) +
                      (expr.getNumArgs() == 1 ? " was" : " were") + " given");
      expr.setType(Type::Unknown);
      return Type::Unknown;
    }
    bool ok = true;
    for (unsigned i = 0; i < arity; ++i) {
      Type want = callee->getParamType(i);
      Type got = argTypes[i];
      if (got == Type::Unknown) {
        ok = false;
        continue;
      }
      bool acceptable = want == Type::F32 ? isNumeric(got) : isInteger(got);
      if (!acceptable) {
        diags.error(expr.getArg(i)->getRange(),
                    "argument " + llvm::Twine(i + 1) + " of '" + name +
                        "' must be " +
                        (want == Type::F32 ? "a number" : "an integer") +
                        ", got " + typeName(got));
        ok = false;
        continue;
      }
      coerce(expr.argSlot(i), want);
    }
    if (!ok) {
      expr.setType(Type::Unknown);
      return Type::Unknown;
    }
    return result;
  }
  if (lookupBuiltin(name, builtin)) {
    expr.resolveToBuiltin(builtin);
    return checkBuiltin(slot, expr, scope);
  }
  // Check the arguments anyway: their errors are independent.
  for (unsigned i = 0; i < expr.getNumArgs(); ++i)
    check(expr.argSlot(i), scope);
  expr.setType(Type::Unknown);
  if (isDropped(name))
    return Type::Unknown;
  if (global) {
    diags.error(expr.getCalleeRange(),
                kindName(global->kind) + " '" + name + "' is not a function" +
                    (global->kind == GlobalItem::Kind::Buffer
                         ? llvm::Twine("; read it with '[...]'")
                         : llvm::Twine("")));
    return Type::Unknown;
  }
  if (isLocalName(scope, name)) {
    diags.error(expr.getCalleeRange(),
                "'" + name + "' is a value, not a function");
    return Type::Unknown;
  }
  reportUnknown(expr.getCalleeRange(), name, scope, /*functions=*/true);
  return Type::Unknown;
}

// One case per builtin (arity, operand types, the result type): a table in
// code, longer than a function should be so that every builtin's typing
// rule is in one place.
Type Sema::checkBuiltin(ExprPtr &slot, CallExpr &expr, Scope &scope) {
  Builtin builtin = expr.getBuiltin();
  llvm::StringRef name = builtinName(builtin);
  unsigned arity = 1;
  switch (builtin) {
  case Builtin::Min:
  case Builtin::Max:
    arity = 2;
    break;
  case Builtin::Clamp:
  case Builtin::Where:
    arity = 3;
    break;
  default:
    break;
  }
  std::vector<Type> args;
  bool anyUnknown = false;
  for (unsigned i = 0; i < expr.getNumArgs(); ++i) {
    args.push_back(check(expr.argSlot(i), scope));
    anyUnknown |= args.back() == Type::Unknown;
  }
  auto fail = [&]() {
    expr.setType(Type::Unknown);
    return Type::Unknown;
  };
  if (expr.getNumArgs() != arity) {
    diags.error(expr.getRange(),
                "'" + name + "' takes " + llvm::Twine(arity) +
                    (arity == 1 ? " argument" : " arguments") + ", but " +
                    llvm::Twine(expr.getNumArgs()) +
                    (expr.getNumArgs() == 1 ? " was" : " were") + " given");
    return fail();
  }
  if (anyUnknown)
    return fail();
  auto needNumber = [&](unsigned i) {
    if (isNumeric(args[i]))
      return true;
    diags.error(expr.getArg(i)->getRange(),
                "argument " + llvm::Twine(i + 1) + " of '" + name +
                    "' must be a number, got " + typeName(args[i]));
    return false;
  };

  Type result = Type::Unknown;
  switch (builtin) {
  case Builtin::Abs:
  case Builtin::Floor:
  case Builtin::Ceil:
  case Builtin::Round:
    if (!needNumber(0))
      return fail();
    result = args[0];
    break;
  case Builtin::Min:
  case Builtin::Max:
  case Builtin::Clamp: {
    bool ok = true;
    for (unsigned i = 0; i < arity; ++i)
      ok &= needNumber(i);
    if (!ok)
      return fail();
    result = args[0];
    for (unsigned i = 1; i < arity; ++i)
      result = commonNumericType(result, args[i]);
    for (unsigned i = 0; i < arity; ++i)
      coerce(expr.argSlot(i), result);
    break;
  }
  case Builtin::Exp:
  case Builtin::Exp2:
  case Builtin::Log:
  case Builtin::Log2:
  case Builtin::Sqrt:
  case Builtin::Rsqrt:
  case Builtin::Tanh:
  case Builtin::Sigmoid:
  case Builtin::Sin:
  case Builtin::Cos:
  case Builtin::Tan:
  case Builtin::TanhApprox:
    if (!needNumber(0))
      return fail();
    coerce(expr.argSlot(0), Type::F32);
    result = Type::F32;
    break;
  case Builtin::Where:
    if (args[0] != Type::Bool) {
      diags.error(expr.getArg(0)->getRange(),
                  "the condition of 'where' must be bool, got " +
                      typeName(args[0]));
      return fail();
    }
    if (args[1] == Type::Bool && args[2] == Type::Bool) {
      result = Type::Bool;
    } else if (isNumeric(args[1]) && isNumeric(args[2])) {
      result = commonNumericType(args[1], args[2]);
      coerce(expr.argSlot(1), result);
      coerce(expr.argSlot(2), result);
    } else {
      diags.error(expr.getRange(),
                  "the branches of 'where' must be two numbers or two bools, "
                  "got " +
                      typeName(args[1]) + " and " + typeName(args[2]));
      return fail();
    }
    break;
  case Builtin::Float:
  case Builtin::Int: {
    // Replace the call by a cast of its argument (or by the argument itself).
    Type to = builtin == Builtin::Float ? Type::F32 : Type::I32;
    ExprPtr operand = std::move(expr.argSlot(0));
    SourceRange range = expr.getRange();
    if (operand->getType() == to) {
      slot = std::move(operand);
      return to;
    }
    slot = std::make_unique<CastExpr>(range, std::move(operand), to,
                                      /*isImplicit=*/false);
    return to;
  }
  }
  expr.setType(result);
  return result;
}

Type Sema::checkIndex(IndexExpr &expr, Scope &scope) {
  llvm::StringRef name = expr.getBufferName();
  std::vector<Type> indexTypes;
  for (unsigned i = 0; i < expr.getNumIndices(); ++i)
    indexTypes.push_back(check(expr.indexSlot(i), scope));

  if (isLocalName(scope, name)) {
    diags.error(expr.getNameRange(),
                "'" + name + "' is not a buffer and cannot be indexed");
    return Type::Unknown;
  }
  if (isDropped(name))
    return Type::Unknown;
  const GlobalItem *global = findGlobal(name);
  if (!global) {
    reportUnknown(expr.getNameRange(), name, scope, /*functions=*/false);
    return Type::Unknown;
  }
  if (global->kind != GlobalItem::Kind::Buffer) {
    diags.error(expr.getNameRange(),
                kindName(global->kind) + " '" + name +
                    "' is not a buffer and cannot be indexed" +
                    (global->kind == GlobalItem::Kind::Mod
                         ? llvm::Twine("; call it with '(...)'")
                         : llvm::Twine("")));
    return Type::Unknown;
  }
  if (!scope.mod) {
    diags.error(expr.getRange(), "a constant cannot read buffer '" + name +
                                     "'; buffers are bound at launch");
    return Type::Unknown;
  }
  const auto *buffer = static_cast<const BufferDecl *>(global->decl);
  expr.resolve(buffer);
  if (expr.getNumIndices() != buffer->getRank()) {
    diags.error(expr.getRange(),
                "buffer '" + name + "' has rank " +
                    llvm::Twine(buffer->getRank()) + " but is indexed with " +
                    llvm::Twine(expr.getNumIndices()) +
                    (expr.getNumIndices() == 1 ? " index" : " indices"));
    diags.note(buffer->getRange(), "'" + name + "' is declared here");
    return Type::Unknown;
  }
  bool ok = true;
  for (unsigned i = 0; i < indexTypes.size(); ++i) {
    if (indexTypes[i] == Type::Unknown) {
      ok = false;
    } else if (!isInteger(indexTypes[i])) {
      diags.error(
          expr.getIndex(i)->getRange(),
          "buffer index must be an integer, got " + typeName(indexTypes[i]) +
              (indexTypes[i] == Type::F32 ? "; convert it with int(...)" : ""));
      ok = false;
    }
  }
  if (!ok)
    return Type::Unknown;
  return readType(buffer->getElementType());
}

} // namespace

//===----------------------------------------------------------------------===//
// Entry points
//===----------------------------------------------------------------------===//

bool pagedc::parseOverrideValue(llvm::StringRef text, ConstantValue &result,
                                std::string *reason) {
  ConstOverrideValue value;
  std::string why = parseConstOverride(std::string_view(text), value);
  if (!why.empty()) {
    if (reason)
      *reason = why;
    return false;
  }
  result = value.isInt ? ConstantValue::ofInt(value.intValue)
                       : ConstantValue::ofFloat(value.floatValue);
  return true;
}

bool pagedc::analyze(Program &program, DiagnosticEngine &diags,
                     const FrontendOptions &options) {
  Sema sema(program, diags, options);
  return sema.run();
}

std::unique_ptr<Program>
pagedc::parseAndAnalyze(DiagnosticEngine &diags,
                        const FrontendOptions &options) {
  std::vector<Token> tokens = lex(diags);
  std::unique_ptr<Program> program = parse(tokens, diags);
  if (!analyze(*program, diags, options))
    return nullptr;
  return program;
}
