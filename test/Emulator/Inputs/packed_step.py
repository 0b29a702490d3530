#!/usr/bin/env python3
"""One cascade step of BatchAttention's packed kernels, for seeded_bugs.py.

  packed_step.py -o OUT.npy --lse LSE.npy (--device emu | --reference)

Nine sequences in three groups, each group sharing its first 100 keys
(sequence 0's, 4's and 7's; whole pages shared, the partial seventh each
sequence's own copy), pages of 16 shuffled, f16, GQA 2, D 64. The prefix
level packs each group's queries as one entry over the prefix's pages
(kv_end 100) with each token's own position and sequence index (the token
maps): group 0's 28 tokens go to the packed prefill (fewer than 4 keys a
token), group 1's 6 to the packed decode, group 2's 13 to the GQA-packed
tiles (PrefillGroup.cuh). The suffix level is the flat step from kv_start
100 (a 24-token sequence on the prefill, a 9-token one over 196 keys on the
GQA-packed tiles, the others on the decode kernel; its page table -1 below
kv_start's page, which the kernels must not read).
The two are merged on the device (merge_state). The output is that
cascade's out and lse followed by the same step run flat with a fixed grid
(fixed_grid=True: launches sized by its limits, 11 sequences, whose CTAs
past the step's work exit at once; a fixed grid runs the GQA-packed
entries on the per-query-head tiles). The mask is a window per
sequence read by the row's sequence index (some rows see part of the
prefix, some none of it: fully masked there), the score a relative bias
(each row's own position counts).

--reference writes the float64 attention over every key (out as f32);
--device emu runs the kernels on the SIMT emulator (PAGEDC_TEMPLATE_DIR
and the checkers apply as for `pagedc run`). Inputs are the same on every
run (fixed seed).
"""
import numpy as np

from step_cli import step_main

SOURCE = """
buffer window: i32[B]
mask sliding(b, h, q, kv) = (q >= kv) & (q - kv <= window[b])
score relative(s, b, h, q, kv) = s - 0.01 * (q - kv)
"""
PREFIX, PAGE, HQ, HKV, D = 100, 16, 4, 2, 64
# (new tokens, keys) per sequence; groups [0, 4) and [4, 7).
SEQS = [(1, 150), (2, 140), (1, 200), (24, 133), (1, 170), (3, 161), (2, 300), (9, 260),
        (4, 240)]
GROUPS = [(0, 4), (4, 7), (7, 9)]
# Sequence 1's rows (positions 138, 139) see no prefix key.
WINDOW = np.array([80, 30, 150, 60, 100, 45, 250, 250, 200], dtype=np.int32)


