//===- Decode.cuh - Split-KV paged decode and its merge kernel -*- CUDA -*-===//
//
// pagedc_decode: one CTA owns one split (a range of kv positions) of one
// sequence and one KV head, and computes every query row that reads that KV
// head: kDecodeHeads query heads x kQueryTokens tokens (speculative
// decoding), so each K/V page is read from memory once for the whole GQA
// group. Rows are padded to 16 per row-warp; when there are fewer than four
// row-warps, the remaining warps split each KV tile's columns and the CTA
// merges their softmax states at the end.
//
// Splits divide what the CTA's rows can see, not the whole context: each
// CTA first reduces its rows' block lists to the range of kv blocks any of
// them sees (without a block mask: [0, kv_len) in tiles) and takes the
// split-th of num_splits equal parts of it. A sliding window over a long
// context is then spread over every split instead of landing on the last
// one, and a fully masked row leaves every split empty.
//
// Block masks: the rows of one CTA may use different mask rows (different
// heads, tokens in different q blocks), so the CTA first expands each row's
// block lists into a class map over the split's kv blocks (0 skipped,
// 1 partial, 2 full) and skips a tile only when no row sees it. For the
// first kKeepTable tiles that its rows see only through partial blocks, the
// CTA evaluates the mask for every (row, kv) pair before its tile loop: kv
// rows that no row keeps are zero-filled instead of read (a window's edge
// inside a block costs no bytes), and a tile with no kept kv row is skipped
// like an unseen one.
//
// Copies: code for sm_90 and later, given tensor maps of the caches (the
// third parameter, PagedcDecodeMapArgs), head dims of 128 or more and pages
// of 16 rows or more,
// copies each whole tile that every row may keep with bulk tensor copies
// (one per page and 64 head dims, issued by the lanes of warp 0 and
// completing on the stage's mbarrier); the other tiles (pages under 16
// rows, the split's tail, tiles with kv rows no row keeps) are gathered
// (and every tile at head dim 64) with cp.async, zero-filled where not read. K/V tiles are laid out in
// 128-byte swizzled atoms (atom_offset) either way where tensor maps can be
// used, else in rows (tile_offset).
//
// With num_splits == 1 the CTA writes out (and lse); otherwise it writes
// normalised f32 partials and lse per split, and pagedc_decode_merge
// combines them: out = sum_i exp(lse_i - L) out_i, L = log sum_i exp(lse_i).
//
// Grid: (num_splits, heads_kv * kDecodeHeadChunks, batch); block: 128
// threads. Merge grid: (q_len, heads_q, batch); block: 128 threads.
//
// 8-bit float caches (kKvFloat8, Float8Tiles.cuh): at head dims up to
// 128 (kDecodeCodeRegisters) each tile's codes are loaded into registers
// during the previous tile's math and converted there, at the top of the
// tile's iteration, into one K and one V tile of Element (the first stage)
// that the tile's math reads as it reads any other. Above 128 the codes
// are gathered with cp.async into the second K and V stage and converted
// after the wait by a pass through shared memory, a barrier separating it
// from the math. The KV head's scales are applied in f32, K's to the scores
// (with args.scale) and V's to the output rows, so the kernel computes on
// the dequantized values.
//
// Packed batches (kPackedBatch, BatchAttention): grid z (and the merge's)
// indexes the plan's list of decode sequences (work_tiles[2 z] = sequence
// b), whose q_start[b + 1] - q_start[b] <= kQueryTokens rows are packed in
// q and out from row q_start[b] (rows past them do not exist); lse is
// [T, Hq], the split partials are indexed by list entry, and K/V are
// gathered through the call's page and slot strides (the tensor maps stay
// unbound: they describe compact pages). Their out may be f32 (kOutputF32,
// store_out_pair: here and in the merge) instead of Element.
//
//===----------------------------------------------------------------------===//

namespace pagedc {
constexpr int kDecodeThreads = 128;
constexpr int kQueryTokens = pagedc_config::kQueryTokens;
} // namespace pagedc

