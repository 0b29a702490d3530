"""pagedc.from_torch on the FlexAttention documentation's gallery mods.

The mods are written with plain Python operators and NumPy functions, so the
same function is (1) traced by pagedc and (2) evaluated on NumPy index
arrays by the float64 reference; the outputs must agree. The torch-function
spellings are in test_torch.py (skipped without PyTorch)."""
import numpy as np
import pytest

import pagedc
from conftest import assert_close, randn, reference_attention

B, H, S, D = 2, 4, 48, 16
SLIDING_WINDOW = 8


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= SLIDING_WINDOW)


def make_prefix_lm(prefix_length):
    def prefix_mask(b, h, q_idx, kv_idx):
        return kv_idx <= prefix_length[b]
    return pagedc.or_masks(prefix_mask, causal)


document_id = np.repeat(np.arange(4, dtype=np.int32), S // 4)


def document_masking(b, h, q_idx, kv_idx):
    return (document_id[q_idx] == document_id[kv_idx]) & (q_idx >= kv_idx)


alibi_slopes = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)


def alibi(score, b, h, q_idx, kv_idx):
    bias = alibi_slopes[h] * (kv_idx - q_idx)
    return score + bias


def tanh_softcap(score, b, h, q_idx, kv_idx):
    softcap = 2.0
    return softcap * np.tanh(score / softcap)


rel_bias = np.linspace(-1, 1, 2 * S - 1).astype(np.float64)  # float64: bound as float32


def relative_position(score, b, h, q_idx, kv_idx):
    return score + rel_bias[q_idx - kv_idx + S - 1]


def relative_position_plain(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx)


