//===- ModJit.cpp - CompiledMods from a lowered flex module ---------------===//

#include "JIT/ModJit.h"

#include "Declarations.h"

#include "Conversion/CPU/FlexToCPU.h"
#include "Conversion/CPU/LowerToLLVM.h"
#include "JIT/JitEngine.h"
#include "JIT/ReferenceEvaluator.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <mutex>

using namespace mlir;
using namespace pagedc;
using namespace pagedc::jit;

namespace {

llvm::Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 message.str());
}

/// The dependence attributes of `mod`; without them, everything is read.
ModDependence describeDependence(flex::ModOp mod) {
  ModDependence dependence;
  if (auto reads = mod->getAttrOfType<ArrayAttr>(
          flex::FlexDialect::kReadsAttrName)) {
    dependence.b = dependence.h = dependence.q = dependence.kv = false;
    for (Attribute read : reads) {
      StringRef name = cast<StringAttr>(read).getValue();
      dependence.b |= name == "b";
      dependence.h |= name == "h";
      dependence.q |= name == "q";
      dependence.kv |= name == "kv";
    }
    dependence.diagonal =
        mod->hasAttr(flex::FlexDialect::kDiagonalAttrName);
  }
  // Which buffers and params: the mod's own reads, in declaration order.
  ModInterface own = collectModInterface(
      mod->getParentOfType<ModuleOp>(), ArrayRef<flex::ModOp>{mod});
  for (flex::BufferOp buffer : own.buffers)
    dependence.buffers.push_back(buffer.getSymName().str());
  for (flex::ParamOp param : own.params)
    dependence.params.push_back(param.getSymName().str());
  return dependence;
}

/// Looks up a mod and checks its kind.
llvm::Expected<flex::ModOp> findMod(ModuleOp module, StringRef name,
                                    flex::ModKind kind) {
  const char *kindName = kind == flex::ModKind::Mask ? "mask" : "score";
  auto mod = dyn_cast_or_null<flex::ModOp>(
      SymbolTable::lookupSymbolIn(module, name));
  if (!mod) {
    std::string known;
    for (flex::ModOp candidate : module.getOps<flex::ModOp>())
      if (candidate.getKind() == kind)
        known += (known.empty() ? "" : ", ") + candidate.getSymName().str();
    return makeError(llvm::Twine("no ") + kindName + " mod named '" + name +
                     "'" +
                     (known.empty() ? llvm::Twine(" (the program has none)")
                                    : " (" + known + ")"));
  }
  if (mod.getKind() != kind)
    return makeError("'" + name + "' is a " +
                     (mod.isMask() ? "mask" : "score") + " mod, not a " +
                     kindName + " mod");
  return mod;
}

/// The float64 reference evaluators and dependence summaries of the
/// selected mods, into `result`.
llvm::Error addReferences(CompiledMods &result, flex::ModOp maskMod,
                          flex::ModOp scoreMod, const ModInterface &interface) {
  if (maskMod) {
    auto reference = ReferenceMod::compile(maskMod, interface.buffers,
                                           interface.params);
    if (!reference)
      return reference.takeError();
    result.maskReference = [reference = *reference](
                               const PagedcModContext &context, int32_t b,
                               int32_t h, int32_t q, int32_t kv) {
      return reference->evaluateMask(context, b, h, q, kv);
    };
    result.maskDependence = describeDependence(maskMod);
  }
  if (scoreMod) {
    auto reference = ReferenceMod::compile(scoreMod, interface.buffers,
                                           interface.params);
    if (!reference)
      return reference.takeError();
    result.scoreReference = [reference = *reference](
                                const PagedcModContext &context, double s,
                                int32_t b, int32_t h, int32_t q, int32_t kv) {
      return reference->evaluateScore(context, s, b, h, q, kv);
    };
    result.scoreDependence = describeDependence(scoreMod);
  }
  return llvm::Error::success();
}

