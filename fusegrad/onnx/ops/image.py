"""Spatial resampling and detection ops: Resize/Upsample, GridSample, AffineGrid, Col2Im, NonMaxSuppression."""

from __future__ import annotations

import math

import numpy as np

from fusegrad.dtype import dtypes
from fusegrad.onnx.ops.base import cast_like, norm_axis, op
from fusegrad.tensor import Tensor


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
    ax = list(range(nd)) if axes is None else [norm_axis(a, nd) for a in axes]
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
    return cast_like(y, x)


# ---------------------------------------------------------------- NonMaxSuppression
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
