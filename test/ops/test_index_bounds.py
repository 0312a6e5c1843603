"""Out-of-range tensor indices never touch another element: reads give 0, writes are dropped, indices keep their full
width (int64), and CHECK_OOB=1 raises IndexError like torch. In-range cases are compared with torch exactly."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes, nn
from fusegrad.helpers import Context

DEVS = ["CPU", "PYTHON"]


def _zeros4(dev: str) -> Tensor:
    return Tensor.zeros(4, dtype=dtypes.int, device=dev).contiguous().realize()


@pytest.mark.parametrize("dev", DEVS)
def test_setitem_past_end_is_dropped(dev):
    y = _zeros4(dev)
    y[Tensor([50], device=dev)] = 9          # wrote element 0
    assert y.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("dev", DEVS)
def test_setitem_below_minus_n_is_dropped(dev):
    y = _zeros4(dev)
    y[Tensor([-5, -6, -8], device=dev)] = 7  # wrapped once onto elements 3, 2, 0
    assert y.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("dev", DEVS)
def test_setitem_valid_negatives_match_torch(dev):
    y = _zeros4(dev)
    y[Tensor([-1, -4, 1], device=dev)] = 7
    t = torch.zeros(4, dtype=torch.int32)
    t[torch.tensor([-1, -4, 1])] = 7
    assert y.tolist() == t.tolist()


@pytest.mark.parametrize("dev", DEVS)
def test_getitem_below_minus_n_reads_zero(dev):
    assert Tensor.arange(1, 4, device=dev)[Tensor([-4], device=dev)].tolist() == [0]   # read [3]
    assert Tensor.arange(1, 4, device=dev)[Tensor([-3, -1], device=dev)].tolist() == \
        torch.arange(1, 4)[torch.tensor([-3, -1])].tolist()


@pytest.mark.parametrize("dev", DEVS)
def test_multi_axis_checked_per_axis(dev):
    x = Tensor.arange(1, 13, device=dev).reshape(3, 4)
    assert x[Tensor([0], device=dev), Tensor([5], device=dev)].tolist() == [0]          # read 6, from row 1
    assert x[Tensor([3], device=dev), Tensor([0], device=dev)].tolist() == [0]
    assert x[Tensor([0, 1], device=dev), Tensor([-5, 3], device=dev)].tolist() == [0, 8]
    ti, tj = torch.tensor([0, -1, 2]), torch.tensor([-4, 3, -1])
    assert x[Tensor(ti.numpy(), device=dev), Tensor(tj.numpy(), device=dev)].tolist() == \
        torch.arange(1, 13).reshape(3, 4)[ti, tj].tolist()


@pytest.mark.parametrize("dev", DEVS)
def test_multi_axis_setitem_out_of_range_dropped(dev):
    y = Tensor.zeros(3, 4, dtype=dtypes.int, device=dev).contiguous().realize()
    y[Tensor([0, 1], device=dev), Tensor([5, 2], device=dev)] = 3     # (0, 5) would have been element (1, 1)
    t = torch.zeros(3, 4, dtype=torch.int32)
    t[1, 2] = 3
    assert y.tolist() == t.tolist()


@pytest.mark.parametrize("dev", DEVS)
def test_int64_indices_keep_full_width(dev):
    big = Tensor([2**32 + 1], dtype=dtypes.int64, device=dev)
    x = Tensor.arange(1, 5, device=dev)
    assert x.gather(0, big).tolist() == [0]          # read element 1 (value 2)
    assert x[big].tolist() == [0]
    y = _zeros4(dev)
    y[big] = 7
    assert y.tolist() == [0, 0, 0, 0]
    two = Tensor([2**32 + 1, 2], dtype=dtypes.int64, device=dev)
    assert _zeros4(dev).scatter(0, two, 5).tolist() == [0, 0, 5, 0]
    assert _zeros4(dev).scatter_reduce(0, two, Tensor([4, 6], device=dev), "sum").tolist() == [0, 0, 6, 0]
    emb = nn.Embedding(4, 2)
    out = emb(Tensor([[2**32 + 1, 1]], dtype=dtypes.int64)).numpy()
    np.testing.assert_array_equal(out[0, 0], [0, 0])
    np.testing.assert_array_equal(out[0, 1], emb.weight.numpy()[1])


def test_int64_in_range_matches_torch():
    idx = torch.tensor([3, 0, -1, -4], dtype=torch.int64)
    src = torch.arange(10, 14)
    assert Tensor(src.numpy())[Tensor(idx.numpy())].tolist() == src[idx].tolist()
    pos = torch.tensor([3, 0, 1])
    assert Tensor(src.numpy()).gather(0, Tensor(pos.numpy())).tolist() == src.gather(0, pos).tolist()


def test_gather_grad_ignores_out_of_range():
    x = Tensor.arange(4).float().requires_grad_()
    x.gather(0, Tensor([2**32 + 1, 2, -1, -7], dtype=dtypes.int64)).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("fn, msg", [
    (lambda: Tensor.zeros(4)[Tensor([50])], "index 50 is out of bounds for dimension 0 with size 4"),
    (lambda: Tensor.zeros(4).gather(0, Tensor([-5])), "index -5 is out of bounds for dimension 0 with size 4"),
    (lambda: Tensor.zeros(3, 4)[Tensor([0]), Tensor([5])], "index 5 is out of bounds for dimension 1 with size 4"),
    (lambda: Tensor.zeros(4).scatter(0, Tensor([4]), 1.0), "index 4 is out of bounds for dimension 0 with size 4"),
    (lambda: Tensor.zeros(4).gather(0, Tensor([2**32 + 1], dtype=dtypes.int64)),
     f"index {2**32 + 1} is out of bounds for dimension 0 with size 4"),
])
def test_check_oob_raises_like_torch(fn, msg):
    with Context(CHECK_OOB=1):
        with pytest.raises(IndexError, match=msg): fn()


def test_check_oob_torch_message_agrees():
    with pytest.raises(IndexError, match="index 50 is out of bounds for dimension 0 with size 4"):
        torch.zeros(4)[torch.tensor([50])]


def test_check_oob_passes_valid_indices():
    with Context(CHECK_OOB=1):
        assert Tensor.arange(4)[Tensor([-4, 3])].tolist() == [0, 3]


def test_check_oob_setitem():
    y = _zeros4("CPU")
    with Context(CHECK_OOB=1):
        with pytest.raises(IndexError, match="index 50 is out of bounds"):
            y[Tensor([50])] = 9


def test_variable_bound_past_int32_reads_back_exactly():
    # a 64-bit variable is a 64-bit kernel argument: its value isn't truncated (it once read back as 5 or 0)
    from fusegrad import Variable
    v = Variable("big_v", 0, 2**40, dtypes.int64)
    for val in (2**31 - 1, 2**31, 2**33 + 5):
        assert (Tensor.zeros(1, dtype=dtypes.int64) + v.bind(val)).tolist() == [val]
    with pytest.raises(ValueError, match="32-bit"): Tensor.ones(8)[:v.bind(3)]   # sizes and slice bounds stay 32-bit


def test_index_sizes_past_int32_raise():
    # index math is 32-bit: a buffer past 2**31 elements is refused before anything is allocated
    with pytest.raises(RuntimeError, match="32-bit"):
        (Tensor.zeros(2**31 + 8, dtype=dtypes.uint8) + 1).realize()
