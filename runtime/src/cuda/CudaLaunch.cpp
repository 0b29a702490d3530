//===- CudaLaunch.cpp - Grid, shared memory and arguments of launches -----===//

#include "pagedc/CudaLaunch.h"

#include "Arithmetic.h"

#include "pagedc/Error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace pagedc {

namespace {

constexpr int kDecodeTile = 64;
constexpr int kMaxSplitBlocks = 64; // must match KernelSource.cpp
/// Fewest kv positions worth a split of their own.
constexpr int kMinSplitLength = 256;

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
  if (args.kv_num_blocks) {
    int tile = config.kind == KernelKind::Decode ? kDecodeTile : config.blockN;
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

AttentionLaunchPlan planAttention(const KernelConfig &config,
                                  const PagedcAttentionKernelArgs &callArgs,
                                  const std::vector<unsigned char> &params,
                                  int maxKvLength, int multiprocessors) {
  config.validate();
  if (config.kind == KernelKind::BlockMaskBuilder)
    throw Error("planAttention takes a prefill or decode kernel configuration");
  checkArgs(config, callArgs);
  if (config.paramsSize >= 0 && static_cast<int64_t>(params.size()) != config.paramsSize)
    throw Error(fmt::format("attention launch: {} bytes of params, the kernel was built "
                            "for {}",
                            params.size(), config.paramsSize));
  AttentionLaunchPlan plan;
  plan.headDim = config.headDim;
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
    const int64_t blocks =
        ceilDiv(args.q_len, config.blockM) * int64_t(args.heads_q) * args.batch;
    if (blocks > std::numeric_limits<int32_t>::max())
      throw Error(fmt::format("prefill of {} query rows x {} heads x batch {} needs {} CTAs, "
                              "more than a grid holds (2^31 - 1)",
                              args.q_len, args.heads_q, args.batch, blocks));
    main.grid[0] = static_cast<unsigned>(blocks);
    main.grid[1] = 1;
    main.grid[2] = 1;
    main.arguments = {bytesOf(args), params};
    plan.launches.push_back(std::move(main));
    return plan;
  }

  // Decode: enough splits for about two CTAs per SM, each a multiple of the
  // block-mask block (or of the tile) and at most kMaxSplitBlocks blocks.
  const int headChunks = static_cast<int>(ceilDiv(config.groupSize, config.decodeHeadsPerCta()));
  const int64_t ctasPerSplit = int64_t(args.batch) * args.heads_kv * headChunks;
  const int granularity = args.kv_num_blocks ? args.kv_block_size : kDecodeTile;
  int64_t splits = std::max<int64_t>(1, ceilDiv(2 * multiprocessors, ctasPerSplit));
  splits = std::min(splits, std::max<int64_t>(1, ceilDiv(maxKvLength, kMinSplitLength)));
  int64_t splitSize = ceilDiv(ceilDiv(maxKvLength, splits), granularity) * granularity;
  if (args.kv_num_blocks)
    splitSize = std::min<int64_t>(splitSize, int64_t(kMaxSplitBlocks) * args.kv_block_size);
  splits = ceilDiv(maxKvLength, splitSize);
  args.num_splits = static_cast<int32_t>(splits);
  args.split_size = static_cast<int32_t>(splitSize);

  main.kernel = "pagedc_decode";
  main.grid[0] = static_cast<unsigned>(splits);
  main.grid[1] = static_cast<unsigned>(args.heads_kv * headChunks);
  main.grid[2] = static_cast<unsigned>(args.batch);
  if (splits > 1) {
    size_t rows = size_t(args.batch) * args.heads_q * args.q_len * size_t(splits);
    plan.workspaceBytes = rows * (config.headDim + 1) * sizeof(float);
  }
  main.arguments = {bytesOf(args), params};
  plan.launches.push_back(std::move(main));
  if (splits > 1) {
    KernelLaunch merge;
    merge.kernel = "pagedc_decode_merge";
    merge.grid[0] = static_cast<unsigned>(args.q_len);
    merge.grid[1] = static_cast<unsigned>(args.heads_q);
    merge.grid[2] = static_cast<unsigned>(args.batch);
    merge.block[0] = 128;
    merge.arguments = {bytesOf(args)};
    plan.launches.push_back(std::move(merge));
  }
  return plan;
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
  driver.check(driver.api().launchKernel(function, launch.grid[0], launch.grid[1],
                                         launch.grid[2], launch.block[0], launch.block[1],
                                         launch.block[2], launch.sharedMemoryBytes, stream,
                                         pointers.data(), nullptr),
               "cuLaunchKernel(" + launch.kernel + ")");
}

} // namespace pagedc
