//===- FlexDialect.cpp - The flex dialect ---------------------------------===//
//
// Dialect registration, constant materialization and the verification of the
// analysis attributes (flex.reads, ...) that passes attach to mods.
//
//===----------------------------------------------------------------------===//

#include "Flex/FlexDialect.h"

#include "llvm/ADT/StringSwitch.h"

using namespace mlir;
using namespace pagedc::flex;

#include "Flex/FlexDialect.cpp.inc"
#include "Flex/FlexEnums.cpp.inc"

void FlexDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "Flex/FlexOps.cpp.inc"
      >();
}

Operation *FlexDialect::materializeConstant(OpBuilder &builder,
                                            Attribute value, Type type,
                                            Location loc) {
  return arith::ConstantOp::materialize(builder, value, type, loc);
}

/// Checks that `attr` is an array whose elements all satisfy `isElement`.
static LogicalResult
verifyArrayOf(Operation *op, NamedAttribute attr, StringRef what,
              llvm::function_ref<bool(Attribute)> isElement) {
  auto array = llvm::dyn_cast<ArrayAttr>(attr.getValue());
  if (!array)
    return op->emitOpError() << "attribute '" << attr.getName().getValue()
                             << "' must be an array of " << what;
  for (Attribute element : array)
    if (!isElement(element))
      return op->emitOpError()
             << "attribute '" << attr.getName().getValue()
             << "' must be an array of " << what << ", found " << element;
  return success();
}

LogicalResult FlexDialect::verifyOperationAttribute(Operation *op,
                                                    NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  bool known = name == kReadsAttrName || name == kBuffersAttrName ||
               name == kParamsAttrName || name == kDiagonalAttrName;
  if (!known)
    return op->emitError() << "unknown flex attribute '" << name << "'";
  if (!llvm::isa<ModOp>(op))
    return op->emitError() << "'" << name
                           << "' may only be attached to a flex.mod";
  if (name == kDiagonalAttrName) {
    if (!llvm::isa<UnitAttr>(attr.getValue()))
      return op->emitOpError() << "attribute '" << name
                               << "' must be a unit attribute";
    return success();
  }
  if (name == kReadsAttrName) {
    // Each index argument at most once, in argument order.
    int last = -1;
    return verifyArrayOf(
        op, attr, "\"b\", \"h\", \"q\" or \"kv\" in argument order",
        [&](Attribute element) {
          auto string = llvm::dyn_cast<StringAttr>(element);
          if (!string)
            return false;
          int position = llvm::StringSwitch<int>(string.getValue())
                             .Case("b", 0)
                             .Case("h", 1)
                             .Case("q", 2)
                             .Case("kv", 3)
                             .Default(-1);
          if (position <= last)
            return false;
          last = position;
          return true;
        });
  }
  return verifyArrayOf(op, attr, "symbol references", [](Attribute element) {
    return llvm::isa<FlatSymbolRefAttr>(element);
  });
}
