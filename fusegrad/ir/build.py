"""Constructors for tensor-level graph nodes, shared by the Tensor frontend and the gradient rules.

They check arguments and skip no-ops (a reshape to the same shape returns its input), so the graph stays small.
"""
from __future__ import annotations

import math
from typing import Sequence

from fusegrad.dtype import ConstType, DType, dtypes
from fusegrad.helpers import argsort
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.shape import canonical, canonical_shape


# (value, its type, the sign of a float zero, dtype, device, shape) -> the constant's node: plain numbers at static
# shapes, the constants of every elementwise op with a Python scalar (three nodes each, built again on every eager
# call otherwise). The entries keep their nodes alive; cleared when full, so it stays small
_consts: dict[tuple, UOp] = {}
_CONSTS_MAX = 4096


def const(val: "ConstType | UOp", dtype: DType, device: str | tuple[str, ...], shape: tuple = ()) -> UOp:
    """A tensor constant broadcast to `shape`. `val` may be a symbolic int (a bound Variable, or an expression of one):
    the kernel then reads the variable's value. A tuple of devices makes it for each of them."""
    if ((cls := val.__class__) is float or cls is int or cls is bool) and shape.__class__ is tuple:
        key = (val, cls, cls is float and val == 0.0 and math.copysign(1.0, val) < 0, dtype, device, shape)
        if (ret := _consts.get(key)) is not None: return ret
        if all(s.__class__ is int for s in shape):
            ret = _const(val, dtype, device, shape)
            if len(_consts) >= _CONSTS_MAX: _consts.clear()
            _consts[key] = ret
            return ret
    return _const(val, dtype, device, shape)


def _const(val: "ConstType | UOp", dtype: DType, device: str | tuple[str, ...], shape: tuple) -> UOp:
    arg = val if isinstance(val, UOp) else dtypes.as_const(val, dtype)
    c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), arg)
    return expand(reshape(c, (1,) * len(shape)), shape) if shape else c

# symbolic sizes in movement args are kept in canonical form (shape.canonical), so equal sizes are the same node


def reshape(x: UOp, shape: "Sequence[int | UOp]") -> UOp:
    shape = canonical_shape(shape)
    if x.shape == shape: return x
    return UOp(Ops.RESHAPE, x.dtype, (x,), shape)


def permute(x: UOp, order: Sequence[int]) -> UOp:
    order = tuple(order)
    if order == tuple(range(len(order))): return x
    return UOp(Ops.PERMUTE, x.dtype, (x,), order)


def expand(x: UOp, shape: "Sequence[int | UOp]") -> UOp:
    shape = canonical_shape(shape)
    return x if x.shape == shape else UOp(Ops.EXPAND, x.dtype, (x,), shape)


def _sint(x: "int | UOp") -> "int | UOp":
    return canonical(x) if isinstance(x, UOp) else int(x)


def pad(x: UOp, arg: "Sequence[tuple[int | UOp, int | UOp]]") -> UOp:
    arg = tuple((_sint(b), _sint(a)) for b, a in arg)
    return x if all(b == 0 and a == 0 for b, a in arg) else UOp(Ops.PAD, x.dtype, (x,), arg)


def shrink(x: UOp, arg: "Sequence[tuple[int | UOp, int | UOp]]") -> UOp:
    arg = tuple((_sint(b), _sint(e)) for b, e in arg)
    assert x.shape is not None
    if all(b == 0 and (e is s or e == s) for (b, e), s in zip(arg, x.shape)): return x
    return UOp(Ops.SHRINK, x.dtype, (x,), arg)


def flip(x: UOp, axes: Sequence[bool]) -> UOp:
    return x if not any(axes) else UOp(Ops.FLIP, x.dtype, (x,), tuple(axes))


def reduce_axis(x: UOp, op: Ops, axes: Sequence[int]) -> UOp:
    assert op in GroupOp.Reduce and x.shape is not None
    axes = tuple(sorted(a for a in axes if x.shape[a] != 1))
    if not axes: return x
    if any(x.shape[a] == 0 for a in axes):  # reducing nothing gives the identity
        assert x.device is not None
        ident = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(x.dtype)}[op]
        return const(ident, x.dtype, x.device, tuple(1 if i in axes else s for i, s in enumerate(x.shape)))
    return UOp(Ops.REDUCE_AXIS, x.dtype, (x,), (op, axes))


def alu(op: Ops, *srcs: UOp) -> UOp:
    out_dtype = dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype
    return UOp(op, out_dtype, tuple(srcs))


def cast(x: UOp, dtype: DType) -> UOp:
    return x if x.dtype == dtype else UOp(Ops.CAST, dtype, (x,))


def inverse_permute(order: Sequence[int]) -> tuple[int, ...]:
    return tuple(argsort(list(order)))


def reduce_to(g: UOp, shape: tuple[int, ...]) -> UOp:
    """Sum `g` over the axes where `shape` is 1 (the adjoint of expand)."""
    assert g.shape is not None
    return reduce_axis(g, Ops.ADD, [i for i, (s, gs) in enumerate(zip(shape, g.shape)) if s == 1 and gs != 1])
