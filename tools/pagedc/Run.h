//===- Run.h - `pagedc run` and `pagedc demo` ------------------*- C++ -*-===//
//
// Subcommands that execute compiled mods: `pagedc run` computes attention on
// .npy inputs through the runtime (CPU JIT mods, paged KV cache, block
// mask), and `pagedc demo` runs a small paged decode loop checked against the
// float64 reference. Built when the CPU JIT is (PAGEDC_HAVE_RUN).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_TOOLS_RUN_H
#define PAGEDC_TOOLS_RUN_H

#include "Driver.h"

namespace pagedc::driver {

/// Registers `pagedc run` and `pagedc demo`.
void registerRunSubcommands(Registry &registry);

/// `pagedc run ARGS...`; returns the exit code.
int runAttentionCommand(llvm::ArrayRef<const char *> args);
/// `pagedc demo ARGS...`; returns the exit code.
int runDemoCommand(llvm::ArrayRef<const char *> args);

} // namespace pagedc::driver

#endif // PAGEDC_TOOLS_RUN_H
