"""WEBGPU backend (WGSL through wgpu-py; Mesa's lavapipe in CI): the WGSL renderer (no device needed), then opening
errors, memory and its binding-size limit, unsupported dtypes, and kernels against numpy and the CPU backend."""
import os
import subprocess
import sys

import numpy as np
import pytest
from backend_checks import check_matmul_and_grad

from fusegrad import Device, Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.device import Buffer, CompileError, is_dtype_supported
from fusegrad.ir.ops import Ops
from fusegrad.renderer.wgsl import WGSLRenderer
from fusegrad.runtime import ops_webgpu

try:
    Device["WEBGPU"]
    WHY = ""
except Exception as e:  # noqa: BLE001 - no wgpu or no adapter here: the device tests are skipped, with the reason
    WHY = f"WEBGPU unavailable: {str(e).splitlines()[0]}"
needs_device = pytest.mark.skipif(bool(WHY), reason=WHY)
RNG = np.random.default_rng(0)


def kernel(t: Tensor):
    (si,) = t.schedule()
    return si.ast


# ---- the renderer alone

def test_source_has_the_launch_shape_and_bindings():
    a, b = Tensor(np.ones((8, 16), np.float32)), Tensor(np.ones((16, 4), np.float32))
    spec = to_program(kernel(a @ b), WGSLRenderer(), [])
    assert spec.global_size == (4, 8) and all(g % l == 0 for g, l in zip(spec.global_size, spec.local_size))
    wg = ", ".join(map(str, (*spec.local_size, 1, 1, 1)[:3]))
    assert f"@workgroup_size({wg})" in spec.src and f"fn {spec.name}(" in spec.src
    assert "var<storage, read_write> data0: array<f32>" in spec.src and "var<storage, read> data1: array<f32>" in spec.src
    assert "lid.x" in spec.src and "lid.y" in spec.src and "for (var ridx" in spec.src
    assert "if (fg_group >= 1u) { return; }" in spec.src  # (4, 8) items in (4, 8) workgroups: one group


def test_loop_iterations_count_every_entry():
    a = Tensor(np.ones((8, 16), np.float32))
    uops = to_program(kernel(a.sum(1)), WGSLRenderer(), []).uops  # one work-item per row: a loop of 16
    assert ops_webgpu.loop_iterations(uops) == 17
    uops = to_program(kernel(a.sum()), WGSLRenderer(), []).uops   # one work-item, 8 x 16 nested
    assert ops_webgpu.loop_iterations(uops) == 8 * 17 + 9


def test_bool_output_is_packed_and_special_floats_are_bit_patterns():
    x = Tensor(np.ones(6, np.float32))
    src = to_program(kernel(x < 2), WGSLRenderer(), []).src
    assert "array<atomic<u32>>" in src and "atomicAnd" in src and "atomicOr" in src
    src = to_program(kernel((x * float("inf")).maximum(float("nan"))), WGSLRenderer(), []).src
    assert "bitcast<f32>(0x7f800000u)" in src and "bitcast<f32>(0x7fc00000u)" in src and "fg_isnan" in src


def test_unsupported_dtype_names_the_dtype_and_the_device():
    x = Tensor(np.ones(4, np.int64))
    with pytest.raises(RuntimeError, match=r"dtypes.long \(int64\) is not supported on the WEBGPU device"):
        to_program(kernel(x + 1), WGSLRenderer(), [])
    r = WGSLRenderer()
    assert dtypes.float16 not in r.supported_dtypes() and dtypes.float16 in WGSLRenderer(f16=True).supported_dtypes()
    assert dtypes.bfloat16 in r.supported_dtypes() and dtypes.bfloat16 not in r.native_dtypes()
    assert not {dtypes.int64, dtypes.uint64, dtypes.float64} & set(r.supported_dtypes())


# ---- opening

def test_missing_wgpu_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "wgpu", None)  # `import wgpu` raises ImportError
    with pytest.raises(RuntimeError, match="can't import wgpu.*pip install wgpu"):
        ops_webgpu.WebgpuDevice("WEBGPU")