def make_step():
    rng = np.random.default_rng(44)
    batch = len(SEQS)
    lens = np.array([s for _, s in SEQS], dtype=np.int32)
    news = np.array([n for n, _ in SEQS], dtype=np.int32)
    qsl = np.concatenate([[0], np.cumsum(news)]).astype(np.int32)
    # Dense K/V per sequence, f16 values; each group's prefix is its first
    # member's.
    dense_k = [rng.uniform(-1, 1, (HKV, s, D)).astype(np.float16) for s in lens]
    dense_v = [rng.uniform(-1, 1, (HKV, s, D)).astype(np.float16) for s in lens]
    for first, end in GROUPS:
        for b in range(first + 1, end):
            dense_k[b][:, :PREFIX] = dense_k[first][:, :PREFIX]
            dense_v[b][:, :PREFIX] = dense_v[first][:, :PREFIX]
    q = rng.uniform(-1, 1, (int(qsl[-1]), HQ, D)).astype(np.float16)
    # Pages: a group's whole prefix pages are its first member's.
    shared = PREFIX // PAGE
    columns = int(max(-(-s // PAGE) for s in lens)) + 1
    table = np.full((batch, columns), -1, dtype=np.int32)
    count = sum(-(-int(s) // PAGE) for s in lens) + 3
    order = iter(rng.permutation(count))
    k_cache = np.full((count, PAGE, HKV, D), np.nan, dtype=np.float16)
    v_cache = np.full_like(k_cache, np.nan)
    for first, end in GROUPS:
        for b in range(first, end):
            for j in range(-(-int(lens[b]) // PAGE)):
                table[b, j] = table[first, j] if b > first and j < shared else next(order)
            for pos in range(int(lens[b])):
                page, slot = table[b, pos // PAGE], pos % PAGE
                k_cache[page, slot] = dense_k[b][:, pos]
                v_cache[page, slot] = dense_v[b][:, pos]
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, qsl=qsl, lens=lens, news=news,
                table=table, dense_k=dense_k, dense_v=dense_v)


def reference(step):
    """float64 attention of every row over all of its sequence's keys."""
    out = np.zeros((step["q"].shape[0], HQ, D))
    lse = np.zeros((step["q"].shape[0], HQ))
    group = HQ // HKV
    for b, (new, keys) in enumerate(SEQS):
        rows = slice(step["qsl"][b], step["qsl"][b + 1])
        q = step["q"][rows].astype(np.float64)                       # [L, Hq, D]
        k = np.repeat(step["dense_k"][b].astype(np.float64), group, axis=0)  # [Hq, S, D]
        v = np.repeat(step["dense_v"][b].astype(np.float64), group, axis=0)
        s = np.einsum("lhd,hsd->hls", q, k) / np.sqrt(D)
        qi = (keys - new + np.arange(new)).reshape(1, new, 1)
        kv = np.arange(keys).reshape(1, 1, keys)
        s = s - 0.01 * (qi - kv)
        s = np.where((qi >= kv) & (qi - kv <= WINDOW[b]), s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        total = p.sum(axis=-1, keepdims=True)
        out[rows] = np.einsum("hls,hsd->lhd", p / total, v)
        lse[rows] = (np.log(total) + m)[..., 0].T
    return out, lse


def run_on_device(step):
    import pagedc
    mods = pagedc.compile(SOURCE, cuda=True)
    batch, tokens, columns = len(SEQS), int(step["qsl"][-1]), step["table"].shape[1]
    args = (mods, HQ, HKV, D, PAGE, "NHD", batch + 2, tokens + 4, "emu")
    options = dict(max_blocks_per_seq=columns, dtype="f16")
    prefix_level = pagedc.BatchAttention(*args, **options)
    suffix_level = pagedc.BatchAttention(*args, **options)
    # The prefix level: one entry per group over its first member's row.
    starts = [int(step["qsl"][first]) for first, _ in GROUPS] + [tokens]
    rows = [first for first, _ in GROUPS]
    positions = np.concatenate([step["lens"][b] - step["news"][b] + np.arange(step["news"][b])
                                for b in range(batch)]).astype(np.int32)
    token_batch = np.repeat(np.arange(batch, dtype=np.int32), step["news"])
    prefix_level.plan(np.array(starts, dtype=np.int32), step["lens"][rows], step["table"][rows],
                      kv_end=np.full(len(GROUPS), PREFIX, dtype=np.int32),
                      token_positions=positions, token_batch=token_batch)
    # The suffix level: no page below kv_start's.
    table = step["table"].copy()
    table[:, :PREFIX // PAGE] = -1
    suffix_level.plan(step["qsl"], step["lens"], table,
                      kv_start=np.full(batch, PREFIX, dtype=np.int32))
    device = {name: pagedc.to_device(step[name], device="emu")
              for name in ("q", "k_cache", "v_cache")}
    window = {"window": pagedc.to_device(WINDOW, device="emu")}
    stream = pagedc.Stream("emu")
    out, lse = suffix_level.run(device["q"], device["k_cache"], device["v_cache"],
                                buffers=window, return_lse=True, stream=stream)
    prefix_out, prefix_lse = prefix_level.run(device["q"], device["k_cache"],
                                              device["v_cache"], buffers=window,
                                              return_lse=True, stream=stream)
    pagedc.merge_state_in_place(out, lse, prefix_out, prefix_lse, stream=stream)
    flat = pagedc.BatchAttention(*args, fixed_grid=True, **options)
    flat.plan(step["qsl"], step["lens"], step["table"])
    flat_out, flat_lse = flat.run(device["q"], device["k_cache"], device["v_cache"],
                                  buffers=window, return_lse=True, stream=stream)
    stream.synchronize()
    return (np.concatenate([pagedc.to_host(out), pagedc.to_host(flat_out)]).astype(np.float32),
            np.concatenate([pagedc.to_host(lse), pagedc.to_host(flat_lse)]))


def doubled_reference(step):
    """The reference of the cascade step, twice: run_on_device returns the
    cascade's rows and then the flat batch's."""
    out, lse = reference(step)
    return np.concatenate([out, out]), np.concatenate([lse, lse])


if __name__ == "__main__":
    step_main(make_step, doubled_reference, run_on_device)
