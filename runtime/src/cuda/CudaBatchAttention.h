//===- CudaBatchAttention.h - BatchAttention's CUDA backend ----*- C++ -*-===//
//
// Internal: what BatchAttention keeps for a CUDA device. Built at
// construction (the kernels compiled and loaded, every device buffer
// allocated), filled by plan() (the step's metadata and work lists
// uploaded), launched by run() (the kernels enqueued, nothing allocated,
// nothing synchronised).
//
//===----------------------------------------------------------------------===//
#ifndef PAGEDC_RUNTIME_CUDA_CUDABATCHATTENTION_H
#define PAGEDC_RUNTIME_CUDA_CUDABATCHATTENTION_H

#include "pagedc/BatchAttention.h"
#include "pagedc/CudaAttention.h"
#include "pagedc/KernelArgs.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace pagedc::detail {

/// Sequences with at most this many new tokens go to the decode kernel
/// (built for this many query tokens; the rows of a shorter sequence past
/// its tokens do not exist), longer ones to prefill tiles.
constexpr int kBatchDecodeTokens = 8;
/// The most KV splits of a decode sequence; bounds the split workspace.
constexpr int64_t kBatchMaxDecodeSplits = 16;
/// An entry of more than kBatchDecodeTokens tokens whose key range holds at
/// least this many keys per token goes to the GQA-packed kernel
/// (templates/PrefillGroup.cuh): reading its K/V is then most of its cost,
/// and that kernel reads it once per KV head and splits it over CTAs.
/// Whole prompts and long chunks keep the per-query-head tiles, whose
/// launch has the CTAs to fill the machine without splits.
constexpr int64_t kBatchGroupKeysPerToken = 4;
/// Work tiles of the GQA-packed launch whose partials the split workspace
/// holds at the most splits; more tiles take fewer splits.
constexpr int64_t kBatchGroupPartialTiles = 8;

/// One run() of a planned step, every tensor checked and on the device.
struct CudaBatchCall {
  /// [T', Hq, D]; rows are packed.
  TensorView q;
  /// The caches as the kernels' [Hkv, pages, pageSize, D] views of the
  /// engine's memory (strides only, no copy).
  TensorView kCache, vCache;
  /// [T', Hq, D]; lse [T', Hq] contiguous, or empty (the backend's own).
  TensorView out, lse;
  /// [Hq] f32 attention sinks on the device, or empty (none).
  TensorView sinks;
  /// An 8-bit float cache's scales, [Hkv] each (checkedScales); empty for
  /// a 16-bit cache.
  const std::vector<float> *kScale = nullptr, *vScale = nullptr;
  /// pagedc_mods::Params bytes (ParamsLayout::pack).
  std::vector<unsigned char> params;
  float scale = 1.0f;
  /// A CUstream; null: the legacy default stream.
  void *stream = nullptr;
};

/// Whether a configuration is MLA decode (head_dim 576): the CUDA backend
/// then runs templates/MlaDecode.cuh, decode steps only (at most
/// kBatchDecodeTokens new tokens a sequence).
bool isMlaDecode(const BatchAttentionConfig &config);
/// Throws pagedc::Error unless an MLA configuration is one the kernel takes
/// (value_head_dim 512, num_kv_heads 1, a 16-bit cache), naming the field.
void checkMlaConfig(const BatchAttentionConfig &config);
/// Throws pagedc::Error unless vCache views kCache's memory (the same data
/// pointer and strides), as the MLA kernel reads it.
void checkMlaCaches(const TensorView &kCache, const TensorView &vCache);

class CudaBatchBackend {
public:
  /// Compiles (or takes from the kernel cache) and loads the packed-batch
  /// prefill and decode kernels for `config` and allocates the plan's
  /// device storage, sized by its limits. Throws pagedc::Error naming the
  /// problem.
  CudaBatchBackend(const CompiledMods &mods, const BatchAttentionConfig &config);

  /// Uploads a validated plan of `batch` sequences: queryStart [B + 1],
  /// kvLength, qOffset [B], pageTable [B, maxBlocksPerSeq], kvStart [B],
  /// the token maps tokenPosition and tokenBatch [T] (each null when not
  /// given: q_offset[b] + row and b are uploaded in their place), and the
  /// work lists built from them. `keyBounds`: the mods whose block
  /// classifier bounds each prefill tile's keys (KeyBounds.h), or null
  /// when the plan's tiles keep their sequences' keys.
  void plan(const int32_t *queryStart, const int32_t *kvLength, const int32_t *qOffset,
            const int32_t *pageTable, int64_t batch, const int32_t *kvStart,
            const int32_t *tokenPosition, const int32_t *tokenBatch,
            const CompiledMods *keyBounds);

  /// Enqueues the planned step's kernels on call.stream: the prefill
  /// tiles, the decode splits and their merge (each only when it has work).
  void run(const CudaBatchCall &call) const;

