"""The serving engine's batch call and merge_state (docs/serving.md).

    attn = pagedc.BatchAttention(mods, num_q_heads=32, num_kv_heads=8, head_dim=128,
                                 page_size=16, kv_layout="vllm", max_num_seqs=256,
                                 max_num_tokens=8192)
    attn.plan(query_start_loc, seq_lens, block_table)    # once per step, host int32
    out = attn.run(q, kv_cache, None)                     # q [T, Hq, D] -> out [T, Hq, Dv]
"""
from __future__ import annotations

import itertools
import weakref
from typing import Mapping, Optional

import numpy as np

from . import _pagedc as _C
from ._api import _framework_of, _native_mods, _to_framework

_LAYOUTS = ("NHD", "HND", "vllm", "pagedc")

# BatchAttentions by the handle torch.ops.pagedc.batch_attention names them
# with (weakly: an op call never keeps one alive).
_BATCH_BY_HANDLE: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_BATCH_HANDLES = itertools.count(1)


def _host_int32(value, argument: str, ndim: int):
    """`value` as host int32 data the runtime can borrow: int32 tensors with
    __dlpack__ (NumPy, torch CPU) pass through without a copy; other integer
    arrays and lists are converted, values checked against the int32 range."""
    from ._device import device_label, tensor_device_index
    where = tensor_device_index(value)
    if where >= 0:
        raise ValueError(f"{argument}: must be in host memory, got a tensor on "
                         f"{device_label(where)}")
    dtype = str(getattr(value, "dtype", ""))
    if hasattr(value, "__dlpack__") and dtype in ("int32", "torch.int32"):
        device = getattr(value, "device", None)
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            return np.array(value)  # NumPy will not export a read-only array
        if device is None or str(device) == "cpu":
            return value
        raise ValueError(f"{argument}: must be in host memory, got a tensor on {device}")
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001
        raise ValueError(f"{argument}: expected int32 values, got {type(value).__name__}") \
            from None
    if arr.ndim != ndim:
        raise ValueError(f"{argument}: expected {ndim} dimension(s), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{argument}: expected integers, got {arr.dtype}")
    if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{argument}: a value does not fit int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


