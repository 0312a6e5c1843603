"""The Metal Shading Language renderer: the C-style renderer with `kernel void`, `device` buffers bound by
`[[buffer(i)]]`, int variables as `constant int&`, work-item ids from the thread-position attributes, `metal::` math
and `as_type<T>` bitcasts. Metal has no 64-bit float; bfloat16 (MSL 3.1+ only) is emulated by codegen/decompose.py.
"""
from __future__ import annotations

from fusegrad.dtype import DType, dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.renderer.cstyle import CStyleLanguage

# the kernel arguments the SPECIAL ids read: (name, attribute) for gid / lid / grp
ID_ARGS = {"gid": ("fg_gid", "thread_position_in_grid"), "lid": ("fg_lid", "thread_position_in_threadgroup"),
           "grp": ("fg_grp", "threadgroup_position_in_grid")}


class MetalRenderer(CStyleLanguage):
    """MSL 2.x for newLibraryWithSource (compiled with fast math off, so NaN and inf behave as IEEE says)."""
    device = "METAL"
    has_local = True
    has_shared = True
    smem_prefix = "threadgroup "
    barrier = "threadgroup_barrier(metal::mem_flags::mem_threadgroup);"
    global_max: tuple[int, ...] | None = (2**31 - 1,) * 3  # ids are rendered as int
    local_max = 1024                     # maxTotalThreadsPerThreadgroup on Apple GPUs (the runtime checks per kernel)
    local_dim_max: tuple[int, ...] = (1024, 1024, 1024)  # maxThreadsPerThreadgroup
    kernel_prefix = "kernel void "
    buffer_prefix = "device "
    buffer_suffix = ""
    arg_int_prefix = "constant int&"
    infinity = "INFINITY"
    nan = "NAN"
    # precise:: keeps the accurate versions even if a build turns fast math on
    float_fn = {Ops.SQRT: "metal::precise::sqrt", Ops.EXP2: "metal::precise::exp2", Ops.LOG2: "metal::precise::log2",
                Ops.SIN: "metal::precise::sin", Ops.TRUNC: "metal::trunc"}
    double_fn: dict[Ops, str] = {}
    type_map = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
                dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
                dtypes.uint64: "ulong", dtypes.float32: "float", dtypes.float16: "half"}
    mask_elem: dict[DType, str] = {}

    def render_dtype(self, dt: DType) -> str:
        if dt.scalar() == dtypes.float64:
            raise RuntimeError("Metal has no 64-bit float: float64 can't run on METAL (use float32)")
        return super().render_dtype(dt)

    def buffer_type(self, dt: DType) -> str:
        return "uchar" if dt == dtypes.bool else self.render_dtype(dt)  # bool buffers hold one byte per element

    def render_special(self, u: UOp) -> str:
        return f"(int){ID_ARGS[u.arg[:3]][0]}.{'xyz'[int(u.arg[3:])]}"

    def render_const(self, val: object, dt: DType) -> str:
        if dt.scalar() in (dtypes.int64, dtypes.uint64) and isinstance(val, int) and not isinstance(val, bool):
            if val == dtypes.min(dt) and dt.scalar() == dtypes.int64: return f"({val + 1}l-1)"
            return f"{val}{'ul' if dt.scalar() == dtypes.uint64 else 'l'}"  # MSL's long is 64 bits
        return super().render_const(val, dt)

    def render_bitcast(self, dt: DType, x: str, src_dt: DType) -> str:
        if dtypes.bool in (dt, src_dt): return f"(({self.render_dtype(dt)})({x}))"  # as_type has no bool
        return f"as_type<{self.render_dtype(dt)}>(({self.render_dtype(src_dt)})({x}))"

    def render_kernel(self, name: str, args: list[str], body: list[str], has_float_acc: bool = False) -> str:
        # buffers and int variables are numbered in argument order; the runtime binds them at the same indices
        bound = [f"{a} [[buffer({i})]]" for i, a in enumerate(args)]
        src = "\n".join(body)
        ids = [f"uint3 {arg} [[{attr}]]" for arg, attr in ID_ARGS.values() if f"{arg}." in src]
        return "#include <metal_stdlib>\nusing namespace metal;\n" + super().render_kernel(name, bound + ids, body)


__all__ = ["MetalRenderer"]
