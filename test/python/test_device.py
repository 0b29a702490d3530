"""CUDA memory from Python, on the SIMT emulator's device (device="emu"):
pagedc-allocated device tensors exported as DLPack CUDA memory, round trips,
pointer identity both ways (inputs read in place, results and out= in the
memory handed back), the __dlpack__(stream=...) handshake with a recording
producer, flex_attention and BatchAttention on the device against the
float64 reference, and the refusals (wrong device, dtype, stride) as
ValueErrors naming the argument."""
import numpy as np
import pytest

import pagedc
from conftest import assert_close, randn, reference_attention
from test_float8 import FORMATS, decode
from test_serving import CASCADE_SOURCE, make_cascade_step, make_step, reference_step

# Every case runs CUDA kernels on the emulator: small shapes, the emulator's
# driver chosen by device="emu" (PAGEDC_CUDA_DRIVER=emu) at the first use.
CAUSAL = "mask causal(b, h, q, kv) = q >= kv"
DEVICE_STEP = [(1, 40), (4, 33), (19, 50), (0, 20), (1, 1)]


@pytest.fixture(scope="module", autouse=True)
def emulator():
    # The build tree has the emulator's driver (pagedc-python depends on
    # it); an installed package may not: then every case here is skipped
    # with the loader's reason.
    try:
        pagedc.empty((1,), "f32", device="emu")
    except ValueError as error:
        if "was not found" not in str(error):
            raise
        pytest.skip(f"the SIMT emulator's driver is not available: {error}")


@pytest.fixture(scope="module")
def mods():
    if not pagedc.cuda_codegen_available():
        pytest.skip("this build has no CUDA code generation (compile(..., cuda=True))")
    return pagedc.compile(CAUSAL, cuda=True)