class BatchAttention:
    """One serving step's attention over packed queries of many sequences.

    ``mods``: compiled mods (``pagedc.compile`` / ``pagedc.from_torch``) or
    None. ``kv_layout``: "NHD" (K and V each [pages, page_size, Hkv, D]),
    "HND" ([pages, Hkv, page_size, D]), "vllm" (one [2, pages, page_size,
    Hkv, D] tensor passed as ``k_cache`` with ``v_cache=None``) or "pagedc"
    ([Hkv, pages, page_size, D]). ``max_num_seqs`` / ``max_num_tokens`` bound
    every plan; ``max_blocks_per_seq`` (default: the first plan's block
    table's columns) bounds the pages one sequence may use. ``device``:
    "cpu", or a CUDA device ("cuda:N", or "emu": the SIMT emulator's), where
    ``dtype`` ("bf16" or "f16") is the element type of q, the caches and out
    (``kv_dtype`` "float8_e4m3fn" / "float8_e5m2": the caches hold 8-bit
    floats instead, read with ``run``'s ``k_scale`` / ``v_scale``, at every CUDA
    head dim; ``out_dtype`` "f32": out is float32), the mods need CUDA
    code (``compile(..., cuda=True)``), every tensor is in that device's
    memory (read in place) and ``run`` enqueues on the call's stream and
    returns without waiting (docs/python.md, "CUDA memory"). The CPU
    backend takes the caches' and out's types at ``run`` and ignores
    ``dtype``, ``kv_dtype`` and ``out_dtype``.
    ``threads``: CPU worker threads, 0 = all cores. ``fixed_grid`` (CUDA):
    every launch's grid depends only on the limits, so a ``run`` captured
    into a CUDA graph stays valid after any later ``plan`` within them
    (``BatchAttentionConfig::fixedGrid``; docs/serving.md, "Under a CUDA
    graph"); ``plan_shape`` is then the same for every plan.
    """

    def __init__(self, mods, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 page_size: int, kv_layout: str = "NHD", max_num_seqs: int = 256,
                 max_num_tokens: int = 8192, device: str = "cpu", *,
                 value_head_dim: Optional[int] = None,
                 max_blocks_per_seq: Optional[int] = None, threads: int = 0,
                 dtype: str = "bf16", kv_dtype: Optional[str] = None,
                 out_dtype: Optional[str] = None, fixed_grid: bool = False):
        from ._device import device_index
        self._device = device_index(device)
        if self._device >= 0 and (mods is None or not _native_mods(mods).has_cuda):
            raise ValueError("mods: a CUDA BatchAttention needs mods with CUDA code; compile "
                             "them with pagedc.compile(..., cuda=True)")
        dtype = {"float16": "f16", "bfloat16": "bf16"}.get(str(dtype).replace("torch.", ""),
                                                           str(dtype))
        if self._device >= 0 and dtype not in ("f16", "bf16"):
            raise ValueError(f"dtype: a CUDA BatchAttention computes in 'bf16' or 'f16', "
                             f"got {dtype!r}")
        kv_dtype = "" if kv_dtype is None else str(kv_dtype).replace("torch.", "")
        if self._device >= 0 and kv_dtype not in ("", "float8_e4m3fn", "float8_e5m2",
                                                  "f8e4m3", "f8e5m2"):
            raise ValueError(f"kv_dtype: a CUDA BatchAttention reads 8-bit caches of "
                             f"'float8_e4m3fn' or 'float8_e5m2' (None: dtype's), got "
                             f"{kv_dtype!r}")
        out_dtype = "" if out_dtype is None else \
            {"float32": "f32"}.get(str(out_dtype).replace("torch.", ""), str(out_dtype))
        if self._device >= 0 and out_dtype not in ("", "f32", dtype):
            raise ValueError(f"out_dtype: a CUDA BatchAttention writes 'f32' or {dtype!r} "
                             f"(dtype; None), got {out_dtype!r}")
        if not isinstance(kv_layout, str) or kv_layout.lower() not in \
                [name.lower() for name in _LAYOUTS]:
            raise ValueError(f"kv_layout: unknown layout {kv_layout!r}; valid layouts: "
                             + ", ".join(_LAYOUTS))
        self._mods = _native_mods(mods)
        self._args = dict(num_q_heads=int(num_q_heads), num_kv_heads=int(num_kv_heads),
                          head_dim=int(head_dim),
                          value_head_dim=int(value_head_dim or 0),
                          page_size=int(page_size), kv_layout=kv_layout,
                          max_num_seqs=int(max_num_seqs), max_num_tokens=int(max_num_tokens),
                          threads=int(threads), dtype=dtype, kv_dtype=kv_dtype,
                          out_dtype=out_dtype, fixed_grid=bool(fixed_grid))
        # Built now, so that a bad setting raises here; without
        # max_blocks_per_seq it is built again at the first plan, sized by
        # that block table.
        self._build(int(max_blocks_per_seq or 1))
        if max_blocks_per_seq is None:
            self._native = None
        self._op_handle = next(_BATCH_HANDLES)
        _BATCH_BY_HANDLE[self._op_handle] = self

    def _build(self, max_blocks_per_seq: int):
        a = self._args
        self._native = _C.BatchAttention(self._mods._native, a["num_q_heads"],
                                         a["num_kv_heads"], a["head_dim"],
                                         a["value_head_dim"], a["page_size"], a["kv_layout"],
                                         a["max_num_seqs"], a["max_num_tokens"],
                                         max_blocks_per_seq, a["threads"], self._device,
                                         a["dtype"], a["kv_dtype"], a["out_dtype"],
                                         a["fixed_grid"])

    kv_layout = property(lambda self: self._args["kv_layout"])
    device = property(lambda self: "cpu" if self._device < 0 else f"cuda:{self._device}")
    num_seqs = property(lambda self: self._native.num_seqs if self._native else 0)
    num_tokens = property(lambda self: self._native.num_tokens if self._native else 0)
    # (prefill tiles, decode sequences, decode splits) the plan launches on
    # CUDA; zeros on the CPU and before the first plan.
    plan_shape = property(lambda self: self._native.plan_shape if self._native else (0, 0, 0))

    def key_range(self, sequence: int):
        """The keys ``(begin, end)`` run() reads for ``sequence`` of the
        plan: kv_start and kv_end, or from a later key where the mask's
        block classifier proves every key before it masked for all of the
        sequence's new tokens (a causal or sliding-window mask whose window
        is a constant: a window reads its own keys, not the whole context).
        Raises ValueError for a sequence the plan does not have."""
        if self._native is None:
            raise ValueError("key_range: nothing is planned")
        return tuple(self._native.key_range(int(sequence)))

    def plan(self, query_start_loc, seq_lens, block_table, kv_start=None,
             kv_end=None, *, token_positions=None, token_batch=None) -> None:
        """Takes a step's metadata (host int32): ``query_start_loc`` [B + 1]
        (from 0, non-decreasing), ``seq_lens`` [B] (each sequence's keys, its
        new tokens included) and ``block_table`` [>= B, max_blocks].
        ``kv_start`` / ``kv_end`` [B] (default 0 and seq_lens) limit each
        sequence to keys [kv_start, kv_end): two plans over a shared prefix
        and the rest merge (merge_state) to attention over all keys.
        ``token_positions`` / ``token_batch`` [T] (CPU) give each packed
        token the query position and batch index its mods see, in place of
        ``seq_lens[b] - q_len_b + i`` and b: a cascade level packs the
        queries of sequences sharing a prefix as one entry over the prefix's
        pages (see ``cascade_plan``). Bad metadata raises ValueError naming
        it; the previous plan stays."""
        qsl = _host_int32(query_start_loc, "query_start_loc", 1)
        lens = _host_int32(seq_lens, "seq_lens", 1)
        table = _host_int32(block_table, "block_table", 2)
        start = None if kv_start is None else _host_int32(kv_start, "kv_start", 1)
        end = None if kv_end is None else _host_int32(kv_end, "kv_end", 1)
        positions = None if token_positions is None else \
            _host_int32(token_positions, "token_positions", 1)
        batches = None if token_batch is None else _host_int32(token_batch, "token_batch", 1)
        if self._native is None:
            self._build(max(1, int(table.shape[1])))
        self._native.plan(qsl, lens, table, start, end, positions, batches)

    def run(self, q, k_cache, v_cache=None, buffers: Optional[Mapping] = None,
            params: Optional[Mapping] = None, scale: Optional[float] = None,
            return_lse: bool = False, out=None, *, kv_dtype: Optional[str] = None,
            k_scale=None, v_scale=None, stream=None, sinks=None):
        """Attention of the planned step: ``q`` [T, Hq, D] packed as
        ``query_start_loc`` says, the caches in the configured layout (read
        in place). Returns ``out`` [T, Hq, Dv], or ``(out, lse)`` with
        ``return_lse`` (lse [T, Hq] float32, natural log), in q's framework
        (NumPy or torch). Writes into ``out`` when given.

        ``sinks``: attention sinks, a float32 tensor [Hq] on the call's
        device, as in ``flex_attention`` (a fully masked row gives out 0 and
        lse ``sinks[h]``).

        8-bit caches: torch ``float8_e4m3fn`` / ``float8_e5m2`` tensors, or
        uint8 arrays with ``kv_dtype="float8_e4m3fn"`` / ``"float8_e5m2"``;
        ``k_scale`` / ``v_scale`` (a number, or one per KV head) are then
        required: a code c means c * scale. On a CUDA device the
        BatchAttention must have been made with that ``kv_dtype``; each
        distinct pair of scales is copied to the device once, by
        ``upload_scales`` or the first run that passes it (so a run captured
        into a CUDA graph passes scales already copied; a new pair inside a
        capture raises pagedc.Error saying so).

        On a CUDA device the kernels are enqueued on ``stream`` (a CUstream
        handle or an object with ``cuda_stream``; default: torch's current
        stream for torch tensors, else the legacy default stream), producers
        are asked for their data on it (``__dlpack__(stream=...)``), and the
        results (new device tensors unless ``out`` is given) are ready once
        the stream reaches them: run() does not wait.

        Inside ``torch.compile`` the call is the custom op
        ``torch.ops.pagedc.batch_attention`` on the current plan (plan()
        outside the compiled region); 8-bit caches need the eager call."""
        from . import _torch as _T
        if _T.torch_compiling():
            if kv_dtype is not None or k_scale is not None or v_scale is not None or \
                    stream is not None:
                raise ValueError("under torch.compile BatchAttention.run takes q, the caches, "
                                 "buffers, params, scale, return_lse, out and sinks; not "
                                 "kv_dtype, k_scale, v_scale or stream (call it outside the "
                                 "compiled region)")
            return _T.compiled_batch_attention(self._op_handle, q, k_cache, v_cache, buffers,
                                               params, scale, return_lse, out, sinks)
        if self._native is None:
            raise ValueError("run() needs a plan: call plan(query_start_loc, seq_lens, "
                             "block_table) first")
        framework = _framework_of(q)
        merged, params = self._mods._bindings(buffers, params)
        from ._api import _scales
        from ._device import call_stream
        stream = call_stream(stream, q) if self._device >= 0 else 0
        result, lse = self._native.run(q, k_cache, v_cache, merged, params,
                                       None if scale is None else float(scale),
                                       bool(return_lse), out, None, str(kv_dtype or ""),
                                       _scales(k_scale, "k_scale"), _scales(v_scale, "v_scale"),
                                       stream, sinks)
        result = _to_framework(result, framework)
        if return_lse:
            return result, _to_framework(lse, framework)
        return result

    def upload_scales(self, k_scale, v_scale):
        """An 8-bit cache's scales (each a number, or one per KV head):
        checked, and on a CUDA device copied to it now unless already
        copied, so that a later ``run`` given them, captured into a CUDA
        graph or not, copies nothing. Call it for each layer's pair before
        capturing. The CPU backend only checks them."""
        if self._native is None:
            raise ValueError("upload_scales() needs the BatchAttention built: give "
                             "max_blocks_per_seq, or call plan() first")
        from ._api import _scales
        self._native.upload_scales(_scales(k_scale, "k_scale"), _scales(v_scale, "v_scale"))

    def __repr__(self):
        a = self._args
        return (f"pagedc.BatchAttention(num_q_heads={a['num_q_heads']}, "
                f"num_kv_heads={a['num_kv_heads']}, head_dim={a['head_dim']}, "
                f"page_size={a['page_size']}, kv_layout={a['kv_layout']!r})")


