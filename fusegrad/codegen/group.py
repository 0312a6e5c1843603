"""GROUP: a reduction shared by the work-items of one workgroup (GPU-style targets with shared memory).

Without it a GPU-style kernel gives each output element to one work-item, so `x.sum()` of a million floats runs its
whole loop on a single work-item. GROUP(r, L) splits reduce range r (size n, L dividing n) into L lanes: lane `lid`
(a work-item of an L-wide workgroup) accumulates elements r = ro*L + lid, so neighbouring work-items read
neighbouring elements; then

    local[lid] = partial            DEFINE_LOCAL (shared memory) + STORE
    barrier                         BARRIER: every lane has written
    out = local[0] op ... op local[L-1]   a REDUCE over a new range, read by every lane (each gets the same value)

The lane is a RANGE of kind "local" until codegen/gpudims.py makes it the workgroup's dimension 0 (`lid0`). Every
lane stores the same result to the output, so no lane has to be singled out.
"""
from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute
from fusegrad.renderer import Renderer

# reduces of fewer elements stay one work-item's loop; the lane counts tried (dividing the last range), largest first
MIN_GROUP_REDUCE = 256
GROUP_SIZES = (256, 128, 64, 32, 16)


def group_reduce(ast: UOp, rng: UOp, amount: int) -> UOp:
    """GROUP(rng, amount) on every REDUCE whose last range is `rng` (see the module docstring)."""
    size = int(rng.src[0].arg)
    assert size % amount == 0
    nodes = list(ast.toposort())
    next_id = max(n.arg[0] for n in nodes if n.op is Ops.RANGE) + 1
    lane = UOp.range(amount, next_id, "local")
    outer = UOp.range(size // amount, next_id + 1, "reduce") if size // amount > 1 else None
    idx = outer * amount + lane if outer is not None else lane
    mapping: dict[UOp, UOp] = {}
    n_local = 0
    for red in nodes:
        if red.op is not Ops.REDUCE or rng not in red.src[1:]: continue
        if red.src[-1] is not rng: raise ValueError(f"GROUP({rng.arg[0]}, {amount}): the range must be its reduce's last")
        rest = tuple(r for r in red.src[1:] if r is not rng) + ((outer,) if outer is not None else ())
        body = substitute(red.src[0], {rng: idx})
        partial = UOp(Ops.REDUCE, red.dtype, (body,) + rest, red.arg) if rest else body
        buf = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(amount, "local"), (), n_local)
        n_local += 1
        bar = UOp(Ops.BARRIER, dtypes.void, (UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, red.dtype, (buf, lane)), partial)),))
        j = UOp.range(amount, next_id + 2 + n_local, "reduce")
        mapping[red] = UOp(Ops.REDUCE, red.dtype, (UOp(Ops.LOAD, red.dtype, (UOp(Ops.INDEX, red.dtype, (buf, j)), bar)), j),
                           red.arg)
    if not mapping: raise ValueError(f"GROUP({rng.arg[0]}, {amount}): no reduce ends in that range")
    return substitute(ast, mapping)


def group_opt(ast: UOp, renderer: Renderer) -> tuple[int, int] | None:
    """The heuristic: (range id, amount) to GROUP when the kernel's outputs are too few to fill the device and its
    one reduce is long, else None."""
    if not (renderer.has_local and renderer.has_shared): return None
    nodes = list(ast.toposort())
    reduces = [n for n in nodes if n.op is Ops.REDUCE]
    if not reduces or len({n.src[1:] for n in reduces}) != 1: return None
    if any(n.op is Ops.RANGE and n.src[0].op is not Ops.CONST for n in nodes): return None  # symbolic sizes
    outputs = 1
    for n in nodes:
        if n.op is Ops.RANGE and n.arg[1] != "reduce": outputs *= int(n.src[0].arg)
    rng = reduces[0].src[-1]
    size, total = int(rng.src[0].arg), 1
    for r in reduces[0].src[1:]: total *= int(r.src[0].arg)
    if outputs > renderer.group_max_outputs or total < MIN_GROUP_REDUCE: return None
    amount = next((a for a in GROUP_SIZES if a <= renderer.local_max and size % a == 0), None)
    return (rng.arg[0], amount) if amount is not None else None


__all__ = ["group_reduce", "group_opt"]
