"""GPU-style launch (codegen, after the optimizations and before linearize): a kernel AST's output RANGEs -> work-item
ids (SPECIAL), for renderers that launch a grid of work-items (`has_local`). Each work-item then computes one point
of the output loops; its reduce loops (and any output range that didn't fit the grid) stay loops.
"""
from __future__ import annotations

import math

from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite, substitute
from fusegrad.ir.symbolic import pm_symbolic
from fusegrad.renderer import Renderer


def _size(r: UOp) -> int:
    # a symbolic size (a variable) never fits the grid: that range stays a loop inside each work-item
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else 1 << 62


def group_dims(outs: list[UOp], global_max: tuple[int, ...]) -> list[list[UOp]]:
    """Output ranges (outermost first) -> the ranges each grid dimension covers, dim 0 first. The innermost range gets
    dim 0 (neighbouring work-items touch neighbouring elements); with more ranges than dims the outer ones merge into
    the last dim. A range that doesn't fit its dim's limit stays a loop, and so does every range outside it."""
    left, dims = outs[::-1], []
    for d, limit in enumerate(global_max):
        group: list[UOp] = []
        while left and math.prod(map(_size, group)) * _size(left[0]) <= limit and (not group or d == len(global_max) - 1):
            group.insert(0, left.pop(0))
        if not group: break
        dims.append(group)
    return dims


def local_dims(global_size: tuple[int, ...], local_max: int, dim_max: tuple[int, ...] = (2**31,) * 3) -> tuple[int, ...]:
    """A workgroup shape that divides the grid exactly (OpenCL 1.2 needs that): dim 0 first, up to local_max items in
    all and dim_max[d] along dimension d."""
    local, room = [], local_max
    for g, cap in zip(global_size, dim_max):
        size = max(d for d in range(1, min(g, room, cap) + 1) if g % d == 0)
        local.append(size)
        room //= size
    return tuple(local)


def fit_block(local: tuple[int, ...], max_threads: int) -> tuple[int, ...]:
    """Shrink a workgroup to at most max_threads items, each dimension a divisor of the old one (so it still divides
    the grid): for a runtime whose compiled kernel allows fewer threads than the device (register pressure)."""
    out = list(local)
    while max(out, default=1) > 1 and math.prod(out) > max_threads:
        d = out.index(max(out))
        out[d] //= next(f for f in range(2, out[d] + 1) if out[d] % f == 0)
    return tuple(out)


def add_gpudims(ast: UOp, renderer: Renderer) -> tuple[UOp, tuple[int, ...], tuple[int, ...]]:
    """Replace the output ranges with SPECIAL `gid<d>` (get_global_id(d)); a dimension covering several ranges
    recovers each by div/mod. Returns the new AST, the grid size and the workgroup size."""
    assert renderer.global_max is not None
    outs = sorted((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] != "reduce"), key=lambda r: r.arg[0])
    # the lanes of a GROUP reduce (codegen/group.py) are the workgroup's dimension 0, a whole workgroup wide
    lanes = [r for r in outs if r.arg[1] == "local"]
    if len(lanes) > 1: raise ValueError(f"only one GROUP per kernel, got {len(lanes)}")
    outs = [r for r in outs if r.arg[1] != "local"]
    dims = [lanes] + group_dims(outs, renderer.global_max[1:]) if lanes else group_dims(outs, renderer.global_max)
    mapping: dict[UOp, UOp] = {}
    for d, group in enumerate(dims):
        name = "lid0" if lanes and d == 0 else f"gid{d}"
        gid = UOp(Ops.SPECIAL, group[0].dtype, (UOp.const(group[0].dtype, math.prod(map(_size, group))),), name)
        stride = 1
        for r in reversed(group):  # innermost first: r = gid // (sizes of the ranges inside it) % size
            idx = gid // stride if stride > 1 else gid
            mapping[r] = idx % _size(r) if r is not group[0] else idx
            stride *= _size(r)
    if mapping: ast = graph_rewrite(substitute(ast, mapping), pm_symbolic, name="gpudims")
    global_size = tuple(math.prod(map(_size, g)) for g in dims) or (1,)
    if lanes: return ast, global_size, (global_size[0],) + (1,) * (len(global_size) - 1)
    return ast, global_size, local_dims(global_size, renderer.local_max, renderer.local_dim_max)
