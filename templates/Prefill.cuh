//===- Prefill.cuh - Paged flex attention, FlashAttention-2 tiles -*- CUDA -*-===//
//
// One CTA computes kBlockM query rows of one (batch, query head): kWarpRows
// (16 or 32) rows per warp, tensor-core tiles (mma.sync m16n8k16; at 32 rows
// a warp's two 16-row tiles share every K and V fragment it reads from
// shared memory, which halves the ldmatrix bytes per MMA: the shape of
// FlashAttention-2's sm_80 kernel), online softmax in f32, and
// K/V tiles of kBlockN rows gathered from pages with cp.async, double
// buffered. The mods' row values are computed once per query row, or with
// kRecomputeModRows once per row and KV tile (fewer registers held across
// the KV loop). Only the KV tiles the block mask lists are visited: partial
// blocks call the mask mod per element, full blocks skip it; every visited
// element gets the score mod. When the CTA's query positions straddle
// several block-mask rows it makes one pass per mask row, each pass visible
// only to the rows that belong to it (online softmax makes passes additive).
//
// Grid: heads_q * batch * ceil(q_len / kBlockM) blocks in one dimension,
// the last query tiles first; a packed batch (kPackedBatch, BatchAttention:
// sequences of their own lengths in one q) takes heads_q * num_work_tiles,
// one per query head and entry of the plan's work list, and reads K/V
// through the call's page and slot strides. Block: kBlockM / kWarpRows warps;
// dynamic shared memory: (kBlockM + 4 * kBlockN) * kTileHeadDim * 2 bytes + 256
// (the staged pages of the next KV tile).
//
// 8-bit float caches (kKvFloat8, Float8Tiles.cuh): both stages' codes land
// in the second K and V stage and each tile is converted into the first
// before its math; the KV head's K scale multiplies the scores with
// args.scale, its V scale the output rows (f32). A packed batch's out may
// be f32 (kOutputF32, store_out_pair) instead of Element.
//
//===----------------------------------------------------------------------===//

namespace pagedc {
constexpr int kBlockM = pagedc_config::kBlockM;
constexpr int kBlockN = pagedc_config::kBlockN;
constexpr int kWarpRows = pagedc_config::kWarpRows;
constexpr bool kRecomputeModRows = pagedc_config::kRecomputeModRows;
/// 16-row MMA tiles per warp.
constexpr int kMTiles = kWarpRows / 16;
constexpr int kPrefillThreads = kBlockM / kWarpRows * 32;
/// Q fragments stay in registers only at D = 64; at D >= 128 they are
/// re-read from shared memory (ldmatrix) to stay clear of spills.
constexpr bool kPrefillQInRegisters = kHeadDim <= 64;
static_assert(kWarpRows == 16 || (kWarpRows == 32 && kHeadDim <= 128 && kValueHeadDim <= 128),
              "32 rows per warp need head dims <= 128");
static_assert(kBlockM == 64 || kBlockM == 128, "kBlockM must be 64 or 128");
static_assert(kBlockN == 32 || kBlockN == 64, "kBlockN must be 32 or 64");
/// Pages one KV tile touches (tiles start at multiples of kBlockN keys).
constexpr int kPrefillTilePages = kTilePagesOf<kBlockN>;
static_assert(kPrefillTilePages <= kPrefillThreads, "a thread per staged page");
} // namespace pagedc

