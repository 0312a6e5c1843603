"""Linear algebra against torch.linalg: svd (shapes and dtypes for full_matrices True/False, singular values,
reconstruction, orthonormal factors, edge cases, errors, gradients) and qr regressions.

Singular vectors are unique only up to sign (and up to a rotation within a repeated singular value), so U and Vh are
checked by what defines them: U @ diag(S) @ Vh == A, U^T U == I, Vh Vh^T == I. S is compared with torch within a
tolerance that scales with the largest singular value. Matrices are small (at most 16x12) to keep the file fast."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor
from fusegrad.dtype import dtypes


def rand(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-2, 2, size=shape).astype(dtype)


def with_singular_values(s, m, n, seed=0):
    """An (m, n) float64 matrix with the given singular values (len(s) == min(m, n)) and random singular vectors."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u[:, :len(s)] * np.asarray(s, np.float64)) @ v[:, :len(s)].T


def assert_within(err, bound, what):
    bound = np.broadcast_to(bound, err.shape)
    assert np.all(err <= bound), f"{what}: worst error {err.max():.3g}, allowed {bound[err > bound].min():.3g}"


def check_svd(a, full_matrices=True, device="CPU"):
    """fusegrad's svd of `a` against torch's: shapes, dtype, S (descending, close to torch's), the reconstruction
    and the orthonormality of U and Vh. Tolerance: 8 eps max(M, N), times each matrix's largest singular value for
    S and the reconstruction."""
    U, S, Vh = Tensor(a, device=device).svd(full_matrices=full_matrices)
    tu, ts, tvh = torch.linalg.svd(torch.tensor(a), full_matrices=full_matrices)
    assert (U.shape, S.shape, Vh.shape) == (tuple(tu.shape), tuple(ts.shape), tuple(tvh.shape))
    assert U.dtype == S.dtype == Vh.dtype == Tensor(a).dtype
    u, s, vh = (x.numpy().astype(np.float64) for x in (U, S, Vh))
    m, n = a.shape[-2:]
    k = min(m, n)
    tol = 8 * np.finfo(a.dtype).eps * max(m, n)
    smax = ts.numpy()[..., :1].astype(np.float64)                           # (..., 1): per matrix
    assert_within(np.abs(s - ts.numpy()), tol * smax, "S differs from torch")
    assert np.all(np.diff(s, axis=-1) <= 0) and np.all(s >= 0), f"S is not descending and >= 0: {s}"
    rec = (u[..., :k] * s[..., None, :]) @ vh[..., :k, :]
    assert_within(np.abs(rec - a), tol * smax[..., None], "U diag(S) Vh != A")
    np.testing.assert_allclose(np.swapaxes(u, -1, -2) @ u - np.eye(u.shape[-1]), 0, atol=tol, err_msg="U^T U != I")
    np.testing.assert_allclose(vh @ np.swapaxes(vh, -1, -2) - np.eye(vh.shape[-2]), 0, atol=tol, err_msg="Vh Vh^T != I")
    return u, s, vh


# ----- values and conventions -----
# few distinct shapes: each (batch, tall orientation, dtype) compiles its own kernels once

@pytest.mark.parametrize("shape,full_matrices", [
    ((5, 3), True), ((5, 3), False), ((3, 5), True), ((4, 4), True), ((16, 12), True),
], ids=str)
def test_svd(shape, full_matrices):
    check_svd(rand(shape, seed=sum(shape)), full_matrices)


@pytest.mark.parametrize("shape,full_matrices", [((5, 3), True), ((3, 5), False)], ids=str)
def test_svd_float64(shape, full_matrices):
    check_svd(rand(shape, seed=3, dtype=np.float64), full_matrices)


@pytest.mark.parametrize("shape,full_matrices", [((1, 5), True), ((1, 5), False), ((5, 1), True), ((5, 1), False),
                                                 ((1, 1), True)], ids=str)
def test_svd_vector_shaped(shape, full_matrices):
    check_svd(rand(shape, seed=7), full_matrices)


def test_svd_diagonal_exact():
    a = np.diag([3.0, -4.0, 0.0, 0.5]).astype(np.float32)
    U, S, Vh = Tensor(a).svd()
    assert S.tolist() == [4.0, 3.0, 0.5, 0.0]
    np.testing.assert_allclose(U.numpy() @ np.diag(S.numpy()) @ Vh.numpy(), a, atol=1e-6)


