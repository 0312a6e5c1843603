"""matmul / @ / dot against torch.matmul, with gradients: 2-D, vector cases, batched and broadcast batches,
non-contiguous operands, int operands, empty and size-1 dimensions."""
import numpy as np

from fusegrad import Tensor
import pytest
import torch

from .helpers import DEVICES, check_op

SHAPES = [((3, 4), (4, 5)), ((1, 4), (4, 1)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (2, 4, 5)),
          ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((1, 3, 4), (2, 4, 5)),
          ((4,), (2, 4, 5)), ((2, 3, 4), (4,)), ((5, 1), (1, 6)), ((16, 32), (32, 8))]


@pytest.mark.parametrize("a,b", SHAPES, ids=str)
def test_matmul(a, b):
    check_op([a, b], lambda x, y: x @ y, atol=1e-5, grad_atol=1e-4)


@pytest.mark.parametrize("a,b", [((3, 4), (4, 5)), ((4,), (4, 2)), ((2, 3, 4), (4,)), ((4,), (4,))], ids=str)
def test_matmul_method_and_dot(a, b):
    check_op([a, b], torch.matmul, lambda x, y: x.matmul(y), atol=1e-5)
    check_op([a, b], torch.matmul, lambda x, y: x.dot(y), atol=1e-5)


def test_matmul_reverse_flag():
    check_op([(4, 5), (3, 4)], lambda x, y: y @ x, lambda x, y: x.matmul(y, reverse=True), atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a,b", [((2, 3), (3, 2)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 2, 2), (2, 2))], ids=str)
def test_matmul_small(a, b, device):
    check_op([a, b], lambda x, y: x @ y, device=device, atol=1e-5)


@pytest.mark.parametrize("name,fn", [
    ("aT@b", lambda x, y: x.T @ y), ("a@bT", lambda x, y: x @ y.T), ("aT@bT", lambda x, y: x.T @ y.T),
    ("flip", lambda x, y: x.flip(0) @ y.flip(1)), ("slice", lambda x, y: x[:, 1:] @ y[1:, ::2]),
])
def test_matmul_noncontiguous(name, fn):
    check_op([(4, 4), (4, 4)], fn, atol=1e-5)


def test_matmul_expanded_operand():
    check_op([(1, 4), (4, 3)], lambda x, y: x.expand(5, 4) @ y, atol=1e-5)


def test_matmul_same_operand():
    check_op([(4, 4)], lambda x: x @ x, atol=1e-5)
    check_op([(3, 4)], lambda x: x @ x.T, atol=1e-5)


def test_matmul_chain_and_mlp():
    check_op([(2, 4), (4, 8), (8,), (8, 3)], lambda x, w1, b1, w2: ((x @ w1 + b1).relu() @ w2).sum(-1), atol=1e-5)


def test_matmul_int():
    rng = np.random.default_rng(0)
    a, b = rng.integers(-5, 5, (3, 4)).astype(np.int32), rng.integers(-5, 5, (4, 2)).astype(np.int32)
    check_op(None, lambda x, y: x @ y, vals=[a, b])


def test_matmul_mixed_dtype():
    # torch.matmul needs equal dtypes; fusegrad promotes, so compare with the promoted torch product
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.linspace(-1, 1, 8).astype(np.float32).reshape(4, 2)
    check_op(None, lambda x, y: x.float() @ y, lambda x, y: x @ y, vals=[a, b], atol=1e-5)


def test_matmul_float64():
    check_op([(3, 4), (4, 2)], lambda x, y: x @ y, dtype=np.float64, atol=1e-12, rtol=1e-10, grad_atol=1e-12,
             grad_rtol=1e-10)


@pytest.mark.parametrize("a,b", [((0, 4), (4, 3)), ((3, 4), (4, 0)), ((2, 0, 4), (4, 3))], ids=str)
def test_matmul_empty_output(a, b):
    check_op([a, b], lambda x, y: x @ y)


def test_matmul_empty_inner_dim():
    # an empty contraction is a sum over nothing: zeros
    check_op([(3, 0), (0, 4)], lambda x, y: x @ y)


def test_matmul_large_values():
    # products that overflow: unfused math gives inf + -inf = nan (torch's small-matmul path); a fused multiply-add,
    # which our float reduce kernels use like BLAS does, keeps the exact product and may give -inf. Both are non-finite.
    x, y = np.array([[1e20, 1e20]], np.float32), np.array([[1e20], [-1e20]], np.float32)
    assert not np.isfinite((Tensor(x) @ Tensor(y)).numpy()).any()
    # large but finite products, exact in float32 (powers of two), so every summation order and FMA agree exactly.
    # (1e20 * 1e19 overflows: torch gave inf or nan depending on the machine's matmul path)
    check_op(None, lambda x, y: x @ y, vals=[np.array([[2.0**60, 2.0**59, 3.0]], np.float32),
                                             np.array([[2.0**60], [-2.0**61], [2.0**100]], np.float32)],
             forward_only=True)
    check_op(None, lambda x, y: x @ y, vals=[np.array([[np.nan, 1.0]], np.float32), np.array([[0.0], [2.0]],
                                                                                              np.float32)],
             forward_only=True)


def test_matmul_of_merged_heads_reads_a_contiguous_copy():
    # attention's `ctx.transpose(1, 2).reshape(B, T, H) @ Wo`: the reduce axis merges heads that the transpose
    # separated in memory. The operand is made contiguous first; the copy is the store of the kernel computing ctx
    # (no extra kernel), and the values and gradients stay torch's
    from fusegrad import GlobalCounters
    from fusegrad.mixin.reduce import merges_permuted
    rng = np.random.default_rng(0)
    att, v, wo = (rng.standard_normal(s, dtype=np.float32) for s in ((2, 3, 5, 5), (2, 3, 5, 4), (12, 7)))
    ta, tv, tw = (torch.tensor(a, requires_grad=True) for a in (att, v, wo))
    fa, fv, fw = (Tensor(a, requires_grad=True) for a in (att, v, wo))
    ctx = (fa @ fv).transpose(1, 2).reshape(2, 5, 12)
    assert merges_permuted(ctx.uop)
    GlobalCounters.reset()
    out = (ctx @ fw).realize()
    assert GlobalCounters.kernel_count == 2
    ref = ((ta @ tv).transpose(1, 2).reshape(2, 5, 12) @ tw)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    for f, t in ((fa, ta), (fv, tv), (fw, tw)):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)
    x = Tensor(rng.standard_normal((2, 3, 4), dtype=np.float32))
    assert not merges_permuted(x.reshape(2, 12).uop) and not merges_permuted(x.permute(2, 0, 1).reshape(4, 6).uop)
    assert merges_permuted(x.permute(1, 0, 2).reshape(3, 8).uop)   # (2, 4) of (2, 3, 4): strides 12 and 1
    # an axis of size 1 between the merged ones moves nothing: (B, H, 1, D) read as (B, 1, H * D), a decode step's
    y = Tensor(rng.standard_normal((2, 3, 1, 4), dtype=np.float32))
    assert not merges_permuted(y.permute(0, 2, 1, 3).reshape(2, 1, 12).uop)
    assert merges_permuted(Tensor.empty(2, 3, 5, 4).permute(0, 2, 1, 3).reshape(2, 5, 12).uop)