// The runtime compiles the two kernels as units of their own
// (KernelSource.h, KernelUnit): the merge reads no mod code, so one merge
// unit serves every mod variant of a shape and compiles beside the split
// kernel instead of after it. Bundles and `pagedc --emit` keep both in one.
#ifndef PAGEDC_UNIT_DECODE_MERGE
namespace pagedc {
constexpr int kDecodeTileN = 64;
constexpr int kGroupSize = pagedc_config::kGroupSize;
/// Query heads one CTA serves and the CTAs one KV head needs.
constexpr int kDecodeHeads = pagedc_config::kDecodeHeadsPerCta;
constexpr int kDecodeHeadChunks = (kGroupSize + kDecodeHeads - 1) / kDecodeHeads;
constexpr int kDecodeRows = kDecodeHeads * kQueryTokens;
constexpr int kRowWarps = kDecodeRows <= 16 ? 1 : kDecodeRows <= 32 ? 2 : 4;
constexpr int kPaddedRows = kRowWarps * 16;
constexpr int kKvWarps = 4 / kRowWarps;
constexpr int kColumnsPerWarp = kDecodeTileN / kKvWarps;
/// Rows a thread holds that can be real: a thread holds rows lane / 4 and
/// lane / 4 + 8 of its row-warp's 16, so with at most 8 rows (GQA <= 8,
/// one token) the second is padding and gets no mod, softmax or rescale.
constexpr int kRowHalves = kDecodeRows <= 8 ? 1 : 2;
/// Pages one 64-key tile touches (tiles start at multiples of 64 keys).
constexpr int kDecodeTilePages = kTilePagesOf<kDecodeTileN>;
/// Most kv blocks of the block mask one split may cover.
constexpr int kMaxSplitBlocks = pagedc_config::kMaxSplitBlocks;
constexpr bool kDecodeQInRegisters = kHeadDim <= 128;
/// CTAs per SM the register allocation must allow. On sm_90 at head dim
/// 64, five (96 registers a thread; the shared memory allows six), which
/// the all-kept path's second copy of the mod code would otherwise cost;
/// at head dim 128, three (168 registers; the shared memory allows three),
/// which ptxas left unbounded goes past for some masks with a score mod and
/// the block-mask paths, though it fits them under the bound without
/// spilling; elsewhere ptxas chooses. A packed batch's kernel (8 tokens: up
/// to 64 rows, and the strided copies' registers) spills under that cap, so
/// ptxas chooses there too; and so it does for more than 16 rows (two or four
/// row warps: a thread's rows take more registers than the cap leaves, and
/// ptxas spills at head dims 32 to 64), and for a kernel of an 8-bit cache,
/// whose conversion (16 codes in, 16 elements out per step) spilled 8-12
/// bytes under it as a pass through shared memory; held in registers
/// (kDecodeCodeRegisters) a tile's codes take 16 more at head dim 64.
#if !defined(PAGEDC_EMULATOR) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kDecodeMinBlocks =
    !kPackedBatch && kRowWarps == 1 && pagedc_config::kKvFloat8 == 0
        ? (kHeadDim <= 64 ? 5 : kHeadDim == 128 ? 3 : 1)
        : 1;
#else
constexpr int kDecodeMinBlocks = 1;
#endif
/// Partial tiles per split whose kept kv rows are computed before the loop.
constexpr int kKeepTable = 8;
constexpr int kLog2DecodeTileN = 6;
static_assert(1 << kLog2DecodeTileN == kDecodeTileN, "the tile's log2");
/// tile_seen's flag: every row that exists sees the block as full.
constexpr uint8_t kAllFull = 4;
static_assert(kDecodeRows <= 64, "at most 64 query rows per decode CTA");
static_assert(kQueryTokens >= 1 && kQueryTokens <= 8, "1..8 query tokens");

/// Whole tiles of pages of at least kDecodeTmaPageRows rows are copied with
/// bulk tensor copies when the launch bound tensor maps (code for sm_90 and
/// later, and the emulator's): one box of kDecodeBoxRows rows x 64 head
/// dims per page and atom column, issued by a lane of warp 0 each. Without
/// them a thread issues 8 to 32 cp.async per tile, each with its row's
/// validity test, page and address (about 60 SASS per two rows at head dim
/// 128, bench/README.md), in the issue slots the tile's math needs.
#if defined(PAGEDC_EMULATOR) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
constexpr bool kDecodeBulkCopies = true;
#else
constexpr bool kDecodeBulkCopies = false;
#endif
constexpr int kDecodeTmaPageRows = 16;
/// Not at head dim 64: there the copy is one unrolled trip of 8 cp.async
/// (tensor maps saved 5-9% of a tile's SASS) and sm_90 holds the kernel to
/// 96 registers for 5 CTAs per SM, where the second copy path spilled 4-12
/// bytes for some corpus selections (docs/kernels.md).
constexpr int kDecodeTmaMinHeadDim = 128;
/// 8-bit codes take no tensor maps: they come by LDG.128 into registers
/// (kDecodeCodeRegisters) or by cp.async into rows of their own.
/// Boxes span 64 head dims (the 128-byte swizzle's row) and K's and V's
/// maps have the same box, so head dims that are not multiples of 64, and
/// Dv other than D, take the gather.
constexpr bool kDecodeTma = kDecodeBulkCopies && kPageSize >= kDecodeTmaPageRows &&
                            kHeadDim >= kDecodeTmaMinHeadDim && kHeadDim % 64 == 0 &&
                            kValueHeadDim == kHeadDim && kKvFloat8 == 0;
/// 8-bit codes come by LDG.128 into registers (Float8RegisterTiles), are
/// converted there and stored as the Element tiles the math reads: 4 bytes
/// of shared-memory traffic an element, as a 16-bit cache's tile, where
/// the cp.async path (codes to shared memory, a conversion pass) moves 6
/// and made the kernel bound by shared memory rather than DRAM. A tile's
/// codes take (kHeadDim + kValueHeadDim) / 2 bytes a thread, held across
/// the previous tile's math: 32 registers at head dim 128. Above 128 the
/// kernel keeps the cp.async path: the 64 registers do not fit beside the
/// packed decode's (sm_90, head dim 256: 254 of 255).
constexpr bool kDecodeCodeRegisters =
    kKvFloat8 != 0 && kHeadDim <= 128 && kValueHeadDim <= 128;
constexpr int kDecodeBoxRows = kPageSize < kDecodeTileN ? kPageSize : kDecodeTileN;
/// Boxes of one tensor (K or V) per tile: pages x atom columns (2 to 16).
constexpr int kDecodeBoxes = kDecodeTileN / kDecodeBoxRows * (kHeadDim / 64);
static_assert(!kDecodeTma || 2 * kDecodeBoxes <= 32, "a lane of warp 0 per box");
/// Page runs (as the warpgroup prefill's, PrefillWgmma.cuh): a tile of
/// several pages whose pages are consecutive comes in one box per atom
/// column from the run maps; a descending run (the allocator's order)
/// lands page-reversed, its shared row r holding the tile's key
/// r ^ kDecodeRunReversed.
constexpr bool kDecodeRunBoxes = kDecodeTma && kDecodeBoxRows < kDecodeTileN;
constexpr int kDecodeRunReversed = kDecodeTileN - kDecodeBoxRows;
/// The K/V tiles' layout: with tensor maps, 64 rows in 128-byte swizzled
/// atoms, where their boxes land (and the gather writes alike); else rows
/// of kTileRowBytes (tile_offset), whose addresses cost the gather fewer
/// instructions (about 15 SASS per copy-loop trip at head dim 128). A
/// packed batch's 16-bit kernel above head dim 128 takes the atoms even
/// without tensor maps: in rows, ptxas spilled it on sm_90 (8 bytes stored,
/// 64 loaded, at head dim 256 under a document mask, on pages under 16
/// rows, where kDecodeTma is off); in atoms it does not.
template <bool kAtoms> struct DecodeLayout { using Type = SwizzledRows; };
template <> struct DecodeLayout<true> { using Type = AtomTile<kDecodeTileN>; };
constexpr bool kDecodeAtoms = kDecodeTma || (kPackedBatch && kHeadDim > 128 && kKvFloat8 == 0);
using DecodeTile = DecodeLayout<kDecodeAtoms>::Type;

/// Byte sizes of the decode CTA's shared-memory regions.
constexpr int kDecodeQBytes = kPaddedRows * kTileRowBytes;
constexpr int kDecodeStageBytes = kDecodeTileN * kTileRowBytes;
constexpr int kDecodeClassBytes = kPaddedRows * kMaxSplitBlocks;
/// The room of one tile of 8-bit codes (rows of kHeadDim bytes for K,
/// kValueHeadDim for V): half a stage, so two tiles of codes fit in one.
constexpr int kDecodeCodeBytes = kDecodeStageBytes / 2;
static_assert(kDecodeTileN * (kHeadDim > kValueHeadDim ? kHeadDim : kValueHeadDim) <=
                  kDecodeCodeBytes,
              "a tile of codes fits in half a stage");

/// Identifies decode row `row` (0..kPaddedRows): its query head and token,
/// and whether it exists.
struct DecodeRow {
  int head;
  int token;
  bool valid;
};
PAGEDC_DEVICE DecodeRow decode_row(int row, int kv_head, int head_chunk,
                                   int q_len) {
  int local_head = row / kQueryTokens;
  int group_head = head_chunk * kDecodeHeads + local_head;
  int token = row - local_head * kQueryTokens;
  DecodeRow result;
  result.valid = local_head < kDecodeHeads && group_head < kGroupSize &&
                 token < q_len;
  result.head = kv_head * kGroupSize + imin(group_head, kGroupSize - 1);
  result.token = imin(token, q_len - 1);
  return result;
}

/// The block-mask row that decode row `row` reads (the mask may start at
/// first_q_block); false when the row does not exist or its q block is
/// outside the mask.
PAGEDC_DEVICE bool decode_mask_row(const PagedcAttentionKernelArgs &args, int row,
                                   int kv_head, int head_chunk, int b, int q_offset,
                                   int64_t &mask_row_index) {
  DecodeRow info = decode_row(row, kv_head, head_chunk, args.q_len);
  int q_block = (q_offset + info.token) / args.q_block_size - args.first_q_block;
  if (!info.valid || q_block < 0 || q_block >= args.num_q_blocks)
    return false;
  mask_row_index = (static_cast<int64_t>(args.mask_batch == 1 ? 0 : b) * args.mask_heads +
                    (args.mask_heads == 1 ? 0 : info.head)) *
                       args.num_q_blocks +
                   q_block;
  return true;
}

/// Stores the lengths of the CTA's rows' block lists in `counts`: the
/// partial list's at 2 * row, the full list's at 2 * row + 1, 0 for a row
/// that does not exist or whose q block is outside the mask, at most
/// max_kv_blocks. One round of loads (thread r reads row r's), where a walk
/// over the rows would chain them: a decode CTA's prologue runs before any
/// K/V byte moves, so its load latency adds to the whole launch.
PAGEDC_DEVICE void load_list_counts(const PagedcAttentionKernelArgs &args, int kv_head,
                                    int head_chunk, int b, int q_offset, int thread,
                                    int *counts) {
  static_assert(kPaddedRows <= kDecodeThreads, "a thread per row");
  if (thread < kPaddedRows) {
    int partial = 0, full = 0;
    int64_t mask_row_index;
    if (decode_mask_row(args, thread, kv_head, head_chunk, b, q_offset, mask_row_index)) {
      partial = args.kv_num_blocks[mask_row_index];
      full = args.full_kv_num_blocks ? args.full_kv_num_blocks[mask_row_index] : 0;
    }
    counts[2 * thread] = imax(imin(partial, args.max_kv_blocks), 0);
    counts[2 * thread + 1] = imax(imin(full, args.max_kv_blocks), 0);
  }
}

/// Calls visit(row, block, class) for every kv block the CTA's rows list,
/// class 1 for a partial block and 2 for a full one. Lists (two per row,
/// lengths from load_list_counts) go to the warps in turn and a warp's
/// lanes stride over each: with up to 8 real rows a warp walks at most 4
/// lists, and their loads do not wait on a length load.
template <typename Visit>
PAGEDC_DEVICE void for_listed_blocks(const PagedcAttentionKernelArgs &args, int kv_head,
                                     int head_chunk, int b, int q_offset, const int *counts,
                                     int warp, int lane, Visit visit) {
  for (int list = warp; list < 2 * kPaddedRows; list += kDecodeThreads / 32) {
    const int count = counts[list];
    if (count == 0)
      continue;
    const int row = list >> 1;
    int64_t mask_row_index;
    decode_mask_row(args, row, kv_head, head_chunk, b, q_offset, mask_row_index);
    const bool full = list & 1;
    const int32_t *blocks = (full ? args.full_kv_indices : args.kv_indices) +
                            mask_row_index * args.max_kv_blocks;
    for (int i = lane; i < count; i += 32)
      visit(row, blocks[i], uint8_t(full ? 2 : 1));
  }
}
} // namespace pagedc

