"""Composite ops (GELU, sigmoid, tanh, relu6, layernorm, softmax) built on graph nodes, one Tensor for the result.

An eager call builds its graph op by op, and each Tensor-level op costs far more than the node it makes: dtype
promotion, broadcasting, a new Tensor with its autograd and view bookkeeping. A composite such as GELU is some fifty
nodes, so an eager MiniLM call spent most of its graph building inside a handful of composites.

`on_nodes(x, body)` runs the composite's own Tensor-level formula (`body`, the very function the Tensor method runs
otherwise) on `Nodes`, a stand-in that has the few Tensor methods these formulas use, each making the node the Tensor
method makes in the same case, and wraps only the result. The graph is therefore the same, node for node (hash-consing
makes it the very same object, which test/unit/test_eager_overhead.py checks), and so are values and gradients.

`Nodes` covers one case: float tensors of one dtype whose sums accumulate in that dtype (float32, float64), static
shapes, Python scalars as the other operands, and nothing to detach for no_grad. `usable(x)` checks it at the entry
(relu6, whose formula has no reduce, only asks for a float dtype: `alu._float_fast`); a step outside it inside a
formula raises `Fallback`, and the Tensor-level formula runs instead.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from fusegrad.dtype import dtypes, sum_acc_dtype
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


class Fallback(Exception):
    """A step `Nodes` doesn't make the Tensor-level way: run the formula on Tensors."""


def usable(x: "Tensor") -> bool:
    """Whether `on_nodes` may run a composite of x (module docstring)."""
    dt = x.dtype
    return dtypes.is_float(dt) and sum_acc_dtype(dt) == dt and not (x.requires_grad and type(x).no_grad) and \
        all(s.__class__ is int for s in x.shape) and isinstance(x.device, str)


def on_nodes(x: "Tensor", body: Callable[..., Any], *args: Any) -> "Tensor":
    """body(x, *args) built on nodes and wrapped as one Tensor; the Tensor-level body(x, *args) where it can't be."""
    try: out = body(Nodes(x.uop, x.requires_grad), *args)
    except Fallback: return body(x, *args)
    return type(x)._wrap(out.uop, x)


