/*===- KernelArgs.h - Arguments of the CUDA kernels -------------*- C -*-===*\
|*                                                                          *|
|* The argument blocks of the pagedc CUDA kernels. This one header is read  *|
|* by the host (launch code packs these structs) and, embedded verbatim,    *|
|* by NVRTC (the kernels take them by value), so both sides always agree on *|
|* the layout. Only fixed-width fields; every stride is in elements.        *|
|*                                                                          *|
\*===----------------------------------------------------------------------===*/
#ifndef PAGEDC_KERNELARGS_H
#define PAGEDC_KERNELARGS_H

#ifndef __CUDACC_RTC__
#include <stdint.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/// Ints of a packed prefill tile in PagedcAttentionKernelArgs::work_tiles.
#define PAGEDC_PACKED_PREFILL_TILE_INTS 4

/// Arguments of the prefill, decode and decode-merge kernels.
typedef struct PagedcAttentionKernelArgs {
  /// [B, Hq, Lq, D] element type of the kernel; last dim contiguous.
  const void *q;
  /// [Hkv, numPages, pageSize, D]; last dim contiguous.
  const void *k_cache;
  /// [Hkv, numPages, pageSize, D]; last dim contiguous.
  const void *v_cache;
  /// [B, Hq, Lq, D]; last dim contiguous.
  void *out;
  /// [B, Hq, Lq] f32, contiguous; null when the kernel has no lse output.
  float *lse;
  /// [B, page_table_stride] physical page of each logical page.
  const int32_t *page_table;
  /// [B] keys at logical index >= kv_len[b] are masked out and never read.
  const int32_t *kv_len;
  /// [B] or null (= 0): mods see q = q_offset[b] + row.
  const int32_t *q_offset;
  /// Logical block mask (BlockMask.h layout) or all null for "no block
  /// sparsity". [mask_batch, mask_heads, num_q_blocks]
  const int32_t *kv_num_blocks;
  /// [mask_batch, mask_heads, num_q_blocks, max_kv_blocks]
  const int32_t *kv_indices;
  /// [mask_batch, mask_heads, num_q_blocks] or null (no full blocks).
  const int32_t *full_kv_num_blocks;
  /// [mask_batch, mask_heads, num_q_blocks, max_kv_blocks] or null.
  const int32_t *full_kv_indices;
  /// Decode split-KV workspace: [B, Hq, Lq, num_splits, D] f32.
  float *partial_out;
  /// Decode split-KV workspace: [B, Hq, Lq, num_splits] f32.
  float *partial_lse;
  /// Strides of q for (b, h, row).
  int64_t q_stride[3];
  /// Strides of out for (b, h, row).
  int64_t out_stride[3];
  /// Strides of k_cache for (kv head, page, slot). Pages are compact: the
  /// page and slot strides must be page_size x D and D (the kernels compute
  /// them; planAttention refuses others), the head stride a multiple of 8.
  /// Packed-batch kernels (BatchAttention) read all three, each a multiple
  /// of 8.
  int64_t k_stride[3];
  /// Strides of v_cache for (kv head, page, slot), as k_stride's.
  int64_t v_stride[3];
  int64_t page_table_stride;
  int32_t batch;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t q_len;
  /// Block-mask extents; 1 broadcasts over the call's batch / heads.
  int32_t mask_batch;
  int32_t mask_heads;
  int32_t num_q_blocks;
  int32_t max_kv_blocks;
  int32_t q_block_size;
  /// A multiple of the kernel's KV tile.
  int32_t kv_block_size;
  /// Decode: number of KV splits and kv tokens per split (a multiple of
  /// kv_block_size when a block mask is given, else of the KV tile).
  int32_t num_splits;
  int32_t split_size;
  /// Multiplies q.k before the score mod.
  float scale;
  /// The q block of the block mask's first row (BlockMask::firstQBlock): a
  /// mask of only the rows a call needs (createBlockMaskRows) holds rows
  /// first_q_block .. first_q_block + num_q_blocks - 1. 0 for a full mask.
  int32_t first_q_block;
  /// Packed batches (kernels built with KernelConfig::packedBatch; null and
  /// 0 for the others, which never read them; appended so that kernels
  /// built before them read the fields above only). [batch + 1] packed row
  /// of each sequence's first query token: sequence b's q_start[b + 1] -
  /// q_start[b] rows start at row q_start[b] of q and out (whose batch
  /// strides are 0; q_len is unused), and lse is [T, heads_q] contiguous.
  const int32_t *q_start;
  /// The work list: of the packed prefill, [num_work_tiles,
  /// PAGEDC_PACKED_PREFILL_TILE_INTS] (sequence, first row, first key, end
  /// of keys) of each query tile, CTA x computing query head x % heads_q of
  /// tile x / heads_q; of the decode and the GQA-packed tiles,
  /// [num_work_tiles, 2] (sequence, first row).
  const int32_t *work_tiles;
  int32_t num_work_tiles;
  /// Kernels of 8-bit float caches (KernelConfig::kvFloat8; null for the
  /// others, which never read them; appended as q_start): [Hkv] f32, the
  /// scale of each KV head's K and V codes (a code c of head h means
  /// c * k_scale[h]).
  const float *k_scale;
  const float *v_scale;
  /// Packed batches (null for the others, which never read them; appended
  /// as q_start): [batch] the first key sequence b attends to (keys below
  /// it are masked out and never read; null: 0), and [T] the query
  /// position and batch index the mods see for each packed row (null:
  /// q_offset[b] + row and b; cascade levels, BatchAttention::plan).
  const int32_t *kv_start;
  const int32_t *token_position;
  const int32_t *token_batch;
  /// [heads_q] f32 attention sinks, or null (none): query head h's softmax
  /// has one more key of logit sinks[h] (natural log, the units of the
  /// scores after scale and score mod) and value zero. Appended as q_start.
  const float *sinks;
  /// Packed batches planned with a fixed grid (BatchAttentionConfig::
  /// fixedGrid), else null: [2] int32 in device memory, the step's prefill
  /// work tiles and decode sequences. The grids are sized by the limits;
  /// a CTA whose work tile (prefill) or decode list entry (decode, merge)
  /// is at or past its count exits before it reads or waits on anything.
  /// Appended as q_start.
  const int32_t *work_counts;
} PagedcAttentionKernelArgs;

