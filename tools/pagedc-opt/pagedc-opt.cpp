//===- pagedc-opt.cpp - mlir-opt for the flex dialect ---------------------===//
//
// Parses, verifies, transforms and prints flex modules: the driver of the
// Dialect and Transforms lit tests. Knows the flex, arith, math and func
// dialects, every flex pass and the `flex-pipeline` pipeline.
//
//===----------------------------------------------------------------------===//

#include "Pipeline.h"

#ifdef PAGEDC_HAVE_CUDA_CONVERSION
#include "Conversion/CUDA/FlexToEmitC.h"
#endif
#ifdef PAGEDC_HAVE_CPU_CONVERSION
#include "Conversion/CPU/FlexToCPU.h"
#include "Conversion/CPU/LowerToLLVM.h"
#endif

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  pagedc::registerFlexDialects(registry);
  pagedc::registerFlexPasses();
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
#ifdef PAGEDC_HAVE_CUDA_CONVERSION
  pagedc::registerCudaLoweringDialects(registry);
  pagedc::registerPagedcCudaPasses();
#endif
#ifdef PAGEDC_HAVE_CPU_CONVERSION
  pagedc::registerCpuLoweringDialects(registry);
  pagedc::registerFlexToCpuPasses();
#endif
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "pagedc optimizer driver\n", registry));
}
