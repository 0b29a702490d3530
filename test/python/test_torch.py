"""Comparisons with torch.nn.attention.flex_attention (f32, CPU, <= 1e-4) and
the torch-function spellings of the gallery mods. Every test here needs
PyTorch; without it each one is collected and reported SKIPPED with the
reason, so the log counts them."""
import numpy as np
import pytest

import pagedc

try:
    import torch
    import torch.nn.attention.flex_attention as flex
    _missing = None
except ImportError as error:  # no torch, or a torch without flex_attention
    torch = flex = None
    _missing = "PyTorch with flex_attention is not installed (%s; " \
               "scripts/python-torch-tests.sh installs it in a venv)" % error

pytestmark = pytest.mark.skipif(_missing is not None, reason=_missing or "")

B, H, S, D = 2, 4, 64, 16


def _torch_flex(q, k, v, mask_mod=None, score_mod=None):
    block_mask = None
    if mask_mod is not None:
        block_mask = flex.create_block_mask(mask_mod, B, H, S, S, device="cpu")
    return flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                               return_lse=True)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


GALLERY_NAMES = ["alibi", "and_masks", "causal", "document", "prefix_lm", "relative",
                 "sliding", "softcap", "where_clamp"]


def gallery(name):
    """The gallery mod `name` as (mask_mod, score_mod), written with torch."""
    doc = torch.repeat_interleave(torch.arange(4, dtype=torch.int32), S // 4)
    slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32))
    prefix = torch.tensor([5, 40])
    mods = {
        "causal": (causal, None),
        "sliding": (lambda b, h, q, kv: (q >= kv) & (q - kv <= 8), None),
        "prefix_lm": (flex.or_masks(lambda b, h, q, kv: kv <= prefix[b], causal), None),
        "document": (lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv), None),
        "alibi": (causal, lambda s, b, h, q, kv: s + slopes[h] * (kv - q)),
        "softcap": (None, lambda s, b, h, q, kv: 2.0 * torch.tanh(s / 2.0)),
        "relative": (None, lambda s, b, h, q, kv: s + (q - kv)),
        "where_clamp": (None, lambda s, b, h, q, kv: torch.where(
            q >= kv, torch.clamp(s, -1, 1), torch.sigmoid(s))),
        "and_masks": (flex.and_masks(causal, lambda b, h, q, kv: torch.abs(q - kv) % 3 != 1),
                      None),
    }
    assert sorted(mods) == GALLERY_NAMES
    return mods[name]


@pytest.mark.parametrize("name", GALLERY_NAMES)
def test_traced_gallery_matches_pytorch(name):
    mask_mod, score_mod = gallery(name)
    mods = pagedc.from_torch(mask_mod=mask_mod, score_mod=score_mod)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    out, lse = pagedc.flex_attention(q, k, v, mods=mods, return_lse=True)
    ref, ref_lse = _torch_flex(q, k, v, mask_mod, score_mod)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)


def test_unsupported_torch_function_is_named():
    with pytest.raises(pagedc.TraceError, match="torch.atan"):
        pagedc.from_torch(score_mod=lambda s, b, h, q, kv: torch.atan(s))


def test_gqa_matches_pytorch():
    q = torch.randn(1, 8, 32, 16)
    k, v = torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16)
    mods = pagedc.from_torch(mask_mod=causal)
    out = pagedc.flex_attention(q, k, v, mods=mods, enable_gqa=True)
    bm = flex.create_block_mask(causal, 1, 8, 32, 32, device="cpu")
    ref = flex.flex_attention(q, k, v, block_mask=bm, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


# The runtime reference tests of test_runtime.py, checked against PyTorch's
# flex_attention on the same fresh random inputs (pagedc reads K/V through a
# shuffled page table, PyTorch from dense tensors).
def _t(x):
    return torch.from_numpy(np.ascontiguousarray(x))


def _torch_reference(q, k, v, mask_mod=None, score_mod=None, q_offset=0, enable_gqa=False):
    """PyTorch flex_attention of NumPy inputs; q positions start at q_offset."""
    Bq, Hq, L, _ = q.shape
    S = k.shape[2]
    block_mask = None
    if mask_mod is not None:
        block_mask = flex.create_block_mask(
            lambda b, h, qi, kv: mask_mod(b, h, qi + q_offset, kv), Bq, Hq, L, S, device="cpu")
    wrapped = None
    if score_mod is not None:
        def wrapped(s, b, h, qi, kv):
            return score_mod(s, b, h, qi + q_offset, kv)
    out, lse = flex.flex_attention(_t(q), _t(k), _t(v), score_mod=wrapped,
                                   block_mask=block_mask, enable_gqa=enable_gqa,
                                   return_lse=True)
    return out.numpy(), lse.numpy()


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)


