"""pagedc.BatchAttention and merge_state from Python against the float64
reference: mixed steps in every cache layout, per-sequence captured buffers
indexed by b, zero-copy cache reads, merge of two key ranges, bad metadata."""
import numpy as np
import pytest

import pagedc
from conftest import assert_close, randn, reference_attention

SOURCE = """
buffer doc: i32[B, S]
buffer prefix: i32[B]
mask document(b, h, q, kv) = (doc[b, q] == doc[b, kv]) & (q >= kv)
mask prefix_lm(b, h, q, kv) = (kv < prefix[b]) | (q >= kv)
"""

# (new tokens, keys): decode, speculative, chunked prefill at the end of a
# longer context, a whole prompt, no new tokens.
STEP = [(1, 90), (4, 33), (37, 300), (0, 20), (50, 50), (1, 1), (3, 129)]


def make_step(rng, layout, page_size, hq=4, hkv=2, d=32, steps=STEP):
    """Random dense K/V per sequence written into one engine-style cache
    allocation on shuffled pages; returns everything a check needs."""
    pages_needed = [-(-s // page_size) for _, s in steps]
    n_pages = sum(pages_needed) + 2
    order = rng.permutation(n_pages)
    columns = max(pages_needed) + 1
    table = np.full((len(steps), columns), -1, dtype=np.int32)
    shape = {"NHD": (n_pages, page_size, hkv, d), "HND": (n_pages, hkv, page_size, d),
             "pagedc": (hkv, n_pages, page_size, d), "vllm": (2, n_pages, page_size, hkv, d)}
    if layout == "vllm":
        kv = np.full(shape["vllm"], np.nan, dtype=np.float32)
        k_cache, v_cache = kv[0], kv[1]
    else:
        k_cache = np.full(shape[layout], np.nan, dtype=np.float32)
        v_cache = np.full(shape[layout], np.nan, dtype=np.float32)
    dense_k, dense_v, next_page = [], [], 0
    for b, (_, s) in enumerate(steps):
        k, v = randn(rng, hkv, s, d), randn(rng, hkv, s, d)
        dense_k.append(k)
        dense_v.append(v)
        for j in range(pages_needed[b]):
            table[b, j] = order[next_page]
            next_page += 1
        for pos in range(s):
            page, slot = table[b, pos // page_size], pos % page_size
            for cache, src in ((k_cache, k), (v_cache, v)):
                if layout in ("NHD", "vllm"):
                    cache[page, slot] = src[:, pos]
                elif layout == "HND":
                    cache[page, :, slot] = src[:, pos]
                else:
                    cache[:, page, slot] = src[:, pos]
    qsl = np.cumsum([0] + [n for n, _ in steps]).astype(np.int32)
    seq_lens = np.array([s for _, s in steps], dtype=np.int32)
    q = randn(rng, int(qsl[-1]), hq, d)
    if layout == "vllm":
        caches = (kv, None)
    else:
        caches = (k_cache, v_cache)
    return dict(q=q, caches=caches, qsl=qsl, seq_lens=seq_lens, table=table, dense_k=dense_k,
                dense_v=dense_v, hq=hq, hkv=hkv, d=d)


def reference_step(step, mask_fn=None):
    """Per sequence b, the float64 reference with the mods seeing b."""
    outs, lses = [], []
    for b in range(len(step["seq_lens"])):
        start, end = step["qsl"][b], step["qsl"][b + 1]
        n, s = end - start, int(step["seq_lens"][b])
        if n == 0:
            continue
        q = step["q"][start:end].transpose(1, 0, 2)[None]
        fn = None if mask_fn is None else (
            lambda _b, h, qi, kv, b=b: mask_fn(b, h, qi, kv))
        out, lse = reference_attention(q, step["dense_k"][b][None], step["dense_v"][b][None],
                                       mask_fn=fn, q_offset=s - n)
        outs.append(out[0].transpose(1, 0, 2))
        lses.append(lse[0].T)
    return np.concatenate(outs), np.concatenate(lses)


@pytest.mark.parametrize("layout,page_size", [("NHD", 16), ("HND", 1), ("vllm", 16),
                                              ("pagedc", 128)])
def test_mixed_step_matches_reference_in_every_layout(rng, layout, page_size):
    step = make_step(rng, layout, page_size)
    mods = pagedc.compile(SOURCE, mask="document")
    max_s = int(step["seq_lens"].max())
    doc = np.cumsum(rng.random((len(STEP), max_s)) < 0.05, axis=1).astype(np.int32)
    attn = pagedc.BatchAttention(mods, step["hq"], step["hkv"], step["d"], page_size,
                                 kv_layout=layout, max_num_seqs=16, max_num_tokens=200)
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    k_cache, v_cache = step["caches"]
    out, lse = attn.run(step["q"], k_cache, v_cache, buffers={"doc": doc},
                        params={}, return_lse=True)
    assert isinstance(out, np.ndarray) and out.shape == step["q"].shape
    ref_out, ref_lse = reference_step(
        step, lambda b, h, qi, kv: (doc[b][qi] == doc[b][kv]) & (qi >= kv))
    assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def test_prefix_lm_per_sequence_and_out_written_in_place(rng):
    step = make_step(rng, "NHD", 16)
    mods = pagedc.compile(SOURCE, mask="prefix_lm")
    prefix = rng.integers(0, 60, size=len(STEP)).astype(np.int32)
    attn = pagedc.BatchAttention(mods, step["hq"], step["hkv"], step["d"], 16,
                                 max_num_seqs=8, max_num_tokens=100)
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    out = np.full(step["q"].shape, np.nan, dtype=np.float32)
    result = attn.run(step["q"], *step["caches"], buffers={"prefix": prefix}, out=out)
    assert result is out
    ref_out, _ = reference_step(step, lambda b, h, qi, kv: (kv < prefix[b]) | (qi >= kv))
    assert_close(out, ref_out, atol=1e-4, rtol=1e-4)


WINDOW_SOURCE = """
const WINDOW = 100
param window: i32 = 100
mask fixed(b, h, q, kv) = (q >= kv) & (q - kv < WINDOW)
mask by_param(b, h, q, kv) = (q >= kv) & (q - kv < window)
"""


def test_a_constant_window_reads_its_own_keys(rng):
    # The compiler's block classifier bounds a constant window when plan()
    # runs: each sequence's keys start at its window's 64-key granule; a
    # window given as a param is only known at run(), so it reads from 0.
    steps = [(1, 900), (3, 700), (37, 300), (0, 40), (61, 61), (1, 150)]
    step = make_step(rng, "NHD", 16, steps=steps)
    expected = [0 if n == 0 or s - n - 99 <= 0 else (s - n - 99) // 64 * 64 for n, s in steps]
    for mask, starts in (("fixed", expected), ("by_param", [0] * len(steps))):
        mods = pagedc.compile(WINDOW_SOURCE, mask=mask)
        attn = pagedc.BatchAttention(mods, step["hq"], step["hkv"], step["d"], 16,
                                     max_num_seqs=8, max_num_tokens=200)
        attn.plan(step["qsl"], step["seq_lens"], step["table"])
        assert [attn.key_range(b) for b in range(len(steps))] == \
            [(start, s) for start, (_, s) in zip(starts, steps)], mask
        out, lse = attn.run(step["q"], *step["caches"], return_lse=True)
        ref_out, ref_lse = reference_step(step, lambda b, h, qi, kv: (qi >= kv) & (qi - kv < 100))
        assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="sequence 6 is not in the plan, which has 6"):
        attn.key_range(len(steps))


def test_plan_errors_name_the_argument(rng):
    attn = pagedc.BatchAttention(None, 4, 2, 32, 16, max_num_seqs=2, max_num_tokens=8,
                                 max_blocks_per_seq=4)
    table = np.zeros((2, 4), dtype=np.int32)
    with pytest.raises(ValueError, match="query_start_loc decreases"):
        attn.plan([0, 3, 2], [3, 3], table)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 1 is less than"):
        attn.plan([0, 2], [1], table)
    with pytest.raises(ValueError, match="max_num_tokens"):
        attn.plan([0, 9], [9], table)
    with pytest.raises(ValueError, match="max_num_seqs"):
        attn.plan([0, 1, 2, 3], [1, 1, 1], np.zeros((3, 4), dtype=np.int32))
    with pytest.raises(ValueError, match="does not fit int32"):
        attn.plan([0, 1], [2**40], table)
    with pytest.raises(ValueError, match="run\\(\\) needs a plan"):
        attn.run(np.zeros((1, 4, 32), np.float32), np.zeros((2, 16, 2, 32), np.float32),
                 np.zeros((2, 16, 2, 32), np.float32))
    attn.plan([0, 1], [20], np.array([[0, 1, 0, 0]], dtype=np.int32))
    q = randn(rng, 1, 4, 32)
    small = np.zeros((1, 16, 2, 32), np.float32)
    with pytest.raises(ValueError, match="block_table holds page 1 but the cache has 1 pages"):
        attn.run(q, small, small)
    with pytest.raises(ValueError, match="kv_layout"):
        pagedc.BatchAttention(None, 4, 2, 32, 16, kv_layout="NDH")
    with pytest.raises(ValueError, match="^device: expected 'cpu', 'emu', 'cuda' or 'cuda:N'"):
        pagedc.BatchAttention(None, 4, 2, 32, 16, device="tpu")


def test_merge_state_of_two_key_ranges_equals_the_whole(rng):
    t, h, d, s = 6, 4, 32, 100
    q, k, v = randn(rng, 1, h, t, d), randn(rng, 1, h, s, d), randn(rng, 1, h, s, d)
    whole, whole_lse = reference_attention(q, k, v)
    parts = [reference_attention(q, k[:, :, a:e], v[:, :, a:e]) for a, e in ((0, 37), (37, s))]
    (va, sa), (vb, sb) = [(o[0].transpose(1, 0, 2).astype(np.float32),
                           l[0].T.astype(np.float32)) for o, l in parts]
    merged, lse = pagedc.merge_state(va, sa, vb, sb)
    assert_close(merged, whole[0].transpose(1, 0, 2), atol=1e-5, rtol=1e-5)
    assert_close(lse, whole_lse[0].T, atol=1e-5, rtol=1e-5)
    stacked_v = np.stack([va, vb], axis=1)
    stacked_s = np.stack([sa, sb], axis=1)
    merged_n, lse_n = pagedc.merge_states(stacked_v, stacked_s)
    assert_close(merged_n, merged, atol=1e-6, rtol=1e-6)
    pagedc.merge_state_in_place(va, sa, vb, sb)
    assert_close(va, merged, atol=0, rtol=0)
    with pytest.raises(ValueError, match="s_b must be"):
        pagedc.merge_state(va, sa, vb, sb[:2])


def test_shared_prefix_and_suffix_plans_merge_to_the_whole(rng):
    step = make_step(rng, "NHD", 16)
    attn = [pagedc.BatchAttention(None, step["hq"], step["hkv"], step["d"], 16,
                                  max_num_seqs=8, max_num_tokens=100) for _ in range(3)]
    split = np.minimum(step["seq_lens"], 32).astype(np.int32)
    attn[0].plan(step["qsl"], step["seq_lens"], step["table"])
    attn[1].plan(step["qsl"], step["seq_lens"], step["table"], kv_end=split)
    attn[2].plan(step["qsl"], step["seq_lens"], step["table"], kv_start=split)
    (whole, lse), (va, sa), (vb, sb) = [a.run(step["q"], *step["caches"], return_lse=True)
                                        for a in attn]
    merged, merged_lse = pagedc.merge_state(va, sa, vb, sb)
    assert_close(merged, whole, atol=1e-5, rtol=1e-5)
    assert_close(merged_lse, lse, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="kv_start"):
        attn[2].plan(step["qsl"], step["seq_lens"], step["table"], kv_start=split[:2])


def test_pagedc_cache_storage_runs_in_place_and_agrees_with_flex_attention(rng):
    # A PagedKVCache's own storage and page table are a "pagedc" layout step.
    cache = pagedc.PagedKVCache(n_pages=24, page_size=16, max_batch_size=3, heads=2,
                                head_dim=32)
    lengths, new = [70, 5, 40], [1, 5, 8]
    for slot, n in enumerate(lengths):
        cache.reserve(slot, n)
        k, v = randn(rng, 1, 2, n, 32), randn(rng, 1, 2, n, 32)
        cache.assign([slot], np.arange(n, dtype=np.int32)[None], k, v)
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
    qsl = np.cumsum([0] + new).astype(np.int32)
    q = randn(rng, int(qsl[-1]), 4, 32)
    attn = pagedc.BatchAttention(mods, 4, 2, 32, 16, kv_layout="pagedc", max_num_seqs=3,
                                 max_num_tokens=16)
    attn.plan(qsl, np.array(lengths, np.int32), cache.page_table)
    k_cache = cache.k_cache
    out = attn.run(q, k_cache, cache.v_cache)
    assert k_cache.__array_interface__["data"][0] == cache.k_cache.__array_interface__["data"][0]
    for b, (n, m) in enumerate(zip(lengths, new)):
        rows = q[qsl[b]:qsl[b + 1]].transpose(1, 0, 2)[None]
        expected = pagedc.flex_attention(rows, cache, mods=mods, enable_gqa=True,
                                         batch_idx=[b], kv_length=[n], q_offset="end")
        assert_close(out[qsl[b]:qsl[b + 1]], expected[0].transpose(1, 0, 2), atol=1e-5,
                     rtol=1e-5)


CASCADE_SOURCE = """
buffer window: i32[B]
mask sliding(b, h, q, kv) = (q >= kv) & (q - kv <= window[b])
score relative(s, b, h, q, kv) = s - 0.01 * (q - kv)
"""


def make_cascade_step(rng, page_size, hq=4, hkv=2, d=32):
    """Groups of sequences over shared prefix pages: (prefix, [(new tokens,
    own keys after the prefix), ...]) per group, a group of None is a lone
    sequence. The prefix keys are written once; each member's own keys go to
    its own pages; pages shuffled in one NHD allocation."""
    layout = [(48, [(1, 5), (1, 20), (3, 3), (0, 9), (7, 17)]),
              (None, [(4, 30)]),
              (2 * page_size, [(1, 1), (2, 33)]),
              (None, [(1, 1)])]
    members = sum(len(m) for _, m in layout)
    prefix_pages = sum(-(-p // page_size) for p, _ in layout if p)
    own_pages = sum(-(-keys // page_size) for _, m in layout for _, keys in m)
    n_pages = prefix_pages + own_pages + 3
    order = iter(rng.permutation(n_pages))
    k_cache = np.full((n_pages, page_size, hkv, d), np.nan, dtype=np.float32)
    v_cache = np.full_like(k_cache, np.nan)
    columns = max(-(-((p or 0) + keys) // page_size) for p, m in layout for _, keys in m) + 1
    table = np.full((members, columns), -1, dtype=np.int32)
    dense_k, dense_v, lens, news, groups, b = [], [], [], [], [], 0

    def write(pages, k, v, first_position):
        for i in range(k.shape[1]):
            pos = first_position + i
            page, slot = pages[pos // page_size], pos % page_size
            k_cache[page, slot], v_cache[page, slot] = k[:, i], v[:, i]

    for prefix, group in layout:
        p = prefix or 0
        shared = [next(order) for _ in range(-(-p // page_size))]
        pk, pv = randn(rng, hkv, p, d), randn(rng, hkv, p, d)
        if p:
            write(shared, pk, pv, 0)
            groups.append((b, b + len(group), p))
        for new, keys in group:
            pages = shared + [next(order) for _ in range(-(-keys // page_size))]
            table[b, :len(pages)] = pages
            k, v = randn(rng, hkv, keys, d), randn(rng, hkv, keys, d)
            write(pages, k, v, p)
            dense_k.append(np.concatenate([pk, k], axis=1))
            dense_v.append(np.concatenate([pv, v], axis=1))
            lens.append(p + keys)
            news.append(new)
            b += 1
    qsl = np.cumsum([0] + news).astype(np.int32)
    step = dict(q=randn(rng, int(qsl[-1]), hq, d), caches=(k_cache, v_cache), qsl=qsl,
                seq_lens=np.array(lens, dtype=np.int32), table=table, dense_k=dense_k,
                dense_v=dense_v, hq=hq, hkv=hkv, d=d)
    return step, groups


@pytest.mark.parametrize("page_size", [1, 16])
def test_cascade_matches_reference_and_the_flat_step(rng, page_size):
    """Each group's queries read its prefix together (one entry of the
    prefix level) yet keep their own positions and sequence index: a
    per-sequence sliding window and a position-dependent score agree with
    the float64 reference and with the same step run flat."""
    step, groups = make_cascade_step(rng, page_size)
    mods = pagedc.compile(CASCADE_SOURCE)
    window = rng.integers(3, 40, size=len(step["seq_lens"])).astype(np.int32)
    args = (mods, step["hq"], step["hkv"], step["d"], page_size)
    cascade = pagedc.CascadeAttention(*args, max_num_seqs=16, max_num_tokens=64)
    cascade.plan(step["qsl"], step["seq_lens"], step["table"], groups)
    out, lse = cascade.run(step["q"], *step["caches"], buffers={"window": window},
                           return_lse=True)
    ref_out, ref_lse = [], []
    for b in range(len(step["seq_lens"])):
        start, end = step["qsl"][b], step["qsl"][b + 1]
        if end == start:
            continue
        o, s = reference_attention(
            step["q"][start:end].transpose(1, 0, 2)[None], step["dense_k"][b][None],
            step["dense_v"][b][None],
            mask_fn=lambda _b, h, qi, kv, b=b: (qi >= kv) & (qi - kv <= window[b]),
            score_fn=lambda s_, _b, h, qi, kv: s_ - 0.01 * (qi - kv),
            q_offset=int(step["seq_lens"][b]) - (end - start))
        ref_out.append(o[0].transpose(1, 0, 2))
        ref_lse.append(s[0].T)
    assert_close(out, np.concatenate(ref_out), atol=1e-4, rtol=1e-4)
    assert_close(lse, np.concatenate(ref_lse), atol=1e-4, rtol=1e-4)

    flat = pagedc.BatchAttention(*args, max_num_seqs=16, max_num_tokens=64)
    flat.plan(step["qsl"], step["seq_lens"], step["table"])
    flat_out, flat_lse = flat.run(step["q"], *step["caches"], buffers={"window": window},
                                  return_lse=True)
    assert_close(out, flat_out, atol=1e-5, rtol=1e-5)
    assert_close(lse, flat_lse, atol=1e-5, rtol=1e-5)
    # The prefix level: one entry per group and per lone sequence.
    assert cascade._prefix.num_seqs == len(groups) + 2


def test_cascade_and_token_map_errors_name_the_argument(rng):
    step, groups = make_cascade_step(rng, 16)
    cascade = pagedc.CascadeAttention(None, step["hq"], step["hkv"], step["d"], 16,
                                      max_num_seqs=16, max_num_tokens=64)
    for bad, match in [([(0, 9, 48)], "groups\\[0\\]"), ([(2, 1, 16)], "groups\\[0\\]"),
                       ([(0, 5, 48), (3, 7, 16)], "groups\\[1\\]"),
                       ([(0, 5, 10_000)], "prefix_len"), ([(0, 2, 48, 1)], "groups\\[0\\]")]:
        with pytest.raises(ValueError, match=match):
            cascade.plan(step["qsl"], step["seq_lens"], step["table"], bad)
    table = step["table"].copy()
    table[1, 0] = table[1, 1]  # member 1 no longer shares the first prefix page
    with pytest.raises(ValueError, match="block table rows differ"):
        cascade.plan(step["qsl"], step["seq_lens"], table, groups)
    attn = pagedc.BatchAttention(None, step["hq"], step["hkv"], step["d"], 16,
                                 max_num_seqs=16, max_num_tokens=64)
    tokens = int(step["qsl"][-1])
    with pytest.raises(ValueError, match="token_positions"):
        attn.plan(step["qsl"], step["seq_lens"], step["table"],
                  token_positions=np.zeros(tokens - 1, dtype=np.int32))
    with pytest.raises(ValueError, match=r"token_batch\[2\] = -1"):
        bad = np.zeros(tokens, dtype=np.int32)
        bad[2] = -1
        attn.plan(step["qsl"], step["seq_lens"], step["table"], token_batch=bad)
    with pytest.raises(ValueError, match="device"):
        pagedc.CascadeAttention(None, 4, 2, 32, 16, device="tpu")


def test_mla_decode_reads_values_from_the_latent_cache(rng):
    # MLA decode: one latent KV head of 576 columns per token (512 + 64 rope)
    # and 576-wide queries per head; the values are the first 512 columns of
    # the same rows, so v_cache is a view of k_cache (no copy, no V tensor).
    hq, d, dv, page_size = 16, 576, 512, 16
    steps = [(1, 90), (3, 47), (1, 17)]
    pages = [-(-s // page_size) for _, s in steps]
    order = rng.permutation(sum(pages) + 1)
    table = np.full((len(steps), max(pages)), -1, dtype=np.int32)
    cache = np.full((len(order), page_size, 1, d), np.nan, dtype=np.float32)
    latents, next_page = [], 0
    for b, (_, s) in enumerate(steps):
        latent = randn(rng, 1, s, d)
        latents.append(latent)
        table[b, :pages[b]] = order[next_page:next_page + pages[b]]
        next_page += pages[b]
        for pos in range(s):
            cache[table[b, pos // page_size], pos % page_size] = latent[:, pos]
    values = cache[..., :dv]
    assert values.__array_interface__["data"][0] == cache.__array_interface__["data"][0]
    qsl = np.cumsum([0] + [n for n, _ in steps]).astype(np.int32)
    seq_lens = np.array([s for _, s in steps], dtype=np.int32)
    q = randn(rng, int(qsl[-1]), hq, d)
    mods = pagedc.compile("param cap: f32 = 2.0\n"
                          "mask causal(b, h, q, kv) = q >= kv\n"
                          "score softcap(s, b, h, q, kv) = cap * tanh(s / cap)\n")
    scale = 1.0 / np.sqrt(192.0)  # DeepSeek's, given by the caller
    attn = pagedc.BatchAttention(mods, hq, 1, d, page_size, kv_layout="NHD",
                                 value_head_dim=dv, max_num_seqs=4, max_num_tokens=8)
    attn.plan(qsl, seq_lens, table)
    out, lse = attn.run(q, cache, values, scale=scale, return_lse=True)
    assert out.shape == (int(qsl[-1]), hq, dv)
    for b, (n, s) in enumerate(steps):
        rows = q[qsl[b]:qsl[b + 1]].transpose(1, 0, 2)[None]
        latent = latents[b][None]
        ref_out, ref_lse = reference_attention(
            rows, latent, latent[..., :dv], scale=scale, q_offset=s - n,
            mask_fn=lambda _b, h, qi, kv: qi >= kv,
            score_fn=lambda x, _b, h, qi, kv: 2.0 * np.tanh(x / 2.0))
        assert_close(out[qsl[b]:qsl[b + 1]], ref_out[0].transpose(1, 0, 2), atol=1e-4, rtol=1e-4)
        assert_close(lse[qsl[b]:qsl[b + 1]], ref_lse[0].T, atol=1e-4, rtol=1e-4)
