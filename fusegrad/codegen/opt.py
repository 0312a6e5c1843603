"""Kernel optimizations as explicit actions on the kernel AST (basic for now: unrolling short reduce loops).

UNROLL(r, k): split reduce range r of size n into an outer range of n/k and k unrolled copies of the body, combined
with the reduce op, so each loop iteration does k accumulations.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite, substitute
from fusegrad.ir.symbolic import pm_symbolic
from fusegrad.renderer import Renderer


@dataclass(frozen=True)
class Opt:
    op: str          # "UNROLL"
    axis: int        # which range (by id)
    amount: int


def unroll_reduce(ast: UOp, red: UOp, rng: UOp, amount: int, next_id: int) -> UOp:
    """REDUCE(v(r), r) with r of size n -> REDUCE(v(ro*k+0) op ... op v(ro*k+k-1), ro) with ro of size n/k."""
    size = int(rng.src[0].arg)
    assert size % amount == 0
    outer = UOp.range(size // amount, next_id, "reduce") if size // amount > 1 else None
    base = outer * amount if outer is not None else UOp.const(rng.dtype, 0)
    body = red.src[0]
    parts = [substitute(body, {rng: base + i}) for i in range(amount)]
    acc = parts[0]
    for p in parts[1:]: acc = UOp(red.arg, red.dtype, (acc, p))
    new_rngs = tuple(r for r in red.src[1:] if r is not rng) + ((outer,) if outer is not None else ())
    new = UOp(Ops.REDUCE, red.dtype, (acc,) + new_rngs, red.arg) if new_rngs else acc
    return substitute(ast, {red: new})


def apply_opts(ast: UOp, renderer: Renderer) -> UOp:
    """Hand-coded heuristic: unroll the innermost reduce range of each reduce by up to 4 when it divides evenly."""
    next_id = max((n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE), default=-1) + 1
    reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    for red in reds:
        cur = next(n for n in ast.toposort() if n.op is Ops.REDUCE and n.arg == red.arg and n.src[1:] == red.src[1:])
        rng = cur.src[-1]
        size = int(rng.src[0].arg)
        amount = size if size <= 4 else 4 if size % 4 == 0 else 1
        if amount > 1:
            ast = unroll_reduce(ast, cur, rng, amount, next_id)
            next_id += 1
    return graph_rewrite(ast, pm_symbolic, name="postopt symbolic")
