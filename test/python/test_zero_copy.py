"""DLPack in and out: zero-copy for NumPy (always) and PyTorch (when installed)."""
import numpy as np
import pytest

import pagedc
from conftest import randn


def test_numpy_in_is_zero_copy():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = pagedc.Tensor.from_dlpack(a)
    assert t.data_ptr == a.ctypes.data
    assert t.shape == (2, 3, 4) and t.dtype == "f32" and t.device == "cpu"
    strided = a.transpose(2, 0, 1)
    ts = pagedc.Tensor.from_dlpack(strided)
    assert ts.data_ptr == a.ctypes.data and ts.strides == (1, 12, 4)


def test_result_out_to_numpy_is_zero_copy(rng):
    q = randn(rng, 1, 2, 4, 8)
    t = pagedc.Tensor.from_dlpack(q)
    back = np.from_dlpack(t)
    assert back.ctypes.data == q.ctypes.data
    out = pagedc.flex_attention(t, q, q)  # a pagedc.Tensor in: a pagedc.Tensor out
    assert isinstance(out, pagedc.Tensor)
    arr = np.from_dlpack(out)
    assert arr.ctypes.data == out.data_ptr
    del out  # the array keeps the result's storage alive
    assert np.isfinite(arr).all()
    assert out_dlpack_device(arr) == (1, 0)


def out_dlpack_device(arr):
    return arr.__dlpack_device__()


def test_kv_cache_views_are_zero_copy(rng):
    cache = pagedc.PagedKVCache(4, 4, 1, 2, 8)
    view = cache.k_cache
    assert view.shape == (2, 4, 4, 8)
    assert view.ctypes.data == cache.k_cache.ctypes.data
    cache.reserve(0, 4)
    k = randn(rng, 1, 2, 4, 8)
    cache.assign([0], np.arange(4, dtype=np.int32)[None], k, k)
    page = cache.page_table_row(0)[0]
    np.testing.assert_array_equal(view[:, page], k[0])  # the old view sees the write
    del cache
    assert view.sum() == view.sum()  # the view keeps the storage alive


def test_readonly_and_foreign_inputs_are_value_errors(rng):
    q = randn(rng, 1, 1, 2, 4)
    with pytest.raises(ValueError, match="q"):
        pagedc.flex_attention("not a tensor", q, q)
    ints = np.zeros((1, 1, 2, 4), dtype=np.int32)
    with pytest.raises(ValueError):
        pagedc.flex_attention(ints, q, q)


def test_torch_cpu_tensors_zero_copy():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                                "(scripts/python-torch-tests.sh installs it in a venv)")
    q = torch.randn(1, 2, 4, 8)
    t = pagedc.Tensor.from_dlpack(q)
    assert t.data_ptr == q.data_ptr()
    out = pagedc.flex_attention(q, q, q)
    assert isinstance(out, torch.Tensor)
    back = torch.from_dlpack(pagedc.Tensor.from_dlpack(out))
    assert back.data_ptr() == out.data_ptr()
    buf = torch.empty(1, 2, 4, 8)
    assert pagedc.flex_attention(q, q, q, out=buf) is buf
