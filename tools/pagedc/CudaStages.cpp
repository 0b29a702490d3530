//===- CudaStages.cpp - The cuda, ptx, cubin and bundle stages ------------===//
//
// Ahead-of-time CUDA compilation from the command line:
//
//   pagedc --emit=cuda|ptx|cubin|bundle --kernel=prefill|decode --arch=sm_90
//          --head-dim=128 --dtype=bf16 --page-size=16 --block=64x64 --gqa=4
//          --mask=NAME --score=NAME FILE.attn -o OUT
//
// cuda prints the kernel translation unit (generated hooks + templates), ptx
// and cubin run NVRTC on it, bundle writes a directory of cubins plus
// manifest.json for one or more kernels and architectures (--kernel and
// --arch then take comma-separated lists).
//
//===----------------------------------------------------------------------===//

#include "Driver.h"

#include "Frontend/MLIRGen.h"
#include "Pipeline.h"
#include "Target/CudaSource.h"

#include "Conversion/CUDA/FlexToEmitC.h"

#include "pagedc/Error.h"
#include "pagedc/KernelBundle.h"
#include "pagedc/KernelCache.h"
#include "pagedc/KernelOptions.h"
#include "pagedc/Nvrtc.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"

using namespace pagedc;
using namespace pagedc::driver;

namespace {

/// Everything the CUDA options say.
struct CudaTarget {
  /// dtype, head dim, page size, GQA; the tile shape is per kind.
  KernelConfig config;
  std::vector<KernelKind> kinds;
  std::vector<std::string> archs;
  /// --block and --warp-rows as given (0: not given).
  int blockM = 0, blockN = 0, warpRows = 0;
  /// The kernel options: the $PAGEDC_* variables, then each --kernel-option
  /// (withKernelSources). The stages read prefillShape.
  KernelOptions kernel;
  /// --kernel-option NAME=VALUE settings in command-line order.
  std::vector<std::string> kernelOptionSettings;
  bool ptxasReport = false;

