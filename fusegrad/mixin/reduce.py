"""Reductions built on the three primitive reduces (sum, max, prod): statistics, softmax family, arg-reductions,
scans (cumsum etc., as reductions over sliding windows) and sorting (by rank counting, which fuses into kernels).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence, TYPE_CHECKING

from fusegrad.codegen.opt import skinny_bytes
from fusegrad.device import Device
from fusegrad.dtype import ConstType, DTypeLike, dtypes, least_upper_dtype, sum_acc_dtype, to_dtype
from fusegrad.helpers import ShapeError, prod
from fusegrad.ir import build
from fusegrad.ir.ops import GroupOp, OpMixin, Ops, UOp, ssimplify
from fusegrad.ir.shape import all_static, sprod, ssub
from fusegrad.mixin.alu import on_nodes

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

Axis = "int | Sequence[int] | None"


def _fma_hazard(u: UOp, limit: int = 4096) -> bool:
    """Whether the float expression `u` (up to stored buffers) has a multiply feeding an add. Reduce kernels compile
    with fused multiply-add contraction and elementwise kernels without, so such an expression recomputed in both can
    round differently: max's gradient, which finds the maximal elements by comparing the input with the result
    (`x == max`), would then find none of them (a 0/0 share). Its input is stored first when this can happen."""
    seen, stack = {u}, [u]
    while stack:
        x = stack.pop()
        if x.op in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.CONST, Ops.DEVICE): continue
        if x.op is Ops.MULACC: return True
        if x.op is Ops.ADD and dtypes.is_float(x.dtype) and any(s.op is Ops.MUL for s in x.src): return True
        if len(seen) > limit: return True   # too big to tell: store it
        for s in x.src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False


def merges_permuted(u: UOp) -> bool:
    """u is a reshape of a permute whose last axis merges several axes of the permute's output that aren't adjacent
    in the permute's source, in order (so a matmul's reduce over it would stride through memory)."""
    if u.op is not Ops.RESHAPE or u.src[0].op is not Ops.PERMUTE: return False
    p, shape = u.src[0], u.shape
    ps = p.shape
    if shape is None or ps is None or not shape or not all_static(shape) or not all_static(ps): return False
    # the trailing axes of the permute's output that the reshape merges into the last axis
    k, n, i = shape[-1], 1, len(ps)
    while i > 0 and n < k:
        i -= 1
        n *= ps[i]
    if n != k: return False
    merged = [a for a in range(i, len(ps)) if ps[a] != 1]
    order = [p.arg[a] for a in merged]
    if len(merged) < 2: return False
    # in memory order when they are consecutive among the source's axes of size > 1 (an axis of size 1 between two
    # of them, a decode step's T in (B, H, T, D) read as (B, T, H * D), moves nothing)
    src = [a for a, n in enumerate(p.src[0].shape) if n != 1]   # (order's axes are among them: same sizes)
    at = src.index(order[0])
    return order != src[at:at + len(order)]


def _panel_dot_nodes(x: "Tensor", wp: "Tensor") -> "Tensor":
    """x (..., K) times float32 column panels wp (N / width, K, width) -> (..., N): `dot`'s panel product built on
    graph nodes (the same nodes as (x.reshape(..., 1, K, 1) * wp).sum(-2).reshape(..., N), at half the Python cost;
    nothing to detach: no gradient flows into wp, and x needs none under no_grad)."""
    lead, (p, k, width) = x.shape[:-1], wp.shape
    full = lead + (p, k, width)
    ones = (1,) * len(lead)
    mul = build.alu(Ops.MUL, build.expand(build.reshape(x.uop, lead + (1, k, 1)), full),
                    build.expand(build.reshape(wp.uop, ones + (p, k, width)), full))
    red = build.reduce_axis(mul, Ops.ADD, (len(lead) + 1,))
    return type(x)._wrap(red, x, wp)._view_apply(lambda u: build.reshape(u, lead + (p * width,)))


def _dot_nodes(x: "Tensor", w: "Tensor") -> "Tensor":
    """The general branch of `dot` (w with 2+ dims, no dtype=) built on graph nodes: the same nodes, with a Tensor for
    the reduce and one for its reshaped view rather than one per step (a third of an eager MiniLM call's graph
    building). Shapes are static and nothing needs detaching (not no_grad with a tensor that requires grad)."""
    k = x.shape[-1]
    xu = build.reshape(x.uop, (1, k)) if x.ndim == 1 else x.uop
    xr = build.reshape(xu, xu.shape[:-1] + (1, k))                                        # (..., n, 1, k)
    order = list(range(w.ndim))
    order[-1], order[-2] = order[-2], order[-1]
    wr = build.reshape(build.permute(w.uop, order), w.shape[:-2] + (1, w.shape[-1], k))  # (..., 1, m, k)
    dt = least_upper_dtype(x.dtype, w.dtype)   # the multiply's promotion and broadcast (never float -> int)
    xr, wr = build.cast(xr, dt), build.cast(wr, dt)
    nd = max(len(xr.shape), len(wr.shape))
    xs, ws = (1,) * (nd - len(xr.shape)) + xr.shape, (1,) * (nd - len(wr.shape)) + wr.shape
    full = tuple(b if a == 1 else a for a, b in zip(xs, ws))
    mul = build.alu(Ops.MUL, build.expand(build.reshape(xr, xs), full), build.expand(build.reshape(wr, ws), full))
    red = build.reduce_axis(build.cast(mul, sum_acc_dtype(dt)), Ops.ADD, (nd - 1,))   # sum(-1)
    T = type(x)
    out = T._wrap(red, x, w)._view_apply(lambda u: build.reshape(u, full[:-1]))   # a view of the reduce, as sum() makes
    if dtypes.is_float(dt): out = out.cast(dt)
    if x.ndim == 1: out = out.squeeze(-2)
    return out.cast(dt)


TRANSPOSED_WEIGHT_ROWS = 64   # x @ b.T copies b.T row-major from this many rows of x (see dot)
TRANSPOSED_WEIGHT_ROWS_NO_GRAD = 16   # ... and from this many when no gradient flows into a b of at least
TRANSPOSED_WEIGHT_MIN_ELEMENTS = 1 << 14   # this many elements (inference: the copy is made once per weight)
PANEL = 32                     # a large CPU weight is read as (N / width, K, width) column panels (see dot): width
PANEL_VECTORS = 2              # ... is PANEL_VECTORS of the target's vectors (32 floats with AVX-512, 16 with AVX2),
                               # or PANEL without vectors (see panel_columns)
PANEL_MIN_ELEMENTS = 1 << 20   # ... when it has at least this many elements (4 MB of float32: past the L2 cache)


def panel_columns(device: str) -> int:
    """The columns of a large weight's panels on this device: PANEL_VECTORS vectors, the register tile's columns
    (codegen/opt.py `register_tile`: 6 x 2 or 4 x 2 vectors on AVX2, 8 x 2 on AVX-512), so that a tile's reduce reads
    its panel as one sequential stream. (Panels of 32 floats on AVX2 had the 16-float tile read every other 64-byte
    line, rows 128 bytes apart: one core, 2048 matmul, 6% slower.) PANEL where the device has no vectors."""
    lanes = _vector_and_cache(device)[0]
    return PANEL_VECTORS * lanes if lanes >= 4 else PANEL


def _panel_width(x: "Tensor", w: "Tensor", no_grad_into_w: bool) -> int:
    """The width of the column panels `dot` reads the 2-D weight w as, (N / width, K, width) contiguous; 0: w as it is.
    A realized float32 CPU weight with no gradient flowing into it (see `dot`):
    - `panel_columns` with at least TRANSPOSED_WEIGHT_ROWS rows of x and PANEL_MIN_ELEMENTS elements of w (a BLAS's
      packing: each panel's rows are that many floats apart, not N);
    - one vector of the target (16 float32 lanes on AVX-512, 8 on AVX2) with TRANSPOSED_WEIGHT_ROWS_NO_GRAD up to
      TRANSPOSED_WEIGHT_ROWS rows of x and a w larger than a quarter of the L2 (codegen/opt.py `skinny_bytes`): a
      skinny product streams all of w for every block of rows, and a row-major w's column of vectors is N floats
      apart on every reduce step, a new 4 KB page each time, which the hardware prefetchers don't follow: MiniLM
      2x13's 384 x 1536 FFN weights, read from memory in the model, ran at a third of their speed in cache. One
      vector per panel row makes the reduce read w as one sequential stream per panel (codegen/opt.py's skinny tile:
      13 rows x 1 vector)."""
    if not (w.ndim == 2 and x.ndim >= 2 and no_grad_into_w and all_static(x.shape) and all_static(w.shape) and
            w.dtype == x.dtype == dtypes.float32 and isinstance(dev := w.device, str) and dev == x.device and
            dev.split(":")[0] == "CPU"):
        return 0
    rows, (k, n) = prod(x.shape[:-1]), w.shape
    if rows >= TRANSPOSED_WEIGHT_ROWS:
        cols = panel_columns(dev)
        width = cols if n >= 8 * cols and k * n >= PANEL_MIN_ELEMENTS else 0
    elif rows >= TRANSPOSED_WEIGHT_ROWS_NO_GRAD:
        lanes, cache = _vector_and_cache(dev)
        width = lanes if lanes >= 4 and n >= 8 * lanes and k * n * 4 > skinny_bytes(cache) > 0 else 0
    else: return 0
    return width if width and n % width == 0 and _is_buffer_view(w.uop) else 0


@functools.cache
def _vector_and_cache(device: str) -> tuple[int, int]:
    """(float32 lanes of the device's vectors, its per-core cache bytes): its renderer's machine description."""
    renderer = Device[device].renderer
    return renderer.simd_bytes // 4, renderer.cache_bytes


def _is_transpose(u: UOp) -> bool:
    """u swaps the last two axes of its source and nothing else (b.T, b.transpose(-1, -2))."""
    n = len(u.arg) if u.op is Ops.PERMUTE else 0
    return n >= 2 and u.arg == tuple(range(n - 2)) + (n - 1, n - 2)


def _is_buffer_view(u: UOp) -> bool:
    while u.op in GroupOp.Movement or (u.op is Ops.DETACH and u.arg is None): u = u.src[0]
    return u.op is Ops.BUFFER


def _softmax_on_nodes(x: "Tensor", dtype: DTypeLike | None) -> bool:
    """Whether softmax of x may run on its node: no cast to another dtype first (a half softmax sums in float32), and
    no input that max() would store first for its gradient (`_fma_hazard`)."""
    return (dtype is None or to_dtype(dtype) == x.dtype) and not (x.requires_grad and _fma_hazard(x.uop))


class ReduceMixin:
    __slots__ = ()

    # ----- reductions -----
    def _reduce(self: "Tensor", op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> "Tensor":
        axes = tuple(range(self.ndim)) if axis is None else \
            tuple(self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis))
        _no_repeated_axes(axes)
        if self.ndim == 0: axes = ()
        if op is Ops.MAX and axis is None and self.numel() == 0:
            raise RuntimeError(f"max/min of an empty tensor (shape {self.shape}) needs an explicit axis")
        if op is Ops.MAX and any(self.shape[a] == 0 for a in axes):
            raise IndexError(f"max/min: Expected reduction dims {axes} to have non-zero size, shape {self.shape}")
        x = self
        if any(self.shape[a] == 0 for a in axes):  # reducing nothing: pad with the identity (keeps the graph link)
            ident = 0 if op is Ops.ADD else 1
            x = x.pad([(0, 1) if i in axes and s == 0 else (0, 0) for i, s in enumerate(self.shape)], value=ident)
        # reducing nothing still gives a new tensor (not a view of self: a later write to self doesn't change it)
        if any(x.shape[a] != 1 for a in axes): out = x._apply(lambda u: build.reduce_axis(u, op, axes))
        # a sum starts from +0.0 (torch's too), so a sum of one -0.0 is +0.0: x + 0.0, which codegen doesn't fold
        elif op is Ops.ADD and dtypes.is_float(x.dtype): out = x + 0.0
        else: out = type(self)._wrap(x.uop, x)
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self: "Tensor", axis: int | Sequence[int] | None = None, keepdim: bool = False,
            dtype: DTypeLike | None = None) -> "Tensor":
        x = self.cast(to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype))
        out = x._reduce(Ops.ADD, axis, keepdim)
        # half/bfloat16 accumulate in float32 but return their own dtype, like torch
        return out.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) else out

    def max(self: "Tensor", axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        if dtypes.is_bool(self.dtype): return self.cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
        return self._exact_for_max_grad()._reduce(Ops.MAX, axis, keepdim)

    def _exact_for_max_grad(self: "Tensor") -> "Tensor":
        """self, stored first when max's gradient will compare it with the max and a recomputation could round
        differently (see `_fma_hazard`)."""
        if self.requires_grad and not type(self).no_grad and dtypes.is_float(self.dtype) and _fma_hazard(self.uop):
            return self.contiguous()
        return self

    def min(self: "Tensor", axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        if dtypes.is_bool(self.dtype): return self.logical_not().max(axis, keepdim).logical_not()
        # ints: ~x = -x-1 reverses the order without overflowing (-x does at the most negative value)
        if dtypes.is_int(self.dtype): return ~((~self).max(axis, keepdim))
        return -((-self).max(axis, keepdim))

    def mean(self: "Tensor", axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        x = self._float_or_self()
        s = x.sum(axis, keepdim, dtype=sum_acc_dtype(x.dtype))   # divide before rounding back to half
        if not all_static(self.shape):   # a symbolic count: divide by a tensor of its value (the kernel reads it)
            per = sprod(s.shape)
            cnt = ssimplify(sprod(self.shape) // (max(per, 1) if isinstance(per, int) else per))
            div = cnt.arg if cnt.op is Ops.CONST else type(self)._wrap(build.const(cnt, s.dtype, s.device))
            return (s / div).cast(x.dtype)
        n = prod(self.shape) // max(prod(s.shape), 1) if self.numel() else 0
        return (s * (1 / n if n else math.nan)).cast(x.dtype)

    # ----- matmul -----
    def dot(self: "Tensor", w: "Tensor", dtype: DTypeLike | None = None) -> "Tensor":
        """Matrix product with broadcasting over batch dims, as a broadcast multiply and a sum (one kernel)."""
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise RuntimeError(f"both arguments to matmul need at least 1 dimension, got {x.shape} and {w.shape}")
        k_x, k_w = x.shape[-1], w.shape[-min(w.ndim, 2)]
        if k_x != k_w:
            xs = "x".join(map(str, x.shape))
            ws = "x".join(map(str, w.shape))
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({xs} and {ws})")
        bx, bw = x.shape[:-2], w.shape[:-2]
        if any(a != b and a != 1 and b != 1 for a, b in zip(bx[::-1], bw[::-1])):
            raise RuntimeError(f"matmul: batch dims can't broadcast for shapes {x.shape} and {w.shape}")
        # an operand whose reduce axis merges axes that a permute separated in memory (`a.transpose(1, 2).reshape(B,
        # T, H)`: heads back into the hidden axis) would be read with div/mod index math and strides inside the reduce
        # loop; a contiguous copy costs one pass (usually none: the copy is the store of the kernel computing `a`)
        if merges_permuted(x.uop): x = x.contiguous()
        # `x @ b.T` (a Linear layer's weight, stored (out, in)) reads b along its rows in the reduce: the kernel then
        # forms dot products (vectorized along k, lanes summed per output), 2-3x slower on the CPU than the outer-
        # product form a row-major w gives (vectorized along the output columns, a register tile of accumulators).
        # With enough rows to amortize it, a realized b is copied to row-major first: a relayout that storage.py keeps
        # until b is written, so eager calls make it once per weight version (a computed b is left alone: its copy
        # would be a kernel of its own on every call, as in X @ X.T).
        # A large realized float32 weight on the CPU is read as column panels, (N / P, K, P) contiguous (P: two vectors,
        # panel_columns), as a BLAS packs it: the reduce then streams one panel (rows P floats apart) instead of rows N
        # apart, which at N = 2048 hit the same few L1 sets on every step (2048 matmul 72 -> 35 ms). The panel copy is
        # a relayout (kept while the weight is unwritten); it's made only where no gradient flows into the weight.
        no_grad_into_w = type(w).no_grad or not w.requires_grad
        if (pw := _panel_width(x, w, no_grad_into_w)):
            k, n, lead = w.shape[0], w.shape[1], x.shape[:-1]
            wp = w.reshape(k, n // pw, pw).permute(1, 0, 2).contiguous()
            if dtype is None and not (type(x).no_grad and x.requires_grad): return _panel_dot_nodes(x, wp)
            out = (x.reshape(*lead, 1, k, 1) * wp).sum(-2, dtype=dtype).reshape(*lead, n)
            return out.cast(least_upper_dtype(x.dtype, w.dtype)) if dtype is None else out
        if _is_transpose(w.uop) and _is_buffer_view(w.uop.src[0]) and not _is_transpose(x.uop) and x.ndim >= 2 and \
                all_static(x.shape) and all_static(w.shape[-2:]) and min(w.shape[-2:]) > 1 and \
                prod(x.shape[:-1]) >= (TRANSPOSED_WEIGHT_ROWS_NO_GRAD if no_grad_into_w and prod(w.shape[-2:]) >=
                                       TRANSPOSED_WEIGHT_MIN_ELEMENTS else TRANSPOSED_WEIGHT_ROWS):
            w = w.contiguous()   # (min > 1: a vector's .T is only a reshape)
        out_dt = least_upper_dtype(x.dtype, w.dtype) if dtype is None else to_dtype(dtype)
        if out_dt in (dtypes.float16, dtypes.bfloat16):
            # 16-bit floats: exact float32 products and a float32 sum, rounded once at the end (torch's and a GEMM's
            # accumulation); products rounded to half first were off by an ulp in ~0.2% of a 256x256 matmul
            x, w = x.cast(dtypes.float32), w.cast(dtypes.float32)
            return x.dot(w, dtype=dtypes.float32).cast(out_dt)
        if w.ndim >= 2 and dtype is None and k_x and all_static(x.shape) and all_static(w.shape) and \
                not (type(x).no_grad and (x.requires_grad or w.requires_grad)):
            return _dot_nodes(x, w)
        if w.ndim == 1:
            out = (x * w).sum(-1, dtype=dtype)                                       # (...,)
        else:
            xx = x.reshape(1, k_x) if x.ndim == 1 else x
            xr = xx.reshape(xx.shape[:-1] + (1, k_x))                                # (..., n, 1, k)
            wr = w.transpose(-1, -2).reshape(w.shape[:-2] + (1, w.shape[-1], k_x))   # (..., 1, m, k)
            out = (xr * wr).sum(-1, dtype=dtype)                                     # (..., n, m)
            if x.ndim == 1: out = out.squeeze(-2)
        return out.cast(least_upper_dtype(x.dtype, w.dtype)) if dtype is None else out

    def matmul(self: "Tensor", x: "Tensor", reverse: bool = False, dtype: DTypeLike | None = None) -> "Tensor":
        return x.dot(self, dtype) if reverse else self.dot(x, dtype)

    def _axes(self: "Tensor", axis: Any) -> tuple[int, ...]:
        if axis is None: return tuple(range(self.ndim))
        axes = tuple(self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis))
        _no_repeated_axes(axes)
        return axes

    def prod(self: "Tensor", axis: Any = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> "Tensor":
        x = self.cast(to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype))
        out = x._reduce(Ops.MUL, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) else out

    def any(self: "Tensor", axis: Any = None, keepdim: bool = False) -> "Tensor":
        return self.bool().max(axis, keepdim) if self.numel() else self.bool().sum(axis, keepdim) != 0

    def all(self: "Tensor", axis: Any = None, keepdim: bool = False) -> "Tensor":
        return self.logical_not().any(axis, keepdim).logical_not()

    def isclose(self: "Tensor", other: "Tensor | ConstType", rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> "Tensor":
        """|self - other| <= atol + rtol * |other| elementwise (equal infinities are close); `other` may be a number.

        ```python
        Tensor([1.0, 1.1]).isclose(1.0).tolist()   # [True, False]
        ```
        """
        a, b = self._broadcasted(other)
        diff = (a - b).abs()   # an infinite difference is never close (even though rtol * inf is inf)
        close = (a == b) | (diff.isfinite() & (diff <= atol + rtol * b.abs()))
        return (close | (a.isnan() & b.isnan())) if equal_nan else close

    def allclose(self: "Tensor", other: "Tensor | ConstType", rtol: float = 1e-05, atol: float = 1e-08,
                 equal_nan: bool = False) -> bool:
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def var(self: "Tensor", axis: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        x = self._float_or_self()
        if x.dtype in (dtypes.float16, dtypes.bfloat16):
            # 16-bit floats: the whole computation in float32, like torch's accumulation. In half the count itself
            # (70000 > 65504) became inf and the variance 0
            return x.cast(dtypes.float32).var(axis, keepdim, correction).cast(x.dtype)
        axes = self._axes(axis)
        n = sprod([self.shape[a] for a in axes])
        sq = (x - x.mean(axes, keepdim=True)).square().sum(axes, keepdim=keepdim)
        if not isinstance(n, int):   # a symbolic count (n - correction == 0 gives 0/0 = nan, as below)
            return sq / ssub(n, correction)
        return sq / max(n - correction, 0) if n - correction > 0 else sq * math.nan

    def std(self: "Tensor", axis: Any = None, keepdim: bool = False, correction: int = 1) -> "Tensor":
        """sqrt(var); where the variance is 0 the gradient is 0 (torch), not the NaN of sqrt'(0) * 0."""
        v = self.var(axis, keepdim, correction)
        zero = v == 0
        return zero.where(0.0, zero.where(1.0, v).sqrt())

    def var_mean(self: "Tensor", axis: Any = None, keepdim: bool = False, correction: int = 1) -> "tuple[Tensor, Tensor]":
        return self.var(axis, keepdim, correction), self.mean(axis, keepdim)

    def std_mean(self: "Tensor", axis: Any = None, keepdim: bool = False, correction: int = 1) -> "tuple[Tensor, Tensor]":
        return self.std(axis, keepdim, correction), self.mean(axis, keepdim)

    # ----- softmax family -----
    def softmax(self: "Tensor", axis: int = -1, dtype: DTypeLike | None = None) -> "Tensor":
        if _softmax_on_nodes(self, dtype): return on_nodes(self, OpMixin._softmax, axis, dtype)
        return OpMixin._softmax(self, axis, dtype)

    def softmin(self: "Tensor", axis: int = -1, dtype: DTypeLike | None = None) -> "Tensor":
        return (-self).softmax(axis, dtype)

    def log_softmax(self: "Tensor", axis: int = -1, dtype: DTypeLike | None = None) -> "Tensor":
        if _softmax_on_nodes(self, dtype): return on_nodes(self, OpMixin._log_softmax, axis, dtype)
        return OpMixin._log_softmax(self, axis, dtype)

    def logsumexp(self: "Tensor", axis: Any = None, keepdim: bool = False) -> "Tensor":
        x = self._float_or_self()
        m = x.max(axis=axis, keepdim=True).detach()
        m = m.isinf().where(0, m)  # all -inf stays -inf instead of NaN
        out = (x - m).exp().sum(axis=axis, keepdim=True).log() + m
        return out if keepdim else out.squeeze_axes(self._axes(axis))

    def squeeze_axes(self: "Tensor", axes: Sequence[int]) -> "Tensor":
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    # ----- arg reductions -----
    def argmax(self: "Tensor", axis: int | None = None, keepdim: bool = False) -> "Tensor":
        """Index of the first maximal element (the first NaN if there is one, like torch)."""
        return self._arg_extreme(axis, keepdim, largest=True)

    def argmin(self: "Tensor", axis: int | None = None, keepdim: bool = False) -> "Tensor":
        """Index of the first minimal element (the first NaN if there is one, like torch)."""
        return self._arg_extreme(axis, keepdim, largest=False)

    def _arg_extreme(self: "Tensor", axis: int | None, keepdim: bool, largest: bool) -> "Tensor":
        if axis is None:
            flat = self.flatten()._arg_extreme(0, False, largest)
            return flat.reshape((1,) * self.ndim if keepdim else ())
        ax = self._axis(axis)
        n = self.shape[ax]
        if n == 0: raise IndexError(f"{'argmax' if largest else 'argmin'} of an empty dimension")
        Tensor = type(self)
        ext = self.max(ax, keepdim=True) if largest else self.min(ax, keepdim=True)
        hit = self == ext
        if dtypes.is_float(self.dtype): hit = ext.isnan().where(self.isnan(), hit)   # max/min propagate NaN
        rev = Tensor.arange(n, 0, -1, device=self.device).reshape((n,) + (1,) * (self.ndim - ax - 1))
        idx = n - hit.where(rev, 0).max(ax, keepdim=keepdim)                          # the first hit has the largest rev
        return idx.cast(dtypes.int32)

    # ----- scans: reductions over windows that end at each position -----
    def _scan(self: "Tensor", axis: int, op: str) -> "Tensor":
        ax = self._axis(axis)
        if self.ndim == 0: return self.reshape(1)._scan(0, op).reshape(())   # a 0-d scan is the element itself
        n = self.shape[ax]
        if n == 0: return self
        x = self.transpose(ax, -1) if ax != self.ndim - 1 else self
        low = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
        fill = {"sum": 0, "prod": 1, "max": low, "logsumexp": -math.inf}[op]
        w = x.pad([(0, 0)] * (x.ndim - 1) + [(n - 1, 0)], value=fill)._pool((n,))   # (..., n, n)
        out = {"sum": lambda t: t.sum(-1), "prod": lambda t: t.prod(-1), "max": _window_max,
               "logsumexp": lambda t: t.logsumexp(-1)}[op](w)
        return out.transpose(ax, -1) if ax != self.ndim - 1 else out

    def cumsum(self: "Tensor", axis: int = 0) -> "Tensor": return self._scan(axis, "sum")
    def cumprod(self: "Tensor", axis: int) -> "Tensor": return self._scan(axis, "prod")
    def cummax(self: "Tensor", axis: int = 0) -> tuple["Tensor", "Tensor"]:
        """Running max along `axis` and where it was found, `(values, indices)` like torch and tinygrad. On ties (and
        NaN, which propagates) the index is the latest one, as in torch; indices are int32 (torch: int64).

        ```python
        v, i = Tensor([1, 3, 2, 3]).cummax(0)   # v: [1, 3, 3, 3], i: [0, 1, 1, 3]
        ```
        """
        return self._scan(axis, "max"), self._scan_index(axis)

    def cummin(self: "Tensor", axis: int = 0) -> tuple["Tensor", "Tensor"]:
        """Running min along `axis` and where it was found, `(values, indices)`; see `cummax`.

        ```python
        v, i = Tensor([3, 1, 2, 1]).cummin(0)   # v: [3, 1, 1, 1], i: [0, 1, 1, 3]
        ```
        """
        # ints: ~x reverses the order without overflow (see Tensor.min)
        inv = ~self if not dtypes.is_float(self.dtype) else -self
        v = inv._scan(axis, "max")
        return (~v if not dtypes.is_float(self.dtype) else -v), inv._scan_index(axis)

    def _scan_index(self: "Tensor", axis: int) -> "Tensor":
        """For each position along `axis`, the index of the latest maximal element up to it (see `_window_max`)."""
        Tensor = type(self)
        ax = self._axis(axis)
        if self.ndim == 0 or self.shape[ax] == 0: return self.zeros_like(dtype=dtypes.int32)
        n = self.shape[ax]
        x = self.detach().transpose(ax, -1) if ax != self.ndim - 1 else self.detach()
        low = -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype)
        w = x.pad([(0, 0)] * (x.ndim - 1) + [(n - 1, 0)], value=low)._pool((n,))   # (..., i, k): x[i - (n-1) + k]
        m = w.max(-1, keepdim=True)
        hit = w == m
        if dtypes.is_float(w.dtype): hit = m.isnan().where(w.isnan(), hit)
        pos = Tensor.arange(n, device=self.device)
        # the padding sits left of every real element, so the latest hit is always a real one
        last = hit.where(pos, -1).max(-1) + Tensor.arange(n, device=self.device) - (n - 1)
        last = last.cast(dtypes.int32)
        return last.transpose(ax, -1) if ax != self.ndim - 1 else last

    def logcumsumexp(self: "Tensor", axis: int = 0) -> "Tensor":
        """log(cumsum(exp(x))), each prefix shifted by its own max, so no term underflows against a later one."""
        return self._float_or_self()._scan(axis, "logsumexp")

    # ----- sorting: each element's rank counts the elements before it in order -----
    def _ranks(self: "Tensor", dim: int, descending: bool) -> "Tensor":
        Tensor = type(self)
        ax = self._axis(dim)
        n = self.shape[ax]
        x = self.transpose(ax, -1) if ax != self.ndim - 1 else self
        a, b = x.unsqueeze(-1), x.unsqueeze(-2)                       # a: element i, b: element j
        before = (b > a) if descending else (b < a)
        if dtypes.is_float(x.dtype):  # NaN sorts last ascending, first descending (torch)
            before = (before & b.isnan().logical_not()) | (a.isnan() & b.isnan().logical_not()) if not descending \
                else (before | (b.isnan() & a.isnan().logical_not()))
        idx = Tensor.arange(n, device=self.device)
        tie = (b == a) | (a.isnan() & b.isnan()) if dtypes.is_float(x.dtype) else (b == a)
        earlier = idx.reshape(n, 1) > idx.reshape(1, n)                 # j < i
        return (before | (tie & earlier)).cast(dtypes.int32).sum(-1)   # (..., n): rank of element i

    def sort(self: "Tensor", dim: int = -1, descending: bool = False) -> "tuple[Tensor, Tensor]":
        """(values, indices), stable. O(n^2) work per row, no data-dependent control flow."""
        Tensor = type(self)
        ax = self._axis(dim)
        if self.ndim == 0: return self.reshape(()), Tensor.zeros((), dtype=dtypes.int32, device=self.device)
        n = self.shape[ax]
        x = self.transpose(ax, -1) if ax != self.ndim - 1 else self
        rank = x._ranks(-1, descending)
        onehot = rank.unsqueeze(-2) == Tensor.arange(n, device=self.device).reshape(n, 1)   # [k, i]: rank_i == k
        vals = onehot.where(x.unsqueeze(-2), 0).sum(-1).cast(x.dtype) if not dtypes.is_float(x.dtype) else \
            onehot.where(x.unsqueeze(-2), 0.0).sum(-1)
        if dtypes.is_float(x.dtype):  # NaN * 0 poisons a plain sum: pick NaN where the chosen element is NaN
            has_nan = (onehot & x.unsqueeze(-2).isnan()).any(-1)
            vals = has_nan.where(math.nan, onehot.where(x.unsqueeze(-2).isnan().where(0, x.unsqueeze(-2)), 0).sum(-1))
        idxs = onehot.where(Tensor.arange(n, device=self.device), 0).sum(-1).cast(dtypes.int32)
        if ax != self.ndim - 1: vals, idxs = vals.transpose(ax, -1), idxs.transpose(ax, -1)
        return vals, idxs

    def argsort(self: "Tensor", dim: int = -1, descending: bool = False) -> "Tensor":
        return self.sort(dim, descending)[1]

    def topk(self: "Tensor", k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> "tuple[Tensor, Tensor]":
        ax = self._axis(dim)
        if self.ndim == 0:   # like torch, k=0 and k=1 both return the element
            if k not in (0, 1): raise RuntimeError(f"selected index k={k} out of range for a 0-d tensor")
            return self.sort(ax)
        if not 0 <= k <= self.shape[ax]:   # ShapeError: torch's RuntimeError and tinygrad's ValueError
            raise ShapeError(f"selected index k={k} out of range for size {self.shape[ax]}")
        v, i = self.sort(ax, descending=largest)
        sl = [(0, s) for s in self.shape]
        sl[ax] = (0, k)
        return v.shrink(sl), i.shrink(sl)


def _window_max(w: "Tensor") -> "Tensor":
    """Max over the last axis, read off the latest maximal element (the latest NaN, if any): so the gradient goes to
    that one element, as torch's cummax routes it, not split over ties."""
    Tensor = type(w)
    m = w.max(-1, keepdim=True)
    hit = w == m
    if dtypes.is_float(w.dtype): hit = m.isnan().where(w.isnan(), hit)
    n = w.shape[-1]
    pos = Tensor.arange(n, device=w.device)
    last = hit.where(pos, -1).max(-1, keepdim=True)
    return (pos == last).where(w, 0).sum(-1, dtype=w.dtype)


def _no_repeated_axes(axes: tuple[int, ...]) -> None:
    """Reducing over the same axis twice is an error in torch; silently reducing it once gave a wrong sum."""
    for i, a in enumerate(axes):
        if a in axes[:i]: raise RuntimeError(f"dim {a} appears multiple times in the list of dims")
