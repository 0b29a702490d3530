//===- KernelSource.cpp - Assembling CUDA kernel translation units --------===//
//
// Pure string assembly: embedded prelude + generated mods + hook checks +
// configuration constexprs + one kernel template.
//
//===----------------------------------------------------------------------===//

#include "pagedc/KernelSource.h"
#include "Environment.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace pagedc::detail {
struct EmbeddedTemplate {
  const char *name;
  const char *text;
  std::size_t size;
};
extern const EmbeddedTemplate kEmbeddedTemplates[];
extern const std::size_t kEmbeddedTemplateCount;
} // namespace pagedc::detail

namespace pagedc {
namespace {

int countLines(std::string_view text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

bool isPowerOfTwo(int value) { return value > 0 && (value & (value - 1)) == 0; }

int log2Exact(int value) {
  int result = 0;
  while ((1 << result) < value)
    ++result;
  return result;
}

/// Rows of an MLA decode CTA (templates/MlaDecode.cuh, kMlaRows) and its
/// threads (a 2 x 4 grid of warps).
constexpr int kMlaRows = 32;
constexpr int kMlaThreads = 256;
/// An MLA decode CTA's shared memory: the query tile and two stages of
/// 32 latent rows (576 elements each), and the partial scores (a float per
/// warp, row and key).
constexpr int kMlaSharedBytes = (kMlaRows + 2 * 32) * 576 * 2 + 8 * 16 * 32 * 4;

/// Rows a decode CTA pads to (16 per row-warp, 1, 2 or 4 row-warps).
int decodePaddedRows(const KernelConfig &config) {
  int rows = config.decodeHeadsPerCta() * config.queryTokens;
  return rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
}

} // namespace

const char *kernelKindName(KernelKind kind) {
  switch (kind) {
  case KernelKind::Prefill:
    return "prefill";
  case KernelKind::Decode:
    return "decode";
  case KernelKind::BlockMaskBuilder:
    return "block-mask";
  }
  return "?";
}

namespace {
/// The shared memory a CTA may have (sm_90; sm_80 has less, but its tiles
/// are far under it).
constexpr int kMaxSharedPerCta = 227 * 1024;

/// The shared memory a warpgroup prefill CTA may have with `ctasPerSm`
/// CTAs an SM: an sm_90 SM has 228 KiB, of which each CTA's 1 KiB is
/// reserved.
int prefillSharedLimit(int ctasPerSm) {
  return ctasPerSm == 1 ? kMaxSharedPerCta : 228 * 1024 / ctasPerSm - 1024;
}

/// The entries of a prefill_shape value (KernelOptions::prefillShape): a
/// comma-separated list of MxNxW[r|sK][c2] entries, each optionally prefixed
/// "dD=" (it then applies at head dim D only, and "dD=" alone keeps the
/// default tile there; an entry without a prefix applies at the others),
/// e.g. "128x128x64,d256=128x64x64". Returns (D, shape) pairs, D 0 for the
/// entry without a prefix. An empty entry, a head dim named twice or two
/// entries without a prefix throw pagedc::Error naming `label`.
std::vector<std::pair<int, std::string>> prefillShapeEntries(const std::string &value,
                                                             const std::string &label) {
  std::vector<std::pair<int, std::string>> entries;
  std::set<int> named;
  bool hasFallback = false;
  for (size_t start = 0; start <= value.size();) {
    size_t end = value.find(',', start);
    if (end == std::string::npos)
      end = value.size();
    const std::string entry = value.substr(start, end - start);
    start = end + 1;
    const size_t equals = entry.find('=');
    if (entry.empty())
      throw Error(fmt::format("{} '{}' has an empty entry", label, value));
    if (equals == std::string::npos) {
      if (hasFallback)
        throw Error(fmt::format("{} '{}' has two shapes for every head dim "
                                "(name one with dD=, e.g. d256=128x64x64)",
                                label, value));
      hasFallback = true;
      entries.emplace_back(0, entry);
      continue;
    }
    int dim = 0;
    char tail = 0;
    if (entry[0] != 'd' || std::sscanf(entry.substr(1, equals - 1).c_str(), "%d%c", &dim,
                                       &tail) != 1 ||
        dim <= 0)
      throw Error(fmt::format("{} '{}': '{}' is not dD=MxNxW (a head dim, "
                              "e.g. d256=128x64x64)",
                              label, value, entry));
    if (!named.insert(dim).second)
      throw Error(fmt::format("{} '{}' names head dim {} twice", label, value, dim));
    entries.emplace_back(dim, entry.substr(equals + 1));
  }
  return entries;
}

/// The shape `value` asks for at `headDim`, or "" (no value, or no entry
/// for that head dim, or "dD=" there).
std::string prefillShapeOverride(const std::string &value, int headDim,
                                 const std::string &label) {
  if (value.empty())
    return "";
  std::string fallback;
  for (const auto &[dim, shape] : prefillShapeEntries(value, label)) {
    if (dim == headDim)
      return shape;
    if (dim == 0)
      fallback = shape;
  }
  return fallback;
}

/// One prefill tile of a prefill_shape value.
struct PrefillTile {
  int blockM = 0, blockN = 0, warpRows = 0;
  bool recompute = false;
  int stageLimit = 4;
  int ctasPerSm = 1;
};

/// Parses `shape`, an entry of prefill_shape value `value`; throws
/// pagedc::Error naming `label` when it is not MxNxW, MxNxWr, MxNxW[sK][c2].
PrefillTile parsePrefillTile(const std::string &shape, const std::string &value,
                             const std::string &label) {
  PrefillTile tile;
  int consumed = 0;
  const int fields = std::sscanf(shape.c_str(), "%dx%dx%d%n", &tile.blockM, &tile.blockN,
                                 &tile.warpRows, &consumed);
  std::string suffix = fields == 3 ? shape.substr(consumed) : std::string();
  bool suffixOk = true;
  if (suffix == "r") {
    tile.recompute = true;
    suffix.clear();
  }
  // Warpgroup tiles (W 64): "sK", then "c2", each optional.
  if (suffix.size() >= 2 && suffix[0] == 's' && suffix[1] >= '2' && suffix[1] <= '4') {
    tile.stageLimit = suffix[1] - '0';
    suffixOk = tile.warpRows == 64;
    suffix.erase(0, 2);
  }
  if (suffix == "c2") {
    tile.ctasPerSm = 2;
    suffixOk = suffixOk && tile.warpRows == 64;
    suffix.clear();
  }
  if (fields != 3 || !suffixOk || !suffix.empty())
    throw Error(fmt::format("{} '{}' is not MxNxW, MxNxWr or MxNxW[sK][c2] (query "
                            "rows x KV rows per tile x query rows per warp, e.g. 64x64x16; r: "
                            "the mods' row values recomputed per KV tile; warpgroup tiles "
                            "(W 64) only: sK, at most K = 2, 3 or 4 K/V stages, and c2, two "
                            "CTAs an SM (one consumer warpgroup, M 64); \"dD=\" before a "
                            "shape: at head dim D only)",
                            label, value));
  return tile;
}

/// What messages call KernelOptions::prefillShape.
constexpr const char *kPrefillShapeLabel = "kernel option prefill_shape";
} // namespace

void checkPrefillShape(const std::string &value, const std::string &label) {
  for (const auto &entry : prefillShapeEntries(value, label))
    if (!entry.second.empty())
      parsePrefillTile(entry.second, value, label);
}

bool isCudaHeadDim(int64_t headDim) {
  return headDim >= 32 && headDim <= 256 && headDim % 16 == 0;
}

bool isWarpgroupHeadDim(int64_t headDim) {
  return headDim == 64 || headDim == 128 || headDim == 256;
}

std::string cudaHeadDimsText() {
  return "multiples of 16 from 32 to 256 (32, 48, 64, 80, ..., 256; the sm_90 warpgroup "
         "prefill takes 64, 128 and 256, the others run the mma.sync prefill there)";
}

namespace {
/// Bytes of a row of the mma.sync kernels' shared-memory tiles: the head
/// dim rounded up to 64 elements, the span of their swizzle
/// (KernelCommon.cuh, kTileRowBytes).
int tileRowBytes(int headDim) { return (headDim + 63) / 64 * 64 * 2; }
} // namespace

void KernelConfig::choosePrefillShape(const KernelOptions &options) {
  const std::string value = options.prefillShape.value_or("");
  if (const std::string override = prefillShapeOverride(value, headDim, kPrefillShapeLabel);
      !override.empty()) {
    const PrefillTile tile = parsePrefillTile(override, value, kPrefillShapeLabel);
    // A warpgroup tile where the warpgroup prefill cannot run (head dims
    // other than 64, 128 and 256, or Dv other than D): the mma.sync tile
    // below, as sm_90 takes there by default, so that one value serves
    // calls of every head dim.
    if (tile.warpRows == 64 && !(isWarpgroupHeadDim(headDim) && valueDim() == headDim))
      return choosePrefillShape();
    blockM = tile.blockM;
    blockN = tile.blockN;
    warpRows = tile.warpRows;
    recomputeModRows = tile.recompute;
    prefillStageLimit = tile.stageLimit;
    prefillCtasPerSm = tile.ctasPerSm;
    prefillShapeAsked = true;
    return;
  }
  prefillShapeAsked = false;
  prefillStageLimit = 4;
  prefillCtasPerSm = 1;
  // By the wider head dim: D sets the score k-steps and the Q tile, Dv the
  // output accumulators, and shared memory holds rows of the wider.
  const int widest = std::max(headDim, valueDim());
  if (widest <= 64) {
    blockM = 128;
    blockN = 32;
    warpRows = 32;
  } else {
    blockM = 64;
    blockN = widest <= 128 ? 64 : 32;
    warpRows = 16;
  }
}

void KernelConfig::choosePrefillShapeFor(const std::string &arch, const KernelOptions &options) {
  choosePrefillShape(options);
  if (prefillShapeAsked)
    return;
  if ((arch == "sm_90a" || arch == "sm_90") && isWarpgroupHeadDim(headDim) &&
      valueDim() == headDim) {
    // D 64 and 128: 128-key tiles (fewer instructions per key besides the
    // wgmmas; FlashAttention-3's causal tiles are 128 keys wide; on an H200
    // 1.11-1.13x the 64-key tiles, causal S 4k-16k) where ptxas allocates
    // them without spills (settlePrefillShape), else 64-key ones. D 256: two
    // consumer warpgroups on 64-key tiles (on an H200 2.1x the mma.sync
    // tiles and 1.6-1.8x one warpgroup on 32-key tiles, causal S 4k-16k;
    // none of the 313 corpus selections spills), else one warpgroup on
    // 32-key tiles (64 x 64 spilled 8-12 bytes for some corpus mask x score
    // pairs at 255 registers).
    blockM = 128;
    blockN = headDim <= 128 ? 128 : 64;
    warpRows = 64;
  } else if (headDim == 128 && valueDim() == 128 && arch.rfind("sm_", 0) == 0) {
    // The FA2-shaped tile where ptxas allocates it without spills
    // (settlePrefillShape): 116 of the 313 corpus selections spill 4-32
    // bytes at sm_80 with their row values held across the KV loop, and
    // 114 of those take them recomputed per tile (bench/README.md).
    blockM = 128;
    blockN = 32;
    warpRows = 32;
  }
}

namespace {
/// The next narrower warpgroup tile (warpRows 64), in place: 128-key tiles
/// -> 64-key ones; at head dim 256 two consumer warpgroups on 64-key tiles
/// -> one on 32-key tiles. False when there is none.
bool narrowWarpgroupTile(KernelConfig &config) {
  if (config.blockN == 128) {
    config.blockN = 64;
    return true;
  }
  if (config.headDim > 128 && config.blockM == 128 && config.blockN == 64) {
    config.blockM = 64;
    config.blockN = 32;
    return true;
  }
  return false;
}
} // namespace

void KernelConfig::fitPrefillTileToBlocks(int kvBlockSize) {
  if (kind != KernelKind::Prefill || warpRows != 64 || kvBlockSize <= 0)
    return;
  while (kvBlockSize % blockN != 0 && narrowWarpgroupTile(*this)) {
  }
}

bool KernelConfig::prefillFallsBackOnSpills() const {
  // A tile KernelOptions::prefillShape asks for is kept as asked.
  if (kind != KernelKind::Prefill || blockM != 128 || prefillShapeAsked)
    return false;
  return (headDim == 128 && blockN == 32 && warpRows == 32) ||
         (headDim <= 128 && blockN == 128 && warpRows == 64) ||
         (headDim > 128 && blockN == 64 && warpRows == 64);
}

void KernelConfig::usePrefillSpillFallback() {
  if (warpRows == 64) {
    // Warpgroup tiles hold no row values to recompute: the narrower tile.
    narrowWarpgroupTile(*this);
    return;
  }
  if (!recomputeModRows) {
    recomputeModRows = true;
    return;
  }
  recomputeModRows = false;
  blockM = 64;
  blockN = 64;
  warpRows = 16;
}

void KernelConfig::chooseGroupRowsShape() {
  const int widest = std::max(headDim, valueDim());
  // 256 rows where ptxas allocates them without spills (the packed spill
  // check's mods at every head dim up to 128, sm_80 and sm_90): 32-key
  // tiles (64-key score tiles of two row blocks spilled 4-64 bytes at head
  // dim 64; at 32 the copier needs 64 rows for 256 threads), the row values
  // recomputed per KV tile above 64 (held, they spilled 24-64 bytes at
  // 128). 8-bit caches at 128 spilled 4-32 bytes even so: 128 rows there.
  if (widest <= 128 && !(kvFloat8 && widest > 112)) {
    blockM = 256;
    warpRows = 32;
    blockN = widest <= 32 ? 64 : 32;
    recomputeModRows = widest > 64;
  } else {
    // The packed prefill's choices (CudaBatchAttention.cpp).
    blockM = 128;
    warpRows = 16;
    blockN = widest <= 128 ? 64 : 32;
    recomputeModRows = widest > 128;
  }
}

namespace {
/// validate()'s checks of the MLA decode kernel.
void validateMlaDecode(const KernelConfig &config) {
  if (config.valueDim() != KernelConfig::kMlaValueDim)
    throw Error(fmt::format("the MLA decode kernel (head dim {}) takes value head dim {} (the "
                            "latent rows' first {} columns), not {}",
                            KernelConfig::kMlaKeyDim, KernelConfig::kMlaValueDim,
                            KernelConfig::kMlaValueDim, config.valueDim()));
  if (config.kvFloat8)
    throw Error(fmt::format("the MLA decode kernel reads 16-bit latent caches, not {}",
                            dtypeName(*config.kvFloat8)));
  if (!config.packedBatch)
    throw Error("the MLA decode kernel runs packed batches (BatchAttention) only");
  if (kMlaRows % config.queryTokens != 0)
    throw Error(fmt::format("the MLA decode kernel takes 1, 2, 4 or 8 query tokens, not {}",
                            config.queryTokens));
}
} // namespace

void KernelConfig::validate() const {
  if (elementType != DType::F16 && elementType != DType::BF16)
    throw Error(fmt::format("CUDA kernels take f16 or bf16 elements, not {}",
                            dtypeName(elementType)));
  if (isMlaDecode())
    validateMlaDecode(*this);
  if (kvFloat8 && !isFloat8(*kvFloat8))
    throw Error(
        fmt::format("8-bit float K/V elements are f8e4m3 or f8e5m2, not {}", dtypeName(*kvFloat8)));
  if (kvFloat8 && kind == KernelKind::BlockMaskBuilder)
    throw Error(fmt::format("{} caches are read by the decode and prefill kernels, not by the "
                            "block-mask builder",
                            dtypeName(*kvFloat8)));
  if (!isCudaHeadDim(headDim) && !isMlaDecode())
    throw Error(fmt::format("head dim {} is not supported by the CUDA kernels; they take {}",
                            headDim, cudaHeadDimsText()));
  if (!isCudaHeadDim(valueDim()) && !isMlaDecode())
    throw Error(fmt::format("value head dim {} is not supported by the CUDA kernels; they take {}",
                            valueDim(), cudaHeadDimsText()));
  if (warpRows == 64 && valueDim() != headDim)
    throw Error(fmt::format("the warpgroup prefill (64 rows per warpgroup) takes Dv = D, not Dv "
                            "{} with D {}; the mma.sync tiles (16 or 32 rows per warp) take it",
                            valueDim(), headDim));
  if (warpRows == 64 && !isWarpgroupHeadDim(headDim))
    throw Error(fmt::format("the warpgroup prefill (64 rows per warpgroup) takes head dims 64, "
                            "128 and 256, not {}; the mma.sync tiles (16 or 32 rows per warp) "
                            "take it",
                            headDim));
  if (!isPowerOfTwo(pageSize) || pageSize > 1024)
    throw Error(fmt::format(
        "page size {} is not a power of two in [1, 1024]", pageSize));
  if (groupRows && (kind != KernelKind::Prefill || !packedBatch ||
                    !((blockM == 128 && warpRows == 16) || (blockM == 256 && warpRows == 32))))
    throw Error(fmt::format("the GQA-packed prefill takes packed batches and 8 warps (blockM 128 "
                            "of 16 rows per warp, or 256 of 32), not {} blockM {} warpRows {}{}",
                            kernelKindName(kind), blockM, warpRows,
                            packedBatch ? "" : " unpacked"));
  if (!groupRows && blockM != 64 && blockM != 128)
    throw Error(fmt::format("prefill blockM {} must be 64 or 128", blockM));
  if (warpRows != 16 && warpRows != 32 && warpRows != 64)
    throw Error(fmt::format("prefill warpRows {} must be 16, 32 (rows per warp, mma.sync) or "
                            "64 (rows per warpgroup, wgmma: sm_90a)",
                            warpRows));
  if (warpRows == 32 && std::max(headDim, valueDim()) > 128)
    throw Error(fmt::format("32 query rows per warp need head dims <= 128, not {}",
                            std::max(headDim, valueDim())));
  if (kind != KernelKind::Prefill && warpRows != 16)
    throw Error("only the prefill kernel takes 32 query rows per warp or warpgroup tiles");
  if (prefillStageLimit < 2 || prefillStageLimit > 4)
    throw Error(fmt::format("the warpgroup prefill's ring takes 2 to 4 K/V stages, not {}",
                            prefillStageLimit));
  if (prefillStageLimit != 4 && (kind != KernelKind::Prefill || warpRows != 64))
    throw Error("only the warpgroup prefill (64 rows per warpgroup) has a K/V stage limit");
  if (prefillCtasPerSm != 1 && prefillCtasPerSm != 2)
    throw Error(fmt::format("the warpgroup prefill runs 1 or 2 CTAs an SM, not {}",
                            prefillCtasPerSm));
  if (prefillCtasPerSm == 2 && (kind != KernelKind::Prefill || warpRows != 64 || blockM != 64))
    throw Error("two CTAs an SM (c2) are for the warpgroup prefill with one consumer "
                "warpgroup (64 x N x 64 tiles)");
  // A head dim 256 wgmma's 128 accumulator registers a thread do not fit
  // the 128 a thread of two CTAs an SM has before setmaxnreg (ptxas
  // refuses it).
  if (prefillCtasPerSm == 2 && headDim > 128)
    throw Error(fmt::format("two CTAs an SM (c2) take head dims 64 and 128, not {}", headDim));
  if (recomputeModRows && (kind != KernelKind::Prefill || warpRows == 64))
    throw Error("only the prefill kernel's mma.sync tiles (16 or 32 query rows per warp) "
                "recompute the mods' row values per KV tile");
  if (warpRows == 64 ? blockN != 32 && blockN != 64 && blockN != 128
                    : blockN != 32 && blockN != 64)
    throw Error(fmt::format("blockN {} must be {}", blockN,
                            warpRows == 64 ? "32, 64 or 128 with warpgroup tiles" : "32 or 64"));
  if (kind == KernelKind::Decode && blockN != 64)
    throw Error("the decode kernel uses KV tiles of 64 rows (blockN = 64)");
  if (outputF32 && !packedBatch)
    throw Error("only packed batches (BatchAttention's kernels) write an f32 out");
  if (packedBatch && (kind == KernelKind::BlockMaskBuilder || warpRows == 64))
    throw Error("only the decode kernel and the prefill kernel's mma.sync tiles (16 or 32 query "
                "rows per warp) take packed batches");
  // (Two K/V stages at least: prefillStages' floor.)
  if (kind == KernelKind::Prefill && warpRows == 64 &&
      sharedMemoryBytes() > prefillSharedLimit(prefillCtasPerSm))
    throw Error(fmt::format("the warpgroup prefill tile {} x {} at head dim {} needs {} bytes "
                            "of shared memory with two K/V stages, over the {} a CTA may have{}: "
                            "take a narrower tile (in the prefill_shape kernel option, a dD= "
                            "entry names one for head dim D alone, e.g. d256=128x64x64)",
                            blockM, blockN, headDim, sharedMemoryBytes(),
                            prefillSharedLimit(prefillCtasPerSm),
                            prefillCtasPerSm == 2 ? " with two CTAs an SM" : ""));
  if (groupSize < 1)
    throw Error(fmt::format("group size {} must be at least 1", groupSize));
  if (linkedMods && kind == KernelKind::BlockMaskBuilder)
    throw Error("the block-mask builder inlines its mask; only the attention kernels link mods");
  if (queryTokens < 1 || queryTokens > 8)
    throw Error(fmt::format("decode takes 1..8 query tokens, not {}",
                            queryTokens));
}

std::string KernelConfig::describe() const {
  // The first design (16 rows per warp) keeps its historical description.
  // "r": the mods' row values recomputed per KV tile.
  // "sK": a stage limit under 4. "cK": built for K CTAs an SM.
  return fmt::format("{} {} d{}{} page{} m{}{}{}{}{} n{} group{} tokens{} lse{} params{}",
                     kernelKindName(kind), dtypeName(elementType), headDim,
                     valueDim() == headDim ? std::string() : fmt::format(" dv{}", valueDim()),
                     pageSize, blockM,
                     warpRows == 16 ? std::string() : fmt::format("w{}", warpRows),
                     recomputeModRows ? "r" : "",
                     prefillStageLimit == 4 ? std::string() : fmt::format("s{}", prefillStageLimit),
                     prefillCtasPerSm == 1 ? std::string() : fmt::format("c{}", prefillCtasPerSm),
                     blockN, groupSize, queryTokens, returnLse ? 1 : 0, paramsSize) +
         (packedBatch ? " packed" : "") +
         (kvFloat8 ? fmt::format(" kv {}", dtypeName(*kvFloat8)) : std::string()) +
         (outputF32 ? " out f32" : "") + (groupRows ? " group-rows" : "") +
         (noBlockMask ? " no-block-mask" : "") + (linkedMods ? " linked-mods" : "");
}

int KernelConfig::decodeHeadsPerCta() const {
  if (isMlaDecode())
    return kMlaRows / queryTokens;
  int ctas = (groupSize * queryTokens + 63) / 64;
  return (groupSize + ctas - 1) / ctas;
}

int KernelConfig::threadsPerCta() const {
  switch (kind) {
  case KernelKind::Prefill:
    // Warpgroup tiles: a consumer warpgroup per 64 rows and a producer one.
    return warpRows == 64 ? (blockM / 64 + 1) * 128 : blockM / warpRows * 32;
  case KernelKind::Decode:
    return isMlaDecode() ? kMlaThreads : 128;
  case KernelKind::BlockMaskBuilder:
    return 128;
  }
  return 128;
}

bool KernelConfig::needsSm90a() const {
  return kind == KernelKind::Prefill && warpRows == 64;
}

std::string KernelConfig::compileArchFor(const std::string &arch) const {
  return needsSm90a() && arch == "sm_90" ? std::string("sm_90a") : arch;
}

namespace {
/// Warpgroup prefill shared memory with `stages` K/V stages and `qBuffers`
/// Q tiles: 1024 bytes to align the swizzled tiles, Q, the ring and the
/// mbarriers (128 bytes). An 8-bit cache takes no more: its producer
/// converts codes from registers into the stages.
int wgmmaPrefillSharedBytes(const KernelConfig &config, int stages, int qBuffers = 1) {
  const int rowBytes = config.headDim * 2;
  return 1024 + (qBuffers * config.blockM + 2 * stages * config.blockN) * rowBytes + 128;
}
} // namespace

int KernelConfig::prefillStages() const {
  if (kind != KernelKind::Prefill || warpRows != 64)
    return 1;
  for (int stages = std::min(4, prefillStageLimit); stages > 2; --stages)
    if (wgmmaPrefillSharedBytes(*this, stages) <= prefillSharedLimit(prefillCtasPerSm))
      return stages;
  return 2;
}

int KernelConfig::prefillQBuffers() const {
  if (kind != KernelKind::Prefill || warpRows != 64)
    return 1;
  // The ring's stages first: a second Q tile only where it fits beside them.
  return wgmmaPrefillSharedBytes(*this, prefillStages(), 2) <= prefillSharedLimit(prefillCtasPerSm)
             ? 2
             : 1;
}

int KernelConfig::sharedMemoryBytes() const {
  const int rowBytes = tileRowBytes(std::max(headDim, valueDim()));
  switch (kind) {
  case KernelKind::Prefill:
    if (warpRows == 64)
      return wgmmaPrefillSharedBytes(*this, prefillStages(), prefillQBuffers());
    // Q tile, two K and two V stages, the staged pages of the next KV
    // tile (at most 64: page size 1); the GQA-packed tiles' rows' positions
    // and batch indices.
    return (blockM + 4 * blockN) * rowBytes + 64 * 4 + (groupRows ? blockM * 8 : 0);
  case KernelKind::Decode: {
    if (isMlaDecode())
      return kMlaSharedBytes;
    // Q tile, two K and two V stages, the class map, seen flags, the
    // kv-warp merge maxima and sums (64 rows x kv-warps = 64 floats each),
    // the staged pages of the next tile (at most 64: page size 1), the two
    // stages' mbarriers and 1 KiB to align the regions to 1,024 bytes (the
    // tensor maps' swizzle).
    int padded = decodePaddedRows(*this);
    return padded * rowBytes + 4 * 64 * rowBytes + padded * kDecodeMaxSplitBlocks +
           kDecodeMaxSplitBlocks + 2 * 64 * 4 + 64 * 4 + 2 * 8 + 1024;
  }
  case KernelKind::BlockMaskBuilder:
    return 0;
  }
  return 0;
}

std::vector<std::string> embeddedTemplateNames() {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < detail::kEmbeddedTemplateCount; ++i)
    names.emplace_back(detail::kEmbeddedTemplates[i].name);
  return names;
}

namespace {
/// Templates read from $PAGEDC_TEMPLATE_DIR (test seam), loaded once.
const std::map<std::string, std::string, std::less<>> &templateOverrides() {
  static const std::map<std::string, std::string, std::less<>> overrides = [] {
    std::map<std::string, std::string, std::less<>> files;
    const char *directory = env::get(env::Setting::TemplateDir);
    if (!directory)
      return files;
    for (std::size_t i = 0; i < detail::kEmbeddedTemplateCount; ++i) {
      const std::string name = detail::kEmbeddedTemplates[i].name;
      std::ifstream file(std::string(directory) + "/" + name, std::ios::binary);
      if (file)
        files.emplace(name, std::string((std::istreambuf_iterator<char>(file)),
                                        std::istreambuf_iterator<char>()));
    }
    // A directory holding none of them (a typo, or the parent of the
    // templates) would silently compile the embedded templates, and a
    // comparison of template versions would measure one version twice.
    // Some may be missing: an earlier commit's copy lacks later files.
    if (files.empty())
      throw Error(fmt::format("{} is '{}': it holds none of the kernel templates (such as {})",
                              env::variableName(env::Setting::TemplateDir), directory,
                              detail::kEmbeddedTemplates[0].name));
    return files;
  }();
  return overrides;
}
} // namespace

std::string_view embeddedTemplate(std::string_view name) {
  const auto &overrides = templateOverrides();
  if (auto found = overrides.find(name); found != overrides.end())
    return found->second;
  for (std::size_t i = 0; i < detail::kEmbeddedTemplateCount; ++i) {
    const auto &entry = detail::kEmbeddedTemplates[i];
    if (name == entry.name)
      return std::string_view(entry.text, entry.size);
  }
  throw Error(fmt::format("no embedded kernel template named '{}'", name));
}

bool hasSeparateMergeUnit(const KernelConfig &config) {
  return config.kind == KernelKind::Decode && !config.isMlaDecode();
}

KernelConfig decodeMergeConfig(const KernelConfig &config) {
  if (!hasSeparateMergeUnit(config))
    throw Error(fmt::format("the {} kernel has no merge unit of its own", config.describe()));
  KernelConfig merge;
  merge.kind = KernelKind::Decode;
  merge.elementType = config.elementType;
  merge.headDim = config.headDim;
  merge.valueHeadDim = config.valueDim();
  merge.returnLse = config.returnLse;
  merge.packedBatch = config.packedBatch;
  merge.outputF32 = config.outputF32;
  // Only a packed batch's merge indexes its rows by the token count.
  merge.queryTokens = config.packedBatch ? config.queryTokens : 1;
  merge.noBlockMask = true;
  return merge;
}

KernelSource assembleKernel(const KernelConfig &config,
                            std::string_view generatedModCode, KernelUnit unit) {
  config.validate();
  if (unit != KernelUnit::Whole && !hasSeparateMergeUnit(config))
    throw Error(fmt::format("the {} kernel is compiled as one unit", config.describe()));
  if (unit == KernelUnit::DecodeMerge && !generatedModCode.empty())
    throw Error("a decode merge unit takes no mod code");
  KernelSource source;
  source.config = config;
  std::string &code = source.code;
  code.reserve(64 * 1024 + generatedModCode.size());
  code += fmt::format("// pagedc kernel: {}{}\n", config.describe(),
                      unit == KernelUnit::DecodeSplit   ? " (split kernel)"
                      : unit == KernelUnit::DecodeMerge ? " (merge kernel)"
                                                        : "");
  if (unit == KernelUnit::DecodeSplit)
    code += "#define PAGEDC_UNIT_DECODE_SPLIT 1\n";
  if (unit == KernelUnit::DecodeMerge)
    code += "#define PAGEDC_UNIT_DECODE_MERGE 1\n";
  auto append = [&](std::string_view name) {
    code += fmt::format("// ---- {} ----\n", name);
    code += embeddedTemplate(name);
    if (!code.empty() && code.back() != '\n')
      code += '\n';
  };
  append("Prelude.cuh");
  append("KernelArgs.h");

  if (unit != KernelUnit::DecodeMerge) {
    // Linked mods: the kernel sees the hooks' shapes, the mods' own unit
    // (assembleLinkedMods) defines them.
    std::string linkedHooks;
    if (config.linkedMods) {
      if (config.paramsSize < 0)
        throw Error("a kernel with linked mods needs the Params size (paramsSize >= 0): its "
                    "Params are bytes the mods' own unit reads");
      linkedHooks = linkedModHooks(generatedModCode, config.paramsSize);
      generatedModCode = linkedHooks;
    }
    code += "// ---- generated mod code ----\n";
    source.modFirstLine = countLines(code) + 1;
    code += generatedModCode;
    if (!generatedModCode.empty() && generatedModCode.back() != '\n')
      code += '\n';
    source.modLineCount = countLines(generatedModCode) +
                          (generatedModCode.empty() || generatedModCode.back() == '\n' ? 0 : 1);
    append("Hooks.cuh");
  }

  code += "// ---- configuration ----\n";
  code += "namespace pagedc_config {\n";
  code += fmt::format("using Element = {};\n", config.elementType == DType::BF16
                                                   ? "pagedc_bf16"
                                                   : "pagedc_f16");
  code += fmt::format("constexpr bool kIsBF16 = {};\n",
                      config.elementType == DType::BF16 ? "true" : "false");
  code += fmt::format("constexpr int kHeadDim = {};\n", config.headDim);
  code += fmt::format("constexpr int kValueHeadDim = {};\n", config.valueDim());
  code += fmt::format("constexpr int kPageSize = {};\n", config.pageSize);
  code += fmt::format("constexpr int kLog2PageSize = {};\n",
                      log2Exact(config.pageSize));
  code += fmt::format("constexpr int kBlockM = {};\n", config.blockM);
  code += fmt::format("constexpr int kWarpRows = {};\n", config.warpRows);
  code += fmt::format("constexpr int kBlockN = {};\n", config.blockN);
  code += fmt::format("constexpr bool kRecomputeModRows = {};\n",
                      config.recomputeModRows ? "true" : "false");
  code += fmt::format("constexpr int kGroupSize = {};\n", config.groupSize);
  code += fmt::format("constexpr int kQueryTokens = {};\n", config.queryTokens);
  code += fmt::format("constexpr int kDecodeHeadsPerCta = {};\n",
                      config.decodeHeadsPerCta());
  code += fmt::format("constexpr int kMaxSplitBlocks = {};\n", kDecodeMaxSplitBlocks);
  code += fmt::format("constexpr int kPrefillStages = {};\n", config.prefillStages());
  code += fmt::format("constexpr int kPrefillQBuffers = {};\n", config.prefillQBuffers());
  code += fmt::format("constexpr int kPrefillCtasPerSm = {};\n", config.prefillCtasPerSm);
  code += fmt::format("constexpr int kPrefillSharedLimit = {};\n",
                      prefillSharedLimit(config.prefillCtasPerSm));
  code += fmt::format("constexpr bool kHasLse = {};\n",
                      config.returnLse ? "true" : "false");
  code += fmt::format("constexpr bool kPackedBatch = {};\n", config.packedBatch ? "true" : "false");
  // 0: K/V hold Element; 1, 2: 8-bit floats (templates/Float8.cuh).
  int kvFloat8 = 0;
  if (config.kvFloat8)
    kvFloat8 = *config.kvFloat8 == DType::F8E4M3 ? 1 : 2;
  code += fmt::format("constexpr int kKvFloat8 = {};\n", kvFloat8);
  code += fmt::format("constexpr bool kOutputF32 = {};\n", config.outputF32 ? "true" : "false");
  code += fmt::format("constexpr bool kMlaDecode = {};\n", config.isMlaDecode() ? "true" : "false");
  code += fmt::format("constexpr bool kMayBindBlockMask = {};\n",
                      config.noBlockMask ? "false" : "true");
  code += "} // namespace pagedc_config\n";
  if (config.paramsSize >= 0 && unit != KernelUnit::DecodeMerge)
    code += fmt::format(
        "static_assert(sizeof(pagedc_mods::Params) == {0}, \"pagedc_mods::Params "
        "does not have the {0}-byte layout the host packs\");\n",
        config.paramsSize);

  switch (config.kind) {
  case KernelKind::Prefill:
    append("KernelCommon.cuh");
    if (config.warpRows == 64) {
      append("Hopper.cuh");
      append("Float8.cuh");
      append("Float8Tiles.cuh");
      append("PrefillWgmma.cuh");
    } else {
      append("Float8.cuh");
      append("Float8Tiles.cuh");
      append(config.groupRows ? "PrefillGroup.cuh" : "Prefill.cuh");
    }
    source.kernelNames = config.groupRows ? std::vector<std::string>{"pagedc_prefill_group",
                                                                     "pagedc_prefill_group_merge"}
                                          : std::vector<std::string>{"pagedc_prefill"};
    break;
  case KernelKind::Decode:
    append("KernelCommon.cuh");
    if (config.isMlaDecode()) {
      append("MlaDecode.cuh");
      source.kernelNames = {"pagedc_decode", "pagedc_decode_merge"};
      break;
    }
    if (unit == KernelUnit::DecodeMerge) {
      append("Decode.cuh");
      source.kernelNames = {"pagedc_decode_merge"};
      break;
    }
    // The bulk tensor copies (used by code for sm_90 and later only).
    append("Hopper.cuh");
    append("Float8.cuh");
    append("Float8Tiles.cuh");
    append("Decode.cuh");
    source.kernelNames = unit == KernelUnit::DecodeSplit
                             ? std::vector<std::string>{"pagedc_decode"}
                             : std::vector<std::string>{"pagedc_decode", "pagedc_decode_merge"};
    break;
  case KernelKind::BlockMaskBuilder:
    append("BlockMaskBuilder.cuh");
    source.kernelNames = {"pagedc_build_block_mask"};
    break;
  }
  return source;
}

//===--- Linked mods -----------------------------------------------------===//

namespace {

/// The value of the generator's `constexpr bool NAME = true;` (or false).
bool modCodeFlag(std::string_view modCode, std::string_view name) {
  if (modCode.find(fmt::format("constexpr bool {} = true;", name)) != std::string_view::npos)
    return true;
  if (modCode.find(fmt::format("constexpr bool {} = false;", name)) != std::string_view::npos)
    return false;
  throw Error(fmt::format("the mod code declares no `constexpr bool {} = true;` (or false): "
                          "it is not the generator's, so its mods cannot be linked",
                          name));
}

/// The largest power of two, at most 8, that divides `size`: the Params'
/// alignment as the host lays them out (ParamsLayout rounds the size up to
/// the largest field's alignment).
int paramsAlignment(int64_t size) {
  int alignment = 8;
  while (alignment > 1 && size % alignment != 0)
    alignment /= 2;
  return alignment;
}

} // namespace

std::string linkedModHooks(std::string_view modCode, int64_t paramsSize) {
  const bool hasMask = modCodeFlag(modCode, "kHasMask");
  const bool hasScore = modCodeFlag(modCode, "kHasScore");
  const int64_t size = std::max<int64_t>(paramsSize, 1);
  std::string code = "namespace pagedc_mods {\n";
  code += fmt::format("struct alignas({}) Params {{\n  unsigned char bytes[{}];\n}};\n",
                      paramsAlignment(size), size);
  code += fmt::format("constexpr bool kHasMask = {};\n", hasMask ? "true" : "false");
  code += fmt::format("constexpr bool kHasScore = {};\n", hasScore ? "true" : "false");
  code += fmt::format("struct alignas(16) MaskRow {{\n  unsigned char bytes[{0}];\n}};\n"
                      "struct alignas(16) ScoreRow {{\n  unsigned char bytes[{0}];\n}};\n",
                      kLinkedModRowBytes);
  code += R"(extern "C" __device__ void pagedc_linked_mask_row(const void *, void *, int, int, int);
extern "C" __device__ bool pagedc_linked_mask(const void *, const void *, int, int, int, int);
extern "C" __device__ void pagedc_linked_score_row(const void *, void *, int, int, int);
extern "C" __device__ float pagedc_linked_score(const void *, const void *, float, int, int, int,
                                                int);
)";
  // An absent mod is never called across the link.
  code += hasMask ? R"(__device__ __forceinline__ MaskRow mask_row(const Params &p, int b, int h, int q) {
  MaskRow row;
  pagedc_linked_mask_row(&p, &row, b, h, q);
  return row;
}
__device__ __forceinline__ bool mask(const Params &p, const MaskRow &row, int b, int h, int q,
                                     int kv) {
  return pagedc_linked_mask(&p, &row, b, h, q, kv);
}
)"
                  : R"(__device__ __forceinline__ MaskRow mask_row(const Params &, int, int, int) {
  return MaskRow{};
}
__device__ __forceinline__ bool mask(const Params &, const MaskRow &, int, int, int, int) {
  return true;
}
)";
  // Across the link a mask is one call per element: no key-only part.
  code += "PAGEDC_MASK_COL_UNSPLIT()\n";
  code += hasScore ? R"(__device__ __forceinline__ ScoreRow score_row(const Params &p, int b, int h, int q) {
  ScoreRow row;
  pagedc_linked_score_row(&p, &row, b, h, q);
  return row;
}
__device__ __forceinline__ float score(const Params &p, const ScoreRow &row, float s, int b,
                                       int h, int q, int kv) {
  return pagedc_linked_score(&p, &row, s, b, h, q, kv);
}
)"
                   : R"(__device__ __forceinline__ ScoreRow score_row(const Params &, int, int, int) {
  return ScoreRow{};
}
__device__ __forceinline__ float score(const Params &, const ScoreRow &, float s, int, int, int,
                                       int) {
  return s;
}
)";
  code += "} // namespace pagedc_mods\n";
  return code;
}

