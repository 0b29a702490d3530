"""The user-facing API over the native module (pagedc._pagedc).

Everything here is argument handling and conversion; the work (compiling,
cache operations, block masks, attention) is the C++ runtime's.
"""
from __future__ import annotations

import itertools
import math
import os
import re
import stat
import sys
import weakref
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from . import _pagedc as _C
from . import _torch as _T
from ._device import call_stream, device_label, tensor_device_index

Error = _C.Error
Tensor = _C.Tensor


class CompileError(Exception):
    """A .attn program did not compile.

    Attributes: ``file``, ``line``, ``column`` (1-based) and ``message`` of the
    first error, ``source_line`` (the offending line) and ``caret`` (the marker
    line under it), and ``diagnostics``: the compiler's whole report, every
    error in clang's file:line:col form. The location attributes are None when
    the error has no place in the source (e.g. a mod name that does not exist).
    """

    def __init__(self, message: str, diagnostics: str = "", file=None, line=None,
                 column=None, source_line=None, caret=None):
        super().__init__(diagnostics.rstrip() if diagnostics.strip() else message)
        self.message = message
        self.diagnostics = diagnostics
        self.file = file
        self.line = line
        self.column = column
        self.source_line = source_line
        self.caret = caret


_LOCATED = re.compile(r"^(.*?):(\d+):(\d+): error: (.*)$")


def _compile_error(diagnostics: str, error: str) -> CompileError:
    lines = diagnostics.splitlines()
    for i, text in enumerate(lines):
        m = _LOCATED.match(text)
        if m:
            source_line = lines[i + 1] if i + 1 < len(lines) else None
            caret = lines[i + 2] if i + 2 < len(lines) else None
            return CompileError(m.group(4), diagnostics, m.group(1), int(m.group(2)),
                                int(m.group(3)), source_line, caret)
    return CompileError(error or diagnostics.strip() or "compilation failed", diagnostics)


def _define_text(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"defines['{name}']: expected an int or a float, got {value!r}")
    if isinstance(value, float):
        if math.isnan(value):
            raise ValueError(f"defines['{name}']: NaN is not a constant value")
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return str(value)


_MODS_HANDLES = itertools.count(1)
_MODS_BY_HANDLE: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


class CompiledMods:
    """The mods of one .attn program, compiled for the CPU JIT (and the CUDA
    mod code when asked): what ``flex_attention`` and ``create_block_mask``
    take as ``mods``.

    ``source`` is the program text, ``mask`` / ``score`` the selected mod
    names (None when absent), ``buffer_decls`` / ``param_decls`` the program's
    declarations as (name, type, dims-or-default) tuples.
    """

    #: Buffers bound on every call (``from_torch`` fills it with the tensors
    #: the traced functions captured); explicit ``buffers=`` entries win.
    bound_buffers: dict

    def __init__(self, native, source: str, file_name: str):
        self._native = native
        self.source = source
        self.file_name = file_name
        self.bound_buffers = {}
        # A number naming these mods in torch.ops.pagedc.flex_attention's
        # schema (tensors and numbers only); set now, outside any graph.
        self._op_handle = next(_MODS_HANDLES)
        _MODS_BY_HANDLE[self._op_handle] = self

    @property
    def mask(self) -> Optional[str]:
        return self._native.mask_name or None

    @property
    def score(self) -> Optional[str]:
        return self._native.score_name or None

    @property
    def buffer_decls(self):
        return [tuple(d) for d in self._native.buffers]

    @property
    def param_decls(self):
        return [tuple(d) for d in self._native.params]

    @property
    def has_cuda(self) -> bool:
        return self._native.has_cuda

    def _bindings(self, buffers: Optional[Mapping], params: Optional[Mapping]):
        merged = {name: _bindable(value) for name, value in self.bound_buffers.items()}
        for name, value in (buffers or {}).items():
            merged[name] = value
        return merged, dict(params or {})

    def __repr__(self):
        return f"pagedc.CompiledMods(mask={self.mask!r}, score={self.score!r})"


def _bindable(value):
    """A captured tensor as the runtime can read it (float64 -> float32)."""
    if isinstance(value, np.ndarray):
        if value.dtype == np.float64:
            return np.ascontiguousarray(value, dtype=np.float32)
        return value
    dtype = getattr(value, "dtype", None)
    if dtype is not None and str(dtype) == "torch.float64":
        return value.float()
    return value


_NO_MODS = None


def _native_mods(mods):
    global _NO_MODS
    if mods is None:
        if _NO_MODS is None:
            _NO_MODS = CompiledMods(_C.Mods(), "", "<none>")
        return _NO_MODS
    if isinstance(mods, CompiledMods):
        return mods
    if callable(mods):
        raise ValueError("mods: got a Python function; compile it first with "
                         "pagedc.from_torch(mask_mod=..., score_mod=...)")
    raise ValueError(f"mods: expected pagedc.CompiledMods, got {type(mods).__name__}")


def _read_program(path: Path) -> str:
    """The text of the program file ``path``, at most ``_C.MAX_PROGRAM_BYTES``
    (16 MiB, the limit of every pagedc reader): a regular file is measured
    before it is read, anything else (a FIFO, ``/dev/zero``) is read one byte
    past the limit at most, so an endless file is an error, not a read until
    memory runs out."""
    limit = _C.MAX_PROGRAM_BYTES
    too_large = (f"source: program '{path}' is larger than {limit >> 20} MiB ({limit} bytes), "
                 f"the most a program may be")
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise ValueError(f"source: cannot read '{path}': it is a directory, "
                                 f"not a program file")
            if stat.S_ISREG(info.st_mode) and info.st_size > limit:
                raise ValueError(too_large)
            data = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"source: cannot read '{path}': {e}") from None
    if len(data) > limit:
        raise ValueError(too_large)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"source: cannot read '{path}': {e}") from None