extern "C" __global__ void __launch_bounds__(pagedc::kDecodeThreads, pagedc::kDecodeMinBlocks)
    pagedc_decode(const __grid_constant__ PagedcAttentionKernelArgs args,
                  const __grid_constant__ pagedc_mods::Params params,
                  const __grid_constant__ PagedcDecodeMapArgs maps) {
  using namespace pagedc;
  // The merge (a programmatic dependent launch on sm_90) may be scheduled
  // once every split CTA has started; it waits for this grid to finish.
  allow_dependent_launch();
  // The maps' descriptors are fetched under the prologue's own loads (the
  // lengths, the page table), not after them at the first copy; by a thread
  // of the second warp, which issues no copy. First in the kernel, so that
  // nothing it reads stays live past it.
  if (kDecodeTma && maps.tensor_maps != 0 && threadIdx.x == 32)
    prefetch_cache_maps(maps, kDecodeRunBoxes && maps.run_boxes != 0);
  PAGEDC_EXTERN_SHARED(unsigned char, shared_bytes);
  // With tensor maps the regions start 1,024-byte aligned (the launch gives
  // 1 KiB more): their 128-byte swizzle follows the shared address's bits.
  // (Without, the base stays a constant: at head dim 64 the aligned base's
  // register spilled 20-24 bytes under sm_90's 96-register cap.)
  unsigned char *const shared =
      kDecodeTma
          ? shared_bytes + ((1024u - (shared_address(shared_bytes) & 1023u)) & 1023u)
          : shared_bytes;
  const int thread = threadIdx.x, lane = thread & 31, warp = thread >> 5;
  const int row_warp = warp / kKvWarps, kv_warp = warp % kKvWarps;
  const int split = blockIdx.x;
  // The sequence and its rows (a packed batch's from its decode list).
  int b = blockIdx.z, packed_q_len = 0, first_row = 0;
  if constexpr (kPackedBatch) {
    // A fixed grid (work_counts): entries past the step's decode list
    // leave before any copy or barrier (their partials are never merged).
    if (args.work_counts != nullptr && static_cast<int>(blockIdx.z) >= args.work_counts[1])
      return;
    b = args.work_tiles[2 * blockIdx.z];
    first_row = args.q_start[b];
    packed_q_len = args.q_start[b + 1] - first_row;
  }
  // Unpacked, the rows come from the argument block at each use: held in a
  // register for the whole kernel they cost the sm_90 head-dim-64 build
  // (five CTAs per SM) a spill.
  const auto q_rows = [&] {
    if constexpr (kPackedBatch)
      return packed_q_len;
    else
      return args.q_len;
  };
  const int kv_head = blockIdx.y / kDecodeHeadChunks;
  const int head_chunk = blockIdx.y % kDecodeHeadChunks;
  const int kv_len = args.kv_len[b];
  const int q_offset = args.q_offset ? args.q_offset[b] : 0;

  const uint32_t q_tile = shared_address(shared);
  const uint32_t k_tiles = q_tile + kDecodeQBytes;
  const uint32_t v_tiles = k_tiles + 2 * kDecodeStageBytes;
  uint8_t *classes = shared + kDecodeQBytes + 4 * kDecodeStageBytes;
  uint8_t *tile_seen = classes + kDecodeClassBytes;
  // Words for the reductions below, in the region of the kv-warp merge
  // (used only after the last tile): 8 for the visible range, 4 for a
  // tile's kept-row ballots, then the kept-row table (tiles, count, bits).
  int *range_words = reinterpret_cast<int *>(tile_seen + kMaxSplitBlocks);
  unsigned *keep_words = reinterpret_cast<unsigned *>(range_words + 8);
  int *keep_tiles = reinterpret_cast<int *>(keep_words + 4); // + the count
  uint64_t *keep_bits = reinterpret_cast<uint64_t *>(keep_tiles + kKeepTable + 4);
  // The rows' block-list lengths (load_list_counts), in the first K stage:
  // read only before the first K/V copy is issued.
  int *list_counts = reinterpret_cast<int *>(shared + kDecodeQBytes);
  // The pages of the next tile to copy (after the kv-warp merge region).
  int32_t *page_slots = reinterpret_cast<int32_t *>(tile_seen + kMaxSplitBlocks +
                                                    2 * 64 * sizeof(float));
  // The stages' full mbarriers (tensor-map copies), after the page slots.
  const uint32_t full_bars = shared_address(page_slots + 64);
  // Per stage: the XOR of a run-copied tile's columns (page_slots' entries
  // from 32 on, which tiles of 16-row pages never use).
  int32_t *stage_xor = page_slots + 32;
  static_assert(!kDecodeRunBoxes || kDecodeTilePages <= 32, "the run XOR words are free");
  const bool use_maps = kDecodeTma && maps.tensor_maps != 0;
  if constexpr (kDecodeTma) {
    if (use_maps && thread == 0) {
      mbarrier_init(full_bars, 1);
      mbarrier_init(full_bars + 8, 1);
    }
    // (Visible to every thread at the barriers before the first copy.)
  }
  static_assert(2 * kPaddedRows * 4 <= kDecodeStageBytes, "list lengths fit a stage");
  const bool has_block_mask = binds_block_mask(args);

  // Query rows: head-major, token-minor; gathered from q [B, Hq, Lq, D].
  // Issued first: their copy overlaps the block-list loads below.
  const Element *q_batch = static_cast<const Element *>(args.q) + b * args.q_stride[0];
  constexpr int kQChunks = kPaddedRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kQChunks + kDecodeThreads - 1) / kDecodeThreads; ++i) {
    int index = thread + i * kDecodeThreads;
    // (A partial last trip at head dims that are not powers of two.)
    if (kQChunks % kDecodeThreads != 0 && index >= kQChunks)
      break;
    int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
    DecodeRow info = decode_row(row, kv_head, head_chunk, q_rows());
    const Element *source = q_batch + info.head * args.q_stride[1] +
                            (first_row + info.token) * args.q_stride[2] + chunk * 8;
    cp_async_16(q_tile + tile_offset(row, chunk), source, info.valid ? 16 : 0);
  }
  cp_async_commit();

  // The kv range this CTA's rows see: [0, kv_len) without a block mask,
  // else the kv blocks from the lowest to the highest any row lists.
  int range_begin = 0, range_end = kv_len, granule = kDecodeTileN;
  // A packed batch's first key (kv_start): the range starts at the tile
  // that holds it, whose rows below it are neither copied nor kept.
  int kv_from = 0;
  if constexpr (kPackedBatch) {
    kv_from = args.kv_start ? args.kv_start[b] : 0;
    range_begin = imin(kv_from / kDecodeTileN * kDecodeTileN, kv_len);
  }
  if (has_block_mask) {
    granule = args.kv_block_size;
    load_list_counts(args, kv_head, head_chunk, b, q_offset, thread, list_counts);
    __syncthreads();
    int first = 0x7fffffff, last = -1;
    for_listed_blocks(args, kv_head, head_chunk, b, q_offset, list_counts, warp, lane,
                      [&](int, int block, uint8_t) {
                        first = imin(first, block);
                        last = imax(last, block);
                      });
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      first = imin(first, __shfl_xor_sync(0xffffffffu, first, offset));
      last = imax(last, __shfl_xor_sync(0xffffffffu, last, offset));
    }
    if (lane == 0) {
      range_words[warp] = first;
      range_words[4 + warp] = last;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      first = imin(first, range_words[w]);
      last = imax(last, range_words[4 + w]);
    }
    __syncthreads();
    first = imax(first, 0);
    range_begin = static_cast<int>(
        imin64(static_cast<int64_t>(first) * granule, static_cast<int64_t>(kv_len)));
    range_end = last < first ? range_begin
                             : static_cast<int>(imin64((static_cast<int64_t>(last) + 1) *
                                                           granule,
                                                       static_cast<int64_t>(kv_len)));
  }
  // Split `split` of num_splits equal parts, in whole granules (so a split
  // starts on a block-mask block and covers at most kMaxSplitBlocks of
  // them: the host plans num_splits for that).
  const int granules =
      range_end > range_begin ? (range_end - range_begin + granule - 1) / granule : 0;
  // The host's span bound makes this at most kMaxSplitBlocks; the clamp
  // keeps the class map in bounds whatever the arguments say.
  const int split_granules =
      has_block_mask ? imin((granules + args.num_splits - 1) / args.num_splits, kMaxSplitBlocks)
                     : (granules + args.num_splits - 1) / args.num_splits;
  const int64_t split_at =
      range_begin + static_cast<int64_t>(split) * split_granules * granule;
  const int split_begin = static_cast<int>(imin64(split_at, range_end));
  const int split_end = static_cast<int>(
      imin64(split_at + static_cast<int64_t>(split_granules) * granule, range_end));

  const Element *k_head =
      static_cast<const Element *>(args.k_cache) + kv_head * args.k_stride[0];
  const Element *v_head =
      static_cast<const Element *>(args.v_cache) + kv_head * args.v_stride[0];
  const int32_t *page_row = args.page_table + b * args.page_table_stride;

  // The two rows this thread holds.
  int local_row[2], b_of[2], h_of[2], q_of[2];
  pagedc_mods::MaskRow mask_rows[2];
  pagedc_mods::ScoreRow score_rows[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    local_row[half] = row_warp * 16 + (lane >> 2) + 8 * half;
    DecodeRow info = decode_row(local_row[half], kv_head, head_chunk, q_rows());
    b_of[half] = b;
    h_of[half] = info.head;
    q_of[half] = q_offset + info.token;
    if constexpr (kPackedBatch) {
      // A cascade level's rows: each its own position and batch index
      // (padding rows take the last token's).
      const int token = first_row + imin(info.token, q_rows() - 1);
      if (args.token_position)
        q_of[half] = args.token_position[token];
      if (args.token_batch)
        b_of[half] = args.token_batch[token];
    }
    mask_rows[half] = pagedc_mods::mask_row(params, b_of[half], info.head, q_of[half]);
    score_rows[half] = pagedc_mods::score_row(params, b_of[half], info.head, q_of[half]);
  }

  // Block classes of every row over this split's kv blocks.
  const int block_begin = has_block_mask ? split_begin / args.kv_block_size : 0;
  const int block_count =
      has_block_mask && split_end > split_begin
          ? (split_end - 1) / args.kv_block_size - block_begin + 1
          : 0;
  if (has_block_mask) {
    for (int i = thread; i < kDecodeClassBytes; i += kDecodeThreads)
      classes[i] = 0;
    __syncthreads();
    for_listed_blocks(args, kv_head, head_chunk, b, q_offset, list_counts, warp, lane,
                      [&](int row, int block, uint8_t block_class) {
                        block -= block_begin;
                        if (block >= 0 && block < block_count)
                          classes[row * kMaxSplitBlocks + block] = block_class;
                      });
    __syncthreads();
    // tile_seen: the classes' union, plus kAllFull when every row that
    // exists sees the block as full (its tiles then skip the mask, the
    // kv_len test and the select: apply_mods' all_kept path).
    for (int block = thread; block < block_count; block += kDecodeThreads) {
      uint8_t seen = 0;
      bool all_full = true;
      for (int row = 0; row < kPaddedRows; ++row) {
        const uint8_t block_class = classes[row * kMaxSplitBlocks + block];
        seen |= block_class;
        if (decode_row(row, kv_head, head_chunk, q_rows()).valid)
          all_full = all_full && block_class == 2;
      }
      tile_seen[block] = seen | (seen != 0 && all_full ? kAllFull : 0);
    }
    __syncthreads();
  }

  RowState state;
  float out[kValueHeadDim / 8][4];
  reset_rows(state, out);
  // An 8-bit cache's K scale multiplies the scores (with args.scale).
  float k_scale = 1.0f;
  if constexpr (kKvFloat8 != 0)
    k_scale = args.k_scale[kv_head];

  const int tiles = split_end > split_begin
                        ? (split_end - split_begin + kDecodeTileN - 1) / kDecodeTileN
                        : 0;
  // The block-mask block of `tile`, relative to the split's first. The
  // runtime's block sizes are multiples of the tile (CudaLaunch refuses
  // others) and almost always powers of two: a shift then replaces the
  // division (about 20 instructions, twice per tile).
  const unsigned block_size = static_cast<unsigned>(args.kv_block_size);
  auto tile_block = [&](int tile) {
    if ((block_size & (block_size - 1)) == 0 && block_size >= kDecodeTileN)
      return static_cast<int>(static_cast<unsigned>(tile) >>
                              (31 - __clz(static_cast<int>(block_size)) - kLog2DecodeTileN));
    return (split_begin + tile * kDecodeTileN) / args.kv_block_size - block_begin;
  };
  // A tile goes into the keep table (below) only if its rows see its block
  // through partial classes and never as full (tile_seen's classes union).
  auto listable = [](uint8_t seen) { return (seen & 3) == 1; };
  // Kept kv rows of the split's first kKeepTable tiles that its rows see
  // only through partial blocks, computed before the tile loop: every thread
  // evaluates the mask of one kv row for half of the rows, a warp's ballot
  // covers 32 kv rows. (Evaluated inside the loop, the mask raised the
  // register pressure around a score mod's out-of-line call: 28 bytes of
  // spills on sm_80, D 64, causal + trig.) Later partial tiles are read
  // whole; the mask is applied to their scores either way.
  if constexpr (pagedc_mods::kHasMask) {
    if (has_block_mask) {
      // An opaque copy of the batch index: nothing the mask computes from it
      // here is shared with (and so kept live into) the tile loop's mask and
      // score code, which spilled around a score mod's out-of-line call
      // (D 64, trig with causal, padded_causal, dilated_sliding_window).
      int batch = b;
      asm volatile("" : "+r"(batch));
      int listed = 0;
      for (int tile = 0; tile < tiles && listed < kKeepTable; ++tile) {
        const int block = tile_block(tile);
        if (!listable(tile_seen[block]))
          continue;
        const int kv = split_begin + tile * kDecodeTileN + (thread & (kDecodeTileN - 1));
        bool kept = false;
        if (kv < split_end) {
          for (int row = thread / kDecodeTileN; row < kPaddedRows && !kept;
               row += kDecodeThreads / kDecodeTileN) {
            if (classes[row * kMaxSplitBlocks + block] != 1)
              continue;
            DecodeRow info = decode_row(row, kv_head, head_chunk, q_rows());
            const int q = q_offset + info.token;
            kept = pagedc_mods::mask(params, pagedc_mods::mask_row(params, batch, info.head, q),
                                     batch, info.head, q, kv);
          }
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, kept);
        __syncthreads();
        if (lane == 0)
          keep_words[warp] = ballot;
        __syncthreads();
        if (thread == 0) {
          keep_tiles[listed] = tile;
          keep_bits[listed] = (static_cast<uint64_t>(keep_words[1] | keep_words[3]) << 32) |
                              (keep_words[0] | keep_words[2]);
        }
        ++listed;
      }
      if (thread == 0)
        keep_tiles[kKeepTable] = listed;
      __syncthreads();
    }
  }
  // The kept kv rows of `tile`: from the table, else all.
  auto tile_keep = [&](int tile) -> uint64_t {
    if constexpr (pagedc_mods::kHasMask) {
      if (has_block_mask)
        for (int i = 0; i < keep_tiles[kKeepTable]; ++i)
          if (keep_tiles[i] == tile)
            return keep_bits[i];
    }
    return ~static_cast<uint64_t>(0);
  };
  // The next tile at or after `tile` that some row sees and keeps a kv row
  // of; `keep` receives its kept kv rows. Tiles that cannot be listed skip
  // the table's search (a dependent chain of shared loads per entry).
  auto next_tile = [&](int tile, uint64_t &keep) {
    keep = ~static_cast<uint64_t>(0);
    if (has_block_mask)
      for (; tile < tiles; ++tile) {
        const uint8_t seen = tile_seen[tile_block(tile)];
        if (seen == 0)
          continue;
        keep = listable(seen) ? tile_keep(tile) : ~static_cast<uint64_t>(0);
        if (keep != 0)
          break;
      }
    return tile;
  };

  // The pages of a tile's rows are staged in shared memory (page_slots,
  // one per page the tile touches) by the threads below kDecodeTilePages: the
  // page of tile `after` is loaded into a register at the top of an
  // iteration and stored after the tile's math, so its latency hides behind
  // that math; the copies of the next iteration read it from shared memory.
  auto stage_page = [&](int which) {
    // A packed batch's kernel above head dim 128 forms the row's address
    // again for each tile rather than holding it through the tile loop:
    // held, the kernel of an 8-bit cache (whose codes are always gathered)
    // spilled on sm_90 (8 bytes stored, 64 loaded, at head dim 256 under a
    // document mask); formed here, it does not.
    const int32_t *row = page_row;
    if constexpr (kPackedBatch && kHeadDim > 128)
      row = args.page_table + recompute_here(b) * args.page_table_stride;
    return tile_page<kDecodeTileN>(row, split_begin + which * kDecodeTileN, split_end,
                                   thread);
  };
  // An 8-bit cache's codes: tiles of stage s at k_codes(s), v_codes(s), in
  // the second K and V stages; the first holds the converted tiles.
  const Float8TileCopier<kDecodeTileN, kDecodeThreads> copy_codes(
      static_cast<const char *>(args.k_cache) + kv_head * args.k_stride[0],
      static_cast<const char *>(args.v_cache) + kv_head * args.v_stride[0], thread,
      args.k_stride, args.v_stride);
  auto k_codes = [&](int at_stage) {
    return kDecodeQBytes + kDecodeStageBytes + at_stage * kDecodeCodeBytes;
  };
  auto v_codes = [&](int at_stage) { return k_codes(at_stage) + 2 * kDecodeStageBytes; };
  // With kDecodeCodeRegisters: the codes of the next tile to convert.
  Float8RegisterTiles<kDecodeTileN, kDecodeThreads, DecodeTile> held_codes(
      static_cast<const char *>(args.k_cache) + kv_head * args.k_stride[0],
      static_cast<const char *>(args.v_cache) + kv_head * args.v_stride[0], thread,
      args.k_stride, args.v_stride);
  using DecodeCopier = KvTileCopier<kDecodeTileN, kDecodeThreads, DecodeTile>;
  const DecodeCopier copy_kv = [&] {
    if constexpr (kPackedBatch)
      return DecodeCopier(k_head, v_head, thread, args.k_stride, args.v_stride);
    else
      return DecodeCopier(k_head, v_head, thread);
  }();
  // Whether tile `which` comes by tensor maps: a whole tile inside the
  // split whose every kv row some row may keep (a gathered tile zero-fills
  // the others and the rows past the split's end).
  auto by_tensor_maps = [&](int which, uint64_t keep_rows) {
    return use_maps && keep_rows == ~static_cast<uint64_t>(0) &&
           split_begin + (which + 1) * kDecodeTileN <= split_end;
  };
  // Returns whether the copy went by tensor maps (its bytes then arrive on
  // the stage's full mbarrier; a gather's with the iteration's cp.async
  // group).
  auto copy_tile = [&](int into_stage, int which, uint64_t keep_rows) {
    const int kv_begin = split_begin + which * kDecodeTileN;
    if constexpr (kPackedBatch)
      if (kv_begin < kv_from)
        keep_rows &= ~static_cast<uint64_t>(0) << (kv_from - kv_begin);
    const uint32_t k_tile = k_tiles + into_stage * kDecodeStageBytes;
    const uint32_t v_tile = v_tiles + into_stage * kDecodeStageBytes;
    if constexpr (kDecodeCodeRegisters) {
      held_codes.load(StagedPages{page_slots, kv_begin}, kv_begin, split_end, keep_rows);
      return false;
    } else if constexpr (kKvFloat8 != 0) {
      copy_codes(q_tile + k_codes(into_stage), q_tile + v_codes(into_stage),
                 StagedPages{page_slots, kv_begin}, kv_begin, split_end, keep_rows);
      return false;
    }
    if constexpr (kDecodeTma) {
      if (by_tensor_maps(which, keep_rows)) {
        if (warp == 0) {
          const uint32_t bar = full_bars + 8 * into_stage;
          // Consecutive pages: one box per atom column (every lane tests).
          bool up = kDecodeRunBoxes && maps.run_boxes != 0, down = up;
          if constexpr (kDecodeRunBoxes) {
#pragma unroll
            for (int i = 1; i < kDecodeTilePages; ++i) {
              up = up && page_slots[i] == page_slots[0] + i;
              down = down && page_slots[i] == page_slots[0] - i;
            }
            // Read after the barrier that follows this copy (the stage's
            // previous tile was read before the one that preceded it).
            if (lane == 0)
              stage_xor[into_stage] = down ? kDecodeRunReversed : 0;
          }
          if (lane == 0)
            mbarrier_arrive_expect_tx(bar, 2u * kDecodeStageBytes);
          __syncwarp();
          if (kDecodeRunBoxes && (up || down)) {
            if (lane < 2 * (kHeadDim / 64)) {
              const bool is_v = lane >= kHeadDim / 64;
              const int atom = is_v ? lane - kHeadDim / 64 : lane;
              const int at[4] = {64 * atom, 0,
                                 page_slots[up ? 0 : kDecodeTilePages - 1], kv_head};
              fence_proxy_async();
              bulk_tensor_g2s<4>((is_v ? v_tile : k_tile) + atom * atom_bytes(kDecodeTileN),
                                 reinterpret_cast<const TensorMap *>(is_v ? maps.v_run_map
                                                                          : maps.k_run_map),
                                 at, bar);
            }
          } else if (lane < 2 * kDecodeBoxes) {
            const bool is_v = lane >= kDecodeBoxes;
            const int box = is_v ? lane - kDecodeBoxes : lane;
            const int page = box / (kHeadDim / 64), atom = box % (kHeadDim / 64);
            const int at[4] = {64 * atom, kv_begin & (kPageSize - 1), page_slots[page],
                               kv_head};
            // The stage's bytes were last written by generic stores (a
            // gather, the list counts): ordered before the copy engine's.
            fence_proxy_async();
            bulk_tensor_g2s<4>((is_v ? v_tile : k_tile) + atom * atom_bytes(kDecodeTileN) +
                                   static_cast<uint32_t>(page) * kDecodeBoxRows * 128,
                               reinterpret_cast<const TensorMap *>(is_v ? maps.v_map
                                                                        : maps.k_map),
                               at, bar);
          }
        }
        return true;
      }
    }
    copy_kv(k_tile, v_tile, StagedPages{page_slots, kv_begin}, kv_begin, split_end, keep_rows);
    return false;
  };
  // Phase parities of the two full mbarriers (bit per stage).
  unsigned phases = 0;
  auto wait_tile = [&](int at_stage, bool by_maps) {
    if constexpr (kDecodeTma) {
      if (by_maps) {
        mbarrier_wait(full_bars + 8 * at_stage, (phases >> at_stage) & 1u);
        phases ^= 1u << at_stage;
      }
    }
  };
  uint64_t keep, keep_next;
  int tile = next_tile(0, keep), stage = 0;
  int32_t staged = tile < tiles ? stage_page(tile) : 0;
  if (thread < kDecodeTilePages)
    page_slots[thread] = staged;
  __syncthreads();
  bool mapped = tile < tiles && copy_tile(0, tile, keep);
  cp_async_commit();
  int next = next_tile(tile + 1, keep_next);
  staged = next < tiles ? stage_page(next) : 0;
  cp_async_wait<1>();
  __syncthreads();
  if (thread < kDecodeTilePages)
    page_slots[thread] = staged;
  __syncthreads();
  uint32_t q_regs[kDecodeQInRegisters ? kHeadDim / 16 : 1][4];
  if constexpr (kDecodeQInRegisters) {
#pragma unroll
    for (int k_step = 0; k_step < kHeadDim / 16; ++k_step)
      load_query_fragment(q_regs[k_step], q_tile, row_warp * 16, k_step, lane);
  }

  while (tile < tiles) {
    const int kv_begin = split_begin + tile * kDecodeTileN;
    // Held codes: this tile's are converted into the first stage (whose
    // previous tile's math ended at the loop's last barrier) before the
    // registers take the next tile's, whose loads then overlap this math.
    if constexpr (kDecodeCodeRegisters)
      held_codes.store(shared + kDecodeQBytes, shared + kDecodeQBytes + 2 * kDecodeStageBytes);
    const bool mapped_next = next < tiles && copy_tile(stage ^ 1, next, keep_next);
    cp_async_commit();
    uint64_t keep_after = 0;
    const int after = next < tiles ? next_tile(next + 1, keep_after) : tiles;
    staged = after < tiles ? stage_page(after) : 0;
    cp_async_wait<1>();
    wait_tile(stage, mapped);
    __syncthreads();
    if constexpr (kKvFloat8 != 0 && !kDecodeCodeRegisters) {
      convert_code_tiles<kDecodeTileN, kDecodeThreads, DecodeTile>(
          shared + kDecodeQBytes, shared + kDecodeQBytes + 2 * kDecodeStageBytes,
          shared + k_codes(stage), shared + v_codes(stage), thread);
      __syncthreads();
    }
    // The tiles the math reads (an 8-bit cache's converted ones: stage 0).
    const int math_stage = kKvFloat8 != 0 ? 0 : stage;

    bool visible[2] = {true, true}, check_mask[2] = {true, true};
    // Every row keeps every kv position of the tile (CTA-uniform).
    bool all_kept = !pagedc_mods::kHasMask && kv_begin + kDecodeTileN <= split_end;
    if (has_block_mask) {
      const int block = tile_block(tile);
      all_kept = (tile_seen[block] & kAllFull) && kv_begin + kDecodeTileN <= split_end;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint8_t block_class = classes[local_row[half] * kMaxSplitBlocks + block];
        visible[half] = block_class != 0;
        check_mask[half] = block_class == 1;
      }
    }
    constexpr int kNTiles = kColumnsPerWarp / 8;
    float scores[kNTiles][4];
    warp_scores<kNTiles, kDecodeQInRegisters, DecodeTile>(
        scores, q_regs, q_tile, row_warp * 16, k_tiles + math_stage * kDecodeStageBytes,
        kv_warp * kColumnsPerWarp, lane);
    // A tile copied as a descending page run holds its keys page-reversed:
    // the warp's columns start at key (its first column ^ XOR), and within
    // them the XOR's low bits remain.
    int tile_xor = 0;
    if constexpr (kDecodeRunBoxes)
      tile_xor = mapped ? stage_xor[stage] : 0;
    apply_mods<kNTiles, kRowHalves>(
        scores, params, mask_rows, score_rows, b_of, h_of, q_of, visible, check_mask,
        kv_begin + ((kv_warp * kColumnsPerWarp) ^ (tile_xor & ~(kColumnsPerWarp - 1))),
        split_end, kKvFloat8 != 0 ? args.scale * k_scale : args.scale, lane, all_kept, false,
        tile_xor & (kColumnsPerWarp - 1));
    if constexpr (kPackedBatch)
      if (kv_begin < kv_from)
        mask_keys_below<kNTiles, kRowHalves>(scores, kv_begin + kv_warp * kColumnsPerWarp,
                                             kv_from, lane);
    online_softmax<kNTiles, kRowHalves>(state, scores, out);
    warp_accumulate<kNTiles, DecodeTile>(out, scores, v_tiles + math_stage * kDecodeStageBytes,
                             kv_warp * kColumnsPerWarp, lane);
    // The copies above read page_slots before the barrier that precedes
    // the math: the slots take tile `after`'s pages now.
    if (thread < kDecodeTilePages)
      page_slots[thread] = staged;
    __syncthreads();
    tile = next;
    next = after;
    keep_next = keep_after;
    mapped = mapped_next;
    stage ^= 1;
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the kv-warps' states: row maxima and sums first, then the
  // rescaled outputs, accumulated in f32 over the K/V tiles' memory.
  float *part_max = reinterpret_cast<float *>(tile_seen + kMaxSplitBlocks);
  float *part_sum = part_max + kKvWarps * kPaddedRows;
  float *merged = reinterpret_cast<float *>(shared + kDecodeQBytes);
  float row_scale[2], row_lse[2];
  // The sinks join a row's softmax once: here with one split, else in the
  // merge (each split's partial lse leaves them out).
  const bool sinks_here = args.sinks != nullptr && args.num_splits == 1;
