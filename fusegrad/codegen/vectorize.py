"""VECTORIZE(r, w): run w consecutive iterations of range r as the w lanes of SIMD vectors.

The range is split into an outer range of n/w and a lane index 0..w-1. Every value that depends on the lane becomes a
vector of w elements; values that don't stay scalar (one load of a row's bias, not w). How each node becomes a vector:

- index math (integers and booleans computed from ranges only): one simplified scalar expression per lane, gathered
  into a VECTORIZE; where only its lane-0 value matters (a contiguous address) only that one is kept.
- a LOAD or STORE whose address is `base + lane` in every lane (and whose gate doesn't depend on the lane) becomes one
  vector load/store at `base`; any other address pattern is w scalar accesses (a gather/scatter).
- a LOAD at `base + lane` whose gate does depend on the lane (a padded conv's input near the border) becomes a masked
  vector load where the renderer has one (`masked_loads`) and the gate is an interval of lanes (an AND of comparisons
  of addresses affine in the lane, see `interval_gate`): INDEX(buf, base, all, lanes) with `all` the gate of the first
  and last lane (then every lane is in) and `lanes` the per-lane gates; the renderer loads the whole vector when `all`
  holds and lane by lane otherwise, so no lane outside the gate is ever read.
- a LOAD at `base + 2 * lane` (a stride-2 conv's input) takes the same form with the INDEX's arg 2: the whole side reads
  the 2w elements from `base` as two vectors and keeps the even ones, so `all` also asks that the last of them,
  `base + 2w - 1`, is inside the buffer (it is one past the last lane's element).
- ALU ops on vectors: scalar operands are broadcast; the renderer uses the target's vector ops where it has them.
- a REDUCE over other ranges accumulates a vector (w accumulators in one register); a REDUCE over r itself accumulates a
  vector over the outer range and sums its lanes at the end (a horizontal reduction).
"""
from __future__ import annotations

import math
from collections.abc import Callable

from fusegrad.dtype import PtrDType, dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import substitute_each
from fusegrad.ir.symbolic import simplify, split_terms


def close_reduce(op: Ops, acc: UOp) -> UOp:
    """The result of a reduce written out without a loop accumulator (a fully unrolled range, the lanes of a
    horizontal sum). A loop's float sum starts from +0.0 (torch's too), so a sum of -0.0s is +0.0; `acc + 0.0` gives
    exactly that (it only turns a -0.0 total into +0.0) and, added last, leaves the sum's own adds free to contract
    into fused multiply-adds."""
    if op is Ops.ADD and dtypes.is_float(acc.dtype): return UOp(Ops.ADD, acc.dtype, (acc, UOp.const(acc.dtype, 0.0)))
    return acc


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


def interval_gate(gate: UOp, rng: UOp) -> bool:
    """Whether the lanes of `rng` that `gate` lets through always form one interval: `gate` is an AND of comparisons
    `a < b` of integers affine in `rng` (each comparison then flips at most once along the range). A gate true at both
    ends of a run of lanes is then true in all of it."""
    if rng not in gate.toposort(): return True
    if gate.op is Ops.AND and dtypes.is_bool(gate.dtype): return all(interval_gate(s, rng) for s in gate.src)
    if gate.op is Ops.CMPLT and dtypes.is_int(gate.src[0].dtype):
        return all(_affine_in(s, rng) for s in gate.src)
    return False


def _affine_in(x: UOp, rng: UOp) -> bool:
    """x = c * rng + (terms free of rng): rng a plain term of the sum, nowhere else (not under a div, a mod, a gate)."""
    if rng not in x.toposort(): return True
    terms, _ = split_terms(x)
    return rng in terms and all(rng not in t.toposort() for t in terms if t is not rng)


def _masked_by(x: UOp, gate: UOp) -> bool:
    """x is a masked vector load whose per-lane gates are `gate`."""
    return x.op is Ops.LOAD and len(x.src[0].src) == 4 and x.src[0].src[3] is gate


class _Vectors(dict):
    """The vectorized node of each original node; a missing one is built by `make` (None: a KeyError, as in a dict)."""
    def __init__(self, make: Callable[[UOp], UOp | None]) -> None:
        super().__init__()
        self.make = make

    def __missing__(self, n: UOp) -> UOp:
        if (v := self.make(n)) is None: raise KeyError(n)
        self[n] = v
        return v


