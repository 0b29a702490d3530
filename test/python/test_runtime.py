"""The runtime entry points: flex_attention, PagedKVCache, block masks,
checked against the float64 NumPy reference on fresh random inputs."""
import numpy as np
import pytest

import pagedc
from conftest import assert_close, randn, reference_attention

CAUSAL = "mask causal(b, h, q, kv) = q >= kv\n"


def causal(b, h, q, kv):
    return q >= kv


def paged_cache(rng, k, v, page_size, shuffle=True, extra_slots=0):
    """K/V [B, H, S, D] written into a cache whose pages are scattered: the
    slots grow in turns, a page at a time, with a scratch slot in between."""
    B, H, S, D = k.shape
    pages = (B + 1) * (-(-S // page_size)) + 2
    cache = pagedc.PagedKVCache(pages, page_size, B + 1 + extra_slots, H, D, v.shape[3])
    scratch = B + extra_slots
    order = list(range(B))
    for n in range(page_size, S + page_size, page_size):
        if shuffle:
            rng.shuffle(order)
            cache.reserve(scratch, cache.capacity(scratch) + page_size)
        for b in order:
            cache.reserve(b, min(n, S))
    cache.erase(scratch)
    pos = np.broadcast_to(np.arange(S, dtype=np.int32), (B, S)).copy()
    cache.assign(np.arange(B, dtype=np.int32), pos, k, v)
    return cache


def test_prefill_causal_matches_reference(rng):
    q, k, v = randn(rng, 2, 4, 37, 16), randn(rng, 2, 4, 37, 16), randn(rng, 2, 4, 37, 16)
    mods = pagedc.compile(CAUSAL)
    out, lse = pagedc.flex_attention(q, k, v, mods=mods, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, causal)
    assert out.shape == (2, 4, 37, 16) and out.dtype == np.float32
    assert lse.shape == (2, 4, 37) and lse.dtype == np.float32
    assert_close(out, ref)
    assert_close(lse, ref_lse)


def test_no_mods_is_plain_softmax_attention(rng):
    q, k, v = randn(rng, 1, 2, 5, 8), randn(rng, 1, 2, 9, 8), randn(rng, 1, 2, 9, 4)
    out = pagedc.flex_attention(q, k, v, scale=0.3)
    assert_close(out, reference_attention(q, k, v, scale=0.3)[0])


def test_gqa_shuffled_pages_block_mask(rng):
    B, Hq, Hkv, S, D = 3, 8, 2, 70, 16
    q, k, v = randn(rng, B, Hq, S, D), randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    cache = paged_cache(rng, k, v, page_size=4)
    table = cache.page_table
    assert (np.diff(table[0][table[0] >= 0]) != 1).any()  # pages really are scattered
    mods = pagedc.compile(CAUSAL)
    mask = pagedc.create_block_mask(mods, None, None, S, S, BLOCK_SIZE=(16, 8))
    with pytest.raises(ValueError, match="enable_gqa"):
        pagedc.flex_attention(q, cache, block_mask=mask, mods=mods)
    out, lse = pagedc.flex_attention(q, cache, block_mask=mask, mods=mods, enable_gqa=True,
                                     return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, causal)
    assert_close(out, ref)
    assert_close(lse, ref_lse)


def test_decode_q_offset_at_end_of_cache(rng):
    B, H, S, D = 2, 4, 53, 32
    k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D)
    lengths = [53, 29]
    cache = paged_cache(rng, k, v, page_size=8)
    mods = pagedc.compile("const W = 16\n"
                          "mask sliding(b, h, q, kv) = (q >= kv) & (q - kv <= W)\n")
    q = randn(rng, B, H, 1, D)
    out, lse = pagedc.flex_attention(q, cache, mods=mods, kv_length=lengths, q_offset="end",
                                     return_lse=True)
    for b, n in enumerate(lengths):
        ref, ref_lse = reference_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                           lambda b_, h, qq, kv: (qq >= kv) & (qq - kv <= 16),
                                           q_offset=n - 1)
        assert_close(out[b:b + 1], ref)
        assert_close(lse[b:b + 1], ref_lse)
    # The same with an explicit per-batch q_offset and a decode-row block mask.
    mask = pagedc.create_block_mask(mods, B, 1, S, S, BLOCK_SIZE=16, q_begin=S - 1)
    out2 = pagedc.flex_attention(q[:1], cache, block_mask=mask, mods=mods, q_offset=[S - 1],
                                 kv_length=[S])
    assert_close(out2, out[:1])