def test_prefill_causal_and_lse_match_pytorch(rng):
    from conftest import randn
    q, k, v = (randn(rng, 2, 4, 37, 16) for _ in range(3))
    out, lse = pagedc.flex_attention(q, k, v, mods=pagedc.from_torch(mask_mod=causal),
                                     return_lse=True)
    ref, ref_lse = _torch_reference(q, k, v, causal)
    _close(out, ref)
    _close(lse, ref_lse)


def test_gqa_shuffled_pages_block_mask_matches_pytorch(rng):
    from conftest import randn
    from test_runtime import paged_cache
    B, Hq, Hkv, S, D = 3, 8, 2, 70, 16
    q, k, v = randn(rng, B, Hq, S, D), randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    cache = paged_cache(rng, k, v, page_size=4)
    mods = pagedc.from_torch(mask_mod=causal)
    mask = pagedc.create_block_mask(mods, None, None, S, S, BLOCK_SIZE=(16, 8))
    out, lse = pagedc.flex_attention(q, cache, block_mask=mask, mods=mods, enable_gqa=True,
                                     return_lse=True)
    ref, ref_lse = _torch_reference(q, k, v, causal, enable_gqa=True)
    _close(out, ref)
    _close(lse, ref_lse)


def test_decode_at_end_of_cache_matches_pytorch(rng):
    from conftest import randn
    from test_runtime import paged_cache
    B, H, S, D = 2, 4, 53, 32
    k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D)
    lengths = [53, 29]
    cache = paged_cache(rng, k, v, page_size=8)

    def sliding(b, h, q, kv):
        return (q >= kv) & (q - kv <= 16)

    q = randn(rng, B, H, 1, D)
    out, lse = pagedc.flex_attention(q, cache, mods=pagedc.from_torch(mask_mod=sliding),
                                     kv_length=lengths, q_offset="end", return_lse=True)
    for b, n in enumerate(lengths):
        ref, ref_lse = _torch_reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                        sliding, q_offset=n - 1)
        _close(out[b:b + 1], ref)
        _close(lse[b:b + 1], ref_lse)


def test_fully_masked_rows_match_pytorch(rng):
    from conftest import randn
    q, k, v = (randn(rng, 1, 2, 12, 8) for _ in range(3))

    def late(b, h, q_, kv):
        return (q_ >= 6) & (kv <= q_)

    out, lse = pagedc.flex_attention(q, k, v, mods=pagedc.from_torch(mask_mod=late),
                                     return_lse=True)
    ref, ref_lse = _torch_reference(q, k, v, late)
    _close(out, ref)  # rows 0-5: zeros on both sides
    assert np.all(np.isneginf(np.asarray(lse)[:, :, :6]))
    assert np.all(np.isneginf(ref_lse[:, :, :6]))
    _close(np.asarray(lse)[:, :, 6:], ref_lse[:, :, 6:])


def test_score_mod_with_captured_tensor_matches_pytorch(rng):
    from conftest import randn
    q, k, v = (randn(rng, 2, 4, 19, 16) for _ in range(3))
    bias = torch.from_numpy(randn(rng, 4))

    def biased(s, b, h, q_, kv):
        return s * 0.5 + bias[h] * (q_ - kv)

    out, lse = pagedc.flex_attention(q, k, v, mods=pagedc.from_torch(score_mod=biased),
                                     return_lse=True)
    ref, ref_lse = _torch_reference(q, k, v, score_mod=biased)
    _close(out, ref)
    _close(lse, ref_lse)


# ---------------------------------------------------------------------------
# torch's vocabulary as it is: score_mod= / mask_mod=, torch's BlockMask,
# return_aux, and torch.compile
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["causal", "sliding", "document", "prefix_lm", "alibi",
                                  "softcap"])
def test_torch_block_mask_and_score_mod_match_pytorch(name):
    mask_mod, score_mod = gallery(name)
    block_mask = None if mask_mod is None else flex.create_block_mask(
        mask_mod, B, H, S, S, device="cpu", BLOCK_SIZE=16)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    ref, aux_ref = flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                       return_aux=flex.AuxRequest(lse=True))
    # torch's keywords ...
    out, aux = pagedc.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                     return_aux=flex.AuxRequest(lse=True))
    assert isinstance(out, torch.Tensor) and isinstance(aux, flex.AuxOutput)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(aux.lse, aux_ref.lse, atol=1e-4, rtol=1e-4)
    # ... and torch's positional order.
    out2, lse2 = pagedc.flex_attention(q, k, v, score_mod or (lambda s, b, h, qq, kv: s),
                                       block_mask, None, False, True)
    torch.testing.assert_close(out2, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse2, aux_ref.lse, atol=1e-4, rtol=1e-4)


