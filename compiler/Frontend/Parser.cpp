//===- Parser.cpp - Recursive-descent parser of .attn ---------------------===//
//
// Line ends separate items and `let` statements. Inside ( ) and [ ] they are
// ignored, and an expression may continue on the next line after a binary
// operator, '=', ',', '(' or '['. On a syntax error the parser reports it,
// skips to the next line that starts an item, and drops the broken item.
//
//===----------------------------------------------------------------------===//

#include "Frontend.h"

#include "llvm/ADT/StringSwitch.h"

using namespace pagedc;
using namespace pagedc::ast;

namespace {

/// Parse functions return null (or false) after reporting an error; the
/// caller unwinds to the item, which is dropped.
class Parser {
public:
  Parser(const std::vector<Token> &tokens, DiagnosticEngine &diags)
      : tokens(tokens), diags(diags) {}

  std::unique_ptr<Program> parseProgram();

private:
  //===--- Token access ---------------------------------------------------===//

  /// The current token. Inside brackets line ends are skipped.
  const Token &cur() {
    if (nesting > 0)
      while (tokens[index].is(TokenKind::Newline))
        ++index;
    return tokens[index];
  }
  const Token &peekAfterCurrent() {
    cur();
    size_t i = index + 1 < tokens.size() ? index + 1 : index;
    return tokens[i];
  }
  bool at(TokenKind kind) { return cur().is(kind); }
  Token consume() {
    Token token = cur();
    if (token.isNot(TokenKind::Eof))
      ++index;
    lastEnd = token.range.end;
    return token;
  }
  bool consumeIf(TokenKind kind) {
    if (!at(kind))
      return false;
    consume();
    return true;
  }
  void skipNewlines() {
    while (tokens[index].is(TokenKind::Newline))
      ++index;
  }
  bool atItemStart() {
    switch (cur().kind) {
    case TokenKind::KwConst:
    case TokenKind::KwParam:
    case TokenKind::KwBuffer:
    case TokenKind::KwMask:
    case TokenKind::KwScore:
      return true;
    default:
      return false;
    }
  }

  /// Reports "expected X" at the current token, unless the current token is
  /// a lexer error (already reported).
  void errorExpected(const llvm::Twine &what) {
    const Token &token = cur();
    if (token.is(TokenKind::Error))
      return;
    diags.error(token.range, "expected " + what + ", found " + describe(token));
  }
  void errorAt(SourceRange range, const llvm::Twine &message) {
    if (cur().is(TokenKind::Error))
      return;
    diags.error(range, message);
  }
  bool expect(TokenKind kind, const llvm::Twine &what) {
    if (consumeIf(kind))
      return true;
    errorExpected(what);
    return false;
  }
  static std::string describe(const Token &token) {
    switch (token.kind) {
    case TokenKind::Eof:
      return "end of file";
    case TokenKind::Newline:
      return "end of line";
    default:
      return "'" + token.text.str() + "'";
    }
  }

  SourceRange rangeFrom(SourceLoc begin) const {
    return SourceRange{begin, lastEnd};
  }

  //===--- Items ----------------------------------------------------------===//

  bool parseItem(Program &program);
  bool parseConst(Program &program);
  bool parseParam(Program &program);
  bool parseBuffer(Program &program);
  bool parseMod(Program &program, ModDecl::ModKind kind);
  bool parseBlock(std::vector<std::unique_ptr<LetStmt>> &lets, ExprPtr &result,
                  llvm::StringRef modName);
  bool expectEndOfItem();
  void recoverToNextItem();

  //===--- Expressions ----------------------------------------------------===//

