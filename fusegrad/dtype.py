"""Data types: scalar dtypes, vector and pointer dtypes used by codegen, and the type-promotion lattice.

Python scalars are *weak*: `int_tensor + 1` stays int, `half_tensor * 2.5` stays half, `int_tensor * 2.5` becomes the
default float, as in PyTorch.
"""
from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Any, Callable, Union

from fusegrad.helpers import ContextVar

PyConst = Union[float, int, bool]
ConstType = PyConst


# every dtype made, by its fields: equal dtypes are one object (`_Interned`). A plain dict (setdefault is atomic under
# the GIL, so two compile threads can't make two copies of one dtype); dtypes are few (a pointer dtype per buffer size)
_interned: dict[tuple, "DType"] = {}


class _Interned(type):
    """Constructing a DType equal to an existing one returns that one, so equality is identity and a dtype hashes by
    identity, in C: dtypes are hashed and compared in every graph node built (the hash-consing key) and every key of
    the schedule cache, where a Python-level __hash__ was a call per node."""
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        d = super().__call__(*args, **kwargs)
        return _interned.setdefault(d._key, d)


@dataclass(frozen=True, eq=False)
class DType(metaclass=_Interned):
    """A scalar (count=1) or vector (count>1) element type. `fmt` is the struct/memoryview format, if any."""
    priority: int
    itemsize: int
    name: str
    fmt: str | None
    count: int = 1
    _scalar: "DType | None" = None

    def __post_init__(self) -> None:   # (the interning key: the class and every field)
        object.__setattr__(self, "_key", (type(self), tuple(getattr(self, f) for f in self.__dataclass_fields__)))

    # equal dtypes are one object (interned): equality is identity, the hash is object's (C-level). (__eq__ is spelled
    # out so that `dtype == np.float32` is False without asking the other side)
    def __eq__(self, other: object) -> bool: return self is other
    def __ne__(self, other: object) -> bool: return self is not other
    __hash__ = object.__hash__

    # pickled by name (`dtypes.float` loads as that very object) or rebuilt through the constructor (which interns
    # it), never with its state
    def __reduce__(self) -> tuple:
        if type(self) is DType and getattr(dtypes, self.name, None) == self: return getattr, (dtypes, self.name)
        return type(self), tuple(getattr(self, f) for f in self.__dataclass_fields__)

    def __repr__(self) -> str:
        return f"dtypes.{self.name}" if self.count == 1 else f"dtypes.{self.scalar().name}.vec({self.count})"

    def __lt__(self, other: "DType") -> bool:
        return (self.priority, self.itemsize, self.name) < (other.priority, other.itemsize, other.name)

    @property
    def base(self) -> "DType": return self

    @property
    def bitsize(self) -> int: return self.itemsize * 8

    def scalar(self) -> "DType": return self._scalar if self._scalar is not None else self

    def vec(self, sz: int) -> "DType":
        assert self.count == 1, f"can't vectorize {self} twice"
        if sz == 1: return self
        return DType(self.priority, self.itemsize * sz, f"{self.name}{sz}", None, sz, self)

    def ptr(self, size: int = -1, addrspace: str = "global") -> "PtrDType":
        return PtrDType(self.priority, self.itemsize, self.name, self.fmt, self.count, None, self, size, addrspace)

    @property
    def min(self) -> ConstType: return dtypes.min(self)

    @property
    def max(self) -> ConstType: return dtypes.max(self)


@dataclass(frozen=True, eq=False)
class PtrDType(DType):
    """A pointer to `_base` elements, in `addrspace` ('global', 'local' or 'reg'); `size` elements, -1 if unknown."""
    _base: DType | None = None
    size: int = -1
    addrspace: str = "global"

    @property
    def base(self) -> DType:
        assert self._base is not None
        return self._base

    def __repr__(self) -> str:
        return f"{self.base!r}.ptr({self.size}{', ' + repr(self.addrspace) if self.addrspace != 'global' else ''})"


