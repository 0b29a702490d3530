//===- Nvrtc.cpp - NVRTC loaded at run time -------------------------------===//

#include "pagedc/Nvrtc.h"
#include "Environment.h"
#include "SymbolResolver.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pagedc {

/// The NVRTC entry points we use, declared here so the build needs no
/// nvrtc.h. nvrtcResult is an int enum (0 = NVRTC_SUCCESS).
struct Nvrtc::Api {
  using Program = void *;
  const char *(*getErrorString)(int);
  int (*version)(int *, int *);
  int (*getNumSupportedArchs)(int *);
  int (*getSupportedArchs)(int *);
  int (*createProgram)(Program *, const char *, const char *, int,
                       const char *const *, const char *const *);
  int (*destroyProgram)(Program *);
  int (*compileProgram)(Program, int, const char *const *);
  int (*getProgramLogSize)(Program, size_t *);
  int (*getProgramLog)(Program, char *);
  int (*getPTXSize)(Program, size_t *);
  int (*getPTX)(Program, char *);
  int (*getCUBINSize)(Program, size_t *);
  int (*getCUBIN)(Program, char *);
};

std::string buildCudaRoot() {
#ifdef PAGEDC_CUDA_ROOT_HINT
  return PAGEDC_CUDA_ROOT_HINT;
#else
  return "";
#endif
}

std::string cudaIncludeDirectory() {
  std::vector<std::string> roots;
  for (env::Setting variable : {env::Setting::CudaHome, env::Setting::CudaPath})
    if (const char *root = env::get(variable))
      roots.push_back(root);
  roots.push_back(buildCudaRoot());
  for (const std::string &root : roots) {
    std::error_code error;
    if (!root.empty() && std::filesystem::exists(root + "/include/cuda_fp16.h", error))
      return root + "/include";
  }
  return "";
}

std::vector<std::string>
cudaLibraryCandidates(const std::vector<std::string> &fileNames) {
  std::vector<std::string> candidates;
  auto addRoot = [&](const std::string &root) {
    if (root.empty())
      return;
    for (const std::string &file : fileNames) {
      candidates.push_back(root + "/lib64/" + file);
      candidates.push_back(root + "/lib/" + file);
    }
  };
  for (env::Setting variable : {env::Setting::CudaHome, env::Setting::CudaPath})
    if (const char *root = env::get(variable))
      addRoot(root);
  for (const std::string &file : fileNames)
    candidates.push_back(file); // the dynamic linker's search path
  addRoot(buildCudaRoot());
  return candidates;
}

namespace {

const std::vector<std::string> kNvrtcFileNames = {"libnvrtc.so.13", "libnvrtc.so.12",
                                                 "libnvrtc.so"};

struct Loaded {
  Nvrtc::Api api{};
  std::string path;
  std::string realPath;
  std::string error; // non-empty: not available
  int major = 0, minor = 0;
};

/// "realpath|size|mtime": what the cache keys a library's file by.
std::string fileIdentity(const std::string &realPath, const struct stat &info) {
  return fmt::format("{}|{}|{}", realPath, static_cast<long long>(info.st_size),
                     static_cast<long long>(info.st_mtime));
}

/// dlopens the first of cudaLibraryCandidates(fileNames) that loads and
/// sets `path` to it; null when none does, with `error` saying that `what`
/// was not found and every candidate tried.
void *openCudaLibrary(const std::vector<std::string> &fileNames, const char *what,
                      std::string &path, std::string &error) {
  std::string tried;
  for (const std::string &candidate : cudaLibraryCandidates(fileNames)) {
    if (void *handle = dlopen(candidate.c_str(), RTLD_LAZY | RTLD_LOCAL)) {
      path = candidate;
      return handle;
    }
    tried += "\n  " + candidate;
  }
  error = fmt::format("{} not found (set CUDA_HOME); tried:{}", what, tried);
  return nullptr;
}

/// The resolved path of the file behind a dlopen handle ("" if unknown).
std::string loadedRealPath(void *handle) {
  struct link_map *map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name)
    return "";
  std::error_code error;
  return std::filesystem::canonical(map->l_name, error).string();
}

