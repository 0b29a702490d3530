"""pagedc.from_torch: FlexAttention mask_mod / score_mod Python functions to .attn.

The functions are called once with proxy objects in place of (score, b, h,
q_idx, kv_idx). Every operation on a proxy appends a ``let`` binding to the
mod's body, so the emitted .attn program is the straight-line computation
the function performed. Captured arrays and tensors (closure variables and
globals the functions read, NumPy or PyTorch) become ``buffer`` declarations
bound automatically at call time; Python numbers become literals.

Plain Python operators work without PyTorch; torch functions (torch.where,
torch.exp, ...) are intercepted through ``__torch_function__`` when PyTorch is
installed. Anything else raises ``TraceError`` naming the operation and the
user's source line.
"""
from __future__ import annotations

import builtins
import linecache
import math
import os
import sys
import types
from typing import Callable, Optional

import numpy as np

from ._api import CompiledMods, compile as _compile

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))

_KEYWORDS = {"const", "param", "buffer", "mask", "score", "let", "true", "false", "inf",
             "and", "or", "not"}
_BUILTINS = {"abs", "min", "max", "clamp", "exp", "exp2", "log", "log2", "sqrt", "rsqrt",
             "sin", "cos", "tan", "tanh", "sigmoid", "tanh_approx", "floor", "ceil", "round",
             "where", "float", "int"}
_RESERVED = _KEYWORDS | _BUILTINS | {"s", "b", "h", "q_idx", "kv_idx", "mask_mod", "score_mod"}


class TraceError(Exception):
    """A mod function used something the tracer cannot express in .attn.

    ``op`` names the operation and ``location`` is "file:line" of the user's
    code (``source_line`` its text) when known."""

    def __init__(self, op: str, detail: str = "", location: Optional[str] = None,
                 source_line: Optional[str] = None):
        self.op = op
        self.location = location
        self.source_line = source_line
        text = f"pagedc.from_torch: unsupported operation {op}"
        if detail:
            text += f": {detail}"
        if location:
            text += f"\n  at {location}"
            if source_line:
                text += f": {source_line.strip()}"
        super().__init__(text)


def _user_frame():
    frame = sys._getframe(1)
    torch_dir = None
    mod = sys.modules.get("torch")
    if mod is not None and getattr(mod, "__file__", None):
        torch_dir = os.path.dirname(os.path.abspath(mod.__file__))
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_PKG_DIR) and not (torch_dir and name.startswith(torch_dir)):
            return frame
        frame = frame.f_back
    return None


def _fail(op: str, detail: str = ""):
    frame = _user_frame()
    if frame is None:
        raise TraceError(op, detail)
    file, line = frame.f_code.co_filename, frame.f_lineno
    raise TraceError(op, detail, f"{file}:{line}", linecache.getline(file, line))


# ---------------------------------------------------------------------------
# The trace
# ---------------------------------------------------------------------------

class _Trace:
    def __init__(self):
        self.lines: list = []
        self.counter = 0
        self.buffers: dict = {}  # id(obj) -> _Buffer
        self.names: dict = {}    # id(obj) -> the variable name it was captured as
        self.used_names: set = set()

    def let(self, code: str, typ: str) -> "Proxy":
        if self.counter >= _MAX_OPERATIONS:
            _fail("trace length", f"the mods' trace passed {_MAX_OPERATIONS} operations; a "
                  "Python loop inside a mod is unrolled, so it must be short and bounded")
        name = f"_{self.counter}"
        self.counter += 1
        self.lines.append(f"let {name} = {code}")
        return Proxy(name, typ, self)

    def buffer_for(self, obj, name_hint: Optional[str] = None) -> "_Buffer":
        key = id(obj)
        if key in self.buffers:
            return self.buffers[key]
        name = self._buffer_name(name_hint or self.names.get(key) or "buf")
        buf = _Buffer(obj, name, self)
        self.buffers[key] = buf
        return buf

    def _buffer_name(self, hint: str) -> str:
        name = "".join(c if (c.isascii() and (c.isalnum() or c == "_")) else "_" for c in hint)
        if not name or name[0].isdigit() or name.startswith("_"):
            name = "buf" + name
        if name in _RESERVED:
            name = name + "_buf"
        base, n = name, 1
        while name in self.used_names:
            name = f"{base}{n}"
            n += 1
        self.used_names.add(name)
        return name


