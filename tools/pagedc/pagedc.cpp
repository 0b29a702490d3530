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

#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/InitLLVM.h"

#include <unistd.h>

#include <cstring>
#include <new>

namespace {

/// LLVM's own allocation failures (safe_malloc, growing a SmallVector)
/// arrive here. This LLVM is built without exceptions, so its default is
/// abort(); the CLI's contract is a message and exit status 1. Nothing here
/// allocates: the heap is what just ran out.
void reportLlvmOutOfMemory(void *, const char *reason, bool) {
  static constexpr char kPrefix[] = "pagedc: error: out of memory (";
  (void)!::write(STDERR_FILENO, kPrefix, sizeof(kPrefix) - 1);
  if (reason)
    (void)!::write(STDERR_FILENO, reason, std::strlen(reason));
  (void)!::write(STDERR_FILENO, ")\n", 2);
  ::_exit(1);
}

} // namespace

int main(int argc, const char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  // InitLLVM makes a failed operator new call LLVM's out-of-memory handler,
  // which aborts before std::bad_alloc reaches the catches that turn it into
  // an error naming the size asked for (tensors, KV caches, block masks).
  // Restore the throwing operator new; LLVM's own failures exit 1 above.
  std::set_new_handler(nullptr);
  llvm::install_bad_alloc_error_handler(reportLlvmOutOfMemory);
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
  try {
    return pagedc::driver::runDriver(registry, argc, argv);
  } catch (const std::bad_alloc &) {
    // An allocation no catch below names (the front end, MLIR): still an
    // error, not a crash.
    static constexpr char kMessage[] = "pagedc: error: out of memory\n";
    (void)!::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    return 1;
  }
}