def natten_like(b, h, q_idx, kv_idx):
    W, K = 8, 2
    return (abs(q_idx // W - kv_idx // W) <= K) & (abs(q_idx % W - kv_idx % W) <= K)


def clamped(score, b, h, q_idx, kv_idx):
    return np.where(q_idx >= kv_idx, np.clip(score, -1.0, 1.0), score * 0.5) - (h // 2)


GALLERY = [
    ("causal", causal, None),
    ("sliding_window", sliding_window, None),
    ("prefix_lm", make_prefix_lm(np.array([5, 20], dtype=np.int64)), None),
    ("document", document_masking, None),
    ("alibi", causal, alibi),
    ("softcap", None, tanh_softcap),
    ("relative_table", None, relative_position),
    ("relative", causal, relative_position_plain),
    ("natten", natten_like, None),
    ("where_clamp", None, clamped),
    ("and_masks", pagedc.and_masks(causal, sliding_window, lambda b, h, q, kv: kv % 3 != 0),
     None),
]


@pytest.mark.parametrize("name,mask_mod,score_mod", GALLERY, ids=[g[0] for g in GALLERY])
def test_gallery_mod_matches_reference(rng, name, mask_mod, score_mod):
    mods = pagedc.from_torch(mask_mod=mask_mod, score_mod=score_mod)
    assert "mask mask_mod" in mods.source or mask_mod is None
    assert "score score_mod" in mods.source or score_mod is None
    q, k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D), randn(rng, B, H, S, D)
    out, lse = pagedc.flex_attention(q, k, v, mods=mods, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, mask_mod, score_mod)
    assert_close(out, ref, atol=5e-5)
    finite = np.isfinite(ref_lse)
    assert_close(lse[finite], ref_lse[finite], atol=5e-5)
    if mask_mod is not None:
        mask = pagedc.create_block_mask(mods, B, H, S, S, BLOCK_SIZE=16)
        bb, hh = np.arange(B)[:, None, None, None], np.arange(H)[None, :, None, None]
        qq, kk = np.arange(S)[None, None, :, None], np.arange(S)[None, None, None, :]
        dense = np.broadcast_to(mask_mod(bb, hh, qq, kk), (B, H, S, S))
        np.testing.assert_array_equal(
            np.broadcast_to(mask.to_dense(), (B, H, S, S)), dense)
        out2 = pagedc.flex_attention(q, k, v, block_mask=mask, mods=mods)
        assert_close(out2, ref, atol=5e-5)


def test_source_declares_captured_buffers():
    mods = pagedc.from_torch(mask_mod=document_masking, score_mod=alibi)
    assert "buffer document_id: i32[?]" in mods.source
    assert "buffer alibi_slopes: f32[?]" in mods.source
    assert set(mods.bound_buffers) == {"document_id", "alibi_slopes"}
    assert mods.bound_buffers["document_id"] is document_id
    # The program is ordinary .attn: it compiles again on its own.
    again = pagedc.compile(mods.source, mask="mask_mod", score="score_mod")
    assert again.buffer_decls == mods.buffer_decls


def test_captured_tensor_is_bound_live(rng):
    doc = np.zeros(S, dtype=np.int32)

    def mask(b, h, q, kv):
        return doc[q] == doc[kv]

    mods = pagedc.from_torch(mask_mod=mask)
    q, k, v = randn(rng, 1, 1, S, D), randn(rng, 1, 1, S, D), randn(rng, 1, 1, S, D)
    doc[S // 2:] = 1  # updated after tracing: the call reads the new values
    out = pagedc.flex_attention(q, k, v, mods=mods)
    assert_close(out, reference_attention(q, k, v, mask)[0])
    # An explicit buffers= entry wins over the captured one.
    other = np.arange(S, dtype=np.int32)
    out = pagedc.flex_attention(q, k, v, mods=mods, buffers={"doc": other})
    assert_close(out, reference_attention(q, k, v, lambda b, h, qq, kv: qq == kv)[0])


def test_unsupported_operations_name_the_op_and_line():
    def branchy(b, h, q_idx, kv_idx):
        if q_idx > kv_idx:  # MARK-branch
            return True
        return False

    with pytest.raises(pagedc.TraceError) as info:
        pagedc.from_torch(mask_mod=branchy)
    assert "Python control flow" in str(info.value)
    assert info.value.location.endswith(f":{branchy.__code__.co_firstlineno + 1}")
    assert "MARK-branch" in str(info.value)

    def uses_range(b, h, q_idx, kv_idx):
        return kv_idx < len(range(q_idx))

    with pytest.raises(pagedc.TraceError, match="Python int"):
        pagedc.from_torch(mask_mod=uses_range)

    def uses_numpy_sort(score, b, h, q_idx, kv_idx):
        return np.sort(score)

    with pytest.raises(pagedc.TraceError, match="numpy.sort"):
        pagedc.from_torch(score_mod=uses_numpy_sort)

    def uses_arctan(score, b, h, q_idx, kv_idx):
        return np.arctan(score)

    with pytest.raises(pagedc.TraceError, match="numpy.arctan"):
        pagedc.from_torch(score_mod=uses_arctan)

    def returns_int(b, h, q_idx, kv_idx):
        return q_idx - kv_idx

    with pytest.raises(pagedc.TraceError, match="boolean"):
        pagedc.from_torch(mask_mod=returns_int)

    table = np.zeros((2, 2, 2, 2, 2), dtype=np.int32)

    def rank5(b, h, q_idx, kv_idx):
        return table[b, h, q_idx, kv_idx, 0] == 0

    with pytest.raises(pagedc.TraceError, match="rank 5"):
        pagedc.from_torch(mask_mod=rank5)
    with pytest.raises(ValueError, match="mask_mod"):
        pagedc.from_torch()


def test_constants_and_python_numbers():
    limit = 7

    def mask(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx < limit) & (kv_idx >= -3) & (q_idx + 0.5 > kv_idx)

    mods = pagedc.from_torch(mask_mod=mask)
    assert " 7" in mods.source and "(-3)" in mods.source and "0.5" in mods.source
    dense = pagedc.create_block_mask(mods, 1, 1, 16, 16, BLOCK_SIZE=4).to_dense()[0, 0]
    qq, kk = np.arange(16)[:, None], np.arange(16)[None, :]
    np.testing.assert_array_equal(dense, mask(0, 0, qq, kk))


def test_constant_mask_and_empty_compositions():
    mods = pagedc.from_torch(mask_mod=pagedc.and_masks())
    assert pagedc.create_block_mask(mods, 1, 1, 8, 8, BLOCK_SIZE=4).to_dense().all()
    mods = pagedc.from_torch(mask_mod=pagedc.or_masks())
    assert not pagedc.create_block_mask(mods, 1, 1, 8, 8, BLOCK_SIZE=4).to_dense().any()


def test_iteration_over_a_captured_tensor_is_unrolled(rng):
    # `for s in slopes` used to hang the trace (Python's old iteration
    # protocol never met an IndexError); it yields the entries, as in torch.
    slopes = np.array([0.5, -0.25, 0.125], dtype=np.float32)

    def score(s, b, h, q_idx, kv_idx):
        total = s
        for slope in slopes:
            total = total + slope * (kv_idx - q_idx)
        return total

    mods = pagedc.from_torch(score_mod=score)
    q, k, v = randn(rng, 1, 2, 20, D), randn(rng, 1, 2, 20, D), randn(rng, 1, 2, 20, D)
    out = pagedc.flex_attention(q, k, v, mods=mods)
    expected, _ = reference_attention(
        q, k, v, score_fn=lambda s, b, h, qq, kv: s + float(slopes.sum()) * (kv - qq))
    assert_close(out, expected, atol=1e-4, rtol=1e-4)

    rows = np.arange(6, dtype=np.int32).reshape(2, 3)

    def by_row(b, h, q_idx, kv_idx):
        keep = q_idx >= kv_idx
        for row in rows:
            keep = keep & (row[1] != kv_idx)
        return keep

    assert "rows[1, 1]" in pagedc.trace_source(mask_mod=by_row)[0]


def test_loops_that_would_not_end_are_errors():
    import time
    big = np.zeros(100000, dtype=np.float32)

    def over_big(s, b, h, q_idx, kv_idx):
        for x in big:
            s = s + x
        return s

    start = time.monotonic()
    with pytest.raises(pagedc.TraceError, match="iteration over captured tensor 'big'"):
        pagedc.from_torch(score_mod=over_big)

    def long_loop(s, b, h, q_idx, kv_idx):
        for _ in range(10 ** 9):
            s = s + 1.0
        return s

    with pytest.raises(pagedc.TraceError, match="trace length"):
        pagedc.from_torch(score_mod=long_loop)
    assert time.monotonic() - start < 10


def test_constant_index_out_of_range_raises_like_torch():
    table = np.arange(4, dtype=np.int32)

    def past_end(b, h, q_idx, kv_idx):
        return table[4] > kv_idx  # MARK-range

    with pytest.raises(pagedc.TraceError, match=r"index 4 is out of range for dimension 0 of "
                                                r"captured tensor 'table' \(size 4\)") as info:
        pagedc.from_torch(mask_mod=past_end)
    assert "MARK-range" in str(info.value)

    def before_start(b, h, q_idx, kv_idx):
        return table[-5] > kv_idx

    with pytest.raises(pagedc.TraceError, match="index -5 is out of range"):
        pagedc.from_torch(mask_mod=before_start)

    def last(b, h, q_idx, kv_idx):
        return table[-1] > kv_idx

    assert "table[3]" in pagedc.trace_source(mask_mod=last)[0]
