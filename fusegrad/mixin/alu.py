"""The primitive elementwise ops of Tensor: casts, arithmetic and in-place operators, comparisons and bitwise ops.

Each broadcasts and promotes its operands (`Tensor._broadcasted`) and emits one ALU node; `mixin/math.py` composes
the rest (activations, transcendentals) from these.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fusegrad.dtype import ConstType, DType, DTypeLike, dtypes, least_upper_dtype, least_upper_float, to_dtype
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp
from fusegrad.mixin.nn import custom_grad
from fusegrad.mixin.nodes import broadcast_static, expand_to, on_nodes, usable

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


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


def _float_fast(x: "Tensor") -> bool:
    """Whether a composite op on float `x` may build its nodes directly and wrap only the result: the graph is the one
    the Tensor-level composition builds (a Python scalar operand takes x's own float dtype) as long as no intermediate
    would be detached (no_grad with a tensor that requires grad)."""
    return dtypes.is_float(x.dtype) and not (x.requires_grad and type(x).no_grad)


def _relu_uop(u: UOp, zero: UOp) -> UOp:
    """`(x > 0) | x.isnan()).where(x, 0)` as nodes (relu(NaN) is NaN, relu'(0) = 0); `zero` is 0 at x's shape."""
    keep = UOp(Ops.OR, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (zero, u)), UOp(Ops.CMPNE, dtypes.bool, (u, u))))
    return UOp(Ops.WHERE, u.dtype, (keep, u, zero))


def _sigmoid(self: Any) -> Any:
    # each branch only sees inputs where its exp can't overflow, so values and gradients never meet inf*0
    x = self._float_or_self()
    pos = x >= 0
    ep, en = (-pos.where(x, 0)).exp(), pos.where(0, x).exp()
    return pos.where(1 / (1 + ep), en / (1 + en))


def _tanh(self: Any) -> Any: return 2.0 * (2.0 * self._float_or_self()).sigmoid() - 1.0


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

    def _float_or_self(self: "Tensor") -> "Tensor":
        return self.cast(least_upper_float(self.dtype)) if not dtypes.is_float(self.dtype) else self

    def _pair_nodes(self: "Tensor", y: Any, reverse: bool) -> "tuple[UOp, UOp] | None":
        """The nodes `_broadcasted` gives two tensors of one dtype with static shapes, without the Tensors it makes
        for the broadcast operands (a third of an elementwise op's cost); None where it would do more than that."""
        T = type(self)
        if y.__class__ is not T or self.dtype != y.dtype or self._weak or y._weak or self.device != y.device or \
                (T.no_grad and (self.requires_grad or y.requires_grad)): return None
        a, b, xs, ys = self.uop, y.uop, self.shape, y.shape
        if xs != ys:
            if not all(d.__class__ is int for d in xs + ys): return None
            if (shape := broadcast_static(xs, ys)) is None: return None   # (the Tensor path raises the error)
            a, b = expand_to(a, shape), expand_to(b, shape)
        return (b, a) if reverse else (a, b)

    def add(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        if (p := self._pair_nodes(x, reverse)) is not None: return type(self)._wrap(build.alu(Ops.ADD, *p), self, x)
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b)

    def sub(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        """`self - x`. A bool operand counts as an int 0/1 and is promoted first, as in tinygrad and NumPy
        (`1.0 - mask` is float32); PyTorch raises for any bool operand. Only when both sides are bool (so the
        result would be bool) it raises, as NumPy and PyTorch do (tinygrad computes `a | ~b` there)."""
        if dtypes.is_float(self.dtype) and (p := self._pair_nodes(x, reverse)) is not None:
            a, b = p
            return type(self)._wrap(build.alu(Ops.ADD, a, UOp(Ops.NEG, b.dtype, (b,))), self, x)
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_bool(a.dtype):
            raise RuntimeError("Subtraction, the `-` operator, of two bools is not supported (as in torch and NumPy); "
                               "to invert a mask use `~` or logical_not(), or cast to an int dtype first")
        return a._alu(Ops.ADD, b.neg())

    def mul(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        if (p := self._pair_nodes(x, reverse)) is not None: return type(self)._wrap(build.alu(Ops.MUL, *p), self, x)
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
        if dtypes.is_float(self.dtype) and (p := self._pair_nodes(x, reverse)) is not None:
            a, b = p
            return type(self)._wrap(build.alu(Ops.MUL, a, UOp(Ops.RECIPROCAL, b.dtype, (b,))), self, x)
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

    def reciprocal(self: "Tensor") -> "Tensor": return self._float_or_self()._alu(Ops.RECIPROCAL)
    def sqrt(self: "Tensor") -> "Tensor": return self._float_or_self()._alu(Ops.SQRT)
    def rsqrt(self: "Tensor") -> "Tensor": return self.sqrt().reciprocal()
    def exp2(self: "Tensor") -> "Tensor": return self._float_or_self()._alu(Ops.EXP2)
    def log2(self: "Tensor") -> "Tensor": return self._float_or_self()._alu(Ops.LOG2)
    def exp(self: "Tensor") -> "Tensor": return (self._float_or_self() * (1 / math.log(2))).exp2()
    def log(self: "Tensor") -> "Tensor": return self.log2() * math.log(2)
    def sin(self: "Tensor") -> "Tensor": return self._float_or_self()._alu(Ops.SIN)
    def cos(self: "Tensor") -> "Tensor": return ((math.pi / 2) - self._float_or_self()).sin()
    def square(self: "Tensor") -> "Tensor": return self * self
    def trunc(self: "Tensor") -> "Tensor": return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    def floor(self: "Tensor") -> "Tensor":
        if not dtypes.is_float(self.dtype): return self
        t = self.trunc()
        return t - ((self < t).cast(self.dtype))

    def relu(self: "Tensor") -> "Tensor":
        if _float_fast(self): return type(self)._wrap(_relu_uop(self.uop, self._const(0)), self)
        keep = (self > 0) | self.isnan() if dtypes.is_float(self.dtype) else self > 0   # relu(NaN) is NaN, relu'(0)=0
        return keep.where(self, 0)

    def sigmoid(self: "Tensor") -> "Tensor": return on_nodes(self, _sigmoid) if usable(self) else _sigmoid(self)
    def tanh(self: "Tensor") -> "Tensor": return on_nodes(self, _tanh) if usable(self) else _tanh(self)

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

    # comparisons return bool tensors
    def __lt__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self._cmp(*self._broadcasted(x), Ops.CMPLT)
    def __gt__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        return self._cmp(*self._broadcasted(x, True), Ops.CMPLT)
    def __ge__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        return (self > x) | (self == x)  # NaN compares False
    def __le__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return (self < x) | (self == x)
    def __ne__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        return self._cmp(*self._broadcasted(x), Ops.CMPNE)  # type: ignore[override]
    def __eq__(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        return (self != x).logical_not()  # type: ignore[override]
    def eq(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self == x
    def ne(self: "Tensor", x: "Tensor | ConstType") -> "Tensor": return self != x

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