_ACTIVE: list = []  # the trace in progress (tracing is not reentrant across threads)

# A mod is a straight-line computation, so a Python loop in it is unrolled
# by the trace. Both bounds turn a loop that would run (nearly) forever into
# an error instead of a hang or an ever-growing program.
_MAX_OPERATIONS = 20000  # let bindings in one trace
_MAX_UNROLL = 1024       # entries of a captured tensor iterated over


def _elem_type(obj) -> tuple:
    """(.attn element type, proxy type) of a captured array or tensor."""
    dtype = str(getattr(obj, "dtype", "")).replace("torch.", "")
    table = {"int32": ("i32", "int"), "int64": ("i64", "int"), "float32": ("f32", "float"),
             "float64": ("f32", "float"), "float16": ("f16", "float"),
             "bfloat16": ("bf16", "float"), "bool": ("bool", "bool")}
    if dtype not in table:
        _fail("buffer capture", f"captured tensor of dtype {dtype} (pagedc buffers are int32, "
              "int64, float32, float64 (read as float32), float16, bfloat16 or bool)")
    return table[dtype]


def _is_tensor(obj) -> bool:
    if isinstance(obj, np.ndarray):
        return True
    t = type(obj)
    return t.__module__.startswith("torch") and t.__name__ in ("Tensor", "Parameter")


class _Buffer:
    """A captured array or tensor standing in during the trace."""

    def __init__(self, obj, name: str, trace: _Trace):
        self.obj = obj
        self.name = name
        self.trace = trace
        self.shape = tuple(int(d) for d in obj.shape)
        if not 1 <= len(self.shape) <= 4:
            _fail("buffer capture", f"captured tensor '{name}' has rank {len(self.shape)}; "
                  "pagedc buffers have rank 1 to 4")
        self.elem, self.type = _elem_type(obj)

    def decl(self) -> str:
        return f"buffer {self.name}: {self.elem}[{', '.join('?' for _ in self.shape)}]"

    def __getitem__(self, index):
        return _Index(self, ())[index]

    def __iter__(self):
        return _Index(self, ()).__iter__()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("ndim", "dtype", "device"):
            return getattr(self.obj, name)
        if name == "size":
            return lambda dim=None: self.shape if dim is None else self.shape[dim]
        _fail(f"'{self.name}.{name}'", "only indexing of captured tensors is supported")

    def __len__(self):
        return self.shape[0]


class _Index:
    """A partly indexed buffer (``buf[i][j]``)."""

    def __init__(self, buffer: _Buffer, indices: tuple):
        self.buffer = buffer
        self.indices = indices

    def __getitem__(self, index):
        items = index if isinstance(index, tuple) else (index,)
        codes = list(self.indices)
        for item in items:
            dim = len(codes)
            if dim >= len(self.buffer.shape):
                _fail("indexing", f"too many indices for '{self.buffer.name}' of rank "
                      f"{len(self.buffer.shape)}")
            codes.append(_index_code(item, self.buffer.shape[dim], self.buffer.name, dim))
        if len(codes) < len(self.buffer.shape):
            return _Index(self.buffer, tuple(codes))
        return self.buffer.trace.let(f"{self.buffer.name}[{', '.join(codes)}]",
                                     self.buffer.type)

    def __iter__(self):
        # Iterating a tensor yields its entries along the next dimension, as
        # in torch: unrolled here, so only for a bounded number of them.
        dim = len(self.indices)
        size = self.buffer.shape[dim]
        if size > _MAX_UNROLL:
            _fail(f"iteration over captured tensor '{self.buffer.name}'",
                  f"dimension {dim} has {size} entries; a mod unrolls at most {_MAX_UNROLL}")
        return iter([self[i] for i in range(size)])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _fail(f"'.{name}' of a partly indexed buffer",
              f"'{self.buffer.name}' needs {len(self.buffer.shape)} indices")


