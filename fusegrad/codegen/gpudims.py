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


def _size(r: UOp) -> int: return int(r.src[0].arg)


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


def add_gpudims(ast: UOp, renderer: Renderer) -> tuple[UOp, tuple[int, ...], tuple[int, ...]]:
    """Replace the output ranges with SPECIAL `gid<d>` (get_global_id(d)); a dimension covering several ranges
    recovers each by div/mod. Returns the new AST, the grid size and the workgroup size."""
    assert renderer.global_max is not None
    outs = sorted((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] != "reduce"), key=lambda r: r.arg[0])
    dims = group_dims(outs, renderer.global_max)
    mapping: dict[UOp, UOp] = {}
    for d, group in enumerate(dims):
        gid = UOp(Ops.SPECIAL, group[0].dtype, (UOp.const(group[0].dtype, math.prod(map(_size, group))),), f"gid{d}")
        stride = 1
        for r in reversed(group):  # innermost first: r = gid // (sizes of the ranges inside it) % size
            idx = gid // stride if stride > 1 else gid
            mapping[r] = idx % _size(r) if r is not group[0] else idx
            stride *= _size(r)
    if mapping: ast = graph_rewrite(substitute(ast, mapping), pm_symbolic, name="gpudims")
    global_size = tuple(math.prod(map(_size, g)) for g in dims) or (1,)
    return ast, global_size, local_dims(global_size, renderer.local_max, renderer.local_dim_max)
