"""Decompositions for what a renderer lacks, applied to the kernel AST before linearizing.

bfloat16 emulation: memory holds the 16-bit patterns (as uint16); values are computed in float32 and rounded to
bfloat16 (round-to-nearest-even) after every op, which is exactly what a native bf16 op returns.
"""
from __future__ import annotations

from fusegrad.dtype import DType, PtrDType, dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import PatternMatcher, UPat, graph_rewrite

F32, U32, U16, BF16 = dtypes.float32, dtypes.uint32, dtypes.uint16, dtypes.bfloat16


def bf16_round(x: UOp) -> UOp:
    """A float32 value rounded to the nearest bfloat16 (ties to even), still as float32."""
    u = x.bitcast(U32)
    r = (u + 0x7FFF + (u.alu(Ops.SHR, 16).alu(Ops.AND, 1))).alu(Ops.AND, 0xFFFF0000)
    return r.bitcast(F32)


def bf16_load(ld: UOp) -> UOp:
    return (ld.cast(U32).alu(Ops.SHL, 16)).bitcast(F32)


def bf16_store_bits(x: UOp) -> UOp:
    return bf16_round(x).bitcast(U32).alu(Ops.SHR, 16).cast(U16)


def _retype_param(p: UOp) -> UOp | None:
    if not isinstance(p.dtype, PtrDType) or p.dtype.base != BF16: return None
    return p.replace(dtype=U16.ptr(p.dtype.size, p.dtype.addrspace))


def _emulate(x: UOp) -> UOp | None:
    """Every bf16-typed value becomes float32; ALU results and casts into bf16 are rounded."""
    if x.op is Ops.BITCAST and x.dtype.itemsize == 2 and x.src[0].dtype == F32:
        # out of bf16 (its source already emulated: a float32 holding a bf16 value exactly) -> its top 16 bits
        bits = x.src[0].bitcast(U32).alu(Ops.SHR, 16).cast(U16)
        return bits if x.dtype == U16 else bits.bitcast(x.dtype)
    if x.dtype != BF16: return None
    if x.op is Ops.CONST: return UOp.const(F32, dtypes.as_const(x.arg, BF16))
    if x.op is Ops.LOAD:
        idx = x.src[0]
        return bf16_load(UOp(Ops.LOAD, U16, (idx.replace(dtype=U16),) + x.src[1:]))
    if x.op is Ops.INDEX: return x.replace(dtype=U16)
    if x.op is Ops.CAST: return bf16_round(x.src[0].cast(F32) if x.src[0].dtype != F32 else x.src[0])
    if x.op in GroupOp.ALU:
        out = UOp(x.op, F32 if x.op not in GroupOp.Comparison else dtypes.bool, x.src, x.arg)
        return bf16_round(out) if x.op not in (Ops.MAX, Ops.NEG, Ops.WHERE) else out
    if x.op is Ops.REDUCE: return UOp(Ops.REDUCE, F32, x.src, x.arg)
    if x.op is Ops.BITCAST: return x.src[0].bitcast(U16).cast(U32).alu(Ops.SHL, 16).bitcast(F32)
    return None


def _store(st: UOp) -> UOp | None:
    """A store of a float32 value through a retyped (uint16) bf16 address: round and store the bits."""
    idx, val = st.src[0], st.src[1]
    if idx.dtype != U16 or val.dtype != F32: return None
    return UOp(Ops.STORE, dtypes.void, (idx, bf16_store_bits(val)))


pm_emulate_bf16 = PatternMatcher([
    (UPat(Ops.PARAM, name="p"), _retype_param),
    (UPat(Ops.STORE, name="st"), _store),
    (UPat(name="x"), _emulate),
])


def decompose_dtypes(ast: UOp, supported: list[DType]) -> UOp:
    if BF16 in supported or not any(n.dtype == BF16 or (isinstance(n.dtype, PtrDType) and n.dtype.base == BF16)
                                    for n in ast.toposort()):
        return ast
    return graph_rewrite(ast, pm_emulate_bf16, name="emulate bfloat16")
