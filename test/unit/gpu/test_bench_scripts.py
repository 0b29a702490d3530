#!/usr/bin/env python3
"""Unit tests of the pure parts of bench/gpu/torch_flex.py, baselines.py, report.py,
model_vs_measured.py, ptxas_shapes.py, ptxas_decode.py and issue_model.py
(no torch, no numpy, no GPU): medians, byte and FLOP counts, the plan read
from a pack, anchors, SDPA support, reserve plans, the merge, the targets,
the SASS main-loop count, its copy loop and its path range, the decode
kernel's shared memory and forced paths, the issue term's rule, tile mix
and Nsight Compute parsing, and persistent_schedule.py's block visits and
its two ways of handing out query tiles, decode_fit.py's line and
decode_splits.py's table. The issue rule and the roofline
are pagedc-gpu's (`pagedc-gpu model --launches`, tools/pagedc-gpu/Model.cpp):
the tests of them run the binary $PAGEDC_GPU names (ctest sets it)."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "gpu"))
import baselines  # noqa: E402
import clocks  # noqa: E402
import decode_splits  # noqa: E402
import flashinfer_aot  # noqa: E402
import issue_model  # noqa: E402
import model_vs_measured  # noqa: E402
import persistent_schedule  # noqa: E402
import ptxas_corpus  # noqa: E402
import ptxas_decode  # noqa: E402
import ptxas_shapes  # noqa: E402
import report  # noqa: E402
import torch_flex  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")


def config(name, kind="decode", batch=16, kv_len=8192, q_len=1, mask="", score="", kept=1.0):
    return {"name": name, "kind": kind, "batch": batch, "heads_q": 32, "heads_kv": 8,
            "q_len": q_len, "head_dim": 128, "kv_len": kv_len, "page_size": 16, "mask": mask,
            "score": score, "kept_fraction": kept, "params": [], "buffers": []}


class Helpers(unittest.TestCase):
    def test_median(self):
        self.assertEqual(torch_flex.median([3, 1, 2]), 2)
        self.assertEqual(torch_flex.median([4, 1, 2, 3]), 2.5)
        with self.assertRaises(ValueError):
            torch_flex.median([])

    def test_counts(self):
        c = config("x", batch=2, kv_len=100)
        # K and V: 2 * B * Hkv * L * D; q and out: 2 * B * Hq * 1 * D; bf16.
        self.assertEqual(torch_flex.decode_bytes(c), 2 * (2 * 2 * 8 * 100 * 128 + 2 * 2 * 32 * 128))
        self.assertEqual(torch_flex.decode_bytes(c, kept_fraction=0.5),
                         2 * (2 * 2 * 8 * 50 * 128 + 2 * 2 * 32 * 128))
        p = config("p", kind="prefill", batch=4, kv_len=1024, q_len=1024, kept=0.5)
        self.assertEqual(torch_flex.attention_flops(p), 4 * 4 * 32 * 1024 * 1024 * 128 * 0.5)

    def test_anchor_and_sdpa(self):
        self.assertEqual(torch_flex.anchor_name("decode-none-B1-ctx1024-p16"),
                         "decode-none-B1-ctx1024-p128")
        self.assertEqual(torch_flex.anchor_name("odd"), "odd")
        # --filter: comma-separated texts, any of which a row name holds.
        self.assertTrue(torch_flex.row_wanted("", "prefill-causal-B4-S1024-p16"))
        self.assertTrue(torch_flex.row_wanted("decode-,prefill-causal-B4-S1024",
                                              "prefill-causal-B4-S1024-p16"))
        self.assertFalse(torch_flex.row_wanted("prefill-causal-B4-S1024,decode-",
                                               "prefill-causal-B4-S16384-p16"))
        self.assertFalse(torch_flex.row_wanted("prefill-document", "decode-none-B1-ctx1024-p16"))
        self.assertTrue(torch_flex.sdpa_supported(config("a", mask="causal")))
        self.assertTrue(torch_flex.sdpa_supported(config("a")))
        self.assertFalse(torch_flex.sdpa_supported(config("a", mask="causal", score="alibi")))
        self.assertFalse(torch_flex.sdpa_supported(config("a", mask="document")))

    def test_reserve_plan(self):
        plan = torch_flex.reserve_plan(2, 300, 16, chunk_pages=4)
        self.assertEqual(plan[:4], [(0, 64), (1, 64), (0, 128), (1, 128)])
        self.assertEqual(plan[-1], (1, 300))

    def test_plan_from_pack(self):
        with tempfile.TemporaryDirectory() as directory:
            bench = [config("decode-none-B1-ctx1024-p16", batch=1, kv_len=1024),
                     config("decode-none-B1-ctx1024-p128", batch=1, kv_len=1024),
                     config("decode-none-B64-ctx32768-p16", batch=64, kv_len=32768)]
            with open(os.path.join(directory, "pack.json"), "w") as f:
                json.dump({"bench": bench}, f)
            plan = torch_flex.load_plan(directory)
        self.assertEqual([p["anchor"] for p in plan],
                         ["decode-none-B64-ctx32768-p128", "decode-none-B1-ctx1024-p128"])
        self.assertTrue(all(p["page_size"] == 128 for p in plan))


class Report(unittest.TestCase):
    def test_merge_and_targets(self):
        ours = {"copy_bandwidth_bytes_per_s": 3.0e12, "configurations": []}
        for page, ms in ((16, 1.0), (128, 0.98)):
            c = config("decode-none-B16-ctx8192-p%d" % page)
            c.update(status="ok", median_ms=ms, bytes=torch_flex.decode_bytes(c), flops=0)
            ours["configurations"].append(c)
        theirs = {"configurations": [{"name": "decode-none-B16-ctx8192-p128", "status": "ok",
                                      "flex_paged_ms": 2.0, "sdpa_flash_ms": 0.9}]}
        rows = report.merge(ours, theirs)
        self.assertEqual(len(rows), 2)
        self.assertAlmostEqual(rows[0]["speedup_vs_flex"], 2.0)
        self.assertAlmostEqual(rows[0]["fraction_of_copy"],
                               torch_flex.decode_bytes(rows[0] | config("x")) / 1e-3 / 3.0e12)
        checks = {c["target"]: c for c in report.targets(rows)}
        self.assertTrue(checks["decode >= 1.3x paged FlexAttention (B >= 16, context >= 8k)"]["met"])
        self.assertTrue(checks["page 16 within 5% of page 128"]["met"])
        # No prefill rows: a target without data is never reported as met.
        self.assertFalse(checks["prefill >= 1.0x FlexAttention"]["met"])
        missing = report.merge(ours, None)
        self.assertEqual(missing[0]["anchor_status"], "missing")
        self.assertFalse(report.targets(missing)[1]["met"])
        # Without queued times there is nothing to evaluate on that timing.
        self.assertNotIn("queued_median_ms", rows[0])
        self.assertFalse(report.targets(rows, "queued_")[1]["met"])

    def test_queued_timing_has_its_own_rows_and_targets(self):
        ours = {"copy_bandwidth_bytes_per_s": 3.0e12, "configurations": []}
        # Call by call page 16 is 10% slower than page 128; queued, 2% faster.
        for page, ms, queued in ((16, 1.1, 0.98), (128, 1.0, 1.0)):
            c = config("decode-none-B16-ctx8192-p%d" % page)
            c.update(status="ok", median_ms=ms, queued_median_ms=queued,
                     bytes=torch_flex.decode_bytes(c), flops=0)
            ours["configurations"].append(c)
        theirs = {"configurations": [{"name": "decode-none-B16-ctx8192-p128", "status": "ok",
                                      "flex_paged_ms": 2.0, "flex_paged_queued_ms": 1.2}]}
        rows = report.merge(ours, theirs)
        self.assertAlmostEqual(rows[0]["speedup_vs_flex"], 2.0 / 1.1)
        self.assertAlmostEqual(rows[0]["queued_speedup_vs_flex"], 1.2 / 0.98)
        self.assertAlmostEqual(rows[0]["queued_fraction_of_copy"],
                               rows[0]["fraction_of_copy"] * 1.1 / 0.98)
        self.assertNotIn("queued_speedup_vs_sdpa", rows[0])
        called = {c["target"]: c["met"] for c in report.targets(rows)}
        queued = {c["target"]: c["met"] for c in report.targets(rows, "queued_")}
        self.assertFalse(called["page 16 within 5% of page 128"])
        self.assertTrue(queued["page 16 within 5% of page 128 [queued, L2 flushed]"])
        self.assertTrue(called["decode >= 1.3x paged FlexAttention (B >= 16, context >= 8k)"])
        self.assertFalse(queued["decode >= 1.3x paged FlexAttention (B >= 16, context >= 8k) "
                                "[queued, L2 flushed]"])


    def test_baselines_join_and_the_strongest_is_named(self):
        ours = {"copy_bandwidth_bytes_per_s": 3.0e12, "configurations": []}
        for page in (16, 128):
            c = config("prefill-causal-B4-S4096-p%d" % page, kind="prefill", batch=4,
                       q_len=4096, kv_len=4096)
            c.update(status="ok", median_ms=1.0, min_ms=0.95, max_ms=1.1, queued_median_ms=0.9,
                     bytes=0, flops=torch_flex.attention_flops(c))
            ours["configurations"].append(c)
        theirs = {"configurations": [{"name": "prefill-causal-B4-S4096-p128", "status": "ok",
                                      "flex_paged_ms": 2.0, "sdpa_flash_ms": 1.5}]}
        others = {"unavailable": {"flashinfer": "import flashinfer: ModuleNotFoundError"},
                  "configurations": [
                      {"name": "prefill-causal-B4-S4096-p16", "baselines": {
                          "sdpa_cudnn": {"status": "ok", "ms": 0.8, "max_ms": 0.9,
                                         "queued_ms": 0.95},
                          "fa4": {"status": "mismatch", "ms": 0.1, "message": "another"},
                          "flashinfer": {"status": "unavailable"}}},
                      {"name": "prefill-causal-B4-S4096-p128", "baselines": {
                          "sdpa_cudnn": {"status": "ok", "ms": 1.2, "queued_ms": 1.1}}},
                      {"name": "prefill-causal-B4-S1024-p16", "baselines": {
                          "fa4": {"status": "ok", "ms": 0.97, "max_ms": 1.05}}}]}
        c = config("prefill-causal-B4-S1024-p16", kind="prefill", batch=4, q_len=1024,
                   kv_len=1024)
        c.update(status="ok", median_ms=1.0, min_ms=0.95, max_ms=1.1, bytes=0, flops=1.0)
        ours["configurations"].append(c)
        rows = {r["name"]: r for r in report.merge(ours, theirs, others)}
        p16, p128 = rows["prefill-causal-B4-S4096-p16"], rows["prefill-causal-B4-S4096-p128"]
        # cuDNN beats us call by call at page 16; the mismatched FA4 is no anchor.
        self.assertEqual(p16["strongest"], "sdpa_cudnn")
        self.assertAlmostEqual(p16["speedup_vs_strongest"], 0.8)
        self.assertTrue(p16["baseline_wins"])
        # Its slowest call (0.9 ms) beat our fastest (0.95 ms): beyond the spread.
        self.assertTrue(p16["baseline_wins_beyond_spread"])
        self.assertEqual((p16["min_ms"], p16["max_ms"]), (0.95, 1.1))
        short = rows["prefill-causal-B4-S1024-p16"]
        self.assertTrue(short["baseline_wins"])
        self.assertFalse(short["baseline_wins_beyond_spread"])
        self.assertIsNone(p16["queued_baseline_wins_beyond_spread"])
        self.assertNotIn("fa4_ms", p16)
        self.assertIn("mismatch", p16["baselines_not_timed"]["fa4"])
        self.assertEqual(p16["baselines_not_timed"]["flashinfer"], "unavailable")
        # Queued, ours is faster than every anchor.
        self.assertEqual(p16["queued_strongest"], "sdpa_cudnn")
        self.assertFalse(p16["queued_baseline_wins"])
        # At page 128 the strongest, cuDNN, is slower than us.
        self.assertEqual(p128["strongest"], "sdpa_cudnn")
        self.assertAlmostEqual(p128["speedup_vs_sdpa_cudnn"], 1.2)
        self.assertFalse(p128["baseline_wins"])
        with tempfile.TemporaryDirectory() as directory:
            paths = {}
            for name, data in (("ours", ours), ("torch", theirs), ("others", others)):
                paths[name] = os.path.join(directory, name + ".json")
                with open(paths[name], "w") as f:
                    json.dump(data, f)
            out = os.path.join(directory, "out.json")
            report.main([paths["ours"], paths["torch"], "--baselines", paths["others"],
                         "--commit", "abc123", "--clocks", os.path.join(directory, "none"),
                         "--json", out])
            with open(out) as f:
                merged = json.load(f)
        self.assertEqual(merged["commit"], "abc123")
        self.assertEqual(merged["baselines_unavailable"], others["unavailable"])
        self.assertIsNone(merged["clocks"])


class Baselines(unittest.TestCase):
    def test_what_each_baseline_can_compute(self):
        decode = config("d", mask="causal", score="alibi")
        self.assertEqual(baselines.supports("sdpa_cudnn", decode)[0], False)
        self.assertEqual(baselines.supports("fa4", decode),
                         (False, "FlashAttention-4's interface takes no ALiBi slopes"))
        self.assertTrue(baselines.supports("flashinfer", decode)[0])
        self.assertTrue(baselines.supports("flex_flash", decode)[0])
        sliding = config("s", mask="sliding_4k", score="softcap_tanh")
        self.assertTrue(baselines.supports("fa4", sliding)[0])
        self.assertFalse(baselines.supports("sdpa_cudnn", sliding)[0])
        self.assertTrue(baselines.supports("sdpa_cudnn", config("c", kind="prefill",
                                                                mask="causal"))[0])
        documents = config("p", kind="prefill", mask="document")
        self.assertTrue(baselines.supports("flashinfer", documents)[0])
        self.assertTrue(baselines.supports("fa4", documents)[0])
        self.assertFalse(baselines.supports("fa4", config("x", mask="natten"))[0])
        with self.assertRaises(ValueError):
            baselines.supports("nothing", decode)
        self.assertEqual(baselines.window_of("sliding_1k"), 1024)
        self.assertIsNone(baselines.window_of("causal"))

    def test_page_tables_and_flashinfer_indices(self):
        tables = baselines.page_table(2, 150, 16, chunk_pages=4)
        # 10 pages each, four at a time in turn: 0-3, 4-7, 8-11, ...
        self.assertEqual(tables[0], [0, 1, 2, 3, 8, 9, 10, 11, 16, 17])
        self.assertEqual(tables[1], [4, 5, 6, 7, 12, 13, 14, 15, 18, 19])
        indptr, indices, last = baselines.flashinfer_indices(tables, [150, 33], 16)
        self.assertEqual(indptr, [0, 10, 13])
        self.assertEqual(indices, tables[0] + [4, 5, 6])
        self.assertEqual(last, [6, 1])
        # A length of whole pages ends on a full page.
        self.assertEqual(baselines.flashinfer_indices([[7, 3]], [32], 16)[2], [16])
        with self.assertRaises(ValueError):
            baselines.flashinfer_indices([[0]], [17], 16)

    def test_documents_and_rows(self):
        ids = [0] * 5 + [1] * 3 + [2] * 4
        self.assertEqual(baselines.document_spans(ids), [(0, 5), (5, 8), (8, 12)])
        self.assertEqual(baselines.varlen_offsets(2, 12, baselines.document_spans(ids)),
                         [0, 5, 8, 12, 17, 20, 24])
        self.assertEqual(baselines.sample_rows(1), [0])
        rows = baselines.sample_rows(1000, count=8)
        self.assertEqual(rows[-4:], [996, 997, 998, 999])
        self.assertEqual(rows[0], 0)
        self.assertEqual(len(rows), len(set(rows)))
        self.assertTrue(all(0 <= r < 1000 for r in rows))


class ModelVsMeasured(unittest.TestCase):
    def test_compare(self):
        model = {"configurations": [
            {"name": "a", "status": "modelled", "devices": {"H100": {"modelled_us": 10.0}}},
            {"name": "b", "status": "modelled", "devices": {"H100": {"modelled_us": 20.0}}},
            {"name": "c", "status": "error", "devices": {}}]}
        bench = {"configurations": [
            {"name": "a", "kind": "decode", "status": "ok", "median_ms": 0.02},
            {"name": "b", "kind": "decode", "status": "error", "median_ms": 0.0},
            {"name": "c", "kind": "decode", "status": "ok", "median_ms": 0.01},
            {"name": "d", "kind": "decode", "status": "ok", "median_ms": 0.01}]}
        rows = model_vs_measured.compare(model, bench)
        self.assertEqual([r["name"] for r in rows], ["a"])
        self.assertAlmostEqual(rows[0]["measured_over_modelled"], 2.0)
        self.assertAlmostEqual(model_vs_measured.geomean([2.0, 8.0]), 4.0)


# A SASS listing shaped like the warpgroup prefill's: an outer (block-mask
# pass) loop around the tile loop, whose barrier wait retries out of line and
# jumps back into the loop's middle, and the last tile's P V after the loops.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R3 ;
        /*0030*/               @!P1 BRA 0x0120 ;
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR16], RZ ;
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R24, R124, gdesc[UR8], R24 ;
        /*0060*/                   FMUL R4, R4, R5 ;
        /*0070*/                @P2 BRA 0x0090 ;
        /*0080*/                   FADD R6, R6, R7 ;
        /*0090*/                   NOP ;
        /*00a0*/                @P3 BRA 0x0020 ;
        /*00b0*/                @P4 BRA 0x0010 ;
        /*00c0*/                   HGMMA.64x128x16.F32.BF16 R24, R124, gdesc[UR8], R24 ;
        /*00d0*/                   EXIT ;
        /*00e0*/                   BRA 0x00e0 ;
        /*00f0*/                   NOP ;
        /*0100*/                   NOP ;
        /*0110*/                   NOP ;
        /*0120*/                   NANOSLEEP.SYNCS 0x989680 ;
        /*0130*/               @!P1 BRA 0x0120 ;
        /*0140*/                   BRA 0x0040 ;
"""


