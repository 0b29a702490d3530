//===- JitEngine.cpp - LLVM-dialect modules compiled to host code ---------===//

#include "JIT/JitEngine.h"

#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Target/TargetMachine.h"

#include <mutex>

using namespace pagedc::jit;

void pagedc::jit::initializeHostTarget() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

JitEngine::~JitEngine() = default;

llvm::Expected<std::unique_ptr<JitEngine>>
JitEngine::create(mlir::ModuleOp llvmModule, unsigned optLevel) {
  initializeHostTarget();
  auto builder = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!builder)
    return builder.takeError();
  llvm::CodeGenOptLevel codeGenLevel = optLevel >= 3   ? llvm::CodeGenOptLevel::Aggressive
                                       : optLevel == 0 ? llvm::CodeGenOptLevel::None
                                                       : llvm::CodeGenOptLevel::Default;
  builder->setCodeGenOptLevel(codeGenLevel);
  auto targetMachine = builder->createTargetMachine();
  if (!targetMachine)
    return targetMachine.takeError();

  // The optimiser needs the target machine for the vectoriser's cost model.
  auto optimize = mlir::makeOptimizingTransformer(optLevel, /*sizeLevel=*/0,
                                                  targetMachine->get());
  mlir::ExecutionEngineOptions options;
  options.transformer = optimize;
  options.jitCodeGenOptLevel = codeGenLevel;
  options.enableGDBNotificationListener = false;
  options.enablePerfNotificationListener = false;

  std::unique_ptr<JitEngine> result(new JitEngine());
  auto engine = mlir::ExecutionEngine::create(llvmModule, options,
                                              std::move(*targetMachine));
  if (!engine)
    return engine.takeError();
  result->engine_ = std::move(*engine);
  return result;
}

llvm::Expected<void *> JitEngine::lookup(llvm::StringRef symbol) const {
  return engine_->lookup(symbol);
}
