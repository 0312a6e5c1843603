"""8-bit dot products: a pass after the optimizations (VECTORIZE), before widening narrow vectors, for renderers with
an instruction or two that multiply bytes and add each 4 adjacent products into an int32 lane (`Renderer.dot4_lanes`:
x86 VNNI's `vpdpbusd`, unsigned bytes times signed bytes, or AVX2's `vpmaddubsw` + `vpmaddwd`, exact while the
unsigned bytes stay under `Renderer.dot4_max_unsigned`, 127: `unsigned_bound` follows the masks and shifts that
unpack them).

A reduce over a vectorized range keeps a vector of partial sums and adds its lanes at the end (codegen/vectorize.py),
so only the sum of those lanes matters and the lanes may be regrouped. Where the summed value is built as

    S * float(int32(a_1) * int32(b_1) + int32(a_2) * int32(b_2) + ...)

(S the same in every lane, each a_t a vector of unsigned bytes and b_t of signed bytes, w lanes: a quantized weight's
values and an activation quantized to 8 bits, models/quantized.py), or as a sum of such terms, each 4 adjacent lanes
become one lane of Ops.DOT4 and the float vector has w/4 lanes:

    S * float(DOT4(DOT4(0, a_1, b_1), a_2, b_2))

Two terms of w lanes each (a 4- or 5-bit block's low and high nibble halves, 16 bytes each) are paired where the
renderer has twice the lanes: one DOT4 of 2 * w/4 lanes on both halves side by side (`concat`), so a 32-value block is
one 256-bit dot product instead of two 128-bit ones.

The integer sums are exact either way; the float sum is reassociated (S times the sum of 4 products instead of the sum
of the 4 products times S), as any vectorized float reduce is. Without such an instruction nothing changes: the
products are int32 vector multiplies (widen.py), correct on every backend.
"""
from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute
from fusegrad.ir.symbolic import split_terms
from fusegrad.renderer import Renderer


def _uniform(x: UOp) -> UOp | None:
    """The one scalar a broadcast vector holds (VECTORIZE of one value in every lane), else None."""
    if x.op is Ops.VECTORIZE and all(s is x.src[0] for s in x.src): return x.src[0]
    return None


def _byte_vector(x: UOp) -> bool:
    return x.dtype.count > 1 and x.dtype.scalar() in (dtypes.uint8, dtypes.int8)


def _const_lanes(x: UOp) -> int | None:
    """The one integer constant in every lane of x, else None."""
    if x.op is Ops.VECTORIZE and all(s is x.src[0] for s in x.src): x = x.src[0]
    return int(x.arg) if x.op is Ops.CONST and isinstance(x.arg, int) else None


def unsigned_bound(x: UOp) -> int:
    """An upper bound of the lanes of x, an unsigned byte vector: a mask by a constant, a right shift by one, an OR
    of bounded values; 255 for anything else (a load)."""
    if x.op is Ops.AND:
        cs = [c for s in x.src if (c := _const_lanes(s)) is not None and c >= 0]
        return min([*cs, *(unsigned_bound(s) for s in x.src)])
    if x.op is Ops.SHR and (k := _const_lanes(x.src[1])) is not None and 0 <= k < 8:
        return unsigned_bound(x.src[0]) >> k
    if x.op is Ops.OR: return (1 << max(unsigned_bound(s) for s in x.src).bit_length()) - 1
    if x.op is Ops.CONST or (x.op is Ops.VECTORIZE and all(s.op is Ops.CONST for s in x.src)):
        return max(int(s.arg) for s in (x.src if x.op is Ops.VECTORIZE else (x,)))
    return 255