def _index_code(item, size: int, name: str = "", dim: int = 0) -> str:
    if isinstance(item, Proxy):
        if item._type != "int":
            _fail("indexing", f"an index must be an integer, got {item._type}")
        return item._code
    if isinstance(item, (bool, np.bool_)):
        _fail("indexing", "boolean index")
    if isinstance(item, (int, np.integer)):
        i = int(item)
        if not -size <= i < size:
            # torch raises for a constant index out of range; so does the trace.
            _fail("indexing", f"index {i} is out of range for dimension {dim} of captured "
                  f"tensor '{name}' (size {size})")
        if i < 0:
            i += size  # Python's negative indexing, resolved at trace time
        return str(i)
    if _is_tensor(item) and getattr(item, "ndim", 1) == 0:
        return _index_code(item.item(), size, name, dim)
    _fail("indexing", f"index of type {type(item).__name__} (slices, tensors and None are "
          "not supported; index with the mod's arguments or ints)")


# ---------------------------------------------------------------------------
# Proxies
# ---------------------------------------------------------------------------

def _literal(value) -> tuple:
    """(code, type) of a Python number or bool."""
    if isinstance(value, (bool, np.bool_)):
        return ("true" if value else "false"), "bool"
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if not -(2 ** 31) < v < 2 ** 31:
            _fail("constant", f"the int {v} does not fit in int32")
        return (str(v) if v >= 0 else f"(-{-v})"), "int"
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if math.isnan(v):
            _fail("constant", "NaN constants are not supported")
        if math.isinf(v):
            return ("inf" if v > 0 else "(-inf)"), "float"
        text = repr(v)
        return (text if v >= 0 else f"(-{text[1:]})"), "float"
    if _is_tensor(value) and getattr(value, "ndim", None) == 0:
        return _literal(value.item())
    _fail("constant", f"a value of type {type(value).__name__} inside a mod")


def _operand(x) -> tuple:
    if isinstance(x, Proxy):
        return x._code, x._type
    if isinstance(x, _Buffer):
        _fail(f"use of captured tensor '{x.name}' as a value", "index it first")
    if isinstance(x, _Index):
        _fail(f"use of partly indexed '{x.buffer.name}' as a value",
              f"it needs {len(x.buffer.shape)} indices")
    if _is_tensor(x) and getattr(x, "ndim", 0) != 0:
        buf = _ACTIVE[-1].buffer_for(x)
        _fail(f"use of captured tensor '{buf.name}' as a value", "index it with the mod's "
              "arguments")
    return _literal(x)


def _trace() -> _Trace:
    return _ACTIVE[-1]


def _as_number(code: str, typ: str) -> tuple:
    return (f"int({code})", "int") if typ == "bool" else (code, typ)


def _common(ta: str, tb: str) -> str:
    return "float" if "float" in (ta, tb) else "int"


def _arith(op: str, a, b):
    (ca, ta), (cb, tb) = _operand(a), _operand(b)
    ca, ta = _as_number(ca, ta)
    cb, tb = _as_number(cb, tb)
    typ = "float" if op == "/" else _common(ta, tb)
    return _trace().let(f"{ca} {op} {cb}", typ)


def _compare(op: str, a, b):
    (ca, ta), (cb, tb) = _operand(a), _operand(b)
    if (ta == "bool") != (tb == "bool"):
        ca, ta = _as_number(ca, ta)
        cb, tb = _as_number(cb, tb)
    if ta == "bool" and op not in ("==", "!="):
        ca, cb = f"int({ca})", f"int({cb})"
    return _trace().let(f"{ca} {op} {cb}", "bool")


def _bitwise(op: str, a, b):
    (ca, ta), (cb, tb) = _operand(a), _operand(b)
    if "float" in (ta, tb):
        _fail(f"'{op}' on floating-point values")
    if ta == "bool" and tb == "bool":
        return _trace().let(f"{ca} {op} {cb}", "bool")
    ca, _ = _as_number(ca, ta)
    cb, _ = _as_number(cb, tb)
    return _trace().let(f"{ca} {op} {cb}", "int")


def _call(name: str, *args, typ: Optional[str] = None):
    ops = [_operand(a) for a in args]
    if typ is None:
        numeric = [t for _, t in ops]
        typ = "float" if "float" in numeric else "int"
    codes = [c if (typ == "bool" or t != "bool") else f"int({c})" for c, t in ops]
    return _trace().let(f"{name}({', '.join(codes)})", typ)


def _unary_float(name: str):
    return lambda x: _call(name, x, typ="float")


