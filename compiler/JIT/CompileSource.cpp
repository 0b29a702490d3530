//===- CompileSource.cpp - CompiledMods straight from .attn text ----------===//

#include "JIT/CompileSource.h"

#include "Frontend/MLIRGen.h"
#include "Pipeline.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/MemoryBuffer.h"

using namespace pagedc;
using namespace pagedc::jit;

namespace {

llvm::Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 message.str());
}

/// Parses and checks `source`; null after printing the errors.
llvm::Expected<std::unique_ptr<ast::Program>>
analyzeSource(llvm::StringRef fileName, llvm::StringRef source,
              const SourceCompileOptions &options,
              llvm::raw_ostream &diagnostics) {
  unsigned errors = 0;
  std::unique_ptr<ast::Program> program;
  {
    DiagnosticEngine diags(fileName, source, diagnostics);
    FrontendOptions frontend;
    frontend.constOverrides = options.constOverrides;
    program = parseAndAnalyze(diags, frontend);
    errors = diags.getNumErrors();
  } // flushes the diagnostics
  if (!program)
    return makeError(fileName + ": " + llvm::Twine(errors) +
                     (errors == 1 ? " error" : " errors"));
  return program;
}

} // namespace

llvm::Expected<CompiledMods> pagedc::jit::compileModsFromSource(
    llvm::StringRef fileName, llvm::StringRef source, llvm::StringRef mask,
    llvm::StringRef score, const SourceCompileOptions &options,
    llvm::raw_ostream &diagnostics) {
  auto program = analyzeSource(fileName, source, options, diagnostics);
  if (!program)
    return program.takeError();
  // Name the selection's problems before MLIR does, in the user's terms.
  for (auto [name, wantMask] : {std::pair{mask, true}, std::pair{score, false}}) {
    if (name.empty())
      continue;
    const ast::ModDecl *mod = (*program)->findMod(name);
    const char *kind = wantMask ? "mask" : "score";
    if (!mod)
      return makeError(fileName + ": no " + kind + " mod named '" + name + "'");
    bool isMask = mod->getModKind() == ast::ModDecl::ModKind::Mask;
    if (isMask != wantMask)
      return makeError(fileName + ": '" + name + "' is a " +
                       (isMask ? "mask" : "score") + " mod, not a " + kind +
                       " mod");
  }

  mlir::MLIRContext context(mlir::MLIRContext::Threading::DISABLED);
  std::string mlirErrors;
  llvm::raw_string_ostream mlirErrorStream(mlirErrors);
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    mlirErrorStream << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });
  mlir::DialectRegistry registry;
  registerFlexDialects(registry);
  context.appendDialectRegistry(registry);
  mlir::OwningOpRef<mlir::ModuleOp> module = mlirGen(context, **program);
  if (!module)
    return makeError(fileName + ": MLIR generation failed:\n" + mlirErrors);

  PipelineOptions pipeline;
  for (llvm::StringRef name : {mask, score})
    if (!name.empty())
      pipeline.keepMods.push_back(name.str());
  mlir::PassManager pm(&context);
  buildPipeline(pm, pipeline);
  if (pipeline.keepMods.empty()) {
    // Nothing selected: no mods to compile, and no declarations needed.
    CompiledMods none;
    return none;
  }
  if (mlir::failed(pm.run(*module)))
    return makeError(fileName + ": the pass pipeline failed:\n" + mlirErrors);
  return compileMods(*module, mask, score, options.jit);
}

llvm::Expected<CompiledMods> pagedc::jit::compileModsFromFile(
    llvm::StringRef path, llvm::StringRef mask, llvm::StringRef score,
    const SourceCompileOptions &options, llvm::raw_ostream &diagnostics) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buffer)
    return makeError(path + ": cannot read: " + buffer.getError().message());
  return compileModsFromSource(path, (*buffer)->getBuffer(), mask, score,
                               options, diagnostics);
}

llvm::Expected<std::vector<ModSummary>> pagedc::jit::listModsInSource(
    llvm::StringRef fileName, llvm::StringRef source,
    const SourceCompileOptions &options, llvm::raw_ostream &diagnostics) {
  auto program = analyzeSource(fileName, source, options, diagnostics);
  if (!program)
    return program.takeError();
  std::vector<ModSummary> mods;
  for (const auto &mod : (*program)->mods)
    mods.push_back({mod->getName().str(),
                    mod->getModKind() == ast::ModDecl::ModKind::Mask});
  return mods;
}
