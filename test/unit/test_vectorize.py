"""VECTORIZE: SIMD lanes for output and reduce ranges, checked against NumPy with forced optimization lists."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fusegrad.codegen as codegen
from fusegrad import Context, Device, Tensor, dtypes
from fusegrad.codegen.opt import Opt, hand_coded_opts
from fusegrad.engine import realize
from fusegrad.ir.ops import Ops
from fusegrad.ir.pattern import graph_rewrite
from fusegrad.ir.symbolic import pm_symbolic

CPU = Device["CPU"].renderer
rng = np.random.default_rng(7)


def ranges_of(t: Tensor) -> dict[int, tuple[int, str]]:
    """range id -> (size, kind) of the last kernel of t's schedule."""
    ast = graph_rewrite(t.schedule()[-1].ast, pm_symbolic)
    return {n.arg[0]: (int(n.src[0].arg), n.arg[1]) for n in ast.toposort() if n.op is Ops.RANGE}


def run_forced(monkeypatch, make, opts):
    """Realize make() with `opts` applied to its last kernel (instead of the heuristic)."""
    realize._programs.clear()
    target = make().schedule()[-1].ast
    orig = codegen.to_program  # the engine imports it at call time, with the kernel AST the schedule made
    monkeypatch.setattr(codegen, "to_program", lambda ast, ren, o=None: orig(ast, ren, opts if ast is target else o))
    with Context(CACHELEVEL=0):  # no program cache: it would hand back the heuristic's program (or keep ours)
        out = make().numpy()
    monkeypatch.undo()
    realize._programs.clear()
    return out


A = rng.standard_normal((32, 48)).astype(np.float32)
B = rng.standard_normal((48, 64)).astype(np.float32)
X = rng.standard_normal((2, 3, 12, 16)).astype(np.float32)
W = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)

R = rng.standard_normal((8, 16)).astype(np.float32)
RS = rng.uniform(0.5, 2.0, (8, 1)).astype(np.float32)
RW = rng.standard_normal((1, 16)).astype(np.float32)


def rotate_half(x):  # RoPE's (-x2, x1): each half of the last axis is a pad of the other's values (gated loads)
    return x[:, 8:].neg().cat(x[:, :8], dim=1) if isinstance(x, Tensor) else np.concatenate([-x[:, 8:], x[:, :8]], 1)


S = np.array([np.nan, np.inf, -np.inf, 0, -0.0, 128, -126, -149, -149.5, -150, -151, 127.99, 3.3, -7.25, 0.5, 1e-3] * 4,
             np.float32).reshape(4, 16)

CASES = {
    "exp2_specials": (lambda: Tensor(S).exp2(), lambda: np.exp2(S)),
    # name: (make, reference, which range to vectorize (by role), extra opts)
    "matmul_out": (lambda: Tensor(A) @ Tensor(B), lambda: A @ B),
    "matmul_bT_reduce": (lambda: Tensor(A) @ Tensor(B.T.copy()).T, lambda: A @ B),
    "sum_rows": (lambda: Tensor(A).sum(1), lambda: A.sum(1)),
    "sum_cols": (lambda: Tensor(A).sum(0), lambda: A.sum(0)),
    "max_rows": (lambda: Tensor(A).max(1), lambda: A.max(1)),
    "relu_epilogue": (lambda: (Tensor(A) @ Tensor(B) - 0.5).relu(), lambda: np.maximum(A @ B - 0.5, 0)),
    "layernorm": (lambda: Tensor(A).layernorm(), lambda: (A - A.mean(1, keepdims=True)) / np.sqrt(A.var(1, keepdims=True) + 1e-5)),
    "where_exp": (lambda: (Tensor(A) @ Tensor(B)).exp2().minimum(3.0).sqrt(), lambda: np.sqrt(np.minimum(np.exp2(A @ B), 3.0))),
    "conv_pad": (lambda: Tensor(X).conv2d(Tensor(W), padding=1), None),
    # the halves' gates are the same in all 8 lanes of a half (r*8 + l < 8 is r < 1), so the row's scalar read under the
    # gate is one load for all lanes: it must be broadcast to them, not put in lane 0 only (`(float_x8){v}`)
    "rotate_half_scaled_sum": (lambda: (rotate_half(Tensor(R) / Tensor(RS).sqrt()) * Tensor(RW)).sum(1),
                               lambda: (rotate_half(R / np.sqrt(RS)) * RW).sum(1)),
    "int_sum": (lambda: Tensor((A * 10).astype(np.int32)).sum(1), lambda: (A * 10).astype(np.int32).sum(1)),
}


