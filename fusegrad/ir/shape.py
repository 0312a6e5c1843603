"""Shape inference for tensor-level nodes. Kernel-level nodes (scalars inside a kernel) have shape None.

The checks here are the last line of defence; the Tensor frontend raises torch-style errors before building a node.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fusegrad.helpers import prod

if TYPE_CHECKING:
    from fusegrad.ir.ops import UOp


def infer_shape(u: "UOp") -> tuple[int, ...] | None:
    from fusegrad.ir.ops import GroupOp, Ops
    op, arg = u.op, u.arg
    if op is Ops.BUFFER: return (arg[1],)
    if op is Ops.IOTA: return (arg,)
    if op is Ops.CONST: return () if u.src else None
    if op in (Ops.SINK, Ops.DEVICE) or not u.src: return None
    ss = u.src[0].shape
    if ss is None: return None
    if op is Ops.RESHAPE:
        if prod(arg) != prod(ss): raise ValueError(f"reshape from {ss} to {arg}: sizes {prod(ss)} != {prod(arg)}")
        return tuple(arg)
    if op is Ops.PERMUTE:
        if sorted(arg) != list(range(len(ss))): raise ValueError(f"bad permute {arg} for shape {ss}")
        return tuple(ss[i] for i in arg)
    if op is Ops.EXPAND:
        if len(arg) != len(ss) or any(s != a and s != 1 for s, a in zip(ss, arg)):
            raise ValueError(f"can't expand {ss} to {arg}")
        return tuple(arg)
    if op is Ops.PAD:
        if len(arg) != len(ss): raise ValueError(f"pad {arg} has wrong length for shape {ss}")
        return tuple(s + b + a for s, (b, a) in zip(ss, arg))
    if op is Ops.SHRINK:
        if len(arg) != len(ss) or any(not (0 <= b <= e <= s) for s, (b, e) in zip(ss, arg)):
            raise ValueError(f"bad shrink {arg} for shape {ss}")
        return tuple(e - b for b, e in arg)
    if op is Ops.FLIP:
        if len(arg) != len(ss): raise ValueError(f"flip {arg} has wrong length for shape {ss}")
        return ss
    if op is Ops.REDUCE_AXIS:
        return tuple(1 if i in arg[1] else s for i, s in enumerate(ss))
    if op is Ops.ASSIGN:
        if u.src[1].shape != ss: raise ValueError(f"assign of shape {u.src[1].shape} to {ss}")
        return ss
    if op is Ops.GATHER:
        xs, ids = ss, u.src[1].shape
        if ids is None or len(ids) != len(xs) or any(i > x for d, (i, x) in enumerate(zip(ids, xs)) if d != arg):
            raise ValueError(f"gather index shape {ids} doesn't fit source shape {xs} on axis {arg}")
        return ids
    if op in GroupOp.ALU:
        shapes = [s.shape for s in u.src]
        if any(s != ss for s in shapes): raise ValueError(f"{op} with mismatched shapes {shapes}")
        return ss
    return ss  # CAST, BITCAST, CONTIGUOUS, DETACH, COPY keep the shape
