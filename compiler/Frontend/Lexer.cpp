//===- Lexer.cpp - Tokens of the .attn language ---------------------------===//

#include "Lexer.h"

#include "pagedc/ConstOverride.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/ErrorHandling.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

using namespace pagedc;
using ast::SourceLoc;
using ast::SourceRange;

llvm::StringRef pagedc::tokenKindName(TokenKind kind) {
  switch (kind) {
  case TokenKind::Eof:
    return "eof";
  case TokenKind::Newline:
    return "newline";
  case TokenKind::Error:
    return "error";
  case TokenKind::Identifier:
    return "identifier";
  case TokenKind::Integer:
    return "integer";
  case TokenKind::Float:
    return "float";
  case TokenKind::KwConst:
    return "kw_const";
  case TokenKind::KwParam:
    return "kw_param";
  case TokenKind::KwBuffer:
    return "kw_buffer";
  case TokenKind::KwMask:
    return "kw_mask";
  case TokenKind::KwScore:
    return "kw_score";
  case TokenKind::KwLet:
    return "kw_let";
  case TokenKind::KwTrue:
    return "kw_true";
  case TokenKind::KwFalse:
    return "kw_false";
  case TokenKind::KwInf:
    return "kw_inf";
  case TokenKind::KwAnd:
    return "kw_and";
  case TokenKind::KwOr:
    return "kw_or";
  case TokenKind::KwNot:
    return "kw_not";
  case TokenKind::LParen:
    return "l_paren";
  case TokenKind::RParen:
    return "r_paren";
  case TokenKind::LBracket:
    return "l_bracket";
  case TokenKind::RBracket:
    return "r_bracket";
  case TokenKind::LBrace:
    return "l_brace";
  case TokenKind::RBrace:
    return "r_brace";
  case TokenKind::Comma:
    return "comma";
  case TokenKind::Colon:
    return "colon";
  case TokenKind::Semicolon:
    return "semicolon";
  case TokenKind::Question:
    return "question";
  case TokenKind::Assign:
    return "assign";
  case TokenKind::Plus:
    return "plus";
  case TokenKind::Minus:
    return "minus";
  case TokenKind::Star:
    return "star";
  case TokenKind::StarStar:
    return "star_star";
  case TokenKind::Slash:
    return "slash";
  case TokenKind::SlashSlash:
    return "slash_slash";
  case TokenKind::Percent:
    return "percent";
  case TokenKind::Amp:
    return "amp";
  case TokenKind::Pipe:
    return "pipe";
  case TokenKind::Caret:
    return "caret";
  case TokenKind::Tilde:
    return "tilde";
  case TokenKind::LessLess:
    return "less_less";
  case TokenKind::GreaterGreater:
    return "greater_greater";
  case TokenKind::EqualEqual:
    return "equal_equal";
  case TokenKind::NotEqual:
    return "not_equal";
  case TokenKind::Less:
    return "less";
  case TokenKind::LessEqual:
    return "less_equal";
  case TokenKind::Greater:
    return "greater";
  case TokenKind::GreaterEqual:
    return "greater_equal";
  }
  llvm_unreachable("unknown token kind");
}

namespace {

bool isIdentifierStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool isDigit(char c) { return c >= '0' && c <= '9'; }
bool isIdentifierChar(char c) { return isIdentifierStart(c) || isDigit(c); }

/// Walks the text once, keeping line and column.
class Lexer {
public:
  Lexer(DiagnosticEngine &diags) : diags(diags), text(diags.getText()) {}

  std::vector<Token> run() {
    std::vector<Token> tokens;
    while (true) {
      Token token = next();
      tokens.push_back(token);
      if (token.is(TokenKind::Eof))
        break;
    }
    return tokens;
  }

private:
  SourceLoc here() const {
    return SourceLoc{line, column, static_cast<uint32_t>(pos)};
  }
  char peek(size_t ahead = 0) const {
    return pos + ahead < text.size() ? text[pos + ahead] : '\0';
  }
  bool atEnd() const { return pos >= text.size(); }
  void advance() {
    if (atEnd())
      return;
    if (text[pos] == '\n') {
      ++line;
      column = 1;
    } else if ((static_cast<unsigned char>(text[pos]) & 0xC0) != 0x80) {
      ++column; // a UTF-8 continuation byte shares its character's column
    }
    ++pos;
  }

  Token make(TokenKind kind, SourceLoc begin) {
    Token token;
    token.kind = kind;
    token.range = SourceRange{begin, here()};
    token.text = text.slice(begin.offset, pos);
    return token;
  }

