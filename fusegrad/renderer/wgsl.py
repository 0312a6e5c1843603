"""The WGSL renderer: linear program -> one WebGPU compute shader. Output ranges arrive as work-item ids (SPECIAL, from
codegen/gpudims.py); the workgroup size is compiled into the shader (`@workgroup_size`), so it is rendered from the
launch shape codegen hands over.

WGSL has 32-bit scalars (plus f16 with the shader-f16 feature) and no pointers to narrower types, so 1- and 2-byte
dtypes (bool, int8, uint8, int16, uint16, and bfloat16 through codegen/decompose.py) are stored packed in `u32` words:
a load extracts the byte(s), a store clears and sets them with two atomics on the word (the element's owner is the
only writer of those bits, and the atomics keep the neighbours' bits intact). In registers they live as i32/u32/bool
and every result is wrapped back to the dtype's width, as `ir/alu.py` does.
"""
from __future__ import annotations

import math
import struct

from fusegrad.dtype import DType, PtrDType, dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.renderer import AluRule, Rule, TextKernel, TextRenderer, alu_rules, close_block, range_name

NARROW = {dtypes.bool: 1, dtypes.int8: 1, dtypes.uint8: 1, dtypes.int16: 2, dtypes.uint16: 2}  # bytes in a u32 word
REG_TYPE = {dtypes.bool: "bool", dtypes.int8: "i32", dtypes.uint8: "u32", dtypes.int16: "i32", dtypes.uint16: "u32",
            dtypes.int32: "i32", dtypes.uint32: "u32", dtypes.float32: "f32", dtypes.float16: "f16"}

# WGSL lets a compiler assume there are no NaNs, and lavapipe does fold `x != x` to false: NaN tests look at the bits.
# Float -> int conversions follow ir/alu.cast_value (truncate, wrap modulo 2^32, NaN and inf give 0), where WGSL clamps.
HELPERS = {
    "fg_isnan": "fn fg_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }",
    "fg_f2u": """fn fg_f2u(x: f32) -> u32 {
  if ((bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u) { return 0u; }
  let a = abs(trunc(x));
  let m = u32(a - floor(a / 4294967296.0f) * 4294967296.0f);  // exact: |x| mod 2^32 keeps a subset of its bits
  return select(m, 0u - m, x < 0.0f);
}""",
}


def _narrow_wrap(dt: DType, x: str) -> str:
    """An i32/u32 register value wrapped to a 1- or 2-byte integer dtype (sign-extended for the signed ones)."""
    bits = 8 * NARROW[dt]
    if dtypes.is_unsigned(dt): return f"({x} & {(1 << bits) - 1}u)"
    return f"(({x} << {32 - bits}u) >> {32 - bits}u)"


def _grid_id(grid: list[int], local_size: tuple[int, ...], dim: int) -> str:
    """The u32 work-item id along `dim`: its workgroup (recovered from the flat group number) * size + local id."""
    stride = math.prod(grid[:dim])
    group = "fg_group" if stride == 1 else f"(fg_group / {stride}u)"
    if dim < len(grid) - 1: group = f"({group} % {grid[dim]}u)"  # the last dimension needs no wrap: fg_group < total
    lid = f"lid.{'xyz'[dim]}"
    if grid[dim] == 1: return lid
    return f"{group} * {local_size[dim]}u + {lid}" if local_size[dim] > 1 else group


