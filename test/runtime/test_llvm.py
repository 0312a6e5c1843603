"""LLVM backend (LLVM IR compiled in-process by llvmlite): the renderer's IR verifies, every op and cast agrees with the
PYTHON reference backend (ir/alu.py semantics), kernels agree with numpy, copies, errors, and the compile cache."""
import os
import subprocess
import sys

import numpy as np
import pytest
from backend_checks import check_alu_matches_python, check_matmul_and_grad

from fusegrad import Device, Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.device import Buffer, CompileError, is_dtype_supported
from fusegrad.ir.ops import Ops
from fusegrad.renderer import ProgramSpec
from fusegrad.renderer.llvmir import LLVMRenderer, lconst

try:
    Device["LLVM"]
    REASON = ""
except Exception as e:  # noqa: BLE001 - no llvmlite here: the tests that need it are skipped, with the reason
    REASON = f"LLVM unavailable: {str(e).splitlines()[0]}"
needs_llvm = pytest.mark.skipif(bool(REASON), reason=REASON)
RNG = np.random.default_rng(0)


def run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "DEV"} | env
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120,
                          check=False)


def ir_of(t: Tensor) -> str:
    (si,) = t.schedule()
    return to_program(si.ast, LLVMRenderer()).src


# ---------------------------------------------------------------------------------------------------------------------
# opening

def test_missing_llvmlite_is_a_clear_error():
    hide = "import sys; sys.modules['llvmlite'] = None; sys.modules['llvmlite.binding'] = None; "
    p = run_py(hide + "from fusegrad import Device; Device['LLVM']")
    assert p.returncode != 0 and "RuntimeError" in p.stderr and "pip install llvmlite" in p.stderr
    p = run_py(hide + "import runpy; runpy.run_module('fusegrad.device', run_name='__main__')")
    (line,) = [ln for ln in p.stdout.splitlines() if ln.startswith("LLVM")]
    assert "unavailable" in line and "pip install llvmlite" in line, p.stdout + p.stderr


@needs_llvm
def test_default_stays_cpu_and_dev_selects_llvm():
    assert run_py("from fusegrad import Device; print(Device.DEFAULT)").stdout.strip() in ("CPU", "PYTHON")
    p = run_py("from fusegrad import Tensor; t = Tensor([1.0, 2.0]) * 2; print(t.device, t.tolist())", DEV="LLVM")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["LLVM", "[2.0,", "4.0]"]


# ---------------------------------------------------------------------------------------------------------------------
# the renderer (pure; llvmlite only verifies its output)

def test_constants_are_exact_llvm_literals():
    assert lconst(0.1, dtypes.float32) == "0x3FB99999A0000000"  # 0.1f widened to double: exact in float
    assert lconst(float("nan"), dtypes.float32) == "0x7FF8000000000000"
    assert lconst(-float("inf"), dtypes.float64) == "0xFFF0000000000000"
    assert lconst(1.0, dtypes.float16) == "0xH3C00" and lconst(1e9, dtypes.float16) == "0xH7C00"
    assert lconst(2**32 - 1, dtypes.uint32) == "-1" and lconst(-128, dtypes.int8) == "-128"
    assert lconst(True, dtypes.bool) == "true"


def test_half_is_native_only_with_hardware_conversions():
    ren = LLVMRenderer()
    assert dtypes.float16 in ren.native_dtypes() and dtypes.bfloat16 in ren.supported_dtypes()  # bf16: emulated
    ren.fp16 = False  # an x86 CPU without F16C: half would need runtime-library calls
    assert dtypes.float16 not in ren.supported_dtypes() and dtypes.bfloat16 not in ren.native_dtypes()