# DEFAULT_FLOAT=half in the environment, or `with Context(DEFAULT_FLOAT="half"):` (a dtype name or a DType): the dtype
# Python floats and float-making ops (Tensor.rand, int_tensor / 2) get; `dtypes.default_float = ...` sets it too.
DEFAULT_FLOAT = ContextVar("DEFAULT_FLOAT", "float32")
DEFAULT_INT = ContextVar("DEFAULT_INT", "int32")   # likewise for Python ints and arange


class _DTypesMeta(type):
    """`dtypes.default_float` / `default_int` read (and assignment sets) the DEFAULT_FLOAT / DEFAULT_INT flags, so
    Context can change them."""
    @property
    def default_float(cls) -> "DType": return _named(DEFAULT_FLOAT.value, True)

    @default_float.setter
    def default_float(cls, v: "DType | str") -> None: DEFAULT_FLOAT.value = _named(v, True)

    @property
    def default_int(cls) -> "DType": return _named(DEFAULT_INT.value, False)

    @default_int.setter
    def default_int(cls, v: "DType | str") -> None: DEFAULT_INT.value = _named(v, False)


@functools.lru_cache(maxsize=None)
def _named(v: "DType | str", is_float: bool) -> "DType":
    """The float (or int) dtype `v` names; ValueError for anything else."""
    d = v if isinstance(v, DType) else getattr(dtypes, str(v).lower(), None)
    ok = isinstance(d, DType) and d.count == 1 and d not in dtypes.weaks and \
        (dtypes.is_float(d) if is_float else dtypes.is_int(d))
    if not ok:
        flag, kinds = ("DEFAULT_FLOAT", "half, bfloat16, float32, float64, ...") if is_float else \
            ("DEFAULT_INT", "int8, int16, int32, int64, uint8, ...")
        raise ValueError(f"{flag} must name a {'float' if is_float else 'integer'} dtype ({kinds}), not {v!r}")
    assert isinstance(d, DType)
    return d


