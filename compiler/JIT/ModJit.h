//===- ModJit.h - CompiledMods from a lowered flex module -------*- C++ -*-===//
//
// The CPU side of the compiler/runtime contract: compileMods() turns the
// selected mask and score mods of a flex module (after buildPipeline) into a
// CompiledMods whose row functions are JIT-compiled host code, whose float64
// reference evaluators interpret the same IR, and whose declarations and
// dependence information come from the module.
//
//   mlir::OwningOpRef<mlir::ModuleOp> module = ...;   // MLIRGen + pipeline
//   llvm::Expected<pagedc::CompiledMods> mods =
//       pagedc::jit::compileMods(*module, "causal", "alibi");
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_JIT_MODJIT_H
#define PAGEDC_JIT_MODJIT_H

#include "pagedc/Mods.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <cstdint>

namespace pagedc::jit {

/// How compileMods() compiles.
struct JitOptions {
  /// LLVM optimisation level of the generated code (3 vectorises rows).
  unsigned optLevel = 3;
  /// Lowered modules of more operations than this are compiled at optLevel
  /// 0: on the long straight-line bodies that thousands of non-foldable
  /// lets produce, LLVM's optimising code generator takes time that grows
  /// faster than the body, while -O0 (fast instruction selection and
  /// register allocation) stays linear. The corpus's mods lower to a few
  /// hundred operations. 0: no bound.
  size_t largeModuleOps = 2048;
  /// Generate maskBlockClass (interval arithmetic over the mask's IR).
  bool blockClassifier = true;
  /// Reuse an earlier compilation of the same module text and selection in
  /// this process.
  bool useCache = true;
};

/// Compiles mask mod `mask` and score mod `score` of `module` (either may be
/// empty: no such mod). The module must have gone through buildPipeline():
/// calls inlined, constants folded, dependence attributes attached. The
/// result's buffers and params are those the two mods read, in declaration
/// order, which is also the order of PagedcModContext's arrays. Errors name
/// a missing mod, a mod of the wrong kind, or the operation that could not
/// be compiled. `module` is not modified.
llvm::Expected<CompiledMods> compileMods(mlir::ModuleOp module,
                                         llvm::StringRef mask,
                                         llvm::StringRef score,
                                         const JitOptions &options = {});

/// In-process cache counters (for tests and benchmarks).
struct JitCacheStatistics {
  uint64_t hits = 0;
  uint64_t misses = 0;
};
JitCacheStatistics jitCacheStatistics();
/// Drops every cached compilation (CompiledMods already handed out stay valid).
void clearJitCache();

} // namespace pagedc::jit

#endif // PAGEDC_JIT_MODJIT_H
