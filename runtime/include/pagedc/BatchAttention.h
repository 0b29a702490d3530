//===- BatchAttention.h - The serving engine's batch call ------*- C++ -*-===//
//
// BatchAttention runs one step of a serving engine: a packed batch of query
// tokens in which every sequence brings its own number of new tokens (1 for
// decode, a few for speculative verification, a chunk or a whole prompt for
// prefill), against K/V pages in the layout the engine owns, through the
// engine's own block table. It is split like the engines' own backends:
// plan() takes the step's host metadata and checks it once; run() computes.
// Limits fixed at construction size everything plan() keeps, so a plan never
// allocates.
//
// On a CUDA device (the SIMT emulator included) plan() splits the step by
// new tokens: sequences of 1 to 8 (decode, speculative verification) go to
// the packed-batch decode kernel, one CTA per KV head (and split) of each,
// computing every query head of the GQA group and every token at once so
// each K/V page is read once; when the longest such context needs more
// CTAs than the sequences give, the keys are split (split-KV, up to 16
// parts) and a merge launch combines the parts by their lse. Longer
// sequences go to the packed-batch prefill kernel as a work list of
// (sequence, 64-row query tile) entries, heaviest first, unless their keys
// number 4 per token or more (a cascade's prefix level): those go to the
// GQA-packed kernel, whose CTA serves every query head of a KV head (128
// rows of (token, head)) and whose keys are split over CTAs. A step is then
// at most five launches (prefill, the GQA-packed tiles, their merge,
// decode, its merge), each only when it has work; a sequence with no new
// tokens is in no list. plan() uploads
// the lists and metadata into device storage allocated at construction,
// where the kernels are compiled and loaded too; run() only enqueues them.
// K/V are read in place through the layout's (head, page, slot) strides
// with cp.async gathers (the tensor-map copies need flexAttention's compact
// pages). The mask is evaluated per element over every key tile a
// sequence, or a prefill tile of its rows, reads: from the tile that holds
// its kv_start to kv_len, or fewer where plan() proved the rest masked with
// the mask's block classifier; rows below the first key are neither read
// nor kept,
// and the token maps give each packed row its own position and batch index
// (cascade levels). Caches of 8-bit floats (BatchAttentionConfig::kvDtype)
// are gathered as codes and converted to dtype in shared memory after each
// tile's copy, their scales applied in f32. The output is dtype or, with
// BatchAttentionConfig::outDtype F32, f32 (the epilogues store the f32
// values they hold).
//
// mergeState() and its in-place and N-way forms combine attention results
// over disjoint key ranges by their logsumexp (cascade and shared-prefix
// attention, split KV).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_BATCHATTENTION_H
#define PAGEDC_BATCHATTENTION_H

#include "pagedc/Attention.h"
#include "pagedc/Mods.h"
#include "pagedc/Tensor.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pagedc {

/// How the engine lays out its paged K/V cache ("page" = an engine's block).
enum class KVLayout : uint8_t {
  /// K and V apart, each [Hkv, pages, pageSize, D] (PagedKVCache's own).
  Pagedc,
  /// K and V apart, each [pages, pageSize, Hkv, D] (FlashInfer's "NHD").
  NHD,
  /// K and V apart, each [pages, Hkv, pageSize, D] (FlashInfer's "HND").
  HND,
  /// One tensor [2, pages, pageSize, Hkv, D], K at index 0 and V at 1
  /// (vLLM's cache); passed as the K cache, with no V cache.
  VLLM,
};

/// "pagedc", "NHD", "HND", "vllm".
const char *kvLayoutName(KVLayout layout);
/// The layout a name spells (the names above, case-insensitive). Throws
/// pagedc::Error listing the valid names for any other.
KVLayout parseKVLayout(const std::string &name);

