//===- CudaBatchAttention.cpp - BatchAttention's CUDA backend -------------===//
//
// A step splits by new tokens: sequences of up to kBatchDecodeTokens go to
// the packed-batch decode kernel (one CTA per KV head and split of each,
// every query head of the GQA group and every token in its rows, so each
// K/V page is read once per split; split-KV with a merge launch when the
// longest such context needs more CTAs than the sequences give), longer
// ones to the packed-batch prefill kernel's (sequence, query tile) work
// list. At most five launches (prefill, the GQA-packed tiles and their
// merge, decode and its merge), each only when it has work; a sequence
// with no new tokens is in no list.
//
// Entries of more than kBatchDecodeTokens tokens whose keys outnumber their
// tokens kBatchGroupKeysPerToken times or more (a cascade's prefix level,
// a short chunk at the end of a long context) go to the GQA-packed kernel
// instead (templates/PrefillGroup.cuh): its CTA's rows are (token, query
// head) pairs of one KV head, so the entry's K/V is read once per KV head
// and row tile rather than once per query head, and its keys are split
// over CTAs (a merge launch of its own) so that few entries still fill the
// machine.
//
//===----------------------------------------------------------------------===//
#include "cuda/CudaBatchAttention.h"
#include "KeyBounds.h"
#include "cuda/CudaAttention.h"
#include "cuda/CudaGraph.h"

#include "pagedc/CudaLaunch.h"
#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"
#include "pagedc/KernelSource.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace pagedc::detail {

namespace {

/// A split covers at least this many keys when the context has them (as
/// planAttention's splits): shorter ones cost more in merging than they
/// gain in parallelism.
constexpr int64_t kMinSplitKeys = 256;
/// Distinct pairs of K and V scales of an 8-bit cache one BatchAttention
/// takes (scalesFor): more than the layers of any model, each of which
/// keeps its own pair.
constexpr size_t kMaxScaleSets = 256;

KernelConfig packedBatchConfig(const CompiledMods &mods, const BatchAttentionConfig &c,
                               KernelKind kind) {
  KernelConfig config;
  config.kind = kind;
  config.elementType = c.dtype;
  // 8-bit codes: converted to elementType in shared memory after each
  // tile's copy (Float8Tiles.cuh), as flexAttention's kernels do.
  config.kvFloat8 = c.kvDtype;
  config.outputF32 = c.outDtype == DType::F32;
  config.headDim = static_cast<int>(c.headDim);
  config.valueHeadDim = static_cast<int>(c.valueHeadDim);
  config.pageSize = static_cast<int>(c.pageSize);
  if (kind == KernelKind::Prefill) {
    // 64-row query tiles with 16 rows per warp, 64 keys per KV tile (32
    // above head dim 128): choosePrefillShape's spill-free shapes above
    // head dim 64; at 64 its 128-row tile would leave more of a short
    // chunk's tile empty. mma.sync tiles on every target: the warpgroup
    // prefill has no work-list path.
    config.blockM = 64;
    config.warpRows = 16;
    config.blockN = c.headDim > 128 ? 32 : 64;
    // Above head dim 128 the mods' row values are computed again for each
    // KV tile rather than held: the per-row batch index of a cascade level
    // leaves no registers for them (ptxas spilled otherwise).
    config.recomputeModRows = c.headDim > 128;
    config.groupSize = 1; // prefill reads the GQA ratio at run time
  } else {
    config.blockN = 64;
    config.groupSize = static_cast<int>(c.numQHeads / c.numKVHeads);
    config.queryTokens = kBatchDecodeTokens;
  }
  // Always with lse: a call that wants none gets it written to the
  // backend's own buffer, so one kernel serves both.
  config.returnLse = true;
  config.paramsSize = ParamsLayout::forDeclarations(mods.params, mods.buffers).size;
  config.packedBatch = true;
  // A packed batch never binds a block mask (its mods mask per element):
  // the kernels are compiled without those paths.
  config.noBlockMask = true;
  config.validate();
  return config;
}

/// The GQA-packed kernel's configuration: 8 warps of 32 rows up to head
/// dim 128 (256 rows: the 64 tokens of a group of 4 share each copy of a
/// K/V tile), of 16 rows above (KernelConfig::chooseGroupRowsShape,
/// templates/PrefillGroup.cuh).
KernelConfig groupRowsConfig(const CompiledMods &mods, const BatchAttentionConfig &c) {
  KernelConfig config = packedBatchConfig(mods, c, KernelKind::Prefill);
  config.groupRows = true;
  config.chooseGroupRowsShape();
  config.groupSize = static_cast<int>(c.numQHeads / c.numKVHeads);
  config.validate();
  return config;
}

size_t ints(int64_t count) { return static_cast<size_t>(count); }

} // namespace

