"""VECTORIZE(r, w): run w consecutive iterations of range r as the w lanes of SIMD vectors.

The range is split into an outer range of n/w and a lane index 0..w-1. Every value that depends on the lane becomes a
vector of w elements; values that don't stay scalar (one load of a row's bias, not w). How each node becomes a vector:

- index math (integers and booleans computed from ranges only): one simplified scalar expression per lane, gathered
  into a VECTORIZE; where only its lane-0 value matters (a contiguous address) only that one is kept.
- a LOAD or STORE whose address is `base + lane` in every lane (and whose gate doesn't depend on the lane) becomes one
  vector load/store at `base`; any other address pattern is w scalar accesses (a gather/scatter).
- ALU ops on vectors: scalar operands are broadcast; the renderer uses the target's vector ops where it has them.
- a REDUCE over other ranges accumulates a vector (w accumulators in one register); a REDUCE over r itself accumulates a
  vector over the outer range and sums its lanes at the end (a horizontal reduction).
"""
from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import substitute
from fusegrad.ir.symbolic import simplify, split_terms


def broadcast(x: UOp, width: int) -> UOp:
    if x.dtype.count == width: return x
    return UOp(Ops.VECTORIZE, x.dtype.vec(width), (x,) * width)


def lane_step(lanes: list[UOp]) -> int | None:
    """The address step between consecutive lanes when lane l's index is lane 0's plus l*step, else None."""
    t0, c0 = split_terms(lanes[0])
    steps = set()
    for i, x in enumerate(lanes[1:], 1):
        t, c = split_terms(x)
        if t != t0 or (c - c0) % i: return None
        steps.add((c - c0) // i)
    return steps.pop() if len(steps) == 1 else None


def vectorize_range(ast: UOp, rng: UOp, width: int) -> UOp:
    size = int(rng.src[0].arg)
    if size % width: raise ValueError(f"VECTORIZE: width {width} must divide the range size {size}")
    outer = UOp.range(size // width, rng.arg[0], rng.arg[1]) if size // width > 1 else None
    base = outer * width if outer is not None else UOp.const(rng.dtype, 0)
    lane_subs = [{rng: simplify(base + i)} for i in range(width)]
    topo = list(ast.toposort())
    dep: set[UOp] = set()        # depends on the lane
    pure: set[UOp] = set()       # integer/boolean math of ranges and constants only (no loads, no reduces)
    for n in topo:  # a reduce over r itself is one value for all lanes
        if (n is rng or any(s in dep for s in n.src)) and not (n.op is Ops.REDUCE and rng in n.src[1:]): dep.add(n)
        if n.op in (Ops.RANGE, Ops.CONST, Ops.DEFINE_VAR) or \
                (n.op in GroupOp.ALU and all(s in pure for s in n.src) and (dtypes.is_int(n.dtype) or dtypes.is_bool(n.dtype))):
            pure.add(n)
    lanes_memo: dict[UOp, list[UOp]] = {}

    def lanes(n: UOp) -> list[UOp]:
        """n's scalar value in each lane (n pure index math)."""
        if n not in lanes_memo: lanes_memo[n] = [simplify(substitute(n, s)) for s in lane_subs]
        return lanes_memo[n]

    new: dict[UOp, UOp] = {}
    out_stores: list[UOp] = []

    def access(idx: UOp) -> tuple[str, list[UOp], list[UOp]]:
        """('vector', [base index], gates) | ('scalar', [index], gates) | ('gather', per-lane indices, gates)."""
        gate = idx.src[2] if len(idx.src) > 2 else None
        if gate is not None and gate in dep:
            return "gather", lanes(idx.src[1]), lanes(gate)
        gates = [new[gate]] if gate is not None else []
        if idx.src[1] not in dep: return "scalar", [new[idx.src[1]]], gates
        ls = lanes(idx.src[1])
        return ("vector", ls[:1], gates) if lane_step(ls) == 1 else ("gather", ls, gates * width)

    for n in topo:
        if n.op is Ops.REDUCE and rng in n.src[1:]:  # vector partial sums over the outer range, then across the lanes
            val = broadcast(new[n.src[0]], width)
            rngs = tuple(outer if r is rng else new[r] for r in n.src[1:] if r is not rng or outer is not None)
            part = UOp(Ops.REDUCE, val.dtype, (val, *rngs), n.arg) if rngs else val
            acc = UOp(Ops.GEP, n.dtype, (part,), 0)
            for i in range(1, width): acc = UOp(n.arg, n.dtype, (acc, UOp(Ops.GEP, n.dtype, (part,), i)))
            new[n] = acc
        elif n not in dep:
            new[n] = n.replace(src=tuple(new[s] for s in n.src)) if n.src else n
        elif n in pure:
            new[n] = UOp(Ops.VECTORIZE, n.dtype.vec(width), tuple(lanes(n)))
        elif n.op is Ops.INDEX:
            continue  # built by its LOAD/STORE
        elif n.op is Ops.LOAD:
            idx = n.src[0]
            kind, ixs, gates = access(idx)
            buf = new[idx.src[0]]
            if kind == "vector":
                new[n] = UOp(Ops.LOAD, n.dtype.vec(width), (UOp(Ops.INDEX, n.dtype.vec(width), (buf, ixs[0], *gates)),))
            else:
                loads = [UOp(Ops.LOAD, n.dtype, (UOp(Ops.INDEX, n.dtype, (buf, ix, *gates[i:i + 1])),))
                         for i, ix in enumerate(ixs)]
                new[n] = UOp(Ops.VECTORIZE, n.dtype.vec(width), tuple(loads))
        elif n.op is Ops.STORE:
            idx, val = n.src[0], new[n.src[1]]
            kind, ixs, gates = access(idx) if idx in dep else ("scalar", [new[idx.src[1]]], list(map(new.get, idx.src[2:])))
            buf = new[idx.src[0]]
            if kind == "vector":
                new[n] = UOp(Ops.STORE, n.dtype, (UOp(Ops.INDEX, val.dtype.vec(width) if val.dtype.count == 1 else val.dtype,
                                                      (buf, ixs[0], *gates)), broadcast(val, width)))
            elif kind == "scalar":  # every lane writes the same address: the last lane's value wins, as in the loop
                v = UOp(Ops.GEP, val.dtype.scalar(), (val,), width - 1) if val.dtype.count > 1 else val
                new[n] = UOp(Ops.STORE, n.dtype, (UOp(Ops.INDEX, v.dtype, (buf, ixs[0], *gates)), v))
            else:
                stores = []
                for i, ix in enumerate(ixs):
                    v = UOp(Ops.GEP, val.dtype.scalar(), (val,), i) if val.dtype.count > 1 else val
                    stores.append(UOp(Ops.STORE, n.dtype, (UOp(Ops.INDEX, v.dtype, (buf, ix, *gates[i:i + 1])), v)))
                out_stores.extend(stores[:-1])
                new[n] = stores[-1]
        elif n.op is Ops.REDUCE:
            val = broadcast(new[n.src[0]], width)
            new[n] = UOp(Ops.REDUCE, val.dtype, (val, *(new[r] for r in n.src[1:])), n.arg)
        elif n.op in GroupOp.ALU or n.op in (Ops.CAST, Ops.BITCAST):
            new[n] = UOp(n.op, n.dtype.vec(width), tuple(broadcast(new[s], width) for s in n.src), n.arg)
        elif n.op is Ops.SINK:
            new[n] = n.replace(src=tuple(out_stores) + tuple(new[s] for s in n.src))
        else:
            raise ValueError(f"VECTORIZE can't vectorize {n.op}")
    return new[ast]
