//===- CompileSource.h - CompiledMods straight from .attn text -*- C++ -*-===//
//
// The whole CPU path in one call: front end (parse, Sema, -D overrides),
// MLIRGen, the pass pipeline (compiler/Pipeline.h, keeping only the selected
// mods) and compileMods(). Used by `pagedc run`, the demo and the corpus
// tests.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_JIT_COMPILESOURCE_H
#define PAGEDC_JIT_COMPILESOURCE_H

#include "Frontend/Frontend.h"
#include "JIT/ModJit.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace pagedc::jit {

/// One mod of a program, as listModsInSource() reports it.
struct ModSummary {
  std::string name;
  bool isMask = true;
};

/// What compileModsFromSource() compiles.
struct SourceCompileOptions {
  std::vector<ConstOverride> constOverrides; ///< -D NAME=VALUE
  JitOptions jit;
  /// Also generate the CUDA mod code (CompiledMods::cuda.modCode) for the
  /// kernel cache. Off by default: the CPU path does no CUDA work. An error
  /// when this build has no CUDA code generator (cudaCodeGenAvailable()).
  bool withCuda = false;
};

/// Whether this build can fill CompiledMods::cuda (the CUDA target library
/// was linked in); when false, SourceCompileOptions::withCuda is an error.
bool cudaCodeGenAvailable();

/// Compiles mask `mask` and score `score` (either may be empty) of the .attn
/// program `source`. Front-end errors are printed to `diagnostics` in the
/// usual file:line:col form; the returned error then only says how many
/// there were. Other errors (a missing mod, a mod of the wrong kind) come
/// back in the llvm::Error.
llvm::Expected<CompiledMods>
compileModsFromSource(llvm::StringRef fileName, llvm::StringRef source,
                      llvm::StringRef mask, llvm::StringRef score,
                      const SourceCompileOptions &options,
                      llvm::raw_ostream &diagnostics);

/// compileModsFromSource() on the contents of the file at `path` ("-":
/// standard input), read through pagedc/ProgramFile.h: at most
/// kMaxProgramBytes, else an error naming the file and the limit.
llvm::Expected<CompiledMods>
compileModsFromFile(llvm::StringRef path, llvm::StringRef mask,
                    llvm::StringRef score, const SourceCompileOptions &options,
                    llvm::raw_ostream &diagnostics);

/// The mods of a .attn program in source order (front-end errors are
/// printed to `diagnostics`).
llvm::Expected<std::vector<ModSummary>>
listModsInSource(llvm::StringRef fileName, llvm::StringRef source,
                 const SourceCompileOptions &options,
                 llvm::raw_ostream &diagnostics);

} // namespace pagedc::jit

#endif // PAGEDC_JIT_COMPILESOURCE_H
