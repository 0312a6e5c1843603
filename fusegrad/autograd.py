"""Autograd: one table of local derivatives on the tensor-level IR, and the reverse walk that applies it.

`pm_gradient` maps a node `ret` and the gradient flowing into it (`ctx`) to one gradient per source (None where a source
gets no gradient). Everything the Tensor frontend builds is made of these few ops, so this table is all of autograd.
`custom_grad` gives a Tensor computation a backward of its own (a DETACH node carrying a `GradFn`).
"""
from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any, Callable

from fusegrad import storage
from fusegrad.dtype import dtypes
from fusegrad.ir import build
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import PatternMatcher, UPat
from fusegrad.sharding import multi_grad

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


def _c(like: UOp, val: float) -> UOp:
    assert like.shape is not None and like.device is not None
    return build.const(val, like.dtype, like.device, like.shape)


def _zeros(like: UOp, shape: tuple[int, ...]) -> UOp:
    assert like.device is not None
    return build.const(0, like.dtype, like.device, shape)


def _mul(a: UOp, b: UOp) -> UOp: return build.alu(Ops.MUL, a, b)
def _add(a: UOp, b: UOp) -> UOp: return build.alu(Ops.ADD, a, b)


def _not(x: UOp) -> UOp:
    assert x.shape is not None and x.device is not None
    return build.alu(Ops.CMPNE, x, build.const(True, dtypes.bool, x.device, x.shape))


def _max_grad(ret: UOp, ctx: UOp) -> tuple[UOp, UOp]:
    # ties split the gradient evenly, as torch.maximum does
    a, b = ret.src
    gt = build.cast(build.alu(Ops.CMPLT, b, a), ctx.dtype)
    eq = build.cast(build.alu(Ops.CMPNE, build.alu(Ops.CMPNE, a, b), build.const(True, dtypes.bool, a.device, a.shape)),
                    ctx.dtype)
    half = _mul(eq, _c(ctx, 0.5))
    wa = _add(gt, half)
    wb = _add(build.cast(build.alu(Ops.CMPLT, a, b), ctx.dtype), half)
    return _mul(ctx, wa), _mul(ctx, wb)


def _reduce_max_grad(ret: UOp, ctx: UOp) -> tuple[UOp]:
    # the gradient goes to every maximal element, split evenly (torch.amax semantics)
    src = ret.src[0]
    assert src.shape is not None
    is_max = build.alu(Ops.CMPNE, build.alu(Ops.CMPNE, src, build.expand(ret, src.shape)),
                       build.const(True, dtypes.bool, src.device, src.shape))
    mask = build.cast(is_max, ctx.dtype)
    count = build.reduce_axis(mask, Ops.ADD, ret.arg[1])
    share = _mul(mask, build.expand(build.alu(Ops.RECIPROCAL, count), src.shape))
    return (_mul(share, build.expand(ctx, src.shape)),)


def _reduce_mul_grad(ret: UOp, ctx: UOp) -> tuple[UOp]:
    """d prod / d x_i is the product of the other elements: prod / x_i when no element is zero; with one zero, the
    product of the nonzero elements at the zero and 0 elsewhere; with more zeros, 0 everywhere (as torch)."""
    src = ret.src[0]
    assert src.shape is not None
    axes, zero = ret.arg[1], _c(src, 0)
    is_zero = _not(build.alu(Ops.CMPNE, src, zero))
    nonzero_prod = build.expand(build.reduce_axis(build.alu(Ops.WHERE, is_zero, _c(src, 1), src), Ops.MUL, axes),
                                src.shape)
    n_zeros = build.expand(build.reduce_axis(build.cast(is_zero, src.dtype), Ops.ADD, axes), src.shape)
    at_zero = build.alu(Ops.WHERE, build.alu(Ops.CMPNE, n_zeros, _c(src, 1)), zero, nonzero_prod)
    elsewhere = build.alu(Ops.WHERE, build.alu(Ops.CMPNE, n_zeros, zero), zero,
                          _mul(nonzero_prod, build.alu(Ops.RECIPROCAL, src)))
    others = build.alu(Ops.WHERE, is_zero, at_zero, elsewhere)                       # prod of all x_j, j != i
    return (_mul(build.expand(ctx, src.shape), others),)