def _same_type(name: str):
    def fn(x):
        code, typ = _operand(x)
        if typ == "bool":
            _fail(f"{name} of a bool")
        return _trace().let(f"{name}({code})", typ)
    return fn


def _where(cond, a, b):
    (cc, tc) = _operand(cond)
    if tc != "bool":
        cc = f"{cc} != 0"
    (ca, ta), (cb, tb) = _operand(a), _operand(b)
    if ta == "bool" and tb == "bool":
        typ = "bool"
    else:
        ca, ta = _as_number(ca, ta)
        cb, tb = _as_number(cb, tb)
        typ = _common(ta, tb)
    return _trace().let(f"where({cc}, {ca}, {cb})", typ)


def _clamp(x, min=None, max=None):  # noqa: A002 - torch's names
    if min is None and max is None:
        _fail("clamp", "needs min or max")
    if min is not None and max is not None:
        return _call("clamp", x, min, max)
    if min is not None:
        return _call("max", x, min)
    return _call("min", x, max)


def _logical_not(x):
    code, typ = _operand(x)
    if typ != "bool":
        code = f"{code} != 0"
    return _trace().let(f"not ({code})", "bool")


def _to_bool(x):
    code, typ = _operand(x)
    return x if typ == "bool" else _trace().let(f"{code} != 0", "bool")


def _convert(x, dtype):
    name = str(dtype).replace("torch.", "")
    code, typ = _operand(x)
    if name in ("float32", "float", "float64", "double", "float16", "half", "bfloat16"):
        return _trace().let(f"float({code})", "float")
    if name in ("int32", "int", "int64", "long", "int16", "int8"):
        return _trace().let(f"int({code})", "int")
    if name == "bool":
        return _to_bool(x)
    _fail(f"conversion to {name}")


def _new_constant(value):
    def fn(self, *size, dtype=None, **kwargs):
        name = str(dtype).replace("torch.", "") if dtype is not None else self._type
        if name in ("bool",):
            return Proxy("true" if value else "false", "bool", _trace())
        if name.startswith("float") or name in ("half", "double", "bfloat16"):
            return Proxy(f"{float(value)!r}", "float", _trace())
        return Proxy(str(int(value)), "int", _trace())
    return fn