def conv_ref():
    import torch
    return torch.nn.functional.conv2d(torch.tensor(X), torch.tensor(W), padding=1).numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_every_range_vectorizes_correctly(monkeypatch, name):
    """Force VECTORIZE on each range in turn (at every width that divides it), with and without an upcast after it."""
    make, ref = CASES[name]
    expect = conv_ref() if ref is None else ref()
    tried = 0
    for rid, (size, kind) in ranges_of(make()).items():
        for w in (4, 8, 16):
            if size % w: continue
            for extra in ([], [Opt("UPCAST", g, 2) for g, (s, k) in ranges_of(make()).items()
                               if k == "global" and g != rid and s % 2 == 0][:1]):
                got = run_forced(monkeypatch, make, [Opt("VECTORIZE", rid, w)] + extra)
                np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4, err_msg=f"{name} range {rid} w {w} {extra}")
                tried += 1
    assert tried > 0


def _opts(t: Tensor):
    return hand_coded_opts(graph_rewrite(t.schedule()[-1].ast, pm_symbolic), CPU)


def test_heuristic_vectorizes_the_contiguous_axis():
    rids = ranges_of(Tensor(A) @ Tensor(B))
    opts = _opts(Tensor(A) @ Tensor(B))  # b and the output are contiguous along the output column axis
    vec = [o for o in opts if o.op == "VECTORIZE"]
    if CPU.simd_bytes == 0: return
    assert len(vec) == 1 and rids[vec[0].axis][1] == "global" and rids[vec[0].axis][0] == 64
    opts = _opts(Tensor(A) @ Tensor(B.T.copy()).T)  # both inputs are contiguous along the reduce axis: dot products
    vec = [o for o in opts if o.op == "VECTORIZE"]
    assert len(vec) == 1 and ranges_of(Tensor(A) @ Tensor(B.T.copy()).T)[vec[0].axis][1] == "reduce"


def test_vector_source_uses_vector_types():
    if CPU.simd_bytes == 0: pytest.skip("the CPU renderer reports no SIMD width on this machine")
    from fusegrad.codegen import to_program
    (si,) = (Tensor(A) @ Tensor(B)).schedule()
    src = to_program(si.ast, CPU).src
    assert "__attribute__((vector_size(" in src and "_x" in src


def test_python_backend_never_vectorizes():
    assert Device["PYTHON"].renderer.simd_bytes == 0
    t = Tensor(A, device="PYTHON") @ Tensor(B, device="PYTHON")
    assert not any(o.op == "VECTORIZE" for o in hand_coded_opts(graph_rewrite(t.schedule()[-1].ast, pm_symbolic),
                                                                 Device["PYTHON"].renderer))


def test_bad_vectorize_width():
    (si,) = Tensor(A).sum(1).schedule()
    from fusegrad.codegen import to_program
    red = next(n for n in graph_rewrite(si.ast, pm_symbolic).toposort() if n.op is Ops.RANGE and n.arg[1] == "reduce")
    with pytest.raises(ValueError, match="power of two"): to_program(si.ast, CPU, [Opt("VECTORIZE", red.arg[0], 3)])
    with pytest.raises(ValueError, match="must divide"): to_program(si.ast, CPU, [Opt("VECTORIZE", red.arg[0], 32)])


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
def test_half_kernels_vectorize(dt):
    """16-bit float reduce kernels vectorize like float32 ones (the renderer converts whole vectors at the loads and
    the store) and still sum in float32."""
    a = Tensor(A).cast(dt).realize()
    t = (a @ Tensor(B).cast(dt)).cast(dtypes.float32)
    assert "float_x" in codegen.to_program((a @ Tensor(B).cast(dt)).schedule()[-1].ast, CPU).src
    ref = (Tensor(A).cast(dt).cast(dtypes.float32) @ Tensor(B).cast(dt).cast(dtypes.float32)).numpy()
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-2, atol=5e-2)


