//===- Lexer.h - Tokens of the .attn language ------------------*- C++ -*-===//
//
// The lexer turns source text into tokens with positions. Comments (`#` to
// the end of the line) and spaces vanish; line ends become Newline tokens
// (the parser decides where they matter). Bad characters are reported and
// become Error tokens, so the parser can skip them without a second message.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_FRONTEND_LEXER_H
#define PAGEDC_FRONTEND_LEXER_H

#include "AST.h"
#include "Diagnostics.h"

#include <vector>

namespace pagedc {

enum class TokenKind : uint8_t {
  Eof,
  Newline,
  Error, ///< a bad character or number (already reported)
  Identifier,
  Integer,
  Float,
  // Keywords.
  KwConst,
  KwParam,
  KwBuffer,
  KwMask,
  KwScore,
  KwLet,
  KwTrue,
  KwFalse,
  KwInf,
  KwAnd,
  KwOr,
  KwNot,
  // Punctuation.
  LParen,
  RParen,
  LBracket,
  RBracket,
  LBrace,
  RBrace,
  Comma,
  Colon,
  Semicolon,
  Question,
  Assign,
  // Operators.
  Plus,
  Minus,
  Star,
  StarStar,
  Slash,
  SlashSlash,
  Percent,
  Amp,
  Pipe,
  Caret,
  Tilde,
  LessLess,
  GreaterGreater,
  EqualEqual,
  NotEqual,
  Less,
  LessEqual,
  Greater,
  GreaterEqual,
};

/// A stable lower-case name of a token kind ("identifier", "kw_const",
/// "star_star").
llvm::StringRef tokenKindName(TokenKind kind);

/// One token. `text` points into the DiagnosticEngine's buffer.
struct Token {
  TokenKind kind = TokenKind::Eof;
  llvm::StringRef text;
  ast::SourceRange range;
  int64_t intValue = 0;    ///< Integer
  double floatValue = 0.0; ///< Float (and KwInf: infinity)

  bool is(TokenKind k) const { return kind == k; }
  bool isNot(TokenKind k) const { return kind != k; }
};

/// Lexes the whole source of `diags`, reporting bad characters and malformed
/// numbers to it. The result always ends with one Eof token.
std::vector<Token> lex(DiagnosticEngine &diags);

/// Writes one line per token: `LINE:COL KIND 'TEXT'` (no text for Newline
/// and Eof). The form of `pagedc --emit=tokens`.
void dumpTokens(const std::vector<Token> &tokens, llvm::raw_ostream &os);

} // namespace pagedc

#endif // PAGEDC_FRONTEND_LEXER_H
