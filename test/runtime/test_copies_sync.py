"""Cross-device copies and synchronization on every backend that opens here: `t.to(dev)` and back for every dtype the
device supports (bit-exact), between two non-CPU devices, from non-contiguous views, of empty tensors;
`Device[d].synchronize()` on every device; a broken program or an impossible launch is an exception naming the kernel;
`python -m fusegrad.device` lists every backend. A backend that doesn't open is skipped with its reason."""
import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from fusegrad import Device, Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.device import CompileError

TARGETS = ("CL", "LLVM", "WEBGPU", "PYTHON", "CUDA", "METAL")


def _why_not(name: str) -> str:
    try:
        Device[name]
        return ""
    except Exception as e:
        return f"{name} unavailable: {str(e).splitlines()[0]}"


WHY_NOT = {d: _why_not(d) for d in (*TARGETS, "CPU")}
DEVS = [pytest.param(d, marks=pytest.mark.skip(reason=WHY_NOT[d])) if WHY_NOT[d] else d for d in TARGETS]
AVAILABLE = [d for d in TARGETS if not WHY_NOT[d]]
RNG = np.random.default_rng(0)

# numpy arrays of every dtype numpy has, with the edge values of each (bit patterns are compared, so NaN and -0.0 too)
NP_DTYPES = {dtypes.bool: np.bool_, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16,
             dtypes.uint16: np.uint16, dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64,
             dtypes.uint64: np.uint64, dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}


def sample(dt, n: int = 37) -> np.ndarray:
    """n values of dt (an odd count: packed narrow storage has a partial last word), its extremes first."""
    npdt = NP_DTYPES[dt]
    if dt == dtypes.bool: return RNG.random(n) < 0.5
    if dtypes.is_float(dt):
        a = RNG.standard_normal(n).astype(npdt) * 100
        a[:6] = [np.nan, np.inf, -np.inf, -0.0, np.finfo(npdt).max, np.finfo(npdt).tiny]
        return a
    info = np.iinfo(npdt)
    a = RNG.integers(info.min, info.max, n, dtype=npdt, endpoint=True)
    a[:3] = [info.min, info.max, 0]
    return a


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == want.tobytes(), f"{got} != {want}"


@pytest.mark.parametrize("dev", DEVS)
def test_roundtrip_every_supported_dtype_is_exact(dev):
    supported = Device[dev].renderer.supported_dtypes()
    tried = []
    for dt in NP_DTYPES:
        if dt not in supported: continue
        a = sample(dt)
        on_dev = Tensor(a).to(dev)
        assert on_dev.device == dev and on_dev.dtype == dt
        same_bits(on_dev.numpy(), a)                          # device -> host
        same_bits(on_dev.to("CPU").numpy(), a)                # device -> CPU
        same_bits(Tensor(a, device=dev).to("CPU").numpy(), a)  # created on the device, then copied
        tried.append(dt)
    assert dtypes.float32 in tried and dtypes.int32 in tried and dtypes.bool in tried, tried


@pytest.mark.parametrize("dev", DEVS)
def test_copies_between_two_non_cpu_devices(dev):
    others = [d for d in AVAILABLE if d != dev]
    if not others: pytest.skip("no second non-CPU device opens here")
    for dt in (dtypes.float32, dtypes.int8, dtypes.bool):
        a = sample(dt)
        for other in others:
            if not all(dt in Device[d].renderer.supported_dtypes() for d in (dev, other)): continue
            same_bits(Tensor(a, device=dev).to(other).numpy(), a)
            same_bits(Tensor(a, device=other).to(dev).to(other).numpy(), a)


@pytest.mark.parametrize("dev", DEVS)
def test_non_contiguous_sources(dev):
    for dt in (dtypes.float32, dtypes.int16, dtypes.bool):
        if dt not in Device[dev].renderer.supported_dtypes(): continue
        a = sample(dt, 48).reshape(6, 8)
        views = {"T": lambda t: t.T, "step": lambda t: t[::2, 1::3], "flip": lambda t: t.flip(1),
                 "expand": lambda t: t[:1].expand(4, 8), "pad": lambda t: t[1:3, 2:5]}
        wants = {"T": a.T, "step": a[::2, 1::3], "flip": a[:, ::-1], "expand": np.broadcast_to(a[:1], (4, 8)),
                 "pad": a[1:3, 2:5]}
        for name, view in views.items():
            want = np.ascontiguousarray(wants[name])
            same_bits(view(Tensor(a)).to(dev).numpy(), want)                    # a CPU view copied to the device
            same_bits(view(Tensor(a, device=dev)).to("CPU").numpy(), want)     # a device view copied back


