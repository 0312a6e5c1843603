"""The LLVM IR renderer: linear program -> one textual LLVM IR function, `void @name(ptr %data0, ..., i32 %var, ...)`.

Loops keep their counters in stack slots (`alloca`), which LLVM's -O2 promotes to registers; accumulators
(`DEFINE_REG`) are stack arrays. Vector dtypes (from VECTORIZE, when `simd_bytes > 0`) are LLVM vectors `<N x T>`:
every instruction and intrinsic used here works lane-wise on them. Semantics follow `ir/alu.py` like the C renderer.
"""
from __future__ import annotations

import math
import re
import struct

from fusegrad.dtype import DType, PtrDType, dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.renderer import AluRule, RenderContext, Renderer, Rule

# LLVM's integer types are signless: signedness lives in the instructions (sdiv/udiv, icmp slt/ult, sext/zext)
LLVM_TYPES: dict[DType, str] = {
    dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.uint16: "i16",
    dtypes.int32: "i32", dtypes.uint32: "i32", dtypes.int64: "i64", dtypes.uint64: "i64",
    dtypes.float16: "half", dtypes.float32: "float", dtypes.float64: "double"}
MATH_INTRINSICS = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}
_SUFFIX = {dtypes.float16: "f16", dtypes.float32: "f32", dtypes.float64: "f64", dtypes.int64: "i64"}


def ltype(dt: DType) -> str:
    """The LLVM type of a value of `dt`: a scalar, or `<N x T>` for a vector dtype."""
    if dt.scalar() not in LLVM_TYPES: raise RuntimeError(f"LLVMRenderer has no type for {dt}")
    return f"<{dt.count} x {LLVM_TYPES[dt.scalar()]}>" if dt.count > 1 else LLVM_TYPES[dt.scalar()]


def mtype(dt: DType) -> str:
    """The LLVM type of `dt` in memory: bool is a byte (0 or 1), as numpy and C store it."""
    if dt.scalar() != dtypes.bool: return ltype(dt)
    return f"<{dt.count} x i8>" if dt.count > 1 else "i8"


def suffix(dt: DType) -> str:
    """An intrinsic's type suffix: f32, v8f32."""
    return f"v{dt.count}{_SUFFIX[dt.scalar()]}" if dt.count > 1 else _SUFFIX[dt.scalar()]


def like(scalar: DType, dt: DType) -> DType:
    """`scalar`, as a vector of dt's width when dt is a vector."""
    return scalar.vec(dt.count) if dt.count > 1 else scalar


def lconst(val: object, dt: DType) -> str:
    """A constant as an LLVM literal (a vector repeats it in each lane). Floats are written as the hex of their exact
    bits (always accepted, NaN too)."""
    if dt.count > 1:
        lit = f"{LLVM_TYPES[dt.scalar()]} {lconst(val, dt.scalar())}"
        return f"<{', '.join([lit] * dt.count)}>"
    dt = dt.scalar()
    if dtypes.is_bool(dt): return "true" if val else "false"
    if dtypes.is_float(dt):
        x = float(val)  # type: ignore[arg-type]
        if dt == dtypes.float16: return f"0xH{_pack_bits('<e', '<H', x):04X}"
        if dt == dtypes.float32: x = struct.unpack("<f", struct.pack("<I", _pack_bits("<f", "<I", x)))[0]
        return f"0x{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"  # float literals are doubles exact in float
    bits = dt.itemsize * 8
    v = int(val) & ((1 << bits) - 1)  # type: ignore[call-overload]
    return str(v - (1 << bits) if v >> (bits - 1) else v)


def _pack_bits(ffmt: str, ifmt: str, x: float) -> int:
    try: return struct.unpack(ifmt, struct.pack(ffmt, x))[0]
    except OverflowError: return struct.unpack(ifmt, struct.pack(ffmt, math.copysign(math.inf, x)))[0]