def test_fully_masked_rows_give_zero_and_minus_inf(rng):
    q, k, v = randn(rng, 1, 2, 12, 8), randn(rng, 1, 2, 12, 8), randn(rng, 1, 2, 12, 8)
    mods = pagedc.compile("mask late(b, h, q, kv) = (q >= 6) & (kv <= q)\n")
    out, lse = pagedc.flex_attention(q, k, v, mods=mods, return_lse=True)
    assert np.all(out[:, :, :6] == 0)
    assert np.all(np.isneginf(lse[:, :, :6]))
    ref, ref_lse = reference_attention(q, k, v, lambda b, h, q_, kv: (q_ >= 6) & (kv <= q_))
    assert_close(out, ref)
    assert_close(lse[:, :, 6:], ref_lse[:, :, 6:])


def test_score_mod_buffers_and_params(rng):
    src = ("param softcap: f32 = 30.0\nbuffer slopes: f32[H]\n"
           "score capped(s, b, h, q, kv) {\n  let x = s + slopes[h] * (kv - q)\n"
           "  softcap * tanh(x / softcap)\n}\n")
    mods = pagedc.compile(src)
    assert mods.buffer_decls == [("slopes", "f32", ["H"])]
    assert mods.param_decls == [("softcap", "f32", 30.0)]
    H = 4
    slopes = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)
    q, k, v = randn(rng, 2, H, 10, 8) * 3, randn(rng, 2, H, 10, 8) * 3, randn(rng, 2, H, 10, 8)

    def score(cap):
        return lambda s, b, h, qq, kv: cap * np.tanh((s + slopes[h] * (kv - qq)) / cap)

    out = pagedc.flex_attention(q, k, v, mods=mods, buffers={"slopes": slopes})
    assert_close(out, reference_attention(q, k, v, score_fn=score(30.0))[0], atol=1e-4)
    out = pagedc.flex_attention(q, k, v, mods=mods, buffers={"slopes": slopes},
                                params={"softcap": 2.5})
    assert_close(out, reference_attention(q, k, v, score_fn=score(2.5))[0], atol=1e-4)


def test_out_argument_is_written_in_place(rng):
    q, k, v = randn(rng, 1, 2, 8, 8), randn(rng, 1, 2, 8, 8), randn(rng, 1, 2, 8, 8)
    out = np.zeros((1, 2, 8, 8), dtype=np.float32)
    result = pagedc.flex_attention(q, k, v, out=out)
    assert result is out
    assert_close(out, reference_attention(q, k, v)[0])


def test_strided_q_is_read_in_place(rng):
    # q in [B, L, H, D] memory viewed as [B, H, L, D] (the usual projection layout).
    qt = randn(rng, 2, 9, 4, 16)
    q = qt.transpose(0, 2, 1, 3)
    k, v = randn(rng, 2, 4, 9, 16), randn(rng, 2, 4, 9, 16)
    out = pagedc.flex_attention(q, k, v, mods=pagedc.compile(CAUSAL))
    assert_close(out, reference_attention(q, k, v, causal)[0])


# --- block masks --------------------------------------------------------

def test_create_block_mask_matches_dense_mask():
    mods = pagedc.compile("mask m(b, h, q, kv) = (q >= kv) & ((q - kv) % 3 != 1) | (h == 1)\n")
    mask = pagedc.create_block_mask(mods, 1, 2, 40, 50, BLOCK_SIZE=(8, 16))
    assert mask.shape == (1, 2, 40, 50) and mask.BLOCK_SIZE == (8, 16)
    assert mask.kv_num_blocks.shape == (1, 2, 5)
    assert mask.kv_indices.shape[:3] == (1, 2, 5)
    h = np.arange(2).reshape(1, 2, 1, 1)
    q = np.arange(40).reshape(1, 1, 40, 1)
    kv = np.arange(50).reshape(1, 1, 1, 50)
    expected = ((q >= kv) & ((q - kv) % 3 != 1)) | (h == 1)
    np.testing.assert_array_equal(mask.to_dense(), np.broadcast_to(expected, (1, 2, 40, 50)))
    assert 0 <= mask.sparsity() <= 100
    assert "BlockMask" in repr(mask)


