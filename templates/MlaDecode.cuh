//===- MlaDecode.cuh - MLA decode over a shared latent cache -*- CUDA -*-===//
//
// pagedc_decode for multi-head latent attention (DeepSeek-V2/V3 after
// weight absorption), selected where D is 576 and Dv 512 (KernelConfig::
// isMlaDecode): one KV head whose 576-wide rows are both the keys and,
// their first 512 columns, the values, and a GQA group of every query head
// (16 to 128). Packed batches only (BatchAttention), whose decode list
// gives grid z; its merge kernel, pagedc_decode_merge, is below.
//
// Why a kernel of its own: Decode.cuh computes up to 64 rows of
// (head, token) with a thread holding every output column of its rows
// (Dv / 2 floats: 256 at Dv 512) and a Q and two K and two V stages of the
// full width, which neither the registers nor sm_80's 163 KB of shared
// memory hold at D 576. Here a CTA of 8 warps computes kMlaRows = 32 rows
// of the group's (token, head) pairs, flattened token-major, so a 1-token
// decode of 16 heads fills one CTA's rows half and one of 128 heads fills
// four CTAs. Grid y is the most rows the group may have (8 tokens) in
// chunks of 32; a CTA whose chunk is past its sequence's tokens returns at
// once.
//
// The warps form a 2 x 4 grid: row warp r holds rows 16 r .. 16 r + 15,
// column warp c
//  - for the scores, the k-range [144 c, 144 c + 144) of D: its nine Q
//    fragments stay in registers for the whole kernel and it reads only
//    that slice of each K row; the four partial score tiles of a row warp
//    are summed through shared memory (each warp sums all four in the same
//    order, so the four hold bit-identical scores and softmax states and
//    no further exchange is needed);
//  - for the output, columns [128 c, 128 c + 128) of Dv (64 f32 a thread),
//    read from the same K tile's first 512 columns: V's bytes are never
//    fetched on their own.
// Each 32-key tile of the latent rows (36 KB) comes once into shared memory
// by cp.async (two stages, gathered through the call's page and slot
// strides) and serves the CTA's 32 rows for both products.
//
// Splits: as Decode.cuh's packed batches, a CTA takes the split-th of
// num_splits equal parts of its sequence's keys from the 64-key tile that
// holds kv_start, in whole 64-key granules (the host plans them so);
// partials are indexed by decode-list entry and merged below.
//
//===----------------------------------------------------------------------===//

namespace pagedc {
constexpr int kMlaThreads = 256;
constexpr int kMlaRows = 32;
constexpr int kMlaRowWarps = kMlaRows / 16;
constexpr int kMlaColumnWarps = 4;
static_assert(kMlaRowWarps * kMlaColumnWarps * 32 == kMlaThreads, "a 2 x 4 grid of warps");
constexpr int kMlaTileN = 32;
/// Splits come in granules of the host's decode tile (64 keys).
constexpr int kMlaGranule = 64;
constexpr int kMlaQueryTokens = pagedc_config::kQueryTokens;
constexpr int kMlaGroup = pagedc_config::kGroupSize;
/// The k-steps (16 columns of D) of one column warp's scores.
constexpr int kMlaKSteps = kHeadDim / 16 / kMlaColumnWarps;
/// Output columns of one column warp, in 8-column MMA tiles.
constexpr int kMlaColumns = kValueHeadDim / kMlaColumnWarps;
constexpr int kMlaOutTiles = kMlaColumns / 8;
constexpr int kMlaScoreTiles = kMlaTileN / 8;
static_assert(kHeadDim == 576 && kValueHeadDim == 512, "MLA: D 576, Dv 512");
static_assert(kPackedBatch, "MLA decode runs packed batches (BatchAttention)");
static_assert(kHeadDim % (16 * kMlaColumnWarps) == 0, "whole k-steps per column warp");
static_assert(pagedc_config::kKvFloat8 == 0, "MLA decode reads 16-bit caches");
/// Byte sizes of the shared-memory regions: the query tile, two K stages,
/// and the partial scores (a float per row, key and column warp).
constexpr int kMlaQBytes = kMlaRows * kTileRowBytes;
constexpr int kMlaStageBytes = kMlaTileN * kTileRowBytes;
constexpr int kMlaPartialBytes = kMlaThreads / 32 * 16 * kMlaTileN * 4;
/// 16-byte chunks of a latent row, and of a tile.
constexpr int kMlaTileChunks = kMlaTileN * kChunksPerRow;

/// A CTA row's (head, token): row `row` (0..kMlaRows) of chunk `chunk` is
/// the group's pair chunk * kMlaRows + row, token-major; `valid` when it
/// exists. Rows past them take the last pair's head and token, so mods see
/// real indices.
struct MlaRow {
  int head, token;
  bool valid;
};
PAGEDC_DEVICE MlaRow mla_row(int row, int chunk, int kv_head, int q_len) {
  const int pair = chunk * kMlaRows + row;
  const int last = kMlaGroup * q_len - 1;
  const int at = imin(pair, last);
  MlaRow result;
  result.valid = pair <= last;
  result.token = at / kMlaGroup;
  result.head = kv_head * kMlaGroup + at % kMlaGroup;
  return result;
}
} // namespace pagedc

