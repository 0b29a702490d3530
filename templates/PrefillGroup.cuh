//===- PrefillGroup.cuh - GQA-packed split-KV tiles of a packed batch -*- CUDA -*-===//
//
// pagedc_prefill_group: a packed batch's entries of more than a decode's
// tokens whose keys far outnumber them (a cascade's prefix level: a group's
// queries against the shared prefix; a short chunk at the end of a long
// context). Their cost is reading K/V, which the per-query-head tiles of
// Prefill.cuh read once per query head. Here one CTA computes kBlockM rows
// of one KV head, a row being a (token, query head of the KV head's group)
// pair, token-major (row p: token p / kGroupSize, head p % kGroupSize of
// the group), so each K/V tile a CTA copies into shared memory serves
// every query head of its KV head: an entry's K/V is read ceil(tokens x
// group / kBlockM) times per KV head instead of group x ceil(tokens / 64)
// times. Every warp reads the same K/V tile from shared memory.
//
// Rows per CTA: 8 warps always, each of kWarpRows rows: 16 (kBlockM 128)
// or 32 (kBlockM 256, head dims up to 128: once for 64 tokens under GQA 4).
// A 32-row warp holds two 16-row MMA blocks, each with its own scores,
// softmax state and output accumulators, that share every K and V fragment
// it reads from shared memory (warp_scores_rows, warp_accumulate_rows).
// Not 16 warps of 16 rows: a thread of a 512-thread CTA may have 128
// registers, and ptxas spilled 16-272 bytes there at head dims 64 to 128
// (the packed spill check's mods), where a thread of the 256-thread CTA
// may have 255. At head dim 256 two 16-row blocks' accumulators alone take
// 256 registers, so it keeps 16 rows a warp.
//
// Split-KV: the entry's keys from the tile that holds kv_start to kv_len
// are divided into num_splits parts of whole kBlockN tiles, one CTA each,
// so that a level of few entries still fills the machine; with more than
// one split each CTA writes normalised f32 partials and their lse, and
// pagedc_prefill_group_merge combines them (as pagedc_decode_merge does,
// the sink joining there once).
//
// Grid: (num_splits, heads_kv, num_work_tiles); work_tiles[2 z] = sequence
// b, work_tiles[2 z + 1] = its first row (token x group + head); block:
// 8 warps, warp w rows [w kWarpRows, (w + 1) kWarpRows). Partials:
// [heads_kv, num_work_tiles, kBlockM rows, num_splits] lse and [..., Dv]
// rows. Merge grid: (heads_kv * kBlockM / 4, num_work_tiles); block: 128
// threads, a warp per row.
//
// Packed batches have no block mask: the mask mod is evaluated per
// element. 8-bit float caches as in Prefill.cuh (Float8Tiles.cuh).
//
//===----------------------------------------------------------------------===//

namespace pagedc {
constexpr int kBlockM = pagedc_config::kBlockM;
constexpr int kBlockN = pagedc_config::kBlockN;
constexpr int kGroupSize = pagedc_config::kGroupSize;
constexpr bool kRecomputeModRows = pagedc_config::kRecomputeModRows;
constexpr int kWarpRows = pagedc_config::kWarpRows;
/// 16-row MMA blocks per warp.
constexpr int kMTiles = kWarpRows / 16;
constexpr int kPrefillThreads = kBlockM / kWarpRows * 32;
constexpr bool kPrefillQInRegisters = kHeadDim <= 64;
static_assert((kBlockM == 128 && kWarpRows == 16) ||
                  (kBlockM == 256 && kWarpRows == 32 && kHeadDim <= 128 && kValueHeadDim <= 128),
              "128 rows of 16 per warp, or 256 rows of 32 per warp up to head dim 128");
static_assert(kBlockN == 32 || kBlockN == 64, "kBlockN must be 32 or 64");
static_assert(kPackedBatch, "GQA-packed tiles take packed batches");
constexpr int kPrefillTilePages = kTilePagesOf<kBlockN>;
static_assert(kPrefillTilePages <= kPrefillThreads, "a thread per staged page");

/// Row `row` of a work tile's rows: its token (within the entry) and query
/// head, for the entry's q_len tokens; a padding row takes the last
/// token's and is never stored.
struct GroupRow {
  int token, head;
};
/// A row's values for the mods: query head, position and batch index.
struct GroupRowIds {
  int h, q, b;
};
PAGEDC_DEVICE GroupRow group_row(int row, int kv_head, int q_len) {
  GroupRow result;
  const int token = row / kGroupSize;
  result.head = kv_head * kGroupSize + (row - token * kGroupSize);
  result.token = imin(token, q_len - 1);
  return result;
}
} // namespace pagedc

