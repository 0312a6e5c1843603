"""The CUDA C++ renderer: the C-style renderer with `extern "C" __global__` kernels, `__restrict__` pointers, work-item
ids from threadIdx/blockIdx/blockDim, CUDA's math functions and memcpy bitcasts. Needs no CUDA header, so NVRTC alone
compiles it: float16 is a two-byte struct converted to and from float by PTX `cvt`, bfloat16 is emulated by
codegen/decompose.py.
"""
from __future__ import annotations

from fusegrad.dtype import DType, dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.renderer.cstyle import CStyleLanguage

# float16 without cuda_fp16.h (the NVRTC wheel ships no headers): 16 bits of storage; every use converts to float and
# every assignment rounds back (cvt.rn: to nearest even, overflow to inf, NaN kept), so one op rounds exactly once,
# as a native half op does
HALF_PRELUDE = """struct fg_half {
  unsigned short bits;
  fg_half() = default;
  __device__ fg_half(float f) { asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f)); }
  __device__ operator float() const { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits)); return f; }
};
__device__ __forceinline__ fg_half fg_half_from_double(double d) {  /* one rounding, not two through float */
  fg_half h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(d)); return h;
}"""

BITCAST_PRELUDE = """template <class T, class F> __device__ __forceinline__ T fg_bitcast(F x) {
  static_assert(sizeof(T) == sizeof(F), "bitcast between types of different sizes");
  T y; memcpy(&y, &x, sizeof(T)); return y;
}"""

# a comment the renderer puts on float reduce kernels: CUDACompiler then lets NVRTC contract a*b+c into an FMA there
# (as BLAS does, and as the CPU and CL targets do); everything else compiles with --fmad=false
FMAD_MARK = "// fusegrad: fmad"


class CUDARenderer(CStyleLanguage):
    """CUDA C++ for NVRTC. The limits are an sm_90 GPU's (the runtime replaces them with the device's own)."""
    device = "CUDA"
    has_local = True
    has_shared = True
    smem_prefix = "__shared__ "
    barrier = "__syncthreads();"
    global_max: tuple[int, ...] | None = (2**31 - 1, 65535, 65535)  # gridDim limits; ids are rendered as int
    local_max = 1024                        # threads per block
    local_dim_max: tuple[int, ...] = (1024, 1024, 64)  # blockDim limits
    kernel_prefix = 'extern "C" __global__ void '
    buffer_suffix = " __restrict__"
    infinity = "__int_as_float(0x7f800000)"
    nan = "__int_as_float(0x7fc00000)"
    float_fn = {Ops.SQRT: "sqrtf", Ops.EXP2: "exp2f", Ops.LOG2: "log2f", Ops.SIN: "sinf", Ops.TRUNC: "truncf"}
    double_fn = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}
    type_map = {**CStyleLanguage.type_map, dtypes.bool: "bool", dtypes.float16: "fg_half"}

    def __init__(self, arch: str = "sm_90"):
        self.arch = arch

    def __repr__(self) -> str: return f"CUDARenderer({self.arch!r})"

    def render_special(self, u: UOp) -> str:
        axis = "xyz"[int(u.arg[3:])]
        kind = u.arg[:3]
        if kind == "gid": return f"(int)(blockIdx.{axis}*blockDim.{axis}+threadIdx.{axis})"
        return f"(int){'threadIdx' if kind == 'lid' else 'blockIdx'}.{axis}"

    def render_alu(self, op: Ops, dt: DType, a: list[str], src_dtype: DType) -> str:
        out = super().render_alu(op, dt, a, src_dtype)
        # fg_half operands compute in float: round the result here, even when it is inlined into a bigger expression
        rounded = dt == dtypes.float16 and op not in (Ops.WHERE, Ops.MAX) and op not in self.float_fn
        return f"((fg_half)({out}))" if rounded else out  # (the math functions round through render_math)

    def render_cast(self, dt: DType, x: str, src_dt: DType) -> str:
        if dt == dtypes.float16 and src_dt == dtypes.float64: return f"fg_half_from_double({x})"
        return super().render_cast(dt, x, src_dt)

    def render_bitcast(self, dt: DType, x: str, src_dt: DType) -> str:
        return f"fg_bitcast<{self.render_dtype(dt)}>(({self.render_dtype(src_dt)})({x}))"

    def render_kernel(self, name: str, args: list[str], body: list[str], has_float_acc: bool = False) -> str:
        src = super().render_kernel(name, args, body)
        head = [FMAD_MARK] * has_float_acc
        if "fg_half" in src: head.append(HALF_PRELUDE)
        if "fg_bitcast<" in src: head.append(BITCAST_PRELUDE)
        return "".join(h + "\n" for h in head) + src


__all__ = ["FMAD_MARK", "CUDARenderer"]
