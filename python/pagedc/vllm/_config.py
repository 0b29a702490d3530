"""Which mods and device the vLLM backend uses: set_mods() from Python, vLLM's
additional_config["pagedc"], or PAGEDC_VLLM_* variables (mapped here, at the
Python edge), else the layer's own causal / sliding-window / soft-cap / ALiBi
settings turned into .attn mods."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

DEVICES = ("cpu", "emu")
_CONFIG_KEYS = ("mods", "mask", "score", "defines", "params", "buffers", "device", "threads")


@dataclass
class ModsConfig:
    """The plugin's settings. ``source``: an ``.attn`` file path or program
    text; ``mask`` / ``score``: the mod names in it; or ``mask_mod`` /
    ``score_mod``: Python functions (``pagedc.from_torch``). ``buffers`` /
    ``params``: what the mods capture, bound on every call. ``device``: where
    pagedc's batch call runs: "cpu" (the CPU backend, on vLLM's host
    tensors in place) or "emu" (pagedc's CUDA kernels on the SIMT emulator;
    vLLM's host tensors are staged into emulated device memory, a copy per
    call). ``origin`` says where the settings came from."""

    source: Optional[str] = None
    mask: Optional[str] = None
    score: Optional[str] = None
    defines: Mapping[str, Any] = field(default_factory=dict)
    mask_mod: Optional[Callable] = None
    score_mod: Optional[Callable] = None
    buffers: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    threads: int = 0
    origin: str = "default"

    @property
    def has_mods(self) -> bool:
        return self.source is not None or self.mask_mod is not None or \
            self.score_mod is not None

    def key(self):
        """Identifies the compiled mods (layers with equal keys share them)."""
        return (self.source, self.mask, self.score, tuple(sorted(self.defines.items())),
                id(self.mask_mod) if self.mask_mod else None,
                id(self.score_mod) if self.score_mod else None, self.on_cuda)

    @property
    def on_cuda(self) -> bool:
        """Whether the batch call runs pagedc's CUDA kernels (on "emu")."""
        return self.device != "cpu"

    def compile(self):
        """The mods, with CUDA code when the device needs it."""
        import pagedc

        if self.mask_mod is not None or self.score_mod is not None:
            return pagedc.from_torch(mask_mod=self.mask_mod, score_mod=self.score_mod,
                                     cuda=self.on_cuda)
        return pagedc.compile(self.source, mask=self.mask, score=self.score,
                              defines=dict(self.defines), cuda=self.on_cuda)


_override: Optional[ModsConfig] = None


def _check_device(device: str) -> str:
    if str(device) not in DEVICES:
        raise ValueError(f"device: unknown device {device!r}; valid devices: "
                         + ", ".join(DEVICES))
    return str(device)


def set_mods(source=None, mask: Optional[str] = None, score: Optional[str] = None, *,
             mask_mod: Optional[Callable] = None, score_mod: Optional[Callable] = None,
             defines: Optional[Mapping[str, Any]] = None,
             buffers: Optional[Mapping[str, Any]] = None,
             params: Optional[Mapping[str, Any]] = None, device: str = "cpu",
             threads: int = 0) -> ModsConfig:
    """Chooses the model's mods for every layer the backend runs: ``source``
    (an ``.attn`` file or text) with ``mask`` / ``score`` names, or Python
    ``mask_mod`` / ``score_mod`` functions. Compiles them now, so that an
    error shows here; takes effect for layers built afterwards. Returns the
    settings."""
    global _override
    if source is not None and (mask_mod is not None or score_mod is not None):
        raise ValueError("set_mods: give either an .attn source or Python functions, not both")
    if source is None and mask_mod is None and score_mod is None:
        raise ValueError("set_mods: nothing to set; give an .attn source (with mask=/score= "
                         "names) or mask_mod=/score_mod= functions (clear_mods() resets)")
    config = ModsConfig(source=None if source is None else os.fspath(source), mask=mask,
                        score=score, defines=dict(defines or {}), mask_mod=mask_mod,
                        score_mod=score_mod, buffers=dict(buffers or {}),
                        params=dict(params or {}), device=_check_device(device),
                        threads=int(threads), origin="set_mods")
    config.compile()
    _override = config
    return config


def clear_mods() -> None:
    """Forgets set_mods(): the next layers use the other sources again."""
    global _override
    _override = None


def _from_mapping(values: Mapping[str, Any], origin: str) -> ModsConfig:
    unknown = sorted(set(values) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{origin}: unknown key(s) {', '.join(unknown)}; valid keys: "
                         + ", ".join(_CONFIG_KEYS))
    return ModsConfig(source=values.get("mods"), mask=values.get("mask"),
                      score=values.get("score"), defines=dict(values.get("defines") or {}),
                      buffers=dict(values.get("buffers") or {}),
                      params=dict(values.get("params") or {}),
                      device=_check_device(values.get("device", "cpu")),
                      threads=int(values.get("threads", 0)), origin=origin)


def current_config(vllm_config=None) -> ModsConfig:
    """The settings in force: set_mods(), else ``vllm_config.additional_config
    ["pagedc"]``, else the PAGEDC_VLLM_* variables, else the defaults (the
    layer's own settings as mods, on the CPU)."""
    if _override is not None:
        return _override
    additional = getattr(vllm_config, "additional_config", None) or {}
    if isinstance(additional, Mapping) and "pagedc" in additional:
        return _from_mapping(additional["pagedc"], 'additional_config["pagedc"]')
    env = {key: os.environ.get(f"PAGEDC_VLLM_{key.upper()}")
           for key in ("mods", "mask", "score", "device")}
    env = {key: value for key, value in env.items() if value}
    if env:
        return _from_mapping(env, "PAGEDC_VLLM_* variables")
    return ModsConfig()


def builtin_source(sliding_window: Optional[int], logits_soft_cap: Optional[float],
                   alibi: bool, causal: bool = True) -> str:
    """The .attn program of a vLLM layer's own settings: causal (or not),
    vLLM's sliding window (a query sees the ``sliding_window`` keys up to and
    including its own position), ``softcap * tanh(s / softcap)`` and ALiBi
    ``s + slopes[h] * (kv - q)`` (in that order, as vLLM's FlashAttention
    applies them)."""
    lines = []
    keep = ["(q >= kv)"] if causal else []
    if sliding_window:
        lines.append(f"const WINDOW = {int(sliding_window)}")
        keep.append("(q - kv < WINDOW)" if causal else "(abs(q - kv) < WINDOW)")
    lines.append("mask layer_mask(b, h, q, kv) = " + (" & ".join(keep) if keep else "true"))
    score = "s"
    if logits_soft_cap:
        lines.append(f"param softcap: f32 = {float(logits_soft_cap)!r}")
        score = "softcap * tanh(s / softcap)"
    if alibi:
        lines.append("buffer alibi_slopes: f32[H]")
        score = f"{score} + alibi_slopes[h] * (kv - q)"
    if score != "s":
        lines.append(f"score layer_score(s, b, h, q, kv) = {score}")
    return "\n".join(lines) + "\n"
