"""A representative set of kernel ASTs for compile-only and render-only backend tests (CUDA, METAL): elementwise math
of every dtype, casts and bitcasts, NaN-aware max/where, reductions, matmul and conv2d with their gradients, indexing,
softmax, argmax, cumsum, a symbolic (Variable) size. The programs are scheduled (on the default device; an AST doesn't depend on it), never run.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from fusegrad import Tensor, Variable, dtypes
from fusegrad.dtype import DType, PtrDType
from fusegrad.ir.ops import UOp

INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]


def _t(shape: tuple[int, ...], dt: DType, seed: int = 0) -> Tensor:
    rng = np.random.default_rng(seed)
    if dt == dtypes.bool: return Tensor(rng.random(shape) < 0.5)
    if dtypes.is_int(dt): return Tensor(rng.integers(1, 100, size=shape).astype(np.int32)).cast(dt)
    return Tensor(rng.uniform(-2, 2, size=shape).astype(np.float32)).cast(dt)


def _elementwise(dt: DType) -> list[Tensor]:
    x, y = _t((4, 8), dt, 1).realize(), _t((4, 8), dt, 2).realize()
    if dt == dtypes.bool: return [(x & y) | (x ^ y), x.where(y, x)]
    out = [x + y * x, x.maximum(y), (x < y).where(x, y), x != y]
    if dtypes.is_int(dt): out += [x // y, x % y, (x << 2) ^ (y >> 1), x & y | y, -x if not dtypes.is_unsigned(dt) else x]
    else: out += [x / y, (x.exp() + y.log()).sqrt(), x.sin(), x.trunc(), x.sigmoid(), x.tanh()]
    return out


def _casts() -> list[Tensor]:
    out = []
    for src, dst in [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float32, dtypes.float16),
                     (dtypes.float16, dtypes.float32), (dtypes.float32, dtypes.bfloat16), (dtypes.bfloat16, dtypes.float32),
                     (dtypes.float32, dtypes.bool), (dtypes.bool, dtypes.float32), (dtypes.int64, dtypes.float64),
                     (dtypes.float16, dtypes.int8), (dtypes.uint8, dtypes.float16), (dtypes.float32, dtypes.uint64),
                     (dtypes.float64, dtypes.float16), (dtypes.float16, dtypes.float64)]:
        out.append(_t((16,), src).realize().cast(dst))
    for src, dst in [(dtypes.float32, dtypes.int32), (dtypes.uint32, dtypes.float32), (dtypes.float16, dtypes.int16),
                     (dtypes.int16, dtypes.float16), (dtypes.float64, dtypes.int64), (dtypes.bfloat16, dtypes.uint16),
                     (dtypes.int8, dtypes.uint8)]:
        out.append(_t((16,), src).realize().bitcast(dst) + 1)
    return out


def _nan_inf() -> list[Tensor]:
    x = Tensor([1.0, float("nan"), -float("inf"), 2.0]).realize()
    return [x.maximum(float("nan")), x.maximum(0.5), (x > 0).where(x, float("inf")), x.max(),
            (x != x).where(-1.0, x)]  # noqa: PLR0124 - the NaN test


def _reductions() -> list[Tensor]:
    x = _t((6, 10), dtypes.float32).realize()
    i = _t((6, 10), dtypes.int32).realize()
    return [x.sum(), x.sum(1), x.max(0), x.mean(1), x.std(), i.sum(0), i.max(), x.cast(dtypes.float16).sum(1),
            x.softmax(1), x.log_softmax(0), x.argmax(1), x.cumsum(1), i.cumsum(0)]


def _matmul_conv() -> list[Tensor]:
    a = _t((8, 12), dtypes.float32, 1).realize().requires_grad_()
    b = _t((12, 6), dtypes.float32, 2).realize().requires_grad_()
    loss = (a @ b).relu().sum()
    loss.backward()
    x = _t((2, 3, 8, 8), dtypes.float32, 3).realize().requires_grad_()
    w = _t((4, 3, 3, 3), dtypes.float32, 4).realize().requires_grad_()
    conv = x.conv2d(w, padding=1)
    conv.square().mean().backward()
    assert a.grad is not None and b.grad is not None and x.grad is not None and w.grad is not None
    half = _t((8, 12), dtypes.float16, 5).realize() @ _t((12, 4), dtypes.float16, 6).realize()
    return [loss, a.grad, b.grad, conv, x.grad, w.grad, half]


def _indexing() -> list[Tensor]:
    x = _t((5, 7), dtypes.float32).realize()
    idx = Tensor([4, 0, 2]).realize()
    return [x[idx], x[1:4, ::2] * 2, x.pad(((1, 1), (2, 0))) + 1, x.gather(1, Tensor([[0, 6]] * 5).realize()),
            x.T.contiguous(), x.reshape(7, 5).flip(0) + 0]


def _symbolic() -> list[Tensor]:
    x, n = _t((6, 4), dtypes.float32).realize(), Variable("n", 1, 6).bind(4)
    return [x[:n] * 2 + 1, x[:n].sum(0)]  # the variable is an int kernel argument


PROGRAMS: dict[str, Callable[[], list[Tensor]]] = {
    **{f"elementwise {dt}": functools.partial(_elementwise, dt) for dt in [dtypes.bool] + INTS + FLOATS},
    "casts and bitcasts": _casts, "nan and inf": _nan_inf, "reductions": _reductions,
    "matmul and conv2d, with gradients": _matmul_conv, "indexing": _indexing, "symbolic shapes": _symbolic,
}


def uses_dtype(ast: UOp, dt: DType) -> bool:
    return any(n.dtype == dt or (isinstance(n.dtype, PtrDType) and n.dtype.base == dt) for n in ast.toposort())


@functools.cache
def kernel_asts() -> list[tuple[str, UOp]]:
    """(program name, kernel AST) for every distinct kernel the programs schedule; copies are left out."""
    seen: dict[UOp, str] = {}
    for label, build in PROGRAMS.items():
        outs = build()
        for si in outs[0].schedule(*outs[1:]):
            if not si.is_copy and si.ast not in seen: seen[si.ast] = label
    return [(label, ast) for ast, label in seen.items()]
