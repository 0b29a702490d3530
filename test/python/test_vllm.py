"""The vLLM attention-backend plugin (pagedc.vllm) against the float64
reference, driven through vLLM's own objects: its CommonAttentionMetadata for
mixed prefill/decode steps, its KV-cache spec, its backend registry. The KV
cache is a vLLM layer view [blocks, Hkv, block_size, 2 D] in two of vLLM's
memory layouts, written by the impl's do_kv_cache_update and read in place.
The batch call runs on pagedc's CPU backend, and at the end on pagedc's CUDA
kernels on the SIMT emulator (device "emu"). Needs vLLM:
scripts/vllm-tests.sh installs it in a venv and runs this file."""
import math
import os
import types

import numpy as np
import pytest

vllm = pytest.importorskip(
    "vllm", reason="vLLM is not installed; scripts/vllm-tests.sh installs it in a venv and "
                   "runs these tests")
torch = pytest.importorskip("torch", reason="vLLM's tensors are torch tensors")

import pagedc  # noqa: E402
import pagedc.vllm as pagedc_vllm  # noqa: E402
from conftest import SOURCE_DIR, reference_attention  # noqa: E402
from pagedc.vllm.backend import (FP8_CACHE_DTYPES, PagedcAttentionBackend,  # noqa: E402
                                 PagedcAttentionImpl, PagedcMetadataBuilder)
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402

BLOCK = 16
# (new tokens, keys): decodes, a speculative 3, chunks after a cached context,
# a whole prompt; lengths off the block size.
STEP = [(1, 37), (3, 20), (13, 50), (1, 1), (17, 17), (3, 3), (5, 64), (1, 130)]
PADDING = 3  # padded tokens after the step's own, as under vLLM's CUDA-graph padding


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch):
    for name in ("MODS", "MASK", "SCORE", "DEVICE"):
        monkeypatch.delenv(f"PAGEDC_VLLM_{name}", raising=False)
    pagedc_vllm.clear_mods()
    yield
    pagedc_vllm.clear_mods()


def vllm_config():
    """vLLM's own config with its defaults (no model: its scheduler limits);
    the device is given, as there may be no GPU to detect."""
    from vllm.config import DeviceConfig, VllmConfig
    return VllmConfig(device_config=DeviceConfig(device="cpu"))


def make_kv_cache(num_blocks, hkv, d, dtype, layout):
    """A layer's cache as vLLM allocates it: logical [B, H, N, 2D] with the
    memory order of `layout` (LBHNC: head-major blocks; LBNHC: token-major)."""
    if layout == "LBHNC":
        cache = torch.empty(num_blocks, hkv, BLOCK, 2 * d, dtype=dtype)
    else:
        cache = torch.empty(num_blocks, BLOCK, hkv, 2 * d, dtype=dtype).transpose(1, 2)
    cache.fill_(255 if dtype == torch.uint8 else float("nan"))  # 255: an 8-bit NaN
    return cache


