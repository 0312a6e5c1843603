"""Merge adjacent loops that every access walks contiguously: (r_a, r_b) of sizes (A, B) -> one loop of A*B.

A kernel's loops come from its tensor shape, so a BatchNorm statistic over (512, 20, 20) runs a 20-iteration inner
loop inside a 20-iteration loop: short loops, and a VECTORIZE limited to the widths that divide 20. When every index
uses the pair as `r_a*B + r_b` (times a stride), the two loops are one loop of 400 in disguise. This pass tries each
pair of neighbouring loops of the same kind (output or reduce) with constant sizes: it substitutes r_a = r // B and
r_b = r % B for a new range r, lets the symbolic rules simplify, and keeps the result only when no division or
modulo of r is left (the rules fold `(r // B) * B*s + (r % B) * s` back into `r * s`).

Runs before the optimizations (`to_program`, heuristic path only: an explicit action list, BEAM's or a test's, names
the AST's own axes).
"""
from __future__ import annotations

import itertools

from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite
from fusegrad.ir.symbolic import pm_symbolic


def _substitute_pair(sink: UOp, a: UOp, b: UOp, n: UOp) -> UOp:
    """sink with a -> n // B and b -> n % B, and the pair (a, b) in a REDUCE's range list -> n."""
    size_b = b.src[0]
    div, mod = UOp(Ops.IDIV, n.dtype, (n, size_b)), UOp(Ops.MOD, n.dtype, (n, size_b))
    memo: dict[UOp, UOp] = {a: div, b: mod}
    for u in sink.toposort():
        if u in memo: continue
        if u.op is Ops.REDUCE and (a in u.src[1:] or b in u.src[1:]):
            srcs = [memo.get(u.src[0], u.src[0])] + [n if s is a else memo.get(s, s) for s in u.src[1:] if s is not b]
            memo[u] = UOp(u.op, u.dtype, tuple(srcs), u.arg)
            continue
        src = tuple(memo.get(s, s) for s in u.src)
        memo[u] = u if all(x is y for x, y in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg)
    return memo[sink]


def _uses_div_mod_of(sink: UOp, n: UOp) -> bool:
    return any(x.op in (Ops.IDIV, Ops.MOD) and n in x.src[0].toposort() for x in sink.toposort())


def merge_ranges(sink: UOp) -> UOp:
    """Merge every mergeable pair of adjacent loops, innermost first, until none is left."""
    while True:
        rngs = sorted({u for u in sink.toposort() if u.op is Ops.RANGE}, key=lambda r: r.arg[0])
        for a, b in reversed(list(itertools.pairwise(rngs))):
            if a.arg[1] != b.arg[1] or a.src[0].op is not Ops.CONST or b.src[0].op is not Ops.CONST: continue
            # both must be used together: a REDUCE that lists one of them lists the other
            reds = [u for u in sink.toposort() if u.op is Ops.REDUCE and (a in u.src[1:] or b in u.src[1:])]
            if any(not (a in u.src[1:] and b in u.src[1:]) for u in reds): continue
            n = UOp(Ops.RANGE, a.dtype, (UOp.const(a.dtype, a.src[0].arg * b.src[0].arg),), a.arg)
            cand = graph_rewrite(_substitute_pair(sink, a, b, n), pm_symbolic, name="merge ranges")
            if _uses_div_mod_of(cand, n): continue
            sink = cand
            break
        else: return sink
