"""Attention sinks (gpt-oss: one extra key per query head, of a learned
logit and value zero) through flex_attention, BatchAttention and
CascadeAttention against the float64 NumPy reference, and with torch against
torch's own formula and through the custom ops."""
import numpy as np
import pytest

import pagedc
from conftest import assert_close, randn, reference_attention
from test_runtime import CAUSAL, causal, paged_cache


def mixed_sinks(rng, heads):
    """Per query head in turn: near the rows' lse, above every score, far
    below them (under f32 resolution) and -inf (no sink)."""
    cycle = [None, 20.0, -30.0, -np.inf]
    return np.array([rng.uniform(0.5, 3.0) if cycle[h % 4] is None else cycle[h % 4]
                     for h in range(heads)], dtype=np.float32)


def test_flex_attention_prefill_gqa_shuffled_pages(rng):
    B, Hq, Hkv, S, L, D = 2, 8, 2, 45, 13, 16
    k, v = randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    cache = paged_cache(rng, k, v, page_size=8)
    q = randn(rng, B, Hq, L, D)
    sinks = mixed_sinks(rng, Hq)
    mods = pagedc.compile(CAUSAL)
    out, lse = pagedc.flex_attention(q, cache, mods=mods, q_offset="end", enable_gqa=True,
                                     kv_length=[S, 30], return_lse=True, sinks=sinks)
    ref, ref_lse = reference_attention(q, k, v, causal, q_offset=[S - L, 30 - L],
                                       kv_length=[S, 30], sinks=sinks)
    assert_close(out, ref)
    assert_close(lse, ref_lse)
    # The sinks change the result: the comparison above can fail.
    plain = reference_attention(q, k, v, causal, q_offset=[S - L, 30 - L], kv_length=[S, 30])
    assert not np.allclose(out, plain[0], atol=1e-3)


def test_flex_attention_decode_and_the_key_tensor_form(rng):
    B, Hq, Hkv, S, D = 3, 4, 1, 300, 32
    k, v = randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    q = randn(rng, B, Hq, 1, D)
    sinks = mixed_sinks(rng, Hq)
    out, lse = pagedc.flex_attention(q, k, v, enable_gqa=True, q_offset="end",
                                     return_lse=True, sinks=sinks, threads=4)
    ref, ref_lse = reference_attention(q, k, v, q_offset=S - 1, sinks=sinks)
    assert_close(out, ref)
    assert_close(lse, ref_lse)


def test_fully_masked_rows_give_zero_and_the_sink(rng):
    q, k, v = randn(rng, 1, 4, 12, 8), randn(rng, 1, 4, 12, 8), randn(rng, 1, 4, 12, 8)
    sinks = mixed_sinks(rng, 4)
    mods = pagedc.compile("mask late(b, h, q, kv) = (q >= 6) & (kv <= q)\n")
    out, lse = pagedc.flex_attention(q, k, v, mods=mods, return_lse=True, sinks=sinks)
    assert np.all(out[:, :, :6] == 0)
    assert np.array_equal(lse[0, :, :6], np.repeat(sinks[:, None], 6, axis=1))
    ref, ref_lse = reference_attention(q, k, v, lambda b, h, q_, kv: (q_ >= 6) & (kv <= q_),
                                       sinks=sinks)
    assert_close(out, ref)
    assert_close(lse[:, :, 6:], ref_lse[:, :, 6:])


def test_bad_sinks_are_refused_and_nothing_is_written(rng):
    q, k, v = randn(rng, 1, 4, 5, 8), randn(rng, 1, 4, 9, 8), randn(rng, 1, 4, 9, 8)
    out = np.full((1, 4, 5, 8), np.nan, dtype=np.float32)
    bad = [(np.zeros(3, dtype=np.float32), r"sinks must be \[Hq\] = \[4\]"),
           (np.zeros((1, 4), dtype=np.float32), r"sinks must be \[Hq\] = \[4\]"),
           (np.zeros(4, dtype=np.float64), "sinks is f64 but must be f32"),
           (np.zeros(8, dtype=np.float32)[::2], "sinks must be contiguous"),
           ([0.0, 0.0, 0.0, 0.0], "sinks: expected a tensor with __dlpack__")]
    for sinks, message in bad:
        with pytest.raises(ValueError, match=message):
            pagedc.flex_attention(q, k, v, out=out, sinks=sinks)
    assert np.all(np.isnan(out))


SOURCE = "mask causal(b, h, q, kv) = q >= kv\n"
STEP = [(1, 90), (4, 33), (37, 120), (0, 20), (20, 20), (1, 1), (3, 129)]


def batch_reference(step, sinks):
    outs, lses = [], []
    for b, (n, s) in enumerate(step["steps"]):
        if n == 0:
            continue
        start = step["qsl"][b]
        q = step["q"][start:start + n].transpose(1, 0, 2)[None]
        out, lse = reference_attention(q, step["k"][b][None], step["v"][b][None], causal,
                                       q_offset=s - n, sinks=sinks)
        outs.append(out[0].transpose(1, 0, 2))
        lses.append(lse[0].T)
    return np.concatenate(outs), np.concatenate(lses)


