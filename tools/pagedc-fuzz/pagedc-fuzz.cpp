//===- pagedc-fuzz.cpp - Mutation fuzzer of the .attn front end -----------===//
//
// Takes a corpus of .attn files (files or directories), applies seeded random
// mutations (byte flips, truncations, token deletions / duplications / swaps,
// inserted characters) and runs the front end on each, in process. A run
// fails when the front end crashes, when it rejects a file without reporting
// an error, or when it accepts a file whose AST breaks a Sema guarantee
// (AST.h). With --pagedc=PATH it also runs the real binary on some of the
// mutants and requires exit status 0 or 1.
//
//   pagedc-fuzz [--seed=N] [--mutations=N] [--pagedc=PATH --spawn=N] PATHS...
//
// The same seed gives the same mutants. A failing mutant is written to
// pagedc-fuzz-failure.attn in the current directory.
//
//===----------------------------------------------------------------------===//

#include "Frontend/Frontend.h"
#include "pagedc/ProgramFile.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <random>
#include <string>
#include <vector>

using namespace pagedc;
using namespace pagedc::ast;

namespace {

struct Settings {
  uint64_t seed = 1;
  unsigned mutations = 10000;
  std::string pagedcPath;
  unsigned spawnCount = 0;
  std::vector<std::string> inputs;
};

//===----------------------------------------------------------------------===//
// Mutations
//===----------------------------------------------------------------------===//

class Mutator {
public:
  explicit Mutator(uint64_t seed) : random(seed) {}

  /// Applies 1-3 random mutations to `text`.
  std::string mutate(std::string text) {
    unsigned count = pick(1, 3);
    for (unsigned i = 0; i < count; ++i)
      text = mutateOnce(std::move(text));
    return text;
  }

  unsigned pick(unsigned low, unsigned high) {
    return std::uniform_int_distribution<unsigned>(low, high)(random);
  }

private:
  /// Token boundaries of `text`, from the real lexer (errors ignored).
  std::vector<std::pair<size_t, size_t>> tokenSpans(const std::string &text) {
    std::string ignored;
    llvm::raw_string_ostream sink(ignored);
    DiagnosticEngine diags("mutant", text, sink);
    std::vector<std::pair<size_t, size_t>> spans;
    for (const Token &token : lex(diags))
      if (token.isNot(TokenKind::Eof))
        spans.push_back({token.range.begin.offset, token.range.end.offset});
    return spans;
  }

  std::string mutateOnce(std::string text) {
    static const char kInteresting[] =
        "()[]{}=,:;?#\n\t -+*/%&|^~<>!.0123456789eE_qkvbhs\\\"'$@`";
    switch (pick(0, 6)) {
    case 0: { // flip bits of one byte (may make it non-ASCII)
      if (text.empty())
        return text;
      size_t at = pick(0, text.size() - 1);
      text[at] = static_cast<char>(text[at] ^ (1u << pick(0, 7)));
      return text;
    }
    case 1: // truncate
      return text.substr(0, text.empty() ? 0 : pick(0, text.size() - 1));
    case 2: { // insert an interesting or arbitrary byte
      size_t at = text.empty() ? 0 : pick(0, text.size());
      char c = pick(0, 3) == 0
                   ? static_cast<char>(pick(0, 255))
                   : kInteresting[pick(0, sizeof(kInteresting) - 2)];
      text.insert(text.begin() + at, c);
      return text;
    }
    default:
      break;
    }
    std::vector<std::pair<size_t, size_t>> spans = tokenSpans(text);
    if (spans.empty())
      return text;
    auto span = spans[pick(0, spans.size() - 1)];
    std::string token = text.substr(span.first, span.second - span.first);
    switch (pick(3, 6)) {
    case 3: // delete a token
      text.erase(span.first, span.second - span.first);
      return text;
    case 4: // duplicate a token
      text.insert(span.second, " " + token);
      return text;
    case 5: { // swap two tokens
      auto other = spans[pick(0, spans.size() - 1)];
      if (other.first < span.first)
        std::swap(other, span);
      if (other.first < span.second)
        return text; // the same token
      std::string first = text.substr(span.first, span.second - span.first);
      std::string second = text.substr(other.first, other.second - other.first);
      text.replace(other.first, other.second - other.first, first);
      text.replace(span.first, span.second - span.first, second);
      return text;
    }
    default: { // copy a token somewhere else
      size_t at = pick(0, text.size());
      text.insert(at, " " + token + " ");
      return text;
    }
    }
  }

