//===- PrefillWgmma.cuh - Paged flex attention on warpgroups (sm_90a) -*- CUDA -*-===//
//
// The Hopper prefill (KernelConfig::warpRows == 64): one CTA computes
// kBlockM query rows of one (batch, query head) — or, with a grid of fewer
// CTAs than query tiles (persistent CTAs), one such tile after another —
// with kBlockM / 64 consumer warpgroups of 64 rows each, fed by a producer
// warp:
//
//  - the producer warpgroup (warpgroup 0; it gives its registers away with
//    setmaxnreg) gathers the Q tile once and the K and V tiles of every
//    visited KV block from their pages with cp.async into a ring of
//    kPrefillStages stages (4 where shared memory allows), each thread
//    arriving on the stage's full mbarrier when its copies land
//    (cp.async.mbarrier.arrive.noinc), and waits on the stage's empty
//    mbarrier before reusing it; any page size from 1 to 1024. Each page a
//    tile touches is looked up once, by one thread, before the wait on the
//    empty barrier, and staged in shared memory for the copies
//    (gather_kv_stage). (A single producer warp waiting on a page-table
//    load per copy, with two stages, starves the consumers.) When the
//    launch binds tensor maps of the caches (the third parameter,
//    PagedcWgmmaPrefillArgs) and pages hold 16 rows or more, thread 0
//    copies each tile below kv_len with one cp.async.bulk.tensor per page
//    and 64 head dims instead (tma_kv_stage); the tile holding kv_len is
//    gathered, zero-filled past it.
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
// 8-bit float caches (kKvFloat8, Float8Tiles.cuh): the producer loads a
// tile's codes from global memory into its registers (a batch of rows at a
// time), converts them and stores the stage's 16-bit K and V tiles in the
// same swizzled layout, fences them for the async proxy and arrives on the
// stage's full mbarrier (convert_code_stage); the consumers' math is
// unchanged but for the KV head's K scale on the scores and V scale on the
// output rows (f32). No tensor maps for codes, and no shared memory beyond
// the 16-bit kernel's.
//
// Grid: as Prefill.cuh, or fewer CTAs taking the tiles from a work counter
// (next_counted_tile) or in fixed rounds (prefill_round_tile); block: (kBlockM / 64 + 1) * 128
// threads; dynamic shared memory: 1024 (alignment) + (kPrefillQBuffers kBlockM + 2 kPrefillStages
// kBlockN) * D * 2 + 128 (mbarriers): KernelConfig::sharedMemoryBytes.
//
//===----------------------------------------------------------------------===//

namespace pagedc {
constexpr int kBlockM = pagedc_config::kBlockM;
constexpr int kBlockN = pagedc_config::kBlockN;
constexpr int kConsumerGroups = kBlockM / 64;
constexpr int kConsumerThreads = kConsumerGroups * 128;
constexpr int kStages = pagedc_config::kPrefillStages;
static_assert(kStages >= 2 && kStages <= 4, "the ring has 2 to 4 stages");
/// Q tiles in shared memory: with 2, the producer of a persistent CTA
/// copies its next query tile's Q while the consumers still read the
/// current one (KernelConfig::prefillQBuffers).
constexpr int kQBuffers = pagedc_config::kPrefillQBuffers;
static_assert(kQBuffers == 1 || kQBuffers == 2, "one or two Q tiles");
constexpr int kPrefillThreads = kConsumerThreads + 128;
/// CTAs an SM the kernel is built for (KernelConfig::prefillCtasPerSm): 2
/// only with one consumer warpgroup, so that where CTAs are short one
/// CTA's copies, softmax and epilogue run under the other's products.
constexpr int kCtasPerSm = pagedc_config::kPrefillCtasPerSm;
static_assert(kCtasPerSm == 1 || (kCtasPerSm == 2 && kConsumerGroups == 1),
              "two CTAs an SM take one consumer warpgroup");
/// Shared memory a CTA may have: 227 KiB alone on the SM, else its share of
/// the SM's 228 KiB less the 1 KiB reserved per CTA (the host's
/// prefillSharedLimit, which sized the ring).
constexpr int kSharedLimit = pagedc_config::kPrefillSharedLimit;
/// Registers per thread after setmaxnreg: the producer warpgroup gives
/// registers to the consumers (one CTA per SM: the launch's 168 x 384
/// registers with two consumer warpgroups); one consumer warpgroup takes
/// all it can address (D 256 spilled 28-44 bytes at 240 with bias score
/// mods), which leaves the producer 96 (at 56 the tensor-map copies spilled
/// 24 bytes at D 256). (128-key tiles fit too since the gather reads its
/// page indices from shared memory: holding them in registers it spilled
/// 20-68 bytes at 56.) Two CTAs an SM halve the launch's registers to 128 a
/// thread: the consumers take 192, the producer 64.
constexpr int kProducerRegisters = kCtasPerSm == 2 ? 64 : kConsumerGroups == 1 ? 96 : 56;
/// Named barriers kTurnBarrier and kTurnBarrier + 1: the consumer
/// warpgroups' turns to issue wgmmas when they ping-pong (0 is
/// __syncthreads).
constexpr unsigned kTurnBarrier = 1;
constexpr int kConsumerRegisters = kCtasPerSm == 2 ? 192 : kConsumerGroups == 1 ? 256 : 224;
static_assert(128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <=
                  kPrefillThreads * (65536 / kCtasPerSm / kPrefillThreads / 8 * 8),
              "setmaxnreg asks for more registers than the launch gave the CTA");
static_assert(pagedc_config::kWarpRows == 64, "PrefillWgmma.cuh is the warpgroup design");
static_assert(kBlockM == 64 || kBlockM == 128, "kBlockM must be 64 or 128");
static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128,
              "wgmma tiles take kBlockN 32, 64 or 128");

/// The K/V tiles' layout: kBlockN rows in 128-byte swizzled atoms.
using AtomRows = AtomTile<kBlockN>;
/// The producer warpgroup's gather (KvTileCopier, its 128 threads).
using KvGather = KvTileCopier<kBlockN, 128, AtomRows>;

/// Pages a KV tile touches (tiles start at multiples of kBlockN).
constexpr int kTilePages = kTilePagesOf<kBlockN>;
static_assert(kTilePages <= 128, "one page index per producer thread");
/// Named barrier of the producer warpgroup's 128 threads (0 is
/// __syncthreads, 1 and 2 the consumers' turns).
constexpr unsigned kProducerBarrier = 3;
/// Named barriers kEpilogueBarrier + g: consumer warpgroup g's 128 threads
/// between writing its O rows into shared memory and storing them.
constexpr unsigned kEpilogueBarrier = 4;
// The wgmma tiles are 64-element swizzled atoms, and the PV wgmma's N is
// the head dim (wrappers for 64, 128 and 256): other head dims take the
// mma.sync prefill (KernelConfig::choosePrefillShapeFor).
static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256,
              "the warpgroup prefill takes head dims 64, 128 and 256");
