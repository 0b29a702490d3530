//===- Float8Tiles.cuh - K/V tiles of 8-bit float codes ---------*- CUDA -*-===//
//
// The mma.sync kernels' path for 8-bit float caches (pagedc_config::kKvFloat8):
// a tile's codes are gathered with cp.async into rows of kHeadDim bytes for
// K and kValueHeadDim bytes for V (at most half a 16-bit tile row, so both
// stages' codes fit in a kernel's second K and V stage), and after the wait
// converted (Float8.cuh) into K and V tiles of Element in the first stage,
// laid out as the kernel's math reads them. Rows are whole 16-code chunks
// (head dims are multiples of 16), not necessarily of 64 codes. The kernels
// apply the KV head's scales in f32: K's with the call's scale to the
// scores, V's to the output rows. The decode kernel at head dims up to 128
// takes Float8RegisterTiles instead: codes loaded into registers and
// converted there, only the Element tiles stored.
//
//===----------------------------------------------------------------------===//

namespace pagedc {

constexpr int kKvFloat8 = pagedc_config::kKvFloat8;

/// 16-code chunks of a row of K codes and of V codes.
constexpr int kKeyCodeChunks = kHeadDim / 16;
constexpr int kValueCodeChunks = kValueHeadDim / 16;

/// Threads that copy one row of 8-bit codes, 16 codes each, for tiles of
/// kRows rows and kThreads threads: the wider row's chunks rounded up to a
/// power of two, so that threads divide into whole rows, and at least
/// kThreads / kRows, so that no thread's first row is past the tile.
template <int kRows, int kThreads> struct CodeRowThreads {
  static constexpr int kRowChunks =
      kKeyCodeChunks > kValueCodeChunks ? kKeyCodeChunks : kValueCodeChunks;
  static constexpr int kCopyChunks = kRowChunks <= 2   ? 2
                                     : kRowChunks <= 4 ? 4
                                     : kRowChunks <= 8 ? 8
                                                       : 16;
  static constexpr int kThreadsPerRow =
      kCopyChunks > kThreads / kRows ? kCopyChunks : kThreads / kRows;
};

/// Gathers 8-bit float K/V rows [kv_begin, kv_begin + kRows) of one KV head
/// into two tiles of codes (rows of kHeadDim and kValueHeadDim bytes), as
/// KvTileCopier does for Element tiles: rows at or past kv_len and rows
/// whose bit in keep_rows is clear are zero-filled (code 0 is +0) and never
/// read (keep_rows covers 64 rows: a tile of more, the warpgroup prefill's
/// 128 keys, keeps every row). A row is copied by kThreadsPerRow threads
/// (CodeRowThreads; a thread whose chunk is past a tensor's row copies
/// nothing of it: 3 of 8 at head dim 80). Pages and slots are k_stride[1]
/// and k_stride[2] bytes apart (V's alike).
template <int kRows, int kThreads> struct Float8TileCopier {
  static constexpr int kThreadsPerRow = CodeRowThreads<kRows, kThreads>::kThreadsPerRow;
  static constexpr int kRowStep = kThreads / kThreadsPerRow;
  // Checked only where 8-bit caches are read: other kernels construct the
  // copier unused.
  static_assert(kKvFloat8 == 0 ||
                    (kThreads % kThreadsPerRow == 0 && kRows % kRowStep == 0 && kRows <= 128),
                "uneven code tile load");
  const char *k_bytes;
  const char *v_bytes;
  int first_row;
  uint32_t column;
  int64_t k_page_bytes, k_slot_bytes, v_page_bytes, v_slot_bytes;

  PAGEDC_DEVICE Float8TileCopier(const void *k_head, // [pages, page_size, D] codes
                                 const void *v_head, // [pages, page_size, Dv] codes
                                 int thread, const int64_t (&k_stride)[3],
                                 const int64_t (&v_stride)[3])
      : first_row(thread / kThreadsPerRow),
        column(static_cast<uint32_t>(thread % kThreadsPerRow) * 16), k_page_bytes(k_stride[1]),
        k_slot_bytes(k_stride[2]), v_page_bytes(v_stride[1]), v_slot_bytes(v_stride[2]) {
    k_bytes = static_cast<const char *>(k_head) + column;
    v_bytes = static_cast<const char *>(v_head) + column;
    opaque(k_bytes);
    opaque(v_bytes);
  }

  template <typename PageOf>
  PAGEDC_DEVICE void operator()(uint32_t k_codes, uint32_t v_codes, PageOf page_of,
                                int kv_begin, int kv_len,
                                uint64_t keep_rows = ~static_cast<uint64_t>(0)) const {
#pragma unroll 2
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const int row = first_row + i * kRowStep;
      const int kv = kv_begin + row;
      const bool valid = kv < kv_len && (kRows > 64 || ((keep_rows >> row) & 1));
      const int64_t page = valid ? page_of(kv) : 0;
      const int64_t slot = kv & (kPageSize - 1);
      const char *k_source = k_bytes + (valid ? page * k_page_bytes + slot * k_slot_bytes : 0);
      const char *v_source = v_bytes + (valid ? page * v_page_bytes + slot * v_slot_bytes : 0);
      const uint32_t k_offset = static_cast<uint32_t>(row * kHeadDim) + column;
      const uint32_t v_offset = static_cast<uint32_t>(row * kValueHeadDim) + column;
      if (kThreadsPerRow == kKeyCodeChunks || column < 16 * kKeyCodeChunks)
        cp_async_16(k_codes + k_offset, k_source, valid ? 16 : 0);
      if (kThreadsPerRow == kValueCodeChunks || column < 16 * kValueCodeChunks)
        cp_async_16(v_codes + v_offset, v_source, valid ? 16 : 0);
    }
  }
};