class Proxy:
    """A traced value: ``_code`` is its .attn expression, ``_type`` one of
    "bool", "int", "float"."""

    __slots__ = ("_code", "_type", "_trace_ref")
    __array_priority__ = 10000  # NumPy scalars on the left defer to us

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        # NumPy ufuncs (np.tanh(x), np.where's operands, numpy scalar + x).
        handler = _NUMPY_UFUNCS.get(ufunc.__name__) if method == "__call__" else None
        if handler is None or kwargs:
            _fail(f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}"))
        return handler(*inputs)

    def __array_function__(self, func, types_, args, kwargs):
        handler = _NUMPY_FUNCTIONS.get(func.__name__)
        if handler is None:
            _fail(f"numpy.{func.__name__}")
        return handler(*args, **kwargs)

    def __init__(self, code: str, typ: str, trace: _Trace):
        self._code = code
        self._type = typ
        self._trace_ref = trace

    # Arithmetic
    __add__ = lambda a, b: _arith("+", a, b)  # noqa: E731
    __radd__ = lambda a, b: _arith("+", b, a)  # noqa: E731
    __sub__ = lambda a, b: _arith("-", a, b)  # noqa: E731
    __rsub__ = lambda a, b: _arith("-", b, a)  # noqa: E731
    __mul__ = lambda a, b: _arith("*", a, b)  # noqa: E731
    __rmul__ = lambda a, b: _arith("*", b, a)  # noqa: E731
    __truediv__ = lambda a, b: _arith("/", a, b)  # noqa: E731
    __rtruediv__ = lambda a, b: _arith("/", b, a)  # noqa: E731
    __floordiv__ = lambda a, b: _arith("//", a, b)  # noqa: E731
    __rfloordiv__ = lambda a, b: _arith("//", b, a)  # noqa: E731
    __mod__ = lambda a, b: _arith("%", a, b)  # noqa: E731
    __rmod__ = lambda a, b: _arith("%", b, a)  # noqa: E731
    __pow__ = lambda a, b: _arith("**", a, b)  # noqa: E731
    __rpow__ = lambda a, b: _arith("**", b, a)  # noqa: E731

    def __neg__(self):
        code, typ = _as_number(self._code, self._type)
        return _trace().let(f"-{code}", typ)

    def __pos__(self):
        return self

    def __abs__(self):
        return _same_type("abs")(self)

    # Comparisons
    __lt__ = lambda a, b: _compare("<", a, b)  # noqa: E731
    __le__ = lambda a, b: _compare("<=", a, b)  # noqa: E731
    __gt__ = lambda a, b: _compare(">", a, b)  # noqa: E731
    __ge__ = lambda a, b: _compare(">=", a, b)  # noqa: E731
    __eq__ = lambda a, b: _compare("==", a, b)  # noqa: E731
    __ne__ = lambda a, b: _compare("!=", a, b)  # noqa: E731
    __hash__ = object.__hash__

    # Logic / bits
    __and__ = lambda a, b: _bitwise("&", a, b)  # noqa: E731
    __rand__ = lambda a, b: _bitwise("&", b, a)  # noqa: E731
    __or__ = lambda a, b: _bitwise("|", a, b)  # noqa: E731
    __ror__ = lambda a, b: _bitwise("|", b, a)  # noqa: E731
    __xor__ = lambda a, b: _bitwise("^", a, b)  # noqa: E731
    __rxor__ = lambda a, b: _bitwise("^", b, a)  # noqa: E731
    __lshift__ = lambda a, b: _bitwise("<<", a, b)  # noqa: E731
    __rshift__ = lambda a, b: _bitwise(">>", a, b)  # noqa: E731

    def __invert__(self):
        return _trace().let(f"~{self._code}", self._type if self._type != "float" else
                            _fail("'~' on a floating-point value"))

    # Things a traced value cannot be
    def __bool__(self):
        _fail("Python control flow on a traced value (if / and / or / not / chained "
              "comparison / bool())", "use torch.where, &, | and ~ instead")

    def __index__(self):
        _fail("use of a traced value as a Python int (range, list index, int())",
              "only captured tensors can be indexed by the mod's arguments")

    __int__ = __index__

    def __float__(self):
        _fail("float() of a traced value", "use .float() or x * 1.0")

    def __iter__(self):
        _fail("iteration over a traced value")

    def __len__(self):
        _fail("len() of a traced value")

    def __getitem__(self, index):
        _fail("indexing of a mod argument", "only captured tensors can be indexed")

    # Tensor methods
    exp = _unary_float("exp")
    exp2 = _unary_float("exp2")
    log = _unary_float("log")
    log2 = _unary_float("log2")
    sqrt = _unary_float("sqrt")
    rsqrt = _unary_float("rsqrt")
    sin = _unary_float("sin")
    cos = _unary_float("cos")
    tan = _unary_float("tan")
    tanh = _unary_float("tanh")
    sigmoid = _unary_float("sigmoid")
    abs = _same_type("abs")
    floor = _same_type("floor")
    ceil = _same_type("ceil")
    round = _same_type("round")
    clamp = _clamp
    clip = _clamp
    float = lambda self: _convert(self, "float32")  # noqa: E731
    int = lambda self: _convert(self, "int32")  # noqa: E731
    long = lambda self: _convert(self, "int64")  # noqa: E731
    bool = lambda self: _convert(self, "bool")  # noqa: E731
    to = lambda self, dtype=None, *a, **k: _convert(self, dtype) if dtype is not None else self  # noqa: E731,E501
    logical_not = _logical_not
    logical_and = lambda a, b: _bitwise("&", _to_bool(a), _to_bool(b))  # noqa: E731
    logical_or = lambda a, b: _bitwise("|", _to_bool(a), _to_bool(b))  # noqa: E731
    minimum = lambda a, b: _call("min", a, b)  # noqa: E731
    maximum = lambda a, b: _call("max", a, b)  # noqa: E731
    new_ones = _new_constant(1)
    new_zeros = _new_constant(0)

    def new_full(self, size, fill_value, dtype=None, **kwargs):
        code, typ = _literal(fill_value)
        return Proxy(code, typ, _trace())

    @property
    def dtype(self):
        torch = sys.modules.get("torch")
        if torch is not None:
            return {"bool": torch.bool, "int": torch.int32, "float": torch.float32}[self._type]
        return {"bool": np.bool_, "int": np.int32, "float": np.float32}[self._type]

    shape = ()
    ndim = 0
    device = "cpu"

    def __repr__(self):
        return f"<pagedc traced {self._type} {self._code}>"

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        handler = _TORCH_FUNCTIONS.get(name)
        if name == "__getitem__" and args and _is_tensor(args[0]):
            return _trace().buffer_for(args[0])[args[1]]
        if name == "__get__" and getattr(func, "__self__", None) is not None:
            owner = getattr(func.__self__, "__name__", "")
            if owner in ("dtype", "shape", "device", "ndim"):
                return getattr(args[0], owner)
        if handler is None:
            _fail(f"torch.{name}")
        return handler(*args, **kwargs)