/// Compiles without the cache.
llvm::Expected<CompiledMods> compileUncached(ModuleOp module, StringRef mask,
                                             StringRef score,
                                             const JitOptions &options) {
  SmallVector<flex::ModOp> selected;
  CompiledMods result;
  flex::ModOp maskMod, scoreMod;
  if (!mask.empty()) {
    auto found = findMod(module, mask, flex::ModKind::Mask);
    if (!found)
      return found.takeError();
    maskMod = *found;
    selected.push_back(maskMod);
    result.maskName = mask.str();
  }
  if (!score.empty()) {
    auto found = findMod(module, score, flex::ModKind::Score);
    if (!found)
      return found.takeError();
    scoreMod = *found;
    selected.push_back(scoreMod);
    result.scoreName = score.str();
  }

  ModInterface interface = collectModInterface(module, selected);
  for (flex::BufferOp buffer : interface.buffers) {
    auto decl = describeBuffer(buffer);
    if (!decl)
      return decl.takeError();
    result.buffers.push_back(std::move(*decl));
  }
  for (flex::ParamOp param : interface.params) {
    auto decl = describeParam(param);
    if (!decl)
      return decl.takeError();
    result.params.push_back(std::move(*decl));
  }
  if (selected.empty())
    return result;

  // The float64 reference evaluators first: they are cheap and report
  // unsupported operations with a clear message.
  if (llvm::Error error = addReferences(result, maskMod, scoreMod, interface))
    return error;

  // Row functions: flex -> func/scf/arith/math/llvm -> LLVM dialect -> JIT.
  MLIRContext *context = module.getContext();
  DialectRegistry registry;
  registerCpuLoweringDialects(registry);
  context->appendDialectRegistry(registry);
  context->loadAllAvailableDialects();

  std::string diagnostics;
  llvm::raw_string_ostream diagnosticStream(diagnostics);
  ScopedDiagnosticHandler handler(context, [&](Diagnostic &diagnostic) {
    diagnosticStream << diagnostic.getLocation() << ": " << diagnostic << "\n";
    return success();
  });
  OwningOpRef<ModuleOp> cpuModule = ModuleOp::create(module.getLoc());
  FlexToCpuOptions conversion;
  conversion.blockClass = options.blockClassifier && maskMod;
  bool withClassifier = conversion.blockClass && isIntervalClassifiable(maskMod);
  for (flex::ModOp mod : selected)
    conversion.mods.push_back(mod.getSymName().str());
  if (failed(convertFlexModsToCpu(module, conversion, *cpuModule)) ||
      failed(lowerToLLVMDialect(*cpuModule)))
    return makeError("CPU lowering failed:\n" + diagnostics);

  unsigned optLevel = options.optLevel;
  if (options.largeModuleOps != 0) {
    size_t operations = 0;
    cpuModule->walk([&](Operation *) { ++operations; });
    if (operations > options.largeModuleOps)
      optLevel = 0;
  }
  auto engine = JitEngine::create(*cpuModule, optLevel);
  if (!engine)
    return engine.takeError();
  std::shared_ptr<JitEngine> owner(std::move(*engine));
  auto lookup = [&](const std::string &symbol) -> llvm::Expected<void *> {
    return owner->lookup(symbol);
  };
  if (maskMod) {
    auto row = lookup(cpuMaskRowSymbol(mask));
    if (!row)
      return row.takeError();
    result.maskRow = reinterpret_cast<PagedcMaskRowFn>(*row);
    if (withClassifier) {
      auto classify = lookup(cpuMaskBlockClassSymbol(mask));
      if (!classify)
        return classify.takeError();
      result.maskBlockClass = reinterpret_cast<PagedcBlockClassFn>(*classify);
    }
  }
  if (scoreMod) {
    auto row = lookup(cpuScoreRowSymbol(score));
    if (!row)
      return row.takeError();
    result.scoreRow = reinterpret_cast<PagedcScoreRowFn>(*row);
  }
  result.owner = std::move(owner);
  return result;
}

/// The in-process cache: module text and selection -> compiled mods.
struct JitCache {
  std::mutex mutex;
  std::map<std::string, CompiledMods> entries;
  JitCacheStatistics statistics;
};

/// Never destroyed: JIT'd code may run until exit, and tearing an
/// ExecutionEngine down after llvm_shutdown() (InitLLVM's destructor) would
/// use LLVM after it is gone.
JitCache &jitCache() {
  static JitCache *cache = new JitCache();
  return *cache;
}

} // namespace

llvm::Expected<CompiledMods> pagedc::jit::compileMods(ModuleOp module,
                                                      llvm::StringRef mask,
                                                      llvm::StringRef score,
                                                      const JitOptions &options) {
  if (!options.useCache)
    return compileUncached(module, mask, score, options);

  std::string key;
  {
    llvm::raw_string_ostream os(key);
    os << mask << '\0' << score << '\0' << options.optLevel << '\0'
       << options.blockClassifier << '\0' << options.largeModuleOps << '\0';
    module->print(os, OpPrintingFlags().printGenericOpForm().enableDebugInfo(
                          false));
  }
  JitCache &cache = jitCache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    auto found = cache.entries.find(key);
    if (found != cache.entries.end()) {
      ++cache.statistics.hits;
      return found->second;
    }
    ++cache.statistics.misses;
  }
  auto compiled = compileUncached(module, mask, score, options);
  if (!compiled)
    return compiled.takeError();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.entries.emplace(std::move(key), *compiled);
  return compiled;
}

JitCacheStatistics pagedc::jit::jitCacheStatistics() {
  std::lock_guard<std::mutex> lock(jitCache().mutex);
  return jitCache().statistics;
}

void pagedc::jit::clearJitCache() {
  std::lock_guard<std::mutex> lock(jitCache().mutex);
  jitCache().entries.clear();
}
