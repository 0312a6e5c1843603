"""Scheduler pass "reduce loop order": a kernel AST (from indexing.py) -> the same AST with each multi-axis reduce's
loops ordered so that the innermost one walks memory contiguously.

A reduce over several axes nests its loops in axis order (`REDUCE(v, r0, r1)`: r1 innermost). That order comes from
the tensor graph, not from memory: `einsum("bhtd,hdk->btk")` reduces over (d, h), so its innermost loop steps h, 4096
floats apart in the first operand and 12288 in the second, and neither the cache nor the vectorizer gets a contiguous
run (5.9 ms against 1.2 ms for the same product written as a (B, T, H*D) @ (H*D, K) matmul). When the innermost range
of a reduce has no unit-stride load and another of its ranges has one, that range becomes the innermost (ranges are
renumbered so their ids still grow inward). Only the order of the additions changes. Left alone: reduces whose
innermost range already reads some input contiguously, or is at most SHORT long (codegen unrolls it whole: a
convolution's kx, whose loop order the conv heuristics are tuned for; moving a channels-last input's 32 channels
innermost made that conv 1.28 -> 1.50 ms), and ranges of symbolic size.
"""
from __future__ import annotations

from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.symbolic import split_terms

SHORT = 8   # an innermost reduce loop this short is unrolled whole by codegen (opt.py): its stride costs no loop


def _unit_loads(loads: list[UOp], r: UOp) -> int:
    """How many of the loads' addresses step by exactly 1 with r (r a plain term of the address sum)."""
    n = 0
    for idx in loads:
        terms, _ = split_terms(idx.src[1])
        if terms.get(r) == 1 and all(r not in t.toposort() for t in terms if t is not r): n += 1
    return n


def order_reduce_loops(ast: UOp) -> UOp:
    """The pass (see the module docstring)."""
    reds = [n for n in ast.toposort() if n.op is Ops.REDUCE and len(n.src) > 2]
    if not reds: return ast
    renumber: dict[UOp, UOp] = {}
    for red in reds:
        rngs = list(red.src[1:])
        if any(r.src[0].op is not Ops.CONST for r in rngs) or any(r in renumber for r in rngs): continue
        loads = [n.src[0] for n in red.src[0].toposort() if n.op is Ops.LOAD]
        unit = {r: _unit_loads(loads, r) for r in rngs}
        best = max(rngs, key=lambda r: unit[r])
        if unit[rngs[-1]] or not unit[best] or int(rngs[-1].src[0].arg) <= SHORT: continue
        order = [r for r in rngs if r is not best] + [best]
        ids = sorted(r.arg[0] for r in rngs)
        renumber.update({r: UOp.range(r.src[0], i, r.arg[1]) for r, i in zip(order, ids)})
    if not renumber: return ast
    # rebuild bottom-up with the renumbered ranges, each reduce's ranges in nesting order (the linearizer nests them
    # in source order)
    memo: dict[UOp, UOp] = dict(renumber)
    for n in ast.toposort():
        if n in memo: continue
        src = tuple(memo.get(s, s) for s in n.src)
        if n.op is Ops.REDUCE and len(src) > 2: src = (src[0], *sorted(src[1:], key=lambda r: r.arg[0]))
        if src != n.src: memo[n] = n.replace(src=src)
    return memo.get(ast, ast)