def vectorize_range(ast: UOp, rng: UOp, width: int, masked_loads: bool = False) -> UOp:
    size = int(rng.src[0].arg)
    if size % width: raise ValueError(f"VECTORIZE: width {width} must divide the range size {size}")
    outer = UOp.range(size // width, rng.arg[0], rng.arg[1]) if size // width > 1 else None
    base = outer * width if outer is not None else UOp.const(rng.dtype, 0)
    lane_values = [simplify(base + i) for i in range(width)]
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
        if n not in lanes_memo: lanes_memo[n] = [simplify(x) for x in substitute_each(n, rng, lane_values)]
        return lanes_memo[n]

    # lane-dependent index math becomes a VECTORIZE of its lanes only where a vector consumer reads it: an inner node of
    # an index expression is folded into its parent's lanes, so building (and simplifying) its own would be wasted
    def lane_vector(n: UOp) -> UOp:
        """n's lanes as a vector: an integer base + lane constants (the same terms in every lane, only the constant
        differs: `j*8 + l`) is the broadcast base plus a constant vector, one vector add rather than a vector built
        lane by lane each time the base changes."""
        ls = lanes(n)
        if dtypes.is_int(n.dtype) and n.dtype.count == 1 and all(x.op is not Ops.CONST for x in ls):
            t0, c0 = split_terms(ls[0])
            split = [split_terms(x) for x in ls[1:]]
            if all(t == t0 for t, _ in split):
                offs = (UOp.const(n.dtype, 0),) + tuple(UOp.const(n.dtype, c - c0) for _, c in split)
                vec = n.dtype.vec(width)
                return UOp(Ops.ADD, vec, (broadcast(ls[0], width), UOp(Ops.VECTORIZE, vec, offs)))
        return UOp(Ops.VECTORIZE, n.dtype.vec(width), tuple(ls))
    new = _Vectors(lambda n: lane_vector(n) if n in pure and n in dep else None)
    out_stores: list[UOp] = []

    def access(idx: UOp, load: bool = False) -> tuple[str, list[UOp], list[UOp]]:
        """('vector', [base index], gates) | ('scalar', [index], gates) | ('gather', per-lane indices, gates) |
        ('masked', [base index, lane step], [gate of all lanes, per-lane gates as a vector]) (loads only)."""
        gate = idx.src[2] if len(idx.src) > 2 else None
        gs = lanes(gate) if gate is not None and gate in dep else None
        if gs is not None and all(g is gs[0] for g in gs): one, gs = [gs[0]], None   # the same in every lane after all
        else: one = [new[gate]] if gate is not None and gs is None else []
        if gs is None and idx.src[1] not in dep: return "scalar", [new[idx.src[1]]], one
        ls = lanes(idx.src[1])
        step = lane_step(ls)
        if gs is None and step == 1: return "vector", ls[:1], one
        size = idx.src[0].dtype.size if isinstance(idx.src[0].dtype, PtrDType) else -1
        if load and masked_loads and (step == 1 or (step == 2 and size > 0)) and \
                (gs is None or (gate in pure and interval_gate(gate, rng))):
            conds = [gs[0], gs[-1]] if gs is not None else list(one)
            if step == 2: conds.append(UOp(Ops.CMPLT, dtypes.bool, (ls[0] + (2 * width - 1), UOp.const(ls[0].dtype, size))))
            every = conds[0]
            for c in conds[1:]: every = UOp(Ops.AND, dtypes.bool, (every, c))
            per_lane = UOp(Ops.VECTORIZE, dtypes.bool.vec(width), tuple(gs) if gs is not None else
                           (one[0] if one else UOp.const(dtypes.bool, True),) * width)
            return "masked", [ls[0], UOp.const(ls[0].dtype, step)], [simplify(every), per_lane]
        return "gather", ls, gs if gs is not None else one * width

    for n in topo:
        if n.op is Ops.REDUCE and rng in n.src[1:]:  # vector partial sums over the outer range, then across the lanes
            val = broadcast(new[n.src[0]], width)
            rngs = tuple(outer if r is rng else new[r] for r in n.src[1:] if r is not rng or outer is not None)
            part = UOp(Ops.REDUCE, val.dtype, (val, *rngs), n.arg) if rngs else val
            acc = UOp(Ops.GEP, n.dtype, (part,), 0)
            for i in range(1, width): acc = UOp(n.arg, n.dtype, (acc, UOp(Ops.GEP, n.dtype, (part,), i)))
            new[n] = acc if rngs else close_reduce(n.arg, acc)   # no loop accumulator before the lanes
        elif n not in dep:
            new[n] = n.replace(src=tuple(new[s] for s in n.src)) if n.src else n
        elif n in pure:
            continue  # built when first read (`_Vectors`)
        elif n.op is Ops.INDEX:
            continue  # built by its LOAD/STORE
        elif n.op is Ops.LOAD:
            idx = n.src[0]
            kind, ixs, gates = access(idx, load=True)
            buf = new[idx.src[0]]
            if kind in ("vector", "masked"):
                new[n] = UOp(Ops.LOAD, n.dtype.vec(width), (UOp(Ops.INDEX, n.dtype.vec(width), (buf, ixs[0], *gates),
                                                                 ixs[1].arg if kind == "masked" else None),))
            elif kind == "scalar":   # one address for all lanes (and one gate, the same in every lane): read once
                new[n] = broadcast(UOp(Ops.LOAD, n.dtype, (UOp(Ops.INDEX, n.dtype, (buf, ixs[0], *gates)),)), width)
            else:
                loads = [UOp(Ops.LOAD, n.dtype, (UOp(Ops.INDEX, n.dtype, (buf, ix, *gates[i:i + 1])),))
                         for i, ix in enumerate(ixs)]
                new[n] = UOp(Ops.VECTORIZE, n.dtype.vec(width), tuple(loads))
        elif n.op is Ops.STORE:
            idx, val = n.src[0], new[n.src[1]]
            kind, ixs, gates = access(idx) if idx in dep else ("scalar", [new[idx.src[1]]], [new[g] for g in idx.src[2:]])
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
        elif n.op is Ops.WHERE and _masked_by(new[n.src[1]], new[n.src[0]]) and n.src[2].op is Ops.CONST and \
                n.src[2].arg == 0 and math.copysign(1.0, n.src[2].arg) > 0:
            new[n] = new[n.src[1]]   # WHERE(g, load gated by g, 0): the masked load's lanes outside g are zero already
        elif n.op in GroupOp.ALU or n.op in (Ops.CAST, Ops.BITCAST):
            new[n] = UOp(n.op, n.dtype.vec(width), tuple(broadcast(new[s], width) for s in n.src), n.arg)
        elif n.op is Ops.SINK:
            new[n] = n.replace(src=tuple(out_stores) + tuple(new[s] for s in n.src))
        else:
            raise ValueError(f"VECTORIZE can't vectorize {n.op}")
    return new[ast]