/// Converts one 16-code chunk `codes` (codes 16 chunk .. 16 chunk + 15 of
/// a row) into the two Element chunks 2 chunk and 2 chunk + 1 of row `row`
/// of the tile at `tile` (`Layout`); kSpreadStores: the store order below.
///
/// A 16-byte store is served a quarter warp at a time, conflict-free when
/// its 8 threads write 8 different 16-byte bank groups. At head dims of
/// 128 and more they hold chunks c of codes 0-7 of one row, and the
/// swizzles put Element chunks 2 c of chunks 0-3 in the same 4 groups as
/// those of 4-7: with kSpreadStores, threads with c % 8 >= 4 store their
/// high chunk (2 c + 1) first, which halves the conversion's store
/// wavefronts. (At 64 a quarter warp holds 4 chunks of two rows, whose
/// swizzles differ.) The warpgroup prefill's producer takes it; in the
/// other kernels the selects made the packed decode at head dim 256
/// spill 8 bytes (sm_90).
template <typename Layout, bool kSpreadStores>
PAGEDC_DEVICE void store_code_chunk(unsigned char *tile, int row, int chunk, const Chunk16 &codes) {
  const bool high_first = kSpreadStores && (chunk & 4) != 0;
  Chunk16 first, second;
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    const uint32_t pair = high_first ? codes.word[word ^ 2] : codes.word[word];
    uint32_t *into = word < 2 ? &first.word[2 * word] : &second.word[2 * word - 4];
    into[0] = float8x2_to_elements<kKvFloat8, kIsBF16>(pair & 0xffffu);
    into[1] = float8x2_to_elements<kKvFloat8, kIsBF16>(pair >> 16);
  }
  copy_chunk16(tile + Layout()(row, 2 * chunk + high_first), &first);
  copy_chunk16(tile + Layout()(row, 2 * chunk + !high_first), &second);
}

/// Converts one tile of kRows rows of 8-bit K codes and one of V codes
/// (rows of kHeadDim and kValueHeadDim bytes at k_codes, v_codes) into the
/// Element tiles at k_tile, v_tile (`Layout`: offset of a row's 16-byte
/// chunk): 16 codes in, two chunks out per step (store_code_chunk), K's
/// steps first.
template <int kRows, int kThreads, typename Layout, bool kSpreadStores = false>
PAGEDC_DEVICE void convert_code_tiles(unsigned char *k_tile, unsigned char *v_tile,
                                      const unsigned char *k_codes,
                                      const unsigned char *v_codes, int thread) {
  constexpr int kKeySteps = kRows * kKeyCodeChunks;
#pragma unroll 2
  for (int index = thread; index < kKeySteps + kRows * kValueCodeChunks; index += kThreads) {
    const bool is_v = index >= kKeySteps;
    const int at = is_v ? index - kKeySteps : index;
    // (Constants where K's and V's rows are as wide.)
    const int row_chunks = is_v ? kValueCodeChunks : kKeyCodeChunks;
    const int row = at / row_chunks, chunk = at % row_chunks;
    Chunk16 codes;
    copy_chunk16(&codes, (is_v ? v_codes : k_codes) + row * (16 * row_chunks) + chunk * 16);
    store_code_chunk<Layout, kSpreadStores>(is_v ? v_tile : k_tile, row, chunk, codes);
  }
}

/// 16 codes from global memory into registers (ld.global.nc: the cache is
/// not written while a kernel reads it). Not volatile, so that ptxas may
/// issue a batch of them before the conversions of the one before.
PAGEDC_DEVICE void load_code_chunk(Chunk16 &codes, const char *global) {
#ifdef PAGEDC_EMULATOR
  copy_chunk16(&codes, global);
#else
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(codes.word[0]), "=r"(codes.word[1]), "=r"(codes.word[2]), "=r"(codes.word[3])
      : "l"(global));
#endif
}