static_assert(kValueHeadDim == kHeadDim, "the warpgroup prefill takes Dv = D");
// Dynamic shared memory (KernelConfig::sharedMemoryBytes), the page index
// buffers, the stages' run XORs, the Q buffers' tile slots and the
// producer's two round words must fit the share of a CTA (kSharedLimit).
constexpr int kSharedBeforeColumns =
    1024 + (kQBuffers * kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2 + 128 +
    2 * kTilePages * 4 + kStages * 4 + kQBuffers * 4 + 2 * 4;
static_assert(kSharedBeforeColumns <= kSharedLimit, "shared memory over a CTA's share");
/// The key-only mask values (pagedc_mods::MaskCol) of a partial tile,
/// staged in shared memory by each consumer warpgroup's 128 threads, one
/// key each, instead of each thread reading the buffers at its 32 keys
/// (apply_mods' kStagedColumns): for a mask that has such values, of at
/// most 16 bytes a key, in two buffers a warpgroup where they fit beside
/// the rest, else in one (three K/V stages at head dim 128 leave room for
/// one). (Read by each thread at its own keys, a predicated load and 64-bit
/// index arithmetic per key, they were most of a document mask's partial
/// tile.)
constexpr int kColumnBytes = static_cast<int>(sizeof(pagedc_mods::MaskCol));
/// The bytes of one buffer: kBlockN keys' values for each consumer warpgroup.
constexpr int kColumnBufferBytes = kConsumerGroups * kBlockN * kColumnBytes;
/// ptxas rounds a kernel's static shared memory up to 128 bytes.
constexpr int kColumnRoom = kSharedLimit - kSharedBeforeColumns - 128;
constexpr int kColumnBuffers = 2 * kColumnBufferBytes <= kColumnRoom ? 2
                               : kColumnBufferBytes <= kColumnRoom   ? 1
                                                                     : 0;
constexpr bool kStageColumns = pagedc_mods::kHasMask && !__is_empty(pagedc_mods::MaskCol) &&
                               kColumnBytes <= 16 && kColumnBuffers > 0;
/// Named barriers kColumnBarrier + g: consumer warpgroup g's 128 threads
/// between staging a partial tile's key-only values and reading them.
constexpr unsigned kColumnBarrier = 6;

/// The producer warpgroup's gather of the K and V rows [kv_begin, kv_begin
/// + kBlockN) (zeros past kv_len) into one stage, after waiting on the
/// stage's empty mbarrier. The tile's page indices are looked up once, one
/// per thread (thread i: page i of the tile, -1 past kv_len), before the
/// wait, and staged in `slots` (shared, kTilePages entries; the caller
/// alternates two buffers), so a copy reads its page from shared memory
/// instead of every thread holding page indices in registers. The copies
/// are `copy_kv`'s (KvTileCopier: two chunks of a row per thread where the
/// tile has rows enough), with rows of a negative page zero-filled.
PAGEDC_DEVICE void gather_kv_stage(const KvGather &copy_kv, uint32_t k_tile, uint32_t v_tile,
                                   const int32_t *page_row, int32_t *slots, int kv_begin,
                                   int kv_len, int thread, uint32_t empty_bar,
                                   unsigned empty_parity) {
  const int32_t lookup = tile_page<kBlockN>(page_row, kv_begin, kv_len, thread, -1);
  mbarrier_wait(empty_bar, empty_parity);
  if (thread < kTilePages)
    slots[thread] = lookup;
  named_barrier_sync(kProducerBarrier, 128);
  copy_kv.operator()<true>(k_tile, v_tile, StagedPages{slots, kv_begin}, kv_begin, kv_len);
}

/// An 8-bit cache's conversion: thread t holds 16-code chunk t % (D / 16)
/// of rows t / (D / 16) + i kCodeRowStep of both K and V (the same offsets:
/// the launch takes compact caches of the same strides), kCodeBatchRows rows
/// of each per batch in registers (8 kCodeBatchRows registers).
constexpr int kCodeRowStep = 128 / kKeyCodeChunks;
constexpr int kCodeRowsPerThread = kBlockN / kCodeRowStep;
/// Rows per batch: what the producer's registers hold beside its
/// addressing. With two consumer warpgroups (56 registers) 2 rows, 16
/// registers of codes, 64 bytes a thread in flight (4 rows spilled 20-44
/// bytes at D 64 to 256); with one (96 registers) up to 4.
constexpr int kCodeBatchRowsMost = kConsumerGroups == 1 ? 4 : 2;
constexpr int kCodeBatchRows =
    kCodeRowsPerThread < kCodeBatchRowsMost ? kCodeRowsPerThread : kCodeBatchRowsMost;
static_assert(kKeyCodeChunks == kValueCodeChunks && 128 % kKeyCodeChunks == 0 &&
                  kBlockN % kCodeRowStep == 0 && kCodeRowsPerThread % kCodeBatchRows == 0,
              "uneven code rows");

/// The producer warpgroup's conversion of an 8-bit cache's K and V rows
/// [kv_begin, kv_begin + kBlockN) (zeros past kv_len) into one stage (`k_tile`,
/// V's after it). The pages are looked up and staged as gather_kv_stage
/// does; each batch of rows' codes goes from global memory straight into
/// registers (no code buffer in shared memory: the stage's stores are the
/// only shared traffic the conversion adds), the first batch issued before
/// the wait on the stage's empty mbarrier so that its latency runs under
/// the wait. The stores are the generic proxy's and the wgmma reads through
/// the async proxy: each thread fences its own stores before its arrival on
/// the stage's full mbarrier, so the consumers need no fence of their own.
/// `k_codes` and `v_codes`: the KV head's codes, 16 chunk bytes into a row.
PAGEDC_DEVICE void convert_code_stage(const char *k_codes, const char *v_codes,
                                      const int32_t *page_row, int32_t *slots,
                                      unsigned char *k_tile, int kv_begin, int kv_len, int thread,
                                      uint32_t full_bar, uint32_t empty_bar,
                                      unsigned empty_parity) {
  const int32_t lookup = tile_page<kBlockN>(page_row, kv_begin, kv_len, thread, -1);
  if (thread < kTilePages)
    slots[thread] = lookup;
  named_barrier_sync(kProducerBarrier, 128);
  const int chunk = thread % kKeyCodeChunks, first_row = thread / kKeyCodeChunks;
  unsigned char *const v_tile = k_tile + kBlockN * kRowBytes;
  // (Unrolled, ptxas hoisted later batches' loads and spilled 12-28 bytes.)
#pragma unroll 1
  for (int batch = 0; batch < kCodeRowsPerThread; batch += kCodeBatchRows) {
    Chunk16 k_chunks[kCodeBatchRows], v_chunks[kCodeBatchRows];
#pragma unroll
    for (int i = 0; i < kCodeBatchRows; ++i) {
      const int row = first_row + (batch + i) * kCodeRowStep;
      const int kv = kv_begin + row;
      if (kv < kv_len) {
        const int64_t offset =
            static_cast<int64_t>(slots[row >> kLog2PageSize]) * (kPageSize * kHeadDim) +
            (kv & (kPageSize - 1)) * kHeadDim;
        load_code_chunk(k_chunks[i], k_codes + offset);
        load_code_chunk(v_chunks[i], v_codes + offset);
      } else {
        // Code 0 is +0: rows past kv_len are finite zeros, as a gather's.
#pragma unroll
        for (int w = 0; w < 4; ++w)
          k_chunks[i].word[w] = v_chunks[i].word[w] = 0;
      }
    }
    if (batch == 0)
      mbarrier_wait(empty_bar, empty_parity);
#pragma unroll
    for (int i = 0; i < kCodeBatchRows; ++i)
      store_code_chunk<AtomRows, true>(k_tile, first_row + (batch + i) * kCodeRowStep, chunk,
                                       k_chunks[i]);
#pragma unroll
    for (int i = 0; i < kCodeBatchRows; ++i)
      store_code_chunk<AtomRows, true>(v_tile, first_row + (batch + i) * kCodeRowStep, chunk,
                                       v_chunks[i]);
  }
  fence_proxy_async();
  mbarrier_arrive(full_bar);
}

/// Pages of at least this many rows are copied with bulk tensor copies
/// when the launch enabled them (PagedcWgmmaPrefillArgs): one box of
/// kTmaBoxRows rows x 64 head dims per page and atom, 2-8 KiB. Smaller pages
/// would take more boxes per tile than the gather takes copies per thread.
constexpr int kTmaPageRows = 16;
/// (Not at D 256 with two consumer warpgroups: the producer's 56
/// registers spilled 64 bytes around the 32 copies of a tile.)
/// (Nor for 8-bit caches: their codes are converted on the way in.)
constexpr bool kTmaPages = kKvFloat8 == 0 && kPageSize >= kTmaPageRows &&
                           (kHeadDim <= 128 || kConsumerGroups == 1);
constexpr int kTmaBoxRows = kPageSize < kBlockN ? kPageSize : kBlockN;
/// Pages (boxes per atom column) in one KV tile.
constexpr int kTmaTilePages = kBlockN / kTmaBoxRows;
/// Rows of one run box: a tile's pages are taken in segments of up to 64
/// rows, each of which may come in one box per 64 head dims when its pages
/// are consecutive (the launch's run maps, PagedcWgmmaPrefillArgs::run_boxes).
/// A 128-key tile is two segments, so that a tile made of two separate runs
/// of 64 rows (a sequence grown a few pages at a time) still takes two
/// boxes per atom and not one per page: a 128-key tile copied page by page
/// costs more copy instructions than the larger tile saves (the GPU study
/// pages under bench/studies/ have the timings).
constexpr int kRunRows = kBlockN < 64 ? kBlockN : 64;
constexpr int kRunSegments = kBlockN / kRunRows;
/// Pages in one run box.
constexpr int kRunPages = kRunRows / kTmaBoxRows;
constexpr bool kRunBoxes = kTmaPages && kRunPages > 1;
/// The XOR a tile copied as descending runs applies to its column index:
/// shared row r then holds the tile's key r ^ kRunReversed (page j of a
/// segment's box is the segment's page kRunPages - 1 - j; a power of two
/// pages; the XOR stays inside the segment).
constexpr int kRunReversed = kRunRows - kTmaBoxRows;

/// The producer warpgroup's copy of the K and V rows [kv_begin, kv_begin +
/// kBlockN), all below kv_len, into one stage with bulk tensor copies:
/// thread 0 looks up the tile's pages (before the wait on the stage's
/// empty mbarrier), arrives on the full mbarrier expecting the stage's
/// bytes and copies one box per page and 64 head dims of K and of V; every
/// other producer thread arrives (the full mbarrier expects the
/// warpgroup's 128 arrivals, as after a gather). Rows of a page outside the
/// tensor (a page index out of range) arrive as zeros.
///
/// With run maps (`run_maps`, kRunBoxes), a tile whose segments (kRunRows
/// rows each) are each a run of consecutive pages, all in the same
/// direction, comes in one box per segment and 64 head dims, each from its
/// segment's lowest page. The allocator hands a sequence's pages out in
/// descending order (the free list's tail, docs/runtime.md), so such runs
/// usually descend: their rows then land page-reversed within each
/// segment, and thread 0 writes kRunReversed to `*column_xor` (else 0)
/// before its arrival, which releases it to the consumers with the stage.
PAGEDC_DEVICE void tma_kv_stage(uint32_t k_tile, uint32_t v_tile, const TensorMap *k_map,
                                const TensorMap *v_map, const TensorMap *k_run_map,
                                const TensorMap *v_run_map, bool run_maps,
                                const int32_t *page_row, int kv_begin, int kv_head, int thread,
                                uint32_t full_bar, uint32_t empty_bar, unsigned empty_parity,
                                int32_t *column_xor) {
  if (thread != 0) {
    mbarrier_wait(empty_bar, empty_parity);
    mbarrier_arrive(full_bar);
    return;
  }
  int32_t pages[kTmaTilePages];
#pragma unroll
  for (int i = 0; i < kTmaTilePages; ++i)
    pages[i] = page_row[(kv_begin >> kLog2PageSize) + i];
  bool up = kRunBoxes && run_maps, down = up;
#pragma unroll
  for (int s = 0; s < kRunSegments; ++s)
#pragma unroll
    for (int i = 1; i < kRunPages; ++i) {
      up = up && pages[s * kRunPages + i] == pages[s * kRunPages] + i;
      down = down && pages[s * kRunPages + i] == pages[s * kRunPages] - i;
    }
  mbarrier_wait(empty_bar, empty_parity);
  if constexpr (kRunBoxes)
    *column_xor = down ? kRunReversed : 0;
  mbarrier_arrive_expect_tx(full_bar, 2u * kBlockN * kRowBytes);
  if (kRunBoxes && (up || down)) {
#pragma unroll
    for (int s = 0; s < kRunSegments; ++s) {
      const int lowest = up ? pages[s * kRunPages] : pages[s * kRunPages + kRunPages - 1];
      const uint32_t row_offset = static_cast<uint32_t>(s) * kRunRows * 128;
#pragma unroll
      for (int atom = 0; atom < kHeadDim / 64; ++atom) {
        const int at[4] = {64 * atom, 0, lowest, kv_head};
        bulk_tensor_g2s<4>(k_tile + atom * atom_bytes(kBlockN) + row_offset, k_run_map, at,
                           full_bar);
        bulk_tensor_g2s<4>(v_tile + atom * atom_bytes(kBlockN) + row_offset, v_run_map, at,
                           full_bar);
      }
    }
    return;
  }
  const int first_slot = kv_begin & (kPageSize - 1);
#pragma unroll
  for (int i = 0; i < kTmaTilePages; ++i) {
    const uint32_t row_offset = static_cast<uint32_t>(i) * kTmaBoxRows * 128;
#pragma unroll
    for (int atom = 0; atom < kHeadDim / 64; ++atom) {
      const int at[4] = {64 * atom, first_slot, pages[i], kv_head};
      bulk_tensor_g2s<4>(k_tile + atom * atom_bytes(kBlockN) + row_offset, k_map, at, full_bar);
      bulk_tensor_g2s<4>(v_tile + atom * atom_bytes(kBlockN) + row_offset, v_map, at, full_bar);
    }
  }
}
} // namespace pagedc