def test_block_mask_from_kv_blocks_and_errors():
    num = np.array([[[1, 2]]], dtype=np.int32)
    idx = np.array([[[[0, 0], [0, 1]]]], dtype=np.int32)
    mask = pagedc.BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=4)
    assert mask.seq_lengths == (8, 8)
    blocks = mask.to_dense_blocks()
    np.testing.assert_array_equal(blocks[0, 0], [[1, 0], [1, 1]])
    with pytest.raises(pagedc.Error):
        pagedc.BlockMask.from_kv_blocks(num, np.array([[[[0, 0], [1, 1]]]], dtype=np.int32),
                                        BLOCK_SIZE=4)  # block 1 listed twice in a row
    with pytest.raises(ValueError, match="kv_num_blocks"):
        pagedc.BlockMask.from_kv_blocks(num[0], idx, BLOCK_SIZE=4)


def test_traced_python_mask_in_create_block_mask():
    mask = pagedc.create_block_mask(causal, None, None, 32, 32, BLOCK_SIZE=8)
    np.testing.assert_array_equal(mask.to_dense()[0, 0], np.tril(np.ones((32, 32), bool)))
    np.testing.assert_array_equal(mask.full_kv_num_blocks[0, 0], [0, 1, 2, 3])


# --- the cache: the seed's test vectors ---------------------------------

def test_seed_vector_1_out_of_pages_changes_nothing():
    cache = pagedc.PagedKVCache(12, 4, 3, 1, 8)
    cache.reserve([0, 1, 2], [8, 24, 16])
    before = (cache.free_pages, cache.page_table.copy())
    with pytest.raises(pagedc.Error, match="requested 2 pages but there are only 0 empty pages"):
        cache.reserve(0, 16)
    assert isinstance(pagedc.Error("x"), ValueError)
    assert (cache.free_pages, cache.page_table.tolist()) == (before[0], before[1].tolist())
    cache.erase(1)
    cache.reserve(0, 16)
    assert cache.capacity(0) == 16


def test_seed_vector_2_capacities():
    cache = pagedc.PagedKVCache(12, 4, 3, 1, 8)
    cache.reserve([0, 1, 2], [3, 11, 8])
    assert [cache.capacity(s) for s in range(3)] == [4, 12, 8]
    assert len(cache.free_pages) == 6
    cache.erase(1)
    assert [cache.capacity(s) for s in range(3)] == [4, 0, 8]
    cache.reserve([0, 1, 2], [7, 2, 10])
    assert [cache.capacity(s) for s in range(3)] == [8, 4, 12]
    cache.erase([0, 1, 2])
    assert [cache.capacity(s) for s in range(3)] == [0, 0, 0]
    assert len(cache.free_pages) == 12


def test_seed_vector_3_page_table_and_physical_mask():
    cache = pagedc.PagedKVCache(8, 128, 2, 1, 8)
    for lengths in ([100, 200], [150, 300], [300, 512], [512, 512]):
        cache.reserve([0, 1], lengths)
    assert cache.page_table.tolist() == [[0, 3, 5, 7, -1, -1, -1, -1],
                                         [2, 1, 4, 6, -1, -1, -1, -1]]
    assert [[cache.physical_to_logical(s, p) for p in range(8)] for s in range(2)] == \
        [[0, -1, -1, 1, -1, 2, -1, 3], [-1, 1, 0, -1, 2, -1, 3, -1]]
    mask = pagedc.create_block_mask(pagedc.compile(CAUSAL), 2, 1, 512, 512, BLOCK_SIZE=128)
    physical = cache.convert_logical_block_mask(mask, batch_idx=[0, 1])
    assert physical.physical_indices
    assert physical.kv_num_blocks.tolist() == [[[1, 1, 1, 1]], [[1, 1, 1, 1]]]
    assert physical.full_kv_num_blocks.tolist() == [[[0, 1, 2, 3]], [[0, 1, 2, 3]]]
    assert [physical.kv_indices[0, 0, r, 0] for r in range(4)] == [0, 3, 5, 7]
    assert [physical.kv_indices[1, 0, r, 0] for r in range(4)] == [2, 1, 4, 6]
    full = physical.full_kv_indices
    assert [list(full[1, 0, r, :r]) for r in range(4)] == [[], [2], [2, 1], [2, 1, 4]]


