//===- Run.cpp - `pagedc run`: attention on .npy files --------------------===//
//
//   pagedc run FILE.attn [--mask=NAME] [--score=NAME] --q q.npy --k k.npy
//       --v v.npy -o out.npy [--lse lse.npy] [--buffer NAME=file.npy]...
//       [--param NAME=VALUE]... [-D NAME=VALUE]... [--scale F] [--block=QxKV]
//       [--page-size N] [--shuffle-pages SEED | --ascending-pages | --pages-per-reserve N]
//       [--q-offset N|end] [--sinks S[,S...] | --sinks SINKS.npy]
//       [--device cpu|cuda|emu|auto] [--dtype f16|bf16] [--reference] [--threads N]
//
// The mods are compiled by the CPU JIT; K/V go into a PagedKVCache (reserve +
// assign), the block mask comes from createBlockMask and the attention from
// flexAttention. On the CPU everything is f32. With --device cuda (or auto
// on a machine with a usable CUDA driver and a shape the CUDA kernels take)
// the mods' CUDA code is generated too, the cache lives on cuda:0 and the
// inputs are converted to --dtype (bf16 by default); the output is still
// written as f32. --device emu takes the same CUDA path on the SIMT emulator
// (the kernels executed on the CPU with every checker on; a checker report
// fails the run). --reference computes the float64 reference instead (and
// writes it as f32). Every input is checked before anything is computed, and
// outputs are written through temporary files renamed into place, so a
// failure leaves no file behind. Exit status: 0, 1 for bad input, 2 for a bad
// command line.
//
//===----------------------------------------------------------------------===//

#include "Run.h"
#include "RunSupport.h"

#include "JIT/CompileSource.h"
#include "cpu/Reference.h"
#include "pagedc/Attention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/ConstOverride.h"
#include "pagedc/CudaDriver.h"
#include "pagedc/Error.h"
#include "pagedc/KernelOptions.h"
#include "pagedc/KernelSource.h"
#include "pagedc/Npy.h"
#include "OutputFiles.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

using namespace pagedc;
using namespace pagedc::driver;

