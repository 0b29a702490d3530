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
  compiled torch.compile(flex_attention) on the same decode step with K/V
           as dense contiguous [B, H, kv, D] tensors (the layout torch
           reads best; no block mask: the query sits at the end, so the
           causal mask hides nothing), --compiled-kv lengths only

Medians (and 10th / 90th percentiles) of --repeat calls after a warm-up,
each kind timed in alternating rounds so drift hits them alike; and, as a
figure other processes disturb less on a shared machine, the minimum over
the rounds of the calling thread's CPU time per call (the C++ loop's
includes its timer reads; torch's worker threads, if any, are not counted). The figures
that count are torch - cpp (the whole cost of calling from Python) and
torch / compiled.

    PYTHONPATH=build/python python3 bench/python/overhead.py [--repeat N] [--json FILE]
"""
import argparse
import os
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


def time_ns(fn, repeat, cpu=None):
    """Wall-clock ns of `repeat` calls after a warm-up; appends the calling
    thread's CPU ns per call over them to `cpu`."""
    for _ in range(20):
        fn()
    samples = []
    c0 = time.thread_time_ns()
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    if cpu is not None:
        cpu.append((time.thread_time_ns() - c0) / repeat)
    return samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--compiled-kv", type=int, nargs="*", default=[16],
                        help="kv lengths that also time torch.compile(flex_attention)")
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
        compiled = None
        if torch is not None:
            assert np.array_equal(torch_default().numpy(), expected)
            if kv_len in args.compiled_kv:
                from torch.nn.attention.flex_attention import flex_attention
                flex = torch.compile(flex_attention, dynamic=False)
                k_torch, v_torch = torch.from_numpy(k), torch.from_numpy(v)
                start = time.perf_counter()
                got = flex(q_torch, k_torch, v_torch)
                compile_s = time.perf_counter() - start
                # The same attention: compare with pagedc's output.
                assert np.abs(got.numpy() - expected).max() < 1e-4

                def compiled():
                    return flex(q_torch, k_torch, v_torch)

        samples = {"cpp": [], "native": [], "public": []}
        if torch is not None:
            samples["torch_default"] = []
        if compiled is not None:
            samples["compiled"] = []
        per_round = max(1, args.repeat // args.rounds)
        cpu = {kind: [] for kind in samples}
        cpp(20)
        for _ in range(args.rounds):
            c0 = time.thread_time_ns()
            samples["cpp"] += cpp(per_round)
            cpu["cpp"].append((time.thread_time_ns() - c0) / per_round)
            samples["native"] += time_ns(native, per_round, cpu["native"])
            samples["public"] += time_ns(public, per_round, cpu["public"])
            if torch is not None:
                samples["torch_default"] += time_ns(torch_default, per_round,
                                                    cpu["torch_default"])
            if compiled is not None:
                samples["compiled"] += time_ns(compiled, per_round, cpu["compiled"])
        med = {kind: statistics.median(v) / 1000.0 for kind, v in samples.items()}
        deciles = {kind: statistics.quantiles(v, n=10) for kind, v in samples.items()}
        row = {"batch": B, "heads": H, "head_dim": D, "kv_len": kv_len, "page_size": 16,
               "mask": "causal", "calls_per_kind": per_round * args.rounds,
               "cpp_us": round(med["cpp"], 2), "native_us": round(med["native"], 2),
               "public_us": round(med["public"], 2),
               "added_by_python_us": round(med["public"] - med["cpp"], 2),
               "added_by_binding_us": round(med["native"] - med["cpp"], 2),
               "p10_p90_us": {kind: [round(d[0] / 1000.0, 2), round(d[-1] / 1000.0, 2)]
                              for kind, d in deciles.items()},
               "thread_cpu_min_us": {kind: round(min(v) / 1000.0, 2)
                                     for kind, v in cpu.items()}}
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
        if compiled is not None:
            row["torch_compiled_flex_us"] = round(med["compiled"], 2)
            row["torch_compile_s"] = round(compile_s, 1)
            row["torch_threads"] = torch.get_num_threads()
            row["torch_default_over_compiled"] = round(med["torch_default"] / med["compiled"], 3)
            line += (f"; torch.compile(flex_attention) {med['compiled']:.1f} us "
                     f"(pagedc torch call / compiled = {row['torch_default_over_compiled']:.2f})")
        rows.append(row)
        print(line)
        print("  thread CPU per call, min over rounds (us): " +
              ", ".join(f"{kind} {v}" for kind, v in row["thread_cpu_min_us"].items()))
    if args.json:
        write_results(args.json, "bench/python/overhead.py", rows,
                      unit="microseconds, medians", load_average=os.getloadavg(),
                      torch=None if torch is None else torch.__version__)

if __name__ == "__main__":
    main()