extern "C" __global__ void __launch_bounds__(pagedc::kMlaThreads, 1)
    pagedc_decode(const __grid_constant__ PagedcAttentionKernelArgs args,
                  const __grid_constant__ pagedc_mods::Params params,
                  const __grid_constant__ PagedcDecodeMapArgs) {
  using namespace pagedc;
  allow_dependent_launch();
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  const int row_warp = warp / kMlaColumnWarps, column_warp = warp % kMlaColumnWarps;
  const int split = blockIdx.x;
  const int kv_head = blockIdx.y / ((kMlaGroup * kMlaQueryTokens + kMlaRows - 1) / kMlaRows);
  const int chunk = blockIdx.y % ((kMlaGroup * kMlaQueryTokens + kMlaRows - 1) / kMlaRows);
  const int b = args.work_tiles[2 * blockIdx.z];
  const int first_row = args.q_start[b];
  const int q_len = args.q_start[b + 1] - first_row;
  // A chunk past the sequence's rows (fewer tokens than the grid's 8).
  if (chunk * kMlaRows >= kMlaGroup * q_len)
    return;
  const int kv_len = args.kv_len[b];

  const uint32_t q_tile = shared_address(shared);
  const uint32_t k_tiles = q_tile + kMlaQBytes;
  float *partials = reinterpret_cast<float *>(shared + kMlaQBytes + 2 * kMlaStageBytes);

  // The CTA's query rows, zero-filled past its pairs.
  {
    const Element *q = static_cast<const Element *>(args.q);
    constexpr int kChunks = kMlaRows * kChunksPerRow;
#pragma unroll 3
    for (int index = thread; index < kChunks; index += kMlaThreads) {
      const int row = index / kChunksPerRow, part = index % kChunksPerRow;
      const MlaRow info = mla_row(row, chunk, kv_head, q_len);
      const Element *source =
          q + info.head * args.q_stride[1] + (first_row + info.token) * args.q_stride[2] + part * 8;
      cp_async_16(q_tile + tile_offset(row, part), source, info.valid ? 16 : 0);
    }
    cp_async_commit();
  }

  // This CTA's keys: its split of [the 64-key tile holding kv_start, kv_len).
  const int kv_from = args.kv_start ? args.kv_start[b] : 0;
  const int range_begin = imin(kv_from / kMlaGranule * kMlaGranule, kv_len);
  const int granules = (kv_len - range_begin + kMlaGranule - 1) / kMlaGranule;
  const int split_granules = (granules + args.num_splits - 1) / args.num_splits;
  const int64_t split_at =
      range_begin + static_cast<int64_t>(split) * split_granules * kMlaGranule;
  const int split_begin = static_cast<int>(imin64(split_at, kv_len));
  const int split_end = static_cast<int>(
      imin64(split_at + static_cast<int64_t>(split_granules) * kMlaGranule, kv_len));
  const int tiles = (split_end - split_begin + kMlaTileN - 1) / kMlaTileN;

  // Latent rows [kv_begin, kv_begin + kMlaTileN) into stage `stage`: rows
  // at or past split_end, or below kv_from, are zero-filled, not read.
  const char *latent = static_cast<const char *>(args.k_cache) +
                       kv_head * args.k_stride[0] * static_cast<int64_t>(sizeof(Element));
  const int64_t page_bytes = args.k_stride[1] * static_cast<int64_t>(sizeof(Element));
  const int64_t slot_bytes = args.k_stride[2] * static_cast<int64_t>(sizeof(Element));
  const int32_t *page_row = args.page_table + b * args.page_table_stride;
  auto copy_tile = [&](int stage, int tile) {
    const int kv_begin = split_begin + tile * kMlaTileN;
    const uint32_t into = k_tiles + stage * kMlaStageBytes;
#pragma unroll 3
    for (int index = thread; index < kMlaTileChunks; index += kMlaThreads) {
      const int row = index / kChunksPerRow, part = index % kChunksPerRow;
      const int kv = kv_begin + row;
      const bool valid = kv < split_end && kv >= kv_from;
      int64_t offset = 0;
      if (valid)
        offset = page_row[kv >> kLog2PageSize] * page_bytes + (kv & (kPageSize - 1)) * slot_bytes;
      cp_async_16(into + tile_offset(row, part), latent + offset + part * 16, valid ? 16 : 0);
    }
  };
  if (tiles > 0)
    copy_tile(0, 0);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // The warp's Q fragments: its 16 rows, its slice of D.
  uint32_t q_regs[kMlaKSteps][4];
#pragma unroll
  for (int step = 0; step < kMlaKSteps; ++step)
    load_query_fragment(q_regs[step], q_tile, row_warp * 16, column_warp * kMlaKSteps + step,
                        lane);

  // The two rows this thread holds (lane / 4 and lane / 4 + 8 of its row
  // warp's 16): their mod rows, heads, positions and batch indices (the
  // token maps, which the host always uploads).
  int b_of[2], h_of[2], q_of[2];
  bool row_valid[2];
  pagedc_mods::MaskRow mask_rows[2];
  pagedc_mods::ScoreRow score_rows[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const MlaRow info = mla_row(row_warp * 16 + (lane >> 2) + 8 * half, chunk, kv_head, q_len);
    const int token = first_row + info.token;
    row_valid[half] = info.valid;
    h_of[half] = info.head;
    q_of[half] = args.token_position[token];
    b_of[half] = args.token_batch[token];
    mask_rows[half] = pagedc_mods::mask_row(params, b_of[half], info.head, q_of[half]);
    score_rows[half] = pagedc_mods::score_row(params, b_of[half], info.head, q_of[half]);
  }
  const bool visible[2] = {true, true}, check_mask[2] = {true, true};

  RowState state;
  float out[kMlaOutTiles][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state.max[half] = -infinity();
    state.sum[half] = 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kMlaOutTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[j][e] = 0.0f;

  // A warp's partial scores: float j of lane l at [warp][j][l].
  float *my_partials = partials + warp * 16 * kMlaTileN + lane;
  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile & 1;
    const int kv_begin = split_begin + tile * kMlaTileN;
    // The next tile's copy goes into the stage the previous tile's math
    // read (ended by the barrier at this loop's end).
    if (tile + 1 < tiles)
      copy_tile(stage ^ 1, tile + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint32_t k_tile = k_tiles + stage * kMlaStageBytes;

    // Partial scores over the warp's slice of D.
    float scores[1][kMlaScoreTiles][4];
#pragma unroll
    for (int j = 0; j < kMlaScoreTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        scores[0][j][e] = 0.0f;
#pragma unroll
    for (int step = 0; step < kMlaKSteps; ++step) {
      const uint32_t(&a)[1][4] = reinterpret_cast<const uint32_t(&)[1][4]>(q_regs[step]);
      warp_scores_step<1, kMlaScoreTiles>(scores, a, k_tile, 0, column_warp * kMlaKSteps + step,
                                          lane);
    }
#pragma unroll
    for (int j = 0; j < kMlaScoreTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        my_partials[(4 * j + e) * 32] = scores[0][j][e];
    __syncthreads();
    // The row warp's four partials, summed in column-warp order by each of
    // its warps alike.
    float (&sums)[kMlaScoreTiles][4] = scores[0];
    const float *row_partials = partials + row_warp * kMlaColumnWarps * 16 * kMlaTileN + lane;
#pragma unroll
    for (int j = 0; j < kMlaScoreTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float total = row_partials[(4 * j + e) * 32];
#pragma unroll
        for (int w = 1; w < kMlaColumnWarps; ++w)
          total += row_partials[w * 16 * kMlaTileN + (4 * j + e) * 32];
        sums[j][e] = total;
      }

    const bool all_kept = !pagedc_mods::kHasMask && kv_begin >= kv_from &&
                          kv_begin + kMlaTileN <= split_end;
    apply_mods<kMlaScoreTiles>(sums, params, mask_rows, score_rows, b_of, h_of, q_of, visible,
                               check_mask, kv_begin, split_end, args.scale, lane, all_kept);
    if (kv_begin < kv_from)
      mask_keys_below<kMlaScoreTiles>(sums, kv_begin, kv_from, lane);
    float rescale[2];
    softmax_tile<kMlaScoreTiles>(state, sums, rescale);
    if (__ballot_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < kMlaOutTiles; ++j) {
        out[j][0] *= rescale[0];
        out[j][1] *= rescale[0];
        out[j][2] *= rescale[1];
        out[j][3] *= rescale[1];
      }
    }

    // out += P V, V the tile's columns [128 c, 128 c + 128).
#pragma unroll
    for (int step = 0; step < kMlaScoreTiles / 2; ++step) {
      uint32_t a[4];
      a[0] = pack_pair(sums[2 * step][0], sums[2 * step][1]);
      a[1] = pack_pair(sums[2 * step][2], sums[2 * step][3]);
      a[2] = pack_pair(sums[2 * step + 1][0], sums[2 * step + 1][1]);
      a[3] = pack_pair(sums[2 * step + 1][2], sums[2 * step + 1][3]);
      const int row = step * 16 + (lane & 15);
#pragma unroll
      for (int pair = 0; pair < kMlaOutTiles / 2; ++pair) {
        uint32_t v[4];
        ldmatrix_x4_trans(
            v, k_tile + tile_offset(row, column_warp * (kMlaColumns / 8) + pair * 2 + (lane >> 4)));
        mma_16816(out[2 * pair], a, v[0], v[1]);
        mma_16816(out[2 * pair + 1], a, v[2], v[3]);
      }
    }
    // Every warp is done with this stage and with the partials before the
    // next iteration's copy and scores overwrite them.
    __syncthreads();
  }
  cp_async_wait<0>();

  // Rows out: normalised with one split (and the sinks), else the split's
  // f32 partial and its lse.
  const bool single_split = args.num_splits == 1;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (!row_valid[half])
      continue;
    const int row = row_warp * 16 + (lane >> 2) + 8 * half;
    const MlaRow info = mla_row(row, chunk, kv_head, q_len);
    float lse;
    const float factor =
        finish_row(state.max[half], quad_sum(state.sum[half]),
                   single_split && args.sinks != nullptr ? args.sinks + info.head : nullptr, lse);
    const int64_t entry =
        (static_cast<int64_t>(blockIdx.z) * kMlaQueryTokens + info.token) * args.heads_q +
        info.head;
    if (column_warp == 0 && (lane & 3) == 0) {
      if (single_split)
        args.lse[static_cast<int64_t>(first_row + info.token) * args.heads_q + info.head] = lse;
      else
        args.partial_lse[entry * args.num_splits + split] = lse;
    }
    const int64_t out_row =
        info.head * args.out_stride[1] + (first_row + info.token) * args.out_stride[2];
    float *partial = args.partial_out + (entry * args.num_splits + split) * kValueHeadDim;
#pragma unroll
    for (int j = 0; j < kMlaOutTiles; ++j) {
      const int column = column_warp * kMlaColumns + j * 8 + 2 * (lane & 3);
      const float x = out[j][2 * half] * factor, y = out[j][2 * half + 1] * factor;
      if (single_split) {
        store_out_pair(args.out, out_row + column, x, y);
      } else {
        partial[column] = x;
        partial[column + 1] = y;
      }
    }
  }
}

/// The splits' merge for the MLA decode: grid (8 tokens, heads_q, decode
/// list entries), 128 threads; a row past its sequence's tokens returns.
/// out = sum_i exp(lse_i - L) out_i / sum_i exp(lse_i - L) with the sink
/// (a logit of zero value) joining once as one more state.
extern "C" __global__ void __launch_bounds__(128)
    pagedc_decode_merge(const __grid_constant__ PagedcAttentionKernelArgs args) {
  using namespace pagedc;
  wait_for_prerequisite_grid();
  const int token = blockIdx.x, h = blockIdx.y;
  const int splits = args.num_splits;
  const int b = args.work_tiles[2 * blockIdx.z];
  const int first_row = args.q_start[b];
  if (token >= args.q_start[b + 1] - first_row)
    return;
  const int64_t entry =
      (static_cast<int64_t>(blockIdx.z) * kMlaQueryTokens + token) * args.heads_q + h;
  const float *lse = args.partial_lse + entry * splits;
  const float *partial = args.partial_out + entry * splits * kValueHeadDim;
  const float sink = args.sinks != nullptr ? args.sinks[h] : -infinity();
  float row_max = sink;
  for (int i = 0; i < splits; ++i)
    row_max = fmaxf(row_max, lse[i]);
  const float base = row_max == -infinity() ? 0.0f : row_max;
  float total = exp2_approx((sink - base) * kLog2e);
  for (int i = 0; i < splits; ++i)
    total += exp2_approx((lse[i] - base) * kLog2e);
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
  const int64_t out_row = h * args.out_stride[1] + (first_row + token) * args.out_stride[2];
  for (int column = threadIdx.x * 2; column < kValueHeadDim; column += 256) {
    float x = 0.0f, y = 0.0f;
    for (int i = 0; i < splits; ++i) {
      const float weight = exp2_approx((lse[i] - base) * kLog2e);
      x += weight * partial[i * kValueHeadDim + column];
      y += weight * partial[i * kValueHeadDim + column + 1];
    }
    store_out_pair(args.out, out_row + column, x * inverse, y * inverse);
  }
  if (threadIdx.x == 0)
    args.lse[static_cast<int64_t>(first_row + token) * args.heads_q + h] =
        total > 0.0f ? row_max + logf(total) : -infinity();
}
