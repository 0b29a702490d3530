//===- CudaLaunch.cpp - Grid, shared memory and arguments of launches -----===//

#include "pagedc/CudaLaunch.h"

#include "Arithmetic.h"

#include "pagedc/EmulatorBuild.h"
#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

namespace pagedc {

namespace {

/// Fewest kv positions worth a split of their own.
constexpr int kMinSplitLength = 256;
/// The most splits of one sequence the planner considers.
constexpr int64_t kMaxSplits = 1024;
/// A launch's fixed cost (the model's 3 us back to back) in bytes at an
/// H100's 3.35 TB/s: what a second (merge) launch must save to be worth it.
constexpr double kLaunchBytes = 3e-6 * 3.35e12;
/// Merge CTAs resident per SM (128 threads: the 2,048-thread limit).
constexpr int64_t kMergeCtasPerSm = 16;
/// A plan with fewer splits is taken when it costs at most this much more.
constexpr double kSplitTolerance = 0.01;

template <typename T> std::vector<unsigned char> bytesOf(const T &value) {
  std::vector<unsigned char> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

void checkArgs(const KernelConfig &config, const PagedcAttentionKernelArgs &args) {
  if (!args.q || !args.k_cache || !args.v_cache || !args.out || !args.page_table ||
      !args.kv_len)
    throw Error("attention launch: q, k_cache, v_cache, out, page_table and kv_len "
                "must all be device pointers");
  if (args.batch < 1 || args.heads_q < 1 || args.heads_kv < 1 || args.q_len < 1)
    throw Error(fmt::format("attention launch: batch {}, heads_q {}, heads_kv {} and "
                            "q_len {} must be positive",
                            args.batch, args.heads_q, args.heads_kv, args.q_len));
  if (args.heads_q % args.heads_kv != 0)
    throw Error(fmt::format("attention launch: heads_q {} is not a multiple of heads_kv {}",
                            args.heads_q, args.heads_kv));
  if (config.kind == KernelKind::Decode) {
    if (args.heads_q / args.heads_kv != config.groupSize)
      throw Error(fmt::format("attention launch: the decode kernel was built for "
                              "{} query heads per KV head, the call has {}",
                              config.groupSize, args.heads_q / args.heads_kv));
    if (args.q_len > config.queryTokens)
      throw Error(fmt::format("attention launch: the decode kernel was built for "
                              "at most {} query tokens, the call has {}",
                              config.queryTokens, args.q_len));
  }
  if (config.returnLse != (args.lse != nullptr))
    throw Error(fmt::format("attention launch: the kernel was built {} lse output but "
                            "the call {} an lse tensor",
                            config.returnLse ? "with" : "without",
                            args.lse ? "passes" : "does not pass"));
  if (args.page_table_stride < 1)
    throw Error("attention launch: page_table_stride must be positive");
  if (config.kvFloat8.has_value() != (args.k_scale && args.v_scale))
    throw Error(fmt::format("attention launch: the kernel was built {} but the call {} K and V "
                            "scales",
                            config.kvFloat8 ? "for an 8-bit float cache" : "for a 16-bit cache",
                            args.k_scale || args.v_scale ? "passes" : "does not pass"));
  // The kernels address compact [pages, page_size, D] pages per KV head
  // (KernelCommon.cuh's kv_row_bytes): page and row strides are fixed, and
  // the 16-byte copies need a head stride of whole 16-byte chunks.
  // (K's rows are D wide, V's Dv.)
  for (const auto &[name, stride, dim] :
       {std::tuple{"k_cache", args.k_stride, int64_t(config.headDim)},
        std::tuple{"v_cache", args.v_stride, int64_t(config.valueDim())}}) {
    const int64_t pageStride = int64_t(config.pageSize) * dim;
    if (stride[1] != pageStride || stride[2] != dim)
      throw Error(fmt::format("attention launch: {} has page stride {} and row stride {}; the "
                              "kernels read compact pages of {} rows x {} (strides {} and {})",
                              name, stride[1], stride[2], config.pageSize, dim, pageStride, dim));
    // 16-byte copies: 8 elements, or 16 codes of an 8-bit float cache.
    const int64_t perCopy = config.kvFloat8 ? 16 : 8;
    if (args.heads_kv > 1 && (stride[0] < pageStride || stride[0] % perCopy != 0))
      throw Error(fmt::format("attention launch: {}'s head stride {} must be a multiple of {} "
                              "elements (16-byte copies) of at least one page ({})",
                              name, stride[0], perCopy, pageStride));
  }
  if (args.kv_num_blocks && config.noBlockMask)
    throw Error(fmt::format("attention launch: the kernel ({}) was built for launches without "
                            "a block mask, and this one binds one",
                            config.describe()));
  if (args.kv_num_blocks) {
    int tile = config.kind == KernelKind::Decode ? kDecodeKvTile : config.blockN;
    if (!args.kv_indices)
      throw Error("attention launch: kv_num_blocks is given without kv_indices");
    if ((args.full_kv_num_blocks == nullptr) != (args.full_kv_indices == nullptr))
      throw Error("attention launch: full_kv_num_blocks and full_kv_indices go together");
    if (args.q_block_size < 1 || args.kv_block_size < tile || args.kv_block_size % tile)
      throw Error(fmt::format("attention launch: block-mask kv block size {} must be a "
                              "multiple of the kernel's KV tile {} (q block size {})",
                              args.kv_block_size, tile, args.q_block_size));
    if ((args.mask_batch != 1 && args.mask_batch != args.batch) ||
        (args.mask_heads != 1 && args.mask_heads != args.heads_q))
      throw Error(fmt::format("attention launch: block mask [{}, {}] does not broadcast "
                              "to batch {} and heads {}",
                              args.mask_batch, args.mask_heads, args.batch, args.heads_q));
    if (args.num_q_blocks < 1 || args.max_kv_blocks < 1)
      throw Error("attention launch: block mask has no blocks");
    if (args.first_q_block < 0)
      throw Error(fmt::format("attention launch: block mask first q block {} is negative",
                              args.first_q_block));
  }
}

} // namespace

int decodeMergeChunks(int64_t rows, int valueDim, int multiprocessors, int asked) {
  const int most = std::max(valueDim / 16, 1);
  if (asked > 0) {
    int chunks = asked;
    while (chunks > most)
      chunks /= 2;
    return std::max(chunks, 1);
  }
  // One CTA per row leaves the merge slots idle when rows are few (B 1:
  // 32 CTAs where an H100 holds 2,112), and each CTA then reads its row's
  // partials alone.
  const int64_t slots = int64_t(std::max(multiprocessors, 1)) * kMergeCtasPerSm;
  int chunks = 1;
  while (chunks * 2 <= most && std::max<int64_t>(rows, 1) * chunks * 2 <= slots)
    chunks *= 2;
  return chunks;
}

DecodeSplitChoice chooseDecodeSplits(const DecodeSplitProblem &p) {
  const int64_t ctasPerSplit = std::max<int64_t>(p.ctasPerSplit, 1);
  const int64_t granules = std::max<int64_t>(p.granules, 1);
  const int64_t multiprocessors = std::max(p.multiprocessors, 1);
  const int64_t slots = multiprocessors * std::max(p.residentCtasPerSm, 1);
  const int64_t minPer = std::max<int64_t>(p.minGranulesPerSplit, 1);
  // The fewest splits that keep each within maxGranulesPerSplit, the most
  // that keep each at least minGranulesPerSplit long (or 1 granule).
  const int64_t fewest =
      p.maxGranulesPerSplit > 0 ? ceilDiv(granules, p.maxGranulesPerSplit) : 1;
  const int64_t most =
      std::max<int64_t>(std::max(fewest, std::min<int64_t>(granules / minPer, kMaxSplits)), 1);
  if (p.splits > 0) {
    // Asked for: within [fewest, most], none empty; the model is not run.
    const int64_t perSplit = ceilDiv(granules, std::clamp<int64_t>(p.splits, fewest, most));
    return {ceilDiv(granules, perSplit), perSplit};
  }
  // The performance model's rule (docs/emulator.md) in bytes at the
  // device's bandwidth: a launch moves its bytes in ceil(CTAs / slots)
  // waves, so it costs bytes x waves x slots / CTAs (the fraction of slots
  // busy divides); a second launch costs kLaunchBytes.
  auto launchCost = [](double bytes, int64_t ctas, int64_t slotsOf) {
    const double waves = double(ceilDiv(ctas, slotsOf));
    return bytes * waves * double(slotsOf) / double(ctas);
  };
  const double kvBytes =
      double(granules) * double(p.granuleLength) * p.headDim * 2 /*bytes*/ * 2 /*K, V*/ *
      double(ctasPerSplit);
  const double rows = double(ctasPerSplit) * std::max<int64_t>(p.rowsPerCta, 1);
  // The merge is priced as one CTA per row, which overstates it where
  // decodeMergeChunks divides few rows' columns: such plans keep the split
  // counts of a merge without chunks, not more (more splits lengthen each
  // merge CTA's walk over the partials, which the model does not see).
  const int64_t mergeCtas = std::max<int64_t>(static_cast<int64_t>(rows), 1);
  std::vector<std::pair<double, DecodeSplitChoice>> costs;
  double best = 0;
  for (int64_t splits = fewest; splits <= most; ++splits) {
    const int64_t perSplit = ceilDiv(granules, splits);
    // Splits past the last granule would be empty: the same plan with fewer.
    if (ceilDiv(granules, perSplit) != splits)
      continue;
    const int64_t ctas = ctasPerSplit * splits;
    double cost;
    if (splits == 1) {
      cost = launchCost(kvBytes, ctas, slots);
    } else {
      // Each split writes its rows' f32 partials and lse; the merge reads
      // them (kMergeCtasPerSm CTAs per SM) and writes out.
      const double partials = rows * double(splits) * (p.headDim + 1) * 4;
      cost = launchCost(kvBytes + partials, ctas, slots) + kLaunchBytes +
             launchCost(partials + rows * p.headDim * 2, mergeCtas,
                        multiprocessors * kMergeCtasPerSm);
    }
    costs.push_back({cost, {splits, perSplit}});
    if (costs.size() == 1 || cost < best)
      best = cost;
  }
  // The fewest splits within 1% of the cheapest: more splits than that buy
  // less than they cost in partials and in what the model cannot see.
  DecodeSplitChoice chosen = costs.front().second;
  for (const auto &[cost, choice] : costs)
    if (cost <= best * (1 + kSplitTolerance)) {
      chosen = choice;
      break;
    }
  if (p.splitFactor > 1) {
    // As many splits as asked, up to `most`, with none left empty.
    const int64_t wanted = std::min<int64_t>(chosen.splits * p.splitFactor, most);
    chosen.granulesPerSplit = ceilDiv(granules, std::max<int64_t>(wanted, 1));
    chosen.splits = ceilDiv(granules, chosen.granulesPerSplit);
  }
  return chosen;
}

int64_t decodeVisibleSpan(const BlockMask &mask, int batch, int headsQ, int qLength,
                          const int32_t *kvLength, const int32_t *qOffset) {
  int64_t longest = 0;
  const int64_t block = mask.kvBlockSize;
  for (int b = 0; b < batch; ++b) {
    const int64_t offset = qOffset ? qOffset[b] : 0;
    const int64_t firstRow = offset / mask.qBlockSize - mask.firstQBlock;
    const int64_t lastRow = (offset + qLength - 1) / mask.qBlockSize - mask.firstQBlock;
    int64_t first = std::numeric_limits<int64_t>::max(), last = -1;
    for (int64_t h = 0; h < (mask.heads == 1 ? 1 : headsQ); ++h)
      for (int64_t row = std::max<int64_t>(firstRow, 0);
           row <= std::min<int64_t>(lastRow, mask.numQBlocks - 1); ++row) {
        const int64_t index = mask.rowIndex(b, h, row);
        const int32_t *lists[2] = {mask.partialRow(b, h, row), mask.fullRow(b, h, row)};
        const int32_t counts[2] = {
            mask.kvNumBlocks[index],
            mask.fullKvNumBlocks.empty() ? 0 : mask.fullKvNumBlocks[index]};
        for (int list = 0; list < 2; ++list)
          for (int32_t i = 0; i < counts[list]; ++i) {
            first = std::min<int64_t>(first, lists[list][i]);
            last = std::max<int64_t>(last, lists[list][i]);
          }
      }
    if (last < 0)
      continue;
    first = std::max<int64_t>(first, 0);
    const int64_t begin = std::min<int64_t>(first * block, kvLength[b]);
    const int64_t end = std::min<int64_t>((last + 1) * block, kvLength[b]);
    longest = std::max(longest, end - begin);
  }
  return longest;
}

std::vector<void *> KernelLaunch::parameterPointers() {
  std::vector<void *> pointers;
  for (auto &argument : arguments)
    pointers.push_back(argument.data());
  return pointers;
}

void AttentionLaunchPlan::setWorkspace(cu::DevicePointer base) {
  if (workspaceBytes == 0)
    return;
  size_t rows = static_cast<size_t>(args.batch) * args.heads_q * args.q_len * args.num_splits;
  args.partial_out = reinterpret_cast<float *>(base);
  args.partial_lse = reinterpret_cast<float *>(base + rows * headDim * sizeof(float));
  for (KernelLaunch &launch : launches)
    launch.arguments[0] = bytesOf(args);
}

namespace {
/// A prefill's query tiles, ceil(q_len / blockM) x heads_q x batch: one CTA
/// each, or the rounds of persistent CTAs (prefill_tile_count in
/// templates/KernelCommon.cuh).
int64_t prefillQueryTiles(const KernelConfig &config, const PagedcAttentionKernelArgs &args) {
  return ceilDiv(args.q_len, config.blockM) * int64_t(args.heads_q) * args.batch;
}
} // namespace

AttentionLaunchPlan planAttention(const KernelConfig &config,
                                  const PagedcAttentionKernelArgs &callArgs,
                                  const std::vector<unsigned char> &params,
                                  int maxKvLength, int multiprocessors,
                                  int residentCtasPerSm, int64_t maxVisibleKv,
                                  const KernelOptions &options) {
  config.validate();
  if (config.kind == KernelKind::BlockMaskBuilder)
    throw Error("planAttention takes a prefill or decode kernel configuration");
  checkArgs(config, callArgs);
  if (config.paramsSize >= 0 && static_cast<int64_t>(params.size()) != config.paramsSize)
    throw Error(fmt::format("attention launch: {} bytes of params, the kernel was built "
                            "for {}",
                            params.size(), config.paramsSize));
  AttentionLaunchPlan plan;
  plan.headDim = config.valueDim();
  plan.args = callArgs;
  PagedcAttentionKernelArgs &args = plan.args;
  args.partial_out = nullptr;
  args.partial_lse = nullptr;
  maxKvLength = std::max(maxKvLength, 1);
  multiprocessors = std::max(multiprocessors, 1);

  KernelLaunch main;
  main.sharedMemoryBytes = static_cast<unsigned>(config.sharedMemoryBytes());
  main.block[0] = static_cast<unsigned>(config.threadsPerCta());
  if (config.kind == KernelKind::Prefill) {
    args.num_splits = 1;
    args.split_size = maxKvLength;
    main.kernel = "pagedc_prefill";
    // One dimension, heaviest query tiles first (templates/Prefill.cuh).
    const int64_t blocks = prefillQueryTiles(config, args);
    if (blocks > std::numeric_limits<int32_t>::max())
      throw Error(fmt::format("prefill of {} query rows x {} heads x batch {} needs {} CTAs, "
                              "more than a grid holds (2^31 - 1)",
                              args.q_len, args.heads_q, args.batch, blocks));
    main.grid[0] = static_cast<unsigned>(blocks);
    main.grid[1] = 1;
    main.grid[2] = 1;
    main.arguments = {bytesOf(args), params};
    if (config.warpRows == 64) {
      // The warpgroup prefill's tensor maps: off until bound
      // (bindPrefillTensorMaps).
      main.arguments.push_back(bytesOf(PagedcWgmmaPrefillArgs{}));
      main.note = "gather (tensor maps not bound)";
    }
    plan.launches.push_back(std::move(main));
    return plan;
  }

  // Decode: the split count. Each CTA divides what its rows see into
  // num_splits equal parts (templates/Decode.cuh), so the plan works in
  // granules of the longest context: block-mask blocks (a split covers at
  // most kDecodeMaxSplitBlocks of them) or KV tiles.
  const int headChunks = static_cast<int>(ceilDiv(config.groupSize, config.decodeHeadsPerCta()));
  const int64_t ctasPerSplit = int64_t(args.batch) * args.heads_kv * headChunks;
  const int granularity = args.kv_num_blocks ? args.kv_block_size : kDecodeKvTile;
  const int64_t span =
      maxVisibleKv < 0 ? maxKvLength : std::min<int64_t>(maxVisibleKv, maxKvLength);
  DecodeSplitProblem problem;
  problem.ctasPerSplit = ctasPerSplit;
  problem.granules = std::max<int64_t>(ceilDiv(span, granularity), 1);
  problem.granuleLength = granularity;
  problem.rowsPerCta = int64_t(args.q_len) * config.decodeHeadsPerCta();
  problem.headDim = config.headDim;
  problem.multiprocessors = multiprocessors;
  problem.residentCtasPerSm = residentCtasPerSm;
  problem.maxGranulesPerSplit = args.kv_num_blocks ? kDecodeMaxSplitBlocks : 0;
  problem.minGranulesPerSplit = ceilDiv(kMinSplitLength, granularity);
  problem.splitFactor = decodeSplitFactor(options);
  problem.splits = options.decodeSplits.value_or(0);
  const DecodeSplitChoice choice = chooseDecodeSplits(problem);
  const int64_t splits = choice.splits;
  if (splits > std::numeric_limits<int32_t>::max() ||
      choice.granulesPerSplit * granularity > std::numeric_limits<int32_t>::max())
    throw Error(fmt::format("decode of {} kv positions needs {} splits, more than a grid holds",
                            maxKvLength, splits));
  args.num_splits = static_cast<int32_t>(splits);
  args.split_size = static_cast<int32_t>(choice.granulesPerSplit * granularity);

  main.kernel = "pagedc_decode";
  main.grid[0] = static_cast<unsigned>(splits);
  main.grid[1] = static_cast<unsigned>(args.heads_kv * headChunks);
  main.grid[2] = static_cast<unsigned>(args.batch);
  if (splits > 1) {
    size_t rows = size_t(args.batch) * args.heads_q * args.q_len * size_t(splits);
    plan.workspaceBytes = rows * (config.valueDim() + 1) * sizeof(float);
  }
  // The tensor maps: off until bound (bindDecodeTensorMaps).
  main.arguments = {bytesOf(args), params, bytesOf(PagedcDecodeMapArgs{})};
  main.note = "gather (tensor maps not bound)";
  plan.launches.push_back(std::move(main));
  if (splits > 1) {
    KernelLaunch merge;
    merge.kernel = "pagedc_decode_merge";
    // templates/Decode.cuh reads the column chunks from grid x.
    const int chunks = decodeMergeChunks(int64_t(args.batch) * args.heads_q * args.q_len,
                                         config.valueDim(), multiprocessors,
                                         options.decodeMergeChunks.value_or(0));
    merge.grid[0] = static_cast<unsigned>(args.q_len * chunks);
    merge.grid[1] = static_cast<unsigned>(args.heads_q);
    merge.grid[2] = static_cast<unsigned>(args.batch);
    merge.block[0] = 128;
    merge.arguments = {bytesOf(args)};
    plan.launches.push_back(std::move(merge));
  }
  return plan;
}

PrefillPersistence prefillPersistence(const KernelOptions &options) {
  if (!options.prefillPersistent)
    return PrefillPersistence::Auto;
  return *options.prefillPersistent ? PrefillPersistence::On : PrefillPersistence::Off;
}

namespace {
/// A launch note's option suffix (", ping-pong"): taken out where it is,
/// appended when `on`, so that setting an option again does not repeat it.
void setNoteOption(std::string &note, const std::string &suffix, bool on) {
  const size_t at = note.find(suffix);
  if (at != std::string::npos)
    note.erase(at, suffix.size());
  if (on)
    note += suffix;
}
} // namespace

namespace {
/// Whether `plan` launches the warpgroup prefill (its third argument,
/// PagedcWgmmaPrefillArgs, is what the launch options set).
bool isWarpgroupPrefillLaunch(const KernelConfig &config, const AttentionLaunchPlan &plan) {
  return config.kind == KernelKind::Prefill && config.warpRows == 64 && !plan.launches.empty() &&
         plan.launches[0].arguments.size() == 3;
}
} // namespace

void setPrefillTileCounter(const KernelConfig &config, AttentionLaunchPlan &plan,
                           cu::DevicePointer counter) {
  if (!isWarpgroupPrefillLaunch(config, plan))
    return;
  KernelLaunch &launch = plan.launches[0];
  PagedcWgmmaPrefillArgs extra;
  std::memcpy(&extra, launch.arguments[2].data(), sizeof(extra));
  const bool persistent = launch.grid[0] < prefillQueryTiles(config, plan.args);
  extra.tile_counter = persistent && counter ? reinterpret_cast<int32_t *>(counter) : nullptr;
  launch.arguments[2] = bytesOf(extra);
  setNoteOption(launch.note, ", tile counter", extra.tile_counter != nullptr);
}

void setPrefillPersistent(const KernelConfig &config, AttentionLaunchPlan &plan, int64_t ctas) {
  if (!isWarpgroupPrefillLaunch(config, plan) || ctas < 1)
    return;
  KernelLaunch &launch = plan.launches[0];
  const int64_t grid = std::max<int64_t>(std::min(prefillQueryTiles(config, plan.args), ctas), 1);
  launch.grid[0] = static_cast<unsigned>(grid);
  launch.note += fmt::format(", persistent ({} CTAs)", grid);
}

bool applyPrefillPersistentRequest(const KernelConfig &config, AttentionLaunchPlan &plan,
                                   int64_t slots, bool visitsGrow,
                                   const KernelOptions &options) {
  checkKernelOptions(options); // the CTA count without the switch
  const int ctas = options.prefillPersistentCtas.value_or(0);
  if (!isWarpgroupPrefillLaunch(config, plan))
    return false;
  switch (prefillPersistence(options)) {
  case PrefillPersistence::Off:
    return false;
  case PrefillPersistence::Auto:
    if (!visitsGrow || slots < 1 || prefillQueryTiles(config, plan.args) <= slots)
      return false;
    setPrefillPersistent(config, plan, slots);
    return true;
  case PrefillPersistence::On:
    setPrefillPersistent(config, plan, ctas > 0 ? ctas : slots);
    return plan.launches[0].grid[0] < prefillQueryTiles(config, plan.args);
  }
  return false;
}

void setPrefillPingPong(AttentionLaunchPlan &plan, bool on) {
  if (plan.launches.empty() || plan.launches[0].arguments.size() != 3)
    return;
  KernelLaunch &launch = plan.launches[0];
  PagedcWgmmaPrefillArgs extra;
  std::memcpy(&extra, launch.arguments[2].data(), sizeof(extra));
  extra.ping_pong = on ? 1 : 0;
  launch.arguments[2] = bytesOf(extra);
  setNoteOption(launch.note, ", ping-pong", on);
}

namespace {
/// Encodes tensor maps of k_cache and v_cache ([Hkv, pages, pageSize, D],
/// the strides of `args`; boxes of 64 elements x boxRows rows, 128-byte
/// swizzle) into kMap and vMap. Returns "" or why not.
std::string encodeCacheMaps(const CudaDriver &driver, const KernelConfig &config,
                            const PagedcAttentionKernelArgs &args, int64_t kPages,
                            int64_t vPages, unsigned boxRows, uint64_t *kMap, uint64_t *vMap,
                            unsigned boxPages = 1) {
  if (!driver.api().tensorMapEncodeTiled)
    return "the driver has no cuTensorMapEncodeTiled";
  struct Cache {
    const void *data;
    const int64_t *stride;
    int64_t pages;
    uint64_t *map;
    const char *name;
  };
  for (const Cache &cache : {Cache{args.k_cache, args.k_stride, kPages, kMap, "k_cache"},
                             Cache{args.v_cache, args.v_stride, vPages, vMap, "v_cache"}}) {
    // [Hkv, pages, pageSize, D], innermost first; strides in bytes.
    const uint64_t dims[4] = {uint64_t(config.headDim), uint64_t(config.pageSize),
                              uint64_t(std::max<int64_t>(cache.pages, 0)),
                              uint64_t(std::max(args.heads_kv, 0))};
    // (One KV head: its stride is never stepped, and a compact view may
    // give any; the map takes the cache's extent.)
    const int64_t headStride =
        args.heads_kv == 1 ? cache.stride[1] * std::max<int64_t>(cache.pages, 1) : cache.stride[0];
    const uint64_t strides[3] = {uint64_t(cache.stride[2]) * 2, uint64_t(cache.stride[1]) * 2,
                                 uint64_t(headStride) * 2};
    const unsigned box[4] = {64, boxRows, boxPages, 1}, elementStrides[4] = {1, 1, 1, 1};
    if (cache.pages < 1 || cache.pages > (int64_t(1) << 32))
      return fmt::format("{} has {} pages", cache.name, cache.pages);
    if (reinterpret_cast<uintptr_t>(cache.data) % 16 != 0)
      return fmt::format("{} is not 16-byte aligned", cache.name);
    for (int d = 0; d < 3; ++d)
      if (int64_t(strides[d]) <= 0 || strides[d] % 16 != 0 || strides[d] >= (uint64_t(1) << 40))
        return fmt::format("{}'s stride {} in bytes is not a multiple of 16 under 2^40",
                           cache.name, strides[d]);
    // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 9, FLOAT16 6; no interleave; the
    // 128-byte swizzle (3) the kernels' tiles use; L2 promotion 128 B (2);
    // out-of-bound elements read as zeros (0).
    const int dataType = config.elementType == DType::BF16 ? 9 : 6;
    const cu::Result status = driver.api().tensorMapEncodeTiled(
        cache.map, dataType, 4, const_cast<void *>(cache.data), dims, strides, box,
        elementStrides, 0, 3, 2, 0);
    if (status != 0)
      return fmt::format("cuTensorMapEncodeTiled refused {}: error {}", cache.name, status);
  }
  return "";
}

/// The tensor maps of a kernel's arguments `maps` (k_map, v_map, k_run_map,
/// v_run_map, tensor_maps, run_boxes): a box of `boxRows` rows a page, and,
/// when pages are shorter than `runRows` and `runsEnabled` (the kernel
/// option) leaves them on, run maps of one box of `runRows` rows over
/// consecutive pages (without them every page is its own box). Returns why
/// the page maps could not be encoded (empty: bound, tensor_maps set) and
/// in `runs` what the launch's note says of the run maps.
template <typename Maps>
std::string bindCacheMaps(const CudaDriver &driver, const KernelConfig &config,
                          const PagedcAttentionKernelArgs &args, int64_t kPages, int64_t vPages,
                          unsigned boxRows, int64_t runRows, bool runsEnabled, Maps &maps,
                          std::string &runs) {
  const std::string why =
      encodeCacheMaps(driver, config, args, kPages, vPages, boxRows, maps.k_map, maps.v_map);
  if (!why.empty())
    return why;
  maps.tensor_maps = 1;
  maps.run_boxes = 0;
  if (config.pageSize >= runRows || !runsEnabled)
    return "";
  const std::string runWhy =
      encodeCacheMaps(driver, config, args, kPages, vPages, boxRows, maps.k_run_map,
                      maps.v_run_map, static_cast<unsigned>(runRows / config.pageSize));
  if (runWhy.empty()) {
    maps.run_boxes = 1;
    runs = ", page runs";
  } else {
    runs = ", no page runs (" + runWhy + ")";
  }
  return "";
}
} // namespace

std::string bindPrefillTensorMaps(const CudaDriver &driver, const KernelConfig &config,
                                  AttentionLaunchPlan &plan, int64_t kPages, int64_t vPages,
                                  const KernelOptions &options) {
  if (!isWarpgroupPrefillLaunch(config, plan))
    return "not the warpgroup prefill";
  KernelLaunch &launch = plan.launches[0];
  PagedcWgmmaPrefillArgs maps;
  std::memcpy(&maps, launch.arguments[2].data(), sizeof(maps));
  const std::string pingPongNote = maps.ping_pong ? ", ping-pong" : "";
  // Off until both maps are encoded.
  maps.tensor_maps = 0;
  launch.arguments[2] = bytesOf(maps);
  auto refuse = [&](std::string why) {
    launch.note = "gather (" + why + ")" + pingPongNote;
    return why;
  };
  if (config.pageSize < kPrefillTmaPageRows)
    return refuse(fmt::format("pages of {} rows, under {}", config.pageSize, kPrefillTmaPageRows));
  // As PrefillWgmma.cuh's kTmaPages: 8-bit codes are gathered into their
  // own buffers and converted into the 16-bit tiles the wgmma reads.
  if (config.kvFloat8)
    return refuse(fmt::format("{} cache", dtypeName(*config.kvFloat8)));
  // As PrefillWgmma.cuh's kTmaPages.
  if (config.headDim > 128 && config.blockM == 128)
    return refuse("head dim 256 with two consumer warpgroups");
  const unsigned boxRows = static_cast<unsigned>(std::min(config.pageSize, config.blockN));
  // Runs: a segment of up to 64 rows of consecutive pages a box, as
  // PrefillWgmma.cuh's kRunRows.
  std::string runs;
  const std::string why = bindCacheMaps(driver, config, plan.args, kPages, vPages, boxRows,
                                        std::min<int64_t>(config.blockN, kPrefillRunRows),
                                        options.prefillTmaRuns.value_or(true), maps, runs);
  if (!why.empty())
    return refuse(why);
  launch.arguments[2] = bytesOf(maps);
  launch.note = "tensor maps" + runs + pingPongNote;
  return "";
}

int decodeSplitFactor(const KernelOptions &options) {
  checkKernelOptions(options); // its range
  return options.decodeSplitFactor.value_or(1);
}

std::string bindDecodeTensorMaps(const CudaDriver &driver, const KernelConfig &config,
                                 const std::string &arch, AttentionLaunchPlan &plan,
                                 int64_t kPages, int64_t vPages, const KernelOptions &options) {
  if (config.kind != KernelKind::Decode || plan.launches.empty() ||
      plan.launches[0].arguments.size() != 3)
    return "not the decode kernel";
  KernelLaunch &launch = plan.launches[0];
  PagedcDecodeMapArgs maps;
  std::memcpy(&maps, launch.arguments[2].data(), sizeof(maps));
  // Off until both maps are encoded.
  maps.tensor_maps = 0;
  launch.arguments[2] = bytesOf(maps);
  auto refuse = [&](std::string why) {
    launch.note = "gather (" + why + ")";
    return why;
  };
  // As Decode.cuh's kDecodeTma: code for sm_90 and later (the emulator's
  // too) has the bulk tensor copy.
  if (!archHasSm90Features(arch))
    return refuse(fmt::format("{} has no bulk tensor copy", arch));
  if (config.pageSize < kDecodeTmaPageRows)
    return refuse(fmt::format("pages of {} rows, under {}", config.pageSize, kDecodeTmaPageRows));
  if (config.headDim < kDecodeTmaMinHeadDim)
    return refuse(fmt::format("head dim {}, under {}", config.headDim, kDecodeTmaMinHeadDim));
  // As Decode.cuh's kDecodeTma: 8-bit codes are gathered into their own
  // rows and converted there; a box spans 64 head dims, the same for K
  // and V.
  if (config.kvFloat8)
    return refuse(fmt::format("{} cache", dtypeName(*config.kvFloat8)));
  if (config.headDim % 64 != 0)
    return refuse(fmt::format("head dim {}, not a multiple of 64", config.headDim));
  if (config.valueDim() != config.headDim)
    return refuse(fmt::format("value head dim {} other than the head dim", config.valueDim()));
  const unsigned boxRows = static_cast<unsigned>(std::min(config.pageSize, kDecodeKvTile));
  // Runs: a decode tile's rows of consecutive pages a box.
  std::string runs;
  const std::string why = bindCacheMaps(driver, config, plan.args, kPages, vPages, boxRows,
                                        kDecodeKvTile, options.decodeTmaRuns.value_or(true), maps,
                                        runs);
  if (!why.empty())
    return refuse(why);
  launch.arguments[2] = bytesOf(maps);
  launch.note = "tensor maps" + runs;
  return "";
}

std::string applyKernelOptions(const CudaDriver *driver, const KernelConfig &config,
                               const std::string &arch, AttentionLaunchPlan &plan,
                               int64_t kPages, int64_t vPages, int64_t slots, bool visitsGrow,
                               const KernelOptions &options,
                               const std::function<cu::DevicePointer()> &tileCounter) {
  checkKernelOptions(options);
  if (plan.launches.empty() || plan.launches[0].arguments.size() != 3)
    return "";
  if (config.kind == KernelKind::Decode) {
    if (!options.decodeTma.value_or(true))
      plan.launches[0].note = "gather (decode_tma=0)";
    else if (driver)
      bindDecodeTensorMaps(*driver, config, arch, plan, kPages, vPages, options);
    return plan.launches[0].note;
  }
  if (!options.prefillTma.value_or(true))
    plan.launches[0].note = "gather (prefill_tma=0)";
  else if (driver)
    bindPrefillTensorMaps(*driver, config, plan, kPages, vPages, options);
  // After the copy path's note: setPrefillPersistent appends ", persistent
  // (N CTAs)", then setPrefillPingPong ", ping-pong".
  const bool persistent = applyPrefillPersistentRequest(config, plan, slots, visitsGrow, options);
  if (persistent && options.prefillTileCounter.value_or(true))
    setPrefillTileCounter(config, plan, tileCounter());
  setPrefillPingPong(plan, options.prefillPingPong.value_or(false));
  return plan.launches[0].note;
}

KernelLaunch planBlockMaskBuild(const PagedcBlockMaskKernelArgs &args,
                                const std::vector<unsigned char> &params) {
  if (!args.kv_num_blocks || !args.kv_indices || !args.full_kv_num_blocks ||
      !args.full_kv_indices)
    throw Error("block-mask build: all four output arrays must be device pointers");
  if (args.batch < 1 || args.heads < 1 || args.q_len < 1 || args.kv_len < 1 ||
      args.q_block_size < 1 || args.kv_block_size < 1)
    throw Error("block-mask build: sizes must be positive");
  if (args.num_q_blocks != ceilDiv(args.q_len, args.q_block_size) ||
      args.max_kv_blocks != ceilDiv(args.kv_len, args.kv_block_size))
    throw Error(fmt::format("block-mask build: {} q blocks and {} kv blocks do not match "
                            "lengths {} x {} with blocks {} x {}",
                            args.num_q_blocks, args.max_kv_blocks, args.q_len, args.kv_len,
                            args.q_block_size, args.kv_block_size));
  KernelLaunch launch;
  launch.kernel = "pagedc_build_block_mask";
  launch.grid[0] = static_cast<unsigned>(args.num_q_blocks);
  launch.grid[1] = static_cast<unsigned>(args.heads);
  launch.grid[2] = static_cast<unsigned>(args.batch);
  launch.block[0] = 128;
  launch.arguments = {bytesOf(args), params};
  return launch;
}

void launchKernel(const CudaDriver &driver, cu::Function function, KernelLaunch &launch,
                  cu::Stream stream) {
  std::vector<void *> pointers = launch.parameterPointers();
  if (launch.programmaticDependent && driver.api().launchKernelEx) {
    cu::LaunchAttribute attribute;
    attribute.id = cu::kLaunchAttributeProgrammaticStreamSerialization;
    attribute.value = 1;
    cu::LaunchConfig config;
    config.gridDimX = launch.grid[0];
    config.gridDimY = launch.grid[1];
    config.gridDimZ = launch.grid[2];
    config.blockDimX = launch.block[0];
    config.blockDimY = launch.block[1];
    config.blockDimZ = launch.block[2];
    config.sharedMemBytes = launch.sharedMemoryBytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    driver.check(driver.api().launchKernelEx(&config, function, pointers.data(), nullptr),
                 "cuLaunchKernelEx(" + launch.kernel + ", programmatic dependent)");
    return;
  }
  driver.check(driver.api().launchKernel(function, launch.grid[0], launch.grid[1],
                                         launch.grid[2], launch.block[0], launch.block[1],
                                         launch.block[2], launch.sharedMemoryBytes, stream,
                                         pointers.data(), nullptr),
               "cuLaunchKernel(" + launch.kernel + ")");
}

} // namespace pagedc