  BatchPlanShape planShape() const;
  /// Copies an 8-bit cache's pair of scales ([Hkv] each, checked) to the
  /// device now, synchronously, unless an earlier call or run() did: a
  /// run() given it afterwards copies nothing.
  void uploadScales(const std::vector<float> &kScale, const std::vector<float> &vScale) const;
  /// The K and V cache addresses the last run() passed its kernels.
  std::pair<const void *, const void *> lastCacheAddresses() const;

private:
  BatchAttentionConfig config_;
  /// Ints of a prefill tile in the work list: sequence, first row, first
  /// key, end of keys (templates/KernelCommon.cuh, packed_prefill_tile).
  static constexpr int kPrefillTileInts = PAGEDC_PACKED_PREFILL_TILE_INTS;
  std::shared_ptr<const CudaKernel> prefill_, decode_, group_;
  int64_t maxPrefillTiles_ = 0, maxSplits_ = 1, maxGroupTiles_ = 0, groupPartialRows_ = 0;
  /// BatchAttentionConfig::fixedGrid's decode split count.
  int64_t fixedSplits_ = 1;
  /// The decode split count of `decodeSeqs` sequences whose longest
  /// context has `maxDecodeKv` keys and whose longest step has
  /// `maxDecodeTokens` new tokens (at most maxSplits_).
  int64_t decodeSplits(int64_t decodeSeqs, int64_t maxDecodeKv, int64_t maxDecodeTokens) const;
  // One allocation of int32 words: page table [maxNumSeqs,
  // maxBlocksPerSeq], kv_len and q_offset [maxNumSeqs], q_start
  // [maxNumSeqs + 1], the prefill tiles [maxPrefillTiles, 4], the decode
  // list [maxNumSeqs, 2], kv_start [maxNumSeqs], the token positions and
  // batch indices [maxNumTokens] each, a fixed grid's work counts [2]
  // (prefill tiles, decode sequences), the GQA-packed tiles
  // [maxGroupTiles, 2]; then f32: the lse the kernels write when the caller
  // wants none [maxNumTokens, Hq], the decode splits' partial lse
  // [maxNumSeqs, kBatchDecodeTokens, Hq, maxSplits] and outputs [..., D];
  // the GQA-packed splits' partial lse [groupPartialRows] and outputs
  // [..., D].
  DeviceBuffer storage_;
  size_t kvLenAt_ = 0, qOffsetAt_ = 0, qStartAt_ = 0, prefillAt_ = 0, decodeAt_ = 0;
  size_t kvStartAt_ = 0, tokenPositionAt_ = 0, tokenBatchAt_ = 0, workCountsAt_ = 0, groupAt_ = 0;
  size_t lseAt_ = 0, partialLseAt_ = 0, partialOutAt_ = 0;
  size_t groupPartialLseAt_ = 0, groupPartialOutAt_ = 0;
  // The plan.
  int64_t batch_ = 0, prefillTiles_ = 0, decodeSeqs_ = 0, splits_ = 1;
  int64_t groupTiles_ = 0, groupSplits_ = 1;
  int32_t maxKvLength_ = 1;
  // Sized at construction: the prefill tiles in step order, their weights,
  // the heaviest-first order and the tiles in that order (uploaded); the
  // decode list.
  std::vector<int32_t> tiles_, ordered_, order_, decodeList_;
  // The GQA-packed tiles (sequence, first row), heaviest first, and their
  // keys.
  std::vector<int32_t> groupList_, groupOrder_, groupOrdered_;
  std::vector<int64_t> groupKeys_;
  /// Writes entry b's GQA-packed tiles (qLength tokens, `keys` keys) to
  /// groupList_ from tile `first` on; returns their count.
  int64_t addGroupTiles(int64_t b, int32_t qLength, int64_t keys, int64_t first);
  /// Orders a plan's `tiles` GQA-packed tiles heaviest first into
  /// groupOrdered_ and returns their splits, for `longestKeys` keys at the
  /// most.
  int64_t finishGroupTiles(int64_t tiles, int64_t longestKeys);
  // [maxNumTokens]: the token maps of a plan given none.
  std::vector<int32_t> defaultPosition_, defaultBatch_;
  std::vector<int64_t> weight_;
  mutable std::mutex lastMutex_;
  mutable const void *lastK_ = nullptr, *lastV_ = nullptr;
  /// An 8-bit cache's K and V scales as the kernels read them ([Hkv] f32
  /// each, K's then V's): each distinct pair a run() passes is uploaded
  /// once into the next free slot of scaleStorage_ (kMaxScaleSets slots,
  /// allocated at construction) and never changed after, so a kernel still
  /// in flight, or a captured graph, keeps reading the scales it was given.
  /// The slot of a pair is found again by its bits. A new pair while
  /// `stream` is being captured into a CUDA graph is refused (the copy is
  /// not allowed there) with what to do instead.
  const float *scalesFor(const std::vector<float> &kScale, const std::vector<float> &vScale,
                         void *stream) const;
  mutable DeviceBuffer scaleStorage_;
  mutable std::mutex scaleMutex_;
  mutable std::vector<std::vector<float>> scaleSets_;
};

} // namespace pagedc::detail

#endif // PAGEDC_RUNTIME_CUDA_CUDABATCHATTENTION_H