class Producer:
    """A DLPack producer wrapping a device tensor that records the stream
    each __dlpack__ call asked for."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.streams = []
        self.shape, self.dtype = tensor.shape, tensor.dtype

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()

    def __dlpack__(self, stream=None, **kwargs):
        self.streams.append(stream)
        return self.tensor.__dlpack__(stream=stream)


def randn16(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def test_device_tensors_export_cuda_memory_and_round_trip(rng):
    host = rng.standard_normal((3, 5)).astype(np.float32)
    x = pagedc.to_device(host, device="emu")
    assert x.__dlpack_device__() == (2, 0)
    assert x.device == "cuda:0" and x.shape == (3, 5) and x.dtype == "f32"
    np.testing.assert_array_equal(pagedc.to_host(x), host)
    # Through DLPack into another pagedc.Tensor: the same device memory.
    y = pagedc.Tensor.from_dlpack(x)
    assert y.data_ptr == x.data_ptr and y.__dlpack_device__() == (2, 0)
    np.testing.assert_array_equal(pagedc.to_host(y), host)
    # Non-contiguous host input is made contiguous first.
    np.testing.assert_array_equal(pagedc.to_host(pagedc.to_device(host.T, device="emu")),
                                  host.T)
    with pytest.raises(ValueError, match="^stream: expected an int"):
        x.__dlpack__(stream="s")
    e = pagedc.empty((2, 4), "int32", device="emu")
    assert e.shape == (2, 4) and e.dtype == "i32" and e.__dlpack_device__() == (2, 0)
    # NumPy cannot read CUDA memory: no array interface for device tensors.
    with pytest.raises(AttributeError):
        x.__array_interface__  # noqa: B018


def test_device_helpers_refuse_bad_arguments():
    with pytest.raises(ValueError, match="device: expected 'cpu', 'emu'"):
        pagedc.empty((2,), "f32", device="tpu")
    with pytest.raises(ValueError, match="device: pagedc.empty allocates CUDA memory"):
        pagedc.empty((2,), "f32", device="cpu")
    with pytest.raises(ValueError, match="device: cuda:7 does not exist"):
        pagedc.empty((2,), "f32", device="cuda:7")
    with pytest.raises(ValueError, match="shape: sizes must be >= 0"):
        pagedc.empty((2, -1), "f32", device="emu")
    with pytest.raises(ValueError, match="shape: the tensor's size in bytes overflows"):
        pagedc.empty((2**40, 2**40), "f32", device="emu")
    with pytest.raises(ValueError, match="dtype"):
        pagedc.empty((2,), "f128", device="emu")
    with pytest.raises(ValueError, match="tensor: must be in CUDA memory"):
        pagedc.to_host(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="array: must be in host memory"):
        pagedc.to_device(pagedc.empty((2,), "f32", device="emu"), device="emu")


def dense_inputs(rng, b=2, hq=4, hkv=2, length=7, keys=37, d=64):
    return randn16(rng, b, hq, length, d), randn16(rng, b, hkv, keys, d), \
        randn16(rng, b, hkv, keys, d)


def test_flex_attention_on_device_matches_reference(rng, mods):
    # Batch 2, GQA 2, 37 keys (no multiple of the page), lse, decode-style
    # offsets through a causal mask.
    q, k, v = dense_inputs(rng)
    qd, kd, vd = (pagedc.to_device(a, device="emu") for a in (q, k, v))
    out, lse = pagedc.flex_attention(qd, kd, vd, mods=mods, enable_gqa=True, return_lse=True,
                                     q_offset="end")
    assert isinstance(out, pagedc.Tensor) and out.__dlpack_device__() == (2, 0)
    assert out.shape == (2, 4, 7, 64) and out.dtype == "f16" and lse.dtype == "f32"
    ref_out, ref_lse = reference_attention(q, k, v, mask_fn=lambda b, h, qi, kv: qi >= kv,
                                           q_offset=37 - 7)
    assert_close(pagedc.to_host(out), ref_out, atol=2e-3, rtol=2e-3)
    assert_close(pagedc.to_host(lse), ref_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("link_mods", [True, "first"])
def test_flex_attention_with_linked_mods_matches_reference(rng, mods, link_mods):
    # The kernels that call the mods across a link (kernel option link_mods;
    # "first": linked until the inlined kernel compiled in the background is
    # ready, a shape's first variant inlined at once), decode (one token) and
    # prefill, against the same reference.
    for length in (1, 7):
        q, k, v = dense_inputs(rng, length=length)
        qd, kd, vd = (pagedc.to_device(a, device="emu") for a in (q, k, v))
        out, lse = pagedc.flex_attention(qd, kd, vd, mods=mods, enable_gqa=True,
                                         return_lse=True, q_offset="end",
                                         kernel_options={"link_mods": link_mods})
        ref_out, ref_lse = reference_attention(q, k, v, mask_fn=lambda b, h, qi, kv: qi >= kv,
                                               q_offset=37 - length)
        assert_close(pagedc.to_host(out), ref_out, atol=2e-3, rtol=2e-3)
        assert_close(pagedc.to_host(lse), ref_lse, atol=1e-3, rtol=1e-3)


def test_flex_attention_reads_inputs_and_writes_out_in_place(rng, mods):
    q, k, v = dense_inputs(rng, b=1, length=3, keys=20)
    qd = Producer(pagedc.to_device(q, device="emu"))
    kd = Producer(pagedc.to_device(k, device="emu"))
    vd = Producer(pagedc.to_device(v, device="emu"))
    out = pagedc.empty((1, 4, 3, 64), "f16", device="emu")
    stream = pagedc.Stream("emu")
    result = pagedc.flex_attention(qd, kd, vd, mods=mods, enable_gqa=True, out=out,
                                   stream=stream)
    # The result is the caller's out, and every producer was asked for its
    # data on the call's stream.
    assert result is out
    for producer in (qd, kd, vd):
        assert producer.streams and set(producer.streams) == {stream.cuda_stream}
    ref_out, _ = reference_attention(q, k, v, mask_fn=lambda b, h, qi, kv: qi >= kv)
    assert_close(pagedc.to_host(out), ref_out, atol=2e-3, rtol=2e-3)
    # Without a stream: the legacy default stream, DLPack's 1.
    qd.streams.clear()
    pagedc.flex_attention(qd, kd, vd, mods=mods, enable_gqa=True)
    assert qd.streams == [1]


def test_flex_attention_device_refusals_name_the_argument(rng, mods):
    q, k, v = dense_inputs(rng, b=1, length=2, keys=8)
    qd, kd, vd = (pagedc.to_device(a, device="emu") for a in (q, k, v))
    with pytest.raises(ValueError, match="^k: is on cpu but q is on cuda:0"):
        pagedc.flex_attention(qd, k, vd, mods=mods, enable_gqa=True)
    with pytest.raises(ValueError, match="^k: is on cuda:0 but q is on cpu"):
        pagedc.flex_attention(q.astype(np.float32), kd, v.astype(np.float32), mods=mods,
                              enable_gqa=True)
    with pytest.raises(ValueError, match="^out: is on cpu but the call runs on cuda:0"):
        pagedc.flex_attention(qd, kd, vd, mods=mods, enable_gqa=True,
                              out=np.zeros((1, 4, 2, 64), np.float16))
    q32 = pagedc.to_device(q.astype(np.float32), device="emu")
    with pytest.raises(ValueError, match="^q must be f16 or bf16 on cuda:0"):
        pagedc.flex_attention(q32, kd, vd, mods=mods, enable_gqa=True)
    strided = pagedc.Tensor.from_dlpack(pagedc.to_device(np.repeat(q, 2, axis=3),
                                                         device="emu"))
    with pytest.raises(ValueError, match="^q's last dimension must be contiguous"):
        # [1, 4, 2, 128] viewed through a producer as every other element.
        pagedc.flex_attention(StridedView(strided), kd, vd, mods=mods, enable_gqa=True)
    with pytest.raises(ValueError, match="^mods: q is in CUDA memory but the mods have no "
                                         "CUDA code"):
        pagedc.flex_attention(qd, kd, vd, mods=pagedc.compile(CAUSAL), enable_gqa=True)


def test_device_cache_decode_with_block_mask_matches_reference(rng, mods):
    # A PagedKVCache in device memory filled by assign from device tensors;
    # decode at the end of 30 keys (pages of 16), with and without a block
    # mask, and the cache's pages exported as CUDA memory.
    cache = pagedc.PagedKVCache(n_pages=8, page_size=16, max_batch_size=2, heads=2,
                                head_dim=64, dtype="f16", device="emu")
    assert cache.device == "cuda:0" and cache.k_cache.__dlpack_device__() == (2, 0)
    k, v = randn16(rng, 2, 2, 30, 64), randn16(rng, 2, 2, 30, 64)
    cache.reserve([0, 1], [30, 30])
    pos = np.broadcast_to(np.arange(30, dtype=np.int32), (2, 30)).copy()
    cache.assign(np.arange(2, dtype=np.int32), pos, pagedc.to_device(k, device="emu"),
                 pagedc.to_device(v, device="emu"))
    q = randn16(rng, 2, 4, 1, 64)
    qd = pagedc.to_device(q, device="emu")
    ref, _ = reference_attention(q, k, v, mask_fn=lambda b, h, qi, kv: qi >= kv, q_offset=29)
    out = pagedc.flex_attention(qd, cache, mods=mods, enable_gqa=True, q_offset="end")
    assert_close(pagedc.to_host(out), ref, atol=2e-3, rtol=2e-3)
    mask = pagedc.create_block_mask(mods, 2, None, 30, 30, BLOCK_SIZE=64)
    out = pagedc.flex_attention(qd, cache, block_mask=mask, mods=mods, enable_gqa=True,
                                q_offset="end")
    assert_close(pagedc.to_host(out), ref, atol=2e-3, rtol=2e-3)


class StridedView:
    """A producer exporting every other element of the last dimension of a
    device tensor: a stride the CUDA path refuses."""

    def __init__(self, tensor):
        self.tensor = tensor
        self.shape = tensor.shape[:-1] + (tensor.shape[-1] // 2,)
        self.dtype = tensor.dtype

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()

    def __dlpack__(self, stream=None, **kwargs):
        return pagedc._pagedc._strided_view(self.tensor, 2).__dlpack__(stream=stream)


def device_step(rng, mods, layout="NHD", page_size=16):
    step = make_step(rng, layout, page_size, hq=4, hkv=2, d=64, steps=DEVICE_STEP)
    step["q"] = step["q"].astype(np.float16)
    # The reference takes what the device sees: f16-rounded q, K and V.
    step["dense_k"] = [k.astype(np.float16) for k in step["dense_k"]]
    step["dense_v"] = [v.astype(np.float16) for v in step["dense_v"]]
    caches = [None if c is None else np.nan_to_num(c).astype(np.float16)
              for c in step["caches"]]
    attn = pagedc.BatchAttention(mods, 4, 2, 64, page_size, kv_layout=layout, max_num_seqs=8,
                                 max_num_tokens=64, device="emu", dtype="f16",
                                 max_blocks_per_seq=step["table"].shape[1])
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    return step, attn, caches


def test_batch_attention_on_device_matches_reference(rng, mods):
    step, attn, (k_cache, v_cache) = device_step(rng, mods)
    qd = pagedc.to_device(step["q"], device="emu")
    kd = Producer(pagedc.to_device(k_cache, device="emu"))
    vd = Producer(pagedc.to_device(v_cache, device="emu"))
    stream = pagedc.Stream("emu")
    out, lse = attn.run(qd, kd, vd, return_lse=True, stream=stream)
    assert out.__dlpack_device__() == (2, 0) and out.shape == step["q"].shape
    assert kd.streams == [stream.cuda_stream] and vd.streams == [stream.cuda_stream]
    # The kernels read the caches in place.
    assert attn._native.kernel_cache_addresses() == (kd.tensor.data_ptr, vd.tensor.data_ptr)
    stream.synchronize()
    ref_out, ref_lse = reference_step(step, lambda b, h, qi, kv: qi >= kv)
    rows = np.concatenate([np.arange(step["qsl"][b], step["qsl"][b + 1])
                           for b in range(len(DEVICE_STEP))])
    assert_close(pagedc.to_host(out)[rows], ref_out, atol=2e-3, rtol=2e-3)
    assert_close(pagedc.to_host(lse)[rows], ref_lse, atol=1e-3, rtol=1e-3)


def quantize(x, name):
    """The codes of `name` nearest to x (NaN: the canonical NaN 0x7f)."""
    _, _, max_code = FORMATS[name]
    codes = np.array([c for c in range(256) if (c & 0x7f) <= max_code])
    values = decode(codes, name)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    at = np.clip(np.searchsorted(ordered, x), 1, len(ordered) - 1)
    lower = np.abs(x - ordered[at - 1]) <= np.abs(ordered[at] - x)
    picked = codes[order][np.where(lower, at - 1, at)]
    return np.where(np.isnan(x), 0x7f, picked).astype(np.uint8)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_batch_attention_on_device_reads_float8_caches(rng, mods, name):
    # uint8 caches read as `name` (kv_dtype) with one scale for K and one
    # for V: the reference takes the values the codes mean.
    page_size, k_scale, v_scale = 16, 0.02, 0.015
    step = make_step(rng, "NHD", page_size, hq=4, hkv=2, d=64, steps=DEVICE_STEP)
    step["q"] = step["q"].astype(np.float16)
    k_codes, v_codes = (quantize(c / s, name) for c, s in zip(step["caches"], (k_scale, v_scale)))
    step["dense_k"] = [decode(quantize(k / k_scale, name), name) * k_scale
                       for k in step["dense_k"]]
    step["dense_v"] = [decode(quantize(v / v_scale, name), name) * v_scale
                       for v in step["dense_v"]]
    attn = pagedc.BatchAttention(mods, 4, 2, 64, page_size, kv_layout="NHD", max_num_seqs=8,
                                 max_num_tokens=64, device="emu", dtype="f16", kv_dtype=name,
                                 max_blocks_per_seq=step["table"].shape[1])
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    qd = pagedc.to_device(step["q"], device="emu")
    kd, vd = (pagedc.to_device(c, device="emu") for c in (k_codes, v_codes))
    out, lse = attn.run(qd, kd, vd, return_lse=True, kv_dtype=name, k_scale=k_scale,
                        v_scale=v_scale)
    ref_out, ref_lse = reference_step(step, lambda b, h, qi, kv: qi >= kv)
    rows = np.concatenate([np.arange(step["qsl"][b], step["qsl"][b + 1])
                           for b in range(len(DEVICE_STEP))])
    assert_close(pagedc.to_host(out)[rows], ref_out, atol=2e-3, rtol=2e-3)
    assert_close(pagedc.to_host(lse)[rows], ref_lse, atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="needs k_scale"):
        attn.run(qd, kd, vd, kv_dtype=name, v_scale=v_scale)
    with pytest.raises(ValueError, match="^kv_dtype: a CUDA BatchAttention reads 8-bit caches"):
        pagedc.BatchAttention(mods, 4, 2, 64, 16, device="emu", kv_dtype="f16")


def test_batch_attention_fixed_grid_and_scales_uploaded_before_a_capture(rng, mods):
    # fixed_grid=True: plan_shape is the limits' for every plan. A pair of
    # scales first given inside a capture would need a copy, which the
    # capture forbids: run() raises saying what to do; upload_scales()
    # copies it beforehand and the captured run then replays correctly.
    name, page_size, k_scale, v_scale = "float8_e4m3fn", 16, 0.02, 0.015
    step = make_step(rng, "NHD", page_size, hq=4, hkv=2, d=64, steps=DEVICE_STEP)
    step["q"] = step["q"].astype(np.float16)
    k_codes, v_codes = (quantize(c / s, name) for c, s in zip(step["caches"], (k_scale, v_scale)))
    step["dense_k"] = [decode(quantize(k / k_scale, name), name) * k_scale
                       for k in step["dense_k"]]
    step["dense_v"] = [decode(quantize(v / v_scale, name), name) * v_scale
                       for v in step["dense_v"]]
    attn = pagedc.BatchAttention(mods, 4, 2, 64, page_size, kv_layout="NHD", max_num_seqs=8,
                                 max_num_tokens=64, device="emu", dtype="f16", kv_dtype=name,
                                 max_blocks_per_seq=step["table"].shape[1], fixed_grid=True)
    attn.plan(step["qsl"][:2], step["seq_lens"][:1], step["table"][:1])
    shape = attn.plan_shape
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    assert attn.plan_shape == shape and shape[1] == 8
    qd = pagedc.to_device(step["q"], device="emu")
    kd, vd = (pagedc.to_device(c, device="emu") for c in (k_codes, v_codes))
    out = pagedc.to_device(np.full(step["q"].shape, np.nan, np.float16), device="emu")
    stream = pagedc.Stream("emu")
    refused = pagedc.CudaGraph()
    refused.capture_begin(stream)
    with pytest.raises(ValueError, match="upload_scales"):
        attn.run(qd, kd, vd, out=out, kv_dtype=name, k_scale=k_scale, v_scale=v_scale,
                 stream=stream)
    refused.capture_end()
    with pytest.raises(ValueError, match="k_scale"):
        attn.upload_scales([k_scale] * 3, v_scale)
    attn.upload_scales(k_scale, v_scale)
    graph = pagedc.CudaGraph()
    graph.capture_begin(stream)
    attn.run(qd, kd, vd, out=out, kv_dtype=name, k_scale=k_scale, v_scale=v_scale,
             stream=stream)
    graph.capture_end()
    graph.replay()
    stream.synchronize()
    ref_out, _ = reference_step(step, lambda b, h, qi, kv: qi >= kv)
    rows = np.concatenate([np.arange(step["qsl"][b], step["qsl"][b + 1])
                           for b in range(len(DEVICE_STEP))])
    assert_close(pagedc.to_host(out)[rows], ref_out, atol=2e-3, rtol=2e-3)


def test_batch_attention_on_device_writes_f32_out(rng, mods):
    # out_dtype="f32": the kernels store the f32 values they hold (most are
    # not f16 values), and a given out must be float32.
    step, _, (k_cache, v_cache) = device_step(rng, mods)
    attn = pagedc.BatchAttention(mods, 4, 2, 64, 16, kv_layout="NHD", max_num_seqs=8,
                                 max_num_tokens=64, device="emu", dtype="f16", out_dtype="f32",
                                 max_blocks_per_seq=step["table"].shape[1])
    attn.plan(step["qsl"], step["seq_lens"], step["table"])
    qd = pagedc.to_device(step["q"], device="emu")
    kd, vd = (pagedc.to_device(c, device="emu") for c in (k_cache, v_cache))
    out, lse = attn.run(qd, kd, vd, return_lse=True)
    host = pagedc.to_host(out)
    assert host.dtype == np.float32
    ref_out, ref_lse = reference_step(step, lambda b, h, qi, kv: qi >= kv)
    rows = np.concatenate([np.arange(step["qsl"][b], step["qsl"][b + 1])
                           for b in range(len(DEVICE_STEP))])
    assert_close(host[rows], ref_out, atol=2e-3, rtol=2e-3)
    assert_close(pagedc.to_host(lse)[rows], ref_lse, atol=1e-3, rtol=1e-3)
    assert np.mean(host[rows].astype(np.float16).astype(np.float32) != host[rows]) > 0.5
    with pytest.raises(ValueError, match="^out is f16 but must be f32"):
        attn.run(qd, kd, vd, out=pagedc.empty(step["q"].shape, "f16", device="emu"))
    with pytest.raises(ValueError, match="^out_dtype: a CUDA BatchAttention writes 'f32'"):
        pagedc.BatchAttention(mods, 4, 2, 64, 16, device="emu", dtype="f16", out_dtype="bf16")


def test_batch_attention_device_out_and_refusals(rng, mods):
    step, attn, (k_cache, v_cache) = device_step(rng, mods)
    qd = pagedc.to_device(step["q"], device="emu")
    kd, vd = (pagedc.to_device(c, device="emu") for c in (k_cache, v_cache))
    out = pagedc.empty(step["q"].shape, "f16", device="emu")
    assert attn.run(qd, kd, vd, out=out) is out
    ref_out, _ = reference_step(step, lambda b, h, qi, kv: qi >= kv)
    rows = np.concatenate([np.arange(step["qsl"][b], step["qsl"][b + 1])
                           for b in range(len(DEVICE_STEP))])
    assert_close(pagedc.to_host(out)[rows], ref_out, atol=2e-3, rtol=2e-3)
    with pytest.raises(ValueError, match="^q: is on cpu but the call runs on cuda:0"):
        attn.run(step["q"], kd, vd)
    with pytest.raises(ValueError, match="^v_cache: is on cpu but the call runs on cuda:0"):
        attn.run(qd, kd, v_cache)
    with pytest.raises(ValueError, match="^seq_lens: must be in host memory, got a tensor on "
                                         "cuda:0"):
        attn.plan(step["qsl"], pagedc.to_device(step["seq_lens"], device="emu"), step["table"])
    q32 = pagedc.to_device(step["q"].astype(np.float32), device="emu")
    with pytest.raises(ValueError, match="^q must be f16"):
        attn.run(q32, kd, vd)
    wide = pagedc.to_device(np.repeat(step["q"], 2, axis=2), device="emu")
    with pytest.raises(ValueError, match="^q"):
        attn.run(StridedView(wide), kd, vd)
    with pytest.raises(ValueError, match="^dtype: a CUDA BatchAttention computes in"):
        pagedc.BatchAttention(mods, 4, 2, 64, 16, device="emu", dtype="f32")
    with pytest.raises(ValueError, match="^mods: a CUDA BatchAttention needs mods with CUDA"):
        pagedc.BatchAttention(pagedc.compile(CAUSAL), 4, 2, 64, 16, device="emu")


def test_batch_attention_run_is_captured_on_the_call_stream(rng, mods):
    # run() enqueues on the call's stream and does no allocation, host copy
    # or synchronisation: captured into a graph (a global capture, where the
    # driver refuses those), its kernels do not run until the replay.
    step, attn, (k_cache, v_cache) = device_step(rng, mods)
    qd = pagedc.to_device(step["q"], device="emu")
    kd, vd = (pagedc.to_device(c, device="emu") for c in (k_cache, v_cache))
    out = pagedc.to_device(np.full(step["q"].shape, np.nan, np.float16), device="emu")
    stream = pagedc.Stream("emu")
    graph = pagedc.CudaGraph()
    graph.capture_begin(stream)
    assert attn.run(qd, kd, vd, out=out, stream=stream) is out
    graph.capture_end()
    assert np.isnan(pagedc.to_host(out)).all()
    graph.replay()
    stream.synchronize()
    ref_out, _ = reference_step(step, lambda b, h, qi, kv: qi >= kv)
    rows = np.concatenate([np.arange(step["qsl"][b], step["qsl"][b + 1])
                           for b in range(len(DEVICE_STEP))])
    assert_close(pagedc.to_host(out)[rows], ref_out, atol=2e-3, rtol=2e-3)
    with pytest.raises(ValueError, match="^capture_begin: the graph is capturing or captured"):
        graph.capture_begin(stream)
    with pytest.raises(ValueError, match="^replay: nothing captured"):
        pagedc.CudaGraph().replay()
    with pytest.raises(ValueError, match="^stream: expected a pagedc.Stream"):
        pagedc.CudaGraph().capture_begin(stream.cuda_stream)


def test_torch_cpu_tensors_move_to_the_device_and_back(rng, mods):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                                "(scripts/python-torch-tests.sh installs it in a venv)")
    q, k, v = (torch.from_numpy(a) for a in dense_inputs(rng, b=1, length=3, keys=20))
    qd = pagedc.to_device(q, device="emu")
    assert qd.__dlpack_device__() == (2, 0) and qd.dtype == "f16"
    np.testing.assert_array_equal(pagedc.to_host(qd), q.numpy())
    kd, vd = pagedc.to_device(k, device="emu"), pagedc.to_device(v, device="emu")
    out = pagedc.flex_attention(qd, kd, vd, mods=mods, enable_gqa=True)
    ref, _ = reference_attention(q.numpy(), k.numpy(), v.numpy(),
                                 mask_fn=lambda b, h, qi, kv: qi >= kv)
    assert_close(pagedc.to_host(out), ref, atol=2e-3, rtol=2e-3)
    # A host torch query with device keys is refused, naming k.
    with pytest.raises(ValueError, match="^k: is on cuda:0 but q is on cpu"):
        pagedc.flex_attention(q.float(), kd, vd, mods=mods, enable_gqa=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_merge_state_on_device_equals_the_whole_range(rng, dtype):
    # Keys [0, 37) and [37, 100) of random attention, merged on the device;
    # rows 1 and 4 see no key of the first range (its lse -inf, its values
    # NaN: never read), row 3 none at all (out 0, lse -inf).
    t, h, d, s = 6, 4, 32, 100
    q = rng.standard_normal((1, h, t, d))
    k, v = rng.standard_normal((1, h, s, d)), rng.standard_normal((1, h, s, d))

    def mask(b, hh, qi, kv):
        return ~(((qi == 1) | (qi == 4)) & (kv < 37)) & (qi != 3)

    whole, whole_lse = reference_attention(q, k, v, mask_fn=mask)
    parts = []
    for a, e in ((0, 37), (37, s)):
        o, l = reference_attention(q, k[:, :, a:e], v[:, :, a:e],
                                   mask_fn=lambda b, hh, qi, kv, a=a: mask(b, hh, qi, kv + a))
        o = np.where(np.isneginf(l)[..., None], np.nan, o)
        parts.append((o[0].transpose(1, 0, 2).astype(dtype), l[0].T.astype(np.float32)))
    (va, sa), (vb, sb) = [(pagedc.to_device(o, device="emu"), pagedc.to_device(l, device="emu"))
                          for o, l in parts]
    want = np.nan_to_num(whole[0].transpose(1, 0, 2))
    tol = 1e-5 if dtype == np.float32 else 3e-3
    merged, lse = pagedc.merge_state(va, sa, vb, sb)
    assert merged.device == "cuda:0" and merged.dtype == np.dtype(dtype).name.replace(
        "float", "f")
    assert_close(pagedc.to_host(merged).astype(np.float64), want, atol=tol, rtol=tol)
    assert_close(pagedc.to_host(lse), whole_lse[0].T, atol=1e-5, rtol=1e-5)
    assert np.all(pagedc.to_host(merged)[3] == 0) and np.all(np.isneginf(pagedc.to_host(lse)[3]))
    stacked_v = pagedc.to_device(np.stack([o for o, _ in parts], axis=1), device="emu")
    stacked_s = pagedc.to_device(np.stack([l for _, l in parts], axis=1), device="emu")
    merged_n, lse_n = pagedc.merge_states(stacked_v, stacked_s)
    assert_close(pagedc.to_host(merged_n), pagedc.to_host(merged), atol=0, rtol=0)
    stream = pagedc.Stream()
    pagedc.merge_state_in_place(va, sa, vb, sb, stream=stream)
    stream.synchronize()
    assert_close(pagedc.to_host(va), pagedc.to_host(merged), atol=0, rtol=0)
    assert_close(pagedc.to_host(sa), pagedc.to_host(lse), atol=0, rtol=0)


def test_merge_state_device_refusals_name_the_argument(rng):
    va = pagedc.to_device(np.ones((3, 2, 16), np.float16), device="emu")
    sa = pagedc.to_device(np.zeros((3, 2), np.float32), device="emu")
    host_v = np.ones((3, 2, 16), np.float16)
    with pytest.raises(ValueError, match="v_b"):
        pagedc.merge_state(va, sa, host_v, sa)
    with pytest.raises(ValueError, match="s_b must be f32"):
        pagedc.merge_state(va, sa, va, pagedc.to_device(np.zeros((3, 2), np.float16),
                                                        device="emu"))
    with pytest.raises(ValueError, match="v_b must have v_a's shape"):
        pagedc.merge_state(va, sa, pagedc.to_device(np.ones((2, 2, 16), np.float16),
                                                    device="emu"), sa)
    assert np.all(pagedc.to_host(va) == 1) and np.all(pagedc.to_host(sa) == 0)


@pytest.mark.parametrize("page_size", [1, 16])
def test_cascade_on_device_matches_reference(rng, page_size):
    """CascadeAttention on the emulated device: each group's prefix read by
    one entry of the prefix level (token maps: the rows' own positions and
    sequence indices), the suffixes from kv_start, merged on the device;
    against float64 under a per-sequence window and a relative score."""
    if not pagedc.cuda_codegen_available():
        pytest.skip("this build has no CUDA code generation (compile(..., cuda=True))")
    step, groups = make_cascade_step(rng, page_size)
    mods = pagedc.compile(CASCADE_SOURCE, cuda=True)
    window = rng.integers(3, 40, size=len(step["seq_lens"])).astype(np.int32)
    cascade = pagedc.CascadeAttention(mods, step["hq"], step["hkv"], step["d"], page_size,
                                      max_num_seqs=16, max_num_tokens=64, device="emu",
                                      dtype="f16")
    cascade.plan(step["qsl"], step["seq_lens"], step["table"], groups)
    q16 = step["q"].astype(np.float16)
    k16, v16 = (c.astype(np.float16) for c in step["caches"])
    stream = pagedc.Stream("emu")
    out, lse = cascade.run(pagedc.to_device(q16, device="emu"),
                           pagedc.to_device(k16, device="emu"),
                           pagedc.to_device(v16, device="emu"),
                           buffers={"window": pagedc.to_device(window, device="emu")},
                           return_lse=True, stream=stream)
    stream.synchronize()
    ref_out, ref_lse = [], []
    for b in range(len(step["seq_lens"])):
        start, end = step["qsl"][b], step["qsl"][b + 1]
        if end == start:
            continue
        k, v = (x[b].astype(np.float16) for x in (step["dense_k"], step["dense_v"]))
        o, s = reference_attention(
            q16[start:end].transpose(1, 0, 2)[None], k[None], v[None],
            mask_fn=lambda _b, h, qi, kv, b=b: (qi >= kv) & (qi - kv <= window[b]),
            score_fn=lambda s_, _b, h, qi, kv: s_ - 0.01 * (qi - kv),
            q_offset=int(step["seq_lens"][b]) - (end - start))
        ref_out.append(o[0].transpose(1, 0, 2))
        ref_lse.append(s[0].T)
    assert_close(pagedc.to_host(out).astype(np.float64), np.concatenate(ref_out), atol=2e-3,
                 rtol=2e-3)
    assert_close(pagedc.to_host(lse), np.concatenate(ref_lse), atol=1e-3, rtol=1e-3)
    # The prefix level: one entry per group and per lone sequence.
    assert cascade._prefix.num_seqs == len(groups) + 2


def test_mla_decode_on_device_reads_values_from_the_latent_cache(rng, mods):
    # MLA decode (templates/MlaDecode.cuh): Hq 16 against one 576-wide
    # latent head, the values its first 512 columns: v_cache is a view of
    # k_cache's device memory (the kernels are given one address).
    hq, d, dv, page_size = 16, 576, 512, 16
    steps = [(1, 70), (3, 41)]
    pages = [-(-s // page_size) for _, s in steps]
    order = rng.permutation(sum(pages))
    table = np.zeros((len(steps), max(pages)), dtype=np.int32)
    cache = np.zeros((len(order), page_size, 1, d), dtype=np.float16)
    latents, next_page = [], 0
    for b, (_, s) in enumerate(steps):
        latent = randn(rng, 1, s, d).astype(np.float16)
        latents.append(latent)
        table[b, :pages[b]] = order[next_page:next_page + pages[b]]
        next_page += pages[b]
        for pos in range(s):
            cache[table[b, pos // page_size], pos % page_size] = latent[:, pos]
    qsl = np.cumsum([0] + [n for n, _ in steps]).astype(np.int32)
    q = randn(rng, int(qsl[-1]), hq, d).astype(np.float16)
    scale = 1.0 / np.sqrt(192.0)
    attn = pagedc.BatchAttention(mods, hq, 1, d, page_size, kv_layout="NHD", value_head_dim=dv,
                                 max_num_seqs=4, max_num_tokens=8, device="emu", dtype="f16")
    attn.plan(qsl, np.array([s for _, s in steps], dtype=np.int32), table)
    kd = pagedc.to_device(cache, device="emu")
    vd = pagedc._pagedc._strided_view(kd, 1, dv)
    out, lse = attn.run(pagedc.to_device(q, device="emu"), kd, vd, scale=scale, return_lse=True)
    assert attn._native.kernel_cache_addresses() == (kd.data_ptr, kd.data_ptr)
    out, lse = pagedc.to_host(out), pagedc.to_host(lse)
    for b, (n, s) in enumerate(steps):
        latent = latents[b][None]
        ref_out, ref_lse = reference_attention(
            q[qsl[b]:qsl[b + 1]].transpose(1, 0, 2)[None], latent, latent[..., :dv],
            scale=scale, q_offset=s - n, mask_fn=lambda _b, h, qi, kv: qi >= kv)
        assert_close(out[qsl[b]:qsl[b + 1]], ref_out[0].transpose(1, 0, 2), atol=2e-3,
                     rtol=2e-3)
        assert_close(lse[qsl[b]:qsl[b + 1]], ref_lse[0].T, atol=1e-3, rtol=1e-3)
    # A V cache of its own memory is refused, naming what the kernel reads.
    with pytest.raises(ValueError, match="v_cache must be a view of k_cache"):
        attn.run(pagedc.to_device(q, device="emu"), kd,
                 pagedc.to_device(cache[..., :dv], device="emu"), scale=scale)