const Loaded &loadNvrtc() {
  static Loaded loaded = [] {
    Loaded result;
    void *handle = openCudaLibrary(kNvrtcFileNames, "NVRTC", result.path, result.error);
    if (!handle)
      return result;
    SymbolResolver resolve{handle, {}};
    Nvrtc::Api &api = result.api;
    resolve(api.getErrorString, "nvrtcGetErrorString");
    resolve(api.version, "nvrtcVersion");
    resolve(api.getNumSupportedArchs, "nvrtcGetNumSupportedArchs");
    resolve(api.getSupportedArchs, "nvrtcGetSupportedArchs");
    resolve(api.createProgram, "nvrtcCreateProgram");
    resolve(api.destroyProgram, "nvrtcDestroyProgram");
    resolve(api.compileProgram, "nvrtcCompileProgram");
    resolve(api.getProgramLogSize, "nvrtcGetProgramLogSize");
    resolve(api.getProgramLog, "nvrtcGetProgramLog");
    resolve(api.getPTXSize, "nvrtcGetPTXSize");
    resolve(api.getPTX, "nvrtcGetPTX");
    resolve(api.getCUBINSize, "nvrtcGetCUBINSize");
    resolve(api.getCUBIN, "nvrtcGetCUBIN");
    if (!resolve.missing.empty()) {
      result.error = fmt::format("{} lacks NVRTC functions:{}", result.path, resolve.missing);
      return result;
    }
    api.version(&result.major, &result.minor);
    result.realPath = loadedRealPath(handle);
    return result;
  }();
  return loaded;
}

/// "sm_90a" -> "compute_90a".
std::string virtualArch(const std::string &arch) {
  if (arch.rfind("sm_", 0) == 0)
    return "compute_" + arch.substr(3);
  return arch;
}

std::string lineOf(std::string_view code, int line) {
  int current = 1;
  size_t begin = 0;
  while (current < line) {
    size_t next = code.find('\n', begin);
    if (next == std::string_view::npos)
      return "";
    begin = next + 1;
    ++current;
  }
  size_t end = code.find('\n', begin);
  return std::string(code.substr(begin, end == std::string_view::npos
                                             ? std::string_view::npos
                                             : end - begin));
}

/// For each "NAME(LINE): error" in the log, quotes the source line.
std::string quoteErrorLines(std::string_view log, std::string_view name,
                            std::string_view code, const KernelSource *kernel) {
  std::string quotes;
  std::string prefix = std::string(name) + "(";
  size_t at = 0;
  int quoted = 0;
  while ((at = log.find(prefix, at)) != std::string_view::npos && quoted < 10) {
    size_t numberBegin = at + prefix.size();
    size_t close = log.find(')', numberBegin);
    at = numberBegin;
    if (close == std::string_view::npos)
      break;
    if (log.substr(close, 9) != "): error:")
      continue;
    int line = std::atoi(std::string(log.substr(numberBegin, close - numberBegin)).c_str());
    size_t messageEnd = log.find('\n', close);
    std::string message(log.substr(close + 3, messageEnd == std::string_view::npos
                                                  ? std::string_view::npos
                                                  : messageEnd - close - 3));
    std::string where = fmt::format("line {}", line);
    if (kernel && line >= kernel->modFirstLine &&
        line < kernel->modFirstLine + kernel->modLineCount)
      where += fmt::format(" (generated mod code line {})",
                           line - kernel->modFirstLine + 1);
    quotes += fmt::format("  {}: {}\n    | {}\n", where, message,
                          lineOf(code, line));
    ++quoted;
  }
  return quotes;
}

/// Directories the dynamic linker searches for a bare library name, in
/// order (LD_LIBRARY_PATH, ld.so.conf.d entries, the standard ones).
std::vector<std::string> linkerSearchDirectories() {
  std::vector<std::string> dirs;
  if (const char *path = env::get(env::Setting::LdLibraryPath)) {
    std::istringstream list(path);
    for (std::string dir; std::getline(list, dir, ':');)
      if (!dir.empty())
        dirs.push_back(dir);
  }
  std::error_code error;
  std::vector<std::filesystem::path> confs;
  for (const auto &entry : std::filesystem::directory_iterator("/etc/ld.so.conf.d", error))
    if (entry.path().extension() == ".conf")
      confs.push_back(entry.path());
  std::sort(confs.begin(), confs.end());
  for (const auto &conf : confs) {
    std::ifstream file(conf);
    for (std::string line; std::getline(file, line);)
      if (!line.empty() && line[0] == '/')
        dirs.push_back(line.substr(0, line.find_first_of(" \t#")));
  }
  for (const char *dir : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                          "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64",
                          "/usr/lib64", "/lib", "/usr/lib"})
    dirs.push_back(dir);
  return dirs;
}

} // namespace

