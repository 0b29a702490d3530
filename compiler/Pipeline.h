//===- Pipeline.h - The pass pipeline of pagedc ----------------*- C++ -*-===//
//
// The one function that builds pagedc's pass pipeline over a flex module;
// the CLI, the C++ API, the JIT and the tests all use it, so every path
// compiles a mod the same way.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_COMPILER_PIPELINE_H
#define PAGEDC_COMPILER_PIPELINE_H

#include <string>
#include <vector>

namespace mlir {
class DialectRegistry;
class OpPassManager;
} // namespace mlir

namespace pagedc {

/// What buildPipeline() builds.
struct PipelineOptions {
  /// Names of the mods to keep (and the declarations they use); every other
  /// mod is dropped after inlining. Empty keeps everything.
  std::vector<std::string> keepMods;
  /// Attach flex.reads / flex.buffers / flex.params / flex.diagonal to every
  /// mod (the runtime needs them; tests of earlier stages may turn it off).
  bool analyzeDependences = true;
};

/// Adds to `pm` (which must run on a builtin.module) the passes that take a
/// flex module from MLIRGen to the form the lowerings accept:
///   -flex-inline-mods, [-flex-select-mods], -flex-fold-constants,
///   -canonicalize, -cse, -canonicalize, -flex-dependence-analysis.
void buildPipeline(mlir::OpPassManager &pm, const PipelineOptions &options);

/// Registers the dialects a flex module uses: flex, arith, math and func.
void registerFlexDialects(mlir::DialectRegistry &registry);

/// Registers the flex passes and the `flex-pipeline` pass pipeline (the
/// pipeline of buildPipeline() with default options) for command-line tools.
void registerFlexPasses();

} // namespace pagedc

#endif // PAGEDC_COMPILER_PIPELINE_H