/// What a BatchAttention is built for; the limits bound every plan.
struct BatchAttentionConfig {
  int64_t numQHeads = 0;
  int64_t numKVHeads = 0;
  /// Key head dim D; the value head dim Dv (0 = D). CUDA: D = Dv, or MLA
  /// decode: D 576 and Dv 512 with numKVHeads 1, run()'s vCache a view of
  /// kCache (its first 512 columns) and at most 8 new tokens a sequence
  /// (docs/serving.md, "MLA decode").
  int64_t headDim = 0;
  int64_t valueHeadDim = 0;
  /// Tokens per page, 1 or more.
  int64_t pageSize = 16;
  KVLayout layout = KVLayout::Pagedc;
  /// Most sequences and packed tokens a step may hold, and most pages one
  /// sequence may use (the block table's useful columns).
  int64_t maxNumSeqs = 0;
  int64_t maxNumTokens = 0;
  int64_t maxBlocksPerSeq = 0;
  /// Where run() computes: the CPU or a CUDA device.
  Device device = Device::cpu();
  /// CUDA: the element type of q, the caches and out, bf16 or f16 (the
  /// kernels are built for it at construction). The CPU backend ignores it
  /// and takes q's type at run().
  DType dtype = DType::BF16;
  /// CUDA: the caches hold 8-bit floats of this type (F8E4M3, F8E5M2; every
  /// CUDA head dim), read with run()'s kScale and vScale and computed on as
  /// dtype; unset: they hold dtype. The kernels are built for it at
  /// construction. The CPU backend ignores it and takes the caches' types
  /// (and BatchRunOptions::kvDtype) at run().
  std::optional<DType> kvDtype;
  /// CUDA: out's element type, F32 or unset (dtype); the kernels are built
  /// for it at construction. The CPU backend ignores it and takes out's
  /// type at run().
  std::optional<DType> outDtype;
  /// CUDA: plan every step onto one fixed set of launches whose grids
  /// depend only on the limits above (a CTA per prefill tile the limits
  /// allow, one per sequence and KV head for decode, a split count chosen
  /// once from maxNumSeqs and maxBlocksPerSeq), so that a run() captured
  /// into a CUDA graph replays correctly after any later plan() (any batch
  /// composition within the limits); the kernels read the step's work
  /// counts from device memory and CTAs without work exit at once. Costs
  /// idle CTAs, and the decode split count no longer adapts to the step
  /// (docs/serving.md, "Under a CUDA graph"). Unset: each plan() sizes its
  /// launches to its step, and a captured graph is valid only for plans of
  /// the same planShape(). The CPU backend ignores it.
  bool fixedGrid = false;
  /// CPU worker threads; 0 = every core, or the calling thread alone when
  /// the call is too small to gain from more.
  int threads = 0;
};

/// Per-step settings of BatchAttention::run().
struct BatchRunOptions {
  /// Multiplies q.k before the score mod (default 1/sqrt(D)).
  std::optional<float> scale;
  /// Also return the natural-log logsumexp [T, Hq] (f32).
  bool returnLse = false;
  /// Optional output [T, Hq, Dv]; default-constructed: the result owns a new
  /// tensor of q's dtype. CUDA: required, of the configured outDtype (or
  /// dtype).
  TensorView out;
  /// Optional lse output [T, Hq] f32; giving one implies returnLse.
  TensorView lse;
  /// Attention sinks (default-constructed: none): an f32 tensor [Hq] on the
  /// call's device. Query head h's softmax gains one extra key whose logit is
  /// sinks[h] (in the units of the scores after scale and score mod) and
  /// whose value is zero: the weights of a row sum to less than 1, lse
  /// includes the sink, and a fully masked row gives out 0 and lse sinks[h].
  TensorView sinks;
  /// Caches of 8-bit floats (F8E4M3, F8E5M2): the scale of K and of V, one
  /// value or one per KV head (finite, > 0); a code c of head h means
  /// c * kScale[h]. Required for such caches, refused for others. CUDA:
  /// each distinct pair is copied to the device once, by
  /// BatchAttention::uploadScales() or the first run() given it
  /// (synchronously), into storage of 256 pairs allocated at construction,
  /// and never changed after; a run() captured into a CUDA graph must be
  /// given a pair already copied (otherwise it throws pagedc::Error).
  std::vector<float> kScale, vScale;
  /// Reads caches held as u8 tensors as this 8-bit float type.
  std::optional<DType> kvDtype;
  /// CUDA: the CUstream run() enqueues on (null: the legacy default
  /// stream); run() returns without waiting for the kernels.
  void *stream = nullptr;
};