def _pad_grad(ret: UOp, ctx: UOp) -> tuple[UOp]:
    assert ret.shape is not None
    return (build.shrink(ctx, [(b, s - a) for (b, a), s in zip(ret.arg, ret.shape)]),)


def _shrink_grad(ret: UOp, ctx: UOp) -> tuple[UOp]:
    src_shape = ret.src[0].shape
    assert src_shape is not None
    # an empty slice passes no gradient back (and a PAD of an empty source must not reach a kernel as a read)
    if ctx.size == 0: return (_zeros(ctx, src_shape),)
    return (build.pad(ctx, [(b, s - e) for (b, e), s in zip(ret.arg, src_shape)]),)


def _gather_grad(ret: UOp, ctx: UOp) -> tuple[UOp | None, None]:
    """Scatter-add: grad_x[.., j, ..] = sum_i (idx[.., i, ..] == j) * g[.., i, ..] (a fused one-hot reduce)."""
    x, idx = ret.src
    ax = ret.arg
    assert x.shape is not None and idx.shape is not None and x.device is not None
    n, nd = x.shape[ax], len(x.shape)
    # axes: (..., i at ax, ...) + a new trailing axis j of size n
    shp = idx.shape + (1,)
    big = idx.shape + (n,)
    # compared at the index's own width (a 64-bit 2**32 + 1 must not match position 1)
    idt = idx.dtype if idx.dtype in (dtypes.int32, dtypes.int64) else dtypes.int32 if idx.dtype.itemsize < 4 else \
        dtypes.int64
    iota = UOp(Ops.IOTA, idt, (UOp(Ops.DEVICE, arg=x.device),), n)
    onehot = build.alu(Ops.CMPNE, build.alu(Ops.CMPNE, build.expand(build.reshape(build.cast(idx, idt), shp), big),
                                            build.expand(build.reshape(iota, (1,) * nd + (n,)), big)),
                       build.const(True, dtypes.bool, x.device, big))
    contrib = build.alu(Ops.WHERE, onehot, build.expand(build.reshape(ctx, shp), big), build.const(0, ctx.dtype, x.device, big))
    summed = build.reshape(build.reduce_axis(contrib, Ops.ADD, [ax]), tuple(1 if d == ax else s for d, s in enumerate(idx.shape)) + (n,))
    rest = [d for d in range(nd) if d != ax]
    moved = build.permute(summed, rest[:ax] + [nd] + rest[ax:] + [ax])   # j into axis ax, the size-1 axis last
    out = build.reshape(moved, tuple(n if d == ax else s for d, s in enumerate(idx.shape)))
    if out.size == 0: return _zeros(ctx, x.shape), None   # an empty index gathers nothing
    return build.pad(out, [(0, xs - os) for xs, os in zip(x.shape, out.shape)]), None


LN2 = math.log(2)

