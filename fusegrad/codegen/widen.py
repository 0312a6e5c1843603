"""Narrow integer vectors (8- and 16-bit lanes) compute in int32 lanes on targets that ask for it
(`Renderer.widen_narrow_vectors`): a pass over the kernel after the optimizations (VECTORIZE), before linearizing.

GCC 12 compiles two things on such vectors lane by lane: a conversion of `unsigned char`/`signed char`/16-bit lanes to
float (`__builtin_convertvector(uchar16 -> float16)` is one scalar `vcvtusi2ss` per lane) and 8-bit vector shifts
(x86 has none). Through int32 lanes both are whole-vector instructions: a widening move (`vpmovzxbd`, `vpmovsxbd`) then
`vcvtdq2ps`, and 32-bit shifts. So every vector CAST out of a narrow integer type gets its operand rewritten in int32
lanes: the loads (and any operand it can't follow) are widened where they enter, and the integer ops between them and
the cast run on the widened lanes. AND, OR, XOR and right shifts of zero- or sign-extended values are the extended
narrow results; a left shift, sum or product is too while its value fits the narrow type, which the pass tracks as an
interval per lane, and where it could leave it (a wraparound) the int32 lanes are wrapped as the narrow type would:
the low bits kept (AND with 0xff), sign-extended for a signed type (shifted up and arithmetically back).
"""
from __future__ import annotations

from fusegrad.dtype import DType, dtypes
from fusegrad.ir.alu import cast_value
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute

_EXACT = (Ops.AND, Ops.OR, Ops.XOR, Ops.SHR, Ops.SHL, Ops.ADD, Ops.MUL)


def _narrow(dt: DType) -> bool:
    """A vector of 8- or 16-bit integer lanes."""
    return dt.count > 1 and dtypes.is_int(dt) and dt.scalar().itemsize < 4


def _pow2_above(x: int) -> int:
    return 1 << max(int(x), 0).bit_length()


class _Widen:
    """int32 lanes (and their interval of values) for narrow-int vector expressions, memoized per node."""
    def __init__(self) -> None:
        self.memo: dict[UOp, tuple[UOp, int, int]] = {}

    def leaf(self, x: UOp) -> tuple[UOp, int, int]:
        """x converted as a whole: the full range of its lane type."""
        s = x.dtype.scalar()
        return UOp(Ops.CAST, dtypes.int32.vec(x.dtype.count), (x,)), int(dtypes.min(s)), int(dtypes.max(s))

    def __call__(self, x: UOp) -> tuple[UOp, int, int]:
        if x not in self.memo: self.memo[x] = self.build(x)
        return self.memo[x]

    def build(self, x: UOp) -> tuple[UOp, int, int]:
        n, s = x.dtype.count, x.dtype.scalar()
        i32 = dtypes.int32.vec(n)
        if x.op is Ops.CAST and x.src[0].op is Ops.VECTORIZE and dtypes.is_int(x.src[0].dtype) and \
                all(c.op is Ops.CONST for c in x.src[0].src):
            x = x.src[0]   # constant lanes computed in a wider type (an arange of shift amounts): their wrapped values
        if x.op is Ops.VECTORIZE and all(c.op is Ops.CONST for c in x.src):
            vals = [int(cast_value(c.arg, s)) for c in x.src]
            return UOp(Ops.VECTORIZE, i32, tuple(UOp.const(dtypes.int32, v) for v in vals)), min(vals), max(vals)
        if x.op is Ops.VECTORIZE and all(c is x.src[0] for c in x.src):   # a broadcast: widen the one value
            one = UOp(Ops.CAST, dtypes.int32, (x.src[0],))
            return UOp(Ops.VECTORIZE, i32, (one,) * n), int(dtypes.min(s)), int(dtypes.max(s))
        if x.op not in _EXACT or not all(_narrow(v.dtype) for v in x.src): return self.leaf(x)
        (a, alo, ahi), (b, blo, bhi) = self(x.src[0]), self(x.src[1])
        if x.op is Ops.AND:
            lo, hi = (0, min(ahi, bhi)) if alo >= 0 and blo >= 0 else (0, bhi) if blo >= 0 else \
                (0, ahi) if alo >= 0 else (int(dtypes.min(s)), int(dtypes.max(s)))
        elif x.op in (Ops.OR, Ops.XOR):
            lo, hi = (0, _pow2_above(max(ahi, bhi)) - 1) if alo >= 0 and blo >= 0 else \
                (int(dtypes.min(s)), int(dtypes.max(s)))
        elif x.op is Ops.SHR:
            if blo < 0 or bhi >= 8 * s.itemsize: return self.leaf(x)
            lo, hi = min(alo >> blo, alo >> bhi), max(ahi >> blo, ahi >> bhi)
        elif x.op is Ops.SHL:
            if blo < 0 or bhi >= 8 * s.itemsize or alo < 0: return self.leaf(x)
            lo, hi = alo << blo, ahi << bhi
        elif x.op is Ops.ADD: lo, hi = alo + blo, ahi + bhi
        else:
            c = [p * q for p in (alo, ahi) for q in (blo, bhi)]
            lo, hi = min(c), max(c)
        y = UOp(x.op, i32, (a, b))
        if dtypes.min(s) <= lo and hi <= dtypes.max(s): return y, lo, hi
        # the narrow op may wrap: wrap the int32 lanes the same way (keep the low bits, sign-extended when signed)
        bits = 8 * s.itemsize
        const = lambda v: UOp(Ops.VECTORIZE, i32, (UOp.const(dtypes.int32, v),) * n)
        if dtypes.is_unsigned(s): return UOp(Ops.AND, i32, (y, const((1 << bits) - 1))), 0, int(dtypes.max(s))
        up = UOp(Ops.SHL, i32, (y, const(32 - bits)))
        return UOp(Ops.SHR, i32, (up, const(32 - bits))), int(dtypes.min(s)), int(dtypes.max(s))


def widen_narrow_vectors(ast: UOp) -> UOp:
    """Every vector CAST from 8/16-bit integer lanes -> the same CAST from int32 lanes computed as `_Widen` does (a
    CAST to int32 itself is then the widened value)."""
    casts = [n for n in ast.toposort() if n.op is Ops.CAST and _narrow(n.src[0].dtype) and not _narrow(n.dtype)
             and n.dtype.scalar() != dtypes.bool]
    if not casts: return ast
    widen = _Widen()
    mapping = {}
    for c in casts:
        w = widen(c.src[0])[0]
        mapping[c] = w if c.dtype == w.dtype else UOp(Ops.CAST, c.dtype, (w,))
    return substitute(ast, mapping)


__all__ = ["widen_narrow_vectors"]
