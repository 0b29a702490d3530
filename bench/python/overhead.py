#!/usr/bin/env python3
"""Per-call overhead of pagedc.flex_attention from Python on a decode step
(target: <= 5 us added over the C++ call, torch tensors and defaults).

Times, on the same cache, mask and output buffer, a small decode step (one
query row per sequence at the end of the cache, so the attention itself takes
microseconds):

  cpp      flexAttention() in a C++ loop inside the extension
           (_pagedc._time_cpp_calls: arguments converted once, as a C++
           application holds them)
  native   the pybind11 binding (_pagedc.flex_attention): DLPack borrowing,
           bindings and options built per call
  public   pagedc.flex_attention: the Python layer on top of that (NumPy
           arrays, threads=1, the output buffer passed in)
  torch    pagedc.flex_attention as a torch user calls it: torch tensors,
           default arguments, a new output tensor each call (when torch
           is installed)

Medians of --repeat calls after a warm-up, each kind timed in alternating
rounds so drift hits them alike. The figure that counts is
torch - cpp (the whole cost of calling from Python).

    PYTHONPATH=build/python python3 bench/python/overhead.py [--repeat N] [--json FILE]
"""
import argparse
import statistics
import time

import numpy as np

try:
    import torch
except ImportError:
    torch = None

import pagedc
from pagedc import _pagedc
from results import write_results


def time_ns(fn, repeat):
    for _ in range(20):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for kv_len in (16, 1024):
        B, H, D = 4, 8, 64
        cache = pagedc.PagedKVCache(B * kv_len // 16 + 8, 16, B, H, D)
        cache.reserve(list(range(B)), kv_len)
        k = rng.standard_normal((B, H, kv_len, D), dtype=np.float32)
        v = rng.standard_normal((B, H, kv_len, D), dtype=np.float32)
        cache.assign(np.arange(B, dtype=np.int32),
                     np.tile(np.arange(kv_len, dtype=np.int32), (B, 1)), k, v)
        mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
        q = rng.standard_normal((B, H, 1, D), dtype=np.float32)
        out = np.empty_like(q)
        q_torch = torch.from_numpy(q.copy()) if torch is not None else None
        slots, lengths, offsets = list(range(B)), [kv_len] * B, [kv_len - 1] * B

        def public():
            pagedc.flex_attention(q, cache, mods=mods, q_offset="end", out=out, threads=1)

        def native():
            _pagedc.flex_attention(q, cache._native, None, mods._native, {}, {}, slots,
                                   lengths, offsets, None, False, out, None, 1, {}, -1, 0, None)

        def torch_default():
            # What a torch user writes: torch tensors in, a new output
            # tensor out, every other argument left to its default.
            return pagedc.flex_attention(q_torch, cache, mods=mods, q_offset="end")

        def cpp(repeat):
            return _pagedc._time_cpp_calls(q, cache._native, None, mods._native, {}, {},
                                           slots, lengths, offsets, out, 1, repeat)

        # The three give the same output.
        public()
        expected = out.copy()
        native()
        assert np.array_equal(out, expected)
        cpp(1)
        assert np.array_equal(out, expected)
        if torch is not None:
            assert np.array_equal(torch_default().numpy(), expected)

        samples = {"cpp": [], "native": [], "public": []}
        if torch is not None:
            samples["torch_default"] = []
        per_round = max(1, args.repeat // args.rounds)
        cpp(20)
        for _ in range(args.rounds):
            samples["cpp"] += cpp(per_round)
            samples["native"] += time_ns(native, per_round)
            samples["public"] += time_ns(public, per_round)
            if torch is not None:
                samples["torch_default"] += time_ns(torch_default, per_round)
        med = {kind: statistics.median(v) / 1000.0 for kind, v in samples.items()}
        row = {"batch": B, "heads": H, "head_dim": D, "kv_len": kv_len, "page_size": 16,
               "mask": "causal", "calls_per_kind": per_round * args.rounds,
               "cpp_us": round(med["cpp"], 2), "native_us": round(med["native"], 2),
               "public_us": round(med["public"], 2),
               "added_by_python_us": round(med["public"] - med["cpp"], 2),
               "added_by_binding_us": round(med["native"] - med["cpp"], 2)}
        line = (f"decode B={B} H={H} D={D} kv={kv_len}: C++ call {med['cpp']:.1f} us, "
                f"native binding {med['native']:.1f} us, pagedc.flex_attention "
                f"{med['public']:.1f} us (NumPy, threads=1, out=)")
        if torch is not None:
            row["torch_default_us"] = round(med["torch_default"], 2)
            row["added_torch_default_us"] = round(med["torch_default"] - med["cpp"], 2)
            line += (f", {med['torch_default']:.1f} us (torch, defaults); added over C++: "
                     f"{row['added_by_python_us']:.1f} / {row['added_torch_default_us']:.1f} us "
                     "(target <= 5)")
        else:
            line += f"; added over C++: {row['added_by_python_us']:.1f} us (torch absent)"
        rows.append(row)
        print(line)
    if args.json:
        write_results(args.json, "bench/python/overhead.py", rows,
                      unit="microseconds, medians")

if __name__ == "__main__":
    main()
