"""The torch side of bench/gpu/baselines.py, run on the CPU: the paged cache
the paged baselines read holds the configuration's K/V under its page
table, FlashInfer's indices describe that table, and the float32 reference
every baseline is checked against equals conftest's float64 reference for
each mod of bench/gpu/bench.attn (decode at the end of the sequence,
documents, windows, ALiBi, soft-capping). The baselines themselves need a
GPU. Every test needs PyTorch and is reported SKIPPED without it."""
import os
import sys

import numpy as np
import pytest

from conftest import SOURCE_DIR, reference_attention

try:
    import torch
    _missing = None
except ImportError as error:
    torch = None
    _missing = "PyTorch is not installed (%s; scripts/python-torch-tests.sh installs it)" % error

pytestmark = pytest.mark.skipif(_missing is not None, reason=_missing or "")

sys.path.insert(0, os.path.join(SOURCE_DIR, "bench", "gpu"))
import baselines  # noqa: E402

baselines.DEVICE = "cpu"
SOFTCAP = 30.0


def _config(kind, mask="", score="", batch=2, q_len=1, kv_len=77, page=16):
    buffers = []
    if score == "alibi":
        buffers.append({"name": "slopes", "file": "slopes.npy"})
    if mask == "document":
        buffers.append({"name": "document_id", "file": "document_id.npy"})
    return {"name": "%s-%s-x-p%d" % (kind, mask or "none", page), "kind": kind,
            "batch": batch, "heads_q": 8, "heads_kv": 2, "q_len": q_len, "kv_len": kv_len,
            "head_dim": 16, "page_size": page, "mask": mask, "score": score,
            "params": [], "buffers": buffers}


@pytest.fixture
def pack(tmp_path):
    np.save(tmp_path / "slopes.npy", np.exp2(-8.0 * np.arange(1, 9) / 8).astype(np.float32))
    # Documents of 23, 40 and 34 tokens: not multiples of any block.
    ids = np.repeat(np.arange(3, dtype=np.int32), [23, 40, 34])
    np.save(tmp_path / "document_id.npy", ids)
    return str(tmp_path)


