#!/usr/bin/env python3
"""Seeded kernel bugs, each of which the SIMT emulator must detect.

  seeded_bugs.py TEMPLATES WORKDIR EXAMPLES [BUG... | --group=GROUP]
                 [--module-python=PYTHON --module-dir=DIR]

For each bug: copies one template from TEMPLATES with a small patch applied
(the patch must match exactly once, so a template change cannot silently
turn a bug into a no-op), runs `pagedc run --device emu` with
PAGEDC_TEMPLATE_DIR pointing at the patched copy (the documented test seam),
or, for BatchAttention's packed kernels, packed_step.py through the Python
package (--module-python, --module-dir), and classifies the outcome:

  detected by CHECKER   the run failed with a "pagedc-emu: CHECKER:" report
  detected numerically  the run succeeded but its output is off the float64
                        reference (relative L2 > 1e-2) or not finite, or its
                        lse is (by more than 5e-2 anywhere)
  NOT DETECTED          neither

Prints one line per bug and a total; exits 1 unless every bug is detected
and the unpatched templates give a clean, correct run.
"""
import math
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "Runtime", "Inputs"))
from compare_npy import read_npy  # noqa: E402

# Patches that seed the same bug in two kernels' runs (text, replacement).
KV_LIMIT_PAST_KV_LEN = (
    "  const int kv_limit[2] = {visible[0] ? kv_len : 0, visible[1] ? kv_len : 0};",
    "  const int kv_limit[2] = {visible[0] ? kv_len + 64 : 0, visible[1] ? kv_len + 64 : 0};")
MASK_ON_FULL_BLOCKS = ("keep = keep && (!check_mask[half] ||\n",
                       "keep = keep && (check_mask[half] ||\n")
# A mask's key-only values (mask_col) taken at the next key: at each
# document's edge a row keeps a key of the document before and drops its
# own diagonal (numerically, on the document runs).
MASK_COLUMN_OF_NEXT_KEY = ("key_values[column] = pagedc_mods::mask_col(params, kv);",
                           "key_values[column] = pagedc_mods::mask_col(params, kv + 1);")