#pragma unroll
  for (int half = 0; half < kRowHalves; ++half) {
    float sum = quad_sum(state.sum[half]);
    if ((lane & 3) == 0) {
      part_max[kv_warp * kPaddedRows + local_row[half]] = state.max[half];
      part_sum[kv_warp * kPaddedRows + local_row[half]] = sum;
    }
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < kRowHalves; ++half) {
    float row_max = -infinity();
#pragma unroll
    for (int w = 0; w < kKvWarps; ++w)
      row_max = fmaxf(row_max, part_max[w * kPaddedRows + local_row[half]]);
    float base = row_max == -infinity() ? 0.0f : row_max;
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kKvWarps; ++w)
      total += part_sum[w * kPaddedRows + local_row[half]] *
               exp2_approx(part_max[w * kPaddedRows + local_row[half]] - base);
    row_scale[half] =
        exp2_approx(state.max[half] - base) *
        finish_row(row_max, total, sinks_here ? args.sinks + h_of[half] : nullptr, row_lse[half]);
    // An 8-bit cache's V scale multiplies the output rows.
    if constexpr (kKvFloat8 != 0)
      row_scale[half] *= args.v_scale[kv_head];
  }
  // The KV warps add their rows into `merged` in turn. Each warp runs the
  // body in one trip only, so the loop is not unrolled: unrolled, the body
  // came once per warp (a sixth of the split kernel's PTX at head dim 128,
  // GQA 4) and NVVM and ptxas compiled every copy.
