"""Shape, movement and indexing ops: Reshape, Transpose, Concat/Split, Slice, Gather/Scatter, Pad, Tile,
DepthToSpace, OneHot, Trilu, NonZero, Unique, CenterCropPad, TensorScatter, ..."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fusegrad.dtype import dtypes
from fusegrad.onnx.ops.base import norm_axis, op, to_tensor
from fusegrad.onnx.ops.nn import flat2d
from fusegrad.tensor import Tensor


# ---------------------------------------------------------------- movement
@op("Reshape")
def _reshape(ctx, x, shape=None, allowzero=0, **kw):
    shp = ctx.ints(1) if shape is not None else kw.get("shape_attr")
    if not allowzero:
        shp = [x.shape[i] if s == 0 else s for i, s in enumerate(shp)]
    return x.reshape(tuple(shp))


@op("Flatten")
def _flatten(ctx, x, axis=1):
    return flat2d(x, axis) if x.ndim else x.reshape(1, 1)


@op("Transpose")
def _transpose(ctx, x, perm=None):
    return x.permute(tuple(perm) if perm is not None else tuple(range(x.ndim))[::-1])


@op("Concat")
def _concat(ctx, *xs, axis):
    xs = [x for x in xs if x is not None]
    return xs[0].cat(*xs[1:], dim=axis) if len(xs) > 1 else xs[0]


@op("Split")
def _split(ctx, x, split=None, axis=0, num_outputs=None, **kw):
    a = norm_axis(axis, x.ndim)
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
    ax = sorted(norm_axis(a, x.ndim) for a in ax)
    return x.reshape(tuple(s for i, s in enumerate(x.shape) if i not in ax))


@op("Unsqueeze")
def _unsqueeze(ctx, x, axes=None):
    ax = ctx.ints(1) if axes is not None and not isinstance(axes, list) else axes
    nd = x.ndim + len(ax)
    ax = sorted(norm_axis(a, nd) for a in ax)
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
    ax = list(range(len(st))) if ax is None else [norm_axis(a, x.ndim) for a in ax]
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


def _check_indices(ctx, i: int, sizes: tuple, where: Any) -> None:
    """Raise IndexError, as onnxruntime does (ONNX leaves the result undefined), when an index of input i is outside
    [-n, n) for its dimension; without this an out-of-range index would read 0 or drop its write. `sizes` has one
    size per index (Gather, *Elements) or one per entry of the last index axis (GatherND, ScatterND)."""
    if not all(isinstance(s, int) for s in sizes):
        return  # a symbolic size: the check needs the bound value
    vals = ctx.index_values(i)
    if vals is None or vals.size == 0:
        return
    vals = np.asarray(vals).astype(np.int64).reshape(-1, len(sizes))
    n = np.array(sizes, dtype=np.int64)
    bad = (vals < -n) | (vals >= n)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        n, dim = sizes[col], where(col) if callable(where) else where
        raise IndexError(
            f"ONNX {ctx.node.op_type} node {ctx.node.name!r}: index {int(vals[row, col])} is out of range for {dim} "
            f"of size {n} (valid: {-n} to {n - 1})"
        )


@op("Gather")
def _gather(ctx, x, idx, axis=0):
    a = norm_axis(axis, x.ndim)
    _check_indices(ctx, 1, (x.shape[a],), f"axis {a}")
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
    a = norm_axis(axis, x.ndim)
    _check_indices(ctx, 1, (x.shape[a],), f"axis {a}")
    idx = idx.cast(dtypes.int64)
    idx = (idx < 0).where(idx + x.shape[a], idx)
    return x.gather(a, idx)


@op("GatherND")
def _gathernd(ctx, x, idx, batch_dims=0):
    idx = idx.cast(dtypes.int64)
    m = idx.shape[-1]
    _check_indices(ctx, 1, tuple(x.shape[batch_dims : batch_dims + m]), lambda j: f"axis {batch_dims + j}")
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
    a = norm_axis(axis, x.ndim)
    _check_indices(ctx, 1, (x.shape[a],), f"axis {a}")
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
    _check_indices(ctx, 1, tuple(dims), lambda j: f"axis {j}")
    rest = x.shape[m:]
    xf = x.reshape(math.prod(dims), math.prod(rest) if rest else 1)
    idf = idx.cast(dtypes.int64).reshape(-1, m)
    flat = Tensor.zeros(idf.shape[0], dtype=dtypes.int64)
    for j in range(m):
        ij = idf[:, j]
        flat = flat * dims[j] + (ij < 0).where(ij + dims[j], ij)  # negative indices count from the end (onnxruntime)
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
    ax = list(range(x.ndim)) if ax is None else [norm_axis(a, x.ndim) for a in ax]
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
    a = norm_axis(axis, nd)
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
        a = norm_axis(axis, x.ndim)
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


@op("CenterCropPad")
def _centercroppad(ctx, x, shape, axes=None):
    tgt = ctx.ints(1)
    ax = list(range(x.ndim)) if axes is None else [norm_axis(a, x.ndim) for a in axes]
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


@op("TensorScatter")
def _tensorscatter(ctx, past, update, write_indices=None, axis=-2, mode="linear"):
    a = norm_axis(axis, past.ndim)
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