class PtxasShapes(unittest.TestCase):
    def test_decode_shared_bytes_as_the_runtime_plans(self):
        # KernelConfig::sharedMemoryBytes (CudaLaunchTest's
        # DecodeDryRunSplitsAndMerges holds the same figure): D 128, GQA 4.
        self.assertEqual(ptxas_decode.decode_shared_bytes(128, 4), 72528)
        # 32 rows pad to 32: Q and the class map double; the two mbarriers
        # and the 1 KiB of alignment stay.
        self.assertEqual(ptxas_decode.decode_shared_bytes(64, 32),
                         32 * 128 + 4 * 64 * 128 + 32 * 64 + 64 + 512 + 256 + 16 + 1024)
        # Templates from before the tensor maps had neither.
        self.assertEqual(ptxas_decode.decode_shared_bytes(128, 4, tensor_maps=False), 71488)

    def test_loop_count_takes_the_innermost_natural_loop(self):
        code = ptxas_shapes.sass_instructions(SASS)
        self.assertEqual(len(code), 21)
        # The tile loop 0x20-0xa0: 2 HGMMA; TRYWAIT, BRA, FMUL, BRA, FADD,
        # BRA (NOP not counted), and the out-of-line retry 0x120-0x140 (3)
        # since it returns into the loop. Not the last P V at 0xc0; the
        # pass loop (head 0x10) holds the same 2 HGMMA with more others.
        self.assertEqual(ptxas_shapes.loop_counts(code), (2, 9))

    def test_wgmma_shared_bytes_as_the_runtime_sizes_them(self):
        # D 128, 128 x 64: four stages and a second Q tile (the emulator
        # reports 197,760 dynamic bytes for this kernel); 128 x 128: three
        # stages fill 227 KiB, one Q tile.
        self.assertEqual(ptxas_shapes.wgmma_shared_bytes(128, 64, 128),
                         1024 + (2 * 128 + 2 * 4 * 64) * 256 + 128)
        self.assertEqual(ptxas_shapes.wgmma_shared_bytes(128, 128, 128),
                         1024 + (128 + 2 * 3 * 128) * 256 + 128)

    def test_loop_count_skips_an_outer_loop_with_more_mma(self):
        # A persistent CTA's query-tile loop (head 0x10, back edge 0x90)
        # holds the KV-tile loop (0x20-0x50: 2 HGMMA) and the last tile's
        # P V after it (1 HGMMA): 3 in all, but the KV-tile loop is the
        # main one.
        code = ptxas_shapes.sass_instructions("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR16], RZ ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR20], R24 ;
        /*0040*/                   FMUL R4, R4, R5 ;
        /*0050*/                @P0 BRA 0x0020 ;
        /*0060*/                   HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR20], R24 ;
        /*0070*/                   STG.E [R6.64], R24 ;
        /*0080*/                   ISETP.NE.AND P1, PT, R2, 0x4, PT ;
        /*0090*/                @P1 BRA 0x0010 ;
        /*00a0*/                   EXIT ;