# name: (template, text, replacement, run); or (template, [(text,
# replacement), ...], None, run) for a bug of several edits.
BUGS = {
    "no-trailing-syncthreads": (
        "Prefill.cuh",
        "      __syncthreads();\n      list = next_list;\n",
        "      list = next_list;\n",
        "prefill"),
    "wait-group-2": (
        "Prefill.cuh",
        "      cp_async_wait<1>();\n      __syncthreads();\n      if constexpr (kKvFloat8 != 0) {",
        "      cp_async_wait<2>();\n      __syncthreads();\n      if constexpr (kKvFloat8 != 0) {",
        "prefill"),
    "page-index-off-by-one": (
        "KernelCommon.cuh",
        "kv < kv_end ? page_row[kv >> kLog2PageSize] : missing;",
        "kv < kv_end ? page_row[(kv >> kLog2PageSize) + 1] : missing;",
        "prefill"),
    # The mma.sync prefill's staged pages: the slots rewritten before the
    # barrier that orders this iteration's copies (which read them) first.
    "prefill-page-slots-written-before-copies-read": (
        "Prefill.cuh",
        "      staged = after_list < visits.list_count ? stage_page(kv_after) : 0;\n",
        "      staged = after_list < visits.list_count ? stage_page(kv_after) : 0;\n"
        "      if (thread < kPrefillTilePages)\n        page_slots[thread] = staged;\n",
        "prefill"),
    # Compact page addressing (kv_row_bytes): the row's slot in its page
    # dropped, so every row of a page reads the page's first row.
    "kv-row-bytes-without-slot": (
        "KernelCommon.cuh",
        "  return page * kPageBytes + (kv & (kPageSize - 1)) * kRowBytes;",
        "  return page * kPageBytes;",
        "decode"),
    # K and V share a row's offset: V's copy taken from K's head instead.
    "v-copied-from-k-head": (
        "KernelCommon.cuh",
        "      const char *v_source = v_bytes + row_bytes;",
        "      const char *v_source = k_bytes + row_bytes;",
        "prefill"),
    # A thread copies two chunks of a row, half a row apart: V's second
    # chunk taken from the first's source.
    "v-second-chunk-from-first": (
        "KernelCommon.cuh",
        "        cp_async_16(v_tile + offset, v_source + 16 * at, valid ? 16 : 0);",
        "        cp_async_16(v_tile + offset, v_source, valid ? 16 : 0);",
        "decode"),
    "swapped-ldmatrix-lanes": (
        "KernelCommon.cuh",
        "  int row = row_base + (lane & 15);\n  int chunk = k_step * 2 + (lane >> 4);",
        "  int row = row_base + ((lane < 2 ? lane ^ 1 : lane) & 15);\n"
        "  int chunk = k_step * 2 + (lane >> 4);",
        "prefill"),
    "no-zero-fill-past-kv-len": (
        "KernelCommon.cuh",
        [("          cp_async_16(k_tile + offset, k_source + 16 * at, valid ? 16 : 0);",
          "          if (valid)\n"
          "            cp_async_16(k_tile + offset, k_source + 16 * at, 16);"),
         ("          cp_async_16(v_tile + offset, v_source + 16 * at, valid ? 16 : 0);",
          "          if (valid)\n"
          "            cp_async_16(v_tile + offset, v_source + 16 * at, 16);")],
        None,
        "prefill"),
    "shuffle-in-lane-dependent-branch": (
        "KernelCommon.cuh",
        "PAGEDC_DEVICE float quad_max(float value) {\n"
        "  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));",
        "PAGEDC_DEVICE float quad_max(float value) {\n"
        "  if ((threadIdx.x & 1) == 0)\n"
        "    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));",
        "prefill"),
    "block-mask-index-past-end": (
        "KernelCommon.cuh",
        "    partial_count = args.kv_num_blocks[mask_row_index];",
        "    partial_count = args.kv_num_blocks[mask_row_index] + 1;",
        "prefill"),
    # 32 query rows per warp (the D 64 prefill): the second 16-row tile
    # multiplies the first tile's Q rows, or the first tile's P.
    "second-row-tile-reads-first-q-rows": (
        "Prefill.cuh",
        "load_query_fragment(q_regs[m][k_step], q_tile, warp_row + 16 * m,",
        "load_query_fragment(q_regs[m][k_step], q_tile, warp_row,",
        "prefill"),
    "row-tiles-share-one-p-fragment": (
        "KernelCommon.cuh",
        "        mma_16816(out[m][2 * pair], a[m], b[0], b[1]);",
        "        mma_16816(out[m][2 * pair], a[0], b[0], b[1]);",
        "prefill"),
    "merge-reads-unwritten-split": (
        "Decode.cuh",
        "    DecodeRow info = decode_row(row, kv_head, head_chunk, q_rows());\n"
        "    if (!info.valid)\n      continue;\n"
        "    float x = merged",
        "    DecodeRow info = decode_row(row, kv_head, head_chunk, q_rows());\n"
        "    if (!info.valid || (!single_split && split == args.num_splits - 1))\n"
        "      continue;\n"
        "    float x = merged",
        "decode"),
    # Decode over a block mask (the "window" run): the visible-range
    # reduction and the kept-key bits of partial tiles.
    "decode-range-read-before-barrier": (
        "Decode.cuh",
        "      range_words[4 + warp] = last;\n    }\n    __syncthreads();\n",
        "      range_words[4 + warp] = last;\n    }\n",
        "window"),
    "decode-keep-bits-lose-upper-half": (
        "Decode.cuh",
        "          keep_bits[listed] = (static_cast<uint64_t>(keep_words[1] | keep_words[3]) << 32) |\n"
        "                              (keep_words[0] | keep_words[2]);",
        "          keep_bits[listed] = static_cast<uint64_t>(keep_words[0] | keep_words[2]);",
        "window"),
    "decode-keep-words-written-without-barrier": (
        "Decode.cuh",
        "        const unsigned ballot = __ballot_sync(0xffffffffu, kept);\n        __syncthreads();\n",
        "        const unsigned ballot = __ballot_sync(0xffffffffu, kept);\n",
        "window"),
    "decode-list-counts-read-before-barrier": (
        "Decode.cuh",
        "    load_list_counts(args, kv_head, head_chunk, b, q_offset, thread, list_counts);\n"
        "    __syncthreads();\n",
        "    load_list_counts(args, kv_head, head_chunk, b, q_offset, thread, list_counts);\n",
        "window"),
    # The staged pages of the tile after next stored before the barrier
    # that orders them after this iteration's copies read the slots.
    "decode-page-slots-written-before-copies-read": (
        "Decode.cuh",
        "    staged = after < tiles ? stage_page(after) : 0;\n",
        "    staged = after < tiles ? stage_page(after) : 0;\n"
        "    if (thread < kDecodeTilePages)\n      page_slots[thread] = staged;\n",
        "decode"),
    "decode-every-row-from-first-page-slot": (
        "Decode.cuh",
        "    copy_kv(k_tile, v_tile, StagedPages{page_slots, kv_begin}, kv_begin, split_end, keep_rows);",
        "    copy_kv(k_tile, v_tile, [&](int) { return page_slots[0]; }, kv_begin, split_end,\n"
        "            keep_rows);",
        "decode"),
    # A thread's second row (lane / 4 + 8) treated as padding although the
    # CTA has 16 rows (GQA 16): rows 8-15 get no softmax.
    "decode-second-row-taken-for-padding": (
        "Decode.cuh",
        "constexpr int kRowHalves = kDecodeRows <= 8 ? 1 : 2;",
        "constexpr int kRowHalves = kDecodeRows <= 16 ? 1 : 2;",
        "decode-gqa16"),
    # Decode tiles that every row sees as full take apply_mods' all_kept
    # path (no mask, no kv_len test): a tile past the split's end taken
    # for one (its zero-filled keys then count), a partial block taken for
    # a full one (the window's edge unmasked), the block of a tile taken
    # from a shift one short (a block past the split's: never classified).
    "decode-all-kept-past-split-end": (
        "Decode.cuh",
        "      all_kept = (tile_seen[block] & kAllFull) && kv_begin + kDecodeTileN <= split_end;",
        "      all_kept = tile_seen[block] & kAllFull;",
        "decode-softcap"),
    "decode-partial-block-taken-for-full": (
        "Decode.cuh",
        "          all_full = all_full && block_class == 2;",
        "          all_full = all_full && block_class != 0;",
        "window"),
    "decode-tile-block-shift-one-short": (
        "Decode.cuh",
        "(31 - __clz(static_cast<int>(block_size)) - kLog2DecodeTileN));",
        "(30 - __clz(static_cast<int>(block_size)) - kLog2DecodeTileN));",
        "window"),
    # The warpgroup prefill (PrefillWgmma.cuh): mbarrier ring, cp.async
    # gathers arriving on it, wgmma.
    # Decode's tensor-map copies (sm_90 code, pages of 16 rows and more):
    # the wait for the stage's full mbarrier left out.
    "decode-tma-no-full-wait": (
        "Decode.cuh",
        "        mbarrier_wait(full_bars + 8 * at_stage, (phases >> at_stage) & 1u);\n",
        "",
        "decode-d128"),
    # The parity of a stage's barrier never flipped: its second fill is
    # taken for done by the first's completed phase.
    "decode-tma-parity-not-flipped": (
        "Decode.cuh",
        "        phases ^= 1u << at_stage;\n",
        "",
        "decode-d128"),
    # The expected bytes 16 short: the phase completes before the last box.
    "decode-tma-expect-tx-short": (
        "Decode.cuh",
        "mbarrier_arrive_expect_tx(bar, 2u * kDecodeStageBytes);",
        "mbarrier_arrive_expect_tx(bar, 2u * kDecodeStageBytes - 16);",
        "decode-d128"),
    # Every box of a tile from the tile's first page.
    "decode-tma-every-box-from-first-page": (
        "Decode.cuh",
        "kv_begin & (kPageSize - 1), page_slots[page],",
        "kv_begin & (kPageSize - 1), page_slots[0],",
        "decode-d128"),
    # The scores read K as rows (tile_offset) while the tensor maps and the
    # gather wrote atoms (at head dim 64 the two layouts coincide).
    "decode-scores-read-rows-not-atoms": (
        "Decode.cuh",
        "    warp_scores<kNTiles, kDecodeQInRegisters, DecodeTile>(",
        "    warp_scores<kNTiles, kDecodeQInRegisters>(",
        "decode-d128"),
    "wgmma-consumer-skips-full-wait": (
        "PrefillWgmma.cuh",
        "      mbarrier_wait(full + 8 * stage, (visit / kStages) & 1);\n",
        "",
        "wgmma"),
    "wgmma-stage-reused-before-release": (
        "PrefillWgmma.cuh",
        "  mbarrier_wait(empty_bar, empty_parity);\n  if (thread < kTilePages)\n",
        "  if (thread < kTilePages)\n",
        "wgmma"),
    "wgmma-full-barrier-count-short": (
        "PrefillWgmma.cuh",
        "      mbarrier_init(full + 8 * s, 128);",
        "      mbarrier_init(full + 8 * s, 127);",
        "wgmma"),
    "wgmma-no-proxy-fence": (
        "PrefillWgmma.cuh",
        "        if (kKvFloat8 == 0 && !by_tensor_maps(kv_begin, kv_len))\n"
        "          fence_proxy_async();\n",
        "",
        "wgmma"),
    # With tensor maps only gathered tiles and Q need the proxy fence: the
    # gathered tail tile taken for a tensor-map one, and Q's copy never
    # fenced (its first tiles come by tensor maps).
    "tma-gathered-tail-unfenced": (
        "PrefillWgmma.cuh",
        "        if (kKvFloat8 == 0 && !by_tensor_maps(kv_begin, kv_len))\n",
        "        if (kKvFloat8 == 0 && !(kTmaPages && wg.tensor_maps != 0))\n",
        "wgmma-tma"),
    "tma-q-unfenced": (
        "PrefillWgmma.cuh",
        "    mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);\n"
        "    fence_proxy_async();\n",
        "    mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);\n",
        "wgmma-tma"),
    # The overlapped O += P V (one tile's PV in flight while the next
    # tile's S and softmax run) with its stage released before it
    # completes (at head dims <= 128 the release after the last tile's
    # PV, which finish_pv does, has no later writer to race with); the
    # producer warpgroup's gather copying every row from the tile's first
    # page, or from its first row's slot; its page indices staged in
    # shared memory read before the producer barrier, or in one buffer that
    # the next tile overwrites while this one's copies still read it.
    "wgmma-pending-stage-released-before-pv-wait": (
        "PrefillWgmma.cuh",
        "          if (rescale_out) {\n            wait_pending_pv(o_acc);\n",
        "          if (pending)\n            mbarrier_arrive(empty + 8 * pending_stage);\n"
        "          pending = false;\n"
        "          if (rescale_out) {\n            wait_pending_pv(o_acc);\n",
        "wgmma"),
    # O's rescale by the last tile's factors, done under the next tile's
    # S: left out there, or written again right after the P V is issued
    # (O written while that wgmma runs: on the GPU a race, on the emulator
    # lost to the wgmma's result, so only synccheck sees it), or left out
    # before the last tile's P V. (On a run whose scores climb along the
    # keys: a row's reference max moves only when a tile passes it by more
    # than 2^8, which random scores never do after the first tile.)
    "wgmma-rescale-dropped-under-s": (
        "PrefillWgmma.cuh",
        "            rescale_rows(out, o_factor);\n          }\n",
        "          }\n",
        "wgmma-rescale"),
    "wgmma-rescale-written-under-pv": (
        "PrefillWgmma.cuh",
        "          issue_pv(o_acc, p_pending, v_pending);\n          wgmma_commit();\n"
        "          if (ping_pong)\n",
        "          issue_pv(o_acc, p_pending, v_pending);\n          wgmma_commit();\n"
        "          if (o_rescale)\n            rescale_rows(out, o_factor);\n"
        "          if (ping_pong)\n",
        "wgmma-rescale"),
    # The reference max of softmax_tile never moved after a row's first
    # tile (the headroom test dropped): the climbing scores overflow f32.
    "max-never-moves-after-first-tile": (
        "KernelCommon.cuh",
        "tile_max - state.max[half] > kMaxHeadroom ? tile_max : state.max[half];",
        "state.max[half] == -infinity() ? tile_max : state.max[half];",
        "wgmma-rescale"),
    # The warpgroup prefill's softmax without the row maximum (kernels with
    # no score mod; causal runs whose raw scores climb along the keys): its
    # vote on the row sums dropped, so overflowing probabilities stand; the
    # fix-up by powers of two leaving O's factor at 1; the overflow path's
    # recomputed scores taking the thread's first row for its second too.
    "fast-softmax-unchecked": (
        "PrefillWgmma.cuh",
        "          if (__ballot_sync(0xffffffffu, !(tile_sum[0] <= kFastSumLimit &&\n"
        "                                           tile_sum[1] <= kFastSumLimit)) == 0) {",
        "          if (true) {",
        "wgmma-climb-n128"),
    # ... and, on the plain causal run (random inputs: after each warp's
    # first tile every tile stands), a standing tile's row sums counted
    # twice: shows that the fast path is what such runs take.
    "fast-softmax-standing-sum-doubled": (
        "PrefillWgmma.cuh",
        "            state.sum[0] += tile_sum[0];",
        "            state.sum[0] += 2.0f * tile_sum[0];",
        "wgmma"),
    "fast-softmax-fixup-leaves-o": (
        "KernelCommon.cuh",
        "    rescale[half] = factor;\n    state.max[half] += static_cast<float>(exponent);",
        "    rescale[half] = 1.0f;\n    state.max[half] += static_cast<float>(exponent);",
        "wgmma-climb"),
    "fast-softmax-recompute-one-row": (
        "PrefillWgmma.cuh",
        "q_rows + atom_offset(64, row + 8, chunk) + within",
        "q_rows + atom_offset(64, row, chunk) + within",
        "wgmma-climb-n128"),
    "wgmma-last-rescale-dropped": (
        "PrefillWgmma.cuh",
        "      if (o_rescale)\n        rescale_rows(out, o_factor);\n      finish_pv(",
        "      finish_pv(",
        "wgmma-rescale"),
    # The next visit looked up under the wgmmas: the lookup advanced from
    # the wrong visit (the tile after next), so every other tile is skipped.
    "wgmma-next-visit-skips-one": (
        "PrefillWgmma.cuh",
        "      visits.advance(next_list, next_sub);\n",
        "      visits.advance(next_list, next_sub);\n      visits.advance(next_list, next_sub);\n",
        "wgmma"),
    "wgmma-gather-rows-share-first-page": (
        "PrefillWgmma.cuh",
        "(k_tile, v_tile, StagedPages{slots, kv_begin}",
        "(k_tile, v_tile, [&](int) { return slots[0]; }",
        "wgmma"),
    "wgmma-page-slots-read-before-barrier": (
        "PrefillWgmma.cuh",
        "    slots[thread] = lookup;\n  named_barrier_sync(kProducerBarrier, 128);\n  copy_kv",
        "    slots[thread] = lookup;\n  copy_kv",
        "wgmma"),
    "wgmma-page-slots-one-buffer": (
        "PrefillWgmma.cuh",
        "        int32_t *slots = page_slots + (gathered & 1) * kTilePages;\n",
        "        int32_t *slots = page_slots;\n",
        "wgmma"),
    # The copier (all three kernels; run here on the warpgroup producer's
    # gather): each row's offset taken from its neighbour's slot in the
    # page. (The thread's first row's slot would be no bug at page 16:
    # a thread's rows are 16 apart since it copies two chunks of each.)
    "wgmma-gather-slot-of-wrong-row": (
        "KernelCommon.cuh",
        "      const int64_t row_bytes = valid ? kv_row_bytes(page, kv) : 0;\n",
        "      const int64_t row_bytes = valid ? kv_row_bytes(page, kv ^ 1) : 0;\n",
        "wgmma"),
    # The warpgroup prefill's tensor-map copies (the default; set
    # explicitly, PAGEDC_PREFILL_TMA=1): the
    # full mbarrier told to expect K's bytes only, thread 0 copying into a
    # stage its consumers have not released, every box read from the
    # tile's first page.
    "tma-expect-tx-short": (
        "PrefillWgmma.cuh",
        "  mbarrier_arrive_expect_tx(full_bar, 2u * kBlockN * kRowBytes);\n",
        "  mbarrier_arrive_expect_tx(full_bar, 1u * kBlockN * kRowBytes);\n",
        "wgmma-tma"),
    "tma-stage-reused-before-release": (
        "PrefillWgmma.cuh",
        "  mbarrier_wait(empty_bar, empty_parity);\n  if constexpr (kRunBoxes)\n",
        "  if constexpr (kRunBoxes)\n",
        "wgmma-tma"),
    "tma-every-box-from-first-page": (
        "PrefillWgmma.cuh",
        "    pages[i] = page_row[(kv_begin >> kLog2PageSize) + i];\n",
        "    pages[i] = page_row[kv_begin >> kLog2PageSize];\n",
        "wgmma-tma"),
    # Page runs (a tile of consecutive pages in one box per 64 head dims;
    # the allocator's descending runs land page-reversed): the consumers
    # reading the columns unreversed, the descending run's box taken from
    # its first page instead of its lowest, and the column XOR written
    # after the producer's arrival (which no longer orders it).
    "tma-run-columns-not-reversed": (
        "PrefillWgmma.cuh",
        "              ? stage_xor[stage]\n",
        "              ? 0\n",
        "wgmma-runs"),
    "tma-run-box-from-first-page": (
        "PrefillWgmma.cuh",
        "const int lowest = up ? pages[s * kRunPages] : pages[s * kRunPages + kRunPages - 1];",
        "const int lowest = pages[s * kRunPages];",
        "wgmma-runs"),
    # A 128-key tile in two run boxes (segments of 64 rows; pages reserved
    # 4 at a time): the second segment's box landing on the first's rows.
    "tma-run-segments-at-tile-start": (
        "PrefillWgmma.cuh",
        "const uint32_t row_offset = static_cast<uint32_t>(s) * kRunRows * 128;",
        "const uint32_t row_offset = 0;",
        "wgmma-runs-n128"),
    "tma-run-xor-written-after-arrive": (
        "PrefillWgmma.cuh",
        "  if constexpr (kRunBoxes)\n    *column_xor = down ? kRunReversed : 0;\n"
        "  mbarrier_arrive_expect_tx(full_bar, 2u * kBlockN * kRowBytes);\n",
        "  mbarrier_arrive_expect_tx(full_bar, 2u * kBlockN * kRowBytes);\n"
        "  if constexpr (kRunBoxes)\n    *column_xor = down ? kRunReversed : 0;\n",
        "wgmma-runs"),
    # The decode kernel's page runs: its columns read unreversed, and a
    # descending run's box taken from its first page.
    "decode-run-columns-not-reversed": (
        "Decode.cuh",
        "tile_xor = mapped ? stage_xor[stage] : 0;",
        "tile_xor = mapped ? 0 : 0;",
        "decode-runs"),
    "decode-run-box-from-first-page": (
        "Decode.cuh",
        "page_slots[up ? 0 : kDecodeTilePages - 1], kv_head};",
        "page_slots[0], kv_head};",
        "decode-runs"),
    # Ping-pong consumer warpgroups (PAGEDC_PREFILL_PINGPONG=1): the first
    # turn never given, a warpgroup handing the turn to itself.
    "pingpong-first-turn-never-given": (
        "PrefillWgmma.cuh",
        "  if (ping_pong && group == 1)\n    named_barrier_arrive(kTurnBarrier, 256);\n",
        "",
        "wgmma-pingpong"),
    "pingpong-turn-handed-to-self": (
        "PrefillWgmma.cuh",
        "          named_barrier_arrive(kTurnBarrier + (group ^ 1), 256);\n",
        "          named_barrier_arrive(kTurnBarrier + group, 256);\n",
        "wgmma-pingpong"),
    # Persistent CTAs (PAGEDC_PREFILL_PERSISTENT=1; a few CTAs, so that
    # each takes several query tiles): the producer copying a Q tile into a
    # buffer the consumers still read (its wait dropped, or the consumers'
    # release moved before their S products), the consumers waiting for a
    # round's Q on the first round's phase, and the consumers walking the
    # snaking rounds in another order than the producer (these with
    # PAGEDC_PREFILL_TILE_COUNTER=0: fixed rounds).
    "persistent-q-copied-without-empty-wait": (
        "PrefillWgmma.cuh",
        "      if (!counted)\n"
        "        mbarrier_wait(q_empty + 8 * q_buffer, ((round / kQBuffers) & 1) ^ 1);\n",
        "",
        "wgmma-persistent-snake"),
    "persistent-q-released-before-products": (
        "PrefillWgmma.cuh",
        [("    mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);\n"
          "    fence_proxy_async();\n",
          "    mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);\n"
          "    fence_proxy_async();\n    mbarrier_arrive(q_empty + 8 * q_buffer);\n"),
         ("    if (!staged_out)\n      mbarrier_arrive(q_empty + 8 * q_buffer);\n", ""),
         ("      }\n      mbarrier_arrive(q_empty + 8 * q_buffer);\n    }\n", "      }\n    }\n")],
        None,
        "wgmma-persistent"),
    "persistent-q-waited-on-first-phase": (
        "PrefillWgmma.cuh",
        "tile.\n    mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);\n",
        "tile.\n    mbarrier_wait(q_full + 8 * q_buffer, 0);\n",
        "wgmma-persistent-snake"),
    "persistent-consumers-without-snake": (
        "PrefillWgmma.cuh",
        "    } else {\n      tile_index = prefill_round_tile(round);\n    }\n",
        "    } else {\n      tile_index = int64_t(round) * gridDim.x + blockIdx.x;\n    }\n",
        "wgmma-persistent-snake"),
    # The work counter (the default with persistent CTAs): the producer
    # writing the next tile's slot (and Q) before the consumers released the
    # buffer, the consumers reading the slot before the producer's arrival
    # that publishes it, and producer thread 0 handing every round's tile to
    # the others through one word (its next round's write races their reads
    # of this round's: tensor-map copies have no producer barrier between).
    "counter-slot-written-without-empty-wait": (
        "PrefillWgmma.cuh",
        "        // The slot is the consumers' until they release the buffer.\n"
        "        mbarrier_wait(q_empty + 8 * q_buffer, ((round / kQBuffers) & 1) ^ 1);\n",
        "",
        "wgmma-persistent"),
    "counter-round-tile-one-word": (
        "PrefillWgmma.cuh",
        [("          round_tiles[round & 1] = taken;\n", "          round_tiles[0] = taken;\n"),
         ("        tile_index = round_tiles[round & 1];\n", "        tile_index = round_tiles[0];\n")],
        None,
        "wgmma-persistent"),
    "counter-slot-read-before-full-wait": (
        "PrefillWgmma.cuh",
        "      mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);\n"
        "      tile_index = tile_slots[q_buffer];\n",
        "      tile_index = tile_slots[q_buffer];\n"
        "      mbarrier_wait(q_full + 8 * q_buffer, (round / kQBuffers) & 1);\n",
        "wgmma-persistent"),
    # The staged epilogue: a warpgroup's threads store O rows that other
    # warps wrote into shared memory without the barrier between.
    "epilogue-stored-before-barrier": (
        "PrefillWgmma.cuh",
        "      named_barrier_sync(kEpilogueBarrier + group, 128);\n",
        "",
        "wgmma"),
    # ... and hand the Q buffer back before reading O out of it, so the
    # producer's copy of a later tile's Q may overwrite the rows (persistent
    # CTAs with two Q buffers stage O too).
    "epilogue-q-buffer-released-before-read": (
        "PrefillWgmma.cuh",
        "    if (!staged_out)\n      mbarrier_arrive(q_empty + 8 * q_buffer);\n",
        "    mbarrier_arrive(q_empty + 8 * q_buffer);\n",
        "wgmma-persistent"),
    # apply_mods' masked path (all three kernels): a key's limit, kv_len for
    # a row that sees the tile, taken 64 keys too far - the keys past
    # kv_len of a last tile that ends past it are kept (no mask in these
    # runs, so only the limit drops them).
    "masked-path-keeps-keys-past-kv-len": ("KernelCommon.cuh", *KV_LIMIT_PAST_KV_LEN,
                                           "decode-softcap"),
    "wgmma-masked-path-keeps-keys-past-kv-len": ("KernelCommon.cuh", *KV_LIMIT_PAST_KV_LEN,
                                                 "wgmma-rescale"),
    # ... and the mask mod's result taken on full blocks instead of partial
    # ones: the causal diagonal keeps its future keys.
    "mask-dropped-on-partial-blocks": ("KernelCommon.cuh", *MASK_ON_FULL_BLOCKS, "prefill"),
    "wgmma-mask-dropped-on-partial-blocks": ("KernelCommon.cuh", *MASK_ON_FULL_BLOCKS, "wgmma"),
    "mask-columns-of-the-next-key": ("KernelCommon.cuh", *MASK_COLUMN_OF_NEXT_KEY, "document"),
    # The warpgroup prefill stages a partial tile's key-only values in
    # shared memory, one key a thread (at head dim 64: document_causal's
    # 8 bytes a key do not fit beside three K/V stages at 128): the key
    # after the thread's.
    "wgmma-mask-columns-of-the-next-key": (
        "PrefillWgmma.cuh",
        "pagedc_mods::mask_col(params, kv_begin + (consumer & 127));",
        "pagedc_mods::mask_col(params, kv_begin + (consumer & 127) + 1);",
        "wgmma-document-d64"),
    # The staged values read without the barrier after their writes
    # (racecheck: another warp's shared write not ordered before the read).
    # (The barrier before a single buffer's rewrite has no seeded bug: the
    # emulator orders a warpgroup's threads at each wgmma, which the next
    # tile's S issues before the rewrite.)
    "wgmma-staged-columns-read-before-barrier": (
        "PrefillWgmma.cuh",
        "              ++staged;\n              named_barrier_sync(kColumnBarrier + group, 128);\n",
        "              ++staged;\n",
        "wgmma-document-d64"),
    # The producer's and consumers' setmaxnreg counts swapped: the producer
    # warpgroup's .dec asks for more registers than it holds and the
    # consumers' .inc for fewer (synccheck's register accounting).
    "wgmma-setmaxnreg-counts-swapped": (
        "PrefillWgmma.cuh",
        [("    setmaxnreg_dec<kProducerRegisters>();\n",
          "    setmaxnreg_dec<kConsumerRegisters>();\n"),
         ("  setmaxnreg_inc<kConsumerRegisters>();\n", "  setmaxnreg_inc<kProducerRegisters>();\n")],
        None,
        "wgmma"),
    # The decode's tensor-map copy into a stage whose bytes generic stores
    # wrote last (an earlier tile's gather, the block-mask list counts)
    # without the proxy fence before it (racecheck: the async proxy's write
    # over a generic store).
    "decode-tma-copy-over-generic-unfenced": (
        "Decode.cuh",
        "            // gather, the list counts): ordered before the copy engine's.\n"
        "            fence_proxy_async();\n",
        "",
        "decode-d128"),
    # The same copy into a stage that an earlier tile's tensor-map copy
    # wrote and whose math then read it (ld.shared and ldmatrix, the generic
    # proxy), the __syncthreads after the math ordering the reads before
    # the copy but no proxy fence after them: the fence kept only for each
    # stage's first fill (racecheck: the async proxy's write over a generic
    # read).
    "decode-tma-copy-after-reads-unfenced": (
        "Decode.cuh",
        "            // gather, the list counts): ordered before the copy engine's.\n"
        "            fence_proxy_async();\n",
        "            // gather, the list counts): ordered before the copy engine's.\n"
        "            if (which < 2)\n              fence_proxy_async();\n",
        "decode-d128"),
    # Bugs only the lse comparison, batch 2 and moving row maxima show
    # (each ran clean, undetected, on the runs without them). The lse of a
    # finished row (finish_row, the mma.sync prefill's epilogue on this
    # run) off by ln 2 (one log2 unit): the output is right.
    "prefill-lse-off-by-ln2": (
        "KernelCommon.cuh",
        "  lse = sum > 0.0f ? (base + log2f(sum)) * kLn2 : -infinity();",
        "  lse = sum > 0.0f ? (base + log2f(sum) + 1.0f) * kLn2 : -infinity();",
        "prefill"),
    # Every batch entry reads batch 0's page table: right for batch 0, and
    # for batch 1 the other sequence's K and V.
    "prefill-page-table-of-batch-0": (
        "Prefill.cuh",
        "  const int32_t *page_row = args.page_table + b * args.page_table_stride;",
        "  const int32_t *page_row = args.page_table;",
        "prefill-b2-fall"),
    # The running sum kept unscaled when the row's reference max moves:
    # random scores never move it past the headroom after the first tile,
    # scores that climb over several tiles do.
    "softmax-sum-not-rescaled": (
        "KernelCommon.cuh",
        "    state.sum[half] = state.sum[half] * rescale[half] +",
        "    state.sum[half] = state.sum[half] +",
        "prefill-b2-fall"),
    # The split-KV merge's lse taken from the first split alone (its output
    # weights stay right): only split decodes run the merge.
    "merge-lse-of-first-split": (
        "Decode.cuh",
        "      args.lse[lse_index] = total > 0.0f ? row_max + logf(total) : -infinity();",
        "      args.lse[lse_index] = lse[0];",
        "decode"),
    # The merge's column chunks: the first lane of a column pair stores its
    # own splits' sum without the other lanes' (numerically: out off the
    # reference; lse stays right).
    "merge-lane-sums-not-added": (
        "Decode.cuh",
        "      for (int other = 1; other < lanes; ++other) {",
        "      for (int other = lanes; other < lanes; ++other) {",
        "decode"),
    # The merge's lane sums read by the first lane before the barrier that
    # orders the other lanes' stores (initcheck in the first round, whose
    # slots no lane has written yet; racecheck's read-after-write after).
    "merge-lane-sums-read-before-barrier": (
        "Decode.cuh",
        "    sums_x[t] = x;\n    sums_y[t] = y;\n    __syncthreads();\n",
        "    sums_x[t] = x;\n    sums_y[t] = y;\n",
        "decode"),
    # Attention sinks applied by every split as well as by the merge: the
    # split partials' lse then hold the sink, which the merge counts once
    # per split more (numerically: out and lse off the reference).
    "decode-sink-per-split": (
        "Decode.cuh",
        "  const bool sinks_here = args.sinks != nullptr && args.num_splits == 1;",
        "  const bool sinks_here = args.sinks != nullptr;",
        "decode-sinks"),
    # The sink taken as a log2-domain logit (its natural-log value not
    # multiplied by log2(e)) where a row is finished: a sink of the scores'
    # size then weighs too little (numerically, out and lse).
    "sink-without-log2e": (
        "KernelCommon.cuh",
        "    const float sink_log2 = *sink * kLog2e;",
        "    const float sink_log2 = *sink;",
        "prefill-sinks"),
    # BatchAttention's packed kernels on a cascade step (packed_step.py):
    # the prefix level's token maps, the suffix level's kv_start. The packed
    # prefill starting every tile at key 0 (its first key, kv_start,
    # ignored): the suffix level's 12-token sequence reads the pages below
    # kv_start, which its page table holds as -1 (memcheck; numerically,
    # the prefix counted twice).
    "packed-prefill-ignores-kv-start": (
        "Prefill.cuh",
        "      return args.work_tiles[kPackedTileInts *",
        "      return 0 * args.work_tiles[kPackedTileInts *",
        "packed-cascade"),
    # The packed prefill ending a tile's keys 16 before the end the plan gave
    # it (there the sequence's kv_len: token maps leave the tiles their
    # sequences' keys): kept keys dropped (numerically).
    "packed-prefill-tile-end-short": (
        "KernelCommon.cuh",
        "  tile.kv_len = imin(args.kv_len[tile.b], work[3]);",
        "  tile.kv_len = imin(args.kv_len[tile.b], work[3] - 16);",
        "packed-cascade"),
    # The packed prefill reading the token batch map one row late: the last
    # row of each sequence in a prefix-level entry takes the next sequence's
    # window (numerically).
    "packed-prefill-token-batch-off-by-one": (
        "Prefill.cuh",
        "        return args.token_batch[recompute_here(first_row + imin(row, q_len - 1))];",
        "        return args.token_batch[recompute_here(first_row + imin(row + 1, q_len - 1))];",
        "packed-cascade"),
    # The same in the packed decode (the suffix level's decode rows; -1
    # pages: memcheck).
    "packed-decode-ignores-kv-start": (
        "Decode.cuh",
        "    kv_from = args.kv_start ? args.kv_start[b] : 0;",
        "    kv_from = 0;",
        "packed-cascade"),
    # The packed decode giving every row of an entry its first token's
    # batch index: the prefix level's decode entry packs three sequences,
    # whose windows differ (numerically).
    "packed-decode-token-batch-of-entry": (
        "Decode.cuh",
        "        b_of[half] = args.token_batch[token];",
        "        b_of[half] = args.token_batch[first_row];",
        "packed-cascade"),
    # A fixed grid's CTAs one past the step's work not exiting (the flat
    # run's; packed_step.py): a prefill tile, and a decode entry, read
    # work-list entries no plan wrote (initcheck).
    "packed-prefill-fixed-grid-one-past": (
        "Prefill.cuh",
        "        static_cast<int>(blockIdx.x) / args.heads_q >= args.work_counts[0])",
        "        static_cast<int>(blockIdx.x) / args.heads_q > args.work_counts[0])",
        "packed-cascade"),
    "packed-decode-fixed-grid-one-past": (
        "Decode.cuh",
        "static_cast<int>(blockIdx.z) >= args.work_counts[1])\n      return;\n"
        "    b = args.work_tiles[2 * blockIdx.z];\n    first_row = args.q_start[b];\n"
        "    packed_q_len",
        "static_cast<int>(blockIdx.z) > args.work_counts[1])\n      return;\n"
        "    b = args.work_tiles[2 * blockIdx.z];\n    first_row = args.q_start[b];\n"
        "    packed_q_len",
        "packed-cascade"),
    # The 8-bit decode's codes held in registers (Float8RegisterTiles):
    # the next tile's loads issued before the held tile is converted, so
    # every tile but the last is converted from its successor's codes
    # (numerically).
    "packed-f8-decode-next-tile-loaded-before-store": (
        "Decode.cuh",
        "    if constexpr (kDecodeCodeRegisters)\n"
        "      held_codes.store(shared + kDecodeQBytes, shared + kDecodeQBytes + 2 * kDecodeStageBytes);\n"
        "    const bool mapped_next = next < tiles && copy_tile(stage ^ 1, next, keep_next);\n",
        "    const bool mapped_next = next < tiles && copy_tile(stage ^ 1, next, keep_next);\n"
        "    if constexpr (kDecodeCodeRegisters)\n"
        "      held_codes.store(shared + kDecodeQBytes, shared + kDecodeQBytes + 2 * kDecodeStageBytes);\n",
        "packed-f8-decode"),
    # Its quarter warps' row pairing lost: both halves of a 16-thread group
    # take the even row, whose chunks two threads store unordered, and the
    # odd rows are never written (racecheck or initcheck; numerically).
    "packed-f8-decode-rows-not-paired": (
        "Float8Tiles.cuh",
        "(at / kThreadsPerRow) ^ ((at / 4) & 1)",
        "(at / kThreadsPerRow) ^ ((at / 8) & 1)",
        "packed-f8-decode"),
    # The MLA decode (MlaDecode.cuh, mla_step.py). Its column warps' partial
    # scores summed before every warp has stored its own: the sum reads
    # shared memory no thread has written yet on the first tile
    # (initcheck).
    "mla-partials-summed-before-barrier": (
        "MlaDecode.cuh",
        "        my_partials[(4 * j + e) * 32] = scores[0][j][e];\n    __syncthreads();\n",
        "        my_partials[(4 * j + e) * 32] = scores[0][j][e];\n",
        "mla"),
    # The next tile's copy issued into the stage the warps are still
    # reading (the loop's closing barrier gone: racecheck).
    "mla-stage-overwritten-while-read": (
        "MlaDecode.cuh",
        "    // next iteration's copy and scores overwrite them.\n    __syncthreads();\n",
        "    // next iteration's copy and scores overwrite them.\n",
        "mla"),
    # The values read from the latent rows' rope half (columns 64 on)
    # instead of their first 512 (numerically).
    "mla-values-off-by-64-columns": (
        "MlaDecode.cuh",
        "column_warp * (kMlaColumns / 8) + pair * 2 + (lane >> 4)));",
        "column_warp * (kMlaColumns / 8) + pair * 2 + (lane >> 4) + 8));",
        "mla"),
    # The GQA-packed tiles starting every sequence at key 0 (kv_start
    # ignored): the suffix level's 9-token sequence reads the pages below
    # kv_start, which its page table holds as -1 (memcheck).
    "packed-group-ignores-kv-start": (
        "PrefillGroup.cuh",
        "  auto kv_from = [&]() -> int { return args.kv_start ? args.kv_start[recompute_here(b)] : 0; };",
        "  auto kv_from = [&]() -> int { return 0; };",
        "packed-cascade"),
    # The GQA-packed tiles reading the token batch map one token late: the
    # last token of sequence 7 in the prefix level's third entry takes
    # sequence 8's window, which sees fewer prefix keys (numerically).
    "packed-group-token-batch-off-by-one": (
        "PrefillGroup.cuh",
        "    ids.b = args.token_batch ? args.token_batch[first_row + info.token] : b;",
        "    ids.b = args.token_batch\n"
        "                ? args.token_batch[first_row + imin(info.token + 1, q_len - 1)]\n"
        "                : b;",
        "packed-cascade"),
    # The GQA-packed tiles' second 16-row block of each 32-row warp (256-row
    # CTAs, head dims up to 128) taking the first block's Q fragments: the
    # prefix level's 26-row entry (13 tokens x GQA 2) has rows 16-25 there,
    # which then compute rows 0-9's attention (numerically).
    "packed-group-second-block-reads-first-q": (
        "PrefillGroup.cuh",
        "        load_query_fragment(q_regs[m][k_step], q_tile, warp_row + 16 * m, k_step, lane);",
        "        load_query_fragment(q_regs[m][k_step], q_tile, warp_row, k_step, lane);",
        "packed-cascade"),
}


