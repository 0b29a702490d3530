//===- KernelBundle.cpp - Precompiled kernels the runtime loads -----------===//

#include "pagedc/KernelBundle.h"

#include "OutputFiles.h"
#include "kernels/Json.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace pagedc {

namespace fs = std::filesystem;
using json::Value;

namespace {

constexpr const char *kFormat = "pagedc-kernel-bundle";
constexpr int kVersion = 1;

const char *dtypeTag(DType type) { return type == DType::F16 ? "f16" : "bf16"; }

KernelKind kindFromName(const std::string &name) {
  for (KernelKind kind : {KernelKind::Prefill, KernelKind::Decode,
                          KernelKind::BlockMaskBuilder})
    if (name == kernelKindName(kind))
      return kind;
  throw Error(fmt::format("bundle manifest: unknown kernel kind '{}'", name));
}

Value configToJson(const KernelConfig &config) {
  Value value = Value::object();
  value.set("kind", kernelKindName(config.kind));
  value.set("dtype", dtypeTag(config.elementType));
  value.set("head_dim", config.headDim);
  // Only where Dv differs from D (absent: Dv = D, as in manifests from
  // before it).
  if (config.valueDim() != config.headDim)
    value.set("value_head_dim", config.valueDim());
  value.set("page_size", config.pageSize);
  value.set("block_m", config.blockM);
  value.set("warp_rows", config.warpRows);
  value.set("recompute_mod_rows", config.recomputeModRows);
  // Only where it caps the ring (absent: 4, as in manifests from before it).
  if (config.prefillStageLimit != 4)
    value.set("prefill_stage_limit", config.prefillStageLimit);
  // Only for two CTAs an SM (absent: 1).
  if (config.prefillCtasPerSm != 1)
    value.set("prefill_ctas_per_sm", config.prefillCtasPerSm);
  value.set("block_n", config.blockN);
  value.set("group_size", config.groupSize);
  value.set("query_tokens", config.queryTokens);
  value.set("return_lse", config.returnLse);
  value.set("params_size", config.paramsSize);
  // Only for BatchAttention's kernels (absent: false, as in manifests from
  // before it).
  if (config.packedBatch)
    value.set("packed_batch", true);
  // Only for decode kernels of 8-bit float caches (absent: a cache of dtype).
  if (config.kvFloat8)
    value.set("kv_dtype", dtypeName(*config.kvFloat8));
  // Only for BatchAttention's kernels of an f32 out (absent: out of dtype).
  if (config.outputF32)
    value.set("out_dtype", "f32");
  // Only for BatchAttention's GQA-packed prefill (absent: per-head tiles).
  if (config.groupRows)
    value.set("group_rows", true);
  // Only for kernels built for launches without a block mask (absent: they
  // take either).
  if (config.noBlockMask)
    value.set("block_mask", false);
  // Only for kernels with linked mods (absent: inlined); params_size is then
  // the Params' room.
  if (config.linkedMods)
    value.set("linked_mods", true);
  return value;
}

KernelConfig configFromJson(const Value &value, const std::string &where) {
  KernelConfig config;
  auto field = [&](const char *name) -> const Value & {
    try {
      return value.at(name);
    } catch (const Error &error) {
      throw Error(fmt::format("bundle manifest {}.config: {}", where, error.what()));
    }
  };
  auto name = [&](const char *key) { return fmt::format("{}.config.{}", where, key); };
  config.kind = kindFromName(field("kind").asString(name("kind")));
  std::string dtype = field("dtype").asString(name("dtype"));
  if (dtype != "f16" && dtype != "bf16")
    throw Error(fmt::format("bundle manifest {}: dtype '{}' is not f16 or bf16", where, dtype));
  config.elementType = dtype == "f16" ? DType::F16 : DType::BF16;
  config.headDim = static_cast<int>(field("head_dim").asInt(name("head_dim")));
  if (const Value *valueHeadDim = value.find("value_head_dim"))
    config.valueHeadDim = static_cast<int>(valueHeadDim->asInt(name("value_head_dim")));
  config.pageSize = static_cast<int>(field("page_size").asInt(name("page_size")));
  config.blockM = static_cast<int>(field("block_m").asInt(name("block_m")));
  // Manifests written before warp_rows existed hold 16-row kernels.
  if (const Value *warpRows = value.find("warp_rows"))
    config.warpRows = static_cast<int>(warpRows->asInt(name("warp_rows")));
  // ... and before recompute_mod_rows, kernels that hold their row values.
  if (const Value *recompute = value.find("recompute_mod_rows"))
    config.recomputeModRows = recompute->asBool(name("recompute_mod_rows"));
  // ... and before prefill_stage_limit, rings of up to 4 stages.
  if (const Value *limit = value.find("prefill_stage_limit"))
    config.prefillStageLimit = static_cast<int>(limit->asInt(name("prefill_stage_limit")));
  if (const Value *ctas = value.find("prefill_ctas_per_sm"))
    config.prefillCtasPerSm = static_cast<int>(ctas->asInt(name("prefill_ctas_per_sm")));
  config.blockN = static_cast<int>(field("block_n").asInt(name("block_n")));
  config.groupSize = static_cast<int>(field("group_size").asInt(name("group_size")));
  config.queryTokens = static_cast<int>(field("query_tokens").asInt(name("query_tokens")));
  config.returnLse = field("return_lse").asBool(name("return_lse"));
  config.paramsSize = field("params_size").asInt(name("params_size"));
  if (const Value *packed = value.find("packed_batch"))
    config.packedBatch = packed->asBool(name("packed_batch"));
  if (const Value *kv = value.find("kv_dtype")) {
    const std::string kvDtype = kv->asString(name("kv_dtype"));
    if (kvDtype != "f8e4m3" && kvDtype != "f8e5m2")
      throw Error(
          fmt::format("bundle manifest {}: kv_dtype '{}' is not f8e4m3 or f8e5m2", where, kvDtype));
    config.kvFloat8 = kvDtype == "f8e4m3" ? DType::F8E4M3 : DType::F8E5M2;
  }
  if (const Value *out = value.find("out_dtype")) {
    const std::string outDtype = out->asString(name("out_dtype"));
    if (outDtype != "f32")
      throw Error(fmt::format("bundle manifest {}: out_dtype '{}' is not f32", where, outDtype));
    config.outputF32 = true;
  }
  if (const Value *groupRows = value.find("group_rows"))
    config.groupRows = groupRows->asBool(name("group_rows"));
  if (const Value *blockMask = value.find("block_mask"))
    config.noBlockMask = !blockMask->asBool(name("block_mask"));
  if (const Value *linked = value.find("linked_mods"))
    config.linkedMods = linked->asBool(name("linked_mods"));
  config.validate();
  return config;
}

/// The bytes of a bundle file. Opened with O_NONBLOCK so a FIFO in the
/// bundle is refused instead of waited on; the size comes from fstat and is
/// checked before any buffer is sized (a sparse 64 GiB file costs nothing).
std::string readBytes(const fs::path &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("cannot read {}: not a regular file", path.string()));
  }
  if (static_cast<uint64_t>(info.st_size) > KernelBundle::kMaxFileBytes) {
    ::close(fd);
    throw Error(fmt::format("cannot read {}: {} bytes, more than a bundle file may hold ({})",
                            path.string(), info.st_size, KernelBundle::kMaxFileBytes));
  }
  std::string bytes(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      break; // shrank while read: the checksum or the parser rejects it
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

} // namespace

