//===- FlexToEmitC.h - flex -> EmitC for the CUDA kernels -------*- C++ -*-===//
//
// The CUDA code generator's conversion: selected flex mods become the EmitC
// hook functions of templates/Hooks.cuh (see Passes.td for the pass), which
// emitc::translateToCpp turns into CUDA C++.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CONVERSION_CUDA_FLEXTOEMITC_H
#define PAGEDC_CONVERSION_CUDA_FLEXTOEMITC_H

#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/Pass/Pass.h"
#include "llvm/ADT/StringRef.h"

#include <memory>
#include <string>

namespace mlir {
class RewritePatternSet;
class TypeConverter;
class DialectRegistry;
class OpPassManager;
} // namespace mlir

namespace pagedc {

#define GEN_PASS_DECL
#include "Conversion/CUDA/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "Conversion/CUDA/Passes.h.inc"

/// Adds MLIR's arith -> EmitC patterns and pagedc's patterns for the arith
/// ops MLIR 19 leaves out (min/max, remf, floordivsi) and for `math` (CUDA
/// f32 library calls and prelude helpers).
void populateCudaArithMathToEmitCPatterns(mlir::TypeConverter &typeConverter,
                                          mlir::RewritePatternSet &patterns);

/// Sets up `typeConverter` for EmitC: builtin integer and float types stay,
/// index becomes size_t.
void configureCudaEmitCTypeConverter(mlir::TypeConverter &typeConverter);

/// Adds -convert-flex-to-emitc for `maskName` / `scoreName` (empty: none):
/// everything between the pipeline's flex module and emitc::translateToCpp.
void addCudaLoweringPasses(mlir::OpPassManager &pm, llvm::StringRef maskName,
                           llvm::StringRef scoreName);

/// Registers the dialects the CUDA lowering produces (EmitC).
void registerCudaLoweringDialects(mlir::DialectRegistry &registry);

/// The CUDA helpers generated code calls (Prelude.cuh, embedded at build
/// time): flex_floordiv, flex_floormod, flex_min/max/abs, flex_minimum/
/// maximum, flex_ipow, bit counts. Defines them in namespace pagedc_mods;
/// must follow templates/Prelude.cuh in the translation unit.
llvm::StringRef getCudaModPrelude();

} // namespace pagedc

#endif // PAGEDC_CONVERSION_CUDA_FLEXTOEMITC_H