@pytest.mark.parametrize("name", list(CASES))
def test_forced_opts_reach_the_kernel(monkeypatch, name):
    """The harness above really compiles with the given opts (an invalid one must raise) for every case."""
    with pytest.raises(ValueError, match="no range"):
        run_forced(monkeypatch, CASES[name][0], [Opt("VECTORIZE", 99, 4)])


@pytest.mark.parametrize("name", ["matmul_out", "conv_pad", "relu_epilogue"])
def test_swap_loop_order(monkeypatch, name):
    """SWAP changes only the loop nest: every pair of output ranges swapped (with a vector and an upcast too)."""
    make, ref = CASES[name]
    expect = conv_ref() if ref is None else ref()
    rids = ranges_of(make())
    glob = [r for r, (s, k) in rids.items() if k == "global"]
    assert len(glob) >= 2
    for a, b in zip(glob, glob[1:]):
        got = run_forced(monkeypatch, make, [Opt("SWAP", a, b)])
        np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4, err_msg=f"swap {a} {b}")
    with pytest.raises(ValueError, match="two different output ranges"):
        run_forced(monkeypatch, make, [Opt("SWAP", glob[0], glob[0])])


def test_vector_where_on_broadcast_scalar_condition():
    # a per-row condition broadcast across a vectorized axis: GCC 12 (-O2 -march=native, AVX-512) miscompiled the
    # lane-wise ternary (lanes 1.. read the condition as false); the renderer now blends on an explicit mask
    m = 12
    xn = np.random.default_rng(3).standard_normal((m, m)).astype(np.float32)
    x = Tensor(xn)
    vn = x.square().sum(-1, keepdim=True)
    v = (vn > 1e-30).where(x / vn.sqrt(), 0.0)
    out = ((Tensor.eye(m).expand((m, m)) * v.unsqueeze(-2)).sum(-1, keepdim=True) * v.unsqueeze(-2)).numpy()
    vv = xn / np.sqrt((xn.astype(np.float64) ** 2).sum(-1, keepdims=True))
    np.testing.assert_allclose(out, vv[:, :, None] * vv[:, None, :], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts", [
    [Opt("TILE", 0, 4)],
    [Opt("VECTORIZE", 1, 16), Opt("UPCAST", 0, 4), Opt("TILE", 0, 2)],
    [Opt("UPCAST", 0, 2), Opt("TILE", 0, 8), Opt("TILE", 1, 4)],
], ids=str)
def test_tile_cache_blocking_matches_numpy(monkeypatch, opts):
    # TILE(r, k): r -> an outer loop in r's place and an inner loop of k innermost among the output loops
    out = run_forced(monkeypatch, lambda: Tensor(A) @ Tensor(B), opts)
    np.testing.assert_allclose(out, A @ B, rtol=1e-5, atol=1e-5)


def test_tile_errors_and_heuristic():
    from fusegrad.codegen.opt import apply_opt
    ast = (Tensor(A) @ Tensor(B)).schedule()[-1].ast
    with pytest.raises(ValueError, match="TILE needs an output range"):
        apply_opt(ast, Opt("TILE", 2, 4))
    with pytest.raises(ValueError, match="must divide"):   # (5 < 32 would clamp its last block: a remainder)
        apply_opt(ast, Opt("TILE", 0, 40))
    # the heuristic tiles the outermost loop when the input it re-reads in full doesn't fit the cache
    ast = (Tensor(rng.standard_normal((64, 256)).astype(np.float32)) @ Tensor(rng.standard_normal((256, 64)).astype(np.float32))).schedule()[-1].ast
    r = type(CPU)()
    r.simd_bytes, r.threads, r.cache_bytes = CPU.simd_bytes, 2, 1 << 30
    assert not any(o.op == "TILE" for o in hand_coded_opts(ast, r))
    r.cache_bytes = 4096   # B is 64 KB
    assert any(o.op == "TILE" and o.axis == 0 for o in hand_coded_opts(ast, r))


