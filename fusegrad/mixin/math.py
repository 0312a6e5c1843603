"""Elementwise math and activations for Tensor, each composed from the primitive ALU ops (so autograd and every
backend get them for free). Formulas are chosen to be stable at the extremes (large |x|, 0, inf).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fusegrad.dtype import ConstType, dtypes
from fusegrad.ir.ops import OpMixin, Ops
from fusegrad.mixin.alu import on_nodes
from fusegrad.autograd import custom_grad

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


class MathMixin:
    __slots__ = ()
    # ----- unary math -----
    def log10(self: "Tensor") -> "Tensor": return self.log2() * (math.log(2) / math.log(10))
    def tan(self: "Tensor") -> "Tensor": return self.sin() / self.cos()

    def atan(self: "Tensor") -> "Tensor":
        """Range-reduced odd polynomial: |x|>1 uses pi/2 - atan(1/x); |x|>tan(pi/8) uses pi/4 + atan((x-1)/(x+1))."""
        x = self._float_or_self()
        ax = x.abs()
        big = ax > 1
        a = big.where(1 / ax.maximum(1e-30), ax)              # now in [0, 1]
        mid = a > 0.41421356237309503
        b = mid.where((a - 1) / (a + 1), a)                    # now in [-0.4143, 0.4143]
        b2 = b * b
        poly = b.zeros_like()
        for k in range(15, 0, -2): poly = poly * b2 + ((-1) ** ((k - 1) // 2)) / k
        r = poly * b
        r = mid.where(r + math.pi / 4, r)
        r = big.where(math.pi / 2 - r, r)
        return x.sign() * r  # r is NaN where x is

    def asin(self: "Tensor") -> "Tensor":
        x = self._float_or_self()
        out = (x / (1 - x * x).sqrt()).atan()
        out = (x.abs() == 1).where(x.sign() * (math.pi / 2), out)
        return (x.abs() > 1).where(math.nan, out)

    def acos(self: "Tensor") -> "Tensor": return math.pi / 2 - self.asin()

    def ceil(self: "Tensor") -> "Tensor":
        if not dtypes.is_float(self.dtype): return self
        t = self.trunc()
        return t + (self > t).cast(self.dtype)

    def round(self: "Tensor") -> "Tensor":
        """Round half to even, like torch.round."""
        if not dtypes.is_float(self.dtype): return self
        f = self.floor()
        d = self - f
        up = (d > 0.5) | ((d == 0.5) & ((f * 0.5).floor() * 2 != f))
        return f + up.cast(self.dtype)

    def isinf(self: "Tensor", detect_positive: bool = True, detect_negative: bool = True) -> "Tensor":
        if not dtypes.is_float(self.dtype): return self.zeros_like(dtype=dtypes.bool)
        return ((self == math.inf) & detect_positive) | ((self == -math.inf) & detect_negative)

    def isfinite(self: "Tensor") -> "Tensor": return (self.isinf() | self.isnan()).logical_not()

    def lerp(self: "Tensor", end: "Tensor", weight: "Tensor | ConstType") -> "Tensor":
        return self + (end - self) * weight

    def clamp(self: "Tensor", min_: Any = None, max_: Any = None) -> "Tensor":
        """Elementwise bounds (either may be None). Selects rather than max/min, so the gradient is 1 at a bound (like
        torch), NaN stays NaN, and min_ > max_ gives max_.

        ```python
        Tensor([-2.0, 0.5, 3.0]).clamp(-1, 1).tolist()   # [-1.0, 0.5, 1.0]
        ```
        """
        if min_ is None and max_ is None: raise RuntimeError("clamp needs at least one of min and max")
        x = self if min_ is None else (self < min_).where(min_, self)
        x = x if max_ is None else (x > max_).where(max_, x)
        # NaN stays NaN with a zero gradient, as in torch (its gradient mask is lo <= x <= hi)
        return self.isnan().where(self.detach(), x) if dtypes.is_float(x.dtype) else x

    def clip(self: "Tensor", min_: Any = None, max_: Any = None) -> "Tensor": return self.clamp(min_, max_)

    def sign(self: "Tensor") -> "Tensor":
        """-1, 0 or 1; sign(+-0) and sign(NaN) are 0, like torch."""
        if dtypes.is_bool(self.dtype): return self
        return self._zero_grad_through((self > 0).cast(self.dtype) - (self < 0).cast(self.dtype))

    def _zero_grad_through(self: "Tensor", out: "Tensor | ConstType") -> "Tensor":
        """`out`, with self kept in the graph at gradient zero: torch gives such ops a zero gradient, not none."""
        return self.zeros_like(dtype=dtypes.bool).where(self, out)

    # ----- activations -----
    def logsigmoid(self: "Tensor") -> "Tensor": return -(-self).softplus()
    def hardsigmoid(self: "Tensor", alpha: float = 1 / 6, beta: float = 0.5) -> "Tensor":
        # selects instead of relu differences, so +-inf give 1/0 (not inf - inf) and the kinks get gradient 0
        y = alpha * self + beta
        return (y <= 0).where(0, (y >= 1).where(1, y))
    # elu, celu, selu: exp of the non-positive part only. exp(x) of a large positive x is inf (past 11 in float16, 88
    # in float32), and the gradient that a select or relu masks to 0 became 0 * inf = NaN (torch: 1)
    def _nonpositive(self: "Tensor") -> "Tensor": return (self > 0).where(0, self)
    def elu(self: "Tensor", alpha: float = 1.0) -> "Tensor":
        return self.relu() + alpha * (self._nonpositive().exp() - 1)
    def celu(self: "Tensor", alpha: float = 1.0) -> "Tensor":
        return self.maximum(0) + alpha * ((self._nonpositive() / alpha).exp() - 1)
    def selu(self: "Tensor", alpha: float = 1.67326, gamma: float = 1.0507) -> "Tensor":
        return gamma * (self >= 0).where(self, alpha * (self._nonpositive().exp() - 1))
    def swish(self: "Tensor") -> "Tensor": return self * self.sigmoid()
    def silu(self: "Tensor") -> "Tensor": return self.swish()
    def relu6(self: "Tensor") -> "Tensor":   # (elementwise only: any float dtype can run it on nodes)
        return on_nodes(self, OpMixin.relu6, reduces=False)
    def hardswish(self: "Tensor") -> "Tensor": return self * (self + 3).relu6() * (1 / 6)
    def sinh(self: "Tensor") -> "Tensor": return (self.exp() - self.neg().exp()) / 2
    def cosh(self: "Tensor") -> "Tensor": return (self.exp() + self.neg().exp()) / 2
    def atanh(self: "Tensor") -> "Tensor": return ((1 + self) / (1 - self)).log() / 2
    def asinh(self: "Tensor") -> "Tensor":
        ax = self.abs()
        return self.sign() * (ax + (ax.square() + 1).sqrt()).log()
    def acosh(self: "Tensor") -> "Tensor": return (self + (self.square() - 1).sqrt()).log()
    def hardtanh(self: "Tensor", min_val: float = -1, max_val: float = 1) -> "Tensor": return self.clip(min_val, max_val)

    def erf(self: "Tensor") -> "Tensor":
        """Abramowitz & Stegun 7.1.26 (max abs error 1.5e-7)."""
        x = self._float_or_self()
        t = 1.0 / (1.0 + 0.3275911 * x.abs())
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        return x.sign() * (1.0 - poly * (-(x * x)).exp())

    def gelu(self: "Tensor", approximate: str = "tanh") -> "Tensor":
        """GELU. The default, approximate="tanh", is tinygrad's default (the tanh formula); approximate="none" is the
        exact erf form, PyTorch's default. The two differ by less than 1e-3.

        ```python
        Tensor([1.0]).gelu().item(), Tensor([1.0]).gelu("none").item()   # 0.8412, 0.8413
        ```
        """
        if approximate not in ("tanh", "none"): raise RuntimeError(f"gelu: approximate must be 'tanh' or 'none', "
                                                                   f"got {approximate!r}")
        if approximate == "tanh": return on_nodes(self, OpMixin._gelu_tanh)
        return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())

    def quick_gelu(self: "Tensor") -> "Tensor": return self * (self * 1.702).sigmoid()
    def leaky_relu(self: "Tensor", neg_slope: float = 0.01) -> "Tensor": return (self < 0).where(neg_slope * self, self)
    def mish(self: "Tensor") -> "Tensor": return self * self.softplus().tanh()

    def softplus(self: "Tensor", beta: float = 1.0, threshold: float = 20.0) -> "Tensor":
        """log(1 + exp(beta x)) / beta, linear above `threshold` like torch; stable for large negative x."""
        bx = self * beta
        stable = (bx.maximum(0) + (-bx.abs()).exp()._log1p()) * (1 / beta)
        return (bx > threshold).where(self, stable)

    def _log1p(self: "Tensor") -> "Tensor":
        # log(1+x) computed so that tiny x keeps precision: log(u) * x / (u - 1) with u = 1 + x
        u = 1 + self
        exact = u == 1   # the other branch's 0/0 there must not reach the gradient as NaN * 0
        return exact.where(self, u.log() * self / exact.where(1, u - 1))

    def softsign(self: "Tensor") -> "Tensor": return self / (1 + self.abs())

    # ----- binary -----
    def mod(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        """Python-style modulo: the result has the sign of the divisor."""
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype): return a - (a / b).floor() * b
        r = a._alu(Ops.MOD, b)
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def fmod(self: "Tensor", x: "Tensor | ConstType") -> "Tensor":
        """C-style remainder: the result has the sign of the dividend."""
        a, b = self._broadcasted(x)
        if dtypes.is_float(a.dtype):
            q = (a / b).trunc()
            return (q == 0).where(a, a - q * b)   # |a| < |b|: a itself (also for b = +-inf, where q * b is NaN)
        return a._alu(Ops.MOD, b)

    def bitwise_and(self: "Tensor", x: Any, reverse: bool = False) -> "Tensor": return self.__and__(x)
    def bitwise_or(self: "Tensor", x: Any, reverse: bool = False) -> "Tensor": return self.__or__(x)
    def bitwise_xor(self: "Tensor", x: Any, reverse: bool = False) -> "Tensor": return self.__xor__(x)

    def bitwise_not(self: "Tensor") -> "Tensor":
        if dtypes.is_float(self.dtype): raise RuntimeError(f"bitwise_not needs an int or bool tensor, got {self.dtype}")
        return self.logical_not() if dtypes.is_bool(self.dtype) else self ^ -1

    def __invert__(self: "Tensor") -> "Tensor": return self.bitwise_not()
    def lshift(self: "Tensor", x: Any, reverse: bool = False) -> "Tensor": return x << self if reverse else self << x
    def rshift(self: "Tensor", x: Any, reverse: bool = False) -> "Tensor": return x >> self if reverse else self >> x
    def __rand__(self: "Tensor", x: Any) -> "Tensor": return self & x
    def __ror__(self: "Tensor", x: Any) -> "Tensor": return self | x
    def __rxor__(self: "Tensor", x: Any) -> "Tensor": return self ^ x
    def __mod__(self: "Tensor", x: Any) -> "Tensor": return self.mod(x)
    def __rmod__(self: "Tensor", x: Any) -> "Tensor": return self.mod(x, True)
    def __pow__(self: "Tensor", x: Any) -> "Tensor": return self.pow(x)
    def __rpow__(self: "Tensor", x: Any) -> "Tensor": return self.pow(x, True)

    def pow(self: "Tensor", x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        """self ** x (x ** self with reverse=True), with torch's values and gradients.

        Small constant integer exponents multiply exactly and keep an int dtype; an int base to a negative constant
        int power raises RuntimeError (as in torch and tinygrad). Otherwise `0 ** 0 == 1`, a negative finite base with
        a fractional exponent is NaN, `(-inf) ** 0.5 == inf`, and the gradients are torch's: zero for the base where
        the exponent is 0 and for the exponent where the base is 0 (and the exponent >= 0).

        ```python
        (Tensor([0.0, -8.0, 2.0]) ** Tensor([0.0, 0.5, 3.0])).tolist()   # [1.0, nan, 8.0]
        (2 ** Tensor([1, 2, 3])).tolist()                                 # [2, 4, 8] (int)
        ```
        """
        if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer() \
                and abs(x) <= 16:
            n = int(x)
            if isinstance(x, float) and not dtypes.is_float(self.dtype):   # int ** 2.0 is float, as in torch
                return self._float_or_self().pow(x)
            if n < 0 and not dtypes.is_float(self.dtype):
                raise RuntimeError(f"Integers to negative integer powers are not allowed (got {self.dtype} ** {n})")
            # ones everywhere (also at 0, inf, NaN), but kept in the graph so the base gets a zero gradient, like torch
            if n == 0: return self._zero_grad_through(1)
            # negative: powers of 1/x, so the gradient at 0 is -inf like torch's (1/x**k gave inf * 0 = NaN)
            acc, p, k = None, (self if n > 0 else self.reciprocal()), abs(n)
            while k:
                if k & 1: acc = p if acc is None else acc * p
                k >>= 1
                if k: p = p * p
            assert acc is not None
            return acc
        b, e = self._broadcasted(x, reverse)
        if dtypes.is_int(b.dtype) and dtypes.is_int(e.dtype): return _int_pow(b, e)
        b, e = b._float_or_self(), e._float_or_self()
        if not (b.requires_grad or e.requires_grad): return _pow_value(b, e)
        return custom_grad(_pow_value(b.detach(), e.detach()), [b, e], _pow_backward, "pow")

    def copysign(self: "Tensor", other: "Tensor | ConstType") -> "Tensor":
        a, b = self._broadcasted(other)
        a = a._float_or_self()
        neg_b = (b < 0) | ((b == 0) & ((1 / b._float_or_self()) < 0))
        return neg_b.where(-a.abs(), a.abs())

    def logaddexp(self: "Tensor", other: "Tensor | ConstType") -> "Tensor":
        a, b = self._broadcasted(other)
        m = a.maximum(b)
        m = m.isinf().where(0, m)  # both -inf (or an inf): shifting by m would make inf - inf
        return m + ((a - m).exp() + (b - m).exp()).log()


def _pow_value(b: "Tensor", e: "Tensor") -> "Tensor":
    """b ** e for float tensors of one shape: exp2(e * log2|b|) with C's sign and special-value rules."""
    mag = (e * b.abs().log2()).exp2()
    is_int = e == e.trunc()
    odd = is_int & ((e - 2 * (e * 0.5).floor()) == 1)
    neg = b < 0
    out = (neg & odd).where(-mag, mag)
    out = (neg & is_int.logical_not() & b.isfinite()).where(math.nan, out)   # (-8) ** 0.5; but (-inf) ** 0.5 = inf
    one = (e == 0) | (b == 1) | ((b == -1) & e.isinf())                        # 0 ** 0, 1 ** nan, (-1) ** inf
    return one.where(1.0, out)