// Minimum one CTA per SM: ptxas may use every register a thread can have.
// Without it ptxas aims at more CTAs per SM than shared memory allows (168
// registers at D 128, where 80 KiB of shared memory leaves room for 2) and
// spilled 60-76 bytes for a document mask with a bias score.
extern "C" __global__ void __launch_bounds__(pagedc::kPrefillThreads, 1)
    pagedc_prefill(const __grid_constant__ PagedcAttentionKernelArgs args,
                   const __grid_constant__ pagedc_mods::Params params) {
  using namespace pagedc;
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  // One-dimensional grid, heaviest CTAs first (prefill_tile; a packed
  // batch's work list, packed_prefill_tile). q_len: the rows of sequence b;
  // first_row: its first row of the packed q, out and lse (0 unpacked).
  int q_len = args.q_len, first_row = 0;
  PrefillTile tile;
  // A fixed grid (work_counts) has a CTA per tile the limits allow; those
  // past the step's tiles leave before their first copy or barrier, so no
  // CTA that stays waits on them.
  if constexpr (kPackedBatch)
    if (args.work_counts != nullptr &&
        static_cast<int>(blockIdx.x) / args.heads_q >= args.work_counts[0])
      return;
  if constexpr (kPackedBatch)
    tile = packed_prefill_tile<kBlockM>(args, q_len, first_row);
  else
    tile = prefill_tile<kBlockM>(args);
  const int h = tile.h, b = tile.b, row_begin = tile.row_begin, row_count = tile.row_count;
  const int kv_head = tile.kv_head, kv_len = tile.kv_len, q_offset = tile.q_offset;
  // A packed batch's tile's first key (its work list entry: kv_start, or
  // later where the mask's classifier proved the keys before it masked):
  // the tiles start at the one that holds it, whose rows below it are
  // neither copied nor kept. (Read where it is used rather than held
  // through the KV loop: the packed tiles at head dim 256 have no registers
  // to spare for it.)
  auto kv_from = [&]() -> int {
    if constexpr (kPackedBatch)
      return args.work_tiles[kPackedTileInts *
                                 recompute_here(static_cast<int>(blockIdx.x) / args.heads_q) +
                             2];
    return 0;
  };

  const uint32_t q_tile = shared_address(shared);
  const uint32_t k_tiles = q_tile + kBlockM * kTileRowBytes;
  const uint32_t v_tiles = k_tiles + 2 * kBlockN * kTileRowBytes;
  constexpr uint32_t kStageBytes = kBlockN * kTileRowBytes;
  // The pages of the next KV tile to copy, after the K/V stages: loaded
  // into a register by the threads below kPrefillTilePages while a tile is
  // computed and stored after its math, so the copies of the next iteration
  // do not wait on page-table loads (Decode.cuh does the same).
  int32_t *page_slots =
      reinterpret_cast<int32_t *>(shared + (kBlockM + 4 * kBlockN) * kTileRowBytes);

  const Element *q_rows = static_cast<const Element *>(args.q) +
                          b * args.q_stride[0] + h * args.q_stride[1] +
                          (first_row + row_begin) * args.q_stride[2];
  load_query_tile<kBlockM, kPrefillThreads>(q_tile, q_rows, args.q_stride[2],
                                            row_count, thread);
  cp_async_commit();

  // k_head, v_head: [pages, page_size, D] of this KV head.
  const Element *k_head =
      static_cast<const Element *>(args.k_cache) + kv_head * args.k_stride[0];
  const Element *v_head =
      static_cast<const Element *>(args.v_cache) + kv_head * args.v_stride[0];
  const KvTileCopier<kBlockN, kPrefillThreads> copy_kv = [&] {
    if constexpr (kPackedBatch)
      return KvTileCopier<kBlockN, kPrefillThreads>(k_head, v_head, thread, args.k_stride,
                                                    args.v_stride);
    else
      return KvTileCopier<kBlockN, kPrefillThreads>(k_head, v_head, thread);
  }();
  const int32_t *page_row = args.page_table + b * args.page_table_stride;
  // An 8-bit cache's codes: stage s's tiles at code_offset(s) from k_tiles
  // and v_tiles (their second stage); the first holds the converted tiles.
  const Float8TileCopier<kBlockN, kPrefillThreads> copy_codes(
      static_cast<const char *>(args.k_cache) + kv_head * args.k_stride[0],
      static_cast<const char *>(args.v_cache) + kv_head * args.v_stride[0], thread,
      args.k_stride, args.v_stride);
  auto code_offset = [](int at_stage) { return kStageBytes + at_stage * (kStageBytes / 2); };
  float k_scale = 1.0f;
  if constexpr (kKvFloat8 != 0)
    k_scale = args.k_scale[kv_head];

  // The 2 * kMTiles rows this thread holds (rows lane / 4 and lane / 4 + 8
  // of each 16-row tile), and their kv-independent mod values (computed
  // again for each KV tile with kRecomputeModRows, which holds only q).
  const int warp_row = warp * kWarpRows;
  int q_of[kMTiles][2];
  const int h_of[2] = {h, h};
  // A row's batch index for the mods: b, or a cascade level's own (the
  // token map). Read where it is used rather than held through the KV loop:
  // the packed tiles at head dim 256 have no registers to spare for it.
  auto row_batch = [&](int m, int half) -> int {
    if constexpr (kPackedBatch) {
      if (args.token_batch != nullptr) {
        const int row = row_begin + warp_row + 16 * m + (lane >> 2) + 8 * half;
        return args.token_batch[recompute_here(first_row + imin(row, q_len - 1))];
      }
    }
    return b;
  };
  pagedc_mods::MaskRow mask_rows[kMTiles][2];
  pagedc_mods::ScoreRow score_rows[kMTiles][2];
  RowState state[kMTiles];
  float out[kMTiles][kValueHeadDim / 8][4];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_begin + warp_row + 16 * m + (lane >> 2) + 8 * half;
      // Padding rows evaluate the last real row's mods and are never stored.
      q_of[m][half] = q_offset + imin(row, q_len - 1);
      if constexpr (kPackedBatch) {
        // A cascade level's rows: each its own position.
        if (args.token_position)
          q_of[m][half] = args.token_position[first_row + imin(row, q_len - 1)];
      }
      if constexpr (!kRecomputeModRows) {
        const int row_b = row_batch(m, half);
        mask_rows[m][half] = pagedc_mods::mask_row(params, row_b, h, q_of[m][half]);
        score_rows[m][half] = pagedc_mods::score_row(params, row_b, h, q_of[m][half]);
      }
      state[m].max[half] = -infinity();
      state[m].sum[half] = 0.0f;
    }