@pytest.mark.parametrize("shape", [((256, 520), (520, 72)), ((96, 264), (264, 40)), ((256, 256), (256, 64)),
                                   ((1, 512), (512, 264)), ((264, 512), (512, 1)), ((8, 64, 256), (8, 256, 48)),
                                   "transposed", "int32", "float16"], ids=str)
def test_tiled_matmul_small_cache_matches_numpy(monkeypatch, shape):
    # a 32 KB cache makes the heuristic TILE small shapes (the first three, int and half): odd sizes, non-multiples of
    # the register tile, an odd tile count; next to them 1xN, Nx1, batched and transposed matmuls
    monkeypatch.setattr(Device["CPU"].renderer, "cache_bytes", 32768)
    sa, sb = {"int32": ((256, 384), (384, 80)), "float16": ((120, 384), (384, 80))}.get(shape, ((248, 384), (384, 80))) \
        if isinstance(shape, str) else shape
    dt = {"int32": np.int32, "float16": np.float16}.get(shape if isinstance(shape, str) else "", np.float32)
    an = rng.integers(-8, 8, sa).astype(dt) if dt is np.int32 else rng.standard_normal(sa).astype(dt)
    bn = rng.integers(-8, 8, sb).astype(dt) if dt is np.int32 else rng.standard_normal(sb).astype(dt)
    with Context(CACHELEVEL=0):
        a, b = (Tensor(an.T.copy()).T, Tensor(bn.T.copy()).T) if shape == "transposed" else (Tensor(an), Tensor(bn))
        out = (a @ b).numpy()
    ref = an.astype(np.float64) @ bn.astype(np.float64)
    tol = 2e-2 if dt is np.float16 else 1e-4
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol * 8)


@settings(max_examples=30, deadline=None)
@given(n=st.sampled_from([8, 16, 24, 32]), data=st.data())
def test_gated_row_scalars_vectorize_at_every_width(n, data):
    """A rotation or a pad of the last axis of x / sqrt(s) (s one scalar per row, read under the pad's gate), times a
    weight row, summed or not, with VECTORIZE forced on each range at every width that divides it: a gate can be the
    same in all lanes at one width (a scalar load, to be broadcast) and differ between lanes at another. Against
    NumPy."""
    seed, a = data.draw(st.integers(0, 2**16)), data.draw(st.integers(1, n - 1))
    rotate, reduce = data.draw(st.booleans()), data.draw(st.booleans())
    lo = 0 if rotate else data.draw(st.integers(0, n - a))
    r = np.random.default_rng(seed)
    x, s, w = (r.standard_normal((4, n)).astype(np.float32), r.uniform(0.5, 2.0, (4, 1)).astype(np.float32),
               r.standard_normal((1, n)).astype(np.float32))

    def make():
        y = Tensor(x) / Tensor(s).sqrt()
        z = y[:, a:].neg().cat(y[:, :a], dim=1) if rotate else y[:, :a].pad(((0, 0), (lo, n - a - lo)))
        out = z * Tensor(w)
        return out.sum(1) if reduce else out
    y = x / np.sqrt(s)
    z = np.concatenate([-y[:, a:], y[:, :a]], 1) if rotate else np.pad(y[:, :a], ((0, 0), (lo, n - a - lo)))
    expect = (z * w).sum(1) if reduce else z * w
    with pytest.MonkeyPatch.context() as mp:
        for rid, (size, _) in ranges_of(make()).items():
            for width in (4, 8, 16):
                if size % width == 0:
                    got = run_forced(mp, make, [Opt("VECTORIZE", rid, width)])
                    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5, err_msg=f"range {rid} width {width}")
