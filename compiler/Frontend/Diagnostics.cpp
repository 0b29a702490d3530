//===- Diagnostics.cpp - Clang-style diagnostics --------------------------===//

#include "Diagnostics.h"

#include <algorithm>

using namespace pagedc;

DiagnosticEngine::DiagnosticEngine(llvm::StringRef name, llvm::StringRef text,
                                   llvm::raw_ostream &os, unsigned errorLimit)
    : fileName(name == "-" ? std::string("<stdin>") : name.str()),
      text(text.str()), os(os), errorLimit(errorLimit == 0 ? 1 : errorLimit) {}

DiagnosticEngine::~DiagnosticEngine() { flush(); }

llvm::StringRef DiagnosticEngine::getText(ast::SourceRange range) const {
  llvm::StringRef all = text;
  if (range.begin.offset > all.size() || range.end.offset < range.begin.offset)
    return {};
  return all.slice(range.begin.offset, range.end.offset);
}

void DiagnosticEngine::error(ast::SourceRange range,
                             const llvm::Twine &message) {
  ++numErrors;
  Group group;
  group.entries.push_back(Diagnostic{false, true, range, message.str()});
  pending.push_back(std::move(group));
}

void DiagnosticEngine::error(ast::SourceLoc loc, const llvm::Twine &message) {
  error(ast::SourceRange{loc, loc}, message);
}

void DiagnosticEngine::error(const llvm::Twine &message) {
  ++numErrors;
  Group group;
  group.entries.push_back(Diagnostic{false, false, {}, message.str()});
  pending.push_back(std::move(group));
}

void DiagnosticEngine::note(ast::SourceRange range,
                            const llvm::Twine &message) {
  if (pending.empty())
    return;
  pending.back().entries.push_back(
      Diagnostic{true, true, range, message.str()});
}

void DiagnosticEngine::flush() {
  // File-level errors first, then by position; equal positions keep the
  // order they were reported in.
  std::stable_sort(
      pending.begin(), pending.end(), [](const Group &a, const Group &b) {
        const Diagnostic &x = a.entries.front(), &y = b.entries.front();
        if (x.hasLocation != y.hasLocation)
          return !x.hasLocation;
        return x.range.begin.offset < y.range.begin.offset;
      });
  unsigned skipped = 0;
  for (const Group &group : pending) {
    if (numPrinted >= errorLimit) {
      ++skipped;
      continue;
    }
    ++numPrinted;
    for (const Diagnostic &diagnostic : group.entries)
      print(diagnostic);
  }
  if (skipped)
    os << fileName << ": error: too many errors; " << skipped
       << " more not shown (the limit is " << errorLimit << ")\n";
  pending.clear();
  os.flush();
}

/// Display width of a UTF-8 string: continuation bytes take no column.
static unsigned displayWidth(llvm::StringRef text) {
  unsigned width = 0;
  for (char c : text)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80)
      ++width;
  return width;
}

void DiagnosticEngine::print(const Diagnostic &diagnostic) {
  const char *kind = diagnostic.isNote ? "note" : "error";
  if (!diagnostic.hasLocation) {
    os << fileName << ": " << kind << ": " << diagnostic.message << "\n";
    return;
  }
  llvm::StringRef all = text;
  size_t begin = std::min<size_t>(diagnostic.range.begin.offset, all.size());
  size_t end = std::min<size_t>(
      std::max(diagnostic.range.end.offset, diagnostic.range.begin.offset),
      all.size());
  os << fileName << ":" << diagnostic.range.begin.line << ":"
     << diagnostic.range.begin.column << ": " << kind << ": "
     << diagnostic.message << "\n";

  // The source line, then the caret line. Tabs are kept in the caret line so
  // that the caret stays under the right character.
  size_t lastNewline = all.slice(0, begin).rfind('\n');
  size_t lineStart = lastNewline == llvm::StringRef::npos ? 0 : lastNewline + 1;
  size_t lineEnd = all.find('\n', begin);
  if (lineEnd == llvm::StringRef::npos)
    lineEnd = all.size();
  llvm::StringRef line = all.slice(lineStart, lineEnd).rtrim("\r");
  os << line << "\n";
  std::string caret;
  for (char c : all.slice(lineStart, begin))
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80)
      caret += c == '\t' ? '\t' : ' ';
  caret += '^';
  size_t underlineEnd = std::min(end, lineEnd);
  if (underlineEnd > begin + 1) {
    unsigned width = displayWidth(all.slice(begin, underlineEnd));
    if (width > 1)
      caret.append(width - 1, '~');
  }
  os << caret << "\n";
}