class dtypes(metaclass=_DTypesMeta):
    """All dtypes as attributes (`dtypes.float32`, alias `dtypes.float`) plus helpers for classifying them."""
    void = DType(-1, 0, "void", None)
    bool = DType(0, 1, "bool", "?")
    int8 = DType(1, 1, "char", "b")
    uint8 = DType(2, 1, "uchar", "B")
    int16 = DType(3, 2, "short", "h")
    uint16 = DType(4, 2, "ushort", "H")
    int32 = DType(5, 4, "int", "i")
    uint32 = DType(6, 4, "uint", "I")
    int64 = DType(7, 8, "long", "q")
    uint64 = DType(8, 8, "ulong", "Q")
    # 8-bit floats (OCP): e4m3 ("fn": no infinities, one NaN pattern per sign, max 448) and e5m2 (IEEE-like, max
    # 57344); stored as bytes, computed in float32 and rounded back (round to nearest even), as ml_dtypes converts
    fp8e4m3 = DType(9, 1, "fp8e4m3", None)
    fp8e5m2 = DType(10, 1, "fp8e5m2", None)
    float16 = DType(11, 2, "half", "e")
    bfloat16 = DType(12, 2, "bfloat16", None)
    float32 = DType(13, 4, "float", "f")
    float64 = DType(14, 8, "double", "d")
    # weak dtypes: the type of a bare Python scalar, which yields to any strong dtype in promotion
    weakint = DType(0, 4, "weakint", "i")
    weakfloat = DType(0, 4, "weakfloat", "f")
    # aliases
    char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
    half, float, double = float16, float32, float64

    fp8s = (fp8e4m3, fp8e5m2)
    fp8_ocp = fp8s   # tinygrad's name (it also has the "fnuz" variants, which fusegrad doesn't)
    int8s, int16s, int32s, int64s = (uint8, int8), (uint16, int16), (uint32, int32), (uint64, int64)
    floats = fp8s + (float16, bfloat16, float32, float64)
    uints = (uint8, uint16, uint32, uint64)
    sints = (int8, int16, int32, int64)
    ints = sints + uints
    weaks = (weakint, weakfloat)
    all = (bool,) + ints + floats

    @staticmethod
    def is_float(x: DType) -> bool: return _kinds(x.scalar())[0]

    @staticmethod
    def is_int(x: DType) -> bool: return _kinds(x.scalar())[1]

    @staticmethod
    def is_unsigned(x: DType) -> bool: return _kinds(x.scalar())[2]

    @staticmethod
    def is_bool(x: DType) -> bool: return _kinds(x.scalar())[3]

    @staticmethod
    def from_py(x: Any) -> DType:
        """The dtype a Python value (or nested list of them) gets: float > int > bool."""
        if x.__class__ is float: return dtypes.default_float
        if x.__class__ is bool: return dtypes.bool
        if x.__class__ is int: return dtypes.default_int
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(xi) for xi in x), default=dtypes.default_float)
        if hasattr(x, "dtype") and hasattr(x, "item"): return dtypes.from_py(x.item())  # numpy scalar
        raise TypeError(f"can't infer a dtype from {type(x).__name__} {x!r}")

    @staticmethod
    def as_const(val: Any, dtype: DType) -> ConstType:
        """Convert a Python value to the Python type that represents `dtype` (wrapping ints like the hardware)."""
        if isinstance(val, tuple): return val
        d = dtype.scalar()
        if dtypes.is_bool(d): return bool(val)
        if dtypes.is_int(d):
            if isinstance(val, float) and not math.isfinite(val): return 0
            v = int(val)
            if d in dtypes.weaks: return v
            bits = d.itemsize * 8
            v &= (1 << bits) - 1
            if not dtypes.is_unsigned(d) and v >= 1 << (bits - 1): v -= 1 << bits
            return v
        return truncate_float(float(val), d)

    @staticmethod
    def min(d: DType) -> ConstType:
        if dtypes.is_int(d): return 0 if dtypes.is_unsigned(d) else -2 ** (d.itemsize * 8 - 1)
        return -math.inf if dtypes.is_float(d) else False

    @staticmethod
    def max(d: DType) -> ConstType:
        if dtypes.is_int(d): return 2 ** (d.itemsize * 8) - 1 if dtypes.is_unsigned(d) else 2 ** (d.itemsize * 8 - 1) - 1
        return math.inf if dtypes.is_float(d) else True

    @staticmethod
    def finfo(d: DType) -> tuple[int, int]:
        """(exponent bits, mantissa bits) of a float dtype."""
        table = {dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23), dtypes.float64: (11, 52),
                 dtypes.fp8e4m3: (4, 3), dtypes.fp8e5m2: (5, 2)}
        if d not in table: raise TypeError(f"finfo is only defined for float dtypes, not {d}")
        return table[d]


def _kinds(d: DType) -> tuple[bool, bool, bool, bool]:
    """(float, int, unsigned, bool) for dtype d, worked out once per dtype object and kept on it: codegen asks for every
    constant and every bounds check, and a membership test in a tuple of dtypes calls DType.__eq__ once per entry."""
    k = d.__dict__.get("_kinds")
    if k is None:
        k = (d in dtypes.floats or d == dtypes.weakfloat, d in dtypes.ints or d == dtypes.weakint, d in dtypes.uints,
             d == dtypes.bool)
        object.__setattr__(d, "_kinds", k)
    return k


def truncate_float(x: float, d: DType) -> float:
    """Round a Python float to the precision of float dtype `d` (the reference semantics of a float op)."""
    if d == dtypes.float32:
        try: return struct.unpack("f", struct.pack("f", x))[0]
        except OverflowError: return math.copysign(math.inf, x)
    if d == dtypes.float16:
        try: return struct.unpack("e", struct.pack("e", x))[0]
        except OverflowError: return math.copysign(math.inf, x)
    if d == dtypes.bfloat16:
        return bf16_to_float(float_to_bf16_bits(x))
    if d in dtypes.fp8s: return fp8_to_float(float_to_fp8(x, d), d)
    return x


# per fp8 dtype: (exponent bias, mantissa bits, largest finite value)
FP8_FORMATS: dict[DType, tuple[int, int, float]] = {dtypes.fp8e4m3: (7, 3, 448.0), dtypes.fp8e5m2: (15, 2, 57344.0)}


