"""pagedc: paged flex attention with mods compiled by a JIT (docs/python.md).

    import pagedc, numpy as np
    mods = pagedc.compile("mask causal(b, h, q, kv) = q >= kv")
    out = pagedc.flex_attention(q, k, v, mods=mods)          # NumPy in, NumPy out

    mods = pagedc.from_torch(mask_mod=lambda b, h, q, kv: q >= kv)   # your Python mods
    cache = pagedc.PagedKVCache(n_pages=64, page_size=16, max_batch_size=4, heads=8,
                                head_dim=64)

Tensors go in and out through DLPack (NumPy arrays and PyTorch CPU tensors,
zero-copy). Runtime input errors raise pagedc.Error, a ValueError; compile
errors raise pagedc.CompileError with the file, line, column and caret line.
"""
from ._api import (KERNEL_OPTIONS, BlockMask, CompiledMods, CompileError, Error, PagedKVCache,
                   Tensor, compile, create_block_mask, flex_attention)
from ._device import CudaGraph, Stream, empty, to_device, to_host
from ._pagedc import cuda_codegen_available
from ._serving import BatchAttention, CascadeAttention, merge_state, merge_state_in_place, merge_states
from ._tracer import TraceError, TracedMods, and_masks, from_torch, or_masks, trace_source

__version__ = "0.1.0"

__all__ = ["KERNEL_OPTIONS", "BatchAttention", "BlockMask", "CascadeAttention", "CompiledMods", "CompileError", "CudaGraph",
           "Error",
           "PagedKVCache", "Stream", "Tensor", "TraceError", "TracedMods", "and_masks", "compile", "create_block_mask",
           "cuda_codegen_available", "empty", "flex_attention", "from_torch", "merge_state",
           "merge_state_in_place", "merge_states", "or_masks", "to_device", "to_host",
           "trace_source"]