class WGSLRenderer(TextRenderer):
    """WGSL for WebGPU compute. Native: bool, int8/uint8/int16/uint16 (packed, see above), int32, uint32, float32, and
    float16 when the device has shader-f16; bfloat16 is emulated by codegen/decompose.py. No 64-bit types."""
    device = "WEBGPU"
    has_local = True
    local_size_in_source = True     # render(name, uops, local_size): @workgroup_size is part of the shader
    global_max = (2**31 - 1,) * 3   # work-item ids are i32; the runtime folds any number of workgroups into a dispatch
    local_max = 256                 # the device's limits (maxComputeInvocationsPerWorkgroup, ...), set by the runtime
    local_dim_max = (256, 256, 64)

    def __init__(self, f16: bool = False):
        self.f16 = f16

    def native_dtypes(self) -> list[DType]:
        return [d for d in dtypes.all if d in REG_TYPE and (d != dtypes.float16 or self.f16)]

    def supported_dtypes(self) -> list[DType]:
        return self.native_dtypes() + [dtypes.bfloat16, *dtypes.fp8s]

    def reg_type(self, dt: DType) -> str:
        if dt.count > 1 or dt.scalar() not in self.native_dtypes():
            kind = "bool" if dt == dtypes.bool else "float" if dtypes.is_float(dt) else \
                "uint" if dtypes.is_unsigned(dt) else "int"
            raise RuntimeError(f"dtype {dt!r} ({kind}{dt.scalar().bitsize * (kind != 'bool') or ''}) is not supported "
                               f"on the {self.device} device; it supports {', '.join(map(repr, self.supported_dtypes()))}")
        return REG_TYPE[dt.scalar()]

    # ---- values

    def render_const(self, val: object, dt: DType) -> str:
        if dt == dtypes.bool: return "true" if val else "false"
        if dtypes.is_float(dt):
            assert isinstance(val, (float, int))
            if dt == dtypes.float16:
                try: h = float(struct.unpack("e", struct.pack("e", val))[0])  # the nearest half
                except OverflowError: h = math.copysign(math.inf, val)
                if math.isnan(h) or math.isinf(h): return f"f16({self.render_const(h, dtypes.float32)})"
                return f"{h!r}h"
            if math.isnan(val): return "bitcast<f32>(0x7fc00000u)"
            if math.isinf(val): return f"bitcast<f32>({'0xff800000u' if val < 0 else '0x7f800000u'})"
            return f"{float(val)!r}f"
        assert isinstance(val, int)
        if self.reg_type(dt) == "u32": return f"{val & 0xFFFFFFFF}u"
        if val == -2**31: return "bitcast<i32>(0x80000000u)"
        return f"{val}i"

    def render_cast(self, dt: DType, x: str, src: DType) -> str:
        if dt == src: return x
        if dt == dtypes.bool: return self._alu(Ops.CMPNE, dt, [x, self.render_const(0, src)], src)  # NaN: true
        t = self.reg_type(dt)
        if dtypes.is_float(dt): return f"{t}({x})"
        if dtypes.is_float(src):
            bits = f"fg_f2u(f32({x}))" if src == dtypes.float16 else f"fg_f2u({x})"
            out = bits if t == "u32" else f"bitcast<i32>({bits})"
        else: out = f"{t}({x})"  # bool -> 0/1; i32 <-> u32 keeps the bits (sign-extends a narrow signed value)
        return _narrow_wrap(dt, out) if dt in NARROW else out

    def render_bitcast(self, dt: DType, x: str, src: DType) -> str:
        if dt in (dtypes.int32, dtypes.uint32, dtypes.float32) and src in (dtypes.int32, dtypes.uint32, dtypes.float32):
            return f"bitcast<{self.reg_type(dt)}>({x})"
        # f16 <-> 16-bit ints through the f32 pack builtins (exact for every f16; naga rejects bitcasts of vec2<f16>)
        if dt == dtypes.float16 and src in (dtypes.int16, dtypes.uint16):
            return f"f16(unpack2x16float(u32({x}) & 0xffffu).x)"
        if src == dtypes.float16 and dt in (dtypes.int16, dtypes.uint16):
            return self.render_cast(dt, f"pack2x16float(vec2<f32>(f32({x}), 0.0f))", dtypes.uint32)
        if dt in NARROW and src in NARROW and NARROW[dt] == NARROW[src] and dt != dtypes.bool:
            return self.render_cast(dt, x, src)  # same width: the wrap reinterprets the bits
        raise RuntimeError(f"{self.device} can't bitcast {src} to {dt}")

    def render_alu(self, op: Ops, dt: DType, a: list[str], src: DType) -> str:
        out = self._alu(op, dt, a, src)
        wraps = (Ops.ADD, Ops.MUL, Ops.NEG, Ops.SHL, Ops.IDIV, Ops.MULACC)
        return _narrow_wrap(dt, out) if dt in NARROW and dt != dtypes.bool and op in wraps else out

    def _alu(self, op: Ops, dt: DType, a: list[str], src: DType) -> str:
        """One ALU op on operand expressions: the bool table for bool operands (WGSL's bool has no arithmetic), else
        the ALU table (both filled in below the class)."""
        rules = self.bool_alu_rules if src == dtypes.bool and op in self.bool_alu_rules else self.alu_rules
        return rules[op](self, op, dt, a, src)

    # op -> rule(renderer, op, dtype, operand expressions, last operand's dtype) -> the expression; filled in below
    alu_rules: dict[Ops, AluRule] = {}
    bool_alu_rules: dict[Ops, AluRule] = {}

    # ---- the program: the shared walk (renderer/__init__.py TextKernel) with the WGSL rule table below; single-use
    # values are inlined however deep they nest (TextRenderer.max_nest is None)

    def cant_render(self, op: Ops) -> str: return f"{self.device} can't render {op}"

    def names_operands_twice(self, u: UOp) -> bool:
        """The templates that mention an operand twice: MAX, float CMPNE (NaN tests), integer IDIV/MOD (the x/0 guard)
        and float -> bool CAST (through CMPNE)."""
        return u.op is Ops.MAX or (u.op is Ops.CMPNE and dtypes.is_float(u.src[0].dtype)) or \
            (u.op in (Ops.IDIV, Ops.MOD) and not dtypes.is_float(u.dtype)) or \
            (u.op is Ops.CAST and u.dtype == dtypes.bool and dtypes.is_float(u.src[0].dtype))

    def render_let(self, name: str, dt: DType, expr: str) -> str:
        return f"let {name}: {self.reg_type(dt)} = {expr};"

    def render(self, name: str, uops: list[UOp], local_size: tuple[int, ...] = (1, 1, 1)) -> str:
        for u in uops:  # a clear error for a dtype WGSL lacks, before anything is rendered
            if u.dtype.base != dtypes.void: self.reg_type(u.dtype.base)
        k = _Shader(self, name, uops, local_size).walk()
        src = "\n".join(k.body)
        helpers = [h for fn, h in HELPERS.items() if fn + "(" in src]
        head = ["enable f16;"] * any(u.dtype.base == dtypes.float16 for u in uops) + helpers + k.args
        wg = ", ".join(str(s) for s in (tuple(local_size) + (1, 1, 1))[:3])
        builtins = "@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, " \
            "@builtin(local_invocation_id) lid: vec3<u32>"
        return "\n".join(head) + f"\n@compute @workgroup_size({wg})\nfn {name}({builtins}) {{\n{src}\n}}\n"

    rules: dict[Ops, Rule] = {}  # filled in below the class (the rules are module functions)

    @staticmethod
    def grid_preamble(grid: list[int]) -> list[str]:
        """The workgroups of all grid dimensions are numbered flat, x fastest: WebGPU caps each dispatch dimension at
        65535 workgroups, so the runtime dispatches the flat count as (up to 65535, rows, 1) and the groups past the
        end return at once. Each dimension's group is recovered by div/mod, so any grid size works."""
        return ["  let fg_group: u32 = wid.x + nwg.x * (wid.y + nwg.y * wid.z);",
                f"  if (fg_group >= {math.prod(grid)}u) {{ return; }}"]

    def load_expr(self, idx: UOp, r: dict[UOp, str], atomic: bool) -> str:
        buf, base = idx.src[0], idx.src[0].dtype.base
        if base not in NARROW: return r[idx]
        width = NARROW[base]
        per, sh = 4 // width, 8 * width
        word = f"{r[buf]}[{r[idx]} >> {per.bit_length() - 1}u]"
        if atomic: word = f"atomicLoad(&{word})"  # a buffer this kernel also writes is declared atomic
        bits = f"(({word} >> (({r[idx]} & {per - 1}u) * {sh}u)) & {(1 << sh) - 1}u)"
        if base == dtypes.bool: return f"({bits} != 0u)"
        return bits if dtypes.is_unsigned(base) else f"((bitcast<i32>({bits}) << {32 - sh}u) >> {32 - sh}u)"

    def store_stmt(self, idx: UOp, val: str, r: dict[UOp, str]) -> str:
        buf, base = idx.src[0], idx.src[0].dtype.base
        if base not in NARROW: return f"{r[idx]} = {val};"
        width = NARROW[base]
        per, sh = 4 // width, 8 * width
        word = f"&{r[buf]}[{r[idx]} >> {per.bit_length() - 1}u]"
        shift = f"(({r[idx]} & {per - 1}u) * {sh}u)"
        bits = f"u32({val})" if base != dtypes.bool else f"select(0u, 1u, {val})"
        return f"atomicAnd({word}, ~({(1 << sh) - 1}u << {shift})); " \
            f"atomicOr({word}, ({bits} & {(1 << sh) - 1}u) << {shift});"


