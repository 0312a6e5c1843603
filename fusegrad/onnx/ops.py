"""ONNX operators as fusegrad Tensor calls: one function per op_type, `fn(ctx, *inputs, **attributes)`.

Each function returns a value or a tuple of values (one per node output). Inputs that fix shapes (Reshape's shape,
Slice's starts, ...) are read as numpy through `ctx.np(i)`; everything else stays lazy.
"""

from __future__ import annotations
import math
from typing import Any, Callable
import numpy as np
from fusegrad.tensor import Tensor
from fusegrad.dtype import dtypes

OPS: dict[str, Callable] = {}


class UnsupportedOp(NotImplementedError):
    """An ONNX node fusegrad cannot run; the message names the op, the node and the opset."""

    def __init__(self, op: str, node: str, opset: int, domain: str = "ai.onnx", why: str = ""):
        self.op, self.node, self.opset = op, node, opset
        super().__init__(
            f"ONNX op {op!r} (domain {domain}, opset {opset}) in node {node!r} is not supported by fusegrad"
            + (f": {why}" if why else "")
        )


def op(*names: str):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn

    return deco


# ---------------------------------------------------------------- dtypes and attributes
def onnx_dtype(t: int):
    """ONNX TensorProto elem_type -> fusegrad dtype."""
    m = {
        1: dtypes.float32,
        2: dtypes.uint8,
        3: dtypes.int8,
        4: dtypes.uint16,
        5: dtypes.int16,
        6: dtypes.int32,
        7: dtypes.int64,
        9: dtypes.bool,
        10: dtypes.float16,
        11: dtypes.float64,
        12: dtypes.uint32,
        13: dtypes.uint64,
        16: dtypes.bfloat16,
    }
    if t not in m:
        raise NotImplementedError(f"ONNX elem_type {t} has no fusegrad dtype")
    return m[t]


# ONNX types fusegrad has no dtype for (float8/float4/int4/int2 ...): held as float32 / int8 / uint8 Tensors whose
# values are exactly representable in the ONNX type; Cast/QuantizeLinear round into them, outputs convert back
EXOTIC = {
    17: np.float32,
    18: np.float32,
    19: np.float32,
    20: np.float32,
    23: np.float32,
    24: np.float32,
    21: np.uint8,
    25: np.uint8,
    22: np.int8,
    26: np.int8,
}
EXOTIC_NAMES = {
    "float8_e4m3fn": 17,
    "float8_e4m3fnuz": 18,
    "float8_e5m2": 19,
    "float8_e5m2fnuz": 20,
    "uint4": 21,
    "int4": 22,
    "float4_e2m1fn": 23,
    "float8_e8m0fnu": 24,
    "uint2": 25,
    "int2": 26,
}


def to_exotic(x: Tensor, to: int, saturate: int = 1, clip_ints: bool = False) -> Tensor:
    """Round x into ONNX type `to` (eagerly, through ml_dtypes) and hold the result in its storage dtype."""
    from onnx import helper
    import ml_dtypes

    npdt = helper.tensor_dtype_to_np_dtype(to)
    a = x.cast(dtypes.float32).numpy() if x.dtype != dtypes.float64 else x.numpy()
    if EXOTIC[to] is np.float32:
        if saturate and to != 24:
            m = float(ml_dtypes.finfo(npdt).max)
            a = np.clip(a, -m, m)
        return Tensor(a.astype(npdt).astype(np.float32))
    v = np.rint(a)
    if clip_ints:
        v = np.clip(v, int(ml_dtypes.iinfo(npdt).min), int(ml_dtypes.iinfo(npdt).max))
    return Tensor(v.astype(npdt).astype(EXOTIC[to]))  # out-of-range casts follow ml_dtypes (the reference's choice)


def to_tensor(arr: np.ndarray, elem_type: int | None = None, device: str | None = None) -> Tensor:
    """numpy array (any ONNX dtype, bfloat16 from ml_dtypes included) -> Tensor."""
    arr = np.asarray(arr)
    if arr.dtype.name in EXOTIC_NAMES or elem_type in EXOTIC:
        et = EXOTIC_NAMES.get(arr.dtype.name, elem_type)
        return Tensor(np.array(arr.astype(EXOTIC[et]), order="C"), device=device)
    if arr.dtype.name == "bfloat16" or elem_type == 16:
        return Tensor(np.array(arr.astype(np.float32), order="C"), device=device).cast(dtypes.bfloat16)
    if arr.dtype == object or arr.dtype.kind in "SU":
        return arr.astype(object)  # strings stay numpy (ops.py, bottom)
    return Tensor(np.array(arr, order="C"), device=device)


def attr_value(a: Any) -> Any:
    from onnx import helper, numpy_helper, AttributeProto

    if a.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == AttributeProto.GRAPH:
        return a.g
    if a.type == AttributeProto.STRING:
        return a.s.decode()
    if a.type == AttributeProto.STRINGS:
        return [s.decode() for s in a.strings]
    if a.type == AttributeProto.SPARSE_TENSOR:
        raise NotImplementedError("sparse tensor attributes are not supported")
    v = helper.get_attribute_value(a)
    return list(v) if isinstance(v, (list, tuple)) or type(v).__name__.startswith("Repeated") else v


