"""Elementwise ops (unary math, activations, broadcasting binary and variadic ops, Where, Clip), casts,
constants and the matmul family (MatMul, Gemm, Einsum, MatMulInteger, Det)."""

from __future__ import annotations

import math

import numpy as np

from fusegrad.dtype import dtypes
from fusegrad.onnx.ops.base import EXOTIC, OPS, as_str_array, cast_like, is_str_array, onnx_dtype, op, to_exotic, \
    to_tensor
from fusegrad.tensor import Tensor

# ---------------------------------------------------------------- elementwise
_UNARY = {
    "Abs": Tensor.abs,
    "Neg": Tensor.neg,
    "Exp": Tensor.exp,
    "Log": Tensor.log,
    "Sqrt": Tensor.sqrt,
    "Reciprocal": Tensor.reciprocal,
    "Floor": Tensor.floor,
    "Ceil": Tensor.ceil,
    "Round": Tensor.round,
    "Sign": Tensor.sign,
    "Sin": Tensor.sin,
    "Cos": Tensor.cos,
    "Tan": Tensor.tan,
    "Asin": Tensor.asin,
    "Acos": Tensor.acos,
    "Atan": Tensor.atan,
    "Sinh": Tensor.sinh,
    "Cosh": Tensor.cosh,
    "Asinh": Tensor.asinh,
    "Acosh": Tensor.acosh,
    "Atanh": Tensor.atanh,
    "Erf": Tensor.erf,
    "Sigmoid": Tensor.sigmoid,
    "Tanh": Tensor.tanh,
    "Relu": Tensor.relu,
    "Softplus": Tensor.softplus,
    "Softsign": Tensor.softsign,
    "Not": Tensor.logical_not,
    "IsNaN": Tensor.isnan,
    "HardSwish": Tensor.hardswish,
    "BitwiseNot": Tensor.bitwise_not,
}
for _n, _f in _UNARY.items():
    OPS[_n] = (lambda f: lambda ctx, x, **kw: f(x))(_f)


@op("Mish")
def _mish(ctx, x, **kw):
    return cast_like(x * (x.exp() + 1).log().tanh(), x)


@op("Identity")
def _identity(ctx, x, **kw):
    return x  # strings too


@op("IsInf")
def _isinf(ctx, x, detect_negative=1, detect_positive=1):
    neg, pos = (x == -math.inf), (x == math.inf)
    if detect_negative and detect_positive:
        return neg.bitwise_or(pos)
    return neg if detect_negative else pos if detect_positive else neg.bitwise_and(pos)


@op("HardSigmoid")
def _hardsigmoid(ctx, x, alpha=0.2, beta=0.5):
    return (x * alpha + beta).clip(0, 1)


@op("Elu")
def _elu(ctx, x, alpha=1.0):
    return x.elu(alpha)


