"""Smoke test: a few seconds, run it constantly."""
import numpy as np

from fusegrad import GlobalCounters, Tensor


def test_add_numpy():
    a, b = np.random.rand(3, 4).astype(np.float32), np.random.rand(3, 4).astype(np.float32)
    np.testing.assert_allclose((Tensor(a) + Tensor(b)).numpy(), a + b, rtol=1e-6)


def test_matmul_one_kernel():
    a, b = np.random.rand(8, 8).astype(np.float32), np.random.rand(8, 8).astype(np.float32)
    ta, tb = Tensor(a), Tensor(b)
    GlobalCounters.reset()
    out = (ta.reshape(8, 1, 8) * tb.T.reshape(1, 8, 8)).sum(axis=2).numpy()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-6)


def test_readme_autograd():
    x = Tensor.eye(3, requires_grad=True)
    y = Tensor([[2.0, 0, -2.0]], requires_grad=True)
    y.matmul(x).sum().backward()
    assert x.grad.tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [-2.0, -2.0, -2.0]]
    assert y.grad.tolist() == [[1.0, 1.0, 1.0]]


def test_item_tolist():
    t = Tensor([[1, 2], [3, 4]])
    assert t.sum().item() == 10
    assert t.tolist() == [[1, 2], [3, 4]]
