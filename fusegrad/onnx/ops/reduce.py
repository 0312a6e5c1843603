"""Reductions: Reduce*, ArgMax/ArgMin, CumSum/CumProd and TopK."""

from __future__ import annotations

import math

from fusegrad.dtype import dtypes
from fusegrad.onnx.ops.base import OPS, cast_like, norm_axis, op
from fusegrad.tensor import Tensor


# ---------------------------------------------------------------- reductions
def _red_axes(ctx, x, axes_in, axes_attr, noop):
    axes = ctx.ints(1) if axes_in is not None else axes_attr
    if axes is None or len(axes) == 0:
        if noop:
            return None
        return tuple(range(x.ndim))
    return tuple(norm_axis(a, x.ndim) for a in axes)


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
        "ReduceSum": _reduce(lambda x, a, k: cast_like(x.sum(a, keepdim=k), x)),
        "ReduceMean": _reduce(lambda x, a, k: cast_like(x.mean(a, keepdim=k), x)),
        "ReduceMax": _reduce(_rmax),
        "ReduceMin": _reduce(_rmin),
        "ReduceProd": _reduce(lambda x, a, k: cast_like(x.prod(a, keepdim=k), x)),
        "ReduceL1": _reduce(lambda x, a, k: cast_like(x.abs().sum(a, keepdim=k), x)),
        "ReduceL2": _reduce(lambda x, a, k: cast_like((x * x).sum(a, keepdim=k).sqrt(), x)),
        "ReduceLogSum": _reduce(lambda x, a, k: x.sum(a, keepdim=k).log()),
        "ReduceLogSumExp": _reduce(
            lambda x, a, k: cast_like(x.logsumexp(a, keepdim=k) if x.numel() else x.sum(a, keepdim=k).log(), x)
        ),
        "ReduceSumSquare": _reduce(lambda x, a, k: cast_like((x * x).sum(a, keepdim=k), x)),
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
        a = norm_axis(axis, x.ndim)
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
    a = norm_axis(int(ctx.np(1).reshape(-1)[0]), x.ndim)
    if reverse:
        x = x.flip(a)
    y = x.cumsum(a)
    if exclusive:
        y = y - x
    if reverse:
        y = y.flip(a)
    return cast_like(y, x)


@op("TopK")
def _topk(ctx, x, k, axis=-1, largest=1, sorted=1):
    v, i = x.topk(int(ctx.np(1).reshape(-1)[0]), dim=axis, largest=bool(largest), sorted_=True)
    return v, i.cast(dtypes.int64)


@op("CumProd")
def _cumprod(ctx, x, axis, exclusive=0, reverse=0):
    a = norm_axis(int(ctx.np(1).reshape(-1)[0]), x.ndim)
    if reverse:
        x = x.flip(a)
    if exclusive:
        pad = [None] * x.ndim
        pad[a] = (1, 0)
        x = x.pad(pad, value=1)[(slice(None),) * a + (slice(0, x.shape[a]),)]
    y = x.cumprod(a)
    if reverse:
        y = y.flip(a)
    return cast_like(y, x)