const std::string &nvrtcLibraryIdentity() {
  static const std::string identity = [] {
    std::vector<std::string> dirs;
    for (const std::string &candidate : cudaLibraryCandidates(kNvrtcFileNames)) {
      std::vector<std::string> paths;
      if (candidate.find('/') != std::string::npos) {
        paths.push_back(candidate);
      } else {
        if (dirs.empty())
          dirs = linkerSearchDirectories();
        for (const std::string &dir : dirs)
          paths.push_back(dir + "/" + candidate);
      }
      for (const std::string &path : paths) {
        struct stat info;
        if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode))
          continue;
        std::error_code error;
        return fileIdentity(std::filesystem::canonical(path, error).string(), info);
      }
    }
    return std::string();
  }();
  return identity;
}

std::vector<std::string> CompileOptions::nvrtcOptions() const {
  std::vector<std::string> list;
  list.push_back("--gpu-architecture=" +
                 (output == Output::Cubin ? arch : virtualArch(arch)));
  list.push_back("-std=c++17");
  // No CUDA headers are included; --minimal skips NVRTC's implicit runtime
  // declarations (texture types, device runtime), which saves front-end time.
  list.push_back("--minimal");
  if (ptxasVerbose)
    list.push_back("--ptxas-options=-v");
  for (const std::string &option : extraOptions)
    list.push_back(option);
  return list;
}

std::string CompileOptions::key() const {
  std::string key = output == Output::Cubin ? "cubin" : "ptx";
  for (const std::string &option : nvrtcOptions())
    key += " " + option;
  return key;
}

std::vector<PtxasKernelReport> parsePtxasReport(std::string_view log) {
  std::vector<PtxasKernelReport> reports;
  std::istringstream stream{std::string(log)};
  std::string line;
  PtxasKernelReport *current = nullptr;
  while (std::getline(stream, line)) {
    size_t at = line.find("Compiling entry function '");
    if (at != std::string::npos) {
      PtxasKernelReport report;
      size_t begin = at + 26, end = line.find('\'', begin);
      report.kernel = line.substr(begin, end - begin);
      size_t forAt = line.find("for '", end);
      if (forAt != std::string::npos)
        report.arch = line.substr(forAt + 5, line.find('\'', forAt + 5) - forAt - 5);
      reports.push_back(report);
      current = &reports.back();
      continue;
    }
    if (!current)
      continue;
    if ((at = line.find(" bytes stack frame")) != std::string::npos) {
      // "ptxas         .     24 bytes stack frame, 20 bytes spill stores, ..."
      // (NVRTC's log) or the figures alone: read from the first number on.
      size_t number = at;
      while (number > 0 && std::isdigit(static_cast<unsigned char>(line[number - 1])))
        --number;
      std::sscanf(line.c_str() + number,
                  "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
                  &current->stackFrameBytes, &current->spillStoreBytes,
                  &current->spillLoadBytes);
    } else if ((at = line.find("Used ")) != std::string::npos &&
               line.find("registers") != std::string::npos) {
      current->registers = std::atoi(line.c_str() + at + 5);
    }
  }
  return reports;
}

