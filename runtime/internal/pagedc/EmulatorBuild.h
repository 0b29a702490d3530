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

/// Checks a shared object before it becomes (or after it is read back as)
/// an emulator image: at most KernelCache::kMaxEntryBytes, an ELF header
/// with the right magic, 64-bit class, byte order, type (ET_DYN) and this
/// host's machine, and program headers, section headers and every segment's
/// file bytes inside the file. The dynamic loader maps segments straight
/// from the file, so a truncated object passed to dlopen faults (SIGBUS)
/// instead of failing; this is the check that keeps one out. Returns the
/// first problem found, or an empty string.
std::string checkEmulatorLibrary(std::string_view library);

/// checkEmulatorLibrary() for a whole image: its KernelAbi.h header (magic
/// and a size equal to the bytes that follow) and the library after it.
std::string checkEmulatorImage(std::string_view image);

} // namespace pagedc

#endif // PAGEDC_EMULATORBUILD_H
