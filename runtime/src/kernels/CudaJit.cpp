//===- CudaJit.cpp - CUDA kernels straight from .attn text ----------------===//

#include "pagedc/CudaJit.h"
#include "Environment.h"

#include "pagedc/CodegenPlugin.h"
#include "pagedc/Error.h"

#include "SealedFile.h"
#include "TestHooks.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#ifndef PAGEDC_VERSION_STRING
#define PAGEDC_VERSION_STRING "unknown"
#endif

namespace pagedc {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kVariantMagic = "PAGEDC-VARIANT 1\n";

/// The largest variant file read: its payload is the generated mod code and
/// declarations of one program, kilobytes for the corpus and a few megabytes
/// for the largest programs the front end accepts. A larger file is corrupt
/// (removed, the variant regenerated), and no buffer is sized from it.
constexpr uint64_t kMaxVariantBytes = uint64_t(16) << 20;

using sealed::hex64;

/// Appends a length-prefixed field, so that no two different field lists
/// hash the same material.
void addField(std::string &material, std::string_view name,
              std::string_view value) {
  material += fmt::format("{} {}:", name, value.size());
  material += value;
  material += '\n';
}

//===----------------------------------------------------------------------===//
// Declarations as text
//===----------------------------------------------------------------------===//

bool parseScalarKind(const std::string &text, ScalarKind &kind) {
  for (ScalarKind candidate : {ScalarKind::I32, ScalarKind::F32, ScalarKind::Bool})
    if (text == scalarKindName(candidate)) {
      kind = candidate;
      return true;
    }
  return false;
}

bool parseDType(const std::string &text, DType &type) {
  for (DType candidate : {DType::F32, DType::F64, DType::F16, DType::BF16,
                          DType::I32, DType::I64, DType::U8, DType::Bool})
    if (text == dtypeName(candidate)) {
      type = candidate;
      return true;
    }
  return false;
}

bool parseInteger(const std::string &text, int64_t &value) {
  if (text.empty())
    return false;
  char *end = nullptr;
  errno = 0;
  long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0')
    return false;
  value = parsed;
  return true;
}

bool isName(const std::string &text) {
  if (text.empty() || std::isdigit(static_cast<unsigned char>(text[0])))
    return false;
  return std::all_of(text.begin(), text.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

//===----------------------------------------------------------------------===//
// The plugin
//===----------------------------------------------------------------------===//

std::string executableDirectory() {
  std::error_code error;
  fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? std::string() : self.parent_path().string();
}

bool isRegularFile(const std::string &path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

/// "realpath|size|mtime" of a file, "" when it does not exist.
std::string fileIdentity(const std::string &path) {
  struct stat info;
  if (path.empty() || ::stat(path.c_str(), &info) != 0)
    return "";
  char *real = ::realpath(path.c_str(), nullptr);
  std::string resolved = real ? real : path;
  std::free(real);
  return fmt::format("{}|{}|{}.{:09}", resolved, static_cast<long long>(info.st_size),
                     static_cast<long long>(info.st_mtim.tv_sec),
                     static_cast<long>(info.st_mtim.tv_nsec));
}

struct Plugin {
  void *handle = nullptr;
  std::string path;
  std::string identity;
  PagedcCodegenGenerateFn generate = nullptr;
  PagedcCodegenFreeFn release = nullptr;
};

std::mutex &pluginMutex() {
  static std::mutex mutex;
  return mutex;
}
Plugin &pluginState() {
  static Plugin plugin;
  return plugin;
}
std::atomic<bool> pluginIsLoaded{false};

/// Loads the plugin once per process; throws pagedc::Error saying why not.
/// Callers hold pluginMutex().
const Plugin &loadPlugin() {
  Plugin &plugin = pluginState();
  if (plugin.handle)
    return plugin;
  std::vector<std::string> tried;
  std::string path = findCodegenPlugin(&tried);
  if (path.empty()) {
    std::string places;
    for (const std::string &place : tried)
      places += "\n  " + place;
    throw Error(fmt::format(
        "cannot generate CUDA mod code: the code generator plugin {} was not "
        "found (set PAGEDC_CODEGEN_PLUGIN to its path, or install the pagedc "
        "compiler); looked in:{}",
        PAGEDC_CODEGEN_PLUGIN_FILE, places));
  }
  void *handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *reason = ::dlerror();
    throw Error(fmt::format("cannot load the code generator plugin {}: {}", path,
                            reason ? reason : "unknown error"));
  }
  auto symbol = [&](const char *name) {
    void *address = ::dlsym(handle, name);
    if (!address) {
      ::dlclose(handle);
      throw Error(fmt::format("the code generator plugin {} does not export {}",
                              path, name));
    }
    return address;
  };
  auto abiVersion = reinterpret_cast<PagedcCodegenAbiVersionFn>(
      symbol("pagedc_codegen_abi_version"));
  auto buildId =
      reinterpret_cast<PagedcCodegenBuildIdFn>(symbol("pagedc_codegen_build_id"));
  auto generate = reinterpret_cast<PagedcCodegenGenerateFn>(
      symbol("pagedc_codegen_generate"));
  auto release =
      reinterpret_cast<PagedcCodegenFreeFn>(symbol("pagedc_codegen_free"));
  if (abiVersion() != PAGEDC_CODEGEN_ABI_VERSION) {
    uint32_t version = abiVersion();
    ::dlclose(handle);
    throw Error(fmt::format("the code generator plugin {} has ABI version {}, "
                            "this runtime needs {}",
                            path, version, PAGEDC_CODEGEN_ABI_VERSION));
  }
  if (std::string id = buildId(); id != codegenBuildId()) {
    ::dlclose(handle);
    throw Error(fmt::format("the code generator plugin {} belongs to another "
                            "build ('{}'; this runtime is '{}')",
                            path, id, codegenBuildId()));
  }
  // Never unloaded: the compiler's static state lives until exit.
  plugin.handle = handle;
  plugin.path = path;
  plugin.identity = fileIdentity(path);
  plugin.generate = generate;
  plugin.release = release;
  pluginIsLoaded = true;
  return plugin;
}

//===----------------------------------------------------------------------===//
// Variant files
//===----------------------------------------------------------------------===//

struct Variant {
  std::string key;
  std::string plugin; // identity of the plugin that generated it
  std::string mask, score;
  std::vector<std::string> kernelKeys;
  std::string declarations;
  std::string modCode;
};

/// Variant layout (SealedFile.h): names and kernel keys in the header, the
/// declarations followed by the mod code as the payload.
std::string serializeVariant(const Variant &variant) {
  std::string kernels;
  for (const std::string &key : variant.kernelKeys)
    kernels += (kernels.empty() ? "" : ",") + key;
  std::string header = fmt::format(
      "key={}\nbuild={}\nplugin={}\nmask={}\nscore={}\nkernels={}\n"
      "declarations_size={}\n",
      variant.key, codegenBuildId(), variant.plugin, variant.mask, variant.score,
      kernels, variant.declarations.size());
  return sealed::seal(kVariantMagic, std::move(header),
                      variant.declarations + variant.modCode);
}

/// Parses a variant file; false for anything malformed or inconsistent.
bool parseVariant(const std::string &bytes, const std::string &key,
                  Variant &variant) {
  std::map<std::string, std::string> fields;
  std::string_view payload;
  if (!sealed::open(bytes, kVariantMagic, fields, payload) ||
      fields["key"] != key || fields["build"] != codegenBuildId())
    return false;
  int64_t declarationsSize = 0;
  if (!parseInteger(fields["declarations_size"], declarationsSize) ||
      declarationsSize < 0 || static_cast<size_t>(declarationsSize) >= payload.size())
    return false; // the mod code is never empty
  variant.key = key;
  variant.plugin = fields["plugin"];
  variant.mask = fields["mask"];
  variant.score = fields["score"];
  variant.declarations = std::string(payload.substr(0, declarationsSize));
  variant.modCode = std::string(payload.substr(declarationsSize));
  variant.kernelKeys.clear();
  std::istringstream keys(fields["kernels"]);
  for (std::string kernel; std::getline(keys, kernel, ',');)
    variant.kernelKeys.push_back(kernel);
  return !variant.kernelKeys.empty();
}

/// Reads the variant at `path`; removes a file that does not parse.
bool readVariant(const std::string &path, const std::string &key,
                 Variant &variant) {
  std::string bytes;
  // Never blocks or follows a link (a FIFO, symlink or directory there is
  // corrupt: removed, and the variant rebuilt).
  const sealed::ReadStatus status = sealed::readEntryFile(path, bytes, kMaxVariantBytes);
  if (status == sealed::ReadStatus::Missing || status == sealed::ReadStatus::Unreadable)
    return false;
  if (status == sealed::ReadStatus::Read && parseVariant(bytes, key, variant))
    return true;
  sealed::removeEntry(path);
  return false;
}

void writeVariant(const std::string &path, const Variant &variant) {
  // An index that cannot be written is only slower.
  sealed::writeAtomically(path, serializeVariant(variant));
}

/// The request's configs with paramsSize filled in from the declarations.
std::vector<KernelConfig> filledConfigs(const CudaJitRequest &request,
                                        const std::vector<ParamDecl> &params,
                                        const std::vector<BufferDecl> &buffers) {
  std::vector<KernelConfig> configs = request.configs;
  int64_t size = -1;
  for (KernelConfig &config : configs) {
    if (config.paramsSize >= 0)
      continue;
    if (size < 0)
      size = ParamsLayout::forDeclarations(params, buffers).size;
    config.paramsSize = config.linkedMods ? linkedParamsCapacity(size) : size;
  }
  return configs;
}

} // namespace

//===----------------------------------------------------------------------===//
// Public functions
//===----------------------------------------------------------------------===//

const char *cudaJitOutcomeName(CudaJitOutcome outcome) {
  switch (outcome) {
  case CudaJitOutcome::VariantHit:
    return "variant-hit";
  case CudaJitOutcome::KernelsRebuilt:
    return "kernels-rebuilt";
  case CudaJitOutcome::Generated:
    return "generated";
  }
  return "?";
}

const std::string &codegenBuildId() {
  static const std::string id = [] {
    std::vector<std::string> names = embeddedTemplateNames();
    std::sort(names.begin(), names.end());
    uint64_t hash = contentHash64("pagedc templates");
    for (const std::string &name : names) {
      hash = contentHash64(name, hash);
      hash = contentHash64(embeddedTemplate(name), hash);
    }
    return fmt::format("pagedc {} templates {}", PAGEDC_VERSION_STRING, hex64(hash));
  }();
  return id;
}

std::string findCodegenPlugin(std::vector<std::string> *tried) {
  std::vector<std::string> candidates;
  if (const char *path = env::get(env::Setting::CodegenPlugin)) {
    candidates.push_back(path); // when set, the only place
  } else {
    if (std::string dir = executableDirectory(); !dir.empty())
      candidates.push_back(dir + "/../lib/" PAGEDC_CODEGEN_PLUGIN_FILE);
#ifdef PAGEDC_CODEGEN_BUILD_PLUGIN
    candidates.push_back(PAGEDC_CODEGEN_BUILD_PLUGIN);
#endif
#ifdef PAGEDC_CODEGEN_INSTALL_PLUGIN
    candidates.push_back(PAGEDC_CODEGEN_INSTALL_PLUGIN);
#endif
  }
  for (const std::string &candidate : candidates) {
    if (tried)
      tried->push_back(candidate);
    if (isRegularFile(candidate))
      return candidate;
  }
  return "";
}

bool codegenPluginLoaded() { return pluginIsLoaded; }

GeneratedMods generateModsWithPlugin(const CudaJitRequest &request) {
  std::lock_guard<std::mutex> lock(pluginMutex());
  const Plugin &plugin = loadPlugin();
  std::vector<const char *> names, values;
  for (const auto &[name, value] : request.overrides) {
    names.push_back(name.c_str());
    values.push_back(value.c_str());
  }
  PagedcCodegenInput input{};
  input.abiVersion = PAGEDC_CODEGEN_ABI_VERSION;
  input.fileName = request.fileName.c_str();
  input.source = request.source.data();
  input.sourceSize = request.source.size();
  input.mask = request.mask.c_str();
  input.score = request.score.c_str();
  input.numOverrides = names.size();
  input.overrideNames = names.data();
  input.overrideValues = values.data();
  PagedcCodegenOutput *output = plugin.generate(&input);
  if (!output)
    throw Error("the code generator plugin returned nothing (out of memory?)");
  std::unique_ptr<PagedcCodegenOutput, PagedcCodegenFreeFn> owner(output,
                                                                  plugin.release);
  if (output->status != 0)
    throw Error(output->diagnostics ? output->diagnostics
                                    : "code generation failed");
  GeneratedMods mods;
  mods.modCode = output->modCode ? output->modCode : "";
  if (mods.modCode.empty() ||
      !parseModDeclarations(output->declarations ? output->declarations : "",
                            mods.params, mods.buffers))
    throw Error(fmt::format("the code generator plugin {} answered with "
                            "malformed output",
                            plugin.path));
  return mods;
}

std::string serializeModDeclarations(const std::vector<ParamDecl> &params,
                                     const std::vector<BufferDecl> &buffers) {
  std::string text;
  for (const ParamDecl &param : params) {
    text += fmt::format("param {} {}", param.name, scalarKindName(param.type));
    if (param.defaultValue) {
      const ParamValue &value = *param.defaultValue;
      switch (value.kind) {
      case ScalarKind::I32:
        text += fmt::format(" i32:{}", value.i32);
        break;
      case ScalarKind::F32: {
        uint32_t bits;
        std::memcpy(&bits, &value.f32, 4);
        text += fmt::format(" f32:{:08x}", bits); // exact, NaN and inf too
        break;
      }
      case ScalarKind::Bool:
        text += fmt::format(" bool:{}", value.boolean ? 1 : 0);
        break;
      }
    }
    text += '\n';
  }
  for (const BufferDecl &buffer : buffers) {
    text += fmt::format("buffer {} {} ", buffer.name, dtypeName(buffer.elementType));
    for (size_t i = 0; i < buffer.dims.size(); ++i) {
      const BufferDim &dim = buffer.dims[i];
      text += i ? "," : "";
      if (dim.kind == BufferDim::Fixed)
        text += std::to_string(dim.size);
      else if (dim.kind == BufferDim::Named)
        text += dim.name;
      else
        text += '?';
    }
    text += '\n';
  }
  return text;
}

bool parseModDeclarations(const std::string &text, std::vector<ParamDecl> &params,
                          std::vector<BufferDecl> &buffers) {
  std::vector<ParamDecl> newParams;
  std::vector<BufferDecl> newBuffers;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string what, name, type, extra, trailing;
    words >> what >> name >> type;
    if (!isName(name))
      return false;
    if (what == "param") {
      ParamDecl param;
      param.name = name;
      if (!parseScalarKind(type, param.type))
        return false;
      if (words >> extra) {
        size_t colon = extra.find(':');
        if (colon == std::string::npos)
          return false;
        ParamValue value;
        if (!parseScalarKind(extra.substr(0, colon), value.kind))
          return false;
        std::string digits = extra.substr(colon + 1);
        int64_t integer = 0;
        if (value.kind == ScalarKind::F32) {
          if (digits.size() != 8 ||
              digits.find_first_not_of("0123456789abcdef") != std::string::npos)
            return false;
          uint32_t bits = static_cast<uint32_t>(std::strtoul(digits.c_str(), nullptr, 16));
          std::memcpy(&value.f32, &bits, 4);
        } else if (!parseInteger(digits, integer)) {
          return false;
        } else if (value.kind == ScalarKind::I32) {
          value.i32 = static_cast<int32_t>(integer);
        } else {
          value.boolean = integer != 0;
        }
        param.defaultValue = value;
      }
      if (words >> trailing)
        return false;
      newParams.push_back(std::move(param));
    } else if (what == "buffer") {
      BufferDecl buffer;
      buffer.name = name;
      if (!parseDType(type, buffer.elementType))
        return false;
      std::string dims;
      words >> dims;
      if (words >> trailing)
        return false;
      std::istringstream parts(dims);
      for (std::string part; std::getline(parts, part, ',');) {
        BufferDim dim;
        int64_t size = 0;
        if (part == "?") {
          dim.kind = BufferDim::Any;
        } else if (parseInteger(part, size)) {
          dim.kind = BufferDim::Fixed;
          dim.size = size;
        } else if (isName(part)) {
          dim.kind = BufferDim::Named;
          dim.name = part;
        } else {
          return false;
        }
        buffer.dims.push_back(std::move(dim));
      }
      newBuffers.push_back(std::move(buffer));
    } else {
      return false;
    }
  }
  params = std::move(newParams);
  buffers = std::move(newBuffers);
  return true;
}

std::string cudaVariantKey(const CudaJitRequest &request) {
  std::string material = "pagedc-variant 1\n";
  addField(material, "codegen", codegenBuildId());
  addField(material, "nvrtc", nvrtcLibraryIdentity());
  addField(material, "source", request.source);
  addField(material, "mask", request.mask);
  addField(material, "score", request.score);
  for (const auto &[name, value] : request.overrides) {
    addField(material, "define", name);
    addField(material, "value", value);
  }
  for (const KernelConfig &config : request.configs)
    addField(material, "config", config.describe());
  addField(material, "arch", request.options.arch);
  addField(material, "options", request.options.key());
  return contentKey128({material});
}

namespace {
/// The kernel entries a variant records for `configs`: each config's
/// module and, where it has one, its merge unit (KernelCache::Modules).
size_t moduleCount(const std::vector<KernelConfig> &configs) {
  size_t count = 0;
  for (const KernelConfig &config : configs)
    count += hasSeparateMergeUnit(config) ? 2 : 1;
  return count;
}
} // namespace

CudaJitResult loadCudaMods(const CudaJitRequest &request, KernelCache &cache) {
  if (request.configs.empty())
    throw Error("loadCudaMods: no kernel configuration given");
  for (const KernelConfig &config : request.configs)
    config.validate();
  CudaJitResult result;
  result.variantKey = cudaVariantKey(request);
  const std::string &directory = cache.directory();
  if (!directory.empty())
    result.variantPath = directory + "/" + result.variantKey + ".variant";
  result.mods.maskName = request.mask;
  result.mods.scoreName = request.score;

  Variant variant;
  if (!result.variantPath.empty() &&
      readVariant(result.variantPath, result.variantKey, variant) &&
      variant.kernelKeys.size() == moduleCount(request.configs) &&
      variant.mask == request.mask && variant.score == request.score &&
      parseModDeclarations(variant.declarations, result.mods.params,
                           result.mods.buffers)) {
    // A plugin other than the one that wrote the variant (another build of
    // the compiler) may generate different code: regenerate. Without any
    // plugin the recorded code is the best there is.
    std::string plugin = fileIdentity(findCodegenPlugin());
    if (plugin.empty() || plugin == variant.plugin) {
      result.mods.cuda.modCode = std::move(variant.modCode);
      std::vector<KernelConfig> configs =
          filledConfigs(request, result.mods.params, result.mods.buffers);
      bool allFound = true;
      size_t next = 0;
      // The recorded entry of a module, else the module compiled again.
      auto module = [&](const KernelConfig &config, std::string_view modCode, KernelUnit unit) {
        std::string &key = variant.kernelKeys[next++];
        auto kernel = cache.lookupEntry(key, config, modCode, request.options, unit);
        if (!kernel) {
          allFound = false;
          kernel = cache.getOrCompileUnit(config, modCode, request.options, unit);
          key = kernel->key;
        }
        return kernel;
      };
      for (const KernelConfig &config : configs) {
        if (hasSeparateMergeUnit(config)) {
          result.kernels.push_back(
              module(config, result.mods.cuda.modCode, KernelUnit::DecodeSplit));
          result.mergeKernels.push_back(
              module(decodeMergeConfig(config), "", KernelUnit::DecodeMerge));
        } else {
          result.kernels.push_back(module(config, result.mods.cuda.modCode, KernelUnit::Whole));
          result.mergeKernels.push_back(nullptr);
        }
      }
      if (allFound) {
        result.outcome = CudaJitOutcome::VariantHit;
        return result;
      }
      result.outcome = CudaJitOutcome::KernelsRebuilt;
      variant.modCode = result.mods.cuda.modCode;
      if (cache.writable())
        writeVariant(result.variantPath, variant);
      return result;
    }
  }

  GeneratedMods generated = generateModsWithPlugin(request);
  result.usedPlugin = true;
  result.outcome = CudaJitOutcome::Generated;
  result.mods.params = std::move(generated.params);
  result.mods.buffers = std::move(generated.buffers);
  result.mods.cuda.modCode = std::move(generated.modCode);
  std::vector<KernelConfig> configs =
      filledConfigs(request, result.mods.params, result.mods.buffers);
  std::vector<KernelCache::Request> requests;
  for (const KernelConfig &config : configs)
    requests.push_back({config, result.mods.cuda.modCode, request.options});
  for (KernelCache::Modules &modules : cache.getOrCompileAllModules(requests)) {
    result.kernels.push_back(std::move(modules.main));
    result.mergeKernels.push_back(std::move(modules.merge));
  }
  if (!result.variantPath.empty() && cache.writable()) {
    Variant fresh;
    fresh.key = result.variantKey;
    {
      std::lock_guard<std::mutex> lock(pluginMutex());
      fresh.plugin = pluginState().identity;
    }
    fresh.mask = request.mask;
    fresh.score = request.score;
    for (size_t i = 0; i < result.kernels.size(); ++i) {
      fresh.kernelKeys.push_back(result.kernels[i]->key);
      if (result.mergeKernels[i])
        fresh.kernelKeys.push_back(result.mergeKernels[i]->key);
    }
    fresh.declarations =
        serializeModDeclarations(result.mods.params, result.mods.buffers);
    fresh.modCode = result.mods.cuda.modCode;
    writeVariant(result.variantPath, fresh);
  }
  return result;
}

// Test-only entry points (TestHooks.h).
std::string_view testing::variantFileMagic() { return kVariantMagic; }

bool testing::parseVariantFile(const std::string &bytes, const std::string &key,
                               VariantFields &fields) {
  Variant variant;
  if (!parseVariant(bytes, key, variant))
    return false;
  fields.plugin = std::move(variant.plugin);
  fields.mask = std::move(variant.mask);
  fields.score = std::move(variant.score);
  fields.kernelKeys = std::move(variant.kernelKeys);
  fields.declarations = std::move(variant.declarations);
  fields.modCode = std::move(variant.modCode);
  return true;
}

} // namespace pagedc