def make_npy(path, shape, seed, climb=None, extra=()):
    subprocess.run([sys.executable,
                    os.path.join(os.path.dirname(__file__), "..", "..", "Runtime", "Inputs",
                                 "make_npy.py"),
                    path, "--shape", ",".join(map(str, shape)), "--seed", str(seed)] +
                   (["--climb", climb] if climb else []) + list(extra),
                   check=True)


# Documents packed into the prefill runs' 300 keys, none a multiple of the
# 64-key tiles: examples/document_mask.attn's buffers.
DOCUMENTS = [37, 70, 53, 90, 50]


# Natural-log units: bf16 inputs move a row's lse by ~1e-3; the bugs it
# guards against by ln 2 or more.
LSE_TOLERANCE = 5e-2


def lse_path(out_path):
    return out_path[:-len(".npy")] + "-lse.npy"


def lse_error(a_path, b_path):
    """The largest |lse - reference| (rows both give -inf agree)."""
    _, a = read_npy(a_path)
    _, b = read_npy(b_path)
    worst = 0.0
    for x, y in zip(a, b):
        if math.isinf(x) and math.isinf(y) and x < 0 and y < 0:
            continue
        if math.isnan(x) or math.isinf(x) or math.isinf(y):
            return math.inf
        worst = max(worst, abs(x - y))
    return worst