bool isMlaDecode(const BatchAttentionConfig &c) {
  return c.headDim == KernelConfig::kMlaKeyDim;
}

void checkMlaConfig(const BatchAttentionConfig &c) {
  const char *takes = "the MLA decode kernel (head_dim 576) takes value_head_dim 512, "
                      "num_kv_heads 1 and 16-bit latent caches (dtype bf16 or f16)";
  if (c.valueHeadDim != KernelConfig::kMlaValueDim)
    throw Error(fmt::format("value_head_dim {} on CUDA: {}", c.valueHeadDim, takes));
  if (c.numKVHeads != 1)
    throw Error(fmt::format("num_kv_heads {} on CUDA: {}", c.numKVHeads, takes));
  if (c.kvDtype)
    throw Error(fmt::format("kv_dtype {} on CUDA: {}", dtypeName(*c.kvDtype), takes));
}

void checkMlaCaches(const TensorView &kCache, const TensorView &vCache) {
  if (vCache.data() != kCache.data() || vCache.strides() != kCache.strides())
    throw Error("v_cache must be a view of k_cache on CUDA at head_dim 576: the MLA decode "
                "kernel reads the values as the first 512 columns of the latent rows "
                "(k_cache[..., :512]: the same data pointer and strides)");
}

CudaBatchBackend::CudaBatchBackend(const CompiledMods &mods, const BatchAttentionConfig &config)
    : config_(config) {
  const BatchAttentionConfig &c = config_;
  if (c.dtype != DType::BF16 && c.dtype != DType::F16)
    throw Error(fmt::format("dtype must be bf16 or f16 on CUDA but is {}", dtypeName(c.dtype)));
  const bool mla = isMlaDecode(c);
  if (mla)
    checkMlaConfig(c);
  else if (!isCudaHeadDim(c.headDim))
    throw Error(fmt::format("head_dim on CUDA must be one of the {}, or {} (MLA decode), but is {}",
                            cudaHeadDimsText(), KernelConfig::kMlaKeyDim, c.headDim));
  if (!mla && c.valueHeadDim != c.headDim)
    throw Error(
        fmt::format("value_head_dim {} must equal head_dim {} on CUDA", c.valueHeadDim, c.headDim));
  if ((c.pageSize & (c.pageSize - 1)) != 0 || c.pageSize > 1024)
    throw Error(
        fmt::format("page_size must be a power of two in [1, 1024] on CUDA but is {}", c.pageSize));
  if (c.outDtype && *c.outDtype != DType::F32 && *c.outDtype != c.dtype)
    throw Error(fmt::format("out_dtype on CUDA must be f32, {} (dtype) or unset but is {}",
                            dtypeName(c.dtype), dtypeName(*c.outDtype)));
  if (c.kvDtype && !isFloat8(*c.kvDtype))
    throw Error(fmt::format("kv_dtype must be an 8-bit float type (f8e4m3, f8e5m2) or unset "
                            "(the caches hold dtype) but is {}",
                            dtypeName(*c.kvDtype)));
  std::string reason;
  if (!CudaDriver::available(&reason))
    throw Error(
        fmt::format("BatchAttention on {} is not available: {}", deviceName(c.device), reason));
  // MLA decode has no prefill kernel: plan() refuses longer sequences.
  if (!mla)
    prefill_ =
        cudaKernelFor(mods, packedBatchConfig(mods, c, KernelKind::Prefill), c.device.index);
  decode_ = cudaKernelFor(mods, packedBatchConfig(mods, c, KernelKind::Decode), c.device.index);
  // The GQA-packed tiles' count and split count vary with the step, which
  // a fixed grid must not: its steps run those entries on the per-query-head
  // tiles. MLA decode has no prefill path at all.
  if (!mla && !c.fixedGrid)
    group_ = cudaKernelFor(mods, groupRowsConfig(mods, c), c.device.index);

  // Prefill tiles: whole tiles of the tokens, plus one partial tile per
  // prefill sequence (which has more than kBatchDecodeTokens tokens).
  const int64_t rows = prefill_ ? prefill_->config.blockM : 64;
  maxPrefillTiles_ = std::max<int64_t>(
      c.maxNumTokens / rows + std::min(c.maxNumSeqs, c.maxNumTokens / (kBatchDecodeTokens + 1)), 1);
  if (maxPrefillTiles_ * c.numQHeads > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("max_num_tokens {} and max_num_seqs {} allow {} query tiles x {} "
                            "heads, more CTAs than a grid holds (2^31 - 1)",
                            c.maxNumTokens, c.maxNumSeqs, maxPrefillTiles_, c.numQHeads));
  // Splits: as many as the longest context's minimum split length allows.
  maxSplits_ =
      std::clamp<int64_t>(c.maxBlocksPerSeq * c.pageSize / kMinSplitKeys, 1, kBatchMaxDecodeSplits);
  // A fixed grid splits every step as the cost model splits the fullest
  // one the limits allow (every sequence decoding at the longest context):
  // an engine captures one graph per batch size, whose limits are then
  // that step's.
  if (c.fixedGrid)
    fixedSplits_ = decodeSplits(c.maxNumSeqs, c.maxBlocksPerSeq * c.pageSize, kBatchDecodeTokens);
  // GQA-packed tiles: whole tiles of the rows (tokens x group), plus one
  // partial tile per entry of more than kBatchDecodeTokens tokens.
  if (group_) {
    const int64_t groupRows = group_->config.blockM;
    maxGroupTiles_ =
        std::max<int64_t>(c.maxNumTokens * group_->config.groupSize / groupRows +
                              std::min(c.maxNumSeqs, c.maxNumTokens / (kBatchDecodeTokens + 1)),
                          1);
    groupPartialRows_ = c.numKVHeads * groupRows * maxSplits_ *
                        std::min<int64_t>(maxGroupTiles_, kBatchGroupPartialTiles);
  }
  kvLenAt_ = ints(c.maxNumSeqs * c.maxBlocksPerSeq);
  qOffsetAt_ = kvLenAt_ + ints(c.maxNumSeqs);
  qStartAt_ = qOffsetAt_ + ints(c.maxNumSeqs);
  prefillAt_ = qStartAt_ + ints(c.maxNumSeqs + 1);
  decodeAt_ = prefillAt_ + ints(kPrefillTileInts * maxPrefillTiles_);
  kvStartAt_ = decodeAt_ + ints(2 * c.maxNumSeqs);
  tokenPositionAt_ = kvStartAt_ + ints(c.maxNumSeqs);
  tokenBatchAt_ = tokenPositionAt_ + ints(c.maxNumTokens);
  workCountsAt_ = tokenBatchAt_ + ints(c.maxNumTokens);
  groupAt_ = workCountsAt_ + 2;
  // (f32 after int32: 4-byte aligned.)
  lseAt_ = groupAt_ + ints(2 * maxGroupTiles_);
  const int64_t partialRows = c.maxNumSeqs * kBatchDecodeTokens * c.numQHeads * maxSplits_;
  partialLseAt_ = lseAt_ + ints(c.maxNumTokens * c.numQHeads);
  partialOutAt_ = partialLseAt_ + ints(partialRows);
  groupPartialLseAt_ = partialOutAt_ + ints(partialRows * c.headDim);
  groupPartialOutAt_ = groupPartialLseAt_ + ints(groupPartialRows_);
  storage_ =
      DeviceBuffer((groupPartialOutAt_ + ints(groupPartialRows_ * c.headDim)) * 4, c.device.index);
  if (c.kvDtype)
    scaleStorage_ = DeviceBuffer(kMaxScaleSets * ints(2 * c.numKVHeads) * 4, c.device.index);
  tiles_.assign(ints(kPrefillTileInts * maxPrefillTiles_), 0);
  ordered_.assign(ints(kPrefillTileInts * maxPrefillTiles_), 0);
  order_.assign(ints(maxPrefillTiles_), 0);
  weight_.assign(ints(maxPrefillTiles_), 0);
  decodeList_.assign(ints(2 * c.maxNumSeqs), 0);
  groupList_.assign(ints(2 * maxGroupTiles_), 0);
  groupOrdered_.assign(ints(2 * maxGroupTiles_), 0);
  groupOrder_.assign(ints(maxGroupTiles_), 0);
  groupKeys_.assign(ints(maxGroupTiles_), 0);
  defaultPosition_.assign(ints(c.maxNumTokens), 0);
  defaultBatch_.assign(ints(c.maxNumTokens), 0);
}

