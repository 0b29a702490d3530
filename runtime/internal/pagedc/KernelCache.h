//===- KernelCache.h - Compiled kernels in memory and on disk --*- C++ -*-===//
//
// getOrCompile() returns a compiled kernel for (config, mod code, options),
// looking in three places: an in-process map (a hash of the mod code and
// config, no source assembly), the on-disk directory ($PAGEDC_CACHE_DIR,
// default ~/.cache/pagedc), and finally NVRTC. Disk entries are keyed by a
// 128-bit XXH3 hash (xxHash) of the assembled source, the options, the NVRTC
// library's identity (nvrtcLibraryIdentity: path, size, mtime; a disk hit
// never loads NVRTC) and the architecture; each carries checksums so a truncated or
// corrupt entry is detected, removed and rebuilt; writes go to a temporary
// file renamed into place, so concurrent processes never see half an entry.
// Thread-safe: concurrent requests for one kernel compile it once.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_KERNELCACHE_H
#define PAGEDC_KERNELCACHE_H

#include "pagedc/KernelSource.h"
#include "pagedc/Nvrtc.h"

#include <atomic>
#include <cstdint>
#include <future>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace pagedc {

/// A compiled translation unit: one cubin (or PTX) and the kernels in it.
struct CompiledKernel {
  KernelConfig config;
  std::string arch;
  std::vector<std::string> kernelNames;
  /// The disk key (32 hex digits).
  std::string key;
  CompileOptions::Output output = CompileOptions::Output::Cubin;
  std::string image;
  /// NVRTC's log when compiled in this process (empty for disk hits).
  std::string log;
  /// Spill store bytes over the image's kernels from ptxas's report (a
  /// stack frame alone is not counted: sinf's slow path keeps an array
  /// there), kept in the disk entry: known for cubins compiled with
  /// CompileOptions::ptxasVerbose, else -1.
  int spillBytes = -1;
};

/// XXH3-64 (xxHash) of `data`: checksums of cache entries, bundles and
/// packs, and in-process keys. Chain with `seed` for several pieces.
uint64_t contentHash64(std::string_view data, uint64_t seed = 0);
/// XXH3-128 over `parts`, each length-prefixed, as 32 hex digits: the
/// content keys of kernel-cache entries and variant files.
std::string contentKey128(std::initializer_list<std::string_view> parts);

class KernelCache {
public:
  /// The largest entry file read from disk (header and image together).
  /// Cubins, PTX and emulator images of one kernel stay under a megabyte;
  /// a larger file at an entry's path (a sparse or runaway file) is corrupt:
  /// it is removed and the kernel rebuilt, and no buffer is ever sized from
  /// it.
  static constexpr uint64_t kMaxEntryBytes = uint64_t(64) << 20;

  /// `directory` empty: memory only. Otherwise it must be a directory (a
  /// symlink to one) this process can read, created with its parents when
  /// missing; anything else (a regular file, a FIFO, a dangling symlink, a
  /// path under a file, a directory it cannot search or create) throws
  /// pagedc::Error naming the path and why: a cache silently not used would
  /// compile every kernel again in every process. A directory it can read but
  /// not write is used read-only (a cache filled elsewhere and shipped
  /// read-only): its entries are used, new kernels stay in memory, and one
  /// warning goes to stderr.
  explicit KernelCache(std::string directory);
  /// $PAGEDC_CACHE_DIR, else $HOME/.cache/pagedc (else /tmp/pagedc-cache).
  /// Throws pagedc::Error when PAGEDC_CACHE_DIR is set but empty (likely an
  /// unset shell variable): the default directory is not a fallback.
  static std::string defaultDirectory();
  /// A process-wide cache in defaultDirectory(); throws as the constructor
  /// does, again at each call until the directory is usable.
  static KernelCache &global();
  /// Whether new entries (and variant files, CudaJit.h) are written to the
  /// directory: false for memory only and for a read-only directory.
  bool writable() const { return writable_; }