namespace pagedc {
/// Whether a consumer warpgroup keeps one tile's O += P V in flight while it
/// computes the next tile's S and softmax (the probabilities wait in
/// registers): head dims up to 128; at 256 the second accumulator set does
/// not fit beside O.
constexpr bool kOverlap = kHeadDim <= 128;

/// Whether a warp whose rows all have a reference max takes its tiles'
/// softmax without the row maximum (softmax_tile_fast): kernels without a
/// score mod. (Its overflow path recomputes a tile's scores and applies the
/// mods a second time; with a score mod that second copy raised register
/// pressure until 32 of the corpus's 313 selections spilled 4-8 bytes at
/// 128 x 128, D 128.)
constexpr bool kFastSoftmax = !pagedc_mods::kHasScore;

/// A warp's raw scores S = Q K^T once more, from the Q rows and the K
/// stage in shared memory, with f32 FMAs: the fast softmax's overflow path
/// only (far slower than the wgmma; the head-dim loop is not unrolled and
/// reads one element at a time, so that it takes few registers). Column c
/// of the tile is K row c of the stage, whatever key that row holds.
PAGEDC_DEVICE void recompute_scores(float (&scores)[kBlockN / 8][4], const unsigned char *q_rows,
                                    const unsigned char *k_tile, int warp, int lane) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      scores[j][e] = 0.0f;
  const int row = 16 * warp + (lane >> 2);
#pragma unroll 1
  for (int d = 0; d < kHeadDim; ++d) {
    const int chunk = d >> 3, within = 2 * (d & 7);
    const float q0 =
        to_float(*reinterpret_cast<const Element *>(q_rows + atom_offset(64, row, chunk) + within));
    const float q1 = to_float(
        *reinterpret_cast<const Element *>(q_rows + atom_offset(64, row + 8, chunk) + within));
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int column = 8 * j + 2 * (lane & 3) + c;
        const float k = to_float(*reinterpret_cast<const Element *>(
            k_tile + atom_offset(kBlockN, column, chunk) + within));
        scores[j][c] = fmaf(q0, k, scores[j][c]);
        scores[j][2 + c] = fmaf(q1, k, scores[j][2 + c]);
      }
  }
}