def test_matmul_transposed_weight_reads_a_row_major_copy():
    # `x @ w.T` (a Linear layer) with >= 64 rows of x: the realized w is copied row-major first (a relayout, computed
    # once while w is unwritten), so the matmul kernel reads it like `x @ b`; values and gradients stay torch's
    from fusegrad import GlobalCounters
    from fusegrad.codegen.opt import hand_coded_opts
    from fusegrad.ir.pattern import graph_rewrite
    from fusegrad.ir.symbolic import pm_symbolic
    from fusegrad.mixin.reduce import TRANSPOSED_WEIGHT_ROWS
    rng = np.random.default_rng(1)
    xn, wn = rng.standard_normal((TRANSPOSED_WEIGHT_ROWS, 48), dtype=np.float32), rng.standard_normal((32, 48),
                                                                                                   dtype=np.float32)
    w = Tensor(wn).realize()
    x = Tensor(xn, requires_grad=True).realize()
    items = (x @ w.T).schedule()
    assert len(items) == 2 and "REDUCE_AXIS(ADD)" not in items[0].tensor_ops   # the copy, then the matmul
    GlobalCounters.reset()
    np.testing.assert_allclose((x @ w.T).numpy(), xn @ wn.T, rtol=1e-5, atol=1e-5)
    assert GlobalCounters.kernel_count == 2
    GlobalCounters.reset()
    np.testing.assert_allclose((x @ w.T).numpy(), xn @ wn.T, rtol=1e-5, atol=1e-5)
    assert GlobalCounters.kernel_count == 1   # the copy is reused while w is unwritten
    # the matmul kernel vectorizes an output axis (outer products), not the reduce axis (dot products)
    ast = graph_rewrite(items[-1].ast, pm_symbolic)
    rngs = {n.arg[0]: n.arg[1] for n in ast.toposort() if n.op.name == "RANGE"}
    from fusegrad import Device
    vec = [o for o in hand_coded_opts(ast, Device["CPU"].renderer) if o.op == "VECTORIZE"]
    assert all(rngs[o.axis] != "reduce" for o in vec)
    # fewer rows, a computed b (X @ X.T), or a transposed x: no copy
    assert len((Tensor(xn[:TRANSPOSED_WEIGHT_ROWS - 1]) @ w.T).schedule()) == 1
    assert len((Tensor(xn).realize() @ (w * 2).T).schedule()) == 1
    assert len((Tensor(xn.T.copy()).realize().T @ w.T).schedule()) == 1
    # no gradient flowing into w (inference): the copy starts at fewer rows; with one, at TRANSPOSED_WEIGHT_ROWS
    # (a weight of at least TRANSPOSED_WEIGHT_MIN_ELEMENTS; a smaller one waits for TRANSPOSED_WEIGHT_ROWS rows)
    from fusegrad.mixin.reduce import TRANSPOSED_WEIGHT_MIN_ELEMENTS as ME, TRANSPOSED_WEIGHT_ROWS_NO_GRAD as NG
    bn, xb = rng.standard_normal((ME // 128, 128), dtype=np.float32), rng.standard_normal((NG, 128), dtype=np.float32)
    assert len((Tensor(xb) @ Tensor(bn).realize().T).schedule()) == 2
    np.testing.assert_allclose((Tensor(xb) @ Tensor(bn).realize().T).numpy(), xb @ bn.T, rtol=1e-4, atol=1e-4)
    assert len((Tensor(xb[:NG - 1]) @ Tensor(bn).realize().T).schedule()) == 1
    assert len((Tensor(xb) @ Tensor(bn, requires_grad=True).realize().T).schedule()) == 1
    assert len((Tensor(xn[:NG]) @ Tensor(wn.copy()).realize().T).schedule()) == 1   # a small weight
    # a weight with one row or column: its .T is only a reshape, so no copy (a Linear(48, 1) or Linear(1, 32))
    assert len((Tensor(xn).realize() @ Tensor(wn[:1]).realize().T).schedule()) == 1
    assert len((Tensor(xn[:, :1].copy()).realize() @ Tensor(wn[:, :1].copy()).realize().T).schedule()) == 1
    # gradients
    tw, tx = torch.tensor(wn, requires_grad=True), torch.tensor(xn, requires_grad=True)
    fw = Tensor(wn, requires_grad=True).realize()
    (x @ fw.T).square().sum().backward()
    (tx @ tw.T).square().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(fw.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_matmul_large_weight_reads_column_panels():
    # a large realized float32 weight (>= PANEL_MIN_ELEMENTS) on the CPU, no gradient into it: the matmul reads a
    # (N / P, K, P) copy (P = panel_columns: two vectors; a relayout, made once while the weight is unwritten); values
    # equal NumPy's
    from fusegrad import GlobalCounters
    from fusegrad.mixin.reduce import PANEL_MIN_ELEMENTS, TRANSPOSED_WEIGHT_ROWS, panel_columns
    rng = np.random.default_rng(2)
    k, n = 1024, PANEL_MIN_ELEMENTS // 1024
    wn = rng.standard_normal((k, n), dtype=np.float32)
    w = Tensor(wn).realize()
    for lead in [(TRANSPOSED_WEIGHT_ROWS,), (3, 40), (2, 1, 33)]:
        xn = rng.standard_normal(lead + (k,), dtype=np.float32)
        x = Tensor(xn).realize()
        np.testing.assert_allclose((x @ w).numpy(), xn @ wn, rtol=1e-4, atol=1e-3)
        GlobalCounters.reset()
        np.testing.assert_allclose((x @ w).numpy(), xn @ wn, rtol=1e-4, atol=1e-3)
        assert GlobalCounters.kernel_count == 1   # the panel copy is reused
    x = Tensor(rng.standard_normal((TRANSPOSED_WEIGHT_ROWS, k), dtype=np.float32)).realize()
    fresh = Tensor(wn.copy()).realize()
    assert len((x @ fresh).schedule()) == 2   # the copy, then the matmul reading panels
    # a Linear layout (x @ b.T) copies b.T straight into panels; int dtypes, a gradient into w, few rows: no panels
    bn = rng.standard_normal((n, k), dtype=np.float32)
    np.testing.assert_allclose((x @ Tensor(bn).realize().T).numpy(), x.numpy() @ bn.T, rtol=1e-4, atol=1e-3)
    assert len((x @ Tensor(bn).realize().T).schedule()) == 2
    wg = Tensor(wn, requires_grad=True).realize()
    assert len((x @ wg).schedule()) == 1
    from fusegrad.mixin.reduce import TRANSPOSED_WEIGHT_ROWS_NO_GRAD
    few_rows = Tensor(xn[..., :k].reshape(-1, k)[:TRANSPOSED_WEIGHT_ROWS_NO_GRAD - 1].copy()).realize()
    assert len((few_rows @ fresh).schedule()) == 1   # (16-63 rows: one-vector panels, see the skinny test below)
    assert len((Tensor(np.ones((TRANSPOSED_WEIGHT_ROWS, k), np.int32)).realize() @
                Tensor(np.ones((k, n), np.int32)).realize()).schedule()) == 1
    Tensor.no_grad = True
    try: assert len((x @ Tensor(wn, requires_grad=True).realize()).schedule()) == 2   # no gradient flows: panels
    finally: Tensor.no_grad = False
    assert n % panel_columns("CPU") == 0


def test_column_panels_are_two_vectors_wide():
    # the panels are the register tile's width, two of the machine's vectors (16 floats on AVX2, 32 on AVX-512), so
    # the tile reads one sequential stream; odd row counts (the tile's clamped last trip) and a K no unroll divides
    # stay exact (integer-valued inputs)
    from fusegrad import GlobalCounters
    from fusegrad.codegen import to_program
    from fusegrad.device import Device
    from fusegrad.mixin.reduce import PANEL, panel_columns
    lanes = Device["CPU"].renderer.simd_bytes // 4
    p = panel_columns("CPU")
    assert p == (2 * lanes if lanes >= 4 else PANEL)
    rng = np.random.default_rng(5)
    k, n = 1027, 1056   # 1056 = 33 x 32 = 66 x 16
    wn = rng.integers(-4, 5, (k, n)).astype(np.float32)
    w = Tensor(wn).realize()
    for m in (64, 77, 1001):
        xn = rng.integers(-4, 5, (m, k)).astype(np.float32)
        x = Tensor(xn).realize()
        sched = (x @ w).schedule()
        # the panel copy (made once), the product reading (n/p, k, p) panels
        assert len(sched) == (2 if m == 64 else 1)
        assert to_program(sched[-1].ast, Device["CPU"].renderer).name == f"r_{m}_{n // p}_{p}_{k}"
        np.testing.assert_array_equal((x @ w).numpy(), xn @ wn)
        GlobalCounters.reset()
        np.testing.assert_array_equal((x @ w).numpy(), xn @ wn)
        assert GlobalCounters.kernel_count == 1   # the panel copy is kept


def test_skinny_product_reads_one_vector_panels():
    # 16-63 rows of x (MiniLM's 2 x 13 tokens) against a float32 weight over a quarter of the L2, no gradient into it:
    # the weight is read as (N / lanes, K, lanes) panels, one vector of the target wide (a relayout made once), and a
    # bias added to the product splits the kernel's column loop back into panels (codegen/merge.py split_ranges);
    # values equal NumPy's (integer-valued: exact) and torch's GELU
    import torch
    from fusegrad import GlobalCounters
    from fusegrad.codegen import to_program
    from fusegrad.device import Device
    from fusegrad.mixin.reduce import TRANSPOSED_WEIGHT_ROWS_NO_GRAD
    ren = Device["CPU"].renderer
    lanes = ren.simd_bytes // 4
    if lanes < 4 or 384 * 1536 * 4 <= ren.cache_bytes // 4: pytest.skip("no vectors, or a large L2")
    rng = np.random.default_rng(3)
    wn = rng.integers(-4, 5, (1536, 384)).astype(np.float32)
    bn = rng.integers(-4, 5, 1536).astype(np.float32)
    w, b = Tensor(wn).realize(), Tensor(bn).realize()
    xn = rng.integers(-4, 5, (2, 13, 384)).astype(np.float32)
    x = Tensor(xn).realize()
    items = x.linear(w.T, b).schedule()
    assert len(items) == 2 and to_program(items[-1].ast, ren).name == f"r_26_{1536 // lanes}_{lanes}_384"
    np.testing.assert_array_equal(x.linear(w.T, b).numpy(), xn @ wn.T + bn)
    GlobalCounters.reset()
    np.testing.assert_array_equal(x.linear(w.T, b).numpy(), xn @ wn.T + bn)
    assert GlobalCounters.kernel_count == 1   # the panel copy is reused
    xf = rng.standard_normal((26, 384), dtype=np.float32)
    wf = (rng.standard_normal((1536, 384), dtype=np.float32) * 0.05)
    got = Tensor(xf).linear(Tensor(wf).realize().T, b).gelu().numpy()
    want = torch.nn.functional.gelu(torch.from_numpy(xf @ wf.T + bn), approximate="tanh").numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # a gradient into x (none into w) flows through the panel product: torch's
    xg = Tensor(xf, requires_grad=True)
    wt = Tensor(wf).realize()
    (xg.linear(wt.T, b).gelu() * Tensor(xf @ wf.T)).sum().backward()
    tx = torch.tensor(xf, requires_grad=True)
    (torch.nn.functional.gelu(tx @ torch.from_numpy(wf).T + torch.from_numpy(bn), approximate="tanh") *
     torch.from_numpy(xf @ wf.T)).sum().backward()
    np.testing.assert_allclose(xg.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    # the other side of each bound: few rows, a small weight, a gradient into w read w as before
    few = Tensor(xn.reshape(26, 384)[:TRANSPOSED_WEIGHT_ROWS_NO_GRAD - 1].copy()).realize()
    assert len(few.linear(w.T).schedule()) == 1
    small = Tensor(wn[:256, :256].copy()).realize()   # 256 KB: not over a quarter of a 2 MB L2
    if 256 * 256 * 4 <= ren.cache_bytes // 4:
        assert to_program(Tensor(xn[..., :256].copy()).linear(small.T).schedule()[-1].ast, ren).name == "r_26_256_256"
    wg = Tensor(wn, requires_grad=True).realize()
    assert to_program(x.linear(wg.T).schedule()[-1].ast, ren).name == "r_26_1536_384"


def test_large_linear_with_a_bias_vectorizes_its_panels():
    # x @ w.T + b with a column-panel weight (>= TRANSPOSED_WEIGHT_ROWS rows, >= PANEL_MIN_ELEMENTS elements): the
    # bias made the kernel loop over the N columns of the sum and read the panels with j // 32 and j % 32, which the
    # heuristic left scalar (128 x 1024 @ 1024 x 1024: 14 ms, one core); the loop splits into panels and vectorizes
    # (2 ms). Values equal NumPy's (integer-valued: exact)
    from fusegrad.codegen import to_program
    from fusegrad.device import Device
    from fusegrad.mixin.reduce import PANEL_MIN_ELEMENTS, TRANSPOSED_WEIGHT_ROWS, panel_columns
    rng = np.random.default_rng(4)
    k = n = int(PANEL_MIN_ELEMENTS ** 0.5)
    wn, bn = rng.integers(-4, 5, (n, k)).astype(np.float32), rng.integers(-4, 5, n).astype(np.float32)
    xn = rng.integers(-4, 5, (TRANSPOSED_WEIGHT_ROWS, k)).astype(np.float32)
    w, b, x = Tensor(wn).realize(), Tensor(bn).realize(), Tensor(xn).realize()
    spec = to_program(x.linear(w.T, b).schedule()[-1].ast, Device["CPU"].renderer)
    p = panel_columns("CPU")
    assert spec.name == f"r_{TRANSPOSED_WEIGHT_ROWS}_{n // p}_{p}_{k}"
    if Device["CPU"].renderer.simd_bytes: assert "float_x" in spec.src   # vectorized
    np.testing.assert_array_equal(x.linear(w.T, b).numpy(), xn @ wn.T + bn)