def float_to_fp8(x: float, dtype: DType) -> int:
    """The fp8 bit pattern of `x`, rounded to nearest even. As ml_dtypes' float8_e4m3fn: inf, NaN and values that round
    above 448 become NaN (0x7F | sign); as float8_e5m2 they become +-inf, and NaN is 0x7E | sign.

    >>> [hex(float_to_fp8(v, dtypes.fp8e4m3)) for v in (1.0, -2.5, 449.0, 1e9)]
    ['0x38', '0xc2', '0x7e', '0x7f']
    """
    bias, mbits, max_finite = FP8_FORMATS[dtype]
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x): return sign | (0x7F if dtype == dtypes.fp8e4m3 else 0x7E)
    a = abs(x)
    overflow = 0x7F if dtype == dtypes.fp8e4m3 else 0x7C
    if math.isinf(a): return sign | overflow
    min_normal = 2.0 ** (1 - bias)
    exp = max(math.frexp(a)[1] - 1, 1 - bias) if a else 1 - bias   # floor(log2 a), at least the subnormal exponent
    quantum = 2.0 ** (exp - mbits)
    r = round(a / quantum) * quantum                                # exact scaling; round() ties to even
    if r > max_finite: return sign | overflow
    if r < min_normal: return sign | int(r / 2.0 ** (1 - bias - mbits))
    m, e = math.frexp(r)                                            # r = m * 2**e, m in [0.5, 1)
    return sign | ((e - 1 + bias) << mbits) | (int(m * 2 ** (mbits + 1)) - (1 << mbits))


def fp8_to_float(b: int, dtype: DType) -> float:
    """The value of fp8 bit pattern `b` (exact in a Python float)."""
    bias, mbits, _ = FP8_FORMATS[dtype]
    ebits = 7 - mbits
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
    if dtype == dtypes.fp8e4m3 and (b & 0x7F) == 0x7F: return math.copysign(math.nan, sign)  # NaN keeps its sign
    if dtype == dtypes.fp8e5m2 and e == 31: return math.copysign(math.nan if m else math.inf, sign)
    if e == 0: return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)


def float_to_bf16_bits(x: float) -> int:
    """Round-to-nearest-even float -> bfloat16 bit pattern."""
    if math.isnan(x): return 0x7FC0
    try: u = struct.unpack("I", struct.pack("f", x))[0]
    except OverflowError: u = 0x7F800000 if x > 0 else 0xFF800000
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def bf16_to_float(b: int) -> float:
    return struct.unpack("f", struct.pack("I", (b & 0xFFFF) << 16))[0]


DTYPES_DICT: dict[str, DType] = {k: v for k, v in dtypes.__dict__.items() if isinstance(v, DType) and k not in ("void",)
                                 and not k.startswith("weak") and not k.startswith("default")}
INVERSE_DTYPES_DICT: dict[str, str] = {v.name: k for k, v in DTYPES_DICT.items() if k == v.name or k not in
                                       ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half",
                                        "float", "double")}
DTypeLike = Union[str, DType]


class UnknownDTypeError(TypeError, AttributeError):
    """A dtype name that doesn't exist: a TypeError (torch's type) and an AttributeError (tinygrad's, which looks the
    name up on `dtypes`), so porting code that catches either keeps working."""


# numpy / ml_dtypes / torch spellings of our dtypes
_FOREIGN_NAMES = {"float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2", "float8_e4m3": "fp8e4m3"}


def to_dtype(x: Any) -> DType:
    """`dtypes.float32` from `dtypes.float32`, `'float32'` or `'float'` (also numpy/torch dtypes and the Python types
    bool, int, float); a clear error otherwise.

    >>> to_dtype("half"), to_dtype(float), to_dtype("float8_e4m3fn")
    (dtypes.half, dtypes.float, dtypes.fp8e4m3)
    """
    if isinstance(x, DType): return x
    if x is bool: return dtypes.bool
    if x is int: return dtypes.default_int
    if x is float: return dtypes.default_float
    if isinstance(x, str) and x in DTYPES_DICT: return DTYPES_DICT[x]
    # numpy / torch dtype objects
    name = str(x).replace("torch.", "")
    name = _FOREIGN_NAMES.get(name, name)
    if name in DTYPES_DICT: return DTYPES_DICT[name]
    raise UnknownDTypeError(f"unknown dtype {x!r}; valid names: {sorted(DTYPES_DICT)}")


