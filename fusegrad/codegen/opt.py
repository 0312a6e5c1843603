"""Kernel optimizations as explicit actions (`Opt`) on the kernel AST, and the hand-coded heuristic that picks them.

UPCAST(r, k): split output range r into n/k iterations of k copies of every store (a register tile).
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
    op: str          # "UPCAST" (output range) or "UNROLL" (reduce range)
    axis: int        # which range, by its id
    amount: int


def unroll_reduces(ast: UOp, ranges: tuple[UOp, ...], rng: UOp, amount: int, next_id: int) -> UOp:
    """Every REDUCE(v(r), ..., r) over `ranges` -> REDUCE(v(ro*k+0) op ... op v(ro*k+k-1), ..., ro), ro of size n/k."""
    size = int(rng.src[0].arg)
    assert size % amount == 0
    outer = UOp.range(size // amount, next_id, "reduce") if size // amount > 1 else None
    base = outer * amount if outer is not None else UOp.const(rng.dtype, 0)
    new_rngs = tuple(r for r in ranges if r is not rng) + ((outer,) if outer is not None else ())
    mapping = {}
    for red in ast.toposort():
        if red.op is not Ops.REDUCE or red.src[1:] != ranges: continue
        parts = [substitute(red.src[0], {rng: base + i}) for i in range(amount)]
        acc = parts[0]
        for p in parts[1:]: acc = UOp(red.arg, red.dtype, (acc, p))
        mapping[red] = UOp(Ops.REDUCE, red.dtype, (acc,) + new_rngs, red.arg) if new_rngs else acc
    return substitute(ast, mapping)


def upcast_global(ast: UOp, rng: UOp, amount: int) -> UOp:
    """UPCAST(r, k): output range r of size n -> a range of n/k and k copies of every store (constants 0..k-1 in
    place of the split-off part). Reduces over the same ranges then share one loop nest with k accumulators, and
    loads that don't depend on r are shared."""
    size = int(rng.src[0].arg)
    assert size % amount == 0
    outer = UOp.range(size // amount, rng.arg[0], rng.arg[1]) if size // amount > 1 else None
    base = outer * amount if outer is not None else UOp.const(rng.dtype, 0)
    stores = []
    for st in ast.src:
        if rng in st.toposort(): stores.extend(substitute(st, {rng: base + i}) for i in range(amount))
        else: stores.append(st)
    return ast.replace(src=tuple(stores))


def _range(ast: UOp, axis: int) -> UOp:
    rng = next((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[0] == axis), None)
    if rng is None: raise ValueError(f"no range with id {axis} in this kernel")
    return rng


def apply_opt(ast: UOp, opt: Opt) -> UOp:
    """One action on the kernel. UPCAST needs an output range, UNROLL a reduce range; the amount must divide it."""
    rng = _range(ast, opt.axis)
    size = int(rng.src[0].arg)
    if opt.amount < 1 or size % opt.amount: raise ValueError(f"{opt}: amount must divide the range size {size}")
    if opt.op == "UPCAST":
        if rng.arg[1] == "reduce": raise ValueError(f"{opt}: UPCAST needs an output range, {opt.axis} is a reduce")
        return upcast_global(ast, rng, opt.amount)
    if opt.op == "UNROLL":
        if rng.arg[1] != "reduce": raise ValueError(f"{opt}: UNROLL needs a reduce range, {opt.axis} is an output")
        next_id = max(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE) + 1
        for key in dict.fromkeys(n.src[1:] for n in ast.toposort() if n.op is Ops.REDUCE and rng in n.src[1:]):
            ast = unroll_reduces(ast, key, rng, opt.amount, next_id)
        return ast
    raise ValueError(f"unknown optimization {opt.op!r}")


def hand_coded_opts(ast: UOp) -> list[Opt]:
    """The heuristic. Kernels with a reduce: upcast the two innermost output ranges by 4 (else 2), a register tile of
    accumulators; then unroll each reduce's innermost range (fully when <= 8 long, else by 4)."""
    opts: list[Opt] = []
    nodes = ast.toposort()
    if not any(n.op is Ops.REDUCE for n in nodes): return opts
    glob = sorted((n for n in nodes if n.op is Ops.RANGE and n.arg[1] == "global"), key=lambda r: r.arg[0])
    for rng in list(reversed(glob))[:2]:
        size = int(rng.src[0].arg)
        k = next((a for a in (4, 2) if size % a == 0), 1)
        if k > 1: opts.append(Opt("UPCAST", rng.arg[0], k))
    for key in dict.fromkeys(n.src[1:] for n in nodes if n.op is Ops.REDUCE):
        size = int(key[-1].src[0].arg)
        amount = size if size <= 8 else 4 if size % 4 == 0 else 1
        if amount > 1 and Opt("UNROLL", key[-1].arg[0], amount) not in opts: opts.append(Opt("UNROLL", key[-1].arg[0], amount))
    return opts


def apply_opts(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> UOp:
    """Apply `opts` (default: the hand-coded heuristic) in order, then re-simplify the index math."""
    for o in (hand_coded_opts(ast) if opts is None else opts):
        ast = graph_rewrite(apply_opt(ast, o), pm_symbolic, name=f"opt {o.op} {o.axis} {o.amount}")
    return ast
