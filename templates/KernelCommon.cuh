//===- KernelCommon.cuh - Tensor-core tiles over a paged KV cache -*- CUDA -*-===//
//
// Building blocks shared by the prefill and decode kernels: inline-PTX
// wrappers (cp.async, ldmatrix, mma.sync m16n8k16), swizzled shared-memory
// tiles, the paged K/V tile loader, and the per-row online softmax state.
// Everything is parameterised by the constexprs of `pagedc_config`.
//
// Shared-memory tiles hold rows of 16-bit elements (kHeadDim of q and K,
// kValueHeadDim of V) as 16-byte chunks; chunk c of row r lives at position
// c ^ (r & 7) of that row, so the eight rows an ldmatrix phase reads fall in
// eight different bank groups. A tile row is kTileHeadDim wide (the wider
// head dim rounded up to 64 elements) so that the swizzle stays inside it;
// the chunks past a tensor's head dim are never written nor read.
//
// Why one file of over 1,000 lines: every kernel translation unit includes
// these pieces in this order after the generated mods, and the loaders, the
// softmax state and the packed-batch row maps share the configuration's
// constexprs; split files would each need the same preamble of `using`s and
// the assembler (KernelSource) a longer fixed list, for no reader's gain.
//
//===----------------------------------------------------------------------===//

namespace pagedc {

using pagedc_config::kHeadDim;
using pagedc_config::kValueHeadDim;
using pagedc_config::kIsBF16;
using pagedc_config::kLog2PageSize;
using pagedc_config::kPageSize;
using pagedc_config::kPackedBatch;
using pagedc_config::kOutputF32;
using Element = pagedc_config::Element;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
/// 16-byte chunks of a q or K row.
constexpr int kChunksPerRow = kHeadDim / 8;
/// Bytes per row of q and K in global memory.
constexpr int kRowBytes = kHeadDim * 2;
/// The same for V and out rows, kValueHeadDim wide (Dv, which may differ
/// from D).
constexpr int kValueChunksPerRow = kValueHeadDim / 8;
constexpr int kValueRowBytes = kValueHeadDim * 2;
/// Elements per tile row in shared memory (Q, K and V tiles alike): the
/// wider of D and Dv rounded up to a multiple of 64, the span of the
/// swizzle (8 chunks).
constexpr int kTileHeadDim =
    ((kHeadDim > kValueHeadDim ? kHeadDim : kValueHeadDim) + 63) / 64 * 64;
/// Bytes per tile row in shared memory.
constexpr int kTileRowBytes = kTileHeadDim * 2;

// mma.sync m16n8k16 takes 16 columns of D per k-step and ldmatrix.x4 16
// output columns per V read. The MLA decode (MlaDecode.cuh) takes D 576
// and Dv 512 with warps that each cover a slice of them.
static_assert(pagedc_config::kMlaDecode ||
                  (kHeadDim % 16 == 0 && kHeadDim >= 32 && kHeadDim <= 256),
              "head dim must be a multiple of 16 in [32, 256]");
static_assert(pagedc_config::kMlaDecode ||
                  (kValueHeadDim % 16 == 0 && kValueHeadDim >= 32 && kValueHeadDim <= 256),
              "value head dim must be a multiple of 16 in [32, 256]");
static_assert((kPageSize & (kPageSize - 1)) == 0 && kPageSize <= 1024,
              "page size must be a power of two in [1, 1024]");

//===--- PTX wrappers ----------------------------------------------------===//

PAGEDC_DEVICE void ldmatrix_x4(uint32_t (&fragment)[4],
                               uint32_t address PAGEDC_SITE_PARAMS) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::ldmatrix_x4(fragment, address, false PAGEDC_SITE_ARGS);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]),
                 "=r"(fragment[3])
               : "r"(address));
#endif
}
PAGEDC_DEVICE void ldmatrix_x4_trans(uint32_t (&fragment)[4],
                                     uint32_t address PAGEDC_SITE_PARAMS) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::ldmatrix_x4(fragment, address, true PAGEDC_SITE_ARGS);
#else
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
      : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]),
        "=r"(fragment[3])
      : "r"(address));
#endif
}

/// acc[16x8] += a[16x16] * b[16x8] with f32 accumulation.
PAGEDC_DEVICE void mma_16816(float (&acc)[4], const uint32_t (&a)[4],
                             uint32_t b0, uint32_t b1 PAGEDC_SITE_PARAMS) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::mma_16816(acc, a, b0, b1, kIsBF16 PAGEDC_SITE_ARGS);
#else
  if constexpr (kIsBF16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                   "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                   "r"(b1));
  }
#endif
}

/// Two floats -> two packed 16-bit elements (lo in the low half).
PAGEDC_DEVICE uint32_t pack_pair(float lo, float hi) {
#ifdef PAGEDC_EMULATOR
  return pagedc_emu::pack_pair(lo, hi, kIsBF16);
#else
  uint32_t packed;
  if constexpr (kIsBF16)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#endif
}

/// Stores out[at] and out[at + 1] (element offsets): a pair of Element, or
/// of f32 in the kernels of an f32 output (kOutputF32, packed batches).
PAGEDC_DEVICE void store_out_pair(void *out, int64_t at, float x, float y) {
  if constexpr (kOutputF32) {
    struct alignas(8) FloatPair {
      float x, y;
    };
    *reinterpret_cast<FloatPair *>(static_cast<float *>(out) + at) = FloatPair{x, y};
  } else {
    *reinterpret_cast<uint32_t *>(static_cast<Element *>(out) + at) = pack_pair(x, y);
  }
}