#pragma unroll 1
  for (int w = 0; w < kKvWarps; ++w) {
    if (kv_warp == w) {
#pragma unroll
      for (int half = 0; half < kRowHalves; ++half) {
        float *merged_row = merged + local_row[half] * kValueHeadDim + 2 * (lane & 3);
#pragma unroll
        for (int d = 0; d < kValueHeadDim / 8; ++d) {
          float x = out[d][2 * half] * row_scale[half];
          float y = out[d][2 * half + 1] * row_scale[half];
          if (w != 0) {
            x += merged_row[d * 8];
            y += merged_row[d * 8 + 1];
          }
          merged_row[d * 8] = x;
          merged_row[d * 8 + 1] = y;
        }
      }
    }
    __syncthreads();
  }

  const bool single_split = args.num_splits == 1;
  if (kv_warp == 0 && (lane & 3) == 0) {
#pragma unroll
    for (int half = 0; half < kRowHalves; ++half) {
      DecodeRow info = decode_row(local_row[half], kv_head, head_chunk, q_rows());
      if (!info.valid)
        continue;
      int64_t row_index =
          (static_cast<int64_t>(b) * args.heads_q + info.head) * args.q_len + info.token;
      // A packed batch's partials by list entry, its lse by packed row.
      int64_t lse_index = row_index;
      if constexpr (kPackedBatch) {
        row_index = (static_cast<int64_t>(blockIdx.z) * kQueryTokens + info.token) *
                        args.heads_q + info.head;
        lse_index = static_cast<int64_t>(first_row + info.token) * args.heads_q + info.head;
      }
      if (!single_split)
        args.partial_lse[row_index * args.num_splits + split] = row_lse[half];
      else if constexpr (pagedc_config::kHasLse)
        args.lse[lse_index] = row_lse[half];
    }
  }
  // Rows out: consecutive threads store consecutive column pairs.
  for (int index = thread; index < kPaddedRows * kValueHeadDim / 2; index += kDecodeThreads) {
    int row = index / (kValueHeadDim / 2), column = (index % (kValueHeadDim / 2)) * 2;
    DecodeRow info = decode_row(row, kv_head, head_chunk, q_rows());
    if (!info.valid)
      continue;
    float x = merged[row * kValueHeadDim + column],
          y = merged[row * kValueHeadDim + column + 1];
    if (single_split) {
      store_out_pair(args.out,
                     b * args.out_stride[0] + info.head * args.out_stride[1] +
                         (first_row + info.token) * args.out_stride[2] + column,
                     x, y);
    } else {
      int64_t row_index =
          (static_cast<int64_t>(b) * args.heads_q + info.head) * args.q_len + info.token;
      if constexpr (kPackedBatch)
        row_index = (static_cast<int64_t>(blockIdx.z) * kQueryTokens + info.token) *
                        args.heads_q + info.head;
      float *partial =
          args.partial_out + (row_index * args.num_splits + split) * kValueHeadDim;
      partial[column] = x;
      partial[column + 1] = y;
    }
  }
}

