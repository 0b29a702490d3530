"""Shared helpers of the pagedc pytest suite: a float64 NumPy reference of
flex attention and random inputs. Run through ctest (python.pytest), or
`PYTHONPATH=build/python python3 -m pytest -q test/python`."""
import os

import numpy as np
import pytest

SOURCE_DIR = os.environ.get("PAGEDC_SOURCE_DIR",
                            os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


def reference_attention(q, k, v, mask_fn=None, score_fn=None, scale=None, q_offset=0,
                        kv_length=None, sinks=None):
    """float64 flex attention: q [B, Hq, L, D], k/v [B, Hkv, S, D(v)].
    mask_fn(b, h, q, kv) / score_fn(s, b, h, q, kv) take broadcasting NumPy
    index arrays. q_offset: int or one per batch entry. sinks [Hq]: one more
    key per head, of that logit and value zero. Returns (out, lse)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, Hq, L, D = q.shape
    S = k.shape[2]
    group = Hq // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    s = np.einsum("bhld,bhsd->bhls", q, k) * scale
    offsets = np.broadcast_to(np.asarray(q_offset), (B,)).reshape(B, 1, 1, 1)
    b = np.arange(B).reshape(B, 1, 1, 1)
    h = np.arange(Hq).reshape(1, Hq, 1, 1)
    qi = offsets + np.arange(L).reshape(1, 1, L, 1)
    kv = np.arange(S).reshape(1, 1, 1, S)
    if score_fn is not None:
        s = np.broadcast_to(score_fn(s, b, h, qi, kv), s.shape).astype(np.float64)
    keep = np.ones(s.shape, dtype=bool)
    if mask_fn is not None:
        keep &= np.broadcast_to(mask_fn(b, h, qi, kv), s.shape)
    if kv_length is not None:
        keep &= kv < np.broadcast_to(np.asarray(kv_length), (B,)).reshape(B, 1, 1, 1)
    s = np.where(keep, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    sink = np.full((1, Hq, 1, 1), -np.inf) if sinks is None else \
        np.asarray(sinks, dtype=np.float64).reshape(1, Hq, 1, 1)
    m = np.maximum(m, sink)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    total = p.sum(axis=-1, keepdims=True) + np.exp(sink - m_safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + m_safe[..., 0], -np.inf)
        out = np.where(total > 0, (p / np.where(total > 0, total, 1)) @ v, 0.0)
    return out, lse


@pytest.fixture
def rng():
    # Fresh random inputs on every run; the seed is printed on failure.
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"random seed {seed}")
    return np.random.default_rng(seed)


def randn(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def assert_close(actual, expected, atol=2e-5, rtol=2e-5):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), expected, atol=atol,
                               rtol=rtol)
