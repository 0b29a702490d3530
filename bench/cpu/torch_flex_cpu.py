#!/usr/bin/env python3
"""bench/README.md targets §3, the PyTorch anchor: compiled flex_attention on the CPU.

Times PyTorch's own `torch.compile(flex_attention)` on the shapes of
pagedc-bench-cpu-attention (f32, the same thread count), then runs that
benchmark binary in the same invocation and reports pagedc's speed as a ratio
(PyTorch median time / pagedc median time; > 1 means pagedc is faster).

  prefill-causal  B=1  H=8        S=2048       D=64   causal, 128x128 block mask
  prefill-alibi   B=1  H=8        S=2048       D=64   ALiBi score mod, no mask
  decode          B=16 Hq=32 Hkv=8 1 x 4096    D=128  no mask (GQA 4)
  decode-causal   B=16 Hq=32 Hkv=8 1 x 4096    D=128  causal, query at the end
  decode-mha      B=16 H=8          1 x 4096    D=128  no mask

PyTorch reads K and V from contiguous [B, Hkv, S, D] tensors; pagedc reads
them through a page table with 16-token pages, so the anchor is the easier
layout, and (the -dense rows) from the same contiguous layout in place.

Before that, every shape runs side by side in this process, calls
alternating with a pause before each (PAUSE_S): torch.compile'd flex on
dense tensors, pagedc's flex_attention(q, k, v) from Python on the same
tensors (read in place, the mods given as torch's Python functions; needs
PYTHONPATH=build/python), pagedc from its own PagedKVCache holding the same
K/V (16-token pages), and k.sum() + v.sum() as the read roofline. These
ratios come from one process and alternating calls, so they hold against
the machine's drift better than the separate runs that follow.
--dense-only runs only the decode shapes side by side and stops. Afterwards
pagedc-bench-cpu-attention --read-bandwidth adds the machine's read
bandwidth for the same bytes.

The outputs of the anchor runs are not compared (the pagedc binary
checks itself against a naive loop); this script checks PyTorch's compiled
result against its own eager result once per case so a miscompiled anchor
cannot pass for a fast one.

Usage: torch_flex_cpu.py --pagedc-bench build/bin/pagedc-bench-cpu-attention
                         [--threads 2] [--reps 7] [--dense-only] [--json FILE]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

CASES = [
    # name, batch, q heads, kv heads, q len, kv len, head dim, causal, alibi
    ("prefill-causal", 1, 8, 8, 2048, 2048, 64, True, False),
    ("prefill-alibi", 1, 8, 8, 2048, 2048, 64, False, True),
    ("decode", 16, 32, 8, 1, 4096, 128, False, False),
    ("decode-causal", 16, 32, 8, 1, 4096, 128, True, False),
    ("decode-mha", 16, 8, 8, 1, 4096, 128, False, False),
]


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# Seconds of idle before each timed call of the side-by-side runs. torch's
# OpenMP workers spin for milliseconds after a parallel region, so a call
# started right after torch's shares the two cores with them and is timed
# slower than it runs; after the pause every call starts on idle cores.
PAUSE_S = 0.05


def paged_copy(torch, pagedc, k, v, page_size=16):
    """K and V in a pagedc.PagedKVCache whose pages interleave across the
    sequences as a decode loop leaves them (each sequence's next page
    reserved in turn), so a sequence's pages are not adjacent."""
    batch, heads, length, dim = k.shape
    cache = pagedc.PagedKVCache(batch * length // page_size + 1, page_size, batch, heads, dim,
                                dtype=torch.float32)
    for end in range(page_size, length + page_size, page_size):
        for b in range(batch):
            cache.reserve(b, min(end, length))
    positions = torch.arange(length, dtype=torch.int32).expand(batch, length).contiguous()
    cache.assign(torch.arange(batch, dtype=torch.int32), positions, k, v)
    return cache