def test_python_mods_are_traced_once_per_code_and_captures():
    from pagedc import _torch as cache_module
    slopes = torch.rand(H)

    def make(scale):
        return lambda s, b, h, q, kv: s + scale * slopes[h] * (kv - q)

    q, k, v = (torch.randn(1, H, 8, D) for _ in range(3))
    before = len(cache_module._TRACE_CACHE)
    for _ in range(3):
        pagedc.flex_attention(q, k, v, score_mod=make(0.5))
    assert len(cache_module._TRACE_CACHE) == before + 1   # same code and captures
    pagedc.flex_attention(q, k, v, score_mod=make(0.25))
    assert len(cache_module._TRACE_CACHE) == before + 2   # a new captured value
    # Captured tensors are bound live: new contents, no new trace.
    out1 = pagedc.flex_attention(q, k, v, score_mod=make(0.5))
    slopes.mul_(3)
    out2 = pagedc.flex_attention(q, k, v, score_mod=make(0.5))
    assert len(cache_module._TRACE_CACHE) == before + 2
    assert not torch.allclose(out1, out2)


def test_torch_vocabulary_errors_name_the_argument():
    q, k, v = (torch.randn(1, H, 8, D) for _ in range(3))
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
    with pytest.raises(ValueError, match="not both"):
        pagedc.flex_attention(q, k, v, mods=mods, score_mod=lambda s, b, h, qq, kv: s)
    with pytest.raises(ValueError, match="max_scores"):
        pagedc.flex_attention(q, k, v, return_aux=flex.AuxRequest(max_scores=True))
    with pytest.raises(ValueError, match="return_lse or return_aux"):
        pagedc.flex_attention(q, k, v, return_lse=True, return_aux=flex.AuxRequest(lse=True))
    with pytest.raises(ValueError, match="score_mod: expected a function"):
        pagedc.flex_attention(q, k, v, score_mod=3)


SLOPES = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32)) if torch else None


def _alibi(s, b, h, q_idx, kv_idx):
    return s + SLOPES[h] * (kv_idx - q_idx)