void CudaBatchBackend::plan(const int32_t *queryStart, const int32_t *kvLength,
                            const int32_t *qOffset, const int32_t *pageTable, int64_t batch,
                            const int32_t *kvStart, const int32_t *tokenPosition,
                            const int32_t *tokenBatch, const CompiledMods *keyBounds) {
  const BatchAttentionConfig &c = config_;
  const int rows = prefill_ ? prefill_->config.blockM : 64;
  // The prefill tiles, heaviest first (the keys a tile's last row may see:
  // under a causal mask, what it costs), so that light tiles fill the
  // launch's tail; the decode list, and its longest context.
  int64_t tiles = 0, decodeSeqs = 0, groupTiles = 0, maxGroupKeys = 0;
  int32_t maxKv = 1, maxDecodeKv = 0, maxDecodeTokens = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t qLength = queryStart[b + 1] - queryStart[b];
    maxKv = std::max(maxKv, kvLength[b]);
    if (qLength == 0)
      continue;
    // The keys the kernels visit: from the tile that holds kv_start.
    const int32_t firstKey = kvStart[b] / kDecodeKvTile * kDecodeKvTile;
    if (qLength <= kBatchDecodeTokens) {
      decodeList_[2 * decodeSeqs] = static_cast<int32_t>(b);
      decodeList_[2 * decodeSeqs + 1] = 0;
      ++decodeSeqs;
      maxDecodeKv = std::max(maxDecodeKv, kvLength[b] - firstKey);
      maxDecodeTokens = std::max(maxDecodeTokens, qLength);
      continue;
    }
    // (The GQA-packed launch's tiles are its grid's z: at most 65535.)
    const int64_t keys = int64_t(kvLength[b]) - firstKey;
    const int64_t tileRows = group_ ? group_->config.blockM : 0;
    if (group_ && keys >= kBatchGroupKeysPerToken * qLength &&
        groupTiles + (int64_t(qLength) * group_->config.groupSize + tileRows - 1) / tileRows <=
            65535) {
      groupTiles += addGroupTiles(b, qLength, keys, groupTiles);
      maxGroupKeys = std::max(maxGroupKeys, keys);
      continue;
    }
    for (int32_t row = 0; row < qLength; row += rows) {
      // The tile's keys: the sequence's, or where the mask's classifier
      // proves the rest masked for the tile's rows (a causal tile's end at
      // its last row, a window's start).
      int32_t begin = kvStart[b], end = kvLength[b];
      if (keyBounds) {
        const int32_t first = qOffset[b] + row, last = first + std::min(rows, qLength - row) - 1;
        begin = firstKeyKept(*keyBounds, static_cast<int32_t>(b), first, last, begin, end);
        end = endOfKeysKept(*keyBounds, static_cast<int32_t>(b), first, last, begin, end);
      }
      weight_[tiles] = end - begin / kDecodeKvTile * kDecodeKvTile;
      int32_t *tile = tiles_.data() + kPrefillTileInts * tiles;
      tile[0] = static_cast<int32_t>(b);
      tile[1] = row;
      tile[2] = begin;
      tile[3] = end;
      ++tiles;
    }
  }
  std::iota(order_.begin(), order_.begin() + tiles, 0);
  std::stable_sort(order_.begin(), order_.begin() + tiles,
                   [&](int32_t x, int32_t y) { return weight_[x] > weight_[y]; });
  for (int64_t i = 0; i < tiles; ++i)
    std::copy_n(tiles_.data() + kPrefillTileInts * order_[i], kPrefillTileInts,
                ordered_.data() + kPrefillTileInts * i);

  const int64_t groupSplits = finishGroupTiles(groupTiles, maxGroupKeys);

  // Decode splits: the step's own, or the fixed grid's.
  int64_t splits = 1;
  if (c.fixedGrid)
    splits = fixedSplits_;
  else if (decodeSeqs > 0)
    splits = decodeSplits(decodeSeqs, maxDecodeKv, maxDecodeTokens);

  const size_t pageInts = ints(batch * c.maxBlocksPerSeq);
  storage_.upload(pageTable, pageInts * 4, 0);
  storage_.upload(kvLength, ints(batch) * 4, kvLenAt_ * 4);
  storage_.upload(qOffset, ints(batch) * 4, qOffsetAt_ * 4);
  storage_.upload(queryStart, ints(batch + 1) * 4, qStartAt_ * 4);
  storage_.upload(ordered_.data(), ints(kPrefillTileInts * tiles) * 4, prefillAt_ * 4);
  storage_.upload(decodeList_.data(), ints(2 * decodeSeqs) * 4, decodeAt_ * 4);
  storage_.upload(kvStart, ints(batch) * 4, kvStartAt_ * 4);
  storage_.upload(groupOrdered_.data(), ints(2 * groupTiles) * 4, groupAt_ * 4);
  // The token maps, each plan's own or the flat step's (q_offset[b] + i,
  // b): the kernels always read them, so a graph captured on one plan
  // stays right for a plan of the same shape with or without maps.
  const int64_t tokens = queryStart[batch];
  if (!tokenPosition || !tokenBatch) {
    for (int64_t b = 0; b < batch; ++b)
      for (int32_t row = queryStart[b]; row < queryStart[b + 1]; ++row) {
        defaultPosition_[row] = qOffset[b] + (row - queryStart[b]);
        defaultBatch_[row] = static_cast<int32_t>(b);
      }
  }
  storage_.upload(tokenPosition ? tokenPosition : defaultPosition_.data(), ints(tokens) * 4,
                  tokenPositionAt_ * 4);
  storage_.upload(tokenBatch ? tokenBatch : defaultBatch_.data(), ints(tokens) * 4,
                  tokenBatchAt_ * 4);
  if (c.fixedGrid) {
    const int32_t counts[2] = {static_cast<int32_t>(tiles), static_cast<int32_t>(decodeSeqs)};
    storage_.upload(counts, sizeof(counts), workCountsAt_ * 4);
  }
  batch_ = batch;
  prefillTiles_ = tiles;
  decodeSeqs_ = decodeSeqs;
  splits_ = splits;
  groupTiles_ = groupTiles;
  groupSplits_ = groupSplits;
  maxKvLength_ = maxKv;
}