def test_seed_vector_4_assign_layout():
    cache = pagedc.PagedKVCache(6, 2, 2, 2, 3)
    for lengths in ([1, 3], [4, 5], [6, 6]):
        cache.reserve([0, 1], lengths)
    assert cache.page_table.tolist() == [[0, 3, 5, -1, -1, -1], [2, 1, 4, -1, -1, -1]]
    k = np.arange(2 * 2 * 6 * 3, dtype=np.float32).reshape(2, 2, 6, 3)
    pos = np.tile(np.arange(6, dtype=np.int64), (2, 1))
    cache.assign(np.array([0, 1]), pos, k, k.copy())
    rows = cache.k_cache[0].reshape(12, 3)
    assert rows[:, 0].tolist() == [0, 3, 42, 45, 36, 39, 6, 9, 48, 51, 12, 15]
    assert cache.k_cache[1].reshape(12, 3)[:3, 0].tolist() == [18, 21, 60]
    assert [cache.seq_len(s) for s in range(2)] == [6, 6]


def test_assign_errors_write_nothing(rng):
    cache = pagedc.PagedKVCache(4, 4, 2, 2, 8)
    cache.reserve(0, 8)
    k = randn(rng, 1, 2, 3, 8)
    snapshot = cache.k_cache.copy()
    with pytest.raises(pagedc.Error):  # position 8 is past the capacity
        cache.assign([0], np.array([[6, 7, 8]], dtype=np.int32), k, k)
    with pytest.raises(pagedc.Error):  # head dim
        cache.assign([0], np.array([[0, 1, 2]], dtype=np.int32), randn(rng, 1, 2, 3, 4),
                     randn(rng, 1, 2, 3, 4))
    with pytest.raises(ValueError, match="k_val"):  # not a tensor
        cache.assign([0], np.array([[0, 1, 2]], dtype=np.int32), [1, 2], k)
    np.testing.assert_array_equal(cache.k_cache, snapshot)
    assert cache.seq_len(0) == 0


def test_fork_shares_prefix_and_copies_on_write(rng):
    H, D, P = 2, 8, 4
    cache = pagedc.PagedKVCache(16, P, 3, H, D)
    k, v = randn(rng, 1, H, 10, D), randn(rng, 1, H, 10, D)
    cache.reserve(0, 10)
    cache.assign([0], np.arange(10, dtype=np.int32)[None], k, v)
    free = len(cache.free_pages)
    cache.fork(0, 1)  # length 10: pages 0-1 shared, the partial third copied
    assert cache.seq_len(1) == 10 and cache.capacity(1) == 12
    assert len(cache.free_pages) == free - 1
    shared = cache.page_table_row(0)[0]
    assert cache.page_table_row(1)[0] == shared and cache.page_ref_count(shared) == 2
    q = randn(rng, 2, H, 1, D)
    out = pagedc.flex_attention(q, cache, batch_idx=[0, 1], q_offset="end")
    ref = reference_attention(q, np.concatenate([k, k]), np.concatenate([v, v]),
                              q_offset=9)[0]
    assert_close(out, ref)
    # Writing into the shared page gives slot 1 its own copy; slot 0 unchanged.
    k2 = randn(rng, 1, H, 1, D)
    cache.assign([1], np.array([[2]], dtype=np.int32), k2, k2)
    assert cache.page_table_row(1)[0] != shared and cache.page_ref_count(shared) == 1
    out0 = pagedc.flex_attention(q[:1], cache, batch_idx=[0], q_offset="end")
    assert_close(out0, ref[:1])
    cache.erase([0, 1])
    assert len(cache.free_pages) == 16