  std::mt19937_64 random;
};

//===----------------------------------------------------------------------===//
// Sema's guarantees (AST.h), checked on every accepted mutant
//===----------------------------------------------------------------------===//

class InvariantChecker {
public:
  /// Returns the first violation, or an empty string.
  std::string check(const Program &program) {
    for (const auto &mod : program.mods) {
      for (const auto &let : mod->getLets())
        visit(*let->init);
      visit(*mod->getResult());
      if (mod->getResult()->getType() != mod->getResultType())
        fail("result of '" + mod->getName().str() + "' has type " +
             typeName(mod->getResult()->getType()).str());
    }
    for (const auto &decl : program.consts) {
      Type type = decl->getValue().type;
      if (type != Type::I32 && type != Type::F32)
        fail("constant '" + decl->getName().str() +
             "' has no int or float value");
      if (type == Type::I32 && (decl->getValue().intValue > INT32_MAX ||
                                decl->getValue().intValue < INT32_MIN))
        fail("constant '" + decl->getName().str() + "' does not fit in i32");
    }
    return violation;
  }

private:
  void fail(const std::string &message) {
    if (violation.empty())
      violation = message;
  }

  void visit(const Expr &expr) {
    Type type = expr.getType();
    if (type == Type::Unknown)
      fail("an expression without a type");
    if (auto *name = llvm::dyn_cast<NameExpr>(&expr)) {
      if (name->getRefKind() == NameExpr::RefKind::Unresolved)
        fail("unresolved name '" + name->getName().str() + "'");
    } else if (auto *unary = llvm::dyn_cast<UnaryExpr>(&expr)) {
      visit(*unary->getOperand());
      Type operand = unary->getOperand()->getType();
      if (unary->getOp() == UnaryOp::BitNot && !isInteger(operand))
        fail("'~' on a non-integer after Sema");
      if (unary->getOp() == UnaryOp::LogicalNot && operand != Type::Bool)
        fail("'not' on a non-bool");
      if (unary->getOp() == UnaryOp::Neg && !isNumeric(operand))
        fail("'-' on a non-number");
    } else if (auto *binary = llvm::dyn_cast<BinaryExpr>(&expr)) {
      visit(*binary->getLHS());
      visit(*binary->getRHS());
      Type lhs = binary->getLHS()->getType(), rhs = binary->getRHS()->getType();
      if (lhs != rhs)
        fail("operands of '" + binaryOpSpelling(binary->getOp()).str() +
             "' differ in type");
      if (binary->getOp() == BinaryOp::TrueDiv && lhs != Type::F32)
        fail("'/' on non-f32 operands");
      if (isComparison(binary->getOp()) != (type == Type::Bool) &&
          lhs != Type::Bool)
        fail("comparison result type");
    } else if (auto *call = llvm::dyn_cast<CallExpr>(&expr)) {
      for (unsigned i = 0; i < call->getNumArgs(); ++i)
        visit(*call->getArg(i));
      if (call->isBuiltin() == (call->getCallee() != nullptr))
        fail("call '" + call->getCalleeName().str() +
             "' is not resolved to exactly one target");
      if (call->isBuiltin() && (call->getBuiltin() == Builtin::Float ||
                                call->getBuiltin() == Builtin::Int))
        fail("float()/int() left as a call");
      if (const ModDecl *callee = call->getCallee()) {
        if (call->getNumArgs() != callee->getExpectedArity())
          fail("mod call with the wrong number of arguments");
        for (unsigned i = 0;
             i < call->getNumArgs() && i < callee->getExpectedArity(); ++i)
          if (call->getArg(i)->getType() != callee->getParamType(i))
            fail("mod call argument not cast to the parameter type");
      }
    } else if (auto *index = llvm::dyn_cast<IndexExpr>(&expr)) {
      if (!index->getBuffer())
        fail("unresolved buffer read");
      else if (index->getNumIndices() != index->getBuffer()->getRank())
        fail("buffer read with the wrong number of indices");
      for (unsigned i = 0; i < index->getNumIndices(); ++i) {
        visit(*index->getIndex(i));
        if (!isInteger(index->getIndex(i)->getType()))
          fail("non-integer buffer index");
      }
    } else if (auto *cast = llvm::dyn_cast<CastExpr>(&expr)) {
      visit(*cast->getOperand());
      if (type == Type::Bool)
        fail("a cast to bool");
    }
  }