#pragma unroll
    for (int d = 0; d < kValueHeadDim / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        out[m][d][e] = 0.0f;
  }
  uint32_t q_regs[kMTiles][kPrefillQInRegisters ? kHeadDim / 16 : 1][4];
  bool q_ready = false;

  const bool has_block_mask = binds_block_mask(args);
  const int position_first = q_offset + row_begin;
  const int position_last = q_offset + row_begin + row_count - 1;
  const int pass_first = has_block_mask ? position_first / args.q_block_size : 0;
  const int pass_last = has_block_mask ? position_last / args.q_block_size : 0;

  for (int pass = pass_first; pass <= pass_last; ++pass) {
    // The visits of this pass (KvVisits).
    KvVisits<kBlockN> visits;
    if (!visits.start(args, b, h, pass, kv_len))
      break;
    // Bit 2m + half: row (m, half) belongs to this pass.
    unsigned visible_bits = 0;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        if (pass_first == pass_last || q_of[m][half] / args.q_block_size == pass)
          visible_bits |= 1u << (2 * m + half);

    // This thread's page of the tile starting at kv_first (tile_page).
    auto stage_page = [&](int kv_first) {
      return tile_page<kBlockN>(page_row, kv_first, kv_len, thread);
    };
    // keep_rows: the rows of the tile to copy (a packed batch's first tile
    // holds kv_start and skips the rows below it; the loop's later tiles are
    // past it, so they pass a constant and hold no mask through the loop).
    auto copy_tile = [&](int into_stage, int kv_first, uint64_t keep_rows) {
      if constexpr (kKvFloat8 != 0)
        copy_codes(k_tiles + code_offset(into_stage), v_tiles + code_offset(into_stage),
                   StagedPages{page_slots, kv_first}, kv_first, kv_len, keep_rows);
      else
        copy_kv(k_tiles + into_stage * kStageBytes, v_tiles + into_stage * kStageBytes,
                StagedPages{page_slots, kv_first}, kv_first, kv_len, keep_rows);
    };
    // (A packed batch has no block mask: visit `list` is tile `list`.)
    int list = kv_from() / kBlockN, sub = 0, stage = 0;
    int kv_begin = visits.seek(args, kv_len, list, sub);
    // (The previous pass's last reads of the slots are behind its last
    // barrier.)
    int32_t staged = list < visits.list_count ? stage_page(kv_begin) : 0;
    if (thread < kPrefillTilePages)
      page_slots[thread] = staged;
    __syncthreads();
    if (list < visits.list_count) {
      uint64_t keep_rows = ~static_cast<uint64_t>(0);
      if constexpr (kPackedBatch)
        if (kv_begin < kv_from())
          keep_rows <<= kv_from() - kv_begin;
      copy_tile(0, kv_begin, keep_rows);
    }
    cp_async_commit();
    int next_list = list, next_sub = sub;
    visits.advance(next_list, next_sub);
    int kv_next = visits.seek(args, kv_len, next_list, next_sub);
    staged = next_list < visits.list_count ? stage_page(kv_next) : 0;
    if (!q_ready) {
      cp_async_wait<1>();
      __syncthreads();
      if constexpr (kPrefillQInRegisters) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m)
#pragma unroll
          for (int k_step = 0; k_step < kHeadDim / 16; ++k_step)
            load_query_fragment(q_regs[m][k_step], q_tile, warp_row + 16 * m,
                                k_step, lane);
      }
      q_ready = true;
    } else {
      __syncthreads(); // the first tile's copies have read the slots
    }
    if (thread < kPrefillTilePages)
      page_slots[thread] = staged;
    __syncthreads();

    while (list < visits.list_count) {
      const bool is_full = visits.is_full(list);
      if (next_list < visits.list_count)
        copy_tile(stage ^ 1, kv_next, ~static_cast<uint64_t>(0));
      cp_async_commit();
      int after_list = next_list, after_sub = next_sub, kv_after = 0;
      if (next_list < visits.list_count) {
        visits.advance(after_list, after_sub);
        kv_after = visits.seek(args, kv_len, after_list, after_sub);
      }
      staged = after_list < visits.list_count ? stage_page(kv_after) : 0;
      cp_async_wait<1>();
      __syncthreads();
      if constexpr (kKvFloat8 != 0) {
        unsigned char *k_first = shared + kBlockM * kTileRowBytes;
        unsigned char *v_first = k_first + 2 * kStageBytes;
        convert_code_tiles<kBlockN, kPrefillThreads, SwizzledRows>(
            k_first, v_first, k_first + code_offset(stage), v_first + code_offset(stage),
            thread);
        __syncthreads();
      }
      // The tiles the math reads (an 8-bit cache's converted ones: stage 0).
      const int math_stage = kKvFloat8 != 0 ? 0 : stage;

      float scores[kMTiles][kBlockN / 8][4];
      warp_scores_rows<kMTiles, kBlockN / 8, kPrefillQInRegisters>(
          scores, q_regs, q_tile, warp_row, k_tiles + math_stage * kStageBytes, 0,
          lane);
      const bool check_mask[2] = {!is_full, !is_full};
      // Every element of the tile kept: no per-element tests (most tiles of
      // a long causal prefill).
      const bool all_kept = (is_full || !pagedc_mods::kHasMask) &&
                            kv_begin + kBlockN <= kv_len &&
                            visible_bits == (1u << (2 * kMTiles)) - 1;
      tally_tile(all_kept, lane);
      // A packed batch's keys below kv_start in this tile (none past it).
      const int kv_start_here = kv_from();
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        const bool visible[2] = {((visible_bits >> (2 * m)) & 1) != 0,
                                 ((visible_bits >> (2 * m + 1)) & 1) != 0};
        // With kRecomputeModRows, q goes through recompute_here: the row
        // values, and whatever the per-element part computes from q alone,
        // are computed here for this tile rather than hoisted before the
        // loop by the compiler. (Passing b and h through as well changed
        // nothing in the corpus.)
        int q_now[2];
        const int b_now[2] = {row_batch(m, 0), row_batch(m, 1)};
        pagedc_mods::MaskRow mask_now[2];
        pagedc_mods::ScoreRow score_now[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if constexpr (kRecomputeModRows) {
            q_now[half] = recompute_here(q_of[m][half]);
            mask_now[half] = pagedc_mods::mask_row(params, b_now[half], h, q_now[half]);
            score_now[half] = pagedc_mods::score_row(params, b_now[half], h, q_now[half]);
          } else {
            q_now[half] = q_of[m][half];
            mask_now[half] = mask_rows[m][half];
            score_now[half] = score_rows[m][half];
          }
        }
        // A key's mask values read once for both rows only at one 16-row tile
        // a warp (apply_mods' kKeyColumns).
        apply_mods<kBlockN / 8, 2, kMTiles == 1>(
            scores[m], params, mask_now, score_now, b_now, h_of, q_now, visible, check_mask,
            kv_begin, kv_len, kKvFloat8 != 0 ? args.scale * k_scale : args.scale, lane, all_kept);
        if constexpr (kPackedBatch)
          if (kv_begin < kv_start_here)
            mask_keys_below<kBlockN / 8>(scores[m], kv_begin, kv_start_here, lane);
        tally_rescale(online_softmax<kBlockN / 8>(state[m], scores[m], out[m]), lane);
      }
      warp_accumulate_rows<kMTiles, kBlockN / 8>(
          out, scores, v_tiles + math_stage * kStageBytes, 0, lane);
      // This iteration's copies read the slots before the barrier above.
      if (thread < kPrefillTilePages)
        page_slots[thread] = staged;
      __syncthreads();
      list = next_list;
      sub = next_sub;
      kv_begin = kv_next;
      next_list = after_list;
      next_sub = after_sub;
      kv_next = kv_after;
      stage ^= 1;
    }
  }
  cp_async_wait<0>();

  // Epilogue: normalise, store out rows (of Element, or f32) and lse.
  const int64_t out_base = b * args.out_stride[0] + h * args.out_stride[1];
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float row_lse;
      float inverse = finish_row(state[m].max[half], quad_sum(state[m].sum[half]),
                                 args.sinks != nullptr ? args.sinks + h : nullptr, row_lse);
      if constexpr (kKvFloat8 != 0)
        inverse *= args.v_scale[kv_head];
      const int row = row_begin + warp_row + 16 * m + (lane >> 2) + 8 * half;
      if (row >= q_len)
        continue;
      const int64_t out_row = out_base + (first_row + row) * args.out_stride[2] + 2 * (lane & 3);
#pragma unroll
      for (int d = 0; d < kValueHeadDim / 8; ++d)
        store_out_pair(args.out, out_row + d * 8, out[m][d][2 * half] * inverse,
                       out[m][d][2 * half + 1] * inverse);
      if constexpr (pagedc_config::kHasLse) {
        // [B, Hq, Lq], or a packed batch's [T, Hq].
        int64_t lse_at = (static_cast<int64_t>(b) * args.heads_q + h) * args.q_len + row;
        if constexpr (kPackedBatch)
          lse_at = static_cast<int64_t>(first_row + row) * args.heads_q + h;
        if ((lane & 3) == 0)
          args.lse[lse_at] = row_lse;
      }
    }
  }
}