class Step:
    """One mixed step: dense per-request K/V (all keys), a shuffled block
    table, vLLM's CommonAttentionMetadata, packed q/k/v sliced from one qkv
    tensor as vLLM's linear layer leaves them (strided rows)."""

    def __init__(self, rng, hq=6, hkv=2, d=32, dtype=torch.float32, steps=STEP,
                 layout="LBHNC", shared_prefix=0, cache_dtype=None):
        self.hq, self.hkv, self.d, self.dtype, self.steps = hq, hkv, d, dtype, steps
        pages = [-(-s // BLOCK) for _, s in steps]
        shared_pages = shared_prefix // BLOCK
        num_blocks = sum(pages) - shared_pages * (len(steps) - 1) + 3
        order = rng.permutation(num_blocks)
        self.table = np.full((len(steps) + 1, max(pages) + 2), -1, dtype=np.int32)
        used = 0
        for b, count in enumerate(pages):
            for j in range(count):
                if j < shared_pages and b > 0:
                    self.table[b, j] = self.table[0, j]
                else:
                    self.table[b, j] = order[used]
                    used += 1

        def rounded(*shape):
            x = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))
            return x.to(dtype)

        self.k = [rounded(s, hkv, d) for _, s in steps]
        self.v = [rounded(s, hkv, d) for _, s in steps]
        for b in range(1, len(steps)):  # the shared prefix holds the same keys
            self.k[b][:shared_prefix] = self.k[0][:shared_prefix]
            self.v[b][:shared_prefix] = self.v[0][:shared_prefix]
        self.kv_cache = make_kv_cache(num_blocks, hkv, d, cache_dtype or dtype, layout)
        news = [n for n, _ in steps]
        self.qsl = np.cumsum([0] + news).astype(np.int32)
        self.tokens = int(self.qsl[-1])
        padded = self.tokens + PADDING
        qkv = rounded(padded, (hq + 2 * hkv) * d)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        self.q = q.view(padded, hq, d)
        self.key = k.view(padded, hkv, d)
        self.value = v.view(padded, hkv, d)
        for b, (n, s) in enumerate(steps):  # the new tokens' K/V are the step's
            rows = slice(int(self.qsl[b]), int(self.qsl[b + 1]))
            self.key[rows] = self.k[b][s - n:]
            self.value[rows] = self.v[b][s - n:]
        slots = [self.slot(b, pos) for b, (n, s) in enumerate(steps) for pos in range(s - n, s)]
        self.slot_mapping = torch.tensor(slots + [-1] * PADDING, dtype=torch.int64)

    def slot(self, b, pos):
        return int(self.table[b, pos // BLOCK]) * BLOCK + pos % BLOCK

    def metadata(self):
        """vLLM's own per-step metadata object."""
        seq_lens = torch.tensor([s for _, s in self.steps], dtype=torch.int32)
        qsl = torch.from_numpy(self.qsl.copy())
        news = [n for n, _ in self.steps]
        return CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq_lens,
            num_reqs=len(self.steps), num_actual_tokens=self.tokens + PADDING,
            max_query_len=max(news), max_seq_len=int(seq_lens.max()),
            block_table_tensor=torch.from_numpy(self.table.copy()),
            slot_mapping=self.slot_mapping, causal=True)

    def spec(self):
        return FullAttentionSpec(block_size=BLOCK, num_kv_heads=self.hkv, head_size=self.d,
                                 dtype=self.dtype)

    def write_context(self, impl):
        """The keys of earlier steps, written as vLLM did then (by slot)."""
        slots, keys, values = [], [], []
        for b, (n, s) in enumerate(self.steps):
            slots += [self.slot(b, pos) for pos in range(s - n)]
            keys.append(self.k[b][:s - n])
            values.append(self.v[b][:s - n])
        impl.do_kv_cache_update(None, torch.cat(keys), torch.cat(values), self.kv_cache,
                                torch.tensor(slots, dtype=torch.int64))

    def reference(self, scale, mask_fn=None, score_fn=None, sinks=None):
        out = np.zeros((self.tokens, self.hq, self.d))
        for b, (n, s) in enumerate(self.steps):
            rows = slice(int(self.qsl[b]), int(self.qsl[b + 1]))
            q = self.q[rows].double().numpy().transpose(1, 0, 2)[None]
            k = self.k[b].double().numpy().transpose(1, 0, 2)[None]
            v = self.v[b].double().numpy().transpose(1, 0, 2)[None]
            fn = None if mask_fn is None else (lambda _b, h, qi, kv, b=b: mask_fn(b, h, qi, kv))
            o, _ = reference_attention(q, k, v, mask_fn=fn, score_fn=score_fn, scale=scale,
                                       q_offset=s - n, sinks=sinks)
            out[rows] = o[0].transpose(1, 0, 2)
        return out


def causal(b, h, q, kv):
    return q >= kv


def run_step(step, impl, common_prefix_len=0, builder=None):
    """vLLM's order within a step: build the metadata once, then per layer
    write the new K/V (do_kv_cache_update) and call forward."""
    builder = builder or PagedcMetadataBuilder(step.spec(), ["model.layers.0.attn"],
                                               vllm_config(), torch.device("cpu"))
    metadata = builder.build(common_prefix_len, step.metadata())
    impl.do_kv_cache_update(None, step.key, step.value, step.kv_cache, step.slot_mapping)
    output = torch.full((step.tokens + PADDING, step.hq, step.d), 7.0, dtype=step.dtype)
    result = impl.forward(None, step.q, step.key, step.value, step.kv_cache, metadata, output)
    assert result is output
    assert torch.all(output[step.tokens:] == 7.0), "padding rows were written"
    return output[:step.tokens].double().numpy()


def tolerance(dtype):
    return dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def make_impl(step, scale, **kwargs):
    return PagedcAttentionImpl(num_heads=step.hq, head_size=step.d, scale=scale,
                               num_kv_heads=step.hkv, alibi_slopes=kwargs.pop("alibi", None),
                               sliding_window=kwargs.pop("sliding_window", None),
                               kv_cache_dtype=kwargs.pop("kv_cache_dtype", "auto"), **kwargs)


def test_register_adds_the_backend_to_vllms_registry():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    pagedc_vllm.register()
    pagedc_vllm.register()  # again: an override of the same member, no error
    assert AttentionBackendEnum["PAGEDC"].get_class() is PagedcAttentionBackend
    assert PagedcAttentionBackend.get_name() == "PAGEDC"
    # What --attention-backend PAGEDC / LLM(attention_backend="PAGEDC") becomes.
    from vllm.config import AttentionConfig
    assert AttentionConfig(backend="PAGEDC").backend.get_class() is PagedcAttentionBackend


def test_vllms_plugin_loader_finds_and_calls_register(tmp_path, monkeypatch):
    # The entry point as `pip install ./python` records it (from
    # pyproject.toml), found by vLLM's own loader through importlib.metadata.
    import sys
    import tomllib
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    with open(os.path.join(SOURCE_DIR, "python", "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    group = project["entry-points"][DEFAULT_PLUGINS_GROUP]
    info = tmp_path / f"pagedc-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pagedc\n"
                                   f"Version: {project['version']}\n")
    (info / "entry_points.txt").write_text(
        f"[{DEFAULT_PLUGINS_GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in group.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
    assert plugins.get("pagedc") is pagedc_vllm.register, sorted(plugins)
    if "PAGEDC" in AttentionBackendEnum.__members__:
        AttentionBackendEnum["PAGEDC"].clear_override()
    plugins["pagedc"]()
    assert AttentionBackendEnum["PAGEDC"].is_overridden()
    assert AttentionBackendEnum["PAGEDC"].get_class() is PagedcAttentionBackend
    assert "pagedc.vllm" in sys.modules


def test_declared_support_is_what_runs():
    backend = PagedcAttentionBackend
    assert backend.supports_dtype(torch.float32) and backend.supports_dtype(torch.bfloat16)
    assert not backend.supports_dtype(torch.float16)
    assert backend.supports_kv_cache_dtype("fp8") and backend.supports_kv_cache_dtype("fp8_e5m2")
    assert not backend.supports_kv_cache_dtype("int8_per_token_head")
    assert backend.get_supported_head_sizes() == []  # the CPU backend: any head size
    assert not backend.supports_device_cpu_query_lens_mismatch()

    def reasons(dtype, **changes):
        settings = dict(head_size=80, dtype=dtype, kv_cache_dtype="auto", block_size=BLOCK,
                        use_mla=False, has_sink=False, use_sparse=False, use_mm_prefix=False,
                        use_per_head_quant_scales=False, device_capability=None,
                        attn_type="decoder", has_sliding_window=True)
        settings.update(changes)
        return backend.validate_configuration(**settings)
    assert reasons(torch.bfloat16) == [] and reasons(torch.float32) == []
    assert reasons(torch.float16) == ["dtype not supported"]
    assert reasons(torch.bfloat16, has_sink=True) == []  # the CPU backend computes them
    assert reasons(torch.bfloat16, use_mla=True) == ["MLA not supported"]
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32,
                             dtype=torch.float32)
    assert PagedcMetadataBuilder.get_cudagraph_support(vllm_config(), spec) == \
        AttentionCGSupport.NEVER
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        PagedcAttentionImpl(4, 32, 0.1, 2, None, None, "nvfp4")
    with pytest.raises(NotImplementedError, match="attention type"):
        PagedcAttentionImpl(4, 32, 0.1, 2, None, None, "auto", attn_type="encoder_only")


@pytest.mark.parametrize("layout", ["LBHNC", "LBNHC"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_mixed_step_matches_reference(rng, layout, dtype):
    step = Step(rng, dtype=dtype, layout=layout)
    scale = 1 / math.sqrt(step.d)
    impl = make_impl(step, scale)
    step.write_context(impl)
    out = run_step(step, impl)
    np.testing.assert_allclose(out, step.reference(scale, causal), **tolerance(dtype))


def run_fp8_step(step, impl, torch_type, k_scale=0.5, v_scale=0.25):
    """Writes the step's context and new K/V into step's uint8 cache through
    do_kv_cache_update with the layer's scales, runs forward, and turns
    step's K/V into the values the codes stand for (the reference's input).
    Scales are powers of two, so those values are exact."""
    layer = types.SimpleNamespace(_k_scale_float=k_scale, _v_scale_float=v_scale)
    impl.do_kv_cache_update(layer, step.key, step.value, step.kv_cache, step.slot_mapping)
    context = [(b, pos) for b, (n, s) in enumerate(step.steps) for pos in range(s - n)]
    impl.do_kv_cache_update(layer, torch.stack([step.k[b][p] for b, p in context]),
                            torch.stack([step.v[b][p] for b, p in context]), step.kv_cache,
                            torch.tensor([step.slot(b, p) for b, p in context]))
    builder = PagedcMetadataBuilder(step.spec(), ["l"], vllm_config(), torch.device("cpu"))
    metadata = builder.build(0, step.metadata())
    output = torch.full((step.tokens + PADDING, step.hq, step.d), 7.0, dtype=step.dtype)
    impl.forward(layer, step.q, step.key, step.value, step.kv_cache, metadata, output)
    assert torch.all(output[step.tokens:] == 7.0), "padding rows were written"

    def dequantized(x, scale):
        return ((x.float() / scale).to(torch_type).float() * scale).to(x.dtype)
    step.k = [dequantized(k, k_scale) for k in step.k]
    step.v = [dequantized(v, v_scale) for v in step.v]
    return output[:step.tokens].double().numpy()


@pytest.mark.parametrize("cache_dtype,torch_type", [("fp8", torch.float8_e4m3fn),
                                                     ("fp8_e5m2", torch.float8_e5m2)])
def test_fp8_cache_written_and_read_with_the_layers_scales(rng, cache_dtype, torch_type):
    # vLLM's FP8 cache is uint8; a code c means c * scale.
    step = Step(rng, layout="LBNHC", cache_dtype=torch.uint8)
    scale = 1 / math.sqrt(step.d)
    impl = make_impl(step, scale, kv_cache_dtype=cache_dtype)
    out = run_fp8_step(step, impl, torch_type)
    np.testing.assert_allclose(out, step.reference(scale, causal), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("cache_dtype,torch_type,largest", [
    ("fp8", torch.float8_e4m3fn, 448.0), ("fp8_e5m2", torch.float8_e5m2, 57344.0)])
def test_fp8_cache_writes_saturate_as_vllms_kernels_do(cache_dtype, torch_type, largest):
    impl = PagedcAttentionImpl(2, 16, 0.25, 1, None, None, cache_dtype)
    cache = make_kv_cache(2, 1, 16, torch.uint8, "LBHNC")
    layer = types.SimpleNamespace(_k_scale_float=0.5, _v_scale_float=1.0)
    big = torch.full((1, 1, 16), 1e6)
    impl.do_kv_cache_update(layer, big, -big, cache, torch.tensor([BLOCK + 3]))
    codes = cache[1, 0, 3].view(torch_type).float()
    assert torch.all(codes[:16] == largest) and torch.all(codes[16:] == -largest)


def test_kv_cache_update_writes_in_place_at_the_slots(rng):
    step = Step(rng)
    impl = make_impl(step, 0.1)
    before = step.kv_cache.clone()
    storage = step.kv_cache.data_ptr()
    impl.do_kv_cache_update(None, step.key, step.value, step.kv_cache, step.slot_mapping)
    assert step.kv_cache.data_ptr() == storage
    nhd = step.kv_cache.transpose(1, 2)
    written = torch.zeros(nhd.shape[:2], dtype=torch.bool)
    for row, slot in enumerate(step.slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, BLOCK)
        written[block, offset] = True
        assert torch.equal(nhd[block, offset, :, :step.d], step.key[row])
        assert torch.equal(nhd[block, offset, :, step.d:], step.value[row])
    untouched = step.kv_cache.transpose(1, 2)[~written]
    assert torch.equal(untouched.isnan(), before.transpose(1, 2)[~written].isnan())


def test_layer_sliding_window_and_soft_cap(rng):
    step = Step(rng)
    scale, window, cap = 1.0, 9, 2.5  # scale 1 so that the cap bites
    impl = make_impl(step, scale, sliding_window=window, logits_soft_cap=cap)
    step.write_context(impl)
    out = run_step(step, impl)
    expected = step.reference(scale, lambda b, h, q, kv: (q >= kv) & (q - kv < window),
                              lambda s, b, h, q, kv: cap * np.tanh(s / cap))
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)
    # The same step without the window differs: the check above can fail.
    assert not np.allclose(out, step.reference(scale, causal,
                                               lambda s, b, h, q, kv: cap * np.tanh(s / cap)),
                           atol=1e-3)


def test_layer_alibi_slopes(rng):
    step = Step(rng)
    scale = 1 / math.sqrt(step.d)
    slopes = np.array([2.0 ** -(i + 1) for i in range(step.hq)], dtype=np.float32)
    impl = make_impl(step, scale, alibi=slopes.tolist())
    step.write_context(impl)
    out = run_step(step, impl)
    expected = step.reference(scale, causal,
                              lambda s, b, h, q, kv: s + slopes.astype(np.float64)[h] * (kv - q))
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


MODS = """
const WINDOW = 11
param softcap: f32 = 4.0
mask sliding(b, h, q, kv) = (q >= kv) & (q - kv <= WINDOW)
mask causal(b, h, q, kv) = q >= kv
score capped(s, b, h, q, kv) = softcap * tanh(s / softcap)
"""


def sliding_capped_reference(step, scale, window=11, cap=4.0):
    return step.reference(scale, lambda b, h, q, kv: (q >= kv) & (q - kv <= window),
                          lambda s, b, h, q, kv: cap * np.tanh(s / cap))


def test_mods_from_an_attn_file_by_set_mods(rng, tmp_path):
    path = tmp_path / "model.attn"
    path.write_text(MODS)
    pagedc_vllm.set_mods(str(path), mask="sliding", score="capped", params={"softcap": 3.0})
    step = Step(rng)
    impl = make_impl(step, 1.0)
    step.write_context(impl)
    out = run_step(step, impl)
    np.testing.assert_allclose(out, sliding_capped_reference(step, 1.0, cap=3.0), atol=2e-5,
                               rtol=2e-5)


def test_mods_from_vllms_additional_config(rng, tmp_path):
    path = tmp_path / "model.attn"
    path.write_text(MODS)
    config = vllm_config()
    config.additional_config = {"pagedc": {"mods": str(path), "mask": "sliding",
                                           "score": "capped", "defines": {"WINDOW": 5}}}
    from vllm.config import set_current_vllm_config
    step = Step(rng)
    with set_current_vllm_config(config):
        impl = make_impl(step, 1.0)
    assert impl.config.origin == 'additional_config["pagedc"]'
    step.write_context(impl)
    out = run_step(step, impl)
    np.testing.assert_allclose(out, sliding_capped_reference(step, 1.0, window=5), atol=2e-5,
                               rtol=2e-5)
    config.additional_config = {"pagedc": {"mod": "x.attn"}}
    with set_current_vllm_config(config), pytest.raises(ValueError, match="valid keys"):
        make_impl(step, 1.0)


def test_mods_from_environment_variables(rng, tmp_path, monkeypatch):
    path = tmp_path / "model.attn"
    path.write_text(MODS)
    monkeypatch.setenv("PAGEDC_VLLM_MODS", str(path))
    monkeypatch.setenv("PAGEDC_VLLM_MASK", "sliding")
    monkeypatch.setenv("PAGEDC_VLLM_SCORE", "capped")
    step = Step(rng)
    impl = make_impl(step, 1.0)
    step.write_context(impl)
    np.testing.assert_allclose(run_step(step, impl), sliding_capped_reference(step, 1.0),
                               atol=2e-5, rtol=2e-5)
    monkeypatch.setenv("PAGEDC_VLLM_DEVICE", "gpu7")
    with pytest.raises(ValueError, match="valid devices"):
        make_impl(step, 1.0)


def test_mods_from_python_functions_see_request_and_position(rng):
    # A per-request prefix-LM: request b's first prefix[b] keys are visible to
    # every query; b is the request's index in the step.
    prefix = torch.tensor([0, 5, 40, 0, 9, 2, 60, 100], dtype=torch.int32)

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < prefix[b]) | (q_idx >= kv_idx)

    def bias(score, b, h, q_idx, kv_idx):
        return score - 0.25 * h

    pagedc_vllm.set_mods(mask_mod=prefix_lm, score_mod=bias)
    step = Step(rng)
    scale = 1 / math.sqrt(step.d)
    impl = make_impl(step, scale)
    step.write_context(impl)
    out = run_step(step, impl)
    p = prefix.numpy()
    expected = step.reference(scale, lambda b, h, q, kv: (kv < p[b]) | (q >= kv),
                              lambda s, b, h, q, kv: s - 0.25 * h)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


def test_common_prefix_cascade_merges_to_the_whole(rng):
    # Every request shares its first 32 tokens (2 blocks) with request 0, as
    # prefix caching leaves them; the build gets common_prefix_len=32.
    steps = [(1, 40), (3, 35), (13, 50), (1, 33), (5, 64)]
    step = Step(rng, steps=steps, shared_prefix=2 * BLOCK)
    scale = 1 / math.sqrt(step.d)
    impl = make_impl(step, scale)
    step.write_context(impl)
    out = run_step(step, impl, common_prefix_len=2 * BLOCK)
    assert impl._engine.cascade and impl._engine.prefix is not None
    np.testing.assert_allclose(out, step.reference(scale, causal), atol=2e-5, rtol=2e-5)


def gpt_oss_sinks(step, rng):
    """A layer's sinks as gpt-oss holds them (a bf16 parameter [Hq]) and
    their values: near the rows' lse, above every score, far below, none."""
    values = [float(rng.uniform(0.5, 3.0)), 20.0, -30.0, float("-inf"),
              float(rng.uniform(-1.0, 1.0)), 4.0][:step.hq]
    return torch.nn.Parameter(torch.empty(step.hq, dtype=torch.bfloat16),
                              requires_grad=False), values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_gpt_oss_sinks_match_reference(rng, dtype):
    step = Step(rng, dtype=dtype)
    scale = 1 / math.sqrt(step.d)
    sinks, values = gpt_oss_sinks(step, rng)
    impl = make_impl(step, scale, sinks=sinks)
    # vLLM loads the weights after the impl is made: the values are read at
    # forward, not copied at construction.
    with torch.no_grad():
        sinks.copy_(torch.tensor(values))
    step.write_context(impl)
    out = run_step(step, impl)
    rounded = sinks.float().numpy()
    np.testing.assert_allclose(out, step.reference(scale, causal, sinks=rounded),
                               **tolerance(dtype))
    # Without them the step differs: the check above can fail.
    assert not np.allclose(out, step.reference(scale, causal), atol=1e-2)


def run_sinks_with_a_common_prefix(rng, **step_args):
    """Runs a step whose requests share their first 2 blocks, with gpt-oss's
    sinks; returns the output, the step, the impl, the scale and the sinks'
    f32 values (for the reference)."""
    steps = [(1, 40), (3, 35), (13, 50), (1, 33), (5, 64)][:step_args.pop("requests", 5)]
    step = Step(rng, steps=steps, shared_prefix=2 * BLOCK, **step_args)
    scale = 1 / math.sqrt(step.d)
    sinks, values = gpt_oss_sinks(step, rng)
    with torch.no_grad():
        sinks.copy_(torch.tensor(values))
    impl = make_impl(step, scale, sinks=sinks)
    step.write_context(impl)
    out = run_step(step, impl, common_prefix_len=2 * BLOCK)
    assert impl._engine.cascade
    return out, step, impl, scale, sinks.float().numpy()


def test_gpt_oss_sinks_with_a_common_prefix(rng):
    out, step, _, scale, sinks = run_sinks_with_a_common_prefix(rng)
    np.testing.assert_allclose(out, step.reference(scale, causal, sinks=sinks),
                               atol=2e-5, rtol=2e-5)


def test_sinks_of_the_wrong_shape_are_refused(rng):
    step = Step(rng)
    with pytest.raises(ValueError, match=r"sinks must be \[num_heads\] = \[6\]"):
        make_impl(step, 0.1, sinks=torch.zeros(step.hq + 1))


def test_one_plan_per_step_for_all_layers(rng):
    step = Step(rng)
    scale = 1 / math.sqrt(step.d)
    layers = [make_impl(step, scale) for _ in range(3)]
    step.write_context(layers[0])
    builder = PagedcMetadataBuilder(step.spec(), ["a", "b", "c"], vllm_config(),
                                    torch.device("cpu"))
    first = run_step(step, layers[0], builder=builder)
    engine = layers[0]._engine
    metadata = builder.build(0, step.metadata())  # the next step: the builder plans it
    assert engine.step == metadata.step
    calls = []
    original = engine.main.plan
    engine.main.plan = lambda *a, **k: calls.append(1) or original(*a, **k)
    for impl in layers:
        output = torch.zeros(step.tokens + PADDING, step.hq, step.d)
        impl.forward(None, step.q, step.key, step.value, step.kv_cache, metadata, output)
        assert impl._engine is engine
        np.testing.assert_allclose(output[:step.tokens].numpy(), first, atol=1e-6)
    assert calls == []


def test_profiling_run_without_metadata_gives_zeros(rng):
    step = Step(rng)
    impl = make_impl(step, 0.1)
    output = torch.ones(4, step.hq, step.d)
    impl.forward(None, step.q[:4], step.key[:4], step.value[:4], step.kv_cache, None, output)
    assert torch.all(output == 0)


# pagedc's CUDA kernels on the SIMT emulator (device "emu"): vLLM's host
# tensors are staged into emulated device memory. Small shapes: every kernel
# runs with the emulator's checkers on.
EMU_STEP = [(1, 37), (3, 20), (13, 50), (1, 130)]


def emulator_or_skip():
    if not pagedc.cuda_codegen_available():
        pytest.skip("this build has no CUDA code generation (compile(..., cuda=True))")
    try:
        pagedc.empty((1,), "f32", device="emu")
    except ValueError as error:
        if "was not found" not in str(error):
            raise
        pytest.skip(f"the SIMT emulator's driver is not available: {error}")


def test_emulated_device_runs_the_cuda_kernels_on_a_mixed_step(rng, tmp_path):
    emulator_or_skip()
    path = tmp_path / "model.attn"
    path.write_text(MODS)
    pagedc_vllm.set_mods(str(path), mask="sliding", score="capped", device="emu")
    assert PagedcAttentionBackend.supports_dtype(torch.bfloat16)
    assert not PagedcAttentionBackend.supports_dtype(torch.float32)
    assert PagedcAttentionBackend.get_supported_head_sizes() == list(range(32, 257, 16))
    step = Step(rng, hq=4, hkv=2, d=64, dtype=torch.bfloat16, steps=EMU_STEP, layout="LBNHC")
    impl = make_impl(step, 1.0)
    step.write_context(impl)
    out = run_step(step, impl)
    assert impl._engine.on_cuda and impl._engine.main.device == "cuda:0"
    np.testing.assert_allclose(out, sliding_capped_reference(step, 1.0), atol=2e-2, rtol=2e-2)


def test_emulated_device_with_the_layers_own_window(rng, monkeypatch):
    emulator_or_skip()
    monkeypatch.setenv("PAGEDC_VLLM_DEVICE", "emu")
    step = Step(rng, hq=4, hkv=2, d=64, dtype=torch.bfloat16, steps=EMU_STEP)
    scale = 1 / math.sqrt(step.d)
    impl = make_impl(step, scale, sliding_window=9)
    step.write_context(impl)
    out = run_step(step, impl)
    assert impl._engine.on_cuda
    np.testing.assert_allclose(
        out, step.reference(scale, lambda b, h, q, kv: (q >= kv) & (q - kv < 9)),
        atol=2e-2, rtol=2e-2)


def test_emulated_device_with_python_mods_and_their_captured_tensor(rng):
    emulator_or_skip()
    prefix = torch.tensor([0, 7, 40, 2], dtype=torch.int32)

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < prefix[b]) | (q_idx >= kv_idx)

    pagedc_vllm.set_mods(mask_mod=prefix_lm, device="emu")
    step = Step(rng, hq=4, hkv=2, d=64, dtype=torch.bfloat16, steps=EMU_STEP)
    scale = 1 / math.sqrt(step.d)
    impl = make_impl(step, scale)
    step.write_context(impl)
    out = run_step(step, impl)
    p = prefix.numpy()
    np.testing.assert_allclose(out, step.reference(scale, lambda b, h, q, kv: (kv < p[b]) |
                                                   (q >= kv)), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("cache_dtype,torch_type,d", [("fp8", torch.float8_e4m3fn, 64),
                                                       ("fp8_e5m2", torch.float8_e5m2, 80)])
def test_emulated_device_reads_fp8_caches(rng, monkeypatch, cache_dtype, torch_type, d):
    emulator_or_skip()
    monkeypatch.setenv("PAGEDC_VLLM_DEVICE", "emu")
    assert PagedcAttentionBackend.supports_kv_cache_dtype(cache_dtype)
    step = Step(rng, hq=4, hkv=2, d=d, dtype=torch.bfloat16, steps=EMU_STEP, layout="LBNHC",
                cache_dtype=torch.uint8)
    scale = 1 / math.sqrt(step.d)
    impl = make_impl(step, scale, kv_cache_dtype=cache_dtype)
    out = run_fp8_step(step, impl, torch_type)
    assert impl._engine.on_cuda and impl._engine.args["kv_dtype"] == FP8_CACHE_DTYPES[
        cache_dtype][0]
    np.testing.assert_allclose(out, step.reference(scale, causal), atol=2e-2, rtol=2e-2)


def test_emulated_device_sinks_and_a_common_prefix(rng, monkeypatch):
    # gpt-oss's sinks and a cascade split on pagedc's CUDA kernels: the two
    # levels run on the device and merge there (merge_state_in_place).
    emulator_or_skip()
    monkeypatch.setenv("PAGEDC_VLLM_DEVICE", "emu")
    assert PagedcAttentionBackend.supports_sink()
    assert 80 in PagedcAttentionBackend.get_supported_head_sizes()
    out, step, impl, scale, sinks = run_sinks_with_a_common_prefix(
        rng, requests=4, hq=4, hkv=2, d=64, dtype=torch.bfloat16)
    assert impl._engine.on_cuda
    np.testing.assert_allclose(out, step.reference(scale, causal, sinks=sinks),
                               atol=2e-2, rtol=2e-2)
    assert not np.allclose(out, step.reference(scale, causal), atol=5e-2)
