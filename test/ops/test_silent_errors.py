"""Cases that used to give a wrong answer without complaint; each is compared with torch (CPU)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes


@pytest.mark.parametrize("axis", [(0, 0), (0, -2), (1, 0, 1)])
@pytest.mark.parametrize("op", ["sum", "max", "mean", "var", "prod"])
def test_repeated_reduce_axis_raises(op, axis):
    if op != "prod":   # torch.prod takes one dim only
        with pytest.raises(RuntimeError, match="appears multiple times"):
            getattr(torch.ones(2, 3), op)(dim=axis) if op != "max" else torch.amax(torch.ones(2, 3), dim=axis)
    with pytest.raises(RuntimeError, match=r"dim \d appears multiple times"):
        getattr(Tensor.ones(2, 3), op)(axis=axis)                 # sum gave [4, 4, 4]


@pytest.mark.parametrize("v", [2**63, 2**64 + 5, -2**63 - 1])
def test_int_beyond_64_bits_raises(v):
    with pytest.raises(ValueError):
        torch.tensor([v])
    with pytest.raises(OverflowError):
        Tensor([v])                                                 # gave [0] / [5]
    with pytest.raises(OverflowError):
        Tensor(v)


@pytest.mark.parametrize("v", [2**40, -2**63, 2**63 - 1, 2**31, -2**31 - 1])
def test_wide_int_keeps_its_value(v):
    t = Tensor([v, 1])
    assert t.dtype == dtypes.int64
    assert t.tolist() == torch.tensor([v, 1]).tolist()


def test_uint64_explicit_dtype_accepts_top_bit():
    assert Tensor([2**63], dtype=dtypes.uint64).tolist() == [2**63]


def test_clones_of_equal_constants_have_their_own_grad():
    a, b = Tensor(3.5).clone(), Tensor(3.5).clone()
    a.requires_grad = True
    b.requires_grad = True
    (a + b).backward()
    ta, tb = torch.tensor(3.5).clone().requires_grad_(), torch.tensor(3.5).clone().requires_grad_()
    (ta + tb).backward()
    assert (a.grad.item(), b.grad.item()) == (ta.grad.item(), tb.grad.item()) == (1.0, 1.0)   # was 2.0 each


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_empty_batch(reduction):
    fg = Tensor.zeros(0, 3).cross_entropy(Tensor.zeros(0, dtype=dtypes.int32), reduction=reduction).numpy()
    th = torch.nn.functional.cross_entropy(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), reduction=reduction)
    np.testing.assert_array_equal(fg, th.numpy())                   # mean gave 0.0, torch nan
    fgp = Tensor.zeros(0, 3).cross_entropy(Tensor.zeros(0, 3), reduction=reduction).numpy()
    thp = torch.nn.functional.cross_entropy(torch.zeros(0, 3), torch.zeros(0, 3), reduction=reduction)
    np.testing.assert_array_equal(fgp, thp.numpy())


def test_cross_entropy_all_ignored_is_nan():
    th = torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([-100, -100]))
    assert math.isnan(th.item()) and math.isnan(Tensor.zeros(2, 3).cross_entropy(Tensor([-100, -100])).item())
    th = torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([1, -100]))
    assert Tensor.zeros(2, 3).cross_entropy(Tensor([1, -100])).item() == pytest.approx(th.item(), rel=1e-6)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32])
def test_rand_stays_below_one(dt):
    a = Tensor.rand(200_000, dtype=dt).float().numpy()
    assert a.max() < 1.0 and a.min() >= 0.0                          # half gave exactly 1.0 for ~0.03% of draws
    assert abs(a.mean() - 0.5) < 0.01


@pytest.mark.parametrize("dt, tdt", [(dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16)])
def test_var_of_many_16bit_values(dt, tdt):
    a = (np.arange(70_000) % 2).astype(np.float32)
    t = torch.tensor(a, dtype=tdt)
    x = Tensor(a).cast(dt)
    assert x.var().item() == t.var().item() == 0.25                 # was 0.0: the count 69999 is inf in half
    assert x.std().item() == t.std().item()
    assert x.var().dtype == dt


# ----- one rule for what C leaves undefined, as torch CPU gives it (every backend: test/runtime/test_backend_edges.py)
EDGE_FLOATS = [float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 2.7, -2.7, 2147483647.0, -2147483648.0, 1e20]
EDGE_INTS = [1, -1, 5, -2**31, 7]
EDGE_SHIFTS = [40, 33, -1, 32, 31]


@pytest.mark.parametrize("dt, tdt", [(dtypes.int32, torch.int32), (dtypes.int64, torch.int64),
                                     (dtypes.int16, torch.int16), (dtypes.int8, torch.int8), (dtypes.uint8, torch.uint8)])
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_float_to_int_matches_torch(device, dt, tdt):
    # torch CPU (x86): NaN, inf and out-of-range give the minimum of int32/int64; narrower types go through int32
    want = torch.tensor(EDGE_FLOATS).to(tdt).tolist()
    assert Tensor(EDGE_FLOATS, device=device).cast(dt).tolist() == want


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_shifts_and_abs_match_torch(device):
    x, s = Tensor(EDGE_INTS, dtype=dtypes.int32, device=device), Tensor(EDGE_SHIFTS, dtype=dtypes.int32, device=device)
    tx, ts = torch.tensor(EDGE_INTS, dtype=torch.int32), torch.tensor(EDGE_SHIFTS, dtype=torch.int32)
    assert (x << 40).tolist() == (tx << 40).tolist()                  # CPU gave 256 for 1 << 40
    assert (x >> 40).tolist() == (tx >> 40).tolist()
    assert (x << s).tolist() == (tx << ts).tolist()
    assert (x >> s).tolist() == (tx >> ts).tolist()
    assert (x << 31).tolist() == (tx << 31).tolist()
    assert x.abs().tolist() == tx.abs().tolist()                      # abs(INT32_MIN) gave 0
    assert (-x).tolist() == (-tx).tolist()
