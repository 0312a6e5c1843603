"""Data types: scalar dtypes, vector and pointer dtypes used by codegen, and the type-promotion lattice.

Python scalars are *weak*: `int_tensor + 1` stays int, `half_tensor * 2.5` stays half, `int_tensor * 2.5` becomes the
default float, as in PyTorch.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Union

ConstType = Union[float, int, bool]


@dataclass(frozen=True, eq=False)
class DType:
    """A scalar (count=1) or vector (count>1) element type. `fmt` is the struct/memoryview format, if any."""
    priority: int
    itemsize: int
    name: str
    fmt: str | None
    count: int = 1
    _scalar: "DType | None" = None

    def __post_init__(self) -> None:
        key = tuple(getattr(self, f) for f in self.__dataclass_fields__)
        object.__setattr__(self, "_key", (type(self), key))
        object.__setattr__(self, "_hash", hash(self._key))

    # equality is structural but cheap: dtypes are compared in every graph operation
    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, DType) and self._hash == other._hash and self._key == other._key)

    def __ne__(self, other: object) -> bool: return not self.__eq__(other)
    def __hash__(self) -> int: return self._hash

    # pickled by name (`dtypes.float` loads as that very object) or rebuilt through the constructor, never with its
    # state: the cached `_hash` of a str key differs from process to process
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


class dtypes:
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
    default_float: DType = float32
    default_int: DType = int32

    floats = (float16, bfloat16, float32, float64)
    uints = (uint8, uint16, uint32, uint64)
    sints = (int8, int16, int32, int64)
    ints = sints + uints
    weaks = (weakint, weakfloat)
    all = (bool,) + ints + floats

    @staticmethod
    def is_float(x: DType) -> bool:
        return x.scalar() in dtypes.floats or x.scalar() == dtypes.weakfloat

    @staticmethod
    def is_int(x: DType) -> bool:
        return x.scalar() in dtypes.ints or x.scalar() == dtypes.weakint

    @staticmethod
    def is_unsigned(x: DType) -> bool:
        return x.scalar() in dtypes.uints

    @staticmethod
    def is_bool(x: DType) -> bool:
        return x.scalar() == dtypes.bool

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
        table = {dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23), dtypes.float64: (11, 52)}
        if d not in table: raise TypeError(f"finfo is only defined for float dtypes, not {d}")
        return table[d]


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
    return x


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


def to_dtype(x: DTypeLike) -> DType:
    """`dtypes.float32` from `dtypes.float32`, `'float32'` or `'float'`; a clear error otherwise."""
    if isinstance(x, DType): return x
    if isinstance(x, str) and x in DTYPES_DICT: return DTYPES_DICT[x]
    # numpy / torch dtype objects
    name = str(x).replace("torch.", "")
    if name in DTYPES_DICT: return DTYPES_DICT[name]
    raise UnknownDTypeError(f"unknown dtype {x!r}; valid names: {sorted(DTYPES_DICT)}")


# promotion lattice among strong dtypes: each dtype lists the dtypes directly above it
_promo_lattice: dict[DType, list[DType]] = {
    dtypes.bool: [dtypes.int8, dtypes.uint8], dtypes.int8: [dtypes.int16], dtypes.int16: [dtypes.int32],
    dtypes.int32: [dtypes.int64], dtypes.int64: [dtypes.float16, dtypes.bfloat16],
    dtypes.uint8: [dtypes.int16, dtypes.uint16], dtypes.uint16: [dtypes.int32, dtypes.uint32],
    dtypes.uint32: [dtypes.int64, dtypes.uint64], dtypes.uint64: [dtypes.float16, dtypes.bfloat16],
    dtypes.float16: [dtypes.float32], dtypes.bfloat16: [dtypes.float32], dtypes.float32: [dtypes.float64],
    dtypes.float64: []}


def _recursive_parents(d: DType) -> set[DType]:
    return {d}.union(*[_recursive_parents(p) for p in _promo_lattice[d]])


def least_upper_dtype(*ds: DType) -> DType:
    """The smallest dtype every one of `ds` promotes to; weak (Python scalar) dtypes yield to strong ones."""
    strong = [d for d in ds if d not in dtypes.weaks]
    weak_float = any(d == dtypes.weakfloat for d in ds)
    if not strong:
        return dtypes.weakfloat if weak_float else dtypes.weakint
    common = set.intersection(*[_recursive_parents(d) for d in strong])
    out = min(common)
    if weak_float and not dtypes.is_float(out): return dtypes.default_float
    if any(d == dtypes.weakint for d in ds) and out == dtypes.bool: return dtypes.default_int
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


def to_np_dtype(dt: DType) -> Any:
    import numpy as np
    if dt == dtypes.bfloat16: raise TypeError("numpy has no bfloat16; cast to float32 first")
    return np.dtype(dt.fmt)


def from_np_dtype(npdt: Any) -> DType:
    import numpy as np
    npdt = np.dtype(npdt)
    for d in dtypes.all:
        if d.fmt is not None and np.dtype(d.fmt) == npdt: return d
    raise TypeError(f"numpy dtype {npdt} is not supported")