/// Programmatic dependent launch (sm_90): lets the next grid of the stream
/// be scheduled before this one ends (griddepcontrol.launch_dependents),
/// and waits until the previous grid has completed and its memory is
/// visible (griddepcontrol.wait). No-ops before sm_90, where launches are
/// serialised anyway, and on the emulator, which runs launches in order.
PAGEDC_DEVICE void allow_dependent_launch() {
#if !defined(PAGEDC_EMULATOR) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
PAGEDC_DEVICE void wait_for_prerequisite_grid() {
#if !defined(PAGEDC_EMULATOR) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A decode merge unit (PAGEDC_UNIT_DECODE_MERGE, KernelSource.h) holds no
// mod code and no tiles: only the pieces above, which its kernel uses.
#ifndef PAGEDC_UNIT_DECODE_MERGE

/// Lane 0's `value` in every lane: for values the same across the warp
/// (a warp or warpgroup index), so that ptxas knows they are and keeps
/// what derives from them (wgmma descriptors, barrier ids) in uniform
/// registers instead of recomputing it per tile in vector ones.
PAGEDC_DEVICE int warp_uniform(int value) { return __shfl_sync(0xffffffffu, value, 0); }

PAGEDC_DEVICE float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}
PAGEDC_DEVICE float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

//===--- Shared-memory tiles ---------------------------------------------===//

/// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
PAGEDC_DEVICE uint32_t tile_offset(int row, int chunk) {
  return row * kTileRowBytes + ((chunk ^ (row & 7)) << 4);
}

/// Loads `kRows` query rows into a swizzled tile; rows >= row_count are
/// zero-filled. Where the tile's chunks are not a multiple of the threads
/// (head dims that are not powers of two) the last trip is partial.
template <int kRows, int kThreads>
PAGEDC_DEVICE void load_query_tile(uint32_t tile, const Element *q_rows,
                                   // [rows, D] with row stride `row_stride`
                                   int64_t row_stride, int row_count,
                                   int thread) {
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kChunks + kThreads - 1) / kThreads; ++i) {
    int index = thread + i * kThreads;
    if (kChunks % kThreads != 0 && index >= kChunks)
      break;
    int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
    bool valid = row < row_count;
    const Element *source = q_rows + (valid ? row * row_stride : 0) + chunk * 8;
    cp_async_16(tile + tile_offset(row, chunk), source, valid ? 16 : 0);
  }
}

/// Pages a KV tile of kTile keys touches (tiles start at multiples of
/// kTile keys): the kernels stage one page index per page in shared memory.
template <int kTile>
constexpr int kTilePagesOf = kPageSize >= kTile ? 1 : kTile / kPageSize;

/// Thread `thread`'s page of the tile starting at kv_first: page `thread`
/// of the tile from the sequence's page-table row, `missing` for threads
/// past the tile's pages and for pages at or past kv_end.
template <int kTile>
PAGEDC_DEVICE int32_t tile_page(const int32_t *page_row, int kv_first, int kv_end, int thread,
                                int32_t missing = 0) {
  const int kv = kv_first + thread * kPageSize;
  return thread < kTilePagesOf<kTile> && kv < kv_end ? page_row[kv >> kLog2PageSize] : missing;
}

/// KvTileCopier's page lookup for a tile starting at kv_first whose pages
/// are staged in `slots` (tile_page, one per thread).
struct StagedPages {
  const int32_t *slots;
  int kv_first;
  PAGEDC_DEVICE int32_t operator()(int kv) const {
    return slots[(kv - kv_first) >> kLog2PageSize];
  }
};

/// Hides `pointer`'s value from the optimizer (no instruction).
template <typename T> PAGEDC_DEVICE void opaque(T *&pointer) {
#ifdef PAGEDC_EMULATOR
  asm("" : "+r"(pointer));
#else
  asm("" : "+l"(pointer));
#endif
}

/// Bytes of one page of one KV head. flexAttention's kernels read compact
/// [pages, page_size, D] caches per KV head (CudaLaunch.cpp's checkArgs
/// refuses other page and row strides), so a row's offset is a product of
/// constants: one wide multiply instead of two 64-bit multiplies per
/// tensor. Packed-batch kernels (kPackedBatch) read the engine's cache in
/// place, whose pages and slots may be strided (NHD, HND, vLLM layouts):
/// KvTileCopier then takes the strides of the call.
constexpr int64_t kPageBytes = static_cast<int64_t>(kPageSize) * kRowBytes;
constexpr int64_t kValuePageBytes = static_cast<int64_t>(kPageSize) * kValueRowBytes;

/// Byte offset of KV row `kv` (column 0) on page `page` of a KV head (of V
/// where Dv differs from D: value_row_bytes).
PAGEDC_DEVICE int64_t kv_row_bytes(int32_t page, int kv) {
  return page * kPageBytes + (kv & (kPageSize - 1)) * kRowBytes;
}
PAGEDC_DEVICE int64_t value_row_bytes(int32_t page, int kv) {
  return page * kValuePageBytes + (kv & (kPageSize - 1)) * kValueRowBytes;
}

/// 16 bytes of a row (8 elements): what one thread moves per instruction
/// when a tile goes between shared and global memory with plain loads and
/// stores (LDS.128 / STG.128; both addresses 16-byte aligned).
struct alignas(16) Chunk16 {
  uint32_t word[4];
};
PAGEDC_DEVICE void copy_chunk16(void *to, const void *from) {
#ifdef PAGEDC_EMULATOR
  // One 16-byte access each way for the emulator's counters, as on the GPU
  // (the host compiler copies the struct as two 8-byte halves).
  typedef uint32_t Vector16 __attribute__((vector_size(16)));
  *static_cast<Vector16 *>(to) = *static_cast<const Vector16 *>(from);
#else
  *static_cast<Chunk16 *>(to) = *static_cast<const Chunk16 *>(from);
#endif
}

/// The mma.sync kernels' tile layout: rows of kTileRowBytes, chunks swizzled.
struct SwizzledRows {
  PAGEDC_DEVICE uint32_t operator()(int row, int chunk) const { return tile_offset(row, chunk); }
};

/// Bytes of one 64-element atom column of a tile of `rows` rows.
__host__ __device__ constexpr uint32_t atom_bytes(int rows) { return static_cast<uint32_t>(rows) * 128; }

