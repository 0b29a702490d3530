//===- KernelSource.h - Assembling CUDA kernel translation units -*- C++ -*-===//
//
// The CUDA side of the compiler/runtime boundary. The compiler's EmitC
// lowering produces the mod code (the hooks documented in
// templates/Hooks.cuh); assembleKernel() surrounds it with the prelude, the
// configuration constexprs and one kernel template, all embedded in the
// binary at build time. The result is one self-contained CUDA source that
// NVRTC (or nvcc) compiles with no include path.
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_KERNELSOURCE_H
#define PAGEDC_KERNELSOURCE_H

#include "pagedc/KernelOptions.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagedc {

/// Which kernel template a translation unit instantiates.
enum class KernelKind : uint8_t {
  /// FlashAttention-2 style tiles over the paged cache; Lq > 1.
  Prefill,
  /// Split-KV decode for 1..8 query tokens; the TU also holds the merge
  /// kernel that combines the splits by lse.
  Decode,
  /// Evaluates the mask mod over tiles and writes a BlockMask.
  BlockMaskBuilder,
};
const char *kernelKindName(KernelKind kind);

/// The decode kernel's KV tile (templates/Decode.cuh, kDecodeTileN): the
/// planner counts a decode split's keys in these, and block-mask kv blocks
/// under a decode must be multiples of it.
inline constexpr int kDecodeKvTile = 64;
/// The most kv blocks of a block mask one decode split may cover: the size
/// of the kernel's per-split block tables (each unit's
/// pagedc_config::kMaxSplitBlocks) and so the planner's limit.
inline constexpr int kDecodeMaxSplitBlocks = 64;

/// Checks a KernelOptions::prefillShape value: its list of entries and
/// every shape in it. Throws pagedc::Error naming `label` (what the caller
/// calls the setting) and the forms it takes.
void checkPrefillShape(const std::string &value, const std::string &label);

/// Whether the CUDA kernels take head dim `headDim`: a multiple of 16 from
/// 32 to 256 (mma.sync m16n8k16 takes 16 columns a step). The warpgroup
/// prefill (sm_90a) takes 64, 128 and 256 alone (isWarpgroupHeadDim); other
/// sizes run the mma.sync prefill on every target.
bool isCudaHeadDim(int64_t headDim);
/// Head dims the warpgroup prefill takes: its tiles are 64-element
/// swizzled atoms and its PV wgmma has N = head dim (64, 128, 256).
bool isWarpgroupHeadDim(int64_t headDim);
/// The head dims the CUDA kernels take, for error messages.
std::string cudaHeadDimsText();