/// What a planned step launches on CUDA (BatchAttention::planShape()).
/// With BatchAttentionConfig::fixedGrid: the limits' grids, the same for
/// every plan.
struct BatchPlanShape {
  /// Query tiles of the prefill launch (each one CTA per query head).
  int64_t prefillTiles = 0;
  /// Sequences of the decode launch, and the KV splits of each (0 without
  /// decode work; more than 1: a merge launch follows).
  int64_t decodeSequences = 0;
  int64_t decodeSplits = 0;
  /// Tiles of the GQA-packed launch (entries of more than 8 tokens whose
  /// key range holds 4 keys per token or more: a cascade's prefix level;
  /// 128 rows of (token, query head) each), each one CTA per KV head and
  /// split, and their splits (0 without such entries; more than 1: a merge
  /// launch follows).
  int64_t groupTiles = 0;
  int64_t groupSplits = 0;
};

namespace detail {
class CudaBatchBackend;
} // namespace detail

/// One serving step's attention: packed queries of several sequences,
/// planned once and run against the engine's cache.
///
/// Sequence b brings q_len_b = queryStartLoc[b + 1] - queryStartLoc[b] new
/// tokens (rows queryStartLoc[b] .. of the packed q) and has seqLens[b] keys
/// in all, its new tokens included, so its token i sits at position
/// seqLens[b] - q_len_b + i. Mods see that position as q, the logical key
/// index as kv, the query head and b as the batch index: a buffer captured
/// per sequence is indexed by b. The mask mod's block classifier (when the
/// compiler gave one) skips or fully keeps whole key tiles for exactly the
/// rows of a tile, so no block mask is built for the whole square. A fully
/// masked row gives out 0 and lse -inf; a sequence with no new tokens costs
/// nothing.
class BatchAttention {
public:
  /// Checks the configuration (heads, dims, page size, limits, device) and
  /// sizes the plan's storage. Throws pagedc::Error naming the field.
  /// On CUDA it also compiles (or takes from the kernel cache) and loads
  /// the kernels and allocates the plan's device storage.
  BatchAttention(const CompiledMods &mods, const BatchAttentionConfig &config);
  ~BatchAttention();
  BatchAttention(BatchAttention &&) noexcept;
  BatchAttention &operator=(BatchAttention &&) noexcept;

  const BatchAttentionConfig &config() const { return config_; }

