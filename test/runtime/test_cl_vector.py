"""CL vector types (the VECTORIZE action on OpenCL): the rendered source uses `floatN`/`vloadN`/`select`..., every ALU
op and cast agrees with the PYTHON backend when each kernel is forced to 4, 8 or 16 lanes, and vectorized matmul,
softmax and reductions match numpy. The renderer checks need no device; the rest is skipped without OpenCL."""
import numpy as np
import pytest
from backend_checks import check_alu_matches_python, check_matmul_and_grad

from fusegrad import Device, Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.codegen.opt import Opt
from fusegrad.device import is_dtype_supported
from fusegrad.ir.ops import Ops
from fusegrad.renderer.opencl import OpenCLRenderer

try:
    Device["CL"]
    CL_REASON = ""
except Exception as e:  # no OpenCL here
    CL_REASON = f"CL unavailable: {str(e).splitlines()[0]}"
needs_cl = pytest.mark.skipif(bool(CL_REASON), reason=CL_REASON)
RNG = np.random.default_rng(0)


def renderer(simd: int = 64) -> OpenCLRenderer:
    ren = OpenCLRenderer()
    ren.simd_bytes = simd
    return ren


# ---------------------------------------------------------------------------------------------------------------------
# the source (no device needed)

def test_matmul_renders_vector_types():
    a, b = (Tensor(RNG.standard_normal(s).astype(np.float32)) for s in ((8, 64), (64, 32)))
    (si,) = (a @ b).schedule()
    src = to_program(si.ast, renderer()).src
    assert "float16 " in src and "vload16(0, &data" in src and "vstore16(" in src
    assert "_x16" not in src and "typedef" not in src and "__attribute__" not in src  # no GCC vector extensions
    assert "(float16)(0.0f)" in src  # a broadcast constant is one literal


def test_no_vectors_without_simd_bytes():
    a, b = (Tensor(RNG.standard_normal(s).astype(np.float32)) for s in ((8, 64), (64, 32)))
    (si,) = (a @ b).schedule()
    src = to_program(si.ast, renderer(0)).src
    assert "vload" not in src and "float16" not in src and "float4" not in src


def test_elementwise_vector_ops_render():
    x, y = Tensor(RNG.standard_normal(64).astype(np.float32)), Tensor(RNG.standard_normal(64).astype(np.float32))
    (si,) = ((x < y).where(x.maximum(y), x.sqrt()) + 1).schedule()
    src = to_program(si.ast, renderer(), [Opt("VECTORIZE", 0, 8)]).src
    assert "vload8(0, &data1[" in src and "vstore8(" in src
    assert "select(" in src and "isnan(" in src and "sqrt(val" in src and "convert_uchar8(-(" in src
    with pytest.raises(RuntimeError, match="no 5-lane vectors"): renderer().render_dtype(dtypes.float32.vec(5))


def test_lanes_and_casts_render():
    ren = renderer()
    assert ren.render_gep("val0", 10) == "val0.sa" and ren.render_gep("a+b", 0) == "(a+b).s0"
    assert ren.render_cast(dtypes.int32.vec(4), "v", dtypes.float32.vec(4)) == "convert_int4(v)"
    assert ren.render_cast(dtypes.bool.vec(4), "v", dtypes.float32.vec(4)) == "convert_uchar4(-(v!=0.0f))"
    assert ren.render_bitcast(dtypes.uint32.vec(4), "v", dtypes.float32.vec(4)) == "as_uint4(v)"
    assert ren.render_dtype(dtypes.bool.vec(4)) == "uchar4" and ren.render_dtype(dtypes.int64.vec(2)) == "long2"


# ---------------------------------------------------------------------------------------------------------------------
# semantics on the device, forced to N lanes, against the PYTHON backend (ir/alu.py)

@pytest.fixture(params=[4, 16])
def lanes(request, monkeypatch):
    """Every CL kernel gets VECTORIZE(N) on its innermost range of a size divisible by N (the heuristic vectorizes
    only reduce kernels), so each op and cast runs on N-lane OpenCL vectors."""
    from fusegrad import codegen
    from fusegrad.engine import realize
    from fusegrad.helpers import Context
    from fusegrad.ir.pattern import graph_rewrite
    from fusegrad.ir.symbolic import pm_symbolic
    orig, n = codegen.to_program, request.param

    def forced(ast, ren, opts=None):
        if opts is not None or not isinstance(ren, OpenCLRenderer): return orig(ast, ren, opts)
        rngs = [r for r in graph_rewrite(ast, pm_symbolic).toposort() if r.op is Ops.RANGE and r.src[0].op is Ops.CONST
                and r.src[0].arg % n == 0]
        return orig(ast, ren, [Opt("VECTORIZE", max(r.arg[0] for r in rngs), n)] if rngs else None)
    monkeypatch.setattr(codegen, "to_program", forced)
    realize._programs.clear()
    with Context(CACHELEVEL=0): yield n  # no program cache: it would hand back the unforced program
    realize._programs.clear()




