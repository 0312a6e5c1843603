"""Processing ops for Tensor: convolutions and pooling (sliding-window views + a reduce, so each is one fused kernel),
attention, normalization, losses, einsum, interpolation and a little linear algebra.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

from fusegrad.dtype import DTypeLike, dtypes
from fusegrad.helpers import make_tuple, prod

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


def _T() -> Any:
    from fusegrad.tensor import Tensor
    return Tensor


def _pad_pairs(padding: int | Sequence[int], dims: int) -> list[tuple[int, int]]:
    """torch-style conv padding: an int, one int per spatial dim (both sides), or 2 per dim flat (last dim first)."""
    if isinstance(padding, int): return [(padding, padding)] * dims
    p = list(padding)
    if len(p) == dims: return [(x, x) for x in p]
    if len(p) == 2 * dims: return [(p[2 * (dims - 1 - i)], p[2 * (dims - 1 - i) + 1]) for i in range(dims)]
    raise ValueError(f"padding {padding} must be an int, {dims} ints or {2 * dims} ints")


def _reduction(x: "Tensor", reduction: str) -> "Tensor":
    if reduction == "mean": return x.mean()
    if reduction == "sum": return x.sum()
    if reduction == "none": return x
    raise ValueError(f"reduction must be 'none', 'mean' or 'sum', got {reduction!r}")


def _custom_grad(value: "Tensor", inputs: list["Tensor"], backward: Callable, name: str) -> "Tensor":
    """`value` going forward; backward(grad, *inputs) -> one gradient Tensor per input (see autograd.GradFn)."""
    from fusegrad.autograd import GradFn
    from fusegrad.ir.ops import Ops, UOp
    T = _T()

    def bw(ctx: Any, node: Any) -> tuple[Any, ...]:
        return tuple(g.uop for g in backward(T._wrap(ctx), *[T._wrap(s) for s in node.src[1:]]))
    return T._wrap(UOp(Ops.DETACH, value.dtype, (value.uop, *[t.uop for t in inputs]), GradFn(bw, name)), *inputs)


def _conv_backward(g: "Tensor", x: "Tensor", w: "Tensor", k: tuple[int, ...], st: tuple[int, ...],
                   dl: tuple[int, ...], pads: list[tuple[int, int]], groups: int, unfold: Callable) -> list["Tensor"]:
    """Gradients of a convolution. Input: the stride-dilated gradient, padded by d*(K-1), correlated with the flipped,
    transposed weight, then cropped to the unpadded input. Weight: (unfolded x * g) summed over batch and positions."""
    nd = len(k)
    n, cin = x.shape[:2]
    cout, cg = w.shape[:2]
    o = g.shape[2:]
    gz = g
    for i, s in enumerate(st):  # insert s-1 zeros between gradient elements along each strided dim
        if s == 1: continue
        ax = 2 + i
        gz = gz.unsqueeze(ax + 1).pad([(0, 0)] * (ax + 1) + [(0, s - 1)] + [(0, 0)] * (gz.ndim - ax - 1))
        gz = gz.reshape(gz.shape[:ax] + (o[i] * s,) + gz.shape[ax + 2:])
        gz = gz.shrink([(0, v) if j != ax else (0, (o[i] - 1) * s + 1) for j, v in enumerate(gz.shape)])
    padded = [x.shape[2 + i] + pb + pa for i, (pb, pa) in enumerate(pads)]
    edge = [d * (kk - 1) for d, kk in zip(dl, k)]
    # materialized once, so the convolution below reads plain memory (no per-element bounds checks: it vectorizes)
    gz = gz.pad([(0, 0), (0, 0)] + [(e, e + p - (gz.shape[2 + i] + e)) for i, (e, p) in enumerate(zip(edge, padded))])
    gz = gz.contiguous()
    wt = w.reshape((groups, cout // groups, cg) + k).transpose(1, 2).reshape((cin, cout // groups) + k)
    dxp = gz.conv2d(wt.flip(list(range(2, 2 + nd))).cast(gz.dtype), groups=groups, dilation=dl)
    dx = dxp.shrink([(0, n), (0, cin)] + [(pb, pb + x.shape[2 + i]) for i, (pb, _) in enumerate(pads)])
    gr = g.reshape((n, groups, cout // groups) + o + (1,) * (nd + 1))
    dw = (unfold(x) * gr).sum([0] + [3 + i for i in range(nd)]).reshape(w.shape)
    return [dx.cast(x.dtype), dw.cast(w.dtype)]


class NNMixin:
    __slots__ = ()

    # ----- convolution -----
    def conv2d(self: "Tensor", weight: "Tensor", bias: "Tensor | None" = None, groups: int = 1, stride: Any = 1,
               dilation: Any = 1, padding: Any = 0, dtype: DTypeLike | None = None) -> "Tensor":
        """N-d convolution (cross-correlation, like torch): x (N, Cin, *S), weight (Cout, Cin/groups, *K)."""
        nd = weight.ndim - 2
        if self.ndim != nd + 2:
            raise RuntimeError(f"conv: input shape {self.shape} doesn't match weight shape {weight.shape}")
        n, cin = self.shape[:2]
        cout, cg = weight.shape[:2]
        k = weight.shape[2:]
        if cin != cg * groups or cout % groups:
            raise RuntimeError(f"conv: input channels {cin} != weight channels {cg} * groups {groups} "
                               f"(input {self.shape}, weight {weight.shape})")
        st, dl = make_tuple(stride, nd), make_tuple(dilation, nd)
        if padding == "same":
            if any(s != 1 for s in st): raise ValueError("padding='same' is not supported for strided convolutions")
            tot = [d * (kk - 1) for d, kk in zip(dl, k)]
            pads = [(t // 2, t - t // 2) for t in tot]
        elif padding == "valid": pads = [(0, 0)] * nd
        else: pads = _pad_pairs(padding, nd)
        def unfold(x: "Tensor") -> "Tensor":                                    # (N, G, 1, *O, Cg, *K)
            x = x.pad([(0, 0), (0, 0)] + pads)._pool(k, st, dl)                  # (N, Cin, *O, *K)
            x = x.reshape((n, groups, 1, cg) + x.shape[2:2 + nd] + k)           # (N, G, 1, Cg, *O, *K)
            return x.permute([0, 1, 2] + [4 + i for i in range(nd)] + [3] + [4 + nd + i for i in range(nd)])

        def forward(x: "Tensor", weight: "Tensor") -> "Tensor":
            w = weight.reshape((1, groups, cout // groups) + (1,) * nd + (cg,) + k)
            out = (unfold(x) * w).sum([-1 - i for i in range(nd + 1)], dtype=dtype)  # (N, G, Cout/G, *O)
            return out.reshape((n, cout) + out.shape[3:3 + nd])

        if any(p < 0 for pp in pads for p in pp) or not dtypes.is_float(self.dtype): out = forward(self, weight)
        else:  # the generic backward of the unfold is a scatter through every window; give it a transposed conv
            out = _custom_grad(forward(self.detach(), weight.detach()), [self, weight],
                               functools.partial(_conv_backward, k=k, st=st, dl=dl, pads=pads, groups=groups,
                                                 unfold=unfold), "conv")
        return out if bias is None else out + bias.reshape((1, cout) + (1,) * nd)

    def conv_transpose2d(self: "Tensor", weight: "Tensor", bias: "Tensor | None" = None, groups: int = 1,
                         stride: Any = 1, dilation: Any = 1, padding: Any = 0, output_padding: Any = 0) -> "Tensor":
        """Transposed convolution: a convolution of the stride-dilated input with the flipped, transposed weight."""
        nd = weight.ndim - 2
        k = weight.shape[2:]
        st, dl, op = make_tuple(stride, nd), make_tuple(dilation, nd), make_tuple(output_padding, nd)
        pads = _pad_pairs(padding, nd)
        cin, cog = weight.shape[:2]
        w = weight.reshape((groups, cin // groups, cog) + k).transpose(1, 2).reshape((groups * cog, cin // groups) + k)
        w = w.flip(list(range(2, 2 + nd)))
        x = self
        for i, s in enumerate(st):  # insert s-1 zeros between input elements
            if s == 1: continue
            ax = 2 + i
            sz = x.shape[ax]
            x = x.unsqueeze(ax + 1).pad([(0, 0)] * (ax + 1) + [(0, s - 1)] + [(0, 0)] * (x.ndim - ax - 1))
            x = x.reshape(x.shape[:ax] + (sz * s,) + x.shape[ax + 2:])
            x = x.shrink([(0, v) if j != ax else (0, (sz - 1) * s + 1) for j, v in enumerate(x.shape)])
        full = [(d * (kk - 1) - pb, d * (kk - 1) - pa + o) for d, kk, (pb, pa), o in zip(dl, k, pads, op)]
        return x.conv2d(w, bias, groups=groups, dilation=dl, padding=[v for p in reversed(full) for v in p])

    # ----- pooling -----
    def _pool_pad(self: "Tensor", k: tuple[int, ...], st: tuple[int, ...], dl: tuple[int, ...], pads: list[tuple[int, int]],
                  ceil_mode: bool) -> list[tuple[int, int]]:
        """Padding per spatial dim, plus the extra right padding ceil_mode needs for a last partial window."""
        out = []
        for i, (kk, s, d, (pb, pa)) in enumerate(zip(k, st, dl, pads)):
            size = self.shape[self.ndim - len(k) + i]
            eff = size + pb + pa - d * (kk - 1) - 1
            o = (-(-eff // s) if ceil_mode else eff // s) + 1
            if ceil_mode and (o - 1) * s >= size + pb: o -= 1   # the last window must start inside input + left pad
            need = (o - 1) * s + d * (kk - 1) + 1
            out.append((pb, max(need - size - pb, pa)))
        return out

    def max_pool2d(self: "Tensor", kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, return_indices: bool = False) -> Any:
        k = make_tuple(kernel_size, 2)
        st = make_tuple(stride if stride is not None else kernel_size, len(k))
        dl = make_tuple(dilation, len(k))
        pads = self._pool_pad(k, st, dl, _pad_pairs(padding, len(k)), ceil_mode)
        lead = [(0, 0)] * (self.ndim - len(k))
        fill = -math.inf if dtypes.is_float(self.dtype) else dtypes.min(self.dtype)
        w = self.pad(lead + pads, value=fill)._pool(k, st, dl)
        red = [-1 - i for i in range(len(k))]
        vals = w.max(red)
        if not return_indices: return vals
        Tensor = _T()
        sp = self.shape[-len(k):]
        pos = Tensor.arange(prod(sp), device=self.device).reshape(sp)
        pw = pos.pad(pads, value=-1)._pool(k, st, dl)                          # (*O, *K) flat input positions
        hit = w == vals.reshape(vals.shape + (1,) * len(k))
        big = prod(sp)
        idx = hit.where(pw, big).min(red)
        return vals, idx.cast(dtypes.int64)

    def avg_pool2d(self: "Tensor", kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True) -> "Tensor":
        k = make_tuple(kernel_size, 2)
        st = make_tuple(stride if stride is not None else kernel_size, len(k))
        dl = make_tuple(dilation, len(k))
        user = _pad_pairs(padding, len(k))
        pads = self._pool_pad(k, st, dl, user, ceil_mode)
        lead = [(0, 0)] * (self.ndim - len(k))
        red = [-1 - i for i in range(len(k))]
        total = self._float_or_self().pad(lead + pads)._pool(k, st, dl).sum(red)
        Tensor = _T()
        ones = Tensor.ones(self.shape[-len(k):], device=self.device)
        if count_include_pad:  # the user's padding counts, ceil_mode's extra doesn't
            ones = ones.pad(user, value=1.0)
            cnt = ones.pad([(0, p[1] - u[1]) for p, u in zip(pads, user)])._pool(k, st, dl).sum(red)
        else:
            cnt = ones.pad(pads)._pool(k, st, dl).sum(red)
        return total / cnt

    def max_unpool2d(self: "Tensor", indices: "Tensor", kernel_size: Any = (2, 2), stride: Any = None,
                     dilation: Any = 1, padding: Any = 0, output_size: Any = None) -> "Tensor":
        k = make_tuple(kernel_size, 2)
        st = make_tuple(stride if stride is not None else kernel_size, 2)
        dl, pd = make_tuple(dilation, 2), make_tuple(padding, 2)
        if output_size is None:
            output_size = tuple((i - 1) * s - 2 * p + d * (kk - 1) + 1
                                for i, s, p, d, kk in zip(self.shape[-2:], st, pd, dl, k))
        osz = tuple(output_size)[-2:]
        Tensor = _T()
        lead = self.shape[:-2]
        out = Tensor.zeros(lead + (prod(osz),), dtype=self.dtype, device=self.device)
        idx, vals = indices.reshape(lead + (-1,)), self.reshape(lead + (-1,))
        # torch: forward writes one value per position, backward gathers the output gradient at every index (so
        # duplicate indices, from overlapping windows, each get it). The gather is the transpose of a scatter-add:
        # compute that, and correct its forward value to the written one where duplicates summed up
        placed, summed = out.scatter(-1, idx, vals), out.scatter(-1, idx, vals, reduce="add")
        out = summed + (placed == summed).where(0, placed - summed).detach()
        return out.reshape(lead + osz)

    # ----- dense layers, normalization -----
    def linear(self: "Tensor", weight: "Tensor", bias: "Tensor | None" = None, dtype: DTypeLike | None = None) -> "Tensor":
        x = self.mul(weight) if weight.ndim == 1 else self.dot(weight, dtype=dtype)
        return x.add(bias) if bias is not None else x

    def sequential(self: "Tensor", ll: list[Callable[["Tensor"], "Tensor"]]) -> "Tensor":
        return functools.reduce(lambda x, f: f(x), ll, self)

    def layernorm(self: "Tensor", axis: int | tuple[int, ...] = -1, eps: float = 1e-5) -> "Tensor":
        y = self - self.mean(axis, keepdim=True)
        return y.mul((y * y).mean(axis, keepdim=True).add(eps).rsqrt())

    def batchnorm(self: "Tensor", weight: "Tensor | None", bias: "Tensor | None", mean: "Tensor", invstd: "Tensor",
                  axis: int | tuple[int, ...] = 1) -> "Tensor":
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(self._axis(a) for a in axes)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(self.shape))
        x = self - mean.reshape(shape)
        if weight is not None: x = x * weight.reshape(shape)
        ret = x.mul(invstd.reshape(shape) if invstd.ndim == len(axes) else invstd)
        return (ret + bias.reshape(shape)) if bias is not None else ret

    def dropout(self: "Tensor", p: float = 0.5) -> "Tensor":
        if not 0 <= p <= 1: raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        Tensor = _T()
        if not Tensor.training or p == 0: return self
        if p == 1: return self.zeros_like()
        return (Tensor.rand(*self.shape, device=self.device) >= p).where(self, 0) * (1 / (1 - p))

    def one_hot_float(self: "Tensor", n: int) -> "Tensor":
        return self.one_hot(n).float()

    def scaled_dot_product_attention(self: "Tensor", key: "Tensor", value: "Tensor", attn_mask: "Tensor | None" = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     enable_gqa: bool = False) -> "Tensor":
        """softmax(q k^T / sqrt(d) + mask) v, with torch's mask semantics (bool: True keeps)."""
        q = self
        if enable_gqa and key.shape[-3] != q.shape[-3]:
            rep = q.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(rep, dim=-3), value.repeat_interleave(rep, dim=-3)
        scores = q.matmul(key.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]))
        Tensor = _T()
        if is_causal:
            L, S = q.shape[-2], key.shape[-2]
            causal = Tensor.ones(L, S, dtype=dtypes.bool, device=q.device).tril()
            scores = causal.where(scores, -math.inf)
        if attn_mask is not None:
            scores = attn_mask.where(scores, -math.inf) if dtypes.is_bool(attn_mask.dtype) else scores + attn_mask
        w = scores.softmax(-1)
        if dropout_p: w = w.dropout(dropout_p)
        return w.matmul(value)

    def normalize(self: "Tensor", p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> "Tensor":
        norm = self.abs().pow(p).sum(dim, keepdim=True).pow(1 / p)
        return self / norm.maximum(eps)

    # ----- losses -----
    def binary_crossentropy(self: "Tensor", Y: "Tensor", reduction: str = "mean") -> "Tensor":
        lg, lg1 = self.log().maximum(-100), (1 - self).log().maximum(-100)   # torch clamps log at -100
        return _reduction(-(Y * lg + (1 - Y) * lg1), reduction)

    def binary_crossentropy_logits(self: "Tensor", Y: "Tensor", reduction: str = "mean",
                                   pos_weight: "Tensor | None" = None) -> "Tensor":
        sp = (-self.abs()).exp().add(1).log() + (-self).maximum(0)     # log(1 + exp(-x)), stable
        lw = 1 if pos_weight is None else 1 + (pos_weight - 1) * Y
        return _reduction((1 - Y) * self + lw * sp, reduction)

    def sparse_categorical_crossentropy(self: "Tensor", Y: "Tensor", ignore_index: int = -1,
                                        label_smoothing: float = 0.0, reduction: str = "mean") -> "Tensor":
        """Cross entropy of logits (..., C) against class indices Y (...); entries equal to ignore_index count 0."""
        lsm = self.log_softmax(-1)
        keep = Y != ignore_index
        yc = keep.where(Y, 0).cast(dtypes.int32)
        nll = -lsm.gather(-1, yc.unsqueeze(-1)).squeeze(-1)
        smooth = -lsm.mean(-1)
        loss = keep.where((1 - label_smoothing) * nll + label_smoothing * smooth, 0)
        if reduction == "mean": return loss.sum() / keep.sum().maximum(1)
        return _reduction(loss, reduction)

    def cross_entropy(self: "Tensor", Y: "Tensor", reduction: str = "mean", label_smoothing: float = 0.0) -> "Tensor":
        """Logits (N, C, ...) against class indices (N, ...) or class probabilities (N, C, ...), like torch."""
        x = self.unsqueeze(0) if self.ndim == 1 else self
        if dtypes.is_int(Y.dtype):
            y = Y.unsqueeze(0) if self.ndim == 1 else Y
            xl = x._move_axis(1, x.ndim - 1)
            out = xl.sparse_categorical_crossentropy(y, ignore_index=-100, label_smoothing=label_smoothing,
                                                     reduction=reduction)
            return out.squeeze(0) if self.ndim == 1 and reduction == "none" else out
        y = Y.unsqueeze(0) if self.ndim == 1 else Y
        c = x.shape[1]
        y = y * (1 - label_smoothing) + label_smoothing / c
        loss = -(x.log_softmax(1) * y).sum(1)
        return _reduction(loss.squeeze(0) if self.ndim == 1 else loss, reduction)

    def nll_loss(self: "Tensor", Y: "Tensor", weight: "Tensor | None" = None, ignore_index: int | None = None,
                 reduction: str = "mean") -> "Tensor":
        x = self.unsqueeze(0) if self.ndim == 1 else self
        y = (Y.unsqueeze(0) if self.ndim == 1 else Y).cast(dtypes.int32)
        keep = (y != ignore_index) if ignore_index is not None else y.ones_like(dtype=dtypes.bool)
        yc = keep.where(y, 0)
        picked = -x.gather(1, yc.unsqueeze(1)).squeeze(1)
        w = keep.cast(x.dtype) if weight is None else keep.where(weight[yc], 0)
        loss = picked * w
        if reduction == "mean": return loss.sum() / w.sum()
        out = _reduction(loss, reduction)
        return out.squeeze(0) if self.ndim == 1 and reduction == "none" else out

    # ----- einsum, interpolation -----
    @staticmethod
    def einsum(formula: str, *operands: Any, dtype: DTypeLike | None = None) -> "Tensor":
        """Einstein summation over letters; repeated letters within an operand take its diagonal."""
        ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) else list(operands)
        lhs, _, rhs = formula.replace(" ", "").partition("->")
        ins = lhs.split(",")
        if len(ins) != len(ops): raise ValueError(f"einsum: {len(ins)} operand specs for {len(ops)} operands")
        if "..." in formula:
            nb = max(t.ndim - (len(s) - 3) for s, t in zip(ins, ops) if "..." in s)
            dots = "".join(chr(0x100 + i) for i in range(nb))
            ins = [s.replace("...", dots[nb - (t.ndim - (len(s) - 3)):]) for s, t in zip(ins, ops)]
            rhs = rhs.replace("...", dots) if "->" in formula else None  # type: ignore[assignment]
        letters = sorted(set("".join(ins)))
        if not rhs and "->" not in formula:
            counts = {c: "".join(ins).count(c) for c in letters}
            rhs = "".join(c for c in letters if counts[c] == 1 and c < chr(0x100)) if not ("..." in formula) else \
                "".join(c for c in letters if c >= chr(0x100)) + "".join(c for c in letters if counts[c] == 1 and c < chr(0x100))
        order = [c for c in rhs] + [c for c in letters if c not in rhs]
        sizes: dict[str, int] = {}
        prepared = []
        for spec, t in zip(ins, ops):
            if len(spec) != t.ndim: raise ValueError(f"einsum: operand spec {spec!r} doesn't match shape {t.shape}")
            while len(set(spec)) != len(spec):  # diagonal for repeated letters
                c = next(ch for ch in spec if spec.count(ch) > 1)
                i, j = spec.index(c), spec.index(c, spec.index(c) + 1)
                t = t.diagonal(0, i, j)
                spec = spec[:i] + spec[i + 1:j] + spec[j + 1:] + c
            for c, s in zip(spec, t.shape):
                prev = sizes.get(c, 1)
                if prev != s and s != 1 and prev != 1:
                    raise ValueError(f"einsum: size mismatch for {c!r}: {prev} vs {s}")
                sizes[c] = s if prev == 1 else prev   # size 1 broadcasts (also against 0)
            perm = sorted(range(len(spec)), key=lambda a: order.index(spec[a]))
            t = t.permute(perm) if perm else t
            srt = [spec[a] for a in perm]
            t = t.reshape(tuple(t.shape[srt.index(c)] if c in srt else 1 for c in order))
            prepared.append(t)
        full = tuple(sizes.get(c, 1) for c in order)
        acc = functools.reduce(lambda a, b: a * b, [t.expand(full) for t in prepared])
        red = list(range(len(rhs), len(order)))
        return acc.sum(red, dtype=dtype) if red else acc

    def interpolate(self: "Tensor", size: tuple[int, ...], mode: str = "linear", align_corners: bool = False) -> "Tensor":
        """Resize the trailing len(size) axes: 'linear' (per-axis linear), 'nearest' or 'nearest-exact'."""
        if mode not in ("linear", "nearest", "nearest-exact"): raise ValueError(f"unsupported interpolate mode {mode!r}")
        Tensor = _T()
        x = self
        for i, out_n in enumerate(size):
            ax = self.ndim - len(size) + i
            in_n = x.shape[ax]
            dst = Tensor.arange(out_n, device=self.device, dtype=dtypes.float32)
            scale = in_n / out_n
            if mode == "nearest": idx = (dst * scale).floor().cast(dtypes.int32).minimum(in_n - 1)
            elif mode == "nearest-exact": idx = ((dst + 0.5) * scale).floor().cast(dtypes.int32).minimum(in_n - 1)
            if mode != "linear":
                x = x._index_tensor(ax, idx)
                continue
            if align_corners: src = dst * ((in_n - 1) / (out_n - 1)) if out_n > 1 else dst * 0
            else: src = ((dst + 0.5) * scale - 0.5).maximum(0)
            i0 = src.floor().cast(dtypes.int32).minimum(in_n - 1)
            i1 = (i0 + 1).minimum(in_n - 1)
            w = (src - i0.cast(dtypes.float32)).reshape((out_n,) + (1,) * (x.ndim - ax - 1))
            x = x._index_tensor(ax, i0) * (1 - w) + x._index_tensor(ax, i1) * w
        return x

    # ----- linear algebra -----
    def qr(self: "Tensor") -> "tuple[Tensor, Tensor]":
        """Householder QR of (..., m, n): Q (..., m, m), R (..., m, n)."""
        Tensor = _T()
        m, n = self.shape[-2], self.shape[-1]
        R = self._float_or_self()
        Q = Tensor.eye(m, device=self.device).expand(self.shape[:-2] + (m, m))
        for j in range(min(m - 1, n)):
            col = R[..., j:, j]                                                   # (..., m-j)
            norm = (col * col).sum(-1, keepdim=True).sqrt()
            alpha = -(col[..., 0:1] >= 0).where(norm, -norm)
            e0 = (Tensor.arange(m - j, device=self.device) == 0).float()
            v = col - alpha * e0
            vn = (v * v).sum(-1, keepdim=True)
            v = (vn > 1e-30).where(v / vn.maximum(1e-30).sqrt(), 0)
            vfull = v.pad([(0, 0)] * (v.ndim - 1) + [(j, 0)])                   # (..., m)
            H = Tensor.eye(m, device=self.device) - 2 * vfull.unsqueeze(-1) * vfull.unsqueeze(-2)
            R = H.matmul(R)
            Q = Q.matmul(H)
        return Q, R

    def newton_schulz(self: "Tensor", steps: int, params: tuple[float, ...], eps: float = 1e-7) -> "Tensor":
        """Approximate orthogonalization (used by the Muon optimizer)."""
        a, b, c = params
        x = self / (self.square().sum((-2, -1), keepdim=True).sqrt() + eps)
        tr = x.shape[-2] > x.shape[-1]
        if tr: x = x.transpose(-2, -1)
        for _ in range(steps):
            A = x.matmul(x.transpose(-2, -1))
            B = b * A + c * A.matmul(A)
            x = a * x + B.matmul(x)
        return x.transpose(-2, -1) if tr else x