def rel_l2(a_path, b_path):
    _, a = read_npy(a_path)
    _, b = read_npy(b_path)
    if any(math.isnan(x) or math.isinf(x) for x in a):
        return math.inf
    num = sum((x - y) ** 2 for x, y in zip(a, b))
    den = sum(y * y for y in b) or 1.0
    return math.sqrt(num / den)


# The bugs split into groups by the run that shows them, one lit test per
# group (seeded-bugs-*.test), which ctest runs side by side and names on a
# failure: the mma.sync and decode kernels', the warpgroup prefill's with
# one CTA per tile, its page runs and ping-pong turns, and its persistent
# CTAs with and without the work counter; the MLA decode's.
# Every warpgroup run is named here (a run missing from the table stops the
# script rather than falling out of every group); the others are "mma".
WGMMA_GROUPS = {
    "wgmma": "wgmma", "wgmma-rescale": "wgmma", "wgmma-tma": "wgmma", "wgmma-document": "wgmma",
    "wgmma-document-d64": "wgmma", "wgmma-document-one-buffer": "wgmma",
    "wgmma-climb": "wgmma", "wgmma-climb-n128": "wgmma",
    "wgmma-runs": "wgmma-launch", "wgmma-runs-n128": "wgmma-launch",
    "wgmma-pingpong": "wgmma-launch",
    "wgmma-persistent": "wgmma-persistent",
    "wgmma-persistent-snake": "wgmma-persistent-snake",
}