/// Compile-time configuration of one kernel. Every field becomes a constexpr
/// in `namespace pagedc_config` of the TU.
struct KernelConfig {
  KernelKind kind = KernelKind::Prefill;
  /// Element type of q, k, v and out: F16 or BF16.
  DType elementType = DType::BF16;
  /// Decode and the mma.sync prefill tiles (packed batches too): the K/V
  /// cache holds 8-bit floats of this type (F8E4M3 or F8E5M2) with a scale
  /// per KV head, converted to elementType after the load
  /// (templates/Float8Tiles.cuh); unset: it holds elementType.
  std::optional<DType> kvFloat8;
  /// Head dim of q and k: a multiple of 16 in [32, 256] (isCudaHeadDim).
  int headDim = 128;
  /// Head dim of v and out (Dv), the same range; 0: headDim. The
  /// warpgroup prefill and decode's tensor maps take Dv = D alone.
  int valueHeadDim = 0;
  /// Tokens per KV page: a power of two in [1, 1024].
  int pageSize = 16;
  /// Prefill: query rows per CTA (64 or 128).
  int blockM = 64;
  /// Prefill: query rows per warp, 16 or 32 (32 needs headDim <= 128). At 32
  /// a warp's two 16-row MMA tiles share each K/V fragment it reads from
  /// shared memory (FlashAttention-2's sm_80 shape); 16 is the first design,
  /// kept for comparison. 64: rows per consumer warpgroup of the warpgroup
  /// prefill (PrefillWgmma.cuh: wgmma, sm_90a). Decode ignores it (16).
  int warpRows = 16;
  /// Prefill with mma.sync tiles (warpRows 16 or 32): the mods' row values
  /// (the row structs, and what the per-element part derives from q alone)
  /// are computed again for each KV tile instead of held in registers
  /// across the KV loop. A few instructions per row and tile buy the
  /// registers a 128 x 32 tile with 32 rows per warp needs at head dim 128
  /// for mods with row state (settlePrefillShape's second try).
  bool recomputeModRows = false;
  /// Warpgroup prefill: the most K/V stages the producer's ring may have
  /// (2-4; fewer where shared memory runs out, prefillStages). Fewer stages
  /// can leave room for a second Q tile (prefillQBuffers): the 128 x 128
  /// tile at head dim 128 has 3 stages and one Q tile by default, and 2
  /// stages and two Q tiles (FlashAttention-3's ring at head dim 128) with a
  /// limit of 2, so that a persistent CTA copies its next Q during the
  /// current tile and stages O through shared memory. 4 for the other
  /// kernels. KernelOptions::prefillShape sets it with a suffix "sK"
  /// (e.g. 128x128x64s2).
  int prefillStageLimit = 4;
  /// Warpgroup prefill with one consumer warpgroup (blockM 64): CTAs an SM
  /// the kernel is built for, 1 or 2. With 2 it declares
  /// __launch_bounds__(threads, 2), splits the 128 registers a thread the
  /// launch gives into 192 for the consumers and 64 for the producer, and
  /// fits its ring in half the SM's shared memory (prefillSharedLimit), so
  /// that one CTA's copies, softmax and epilogue run under the other's
  /// products where CTAs are short (few KV tiles a query tile). 1 for the
  /// other kernels. KernelOptions::prefillShape sets it with a suffix "c2"
  /// (e.g. 64x64x64c2, after an "sK").
  int prefillCtasPerSm = 1;
  /// KV rows per tile (32 or 64; 32, 64 or 128 with warpgroup tiles).
  /// Block-mask kv blocks must be multiples.
  int blockN = 64;
  /// Decode: query heads per KV head (Hq / Hkv, any value >= 1). Prefill
  /// reads the ratio at run time and ignores this.
  int groupSize = 1;
  /// Decode: query tokens per sequence (1..8, speculative decoding).
  int queryTokens = 1;
  /// Write lse [B, Hq, Lq] (natural log).
  bool returnLse = false;
  /// >= 0: the TU static_asserts sizeof(pagedc_mods::Params) == paramsSize,
  /// catching a host/device layout disagreement at compile time.
  int64_t paramsSize = -1;
  /// Prefill: the tile is the one KernelOptions::prefillShape asked for
  /// (choosePrefillShape), so it is compiled as asked, never replaced on
  /// spills (prefillFallsBackOnSpills). How the tile was chosen, not what
  /// is compiled: neither compared nor described.
  bool prefillShapeAsked = false;
  /// A packed batch of sequences of their own query lengths
  /// (BatchAttention): CTAs take the entries of a work list (prefill:
  /// (sequence, query tile); decode: sequences of at most queryTokens new
  /// tokens), q / out / lse rows are packed, and K/V are read through the
  /// call's page and slot strides (the engine's layout, in place). Decode,
  /// and prefill with mma.sync tiles (warpRows 16 or 32).
  bool packedBatch = false;
  /// Packed batches: out holds f32 instead of elementType (the epilogues,
  /// and the split decode's merge, store pairs of floats).
  bool outputF32 = false;
  /// Packed-batch prefill (templates/PrefillGroup.cuh): a CTA's rows are
  /// (token, query head) pairs of one KV head's group (groupSize heads,
  /// token-major), so each K/V tile it copies serves the whole group, and
  /// an entry's keys are split over CTAs (num_splits) with a merge launch.
  /// 8 warps: blockM 128 with warpRows 16, or blockM 256 with warpRows 32
  /// (two 16-row MMA blocks a warp; head dims up to 128), as
  /// chooseGroupRowsShape picks. For entries whose keys far outnumber their
  /// tokens (a cascade's prefix level).
  bool groupRows = false;
  /// Launches of this kernel bind no block mask: the TU's block-mask paths
  /// (pagedc_config::kMayBindBlockMask false) are compiled out, a large part
  /// of NVVM's and ptxas's work (bench/studies/jit-latency.md). Calls
  /// without a block mask compiling from mod code choose it
  /// (chooseCudaAttentionConfig, BatchAttention); a launch with a mask is
  /// refused. False (the kernel takes launches with and without one) is
  /// what bundles hold and what serves both.
  bool noBlockMask = false;
  /// The mods are compiled as a unit of their own (assembleLinkedMods) and
  /// linked (nvJitLink) into a kernel compiled once per shape and per which
  /// mods are present (linkedModHooks in place of the mod code): a new mod
  /// variant then compiles only its small unit and the link. The kernel
  /// calls the mods across the link instead of inlining them, so it saves
  /// and restores live registers around each call and runs slower; a
  /// choice for trying many variants, not for serving
  /// (KernelOptions::linkMods). Needs paramsSize >= 0: the kernel's Params
  /// is opaque bytes of that size.
  bool linkedMods = false;

