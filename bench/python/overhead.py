#!/usr/bin/env python3
"""Per-call overhead of pagedc.flex_attention from Python on a decode step.

Times, on the same cache and a tiny decode (1 query row per sequence, so the
attention itself is a few microseconds): the public Python call
(pagedc.flex_attention: argument handling, DLPack, NumPy output), the native
binding alone (pagedc._pagedc.flex_attention), and the same decode with a
larger KV length for scale. Median of --repeat calls after a warm-up.

    PYTHONPATH=build/python python3 bench/python/overhead.py [--repeat N]

Not yet here: the C++ flexAttention() call timed in the same run (a C++
harness), and from_torch vs torch.compile cold cost (needs PyTorch).
"""
import argparse
import statistics
import time

import numpy as np

import pagedc
from pagedc import _pagedc


def median_us(fn, repeat):
    for _ in range(20):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for kv_len in (16, 1024):
        B, H, D = 4, 8, 64
        cache = pagedc.PagedKVCache(B * kv_len // 16 + 8, 16, B, H, D)
        cache.reserve(list(range(B)), kv_len)
        k = rng.standard_normal((B, H, kv_len, D), dtype=np.float32)
        cache.assign(np.arange(B, dtype=np.int32),
                     np.tile(np.arange(kv_len, dtype=np.int32), (B, 1)), k, k)
        mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
        q = rng.standard_normal((B, H, 1, D), dtype=np.float32)
        out = np.empty_like(q)
        slots, lengths, offsets = list(range(B)), [kv_len] * B, [kv_len - 1] * B

        def public():
            pagedc.flex_attention(q, cache, mods=mods, q_offset="end", out=out, threads=1)

        def native():
            _pagedc.flex_attention(q, cache._native, None, mods._native, {}, {}, slots,
                                   lengths, offsets, None, False, out, None, 1)

        t_public = median_us(public, args.repeat)
        t_native = median_us(native, args.repeat)
        print(f"decode B={B} H={H} D={D} kv={kv_len}: pagedc.flex_attention {t_public:.1f} us, "
              f"native binding {t_native:.1f} us, Python layer adds {t_public - t_native:.1f} us")


if __name__ == "__main__":
    main()