class LLVMRenderer(Renderer):
    """LLVM IR for the host CPU, compiled in-process by llvmlite (`runtime/ops_llvm.py`). float16 is LLVM's `half`;
    bfloat16 is emulated by codegen/decompose.py. Float reduce kernels allow fused multiply-adds (`contract`), as the
    C renderer does; elementwise math never gets any fast-math flag."""
    device = "LLVM"
    fp16 = True  # the runtime clears it on an x86 CPU without F16C, where half conversions would be library calls

    def native_dtypes(self) -> list[DType]:
        return [d for d in dtypes.all if d in LLVM_TYPES and (self.fp16 or d != dtypes.float16)]

    def supported_dtypes(self) -> list[DType]:
        return self.native_dtypes() + [dtypes.bfloat16, *dtypes.fp8s]

    def render(self, name: str, uops: list[UOp]) -> str:
        return _Function(self, name, uops).walk().text()

    # the walk's table and the ALU table, filled in below (their rules call _Function's emitters)
    rules: dict[Ops, Rule] = {}
    alu_rules: dict[Ops, AluRule] = {}


class _Function(RenderContext):
    """The shared walk (renderer/__init__.py) in SSA form: every value is a fresh %tN (no inlining, no indentation),
    loops are basic blocks. The state: value names, the current basic block, stack slots and declarations."""

    def __init__(self, renderer: LLVMRenderer, name: str, uops: list[UOp]):
        super().__init__(renderer, name, uops)
        self.args: list[str] = []
        self.allocas: list[str] = []
        self.body: list[str] = []
        self.decls: set[str] = set()
        self.loops: dict[UOp, tuple[str, str, str]] = {}  # RANGE -> (counter slot, header block, exit block)
        self.block, self.ntmp = "entry", 0
        # float reduce kernels may fuse acc + a*b (like BLAS, and like ClangRenderer's fp-contract there)
        self.fma = " contract" if any(u.op is Ops.DEFINE_REG and dtypes.is_float(u.dtype.base) for u in uops) else ""

    # -- emitting --------------------------------------------------------------------------------------------------
    def tmp(self, prefix: str = "t") -> str:
        self.ntmp += 1
        return f"%{prefix}{self.ntmp}"

    def emit(self, instr: str) -> str:
        """Emit `%tN = instr` and return %tN."""
        out = self.tmp()
        self.body.append(f"  {out} = {instr}")
        return out

    def label(self, block: str) -> None:
        self.body.append(f"{block}:")
        self.block = block

    def call(self, ret: str, fn: str, args: list[tuple[str, str]]) -> str:
        self.decls.add(f"declare {ret} @{fn}({', '.join(t for t, _ in args)})")
        return self.emit(f"call {ret} @{fn}({', '.join(f'{t} {v}' for t, v in args)})")

    def text(self) -> str:
        fname = self.name if re.fullmatch(r"[A-Za-z_][\w.]*", self.name) else '"' + self.name.replace('"', "") + '"'
        head = f"define void @{fname}({', '.join(self.args)}) #0 {{\nentry:"
        return "\n".join([*sorted(self.decls), "", head, *self.allocas, *self.body, "  ret void", "}", "",
                          'attributes #0 = { nounwind "frame-pointer"="none" }', ""])

    # -- one uop (the rule table, LLVMRenderer.rules, is below the class) --------------------------------------------
    def param(self, u: UOp) -> str:
        self.args.append(f"ptr noalias %data{u.arg}")
        return f"%data{u.arg}"

    def define_var(self, u: UOp) -> str:
        wide = u.dtype.itemsize == 8   # a variable whose range needs 64 bits is an i64 argument
        self.args.append(f"{'i64' if wide else 'i32'} %var_{u.arg[0]}")
        return self.int_resize(f"%var_{u.arg[0]}", dtypes.int64 if wide else dtypes.int32, u.dtype)

    def define_reg(self, u: UOp) -> str:
        assert isinstance(u.dtype, PtrDType)
        slot = f"%acc{self.i}"
        self.allocas.append(f"  {slot} = alloca [{u.dtype.size} x {mtype(u.dtype.base)}]")  # aligned for its type
        return slot

    def index(self, u: UOp) -> str:  # counts elements of the buffer's type: a vector access starts at its first lane
        return self.emit(f"getelementptr {mtype(u.src[0].dtype.base)}, ptr {self.r[u.src[0]]}, "
                         f"{ltype(u.src[1].dtype)} {self.r[u.src[1]]}")

    # -- control flow ----------------------------------------------------------------------------------------------
    def loop_start(self, i: int, u: UOp) -> str:
        """for (i = start; i < bound; i++): the counter lives in a stack slot, the header loads and tests it."""
        t = ltype(u.dtype)
        slot, head, body, done = f"%ctr{i}", f"loop{i}", f"body{i}", f"done{i}"
        self.allocas.append(f"  {slot} = alloca {t}")
        if u.arg[1] == "thread":  # split across threads: this call runs [core_start, core_end)
            self.args += ["i32 %core_start", "i32 %core_end"]
            start, bound = "%core_start", "%core_end"
        else: start, bound = "0", self.r[u.src[0]]
        self.body += [f"  store {t} {start}, ptr {slot}", f"  br label %{head}"]
        self.label(head)
        idx = f"%ridx{i}"
        self.body.append(f"  {idx} = load {t}, ptr {slot}")
        cond = self.emit(f"icmp {'ult' if dtypes.is_unsigned(u.dtype) else 'slt'} {t} {idx}, {bound}")
        self.body.append(f"  br i1 {cond}, label %{body}, label %{done}")
        self.label(body)
        self.loops[u] = (slot, head, done)
        return idx

    def loop_end(self, rng: UOp) -> str:
        slot, head, done = self.loops[rng]
        t = ltype(rng.dtype)
        nxt = self.emit(f"add {'nuw' if dtypes.is_unsigned(rng.dtype) else 'nsw'} {t} {self.r[rng]}, 1")
        self.body += [f"  store {t} {nxt}, ptr {slot}", f"  br label %{head}"]
        self.label(done)
        return ""

    def guarded(self, i: int, gate: str | None) -> tuple[str, str] | None:
        """Open a block that runs only when `gate` is true; returns (block before, join block) to close it with."""
        if gate is None: return None
        before, then, join = self.block, f"gate{i}", f"join{i}"
        self.body.append(f"  br i1 {gate}, label %{then}, label %{join}")
        self.label(then)
        return before, join

    def load(self, i: int, u: UOp) -> str:
        """*idx; a gated index loads only when its gate is true (it may point out of bounds otherwise) and gives 0."""
        idx = u.src[0]
        g = self.guarded(i, self.r[idx.src[2]] if len(idx.src) > 2 else None)
        val = self.emit(f"load {mtype(u.dtype)}, ptr {self.r[idx]}, align {u.dtype.scalar().itemsize}")
        if u.dtype.scalar() == dtypes.bool:  # a byte in memory; any nonzero byte is True
            val = self.emit(f"icmp ne {mtype(u.dtype)} {val}, {lconst(0, like(dtypes.uint8, u.dtype))}")
        if g is None: return val
        loaded_in = self.block
        self.body.append(f"  br label %{g[1]}")
        self.label(g[1])
        zero = lconst(_zero(u.dtype), u.dtype)
        return self.emit(f"phi {ltype(u.dtype)} [ {val}, %{loaded_in} ], [ {zero}, %{g[0]} ]")

    def store(self, i: int, u: UOp) -> str:
        idx, v = u.src[0], u.src[1]
        g = self.guarded(i, self.r[idx.src[2]] if len(idx.src) > 2 else None)
        val = self.r[v]
        if v.dtype.scalar() == dtypes.bool: val = self.emit(f"zext {ltype(v.dtype)} {val} to {mtype(v.dtype)}")
        self.body.append(f"  store {mtype(v.dtype)} {val}, ptr {self.r[idx]}, align {v.dtype.scalar().itemsize}")
        if g is not None:
            self.body.append(f"  br label %{g[1]}")
            self.label(g[1])
        return ""

    # -- conversions -----------------------------------------------------------------------------------------------
    def vectorize(self, dt: DType, lanes: list[str]) -> str:
        """Scalars -> a vector: one insertelement per lane, or one and a shuffle when every lane is the same value."""
        t, et = ltype(dt), ltype(dt.scalar())
        if all(x == lanes[0] for x in lanes):
            one = self.emit(f"insertelement {t} poison, {et} {lanes[0]}, i32 0")
            return self.emit(f"shufflevector {t} {one}, {t} poison, <{dt.count} x i32> zeroinitializer")
        v = "poison"
        for i, x in enumerate(lanes): v = self.emit(f"insertelement {t} {v}, {et} {x}, i32 {i}")
        return v

    def int_resize(self, x: str, src: DType, dst: DType) -> str:
        a, b = src.scalar().itemsize, dst.scalar().itemsize
        if a == b: return x
        if a > b: return self.emit(f"trunc {ltype(src)} {x} to {ltype(dst)}")
        return self.emit(f"{'zext' if dtypes.is_unsigned(src) else 'sext'} {ltype(src)} {x} to {ltype(dst)}")

    def cast(self, x: str, src: DType, dst: DType) -> str:
        """C-style value conversion (ir/alu.py cast_value): floats truncate toward zero into ints, nonzero -> True."""
        s, d = ltype(src), ltype(dst)
        if src == dst: return x
        if dtypes.is_bool(dst):
            return self.emit(f"{'fcmp une' if dtypes.is_float(src) else 'icmp ne'} {s} {x}, {lconst(0, src)}")
        if dtypes.is_bool(src): return self.emit(f"{'uitofp' if dtypes.is_float(dst) else 'zext'} {s} {x} to {d}")
        if dtypes.is_float(src) and dtypes.is_float(dst):
            if src.scalar() == dtypes.float64 and dst.scalar() == dtypes.float16: return self.double_to_half(x, src)
            return self.emit(f"{'fpext' if src.itemsize < dst.itemsize else 'fptrunc'} {s} {x} to {d}")
        if dtypes.is_float(dst): return self.emit(f"{'uitofp' if dtypes.is_unsigned(src) else 'sitofp'} {s} {x} to {d}")
        if dtypes.is_int(src): return self.int_resize(x, src, dst)
        return self.float_to_int(x, src, dst)

    def float_to_int(self, x: str, src: DType, dst: DType) -> str:
        """Through a saturating conversion to 64 bits (NaN -> 0, never poison), then wrapped to the width like C on
        x86 and cast_value: -1.0 -> uint8 255, 200.0 -> int8 -56. uint64 above 2**63 takes the unsigned conversion.
        +-inf gives 0, like NaN, as in cast_value."""
        s, sfx, i64 = ltype(src), suffix(src), like(dtypes.int64, src)
        w, b = ltype(i64), ltype(like(dtypes.bool, src))
        inf = self.emit(f"fcmp oeq {s} {self.call(s, f'llvm.fabs.{sfx}', [(s, x)])}, {lconst(math.inf, src)}")
        x = self.emit(f"select {b} {inf}, {s} {lconst(0.0, src)}, {s} {x}")
        wide = self.call(w, f"llvm.fptosi.sat.{suffix(i64)}.{sfx}", [(s, x)])
        if dst.scalar() == dtypes.uint64:
            neg = self.emit(f"fcmp olt {s} {x}, {lconst(0.0, src)}")
            big = self.call(w, f"llvm.fptoui.sat.{suffix(i64)}.{sfx}", [(s, x)])
            wide = self.emit(f"select {b} {neg}, {w} {wide}, {w} {big}")
        return self.int_resize(wide, i64, dst)

    def double_to_half(self, x: str, src: DType) -> str:
        """double -> half, correctly rounded without the runtime library's __truncdfhf2 (absent from most processes):
        round to float *toward odd* (truncate, and set the last bit if anything was cut off), then round to half.
        Float keeps 13 more bits than half, so the second rounding sees exactly the right tie-breaking."""
        d, f32, i32 = ltype(src), ltype(like(dtypes.float32, src)), like(dtypes.int32, src)
        i, b, h = ltype(i32), ltype(like(dtypes.bool, src)), ltype(like(dtypes.float16, src))
        f = self.emit(f"fptrunc {d} {x} to {f32}")
        back = self.emit(f"fpext {f32} {f} to {d}")
        inexact = self.emit(f"fcmp one {d} {back}, {x}")  # ordered: NaN and inf pass unchanged
        ab = self.call(d, f"llvm.fabs.{suffix(src)}", [(d, back)])
        ax = self.call(d, f"llvm.fabs.{suffix(src)}", [(d, x)])
        up = self.emit(f"fcmp ogt {d} {ab}, {ax}")  # rounded away from zero: step back one float ulp
        bits = self.emit(f"bitcast {f32} {f} to {i}")
        down = self.emit(f"sub {i} {bits}, {self.emit(f'zext {b} {up} to {i}')}")
        odd = self.emit(f"or {i} {down}, {lconst(1, i32)}")
        r = self.emit(f"select {b} {inexact}, {i} {odd}, {i} {bits}")
        return self.emit(f"fptrunc {f32} {self.emit(f'bitcast {i} {r} to {f32}')} to {h}")

    def bitcast(self, x: str, src: DType, dst: DType) -> str:
        if dtypes.bool in (src.scalar(), dst.scalar()): return self.cast(x, src, dst)  # bool <-> byte: a value cast
        if ltype(src) == ltype(dst): return x
        return self.emit(f"bitcast {ltype(src)} {x} to {ltype(dst)}")

    # -- arithmetic ------------------------------------------------------------------------------------------------
    def alu(self, op: Ops, dt: DType, a: list[str], sdt: DType) -> str:
        """ALU op on operand values `a` (sdt: the first operand's dtype): the renderer's ALU table (ALU_RULES)."""
        return self.ren.alu_rules[op](self, op, dt, a, sdt)  # type: ignore[attr-defined]

    def max(self, dt: DType, a: list[str]) -> str:
        """(a != a || a > b) ? a : b, as the C renderer: a NaN in either operand wins (fmax would drop it)."""
        t, bt = ltype(dt), ltype(like(dtypes.bool, dt))
        if dtypes.is_bool(dt): return self.emit(f"or {t} {a[0]}, {a[1]}")
        if dtypes.is_float(dt):
            gt = self.emit(f"fcmp ogt {t} {a[0]}, {a[1]}")
            nan = self.emit(f"fcmp uno {t} {a[0]}, {a[0]}")
            cond = self.emit(f"or {bt} {nan}, {gt}")
        else: cond = self.emit(f"icmp {'ugt' if dtypes.is_unsigned(dt) else 'sgt'} {t} {a[0]}, {a[1]}")
        return self.emit(f"select {bt} {cond}, {t} {a[0]}, {t} {a[1]}")

    def divmod(self, op: Ops, dt: DType, a: list[str]) -> str:
        """C's truncating / and %. x/0 is 0 (as in ir/alu.py) instead of a trap: unknown divisors get a guard."""
        t, bt = ltype(dt), ltype(like(dtypes.bool, dt))
        name = ("u" if dtypes.is_unsigned(dt) else "s") + ("div" if op is Ops.IDIV else "rem")
        if re.fullmatch(r"-?\d+", a[1]) and int(a[1]) != 0: return self.emit(f"{name} {t} {a[0]}, {a[1]}")
        zero = self.emit(f"icmp eq {t} {a[1]}, {lconst(0, dt)}")
        safe = self.emit(f"select {bt} {zero}, {t} {lconst(1, dt)}, {t} {a[1]}")
        q = self.emit(f"{name} {t} {a[0]}, {safe}")
        return self.emit(f"select {bt} {zero}, {t} {lconst(0, dt)}, {t} {q}")

    def math(self, op: Ops, dt: DType, x: str) -> str:
        """LLVM's math intrinsics; half computes through float and rounds back, like the C renderer."""
        if dt.scalar() == dtypes.float16:
            f32 = like(dtypes.float32, dt)
            r = self.math(op, f32, self.emit(f"fpext {ltype(dt)} {x} to {ltype(f32)}"))
            return self.emit(f"fptrunc {ltype(f32)} {r} to {ltype(dt)}")
        t = ltype(dt)
        return self.call(t, f"llvm.{MATH_INTRINSICS[op]}.{suffix(dt)}", [(t, x)])