/// Byte offset of chunk `chunk` (16 bytes) of row `row` in a tile of `rows`
/// rows laid out in 128-byte swizzled atoms: kTileHeadDim / 64 atom columns
/// of `rows` rows x 128 bytes, chunk c of row r at chunk c ^ (r % 8) of its
/// row. This is where a tensor map's box with the 128-byte swizzle puts its rows (the
/// tile 1,024-byte aligned), and what the wgmma descriptors describe; for
/// ldmatrix it is as free of bank conflicts as tile_offset.
PAGEDC_DEVICE uint32_t atom_offset(int rows, int row, int chunk) {
  return (chunk >> 3) * atom_bytes(rows) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

/// Tiles of kRows rows in 128-byte swizzled atoms (atom_offset): the
/// warpgroup prefill's and the decode kernel's K/V tiles.
template <int kRows> struct AtomTile {
  PAGEDC_DEVICE uint32_t operator()(int row, int chunk) const {
    return atom_offset(kRows, row, chunk);
  }
};

/// Copies KV rows [kv_begin, kv_begin + kRows) of one KV head into K and V
/// tiles laid out by `Layout` (offset of a row's chunk), translating each
/// logical row to its page once for both tensors (`page_of(kv)`: the
/// kernels pass StagedPages). All three kernels' cp.async copies. Built
/// once per thread before a tile loop: the two head bases, with the
/// thread's chunk added, are opaque to the optimizer, so they stay in
/// registers instead of being rebuilt from the cache pointers and strides
/// on every tile (about 30 instructions a tile in the decode kernel) or
/// folded into each row's offset (four instructions per tensor and row).
/// Rows at or past kv_len, rows whose bit in `keep_rows` is clear and, with
/// kCheckPage, rows whose page is negative (the warpgroup producer's
/// staged -1) are zero-filled and never read from memory. A row is copied by
/// kThreadsPerRow threads, each taking kCopiesPerRow of its chunks, half a
/// row apart (two where the tile has rows enough for every thread: a row's
/// validity test, page lookup and offset then serve four copies, K and V,
/// instead of two); thread `thread` starts at row thread / kThreadsPerRow
/// and takes every kRowStep-th row. K and V share the row's offset
/// (kv_row_bytes); with kPackedBatch each tensor's row offset comes from
/// its own page and slot strides (the second constructor).
template <int kRows, int kThreads, typename Layout = SwizzledRows> struct KvTileCopier {
  /// A row's chunks rounded up to a power of two, so that threads divide
  /// into whole rows; a thread whose chunk is past the row's data (head dims
  /// that are not powers of two) copies nothing for it.
  static constexpr int kRowChunks =
      kChunksPerRow > kValueChunksPerRow ? kChunksPerRow : kValueChunksPerRow;
  static constexpr int kCopyChunks = kRowChunks <= 4    ? 4
                                     : kRowChunks <= 8  ? 8
                                     : kRowChunks <= 16 ? 16
                                                        : 32;
  static constexpr int kCopiesPerRow = kRows % (2 * kThreads / kCopyChunks) == 0 ? 2 : 1;
  static constexpr int kThreadsPerRow = kCopyChunks / kCopiesPerRow;
  static constexpr int kRowStep = kThreads / kThreadsPerRow;
  static_assert(kThreads % kThreadsPerRow == 0 && kRows % kRowStep == 0,
                "uneven KV tile load");
  const char *k_bytes;
  const char *v_bytes;
  int chunk, first_row;
  /// kPackedBatch: bytes between pages and between slots of K and of V.
  int64_t k_page_bytes = 0, k_slot_bytes = 0, v_page_bytes = 0, v_slot_bytes = 0;

  PAGEDC_DEVICE KvTileCopier(const Element *k_head,  // [pages, page_size, D]
                             const Element *v_head,  // [pages, page_size, D]
                             int thread)
      : chunk(thread % kThreadsPerRow), first_row(thread / kThreadsPerRow) {
    k_bytes = reinterpret_cast<const char *>(k_head) + chunk * 16;
    v_bytes = reinterpret_cast<const char *>(v_head) + chunk * 16;
    opaque(k_bytes);
    opaque(v_bytes);
  }
  /// kPackedBatch: pages and slots `k_stride[1]`, `k_stride[2]` (and V's)
  /// elements apart, each a multiple of 8 (16-byte copies; the host checks).
  PAGEDC_DEVICE KvTileCopier(const Element *k_head, // [pages, page_size, D], strided
                             const Element *v_head, // [pages, page_size, D], strided
                             int thread, const int64_t (&k_stride)[3],
                             const int64_t (&v_stride)[3])
      : KvTileCopier(k_head, v_head, thread) {
    k_page_bytes = k_stride[1] * static_cast<int64_t>(sizeof(Element));
    k_slot_bytes = k_stride[2] * static_cast<int64_t>(sizeof(Element));
    v_page_bytes = v_stride[1] * static_cast<int64_t>(sizeof(Element));
    v_slot_bytes = v_stride[2] * static_cast<int64_t>(sizeof(Element));
  }

  template <bool kCheckPage = false, typename PageOf>
  PAGEDC_DEVICE void operator()(uint32_t k_tile, uint32_t v_tile, PageOf page_of, int kv_begin,
                                int kv_len,
                                uint64_t keep_rows = ~static_cast<uint64_t>(0)) const {
    // Unrolled by two: fully unrolled, ptxas holds every row's page and
    // both 64-bit sources at once, which spilled 300 bytes in the D 256
    // prefill kernel (bench/README.md).
#pragma unroll 2
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const int row = first_row + i * kRowStep;
      const int kv = kv_begin + row;
      bool valid = kv < kv_len;
      if constexpr (kRows <= 64) // (a bit per row; longer tiles keep every row)
        valid = valid && ((keep_rows >> row) & 1);
      int32_t page = 0;
      if constexpr (kCheckPage) {
        page = page_of(kv);
        valid = valid && page >= 0;
      } else if (valid) {
        page = page_of(kv);
      }
      const int64_t row_bytes = valid ? kv_row_bytes(page, kv) : 0;
      const char *k_source = k_bytes + row_bytes;
      const char *v_source = v_bytes + row_bytes;
      if constexpr (kValueHeadDim != kHeadDim)
        v_source = v_bytes + (valid ? value_row_bytes(page, kv) : 0);
      if constexpr (kPackedBatch) {
        // Strided pages: each tensor's row from its own strides (the
        // compact offset above is then dead code).
        const int64_t slot = kv & (kPageSize - 1);
        k_source = k_bytes + (valid ? page * k_page_bytes + slot * k_slot_bytes : 0);
        v_source = v_bytes + (valid ? page * v_page_bytes + slot * v_slot_bytes : 0);
      }
#pragma unroll
      for (int copy = 0; copy < kCopiesPerRow; ++copy) {
        const int at = copy * kThreadsPerRow;
        const uint32_t offset = Layout()(row, chunk + at);
        if (kCopyChunks == kChunksPerRow || chunk + at < kChunksPerRow)
          cp_async_16(k_tile + offset, k_source + 16 * at, valid ? 16 : 0);
        if (kCopyChunks == kValueChunksPerRow || chunk + at < kValueChunksPerRow)
          cp_async_16(v_tile + offset, v_source + 16 * at, valid ? 16 : 0);
      }
    }
  }
};

/// A-operand fragments of 16 query rows for k-step `k_step` (16 columns).
PAGEDC_DEVICE void load_query_fragment(uint32_t (&fragment)[4], uint32_t tile,
                                       int row_base, int k_step, int lane) {
  int row = row_base + (lane & 15);
  int chunk = k_step * 2 + (lane >> 4);
  ldmatrix_x4(fragment, tile + tile_offset(row, chunk));
}

//===--- Warp tile math --------------------------------------------------===//