  /// Takes one step's metadata, all int32 on the host:
  ///   queryStartLoc [B + 1]: starts at 0, non-decreasing, B <= maxNumSeqs,
  ///     T = queryStartLoc[B] <= maxNumTokens;
  ///   seqLens [B]: seqLens[b] >= q_len_b, at most maxBlocksPerSeq pages;
  ///   blockTable [>= B, columns]: row b's first ceil(seqLens[b] / pageSize)
  ///     entries are the sequence's pages (0 or more; run() checks them
  ///     against the cache's page count).
  ///   kvStart, kvEnd [B] (optional, empty = 0 and seqLens): sequence b
  ///     attends only to keys [kvStart[b], kvEnd[b]), 0 <= kvStart[b] <=
  ///     kvEnd[b] <= seqLens[b]; query positions still come from seqLens.
  ///     Two plans over a shared prefix [0, P) and the rest [P, seqLens[b])
  ///     give results whose mergeState() is attention over all the keys.
  ///   tokenPositions, tokenBatch [T] (optional): the query
  ///     position and the batch index the mods see for each packed token,
  ///     in place of seqLens[b] - q_len_b + i and b; positions >= 0, batch
  ///     indices >= 0. With positions given, seqLens[b] need not cover the
  ///     entry's tokens. This is a cascade level: the queries of sequences
  ///     that share a prefix, packed as one entry whose block table row is
  ///     the prefix's pages, read those pages once for the whole group,
  ///     while each query keeps its own position and sequence index
  ///     (docs/serving.md, "Cascade").
  /// Where the mask has a block classifier (CompiledMods::maskBlockClass,
  /// from the JIT) and reads no params, buffers or head — a causal or
  /// sliding-window mask with a constant window — and no token maps are
  /// given, plan() starts each sequence's keys at the first 64-key granule
  /// from kv_start that a row of its new tokens may keep, and on CUDA bounds
  /// each 64-row prefill tile's keys the same way at both ends: a sliding
  /// window reads its window, not the whole context, a causal prompt's tile
  /// the keys up to its last row, and the result is the same (the keys left
  /// out are masked for every row).
  /// Every check comes first: a bad argument throws pagedc::Error naming it
  /// and the previous plan stays in force. On CUDA plan() uploads the step
  /// (synchronously, so the host arguments may change once it returns).
  void plan(const TensorView &queryStartLoc, const TensorView &seqLens,
            const TensorView &blockTable, const TensorView &kvStart = {},
            const TensorView &kvEnd = {}, const TensorView &tokenPositions = {},
            const TensorView &tokenBatch = {});

  /// Whether plan() has succeeded at least once.
  bool planned() const { return planned_; }
  /// The planned step's sequences B and packed tokens T.
  int64_t numSeqs() const { return numSeqs_; }
  int64_t numTokens() const { return numTokens_; }
  /// The keys [keyBegin, keyEnd) run() reads for sequence b of the plan
  /// (b < numSeqs()): kv_start and kv_end (0 and seq_lens by default), or
  /// from a later key where the mask's block classifier proves every key
  /// before it masked for all of the sequence's new tokens (plan(), below).
  int32_t keyBegin(int64_t b) const;
  int32_t keyEnd(int64_t b) const;

  /// Attention of the planned step. q is [T', Hq, D] with T' >= T (rows
  /// past T are neither read nor written); kCache and vCache are views of
  /// the engine's cache in the configured layout (vCache default-constructed
  /// for KVLayout::VLLM), read in place through their strides. out is
  /// [T', Hq, Dv]; lse [T', Hq]. Every shape, dtype, device and stride is
  /// checked first: a mismatch throws pagedc::Error naming the argument and
  /// nothing is written. On CUDA every tensor is on the device, of the
  /// configured dtype, with a contiguous last dimension and strides of
  /// whole 16-byte chunks (q, caches; out: even strides), lse contiguous;
  /// out is required (run() allocates nothing there), and run() enqueues
  /// the kernels on options.stream and returns.
  AttentionResult run(const TensorView &q, const TensorView &kCache, const TensorView &vCache,
                      const Bindings &bindings, const BatchRunOptions &options = {}) const;

  /// CUDA: what the plan launches; zeros on the CPU.
  BatchPlanShape planShape() const;

  /// An 8-bit cache's scales (BatchRunOptions::kScale, vScale: one value or
  /// one per KV head, finite, > 0), checked, and on CUDA copied to the
  /// device now (synchronously) unless an earlier call or run() did; a
  /// run() given them afterwards copies nothing, so it may be captured into
  /// a CUDA graph (a run() that would copy a new pair inside a capture is
  /// refused). Call it once per layer's pair before capturing; it counts
  /// against the 256 pairs one BatchAttention keeps. Throws pagedc::Error
  /// naming the argument for bad scales, or on CUDA when the caches are
  /// not 8-bit (kvDtype unset). The CPU backend reads the scales at run()
  /// and only checks them here.
  void uploadScales(const std::vector<float> &kScale, const std::vector<float> &vScale) const;

