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
    def __init__(self, spec: ProgramSpec, lib: bytes):
        self.name, self.spec = spec.name, spec
        src = lib.decode()
        self.uops: list[UOp] = pickle.loads(base64.b64decode(src[src.index("#PICKLE ") + 8:]))
        pos = {u: i for i, u in enumerate(self.uops)}
        self.prog = [(u.op, u.dtype, [pos[s] for s in u.src if s in pos], u.arg, u) for u in self.uops]
        self.end_of: dict[int, int] = {}
        for i, u in enumerate(self.uops):
            if u.op is Ops.END: self.end_of[pos[u.src[0]]] = i

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        st = time.perf_counter()
        v: list[Any] = [None] * len(self.prog)
        pc, n = 0, len(self.prog)
        var_i = 0
        while pc < n:
            op, dt, src, arg, u = self.prog[pc]
            if op is Ops.PARAM: v[pc] = bufs[arg]
            elif op is Ops.DEFINE_VAR:
                v[pc] = vals[var_i]; var_i += 1
            elif op is Ops.CONST: v[pc] = arg
            elif op is Ops.DEFINE_REG: v[pc] = memoryview(bytearray(dt.size * max(dt.itemsize, 1)))
            elif op is Ops.RANGE:
                v[pc] = 0
                if v[src[0]] <= 0:
                    pc = self.end_of[pc] + 1
                    continue
            elif op is Ops.END:
                r = src[0]
                v[r] += 1
                if v[r] < v[self.prog[r][2][0]]:
                    pc = r + 1
                    continue
            elif op is Ops.INDEX:
                v[pc] = (v[src[0]], v[src[1]], v[src[2]] if len(src) > 2 else True, self.uops[src[0]].dtype.base)
            elif op is Ops.LOAD:
                mem, i, gate, bdt = v[src[0]]
                if not gate: v[pc] = cast_value(0, dt)
                else:
                    _check(i, mem, bdt, self.name)
                    raw = struct.unpack_from(_fmt(bdt), mem, i * bdt.itemsize)[0]
                    v[pc] = _from_bits(raw, bdt)
            elif op is Ops.STORE:
                mem, i, gate, bdt = v[src[0]]
                if gate:
                    _check(i, mem, bdt, self.name)
                    x = v[src[1]]
                    struct.pack_into(_fmt(bdt), mem, i * bdt.itemsize, _to_bits(x, bdt))
            elif op is Ops.CAST: v[pc] = cast_value(v[src[0]], dt)
            elif op is Ops.BITCAST:
                sdt = self.uops[src[0]].dtype
                # bfloat16 and fp8 values are held as floats: through their bit patterns on the way in and out
                y = struct.unpack(_fmt(dt), struct.pack(_fmt(sdt), _to_bits(v[src[0]], sdt)))[0]
                v[pc] = _from_bits(y, dt)
            elif op in GroupOp.ALU:
                v[pc] = exec_alu(op, dt, [v[s] for s in src])
            else:
                raise RuntimeError(f"PYTHON backend can't execute {op}")
            pc += 1
        return time.perf_counter() - st if wait else None


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
