"""Reference semantics of every ALU op on Python scalars: used by constant folding and the PYTHON backend.

This table *is* the definition of the primitive ops; every renderer must agree with it (the tests check this).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from fusegrad.dtype import DType, dtypes, truncate_float
from fusegrad.ir.ops import Ops


def _safe(fn: Callable[[float], float], bad: float) -> Callable[[float], float]:
    def f(x: float) -> float:
        try: return fn(x)
        except (ValueError, OverflowError): return bad
    return f


def _exp2(x: float) -> float:
    if math.isnan(x): return x
    try: return 2.0 ** x
    except OverflowError: return math.inf


def _log2(x: float) -> float:
    if math.isnan(x) or x < 0: return math.nan
    if x == 0: return -math.inf
    return math.log2(x)


def _sqrt(x: float) -> float:
    if math.isnan(x) or x < 0: return math.nan
    return math.sqrt(x)


def _sin(x: float) -> float:
    return math.nan if math.isinf(x) or math.isnan(x) else math.sin(x)


def _recip(x: float) -> float:
    if x == 0: return math.copysign(math.inf, x)
    try: return 1.0 / x
    except OverflowError: return math.inf
def _trunc(x: float) -> float:
    return x if math.isinf(x) or math.isnan(x) else float(math.trunc(x))


def _idiv(a: int, b: int) -> int:
    if b == 0: return 0  # undefined in C; the frontend never emits it for ints without masking
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _mod(a: int, b: int) -> int:
    if b == 0: return 0
    return a - _idiv(a, b) * b


def _max(a: Any, b: Any) -> Any:
    if isinstance(a, float) and math.isnan(a): return a
    if isinstance(b, float) and math.isnan(b): return b
    return a if a > b else b


python_alu: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: lambda x: -x if not isinstance(x, bool) else not x,
    Ops.RECIPROCAL: _recip, Ops.SQRT: _sqrt, Ops.EXP2: _exp2, Ops.LOG2: _log2, Ops.SIN: _sin, Ops.TRUNC: _trunc,
    Ops.ADD: lambda a, b: a + b, Ops.MUL: lambda a, b: a * b, Ops.IDIV: _idiv, Ops.MOD: _mod, Ops.MAX: _max,
    Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b,
    Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
    Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b,
    Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c,
}


def cast_value(v: Any, dtype: DType) -> Any:
    """A C-style value conversion: floats truncate toward zero into ints, anything nonzero is True."""
    if dtypes.is_bool(dtype): return bool(v)
    if dtypes.is_float(dtype): return truncate_float(float(v), dtype.scalar())
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v): return 0
        v = int(v)
    return dtypes.as_const(int(v), dtype)


def exec_alu(op: Ops, dtype: DType, operands: list[Any]) -> Any:
    """Apply `op` to Python scalars and round/wrap the result to `dtype` exactly like the hardware would."""
    if op is Ops.SHR and dtypes.is_int(dtype) and not dtypes.is_unsigned(dtype):
        return dtypes.as_const(operands[0] >> operands[1], dtype)
    if op in (Ops.NEG,) and dtypes.is_unsigned(dtype):
        return dtypes.as_const(-operands[0], dtype)
    if dtypes.is_float(dtype) and op not in (Ops.CMPLT, Ops.CMPNE):
        vals = [float(v) for v in operands] if op is not Ops.WHERE else operands
        ret = python_alu[op](*vals)
        return truncate_float(float(ret), dtype.scalar())
    ret = python_alu[op](*operands)
    return dtypes.as_const(ret, dtype)


__all__ = ["exec_alu", "python_alu", "cast_value"]