def group_of(run):
    if run.startswith("packed"):
        return "packed"
    if run.startswith("mla"):
        return "mla"
    return WGMMA_GROUPS[run] if run.startswith("wgmma") else "mma"


def main():
    templates, work, examples = sys.argv[1:4]
    chosen = sys.argv[4:]
    # The Python package's interpreter and directory (the packed runs'
    # driver, packed_step.py, runs BatchAttention through it).
    module = {}
    for option in ("--module-python=", "--module-dir="):
        for argument in list(chosen):
            if argument.startswith(option):
                module[option] = argument[len(option):]
                chosen.remove(argument)
    chosen = chosen or list(BUGS)
    group = None
    if len(chosen) == 1 and chosen[0].startswith("--group="):
        group = chosen[0][len("--group="):]
        if group not in set(WGMMA_GROUPS.values()) | {"mma", "packed", "mla"}:
            raise SystemExit("unknown group " + group)
        chosen = [bug for bug, (_, _, _, run) in BUGS.items() if group_of(run) == group]
    os.makedirs(work, exist_ok=True)
    # Prefill: q rows and keys not multiples of the 128-row tiles, GQA 2,
    # causal block mask, 16-token shuffled pages. Decode: one token against
    # 1100 keys, which the launch plan splits (split-KV + merge).
    document_ids = os.path.join(work, "document_id.npy")
    document_starts = os.path.join(work, "offsets.npy")
    segments = ",".join(map(str, DOCUMENTS))
    make_npy(document_ids, (sum(DOCUMENTS),), 0, extra=["--dtype", "i4", "--segments", segments])
    make_npy(document_starts, (len(DOCUMENTS),), 0,
             extra=["--dtype", "i4", "--segment-starts", segments])
    document_buffers = ["--buffer", "document_id=" + document_ids,
                        "--buffer", "offsets=" + document_starts]
    runs = {
        "prefill": dict(q=(1, 4, 150, 64), k=(1, 2, 300, 64), extra=["--q-offset", "end"]),
        # (Head dim 64: every tile gathered with cp.async.)
        "decode": dict(q=(1, 4, 1, 64), k=(1, 2, 1100, 64), extra=["--q-offset", "end"]),
        # Batch 2 (each sequence its own shuffled pages), GQA 2, and keys
        # whose dim 0 climbs by 1 up to key 150 and falls after it, against
        # queries' 2: scores climb 0.36 log2 units a key (23 a 64-key tile,
        # past the 8 of headroom) over the first tiles, so row maxima move,
        # then fall, so later tiles add little.
        "prefill-b2-fall": dict(q=(2, 2, 150, 64), k=(2, 1, 300, 64),
                                extra=["--q-offset", "end"], q_climb="2,0",
                                k_climb="0,1,150"),
        # Head dim 128: two atom columns per K/V tile; whole tiles come by
        # tensor maps (the emulator's code is sm_90's), the tail gathered.
        "decode-d128": dict(q=(1, 4, 1, 128), k=(1, 2, 1100, 128), extra=["--q-offset", "end"]),
        # Sixteen query heads on one KV head: 16 rows, both of a thread's.
        "decode-gqa16": dict(q=(1, 16, 1, 64), k=(1, 1, 1100, 64), extra=["--q-offset", "end"]),
        # Decode with a score mod and no mask: the block mask the CLI builds
        # lists every block as full, the last (keys 1024-1151) too, and the
        # last tile (1088-1151) ends past kv_len.
        "decode-softcap": dict(q=(1, 4, 1, 64), k=(1, 2, 1100, 64), attn="softcap.attn",
                               mask="", score="tanh_softcap", extra=["--q-offset", "end"]),
        # Decode with a block mask: a 250-key window whose first key (849)
        # lies in the second 64-key tile of a 128-key block, so the first
        # tile is skipped by its kept-key bits and the second loads in part.
        "window": dict(q=(1, 4, 1, 64), k=(1, 2, 1100, 64),
                       attn="sliding_window.attn", mask="sliding_window",
                       extra=["--q-offset", "end", "-D", "WINDOW=250", "--block", "16x128"]),
        # The same window over 64-key blocks: every tile starts a block.
        "window64": dict(q=(1, 4, 1, 64), k=(1, 2, 1100, 64),
                         attn="sliding_window.attn", mask="sliding_window",
                         extra=["--q-offset", "end", "-D", "WINDOW=250", "--block", "16x64"]),
        # The warpgroup prefill at head dim 128: 128 x 64 tiles, two
        # consumer warpgroups, every tile gathered with cp.async.
        "wgmma": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128), extra=["--q-offset", "end"],
                      env={"PAGEDC_PREFILL_SHAPE": "128x64x64", "PAGEDC_PREFILL_TMA": "0"}),
        # The same with no mask and a score that climbs by 1 a key (about
        # 92 log2 units a 64-key tile, visited in key order; 430 over the
        # 300 keys, past f32's range): every row moves its reference max and
        # rescales O at every tile, the last included.
        "wgmma-rescale": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128),
                              extra=["--q-offset", "end"],
                              attn=os.path.join(work, "climb.attn"), mask="", score="climb",
                              env={"PAGEDC_PREFILL_SHAPE": "128x64x64",
                                   "PAGEDC_PREFILL_TMA": "0"}),
        # Causal, no score mod (the softmax without the row maximum once a
        # warp's rows have references), on inputs whose raw scores climb
        # along the keys: query dim 0 is 2, key dim 0 the key's index, so
        # scores climb 2 · scale · log2(e) = 0.26 log2 units a key, about
        # 16 a 64-key tile, past the vote's 2^15 on every tile after the
        # first: the fix-up by powers of two on each.
        "wgmma-climb": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128),
                            extra=["--q-offset", "end"], q_climb="2,0", k_climb="1,1",
                            env={"PAGEDC_PREFILL_SHAPE": "128x64x64",
                                 "PAGEDC_PREFILL_TMA": "0"}),
        # No mods at all (every block full: the tiles are visited in key
        # order; under the causal mask a row's diagonal block comes first),
        # 128-key tiles, 250 keys and query dim 0 at 16: 2 log2 units a key,
        # so the last tile's probabilities (keys 128-249, up to ~250 above
        # the first tile's maximum) overflow ex2 and the tile's scores, which
        # decide the output, are recomputed from shared memory.
        "wgmma-climb-n128": dict(q=(1, 4, 150, 128), k=(1, 2, 250, 128), mask="",
                                 extra=["--q-offset", "end"], q_climb="16,0", k_climb="1,1",
                                 env={"PAGEDC_PREFILL_SHAPE": "128x128x64",
                                      "PAGEDC_PREFILL_TMA": "0"}),
        # The same with K/V pages copied by tensor maps (the tiles below
        # kv_len; the tail tile, keys 256-299, gathered).
        "wgmma-tma": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128), extra=["--q-offset", "end"],
                          env={"PAGEDC_PREFILL_SHAPE": "128x64x64", "PAGEDC_PREFILL_TMA": "1"}),
        # Tensor maps over pages reserved at once, which the allocator
        # hands out consecutive and descending: every tile below kv_len is
        # one page-reversed box per 64 head dims; ALiBi makes each column's
        # key count.
        "wgmma-runs": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128), extra=["--q-offset", "end"],
                           attn=os.path.join(work, "alibi_causal.attn"), score="alibi",
                           pages=["--page-size", "16"],
                           env={"PAGEDC_PREFILL_SHAPE": "128x64x64", "PAGEDC_PREFILL_TMA": "1"}),
        # 128-key tiles over pages reserved 4 at a time: each tile is two
        # descending runs of 64 rows, not one run (two boxes per 64 head dims).
        "wgmma-runs-n128": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128),
                                extra=["--q-offset", "end"],
                                attn=os.path.join(work, "alibi_causal.attn"), score="alibi",
                                pages=["--page-size", "16", "--pages-per-reserve", "4"],
                                env={"PAGEDC_PREFILL_SHAPE": "128x128x64",
                                     "PAGEDC_PREFILL_TMA": "1"}),
        # The decode kernel at head dim 128 over pages reserved at once:
        # its whole tiles come as page-reversed runs, ALiBi on every column.
        "decode-runs": dict(q=(1, 8, 1, 128), k=(1, 2, 1100, 128), extra=["--q-offset", "end"],
                            attn=os.path.join(work, "alibi_causal.attn"), score="alibi",
                            pages=["--page-size", "16"]),
        # Attention sinks of the rows' own lse size (about log 1100 after the
        # splits' merge), one per query head, the first far above every
        # score; the decode's splits leave them to the merge.
        "decode-sinks": dict(q=(1, 4, 1, 64), k=(1, 2, 1100, 64),
                             extra=["--q-offset", "end", "--sinks", "6.5,7.5,20,-30"]),
        # The mma.sync prefill with sinks (rows under the causal mask see
        # 151 to 300 keys: lse about 5 to 6).
        "prefill-sinks": dict(q=(1, 4, 150, 64), k=(1, 2, 300, 64),
                              extra=["--q-offset", "end", "--sinks", "5,6,20,-30"]),
        # Persistent CTAs: 3 for 32 query tiles (batch 4 x 4 heads x 2 tiles
        # of 128 rows), each taking the next from the work counter when it
        # is free (below: 10 or 11 each in fixed rounds), with tensor-map
        # copies and the consumer warpgroups' turns running on across
        # tiles. Causal from q 0: a tile visits 2 or 3 KV tiles, fewer than
        # the ring's stages, so the producer runs a round ahead and only
        # the Q tiles' own barriers order its copies of Q.
        "wgmma-persistent": dict(q=(4, 4, 150, 128), k=(4, 2, 150, 128), extra=[],
                                 env={"PAGEDC_PREFILL_SHAPE": "128x64x64",
                                      "PAGEDC_PREFILL_TMA": "1",
                                      "PAGEDC_PREFILL_PERSISTENT": "1",
                                      "PAGEDC_PREFILL_PERSISTENT_CTAS": "3",
                                      "PAGEDC_PREFILL_PINGPONG": "1"}),
        # The same CTAs in fixed snaking rounds (no work counter).
        "wgmma-persistent-snake": dict(q=(4, 4, 150, 128), k=(4, 2, 150, 128), extra=[],
                                       env={"PAGEDC_PREFILL_SHAPE": "128x64x64",
                                            "PAGEDC_PREFILL_TMA": "1",
                                            "PAGEDC_PREFILL_PERSISTENT": "1",
                                            "PAGEDC_PREFILL_PERSISTENT_CTAS": "3",
                                            "PAGEDC_PREFILL_TILE_COUNTER": "0",
                                            "PAGEDC_PREFILL_PINGPONG": "1"}),
        # BatchAttention's packed prefill and decode on a cascade step (see
        # packed_step.py): token maps, kv_start, the merge.
        "packed-cascade": dict(script="packed_step.py"),
        # BatchAttention's decode over 8-bit caches at head dim 128 (codes
        # held in registers; see f8_decode_step.py).
        "packed-f8-decode": dict(script="f8_decode_step.py"),
        # BatchAttention's MLA decode (see mla_step.py).
        "mla": dict(script="mla_step.py"),
        # Packed documents, causal inside each (DOCUMENTS; the queries are
        # the last 150 keys'): the mask reads document_id at the key for
        # both of a thread's rows, once (mask_col), in the mma.sync prefill
        # at 16 rows a warp (at 32 it reads them per element) and in the
        # warpgroup prefill's 128-key tiles.
        "document": dict(q=(1, 4, 150, 64), k=(1, 2, 300, 64),
                         attn="document_mask.attn", mask="document_causal",
                         extra=["--q-offset", "end"] + document_buffers,
                         env={"PAGEDC_PREFILL_SHAPE": "64x64x16"}),
        "wgmma-document": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128),
                               attn="document_mask.attn", mask="document_causal",
                               extra=["--q-offset", "end"] + document_buffers,
                               env={"PAGEDC_PREFILL_SHAPE": "128x128x64",
                                    "PAGEDC_PREFILL_TMA": "1"}),
        # At head dim 64, where the warpgroups stage the mask's key-only
        # values (two buffers each; at 128 its 8 bytes a key do not fit).
        "wgmma-document-d64": dict(q=(1, 4, 150, 64), k=(1, 2, 300, 64),
                                   attn="document_mask.attn", mask="document_causal",
                                   extra=["--q-offset", "end"] + document_buffers,
                                   env={"PAGEDC_PREFILL_SHAPE": "128x128x64",
                                        "PAGEDC_PREFILL_TMA": "1"}),
        # Documents by document_id alone (4 bytes a key): at head dim 128
        # the warpgroups stage them in one buffer each (two do not fit
        # beside three K/V stages), a barrier before each rewrite.
        "wgmma-document-one-buffer": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128),
                                          attn=os.path.join(work, "document_ids.attn"),
                                          mask="document",
                                          extra=["--q-offset", "end"] + document_buffers[:2],
                                          env={"PAGEDC_PREFILL_SHAPE": "128x128x64",
                                               "PAGEDC_PREFILL_TMA": "1"}),
        # And with its consumer warpgroups taking turns (gathered tiles).
        "wgmma-pingpong": dict(q=(1, 4, 150, 128), k=(1, 2, 300, 128),
                               extra=["--q-offset", "end"],
                               env={"PAGEDC_PREFILL_SHAPE": "128x64x64",
                                    "PAGEDC_PREFILL_TMA": "0",
                                    "PAGEDC_PREFILL_PINGPONG": "1"}),
    }
    with open(os.path.join(work, "document_ids.attn"), "w") as f:
        f.write("buffer document_id: i32[S]\n"
                "mask document(b, h, q, kv) = (document_id[q] == document_id[kv]) & (q >= kv)\n")
    with open(os.path.join(work, "climb.attn"), "w") as f:
        f.write("score climb(s, b, h, q, kv) = s + kv * 1.0\n")
    with open(os.path.join(work, "alibi_causal.attn"), "w") as f:
        f.write("const H = 4\nmask causal(b, h, q, kv) = q >= kv\n"
                "score alibi(s, b, h, q, kv) = s + (kv - q) * exp2(-(h + 1) * 8.0 / H)\n")
    # A group runs its own runs' clean checks (and its bugs use no others).
    if group:
        runs = {name: run for name, run in runs.items() if group_of(name) == group}
    # Without the Python package the packed runs are left out, unless a
    # chosen bug needs one.
    python, directory = module.get("--module-python="), module.get("--module-dir=")
    if not python or not directory:
        needed = {BUGS[bug][3] for bug in chosen if bug in BUGS}
        for name in [name for name, run in runs.items() if "script" in run]:
            if name in needed:
                raise SystemExit("run %s needs the pagedc Python package: pass "
                                 "--module-python= and --module-dir=" % name)
            del runs[name]
    env = dict(os.environ)
    env.setdefault("PAGEDC_CACHE_DIR", os.path.join(work, "cache"))
    for name, run in runs.items():
        if "script" in run:
            run["args"] = [python, os.path.join(os.path.dirname(__file__), run["script"])]
            run["env"] = {"PYTHONPATH": directory, "PYTHONDONTWRITEBYTECODE": "1"}
            reference = os.path.join(work, name + "-ref.npy")
            subprocess.run(run["args"] + ["-o", reference, "--lse", lse_path(reference),
                                          "--reference"], check=True, env={**env, **run["env"]})
            run["reference"] = reference
            continue
        make_npy(os.path.join(work, name + "-q.npy"), run["q"], 11, run.get("q_climb"))
        make_npy(os.path.join(work, name + "-k.npy"), run["k"], 12, run.get("k_climb"))
        make_npy(os.path.join(work, name + "-v.npy"), run["k"], 13)
        mask, score = run.get("mask", "causal"), run.get("score", "")
        mods = (["--mask=" + mask] if mask else []) + (["--score=" + score] if score else [])
        attn = os.path.join(examples, run.get("attn", "causal.attn"))
        run["args"] = ["pagedc", "run", attn] + mods + [
                       "--q", os.path.join(work, name + "-q.npy"),
                       "--k", os.path.join(work, name + "-k.npy"),
                       "--v", os.path.join(work, name + "-v.npy"),
                       ] + run.get("pages", ["--page-size", "16", "--shuffle-pages", "7"]) + \
            run["extra"]
        reference = os.path.join(work, name + "-ref.npy")
        subprocess.run(run["args"] + ["-o", reference, "--lse", lse_path(reference),
                                      "--reference"], check=True, env=env)
        run["reference"] = reference

    def attempt(run, out, template_dir):
        child = dict(env)
        child.update(run.get("env", {}))
        if template_dir:
            child["PAGEDC_TEMPLATE_DIR"] = template_dir
        return subprocess.run(run["args"] + ["-o", out, "--lse", lse_path(out), "--device", "emu"],
                              env=child, capture_output=True, text=True)

    def errors(out, run):
        return (rel_l2(out, run["reference"]),
                lse_error(lse_path(out), lse_path(run["reference"])))

    failures = 0
    # The unpatched templates: no report, output within tolerance.
    for name, run in runs.items():
        out = os.path.join(work, name + "-clean.npy")
        result = attempt(run, out, None)
        if result.returncode != 0 or "pagedc-emu:" in result.stderr:
            print("clean %s run: FAILED (exit %d)\n%s" % (name, result.returncode, result.stderr))
            failures += 1
            continue
        error, lse = errors(out, run)
        agrees = error <= 1e-2 and lse <= LSE_TOLERANCE
        print("clean %s run: no report, relative L2 %.1e, lse off by %.1e %s" %
              (name, error, lse, "agrees" if agrees else "DISAGREES"))
        failures += not agrees

    detected = 0
    for bug in chosen:
        template, text, replacement, run_name = BUGS[bug]
        source = open(os.path.join(templates, template)).read()
        edits = text if isinstance(text, list) else [(text, replacement)]
        unmatched = [t for t, _ in edits if source.count(t) != 1]
        if unmatched:
            print("BUG %s: a patch matches %d times in %s (must be once)" %
                  (bug, source.count(unmatched[0]), template))
            failures += 1
            continue
        for old, new in edits:
            source = source.replace(old, new)
        patched_dir = os.path.join(work, bug)
        shutil.rmtree(patched_dir, ignore_errors=True)
        os.makedirs(patched_dir)
        with open(os.path.join(patched_dir, template), "w") as f:
            f.write(source)
        out = os.path.join(work, bug + ".npy")
        result = attempt(runs[run_name], out, patched_dir)
        verdict = None
        if result.returncode != 0:
            for line in result.stderr.splitlines():
                if line.startswith("pagedc-emu: "):
                    checker = line.split(":")[1].strip()
                    verdict = "detected by %s: %s" % (checker, line[len("pagedc-emu: "):][:160])
                    break
            if verdict is None and "error:" in result.stderr and \
                    "could not build" not in result.stderr:
                verdict = "detected (run failed): " + result.stderr.strip().splitlines()[-1][:160]
            if verdict is None:
                print("BUG %s: the run failed without a checker report:\n%s" % (bug, result.stderr))
                failures += 1
                continue
        else:
            error, lse = errors(out, runs[run_name])
            if error > 1e-2:
                verdict = "detected numerically: relative L2 %.2e" % error
            elif lse > LSE_TOLERANCE:
                verdict = "detected numerically: lse off by up to %.2e" % lse
        if verdict:
            detected += 1
            print("BUG %s: %s" % (bug, verdict))
        else:
            print("BUG %s: NOT DETECTED" % bug)
            failures += 1
    print("seeded bugs: %d of %d detected" % (detected, len(chosen)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