  bool operator==(const KernelConfig &other) const {
    return kind == other.kind && elementType == other.elementType && kvFloat8 == other.kvFloat8 &&
           headDim == other.headDim && valueDim() == other.valueDim() &&
           pageSize == other.pageSize && blockM == other.blockM && warpRows == other.warpRows &&
           recomputeModRows == other.recomputeModRows &&
           prefillStageLimit == other.prefillStageLimit &&
           prefillCtasPerSm == other.prefillCtasPerSm && blockN == other.blockN &&
           groupSize == other.groupSize && queryTokens == other.queryTokens &&
           returnLse == other.returnLse && paramsSize == other.paramsSize &&
           packedBatch == other.packedBatch && outputF32 == other.outputF32 &&
           groupRows == other.groupRows && noBlockMask == other.noBlockMask &&
           linkedMods == other.linkedMods;
  }
  bool operator!=(const KernelConfig &other) const { return !(*this == other); }
  /// Dv: valueHeadDim, or headDim where it is 0.
  int valueDim() const { return valueHeadDim ? valueHeadDim : headDim; }

  /// Sets blockM, blockN and warpRows to the mma.sync prefill tile shape
  /// that compiles without spills for every mod at this headDim (the
  /// warpgroup tiles, warpRows 64, are what `pagedc --arch=sm_90a` compiles
  /// and KernelOptions::prefillShape selects; choosePrefillShapeFor picks per
  /// target): 128 x 32 with
  /// 32 rows per warp at headDim 64; 64 x 64 with 16 rows per warp at 128
  /// (32 rows per warp spill there for some mods); 64 x 32 with 16 rows per warp at 256
  /// (64 x 64 spilled 8-16 bytes for some corpus mask x score pairs;
  /// bench/README.md has the ptxas figures). options.prefillShape MxNxW
  /// (e.g. 64x64x16, the first design) overrides it for comparisons, with
  /// a suffix "r" (recomputeModRows) or, on warpgroup tiles, "sK"
  /// (prefillStageLimit K) and "c2" (prefillCtasPerSm 2); entries "dD=MxNxW" after it, comma-separated, override it at head dim
  /// D alone ("128x128x64,d256=128x64x64": a tile that fits each; "dD="
  /// keeps the default there); a malformed value throws pagedc::Error
  /// naming it. Sets prefillShapeAsked. A warpgroup tile (W 64) asked for at
  /// a head dim the warpgroup prefill does not take (isWarpgroupHeadDim, Dv =
  /// D) gives the default mma.sync tile, as if nothing were asked.
  void choosePrefillShape(const KernelOptions &options = {});
  /// choosePrefillShape for a target: on sm_90 and sm_90a (an H100 or
  /// H200) the warpgroup tiles (wgmma; sm_90a code, which compileArchFor
  /// picks; faster than the mma.sync tiles there, bench/README.md's GPU
  /// studies): 128 x 128 at
  /// head dims 64 and 128 (128 keys, as FlashAttention-3's causal tiles),
  /// which spills for some mods, so settlePrefillShape (KernelCache.h)
  /// compiles it and takes 128 x 64 where ptxas reports spills; 128 x 64 at
  /// 256 (two consumer warpgroups), else 64 x 32 (one). Other GPU targets
  /// (sm_80, sm_86, ...) at head dim 128: the FA2-shaped tile, 128 x 32 with 32 rows
  /// per warp (half the shared-memory reads per FLOP of 64 x 64 with 16),
  /// which spills for some mods: settlePrefillShape compiles it, then where
  /// ptxas reports spills the same tile with recomputeModRows, then
  /// choosePrefillShape's tile (prefillFallsBackOnSpills,
  /// usePrefillSpillFallback). The emulator ("emu") and
  /// options.prefillShape: as choosePrefillShape.
  void choosePrefillShapeFor(const std::string &arch, const KernelOptions &options = {});
  /// For a prefill call with a block mask of `kvBlockSize`-key blocks (0:
  /// none): the 128-key warpgroup tile becomes the 64-key one where the
  /// blocks are not a multiple of 128 (the kernel's KV tiles must not
  /// straddle two blocks), and at head dim 256 the 128 x 64 tile becomes 64 x
  /// 32 (one consumer warpgroup) where they are not a multiple of 64; also
  /// when KernelOptions::prefillShape asked for the wider tile (the call could not
  /// run it). Other tiles are kept: a launch whose blocks its tile does not
  /// divide is refused, naming both sizes.
  void fitPrefillTileToBlocks(int kvBlockSize);
  /// Whether this is a prefill tile that choosePrefillShapeFor prefers only
  /// where it compiles without spills (128 x 32 with 32 rows per warp at
  /// head dim 128, with or without recomputeModRows; the 128 x 128
  /// warpgroup tile at 64 and 128, 128 x 64 at 256), unless
  /// KernelOptions::prefillShape asked for it (prefillShapeAsked).
  bool prefillFallsBackOnSpills() const;
  /// The next tile to try when this one spills: 128 x 128 warpgroups ->
  /// 128 x 64 warpgroups (which never spill); at head dim 256 128 x 64 ->
  /// 64 x 32 (one warpgroup); 128 x 32 -> the same tile with
  /// recomputeModRows -> choosePrefillShape's (64 x 64, 16 rows per warp),
  /// which never spills.
  void usePrefillSpillFallback();
  /// The GQA-packed prefill's tile (groupRows), set in blockM, warpRows,
  /// blockN and recomputeModRows by the wider of D and Dv: up to 128, 256
  /// rows (8 warps of 32) on 32-key tiles (64 at head dim 32), the row
  /// values recomputed per KV tile above 64; above 128, and for 8-bit
  /// caches above 112, 128 rows (8 warps of 16) on the packed prefill's KV
  /// tiles (64 keys, 32 above 128, row values recomputed above 128). Each
  /// is a tile ptxas allocates without spills on sm_80 and sm_90.
  void chooseGroupRowsShape();
  /// Throws pagedc::Error naming the first unsupported value.
  void validate() const;
  /// A canonical one-line description, e.g. "prefill bf16 d128 page16 ...".
  std::string describe() const;
  /// Decode: query heads one CTA serves (rows = heads * queryTokens <= 64).
  /// MLA decode (isMlaDecode): a CTA's 32 rows per token (its rows are the
  /// group's (token, head) pairs flattened, so ceil(groupSize / this) CTAs
  /// cover queryTokens tokens of the group).
  int decodeHeadsPerCta() const;
  /// The MLA decode kernel (templates/MlaDecode.cuh): a decode of packed
  /// batches at D 576 and Dv 512, which reads V as the first 512 columns
  /// of the K cache's rows.
  bool isMlaDecode() const {
    return kind == KernelKind::Decode && headDim == kMlaKeyDim;
  }
  /// MLA's widths: a latent row (kv_lora_rank 512 + rope 64) and its value
  /// part.
  static constexpr int kMlaKeyDim = 576;
  static constexpr int kMlaValueDim = 512;
  /// Threads per CTA of the main kernel.
  int threadsPerCta() const;
  /// Dynamic shared memory of the main kernel, in bytes.
  int sharedMemoryBytes() const;
  /// Warpgroup prefill: K/V stages of the producer's ring, the most (up
  /// to prefillStageLimit) whose shared memory fits an H100 CTA (227 KiB,
  /// or 113 KiB with two CTAs an SM),
  /// at least 2 (8-bit caches alike: they take no shared memory of their
  /// own).
  /// 1 for the other kernels.
  int prefillStages() const;
  /// Warpgroup prefill: Q tiles in shared memory, 2 where a second fits
  /// beside prefillStages() stages (a persistent CTA's producer then copies
  /// its next tile's Q while the consumers work on the current one), else
  /// 1. 1 for the other kernels.
  int prefillQBuffers() const;
  /// Whether the kernel is sm_90a code: warpgroup prefill tiles (warpRows
  /// 64: wgmma, setmaxnreg), which no other architecture runs.
  bool needsSm90a() const;
  /// The architecture to compile the kernel for on a target of `arch`:
  /// sm_90a for sm_90a code on sm_90 (an sm_90 device runs it), else `arch`.
  std::string compileArchFor(const std::string &arch) const;
};

