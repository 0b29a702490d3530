#!/usr/bin/env python3
"""A paged decode loop the way a serving engine runs one (continuous batching).

Requests arrive over time; each is prefilled into its own cache slot, then
every step decodes one token for every running sequence in one batched
flex_attention call over the paged KV cache. Finished sequences are erased
(their pages go back to the free list) and new ones take their slots. Two
requests share a system prompt: the second forks the first's prefix instead
of recomputing it. Every attention output is checked against a float64 NumPy
reference of the same sequence.

    PYTHONPATH=build/python python3 examples/python/serve_loop.py [--steps N] [--seed S]

The "model" is random projections: the point is the cache and attention
bookkeeping, not the tokens.
"""
import argparse
import sys

import numpy as np

import pagedc

HEADS_Q, HEADS_KV, DIM, PAGE = 8, 2, 32, 16


def reference(q, k, v, q_offset, window):
    """float64 sliding-window causal attention of q [Hq, L, D] over k/v [Hkv, S, D]."""
    g = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, g, 0).astype(np.float64), np.repeat(v, g, 0).astype(np.float64)
    s = np.einsum("hld,hsd->hls", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    qi = q_offset + np.arange(q.shape[1])[:, None]
    kv = np.arange(k.shape[1])[None, :]
    s = np.where((qi >= kv) & (qi - kv <= window), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


class Sequence:
    def __init__(self, sid, slot, prompt_len, max_new):
        self.sid, self.slot = sid, slot
        self.prompt_len, self.max_new = prompt_len, max_new
        self.k = self.v = None  # the sequence's keys/values, for the reference check
        self.generated = 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slots", type=int, default=6)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    window = 48

    # The mods: a traced Python mask_mod, as a PyTorch user writes it.
    def sliding_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)

    mods = pagedc.from_torch(mask_mod=sliding_causal)
    cache = pagedc.PagedKVCache(n_pages=96, page_size=PAGE, max_batch_size=args.slots,
                                heads=HEADS_KV, head_dim=DIM)
    free_slots = list(range(args.slots))
    running = {}
    system_prompt = None  # (slot, length) of the shared prefix's owner
    worst = 0.0
    served = 0
    forks = 0
    next_id = 0

    def kv(n):
        return (rng.standard_normal((1, HEADS_KV, n, DIM), dtype=np.float32),
                rng.standard_normal((1, HEADS_KV, n, DIM), dtype=np.float32))

    def check(seq, q, out, q_offset):
        nonlocal worst
        ref = reference(q[0], seq.k[0], seq.v[0], q_offset, window)
        worst = max(worst, float(np.abs(out[0] - ref).max()))

    for step in range(args.steps):
        # 1. Arrivals: up to two new requests per step while slots are free.
        for _ in range(int(rng.integers(0, 3))):
            if not free_slots:
                break
            slot = free_slots.pop(0)
            seq = Sequence(next_id, slot, int(rng.integers(8, 60)), int(rng.integers(3, 20)))
            next_id += 1
            if system_prompt is not None and rng.random() < 0.5 \
                    and system_prompt[0] in running:
                # Shared prefix: fork the owner's first `length` tokens.
                owner = running[system_prompt[0]]
                length = system_prompt[1]
                cache.fork(owner.slot, slot, length)
                forks += 1
                seq.k, seq.v = owner.k[:, :, :length].copy(), owner.v[:, :, :length].copy()
                start = length
            else:
                seq.k = np.zeros((1, HEADS_KV, 0, DIM), np.float32)
                seq.v = seq.k.copy()
                start = 0
            # 2. Prefill the rest of the prompt.
            n = seq.prompt_len
            cache.reserve(slot, start + n)
            k, v = kv(n)
            cache.assign([slot], np.arange(start, start + n, dtype=np.int32)[None], k, v)
            seq.k = np.concatenate([seq.k, k], axis=2)
            seq.v = np.concatenate([seq.v, v], axis=2)
            q = rng.standard_normal((1, HEADS_Q, n, DIM), dtype=np.float32)
            out = pagedc.flex_attention(q, cache, mods=mods, batch_idx=[slot],
                                        q_offset=start, enable_gqa=True)
            check(seq, q, out, start)
            running[slot] = seq
            if system_prompt is None:
                system_prompt = (slot, min(start + n, 32))
        if not running:
            continue
        # 3. One decode step for every running sequence, batched.
        slots = sorted(running)
        for slot in slots:
            seq = running[slot]
            pos = seq.k.shape[2]
            cache.reserve(slot, pos + 1)
            k, v = kv(1)
            cache.assign([slot], np.array([[pos]], dtype=np.int32), k, v)
            seq.k = np.concatenate([seq.k, k], axis=2)
            seq.v = np.concatenate([seq.v, v], axis=2)
        q = rng.standard_normal((len(slots), HEADS_Q, 1, DIM), dtype=np.float32)
        out = pagedc.flex_attention(q, cache, mods=mods, batch_idx=slots, q_offset="end",
                                    enable_gqa=True)
        for i, slot in enumerate(slots):
            seq = running[slot]
            check(seq, q[i:i + 1], out[i:i + 1], seq.k.shape[2] - 1)
            seq.generated += 1
        # 4. Finished sequences free their slots and pages.
        for slot in slots:
            if running[slot].generated >= running[slot].max_new:
                del running[slot]
                cache.erase(slot)
                free_slots.append(slot)
                served += 1
                if system_prompt and system_prompt[0] == slot:
                    system_prompt = None
        print(f"step {step:3d}: running {len(running)}, served {served}, "
              f"free pages {len(cache.free_pages)}/{cache.n_pages}")
    for slot in list(running):
        cache.erase(slot)
    ok = worst < 1e-4 and len(cache.free_pages) == cache.n_pages
    print(f"served {served} sequences ({forks} forked a shared prefix); max |out - float64 reference| = {worst:.2e}; "
          f"all pages free again: {len(cache.free_pages) == cache.n_pages}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