/// A descriptor moved `bytes` (a multiple of 16) further in shared memory:
/// the start address is its low 14 bits in 16-byte units, and every
/// address a tile here uses fits them (shared memory < 256 KiB), so the
/// sum never carries out of the field.
PAGEDC_DEVICE uint64_t descriptor_plus(uint64_t descriptor, uint32_t bytes) {
  return descriptor + (bytes >> 4);
}

/// Issues S = Q K^T for one warpgroup (64 rows) and one K tile: both from
/// shared memory, K-major, 16 head dims per wgmma. `q_desc` and `k_desc`
/// describe the tiles' starts (built once: descriptor arithmetic per step
/// and tile cost ~100 uniform instructions a tile on an H100).
PAGEDC_DEVICE void issue_scores(float (&s_acc)[kBlockN / 2], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
  for (int step = 0; step < kHeadDim / 16; ++step) {
    const uint32_t within = (step & 3) * 32;
    wgmma_ss<kBlockN, kIsBF16, false>(
        s_acc, descriptor_plus(q_desc, (step >> 2) * atom_bytes(64) + within),
        descriptor_plus(k_desc, (step >> 2) * atom_bytes(kBlockN) + within), step > 0);
  }
}

/// Issues O += P V: P from registers (the A fragment of each 16-key step),
/// V N-major: 64 columns per atom (LBO), 8-row groups (SBO); `v_desc`
/// describes the V tile's start.
PAGEDC_DEVICE void issue_pv(float (&o_acc)[kHeadDim / 2], const uint32_t (&p)[kBlockN / 16][4],
                            uint64_t v_desc) {
#pragma unroll
  for (int step = 0; step < kBlockN / 16; ++step)
    wgmma_rs<kHeadDim, kIsBF16, true>(o_acc, p[step], descriptor_plus(v_desc, step * 2048),
                                      true);
}

/// Waits for every wgmma of the warpgroup (the pending O += P V).
PAGEDC_DEVICE void wait_pending_pv(float (&o_acc)[kHeadDim / 2]) {
  wgmma_wait<0>();
  wgmma_fence_operands(o_acc);
}

/// Issues O += P V, waits for it, and releases the stage it read.
PAGEDC_DEVICE void finish_pv(float (&o_acc)[kHeadDim / 2], const uint32_t (&p)[kBlockN / 16][4],
                             uint64_t v_desc, uint32_t empty_bar) {
  wgmma_fence_operands(o_acc);
  wgmma_fence();
  issue_pv(o_acc, p, v_desc);
  wgmma_commit();
  wait_pending_pv(o_acc);
  mbarrier_arrive(empty_bar);
}

PAGEDC_DEVICE void zero_probabilities(uint32_t (&p)[kBlockN / 16][4]) {
#pragma unroll
  for (int step = 0; step < kBlockN / 16; ++step)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      p[step][i] = 0;
}

/// The A fragments of P for issue_pv, from the probabilities.
PAGEDC_DEVICE void pack_probabilities(uint32_t (&p)[kBlockN / 16][4],
                                      const float (&scores)[kBlockN / 8][4]) {
#pragma unroll
  for (int step = 0; step < kBlockN / 16; ++step) {
    p[step][0] = pack_pair(scores[2 * step][0], scores[2 * step][1]);
    p[step][1] = pack_pair(scores[2 * step][2], scores[2 * step][3]);
    p[step][2] = pack_pair(scores[2 * step + 1][0], scores[2 * step + 1][1]);
    p[step][3] = pack_pair(scores[2 * step + 1][2], scores[2 * step + 1][3]);
  }
}
} // namespace pagedc

#ifdef PAGEDC_EMULATOR
// __launch_bounds__ is empty in an emulator image: the CTA count it asks
// for sets the registers setmaxnreg starts from there, and the registers
// the emulator's occupancy counts.
PAGEDC_EMU_EXPORT const int pagedc_emu_ctas_per_sm_pagedc_prefill = pagedc::kCtasPerSm;
#endif