/// One k-step (16 columns of D) of warp_scores: each K fragment is read
/// from shared memory once and used by all kMTiles 16-row query tiles of
/// the warp (32 rows per warp halve the ldmatrix bytes per MMA).
template <int kMTiles, int kNTiles, typename Layout = SwizzledRows>
PAGEDC_DEVICE void warp_scores_step(float (&scores)[kMTiles][kNTiles][4],
                                    const uint32_t (&a)[kMTiles][4],
                                    uint32_t k_tile, int col_base, int k_step,
                                    int lane) {
#pragma unroll
  for (int pair = 0; pair < kNTiles / 2; ++pair) {
    uint32_t b[4];
    int row = col_base + pair * 16 + (lane & 7) + ((lane >> 4) << 3);
    int chunk = k_step * 2 + ((lane >> 3) & 1);
    ldmatrix_x4(b, k_tile + Layout()(row, chunk));
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      mma_16816(scores[m][2 * pair], a[m], b[0], b[1]);
      mma_16816(scores[m][2 * pair + 1], a[m], b[2], b[3]);
    }
  }
}

/// scores[m][16 x 8*kNTiles] = Q[rows q_row_base + 16m .., D] * K[kv rows
/// col_base.., D]^T for the warp's kMTiles query tiles. Query fragments come
/// from registers or, with kQInRegisters false, from the query tile.
template <int kMTiles, int kNTiles, bool kQInRegisters, typename Layout = SwizzledRows>
PAGEDC_DEVICE void warp_scores_rows(
    float (&scores)[kMTiles][kNTiles][4],
    const uint32_t (&q_regs)[kMTiles][kQInRegisters ? kHeadDim / 16 : 1][4],
    uint32_t q_tile, int q_row_base, uint32_t k_tile, int col_base, int lane) {
  static_assert(kNTiles % 2 == 0, "score tiles come in pairs");
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        scores[m][j][e] = 0.0f;
  // Q from registers: fully unrolled (the fragments are indexed by k_step).
  // Q from shared memory: unrolled by two only, which keeps ptxas from
  // hoisting every K fragment of the tile (0 spills at D = 128).
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int k_step = 0; k_step < kHeadDim / 16; ++k_step) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          a[m][i] = q_regs[m][k_step][i];
      warp_scores_step<kMTiles, kNTiles, Layout>(scores, a, k_tile, col_base, k_step,
                                         lane);
    }
  } else {
#pragma unroll 2
    for (int k_step = 0; k_step < kHeadDim / 16; ++k_step) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
        load_query_fragment(a[m], q_tile, q_row_base + 16 * m, k_step, lane);
      warp_scores_step<kMTiles, kNTiles, Layout>(scores, a, k_tile, col_base, k_step,
                                         lane);
    }
  }
}

/// The single-tile form (16 query rows per warp), used by decode.
template <int kNTiles, bool kQInRegisters, typename Layout = SwizzledRows>
PAGEDC_DEVICE void warp_scores(float (&scores)[kNTiles][4],
                               const uint32_t (&q_regs)[kQInRegisters ? kHeadDim / 16 : 1][4],
                               uint32_t q_tile, int q_row_base,
                               uint32_t k_tile, int col_base, int lane) {
  using Scores = float[1][kNTiles][4];
  using QRegs = const uint32_t[1][kQInRegisters ? kHeadDim / 16 : 1][4];
  warp_scores_rows<1, kNTiles, kQInRegisters, Layout>(
      reinterpret_cast<Scores &>(scores), reinterpret_cast<QRegs &>(q_regs),
      q_tile, q_row_base, k_tile, col_base, lane);
}

/// out[m][16 x Dv] += P[m][16 x 8*kNTiles] * V[kv rows col_base.., Dv] for the
/// warp's kMTiles query tiles; P is the probability tile in the accumulator
/// layout of warp_scores_rows. Each V fragment is read once for all tiles.
template <int kMTiles, int kNTiles, typename Layout = SwizzledRows>
PAGEDC_DEVICE void warp_accumulate_rows(float (&out)[kMTiles][kValueHeadDim / 8][4],
                                        const float (&probs)[kMTiles][kNTiles][4],
                                        uint32_t v_tile, int col_base,
                                        int lane) {
#pragma unroll
  for (int k_step = 0; k_step < kNTiles / 2; ++k_step) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      a[m][0] = pack_pair(probs[m][2 * k_step][0], probs[m][2 * k_step][1]);
      a[m][1] = pack_pair(probs[m][2 * k_step][2], probs[m][2 * k_step][3]);
      a[m][2] = pack_pair(probs[m][2 * k_step + 1][0], probs[m][2 * k_step + 1][1]);
      a[m][3] = pack_pair(probs[m][2 * k_step + 1][2], probs[m][2 * k_step + 1][3]);
    }
    int row = col_base + k_step * 16 + (lane & 15);
#pragma unroll
    for (int pair = 0; pair < kValueHeadDim / 16; ++pair) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_tile + Layout()(row, pair * 2 + (lane >> 4)));
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
        mma_16816(out[m][2 * pair], a[m], b[0], b[1]);
        mma_16816(out[m][2 * pair + 1], a[m], b[2], b[3]);
      }
    }
  }
}

/// The single-tile form (16 query rows per warp), used by decode.
template <int kNTiles, typename Layout = SwizzledRows>
PAGEDC_DEVICE void warp_accumulate(float (&out)[kValueHeadDim / 8][4],
                                   const float (&probs)[kNTiles][4],
                                   uint32_t v_tile, int col_base, int lane) {
  using Out = float[1][kValueHeadDim / 8][4];
  using Probs = const float[1][kNTiles][4];
  warp_accumulate_rows<1, kNTiles, Layout>(reinterpret_cast<Out &>(out),
                                   reinterpret_cast<Probs &>(probs), v_tile,
                                   col_base, lane);
}

/// Online-softmax state of the two rows (lane / 4 and lane / 4 + 8 of the
/// warp's 16) a thread holds. `max` is in the log2 domain; `sum` is this
/// thread's partial sum (reduced over the quad only at the end).
struct RowState {
  float max[2];
  float sum[2];
};

