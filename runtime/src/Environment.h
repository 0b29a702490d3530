//===- Environment.h - The runtime's process-wide settings ------*- C++ -*-===//
//
// The one place the runtime reads its environment. Everything that changes
// what a call computes or how it launches is an option (AttentionOptions,
// KernelOptions, BatchAttentionConfig); what is left here belongs to the
// process and its machine, not to a call: where files go and where the
// runtime finds its tools and libraries.
//
//   variable               read by                 meaning (unset or empty)
//   PAGEDC_CACHE_DIR       KernelCache             kernel cache directory
//                                                  ($HOME/.cache/pagedc when
//                                                  unset; set but empty is an
//                                                  error, not the default)
//   PAGEDC_CUDA_DRIVER     CudaDriver              "emu": the SIMT emulator's
//                                                  driver instead of libcuda
//   PAGEDC_EMU_DRIVER      CudaDriver              the emulator driver library
//                                                  (looked for beside the
//                                                  binary, the build tree, the
//                                                  install prefix)
//   PAGEDC_EMU_CXX         EmulatorBuild           host compiler of emulator
//                                                  kernel images (the build's)
//   PAGEDC_CODEGEN_PLUGIN  CudaJit                 libpagedc-codegen.so to
//                                                  dlopen (beside the binary,
//                                                  the install prefix)
//   PAGEDC_TEMPLATE_DIR    KernelSource            test seam: kernel templates
//                                                  read from this directory
//                                                  (the embedded ones)
//   HOME, TMPDIR, PATH,    KernelCache,            the system's own meaning
//   LD_LIBRARY_PATH,       EmulatorBuild, Nvrtc
//   CUDA_HOME, CUDA_PATH
//
// The PAGEDC_PREFILL_* / PAGEDC_DECODE_* variables are not read by the
// runtime: kernelOptionsFromEnvironment() (KernelOptions.h) maps them to
// KernelOptions for the tools and tests that choose to, through
// kernelOptionVariable() below. The emulator reads its PAGEDC_EMU_* checker
// and scheduling settings in emulator/src/Settings.cpp.
//
// Values are read at each call, not once: tests and tools set them before
// the first use, and a value read late must still be the current one.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_ENVIRONMENT_H
#define PAGEDC_RUNTIME_ENVIRONMENT_H

namespace pagedc::env {

/// The process-wide settings of the table above.
enum class Setting {
  CacheDir,
  CudaDriver,
  EmuDriver,
  EmuCxx,
  CodegenPlugin,
  TemplateDir,
  Home,
  TmpDir,
  Path,
  LdLibraryPath,
  CudaHome,
  CudaPath,
};

/// The variable's name ("PAGEDC_CACHE_DIR", "HOME", ...).
const char *variableName(Setting setting);

/// The setting's value, or null when it is unset or empty.
const char *get(Setting setting);

/// Whether the setting's variable is set to the empty string (which get()
/// does not tell from unset).
bool isSetButEmpty(Setting setting);

/// The value of a kernel option's PAGEDC_* variable (KernelOptions.cpp's
/// table names them), or null when unset or empty; only
/// kernelOptionsFromEnvironment() calls it.
const char *kernelOptionVariable(const char *variable);

} // namespace pagedc::env

#endif // PAGEDC_RUNTIME_ENVIRONMENT_H