""")
        self.assertEqual(ptxas_shapes.loop_counts(code), (2, 2))

    def test_loop_count_takes_the_tile_loop_over_the_head_dim_loop(self):
        # The mma.sync kernels at D >= 128: the tile loop (head 0x10, back
        # edge 0x80, a barrier per tile) holds the Q K^T loop over the head
        # dim (0x20-0x40: 1 HMMA, no barrier); the tile loop is the main one.
        code = ptxas_shapes.sass_instructions("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0030*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0040*/                @P0 BRA 0x0020 ;
        /*0050*/                   HMMA.16816.F32.BF16 R16, R8, R12, R16 ;
        /*0060*/                   FMUL R4, R4, R5 ;
        /*0070*/                   ISETP.NE.AND P1, PT, R2, 0x4, PT ;
        /*0080*/                @P1 BRA 0x0010 ;
        /*0090*/                   EXIT ;
""")
        self.assertEqual(ptxas_shapes.loop_counts(code), (2, 6))

    def test_a_jump_back_that_is_no_loop(self):
        # 0x30 jumps out to 0x50, which jumps back to 0x10 (before it, but
        # 0x10 does not dominate 0x50: 0x00 reaches 0x50 through 0x30).
        code = ptxas_shapes.sass_instructions("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R88, gdesc[UR16], RZ ;
        /*0020*/                   EXIT ;
        /*0030*/                   BRA 0x0050 ;
        /*0040*/                   NOP ;
        /*0050*/                   BRA 0x0010 ;
""")
        self.assertEqual(ptxas_shapes.loop_counts(code), (0, 0))

    def test_copy_loop_nested_in_the_tile_loop(self):
        # A tile loop (head 0x10, back edge at 0x80) holding one HMMA and a
        # copy loop (0x30-0x50, LDGSTS) that runs its body several times.
        code = ptxas_shapes.sass_instructions("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0020*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR8][R6.64] ;
        /*0040*/                   IADD3 R3, R3, 0x10, RZ ;
        /*0050*/                @P0 BRA 0x0030 ;
        /*0060*/                   FMUL R4, R4, R5 ;
        /*0070*/                   ISETP.NE.AND P1, PT, R2, 0x4, PT ;
        /*0080*/                @P1 BRA 0x0010 ;
        /*0090*/                   EXIT ;
""")
        self.assertEqual(ptxas_shapes.loop_counts(code), (1, 7))
        self.assertEqual(ptxas_shapes.loop_counts(code, copies=True), (1, 7, 3))

    def test_ex2_before_the_wait_for_the_previous_pv(self):
        # Two S waits: the first has two ex2 before the full wait, the
        # second none (the wait hoisted above its softmax): the smaller.
        code = ptxas_shapes.sass_instructions("""
        /*0000*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0010*/                   MUFU.EX2 R1, R1 ;
        /*0020*/                   MUFU.EX2 R2, R2 ;
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0060*/                   FMNMX R4, R4, R5, !PT ;
        /*0070*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0080*/                   MUFU.EX2 R4, R4 ;
""")
        self.assertEqual(ptxas_shapes.ex2_before_pv_wait(code), 0)
        self.assertEqual(ptxas_shapes.ex2_before_pv_wait(code[:4]), 2)
        # No P V in flight (D 256: every wait is a full one).
        self.assertIsNone(ptxas_shapes.ex2_before_pv_wait(code[3:5]))

    def test_copy_trips_follow_the_copier(self):
        # 64-key decode tiles, 128 threads, two chunks of a row per thread:
        # D 128 has 16 chunks a row, so 8 threads a row, 16 rows a pass,
        # 4 rows a thread, 2 trips unrolled by two.
        self.assertEqual(ptxas_shapes.copy_trips(64, 128, 128), 2)
        self.assertEqual(ptxas_shapes.copy_trips(64, 128, 256), 4)
        self.assertEqual(ptxas_shapes.copy_trips(64, 128, 64), 1)
        # 32-key tiles with 256 threads at D 64: one chunk a row.
        self.assertEqual(ptxas_shapes.copy_trips(32, 256, 64), 1)

    def test_forced_paths_match_the_decode_template(self):
        # --path and --copies rewrite these lines of templates/Decode.cuh: each must be
        # there exactly once, or the counts would be of the unforced kernel.
        with open(os.path.join(ROOT, "templates", "Decode.cuh")) as file:
            text = file.read()
        for old, _ in ptxas_decode.PATH_LINES + ptxas_decode.COPY_LINES:
            self.assertEqual(text.count(old), 1, old)


