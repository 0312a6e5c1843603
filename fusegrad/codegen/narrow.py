"""Narrow an in-place write's loop to the positions it changes.

A write through a slice (`cache[:, p:p + 1] = k`, views.write_through) is the base's new value everywhere: the
kernel stores `valid ? new : old` at every position of the buffer, `old` being the position's own current value, so
a KV-cache update of one token rewrote the whole cache (a decode step of SmolLM2 at 200 positions: 2.1 ms of its
~25 ms). When the kernel is that one in-place store and `valid` bounds an output loop r to an interval,
lo <= r < hi (from the slice's pad: `-1 < r - p` and `r - p < T`), the loop runs over the interval only (r = lo + r'
for r' < hi - lo) and the positions outside it, which stored their own value, are not visited.

Only for an elementwise kernel (no reduce) with a single STORE whose value is WHERE(valid, new, LOAD of the very
INDEX it stores to), an interval of a constant length shorter than the loop, and bounds of the form `r + e` with e
free of loops (one of them may be missing: the loop's start or end, which the simplifier folds away). Where a
variable's range (vmin/vmax) lets the interval reach outside the loop, as a decode step's start_pos bounded by the
model's context does over a KV cache that holds fewer positions, the visited positions are clamped into the loop.
Runs before the optimizations on the heuristic path (`to_program`), as merge_ranges does: an explicit action list
names the AST's own loops and sizes.
"""
from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite, substitute
from fusegrad.ir.symbolic import build_sum, pm_symbolic, split_terms


def _conjuncts(c: UOp) -> list[UOp]:
    """The terms of an AND chain (a WHERE(c, True, False) is c)."""
    if c.op is Ops.WHERE and c.src[1].op is Ops.CONST and c.src[1].arg is True and c.src[2].op is Ops.CONST and \
            c.src[2].arg is False:
        c = c.src[0]
    if c.op is Ops.AND and c.dtype == dtypes.bool: return _conjuncts(c.src[0]) + _conjuncts(c.src[1])
    return [c]


def _has_range(u: UOp) -> bool: return any(x.op is Ops.RANGE for x in u.toposort())


def _bound(term: UOp, r: UOp) -> tuple[str, UOp] | None:
    """`term` as a bound of loop r: ("lo", e) for r >= e, ("hi", e) for r < e, with e free of loops; None otherwise."""
    if term.op is not Ops.CMPLT or not dtypes.is_int(term.src[0].dtype): return None
    a, b = term.src
    terms, const = split_terms(UOp(Ops.ADD, a.dtype, (b, UOp(Ops.MUL, a.dtype, (a, UOp.const(a.dtype, -1))))))
    coeff = terms.pop(r, 0)    # a < b is coeff * r + rest > 0
    if coeff not in (1, -1) or any(_has_range(t) for t in terms): return None
    if coeff == 1:             # r > -rest: r >= 1 - rest
        return "lo", build_sum({t: -c for t, c in terms.items()}, 1 - const, a.dtype)
    return "hi", build_sum(terms, const, a.dtype)   # r < rest


def narrow_inplace_ranges(sink: UOp) -> UOp:
    """The kernel with its in-place write's loops narrowed to the intervals it changes (module docstring), one loop
    after another (`c[:, 2:4, 1:2] = v` narrows two); unchanged when the pattern doesn't hold."""
    while (new := _narrow_one(sink)) is not sink: sink = new
    return sink


def _narrow_one(sink: UOp) -> UOp:
    nodes = sink.toposort()
    stores = [u for u in nodes if u.op is Ops.STORE]
    if len(stores) != 1 or any(u.op in (Ops.REDUCE, Ops.REDUCE_AXIS) for u in nodes): return sink
    idx, val = stores[0].src
    if val.op is not Ops.WHERE or val.src[2].op is not Ops.LOAD or val.src[2].src[0] is not idx: return sink
    conj = _conjuncts(val.src[0])
    for r in sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0]):
        if r.src[0].op is not Ops.CONST: continue
        found: dict[str, list[UOp]] = {"lo": [], "hi": []}
        for c in conj:
            if (b := _bound(c, r)) is not None: found[b[0]].append(b[1])
        # a bound the loop's own range implies was folded away (`r < 6` over 6 positions): the loop's end or start
        if len(found["lo"]) > 1 or len(found["hi"]) > 1 or not (found["lo"] or found["hi"]): continue
        lo = found["lo"][0] if found["lo"] else UOp.const(r.dtype, 0)
        hi = found["hi"][0] if found["hi"] else r.src[0]
        size = graph_rewrite(UOp(Ops.ADD, lo.dtype, (hi, UOp(Ops.MUL, lo.dtype, (lo, UOp.const(lo.dtype, -1))))),
                             pm_symbolic, name="narrow size")
        n = r.src[0].arg
        if size.op is not Ops.CONST or not 0 < size.arg < n: continue
        inner = UOp.range(size.arg, r.arg[0], r.arg[1])
        pos = UOp(Ops.ADD, r.dtype, (inner, lo))
        # where a variable's range lets the interval leave the loop (a KV cache shorter than the model's context,
        # start_pos bounded by the context), the visited positions are clamped into it: a clamped position lies
        # outside the interval, so it stores its own value (or, clamped onto the interval's edge, the new one again)
        if lo.vmin < 0: pos = pos.maximum(UOp.const(r.dtype, 0))
        if hi.vmax > n: pos = UOp(Ops.CMPLT, dtypes.bool, (pos, UOp.const(r.dtype, n - 1))).where(pos, n - 1)
        return graph_rewrite(substitute(sink, {r: pos}), pm_symbolic, name="narrow in-place write")
    return sink


__all__ = ["narrow_inplace_ranges"]