  /// The fast path: assembles the source only on an in-process miss.
  std::shared_ptr<const CompiledKernel>
  getOrCompile(const KernelConfig &config, std::string_view modCode,
               const CompileOptions &options);
  /// For an already assembled source (no in-process shortcut).
  std::shared_ptr<const CompiledKernel>
  getOrCompile(const KernelSource &source, const CompileOptions &options);

  struct Request {
    KernelConfig config;
    std::string modCode;
    CompileOptions options;
  };
  /// Compiles independent kernels in parallel (e.g. prefill and decode).
  std::vector<std::shared_ptr<const CompiledKernel>>
  getOrCompileAll(const std::vector<Request> &requests);

  /// The modules a launch of `config` loads (cudaKernelFor): where the
  /// kind has a merge unit of its own (hasSeparateMergeUnit: the split-KV
  /// decode), the split kernel's unit as `main` and the merge unit of its
  /// shape (decodeMergeConfig) as `merge`, compiled side by side; one unit
  /// shared by every mod variant of the shape. Otherwise the whole unit of
  /// getOrCompile() and no `merge`.
  struct Modules {
    std::shared_ptr<const CompiledKernel> main;
    std::shared_ptr<const CompiledKernel> merge;
  };
  Modules getOrCompileModules(const KernelConfig &config, std::string_view modCode,
                              const CompileOptions &options);
  /// getOrCompileModules for independent requests, in parallel.
  std::vector<Modules> getOrCompileAllModules(const std::vector<Request> &requests);
  /// One unit of `config` (assembleKernel's `unit`), with the in-process
  /// shortcut of getOrCompile(), which is this for KernelUnit::Whole.
  std::shared_ptr<const CompiledKernel> getOrCompileUnit(const KernelConfig &config,
                                                         std::string_view modCode,
                                                         const CompileOptions &options,
                                                         KernelUnit unit);

  /// Linked mods (KernelConfig::linkedMods): whether the kernel unit that
  /// every mod variant of `config`'s shape links against is compiled or
  /// under way in this process, or has a disk entry, so that a variant
  /// costs only its mods' unit and a link. On the emulator, which compiles
  /// each variant's mods into the kernel's own unit, whether a linked
  /// kernel of the shape was built or prepared in this process.
  bool linkedKernelUnitKnown(const KernelConfig &config, std::string_view modCode,
                             const CompileOptions &options);
  /// Builds that shared unit without a variant's mods (on the emulator,
  /// records the shape as prepared), so that the shape's next variant
  /// links at once; returns when it is built.
  void prepareLinkedKernelUnit(const KernelConfig &config, std::string_view modCode,
                               const CompileOptions &options);

  /// The kernel recorded under disk key `key` by an earlier process (the
  /// variant index, CudaJit.h, stores such keys), for `config`: from memory
  /// or from the disk entry, which counts as a disk hit. nullptr when there
  /// is no entry or it is corrupt (then it is removed). The caller vouches
  /// that `key` is the key of (config, modCode, options, unit); on a hit
  /// the in-process map learns it, so a later getOrCompileUnit(config,
  /// modCode, options, unit) is a memory hit.
  std::shared_ptr<const CompiledKernel>
  lookupEntry(const std::string &key, const KernelConfig &config,
              std::string_view modCode, const CompileOptions &options,
              KernelUnit unit = KernelUnit::Whole);

  /// The disk key of a source compiled with `options`.
  static std::string diskKey(std::string_view code,
                             const CompileOptions &options);
  /// The file an entry with this key lives in.
  std::string entryPath(const std::string &key) const;
  const std::string &directory() const { return directory_; }

