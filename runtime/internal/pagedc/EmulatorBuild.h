//===- EmulatorBuild.h - Kernels built for the SIMT emulator ----*- C++ -*-===//
//
// A kernel for the emulator (CompileOptions::arch "emu") is the unit NVRTC
// would compile, behind the embedded Emulator.cuh and the emulator's kernel
// ABI, compiled by the host C++ compiler with ThreadSanitizer
// instrumentation (whose hooks the emulator implements) into a shared
// object. The kernel cache stores these images like cubins.
//
// The compiler is $PAGEDC_EMU_CXX when set, else the compiler pagedc was
// built with, else `c++` (g++ or clang++).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_EMULATORBUILD_H
#define PAGEDC_EMULATORBUILD_H

#include "pagedc/KernelSource.h"
#include "pagedc/Nvrtc.h"

#include <string>
#include <string_view>

namespace pagedc {

/// The architecture name of the emulator.
constexpr std::string_view kEmulatorArch = "emu";
inline bool isEmulatorArch(std::string_view arch) { return arch == kEmulatorArch; }

/// Whether code for `arch` has sm_90's instructions (programmatic dependent
/// launches, bulk tensor copies): sm_90 and later, and the emulator, whose
/// code is sm_90's.
inline bool archHasSm90Features(std::string_view arch) {
  if (isEmulatorArch(arch))
    return true;
  if (arch.substr(0, 3) != "sm_")
    return false;
  int version = 0;
  for (char c : arch.substr(3)) {
    if (c < '0' || c > '9')
      break;
    version = version * 10 + (c - '0');
  }
  return version >= 90;
}

/// The host-compiler unit of `source`: #line directives name the template
/// files, and one exported entry per kernel follows the kernels.
std::string emulatorSource(const KernelSource &source);

/// What identifies the emulator build for cache keys: the compiler (path,
/// size, mtime), its flags, and the emulator's embedded headers.
const std::string &emulatorBuildIdentity();

/// Compiles `source` into an emulator image (emulator/include/pagedc-emu/
/// KernelAbi.h). Throws pagedc::Error with the compiler's output.
CompileResult compileForEmulator(const KernelSource &source);

/// What every emulator unit starts with: PAGEDC_EMULATOR, the kernel ABI
/// and Emulator.cuh. Hand-written kernels (tests) follow it with their own
/// code and PAGEDC_EMU_ENTRY(name) lines.
std::string emulatorPrologue();

/// Compiles any emulator unit (`what` names it in errors).
CompileResult compileEmulatorUnit(const std::string &code, const std::string &what);

} // namespace pagedc

#endif // PAGEDC_EMULATORBUILD_H