/// A finished row's normalisation: `max` is its reference (log2 domain,
/// -inf when it saw no key) and `sum` the sum of 2^(s - max) over its keys.
/// `sink` (null: none) points at its query head's attention sink, a logit
/// in natural-log units: the sink is one more key with a zero value, so it
/// adds 2^(sink log2(e) - max) to the sum and nothing to the output. The
/// reference moves to the sink where that is larger, so that neither term
/// overflows: a sink far above every score gives weights near 0, and a
/// fully masked row (sum 0) gives out 0 and lse = sink. Returns the factor
/// that turns the row's output, accumulated against `max`, into the
/// normalised one, and sets `lse` (natural log; -inf for a fully masked row
/// without a sink). Called once per row after the KV loop, so a kernel
/// without sinks pays one predicated test there and nothing in the loop.
PAGEDC_DEVICE float finish_row(float max, float sum, const float *sink, float &lse) {
  float base = max;
  float factor = 1.0f;
  if (sink != nullptr) {
    const float sink_log2 = *sink * kLog2e;
    // A sink of -inf on a fully masked row: subtract 0 (exp2 of -inf is 0,
    // of NaN is not).
    const float top = fmaxf(max, sink_log2);
    base = top == -infinity() ? 0.0f : top;
    factor = exp2_approx(max - base);
    sum = sum * factor + exp2_approx(sink_log2 - base);
  }
  lse = sum > 0.0f ? (base + log2f(sum)) * kLn2 : -infinity();
  return sum > 0.0f ? factor / sum : 0.0f;
}

/// What a prefill CTA computes: query rows [row_begin, row_begin +
/// row_count) of query head h of sequence b. The tiles are numbered
/// heaviest first: tile x (a CTA's block x, or one of a persistent CTA's,
/// prefill_round_tile) is query head x % heads_q, then batch, then the
/// query tiles from the last (under a causal mask the tile with the most
/// keys) to the first, so the short tiles fill the tail of the launch.
struct PrefillTile {
  int h, b, row_begin, row_count, kv_head, kv_len, q_offset;
};
template <int kRows>
PAGEDC_DEVICE PrefillTile prefill_tile(const PagedcAttentionKernelArgs &args, int index) {
  PrefillTile tile;
  const int q_tiles = (args.q_len + kRows - 1) / kRows;
  tile.h = index % args.heads_q;
  const int rest = index / args.heads_q;
  tile.b = rest % args.batch;
  tile.row_begin = (q_tiles - 1 - rest / args.batch) * kRows;
  tile.row_count = imin(kRows, args.q_len - tile.row_begin);
  tile.kv_head = tile.h / (args.heads_q / args.heads_kv);
  tile.kv_len = args.kv_len[tile.b];
  tile.q_offset = args.q_offset ? args.q_offset[tile.b] : 0;
  return tile;
}
template <int kRows>
PAGEDC_DEVICE PrefillTile prefill_tile(const PagedcAttentionKernelArgs &args) {
  return prefill_tile<kRows>(args, static_cast<int>(blockIdx.x));
}

/// Ints of a packed batch's prefill tile in work_tiles: sequence, first
/// row, first key, end of keys (the host writes them: KernelArgs.h).
constexpr int kPackedTileInts = PAGEDC_PACKED_PREFILL_TILE_INTS;

/// A packed batch's prefill tile (kPackedBatch): CTA x computes query head
/// x % heads_q of work tile x / heads_q, whose sequence b, first row and
/// keys [first key, end) the plan wrote to work_tiles (heaviest first; the
/// keys are the sequence's [kv_start, kv_len), or fewer where the mask's
/// block classifier proved the rest masked for the tile's rows: keys past
/// the end are neither read nor kept, as past kv_len). Sequence b's
/// q_len_b = q_start[b + 1] - q_start[b] new tokens are the packed rows
/// from q_start[b]: `q_len` gets q_len_b and `first_row` q_start[b].
template <int kRows>
PAGEDC_DEVICE PrefillTile packed_prefill_tile(const PagedcAttentionKernelArgs &args, int &q_len,
                                              int &first_row) {
  PrefillTile tile;
  const int index = static_cast<int>(blockIdx.x);
  tile.h = index % args.heads_q;
  const int *const work = args.work_tiles + kPackedTileInts * (index / args.heads_q);
  tile.b = work[0];
  tile.row_begin = work[1];
  first_row = args.q_start[tile.b];
  q_len = args.q_start[tile.b + 1] - first_row;
  tile.row_count = imin(kRows, q_len - tile.row_begin);
  tile.kv_head = tile.h / (args.heads_q / args.heads_kv);
  tile.kv_len = imin(args.kv_len[tile.b], work[3]);
  tile.q_offset = args.q_offset ? args.q_offset[tile.b] : 0;
  return tile;
}

/// Query tiles of a prefill call: ceil(q_len / kRows) x heads_q x batch
/// (the host keeps it under 2^31).
template <int kRows> PAGEDC_DEVICE int prefill_tile_count(const PagedcAttentionKernelArgs &args) {
  return (args.q_len + kRows - 1) / kRows * args.heads_q * args.batch;
}

/// The query tile a prefill CTA takes in its round `round` (0, 1, ...):
/// with a grid of one CTA per tile, its own in round 0 and none after (the
/// index is past the last tile); with a smaller grid (persistent CTAs),
/// rounds of gridDim.x tiles in prefill_tile's heaviest-first order,
/// snaking (odd rounds hand them out from the last CTA down) so that each
/// CTA's heavy and light tiles even out. Past the last tile: >= count.
PAGEDC_DEVICE int64_t prefill_round_tile(int round) {
  const int64_t grid = gridDim.x, block = blockIdx.x;
  return round * grid + ((round & 1) ? grid - 1 - block : block);
}

/// The query tile a persistent CTA takes in round `round` when the launch
/// gives a work counter (PagedcWgmmaPrefillArgs::tile_counter): its own
/// index in round 0, then gridDim.x + the counter's count, one atomicAdd a
/// round, so the tiles still go out in prefill_tile's heaviest-first order
/// but to whichever CTA is free first. Past the last tile: `count`. Every
/// CTA with a tile takes exactly one value past the last, so the launch
/// takes `count` values in all and the one that takes count - 1 is the
/// last: it sets the counter back to zero for the next launch.
PAGEDC_DEVICE int next_counted_tile(int32_t *counter, int round, int count) {
  if (round == 0)
    return static_cast<int>(imin(static_cast<int>(blockIdx.x), count));
  const int taken = atomicAdd(counter, 1);
  if (taken == count - 1)
    atomicAdd(counter, -count);
  return static_cast<int>(
      imin64(static_cast<int64_t>(gridDim.x) + taken, static_cast<int64_t>(count)));
}