  struct Stats {
    uint64_t memoryHits = 0;
    uint64_t diskHits = 0;
    uint64_t compiles = 0;
    uint64_t corruptEntries = 0;
    /// nvJitLink runs (kernels with linked mods; not counted in compiles).
    uint64_t links = 0;
    /// Seconds inside NVRTC over this cache's compiles, and NVRTC's own
    /// split of them over the compiles that asked for it
    /// (CompileOptions::timeStages; CompileResult::Stages).
    double nvrtcSeconds = 0;
    double frontEndSeconds = 0;
    double optimizerSeconds = 0;
    double ptxToSassSeconds = 0;
  };
  Stats stats() const;
  /// Forgets the in-process entries (the disk is untouched).
  void clearMemory();

private:
  using Future = std::shared_future<std::shared_ptr<const CompiledKernel>>;
  struct FastEntry {
    KernelConfig config;
    std::string modCode;
    std::string optionsKey;
    KernelUnit unit = KernelUnit::Whole;
    Future result;
    bool matches(const KernelConfig &otherConfig, std::string_view otherModCode,
                 const std::string &otherOptionsKey, KernelUnit otherUnit) const {
      return config == otherConfig && modCode == otherModCode &&
             optionsKey == otherOptionsKey && unit == otherUnit;
    }
  };

  /// The in-process entry of a unit, compiled or under way; invalid when
  /// there is none.
  Future knownUnit(const KernelConfig &config, std::string_view modCode,
                   const CompileOptions &options, KernelUnit unit);
  std::shared_ptr<const CompiledKernel> loadOrBuild(const KernelSource &source,
                                                    const CompileOptions &options,
                                                    const std::string &key);
  /// A kernel with linked mods (KernelConfig::linkedMods): `kernel` (its
  /// unit with linkedModHooks) and the mods' unit compiled relocatable and
  /// linked by nvJitLink, the link an entry of its own keyed by both units'
  /// keys; on the emulator one unit holding both.
  std::shared_ptr<const CompiledKernel> linkMods(const KernelSource &kernel,
                                                 std::string_view modCode,
                                                 const CompileOptions &options);
  /// The unit a linked `config` shares with its shape's variants (the
  /// unit its launch's main module comes from) and the options it is
  /// compiled with.
  static KernelSource linkedKernelSource(const KernelConfig &config, std::string_view modCode);
  static CompileOptions relocatable(const CompileOptions &options);
  /// The disk key of that shared unit, compiled relocatable.
  static std::string linkedUnitKey(const KernelSource &kernel, const CompileOptions &options);
  std::shared_ptr<const CompiledKernel> readEntry(const std::string &key);
  /// readEntry counted as a disk hit, its config set to `config` (an entry
  /// records its config as text, not every field of it).
  std::shared_ptr<const CompiledKernel> diskHit(const std::string &key,
                                                const KernelConfig &config);
  void writeEntry(const CompiledKernel &kernel);

  std::string directory_;
  bool writable_ = false;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, std::vector<FastEntry>> fast_;
  std::unordered_map<std::string, Future> byKey_;
  /// Emulator: the disk keys of the linked kernel units whose shapes were
  /// built or prepared (linkedKernelUnitKnown).
  std::unordered_set<std::string> emulatedLinkedUnits_;
  std::atomic<uint64_t> memoryHits_{0}, diskHits_{0}, compiles_{0},
      corruptEntries_{0}, links_{0};
  mutable std::mutex timesMutex_;
  Stats times_; // the NVRTC times only
};

/// The prefill tile to compile for `config` (choosePrefillShapeFor(arch)
/// done) on a GPU target `arch`: where that is a tile kept only without
/// spills (KernelConfig::prefillFallsBackOnSpills), it is compiled through
/// `cache` with ptxas's report (cudaCompileOptions) and, if it spills or the
/// entry cannot say, replaced by the next tile (usePrefillSpillFallback:
/// 128 x 64 for the 128 x 128 warpgroup tile; for 128 x 32 the same tile
/// recomputing the mods' row values per KV tile, then 64 x 64), which is
/// tried in turn. The last compile is the one the caller then finds
/// in the cache. Other configs and the emulator are returned as they are.
KernelConfig settlePrefillShape(KernelConfig config, std::string_view modCode,
                                const std::string &arch,
                                KernelCache &cache = KernelCache::global());
/// Cubin options for `config` on `arch` (compileArchFor), with ptxas's
/// report where settlePrefillShape reads it (the runtime's compiles).
CompileOptions cudaCompileOptions(const KernelConfig &config, const std::string &arch);

} // namespace pagedc

#endif // PAGEDC_KERNELCACHE_H
