#!/usr/bin/env python3
"""Draws the figures of bench/studies/*.md from the JSON files in bench/results/.

    /usr/bin/python3 bench/studies/plots.py        # needs matplotlib (apt: python3-matplotlib)

Every figure is drawn from a committed result file, never typed in; each PNG is written next
to the page that shows it. MEASURED and MODELLED figures are never drawn on the same axes.
"""
import json
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "..", "results")
MASKS = ["causal", "sliding_1k", "document"]
SEQ = [1024, 4096, 16384]


def load(path):
    with open(os.path.join(RESULTS, path)) as f:
        return json.load(f)


def save(fig, name):
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, name), dpi=110)
    plt.close(fig)
    print("wrote", name)


def prefill_rows(doc):
    """{(mask, S, page): row} of a gpu-bench JSON (merged 'rows' or pagedc 'configurations')."""
    out = {}
    for r in doc.get("rows") or doc.get("configurations"):
        if r.get("kind") != "prefill" or r.get("status") != "ok":
            continue
        mask = r["name"].split("-")[1]
        out[(mask, r["kv_len"], r["page_size"])] = r
    return out


def prefill_panels(title, series, name, page=16):
    """series: [(label, {(mask, S, page): row}, key)]; key 'tflops' or 'flex' (derived)."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, mask in zip(axes, MASKS):
        for label, rows, key in series:
            ys = []
            for s in SEQ:
                r = rows.get((mask, s, page))
                if r is None:
                    ys.append(float("nan"))
                elif key == "flex":  # FlexAttention's TFLOP/s from the same run's speed-up
                    ys.append(r["tflops"] / r["speedup_vs_flex"] if r.get("speedup_vs_flex") else float("nan"))
                else:
                    ys.append(r["tflops"])
            ax.plot(SEQ, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(SEQ)
        ax.set_xticklabels(["1k", "4k", "16k"])
        ax.set_title("%s, page %d" % (mask, page))
        ax.set_xlabel("sequence length S")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOP/s (unmasked work)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save(fig, name)


def gpu_h100():
    d = "gpu-h100-2026-11-25/"
    wg = prefill_rows(load(d + "gpu-bench.json"))
    mma = prefill_rows(load(d + "mma-sync-gpu-bench.json"))
    prefill_panels(
        "H100, MEASURED 2026-11-25: prefill B 4, Hq 32, Hkv 8, D 128, bf16 (gpu-h100-2026-11-25/)",
        [("warpgroup (default)", wg, "tflops"), ("mma.sync", mma, "tflops"),
         ("FlexAttention (compiled)", wg, "flex")],
        "gpu-h100-2026-11-25-prefill.png")


def gpu_h200():
    d = "gpu-h200-2026-11-27/segment-runs/"
    n128 = prefill_rows(load(d + "gpu-bench.json"))
    n64 = prefill_rows(load(d + "n64-gpu-bench-pagedc.json"))
    pers = prefill_rows(load(d + "persistent-gpu-bench-pagedc.json"))
    for page in (16, 128):
        prefill_panels(
            "H200, MEASURED 2026-11-27 (call 2, segment-runs/): prefill B 4, Hq 32, Hkv 8, D 128, bf16",
            [("128x128 (default)", n128, "tflops"), ("128x64", n64, "tflops"),
             ("128x128, persistent CTAs", pers, "tflops"), ("FlexAttention (compiled)", n128, "flex")],
            "gpu-h200-2026-11-27-prefill%s.png" % ("" if page == 16 else "-p128"), page=page)
    d = "gpu-h200-2026-11-27/d256/"
    prefill_panels(
        "H200, MEASURED 2026-11-27 (call 3, d256/): prefill at head dim 256, B 4, Hq 32, Hkv 8, bf16",
        [("128x64, two warpgroups", prefill_rows(load(d + "wg128x64-gpu-bench-pagedc.json")), "tflops"),
         ("64x32, one warpgroup", prefill_rows(load(d + "wg64x32-gpu-bench-pagedc.json")), "tflops"),
         ("mma.sync 64x32", prefill_rows(load(d + "gpu-bench.json")), "tflops"),
         ("FlexAttention (compiled)", prefill_rows(load(d + "gpu-bench.json")), "flex")],
        "gpu-h200-2026-11-27-d256.png")


def cpu_attention():
    cases = load("cpu-vs-torch.json")["cases"]
    names = [c["name"] for c in cases]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.bar([i - 0.2 for i in x], [c["pagedc_median_ms"] for c in cases], 0.4, label="pagedc")
    ax.bar([i + 0.2 for i in x], [c["torch_flex_compiled_median_ms"] for c in cases], 0.4,
           label="torch.compile(flex_attention)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names)
    ax.set_ylabel("ms per call (median)")
    ax.set_title("CPU attention, MEASURED 2026-11-22, 2 threads, f32 (cpu-vs-torch.json: one run)",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    save(fig, "cpu-attention.png")


def mma_registers():
    rows = load("prefill-mma-corpus-spills-paired-copies.json")["rows"]
    groups = defaultdict(list)
    for r in rows:
        groups[(r["arch"], r["head_dim"])].append(r["registers"])
    keys = sorted(groups)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.boxplot([groups[k] for k in keys], showfliers=True)
    ax.set_xticks(range(1, len(keys) + 1))
    ax.set_xticklabels(["%s\nD %d" % k for k in keys], fontsize=8)
    ax.set_ylabel("registers per thread")
    spills = sum(1 for r in rows if r["spill_store_bytes"] or r["spill_load_bytes"])
    ax.set_title("mma.sync prefill, %d corpus kernels, %d with spills: STATIC (ptxas; "
                 "prefill-mma-corpus-spills-paired-copies.json)" % (len(rows), spills), fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    save(fig, "prefill-mma-registers.png")


def model_decode():
    doc = load("model-decode.json")
    rows = [c for c in doc["configurations"] if c["kind"] == "decode" and c["page_size"] == 16]
    mods = []
    for c in rows:
        m = c["name"].split("-B")[0][len("decode-"):]
        if m not in mods:
            mods.append(m)
    fig, axes = plt.subplots(1, len(mods), figsize=(13, 3.8), sharey=True)
    for ax, m in zip(axes, mods):
        for b in (1, 16, 64):
            pts = sorted((c["kv_len"], c["devices"]["H100"]["modelled_bandwidth_fraction"])
                         for c in rows if c["name"].startswith("decode-%s-B%d-" % (m, b)))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="B %d" % b)
        ax.axhline(0.90, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1024, 8192, 32768])
        ax.set_xticklabels(["1k", "8k", "32k"])
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("context")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of HBM bandwidth")
    axes[-1].legend(fontsize=8)
    fig.suptitle("Decode on an H100, MODELLED (model-decode.json, page 16; dashed: issue 11's 0.90)",
                 fontsize=10)
    save(fig, "emulator-model-decode.png")


if __name__ == "__main__":
    cpu_attention()
    gpu_h100()
    gpu_h200()
    mma_registers()
    model_decode()
