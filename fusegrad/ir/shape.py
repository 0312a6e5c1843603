"""Shape inference for tensor-level nodes. Kernel-level nodes (scalars inside a kernel) have shape None.

The checks here are the last line of defence; the Tensor frontend raises torch-style errors before building a node.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Sequence, Union
from fusegrad.dtype import dtypes
from fusegrad.helpers import ShapeError


if TYPE_CHECKING:
    from fusegrad.ir.ops import UOp

# A shape entry is an int or a symbolic int: an int-typed UOp expression over variables (DEFINE_VAR, or BIND in tensor
# shapes: a variable bound to a value). Symbolic sizes are canonicalized by the symbolic simplifier, so equal sizes
# are usually the same node; `sym_eq` also proves equality by simplifying the difference.
sint = Union[int, "UOp"]


def is_sym(x: Any) -> bool: return not isinstance(x, int)


def all_static(shape: Sequence[Any]) -> bool: return all(isinstance(s, int) for s in shape)


def is_sym_int(x: Any) -> bool:
    """A symbolic size: an int-typed UOp (a bound Variable, or an expression of one)."""
    from fusegrad.ir.ops import UOp
    return isinstance(x, UOp) and dtypes.is_int(x.dtype)


def _simp(u: "UOp") -> "UOp":
    from fusegrad.ir.symbolic import simplify
    return simplify(u)


def _static(u: "UOp") -> sint:
    """A symbolic expression that simplified to a constant becomes a plain int."""
    from fusegrad.ir.ops import Ops
    return int(u.arg) if u.op is Ops.CONST else u


def sadd(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int): return a + b
    if isinstance(b, int) and b == 0: return a
    if isinstance(a, int) and a == 0: return b
    return _static(_simp(a + b if not isinstance(a, int) else b + a))  # type: ignore[operator]


def ssub(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int): return a - b
    if isinstance(b, int) and b == 0: return a
    return _static(_simp(a - b if not isinstance(a, int) else (-b) + a))  # type: ignore[operator]


def smul(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int): return a * b
    if isinstance(a, int): a, b = b, a
    if isinstance(b, int) and b in (0, 1): return 0 if b == 0 else a
    return _static(_simp(a * b))  # type: ignore[operator]


def sprod(xs: Sequence[sint]) -> sint:
    """The product of shape entries; symbolic when any entry is (int entries are folded first)."""
    for x in xs:   # the usual case, a static shape: in C
        if x.__class__ is not int: break
    else: return math.prod(xs)
    n, sym = 1, None
    for x in xs:
        if isinstance(x, int): n *= x
        else: sym = x if sym is None else sym * x
    if sym is None or n == 0: return n
    return smul(_static(_simp(sym)), n)


def strides_for(shape: Sequence[int]) -> tuple[int, ...]:
    """The row-major (contiguous) strides of `shape`, in elements."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def sym_eq(a: sint, b: sint) -> bool:
    """Whether two sizes are equal for every value of their variables (as far as the simplifier can prove)."""
    if isinstance(a, int) and isinstance(b, int): return a == b
    if a is b: return True
    d = ssub(a, b)
    return isinstance(d, int) and d == 0


def smax(x: sint) -> int:
    """The largest value a size can take (the size itself when it is an int)."""
    return x if isinstance(x, int) else int(x.vmax)


def smin(x: sint) -> int:
    return x if isinstance(x, int) else int(x.vmin)


def sle(a: sint, b: sint) -> bool:
    """a <= b for every value of the variables (False when that can't be proven)."""
    if isinstance(a, int) and isinstance(b, int): return a <= b
    return sym_eq(a, b) or smax(a) <= smin(b) or smax(ssub(a, b)) <= 0


def shrink_bounds_known(b: sint, e: sint, s: sint) -> bool | None:
    """Whether a shrink's bounds on one axis, 0 <= b <= e <= s, hold: True for every value of the variables, False for
    none (no value can be in range), None when it depends on the values (a slice `t[:v]` with v's maximum past the
    axis: the bound values are checked when they are known, `shrink_bounds_error`)."""
    if sle(0, b) and sle(b, e) and sle(e, s): return True
    if smax(b) < 0 or smin(ssub(b, e)) > 0 or smin(ssub(e, s)) > 0: return False
    return None