def _ax(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def _as(x: Tensor, like: Tensor) -> Tensor:
    return x if x.dtype == like.dtype else x.cast(like.dtype)


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
    return _as(x * (x.exp() + 1).log().tanh(), x)


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


def _binop(f):
    return lambda ctx, a, b, **kw: f(a, b)


OPS.update(
    {
        "Add": _binop(lambda a, b: _as(a + b, a)),
        "Sub": _binop(lambda a, b: _as(a - b, a)),
        "Mul": _binop(lambda a, b: _as(a * b, a)),
        "Equal": _binop(lambda a, b: Tensor(np.equal(_strs(a), _strs(b)).astype(bool)) if _is_str(a) else a == b),
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
        return _as(a.div(b, rounding_mode="trunc"), a)
    return _as(a / b, a)


@op("Pow")
def _pow(ctx, a, b):
    if dtypes.is_int(a.dtype):
        return _as(
            a.cast(dtypes.float64 if a.dtype in (dtypes.int64, dtypes.uint64) else dtypes.float32)
            .pow(b.cast(dtypes.float32))
            .round(),
            a,
        )
    return _as(a.pow(b.cast(a.dtype) if dtypes.is_int(b.dtype) else b), a)


@op("Mod")
def _mod(ctx, a, b, fmod=0):
    if fmod:
        return _as(a.fmod(b), a)
    return _as(a.mod(b), a)


@op("BitShift")
def _bitshift(ctx, a, b, direction="LEFT"):
    bits = a.dtype.itemsize * 8
    b = _as(b, a)
    out_of_range = (b < 0) | (b >= bits) if not dtypes.is_unsigned(a.dtype) else (b >= bits)
    safe = out_of_range.where(0, b)
    if direction == "LEFT":
        return out_of_range.where(0, _as(a.lshift(safe), a))
    fill = (a < 0).where(-1, 0) if not dtypes.is_unsigned(a.dtype) else 0
    return out_of_range.where(_as(Tensor(fill) if isinstance(fill, int) else fill, a), _as(a.rshift(safe), a))


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
    return _as(out, a)


@op("Einsum")
def _einsum(ctx, *xs, equation):
    return Tensor.einsum(equation.replace(" ", ""), *xs)


@op("MatMulInteger")
def _matmulint(ctx, a, b, a_zp=None, b_zp=None):
    a = a.cast(dtypes.int32) - (a_zp.cast(dtypes.int32) if a_zp is not None else 0)
    b = b.cast(dtypes.int32) - (b_zp.cast(dtypes.int32) if b_zp is not None else 0)
    return a.matmul(b).cast(dtypes.int32)


# ---------------------------------------------------------------- conv and pooling
def _auto_pads(auto_pad: str, in_sp, k, s, d, pads):
    nd = len(in_sp)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(nd):
            total = max((math.ceil(in_sp[i] / s[i]) - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_sp[i], 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
        return out
    if auto_pad == "VALID":
        return [(0, 0)] * nd
    pads = pads or [0] * (2 * nd)
    return [(pads[i], pads[i + nd]) for i in range(nd)]


def _pad_sp(x: Tensor, pads, value=0.0) -> Tensor:
    """Pad the spatial dims (2..) by (before, after) pairs; negative pads crop."""
    if all(p == (0, 0) for p in pads):
        return x
    pos = [(max(b, 0), max(a, 0)) for b, a in pads]
    if any(p != (0, 0) for p in pos):
        x = x.pad([None, None] + pos, value=value)
    if any(b < 0 or a < 0 for b, a in pads):
        sl = [slice(None), slice(None)] + [
            slice(-min(b, 0), x.shape[i + 2] + min(a, 0)) for i, (b, a) in enumerate(pads)
        ]
        x = x[tuple(sl)]
    return x


@op("Conv")
def _conv(ctx, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    nd = x.ndim - 2
    k = list(w.shape[2:])
    s, d = strides or [1] * nd, dilations or [1] * nd
    x = _pad_sp(x, _auto_pads(auto_pad, x.shape[2:], k, s, d, pads))
    return x.conv2d(w, b, groups=group, stride=tuple(s), dilation=tuple(d), padding=0)


@op("ConvTranspose")
def _convtranspose(
    ctx,
    x,
    w,
    b=None,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
):
    nd = x.ndim - 2
    k = list(w.shape[2:])
    s, d = strides or [1] * nd, dilations or [1] * nd
    op_ = output_padding or [0] * nd
    in_sp = x.shape[2:]
    full = [(in_sp[i] - 1) * s[i] + (k[i] - 1) * d[i] + 1 + op_[i] for i in range(nd)]
    if output_shape is not None:
        out_sp = list(output_shape)[-nd:]
        tot = [full[i] - out_sp[i] for i in range(nd)]
        pp = [((t // 2, t - t // 2) if auto_pad != "SAME_LOWER" else (t - t // 2, t // 2)) for t in tot]
        pp = [(t - t // 2, t // 2) if auto_pad == "SAME_UPPER" or auto_pad == "NOTSET" else p for t, p in zip(tot, pp)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        tot = [full[i] - in_sp[i] * s[i] for i in range(nd)]
        pp = [(t // 2, t - t // 2) if auto_pad == "SAME_UPPER" else (t - t // 2, t // 2) for t in tot]
    else:
        p = pads or [0] * (2 * nd)
        pp = [(p[i], p[i + nd]) for i in range(nd)]
    y = x.conv_transpose2d(w, None, groups=group, stride=tuple(s), dilation=tuple(d), padding=0)
    # y has spatial size full - output_padding; add output_padding at the end then crop the pads
    y = y.pad([None, None] + [(0, o) for o in op_]) if any(op_) else y
    y = _pad_sp(y, [(-a, -c) for a, c in pp])
    if b is not None:
        y = y + b.reshape(1, -1, *([1] * nd))
    return y


def _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    nd = x.ndim - 2
    k, s, d = list(kernel_shape), strides or [1] * nd, dilations or [1] * nd
    pp = _auto_pads(auto_pad, x.shape[2:], k, s, d, pads)
    extra = []
    for i in range(nd):
        L = x.shape[2 + i] + pp[i][0] + pp[i][1]
        eff = (k[i] - 1) * d[i] + 1
        if ceil_mode:
            out = math.ceil((L - eff) / s[i]) + 1
            if (out - 1) * s[i] >= x.shape[2 + i] + pp[i][0]:
                out -= 1
        else:
            out = (L - eff) // s[i] + 1
        extra.append(max((out - 1) * s[i] + eff - L, 0))
    return k, s, d, pp, extra


@op("MaxPool")
def _maxpool(
    ctx, x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None, storage_order=0, strides=None
):
    k, s, d, pp, extra = _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    dt = x.dtype
    xf = x if dtypes.is_float(dt) else x.cast(dtypes.float32)
    xp = _pad_sp(xf, [(a, b + e) for (a, b), e in zip(pp, extra)], value=-math.inf)
    y = xp.max_pool2d(tuple(k), stride=tuple(s), dilation=tuple(d))
    y = _as(y, x)
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        if any(p != (0, 0) for p in pp) or any(extra):
            raise NotImplementedError("MaxPool Indices with padding")
        _, idx = xf.max_pool2d(tuple(k), stride=tuple(s), dilation=tuple(d), return_indices=True)
        sp = x.shape[2:]
        if storage_order == 1:
            if len(sp) != 2:
                raise NotImplementedError("MaxPool storage_order=1 beyond 2-D")
            idx = (idx % sp[1]) * sp[0] + idx // sp[1]
        base = Tensor.arange(x.shape[0] * x.shape[1]).reshape(x.shape[0], x.shape[1], *([1] * len(sp))) * math.prod(sp)
        return y, (idx.cast(dtypes.int64) + base.cast(dtypes.int64))
    return y


@op("AveragePool")
def _avgpool(
    ctx,
    x,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    k, s, d, pp, extra = _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    kk = math.prod(k)
    xs = _pad_sp(x, [(a, b + e) for (a, b), e in zip(pp, extra)])
    tot = xs.avg_pool2d(tuple(k), stride=tuple(s), dilation=tuple(d)) * kk
    ones = Tensor.ones(1, 1, *x.shape[2:], dtype=x.dtype)
    if count_include_pad:
        cnt = _pad_sp(ones, pp, value=1.0)
    else:
        cnt = ones
    cnt = _pad_sp(cnt, [(0, e) if count_include_pad else (a, b + e) for (a, b), e in zip(pp, extra)])
    cnt = cnt.avg_pool2d(tuple(k), stride=tuple(s), dilation=tuple(d)) * kk
    return _as(tot / cnt, x)


@op("GlobalAveragePool")
def _gap(ctx, x):
    return x.mean(axis=tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalMaxPool")
def _gmp(ctx, x):
    return x.max(axis=tuple(range(2, x.ndim)), keepdim=True)


@op("LpPool")
def _lppool(ctx, x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None, strides=None):
    k, s, d, pp, extra = _pool_setup(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xs = _pad_sp(x.abs().pow(p), [(a, b + e) for (a, b), e in zip(pp, extra)])
    return (xs.avg_pool2d(tuple(k), stride=tuple(s), dilation=tuple(d)) * math.prod(k)).pow(1.0 / p)


@op("GlobalLpPool")
def _glp(ctx, x, p=2):
    return x.abs().pow(p).sum(axis=tuple(range(2, x.ndim)), keepdim=True).pow(1.0 / p)


# ---------------------------------------------------------------- normalization
@op("BatchNormalization")
def _bn(ctx, x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0, **kw):
    if training_mode:
        raise NotImplementedError("BatchNormalization training_mode=1")
    shp = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale.reshape(shp) * (var.reshape(shp) + epsilon).rsqrt()
    return _as((x - mean.reshape(shp)) * inv + bias.reshape(shp), x)


@op("InstanceNormalization")
def _instnorm(ctx, x, scale, bias, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    shp = (1, -1) + (1,) * (x.ndim - 2)
    return x.layernorm(axes, epsilon) * scale.reshape(shp) + bias.reshape(shp)


@op("LayerNormalization")
def _layernorm(ctx, x, scale, bias=None, axis=-1, epsilon=1e-5, stash_type=1):
    axes = tuple(range(_ax(axis, x.ndim), x.ndim))
    xf = x.float() if x.dtype != dtypes.float64 else x
    mean = xf.mean(axis=axes, keepdim=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdim=True)
    inv = (var + epsilon).rsqrt()
    y = (xf - mean) * inv
    y = _as(y, x) * scale
    if bias is not None:
        y = y + bias
    return y, mean, inv


@op("GroupNormalization")
def _groupnorm(ctx, x, scale, bias, epsilon=1e-5, num_groups=1, stash_type=1):
    n, c = x.shape[0], x.shape[1]
    xg = x.reshape(n, num_groups, -1).layernorm(-1, epsilon).reshape(x.shape)
    shp = (1, -1) + (1,) * (x.ndim - 2)
    if ctx.opset < 21:
        scale = scale.reshape(num_groups, 1).expand(num_groups, c // num_groups).reshape(-1)
        bias = bias.reshape(num_groups, 1).expand(num_groups, c // num_groups).reshape(-1)
    return xg * scale.reshape(shp) + bias.reshape(shp)


@op("MeanVarianceNormalization")
def _mvn(ctx, x, axes=(0, 2, 3)):
    mean = x.mean(axis=tuple(axes), keepdim=True)
    var = ((x - mean) ** 2).mean(axis=tuple(axes), keepdim=True)
    return (x - mean) / (var.sqrt() + 1e-9)


@op("LRN")
def _lrn(ctx, x, size, alpha=1e-4, beta=0.75, bias=1.0):
    c = x.shape[1]
    sq = (x * x).reshape(x.shape[0], 1, c, -1)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = sq.pad([None, None, (lo, hi), None])
    s = sq.avg_pool2d((size, 1), stride=1) * size
    return x / (bias + alpha / size * s.reshape(x.shape)).pow(beta)


def _flat2d(x: Tensor, axis: int):
    axis = _ax(axis, x.ndim)
    return x.reshape(math.prod(x.shape[:axis]), -1)


def _softmax_like(f):
    def fn(ctx, x, axis=None):
        if ctx.opset < 13:
            axis = 1 if axis is None else axis
            return f(_flat2d(x, axis), -1).reshape(x.shape)
        return f(x, -1 if axis is None else axis)

    return fn


OPS["Softmax"] = _softmax_like(lambda x, a: x.softmax(a))
OPS["LogSoftmax"] = _softmax_like(lambda x, a: x.log_softmax(a))


def _hardmax(x: Tensor, a: int) -> Tensor:
    a = _ax(a, x.ndim)
    idx = x.argmax(a, keepdim=True)
    ar = Tensor.arange(x.shape[a]).reshape(*([1] * a), -1, *([1] * (x.ndim - a - 1)))
    return (ar == idx).cast(x.dtype)


OPS["Hardmax"] = _softmax_like(_hardmax)


@op("Dropout")
def _dropout(ctx, x, ratio=None, training_mode=None, seed=None, is_test=None):
    if training_mode is not None and ctx.np(2) is not None and bool(ctx.np(2).reshape(-1)[0]):
        r = 0.5 if ratio is None else float(ctx.np(1).reshape(-1)[0])
        if r != 0:
            raise NotImplementedError("Dropout in training mode")
    return x, Tensor.ones(*x.shape, dtype=dtypes.bool)


# ---------------------------------------------------------------- reductions
def _red_axes(ctx, x, axes_in, axes_attr, noop):
    axes = ctx.ints(1) if axes_in is not None else axes_attr
    if axes is None or len(axes) == 0:
        if noop:
            return None
        return tuple(range(x.ndim))
    return tuple(_ax(a, x.ndim) for a in axes)


def _reduce(f):
    def fn(ctx, x, axes_in=None, axes=None, keepdims=1, noop_with_empty_axes=0):
        ax = _red_axes(ctx, x, axes_in, axes, noop_with_empty_axes)
        if ax is None:
            return x
        return f(x, ax, bool(keepdims))

    return fn


def _rmax(x, ax, k):
    if x.numel() == 0:
        shp = [1 if i in ax else s for i, s in enumerate(x.shape) if k or i not in ax]
        return Tensor.full(tuple(shp), -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype), dtype=x.dtype)
    return x.max(ax, keepdim=k)


def _rmin(x, ax, k):
    if x.numel() == 0:
        shp = [1 if i in ax else s for i, s in enumerate(x.shape) if k or i not in ax]
        return Tensor.full(tuple(shp), math.inf if dtypes.is_float(x.dtype) else dtypes.max(x.dtype), dtype=x.dtype)
    return x.min(ax, keepdim=k)


OPS.update(
    {
        "ReduceSum": _reduce(lambda x, a, k: _as(x.sum(a, keepdim=k), x)),
        "ReduceMean": _reduce(lambda x, a, k: _as(x.mean(a, keepdim=k), x)),
        "ReduceMax": _reduce(_rmax),
        "ReduceMin": _reduce(_rmin),
        "ReduceProd": _reduce(lambda x, a, k: _as(x.prod(a, keepdim=k), x)),
        "ReduceL1": _reduce(lambda x, a, k: _as(x.abs().sum(a, keepdim=k), x)),
        "ReduceL2": _reduce(lambda x, a, k: _as((x * x).sum(a, keepdim=k).sqrt(), x)),
        "ReduceLogSum": _reduce(lambda x, a, k: x.sum(a, keepdim=k).log()),
        "ReduceLogSumExp": _reduce(
            lambda x, a, k: _as(x.logsumexp(a, keepdim=k) if x.numel() else x.sum(a, keepdim=k).log(), x)
        ),
        "ReduceSumSquare": _reduce(lambda x, a, k: _as((x * x).sum(a, keepdim=k), x)),
    }
)
for _n in (
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ReduceSum",
):
    OPS[_n] = (lambda f: lambda ctx, x, axes_in=None, **kw: f(ctx, x, axes_in, **kw))(OPS[_n])


def _arg(largest: bool):
    def fn(ctx, x, axis=0, keepdims=1, select_last_index=0):
        a = _ax(axis, x.ndim)
        if select_last_index:
            xf = x.flip(a)
            i = xf.argmax(a, keepdim=bool(keepdims)) if largest else xf.argmin(a, keepdim=bool(keepdims))
            return (x.shape[a] - 1 - i).cast(dtypes.int64)
        return (x.argmax(a, keepdim=bool(keepdims)) if largest else x.argmin(a, keepdim=bool(keepdims))).cast(
            dtypes.int64
        )

    return fn


OPS["ArgMax"], OPS["ArgMin"] = _arg(True), _arg(False)


@op("CumSum")
def _cumsum(ctx, x, axis, exclusive=0, reverse=0):
    a = _ax(int(ctx.np(1).reshape(-1)[0]), x.ndim)
    if reverse:
        x = x.flip(a)
    y = x.cumsum(a)
    if exclusive:
        y = y - x
    if reverse:
        y = y.flip(a)
    return _as(y, x)


@op("TopK")
def _topk(ctx, x, k, axis=-1, largest=1, sorted=1):
    v, i = x.topk(int(ctx.np(1).reshape(-1)[0]), dim=axis, largest=bool(largest), sorted_=True)
    return v, i.cast(dtypes.int64)


# ---------------------------------------------------------------- movement
@op("Reshape")
def _reshape(ctx, x, shape=None, allowzero=0, **kw):
    shp = ctx.ints(1) if shape is not None else kw.get("shape_attr")
    if not allowzero:
        shp = [x.shape[i] if s == 0 else s for i, s in enumerate(shp)]
    return x.reshape(tuple(shp))


@op("Flatten")
def _flatten(ctx, x, axis=1):
    return _flat2d(x, axis) if x.ndim else x.reshape(1, 1)


@op("Transpose")
def _transpose(ctx, x, perm=None):
    return x.permute(tuple(perm) if perm is not None else tuple(range(x.ndim))[::-1])


@op("Concat")
def _concat(ctx, *xs, axis):
    xs = [x for x in xs if x is not None]
    return xs[0].cat(*xs[1:], dim=axis) if len(xs) > 1 else xs[0]


@op("Split")
def _split(ctx, x, split=None, axis=0, num_outputs=None, **kw):
    a = _ax(axis, x.ndim)
    sizes = ctx.ints(1) if split is not None and not isinstance(split, list) else split
    if sizes is None:
        n = num_outputs or len(ctx.node.output)
        each = math.ceil(x.shape[a] / n)
        sizes = [min(each, x.shape[a] - i * each) for i in range(n)]
    return tuple(x.split(list(sizes), dim=a))


@op("Squeeze")
def _squeeze(ctx, x, axes=None):
    ax = ctx.ints(1) if axes is not None and not isinstance(axes, list) else axes
    if ax is None:
        ax = [i for i, s in enumerate(x.shape) if s == 1]
    ax = sorted(_ax(a, x.ndim) for a in ax)
    return x.reshape(tuple(s for i, s in enumerate(x.shape) if i not in ax))


@op("Unsqueeze")
def _unsqueeze(ctx, x, axes=None):
    ax = ctx.ints(1) if axes is not None and not isinstance(axes, list) else axes
    nd = x.ndim + len(ax)
    ax = sorted(_ax(a, nd) for a in ax)
    shp = list(x.shape)
    for a in ax:
        shp.insert(a, 1)
    return x.reshape(tuple(shp))


@op("Slice")
def _slice(ctx, x, starts=None, ends=None, axes=None, steps=None):
    if ctx.opset < 10:
        st, en, ax, sp = starts, ends, axes, None
    else:
        st, en, ax, sp = ctx.ints(1), ctx.ints(2), ctx.ints(3), ctx.ints(4)
    ax = list(range(len(st))) if ax is None else [_ax(a, x.ndim) for a in ax]
    sp = [1] * len(st) if sp is None else sp
    sl = [slice(None)] * x.ndim
    for s, e, a, p in zip(st, en, ax, sp):
        n = x.shape[a]
        if p > 0:
            s = min(max(s + n if s < 0 else s, 0), n)
            e = min(max(e + n if e < 0 else e, 0), n)
        else:
            s = min(max(s + n if s < 0 else s, -1), n - 1)
            e = min(max(e + n if e < 0 else e, -1), n - 1)
        sl[a] = (s, e, p)
    out = x
    for a, v in enumerate(sl):
        if isinstance(v, slice):
            continue
        s, e, p = v
        idx = list(range(s, e, p))
        if p == 1:
            out = out[(slice(None),) * a + (slice(s, max(e, s)),)]
        elif len(idx) == 0:
            out = out[(slice(None),) * a + (slice(0, 0),)]
        elif p > 0:
            out = out[(slice(None),) * a + (slice(s, e, p),)]
        else:
            lo = idx[-1]
            out = out[(slice(None),) * a + (slice(lo, s + 1),)].flip(a)[(slice(None),) * a + (slice(None, None, -p),)]
    return out


@op("Gather")
def _gather(ctx, x, idx, axis=0):
    a = _ax(axis, x.ndim)
    ii = ctx.np(1) if ctx.node.input[1] in ctx.npscope else None
    if ii is not None and ii.ndim <= 1 and ii.size <= 64 and x.numel() > 0:
        vals = [int(v) + x.shape[a] if v < 0 else int(v) for v in ii.reshape(-1)]
        if ii.ndim == 0:
            return x[(slice(None),) * a + (vals[0],)]
        if vals == list(range(vals[0], vals[0] + len(vals))) and vals:
            return x[(slice(None),) * a + (slice(vals[0], vals[0] + len(vals)),)]
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + x.shape[a], idx)
    return x[(slice(None),) * a + (idx,)]


@op("GatherElements")
def _gather_el(ctx, x, idx, axis=0):
    a = _ax(axis, x.ndim)
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + x.shape[a], idx)
    return x.gather(a, idx)


@op("GatherND")
def _gathernd(ctx, x, idx, batch_dims=0):
    idx = idx.cast(dtypes.int64)
    m = idx.shape[-1]
    bshape = x.shape[:batch_dims]
    nb = math.prod(bshape)
    rest = x.shape[batch_dims + m :]
    xf = x.reshape(nb * math.prod(x.shape[batch_dims : batch_dims + m]), *rest)
    ish = idx.shape[batch_dims:-1]
    idf = idx.reshape(nb, -1, m)
    dims = x.shape[batch_dims : batch_dims + m]
    flat = Tensor.zeros(nb, idf.shape[1], dtype=dtypes.int64)
    for j in range(m):
        ij = idf[:, :, j]
        ij = (ij < 0).where(ij + dims[j], ij)
        flat = flat * dims[j] + ij
    flat = flat + Tensor.arange(nb).reshape(nb, 1).cast(dtypes.int64) * math.prod(dims)
    out = xf[flat.reshape(-1)]
    return out.reshape(*bshape, *ish, *rest)


@op("Scatter", "ScatterElements")
def _scatter_el(ctx, x, idx, upd, axis=0, reduction="none"):
    a = _ax(axis, x.ndim)
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + x.shape[a], idx)
    if reduction == "none":
        return x.scatter(a, idx, upd)
    red = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction]
    return x.scatter_reduce(a, idx, upd, red, include_self=True)


@op("ScatterND")
def _scatternd(ctx, x, idx, upd, reduction="none"):
    m = idx.shape[-1]
    dims = x.shape[:m]
    rest = x.shape[m:]
    xf = x.reshape(math.prod(dims), math.prod(rest) if rest else 1)
    idf = idx.cast(dtypes.int64).reshape(-1, m)
    flat = Tensor.zeros(idf.shape[0], dtype=dtypes.int64)
    for j in range(m):
        flat = flat * dims[j] + idf[:, j]
    uf = upd.reshape(idf.shape[0], xf.shape[1])
    fidx = flat.reshape(-1, 1).expand(idf.shape[0], xf.shape[1])
    if reduction == "none":
        out = xf.scatter(0, fidx, uf)
    else:
        red = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}[reduction]
        out = xf.scatter_reduce(0, fidx, uf, red, include_self=True)
    return out.reshape(x.shape)


@op("Expand")
def _expand(ctx, x, shape):
    shp = ctx.ints(1)
    nd = max(len(shp), x.ndim)
    xs = (1,) * (nd - x.ndim) + tuple(x.shape)
    ss = (1,) * (nd - len(shp)) + tuple(shp)
    out = tuple(max(a, b) if min(a, b) != 0 else 0 for a, b in zip(xs, ss))
    return x.reshape(xs).expand(out)


@op("Tile")
def _tile(ctx, x, repeats):
    return x.repeat(tuple(ctx.ints(1)))


@op("Pad")
def _pad(ctx, x, pads=None, value=None, axes=None, mode="constant", **kw):
    if ctx.opset < 11:
        p, cval, ax = kw.get("paddings") if pads is None else pads, kw.get("value_attr", 0.0), None
        cval = value if value is not None and not isinstance(value, Tensor) else 0.0
    else:
        p, ax = ctx.ints(1), ctx.ints(3)
        cv = ctx.np(2)
        cval = 0.0 if cv is None or cv.size == 0 else cv.reshape(-1)[0].item()
    ax = list(range(x.ndim)) if ax is None else [_ax(a, x.ndim) for a in ax]
    n = len(ax)
    per = [(0, 0)] * x.ndim
    for i, a in enumerate(ax):
        per[a] = (p[i], p[i + n])
    neg = any(b < 0 or e < 0 for b, e in per)
    pos = [(max(b, 0), max(e, 0)) for b, e in per]
    if mode == "constant":
        y = x.pad(pos, value=cval) if any(q != (0, 0) for q in pos) else x
    elif mode in ("reflect", "edge", "wrap"):
        y = x
        for a, (b, e) in enumerate(pos):
            if b == 0 and e == 0:
                continue
            pre = (slice(None),) * a
            n_ = y.shape[a]
            if mode == "edge":
                parts = [y[pre + (slice(0, 1),)]] * b + [y] + [y[pre + (slice(n_ - 1, n_),)]] * e
            elif mode == "wrap":
                ii = [(i % n_) for i in range(-b, n_ + e)]
                parts = [y[pre + (Tensor(np.array(ii, np.int64)),)]]
            else:
                ii = []
                for i in range(-b, n_ + e):
                    j = i
                    while j < 0 or j >= n_:
                        j = -j if j < 0 else 2 * (n_ - 1) - j
                    ii.append(j)
                parts = [y[pre + (Tensor(np.array(ii, np.int64)),)]]
            y = parts[0].cat(*parts[1:], dim=a) if len(parts) > 1 else parts[0]
    else:
        raise NotImplementedError(f"Pad mode {mode}")
    if neg:
        sl = tuple(slice(-min(b, 0), y.shape[i] + min(e, 0)) for i, (b, e) in enumerate(per))
        y = y[sl]
    return y


@op("DepthToSpace")
def _d2s(ctx, x, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    if mode == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


@op("SpaceToDepth")
def _s2d(ctx, x, blocksize, mode="DCR"):
    n, c, h, w = x.shape
    b = blocksize
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.permute(0, 1, 3, 5, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


@op("OneHot")
def _onehot(ctx, idx, depth, values, axis=-1):
    d = int(ctx.np(1).reshape(-1)[0])
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + d, idx)
    nd = idx.ndim + 1
    a = _ax(axis, nd)
    ar = Tensor.arange(d).reshape(*([1] * a), d, *([1] * (nd - a - 1))).cast(dtypes.int64)
    hit = ar == idx.unsqueeze(a)
    return hit.where(values[1], values[0])


@op("Trilu")
def _trilu(ctx, x, k=None, upper=1):
    kk = 0 if k is None else int(ctx.np(1).reshape(-1)[0])
    if x.numel() == 0:
        return x
    return x.triu(kk) if upper else x.tril(kk)


@op("NonZero")
def _nonzero(ctx, x):
    arr = x.numpy()
    return Tensor(np.array(np.nonzero(arr), dtype=np.int64).reshape(arr.ndim, -1))


@op("Compress")
def _compress(ctx, x, cond, axis=None):
    c = np.nonzero(ctx.np(1).astype(bool))[0]
    if axis is None:
        x, a = x.reshape(-1), 0
    else:
        a = _ax(axis, x.ndim)
    return x[(slice(None),) * a + (Tensor(c.astype(np.int64)),)]


@op("ReverseSequence")
def _revseq(ctx, x, lens, batch_axis=1, time_axis=0):
    L = ctx.ints(1)
    T = x.shape[time_axis]
    idx = np.zeros((x.shape[batch_axis], T), np.int64)
    for b, l in enumerate(L):
        idx[b] = [l - 1 - t if t < l else t for t in range(T)]
    it = Tensor(idx if batch_axis < time_axis else idx.T)
    shp = [1] * x.ndim
    shp[batch_axis], shp[time_axis] = x.shape[batch_axis], T
    it = it.reshape(shp).expand(x.shape)
    return x.gather(time_axis, it)


# ---------------------------------------------------------------- Resize / Upsample
def _resize_matrix(
    L_in: int,
    L_out: int,
    scale: float,
    mode: str,
    ctm: str,
    nearest_mode: str,
    a: float,
    exclude_outside: int,
    roi: tuple[float, float] | None,
    extrap: float,
    antialias: int,
):
    W = np.zeros((L_out, L_in), np.float64)
    oor = np.zeros(L_out, bool)
    for o in range(L_out):
        if ctm == "half_pixel":
            x = (o + 0.5) / scale - 0.5
        elif ctm == "half_pixel_symmetric":
            adj = L_out / (scale * L_in)
            x = L_in / 2 * (1 - adj) + (o + 0.5) / scale - 0.5
        elif ctm == "pytorch_half_pixel":
            x = (o + 0.5) / scale - 0.5 if L_out > 1 else 0.0
        elif ctm == "align_corners":
            x = 0.0 if L_out == 1 else o * (L_in - 1) / (L_in * scale - 1)
        elif ctm == "asymmetric":
            x = o / scale
        elif ctm == "tf_crop_and_resize":
            s, e = roi
            x = s * (L_in - 1) + o * (e - s) * (L_in - 1) / (L_out - 1) if L_out > 1 else 0.5 * (s + e) * (L_in - 1)
            if x < 0 or x > L_in - 1:
                oor[o] = True
                continue
        else:
            raise NotImplementedError(f"Resize coordinate_transformation_mode={ctm}")
        if mode == "nearest":
            if nearest_mode == "round_prefer_floor":
                i = math.floor(x) if x - math.floor(x) == 0.5 else round(x)
            elif nearest_mode == "round_prefer_ceil":
                i = math.ceil(x) if x - math.floor(x) == 0.5 else round(x)
            elif nearest_mode == "floor":
                i = math.floor(x)
            elif nearest_mode == "ceil":
                i = math.ceil(x)
            else:
                raise NotImplementedError(f"Resize nearest_mode={nearest_mode}")
            W[o, min(max(int(i), 0), L_in - 1)] += 1.0
            continue
        if antialias and scale < 1:
            support = (1.0 if mode == "linear" else 2.0) / scale
            c = (o + 0.5) / scale - 0.5 if ctm != "align_corners" else x
            c = x
            lo, hi = math.floor(c - support) + 1, math.floor(c + support) + 1
            ws = {}
            for j in range(lo, hi):
                t = abs(j - c) * scale
                if mode == "linear":
                    w = max(0.0, 1 - t)
                else:
                    if t <= 1:
                        w = ((a + 2) * t - (a + 3)) * t * t + 1
                    else:
                        w = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a if t < 2 else 0
                if 0 <= j < L_in:
                    ws[j] = ws.get(j, 0.0) + w
            tot = sum(ws.values())
            for j, w in ws.items():
                W[o, j] += w / tot if tot else 0
            continue
        x0 = math.floor(x)
        r = x - x0
        if mode == "linear":
            taps = [(x0, 1 - r), (x0 + 1, r)]
        elif mode == "cubic":
            c = [
                ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                ((a + 2) * r - (a + 3)) * r * r + 1,
                ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a,
            ]
            taps = list(zip(range(x0 - 1, x0 + 3), c))
            if exclude_outside:
                taps = [(j, w) for j, w in taps if 0 <= j < L_in]
                tot = sum(w for _, w in taps)
                taps = [(j, w / tot) for j, w in taps]
        else:
            raise NotImplementedError(f"Resize mode={mode}")
        for j, w in taps:
            W[o, min(max(j, 0), L_in - 1)] += w
    return W, oor


@op("Resize", "Upsample")
def _resize(
    ctx,
    x,
    roi=None,
    scales=None,
    sizes=None,
    antialias=0,
    axes=None,
    coordinate_transformation_mode=None,
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
    **kw,
):
    nd = x.ndim
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        sc = scales if isinstance(scales, list) else ctx.np(1).tolist()
        roi_v, sz, ctm = None, None, "asymmetric"
        mode = {"bilinear": "linear"}.get(mode, mode)
        nearest_mode = "floor" if ctx.node.op_type == "Upsample" else nearest_mode
    else:
        roi_v = ctx.np(1)
        sc_v, sz_v = ctx.np(2), ctx.np(3)
        sc = None if sc_v is None or sc_v.size == 0 else sc_v.tolist()
        sz = None if sz_v is None or sz_v.size == 0 else [int(v) for v in sz_v]
        ctm = coordinate_transformation_mode or "half_pixel"
    ax = list(range(nd)) if axes is None else [_ax(a, nd) for a in axes]
    scale = [1.0] * nd
    out = list(x.shape)
    if sz is not None:
        if keep_aspect_ratio_policy != "stretch":
            r = [sz[i] / x.shape[a] for i, a in enumerate(ax)]
            s = min(r) if keep_aspect_ratio_policy == "not_larger" else max(r)
            for a in ax:
                scale[a], out[a] = s, int(math.floor(x.shape[a] * s + 0.5))
        else:
            for i, a in enumerate(ax):
                scale[a], out[a] = sz[i] / x.shape[a], sz[i]
    else:
        for i, a in enumerate(ax):
            scale[a], out[a] = float(sc[i]), int(math.floor(x.shape[a] * sc[i]))
    roi_full = None
    if roi_v is not None and roi_v.size:
        rr = roi_v.reshape(-1).tolist()
        n = len(ax)
        roi_full = {a: (rr[i], rr[i + n]) for i, a in enumerate(ax)}
    dt = x.dtype
    y = x if dtypes.is_float(dt) else x.cast(dtypes.float32)
    mask = None
    for a in range(nd):
        if out[a] == x.shape[a] and scale[a] == 1.0 and (ctm != "tf_crop_and_resize" or a not in ax):
            continue
        W, oor = _resize_matrix(
            x.shape[a],
            out[a],
            scale[a],
            mode,
            ctm,
            nearest_mode,
            cubic_coeff_a,
            exclude_outside,
            roi_full.get(a) if roi_full else None,
            extrapolation_value,
            antialias,
        )
        Wt = Tensor(W.T.astype(np.float64 if y.dtype == dtypes.float64 else np.float32)).cast(y.dtype)
        y = y.transpose(a, -1).matmul(Wt).transpose(a, -1)
        if oor.any():
            m = Tensor(oor).reshape(*([1] * a), -1, *([1] * (nd - a - 1)))
            mask = m if mask is None else mask.bitwise_or(m)
    if mask is not None:
        y = mask.where(extrapolation_value, y)
    if not dtypes.is_float(dt):
        y = y.round().cast(dt)
    return _as(y, x)


# ---------------------------------------------------------------- quantization
@op("QuantizeLinear")
def _quant(ctx, x, scale, zp=None, axis=1, block_size=0, saturate=1, output_dtype=0, precision=0):
    if zp is not None:
        et = ctx.runner.logical.get(ctx.node.input[2])
    else:
        et = output_dtype if output_dtype in EXOTIC else None
    dt = zp.dtype if zp is not None else (onnx_dtype(output_dtype) if output_dtype and et is None else dtypes.uint8)
    if dt not in (dtypes.uint8, dtypes.int8, dtypes.uint16, dtypes.int16, dtypes.int32) and et is None:
        raise NotImplementedError(f"QuantizeLinear to {dt}")
    if block_size:
        raise NotImplementedError("blocked QuantizeLinear")
    if scale.ndim == 1 and x.ndim > 1 and scale.shape[0] > 1:
        a = _ax(axis, x.ndim)
        shp = [1] * x.ndim
        shp[a] = -1
        scale = scale.reshape(shp)
        zp = zp.reshape(shp) if zp is not None else None
    if et is not None:
        ctx.runner.logical[ctx.node.output[0]] = et
        y = x.float() / scale.float()
        if EXOTIC[et] is not np.float32:
            y = y.round()
        if zp is not None:
            y = y + zp.float()
        return to_exotic(y, et, saturate, clip_ints=True)
    y = (x.float() / scale.float()).round()
    if zp is not None:
        y = y + zp.float()
    return y.clip(dtypes.min(dt), dtypes.max(dt)).cast(dt)


@op("DequantizeLinear")
def _dequant(ctx, x, scale, zp=None, axis=1, block_size=0, output_dtype=0):
    if block_size:
        raise NotImplementedError("blocked DequantizeLinear")
    if scale.ndim == 1 and x.ndim > 1 and scale.shape[0] > 1:
        a = _ax(axis, x.ndim)
        shp = [1] * x.ndim
        shp[a] = -1
        scale = scale.reshape(shp)
        zp = zp.reshape(shp) if zp is not None else None
    xf = x.cast(dtypes.float32) if x.dtype != dtypes.int32 else x.cast(dtypes.float64)
    if zp is not None:
        xf = xf - zp.cast(xf.dtype)
    return (xf * scale.cast(xf.dtype)).cast(scale.dtype)


@op("DynamicQuantizeLinear")
def _dynquant(ctx, x):
    lo, hi = x.min().minimum(0), x.max().maximum(0)
    scale = (hi - lo) / 255
    zp = (-lo / scale).round().clip(0, 255)
    y = (x / scale + zp).round().clip(0, 255).cast(dtypes.uint8)  # the reference rounds after adding zp
    return y, scale, zp.cast(dtypes.uint8)


# ---------------------------------------------------------------- sequences
@op("SequenceConstruct")
def _seqc(ctx, *xs):
    return list(xs)


@op("SequenceEmpty")
def _seqe(ctx, dtype=None):
    return []


@op("SequenceAt")
def _seqat(ctx, seq, pos):
    return seq[int(ctx.np(1).reshape(-1)[0])]


@op("SequenceLength")
def _seqlen(ctx, seq):
    return Tensor(np.array(len(seq), np.int64))


@op("SequenceInsert")
def _seqins(ctx, seq, t, pos=None):
    s = list(seq)
    if pos is None:
        s.append(t)
    else:
        p = int(ctx.np(2).reshape(-1)[0])
        s.insert(p + len(s) if p < 0 else p, t)
    return s


@op("SequenceErase")
def _seqerase(ctx, seq, pos=None):
    s = list(seq)
    p = -1 if pos is None else int(ctx.np(1).reshape(-1)[0])
    del s[p]
    return s


@op("ConcatFromSequence")
def _concatseq(ctx, seq, axis, new_axis=0):
    if new_axis:
        return Tensor.stack(*seq, dim=axis) if len(seq) > 1 else seq[0].unsqueeze(axis)
    return seq[0].cat(*seq[1:], dim=axis) if len(seq) > 1 else seq[0]


@op("SplitToSequence")
def _splitseq(ctx, x, split=None, axis=0, keepdims=1):
    a = _ax(axis, x.ndim)
    if split is None:
        parts = x.split(1, dim=a)
        return [p.squeeze(a) for p in parts] if not keepdims else list(parts)
    sp = ctx.np(1)
    if sp.ndim == 0 or (sp.size == 1 and int(sp.reshape(-1)[0]) != x.shape[a]):
        return list(x.split(int(sp.reshape(-1)[0]), dim=a))
    return list(x.split([int(v) for v in sp], dim=a))


# ---------------------------------------------------------------- optional and control flow
@op("Optional")
def _optional(ctx, x=None, type=None):
    return x


@op("OptionalHasElement")
def _opthas(ctx, x=None):
    return Tensor(np.array(x is not None))


@op("OptionalGetElement")
def _optget(ctx, x):
    return x


@op("If")
def _if(ctx, cond, then_branch, else_branch):
    g = then_branch if bool(ctx.np(0).reshape(-1)[0]) else else_branch
    scope, npscope = dict(ctx.scope), dict(ctx.npscope)
    ctx.runner._load_initializers(g, scope, npscope)
    outs = ctx.runner.run_graph(g, scope, npscope)
    return tuple(outs.values())


@op("Loop")
def _loop(ctx, M, cond, *v_init, body):
    trip = None if M is None else int(ctx.np(0).reshape(-1)[0])
    keep = True if cond is None else bool(ctx.np(1).reshape(-1)[0])
    vals = list(v_init)
    n_state = len(vals)
    scans: list[list] = []
    i = 0
    while (trip is None or i < trip) and keep:
        scope, npscope = dict(ctx.scope), dict(ctx.npscope)
        ctx.runner._load_initializers(body, scope, npscope)
        names = [v.name for v in body.input]
        scope[names[0]] = Tensor(np.array(i, np.int64))
        npscope[names[0]] = np.array(i, np.int64)
        scope[names[1]] = Tensor(np.array(keep))
        npscope[names[1]] = np.array(keep)
        for n, v in zip(names[2:], vals):
            scope[n] = v
        outs = list(ctx.runner.run_graph(body, scope, npscope).values())
        keep = bool(outs[0].numpy().reshape(-1)[0]) if isinstance(outs[0], Tensor) else bool(outs[0])
        vals = outs[1 : 1 + n_state]
        for j, s in enumerate(outs[1 + n_state :]):
            if len(scans) <= j:
                scans.append([])
            scans[j].append(s)
        i += 1
    n_scan = len(ctx.node.output) - n_state
    res = vals + [(Tensor.stack(*s) if len(s) > 1 else s[0].unsqueeze(0)) for s in scans]
    for _ in range(n_scan - len(scans)):
        res.append(Tensor.zeros(0))
    return tuple(res)


@op("Scan")
def _scan(
    ctx,
    *args,
    body,
    num_scan_inputs,
    scan_input_axes=None,
    scan_input_directions=None,
    scan_output_axes=None,
    scan_output_directions=None,
):
    n_state = len(args) - num_scan_inputs
    state, xs = list(args[:n_state]), list(args[n_state:])
    in_ax = scan_input_axes or [0] * len(xs)
    in_dir = scan_input_directions or [0] * len(xs)
    T = xs[0].shape[_ax(in_ax[0], xs[0].ndim)]
    names = [v.name for v in body.input]
    outs_acc: list[list] = []
    for t in range(T):
        scope, npscope = dict(ctx.scope), dict(ctx.npscope)
        ctx.runner._load_initializers(body, scope, npscope)
        for n, v in zip(names, state):
            scope[n] = v
        for k, x in enumerate(xs):
            a = _ax(in_ax[k], x.ndim)
            tt = T - 1 - t if in_dir[k] else t
            scope[names[n_state + k]] = x[(slice(None),) * a + (tt,)]
        outs = list(ctx.runner.run_graph(body, scope, npscope).values())
        state = outs[:n_state]
        for j, o in enumerate(outs[n_state:]):
            if len(outs_acc) <= j:
                outs_acc.append([])
            outs_acc[j].append(o)
    out_ax = scan_output_axes or [0] * len(outs_acc)
    out_dir = scan_output_directions or [0] * len(outs_acc)
    res = list(state)
    for j, s in enumerate(outs_acc):
        if out_dir[j]:
            s = s[::-1]
        a = _ax(out_ax[j], s[0].ndim + 1)
        res.append(Tensor.stack(*s, dim=a) if len(s) > 1 else s[0].unsqueeze(a))
    return tuple(res)


# ---------------------------------------------------------------- losses, newer normalizations, attention
def _nll(x: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int | None, reduction: str) -> Tensor:
    t = target.cast(dtypes.int64)
    keep = (t != ignore_index) if ignore_index is not None else Tensor.ones(*t.shape, dtype=dtypes.bool)
    ts = keep.where(t, 0)
    picked = x.gather(1, ts.unsqueeze(1)).squeeze(1)
    w = keep.cast(x.dtype) if weight is None else keep.where(weight[ts], 0).cast(x.dtype)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


@op("NegativeLogLikelihoodLoss")
def _nll_op(ctx, x, target, weight=None, ignore_index=None, reduction="mean"):
    return _as(_nll(x, target, weight, ignore_index, reduction), x)


@op("SoftmaxCrossEntropyLoss")
def _sce(ctx, scores, labels, weights=None, ignore_index=None, reduction="mean"):
    logp = scores.log_softmax(1)
    return _as(_nll(logp, labels, weights, ignore_index, reduction), scores), logp


@op("RMSNormalization")
def _rmsnorm(ctx, x, scale, axis=-1, epsilon=1e-5, stash_type=1):
    axes = tuple(range(_ax(axis, x.ndim), x.ndim))
    xf = x.float() if x.dtype != dtypes.float64 else x
    y = xf * ((xf * xf).mean(axis=axes, keepdim=True) + epsilon).rsqrt()
    return _as(y, x) * scale


@op("LpNormalization")
def _lpnorm(ctx, x, axis=-1, p=2):
    n = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True).sqrt()
    return (n == 0).where(0, x / n).cast(x.dtype)


@op("Swish")
def _swish(ctx, x, alpha=1.0):
    return x * (x * alpha).sigmoid()


@op("CumProd")
def _cumprod(ctx, x, axis, exclusive=0, reverse=0):
    a = _ax(int(ctx.np(1).reshape(-1)[0]), x.ndim)
    if reverse:
        x = x.flip(a)
    if exclusive:
        pad = [None] * x.ndim
        pad[a] = (1, 0)
        x = x.pad(pad, value=1)[(slice(None),) * a + (slice(0, x.shape[a]),)]
    y = x.cumprod(a)
    if reverse:
        y = y.flip(a)
    return _as(y, x)


@op("Attention")
def _attention(
    ctx,
    q,
    k,
    v,
    attn_mask=None,
    past_key=None,
    past_value=None,
    nonpad_kv_seqlen=None,
    is_causal=0,
    kv_num_heads=None,
    q_num_heads=None,
    qk_matmul_output_mode=0,
    scale=None,
    softcap=0.0,
    softmax_precision=None,
    left_window_size=-1,
    right_window_size=-1,
):
    three_d = q.ndim == 3
    if three_d:
        b, sq, _ = q.shape
        q = q.reshape(b, sq, q_num_heads, -1).transpose(1, 2)
        k = k.reshape(b, k.shape[1], kv_num_heads, -1).transpose(1, 2)
        v = v.reshape(b, v.shape[1], kv_num_heads, -1).transpose(1, 2)
    if past_key is not None:
        k = past_key.cat(k, dim=2)
    if past_value is not None:
        v = past_value.cat(v, dim=2)
    present_k, present_v = k, v
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        k = k.repeat_interleave(hq // hk, dim=1)
        v = v.repeat_interleave(hq // hk, dim=1)
    dt = q.dtype
    sc = (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
    qk = (q.float() @ k.float().transpose(-1, -2)) * sc
    sq_len, skv = qk.shape[-2], qk.shape[-1]
    bias = Tensor.zeros(1, 1, sq_len, skv)
    if attn_mask is not None:
        m = attn_mask
        if m.shape[-1] < skv:
            pad = [None] * (m.ndim - 1) + [(0, skv - m.shape[-1])]
            m = m.pad(pad, value=False if m.dtype == dtypes.bool else -math.inf)
        bias = bias + (m.where(0.0, -math.inf) if m.dtype == dtypes.bool else m.float())
    if is_causal:
        # queries sit after the past (or, with nonpad_kv_seqlen, at the end of each batch's valid keys)
        past_len = past_key.shape[2] if past_key is not None else 0
        if nonpad_kv_seqlen is not None:
            off = nonpad_kv_seqlen.reshape(-1, 1, 1, 1).cast(dtypes.int64) - sq_len
            qi = Tensor.arange(sq_len).reshape(1, 1, -1, 1).cast(dtypes.int64) + off
            kj = Tensor.arange(skv).reshape(1, 1, 1, -1).cast(dtypes.int64)
            bias = bias + (kj <= qi).where(0.0, -math.inf)
        else:
            causal = Tensor(np.tril(np.ones((sq_len, skv), bool), k=past_len))
            bias = bias + causal.where(0.0, -math.inf)
    if left_window_size >= 0 or right_window_size >= 0:
        off = past_key.shape[2] if past_key is not None else 0
        qi, kj = np.arange(sq_len)[:, None] + off, np.arange(skv)[None, :]
        ok = np.ones((sq_len, skv), bool)
        if left_window_size >= 0:
            ok &= kj >= qi - left_window_size
        if right_window_size >= 0:
            ok &= kj <= qi + right_window_size
        bias = bias + Tensor(ok).where(0.0, -math.inf)
    if nonpad_kv_seqlen is not None:
        lens = nonpad_kv_seqlen.reshape(-1, 1, 1, 1)
        bias = bias + (Tensor.arange(skv).reshape(1, 1, 1, skv) < lens).where(0.0, -math.inf)
    out0, out1 = qk, qk + bias
    if softcap:
        qk = softcap * (qk / softcap).tanh()
    qk = qk + bias
    out2 = qk
    p = qk.softmax(-1)
    p = (p != p).where(0, p)  # fully masked rows give 0, not nan
    y = (p @ v.float()).cast(dt)
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    qko = [out0, out1, out2, p][qk_matmul_output_mode].cast(dt)
    return y, present_k, present_v, qko


# ---------------------------------------------------------------- recurrent layers (unrolled over the sequence)
_ACT = {"sigmoid": Tensor.sigmoid, "tanh": Tensor.tanh, "relu": Tensor.relu}


def _acts(names, n_per_dir: int, dirs: int, default: list[str]):
    names = names or default * dirs
    try:
        return [[_ACT[names[d * n_per_dir + i].lower()] for i in range(n_per_dir)] for d in range(dirs)]
    except KeyError as e:
        raise NotImplementedError(f"recurrent activation {e}") from e


def _recurrent(
    kind: str, ctx, X, W, R, B, seq_lens, init_h, init_c, P, activations, clip, direction, hidden_size, layout, **kw
):
    if layout:
        X = X.transpose(0, 1)
    if seq_lens is not None and len(set(ctx.ints(4))) > 1:
        raise NotImplementedError("varying sequence_lens")
    T, N = X.shape[0], X.shape[1]
    dirs = 2 if direction == "bidirectional" else 1
    H = hidden_size or R.shape[-1]
    if init_h is not None and layout:
        init_h = init_h.transpose(0, 1)
    if init_c is not None and layout:
        init_c = init_c.transpose(0, 1)
    ng = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    acts = _acts(
        activations,
        {"RNN": 1, "GRU": 2, "LSTM": 3}[kind],
        dirs,
        {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind],
    )
    lbr = kw.get("linear_before_reset", 0)

    def cl(t):
        return t.clip(-clip, clip) if clip is not None else t

    ys, hs, cs = [], [], []
    for d in range(dirs):
        w, r = W[d], R[d]
        b = B[d] if B is not None else Tensor.zeros(2 * ng * H, dtype=X.dtype)
        wb, rb = b[: ng * H], b[ng * H :]
        h = init_h[d] if init_h is not None else Tensor.zeros(N, H, dtype=X.dtype)
        c = init_c[d] if init_c is not None else Tensor.zeros(N, H, dtype=X.dtype)
        xw = X.matmul(w.T) + wb  # (T, N, ng*H), all time steps at once
        order = range(T - 1, -1, -1) if (direction == "reverse" or d == 1) else range(T)
        outs = [None] * T
        f = acts[d]
        for t in order:
            xt = xw[t]
            if kind == "RNN":
                h = f[0](cl(xt + h.matmul(r.T) + rb))
            elif kind == "GRU":
                hr = h.matmul(r.T)
                z = f[0](cl(xt[:, :H] + hr[:, :H] + rb[:H]))
                rr = f[0](cl(xt[:, H : 2 * H] + hr[:, H : 2 * H] + rb[H : 2 * H]))
                if lbr:
                    hh = f[1](cl(xt[:, 2 * H :] + rr * (hr[:, 2 * H :] + rb[2 * H :])))
                else:
                    hh = f[1](cl(xt[:, 2 * H :] + (rr * h).matmul(r[2 * H :].T) + rb[2 * H :]))
                h = (1 - z) * hh + z * h
            else:
                g = xt + h.matmul(r.T) + rb
                p = P[d] if P is not None else None
                gi, go, gf, gc = g[:, :H], g[:, H : 2 * H], g[:, 2 * H : 3 * H], g[:, 3 * H :]
                if p is not None:
                    gi, gf = gi + p[:H] * c, gf + p[2 * H :] * c
                i_, f_ = f[0](cl(gi)), f[0](cl(gf))
                if kw.get("input_forget", 0):
                    f_ = 1 - i_
                c = f_ * c + i_ * f[1](cl(gc))
                if p is not None:
                    go = go + p[H : 2 * H] * c
                h = f[0](cl(go)) * f[2](c)
            outs[t] = h
        ys.append(Tensor.stack(*outs) if T > 1 else outs[0].unsqueeze(0))
        hs.append(h)
        cs.append(c)
    Y = Tensor.stack(*ys, dim=1) if dirs > 1 else ys[0].unsqueeze(1)  # (T, dirs, N, H)
    Yh = Tensor.stack(*hs) if dirs > 1 else hs[0].unsqueeze(0)
    Yc = Tensor.stack(*cs) if dirs > 1 else cs[0].unsqueeze(0)
    if layout:
        Y, Yh, Yc = Y.permute(2, 0, 1, 3), Yh.transpose(0, 1), Yc.transpose(0, 1)
    return (Y, Yh, Yc) if kind == "LSTM" else (Y, Yh)


def _rnn_op(kind):
    def fn(
        ctx,
        X,
        W,
        R,
        B=None,
        seq_lens=None,
        init_h=None,
        init_c=None,
        P=None,
        activation_alpha=None,
        activation_beta=None,
        activations=None,
        clip=None,
        direction="forward",
        hidden_size=None,
        layout=0,
        **kw,
    ):
        if kind != "LSTM":
            init_c, P = None, None
        return _recurrent(
            kind, ctx, X, W, R, B, seq_lens, init_h, init_c, P, activations, clip, direction, hidden_size, layout, **kw
        )

    return fn


OPS["RNN"], OPS["GRU"], OPS["LSTM"] = _rnn_op("RNN"), _rnn_op("GRU"), _rnn_op("LSTM")


# ---------------------------------------------------------------- quantized linear algebra
def _qdeq(x: Tensor, scale: Tensor, zp: Tensor | None, axis_shape: tuple | None = None) -> Tensor:
    if axis_shape is not None and scale.numel() > 1:
        scale = scale.reshape(axis_shape)
        zp = zp.reshape(axis_shape) if zp is not None and zp.numel() > 1 else zp
    xf = x.float()
    return (xf - zp.float() if zp is not None else xf) * scale.float()


def _qout(y: Tensor, scale: Tensor, zp: Tensor | None, dt) -> Tensor:
    y = (y / scale.float()).round() + (zp.float() if zp is not None else 0)
    return y.clip(dtypes.min(dt), dtypes.max(dt)).cast(dt)


@op("QLinearMatMul")
def _qlinmatmul(ctx, a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp):
    A = _qdeq(a, a_s, a_zp, (-1, 1) if a.ndim >= 2 else None)
    B = _qdeq(b, b_s, b_zp, (1, -1) if b.ndim >= 2 else None)
    return _qout(A @ B, y_s, y_zp, y_zp.dtype if y_zp is not None else dtypes.uint8)


@op("ConvInteger")
def _convint(ctx, x, w, x_zp=None, w_zp=None, **kw):
    xf = x.float() - (x_zp.float() if x_zp is not None else 0)
    wshape = (-1,) + (1,) * (w.ndim - 1)
    wf = w.float() - (
        w_zp.float().reshape(wshape)
        if w_zp is not None and w_zp.numel() > 1
        else w_zp.float()
        if w_zp is not None
        else 0
    )
    return _conv(ctx, xf, wf, None, **kw).round().cast(dtypes.int32)


@op("QLinearConv")
def _qlinconv(ctx, x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, B=None, **kw):
    X = _qdeq(x, x_s, x_zp)
    W = _qdeq(w, w_s, w_zp, (-1,) + (1,) * (w.ndim - 1))
    bias = B.float() * (x_s.float() * w_s.float()).reshape(-1) if B is not None else None
    return _qout(_conv(ctx, X, W, bias, **kw), y_s, y_zp, y_zp.dtype if y_zp is not None else dtypes.uint8)


# ---------------------------------------------------------------- misc
@op("RotaryEmbedding")
def _rotary(ctx, x, cos_cache, sin_cache, position_ids=None, interleaved=0, num_heads=0, rotary_embedding_dim=0):
    shp = x.shape
    if x.ndim == 4:
        x = x.transpose(1, 2)  # (B, H, S, D) -> (B, S, H, D)
    else:
        x = x.reshape(shp[0], shp[1], num_heads, -1)
    D = x.shape[-1]
    rot = rotary_embedding_dim or D
    if position_ids is not None:
        cos, sin = cos_cache[position_ids], sin_cache[position_ids]
    else:
        cos, sin = cos_cache, sin_cache
    cos, sin = cos[..., : rot // 2].unsqueeze(2), sin[..., : rot // 2].unsqueeze(2)
    xr, xp = x[..., :rot], x[..., rot:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
    re, im = cos * x1 - sin * x2, sin * x1 + cos * x2
    out = Tensor.stack(re, im, dim=-1).reshape(*re.shape[:-1], rot) if interleaved else re.cat(im, dim=-1)
    if rot < D:
        out = out.cat(xp, dim=-1)
    out = out.cast(x.dtype)
    return out.transpose(1, 2) if len(shp) == 4 else out.reshape(shp)


@op("CenterCropPad")
def _centercroppad(ctx, x, shape, axes=None):
    tgt = ctx.ints(1)
    ax = list(range(x.ndim)) if axes is None else [_ax(a, x.ndim) for a in axes]
    for a, t in zip(ax, tgt):
        n = x.shape[a]
        if t < n:
            s = (n - t) // 2
            x = x[(slice(None),) * a + (slice(s, s + t),)]
        elif t > n:
            pad = [None] * x.ndim
            pad[a] = ((t - n) // 2, t - n - (t - n) // 2)
            x = x.pad(pad)
    return x


@op("SequenceMap")
def _seqmap(ctx, seq, *others, body):
    names = [v.name for v in body.input]
    outs: list[list] = [[] for _ in body.output]
    for i in range(len(seq)):
        scope, npscope = dict(ctx.scope), dict(ctx.npscope)
        ctx.runner._load_initializers(body, scope, npscope)
        scope[names[0]] = seq[i]
        for n, o in zip(names[1:], others):
            scope[n] = o[i] if isinstance(o, list) else o
        for j, v in enumerate(ctx.runner.run_graph(body, scope, npscope).values()):
            outs[j].append(v)
    return tuple(outs)


def _window(kind):
    def fn(ctx, size, output_datatype=1, periodic=1):
        n = int(ctx.np(0).reshape(-1)[0])
        d = n if periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        c = 2 * np.pi * k / d if d else np.zeros(n)
        w = {
            "hann": lambda: 0.5 - 0.5 * np.cos(c),
            "hamming": lambda: 25 / 46 - 21 / 46 * np.cos(c),
            "blackman": lambda: 0.42 - 0.5 * np.cos(c) + 0.08 * np.cos(2 * c),
        }[kind]()
        return Tensor(w.astype(np.float32)).cast(onnx_dtype(output_datatype))

    return fn


OPS.update(HannWindow=_window("hann"), HammingWindow=_window("hamming"), BlackmanWindow=_window("blackman"))


@op("Unique")
def _unique(ctx, x, axis=None, sorted=1):
    a = x.numpy()
    src = a.reshape(-1) if axis is None else a
    vals, idx, inv, cnt = np.unique(src, axis=axis, return_index=True, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    if not sorted:
        order = np.argsort(idx, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        vals = vals[order] if axis is None else np.take(vals, order, axis=axis)
        idx, cnt, inv = idx[order], cnt[order], rank[inv]
    return (to_tensor(vals), Tensor(idx.astype(np.int64)), Tensor(inv.astype(np.int64)), Tensor(cnt.astype(np.int64)))


@op("Det")
def _det(ctx, x):  # realizes: small matrices, exact against numpy's LU
    return to_tensor(np.linalg.det(x.numpy()).astype(ctx.np(0).dtype))


@op("MaxUnpool")
def _maxunpool(ctx, x, idx, output_shape=None, kernel_shape=None, pads=None, strides=None):
    nd = x.ndim - 2
    s = strides or [1] * nd
    p = pads or [0] * (2 * nd)
    if output_shape is not None:
        out = ctx.ints(2)
    else:
        out = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * s[i] - p[i] - p[i + nd] + kernel_shape[i] for i in range(nd)]
    flat = Tensor.zeros(math.prod(out), dtype=x.dtype)
    return flat.scatter(0, idx.reshape(-1).cast(dtypes.int64), x.reshape(-1)).reshape(tuple(out))


@op("NonMaxSuppression")
def _nms(ctx, boxes, scores, max_out=None, iou_th=None, score_th=None, center_point_box=0):
    b, s = boxes.numpy().astype(np.float64), scores.numpy().astype(np.float64)
    mo = 0 if max_out is None else int(ctx.np(2).reshape(-1)[0])
    it = 0.0 if iou_th is None else float(ctx.np(3).reshape(-1)[0])
    st = None if score_th is None else float(ctx.np(4).reshape(-1)[0])
    if center_point_box:
        xc, yc, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
        b = np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], -1)
    y1, x1 = np.minimum(b[..., 0], b[..., 2]), np.minimum(b[..., 1], b[..., 3])
    y2, x2 = np.maximum(b[..., 0], b[..., 2]), np.maximum(b[..., 1], b[..., 3])
    out = []
    for bi in range(s.shape[0]):
        for ci in range(s.shape[1]):
            order = [i for i in np.argsort(-s[bi, ci], kind="stable") if st is None or s[bi, ci, i] > st]
            keep: list[int] = []
            for i in order:
                if len(keep) >= mo:
                    break
                ok = True
                for j in keep:
                    iw = max(0.0, min(x2[bi, i], x2[bi, j]) - max(x1[bi, i], x1[bi, j]))
                    ih = max(0.0, min(y2[bi, i], y2[bi, j]) - max(y1[bi, i], y1[bi, j]))
                    inter = iw * ih
                    area_i = (x2[bi, i] - x1[bi, i]) * (y2[bi, i] - y1[bi, i])
                    union = area_i + (x2[bi, j] - x1[bi, j]) * (y2[bi, j] - y1[bi, j]) - inter
                    if union > 0 and inter / union > it:
                        ok = False
                if ok:
                    keep.append(i)
            out += [[bi, ci, k] for k in keep]
    return Tensor(np.array(out, np.int64).reshape(-1, 3))


# ---------------------------------------------------------------- GridSample (2-D)
def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
    rng = hi - lo
    if rng <= 0:
        return x * 0 + lo
    d = (x - lo).abs()
    flips = (d / rng).floor()
    extra = d - flips * rng
    return (flips % 2 == 0).where(lo + extra, hi - extra)


def _cubic_w(t: Tensor, a: float = -0.75) -> list[Tensor]:
    def near(u):
        return ((a + 2) * u - (a + 3)) * u * u + 1

    def far(u):
        return ((a * u - 5 * a) * u + 8 * a) * u - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@op("GridSample")
def _gridsample(ctx, x, grid, align_corners=0, mode="linear", padding_mode="zeros"):
    if x.ndim != 4:
        raise NotImplementedError(f"GridSample on {x.ndim - 2}-D images")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    N, C, H, W = x.shape
    Ho, Wo = grid.shape[1], grid.shape[2]
    g = grid.float()
    gx, gy = g[..., 0].reshape(N, -1), g[..., 1].reshape(N, -1)

    def denorm(v, size):
        return (v + 1) / 2 * (size - 1) if align_corners else ((v + 1) * size - 1) / 2

    px, py = denorm(gx, W), denorm(gy, H)
    if padding_mode == "reflection":
        px = _reflect(px, 0, W - 1) if align_corners else _reflect(px, -0.5, W - 0.5)
        py = _reflect(py, 0, H - 1) if align_corners else _reflect(py, -0.5, H - 0.5)
    elif padding_mode == "border":
        px, py = px.clip(0, W - 1), py.clip(0, H - 1)
    xf = x.float().reshape(N, C, H * W)

    def fetch(iy: Tensor, ix: Tensor) -> Tensor:
        valid = (ix >= 0) & (ix <= W - 1) & (iy >= 0) & (iy <= H - 1)
        cx, cy = ix.clip(0, W - 1), iy.clip(0, H - 1)
        idx = (cy * W + cx).cast(dtypes.int64).unsqueeze(1).expand(N, C, ix.shape[1])
        v = xf.gather(2, idx)
        return valid.unsqueeze(1).where(v, 0.0) if padding_mode == "zeros" else v

    if mode == "nearest":
        out = fetch(py.round(), px.round())
    elif mode == "linear":
        x0, y0 = px.floor(), py.floor()
        wx, wy = (px - x0).unsqueeze(1), (py - y0).unsqueeze(1)
        out = (
            fetch(y0, x0) * (1 - wx) * (1 - wy)
            + fetch(y0, x0 + 1) * wx * (1 - wy)
            + fetch(y0 + 1, x0) * (1 - wx) * wy
            + fetch(y0 + 1, x0 + 1) * wx * wy
        )
    elif mode == "cubic":
        x0, y0 = px.floor(), py.floor()
        wxs, wys = _cubic_w((px - x0).unsqueeze(1)), _cubic_w((py - y0).unsqueeze(1))
        out = None
        for i in range(4):
            for j in range(4):
                term = fetch(y0 + (i - 1), x0 + (j - 1)) * wys[i] * wxs[j]
                out = term if out is None else out + term
    else:
        raise NotImplementedError(f"GridSample mode={mode}")
    return out.reshape(N, C, Ho, Wo).cast(x.dtype)


# ---------------------------------------------------------------- strings (numpy object arrays, not Tensors)
def _is_str(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.kind in "OSU"


def _strs(v: Any) -> np.ndarray:
    return np.asarray(v, dtype=object)


@op("StringConcat")
def _strconcat(ctx, a, b):
    return np.asarray(np.frompyfunc(lambda p, q: p + q, 2, 1)(_strs(a), _strs(b)), dtype=object)


@op("RegexFullMatch")
def _regex(ctx, x, pattern=""):
    import re

    rx = re.compile(pattern)
    return Tensor(np.vectorize(lambda s: rx.fullmatch(s) is not None, otypes=[bool])(_strs(x)).reshape(np.shape(x)))


@op("StringSplit")
def _strsplit(ctx, x, delimiter=None, maxsplit=None):
    xs = _strs(x)
    parts = [(s.split(delimiter or None, -1 if maxsplit is None else maxsplit)) for s in xs.reshape(-1)]
    n = max([len(p) for p in parts], default=0)
    y = np.full((len(parts), n), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    return y.reshape(*xs.shape, n), Tensor(np.array([len(p) for p in parts], np.int64).reshape(xs.shape))


@op("StringNormalizer")
def _strnorm(ctx, x, case_change_action="NONE", is_case_sensitive=0, locale=None, stopwords=None):
    xs = _strs(x)
    flat = list(xs.reshape(-1))
    stop = set(stopwords or [])
    if is_case_sensitive:
        flat = [s for s in flat if s not in stop]
    else:
        low = {w.lower() for w in stop}
        flat = [s for s in flat if s.lower() not in low]
    if case_change_action == "LOWER":
        flat = [s.lower() for s in flat]
    elif case_change_action == "UPPER":
        flat = [s.upper() for s in flat]
    if not flat:
        flat = [""]
    out = np.array(flat, dtype=object)
    return out.reshape(1, -1) if xs.ndim == 2 else out


@op("LabelEncoder")
def _labelenc(
    ctx,
    x,
    default_float=-0.0,
    default_int64=-1,
    default_string="_Unused",
    default_tensor=None,
    keys_floats=None,
    keys_int64s=None,
    keys_strings=None,
    keys_tensor=None,
    values_floats=None,
    values_int64s=None,
    values_strings=None,
    values_tensor=None,
):
    keys = next(k for k in (keys_floats, keys_int64s, keys_strings, keys_tensor) if k is not None)
    vals = next(v for v in (values_floats, values_int64s, values_strings, values_tensor) if v is not None)
    keys, vals = list(np.asarray(keys).reshape(-1)), np.asarray(vals).reshape(-1)
    if values_tensor is not None:
        default = np.asarray(default_tensor).reshape(-1)[0] if default_tensor is not None else 0
    else:
        default = (
            default_float
            if values_floats is not None
            else default_int64
            if values_int64s is not None
            else default_string
        )
    table = dict(zip(keys, vals))
    xa = x if isinstance(x, np.ndarray) else x.numpy()
    odt = vals.dtype if vals.dtype.kind != "U" else object
    out = np.array([table.get(k, default) for k in xa.reshape(-1)], dtype=odt)
    out = out.reshape(xa.shape)
    return out if out.dtype == object else to_tensor(out)


@op("AffineGrid")
def _affinegrid(ctx, theta, size, align_corners=0):
    sz = ctx.ints(1)
    N, spatial = sz[0], sz[2:]
    axes = []
    for n in spatial:
        if align_corners:
            axes.append(np.linspace(-1, 1, n) if n > 1 else np.zeros(1))
        else:
            axes.append((2 * np.arange(n) + 1) / n - 1)
    if len(spatial) == 2:
        gx, gy = np.meshgrid(axes[1], axes[0])
        base = np.stack([gx, gy, np.ones_like(gx)], -1).reshape(-1, 3)
    elif len(spatial) == 3:
        gz, gy, gx = np.meshgrid(axes[0], axes[1], axes[2], indexing="ij")
        base = np.stack([gx, gy, gz, np.ones_like(gx)], -1).reshape(-1, 4)
    else:
        raise NotImplementedError(f"AffineGrid with {len(spatial)} spatial dims")
    b = Tensor(base.astype(np.float32)).cast(theta.dtype)
    out = b.unsqueeze(0).matmul(theta.transpose(1, 2))  # (N, P, dims)
    return out.reshape(N, *spatial, len(spatial))


@op("DFT")
def _dft(ctx, x, dft_length=None, axis_in=None, axis=None, inverse=0, onesided=0):
    if ctx.opset >= 20:
        ax = -2 if axis_in is None else int(ctx.np(2).reshape(-1)[0])
    else:
        ax = 1 if axis is None else axis
    ax = _ax(ax, x.ndim)
    xr = x[..., 0]
    xi = x[..., 1] if x.shape[-1] == 2 else None
    xr = xr.transpose(ax, -1)
    xi = xi.transpose(ax, -1) if xi is not None else None
    n_in = xr.shape[-1]
    N = n_in if dft_length is None else int(ctx.np(1).reshape(-1)[0])

    def fit(t):
        if t is None:
            return None
        if N < n_in:
            return t[..., :N]
        return t.pad([None] * (t.ndim - 1) + [(0, N - n_in)]) if N > n_in else t

    xr, xi = fit(xr), fit(xi)
    K = N // 2 + 1 if onesided else N
    ang = 2 * np.pi * np.outer(np.arange(N), np.arange(K)) / N
    sign = 1.0 if inverse else -1.0
    C = Tensor(np.cos(ang).astype(np.float32)).cast(xr.dtype)
    S = Tensor((sign * np.sin(ang)).astype(np.float32)).cast(xr.dtype)
    re, im = xr @ C, xr @ S
    if xi is not None:
        re, im = re - xi @ S, im + xi @ C
    if inverse:
        re, im = re / N, im / N
    return Tensor.stack(re.transpose(ax, -1), im.transpose(ax, -1), dim=-1)


@op("Col2Im")
def _col2im(ctx, x, image_shape, block_shape, dilations=None, pads=None, strides=None):
    img, blk = ctx.ints(1), ctx.ints(2)
    nd = len(img)
    d, s = dilations or [1] * nd, strides or [1] * nd
    p = pads or [0] * (2 * nd)
    padded = [img[i] + p[i] + p[i + nd] for i in range(nd)]
    outs = [(padded[i] - d[i] * (blk[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    K, L = math.prod(blk), math.prod(outs)
    # a 0/1 matrix sends every (kernel offset, block position) column entry to its pixel of the padded image
    M = np.zeros((K * L, math.prod(padded)), np.float32)
    for k, koff in enumerate(np.ndindex(*blk)):
        for l, loc in enumerate(np.ndindex(*outs)):
            pix = [loc[i] * s[i] + koff[i] * d[i] for i in range(nd)]
            M[k * L + l, np.ravel_multi_index(pix, padded)] = 1.0
    N = x.shape[0]
    C = x.shape[1] // K
    y = x.reshape(N, C, K * L).matmul(Tensor(M).cast(x.dtype)).reshape(N, C, *padded)
    return y[(slice(None), slice(None)) + tuple(slice(p[i], p[i] + img[i]) for i in range(nd))]


@op("TensorScatter")
def _tensorscatter(ctx, past, update, write_indices=None, axis=-2, mode="linear"):
    a = _ax(axis, past.ndim)
    T, S = past.shape[a], update.shape[a]
    if write_indices is not None:
        start = write_indices.cast(dtypes.int64)
    else:
        start = Tensor.zeros(past.shape[0], dtype=dtypes.int64)
    pos = start.reshape(-1, *([1] * (past.ndim - 1))) + Tensor.arange(S).cast(dtypes.int64).reshape(
        *([1] * a), S, *([1] * (past.ndim - a - 1))
    )
    if mode == "circular":
        pos = pos % T
    return past.scatter(a, pos.expand(*update.shape), update)