def broadcast_static(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape two static shapes broadcast to; None if they don't."""
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for p, q in zip(a, b):
        if p != q and p != 1 and q != 1: return None
        out.append(q if p == 1 else p)
    return tuple(out)


def _bshape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if (out := broadcast_static(a, b)) is None: raise Fallback   # the Tensor path raises the error
    return out


def expand_to(u: UOp, shape: tuple[int, ...]) -> UOp:
    """Tensor._broadcast_to's nodes for a static shape: a reshape to the rank, then an expand."""
    s = u.shape
    if s == shape: return u
    return build.expand(build.reshape(u, (1,) * (len(shape) - len(s)) + s), shape)  # type: ignore[operator]


class Nodes:
    """A node standing in for a float Tensor inside a composite's formula (module docstring). `grad`: whether the
    composite's input requires grad (max then may have to store its input first, which only Tensors do)."""
    __slots__ = ("uop", "grad")

    def __init__(self, uop: UOp, grad: bool | None) -> None: self.uop, self.grad = uop, grad

    @property
    def dtype(self) -> Any: return self.uop.dtype
    @property
    def shape(self) -> tuple[int, ...]: return self.uop.shape  # type: ignore[return-value]
    @property
    def ndim(self) -> int: return len(self.uop.shape)  # type: ignore[arg-type]

    def _new(self, u: UOp) -> "Nodes": return Nodes(u, self.grad)

    def _pair(self, y: Any, reverse: bool = False) -> tuple[UOp, UOp]:
        """Tensor._broadcasted for a float tensor of one dtype: a Python number becomes a constant of x's dtype at x's
        shape; two tensors broadcast to one shape."""
        x = self.uop
        if y.__class__ is Nodes:
            if y.uop.dtype != x.dtype: raise Fallback
            shape = _bshape(x.shape, y.uop.shape)
            a, b = expand_to(x, shape), expand_to(y.uop, shape)
        elif y.__class__ in (int, float):
            a, b = x, build.const(y, x.dtype, x.device, x.shape)
        else: raise Fallback
        return (b, a) if reverse else (a, b)

    def _alu(self, op: Ops, y: Any, reverse: bool = False) -> "Nodes":
        a, b = self._pair(y, reverse)
        return self._new(build.alu(op, a, b))

    # arithmetic (ALUMixin's float cases)
    def add(self, y: Any, reverse: bool = False) -> "Nodes": return self._alu(Ops.ADD, y, reverse)
    def mul(self, y: Any, reverse: bool = False) -> "Nodes": return self._alu(Ops.MUL, y, reverse)
    def sub(self, y: Any, reverse: bool = False) -> "Nodes":
        a, b = self._pair(y, reverse)
        return self._new(build.alu(Ops.ADD, a, UOp(Ops.NEG, b.dtype, (b,))))
    def div(self, y: Any, reverse: bool = False) -> "Nodes":
        a, b = self._pair(y, reverse)
        return self._new(build.alu(Ops.MUL, a, UOp(Ops.RECIPROCAL, b.dtype, (b,))))
    def __add__(self, y: Any) -> "Nodes": return self.add(y)
    def __radd__(self, y: Any) -> "Nodes": return self.add(y, True)
    def __sub__(self, y: Any) -> "Nodes": return self.sub(y)
    def __rsub__(self, y: Any) -> "Nodes": return self.sub(y, True)
    def __mul__(self, y: Any) -> "Nodes": return self.mul(y)
    def __rmul__(self, y: Any) -> "Nodes": return self.mul(y, True)
    def __truediv__(self, y: Any) -> "Nodes": return self.div(y)
    def __rtruediv__(self, y: Any) -> "Nodes": return self.div(y, True)
    def _unary(self, op: Ops) -> "Nodes": return self._new(UOp(op, self.uop.dtype, (self.uop,)))
    def neg(self) -> "Nodes": return self._unary(Ops.NEG)
    def __neg__(self) -> "Nodes": return self._unary(Ops.NEG)
    def reciprocal(self) -> "Nodes": return self._unary(Ops.RECIPROCAL)
    def sqrt(self) -> "Nodes": return self._unary(Ops.SQRT)
    def rsqrt(self) -> "Nodes": return self.sqrt().reciprocal()
    def exp2(self) -> "Nodes": return self._unary(Ops.EXP2)
    def log2(self) -> "Nodes": return self._unary(Ops.LOG2)
    def exp(self) -> "Nodes": return (self * (1 / math.log(2))).exp2()
    def log(self) -> "Nodes": return self.log2() * math.log(2)
    def square(self) -> "Nodes": return self * self
    def _float_or_self(self) -> "Nodes": return self
    def cast(self, dtype: Any) -> "Nodes":
        if dtype != self.uop.dtype: raise Fallback
        return self
    def detach(self) -> "Nodes": return self._new(UOp(Ops.DETACH, self.uop.dtype, (self.uop,)))

    # comparisons and masks (bool results only feed `|` and `where` here)
    def __gt__(self, y: Any) -> "Nodes": return self._alu(Ops.CMPLT, y, True)
    def __lt__(self, y: Any) -> "Nodes": return self._alu(Ops.CMPLT, y)
    def __ne__(self, y: Any) -> "Nodes": return self._alu(Ops.CMPNE, y)  # type: ignore[override]
    def __eq__(self, y: Any) -> "Nodes": return (self != y).logical_not()  # type: ignore[override]
    def __ge__(self, y: Any) -> "Nodes": return (self > y) | (self == y)
    def __le__(self, y: Any) -> "Nodes": return (self < y) | (self == y)
    __hash__ = None  # type: ignore[assignment]
    def logical_not(self) -> "Nodes":
        u = self.uop
        if u.dtype != dtypes.bool: raise Fallback
        return self._new(UOp(Ops.CMPNE, dtypes.bool, (u, build.const(True, dtypes.bool, u.device, u.shape))))
    def __or__(self, y: Any) -> "Nodes":
        if y.__class__ is not Nodes or self.uop.dtype != dtypes.bool or y.uop.shape != self.uop.shape: raise Fallback
        return self._new(UOp(Ops.OR, dtypes.bool, (self.uop, y.uop)))
    def where(self, x: Any, y: Any) -> "Nodes":
        c = self.uop
        if c.dtype != dtypes.bool: raise Fallback
        if x.__class__ is Nodes: xb, yb = x._pair(y)
        elif y.__class__ is Nodes: yb, xb = y._pair(x)
        else: raise Fallback
        shape = _bshape(c.shape, _bshape(xb.shape, yb.shape))
        return self._new(UOp(Ops.WHERE, xb.dtype, (expand_to(c, shape), expand_to(xb, shape), expand_to(yb, shape))))
    def sigmoid(self) -> "Nodes":
        from fusegrad.mixin.alu import _sigmoid
        return _sigmoid(self)
    def tanh(self) -> "Nodes":
        from fusegrad.mixin.alu import _tanh
        return _tanh(self)
    def relu(self) -> "Nodes":
        from fusegrad.mixin.alu import _relu_uop
        u = self.uop
        return self._new(_relu_uop(u, build.const(0, u.dtype, u.device, u.shape)))

    # reductions (ReduceMixin's float cases, accumulating in the dtype itself)
    def _axes(self, axis: int | Sequence[int] | None) -> tuple[int, ...]:
        n = self.ndim
        axes = tuple(range(n)) if axis is None else tuple((a + n if a < 0 else a) if a.__class__ is int and -n <= a < n
                                                          else _raise() for a in ((axis,) if isinstance(axis, int)
                                                                                  else axis))
        if len(set(axes)) != len(axes) or n == 0: raise Fallback
        return axes

    def _reduce(self, op: Ops, axis: Any, keepdim: bool) -> "Nodes":
        u, axes = self.uop, self._axes(axis)
        shape = u.shape
        if any(shape[a] == 0 for a in axes) or all(shape[a] == 1 for a in axes): raise Fallback
        out = build.reduce_axis(u, op, axes)
        return self._new(out if keepdim else build.reshape(out, tuple(s for i, s in enumerate(shape) if i not in axes)))

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None) -> "Nodes":
        if dtype is not None and dtype != self.uop.dtype: raise Fallback
        return self._reduce(Ops.ADD, axis, keepdim)

    def max(self, axis: Any = None, keepdim: bool = False) -> "Nodes":
        from fusegrad.mixin.reduce import _fma_hazard
        if self.grad and _fma_hazard(self.uop): raise Fallback   # max stores its input first (ReduceMixin.max)
        return self._reduce(Ops.MAX, axis, keepdim)

    def mean(self, axis: Any = None, keepdim: bool = False) -> "Nodes":
        s = self._reduce(Ops.ADD, axis, keepdim)
        n = math.prod(self.shape) // max(math.prod(s.shape), 1)
        return s * (1 / n)


def _raise() -> int: raise Fallback
