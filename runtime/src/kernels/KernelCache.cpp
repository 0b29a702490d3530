//===- KernelCache.cpp - Compiled kernels in memory and on disk -----------===//

#include "pagedc/KernelCache.h"
#include "Environment.h"

#include "SealedFile.h"
#include "TestHooks.h"

#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

// xxHash compiled into this unit (header-only), no library to link.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace pagedc {

namespace fs = std::filesystem;

uint64_t contentHash64(std::string_view data, uint64_t seed) {
  return XXH3_64bits_withSeed(data.data(), data.size(), seed);
}

std::string contentKey128(std::initializer_list<std::string_view> parts) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  for (std::string_view part : parts) {
    const uint64_t size = part.size();
    XXH3_128bits_update(&state, &size, sizeof(size));
    XXH3_128bits_update(&state, part.data(), part.size());
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(&state);
  return fmt::format("{:016x}{:016x}", hash.high64, hash.low64);
}

namespace {

constexpr std::string_view kEntryMagic = "PAGEDC-KERNEL-CACHE 1\n";

using sealed::hex64;

/// Hash of the in-process key: mod code, config and options.
uint64_t fastHash(const KernelConfig &config, std::string_view modCode,
                  const std::string &optionsKey, KernelUnit unit) {
  uint64_t hash = contentHash64(modCode);
  hash = contentHash64(optionsKey, hash);
  const int fields[] = {static_cast<int>(config.kind),
                        static_cast<int>(config.elementType),
                        config.headDim,
                        config.valueDim(),
                        config.pageSize,
                        config.blockM,
                        config.warpRows,
                        config.recomputeModRows ? 1 : 0,
                        config.prefillStageLimit,
                        config.prefillCtasPerSm,
                        config.blockN,
                        config.groupSize,
                        config.queryTokens,
                        config.returnLse ? 1 : 0,
                        static_cast<int>(config.paramsSize),
                        config.packedBatch ? 1 : 0,
                        config.kvFloat8 ? 1 + static_cast<int>(*config.kvFloat8) : 0,
                        config.outputF32 ? 1 : 0,
                        config.groupRows ? 1 : 0,
                        config.noBlockMask ? 1 : 0,
                        config.linkedMods ? 1 : 0,
                        static_cast<int>(unit)};
  return contentHash64(std::string_view(reinterpret_cast<const char *>(fields), sizeof(fields)),
                       hash);
}

/// `compile` of each request on a thread of its own; the results in order.
/// The first failure (in order) is rethrown once every thread has ended
/// (a std::async future waits for its thread when destroyed).
template <typename Request, typename Compile>
auto eachInParallel(const std::vector<Request> &requests, Compile compile)
    -> std::vector<decltype(compile(requests.front()))> {
  std::vector<std::future<decltype(compile(requests.front()))>> futures;
  for (const Request &request : requests)
    futures.push_back(std::async(std::launch::async, [&compile, &request] {
      return compile(request);
    }));
  std::vector<decltype(compile(requests.front()))> results;
  for (auto &future : futures)
    results.push_back(future.get());
  return results;
}

/// Entry layout (SealedFile.h): the kernel's key, arch, kernel names and
/// configuration in the header, the image as the payload.
std::string serializeEntry(const CompiledKernel &kernel) {
  std::string names;
  for (const std::string &name : kernel.kernelNames)
    names += (names.empty() ? "" : ",") + name;
  std::string header = fmt::format(
      "key={}\narch={}\nkernels={}\nconfig={}\nimage={}\nspills={}\n", kernel.key,
      kernel.arch, names, kernel.config.describe(),
      kernel.output == CompileOptions::Output::Cubin ? "cubin" : "ptx", kernel.spillBytes);
  return sealed::seal(kEntryMagic, std::move(header), kernel.image);
}

/// Parses an entry; returns false for anything malformed or inconsistent.
bool parseEntry(const std::string &bytes, const std::string &key,
                CompiledKernel &kernel) {
  std::map<std::string, std::string> fields;
  std::string_view image;
  if (!sealed::open(bytes, kEntryMagic, fields, image) || fields["key"] != key)
    return false;
  kernel.image = std::string(image);
  kernel.key = key;
  kernel.arch = fields["arch"];
  kernel.output = fields["image"] == "ptx" ? CompileOptions::Output::Ptx
                                           : CompileOptions::Output::Cubin;
  kernel.spillBytes = -1;
  if (auto spills = fields.find("spills"); spills != fields.end())
    kernel.spillBytes = std::atoi(spills->second.c_str());
  // The checksum vouches for the bytes written, not that they were a whole
  // shared object when sealed; dlopen of a truncated one faults, so an
  // emulator image is checked again here and dropped when it fails.
  if (isEmulatorArch(kernel.arch) && !checkEmulatorImage(kernel.image).empty())
    return false;
  kernel.kernelNames.clear();
  std::istringstream names(fields["kernels"]);
  for (std::string name; std::getline(names, name, ',');)
    kernel.kernelNames.push_back(name);
  return !kernel.kernelNames.empty();
}

/// What a file that is not a directory is, for messages.
const char *fileKind(mode_t mode) {
  if (S_ISREG(mode))
    return "a regular file";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode))
    return "a device";
  return "not a directory";
}