def _zero(dt: DType) -> object:
    return 0.0 if dtypes.is_float(dt) else False if dtypes.is_bool(dt) else 0


LLVMRenderer.rules = {
    Ops.PARAM: lambda r, f, u: f.param(u), Ops.DEFINE_VAR: lambda r, f, u: f.define_var(u),
    Ops.CONST: lambda r, f, u: lconst(u.arg, u.dtype), Ops.DEFINE_REG: lambda r, f, u: f.define_reg(u),
    Ops.RANGE: lambda r, f, u: f.loop_start(f.i, u), Ops.END: lambda r, f, u: f.loop_end(u.src[0]),
    Ops.INDEX: lambda r, f, u: f.index(u), Ops.VECTORIZE: lambda r, f, u: f.vectorize(u.dtype, [f.r[s] for s in u.src]),
    Ops.GEP: lambda r, f, u: f.emit(f"extractelement {ltype(u.src[0].dtype)} {f.r[u.src[0]]}, i32 {u.arg}"),
    Ops.LOAD: lambda r, f, u: f.load(f.i, u), Ops.STORE: lambda r, f, u: f.store(f.i, u),
    Ops.CAST: lambda r, f, u: f.cast(f.r[u.src[0]], u.src[0].dtype, u.dtype),
    Ops.BITCAST: lambda r, f, u: f.bitcast(f.r[u.src[0]], u.src[0].dtype, u.dtype),
    **{op: lambda r, f, u: f.alu(u.op, u.dtype, [f.r[s] for s in u.src], u.src[0].dtype) for op in GroupOp.ALU}}