def make_step(rng, hq=8, hkv=2, d=16, page_size=16):
    """The step's K/V on shuffled pages of one NHD allocation."""
    pages = [-(-s // page_size) for _, s in STEP]
    order = rng.permutation(sum(pages) + 2)
    k_cache = np.full((len(order), page_size, hkv, d), np.nan, dtype=np.float32)
    v_cache = np.full_like(k_cache, np.nan)
    table = np.full((len(STEP), max(pages) + 1), -1, dtype=np.int32)
    ks, vs, used = [], [], 0
    for b, (_, s) in enumerate(STEP):
        table[b, :pages[b]] = order[used:used + pages[b]]
        used += pages[b]
        k, v = randn(rng, hkv, s, d), randn(rng, hkv, s, d)
        for pos in range(s):
            k_cache[table[b, pos // page_size], pos % page_size] = k[:, pos]
            v_cache[table[b, pos // page_size], pos % page_size] = v[:, pos]
        ks.append(k)
        vs.append(v)
    qsl = np.cumsum([0] + [n for n, _ in STEP]).astype(np.int32)
    return dict(steps=STEP, q=randn(rng, int(qsl[-1]), hq, d), k=ks, v=vs, qsl=qsl,
                seq_lens=np.array([s for _, s in STEP], dtype=np.int32), table=table,
                caches=(k_cache, v_cache), hq=hq, hkv=hkv, d=d, page_size=page_size)


def test_batch_attention_mixed_step(rng):
    step = make_step(rng)
    sinks = mixed_sinks(rng, step["hq"])
    attn = pagedc.BatchAttention(pagedc.compile(SOURCE), step["hq"], step["hkv"], step["d"],
                                 step["page_size"], max_num_seqs=8, max_num_tokens=80)
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    out, lse = attn.run(step["q"], *step["caches"], return_lse=True, sinks=sinks)
    ref, ref_lse = batch_reference(step, sinks)
    assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"sinks must be \[Hq\] = \[8\]"):
        attn.run(step["q"], *step["caches"], sinks=sinks[:4])


def test_cascade_attention_takes_the_sinks_once(rng):
    # Sequences 1 and 2 share the first 32 keys (two pages) of sequence 1.
    step = make_step(rng)
    table = step["table"].copy()
    table[2, :2] = table[1, :2]
    k_cache, v_cache = step["caches"]
    step["k"][2][:, :32] = step["k"][1][:, :32]
    step["v"][2][:, :32] = step["v"][1][:, :32]
    sinks = mixed_sinks(rng, step["hq"])
    args = (pagedc.compile(SOURCE), step["hq"], step["hkv"], step["d"], step["page_size"])
    cascade = pagedc.CascadeAttention(*args, max_num_seqs=8, max_num_tokens=80)
    cascade.plan(step["qsl"], step["seq_lens"], table, [(1, 3, 32)])
    out, lse = cascade.run(step["q"], k_cache, v_cache, return_lse=True, sinks=sinks)
    ref, ref_lse = batch_reference(step, sinks)
    assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


torch = None
try:
    import torch
except ImportError:
    pass
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def torch_formula(q, k, v, sinks, mask):
    """softmax over the scores and the sink, the sink's column dropped."""
    scores = torch.einsum("bhld,bhsd->bhls", q.double(), k.double()) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.double().view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    logits = torch.cat([scores, sink], dim=-1)
    out = torch.softmax(logits, dim=-1)[..., :-1] @ v.double()
    return out, torch.logsumexp(logits, dim=-1)


@needs_torch
def test_torch_tensors_match_torch_formula():
    torch.manual_seed(0)
    B, H, L, S, D = 2, 4, 7, 40, 16
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    sinks = torch.tensor([1.0, 20.0, -30.0, float("-inf")])
    mods = pagedc.compile(CAUSAL)
    out, lse = pagedc.flex_attention(q, k, v, mods=mods, q_offset="end", return_lse=True,
                                     sinks=sinks)
    mask = torch.arange(L).view(L, 1) + S - L >= torch.arange(S).view(1, S)
    want, want_lse = torch_formula(q, k, v, sinks, mask)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)


@needs_torch
def test_torch_custom_ops_take_sinks():
    torch.manual_seed(1)
    B, H, L, D = 1, 4, 6, 16
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, H, L, D), torch.randn(B, H, L, D)
    sinks = torch.tensor([0.5, 3.0, -2.0, 1.0])
    mods = pagedc.compile(CAUSAL)
    eager, eager_lse = pagedc.flex_attention(q, k, v, mods=mods, return_lse=True, sinks=sinks)
    from pagedc import _torch
    _torch.ensure_op()
    out, lse = torch.ops.pagedc.flex_attention(q, k, v, [], mods._op_handle, None, False, [],
                                               sinks)
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(lse, eager_lse)
    want, want_lse = torch_formula(q, k, v, sinks, torch.arange(L).view(L, 1) >= torch.arange(L))
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=2e-5)

    def step(q, k, v, sinks):
        return pagedc.flex_attention(q, k, v, mods=mods, return_lse=True, sinks=sinks)

    torch._dynamo.reset()
    compiled, compiled_lse = torch.compile(step, fullgraph=True)(q, k, v, sinks)
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(compiled_lse, eager_lse)
    names = [a.name for a in torch.ops.pagedc.flex_attention.default._schema.arguments]
    assert names[-1] == "sinks"
    _torch.ensure_batch_op()
    names = [a.name for a in torch.ops.pagedc.batch_attention.default._schema.arguments]
    assert names[-1] == "sinks"