class _Attention(torch.nn.Module if torch is not None else object):
    """A small attention block: projections, then pagedc twice: mods traced
    once in __init__ (ALiBi over a captured tensor, causal) with a soft-cap
    param, and torch-style score_mod= / mask_mod= functions."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(D * H, 3 * D * H)
        self.slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32))
        slopes = self.slopes
        self.mods = pagedc.from_torch(
            score_mod=lambda s, b, h, q, kv: 3.0 * torch.tanh((s + slopes[h] * (kv - q)) / 3.0),
            mask_mod=causal)

    def forward(self, x):
        batch, length, _ = x.shape
        q, k, v = (t.contiguous() for t in
                   self.qkv(x).view(batch, length, 3, H, D).permute(2, 0, 3, 1, 4))
        a = pagedc.flex_attention(q, k, v, mods=self.mods)
        b = pagedc.flex_attention(q, k, v, score_mod=_alibi, mask_mod=causal)
        return (a + b).transpose(1, 2).reshape(batch, length, H * D)


def test_torch_compile_fullgraph_matches_eager_with_no_graph_break():
    torch._dynamo.reset()
    model = _Attention().eval()
    x = torch.randn(2, 24, H * D)
    with torch.no_grad():
        eager = model(x)
        explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1
        ops = [str(op) for graph_ops in explained.ops_per_graph for op in graph_ops]
        assert any("pagedc.flex_attention" in op for op in ops), ops
        compiled = torch.compile(model, fullgraph=True)
        torch.testing.assert_close(compiled(x), eager, atol=1e-5, rtol=1e-5)
        x2 = torch.randn(2, 24, H * D)
        torch.testing.assert_close(compiled(x2), model(x2), atol=1e-5, rtol=1e-5)


def test_torch_compile_refuses_what_the_op_cannot_take():
    cache = pagedc.PagedKVCache(n_pages=4, page_size=16, max_batch_size=1, heads=H,
                                head_dim=D)

    def step(q):
        return pagedc.flex_attention(q, cache, kv_length=[0])

    torch._dynamo.reset()
    with pytest.raises(Exception, match="under torch.compile"):
        torch.compile(step, fullgraph=True)(torch.randn(1, H, 1, D))


def test_torch_host_tensors_in_and_out(rng):
    """torch tensors take a faster export path than __dlpack__; the results
    must be those of the NumPy call, in torch tensors, `out=` written in
    place and returned as given, strided inputs read as strided."""
    from conftest import randn
    from test_runtime import paged_cache
    B, Hq, Hkv, S, D = 3, 4, 2, 45, 16
    k, v = randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    cache = paged_cache(rng, k, v, page_size=8)
    q = randn(rng, B, Hq, 2, D)
    mods = pagedc.from_torch(mask_mod=causal)
    want, want_lse = pagedc.flex_attention(q, cache, mods=mods, q_offset="end",
                                           enable_gqa=True, return_lse=True)
    out, lse = pagedc.flex_attention(torch.from_numpy(q.copy()), cache, mods=mods,
                                     q_offset="end", enable_gqa=True, return_lse=True)
    assert isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor)
    assert lse.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(lse.numpy(), want_lse)
    # The runtime made them: they own their memory past the next call.
    again = pagedc.flex_attention(torch.from_numpy(q.copy()) * 2, cache, mods=mods,
                                  q_offset="end", enable_gqa=True)
    assert again.data_ptr() != out.data_ptr()
    np.testing.assert_array_equal(out.numpy(), want)

    given = torch.full((B, Hq, 2, D), float("nan"))
    got = pagedc.flex_attention(torch.from_numpy(q.copy()), cache, mods=mods, q_offset="end",
                                enable_gqa=True, out=given)
    assert got is given
    np.testing.assert_array_equal(given.numpy(), want)

    # A transposed view: q[b, h, l, :] at strides that are not row-major.
    strided = torch.from_numpy(np.ascontiguousarray(q.transpose(0, 2, 1, 3))).transpose(1, 2)
    assert not strided.is_contiguous()
    np.testing.assert_array_equal(
        pagedc.flex_attention(strided, cache, mods=mods, q_offset="end",
                              enable_gqa=True).numpy(), want)

    half = pagedc.flex_attention(torch.from_numpy(q.copy()).bfloat16(), cache, mods=mods,
                                 q_offset="end", enable_gqa=True)
    assert half.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="out"):
        pagedc.flex_attention(torch.from_numpy(q.copy()), cache, mods=mods, q_offset="end",
                              enable_gqa=True, out=torch.empty(B, Hq, 2, D + 1))


def test_torch_decode_with_defaults_takes_the_small_host_path(rng, monkeypatch):
    """A torch decode step with default arguments goes through the small
    host binding (not the general one), gives what the NumPy call gives,
    and sees a new token assigned between two calls."""
    from conftest import randn
    from test_runtime import paged_cache
    B, H, S, D = 3, 2, 21, 16
    k, v = randn(rng, B, H, S + 1, D), randn(rng, B, H, S + 1, D)
    cache = paged_cache(rng, k[:, :, :S], v[:, :, :S], page_size=8)
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
    q = randn(rng, B, H, 1, D)
    qt = torch.from_numpy(q.copy())
    pagedc.flex_attention(qt, cache, mods=mods, q_offset="end", return_lse=True)

    def general(*args, **kwargs):
        raise AssertionError("the general binding was called")

    monkeypatch.setattr(pagedc._pagedc, "flex_attention_dlpack", general)
    for n in (S, S + 1):
        if n > S:
            cache.reserve(list(range(B)), n)
            cache.assign(np.arange(B, dtype=np.int32), np.full((B, 1), S, dtype=np.int32),
                         k[:, :, S:], v[:, :, S:])
        want = pagedc.flex_attention(q, cache, mods=mods, q_offset="end", return_lse=True)[0]
        got = pagedc.flex_attention(qt, cache, mods=mods, q_offset="end")
        assert isinstance(got, torch.Tensor)
        np.testing.assert_array_equal(got.numpy(), want)


def test_cache_and_mask_fields_follow_torch_input(rng):
    """torch in, torch out: the cache's arrays once torch tensors were
    assigned, a mask's indices when it came from torch's vocabulary; the
    same memory as the NumPy views."""
    from conftest import randn
    k, v = randn(rng, 2, 2, 20, 8), randn(rng, 2, 2, 20, 8)
    cache = pagedc.PagedKVCache(12, 4, 2, 2, 8)
    cache.reserve([0, 1], 20)
    assert isinstance(cache.page_table, np.ndarray)
    cache.assign(np.arange(2, dtype=np.int32), np.tile(np.arange(20, dtype=np.int32), (2, 1)),
                 k, v)
    assert isinstance(cache.k_cache, np.ndarray)
    cache.assign(torch.arange(2, dtype=torch.int32), torch.arange(20, dtype=torch.int32)
                 .repeat(2, 1), torch.from_numpy(k), torch.from_numpy(v))
    for field in (cache.k_cache, cache.v_cache, cache.page_table):
        assert isinstance(field, torch.Tensor)
    assert cache.k_cache.data_ptr() == cache._native.k_cache().data_ptr
    assert isinstance(pagedc.PagedKVCache(4, 4, 1, 1, 8, dtype=torch.float32).page_table,
                      torch.Tensor)

    traced = pagedc.create_block_mask(causal, 2, 1, 20, 20, BLOCK_SIZE=4)
    for field in (traced.kv_num_blocks, traced.kv_indices, traced.full_kv_num_blocks,
                  traced.full_kv_indices, traced.to_dense(), traced.to_dense_blocks()):
        assert isinstance(field, torch.Tensor)
    assert traced.to_dense().dtype == torch.bool
    np.testing.assert_array_equal(traced.to_dense()[0, 0].numpy(),
                                  np.tril(np.ones((20, 20), dtype=bool)))
    compiled = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
    assert isinstance(pagedc.create_block_mask(compiled, 2, 1, 20, 20).kv_indices, np.ndarray)
    from_blocks = pagedc.BlockMask.from_kv_blocks(traced.kv_num_blocks, traced.kv_indices,
                                                  BLOCK_SIZE=4, seq_lengths=(20, 20))
    assert isinstance(from_blocks.kv_indices, torch.Tensor)
    converted = cache.convert_logical_block_mask(traced)
    assert isinstance(converted.page_table, torch.Tensor)


class _ServingStep(torch.nn.Module if torch is not None else object):
    """A serving step's attention block: a projection, pagedc's batch call on
    the engine's cache (planned outside), and a projection."""

    def __init__(self, attn, hq, d):
        super().__init__()
        self.attn = attn
        self.proj = torch.nn.Linear(hq * d, hq * d)
        self.hq, self.d = hq, d

    def forward(self, x, k_cache, v_cache, doc):
        q = self.proj(x).view(x.shape[0], self.hq, self.d)
        out, lse = self.attn.run(q, k_cache, v_cache, buffers={"doc": doc}, return_lse=True)
        return self.proj(out.reshape(x.shape[0], -1)), lse