int64_t CudaBatchBackend::decodeSplits(int64_t decodeSeqs, int64_t maxDecodeKv,
                                       int64_t maxDecodeTokens) const {
  // The launch's cost model (chooseDecodeSplits) for the list's CTAs over
  // the longest decode context, each split at least kMinSplitKeys long; a
  // CTA divides its own sequence's keys.
  const KernelConfig &config = decode_->config;
  DecodeSplitProblem problem;
  problem.ctasPerSplit =
      decodeSeqs * config_.numKVHeads *
      ((config.groupSize + config.decodeHeadsPerCta() - 1) / config.decodeHeadsPerCta());
  // The MLA grid covers 8 tokens of the group, but a CTA whose rows are
  // past its sequence's tokens returns at once: only the step's longest
  // entry's chunks do work.
  if (config.isMlaDecode()) {
    const int64_t rowsPerCta = int64_t(config.decodeHeadsPerCta()) * config.queryTokens;
    problem.ctasPerSplit =
        decodeSeqs * ((config.groupSize * maxDecodeTokens + rowsPerCta - 1) / rowsPerCta);
  }
  problem.granules = std::max<int64_t>((maxDecodeKv + kDecodeKvTile - 1) / kDecodeKvTile, 1);
  problem.granuleLength = kDecodeKvTile;
  problem.rowsPerCta = int64_t(kBatchDecodeTokens) * config.decodeHeadsPerCta();
  problem.headDim = config.headDim;
  problem.multiprocessors = cudaDeviceInfo(decode_->device).multiprocessors;
  problem.residentCtasPerSm = std::max(decode_->residentCtasPerSm, 1);
  problem.minGranulesPerSplit = kMinSplitKeys / kDecodeKvTile;
  return std::clamp<int64_t>(chooseDecodeSplits(problem).splits, 1, maxSplits_);
}

