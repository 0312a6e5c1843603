"""Decompositions for what a renderer lacks, applied to the kernel AST before linearizing.

bfloat16 and fp8 emulation: memory holds the bit patterns (as uint16 / uint8); values are computed in float32 and
rounded to the narrow type (round-to-nearest-even) after every op, which is exactly what a native op returns (float32
has more than twice the precision, so rounding twice gives the same result as rounding once).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

from fusegrad.dtype import DType, PtrDType, FP8_FORMATS, dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import PatternMatcher, UPat, graph_rewrite

F32, U32, U16, U8, BF16 = dtypes.float32, dtypes.uint32, dtypes.uint16, dtypes.uint8, dtypes.bfloat16


def bf16_round(x: UOp) -> UOp:
    """A float32 value rounded to the nearest bfloat16 (ties to even), still as float32. Integer ops on the bits, so a
    vector of them is a few vector instructions on any CPU. A NaN becomes the quiet NaN of its sign (as ml_dtypes):
    the carry of the rounding would turn a NaN with a small payload into inf, and 0x7FFFFFFF into -0.0."""
    u = x.bitcast(U32)
    r = (u + 0x7FFF + (u.alu(Ops.SHR, 16).alu(Ops.AND, 1))).alu(Ops.AND, 0xFFFF0000)
    nan = u.alu(Ops.AND, 0x80000000).alu(Ops.OR, 0x7FC00000)
    return UOp.const(U32, 0x7F800000).lt(u.alu(Ops.AND, 0x7FFFFFFF)).where(nan, r).bitcast(F32)


def bf16_load(ld: UOp) -> UOp:
    return (ld.cast(U32).alu(Ops.SHL, 16)).bitcast(F32)


def _bf16_rounded(x: UOp) -> bool:
    """Whether x is already bf16_round(y) for some y (an op's result, or a cast into bfloat16): UOps are hash-consed,
    so rebuilding the rounding of the candidate y finds the very same node."""
    if x.op is not Ops.BITCAST or x.src[0].op is not Ops.WHERE: return False
    cond = x.src[0].src[0]  # WHERE(0x7F800000 < AND(u, 0x7FFFFFFF), nan, rounded) -> u
    if cond.op is not Ops.CMPLT or cond.src[1].op is not Ops.AND: return False
    u = cond.src[1].src[0]
    return u.op is Ops.BITCAST and u.src[0].dtype == F32 and bf16_round(u.src[0]) is x


def bf16_store_bits(x: UOp) -> UOp:
    """The uint16 bits of a float32 value, rounded once: a value the last op or cast already rounded isn't again."""
    r = x if _bf16_rounded(x) else bf16_round(x)
    return r.bitcast(U32).alu(Ops.SHR, 16).cast(U16)


# ---------------------------------------------------------------------------------------------------------------------
# fp8 (e4m3 "fn" and e5m2) as float32 values: rounding, encoding and decoding with integer ops on the float32 bits

def _fp8_params(dt: DType) -> tuple[int, int, float]:
    return FP8_FORMATS[dt]


def _f32_bits(x: UOp) -> tuple[UOp, UOp]:
    """(sign bit, |x| bits) of a float32 value, as uint32."""
    u = x.bitcast(U32)
    return u.alu(Ops.AND, 0x80000000), u.alu(Ops.AND, 0x7FFFFFFF)


def _rne_int(y: UOp) -> UOp:
    """A non-negative float32 rounded to the nearest integer, ties to even (y < 2**23), still float32."""
    f = y.alu(Ops.TRUNC)
    rest = y - f
    odd = f.cast(U32).alu(Ops.AND, 1).ne(0)
    up = UOp.const(F32, 0.5).lt(rest).alu(Ops.OR, rest.lt(0.5).where(False, odd))
    return f + up.cast(F32)


def fp8_round(x: UOp, dt: DType) -> UOp:
    """A float32 value rounded to fp8 `dt`, still as float32 (NaN / inf / overflow as dtype.float_to_fp8)."""
    bias, mbits, max_finite = _fp8_params(dt)
    sign, ab = _f32_bits(x)
    shift = 23 - mbits
    # normal range: round the float32 mantissa to mbits bits, ties to even (a carry moves into the exponent)
    normal = (ab + ((1 << (shift - 1)) - 1) + ab.alu(Ops.SHR, shift).alu(Ops.AND, 1))
    normal = normal.alu(Ops.AND, 0xFFFFFFFF ^ ((1 << shift) - 1))
    quantum = 2.0 ** (1 - bias - mbits)
    sub = _rne_int(ab.bitcast(F32) * (1 / quantum)) * quantum                      # subnormal range: fixed quantum
    r = ab.bitcast(F32).lt(2.0 ** (1 - bias)).where(sub, normal.bitcast(F32))
    nonfinite = UOp.const(U32, 0x7F7FFFFF).lt(ab)
    big = nonfinite.alu(Ops.OR, UOp.const(F32, max_finite).lt(r))
    if dt == dtypes.fp8e4m3: r = big.where(math.nan, r)
    else: r = UOp.const(U32, 0x7F800000).lt(ab).where(math.nan, big.where(math.inf, r))
    return (r.bitcast(U32).alu(Ops.OR, sign)).bitcast(F32)


def fp8_bits(x: UOp, dt: DType) -> UOp:
    """The uint8 bit pattern of a float32 value (rounded to fp8 `dt` first)."""
    bias, mbits, _ = _fp8_params(dt)
    r = fp8_round(x, dt)
    sign, ab = _f32_bits(r)
    normal = ab.alu(Ops.SHR, 23 - mbits) + (-((127 - bias) << mbits) & 0xFFFFFFFF)
    sub = (ab.bitcast(F32) * 2.0 ** (bias - 1 + mbits)).cast(U32)
    bits = ab.bitcast(F32).lt(2.0 ** (1 - bias)).where(sub, normal)
    if dt == dtypes.fp8e4m3: special = UOp.const(U32, 0x7F)
    else: special = ab.ne(0x7F800000).where(0x7E, UOp.const(U32, 0x7C))
    bits = UOp.const(U32, 0x7F7FFFFF).lt(ab).where(special, bits)
    return bits.alu(Ops.OR, sign.alu(Ops.SHR, 24)).cast(U8)


def fp8_value(b: UOp, dt: DType) -> UOp:
    """The float32 value of a uint8 fp8 bit pattern."""
    bias, mbits, _ = _fp8_params(dt)
    bi = b.cast(U32)
    mag = bi.alu(Ops.AND, 0x7F)
    normal = mag.alu(Ops.SHL, 23 - mbits) + ((127 - bias) << 23)
    sub = (bi.alu(Ops.AND, (1 << mbits) - 1).cast(F32) * 2.0 ** (1 - bias - mbits)).bitcast(U32)
    v = mag.lt(1 << mbits).where(sub, normal)
    if dt == dtypes.fp8e4m3: v = mag.ne(0x7F).where(v, UOp.const(U32, 0x7FC00000))
    else: v = mag.lt(0x7C).where(v, mag.ne(0x7C).where(0x7FC00000, UOp.const(U32, 0x7F800000)))
    return v.alu(Ops.OR, bi.alu(Ops.AND, 0x80).alu(Ops.SHL, 24)).bitcast(F32)


# ---------------------------------------------------------------------------------------------------------------------
# one rewrite per emulated dtype: its values become float32, its memory its bit patterns

class _Emulated:
    """How dtype `dt` is emulated: `store` is its storage dtype; `round`, `encode` and `decode` are float32 <-> bits."""
    def __init__(self, dt: DType, store: DType, rnd: Callable[[UOp], UOp], encode: Callable[[UOp], UOp],
                 decode: Callable[[UOp], UOp]):
        self.dt, self.store, self.round, self.encode, self.decode = dt, store, rnd, encode, decode
        self.pm = PatternMatcher([
            (UPat(Ops.PARAM, name="p"), self._retype_param),
            (UPat(Ops.STORE, name="st"), self._store),
            (UPat(name="x"), self._emulate),
        ])

    def _retype_param(self, p: UOp) -> UOp | None:
        if not isinstance(p.dtype, PtrDType) or p.dtype.base != self.dt: return None
        return p.replace(dtype=self.store.ptr(p.dtype.size, p.dtype.addrspace))

    def _emulate(self, x: UOp) -> UOp | None:
        """Every value of the dtype becomes float32; ALU results and casts into it are rounded."""
        if x.op is Ops.BITCAST and x.dtype.itemsize == self.dt.itemsize and x.src[0].dtype == F32:
            # out of the dtype (its source already emulated: a float32 holding one of its values exactly) -> its bits
            bits = self.encode(x.src[0])
            return bits if x.dtype == self.store else bits.bitcast(x.dtype)
        if x.dtype != self.dt: return None
        if x.op is Ops.CONST: return UOp.const(F32, dtypes.as_const(x.arg, self.dt))
        if x.op is Ops.LOAD:
            idx = x.src[0]
            return self.decode(UOp(Ops.LOAD, self.store, (idx.replace(dtype=self.store),) + x.src[1:]))
        if x.op is Ops.INDEX: return x.replace(dtype=self.store)
        if x.op is Ops.CAST: return self.round(x.src[0].cast(F32) if x.src[0].dtype != F32 else x.src[0])
        if x.op in GroupOp.ALU:
            out = UOp(x.op, F32 if x.op not in GroupOp.Comparison else dtypes.bool, x.src, x.arg)
            return self.round(out) if x.op not in (Ops.MAX, Ops.NEG, Ops.WHERE) else out
        if x.op is Ops.REDUCE: return UOp(Ops.REDUCE, F32, x.src, x.arg)
        if x.op is Ops.BITCAST:
            src = x.src[0] if x.src[0].dtype == self.store else x.src[0].bitcast(self.store)
            return self.decode(src)
        return None

    def _store(self, st: UOp) -> UOp | None:
        """A store of a float32 value through a retyped address: round and store the bits."""
        idx, val = st.src[0], st.src[1]
        if idx.dtype != self.store or val.dtype != F32: return None
        return UOp(Ops.STORE, dtypes.void, (idx, self.encode(val)))


_EMULATED = [
    _Emulated(BF16, U16, bf16_round, bf16_store_bits, bf16_load),
    *(_Emulated(d, U8, functools.partial(fp8_round, dt=d), functools.partial(fp8_bits, dt=d),
                functools.partial(fp8_value, dt=d)) for d in dtypes.fp8s),
]
pm_emulate_bf16 = _EMULATED[0].pm


def _uses(ast: UOp, dt: DType) -> bool:
    return any(n.dtype == dt or (isinstance(n.dtype, PtrDType) and n.dtype.base == dt) for n in ast.toposort())


def decompose_dtypes(ast: UOp, supported: list[DType]) -> UOp:
    """Rewrite every dtype the renderer lacks (bfloat16, fp8) into float32 math on its bit patterns, one at a time."""
    for emu in _EMULATED:
        if emu.dt not in supported and _uses(ast, emu.dt):
            ast = graph_rewrite(ast, emu.pm, name=f"emulate {emu.dt.name}")
    return ast
