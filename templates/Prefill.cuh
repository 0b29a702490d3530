//===- Prefill.cuh - Paged flex attention, FlashAttention-2 tiles -*- CUDA -*-===//
//
// One CTA computes kBlockM query rows of one (batch, query head): 16 rows per
// warp, tensor-core tiles (mma.sync m16n8k16), online softmax in f32, and
// K/V tiles of kBlockN rows gathered from pages with cp.async, double
// buffered. Only the KV tiles the block mask lists are visited: partial
// blocks call the mask mod per element, full blocks skip it; every visited
// element gets the score mod. When the CTA's query positions straddle
// several block-mask rows it makes one pass per mask row, each pass visible
// only to the rows that belong to it (online softmax makes passes additive).
//
// Grid: (ceil(q_len / kBlockM), heads_q, batch); block: kBlockM / 16 warps;
// dynamic shared memory: (kBlockM + 4 * kBlockN) * kHeadDim * 2 bytes.
//
//===----------------------------------------------------------------------===//

namespace pagedc {
constexpr int kBlockM = pagedc_config::kBlockM;
constexpr int kBlockN = pagedc_config::kBlockN;
constexpr int kPrefillThreads = kBlockM * 2; // 16 rows per 32-thread warp
/// Q fragments stay in registers only at D = 64; at D >= 128 they are
/// re-read from shared memory (ldmatrix) to stay clear of spills.
constexpr bool kPrefillQInRegisters = kHeadDim <= 64;
static_assert(kBlockM == 64 || kBlockM == 128, "kBlockM must be 64 or 128");
static_assert(kBlockN == 32 || kBlockN == 64, "kBlockN must be 32 or 64");
} // namespace pagedc

