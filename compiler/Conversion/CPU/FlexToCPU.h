//===- FlexToCPU.h - flex mods to ModABI row functions ----------*- C++ -*-===//
//
// Turns `flex.mod` operations (after the pipeline: inlined, constants folded)
// into functions with the C signatures of runtime/include/pagedc/ModABI.h,
// written in func/scf/arith/math plus LLVM dialect memory operations. The
// result is lowered by LowerToLLVM.h and compiled by the JIT.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CONVERSION_CPU_FLEXTOCPU_H
#define PAGEDC_CONVERSION_CPU_FLEXTOCPU_H

#include "Flex/FlexDialect.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Support/LogicalResult.h"

#include <string>
#include <vector>

namespace pagedc {

/// Symbol of the PagedcMaskRowFn generated for mask mod `name`.
std::string cpuMaskRowSymbol(llvm::StringRef name);
/// Symbol of the PagedcScoreRowFn generated for score mod `name`.
std::string cpuScoreRowSymbol(llvm::StringRef name);
/// Symbol of the PagedcBlockClassFn generated for mask mod `name`.
std::string cpuMaskBlockClassSymbol(llvm::StringRef name);

/// The buffers and params a set of mods reads, in declaration order. Their
/// positions here are the ABI indices of PagedcModContext::buffers/params:
/// declarations no selected mod reads take no slot.
struct ModInterface {
  std::vector<flex::BufferOp> buffers;
  std::vector<flex::ParamOp> params;
};
ModInterface collectModInterface(mlir::ModuleOp module,
                                 llvm::ArrayRef<flex::ModOp> mods);

/// True when every operation of mask `mod` has an interval transfer function
/// (integer index arithmetic, comparisons, booleans, params) and it reads no
/// buffer: then its block classifier is precise enough to beat element-wise
/// evaluation. Otherwise the classifier would answer "partial" for most
/// blocks, and none is generated.
bool isIntervalClassifiable(flex::ModOp mod);

/// What to generate.
struct FlexToCpuOptions {
  /// Names of the mods to convert; empty means every mod in the module.
  std::vector<std::string> mods;
  /// Also generate the interval-arithmetic block classifier of each mask
  /// for which isIntervalClassifiable() holds.
  bool blockClass = true;
};

/// Builds into `target` (an empty module of the same context) the row
/// functions of the mods of `flexModule` selected by `options`:
///
///   mask_row_NAME(ctx, b, h, q, kv_begin, count, uint8_t *out)
///   score_row_NAME(ctx, b, h, q, kv_begin, count, float *scores)
///   mask_block_class_NAME(ctx, b, h, q_lo, q_hi, kv_lo, kv_hi) -> i32
///
/// Buffers and params are numbered as collectModInterface() numbers them
/// for the selected mods. `flexModule` is not modified. Fails (with a diagnostic)
/// on a missing mod, a remaining flex.call or an op it cannot lower.
mlir::LogicalResult convertFlexModsToCpu(mlir::ModuleOp flexModule,
                                         const FlexToCpuOptions &options,
                                         mlir::ModuleOp target);

/// The pass `convert-flex-to-cpu`: replaces the module's contents by the
/// output of convertFlexModsToCpu (option `mods`, `block-class`).
std::unique_ptr<mlir::Pass> createConvertFlexToCpuPass();

/// Registers convert-flex-to-cpu and pagedc-lower-cpu-to-llvm (the tail of
/// the CPU pipeline) for pagedc-opt.
void registerFlexToCpuPasses();

} // namespace pagedc

#endif // PAGEDC_CONVERSION_CPU_FLEXTOCPU_H
