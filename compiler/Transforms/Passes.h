//===- Passes.h - The flex passes ------------------------------*- C++ -*-===//
//
// Constructors and registration of the passes declared in
// dialects/Flex/FlexPasses.td. Pipelines should be built with
// pagedc::buildPipeline() (compiler/Pipeline.h) rather than by hand.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_COMPILER_TRANSFORMS_PASSES_H
#define PAGEDC_COMPILER_TRANSFORMS_PASSES_H

#include "Flex/FlexDialect.h"

#include "mlir/Pass/Pass.h"

namespace pagedc::flex {

#define GEN_PASS_DECL
#include "Flex/FlexPasses.h.inc"

#define GEN_PASS_REGISTRATION
#include "Flex/FlexPasses.h.inc"

} // namespace pagedc::flex

#endif // PAGEDC_COMPILER_TRANSFORMS_PASSES_H