/// A complete CUDA translation unit and the kernels it defines.
struct KernelSource {
  KernelConfig config;
  /// The CUDA source: self-contained, no #include needed.
  std::string code;
  /// extern "C" kernel names defined by `code` (main kernel first).
  std::vector<std::string> kernelNames;
  /// 1-based line in `code` where the generated mod code starts, and its
  /// line count (for mapping compile errors back to the generator's output).
  int modFirstLine = 0;
  int modLineCount = 0;
};

/// Which kernels of `config` a TU holds. The split-KV decode (not MLA) may
/// be compiled as two units: its merge kernel reads no mod code, so the
/// runtime compiles one merge unit per shape (decodeMergeConfig), shared
/// by every mod variant, beside the split kernel's unit instead of inside
/// it (KernelCache::getOrCompileModules). Whole: every kernel of the kind
/// (bundles, `pagedc --emit`).
enum class KernelUnit { Whole, DecodeSplit, DecodeMerge };

/// Whether the runtime compiles `config`'s merge kernel as a unit of its
/// own: the split-KV decode, not MLA decode.
bool hasSeparateMergeUnit(const KernelConfig &config);
/// The configuration of the merge unit that serves `config`'s split
/// kernel: the fields the merge reads (element and output types, value
/// head dim, lse, packed batch and its tokens) kept, the rest set to one
/// value so that mod variants, masks and cache types share it.
KernelConfig decodeMergeConfig(const KernelConfig &config);