/// A fresh softmax state (nothing seen) and output accumulator of a
/// thread's two rows.
PAGEDC_DEVICE void reset_rows(RowState &state, float (&out)[kValueHeadDim / 8][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state.max[half] = -infinity();
    state.sum[half] = 0.0f;
  }
#pragma unroll
  for (int d = 0; d < kValueHeadDim / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      out[d][e] = 0.0f;
}

/// Whether the launch binds a block mask. A kernel built for launches
/// without one (pagedc_config::kMayBindBlockMask false) never does, so the
/// compiler drops every block-mask path, a large part of NVVM's and
/// ptxas's work. The host refuses such a kernel a launch with a mask.
PAGEDC_DEVICE bool binds_block_mask(const PagedcAttentionKernelArgs &args) {
  return pagedc_config::kMayBindBlockMask && args.kv_num_blocks != nullptr;
}

/// The KV tiles of kTile rows a prefill CTA of (b, h) visits in one pass:
/// entry `list` of its block-mask row's lists (partial blocks, then full
/// blocks) and tile `sub` of that block; without a block mask, tile `list`
/// of [0, kv_len). Counters rather than pointers and divisions: at 32 rows
/// per warp every register counts.
template <int kTile> struct KvVisits {
  int64_t list_offset = 0;
  int partial_count = 0, list_count = 0, tiles_per_block = 1;

  /// Sets up pass `pass` (the q block of the mask row); false when the mask
  /// has no such row (the mask may start at first_q_block; the host checks
  /// that it covers every row of the call).
  PAGEDC_DEVICE bool start(const PagedcAttentionKernelArgs &args, int b, int h, int pass,
                           int kv_len) {
    if (!binds_block_mask(args)) {
      partial_count = list_count = (kv_len + kTile - 1) / kTile;
      return true;
    }
    const int mask_row = pass - args.first_q_block;
    if (mask_row < 0 || mask_row >= args.num_q_blocks)
      return false;
    const int64_t mask_row_index =
        (static_cast<int64_t>(args.mask_batch == 1 ? 0 : b) * args.mask_heads +
         (args.mask_heads == 1 ? 0 : h)) *
            args.num_q_blocks +
        mask_row;
    list_offset = mask_row_index * args.max_kv_blocks;
    // The first block of each list, read beside the counts (loads of one
    // basic block, none waiting for another), so that the first visit's kv
    // (seek_first) waits for one round trip to memory instead of a count's
    // and then an index's. A row with no block of a list still has its slot
    // 0 when max_kv_blocks >= 1; what is read there is then not used.
    // Kernels that never call seek_first leave the loads dead.
    const bool has_slot = args.max_kv_blocks > 0;
    first_blocks[0] = has_slot ? args.kv_indices[list_offset] : 0;
    first_blocks[1] = has_slot && args.full_kv_indices ? args.full_kv_indices[list_offset] : 0;
    partial_count = args.kv_num_blocks[mask_row_index];
    list_count = partial_count +
                 (args.full_kv_num_blocks ? args.full_kv_num_blocks[mask_row_index] : 0);
    tiles_per_block = args.kv_block_size / kTile;
    return true;
  }
  /// Logical kv of the first key of visit (list, sub).
  PAGEDC_DEVICE int kv_of(const PagedcAttentionKernelArgs &args, int list, int sub) const {
    if (!binds_block_mask(args))
      return list * kTile;
    const int block = list < partial_count
                          ? args.kv_indices[list_offset + list]
                          : args.full_kv_indices[list_offset + list - partial_count];
    return block * args.kv_block_size + sub * kTile;
  }
  /// Moves (list, sub) to the first visit at or after it that holds keys
  /// below kv_len (past that, the block's later tiles hold none either);
  /// returns its kv (or list == list_count).
  PAGEDC_DEVICE int seek(const PagedcAttentionKernelArgs &args, int kv_len, int &list,
                         int &sub) const {
    for (; list < list_count; ++list, sub = 0) {
      const int kv = kv_of(args, list, sub);
      if (kv < kv_len)
        return kv;
    }
    return 0;
  }
  /// The visit after (list, sub), before seeking.
  PAGEDC_DEVICE void advance(int &list, int &sub) const {
    if (++sub == tiles_per_block) {
      sub = 0;
      ++list;
    }
  }
  PAGEDC_DEVICE bool is_full(int list) const { return list >= partial_count; }
  /// seek from the first visit (list = sub = 0), with the first blocks
  /// start() read.
  PAGEDC_DEVICE int seek_first(const PagedcAttentionKernelArgs &args, int kv_len, int &list,
                               int &sub) const {
    list = sub = 0;
    if (!binds_block_mask(args) || list_count == 0)
      return seek(args, kv_len, list, sub);
    const int kv = (partial_count > 0 ? first_blocks[0] : first_blocks[1]) * args.kv_block_size;
    if (kv < kv_len)
      return kv;
    list = 1;
    return seek(args, kv_len, list, sub);
  }
  int first_blocks[2] = {0, 0};
};

/// Row `half` of a thread's tile of scores turned into probabilities
/// 2^(s factor - base) (masked -inf: 0); returns their sum. softmax_tile's
/// and softmax_tile_fast's loop.
template <int kNTiles>
PAGEDC_DEVICE float exponentiate_row(float (&scores)[kNTiles][4], int half, float factor,
                                     float base) {
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    scores[j][2 * half] = exp2_approx(fmaf(scores[j][2 * half], factor, -base));
    scores[j][2 * half + 1] = exp2_approx(fmaf(scores[j][2 * half + 1], factor, -base));
  }
  float sum = scores[0][2 * half] + scores[0][2 * half + 1];
#pragma unroll
  for (int j = 1; j < kNTiles; ++j)
    sum += scores[j][2 * half] + scores[j][2 * half + 1];
  return sum;
}

/// Folds a tile of log2-domain scores (masked = -inf) into the state, turns
/// `scores` into probabilities, and gives each of the thread's two rows the
/// factor its output accumulator must be scaled by (rescale_rows).
///
/// `kHalves` (1 or 2): how many of the thread's two rows (lane / 4, then
/// lane / 4 + 8) can be real. With 1 (a decode CTA of at most 8 query rows)
/// the second row is padding: its probabilities are 0 and its factor 1,
/// with no work spent on it.
///
/// `factor` (> 0) multiplies the scores first (apply_mods with
/// scale_in_softmax left the scale·log2(e) out: the softmax then spends an
/// FFMA where a multiply and a subtraction were); 1 when they are scaled.
/// How far (log2 units) a row's scores may pass its reference max before
/// softmax_tile moves it: the probabilities stay at most 2^8 = 256 (f32
/// sums; f16 / bf16 P operands hold that with their full precision), and
/// on random inputs the reference settles after the first tile, so the
/// output's rescale (D / 4 multiplies per row and the warp's vote) all but
/// disappears from the KV-tile loop.
constexpr float kMaxHeadroom = 8.0f;

