"""The vLLM v1 attention backend over pagedc's serving batch call
(docs/vllm.md): PagedcAttentionBackend, its metadata builder and its impl.

vLLM hands every layer its slice of the KV cache as a 4-D view
``[num_blocks, Hkv, block_size, D + Dv]`` (logical axes; the memory order is
one of vLLM's KVCacheLayouts). ``transpose(1, 2)`` and a split of the last axis
give the K and V caches as ``[num_blocks, block_size, Hkv, D]`` strided views,
pagedc's "NHD" layout, which BatchAttention reads in place through the
strides: no copy of the cache is made, whatever layout vLLM chose.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np
import torch

import pagedc
from vllm.logger import init_logger
from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionImpl,
                                       AttentionMetadataBuilder, AttentionType,
                                       CommonAttentionMetadata)

from ._config import builtin_source, current_config

logger = init_logger(__name__)

#: Head sizes of pagedc's CUDA kernels (each multiple of 16 from 32 to 256);
#: the CPU backend takes any.
CUDA_HEAD_SIZES = list(range(32, 257, 16))

#: vLLM's 8-bit KV cache dtypes (uint8 caches) -> pagedc's kv_dtype, torch's
#: type and its largest finite value (writes saturate, as vLLM's kernels do).
FP8_CACHE_DTYPES = {"fp8": ("float8_e4m3fn", torch.float8_e4m3fn, 448.0),
                    "fp8_e4m3": ("float8_e4m3fn", torch.float8_e4m3fn, 448.0),
                    "fp8_e5m2": ("float8_e5m2", torch.float8_e5m2, 57344.0)}


class PagedcAttentionBackend(AttentionBackend):
    """pagedc's serving batch call as a vLLM attention backend."""

    # The CPU backend computes in f32 and reads f32 or bf16 (no f16).
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32, torch.bfloat16]
    # FP8: one scale per layer (vLLM's k_scale / v_scale); a code c means
    # c * scale.
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "bfloat16", "fp8", "fp8_e4m3",
                                                 "fp8_e5m2"]
    # vLLM writes the step's K/V through do_kv_cache_update() before forward().
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return "PAGEDC"

    @staticmethod
    def get_impl_cls() -> type["PagedcAttentionImpl"]:
        return PagedcAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["PagedcMetadataBuilder"]:
        return PagedcMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(CUDA_HEAD_SIZES) if current_config().on_cuda else []

    @classmethod
    def supports_dtype(cls, dtype: torch.dtype) -> bool:
        # pagedc's CUDA kernels compute in bf16 or f16.
        if current_config().on_cuda:
            return dtype in (torch.bfloat16, torch.float16)
        return dtype in cls.supported_dtypes

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        # gpt-oss's per-head sinks: both backends take them.
        return True

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # The plan is made from the host query_start_loc.
        return False

    @classmethod
    def supported_kv_cache_layouts(cls):
        # Read through strides: every layout vLLM can allocate.
        return None


@dataclass
class PagedcAttentionMetadata:
    """One step's metadata in pagedc's terms: host int32 arrays that
    ``BatchAttention.plan`` takes as they are."""

    num_actual_tokens: int
    num_reqs: int
    query_start_loc: np.ndarray  # [B + 1] int32, host
    seq_lens: np.ndarray  # [B] int32, host: keys per request, new tokens included
    block_table: np.ndarray  # [B, max_blocks] int32, host
    slot_mapping: torch.Tensor  # [T]: where each new token's K/V goes (-1: none)
    causal: bool
    common_prefix_len: int  # tokens every request shares (cascade); 0: none
    step: int  # a serial number: plans are made once per step per engine


_STEPS = itertools.count(1)


