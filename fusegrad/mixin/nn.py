"""Processing ops for Tensor: convolutions and pooling (sliding-window views + a reduce, so each is one fused kernel),
attention, normalization, losses, einsum, interpolation and a little linear algebra.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence, TYPE_CHECKING

from fusegrad.autograd import custom_grad
from fusegrad.dtype import DTypeLike, dtypes, least_upper_dtype, reduce_acc_dtype, sum_acc_dtype
from fusegrad.helpers import ShapeError, TRAINING, make_tuple, prod
from fusegrad.ir import build
from fusegrad.ir.ops import OpMixin, Ops, UOp
from fusegrad.ir.shape import all_static
from fusegrad.mixin.movement import pool_uop
from fusegrad.mixin.alu import on_nodes
from fusegrad.storage import is_contiguous_buffer

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


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


def _samples_per_group(n: int, sample_bytes: int, out_bytes: int, target: int = 1 << 20) -> int:
    """The most samples (a divisor of n) whose inputs fit in `target` bytes (about one core's L2), but enough that the
    per-group partial sums take no more memory than the inputs; n (no grouping) for small batches."""
    if n < 8: return n
    divs = [d for d in range(1, n + 1) if n % d == 0]
    spg = max([d for d in divs if d * sample_bytes <= target], default=1)
    return min([d for d in divs if d >= spg and (n // d) * out_bytes <= n * sample_bytes], default=n)


def _conv_backward(g: "Tensor", x: "Tensor", w: "Tensor", k: tuple[int, ...], st: tuple[int, ...],
                   dl: tuple[int, ...], pads: list[tuple[int, int]], groups: int, unfold: Callable) -> list["Tensor"]:
    """Gradients of a convolution. Input: the stride-dilated gradient, padded by d*(K-1), correlated with the flipped,
    transposed weight, then cropped to the unpadded input. Weight: (unfolded x * g) summed over batch and positions."""
    nd = len(k)
    n, cin = x.shape[:2]
    cout, cg = w.shape[:2]
    o = g.shape[2:]
    # the incoming gradient is often a fused expression (relu, pooling and norm backward); both gradients below read
    # each of its elements many times (once per weight tap), so compute it once
    g = g.contiguous()
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
    gw = g
    if (cout // groups) % 8 == 0 and cg >= 4:
        # a channels-last copy of the gradient: the weight-gradient kernel then vectorizes across output channels
        # (contiguous 8-16 lane loads) instead of along the short output rows (conv2 of beautiful_mnist: 2.5x)
        gw = g.permute([0] + [2 + i for i in range(nd)] + [1]).contiguous().permute([0, nd + 1] + [1 + i for i in range(nd)])
    gr = gw.reshape((n, groups, cout // groups) + o + (1,) * (nd + 1))
    # half: float32 products (as the forward); x is cast before the unfold, whose copies a cast would otherwise
    # make worth storing (recompute.py: a 9x bigger im2col buffer and a matmul over it)
    mul_dt = reduce_acc_dtype(least_upper_dtype(x.dtype, gr.dtype))
    prod_ = unfold(x.cast(mul_dt)) * gr.cast(mul_dt)        # (N, G, Cout/G, *O, Cg, *K)
    # the weight gradient reduces over the batch and every position into a small output, so each output tile would
    # stream the whole batch from memory; summing groups of samples first (the group is the outer output loop) keeps
    # one group's inputs in the cache while every tile reads them, then a small second kernel adds the groups
    spg = _samples_per_group(n, (cin * math.prod(x.shape[2:]) + cout * math.prod(o)) * x.dtype.itemsize,
                             math.prod(w.shape) * max(x.dtype.itemsize, 4))
    if spg < n:
        prod_ = prod_.reshape((n // spg, spg) + prod_.shape[1:])
        dw = prod_.sum([1] + [4 + i for i in range(nd)]).sum(0).reshape(w.shape)
    else: dw = prod_.sum([0] + [3 + i for i in range(nd)]).reshape(w.shape)
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
            xu = unfold(x)
            w = weight.reshape((groups, cout // groups, cg) + k)
            last = xu.shape[2 + nd]  # the output rows' length
            if isinstance(last, int) and (last % 8 or cg >= 16) and (cout // groups) % 8 == 0:
                # output rows too short to vectorize along (6 wide, say), or enough input channels to amortize it: a
                # copy of the weight that is contiguous in the output channels lets the kernel vectorize across
                # channels instead (4-8x on short rows; beautiful_mnist's conv3 at bs512: 13.3 -> 8.9 ms, its input
                # gradient 20.8 -> 16.2 ms; with one input channel (conv1) the row-vectorized kernel stays faster)
                w = w.permute([0] + [2 + i for i in range(nd + 1)] + [1]).contiguous()
                w = w.permute([0, nd + 2] + list(range(1, nd + 2)))
            w = w.reshape((1, groups, cout // groups) + (1,) * nd + (cg,) + k)
            out = (xu * w).sum([-1 - i for i in range(nd + 1)], dtype=dtype)  # (N, G, Cout/G, *O)
            return out.reshape((n, cout) + out.shape[3:3 + nd])

        def forward_uop(x: "UOp", wt: "UOp") -> "UOp":
            """`forward` of detached operands on the graph nodes: the same nodes, with one Tensor for the result, not
            about fifteen (a third of an eager EfficientNet call's graph building went to conv intermediates)."""
            dt = least_upper_dtype(x.dtype, wt.dtype)          # the multiply's promotion and broadcast
            # 16-bit floats multiply in float32 (exact products, as torch and a GEMM do) into the float32 sum: a
            # product rounded to half was converted back to float32 for the sum, two conversions per multiply-add.
            # The cast comes before the unfold: on the unfolded view it made the 9x bigger im2col worth storing.
            mul_dt = reduce_acc_dtype(dt)
            x, wt = build.cast(x, mul_dt), build.cast(wt, mul_dt)
            xu, _ = pool_uop(build.pad(x, [(0, 0), (0, 0)] + pads), k, st, dl)          # (N, Cin, *O, *K)
            o = xu.shape[2:2 + nd]
            xu = build.permute(build.reshape(xu, (n, groups, 1, cg) + o + k),
                               [0, 1, 2] + [4 + i for i in range(nd)] + [3] + [4 + nd + i for i in range(nd)])
            w = build.reshape(wt, (groups, cout // groups, cg) + k)
            last = xu.shape[2 + nd]
            if (last % 8 or cg >= 16) and (cout // groups) % 8 == 0:   # as in forward: a channels-last weight copy
                w = build.permute(w, [0] + [2 + i for i in range(nd + 1)] + [1])
                if not is_contiguous_buffer(w): w = UOp(Ops.CONTIGUOUS, w.dtype, (w,))
                w = build.permute(w, [0, nd + 2] + list(range(1, nd + 2)))
            w = build.reshape(w, (1, groups, cout // groups) + (1,) * nd + (cg,) + k)
            full = tuple(max(a, b) for a, b in zip(xu.shape, w.shape))
            prod_ = build.alu(Ops.MUL, build.expand(xu, full), build.expand(w, full))
            axes = tuple(len(full) - 1 - i for i in range(nd + 1))
            red = build.reduce_axis(build.cast(prod_, sum_acc_dtype(dt)), Ops.ADD, axes)   # sum() without a dtype
            red = build.cast(build.reshape(red, tuple(v for i, v in enumerate(full) if i not in axes)), dt)
            return build.reshape(red, (n, cout) + o)

        if any(p < 0 for pp in pads for p in pp) or not dtypes.is_float(self.dtype): out = forward(self, weight)
        elif dtype is None and all_static(self.shape) and self.numel() and weight.numel():
            out = custom_grad(forward_uop(UOp(Ops.DETACH, self.dtype, (self.uop,)),
                                           UOp(Ops.DETACH, weight.dtype, (weight.uop,))), [self, weight],
                               functools.partial(_conv_backward, k=k, st=st, dl=dl, pads=pads, groups=groups,
                                                 unfold=unfold), "conv")
        else:  # the generic backward of the unfold is a scatter through every window; give it a transposed conv
            out = custom_grad(forward(self.detach(), weight.detach()), [self, weight],
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
        # stored before the windows are taken (the windowed view itself may overlap), see Tensor._exact_for_max_grad
        w = self._exact_for_max_grad().pad(lead + pads, value=fill)._pool(k, st, dl)
        red = [-1 - i for i in range(len(k))]
        vals = w.max(red)
        if not return_indices: return vals
        Tensor = type(self)
        sp = self.shape[-len(k):]
        pos = Tensor.arange(prod(sp), device=self.device).reshape(sp)
        pw = pos.pad(pads, value=-1)._pool(k, st, dl)                          # (*O, *K) flat input positions
        vk = vals.reshape(vals.shape + (1,) * len(k))
        hit = w == vk
        if dtypes.is_float(self.dtype): hit = hit | (w.isnan() & vk.isnan())   # torch points at the (first) NaN
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
        Tensor = type(self)
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
        Tensor = type(self)
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
        return on_nodes(self, OpMixin._layernorm, axis, eps)

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
        Tensor = type(self)
        if not (Tensor.training or TRAINING) or p == 0: return self  # `with Tensor.train():` or Context(TRAINING=1)
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
        Tensor = type(self)
        if is_causal:
            L, S = q.shape[-2], key.shape[-2]
            causal = Tensor.ones(L, S, dtype=dtypes.bool, device=q.device).tril()
            scores = causal.where(scores, -math.inf)
        if attn_mask is not None:
            scores = attn_mask.where(scores, -math.inf) if dtypes.is_bool(attn_mask.dtype) else scores + attn_mask
        # a row with every key masked attends to nothing: zeros out and a zero gradient, as torch (>= 2.5) gives,
        # not the NaN of softmax over all -inf
        empty = scores.max(-1, keepdim=True) == -math.inf
        w = empty.where(0.0, empty.where(0.0, scores).softmax(-1))
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
        # nothing counted (an empty batch, or every target ignored) is 0/0 = nan, as in torch, not a silent 0
        if reduction == "mean": return loss.sum() / keep.sum().cast(loss.dtype)
        return _reduction(loss, reduction)

    def cross_entropy(self: "Tensor", Y: "Tensor", reduction: str = "mean", label_smoothing: float = 0.0,
                      ignore_index: int = -100) -> "Tensor":
        """Logits (N, C, ...) against class indices (N, ...) or class probabilities (N, C, ...), like torch's
        F.cross_entropy. With indices, targets equal to `ignore_index` (torch's keyword; tinygrad has none) count 0
        and "mean" averages over the others.

        ```python
        Tensor([[2.0, 0.0], [0.0, 2.0]]).cross_entropy(Tensor([0, -100])).item()   # 0.1269...
        ```
        """
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        # an int target of the logits' own shape is class probabilities (a one-hot: tinygrad decides by shape; torch
        # would take it for indices and raise), any other int target class indices
        if dtypes.is_int(Y.dtype) and Y.shape == self.shape: Y = Y.float()
        if dtypes.is_int(Y.dtype):
            y = Y.unsqueeze(0) if self.ndim == 1 else Y
            if y.shape != x.shape[:1] + x.shape[2:]:
                raise ShapeError(f"cross_entropy: target {Y.shape} doesn't fit logits {self.shape}")
            xl = x._move_axis(1, x.ndim - 1)
            out = xl.sparse_categorical_crossentropy(y, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                                     reduction=reduction)
            return out.squeeze(0) if self.ndim == 1 and reduction == "none" else out
        y = Y.unsqueeze(0) if self.ndim == 1 else Y
        if y.shape != x.shape: raise ShapeError(f"cross_entropy: target {Y.shape} doesn't fit logits {self.shape}")
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
        if len(ins) != len(ops): raise ShapeError(f"einsum: {len(ins)} operand specs for {len(ops)} operands")
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
            if len(spec) != t.ndim: raise ShapeError(f"einsum: operand spec {spec!r} doesn't match shape {t.shape}")
            while len(set(spec)) != len(spec):  # diagonal for repeated letters
                c = next(ch for ch in spec if spec.count(ch) > 1)
                i, j = spec.index(c), spec.index(c, spec.index(c) + 1)
                t = t.diagonal(0, i, j)
                spec = spec[:i] + spec[i + 1:j] + spec[j + 1:] + c
            for c, s in zip(spec, t.shape):
                prev = sizes.get(c, 1)
                if prev != s and s != 1 and prev != 1:
                    raise ShapeError(f"einsum: size mismatch for {c!r}: {prev} vs {s}")
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
        """Resize the trailing len(size) axes: 'linear' (per-axis linear, so bilinear/trilinear for 2/3 sizes),
        'nearest' or 'nearest-exact'. The result keeps the input's dtype; integer inputs (uint8 images) are computed
        in float32 and rounded to nearest, which is within 1 of torch's fixed-point uint8 path.

        ```python
        Tensor([[1.0, 3.0]]).interpolate((4,)).tolist()   # [[1.0, 1.5, 2.5, 3.0]]
        ```
        """
        if mode not in ("linear", "nearest", "nearest-exact"): raise ValueError(f"unsupported interpolate mode {mode!r}")
        if not isinstance(size, (tuple, list)) or not 0 < len(size) <= self.ndim or \
                any(not isinstance(s, int) or s < 0 for s in size):
            raise ValueError(f"interpolate: size must be 1 to {self.ndim} non-negative ints, got {size!r}")
        if align_corners and mode != "linear": raise ValueError("align_corners only goes with mode='linear'")
        if mode == "linear" and not dtypes.is_float(self.dtype):
            lo, hi = (0, 1) if dtypes.is_bool(self.dtype) else (dtypes.min(self.dtype), dtypes.max(self.dtype))
            out = self.cast(dtypes.float32).interpolate(size, mode, align_corners).round().clamp(lo, hi)
            return out.cast(self.dtype)
        Tensor = type(self)
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
        """Householder QR of (..., m, n): Q (..., m, m) orthogonal, R (..., m, n) upper triangular, A = Q @ R.

        Step j reflects R's column j below the diagonal onto the diagonal: with x = R[j:, j] and
        v = x + sign(x_0) |x| e_0 (normalized), R <- R - 2 v (v^T R) and Q <- Q - 2 (Q v) v^T. Every step has the
        same shapes (which rows/column take part comes in as small 0/1 vectors), so all steps share compiled kernels;
        Q and R are realized after each step, so the lazy graph stays one step deep.

        >>> Q, R = Tensor([[3.0, 1.0], [4.0, 2.0]]).qr()
        >>> [round(x, 4) for x in R.numpy().ravel().tolist()]
        [-5.0, -2.2, 0.0, 0.4]
        """
        Tensor = type(self)
        m, n = self.shape[-2], self.shape[-1]
        R = self._float_or_self()
        dev, dt = self.device, R.dtype
        Q = Tensor.eye(m, dtype=dt, device=dev).expand(self.shape[:-2] + (m, m))
        if m > 1 and n > 0: Q, R = Q.contiguous(), R.contiguous()   # as buffers, every step runs the same kernels
        for j in range(min(m - 1, n)):
            at_col = Tensor([float(c == j) for c in range(n)], dtype=dt, device=dev)        # (n,)
            at_row = Tensor([float(r == j) for r in range(m)], dtype=dt, device=dev)        # (m,)
            below = Tensor([float(r >= j) for r in range(m)], dtype=dt, device=dev)         # (m,)
            x = (R * at_col).sum(-1) * below                                    # (..., m): R[j:, j], zeros above
            norm = x.square().sum(-1, keepdim=True).sqrt()
            alpha = -((x * at_row).sum(-1, keepdim=True) >= 0).where(norm, -norm)   # the new R[j, j]
            v = x - alpha * at_row
            vn = v.square().sum(-1, keepdim=True)
            v = v * (vn > 1e-30).where(vn.maximum(1e-30).rsqrt(), 0.0)        # x already on the axis: no reflection
            R = R - 2 * v.unsqueeze(-1) * (v.unsqueeze(-1) * R).sum(-2, keepdim=True)
            Q = Q - 2 * (Q * v.unsqueeze(-2)).sum(-1, keepdim=True) * v.unsqueeze(-2)
            Q.realize(R)
        return Q, R

    def svd(self: "Tensor", full_matrices: bool = True) -> "tuple[Tensor, Tensor, Tensor]":
        """Singular value decomposition of (..., M, N), like torch.linalg.svd: A = U @ diag(S) @ Vh.

        S is (..., K) with K = min(M, N), descending. U is (..., M, M) and Vh (..., N, N) with full_matrices, else
        U (..., M, K) and Vh (..., K, N). Singular vectors are unique only up to sign (and up to a rotation within a
        repeated singular value), so they may differ from torch's by that. Integer inputs compute in the default
        float; other float dtypes (float16, bfloat16) compute in float32 and are cast back.

        Method (all Tensor ops, no data-dependent control flow): scale by max |A|, Householder QR of the tall
        orientation X = Q R, then one-sided Jacobi on R^T (the QR cuts the sweeps needed for graded spectra). Jacobi
        rotates pairs of columns until all columns are orthogonal: all C/2 pairs of a round at once, C-1 rounds a
        sweep, a fixed number of sweeps (`_svd_sweeps`), realizing after each round so the lazy graph stays small.
        The column norms are S. The rotations give R^T Vj = W, so U = Q Vj (orthonormal by construction; Q's last
        columns complete it) and V = W / S, re-orthonormalized by a QR that also fills in the columns of zero
        singular values.

        Gradients follow the analytic rule for the thin factors (like torch, the extra columns of full U/Vh get no
        gradient); they are infinite or NaN when singular values repeat or, for U/Vh of a non-square A, are zero.

        >>> U, S, Vh = Tensor([[3.0, 0.0], [0.0, -4.0]]).svd()
        >>> S.tolist()
        [4.0, 3.0]
        """
        if self.ndim < 2: raise RuntimeError(f"svd: the input must have at least 2 dimensions, got shape {self.shape}")
        x = self._float_or_self()
        work = x if x.dtype in (dtypes.float32, dtypes.float64) else x.cast(dtypes.float32)
        m, n = self.shape[-2], self.shape[-1]
        if 0 in self.shape: U, S, Vh = _svd_empty(work, full_matrices)
        else:
            tall = work.detach() if m >= n else work.detach().transpose(-2, -1)
            Ut, S, Vt = _svd_tall(tall, full_matrices)               # tall = Ut @ diag(S) @ Vt^T
            U, Vh = (Ut, Vt.transpose(-2, -1)) if m >= n else (Vt, Ut.transpose(-2, -1))
            U, S, Vh = _svd_attach_grads(work, U, S, Vh)
        return U.cast(x.dtype), S.cast(x.dtype), Vh.cast(x.dtype)

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


# ----- svd: the pieces of Tensor.svd -----

def _svd_sweeps(cols: int, dtype: Any) -> int:
    """Jacobi sweeps for `cols` columns: 5 + ceil(log2 cols) in float32, 6 + 3 ceil(log2 cols) in float64. Measured on
    random, clustered (repeated), graded (1..1e-6), rank-deficient, Hilbert and row/column-scaled matrices of 2 to 128
    columns, S and the columns' orthogonality reach their final accuracy (4 cols eps relative to the largest singular
    value) at least one sweep before this (clustered spectra are the slowest; float64 has to go further). A converged
    sweep rotates by ~0 and changes nothing, so the count only has to be large enough."""
    lg = max(cols - 1, 1).bit_length()
    return 6 + 3 * lg if dtype == dtypes.float64 else 5 + lg


def _jacobi_round(W: "Tensor", rows: int) -> "Tensor":
    """One round of parallel one-sided Jacobi on W (..., rows + C, n), n even: column j is paired with column n-1-j
    and each pair is rotated so that their first `rows` entries become orthogonal (the rest, the accumulated rotations,
    come along). Then the columns move for the next round (circle method: column 0 stays, the others shift one place
    around), so that n-1 rounds pair every two columns once and bring them back to where they started."""
    h = W.shape[-1] // 2
    top, bot = W[..., :h], W[..., h:].flip(-1)                              # bot[..., j] is top[..., j]'s partner
    a, b = top[..., :rows, :], bot[..., :rows, :]
    g, d = 2 * (a * b).sum(-2), b.square().sum(-2) - a.square().sum(-2)    # (..., h): 2 a.b, |b|^2 - |a|^2
    # t = tan(angle) = g / (d + sign(d) r): the smaller root of g t^2 + 2 d t - g = 0, which zeroes a.b (|t| <= 1,
    # t = 0 if g = 0). The 1e-30 keeps 1 / den finite (a / b is a * (1 / b)); it matters only for pairs of columns so
    # tiny (the matrix is scaled to max |a| = 1) that any rotation of them is as good as the exact one
    r = (d * d + g * g).sqrt() + 1e-30
    t = g / (d + (d >= 0).where(r, -r))
    c = (1 + t * t).rsqrt()
    # a buffer, so both columns of a pair apply the very same rotation: recomputing it per column could round
    # differently, and near convergence (d and g both tiny) that would make the transform far from orthogonal
    cs = c.unsqueeze(-2).cat((c * t).unsqueeze(-2), dim=-2).contiguous()  # (..., 2, h)
    c, s = cs[..., :1, :], cs[..., 1:, :]
    W = (c * top - s * bot).cat((s * top + c * bot).flip(-1), dim=-1)
    n = 2 * h
    return W[..., :1].cat(W[..., n - 1:], W[..., 1:n - 1], dim=-1)


def _jacobi(Y: "Tensor") -> "tuple[Tensor, Tensor]":
    """One-sided Jacobi on the columns of Y (..., C, C): W = Y @ Vj with W's columns orthogonal, Vj orthogonal."""
    T = type(Y)
    cols = Y.shape[-1]
    eye = T.eye(cols, dtype=Y.dtype, device=Y.device).expand(Y.shape)
    if cols == 1: return Y, eye
    W = Y.cat(eye, dim=-2)                                                  # (..., 2C, C): rotate both at once
    n = cols + cols % 2          # an odd count gets a zero column: its g is 0, so no rotation ever touches it
    if n > cols: W = W.pad([(0, 0)] * (W.ndim - 1) + [(0, 1)])
    W = W.contiguous()                                                      # every round runs the same kernels
    for _ in range(_svd_sweeps(cols, Y.dtype)):
        for _ in range(n - 1): W = _jacobi_round(W, cols).realize()
    return W[..., :cols, :cols], W[..., cols:, :cols]


def _orthonormal_columns(V: "Tensor") -> "Tensor":
    """The Q of V's QR with R's diagonal made nonnegative: V itself when V is orthonormal, and orthonormal always
    (zero or nearly dependent columns are replaced by vectors completing the basis)."""
    Q, R = V.qr()
    d = R.diagonal(0, -2, -1)                                               # (..., C)
    return Q * (d < 0).where(-1.0, 1.0).cast(V.dtype).unsqueeze(-2)


def _svd_tall(X: "Tensor", full_matrices: bool) -> "tuple[Tensor, Tensor, Tensor]":
    """X (..., R, C) with R >= C, nonempty: (U, S, V) with X = U @ diag(S) @ V^T, S descending."""
    T = type(X)
    rows, cols = X.shape[-2], X.shape[-1]
    # (..., 1, 1): no overflow or underflow in the squares. At least the smallest normal number, so 1/scale is finite
    scale = X.abs().max((-2, -1), keepdim=True).maximum(2.0 ** -1022 if X.dtype == dtypes.float64 else 2.0 ** -126)
    Q, R = (X / scale).qr()
    W, Vj = _jacobi(R[..., :cols, :].transpose(-2, -1))                     # R^T @ Vj = W
    sigma = W.square().sum(-2).sqrt()                                       # (..., C)
    # sort descending: column j goes to place rank_j = #{i: s_i > s_j, or s_i = s_j and i < j}
    idx = T.arange(cols, device=X.device)
    si, sj = sigma.unsqueeze(-1), sigma.unsqueeze(-2)                       # [i, j]
    before = (si > sj) | ((si == sj) & (idx.reshape(cols, 1) < idx.reshape(1, cols)))
    rank = before.cast(dtypes.int32).sum(-2)                                # (..., C)
    perm = (rank.unsqueeze(-1) == idx).cast(X.dtype)                        # (..., C, C): [j, r] = rank_j == r
    W, Vj = W.matmul(perm), Vj.matmul(perm)                                 # exact: one nonzero term per entry
    S = sigma.unsqueeze(-2).matmul(perm).squeeze(-2)
    U = Q[..., :cols].matmul(Vj)                                            # X = Q R = (Q Vj) diag(S) (W / S)^T
    if full_matrices and rows > cols: U = U.cat(Q[..., cols:], dim=-1)
    V = _orthonormal_columns(W / S.maximum(1e-30).unsqueeze(-2))            # a column with S = 0 is 0: stays 0
    return U, S * scale.reshape(scale.shape[:-1]), V


def _svd_empty(x: "Tensor", full_matrices: bool) -> "tuple[Tensor, Tensor, Tensor]":
    """A zero-size input: like torch, the full factors are identities and everything else is empty."""
    T = type(x)
    batch, (m, n) = x.shape[:-2], x.shape[-2:]
    k = min(m, n)

    def factor(rows: int, cols: int) -> "Tensor":
        if rows == cols: return T.eye(rows, dtype=x.dtype, device=x.device).expand(batch + (rows, rows)).contiguous()
        return T.zeros(batch + (rows, cols), dtype=x.dtype, device=x.device).contiguous()
    U, Vh = (factor(m, m), factor(n, n)) if full_matrices else (factor(m, k), factor(k, n))
    return U, T.zeros(batch + (k,), dtype=x.dtype, device=x.device).contiguous(), Vh


def _svd_attach_grads(A: "Tensor", U: "Tensor", S: "Tensor", Vh: "Tensor") -> "tuple[Tensor, Tensor, Tensor]":
    """Give U, S and Vh (computed from a detached A) the analytic backward. With A = U S V^T (thin, K = min(M, N)) and
    F_ij = 1 / (s_j^2 - s_i^2) (0 on the diagonal), the gradient is linear in the upstream gradients, one term each:
      S:  U diag(gS) V^T
      U:  U (F o (U^T gU - gU^T U)) S V^T + (I - U U^T) gU S^-1 V^T
      V:  U S (F o (V^T gV - gV^T V)) V^T + U S^-1 gV^T (I - V V^T)"""
    k = S.shape[-1]
    Uk, Vk = U[..., :k].detach(), Vh[..., :k, :].transpose(-2, -1).detach()   # (..., M, K), (..., N, K)
    s = S.detach()
    sq = s.square()
    diff = sq.unsqueeze(-2) - sq.unsqueeze(-1)                              # [i, j] = s_j^2 - s_i^2
    eye = type(S).eye(k, dtype=S.dtype, device=S.device)
    F = (eye == 1).where(0.0, 1 / (eye + diff))  # eye + diff: no 1/0 on the diagonal, which is masked anyway

    def skew(m: "Tensor") -> "Tensor": return m - m.transpose(-2, -1)

    def grad_u(g: "Tensor", a: "Tensor") -> "list[Tensor]":
        g = g[..., :k]
        utg = Uk.transpose(-2, -1).matmul(g)
        inner = (F * skew(utg)) * s.unsqueeze(-2)
        return [Uk.matmul(inner).matmul(Vk.transpose(-2, -1)) + ((g - Uk.matmul(utg)) / s.unsqueeze(-2)).matmul(
            Vk.transpose(-2, -1))]

    def grad_s(g: "Tensor", a: "Tensor") -> "list[Tensor]":
        return [(Uk * g.unsqueeze(-2)).matmul(Vk.transpose(-2, -1))]

    def grad_vh(g: "Tensor", a: "Tensor") -> "list[Tensor]":
        gv = g[..., :k, :].transpose(-2, -1)                                 # (..., N, K)
        vtg = Vk.transpose(-2, -1).matmul(gv)
        inner = s.unsqueeze(-1) * (F * skew(vtg))
        return [Uk.matmul(inner).matmul(Vk.transpose(-2, -1)) + Uk.matmul(
            ((gv - Vk.matmul(vtg)) / s.unsqueeze(-2)).transpose(-2, -1))]
    return (custom_grad(U, [A], grad_u, "svd_u"), custom_grad(S, [A], grad_s, "svd_s"),
            custom_grad(Vh, [A], grad_vh, "svd_vh"))
