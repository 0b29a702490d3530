"""PyTorch's vocabulary and torch.compile for pagedc.flex_attention.

* ``score_mod=`` / ``mask_mod=`` Python functions are traced with
  ``from_torch`` once per code object and captured values, and the compiled
  mods are reused (captured tensors are bound live at each call).
* torch's own ``BlockMask`` (``torch.nn.attention.flex_attention``) is
  converted from its ``kv_num_blocks`` / ``kv_indices`` / ``full_*`` arrays,
  with its ``mask_mod`` traced for the partial blocks.
* ``return_aux=AuxRequest(lse=True)`` returns torch's ``AuxOutput``.
* Under ``torch.compile`` the dense-K/V form of the call goes through the
  custom op ``torch.ops.pagedc.flex_attention`` (a fake implementation gives
  Dynamo the output shapes), so a compiled model calls pagedc without a graph
  break.

Nothing here imports torch unless the caller's objects are torch's.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Optional

import numpy as np

# ---------------------------------------------------------------------------
# Mods from Python functions, cached by code and captured values
# ---------------------------------------------------------------------------

_TRACE_CACHE: dict = {}
_TRACE_LOCK = threading.Lock()
_TRACE_CACHE_LIMIT = 256


def _captured_key(fn) -> tuple:
    """What a function's trace depends on besides its code: the values of its
    closure cells and of the globals it names (tensors by identity: they are
    bound live, so new contents need no new trace, but a new tensor does)."""
    def key_of(value):
        if isinstance(value, (bool, int, float, str, type(None))):
            return (type(value).__name__, value)
        if isinstance(value, np.ndarray) or type(value).__module__.startswith("torch"):
            return ("tensor", id(value), tuple(getattr(value, "shape", ())),
                    str(getattr(value, "dtype", "")))
        if isinstance(value, types.FunctionType):
            return ("function", value.__code__, _captured_key(value))
        return ("object", id(value))

    cells = tuple(key_of(c.cell_contents) for c in (fn.__closure__ or ())
                  if _cell_filled(c))
    names = tuple((n, key_of(fn.__globals__[n])) for n in fn.__code__.co_names
                  if n in fn.__globals__ and not isinstance(fn.__globals__[n], types.ModuleType))
    return cells + names


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
        return True
    except ValueError:
        return False


def _fn_key(fn):
    if fn is None:
        return None
    if not isinstance(fn, types.FunctionType):
        return ("object", id(fn))
    return (fn.__code__, _captured_key(fn))


def traced_mods(score_mod, mask_mod):
    """Compiled mods of torch-style Python functions, traced once per code
    object and captured values."""
    from ._tracer import from_torch
    key = (_fn_key(score_mod), _fn_key(mask_mod))
    with _TRACE_LOCK:
        hit = _TRACE_CACHE.get(key)
    if hit is not None:
        return hit
    mods = from_torch(mask_mod=mask_mod, score_mod=score_mod)
    with _TRACE_LOCK:
        if len(_TRACE_CACHE) >= _TRACE_CACHE_LIMIT:
            _TRACE_CACHE.pop(next(iter(_TRACE_CACHE)))
        _TRACE_CACHE[key] = mods
    return mods


# ---------------------------------------------------------------------------
# torch's BlockMask
# ---------------------------------------------------------------------------

def is_torch_block_mask(obj) -> bool:
    t = type(obj)
    return t.__name__ == "BlockMask" and t.__module__.startswith("torch.nn.attention")


def _is_noop_mask(fn) -> bool:
    return getattr(fn, "__name__", "") == "noop_mask" and \
        getattr(fn, "__module__", "").startswith("torch.nn.attention")


def convert_block_mask(block_mask):
    """(pagedc BlockMask, the mask_mod to apply in partial blocks or None)
    from torch's BlockMask, without evaluating the mask over all positions."""
    from ._api import BlockMask

    def host(t):
        return None if t is None else np.ascontiguousarray(t.detach().cpu().numpy(),
                                                           dtype=np.int32)

    q_block, kv_block = (int(x) for x in block_mask.BLOCK_SIZE)
    q_len, kv_len = (int(x) for x in block_mask.seq_lengths)
    mask = BlockMask.from_kv_blocks(host(block_mask.kv_num_blocks), host(block_mask.kv_indices),
                                    host(block_mask.full_kv_num_blocks),
                                    host(block_mask.full_kv_indices),
                                    BLOCK_SIZE=(q_block, kv_block), seq_lengths=(q_len, kv_len))
    mask._framework = "torch"
    mask_mod = block_mask.mask_mod
    return mask, (None if mask_mod is None or _is_noop_mask(mask_mod) else mask_mod)


def aux_output(lse, return_aux):
    """torch's AuxOutput for return_aux=AuxRequest(...)."""
    from torch.nn.attention.flex_attention import AuxOutput
    if getattr(return_aux, "max_scores", False):
        raise ValueError("return_aux: max_scores is not supported by pagedc (lse is)")
    return AuxOutput(lse=lse if getattr(return_aux, "lse", False) else None)


