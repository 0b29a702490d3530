//===- Prepare.cpp - pagedc-gpu-prepare: the pack for a GPU machine -------===//
//
//   pagedc-gpu-prepare -o PACK [--examples DIR] [--bench-attn FILE]
//                      [--arch sm_90] [--quick] [--cli-bundle DIR]...
//                      [--ptxas-arch sm_90,sm_80] [--bench-head-dim 128]
//
// Runs where the compiler is. For every mod selection of the corpus (each
// mod of examples/*.attn alone, plus the first mask with the first score of
// a file) it compiles the CPU mods (declarations, float64 reference, mask
// for FLOP counting) and the CUDA mod code, plans correctness cases that
// cover {prefill, decode} x {f16, bf16} x page {1, 16, 128} x GQA {1, 4, 8}
// x lse (all combinations for mods.attn's sliding+capped; a covering design
// for the rest), compiles their kernels into one bundle per selection
// (NVRTC through the kernel cache, in parallel), computes the references and
// writes the pack (see Pack.h). The benchmark plan of performance.md
// section 4 and its kernels come from --bench-attn (at head dim 128, or
// --bench-head-dim's, to model other head dims). --cli-bundle adds cases
// for a bundle written by `pagedc --emit=bundle` (its manifest says which).
//
//===----------------------------------------------------------------------===//

#include "Pack.h"

#include "Conversion/CUDA/FlexToEmitC.h"
#include "Frontend/Frontend.h"
#include "Frontend/MLIRGen.h"
#include "JIT/CompileSource.h"
#include "Pipeline.h"
#include "Target/CudaSource.h"

#include "cpu/Reference.h"
#include "pagedc/Error.h"
#include "pagedc/KernelBundle.h"
#include "pagedc/KernelCache.h"
#include "pagedc/KernelOptions.h"
#include "pagedc/Npy.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

using namespace pagedc;
using namespace pagedc::gpu;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string out;
  std::string examples = PAGEDC_EXAMPLES_DIR;
  std::string benchAttn = PAGEDC_BENCH_ATTN;
  std::string arch = "sm_90";
  bool quick = false;
  std::vector<std::string> cliBundles;
  /// Real architectures whose ptxas report of every benchmark kernel goes
  /// into the pack (for `pagedc-gpu model`), comma-separated on the line.
  std::vector<std::string> ptxasArchs;
  /// Head dim of the benchmark plan (performance.md's is 128; 64 or 256
  /// model the kernels at other head dims).
  int benchHeadDim = 128;
  /// The kernel options the pack's kernels are chosen with (prefill_shape):
  /// the $PAGEDC_* variables, mapped at this tool's edge.
  KernelOptions kernel;
};