  Token next();
  Token lexNumber(SourceLoc begin);
  Token lexIdentifier(SourceLoc begin);
  Token lexBadCharacter(SourceLoc begin);

  DiagnosticEngine &diags;
  llvm::StringRef text;
  size_t pos = 0;
  uint32_t line = 1;
  uint32_t column = 1;
};

Token Lexer::next() {
  // Spaces, tabs, carriage returns and comments.
  while (!atEnd()) {
    char c = peek();
    if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
      advance();
    } else if (c == '#') {
      while (!atEnd() && peek() != '\n')
        advance();
    } else if (c == '\\' &&
               (peek(1) == '\n' || (peek(1) == '\r' && peek(2) == '\n'))) {
      // An explicit line continuation, as in Python.
      advance();
      while (!atEnd() && peek() != '\n')
        advance();
      advance();
    } else {
      break;
    }
  }
  SourceLoc begin = here();
  if (atEnd())
    return make(TokenKind::Eof, begin);

  char c = peek();
  if (c == '\n') {
    advance();
    Token token = make(TokenKind::Newline, begin);
    token.range.end = begin;
    token.range.end.offset = begin.offset + 1;
    token.range.end.column = begin.column + 1;
    return token;
  }
  if (isDigit(c) || (c == '.' && isDigit(peek(1))))
    return lexNumber(begin);
  if (isIdentifierStart(c))
    return lexIdentifier(begin);

  auto single = [&](TokenKind kind) {
    advance();
    return make(kind, begin);
  };
  auto twoWay = [&](char second, TokenKind two, TokenKind one) {
    advance();
    if (peek() == second) {
      advance();
      return make(two, begin);
    }
    return make(one, begin);
  };

  switch (c) {
  case '(':
    return single(TokenKind::LParen);
  case ')':
    return single(TokenKind::RParen);
  case '[':
    return single(TokenKind::LBracket);
  case ']':
    return single(TokenKind::RBracket);
  case '{':
    return single(TokenKind::LBrace);
  case '}':
    return single(TokenKind::RBrace);
  case ',':
    return single(TokenKind::Comma);
  case ':':
    return single(TokenKind::Colon);
  case ';':
    return single(TokenKind::Semicolon);
  case '?':
    return single(TokenKind::Question);
  case '+':
    return single(TokenKind::Plus);
  case '-':
    return single(TokenKind::Minus);
  case '%':
    return single(TokenKind::Percent);
  case '&':
    return single(TokenKind::Amp);
  case '|':
    return single(TokenKind::Pipe);
  case '^':
    return single(TokenKind::Caret);
  case '~':
    return single(TokenKind::Tilde);
  case '*':
    return twoWay('*', TokenKind::StarStar, TokenKind::Star);
  case '/':
    return twoWay('/', TokenKind::SlashSlash, TokenKind::Slash);
  case '=':
    return twoWay('=', TokenKind::EqualEqual, TokenKind::Assign);
  case '<':
    if (peek(1) == '<') {
      advance();
      return single(TokenKind::LessLess);
    }
    return twoWay('=', TokenKind::LessEqual, TokenKind::Less);
  case '>':
    if (peek(1) == '>') {
      advance();
      return single(TokenKind::GreaterGreater);
    }
    return twoWay('=', TokenKind::GreaterEqual, TokenKind::Greater);
  case '!':
    if (peek(1) == '=') {
      advance();
      return single(TokenKind::NotEqual);
    }
    break;
  default:
    break;
  }
  return lexBadCharacter(begin);
}

Token Lexer::lexBadCharacter(SourceLoc begin) {
  unsigned char c = static_cast<unsigned char>(peek());
  if (c >= 0x80) {
    // Take the whole UTF-8 sequence (lead byte and continuation bytes).
    advance();
    while (!atEnd() && (static_cast<unsigned char>(peek()) & 0xC0) == 0x80)
      advance();
    Token token = make(TokenKind::Error, begin);
    diags.error(token.range,
                "non-ASCII character in source; only ASCII is allowed outside "
                "comments");
    return token;
  }
  advance();
  Token token = make(TokenKind::Error, begin);
  if (c == '!')
    diags.error(
        token.range,
        "stray '!' in program; use 'not' (or '~') for negation and '!=' "
        "for inequality");
  else if (c == '\\')
    diags.error(
        token.range,
        "stray '\\' in program; a line continuation '\\' must end the line");
  else if (c >= 0x20 && c < 0x7f)
    diags.error(token.range, llvm::Twine("stray '") +
                                 llvm::Twine(static_cast<char>(c)) +
                                 "' in program");
  else
    diags.error(token.range, llvm::Twine("stray control character (code ") +
                                 llvm::Twine(static_cast<unsigned>(c)) +
                                 ") in program");
  return token;
}