std::string linkedModDefinitions(std::string_view modCode, int64_t paramsSize) {
  const bool hasMask = modCodeFlag(modCode, "kHasMask");
  const bool hasScore = modCodeFlag(modCode, "kHasScore");
  // The generator's namespace renamed: in the emulator's single unit the
  // kernel's pagedc_mods (linkedModHooks) is already defined.
  std::string code = "#define pagedc_mods pagedc_linked_variant\n";
  code += modCode;
  if (!modCode.empty() && modCode.back() != '\n')
    code += '\n';
  code += "#undef pagedc_mods\n";
  code += "namespace pagedc_linked_variant {\n";
  if (paramsSize >= 0)
    code += fmt::format("static_assert(sizeof(Params) <= {0} && alignof(Params) <= 8, "
                        "\"pagedc_mods::Params do not fit the {0} bytes the kernel takes\");\n",
                        std::max<int64_t>(paramsSize, 1));
  code += fmt::format(
      "static_assert(sizeof(MaskRow) <= {0} && alignof(MaskRow) <= 16 && sizeof(ScoreRow) <= {0} "
      "&& alignof(ScoreRow) <= 16, \"the mods' row values take more than the {0} bytes a kernel "
      "with linked mods holds for them: compile this variant without link_mods\");\n",
      kLinkedModRowBytes);
  code += fmt::format("static_assert(kHasMask == {} && kHasScore == {}, \"the kernel was "
                      "compiled for other mods present\");\n",
                      hasMask ? "true" : "false", hasScore ? "true" : "false");
  code += "} // namespace pagedc_linked_variant\n";
  code += R"(extern "C" __device__ void pagedc_linked_mask_row(const void *p, void *row, int b, int h,
                                                  int q) {
  using namespace pagedc_linked_variant;
  *static_cast<MaskRow *>(row) = mask_row(*static_cast<const Params *>(p), b, h, q);
}
extern "C" __device__ bool pagedc_linked_mask(const void *p, const void *row, int b, int h, int q,
                                              int kv) {
  using namespace pagedc_linked_variant;
  return mask(*static_cast<const Params *>(p), *static_cast<const MaskRow *>(row), b, h, q, kv);
}
extern "C" __device__ void pagedc_linked_score_row(const void *p, void *row, int b, int h,
                                                   int q) {
  using namespace pagedc_linked_variant;
  *static_cast<ScoreRow *>(row) = score_row(*static_cast<const Params *>(p), b, h, q);
}
extern "C" __device__ float pagedc_linked_score(const void *p, const void *row, float s, int b,
                                                int h, int q, int kv) {
  using namespace pagedc_linked_variant;
  return score(*static_cast<const Params *>(p), *static_cast<const ScoreRow *>(row), s, b, h, q,
               kv);
}
)";
  return code;
}

