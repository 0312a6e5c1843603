"""Reductions against PyTorch: sum/max/min/mean with axis None/int/tuple/negative and keepdim; gradients (ties in
max/min split evenly, as torch.amax/amin); int and bool inputs; empty and 0-d inputs; non-contiguous inputs; NaN."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes

from .helpers import DEVICES, check_op


def torch_reduce(name, axis, keepdim):
    """The torch spelling of fusegrad's x.<name>(axis, keepdim)."""
    def fn(x):
        dims = tuple(range(x.ndim)) if axis is None else axis
        if name == "sum": return x.sum(dim=dims, keepdim=keepdim) if x.ndim else x.sum()
        if name == "mean": return x.mean(dim=dims, keepdim=keepdim) if x.ndim else x.mean()
        return getattr(torch, {"max": "amax", "min": "amin"}[name])(x, dim=dims, keepdim=keepdim)
    return fn


def fg_reduce(name, axis, keepdim):
    return lambda x: getattr(x, name)(axis=axis, keepdim=keepdim)


AXES = [None, 0, 1, 2, -1, -3, (0, 2), (1, 2), (-1, 0), (0, 1, 2)]
OPS = ["sum", "max", "min", "mean"]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_reduce_3d(op, axis, keepdim):
    check_op([(2, 3, 4)], torch_reduce(op, axis, keepdim), fg_reduce(op, axis, keepdim), atol=1e-5)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, True), (-1, False), ((0, 1), True)], ids=str)
def test_reduce_python(op, axis, keepdim):
    check_op([(2, 3)], torch_reduce(op, axis, keepdim), fg_reduce(op, axis, keepdim), device="PYTHON", atol=1e-5)


@pytest.mark.parametrize("op", OPS)
def test_reduce_default_args(op):
    # x.sum() / x.max() / ... with no arguments reduce everything to a 0-d tensor
    check_op([(3, 5)], lambda x: getattr(torch, {"max": "amax", "min": "amin"}.get(op, op))(x) if op in ("max", "min")
             else getattr(x, op)(), lambda x: getattr(x, op)())


@pytest.mark.parametrize("op", OPS)
def test_reduce_positional_axis(op):
    check_op([(3, 5)], torch_reduce(op, 1, False), lambda x: getattr(x, op)(1))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape,axis", [((1, 4), 0), ((4, 1), 1), ((1,), 0), ((1, 1), None), ((3, 1, 2), 1)], ids=str)
def test_reduce_size1_axis(op, shape, axis):
    check_op([shape], torch_reduce(op, axis, False), fg_reduce(op, axis, False))
    check_op([shape], torch_reduce(op, axis, True), fg_reduce(op, axis, True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_reduce_0d(op, device):
    check_op([()], torch_reduce(op, None, False), fg_reduce(op, None, False), device=device)


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reduce_long_axis(op):
    # many elements in one reduction: accumulation error stays within tolerance
    check_op([(3, 1000)], torch_reduce(op, 1, False), fg_reduce(op, 1, False), rtol=1e-4, atol=1e-4)


def test_sum_large_all():
    check_op([(64, 128)], lambda x: x.sum(), low=0, high=1, rtol=1e-4)


# ----- ties: the gradient is split evenly between all maximal elements -----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("axis", [None, 0, 1], ids=str)
def test_max_min_ties(op, axis, device):
    v = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, -1.0], [3.0, -1.0, -1.0]], np.float32)
    check_op(None, torch_reduce(op, axis, False), fg_reduce(op, axis, False), vals=[v], device=device)


def test_max_all_equal():
    check_op(None, lambda x: x.amax(), lambda x: x.max(), vals=[np.full((2, 3), 0.5, np.float32)])


# ----- dtypes -----

@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("npdt", ["int32", "int64", "uint8", "int8", "bool"])
@pytest.mark.parametrize("axis", [None, 1], ids=str)
def test_max_min_int_bool(op, npdt, axis):
    rng = np.random.default_rng(4)
    v = (rng.random((3, 4)) < 0.5) if npdt == "bool" else rng.integers(0 if npdt == "uint8" else -100, 100, (3, 4))
    check_op(None, torch_reduce(op, axis, False), fg_reduce(op, axis, False), vals=[v.astype(npdt)])


@pytest.mark.parametrize("npdt", ["int32", "int8", "uint8", "int16", "bool"])
def test_sum_int_bool(npdt):
    # torch sums small ints and bools in int64; fusegrad in its default int (int32), uint8 -> uint32
    rng = np.random.default_rng(5)
    v = (rng.random((3, 4)) < 0.5) if npdt == "bool" else rng.integers(0 if npdt == "uint8" else -100, 100, (3, 4))
    want = "uint32" if npdt == "uint8" else "int32"
    for axis in (None, 0, -1):
        check_op(None, torch_reduce("sum", axis, False), fg_reduce("sum", axis, False), vals=[v.astype(npdt)],
                 out_dtype=want)


def test_sum_int64_stays_int64():
    v = np.array([[2 ** 40, 1], [3, -2 ** 40]], np.int64)
    check_op(None, torch_reduce("sum", 0, False), fg_reduce("sum", 0, False), vals=[v])


