"""The OpenCL C renderer: the C-style renderer with OpenCL's kernel and address-space qualifiers, type names, math
builtins and `as_<type>` bitcasts. Output ranges arrive as work-item ids (SPECIAL, from codegen/gpudims.py).
"""
from __future__ import annotations

from fusegrad.dtype import DType, dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.renderer.cstyle import CStyleLanguage


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
        if dtypes.bool in (dt, src_dt): return f"(({self.render_dtype(dt)})({x}))"  # as_type has no bool
        return f"as_{self.render_dtype(dt)}({x})"

    def render_kernel(self, name: str, args: list[str], body: list[str], has_float_acc: bool = False) -> str:
        # like the CPU target, only float reduce kernels may contract acc + a*b into a fused multiply-add
        head = [f"#pragma OPENCL EXTENSION {e} : enable" for e in self.extensions]
        head.append(f"#pragma OPENCL FP_CONTRACT {'ON' if has_float_acc else 'OFF'}")
        return "\n".join(head) + "\n" + super().render_kernel(name, args, body)


__all__ = ["OpenCLRenderer"]
