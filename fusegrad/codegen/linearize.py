"""Linearize: kernel AST (a DAG with RANGE and REDUCE nodes) -> the linear program, a flat list of primitive ops.

Loops are placed from data dependencies alone. Every node depends on a set of RANGEs; the output RANGEs nest in order,
and a REDUCE's own RANGEs nest under the deepest output RANGE its value depends on. A node is emitted in the loop of the
deepest RANGE it depends on, so loop-invariant work (a row's max in softmax, a bias load) is hoisted automatically.
A REDUCE becomes a register accumulator: init before its loops, update in the innermost one, read after them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fusegrad.dtype import dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp


# the arg of the nodes UNROLL (codegen/opt.py) combines a reduce's copies with: the accumulator takes them one by one
UNROLLED = "unrolled"


@dataclass
class Estimates:
    ops: int = 0    # ALU operations on data, loop trip counts included
    mem: int = 0    # bytes of the buffers the kernel touches


def trip_count(r: UOp) -> int:
    """Iterations of a RANGE (or work-items of a SPECIAL); a symbolic size counts at its largest value (estimates)."""
    return int(r.src[0].arg) if r.src[0].op is Ops.CONST else int(r.src[0].vmax)


def reduce_identity(op: Ops, dtype: object) -> float | int | bool:
    if op is Ops.ADD: return 0
    if op is Ops.MUL: return 1
    return dtypes.min(dtype.scalar())  # type: ignore[union-attr]


class Linearizer:
    def __init__(self, ast: UOp):
        self.ast = ast
        self.topo = list(ast.toposort())
        # the ranges each node depends on. Reduces over the same ranges share one loop nest (one accumulator each),
        # so each of them depends on what any of them does: an upcast copy can depend on fewer ranges than its
        # siblings (one whose loads a pad masks out entirely), yet it is computed in their loop
        context: dict[tuple[UOp, ...], frozenset[UOp]] = {}
        while True:
            self.ranges_of: dict[UOp, frozenset[UOp]] = {}
            for n in self.topo:
                if n.op is Ops.RANGE: self.ranges_of[n] = frozenset([n])
                else:
                    rs = frozenset().union(*[self.ranges_of[s] for s in n.src]) if n.src else frozenset()
                    self.ranges_of[n] = rs - frozenset(n.src[1:]) | context.get(n.src[1:], frozenset()) \
                        if n.op is Ops.REDUCE else rs
            reduces = [n for n in self.topo if n.op is Ops.REDUCE]
            grown = dict(context)
            for n in reduces: grown[n.src[1:]] = grown.get(n.src[1:], frozenset()) | self.ranges_of[n]
            done = all(self.ranges_of[n] == grown[n.src[1:]] for n in reduces)
            context = grown
            if done: break
        # the loop tree: output ranges nest in id order; a reduce's ranges nest under its deepest context range
        self.parent: dict[UOp, UOp | None] = {}
        self.depth: dict[UOp | None, int] = {None: 0}
        glob = sorted((n for n in self.topo if n.op is Ops.RANGE and n.arg[1] != "reduce"), key=lambda r: r.arg[0])
        self._chain(glob, None)
        for key, rs in context.items():
            if key[0] not in self.parent: self._chain(list(key), self.deepest(rs))
        self.block = {n: self.deepest(self.ranges_of[n]) for n in self.topo}
        self.out: list[UOp] = []
        self.val: dict[UOp, UOp] = {}
        self.mult = 1  # trip count of the loops around what is emitted; work-item ids (SPECIAL) count as loops
        for n in self.topo:
            if n.op is Ops.SPECIAL: self.mult *= trip_count(n)
        self.est = Estimates()
        self.n_acc = 0
        self.data_dep: set[UOp] = set()
        self.users = Counter(s for n in self.topo for s in dict.fromkeys(n.src))
        self.folded: set[UOp] = set()   # UNROLLED chains the accumulator update replaces (unrolled_parts)
        for n in self.topo:
            if n.op is Ops.REDUCE: self.unrolled_parts(n)

    def _chain(self, ranges: list[UOp], parent: UOp | None) -> None:
        for r in ranges:
            if r in self.parent: raise RuntimeError(f"range {r} is used by two reduces")
            self.parent[r], self.depth[r] = parent, self.depth[parent] + 1
            parent = r

    def _under(self, r: UOp | None, ancestors: set[UOp]) -> bool:
        while r is not None:
            if r in ancestors: return True
            r = self.parent[r]
        return False

    def unrolled_parts(self, red: UOp) -> list[UOp]:
        """The values a reduce adds to its accumulator in one loop trip: UNROLL's k copies of its body, which it
        combined with the reduce op into a chain of nodes marked UNROLLED ((v0 + v1) + v2 ...), each used by that
        chain alone; else the one value. The chain's own nodes are not emitted (`folded`): acc + v0 + v1 ... is
        the order of the loop before UNROLL, and each add is an FMA with its product (acc + (v0 + v1 ...) took a
        multiply and an add more for every k products: 18% of a 5x5 convolution's time on AVX2)."""
        parts, x = [], red.src[0]
        while x.op is red.arg and x.arg == UNROLLED and self.users.get(x, 0) == 1:
            self.folded.add(x)
            parts, x = [x.src[1]] + parts, x.src[0]
        return [x] + parts

    def deepest(self, rs: frozenset[UOp]) -> UOp | None:
        return max(rs, key=lambda r: self.depth[r]) if rs else None

    # ----- emission -----
    def push(self, u: UOp) -> UOp:
        self.out.append(u)
        if u.op in GroupOp.ALU and u in self.data_dep: self.est.ops += self.mult * u.dtype.count
        return u

    def emit_node(self, n: UOp) -> None:
        if n.op is Ops.REDUCE: return self.emit_reduce(n)
        new = n.replace(src=tuple(self.val[s] for s in n.src)) if n.src else n
        if n.op in (Ops.LOAD,) or any(s in self.data_dep for s in n.src): self.data_dep.add(new)
        self.val[n] = self.push(new)

    def emit_block(self, b: UOp | None) -> None:
        for n in self.topo:
            if self.block[n] is b and n not in self.val and n.op is not Ops.RANGE and n is not self.ast and \
                    n not in self.folded:
                self.emit_node(n)
        for r, p in self.parent.items():
            if p is b and r.arg[1] != "reduce": self.emit_loop(r, lambda r=r: self.emit_block(r))

    def emit_loop(self, r: UOp, body: "object") -> None:
        self.val[r] = self.push(r)
        size = trip_count(r)
        self.mult *= size
        body()  # type: ignore[operator]
        self.mult //= size
        self.push(UOp(Ops.END, dtypes.void, (r,)))

    def emit_reduce(self, red: UOp) -> None:
        """Every not-yet-emitted reduce over the same ranges joins this loop nest: one accumulator each, so upcast
        outputs share the loads they have in common."""
        rngs = list(red.src[1:])
        group = [n for n in self.topo if n.op is Ops.REDUCE and n not in self.val and list(n.src[1:]) == rngs
                 and self.block[n] is self.block[red]]
        # whatever the bodies need from outside the loops comes first (another row's max, say, for an upcast softmax)
        inside = set(rngs)
        for r in group:
            for n in r.src[0].toposort():
                if n not in self.val and n not in self.folded and n.op is not Ops.RANGE and \
                        self.block[n] not in inside and \
                        not (self.block[n] is not None and self._under(self.block[n], inside)):
                    self.emit_node(n)
        slots, inits = [], []
        for r in group:
            acc = self.push(UOp(Ops.DEFINE_REG, r.dtype.ptr(1, "reg"), (), self.n_acc))
            self.n_acc += 1
            zero, ident = UOp.const(dtypes.int32, 0), UOp.const(r.dtype, reduce_identity(r.arg, r.dtype))  # vector consts broadcast
            for c in (zero, ident):
                if c not in self.val: self.val[c] = self.push(c)
            slots.append(self.push(UOp(Ops.INDEX, r.dtype, (acc, zero))))
            inits.append(self.push(UOp(Ops.STORE, dtypes.void, (slots[-1], ident))))

        def body(i: int) -> None:
            rg = rngs[i]
            if i + 1 < len(rngs):
                for n in self.topo:
                    if self.block[n] is rg and n not in self.val and n.op is not Ops.RANGE: self.emit_node(n)
                return self.emit_loop(rngs[i + 1], lambda: body(i + 1))
            # innermost loop: each accumulator is updated right after the value it adds is computed, so an operand
            # is live only while it is used (a register tile's broadcast row serves its few FMAs, then its register
            # is free: AVX2's 16 registers hold a 6 x 2 tile's 12 accumulators without spills)
            for r, slot, init in zip(group, slots, inits):
                cur = self.push(UOp(Ops.LOAD, r.dtype, (slot, init)))
                for part in self.unrolled_parts(r):   # UNROLL's copies: added one by one, each right after its value
                    for n in part.toposort():
                        if self.block[n] is rg and n not in self.val and n.op is not Ops.RANGE: self.emit_node(n)
                    cur = UOp(r.arg, r.dtype, (cur, self.val[part]))
                    self.data_dep.add(cur)
                    self.push(cur)
                self.push(UOp(Ops.STORE, dtypes.void, (slot, cur)))
            for n in self.topo:
                if self.block[n] is rg and n not in self.val and n.op is not Ops.RANGE and n not in self.folded:
                    self.emit_node(n)
        if rngs: self.emit_loop(rngs[0], lambda: body(0))
        end = self.out[-1]
        for r, slot in zip(group, slots):
            res = UOp(Ops.LOAD, r.dtype, (slot, end))
            self.data_dep.add(res)
            self.val[r] = self.push(res)

    def run(self) -> tuple[list[UOp], Estimates]:
        params = sorted((n for n in self.topo if n.op is Ops.PARAM), key=lambda p: p.arg)
        for p in params:
            self.val[p] = self.push(p)
            self.est.mem += p.dtype.size * p.dtype.itemsize
        self.emit_block(None)
        return self.out, self.est


def linearize(ast: UOp) -> tuple[list[UOp], Estimates]:
    return Linearizer(ast).run()
