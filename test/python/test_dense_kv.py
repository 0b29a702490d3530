"""flex_attention(q, k, v) on the CPU reads dense k / v where they lie: no
temporary PagedKVCache, whatever their strides. Checked against the float64
reference on fresh random inputs: odd lengths, GQA, batch > 1, per-entry
lengths, strided (transposed) keys, bf16, masks, fully masked rows, lse."""
import numpy as np
import pytest

import pagedc
import pagedc._api as api
from conftest import assert_close, randn, reference_attention

CAUSAL = "mask causal(b, h, q, kv) = q >= kv\n"


def causal(b, h, q, kv):
    return q >= kv


@pytest.fixture
def no_cache(monkeypatch):
    """Fails the test if the call builds a PagedKVCache or copies k / v into
    one: the dense path must hand the caller's tensors to the kernel."""
    def refuse(*args, **kwargs):
        raise AssertionError("flex_attention copied dense k / v into a cache")
    monkeypatch.setattr(api, "_contiguous_cache", refuse)
    monkeypatch.setattr(api.PagedKVCache, "__init__", refuse)


def transposed(rng, B, H, S, D):
    """A [B, H, S, D] view of [B, S, H, D] storage (strides of a transpose)."""
    return randn(rng, B, S, H, D).transpose(0, 2, 1, 3)


def test_numpy_gqa_odd_lengths_strided_keys(rng, no_cache):
    B, Hq, Hkv, S, D = 3, 8, 2, 1000, 16
    q = randn(rng, B, Hq, 1, D)
    k, v = transposed(rng, B, Hkv, S, D), transposed(rng, B, Hkv, S, 24)
    assert not k.flags.c_contiguous
    lengths = [1000, 37, 513]
    out, lse = pagedc.flex_attention(q, k, v, mods=pagedc.compile(CAUSAL), enable_gqa=True,
                                     kv_length=lengths, q_offset="end", return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, causal, q_offset=[n - 1 for n in lengths],
                                       kv_length=lengths)
    assert out.shape == (B, Hq, 1, 24)
    assert_close(out, ref)
    assert_close(lse, ref_lse)


def test_numpy_prefill_block_mask_and_fully_masked_rows(rng, no_cache):
    B, H, S, D = 2, 4, 37, 16
    q, k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D), randn(rng, B, H, S, D)
    # Rows q < 5 see no key: the mask keeps kv <= q - 5.
    mods = pagedc.compile("mask late(b, h, q, kv) = q - 5 >= kv\n")
    mask = pagedc.create_block_mask(mods, None, None, S, S, BLOCK_SIZE=(16, 8))
    out, lse = pagedc.flex_attention(q, k, v, block_mask=mask, mods=mods, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v, lambda b, h, qi, kv: qi - 5 >= kv)
    assert np.all(np.isneginf(lse[:, :, :5])) and np.all(out[:, :, :5] == 0)
    assert_close(out, ref)
    assert_close(lse, ref_lse)


def test_numpy_batch_idx_picks_entries_of_k(rng, no_cache):
    q = randn(rng, 2, 2, 3, 8)
    k, v = randn(rng, 3, 2, 20, 8), randn(rng, 3, 2, 20, 8)
    out = pagedc.flex_attention(q, k, v, batch_idx=[2, 0], kv_length=[20, 11])
    ref, _ = reference_attention(q, k[[2, 0]], v[[2, 0]], kv_length=[20, 11])
    assert_close(out, ref)


def test_numpy_keys_with_a_non_unit_last_stride(rng, no_cache):
    # [B, H, D, S] storage viewed as [B, H, S, D]: every element of a key row
    # is S floats from the next (the runtime converts such rows a tile at a
    # time instead of reading them in place as vectors).
    q = randn(rng, 2, 4, 3, 8)
    k = randn(rng, 2, 2, 8, 45).transpose(0, 1, 3, 2)
    v = randn(rng, 2, 2, 8, 45).transpose(0, 1, 3, 2)
    assert k.strides[3] != 4
    out, lse = pagedc.flex_attention(q, k, v, enable_gqa=True, return_lse=True)
    ref, ref_lse = reference_attention(q, k, v)
    assert_close(out, ref)
    assert_close(lse, ref_lse)


def test_numpy_negative_strides_are_copied_first(rng):
    q, k, v = randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 9, 8), randn(rng, 1, 2, 9, 8)
    backwards = k[:, :, ::-1]
    out = pagedc.flex_attention(q, backwards, v)
    assert_close(out, reference_attention(q, backwards, v)[0])


def test_dense_errors_name_the_argument(rng):
    q, k = randn(rng, 1, 2, 4, 8), randn(rng, 1, 2, 9, 8)
    with pytest.raises(ValueError, match="v"):
        pagedc.flex_attention(q, k, k[:, :, :5])
    with pytest.raises(ValueError, match="k"):
        pagedc.flex_attention(q, k[0], k)
    with pytest.raises(ValueError, match="kv_length"):
        pagedc.flex_attention(q, k, k, kv_length=[1, 2])
    with pytest.raises(ValueError, match="kvLength"):
        pagedc.flex_attention(q, k, k, kv_length=[10])
    with pytest.raises(ValueError, match="k is f16"):
        pagedc.flex_attention(q, k.astype(np.float16), k.astype(np.float16))
    with pytest.raises(ValueError, match="^v: is on cuda:0 but q is on cpu"):
        pagedc.flex_attention(q, k, pagedc.to_device(k.astype(np.float16), device="emu"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_strided_keys_are_read_in_place(rng, dtype, no_cache):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                                "(scripts/python-torch-tests.sh installs it in a venv)")
    B, Hq, Hkv, S, D = 2, 6, 2, 75, 32
    tdtype = getattr(torch, dtype)
    q = torch.from_numpy(randn(rng, B, Hq, 9, D)).to(tdtype)
    # Keys and values as an engine might hold them, [B, S, Hkv, D], viewed.
    k = torch.from_numpy(randn(rng, B, S, Hkv, D)).to(tdtype).transpose(1, 2)
    v = torch.from_numpy(randn(rng, B, S, Hkv, D)).to(tdtype).transpose(1, 2)
    assert not k.is_contiguous()
    assert pagedc.Tensor.from_dlpack(k).data_ptr == k.data_ptr()
    out, lse = pagedc.flex_attention(q, k, v, enable_gqa=True, return_lse=True,
                                     q_offset="end", mask_mod=lambda b, h, qi, kv: qi >= kv)
    assert out.dtype == tdtype
    ref, ref_lse = reference_attention(q.float().numpy(), k.float().numpy(), v.float().numpy(),
                                       causal, q_offset=S - 9)
    tol = 2e-5 if dtype == "float32" else 1e-2
    assert_close(out.float().numpy(), ref, atol=tol, rtol=tol)
    assert_close(lse.numpy(), ref_lse, atol=2e-5, rtol=2e-5)