def dot_product_kernel(nodes: list[UOp]) -> bool:
    """Whether a kernel multiplies unsigned bytes by signed ones in int32 (the form dot4.py contracts): the heuristic
    then sizes its vectors by the bytes (codegen/opt.py)."""
    def byte(x: UOp, dt) -> bool: return x.op is Ops.CAST and x.src[0].dtype.scalar() == dt
    return any(n.op is Ops.MUL and n.dtype.scalar() == dtypes.int32 and
               ((byte(n.src[0], dtypes.uint8) and byte(n.src[1], dtypes.int8)) or
                (byte(n.src[0], dtypes.int8) and byte(n.src[1], dtypes.uint8))) for n in nodes)


class _Contract:
    """The w/4-lane value whose lane sum equals a w-lane value's lane sum, built of DOT4s (None where the value
    isn't of the dot-product form)."""

    def __init__(self, lanes: tuple[int, ...], max_unsigned: int):
        self.lanes, self.max_unsigned, self.memo = lanes, max_unsigned, {}

    def products(self, x: UOp) -> list[tuple[UOp, UOp]] | None:
        """x, an int32 vector, as a sum of products of byte vectors [(unsigned a, signed b), ...]."""
        if x.op is Ops.ADD:
            a, b = self.products(x.src[0]), self.products(x.src[1])
            return None if a is None or b is None else a + b
        if x.op is not Ops.MUL or not all(s.op is Ops.CAST and _byte_vector(s.src[0]) for s in x.src): return None
        p, q = x.src[0].src[0], x.src[1].src[0]
        if p.dtype.scalar() == dtypes.int8: p, q = q, p
        if p.dtype.scalar() != dtypes.uint8 or q.dtype.scalar() != dtypes.int8: return None
        if unsigned_bound(p) > self.max_unsigned: return None   # AVX2's pairs of products would saturate
        return [(p, q)]

    def __call__(self, x: UOp) -> UOp | None:
        if x not in self.memo: self.memo[x] = self.build(x)
        return self.memo[x]

    def build(self, x: UOp) -> UOp | None:
        w = x.dtype.count
        if w % 4 or w // 4 not in self.lanes: return None
        n = w // 4
        if x.op is Ops.ADD:
            a, b = self(x.src[0]), self(x.src[1])
            if a is None or b is None or a.dtype != b.dtype: return None   # (both halves paired, or neither)
            return UOp(Ops.ADD, a.dtype, (a, b))
        if x.op is Ops.MUL and dtypes.is_float(x.dtype):
            for s, v in ((x.src[0], x.src[1]), (x.src[1], x.src[0])):
                if (one := _uniform(s)) is not None and (c := self(v)) is not None:
                    return UOp(Ops.MUL, c.dtype, (UOp(Ops.VECTORIZE, c.dtype, (one,) * c.dtype.count), c))
            return None
        if x.op is Ops.CAST and dtypes.is_float(x.dtype) and x.src[0].dtype.scalar() == dtypes.int32:
            terms = self.products(x.src[0])
            if not terms: return None
            if len(terms) % 2 == 0 and 2 * n in self.lanes:   # two terms' bytes side by side: one instruction
                terms = [(concat(a1, a2), concat(b1, b2)) for (a1, b1), (a2, b2) in zip(terms[::2], terms[1::2])]
                n *= 2
            acc = UOp(Ops.VECTORIZE, dtypes.int32.vec(n), (UOp.const(dtypes.int32, 0),) * n)
            for a, b in terms: acc = UOp(Ops.DOT4, acc.dtype, (acc, a, b))
            return UOp(Ops.CAST, x.dtype.scalar().vec(n), (acc,))
        return None


def _adjacent_loads(a: UOp, b: UOp) -> UOp | None:
    """One load of a's and b's lanes when b is the ungated vector load right after a's from the same buffer (an
    activation block's two 16-byte halves: one 32-byte load instead of two loads and a shuffle, 10% of a Q4_1 matvec
    on AVX2), else None."""
    if not (a.op is b.op is Ops.LOAD and len(a.src) == len(b.src) == 1): return None
    ia, ib = a.src[0], b.src[0]
    if not (ia.op is ib.op is Ops.INDEX and len(ia.src) == len(ib.src) == 2 and ia.src[0] is ib.src[0]
            and ia.dtype == a.dtype and ib.dtype == b.dtype and a.dtype == b.dtype): return None
    (ta, ca), (tb, cb) = split_terms(ia.src[1]), split_terms(ib.src[1])
    if ta != tb or cb - ca != a.dtype.count: return None
    wide = a.dtype.scalar().vec(2 * a.dtype.count)
    return UOp(Ops.LOAD, wide, (UOp(Ops.INDEX, wide, ia.src),))


