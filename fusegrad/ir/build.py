"""Constructors for tensor-level graph nodes, shared by the Tensor frontend and the gradient rules.

They check arguments and skip no-ops (a reshape to the same shape returns its input), so the graph stays small.
"""
from __future__ import annotations

from typing import Sequence

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import argsort
from fusegrad.ir.ops import GroupOp, Ops, UOp, tensor_const
from fusegrad.ir.shape import canonical


# the constant, reshape, expand and reduce constructors are the node type's own (ir/ops.py): its arithmetic on
# tensor-level nodes makes them too
const = tensor_const
reshape = UOp.reshape
expand = UOp.expand
reduce_axis = UOp.reduce_axis

# symbolic sizes in movement args are kept in canonical form (shape.canonical), so equal sizes are the same node


def permute(x: UOp, order: Sequence[int]) -> UOp:
    order = tuple(order)
    if order == tuple(range(len(order))): return x
    return UOp(Ops.PERMUTE, x.dtype, (x,), order)


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
