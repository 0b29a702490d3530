"""8-bit float KV caches from Python: assign's quantization (all codes of
both formats, against ml_dtypes where installed), attention over them
against the float64 reference on the dequantized values, the batch call on
uint8 caches with kv_dtype, and the errors."""
import numpy as np
import pytest

import pagedc
from conftest import assert_close, randn, reference_attention

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

FORMATS = {"float8_e4m3fn": (4, 3, 0x7e), "float8_e5m2": (5, 2, 0x7b)}


def decode(codes, name):
    """Values of codes from their fields (NaN / infinity codes excluded by
    the callers)."""
    e_bits, m_bits, _ = FORMATS[name]
    codes = np.asarray(codes, dtype=np.int64)
    bias = (1 << (e_bits - 1)) - 1
    exponent = (codes >> m_bits) & ((1 << e_bits) - 1)
    mantissa = codes & ((1 << m_bits) - 1)
    magnitude = np.where(exponent == 0, np.ldexp(mantissa, 1 - bias - m_bits),
                         np.ldexp(mantissa + (1 << m_bits), exponent - bias - m_bits))
    return np.where(codes & 0x80, -magnitude, magnitude)


def cache_with(values_k, values_v, name, k_scale, v_scale, page_size=16):
    """A 1-slot cache holding [1, H, S, D] values; returns it."""
    _, h, s, d = values_k.shape
    cache = pagedc.PagedKVCache(n_pages=-(-s // page_size) + 1, page_size=page_size,
                                max_batch_size=1, heads=h, head_dim=d, dtype=name,
                                k_scale=k_scale, v_scale=v_scale)
    cache.reserve(0, s)
    cache.assign([0], np.arange(s, dtype=np.int32)[None], values_k, values_v)
    return cache


def stored_codes(cache, which, s):
    """The codes of slot 0's first s positions, [H, S, D]."""
    storage = cache.k_cache if which == "k" else cache.v_cache
    pages = cache.page_table_row(0)
    rows = [storage[:, pages[i // cache.page_size], i % cache.page_size] for i in range(s)]
    return np.stack(rows, axis=1)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_assign_quantizes_every_code_and_saturates(name):
    _, _, max_code = FORMATS[name]
    finite = [c for c in range(256) if (c & 0x7f) <= max_code]
    scale = 0.375
    values = decode(finite, name) * scale               # every finite code, times the scale
    big = decode(max_code, name) * scale
    extra = np.array([big * 1.5, -big * 1e3, np.inf, -np.inf], dtype=np.float64)
    all_values = np.concatenate([values, extra]).astype(np.float32)
    n = all_values.size
    k = all_values.reshape(1, 1, n, 1).repeat(16, axis=3)
    cache = cache_with(k, k.copy(), name, scale, scale)
    codes = stored_codes(cache, "k", n)[0, :, 0]
    assert list(codes[:len(finite)]) == finite
    assert list(codes[len(finite):]) == [max_code, 0x80 | max_code, max_code, 0x80 | max_code]
    assert cache.k_scale == [scale]


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed (pip install "
                                              "ml_dtypes; scripts/python-torch-tests.sh)")
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_assign_rounding_matches_ml_dtypes(rng, name):
    kind = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}[name]
    _, _, max_code = FORMATS[name]
    limit = decode(max_code, name)
    # Random magnitudes over the whole range, and every midpoint of two codes.
    x = (rng.standard_normal(4096) * np.exp2(rng.uniform(-20, np.log2(limit), 4096)))
    codes = np.arange(max_code)
    mids = (decode(codes, name) + decode(codes + 1, name)) / 2
    x = np.concatenate([x, mids, -mids]).astype(np.float32)
    x = x[np.abs(x) <= limit]
    n = x.size
    cache = cache_with(x.reshape(1, 1, n, 1).repeat(16, axis=3),
                       x.reshape(1, 1, n, 1).repeat(16, axis=3), name, 1.0, 1.0)
    ours = stored_codes(cache, "v", n)[0, :, 0]
    theirs = x.astype(kind).view(np.uint8)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("name,per_head", [("float8_e4m3fn", True), ("float8_e5m2", False)])
def test_attention_over_float8_cache_matches_reference(rng, name, per_head):
    B, H, S, D = 1, 2, 90, 32
    k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D)
    k_scale = [0.01, 0.02] if per_head else 0.015
    v_scale = [0.03, 0.007] if per_head else 0.02
    cache = cache_with(k, v, name, k_scale, v_scale)
    ks = np.broadcast_to(np.asarray(k_scale, np.float64).reshape(-1, 1, 1), (H, 1, 1))
    vs = np.broadcast_to(np.asarray(v_scale, np.float64).reshape(-1, 1, 1), (H, 1, 1))
    k_deq = (decode(stored_codes(cache, "k", S), name) * ks)[None]
    v_deq = (decode(stored_codes(cache, "v", S), name) * vs)[None]
    q = randn(rng, B, 4, 5, D)
    causal = pagedc.compile("mask causal(b, h, q, kv) = q >= kv\n")
    out, lse = pagedc.flex_attention(q, cache, mods=causal, enable_gqa=True, q_offset="end",
                                     return_lse=True)
    ref, ref_lse = reference_attention(q, k_deq, v_deq, lambda b, h, qq, kv: qq >= kv,
                                       q_offset=S - 5)
    assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert_close(lse, ref_lse, atol=1e-4, rtol=1e-4)

    # The batch call reads the same pages as uint8 with kv_dtype.
    attn = pagedc.BatchAttention(None, 4, 2, D, 16, kv_layout="pagedc", max_num_seqs=1,
                                 max_num_tokens=8)
    attn.plan([0, 5], [S], np.array([cache.page_table_row(0)], dtype=np.int32))
    packed = q[0].transpose(1, 0, 2).copy()
    out2 = attn.run(packed, cache.k_cache, cache.v_cache, kv_dtype=name, k_scale=k_scale,
                    v_scale=v_scale)
    nomask, _ = reference_attention(q, k_deq, v_deq, q_offset=S - 5)
    assert_close(out2, nomask[0].transpose(1, 0, 2), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="needs k_scale"):
        attn.run(packed, cache.k_cache, cache.v_cache, kv_dtype=name, v_scale=v_scale)


def test_float8_cache_errors():
    with pytest.raises(ValueError, match="needs k_scale"):
        pagedc.PagedKVCache(4, 16, 1, 2, 32, dtype="float8_e4m3fn", v_scale=1.0)
    with pytest.raises(ValueError, match="must be finite and greater than 0"):
        pagedc.PagedKVCache(4, 16, 1, 2, 32, dtype="float8_e5m2", k_scale=-1.0, v_scale=1.0)
    with pytest.raises(ValueError, match="one per KV head"):
        pagedc.PagedKVCache(4, 16, 1, 2, 32, dtype="float8_e5m2", k_scale=[1, 2, 3],
                            v_scale=1.0)
    with pytest.raises(ValueError, match="applies to 8-bit float caches only"):
        pagedc.PagedKVCache(4, 16, 1, 2, 32, dtype="f32", k_scale=1.0)