def _int_pow(b: "Tensor", e: "Tensor") -> "Tensor":
    """Exact integer b ** e (wrapping on overflow, as torch's), by squaring over the exponent's bits. The products run
    in an unsigned type, where wrapping is defined. A negative exponent gives 1 / b ** |e| truncated: 0 unless
    |b| == 1."""
    wide = dtypes.uint64 if b.dtype.itemsize == 8 else dtypes.uint32
    bits = 8 * e.dtype.itemsize - (0 if dtypes.is_unsigned(e.dtype) else 1)
    ee = e if dtypes.is_unsigned(e.dtype) else e.maximum(0)
    acc, p = b.ones_like(dtype=wide), b.cast(wide)
    for k in range(bits):
        acc = (((ee >> k) & 1) == 1).where(acc * p, acc)
        if k < bits - 1: p = p * p
    out = acc.cast(b.dtype)
    if dtypes.is_unsigned(e.dtype): return out
    odd = (e & 1) == 1
    neg = (b == 1).where(1, (b == -1).where(odd.where(-1, 1), 0)).cast(b.dtype) if not dtypes.is_unsigned(b.dtype) \
        else (b == 1).cast(b.dtype)
    return (e < 0).where(neg, out)


def _pow_backward(g: "Tensor", b: "Tensor", e: "Tensor") -> tuple["Tensor", "Tensor"]:
    """torch's pow gradients: e * b ** (e - 1) (0 where e == 0) and b ** e * log(b) (0 where b == 0 and e >= 0)."""
    gb = (e == 0).where(0.0, g * e * _pow_value(b, e - 1))
    ge = ((b == 0) & (e >= 0)).where(0.0, g * _pow_value(b, e) * b.log())
    return gb, ge