class _Shader(TextKernel):
    """One shader being rendered: the text walk's state plus the launch grid, the buffers the shader writes (declared
    read_write, atomic when packed) and the count of variables bound so far. `args` holds the module declarations."""

    def __init__(self, renderer: WGSLRenderer, name: str, uops: list[UOp], local_size: tuple[int, ...]):
        super().__init__(renderer, name, uops)
        self.local_size = local_size
        # workgroups per grid dimension: the launch folds them into one flat count (see grid_preamble)
        sizes = {int(u.arg[3:]): int(u.src[0].arg) for u in uops if u.op is Ops.SPECIAL}
        self.grid = [sizes.get(d, 1) // (tuple(local_size) + (1, 1, 1))[d] for d in range(max(sizes, default=-1) + 1)]
        self.written = {u.src[0].src[0] for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM}
        self.n_params, self.n_vars = sum(1 for u in uops if u.op is Ops.PARAM), 0


# ---- the WGSL rule table: rule(renderer, shader, u) -> u's value

def _param(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    base = u.dtype.base
    elem = ("atomic<u32>" if u in k.written else "u32") if base in NARROW else REG_TYPE[base]
    access = "read_write" if u in k.written else "read"
    k.args.append(f"@group(0) @binding({u.arg}) var<storage, {access}> data{u.arg}: array<{elem}>;")
    return f"data{u.arg}"


def _define_var(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    # symbolic sizes: the runtime binds their values as one i32 array after the buffers
    if u.dtype.itemsize > 4:
        raise NotImplementedError(f"WEBGPU: variable {u.arg[0]!r} needs 64 bits (WGSL has no 64-bit ints)")
    if not k.n_vars: k.args.append(f"@group(0) @binding({k.n_params}) var<storage, read> fg_vars: array<i32>;")
    k.line(f"let {u.arg[0]}: i32 = fg_vars[{k.n_vars}];")
    k.n_vars += 1
    return u.arg[0]


def _special(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    if u.arg[:3] != "gid": raise RuntimeError(f"{w.device} can't render SPECIAL {u.arg}")
    if "grid" not in k.needs:  # the first work-item id: recover the workgroup numbers first
        k.needs.add("grid")
        k.body.extend(w.grid_preamble(k.grid))
    t = w.reg_type(u.dtype)
    k.line(f"let {u.arg}: {t} = {t}({_grid_id(k.grid, k.local_size, int(u.arg[3:]))});")
    return u.arg


def _define_reg(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    nm, dt = k.new_name("acc"), u.dtype
    assert isinstance(dt, PtrDType)  # one accumulator is a plain variable: llvmpipe keeps it in a register
    t = w.reg_type(dt.base)
    k.line(f"var {nm}: {t};" if dt.size == 1 else f"var {nm}: array<{t}, {dt.size}>;")
    return nm


def _range(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    nm, t = range_name(u), w.reg_type(u.dtype)
    k.line(f"for (var {nm}: {t} = {w.render_const(0, u.dtype)}; {nm} < {k.r[u.src[0]]}; {nm}++) {{")
    return nm


def _index(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    buf, base = u.src[0], u.src[0].dtype.base
    if buf.op is Ops.PARAM and base in NARROW:  # packed: the element index, as u32, is used twice
        return k.bind(f"u32({k.r[u.src[1]]})", dtypes.uint32, "idx")
    if buf.op is Ops.DEFINE_REG and buf.dtype.size == 1: return k.r[buf]  # type: ignore[attr-defined]
    return f"{k.r[buf]}[{k.r[u.src[1]]}]"


def _load(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    idx = u.src[0]
    mem = w.load_expr(idx, k.r, idx.src[0] in k.written) if idx.src[0].op is Ops.PARAM else k.r[idx]
    # a gated load reads memory anyway: WGSL makes out-of-bounds reads harmless (clamped or zero)
    expr = mem if len(idx.src) < 3 else f"select({w.render_const(0, u.dtype)}, {mem}, {k.r[idx.src[2]]})"
    return expr if idx.src[0].op is Ops.DEFINE_REG else k.bind(expr, u.dtype, "val")


def _store(w: WGSLRenderer, k: _Shader, u: UOp) -> str:
    idx, val = u.src[0], k.r[u.src[1]]
    stmt = w.store_stmt(idx, val, k.r) if idx.src[0].op is Ops.PARAM else f"{k.r[idx]} = {val};"
    k.line(stmt if len(idx.src) < 3 else f"if ({k.r[idx.src[2]]}) {{ {stmt} }}")
    return ""


WGSLRenderer.rules = {
    Ops.PARAM: _param, Ops.DEFINE_VAR: _define_var, Ops.CONST: lambda w, k, u: w.render_const(u.arg, u.dtype),
    Ops.SPECIAL: _special, Ops.DEFINE_REG: _define_reg, Ops.RANGE: _range, Ops.END: close_block, Ops.INDEX: _index,
    Ops.LOAD: _load, Ops.STORE: _store, **alu_rules()}


# ---- the ALU tables: rule(renderer, op, dtype, operand expressions, last operand's dtype) -> the expression

def _isnan(src: DType, x: str) -> str:
    return f"fg_isnan(f32({x}))" if src == dtypes.float16 else f"fg_isnan({x})"


def _cmpne(w: WGSLRenderer, op: Ops, dt: DType, a: list[str], src: DType) -> str:
    # true when either side is NaN (WGSL's != may be ordered)
    if dtypes.is_float(src): return f"({a[0]} != {a[1]} || {_isnan(src, a[0])} || {_isnan(src, a[1])})"
    return f"({a[0]} != {a[1]})"


def _divmod(w: WGSLRenderer, op: Ops, dt: DType, a: list[str], src: DType) -> str:
    # truncating, like C; x/0 and x%0 give 0 as in ir/alu.py
    sym = "/" if op is Ops.IDIV else "%"
    if dtypes.is_float(src): return f"({a[0]} {sym} {a[1]})"
    return f"select({a[0]} {sym} {a[1]}, {w.render_const(0, dt)}, {a[1]} == {w.render_const(0, dt)})"


def _max(w: WGSLRenderer, op: Ops, dt: DType, a: list[str], src: DType) -> str:
    if dtypes.is_float(src): return f"select({a[1]}, {a[0]}, {a[0]} > {a[1]} || {_isnan(src, a[0])})"
    return f"max({a[0]}, {a[1]})"


def _math(fn: str) -> AluRule:
    # float16: math in f32, rounded once, like the C target
    return lambda w, op, dt, a, src: f"f16({fn}(f32({a[0]})))" if dt == dtypes.float16 else f"{fn}({a[0]})"


def _infix(sym: str) -> AluRule:
    return lambda w, op, dt, a, src: f"({a[0]} {sym} {a[1]})"


WGSLRenderer.alu_rules = {
    **{op: _infix(sym) for op, sym in {Ops.ADD: "+", Ops.MUL: "*", Ops.CMPLT: "<", Ops.AND: "&", Ops.OR: "|",
                                        Ops.XOR: "^"}.items()},
    Ops.CMPNE: _cmpne, Ops.IDIV: _divmod, Ops.MOD: _divmod, Ops.MAX: _max,
    Ops.SHL: lambda w, op, dt, a, src: f"({a[0]} << u32({a[1]}))",
    Ops.SHR: lambda w, op, dt, a, src: f"({a[0]} >> u32({a[1]}))",
    Ops.NEG: lambda w, op, dt, a, src: f"({w.render_const(0, dt)} - {a[0]})" if dtypes.is_unsigned(dt) else \
        f"(-{a[0]})",
    Ops.WHERE: lambda w, op, dt, a, src: f"select({a[2]}, {a[1]}, {a[0]})",
    Ops.MULACC: lambda w, op, dt, a, src: f"(({a[0]} * {a[1]}) + {a[2]})",
    Ops.RECIPROCAL: lambda w, op, dt, a, src: f"({w.render_const(1.0, dt)} / {a[0]})",
    **{op: _math(fn) for op, fn in {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin",
                                     Ops.TRUNC: "trunc"}.items()}}
WGSLRenderer.bool_alu_rules = {  # bool operands: logic instead of arithmetic
    **{op: _infix("||") for op in (Ops.ADD, Ops.OR, Ops.MAX)}, **{op: _infix("&&") for op in (Ops.MUL, Ops.AND)},
    **{op: _infix("!=") for op in (Ops.XOR, Ops.CMPNE)}, Ops.CMPLT: lambda w, op, dt, a, src: f"(!{a[0]} && {a[1]})",
    Ops.NEG: lambda w, op, dt, a, src: f"(!{a[0]})"}


__all__ = ["WGSLRenderer"]
