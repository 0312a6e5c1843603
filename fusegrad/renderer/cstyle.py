"""The C-style renderer: linear program -> C source, as two rule tables on the shared statement walk
(renderer/__init__.py TextKernel): `CStyleLanguage.rules` (one rule per op of the program) and `C_ALU` (one expression
template per ALU op). Other C-like targets (OpenCL, CUDA, Metal) subclass it and change a few strings (the kernel
prefix, buffer qualifiers, type names and math functions), hooks, or single table entries.
"""
from __future__ import annotations

import math

from fusegrad.dtype import DType, PtrDType, dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.symbolic import build_sum, split_terms
from fusegrad.renderer import AluRule, Rule, TextKernel, TextRenderer, alu_rules, close_block, is_pure, range_name, \
    value_rule

# An operation used once is written into its user's expression; a chain deeper than this gets a variable every
# MAX_NEST operations, so a fused chain of 100,000 ops is 100,000/MAX_NEST statements rather than one expression
# nested 100,000 deep (quadratic to build, and more than a C compiler's parser takes)
MAX_NEST = 64


class CStyleLanguage(TextRenderer):
    kernel_prefix = "void "
    buffer_prefix = ""
    buffer_suffix = " restrict"
    arg_int_prefix = "const int"
    type_map: dict[DType, str] = {
        dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
        dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long", dtypes.float32: "float", dtypes.float64: "double",
        dtypes.float16: "_Float16"}
    infinity = "__builtin_inff()"
    nan = "__builtin_nanf(\"\")"
    # math functions on float; other float dtypes compute through float (double uses its own)
    float_fn = {Ops.SQRT: "__builtin_sqrtf", Ops.EXP2: "__builtin_exp2f", Ops.LOG2: "__builtin_log2f",
                Ops.SIN: "__builtin_sinf", Ops.TRUNC: "__builtin_truncf"}
    double_fn = {Ops.SQRT: "__builtin_sqrt", Ops.EXP2: "__builtin_exp2", Ops.LOG2: "__builtin_log2",
                 Ops.SIN: "__builtin_sin", Ops.TRUNC: "__builtin_trunc"}

    def native_dtypes(self) -> list[DType]:
        return [d for d in dtypes.all if d in self.type_map]

    def supported_dtypes(self) -> list[DType]:
        """Native types plus bfloat16 and fp8, which codegen emulates with float32 math on their bit patterns."""
        return self.native_dtypes() + [d for d in (dtypes.bfloat16, *dtypes.fp8s) if d not in self.type_map]

    # ops the target's vector types do natively (GCC/Clang vector extensions); others are rendered lane by lane
    vector_ops = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIPROCAL, Ops.AND, Ops.OR, Ops.XOR}
    scalar_shift_counts = False  # ClangRenderer: narrow-lane shifts by one constant rendered with a scalar count

    def render_dtype(self, dt: DType) -> str:
        if dt.scalar() not in self.type_map: raise RuntimeError(f"{type(self).__name__} has no type for {dt}")
        if dt.count > 1: return f"{self.vector_elem(dt).replace(' ', '_')}_x{dt.count}"
        return self.type_map[dt.scalar()]

    def vector_elem(self, dt: DType) -> str:
        return "unsigned char" if dt.scalar() == dtypes.bool else self.type_map[dt.scalar()]

    # the signed integer type as wide as each float type (vector compares give masks of it)
    mask_elem = {dtypes.float32: "int", dtypes.float64: "long long"}

    def vector_typedefs(self, dts: set[DType], max_dts: set[DType] = frozenset(),
                        where_dts: set[DType] = frozenset()) -> list[str]:
        """GCC/Clang vector types: T_xN (aligned, for registers) and T_xN_u (any alignment, for memory access), a
        vmax_T_xN function for each vector type that takes a MAX (a NaN-propagating select on compare masks), and a
        vwhere_T_xN function for each vector type a WHERE selects (a bitwise blend on a mask widened from the bools)."""
        out = []
        masks: set[str] = set()

        def mask_type(dt: DType, nbytes: int) -> str:
            elem = {1: "signed char", 2: "short", 4: "int", 8: "long long"}[dt.scalar().itemsize if dt.scalar() !=
                                                                             dtypes.bool else 1]
            m = f"{elem.replace(' ', '_')}_m{dt.count}"
            if m not in masks:
                masks.add(m)
                out.append(f"typedef {elem} {m} __attribute__((vector_size({nbytes})));")
            return m
        for dt in sorted(dts, key=lambda d: (d.scalar().name, d.count)):
            nbytes = dt.count * (1 if dt.scalar() == dtypes.bool else dt.scalar().itemsize)
            name, elem = self.render_dtype(dt), self.vector_elem(dt)
            out += [f"typedef {elem} {name} __attribute__((vector_size({nbytes})));",
                    f"typedef {elem} {name}_u __attribute__((vector_size({nbytes}), aligned({dt.scalar().itemsize})));"]
            if dt in where_dts:
                # GCC 12 at -O2 -march=native (AVX-512) miscompiles the lane-wise `c[i]?a[i]:b[i]` when the bools are
                # a broadcast scalar compare (lanes 1.. read as false); a blend on an explicit mask is both correct
                # and one instruction
                m = mask_type(dt, nbytes)
                bools = self.render_dtype(dtypes.bool.vec(dt.count))
                lanes = ", ".join(f"c[{i}]" for i in range(dt.count))
                out.append(f"static inline {name} vwhere_{name}({bools} c, {name} a, {name} b) {{ "
                           f"{m} k = -({m}){{{lanes}}}; return ({name})((({m})a & k) | (({m})b & ~k)); }}")
            if dt not in max_dts: continue
            if dt.scalar() in self.mask_elem:
                m = mask_type(dt, nbytes)
                out.append(f"static inline {name} vmax_{name}({name} a, {name} b) {{ {m} k = (a > b) | (a != a); "
                           f"return ({name})((({m})a & k) | (({m})b & ~k)); }}")
            else:
                out.append(f"static inline {name} vmax_{name}({name} a, {name} b) {{ {name} k = a > b; "
                           f"return (a & k) | (b & ~k); }}")
        return out

    def masked_load_helpers(self, dt: DType, step: int) -> list[str]:
        """The two sides of a masked vector load of lanes `step` elements apart (codegen/vectorize.py): vmload<step>
        reads only the lanes whose gate holds (the others are zero), lane by lane; vload2 reads 2N contiguous elements
        as two vector loads and keeps the even ones (one two-source permute on AVX-512)."""
        v, n, elem = self.render_dtype(dt), dt.count, self.buffer_type(dt.scalar())
        out = [f"static inline {v} vmload{step}_{v}(const {elem}* p, {self.render_dtype(dtypes.bool.vec(n))} m) {{ "
               f"{v} r = {{0}}; for (int i = 0; i < {n}; i++) if (m[i]) r[i] = p[i * {step}]; return r; }}"]
        if step == 2:
            even = ", ".join(str(2 * i) for i in range(n))
            out.append(f"static inline {v} vload2_{v}(const {elem}* p) {{ {v} a = *({v}_u*)p, b = *({v}_u*)(p + {n}); "
                       f"return __builtin_shufflevector(a, b, {even}); }}")
        return out

    def has_vector_where(self, dt: DType) -> bool:
        return dt.count > 1 and dt.scalar().itemsize in (1, 2, 4, 8)

    def has_vector_max(self, dt: DType) -> bool:
        return dt.count > 1 and (dt.scalar() in self.mask_elem or (dtypes.is_int(dt) and dt.scalar().itemsize >= 4))

    def render_lanes(self, dt: DType, lanes: list[str]) -> str:
        return f"(({self.render_dtype(dt)}){{{', '.join(_strip(x) for x in lanes)}}})"

    def render_gep(self, x: str, i: int) -> str:
        """Lane i of vector x (OpenCL spells it x.s<i>)."""
        return f"{x}[{i}]"

    def render_vload(self, dt: DType, addr: str) -> str:
        """A vector load of dt.count elements from buffer element `addr` (any element alignment)."""
        return f"(*({self.render_dtype(dt)}_u*)&{addr})"

    def render_vstore(self, dt: DType, addr: str, val: str) -> str:
        return f"*({self.render_dtype(dt)}_u*)&{addr} = {val};"

    def render_const(self, val: object, dt: DType) -> str:
        if dtypes.is_float(dt):
            assert isinstance(val, float)
            if math.isnan(val): s = self.nan
            elif math.isinf(val): s = ("-" if val < 0 else "") + self.infinity
            else: s = repr(val) + ("" if dt == dtypes.float64 else "f")
            return s if dt in (dtypes.float32, dtypes.float64) else f"(({self.render_dtype(dt)}){s})"
        if dtypes.is_bool(dt): return "1" if val else "0"
        assert isinstance(val, int)
        if val == dtypes.min(dt) and not dtypes.is_unsigned(dt):
            return f"({self.render_const(val + 1, dt)}-1)"
        suffix = {dtypes.int64: "ll", dtypes.uint64: "ull", dtypes.uint32: "u"}.get(dt.scalar(), "")
        return f"{val}{suffix}" if dt.itemsize >= 4 else f"(({self.render_dtype(dt)}){val})"

    def render_alu(self, op: Ops, dt: DType, a: list[str], src_dtype: DType) -> str:
        if op is Ops.MAX and self.has_vector_max(dt): return f"vmax_{self.render_dtype(dt)}({a[0]}, {a[1]})"
        if op is Ops.WHERE and self.has_vector_where(dt): return f"vwhere_{self.render_dtype(dt)}({', '.join(a)})"
        if dt.count > 1 and (op not in self.vector_ops or dt.scalar() == dtypes.bool):
            return self.render_lanes(dt, [self.render_alu(op, dt.scalar(), [self.render_gep(x, i) for x in a], src_dtype.scalar())
                                          for i in range(dt.count)])
        if dt.count == 1 and dtypes.is_int(dt) and dt.itemsize < 4 and op in (Ops.ADD, Ops.MUL, Ops.NEG, Ops.SHL,
                                                                              Ops.IDIV, Ops.MULACC):
            # C promotes 8/16-bit operands to int, so the result only wraps where it is stored; a fused cast, compare
            # or sum would see the unwrapped value ((int8 100 * 100) < 1). Narrow it back right away
            return f"(({self.render_dtype(dt)}){self._render_alu(op, dt, a, src_dtype)})"
        return self._render_alu(op, dt, a, src_dtype)

    def _render_alu(self, op: Ops, dt: DType, a: list[str], src_dtype: DType) -> str:
        """The expression of one ALU op on operand expressions `a`: the renderer's ALU table (C_ALU below)."""
        return self.alu_rules[op](self, op, dt, a, src_dtype)

    alu_rules: dict[Ops, AluRule] = {}  # op -> rule(renderer, op, dtype, operands, src dtype), below

    def render_math(self, op: Ops, dt: DType, x: str) -> str:
        if dt == dtypes.float64: return f"{self.double_fn[op]}({x})"
        if dt == dtypes.float32: return f"{self.float_fn[op]}({x})"
        return f"(({self.render_dtype(dt)}){self.float_fn[op]}((float)({x})))"

    def reads_operands_once(self, u: UOp) -> bool:
        """Whether u's rendering names each operand once even on vectors (else operands get variables: lane by lane
        they would be computed once per lane)."""
        return False

    def render_cast(self, dt: DType, x: str, src_dt: DType) -> str:
        if dt.count > 1: return self.render_lanes(dt, [self.render_cast(dt.scalar(), self.render_gep(x, i), src_dt.scalar())
                                                       for i in range(dt.count)])
        return f"(({self.render_dtype(dt)})({x}))"

    def render_bitcast(self, dt: DType, x: str, src_dt: DType) -> str:
        if dt.count > 1: return self.render_lanes(dt, [self.render_bitcast(dt.scalar(), self.render_gep(x, i), src_dt.scalar())
                                                       for i in range(dt.count)])
        return f"((union {{{self.render_dtype(src_dt)} a; {self.render_dtype(dt)} b;}}){{.a={x}}}).b"

    def buffer_type(self, dt: DType) -> str:
        """The element type of a buffer argument (a target may store some types differently, e.g. bool as uchar)."""
        return self.render_dtype(dt)

    def render_special(self, u: UOp) -> str:
        raise RuntimeError(f"{type(self).__name__} has no work-item ids (SPECIAL {u.arg})")

    smem_prefix = ""  # GPU-style targets with has_shared: the declaration of workgroup memory, and its barrier
    barrier = ""

    # float reduce kernels may fuse acc + a*b into one fused multiply-add (as BLAS does); elementwise math never is
    reduce_prefix = ""

    def render_kernel(self, name: str, args: list[str], body: list[str], has_float_acc: bool = False) -> str:
        return f"{self.reduce_prefix * has_float_acc}{self.kernel_prefix}{name}({', '.join(args)}) {{\n" + "\n".join(body) + "\n}\n"

    # the shared walk (renderer/__init__.py TextKernel) with the C rule table below
    max_nest: int | None = MAX_NEST

    def names_operands_twice(self, u: UOp) -> bool:
        """Rendered lane by lane (a vector op the target lacks), or a template naming an operand twice (MAX, GEP)."""
        return ((u.op is Ops.MAX and not self.has_vector_max(u.dtype)) or
                u.dtype.count > 1 and u.op in GroupOp.ALU - {Ops.MAX} | {Ops.CAST, Ops.BITCAST}) and \
            not self.reads_operands_once(u) or u.op is Ops.GEP

    def render_let(self, name: str, dt: DType, expr: str) -> str:
        return f"{self.render_dtype(dt)} {name} = {_strip(expr)};"

    def render(self, name: str, uops: list[UOp]) -> str:
        k = TextKernel(self, name, uops).walk()
        vecs = {u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype for u in uops}
        typedefs = self.vector_typedefs({d for d in vecs if d.count > 1},
                                        {u.dtype for u in uops if u.op is Ops.MAX and self.has_vector_max(u.dtype)},
                                        {u.dtype for u in uops if u.op is Ops.WHERE and self.has_vector_where(u.dtype)})
        for mdt, step in sorted(k.needs, key=lambda d: (d[0].scalar().name, d[0].count, d[1])):
            typedefs += self.masked_load_helpers(mdt, step)
        return "\n".join(typedefs + [""]) * bool(typedefs) + self.render_kernel(
            name, k.args, k.body, any(u.op is Ops.DEFINE_REG and dtypes.is_float(u.dtype.base) for u in uops))

    rules: dict[Ops, Rule] = {}  # filled in below the class (the rules are module functions)