def concat(a: UOp, b: UOp) -> UOp:
    """The vector of a's lanes then b's: one load where they are adjacent loads (`_adjacent_loads`), else a VECTORIZE
    of their GEPs (the C renderer makes it one shuffle)."""
    if (load := _adjacent_loads(a, b)) is not None: return load
    lanes = [UOp(Ops.GEP, x.dtype.scalar(), (x,), i) for x in (a, b) for i in range(x.dtype.count)]
    return UOp(Ops.VECTORIZE, a.dtype.scalar().vec(len(lanes)), tuple(lanes))


def _sum_leaves(t: UOp, users: dict[UOp, int]) -> tuple[list[UOp], list[UOp]]:
    """The addends of a sum and the ADDs between: t's operands, and theirs through ADDs used only there."""
    out, inner, todo = [], [], [t]
    while todo:
        x = todo.pop()
        for s in x.src:
            if s.op is Ops.ADD and users.get(s, 0) == 1 and s.dtype == t.dtype: todo.append(s)
            else: out.append(s)
        inner.append(x)
    return out, inner


def contract_dot4(ast: UOp, renderer: Renderer) -> UOp:
    """Every horizontally summed vector of the dot-product form (module docstring) -> DOT4s with a quarter of the
    lanes, where the renderer has them for that many lanes."""
    lanes = renderer.dot4_lanes()
    if not lanes: return ast
    topo = list(ast.toposort())
    if not any(n.op is Ops.CAST and _byte_vector(n.src[0]) for n in topo): return ast
    users: dict[UOp, int] = {}
    for n in topo:
        for s in n.src: users[s] = users.get(s, 0) + 1
    contract = _Contract(lanes, renderer.dot4_max_unsigned())
    mapping: dict[UOp, UOp] = {}
    inside: set[UOp] = set()
    for t in reversed(topo):   # the outermost sum first: the ADDs within it aren't sums of their own
        # a sum whose addends include every lane of one vector v, each once, and nothing else reads v's lanes
        if t.op is not Ops.ADD or t.dtype.count != 1 or t in inside: continue
        leaves, adds = _sum_leaves(t, users)
        geps = [x for x in leaves if x.op is Ops.GEP]
        if not geps: continue
        v = geps[0].src[0]
        mine = [x for x in geps if x.src[0] is v]
        w = v.dtype.count
        if sorted(x.arg for x in mine) != list(range(w)) or users.get(v, 0) != w or \
                any(users.get(x, 0) != 1 for x in mine):
            continue
        if v.op is Ops.REDUCE and v.arg is Ops.ADD:
            val = contract(v.src[0])
            new_v = None if val is None else UOp(Ops.REDUCE, val.dtype, (val, *v.src[1:]), Ops.ADD)
        else: new_v = contract(v)
        if new_v is None: continue
        total = UOp(Ops.GEP, t.dtype, (new_v,), 0)
        for i in range(1, new_v.dtype.count): total = UOp(Ops.ADD, t.dtype, (total, UOp(Ops.GEP, t.dtype, (new_v,), i)))
        for x in leaves:
            if not (x.op is Ops.GEP and x.src[0] is v): total = UOp(Ops.ADD, t.dtype, (total, x))
        mapping[t] = total
        inside.update(adds)
    return substitute(ast, mapping) if mapping else ast


__all__ = ["contract_dot4", "dot_product_kernel", "unsigned_bound"]