def _merge_device(v, stream):
    """(device index, stream) of a merge: where `v` is (-1: the CPU), and on a
    CUDA device the call's stream (call_stream)."""
    from ._device import call_stream, tensor_device_index
    index = tensor_device_index(v)
    return index, (call_stream(stream, v) if index >= 0 else 0)


def merge_state(v_a, s_a, v_b, s_b, stream=None):
    """Merges two attention results over disjoint key sets of the same rows:
    ``v_*`` [T, H, D] (f32, bf16 or f16), ``s_*`` [T, H] float32 natural-log
    logsumexps. Returns ``(v, s)`` in v_a's framework. Device tensors (all
    on v_a's device) are merged there, enqueued on ``stream`` (as
    BatchAttention.run takes it), into new device tensors."""
    framework = _framework_of(v_a)
    device, stream = _merge_device(v_a, stream)
    v, s = _C.merge_state(v_a, s_a, v_b, s_b, device, stream)
    return _to_framework(v, framework), _to_framework(s, framework)


def merge_state_in_place(v, s, v_other, s_other, stream=None) -> None:
    """merge_state of (v, s) with (v_other, s_other), written into v and s."""
    device, stream = _merge_device(v, stream)
    _C.merge_state_in_place(v, s, v_other, s_other, device, stream)


