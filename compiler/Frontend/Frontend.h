//===- Frontend.h - Parse and check a .attn file ---------------*- C++ -*-===//
//
// The entry points of the front end: parse() builds the AST, analyze() checks
// and annotates it (see the guarantees at the top of AST.h), and
// parseAndAnalyze() does both. dumpAST() prints the tree for
// `pagedc --emit=ast`.
//
// Typical use:
//
//   pagedc::DiagnosticEngine diags(fileName, text, llvm::errs());
//   pagedc::FrontendOptions options;            // -D overrides, if any
//   std::unique_ptr<pagedc::ast::Program> program =
//       pagedc::parseAndAnalyze(diags, options);
//   if (!program) return 1;                     // errors were printed
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_FRONTEND_FRONTEND_H
#define PAGEDC_FRONTEND_FRONTEND_H

#include "AST.h"
#include "Diagnostics.h"
#include "Lexer.h"

#include <memory>
#include <string>
#include <vector>

namespace pagedc {

/// `-D NAME=VALUE`: replaces the value of constant NAME.
struct ConstOverride {
  std::string name;
  /// An int or float literal, optionally negative ("4096", "-1", "0.5",
  /// "1e-3", "inf").
  std::string value;
};

/// Settings of one front-end run.
struct FrontendOptions {
  std::vector<ConstOverride> constOverrides;
};

/// Parses a -D value strictly (pagedc/ConstOverride.h: the whole text is an
/// int literal that fits in i32, a finite float literal or inf, with at most
/// one leading '-'). False otherwise, with the reason in `*reason`.
bool parseOverrideValue(llvm::StringRef text, ast::ConstantValue &result,
                        std::string *reason = nullptr);

/// Parses the tokens into a Program. Items with syntax errors are reported
/// and dropped (their names land in Program::droppedItemNames); never null.
std::unique_ptr<ast::Program> parse(const std::vector<Token> &tokens,
                                    DiagnosticEngine &diags);

/// Checks and annotates `program` in place. Returns false when any error was
/// reported (also errors left by the parser in `diags`).
bool analyze(ast::Program &program, DiagnosticEngine &diags,
             const FrontendOptions &options);

/// Lexes, parses and analyzes the source of `diags`. Returns null when any
/// error was reported; every independent error is reported (up to the
/// engine's limit).
std::unique_ptr<ast::Program> parseAndAnalyze(DiagnosticEngine &diags,
                                              const FrontendOptions &options);

/// Prints the tree as indented text, with types once Sema has run. The form
/// of `pagedc --emit=ast`.
void dumpAST(const ast::Program &program, llvm::raw_ostream &os);

} // namespace pagedc

#endif // PAGEDC_FRONTEND_FRONTEND_H