#endif // PAGEDC_UNIT_DECODE_MERGE

#ifndef PAGEDC_UNIT_DECODE_SPLIT
extern "C" __global__ void __launch_bounds__(128)
    pagedc_decode_merge(const __grid_constant__ PagedcAttentionKernelArgs args) {
  using namespace pagedc;
  // Launched while the split kernel drains: its partials are complete and
  // visible only after this wait.
  wait_for_prerequisite_grid();
  // A row's columns may be divided among `chunks` CTAs (grid x = q_len x
  // chunks, the planner's choice): one CTA per row leaves most of the
  // device idle when rows are few (B 1: 32 CTAs). A packed batch's grid x
  // is its token slots, one CTA each.
  const int chunks = kPackedBatch ? 1 : imax(static_cast<int>(gridDim.x) / imax(args.q_len, 1), 1);
  const int token = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
  const int splits = args.num_splits;
  int b = blockIdx.z, first_row = 0;
  const int h = blockIdx.y;
  int64_t row_index = (static_cast<int64_t>(b) * args.heads_q + h) * args.q_len + token;
  int64_t lse_index = row_index;
  if constexpr (kPackedBatch) {
    // Entry z of the decode list; its rows past q_len_b do not exist, nor
    // do entries past a fixed grid's count.
    if (args.work_counts != nullptr && static_cast<int>(blockIdx.z) >= args.work_counts[1])
      return;
    b = args.work_tiles[2 * blockIdx.z];
    first_row = args.q_start[b];
    if (token >= args.q_start[b + 1] - first_row)
      return;
    row_index = (static_cast<int64_t>(blockIdx.z) * kQueryTokens + token) * args.heads_q + h;
    lse_index = static_cast<int64_t>(first_row + token) * args.heads_q + h;
  }
  // partial_lse: [splits] of this row; partial_out: [splits, D].
  const float *lse = args.partial_lse + row_index * splits;
  const float *partial = args.partial_out + row_index * splits * kValueHeadDim;
  // The row's maximum and sum over the splits, each thread taking every
  // 128th split and the block reducing: a thread walking all the splits
  // would make the merge one dependent chain of loads per split.
  PAGEDC_SHARED(float, reduce, kDecodeThreads);
  const int t = threadIdx.x;
  float part = -infinity();
  for (int i = t; i < splits; i += kDecodeThreads)
    part = fmaxf(part, lse[i]);
  reduce[t] = part;
  __syncthreads();
  for (int stride = kDecodeThreads / 2; stride > 0; stride /= 2) {
    if (t < stride)
      reduce[t] = fmaxf(reduce[t], reduce[t + stride]);
    __syncthreads();
  }
  // The sink (a logit with a zero value) joins the splits' states here,
  // once: as one more state of lse sinks[h] and output 0.
  const float sink = args.sinks != nullptr ? args.sinks[h] : -infinity();
  const float row_max = fmaxf(sink, reduce[0]);
  const float base = row_max == -infinity() ? 0.0f : row_max;
  __syncthreads();
  part = 0.0f;
  for (int i = t; i < splits; i += kDecodeThreads)
    part += exp2_approx((lse[i] - base) * kLog2e);
  reduce[t] = part;
  __syncthreads();
  for (int stride = kDecodeThreads / 2; stride > 0; stride /= 2) {
    if (t < stride)
      reduce[t] += reduce[t + stride];
    __syncthreads();
  }
  const float total = exp2_approx((sink - base) * kLog2e) + reduce[0];
  const float inverse = total > 0.0f ? 1.0f / total : 0.0f;
  const int64_t out_row =
      b * args.out_stride[0] + h * args.out_stride[1] + (first_row + token) * args.out_stride[2];
  // This CTA's column pairs; `lanes` threads share a pair, each taking
  // every lanes-th split, and the first of them adds the others' sums.
  constexpr int kPairs = kValueHeadDim / 2;
  const int pairs = (kPairs + chunks - 1) / chunks, first_pair = chunk * pairs;
  const int lanes = pairs >= kDecodeThreads ? 1 : kDecodeThreads / pairs;
  PAGEDC_SHARED(float, sums_x, kDecodeThreads);
  PAGEDC_SHARED(float, sums_y, kDecodeThreads);
  for (int pair0 = 0; pair0 < pairs; pair0 += kDecodeThreads / lanes) {
    const int pair = pair0 + t % (kDecodeThreads / lanes), lane = t / (kDecodeThreads / lanes);
    const int column = 2 * (first_pair + pair);
    const bool mine = pair < pairs && first_pair + pair < kPairs && lane < lanes;
    float x = 0.0f, y = 0.0f;
    if (mine)
      for (int i = lane; i < splits; i += lanes) {
        const float weight = exp2_approx((lse[i] - base) * kLog2e);
        x += weight * partial[i * kValueHeadDim + column];
        y += weight * partial[i * kValueHeadDim + column + 1];
      }
    __syncthreads(); // the previous round's sums are read
    sums_x[t] = x;
    sums_y[t] = y;
    __syncthreads();
    if (mine && lane == 0) {
      for (int other = 1; other < lanes; ++other) {
        x += sums_x[t + other * (kDecodeThreads / lanes)];
        y += sums_y[t + other * (kDecodeThreads / lanes)];
      }
      store_out_pair(args.out, out_row + column, x * inverse, y * inverse);
    }
  }
  if constexpr (pagedc_config::kHasLse) {
    if (t == 0 && chunk == 0)
      args.lse[lse_index] = total > 0.0f ? row_max + logf(total) : -infinity();
  }
}
#endif // PAGEDC_UNIT_DECODE_SPLIT
