//===- pagedc.cpp - The pagedc command-line compiler ----------------------===//
//
// Assembles the option/stage/subcommand tables (see Driver.h) and runs them.
// Parts of the compiler that add stages, options or subcommands register
// them here with one call each.
//
//===----------------------------------------------------------------------===//

#include "Driver.h"
#ifdef PAGEDC_HAVE_RUN
#include "Run.h"
#endif

#include "llvm/Support/InitLLVM.h"

int main(int argc, const char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  pagedc::driver::Registry registry;
  pagedc::driver::registerCoreOptions(registry);
  pagedc::driver::registerFrontendStages(registry);
  pagedc::driver::registerMLIRStages(registry);
#ifdef PAGEDC_HAVE_CUDA_STAGES
  pagedc::driver::registerCudaStages(registry);
#endif
#ifdef PAGEDC_HAVE_RUN
  pagedc::driver::registerRunSubcommands(registry);
#endif
  return pagedc::driver::runDriver(registry, argc, argv);
}