# ---------------------------------------------------------------------------
# torch.compile: the custom op
# ---------------------------------------------------------------------------

_OP_LOCK = threading.Lock()
_OP = None


def _mods_of(handle: int):
    from ._api import _MODS_BY_HANDLE
    mods = _MODS_BY_HANDLE.get(handle)
    if mods is None:
        raise ValueError(f"pagedc::flex_attention: mods {handle} no longer exist")
    return mods


_IS_COMPILING = None


def torch_compiling() -> bool:
    # Every host call asks this first, so the function is looked up once
    # torch is imported (three attribute lookups a call otherwise); Dynamo
    # knows the function itself, not the path to it.
    global _IS_COMPILING
    is_compiling = _IS_COMPILING
    if is_compiling is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        is_compiling = _IS_COMPILING = torch.compiler.is_compiling
    return is_compiling()


def ensure_op():
    """Registers torch.ops.pagedc.flex_attention (once)."""
    global _OP
    if _OP is not None:
        return _OP
    with _OP_LOCK:
        if _OP is not None:
            return _OP
        import torch

        # The schema is spelled out: this module's annotations are strings.
        @torch.library.custom_op(
            "pagedc::flex_attention", mutates_args=(),
            schema="(Tensor q, Tensor k, Tensor v, Tensor[] buffers, int mods, float? scale, "
                   "bool enable_gqa, float[] params, Tensor? sinks=None) -> (Tensor, Tensor)")
        def flex_attention_op(q, k, v, buffers, mods, scale, enable_gqa, params, sinks=None):
            from ._api import flex_attention
            compiled = _mods_of(mods)
            names = [d[0] for d in compiled.buffer_decls]
            values = {}
            for (name, typ, _), value in zip(compiled.param_decls, params):
                values[name] = bool(value) if typ == "bool" else (
                    int(value) if typ == "i32" else float(value))
            out, lse = flex_attention(q, k, v, mods=compiled, buffers=dict(zip(names, buffers)),
                                      params=values, scale=scale, enable_gqa=enable_gqa,
                                      return_lse=True, sinks=sinks)
            return out, lse

        @flex_attention_op.register_fake
        def _(q, k, v, buffers, mods, scale, enable_gqa, params, sinks=None):
            batch, heads, length = q.shape[0], q.shape[1], q.shape[2]
            out = q.new_empty((batch, heads, length, v.shape[3]))
            lse = q.new_empty((batch, heads, length), dtype=torch.float32)
            return out, lse

        _OP = flex_attention_op
        return _OP


def _constant(fn):
    """Marks `fn` for Dynamo as torch._dynamo.assume_constant_result does:
    while tracing, Dynamo runs it and takes the result as a constant of the
    graph, so the mods are traced and compiled outside the graph. Set here as
    that decorator sets it, because the mark must be there before tracing
    starts and pagedc does not import torch itself."""
    fn._dynamo_marked_constant = True
    return fn


@_constant
def _resolve(score_mod, mask_mod) -> int:
    """The handle of the mods of these functions (traced on first use), or of
    no mods; registers the op, outside the graph."""
    from ._api import _native_mods
    ensure_op()
    if score_mod is None and mask_mod is None:
        return _native_mods(None)._op_handle
    return traced_mods(score_mod, mask_mod)._op_handle


@_constant
def _layout(handle: int) -> tuple:
    """(buffer names in declaration order, captured buffer names, params as
    (name, type, default)) of the mods behind `handle`."""
    mods = _mods_of(handle)
    return (tuple(d[0] for d in mods.buffer_decls), tuple(mods.bound_buffers),
            tuple(tuple(d) for d in mods.param_decls))


def _op_inputs(handle, names, captured, param_decls, buffers, params):
    """The custom ops' buffer tensors (given, else captured by the mods) in
    declaration order, and their param values as floats (given, else the
    declared default)."""
    given = dict(buffers or {})
    tensors = []
    for name in names:
        if name in given:
            tensors.append(given[name])
        elif name in captured:
            tensors.append(_captured_tensor(handle, name))
        else:
            raise ValueError(f"buffers: no value for '{name}'")
    values = []
    params = dict(params or {})
    for name, typ, default in param_decls:
        if name in params:
            values.append(float(params[name]))
        elif default is not None:
            values.append(float(default))
        else:
            raise ValueError(f"params: no value for '{name}' (no default)")
    return tensors, values