/// Why `path`, which stat() cannot reach, cannot be a directory: the first
/// of it and its ancestors that is a dangling symlink or not a directory,
/// or empty when nothing stands in the way (then it is only missing).
std::string obstacle(const fs::path &path) {
  for (fs::path at = path; !at.empty(); at = at.parent_path()) {
    struct stat info;
    if (::lstat(at.c_str(), &info) == 0) {
      std::string named = at == path ? "it" : fmt::format("'{}'", at.string());
      if (S_ISLNK(info.st_mode) && ::stat(at.c_str(), &info) != 0) {
        std::error_code ignored;
        return fmt::format("{} is a dangling symbolic link (to '{}')", named,
                           fs::read_symlink(at, ignored).string());
      }
      if (!S_ISDIR(info.st_mode) && ::stat(at.c_str(), &info) == 0 && !S_ISDIR(info.st_mode))
        return fmt::format("{} is {}, not a directory", named, fileKind(info.st_mode));
      return "";
    }
    if (at == at.parent_path())
      break;
  }
  return "";
}

/// Checks `directory` as a kernel cache directory, creating it when missing;
/// returns why this process may not write it (empty when it may). Throws
/// pagedc::Error naming the path and what stands in the way; nothing is
/// written anywhere else instead.
std::string prepareCacheDirectory(const std::string &directory) {
  auto refuse = [&](const std::string &why) {
    return Error(fmt::format("kernel cache directory '{}': {}", directory, why));
  };
  struct stat info;
  if (::stat(directory.c_str(), &info) != 0) {
    const int error = errno;
    std::string why = obstacle(directory);
    if (!why.empty())
      throw refuse(why);
    if (error != ENOENT)
      throw refuse(std::strerror(error));
    std::error_code created;
    fs::create_directories(directory, created);
    if (created || ::stat(directory.c_str(), &info) != 0)
      throw refuse("it does not exist and cannot be created: " +
                   (created ? created.message() : std::string(std::strerror(errno))));
  }
  if (!S_ISDIR(info.st_mode))
    throw refuse(fmt::format("it is {}, not a directory", fileKind(info.st_mode)));
  // Effective ids, as open() checks them; a read-only file system is EROFS.
  if (::faccessat(AT_FDCWD, directory.c_str(), R_OK | X_OK, AT_EACCESS) != 0)
    throw refuse(fmt::format("it cannot be read: {}", std::strerror(errno)));
  if (::faccessat(AT_FDCWD, directory.c_str(), W_OK, AT_EACCESS) != 0)
    return std::strerror(errno);
  return "";
}

} // namespace

KernelCache::KernelCache(std::string directory) : directory_(std::move(directory)) {
  if (directory_.empty())
    return;
  const std::string readOnly = prepareCacheDirectory(directory_);
  writable_ = readOnly.empty();
  if (!writable_)
    fmt::print(stderr,
               "pagedc: warning: kernel cache directory '{}' is not writable ({}): its "
               "entries are used, kernels compiled by this process are not saved\n",
               directory_, readOnly);
}

std::string KernelCache::defaultDirectory() {
  if (env::isSetButEmpty(env::Setting::CacheDir))
    throw Error(fmt::format("{} is set but empty: name the kernel cache directory, or unset "
                            "it for $HOME/.cache/pagedc",
                            env::variableName(env::Setting::CacheDir)));
  if (const char *dir = env::get(env::Setting::CacheDir))
    return dir;
  if (const char *home = env::get(env::Setting::Home))
    return std::string(home) + "/.cache/pagedc";
  return "/tmp/pagedc-cache";
}

