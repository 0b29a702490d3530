//===- DependenceAnalysis.cpp - The -flex-dependence-analysis pass --------===//
//
// Records on every flex.mod which index arguments, buffers and params it
// reads, and whether it reads q and kv only through their difference.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

namespace pagedc::flex {
#define GEN_PASS_DEF_FLEXDEPENDENCEANALYSIS
#include "Flex/FlexPasses.h.inc"
} // namespace pagedc::flex

using namespace mlir;
using namespace pagedc::flex;

namespace {

/// The buffers and params a mod reads, directly or through calls.
struct DeclUses {
  llvm::StringSet<> buffers;
  llvm::StringSet<> params;
};

/// True if `op` combines q and kv into a function of q - kv: `q - kv`,
/// `kv - q`, or a comparison of q with kv (indices are non-negative i32, so
/// the difference cannot overflow and a comparison is a test of its sign).
bool isDiagonalUse(Operation *op, Value q, Value kv) {
  if (!llvm::isa<arith::SubIOp, arith::CmpIOp>(op))
    return false;
  Value lhs = op->getOperand(0), rhs = op->getOperand(1);
  return (lhs == q && rhs == kv) || (lhs == kv && rhs == q);
}

/// True if both q and kv are read, and only by diagonal uses.
bool readsOnlyDiagonal(ModOp mod) {
  Value q = mod.getQ(), kv = mod.getKV();
  if (q.use_empty() || kv.use_empty())
    return false;
  auto isDiagonal = [&](OpOperand &use) {
    return isDiagonalUse(use.getOwner(), q, kv);
  };
  return llvm::all_of(q.getUses(), isDiagonal) &&
         llvm::all_of(kv.getUses(), isDiagonal);
}

/// The declarations of one kind in declaration order (the ABI order),
/// gathered once per module: looking them up by scanning the module for
/// every mod made the pass quadratic in the number of mods.
class DeclOrder {
public:
  template <typename OpTy>
  static DeclOrder of(ModuleOp module) {
    DeclOrder order;
    for (OpTy decl : module.getOps<OpTy>()) {
      order.positions.try_emplace(decl.getSymName(), order.names.size());
      order.names.push_back(decl.getSymNameAttr());
    }
    return order;
  }

  /// The declarations named in `used`, as symbol references in declaration
  /// order; costs O(|used| log |used|), whatever the module's size.
  ArrayAttr refs(MLIRContext *context, const llvm::StringSet<> &used) const {
    SmallVector<unsigned> found;
    for (const auto &entry : used)
      if (auto it = positions.find(entry.getKey()); it != positions.end())
        found.push_back(it->second);
    llvm::sort(found);
    SmallVector<Attribute> result;
    for (unsigned position : found)
      result.push_back(FlatSymbolRefAttr::get(names[position]));
    return ArrayAttr::get(context, result);
  }

private:
  llvm::StringMap<unsigned> positions;
  SmallVector<StringAttr> names;
};

struct DependenceAnalysisPass
    : public pagedc::flex::impl::FlexDependenceAnalysisBase<
          DependenceAnalysisPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    Builder builder(&getContext());
    static const StringRef indexNames[] = {"b", "h", "q", "kv"};
    declUses.clear();
    const DeclOrder bufferOrder = DeclOrder::of<BufferOp>(module);
    const DeclOrder paramOrder = DeclOrder::of<ParamOp>(module);

    for (ModOp mod : module.getOps<ModOp>()) {
      SmallVector<Attribute> reads;
      for (unsigned i = 0; i < 4; ++i)
        if (!mod.getIndexArg(i).use_empty())
          reads.push_back(builder.getStringAttr(indexNames[i]));
      const DeclUses &uses = collectDeclUses(mod, symbols);
      mod->setAttr(FlexDialect::kReadsAttrName, builder.getArrayAttr(reads));
      mod->setAttr(FlexDialect::kBuffersAttrName,
                   bufferOrder.refs(&getContext(), uses.buffers));
      mod->setAttr(FlexDialect::kParamsAttrName,
                   paramOrder.refs(&getContext(), uses.params));
      if (readsOnlyDiagonal(mod))
        mod->setAttr(FlexDialect::kDiagonalAttrName, builder.getUnitAttr());
      else
        mod->removeAttr(FlexDialect::kDiagonalAttrName);
    }
  }

  /// The buffers and params `mod` reads, including through calls. Cycles
  /// (rejected earlier) end the recursion instead of looping.
  const DeclUses &collectDeclUses(ModOp mod, SymbolTable &symbols) {
    auto [it, inserted] = declUses.try_emplace(mod);
    if (!inserted)
      return it->second;
    DeclUses uses;
    mod.walk([&](Operation *op) {
      if (auto load = llvm::dyn_cast<BufferLoadOp>(op)) {
        uses.buffers.insert(load.getBuffer());
      } else if (auto ref = llvm::dyn_cast<ParamRefOp>(op)) {
        uses.params.insert(ref.getName());
      } else if (auto call = llvm::dyn_cast<CallOp>(op)) {
        if (auto callee = symbols.lookup<ModOp>(call.getCallee())) {
          const DeclUses &calleeUses = collectDeclUses(callee, symbols);
          for (const auto &entry : calleeUses.buffers)
            uses.buffers.insert(entry.getKey());
          for (const auto &entry : calleeUses.params)
            uses.params.insert(entry.getKey());
        }
      }
    });
    DeclUses &slot = declUses[mod];
    slot = std::move(uses);
    return slot;
  }

  llvm::DenseMap<ModOp, DeclUses> declUses;
};

} // namespace