# promotion lattice among strong dtypes: each dtype lists the dtypes directly above it
_promo_lattice: dict[DType, list[DType]] = {
    dtypes.bool: [dtypes.int8, dtypes.uint8], dtypes.int8: [dtypes.int16], dtypes.int16: [dtypes.int32],
    dtypes.int32: [dtypes.int64], dtypes.int64: [dtypes.fp8e4m3, dtypes.fp8e5m2],
    dtypes.uint8: [dtypes.int16, dtypes.uint16], dtypes.uint16: [dtypes.int32, dtypes.uint32],
    dtypes.uint32: [dtypes.int64, dtypes.uint64], dtypes.uint64: [dtypes.fp8e4m3, dtypes.fp8e5m2],
    dtypes.fp8e4m3: [dtypes.float16, dtypes.bfloat16], dtypes.fp8e5m2: [dtypes.float16, dtypes.bfloat16],
    dtypes.float16: [dtypes.float32], dtypes.bfloat16: [dtypes.float32], dtypes.float32: [dtypes.float64],
    dtypes.float64: []}


def _recursive_parents(d: DType) -> set[DType]:
    return {d}.union(*[_recursive_parents(p) for p in _promo_lattice[d]])


# least_upper_dtype's answers by argument tuple: "float" / "int" stand for the default float / int, which can change
_lud_cache: dict[tuple[DType, ...], "DType | str"] = {}


def least_upper_dtype(*ds: DType) -> DType:
    """The smallest dtype every one of `ds` promotes to; weak (Python scalar) dtypes yield to strong ones."""
    out = _lud_cache.get(ds)
    if out is None:
        out = _least_upper(ds)
        if len(ds) <= 4 and len(_lud_cache) < 4096: _lud_cache[ds] = out
    if out.__class__ is str: return dtypes.default_float if out == "float" else dtypes.default_int
    return out  # type: ignore[return-value]


def _least_upper(ds: tuple[DType, ...]) -> "DType | str":
    strong = [d for d in ds if d not in dtypes.weaks]
    weak_float = any(d == dtypes.weakfloat for d in ds)
    if not strong:
        return dtypes.weakfloat if weak_float else dtypes.weakint
    common = set.intersection(*[_recursive_parents(d) for d in strong])
    out = min(common)
    if weak_float and not dtypes.is_float(out): return "float"
    if any(d == dtypes.weakint for d in ds) and out == dtypes.bool: return "int"
    return out


def least_upper_float(dt: DType) -> DType:
    return dt if dtypes.is_float(dt) and dt not in dtypes.weaks else least_upper_dtype(dt, dtypes.weakfloat) \
        if dt not in dtypes.weaks else dtypes.default_float


def strong_dtype(dt: DType) -> DType:
    """A weak dtype becomes the default of its kind when it is stored."""
    if dt == dtypes.weakfloat: return dtypes.default_float
    if dt == dtypes.weakint: return dtypes.default_int
    return dt


def weak_dtype(dt: DType) -> DType:
    """The weak (Python-scalar) dtype of `dt`'s kind: weakfloat for floats, weakint for ints; bool stays bool."""
    if dtypes.is_float(dt): return dtypes.weakfloat
    if dtypes.is_int(dt): return dtypes.weakint
    return dt


def sum_acc_dtype(dt: DType) -> DType:
    """The accumulator dtype of sum(): small ints sum in the default int (int64-like as torch), floats in float32+."""
    if dtypes.is_unsigned(dt): return least_upper_dtype(dt, dtypes.uint32)
    if dtypes.is_int(dt) or dt == dtypes.bool: return least_upper_dtype(dt, dtypes.int32)
    return least_upper_dtype(dt, dtypes.float32)