def test_svd_python_backend():
    check_svd(rand((3, 2), seed=5), device="PYTHON")


# ----- hard inputs: a batch per shape (each matrix is scaled and checked on its own) -----

HARD_5x3 = {
    "rank1": rand((5, 1), seed=1) @ rand((1, 3), seed=2),
    "zeros": np.zeros((5, 3), np.float32),
    "ones": np.ones((5, 3), np.float32),
    "graded": with_singular_values([1, 1e-3, 1e-6], 5, 3).astype(np.float32),
    "huge": rand((5, 3), seed=3) * np.float32(1e30),      # the squares overflow float32 without scaling
    "tiny": rand((5, 3), seed=4) * np.float32(1e-30),     # the squares underflow float32 without scaling
}
HARD_4x4 = {
    "rank2": rand((4, 2), seed=5) @ rand((2, 4), seed=6),
    "one_nonzero_row": np.pad(rand((1, 4), seed=7), ((0, 3), (0, 0))),
    "repeated": with_singular_values([2, 2, 1, 1], 4, 4).astype(np.float32),
    "hilbert": (1.0 / (np.arange(4)[:, None] + np.arange(4) + 1)).astype(np.float32),
}
RANK = {"rank1": 1, "ones": 1, "rank2": 2, "one_nonzero_row": 1}


@pytest.mark.parametrize("cases", [HARD_5x3, HARD_4x4], ids=["5x3", "4x4"])
def test_svd_hard(cases):
    batch = np.stack(list(cases.values()))
    _, s, _ = check_svd(batch.reshape((2, -1) + batch.shape[1:]))                 # two batch dims
    for name, si in zip(cases, s.reshape((len(cases), -1))):
        if name in RANK: assert np.all(si[RANK[name]:] <= 1e-5 * si[0]), (name, si)


def test_svd_hard_wide_thin():
    batch = np.stack([np.ascontiguousarray(a.T) for a in HARD_5x3.values()]).reshape(2, 3, 3, 5)
    _, s, _ = check_svd(batch, full_matrices=False)
    for name, si in zip(HARD_5x3, s.reshape(len(HARD_5x3), -1)):
        if name in RANK: assert np.all(si[RANK[name]:] <= 1e-5 * si[0]), (name, si)


def test_svd_rank_deficient_float64():
    a = rand((5, 1), seed=8, dtype=np.float64) @ rand((1, 3), seed=9, dtype=np.float64)
    _, s, _ = check_svd(a, full_matrices=True)
    assert np.all(s[1:] < 1e-14 * s[0])


def test_svd_integer_and_half_inputs():
    a = np.array([[1, 2, 0], [3, 4, 1], [5, 6, 0], [0, 1, 1], [2, 0, 2]], np.int32)
    U, S, Vh = Tensor(a).svd(full_matrices=False)
    assert S.dtype == dtypes.float32
    np.testing.assert_allclose(S.numpy(), np.linalg.svd(a.astype(np.float64))[1], rtol=1e-5)
    h = rand((5, 3), seed=11).astype(np.float16)
    U, S, Vh = Tensor(h).svd()
    assert U.dtype == S.dtype == Vh.dtype == dtypes.float16
    np.testing.assert_allclose(S.numpy(), np.linalg.svd(h.astype(np.float64))[1], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0), (2, 0, 3), (0, 3, 4)], ids=str)
@pytest.mark.parametrize("full_matrices", [True, False])
def test_svd_empty(shape, full_matrices):
    """Zero-size inputs: empty results, and (like torch) identities for the square factors of full_matrices."""
    a = np.zeros(shape, np.float32)
    out = Tensor(a).svd(full_matrices=full_matrices)
    ref = torch.linalg.svd(torch.tensor(a), full_matrices=full_matrices)
    for o, r in zip(out, ref):
        assert o.shape == tuple(r.shape)
        np.testing.assert_array_equal(o.numpy(), r.numpy())


@pytest.mark.parametrize("shape", [(), (3,)], ids=str)
def test_svd_needs_a_matrix(shape):
    a = np.zeros(shape, np.float32)
    with pytest.raises(Exception) as te:
        torch.linalg.svd(torch.tensor(a))
    with pytest.raises(te.type, match="at least 2 dimensions"):
        Tensor(a).svd()


