//===- MLIRGen.h - Lowering of the .attn AST to the flex dialect -*- C++ -*-===//
//
// Turns a Sema-checked ast::Program into a module of flex operations: one
// flex.const_decl / flex.param / flex.buffer per item (in source order, the
// ABI order) and one flex.mod per mod. Calls between mods stay flex.call
// (-flex-inline-mods inlines them); constants stay flex.const_ref
// (-flex-fold-constants folds them). Every operation carries the
// file:line:column of the source it came from.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_FRONTEND_MLIRGEN_H
#define PAGEDC_FRONTEND_MLIRGEN_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir {
class MLIRContext;
} // namespace mlir

namespace pagedc {
namespace ast {
class Program;
} // namespace ast

/// Builds the flex module of `program`, which Sema must have accepted. Loads
/// the dialects it needs into `context`. Returns null (after emitting a
/// diagnostic through `context`) if the module does not verify, which means
/// a bug in Sema or here, never in the user's input.
mlir::OwningOpRef<mlir::ModuleOp> mlirGen(mlir::MLIRContext &context,
                                          const ast::Program &program);

} // namespace pagedc

#endif // PAGEDC_FRONTEND_MLIRGEN_H