class PtxasCorpusTest(unittest.TestCase):
    def test_fallback_note(self):
        note = ("pagedc: note: the 128x32 prefill tile with 32 rows per warp spills 20 bytes "
                "on sm_80; compiling the 64x64 tile with 16 rows per warp\n"
                "ptxas info    : Used 192 registers\n")
        self.assertEqual(ptxas_corpus.fell_back_from(note), "128x32 w32: 20 bytes")
        self.assertEqual(ptxas_corpus.settled_tile(note), "64x64 w16")
        self.assertIsNone(ptxas_corpus.fell_back_from("ptxas info    : Used 252 registers\n"))
        self.assertIsNone(ptxas_corpus.settled_tile("ptxas info    : Used 252 registers\n"))

    def test_recomputed_rows_note(self):
        # The CLI's notes as pagedc prints them: the tile holding its mod rows
        # spills, then the same tile recomputing them; each stage kept.
        once = ("pagedc: note: the 128x32 prefill tile with 32 rows per warp spills 8 bytes on "
                "sm_80; compiling it with the mods' row values recomputed per KV tile\n")
        self.assertEqual(ptxas_corpus.fell_back_from(once), "128x32 w32: 8 bytes")
        self.assertEqual(ptxas_corpus.settled_tile(once), "128x32 w32 r")
        twice = once + ("pagedc: note: the 128x32 prefill tile with 32 rows per warp and mod "
                        "rows recomputed per KV tile spills 4 bytes on sm_80; compiling the "
                        "64x64 tile with 16 rows per warp\n")
        self.assertEqual(ptxas_corpus.fell_back_from(twice),
                         "128x32 w32: 8 bytes; 128x32 w32 r: 4 bytes")
        self.assertEqual(ptxas_corpus.settled_tile(twice), "64x64 w16")


class Clocks(unittest.TestCase):
    def test_summary_keeps_the_samples_under_load(self):
        text = ("timestamp, clocks.current.sm [MHz], clocks.max.sm [MHz], power.draw [W], "
                "temperature.gpu\n"
                "2026/11/28 07:00:00.000, 345 MHz, 1980 MHz, 90.00 W, 35\n"
                "2026/11/28 07:00:00.500, 1650 MHz, 1980 MHz, 690.50 W, 60\n"
                "2026/11/28 07:00:01.000, 1700 MHz, 1980 MHz, 650.00 W, 62\n"
                "2026/11/28 07:00:01.500, 1710 MHz, 1980 MHz, 500.00 W, 64\n"
                "2026/11/28 07:00:02.000, [N/A], 1980 MHz, [N/A], 62\n")
        rows = clocks.samples(text)
        self.assertEqual(len(rows), 4)  # the header and the [N/A] line dropped
        result = clocks.summary(rows)
        # the idle sample (90 W, under half of 690.5) is left out
        self.assertEqual(result["loaded_samples"], 3)
        self.assertEqual(result["sm_mhz_median"], 1700.0)
        self.assertEqual((result["sm_mhz_min"], result["sm_mhz_max"]), (1650.0, 1710.0))
        self.assertEqual(result["sm_mhz_reported_max"], 1980.0)
        self.assertEqual(result["temperature_c_max"], 64.0)
        with self.assertRaises(ValueError):
            clocks.summary(clocks.samples("timestamp, a, b, c, d\n"))


