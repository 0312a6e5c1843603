"""Elementwise kernels that evaluate exp2 (exp, sigmoid, tanh, erf, GELU) are vectorized by the heuristic
(codegen/opt.py, elementwise_opts) and threaded by lanes of work; their results still match PyTorch."""
import numpy as np
import pytest
import torch

from fusegrad import Context, Device, Tensor, dtypes
from fusegrad.codegen import to_program
from fusegrad.codegen.opt import hand_coded_opts
from fusegrad.ir.pattern import graph_rewrite
from fusegrad.ir.symbolic import pm_symbolic

CPU = Device["CPU"].renderer
needs_simd = pytest.mark.skipif(not (CPU.simd_bytes and CPU.vector_math), reason="no vector exp2/log2 on this CPU")
rng = np.random.default_rng(18)
X = (rng.standard_normal((64, 48)) * 4).astype(np.float32)
X[0, :16] = [np.nan, np.inf, -np.inf, 0, -0.0, 88, -88, 100, -100, 1e-30, -1e-30, 20, -20, 9.5, -9.5, 3e38]

FNS = {  # name: (fusegrad, torch)
    "exp": (lambda x: x.exp(), torch.exp),
    "sigmoid": (lambda x: x.sigmoid(), torch.sigmoid),
    "tanh": (lambda x: x.tanh(), torch.tanh),
    "erf": (lambda x: x.erf(), torch.erf),
    "gelu_erf": (lambda x: x.gelu("none"), lambda x: torch.nn.functional.gelu(x)),
    "gelu_tanh": (lambda x: x.gelu("tanh"), lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    "silu": (lambda x: x.silu(), torch.nn.functional.silu),
    "softplus": (lambda x: x.softplus(), torch.nn.functional.softplus),
    "mish": (lambda x: x.mish(), torch.nn.functional.mish),
    "log_abs": (lambda x: x.abs().log(), lambda x: x.abs().log()),
}


def opts_of(t: Tensor):
    (si,) = t.schedule()
    return hand_coded_opts(graph_rewrite(si.ast, pm_symbolic), CPU)


@needs_simd
@pytest.mark.parametrize("name", list(FNS))
def test_transcendental_kernel_is_vectorized_and_matches_torch(name):
    fg, tf = FNS[name]
    opts = opts_of(fg(Tensor(X)))
    assert [o.op for o in opts] == ["VECTORIZE"] and opts[0].amount >= 4
    with Context(CACHELEVEL=0):   # not a program rendered before this rule existed
        out = fg(Tensor(X)).numpy()
    with Context(CACHELEVEL=0, NOOPT=1):   # the scalar loop: same math, special values included
        scalar = fg(Tensor(X)).numpy()
    np.testing.assert_allclose(out, scalar, rtol=1e-6, atol=1e-7, equal_nan=True)
    fin = X[1:]   # finite inputs: the op suite's tolerances against PyTorch
    np.testing.assert_allclose(out[1:], tf(torch.tensor(fin)).numpy(), rtol=1e-3, atol=1e-6)


@needs_simd
def test_vector_log2_and_exp2_equal_the_scalar_ones_bit_for_bit():
    # every float32 exponent, subnormals, zeros, infinities, NaN, negatives: fg_log2f_xN / fg_exp2f_xN run the scalar
    # functions' operations lane by lane, so the results are the same bits
    bits = rng.integers(0, 2**32, 64 * 1024, dtype=np.uint64).astype(np.uint32)
    v = bits.view(np.float32).copy()
    v[:12] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1.17549435e-38, 1.0, 2.0, 0.5, 1.41421356, -1.0]
    for fn in (lambda t: t.log2(), lambda t: t.exp2(), lambda t: (t * 1e-30).exp2()):
        opts = opts_of(fn(Tensor(v)))
        assert [o.op for o in opts] == ["VECTORIZE"]
        with Context(CACHELEVEL=0):
            vec = fn(Tensor(v)).numpy()
        with Context(CACHELEVEL=0, NOOPT=1):
            sca = fn(Tensor(v)).numpy()
        same = (vec.view(np.uint32) == sca.view(np.uint32)) | (np.isnan(vec) & np.isnan(sca))
        assert same.all(), (v[~same][:5], vec[~same][:5], sca[~same][:5])
    with np.errstate(all="ignore"):
        ref = np.log2(v.astype(np.float64))
    ok = np.isfinite(ref) & (ref != 0)
    out = Tensor(v).log2().numpy()
    np.testing.assert_allclose(out[ok], ref[ok], rtol=2e-6, atol=2e-7)
    assert np.array_equal(np.isnan(out), np.isnan(ref)) and np.array_equal(out[np.isinf(ref)], ref[np.isinf(ref)])