Token Lexer::lexNumber(SourceLoc begin) {
  bool isFloat = false;
  while (isDigit(peek()))
    advance();
  if (peek() == '.' && isDigit(peek(1))) {
    isFloat = true;
    advance();
    while (isDigit(peek()))
      advance();
  } else if (peek() == '.' && !isIdentifierStart(peek(1))) {
    // `1.` is a float, as in Python.
    isFloat = true;
    advance();
  }
  bool badExponent = false;
  if (peek() == 'e' || peek() == 'E') {
    size_t ahead = 1;
    if (peek(1) == '+' || peek(1) == '-')
      ahead = 2;
    if (isDigit(peek(ahead))) {
      isFloat = true;
      for (size_t i = 0; i < ahead; ++i)
        advance();
      while (isDigit(peek()))
        advance();
    } else {
      badExponent = true;
    }
  }
  // Letters glued to a number (`12abc`, `1e`, `3f`) are a malformed literal.
  if (isIdentifierChar(peek()) || peek() == '.') {
    SourceLoc suffixBegin = here();
    while (isIdentifierChar(peek()) || peek() == '.')
      advance();
    Token token = make(TokenKind::Error, begin);
    if (badExponent)
      diags.error(token.range,
                  "expected digits after the exponent in '" + token.text + "'");
    else
      diags.error(token.range, "invalid suffix '" +
                                   text.slice(suffixBegin.offset, pos) +
                                   "' on number '" + token.text + "'");
    return token;
  }

  Token token = make(isFloat ? TokenKind::Float : TokenKind::Integer, begin);
  std::string spelling = token.text.str();
  if (isFloat) {
    token.floatValue = std::strtod(spelling.c_str(), nullptr);
    // Floats are f32: a literal that would round to infinity there is an
    // error (tiny ones that round to zero are fine).
    if (outsideF32Range(token.floatValue)) {
      diags.error(token.range, "float literal '" + token.text +
                                   "' is out of the range of a float " +
                                   kF32RangeText);
      token.kind = TokenKind::Error;
    }
    return token;
  }
  errno = 0;
  unsigned long long value = std::strtoull(spelling.c_str(), nullptr, 10);
  if (errno == ERANGE || value > static_cast<unsigned long long>(
                                     std::numeric_limits<int64_t>::max())) {
    diags.error(token.range,
                "integer literal '" + token.text + "' is too large");
    token.kind = TokenKind::Error;
    return token;
  }
  token.intValue = static_cast<int64_t>(value);
  return token;
}

Token Lexer::lexIdentifier(SourceLoc begin) {
  while (isIdentifierChar(peek()))
    advance();
  Token token = make(TokenKind::Identifier, begin);
  token.kind = llvm::StringSwitch<TokenKind>(token.text)
                   .Case("const", TokenKind::KwConst)
                   .Case("param", TokenKind::KwParam)
                   .Case("buffer", TokenKind::KwBuffer)
                   .Case("mask", TokenKind::KwMask)
                   .Case("score", TokenKind::KwScore)
                   .Case("let", TokenKind::KwLet)
                   .Case("true", TokenKind::KwTrue)
                   .Case("false", TokenKind::KwFalse)
                   .Case("inf", TokenKind::KwInf)
                   .Case("and", TokenKind::KwAnd)
                   .Case("or", TokenKind::KwOr)
                   .Case("not", TokenKind::KwNot)
                   .Default(TokenKind::Identifier);
  if (token.kind == TokenKind::KwInf)
    token.floatValue = std::numeric_limits<double>::infinity();
  return token;
}

} // namespace

std::vector<Token> pagedc::lex(DiagnosticEngine &diags) {
  return Lexer(diags).run();
}

void pagedc::dumpTokens(const std::vector<Token> &tokens,
                        llvm::raw_ostream &os) {
  for (const Token &token : tokens) {
    os << token.range.begin.line << ":" << token.range.begin.column << " "
       << tokenKindName(token.kind);
    if (token.isNot(TokenKind::Newline) && token.isNot(TokenKind::Eof))
      os << " '" << token.text << "'";
    os << "\n";
  }
}