class IssueModel(unittest.TestCase):
    def test_path_range_of_the_main_loop(self):
        # SASS's tile loop: the head block (TRYWAIT, BRA: 2), then the
        # block with FMUL and a branch (2: the HGMMAs are not counted), the
        # FADD or not (1), NOP (not counted) and the back edge (1): 5 at
        # the fewest; the retry (NANOSLEEP, BRA: its own loop, counted once)
        # and its jump back (1) make 9 at the most, the count loop_counts
        # gives for the whole body.
        code = ptxas_shapes.sass_instructions(SASS)
        self.assertEqual(ptxas_shapes.loop_counts(code), (2, 9))
        self.assertEqual(ptxas_shapes.main_loop_paths(code), (2, 5, 9))

    def test_producer_loop_is_the_smallest_copy_loop_that_waits(self):
        # A round loop (0x00-0x80) around the tile loop (0x10-0x60: waits
        # at 0x10, copies at 0x30) whose retry at 0x40 is a loop without
        # a wait: the tile loop, 3 or 5 instructions a trip.
        code = ptxas_shapes.sass_instructions("""
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3 ;
        /*0020*/                @P1 BRA 0x0050 ;
        /*0030*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0040*/                @P2 BRA.U.ANY 0x0030 ;
        /*0050*/                @P3 BRA 0x0010 ;
        /*0060*/                   ISETP.NE.AND P4, PT, R1, 0x4, PT ;
        /*0070*/                @P4 BRA 0x0000 ;
        /*0080*/                   EXIT ;
""")
        self.assertEqual(issue_model.producer_loop_paths(code), (3, 5))

    def test_nested_trips_of_the_mma_sync_loop(self):
        # A tile loop (head 0x10, barrier, back edge 0xb0) holding a copy
        # loop (0x20-0x40: 3 others) and a Q K^T loop (0x50-0x80: 2 HMMA,
        # 2 others). 32 rows a warp, 32 keys, D 64: 2 x 4 x 4 = 32 MMAs a
        # tile, 16 trips of 2; copy_trips(32, 128, 64) = 1.
        code = ptxas_shapes.sass_instructions("""
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0020*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR8][R6.64] ;
        /*0030*/                   IADD3 R3, R3, 0x10, RZ ;
        /*0040*/                @P0 BRA 0x0020 ;
        /*0050*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0060*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0070*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0080*/                @P1 BRA 0x0050 ;
        /*0090*/                   HMMA.16816.F32.BF16 R16, R8, R12, R16 ;
        /*00a0*/                   ISETP.NE.AND P2, PT, R2, 0x4, PT ;
        /*00b0*/                @P2 BRA 0x0010 ;
        /*00c0*/                   EXIT ;
""")
        found = issue_model.mma_nested_trips(code, block_n=32, rows=32, head_dim=64)
        self.assertEqual(found, {"copy_loop": 3, "copy_trips": 1, "qk_loop": 2, "qk_trips": 16,
                                 "copy_extra": 30})

    def test_a_fixed_path_that_spills_more_than_the_kernel_is_refused(self):
        # ptxas -v's report of the kernel with every path, then of two
        # fixed paths: one as the kernel (no spill), one that spills.
        report = ("ptxas info    : Compiling entry function 'pagedc_prefill' for 'sm_90a'\n"
                  "ptxas info    : Function properties for pagedc_prefill\n"
                  "ptxas         .     {stack} bytes stack frame, {spill} bytes spill stores, "
                  "{spill} bytes spill loads\n"
                  "ptxas info    : Used 128 registers, used 16 barriers, 128 bytes smem\n")
        kernel = ptxas_shapes.ptxas_figures(report.format(stack=0, spill=0), "pagedc_prefill")
        same = ptxas_shapes.ptxas_figures(report.format(stack=0, spill=0), "pagedc_prefill")
        spilled = ptxas_shapes.ptxas_figures(report.format(stack=80, spill=176), "pagedc_prefill")
        self.assertIsNone(issue_model.spilled_paths(kernel, {"all_kept/rescale": same}))
        message = issue_model.spilled_paths(
            kernel, {"all_kept/rescale": same, "all_kept/no_rescale": spilled})
        self.assertIn("all_kept/no_rescale 176 bytes", message)
        self.assertNotIn("all_kept/rescale ", message)
        # A kernel that spills itself allows its paths as much.
        self.assertIsNone(issue_model.spilled_paths(spilled, {"masked/rescale": spilled}))

    def test_rescale_probability(self):
        self.assertEqual(issue_model.rescale_probability(0), 1.0)
        self.assertAlmostEqual(issue_model.rescale_probability(1), 1.0 - 0.5 ** 16)
        self.assertAlmostEqual(issue_model.rescale_probability(63), 1.0 - (63 / 64) ** 16)

    def test_causal_tile_mix(self):
        # S 256, 128 x 64 tiles: query tile 0 visits 2 tiles (both in the
        # diagonal block: masked), tile 1 visits 4 (2 kept, 2 masked).
        # Rescale on every visit but the fixed probabilities: per warp,
        # masked visits cost 10 / 20, kept 1 / 2 (rescaled or not); the
        # producer loop 100-300 a tile: its 4 warps take 100 at the fewest;
        # at the most the one warp issuing tensor-map copies takes 300.
        static = {"block_m": 128, "block_n": 64, "producer_copy_warps": 1,
                  "all_kept": {"rescale": [1, 1], "no_rescale": [2, 2]},
                  "masked": {"rescale": [10, 10], "no_rescale": [20, 20]},
                  "producer": [100, 300]}
        p = issue_model.rescale_probability
        expected = 0.0
        for visit, masked in [(0, True), (1, True), (0, False), (1, False), (2, True),
                              (3, True)]:
            low, high = (10, 20) if masked else (1, 2)
            expected += 8 * (p(visit) * low + (1 - p(visit)) * high)
        low, high = issue_model.causal_instructions(static, batch=2, heads=3, q_len=256)
        self.assertAlmostEqual(low, 6 * (expected + 6 * 4 * 100))
        self.assertAlmostEqual(high, 6 * (expected + 6 * (3 * 100 + 300)))
        # A gather: all four warps copy.
        static["producer_copy_warps"] = 4
        low, high = issue_model.causal_instructions(static, batch=2, heads=3, q_len=256)
        self.assertAlmostEqual(high, 6 * (expected + 6 * 4 * 300))

    def test_causal_tile_mix_of_64_row_ctas(self):
        # The mma.sync kernel's 64 x 64 tiles, 16 rows per warp, 4 warps, no
        # producer, 5 instructions a tile for the copy loop's second trip.
        # S 256: the CTAs of rows 0 and 64 both visit the first 128-key
        # block whole (2 masked tiles), those of rows 128 and 192 the first
        # block kept and the second masked. S 200: the last block is cut at
        # 200 keys (4 tiles, the last partly past kv_len).
        static = {"block_m": 64, "block_n": 64, "rows_per_warp": 16, "warps": 4,
                  "producer_warps": 0, "copy_extra": 5,
                  "all_kept": {"rescale": [1, 3], "no_rescale": [1, 3]},
                  "masked": {"rescale": [10, 10], "no_rescale": [10, 10]},
                  "producer": [0, 0]}
        def cost(visits):
            return sum(4 * ((10 if masked else 1) + 5) for masked in visits)
        expected = 2 * cost([True, True]) + 2 * cost([False, False, True, True])
        self.assertAlmostEqual(issue_model.causal_instructions(static, 1, 1, 256)[0], expected)
        expected = 2 * cost([True, True]) + 2 * cost([False, False, True, True])
        self.assertAlmostEqual(issue_model.causal_instructions(static, 1, 1, 200)[0], expected)
        self.assertAlmostEqual(issue_model.causal_instructions(static, 1, 1, 256)[1],
                               2 * (2 * 4 * 15) + 2 * (2 * 4 * 8 + 2 * 4 * 15))

    def test_tile_mix_from_the_emulator_tallies(self):
        # 10 of 40 blocks ran (scale 4): 30 kept and 10 masked warp visits,
        # 20 of their 40 16-row groups rescaled (half). Kept visits cost
        # 100 / 120 (rescaled, fewest / most) or 50 / 60; masked 200 / 220
        # or 150 / 160; 7 a visit for nested trips. 8 consumer warps: 5 CTA
        # visits (x 4) for the producer, 4 warps at 10 and 1 of them copying
        # at up to 40.
        static = {"block_m": 128, "block_n": 64, "producer_copy_warps": 1, "copy_extra": 7,
                  "all_kept": {"rescale": [100, 120], "no_rescale": [50, 60]},
                  "masked": {"rescale": [200, 220], "no_rescale": [150, 160]},
                  "producer": [10, 40]}
        counters = {"grid_blocks": 40, "blocks": 10, "tiles_kept": 30, "tiles_masked": 10,
                    "row_groups_rescaled": 20}
        (low, high), rescaled = issue_model.tallied_instructions(static, counters)
        self.assertEqual(rescaled, 0.5)
        self.assertAlmostEqual(low, 4 * (30 * (75 + 7) + 10 * (175 + 7) + 5 * 4 * 10))
        self.assertAlmostEqual(high, 4 * (30 * (90 + 7) + 10 * (190 + 7) + 5 * (3 * 10 + 40)))
        # Two 16-row groups a warp (32 rows): the same tallies are a quarter
        # rescaled.
        static.update(rows_per_warp=32, warps=4)
        self.assertEqual(issue_model.tallied_instructions(static, counters)[1], 0.25)

    def test_predict_takes_tallies_and_leaves_out_score_mods(self):
        static = {"block_m": 128, "block_n": 64, "producer_copy_warps": 1,
                  "all_kept": {"rescale": [10, 10], "no_rescale": [10, 10]},
                  "masked": {"rescale": [10, 10], "no_rescale": [10, 10]},
                  "producer": [0, 0]}
        launch = {"kernel": "pagedc_prefill", "counters": {
            "grid_blocks": 1, "blocks": 1, "tiles_kept": 8, "tiles_masked": 0,
            "row_groups_rescaled": 8}}
        terms = {"tensor": 1.0, "shared": 0.5, "dram": 0.25, "l2": 0.25, "mufu": 0.125}
        modelled = {"H100": {"launches": [{"kernel": "pagedc_prefill", "wave_efficiency": 1.0,
                                          "terms_us": terms, "modelled_us": 4.0}]}}
        def config(name, mask, score):
            return {"name": name, "kind": "prefill", "status": "modelled", "mask": mask,
                    "score": score, "batch": 1, "heads_q": 1, "q_len": 128,
                    "unmasked_flops": 1e6, "launches": [launch], "devices": modelled}
        model = {"configurations": [config("prefill-document-a", "document", ""),
                                    config("prefill-causal+softcap-b", "causal", "softcap"),
                                    config("decode-c", "causal", "")]}
        model["configurations"][2]["kind"] = "decode"
        rows = issue_model.predict(static, model)
        self.assertEqual([r["name"] for r in rows], ["prefill-document-a"])
        self.assertEqual(rows[0]["tile_mix"], "emulator tallies")
        # 8 kept warp visits of 10 instructions, one CTA visit's producer (0).
        self.assertEqual(rows[0]["instructions"], [80.0, 80.0])
        # The H100's 132 SMs x 4 schedulers at 1.83 GHz issue them, on top
        # of the tensor term, plus 3 us of launch.
        issue = 80 / (132 * 4 * 1.83e9) * 1e6
        self.assertAlmostEqual(rows[0]["issue_us"][0], issue)
        self.assertAlmostEqual(rows[0]["modelled_us_with_issue"][1], 1.0 + issue + 3.0)
        self.assertAlmostEqual(rows[0]["tflops_with_issue"][0], 1e6 / (4.0 + issue) / 1e6)

    def test_rule_adds_issue_to_the_larger_of_tensor_and_shared(self):
        terms = {"tensor": 100.0, "shared": 120.0, "l2": 150.0, "dram": 10.0, "mufu": 50.0}
        h100 = 132 * 4 * 1.83e9  # warp instructions a second: SMs x schedulers x clock
        issued = issue_model.with_issue([
            {"terms_us": terms, "wave_efficiency": 1.0,
             "warp_instructions": [20e-6 * h100, 60e-6 * h100]},
            {"terms_us": terms, "wave_efficiency": 0.5, "warp_instructions": 1056e6}])
        for got, want in zip(issued[0]["issue_us"], (20.0, 60.0)):
            self.assertAlmostEqual(got, want)
        # 120 + 20 is below L2's 150; 120 + 60 above it.
        for got, want in zip(issued[0]["modelled_us_with_issue"], (153.0, 183.0)):
            self.assertAlmostEqual(got, want)
        # 1,056 x 10^6 instructions at wave efficiency 0.5: twice their time.
        self.assertAlmostEqual(issued[1]["issue_us"][0], 1056e6 / h100 / 0.5 * 1e6)
        # The A100: 108 SMs at 1.41 GHz.
        a100 = issue_model.with_issue([{"terms_us": terms, "wave_efficiency": 1.0,
                                        "warp_instructions": 1e9}], "A100")
        self.assertAlmostEqual(a100[0]["issue_us"][0], 1e9 / (108 * 4 * 1.41e9) * 1e6)
        self.assertEqual(issue_model.model_device("H100")["sms"], 132)
        # A line with terms but no instructions is refused, naming the line.
        with self.assertRaisesRegex(ValueError, "launches.jsonl:1: .*warp_instructions"):
            issue_model.with_issue([{"terms_us": terms, "wave_efficiency": 1.0}])

    def test_roofline_of_an_emulator_counter_line(self):
        # One decode launch: 264 blocks of 128 threads, 32 run (s = 8.25),
        # 40 KiB of dynamic shared memory, 64 registers: 4 warps of 2,048
        # registers, so 8 CTAs by registers, 5 by shared memory (228 KiB /
        # 41 KiB): 660 slots, one wave, e = 0.4.
        counters = {"grid_blocks": 264, "blocks": 32, "mma": 10**6, "wgmma_flop": 0,
                    "ldmatrix_wavefronts": 10**5, "shared_wavefronts": 28000,
                    "cp_async_bytes": 1280000, "cp_async_zero_fill_bytes": 0,
                    "bulk_copy_bytes": 0, "wgmma_shared_bytes": 0,
                    "global_sectors_unique": 3 * 10**6, "global_sectors_requested": 4 * 10**6,
                    "global_load_bytes": 720000, "global_store_bytes": 4 * 10**6,
                    "transcendentals": 5 * 10**6}
        line = {"kernel": "pagedc_decode", "grid": [264, 1, 1], "block": [128, 1, 1],
                "dynamic_shared_bytes": 40 * 1024, "counters": counters}
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "counters.jsonl")
            with open(path, "w") as f:
                f.write(json.dumps(line) + "\n")
            results = {}
            for dram in ("distinct", "requested"):
                out = os.path.join(directory, dram + ".json")
                issue_model.run_model(["--launches", path, "--registers", "64", "--dram",
                                       dram, "--json", out])
                with open(out) as f:
                    results[dram] = json.load(f)
        launch = results["distinct"]["launches"][0]
        s, clock, sms = 8.25, 1.83e9, 132
        self.assertEqual((launch["ctas_per_sm"], launch["occupancy_limit"]), (5, "shared memory"))
        self.assertAlmostEqual(launch["wave_efficiency"], 0.4)
        terms = {"tensor": 1e6 * 4096 * s / (989.4e12 * 0.66),
                 "shared": (1e5 + 28000 + 1280000 / 128) * s / (sms * clock),
                 "dram": 3e6 * 32 * s / 3.35e12, "l2": 4e6 * 32 * s / 7.0e12,
                 "mufu": 5e6 * s / (sms * 16 * clock)}
        for name, seconds in terms.items():  # rounded to ns
            self.assertAlmostEqual(launch["terms_us"][name], seconds * 1e6, delta=6e-4)
        self.assertEqual(launch["bound"], "dram")
        self.assertAlmostEqual(launch["modelled_us"], terms["dram"] / 0.4 * 1e6 + 3.0, delta=6e-4)
        self.assertAlmostEqual(launch["requested_global_bytes"], (1280000 + 720000) * s)
        # --dram requested: the copies and loads, plus the stores, 14.8 us:
        # L2 bounds the launch then.
        requested = results["requested"]["launches"][0]
        self.assertAlmostEqual(requested["dram_bytes"], (1280000 + 720000 + 4e6) * s)
        self.assertEqual(requested["bound"], "l2")
        self.assertAlmostEqual(results["requested"]["modelled_us"],
                               terms["l2"] / 0.4 * 1e6 + 3.0, delta=6e-4)

    def test_nsight_compute_listings(self):
        details = """
    SM Frequency                    Ghz          1.83
    Elapsed Cycles                cycle    38,924,811
    Duration                         ms         21.27
    Executed Instructions                           inst 11,895,763,440
"""
        figures = issue_model.ncu_figures(details)
        self.assertEqual(figures["instructions"], 11895763440.0)
        self.assertEqual(figures["cycles"], 38924811.0)
        self.assertAlmostEqual(figures["clock_hz"], 1.83e9)
        self.assertAlmostEqual(figures["duration_us"], 21270.0)
        metrics = "    smsp__inst_executed.sum                 inst  801,739,784\n"
        self.assertEqual(issue_model.ncu_figures(metrics), {"instructions": 801739784.0})
        with self.assertRaises(ValueError):
            issue_model.ncu_figures("Duration ms 1.0")

    def test_calibrate_recovers_the_clock_and_tile_costs(self):
        # Points made from s = 1.1 and costs 3 us (a) / 0.5 us (b) per query
        # tile: the fit gives them back, and the calibrated times the
        # measured ones; with the clock fixed at 1.83 / 1.1 GHz only the
        # costs are fitted.
        def bench(times):
            return {"multiprocessors": 132, "configurations": [
                {"name": n, "status": "ok", "batch": 4, "q_len": q, "median_ms": t / 1e3}
                for n, q, t in times]}

        predicted = [{"name": "prefill-causal-S4096", "modelled_us_with_issue": [850.0, 950.0],
                      "tflops_with_issue": [500.0, 560.0]},
                     {"name": "prefill-causal-S16384", "modelled_us_with_issue": [13000.0, 14000.0],
                      "tflops_with_issue": [600.0, 650.0]},
                     {"name": "prefill-document-S4096", "modelled_us_with_issue": [1.0, 2.0],
                      "tflops_with_issue": [1.0, 2.0]}]
        tiles = {4096: 4 * 32 * 32 / 132, 16384: 4 * 32 * 128 / 132}
        points = []
        for label, cost in (("a", 3.0), ("b", 0.5)):
            times = [(r["name"], q, 1.1 * sum(r["modelled_us_with_issue"]) / 2 + cost * tiles[q])
                     for r, q in zip(predicted, (4096, 16384))]
            points += issue_model.calibration_points(predicted, bench(times), label)
        self.assertEqual(len(points), 4)  # the document row is not causal, nor measured
        fit = issue_model.calibrate([dict(p) for p in points])
        self.assertAlmostEqual(fit["s"], 1.1, places=6)
        self.assertAlmostEqual(fit["clock_ghz"], 1.83 / 1.1, places=6)
        self.assertAlmostEqual(fit["tile_cost_us"]["a"], 3.0, places=4)
        self.assertAlmostEqual(fit["tile_cost_us"]["b"], 0.5, places=4)
        for p in fit["points"]:
            self.assertAlmostEqual(p["measured_over_calibrated"], 1.0, places=6)
        fixed = issue_model.calibrate([dict(p) for p in points], clock_ghz=1.83 / 1.1)
        self.assertTrue(fixed["clock_fixed"])
        self.assertAlmostEqual(fixed["tile_cost_us"]["a"], 3.0, places=4)
        # One point cannot fix both s and a cost.
        with self.assertRaises(ValueError):
            issue_model.calibrate([dict(points[0])])
        # Residuals take every measured row, the document row too, with the
        # label's cost (times are label b's); the fit's own points come back
        # at 1 and marked.
        measured = times + [("prefill-document-S4096", 4096, 2 * (1.1 * 1.5 + 0.5 * tiles[4096]))]
        checked = issue_model.residuals(predicted, bench(measured), "b", fit)
        self.assertEqual([p["name"] for p in checked], [r["name"] for r in predicted])
        self.assertEqual([p["in_fit"] for p in checked], [True, True, False])
        for p, ratio in zip(checked, (1.0, 1.0, 2.0)):
            self.assertAlmostEqual(p["measured_over_calibrated"], ratio, places=6)
        self.assertFalse(issue_model.residuals(predicted, bench(measured), "c",
                                               dict(fit, tile_cost_us={"c": 0.0}))[0]["in_fit"])
        # Tiles per SM: a measured point's, else from the name's B and S.
        self.assertEqual(issue_model.tiles_per_sm_of("prefill-causal-S4096", points),
                         points[0]["tiles_per_sm"])
        self.assertAlmostEqual(issue_model.tiles_per_sm_of("prefill-none-B4-S1000-p16", points),
                               4 * 32 * 8 / 132)
        self.assertIsNone(issue_model.tiles_per_sm_of("prefill-none", points))

    def test_load_model_walks_nested_keys(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "m.json")
            with open(path, "w") as f:
                json.dump({"a:b (c)": [1], "x": {"y": {"z": [2]}}}, f)
            self.assertEqual(issue_model.load_model(path + ":a:b (c)"), [1])
            self.assertEqual(issue_model.load_model(path + ":x/y/z"), [2])
            with self.assertRaises(KeyError):
                issue_model.load_model(path + ":x/q")

    def test_forced_lines_match_the_warpgroup_template(self):
        # static rewrites these lines of templates/PrefillWgmma.cuh; each
        # name must be found once, or its counts would be of both sides.
        with tempfile.TemporaryDirectory() as directory:
            values = {"all_kept": "true", "rescale": "false", "scale_folded": "true",
                      "tensor_maps": "true", "group_visible": "true"}
            forced, absent = issue_model.force(os.path.join(ROOT, "templates"), directory, values)
            self.assertEqual(absent, [])
            with open(os.path.join(forced, "PrefillWgmma.cuh")) as file:
                text = file.read()
            self.assertIn("const bool all_kept = true || false && (", text)
            # the maximum-first path's O rescale, and the fast softmax taken
            # with what its vote guards unreachable
            self.assertIn("          rescale_out = false;\n", text)
            self.assertIn("if (kFastSoftmax && !false) {", text)
            self.assertIn("            if (!false)\n              return;\n", text)
            self.assertIn("return true;", text)
            self.assertIn("if (!kOverlap && !true) {", text)
        with tempfile.TemporaryDirectory() as directory:
            forced, absent = issue_model.force(os.path.join(ROOT, "templates"), directory,
                                               {"all_kept": "false", "rescale": "true"}, "mma")
            self.assertEqual(absent, [])
            with open(os.path.join(forced, "Prefill.cuh")) as file:
                self.assertIn("const bool all_kept = false || false && (", file.read())
            with open(os.path.join(forced, "KernelCommon.cuh")) as file:
                self.assertIn("if (true) {\n    rescale_rows", file.read())