@needs_cl
@pytest.mark.parametrize("dt", [d for d in dtypes.all if d != dtypes.bfloat16], ids=str)
def test_alu_matches_python_backend(dt, lanes):
    if not is_dtype_supported(dt, "CL"): pytest.skip(f"{dt} unsupported on this OpenCL device")
    check_alu_matches_python("CL", dt, 32, float_rtol=1e-5)


CAST_VALS = [-3.7, -1.0, -0.5, -0.0, 0.5, 1.5, 2.0, 100.25, 120.0, 7.0, 30000.0, float("nan"), -2.0, 0.75, 33.0, -99.9]


@needs_cl
@pytest.mark.parametrize("src", [d for d in dtypes.all if d != dtypes.bfloat16], ids=str)
def test_casts_match_python_backend(src, lanes):
    """Every src -> dst conversion of values every dtype holds (OpenCL, like C, leaves out-of-range float -> int
    conversions undefined): truncation toward zero, nonzero (and NaN) -> True."""
    if not is_dtype_supported(src, "CL"): pytest.skip(f"{src} unsupported on this OpenCL device")

    def source(dev):
        x = Tensor(CAST_VALS, device=dev)
        if src == dtypes.bool: return x > 0.7
        if dtypes.is_unsigned(src): return (x == x).where(x.abs(), 0.0).cast(dtypes.int64).cast(src)  # noqa: PLR0124
        return x.cast(src) if dtypes.is_float(src) else (x == x).where(x, 0.0).cast(src)  # noqa: PLR0124 (NaN -> 0 first)
    for dst in dtypes.all:
        if not is_dtype_supported(dst, "CL") or dst == dtypes.bfloat16: continue
        if dtypes.is_float(src) and not dtypes.is_float(dst) and dst != dtypes.bool: continue  # NaN -> int: undefined
        got, want = (source(d).realize().cast(dst).numpy() for d in ("CL", "PYTHON"))
        np.testing.assert_array_equal(got, want, err_msg=f"{src} -> {dst}")


@needs_cl
def test_float_to_int_casts_in_range(lanes):
    v = np.array([-3.7, -1.0, -0.5, 0.5, 1.5, 100.25, 120.0, -99.9] * 2, np.float32)
    for dst in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64):
        got = Tensor(v, device="CL").cast(dst).numpy()
        np.testing.assert_array_equal(got, np.trunc(v).astype(got.dtype))


@needs_cl
def test_bitcasts(lanes):
    v = RNG.standard_normal(16).astype(np.float32)
    np.testing.assert_array_equal(Tensor(v, device="CL").bitcast(dtypes.uint32).numpy(), v.view(np.uint32))
    np.testing.assert_array_equal(Tensor(v, device="CL").bitcast(dtypes.int32).bitcast(dtypes.float32).numpy(), v)


# ---------------------------------------------------------------------------------------------------------------------
# kernels the heuristic vectorizes (simd_bytes from the device), against numpy

@needs_cl
def test_device_sets_simd_bytes():
    ren = Device["CL"].renderer
    assert 0 <= ren.simd_bytes <= 64  # OpenCL's widest vector is 16 lanes of float


@needs_cl
@pytest.mark.parametrize("shape", [(64, 64, 64), (33, 48, 20), (128, 256, 96)])
def test_vectorized_matmul_matches_numpy(shape):
    check_matmul_and_grad("CL", *shape)


@needs_cl
def test_vectorized_matmul_source():
    if not Device["CL"].renderer.simd_bytes: pytest.skip("this OpenCL device has no vector width (simd_bytes = 0)")
    a, b = (Tensor(RNG.standard_normal((64, 64)).astype(np.float32), device="CL") for _ in range(2))
    (si,) = (a @ b).schedule()
    assert "vload" in to_program(si.ast, Device["CL"].renderer).src


@needs_cl
def test_vectorized_reductions_and_softmax():
    a = RNG.standard_normal((16, 256)).astype(np.float32) * 4
    x = Tensor(a, device="CL")
    np.testing.assert_allclose(x.sum(1).numpy(), a.sum(1), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(x.sum(0).numpy(), a.sum(0), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(x.max(1).numpy(), a.max(1))
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(x.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    i = RNG.integers(-100, 100, (8, 64)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(i, device="CL").sum(1).numpy(), i.sum(1))
