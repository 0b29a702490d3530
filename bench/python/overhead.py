#!/usr/bin/env python3
"""Per-call overhead of pagedc.flex_attention from Python on a decode step
(bench/README.md, Python targets: <= 10 us added over the C++ call).

Times, on the same cache, mask and output buffer, a small decode step (one
query row per sequence at the end of the cache, so the attention itself takes
microseconds):

  cpp      flexAttention() in a C++ loop inside the extension
           (_pagedc._time_cpp_calls: arguments converted once, as a C++
           application holds them)
  native   the pybind11 binding (_pagedc.flex_attention): DLPack borrowing,
           bindings and options built per call
  public   pagedc.flex_attention: the Python layer on top of that

Medians of --repeat calls after a warm-up, each kind timed in alternating
rounds so drift hits all three alike. The figure that counts is
public - cpp (the whole cost of calling from Python).

    PYTHONPATH=build/python python3 bench/python/overhead.py [--repeat N] [--json FILE]
"""
import argparse
import statistics
import time

import numpy as np

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
        slots, lengths, offsets = list(range(B)), [kv_len] * B, [kv_len - 1] * B

        def public():
            pagedc.flex_attention(q, cache, mods=mods, q_offset="end", out=out, threads=1)

        def native():
            _pagedc.flex_attention(q, cache._native, None, mods._native, {}, {}, slots,
                                   lengths, offsets, None, False, out, None, 1)

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

        samples = {"cpp": [], "native": [], "public": []}
        per_round = max(1, args.repeat // args.rounds)
        cpp(20)
        for _ in range(args.rounds):
            samples["cpp"] += cpp(per_round)
            samples["native"] += time_ns(native, per_round)
            samples["public"] += time_ns(public, per_round)
        med = {kind: statistics.median(v) / 1000.0 for kind, v in samples.items()}
        row = {"batch": B, "heads": H, "head_dim": D, "kv_len": kv_len, "page_size": 16,
               "mask": "causal", "calls_per_kind": per_round * args.rounds,
               "cpp_us": round(med["cpp"], 2), "native_us": round(med["native"], 2),
               "public_us": round(med["public"], 2),
               "added_by_python_us": round(med["public"] - med["cpp"], 2),
               "added_by_binding_us": round(med["native"] - med["cpp"], 2)}
        rows.append(row)
        print(f"decode B={B} H={H} D={D} kv={kv_len}: C++ call {med['cpp']:.1f} us, "
              f"native binding {med['native']:.1f} us, pagedc.flex_attention "
              f"{med['public']:.1f} us; Python adds {row['added_by_python_us']:.1f} us "
              f"(target <= 10)")
    if args.json:
        write_results(args.json, "bench/python/overhead.py", rows,
                      unit="microseconds, medians")

if __name__ == "__main__":
    main()