def merge_states(v, s, stream=None):
    """N-way merge: ``v`` [T, N, H, D] and ``s`` [T, N, H] -> ``(v, s)``
    [T, H, D] and [T, H], on v's device as merge_state."""
    framework = _framework_of(v)
    device, stream = _merge_device(v, stream)
    out, lse = _C.merge_states(v, s, device, stream)
    return _to_framework(out, framework), _to_framework(lse, framework)


class CascadeAttention:
    """A serving step in which groups of sequences share a prefix: each
    group's queries attend to the prefix's pages together, once per KV head
    for the whole group (one entry of a first BatchAttention, the group's
    queries packed as its rows, each keeping its own position and sequence
    index for the mods), every sequence attends to the rest of its keys in a
    second BatchAttention, and the two results are merged (merge_state).

    Takes BatchAttention's arguments (``device="emu"`` or ``"cuda:N"`` with
    ``dtype``: both levels and the merge run on the device, enqueued on the
    call's ``stream``). ``plan`` takes the
    step's metadata and ``groups``: ``(first, end, prefix_len)`` triples,
    sequences ``first .. end - 1`` (contiguous, disjoint) sharing their first
    ``prefix_len`` keys, which must sit in the same pages of each member's
    block table row (as ``PagedKVCache.fork`` shares them). The members'
    tokens are contiguous in the packed q because their sequences are."""

    def __init__(self, mods, num_q_heads: int, num_kv_heads: int, head_dim: int,
                 page_size: int, kv_layout: str = "NHD", max_num_seqs: int = 256,
                 max_num_tokens: int = 8192, device: str = "cpu", **options):
        args = (mods, num_q_heads, num_kv_heads, head_dim, page_size, kv_layout, max_num_seqs,
                max_num_tokens, device)
        self._prefix = BatchAttention(*args, **options)
        self._suffix = BatchAttention(*args, **options)
        self._page_size = int(page_size)

    def plan(self, query_start_loc, seq_lens, block_table, groups) -> None:
        """Plans both levels; bad metadata or groups raise ValueError naming
        them, and the previous plan stays."""
        qsl = _host_int32(query_start_loc, "query_start_loc", 1)
        lens = _host_int32(seq_lens, "seq_lens", 1)
        table = _host_int32(block_table, "block_table", 2)
        batch = len(lens)
        if len(qsl) != batch + 1:
            raise ValueError(f"query_start_loc: {len(qsl)} entries for {batch} sequences")
        shared = np.zeros(batch, dtype=np.int32)  # each sequence's prefix length
        starts, entries, cursor = [], [], 0
        for index, group in enumerate(groups):
            try:
                first, end, prefix = (int(x) for x in group)
            except (TypeError, ValueError):
                raise ValueError(f"groups[{index}]: expected (first, end, prefix_len), got "
                                 f"{group!r}") from None
            if not cursor <= first < end <= batch:
                raise ValueError(f"groups[{index}]: sequences [{first}, {end}) are not inside "
                                 f"[{cursor}, {batch}) (groups must be sorted and disjoint)")
            if prefix < 0 or prefix > int(lens[first:end].min()):
                raise ValueError(f"groups[{index}]: prefix_len {prefix} is outside [0, the "
                                 f"shortest member's seq_len {int(lens[first:end].min())}]")
            pages = -(-prefix // self._page_size)
            if pages and np.any(table[first:end, :pages] != table[first, :pages]):
                raise ValueError(f"groups[{index}]: the members' block table rows differ in "
                                 f"the prefix's {pages} pages")
            for b in range(cursor, first):  # sequences outside any group
                entries.append((b, 0))
                starts.append(qsl[b])
            entries.append((first, prefix))
            starts.append(qsl[first])
            shared[first:end] = prefix
            cursor = end
        for b in range(cursor, batch):
            entries.append((b, 0))
            starts.append(qsl[b])
        starts.append(qsl[batch])
        # Each token's own position and sequence, for the prefix level.
        q_lens = np.diff(qsl)
        token_batch = np.repeat(np.arange(batch, dtype=np.int32), q_lens)
        token_positions = (np.arange(qsl[batch], dtype=np.int32) - np.repeat(qsl[:-1], q_lens)
                           + np.repeat(lens - q_lens, q_lens)).astype(np.int32)
        rows = np.array([b for b, _ in entries], dtype=np.int32)
        prefix_lens = np.array([p for _, p in entries], dtype=np.int32)
        self._suffix.plan(qsl, lens, table, kv_start=shared)
        self._prefix.plan(np.array(starts, dtype=np.int32), lens[rows], table[rows],
                          kv_end=prefix_lens, token_positions=token_positions,
                          token_batch=token_batch)

    def run(self, q, k_cache, v_cache=None, buffers: Optional[Mapping] = None,
            params: Optional[Mapping] = None, scale: Optional[float] = None,
            return_lse: bool = False, **options):
        """Attention of the planned step over all of each sequence's keys:
        ``out`` [T, Hq, Dv], or ``(out, lse)``, as BatchAttention.run."""
        call = dict(buffers=buffers, params=params, scale=scale, return_lse=True, **options)
        out, lse = self._suffix.run(q, k_cache, v_cache, **call)
        call.pop("out", None)  # the caller's out receives the merged result
        # A sink is one key of the row's softmax: it joins one level only.
        call.pop("sinks", None)
        prefix_out, prefix_lse = self._prefix.run(q, k_cache, v_cache, **call)
        merge_state_in_place(out, lse, prefix_out, prefix_lse, stream=options.get("stream"))
        return (out, lse) if return_lse else out