def compiled_flex_attention(q, k, v, block_mask, mods, buffers, params, scale, enable_gqa,
                            return_lse, score_mod, mask_mod, return_aux, others, sinks=None):
    """flex_attention while torch.compile traces: the key/value tensor form as
    the pagedc::flex_attention custom op. Everything that is not a tensor is
    settled at trace time (the mods traced and compiled, the layout of their
    buffers and params), so the graph holds one op call."""
    unsupported = [name for name, value in others.items() if value is not None]
    if block_mask is not None and not callable(block_mask):
        unsupported.append("block_mask")
    elif block_mask is not None:
        score_mod = block_mask  # torch's positional order
    if not hasattr(k, "shape"):
        unsupported.append("a PagedKVCache")
    if unsupported:
        raise ValueError("under torch.compile pagedc.flex_attention takes key/value tensors, "
                         "mods or score_mod/mask_mod functions, buffers, params, scale, "
                         "enable_gqa, sinks and return_lse/return_aux; not " + ", ".join(unsupported)
                         + " (call it outside the compiled region)")
    if mods is not None:
        if score_mod is not None or mask_mod is not None:
            raise ValueError("mods: give compiled mods or score_mod= / mask_mod= functions, "
                             "not both")
        _resolve(None, None)  # registers the op
        handle = mods._op_handle
    else:
        # Functions are traced while Dynamo runs _resolve; ones that close
        # over tensors made inside the compiled region cannot be handed to it:
        # trace those once outside (pagedc.from_torch) and pass mods=.
        handle = _resolve(score_mod, mask_mod)
    names, captured, param_decls = _layout(handle)
    tensors, values = _op_inputs(handle, names, captured, param_decls, buffers, params)
    import torch
    out, lse = torch.ops.pagedc.flex_attention(q, k, v, tensors, handle,
                                               None if scale is None else float(scale),
                                               bool(enable_gqa), values, sinks)
    if return_aux is not None:
        return out, aux_output(lse, return_aux)
    return (out, lse) if return_lse else out


@_constant
def _captured_tensor(handle: int, name: str):
    return _mods_of(handle).bound_buffers[name]


# ---------------------------------------------------------------------------
# torch.compile: the serving batch call
# ---------------------------------------------------------------------------

_BATCH_OP = None


def ensure_batch_op():
    """Registers torch.ops.pagedc.batch_attention (once): the run of a
    BatchAttention's current plan, writing into ``out`` (mutated) and
    returning lse. The plan stays outside the op (a step's host metadata,
    as engines plan before they replay a captured graph)."""
    global _BATCH_OP
    if _BATCH_OP is not None:
        return _BATCH_OP
    with _OP_LOCK:
        if _BATCH_OP is not None:
            return _BATCH_OP
        import torch

        @torch.library.custom_op(
            "pagedc::batch_attention", mutates_args=("out",),
            schema="(Tensor q, Tensor k_cache, Tensor? v_cache, Tensor[] buffers, "
                   "int attention, float? scale, float[] params, Tensor(a!) out, "
                   "Tensor? sinks=None) -> Tensor")
        def batch_attention_op(q, k_cache, v_cache, buffers, attention, scale, params, out,
                               sinks=None):
            attn = _batch_of(attention)
            compiled = attn._mods
            names = [d[0] for d in compiled.buffer_decls]
            values = {}
            for (name, typ, _), value in zip(compiled.param_decls, params):
                values[name] = bool(value) if typ == "bool" else (
                    int(value) if typ == "i32" else float(value))
            _, lse = attn.run(q, k_cache, v_cache, buffers=dict(zip(names, buffers)),
                              params=values, scale=scale, return_lse=True, out=out, sinks=sinks)
            return lse

        @batch_attention_op.register_fake
        def _(q, k_cache, v_cache, buffers, attention, scale, params, out, sinks=None):
            return q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)

        _BATCH_OP = batch_attention_op
        return _BATCH_OP


def _batch_of(handle: int):
    from ._serving import _BATCH_BY_HANDLE
    attn = _BATCH_BY_HANDLE.get(handle)
    if attn is None:
        raise ValueError(f"pagedc::batch_attention: BatchAttention {handle} no longer exists")
    return attn


@_constant
def _batch_layout(handle: int) -> tuple:
    """(mods handle, query heads, value head dim) of the BatchAttention
    behind `handle`; registers the op, outside the graph."""
    ensure_op()
    ensure_batch_op()
    attn = _batch_of(handle)
    a = attn._args
    return attn._mods._op_handle, a["num_q_heads"], a["value_head_dim"] or a["head_dim"]


def compiled_batch_attention(handle: int, q, k_cache, v_cache, buffers, params, scale,
                             return_lse, out, sinks=None):
    """BatchAttention.run while torch.compile traces: one
    torch.ops.pagedc.batch_attention call on the current plan (made outside
    the compiled region); out is allocated in the graph when not given."""
    import torch
    mods_handle, heads, value_dim = _batch_layout(handle)
    names, captured, param_decls = _layout(mods_handle)
    tensors, values = _op_inputs(mods_handle, names, captured, param_decls, buffers, params)
    if out is None:
        out = q.new_empty((q.shape[0], heads, value_dim))
    lse = torch.ops.pagedc.batch_attention(q, k_cache, v_cache, tensors, handle,
                                           None if scale is None else float(scale), values, out,
                                           sinks)
    return (out, lse) if return_lse else out
