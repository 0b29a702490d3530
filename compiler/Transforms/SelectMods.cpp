//===- SelectMods.cpp - The -flex-select-mods pass ------------------------===//
//
// Keeps the mods named by the `mods` option, the mods they call, and the
// declarations those mods refer to; erases everything else.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"

#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringSet.h"

namespace pagedc::flex {
#define GEN_PASS_DEF_FLEXSELECTMODS
#include "Flex/FlexPasses.h.inc"
} // namespace pagedc::flex

using namespace mlir;
using namespace pagedc::flex;

namespace {

struct SelectModsPass
    : public pagedc::flex::impl::FlexSelectModsBase<SelectModsPass> {
  using FlexSelectModsBase::FlexSelectModsBase;

  void runOnOperation() override {
    if (mods.empty())
      return;
    ModuleOp module = getOperation();
    SymbolTable symbols(module);

    // The named mods and, transitively, the mods they call.
    llvm::SetVector<ModOp> kept;
    for (const std::string &name : mods) {
      auto mod = symbols.lookup<ModOp>(name);
      if (!mod) {
        module.emitError() << "-flex-select-mods: there is no mod named '"
                           << name << "'";
        return signalPassFailure();
      }
      kept.insert(mod);
    }
    for (size_t i = 0; i < kept.size(); ++i)
      ModOp(kept[i]).walk([&](CallOp call) {
        if (auto callee = symbols.lookup<ModOp>(call.getCallee()))
          kept.insert(callee);
      });

    // The declarations the kept mods refer to.
    llvm::StringSet<> usedDecls;
    for (ModOp mod : kept)
      mod.walk([&](Operation *op) {
        if (auto ref = llvm::dyn_cast<ConstRefOp>(op))
          usedDecls.insert(ref.getName());
        else if (auto ref = llvm::dyn_cast<ParamRefOp>(op))
          usedDecls.insert(ref.getName());
        else if (auto load = llvm::dyn_cast<BufferLoadOp>(op))
          usedDecls.insert(load.getBuffer());
      });

    for (Operation &op : llvm::make_early_inc_range(module.getOps())) {
      bool erase = false;
      if (auto mod = llvm::dyn_cast<ModOp>(op))
        erase = !kept.contains(mod);
      else if (llvm::isa<ConstDeclOp, ParamOp, BufferOp>(op))
        erase = !usedDecls.contains(SymbolTable::getSymbolName(&op));
      if (erase)
        op.erase();
    }
  }
};

} // namespace
