"""CUDA memory from Python: devices, streams and pagedc-owned device tensors.

    x = pagedc.to_device(np_array, device="emu")   # a pagedc.Tensor in CUDA memory
    y = pagedc.empty((4, 8), "f16", device="emu")
    host = pagedc.to_host(x)                       # a NumPy array (a copy)

``device="emu"`` is CUDA device 0 of the SIMT emulator's driver
(docs/emulator.md): the same runtime path as a GPU, run on the CPU. Device
tensors export DLPack as CUDA memory (``__dlpack_device__() == (2, index)``)
and are read in place by ``flex_attention`` and ``BatchAttention``.
"""
from __future__ import annotations

import os
import re

import numpy as np

from . import _pagedc as _C

#: DLPack's device type of CUDA memory (kDLCUDA).
_DL_CUDA = 2


def _driver(name: str):
    """(emulated, library) of the process's CUDA driver; ValueError naming
    `device` when there is none."""
    available, emulated, info = _C.cuda_driver_info()
    if not available:
        raise ValueError(f"device: '{name}' needs a CUDA driver: {info}")
    return emulated, info


def device_index(device) -> int:
    """The CUDA device index `device` names ("emu", "cuda", "cuda:N", a
    torch.device), or -1 for "cpu". The process has one CUDA driver, loaded
    at its first CUDA use: "emu" then selects the SIMT emulator's driver
    (PAGEDC_CUDA_DRIVER=emu), and a process that loaded another cannot
    switch."""
    name = str(device)
    if name == "cpu":
        return -1
    if name == "emu":
        if not os.environ.get("PAGEDC_CUDA_DRIVER"):
            os.environ["PAGEDC_CUDA_DRIVER"] = "emu"
        emulated, library = _driver(name)
        if not emulated:
            raise ValueError(f"device: 'emu' needs the SIMT emulator's driver, but this "
                             f"process loaded {library} (the driver is chosen once per "
                             "process: by the first CUDA use or PAGEDC_CUDA_DRIVER)")
        return 0
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if not match:
        raise ValueError(f"device: expected 'cpu', 'emu', 'cuda' or 'cuda:N', got {device!r}")
    _driver(name)
    return int(match.group(1) or 0)


def tensor_device_index(obj) -> int:
    """The CUDA device index of a DLPack tensor, or -1 for host memory."""
    if getattr(obj, "is_cpu", False) is True:
        return -1  # a torch host tensor: its __dlpack_device__ costs a microsecond
    if isinstance(obj, _C.Tensor):
        kind, index = obj.__dlpack_device__()
    elif hasattr(obj, "__dlpack_device__") and not isinstance(obj, np.ndarray):
        kind, index = obj.__dlpack_device__()
    else:
        return -1
    return int(index) if int(kind) == _DL_CUDA else -1


def device_label(index: int) -> str:
    return "cpu" if index < 0 else f"cuda:{index}"


def call_stream(stream, *tensors) -> int:
    """The CUstream a device call enqueues on: `stream` (a handle, or an
    object with ``cuda_stream``: torch.cuda.Stream, pagedc.Stream), else
    torch's current stream for torch CUDA tensors, else 0 (the legacy default
    stream)."""
    if stream is not None:
        handle = getattr(stream, "cuda_stream", stream)
        if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
            raise ValueError(f"stream: expected a CUstream handle (int) or a stream object, "
                             f"got {type(stream).__name__}")
        return int(handle)
    for tensor in tensors:
        if type(tensor).__module__.startswith("torch") and getattr(tensor, "is_cuda", False):
            import torch
            return int(torch.cuda.current_stream(tensor.device).cuda_stream)
    return 0


def empty(shape, dtype: str = "f32", device: str = "emu") -> "_C.Tensor":
    """A new tensor in CUDA memory (contents undefined): ``shape`` a sequence
    of sizes, ``dtype`` "f32", "f16", "bf16", "int32", ... ."""
    index = device_index(device)
    if index < 0:
        raise ValueError("device: pagedc.empty allocates CUDA memory ('emu' or 'cuda:N'); "
                         "use NumPy for host memory")
    return _C.empty([int(s) for s in shape], str(dtype), index)


def to_device(array, device: str = "emu") -> "_C.Tensor":
    """A copy of a host tensor (NumPy array, torch CPU tensor, anything with
    __dlpack__ in host memory; made contiguous first) in CUDA memory."""
    index = device_index(device)
    if index < 0:
        raise ValueError("device: to_device copies into CUDA memory ('emu' or 'cuda:N')")
    if isinstance(array, np.ndarray) and not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return _C.to_device(array, index)


def to_host(tensor) -> np.ndarray:
    """A NumPy copy of a tensor in CUDA memory (a pagedc.Tensor or any DLPack
    CUDA tensor), after the work that writes it has finished. bf16, which
    NumPy has no type for, comes back as a host pagedc.Tensor
    (torch.from_dlpack reads it)."""
    host = _C.to_host(tensor)
    return host if host.dtype == "bf16" else np.asarray(host)


class Stream:
    """A CUDA stream of pagedc's own, for callers without a framework that
    has streams: ``flex_attention(..., stream=s)`` / ``BatchAttention.run(...,
    stream=s)`` enqueue on it; ``cuda_stream`` is its CUstream handle."""

    def __init__(self, device: str = "emu"):
        index = device_index(device)
        if index < 0:
            raise ValueError("device: a Stream is on a CUDA device ('emu' or 'cuda:N')")
        self._native = _C.Stream(index)

    cuda_stream = property(lambda self: self._native.cuda_stream)
    device = property(lambda self: self._native.device)

    def synchronize(self) -> None:
        self._native.synchronize()

    def __repr__(self):
        return f"pagedc.Stream(device={self.device!r}, cuda_stream={self.cuda_stream:#x})"


class CudaGraph:
    """A CUDA graph captured from a ``pagedc.Stream`` (torch.cuda.CUDAGraph's
    shape): ``capture_begin(stream)``, the calls whose device work is
    captured (not run), ``capture_end()``, then ``replay()`` as often as
    needed; each replay reads the device memory the capture saw. While
    capturing, the driver refuses allocation, host copies and
    synchronisation, so pass ``out=`` (``BatchAttention.run`` captures;
    ``plan()`` and ``flex_attention``, which wait, do not)."""

    def __init__(self):
        self._native = _C.CudaGraph()

    def capture_begin(self, stream: Stream) -> None:
        if not isinstance(stream, Stream):
            raise ValueError(f"stream: expected a pagedc.Stream, got {type(stream).__name__}")
        self._native.capture_begin(stream._native)

    def capture_end(self) -> None:
        self._native.capture_end()

    def replay(self) -> None:
        self._native.replay()
