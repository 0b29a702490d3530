//===- MLIRStages.cpp - The mlir and lowered stages of pagedc -------------===//
//
// --emit=mlir prints the flex module MLIRGen builds from the checked AST;
// --emit=lowered runs the pass pipeline (compiler/Pipeline.h) over it first.
// Built only when MLIRGen and the pipeline exist (PAGEDC_HAVE_MLIRGEN).
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

using namespace pagedc::driver;

void pagedc::driver::registerMLIRStages(Registry &registry) {
  // MLIRGen (compiler/Frontend/MLIRGen.h) has not landed in this build yet:
  // no mlir/lowered stages to offer.
  (void)registry;
}
