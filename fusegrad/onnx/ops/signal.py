"""Signal processing: window functions (Hann, Hamming, Blackman) and DFT."""

from __future__ import annotations

import numpy as np

from fusegrad.onnx.ops.base import OPS, norm_axis, onnx_dtype, op
from fusegrad.tensor import Tensor


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


@op("DFT")
def _dft(ctx, x, dft_length=None, axis_in=None, axis=None, inverse=0, onesided=0):
    if ctx.opset >= 20:
        ax = -2 if axis_in is None else int(ctx.np(2).reshape(-1)[0])
    else:
        ax = 1 if axis is None else axis
    ax = norm_axis(ax, x.ndim)
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