extern "C" __global__ void __launch_bounds__(pagedc::kPrefillThreads)
    pagedc_prefill(const __grid_constant__ PagedcAttentionKernelArgs args,
                   const __grid_constant__ pagedc_mods::Params params) {
  using namespace pagedc;
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  const int b = blockIdx.z, h = blockIdx.y, row_begin = blockIdx.x * kBlockM;
  const int kv_head = h / (args.heads_q / args.heads_kv);
  const int kv_len = args.kv_len[b];
  const int q_offset = args.q_offset ? args.q_offset[b] : 0;
  const int row_count = imin(kBlockM, args.q_len - row_begin);

  const uint32_t q_tile = shared_address(shared);
  const uint32_t k_tiles = q_tile + kBlockM * kRowBytes;
  const uint32_t v_tiles = k_tiles + 2 * kBlockN * kRowBytes;
  constexpr uint32_t kStageBytes = kBlockN * kRowBytes;

  const Element *q_rows = static_cast<const Element *>(args.q) +
                          b * args.q_stride[0] + h * args.q_stride[1] +
                          row_begin * args.q_stride[2];
  load_query_tile<kBlockM, kPrefillThreads>(q_tile, q_rows, args.q_stride[2],
                                            row_count, thread);
  cp_async_commit();

  // k_head, v_head: [pages, page_size, D] of this KV head.
  const Element *k_head =
      static_cast<const Element *>(args.k_cache) + kv_head * args.k_stride[0];
  const Element *v_head =
      static_cast<const Element *>(args.v_cache) + kv_head * args.v_stride[0];
  const int32_t *page_row = args.page_table + b * args.page_table_stride;

  // The two rows this thread holds, and their kv-independent mod values.
  int row_of[2], q_of[2];
  const int b_of[2] = {b, b}, h_of[2] = {h, h};
  pagedc_mods::MaskRow mask_rows[2];
  pagedc_mods::ScoreRow score_rows[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_of[half] = row_begin + warp * 16 + (lane >> 2) + 8 * half;
    // Padding rows evaluate the last real row's mods and are never stored.
    q_of[half] = q_offset + imin(row_of[half], args.q_len - 1);
    mask_rows[half] = pagedc_mods::mask_row(params, b, h, q_of[half]);
    score_rows[half] = pagedc_mods::score_row(params, b, h, q_of[half]);
  }

  RowState state;
  float out[kHeadDim / 8][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state.max[half] = -infinity();
    state.sum[half] = 0.0f;
  }
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[d][e] = 0.0f;
  uint32_t q_regs[kPrefillQInRegisters ? kHeadDim / 16 : 1][4];
  bool q_ready = false;

  const bool has_block_mask = args.kv_num_blocks != nullptr;
  const int position_first = q_offset + row_begin;
  const int position_last = q_offset + row_begin + row_count - 1;
  const int pass_first = has_block_mask ? position_first / args.q_block_size : 0;
  const int pass_last = has_block_mask ? position_last / args.q_block_size : 0;

  for (int pass = pass_first; pass <= pass_last; ++pass) {
    const int32_t *partial = nullptr, *full = nullptr;
    int partial_count, full_count = 0, tiles_per_block = 1;
    if (has_block_mask) {
      // The mask row of q block `pass` (the mask may start at first_q_block;
      // the host checks that it covers every row of the call).
      const int mask_row = pass - args.first_q_block;
      if (mask_row < 0 || mask_row >= args.num_q_blocks)
        break;
      int64_t mask_row_index =
          (static_cast<int64_t>(args.mask_batch == 1 ? 0 : b) * args.mask_heads +
           (args.mask_heads == 1 ? 0 : h)) *
              args.num_q_blocks +
          mask_row;
      partial = args.kv_indices + mask_row_index * args.max_kv_blocks;
      partial_count = args.kv_num_blocks[mask_row_index];
      if (args.full_kv_num_blocks) {
        full = args.full_kv_indices + mask_row_index * args.max_kv_blocks;
        full_count = args.full_kv_num_blocks[mask_row_index];
      }
      tiles_per_block = args.kv_block_size / kBlockN;
    } else {
      partial_count = (kv_len + kBlockN - 1) / kBlockN;
    }
    bool visible[2];
#pragma unroll
    for (int half = 0; half < 2; ++half)
      visible[half] = pass_first == pass_last ||
                      q_of[half] / args.q_block_size == pass;

    const int visits = (partial_count + full_count) * tiles_per_block;
    // Logical kv of the first key of visit `v`; sets `is_full`.
    auto visit_kv = [&](int v, bool &is_full) {
      int list = v / tiles_per_block, sub = v - list * tiles_per_block;
      is_full = list >= partial_count;
      if (!has_block_mask)
        return list * kBlockN;
      int block = is_full ? full[list - partial_count] : partial[list];
      return block * args.kv_block_size + sub * kBlockN;
    };
    // The first visit at or after `v` that holds keys below kv_len.
    auto next_visit = [&](int v) {
      for (; v < visits; ++v) {
        bool is_full;
        if (visit_kv(v, is_full) < kv_len)
          break;
      }
      return v;
    };

    int v = next_visit(0), stage = 0;
    if (v < visits) {
      bool is_full;
      load_kv_tiles<kBlockN, kPrefillThreads>(
          k_tiles, v_tiles, k_head, v_head, args.k_stride[1], args.k_stride[2],
          args.v_stride[1], args.v_stride[2], page_row, visit_kv(v, is_full),
          kv_len, thread);
    }
    cp_async_commit();
    if (!q_ready) {
      cp_async_wait<1>();
      __syncthreads();
      if constexpr (kPrefillQInRegisters) {
#pragma unroll
        for (int k_step = 0; k_step < kHeadDim / 16; ++k_step)
          load_query_fragment(q_regs[k_step], q_tile, warp * 16, k_step, lane);
      }
      q_ready = true;
    }

    while (v < visits) {
      bool is_full;
      const int kv_begin = visit_kv(v, is_full);
      const int next = next_visit(v + 1);
      if (next < visits) {
        bool next_full;
        load_kv_tiles<kBlockN, kPrefillThreads>(
            k_tiles + (stage ^ 1) * kStageBytes,
            v_tiles + (stage ^ 1) * kStageBytes, k_head, v_head,
            args.k_stride[1], args.k_stride[2], args.v_stride[1],
            args.v_stride[2], page_row, visit_kv(next, next_full), kv_len,
            thread);
      }
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();

      float scores[kBlockN / 8][4];
      warp_scores<kBlockN / 8, kPrefillQInRegisters>(
          scores, q_regs, q_tile, warp * 16, k_tiles + stage * kStageBytes, 0,
          lane);
      const bool check_mask[2] = {!is_full, !is_full};
      apply_mods<kBlockN / 8>(scores, params, mask_rows, score_rows, b_of,
                              h_of, q_of, visible, check_mask, kv_begin, kv_len,
                              args.scale, lane);
      online_softmax<kBlockN / 8>(state, scores, out);
      warp_accumulate<kBlockN / 8>(out, scores, v_tiles + stage * kStageBytes,
                                   0, lane);
      __syncthreads();
      v = next;
      stage ^= 1;
    }
  }
  cp_async_wait<0>();

  // Epilogue: normalise, store out rows and lse.
  Element *out_base = static_cast<Element *>(args.out) + b * args.out_stride[0] +
                      h * args.out_stride[1];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = quad_sum(state.sum[half]);
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int row = row_of[half];
    if (row >= args.q_len)
      continue;
    uint32_t *out_row = reinterpret_cast<uint32_t *>(
        out_base + row * args.out_stride[2] + 2 * (lane & 3));
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d)
      out_row[d * 4] = pack_pair(out[d][2 * half] * inverse,
                                 out[d][2 * half + 1] * inverse);
    if constexpr (pagedc_config::kHasLse) {
      if ((lane & 3) == 0)
        args.lse[(static_cast<int64_t>(b) * args.heads_q + h) * args.q_len +
                 row] = sum > 0.0f
                            ? (state.max[half] + log2f(sum)) * kLn2
                            : -infinity();
    }
  }
}