def side_by_side(torch, flex, pagedc, case, reps, threads):
    """One shape in this process, the calls alternating so that all see the
    same machine: torch.compile'd flex on dense K/V, pagedc's
    flex_attention(q, k, v) on the same tensors (read in place), pagedc from
    its own paged cache holding the same K/V (16-token pages, interleaved
    across sequences), and for a decode a read-only pass over the dense K
    and V (k.sum() + v.sum(), torch's vectorised reduction on the same
    threads) as the bandwidth roofline."""
    name, batch, hq, hkv, sq, skv, dim, causal, alibi = case
    generator = torch.Generator().manual_seed(11)
    q = torch.randn(batch, hq, sq, dim, generator=generator)
    k = torch.randn(batch, hkv, skv, dim, generator=generator)
    v = torch.randn(batch, hkv, skv, dim, generator=generator)
    cache = paged_copy(torch, pagedc, k, v)
    offset = skv - sq
    block_mask = None
    if causal:
        from torch.nn.attention.flex_attention import create_block_mask
        block_mask = create_block_mask(lambda b, h, qi, kv: qi + offset >= kv, None, None, sq,
                                       skv, device="cpu", BLOCK_SIZE=128)
    # pagedc's q_offset="end" puts q's rows at the end of the keys, so its
    # mods see the positions that torch's see through `offset`.
    mask_mod = (lambda b, h, qi, kv: qi >= kv) if causal else None
    score_mod = torch_score = None
    if alibi:
        slopes = torch.exp2(-8.0 * torch.arange(1, hq + 1, dtype=torch.float32) / hq)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)

        def torch_score(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx - offset)
    gqa = hq != hkv

    def run_torch():
        return flex(q, k, v, score_mod=torch_score, block_mask=block_mask, enable_gqa=gqa)

    def run_pagedc():
        return pagedc.flex_attention(q, k, v, enable_gqa=gqa, mask_mod=mask_mod,
                                     score_mod=score_mod, q_offset="end", threads=threads)

    def run_cache():
        return pagedc.flex_attention(q, cache, enable_gqa=gqa, mask_mod=mask_mod,
                                     score_mod=score_mod, q_offset="end", threads=threads)

    def run_read():
        k.sum()
        v.sum()

    theirs = run_torch()
    max_diff = max((ours - theirs).abs().max().item() for ours in (run_pagedc(), run_cache()))
    if not max_diff <= 1e-3:
        raise SystemExit(f"{name}: pagedc differs from torch by {max_diff}")
    calls = {"torch": run_torch, "pagedc": run_pagedc, "cache": run_cache}
    if sq == 1:  # the read roofline bounds a decode, not a prefill
        calls["read"] = run_read
    for fn in calls.values():
        fn()
    samples = {key: [] for key in calls}
    for _ in range(reps):
        for key, fn in calls.items():
            time.sleep(PAUSE_S)
            samples[key].append(timed(fn))
    kv_bytes = 2 * k.numel() * k.element_size()
    med = {key: statistics.median(values) for key, values in samples.items()}
    read = {}
    if "read" in med:
        read = {"read_median_ms": med["read"] * 1e3,
                "read_gb_per_s": kv_bytes / med["read"] * 1e-9}
    return {"name": name, "kv_bytes": kv_bytes, "pause_s": PAUSE_S,
            "torch_median_ms": med["torch"] * 1e3,
            "pagedc_dense_median_ms": med["pagedc"] * 1e3,
            "pagedc_cache_median_ms": med["cache"] * 1e3, **read,
            "torch_gb_per_s": kv_bytes / med["torch"] * 1e-9,
            "pagedc_gb_per_s": kv_bytes / med["pagedc"] * 1e-9,
            "speedup_vs_torch": med["torch"] / med["pagedc"],
            "cache_speedup_vs_torch": med["torch"] / med["cache"],
            "speedup_per_rep": [t / p for t, p in zip(samples["torch"], samples["pagedc"])],
            "max_abs_diff_vs_torch": max_diff}