def test_no_vulkan_driver_is_a_clear_error():
    """Without a Vulkan driver wgpu offers only OpenGL (whose integer % differs): unavailable, with the apt hint."""
    if WHY: pytest.skip(WHY)
    env = {k: v for k, v in os.environ.items() if k != "DEV"} | {"VK_ICD_FILENAMES": "/nonexistent/icd.json"}
    p = subprocess.run([sys.executable, "-c", "from fusegrad import Device; Device['WEBGPU']"], env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode != 0 and "WEBGPU device:" in p.stderr and "mesa-vulkan-drivers" in p.stderr, p.stderr[-500:]


def test_device_listing_and_default():
    out = subprocess.run([sys.executable, "-m", "fusegrad.device"], capture_output=True, text=True, timeout=120,
                         check=False).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("WEBGPU"))
    assert ("unavailable" in line) == bool(WHY) and "default" not in line, line


# ---- on the device

@needs_device
def test_bool_and_narrow_buffers_roundtrip():
    assert Tensor([True, False], device="WEBGPU").tolist() == [True, False]
    for dt, v in ((np.uint8, [1, 255, 7]), (np.int8, [-128, 5, 127, -1, 3]), (np.int16, [-300, 2, 32767])):
        a = np.array(v, dt)
        np.testing.assert_array_equal(Tensor(a, device="WEBGPU").numpy(), a)
        np.testing.assert_array_equal((Tensor(a, device="WEBGPU") + 1).numpy(), a + np.array(1, dt))  # wraps


@needs_device
def test_odd_sized_copies_keep_the_neighbouring_bytes():
    buf = Buffer("WEBGPU", 7, dtypes.uint8).copyin(bytes(range(1, 8)))
    assert buf.as_bytes() == bytes(range(1, 8))
    view = buf.view(3, dtypes.uint8)
    view.copyin(b"\xaa\xbb\xcc")
    assert buf.as_bytes() == b"\xaa\xbb\xcc\x04\x05\x06\x07"


@needs_device
def test_copies_between_devices():
    a = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    x = Tensor(a).to("WEBGPU")
    assert x.device == "WEBGPU"
    y = (x * 2).to("CPU") + 1
    np.testing.assert_allclose((y.to("WEBGPU") * 3).to("PYTHON").numpy(), (a * 2 + 1) * 3, rtol=1e-6)