KernelSource assembleLinkedMods(const KernelConfig &config, std::string_view generatedModCode) {
  if (!config.linkedMods)
    throw Error(fmt::format("the {} kernel inlines its mods (KernelConfig::linkedMods is false)",
                            config.describe()));
  KernelSource source;
  source.config = config;
  std::string &code = source.code;
  code += fmt::format("// pagedc linked mods of: {}\n", config.describe());
  code += "// ---- Prelude.cuh ----\n";
  code += embeddedTemplate("Prelude.cuh");
  if (!code.empty() && code.back() != '\n')
    code += '\n';
  code += "// ---- generated mod code ----\n";
  source.modFirstLine = countLines(code) + 2; // after the #define
  source.modLineCount = countLines(generatedModCode) +
                        (generatedModCode.empty() || generatedModCode.back() == '\n' ? 0 : 1);
  code += linkedModDefinitions(generatedModCode, config.paramsSize);
  // Not kernels: the functions the kernel's unit calls, by which the cache
  // entry names what it holds.
  source.kernelNames = {"pagedc_linked_mask_row", "pagedc_linked_mask", "pagedc_linked_score_row",
                        "pagedc_linked_score"};
  return source;
}

//===--- Params layout ---------------------------------------------------===//

ParamsLayout
ParamsLayout::forDeclarations(const std::vector<ParamDecl> &params,
                              const std::vector<BufferDecl> &buffers) {
  ParamsLayout layout;
  int64_t offset = 0;
  auto place = [&](std::string name, int64_t size, int64_t alignment) {
    offset = (offset + alignment - 1) / alignment * alignment;
    layout.fields.push_back({std::move(name), offset, size});
    offset += size;
    layout.alignment = std::max(layout.alignment, alignment);
  };
  for (const ParamDecl &param : params) {
    if (param.type == ScalarKind::Bool)
      place(param.name, 1, 1);
    else
      place(param.name, 4, 4);
  }
  for (const BufferDecl &buffer : buffers) {
    place(buffer.name, 8, 8);
    place(buffer.name + "_stride", 8 * static_cast<int64_t>(buffer.dims.size()),
          8);
    place(buffer.name + "_size", 8 * static_cast<int64_t>(buffer.dims.size()),
          8);
  }
  // C++ gives an empty struct size 1; otherwise round up to the alignment.
  layout.size = offset == 0 ? 1
                            : (offset + layout.alignment - 1) /
                                  layout.alignment * layout.alignment;
  return layout;
}

std::vector<unsigned char>
ParamsLayout::pack(const std::vector<ParamDecl> &params,
                   const std::vector<BufferDecl> &buffers,
                   const PagedcModContext &context) const {
  std::vector<unsigned char> bytes(size, 0);
  if (fields.size() != params.size() + 3 * buffers.size())
    throw Error("params layout does not match the declarations it packs");
  std::size_t field = 0;
  for (std::size_t i = 0; i < params.size(); ++i, ++field) {
    const PagedcParamSlot &slot = context.params[i];
    unsigned char *at = bytes.data() + fields[field].offset;
    if (params[i].type == ScalarKind::Bool)
      *at = slot.i32 != 0 ? 1 : 0;
    else
      std::memcpy(at, &slot, 4);
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const PagedcBufferRef &ref = context.buffers[i];
    std::memcpy(bytes.data() + fields[field++].offset, &ref.data, 8);
    std::memcpy(bytes.data() + fields[field++].offset, ref.strides,
                8 * buffers[i].dims.size());
    std::memcpy(bytes.data() + fields[field++].offset, ref.sizes,
                8 * buffers[i].dims.size());
  }
  return bytes;
}

} // namespace pagedc