/// One tile of kRows rows of 8-bit K codes and V codes held in registers:
/// load() reads them from global memory (LDG.128, 16 codes a thread and
/// row), store() converts them in registers and writes only the Element
/// tiles (`Layout`) to shared memory. Against Float8TileCopier and
/// convert_code_tiles this moves 4 bytes of shared memory an element (the
/// element tile written, then read by ldmatrix) instead of 6 (codes
/// written, read, element tile written, read), and a kernel can issue the
/// next tile's loads before the current tile's math, holding the codes
/// across it (kRows * (kHeadDim + kValueHeadDim) / kThreads bytes a
/// thread: 32 registers at head dim 128, 128 threads, 64 rows).
///
/// Threads map to rows and 16-code chunks as in Float8TileCopier (rows of
/// kThreadsPerRow threads, rows outside kv_len or keep_rows zero), except
/// that with 8 or more threads a row a quarter warp (8 threads, whose
/// STS.128 are served together) takes 4 chunks of an even row and 4 of the
/// odd row after it: the Element chunks 2c (and 2c + 1) that 8 chunks of
/// one row store land on 4 of the 8 bank groups of tile_offset's and
/// atom_offset's swizzle twice over, while the two rows' swizzles differ
/// in the lowest bit and fill all 8 (conflict-free stores without the
/// per-thread selects of kSpreadStores).
template <int kRows, int kThreads, typename Layout> struct Float8RegisterTiles {
  static constexpr int kThreadsPerRow = CodeRowThreads<kRows, kThreads>::kThreadsPerRow;
  static constexpr int kRowStep = kThreads / kThreadsPerRow;
  static constexpr int kTrips = kRows / kRowStep;
  /// Rows paired across quarter warps (above).
  static constexpr bool kPairRows = kThreadsPerRow >= 8 && kRowStep % 2 == 0;
  static_assert(kKvFloat8 == 0 ||
                    (kThreads % kThreadsPerRow == 0 && kRows % kRowStep == 0 && kRows <= 64),
                "uneven code tile load");
  Chunk16 k[kTrips], v[kTrips];
  const char *k_bytes;
  const char *v_bytes;
  int first_row;
  int column; // the thread's first code of a row
  int64_t k_page_bytes, k_slot_bytes, v_page_bytes, v_slot_bytes;

  PAGEDC_DEVICE Float8RegisterTiles(const void *k_head, // [pages, page_size, D] codes
                                    const void *v_head, // [pages, page_size, Dv] codes
                                    int thread, const int64_t (&k_stride)[3],
                                    const int64_t (&v_stride)[3])
      : k_page_bytes(k_stride[1]), k_slot_bytes(k_stride[2]), v_page_bytes(v_stride[1]),
        v_slot_bytes(v_stride[2]) {
    const int at = thread % (2 * kThreadsPerRow);
    const int pair_row = kPairRows ? (at / kThreadsPerRow) ^ ((at / 4) & 1) : at / kThreadsPerRow;
    first_row = kPairRows ? 2 * (thread / (2 * kThreadsPerRow)) + pair_row
                          : thread / kThreadsPerRow;
    column = (thread % kThreadsPerRow) * 16;
    k_bytes = static_cast<const char *>(k_head) + column;
    v_bytes = static_cast<const char *>(v_head) + column;
    opaque(k_bytes);
    opaque(v_bytes);
  }

  /// Loads rows [kv_begin, kv_begin + kRows); a row past kv_len or whose
  /// bit in keep_rows is clear is zero (code 0 is +0) and not read.
  template <typename PageOf>
  PAGEDC_DEVICE void load(PageOf page_of, int kv_begin, int kv_len,
                          uint64_t keep_rows = ~static_cast<uint64_t>(0)) {
#pragma unroll
    for (int i = 0; i < kTrips; ++i) {
      const int row = first_row + i * kRowStep;
      const int kv = kv_begin + row;
      const bool valid = kv < kv_len && ((keep_rows >> row) & 1);
      k[i] = Chunk16{};
      v[i] = Chunk16{};
      if (valid) {
        const int64_t page = page_of(kv);
        const int64_t slot = kv & (kPageSize - 1);
        if (kThreadsPerRow == kKeyCodeChunks || column < 16 * kKeyCodeChunks)
          load_code_chunk(k[i], k_bytes + page * k_page_bytes + slot * k_slot_bytes);
        if (kThreadsPerRow == kValueCodeChunks || column < 16 * kValueCodeChunks)
          load_code_chunk(v[i], v_bytes + page * v_page_bytes + slot * v_slot_bytes);
      }
    }
  }

  /// Converts the held codes (Float8.cuh, as convert_code_tiles does) and
  /// stores the Element tiles at k_tile and v_tile.
  PAGEDC_DEVICE void store(unsigned char *k_tile, unsigned char *v_tile) const {
    const int chunk = column / 16;
#pragma unroll
    for (int i = 0; i < kTrips; ++i) {
      const int row = first_row + i * kRowStep;
      if (kThreadsPerRow == kKeyCodeChunks || chunk < kKeyCodeChunks)
        store_code_chunk<Layout, false>(k_tile, row, chunk, k[i]);
      if (kThreadsPerRow == kValueCodeChunks || chunk < kValueCodeChunks)
        store_code_chunk<Layout, false>(v_tile, row, chunk, v[i]);
    }
  }

};

} // namespace pagedc