def test_reserve_vector_is_all_or_nothing():
    cache = pagedc.PagedKVCache(4, 4, 2, 1, 8)
    with pytest.raises(pagedc.Error, match="requested 5 pages"):
        cache.reserve([0, 1], [8, 12])
    assert cache.capacity(0) == 0 and len(cache.free_pages) == 4
    with pytest.raises(ValueError, match="slot 7"):
        cache.reserve([0, 7], 4)
    assert cache.capacity(0) == 0


# --- argument errors: ValueError naming the argument, nothing written -----

def test_argument_errors(rng):
    mods = pagedc.compile(CAUSAL)
    q, k, v = randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 4, 8)
    with pytest.raises(ValueError, match="q"):
        pagedc.flex_attention(q.astype(np.float64), k, v, mods=mods)
    with pytest.raises(ValueError, match="q"):
        pagedc.flex_attention(q[0], k, v, mods=mods)
    with pytest.raises(ValueError, match="q"):
        pagedc.flex_attention(q.tolist(), k, v, mods=mods)
    with pytest.raises(ValueError, match="v"):
        pagedc.flex_attention(q, k, v[:, :, :3], mods=mods)
    with pytest.raises(ValueError, match="v"):
        pagedc.flex_attention(q, k, None, mods=mods)
    with pytest.raises(ValueError, match="mods"):
        pagedc.flex_attention(q, k, v, mods=causal)
    with pytest.raises(ValueError, match="q_offset"):
        pagedc.flex_attention(q, k, v, mods=mods, q_offset="middle")
    out = np.full((1, 2, 4, 8), 7.0, dtype=np.float32)
    with pytest.raises(ValueError):
        pagedc.flex_attention(q, k, v, mods=mods, out=out[:, :, :3])
    with pytest.raises(ValueError):
        pagedc.flex_attention(q, k, v, mods=mods, out=out.astype(np.float64))
    assert np.all(out == 7.0)


def test_default_lengths_follow_assign_fork_and_erase(rng):
    """A decode loop's calls reuse the per-batch lists the cache's lengths
    give; every assign, fork and erase must be seen by the next call."""
    B, H, D, page = 3, 2, 16, 8
    S = 37
    k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D)
    cache = pagedc.PagedKVCache(40, page, B + 1, H, D)
    cache.reserve(list(range(B)), S)
    q = randn(rng, B, H, 1, D)

    def check(lengths):
        out, lse = pagedc.flex_attention(q, cache, q_offset="end", return_lse=True)
        for b, n in enumerate(lengths):
            ref, ref_lse = reference_attention(q[b:b + 1], k[b:b + 1, :, :n],
                                               v[b:b + 1, :, :n], None, q_offset=n - 1)
            assert_close(out[b:b + 1], ref)
            assert_close(lse[b:b + 1], ref_lse)

    for n in (5, 6, 21, S):  # one decode step after another
        pos = np.broadcast_to(np.arange(n, dtype=np.int32), (B, n)).copy()
        cache.assign(np.arange(B, dtype=np.int32), pos, k[:, :, :n], v[:, :, :n])
        check([n] * B)
    cache.erase(1)
    cache.fork(0, 1, 13)
    k[1], v[1] = k[0], v[0]
    check([S, 13, S])
    cache.erase(2)
    with pytest.raises(ValueError, match="batch entry 2 has 1 query rows but kv_length 0"):
        pagedc.flex_attention(q, cache, q_offset="end")


