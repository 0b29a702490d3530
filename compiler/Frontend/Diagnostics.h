//===- Diagnostics.h - Source buffer and clang-style diagnostics -*- C++
//-*-===//
//
// A DiagnosticEngine owns the text of one .attn file and reports errors as
//
//   file:line:col: error: message
//   <the source line>
//       ^~~~
//
// each followed by its notes in the same form. Diagnostics are collected and
// printed sorted by position (file-level ones first) when the engine is
// flushed or destroyed, so errors found by different phases read top to
// bottom. At most `errorLimit` errors are printed; a last line says how many
// more there were. Columns count characters (a UTF-8 sequence is one).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_FRONTEND_DIAGNOSTICS_H
#define PAGEDC_FRONTEND_DIAGNOSTICS_H

#include "AST.h"

#include "llvm/ADT/Twine.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace pagedc {

/// Owns one source file and reports diagnostics about it.
class DiagnosticEngine {
public:
  /// The default number of errors printed.
  static constexpr unsigned kDefaultErrorLimit = 20;

  /// `fileName` is what messages print ("-" is shown as "<stdin>"); `text` is
  /// copied. Diagnostics go to `os`.
  DiagnosticEngine(llvm::StringRef fileName, llvm::StringRef text,
                   llvm::raw_ostream &os,
                   unsigned errorLimit = kDefaultErrorLimit);
  /// Flushes what is left.
  ~DiagnosticEngine();
  DiagnosticEngine(const DiagnosticEngine &) = delete;
  DiagnosticEngine &operator=(const DiagnosticEngine &) = delete;

  /// The file name used in messages.
  llvm::StringRef getFileName() const { return fileName; }
  /// The source text.
  llvm::StringRef getText() const { return text; }
  /// The source text a range covers.
  llvm::StringRef getText(ast::SourceRange range) const;

  /// Reports an error over `range` (the caret at its start, `~` under the
  /// rest of it on the same line).
  void error(ast::SourceRange range, const llvm::Twine &message);
  /// Reports an error at one position.
  void error(ast::SourceLoc loc, const llvm::Twine &message);
  /// Reports an error about the file as a whole: "file: error: message".
  void error(const llvm::Twine &message);
  /// Attaches a note to the last error.
  void note(ast::SourceRange range, const llvm::Twine &message);

  /// Errors reported so far (printed or not).
  unsigned getNumErrors() const { return numErrors; }
  bool hasErrors() const { return numErrors != 0; }
  /// True once so many errors were reported that looking for more is
  /// pointless (ten times the print limit).
  bool shouldStop() const { return numErrors >= 10 * errorLimit; }

  /// Prints the collected diagnostics, sorted by position, and forgets them.
  void flush();

private:
  struct Diagnostic {
    bool isNote = false;
    bool hasLocation = true;
    ast::SourceRange range;
    std::string message;
  };
  /// One error and its notes.
  struct Group {
    std::vector<Diagnostic> entries;
  };
  void print(const Diagnostic &diagnostic);

  std::string fileName;
  std::string text;
  llvm::raw_ostream &os;
  unsigned errorLimit;
  unsigned numErrors = 0;
  unsigned numPrinted = 0;
  std::vector<Group> pending;
};

} // namespace pagedc

#endif // PAGEDC_FRONTEND_DIAGNOSTICS_H
