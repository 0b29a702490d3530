#!/usr/bin/env python3
"""Cascade against the flat step on the CPU backend: 64 decoding sequences
that share a 4096-token prefix (as fork() leaves them: the same pages), each
with its own 1-128 further keys; Hq 32, Hkv 8, D 128, pages of 16, f32,
causal. The flat BatchAttention reads the prefix once per sequence, the
CascadeAttention once per KV head for the group. Medians of alternating
rounds; the two outputs are compared first.

    PYTHONPATH=build/python python3 bench/python/cascade.py [--reps N] [--json FILE]
"""
import argparse
import statistics
import time

import numpy as np

import pagedc
from results import write_results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=4096)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    hq, hkv, d, page = 32, 8, 128, 16
    seqs, prefix = args.sequences, args.prefix
    own = rng.integers(1, 129, size=seqs)
    prefix_pages = prefix // page
    own_pages = [-(-int(n) // page) for n in own]
    n_pages = prefix_pages + sum(own_pages)
    cache = [rng.standard_normal((n_pages, page, hkv, d), dtype=np.float32) for _ in range(2)]
    columns = prefix_pages + max(own_pages)
    table = np.zeros((seqs, columns), dtype=np.int32)
    next_page = prefix_pages
    for b in range(seqs):
        table[b, :prefix_pages] = np.arange(prefix_pages)
        table[b, prefix_pages:prefix_pages + own_pages[b]] = np.arange(
            next_page, next_page + own_pages[b])
        next_page += own_pages[b]
    lens = (prefix + own).astype(np.int32)
    qsl = np.arange(seqs + 1, dtype=np.int32)
    q = rng.standard_normal((seqs, hq, d), dtype=np.float32)
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
    options = dict(max_num_seqs=seqs, max_num_tokens=seqs)
    flat = pagedc.BatchAttention(mods, hq, hkv, d, page, **options)
    flat.plan(qsl, lens, table)
    cascade = pagedc.CascadeAttention(mods, hq, hkv, d, page, **options)
    cascade.plan(qsl, lens, table, [(0, seqs, prefix)])
    want = flat.run(q, *cache)
    got = cascade.run(q, *cache)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    times = {"flat": [], "cascade": []}
    for _ in range(args.reps):
        for name, attention in (("flat", flat), ("cascade", cascade)):
            t0 = time.perf_counter()
            attention.run(q, *cache)
            times[name].append(time.perf_counter() - t0)
    flat_ms = statistics.median(times["flat"]) * 1e3
    cascade_ms = statistics.median(times["cascade"]) * 1e3
    prefix_bytes = 2 * prefix * hkv * d * 4
    print(f"{seqs} sequences sharing {prefix} tokens (prefix K+V {prefix_bytes / 1e6:.0f} MB), "
          f"Hq {hq} Hkv {hkv} D {d}: flat {flat_ms:.1f} ms, cascade {cascade_ms:.1f} ms, "
          f"flat/cascade {flat_ms / cascade_ms:.2f}")
    if args.json:
        write_results(args.json, "bench/python/cascade.py",
                      [{"sequences": seqs, "prefix": prefix, "heads_q": hq, "heads_kv": hkv,
                        "head_dim": d, "page_size": page, "flat_ms": round(flat_ms, 3),
                        "cascade_ms": round(cascade_ms, 3),
                        "flat_over_cascade": round(flat_ms / cascade_ms, 3)}],
                      unit="milliseconds, medians", reps=args.reps)


if __name__ == "__main__":
    main()
