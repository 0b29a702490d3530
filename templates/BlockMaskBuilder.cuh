//===- BlockMaskBuilder.cuh - Mask mod -> BlockMask on the GPU -*- CUDA -*-===//
//
// pagedc_build_block_mask evaluates the mask mod over every element of one
// (batch, head, q block) row of tiles and writes the BlockMask arrays
// (BlockMask.h layout): a kv block is "full" when every in-range element is
// kept, "partial" when some but not all are, and listed in neither when none
// is. Elements past q_len or kv_len are outside the mask and do not count.
// Indices are written in increasing kv block order.
//
// Grid: (num_q_blocks, heads, batch); block: 128 threads. Each thread owns
// query rows (mask_row once per row and chunk of 32 kv blocks) and adds its
// kept-element counts per kv block into shared counters; warp 0 then
// classifies the 32 blocks and appends them with ballots.
//
//===----------------------------------------------------------------------===//

extern "C" __global__ void __launch_bounds__(128)
    pagedc_build_block_mask(const __grid_constant__ PagedcBlockMaskKernelArgs args,
                            const __grid_constant__ pagedc_mods::Params params) {
  using pagedc::imin;
  PAGEDC_SHARED(int, kept, 32);
  const int thread = threadIdx.x, lane = thread & 31;
  const int q_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q_begin = q_block * args.q_block_size;
  const int q_rows = imin(args.q_len, q_begin + args.q_block_size) - q_begin;
  const int64_t row_index =
      (static_cast<int64_t>(b) * args.heads + h) * args.num_q_blocks + q_block;
  int32_t *partial_out = args.kv_indices + row_index * args.max_kv_blocks;
  int32_t *full_out = args.full_kv_indices + row_index * args.max_kv_blocks;
  int partial_count = 0, full_count = 0; // meaningful in warp 0

  for (int chunk = 0; chunk < args.max_kv_blocks; chunk += 32) {
    if (thread < 32)
      kept[thread] = 0;
    __syncthreads();
    const int chunk_blocks = imin(32, args.max_kv_blocks - chunk);
    if constexpr (pagedc_mods::kHasMask) {
      for (int row = thread; row < q_rows; row += 128) {
        const int q = q_begin + row;
        const pagedc_mods::MaskRow mask_row = pagedc_mods::mask_row(params, b, h, q);
        for (int j = 0; j < chunk_blocks; ++j) {
          const int kv_begin = (chunk + j) * args.kv_block_size;
          const int kv_end = imin(args.kv_len, kv_begin + args.kv_block_size);
          int count = 0;
          for (int kv = kv_begin; kv < kv_end; ++kv)
            count += pagedc_mods::mask(params, mask_row, b, h, q, kv) ? 1 : 0;
          if (count)
            atomicAdd(&kept[j], count);
        }
      }
    }
    __syncthreads();
    if (thread < 32) {
      const int block = chunk + lane;
      const int kv_begin = block * args.kv_block_size;
      const int columns = imin(args.kv_len, kv_begin + args.kv_block_size) - kv_begin;
      const int elements = lane < chunk_blocks && columns > 0 && q_rows > 0 ? q_rows * columns : 0;
      const int count = pagedc_mods::kHasMask ? kept[lane] : elements;
      const bool is_full = elements > 0 && count == elements;
      const bool is_partial = count > 0 && count < elements;
      const unsigned full_ballot = __ballot_sync(0xffffffffu, is_full);
      const unsigned partial_ballot = __ballot_sync(0xffffffffu, is_partial);
      const unsigned below = (1u << lane) - 1u;
      if (is_full)
        full_out[full_count + __popc(full_ballot & below)] = block;
      if (is_partial)
        partial_out[partial_count + __popc(partial_ballot & below)] = block;
      full_count += __popc(full_ballot);
      partial_count += __popc(partial_ballot);
    }
    __syncthreads();
  }
  if (thread == 0) {
    args.kv_num_blocks[row_index] = partial_count;
    args.full_kv_num_blocks[row_index] = full_count;
  }
}
