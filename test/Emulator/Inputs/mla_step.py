#!/usr/bin/env python3
"""One MLA decode step of BatchAttention (templates/MlaDecode.cuh), for
seeded_bugs.py.

  mla_step.py -o OUT.npy --lse LSE.npy (--device emu | --reference)

Three sequences of 1, 3 and 2 new tokens with 150, 77 and 300 keys, Hq 16
against one 576-wide latent KV head on shuffled pages of 16 (NHD), whose
first 512 columns are the values (v_cache a view of k_cache), f16, scale
1 / sqrt(192), a causal mask and tanh soft-capping. --reference writes the
float64 attention (out as f32); --device emu runs the kernel on the SIMT
emulator (PAGEDC_TEMPLATE_DIR and the checkers apply as for `pagedc run`).
Inputs are the same on every run (fixed seed).
"""
import numpy as np

from step_cli import step_main

SOURCE = """
mask causal(b, h, q, kv) = q >= kv
score softcap(s, b, h, q, kv) = 2.0 * tanh(s / 2.0)
"""
PAGE, HQ, D, DV = 16, 16, 576, 512
SCALE = 1.0 / np.sqrt(192.0)
SEQS = [(1, 150), (3, 77), (2, 300)]


def make_step():
    rng = np.random.default_rng(46)
    lens = np.array([s for _, s in SEQS], dtype=np.int32)
    news = np.array([n for n, _ in SEQS], dtype=np.int32)
    qsl = np.concatenate([[0], np.cumsum(news)]).astype(np.int32)
    latents = [rng.uniform(-1, 1, (s, D)).astype(np.float16) for s in lens]
    q = rng.uniform(-1, 1, (int(qsl[-1]), HQ, D)).astype(np.float16)
    pages = [-(-int(s) // PAGE) for s in lens]
    order = iter(rng.permutation(sum(pages) + 2))
    table = np.full((len(SEQS), max(pages) + 1), -1, dtype=np.int32)
    cache = np.full((sum(pages) + 2, PAGE, 1, D), np.nan, dtype=np.float16)
    for b, s in enumerate(lens):
        for j in range(pages[b]):
            table[b, j] = next(order)
        for pos in range(int(s)):
            cache[table[b, pos // PAGE], pos % PAGE, 0] = latents[b][pos]
    return dict(q=q, cache=cache, qsl=qsl, lens=lens, table=table, latents=latents)


def reference(step):
    out = np.zeros((step["q"].shape[0], HQ, DV))
    lse = np.zeros((step["q"].shape[0], HQ))
    for b, (new, keys) in enumerate(SEQS):
        rows = slice(step["qsl"][b], step["qsl"][b + 1])
        q = step["q"][rows].astype(np.float64)                 # [L, Hq, D]
        latent = step["latents"][b].astype(np.float64)         # [S, D]
        s = np.einsum("lhd,sd->hls", q, latent) * SCALE
        s = 2.0 * np.tanh(s / 2.0)
        qi = (keys - new + np.arange(new)).reshape(1, new, 1)
        kv = np.arange(keys).reshape(1, 1, keys)
        s = np.where(qi >= kv, s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - m)
        total = p.sum(axis=-1, keepdims=True)
        out[rows] = np.einsum("hls,sd->lhd", p / total, latent[:, :DV])
        lse[rows] = (np.log(total) + m)[..., 0].T
    return out, lse


def run_on_device(step):
    import pagedc
    mods = pagedc.compile(SOURCE, cuda=True)
    attention = pagedc.BatchAttention(mods, HQ, 1, D, PAGE, kv_layout="NHD", value_head_dim=DV,
                                      max_num_seqs=4, max_num_tokens=8, device="emu",
                                      dtype="f16", max_blocks_per_seq=step["table"].shape[1])
    attention.plan(step["qsl"], step["lens"], step["table"])
    cache = pagedc.to_device(step["cache"], device="emu")
    values = pagedc._pagedc._strided_view(cache, 1, DV)
    out, lse = attention.run(pagedc.to_device(step["q"], device="emu"), cache, values,
                             scale=SCALE, return_lse=True)
    return pagedc.to_host(out).astype(np.float32), pagedc.to_host(lse)



if __name__ == "__main__":
    step_main(make_step, reference, run_on_device)