  std::string violation;
};

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

bool parseArguments(int argc, char **argv, Settings &settings) {
  for (int i = 1; i < argc; ++i) {
    llvm::StringRef arg = argv[i];
    if (arg.consume_front("--seed=")) {
      if (arg.getAsInteger(10, settings.seed))
        return false;
    } else if (arg.consume_front("--mutations=")) {
      if (arg.getAsInteger(10, settings.mutations))
        return false;
    } else if (arg.consume_front("--pagedc=")) {
      settings.pagedcPath = arg.str();
    } else if (arg.consume_front("--spawn=")) {
      if (arg.getAsInteger(10, settings.spawnCount))
        return false;
    } else if (arg.starts_with("-")) {
      return false;
    } else {
      settings.inputs.push_back(arg.str());
    }
  }
  return !settings.inputs.empty() &&
         (settings.spawnCount == 0 || !settings.pagedcPath.empty());
}

/// Reads every input; directories contribute their *.attn files (sorted, so
/// the corpus order and hence the mutants are stable).
bool loadCorpus(const Settings &settings, std::vector<std::string> &corpus) {
  std::vector<std::string> paths;
  for (const std::string &input : settings.inputs) {
    if (!llvm::sys::fs::is_directory(input)) {
      paths.push_back(input);
      continue;
    }
    std::vector<std::string> found;
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(input, ec), end; it != end && !ec;
         it.increment(ec))
      if (llvm::sys::path::extension(it->path()) == ".attn")
        found.push_back(it->path());
    llvm::sort(found);
    paths.insert(paths.end(), found.begin(), found.end());
  }
  for (const std::string &path : paths) {
    // The seeds are programs: read them with the limit of every reader.
    std::string text;
    std::string error = pagedc::readProgramFile(path, text);
    if (!error.empty()) {
      llvm::errs() << "pagedc-fuzz: " << error << "\n";
      return false;
    }
    corpus.push_back(std::move(text));
  }
  return !corpus.empty();
}

void saveFailure(const std::string &mutant) {
  std::error_code ec;
  llvm::raw_fd_ostream out("pagedc-fuzz-failure.attn", ec);
  if (!ec)
    out << mutant;
}

/// Runs the front end on one mutant; returns a failure description or "".
std::string runInProcess(const std::string &mutant, bool &accepted) {
  std::string diagnostics;
  llvm::raw_string_ostream diagnosticStream(diagnostics);
  std::unique_ptr<Program> program;
  {
    DiagnosticEngine diags("mutant.attn", mutant, diagnosticStream);
    std::vector<Token> tokens = lex(diags);
    std::string dump;
    llvm::raw_string_ostream dumpStream(dump);
    dumpTokens(tokens, dumpStream);
    program = parse(tokens, diags);
    bool ok = analyze(*program, diags, FrontendOptions());
    accepted = ok;
    if (!ok && !diags.hasErrors())
      return "rejected without an error";
    if (ok && diags.hasErrors())
      return "accepted with errors";
    if (ok)
      dumpAST(*program, dumpStream);
  }
  if (!accepted && diagnostics.find(": error: ") == std::string::npos)
    return "rejected but printed no error";
  if (accepted)
    return InvariantChecker().check(*program);
  return "";
}

} // namespace

