"""PYTHON device: executes the linear program directly, one op at a time. Slow, dependency-free, and the reference
semantics every other backend is tested against (ALU semantics come from ir/alu.py).
"""
from __future__ import annotations

import base64
import pickle
import struct
import time
from typing import Any

from fusegrad.device import Allocator, Compiled, Compiler
from fusegrad.dtype import DType, bf16_to_float, dtypes, float_to_bf16_bits, float_to_fp8, fp8_to_float
from fusegrad.ir.alu import cast_value, exec_alu
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.renderer import ProgramSpec, Renderer


class PythonRenderer(Renderer):
    """The 'source' is a readable listing of the linear program followed by its pickle."""
    device = "PYTHON"

    def render(self, name: str, uops: list[UOp]) -> str:
        num = {u: i for i, u in enumerate(uops)}
        lines = [f"# {name}"]
        for i, u in enumerate(uops):
            srcs = " ".join(f"%{num[s]}" for s in u.src if s in num)
            lines.append(f"%{i:<4} = {u.op.name:<11} {str(u.dtype):<20} {srcs} {'' if u.arg is None else repr(u.arg)}")
        return "\n".join(lines) + "\n#PICKLE " + base64.b64encode(pickle.dumps(uops)).decode() + "\n"


def _fmt(dt: DType) -> str:
    return "H" if dt == dtypes.bfloat16 else dt.fmt or "B"


def _to_bits(x: Any, dt: DType) -> Any:
    """A value as it is stored: bfloat16 and fp8 values are held as floats and stored as their bit patterns."""
    if dt == dtypes.bfloat16: return float_to_bf16_bits(x)
    return float_to_fp8(x, dt) if dt in dtypes.fp8s else x


def _from_bits(x: Any, dt: DType) -> Any:
    if dt == dtypes.bfloat16: return bf16_to_float(x)
    return fp8_to_float(x, dt) if dt in dtypes.fp8s else x


class PythonProgram:
    """Runs the linear program with a rule table (RULES below, op -> rule(run, pc, src, dtype, arg) -> the next pc):
    each instruction's rule is looked up once, here, and the loop just calls them."""

    def __init__(self, spec: ProgramSpec, lib: bytes):
        self.name, self.spec = spec.name, spec
        src = lib.decode()
        self.uops: list[UOp] = pickle.loads(base64.b64decode(src[src.index("#PICKLE ") + 8:]))
        pos = {u: i for i, u in enumerate(self.uops)}
        self.prog = [(RULES.get(u.op, _unknown), [pos[s] for s in u.src if s in pos], u.dtype, u.arg)
                     for u in self.uops]
        self.end_of: dict[int, int] = {}
        for i, u in enumerate(self.uops):
            if u.op is Ops.END: self.end_of[pos[u.src[0]]] = i

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        st = time.perf_counter()
        run = _Run(self, bufs, vals)
        pc, n, prog = 0, len(self.prog), self.prog
        while pc < n:
            rule, src, dt, arg = prog[pc]
            pc = rule(run, pc, src, dt, arg)
        return time.perf_counter() - st if wait else None


class _Run:
    """One execution's state: each instruction's value, the buffers and variable values, variables bound so far."""
    __slots__ = ("bufs", "prog", "v", "vals", "var_i")

    def __init__(self, prog: PythonProgram, bufs: tuple[Any, ...], vals: tuple[int, ...]):
        self.prog, self.bufs, self.vals, self.var_i = prog, bufs, vals, 0
        self.v: list[Any] = [None] * len(prog.prog)


# ---- the rule table: rule(run, pc, src, dtype, arg) -> the next pc

def _set(fn: Any) -> Any:
    """A rule for an instruction that computes its value, fn(run, src, dtype, arg), and goes on to the next one."""
    def rule(run: _Run, pc: int, src: list[int], dt: DType, arg: Any) -> int:
        run.v[pc] = fn(run, src, dt, arg)
        return pc + 1
    return rule