KernelCache &KernelCache::global() {
  static KernelCache cache(defaultDirectory());
  return cache;
}

std::string KernelCache::diskKey(std::string_view code,
                                 const CompileOptions &options) {
  // The NVRTC library is identified by file (path, size, mtime) rather than
  // by nvrtcVersion(), so a disk hit never loads NVRTC.
  // Emulator images depend on the host compiler instead (EmulatorBuild.h).
  std::string material =
      isEmulatorArch(options.arch)
          ? fmt::format("{}\narch {}\noptions {}\n", emulatorBuildIdentity(), options.arch,
                        options.key())
          : fmt::format("nvrtc {}\narch {}\noptions {}\n", nvrtcLibraryIdentity(), options.arch,
                        options.key());
  return contentKey128({material, code});
}

std::string KernelCache::entryPath(const std::string &key) const {
  return directory_ + "/" + key + ".kernel";
}

KernelCache::Stats KernelCache::stats() const {
  Stats stats;
  {
    std::lock_guard<std::mutex> lock(timesMutex_);
    stats = times_;
  }
  stats.memoryHits = memoryHits_;
  stats.diskHits = diskHits_;
  stats.compiles = compiles_;
  stats.corruptEntries = corruptEntries_;
  stats.links = links_;
  return stats;
}

void KernelCache::clearMemory() {
  std::lock_guard<std::mutex> lock(mutex_);
  fast_.clear();
  byKey_.clear();
}

std::shared_ptr<const CompiledKernel> KernelCache::diskHit(const std::string &key,
                                                           const KernelConfig &config) {
  auto kernel = readEntry(key);
  if (!kernel)
    return nullptr;
  std::const_pointer_cast<CompiledKernel>(kernel)->config = config;
  ++diskHits_;
  return kernel;
}

std::shared_ptr<const CompiledKernel> KernelCache::readEntry(const std::string &key) {
  if (directory_.empty())
    return nullptr;
  std::string path = entryPath(key);
  std::string bytes;
  // Never blocks or follows a link: a FIFO, a symlink or a directory at the
  // entry's path is a corrupt entry, removed and rebuilt.
  // A file larger than kMaxEntryBytes is refused before any buffer is sized.
  const sealed::ReadStatus status = sealed::readEntryFile(path, bytes, kMaxEntryBytes);
  if (status == sealed::ReadStatus::Missing || status == sealed::ReadStatus::Unreadable)
    return nullptr;
  auto kernel = std::make_shared<CompiledKernel>();
  if (sealed::isCorrupt(status) || !parseEntry(bytes, key, *kernel)) {
    ++corruptEntries_;
    sealed::removeEntry(path);
    return nullptr;
  }
  return kernel;
}

void KernelCache::writeEntry(const CompiledKernel &kernel) {
  if (writable_) // a failed write (a full disk) only makes a later process slower
    sealed::writeAtomically(entryPath(kernel.key), serializeEntry(kernel));
}

namespace {

/// Whether the loaded NVRTC is the file disk keys name (nvrtcLibraryIdentity):
/// only then is an entry it built cached, since a later process could not
/// trust an entry its key does not describe.
bool keyedNvrtcIsLoaded() {
  const std::string &identity = nvrtcLibraryIdentity();
  const std::string &loaded = Nvrtc::get().libraryRealPath();
  return !identity.empty() && identity.compare(0, loaded.size() + 1, loaded + "|") == 0;
}

} // namespace