def test_small_host_calls_follow_the_cache_and_match_the_reference(rng):
    """A call with default lists, no lse and compiled mods takes the small
    host path, whose per-batch lists are kept by the cache: every assign,
    fork and erase must reach the next call, out= and q_offset None or "end"
    must give what the reference gives, and what that path does not take
    must still be refused as before."""
    B, Hq, H, D, page = 3, 4, 2, 16, 8
    S = 45
    k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D)
    cache = pagedc.PagedKVCache(40, page, B + 1, H, D)
    cache.reserve(list(range(B)), S)
    mods = pagedc.compile(CAUSAL)
    q = randn(rng, B, Hq, 1, D)
    q2 = randn(rng, B, Hq, 2, D)

    def expect(out, q, lengths, at_end):
        for b, n in enumerate(lengths):
            offset = n - q.shape[2] if at_end else 0
            ref, _ = reference_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                         causal, q_offset=offset)
            assert_close(out[b:b + 1], ref)

    def check(lengths):
        expect(pagedc.flex_attention(q, cache, mods=mods, enable_gqa=True, q_offset="end"), q,
               lengths, True)
        out = np.full((B, Hq, 2, D), np.nan, dtype=np.float32)
        same = pagedc.flex_attention(q2, cache, mods=mods, enable_gqa=True, q_offset="end",
                                     out=out, threads=1)
        assert same is out
        expect(out, q2, lengths, True)
        expect(pagedc.flex_attention(q2, cache, mods=mods, enable_gqa=True), q2, lengths, False)

    for n in (5, 6, 21, S):  # one decode step after another
        pos = np.broadcast_to(np.arange(n, dtype=np.int32), (B, n)).copy()
        cache.assign(np.arange(B, dtype=np.int32), pos, k[:, :, :n], v[:, :, :n])
        check([n] * B)
    cache.erase(1)
    cache.fork(0, 1, 13)
    k[1], v[1] = k[0], v[0]
    check([S, 13, S])
    with pytest.raises(ValueError, match="enable_gqa"):
        pagedc.flex_attention(q, cache, mods=mods, q_offset="end")
    cache.erase(2)
    with pytest.raises(ValueError, match="batch entry 2 has 1 query rows but kv_length 0"):
        pagedc.flex_attention(q, cache, mods=mods, enable_gqa=True, q_offset="end")
    with pytest.raises(ValueError, match="options.out must be"):
        pagedc.flex_attention(q, cache, mods=mods, enable_gqa=True,
                              out=np.empty((B, Hq, 2, D), dtype=np.float32))


def test_binding_refuses_a_block_mask_of_another_type(rng):
    """The binding takes block_mask as a plain object (None is cheaper that
    way) and checks its type itself."""
    cache = pagedc.PagedKVCache(4, 8, 1, 2, 8)
    q = randn(rng, 1, 2, 1, 8)
    mods = pagedc.compile(CAUSAL)
    with pytest.raises(ValueError, match="block_mask: expected a BlockMask or None, got dict"):
        pagedc._pagedc.flex_attention(q, cache._native, {}, mods._native, {}, {}, [0], [0], [0],
                                      None, False, None, None, 1, {}, -1, 0, None)


def test_binding_errors(rng):
    mods = pagedc.compile("buffer bias: f32[?]\nparam w: i32 = 2\n"
                          "score s(s, b, h, q, kv) = s + bias[h] * w\n")
    q = randn(rng, 1, 2, 4, 8)
    with pytest.raises(pagedc.Error, match="bias"):
        pagedc.flex_attention(q, q, q, mods=mods)
    with pytest.raises(pagedc.Error, match="bias"):
        pagedc.flex_attention(q, q, q, mods=mods, buffers={"bias": np.zeros(2, np.int32)})
    with pytest.raises(ValueError, match="params\\['w'\\]"):
        pagedc.flex_attention(q, q, q, mods=mods, buffers={"bias": np.zeros(2, np.float32)},
                              params={"w": 1.5})
    with pytest.raises(ValueError, match="nope"):
        pagedc.flex_attention(q, q, q, mods=mods, buffers={"bias": np.zeros(2, np.float32)},
                              params={"nope": 1})
    with pytest.raises(ValueError, match="buffers\\['bias'\\]"):
        pagedc.flex_attention(q, q, q, mods=mods, buffers={"bias": [0.0, 1.0]})


def test_gil_is_released_during_attention(rng):
    import threading
    import time
    q = randn(rng, 4, 8, 512, 64)
    mods = pagedc.compile(CAUSAL)
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    start = time.perf_counter()
    pagedc.flex_attention(q, q[:, :8], q[:, :8], mods=mods, threads=1)
    elapsed = time.perf_counter() - start
    done.set()
    t.join()
    during = [x for x in ticks if start < x < start + elapsed]
    if elapsed > 0.05:  # long enough to see the other thread run
        assert len(during) >= 3