int main(int argc, char **argv) {
  Settings settings;
  if (!parseArguments(argc, argv, settings)) {
    llvm::errs() << "usage: pagedc-fuzz [--seed=N] [--mutations=N] "
                    "[--pagedc=PATH --spawn=N] "
                    "FILE_OR_DIR...\n";
    return 2;
  }
  std::vector<std::string> corpus;
  if (!loadCorpus(settings, corpus))
    return 2;

  // The unmutated corpus must be accepted.
  for (const std::string &text : corpus) {
    bool accepted = false;
    std::string failure = runInProcess(text, accepted);
    if (!failure.empty() || !accepted) {
      saveFailure(text);
      llvm::errs() << "pagedc-fuzz: a corpus file fails: "
                   << (failure.empty() ? "rejected" : failure) << "\n";
      return 1;
    }
  }

  Mutator mutator(settings.seed);
  unsigned acceptedCount = 0;
  for (unsigned i = 0; i < settings.mutations; ++i) {
    std::string mutant = mutator.mutate(corpus[i % corpus.size()]);
    bool accepted = false;
    std::string failure = runInProcess(mutant, accepted);
    if (!failure.empty()) {
      saveFailure(mutant);
      llvm::errs() << "pagedc-fuzz: mutant " << i << " (seed " << settings.seed
                   << "): " << failure
                   << "; saved as pagedc-fuzz-failure.attn\n";
      return 1;
    }
    acceptedCount += accepted;
  }
  llvm::outs() << "pagedc-fuzz: seed " << settings.seed << ": "
               << settings.mutations << " in-process runs over "
               << corpus.size() << " files, " << acceptedCount << " accepted, "
               << settings.mutations - acceptedCount << " rejected\n";

  if (settings.spawnCount == 0)
    return 0;
  llvm::ErrorOr<std::string> pagedc =
      llvm::sys::findProgramByName(settings.pagedcPath);
  if (!pagedc) {
    llvm::errs() << "pagedc-fuzz: cannot find '" << settings.pagedcPath
                 << "'\n";
    return 2;
  }
  llvm::SmallString<128> mutantPath;
  if (std::error_code ec = llvm::sys::fs::createTemporaryFile(
          "pagedc-fuzz", "attn", mutantPath)) {
    llvm::errs() << "pagedc-fuzz: cannot create a temporary file: "
                 << ec.message() << "\n";
    return 2;
  }
  unsigned exitCounts[2] = {0, 0};
  Mutator spawnMutator(settings.seed + 1);
  for (unsigned i = 0; i < settings.spawnCount; ++i) {
    std::string mutant = spawnMutator.mutate(corpus[i % corpus.size()]);
    {
      std::error_code ec;
      llvm::raw_fd_ostream out(mutantPath, ec);
      out << mutant;
    }
    std::optional<llvm::StringRef> redirects[] = {
        llvm::StringRef(""), llvm::StringRef(""), llvm::StringRef("")};
    std::string errorMessage;
    llvm::StringRef args[] = {*pagedc, mutantPath};
    int status =
        llvm::sys::ExecuteAndWait(*pagedc, args, std::nullopt, redirects,
                                  /*SecondsToWait=*/60, 0, &errorMessage);
    if (status != 0 && status != 1) {
      saveFailure(mutant);
      llvm::errs() << "pagedc-fuzz: pagedc exited with status " << status
                   << " on spawned mutant " << i << " (seed " << settings.seed
                   << ")" << (errorMessage.empty() ? "" : ": ") << errorMessage
                   << "; saved as pagedc-fuzz-failure.attn\n";
      llvm::sys::fs::remove(mutantPath);
      return 1;
    }
    ++exitCounts[status];
  }
  llvm::sys::fs::remove(mutantPath);
  llvm::outs() << "pagedc-fuzz: " << settings.spawnCount
               << " pagedc runs: " << exitCounts[0] << " exited 0, "
               << exitCounts[1] << " exited 1\n";
  return 0;
}