std::shared_ptr<const CompiledKernel>
KernelCache::loadOrBuild(const KernelSource &source, const CompileOptions &options,
                         const std::string &key) {
  if (auto kernel = diskHit(key, source.config))
    return kernel;
  auto kernel = std::make_shared<CompiledKernel>();
  const bool emulator = isEmulatorArch(options.arch);
  CompileResult compiled =
      emulator ? compileForEmulator(source)
               : Nvrtc::get().compile(
                     source.code, fmt::format("pagedc_{}.cu", kernelKindName(source.config.kind)),
                     options, &source);
  ++compiles_;
  if (!emulator) {
    std::lock_guard<std::mutex> lock(timesMutex_);
    times_.nvrtcSeconds += compiled.seconds;
    times_.frontEndSeconds += std::max(0.0, compiled.stages.frontEnd);
    times_.optimizerSeconds += std::max(0.0, compiled.stages.optimizer);
    times_.ptxToSassSeconds += std::max(0.0, compiled.stages.ptxToSass);
  }
  kernel->config = source.config;
  kernel->arch = options.arch;
  kernel->kernelNames = source.kernelNames;
  kernel->key = key;
  kernel->output = options.output;
  kernel->image = std::move(compiled.image);
  kernel->log = std::move(compiled.log);
  if (!emulator && options.ptxasVerbose && options.output == CompileOptions::Output::Cubin) {
    // No report to read (a log without it) leaves the figure unknown.
    const std::vector<PtxasKernelReport> reports = parsePtxasReport(kernel->log);
    kernel->spillBytes = reports.empty() ? -1 : 0;
    for (const PtxasKernelReport &report : reports)
      kernel->spillBytes += report.spillStoreBytes;
  }
  if (emulator || keyedNvrtcIsLoaded())
    writeEntry(*kernel);
  return kernel;
}

std::shared_ptr<const CompiledKernel>
KernelCache::getOrCompile(const KernelSource &source, const CompileOptions &options) {
  std::string key = diskKey(source.code, options);
  std::promise<std::shared_ptr<const CompiledKernel>> promise;
  Future pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = byKey_.find(key);
    if (found != byKey_.end()) {
      pending = found->second;
      ++memoryHits_;
    } else {
      byKey_.emplace(key, promise.get_future().share());
    }
  }
  // Wait for another thread's compile outside the lock: that thread needs
  // the lock to finish.
  if (pending.valid())
    return pending.get();
  try {
    auto kernel = loadOrBuild(source, options, key);
    promise.set_value(kernel);
    return kernel;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(mutex_);
    byKey_.erase(key); // a later call retries
    throw;
  }
}

std::shared_ptr<const CompiledKernel>
KernelCache::getOrCompile(const KernelConfig &config, std::string_view modCode,
                          const CompileOptions &options) {
  return getOrCompileUnit(config, modCode, options, KernelUnit::Whole);
}

KernelCache::Modules KernelCache::getOrCompileModules(const KernelConfig &config,
                                                      std::string_view modCode,
                                                      const CompileOptions &options) {
  if (!hasSeparateMergeUnit(config))
    return {getOrCompile(config, modCode, options), nullptr};
  const KernelConfig mergeConfig = decodeMergeConfig(config);
  // Compiled already (one merge unit serves every variant of a shape): no
  // thread for it.
  if (Future known = knownUnit(mergeConfig, "", options, KernelUnit::DecodeMerge);
      known.valid() && known.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    ++memoryHits_;
    Modules modules;
    modules.merge = known.get();
    modules.main = getOrCompileUnit(config, modCode, options, KernelUnit::DecodeSplit);
    return modules;
  }
  // The merge unit on another thread: on the first decode of a shape it is
  // a compile of its own, which would otherwise follow the split kernel's.
  auto merge = std::async(std::launch::async, [this, &mergeConfig, &options] {
    return getOrCompileUnit(mergeConfig, "", options, KernelUnit::DecodeMerge);
  });
  Modules modules;
  try {
    modules.main = getOrCompileUnit(config, modCode, options, KernelUnit::DecodeSplit);
  } catch (...) {
    merge.wait(); // it reads mergeConfig and options
    throw;
  }
  modules.merge = merge.get();
  return modules;
}

KernelCache::Future KernelCache::knownUnit(const KernelConfig &config, std::string_view modCode,
                                           const CompileOptions &options, KernelUnit unit) {
  const std::string optionsKey = options.key();
  const uint64_t hash = fastHash(config, modCode, optionsKey, unit);
  std::lock_guard<std::mutex> lock(mutex_);
  auto bucket = fast_.find(hash);
  if (bucket != fast_.end())
    for (const FastEntry &entry : bucket->second)
      if (entry.matches(config, modCode, optionsKey, unit))
        return entry.result;
  return {};
}

std::vector<KernelCache::Modules>
KernelCache::getOrCompileAllModules(const std::vector<Request> &requests) {
  return eachInParallel(requests, [this](const Request &request) {
    return getOrCompileModules(request.config, request.modCode, request.options);
  });
}