def test_sum_with_dtype():
    v = np.array([[1, 2], [3, 4]], np.int32)
    check_op(None, lambda x: x.sum(dim=1, dtype=torch.float32), lambda x: x.sum(axis=1, dtype="float32"), vals=[v])
    check_op(None, lambda x: x.sum(dtype=torch.float64), lambda x: x.sum(dtype=dtypes.float64),
             vals=[np.array([0.1, 0.2, 0.3], np.float32)])


def test_sum_float64():
    check_op([(3, 4)], lambda x: x.sum(dim=0), lambda x: x.sum(axis=0), dtype=np.float64, atol=1e-12, rtol=1e-12,
             grad_atol=1e-12, grad_rtol=1e-12)


def test_mean_of_int_is_float():
    v = np.array([[1, 2, 4], [3, 5, 8]], np.int32)
    check_op(None, lambda x: x.float().mean(dim=1), lambda x: x.mean(axis=1), vals=[v])
    check_op(None, lambda x: x.float().mean(), lambda x: x.mean(), vals=[v])


# ----- empty inputs -----

@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, False), (1, False), (0, True), (None, True)], ids=str)
def test_sum_empty(axis, keepdim):
    check_op([(0, 3)], torch_reduce("sum", axis, keepdim), fg_reduce("sum", axis, keepdim), forward_only=True)


def test_sum_empty_grad():
    # the result of summing an empty tensor still depends on it: requires_grad and a (empty) gradient, as torch
    check_op([(0, 3)], lambda x: x.sum() + 1, lambda x: x.sum() + 1)
    check_op([(0, 3)], lambda x: x.sum(dim=0), lambda x: x.sum(axis=0))


def test_mean_empty_is_nan():
    check_op([(0, 3)], torch_reduce("mean", None, False), fg_reduce("mean", None, False), forward_only=True)
    check_op([(0, 3)], torch_reduce("mean", 0, False), fg_reduce("mean", 0, False), forward_only=True)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_empty_nonreduced_axis(op):
    # reducing a non-empty axis of an empty tensor is fine: the result is empty too
    check_op([(0, 3)], torch_reduce(op, 1, False), fg_reduce(op, 1, False))


# ----- non-contiguous inputs -----

VIEWS = [("permute", lambda x: x.permute(2, 0, 1)), ("flip", lambda x: x.flip(1)),
         ("slice", lambda x: x[:, ::2, 1:]), ("transpose", lambda x: x.transpose(0, 2)),
         ("expand", lambda x: x[:, :1].expand(2, 5, 4))]


@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce_of_view(name, view, op):
    check_op([(2, 3, 4)], lambda x: torch_reduce(op, 1, False)(view(x)), lambda x: fg_reduce(op, 1, False)(view(x)))


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_reduce_of_padded(op):
    # padding with a value larger than every input makes that value the max
    check_op([(3, 4)], lambda x: torch_reduce(op, 0, False)(torch.nn.functional.pad(x, (1, 0, 1, 2), value=5.0)),
             lambda x: fg_reduce(op, 0, False)(x.pad((1, 0, 1, 2), value=5.0)))


def test_reduce_of_broadcast_expression():
    check_op([(3, 1), (1, 4)], lambda x, y: (x * y).sum(dim=0) + (x - y).amax(dim=1, keepdim=True).sum(),
             lambda x, y: (x * y).sum(axis=0) + (x - y).max(axis=1, keepdim=True).sum())


def test_reduce_chain():
    check_op([(2, 3, 4)], lambda x: x.sum(dim=2).amax(dim=0).mean(), lambda x: x.sum(axis=2).max(axis=0).mean())


def test_softmax_like():
    # a composite of max, sub, exp, sum and div, as used everywhere
    def fn(x):
        m = x.amax(dim=-1, keepdim=True) if isinstance(x, torch.Tensor) else x.max(axis=-1, keepdim=True)
        e = (x - m).exp()
        return e / e.sum(-1, keepdim=True)
    check_op([(4, 5)], fn, low=-10, high=10)
    check_op([(2, 3)], fn, device="PYTHON")


# ----- NaN / inf -----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_reduce_nan(op, device):
    v = np.array([[1.0, np.nan, 3.0], [2.0, 5.0, -1.0]], np.float32)
    check_op(None, torch_reduce(op, 1, False), fg_reduce(op, 1, False), vals=[v], forward_only=True, device=device)
    check_op(None, torch_reduce(op, None, False), fg_reduce(op, None, False), vals=[v], forward_only=True,
             device=device)


@pytest.mark.parametrize("op", OPS)
def test_reduce_inf(op):
    v = np.array([[np.inf, 1.0], [-np.inf, 2.0], [np.inf, -np.inf]], np.float32)
    check_op(None, torch_reduce(op, 1, False), fg_reduce(op, 1, False), vals=[v], forward_only=True)


def test_sum_large_values():
    v = np.array([3e38, 3e38, -1e38], np.float32)
    check_op(None, lambda x: x.sum(), vals=[v], forward_only=True)  # overflows to inf in float32 like torch