class PersistentSchedule(unittest.TestCase):
    def test_block_visits(self):
        # Causal: every block up to the diagonal; a short last block counts.
        self.assertEqual(persistent_schedule.block_visits("causal", 300, 128, None), [1, 2, 3])
        # A 1k window over 128-row blocks: the diagonal and 8 before it
        # (q_first - k_last < 1024).
        visits = persistent_schedule.block_visits("sliding_1k", 4096, 128, None)
        self.assertEqual(visits[:3], [1, 2, 3])
        self.assertEqual(visits[-1], 9)
        # Documents of 200 and 312 rows: block 1 (rows 128-255) shares
        # document 0 with block 0; blocks 2 and 3 (document 1) see block 1,
        # whose rows 200-255 are in document 1, but not block 0.
        documents = [0] * 200 + [1] * 312
        self.assertEqual(persistent_schedule.block_visits("document", 512, 128, documents),
                         [1, 2, 2, 3])
        with self.assertRaises(ValueError):
            persistent_schedule.block_visits("unknown", 256, 128, None)

    def test_snake_and_counter(self):
        # Tile order: the last query block first, every head and batch.
        costs = persistent_schedule.tile_costs([1, 2, 3], batch=1, heads=2, overhead=0.5)
        self.assertEqual(costs, [3.5, 3.5, 2.5, 2.5, 1.5, 1.5])
        # Equal costs: both ways are perfect.
        self.assertEqual(persistent_schedule.snake([1.0] * 8, 4), 2.0)
        self.assertEqual(persistent_schedule.counter([1.0] * 8, 4), 2.0)
        # Two CTAs: the snake gives CTA 0 tiles 0, 3, 4 (10 + 1 + 1) and
        # CTA 1 tiles 1, 2, 5 (1 + 1 + 1); the counter gives CTA 1 every
        # tile after the first while CTA 0 works on the 10.
        costs = [10, 1, 1, 1, 1, 1]
        self.assertEqual(persistent_schedule.snake(costs, 2), 12)
        self.assertEqual(persistent_schedule.counter(costs, 2), 10)
        # Fewer tiles than CTAs.
        self.assertEqual(persistent_schedule.counter([2, 3], 4), 3)

    def test_reads_int32_npy(self):
        with tempfile.TemporaryDirectory() as work:
            path = os.path.join(work, "d.npy")
            header = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"
            header += " " * (64 - 10 - len(header) - 1) + "\n"
            with open(path, "wb") as f:
                f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") +
                        header.encode("latin1") + (7).to_bytes(4, "little") * 3)
            self.assertEqual(persistent_schedule.read_int32_npy(path), [7, 7, 7])



