"""Merge adjacent loops that every access walks contiguously: (r_a, r_b) of sizes (A, B) -> one loop of A*B; and
the converse, split a loop that an access reads as `r // B` and `r % B` into two.

A kernel's loops come from its tensor shape, so a BatchNorm statistic over (512, 20, 20) runs a 20-iteration inner
loop inside a 20-iteration loop: short loops, and a VECTORIZE limited to the widths that divide 20. When every index
uses the pair as `r_a*B + r_b` (times a stride), the two loops are one loop of 400 in disguise. This pass tries each
pair of neighbouring loops of the same kind (output or reduce) with constant sizes: it substitutes r_a = r // B and
r_b = r % B for a new range r, lets the symbolic rules simplify, and keeps the result only when no division or
modulo of r is left (the rules fold `(r // B) * B*s + (r % B) * s` back into `r * s`).

The converse (`split_ranges`): a kernel that reads a tensor stored in another layout than the one it loops over
indexes it with a division and a modulo of one loop. A weight read as column panels, (N/32, K, 32) (mixin/reduce.py
`dot`), whose product is added to a bias of N: the kernel loops over the N columns of the sum, so the weight's
address is `(j // 32) * 32*K + k*32 + j % 32`, which no VECTORIZE or UPCAST can use (the heuristic left that product
scalar, 5x slower). Splitting j into (j_o, j_i) of sizes (N/32, 32) makes every address a sum of loops again.

Both run before the optimizations (`to_program`, heuristic path only: an explicit action list, BEAM's or a test's, names
the AST's own axes).
"""
from __future__ import annotations

import itertools

from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite, substitute
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


def _div_mod_splits(sink: UOp) -> list[tuple[UOp, int]]:
    """(range, B) for each output range that some index reads both as range // B and as range % B, B a constant that
    divides its constant size, in loop order."""
    seen: dict[tuple[UOp, int], set] = {}
    for x in sink.toposort():
        if x.op in (Ops.IDIV, Ops.MOD) and x.src[0].op is Ops.RANGE and x.src[1].op is Ops.CONST:
            seen.setdefault((x.src[0], x.src[1].arg), set()).add(x.op)
    return sorted(((r, b) for (r, b), ops in seen.items() if len(ops) == 2 and r.arg[1] == "global" and
                   r.src[0].op is Ops.CONST and 1 < b < r.src[0].arg and r.src[0].arg % b == 0),
                  key=lambda rb: (rb[0].arg[0], rb[1]))


def split_ranges(sink: UOp) -> UOp:
    """Split every output loop r of size N that an index reads as r // B and r % B into r_o (N/B) * B + r_i (B), r_i
    nested right inside r_o (the later loops move one id on), when no division or modulo of the two is left after
    simplifying. Kernels without a reduce are left alone (their single loop is the C compiler's to vectorize)."""
    if not any(u.op is Ops.REDUCE for u in sink.toposort()): return sink
    while True:
        for r, b in _div_mod_splits(sink):
            rid, kind, n = r.arg[0], r.arg[1], r.src[0].arg
            later = {u: UOp.range(u.src[0], u.arg[0] + 1, u.arg[1]) for u in sink.toposort()
                     if u.op is Ops.RANGE and u.arg[0] > rid}
            outer, inner = UOp.range(n // b, rid, kind), UOp.range(b, rid + 1, kind)
            cand = graph_rewrite(substitute(sink, {**later, r: outer * b + inner}), pm_symbolic, name="split ranges")
            if _uses_div_mod_of(cand, outer) or _uses_div_mod_of(cand, inner): continue
            sink = cand
            break
        else: return sink
