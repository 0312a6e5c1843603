"""A representative subset of the op suite with BEAM search choosing every kernel's optimizations.

BEAM tries actions the hand-coded heuristics never pick (other upcast/unroll/tile/vectorize combinations, odd
splits); each candidate it times must also compute the right answer, so these ops run forward and backward against
PyTorch with BEAM=1 and a small per-kernel budget. The search cache is a fresh directory, so every kernel is searched.
"""
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Context, Tensor
from fusegrad.engine import realize
from .helpers import check_op


@pytest.fixture(autouse=True)
def beam(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))   # no cached programs or search results from other runs
    realize._programs.clear()
    with Context(BEAM=1, BEAM_BUDGET=1, IGNORE_BEAM_CACHE=1):
        yield
    realize._programs.clear()


CASES = {
    "matmul_odd": ([(13, 37), (37, 19)], lambda a, b: a @ b, None),
    "matmul_tiles": ([(32, 64), (64, 48)], lambda a, b: a @ b, None),
    "matmul_batched_T": ([(3, 17, 24), (3, 9, 24)], lambda a, b: a @ b.transpose(1, 2), None),
    "linear_relu": ([(8, 33), (20, 33), (20,)], lambda x, w, b: F.linear(x, w, b).relu(),
                    lambda x, w, b: x.linear(w.T, b).relu()),
    "conv_stride_pad": ([(2, 3, 11, 9), (6, 3, 3, 3)], lambda x, w: F.conv2d(x, w, stride=2, padding=1),
                        lambda x, w: x.conv2d(w, stride=2, padding=1)),
    "conv_channels": ([(2, 8, 12, 12), (16, 8, 3, 3)], lambda x, w: F.conv2d(x, w).relu(),
                      lambda x, w: x.conv2d(w).relu()),
    "conv_groups": ([(2, 4, 8, 8), (8, 2, 3, 3)], lambda x, w: F.conv2d(x, w, groups=2),
                    lambda x, w: x.conv2d(w, groups=2)),
    "sum_axes": ([(8, 32, 16)], lambda x: x.sum((0, 2)), lambda x: x.sum((0, 2))),
    "max_axis": ([(32, 64)], lambda x: x.max(1).values, lambda x: x.max(1)),
    "softmax": ([(16, 128)], lambda x: x.softmax(-1), lambda x: x.softmax(-1)),
    "log_softmax": ([(5, 3, 40)], lambda x: x.log_softmax(1), lambda x: x.log_softmax(1)),
    "layernorm": ([(6, 50)], lambda x: F.layer_norm(x, (50,)), lambda x: x.layernorm()),
    "broadcast_chain": ([(9, 1, 7), (1, 11, 7)], lambda a, b: (a * b + a.exp()).sqrt().sum(-1),
                        lambda a, b: (a * b + a.exp()).sqrt().sum(-1)),
    "cumsum": ([(5, 70)], lambda x: x.cumsum(1), lambda x: x.cumsum(1)),
    "max_pool": ([(2, 3, 10, 10)], lambda x: F.max_pool2d(x, 2), lambda x: x.max_pool2d()),
    "avg_pool_pad": ([(2, 3, 9, 9)], lambda x: F.avg_pool2d(x, 3, 2, 1), lambda x: x.avg_pool2d(3, 2, padding=1)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_under_beam(name):
    shapes, torch_fn, fg_fn = CASES[name]
    check_op(shapes, torch_fn, fg_fn, atol=1e-5, grad_atol=1e-4)


def test_int_matmul_and_argmax_under_beam():
    check_op([(12, 20), (20, 7)], lambda a, b: a @ b, dtype="int32", low=-5, high=5, forward_only=True)
    check_op([(9, 41)], lambda x: x.argmax(1), lambda x: x.argmax(1), forward_only=True, out_dtype="int32")
