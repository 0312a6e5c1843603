"""The flags layers and optimizers set on tensors (`requires_grad_`, `is_param_`) and `Tensor.data()`.

Setting a flag changes the tensor object, never the graphs already built from it: a loss computed before the flag
was set must still send its gradient to the tensor (tinygrad's semantics; a PyTorch user sees the same numbers when
the flag is set up front).
"""
import struct

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes, nn

W = [1.0, 2.0, 3.0]


def test_requires_grad_again_after_use_keeps_the_graph():
    x = Tensor.zeros(3, requires_grad=True)
    loss = (x * Tensor(W)).sum()
    x.requires_grad_(True)                     # e.g. a loop that marks every parameter again
    loss.backward()
    assert x.grad is not None and x.grad.tolist() == W


def test_requires_grad_after_use_keeps_the_graph():
    x = Tensor.zeros(3)
    loss = (x * Tensor(W)).sum()
    x.requires_grad_()
    loss.backward()
    assert x.grad is not None and x.grad.tolist() == W


def test_optimizer_made_after_forward_still_trains():
    # SGD marks x with is_param_(); the loss was built before that and must still reach x
    x = Tensor.zeros(3)
    loss = (x * Tensor(W)).sum()
    opt = nn.optim.SGD([x], lr=0.5)
    assert x.is_param and x.requires_grad
    loss.backward()
    with Tensor.train():
        opt.step()
    np.testing.assert_allclose(x.numpy(), [-0.5, -1.0, -1.5])


def test_flag_changes_are_idempotent():
    x = Tensor.zeros(3).requires_grad_()
    u = x.uop
    x.requires_grad_()
    x.is_param_()
    assert x.uop is u


def test_fresh_constants_get_their_own_gradient():
    # two identical constants share a graph node; marking them before use must still keep their gradients apart
    a, b = Tensor.ones(3).requires_grad_(), Tensor.ones(3).is_param_()
    (a * 2 + b * 5).sum().backward()
    assert a.grad is not None and b.grad is not None
    assert a.grad.tolist() == [2.0] * 3 and b.grad.tolist() == [5.0] * 3


def test_matches_torch_when_marked_before_use():
    xs = np.array([0.5, -1.0, 2.0], dtype=np.float32)
    x = Tensor(xs).requires_grad_()
    ((x * x).relu() * Tensor(W)).sum().backward()
    xt = torch.tensor(xs, requires_grad=True)
    ((xt * xt).relu() * torch.tensor(W)).sum().backward()
    assert xt.grad is not None and x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6)


def test_requires_grad_false_after_use_excludes_the_tensor():
    x = Tensor.zeros(3, requires_grad=True)
    loss = (x * Tensor(W)).sum()
    x.requires_grad_(False)
    loss.backward()
    assert x.grad is None


# ----- Tensor.data() -----

def test_data_float16_is_readable_on_every_python():
    vals = [[1.0, 2.5], [-3.0, 0.1]]
    mv = Tensor(vals, dtype=dtypes.float16).data()
    assert mv.shape == (2, 2) and mv.nbytes == 8
    want = np.array(vals, dtype=np.float16)
    np.testing.assert_array_equal(np.frombuffer(mv, dtype=np.float16).reshape(2, 2), want)
    if mv.format == "e":                       # Python >= 3.12
        assert mv.tolist() == want.tolist()
    else:                                      # older: the bit patterns as uint16
        assert mv.format == "H"
        assert mv.tolist() == want.view(np.uint16).tolist()


@pytest.mark.parametrize("shape", [(), (0,), (3,)])
def test_data_float16_shapes(shape):
    t = Tensor.ones(*shape, dtype=dtypes.float16) if shape else Tensor(1.5, dtype=dtypes.float16)
    mv = t.data()
    assert mv.format in ("e", "H") and mv.nbytes == 2 * t.numel()
    if t.numel(): assert struct.unpack(f"{t.numel()}e", mv.tobytes())[0] == (1.5 if not shape else 1.0)


@pytest.mark.parametrize("dtype,fmt", [(dtypes.float32, "f"), (dtypes.int32, "i"), (dtypes.uint8, "B"),
                                       (dtypes.bool, "?"), (dtypes.float64, "d"), (dtypes.int64, "q")])
def test_data_formats(dtype, fmt):
    vals = [[1, 0], [1, 1]]
    mv = Tensor(vals, dtype=dtype).data()
    assert mv.format == fmt and mv.shape == (2, 2)
    assert mv.tolist() == vals                 # True == 1 for bool


def test_realizing_a_leaf_keeps_graphs_built_before_connected():
    x = Tensor.ones(3, requires_grad=True)
    y = (x * Tensor([1.0, 2.0, 3.0])).sum()
    x.realize()  # x now reads a buffer; y still refers to x's node from before
    y.backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 2.0, 3.0]