@needs_simd
def test_vector_exp2_in_source_and_threaded():
    (si,) = Tensor(X).gelu("none").schedule()
    assert "fg_exp2f_x" in to_program(si.ast, CPU).src
    if CPU.threads > 1:   # 1024x1536 / 16 lanes = 98304 trips, each 16 elements' work: split over the threads
        (si,) = Tensor.empty(1024, 1536).gelu("none").schedule()
        src = to_program(si.ast, CPU).src
        assert "fg_exp2f_x" in src and "core_start" in src


def test_cheap_or_other_dtype_elementwise_left_to_the_compiler():
    assert opts_of(Tensor(X) * 2 + 1) == []                           # no exp2: GCC's business
    half_exp = opts_of(Tensor(X).cast(dtypes.float16).exp())   # half: vectorized only where vectors convert
    m = CPU.machine
    assert (half_exp != []) == bool(CPU.simd_bytes and CPU.vector_math and m is not None and m.half_vectors(4))
    if CPU.simd_bytes and CPU.vector_math:   # the loops are merged first: 64*45 = 2880 = 16*180 lanes
        (si,) = Tensor(X[:, :45].copy()).exp().schedule()
        assert "fg_exp2f_x" in to_program(si.ast, CPU).src
    (si,) = Tensor(X[:3, :5].copy()).exp().schedule()   # 15 elements: no width divides
    assert "fg_exp2f_x" not in to_program(si.ast, CPU).src


def test_python_backend_never_vectorizes():
    t = Tensor(X, device="PYTHON").exp()
    (si,) = t.schedule()
    assert hand_coded_opts(graph_rewrite(si.ast, pm_symbolic), Device["PYTHON"].renderer) == []


HALF_FNS = {  # name: (fusegrad, numpy on float32 then rounded to float16)
    "mul_add": (lambda x: x * x + x, lambda x: x * x + x),
    "quick_gelu": (lambda x: x.quick_gelu(), lambda x: x / (1 + np.exp(-1.702 * x))),
    "relu_where": (lambda x: (x > 0).where(x, x * 0.5), lambda x: np.where(x > 0, x, x * 0.5)),
    "to_float32": (lambda x: x.cast(dtypes.float32) * 2, lambda x: x * 2),
}


@pytest.mark.parametrize("name", list(HALF_FNS))
def test_half_elementwise_is_vectorized_where_the_machine_converts_vectors(name):
    """float16 elementwise kernels are vectorized (whole-vector F16C conversions, float32 math) where the machine
    description says float16 vectors convert as one instruction, and left to the compiler elsewhere; the values match
    the scalar loop and NumPy's float32 math rounded to float16 either way."""
    fg, ref = HALF_FNS[name]
    x = X.ravel().copy()   # specials (NaN, infinities, float16 overflow) in the first 16
    x[16:21] = [0.0, -0.0, 60000, -60000, 1e-6]
    with np.errstate(over="ignore"):
        x16 = x.astype(np.float16)
    opts = opts_of(fg(Tensor(x16).reshape(48, 64)))
    machine = CPU.machine
    if CPU.simd_bytes and CPU.vector_math and machine is not None and machine.half_vectors(4):
        assert [o.op for o in opts] == ["VECTORIZE"] and opts[0].amount >= 4
        assert machine.half_vectors(opts[0].amount)
    else:
        assert opts == []
    with Context(CACHELEVEL=0):
        out = fg(Tensor(x16)).numpy()
    with Context(CACHELEVEL=0, NOOPT=1):
        scalar = fg(Tensor(x16)).numpy()
    np.testing.assert_array_equal(out, scalar)
    fin = np.isfinite(x16) & (np.abs(x16) < 1000)   # NumPy's special values differ (-inf / inf is NaN there)
    with np.errstate(over="ignore"):
        want = ref(x16[fin].astype(np.float32)).astype(out.dtype).astype(np.float32)
    # (quick_gelu rounds 1.702 and its intermediates to float16, as torch's half does: within 1%)
    np.testing.assert_allclose(out[fin].astype(np.float32), want, rtol=1e-2, atol=1e-4)