void KernelBundle::add(const CompiledKernel &kernel, std::string modsLabel) {
  BundleModule module;
  module.file = fmt::format("{}-{}.{}", kernelKindName(kernel.config.kind), kernel.key,
                            kernel.output == CompileOptions::Output::Cubin ? "cubin" : "ptx");
  module.arch = kernel.arch;
  module.key = kernel.key;
  module.checksum = fmt::format("{:016x}", contentHash64(kernel.image));
  module.output = kernel.output;
  module.kernelNames = kernel.kernelNames;
  module.threads = kernel.config.threadsPerCta();
  module.sharedMemoryBytes = kernel.config.sharedMemoryBytes();
  module.config = kernel.config;
  module.mods = std::move(modsLabel);
  module.image = kernel.image;
  modules.push_back(std::move(module));
}

const BundleModule *KernelBundle::find(std::string_view modsLabel,
                                       const KernelConfig &config,
                                       std::string_view arch) const {
  for (const BundleModule &module : modules)
    if (module.mods == modsLabel && module.config == config && module.arch == arch)
      return &module;
  return nullptr;
}

std::string KernelBundle::manifestJson() const {
  Value root = Value::object();
  root.set("format", kFormat);
  root.set("version", kVersion);
  Value list = Value::array();
  for (const BundleModule &module : modules) {
    Value entry = Value::object();
    entry.set("file", module.file);
    entry.set("arch", module.arch);
    entry.set("key", module.key);
    entry.set("checksum", module.checksum);
    entry.set("image", module.output == CompileOptions::Output::Cubin ? "cubin" : "ptx");
    Value names = Value::array();
    for (const std::string &name : module.kernelNames)
      names.push(name);
    entry.set("kernels", std::move(names));
    entry.set("threads", module.threads);
    entry.set("shared_memory", module.sharedMemoryBytes);
    entry.set("config", configToJson(module.config));
    entry.set("mods", module.mods);
    list.push(std::move(entry));
  }
  root.set("modules", std::move(list));
  return root.dump();
}