# ---- the ALU table: rule(function, op, dtype, operands, first operand's dtype) -> the result's %name

def _unsigned(dt: DType) -> bool: return dtypes.is_unsigned(dt) or dtypes.is_bool(dt)


def _neg(f: _Function, op: Ops, dt: DType, a: list[str], sdt: DType) -> str:
    if dtypes.is_float(sdt): return f.emit(f"fneg {ltype(dt)} {a[0]}")
    if dtypes.is_bool(dt): return f.emit(f"xor {ltype(dt)} {lconst(True, dt)}, {a[0]}")  # -True is False
    return f.emit(f"sub {ltype(dt)} {lconst(0, dt)}, {a[0]}")


def _compare(f: _Function, op: Ops, dt: DType, a: list[str], sdt: DType) -> str:
    if dtypes.is_float(sdt): pred = "fcmp olt" if op is Ops.CMPLT else "fcmp une"
    else: pred = ("icmp ult" if _unsigned(sdt) else "icmp slt") if op is Ops.CMPLT else "icmp ne"
    return f.emit(f"{pred} {ltype(sdt)} {a[0]}, {a[1]}")


def _arith(f: _Function, op: Ops, dt: DType, a: list[str], sdt: DType) -> str:
    if dtypes.is_float(sdt): name = {Ops.ADD: f"fadd{f.fma}", Ops.MUL: f"fmul{f.fma}"}[op]
    elif dtypes.is_bool(dt) and op in (Ops.ADD, Ops.MUL): name = "or" if op is Ops.ADD else "and"  # 1+1 -> True
    else:
        name = {Ops.ADD: "add", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor", Ops.SHL: "shl",
                Ops.SHR: "lshr" if _unsigned(sdt) else "ashr"}[op]
    return f.emit(f"{name} {ltype(dt)} {a[0]}, {a[1]}")


