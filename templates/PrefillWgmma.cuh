//===- PrefillWgmma.cuh - Paged flex attention on warpgroups (sm_90a) -*- CUDA -*-===//
//
// The Hopper prefill (KernelConfig::warpRows == 64): one CTA computes
// kBlockM query rows of one (batch, query head) with kBlockM / 64 consumer
// warpgroups of 64 rows each, fed by a producer warp:
//
//  - the producer warp (warpgroup 0, warp 0; the warpgroup gives its
//    registers away with setmaxnreg) gathers the Q tile once and the K and V
//    tiles of every visited KV block from their pages with cp.async into a
//    two-stage ring, each lane arriving on the stage's full mbarrier when its
//    copies land (cp.async.mbarrier.arrive.noinc), and waits on the stage's
//    empty mbarrier before reusing it; any page size from 1 to 1024;
//  - each consumer warpgroup computes S = Q K^T with wgmma (both operands
//    in shared memory, 128-byte swizzled, K-major), applies the mods and the
//    online softmax to the accumulators (a thread holds two rows, as with
//    mma.sync), and O += P V with wgmma (P from registers, V N-major in
//    shared memory); then it releases the stage.
//
// Tiles in shared memory hold 64-element (128-byte) atoms: a tile of R rows
// is D / 64 atoms of R rows x 128 bytes, 16-byte chunk c of row r at chunk
// c ^ (r % 8) (the 128-byte swizzle of the TMA and wgmma), every tile
// 1024-byte aligned. The visits (block-mask lists, passes per straddled
// mask row, kv_len) are those of Prefill.cuh; producer and consumers walk
// them alike (KvVisits).
//
// Grid: as Prefill.cuh; block: (kBlockM / 64 + 1) * 128 threads; dynamic
// shared memory: 1024 (alignment) + (kBlockM + 4 kBlockN) * D * 2 + 64.
//
//===----------------------------------------------------------------------===//

namespace pagedc {
constexpr int kBlockM = pagedc_config::kBlockM;
constexpr int kBlockN = pagedc_config::kBlockN;
constexpr int kConsumerGroups = kBlockM / 64;
constexpr int kConsumerThreads = kConsumerGroups * 128;
constexpr int kPrefillThreads = kConsumerThreads + 128;
/// Registers per thread after setmaxnreg: the producer warpgroup gives
/// registers to the consumers (one CTA per SM: 64 K registers in all); one
/// consumer warpgroup takes all it can address (D 256 spilled 28-44 bytes
/// at 240 with bias score mods).
constexpr int kProducerRegisters = 56;
constexpr int kConsumerRegisters = kConsumerGroups == 1 ? 256 : 224;
static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <= 65536,
              "setmaxnreg asks for more registers than an SM has");
/// Bytes of one 64-element atom column of a tile of `rows` rows.
__host__ __device__ constexpr uint32_t atom_bytes(int rows) { return static_cast<uint32_t>(rows) * 128; }
static_assert(pagedc_config::kWarpRows == 64, "PrefillWgmma.cuh is the warpgroup design");
static_assert(kBlockM == 64 || kBlockM == 128, "kBlockM must be 64 or 128");
static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128,
              "wgmma tiles take kBlockN 32, 64 or 128");

/// Byte offset of chunk `chunk` (16 bytes) of row `row` in a tile of `rows`
/// rows laid out in 128-byte swizzled atoms.
PAGEDC_DEVICE uint32_t atom_offset(int rows, int row, int chunk) {
  return (chunk >> 3) * atom_bytes(rows) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

/// The producer warp's gather of K and V rows [kv_begin, kv_begin + kBlockN)
/// (zeros past kv_len) into one stage.
PAGEDC_DEVICE void gather_kv_stage(uint32_t k_tile, uint32_t v_tile, const Element *k_head,
                                   const Element *v_head, int64_t k_page, int64_t k_slot,
                                   int64_t v_page, int64_t v_slot, const int32_t *page_row,
                                   int kv_begin, int kv_len, int lane) {
  // Unrolled by two: the producer has 56 registers.
#pragma unroll 2
  for (int index = lane; index < kBlockN * kChunksPerRow; index += 32) {
    const int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
    const int kv = kv_begin + row;
    const bool valid = kv < kv_len;
    const int64_t page = valid ? page_row[kv >> kLog2PageSize] : 0;
    const int64_t slot = kv & (kPageSize - 1);
    const uint32_t offset = atom_offset(kBlockN, row, chunk);
    cp_async_16(k_tile + offset, k_head + (valid ? page * k_page + slot * k_slot : 0) + chunk * 8,
                valid ? 16 : 0);
    cp_async_16(v_tile + offset, v_head + (valid ? page * v_page + slot * v_slot : 0) + chunk * 8,
                valid ? 16 : 0);
  }
}
} // namespace pagedc

