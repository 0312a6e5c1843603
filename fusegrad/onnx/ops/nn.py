"""Neural-network layers: conv, pooling (MaxUnpool included), normalizations, softmax family, dropout, losses,
attention, rotary embeddings and the recurrent layers (RNN, GRU, LSTM unrolled over the sequence)."""

from __future__ import annotations

import math

import numpy as np

from fusegrad.dtype import dtypes
from fusegrad.onnx.ops.base import OPS, cast_like, norm_axis, op
from fusegrad.tensor import Tensor


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
def conv_nd(ctx, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
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
    y = cast_like(y, x)
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
    return cast_like(tot / cnt, x)


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
    return cast_like((x - mean.reshape(shp)) * inv + bias.reshape(shp), x)


@op("InstanceNormalization")
def _instnorm(ctx, x, scale, bias, epsilon=1e-5):
    axes = tuple(range(2, x.ndim))
    shp = (1, -1) + (1,) * (x.ndim - 2)
    return x.layernorm(axes, epsilon) * scale.reshape(shp) + bias.reshape(shp)


@op("LayerNormalization")
def _layernorm(ctx, x, scale, bias=None, axis=-1, epsilon=1e-5, stash_type=1):
    axes = tuple(range(norm_axis(axis, x.ndim), x.ndim))
    xf = x.float() if x.dtype != dtypes.float64 else x
    mean = xf.mean(axis=axes, keepdim=True)
    var = ((xf - mean) ** 2).mean(axis=axes, keepdim=True)
    inv = (var + epsilon).rsqrt()
    y = (xf - mean) * inv
    y = cast_like(y, x) * scale
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


def flat2d(x: Tensor, axis: int):
    axis = norm_axis(axis, x.ndim)
    return x.reshape(math.prod(x.shape[:axis]), -1)


def _softmax_like(f):
    def fn(ctx, x, axis=None):
        if ctx.opset < 13:
            axis = 1 if axis is None else axis
            return f(flat2d(x, axis), -1).reshape(x.shape)
        return f(x, -1 if axis is None else axis)

    return fn


OPS["Softmax"] = _softmax_like(lambda x, a: x.softmax(a))
OPS["LogSoftmax"] = _softmax_like(lambda x, a: x.log_softmax(a))


def _hardmax(x: Tensor, a: int) -> Tensor:
    a = norm_axis(a, x.ndim)
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
    return cast_like(_nll(x, target, weight, ignore_index, reduction), x)


@op("SoftmaxCrossEntropyLoss")
def _sce(ctx, scores, labels, weights=None, ignore_index=None, reduction="mean"):
    logp = scores.log_softmax(1)
    return cast_like(_nll(logp, labels, weights, ignore_index, reduction), scores), logp


@op("RMSNormalization")
def _rmsnorm(ctx, x, scale, axis=-1, epsilon=1e-5, stash_type=1):
    axes = tuple(range(norm_axis(axis, x.ndim), x.ndim))
    xf = x.float() if x.dtype != dtypes.float64 else x
    y = xf * ((xf * xf).mean(axis=axes, keepdim=True) + epsilon).rsqrt()
    return cast_like(y, x) * scale


@op("LpNormalization")
def _lpnorm(ctx, x, axis=-1, p=2):
    n = x.abs().sum(axis, keepdim=True) if p == 1 else (x * x).sum(axis, keepdim=True).sqrt()
    return (n == 0).where(0, x / n).cast(x.dtype)


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


# ---------------------------------------------------------------- rotary embeddings and unpooling
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
