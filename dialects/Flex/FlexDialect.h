//===- FlexDialect.h - The flex dialect ------------------------*- C++ -*-===//
//
// Include this header to use the flex dialect: it declares the dialect, its
// enums and all of its operations.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_DIALECTS_FLEX_FLEXDIALECT_H
#define PAGEDC_DIALECTS_FLEX_FLEXDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/CallInterfaces.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "Flex/FlexDialect.h.inc"
#include "Flex/FlexEnums.h.inc"

#define GET_OP_CLASSES
#include "Flex/FlexOps.h.inc"

#endif // PAGEDC_DIALECTS_FLEX_FLEXDIALECT_H
