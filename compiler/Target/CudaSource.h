//===- CudaSource.h - CUDA translation units from flex modules --*- C++ -*-===//
//
// The compiler's half of the CUDA boundary: a flex module (after the pipeline:
// mods inlined, constants folded) becomes the hook code of
// templates/Hooks.cuh through -convert-flex-to-emitc and
// emitc::translateToCpp, and the runtime's assembleKernel() wraps that code
// into one self-contained kernel translation unit.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TARGET_CUDASOURCE_H
#define PAGEDC_TARGET_CUDASOURCE_H

#include "Declarations.h"

#include "pagedc/KernelSource.h"
#include "pagedc/Mods.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace pagedc {

// collectDeclarations() (Declarations.h) gives the kernels' Params order.

/// The generated mod code for the mask mod `maskName` and the score mod
/// `scoreName` of `module` (either may be empty: that hook is neutral): the
/// CUDA mod prelude followed by `namespace pagedc_mods { ... }` with Params,
/// kHasMask, kHasScore, the row structs and the four hook functions.
/// `module` is not modified. Errors carry the compiler's diagnostics.
llvm::Expected<std::string> generateModCode(mlir::ModuleOp module,
                                            llvm::StringRef maskName,
                                            llvm::StringRef scoreName);

/// generateModCode() wrapped by pagedc::assembleKernel() for `config`, with
/// config.paramsSize set from the module's declarations so that the TU
/// checks the host's Params layout.
llvm::Expected<KernelSource> buildKernelSource(mlir::ModuleOp module,
                                               llvm::StringRef maskName,
                                               llvm::StringRef scoreName,
                                               KernelConfig config);

} // namespace pagedc

#endif // PAGEDC_TARGET_CUDASOURCE_H