def test_svd_fixed_work_under_jit():
    """No data-dependent control flow: svd can be captured by TinyJit and replayed on new data."""
    from fusegrad.engine.jit import TinyJit

    @TinyJit
    def singular_values(x):
        return x.svd(full_matrices=False)[1].realize()
    for seed in range(3):
        a = rand((5, 3), seed=20 + seed)
        np.testing.assert_allclose(singular_values(Tensor(a)).numpy(), np.linalg.svd(a)[1], rtol=1e-5)


# ----- gradients: losses that don't depend on the sign or basis choice of the singular vectors -----

def invariant_loss(U, S, Vh, w_a, w_u, w_v):
    """S terms, the projectors U_k U_k^T and V_k V_k^T, and the rank-1 sum sum_i u_i v_i^T (A's polar factor)."""
    k = S.shape[-1]
    Uk, Vhk = U[..., :k], Vh[..., :k, :]

    def t(m): return m.transpose(-2, -1)
    return ((S * S).sum() + S.sqrt().sum() + ((Uk @ t(Uk)) * w_u).sum() + ((t(Vhk) @ Vhk) * w_v).sum() +
            ((Uk @ Vhk) * w_a).sum() + (((Uk * S.unsqueeze(-2)) @ Vhk) * w_a).sum())


@pytest.mark.parametrize("shape,full_matrices", [((5, 3), False), ((3, 5), True), ((4, 4), True)], ids=str)
def test_svd_grad(shape, full_matrices):
    rng = np.random.default_rng(sum(shape))
    a = rng.uniform(-2, 2, shape)
    m, n = shape[-2:]
    ws = [rng.standard_normal(s) for s in (shape, shape[:-2] + (m, m), shape[:-2] + (n, n))]
    ta = torch.tensor(a, requires_grad=True)
    invariant_loss(*torch.linalg.svd(ta, full_matrices=full_matrices), *map(torch.tensor, ws)).backward()
    fa = Tensor(a, requires_grad=True)
    invariant_loss(*fa.svd(full_matrices=full_matrices), *map(Tensor, ws)).backward()
    np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), rtol=1e-9, atol=1e-9)


def test_svd_grad_nuclear_norm_float32():
    a = rand((5, 3), seed=12)
    ta, fa = torch.tensor(a, requires_grad=True), Tensor(a, requires_grad=True)
    torch.linalg.svd(ta)[1].sum().backward()
    fa.svd()[1].sum().backward()
    np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), atol=1e-5)


# ----- qr regressions (found while building svd on it) -----

def test_qr_16x12_and_12x12():
    """16x12 used to build a lazy graph so deep that scheduling hit Python's recursion limit; 12x12 is a size whose
    fused reflection kernel gcc -march=native miscompiled when the normalization was a vectorized where."""
    for shape in [(16, 12), (12, 12)]:
        a = rand(shape, seed=13)
        q, r = Tensor(a).qr()
        qn, rn = q.numpy(), r.numpy()
        np.testing.assert_allclose(qn @ rn, a, atol=1e-5)
        np.testing.assert_allclose(qn.T @ qn, np.eye(shape[0]), atol=1e-5)
        np.testing.assert_allclose(np.tril(rn, -1), 0, atol=1e-5)


def test_qr_keeps_float64():
    q, r = Tensor(np.ones((1, 1))).qr()
    assert q.dtype == r.dtype == dtypes.float64


def test_qr_grad_through_realized_steps():
    """qr realizes Q and R after every step; gradients still flow through all of them (sign-invariant losses)."""
    a, w = rand((4, 4), seed=14, dtype=np.float64), rand((4, 4), seed=15, dtype=np.float64)
    ta, fa = torch.tensor(a, requires_grad=True), Tensor(a, requires_grad=True)
    tq, tr = torch.linalg.qr(ta)
    fq, fr = fa.qr()
    ((tr * tr + tq * tq) * torch.tensor(w)).sum().backward()
    ((fr * fr + fq * fq) * Tensor(w)).sum().backward()
    np.testing.assert_allclose(fa.grad.numpy(), ta.grad.numpy(), atol=1e-10)
