"""The vLLM plugin's settings (pagedc.vllm without vLLM): which mods a layer
gets from set_mods, additional_config or PAGEDC_VLLM_* variables, the
generated mods of a layer's own settings, and the errors of bad settings."""
import types

import numpy as np
import pytest

import pagedc
import pagedc.vllm as pagedc_vllm
from conftest import reference_attention
from pagedc.vllm._config import builtin_source


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch):
    for name in ("MODS", "MASK", "SCORE", "DEVICE"):
        monkeypatch.delenv(f"PAGEDC_VLLM_{name}", raising=False)
    pagedc_vllm.clear_mods()
    yield
    pagedc_vllm.clear_mods()


def test_importing_the_plugin_does_not_import_vllm():
    import subprocess
    import sys
    code = "import sys, pagedc.vllm; print('vllm' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("window,cap,alibi,causal", [
    (None, None, False, True), (7, None, False, True), (7, 3.0, True, True),
    (None, 3.0, False, True), (5, None, False, False), (None, None, True, False)])
def test_layer_settings_become_mods_that_match_vllms_semantics(rng, window, cap, alibi,
                                                              causal):
    mods = pagedc.compile(builtin_source(window, cap, alibi, causal))
    hq, d, length = 2, 16, 20
    q, k, v = (rng.standard_normal((1, hq, length, d), dtype=np.float32) for _ in range(3))
    slopes = np.array([0.5, 0.125], dtype=np.float32)
    buffers = {"alibi_slopes": slopes} if alibi else {}
    out = pagedc.flex_attention(q, k, v, mods=mods, buffers=buffers, scale=1.0)

    def mask_fn(b, h, qi, kv):
        keep = (qi >= kv) if causal else np.ones_like(qi - kv, dtype=bool)
        if window:
            keep = keep & ((qi - kv < window) if causal else (np.abs(qi - kv) < window))
        return keep

    def score_fn(s, b, h, qi, kv):
        if cap:
            s = cap * np.tanh(s / cap)
        if alibi:
            s = s + slopes.astype(np.float64)[h] * (kv - qi)
        return s

    expected, _ = reference_attention(q, k, v, mask_fn=mask_fn, score_fn=score_fn, scale=1.0)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


def test_a_layers_sliding_window_bounds_the_keys_each_request_reads():
    # The window is a constant of the generated mods, so BatchAttention's
    # plan() starts each request at its window (with soft cap and ALiBi,
    # whose params and buffer are the score's); without a window, causal
    # reads from key 0.
    qsl = np.array([0, 1, 4, 4], dtype=np.int32)
    seq_lens = np.array([5000, 700, 30], dtype=np.int32)
    table = np.arange(3 * 320, dtype=np.int32).reshape(3, 320) % 900
    for window, begins in ((256, [4736, 384, 0]), (None, [0, 0, 0])):
        mods = pagedc.compile(builtin_source(window, 3.0, True, True))
        attn = pagedc.BatchAttention(mods, 4, 2, 64, 16, max_num_seqs=4, max_num_tokens=16,
                                     max_blocks_per_seq=320)
        attn.plan(qsl, seq_lens, table)
        assert [attn.key_range(b) for b in range(3)] == \
            [(begin, int(s)) for begin, s in zip(begins, seq_lens)], window


def test_set_mods_wins_over_additional_config_and_variables(monkeypatch, tmp_path):
    path = tmp_path / "m.attn"
    path.write_text("mask causal(b, h, q, kv) = q >= kv\n")
    monkeypatch.setenv("PAGEDC_VLLM_MODS", str(path))
    assert pagedc_vllm.current_config().origin == "PAGEDC_VLLM_* variables"
    vllm_config = types.SimpleNamespace(additional_config={"pagedc": {"mods": str(path)}})
    assert pagedc_vllm.current_config(vllm_config).origin == 'additional_config["pagedc"]'
    pagedc_vllm.set_mods(mask_mod=lambda b, h, q, kv: q >= kv)
    assert pagedc_vllm.current_config(vllm_config).origin == "set_mods"
    pagedc_vllm.clear_mods()
    monkeypatch.delenv("PAGEDC_VLLM_MODS")
    config = pagedc_vllm.current_config()
    assert config.origin == "default" and not config.has_mods and config.device == "cpu"


def test_bad_settings_are_errors_that_list_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="valid keys"):
        pagedc_vllm.current_config(types.SimpleNamespace(additional_config={"pagedc": {
            "mask_name": "x"}}))
    with pytest.raises(ValueError, match="valid devices: cpu, emu"):
        pagedc_vllm.set_mods("mask c(b, h, q, kv) = q >= kv", device="cuda:0")
    with pytest.raises(ValueError, match="not both"):
        pagedc_vllm.set_mods("mask c(b, h, q, kv) = q >= kv", mask_mod=lambda b, h, q, kv: q)
    with pytest.raises(ValueError, match="nothing to set"):
        pagedc_vllm.set_mods()
    with pytest.raises(pagedc.CompileError):  # compiled at once, not at the first layer
        pagedc_vllm.set_mods("mask c(b, h, q, kv) = q >= nope")
    assert pagedc_vllm.current_config().origin == "default"