def is_bound(x: sint) -> bool:
    """Every variable in the size expression x is bound to a value (x has a value now)."""
    if isinstance(x, int): return True
    Ops = _ops()[0]
    nodes = x.toposort()
    return {n for n in nodes if n.op is Ops.DEFINE_VAR} <= {n.src[0] for n in nodes if n.op is Ops.BIND}


def shrink_bounds_error(checks: Sequence[tuple[int, sint, sint, sint]], var_vals: Any = None) -> str | None:
    """The first violated check of `(axis, begin, end, size)` shrink bounds for these variable values (bound
    variables carry their own), as a message; None when all hold."""
    from fusegrad.ir.ops import sym_infer
    for ax, b, e, s in checks:
        bv, ev, sv = sym_infer(b, var_vals), sym_infer(e, var_vals), sym_infer(s, var_vals)
        if not 0 <= bv <= ev <= sv:
            return (f"slice bounds ({_expr(b)}, {_expr(e)}) = ({bv}, {ev}) are out of range for dimension {ax} of size "
                    f"{_expr(s)}{'' if isinstance(s, int) else f' = {sv}'}")
    return None


def _expr(x: sint) -> str: return str(x) if isinstance(x, int) else str(x.unbind_all()[0])


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape `shapes` broadcast to (numpy's rule; symbolic sizes equal as expressions count as one); ShapeError
    if they don't broadcast."""
    if len(shapes) == 2:   # the common cases at once: equal shapes, or a 0-d operand (a scalar)
        a, b = shapes
        if a == b or not b: return a
        if not a: return b
        k = len(a) - len(b)   # static sizes in one pass (symbolic ones and errors: below)
        out = []
        for p, q in zip(((1,) * -k + a) if k < 0 else a, ((1,) * k + b) if k > 0 else b):
            if p.__class__ is not int or q.__class__ is not int or (p != q and p != 1 and q != 1): break
            out.append(q if p == 1 else p)
        else: return tuple(out)
    elif all(s == shapes[0] for s in shapes): return shapes[0]
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + s for s in shapes]
    out = []
    for i, dims in enumerate(zip(*padded)):
        non1: set[Any] = set()
        for d in dims:   # symbolic sizes that are equal as expressions count once (sym_eq)
            if d != 1 and not any(sym_eq(d, e) for e in non1): non1.add(d)
        if len(non1) > 1:
            a, b = [d for d in dims if d != 1][:2]
            raise ShapeError(f"The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton "
                             f"dimension {i}: shapes {' and '.join(str(s) for s in shapes)} can't broadcast")
        out.append(non1.pop() if non1 else 1)
    return tuple(out)


@functools.cache
def _ops() -> tuple[Any, Any, tuple[Any, ...]]:
    """(Ops, GroupOp, the ops infer_shape tests first): ir/ops.py imports this module, so they are looked up on first
    use (once, not per node), and bound to locals: several are tested per node."""
    from fusegrad.ir.ops import GroupOp, Ops
    return Ops, GroupOp, (frozenset(GroupOp.ALU), Ops.BUFFER, Ops.IOTA, Ops.CONST, frozenset({Ops.SINK, Ops.DEVICE}),
                          Ops.RESHAPE, Ops.EXPAND)


