//===- Diagnostics.h - Source buffer and clang-style diagnostics -*- C++ -*-===//
//
// A DiagnosticEngine owns the text of one .attn file and prints errors as
//
//   file:line:col: error: message
//   <the source line>
//       ^~~~
//
// followed by any notes in the same form. It counts errors and stops printing
// after a limit (a final "too many errors" line says so).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_FRONTEND_DIAGNOSTICS_H
#define PAGEDC_FRONTEND_DIAGNOSTICS_H

#include "AST.h"

#include "llvm/ADT/Twine.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

namespace pagedc {

/// Owns one source file and reports diagnostics about it.
class DiagnosticEngine {
public:
  /// The default number of errors printed before giving up.
  static constexpr unsigned kDefaultErrorLimit = 20;

  /// `fileName` is what messages print ("-" is shown as "<stdin>"); `text` is
  /// copied. Diagnostics go to `os`.
  DiagnosticEngine(llvm::StringRef fileName, llvm::StringRef text, llvm::raw_ostream &os,
                   unsigned errorLimit = kDefaultErrorLimit);

  /// The file name used in messages.
  llvm::StringRef getFileName() const { return fileName; }
  /// The source text.
  llvm::StringRef getText() const;
  /// The source text a range covers.
  llvm::StringRef getText(ast::SourceRange range) const;

  /// Reports an error over `range` (the caret at its start, `~` under the rest).
  void error(ast::SourceRange range, const llvm::Twine &message);
  /// Reports an error at one position.
  void error(ast::SourceLoc loc, const llvm::Twine &message);
  /// Reports an error about the file as a whole (no line): "file: error: ...".
  void error(const llvm::Twine &message);
  /// Attaches a note to the last error (dropped if that error was dropped).
  void note(ast::SourceRange range, const llvm::Twine &message);

  /// Errors reported so far, including those past the limit.
  unsigned getNumErrors() const { return numErrors; }
  bool hasErrors() const { return numErrors != 0; }
  /// True once more errors than the limit were reported (the last one was
  /// replaced by a "too many errors" line): callers should stop looking.
  bool shouldStop() const { return numErrors > errorLimit; }

private:
  bool beginError();
  void print(ast::SourceRange range, llvm::SourceMgr::DiagKind kind, const llvm::Twine &message);

  std::string fileName;
  llvm::SourceMgr sourceMgr;
  unsigned bufferId = 0;
  llvm::raw_ostream &os;
  unsigned errorLimit;
  unsigned numErrors = 0;
  bool lastErrorPrinted = false;
};

} // namespace pagedc

#endif // PAGEDC_FRONTEND_DIAGNOSTICS_H