namespace {

constexpr const char *kRunUsage =
    "usage: pagedc run FILE.attn [--mask=NAME] [--score=NAME] --q Q.npy "
    "--k K.npy --v V.npy -o OUT.npy\n"
    "           [--lse LSE.npy] [--buffer NAME=FILE.npy]... [--param "
    "NAME=VALUE]... [-D NAME=VALUE]...\n"
    "           [--scale F] [--block=QxKV] [--page-size N] [--shuffle-pages "
    "SEED | --ascending-pages | --pages-per-reserve N]\n"
    "           [--q-offset N|end] [--sinks S[,S...] | --sinks SINKS.npy]\n"
    "           [--device cpu|cuda|emu|auto] [--dtype f16|bf16] [--reference] "
    "[--threads N]\n"
    "           [--kernel-option NAME=VALUE]...\n"
    "  --sinks: attention sinks, one logit per query head (or one for all) as\n"
    "  numbers separated by commas, or an f32 [Hq] .npy file: each is one more\n"
    "  key of value zero in its head's softmax.\n"
    "  FILE.attn is at most 16 MiB. -o and --lse: '-' or /dev/stdout is "
    "standard output,\n"
    "  devices and FIFOs are written in place, an input is never "
    "overwritten.\n"
    "\n"
    "--kernel-option NAME=VALUE sets a CUDA kernel option of the call (repeatable;\n"
    "the last of a name wins; VALUE empty: the runtime decides). Unset, each\n"
    "takes its $PAGEDC_* variable (NAME in capitals after PAGEDC_), if set.\n"
    "Names:\n";

/// kRunUsage and the table of kernel options.
std::string runUsage() {
  std::string text = kRunUsage;
  for (const KernelOptionInfo &info : kernelOptionInfos())
    text += fmt::format("  {:<24} {} (unset: {})\n", info.name, info.values, info.unset);
  return text;
}

/// A problem with the command line: exit status 2.
struct UsageError {
  std::string message;
};

/// Everything `pagedc run` was asked to do.
struct RunOptions {
  std::string program;
  std::string mask, score;
  std::string qPath, kPath, vPath, outPath, lsePath, sinksPath;
  std::vector<std::pair<std::string, std::string>> buffers; // NAME, file
  std::vector<std::pair<std::string, std::string>> params;  // NAME, value
  std::vector<ConstOverride> constOverrides;
  std::optional<float> scale;
  int32_t qBlock = 128, kvBlock = 128;
  std::optional<int64_t> pageSize;
  std::optional<uint64_t> shuffleSeed;
  /// Pages each reserve takes (0: a sequence's whole length at once;
  /// --ascending-pages is 1).
  int64_t pagesPerReserve = 0;
  std::string pagesPerReserveFlag; // the flag that set it
  std::optional<int64_t> qOffset; // nullopt with qOffsetAtEnd
  bool qOffsetAtEnd = false;
  /// --sinks: one logit per query head, or one for every head; empty: none.
  std::vector<float> sinks;
  std::string device = "auto";
  DType gpuType = DType::BF16; // --dtype: the element type on CUDA
  bool reference = false;
  int threads = 0;
  /// --kernel-option NAME=VALUE settings in command-line order (checked).
  std::vector<std::string> kernelOptions;
};

int64_t parseInteger(llvm::StringRef option, llvm::StringRef text, int64_t lo,
                     int64_t hi) {
  int64_t value = 0;
  if (text.getAsInteger(10, value) || value < lo || value > hi)
    throw UsageError{option.str() + " expects an integer in [" +
                     std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got '" + text.str() + "'"};
  return value;
}

std::pair<std::string, std::string> splitAssignment(llvm::StringRef option,
                                                    llvm::StringRef text) {
  auto [name, value] = text.split('=');
  if (name.empty() || !text.contains('='))
    throw UsageError{option.str() + " expects NAME=VALUE, got '" + text.str() +
                     "'"};
  return {name.str(), value.str()};
}

RunOptions parseRunOptions(llvm::ArrayRef<const char *> args) {
  RunOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    llvm::StringRef arg = args[i];
    // Split `--name=value`; otherwise options with values take the next arg.
    llvm::StringRef name = arg, inlineValue;
    bool hasInline = false;
    if (arg.starts_with("--") && arg.contains('=')) {
      std::tie(name, inlineValue) = arg.split('=');
      hasInline = true;
    } else if (arg.starts_with("-D") && arg.size() > 2) {
      name = "-D";
      inlineValue = arg.drop_front(2);
      hasInline = true;
    } else if (arg.starts_with("-o") && arg.size() > 2) {
      name = "-o";
      inlineValue = arg.drop_front(2);
      hasInline = true;
    }
    auto value = [&]() -> llvm::StringRef {
      if (hasInline)
        return inlineValue;
      if (i + 1 >= args.size())
        throw UsageError{name.str() + " needs a value"};
      return args[++i];
    };
    auto flag = [&]() {
      if (hasInline)
        throw UsageError{name.str() + " takes no value"};
    };
    if (name == "--mask") options.mask = value().str();
    else if (name == "--score") options.score = value().str();
    else if (name == "--q") options.qPath = value().str();
    else if (name == "--k") options.kPath = value().str();
    else if (name == "--v") options.vPath = value().str();
    else if (name == "-o" || name == "--output") options.outPath = value().str();
    else if (name == "--lse") options.lsePath = value().str();
    else if (name == "--buffer")
      options.buffers.push_back(splitAssignment(name, value()));
    else if (name == "--param")
      options.params.push_back(splitAssignment(name, value()));
    else if (name == "-D") {
      auto [constant, text] = splitAssignment(name, value());
      pagedc::ConstOverrideValue parsed;
      std::string why = pagedc::parseConstOverride(text, parsed);
      if (!why.empty())
        throw UsageError{"-D " + constant + "=" + text + ": the value '" + text +
                         "' " + why};
      options.constOverrides.push_back({constant, text});
    } else if (name == "--scale") {
      double scale = 0;
      llvm::StringRef text = value();
      if (text.getAsDouble(scale) || !std::isfinite(scale))
        throw UsageError{"--scale expects a finite number, got '" + text.str() +
                         "'"};
      options.scale = static_cast<float>(scale);
    } else if (name == "--block") {
      llvm::StringRef text = value();
      auto [q, kv] = text.split('x');
      if (!text.contains('x'))
        throw UsageError{"--block expects QxKV (e.g. 128x128), got '" +
                         text.str() + "'"};
      options.qBlock = static_cast<int32_t>(parseInteger("--block", q, 1, 4096));
      options.kvBlock =
          static_cast<int32_t>(parseInteger("--block", kv, 1, 4096));
    } else if (name == "--page-size") {
      int64_t size = parseInteger(name, value(), 1, 1024);
      if (size & (size - 1))
        throw UsageError{"--page-size must be a power of two from 1 to 1024, "
                         "got " + std::to_string(size)};
      options.pageSize = size;
    } else if (name == "--shuffle-pages") {
      options.shuffleSeed = static_cast<uint64_t>(
          parseInteger(name, value(), 0, INT64_MAX));
    } else if (name == "--ascending-pages" || name == "--pages-per-reserve") {
      if (!options.pagesPerReserveFlag.empty() && options.pagesPerReserveFlag != name)
        throw UsageError{"--ascending-pages and --pages-per-reserve are two page orders: "
                         "give one"};
      options.pagesPerReserveFlag = name.str();
      if (name == "--ascending-pages") {
        flag();
        options.pagesPerReserve = 1;
      } else {
        options.pagesPerReserve = parseInteger(name, value(), 1, 1 << 20);
      }
    } else if (name == "--q-offset") {
      llvm::StringRef text = value();
      if (text == "end")
        options.qOffsetAtEnd = true;
      else
        options.qOffset = parseInteger(name, text, 0, INT32_MAX);
    } else if (name == "--sinks") {
      llvm::StringRef text = value();
      options.sinks.clear();
      options.sinksPath.clear();
      if (text.ends_with(".npy")) {
        options.sinksPath = text.str();
        continue;
      }
      llvm::SmallVector<llvm::StringRef> items;
      text.split(items, ',');
      for (llvm::StringRef item : items) {
        double sink = 0;
        if (item.trim().getAsDouble(sink) || !std::isfinite(sink))
          throw UsageError{"--sinks expects finite numbers separated by commas, got '" +
                           item.str() + "'"};
        options.sinks.push_back(static_cast<float>(sink));
      }
    } else if (name == "--device") {
      options.device = value().str();
      if (options.device != "cpu" && options.device != "cuda" &&
          options.device != "auto" && options.device != "emu")
        throw UsageError{"--device expects cpu, cuda, emu or auto, got '" +
                         options.device + "'"};
    } else if (name == "--dtype") {
      llvm::StringRef text = value();
      if (text == "bf16")
        options.gpuType = DType::BF16;
      else if (text == "f16")
        options.gpuType = DType::F16;
      else
        throw UsageError{"--dtype expects f16 or bf16, got '" + text.str() +
                         "'"};
    } else if (name == "--reference") {
      flag();
      options.reference = true;
    } else if (name == "--threads") {
      options.threads = static_cast<int>(parseInteger(name, value(), 0, 1024));
    } else if (name == "--kernel-option") {
      const llvm::StringRef text = value();
      KernelOptions scratch; // checked now, applied over the environment's later
      try {
        setKernelOption(scratch, std::string_view(text.data(), text.size()));
      } catch (const Error &error) {
        throw UsageError{"--kernel-option: " + std::string(error.what())};
      }
      options.kernelOptions.push_back(text.str());
    } else if (arg.starts_with("-") && arg != "-") {
      throw UsageError{"unknown option '" + arg.str() + "'"};
    } else if (options.program.empty()) {
      options.program = arg.str();
    } else {
      throw UsageError{"unexpected argument '" + arg.str() +
                       "' (the program is '" + options.program + "')"};
    }
  }
  if (options.program.empty())
    throw UsageError{"no .attn program given"};
  if (options.pagesPerReserve && options.shuffleSeed)
    throw UsageError{options.pagesPerReserveFlag +
                     " and --shuffle-pages are two page orders: give one"};
  for (auto [path, what] : {std::pair{&options.qPath, "--q"},
                            std::pair{&options.kPath, "--k"},
                            std::pair{&options.vPath, "--v"},
                            std::pair{&options.outPath, "-o"}})
    if (path->empty())
      throw UsageError{std::string(what) + " is required"};
  return options;
}

/// Opens an attention input and checks its header: rank 4, a floating dtype
/// (bf16 as '<u2'). The data is read later, in place.
std::unique_ptr<NpyFile> openAttentionInput(const std::string &path, const char *role) {
  NpyReadOptions read;
  read.uint16AsBF16 = true;
  auto tensor = std::make_unique<NpyFile>(path, read);
  if (tensor->dtype() != DType::F32 && tensor->dtype() != DType::F16 &&
      tensor->dtype() != DType::BF16)
    throw Error(fmt::format("npy file '{}': {} must be f32, f16 or bf16 (as <u2), "
                    "not {}",
                    path.c_str(), role, dtypeName(tensor->dtype())));
  if (tensor->shape().size() != 4)
    throw Error(fmt::format("npy file '{}': {} must have rank 4 [B, H, L, D], got "
                    "shape {}",
                    path.c_str(), role,
                    shapeToString(tensor->shape()).c_str()));
  return tensor;
}

/// Parses a param value of the declared type.
PagedcParamSlot parseParam(const ParamDecl &decl, const std::string &text) {
  PagedcParamSlot slot{};
  llvm::StringRef value(text);
  switch (decl.type) {
  case ScalarKind::F32: {
    double real = 0;
    if (value.getAsDouble(real))
      throw Error(fmt::format("--param {}={}: '{}' is not a number ({} is f32)",
                      decl.name.c_str(), text.c_str(), text.c_str(),
                      decl.name.c_str()));
    slot.f32 = static_cast<float>(real);
    return slot;
  }
  case ScalarKind::I32: {
    int64_t integer = 0;
    if (value.getAsInteger(10, integer) || integer < INT32_MIN ||
        integer > INT32_MAX)
      throw Error(fmt::format("--param {}={}: '{}' is not an i32", decl.name.c_str(),
                      text.c_str(), text.c_str()));
    slot.i32 = static_cast<int32_t>(integer);
    return slot;
  }
  case ScalarKind::Bool:
    if (value == "true" || value == "1")
      slot.i32 = 1;
    else if (value == "false" || value == "0")
      slot.i32 = 0;
    else
      throw Error(fmt::format("--param {}={}: expected true or false",
                      decl.name.c_str(), text.c_str()));
    return slot;
  }
  return slot;
}

/// Why the CUDA kernels cannot run a call of this shape; empty when they can.
std::string cudaShapeProblem(int64_t dim, int64_t vDim, int32_t kvBlock) {
  if (!isCudaHeadDim(dim))
    return fmt::format("the CUDA kernels take head dims that are {}, not {}", cudaHeadDimsText(),
                       (long long)dim);
  if (!isCudaHeadDim(vDim))
    return fmt::format("the CUDA kernels take value head dims that are {}, not {}",
                       cudaHeadDimsText(), (long long)vDim);
  if (kvBlock % 64 != 0)
    return fmt::format("the CUDA kernels need a kv block size that is a "
                       "multiple of 64 (--block), not {}",
                       kvBlock);
  return {};
}

/// The outputs and every file the run reads, as named on the command line.
void checkOutputPaths(const RunOptions &options) {
  std::vector<files::NamedPath> outputs = {{"-o", options.outPath}};
  if (!options.lsePath.empty())
    outputs.push_back({"--lse", options.lsePath});
  std::vector<files::NamedPath> inputs = {{"program", options.program},
                                          {"--q", options.qPath},
                                          {"--k", options.kPath},
                                          {"--v", options.vPath}};
  for (const auto &[name, path] : options.buffers)
    inputs.push_back({"--buffer " + name, path});
  if (!options.sinksPath.empty())
    inputs.push_back({"--sinks", options.sinksPath});
  files::checkOutputs(outputs, inputs);
}

int runChecked(const RunOptions &options) {
  // 0. Outputs that must not be written (an input, a directory, the same
  // file twice) fail before any work; so do kernel options: the $PAGEDC_*
  // variables at the tool's edge (the runtime reads none), then the flags.
  checkOutputPaths(options);
  KernelOptions kernelOptions = kernelOptionsFromEnvironment();
  for (const std::string &setting : options.kernelOptions)
    setKernelOption(kernelOptions, setting);
  checkKernelOptions(kernelOptions);

  // 1. The device: cuda must be usable; auto takes it when it is.
  // emu: the CUDA path on the SIMT emulator.
  std::string cudaReason;
  bool useCuda = false;
  const bool cudaRequired = options.device == "cuda" || options.device == "emu";
  if (options.device == "emu")
    selectEmulatorDriver();
  if (options.device != "cpu" && !options.reference)
    useCuda = cudaExecutionUsable(cudaReason);
  if (cudaRequired && !useCuda && !options.reference)
    throw Error("--device " + options.device +
                ": CUDA execution is not available: " + cudaReason);

  // 2. The mods (with their CUDA code only when CUDA may run them).
  jit::SourceCompileOptions compileOptions;
  compileOptions.constOverrides = options.constOverrides;
  compileOptions.withCuda = useCuda;
  auto compiled = jit::compileModsFromFile(options.program, options.mask,
                                           options.score, compileOptions,
                                           llvm::errs());
  if (!compiled)
    throw Error(llvm::toString(compiled.takeError()));
  const CompiledMods &mods = *compiled;

  // 3. Inputs and their shapes.
  // q is read whole; K and V only have their headers read here: their data
  // goes from the files straight into the KV cache (buildCache), so the run
  // holds one copy of them.
  std::unique_ptr<NpyFile> qFile = openAttentionInput(options.qPath, "q");
  std::unique_ptr<NpyFile> kFile = openAttentionInput(options.kPath, "k");
  std::unique_ptr<NpyFile> vFile = openAttentionInput(options.vPath, "v");
  const std::vector<int64_t> qs = qFile->shape(), ks = kFile->shape(), vs = vFile->shape();
  const int64_t batch = qs[0], qHeads = qs[1], qLength = qs[2], dim = qs[3];
  const int64_t kvHeads = ks[1], kvLength = ks[2], vDim = vs[3];
  auto mismatch = [&](const std::string &path, const std::string &what) {
    return Error("npy file '" + path + "': " + what);
  };
  if (ks[0] != batch)
    throw mismatch(options.kPath, fmt::format("batch {} differs from q's {}",
                                      (long long)ks[0], (long long)batch));
  if (vs[0] != batch)
    throw mismatch(options.vPath, fmt::format("batch {} differs from q's {}",
                                      (long long)vs[0], (long long)batch));
  if (ks[3] != dim)
    throw mismatch(options.kPath, fmt::format("head dim {} differs from q's {}",
                                      (long long)ks[3], (long long)dim));
  if (vs[1] != kvHeads || vs[2] != kvLength)
    throw mismatch(options.vPath,
                   fmt::format("shape {} does not match k's {} in heads and length",
                       shapeToString(vs).c_str(), shapeToString(ks).c_str()));
  if (kvHeads <= 0 || qHeads % kvHeads != 0)
    throw mismatch(options.kPath,
                   fmt::format("{} KV heads do not divide q's {} heads",
                       (long long)kvHeads, (long long)qHeads));
  for (const auto &[path, shape] :
       {std::pair{&options.qPath, &qs}, std::pair{&options.kPath, &ks},
        std::pair{&options.vPath, &vs}})
    for (int64_t extent : *shape)
      if (extent <= 0)
        throw mismatch(*path, "every dimension must be positive, but the "
                              "shape is " + shapeToString(*shape));
  if (qLength > INT32_MAX / 2)
    throw mismatch(options.qPath, "sequence too long");
  if (kvLength > INT32_MAX / 2)
    throw mismatch(options.kPath, "sequence too long");

  std::vector<float> sinkValues = options.sinks;
  if (sinkValues.size() == 1)
    sinkValues.assign(static_cast<size_t>(qHeads), sinkValues[0]);
  if (!sinkValues.empty() && static_cast<int64_t>(sinkValues.size()) != qHeads)
    throw Error(fmt::format("--sinks gives {} values but q has {} heads", sinkValues.size(),
                            (long long)qHeads));

  int64_t qOffset = options.qOffsetAtEnd ? kvLength - qLength
                                         : options.qOffset.value_or(0);
  if (qOffset < 0)
    throw Error(fmt::format("--q-offset end: q has {} rows but k only {}, so the "
                    "offset would be negative",
                    (long long)qLength, (long long)kvLength));
  if (useCuda) {
    std::string problem = cudaShapeProblem(dim, vDim, options.kvBlock);
    if (!problem.empty() && cudaRequired)
      throw Error("--device " + options.device + ": " + problem);
    if (!problem.empty())
      useCuda = false; // auto: the CPU runs every shape
  }

  // Sinks: f32 [Hq]; the runtime checks them again on the call's device.
  HostTensor sinks;
  const bool haveSinks = !options.sinksPath.empty() || !sinkValues.empty();
  if (!sinkValues.empty()) {
    sinks = HostTensor(DType::F32, {qHeads});
    std::copy(sinkValues.begin(), sinkValues.end(), sinks.dataAs<float>());
  } else if (!options.sinksPath.empty()) {
    sinks = readNpy(options.sinksPath, NpyReadOptions());
    if (sinks.dtype() != DType::F32 || sinks.shape() != std::vector<int64_t>{qHeads})
      throw Error(fmt::format("npy file '{}': --sinks must be f32 [Hq] = [{}] but holds {} {}",
                              options.sinksPath, qHeads, dtypeName(sinks.dtype()),
                              shapeToString(sinks.shape())));
  }

  // 4. Bindings: every given buffer and param must be declared by the mods.
  std::vector<HostTensor> bufferStorage;
  Bindings bindings;
  bufferStorage.reserve(options.buffers.size());
  for (const auto &[name, path] : options.buffers) {
    const BufferDecl *decl = nullptr;
    for (const BufferDecl &candidate : mods.buffers)
      if (candidate.name == name)
        decl = &candidate;
    if (!decl)
      throw Error("--buffer " + name + "=" + path + ": the selected mods read "
                  "no buffer named '" + name + "'" +
                  declaredList(mods.buffers));
    NpyReadOptions read;
    read.uint16AsBF16 = decl->elementType == DType::BF16;
    HostTensor tensor = readNpy(path, read);
    if (tensor.dtype() != decl->elementType)
      throw Error(fmt::format("npy file '{}': buffer '{}' is declared {} but the file "
                      "holds {}",
                      path.c_str(), name.c_str(), dtypeName(decl->elementType),
                      dtypeName(tensor.dtype())));
    if (tensor.shape().size() != decl->dims.size())
      throw Error(fmt::format("npy file '{}': buffer '{}' is declared with rank {} "
                      "but the file has shape {}",
                      path.c_str(), name.c_str(), decl->dims.size(),
                      shapeToString(tensor.shape()).c_str()));
    bufferStorage.push_back(std::move(tensor));
    bindings.buffers[name] = bufferStorage.back().view();
  }
  std::vector<PagedcParamSlot> paramSlots;
  for (const auto &[name, text] : options.params) {
    const ParamDecl *decl = nullptr;
    for (const ParamDecl &candidate : mods.params)
      if (candidate.name == name)
        decl = &candidate;
    if (!decl)
      throw Error("--param " + name + "=" + text + ": the selected mods read "
                  "no param named '" + name + "'" + declaredList(mods.params));
    PagedcParamSlot slot = parseParam(*decl, text);
    bindings.params[name] =
        decl->type == ScalarKind::F32    ? ParamValue::ofF32(slot.f32)
        : decl->type == ScalarKind::I32 ? ParamValue::ofI32(slot.i32)
                                        : ParamValue::ofBool(slot.i32 != 0);
  }
  // Missing buffers/params, named dims that disagree: the runtime's checks.
  ResolvedBindings resolved;
  try {
    resolved = resolveBindings(mods, bindings, Device::cpu());
  } catch (const Error &error) {
    throw Error(std::string(error.what()) +
                " (bind buffers with --buffer NAME=FILE.npy, params with "
                "--param NAME=VALUE)");
  }

  // 5. Attention: the float64 reference or the runtime.
  HostTensor out(DType::F32, {batch, qHeads, qLength, vDim});
  HostTensor lse(DType::F32, {batch, qHeads, qLength});
  std::vector<int32_t> kvLengths(batch, static_cast<int32_t>(kvLength));
  std::vector<int32_t> qOffsets(batch, static_cast<int32_t>(qOffset));
  float scale = options.scale.value_or(1.0f / std::sqrt(float(dim)));
  HostTensor q = toF32(qFile->read());
  qFile.reset();
  if (options.reference) {
    HostTensor k = toF32(kFile->read());
    HostTensor v = toF32(vFile->read());
    cpu::ReferenceArgs args;
    args.q = q.view();
    args.k = k.view();
    args.v = v.view();
    args.kvLength = kvLengths.data();
    args.qOffset = qOffsets.data();
    args.mods = &mods;
    args.context = &resolved.context();
    args.scale = scale;
    if (haveSinks)
      args.sinks = sinks.dataAs<float>();
    cpu::ReferenceResult result = cpu::referenceAttention(args);
    for (size_t i = 0; i < result.out.size(); ++i)
      out.dataAs<float>()[i] = static_cast<float>(result.out[i]);
    for (size_t i = 0; i < result.lse.size(); ++i)
      lse.dataAs<float>()[i] = static_cast<float>(result.lse[i]);
  } else {
    int64_t pageSize = options.pageSize.value_or(contiguousPageSize(kvLength));
    const Device device = useCuda ? Device::cuda(0) : Device::cpu();
    const DType elementType = useCuda ? options.gpuType : DType::F32;
    std::unique_ptr<PagedKVCache> cache = buildCache(
        KVRows(*kFile), KVRows(*vFile), std::vector<int64_t>(batch, kvLength),
        pageSize, options.shuffleSeed, elementType, device, options.pagesPerReserve);
    kFile.reset();
    vFile.reset();
    // The block mask is built on the host from the host bindings (on CUDA
    // flexAttention uploads it) and covers only the call's query rows, so a
    // decode step's mask is O(kv / block) on every device.
    BlockMask blockMask = createBlockMaskRows(mods, resolved.context(), batch, qHeads,
                                              qOffset, qOffset + qLength, kvLength,
                                              options.qBlock, options.kvBlock);
    AttentionOptions attention;
    attention.kvLength = kvLengths;
    attention.qOffset = qOffsets;
    attention.scale = scale;
    attention.returnLse = true;
    attention.threads = options.threads;
    attention.kernel = kernelOptions;
    if (!useCuda) {
      if (haveSinks)
        attention.sinks = sinks.view();
      attention.out = out.view();
      attention.lse = lse.view();
      flexAttention(q.view(), *cache, &blockMask, mods, bindings, attention);
    } else {
      // q and the buffers uploaded, outputs downloaded; out converted to f32.
      DeviceTensor qDevice = uploadTensor(fromF32(q, elementType), 0);
      HostTensor out16(elementType, out.shape());
      DeviceBuffer outDevice(out16.numel() * dtypeSize(elementType), 0);
      DeviceBuffer lseDevice(lse.numel() * sizeof(float), 0);
      outDevice.fill(0xff); // NaN: an unwritten element shows
      Bindings deviceBindings;
      deviceBindings.params = bindings.params;
      std::vector<DeviceTensor> deviceBuffers;
      deviceBuffers.reserve(bufferStorage.size());
      for (size_t i = 0; i < bufferStorage.size(); ++i) {
        deviceBuffers.push_back(uploadTensor(bufferStorage[i], 0));
        deviceBindings.buffers[options.buffers[i].first] =
            deviceBuffers.back().view;
      }
      attention.out =
          TensorView(outDevice.data(), elementType, out.shape(), device);
      attention.lse = TensorView(lseDevice.data(), DType::F32, lse.shape(),
                                 device);
      std::optional<DeviceTensor> sinksDevice;
      if (haveSinks) {
        sinksDevice.emplace(uploadTensor(sinks, 0));
        attention.sinks = sinksDevice->view;
      }
      flexAttention(qDevice.view, *cache, &blockMask, mods, deviceBindings,
                    attention);
      outDevice.download(out16.data(), outDevice.size());
      lseDevice.download(lse.data(), lseDevice.size());
      out = toF32(std::move(out16));
    }
  }

  // 6. Outputs, all or nothing (OutputFiles.h).
  std::vector<files::OutputFile> outputs;
  outputs.push_back({{"-o", options.outPath}, encodeNpy(out.view())});
  if (!options.lsePath.empty())
    outputs.push_back({{"--lse", options.lsePath}, encodeNpy(lse.view())});
  files::writeAll(outputs);
  return kExitSuccess;
}

} // namespace

int pagedc::driver::runAttentionCommand(llvm::ArrayRef<const char *> args) {
  for (llvm::StringRef arg : args)
    if (arg == "--help" || arg == "-h") {
      llvm::outs() << runUsage();
      return kExitSuccess;
    }
  RunOptions options;
  try {
    options = parseRunOptions(args);
  } catch (const UsageError &error) {
    llvm::errs() << "pagedc run: error: " << error.message << "\n" << runUsage();
    return kExitUsageError;
  }
  try {
    return runChecked(options);
  } catch (const Error &error) {
    llvm::errs() << "pagedc run: error: " << error.what() << "\n";
    return kExitInputError;
  }
}

void pagedc::driver::registerRunSubcommands(Registry &registry) {
  registry.addSubcommand({"run",
                          "compute attention on .npy inputs with the mods of "
                          "a .attn program (CPU JIT, or CUDA when usable)",
                          runAttentionCommand});
  registry.addSubcommand({"demo",
                          "a paged decode loop with example mods, checked "
                          "against the float64 reference",
                          runDemoCommand});
}
