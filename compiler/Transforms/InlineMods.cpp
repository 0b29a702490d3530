//===- InlineMods.cpp - The -flex-inline-mods pass ------------------------===//
//
// Replaces every flex.call by a copy of the callee's body. Mods are
// processed callees first, so each copied body is already free of calls;
// a call cycle is reported instead of being expanded forever.
//
//===----------------------------------------------------------------------===//

#include "Transforms/Passes.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseMap.h"

namespace pagedc::flex {
#define GEN_PASS_DEF_FLEXINLINEMODS
#include "Flex/FlexPasses.h.inc"
} // namespace pagedc::flex

using namespace mlir;
using namespace pagedc::flex;

namespace {

/// Orders mods so that every mod comes after the mods it calls.
class CallOrder {
public:
  explicit CallOrder(SymbolTable &symbols) : symbols(symbols) {}

  /// Appends `mod` and everything it calls to the order; fails (with an
  /// error on the offending call) on unknown callees and call cycles.
  /// Depth-first with an explicit stack: a chain of mods each calling the
  /// next is as deep as the program is long (tens of thousands of mods),
  /// far deeper than the native stack allows frames.
  LogicalResult visit(ModOp root) {
    if (states.lookup(root) == State::Done)
      return success();
    SmallVector<Frame> stack;
    push(root, stack);
    while (!stack.empty()) {
      Frame &frame = stack.back();
      if (frame.next == frame.calls.size()) {
        states[frame.mod] = State::Done;
        order.push_back(frame.mod);
        stack.pop_back();
        continue;
      }
      CallOp call = frame.calls[frame.next++];
      auto callee = symbols.lookup<ModOp>(call.getCallee());
      if (!callee) {
        call.emitOpError() << "calls '" << call.getCallee() << "', which is not a flex.mod";
        return failure();
      }
      State state = states.lookup(callee);
      if (state == State::Visiting) {
        call.emitOpError() << "closes a call cycle through '" << callee.getSymName()
                           << "'; mods cannot be recursive";
        return failure();
      }
      if (state == State::Unvisited)
        push(callee, stack); // `frame` is not used after this
    }
    return success();
  }

  ArrayRef<ModOp> getOrder() const { return order; }

private:
  enum class State { Unvisited, Visiting, Done };
  /// A mod being visited: its calls in walk order and the next to follow.
  struct Frame {
    ModOp mod;
    SmallVector<CallOp> calls;
    size_t next = 0;
  };

  void push(ModOp mod, SmallVector<Frame> &stack) {
    states[mod] = State::Visiting;
    Frame frame{mod, {}, 0};
    mod.walk([&](CallOp call) { frame.calls.push_back(call); });
    stack.push_back(std::move(frame));
  }

  SymbolTable &symbols;
  llvm::DenseMap<ModOp, State> states;
  SmallVector<ModOp> order;
};

/// Replaces `call` by a copy of the body of `callee`, which has no calls.
/// The copies get call-site locations, so errors name both places.
void inlineCall(CallOp call, ModOp callee) {
  Block &body = callee.getBody().front();
  IRMapping mapping;
  mapping.map(body.getArguments(), call.getOperands());
  OpBuilder builder(call);
  for (Operation &op : body.without_terminator()) {
    Operation *copy = builder.clone(op, mapping);
    copy->walk([&](Operation *nested) {
      nested->setLoc(CallSiteLoc::get(nested->getLoc(), call.getLoc()));
    });
  }
  Value result = mapping.lookupOrDefault(callee.getYield().getValue());
  call.getResult().replaceAllUsesWith(result);
  call.erase();
}

struct InlineModsPass
    : public pagedc::flex::impl::FlexInlineModsBase<InlineModsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    CallOrder order(symbols);
    for (ModOp mod : module.getOps<ModOp>())
      if (failed(order.visit(mod)))
        return signalPassFailure();
    for (ModOp mod : order.getOrder()) {
      SmallVector<CallOp> calls;
      mod.walk([&](CallOp call) { calls.push_back(call); });
      for (CallOp call : calls)
        inlineCall(call, symbols.lookup<ModOp>(call.getCallee()));
    }
  }
};

} // namespace
