//===- FoldConstants.cpp - The -flex-fold-constants pass ------------------===//
//
// Replaces flex.const_ref by arith.constant holding the declaration's value
// and folds the arith, math and flex operations of every mod.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"

#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

namespace pagedc::flex {
#define GEN_PASS_DEF_FLEXFOLDCONSTANTS
#include "Flex/FlexPasses.h.inc"
} // namespace pagedc::flex

using namespace mlir;
using namespace pagedc::flex;

namespace {

struct FoldConstantsPass
    : public pagedc::flex::impl::FlexFoldConstantsBase<FoldConstantsPass> {
  LogicalResult initialize(MLIRContext *context) override {
    // Canonicalization patterns of the dialects mods compute with; folding
    // itself comes with the greedy driver.
    RewritePatternSet set(context);
    for (RegisteredOperationName name : context->getRegisteredOperations()) {
      StringRef dialect = name.getDialectNamespace();
      if (dialect == "arith" || dialect == "math" || dialect == "flex")
        name.getCanonicalizationPatterns(set, context);
    }
    patterns = FrozenRewritePatternSet(std::move(set));
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    WalkResult result = module.walk([&](ConstRefOp ref) {
      auto decl = symbols.lookup<ConstDeclOp>(ref.getName());
      if (!decl) {
        ref.emitOpError() << "refers to '" << ref.getName()
                          << "', which is not a flex.const_decl";
        return WalkResult::interrupt();
      }
      OpBuilder builder(ref);
      auto value =
          builder.create<arith::ConstantOp>(ref.getLoc(), decl.getValue());
      ref.getResult().replaceAllUsesWith(value.getResult());
      ref.erase();
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      return signalPassFailure();

    for (ModOp mod : module.getOps<ModOp>())
      (void)applyPatternsAndFoldGreedily(mod, patterns);
  }

  FrozenRewritePatternSet patterns;
};

} // namespace
