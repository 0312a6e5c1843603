"""The OpenCL C renderer: the C-style renderer with OpenCL's kernel and address-space qualifiers, type names, math
builtins and `as_<type>` bitcasts. Output ranges arrive as work-item ids (SPECIAL, from codegen/gpudims.py).

Vectors (the VECTORIZE action, when the runtime sets `simd_bytes`) are OpenCL's built-in `floatN`/`intN`/... types
(N in 4, 8, 16; bool vectors are `ucharN` of 0/1): `vloadN`/`vstoreN` for memory (they need only the element's
alignment), `(floatN)(a, b, ...)` literals, `.sI` lanes, the overloaded operators and math builtins lane-wise, `select`
for WHERE and the NaN-propagating MAX, `convert_<T>N` for casts and `as_<T>N` for bitcasts.
"""
from __future__ import annotations

import re

from fusegrad.dtype import DType, dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.renderer.cstyle import CStyleLanguage, _strip, _zero

_SIMPLE = re.compile(r"[\w\[\]]+")  # a name or an array element: needs no parentheses before .sI


class OpenCLRenderer(CStyleLanguage):
    """OpenCL C 1.2. half and double exist only when the device has cl_khr_fp16 / cl_khr_fp64 (PoCL on a CPU has fp64
    but no fp16, so float16 is reported unsupported there); bfloat16 is emulated by codegen/decompose.py."""
    device = "CL"
    has_local = True
    has_shared = True
    smem_prefix = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    global_max = (2**31 - 1,) * 3   # work-item ids are rendered as int
    local_max = 256                 # the device's limits (CL_DEVICE_MAX_WORK_GROUP_SIZE, ...), set by the runtime
    local_dim_max = (256, 256, 64)  # CL_DEVICE_MAX_WORK_ITEM_SIZES
    kernel_prefix = "__kernel void "
    buffer_prefix = "__global "
    infinity = "INFINITY"
    nan = "NAN"
    float_fn = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}
    double_fn = float_fn  # the builtins are overloaded on float and double
    mask_elem: dict[DType, str] = {}

    def __init__(self, fp16: bool = False, fp64: bool = True):
        self.type_map = {
            dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
            dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
            dtypes.uint64: "ulong", dtypes.float32: "float",
            **({dtypes.float64: "double"} if fp64 else {}), **({dtypes.float16: "half"} if fp16 else {})}
        self.extensions = ["cl_khr_fp64"] * fp64 + ["cl_khr_fp16"] * fp16

    # ops OpenCL's vector types do natively (besides the special cases in render_alu); others are rendered lane by lane
    vector_ops = {Ops.ADD, Ops.MUL, Ops.NEG, Ops.RECIPROCAL, Ops.AND, Ops.OR, Ops.XOR, Ops.IDIV, Ops.MOD, Ops.SHL,
                  Ops.SHR, Ops.MULACC, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC}

    def render_dtype(self, dt: DType) -> str:
        if dt.count == 1: return super().render_dtype(dt)
        if dt.count not in (2, 3, 4, 8, 16): raise RuntimeError(f"OpenCL has no {dt.count}-lane vectors ({dt})")
        if dt.scalar() not in self.type_map: raise RuntimeError(f"{type(self).__name__} has no type for {dt}")
        return f"{self.vector_elem(dt)}{dt.count}"

    def vector_elem(self, dt: DType) -> str:
        return "uchar" if dt.scalar() == dtypes.bool else self.type_map[dt.scalar()]

    def vector_typedefs(self, dts: set[DType], max_dts: set[DType] = frozenset(),
                        where_dts: set[DType] = frozenset()) -> list[str]:
        return []  # the vector types are built in

    def has_vector_max(self, dt: DType) -> bool: return False   # render_alu below handles vector MAX and WHERE,
    def has_vector_where(self, dt: DType) -> bool: return False  # and their operands then get variables

    def render_lanes(self, dt: DType, lanes: list[str]) -> str:
        if len(set(lanes)) == 1: return f"(({self.render_dtype(dt)})({_strip(lanes[0])}))"  # a broadcast
        return f"(({self.render_dtype(dt)})({', '.join(_strip(x) for x in lanes)}))"

    def render_gep(self, x: str, i: int) -> str:
        return f"{x if _SIMPLE.fullmatch(x) else f'({x})'}.s{i:x}"

    def render_vload(self, dt: DType, addr: str) -> str:
        return f"vload{dt.count}(0, &{addr})"

    def render_vstore(self, dt: DType, addr: str, val: str) -> str:
        return f"vstore{dt.count}({val}, 0, &{addr});"

    def _mask(self, dt: DType, c: str) -> str:
        """A vector of bools (ucharN of 0/1) -> select's mask for dt: -1/0 in lanes as wide as dt's."""
        m = {1: "char", 2: "short", 4: "int", 8: "long"}[1 if dt.scalar() == dtypes.bool else dt.scalar().itemsize]
        return f"(-convert_{m}{dt.count}({c}))"

    def render_alu(self, op: Ops, dt: DType, a: list[str], src_dtype: DType) -> str:
        if dt.count > 1:
            n = dt.count
            if op is Ops.WHERE: return f"select({a[2]}, {a[1]}, {self._mask(dt, a[0])})"
            if op in (Ops.CMPLT, Ops.CMPNE):  # vector compares give -1/0 in the operands' width
                return f"convert_uchar{n}(-({a[0]}{'<' if op is Ops.CMPLT else '!='}{a[1]}))"
            if op is Ops.MAX and dtypes.is_float(dt):  # NaN wins, as in ir/alu.py (fmax drops NaNs)
                return f"select({a[1]}, {a[0]}, ({a[0]}>{a[1]})|isnan({a[0]}))"
            if op is Ops.MAX and dt.scalar() != dtypes.bool: return f"max({a[0]}, {a[1]})"
            if op in (Ops.AND, Ops.OR, Ops.XOR):  # also on bool vectors: 0/1 lanes stay 0/1
                return f"({a[0]}{ {Ops.AND: '&', Ops.OR: '|', Ops.XOR: '^'}[op]}{a[1]})"
            if op in (Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC):  # overloaded on float/double vectors
                if dt.scalar() in (dtypes.float32, dtypes.float64): return f"{self.float_fn[op]}({a[0]})"
                return self.render_lanes(dt, [self.render_alu(op, dt.scalar(), [self.render_gep(a[0], i)], src_dtype.scalar())
                                              for i in range(n)])
        return super().render_alu(op, dt, a, src_dtype)

    def render_cast(self, dt: DType, x: str, src_dt: DType) -> str:
        if dt.count > 1 and dtypes.bool not in (dt.scalar(), src_dt.scalar()):
            return f"convert_{self.render_dtype(dt)}({x})"
        if dt.count > 1 and dt.scalar() == dtypes.bool and src_dt.scalar() != dtypes.bool:  # x != 0, NaN is true
            return f"convert_uchar{dt.count}(-({x}!={self.render_const(_zero(src_dt), src_dt.scalar())}))"
        return super().render_cast(dt, x, src_dt)

    def buffer_type(self, dt: DType) -> str:
        return "uchar" if dt == dtypes.bool else self.render_dtype(dt)  # a kernel argument can't point to bool

    def render_special(self, u: UOp) -> str:
        fn = {"gid": "get_global_id", "lid": "get_local_id", "grp": "get_group_id"}[u.arg[:3]]
        return f"({self.render_dtype(u.dtype)}){fn}({u.arg[3:]})"

    def render_const(self, val: object, dt: DType) -> str:
        if dt.scalar() in (dtypes.int64, dtypes.uint64) and isinstance(val, int) and not isinstance(val, bool):
            if val == dtypes.min(dt) and dt.scalar() == dtypes.int64: return f"({val + 1}l-1)"
            return f"{val}{'ul' if dt.scalar() == dtypes.uint64 else 'l'}"  # OpenCL's long is 64 bits; no `ll`
        return super().render_const(val, dt)

    def render_bitcast(self, dt: DType, x: str, src_dt: DType) -> str:
        if dt.count > 1 and dtypes.bool not in (dt.scalar(), src_dt.scalar()): return f"as_{self.render_dtype(dt)}({x})"
        if dt.count > 1: return super().render_bitcast(dt, x, src_dt)  # lane by lane
        if dtypes.bool in (dt, src_dt): return f"(({self.render_dtype(dt)})({x}))"  # as_type has no bool
        return f"as_{self.render_dtype(dt)}({x})"

    def render_kernel(self, name: str, args: list[str], body: list[str], has_float_acc: bool = False) -> str:
        # like the CPU target, only float reduce kernels may contract acc + a*b into a fused multiply-add
        head = [f"#pragma OPENCL EXTENSION {e} : enable" for e in self.extensions]
        head.append(f"#pragma OPENCL FP_CONTRACT {'ON' if has_float_acc else 'OFF'}")
        return "\n".join(head) + "\n" + super().render_kernel(name, args, body)


__all__ = ["OpenCLRenderer"]