namespace {

/// The nvJitLink entry points used (nvJitLinkResult is an int enum, 0 =
/// NVJITLINK_SUCCESS; the handle a pointer).
struct JitLinkApi {
  using Handle = void *;
  int (*create)(Handle *, uint32_t, const char **);
  int (*destroy)(Handle *);
  int (*addData)(Handle, int, const void *, size_t, const char *);
  int (*complete)(Handle);
  int (*getLinkedCubinSize)(Handle, size_t *);
  int (*getLinkedCubin)(Handle, void *);
  int (*getErrorLogSize)(Handle, size_t *);
  int (*getErrorLog)(Handle, char *);
};
/// NVJITLINK_INPUT_CUBIN.
constexpr int kJitLinkInputCubin = 1;

struct LoadedJitLink {
  JitLinkApi api{};
  std::string identity;
  std::string error; // non-empty: not available
};

const LoadedJitLink &loadJitLink() {
  static LoadedJitLink loaded = [] {
    LoadedJitLink result;
    std::string opened;
    void *handle = openCudaLibrary({"libnvJitLink.so.13", "libnvJitLink.so.12", "libnvJitLink.so"},
                                   "nvJitLink", opened, result.error);
    if (!handle)
      return result;
    SymbolResolver resolve{handle, {}};
    JitLinkApi &api = result.api;
    resolve(api.create, "nvJitLinkCreate");
    resolve(api.destroy, "nvJitLinkDestroy");
    resolve(api.addData, "nvJitLinkAddData");
    resolve(api.complete, "nvJitLinkComplete");
    resolve(api.getLinkedCubinSize, "nvJitLinkGetLinkedCubinSize");
    resolve(api.getLinkedCubin, "nvJitLinkGetLinkedCubin");
    resolve(api.getErrorLogSize, "nvJitLinkGetErrorLogSize");
    resolve(api.getErrorLog, "nvJitLinkGetErrorLog");
    if (!resolve.missing.empty()) {
      result.error = fmt::format("{} lacks nvJitLink functions:{}", opened, resolve.missing);
      return result;
    }
    const std::string path = loadedRealPath(handle);
    struct stat info;
    if (!path.empty() && stat(path.c_str(), &info) == 0)
      result.identity = fileIdentity(path, info);
    return result;
  }();
  return loaded;
}

const LoadedJitLink &jitLink() {
  const LoadedJitLink &loaded = loadJitLink();
  if (!loaded.error.empty())
    throw Error(loaded.error);
  return loaded;
}

} // namespace

bool NvJitLink::available(std::string *reason) {
  const LoadedJitLink &loaded = loadJitLink();
  if (!loaded.error.empty() && reason)
    *reason = loaded.error;
  return loaded.error.empty();
}

const std::string &NvJitLink::identity() { return jitLink().identity; }

std::string NvJitLink::link(const std::vector<std::string_view> &cubins, const std::string &arch) {
  const JitLinkApi &api = jitLink().api;
  const std::string archOption = "-arch=" + arch;
  const char *options[] = {archOption.c_str()};
  JitLinkApi::Handle handle = nullptr;
  if (int status = api.create(&handle, 1, options); status != 0)
    throw Error(fmt::format("nvJitLinkCreate for {} failed (status {})", arch, status));
  struct Destroy {
    const JitLinkApi &api;
    JitLinkApi::Handle &handle;
    ~Destroy() { api.destroy(&handle); }
  } destroy{api, handle};
  auto failure = [&](std::string_view what, int status) {
    size_t size = 0;
    std::string log;
    if (api.getErrorLogSize(handle, &size) == 0 && size > 0) {
      log.resize(size);
      api.getErrorLog(handle, log.data());
      log.resize(std::strlen(log.c_str()));
    }
    return Error(fmt::format("nvJitLink {} failed for {} (status {}){}{}", what, arch, status,
                             log.empty() ? "" : ":\n", log));
  };
  for (size_t i = 0; i < cubins.size(); ++i) {
    const std::string name = fmt::format("pagedc_link_input_{}", i);
    if (int status = api.addData(handle, kJitLinkInputCubin, cubins[i].data(), cubins[i].size(),
                                 name.c_str());
        status != 0)
      throw failure(fmt::format("adding cubin {}", i), status);
  }
  if (int status = api.complete(handle); status != 0)
    throw failure("linking", status);
  size_t size = 0;
  if (int status = api.getLinkedCubinSize(handle, &size); status != 0)
    throw failure("reading the linked size", status);
  std::string image(size, '\0');
  if (int status = api.getLinkedCubin(handle, image.data()); status != 0)
    throw failure("reading the linked cubin", status);
  return image;
}

bool Nvrtc::available(std::string *reason) {
  const Loaded &loaded = loadNvrtc();
  if (!loaded.error.empty() && reason)
    *reason = loaded.error;
  return loaded.error.empty();
}

const Nvrtc &Nvrtc::get() {
  static std::once_flag once;
  static Nvrtc instance;
  const Loaded &loaded = loadNvrtc();
  if (!loaded.error.empty())
    throw Error(loaded.error);
  std::call_once(once, [&] {
    instance.api_ = &loaded.api;
    instance.path_ = loaded.path;
    instance.realPath_ = loaded.realPath;
    instance.major_ = loaded.major;
    instance.minor_ = loaded.minor;
  });
  return instance;
}

std::vector<int> Nvrtc::supportedArchitectures() const {
  int count = 0;
  api_->getNumSupportedArchs(&count);
  std::vector<int> archs(count);
  if (count)
    api_->getSupportedArchs(archs.data());
  return archs;
}

