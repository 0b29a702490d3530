//===- LowerToLLVM.h - Standard dialects to the LLVM dialect ----*- C++ -*-===//
//
// The tail of the CPU pipeline: func/scf/arith/math (plus LLVM dialect memory
// operations) down to the LLVM dialect, ready for translation and the JIT.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CONVERSION_CPU_LOWERTOLLVM_H
#define PAGEDC_CONVERSION_CPU_LOWERTOLLVM_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/LogicalResult.h"

namespace pagedc {

/// Adds the passes that lower func, scf, cf, arith and math to the LLVM
/// dialect. f32 `math.tanh` becomes a polynomial (so row loops vectorise);
/// math ops without an LLVM intrinsic become libm calls, resolved in the
/// host process by the JIT.
void addLowerToLLVMPasses(mlir::OpPassManager &pm);

/// Runs addLowerToLLVMPasses on `module`. Diagnostics go to the context.
mlir::LogicalResult lowerToLLVMDialect(mlir::ModuleOp module);

/// Registers the dialects and translation interfaces the lowering and the
/// LLVM IR translation need with `registry`.
void registerCpuLoweringDialects(mlir::DialectRegistry &registry);

} // namespace pagedc

#endif // PAGEDC_CONVERSION_CPU_LOWERTOLLVM_H
