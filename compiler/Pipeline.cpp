//===- Pipeline.cpp - The pass pipeline of pagedc -------------------------===//

#include "Pipeline.h"

#include "Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void pagedc::buildPipeline(OpPassManager &pm, const PipelineOptions &options) {
  pm.addPass(flex::createFlexInlineMods());
  if (!options.keepMods.empty()) {
    flex::FlexSelectModsOptions select;
    select.mods = options.keepMods;
    pm.addPass(flex::createFlexSelectMods(select));
  }
  pm.addPass(flex::createFlexFoldConstants());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  // CSE exposes new folds (x & x after inlining one mod twice).
  pm.addPass(createCanonicalizerPass());
  if (options.analyzeDependences)
    pm.addPass(flex::createFlexDependenceAnalysis());
}

void pagedc::registerFlexDialects(DialectRegistry &registry) {
  registry.insert<flex::FlexDialect, arith::ArithDialect, math::MathDialect,
                  func::FuncDialect>();
}

void pagedc::registerFlexPasses() {
  flex::registerFlexPasses();
  PassPipelineRegistration<>(
      "flex-pipeline",
      "pagedc's pipeline (inline, fold constants, canonicalize, CSE, "
      "canonicalize, dependence analysis)",
      [](OpPassManager &pm) { buildPipeline(pm, PipelineOptions()); });
}
