//===- Diagnostics.cpp - Clang-style diagnostics --------------------------===//

#include "Diagnostics.h"

#include "llvm/Support/MemoryBuffer.h"

using namespace pagedc;

DiagnosticEngine::DiagnosticEngine(llvm::StringRef name, llvm::StringRef text,
                                   llvm::raw_ostream &os, unsigned errorLimit)
    : fileName(name == "-" ? std::string("<stdin>") : name.str()), os(os),
      errorLimit(errorLimit == 0 ? 1 : errorLimit) {
  bufferId = sourceMgr.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, fileName),
                                          llvm::SMLoc());
}

llvm::StringRef DiagnosticEngine::getText() const {
  return sourceMgr.getMemoryBuffer(bufferId)->getBuffer();
}

llvm::StringRef DiagnosticEngine::getText(ast::SourceRange range) const {
  llvm::StringRef text = getText();
  if (range.begin.offset > text.size() || range.end.offset < range.begin.offset)
    return {};
  return text.slice(range.begin.offset, range.end.offset);
}

bool DiagnosticEngine::beginError() {
  ++numErrors;
  if (numErrors > errorLimit) {
    if (numErrors == errorLimit + 1)
      os << fileName << ": error: too many errors (more than " << errorLimit
         << "), stopping now\n";
    lastErrorPrinted = false;
    return false;
  }
  lastErrorPrinted = true;
  return true;
}

void DiagnosticEngine::print(ast::SourceRange range, llvm::SourceMgr::DiagKind kind,
                             const llvm::Twine &message) {
  llvm::StringRef text = getText();
  const char *start = text.data();
  size_t begin = std::min<size_t>(range.begin.offset, text.size());
  size_t end = std::min<size_t>(std::max(range.end.offset, range.begin.offset), text.size());
  llvm::SMLoc loc = llvm::SMLoc::getFromPointer(start + begin);
  llvm::SmallVector<llvm::SMRange, 1> ranges;
  if (end > begin + 1)
    ranges.push_back(llvm::SMRange(loc, llvm::SMLoc::getFromPointer(start + end)));
  sourceMgr.PrintMessage(os, loc, kind, message, ranges, {}, /*ShowColors=*/false);
}

void DiagnosticEngine::error(ast::SourceRange range, const llvm::Twine &message) {
  if (!beginError())
    return;
  print(range, llvm::SourceMgr::DK_Error, message);
}

void DiagnosticEngine::error(ast::SourceLoc loc, const llvm::Twine &message) {
  ast::SourceRange range{loc, loc};
  error(range, message);
}

void DiagnosticEngine::error(const llvm::Twine &message) {
  if (!beginError())
    return;
  os << fileName << ": error: " << message << "\n";
}

void DiagnosticEngine::note(ast::SourceRange range, const llvm::Twine &message) {
  if (!lastErrorPrinted)
    return;
  print(range, llvm::SourceMgr::DK_Note, message);
}
