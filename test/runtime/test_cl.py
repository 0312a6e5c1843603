"""CL backend (OpenCL through ctypes; PoCL in CI): opening and its errors, memory, compile errors, launches, and
matmul / softmax / conv kernels (forward and backward) against numpy."""
import os
import subprocess
import sys

import numpy as np
import pytest

from fusegrad import Device, Tensor, dtypes
from fusegrad.device import Buffer, CompileError, is_dtype_supported
from fusegrad.renderer import ProgramSpec
from fusegrad.runtime import ops_cl

try:
    Device["CL"]
except Exception as e:  # no OpenCL here: every test is skipped, with the reason
    pytestmark = pytest.mark.skipif(True, reason=f"CL unavailable: {str(e).splitlines()[0]}")


def run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "DEV"} | env
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_missing_library_is_a_clear_error(monkeypatch):
    ops_cl.libcl.cache_clear()
    monkeypatch.setattr(ops_cl.ctypes.util, "find_library", lambda name: "libOpenCL-not-installed.so.1")
    try:
        with pytest.raises(RuntimeError, match="can't load the OpenCL library.*apt-get install pocl-opencl-icd"):
            ops_cl.list_devices()
    finally:
        ops_cl.libcl.cache_clear()


def test_no_platform_is_a_clear_error(tmp_path):
    p = run_py("from fusegrad import Device; Device['CL']", OCL_ICD_VENDORS=str(tmp_path))  # an empty ICD folder
    assert p.returncode != 0 and "no OpenCL platform is installed" in p.stderr and "pocl-opencl-icd" in p.stderr


def test_default_stays_cpu_and_dev_selects_cl():
    assert run_py("from fusegrad import Device; print(Device.DEFAULT)").stdout.strip() in ("CPU", "PYTHON")
    p = run_py("from fusegrad import Tensor; t = Tensor([1.0, 2.0]) * 2; print(t.device, t.tolist())", DEV="CL")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["CL", "[2.0,", "4.0]"]


def test_unknown_device_index():
    with pytest.raises(RuntimeError, match="OpenCL device"):
        Device["CL:99"]


def test_alloc_copy_roundtrip_and_views():
    data = np.arange(1000, dtype=np.float32)
    buf = Buffer("CL", 1000, dtypes.float32).copyin(memoryview(data))
    out = np.empty_like(data)
    buf.copyout(memoryview(out))
    np.testing.assert_array_equal(out, data)
    assert Buffer.supports_views("CL")
    view = buf.view(10, dtypes.int32)  # the memory planner's views start at offset 0
    np.testing.assert_array_equal(np.frombuffer(view.as_bytes(), np.int32), data[:10].view(np.int32))
    assert Buffer("CL", 0, dtypes.float32).as_bytes() == b""


def test_copies_between_devices():
    a = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    x = Tensor(a).to("CL")
    assert x.device == "CL"
    y = (x * 2).to("PYTHON") + 1
    np.testing.assert_allclose(y.to("CPU").numpy(), a * 2 + 1)


def test_compile_error_names_the_kernel_and_shows_the_log():
    src = "__kernel void broken_kernel(__global float* a) { a[0] = not_declared_here; }"
    with pytest.raises(CompileError) as e:
        Device["CL"].compiler.compile(src)
    msg = str(e.value)
    assert "broken_kernel" in msg and "not_declared_here" in msg.split("--- source ---")[0]


def test_launch_with_an_int_argument():
    dev = Device["CL"]
    src = ("__kernel void axpb(__global float* out, __global const float* x, const int b) {\n"
           "  int i = get_global_id(0); out[i] = x[i] * 2.0f + b; }")
    prg = dev.runtime(ProgramSpec("axpb", src, [], 2, global_size=(64,), local_size=(16,)), dev.compiler.compile(src))
    x = np.arange(64, dtype=np.float32)
    xb, ob = Buffer("CL", 64, dtypes.float32).copyin(memoryview(x)), Buffer("CL", 64, dtypes.float32)
    t = prg(ob.opaque, xb.opaque, vals=(3,), wait=True)
    assert isinstance(t, float) and 0 <= t < 10
    np.testing.assert_array_equal(np.frombuffer(ob.as_bytes(), np.float32), x * 2 + 3)
    assert prg(ob.opaque, xb.opaque, vals=(5,)) is None
    dev.synchronize()
    np.testing.assert_array_equal(np.frombuffer(ob.as_bytes(), np.float32), x * 2 + 5)


def test_half_is_unsupported_without_cl_khr_fp16():
    if "cl_khr_fp16" in Device["CL"].renderer.extensions: pytest.skip("this OpenCL device has half")
    assert not is_dtype_supported(dtypes.float16, "CL") and is_dtype_supported(dtypes.bfloat16, "CL")


@pytest.mark.parametrize("dtype", [d for d in dtypes.all if d != dtypes.bool], ids=str)
def test_dtypes_match_cpu(dtype):
    """Constants, casts, math, a comparison and reduces, bit-exact against the CPU backend (bfloat16 is emulated
    through bitcasts; double needs cl_khr_fp64)."""
    if not is_dtype_supported(dtype, "CL"): pytest.skip(f"{dtype} unsupported on this OpenCL device")

    def f(dev):
        x = (Tensor.arange(24, device=dev).reshape(4, 6) - 7).cast(dtype)
        y = x * 3 + x.max(1, keepdim=True)
        return [y.numpy(), (y < x).where(y, x + 1).cast(dtypes.float32).sum(0).numpy()]
    for cl, cpu in zip(f("CL"), f("CPU")): np.testing.assert_array_equal(cl, cpu)


def test_int64_extremes_and_bool_buffers():
    big = np.array([-2**63, 2**63 - 1, 0, 5], np.int64)
    np.testing.assert_array_equal((Tensor(big, device="CL") + 0).numpy(), big)
    m = Tensor(np.array([True, False, True]), device="CL")
    assert (m & ~Tensor(np.array([True, True, False]), device="CL")).tolist() == [False, False, True]


RNG = np.random.default_rng(0)


def test_matmul_and_its_gradient():
    a, w = RNG.standard_normal((33, 48)).astype(np.float32), RNG.standard_normal((48, 20)).astype(np.float32)
    x, wt = Tensor(a, device="CL"), Tensor(w, device="CL", requires_grad=True)
    out = x @ wt
    np.testing.assert_allclose(out.numpy(), a @ w, rtol=1e-4, atol=1e-4)
    out.relu().sum().backward()
    np.testing.assert_allclose(wt.grad.numpy(), a.T @ (a @ w > 0).astype(np.float32), rtol=1e-4, atol=1e-4)


def test_softmax():
    a = RNG.standard_normal((7, 70)).astype(np.float32) * 5
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(Tensor(a, device="CL").softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5,
                               atol=1e-7)


def test_conv2d():
    x, w = RNG.standard_normal((2, 3, 9, 10)).astype(np.float32), RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3))
    ref = np.einsum("nchwkl,ockl->nohw", windows[:, :, ::2, ::2], w) + b[None, :, None, None]
    out = Tensor(x, device="CL").conv2d(Tensor(w, device="CL"), Tensor(b, device="CL"), stride=2, padding=1)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_many_output_ranges_merge_into_the_grid():
    a = RNG.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    out = Tensor(a, device="CL").permute(4, 2, 0, 3, 1) * 2 + 1
    np.testing.assert_allclose(out.numpy(), a.transpose(4, 2, 0, 3, 1) * 2 + 1)