int64_t CudaBatchBackend::addGroupTiles(int64_t b, int32_t qLength, int64_t keys, int64_t first) {
  const int64_t rows = int64_t(qLength) * group_->config.groupSize;
  const int64_t tileRows = group_->config.blockM;
  int64_t count = 0;
  for (int64_t row = 0; row < rows; row += tileRows, ++count) {
    groupList_[ints(2 * (first + count))] = static_cast<int32_t>(b);
    groupList_[ints(2 * (first + count) + 1)] = static_cast<int32_t>(row);
    groupKeys_[ints(first + count)] = keys;
  }
  return count;
}

int64_t CudaBatchBackend::finishGroupTiles(int64_t tiles, int64_t longestKeys) {
  if (tiles == 0)
    return 1;
  std::iota(groupOrder_.begin(), groupOrder_.begin() + tiles, 0);
  std::stable_sort(groupOrder_.begin(), groupOrder_.begin() + tiles,
                   [&](int32_t x, int32_t y) { return groupKeys_[x] > groupKeys_[y]; });
  for (int64_t i = 0; i < tiles; ++i) {
    groupOrdered_[ints(2 * i)] = groupList_[ints(2 * groupOrder_[i])];
    groupOrdered_[ints(2 * i + 1)] = groupList_[ints(2 * groupOrder_[i] + 1)];
  }
  // Splits: enough CTAs for every SM's resident CTAs, each split at least
  // kMinSplitKeys long (shorter ones cost more in merging than they gain),
  // and no more than the partial workspace holds for this many tiles.
  const int64_t ctasPerSplit = tiles * config_.numKVHeads;
  const int64_t slots = int64_t(cudaDeviceInfo(group_->device).multiprocessors) *
                        std::max(group_->residentCtasPerSm, 1);
  const int64_t wanted = (slots + ctasPerSplit - 1) / ctasPerSplit;
  const int64_t longest = std::max<int64_t>(longestKeys / kMinSplitKeys, 1);
  const int64_t held = groupPartialRows_ / (ctasPerSplit * group_->config.blockM);
  return std::max<int64_t>(std::min({wanted, longest, kBatchMaxDecodeSplits, held}), 1);
}