  /// Every nested expression (a parenthesis, an argument, an index, an
  /// operand of a prefix operator, an exponent) goes through here, so the
  /// parser's own recursion is bounded by kMaxExpressionDepth.
  ExprPtr parseExpr() {
    if (!enterNested())
      return nullptr;
    ExprPtr result = parseOr();
    --recursionDepth;
    return result;
  }
  ExprPtr parseOr();
  ExprPtr parseAnd();
  ExprPtr parseNot();
  ExprPtr parseComparison();
  ExprPtr parseBitOr();
  ExprPtr parseBitXor();
  ExprPtr parseBitAnd();
  ExprPtr parseShift();
  ExprPtr parseAdditive();
  ExprPtr parseMultiplicative();
  ExprPtr parseUnary();
  ExprPtr parsePower();
  ExprPtr parsePrimary();
  bool parseArgumentList(TokenKind close, llvm::StringRef closeSpelling,
                         std::vector<ExprPtr> &args);

  /// Builds `lhs op rhs`; the operator token has been consumed. Null (after
  /// an error) when the tree would get deeper than kMaxExpressionDepth.
  ExprPtr makeBinary(BinaryOp op, SourceRange opRange, ExprPtr lhs,
                     ExprPtr rhs) {
    unsigned depth = 1 + std::max(depthOf(lhs.get()), depthOf(rhs.get()));
    if (!checkTreeDepth(depth, opRange))
      return nullptr;
    SourceRange range{lhs->getRange().begin, rhs->getRange().end};
    ExprPtr result = std::make_unique<BinaryExpr>(
        range, op, opRange, std::move(lhs), std::move(rhs));
    return withDepth(std::move(result), depth);
  }

  //===--- Nesting limits -------------------------------------------------===//
  //
  // Every later stage (Sema, the constant evaluator, ASTDump, MLIRGen)
  // walks expressions recursively, and a chain of binary operators is a
  // left-deep tree, so both the parser's recursion and the depth of each
  // tree it builds are bounded by kMaxExpressionDepth.

  /// The depth of the tree rooted at `expr` (a leaf is 1).
  static unsigned depthOf(const Expr *expr) { return expr->getDepth(); }
  static ExprPtr withDepth(ExprPtr expr, unsigned depth) {
    expr->setDepth(depth);
    return expr;
  }
  /// The depth of a node over `children`, or 0 after an error.
  unsigned nodeDepth(const std::vector<ExprPtr> &children, SourceRange range) {
    unsigned depth = 1;
    for (const ExprPtr &child : children)
      depth = std::max(depth, 1 + depthOf(child.get()));
    return checkTreeDepth(depth, range) ? depth : 0;
  }
  bool checkTreeDepth(unsigned depth, SourceRange range) {
    if (depth <= kMaxExpressionDepth)
      return true;
    reportTooDeep(range);
    return false;
  }
  bool enterNested() {
    if (recursionDepth >= kMaxExpressionDepth) {
      reportTooDeep(cur().range);
      return false;
    }
    ++recursionDepth;
    return true;
  }
  void reportTooDeep(SourceRange range) {
    if (cur().is(TokenKind::Error))
      return;
    diags.error(range, "expression nesting deeper than " +
                           llvm::Twine(kMaxExpressionDepth) +
                           " levels (parentheses, operators, calls and "
                           "subscripts all nest); split it with 'let'");
  }
  /// After a binary operator an expression may go on on the next line.
  Token consumeOperator() {
    Token op = consume();
    skipNewlines();
    return op;
  }

