"""Quantization: QuantizeLinear/DequantizeLinear/DynamicQuantizeLinear and the quantized linear algebra
(QLinearMatMul, ConvInteger, QLinearConv)."""

from __future__ import annotations

import numpy as np

from fusegrad.dtype import dtypes
from fusegrad.onnx.ops.base import EXOTIC, norm_axis, onnx_dtype, op, to_exotic
from fusegrad.onnx.ops.nn import conv_nd
from fusegrad.tensor import Tensor


# ---------------------------------------------------------------- quantization
def _per_axis(x, scale, zp, axis):
    """A 1-d scale (and zero point) with one entry per element of `axis`, shaped to broadcast against x."""
    if not (scale.ndim == 1 and x.ndim > 1 and scale.shape[0] > 1):
        return scale, zp
    shp = [1] * x.ndim
    shp[norm_axis(axis, x.ndim)] = -1
    return scale.reshape(shp), (zp.reshape(shp) if zp is not None else None)


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
    scale, zp = _per_axis(x, scale, zp, axis)
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
    scale, zp = _per_axis(x, scale, zp, axis)
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
    return conv_nd(ctx, xf, wf, None, **kw).round().cast(dtypes.int32)


@op("QLinearConv")
def _qlinconv(ctx, x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, B=None, **kw):
    X = _qdeq(x, x_s, x_zp)
    W = _qdeq(w, w_s, w_zp, (-1,) + (1,) * (w.ndim - 1))
    bias = B.float() * (x_s.float() * w_s.float()).reshape(-1) if B is not None else None
    return _qout(conv_nd(ctx, X, W, bias, **kw), y_s, y_zp, y_zp.dtype if y_zp is not None else dtypes.uint8)