def compile(source: Union[str, os.PathLike], mask: Optional[str] = None,
            score: Optional[str] = None, defines: Optional[Mapping[str, Any]] = None,
            cuda: bool = False) -> CompiledMods:
    """Compiles mods of a .attn program.

    ``source`` is the program text (a ``str``) or a file (a ``pathlib.Path``,
    or a ``str`` naming an existing ``*.attn`` file) of at most 16 MiB
    (``ValueError`` beyond, for files before reading them whole; the limit of
    every pagedc reader). ``mask`` / ``score`` name
    the mods to select; when both are None, the program's only mask mod and
    only score mod are selected (a ``ValueError`` asks for names when there
    are several of a kind). ``defines`` overrides constants (``-D``).
    ``cuda=True`` also generates the CUDA mod code (builds with the CUDA code
    generator only). Raises ``CompileError`` with the compiler's located
    diagnostics. The GIL is released while compiling.
    """
    file_name = "<string>"
    if isinstance(source, os.PathLike) or (
            isinstance(source, str) and "\n" not in source and source.endswith(".attn")
            and os.path.isfile(source)):
        path = Path(source)
        text = _read_program(path)
        file_name = str(path)
    elif isinstance(source, str):
        text = source
    else:
        raise ValueError(f"source: expected .attn text or a path, got {type(source).__name__}")
    define_list = [(str(k), _define_text(str(k), v)) for k, v in (defines or {}).items()]
    if cuda and not _C.cuda_codegen_available():
        raise ValueError("cuda=True: this build has no CUDA code generator")
    if mask is None and score is None:
        listed, diagnostics, error = _C.list_mods(file_name, text, define_list)
        if listed is None:
            raise _compile_error(diagnostics, error)
        masks = [n for n, kind in listed if kind == "mask"]
        scores = [n for n, kind in listed if kind == "score"]
        for kind, names in (("mask", masks), ("score", scores)):
            if len(names) > 1:
                raise ValueError(f"the program has {len(names)} {kind} mods ({', '.join(names)});"
                                 f" select one with {kind}=NAME")
        mask = masks[0] if masks else None
        score = scores[0] if scores else None
    result = _C.compile_source(file_name, text, mask or "", score or "", define_list, bool(cuda))
    if result.mods is None:
        raise _compile_error(result.diagnostics, result.error)
    return CompiledMods(result.mods, text, file_name)


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------

#: _framework_of's answers for NumPy's and torch's types, which a call looks
#: up before calling it.
_FRAMEWORK_OF_TYPE = {np.ndarray: "numpy"}


def _framework_of(obj) -> str:
    t = type(obj)
    if isinstance(obj, np.ndarray):
        framework = "numpy"
    elif t.__module__.startswith("torch"):
        framework = "torch"
    else:
        return "pagedc"
    _FRAMEWORK_OF_TYPE[t] = framework
    return framework


def _to_framework(tensor, framework: str):
    if tensor is None or not isinstance(tensor, _C.Tensor):
        return tensor
    if framework == "numpy":
        # Through the array interface NumPy gets a writable view (its
        # from_dlpack before 2.0 gives read-only ones); bf16 has no NumPy type.
        return np.asarray(tensor) if tensor.dtype != "bf16" else np.from_dlpack(tensor)
    if framework == "torch":
        import torch
        return torch.from_dlpack(tensor)
    return tensor


def _host_array(array, framework: str):
    """A host array (NumPy, or a pagedc Tensor for bf16) as `framework`
    wants it: torch tensors for torch workflows, zero-copy either way."""
    if framework != "torch":
        return array
    import torch
    if isinstance(array, np.ndarray):
        return torch.from_numpy(array)
    return torch.from_dlpack(array)