/// The warpgroup prefill's third parameter (templates/PrefillWgmma.cuh):
/// how it copies K/V and schedules its consumer warpgroups. All zeros: the
/// producer gathers every tile with cp.async and the consumers issue their
/// wgmmas as they come.
typedef struct PagedcWgmmaPrefillArgs {
  /// Tensor maps (CUtensorMap, cuTensorMapEncodeTiled) of k_cache and
  /// v_cache as [Hkv, numPages, pageSize, D]: boxes of 64 elements x
  /// min(pageSize, KV tile) rows, 128-byte swizzle.
#ifdef __cplusplus
  alignas(64) uint64_t k_map[16];
  alignas(64) uint64_t v_map[16];
#else
  _Alignas(64) uint64_t k_map[16];
  _Alignas(64) uint64_t v_map[16];
#endif
  /// 1: the maps are valid; tiles below kv_len of pages of 16 rows or more
  /// are copied with one bulk tensor copy per page and 64 head dims.
  int32_t tensor_maps;
  /// 1: the two consumer warpgroups take turns issuing their wgmmas (named
  /// barriers), so one's softmax runs under the other's matrix products.
  int32_t ping_pong;
  /// Run maps: k_cache and v_cache as above with boxes of 64 elements x
  /// pageSize rows x (KV tile / pageSize) pages, for tiles whose pages are
  /// consecutive (pages under the KV tile). Appended last: kernels built
  /// before them read the fields above only.
#ifdef __cplusplus
  alignas(64) uint64_t k_run_map[16];
  alignas(64) uint64_t v_run_map[16];
#else
  _Alignas(64) uint64_t k_run_map[16];
  _Alignas(64) uint64_t v_run_map[16];
#endif
  /// 1: the run maps are valid (and tensor_maps is 1): a tile of
  /// consecutive pages, ascending or descending, comes in one box per 64
  /// head dims.
  int32_t run_boxes;
  /// Persistent CTAs' work counter (a zeroed int32 in device memory), or
  /// null. Set: each CTA takes its first query tile by its index and every
  /// further one from this counter (one atomicAdd per tile, the tile index
  /// gridDim.x + the count), so a CTA whose tiles were light takes more of
  /// them; the launch that takes the counter's last value sets it back to
  /// zero. Null: the CTAs take the tiles in fixed snaking rounds
  /// (prefill_round_tile). Appended last, like the run maps.
  int32_t *tile_counter;
} PagedcWgmmaPrefillArgs;