def infer_shape(u: "UOp") -> tuple[int, ...] | None:
    Ops, GroupOp, (alu, buffer, iota, const, no_shape, reshape, expand) = _ops()
    op, src = u.op, u.src
    if op in alu and src:   # the most common node: first
        if (ss := src[0].shape) is None: return None
        for x in src[1:]:
            if (xs := x.shape) is not ss and xs != ss and (xs is None or len(xs) != len(ss) or
                                                           not all(map(sym_eq, xs, ss))):
                raise ValueError(f"{op} with mismatched shapes {[y.shape for y in src]}")
        return ss
    arg = u.arg
    if op is buffer: return (arg[1],)
    if op is iota: return (arg,)
    if op is const: return () if src else None
    if op in no_shape or not src: return None
    if (ss := src[0].shape) is None: return None
    if op is reshape:
        if not sym_eq(sprod(arg), sprod(ss)):
            raise ValueError(f"reshape from {ss} to {arg}: sizes {sprod(ss)} != {sprod(arg)}")
        return tuple(arg)
    if op is Ops.PERMUTE:
        if sorted(arg) != list(range(len(ss))): raise ValueError(f"bad permute {arg} for shape {ss}")
        return tuple(ss[i] for i in arg)
    if op is expand:
        # (`s != a` first: equal sizes, the usual case, need no sym_eq call)
        if len(arg) != len(ss) or any(s != a and s != 1 and not sym_eq(s, a) for s, a in zip(ss, arg)):
            raise ValueError(f"can't expand {ss} to {arg}")
        return tuple(arg)
    if op is Ops.PAD:
        if len(arg) != len(ss): raise ValueError(f"pad {arg} has wrong length for shape {ss}")
        return tuple(sadd(sadd(s, b), a) for s, (b, a) in zip(ss, arg))
    if op is Ops.SHRINK:
        # bounds that hold only for some values of the variables are checked when the values are known (variables.py)
        if len(arg) != len(ss) or any(shrink_bounds_known(b, e, s) is False for s, (b, e) in zip(ss, arg)):
            raise ValueError(f"bad shrink {arg} for shape {ss}")
        return tuple(ssub(e, b) for b, e in arg)
    if op is Ops.FLIP:
        if len(arg) != len(ss): raise ValueError(f"flip {arg} has wrong length for shape {ss}")
        return ss
    if op is Ops.REDUCE_AXIS:
        return tuple(1 if i in arg[1] else s for i, s in enumerate(ss))
    if op is Ops.ASSIGN:
        if u.src[1].shape != ss: raise ValueError(f"assign of shape {u.src[1].shape} to {ss}")
        return ss
    if op is Ops.MULTI:
        if arg is None: return ss
        shapes = [s.shape for s in u.src]
        if any(s is None or len(s) != len(ss) for s in shapes): raise ValueError(f"MULTI of mismatched shapes {shapes}")
        return tuple(sum(s[arg] for s in shapes if s is not None) if i == arg else d for i, d in enumerate(ss))
    if op is Ops.GATHER:
        xs, ids = ss, u.src[1].shape
        if ids is None or len(ids) != len(xs) or any(i > x for d, (i, x) in enumerate(zip(ids, xs)) if d != arg):
            raise ValueError(f"gather index shape {ids} doesn't fit source shape {xs} on axis {arg}")
        return ids
    return ss  # CAST, BITCAST, CONTIGUOUS, DETACH, COPY keep the shape


def canonical(x: sint) -> sint:
    """A size in canonical form: an int stays an int; a symbolic size is simplified (sums and products of variables
    in one fixed order), so sizes equal by commutativity are the same node and shapes holding them compare equal with
    `==` (`Tensor.ones(i + j).shape == Tensor.ones(j + i).shape`)."""
    from fusegrad.ir.ops import Ops, UOp
    if not isinstance(x, UOp): return x
    if x.dtype.itemsize > 4:   # index math is 32-bit: a size can't hold a variable whose range needs 64 bits
        names = sorted({n.arg[0] for n in x.toposort() if n.op is Ops.DEFINE_VAR and n.dtype.itemsize > 4})
        raise ValueError(f"a size or slice bound can't use the 64-bit variable {', '.join(map(repr, names)) or x}: "
                         "sizes and indices are 32-bit; a variable in a size needs an int32 dtype (the default for a "
                         "range inside [-2**31, 2**31))")
    return _static(_simp(x))


def canonical_shape(shape: Sequence[sint]) -> tuple[sint, ...]:
    shape = tuple(shape)
    for s in shape:   # the common case, a static shape, is its own canonical form
        if s.__class__ is not int: return tuple(canonical(s) for s in shape)
    return shape


def sym_value_dtype(x: "UOp") -> Any:
    """The dtype of a tensor holding the value of a symbolic int (`Tensor(v)`, `Tensor.full(shape, v)`): the default
    int, or int64 for a variable whose range needs 64 bits."""
    return dtypes.int64 if x.dtype.itemsize > 4 else dtypes.default_int