def torch_case(torch, flex, case, reps):
    from torch.nn.attention.flex_attention import create_block_mask

    name, batch, hq, hkv, sq, skv, dim, causal, alibi = case
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(batch, hq, sq, dim, generator=generator)
    k = torch.randn(batch, hkv, skv, dim, generator=generator)
    v = torch.randn(batch, hkv, skv, dim, generator=generator)
    offset = skv - sq  # the queries are the last sq positions

    block_mask = None
    if causal:
        def causal_mask(b, h, q_idx, kv_idx):
            return q_idx + offset >= kv_idx
        block_mask = create_block_mask(causal_mask, None, None, sq, skv,
                                       device="cpu", BLOCK_SIZE=128)
    score_mod = None
    if alibi:
        slopes = torch.exp2(-8.0 * torch.arange(1, hq + 1, dtype=torch.float32) / hq)

        def alibi_score(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx - offset)
        score_mod = alibi_score

    def call(fn):
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask,
                  enable_gqa=hq != hkv)

    start = time.perf_counter()
    out = call(flex)  # compiles
    compile_s = time.perf_counter() - start
    eager = call(torch.nn.attention.flex_attention.flex_attention)
    max_diff = (out - eager).abs().max().item()
    if not max_diff <= 1e-3:
        raise SystemExit(f"{name}: compiled flex_attention differs from eager by {max_diff}")
    for _ in range(2):
        call(flex)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call(flex)
        times.append(time.perf_counter() - start)
    return {"name": name, "median_ms": statistics.median(times) * 1e3,
            "min_ms": min(times) * 1e3, "compile_s": compile_s,
            "max_abs_diff_compiled_vs_eager": max_diff}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pagedc-bench", required=True,
                        help="path of pagedc-bench-cpu-attention")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", help="write the combined results here")
    parser.add_argument("--dense-only", action="store_true",
                        help="only the decode shapes side by side (pagedc from Python)")
    args = parser.parse_args()
    if not os.access(args.pagedc_bench, os.X_OK):
        raise SystemExit(f"{args.pagedc_bench}: not an executable (build pagedc first)")
    try:
        import torch
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError as error:
        raise SystemExit(f"PyTorch with flex_attention is needed: {error}")

    # The eager run is the check of the compiled one, not a mistake.
    warnings.filterwarnings("ignore", message=".*without torch.compile")
    torch.set_num_threads(args.threads)
    flex = torch.compile(flex_attention, dynamic=False)
    side_rows = []
    try:
        import pagedc
    except ImportError:
        pagedc = None
        print("pagedc's Python package is not importable (PYTHONPATH=build/python): "
              "no side-by-side runs", file=sys.stderr)
    if pagedc is not None:
        print(f"{'side by side':<16} {'pagedc ms':>10} {'torch ms':>10} {'read ms':>8} "
              f"{'read GB/s':>9} {'torch/pagedc':>13} {'cache ms':>9} {'torch/cache':>12}"
              "  per rep (torch/pagedc)")
        for case in CASES:
            if args.dense_only and case[4] != 1:
                continue
            row = side_by_side(torch, flex, pagedc, case, args.reps, args.threads)
            side_rows.append(row)
            print(f"{row['name']:<16} {row['pagedc_dense_median_ms']:>10.2f} "
                  f"{row['torch_median_ms']:>10.2f} "
                  + (f"{row['read_median_ms']:>8.2f} {row['read_gb_per_s']:>9.1f} "
                     if "read_median_ms" in row else f"{'-':>8} {'-':>9} ")
                  + f"{row['speedup_vs_torch']:>12.2f}x "
                  f"{row['pagedc_cache_median_ms']:>9.2f} {row['cache_speedup_vs_torch']:>11.2f}x  "
                  + " ".join(f"{r:.2f}" for r in row["speedup_per_rep"]), flush=True)
    if args.dense_only:
        if args.json:
            with open(args.json, "w") as file:
                json.dump({"benchmark": "cpu_decode_side_by_side_vs_torch_flex",
                           "torch": torch.__version__, "threads": args.threads,
                           "reps": args.reps, "load_average": os.getloadavg(),
                           "side_by_side": side_rows}, file, indent=2)
                file.write("\n")
        return
    anchors = {}
    for case in CASES:
        print(f"torch {case[0]} ...", file=sys.stderr, flush=True)
        anchors[case[0]] = torch_case(torch, flex, case, args.reps)

    with tempfile.TemporaryDirectory() as scratch:
        ours_path = os.path.join(scratch, "pagedc.json")
        subprocess.run([args.pagedc_bench, "--threads", str(args.threads),
                        "--reps", str(args.reps), "--naive-reps", "1",
                        "--json", ours_path], check=True, stdout=sys.stderr)
        with open(ours_path) as file:
            ours = json.load(file)
        # The roofline of the decode rows: the same 537 MB read with no
        # arithmetic, contiguous and in scattered 8 / 64 KiB chunks.
        read_path = os.path.join(scratch, "read.json")
        subprocess.run([args.pagedc_bench, "--read-bandwidth", "--threads", str(args.threads),
                        "--reps", str(args.reps), "--json", read_path], check=True,
                       stdout=sys.stderr)
        with open(read_path) as file:
            read_bandwidth = json.load(file)["cases"]

    rows = []
    print(f"{'case':<16} {'pagedc ms':>10} {'torch ms':>10} {'torch/pagedc':>13}")
    for case in ours["cases"]:
        anchor = anchors.get(case["name"].replace("-dense", ""))
        if anchor is None:
            continue
        ratio = anchor["median_ms"] / case["median_ms"]
        print(f"{case['name']:<16} {case['median_ms']:>10.2f} "
              f"{anchor['median_ms']:>10.2f} {ratio:>12.2f}x")
        rows.append({"name": case["name"], "pagedc_median_ms": case["median_ms"],
                     "torch_flex_compiled_median_ms": anchor["median_ms"],
                     "torch_min_ms": anchor["min_ms"],
                     "torch_compile_s": anchor["compile_s"],
                     "torch_max_abs_diff_compiled_vs_eager":
                         anchor["max_abs_diff_compiled_vs_eager"],
                     "speedup_vs_torch": ratio})
    result = {"benchmark": "cpu_attention_vs_torch_flex",
              "torch": torch.__version__, "python": platform.python_version(),
              "threads": args.threads, "reps": args.reps,
              "anchor_layout": "contiguous K/V (pagedc: 16-token pages, or dense "
                               "where page_size is 0)",
              "load_average": os.getloadavg(),
              "cases": rows, "side_by_side": side_rows, "read_bandwidth": read_bandwidth}
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=2)
            file.write("\n")


if __name__ == "__main__":
    main()