# ---- the C rule table: rule(renderer, kernel, u) -> u's value. A subclass extends it: {**CStyleLanguage.rules, ...}

def _param(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    k.args.append(f"{c.buffer_prefix}{c.buffer_type(u.dtype.base)}*{c.buffer_suffix} data{u.arg}")
    return f"data{u.arg}"


def _define_var(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    # a variable whose range needs 64 bits is a 64-bit argument (`const long long n`)
    prefix = c.arg_int_prefix if u.dtype == dtypes.int32 else c.arg_int_prefix.replace("int", c.render_dtype(u.dtype))
    k.args.append(f"{prefix} {u.arg[0]}")
    return u.arg[0]


def _const(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    x = c.render_const(u.arg, u.dtype.scalar())
    return c.render_lanes(u.dtype, [x] * u.dtype.count) if u.dtype.count > 1 else x


def _vectorize(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    # one source per lane: C's `(float_x8){v}` would set lane 0 and zero the rest, a quietly wrong vector
    if len(u.src) != u.dtype.count: raise RuntimeError(f"VECTORIZE of {u.dtype} has {len(u.src)} sources, not one per lane")
    expr = c.render_lanes(u.dtype, [k.r[x] for x in u.src])
    return expr if k.single_use(u) else k.bind(expr, u.dtype, "vec")


def _special(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    # a work-item id (GPU-style targets): gpudims.py names it, the target reads it
    k.line(f"{c.render_dtype(u.dtype)} {u.arg} = {c.render_special(u)};")
    return u.arg


def _define_reg(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    nm = k.new_name("acc")
    k.line(f"{c.render_dtype(u.dtype.base)} {nm}[{u.dtype.size}];")  # type: ignore[attr-defined]
    return nm


def _define_local(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:  # workgroup shared memory (GROUP reduces)
    nm = k.new_name("smem")
    k.line(f"{c.smem_prefix}{c.buffer_type(u.dtype.base)} {nm}[{u.dtype.size}];")  # type: ignore[attr-defined]
    return nm


def _range(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    nm = range_name(u)
    if u.arg[1] == "thread":  # split across threads: each call runs [core_start, core_end)
        k.args += ["int core_start", "int core_end"]
        k.line(f"for (int {nm} = core_start; {nm} < core_end; {nm}++) {{")
    else: k.line(f"for (int {nm} = 0; {nm} < {k.r[u.src[0]]}; {nm}++) {{")
    return nm


def _load(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    idx, dt = u.src[0], u.dtype
    mem = c.render_vload(dt, k.r[idx]) if dt.count > 1 and idx.src[0].op is Ops.PARAM else k.r[idx]
    zero = c.render_const(_zero(dt), dt.scalar())
    if dt.count > 1: zero = c.render_lanes(dt, [zero] * dt.count)
    if len(idx.src) == 4:  # a masked vector load: whole when every lane is in, else lane by lane
        step = idx.arg or 1
        k.needs.add((dt, step))  # its helpers: (vector type, lane step)
        v = c.render_dtype(dt)
        if step != 1: mem = f"vload{step}_{v}(&{k.r[idx]})"
        expr = f"({k.r[idx.src[2]]}?{mem}:vmload{step}_{v}(&{k.r[idx]}, {_strip(k.r[idx.src[3]])}))"
    else: expr = mem if len(idx.src) < 3 else f"({k.r[idx.src[2]]}?{mem}:{zero})"
    return expr if idx.src[0].op is Ops.DEFINE_REG else k.bind(expr, dt, "val")  # accumulators are read in place


def _store(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    idx, val = u.src[0], u.src[1]
    if val.dtype.count > 1 and idx.src[0].op is Ops.PARAM:
        k.line(c.render_vstore(val.dtype, k.r[idx], _strip(k.r[val])))
    else: k.line(f"{k.r[idx]} = {_strip(k.r[val])};")
    return ""


def _barrier(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    k.line(c.barrier)
    return ""


CStyleLanguage.rules = {
    Ops.PARAM: _param, Ops.DEFINE_VAR: _define_var, Ops.CONST: _const, Ops.VECTORIZE: _vectorize,
    Ops.GEP: lambda c, k, u: c.render_gep(k.r[u.src[0]], u.arg), Ops.SPECIAL: _special, Ops.DEFINE_REG: _define_reg,
    Ops.DEFINE_LOCAL: _define_local, Ops.BARRIER: _barrier, Ops.RANGE: _range,
    Ops.END: close_block, Ops.INDEX: lambda c, k, u: f"{k.r[u.src[0]]}[{_strip(k.r[u.src[1]])}]",
    Ops.LOAD: _load, Ops.STORE: _store, **alu_rules()}


# ---- the C ALU table: rule(renderer, op, dtype, operand expressions, last operand's dtype) -> the expression

def _c_max(c: CStyleLanguage, op: Ops, dt: DType, a: list[str], src: DType) -> str:
    if dtypes.is_float(dt): return f"((({a[0]})!=({a[0]})||({a[0]})>({a[1]}))?({a[0]}):({a[1]}))"
    return f"((({a[0]})>({a[1]}))?({a[0]}):({a[1]}))"


def _c_binop(sym: str) -> AluRule:
    return lambda c, op, dt, a, src: f"({a[0]}{sym}{a[1]})"


C_ALU: dict[Ops, AluRule] = {
    **{op: _c_binop(sym) for op, sym in {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<",
                                          Ops.CMPNE: "!=", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<",
                                          Ops.SHR: ">>"}.items()},
    Ops.NEG: lambda c, op, dt, a, src: f"(-{a[0]})", Ops.WHERE: lambda c, op, dt, a, src: f"({a[0]}?{a[1]}:{a[2]})",
    Ops.MULACC: lambda c, op, dt, a, src: f"(({a[0]}*{a[1]})+{a[2]})", Ops.MAX: _c_max,
    Ops.RECIPROCAL: lambda c, op, dt, a, src: f"({c.render_const(1.0, dt.scalar())}/{a[0]})",
    **{op: lambda c, op, dt, a, src: c.render_math(op, dt, a[0]) for op in (Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN,
                                                                           Ops.TRUNC)}}
CStyleLanguage.alu_rules = C_ALU


def _strip(s: str) -> str:
    if not (s.startswith("(") and s.endswith(")")): return s
    depth = 0
    for i, c in enumerate(s):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and i != len(s) - 1: return s
    return s[1:-1]


def _half_fn(name: str, n: int) -> str:
    """fg_h2f / fg_f2h for n lanes: fg_h2f_xN for a vector, fg_h2f for one value."""
    return f"{name}_x{n}" if n > 1 else name


def _unround_half(x: str, n: int) -> str:
    """float32 lanes of float16 expression x (n lanes): fg_f2h(e) is e itself (not rounded), else a conversion."""
    head = f"{_half_fn('fg_f2h', n)}("
    if x.startswith(head) and _strip(x[len(head) - 1:]) != x[len(head) - 1:]: return x[len(head):-1]
    return f"{_half_fn('fg_h2f', n)}({x})"


# one float16 value <-> float32 (C's conversions), so float16 math is float32 math rounded where a value is stored or
# named whether or not the target has float16 arithmetic (with AVX512-FP16, GCC computes _Float16 in _Float16)
HALF_SCALAR_C = ("static inline float fg_h2f(_Float16 x) { return (float)x; }\n"
                 "static inline _Float16 fg_f2h(float x) { return (_Float16)x; }")


def _zero(dt: DType) -> object:
    return 0.0 if dtypes.is_float(dt) else False if dtypes.is_bool(dt) else 0


# exp2 and log2 for float as branch-free C the compiler can vectorize (libm's exp2f/log2f are calls it can't), both
# within ~1.3 ulp over the whole float range, with IEEE special values (NaN, +-inf, 0, subnormals)
FAST_MATH_C = {
    # NaN-propagating max. Written as `(a != a || a > b) ? a : b` GCC branches on each compare (a 2x2 max pool ran 10x
    # slower than with a plain max: the branches mispredict); the larger value first, then the NaN fix, compiles to
    # selects it can vectorize. Used for every scalar float max but a reduce's accumulator update
    "fg_maxf": "static inline float fg_maxf(float a, float b) { float r = a > b ? a : b; return a != a ? a : r; }",
    "fg_maxd": "static inline double fg_maxd(double a, double b) { double r = a > b ? a : b; return a != a ? a : r; }",
    "fg_exp2f": """static inline float fg_exp2f(float x) {
  float xc = x < -150.0f ? -150.0f : x > 128.0f ? 128.0f : x;   /* NaN passes through both compares */
  float k = __builtin_rintf(xc), f = xc - k;                    /* 2^x = 2^k * 2^f, f in [-0.5, 0.5] */
  float p = (((((1.5469732e-4f*f + 1.3400433e-3f)*f + 9.6180253e-3f)*f + 5.5503272e-2f)*f + 2.4022651e-1f)*f
             + 6.9314718e-1f)*f + 1.0f;
  int ki = (int)k, a = ki >> 1, b = ki - a;                     /* 2^k as two normal factors: reaches subnormals */
  union { int i; float f; } sa = {.i = (a + 127) << 23}, sb = {.i = (b + 127) << 23};
  return x != x ? x : p * sa.f * sb.f;
}""",
    "fg_log2f": """static inline float fg_log2f(float x) {
  int sub = x < 1.17549435e-38f;                                /* subnormals: scale into the normal range */
  union { float f; int i; } u = {.f = sub ? x * 8388608.0f : x};
  int e = ((u.i >> 23) & 0xff) - 127 - 23 * sub;
  u.i = (u.i & 0x007fffff) | 0x3f800000;                        /* mantissa m in [1, 2) */
  int big = u.f > 1.41421356f;
  float m = big ? u.f * 0.5f : u.f;                             /* m in [sqrt(1/2), sqrt(2)) */
  float s = (m - 1.0f) / (m + 1.0f), t = s * s;                 /* log2 m = 2/ln2 * atanh(s) */
  float q = ((0.14962947f*t + 0.19987394f)*t + 0.33333409f)*t + 1.0f;
  float r = (float)(e + big) + 2.8853900817779268f * s * q;
  return x != x || x < 0.0f ? __builtin_nanf("") : x == 0.0f ? -__builtin_inff() : x == __builtin_inff() ? x : r;
}"""}


def vector_exp2_c(w: int) -> str:
    """fg_exp2f on w-lane float vectors: the same algorithm, with compare masks and bit selects instead of branches."""
    F, I = f"float_x{w}", f"int_m{w}"
    return f"""typedef int {I} __attribute__((vector_size({4 * w})));
static inline {F} fg_exp2f_x{w}({F} x) {{
  {F} lo = ({F}){{}} - 150.0f, hi = ({F}){{}} + 128.0f;
  {I} mlo = x < lo, mhi = x > hi, mnan = x != x;
  {F} xc = ({F})((({I})lo & mlo) | ((({I})hi & mhi) | (({I})x & ~(mlo | mhi))));
  {F} k = (xc + 12582912.0f) - 12582912.0f, f = xc - k;     /* round to nearest: |xc| <= 150 */
  {F} p = (((((1.5469732e-4f*f + 1.3400433e-3f)*f + 9.6180253e-3f)*f + 5.5503272e-2f)*f + 2.4022651e-1f)*f
           + 6.9314718e-1f)*f + 1.0f;
  {I} ki = __builtin_convertvector(k, {I}), a = ki >> 1, b = ki - a;
  {F} r = p * ({F})((a + 127) << 23) * ({F})((b + 127) << 23);
  return ({F})((({I})x & mnan) | (({I})r & ~mnan));
}}"""


def vector_log2_c(w: int) -> str:
    """fg_log2f on w-lane float vectors: the scalar algorithm op for op (the same results), selects on compare masks."""
    F, I = f"float_x{w}", f"int_m{w}"
    return f"""typedef int {I} __attribute__((vector_size({4 * w})));
static inline {F} fg_log2f_x{w}({F} x) {{
  {F} tiny = ({F}){{}} + 1.17549435e-38f, zero = ({F}){{}}, inf = ({F}){{}} + __builtin_inff();
  {I} sub = x < tiny;                                          /* subnormals: scale into the normal range */
  {I} ui = ((({I})(x * 8388608.0f)) & sub) | ((({I})x) & ~sub);
  {I} e = ((ui >> 23) & 0xff) - 127 - (23 & sub);
  {F} uf = ({F})((ui & 0x007fffff) | 0x3f800000);              /* mantissa in [1, 2) */
  {I} big = uf > (({F}){{}} + 1.41421356f);
  {F} m = ({F})(((({I})(uf * 0.5f)) & big) | ((({I})uf) & ~big));
  {F} s = (m - 1.0f) / (m + 1.0f), t = s * s;
  {F} q = ((0.14962947f*t + 0.19987394f)*t + 0.33333409f)*t + 1.0f;
  {F} r = __builtin_convertvector(e - big, {F}) + 2.8853900817779268f * s * q;   /* big is -1 where set */
  {I} nan = (x != x) | (x < zero), mzero = x == zero, minf = x == inf;
  {F} ninf = zero - inf, qnan = ({F}){{}} + __builtin_nanf("");
  r = ({F})((({I})x & minf) | (({I})r & ~minf));
  r = ({F})((({I})ninf & mzero) | (({I})r & ~mzero));
  return ({F})((({I})qnan & nan) | (({I})r & ~nan));
}}"""


def half_convert_c(w: int) -> str:
    """float16 <-> float32 on w-lane vectors (fg_h2f_xW, fg_f2h_xW; round to nearest even, NaN stays NaN). GCC 12
    converts _Float16 vectors one lane at a time, so with F16C (and AVX-512F for 16 lanes) -- the -march=native
    compiler's own macros tell -- they are the vcvtph2ps / vcvtps2ph instructions through GCC's builtins (immintrin.h
    would add ~70 ms to every compile); elsewhere (Clang, ARM, no F16C) __builtin_convertvector."""
    H, F, S = f"_Float16_x{w}", f"float_x{w}", f"fg_hi{max(w, 8)}"
    if w == 16:
        cond = "defined(__AVX512F__)"
        fast = (f"return ({F})__builtin_ia32_vcvtph2ps512_mask(({S})h, ({F}){{}}, (unsigned short)-1, 4);",
                f"return ({H})__builtin_ia32_vcvtps2ph512_mask(f, 0, ({S}){{}}, (unsigned short)-1);")
    elif w == 8:
        cond = "defined(__F16C__)"
        fast = (f"return ({F})__builtin_ia32_vcvtph2ps256(({S})h);", f"return ({H})__builtin_ia32_vcvtps2ph256(f, 0);")
    else:  # 4 lanes: the 128-bit forms work on the low half of an 8-lane register
        cond = "defined(__F16C__)"
        widen = f"{S} x = ({S})__builtin_shufflevector(h, h, 0, 1, 2, 3, 0, 1, 2, 3);"
        fast = (f"{widen} return ({F})__builtin_ia32_vcvtph2ps(x);",
                f"{S} x = __builtin_ia32_vcvtps2ph(f, 0); return ({H})__builtin_shufflevector(x, x, 0, 1, 2, 3);")
    # the kernel may use these vector types only inside the helpers (float16 math); C11 allows repeating a typedef
    return f"""typedef float {F} __attribute__((vector_size({4 * w})));
typedef _Float16 {H} __attribute__((vector_size({2 * w})));
typedef int fg_mf{w} __attribute__((vector_size({4 * w})));
static inline {F} fg_maxf_x{w}({F} a, {F} b) {{ fg_mf{w} k = (a > b) | (a != a);
  return ({F})(((fg_mf{w})a & k) | ((fg_mf{w})b & ~k)); }}
#if {cond} && defined(__GNUC__) && !defined(__clang__)
typedef short {S} __attribute__((vector_size({2 * max(w, 8)})));
static inline {F} fg_h2f_x{w}({H} h) {{ {fast[0]} }}
static inline {H} fg_f2h_x{w}({F} f) {{ {fast[1]} }}
#else
static inline {F} fg_h2f_x{w}({H} h) {{ return __builtin_convertvector(h, {F}); }}
static inline {H} fg_f2h_x{w}({F} f) {{ return __builtin_convertvector(f, {H}); }}
#endif"""


# (8/16-bit lane type, lanes) -> the x86 widening move to int32 lanes (GCC builtin, its operand's lane count)
_WIDEN_MOVE = {8: {16: ("bd512_mask", 16), 8: ("bd256", 16), 4: ("bd128", 16)},
               16: {16: ("wd512_mask", 16), 8: ("wd256", 8), 4: ("wd128", 8)}}
_WIDEN_NEEDS = {16: "defined(__AVX512F__)", 8: "defined(__AVX2__)", 4: "defined(__SSE4_1__)"}


def widen_name(src: DType, w: int) -> str:
    """The helper converting w lanes of 8/16-bit integer type `src` to int32 lanes (widen_convert_c)."""
    return f"fg_{src.name}_i32_x{w}"


def widen_convert_c(src: DType, w: int, src_type: str, dst_type: str) -> str:
    """w lanes of 8/16-bit integers -> int32 lanes (zero- or sign-extended). GCC 12 compiles
    `__builtin_convertvector(uchar16 -> int16)` into sixteen byte loads and inserts; with the instruction set the
    -march=native compiler's macros report it is the one widening move (vpmovzxbd, vpmovsxwd, ...) through GCC's
    builtin, the narrower vectors first spread into the 16-byte operand the builtin takes. Elsewhere
    __builtin_convertvector."""
    bits, sign = 8 * src.itemsize, "sx" if not dtypes.is_unsigned(src) else "zx"
    name = widen_name(src, w)
    generic = f"static inline {dst_type} {name}({src_type} x) {{ return __builtin_convertvector(x, {dst_type}); }}"
    if w not in _WIDEN_MOVE[bits]: return generic
    suffix, n = _WIDEN_MOVE[bits][w]
    elem = "char" if bits == 8 else "short"
    arg = f"fg_{elem}{n}"
    x = "x" if n == w else f"__builtin_shufflevector(x, x, {', '.join(str(i % w) for i in range(n))})"
    call = f"__builtin_ia32_pmov{sign}{suffix}(({arg}){x}" + \
        (f", ({dst_type}){{}}, (unsigned short)-1)" if suffix.endswith("_mask") else ")")
    return f"""#if {_WIDEN_NEEDS[w]} && defined(__GNUC__) && !defined(__clang__)
typedef {elem} {arg} __attribute__((vector_size({n * src.itemsize})));
static inline {dst_type} {name}({src_type} x) {{ return ({dst_type}){call}; }}
#else
{generic}
#endif"""


def bools_name(item: int, w: int) -> str:
    """The helper narrowing a compare's mask of w lanes of `item` bytes to a bool vector (bools_narrow_c)."""
    return f"fg_bools{item}_x{w}"


def bools_narrow_c(item: int, w: int, bool_type: str) -> str:
    """w lanes of a 0/1 mask of 4- or 8-byte integers (a negated vector compare) -> w unsigned char lanes: each lane's
    low byte, one byte shuffle (vpshufb and a permute on AVX2). GCC 12 narrows it lane by lane with
    __builtin_convertvector where the target has no narrowing move (AVX2: 70 instructions for 8 lanes, the whole cost
    of a ReLU gradient's reduce); AVX-512 has one (vpmovdb), kept."""
    elem = "int" if item == 4 else "long long"
    idx = ", ".join(str(i * item) for i in range(w))
    return f"""static inline {bool_type} {bools_name(item, w)}({elem} __attribute__((vector_size({item * w}))) m) {{
#if defined(__AVX512VL__) && defined(__AVX512BW__)
  return __builtin_convertvector(m, {bool_type});
#else
  typedef unsigned char b __attribute__((vector_size({item * w})));
  return __builtin_shufflevector((b)m, (b)m, {idx});
#endif
}}"""


class ClangRenderer(CStyleLanguage):
    """C for the CPU device, compiled by the system C compiler (flags: -ffp-contract=off, so only float reduce kernels
    get fused multiply-adds, through GCC's optimize attribute; other compilers ignore it)."""
    device = "CPU"
    reduce_prefix = '__attribute__((optimize("fp-contract=fast"))) '
    vector_math = True   # fg_exp2f_xN, fg_log2f_xN
    masked_vector_loads = True   # vmload_T_xN
    widen_narrow_vectors = True  # GCC converts uchar vectors to float and shifts them one lane at a time
    scalar_shift_counts = True   # 8/16-bit lanes shifted by one constant: `x >> 4` (_narrow_shift)
    float_fn = {**CStyleLanguage.float_fn, Ops.EXP2: "fg_exp2f", Ops.LOG2: "fg_log2f"}

    def reads_operands_once(self, u: UOp) -> bool:
        return u.op in GroupOp.ALU and self._half_vector_math(u.op, u.src[-1].dtype)

    def dot4_lanes(self) -> tuple[int, ...]:
        return self.machine.dot4_lanes() if self.machine is not None else ()

    def dot4_max_unsigned(self) -> int:
        return self.machine.dot4_max_unsigned() if self.machine is not None else 0

    @staticmethod
    def _half_vector_math(op: Ops, src_dtype: DType) -> bool:
        return src_dtype.scalar() == dtypes.float16 and src_dtype.count in (1, 4, 8, 16) and op is not Ops.WHERE

    def render_alu(self, op: Ops, dt: DType, a: list[str], src_dtype: DType) -> str:
        if self._half_vector_math(op, src_dtype):
            # float16 math is float32 math rounded where the value is stored or named: an operand inlined from another
            # op is used unrounded (a / b is a * (1/b): one rounding). GCC without AVX512-FP16 does so for scalar
            # _Float16 (excess precision) but splits vectors into one converted op per lane; with AVX512-FP16 it
            # rounds every scalar op to _Float16 (torch's float16 results differed by up to 4 ulp). So it is spelled
            # out: float32 vectors, and explicit conversions for one value.
            n, f32 = src_dtype.count, dtypes.float32.vec(src_dtype.count)
            args = [_unround_half(x, n) for x in a]
            out = f"fg_maxf_x{n}({', '.join(args)})" if op is Ops.MAX and n > 1 else \
                self.render_alu(op, f32 if dt.scalar() == dtypes.float16 else dt, args, f32)
            return f"{_half_fn('fg_f2h', n)}({out})" if dt.scalar() == dtypes.float16 else out
        if op is Ops.EXP2 and dt.count > 1 and dt.scalar() == dtypes.float32: return f"fg_exp2f_x{dt.count}({a[0]})"
        if op is Ops.LOG2 and dt.count > 1 and dt.scalar() == dtypes.float32: return f"fg_log2f_x{dt.count}({a[0]})"
        if op is Ops.MAX and dt in (dtypes.float32, dtypes.float64) and not any(x.startswith("acc") for x in a):
            # (a reduce's running max keeps the branchy form: its compare is predictable, and the selects would make
            # one long dependency chain, 3.5x slower over 4096-long rows)
            return f"fg_max{'f' if dt == dtypes.float32 else 'd'}({a[0]}, {a[1]})"
        if dt.count > 1 and dt.scalar() == dtypes.bool:
            # bool vectors are unsigned char lanes of 0/1. A compare of 32/64-bit vectors is one vector instruction
            # giving a -1/0 mask; negated and narrowed it is the bool vector (lane by lane it was N scalar compares)
            if op in (Ops.CMPLT, Ops.CMPNE) and src_dtype.count > 1 and src_dtype.scalar().itemsize in (4, 8) and \
                    src_dtype.scalar() != dtypes.bool:
                return f"{bools_name(src_dtype.scalar().itemsize, dt.count)}" \
                       f"(-({a[0]}{'<' if op is Ops.CMPLT else '!='}{a[1]}))"
            if op in (Ops.AND, Ops.OR, Ops.XOR): return self._render_alu(op, dt, a, src_dtype)  # 0/1 lanes stay 0/1
        if op in (Ops.SHL, Ops.SHR) and dt.count > 1 and dtypes.is_int(dt) and dt.scalar().itemsize >= 4:
            return self._render_alu(op, dt, a, src_dtype)  # vector shifts (bfloat16's bits <-> float32)
        if op in (Ops.SHL, Ops.SHR) and dt.count > 1 and dtypes.is_int(dt) and a[1].isdigit():
            # by one constant (_narrow_shift): GCC shifts 8/16-bit lanes as 16-bit lanes and masks (vpsrlw, vpand)
            return self._render_alu(op, dt, a, src_dtype)
        return super().render_alu(op, dt, a, src_dtype)

    def render_cast(self, dt: DType, x: str, src_dt: DType) -> str:
        """Whole-vector conversions where C's per-element cast and the vector one agree: float16 <-> float32 (F16C),
        integer -> integer (wraps, as C) and integer -> float. float -> integer (out of range differs) and anything
        with bool (C's cast tests != 0; a vector one truncates) go lane by lane."""
        if dt.count > 1 and dt.count == src_dt.count:
            pair = {dt.scalar(), src_dt.scalar()}
            if pair == {dtypes.float16, dtypes.float32} and dt.count in (4, 8, 16):
                return f"fg_{'h2f' if dt.scalar() == dtypes.float32 else 'f2h'}_x{dt.count}({x})"
            if dt.scalar() == dtypes.int32 and \
                    src_dt.scalar() in (dtypes.uint8, dtypes.int8, dtypes.uint16, dtypes.int16):
                return f"{widen_name(src_dt.scalar(), dt.count)}({x})"   # one widening move (widen_convert_c)
            if dtypes.is_int(src_dt) and (dtypes.is_int(dt) or dt.scalar() in (dtypes.float32, dtypes.float64)):
                return f"__builtin_convertvector({x}, {self.render_dtype(dt)})"
        return super().render_cast(dt, x, src_dt)

    def render_bitcast(self, dt: DType, x: str, src_dt: DType) -> str:
        # a GCC/Clang vector cast between vectors of one size reinterprets the bits
        if dt.count > 1 and dt.count * dt.scalar().itemsize == src_dt.count * src_dt.scalar().itemsize:
            return f"(({self.render_dtype(dt)})({x}))"
        return super().render_bitcast(dt, x, src_dt)

    def render_kernel(self, name: str, args: list[str], body: list[str], has_float_acc: bool = False) -> str:
        src = super().render_kernel(name, args, body, has_float_acc)
        used = [FAST_MATH_C[fn] for fn in FAST_MATH_C if fn + "(" in src]
        # the half conversions first: they define the float vector types, which a float16 kernel's body may not use
        used += [half_convert_c(w) for w in (4, 8, 16) if f"fg_h2f_x{w}(" in src or f"fg_f2h_x{w}(" in src]
        used += [vector_exp2_c(w) for w in (4, 8, 16) if f"fg_exp2f_x{w}(" in src]
        used += [vector_log2_c(w) for w in (4, 8, 16) if f"fg_log2f_x{w}(" in src]
        if "fg_h2f(" in src or "fg_f2h(" in src: used.append(HALF_SCALAR_C)
        if "__builtin_ia32_pmaddubsw" in src: used.append(DOT4_TYPES_C)
        used += [widen_convert_c(d, w, self.render_dtype(d.vec(w)), self.render_dtype(dtypes.int32.vec(w)))
                 for d in (dtypes.uint8, dtypes.int8, dtypes.uint16, dtypes.int16) for w in (2, 4, 8, 16, 32)
                 if f"{widen_name(d, w)}(" in src]
        used += [bools_narrow_c(i, w, self.render_dtype(dtypes.bool.vec(w))) for i in (4, 8) for w in (2, 4, 8, 16)
                 if f"{bools_name(i, w)}(" in src]
        return "".join(f + "\n" for f in used) + src + (_thread_trampoline(name, args) if args[-2:] ==
                                                         ["int core_start", "int core_end"] else "")


def _narrow_shift(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    """A shift of 8/16-bit integer lanes (a DOT4's unpacked nibbles: widen.py leaves them) by the same constant in
    every lane: the count as one number, which GCC shifts as a whole vector (by a vector of counts it goes lane by
    lane)."""
    amt = u.src[1]
    if c.scalar_shift_counts and u.dtype.count > 1 and u.dtype.scalar().itemsize < 4 and amt.op is Ops.VECTORIZE and \
            all(s is amt.src[0] for s in amt.src) and amt.src[0].op is Ops.CONST and \
            0 <= int(amt.src[0].arg) < 8 * u.dtype.scalar().itemsize:
        return k.value(u, c.render_alu(u.op, u.dtype, [k.r[u.src[0]], str(int(amt.src[0].arg))], u.src[-1].dtype))
    return value_rule(c, k, u)


def _dot4(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    """Ops.DOT4 (codegen/dot4.py) on n int32 lanes: x86 VNNI's vpdpbusd where the machine has it, else AVX2's
    vpmaddubsw (pairs of byte products into int16; dot4.py makes sure they don't saturate) then vpmaddwd by ones."""
    if c.machine is None: raise RuntimeError(c.cant_render(u.op))
    n = u.dtype.count
    iv = c.render_dtype(dtypes.int32.vec(n))
    acc, a, b = (k.r[s] for s in u.src)
    if c.machine.vnni():
        return k.bind(f"__builtin_ia32_vpdpbusd_v{n}si({_strip(acc)}, ({iv})({a}), ({iv})({b}))", u.dtype)
    bits, qi, hi = 32 * n, f"fg_v{4 * n}qi", f"fg_v{2 * n}hi"
    suffix = "256" if bits == 256 else "128"
    pairs = f"__builtin_ia32_pmaddubsw{suffix}(({qi})({a}), ({qi})({b}))"
    ones = "{" + ", ".join(["1"] * (2 * n)) + "}"
    return k.bind(f"{acc}+({iv})__builtin_ia32_pmaddwd{suffix}({pairs}, ({hi}){ones})", u.dtype)


DOT4_TYPES_C = """typedef char fg_v32qi __attribute__((vector_size(32)));
typedef short fg_v16hi __attribute__((vector_size(32)));
typedef char fg_v16qi __attribute__((vector_size(16)));
typedef short fg_v8hi __attribute__((vector_size(16)));"""


# a register tile's reduce loop (at least this many vector accumulators updated in an innermost loop) is unrolled by
# TILE_LOOP_UNROLL trips by the C compiler: GCC -O2 unrolls no loop, and the tile's loop spent a tenth of its time on
# the index and the branch of every trip (see `_cpu_range`)
TILE_LOOP_ACCUMULATORS, TILE_LOOP_UNROLL = 8, 4


def tile_loop(uops: list[UOp], i: int) -> bool:
    """Whether uops[i], a RANGE, is the innermost loop of a register tile: a reduce loop with no loop inside and no
    reduce loop around it that updates at least TILE_LOOP_ACCUMULATORS vector accumulators, over at least
    2 x TILE_LOOP_UNROLL trips."""
    u = uops[i]
    if u.arg[1] != "reduce" or u.src[0].op is not Ops.CONST or int(u.src[0].arg) < 2 * TILE_LOOP_UNROLL: return False
    # not inside another reduce loop: a convolution's weight gradient (a 20-trip loop inside the 5 x 5 window's, 10
    # accumulators) unrolled ran 1.7x slower on AVX2, its accumulators spilled around the window loops
    open_loops: list[UOp] = []
    for v in uops[:i]:
        if v.op is Ops.RANGE: open_loops.append(v)
        elif v.op is Ops.END and open_loops: open_loops.pop()
    if any(r.arg[1] == "reduce" for r in open_loops): return False
    accs = 0
    for v in uops[i + 1:]:
        if v.op is Ops.RANGE: return False
        if v.op is Ops.END: return accs >= TILE_LOOP_ACCUMULATORS
        if v.op is Ops.STORE and v.src[0].src[0].op is Ops.DEFINE_REG and v.src[1].dtype.count > 1: accs += 1
    return False


# a streamed load: a kernel's outermost loop reads at least PREFETCH_MIN_STRIDE bytes per trip of one buffer (at most
# PREFETCH_MAX_STRIDE, within L1: a trip reading more works on its own region long enough for the hardware
# prefetchers, and prefetching a conv weight gradient's 400-600 KB per trip at once would only evict what it reads),
# and at least PREFETCH_MIN_BYTES over the loop
PREFETCH_MIN_STRIDE, PREFETCH_MAX_STRIDE, PREFETCH_MIN_BYTES, PREFETCH_LINE = 256, 32768, 1 << 16, 64


def prefetch_streams(uops: list[UOp], i: int) -> list[tuple[UOp, int, int, int]]:
    """For uops[i], a kernel's outermost output loop r with a reduce loop inside: the buffers its body reads as one
    contiguous region per trip, (buffer PARAM, elements per trip s, first element's offset o, bytes per trip) with
    trip r reading [s*r + o, s*r + o + s), s*itemsize at least PREFETCH_MIN_STRIDE bytes."""
    u = uops[i]
    if u.arg[1] not in ("global", "thread") or any(x.op is Ops.RANGE for x in uops[:i]): return []
    if u.src[0].op is not Ops.CONST and u.arg[1] != "thread": return []
    body, depth, has_reduce = [], 0, False
    for x in uops[i + 1:]:
        if x.op is Ops.RANGE:
            depth += 1
            has_reduce |= x.arg[1] == "reduce"
        elif x.op is Ops.END:
            if depth == 0: break
            depth -= 1
        body.append(x)
    if not has_reduce: return []
    trips = int(u.src[0].arg) if u.src[0].op is Ops.CONST else 0
    out: dict[UOp, tuple[UOp, int, int, int]] = {}
    for x in body:
        if x.op is not Ops.LOAD or x.src[0].op is not Ops.INDEX or x.src[0].src[0].op is not Ops.PARAM: continue
        buf, idx = x.src[0].src[0], x.src[0].src[1]
        terms, const = split_terms(idx)
        s = terms.pop(u, 0)
        item = buf.dtype.base.itemsize if isinstance(buf.dtype, PtrDType) else buf.dtype.itemsize
        if s <= 0 or not PREFETCH_MIN_STRIDE <= s * item <= PREFETCH_MAX_STRIDE: continue
        if trips and s * item * trips < PREFETCH_MIN_BYTES: continue
        if any(t.op is Ops.DEFINE_VAR for term in terms for t in term.toposort()): continue
        rest = build_sum(terms, const, idx.dtype)
        lo, hi = int(rest.vmin), int(rest.vmax) + x.dtype.count
        if hi - lo > s: continue   # a trip reads more than its stride: not one region per trip
        prev = out.get(buf)
        if prev is None or lo < prev[2]: out[buf] = (buf, s, lo, s * item)
    return list(out.values())


def _cpu_range(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    """A loop; a register tile's reduce loop asks the C compiler to unroll it (`#pragma GCC unroll`, which Clang reads
    too). GCC keeps each trip's loads next to their FMAs, so the registers a trip needs don't grow (the spill tests
    still hold), and the copies address with constant offsets: AVX2 6 x 2 tile, 1024 and 2048 matmul, one core,
    +5-10%.

    A kernel's outermost loop that streams a buffer region per trip (`prefetch_streams`: a matvec's rows of weights)
    prefetches the next trip's region at the top of each trip. A decode step's matvecs read weights the last token
    left in DRAM, and the hardware prefetchers didn't run ahead of the dequantizing loop: SmolLM2's Q4_1 FFN matvec
    took 100 us cold against 47 us warm (one core, a C copy cycling through 64 MB of weights), about the sum of its
    compute and of reading its 664 KB alone; with the next trip's rows prefetched, decode went from 46 to 52-54 tok/s
    on one thread and from 77-79 to 96-98 on two. (Prefetching a cached line costs one load slot: a matmul's trip,
    whose rows of `a` are in L2 already, does thousands of FMAs per prefetch.)"""
    if tile_loop(k.uops, k.i): k.line(f"#pragma GCC unroll {TILE_LOOP_UNROLL}")
    nm = _range(c, k, u)
    for buf, s, lo, nbytes in prefetch_streams(k.uops, k.i):   # (inside the loop: one level deeper)
        k.line(f"  for (int pf = 0; pf < {nbytes}; pf += {PREFETCH_LINE}) "
               f"__builtin_prefetch((const char*)&{k.r[buf]}[({nm}+1)*{s}+{lo}] + pf);")
    return nm


def _cpu_vectorize(c: CStyleLanguage, k: TextKernel, u: UOp) -> str:
    """A VECTORIZE of every lane of two vectors of one type, in order (dot4.py's `concat`): one
    `__builtin_shufflevector` (a 128-bit insert on x86) in place of a lane-by-lane build."""
    parts = [s.src[0] for s in u.src[::u.src[0].src[0].dtype.count]] if u.src[0].op is Ops.GEP else []
    if len(parts) == 2 and parts[0].dtype == parts[1].dtype and 2 * parts[0].dtype.count == u.dtype.count and \
            all(s.op is Ops.GEP and s.src[0] is parts[i // parts[0].dtype.count] and
                s.arg == i % parts[0].dtype.count for i, s in enumerate(u.src)):
        lanes = ", ".join(str(i) for i in range(u.dtype.count))
        return k.bind(f"__builtin_shufflevector({k.r[parts[0]]}, {k.r[parts[1]]}, {lanes})", u.dtype, "vec")
    return _vectorize(c, k, u)


# one C table for every dialect: only the CPU's C renderer makes these differ (DOT4 exists only where
# `dot4_lanes()` names lanes; narrow shifts by one count only with `scalar_shift_counts`)
CStyleLanguage.rules.update({Ops.DOT4: _dot4, Ops.SHL: _narrow_shift, Ops.SHR: _narrow_shift})
ClangRenderer.rules = {**CStyleLanguage.rules, Ops.RANGE: _cpu_range, Ops.VECTORIZE: _cpu_vectorize}


def _thread_trampoline(name: str, args: list[str]) -> str:
    """`<name>_mt`: the kernel's arguments packed into a struct on the caller's stack, handed with a task that unpacks
    them to the CPU pool's fg_pool_run (runtime/cpu_pool.py), which runs the task on each chunk of the thread loop."""
    params = args[:-2]
    names = [a.split()[-1] for a in params]
    fields = "".join(f" {a.replace(' restrict', '')};" for a in params)
    return (f"struct {name}_args {{{fields} }};\n"
            f"static void {name}_task(void* c, int s, int e) {{ struct {name}_args* a = (struct {name}_args*)c; "
            f"{name}({''.join(f'a->{n}, ' for n in names)}s, e); }}\n"
            f"void {name}_mt({''.join(a + ', ' for a in params)}int (*run)(void (*)(void*, int, int), void*, int, "
            f"const int*), int n, const int* bounds) {{ struct {name}_args a = {{{', '.join(names)}}}; "
            f"run({name}_task, &a, n, bounds); }}\n")


__all__ = ["C_ALU", "CStyleLanguage", "ClangRenderer", "is_pure"]
