//===- Nvrtc.h - Run-time CUDA compilation through NVRTC -------*- C++ -*-===//
//
// NVRTC is loaded with dlopen on first use, so binaries start on machines
// without a CUDA toolkit. Search order: $CUDA_HOME/lib64, $CUDA_PATH/lib64,
// the dynamic linker's path (libnvrtc.so.13, .12, libnvrtc.so), and last the
// toolkit this build was configured with.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_NVRTC_H
#define PAGEDC_NVRTC_H

#include "pagedc/KernelSource.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagedc {

/// How a translation unit is compiled.
struct CompileOptions {
  /// Target: "sm_80", "sm_90", "sm_90a", ... A cubin is built for this exact
  /// architecture (--gpu-architecture=sm_XX, nvrtcGetCUBIN); PTX for the
  /// matching virtual one (compute_XX, nvrtcGetPTX).
  std::string arch = "sm_90";
  enum class Output : uint8_t { Cubin, Ptx };
  Output output = Output::Cubin;
  /// Ask ptxas for its resource report (registers, spills) in the log.
  bool ptxasVerbose = false;
  /// Appended verbatim after the standard options.
  std::vector<std::string> extraOptions;
  /// Ask NVRTC for the time it spends in each of its stages
  /// (CompileResult::stages; NVRTC writes them to a temporary file, removed
  /// after reading). Changes neither the output nor the log, so it is not
  /// part of key().
  bool timeStages = false;

  /// The complete NVRTC option list for this configuration.
  std::vector<std::string> nvrtcOptions() const;
  /// A canonical string of everything that changes the output.
  std::string key() const;
};

/// The result of one compilation.
struct CompileResult {
  /// cubin bytes or PTX text.
  std::string image;
  /// NVRTC's log (warnings; the ptxas report when asked for).
  std::string log;
  double seconds = 0.0;
  /// NVRTC's own times in seconds (CompileOptions::timeStages; -1 when not
  /// asked for or not reported): the C++ front end, the NVVM optimizer
  /// (with code generation to PTX) and the PTX to SASS translation (ptxas;
  /// a PTX output has none).
  struct Stages {
    double frontEnd = -1;
    double optimizer = -1;
    double ptxToSass = -1;
  } stages;
};

/// One kernel's line of the ptxas resource report.
struct PtxasKernelReport {
  std::string kernel;
  std::string arch;
  int registers = 0;
  int stackFrameBytes = 0;
  int spillStoreBytes = 0;
  int spillLoadBytes = 0;
};
/// Parses "-Xptxas -v" output (from an NVRTC log or nvcc's stderr).
std::vector<PtxasKernelReport> parsePtxasReport(std::string_view log);

/// The loaded NVRTC library.
class Nvrtc {
public:
  /// The process-wide instance; throws pagedc::Error saying why NVRTC could
  /// not be loaded (every path tried).
  static const Nvrtc &get();
  /// Whether NVRTC can be loaded; sets `reason` when it cannot.
  static bool available(std::string *reason = nullptr);

  /// NVRTC's version, e.g. {13, 0}.
  int majorVersion() const { return major_; }
  int minorVersion() const { return minor_; }
  /// The library file that was loaded (as found on the candidate list) and
  /// its resolved real path.
  const std::string &libraryPath() const { return path_; }
  const std::string &libraryRealPath() const { return realPath_; }
  /// Real architectures this NVRTC can target (e.g. 75, 80, 90, 100).
  std::vector<int> supportedArchitectures() const;

  /// Compiles `code` (named `name` in diagnostics). On failure throws
  /// pagedc::Error with the full log, and for each error the quoted source
  /// line; `kernel`, when given, maps lines in its generated mod code back
  /// to the generator's own line numbers.
  CompileResult compile(std::string_view code, std::string_view name,
                        const CompileOptions &options,
                        const KernelSource *kernel = nullptr) const;

  struct Api;

private:
  Nvrtc() = default;
  const Api *api_ = nullptr;
  std::string path_, realPath_;
  int major_ = 0, minor_ = 0;
};

/// nvJitLink, loaded at run time like NVRTC: links the relocatable cubins
/// of a kernel with linked mods and of its mods' unit
/// (KernelConfig::linkedMods) into one cubin.
class NvJitLink {
public:
  /// Whether nvJitLink can be loaded; sets `reason` (every path tried) when
  /// it cannot.
  static bool available(std::string *reason = nullptr);
  /// Links `cubins` (relocatable, compiled with -rdc=true) for `arch`
  /// (e.g. "sm_90a"); throws pagedc::Error with nvJitLink's log on failure
  /// (an unresolved or twice-defined function, a cubin of another arch).
  static std::string link(const std::vector<std::string_view> &cubins, const std::string &arch);
  /// "realpath|size|mtime" of the library loaded: linked entries of the
  /// kernel cache are keyed by it.
  static const std::string &identity();
};

/// Identifies the NVRTC library that Nvrtc::get() would load without
/// loading it (loading takes ~25 ms): "realpath|size|mtime" of the first
/// candidate found, searching bare names in LD_LIBRARY_PATH, the directories
/// of /etc/ld.so.conf.d and the standard library directories the way the
/// dynamic linker does. Empty when none is found. The kernel cache keys disk
/// entries with it, so a warm hit needs no NVRTC.
const std::string &nvrtcLibraryIdentity();

/// Directories and file names a CUDA library is looked for in, in order:
/// $CUDA_HOME, $CUDA_PATH, the linker path, the build's toolkit.
std::vector<std::string> cudaLibraryCandidates(
    const std::vector<std::string> &fileNames);
/// The toolkit this build was configured with ("" when none).
std::string buildCudaRoot();
/// The CUDA headers' directory: $CUDA_HOME/include, $CUDA_PATH/include or
/// the build's toolkit ("" when none exists). Kernel units need no header;
/// a caller whose code includes one adds "-I" + this to extraOptions.
std::string cudaIncludeDirectory();

} // namespace pagedc

#endif // PAGEDC_NVRTC_H