def reduce_acc_dtype(dt: DType) -> DType:
    """The dtype a sum or product of `dt` values accumulates in, inside the kernel: float16, bfloat16 and fp8 in
    float32, rounded back to `dt` once at the end (torch's and tinygrad's rule: a float16 accumulator stops growing at
    2048 when the terms are below 1, and overflows where the result doesn't); every other dtype in its own. A max needs
    no wider accumulator. `sum_acc_dtype` is sum()'s own, wider choice (ints too), whose result keeps that dtype."""
    return dtypes.float32 if dtypes.is_float(dt) and dt.scalar().itemsize < 4 else dt


def to_np_dtype(dt: DType) -> Any:
    import numpy as np
    if dt.fmt is None: raise TypeError(f"numpy has no {dt.name}; cast to float32 first")
    return np.dtype(dt.fmt)


def from_np_dtype(npdt: Any) -> DType:
    import numpy as np
    npdt = np.dtype(npdt)
    for d in dtypes.all:
        if d.fmt is not None and np.dtype(d.fmt) == npdt: return d
    raise TypeError(f"numpy dtype {npdt} is not supported")


# ---------------------------------------------------------------------------------------------------------------------
# names tinygrad's dtype module exports, with the same meaning

def _to_np_dtype(dt: DType) -> Any:
    """The numpy dtype `numpy()` returns for `dt`: float32 for bfloat16 and fp8 (numpy has neither), None for void."""
    import numpy as np
    if dt == dtypes.void: return None
    return np.dtype(np.float32) if dt.fmt is None else to_np_dtype(dt)


def _from_np_dtype(npdt: Any) -> DType: return from_np_dtype(npdt)


def storage_fmt_for_dtype(dt: DType) -> str | None:
    """The struct format of the stored bits: 'H' for bfloat16, 'B' for fp8, the dtype's own otherwise."""
    return "H" if dt == dtypes.bfloat16 else "B" if dt in dtypes.fp8s else dt.fmt


def to_storage_scalar(x: Any, dt: DType) -> Any:
    """A Python value as stored: bfloat16 and fp8 as their bit patterns, halves rounded."""
    if dt == dtypes.bfloat16: return float_to_bf16_bits(float(x))
    if dt in dtypes.fp8s: return float_to_fp8(float(x), dt)
    return truncate_float(float(x), dt) if dt == dtypes.float16 else x


def from_storage_scalar(x: Any, dt: DType) -> Any:
    if dt == dtypes.bfloat16: return bf16_to_float(int(x))
    return fp8_to_float(int(x), dt) if dt in dtypes.fp8s else x


# dtype -> a function rounding/wrapping a Python value to it
def _truncator(d: DType) -> Callable[[Any], Any]:
    if dtypes.is_float(d): return functools.partial(lambda x, dt: truncate_float(float(x), dt), dt=d)
    return functools.partial(lambda x, dt: dtypes.as_const(x, dt), dt=d)


truncate: dict[DType, Callable[[Any], Any]] = {dtypes.bool: bool, **{d: _truncator(d) for d in dtypes.floats + dtypes.ints}}


def can_lossless_cast(src: DType, dst: DType) -> bool:
    """Whether every value of `src` is exactly representable in `dst`.

    >>> can_lossless_cast(dtypes.uint8, dtypes.float16), can_lossless_cast(dtypes.int32, dtypes.float32)
    (True, False)
    """
    if src == dst or src == dtypes.bool: return True
    if dst == dtypes.weakint: return src in dtypes.ints
    if dtypes.is_int(src) and dtypes.is_int(dst):
        if dtypes.is_unsigned(src):
            return dst.itemsize > src.itemsize or (dtypes.is_unsigned(dst) and dst.itemsize >= src.itemsize)
        return not dtypes.is_unsigned(dst) and dst.itemsize >= src.itemsize
    if dtypes.is_float(dst) and dst not in dtypes.weaks:
        exp, man = dtypes.finfo(dst)
        if dtypes.is_int(src): return src.itemsize * 8 - (0 if dtypes.is_unsigned(src) else 1) <= man + 1
        if src in dtypes.floats and src not in dtypes.fp8s:
            sexp, sman = dtypes.finfo(src)
            return sexp <= exp and sman <= man
        if src in dtypes.fp8s: return dst not in dtypes.fp8s
    return False
