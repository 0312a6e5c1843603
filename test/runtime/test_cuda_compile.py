"""CUDA backend without a GPU: every kernel of a representative set (test/runtime/kernel_corpus.py) rendered by the CUDA
renderer and compiled by NVRTC to PTX and an sm_90 cubin, cleanly; the renderer's launch ids, float16, NaN-aware max
and FMA policy as seen in the PTX; the clear error when the driver is missing. Kernels run only where a GPU is."""
import os
import subprocess
import sys

import numpy as np
import pytest
from kernel_corpus import kernel_asts

from fusegrad import Device, Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.codegen.gpudims import fit_block
from fusegrad.device import CompileError
from fusegrad.renderer.cuda import FMAD_MARK, CUDARenderer
from fusegrad.runtime import ops_cuda

try:
    ops_cuda.libnvrtc()
    NO_NVRTC = ""
except RuntimeError as e:
    NO_NVRTC = str(e)
needs_nvrtc = pytest.mark.skipif(bool(NO_NVRTC), reason=f"NVRTC unavailable: {NO_NVRTC}")
try:
    Device["CUDA"]
    NO_GPU = ""
except Exception as e:
    NO_GPU = str(e).splitlines()[0]
needs_gpu = pytest.mark.skipif(bool(NO_GPU), reason=f"CUDA unavailable: {NO_GPU}")


def cuda_src(t: Tensor) -> str:
    (si,) = t.schedule()
    return to_program(si.ast, CUDARenderer()).src


@pytest.fixture(scope="module")
def compiled() -> list[tuple[str, str, str, bytes, str]]:
    """(program, kernel name, PTX, cubin, log) for every distinct CUDA source of the corpus."""
    by_src: dict[str, tuple[str, str]] = {}
    for label, ast in kernel_asts():
        spec = to_program(ast, CUDARenderer())
        by_src.setdefault(spec.src, (label, spec.name))
    return [(label, name, *ops_cuda.nvrtc_compile(src, "sm_90")) for src, (label, name) in by_src.items()]


@needs_nvrtc
def test_every_corpus_kernel_compiles_cleanly_for_sm90(compiled):
    assert len(compiled) >= 150, len(compiled)
    for label, name, ptx, cubin, log in compiled:
        assert log == "", f"{label}: {name}: {log}"
        assert f".entry {name}(" in ptx and ".target sm_90" in ptx, f"{label}: {name}"
        assert cubin[:4] == b"\x7fELF", f"{label}: {name}: not a cubin"
    assert sum(".param .u32" in ptx for *_, ptx, _, _ in compiled) >= 2  # the Variable kernels take an int argument


def test_source_shape():
    """extern "C" __global__ kernels, __restrict__ buffers, global ids from blockIdx/blockDim/threadIdx, long long."""
    x = Tensor(np.arange(24, dtype=np.int64).reshape(2, 3, 4))
    src = cuda_src(x.permute(2, 1, 0) * 3_000_000_000)
    assert 'extern "C" __global__ void E_4_3_2(long long* __restrict__ data0, long long* __restrict__ data1)' in src
    for d, axis in enumerate("xyz"):
        assert f"int gid{d} = (int)(blockIdx.{axis}*blockDim.{axis}+threadIdx.{axis});" in src
    assert "3000000000ll" in src and FMAD_MARK not in src


def test_float16_rounds_every_op():
    """float16 is 2-byte storage; each op computes in float and is rounded back, even inside a bigger expression."""
    a, b = Tensor(np.ones(8, np.float16)), Tensor(np.ones(8, np.float16))
    src = cuda_src((a * b + a).sqrt())
    assert "struct fg_half" in src and "fg_half* __restrict__ data0" in src
    assert "data0[gid0] = (fg_half)sqrtf((float)(((fg_half)((((fg_half)((val0*val1)))+val0)))));" in src


@needs_nvrtc
def test_ptx_shows_half_conversions_nan_max_and_fma_policy():
    h = Tensor(np.ones(8, np.float16))
    ptx = ops_cuda.nvrtc_compile(cuda_src(h + h))[0]
    assert "cvt.f32.f16" in ptx and "cvt.rn.f16.f32" in ptx
    ptx = ops_cuda.nvrtc_compile(cuda_src(Tensor(np.ones(8, np.float64)).cast(dtypes.float16)))[0]
    assert "cvt.rn.f16.f64" in ptx and "cvt.rn.f32.f64" not in ptx  # float64 -> float16 rounds once
    x, y, z = (Tensor(np.ones(64, np.float32)) for _ in range(3))
    src = cuda_src(x * y + z)
    assert FMAD_MARK not in src and "fma.rn.f32" not in ops_cuda.nvrtc_compile(src)[0]  # elementwise: no contraction
    src = cuda_src(Tensor(np.ones((16, 16), np.float32)) @ Tensor(np.ones((16, 16), np.float32)))
    assert FMAD_MARK in src and "fma.rn.f32" in ops_cuda.nvrtc_compile(src)[0]      # reduce: acc + a*b fused
    src = cuda_src(x.maximum(y))
    assert "!=" in src and "fmaxf" not in src  # a NaN in either operand comes out (fmaxf would drop it)


@needs_nvrtc
def test_compile_error_names_the_kernel_with_the_log():
    bad = 'extern "C" __global__ void broken(float* data0) { data0[0] = undeclared; }'
    with pytest.raises(CompileError, match=r"(?s)kernel broken.*identifier \"undeclared\" is undefined"):
        ops_cuda.nvrtc_compile(bad)


def test_fit_block_keeps_dividing_the_grid():
    assert fit_block((1024, 1, 1), 256) == (256, 1, 1)
    assert fit_block((32, 32, 1), 1024) == (32, 32, 1)
    small = fit_block((96, 10, 1), 64)
    assert np.prod(small) <= 64 and 96 % small[0] == 0 and 10 % small[1] == 0


@pytest.mark.skipif(not NO_GPU, reason="a CUDA GPU is present here")
def test_without_driver_cuda_is_listed_unavailable_with_the_reason():
    env = {k: v for k, v in os.environ.items() if k != "DEV"}
    out = subprocess.run([sys.executable, "-m", "fusegrad.device"], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("CUDA "))
    assert "unavailable" in line and "no NVIDIA driver (libcuda.so.1)" in line
    with pytest.raises(RuntimeError, match=r"no NVIDIA driver \(libcuda\.so\.1\)"):
        Device["CUDA"]


@needs_gpu
def test_on_gpu_matches_cpu():  # runs only on a machine with an NVIDIA GPU and driver
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((33, 47)).astype(np.float32), rng.standard_normal((47, 20)).astype(np.float32)
    np.testing.assert_allclose((Tensor(a, device="CUDA") @ Tensor(b, device="CUDA")).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    for dt in (dtypes.float16, dtypes.bfloat16, dtypes.int64, dtypes.uint8):
        x = Tensor(a[:4], device="CPU").cast(dt)
        ref = (x.maximum(x * 2) + x).numpy()
        np.testing.assert_array_equal((x.to("CUDA").maximum(x.to("CUDA") * 2) + x.to("CUDA")).numpy(), ref)