  const std::vector<Token> &tokens;
  DiagnosticEngine &diags;
  size_t index = 0;
  unsigned nesting = 0; ///< depth of ( and [
  unsigned recursionDepth = 0; ///< nested parseExpr/prefix-operator calls
  SourceLoc lastEnd;
  bool itemHasError = false; ///< an error was reported but parsing went on
};

/// Keeps `nesting` balanced across early returns.
struct NestingScope {
  explicit NestingScope(unsigned &n) : n(n) { ++n; }
  ~NestingScope() { --n; }
  unsigned &n;
};

std::unique_ptr<Program> Parser::parseProgram() {
  auto program = std::make_unique<Program>();
  program->fileName = diags.getFileName().str();
  while (true) {
    skipNewlines();
    if (at(TokenKind::Eof) || diags.shouldStop())
      break;
    itemHasError = false;
    size_t itemStart = index;
    if (!parseItem(*program) || itemHasError) {
      // Remember the name so that its uses are not reported again.
      if (itemStart + 1 < tokens.size() &&
          tokens[itemStart + 1].is(TokenKind::Identifier))
        program->droppedItemNames.push_back(tokens[itemStart + 1].text.str());
      recoverToNextItem();
    }
  }
  return program;
}

void Parser::recoverToNextItem() {
  nesting = 0;
  // Already at the start of the next item (e.g. after an unterminated block).
  if (atItemStart() && (index == 0 || tokens[index - 1].is(TokenKind::Newline)))
    return;
  // Skip the rest of the broken item: to a line that starts with an item
  // keyword (or the end of the file).
  while (!at(TokenKind::Eof)) {
    if (at(TokenKind::Newline)) {
      skipNewlines();
      if (atItemStart() || at(TokenKind::Eof))
        return;
      continue;
    }
    consume();
  }
}

bool Parser::parseItem(Program &program) {
  switch (cur().kind) {
  case TokenKind::KwConst:
    return parseConst(program);
  case TokenKind::KwParam:
    return parseParam(program);
  case TokenKind::KwBuffer:
    return parseBuffer(program);
  case TokenKind::KwMask:
    return parseMod(program, ModDecl::ModKind::Mask);
  case TokenKind::KwScore:
    return parseMod(program, ModDecl::ModKind::Score);
  default:
    errorExpected("an item ('const', 'param', 'buffer', 'mask' or 'score')");
    return false;
  }
}

bool Parser::expectEndOfItem() {
  if (at(TokenKind::Newline) || at(TokenKind::Eof))
    return true;
  if (cur().is(TokenKind::Error))
    return false;
  diags.error(cur().range,
              "expected end of line after the item, found " + describe(cur()));
  return false;
}

bool Parser::parseConst(Program &program) {
  SourceLoc begin = consume().range.begin;
  if (!at(TokenKind::Identifier)) {
    errorExpected("a constant name after 'const'");
    return false;
  }
  Token name = consume();
  if (!expect(TokenKind::Assign, "'=' after the constant name"))
    return false;
  skipNewlines();
  ExprPtr init = parseExpr();
  if (!init || !expectEndOfItem())
    return false;
  if (!itemHasError)
    program.consts.push_back(std::make_unique<ConstDecl>(
        rangeFrom(begin), name.text.str(), name.range, std::move(init)));
  return true;
}

bool Parser::parseParam(Program &program) {
  SourceLoc begin = consume().range.begin;
  if (!at(TokenKind::Identifier)) {
    errorExpected("a param name after 'param'");
    return false;
  }
  Token name = consume();
  if (!expect(TokenKind::Colon,
              "':' and a type (i32, f32 or bool) after the param name"))
    return false;
  if (!at(TokenKind::Identifier)) {
    errorExpected("a param type (i32, f32 or bool)");
    return false;
  }
  Token typeToken = consume();
  Type type = llvm::StringSwitch<Type>(typeToken.text)
                  .Case("i32", Type::I32)
                  .Case("f32", Type::F32)
                  .Case("bool", Type::Bool)
                  .Default(Type::Unknown);
  if (type == Type::Unknown) {
    diags.error(typeToken.range, "unknown param type '" + typeToken.text +
                                     "'; expected i32, f32 or bool");
    return false;
  }
  bool hasDefault = false;
  ConstantValue defaultValue;
  if (consumeIf(TokenKind::Assign)) {
    hasDefault = true;
    SourceLoc valueBegin = cur().range.begin;
    bool negative = consumeIf(TokenKind::Minus);
    const Token &value = cur();
    switch (value.kind) {
    case TokenKind::Integer:
      defaultValue =
          ConstantValue::ofInt(negative ? -value.intValue : value.intValue);
      break;
    case TokenKind::Float:
    case TokenKind::KwInf:
      defaultValue = ConstantValue::ofFloat(negative ? -value.floatValue
                                                     : value.floatValue);
      break;
    case TokenKind::KwTrue:
    case TokenKind::KwFalse:
      if (negative) {
        diags.error(rangeFrom(valueBegin), "a bool default cannot be negated");
        return false;
      }
      defaultValue = ConstantValue::ofBool(value.is(TokenKind::KwTrue));
      break;
    default:
      errorExpected("a literal default value (a number, true or false)");
      return false;
    }
    consume();
  }
  if (!expectEndOfItem())
    return false;
  program.params.push_back(
      std::make_unique<ParamDecl>(rangeFrom(begin), name.text.str(), name.range,
                                  type, hasDefault, defaultValue));
  return true;
}

bool Parser::parseBuffer(Program &program) {
  SourceLoc begin = consume().range.begin;
  if (!at(TokenKind::Identifier)) {
    errorExpected("a buffer name after 'buffer'");
    return false;
  }
  Token name = consume();
  if (!expect(TokenKind::Colon,
              "':' and an element type after the buffer name"))
    return false;
  if (!at(TokenKind::Identifier)) {
    errorExpected("an element type (i32, i64, f32, f16, bf16 or bool)");
    return false;
  }
  Token typeToken = consume();
  ElementType elementType = ElementType::F32;
  bool known = true;
  if (typeToken.text == "i32")
    elementType = ElementType::I32;
  else if (typeToken.text == "i64")
    elementType = ElementType::I64;
  else if (typeToken.text == "f32")
    elementType = ElementType::F32;
  else if (typeToken.text == "f16")
    elementType = ElementType::F16;
  else if (typeToken.text == "bf16")
    elementType = ElementType::BF16;
  else if (typeToken.text == "bool")
    elementType = ElementType::Bool;
  else
    known = false;
  if (!known) {
    diags.error(typeToken.range,
                "unknown element type '" + typeToken.text +
                    "'; expected i32, i64, f32, f16, bf16 or bool");
    return false;
  }
  if (!expect(TokenKind::LBracket,
              "'[' and the buffer's dimensions after the element type"))
    return false;
  std::vector<BufferDim> dims;
  {
    NestingScope scope(nesting);
    while (true) {
      BufferDim dim;
      const Token &token = cur();
      dim.range = token.range;
      if (token.is(TokenKind::Integer)) {
        dim.kind = BufferDim::Kind::Fixed;
        dim.size = token.intValue;
        if (dim.size == 0) {
          diags.error(token.range, "a buffer dimension must be positive");
          itemHasError = true;
        }
      } else if (token.is(TokenKind::Identifier)) {
        dim.kind = BufferDim::Kind::Named;
        dim.name = token.text.str();
      } else if (token.is(TokenKind::Question)) {
        dim.kind = BufferDim::Kind::Any;
      } else {
        errorExpected("a dimension (an integer, a name or '?')");
        return false;
      }
      consume();
      dims.push_back(std::move(dim));
      if (consumeIf(TokenKind::Comma))
        continue;
      if (!at(TokenKind::RBracket)) {
        errorExpected("',' or ']' in the buffer's dimensions");
        return false;
      }
      break;
    }
  }
  consume(); // ]
  if (dims.size() > 4) {
    diags.error(SourceRange{dims[4].range.begin, dims.back().range.end},
                "buffer '" + name.text + "' has rank " +
                    llvm::Twine(dims.size()) + "; buffers have rank 1 to 4");
    itemHasError = true;
  }
  if (!expectEndOfItem())
    return false;
  if (!itemHasError)
    program.buffers.push_back(
        std::make_unique<BufferDecl>(rangeFrom(begin), name.text.str(),
                                     name.range, elementType, std::move(dims)));
  return true;
}

bool Parser::parseMod(Program &program, ModDecl::ModKind kind) {
  SourceLoc begin = consume().range.begin;
  llvm::StringRef keyword = kind == ModDecl::ModKind::Mask ? "mask" : "score";
  if (!at(TokenKind::Identifier)) {
    errorExpected("a mod name after '" + keyword + "'");
    return false;
  }
  Token name = consume();
  if (!expect(TokenKind::LParen, "'(' and the mod's parameters"))
    return false;
  std::vector<ModParam> params;
  {
    NestingScope scope(nesting);
    if (!at(TokenKind::RParen)) {
      while (true) {
        if (!at(TokenKind::Identifier)) {
          errorExpected("a parameter name");
          return false;
        }
        Token param = consume();
        params.push_back(ModParam{param.text.str(), param.range});
        if (consumeIf(TokenKind::Comma))
          continue;
        if (!at(TokenKind::RParen)) {
          errorExpected("',' or ')' in the parameter list");
          return false;
        }
        break;
      }
    }
  }
  Token close = consume(); // )
  std::vector<std::unique_ptr<LetStmt>> lets;
  ExprPtr result;
  if (consumeIf(TokenKind::Assign)) {
    skipNewlines();
    if (at(TokenKind::LBrace)) {
      diags.error(cur().range,
                  "a block body follows the parameters directly: write '" +
                      keyword + " " + name.text + "(...) { ... }' without '='");
      return false;
    }
    result = parseExpr();
    if (!result || !expectEndOfItem())
      return false;
  } else if (at(TokenKind::LBrace)) {
    if (!parseBlock(lets, result, name.text))
      return false;
    if (!expectEndOfItem())
      return false;
  } else {
    errorExpected(
        "'=' and an expression, or a '{' block, after the parameter list");
    (void)close;
    return false;
  }
  if (!itemHasError)
    program.mods.push_back(std::make_unique<ModDecl>(
        rangeFrom(begin), kind, name.text.str(), name.range, std::move(params),
        std::move(lets), std::move(result)));
  return true;
}

bool Parser::parseBlock(std::vector<std::unique_ptr<LetStmt>> &lets,
                        ExprPtr &result, llvm::StringRef modName) {
  Token open = consume(); // {
  bool ok = true;
  auto reportUnterminated = [&]() {
    diags.error(cur().range,
                "unterminated block: expected '}' to end the body of '" +
                    modName + "' before " + describe(cur()));
    diags.note(open.range, "the block starts here");
  };
  auto skipSeparators = [&]() {
    while (at(TokenKind::Newline) || at(TokenKind::Semicolon))
      consume();
  };
  // Skips to the next statement inside the block after an error.
  auto recoverInBlock = [&]() {
    nesting = 0;
    while (!at(TokenKind::Eof) && !at(TokenKind::Newline) &&
           !at(TokenKind::Semicolon) && !at(TokenKind::RBrace))
      consume();
  };

  while (true) {
    skipSeparators();
    if (at(TokenKind::Eof) || atItemStart()) {
      reportUnterminated();
      return false;
    }
    if (at(TokenKind::RBrace)) {
      if (!result) {
        if (ok)
          diags.error(cur().range,
                      "the block of '" + modName +
                          "' has no result expression; its last line must be "
                          "an expression");
        return false;
      }
      consume();
      return ok;
    }
    if (result) {
      // Something follows the result expression.
      if (cur().isNot(TokenKind::Error))
        diags.error(result->getRange(),
                    "only the last line of a block may be an expression; "
                    "bind this value with 'let NAME = ...'");
      ok = false;
      result.reset();
    }
    if (consumeIf(TokenKind::KwLet)) {
      if (!at(TokenKind::Identifier)) {
        errorExpected("a name after 'let'");
        ok = false;
        recoverInBlock();
        continue;
      }
      Token name = consume();
      if (!expect(TokenKind::Assign, "'=' after the name in 'let'")) {
        ok = false;
        recoverInBlock();
        continue;
      }
      skipNewlines();
      ExprPtr init = parseExpr();
      if (!init) {
        ok = false;
        recoverInBlock();
        continue;
      }
      if (!at(TokenKind::Newline) && !at(TokenKind::Semicolon) &&
          !at(TokenKind::RBrace) && !at(TokenKind::Eof)) {
        errorExpected("end of line after the 'let' statement");
        ok = false;
        recoverInBlock();
        continue;
      }
      auto let = std::make_unique<LetStmt>();
      let->name = name.text.str();
      let->nameRange = name.range;
      let->init = std::move(init);
      lets.push_back(std::move(let));
      continue;
    }
    ExprPtr expr = parseExpr();
    if (!expr) {
      ok = false;
      recoverInBlock();
      continue;
    }
    if (!at(TokenKind::Newline) && !at(TokenKind::Semicolon) &&
        !at(TokenKind::RBrace) && !at(TokenKind::Eof) && !atItemStart()) {
      errorExpected("end of line or '}' after the expression");
      ok = false;
      recoverInBlock();
      continue;
    }
    result = std::move(expr);
  }
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

ExprPtr Parser::parseOr() {
  ExprPtr lhs = parseAnd();
  while (lhs && at(TokenKind::KwOr)) {
    Token op = consumeOperator();
    ExprPtr rhs = parseAnd();
    if (!rhs)
      return nullptr;
    lhs = makeBinary(BinaryOp::LogicalOr, op.range, std::move(lhs),
                     std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseAnd() {
  ExprPtr lhs = parseNot();
  while (lhs && at(TokenKind::KwAnd)) {
    Token op = consumeOperator();
    ExprPtr rhs = parseNot();
    if (!rhs)
      return nullptr;
    lhs = makeBinary(BinaryOp::LogicalAnd, op.range, std::move(lhs),
                     std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseNot() {
  if (at(TokenKind::KwNot)) {
    Token op = consumeOperator();
    if (!enterNested())
      return nullptr;
    ExprPtr operand = parseNot();
    --recursionDepth;
    if (!operand)
      return nullptr;
    SourceRange range{op.range.begin, operand->getRange().end};
    unsigned depth = 1 + depthOf(operand.get());
    if (!checkTreeDepth(depth, op.range))
      return nullptr;
    return withDepth(std::make_unique<UnaryExpr>(range, UnaryOp::LogicalNot,
                                                 op.range, std::move(operand)),
                     depth);
  }
  return parseComparison();
}

static bool comparisonOp(TokenKind kind, BinaryOp &op) {
  switch (kind) {
  case TokenKind::EqualEqual:
    op = BinaryOp::Eq;
    return true;
  case TokenKind::NotEqual:
    op = BinaryOp::Ne;
    return true;
  case TokenKind::Less:
    op = BinaryOp::Lt;
    return true;
  case TokenKind::LessEqual:
    op = BinaryOp::Le;
    return true;
  case TokenKind::Greater:
    op = BinaryOp::Gt;
    return true;
  case TokenKind::GreaterEqual:
    op = BinaryOp::Ge;
    return true;
  default:
    return false;
  }
}

ExprPtr Parser::parseComparison() {
  ExprPtr lhs = parseBitOr();
  BinaryOp op;
  if (!lhs || !comparisonOp(cur().kind, op))
    return lhs;
  Token opToken = consumeOperator();
  ExprPtr middle = parseBitOr();
  if (!middle)
    return nullptr;
  BinaryOp secondOp;
  if (!comparisonOp(cur().kind, secondOp))
    return makeBinary(op, opToken.range, std::move(lhs), std::move(middle));

  // A chained comparison. Say what was probably meant: with a bitwise
  // operator in the middle (`x == 1 | q == kv`) the user wanted that
  // operator between two comparisons.
  Token secondToken = consumeOperator();
  ExprPtr rhs = parseBitOr();
  if (!rhs)
    return nullptr;
  std::string suggestion;
  auto text = [&](const Expr *e) { return diags.getText(e->getRange()).str(); };
  auto *bitwise = llvm::dyn_cast<BinaryExpr>(middle.get());
  if (bitwise && (bitwise->getOp() == BinaryOp::BitAnd ||
                  bitwise->getOp() == BinaryOp::BitOr ||
                  bitwise->getOp() == BinaryOp::BitXor)) {
    suggestion = "(" + text(lhs.get()) + " " + opToken.text.str() + " " +
                 text(bitwise->getLHS()) + ") " +
                 binaryOpSpelling(bitwise->getOp()).str() + " (" +
                 text(bitwise->getRHS()) + " " + secondToken.text.str() + " " +
                 text(rhs.get()) + ")";
  } else {
    suggestion = "(" + text(lhs.get()) + " " + opToken.text.str() + " " +
                 text(middle.get()) + ") & (" + text(middle.get()) + " " +
                 secondToken.text.str() + " " + text(rhs.get()) + ")";
  }
  diags.error(secondToken.range,
              "comparisons cannot be chained; add parentheses, e.g. '" +
                  suggestion + "'");
  itemHasError = true;
  // Go on to find later errors; the item is dropped.
  while (comparisonOp(cur().kind, secondOp)) {
    consumeOperator();
    if (!parseBitOr())
      return nullptr;
  }
  return makeBinary(op, opToken.range, std::move(lhs), std::move(middle));
}

ExprPtr Parser::parseBitOr() {
  ExprPtr lhs = parseBitXor();
  while (lhs && at(TokenKind::Pipe)) {
    Token op = consumeOperator();
    ExprPtr rhs = parseBitXor();
    if (!rhs)
      return nullptr;
    lhs = makeBinary(BinaryOp::BitOr, op.range, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseBitXor() {
  ExprPtr lhs = parseBitAnd();
  while (lhs && at(TokenKind::Caret)) {
    Token op = consumeOperator();
    ExprPtr rhs = parseBitAnd();
    if (!rhs)
      return nullptr;
    lhs =
        makeBinary(BinaryOp::BitXor, op.range, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseBitAnd() {
  ExprPtr lhs = parseShift();
  while (lhs && at(TokenKind::Amp)) {
    Token op = consumeOperator();
    ExprPtr rhs = parseShift();
    if (!rhs)
      return nullptr;
    lhs =
        makeBinary(BinaryOp::BitAnd, op.range, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseShift() {
  ExprPtr lhs = parseAdditive();
  while (lhs && (at(TokenKind::LessLess) || at(TokenKind::GreaterGreater))) {
    BinaryOp op = at(TokenKind::LessLess) ? BinaryOp::Shl : BinaryOp::Shr;
    Token opToken = consumeOperator();
    ExprPtr rhs = parseAdditive();
    if (!rhs)
      return nullptr;
    lhs = makeBinary(op, opToken.range, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseAdditive() {
  ExprPtr lhs = parseMultiplicative();
  while (lhs && (at(TokenKind::Plus) || at(TokenKind::Minus))) {
    BinaryOp op = at(TokenKind::Plus) ? BinaryOp::Add : BinaryOp::Sub;
    Token opToken = consumeOperator();
    ExprPtr rhs = parseMultiplicative();
    if (!rhs)
      return nullptr;
    lhs = makeBinary(op, opToken.range, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseMultiplicative() {
  ExprPtr lhs = parseUnary();
  while (lhs) {
    BinaryOp op;
    switch (cur().kind) {
    case TokenKind::Star:
      op = BinaryOp::Mul;
      break;
    case TokenKind::Slash:
      op = BinaryOp::TrueDiv;
      break;
    case TokenKind::SlashSlash:
      op = BinaryOp::FloorDiv;
      break;
    case TokenKind::Percent:
      op = BinaryOp::Mod;
      break;
    default:
      return lhs;
    }
    Token opToken = consumeOperator();
    ExprPtr rhs = parseUnary();
    if (!rhs)
      return nullptr;
    lhs = makeBinary(op, opToken.range, std::move(lhs), std::move(rhs));
  }
  return lhs;
}

ExprPtr Parser::parseUnary() {
  if (at(TokenKind::Minus) || at(TokenKind::Tilde)) {
    UnaryOp op = at(TokenKind::Minus) ? UnaryOp::Neg : UnaryOp::BitNot;
    Token opToken = consume();
    if (!enterNested())
      return nullptr;
    ExprPtr operand = parseUnary();
    --recursionDepth;
    if (!operand)
      return nullptr;
    SourceRange range{opToken.range.begin, operand->getRange().end};
    unsigned depth = 1 + depthOf(operand.get());
    if (!checkTreeDepth(depth, opToken.range))
      return nullptr;
    return withDepth(std::make_unique<UnaryExpr>(range, op, opToken.range,
                                                 std::move(operand)),
                     depth);
  }
  if (at(TokenKind::KwNot)) {
    // `a + not b` is a syntax error in Python too; say how to write it.
    diags.error(
        cur().range,
        "'not' cannot appear inside an arithmetic or comparison operand; "
        "add parentheses: '(not x)'");
    return nullptr;
  }
  return parsePower();
}

ExprPtr Parser::parsePower() {
  ExprPtr base = parsePrimary();
  if (!base || !at(TokenKind::StarStar))
    return base;
  Token op = consumeOperator();
  // Right-associative, and the exponent may carry a sign: 2 ** -1.
  if (!enterNested())
    return nullptr;
  ExprPtr exponent = parseUnary();
  --recursionDepth;
  if (!exponent)
    return nullptr;
  return makeBinary(BinaryOp::Pow, op.range, std::move(base),
                    std::move(exponent));
}

bool Parser::parseArgumentList(TokenKind close, llvm::StringRef closeSpelling,
                               std::vector<ExprPtr> &args) {
  NestingScope scope(nesting);
  if (consumeIf(close))
    return true;
  while (true) {
    ExprPtr arg = parseExpr();
    if (!arg)
      return false;
    args.push_back(std::move(arg));
    if (consumeIf(TokenKind::Comma)) {
      if (consumeIf(close)) // a trailing comma, as Python allows
        return true;
      continue;
    }
    if (consumeIf(close))
      return true;
    errorExpected("',' or '" + closeSpelling + "'");
    return false;
  }
}

ExprPtr Parser::parsePrimary() {
  const Token &token = cur();
  switch (token.kind) {
  case TokenKind::Integer: {
    Token t = consume();
    return std::make_unique<IntegerLiteralExpr>(t.range, t.intValue);
  }
  case TokenKind::Float:
  case TokenKind::KwInf: {
    Token t = consume();
    return std::make_unique<FloatLiteralExpr>(t.range, t.floatValue);
  }
  case TokenKind::KwTrue:
  case TokenKind::KwFalse: {
    Token t = consume();
    return std::make_unique<BoolLiteralExpr>(t.range, t.is(TokenKind::KwTrue));
  }
  case TokenKind::LParen: {
    Token open = consume();
    ExprPtr inner;
    {
      NestingScope scope(nesting);
      inner = parseExpr();
      if (!inner)
        return nullptr;
      if (!at(TokenKind::RParen)) {
        errorExpected("')'");
        if (cur().isNot(TokenKind::Error))
          diags.note(open.range, "to match this '('");
        return nullptr;
      }
    }
    consume();
    return inner;
  }
  case TokenKind::Identifier: {
    Token name = consume();
    if (at(TokenKind::LParen)) {
      consume();
      std::vector<ExprPtr> args;
      if (!parseArgumentList(TokenKind::RParen, ")", args))
        return nullptr;
      unsigned depth = nodeDepth(args, name.range);
      if (!depth)
        return nullptr;
      return withDepth(std::make_unique<CallExpr>(rangeFrom(name.range.begin),
                                                  name.text.str(), name.range,
                                                  std::move(args)),
                       depth);
    }
    if (at(TokenKind::LBracket)) {
      consume();
      std::vector<ExprPtr> indices;
      if (!parseArgumentList(TokenKind::RBracket, "]", indices))
        return nullptr;
      if (indices.empty()) {
        diags.error(rangeFrom(name.range.begin),
                    "a buffer read needs at least one index");
        return nullptr;
      }
      unsigned depth = nodeDepth(indices, name.range);
      if (!depth)
        return nullptr;
      return withDepth(std::make_unique<IndexExpr>(rangeFrom(name.range.begin),
                                                   name.text.str(), name.range,
                                                   std::move(indices)),
                       depth);
    }
    return std::make_unique<NameExpr>(name.range, name.text.str());
  }
  default:
    errorExpected("an expression");
    return nullptr;
  }
}

} // namespace

std::unique_ptr<Program> pagedc::parse(const std::vector<Token> &tokens,
                                       DiagnosticEngine &diags) {
  return Parser(tokens, diags).parseProgram();
}