/// Builds the TU for `config` around `generatedModCode` (the hooks of
/// templates/Hooks.cuh). Pure string assembly; validates the config. A
/// DecodeMerge unit takes no mod code (pass ""; its config is
/// decodeMergeConfig's); DecodeSplit and DecodeMerge need a config with
/// hasSeparateMergeUnit.
KernelSource assembleKernel(const KernelConfig &config,
                            std::string_view generatedModCode,
                            KernelUnit unit = KernelUnit::Whole);

/// The bytes a kernel with linked mods holds for each of the mods' row
/// values (MaskRow, ScoreRow); a variant whose rows take more is refused
/// by its own unit's static_assert.
constexpr int kLinkedModRowBytes = 32;
/// The Params size a kernel with linked mods is compiled for when the
/// mods' Params take `size` bytes: `size` rounded up to a multiple of 64,
/// so that variants of different Params share the kernel (the host pads
/// the Params it packs to it).
constexpr int64_t linkedParamsCapacity(int64_t size) {
  return size <= 0 ? 64 : (size + 63) / 64 * 64;
}
/// What a kernel with linked mods (KernelConfig::linkedMods) compiles in
/// place of the generated mod code: namespace pagedc_mods with Params as
/// `paramsSize` opaque bytes, row values as opaque bytes, kHasMask /
/// kHasScore as in `modCode`, and hooks that call the extern "C" functions
/// linkedModDefinitions defines (an absent mod is inlined as neutral).
/// Depends on `modCode` through the two flags alone, so one kernel serves
/// every variant with the same mods present. Throws pagedc::Error when
/// `modCode` does not declare the flags.
std::string linkedModHooks(std::string_view modCode, int64_t paramsSize);
/// The generated mod code in a namespace of its own and the extern "C"
/// functions that linkedModHooks's kernel calls, with static_asserts that
/// the Params fit the kernel's `paramsSize` bytes and the row sizes and
/// the flags agree with that kernel.
std::string linkedModDefinitions(std::string_view modCode, int64_t paramsSize);
/// The mods' own unit of a kernel with linked mods: Prelude.cuh and
/// linkedModDefinitions, no kernel (kernelNames: the four functions). Compiled
/// relocatable and linked with the kernel's unit (KernelCache); the
/// emulator compiles linkedModDefinitions into the kernel's unit instead.
KernelSource assembleLinkedMods(const KernelConfig &config, std::string_view generatedModCode);

/// Names of the embedded templates ("Prelude.cuh", "Prefill.cuh",
/// "testing/causal.cuh", ...).
std::vector<std::string> embeddedTemplateNames();
/// The text of an embedded template; throws pagedc::Error for an unknown
/// name. Test seam: when $PAGEDC_TEMPLATE_DIR is set at the first call, a
/// file of the same name in that directory replaces the embedded text for
/// the whole process (a patched Prefill.cuh, say); the cache keys follow
/// the assembled text, so patched kernels never mix with the real ones.
std::string_view embeddedTemplate(std::string_view name);

/// Byte layout of pagedc_mods::Params for a set of declarations, following
/// the rule in templates/Hooks.cuh.
struct ParamsLayout {
  struct Field {
    std::string name;
    int64_t offset = 0;
    int64_t size = 0;
  };
  std::vector<Field> fields;
  int64_t size = 0;
  int64_t alignment = 1;

  static ParamsLayout forDeclarations(const std::vector<ParamDecl> &params,
                                      const std::vector<BufferDecl> &buffers);
  /// Packs the bound values (params then, per buffer, the data pointer, its
  /// first `rank` strides and its first `rank` sizes) into `size` bytes. Buffer data pointers must
  /// be device addresses; strides are in elements.
  std::vector<unsigned char> pack(const std::vector<ParamDecl> &params,
                                  const std::vector<BufferDecl> &buffers,
                                  const PagedcModContext &context) const;
};

} // namespace pagedc

#endif // PAGEDC_KERNELSOURCE_H