@pytest.mark.parametrize("dev", DEVS)
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 2)])
def test_empty_tensors(dev, shape):
    for dt in (dtypes.float32, dtypes.bool):
        a = np.zeros(shape, NP_DTYPES[dt])
        t = Tensor(a).to(dev)
        assert t.shape == shape
        same_bits(t.numpy(), a)
        same_bits(t.to("CPU").numpy(), a)
        same_bits((Tensor(a, device=dev) + 1).to("CPU").numpy(), (Tensor(a) + 1).numpy())  # a kernel over nothing


@pytest.mark.parametrize("dev", [*DEVS, "CPU"])
def test_synchronize_waits_for_queued_work(dev):
    a = RNG.standard_normal((64, 64)).astype(np.float32)
    out = (Tensor(a, device=dev) * 2 + 1).realize()
    assert Device[dev].synchronize() is None
    Device[dev].synchronize()  # twice: nothing queued is fine
    np.testing.assert_allclose(out.numpy(), a * 2 + 1, rtol=1e-6)


BROKEN = {"CL": "__kernel void broken_k(__global float* d) { d[0] = undeclared; }",
          "CPU": "void broken_k(float* restrict d) { d[0] = undeclared; }",
          "LLVM": "define void @broken_k(ptr %d) {\n  ret i32 0\n}\n",
          "WEBGPU": "@group(0) @binding(0) var<storage, read_write> d: array<f32>;\n"
                    "@compute @workgroup_size(1) fn broken_k() { d[0] = undeclared; }",
          "CUDA": 'extern "C" __global__ void broken_k(float* d) { d[0] = undeclared; }',
          "METAL": "#include <metal_stdlib>\nkernel void broken_k(device float* d) { d[0] = undeclared; }"}


@pytest.mark.parametrize("dev", [*DEVS, "CPU"])
def test_broken_program_names_the_kernel(dev):
    if dev == "PYTHON": pytest.skip("PYTHON has no compiler: its source is the program (see the launch test)")
    with pytest.raises(CompileError, match="broken_k"):
        Device[dev].runtime(dataclasses.replace(_spec(dev), name="broken_k", src=BROKEN[dev]),
                            Device[dev].compiler.compile(BROKEN[dev]))


def _spec(dev):
    (si,) = (Tensor(np.ones(16, np.float32), device=dev) + 1).schedule()
    return to_program(si.ast, Device[dev].renderer)


@pytest.mark.parametrize("dev", DEVS)
def test_impossible_launch_names_the_kernel(dev):
    """CL: a workgroup that doesn't divide the grid; WEBGPU: more workgroups than a dispatch allows; PYTHON: an
    access past the end of a too-small buffer; CUDA/METAL: a block over the device's limit."""
    spec = _spec(dev)
    lib = Device[dev].compiler.compile(spec.src)
    alloc = Device[dev].allocator
    bad = {"CL": {"global_size": (7, 1, 1), "local_size": (2, 1, 1)},
           "WEBGPU": {"global_size": (2**31 - 1, 65535, 65535), "local_size": (1, 1, 1)},
           "CUDA": {"global_size": (1 << 20, 1, 1), "local_size": (1 << 20, 1, 1)},
           "METAL": {"global_size": (1 << 20, 1, 1), "local_size": (1 << 20, 1, 1)}}.get(dev, {})
    if dev == "LLVM": pytest.skip("LLVM kernels are host calls: no launch to refuse (a bad module is the compile test)")
    with pytest.raises(Exception, match=spec.name) as e:
        prg = Device[dev].runtime(dataclasses.replace(spec, **bad), lib)
        out, inp = alloc.alloc(8 if dev == "PYTHON" else 64), alloc.alloc(64)  # PYTHON: room for 2 of the 16 outputs
        prg(out, inp, wait=True)
        Device[dev].synchronize()
    assert not isinstance(e.value, (AssertionError, TypeError)), e.value


def test_device_listing_names_every_backend_with_its_status():
    env = {k: v for k, v in os.environ.items() if k != "DEV"}
    out = subprocess.run([sys.executable, "-m", "fusegrad.device"], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stdout
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    for d in (*TARGETS, "CPU"):
        assert d in lines, out
        assert ("unavailable" in lines[d]) == bool(WHY_NOT[d]), lines[d]
        if WHY_NOT[d]: assert len(lines[d].split("unavailable", 1)[1].strip()) > 20, lines[d]  # says why
    assert "default" in lines["CPU"]
