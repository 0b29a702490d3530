//===- CompileSource.cpp - CompiledMods straight from .attn text ----------===//

#include "JIT/CompileSource.h"

#include "Frontend/MLIRGen.h"
#include "Pipeline.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "pagedc/ProgramFile.h"

#ifdef PAGEDC_HAVE_CUDA_TARGET
#include "Conversion/CUDA/FlexToEmitC.h"
#include "Target/CudaSource.h"
#endif

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
  // Text handed over in memory (the Python API's str) is held to the limit
  // of program files too.
  if (source.size() > static_cast<uint64_t>(kMaxProgramBytes))
    return makeError(programTooLarge(fileName.str()));
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

#ifdef PAGEDC_HAVE_CUDA_TARGET
/// The CUDA mod code of an empty selection: generated from an empty program,
/// so that its Params is as empty as the CPU side's declarations.
llvm::Expected<std::string> emptySelectionModCode() {
  mlir::DialectRegistry registry;
  registerFlexDialects(registry);
  registerCudaLoweringDialects(registry);
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  ast::Program empty;
  mlir::OwningOpRef<mlir::ModuleOp> module = mlirGen(context, empty);
  if (!module)
    return makeError("MLIR generation of an empty program failed");
  return generateModCode(*module, "", "");
}
#endif

} // namespace

bool pagedc::jit::cudaCodeGenAvailable() {
#ifdef PAGEDC_HAVE_CUDA_TARGET
  return true;
#else
  return false;
#endif
}

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
  if (options.withCuda && !cudaCodeGenAvailable())
    return makeError("this build has no CUDA code generator (PagedcTarget)");
  mlir::DialectRegistry registry;
  registerFlexDialects(registry);
#ifdef PAGEDC_HAVE_CUDA_TARGET
  if (options.withCuda)
    registerCudaLoweringDialects(registry);
#endif
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
#ifdef PAGEDC_HAVE_CUDA_TARGET
    if (options.withCuda) {
      auto code = emptySelectionModCode();
      if (!code)
        return makeError(fileName + ": CUDA mod code: " +
                         llvm::toString(code.takeError()));
      none.cuda.modCode = std::move(*code);
    }
#endif
    return none;
  }
  if (mlir::failed(pm.run(*module)))
    return makeError(fileName + ": the pass pipeline failed:\n" + mlirErrors);
#ifdef PAGEDC_HAVE_CUDA_TARGET
  // Before compileMods(), which lowers the module for the CPU JIT.
  std::string cudaModCode;
  if (options.withCuda) {
    auto code = generateModCode(*module, mask, score);
    if (!code)
      return makeError(fileName + ": CUDA mod code: " +
                       llvm::toString(code.takeError()));
    cudaModCode = std::move(*code);
  }
#endif
  auto mods = compileMods(*module, mask, score, options.jit);
#ifdef PAGEDC_HAVE_CUDA_TARGET
  if (mods)
    mods->cuda.modCode = std::move(cudaModCode);
#endif
  return mods;
}

llvm::Expected<CompiledMods> pagedc::jit::compileModsFromFile(
    llvm::StringRef path, llvm::StringRef mask, llvm::StringRef score,
    const SourceCompileOptions &options, llvm::raw_ostream &diagnostics) {
  // At most kMaxProgramBytes: `pagedc run /dev/zero` is an error, not a read
  // until memory runs out.
  std::string source;
  std::string error = readProgramFile(path.str(), source);
  if (!error.empty())
    return makeError(error);
  return compileModsFromSource(path, source, mask, score, options,
                               diagnostics);
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