template <int kNTiles, int kHalves = 2>
PAGEDC_DEVICE void softmax_tile(RowState &state, float (&scores)[kNTiles][4],
                                float (&rescale)[2], float factor = 1.0f) {
  static_assert(kHalves == 1 || kHalves == 2, "a thread holds one or two rows");
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (half >= kHalves) {
      rescale[half] = 1.0f;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j)
        scores[j][2 * half] = scores[j][2 * half + 1] = 0.0f;
      continue;
    }
    // Started from the first pair, not from -inf and 0: fmaxf(-inf, x) and
    // 0 + x are no identities to the compiler (NaN, -0), so those cost an
    // instruction per row and tile.
    float tile_max = fmaxf(scores[0][2 * half], scores[0][2 * half + 1]);
#pragma unroll
    for (int j = 1; j < kNTiles; ++j)
      tile_max = fmaxf(tile_max, fmaxf(scores[j][2 * half], scores[j][2 * half + 1]));
    tile_max = quad_max(tile_max) * factor;
    // The reference max moves only when the tile's max passes it by more
    // than kMaxHeadroom (log2 units): below that the row keeps it, so its
    // factor is exactly 1 and the output needs no rescale; probabilities
    // are then at most 2^kMaxHeadroom, and sum, output and lse stay
    // consistent (they share the reference).
    float new_max = tile_max - state.max[half] > kMaxHeadroom ? tile_max : state.max[half];
    // A row with nothing visible yet keeps max = -inf; subtract 0 instead so
    // that exp2 gives 0 rather than NaN.
    float base = new_max == -infinity() ? 0.0f : new_max;
    rescale[half] = exp2_approx(state.max[half] - base);
    state.max[half] = new_max;
    state.sum[half] = state.sum[half] * rescale[half] +
                      exponentiate_row<kNTiles>(scores, half, factor, base);
  }
}

/// How large a thread's partial row sum of one tile may be for the tile to
/// stand as softmax_tile_fast left it: no probability above it then, which
/// f16 (65,504 at most) and bf16 P operands and the f32 sums and output
/// hold with room to spare.
constexpr float kFastSumLimit = 32768.0f;

/// The softmax of a tile without the row maximum, for rows whose reference
/// (state.max) is already finite: probabilities 2^(s factor - reference)
/// at once (an FFMA, an ex2 and an add per score; no per-tile maximum, no
/// quad shuffles, no headroom test), and the thread's partial sum of each
/// row in `tile_sum`, which is not folded into the state yet. The caller
/// votes on the sums (kFastSumLimit): when every thread of the warp passes,
/// the tile stands (sums added, O's factor 1); otherwise settle_fast_tile,
/// or for a probability that came out infinite (a score at least 128 log2
/// units above its reference) the tile's scores are recomputed and taken
/// by softmax_tile.
template <int kNTiles>
PAGEDC_DEVICE void softmax_tile_fast(const RowState &state, float (&scores)[kNTiles][4],
                                     float (&tile_sum)[2], float factor) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
    tile_sum[half] = exponentiate_row<kNTiles>(scores, half, factor, state.max[half]);
}

/// A tile of softmax_tile_fast that some thread of the warp voted against
/// (finite probabilities): each row whose largest probability reached 2^8
/// moves its reference up by that probability's binary exponent e, exactly
/// (the tile's probabilities and sum and the factor of the row's earlier sum
/// and O are 2^-e: no ex2 again), and the tile's sums are folded in. No
/// probability is then above 2^8, as after softmax_tile.
template <int kNTiles>
PAGEDC_DEVICE void settle_fast_tile(RowState &state, float (&scores)[kNTiles][4],
                                    const float (&tile_sum)[2], float (&rescale)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float largest = fmaxf(scores[0][2 * half], scores[0][2 * half + 1]);
#pragma unroll
    for (int j = 1; j < kNTiles; ++j)
      largest = fmaxf(largest, fmaxf(scores[j][2 * half], scores[j][2 * half + 1]));
    largest = quad_max(largest);
    // (At most 126: 2^-e stays a normal float.)
    const int exponent =
        largest >= 256.0f ? imin((__float_as_int(largest) >> 23) - 127, 126) : 0;
    const float factor = __int_as_float((127 - exponent) << 23);
    rescale[half] = factor;
    state.max[half] += static_cast<float>(exponent);
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      scores[j][2 * half] *= factor;
      scores[j][2 * half + 1] *= factor;
    }
    state.sum[half] = (state.sum[half] + tile_sum[half]) * factor;
  }
}

template <int kHalves = 2>
PAGEDC_DEVICE void rescale_rows(float (&out)[kValueHeadDim / 8][4], const float (&rescale)[2]) {
#pragma unroll
  for (int half = 0; half < kHalves; ++half)
#pragma unroll
    for (int d = 0; d < kValueHeadDim / 8; ++d) {
      out[d][2 * half] *= rescale[half];
      out[d][2 * half + 1] *= rescale[half];
    }
}

/// softmax_tile, then the output accumulator's rescale. Once the row maxima
/// settle, every row's factor is exactly 1 (ex2 of 0): when that holds for
/// the whole warp the D / 4 multiplies per row are skipped (exact either
/// way; the vote is warp-uniform, so the branch does not diverge).
/// Returns whether it rescaled.
template <int kNTiles, int kHalves = 2>
PAGEDC_DEVICE bool online_softmax(RowState &state, float (&scores)[kNTiles][4],
                                  float (&out)[kValueHeadDim / 8][4]) {
  float rescale[2];
  softmax_tile<kNTiles, kHalves>(state, scores, rescale);
  if (__ballot_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
    rescale_rows<kHalves>(out, rescale);
    return true;
  }
  return false;
}

/// Emulator only (nothing on a GPU): counts a warp's KV-tile visit by path
/// and, per 16-row group, whether the tile rescaled its output, for the
/// performance model's issue term (docs/emulator.md). Called by every lane
/// with warp-uniform arguments; lane 0 counts.
PAGEDC_DEVICE void tally_tile(bool all_kept, int lane) {
#ifdef PAGEDC_EMULATOR
  if (lane == 0)
    pagedc_emu::tally(all_kept ? PAGEDC_EMU_TALLY_KEPT_TILE : PAGEDC_EMU_TALLY_MASKED_TILE);
#else
  (void)all_kept;
  (void)lane;
#endif
}
PAGEDC_DEVICE void tally_rescale(bool rescaled, int lane) {
#ifdef PAGEDC_EMULATOR
  if (lane == 0 && rescaled)
    pagedc_emu::tally(PAGEDC_EMU_TALLY_RESCALED_ROWS);
#else
  (void)rescaled;
  (void)lane;
#endif
}