std::shared_ptr<const CompiledKernel>
KernelCache::getOrCompileUnit(const KernelConfig &config, std::string_view modCode,
                              const CompileOptions &options, KernelUnit unit) {
  std::string optionsKey = options.key();
  uint64_t hash = fastHash(config, modCode, optionsKey, unit);
  std::promise<std::shared_ptr<const CompiledKernel>> promise;
  Future pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto &bucket = fast_[hash];
    for (const FastEntry &entry : bucket) {
      if (entry.matches(config, modCode, optionsKey, unit)) {
        pending = entry.result;
        ++memoryHits_;
        break;
      }
    }
    if (!pending.valid())
      bucket.push_back({config, std::string(modCode), optionsKey, unit,
                        promise.get_future().share()});
  }
  // As above: never wait for a compile while holding the lock.
  if (pending.valid())
    return pending.get();
  try {
    KernelSource source = assembleKernel(config, modCode, unit);
    // (A merge unit's config never links: decodeMergeConfig.)
    auto kernel =
        config.linkedMods ? linkMods(source, modCode, options) : getOrCompile(source, options);
    promise.set_value(kernel);
    return kernel;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(mutex_);
    auto &bucket = fast_[hash];
    for (auto it = bucket.begin(); it != bucket.end(); ++it)
      if (it->matches(config, modCode, optionsKey, unit)) {
        bucket.erase(it);
        break;
      }
    throw;
  }
}

namespace {

/// The unit a launch's main module comes from (getOrCompileModules).
KernelUnit mainUnit(const KernelConfig &config) {
  return hasSeparateMergeUnit(config) ? KernelUnit::DecodeSplit : KernelUnit::Whole;
}

} // namespace

KernelSource KernelCache::linkedKernelSource(const KernelConfig &config,
                                             std::string_view modCode) {
  if (!config.linkedMods)
    throw Error(fmt::format("the {} kernel inlines its mods: it shares no unit with other "
                            "variants",
                            config.describe()));
  return assembleKernel(config, modCode, mainUnit(config));
}

std::string KernelCache::linkedUnitKey(const KernelSource &kernel, const CompileOptions &options) {
  return diskKey(kernel.code, relocatable(options));
}

CompileOptions KernelCache::relocatable(const CompileOptions &options) {
  CompileOptions relocatable = options;
  relocatable.extraOptions.push_back("-rdc=true");
  return relocatable;
}

bool KernelCache::linkedKernelUnitKnown(const KernelConfig &config, std::string_view modCode,
                                        const CompileOptions &options) {
  // This variant linked in this process (its in-memory entry, no source
  // assembled): its shape's unit is known.
  if (config.linkedMods && knownUnit(config, modCode, options, mainUnit(config)).valid())
    return true;
  const std::string key = linkedUnitKey(linkedKernelSource(config, modCode), options);
  const bool emulator = isEmulatorArch(options.arch);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (emulator ? emulatedLinkedUnits_.count(key) != 0 : byKey_.count(key) != 0)
      return true;
  }
  // An entry on disk counts unread: one that proves corrupt is rebuilt by
  // the link that wanted it, as any other.
  std::error_code error;
  return !emulator && !directory_.empty() && std::filesystem::exists(entryPath(key), error);
}

void KernelCache::prepareLinkedKernelUnit(const KernelConfig &config, std::string_view modCode,
                                          const CompileOptions &options) {
  const KernelSource kernel = linkedKernelSource(config, modCode);
  if (isEmulatorArch(options.arch)) {
    std::lock_guard<std::mutex> lock(mutex_);
    emulatedLinkedUnits_.insert(linkedUnitKey(kernel, options));
    return;
  }
  getOrCompile(kernel, relocatable(options));
}