def _rev(fn):
    return lambda a, b: fn(b, a)


_TORCH_FUNCTIONS = {
    "where": _where,
    "exp": Proxy.exp, "exp2": Proxy.exp2, "log": Proxy.log, "log2": Proxy.log2,
    "sqrt": Proxy.sqrt, "rsqrt": Proxy.rsqrt, "sin": Proxy.sin, "cos": Proxy.cos,
    "tan": Proxy.tan, "tanh": Proxy.tanh, "sigmoid": Proxy.sigmoid,
    "abs": _same_type("abs"), "floor": _same_type("floor"), "ceil": _same_type("ceil"),
    "round": _same_type("round"),
    "clamp": _clamp, "clip": _clamp,
    "minimum": lambda a, b: _call("min", a, b), "maximum": lambda a, b: _call("max", a, b),
    "logical_and": Proxy.logical_and, "logical_or": Proxy.logical_or,
    "logical_not": _logical_not, "bitwise_not": lambda x: ~x,
    "bitwise_and": lambda a, b: _bitwise("&", a, b), "bitwise_or": lambda a, b: _bitwise("|", a, b),
    "add": lambda a, b, alpha=1: _arith("+", a, b if alpha == 1 else _arith("*", b, alpha)),
    "sub": lambda a, b, alpha=1: _arith("-", a, b if alpha == 1 else _arith("*", b, alpha)),
    "mul": lambda a, b: _arith("*", a, b), "div": lambda a, b, rounding_mode=None:
        _arith("//" if rounding_mode == "floor" else "/", a, b),
    "floor_divide": lambda a, b: _arith("//", a, b), "remainder": lambda a, b: _arith("%", a, b),
    "eq": lambda a, b: _compare("==", a, b), "ne": lambda a, b: _compare("!=", a, b),
    "lt": lambda a, b: _compare("<", a, b), "le": lambda a, b: _compare("<=", a, b),
    "gt": lambda a, b: _compare(">", a, b), "ge": lambda a, b: _compare(">=", a, b),
    "neg": lambda x: -x,
    "to": lambda x, dtype=None, *a, **k: _convert(x, dtype) if dtype is not None else x,
    "float": lambda x: _convert(x, "float32"), "int": lambda x: _convert(x, "int32"),
    "long": lambda x: _convert(x, "int64"), "bool": lambda x: _convert(x, "bool"),
    "new_ones": lambda x, *a, **k: Proxy.new_ones(x, *a, **k),
    "new_zeros": lambda x, *a, **k: Proxy.new_zeros(x, *a, **k),
}
_NUMPY_UFUNCS = {
    "add": lambda a, b: _arith("+", a, b), "subtract": lambda a, b: _arith("-", a, b),
    "multiply": lambda a, b: _arith("*", a, b), "true_divide": lambda a, b: _arith("/", a, b),
    "divide": lambda a, b: _arith("/", a, b), "floor_divide": lambda a, b: _arith("//", a, b),
    "remainder": lambda a, b: _arith("%", a, b), "power": lambda a, b: _arith("**", a, b),
    "negative": lambda x: -x, "absolute": _same_type("abs"), "invert": lambda x: ~x,
    "less": lambda a, b: _compare("<", a, b), "less_equal": lambda a, b: _compare("<=", a, b),
    "greater": lambda a, b: _compare(">", a, b),
    "greater_equal": lambda a, b: _compare(">=", a, b),
    "equal": lambda a, b: _compare("==", a, b), "not_equal": lambda a, b: _compare("!=", a, b),
    "bitwise_and": lambda a, b: _bitwise("&", a, b), "bitwise_or": lambda a, b: _bitwise("|", a, b),
    "bitwise_xor": lambda a, b: _bitwise("^", a, b),
    "logical_and": lambda a, b: _bitwise("&", _to_bool(a), _to_bool(b)),
    "logical_or": lambda a, b: _bitwise("|", _to_bool(a), _to_bool(b)),
    "logical_not": _logical_not,
    "minimum": lambda a, b: _call("min", a, b), "maximum": lambda a, b: _call("max", a, b),
    "exp": _unary_float("exp"), "exp2": _unary_float("exp2"), "log": _unary_float("log"),
    "log2": _unary_float("log2"), "sqrt": _unary_float("sqrt"), "sin": _unary_float("sin"),
    "cos": _unary_float("cos"), "tan": _unary_float("tan"), "tanh": _unary_float("tanh"),
    "floor": _same_type("floor"), "ceil": _same_type("ceil"), "rint": _same_type("round"),
}
_NUMPY_FUNCTIONS = {"where": _where, "clip": lambda x, a_min=None, a_max=None: _clamp(x, a_min,
                                                                                       a_max)}