def _define_var(run: _Run, src: list[int], dt: DType, arg: Any) -> Any:
    run.var_i += 1
    return run.vals[run.var_i - 1]


def _range(run: _Run, pc: int, src: list[int], dt: DType, arg: Any) -> int:
    run.v[pc] = 0
    return run.prog.end_of[pc] + 1 if run.v[src[0]] <= 0 else pc + 1


def _end(run: _Run, pc: int, src: list[int], dt: DType, arg: Any) -> int:
    r, v = src[0], run.v
    v[r] += 1
    return r + 1 if v[r] < v[run.prog.prog[r][1][0]] else pc + 1


def _load(run: _Run, src: list[int], dt: DType, arg: Any) -> Any:
    mem, i, gate, bdt = run.v[src[0]]
    if not gate: return cast_value(0, dt)
    _check(i, mem, bdt, run.prog.name)
    return _from_bits(struct.unpack_from(_fmt(bdt), mem, i * bdt.itemsize)[0], bdt)


def _store(run: _Run, pc: int, src: list[int], dt: DType, arg: Any) -> int:
    mem, i, gate, bdt = run.v[src[0]]
    if gate:
        _check(i, mem, bdt, run.prog.name)
        struct.pack_into(_fmt(bdt), mem, i * bdt.itemsize, _to_bits(run.v[src[1]], bdt))
    return pc + 1


def _bitcast(run: _Run, src: list[int], dt: DType, arg: Any) -> Any:
    sdt = run.prog.uops[src[0]].dtype
    # bfloat16 and fp8 values are held as floats: through their bit patterns on the way in and out
    return _from_bits(struct.unpack(_fmt(dt), struct.pack(_fmt(sdt), _to_bits(run.v[src[0]], sdt)))[0], dt)


def _unknown(run: _Run, pc: int, src: list[int], dt: DType, arg: Any) -> int:
    raise RuntimeError(f"PYTHON backend can't execute {run.prog.uops[pc].op}")


RULES: dict[Ops, Any] = {
    Ops.PARAM: _set(lambda run, src, dt, arg: run.bufs[arg]), Ops.DEFINE_VAR: _set(_define_var),
    Ops.CONST: _set(lambda run, src, dt, arg: arg),
    Ops.DEFINE_REG: _set(lambda run, src, dt, arg: memoryview(bytearray(dt.size * max(dt.itemsize, 1)))),
    Ops.RANGE: _range, Ops.END: _end,
    Ops.INDEX: _set(lambda run, src, dt, arg: (run.v[src[0]], run.v[src[1]], run.v[src[2]] if len(src) > 2 else True,
                                               run.prog.uops[src[0]].dtype.base)),
    Ops.LOAD: _set(_load), Ops.STORE: _store, Ops.CAST: _set(lambda run, src, dt, arg: cast_value(run.v[src[0]], dt)),
    Ops.BITCAST: _set(_bitcast),
    **{op: _set(lambda run, src, dt, arg, op=op: exec_alu(op, dt, [run.v[s] for s in src])) for op in GroupOp.ALU}}


def _check(i: int, mem: memoryview, dt: DType, name: str) -> None:
    if not 0 <= i < len(mem) // max(dt.itemsize, 1):
        raise IndexError(f"kernel {name}: access at index {i} out of bounds for a buffer of {len(mem) // dt.itemsize}")


class PythonAllocator(Allocator):
    def _alloc(self, nbytes: int) -> memoryview: return memoryview(bytearray(nbytes))
    def _copyin(self, dest: memoryview, src: memoryview) -> None: dest[:] = src
    def _copyout(self, dest: memoryview, src: memoryview) -> None: dest[:] = src[:dest.nbytes]
    def _offset(self, opaque: memoryview, offset: int, nbytes: int) -> memoryview: return opaque[offset:offset + nbytes]


class PythonDevice(Compiled):
    def __init__(self, device: str):
        super().__init__(device, PythonAllocator(), PythonRenderer(), Compiler(None), PythonProgram)
