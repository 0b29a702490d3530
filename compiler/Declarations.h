//===- Declarations.h - flex declarations as the runtime sees them -*- C++ -*-===//
//
// One mapping from `flex.param` / `flex.buffer` ops to the runtime's
// ParamDecl / BufferDecl (runtime/include/pagedc/Mods.h), shared by the CPU
// JIT (CompiledMods) and the CUDA target (the kernels' Params layout), so the
// two backends bind launch values the same way.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_DECLARATIONS_H
#define PAGEDC_DECLARATIONS_H

#include "Flex/FlexDialect.h"

#include "pagedc/Mods.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <vector>

namespace pagedc {

/// `buffer NAME: ELEM[dims]` as the runtime checks it at launch. Fails for an
/// element type the runtime does not know.
llvm::Expected<BufferDecl> describeBuffer(flex::BufferOp buffer);

/// `param NAME: TYPE = default` as the runtime checks it at launch. Fails for
/// a type other than i32, f32 or bool.
llvm::Expected<ParamDecl> describeParam(flex::ParamOp param);

/// The declarations of a module, in declaration order.
struct ModuleDeclarations {
  std::vector<ParamDecl> params;
  std::vector<BufferDecl> buffers;
};

/// Every `flex.param` and `flex.buffer` of `module`, in declaration order.
llvm::Expected<ModuleDeclarations> collectDeclarations(mlir::ModuleOp module);

} // namespace pagedc

#endif // PAGEDC_DECLARATIONS_H
