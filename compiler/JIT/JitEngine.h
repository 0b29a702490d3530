//===- JitEngine.h - LLVM-dialect modules compiled to host code -*- C++ -*-===//
//
// A thin owner of mlir::ExecutionEngine: translates an LLVM-dialect module to
// LLVM IR, optimises it for the host CPU (O3, so row loops vectorise) and
// hands out raw function pointers by symbol name.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_JIT_JITENGINE_H
#define PAGEDC_JIT_JITENGINE_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <string>

namespace mlir {
class ExecutionEngine;
} // namespace mlir

namespace pagedc::jit {

/// Code generated for one module; function pointers stay valid while it lives.
class JitEngine {
public:
  /// Compiles `llvmModule` (LLVM dialect only) for the host.
  static llvm::Expected<std::unique_ptr<JitEngine>>
  create(mlir::ModuleOp llvmModule, unsigned optLevel = 3);
  ~JitEngine();

  /// The address of the function named `symbol` in the compiled module.
  llvm::Expected<void *> lookup(llvm::StringRef symbol) const;

private:
  JitEngine() = default;
  std::unique_ptr<mlir::ExecutionEngine> engine_;
};

/// Initialises the host target once per process (thread-safe).
void initializeHostTarget();

} // namespace pagedc::jit

#endif // PAGEDC_JIT_JITENGINE_H