def _host_int32(tensor: torch.Tensor) -> np.ndarray:
    """A host int32 NumPy array of a torch tensor, sharing memory when the
    tensor already is one (vLLM's CPU metadata)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype != torch.int32:
        tensor = tensor.to(torch.int32)
    return tensor.numpy()


class PagedcMetadataBuilder(AttentionMetadataBuilder[PagedcAttentionMetadata]):
    """Turns vLLM's CommonAttentionMetadata into pagedc's plan: the host
    arrays, then ``plan()`` of every pagedc engine serving this KV-cache group
    (once per step for all its layers; an engine first used by a layer later
    in the step plans there)."""

    # The batch call runs on the host with host metadata: nothing to capture.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    # Any order of decodes and prefills is fine.
    reorder_batch_threshold = None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = int(kv_cache_spec.block_size)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> PagedcAttentionMetadata:
        common = common_attn_metadata
        num_reqs = int(common.num_reqs)
        qsl = _host_int32(common.query_start_loc_cpu[:num_reqs + 1])
        causal = common.causal
        if isinstance(causal, torch.Tensor):
            if not bool(causal[:num_reqs].all()):
                raise NotImplementedError("pagedc backend: per-request non-causal attention "
                                          "is not supported (use mods for it)")
            causal = True
        metadata = PagedcAttentionMetadata(
            num_actual_tokens=int(common.num_actual_tokens), num_reqs=num_reqs,
            query_start_loc=qsl, seq_lens=_host_int32(common.seq_lens[:num_reqs]),
            block_table=_host_int32(common.block_table_tensor[:num_reqs]),
            slot_mapping=common.slot_mapping, causal=bool(causal),
            common_prefix_len=int(common_prefix_len or 0), step=next(_STEPS))
        spec = self.kv_cache_spec
        for engine in _engines_matching(self.block_size, int(spec.num_kv_heads),
                                        int(spec.head_size)):
            engine.plan(metadata)
        return metadata


def _split_kv_cache(kv_cache: torch.Tensor, head_size: int):
    """vLLM's [blocks, Hkv, block_size, D + Dv] layer view -> K and V as
    [blocks, block_size, Hkv, D] / [..., Dv] views (pagedc's NHD)."""
    nhd = kv_cache.transpose(1, 2)
    return nhd[..., :head_size], nhd[..., head_size:]


class _Engine:
    """pagedc BatchAttention objects shared by the layers with the same mods
    and shapes, planned once per step. With a common prefix (cascade) a
    second one attends to the prefix, merged by merge_state."""

    def __init__(self, mods, num_q_heads, num_kv_heads, head_size, value_head_size,
                 block_size, device, threads, max_num_seqs, max_num_tokens, dtype,
                 kv_dtype=None):
        self.args = dict(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                         head_dim=head_size, value_head_dim=value_head_size,
                         page_size=block_size, kv_layout="NHD", device=device, threads=threads)
        self.shape = (block_size, dtype)
        self.on_cuda = device != "cpu"
        if self.on_cuda:
            # A CUDA BatchAttention is built for its caches' type.
            self.args.update(dtype=dtype, kv_dtype=kv_dtype)
        self.mods = mods
        self.limits = [max_num_seqs, max_num_tokens, 1]  # seqs, tokens, blocks per seq
        self.main = self.prefix = None
        self.step = None
        self.cascade = False

    def _make(self):
        seqs, tokens, blocks = self.limits
        return pagedc.BatchAttention(self.mods, max_num_seqs=seqs, max_num_tokens=tokens,
                                     max_blocks_per_seq=blocks, **self.args)

    def plan(self, metadata: PagedcAttentionMetadata) -> None:
        if self.step == metadata.step:
            return
        tokens = int(metadata.query_start_loc[-1])
        wanted = [metadata.num_reqs, tokens, int(metadata.block_table.shape[1])]
        if self.main is None or any(w > have for w, have in zip(wanted, self.limits)):
            self.limits = [max(w, have) for w, have in zip(wanted, self.limits)]
            self.main = self._make()
            self.prefix = None
        prefix = metadata.common_prefix_len
        if prefix > 0:
            if self.prefix is None:
                self.prefix = self._make()
            ends = np.full(metadata.num_reqs, prefix, dtype=np.int32)
            self.prefix.plan(metadata.query_start_loc, metadata.seq_lens, metadata.block_table,
                             kv_end=ends)
            self.main.plan(metadata.query_start_loc, metadata.seq_lens, metadata.block_table,
                           kv_start=ends)
        else:
            self.main.plan(metadata.query_start_loc, metadata.seq_lens, metadata.block_table)
        self.cascade = prefix > 0
        self.step = metadata.step

    def run(self, q, k_cache, v_cache, out, buffers, params, scale, sinks=None,
            **quantized) -> None:
        if self.on_cuda and q.device.type == "cpu":
            self._run_staged(q, k_cache, v_cache, out, buffers, params, scale, sinks,
                             quantized)
            return
        self._attend(q, k_cache, v_cache, out, buffers, params, scale, sinks, quantized)

    def _attend(self, q, k_cache, v_cache, out, buffers, params, scale, sinks,
                quantized) -> None:
        if not self.cascade:
            self.main.run(q, k_cache, v_cache, buffers=buffers, params=params, scale=scale,
                          out=out, sinks=sinks, **quantized)
            return
        # The sinks join the softmax once: with the keys after the prefix.
        _, lse = self.main.run(q, k_cache, v_cache, buffers=buffers, params=params,
                               scale=scale, out=out, return_lse=True, sinks=sinks, **quantized)
        prefix_out, prefix_lse = self.prefix.run(q, k_cache, v_cache, buffers=buffers,
                                                 params=params, scale=scale, return_lse=True,
                                                 **quantized)
        pagedc.merge_state_in_place(out, lse, prefix_out, prefix_lse)

    def _run_staged(self, q, k_cache, v_cache, out, buffers, params, scale, sinks,
                    quantized) -> None:
        """Host tensors on the emulated device: q and the caches are copied
        into its memory, the kernels run there, out is copied back. A GPU's
        CUDA tensors take run() in place instead."""
        device = self.args["device"]
        staged = [pagedc.to_device(x.contiguous(), device=device) for x in (q, k_cache, v_cache)]
        result = pagedc.empty(tuple(out.shape), self.args["dtype"], device=device)
        # The tensors traced Python mods captured, and the call's own buffers.
        bound = dict(getattr(self.mods, "bound_buffers", {}) or {})
        bound.update(buffers)
        staged_buffers = {name: pagedc.to_device(np.asarray(value), device=device)
                          for name, value in bound.items()}
        staged_sinks = None if sinks is None else pagedc.to_device(sinks, device=device)
        self._attend(*staged, result, staged_buffers, params, scale, staged_sinks, quantized)
        out.copy_(torch.from_dlpack(pagedc.to_host(result)))


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_ENGINES: dict = {}
_COMPILED: dict = {}
_LOCK = threading.Lock()


def _engines_matching(block_size: int, num_kv_heads: int, head_size: int):
    with _LOCK:
        return [engine for key, engine in _ENGINES.items()
                if key[1:4] == (block_size, num_kv_heads, head_size)]


def _compiled(key, compile_fn):
    with _LOCK:
        mods = _COMPILED.get(key)
    if mods is None:
        mods = compile_fn()
        with _LOCK:
            mods = _COMPILED.setdefault(key, mods)
    return mods


class PagedcAttentionImpl(AttentionImpl):
    """One layer's attention: vLLM's K/V written into its cache in place
    (do_kv_cache_update), then pagedc's batch call over the whole step."""

    def __init__(self, num_heads: int, head_size: int, scale: float,
                 num_kv_heads: Optional[int] = None, alibi_slopes=None,
                 sliding_window: Optional[int] = None, kv_cache_dtype: str = "auto",
                 logits_soft_cap: Optional[float] = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: Optional[str] = None, sinks=None,
                 **kwargs) -> None:
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"pagedc backend: attention type {attn_type} is not "
                                      "supported (decoder attention only)")
        if kv_cache_dtype not in PagedcAttentionBackend.supported_kv_cache_dtypes:
            raise NotImplementedError(f"pagedc backend: kv_cache_dtype {kv_cache_dtype!r} is "
                                      "not supported; supported: "
                                      + ", ".join(PagedcAttentionBackend.supported_kv_cache_dtypes))
        self.num_heads = int(num_heads)
        self.head_size = int(head_size)
        self.head_size_v = int(kwargs.get("head_size_v") or head_size)
        self.scale = float(scale)
        self.num_kv_heads = int(num_kv_heads or num_heads)
        self.kv_cache_dtype = kv_cache_dtype
        # (pagedc kv_dtype, torch type, largest value) of an 8-bit cache; None: 16-bit.
        self.fp8 = FP8_CACHE_DTYPES.get(kv_cache_dtype)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.attn_type = attn_type
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"pagedc backend: num_heads {num_heads} is not a multiple of "
                             f"num_kv_heads {num_kv_heads}")

        try:
            from vllm.config import get_current_vllm_config_or_none
            vllm_config = get_current_vllm_config_or_none()
        except ImportError:
            vllm_config = None
        self.config = config = current_config(vllm_config)
        self._vllm_config = vllm_config
        self.buffers = dict(config.buffers)
        self.params = dict(config.params)
        if config.has_mods:
            ignored = [name for name, value in (("sliding_window", sliding_window),
                                                ("logits_soft_cap", logits_soft_cap),
                                                ("alibi_slopes", alibi_slopes))
                       if value is not None]
            if ignored:
                logger.warning("pagedc backend: the configured mods (%s) replace the layer's "
                               "own %s", config.origin, ", ".join(ignored))
            self.mods_key = ("configured", config.key())
            self.mods = _compiled(self.mods_key, config.compile)
        else:
            source = builtin_source(sliding_window, logits_soft_cap, alibi_slopes is not None)
            self.mods_key = ("layer", source, config.on_cuda)
            self.mods = _compiled(self.mods_key,
                                  lambda: pagedc.compile(source, cuda=config.on_cuda))
            if alibi_slopes is not None:
                self.buffers["alibi_slopes"] = np.asarray(
                    torch.as_tensor(alibi_slopes, dtype=torch.float32).cpu().numpy())
        # The layer's sinks parameter (gpt-oss), [Hq]: kept by reference, as
        # vLLM loads its values after the impl is made; made f32 per call.
        self.sinks = sinks
        if sinks is not None:
            if tuple(sinks.shape) != (self.num_heads,):
                raise ValueError(f"pagedc backend: sinks must be [num_heads] = "
                                 f"[{self.num_heads}] but have shape {list(sinks.shape)}")
        self._engine: Optional[_Engine] = None

    def _engine_for(self, block_size: int, dtype: str) -> _Engine:
        if self._engine is not None and self._engine.shape == (block_size, dtype):
            return self._engine
        seqs, tokens = 256, 8192
        scheduler = getattr(self._vllm_config, "scheduler_config", None)
        if scheduler is not None:
            seqs = int(getattr(scheduler, "max_num_seqs", seqs) or seqs)
            tokens = int(getattr(scheduler, "max_num_batched_tokens", tokens) or tokens)
        kv_dtype = self.fp8[0] if self.fp8 is not None else None
        key = (self.mods_key, block_size, self.num_kv_heads, self.head_size,
               self.head_size_v, self.num_heads, self.config.device, self.config.threads, dtype,
               kv_dtype)
        with _LOCK:
            engine = _ENGINES.get(key)
            if engine is None:
                engine = _Engine(self.mods, self.num_heads, self.num_kv_heads, self.head_size,
                                 self.head_size_v, block_size, self.config.device,
                                 self.config.threads, seqs, tokens, dtype, kv_dtype)
                _ENGINES[key] = engine
        self._engine = engine
        return engine

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Writes the step's new keys and values into the layer's cache, in
        place: token i goes to block slot_mapping[i] // block_size, row
        slot_mapping[i] % block_size; negative slots (padding) are skipped."""
        if self.kv_sharing_target_layer_name is not None:
            return
        k_cache, v_cache = _split_kv_cache(kv_cache, self.head_size)
        fp8 = self.fp8
        block_size = k_cache.shape[1]
        slots = slot_mapping.to(torch.long)
        count = slots.shape[0]
        keep = slots >= 0
        slots = slots[keep]
        blocks, rows = slots // block_size, slots % block_size
        key, value = key[:count][keep], value[:count][keep]
        if fp8 is not None:
            k_scale, v_scale = _scales(layer)
            key, value = (_quantize(x, scale, fp8, cache.dtype) for x, scale, cache in
                          ((key, k_scale, k_cache), (value, v_scale, v_cache)))
        k_cache[blocks, rows] = key.to(k_cache.dtype)
        v_cache[blocks, rows] = value.to(v_cache.dtype)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Optional[PagedcAttentionMetadata],
                output: torch.Tensor, output_scale=None, output_block_scale=None) -> torch.Tensor:
        """``query`` [T, Hq, D], ``kv_cache`` the layer's [blocks, Hkv,
        block_size, D + Dv] view, ``output`` [T, Hq, Dv] (or [T, Hq * Dv]),
        written in place for the step's tokens; rows past them (padding) are
        left as they are."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("pagedc backend: fused output quantization is not "
                                      "supported")
        if attn_metadata is None:  # vLLM's profiling run
            return output.fill_(0)
        metadata = attn_metadata
        if not metadata.causal and not self.config.has_mods:
            raise NotImplementedError("pagedc backend: non-causal attention needs mods "
                                      "(set_mods or additional_config)")
        tokens = int(metadata.query_start_loc[-1])
        out = output if output.dim() == 3 else \
            output.view(output.shape[0], self.num_heads, self.head_size_v)
        if tokens == 0:
            return output
        k_cache, v_cache = _split_kv_cache(kv_cache, self.head_size)
        q = query if query.dim() == 3 else \
            query.view(query.shape[0], self.num_heads, self.head_size)
        q = q[:tokens]
        engine = self._engine_for(int(k_cache.shape[1]), _DTYPE_NAMES.get(q.dtype, str(q.dtype)))
        engine.plan(metadata)
        fp8 = self.fp8
        quantized = {}
        if fp8 is not None:
            k_scale, v_scale = _scales(layer)
            quantized = dict(kv_dtype=fp8[0] if k_cache.dtype == torch.uint8 else None,
                             k_scale=k_scale, v_scale=v_scale)
        sinks = None
        if self.sinks is not None:
            sinks = self.sinks.detach().to(device=q.device, dtype=torch.float32).contiguous()
        engine.run(q, k_cache, v_cache, out[:tokens], self.buffers, self.params, self.scale,
                   sinks=sinks, **quantized)
        return output


def _scales(layer):
    """The layer's K and V cache scales (vLLM's _k_scale_float / _v_scale_float)."""
    return (float(getattr(layer, "_k_scale_float", 1.0)),
            float(getattr(layer, "_v_scale_float", 1.0)))


def _quantize(x: torch.Tensor, scale: float, fp8, cache_dtype) -> torch.Tensor:
    """x / scale as 8-bit float codes, saturated to the format's range, in the
    cache's dtype (uint8 bytes or the float8 type itself)."""
    _, torch_type, largest = fp8
    codes = (x.float() / scale).clamp(-largest, largest).to(torch_type)
    return codes.view(torch.uint8) if cache_dtype == torch.uint8 else codes