  /// The configuration of one kernel: prefill takes the shape pagedc runs
  /// (KernelConfig::choosePrefillShape) unless --block / --warp-rows say
  /// otherwise (--block alone means the 16-rows-per-warp design); decode
  /// keeps 64 x 64 tiles. Throws pagedc::Error for an unsupported value.
  /// With --arch=sm_90a alone, prefill defaults to warpgroup tiles (wgmma,
  /// PrefillWgmma.cuh, two consumer warpgroups: 128 x 128 at head dims 64
  /// and 128 where it compiles without spills, else 128 x 64; 64 x 32 at
  /// head dim 256); they need sm_90a, which no other architecture of a
  /// bundle can run.
  KernelConfig configFor(KernelKind kind) const {
    KernelConfig result = config;
    result.kind = kind;
    const bool hopper = archs.size() == 1 && archs.front() == "sm_90a";
    if (kind == KernelKind::Prefill && !blockM) {
      // sm_90a alone: warpgroup tiles (choosePrefillShapeFor); another
      // architecture alone but sm_90: its mma.sync tile (at head dim 128 the
      // FA2-shaped one, kept where it compiles without spills:
      // settleSource); any other --arch list keeps the mma.sync tiles every
      // target runs.
      if (hopper && !warpRows)
        result.choosePrefillShapeFor("sm_90a", kernel);
      else if (archs.size() == 1 && archs.front() != "sm_90" && !warpRows)
        result.choosePrefillShapeFor(archs.front(), kernel);
      else
        result.choosePrefillShape(kernel);
    }
    if (blockM) {
      result.blockM = blockM;
      result.blockN = blockN;
      result.warpRows = 16;
    }
    if (warpRows)
      result.warpRows = warpRows;
    if (kind == KernelKind::Prefill && result.warpRows == 64 && !hopper)
      throw Error("warpgroup tiles (--warp-rows=64) use wgmma: they need --arch=sm_90a alone");
    result.validate();
    return result;
  }
};

int inputError(const llvm::Twine &message) {
  llvm::errs() << "pagedc: error: " << message << "\n";
  return kExitInputError;
}

int usage(const llvm::Twine &message) {
  llvm::errs() << "pagedc: error: " << message << "\n";
  return kExitUsageError;
}

std::optional<KernelKind> parseKind(llvm::StringRef name) {
  if (name == "prefill")
    return KernelKind::Prefill;
  if (name == "decode")
    return KernelKind::Decode;
  return std::nullopt;
}

bool parseInt(llvm::StringRef text, int &value) {
  return !text.getAsInteger(10, value) && value > 0;
}

/// An option handler that checks `value` with `check` (which returns an
/// error message or "") and stores it in Options::extra[key].
OptionHandler checked(std::string key,
                      std::function<std::string(llvm::StringRef)> check) {
  return [key, check](Options &options, llvm::StringRef value) {
    std::string error = check(value);
    if (error.empty())
      options.extra[key] = value.str();
    return error;
  };
}

std::string checkList(llvm::StringRef option, llvm::StringRef value,
                      std::function<bool(llvm::StringRef)> valid,
                      llvm::StringRef expected) {
  llvm::SmallVector<llvm::StringRef> items;
  value.split(items, ',');
  for (llvm::StringRef item : items)
    if (!valid(item))
      return (option + ": '" + item + "' is not " + expected).str();
  return {};
}

bool isArch(llvm::StringRef arch) {
  if (!arch.consume_front("sm_"))
    return false;
  arch.consume_back("a");
  int number = 0;
  return parseInt(arch, number);
}

/// Reads the CUDA options out of Options::extra, with the defaults.
CudaTarget readTarget(const Options &options) {
  auto get = [&](const char *key, const char *fallback) {
    auto it = options.extra.find(key);
    return it == options.extra.end() ? std::string(fallback) : it->second;
  };
  CudaTarget target;
  llvm::SmallVector<llvm::StringRef> items;
  std::string kinds = get("kernel", "prefill");
  llvm::StringRef(kinds).split(items, ',');
  for (llvm::StringRef item : items)
    target.kinds.push_back(*parseKind(item));
  items.clear();
  std::string archs = get("arch", "sm_90");
  llvm::StringRef(archs).split(items, ',');
  for (llvm::StringRef item : items)
    target.archs.push_back(item.str());

  KernelConfig &config = target.config;
  config.kind = target.kinds.front();
  config.elementType = get("dtype", "bf16") == "f16" ? DType::F16 : DType::BF16;
  parseInt(get("head-dim", "128"), config.headDim);
  parseInt(get("page-size", "16"), config.pageSize);
  parseInt(get("gqa", "1"), config.groupSize);
  std::string block = get("block", "");
  if (!block.empty()) {
    auto [rows, columns] = llvm::StringRef(block).split('x');
    parseInt(rows, target.blockM);
    parseInt(columns, target.blockN);
  }
  std::string warpRows = get("warp-rows", "");
  if (!warpRows.empty())
    parseInt(warpRows, target.warpRows);
  target.ptxasReport = options.extra.count("ptxas-report") != 0;
  config.noBlockMask = options.extra.count("no-block-mask") != 0;
  if (auto it = options.extra.find("kernel-option"); it != options.extra.end()) {
    llvm::SmallVector<llvm::StringRef> settings;
    llvm::StringRef(it->second).split(settings, '\n');
    for (llvm::StringRef setting : settings)
      target.kernelOptionSettings.push_back(setting.str());
  }
  return target;
}

/// The mod program after the pipeline: MLIRGen, then buildPipeline() keeping
/// the selected mods (all when none is selected). Null after reporting.
mlir::OwningOpRef<mlir::ModuleOp> buildFlexModule(Compilation &compilation,
                                                  mlir::MLIRContext &context) {
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlirGen(context, *compilation.program);
  if (!module)
    return nullptr;
  PipelineOptions pipelineOptions;
  for (const std::string &name :
       {compilation.options.maskName, compilation.options.scoreName})
    if (!name.empty())
      pipelineOptions.keepMods.push_back(name);
  mlir::PassManager pm(&context);
  buildPipeline(pm, pipelineOptions);
  if (mlir::failed(pm.run(*module)))
    return nullptr;
  return module;
}

/// "128x32 prefill tile with 32 rows per warp [and mod rows recomputed per
/// KV tile]", "128x128 prefill tile with 64 rows per warpgroup".
std::string describeTile(const KernelConfig &config) {
  std::string text = std::to_string(config.blockM) + "x" + std::to_string(config.blockN) +
                     " prefill tile with " + std::to_string(config.warpRows) +
                     (config.warpRows == 64 ? " rows per warpgroup" : " rows per warp");
  if (config.recomputeModRows)
    text += " and mod rows recomputed per KV tile";
  return text;
}

/// Whether `source`, a prefill tile kept only without spills
/// (KernelConfig::prefillFallsBackOnSpills), spills on `arch` (or cannot be
/// compiled to tell: no NVRTC), so that the fallback tile replaces it, as
/// the runtime's settlePrefillShape does. Compiled through the kernel cache
/// with ptxas's report.
/// `spills`: the bytes ptxas reported (-1 when it could not be asked).
/// Throws pagedc::Error when the kernel cache directory cannot be used: that
/// is not a compile failure, and must not silently change the tile.
bool settleSource(const KernelSource &source, const std::string &arch, int &spills) {
  if (!source.config.prefillFallsBackOnSpills())
    return false;
  KernelCache &cache = KernelCache::global();
  try {
    spills = cache.getOrCompile(source, cudaCompileOptions(source.config, arch))->spillBytes;
  } catch (const Error &) {
    spills = -1;
  }
  return spills != 0;
}

/// Runs `body` with the checked target and the kernel source of each
/// requested kind; shared by every stage.
int withKernelSources(
    Compilation &compilation, bool allowLists,
    const std::function<int(const CudaTarget &,
                            const std::vector<KernelSource> &)> &body) {
  CudaTarget target = readTarget(compilation.options);
  if (!allowLists && (target.kinds.size() > 1 || target.archs.size() > 1))
    return usage("--kernel and --arch take one value except with "
                 "--emit=bundle");
  try {
    // At the tool's edge: the variables, then the flags over them.
    target.kernel = kernelOptionsFromEnvironment();
    for (const std::string &setting : target.kernelOptionSettings)
      setKernelOption(target.kernel, setting);
    checkKernelOptions(target.kernel);
    for (KernelKind kind : target.kinds)
      target.configFor(kind);
  } catch (const Error &error) {
    return usage(error.what());
  }

  mlir::DialectRegistry registry;
  registerFlexDialects(registry);
  registerCudaLoweringDialects(registry);
  mlir::MLIRContext context(registry);
  mlir::ScopedDiagnosticHandler diagnostics(
      &context, [](mlir::Diagnostic &diagnostic) {
        llvm::errs() << diagnostic.getLocation() << ": error: " << diagnostic
                     << "\n";
        return mlir::success();
      });
  mlir::OwningOpRef<mlir::ModuleOp> module =
      buildFlexModule(compilation, context);
  if (!module)
    return kExitInputError;

  std::vector<KernelSource> sources;
  for (KernelKind kind : target.kinds) {
    KernelConfig config = target.configFor(kind);
    llvm::Expected<KernelSource> source =
        buildKernelSource(*module, compilation.options.maskName,
                          compilation.options.scoreName, config);
    if (!source)
      return inputError(llvm::toString(source.takeError()));
    // (A tile --block / --warp-rows asked for is kept as asked.) The tile,
    // then the next one where it spills: 128x128 warpgroups -> 128x64;
    // 128x32 -> the same tile with its mod rows recomputed -> 64x64.
    int spills = 0;
    while (!target.blockM && !target.warpRows) {
      try {
        if (!settleSource(*source, target.archs.front(), spills))
          break;
      } catch (const Error &error) {
        return inputError(error.what());
      }
      const KernelConfig spilled = source->config;
      config.usePrefillSpillFallback();
      if (target.ptxasReport)
        llvm::errs() << "pagedc: note: the " << describeTile(spilled) << " "
                     << (spills > 0 ? "spills " + std::to_string(spills) + " bytes"
                                    : std::string("could not be compiled to check it"))
                     << " on " << target.archs.front() << "; compiling "
                     << (config.recomputeModRows
                             ? std::string("it with the mods' row values recomputed per KV tile")
                             : "the " + describeTile(config))
                     << "\n";
      source = buildKernelSource(*module, compilation.options.maskName,
                                 compilation.options.scoreName, config);
      if (!source)
        return inputError(llvm::toString(source.takeError()));
    }
    sources.push_back(std::move(*source));
  }
  return body(target, sources);
}

/// NVRTC on `source`; prints the ptxas report to stderr when asked.
std::optional<CompileResult> compileSource(const KernelSource &source,
                                           const std::string &arch,
                                           CompileOptions::Output output,
                                           bool ptxasReport) {
  // A cubin of a tile that settleSource compiled in this process (through
  // the kernel cache, with ptxas's report): that compile's image and log,
  // not a second compile. A disk hit has no log, so it is compiled again.
  // A cache directory that cannot be used is an error, not a reason to skip
  // the cache.
  if (output == CompileOptions::Output::Cubin && source.config.prefillFallsBackOnSpills()) {
    KernelCache *cache = nullptr;
    try {
      cache = &KernelCache::global();
    } catch (const Error &error) {
      inputError(error.what());
      return std::nullopt;
    }
    try {
      std::shared_ptr<const CompiledKernel> cached =
          cache->getOrCompile(source, cudaCompileOptions(source.config, arch));
      if (!cached->log.empty()) {
        if (ptxasReport)
          llvm::errs() << cached->log;
        CompileResult result;
        result.image = cached->image;
        result.log = cached->log;
        return result;
      }
    } catch (const Error &) {
      // The compile below reports the error.
    }
  }
  CompileOptions options;
  options.arch = arch;
  options.output = output;
  options.ptxasVerbose = ptxasReport;
  try {
    std::string name =
        std::string("pagedc_") + kernelKindName(source.config.kind) + ".cu";
    CompileResult result =
        Nvrtc::get().compile(source.code, name, options, &source);
    if (ptxasReport)
      llvm::errs() << result.log;
    return result;
  } catch (const Error &error) {
    inputError(error.what());
    return std::nullopt;
  }
}

int runCudaStage(Compilation &compilation, llvm::raw_ostream &os) {
  return withKernelSources(
      compilation, /*allowLists=*/false,
      [&](const CudaTarget &, const std::vector<KernelSource> &sources) {
        os << sources.front().code;
        return int(kExitSuccess);
      });
}

int runPtxStage(Compilation &compilation, llvm::raw_ostream &os) {
  return withKernelSources(
      compilation, /*allowLists=*/false,
      [&](const CudaTarget &target, const std::vector<KernelSource> &sources) {
        std::optional<CompileResult> result =
            compileSource(sources.front(), target.archs.front(),
                          CompileOptions::Output::Ptx, target.ptxasReport);
        if (!result)
          return int(kExitInputError);
        // NVRTC's PTX ends with a NUL byte.
        llvm::StringRef ptx(result->image);
        os << ptx.rtrim('\0');
        return int(kExitSuccess);
      });
}

int runCubinStage(Compilation &compilation, llvm::raw_ostream &os) {
  const std::string &path = compilation.options.outputPath;
  if ((path == "-" || path == "/dev/stdout") &&
      llvm::sys::Process::StandardOutIsDisplayed())
    return usage("a cubin is binary; refusing to write it to a terminal "
                 "(give -o FILE or redirect the output)");
  return withKernelSources(
      compilation, /*allowLists=*/false,
      [&](const CudaTarget &target, const std::vector<KernelSource> &sources) {
        std::optional<CompileResult> result =
            compileSource(sources.front(), target.archs.front(),
                          CompileOptions::Output::Cubin, target.ptxasReport);
        if (!result)
          return int(kExitInputError);
        os << result->image;
        return int(kExitSuccess);
      });
}

int runBundleStage(Compilation &compilation, llvm::raw_ostream &) {
  const std::string &directory = compilation.options.outputPath;
  if (directory == "-" || directory == "/dev/stdout")
    return usage("--emit=bundle writes a directory: give -o DIR");
  // Before any compiling: a file where the directory should be (the input
  // itself included) or a directory that refuses files is an error.
  try {
    KernelBundle::checkBundleDirectory(directory);
  } catch (const Error &error) {
    return inputError(llvm::Twine("-o: ") + error.what());
  }
  return withKernelSources(
      compilation, /*allowLists=*/true,
      [&](const CudaTarget &target, const std::vector<KernelSource> &sources) {
        const Options &options = compilation.options;
        std::string label =
            llvm::sys::path::stem(options.inputPath).str() + ":" +
            (options.maskName.empty() ? "-" : options.maskName) + ":" +
            (options.scoreName.empty() ? "-" : options.scoreName);
        KernelBundle bundle;
        for (const KernelSource &source : sources) {
          for (const std::string &arch : target.archs) {
            std::optional<CompileResult> result =
                compileSource(source, arch, CompileOptions::Output::Cubin,
                              target.ptxasReport);
            if (!result)
              return int(kExitInputError);
            CompileOptions compileOptions;
            compileOptions.arch = arch;
            CompiledKernel kernel;
            kernel.config = source.config;
            kernel.arch = arch;
            kernel.kernelNames = source.kernelNames;
            kernel.key = KernelCache::diskKey(source.code, compileOptions);
            kernel.output = CompileOptions::Output::Cubin;
            kernel.image = std::move(result->image);
            bundle.add(kernel, label);
          }
        }
        try {
          bundle.write(directory);
        } catch (const Error &error) {
          return inputError(error.what());
        }
        return int(kExitSuccess);
      });
}

} // namespace

