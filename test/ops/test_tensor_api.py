"""Data access and graph helpers: realize, numpy, item, tolist, contiguous, detach (stops the gradient), properties,
backward with an explicit gradient, gradient accumulation over two backward passes."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes

from .helpers import DEVICES, check_op


@pytest.mark.parametrize("device", DEVICES)
def test_realize_returns_self_and_keeps_values(device):
    a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    b = a * 2 + 1
    assert b.realize() is b
    np.testing.assert_array_equal(b.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) * 2 + 1)
    np.testing.assert_array_equal(b.numpy(), b.numpy())
    c = (b - 1).realize()
    np.testing.assert_array_equal(c.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)


def test_realize_many():
    a = Tensor([1.0, 2.0])
    b, c = a + 1, a * 3
    b.realize(c)
    assert b.tolist() == [2.0, 3.0] and c.tolist() == [3.0, 6.0]


@pytest.mark.parametrize("npdt", ["float32", "float64", "int32", "int64", "uint8", "bool", "float16"])
def test_numpy_dtype_and_shape(npdt):
    v = (np.arange(6) % 2 == 0) if npdt == "bool" else np.arange(-3, 3).astype(npdt)
    v = v.reshape(2, 3)
    out = (Tensor(v) * 1 if npdt != "bool" else Tensor(v).logical_not().logical_not()).numpy()
    assert isinstance(out, np.ndarray) and out.dtype == v.dtype and out.shape == v.shape
    np.testing.assert_array_equal(out, v)


def test_numpy_of_views():
    v = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor(v)
    np.testing.assert_array_equal(t.permute(2, 0, 1).numpy(), v.transpose(2, 0, 1))
    np.testing.assert_array_equal(t[:, ::-1, 1::2].numpy(), v[:, ::-1, 1::2])
    np.testing.assert_array_equal(t[1].numpy(), v[1])
    np.testing.assert_array_equal(t[0:1, 0:1, 0:1].reshape(()).numpy(), v[0, 0, 0])


def test_numpy_is_a_copy():
    t = Tensor([1.0, 2.0]).realize()
    out = t.numpy()
    out[0] = 100
    assert t.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("device", DEVICES)
def test_item(device):
    assert Tensor(np.array([[2.5]], np.float32), device=device).item() == 2.5
    x = Tensor([1.0, 2.0, 3.0], device=device)
    assert x.sum().item() == torch.tensor([1.0, 2.0, 3.0]).sum().item()
    assert x[1].item() == 2.0
    assert isinstance(Tensor([3]).sum().item(), int) and Tensor([3]).sum().item() == 3
    assert Tensor([True]).item() is True
    assert isinstance(Tensor([1.5]).item(), float)


@pytest.mark.parametrize("device", DEVICES)
def test_tolist(device):
    v = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    t = Tensor(v, device=device)
    assert t.tolist() == torch.tensor(v).tolist()
    assert t.T.tolist() == torch.tensor(v).T.tolist()
    assert t[0].tolist() == v[0].tolist()
    assert t.sum().tolist() == float(v.sum())
    assert Tensor(np.zeros((2, 0), np.float32)).tolist() == torch.zeros(2, 0).tolist()
    assert Tensor(np.array([[1, -2]], np.int32)).tolist() == [[1, -2]]
    assert (Tensor([1.0, 2.0]) > 1.5).tolist() == [False, True]


def test_tolist_nested_3d():
    v = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    assert Tensor(v).tolist() == v.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_contiguous(device):
    check_op([(3, 4)], lambda x: x.T.contiguous() * 2, device=device)
    check_op([(3, 4)], lambda x: x.flip(0).contiguous().reshape(2, 6), device=device)
    check_op([(3, 4)], lambda x: x.contiguous())


def test_contiguous_of_realized_is_self():
    t = Tensor([1.0, 2.0]).realize()
    assert t.contiguous() is t


def test_detach_values_and_flags():
    x = Tensor([1.0, 2.0], requires_grad=True)
    d = x.detach()
    assert d.tolist() == [1.0, 2.0]
    assert not d.requires_grad
    assert (x * 2).requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_detach_stops_gradient(device):
    # d/dx (x * detach(x)) = detach(x), not 2x
    check_op([(3, 4)], lambda x: x * x.detach(), device=device)
    check_op([(3, 4)], lambda x: (x.detach() * 3).exp() + x)


def test_detach_only_path_gives_no_grad():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = Tensor([3.0, 4.0], requires_grad=True)
    (x.detach() * y).sum().backward()
    assert x.grad is None or x.grad.tolist() == [0.0, 0.0]
    assert y.grad.tolist() == [1.0, 2.0]


def test_backward_explicit_gradient():
    g = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    x = Tensor(np.ones((2, 2), np.float32), requires_grad=True)
    xt = torch.ones(2, 2, requires_grad=True)
    (x * 3).backward(Tensor(g))
    (xt * 3).backward(torch.tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())


def test_backward_accumulates():
    # a second backward adds to .grad, like torch
    x = Tensor([1.0, 2.0], requires_grad=True)
    xt = torch.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        (x * x).sum().backward()
        (xt * xt).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())


def test_backward_through_realized_intermediate():
    x = Tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    y = (x * x).realize()
    (y * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0, 12.0])


def test_grad_of_intermediate_with_requires_grad():
    x = Tensor([2.0, 3.0], requires_grad=True)
    (x.exp() * 0 + x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 6.0])


def test_properties():
    t = Tensor(np.zeros((2, 3, 4), np.float32))
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and t.dtype == dtypes.float32
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert len(t) == 2 and t.element_size() == 4 and t.nbytes() == 96
    assert t.is_floating_point() and not Tensor([1]).is_floating_point()
    assert t.device == "CPU" and Tensor([1.0], device="python").device == "PYTHON"


def test_to_device_copy():
    v = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = Tensor(v, device="CPU")
    b = a.to("PYTHON")
    assert b.device == "PYTHON"
    np.testing.assert_array_equal((b * 2).numpy(), v * 2)
    np.testing.assert_array_equal(b.to("CPU").numpy(), v)


def test_to_device_gradient():
    x = Tensor(np.array([1.0, 2.0], np.float32), device="CPU", requires_grad=True)
    (x.to("PYTHON") * 3).sum().backward()
    assert x.grad.device == "CPU"
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_laziness_no_compute_before_realize():
    from fusegrad import GlobalCounters
    a = Tensor(np.ones((4, 4), np.float32))
    GlobalCounters.reset()
    b = (a * 2 + 1).sum(axis=0)
    assert GlobalCounters.kernel_count == 0
    np.testing.assert_array_equal(b.numpy(), np.full(4, 12.0, np.float32))
    assert GlobalCounters.kernel_count >= 1