extern "C" __global__ void __launch_bounds__(pagedc::kPrefillThreads, 1)
    pagedc_prefill_group(const __grid_constant__ PagedcAttentionKernelArgs args,
                         const __grid_constant__ pagedc_mods::Params params) {
  using namespace pagedc;
  // The merge may be scheduled once every CTA has started (sm_90); it
  // waits for this grid to finish.
  allow_dependent_launch();
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  const int split = blockIdx.x, kv_head = blockIdx.y, work = blockIdx.z;
  const int b = args.work_tiles[2 * work];
  const int row_begin = args.work_tiles[2 * work + 1];
  const int first_row = args.q_start[b];
  const int q_len = args.q_start[b + 1] - first_row;
  const int row_count = imin(kBlockM, q_len * kGroupSize - row_begin);
  const int kv_len = args.kv_len[b];
  const int q_offset = args.q_offset ? args.q_offset[b] : 0;
  // The first key (kv_start): the tiles start at the one that holds it,
  // whose rows below it are neither copied nor kept. (Read where used: the
  // tiles at head dim 256 have no registers to spare for it.)
  auto kv_from = [&]() -> int { return args.kv_start ? args.kv_start[recompute_here(b)] : 0; };

  // Split `split` of num_splits equal parts of the entry's tiles.
  const int range_begin = imin(kv_from() / kBlockN * kBlockN, kv_len);
  const int tiles = (kv_len - range_begin + kBlockN - 1) / kBlockN;
  const int split_tiles = (tiles + args.num_splits - 1) / args.num_splits;
  const int tile_first = imin(split * split_tiles, tiles);
  const int tile_end = imin(tile_first + split_tiles, tiles);

  const uint32_t q_tile = shared_address(shared);
  const uint32_t k_tiles = q_tile + kBlockM * kTileRowBytes;
  const uint32_t v_tiles = k_tiles + 2 * kBlockN * kTileRowBytes;
  constexpr uint32_t kStageBytes = kBlockN * kTileRowBytes;
  int32_t *page_slots =
      reinterpret_cast<int32_t *>(shared + (kBlockM + 4 * kBlockN) * kTileRowBytes);
  // After the 64 page slots: the tile's rows' positions and batch indices
  // (kRecomputeModRows reads them for each KV tile).
  int32_t *row_positions = page_slots + 64;
  int32_t *row_batches = row_positions + kBlockM;

  // Query rows: row p of the tile is token p / group of the entry, query
  // head p % group of the KV head (q [T, Hq, D]: a token's heads adjacent).
  {
    const Element *q = static_cast<const Element *>(args.q);
    constexpr int kChunks = kBlockM * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kChunks + kPrefillThreads - 1) / kPrefillThreads; ++i) {
      const int index = thread + i * kPrefillThreads;
      if (kChunks % kPrefillThreads != 0 && index >= kChunks)
        break;
      const int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
      const bool valid = row < row_count;
      const GroupRow info = group_row(row_begin + (valid ? row : 0), kv_head, q_len);
      const Element *source = q + info.head * args.q_stride[1] +
                              (first_row + info.token) * args.q_stride[2] + chunk * 8;
      cp_async_16(q_tile + tile_offset(row, chunk), source, valid ? 16 : 0);
    }
  }
  cp_async_commit();

  const Element *k_head =
      static_cast<const Element *>(args.k_cache) + kv_head * args.k_stride[0];
  const Element *v_head =
      static_cast<const Element *>(args.v_cache) + kv_head * args.v_stride[0];
  const KvTileCopier<kBlockN, kPrefillThreads> copy_kv(k_head, v_head, thread, args.k_stride,
                                                    args.v_stride);
  const int32_t *page_row = args.page_table + b * args.page_table_stride;
  const Float8TileCopier<kBlockN, kPrefillThreads> copy_codes(
      static_cast<const char *>(args.k_cache) + kv_head * args.k_stride[0],
      static_cast<const char *>(args.v_cache) + kv_head * args.v_stride[0], thread,
      args.k_stride, args.v_stride);
  auto code_offset = [](int at_stage) { return kStageBytes + at_stage * (kStageBytes / 2); };
  float k_scale = 1.0f;
  if constexpr (kKvFloat8 != 0)
    k_scale = args.k_scale[kv_head];

  // The 2 * kMTiles rows this thread holds: lane / 4 and lane / 4 + 8 of
  // each of its warp's 16-row blocks.
  const int warp_row = warp * kWarpRows;
  // A warp whose rows are all past the tile's computes nothing (it still
  // copies and meets the barriers).
  const bool warp_has_rows = warp_row < row_count;
  // Row (m, half)'s ids (a cascade level's token maps give its position
  // and batch index); padding rows take the tile's last row and are never
  // stored. With kRecomputeModRows the ids are read again for each KV tile
  // (from row_positions and row_batches, where the rows' thread puts them
  // once; the row index goes through recompute_here) rather than held
  // across the loop with their kv-independent mod values: 32-row warps at
  // head dim 128 have no registers to spare for them.
  auto row_ids = [&](int at) {
    const GroupRow info = group_row(row_begin + imin(at, imax(row_count - 1, 0)), kv_head, q_len);
    GroupRowIds ids;
    ids.h = info.head;
    ids.q =
        args.token_position ? args.token_position[first_row + info.token] : q_offset + info.token;
    ids.b = args.token_batch ? args.token_batch[first_row + info.token] : b;
    return ids;
  };
  GroupRowIds ids_of[kMTiles][2];
  pagedc_mods::MaskRow mask_rows[kMTiles][2];
  pagedc_mods::ScoreRow score_rows[kMTiles][2];
  RowState state[kMTiles];
  float out[kMTiles][kValueHeadDim / 8][4];
  if constexpr (kRecomputeModRows) {
    if (thread < kBlockM) {
      const GroupRowIds ids = row_ids(thread);
      row_positions[thread] = ids.q;
      row_batches[thread] = ids.b;
    }
  }
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    reset_rows(state[m], out[m]);
    if constexpr (!kRecomputeModRows) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const GroupRowIds ids = row_ids(warp_row + 16 * m + (lane >> 2) + 8 * half);
        ids_of[m][half] = ids;
        mask_rows[m][half] = pagedc_mods::mask_row(params, ids.b, ids.h, ids.q);
        score_rows[m][half] = pagedc_mods::score_row(params, ids.b, ids.h, ids.q);
      }
    }
  }
  uint32_t q_regs[kMTiles][kPrefillQInRegisters ? kHeadDim / 16 : 1][4];

  auto stage_page = [&](int kv_first) {
    return tile_page<kBlockN>(page_row, kv_first, kv_len, thread);
  };
  auto copy_tile = [&](int into_stage, int kv_first, uint64_t keep_rows) {
    if constexpr (kKvFloat8 != 0)
      copy_codes(k_tiles + code_offset(into_stage), v_tiles + code_offset(into_stage),
                 StagedPages{page_slots, kv_first}, kv_first, kv_len, keep_rows);
    else
      copy_kv(k_tiles + into_stage * kStageBytes, v_tiles + into_stage * kStageBytes,
              StagedPages{page_slots, kv_first}, kv_first, kv_len, keep_rows);
  };

  int tile = tile_first, stage = 0;
  int kv_begin = range_begin + tile * kBlockN;
  int32_t staged = tile < tile_end ? stage_page(kv_begin) : 0;
  if (thread < kPrefillTilePages)
    page_slots[thread] = staged;
  __syncthreads();
  if (tile < tile_end) {
    // The first tile of the entry's range may hold keys below kv_start.
    uint64_t keep_rows = ~static_cast<uint64_t>(0);
    if (kv_begin < kv_from())
      keep_rows <<= kv_from() - kv_begin;
    copy_tile(0, kv_begin, keep_rows);
  }
  cp_async_commit();
  staged = tile + 1 < tile_end ? stage_page(kv_begin + kBlockN) : 0;
  cp_async_wait<1>();
  __syncthreads(); // q landed; the first tile's copies have read the slots
  if constexpr (kPrefillQInRegisters) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int k_step = 0; k_step < kHeadDim / 16; ++k_step)
        load_query_fragment(q_regs[m][k_step], q_tile, warp_row + 16 * m, k_step, lane);
  }
  if (thread < kPrefillTilePages)
    page_slots[thread] = staged;
  __syncthreads();

  for (; tile < tile_end; ++tile, kv_begin += kBlockN) {
    const int kv_next = kv_begin + kBlockN;
    if (tile + 1 < tile_end)
      copy_tile(stage ^ 1, kv_next, ~static_cast<uint64_t>(0));
    cp_async_commit();
    staged = tile + 2 < tile_end ? stage_page(kv_next + kBlockN) : 0;
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (kKvFloat8 != 0) {
      unsigned char *k_first = shared + kBlockM * kTileRowBytes;
      unsigned char *v_first = k_first + 2 * kStageBytes;
      convert_code_tiles<kBlockN, kPrefillThreads, SwizzledRows>(
          k_first, v_first, k_first + code_offset(stage), v_first + code_offset(stage), thread);
      __syncthreads();
    }
    const int math_stage = kKvFloat8 != 0 ? 0 : stage;
    if (warp_has_rows) {
      // Both row blocks' scores from one read of each K fragment.
      float scores[kMTiles][kBlockN / 8][4];
      warp_scores_rows<kMTiles, kBlockN / 8, kPrefillQInRegisters>(
          scores, q_regs, q_tile, warp_row, k_tiles + math_stage * kStageBytes, 0, lane);
      const bool visible[2] = {true, true};
      const bool check_mask[2] = {true, true};
      const bool all_kept = !pagedc_mods::kHasMask && kv_begin + kBlockN <= kv_len;
      tally_tile(all_kept, lane);
      const int kv_start_here = kv_from();
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        int h_now[2], q_now[2], b_now[2];
        pagedc_mods::MaskRow mask_now[2];
        pagedc_mods::ScoreRow score_now[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if constexpr (kRecomputeModRows) {
            const int at = imin(recompute_here(warp_row + 16 * m + (lane >> 2) + 8 * half),
                                imax(row_count - 1, 0));
            h_now[half] = group_row(row_begin + at, kv_head, q_len).head;
            q_now[half] = row_positions[at];
            b_now[half] = row_batches[at];
            mask_now[half] = pagedc_mods::mask_row(params, b_now[half], h_now[half], q_now[half]);
            score_now[half] = pagedc_mods::score_row(params, b_now[half], h_now[half], q_now[half]);
          } else {
            h_now[half] = ids_of[m][half].h;
            q_now[half] = ids_of[m][half].q;
            b_now[half] = ids_of[m][half].b;
            mask_now[half] = mask_rows[m][half];
            score_now[half] = score_rows[m][half];
          }
        }
        // A key's mask values read once for both rows only at one 16-row tile
        // a warp (apply_mods' kKeyColumns).
        apply_mods<kBlockN / 8, 2, kMTiles == 1>(
            scores[m], params, mask_now, score_now, b_now, h_now, q_now, visible, check_mask,
            kv_begin, kv_len, kKvFloat8 != 0 ? args.scale * k_scale : args.scale, lane, all_kept);
        if (kv_begin < kv_start_here)
          mask_keys_below<kBlockN / 8>(scores[m], kv_begin, kv_start_here, lane);
        tally_rescale(online_softmax<kBlockN / 8>(state[m], scores[m], out[m]), lane);
      }
      // Both row blocks' outputs from one read of each V fragment.
      warp_accumulate_rows<kMTiles, kBlockN / 8>(out, scores, v_tiles + math_stage * kStageBytes, 0,
                                                 lane);
    }
    if (thread < kPrefillTilePages)
      page_slots[thread] = staged;
    __syncthreads();
    stage ^= 1;
  }
  cp_async_wait<0>();

  // Epilogue: one split writes out (Element or f32) and lse; several write
  // f32 partials (the sink joins in the merge, once).
  const bool single_split = args.num_splits == 1;
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // (Every lane of the warp takes part in the quad's sum.)
      const float sum = quad_sum(state[m].sum[half]);
      const int row = warp_row + 16 * m + (lane >> 2) + 8 * half;
      if (row >= row_count)
        continue;
      const GroupRow info = group_row(row_begin + row, kv_head, q_len);
      float row_lse;
      float inverse = finish_row(
          state[m].max[half], sum,
          single_split && args.sinks != nullptr ? args.sinks + info.head : nullptr, row_lse);
      if constexpr (kKvFloat8 != 0)
        inverse *= args.v_scale[kv_head];
      if (single_split) {
        const int64_t out_row = info.head * args.out_stride[1] +
                                (first_row + info.token) * args.out_stride[2] + 2 * (lane & 3);
#pragma unroll
        for (int d = 0; d < kValueHeadDim / 8; ++d)
          store_out_pair(args.out, out_row + d * 8, out[m][d][2 * half] * inverse,
                         out[m][d][2 * half + 1] * inverse);
        if constexpr (pagedc_config::kHasLse)
          if ((lane & 3) == 0)
            args.lse[static_cast<int64_t>(first_row + info.token) * args.heads_q + info.head] =
                row_lse;
      } else {
        const int64_t partial_row =
            ((static_cast<int64_t>(kv_head) * args.num_work_tiles + work) * kBlockM + row) *
                args.num_splits +
            split;
        float *partial = args.partial_out + partial_row * kValueHeadDim + 2 * (lane & 3);
#pragma unroll
        for (int d = 0; d < kValueHeadDim / 8; ++d) {
          partial[d * 8] = out[m][d][2 * half] * inverse;
          partial[d * 8 + 1] = out[m][d][2 * half + 1] * inverse;
        }
        if ((lane & 3) == 0)
          args.partial_lse[partial_row] = row_lse;
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(128)
    pagedc_prefill_group_merge(const __grid_constant__ PagedcAttentionKernelArgs args) {
  using namespace pagedc;
  // Launched while the split kernel drains: its partials are complete and
  // visible only after this wait.
  wait_for_prerequisite_grid();
  const int lane = threadIdx.x & 31;
  // x: the KV head's kBlockM / 4 CTAs of four rows each.
  const int kv_head = blockIdx.x / (kBlockM / 4), work = blockIdx.y;
  const int row = (blockIdx.x % (kBlockM / 4)) * 4 + (threadIdx.x >> 5);
  const int b = args.work_tiles[2 * work];
  const int row_begin = args.work_tiles[2 * work + 1];
  const int first_row = args.q_start[b];
  const int q_len = args.q_start[b + 1] - first_row;
  if (row >= imin(kBlockM, q_len * kGroupSize - row_begin))
    return;
  const int splits = args.num_splits;
  const GroupRow info = group_row(row_begin + row, kv_head, q_len);
  // partial_lse: [splits] of this row; partial_out: [splits, Dv].
  const int64_t partial_row =
      ((static_cast<int64_t>(kv_head) * args.num_work_tiles + work) * kBlockM + row) * splits;
  const float *lse = args.partial_lse + partial_row;
  const float *partial = args.partial_out + partial_row * kValueHeadDim;
  const float sink = args.sinks != nullptr ? args.sinks[info.head] : -infinity();
  float row_max = sink;
  for (int i = 0; i < splits; ++i)
    row_max = fmaxf(row_max, lse[i]);
  const float base = row_max == -infinity() ? 0.0f : row_max;
  float total = exp2_approx((sink - base) * kLog2e);
  for (int i = 0; i < splits; ++i)
    total += exp2_approx((lse[i] - base) * kLog2e);
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
  const int64_t out_row =
      info.head * args.out_stride[1] + (first_row + info.token) * args.out_stride[2];
  for (int column = lane * 2; column < kValueHeadDim; column += 64) {
    float x = 0.0f, y = 0.0f;
    for (int i = 0; i < splits; ++i) {
      const float weight = exp2_approx((lse[i] - base) * kLog2e);
      x += weight * partial[i * kValueHeadDim + column];
      y += weight * partial[i * kValueHeadDim + column + 1];
    }
    store_out_pair(args.out, out_row + column, x * inverse, y * inverse);
  }
  if constexpr (pagedc_config::kHasLse)
    if (lane == 0)
      args.lse[static_cast<int64_t>(first_row + info.token) * args.heads_q + info.head] =
          total > 0.0f ? row_max + logf(total) : -infinity();
}