for _dunder, _op in (("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"),
                     ("floordiv", "//"), ("mod", "%"), ("pow", "**")):
    _TORCH_FUNCTIONS[f"__{_dunder}__"] = (lambda op: lambda a, b: _arith(op, a, b))(_op)
    _TORCH_FUNCTIONS[f"__r{_dunder}__"] = (lambda op: lambda a, b: _arith(op, b, a))(_op)
for _dunder, _op in (("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="), ("eq", "=="),
                     ("ne", "!=")):
    _TORCH_FUNCTIONS[f"__{_dunder}__"] = (lambda op: lambda a, b: _compare(op, a, b))(_op)
for _dunder, _op in (("and", "&"), ("or", "|"), ("xor", "^")):
    _TORCH_FUNCTIONS[f"__{_dunder}__"] = (lambda op: lambda a, b: _bitwise(op, a, b))(_op)
    _TORCH_FUNCTIONS[f"__r{_dunder}__"] = (lambda op: lambda a, b: _bitwise(op, b, a))(_op)
_TORCH_FUNCTIONS["__invert__"] = lambda x: ~x
_TORCH_FUNCTIONS["__neg__"] = lambda x: -x
_TORCH_FUNCTIONS["__abs__"] = _same_type("abs")


# ---------------------------------------------------------------------------
# Captured variables
# ---------------------------------------------------------------------------

def _substitute(fn, trace: _Trace, depth: int = 0):
    """A copy of `fn` whose captured arrays / tensors (closure cells and the
    globals it reads) are _Buffer stand-ins, recursively for the functions it
    captures. Other callables are returned unchanged."""
    if depth > 8 or not isinstance(fn, types.FunctionType):
        return fn

    def replace(name, value):
        if _is_tensor(value):
            if getattr(value, "ndim", 1) == 0:
                return value.item()
            trace.names.setdefault(id(value), name)
            return trace.buffer_for(value, name)
        if isinstance(value, types.FunctionType):
            return _substitute(value, trace, depth + 1)
        if isinstance(value, (tuple, list)) and any(isinstance(v, types.FunctionType)
                                                     for v in value):
            return type(value)(replace(name, v) for v in value)
        return value

    closure = None
    if fn.__closure__:
        cells = []
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                cells.append(types.CellType(replace(name, cell.cell_contents)))
            except ValueError:  # an empty cell
                cells.append(cell)
        closure = tuple(cells)
    new_globals = fn.__globals__
    captured = {n: fn.__globals__[n] for n in fn.__code__.co_names if n in fn.__globals__}
    replaced = {n: replace(n, v) for n, v in captured.items()}
    if any(replaced[n] is not captured[n] for n in captured):
        new_globals = dict(fn.__globals__)
        new_globals.update(replaced)
    copy = types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, closure)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def _trace_mod(fn: Callable, kind: str, trace: _Trace) -> list:
    start = len(trace.lines)
    traced = _substitute(fn, trace)
    b, h = Proxy("b", "int", trace), Proxy("h", "int", trace)
    q, kv = Proxy("q_idx", "int", trace), Proxy("kv_idx", "int", trace)
    _ACTIVE.append(trace)
    try:
        if kind == "mask":
            result = traced(b, h, q, kv)
        else:
            result = traced(Proxy("s", "float", trace), b, h, q, kv)
        code, typ = _operand(result)
    finally:
        _ACTIVE.pop()
    if kind == "mask" and typ != "bool":
        raise TraceError("mask_mod result", f"a mask_mod must return a boolean, got {typ}")
    if kind == "score" and typ == "bool":
        raise TraceError("score_mod result", "a score_mod must return a number, got a bool")
    body = trace.lines[start:]
    del trace.lines[start:]
    return body + [code]