class DecodeFit(unittest.TestCase):
    """decode_fit.py recovers a line the rows lie on, leaves rows under
    --min-mb out of it, and flags a series whose time is its call path's."""

    def run_fit(self, rows, configs, *extra):
        import subprocess
        with tempfile.TemporaryDirectory() as d:
            json.dump({"copy_bandwidth_bytes_per_s": 4.2e12, "configurations": configs},
                      open(os.path.join(d, "gpu-bench-pagedc.json"), "w"))
            json.dump({"rows": rows}, open(os.path.join(d, "gpu-bench.json"), "w"))
            out = os.path.join(d, "fit.json")
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu", "decode_fit.py"), d,
                            "--json", out, *extra], check=True, capture_output=True)
            return json.load(open(out))

    def test_line(self):
        configs, rows = [], []
        for i, mb in enumerate([4, 70, 140, 270, 540, 2150, 8600]):
            name = "decode-none-B%d-ctx1024-p128" % i
            pagedc_us = 20.0 + mb / 4.5  # 4.5 TB/s = 4.5 MB per us
            queued_us = 30.0 + mb / 4.4 + (3.0 if mb == 4 else 0.0)  # the small row: off the line
            configs.append({"name": name, "kind": "decode", "page_size": 128, "status": "ok",
                            "bytes": mb * 1e6, "median_ms": pagedc_us / 1e3,
                            "queued_median_ms": queued_us / 1e3,
                            "launch_queued_median_ms": [queued_us * 0.8e-3, queued_us * 0.2e-3]})
            rows.append({"name": name, "median_ms": pagedc_us / 1e3,
                         "queued_median_ms": queued_us / 1e3,
                         "queued_slow_ms": (150.0 + mb / 50.0) / 1e3})
        # Another page size and another mask are not this fit's rows.
        configs.append(dict(configs[0], name="decode-none-B0-ctx1024-p16", page_size=16))
        configs.append(dict(configs[0], name="decode-causal-B0-ctx1024-p128"))
        fit = self.run_fit(rows, configs)["fits"]
        self.assertAlmostEqual(fit["pagedc"]["fixed_us"], 20.0, places=6)
        self.assertAlmostEqual(fit["pagedc"]["rate_bytes_per_s"], 4.5e12, delta=1e6)
        self.assertEqual(fit["pagedc"]["rows"], 6)  # 4 MB is under --min-mb 60
        self.assertAlmostEqual(fit["pagedc queued"]["fixed_us"], 30.0, places=6)
        self.assertTrue(fit["pagedc"]["streaming"])
        # 50 MB per us is no streaming rate: that series is its call path.
        self.assertFalse(fit["slow queued"]["streaming"])
        # With the small row the queued line moves and says how far it is off.
        wide = self.run_fit(rows, configs, "--min-mb", "1")["fits"]["pagedc queued"]
        self.assertEqual(wide["rows"], 7)
        self.assertGreater(wide["worst_relative_residual"], 0.01)
        rows_out = self.run_fit(rows, configs)["rows"]
        self.assertEqual(len(rows_out), 7)
        self.assertAlmostEqual(sum(rows_out[0]["launch_queued_us"]), rows_out[0]["queued_us"],
                               places=6)