def test_machine_half_vectors_follows_the_target_features():
    """Machine.half_vectors reads the target's features: F16C converts 4 and 8 lanes, 16 lanes also need AVX-512F;
    an x86 target without F16C (x86-64-v2) converts none; ARM NEON converts any."""
    from fusegrad.runtime.machine import Machine
    mk = lambda isa, feats: Machine(isa=isa, march="t", vector_bytes=32, vector_registers=16, fma_pipes=2,  # noqa: E731
                                    l1_bytes=1, l2_bytes=1, l3_bytes=0, features=feats)
    v3, v4, v2 = mk("avx2", ("AVX2", "F16C")), mk("avx512", ("AVX512F", "AVX2", "F16C")), mk("sse4.2", ("SSE4_2",))
    assert v3.half_vectors(8) and not v3.half_vectors(16) and v4.half_vectors(16) and not v2.half_vectors(4)
    assert mk("neon", ("ARM_NEON",)).half_vectors(4)


@pytest.mark.parametrize("name", ["sigmoid", "silu", "tanh"])
def test_sigmoid_is_one_exp_and_one_division_per_value(name):
    """ir/ops.py sigmoid: one exp of -|x| and one division, `where(x >= 0, 1, e) / (1 + e)` (before: both branches'
    exps and divisions for every value, SiLU's kernel in a decode step of SmolLM2 5.5 us); values and gradients equal
    the two-branch form bit for bit, and PyTorch's within a few ulp, at 0, the infinities and NaN."""
    from fusegrad.ir.ops import Ops
    ast = FNS[name][0](Tensor.empty(1536).realize()).schedule()[-1].ast
    ops = [n.op for n in ast.toposort()]
    assert ops.count(Ops.EXP2) == 1 and ops.count(Ops.RECIPROCAL) <= 1, ops
    x = np.concatenate([X.ravel(), np.float32([0.0, -0.0, 1e-8, -1e-8])])
    a = Tensor(x, requires_grad=True)
    pos = a >= 0
    ep, en = (-pos.where(a, 0)).exp(), pos.where(0, a).exp()
    two_branch = pos.where(1 / (1 + ep), en / (1 + en))
    y = a.sigmoid()
    np.testing.assert_array_equal(y.numpy().view(np.int32), two_branch.numpy().view(np.int32))
    y.sum().backward()
    g = a.grad.numpy()
    b = Tensor(x, requires_grad=True)
    pb = b >= 0
    e1, e2 = (-pb.where(b, 0)).exp(), pb.where(0, b).exp()
    pb.where(1 / (1 + e1), e2 / (1 + e2)).sum().backward()
    np.testing.assert_array_equal(g, b.grad.numpy())
    t = torch.tensor(x, requires_grad=True)
    torch.sigmoid(t).sum().backward()
    ok = ~np.isnan(x)
    np.testing.assert_allclose(y.numpy()[ok], torch.sigmoid(t).detach().numpy()[ok], rtol=3e-6, atol=1e-37)
    # (PyTorch's backward is s * (1 - s), which loses digits where s is near 1: 0 at x = 20, where ours is 2e-9)
    np.testing.assert_allclose(g[ok], t.grad.numpy()[ok], rtol=1e-3, atol=1e-7)
    assert np.isnan(y.numpy()[~ok]).all() and np.isnan(g[~ok]).all()
