#!/usr/bin/env python3
"""Unit tests of the pure parts of bench/gpu/torch_flex.py and report.py
(no torch, no numpy): medians, byte and FLOP counts, the plan read from a
pack, anchors, SDPA support, reserve plans, the merge and the targets."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "gpu"))
import model_vs_measured  # noqa: E402
import report  # noqa: E402
import torch_flex  # noqa: E402


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


if __name__ == "__main__":
    unittest.main()