extern "C" __global__ void __launch_bounds__(pagedc::kPrefillThreads, pagedc::kCtasPerSm)
    pagedc_prefill(const __grid_constant__ PagedcAttentionKernelArgs args,
                   const __grid_constant__ pagedc_mods::Params params,
                   const __grid_constant__ PagedcWgmmaPrefillArgs wg) {
  using namespace pagedc;
  PAGEDC_EXTERN_SHARED(unsigned char, shared);
  const int thread = threadIdx.x, lane = thread & 31;
  // The query tiles: the CTA's own (a grid of one CTA per tile) or, with a
  // smaller grid (persistent CTAs, the launch's choice), one per round
  // (from the work counter, or prefill_round_tile) until they run out. The producer and the
  // consumers walk the same rounds; the ring's visits and the Q tiles'
  // barrier phases carry on from one tile to the next.
  const int tile_count = prefill_tile_count<kBlockM>(args);

  // Shared memory: the Q tiles, the K/V stages, then the mbarriers.
  const uint32_t base = (shared_address(shared) + 1023u) & ~1023u;
  const uint32_t q_tiles = base;
  constexpr uint32_t kQBytes = kBlockM * kRowBytes;
  constexpr uint32_t kStageBytes = 2 * kBlockN * kRowBytes;
  const uint32_t stages = q_tiles + kQBuffers * kQBytes;
  // Per Q tile a full (the producer's copies landed) and an empty (the
  // consumers' S products are done with it) mbarrier; per stage the same.
  const uint32_t q_full = stages + kStages * kStageBytes;
  const uint32_t q_empty = q_full + 8 * kQBuffers;
  const uint32_t full = q_empty + 8 * kQBuffers, empty = full + 8 * kStages;
  // Persistent CTAs with a work counter (wg.tile_counter): producer
  // thread 0 takes each round's tile (by the CTA's index in round 0, from
  // the counter after, a round ahead), writes it into the Q buffer's slot
  // once the buffer is free and arrives on its full barrier once more (so
  // the consumers read the slot after that arrival's release). A tile past
  // the last ends the CTA: the producer completes the buffer's full phase
  // without copies and the consumers stop at the slot.
  int32_t *const tile_counter = wg.tile_counter;
  const bool counted = tile_counter != nullptr;
  PAGEDC_SHARED(int32_t, tile_slots, kQBuffers);
  if (thread == 0) {
    for (int q = 0; q < kQBuffers; ++q) {
      mbarrier_init(q_full + 8 * q, counted ? 129 : 128);
      mbarrier_init(q_empty + 8 * q, kConsumerThreads);
    }
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full + 8 * s, 128);
      mbarrier_init(empty + 8 * s, kConsumerThreads);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  // The block-mask rows (passes) a tile's rows straddle; computed in each
  // branch (live across the producer / consumer split, the value was
  // spilled once the producer could copy with tensor maps).
  auto first_pass = [&](const PrefillTile &tile) {
    return binds_block_mask(args) ? (tile.q_offset + tile.row_begin) / args.q_block_size : 0;
  };
  auto last_pass = [&](const PrefillTile &tile) {
    return binds_block_mask(args)
               ? (tile.q_offset + tile.row_begin + tile.row_count - 1) / args.q_block_size
               : 0;
  };
  // Whether the producer copies the tile at kv with tensor maps: every
  // tile below kv_len when the launch gave maps; the tail tile is gathered
  // (its rows past kv_len must be zeros). The consumers fence only the
  // gathered ones.
  auto by_tensor_maps = [&](int kv, int kv_len) {
    return kTmaPages && wg.tensor_maps != 0 && kv + kBlockN <= kv_len;
  };
  // Per stage: the XOR of a run-copied tile's column indices (tma_kv_stage).
  PAGEDC_SHARED(int32_t, stage_xor, kStages);
  if (thread < 128) {
    // The producer warpgroup: its four warps gather.
    setmaxnreg_dec<kProducerRegisters>();
    // The maps' descriptors are fetched under the first tile's block-list
    // and page lookups, not after them at its first copy.
    if (kTmaPages && wg.tensor_maps != 0 && thread == 32)
      prefetch_cache_maps(wg, wg.run_boxes != 0);
    // The page indices of gathered tiles, two buffers used in turn: a
    // buffer is rewritten two gathers later, after every producer thread
    // passed the next gather's barrier, so after its reads.
    PAGEDC_SHARED(int32_t, page_slots, 2 * kTilePages);
    unsigned visit = 0, gathered = 0;
    // With a work counter, producer thread 0 hands each round's tile to the
    // other producer threads through one of two words (a word is rewritten
    // two rounds later, after every producer thread passed the next round's
    // barrier, so after its read). It takes the tiles a round ahead
    // (`taken`: at launch its own, then the next as each round starts), so
    // that the atomic's round trip runs under the current tile's copies
    // instead of after the consumers hand Q's buffer back.
    PAGEDC_SHARED(int32_t, round_tiles, 2);
    // One visit at kv copied with tensor maps into the ring's next stage.
    auto copy_by_tensor_maps = [&](const int32_t *page_row, int kv, int kv_head, int thread) {
      const int stage = visit % kStages;
      const uint32_t k_tile = stages + stage * kStageBytes;
      tma_kv_stage(k_tile, k_tile + kBlockN * kRowBytes,
                   reinterpret_cast<const TensorMap *>(wg.k_map),
                   reinterpret_cast<const TensorMap *>(wg.v_map),
                   reinterpret_cast<const TensorMap *>(wg.k_run_map),
                   reinterpret_cast<const TensorMap *>(wg.v_run_map), wg.run_boxes != 0, page_row,
                   kv, kv_head, thread, full + 8 * stage, empty + 8 * stage,
                   ((visit / kStages) & 1) ^ 1, stage_xor + stage);
      ++visit;
    };
    int taken = 0;
    if (counted && threadIdx.x == 0)
      taken = next_counted_tile(tile_counter, 0, tile_count);
    for (int round = 0;; ++round) {
      // Q goes into its buffer once the consumers are done with the tile
      // it held kQBuffers rounds ago (the first waits pass at once).
      const int q_buffer = round % kQBuffers;
      int64_t tile_index;
      if (counted) {
        if (threadIdx.x == 0)
          round_tiles[round & 1] = taken;
        named_barrier_sync(kProducerBarrier, 128);
        tile_index = round_tiles[round & 1];
        // Every CTA with a tile still takes one value past the last (the
        // counter's reset counts on it), a round before it ends.
        if (threadIdx.x == 0 && tile_index < tile_count)
          taken = next_counted_tile(tile_counter, round + 1, tile_count);
      } else {
        tile_index = prefill_round_tile(round);
      }
      // After the first round, a tile whose first visit is copied with
      // tensor maps has that visit copied here, before its Q: the visit's
      // stage comes free while the consumers finish the last tile, before
      // they hand Q's buffer back, so its block-list and page lookups and
      // its copy run under their last tile, and their next S waits for Q's
      // copy alone. (Round 0 copies Q first: its buffer is free at once. A
      // gathered first visit keeps the order. This block derives what it
      // needs itself: sharing the round's tile, the visit loop or the Q
      // copy with it, ptxas spilled 16-60 bytes in the producer's 56
      // registers or 8-16 more in the consumers of 13 corpus selections.)
      bool first_copied = false;
      if constexpr (kTmaPages) {
        if (round > 0 && tile_index < tile_count) {
          const PrefillTile ahead = prefill_tile<kBlockM>(args, static_cast<int>(tile_index));
          KvVisits<kBlockN> visits;
          int list = 0, sub = 0;
          if (visits.start(args, ahead.b, ahead.h, first_pass(ahead), ahead.kv_len)) {
            const int kv = visits.seek_first(args, ahead.kv_len, list, sub);
            if (list < visits.list_count && by_tensor_maps(kv, ahead.kv_len)) {
              copy_by_tensor_maps(args.page_table + ahead.b * args.page_table_stride, kv,
                                  ahead.kv_head, threadIdx.x);
              first_copied = true;
            }
          }
        }
      }
      if (counted) {
        // The slot is the consumers' until they release the buffer.
        mbarrier_wait(q_empty + 8 * q_buffer, ((round / kQBuffers) & 1) ^ 1);
        if (threadIdx.x == 0)
          tile_slots[q_buffer] = static_cast<int32_t>(tile_index);
        if (tile_index >= tile_count) {
          cp_async_mbarrier_arrive(q_full + 8 * q_buffer);
          if (threadIdx.x == 0)
            mbarrier_arrive(q_full + 8 * q_buffer);
          break;
        }
      } else if (tile_index >= tile_count) {
        break;
      }
      // The copies' per-thread addressing, derived anew each round: hoisted
      // out of this loop, it spilled 20 bytes at the producer's 56
      // registers (D 128, 128 x 64).
      const int thread = recompute_here(threadIdx.x);
      const PrefillTile tile = prefill_tile<kBlockM>(args, static_cast<int>(tile_index));
      const int h = tile.h, b = tile.b, kv_head = tile.kv_head, kv_len = tile.kv_len;
      const int pass_first = first_pass(tile), pass_last = last_pass(tile);
      const uint32_t q_tile = q_tiles + q_buffer * kQBytes;
      if (!counted)
        mbarrier_wait(q_empty + 8 * q_buffer, ((round / kQBuffers) & 1) ^ 1);
      const Element *q_rows = static_cast<const Element *>(args.q) + b * args.q_stride[0] +
                              h * args.q_stride[1] + tile.row_begin * args.q_stride[2];
#pragma unroll 2
      for (int index = thread; index < kBlockM * kChunksPerRow; index += 128) {
        const int row = index / kChunksPerRow, chunk = index % kChunksPerRow;
        const bool valid = row < tile.row_count;
        cp_async_16(q_tile + (row >> 6) * (kHeadDim / 64) * atom_bytes(64) +
                        atom_offset(64, row & 63, chunk),
                    q_rows + (valid ? row * args.q_stride[2] : 0) + chunk * 8, valid ? 16 : 0);
      }
      cp_async_mbarrier_arrive(q_full + 8 * q_buffer);
      if (counted && thread == 0)
        mbarrier_arrive(q_full + 8 * q_buffer);
      const Element *k_head =
          static_cast<const Element *>(args.k_cache) + kv_head * args.k_stride[0];
      const Element *v_head =
          static_cast<const Element *>(args.v_cache) + kv_head * args.v_stride[0];
      const KvGather copy_kv(k_head, v_head, thread);
      // An 8-bit cache's codes: compact pages (the launch checks), so a
      // row's offset is a product of constants (convert_code_stage); this
      // thread's chunk of each row.
      const char *const k_codes = static_cast<const char *>(args.k_cache) +
                                  kv_head * args.k_stride[0] + 16 * (thread % kKeyCodeChunks);
      const char *const v_codes = static_cast<const char *>(args.v_cache) +
                                  kv_head * args.v_stride[0] + 16 * (thread % kKeyCodeChunks);
      const int32_t *page_row = args.page_table + b * args.page_table_stride;
      for (int pass = pass_first; pass <= pass_last; ++pass) {
        KvVisits<kBlockN> visits;
        if (!visits.start(args, b, h, pass, kv_len))
          break;
        int list = 0, sub = 0;
        for (int kv = visits.seek_first(args, kv_len, list, sub); list < visits.list_count;
             visits.advance(list, sub), kv = visits.seek(args, kv_len, list, sub)) {
          if (first_copied) {
            // Copied before Q, above.
            first_copied = false;
            continue;
          }
          if constexpr (kTmaPages) {
            if (by_tensor_maps(kv, kv_len)) {
              copy_by_tensor_maps(page_row, kv, kv_head, thread);
              continue;
            }
          }
          int32_t *slots = page_slots + (gathered & 1) * kTilePages;
          if constexpr (kKvFloat8 != 0) {
            const int stage = visit % kStages;
            convert_code_stage(k_codes, v_codes, page_row, slots,
                               shared + (stages + stage * kStageBytes - shared_address(shared)), kv,
                               kv_len, thread, full + 8 * stage, empty + 8 * stage,
                               ((visit / kStages) & 1) ^ 1);
            ++gathered;
            ++visit;
            continue;
          }
          const int stage = visit % kStages;
          const uint32_t k_tile = stages + stage * kStageBytes;
          gather_kv_stage(copy_kv, k_tile, k_tile + kBlockN * kRowBytes, page_row, slots, kv,
                          kv_len, thread, empty + 8 * stage, ((visit / kStages) & 1) ^ 1);
          cp_async_mbarrier_arrive(full + 8 * stage);
          ++gathered;
          ++visit;
        }
      }
    }
  } else {
  // A consumer warpgroup: rows group_row .. group_row + 63 of the CTA (the
  // other branch of one if / else: ptxas applies setmaxnreg per branch).
  setmaxnreg_inc<kConsumerRegisters>();
  const int consumer = thread - 128, warp = (consumer >> 5) & 3;
  const int group = warp_uniform(consumer >> 7);
  const int group_row = 64 * group;
  const uint64_t k_desc0 = wgmma_descriptor(stages, 16, 1024, kSwizzle128);
  const uint64_t v_desc0 =
      wgmma_descriptor(stages + kBlockN * kRowBytes, atom_bytes(kBlockN), 1024, kSwizzle128);
  // No score mod and a positive scale: the softmax applies scale·log2(e)
  // with an FFMA instead of a multiply per score here.
  // (An 8-bit cache's K scale, > 0, joins the scale per query tile.)
  const bool scale_in_softmax = !pagedc_mods::kHasScore && args.scale > 0.0f;
  float softmax_factor = scale_in_softmax ? args.scale * kLog2e : 1.0f;
  // kStageColumns: kColumnBuffers buffers of kBlockN keys per warpgroup,
  // used in turn by its partial tiles (`staged` counts them). With two, a
  // buffer is rewritten two partial tiles later, after every thread of the
  // warpgroup passed the next one's barrier, so after its reads; with one,
  // a barrier before each write keeps it from the last tile's reads.
  PAGEDC_SHARED(pagedc_mods::MaskCol, column_stage,
                kStageColumns ? kColumnBuffers * kConsumerGroups * kBlockN : 1);
  unsigned staged = 0;
  // Ping-pong (wg.ping_pong, two consumer warpgroups, kOverlap): named
  // barrier kTurnBarrier + g is warpgroup g's turn to issue its wgmmas;
  // each waits for its turn, issues S and the previous P V, and hands the
  // turn over, so the tensor cores run one warpgroup's products while the
  // other computes its softmax. Warpgroup 0 goes first. The turns run on
  // from one query tile to the next (both warpgroups visit the same
  // tiles): the first is given before the first tile, the last taken
  // after the last.
  const bool ping_pong = kOverlap && kConsumerGroups == 2 && wg.ping_pong != 0;
  if (ping_pong && group == 1)
    named_barrier_arrive(kTurnBarrier, 256);
  unsigned visit = 0;
  for (int round = 0;; ++round) {
    const int q_buffer = round % kQBuffers;
    int64_t tile_index;
    if (counted) {
      // The producer's choice, in the buffer's slot (Q may still be landing:
      // the wait below is on the same phase and passes at once).
      mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);
      tile_index = tile_slots[q_buffer];
    } else {
      tile_index = prefill_round_tile(round);
    }
    if (tile_index >= tile_count)
      break;
    const PrefillTile tile = prefill_tile<kBlockM>(args, static_cast<int>(tile_index));
    const int h = tile.h, b = tile.b, row_begin = tile.row_begin;
    const int kv_len = tile.kv_len, q_offset = tile.q_offset;
    const int pass_first = first_pass(tile), pass_last = last_pass(tile);
    // The scores' scale: an 8-bit cache's K scale times the call's
    // (q . (c s) = s (q . c)).
    float score_scale = args.scale;
    if constexpr (kKvFloat8 != 0) {
      score_scale *= args.k_scale[tile.kv_head];
      softmax_factor = scale_in_softmax ? score_scale * kLog2e : 1.0f;
    }
    int q_of[2];
    const int b_of[2] = {b, b}, h_of[2] = {h, h};
    pagedc_mods::MaskRow mask_rows[2];
    pagedc_mods::ScoreRow score_rows[2];
    RowState state;
    float out[kHeadDim / 8][4];
    reset_rows(state, out);
    // kFastSoftmax: whether every row of the warp has a finite reference
    // max (warp-uniform); until then its tiles take softmax_tile.
    bool references_known = false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_begin + group_row + 16 * warp + (lane >> 2) + 8 * half;
      // Padding rows evaluate the last real row's mods and are never stored.
      q_of[half] = q_offset + imin(row, args.q_len - 1);
      mask_rows[half] = pagedc_mods::mask_row(params, b, h, q_of[half]);
      score_rows[half] = pagedc_mods::score_row(params, b, h, q_of[half]);
    }
    // (Through a shuffle, like `group`: derived from the round where it is
    // used, ptxas rebuilt the descriptor inside the KV-tile loop, 3-13
    // uniform instructions a tile.)
    const uint32_t q_group = static_cast<uint32_t>(warp_uniform(
        static_cast<int>(q_tiles + q_buffer * kQBytes + group * (kHeadDim / 64) * atom_bytes(64))));
    const uint64_t q_desc = wgmma_descriptor(q_group, 16, 1024, kSwizzle128);
    float(&o_acc)[kHeadDim / 2] = *reinterpret_cast<float(*)[kHeadDim / 2]>(&out[0][0]);
    // The probabilities of the tile whose O += P V is still to be issued
    // (kOverlap) or is issued right away, and where its V and stage are.
    uint32_t p_pending[kBlockN / 16][4];
    zero_probabilities(p_pending);
    uint64_t v_pending = 0;
    int pending_stage = 0;
    bool pending = false;
    // kOverlap: O's factors from the last tile's softmax, applied while the
    // next S runs (before that tile's P V is issued), and whether any is not 1.
    float o_factor[2] = {1.0f, 1.0f};
    bool o_rescale = false;

    // Q, before the first KV tile (the producer copies it whatever the
    // query tile visits), through the generic proxy like a gathered tile.
    mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);
    fence_proxy_async();
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
      // With kOverlap the next visit is found while this tile's wgmmas run
      // (its block-list load off the path from the P V wait to the next S).
      int next_list = 0, next_sub = 0, next_kv = 0;
      auto find_next = [&]() {
        next_list = list;
        next_sub = sub;
        visits.advance(next_list, next_sub);
        next_kv = visits.seek(args, kv_len, next_list, next_sub);
      };
      // The loop's step: moves to the visit find_next found. With kOverlap
      // find_next already ran, under the tile's wgmmas; without, it runs here
      // (called from the loop body as well, it was inlined twice: ~25 SASS).
      auto to_next = [&](int &kv_begin) {
        if constexpr (!kOverlap)
          find_next();
        list = next_list;
        sub = next_sub;
        kv_begin = next_kv;
      };
      for (int kv_begin = visits.seek_first(args, kv_len, list, sub); list < visits.list_count;
           to_next(kv_begin)) {
        const int stage = visit % kStages;
        const bool is_full = visits.is_full(list);
        mbarrier_wait(full + 8 * stage, (visit / kStages) & 1);
        ++visit;
        if (!kOverlap && !group_visible) {
          // No row of this warpgroup belongs to the pass: release at once.
          // (With kOverlap such tiles run as fully masked ones: a wgmma
          // under this branch, to finish the pending tile, made ptxas
          // serialize every wgmma of the kernel, and keeping the pending
          // stage through the pass can starve the producer.)
          mbarrier_arrive(empty + 8 * stage);
          continue;
        }
        // cp.async wrote gathered tiles through the generic proxy; wgmma
        // reads them through the async proxy. Tiles the producer copied with
        // tensor maps were written by the async proxy: no fence for them (it
        // cost a MEMBAR.ALL.CTA per tile); nor for an 8-bit cache's
        // converted tiles, which their writers fenced (convert_code_stage).
        if (kKvFloat8 == 0 && !by_tensor_maps(kv_begin, kv_len))
          fence_proxy_async();
        const uint64_t k_desc = descriptor_plus(k_desc0, stage * kStageBytes);
        const uint64_t v_desc = descriptor_plus(v_desc0, stage * kStageBytes);
        // A partial tile's key-only mask values, a thread of the warpgroup
        // reading the buffers at each key while S runs.
        const pagedc_mods::MaskCol *columns = column_stage;
        auto stage_columns = [&]() {
          if constexpr (kStageColumns) {
            if (!is_full) {
              pagedc_mods::MaskCol *const slot =
                  column_stage + ((staged % kColumnBuffers) * kConsumerGroups + group) * kBlockN;
              if (kColumnBuffers == 1 && staged != 0)
                named_barrier_sync(kColumnBarrier + group, 128);
              // (Tiles of 32 or 64 keys: the warpgroup's first kBlockN threads.)
              if ((consumer & 127) < kBlockN)
                slot[consumer & 127] = pagedc_mods::mask_col(params, kv_begin + (consumer & 127));
              ++staged;
              named_barrier_sync(kColumnBarrier + group, 128);
              columns = slot;
            }
          }
        };

        // S = Q K^T, issued before the previous tile's O += P V so that the
        // tensor cores run both while this warpgroup waits for S.
        float scores[kBlockN / 8][4];
        float(&s_acc)[kBlockN / 2] = *reinterpret_cast<float(*)[kBlockN / 2]>(&scores[0][0]);
        if (ping_pong)
          named_barrier_sync(kTurnBarrier + group, 256);
        wgmma_fence();
        issue_scores(s_acc, q_desc, k_desc);
        wgmma_commit();
        if constexpr (kOverlap) {
          // O takes the last tile's factors here, under this tile's S. The
          // wait retires nothing (the last P V was waited for), but without
          // it ptxas adds a wait for everything, this S included (C7517).
          if (o_rescale) {
            wgmma_wait<1>();
            rescale_rows(out, o_factor);
          }
          wgmma_fence();
          // The previous tile's P V, unconditionally (a wgmma under a branch
          // makes ptxas serialize them all): with nothing pending, P is zero
          // (from before the loop: zeroing it here put 16-32 selects between
          // the fence and the wgmma reading them, and ptxas injected a
          // warpgroup.arrive, C7519) and V this tile's, whose rows are finite
          // (zero-filled past kv_len).
          if (!pending)
            v_pending = v_desc;
          issue_pv(o_acc, p_pending, v_pending);
          wgmma_commit();
          if (ping_pong)
            named_barrier_arrive(kTurnBarrier + (group ^ 1), 256);
          find_next();
          stage_columns();
          wgmma_wait<1>();
        } else {
          stage_columns();
          wgmma_wait<0>();
        }
        wgmma_fence_operands(s_acc);

        const bool check_mask[2] = {!is_full, !is_full};
        const bool all_kept = (is_full || !pagedc_mods::kHasMask) && kv_begin + kBlockN <= kv_len &&
                              visible[0] && visible[1];
        tally_tile(all_kept, lane);
        // A tile copied as a descending page run holds its keys page-reversed.
        // (Read only where a mod or test uses the keys, it made ptxas spill
        // 36 bytes at D 128 with 128-key tiles, and all-kept tiles ran the
        // same SASS either way.)
        const int column_xor =
            kRunBoxes && by_tensor_maps(kv_begin, kv_len)
                ? stage_xor[stage]
                : 0;
        apply_mods<kBlockN / 8, 2, true, kStageColumns>(
            scores, params, mask_rows, score_rows, b_of, h_of, q_of, visible, check_mask, kv_begin,
            kv_len, score_scale, lane, all_kept, scale_in_softmax, column_xor, columns);
        float rescale[2];
        bool rescale_out;
        if (kFastSoftmax && references_known) {
          float tile_sum[2];
          softmax_tile_fast<kBlockN / 8>(state, scores, tile_sum, softmax_factor);
          if (__ballot_sync(0xffffffffu, !(tile_sum[0] <= kFastSumLimit &&
                                           tile_sum[1] <= kFastSumLimit)) == 0) {
            // The tile stands: its references hold (O's factor is 1).
            state.sum[0] += tile_sum[0];
            state.sum[1] += tile_sum[1];
            rescale[0] = rescale[1] = 1.0f;
            rescale_out = false;
          } else {
            if (__ballot_sync(0xffffffffu, !(tile_sum[0] < infinity() &&
                                                 tile_sum[1] < infinity())) == 0) {
              settle_fast_tile<kBlockN / 8>(state, scores, tile_sum, rescale);
            } else {
              // Some probability overflowed: the raw scores again, the mods
              // again (the same call as above), and the maximum first.
              recompute_scores(scores, shared + (q_group - shared_address(shared)),
                               shared + (stages + stage * kStageBytes - shared_address(shared)),
                               warp, lane);
              apply_mods<kBlockN / 8, 2, true, kStageColumns>(
                  scores, params, mask_rows, score_rows, b_of, h_of, q_of, visible, check_mask,
                  kv_begin, kv_len, score_scale, lane, all_kept, scale_in_softmax, column_xor,
                  columns);
              softmax_tile<kBlockN / 8>(state, scores, rescale, softmax_factor);
            }
            rescale_out = !kOverlap ||
                          __ballot_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f) != 0;
          }
        } else {
          softmax_tile<kBlockN / 8>(state, scores, rescale, softmax_factor);
          // Once the row maxima settle the factor is exactly 1 for every row
          // of the warp: skip the 64 multiplies then (exact either way; at D
          // 256, where ptxas then spilled, they always run).
          rescale_out =
              !kOverlap || __ballot_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f) != 0;
          if constexpr (kFastSoftmax)
            references_known = __ballot_sync(0xffffffffu, state.max[0] == -infinity() ||
                                                              state.max[1] == -infinity()) == 0;
        }
        tally_rescale(rescale_out, lane);
        if constexpr (kOverlap) {
          // The previous tile's O += P V must be done before P's registers
          // are rewritten (and O rescaled, in the next iteration); then its
          // stage is free. The wait is written in both arms of the branch:
          // written once after the softmax, ptxas hoisted it above the
          // softmax (before the first ex2), so the softmax never ran under
          // that P V.
          if (rescale_out) {
            wait_pending_pv(o_acc);
            o_rescale = true;
          } else {
            wait_pending_pv(o_acc);
            o_rescale = false;
          }
          o_factor[0] = rescale[0];
          o_factor[1] = rescale[1];
          if (pending)
            mbarrier_arrive(empty + 8 * pending_stage);
        } else {
          rescale_rows(out, rescale);
        }
        pack_probabilities(p_pending, scores);
        if constexpr (kOverlap) {
          v_pending = v_desc;
          pending_stage = stage;
          pending = true;
        } else {
          finish_pv(o_acc, p_pending, v_desc, empty + 8 * stage);
        }
      }
    }
    // The epilogue stages O through the warpgroup's own rows of the Q
    // buffer (its S products, which read them, are done) so that the rows
    // leave in 16-byte stores, whole 32-byte sectors: stored from the
    // accumulators, each warp store wrote 16 bytes of 8 rows, half a sector
    // each (a profiler counts one excess global sector per O sector). Not
    // when the buffer's next Q may be copied in before the epilogue would be
    // done (persistent CTAs with one Q buffer: there the consumers hand the
    // buffer back before the last P V, as without staging), nor when out
    // is not 16-byte aligned (the runtime asks 4 bytes).
    Element *out_base = static_cast<Element *>(args.out) + b * args.out_stride[0] +
                        h * args.out_stride[1];
    const bool staged_out =
        (kQBuffers == 2 || (!counted && static_cast<int>(gridDim.x) >= tile_count)) &&
        ((reinterpret_cast<uint64_t>(out_base) |
          static_cast<uint64_t>(args.out_stride[2] * sizeof(Element))) &
         15) == 0;
    // Every S of the tile is done (waited for in the loop): Q's buffer is
    // free for the tile the producer copies into it next (when staged, once
    // the epilogue read O back from it).
    if (!staged_out)
      mbarrier_arrive(q_empty + 8 * q_buffer);
    if (kOverlap && pending) {
      if (o_rescale)
        rescale_rows(out, o_factor);
      finish_pv(o_acc, p_pending, v_pending, empty + 8 * pending_stage);
    }

    // Epilogue: normalise, store out rows and lse.
    unsigned char *const o_rows = shared + (q_group - shared_address(shared));
    const float *sink = args.sinks != nullptr ? args.sinks + h : nullptr;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float row_lse;
      float inverse = finish_row(state.max[half], quad_sum(state.sum[half]), sink, row_lse);
      // An 8-bit cache's V scale on the output rows (not on lse).
      if constexpr (kKvFloat8 != 0)
        inverse *= args.v_scale[tile.kv_head];
      const int group_local = 16 * warp + (lane >> 2) + 8 * half;
      const int row = row_begin + group_row + group_local;
      if (staged_out) {
        // Chunk d of the row holds columns 8d .. 8d + 7; this thread's pair
        // is 4 (lane % 4) bytes into it (the Q tile's swizzled layout: no
        // bank conflict).
#pragma unroll
        for (int d = 0; d < kHeadDim / 8; ++d)
          *reinterpret_cast<uint32_t *>(o_rows + atom_offset(64, group_local, d) +
                                        4 * (lane & 3)) =
              pack_pair(out[d][2 * half] * inverse, out[d][2 * half + 1] * inverse);
      }
      if (row >= args.q_len)
        continue;
      if (!staged_out) {
        uint32_t *out_row =
            reinterpret_cast<uint32_t *>(out_base + row * args.out_stride[2] + 2 * (lane & 3));
#pragma unroll
        for (int d = 0; d < kHeadDim / 8; ++d)
          out_row[d * 4] = pack_pair(out[d][2 * half] * inverse, out[d][2 * half + 1] * inverse);
      }
      if constexpr (pagedc_config::kHasLse) {
        if ((lane & 3) == 0)
          args.lse[(static_cast<int64_t>(b) * args.heads_q + h) * args.q_len + row] = row_lse;
      }
    }
    if (staged_out) {
      // The warpgroup's 64 rows, 16 bytes a thread per step: consecutive
      // threads take consecutive chunks of a row.
      named_barrier_sync(kEpilogueBarrier + group, 128);
      const int group_thread = consumer & 127;
#pragma unroll 4
      for (int index = group_thread; index < 64 * kChunksPerRow; index += 128) {
        const int group_local = index / kChunksPerRow, chunk = index % kChunksPerRow;
        const int row = row_begin + group_row + group_local;
        if (row < args.q_len)
          copy_chunk16(out_base + row * args.out_stride[2] + chunk * 8,
                       o_rows + atom_offset(64, group_local, chunk));
      }
      mbarrier_arrive(q_empty + 8 * q_buffer);
    }
  }
  // Warpgroup 1's last hand-over (its first turn was given before the
  // first tile) is taken here, so no named barrier is left half arrived.
  if (ping_pong && group == 0)
    named_barrier_sync(kTurnBarrier, 256);
  } // consumer
}