/// A mod selection of one .attn file.
struct Selection {
  std::string file, mask, score;
  std::string label() const {
    // The label `pagedc --emit=bundle` writes: <file stem>:<mask>:<score>,
    // "-" for an absent mod.
    return fmt::format("{}:{}:{}", fs::path(file).stem().string(), mask.empty() ? "-" : mask,
                       score.empty() ? "-" : score);
  }
  std::string dirName() const {
    std::string name = label();
    for (char &c : name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-')
        c = '.';
    return name;
  }
};

std::string readText(const std::string &path) {
  std::ifstream in(path);
  if (!in)
    throw Error(fmt::format("cannot read {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Every mod alone, plus the first mask with the first score of a file.
std::vector<Selection> corpusSelections(const std::string &directory) {
  std::vector<std::string> files;
  for (const auto &entry : fs::directory_iterator(directory))
    if (entry.path().extension() == ".attn")
      files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  std::regex modLine(R"(^(mask|score)\s+([A-Za-z_][A-Za-z0-9_]*)\s*\()");
  std::vector<Selection> selections;
  for (const std::string &file : files) {
    std::istringstream lines(readText(file));
    std::string line, firstMask, firstScore;
    std::smatch match;
    while (std::getline(lines, line)) {
      if (!std::regex_search(line, match, modLine))
        continue;
      const bool isMask = match[1] == "mask";
      const std::string name = match[2];
      selections.push_back({file, isMask ? name : "", isMask ? "" : name});
      std::string &first = isMask ? firstMask : firstScore;
      if (first.empty())
        first = name;
    }
    if (!firstMask.empty() && !firstScore.empty())
      selections.push_back({file, firstMask, firstScore});
  }
  return selections;
}

/// The generated CUDA hook code of a selection (front end, MLIRGen, the
/// pipeline keeping the selected mods, -convert-flex-to-emitc).
std::string cudaModCode(const Selection &selection) {
  // No mods selected: the pipeline would keep every mod (and declaration)
  // of the file, so generate from an empty program instead; its Params is
  // empty like the CPU side's.
  const bool none = selection.mask.empty() && selection.score.empty();
  const std::string source = none ? std::string() : readText(selection.file);
  std::string diagnosticsText;
  llvm::raw_string_ostream diagnostics(diagnosticsText);
  std::unique_ptr<ast::Program> program;
  {
    DiagnosticEngine diags(selection.file, source, diagnostics);
    FrontendOptions frontend;
    program = parseAndAnalyze(diags, frontend);
  }
  if (!program)
    throw Error(fmt::format("{}: front-end errors:\n{}", selection.file, diagnosticsText));
  mlir::DialectRegistry registry;
  registerFlexDialects(registry);
  registerCudaLoweringDialects(registry);
  mlir::MLIRContext context(registry, mlir::MLIRContext::Threading::DISABLED);
  std::string mlirErrors;
  llvm::raw_string_ostream mlirErrorStream(mlirErrors);
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    mlirErrorStream << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> module = mlirGen(context, *program);
  if (!module)
    throw Error(fmt::format("{}: MLIR generation failed:\n{}", selection.file, mlirErrors));
  PipelineOptions pipeline;
  for (const std::string &name : {selection.mask, selection.score})
    if (!name.empty())
      pipeline.keepMods.push_back(name);
  mlir::PassManager pm(&context);
  buildPipeline(pm, pipeline);
  if (mlir::failed(pm.run(*module)))
    throw Error(fmt::format("{}: the pipeline failed:\n{}", selection.file, mlirErrors));
  llvm::Expected<std::string> code = generateModCode(*module, selection.mask, selection.score);
  if (!code)
    throw Error(fmt::format("{}: CUDA mod code: {}", selection.file,
                            llvm::toString(code.takeError())));
  return *code;
}

CompiledMods cpuMods(const Selection &selection) {
  std::string diagnosticsText;
  llvm::raw_string_ostream diagnostics(diagnosticsText);
  auto mods = jit::compileModsFromFile(selection.file, selection.mask, selection.score, {},
                                       diagnostics);
  if (!mods)
    throw Error(fmt::format("{}: {}\n{}", selection.label(), llvm::toString(mods.takeError()),
                            diagnosticsText));
  return std::move(*mods);
}

//===----------------------------------------------------------------------===//
// Bindings with sensible values
//===----------------------------------------------------------------------===//

/// Buffers of a case: values, views and files.
struct BoundBuffers {
  std::vector<HostTensor> tensors;
  std::vector<PagedcBufferRef> refs;
  std::vector<PagedcParamSlot> slots;
  PagedcModContext context() const { return {refs.data(), slots.data()}; }
};

/// Random buffers for the declarations: float buffers uniform in [-1.5,
/// 1.5]; integer buffers by name (document ids sorted with documents of
/// minDoc..maxDoc tokens, their offsets, kv lengths with one 0 to exercise
/// fully masked rows). Params: softcap 2.5 (bends the scores), else the
/// default. Throws for a buffer without a recipe.
BoundBuffers makeBindings(const CompiledMods &mods, int64_t batch, int64_t heads,
                          int64_t positions, PackRandom &random, int minDoc, int maxDoc,
                          std::vector<CaseParam> &params, std::vector<CaseBuffer> &buffers) {
  BoundBuffers bound;
  bound.tensors.reserve(mods.buffers.size());
  std::vector<int32_t> documentStarts;
  for (const BufferDecl &decl : mods.buffers) {
    std::vector<int64_t> shape;
    for (const BufferDim &dim : decl.dims)
      shape.push_back(dim.kind == BufferDim::Fixed   ? dim.size
                      : dim.kind == BufferDim::Named ? (dim.name == "B"   ? batch
                                                        : dim.name == "H" ? heads
                                                                          : positions)
                                                     : -1);
    HostTensor tensor;
    if (decl.name == "document_id" || decl.name == "doc") {
      tensor = HostTensor(DType::I32, shape);
      const int64_t rows = shape.size() == 2 ? shape[0] : 1, length = shape.back();
      for (int64_t r = 0; r < rows; ++r) {
        int32_t id = 0, left = 0;
        for (int64_t s = 0; s < length; ++s) {
          if (left == 0) {
            if (s > 0)
              ++id;
            left = static_cast<int32_t>(random.integer(minDoc, maxDoc));
            if (r == 0)
              documentStarts.push_back(static_cast<int32_t>(s));
          }
          --left;
          tensor.dataAs<int32_t>()[r * length + s] = id;
        }
      }
    } else if (decl.name == "offsets") {
      if (documentStarts.empty())
        throw Error("buffer 'offsets' needs document_id declared before it");
      tensor = HostTensor(DType::I32, {static_cast<int64_t>(documentStarts.size())});
      std::copy(documentStarts.begin(), documentStarts.end(), tensor.dataAs<int32_t>());
    } else if (decl.name == "kv_len") {
      tensor = HostTensor(DType::I32, shape);
      for (int64_t b = 0; b < shape[0]; ++b)
        tensor.dataAs<int32_t>()[b] =
            b == 1 ? 0 : static_cast<int32_t>(random.integer(1, positions));
    } else if (decl.elementType == DType::F32 || decl.elementType == DType::F16 ||
               decl.elementType == DType::BF16) {
      for (int64_t &size : shape)
        if (size < 0)
          size = 4096; // `?`: larger than any index the shapes make
      tensor = HostTensor(decl.elementType, shape);
      for (int64_t i = 0; i < tensor.numel(); ++i) {
        const float value = random.uniform(-1.5f, 1.5f);
        if (decl.elementType == DType::F32)
          tensor.dataAs<float>()[i] = value;
        else
          tensor.dataAs<uint16_t>()[i] = toBits16(value, decl.elementType);
      }
    } else {
      throw Error(fmt::format("no binding recipe for buffer '{}' of type {}: add one to "
                              "tools/pagedc-gpu/Prepare.cpp",
                              decl.name, dtypeName(decl.elementType)));
    }
    PagedcBufferRef ref{};
    ref.data = tensor.data();
    int64_t stride = 1;
    for (int d = static_cast<int>(tensor.shape().size()) - 1; d >= 0; --d) {
      ref.sizes[d] = tensor.shape()[d];
      ref.strides[d] = stride;
      stride *= tensor.shape()[d];
    }
    bound.refs.push_back(ref);
    bound.tensors.push_back(std::move(tensor));
    buffers.push_back({decl, "buf_" + decl.name + ".npy"});
  }
  for (const ParamDecl &decl : mods.params) {
    PagedcParamSlot slot{};
    ParamValue value;
    if (decl.name == "softcap") {
      value = ParamValue::ofF32(2.5f);
    } else if (decl.defaultValue) {
      value = *decl.defaultValue;
    } else {
      throw Error(fmt::format("no value for param '{}' without a default", decl.name));
    }
    value.kind = decl.type;
    if (decl.type == ScalarKind::F32)
      slot.f32 = value.f32;
    else if (decl.type == ScalarKind::I32)
      slot.i32 = value.i32;
    else
      slot.i32 = value.boolean ? 1 : 0;
    bound.slots.push_back(slot);
    params.push_back({decl, value});
  }
  return bound;
}

//===----------------------------------------------------------------------===//
// Cases
//===----------------------------------------------------------------------===//

/// What a case asks for before shapes are drawn.
struct CaseSpec {
  KernelKind kind;
  DType dtype;
  int pageSize, groupSize, headDim, queryTokens;
  bool lse;
  int32_t block; // block-mask block size (0: none)
  bool endAligned;
};

/// Draws the shapes of a case, its reserve order and slot order.
PackCase drawCase(const Selection &selection, const CaseSpec &spec, uint64_t seed) {
  PackRandom random(seed ^ 0x5bd1e995u);
  PackCase c;
  c.source = fs::path(selection.file).filename().string();
  c.mask = selection.mask;
  c.score = selection.score;
  c.label = selection.label();
  c.kind = spec.kind;
  c.dtype = spec.dtype;
  c.headDim = spec.headDim;
  c.headsKv = spec.groupSize == 1 ? 2 : 1;
  c.headsQ = c.headsKv * spec.groupSize;
  c.pageSize = spec.pageSize;
  c.returnLse = spec.lse;
  c.qBlock = c.kvBlock = spec.block;
  c.seed = seed;
  if (spec.kind == KernelKind::Prefill) {
    c.batch = 2;
    c.queryLength = static_cast<int>(random.integer(65, 105));
    c.maxKvLength = c.queryLength + static_cast<int>(random.integer(19, 150));
  } else {
    c.batch = 3;
    c.queryLength = spec.queryTokens;
    c.maxKvLength = static_cast<int>(random.integer(300, 700));
  }
  for (int b = 0; b < c.batch; ++b) {
    int length = b == 0 ? c.maxKvLength
                        : c.maxKvLength - static_cast<int>(random.integer(1, 97));
    length = std::max(length, c.queryLength + 1);
    if (length % c.pageSize == 0 && c.pageSize > 1)
      --length; // never a whole number of pages
    if (spec.block && length % spec.block == 0)
      --length;
    c.kvLength.push_back(length);
    c.qOffset.push_back(spec.endAligned || spec.kind == KernelKind::Decode
                            ? length - c.queryLength
                            : 0);
  }
  // Slots in a shuffled order, with a spare slot the cache never uses.
  c.maxBatch = c.batch + 1;
  std::vector<int32_t> slots(static_cast<size_t>(c.maxBatch));
  for (int s = 0; s < c.maxBatch; ++s)
    slots[s] = s;
  for (int s = c.maxBatch - 1; s > 0; --s)
    std::swap(slots[s], slots[random.integer(0, s)]);
  c.batchIdx.assign(slots.begin(), slots.begin() + c.batch);
  // Reserve in small interleaved steps so that every table is shuffled
  // across the pool, with spare pages.
  int pagesNeeded = 0;
  std::vector<int32_t> reserved(static_cast<size_t>(c.maxBatch), 0);
  bool growing = true;
  while (growing) {
    growing = false;
    for (int b = 0; b < c.batch; ++b) {
      const int32_t slot = c.batchIdx[b];
      if (reserved[slot] >= c.kvLength[b])
        continue;
      const int step = c.pageSize * static_cast<int>(random.integer(1, 3));
      reserved[slot] = std::min(c.kvLength[b], reserved[slot] + step);
      c.reserves.push_back({slot, reserved[slot]});
      growing = true;
    }
  }
  for (int b = 0; b < c.batch; ++b)
    pagesNeeded += (c.kvLength[b] + c.pageSize - 1) / c.pageSize;
  c.numPages = pagesNeeded + 5;
  c.scale = 1.0f / std::sqrt(static_cast<float>(c.headDim));
  c.name = fmt::format("{}--{}-{}-d{}-p{}-g{}{}{}{}", selection.dirName(), kindName(spec.kind),
                       dtypeName(spec.dtype), spec.headDim, spec.pageSize, spec.groupSize,
                       spec.kind == KernelKind::Decode ? fmt::format("-t{}", spec.queryTokens)
                                                       : std::string(),
                       spec.lse ? "-lse" : "", spec.block ? fmt::format("-b{}", spec.block) : "");
  return c;
}

KernelConfig attentionConfig(const PackCase &c, int64_t paramsSize, int queryTokens,
                             const std::string &arch, const KernelOptions &kernel) {
  KernelConfig config;
  config.kind = c.kind;
  config.elementType = c.dtype;
  config.headDim = c.headDim;
  config.pageSize = c.pageSize;
  config.groupSize = c.headsQ / c.headsKv;
  config.queryTokens = c.kind == KernelKind::Decode ? queryTokens : 1;
  config.returnLse = c.returnLse;
  config.paramsSize = paramsSize;
  if (config.kind == KernelKind::Prefill) {
    config.choosePrefillShapeFor(arch, kernel);
    config.fitPrefillTileToBlocks(c.qBlock ? c.kvBlock : 0);
  }
  return config;
}

KernelConfig builderConfig(int64_t paramsSize) {
  KernelConfig config;
  config.kind = KernelKind::BlockMaskBuilder;
  config.paramsSize = paramsSize;
  return config;
}

void writeBuffers(const fs::path &directory, const BoundBuffers &bound,
                  const std::vector<CaseBuffer> &buffers) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    HostTensor &tensor = const_cast<HostTensor &>(bound.tensors[i]);
    writeNpy((directory / buffers[i].file).string(), tensor.view());
  }
}

/// Computes the reference of `c` and writes its files.
void writeCase(const fs::path &packDir, PackCase &c, const CompiledMods &mods) {
  CaseInputs inputs = generateInputs(c);
  c.inputChecksum = inputs.checksum;
  PackRandom random(c.seed * 31 + 7);
  int64_t positions = c.maxKvLength;
  for (int b = 0; b < c.batch; ++b)
    positions = std::max<int64_t>(positions, c.qOffset[b] + c.queryLength);
  c.params.clear();
  c.buffers.clear();
  BoundBuffers bound = makeBindings(mods, c.batch, c.headsQ, positions, random, 1, 40, c.params,
                                    c.buffers);
  const fs::path caseDir = packDir / "cases" / c.name;
  fs::create_directories(caseDir);
  writeBuffers(caseDir, bound, c.buffers);

  cpu::ReferenceArgs args;
  args.q = inputs.q.view();
  args.k = inputs.k.view();
  args.v = inputs.v.view();
  args.kvLength = c.kvLength.data();
  args.qOffset = c.qOffset.data();
  args.mods = &mods;
  const PagedcModContext context = bound.context();
  args.context = &context;
  args.scale = c.scale;
  cpu::ReferenceResult result = cpu::referenceAttention(args);
  HostTensor out(DType::F32, {c.batch, c.headsQ, c.queryLength, c.headDim});
  HostTensor lse(DType::F32, {c.batch, c.headsQ, c.queryLength});
  for (size_t i = 0; i < result.out.size(); ++i)
    out.dataAs<float>()[i] = static_cast<float>(result.out[i]);
  for (size_t i = 0; i < result.lse.size(); ++i)
    lse.dataAs<float>()[i] = static_cast<float>(result.lse[i]);
  writeNpy((caseDir / "ref_out.npy").string(), out.view());
  writeNpy((caseDir / "ref_lse.npy").string(), lse.view());
}

/// The fraction of (q, kv) pairs with q < qLength, kv < kvLength that the
/// mask keeps (batch 0, head 0; the bench masks read neither b nor h).
double keptFraction(const CompiledMods &mods, const PagedcModContext &context, int qLength,
                    int kvLength, int qOffset) {
  if (!mods.hasMask())
    return 1.0;
  std::vector<uint8_t> row(static_cast<size_t>(kvLength));
  double kept = 0;
  for (int i = 0; i < qLength; ++i) {
    mods.maskRow(&context, 0, 0, qOffset + i, 0, kvLength, row.data());
    for (uint8_t value : row)
      kept += value;
  }
  return kept / (static_cast<double>(qLength) * kvLength);
}

int run(const Options &options) {
  const auto started = std::chrono::steady_clock::now();
  const fs::path packDir(options.out);
  fs::create_directories(packDir / "bundles");
  fs::create_directories(packDir / "cases");
  Pack pack;
  pack.directory = options.out;
  pack.arch = options.arch;
  pack.created = utcNow();

  CompileOptions compile;
  compile.arch = options.arch;
  std::vector<KernelCache::Request> requests;
  std::vector<std::string> requestLabels;
  std::map<std::string, std::string> bundleDirOfLabel;
  std::set<std::string> requested;
  // Returns the config requested: the prefill tile the runtime would compile
  // for this target (the tiles kept only without spills: settlePrefillShape).
  // PAGEDC_LINK_MODS=1: the attention kernels link their mods (the
  // block-mask builder inlines its mask), with the Params' room.
  const bool linkMods = options.kernel.linkMods == ModLinking::Linked;
  auto request = [&](const std::string &label, KernelConfig chosen, const std::string &modCode) {
    if (linkMods && chosen.kind != KernelKind::BlockMaskBuilder) {
      chosen.linkedMods = true;
      chosen.paramsSize = linkedParamsCapacity(chosen.paramsSize);
    }
    const KernelConfig config = settlePrefillShape(chosen, modCode, compile.arch);
    const std::string key = label + "|" + config.describe();
    if (requested.insert(key).second) {
      requests.push_back({config, modCode, cudaCompileOptions(config, compile.arch)});
      requestLabels.push_back(label);
    }
    return config;
  };

  // 1. Correctness cases over the corpus.
  std::vector<Selection> selections = corpusSelections(options.examples);
  if (options.quick) {
    std::vector<Selection> subset;
    for (const Selection &s : selections)
      if (s.label() == "causal:causal:-" || s.label() == "mods:causal:alibi" ||
          s.label() == "document_mask:document_causal:-")
        subset.push_back(s);
    selections = subset;
  }
  const int pages[3] = {1, 16, 128}, groups[3] = {1, 4, 8};
  std::map<std::string, std::pair<Selection, CompiledMods>> modsOfLabel;
  int index = 0;
  for (const Selection &selection : selections) {
    CompiledMods mods = cpuMods(selection);
    const std::string modCode = cudaModCode(selection);
    const std::string label = selection.label();
    bundleDirOfLabel[label] = "bundles/" + selection.dirName();
    const int64_t paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
    std::vector<CaseSpec> specs;
    const bool full = !options.quick && label == "mods:sliding:capped";
    const int32_t block = mods.hasMask() ? (index % 2 ? 128 : 64) : 0;
    if (full) {
      for (DType dtype : {DType::BF16, DType::F16})
        for (int page : pages)
          for (bool lse : {false, true}) {
            specs.push_back({KernelKind::Prefill, dtype, page, groups[(page + lse) % 3], 128, 1,
                             lse, 64, lse});
            for (int group : groups)
              specs.push_back({KernelKind::Decode, dtype, page, group, 128, 1, lse, 64, false});
          }
    } else {
      const DType dtype = index % 2 ? DType::F16 : DType::BF16;
      const int page = pages[index % 3], group = groups[(index / 3) % 3];
      const bool lse = (index / 2) % 2 == 0;
      // Head dims 64 and 128, and 256 for five selections (not in the
      // quick pack's first three): the sm_90 default there is its own
      // kernel (two consumer warpgroups on 128 x 64 tiles). Every fifth
      // selection from the sixth on takes one of the other head dims the
      // kernels take (tile rows wider than their data; the mma.sync prefill
      // on sm_90).
      static const int kOtherHeadDims[] = {80, 192, 96, 32, 112, 160, 48};
      const int headDim = index > 0 && index % 5 == 0
                              ? kOtherHeadDims[(index / 5 - 1) % 7]
                          : index % 4 == 3                    ? 64
                          : index % 5 == 1 && index > 1       ? 256
                                                              : 128;
      specs.push_back({KernelKind::Prefill, dtype, page, group, headDim, 1, lse, block,
                       index % 2 == 1});
      specs.push_back({KernelKind::Decode, dtype, page, group, headDim,
                       index % 5 == 4 ? 3 : 1, lse, block, false});
    }
    for (const CaseSpec &spec : specs) {
      PackCase c = drawCase(selection, spec, 1000003ull * (index + 1) + specs.size() +
                                                 pack.cases.size());
      c.bundle = bundleDirOfLabel[label];
      c.maskReadsB = mods.maskDependence.b;
      c.maskReadsH = mods.maskDependence.h;
      const int queryTokens = spec.queryTokens == 1 ? 1 : 4;
      request(label, attentionConfig(c, paramsSize, queryTokens, options.arch, options.kernel),
              modCode);
      if (c.qBlock)
        request(label, builderConfig(paramsSize), modCode);
      pack.cases.push_back(std::move(c));
    }
    modsOfLabel.emplace(label, std::make_pair(selection, std::move(mods)));
    ++index;
  }

  // 2. Cases for bundles written by `pagedc --emit=bundle`.
  for (const std::string &cliDir : options.cliBundles) {
    KernelBundle bundle = KernelBundle::parseManifest(readText(cliDir + "/manifest.json"));
    if (bundle.modules.empty())
      throw Error(fmt::format("{}: the bundle has no modules", cliDir));
    const std::string label = bundle.modules.front().mods;
    // The CLI's label is <file stem>:<mask>:<score>.
    const size_t first = label.find(':'), second = label.find(':', first + 1);
    auto mod = [](std::string name) { return name == "-" ? std::string() : name; };
    Selection selection{options.examples + "/" + label.substr(0, first) + ".attn",
                        mod(label.substr(first + 1, second - first - 1)),
                        mod(label.substr(second + 1))};
    if (!modsOfLabel.count(label))
      modsOfLabel.emplace(label, std::make_pair(selection, cpuMods(selection)));
    const fs::path relative = fs::relative(fs::absolute(cliDir), fs::absolute(packDir));
    for (const BundleModule &module : bundle.modules) {
      const KernelConfig &config = module.config;
      if (config.kind == KernelKind::BlockMaskBuilder)
        continue;
      CaseSpec spec{config.kind, config.elementType, config.pageSize, config.groupSize,
                    config.headDim, 1, config.returnLse, 0, false};
      PackCase c = drawCase(selection, spec, 7777ull + pack.cases.size());
      c.name = "cli-" + c.name;
      c.bundle = relative.string();
      const CompiledMods &mods = modsOfLabel.at(label).second;
      c.maskReadsB = mods.maskDependence.b;
      c.maskReadsH = mods.maskDependence.h;
      pack.cases.push_back(std::move(c));
    }
  }

  // 3. The benchmark plan (performance.md section 4).
  const std::string benchStem = fs::path(options.benchAttn).stem().string();
  struct BenchMods {
    std::string mask, score;
    /// The configuration's name for the mask where it is not the mask's own
    /// ("none" for no mask, a document length range).
    std::string name = {};
    /// Document lengths drawn for document_id (tokens, inclusive).
    int minDoc = 512, maxDoc = 3072;
    /// Query lengths of the configuration; empty: the plan's prefill lengths.
    std::vector<int> lengths = {};
  };
  const std::vector<BenchMods> decodeMods = {{"", ""}, {"causal", "alibi"},
                                             {"sliding_4k", "softcap_tanh"}};
  std::vector<BenchMods> prefillMods = {{"causal", ""}, {"sliding_1k", ""}, {"document", ""}};
  std::vector<int> decodeBatches = {1, 16, 64}, contexts = {1024, 8192, 32768},
                   prefillLengths = {1024, 4096, 16384}, benchPages = {16, 128};
  if (options.quick) {
    decodeBatches = {16};
    contexts = {8192};
    prefillLengths = {1024};
    benchPages = {16};
  } else {
    // Issue 48's lines beyond section 4's: prefill with no mask, and packed
    // documents of 1k-4k tokens at S 16k (section 4's documents are 512-3072).
    prefillMods.push_back({"", "", "none"});
    prefillMods.push_back({"document", "", "document_1k4k", 1024, 4096, {16384}});
  }
  fs::create_directories(packDir / "bench");
  // The kernel configurations of each benchmark configuration (for ptxas).
  std::vector<std::vector<KernelConfig>> benchConfigs;
  std::map<std::string, CompiledMods> benchCpu;
  std::map<std::string, std::string> benchCode;
  auto benchSelection = [&](const BenchMods &m) {
    Selection selection{options.benchAttn, m.mask, m.score};
    const std::string label = selection.label();
    if (!benchCpu.count(label)) {
      benchCpu.emplace(label, cpuMods(selection));
      benchCode.emplace(label, cudaModCode(selection));
      bundleDirOfLabel[label] = "bundles/" + selection.dirName();
    }
    return selection;
  };
  // Shared bench buffers: slopes (ALiBi's 2^(-8(h+1)/H)) and document ids.
  auto benchBindings = [&](const CompiledMods &mods, int heads, int positions,
                           std::vector<CaseBuffer> &buffers, std::vector<CaseParam> &params,
                           int minDoc = 512, int maxDoc = 3072) {
    buffers.clear();
    params.clear();
    PackRandom random(static_cast<uint64_t>(positions) * 131 + heads);
    BoundBuffers bound =
        makeBindings(mods, 1, heads, positions, random, minDoc, maxDoc, params, buffers);
    // Documents of other lengths than section 4's get files of their own.
    const std::string docRange =
        minDoc == 512 && maxDoc == 3072 ? "" : fmt::format("_docs{}-{}", minDoc, maxDoc);
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].decl.name == "slopes")
        for (int h = 0; h < heads; ++h)
          bound.tensors[i].dataAs<float>()[h] = std::exp2(-8.0f * (h + 1) / heads);
      const bool documents =
          buffers[i].decl.name == "document_id" || buffers[i].decl.name == "offsets";
      buffers[i].file = fmt::format("bench/{}_{}{}.npy", buffers[i].decl.name,
                                    buffers[i].decl.name == "slopes" ? heads : positions,
                                    documents ? docRange : "");
      writeNpy((packDir / buffers[i].file).string(), bound.tensors[i].view());
    }
    return bound;
  };
  for (int page : benchPages) {
    for (const BenchMods &m : decodeMods)
      for (int batch : decodeBatches)
        for (int context : contexts) {
          Selection selection = benchSelection(m);
          const CompiledMods &mods = benchCpu.at(selection.label());
          BenchCase b;
          b.name = fmt::format("decode-{}-B{}-ctx{}-p{}", m.mask.empty() ? "none"
                                                                           : m.mask + "+" + m.score,
                               batch, context, page);
          b.label = selection.label();
          b.bundle = bundleDirOfLabel[b.label];
          b.mask = m.mask;
          b.score = m.score;
          b.kind = KernelKind::Decode;
          b.batch = batch;
          b.kvLength = context;
          b.pageSize = page;
          b.headDim = options.benchHeadDim;
          if (mods.hasMask())
            b.qBlock = b.kvBlock = 128;
          BoundBuffers bound = benchBindings(mods, b.headsQ, context, b.buffers, b.params);
          const PagedcModContext ctx = bound.context();
          b.keptFraction = keptFraction(mods, ctx, 1, context, context - 1);
          const int64_t paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
          KernelConfig config;
          config.kind = KernelKind::Decode;
          config.elementType = DType::BF16;
          config.headDim = b.headDim;
          config.pageSize = page;
          config.groupSize = b.headsQ / b.headsKv;
          config.paramsSize = paramsSize;
          benchConfigs.push_back({request(b.label, config, benchCode.at(b.label))});
          if (b.qBlock) {
            request(b.label, builderConfig(paramsSize), benchCode.at(b.label));
            benchConfigs.back().push_back(builderConfig(paramsSize));
          }
          pack.bench.push_back(std::move(b));
        }
    for (const BenchMods &m : prefillMods)
      for (int length : m.lengths.empty() ? prefillLengths : m.lengths) {
        Selection selection = benchSelection(m);
        const CompiledMods &mods = benchCpu.at(selection.label());
        BenchCase b;
        b.name =
            fmt::format("prefill-{}-B4-S{}-p{}", m.name.empty() ? m.mask : m.name, length, page);
        b.label = selection.label();
        b.bundle = bundleDirOfLabel[b.label];
        b.mask = m.mask;
        b.score = m.score;
        b.kind = KernelKind::Prefill;
        b.batch = 4;
        b.queryLength = length;
        b.kvLength = length;
        b.pageSize = page;
        b.headDim = options.benchHeadDim;
        if (mods.hasMask())
          b.qBlock = b.kvBlock = 128;
        BoundBuffers bound =
            benchBindings(mods, b.headsQ, length, b.buffers, b.params, m.minDoc, m.maxDoc);
        const PagedcModContext ctx = bound.context();
        b.keptFraction = keptFraction(mods, ctx, length, length, 0);
        const int64_t paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
        KernelConfig config;
        config.kind = KernelKind::Prefill;
        config.elementType = DType::BF16;
        config.headDim = b.headDim;
        config.pageSize = page;
        config.groupSize = b.headsQ / b.headsKv;
        config.paramsSize = paramsSize;
        config.choosePrefillShapeFor(options.arch, options.kernel);
        config.fitPrefillTileToBlocks(b.kvBlock);
        const KernelConfig settled = request(b.label, config, benchCode.at(b.label));
        benchConfigs.push_back({settled});
        if (b.qBlock) {
          request(b.label, builderConfig(paramsSize), benchCode.at(b.label));
          benchConfigs.back().push_back(builderConfig(paramsSize));
        }
        pack.bench.push_back(std::move(b));
      }
  }

  // 4. Compile every kernel (in parallel, through the disk cache) and write
  // one bundle per selection.
  std::cerr << fmt::format("pagedc-gpu-prepare: compiling {} kernels for {}\n", requests.size(),
                           options.arch);
  KernelCache cache(KernelCache::defaultDirectory());
  std::vector<std::shared_ptr<const CompiledKernel>> kernels = cache.getOrCompileAll(requests);
  std::map<std::string, KernelBundle> bundles;
  for (size_t i = 0; i < kernels.size(); ++i)
    bundles[requestLabels[i]].add(*kernels[i], requestLabels[i]);
  for (auto &[label, bundle] : bundles) {
    const fs::path dir = packDir / bundleDirOfLabel.at(label);
    fs::remove_all(dir);
    bundle.write(dir.string());
  }

  // 4b. ptxas's report of every benchmark kernel for each --ptxas-arch: the
  // same units compiled for a real architecture, in a memory-only cache (a
  // disk hit carries no log).
  for (const std::string &ptxasArch : options.ptxasArchs) {
    CompileOptions verbose;
    verbose.arch = ptxasArch;
    verbose.ptxasVerbose = true;
    std::vector<KernelCache::Request> ptxasRequests;
    std::map<std::string, size_t> indexOfKey;
    // Warpgroup prefill tiles are sm_90a code: their sm_90 figures come
    // from that target, and sm_80 has none.
    auto runsOn = [&](const KernelConfig &config) {
      return !config.needsSm90a() || ptxasArch == "sm_90";
    };
    for (size_t i = 0; i < pack.bench.size(); ++i)
      for (const KernelConfig &config : benchConfigs[i]) {
        if (!runsOn(config))
          continue;
        const std::string key = pack.bench[i].label + "|" + config.describe();
        CompileOptions options = verbose;
        options.arch = config.compileArchFor(ptxasArch);
        if (indexOfKey.emplace(key, ptxasRequests.size()).second)
          ptxasRequests.push_back({config, benchCode.at(pack.bench[i].label), options});
      }
    std::cerr << fmt::format("pagedc-gpu-prepare: ptxas reports of {} benchmark kernels for {}\n",
                             ptxasRequests.size(), ptxasArch);
    KernelCache memoryOnly("");
    std::vector<std::shared_ptr<const CompiledKernel>> compiled =
        memoryOnly.getOrCompileAll(ptxasRequests);
    for (size_t i = 0; i < pack.bench.size(); ++i)
      for (const KernelConfig &config : benchConfigs[i]) {
        if (!runsOn(config))
          continue;
        const CompiledKernel &kernel =
            *compiled[indexOfKey.at(pack.bench[i].label + "|" + config.describe())];
        std::vector<PtxasKernelReport> reports = parsePtxasReport(kernel.log);
        if (reports.empty())
          throw Error(fmt::format("no ptxas report for {} ({}) on {}", pack.bench[i].name,
                                  config.describe(), ptxasArch));
        for (const PtxasKernelReport &report : reports) {
          BenchPtxas figures;
          figures.arch = ptxasArch;
          figures.kernel = report.kernel;
          figures.registers = report.registers;
          figures.stackBytes = report.stackFrameBytes;
          figures.spillStoreBytes = report.spillStoreBytes;
          figures.spillLoadBytes = report.spillLoadBytes;
          // The unit's configuration sizes its main kernel; the decode merge
          // is launched with its own block and no dynamic shared memory.
          const bool merge = report.kernel.find("_merge") != std::string::npos;
          figures.threads = merge ? 128 : config.threadsPerCta();
          figures.sharedMemoryBytes = merge ? 0 : config.sharedMemoryBytes();
          pack.bench[i].ptxas.push_back(std::move(figures));
        }
      }
  }

  // 5. References.
  for (PackCase &c : pack.cases)
    writeCase(packDir, c, modsOfLabel.at(c.label).second);
  pack.write();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const KernelCache::Stats stats = cache.stats();
  std::cout << fmt::format("pagedc-gpu-prepare: {} cases, {} benchmark configurations, {} "
                           "bundles, {} kernels ({} compiled, {} from the disk cache) in {:.1f} "
                           "s -> {}\n",
                           pack.cases.size(), pack.bench.size(), bundles.size(), kernels.size(),
                           stats.compiles, stats.diskHits, seconds, options.out);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  Options options;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc)
          throw Error(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "-o" || arg == "--out")
        options.out = value();
      else if (arg == "--examples")
        options.examples = value();
      else if (arg == "--bench-attn")
        options.benchAttn = value();
      else if (arg == "--arch")
        options.arch = value();
      else if (arg == "--quick")
        options.quick = true;
      else if (arg == "--cli-bundle")
        options.cliBundles.push_back(value());
      else if (arg == "--bench-head-dim") {
        const std::string text = value();
        if (text != "64" && text != "128" && text != "256")
          throw Error("--bench-head-dim: '" + text + "' is not 64, 128 or 256");
        options.benchHeadDim = std::stoi(text);
      } else if (arg == "--ptxas-arch") {
        std::stringstream list(value());
        for (std::string item; std::getline(list, item, ',');)
          if (!item.empty())
            options.ptxasArchs.push_back(item);
      }
      else if (arg == "-h" || arg == "--help") {
        std::cout << "usage: pagedc-gpu-prepare -o PACK [--examples DIR] [--bench-attn FILE] "
                     "[--arch sm_90] [--quick] [--cli-bundle DIR]... [--ptxas-arch sm_90,sm_80] "
                     "[--bench-head-dim 128]\n"
                     "  --bench-head-dim N  head dim of the benchmark plan (64, 128 or 256; "
                     "default 128, performance.md's)\n";
        return 0;
      } else
        throw Error("unknown argument '" + arg + "'");
    }
    if (options.out.empty())
      throw Error("-o PACK is required");
    options.kernel = kernelOptionsFromEnvironment();
    // A bundle holds one kernel per config: nothing to switch to.
    if (options.kernel.linkMods == ModLinking::LinkedFirst)
      throw Error("PAGEDC_LINK_MODS is 'first': a pack's bundles hold one kernel per config, "
                  "linked (1) or inlined (0)");
    return run(options);
  } catch (const std::exception &error) {
    std::cerr << "pagedc-gpu-prepare: error: " << error.what() << "\n";
    return 1;
  }
}