@needs_llvm
def test_rendered_ir_verifies():
    """A matmul and a padded sum (float reduces: contract allowed; gated loads), elementwise math on half (no fast-math
    flags), casts and comparisons on bool and ints: each module parses and passes LLVM's verifier."""
    from fusegrad.runtime.ops_llvm import llvm
    a, b = (Tensor(RNG.standard_normal(s).astype(np.float32)) for s in ((6, 64), (64, 3)))
    h = Tensor(np.linspace(0.1, 2, 8, dtype=np.float16))
    i = Tensor(np.arange(-4, 4, dtype=np.int32))
    srcs = {"mm": ir_of(a @ b), "pad": ir_of(a.pad(((1, 1), (0, 2))).sum(1)),
            "half": ir_of((h.sqrt() + h.exp2() * h.log2() - h.sin()).trunc().maximum(h)),
            "ints": ir_of(((i // 3) * (i % -3) << 1 >> 1).cast(dtypes.bool).where(i, i.cast(dtypes.uint8) < 7)),
            "double_to_half": ir_of(Tensor(np.ones(4)).cast(dtypes.float16))}
    for name, src in srcs.items():
        llvm().parse_assembly(src).verify()
        assert " fast " not in src and ("contract" in src) == (name in ("mm", "pad")), name  # float reduces only
    assert "llvm.sqrt.f32" in srcs["half"] and "fptrunc float" in srcs["half"]  # half math goes through float
    assert "phi float" in srcs["pad"]  # a gated load: loaded only in its own block, 0.0 otherwise
    assert "fptrunc double" in srcs["double_to_half"] and "llvm.fabs.f64" in srcs["double_to_half"]


@needs_llvm
def test_vector_kernels_use_llvm_vectors():
    """With 32-byte SIMD the matmul's output axis becomes <8 x float> loads, FMAs on vectors and unaligned stores."""
    from fusegrad.runtime.ops_llvm import llvm
    ren = LLVMRenderer()
    ren.simd_bytes = 32
    a, b = (Tensor(RNG.standard_normal(s).astype(np.float32)) for s in ((8, 64), (64, 32)))
    (si,) = (a @ b).schedule()
    src = to_program(si.ast, ren).src
    llvm().parse_assembly(src).verify()
    assert "load <8 x float>, ptr" in src and ", align 4" in src and "fmul contract <8 x float>" in src
    assert "shufflevector <8 x float>" in src  # a row element broadcast to every lane
    assert lconst(2, dtypes.int32.vec(2)) == "<i32 2, i32 2>"


# ---------------------------------------------------------------------------------------------------------------------
# semantics: against the PYTHON backend, which executes ir/alu.py

VALS = [-3.7, -1.0, -0.5, -0.0, 0.5, 1.5, 2.0, 100.25, 200.0, 70000.0, 3e9, float("nan"), float("inf"), -float("inf"),
        -2e10, 0.75]


@pytest.fixture(params=["scalar", "vector"])
def lanes(request, monkeypatch):
    """'vector': every LLVM kernel gets VECTORIZE(4) on its innermost range of a size divisible by 4, so each op and
    cast also runs on <4 x T> values (the heuristic vectorizes only some reduce kernels)."""
    if request.param == "scalar":
        yield request.param
        return
    from fusegrad import codegen
    from fusegrad.codegen.opt import Opt
    from fusegrad.engine import realize
    from fusegrad.helpers import Context
    from fusegrad.ir.pattern import graph_rewrite
    from fusegrad.ir.symbolic import pm_symbolic
    orig = codegen.to_program

    def forced(ast, ren, opts=None):
        if opts is not None or not isinstance(ren, LLVMRenderer): return orig(ast, ren, opts)
        rngs = [n for n in graph_rewrite(ast, pm_symbolic).toposort() if n.op is Ops.RANGE and n.src[0].op is Ops.CONST
                and n.src[0].arg % 4 == 0]
        return orig(ast, ren, [Opt("VECTORIZE", max(r.arg[0] for r in rngs), 4)] if rngs else None)
    monkeypatch.setattr(codegen, "to_program", forced)
    realize._programs.clear()
    with Context(CACHELEVEL=0): yield request.param  # no program cache: it would hand back the unforced program
    realize._programs.clear()


def _source(dt, dev):
    x = Tensor(VALS, device=dev)
    if dt == dtypes.bool: return x > 0.7
    if dtypes.is_unsigned(dt): return x.cast(dtypes.int64).cast(dt)
    return x.cast(dt)


@needs_llvm
@pytest.mark.parametrize("src", [d for d in dtypes.all if d != dtypes.bfloat16], ids=str)
def test_casts_match_python_backend(src, lanes):
    """Every src -> dst conversion is bit-exact with cast_value: truncation toward zero, wrapping to the width, NaN and
    inf -> 0, nonzero -> True, double -> half correctly rounded."""
    for dst in dtypes.all:
        if not is_dtype_supported(dst, "LLVM"): continue
        got, want = (_source(src, d).realize().cast(dst).numpy() for d in ("LLVM", "PYTHON"))
        np.testing.assert_array_equal(got, want, err_msg=f"{src} -> {dst}")




@needs_llvm
@pytest.mark.parametrize("dt", [d for d in dtypes.all if d not in (dtypes.bfloat16,)], ids=str)
def test_alu_matches_python_backend(dt, lanes):
    """Every ALU op on every dtype, including NaN compares (CMPNE is unordered) and negative int division."""
    check_alu_matches_python("LLVM", dt, 12, float_rtol=1e-6)


@needs_llvm
def test_int_division_and_modulo_of_negatives():
    a, b = np.array([-7, 7, -7, 7, -1, 0, 9, -2**31], np.int32), np.array([2, 2, -2, -2, 3, 5, -4, 3], np.int32)
    x, y = Tensor(a, device="LLVM"), Tensor(b, device="LLVM")
    np.testing.assert_array_equal(x._alu(Ops.IDIV, y).numpy(), np.fix(a / b).astype(np.int32))  # C: toward zero
    np.testing.assert_array_equal(x._alu(Ops.MOD, y).numpy(), np.fmod(a, b))
    np.testing.assert_array_equal((x // y).numpy(), a // b)  # python-style, built from the two above
    np.testing.assert_array_equal((x % y).numpy(), a % b)
    zero = Tensor(np.array([0, 0], np.int32), device="LLVM")
    assert Tensor([5, -5], device="LLVM")._alu(Ops.IDIV, zero).tolist() == [0, 0]  # ir/alu.py: no trap
    assert Tensor([5, -5], device="LLVM")._alu(Ops.MOD, zero).tolist() == [0, 0]


@needs_llvm
def test_max_propagates_nan():
    nan = float("nan")
    a, b = np.array([nan, 1.0, 2.0, nan, -0.0], np.float32), np.array([1.0, nan, 1.0, nan, 0.0], np.float32)
    got = Tensor(a, device="LLVM").maximum(Tensor(b, device="LLVM")).numpy()
    np.testing.assert_array_equal(got, np.maximum(a, b))
    assert np.isnan(Tensor([1.0, nan, 3.0], device="LLVM").max().item())
    assert Tensor([1.0, nan, 3.0], device="LLVM").max().item() != 3.0


@needs_llvm
def test_double_to_half_rounds_correctly():
    """Halfway cases and values just off them, overflow, subnormals: the same as numpy's (correctly rounded) cast."""
    ulp = 2.0 ** -10
    v = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2**-40, 1 + ulp / 2 - 2**-40, 65519.99, 65520.0, 1e300,
                  -1e-300, 2**-25, 2**-25 + 2**-60, 3 * 2**-26, float("nan"), -float("inf")])
    with np.errstate(over="ignore"): want = v.astype(np.float16)
    np.testing.assert_array_equal(Tensor(v, device="LLVM").cast(dtypes.float16).numpy(), want)


# ---------------------------------------------------------------------------------------------------------------------
# kernels against numpy

@needs_llvm
def test_matmul_and_its_gradient():
    check_matmul_and_grad("LLVM", 33, 48, 20)


@needs_llvm
def test_matmul_split_over_threads(monkeypatch):
    """The outer loop split into (core_start, core_end) chunks, one per thread (the threshold lowered so that a small
    matmul splits; with one core the kernel keeps its plain loop)."""
    from fusegrad.engine import realize
    from fusegrad.helpers import Context
    ren = Device["LLVM"].renderer
    monkeypatch.setattr(ren, "threads", 3)
    monkeypatch.setattr(ren, "min_thread_work", 1)
    a, b = RNG.standard_normal((24, 40)).astype(np.float32), RNG.standard_normal((40, 56)).astype(np.float32)
    (si,) = (Tensor(a, device="LLVM") @ Tensor(b, device="LLVM")).schedule()
    spec = to_program(si.ast, ren)
    assert spec.thread_size > 1 and "%core_start" in spec.src
    realize._programs.clear()
    with Context(CACHELEVEL=0):
        np.testing.assert_allclose((Tensor(a, device="LLVM") @ Tensor(b, device="LLVM")).numpy(), a @ b, rtol=1e-4,
                                   atol=1e-4)
    assert realize.get_runner(si.ast, "LLVM").spec.thread_size == spec.thread_size
    realize._programs.clear()


@needs_llvm
def test_reductions_and_softmax():
    a = RNG.standard_normal((7, 70)).astype(np.float32) * 5
    t = Tensor(a, device="LLVM")
    np.testing.assert_allclose(t.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(t.max(0).numpy(), a.max(0))
    np.testing.assert_allclose(t.pad(((1, 2), (3, 0))).mean().numpy(), np.pad(a, ((1, 2), (3, 0))).mean(), rtol=1e-5)
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(t.softmax(1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert Tensor(np.arange(10, dtype=np.int64) - 2**40, device="LLVM").sum().item() == 45 - 10 * 2**40


@needs_llvm
def test_conv2d_and_bool_buffers():
    x, w = RNG.standard_normal((2, 3, 9, 10)).astype(np.float32), RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), (2, 3))
    ref = np.einsum("nchwkl,ockl->nohw", windows[:, :, ::2, ::2], w)
    out = Tensor(x, device="LLVM").conv2d(Tensor(w, device="LLVM"), stride=2, padding=1)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)
    m = Tensor(np.array([True, False, True]), device="LLVM")
    assert (m & ~Tensor(np.array([True, True, False]), device="LLVM")).tolist() == [False, False, True]


# ---------------------------------------------------------------------------------------------------------------------
# memory, errors, the compile cache

@needs_llvm
def test_copies_between_llvm_cpu_and_python():
    a = (np.arange(24, dtype=np.float32).reshape(4, 6) - 12) / 8  # exact through * 2 + 1 - 1 / 2
    x = Tensor(a).to("LLVM")
    assert x.device == "LLVM" and Buffer.supports_views("LLVM")
    y = (x * 2).to("CPU") + 1
    z = (y.to("LLVM") - 1).to("PYTHON") / 2
    np.testing.assert_array_equal(z.numpy(), a)
    assert Buffer("LLVM", 0, dtypes.float32).as_bytes() == b""


@needs_llvm
def test_bad_ir_is_a_compile_error_naming_the_kernel():
    src = "define void @broken_kernel(ptr %a) {\nentry:\n  store float %not_defined_here, ptr %a\n  ret void\n}\n"
    with pytest.raises(CompileError) as e:
        Device["LLVM"].compiler.compile(src)
    msg = str(e.value)
    assert "broken_kernel" in msg and "not_defined_here" in msg.split("--- source ---")[0]


@needs_llvm
def test_a_call_to_a_missing_function_is_refused_not_run():
    """MCJIT would resolve an unknown external function to a null address; the loader refuses the kernel instead."""
    from fusegrad.runtime.ops_llvm import undefined_symbols
    src = ("declare float @fg_no_such_function(float)\ndefine void @calls_missing(ptr %a) {\nentry:\n"
           "  %x = load float, ptr %a\n  %y = call float @fg_no_such_function(float %x)\n  store float %y, ptr %a\n"
           "  ret void\n}\n")
    dev = Device["LLVM"]
    lib = dev.compiler.compile(src)
    assert "fg_no_such_function" in undefined_symbols(lib)
    with pytest.raises(CompileError, match="fg_no_such_function"):
        dev.runtime(ProgramSpec("calls_missing", src, [], 1), lib)


@needs_llvm
def test_launch_with_an_int_argument_and_timing():
    src = ("define void @axpb(ptr noalias %out, ptr noalias %x, i32 %b) {\nentry:\n  br label %loop\nloop:\n"
           "  %i = phi i32 [ 0, %entry ], [ %n, %loop ]\n  %p = getelementptr float, ptr %x, i32 %i\n"
           "  %v = load float, ptr %p\n  %bf = sitofp i32 %b to float\n  %r = call float @llvm.fma.f32(float %v, "
           "float 2.0, float %bf)\n  %q = getelementptr float, ptr %out, i32 %i\n  store float %r, ptr %q\n"
           "  %n = add i32 %i, 1\n  %c = icmp slt i32 %n, 64\n  br i1 %c, label %loop, label %done\ndone:\n"
           "  ret void\n}\ndeclare float @llvm.fma.f32(float, float, float)\n")
    dev = Device["LLVM"]
    prg = dev.runtime(ProgramSpec("axpb", src, [], 2, vars=[object()]), dev.compiler.compile(src))
    x = np.arange(64, dtype=np.float32)
    xb, ob = Buffer("LLVM", 64, dtypes.float32).copyin(memoryview(x)), Buffer("LLVM", 64, dtypes.float32)
    t = prg(ob.opaque, xb.opaque, vals=(3,), wait=True)
    assert isinstance(t, float) and 0 <= t < 10
    np.testing.assert_array_equal(np.frombuffer(ob.as_bytes(), np.float32), x * 2 + 3)


@needs_llvm
def test_compile_cache_hits_and_is_keyed_by_llvm_and_cpu(tmp_path, monkeypatch):
    from fusegrad.runtime import ops_llvm
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    comp = ops_llvm.LLVMCompiler()
    src = ir_of(Tensor(np.arange(8, dtype=np.float32)) * 3 + 1)
    lib = comp.compile_cached(src)
    from fusegrad import diskcache
    assert diskcache.stats()[2][comp.cachekey] == (1, len(lib))   # one entry: the object
    monkeypatch.setattr(comp, "compile", lambda s: pytest.fail("a cached kernel was compiled again"))
    assert comp.compile_cached(src) == lib
    import llvmlite.binding
    ver, host = llvmlite.binding.llvm_version_info, ops_llvm.host_target()
    monkeypatch.setattr(ops_llvm, "host_target", lambda: (host[0], "generic", host[2]))
    assert ops_llvm.LLVMCompiler().cachekey != comp.cachekey
    monkeypatch.setattr(ops_llvm, "host_target", lambda: host)
    monkeypatch.setattr(llvmlite.binding, "llvm_version_info", (ver[0] + 1, 0, 0))
    assert ops_llvm.LLVMCompiler().cachekey != comp.cachekey


@needs_llvm
def test_kernel_corpus_compiles_loads_and_runs():
    """Every kernel of test/runtime/kernel_corpus.py (all dtypes, casts, reductions, matmul/conv with gradients,
    indexing, a Variable size) renders, verifies, compiles and loads; those without variables run on zeroed buffers."""
    from kernel_corpus import kernel_asts

    from fusegrad.codegen.search import _Timer
    dev = Device["LLVM"]
    asts = kernel_asts()
    assert len(asts) > 50
    for label, ast in asts:
        spec = to_program(ast, dev.renderer)
        prg = dev.runtime(spec, dev.compiler.compile(spec.src))
        if not spec.vars: prg(*[b.opaque for b in _Timer(ast, "LLVM").bufs])