def test_torch_compile_batch_attention_matches_eager_with_no_graph_break(rng):
    from test_serving import SOURCE, make_step
    step = make_step(rng, "NHD", 16)
    hq, d = step["hq"], step["d"]
    mods = pagedc.compile(SOURCE, mask="document")
    attn = pagedc.BatchAttention(mods, hq, step["hkv"], d, 16, max_num_seqs=16,
                                 max_num_tokens=200)
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    max_s = int(step["seq_lens"].max())
    doc = torch.from_numpy(np.cumsum(rng.random((len(step["seq_lens"]), max_s)) < 0.05,
                                     axis=1).astype(np.int32))
    k_cache, v_cache = (torch.from_numpy(np.nan_to_num(c)) for c in step["caches"])
    model = _ServingStep(attn, hq, d).eval()
    x = torch.randn(step["q"].shape[0], hq * d)
    torch._dynamo.reset()
    with torch.no_grad():
        eager_out, eager_lse = model(x, k_cache, v_cache, doc)
        explained = torch._dynamo.explain(model)(x, k_cache, v_cache, doc)
        assert explained.graph_break_count == 0, explained.break_reasons
        assert explained.graph_count == 1
        ops = [str(op) for graph_ops in explained.ops_per_graph for op in graph_ops]
        assert any("pagedc.batch_attention" in op for op in ops), ops
        compiled = torch.compile(model, fullgraph=True)
        out, lse = compiled(x, k_cache, v_cache, doc)
        torch.testing.assert_close(out, eager_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, eager_lse, atol=1e-5, rtol=1e-5)
        # The op writes into out= (its mutation annotation) and returns lse.
        q = torch.randn(step["q"].shape[0], hq, d)
        given = torch.full((q.shape[0], hq, d), float("nan"))
        lse2 = torch.ops.pagedc.batch_attention(q, k_cache, v_cache, [doc], attn._op_handle,
                                                None, [], given)
        ref_out, ref_lse = attn.run(q, k_cache, v_cache, buffers={"doc": doc},
                                    return_lse=True)
        torch.testing.assert_close(given, ref_out)
        torch.testing.assert_close(lse2, ref_lse)
    schema = torch.ops.pagedc.batch_attention.default._schema
    assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == \
        ["out"]