/// The decode kernel's third parameter (templates/Decode.cuh): tensor maps
/// of k_cache and v_cache as for the warpgroup prefill, with boxes of 64
/// elements x min(pageSize, 64) rows. All zeros: every tile is gathered
/// with cp.async. Code built for sm_80 ignores it.
typedef struct PagedcDecodeMapArgs {
#ifdef __cplusplus
  alignas(64) uint64_t k_map[16];
  alignas(64) uint64_t v_map[16];
#else
  _Alignas(64) uint64_t k_map[16];
  _Alignas(64) uint64_t v_map[16];
#endif
  /// 1: the maps are valid; whole tiles that every row may keep, of pages
  /// of 16 rows or more, are copied with one bulk tensor copy per page and
  /// 64 head dims.
  int32_t tensor_maps;
  /// Run maps (boxes of 64 elements x pageSize rows x 64 / pageSize pages,
  /// pages under 64 rows) and whether they are valid: a whole tile whose
  /// pages are consecutive comes in one box per 64 head dims. Appended
  /// last: kernels built before them read the fields above only.
#ifdef __cplusplus
  alignas(64) uint64_t k_run_map[16];
  alignas(64) uint64_t v_run_map[16];
#else
  _Alignas(64) uint64_t k_run_map[16];
  _Alignas(64) uint64_t v_run_map[16];
#endif
  int32_t run_boxes;
} PagedcDecodeMapArgs;

/// Arguments of the block-mask builder kernel. Outputs use BlockMask.h's
/// layout with batch = `batch` and heads = `heads`.
typedef struct PagedcBlockMaskKernelArgs {
  /// [batch, heads, num_q_blocks]
  int32_t *kv_num_blocks;
  /// [batch, heads, num_q_blocks, max_kv_blocks]
  int32_t *kv_indices;
  /// [batch, heads, num_q_blocks]
  int32_t *full_kv_num_blocks;
  /// [batch, heads, num_q_blocks, max_kv_blocks]
  int32_t *full_kv_indices;
  int32_t batch;
  int32_t heads;
  int32_t q_len;
  int32_t kv_len;
  int32_t q_block_size;
  int32_t kv_block_size;
  int32_t num_q_blocks;
  int32_t max_kv_blocks;
} PagedcBlockMaskKernelArgs;

/// Arguments of pagedc_merge_state (templates/MergeState.cuh): the rows
/// (t, h) of `tokens` x `heads` merge the parts of two sources by their
/// natural-log lse. Source i holds parts[i] parts (0 for an unused source).
/// Element types: 0 f32, 1 f16, 2 bf16.
typedef struct PagedcMergeStateArgs {
  /// [tokens, parts, heads, dim] of value_type[i], strides (t, part, h, d).
  const void *v[2];
  int64_t v_stride[2][4];
  /// [tokens, parts, heads] f32, strides (t, part, h).
  const float *s[2];
  int64_t s_stride[2][3];
  int32_t parts[2];
  int32_t value_type[2];
  /// [tokens, heads, dim] of out_type, strides (t, h, d); may alias a part.
  void *v_out;
  int64_t v_out_stride[3];
  /// [tokens, heads] f32, strides (t, h); may alias a part's lse.
  float *s_out;
  int64_t s_out_stride[2];
  int32_t out_type;
  int32_t tokens;
  int32_t heads;
  int32_t dim;
} PagedcMergeStateArgs;

#ifdef __cplusplus
}
#endif

#endif /* PAGEDC_KERNELARGS_H */