const float *CudaBatchBackend::scalesFor(const std::vector<float> &kScale,
                                         const std::vector<float> &vScale, void *stream) const {
  std::vector<float> pair(kScale);
  pair.insert(pair.end(), vScale.begin(), vScale.end());
  std::lock_guard<std::mutex> lock(scaleMutex_);
  auto *slots = static_cast<const float *>(scaleStorage_.data());
  for (size_t i = 0; i < scaleSets_.size(); ++i)
    if (scaleSets_[i] == pair)
      return slots + i * pair.size();
  if (scaleSets_.size() == kMaxScaleSets)
    throw Error(fmt::format("k_scale and v_scale: run() has been given {} distinct pairs of "
                            "scales, the most one BatchAttention keeps on the device",
                            kMaxScaleSets));
  // The copy is synchronous, which a capturing stream forbids: the driver
  // would fail it (and invalidate the capture) with a bare copy error.
  // (The legacy stream, null, cannot be captured.)
  if (stream) {
    const CudaDriver &driver = cudaUseDevice(prefill_->device);
    if (streamCaptureStatus(driver, static_cast<cu::Stream>(stream)) !=
        cu::kStreamCaptureStatusNone)
      throw Error("k_scale and v_scale: run() is being captured into a CUDA graph and this pair "
                  "of scales has not been copied to the device yet, which cannot happen "
                  "inside a capture; give the pair to uploadScales() (Python: upload_scales) "
                  "or to one run() before the capture");
  }
  // A slot no kernel has been given yet: the upload cannot race a launch.
  const size_t bytes = pair.size() * 4;
  scaleStorage_.upload(pair.data(), bytes, scaleSets_.size() * bytes);
  scaleSets_.push_back(std::move(pair));
  return slots + (scaleSets_.size() - 1) * scaleSets_.back().size();
}