def _describe(fn) -> str:
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    if code is None:
        return name
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


class TracedMods(CompiledMods):
    """Compiled mods traced from Python functions: ``source`` is the generated
    .attn program and ``bound_buffers`` the captured tensors by buffer name
    (bound on every flex_attention / create_block_mask call)."""

    def __repr__(self):
        return (f"pagedc.TracedMods(mask={self.mask!r}, score={self.score!r}, "
                f"buffers={sorted(self.bound_buffers)})")


def trace_source(mask_mod: Optional[Callable] = None,
                 score_mod: Optional[Callable] = None) -> tuple:
    """The .attn source of the functions and the captured buffers, without
    compiling: (source, {buffer name: captured tensor})."""
    if mask_mod is None and score_mod is None:
        raise ValueError("from_torch: give mask_mod, score_mod or both")
    for arg, fn in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{arg}: expected a function, got {type(fn).__name__}")
    trace = _Trace()
    items = []
    if mask_mod is not None:
        body = _trace_mod(mask_mod, "mask", trace)
        items.append(f"# from {_describe(mask_mod)}\nmask mask_mod(b, h, q_idx, kv_idx) {{\n" +
                     "".join(f"  {line}\n" for line in body) + "}\n")
    if score_mod is not None:
        body = _trace_mod(score_mod, "score", trace)
        items.append(f"# from {_describe(score_mod)}\n"
                     "score score_mod(s, b, h, q_idx, kv_idx) {\n" +
                     "".join(f"  {line}\n" for line in body) + "}\n")
    header = "# Generated by pagedc.from_torch\n"
    decls = "".join(buf.decl() + "\n" for buf in trace.buffers.values())
    source = header + decls + "\n".join(items)
    return source, {buf.name: buf.obj for buf in trace.buffers.values()}


def from_torch(mask_mod: Optional[Callable] = None, score_mod: Optional[Callable] = None,
               cuda: bool = False) -> TracedMods:
    """Traces FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` and/or
    ``score_mod(score, b, h, q_idx, kv_idx)`` Python functions into .attn
    (``.source``) and compiles it. Captured tensors become buffers bound
    automatically at call time (the live objects: later in-place updates are
    seen); Python numbers become constants. Raises ``TraceError`` for an
    unsupported operation (naming it and the user's source line)."""
    source, buffers = trace_source(mask_mod, score_mod)
    compiled = _compile(source, mask="mask_mod" if mask_mod is not None else None,
                        score="score_mod" if score_mod is not None else None, cuda=cuda)
    traced = TracedMods(compiled._native, source, "<from_torch>")
    traced.bound_buffers = buffers
    return traced


def and_masks(*mask_mods: Callable) -> Callable:
    """A mask_mod that keeps (q, kv) when every one of ``mask_mods`` does."""
    def and_mask(b, h, q_idx, kv_idx):
        result = True
        for mod in mask_mods:
            result = mod(b, h, q_idx, kv_idx) if result is True else result & mod(b, h, q_idx,
                                                                                  kv_idx)
        return result
    return and_mask


def or_masks(*mask_mods: Callable) -> Callable:
    """A mask_mod that keeps (q, kv) when any of ``mask_mods`` does."""
    def or_mask(b, h, q_idx, kv_idx):
        result = False
        for mod in mask_mods:
            result = mod(b, h, q_idx, kv_idx) if result is False else result | mod(b, h, q_idx,
                                                                                   kv_idx)
        return result
    return or_mask


del builtins