extern "C" __global__ void __launch_bounds__(pagedc::kPrefillThreads, 1)
    pagedc_prefill(const __grid_constant__ PagedcAttentionKernelArgs args,
                   const __grid_constant__ pagedc_mods::Params params) {
  using namespace pagedc;
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const int thread = threadIdx.x, lane = thread & 31;
  const PrefillTile tile = prefill_tile<kBlockM>(args);
  const int h = tile.h, b = tile.b, row_begin = tile.row_begin, row_count = tile.row_count;
  const int kv_head = tile.kv_head, kv_len = tile.kv_len, q_offset = tile.q_offset;

  // Shared memory: Q, two K/V stages, then the mbarriers.
  const uint32_t base = (shared_address(shared) + 1023u) & ~1023u;
  const uint32_t q_tile = base;
  constexpr uint32_t kStageBytes = 2 * kBlockN * kRowBytes;
  const uint32_t stages = q_tile + kBlockM * kRowBytes;
  const uint32_t q_full = stages + 2 * kStageBytes;
  const uint32_t full = q_full + 8, empty = q_full + 24;
  if (thread == 0) {
    mbarrier_init(q_full, 32);
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(full + 8 * s, 32);
      mbarrier_init(empty + 8 * s, kConsumerThreads);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  const bool has_block_mask = args.kv_num_blocks != nullptr;
  const int position_first = q_offset + row_begin;
  const int position_last = q_offset + row_begin + row_count - 1;
  const int pass_first = has_block_mask ? position_first / args.q_block_size : 0;
  const int pass_last = has_block_mask ? position_last / args.q_block_size : 0;
  if (thread < 128) {
    // The producer warpgroup: warp 0 gathers, the others only give their
    // registers away (setmaxnreg is warpgroup-wide).
    setmaxnreg_dec<kProducerRegisters>();
    if (thread >= 32)
      return;
    const Element *q_rows = static_cast<const Element *>(args.q) + b * args.q_stride[0] +
                            h * args.q_stride[1] + row_begin * args.q_stride[2];
#pragma unroll 2
    for (int index = lane; index < kBlockM * kChunksPerRow; index += 32) {
      const int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
      const bool valid = row < row_count;
      cp_async_16(q_tile + (row >> 6) * (kHeadDim / 64) * atom_bytes(64) +
                      atom_offset(64, row & 63, chunk),
                  q_rows + (valid ? row * args.q_stride[2] : 0) + chunk * 8, valid ? 16 : 0);
    }
    cp_async_mbarrier_arrive(q_full);
    const Element *k_head = static_cast<const Element *>(args.k_cache) + kv_head * args.k_stride[0];
    const Element *v_head = static_cast<const Element *>(args.v_cache) + kv_head * args.v_stride[0];
    const int32_t *page_row = args.page_table + b * args.page_table_stride;
    int visit = 0;
    for (int pass = pass_first; pass <= pass_last; ++pass) {
      KvVisits<kBlockN> visits;
      if (!visits.start(args, b, h, pass, kv_len))
        break;
      int list = 0, sub = 0;
      for (int kv = visits.seek(args, kv_len, list, sub); list < visits.list_count;
           visits.advance(list, sub), kv = visits.seek(args, kv_len, list, sub)) {
        const int stage = visit & 1;
        mbarrier_wait(empty + 8 * stage, ((visit >> 1) & 1) ^ 1);
        const uint32_t k_tile = stages + stage * kStageBytes;
        gather_kv_stage(k_tile, k_tile + kBlockN * kRowBytes, k_head, v_head, args.k_stride[1],
                        args.k_stride[2], args.v_stride[1], args.v_stride[2], page_row, kv,
                        kv_len, lane);
        cp_async_mbarrier_arrive(full + 8 * stage);
        ++visit;
      }
    }
  } else {
  // A consumer warpgroup: rows group_row .. group_row + 63 of the CTA (the
  // other branch of one if / else: ptxas applies setmaxnreg per branch).
  setmaxnreg_inc<kConsumerRegisters>();
  const int consumer = thread - 128, group = consumer >> 7, warp = (consumer >> 5) & 3;
  const int group_row = 64 * group;
  int q_of[2];
  const int b_of[2] = {b, b}, h_of[2] = {h, h};
  pagedc_mods::MaskRow mask_rows[2];
  pagedc_mods::ScoreRow score_rows[2];
  RowState state;
  float out[kHeadDim / 8][4];
  reset_rows(state, out);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_begin + group_row + 16 * warp + (lane >> 2) + 8 * half;
    // Padding rows evaluate the last real row's mods and are never stored.
    q_of[half] = q_offset + imin(row, args.q_len - 1);
    mask_rows[half] = pagedc_mods::mask_row(params, b, h, q_of[half]);
    score_rows[half] = pagedc_mods::score_row(params, b, h, q_of[half]);
  }
  const uint32_t q_group = q_tile + group * (kHeadDim / 64) * atom_bytes(64);
  bool q_ready = false;

  int visit = 0;
  for (int pass = pass_first; pass <= pass_last; ++pass) {
    KvVisits<kBlockN> visits;
    if (!visits.start(args, b, h, pass, kv_len))
      break;
    const bool visible[2] = {pass_first == pass_last || q_of[0] / args.q_block_size == pass,
                             pass_first == pass_last || q_of[1] / args.q_block_size == pass};
    const bool group_visible =
        pass_first == pass_last ||
        ((q_offset + imin(row_begin + group_row, args.q_len - 1)) / args.q_block_size <= pass &&
         (q_offset + imin(row_begin + group_row + 63, args.q_len - 1)) / args.q_block_size >=
             pass);
    int list = 0, sub = 0;
    for (int kv_begin = visits.seek(args, kv_len, list, sub); list < visits.list_count;
         visits.advance(list, sub), kv_begin = visits.seek(args, kv_len, list, sub)) {
      const int stage = visit & 1;
      const bool is_full = visits.is_full(list);
      ++visit;
      mbarrier_wait(full + 8 * stage, ((visit - 1) >> 1) & 1);
      if (!group_visible) {
        // No row of this warpgroup belongs to the pass: release at once.
        mbarrier_arrive(empty + 8 * stage);
        continue;
      }
      if (!q_ready) {
        mbarrier_wait(q_full, 0);
        q_ready = true;
      }
      // cp.async wrote the tiles through the generic proxy; wgmma reads
      // them through the async proxy.
      fence_proxy_async();
      const uint32_t k_tile = stages + stage * kStageBytes;
      const uint32_t v_tile = k_tile + kBlockN * kRowBytes;

      float scores[kBlockN / 8][4];
      float(&s_acc)[kBlockN / 2] = *reinterpret_cast<float(*)[kBlockN / 2]>(&scores[0][0]);
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kHeadDim / 16; ++step) {
        const uint32_t atom = (step >> 2) * atom_bytes(64), within = (step & 3) * 32;
        wgmma_ss<kBlockN, kIsBF16, false>(
            s_acc, wgmma_descriptor(q_group + atom + within, 16, 1024, kSwizzle128),
            wgmma_descriptor(k_tile + (step >> 2) * atom_bytes(kBlockN) + within, 16, 1024,
                             kSwizzle128),
            step > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(s_acc);

      const bool check_mask[2] = {!is_full, !is_full};
      const bool all_kept = (is_full || !pagedc_mods::kHasMask) && kv_begin + kBlockN <= kv_len &&
                            visible[0] && visible[1];
      apply_mods<kBlockN / 8>(scores, params, mask_rows, score_rows, b_of, h_of, q_of, visible,
                              check_mask, kv_begin, kv_len, args.scale, lane, all_kept);
      online_softmax<kBlockN / 8>(state, scores, out);

      // O += P V: P from registers (the A fragment of each 16-key step),
      // V N-major: 64 columns per atom (LBO), 8-row groups (SBO).
      float(&o_acc)[kHeadDim / 2] = *reinterpret_cast<float(*)[kHeadDim / 2]>(&out[0][0]);
      wgmma_fence_operands(o_acc);
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kBlockN / 16; ++step) {
        const uint32_t p[4] = {pack_pair(scores[2 * step][0], scores[2 * step][1]),
                               pack_pair(scores[2 * step][2], scores[2 * step][3]),
                               pack_pair(scores[2 * step + 1][0], scores[2 * step + 1][1]),
                               pack_pair(scores[2 * step + 1][2], scores[2 * step + 1][3])};
        wgmma_rs<kHeadDim, kIsBF16, true>(
            o_acc, p,
            wgmma_descriptor(v_tile + step * 2048, atom_bytes(kBlockN), 1024, kSwizzle128),
            true);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_operands(o_acc);
      mbarrier_arrive(empty + 8 * stage);
    }
  }

  // Epilogue: normalise, store out rows and lse.
  Element *out_base = static_cast<Element *>(args.out) + b * args.out_stride[0] +
                      h * args.out_stride[1];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float sum = quad_sum(state.sum[half]);
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int row = row_begin + group_row + 16 * warp + (lane >> 2) + 8 * half;
    if (row >= args.q_len)
      continue;
    uint32_t *out_row =
        reinterpret_cast<uint32_t *>(out_base + row * args.out_stride[2] + 2 * (lane & 3));
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d)
      out_row[d * 4] = pack_pair(out[d][2 * half] * inverse, out[d][2 * half + 1] * inverse);
    if constexpr (pagedc_config::kHasLse) {
      if ((lane & 3) == 0)
        args.lse[(static_cast<int64_t>(b) * args.heads_q + h) * args.q_len + row] =
            sum > 0.0f ? (state.max[half] + log2f(sum)) * kLn2 : -infinity();
    }
  }
  } // consumer
}