@needs_device
def test_binding_size_limit_is_a_clear_error():
    limit = Device["WEBGPU"].max_binding
    with pytest.raises(RuntimeError, match=f"{limit + 4} bytes.*exceeds.*max_storage_buffer_binding_size of {limit}"):
        Buffer("WEBGPU", limit // 4 + 1, dtypes.float32).ensure_allocated()


@needs_device
def test_unsupported_dtype_on_the_device():
    assert not is_dtype_supported(dtypes.int64, "WEBGPU") and not is_dtype_supported(dtypes.float64, "WEBGPU")
    with pytest.raises(RuntimeError, match=r"dtypes.double \(float64\) is not supported on the WEBGPU device"):
        (Tensor([1.5, 2.0], device="WEBGPU").cast(dtypes.float64) * 2).realize()


@needs_device
def test_compile_error_shows_the_message_and_source():
    with pytest.raises(CompileError) as e:
        Device["WEBGPU"].compiler.compile("@compute @workgroup_size(1) fn broken() { let a = not_declared_here; }")
    assert "not_declared_here" in str(e.value)


@needs_device
def test_matmul_and_its_gradient():
    check_matmul_and_grad("WEBGPU", 33, 48, 20)


@needs_device
def test_reductions_and_softmax():
    a = RNG.standard_normal((7, 70)).astype(np.float32) * 5
    x = Tensor(a, device="WEBGPU")
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(x.max(0).numpy(), a.max(0))
    np.testing.assert_allclose(x.sum().numpy(), a.sum(), rtol=1e-5)
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(x.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)


@needs_device
def test_int_division_truncates_and_division_by_zero_is_zero():
    """IDIV/MOD as ir/alu.py defines them (C-style truncation; x/0 and x%0 are 0), and floor division on top."""
    a = np.array([-7, -7, 7, 7, -2**31, 5, 0, -1, 9, -9], np.int32)
    b = np.array([2, -2, 2, -2, -1, 0, 3, 0, 4, 4], np.int32)
    x, y = Tensor(a, device="WEBGPU"), Tensor(b, device="WEBGPU")
    wide_a, wide_b = a.astype(np.int64), np.where(b == 0, 1, b).astype(np.int64)
    quo = np.where(b == 0, 0, np.trunc(wide_a / wide_b)).astype(np.int64).astype(np.int32)  # -2**31 / -1 wraps
    np.testing.assert_array_equal(x._alu(Ops.IDIV, y).numpy(), quo)
    np.testing.assert_array_equal(x._alu(Ops.MOD, y).numpy(), np.where(b == 0, 0, a - quo * b))
    nz = b != 0
    np.testing.assert_array_equal((x[Tensor(np.flatnonzero(nz).astype(np.int32), device="WEBGPU")] // 4).numpy(),
                                  a[nz] // 4)


@needs_device
def test_nan_compare_max_and_float_to_int_casts_match_python():
    v = np.array([np.nan, 1.0, -np.inf, 3e9, -3e9, -2.7, 2.7, 1e10, -0.0, np.inf], np.float32)
    w = np.array([np.nan, np.nan, 1.0, 3e9, 2.0, -2.7, np.nan, 0.0, 0.0, 1.0], np.float32)

    def f(dev):
        x, y = Tensor(v, device=dev), Tensor(w, device=dev)
        return [(x != y).numpy(), (x < y).numpy(), x.maximum(y).numpy(), y.maximum(x).numpy(),
                x.cast(dtypes.int32).numpy(), x.cast(dtypes.uint32).numpy(), x.cast(dtypes.int8).numpy(),
                x.cast(dtypes.bool).numpy(), (x.cast(dtypes.int32) << 3).numpy(), (x.cast(dtypes.int32) >> 3).numpy()]
    for gpu, ref in zip(f("WEBGPU"), f("PYTHON")): np.testing.assert_array_equal(gpu, ref)


@needs_device
def test_bitcasts_match_python():
    v = np.array([1.5, -2.25, 65504, 0, -0.0, 6e-8, np.inf, 3.14], np.float32)

    def f(dev):
        x = Tensor(v, device=dev)
        out = [x.bitcast(dtypes.int32), (x.bitcast(dtypes.uint32) + 1).bitcast(dtypes.float32),
               Tensor(np.array([-1, 5, -128], np.int8), device=dev).bitcast(dtypes.uint8)]
        if is_dtype_supported(dtypes.float16, "WEBGPU"):
            h = x.cast(dtypes.float16)
            out += [h.bitcast(dtypes.int16), (h.bitcast(dtypes.uint16) + 1).bitcast(dtypes.float16)]
        return [t.numpy() for t in out]
    for gpu, ref in zip(f("WEBGPU"), f("PYTHON")): np.testing.assert_array_equal(gpu, ref)


@needs_device
@pytest.mark.parametrize("dtype", [d for d in dtypes.all if d != dtypes.bool], ids=str)
def test_dtypes_match_cpu(dtype):
    """Constants, casts, math, a comparison and reduces, bit-exact against the CPU backend (1- and 2-byte types are
    packed in u32 words, bfloat16 is emulated, float16 needs shader-f16)."""
    if not is_dtype_supported(dtype, "WEBGPU"): pytest.skip(f"{dtype} is not supported on WEBGPU")

    def f(dev):
        x = (Tensor.arange(24, device=dev).reshape(4, 6) - 7).cast(dtype)
        y = x * 3 + x.max(1, keepdim=True)
        return [y.numpy(), (y < x).where(y, x + 1).cast(dtypes.float32).sum(0).numpy(), (x * 40).numpy()]
    for gpu, cpu in zip(f("WEBGPU"), f("CPU")): np.testing.assert_array_equal(gpu, cpu)


@needs_device
def test_grids_beyond_the_dispatch_limit_and_many_ranges():
    """65537 is prime: 1-item workgroups, more than one dispatch dimension holds, so they are folded into two rows."""
    dev, n = Device["WEBGPU"], 65537
    a = np.arange(n, dtype=np.float32)
    spec = to_program(kernel(Tensor(a, device="WEBGPU") * 2), dev.renderer)
    assert spec.local_size == (1,) and dev.runtime(spec, dev.compiler.compile(spec.src)).groups == (65535, 2, 1)
    np.testing.assert_array_equal((Tensor(a, device="WEBGPU") * 2).numpy(), a * 2)
    b = RNG.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)
    np.testing.assert_allclose((Tensor(b, device="WEBGPU").permute(4, 2, 0, 3, 1) * 2 + 1).numpy(),
                               b.transpose(4, 2, 0, 3, 1) * 2 + 1)


@needs_device
def test_llvmpipe_loop_limit_long_reduces_are_split_the_rest_is_an_error():
    """llvmpipe ends a work-item's loops after 65535 iterations. A long reduce is split into chunks that stay under
    that (schedule/split.py), even when it has many outputs; a loop that is still too long (the split turned off, a
    symbolic length, which is never split) is an error, never a silently wrong result."""
    from fusegrad import GlobalCounters, Variable
    from fusegrad.helpers import Context
    dev = Device["WEBGPU"]
    x = Tensor(np.ones(70000, np.float32), device="WEBGPU")
    assert x.sum().item() == 70000
    if dev.loop_limit is None: pytest.skip(f"{dev.name} has no loop limit")
    for n in (300_000, 1 << 24):   # 16M floats: 64 MB, within the 128 MiB binding limit
        big = Tensor(np.ones(n, np.float32), device="WEBGPU")
        GlobalCounters.reset()
        assert big.sum().item() == n and GlobalCounters.kernel_count == 2
    m = RNG.standard_normal((4, 300_001)).astype(np.float32)
    np.testing.assert_allclose(Tensor(m, device="WEBGPU").sum(1).numpy(), m.sum(1, dtype=np.float64), rtol=1e-4, atol=1e-2)
    np.testing.assert_array_equal(Tensor(m, device="WEBGPU").max(1).numpy(), m.max(1))
    big = Tensor(np.ones(300_000, np.float32), device="WEBGPU")
    with Context(SPLIT_REDUCE=0), pytest.raises(RuntimeError, match="loop iterations.*65535"):
        big.sum().realize()
    n = Variable("n", 1, 300_000).bind(200_000)
    with pytest.raises(RuntimeError, match="loop iterations.*65535"):
        big[:n].sum().realize()


@needs_device
def test_kernel_corpus_compiles_or_is_rejected_by_dtype():
    """Every kernel of the shared corpus (all dtypes, casts, NaN/inf, reductions, matmul/conv with gradients,
    indexing, a Variable size) renders to WGSL that wgpu validates and builds a pipeline for, except those with a
    64-bit dtype, which are rejected by name."""
    from kernel_corpus import kernel_asts
    dev, built, rejected = Device["WEBGPU"], 0, 0
    for label, ast in kernel_asts():
        try: spec = to_program(ast, dev.renderer)
        except RuntimeError as e:
            assert "is not supported on the WEBGPU device" in str(e) and any(
                d in str(e).split(" is not")[0] for d in ("int64", "uint64", "float64")), (label, str(e))
            rejected += 1
            continue
        dev.runtime(spec, dev.compiler.compile(spec.src))
        built += 1
    assert built > 100 and rejected > 0, (built, rejected)


@needs_device
def test_too_many_buffers_for_one_kernel_is_a_clear_error():
    limit = Device["WEBGPU"].max_bindings
    xs = [Tensor(np.full(4, i, np.float32), device="WEBGPU") for i in range(limit + 2)]
    with pytest.raises(RuntimeError, match=f"takes {limit + 3} buffers, more than the {limit} storage buffers"):
        sum(xs[1:], xs[0]).realize()