namespace {

/// Reads the rows of NVRTC's --time table ("NAME, CUDA C++ Frontend, 406,
/// ms") into result.stages.
void readStageTimes(const std::string &table, std::string_view name, CompileResult &result) {
  const std::string rowPrefix = std::string(name) + ", ";
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(rowPrefix, 0) != 0 || line.size() < rowPrefix.size() + 4 ||
        line.compare(line.size() - 4, 4, ", ms") != 0)
      continue;
    std::string row = line.substr(rowPrefix.size(), line.size() - 4 - rowPrefix.size());
    size_t comma = row.rfind(", ");
    if (comma == std::string::npos)
      continue;
    std::string phase = row.substr(0, comma);
    double seconds = std::atof(row.c_str() + comma + 2) * 1e-3;
    if (phase == "CUDA C++ Frontend")
      result.stages.frontEnd = seconds;
    else if (phase == "NVVM Optimizer")
      result.stages.optimizer = seconds;
    else if (phase == "PTX Translation")
      result.stages.ptxToSass = seconds;
  }
}

/// A new empty file for NVRTC's --time table: "--time=-" would put it in
/// the log, but NVRTC leaves it out there when ptxas reports (-v) too.
std::string stageTimesFile() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "pagedc-nvrtc-time-XXXXXX").string();
  int descriptor = mkstemp(pattern.data());
  if (descriptor < 0)
    throw Error(fmt::format("cannot create a file for NVRTC's stage times in {}: {}",
                            std::filesystem::temp_directory_path().string(), std::strerror(errno)));
  close(descriptor);
  return pattern;
}

} // namespace

CompileResult Nvrtc::compile(std::string_view code, std::string_view name,
                             const CompileOptions &options,
                             const KernelSource *kernel) const {
  auto start = std::chrono::steady_clock::now();
  std::string codeText(code), nameText(name);
  Api::Program program = nullptr;
  int status = api_->createProgram(&program, codeText.c_str(), nameText.c_str(),
                                   0, nullptr, nullptr);
  if (status != 0)
    throw Error(fmt::format("nvrtcCreateProgram failed: {}",
                            api_->getErrorString(status)));
  struct Destroy {
    const Api *api;
    Api::Program *program;
    ~Destroy() { api->destroyProgram(program); }
  } destroy{api_, &program};

  std::vector<std::string> optionList = options.nvrtcOptions();
  std::vector<std::string> compileOptions = optionList;
  std::string timesPath;
  if (options.timeStages) {
    timesPath = stageTimesFile();
    compileOptions.push_back("--time=" + timesPath);
  }
  std::vector<const char *> optionPointers;
  for (const std::string &option : compileOptions)
    optionPointers.push_back(option.c_str());
  status = api_->compileProgram(program, static_cast<int>(optionPointers.size()),
                                optionPointers.data());
  CompileResult result;
  size_t logSize = 0;
  api_->getProgramLogSize(program, &logSize);
  if (logSize > 1) {
    result.log.resize(logSize);
    api_->getProgramLog(program, result.log.data());
    // Up to the first NUL: NVRTC 13's size counts more than its terminator
    // (a stray NUL reached stderr after --ptxas-report's text).
    result.log.resize(std::strlen(result.log.c_str()));
  }
  if (!timesPath.empty()) {
    std::ifstream times(timesPath);
    std::stringstream table;
    table << times.rdbuf();
    readStageTimes(table.str(), nameText, result);
    std::remove(timesPath.c_str());
  }
  if (status != 0) {
    std::string optionText;
    for (const std::string &option : optionList)
      optionText += " " + option;
    throw Error(fmt::format(
        "NVRTC failed to compile {} ({}; options:{}):\n{}{}{}", nameText,
        api_->getErrorString(status), optionText,
        quoteErrorLines(result.log, nameText, code, kernel),
        result.log.empty() ? "" : "full log:\n", result.log));
  }
  size_t size = 0;
  if (options.output == CompileOptions::Output::Cubin) {
    api_->getCUBINSize(program, &size);
    result.image.resize(size);
    api_->getCUBIN(program, result.image.data());
  } else {
    api_->getPTXSize(program, &size);
    result.image.resize(size);
    api_->getPTX(program, result.image.data());
    if (!result.image.empty() && result.image.back() == '\0')
      result.image.pop_back();
  }
  result.seconds = std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count();
  return result;
}

} // namespace pagedc