void CudaBatchBackend::run(const CudaBatchCall &call) const {
  const BatchAttentionConfig &c = config_;
  const float *scales = nullptr;
  if (c.kvDtype) {
    if (!call.kScale || !call.vScale || call.kScale->size() != ints(c.numKVHeads) ||
        call.vScale->size() != ints(c.numKVHeads))
      throw Error(fmt::format("the {} caches need k_scale and v_scale, one per KV head ({})",
                              dtypeName(*c.kvDtype), c.numKVHeads));
    // Before anything is enqueued: a refused pair leaves nothing half-run.
    scales = scalesFor(*call.kScale, *call.vScale, call.stream);
  }
  {
    std::lock_guard<std::mutex> lock(lastMutex_);
    lastK_ = call.kCache.data();
    lastV_ = call.vCache.data();
  }
  auto *words = static_cast<int32_t *>(storage_.data());
  auto *floats = static_cast<float *>(storage_.data());
  PagedcAttentionKernelArgs args{};
  args.q = call.q.data();
  args.k_cache = call.kCache.data();
  args.v_cache = call.vCache.data();
  args.out = call.out.data();
  args.lse = call.lse.data() ? static_cast<float *>(call.lse.data()) : floats + lseAt_;
  // The sinks' address is an argument of the kernels (null: none), so a
  // captured graph replays with whatever the tensor holds then.
  args.sinks = static_cast<const float *>(call.sinks.data());
  if (scales) {
    args.k_scale = scales;
    args.v_scale = scales + c.numKVHeads;
  }
  args.page_table = words;
  args.kv_len = words + kvLenAt_;
  args.q_offset = words + qOffsetAt_;
  args.q_start = words + qStartAt_;
  args.kv_start = words + kvStartAt_;
  args.token_position = words + tokenPositionAt_;
  args.token_batch = words + tokenBatchAt_;
  // Rows are packed: no batch stride; (b, h, row).
  args.q_stride[0] = 0;
  args.q_stride[1] = call.q.stride(1);
  args.q_stride[2] = call.q.stride(0);
  args.out_stride[0] = 0;
  args.out_stride[1] = call.out.stride(1);
  args.out_stride[2] = call.out.stride(0);
  for (int d = 0; d < 3; ++d) {
    args.k_stride[d] = call.kCache.stride(d);
    args.v_stride[d] = call.vCache.stride(d);
  }
  args.page_table_stride = c.maxBlocksPerSeq;
  // (A fixed grid's arguments depend on the limits alone, so a captured
  // launch is the one any later plan would make.)
  args.batch = static_cast<int32_t>(c.fixedGrid ? c.maxNumSeqs : batch_);
  args.heads_q = static_cast<int32_t>(c.numQHeads);
  args.heads_kv = static_cast<int32_t>(c.numKVHeads);
  args.q_len = 1; // (per sequence, from q_start)
  args.mask_batch = 1;
  args.mask_heads = 1;
  args.num_splits = 1;
  args.split_size = c.fixedGrid ? static_cast<int32_t>(c.maxBlocksPerSeq * c.pageSize)
                                : maxKvLength_;
  args.scale = call.scale;
  if (c.fixedGrid)
    args.work_counts = words + workCountsAt_;

  const CudaDriver &driver = cudaUseDevice(decode_->device);
  const auto stream = static_cast<cu::Stream>(call.stream);
  auto launch = [&](const CudaKernel &kernel, cu::Function function, const char *name,
                    const PagedcAttentionKernelArgs &kernelArgs, unsigned gridX, unsigned gridY,
                    unsigned gridZ, bool withParams) {
    KernelLaunch launch;
    launch.kernel = name;
    launch.grid[0] = gridX;
    launch.grid[1] = gridY;
    launch.grid[2] = gridZ;
    const bool merge = function == kernel.merge;
    launch.block[0] = merge ? 128 : static_cast<unsigned>(kernel.config.threadsPerCta());
    launch.sharedMemoryBytes = merge ? 0 : static_cast<unsigned>(kernel.config.sharedMemoryBytes());
    // The merge of sm_90 code waits for the split kernel in-kernel
    // (griddepcontrol.wait), so it may launch while the splits drain.
    launch.programmaticDependent = merge && archHasSm90Features(kernel.arch);
    launch.arguments.emplace_back(sizeof(kernelArgs));
    std::memcpy(launch.arguments.back().data(), &kernelArgs, sizeof(kernelArgs));
    if (withParams)
      launch.arguments.push_back(call.params);
    if (kernel.config.kind == KernelKind::Decode && !merge) {
      // No tensor maps: they describe compact pages (every tile gathered).
      const PagedcDecodeMapArgs maps{};
      launch.arguments.emplace_back(sizeof(maps));
      std::memcpy(launch.arguments.back().data(), &maps, sizeof(maps));
    }
    launchKernel(driver, function, launch, stream);
  };

  // A fixed grid launches every kernel at the limits' size, work or not.
  const int64_t prefillGrid = !prefill_ ? 0 : c.fixedGrid ? maxPrefillTiles_ : prefillTiles_;
  const int64_t decodeGrid = c.fixedGrid ? c.maxNumSeqs : decodeSeqs_;
  if (prefillGrid > 0) {
    PagedcAttentionKernelArgs prefillArgs = args;
    prefillArgs.work_tiles = words + prefillAt_;
    prefillArgs.num_work_tiles = static_cast<int32_t>(prefillGrid);
    launch(*prefill_, prefill_->main, "pagedc_prefill", prefillArgs,
           static_cast<unsigned>(prefillGrid * c.numQHeads), 1, 1, true);
  }
  if (groupTiles_ > 0) {
    PagedcAttentionKernelArgs groupArgs = args;
    groupArgs.work_tiles = words + groupAt_;
    groupArgs.num_work_tiles = static_cast<int32_t>(groupTiles_);
    groupArgs.num_splits = static_cast<int32_t>(groupSplits_);
    groupArgs.partial_lse = floats + groupPartialLseAt_;
    groupArgs.partial_out = floats + groupPartialOutAt_;
    launch(*group_, group_->main, "pagedc_prefill_group", groupArgs,
           static_cast<unsigned>(groupSplits_), static_cast<unsigned>(c.numKVHeads),
           static_cast<unsigned>(groupTiles_), true);
    if (groupSplits_ > 1)
      launch(*group_, group_->merge, "pagedc_prefill_group_merge", groupArgs,
             static_cast<unsigned>(c.numKVHeads * group_->config.blockM / 4),
             static_cast<unsigned>(groupTiles_), 1, false);
  }
  if (decodeGrid > 0) {
    const KernelConfig &config = decode_->config;
    PagedcAttentionKernelArgs decodeArgs = args;
    decodeArgs.work_tiles = words + decodeAt_;
    decodeArgs.num_work_tiles = static_cast<int32_t>(decodeGrid);
    decodeArgs.num_splits = static_cast<int32_t>(splits_);
    // (Each CTA divides its own sequence's keys into num_splits parts;
    // split_size stays informational, as without a block mask.)
    decodeArgs.partial_lse = floats + partialLseAt_;
    decodeArgs.partial_out = floats + partialOutAt_;
    const int headChunks =
        (config.groupSize + config.decodeHeadsPerCta() - 1) / config.decodeHeadsPerCta();
    launch(*decode_, decode_->main, "pagedc_decode", decodeArgs, static_cast<unsigned>(splits_),
           static_cast<unsigned>(c.numKVHeads * headChunks), static_cast<unsigned>(decodeGrid),
           true);
    if (splits_ > 1)
      launch(*decode_, decode_->merge, "pagedc_decode_merge", decodeArgs, kBatchDecodeTokens,
             static_cast<unsigned>(c.numQHeads), static_cast<unsigned>(decodeGrid), false);
  }
}

void CudaBatchBackend::uploadScales(const std::vector<float> &kScale,
                                    const std::vector<float> &vScale) const {
  scalesFor(kScale, vScale, nullptr);
}

BatchPlanShape CudaBatchBackend::planShape() const {
  BatchPlanShape shape;
  if (config_.fixedGrid) {
    shape.prefillTiles = prefill_ ? maxPrefillTiles_ : 0;
    shape.decodeSequences = config_.maxNumSeqs;
    shape.decodeSplits = fixedSplits_;
    return shape;
  }
  shape.prefillTiles = prefillTiles_;
  shape.decodeSequences = decodeSeqs_;
  shape.decodeSplits = decodeSeqs_ > 0 ? splits_ : 0;
  shape.groupTiles = groupTiles_;
  shape.groupSplits = groupTiles_ > 0 ? groupSplits_ : 0;
  return shape;
}

std::pair<const void *, const void *> CudaBatchBackend::lastCacheAddresses() const {
  std::lock_guard<std::mutex> lock(lastMutex_);
  return {lastK_, lastV_};
}

} // namespace pagedc::detail