KernelBundle KernelBundle::parseManifest(std::string_view text) {
  Value root = Value::parse(text);
  if (!root.isObject())
    throw Error("bundle manifest must be a JSON object");
  if (root.at("format").asString("format") != kFormat)
    throw Error(fmt::format("bundle manifest format is not '{}'", kFormat));
  int64_t version = root.at("version").asInt("version");
  if (version != kVersion)
    throw Error(fmt::format("bundle manifest version {} is not supported (expected {})",
                            version, kVersion));
  KernelBundle bundle;
  const auto &list = root.at("modules").asArray("modules");
  for (size_t i = 0; i < list.size(); ++i) {
    const Value &entry = list[i];
    std::string where = fmt::format("modules[{}]", i);
    auto get = [&](const char *key) -> const Value & {
      if (const Value *value = entry.find(key))
        return *value;
      throw Error(fmt::format("bundle manifest {}: missing field '{}'", where, key));
    };
    auto name = [&](const char *key) { return where + "." + key; };
    BundleModule module;
    module.file = get("file").asString(name("file"));
    if (module.file.empty() || module.file.find('/') != std::string::npos ||
        module.file.find("..") != std::string::npos)
      throw Error(fmt::format("bundle manifest {}: file '{}' must be a plain file name",
                              where, module.file));
    module.arch = get("arch").asString(name("arch"));
    module.key = get("key").asString(name("key"));
    module.checksum = get("checksum").asString(name("checksum"));
    std::string image = get("image").asString(name("image"));
    if (image != "cubin" && image != "ptx")
      throw Error(fmt::format("bundle manifest {}: image '{}' is not cubin or ptx", where, image));
    module.output = image == "cubin" ? CompileOptions::Output::Cubin : CompileOptions::Output::Ptx;
    for (const Value &kernel : get("kernels").asArray(name("kernels")))
      module.kernelNames.push_back(kernel.asString(name("kernels")));
    if (module.kernelNames.empty())
      throw Error(fmt::format("bundle manifest {}: no kernels", where));
    module.threads = static_cast<int>(get("threads").asInt(name("threads")));
    module.sharedMemoryBytes = static_cast<int>(get("shared_memory").asInt(name("shared_memory")));
    module.config = configFromJson(get("config"), where);
    module.mods = get("mods").asString(name("mods"));
    bundle.modules.push_back(std::move(module));
  }
  return bundle;
}

void KernelBundle::write(const std::string &directory) const {
  checkBundleDirectory(directory);
  std::error_code error;
  fs::create_directories(directory, error);
  if (error)
    throw Error(fmt::format("cannot create the bundle directory '{}': {}", directory,
                            error.message()));
  // All files through the one output writer: every module and the manifest
  // appear together or not at all.
  auto bytesOf = [](const std::string &text) {
    return std::vector<uint8_t>(text.begin(), text.end());
  };
  std::vector<files::OutputFile> outputs;
  for (const BundleModule &module : modules)
    outputs.push_back({{"bundle file", (fs::path(directory) / module.file).string()},
                       bytesOf(module.image)});
  const std::string manifest = manifestJson();
  outputs.push_back({{"bundle manifest", (fs::path(directory) / "manifest.json").string()},
                     bytesOf(manifest)});
  files::writeAll(outputs);
}

void KernelBundle::checkBundleDirectory(const std::string &directory) {
  if (directory.empty())
    throw Error("the bundle directory path is empty");
  // The directory, or the nearest ancestor that exists (which the write
  // creates the rest in), must be a writable directory.
  fs::path existing = fs::path(directory);
  struct stat info;
  while (::stat(existing.c_str(), &info) != 0) {
    // ENOTDIR: a file stands somewhere above; the walk up finds it.
    if (errno != ENOENT && errno != ENOTDIR)
      throw Error(fmt::format("bundle directory '{}': {}", directory, std::strerror(errno)));
    fs::path parent = existing.parent_path();
    if (parent.empty() || parent == existing)
      parent = existing.is_absolute() ? fs::path("/") : fs::path(".");
    existing = parent;
  }
  if (!S_ISDIR(info.st_mode))
    throw Error(fmt::format("bundle directory '{}': '{}' exists and is not a directory (a "
                            "bundle is a directory of cubins and manifest.json)",
                            directory, existing.string()));
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    throw Error(fmt::format("bundle directory '{}': '{}' is not writable ({})", directory,
                            existing.string(), std::strerror(errno)));
}

KernelBundle KernelBundle::read(const std::string &directory) {
  KernelBundle bundle = parseManifest(readBytes(fs::path(directory) / "manifest.json"));
  for (BundleModule &module : bundle.modules) {
    module.image = readBytes(fs::path(directory) / module.file);
    std::string checksum = fmt::format("{:016x}", contentHash64(module.image));
    if (checksum != module.checksum)
      throw Error(fmt::format("bundle module {} is corrupt: checksum {} but the manifest says {}",
                              module.file, checksum, module.checksum));
  }
  return bundle;
}

} // namespace pagedc