/// Applies scale, score mod, mask mod, kv_len and row limits to one warp's
/// raw q.k tile, leaving log2-domain logits (-inf where masked).
/// `kv_base` is the logical kv of the warp's first column; `visible[half]`
/// says whether the thread's row may see this tile at all; `check_mask`
/// is false for full blocks. `all_kept` (the same for the whole warp) says
/// that every element is kept (a full block, every row visible, every key
/// below kv_len): then only the scale and the score mod are applied, with
/// no per-element tests. `scale_in_softmax` (no score mod, scale > 0):
/// the scale is left to softmax_tile's factor. `kHalves` 1: the thread's
/// second row is padding (softmax_tile), left as it is. `column_xor`: column
/// c holds the key kv_base + (c ^ column_xor) (a multiple of 8: whole
/// 8-column tiles move; a tile copied as a descending page run).
/// `kKeyColumns`: a mask's key-only values (mask_col) once per key for both
/// rows, else the whole mask per element. A warp of several 16-row tiles
/// calls this once per tile, and the compiler keeps a key's values live from
/// one call to the next: at 32 rows a warp (sm_80, head dim 128) the
/// document masks then spill, even with their rows recomputed per KV tile,
/// and fall back to the 64x64 tile, so those kernels evaluate the mask per
/// element. `kStagedColumns`: `staged_columns` (shared memory) holds the
/// tile's key-only values by key offset from kv_base, which the caller's
/// threads wrote together, one key each; they are read there instead of
/// each thread reading the buffers at its 32 keys, whose predicated global
/// loads and 64-bit index arithmetic were most of a document mask's
/// partial tile.
template <int kNTiles, int kHalves = 2, bool kKeyColumns = true, bool kStagedColumns = false>
PAGEDC_DEVICE void apply_mods(float (&scores)[kNTiles][4],
                              const pagedc_mods::Params &params,
                              const pagedc_mods::MaskRow (&mask_rows)[2],
                              const pagedc_mods::ScoreRow (&score_rows)[2],
                              const int (&b)[2], const int (&h)[2],
                              const int (&q)[2], const bool (&visible)[2],
                              const bool (&check_mask)[2], int kv_base,
                              int kv_len, float scale, int lane,
                              bool all_kept = false, bool scale_in_softmax = false,
                              int column_xor = 0,
                              const pagedc_mods::MaskCol *staged_columns = nullptr) {
  // The key of the thread's column `column` (0, 1) of 8-column tile j.
  auto key_of = [&](int j, int column) {
    return kv_base + ((j * 8) ^ column_xor) + 2 * (lane & 3) + column;
  };
  if (all_kept) {
    if (!pagedc_mods::kHasScore && scale_in_softmax)
      return;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2 * kHalves; ++e) {
        if constexpr (pagedc_mods::kHasScore) {
          const int half = e >> 1;
          const int kv = key_of(j, e & 1);
          scores[j][e] = pagedc_mods::score(params, score_rows[half],
                                            scores[j][e] * scale, b[half],
                                            h[half], q[half], kv) *
                         kLog2e;
        } else {
          scores[j][e] *= scale * kLog2e;
        }
      }
    return;
  }
  // One expression per element, which ptxas turns into predicates: for a
  // pure mask (causal) two compares and a select - keep = kv < limit (a
  // row that may not see the tile has limit 0; kv >= 0) and the mask on a
  // partial block. Written as `if (keep && check) keep = mask(...)` it made
  // ptxas carry each keep as a 0 / -1 register (two SELs, a LOP3 and a
  // compare more per element): the warpgroup prefill's masked 128-key tile
  // took 1,011-1,051 instructions a warp, now 620-660 (bench/README.md).
  // The short circuit stays: evaluated for every element (& and |), a mask
  // that reads buffers (document_causal) had its loads hoisted and spilled.
  // A thread's rows share its keys: a mask's key-only values (mask_col, such
  // as document_id[kv]) are read once per key for both rows, and only where
  // some row tests the mask there.
  const int kv_limit[2] = {visible[0] ? kv_len : 0, visible[1] ? kv_len : 0};
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    pagedc_mods::MaskCol key_values[2] = {};
    // The branch lets a trip on which no row tests the mask skip the
    // column reads instead of issuing them predicated off.
    if constexpr (pagedc_mods::kHasMask && kKeyColumns) {
      if (check_mask[0] || (kHalves > 1 && check_mask[1])) {
#pragma unroll
        for (int column = 0; column < 2; ++column) {
          const int kv = key_of(j, column);
          if constexpr (kStagedColumns) {
            key_values[column] = staged_columns[kv - kv_base];
            continue;
          }
          bool tested = false;
#pragma unroll
          for (int half = 0; half < kHalves; ++half)
            tested = tested || (check_mask[half] && kv < kv_limit[half]);
          if (tested)
            key_values[column] = pagedc_mods::mask_col(params, kv);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 2 * kHalves; ++e) {
      int half = e >> 1;
      int kv = key_of(j, e & 1);
      bool keep = kv < kv_limit[half];
      if constexpr (pagedc_mods::kHasMask)
        keep = keep && (!check_mask[half] ||
                        (kKeyColumns ? pagedc_mods::mask_at(params, mask_rows[half],
                                                            key_values[e & 1], b[half], h[half],
                                                            q[half], kv)
                                     : pagedc_mods::mask(params, mask_rows[half], b[half],
                                                         h[half], q[half], kv)));
      float logit;
      if constexpr (pagedc_mods::kHasScore) {
        logit = keep ? pagedc_mods::score(params, score_rows[half],
                                          scores[j][e] * scale, b[half],
                                          h[half], q[half], kv) *
                           kLog2e
                     : 0.0f;
      } else {
        logit = scale_in_softmax ? scores[j][e] : scores[j][e] * (scale * kLog2e);
      }
      scores[j][e] = keep ? logit : -infinity();
    }
  }
}

/// Masks the keys of a warp's tile (apply_mods' columns from kv_base)
/// below kv_from: a packed batch's first tile of a key range [kv_start,
/// kv_len) that starts inside it (cascade suffixes).
template <int kNTiles, int kHalves = 2>
PAGEDC_DEVICE void mask_keys_below(float (&scores)[kNTiles][4], int kv_base, int kv_from,
                                   int lane) {
#pragma unroll
  for (int j = 0; j < kNTiles; ++j)
#pragma unroll
    for (int e = 0; e < 2 * kHalves; ++e)
      if (kv_base + j * 8 + 2 * (lane & 3) + (e & 1) < kv_from)
        scores[j][e] = -infinity();
}

#endif // PAGEDC_UNIT_DECODE_MERGE

} // namespace pagedc
