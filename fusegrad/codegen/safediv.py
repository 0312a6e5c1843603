"""Integer division that can't trap: x // 0 and x % 0 are 0 (as ir/alu.py defines them), INT_MIN // -1 wraps.

A C or LLVM integer division by zero, or of the most negative value by -1, is undefined behaviour that the CPU turns
into a signal (SIGFPE; SIGILL when the compiler sees a constant 0) which kills the whole Python process. GPUs return
garbage instead. So every IDIV/MOD whose divisor isn't a known-safe constant (index math divides by positive
constants: untouched) becomes a division by a divisor that is never 0 or -1, with those two cases selected apart:

    a // b  ->  b != 0 ? (b != -1 ? a // (b if b not in (0, -1) else 1) : -a) : 0
    a %  b  ->  b not in (0, -1) ? a % (...same...) : 0
"""
from __future__ import annotations

from fusegrad.dtype import dtypes
from fusegrad.ir.ops import Ops, UOp


def _safe_const(b: UOp) -> bool:
    return b.op is Ops.CONST and b.arg != 0 and (dtypes.is_unsigned(b.dtype) or b.arg != -1)


def guard_int_division(ast: UOp) -> UOp:
    memo: dict[UOp, UOp] = {}
    changed = False
    for n in ast.toposort():
        new_src = tuple(memo[s] for s in n.src)
        new = n if all(a is b for a, b in zip(new_src, n.src)) else n.replace(src=new_src)
        if n.op in (Ops.IDIV, Ops.MOD) and dtypes.is_int(n.dtype) and not _safe_const(n.src[1]):
            a, b = new.src
            nz = b.alu(Ops.CMPNE, 0)
            signed = not dtypes.is_unsigned(n.dtype.scalar())
            ok = nz.alu(Ops.AND, b.alu(Ops.CMPNE, -1)) if signed else nz
            q = UOp(n.op, n.dtype, (a, ok.where(b, UOp.const(b.dtype, 1))))
            zero = UOp.const(n.dtype, 0)
            if n.op is Ops.MOD: new = ok.where(q, zero)
            else: new = nz.where(b.alu(Ops.CMPNE, -1).where(q, a.neg()), zero) if signed else nz.where(q, zero)
            changed = True
        memo[n] = new
    return memo[ast] if changed else ast


__all__ = ["guard_int_division"]
