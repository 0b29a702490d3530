//===- MLIRStages.cpp - The mlir and lowered stages of pagedc -------------===//
//
// --emit=mlir prints the flex module MLIRGen builds from the checked AST;
// --emit=lowered runs the pass pipeline (compiler/Pipeline.h) over it first,
// keeping only the mods named by --mask/--score when either is given.
// Built with MLIRGen and the pipeline (PAGEDC_HAVE_MLIR_STAGES); without
// them the stages are simply not offered.
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

#ifdef PAGEDC_HAVE_MLIR_STAGES
#include "Frontend/MLIRGen.h"
#include "Pipeline.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#endif

using namespace pagedc;
using namespace pagedc::driver;

#ifdef PAGEDC_HAVE_MLIR_STAGES
static int runMLIRStage(Compilation &compilation, llvm::raw_ostream &os,
                        bool lower) {
  mlir::DialectRegistry dialects;
  registerFlexDialects(dialects);
  mlir::MLIRContext context(dialects);
  // MLIR reports its own diagnostics (with the file:line:col of the source)
  // to stderr through the context's default handler.
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlirGen(context, *compilation.program);
  if (!module)
    return kExitInputError;
  if (lower) {
    PipelineOptions pipelineOptions;
    if (!compilation.options.maskName.empty())
      pipelineOptions.keepMods.push_back(compilation.options.maskName);
    if (!compilation.options.scoreName.empty())
      pipelineOptions.keepMods.push_back(compilation.options.scoreName);
    mlir::PassManager passManager(&context);
    buildPipeline(passManager, pipelineOptions);
    if (mlir::failed(passManager.run(*module)))
      return kExitInputError;
  }
  module->print(os);
  return kExitSuccess;
}
#endif

void pagedc::driver::registerMLIRStages(Registry &registry) {
#ifdef PAGEDC_HAVE_MLIR_STAGES
  registry.addStage({"mlir", "the flex module MLIRGen builds",
                     /*needsProgram=*/true,
                     [](Compilation &compilation, llvm::raw_ostream &os) {
                       return runMLIRStage(compilation, os, /*lower=*/false);
                     }});
  registry.addStage(
      {"lowered",
       "the flex module after the pass pipeline (inlined, folded, "
       "with dependences)",
       /*needsProgram=*/true,
       [](Compilation &compilation, llvm::raw_ostream &os) {
         return runMLIRStage(compilation, os, /*lower=*/true);
       }});
#else
  (void)registry;
#endif
}