@op("Selu")
def _selu(ctx, x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return gamma * (x > 0).where(x, alpha * (x.exp() - 1))


@op("Celu")
def _celu(ctx, x, alpha=1.0):
    return x.celu(alpha)


@op("LeakyRelu")
def _leaky(ctx, x, alpha=0.01):
    return (x >= 0).where(x, x * alpha)


@op("ThresholdedRelu")
def _trelu(ctx, x, alpha=1.0):
    return (x > alpha).where(x, 0)


@op("PRelu")
def _prelu(ctx, x, slope):
    return (x >= 0).where(x, x * slope)


@op("Gelu")
def _gelu(ctx, x, approximate="none"):
    return x.gelu("tanh" if approximate == "tanh" else "none")


@op("Shrink")
def _shrink(ctx, x, bias=0.0, lambd=0.5):
    return (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)


@op("Swish")
def _swish(ctx, x, alpha=1.0):
    return x * (x * alpha).sigmoid()


def _binop(f):
    return lambda ctx, a, b, **kw: f(a, b)


OPS.update(
    {
        "Add": _binop(lambda a, b: cast_like(a + b, a)),
        "Sub": _binop(lambda a, b: cast_like(a - b, a)),
        "Mul": _binop(lambda a, b: cast_like(a * b, a)),
        "Equal": _binop(lambda a, b: Tensor(np.equal(as_str_array(a), as_str_array(b)).astype(bool)) if is_str_array(a)
                        else a == b),
        "Less": _binop(lambda a, b: a < b),
        "Greater": _binop(lambda a, b: a > b),
        "LessOrEqual": _binop(lambda a, b: a <= b),
        "GreaterOrEqual": _binop(lambda a, b: a >= b),
        "And": _binop(lambda a, b: a.bitwise_and(b)),
        "Or": _binop(lambda a, b: a.bitwise_or(b)),
        "Xor": _binop(lambda a, b: a.bitwise_xor(b)),
        "BitwiseAnd": _binop(lambda a, b: a.bitwise_and(b)),
        "BitwiseOr": _binop(lambda a, b: a.bitwise_or(b)),
        "BitwiseXor": _binop(lambda a, b: a.bitwise_xor(b)),
    }
)


@op("Div")
def _div(ctx, a, b):
    if dtypes.is_int(a.dtype):
        return cast_like(a.div(b, rounding_mode="trunc"), a)
    return cast_like(a / b, a)


@op("Pow")
def _pow(ctx, a, b):
    if dtypes.is_int(a.dtype):
        return cast_like(
            a.cast(dtypes.float64 if a.dtype in (dtypes.int64, dtypes.uint64) else dtypes.float32)
            .pow(b.cast(dtypes.float32))
            .round(),
            a,
        )
    return cast_like(a.pow(b.cast(a.dtype) if dtypes.is_int(b.dtype) else b), a)


@op("Mod")
def _mod(ctx, a, b, fmod=0):
    if fmod:
        return cast_like(a.fmod(b), a)
    return cast_like(a.mod(b), a)


@op("BitShift")
def _bitshift(ctx, a, b, direction="LEFT"):
    bits = a.dtype.itemsize * 8
    b = cast_like(b, a)
    out_of_range = (b < 0) | (b >= bits) if not dtypes.is_unsigned(a.dtype) else (b >= bits)
    safe = out_of_range.where(0, b)
    if direction == "LEFT":
        return out_of_range.where(0, cast_like(a.lshift(safe), a))
    fill = (a < 0).where(-1, 0) if not dtypes.is_unsigned(a.dtype) else 0
    return out_of_range.where(cast_like(Tensor(fill) if isinstance(fill, int) else fill, a),
                              cast_like(a.rshift(safe), a))


def _variadic(f):
    def fn(ctx, *xs, **kw):
        out = xs[0]
        for x in xs[1:]:
            out = f(out, x)
        return out

    return fn


OPS["Max"] = _variadic(lambda a, b: a.maximum(b))
OPS["Min"] = _variadic(lambda a, b: a.minimum(b))
OPS["Sum"] = _variadic(lambda a, b: a + b)


@op("Mean")
def _mean(ctx, *xs):
    return OPS["Sum"](ctx, *xs) / len(xs)


@op("Where")
def _where(ctx, c, a, b):
    return c.bool().where(a, b)


@op("Clip")
def _clip(ctx, x, lo=None, hi=None, min=None, max=None):
    lo = min if lo is None and min is not None else lo
    hi = max if hi is None and max is not None else hi
    if lo is not None:
        x = x.maximum(lo)
    if hi is not None:
        x = x.minimum(hi)
    return x


# ---------------------------------------------------------------- casts and constants
@op("Cast")
def _cast(ctx, x, to, saturate=1, round_mode="up"):
    if to in EXOTIC:
        ctx.runner.logical[ctx.node.output[0]] = to
        return to_exotic(x, to, saturate)
    dt = onnx_dtype(to)
    if dtypes.is_float(x.dtype) and dtypes.is_int(dt) and not dtypes.is_unsigned(dt):
        return x.trunc().cast(dt)
    return x.cast(dt)


@op("BitCast")
def _bitcast(ctx, x, to):
    return x.bitcast(onnx_dtype(to))


@op("CastLike")
def _castlike(ctx, x, like, saturate=1, round_mode="up"):
    et = ctx.runner.logical.get(ctx.node.input[1])
    if et is not None:
        return _cast(ctx, x, et, saturate)
    return x.cast(like.dtype)


@op("Constant")
def _constant(ctx, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None, **kw):
    if value is not None:
        return to_tensor(value, None, ctx.runner.device)
    if value_float is not None:
        return Tensor(np.array(value_float, np.float32))
    if value_floats is not None:
        return Tensor(np.array(value_floats, np.float32))
    if value_int is not None:
        return Tensor(np.array(value_int, np.int64))
    if value_ints is not None:
        return Tensor(np.array(value_ints, np.int64))
    raise NotImplementedError(f"Constant with attributes {sorted(kw)}")


@op("ConstantOfShape")
def _constofshape(ctx, shape, value=None):
    val = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    shp = tuple(ctx.ints(0))
    return to_tensor(np.full(shp, val[0], dtype=val.dtype))


@op("Shape")
def _shape(ctx, x, start=0, end=None):
    arr = np.array(x.shape[start:end], dtype=np.int64)
    ctx.npscope[ctx.node.output[0]] = arr  # static: later shape arithmetic folds without reading a Tensor
    return Tensor(arr)


@op("Size")
def _size(ctx, x):
    arr = np.array(x.numel(), dtype=np.int64)
    ctx.npscope[ctx.node.output[0]] = arr
    return Tensor(arr)


@op("Range")
def _range(ctx, start, limit, delta):
    s, l, d = ctx.np(0).item(), ctx.np(1).item(), ctx.np(2).item()
    return to_tensor(np.arange(s, l, d, dtype=ctx.np(0).dtype))


@op("EyeLike")
def _eyelike(ctx, x, dtype=None, k=0):
    dt = x.dtype if dtype is None else onnx_dtype(dtype)
    return to_tensor(np.eye(x.shape[0], x.shape[1], k=k)).cast(dt)


# ---------------------------------------------------------------- matmul family
@op("MatMul")
def _matmul(ctx, a, b):
    return a.matmul(b)


@op("Gemm")
def _gemm(ctx, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    if transA:
        a = a.T
    if transB:
        b = b.T
    out = a.matmul(b)
    if alpha != 1.0:
        out = out * alpha
    if c is not None:
        out = out + (c * beta if beta != 1.0 else c)
    return cast_like(out, a)


@op("Einsum")
def _einsum(ctx, *xs, equation):
    return Tensor.einsum(equation.replace(" ", ""), *xs)


@op("MatMulInteger")
def _matmulint(ctx, a, b, a_zp=None, b_zp=None):
    a = a.cast(dtypes.int32) - (a_zp.cast(dtypes.int32) if a_zp is not None else 0)
    b = b.cast(dtypes.int32) - (b_zp.cast(dtypes.int32) if b_zp is not None else 0)
    return a.matmul(b).cast(dtypes.int32)


@op("Det")
def _det(ctx, x):  # realizes: small matrices, exact against numpy's LU
    return to_tensor(np.linalg.det(x.numpy()).astype(ctx.np(0).dtype))