void pagedc::driver::registerCudaStages(Registry &registry) {
  registry.addOption(
      {"--kernel", "KIND",
       "prefill or decode (cuda, ptx, cubin; default "
       "prefill); a comma list for bundle",
       checked("kernel", [](llvm::StringRef value) {
         return checkList(
             "--kernel", value,
             [](llvm::StringRef item) { return parseKind(item).has_value(); },
             "prefill or decode");
       })});
  registry.addOption({"--arch", "SM",
                      "GPU architecture, e.g. sm_80, sm_90 (default "
                      "sm_90); a comma list for bundle",
                      checked("arch", [](llvm::StringRef value) {
                        return checkList("--arch", value, isArch,
                                         "an architecture like sm_90");
                      })});
  auto positive = [](const char *option) {
    return [option](llvm::StringRef value) {
      int number = 0;
      return parseInt(value, number) ? std::string()
                                     : (llvm::Twine(option) + ": '" + value +
                                        "' is not a positive integer")
                                           .str();
    };
  };
  registry.addOption({"--head-dim", "N", "head dimension (default 128)",
                      checked("head-dim", positive("--head-dim"))});
  registry.addOption(
      {"--dtype", "TYPE", "element type of q, k, v: f16 or bf16 (default bf16)",
       checked("dtype", [](llvm::StringRef value) {
         return value == "f16" || value == "bf16"
                    ? std::string()
                    : "--dtype: '" + value.str() + "' is not f16 or bf16";
       })});
  registry.addOption({"--page-size", "N", "tokens per KV page (default 16)",
                      checked("page-size", positive("--page-size"))});
  registry.addOption(
      {"--block", "QxKV",
       "query rows x KV rows per tile (default: the shape pagedc runs, see "
       "--warp-rows; decode: 64x64)",
       checked("block", [](llvm::StringRef value) {
         auto [rows, columns] = value.split('x');
         int number = 0;
         return parseInt(rows, number) && parseInt(columns, number)
                    ? std::string()
                    : "--block: '" + value.str() + "' is not QxKV, e.g. 64x64";
       })});
  registry.addOption(
      {"--warp-rows", "N",
       "prefill query rows per warp: 16 or 32 (32: two MMA row tiles share "
       "each K/V fragment; head dim <= 128), or 64: warpgroup tiles (wgmma, "
       "--arch=sm_90a); default: the shape pagedc runs (128x32 rows 32 at "
       "head dim 64, 64x64 rows 16 above; with one --arch other than sm_90 "
       "and sm_90a, 128x32 rows 32 at head dim 128 too where ptxas compiles it "
       "without spills, holding the mods' row values or else recomputing them "
       "per KV tile, else 64x64 rows 16 (--ptxas-report notes each step); "
       "with --arch=sm_90a warpgroup tiles: 128x128 at head dims 64 and 128 "
       "where ptxas compiles it without spills, else 128x64; 64x32 at 256; 16 "
       "when --block is given)",
       checked("warp-rows", [](llvm::StringRef value) {
         return value == "16" || value == "32" || value == "64"
                    ? std::string()
                    : "--warp-rows: '" + value.str() + "' is not 16, 32 or 64";
       })});
  registry.addOption({"--gqa", "N",
                      "query heads per KV head (decode kernels; default 1)",
                      checked("gqa", positive("--gqa"))});
  registry.addOption(
      {"--kernel-option", "NAME=VALUE",
       "a kernel option (repeatable; the last of a name wins, over its "
       "$PAGEDC_* variable): " + kernelOptionNames() +
           "; the CUDA stages use prefill_shape (docs/kernels.md, \"Kernel "
           "options\")",
       [](Options &options, llvm::StringRef value) {
         // Checked here, applied over the environment's in withKernelSources.
         KernelOptions scratch;
         try {
           setKernelOption(scratch, std::string_view(value.data(), value.size()));
         } catch (const Error &error) {
           return "--kernel-option: " + std::string(error.what());
         }
         std::string &settings = options.extra["kernel-option"];
         settings += (settings.empty() ? "" : "\n") + value.str();
         return std::string();
       }});
  registry.addOption({"--ptxas-report", "",
                      "print ptxas's register and spill report to stderr",
                      storeExtra("ptxas-report")});
  registry.addOption({"--no-block-mask", "",
                      "build the kernels for launches without a block mask: their "
                      "block-mask paths are left out (a faster compile), and a launch "
                      "with one is refused",
                      storeExtra("no-block-mask")});

  registry.addStage({"cuda", "the CUDA kernel translation unit",
                     /*needsProgram=*/true, runCudaStage});
  registry.addStage(
      {"ptx", "PTX from NVRTC", /*needsProgram=*/true, runPtxStage});
  registry.addStage({"cubin", "a cubin from NVRTC (binary)",
                     /*needsProgram=*/true, runCubinStage});
  EmitStage bundle{"bundle",
                   "a kernel bundle directory (cubins + manifest.json)",
                   /*needsProgram=*/true, runBundleStage};
  bundle.writesOutputPath = true;
  registry.addStage(bundle);
}
