//===- CudaJit.h - CUDA kernels straight from .attn text -------*- C++ -*-===//
//
// loadCudaMods() turns a .attn program, a mask/score selection, -D constant
// overrides and kernel configurations into compiled kernels, without linking
// the compiler:
//
//  1. The variant index. A source-level key (the program text, the mask and
//     score names, the overrides, every KernelConfig, the CompileOptions key,
//     the NVRTC library identity and the code generator's build id) names a
//     file `<cache dir>/<key>.variant`. It records the generated mod code,
//     the selection's param/buffer declarations and the disk keys of the
//     kernel entries. A hit reads that file and the kernel entries: no
//     compiler is loaded, no LLVM is mapped, NVRTC is not loaded.
//  2. On a miss the code generator plugin (CodegenPlugin.h,
//     libpagedc-codegen.so) is dlopened once per process and generates the
//     mod code; KernelCache::getOrCompileModules() compiles the modules the
//     CUDA backend loads (or finds them on disk); the variant is recorded
//     (temporary file + rename, checksummed).
//
// A variant file that is truncated or corrupt, names another key, or whose
// kernel entry is missing or corrupt is never an error: it is rebuilt and
// rewritten. If the plugin found at lookup time is not the file that wrote
// the variant (another build), the variant is regenerated as well.
//
// The plugin is searched for in this order: $PAGEDC_CODEGEN_PLUGIN (when set,
// the only place), <executable dir>/../lib/, the build tree it was built in,
// the install prefix.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_CUDAJIT_H
#define PAGEDC_CUDAJIT_H

#include "pagedc/KernelCache.h"
#include "pagedc/KernelSource.h"
#include "pagedc/Mods.h"
#include "pagedc/Nvrtc.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pagedc {

/// What loadCudaMods() builds.
struct CudaJitRequest {
  /// The .attn program text and the name its diagnostics use.
  std::string source;
  std::string fileName = "<input>";
  /// The selected mods; empty: none (the hook is neutral).
  std::string mask, score;
  /// -D NAME=VALUE constant overrides, in order.
  std::vector<std::pair<std::string, std::string>> overrides;
  /// One kernel per configuration. A paramsSize < 0 is replaced by the
  /// selection's Params size, so the kernel checks the host layout.
  std::vector<KernelConfig> configs;
  CompileOptions options;
};

/// How a request was served.
enum class CudaJitOutcome {
  /// Variant file and every kernel entry read from disk.
  VariantHit,
  /// The variant was valid but a kernel entry was missing or corrupt: the
  /// recorded mod code was compiled again (no plugin) and the variant
  /// rewritten.
  KernelsRebuilt,
  /// No usable variant: the plugin generated the mod code.
  Generated,
};
const char *cudaJitOutcomeName(CudaJitOutcome outcome);

struct CudaJitResult {
  /// maskName, scoreName, params, buffers and cuda.modCode (no CPU
  /// functions: those come from the CPU JIT).
  CompiledMods mods;
  /// One per request config, in order (config.paramsSize filled in): the
  /// modules the CUDA backend loads (KernelCache::getOrCompileModules), so
  /// the split kernel's unit for a split-KV decode config.
  std::vector<std::shared_ptr<const CompiledKernel>> kernels;
  /// One per request config: the merge unit of a split-KV decode config
  /// (hasSeparateMergeUnit), else null.
  std::vector<std::shared_ptr<const CompiledKernel>> mergeKernels;
  CudaJitOutcome outcome = CudaJitOutcome::Generated;
  /// The variant key (32 hex digits) and its file.
  std::string variantKey, variantPath;
  /// Whether this call used the code generator plugin.
  bool usedPlugin = false;
};

/// result.mods can go to flexAttention() on CUDA tensors (cuda.modCode is
/// set). That backend compiles through KernelCache::global(); loading with
/// that cache leaves kernels of the same config and options in its memory.
///
/// Serves `request` from the variant index of `cache`'s directory, else
/// generates and compiles it (see the top of this file). Throws pagedc::Error
/// for errors in the program (the plugin's file:line:col diagnostics), a
/// missing or unloadable plugin on a miss (naming every place searched) and
/// NVRTC failures. A memory-only cache (empty directory) has no variant
/// index: every call generates (the kernels still come from memory).
CudaJitResult loadCudaMods(const CudaJitRequest &request, KernelCache &cache);

/// The variant key of `request` (computes hashes only; loads nothing).
std::string cudaVariantKey(const CudaJitRequest &request);

/// "pagedc <version> templates <16 hex digits>": the version of this build
/// and a hash of its embedded kernel templates. The plugin reports its own
/// and loadCudaMods() refuses a plugin whose id differs.
const std::string &codegenBuildId();

/// The plugin file loadCudaMods() would load (search order above), or ""
/// with every place tried in `tried`. Does not load it.
std::string findCodegenPlugin(std::vector<std::string> *tried = nullptr);
/// Whether this process has loaded the plugin.
bool codegenPluginLoaded();

/// The plugin's answer for one program, as a C++ value.
struct GeneratedMods {
  std::string modCode;
  std::vector<ParamDecl> params;
  std::vector<BufferDecl> buffers;
};
/// Loads the plugin if needed and runs it; throws pagedc::Error with the
/// plugin's diagnostics on failure.
GeneratedMods generateModsWithPlugin(const CudaJitRequest &request);

/// The text form of a selection's declarations, shared by the plugin ABI and
/// the variant files: one line per param (`param NAME TYPE [VALUE]`) and per
/// buffer (`buffer NAME ELEM DIM,...`; DIM a number, a name or `?`).
std::string serializeModDeclarations(const std::vector<ParamDecl> &params,
                                     const std::vector<BufferDecl> &buffers);
/// The inverse; false (and nothing changed) for malformed text.
bool parseModDeclarations(const std::string &text, std::vector<ParamDecl> &params,
                          std::vector<BufferDecl> &buffers);

} // namespace pagedc

#endif // PAGEDC_CUDAJIT_H