std::shared_ptr<const CompiledKernel>
KernelCache::linkMods(const KernelSource &kernel, std::string_view modCode,
                      const CompileOptions &options) {
  // The emulator builds one shared object per unit: the mods' definitions
  // are compiled into the kernel's unit, behind the same hooks.
  if (isEmulatorArch(options.arch)) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      emulatedLinkedUnits_.insert(linkedUnitKey(kernel, options));
    }
    KernelSource whole = kernel;
    whole.code += "// ---- linked mod code ----\n";
    whole.code += linkedModDefinitions(modCode, kernel.config.paramsSize);
    return getOrCompile(whole, options);
  }
  if (options.output != CompileOptions::Output::Cubin)
    throw Error(fmt::format("the {} kernel links its mods as cubins: its compile options must "
                            "ask for a cubin, not PTX",
                            kernel.config.describe()));
  const CompileOptions kernelOptions = relocatable(options);
  CompileOptions modsOptions = kernelOptions;
  modsOptions.ptxasVerbose = false;
  const KernelSource mods = assembleLinkedMods(kernel.config, modCode);
  // The kernel's unit serves every variant of its shape: after the first
  // variant a memory or disk hit. The first compiles both side by side.
  auto kernelUnit =
      std::async(std::launch::async, [&] { return getOrCompile(kernel, kernelOptions); });
  std::shared_ptr<const CompiledKernel> modsUnit;
  try {
    modsUnit = getOrCompile(mods, modsOptions);
  } catch (...) {
    kernelUnit.wait(); // it reads `kernel` and `kernelOptions`
    throw;
  }
  const std::shared_ptr<const CompiledKernel> generic = kernelUnit.get();
  const std::string key =
      contentKey128({"linked mods", generic->key, modsUnit->key, NvJitLink::identity()});
  if (auto found = diskHit(key, kernel.config))
    return found;
  auto linked = std::make_shared<CompiledKernel>();
  linked->config = kernel.config;
  linked->arch = options.arch;
  linked->kernelNames = kernel.kernelNames;
  linked->key = key;
  linked->output = CompileOptions::Output::Cubin;
  linked->image = NvJitLink::link({generic->image, modsUnit->image}, options.arch);
  linked->log = generic->log + modsUnit->log;
  linked->spillBytes = generic->spillBytes;
  ++links_;
  if (keyedNvrtcIsLoaded()) // the units' keys name NVRTC
    writeEntry(*linked);
  return linked;
}

std::shared_ptr<const CompiledKernel>
KernelCache::lookupEntry(const std::string &key, const KernelConfig &config,
                         std::string_view modCode, const CompileOptions &options,
                         KernelUnit unit) {
  Future pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = byKey_.find(key);
    if (found != byKey_.end()) {
      pending = found->second;
      ++memoryHits_;
    }
  }
  if (pending.valid()) // waited for outside the lock, as in getOrCompile
    return pending.get();
  auto kernel = diskHit(key, config);
  if (!kernel)
    return nullptr;
  std::promise<std::shared_ptr<const CompiledKernel>> promise;
  promise.set_value(kernel);
  Future future = promise.get_future().share();
  std::string optionsKey = options.key();
  std::lock_guard<std::mutex> lock(mutex_);
  byKey_.emplace(key, future);
  auto &bucket = fast_[fastHash(config, modCode, optionsKey, unit)];
  bool known = false;
  for (const FastEntry &entry : bucket)
    known = known || entry.matches(config, modCode, optionsKey, unit);
  if (!known)
    bucket.push_back({config, std::string(modCode), optionsKey, unit, future});
  return kernel;
}

std::vector<std::shared_ptr<const CompiledKernel>>
KernelCache::getOrCompileAll(const std::vector<Request> &requests) {
  return eachInParallel(requests, [this](const Request &request) {
    return getOrCompile(request.config, request.modCode, request.options);
  });
}

// Test-only entry points (TestHooks.h).
std::string_view testing::kernelCacheEntryMagic() { return kEntryMagic; }

bool testing::parseKernelCacheEntry(const std::string &bytes, const std::string &key,
                                    CompiledKernel &kernel) {
  return parseEntry(bytes, key, kernel);
}

CompileOptions cudaCompileOptions(const KernelConfig &config, const std::string &arch) {
  CompileOptions options;
  options.arch = config.compileArchFor(arch);
  options.ptxasVerbose = config.prefillFallsBackOnSpills();
  return options;
}

KernelConfig settlePrefillShape(KernelConfig config, std::string_view modCode,
                                const std::string &arch, KernelCache &cache) {
  // A kernel with linked mods spills around its calls whatever the tile.
  if (isEmulatorArch(arch) || config.linkedMods)
    return config;
  // The tile, then the same tile with its row values recomputed per KV
  // tile, then the fallback tile (which is not tried: it does not spill).
  // Any other config leaves the loop at once.
  while (config.prefillFallsBackOnSpills()) {
    std::shared_ptr<const CompiledKernel> kernel =
        cache.getOrCompile(config, modCode, cudaCompileOptions(config, arch));
    if (kernel->spillBytes == 0)
      break;
    config.usePrefillSpillFallback();
  }
  return config;
}

} // namespace pagedc
