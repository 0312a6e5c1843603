"""-0.0 == 0.0 in Python, but they are different constants: 1/x, atan2 and copysign tell them apart. Hash-consing
keyed nodes by (op, dtype, src, arg) and the schedule cache keyed graphs by their args, so a graph with `* 0.0` was
given the node (or the schedule) of an earlier or live one with `* -0.0`. Compared with torch doing the same steps.
Constant folding and sums keep signed zeros as IEEE and torch do: -0.0 + 0.0 is +0.0 (so x + 0.0 is not x for floats),
and a sum starts from +0.0 (so a sum of -0.0s, unrolled, over a size-1 axis or of a 0-d tensor, is +0.0)."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fusegrad import Tensor, dtypes
from fusegrad.ir.ops import Ops, UOp


def _inv(t) -> list[float]: return (1 / t).tolist()


def test_constant_nodes_keep_the_sign_of_zero():
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.float32, -0.0) is UOp.const(dtypes.float32, -0.0)
    assert UOp(Ops.CONST, dtypes.float32.vec(2), (), (0.0, -0.0)) is not UOp(Ops.CONST, dtypes.float32.vec(2), (),
                                                                             (0.0, 0.0))


@pytest.mark.parametrize("first,second", [(-0.0, 0.0), (0.0, -0.0)])
def test_a_live_graph_with_the_other_zero_changes_nothing(first, second):
    y = Tensor([3.0, -2.0]).realize()
    keep = y * first   # alive (unrealized) while the other graph is built and run
    got = _inv(y * second)
    assert got == _inv(torch.tensor([3.0, -2.0]) * second)
    assert _inv(keep) == _inv(torch.tensor([3.0, -2.0]) * first)


@pytest.mark.parametrize("first,second", [(-0.0, 0.0), (0.0, -0.0)])
def test_the_schedule_cache_tells_the_zeros_apart(first, second):
    y = Tensor([3.0, -2.0]).realize()
    assert _inv(y * first) == _inv(torch.tensor([3.0, -2.0]) * first)   # scheduled and cached, graph freed
    gc.collect()
    assert _inv(y * second) == _inv(torch.tensor([3.0, -2.0]) * second)   # same structure, other constant


@pytest.mark.parametrize("first,second", [(-0.0, 0.0), (0.0, -0.0)])
def test_full_of_either_zero(first, second):
    keep = Tensor.full((3,), first)
    np.testing.assert_equal(np.signbit(Tensor.full((3,), second).numpy()), np.signbit(np.full(3, second)))
    np.testing.assert_equal(np.signbit(keep.numpy()), np.signbit(np.full(3, first)))


# ---------------------------------------------------------------- signed zeros through arithmetic and sums vs torch
# Values whose sums are exact in any order (small integers, zeros, infinities, NaN), so the results must match torch
# bit for bit whatever order fusegrad's kernels add in. NaN's sign bit is not compared (IEEE leaves it unspecified).
SPECIAL = [0.0, -0.0, 1.0, -1.0, 2.0, -3.0, float("inf"), float("-inf"), float("nan")]


def _same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, what
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), f"{what}: {got} vs torch {want}"
    assert (got.view(np.uint32)[~nan] == want.view(np.uint32)[~nan]).all(), f"{what}: {got} vs torch {want}"


def _same_sign_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """For results that round differently by design (mean is sum * (1/n) here, sum / n in torch): the sign bits (of
    zeros too) and NaN-ness must agree, the values to 1 ulp."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all() and (np.signbit(got)[~nan] == np.signbit(want)[~nan]).all(), \
        f"{what}: {got} vs torch {want}"
    np.testing.assert_allclose(got, want, rtol=2e-7, err_msg=what)


BINARY = {"x+c": lambda x, c: x + c, "c+x": lambda x, c: c + x, "x-c": lambda x, c: x - c,
          "c-x": lambda x, c: c - x, "x*c": lambda x, c: x * c, "c*x": lambda x, c: c * x,
          "x+c-c": lambda x, c: (x + c) - c, "(x*c)+c": lambda x, c: x * c + c}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(SPECIAL), min_size=1, max_size=12), st.sampled_from(SPECIAL),
       st.sampled_from(sorted(BINARY)))
def test_binary_with_constants_bit_exact(vals, c, name):
    fn = BINARY[name]
    _same_bits(fn(Tensor(vals), c).numpy(), fn(torch.tensor(vals), c).numpy(), f"{name} c={c} x={vals}")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(SPECIAL[:6] + [float("inf"), float("nan")]), min_size=1, max_size=24),
       st.sampled_from([(1, -1), (-1, 1), (2, -1), (-1, 2), (-1, 4), (-1, 8), (-1, 1, 1)]), st.integers(-1, 2),
       st.booleans())
def test_sums_bit_exact(vals, shape, axis, negzeros):
    """Sums, including over size-1 axes, 0-d tensors and whole tensors of -0.0, start from +0.0 like torch's."""
    if negzeros: vals = [-0.0] * len(vals)
    n = len(vals)
    shape = tuple(n // abs(int(np.prod(shape))) if s == -1 else s for s in shape)
    if int(np.prod(shape)) != n: shape = (n,)
    x, tx = Tensor(vals).reshape(shape), torch.tensor(vals).reshape(shape)
    ax = None if axis >= len(shape) or axis == 2 else axis
    _same_bits(x.sum(ax).numpy(), tx.sum(ax).numpy(), f"sum({ax}) of {shape} {vals}")
    _same_sign_close(x.mean(ax).numpy(), tx.mean(ax).numpy(), f"mean({ax}) of {shape} {vals}")
    _same_bits((x * 2.0).sum(ax).numpy(), (tx * 2.0).sum(ax).numpy(), f"(x*2).sum({ax})")
    _same_bits(x[0].sum().numpy(), tx[0].sum().numpy(), "0-d or row sum")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 16, 64, 1000])
@pytest.mark.parametrize("cols", [1, 2, 4, 8, 32])
def test_sums_of_negative_zeros_are_positive_zero(n, cols):
    """Every kernel shape: loops, fully unrolled short reduces (which start from the first element), vectorized."""
    x, tx = Tensor.full((n, cols), -0.0), torch.full((n, cols), -0.0)
    for ax in (0, 1, None):
        _same_bits(x.sum(ax).numpy(), tx.sum(ax).numpy(), f"full(({n}, {cols}), -0.0).sum({ax})")
    _same_bits((x * 1.0).sum(1).numpy(), (tx * 1.0).sum(1).numpy(), "fused")