class DecodeSplits(unittest.TestCase):
    """decode_splits.py reads each run's split count off its decode launch,
    keeps the rows of the planned run, and names the fastest count."""

    def test_table(self):
        def config(name, splits, queued_us, merge=True):
            launches = ["pagedc_decode grid (%d, 8, 1) block 128" % splits]
            if merge:
                launches.append("pagedc_decode_merge grid (8, 32, 1) block 128")
            return {"name": name, "status": "ok", "launches": launches,
                    "median_ms": queued_us * 0.9e-3, "queued_median_ms": queued_us * 1e-3,
                    "launch_queued_median_ms": [queued_us * 0.7e-3, queued_us * 0.4e-3]}
        with tempfile.TemporaryDirectory() as d:
            def write(label, configs):
                json.dump({"configurations": configs}, open(os.path.join(
                    d, "decode-splits-%s-gpu-bench-pagedc.json" % label), "w"))
            write("planned", [config("a", 47, 57.8), config("b", 3, 39.7)])
            write("1", [config("a", 1, 900.0, merge=False), config("b", 1, 35.0, merge=False)])
            # A short row keeps its longest plan when asked for more.
            write("24", [config("a", 24, 52.0), config("b", 4, 41.0),
                         dict(config("c", 2, 1.0), status="error")])
            rows = {r["name"]: r for r in decode_splits.summarize(d, [1, 24, 47])}
        self.assertEqual(sorted(rows), ["a", "b"])  # the planned run's rows
        self.assertEqual(rows["a"]["planned_splits"], 47)
        self.assertEqual([r["splits"] for r in rows["a"]["runs"]], [1, 24])
        self.assertEqual(rows["a"]["fastest"]["splits"], 24)
        self.assertEqual(rows["b"]["fastest"]["asked"], 1)
        self.assertEqual(rows["b"]["runs"][1]["splits"], 4)
        self.assertAlmostEqual(rows["a"]["runs"][1]["launch_queued_us"][1], 52.0 * 0.4)
        self.assertEqual(decode_splits.splits_of({"launches": ["pagedc_prefill grid (4, 1, 1)"]}),
                         0)


class FlashinferAot(unittest.TestCase):
    """flashinfer_aot.py picks the kernel variants FlashInfer's wrappers load
    for the baseline rows it can run, and none for the others."""

    def test_variants(self):
        gqa1 = dict(config("mha"), heads_q=8, heads_kv=8)
        configs = [
            config("plain"), config("alibi", mask="causal", score="alibi"),
            config("window", mask="sliding_4k", score="softcap_tanh"), gqa1,
            config("p", kind="prefill", q_len=4096, kv_len=4096),
            config("p-causal", kind="prefill", q_len=4096, kv_len=4096, mask="causal"),
            config("p-alibi", kind="prefill", q_len=4096, kv_len=4096, score="alibi"),
            dict(config("p-d96", kind="prefill", q_len=4096, kv_len=4096), head_dim=96),
            config("docs", kind="prefill", q_len=4096, kv_len=4096, mask="document"),
            # Rows FlashInfer is not run on: no variant.
            config("docs-scored", kind="prefill", q_len=4096, kv_len=4096, mask="document",
                   score="alibi"),
            config("unknown", mask="natten"),
        ]
        self.assertEqual(flashinfer_aot.variants(configs), [
            ("decode", "", 128, 0, False, False),
            ("prefill", "fa2", 96, 0, False, False),
            ("prefill", "fa2", 128, 0, False, False),
            ("prefill", "fa2", 128, 0, True, True),
            ("prefill", "fa2", 128, 2, False, False),
            ("prefill", "fa3", 128, 0, False, False),
        ])
        self.assertEqual(flashinfer_aot.variants([configs[-1], configs[-2]]), [])

    def test_modules_command(self):
        with tempfile.TemporaryDirectory() as d:
            json.dump({"bench": [config("w", mask="sliding_4k", score="softcap_tanh")]},
                      open(os.path.join(d, "pack.json"), "w"))
            import contextlib
            import io
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(flashinfer_aot.main(["modules", d]), 0)
        self.assertEqual(out.getvalue(), "prefill fa2 head_dim 128 sliding-window soft-cap\n")

if __name__ == "__main__":
    unittest.main()