pm_gradient = PatternMatcher([
    (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),                                          # d(a+b) = (g, g)
    (UPat(Ops.MUL, name="ret"), lambda ret, ctx: (_mul(ctx, ret.src[1]), _mul(ctx, ret.src[0]))),  # d(a*b) = (gb, ga)
    (UPat(Ops.NEG), lambda ctx: (build.alu(Ops.NEG, ctx),)),                           # d(-x) = -g
    (UPat(Ops.RECIPROCAL, name="ret"),
     lambda ret, ctx: (build.alu(Ops.NEG, _mul(ctx, _mul(ret, ret))),)),               # d(1/x) = -g/x^2
    (UPat(Ops.SQRT, name="ret"),
     lambda ret, ctx: (_mul(ctx, build.alu(Ops.RECIPROCAL, _mul(ret, _c(ret, 2)))),)),  # d(sqrt x) = g/(2 sqrt x)
    (UPat(Ops.EXP2, name="ret"), lambda ret, ctx: (_mul(ctx, _mul(ret, _c(ret, LN2))),)),  # d(2^x) = g 2^x ln2
    (UPat(Ops.LOG2, name="ret"),
     lambda ret, ctx: (_mul(ctx, build.alu(Ops.RECIPROCAL, _mul(ret.src[0], _c(ret, LN2)))),)),  # d(log2 x) = g/(x ln2)
    (UPat(Ops.SIN, name="ret"),                                                        # d(sin x) = g cos x
     lambda ret, ctx: (_mul(ctx, build.alu(Ops.SIN, _add(build.alu(Ops.NEG, ret.src[0]), _c(ret, math.pi / 2)))),)),
    (UPat(Ops.MAX, name="ret"), _max_grad),                                            # ties split evenly
    (UPat(Ops.WHERE, name="ret"),                                                      # d where(c,a,b) = (-, cg, !cg)
     lambda ret, ctx: (None, build.alu(Ops.WHERE, ret.src[0], ctx, _c(ctx, 0)),
                       build.alu(Ops.WHERE, ret.src[0], _c(ctx, 0), ctx))),
    (UPat(Ops.TRUNC, name="ret"), lambda ret, ctx: (_c(ctx, 0),)),                     # d trunc(x) = 0 almost everywhere
    (UPat(GroupOp.Comparison | {Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}, name="ret"),
     lambda ret: (None,) * len(ret.src)),                                              # not differentiable
    (UPat(Ops.CAST, name="ret"),
     lambda ret, ctx: (build.cast(ctx, ret.src[0].dtype) if dtypes.is_float(ret.src[0].dtype) else None,)),
    (UPat(Ops.REDUCE_AXIS, name="ret"), lambda ret, ctx: (build.expand(ctx, ret.src[0].shape),)
     if ret.arg[0] is Ops.ADD else _reduce_max_grad(ret, ctx) if ret.arg[0] is Ops.MAX else _reduce_mul_grad(ret, ctx)),
    (UPat(Ops.RESHAPE, name="ret"), lambda ret, ctx: (build.reshape(ctx, ret.src[0].shape),)),
    (UPat(Ops.PERMUTE, name="ret"), lambda ret, ctx: (build.permute(ctx, build.inverse_permute(ret.arg)),)),
    (UPat(Ops.EXPAND, name="ret"), lambda ret, ctx: (build.reduce_to(ctx, ret.src[0].shape),)),
    (UPat(Ops.PAD, name="ret"), _pad_grad),
    (UPat(Ops.SHRINK, name="ret"), _shrink_grad),
    (UPat(Ops.FLIP, name="ret"), lambda ret, ctx: (build.flip(ctx, ret.arg),)),
    (UPat(Ops.GATHER, name="ret"), _gather_grad),
    (UPat(Ops.ASSIGN), lambda ctx: (None, ctx)),                                       # the value flows through
    (UPat(Ops.CONTIGUOUS), lambda ctx: (ctx,)),
    (UPat(Ops.COPY, name="ret"), lambda ret, ctx: (UOp(Ops.COPY, ctx.dtype, (ctx,), ret.src[0].device),)),
    (UPat(Ops.DETACH, name="ret"), lambda ret, ctx: (None,) if ret.arg is None else (None, *ret.arg.backward(ctx, ret))),
    (UPat(Ops.MULTI, name="ret"), lambda ret, ctx: _multi_grad(ret, ctx)),              # each shard gets its slice
])


def _multi_grad(ret: UOp, ctx: UOp) -> Any:
    return multi_grad(ret, ctx)


