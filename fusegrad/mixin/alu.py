"""The primitive elementwise ops of Tensor: casts, arithmetic and in-place operators, comparisons and bitwise ops.

Each broadcasts and promotes its operands (`Tensor._broadcasted`) and emits one ALU node; the composites written once
for Tensors and graph nodes (exp, log, sigmoid, tanh, relu, ...) are `OpMixin`'s (ir/ops.py), `mixin/math.py` composes
the rest (activations, transcendentals). `on_nodes` runs an OpMixin composite on a tensor's graph node and wraps only
the result: the same graph, node for node, without a Tensor per step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusegrad.dtype import ConstType, DType, DTypeLike, dtypes, least_upper_dtype, sum_acc_dtype, to_dtype
from fusegrad.ir import build
from fusegrad.ir.ops import OpMixin, Ops, UOp, node_of_shape
from fusegrad.autograd import custom_grad

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

_ADD, _MUL = Ops.ADD, Ops.MUL   # (bound once: a local or global instead of an attribute lookup per use)


def _shift(a: "Tensor", b: "Tensor", op: Ops) -> "Tensor":
    """a << b, a >> b with one rule on every backend (C, OpenCL, LLVM and WGSL each do something else, or nothing
    defined, for amounts outside [0, bits)): such a left shift gives 0, such a right shift 0, or -1 for negative signed
    a (all bits shifted out, as torch CPU gives). Only amounts in range reach the device."""
    bits = a.dtype.itemsize * 8
    signed = not dtypes.is_unsigned(a.dtype)
    in_range = (b < bits) if dtypes.is_unsigned(b.dtype) else (b >= 0) & (b < bits)
    if op is Ops.SHR and signed:   # shifting by bits - 1 fills with the sign bit: 0 or -1
        return a._alu(op, in_range.where(b, bits - 1))
    return in_range.where(a._alu(op, in_range.where(b, 0)), 0)


def _float_to_int(x: "Tensor", dt: DType) -> "Tensor":
    """float -> int with one rule on every backend (torch CPU's on x86; C leaves out-of-range conversions undefined):
    truncate toward zero; NaN, +-inf and values outside int32 / int64 give that type's minimum; narrower types go
    through int32 and uint64 through int64, then keep the low bits; uint32 keeps [-2**31, 2**32) modulo 2**32 and
    gives 0 for anything else (docs/tensor/dtypes.md)."""
    if x.dtype.itemsize < 4: x = x.cast(dtypes.float32)   # the bounds +-2**31 are inf in half
    if dt.scalar() == dtypes.uint32:   # without int64 (WebGPU has none): [0, 2**32) direct, [-2**31, 0) through int32
        pos = (x >= 0) & (x < 2**32)
        direct = pos.where(x, 0)._apply(lambda u: build.cast(u, dt))
        neg = ((x >= -2**31) & (x < 0)).where(x, 0)._apply(lambda u: build.cast(u, dtypes.int32))
        return pos.where(direct, neg._apply(lambda u: build.cast(u, dt)))
    wide = dtypes.int64 if dt.itemsize == 8 else dtypes.int32
    lo = -2 ** (wide.itemsize * 8 - 1)
    ok = (x >= lo) & (x < -lo)                             # False for NaN
    safe = ok.where(x, lo)._apply(lambda u: build.cast(u, wide))
    return safe if wide == dt else safe._apply(lambda u: build.cast(u, dt))


def nodes_ok(x: "Tensor", reduces: bool = True) -> bool:
    """Whether an OpMixin composite of `x` may run on x's node (`on_nodes`): x is a float whose steps detach nothing
    (no_grad with a tensor that requires grad), and, for a composite with reductions (`reduces`), one that accumulates
    in its own dtype (float32, float64: a Tensor sum of half goes through float32) with a static, non-empty shape on
    one device."""
    dt = x.dtype
    if not dtypes.is_float(dt) or (x.requires_grad and type(x).no_grad): return False
    return not reduces or (sum_acc_dtype(dt) == dt and isinstance(x.device, str) and
                           all(s.__class__ is int and s > 0 for s in x.shape))


def on_nodes(x: "Tensor", fn: Any, *args: Any, reduces: bool = True) -> "Tensor":
    """fn(x, *args), a composite written once in OpMixin, built on x's graph node and wrapped as one Tensor: the
    graph the Tensor steps build, node for node (hash-consing makes it the very same object), without a Tensor per
    step. On Tensors where `nodes_ok` says no, or where a node method refuses an argument (the Tensor steps then raise
    their own error, or handle the case)."""
    if nodes_ok(x, reduces):
        try: return type(x)._wrap(fn(x.uop, *args), x)
        except (TypeError, ValueError, IndexError): pass
    return fn(x, *args)


class ALUMixin:
    __slots__ = ()
    def cast(self: "Tensor", dtype: DTypeLike) -> "Tensor":
        dt = to_dtype(dtype)
        if self.dtype == dt: return self
        if dtypes.is_float(self.dtype) and dt.scalar() in dtypes.ints: return _float_to_int(self, dt)
        return self._apply(lambda u: build.cast(u, dt))

    def bitcast(self: "Tensor", dtype: DTypeLike) -> "Tensor":
        """Reinterpret the bits. Same itemsize: elementwise; otherwise the last axis grows or shrinks (little endian)."""
        dt = to_dtype(dtype)
        if dt.itemsize == self.dtype.itemsize:
            return self if dt == self.dtype else self._view_apply(lambda u: UOp(Ops.BITCAST, dt, (u,)))
        if self.ndim == 0: raise RuntimeError(f"bitcast from {self.dtype} to {dt} needs at least one axis")
        uint = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}
        src_u, dst_u = uint[self.dtype.itemsize], uint[dt.itemsize]
        bits = self.bitcast(src_u)
        if dt.itemsize < self.dtype.itemsize:  # split each element into r pieces along the last axis
            r = self.dtype.itemsize // dt.itemsize
            shifts = type(self)([8 * dt.itemsize * i for i in range(r)], dtype=src_u, device=self.device)
            parts = (bits.unsqueeze(-1) >> shifts) & ((1 << (8 * dt.itemsize)) - 1)
            return parts.cast(dst_u).flatten(-2).bitcast(dt)
        r = dt.itemsize // self.dtype.itemsize
        if self.shape[-1] % r: raise RuntimeError(f"bitcast to {dt}: last axis {self.shape[-1]} must divide by {r}")
        groups = bits.cast(dst_u).unflatten(-1, (self.shape[-1] // r, r))
        shifts = type(self)([8 * self.dtype.itemsize * i for i in range(r)], dtype=dst_u, device=self.device)
        return (groups << shifts).sum(-1, dtype=dst_u).bitcast(dt)

    def float(self: "Tensor") -> "Tensor": return self.cast(dtypes.float32)
    def bfloat16(self: "Tensor") -> "Tensor": return self.cast(dtypes.bfloat16)
    def short(self: "Tensor") -> "Tensor": return self.cast(dtypes.int16)
    def half(self: "Tensor") -> "Tensor": return self.cast(dtypes.float16)
    def int(self: "Tensor") -> "Tensor": return self.cast(dtypes.int32)
    def long(self: "Tensor") -> "Tensor": return self.cast(dtypes.int64)
    def bool(self: "Tensor") -> "Tensor": return self.cast(dtypes.bool)
    def double(self: "Tensor") -> "Tensor": return self.cast(dtypes.float64)

    def _node_operand(self: "Tensor", y: Any) -> UOp | None:
        """y's node where `self op y` is one ALU node of the two nodes, broadcast (`UOp._pair`), without the Tensors
        `_broadcasted` makes for the operands (a third of an elementwise op's cost): y a Tensor of self's dtype and
        device, neither from a Python scalar, static shapes where they differ, nothing to detach for no_grad. Or y a
        Python number that keeps self's dtype (a float with a float tensor, an int with a float or int one): then
        y's node is the constant at self's shape that `_broadcasted` would make, without its two Tensors."""
        T, cls = type(self), y.__class__
        if cls is float or cls is int:
            dt = self.dtype
            if self._weak or (T.no_grad and self.requires_grad) or \
                    not (dtypes.is_float(dt) or (cls is int and dtypes.is_int(dt))): return None
            return build.const(y, dt, self.device, self.shape)
        if cls is not T or self.dtype != y.dtype or self._weak or y._weak or self.device != y.device or \
                (T.no_grad and (self.requires_grad or y.requires_grad)): return None
        if self.shape != y.shape and not all(d.__class__ is int for d in self.shape + y.shape): return None
        return y.uop

    def _node_result(self: "Tensor", u: UOp, y: Any) -> "Tensor":
        """The Tensor of `self op y`'s node `u` (y a Tensor, or the Python number `_node_operand` took)."""
        return type(self)._wrap(u, self, y) if y.__class__ is type(self) else type(self)._wrap(u, self)

    def _node_binop(self: "Tensor", op: Ops, y: Any, reverse: bool) -> "Tensor | None":
        """`self op y` (ADD or MUL) as the node's own `add`/`mul` builds it (`UOp._binop`) on the nodes
        `_node_operand` gives, wrapped; None where it declines. Operands of one shape (a number's constant is made at
        self's shape) make the ALU node directly, with its shape and device (`node_of_shape`)."""
        if (b := self._node_operand(y)) is None: return None
        a = self.uop
        if (s := a.shape) is (bs := b.shape) or s == bs:
            return self._node_result(node_of_shape(op, a.dtype, (b, a) if reverse else (a, b), None, s, a.device), y)
        return self._node_result(a._binop(op, b, reverse), y)

    def add(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        if (t := self._node_binop(_ADD, x, reverse)) is not None: return t
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b)

    def sub(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        """`self - x`. A bool operand counts as an int 0/1 and is promoted first, as in tinygrad and NumPy
        (`1.0 - mask` is float32); PyTorch raises for any bool operand. Only when both sides are bool (so the
        result would be bool) it raises, as NumPy and PyTorch do (tinygrad computes `a | ~b` there)."""
        if dtypes.is_float(self.dtype) and (u := self._node_operand(x)) is not None:
            return self._node_result(self.uop.sub(u, reverse), x)
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_bool(a.dtype):
            raise RuntimeError("Subtraction, the `-` operator, of two bools is not supported (as in torch and NumPy); "
                               "to invert a mask use `~` or logical_not(), or cast to an int dtype first")
        return a._alu(Ops.ADD, b.neg())

    def mul(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        if (t := self._node_binop(_MUL, x, reverse)) is not None: return t
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.MUL, b)

    def div(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False,
            rounding_mode: str | None = None) -> "Tensor":
        """True division (ints promote to float), like torch's `/`. rounding_mode="trunc" rounds the quotient toward
        zero, "floor" toward -inf (both keep int dtypes, as torch.div does)."""
        if rounding_mode in ("trunc", "floor"):
            a, b = self._broadcasted(x, reverse)
            if not dtypes.is_float(a.dtype): return a._alu(Ops.IDIV, b) if rounding_mode == "trunc" else a.floordiv(b)
            q = (a.detach() / b.detach()).trunc() if rounding_mode == "trunc" else a.detach().floordiv(b.detach())
            if not (a.requires_grad or b.requires_grad): return q
            # a rounded quotient is piecewise constant: zero gradient for both operands (torch too), never the NaN
            # that differentiating through a / b would give where b == 0
            return custom_grad(q, [a, b], lambda g, a_, b_: (a_.zeros_like(), b_.zeros_like()), f"div_{rounding_mode}")
        if rounding_mode is not None:
            raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                               f"{rounding_mode!r}")
        if dtypes.is_float(self.dtype) and (u := self._node_operand(x)) is not None:
            return self._node_result(self.uop.div(u, reverse), x)
        a, b = self._broadcasted(x, reverse)
        a, b = a._float_or_self(), b._float_or_self()
        return a._alu(Ops.MUL, b.reciprocal())

    def floordiv(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype): return (a / b).floor()
        q = a._alu(Ops.IDIV, b)  # truncates; step down when the signs differ and there is a remainder
        fix = ((a._alu(Ops.MOD, b) != 0) & ((a < 0) != (b < 0))).cast(q.dtype)
        return q - fix

    def neg(self: "Tensor") -> "Tensor":
        if dtypes.is_bool(self.dtype): raise RuntimeError("negation of a bool tensor is not supported; use logical_not")
        return self * -1 if dtypes.is_int(self.dtype) else self._alu(Ops.NEG)

    # (reciprocal, sqrt, rsqrt, exp2, log2, exp, log, sin, cos, square: OpMixin's)
    def trunc(self: "Tensor") -> "Tensor": return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    def floor(self: "Tensor") -> "Tensor":
        if not dtypes.is_float(self.dtype): return self
        t = self.trunc()
        return t - ((self < t).cast(self.dtype))

    def relu(self: "Tensor") -> "Tensor":
        if not dtypes.is_float(self.dtype): return self.gt(0).where(self, 0)
        # (relu on the node can't refuse its one float operand: no need for on_nodes' fallback)
        return type(self)._wrap(self.uop.relu(), self) if nodes_ok(self, False) else OpMixin.relu(self)

    def sigmoid(self: "Tensor") -> "Tensor": return on_nodes(self, OpMixin.sigmoid)
    def tanh(self: "Tensor") -> "Tensor": return on_nodes(self, OpMixin.tanh)

    def abs(self: "Tensor") -> "Tensor":
        if dtypes.is_unsigned(self.dtype) or dtypes.is_bool(self.dtype): return self
        # ints: the negation wraps at the minimum, so abs(INT32_MIN) is INT32_MIN as in torch (relu sums gave 0)
        if dtypes.is_int(self.dtype): return (self < 0).where(-self, self)
        return self.relu() + (-self).relu()

    def maximum(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        a, b = self._broadcasted(x)
        if dtypes.is_bool(a.dtype): return a | b
        return a._alu(Ops.MAX, b)

    def minimum(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        a, b = self._broadcasted(x)
        if dtypes.is_bool(a.dtype): return a & b
        return ~((~a).maximum(~b)) if dtypes.is_int(a.dtype) else -((-a).maximum(-b))   # ~: see min()

    def where(self: "Tensor", x: "Tensor | ConstType", y: "Tensor | ConstType") -> "Tensor":
        """`x` where self is true, else `y` (self is cast to bool)."""
        if isinstance(x, ALUMixin): xb, yb = x._broadcasted(y)
        elif isinstance(y, ALUMixin): yb, xb = y._broadcasted(x)
        else:
            dt = dtypes.from_py(x) if type(x) is type(y) else least_upper_dtype(dtypes.from_py(x), dtypes.from_py(y))
            xb, yb = type(self)(x, device=self.device, dtype=dt), type(self)(y, device=self.device, dtype=dt)
        cond, xb = self.cast(dtypes.bool)._broadcasted(xb, match_dtype=False)
        cond, yb = cond._broadcasted(yb, match_dtype=False)
        xb, yb = xb._broadcast_to(cond.shape), yb._broadcast_to(cond.shape)
        return cond._alu(Ops.WHERE, xb, yb)

    # comparisons return bool tensors (eq, ge, le: OpMixin's, from these)
    def lt(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self._cmp(*self._broadcasted(x), Ops.CMPLT)
    def gt(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        return self._cmp(*self._broadcasted(x, True), Ops.CMPLT)
    def ne(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self._cmp(*self._broadcasted(x), Ops.CMPNE)
    def __lt__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.lt(x)
    def __gt__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.gt(x)
    def __ge__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.ge(x)
    def __le__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.le(x)
    def __ne__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.ne(x)  # type: ignore[override]
    def __eq__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.eq(x)  # type: ignore[override]

    @staticmethod
    def _cmp(a: "Tensor", b: "Tensor", op: Ops) -> "Tensor":
        return a._alu(op, b)

    def logical_not(self: "Tensor") -> "Tensor":
        return self.cast(dtypes.bool)._alu(Ops.CMPNE, type(self)._wrap(self._const(True, dtypes.bool)))

    def _bitwise(self: "Tensor", x: "Tensor | ConstType", op: Ops, reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype): raise RuntimeError(f"bitwise op {op.name} needs int or bool tensors, got {a.dtype}")
        if op in (Ops.SHL, Ops.SHR) and dtypes.is_int(a.dtype): return _shift(a, b, op)
        return a._alu(op, b)

    def __and__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self._bitwise(x, Ops.AND)
    def __or__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self._bitwise(x, Ops.OR)
    def __xor__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self._bitwise(x, Ops.XOR)
    def __lshift__(self: "Tensor", x: int) -> "Tensor": return self._bitwise(x, Ops.SHL)
    def __rshift__(self: "Tensor", x: int) -> "Tensor": return self._bitwise(x, Ops.SHR)

    def __add__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.add(x)
    def __radd__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.add(x, True)
    def __sub__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.sub(x)
    def __rsub__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.sub(x, True)
    def __mul__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.mul(x)
    def __rmul__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.mul(x, True)
    def __truediv__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.div(x)
    def __rtruediv__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.div(x, True)
    def __floordiv__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.floordiv(x)
    def __rfloordiv__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self.floordiv(x, True)
    def __neg__(self: "Tensor") -> "Tensor": return self.neg()
    # in-place operators update the tensor itself (through assign), so other references see the new value
    def __iadd__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self + x)
    def __isub__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self - x)
    def __imul__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self * x)
    def __itruediv__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self / x)
    def __ifloordiv__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self // x)
    def __ipow__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self ** x)
    def __iand__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self & x)
    def __ior__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self | x)
    def __ixor__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self ^ x)
    def __ilshift__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self << x)
    def __irshift__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self >> x)
    def __imatmul__(self: "Tensor", x: Any) -> "Tensor": return self.assign(self @ x)
    def __rlshift__(self: "Tensor", x: Any) -> "Tensor": return self._bitwise(x, Ops.SHL, True)
    def __rrshift__(self: "Tensor", x: Any) -> "Tensor": return self._bitwise(x, Ops.SHR, True)

    def __delitem__(self: "Tensor", idx: Any) -> None:
        raise TypeError("Tensor does not support deleting items")
    def __matmul__(self: "Tensor", x: "Tensor") -> "Tensor": return self.matmul(x)
    def __rmatmul__(self: "Tensor", x: "Tensor") -> "Tensor": return x.matmul(self)
