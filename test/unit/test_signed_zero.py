"""-0.0 == 0.0 in Python, but they are different constants: 1/x, atan2 and copysign tell them apart. Hash-consing
keyed nodes by (op, dtype, src, arg) and the schedule cache keyed graphs by their args, so a graph with `* 0.0` was
given the node (or the schedule) of an earlier or live one with `* -0.0`. Compared with torch doing the same steps."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

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