class GradFn:
    """A custom backward: DETACH(value, *inputs, arg=GradFn(f)) is `value` going forward, and f(grad, node) gives the
    gradients of `inputs` going backward (value itself is built from detached inputs). The scheduler never sees it:
    its walk (schedule/cache.py) takes `value` for the node; `strip_grad_fns` does the same for a graph alone. Used where the generic rules make a slow backward
    (the input gradient of a convolution is a transposed convolution, not a scatter through the unfolded windows)."""
    def __init__(self, backward, name: str = ""): self.backward, self.name = backward, name
    def __repr__(self) -> str: return f"GradFn({self.name})"


# strip_grad_fns' results, kept across calls: a realize strips many outputs of one graph (every parameter and
# optimizer state of a step), and a walk of the whole graph for each cost 0.1 s of a training step's first call
_stripped: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()  # node -> node without GradFns
_no_grad_fns: weakref.WeakSet[UOp] = weakref.WeakSet()                        # nodes with none under them


def strip_grad_fns(u: UOp) -> UOp:
    """u with every custom-backward DETACH replaced by its forward value (as `substitute` would; nodes are immutable,
    so the result per node is kept and a later call walks only nodes it hasn't seen)."""
    def seen(n: UOp) -> bool: return n in _no_grad_fns or n in _stripped
    for n in u.toposort(gate=lambda n: not seen(n)):
        if seen(n): continue
        if n.op is Ops.DETACH and n.arg is not None:
            _stripped[n] = _stripped.get(n.src[0], n.src[0])   # its value may read another custom backward's output
            continue
        new = tuple(_stripped.get(s, s) for s in n.src)
        if all(a is b for a, b in zip(new, n.src)): _no_grad_fns.add(n)
        else:
            _stripped[n] = r = n.replace(src=new)
            r.shape, r.device   # noqa: B018 - children first: a deep new graph must not recurse on its first use
    return _stripped.get(u, u)


def graph_nodes(root: UOp) -> list[UOp]:
    """The nodes gradients can flow through from `root`, children first: the walk stops at a plain DETACH."""
    return list(root.toposort(gate=lambda u: u.op is not Ops.DETACH or u.arg is not None))


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp], topo: list[UOp] | None = None) -> dict[UOp, UOp]:
    """Reverse-mode gradients of `root` (seeded with `root_grad`) for every node on a path to a target. `topo` is
    graph_nodes(root) when the caller already has it."""
    if topo is None: topo = graph_nodes(root)
    on_path: set[UOp] = set()
    for n in topo:  # children first, so a node is on a path if it is a target or a source is
        if n in targets or any(s in on_path for s in n.src): on_path.add(n)
    grads: dict[UOp, UOp] = {root: root_grad}
    for n in reversed(topo):
        if n not in grads or n not in on_path or n.op in (Ops.BUFFER, Ops.CONST, Ops.IOTA, Ops.DEVICE): continue
        local = pm_gradient.rewrite(n, ctx=grads[n])
        if local is None: raise RuntimeError(f"no gradient rule for {n.op}")
        for s, g in zip(n.src, local):
            if g is None or s not in on_path: continue
            if g.shape != s.shape: raise RuntimeError(f"gradient shape {g.shape} != {s.shape} for {n.op}")
            grads[s] = _add(grads[s], g) if s in grads else g
    return grads


def custom_grad(value: "Tensor | UOp", inputs: list["Tensor"], backward: Callable, name: str) -> "Tensor":
    """`value` (a Tensor or its node) going forward; backward(grad, *inputs) -> one gradient Tensor per input (see
    autograd.GradFn)."""
    T = storage.tensor_class   # (the frontend's Tensor, registered by tensor.py)
    v = value if isinstance(value, UOp) else value.uop

    def bw(ctx: Any, node: Any) -> tuple[Any, ...]:
        return tuple(g.uop for g in backward(T._wrap(ctx), *[T._wrap(s) for s in node.src[1:]]))
    return T._wrap(UOp(Ops.DETACH, v.dtype, (v, *[t.uop for t in inputs]), GradFn(bw, name)), *inputs)
