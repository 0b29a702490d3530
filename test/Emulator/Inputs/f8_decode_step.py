#!/usr/bin/env python3
"""A decode step of BatchAttention's packed decode over 8-bit float caches,
for seeded_bugs.py.

  f8_decode_step.py -o OUT.npy --lse LSE.npy (--device emu | --reference)

Four sequences of one new token each over 1100, 77, 300 and 150 keys
(lengths that are not multiples of the 64-key tile; the first is split
across CTAs and merged), GQA 4 (Hq 8, Hkv 2), head dim 128 (the kernel that
holds a tile's codes in registers), pages of 16 in shuffled order, the
caches f8e4m3 codes (uint8 arrays read through kv_dtype) with a scale per
KV head, q f16, causal (every key seen).

--reference writes the float64 attention over the dequantized codes (out as
f32); --device emu runs the kernels on the SIMT emulator (PAGEDC_TEMPLATE_DIR
and the checkers apply as for `pagedc run`). Inputs are the same on every
run (fixed seed).
"""
import numpy as np

from step_cli import step_main

SOURCE = "mask causal(b, h, q, kv) = q >= kv\n"
PAGE, HQ, HKV, D = 16, 8, 2, 128
LENS = [1100, 77, 300, 150]
K_SCALE = [0.05, 0.03]
V_SCALE = [0.02, 0.04]


def e4m3(codes):
    """float64 values of f8e4m3 codes (no NaN codes are generated)."""
    codes = codes.astype(np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent, mantissa = (codes >> 3) & 15, codes & 7
    value = np.where(exponent == 0, mantissa / 8.0 * 2.0 ** -6,
                     (1 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    return sign * value


def make_step():
    rng = np.random.default_rng(46)
    batch = len(LENS)
    # Codes of magnitude up to 2^3 * 1.875 (exponents 0-10).
    codes = [[rng.integers(0, 0x58, (HKV, s, D)) | (rng.integers(0, 2, (HKV, s, D)) << 7)
              for s in LENS] for _ in range(2)]
    q = rng.uniform(-1, 1, (batch, HQ, D)).astype(np.float16)
    columns = -(-max(LENS) // PAGE)
    count = sum(-(-s // PAGE) for s in LENS) + 5
    order = iter(rng.permutation(count))
    table = np.zeros((batch, columns), dtype=np.int32)
    # Unread slots hold 0x7f (NaN) codes: a kernel reading one shows.
    k_cache = np.full((count, PAGE, HKV, D), 0x7f, dtype=np.uint8)
    v_cache = np.full_like(k_cache, 0x7f)
    for b, s in enumerate(LENS):
        for j in range(-(-s // PAGE)):
            table[b, j] = next(order)
        for pos in range(s):
            page, slot = table[b, pos // PAGE], pos % PAGE
            k_cache[page, slot] = codes[0][b][:, pos]
            v_cache[page, slot] = codes[1][b][:, pos]
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, table=table, codes=codes)


def reference(step):
    out = np.zeros((len(LENS), HQ, D))
    lse = np.zeros((len(LENS), HQ))
    group = HQ // HKV
    scale_k = np.repeat(np.array(K_SCALE), group).reshape(HQ, 1)
    scale_v = np.repeat(np.array(V_SCALE), group).reshape(HQ, 1, 1)
    for b, s in enumerate(LENS):
        k = np.repeat(e4m3(step["codes"][0][b]), group, axis=0)   # [Hq, S, D]
        v = np.repeat(e4m3(step["codes"][1][b]), group, axis=0)
        scores = np.einsum("hd,hsd->hs", step["q"][b].astype(np.float64), k)
        scores = scores * scale_k / np.sqrt(D)
        m = scores.max(axis=-1, keepdims=True)
        p = np.exp(scores - m)
        total = p.sum(axis=-1, keepdims=True)
        out[b] = np.einsum("hs,hsd->hd", p / total, v * scale_v)
        lse[b] = (np.log(total) + m)[:, 0]
    return out, lse


def run_on_device(step):
    import pagedc
    mods = pagedc.compile(SOURCE, cuda=True)
    batch = len(LENS)
    attention = pagedc.BatchAttention(mods, HQ, HKV, D, PAGE, max_num_seqs=batch,
                                      max_num_tokens=batch, device="emu", dtype="f16",
                                      kv_dtype="float8_e4m3fn")
    attention.plan(np.arange(batch + 1, dtype=np.int32), np.array(LENS, dtype=np.int32),
                   step["table"])
    q, k, v = (pagedc.to_device(step[name], device="emu")
               for name in ("q", "k_cache", "v_cache"))
    out, lse = attention.run(q, k, v, return_lse=True, kv_dtype="float8_e4m3fn",
                             k_scale=K_SCALE, v_scale=V_SCALE)
    return pagedc.to_host(out).astype(np.float32), pagedc.to_host(lse)



if __name__ == "__main__":
    step_main(make_step, reference, run_on_device)