def _int_list(value, argument: str, length: int) -> list:
    """An int, or a sequence / 1-D tensor of `length` ints, as a list."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument}: expected an int or {length} ints, got a bool")
    if isinstance(value, (int, np.integer)):
        return [int(value)] * length
    try:
        arr = np.asarray(value.cpu() if hasattr(value, "cpu") else value)
    except Exception:  # noqa: BLE001
        raise ValueError(f"{argument}: expected an int or {length} ints") from None
    if arr.ndim == 0 and np.issubdtype(arr.dtype, np.integer):
        return [int(arr)] * length
    if arr.ndim != 1 or arr.shape[0] != length or not (
            arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{argument}: expected an int or {length} ints, got shape "
                         f"{tuple(arr.shape)} of {arr.dtype}")
    return [int(x) for x in arr]


# ---------------------------------------------------------------------------
# PagedKVCache
# ---------------------------------------------------------------------------

def _scales(value, argument: str) -> list:
    """An 8-bit cache's scale: None (none), a number, or one per KV head."""
    if value is None:
        return []
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{argument}: expected a number or one per KV head, got a bool")
    if isinstance(value, (int, float, np.integer, np.floating)):
        return [float(value)]
    try:
        arr = np.asarray(value.cpu() if hasattr(value, "cpu") else value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{argument}: expected a number or one per KV head") from None
    if arr.ndim != 1:
        raise ValueError(f"{argument}: expected a number or a 1-D array [Hkv], got shape "
                         f"{arr.shape}")
    return [float(x) for x in arr]


class PagedKVCache:
    """A paged K/V cache with PyTorch PagedAttention's vocabulary.

    K is stored as ``[heads, n_pages, page_size, head_dim]`` and V as
    ``[..., value_head_dim]`` (``k_cache`` / ``v_cache``: zero-copy NumPy
    views). ``reserve`` / ``erase`` / ``assign`` / ``fork`` follow the seed's
    allocation exactly; every operation checks all of its input first and a
    failed one changes nothing (``pagedc.Error``, a ``ValueError``).

    ``dtype="float8_e4m3fn"`` or ``"float8_e5m2"`` keeps K and V as 8-bit
    floats with ``k_scale`` / ``v_scale`` (a number, or one per KV head):
    ``assign`` takes float values and stores the code nearest to
    value / scale (round to nearest even, saturating at the format's largest
    finite value), attention reads code * scale. ``k_cache`` / ``v_cache``
    then show the codes as uint8.

    The cache also tracks each slot's *length* (one past the highest position
    ``assign`` wrote; ``fork`` copies it, ``erase`` zeroes it): the default
    ``kv_length`` of ``flex_attention``.

    Its arrays (``k_cache``, ``v_cache``, ``page_table``) are NumPy arrays,
    or torch tensors (zero-copy as well) once a torch dtype was given or
    ``assign`` was last given torch tensors: torch in, torch out.
    """

    def __init__(self, n_pages: int, page_size: int, max_batch_size: int, heads: int,
                 head_dim: int, value_head_dim: Optional[int] = None, dtype: str = "f32",
                 k_scale=None, v_scale=None, *, device: str = "cpu"):
        from ._device import device_index
        dtype_arg = dtype
        dtype = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(
            str(dtype).replace("torch.", ""), str(dtype))
        self._native = _C.KVCache(n_pages, page_size, max_batch_size, heads, head_dim,
                                  -1 if value_head_dim is None else value_head_dim, dtype,
                                  _scales(k_scale, "k_scale"), _scales(v_scale, "v_scale"),
                                  device_index(device))
        # Lengths of the slots written so far, by slot: the native cache
        # costs nothing per configured slot (max_batch_size may be 2^31), so
        # neither does this.
        self._lengths = {}
        # flex_attention's default per-batch lists, by (batch, query rows):
        # a decode loop asks for the same ones on every call until the
        # lengths change, and building them costs as much as a small call.
        # Every change of _lengths counts in _lengths_version and clears
        # them; an entry keeps the version it was built from, so one built
        # while another thread changed the lengths is never used.
        self._default_lists = {}
        # The same lists converted for the native call (_C.CallEntries), by
        # (batch, query rows, offsets at the end): flex_attention's small
        # host path passes one object instead of three lists.
        self._default_entries = {}
        self._lengths_version = 0
        # The configuration never changes; flex_attention reads it per call
        # without going through the native object's properties.
        self._heads = self._native.heads
        self._max_batch_size = self._native.max_batch_size
        self._value_head_dim = self._native.value_head_dim
        self._framework = "torch" if str(dtype_arg).startswith("torch.") else "numpy"

    # Configuration -------------------------------------------------------
    n_pages = property(lambda self: self._native.n_pages)
    page_size = property(lambda self: self._native.page_size)
    max_batch_size = property(lambda self: self._native.max_batch_size)
    heads = property(lambda self: self._native.heads)
    head_dim = property(lambda self: self._native.head_dim)
    value_head_dim = property(lambda self: self._native.value_head_dim)
    dtype = property(lambda self: self._native.dtype)
    device = property(lambda self: self._native.device)
    k_scale = property(lambda self: list(self._native.k_scale))
    v_scale = property(lambda self: list(self._native.v_scale))

    @property
    def k_cache(self):
        """The K storage [heads, n_pages, page_size, head_dim], zero-copy (NumPy
        or torch as the cache's inputs were; a pagedc.Tensor for bf16 on
        NumPy and for device caches)."""
        return self._storage(self._native.k_cache())

    @property
    def v_cache(self):
        return self._storage(self._native.v_cache())

    def _storage(self, tensor):
        if self.device != "cpu":
            return tensor
        return _host_array(np.asarray(tensor) if self.dtype != "bf16" else tensor,
                           self._framework)

    # Allocation ----------------------------------------------------------
    def _slots(self, batch_idx, argument="batch_idx") -> list:
        if isinstance(batch_idx, (int, np.integer)) and not isinstance(batch_idx, bool):
            slots = [int(batch_idx)]
        else:
            arr = np.asarray(batch_idx.cpu() if hasattr(batch_idx, "cpu") else batch_idx)
            if arr.ndim > 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
                raise ValueError(f"{argument}: expected an int or a 1-D sequence of ints")
            slots = [int(x) for x in arr.reshape(-1)]
        for s in slots:
            if s < 0 or s >= self.max_batch_size:
                raise ValueError(f"{argument}: slot {s} is out of range [0, "
                                 f"{self.max_batch_size})")
        return slots

    def reserve(self, batch_idx, seq_len) -> None:
        """Grows each slot of ``batch_idx`` to hold ``seq_len`` tokens (int or
        one per slot). All or nothing: when the pages do not suffice for the
        whole batch nothing is reserved."""
        slots = self._slots(batch_idx)
        lengths = _int_list(seq_len, "seq_len", len(slots))
        capacity = {s: self._native.capacity(s) for s in slots}
        needed = 0
        ps = self.page_size
        for s, n in zip(slots, lengths):
            if n < 0:
                raise ValueError(f"seq_len: {n} is negative")
            if n > capacity[s]:
                pages = -(-(n - capacity[s]) // ps)
                needed += pages
                capacity[s] += pages * ps
        if needed > self._native.free_page_count:
            raise Error(f"requested {needed} pages but there are only "
                        f"{self._native.free_page_count} empty pages")
        for s, n in zip(slots, lengths):
            self._native.reserve(s, n)

    def erase(self, batch_idx) -> None:
        """Releases every page of the slots (shared pages drop a reference)."""
        for s in self._slots(batch_idx):
            self._native.erase(s)
            self._lengths.pop(s, None)
            self._lengths_changed()

    def assign(self, batch_idx, input_pos, k_val, v_val) -> None:
        """Writes ``k_val`` [B, H, S, D] / ``v_val`` [B, H, S, Dv] for slots
        ``batch_idx`` [B] at positions ``input_pos`` [B, S] (copy-on-write on
        shared pages). The GIL is released while copying."""
        slots = self._slots(batch_idx)
        if isinstance(batch_idx, (int, np.integer)):
            batch_idx = np.asarray([batch_idx], dtype=np.int32)
        elif not hasattr(batch_idx, "__dlpack__"):
            batch_idx = np.asarray(batch_idx, dtype=np.int32)
        if not hasattr(input_pos, "__dlpack__"):
            input_pos = np.asarray(input_pos, dtype=np.int32)
        self._native.assign(batch_idx, input_pos, k_val, v_val)
        if _framework_of(k_val) in ("torch", "numpy"):
            self._framework = _framework_of(k_val)
        pos = np.from_dlpack(input_pos) if not isinstance(input_pos, np.ndarray) else input_pos
        pos = np.asarray(pos).reshape(len(slots), -1)
        for b, s in enumerate(slots):
            if pos.shape[1]:
                self._lengths[s] = max(self._lengths.get(s, 0), int(pos[b].max()) + 1)
        self._lengths_changed()

    def fork(self, src: int, dst: int, length: Optional[int] = None) -> None:
        """Makes empty slot ``dst`` share the first ``length`` tokens of
        ``src`` (default: src's length); full pages are shared, a last partial
        page is copied."""
        if length is None:
            length = self._lengths.get(src, 0)
        self._native.fork(int(src), int(dst), int(length))
        self._lengths[dst] = int(length)
        self._lengths_changed()

    def _lengths_changed(self) -> None:
        self._lengths_version += 1
        self._default_lists.clear()
        self._default_entries.clear()

    def _entries(self, batch: int, q_len: int, end: bool):
        """The native form of ``_defaults(batch, q_len)`` with the offsets
        at the end (``end``) or 0, or None when ``q_offset="end"`` does not
        fit a slot (the general path names the entry)."""
        key = (batch, q_len, end)
        version = self._lengths_version
        entry = self._default_entries.get(key)
        if entry is not None and entry[0] == version:
            return entry[1]
        slots, lengths, offsets = self._defaults(batch, q_len)
        if not end:
            offsets = [0] * batch
        native = None if offsets is None else _C.CallEntries(slots, lengths, offsets)
        if len(self._default_entries) >= 64:
            self._default_entries.clear()
        self._default_entries[key] = (version, native)
        return native

    def _defaults(self, batch: int, q_len: int) -> tuple:
        """flex_attention's lists for batch entries 0..batch-1 reading their
        slots' lengths: (slots, lengths, q_offset="end" offsets); the
        offsets are None when a slot is shorter than q_len (the caller
        names the entry). Shared between calls: nobody may change them."""
        key = (batch, q_len)
        version = self._lengths_version
        entry = self._default_lists.get(key)
        if entry is not None and entry[0] == version:
            return entry[1]
        if batch > self._max_batch_size:
            raise ValueError(f"q: a batch of {batch} but the cache has "
                             f"{self._max_batch_size} slots")
        known = self._lengths
        lengths = [known.get(s, 0) for s in range(batch)]
        offsets = [n - q_len for n in lengths]
        if any(o < 0 for o in offsets):
            offsets = None
        lists = (list(range(batch)), lengths, offsets)
        if len(self._default_lists) >= 64:
            self._default_lists.clear()
        self._default_lists[key] = (version, lists)
        return lists

    # Queries ------------------------------------------------------------
    def capacity(self, slot: int) -> int:
        return self._native.capacity(slot)

    def seq_len(self, slot: int) -> int:
        """The slot's length: one past the highest position written."""
        if not 0 <= slot < self.max_batch_size:
            raise ValueError(f"slot: {slot} is out of range [0, {self.max_batch_size})")
        return self._lengths.get(slot, 0)

    @property
    def free_pages(self) -> list:
        """The free list (its tail is the next page reserve hands out)."""
        return self._native.free_pages

    @property
    def page_table(self):
        """[max_batch_size, n_pages] int32, -1 padded, as in the seed."""
        return _host_array(np.asarray(self._native.dense_page_table(
            list(range(self.max_batch_size)), self.n_pages)), self._framework)

    def page_table_row(self, slot: int) -> list:
        return self._native.page_table_row(slot)

    def physical_to_logical(self, slot: int, page: int) -> int:
        return self._native.physical_to_logical(slot, page)

    def page_ref_count(self, page: int) -> int:
        return self._native.page_ref_count(page)

    def convert_logical_block_mask(self, block_mask: "BlockMask", batch_idx=None,
                                   kv_len=None) -> "BlockMask":
        """The seed's convert_logical_block_mask: with BLOCK_SIZE == page_size
        the result's indices are physical pages; otherwise they stay logical
        and ``page_table`` carries the rows to translate with. The result
        has ``page_table`` and ``physical_indices`` attributes."""
        if not isinstance(block_mask, BlockMask):
            raise ValueError("block_mask: expected a pagedc.BlockMask")
        slots = [] if batch_idx is None else self._slots(batch_idx)
        lengths = [] if kv_len is None else _int_list(kv_len, "kv_len", len(slots) or
                                                       block_mask._native.batch)
        native, pages, table = _C.convert_logical_block_mask(self._native, block_mask._native,
                                                             slots, lengths)
        out = BlockMask(native, block_mask._mods, block_mask._buffers, block_mask._params,
                        block_mask._framework)
        out.page_table = _host_array(np.asarray(table), block_mask._framework)
        out.physical_indices = pages
        return out

    def __repr__(self):
        return (f"pagedc.PagedKVCache(n_pages={self.n_pages}, page_size={self.page_size}, "
                f"max_batch_size={self.max_batch_size}, heads={self.heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype})")


# ---------------------------------------------------------------------------
# Block masks
# ---------------------------------------------------------------------------

class BlockMask:
    """FlexAttention's BlockMask: per (batch, head, q block), the partial
    (``kv_indices``) and full (``full_kv_indices``) kv blocks; indices are
    logical kv block numbers.

    Its index arrays are NumPy arrays, or torch tensors (zero-copy) when the
    mask was made from torch's vocabulary: a Python mask_mod or
    ``from_torch`` mods given to ``create_block_mask``, torch tensors given
    to ``from_kv_blocks``, or torch's own BlockMask."""

    def __init__(self, native, mods=None, buffers=None, params=None, framework="numpy"):
        self._native = native
        self._framework = framework
        self._mods = mods
        self._buffers = buffers or {}
        self._params = params or {}
        self.page_table = None
        self.physical_indices = bool(native.physical_indices)

    def _array(self, tensor):
        return None if tensor is None else _host_array(np.asarray(tensor), self._framework)

    kv_num_blocks = property(lambda self: self._array(self._native.kv_num_blocks()))
    kv_indices = property(lambda self: self._array(self._native.kv_indices()))
    full_kv_num_blocks = property(lambda self: self._array(self._native.full_kv_num_blocks()))
    full_kv_indices = property(lambda self: self._array(self._native.full_kv_indices()))

    @property
    def BLOCK_SIZE(self):
        return (self._native.q_block_size, self._native.kv_block_size)

    @property
    def seq_lengths(self):
        return (self._native.q_length, self._native.kv_length)

    @property
    def shape(self):
        return (self._native.batch, self._native.heads, self._native.q_length,
                self._native.kv_length)

    @property
    def first_q_block(self) -> int:
        return self._native.first_q_block

    def to_dense(self) -> np.ndarray:
        """The element mask [B, H, Q_LEN, KV_LEN] (bool): full blocks true,
        partial blocks through the mask mod."""
        native_mods = self._mods._native if self._mods is not None else None
        buffers, params = (self._mods._bindings(self._buffers, self._params)
                           if self._mods is not None else ({}, {}))
        dense = np.asarray(self._native.to_dense(native_mods, buffers, params)).astype(bool)
        return _host_array(dense, self._framework)

    def to_dense_blocks(self):
        """Block classes [B, H, q blocks, kv blocks]: 0 skipped, 1 partial, 2 full."""
        return _host_array(np.asarray(self._native.dense_blocks()), self._framework)

    def sparsity(self) -> float:
        """Percentage of blocks skipped."""
        dense = np.asarray(self._native.dense_blocks())
        return 100.0 * float((dense == 0).sum()) / max(dense.size, 1)

    @classmethod
    def from_kv_blocks(cls, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
                       full_kv_indices=None, BLOCK_SIZE=128, seq_lengths=None) -> "BlockMask":
        """A mask from block lists (FlexAttention's BlockMask.from_kv_blocks):
        ``kv_num_blocks`` [B, H, q blocks], ``kv_indices`` [B, H, q blocks,
        max kv blocks], int32. Every count and index is checked."""
        q_block, kv_block = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) \
            else BLOCK_SIZE
        num = np.ascontiguousarray(np.asarray(kv_num_blocks), dtype=np.int32)
        idx = np.ascontiguousarray(np.asarray(kv_indices), dtype=np.int32)
        if num.ndim != 3 or idx.ndim != 4 or idx.shape[:3] != num.shape:
            raise ValueError("kv_num_blocks / kv_indices: expected shapes [B, H, Q] and "
                             f"[B, H, Q, K], got {num.shape} and {idx.shape}")
        full_num = None if full_kv_num_blocks is None else np.ascontiguousarray(
            np.asarray(full_kv_num_blocks), dtype=np.int32)
        full_idx = None if full_kv_indices is None else np.ascontiguousarray(
            np.asarray(full_kv_indices), dtype=np.int32)
        if (full_num is None) != (full_idx is None):
            raise ValueError("full_kv_num_blocks / full_kv_indices: give both or neither")
        if full_idx is not None and full_idx.shape != idx.shape:
            raise ValueError(f"full_kv_indices: shape {full_idx.shape} differs from "
                             f"kv_indices' {idx.shape}")
        framework = "torch" if _framework_of(kv_num_blocks) == "torch" else "numpy"
        if seq_lengths is None:
            seq_lengths = (num.shape[2] * q_block, idx.shape[3] * kv_block)
        native = _C.block_mask_from_kv_blocks(num, idx, full_num, full_idx, num.shape[0],
                                              num.shape[1], idx.shape[3], int(seq_lengths[0]),
                                              int(seq_lengths[1]), int(q_block), int(kv_block))
        return cls(native, framework=framework)

    def __repr__(self):
        return (f"pagedc.BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, "
                f"sparsity={self.sparsity():.2f}%)")


def create_block_mask(mask_mod, B: Optional[int], H: Optional[int], Q_LEN: int, KV_LEN: int,
                      device: str = "cpu", BLOCK_SIZE=128, *, buffers=None, params=None,
                      q_begin: int = 0) -> BlockMask:
    """FlexAttention's create_block_mask. ``mask_mod`` is compiled mods
    (``pagedc.compile`` / ``pagedc.from_torch``) or a Python mask_mod, which is
    traced with ``from_torch``. ``B`` / ``H`` None broadcast (extent 1).
    ``q_begin`` > 0 builds only the rows from that query position on (a decode
    step's mask). The GIL is released while building."""
    if device not in ("cpu", None) and not str(device).startswith("cpu"):
        raise ValueError(f"device: block masks are built on the host; got '{device}'")
    if not isinstance(mask_mod, CompiledMods) and callable(mask_mod):
        from ._tracer import from_torch
        mask_mod = from_torch(mask_mod=mask_mod)
    mods = _native_mods(mask_mod)
    from ._tracer import TracedMods
    framework = "torch" if isinstance(mods, TracedMods) and "torch" in sys.modules else "numpy"
    q_block, kv_block = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else BLOCK_SIZE
    merged, params = mods._bindings(buffers, params)
    native = _C.create_block_mask(mods._native, merged, params, 1 if B is None else int(B),
                                  1 if H is None else int(H), int(q_begin), int(Q_LEN),
                                  int(KV_LEN), int(q_block), int(kv_block))
    return BlockMask(native, mods, buffers, params, framework)


# ---------------------------------------------------------------------------
# flex_attention
# ---------------------------------------------------------------------------

def _dense_keys(k, v) -> tuple:
    """Host k [B, Hkv, S, D] and v [B, Hkv, S, Dv] as the runtime reads them
    in place. NumPy arrays with a negative stride (which DLPack cannot
    describe) are copied into contiguous arrays first."""
    for name, tensor, dims in (("k", k, "D"), ("v", v, "Dv")):
        if not isinstance(tensor, np.ndarray) and not hasattr(tensor, "__dlpack__"):
            raise ValueError(f"{name}: expected a tensor with __dlpack__, got "
                             f"{type(tensor).__name__}")
        where = tensor_device_index(tensor)
        if where >= 0:
            raise ValueError(f"{name}: is on {device_label(where)} but q is on cpu")
        shape = getattr(tensor, "shape", None)
        if shape is None or len(shape) != 4:
            got = "no shape" if shape is None else f"shape {list(shape)}"
            raise ValueError(f"{name}: expected [B, H, S, {dims}], got {got}")
    if isinstance(k, np.ndarray) and any(stride < 0 for stride in k.strides):
        k = np.ascontiguousarray(k)
    if isinstance(v, np.ndarray) and any(stride < 0 for stride in v.strides):
        v = np.ascontiguousarray(v)
    return k, v


def _contiguous_cache(k, v, device: int = -1, stream: int = 0) -> tuple:
    """k [B, H, S, D] / v [B, H, S, Dv] copied into a fresh cache on the
    call's device (-1: the host, else that CUDA device; k and v must be on
    it, asked for on `stream`)."""
    from ._device import device_label, tensor_device_index
    for name, tensor in (("k", k), ("v", v)):
        where = tensor_device_index(tensor)
        if where != device:
            raise ValueError(f"{name}: is on {device_label(where)} but q is on "
                             f"{device_label(device)}")
    on_device = None if device < 0 else stream
    kt = _C.Tensor.from_dlpack(k, on_device) if not isinstance(k, _C.Tensor) else k
    vt = _C.Tensor.from_dlpack(v, on_device) if not isinstance(v, _C.Tensor) else v
    if len(kt.shape) != 4:
        raise ValueError(f"k: expected [B, H, S, D], got shape {list(kt.shape)}")
    if len(vt.shape) != 4:
        raise ValueError(f"v: expected [B, H, S, Dv], got shape {list(vt.shape)}")
    b, h, s, d = kt.shape
    if vt.shape[:3] != (b, h, s):
        raise ValueError(f"v: shape {list(vt.shape)} does not match k's {list(kt.shape)} in "
                         "batch, heads and length")
    if kt.dtype != vt.dtype:
        raise ValueError(f"v: dtype {vt.dtype} differs from k's {kt.dtype}")
    if kt.dtype not in ("f32", "f16", "bf16"):
        raise ValueError(f"k: expected float32, float16 or bfloat16, got {kt.dtype}")
    page = 1
    while page < min(max(s, 1), 1024):
        page *= 2
    pages = max(b * -(-s // page), 1)
    cache = PagedKVCache(pages, page, max(b, 1), h, d, vt.shape[3], kt.dtype,
                         device=device_label(device))
    if s > 0 and b > 0:
        cache.reserve(list(range(b)), s)
        pos = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy()
        cache.assign(np.arange(b, dtype=np.int32), pos, kt, vt)
    return cache, s


#: The names flex_attention's ``kernel_options`` takes (pagedc/KernelOptions.h).
KERNEL_OPTIONS = ("prefill_shape", "prefill_persistent", "prefill_persistent_ctas",
                  "prefill_tile_counter", "prefill_tma", "prefill_tma_runs", "prefill_pingpong",
                  "decode_split_factor", "decode_splits", "decode_merge_chunks", "decode_tma",
                  "decode_tma_runs", "link_mods")


def _kernel_option_texts(kernel_options) -> dict:
    """``kernel_options`` as the NAME -> VALUE text the runtime's parser takes.

    Names and value types are checked here so that the error names the
    Python key; the runtime's parser checks the values themselves.
    """
    if kernel_options is None:
        return {}
    if not isinstance(kernel_options, Mapping):
        raise ValueError("kernel_options: expected a dict of option names to values, got "
                         f"{type(kernel_options).__name__}")
    texts = {}
    for name, value in kernel_options.items():
        if name not in KERNEL_OPTIONS:
            raise ValueError(f"kernel_options: unknown option {name!r}; the options are "
                             + ", ".join(KERNEL_OPTIONS))
        if value is None:
            texts[name] = ""
        elif isinstance(value, bool):
            texts[name] = "1" if value else "0"
        elif isinstance(value, int):
            texts[name] = str(value)
        elif isinstance(value, str):
            texts[name] = value
        else:
            raise ValueError(f"kernel_options[{name!r}]: expected a bool, int, str or None, "
                             f"got {type(value).__name__} {value!r}")
    return texts


def flex_attention(q, cache_or_k, v=None, block_mask: Optional[BlockMask] = None, mods=None,
                   buffers: Optional[Mapping] = None, params: Optional[Mapping] = None,
                   scale: Optional[float] = None, enable_gqa: bool = False,
                   return_lse: bool = False, q_offset=None, *, kv_length=None, batch_idx=None,
                   out=None, threads: int = 0, kernel_options: Optional[Mapping] = None,
                   score_mod=None, mask_mod=None, return_aux=None, stream=None, sinks=None):
    """softmax(score_mod(scale * q.k) masked) . v, as torch's flex_attention.

    ``q`` [B, Hq, L, D]. ``cache_or_k`` is a ``PagedKVCache`` (``v`` None;
    batch entry b reads slot ``batch_idx[b]``, default b, up to
    ``kv_length[b]``, default the slot's length) or a key tensor
    [B', Hkv, S, D] with ``v`` [B', Hkv, S, Dv] (batch entry b reads k's
    entry ``batch_idx[b]``, default b, up to ``kv_length[b]``, default S).
    On the CPU the key and value tensors are read where they lie, with no
    copy, whatever their strides (a transposed view too; a unit last stride
    and float32 are the fastest); NumPy arrays with a negative stride are
    copied first. On CUDA they are copied into a temporary cache (the CUDA
    kernels read compact pages). ``q_offset`` (int, one per batch entry, or ``"end"`` =
    kv_length - L; default 0) is the position of q's first row: a decode step
    passes ``"end"``. ``mods`` are compiled mods (``compile`` /
    ``from_torch``), ``buffers`` / ``params`` their launch values. Hq != Hkv
    needs ``enable_gqa=True``. Returns ``out`` [B, Hq, L, Dv] (and ``lse``
    [B, Hq, L] float32 with ``return_lse``), as NumPy arrays for NumPy input,
    torch tensors for torch input, zero-copy. The GIL is released while the
    attention runs. Bad input raises ``ValueError`` (``pagedc.Error``) and
    writes nothing.

    ``sinks`` (gpt-oss's attention sinks): a float32 tensor [Hq] on q's
    device. Query head h's softmax gains one key of logit ``sinks[h]`` (in
    the units of the scores after scale and score mod) whose value is zero:
    out = sum_j p_j v_j / (sum_j exp(s_j) + exp(sinks[h])) and lse includes
    it; a fully masked row gives out 0 and lse ``sinks[h]``; -inf means no
    sink for that head and NaN gives NaN rows. The CPU backend and every
    CUDA kernel compute it.

    ``kernel_options`` (CUDA) picks the kernel and its launch: a dict of
    ``KERNEL_OPTIONS`` names to values (``prefill_shape``: a str such as
    ``"128x64x64"``; ``decode_split_factor``, ``decode_splits``,
    ``decode_merge_chunks`` and ``prefill_persistent_ctas``: ints; ``link_mods``: a bool or ``"first"``; the others: bools; a str is
    taken as ``pagedc run --kernel-option`` takes it; None: the runtime
    decides, as when absent).
    docs/kernels.md, "Kernel options", says what each changes. An unknown
    name or a bad value raises ``ValueError`` listing the valid ones. The
    ``PAGEDC_*`` environment variables of these settings do not apply here.

    CUDA memory (a ``pagedc.Tensor`` from ``to_device`` / ``empty`` on
    ``device="emu"`` or ``"cuda:N"``, or any DLPack CUDA tensor): q, k, v,
    buffers and ``out`` are read in place on q's device, producers are asked
    for their data on the call's stream (``__dlpack__(stream=...)``):
    ``stream`` (a CUstream handle or an object with ``cuda_stream``), else
    torch's current stream for torch tensors, else the legacy default
    stream. The mods need CUDA code (``compile(..., cuda=True)``); results
    are device tensors of q's framework.

    torch's vocabulary works as it is: ``score_mod=`` / ``mask_mod=`` Python
    functions (traced once per code and captured values), a function as the
    fourth positional argument (torch's ``score_mod`` place), torch's
    ``BlockMask`` as ``block_mask`` (its mask_mod applies in partial blocks)
    and ``return_aux=AuxRequest(lse=True)`` (returns ``(out, AuxOutput)``).
    Inside ``torch.compile`` the key/value tensor form runs as the custom op
    ``torch.ops.pagedc.flex_attention``, with no graph break.
    """
    if _T.torch_compiling():
        return _T.compiled_flex_attention(
            q, cache_or_k, v, block_mask, mods, buffers, params, scale, enable_gqa, return_lse,
            score_mod, mask_mod, return_aux,
            dict(q_offset=q_offset, kv_length=kv_length, batch_idx=batch_idx, out=out,
                 kernel_options=kernel_options), sinks)
    if type(cache_or_k) is PagedKVCache and v is None and block_mask is None and \
            type(mods) is CompiledMods and buffers is None and params is None and \
            scale is None and not return_lse and kv_length is None and batch_idx is None and \
            kernel_options is None and score_mod is None and mask_mod is None and \
            return_aux is None and stream is None and sinks is None and \
            not mods.bound_buffers and (q_offset is None or type(q_offset) is str):
        # A small host call with defaults (a decode step) costs little more
        # than its Python overhead, so it is taken here, past the general
        # path's argument handling; anything unusual goes on below.
        result = _host_fast_path(q, cache_or_k, mods, enable_gqa, q_offset, out, threads)
        if result is not _NOT_TAKEN:
            return result
    if block_mask is not None and callable(block_mask) and \
            not isinstance(block_mask, BlockMask) and not _T.is_torch_block_mask(block_mask):
        # torch's positional order: (q, k, v, score_mod, block_mask, scale,
        # enable_gqa, return_lse), which lands in pagedc's (block_mask, mods,
        # buffers, params, scale).
        if score_mod is not None:
            raise ValueError("score_mod: given twice (as the fourth argument and by name)")
        score_mod, block_mask = block_mask, None
        if mods is not None and (isinstance(mods, BlockMask) or _T.is_torch_block_mask(mods)):
            block_mask, mods = mods, None
        if isinstance(buffers, (int, float)) and not isinstance(buffers, bool):
            scale, buffers = float(buffers), None
        if isinstance(params, bool):
            enable_gqa, params = params, None
        if isinstance(scale, bool):
            return_lse, scale = scale, None
        if isinstance(enable_gqa, Mapping):
            if kernel_options is not None:
                raise ValueError("kernel_options: given twice (by position and by name)")
            kernel_options, enable_gqa = enable_gqa, False
    if block_mask is not None and _T.is_torch_block_mask(block_mask):
        block_mask, torch_mask_mod = _T.convert_block_mask(block_mask)
        if mask_mod is None:
            mask_mod = torch_mask_mod
    if score_mod is not None or mask_mod is not None:
        if mods is not None:
            raise ValueError("mods: give compiled mods or score_mod= / mask_mod= functions, "
                             "not both")
        for name, fn in (("score_mod", score_mod), ("mask_mod", mask_mod)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{name}: expected a function, got {type(fn).__name__}")
        mods = _T.traced_mods(score_mod, mask_mod)
    if return_aux is not None:
        if return_lse:
            raise ValueError("return_lse: give return_lse or return_aux, not both")
        result, lse = flex_attention(q, cache_or_k, v, block_mask, mods, buffers, params, scale,
                                     enable_gqa, True, q_offset, kv_length=kv_length,
                                     batch_idx=batch_idx, out=out, threads=threads,
                                     kernel_options=kernel_options, stream=stream, sinks=sinks)
        return result, _T.aux_output(lse, return_aux)
    framework = _FRAMEWORK_OF_TYPE.get(type(q)) or _framework_of(q)
    if framework != "numpy" and not hasattr(q, "__dlpack__"):
        raise ValueError(f"q: expected a tensor with __dlpack__, got {type(q).__name__}")
    kernel_texts = {} if kernel_options is None else _kernel_option_texts(kernel_options)
    if type(mods) is not CompiledMods:
        mods = _native_mods(mods)
    device = -1 if framework == "numpy" or (framework == "torch" and q.is_cpu) \
        else tensor_device_index(q)
    stream = call_stream(stream, q) if device >= 0 else 0
    if device >= 0 and not mods.has_cuda:
        raise ValueError("mods: q is in CUDA memory but the mods have no CUDA code; compile "
                         "them with pagedc.compile(..., cuda=True)")
    dense = None
    if isinstance(cache_or_k, PagedKVCache):
        if v is not None:
            raise ValueError("v: must be None when cache_or_k is a PagedKVCache")
        cache = cache_or_k
        default_length = None
        kv_heads = cache._heads
    elif v is None:
        raise ValueError("v: required when cache_or_k is a key tensor")
    elif device < 0:
        dense = _dense_keys(cache_or_k, v)
        cache = None
        kv_heads, default_length = int(dense[0].shape[1]), int(dense[0].shape[2])
    else:
        cache, default_length = _contiguous_cache(cache_or_k, v, device, stream)
        kv_heads = cache._heads
    q_shape = q.shape
    if not isinstance(q_shape, tuple):  # NumPy's and torch's shapes are tuples
        q_shape = tuple(q_shape)
    if len(q_shape) != 4:
        raise ValueError(f"q: expected [B, Hq, L, D], got shape {list(q_shape)}")
    batch, q_heads, q_len = int(q_shape[0]), int(q_shape[1]), int(q_shape[2])
    if q_heads != kv_heads and not enable_gqa:
        raise ValueError(f"q: {q_heads} heads but the keys have {kv_heads}; pass "
                         "enable_gqa=True for grouped-query attention")
    end_offsets = None
    if batch_idx is None and kv_length is None and default_length is None:
        slots, lengths, end_offsets = cache._defaults(batch, q_len)
    else:
        if batch_idx is None:
            slots = list(range(batch))
        elif dense is not None:
            slots = _int_list(batch_idx, "batch_idx", batch)
        else:
            slots = cache._slots(batch_idx)
            if len(slots) != batch:
                raise ValueError(f"batch_idx: {len(slots)} slots for a batch of {batch}")
        if kv_length is None:
            if default_length is not None:
                lengths = [default_length] * batch
            else:
                if batch > cache._max_batch_size:
                    raise ValueError(f"q: a batch of {batch} but the cache has "
                                     f"{cache._max_batch_size} slots")
                known = cache._lengths
                lengths = [known.get(s, 0) for s in slots]
        else:
            lengths = _int_list(kv_length, "kv_length", batch)
    if q_offset is None:
        offsets = [0] * batch
    elif isinstance(q_offset, str):
        if q_offset != "end":
            raise ValueError(f"q_offset: expected an int, ints or 'end', got '{q_offset}'")
        offsets = end_offsets
        if offsets is None:
            offsets = [n - q_len for n in lengths]
            for b, o in enumerate(offsets):
                if o < 0:
                    raise ValueError(f"q_offset='end': batch entry {b} has {q_len} query rows "
                                     f"but kv_length {lengths[b]}")
    else:
        offsets = _int_list(q_offset, "q_offset", batch)
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise ValueError("block_mask: expected a pagedc.BlockMask (create_block_mask)")
    if buffers is None and params is None and not mods.bound_buffers:
        merged, params = {}, {}
    else:
        merged, params = mods._bindings(buffers, params)
    if framework == "torch" and device < 0:
        return _torch_host_call(q, cache, dense, block_mask, mods, merged, params, slots,
                                lengths, offsets, scale, return_lse, out, threads, kernel_texts,
                                sinks)
    native_mask = None if block_mask is None else block_mask._native
    native_scale = None if scale is None else float(scale)
    if dense is not None:
        result, lse = _C.flex_attention_dense(q, dense[0], dense[1], native_mask, mods._native,
                                              merged, params, slots, lengths, offsets,
                                              native_scale, bool(return_lse), out, None,
                                              int(threads), kernel_texts, sinks, False)
    else:
        result, lse = _C.flex_attention(q, cache._native, native_mask, mods._native, merged,
                                        params, slots, lengths, offsets, native_scale,
                                        bool(return_lse), out, None, int(threads), kernel_texts,
                                        device, stream, sinks)
    result = _to_framework(result, framework)
    if return_lse:
        return result, _to_framework(lse, framework)
    return result


_TORCH = None
_TORCH_FROM_CAPSULE = None
_TORCH_TO_DLPACK = None
_NOT_TAKEN = object()


def _host_fast_path(q, cache, mods, enable_gqa, q_offset, out, threads):
    """flex_attention for a host q (NumPy, or torch once torch has been
    seen) on a cache with default lists, or _NOT_TAKEN when the call needs
    the general path (another framework or device, a q_offset other than
    "end" or None, grouped heads without enable_gqa, an out that is not of
    q's kind, a slot shorter than q). The native call checks the rest as
    on the general path."""
    framework = _FRAMEWORK_OF_TYPE.get(type(q))
    if framework == "torch":
        if _TORCH is None or not q.is_cpu:
            return _NOT_TAKEN
    elif framework != "numpy":
        return _NOT_TAKEN
    if out is not None and type(out) is not type(q):
        return _NOT_TAKEN
    if q_offset is not None and q_offset != "end":
        return _NOT_TAKEN
    shape = q.shape
    if len(shape) != 4 or (shape[1] != cache._heads and not enable_gqa):
        return _NOT_TAKEN
    entries = cache._entries(shape[0], shape[2], q_offset is not None)
    if entries is None or type(threads) is not int:
        return _NOT_TAKEN
    if framework == "torch":
        to_dlpack = _TORCH_TO_DLPACK
        if out is None:
            return _TORCH_FROM_CAPSULE(_C.flex_attention_host(
                to_dlpack(q), cache._native, mods._native, entries, None, threads, True))
        if not out.is_cpu:
            return _NOT_TAKEN
        _C.flex_attention_host(to_dlpack(q), cache._native, mods._native, entries,
                               to_dlpack(out), threads, True)
        return out
    result = _C.flex_attention_host(q, cache._native, mods._native, entries, out, threads,
                                    False)
    return result if out is not None else _to_framework(result, "numpy")


def _torch_host_call(q, cache, dense, block_mask, mods, merged, params, slots, lengths,
                     offsets, scale, return_lse, out, threads, kernel_texts, sinks):
    """The native call for torch tensors in host memory. torch's own
    ``Tensor.__dlpack__`` costs several microseconds in Python (it negotiates
    streams and versions), ``to_dlpack`` a fraction of one, and for a small
    decode step that is most of the call. The outputs the runtime makes come
    back as DLPack capsules, which torch imports in less time than
    ``torch.empty`` parses its arguments."""
    global _TORCH, _TORCH_FROM_CAPSULE, _TORCH_TO_DLPACK
    torch = _TORCH
    if torch is None:
        import torch
        # torch.utils.dlpack.from_dlpack reaches _from_dlpack after a failed
        # attribute lookup on the capsule; the C function takes it directly.
        _TORCH_FROM_CAPSULE = getattr(torch._C, "_from_dlpack", None) or \
            torch.utils.dlpack.from_dlpack
        _TORCH_TO_DLPACK = torch.utils.dlpack.to_dlpack
        _TORCH = torch
    to_dlpack = torch.utils.dlpack.to_dlpack
    Tensor = torch.Tensor
    native_q = to_dlpack(q) if isinstance(q, Tensor) and not q.is_cuda else q
    native_out = out if out is None else \
        to_dlpack(out) if isinstance(out, Tensor) and not out.is_cuda else out
    native_sinks = sinks if sinks is None else \
        to_dlpack(sinks) if isinstance(sinks, Tensor) and not sinks.is_cuda else sinks
    native_mask = None if block_mask is None else block_mask._native
    native_scale = None if scale is None else float(scale)
    if dense is not None:
        k, v = (to_dlpack(t) if isinstance(t, Tensor) else t for t in dense)
        result, lse = _C.flex_attention_dense(
            native_q, k, v, native_mask, mods._native, merged, params, slots, lengths, offsets,
            native_scale, bool(return_lse), native_out, None, int(threads), kernel_texts,
            native_sinks, True)
    else:
        result, lse = _C.flex_attention_dlpack(
            native_q, cache._native, native_mask, mods._native, merged, params, slots, lengths,
            offsets, native_scale, bool(return_lse), native_out, None, int(threads),
            kernel_texts, -1, 0, native_sinks, True)
    result = out if out is not None else _TORCH_FROM_CAPSULE(result)
    return (result, _TORCH_FROM_CAPSULE(lse)) if return_lse else result
