"""pagedc as a vLLM attention backend (docs/vllm.md).

vLLM finds the plugin through the ``vllm.general_plugins`` entry point
(python/pyproject.toml), which calls :func:`register`: the backend is then
selectable as ``PAGEDC`` (``--attention-backend PAGEDC``). The mask and score
mods of the model are chosen by configuration, in this order:

1. :func:`set_mods` from Python: an ``.attn`` file or text with mod names, or
   Python mask/score functions (traced by ``pagedc.from_torch``);
2. vLLM's ``--additional-config '{"pagedc": {"mods": "model.attn", "mask":
   "sliding", "score": "capped", "defines": {...}, "params": {...},
   "device": "cpu"}}'`` (device "cpu", or "emu": pagedc's CUDA kernels on the
   SIMT emulator);
3. the variables ``PAGEDC_VLLM_MODS`` (an ``.attn`` file), ``PAGEDC_VLLM_MASK``,
   ``PAGEDC_VLLM_SCORE``, ``PAGEDC_VLLM_DEVICE``;
4. none of these: the layer's own settings (causal, ``sliding_window``,
   ``logits_soft_cap``, ``alibi_slopes``) as generated ``.attn`` mods.

Importing this package does not import vLLM; :mod:`pagedc.vllm.backend` does.
"""
from __future__ import annotations

from ._config import ModsConfig, clear_mods, current_config, set_mods

BACKEND_NAME = "PAGEDC"
BACKEND_PATH = "pagedc.vllm.backend.PagedcAttentionBackend"

__all__ = ["BACKEND_NAME", "BACKEND_PATH", "ModsConfig", "clear_mods", "current_config",
           "register", "set_mods"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers the backend with
    vLLM's attention backend registry as ``PAGEDC`` (again on every call is
    fine: vLLM calls general plugins once per process, tests may call more)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if BACKEND_NAME in AttentionBackendEnum.__members__:
        register_backend(AttentionBackendEnum[BACKEND_NAME], BACKEND_PATH)
    else:
        register_backend(BACKEND_NAME, BACKEND_PATH)