def test_paged_cache_holds_k_and_v(pack):
    config = _config("decode", kv_len=77, page=16, batch=3)
    inputs = baselines.Inputs(torch, config, pack)
    k_cache, v_cache, table, lens, tables = inputs.paged()
    assert lens.tolist() == [77] * 3
    # Sequences' pages interleave (chunks of 4 pages in turn), none shared.
    flat = [p for t in tables for p in t]
    assert sorted(flat) == list(range(len(flat))) and tables[0] != list(range(len(tables[0])))
    for b in range(3):
        for j in (0, 15, 16, 63, 64, 76):
            page, row = table[b, j // 16].item(), j % 16
            assert torch.equal(k_cache[page, row], inputs.k[b, :, j])
            assert torch.equal(v_cache[page, row], inputs.v[b, :, j])
    indptr, indices, last = baselines.flashinfer_indices(tables, [77] * 3, 16)
    assert indptr == [0, 5, 10, 15] and last == [13, 13, 13]
    assert indices[5:10] == tables[1]


def _check_reference(config, pack, mask_fn, score_fn, q_scale=1.0):
    inputs = baselines.Inputs(torch, config, pack)
    # Scores of tens where a soft cap of 30 must bend them.
    inputs.q = (inputs.q.float() * q_scale).to(inputs.q.dtype)
    B, Hq, Hkv, Lq, Lkv, D = inputs.shape
    want, _ = reference_attention(inputs.q.float().numpy(), inputs.k.float().numpy(),
                                  inputs.v.float().numpy(), mask_fn=mask_fn, score_fn=score_fn,
                                  q_offset=Lkv - Lq)
    rows = baselines.sample_rows(Lq, count=16)
    got = inputs.reference(rows).numpy()
    np.testing.assert_allclose(got, want[0, :Hq // Hkv][:, rows], rtol=0, atol=2e-5)
    return inputs


def test_reference_decode_causal_alibi(pack):
    slopes = np.exp2(-8.0 * np.arange(1, 9) / 8)
    _check_reference(_config("decode", "causal", "alibi"), pack,
                     lambda b, h, q, kv: q >= kv,
                     lambda s, b, h, q, kv: s + slopes[h] * (kv - q))


def test_reference_decode_sliding_softcap(pack):
    config = _config("decode", "sliding_4k", "softcap_tanh", kv_len=4200)
    _check_reference(config, pack, lambda b, h, q, kv: (q >= kv) & (q - kv < 4096),
                     lambda s, b, h, q, kv: SOFTCAP * np.tanh(s / SOFTCAP), q_scale=40.0)


def test_reference_prefill_documents(pack):
    ids = np.repeat(np.arange(3), [23, 40, 34])
    config = _config("prefill", "document", q_len=97, kv_len=97)
    inputs = _check_reference(config, pack,
                              lambda b, h, q, kv: (ids[q] == ids[kv]) & (q >= kv), None)
    offsets, longest = inputs.document_offsets()
    assert offsets.tolist() == [0, 23, 63, 97, 120, 160, 194] and longest == 40


def test_reference_prefill_sliding_and_none(pack):
    _check_reference(_config("prefill", "sliding_1k", q_len=1100, kv_len=1100, batch=1), pack,
                     lambda b, h, q, kv: (q >= kv) & (q - kv < 1024), None)
    _check_reference(_config("prefill", q_len=50, kv_len=50), pack, None, None)


def test_probe_names_why_a_baseline_is_missing():
    reasons = baselines.probe(torch)
    assert set(reasons) == set(baselines.BASELINES)
    for name in ("fa4", "flashinfer"):
        try:
            __import__({"fa4": "flash_attn.cute", "flashinfer": "flashinfer"}[name])
            assert reasons[name] == ""
        except ImportError:
            assert reasons[name].startswith("import ")
    assert bool(reasons["flex_flash"]) == bool(reasons["fa4"])
    if not torch.backends.cudnn.is_available():
        assert "cuDNN" in reasons["sdpa_cudnn"]


def test_a_baseline_computing_another_function_is_no_anchor(pack, monkeypatch):
    """run_baseline times a baseline only when its rows match the reference:
    SDPA's math on the CPU with the causal mask passes, without it (another
    function) is recorded as a mismatch and never timed."""
    import torch.nn.functional as F

    def sdpa(causal):
        def build(torch_module, inputs):
            q, k, v = (x.float() for x in (inputs.q, inputs.k, inputs.v))
            return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                           enable_gqa=True)), "dense", \
                (lambda out: out)
        return build
    monkeypatch.setitem(baselines.BUILDERS, "right", sdpa(True))
    monkeypatch.setitem(baselines.BUILDERS, "wrong", sdpa(False))
    timed = []
    monkeypatch.setattr(baselines, "timed",
                        lambda torch_module, fn, args, flush: timed.append(1) or {"ms": 1.0})
    args = type("Args", (), {"tolerance": 0.03})()
    inputs = baselines.Inputs(torch, _config("prefill", "causal", q_len=300, kv_len=300), pack)
    right = baselines.run_baseline(torch, "right", inputs, args, None)
    assert right["status"] == "ok" and right["rel_l2"] < 1e-3 and right["ms"] == 1.0
    wrong = baselines.run_baseline(torch, "wrong", inputs, args, None)
    assert wrong["status"] == "mismatch" and wrong["rel_l2"] > 0.03 and "ms" not in wrong
    assert timed == [1]


# The libraries' own signatures, where they import (they need no GPU to
# import: FlashAttention-4 with the CuTe DSL, FlashInfer): each builder's
# calls are bound to the real functions and methods, and their tensors are
# checked against the layouts the libraries document. Skipped where the
# packages are not installed (scripts/gpu-wheels.sh fetches them).
import importlib  # noqa: E402
import inspect  # noqa: E402


def _library(name):
    try:
        return importlib.import_module(name)
    except Exception as error:  # any import failure: the test cannot run here
        pytest.skip("%s does not import here (%s: %s)" % (name, type(error).__name__, error))


def _small_inputs(pack, kind, mask, score):
    """A prefill of 97 rows, or a decode over 200 keys (13 pages of 16)."""
    length = 97 if kind == "prefill" else 1
    config = _config(kind, mask, score, q_len=length, kv_len=97 if kind == "prefill" else 200)
    return baselines.Inputs(torch, config, pack)


def _bound(real, calls):
    """A stand-in for `real` that binds every call to its signature, keeps
    the arguments and returns zeros shaped as its q (out, lse)."""
    signature = inspect.signature(real)

    def stand_in(*args, **kwargs):
        calls.append(signature.bind(*args, **kwargs).arguments)
        q = args[0]
        return torch.zeros_like(q), None
    return stand_in


@pytest.mark.parametrize("kind,mask,score", [("decode", "sliding_4k", "softcap_tanh"),
                                             ("decode", "causal", ""),
                                             ("prefill", "causal", ""),
                                             ("prefill", "sliding_1k", "softcap_tanh"),
                                             ("prefill", "document", "")])
def test_fa4_calls_bind_to_its_interface(pack, monkeypatch, kind, mask, score):
    cute = _library("flash_attn.cute")
    calls = []
    for name in ("flash_attn_func", "flash_attn_varlen_func"):
        monkeypatch.setattr(cute, name, _bound(getattr(cute, name), calls))
    inputs = _small_inputs(pack, kind, mask, score)
    fn, layout, to_bhld = baselines.build_fa4(torch, inputs)
    out = to_bhld(fn())
    assert tuple(out.shape) == tuple(inputs.q.shape)
    (arguments,) = calls
    B, Hq, Hkv, Lq, Lkv, D = inputs.shape
    if kind == "decode":
        # FlashAttention-4's paged layout: k, v (pages, page, Hkv, D),
        # page_table int32 (B, pages a sequence), q (B, Lq, Hq, D).
        table = arguments["page_table"]
        assert table.dtype == torch.int32 and table.shape[0] == B
        assert tuple(arguments["k"].shape[1:]) == (16, Hkv, D)
        assert arguments["seqused_k"].tolist() == [Lkv] * B
        assert tuple(arguments["q"].shape) == (B, Lq, Hq, D)
    elif mask == "document":
        assert arguments["cu_seqlens_q"].tolist()[-1] == B * Lq
        assert tuple(arguments["q"].shape) == (B * Lq, Hq, D)
    window = baselines.window_of(mask)
    assert arguments.get("window_size", (None, None)) == ((window - 1, 0) if window
                                                          else (None, None))
    assert arguments.get("softcap", 0.0) == (SOFTCAP if score else 0.0)


@pytest.mark.parametrize("kind,mask,score", [("decode", "causal", "alibi"),
                                             ("decode", "sliding_4k", "softcap_tanh"),
                                             ("prefill", "causal", "alibi"),
                                             ("prefill", "sliding_1k", "softcap_tanh"),
                                             ("prefill", "document", "")])
def test_flashinfer_calls_bind_to_its_wrappers(pack, monkeypatch, kind, mask, score):
    flashinfer = _library("flashinfer")
    calls = []

    def stand_in_for(real_class):
        class StandIn:
            def __init__(self, *args, **kwargs):
                inspect.signature(real_class.__init__).bind(self, *args, **kwargs)

            def plan(self, *args, **kwargs):
                arguments = inspect.signature(real_class.plan).bind(self, *args, **kwargs)
                named = dict(arguments.arguments)
                # The decode plan takes its options as **kwargs: each must be
                # one its documentation names.
                for key in named.pop("kwargs", {}):
                    assert ("\n        %s :" % key) in real_class.plan.__doc__, key
                calls.append((real_class.__name__, named, kwargs))

            def run(self, *args, **kwargs):
                inspect.signature(real_class.run).bind(self, *args, **kwargs)
                return torch.zeros_like(args[0])
        return StandIn
    for name in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
                 "BatchPrefillWithRaggedKVCacheWrapper"):
        monkeypatch.setattr(flashinfer, name, stand_in_for(getattr(flashinfer, name)))
    monkeypatch.setattr(baselines, "WORKSPACE_MIB", 1)
    inputs = _small_inputs(pack, kind, mask, score)
    fn, layout, to_bhld = baselines.build_flashinfer(torch, inputs)
    assert tuple(to_bhld(fn()).shape) == tuple(inputs.q.shape)
    ((wrapper, arguments, options),) = calls
    B, Hq, Hkv, Lq, Lkv, D = inputs.shape
    window = baselines.window_of(mask)
    assert options["window_left"] == (window - 1 if window else -1)
    assert options["pos_encoding_mode"] == ("ALIBI" if score == "alibi" else "NONE")
    assert options["logits_soft_cap"] == (SOFTCAP if score == "softcap_tanh" else None)
    if mask == "document":
        assert wrapper == "BatchPrefillWithRaggedKVCacheWrapper" and options["causal"]
        return
    pages = -(-Lkv // 16)
    indptr = arguments.get("indptr", arguments.get("paged_kv_indptr"))
    assert indptr.tolist() == [pages * b for b in range(B + 1)]
    last = arguments.get("last_page_len", arguments.get("paged_kv_last_page_len"))
    assert last.tolist() == [Lkv - (pages - 1) * 16] * B
    if kind == "prefill":
        assert wrapper == "BatchPrefillWithPagedKVCacheWrapper"
        assert arguments["qo_indptr"].tolist() == [Lq * b for b in range(B + 1)]
        assert options["causal"] is True