  /// CUDA: the K and V cache addresses the last run() gave its kernels
  /// (the engine's memory, read in place); nulls before a run and on the
  /// CPU.
  std::pair<const void *, const void *> kernelCacheAddresses() const;

private:
  CompiledMods mods_;
  BatchAttentionConfig config_;
  bool planned_ = false;
  int64_t numSeqs_ = 0, numTokens_ = 0;
  int32_t maxPageEntry_ = -1;
  // Sized by the limits at construction; plan() fills them.
  std::vector<int32_t> queryStart_; // [maxNumSeqs + 1]
  std::vector<int32_t> kvBegin_;    // [maxNumSeqs]
  std::vector<int32_t> kvLength_;   // [maxNumSeqs], the end of the keys read
  std::vector<int32_t> qOffset_;    // [maxNumSeqs]
  std::vector<int32_t> pageTable_;  // [maxNumSeqs, maxBlocksPerSeq]
  // [maxNumTokens] each, when the plan was given them.
  std::vector<int32_t> tokenPosition_, tokenBatch_;
  bool tokenPositions_ = false, tokenBatches_ = false;
  std::unique_ptr<detail::CudaBatchBackend> cuda_; // CUDA devices only
};

//===----------------------------------------------------------------------===//
// Merging partial results
//===----------------------------------------------------------------------===//

/// Where and how the merge calls run on a CUDA device.
struct MergeStateOptions {
  /// CUDA: the CUstream the merge is enqueued on; the call returns without
  /// waiting for it. Null: the legacy default stream, and the call waits
  /// for the merge to end. The CPU ignores it.
  void *stream = nullptr;
};

/// Combines two attention results over disjoint key sets of the same query
/// rows: vA, vB [T, H, D] (f32, bf16 or f16) and their natural-log
/// logsumexps sA, sB [T, H] (f32) give s = log(exp(sA) + exp(sB)) and
/// v = exp(sA - s) vA + exp(sB - s) vB; rows where both are -inf give
/// v 0 and s -inf. Writes vOut [T, H, D] (f32, bf16 or f16) and sOut
/// [T, H] f32, which may alias vA / sA exactly. It runs where vA is: on the
/// CPU, or on a CUDA device (the SIMT emulator included) when every tensor
/// is in that device's memory, enqueued on options.stream. Inputs are
/// checked first (shapes, dtypes, one device, strides); a mismatch throws
/// pagedc::Error naming the argument and nothing is written.
void mergeState(const TensorView &vA, const TensorView &sA, const TensorView &vB,
                const TensorView &sB, const TensorView &vOut, const TensorView &sOut,
                const MergeStateOptions &options = {});

/// mergeState() into new tensors (v of vA's dtype, s f32); CPU tensors
/// only (a device merge writes into the caller's vOut and sOut).
AttentionResult mergeState(const TensorView &vA, const TensorView &sA, const TensorView &vB,
                           const TensorView &sB);

/// mergeState() of (v, s) with (vOther, sOther), written into v and s.
void mergeStateInPlace(const TensorView &v, const TensorView &s, const TensorView &vOther,
                       const TensorView &sOther, const MergeStateOptions &options = {});

/// N-way merge: v [T, N, H, D] and s [T, N, H] hold N partial results per
/// row; writes their merge to vOut [T, H, D] and sOut [T, H], on the CPU or
/// the device that holds v (as mergeState()).
void mergeStates(const TensorView &v, const TensorView &s, const TensorView &vOut,
                 const TensorView &sOut, const MergeStateOptions &options = {});

} // namespace pagedc

#endif // PAGEDC_BATCHATTENTION_H