ALU_RULES: dict[Ops, AluRule] = {
    Ops.CMPLT: _compare, Ops.CMPNE: _compare,
    Ops.WHERE: lambda f, op, dt, a, sdt: f.emit(f"select {ltype(sdt)} {a[0]}, {ltype(dt)} {a[1]}, {ltype(dt)} {a[2]}"),
    Ops.MAX: lambda f, op, dt, a, sdt: f.max(dt, a),
    Ops.IDIV: lambda f, op, dt, a, sdt: f.divmod(op, dt, a), Ops.MOD: lambda f, op, dt, a, sdt: f.divmod(op, dt, a),
    **{op: lambda f, op, dt, a, sdt: f.math(op, dt, a[0]) for op in MATH_INTRINSICS},
    Ops.NEG: _neg, Ops.RECIPROCAL: lambda f, op, dt, a, sdt: f.emit(f"fdiv {ltype(dt)} {lconst(1.0, dt)}, {a[0]}"),
    Ops.MULACC: lambda f, op, dt, a, sdt: f.alu(Ops.ADD, dt, [f.alu(Ops.MUL, dt, a[:2], sdt), a[2]], sdt),
    **{op: _arith for op in (Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR)}}
LLVMRenderer.alu_rules = ALU_RULES


__all__ = ["LLVMRenderer", "lconst", "ltype", "mtype", "suffix"]
