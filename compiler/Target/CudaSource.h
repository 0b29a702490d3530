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

#include "pagedc/KernelSource.h"
#include "pagedc/Mods.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace pagedc {

/// The runtime's view of a module's declarations, in declaration order.
struct ModuleDeclarations {
  std::vector<ParamDecl> params;
  std::vector<BufferDecl> buffers;
};

/// Reads the `flex.param` and `flex.buffer` declarations of `module`.
llvm::Expected<ModuleDeclarations> collectDeclarations(mlir::ModuleOp module);

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
