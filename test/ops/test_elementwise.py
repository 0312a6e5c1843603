"""Elementwise ops against PyTorch: arithmetic (tensor-tensor, tensor-scalar, reversed scalar), unary math, activation
functions, maximum/minimum, comparisons, where, casts, floor division, scalar dtype promotion, NaN/inf propagation."""
import math

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes

from .helpers import DEVICES, check_op


def away_from_zero(shape, seed=1, lo=0.5, hi=2.0):
    """Random floats with |x| in [lo, hi): safe divisors."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(lo, hi, size=shape) * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32)


def positive(shape, seed=2, lo=0.1, hi=3.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)


# ----- tensor-tensor arithmetic with broadcasting -----

BCAST_SHAPES = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((4,), (3, 4)), ((2, 3, 4), (3, 1)), ((), (3,)), ((5,), ()),
                ((), ()), ((1, 1, 1), (2, 3, 4)), ((2, 1, 4), (1, 3, 1))]


@pytest.mark.parametrize("shapes", BCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name,fn", [("add", lambda x, y: x + y), ("sub", lambda x, y: x - y),
                                     ("mul", lambda x, y: x * y)])
def test_binary_broadcast(name, fn, shapes):
    check_op(shapes, fn)


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (3,))], ids=str)
def test_div_broadcast(shapes):
    check_op(None, lambda x, y: x / y, vals=[np.random.default_rng(0).uniform(-2, 2, shapes[0]).astype(np.float32),
                                             away_from_zero(shapes[1])])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,fn", [("add", lambda x, y: x + y), ("sub", lambda x, y: x - y),
                                     ("mul", lambda x, y: x * y), ("div", lambda x, y: x / y)])
def test_binary_small(name, fn, device):
    check_op(None, fn, device=device, vals=[np.random.default_rng(3).uniform(-2, 2, (2, 3)).astype(np.float32),
                                            away_from_zero((1, 3))])


def test_binary_same_input():
    # the same tensor on both sides: gradients from both uses must add up
    check_op([(3, 4)], lambda x: x * x + x - x / 2)


def test_add_method_and_operator_agree():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(Tensor(a).add(Tensor(b)).numpy(), (Tensor(a) + Tensor(b)).numpy())
    np.testing.assert_array_equal(Tensor(a).sub(Tensor(b)).numpy(), a - b)
    np.testing.assert_array_equal(Tensor(a).mul(Tensor(b)).numpy(), a * b)
    np.testing.assert_array_equal(Tensor(a).div(Tensor(b)).numpy(), a / b)


# ----- tensor-scalar, reversed scalar -----

SCALAR_FNS = [
    ("x+2", lambda x: x + 2), ("x+1.5", lambda x: x + 1.5), ("2+x", lambda x: 2 + x), ("x-1.5", lambda x: x - 1.5),
    ("3-x", lambda x: 3 - x), ("0.5-x", lambda x: 0.5 - x), ("x*-3", lambda x: x * -3), ("2.5*x", lambda x: 2.5 * x),
    ("x/4", lambda x: x / 4), ("x/-0.5", lambda x: x / -0.5), ("x*0", lambda x: x * 0), ("x+0", lambda x: x + 0),
    ("x*1", lambda x: x * 1), ("x+True", lambda x: x + True), ("x*False", lambda x: x * False),
]


@pytest.mark.parametrize("name,fn", SCALAR_FNS, ids=[n for n, _ in SCALAR_FNS])
def test_scalar_ops(name, fn):
    check_op([(3, 4)], fn)


@pytest.mark.parametrize("name,fn", [("1/x", lambda x: 1 / x), ("-2/x", lambda x: -2 / x),
                                     ("1.5/x", lambda x: 1.5 / x)])
def test_reversed_scalar_div(name, fn):
    check_op(None, fn, vals=[away_from_zero((3, 4))])


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_ops_small(device):
    check_op([(2, 2)], lambda x: (2 - x) * 3 + x / 2 - 1, device=device)


def test_scalar_on_0d():
    check_op([()], lambda x: 3 * x + 1)


# ----- unary math -----

UNARY = [
    ("neg", lambda x: -x, {}), ("neg_method", lambda x: x.neg(), {}),
    ("exp", lambda x: x.exp(), {}), ("log", lambda x: x.log(), {"low": 0.1, "high": 4}),
    ("sqrt", lambda x: x.sqrt(), {"low": 0.1, "high": 4}), ("relu", lambda x: x.relu(), {}),
    ("sigmoid", lambda x: x.sigmoid(), {"low": -6, "high": 6}), ("tanh", lambda x: x.tanh(), {"low": -4, "high": 4}),
    ("abs", lambda x: x.abs(), {}), ("square", lambda x: x.square(), {}),
    ("reciprocal", lambda x: x.reciprocal(), {"low": 0.5, "high": 2}),
    ("rsqrt", lambda x: x.rsqrt(), {"low": 0.5, "high": 3}), ("exp2", lambda x: x.exp2(), {}),
    ("log2", lambda x: x.log2(), {"low": 0.1, "high": 4}), ("sin", lambda x: x.sin(), {"low": -4, "high": 4}),
    ("cos", lambda x: x.cos(), {"low": -4, "high": 4}),
    # gradient of floor/trunc: see test_floor_trunc_grad_is_zero
    ("floor", lambda x: x.floor(), {"low": -3, "high": 3, "forward_only": True}),
    ("trunc", lambda x: x.trunc(), {"low": -3, "high": 3, "forward_only": True}),
]


@pytest.mark.parametrize("name,fn,kw", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, fn, kw):
    check_op([(4, 5)], fn, **kw)


SMALL_UNARY = ["neg", "exp", "log", "sqrt", "relu", "sigmoid", "tanh"]


@pytest.mark.parametrize("name,fn,kw", [u for u in UNARY if u[0] in SMALL_UNARY], ids=SMALL_UNARY)
def test_unary_python(name, fn, kw):
    check_op([(2, 3)], fn, device="PYTHON", **kw)


@pytest.mark.parametrize("name,fn,kw", [u for u in UNARY if u[0] in SMALL_UNARY], ids=SMALL_UNARY)
def test_unary_0d(name, fn, kw):
    check_op([()], fn, **kw)


def test_unary_chain():
    check_op([(3, 4)], lambda x: ((x * 0.5).exp() + 1).log().sqrt().tanh().sigmoid().relu())


def test_relu_at_zero_and_ties():
    # torch's relu gradient at exactly 0 is 0
    check_op(None, lambda x: x.relu(), vals=[np.array([-1.0, 0.0, 0.0, 2.0, -0.0], np.float32)], upstream="sum")


def test_floor_trunc_exact_integers():
    v = np.array([-2.0, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, -2.5], np.float32)
    check_op(None, lambda x: x.floor(), vals=[v], forward_only=True)
    check_op(None, lambda x: x.trunc(), vals=[v], forward_only=True)


@pytest.mark.parametrize("name", ["floor", "trunc"])
def test_floor_trunc_grad_is_zero(name):
    # torch: x is in the graph, so x.grad is a tensor of zeros (not None)
    check_op(None, lambda x: getattr(x, name)(), vals=[np.array([-1.5, 0.5, 2.0], np.float32)])


@pytest.mark.parametrize("name,fn", [("exp", lambda x: x.exp()), ("sigmoid", lambda x: x.sigmoid()),
                                     ("tanh", lambda x: x.tanh()), ("relu", lambda x: x.relu()),
                                     ("neg", lambda x: -x), ("square", lambda x: x.square())])
def test_unary_large_values(name, fn):
    v = np.array([-100.0, -30.0, -10.0, 0.0, 10.0, 30.0, 87.0, 100.0], np.float32)
    check_op(None, fn, vals=[v], upstream="sum", rtol=1e-5)


def test_int_neg_and_abs():
    v = np.array([-5, -1, 0, 3, 100], np.int32)
    check_op(None, lambda x: -x, vals=[v])
    check_op(None, lambda x: x.abs(), vals=[v])


def test_int_unary_promotes_to_float():
    # torch: exp/sqrt/log/sigmoid/tanh of an int tensor give float32
    v = np.array([1, 2, 3, 4], np.int32)
    for fn in [lambda x: x.exp(), lambda x: x.sqrt(), lambda x: x.log(), lambda x: x.sigmoid(), lambda x: x.tanh(),
               lambda x: x.reciprocal()]:
        check_op(None, fn, vals=[v])


# ----- NaN / inf propagation -----

SPECIAL = np.array([0.0, -0.0, -1.0, 1.0, np.inf, -np.inf, np.nan, 1e-30, 3e38], np.float32)


@pytest.mark.parametrize("name,fn", [
    ("exp", lambda x: x.exp()), ("log", lambda x: x.log()), ("sqrt", lambda x: x.sqrt()), ("relu", lambda x: x.relu()),
    ("neg", lambda x: -x), ("sigmoid", lambda x: x.sigmoid()), ("tanh", lambda x: x.tanh()),
    ("reciprocal", lambda x: x.reciprocal()), ("log2", lambda x: x.log2()), ("exp2", lambda x: x.exp2()),
    ("x*2", lambda x: x * 2), ("x+1", lambda x: x + 1),
])
def test_special_values(name, fn):
    check_op(None, fn, vals=[SPECIAL], forward_only=True, rtol=1e-5)


def test_log_of_zero_and_negative():
    v = np.array([0.0, -1.0, -0.0, 1.0], np.float32)
    out = Tensor(v).log().numpy()
    assert out[0] == -np.inf and np.isnan(out[1]) and out[2] == -np.inf and out[3] == 0.0
    check_op(None, lambda x: x.log(), vals=[v], forward_only=True)


def test_sqrt_of_negative_is_nan():
    check_op(None, lambda x: x.sqrt(), vals=[np.array([-4.0, -1e-3, 0.0, 4.0], np.float32)], forward_only=True)
    assert np.isnan(Tensor([-1.0]).sqrt().numpy()[0])


def test_exp_overflow_is_inf():
    out = Tensor(np.array([89.0, 200.0, -200.0], np.float32)).exp().numpy()
    assert out[0] == np.inf and out[1] == np.inf and out[2] == 0.0


@pytest.mark.parametrize("name,fn", [("log", lambda x: x.log()), ("sqrt", lambda x: x.sqrt()),
                                     ("reciprocal", lambda x: 1 / x)])
def test_grad_at_zero_is_inf(name, fn):
    # torch: d/dx log(x), sqrt(x), 1/x at x=0 are +inf / -inf (upstream gradient 1)
    check_op(None, fn, vals=[np.array([0.0, 1.0, 4.0], np.float32)], upstream="sum")


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates_through_arith(device):
    v = np.array([np.nan, 1.0, np.inf, -np.inf], np.float32)
    w = np.array([1.0, np.nan, -np.inf, -np.inf], np.float32)
    for fn in [lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y, lambda x, y: x / y]:
        check_op(None, fn, vals=[v, w], forward_only=True, device=device)


def test_inf_times_zero_is_nan():
    check_op(None, lambda x, y: x * y, vals=[np.array([np.inf, -np.inf, 0.0], np.float32),
                                             np.array([0.0, 0.0, np.inf], np.float32)], forward_only=True)


# ----- maximum / minimum -----

@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (4,)), ((), (2, 3))], ids=str)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum(name, shapes):
    check_op(shapes, lambda x, y: getattr(torch, name)(x, y), lambda x, y: getattr(x, name)(y))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_ties(name, device):
    # equal elements: torch splits the gradient evenly between the two inputs
    a = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 5.0]], np.float32)
    b = np.array([[1.0, 0.0, 4.0], [0.0, -1.0, 2.0]], np.float32)
    check_op(None, lambda x, y: getattr(torch, name)(x, y), lambda x, y: getattr(x, name)(y), vals=[a, b],
             device=device)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
@pytest.mark.parametrize("scalar", [0, 0.5, -1])
def test_maximum_minimum_scalar(name, scalar):
    check_op([(3, 4)], lambda x: getattr(torch, name)(x, torch.tensor(scalar, dtype=x.dtype)),
             lambda x: getattr(x, name)(scalar))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_nan(name, device):
    # torch.maximum / torch.minimum propagate NaN from either side
    a = np.array([np.nan, 1.0, np.nan, 2.0, np.inf], np.float32)
    b = np.array([0.0, np.nan, np.nan, -np.inf, 1.0], np.float32)
    check_op(None, lambda x, y: getattr(torch, name)(x, y), lambda x, y: getattr(x, name)(y), vals=[a, b],
             forward_only=True, device=device)


@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_int(name):
    check_op([(3, 4), (3, 4)], lambda x, y: getattr(torch, name)(x, y), lambda x, y: getattr(x, name)(y),
             dtype=np.int32, low=-10, high=10)


# ----- comparisons -----

CMPS = [("lt", lambda x, y: x < y), ("le", lambda x, y: x <= y), ("gt", lambda x, y: x > y),
        ("ge", lambda x, y: x >= y), ("eq", lambda x, y: x == y), ("ne", lambda x, y: x != y)]


@pytest.mark.parametrize("name,fn", CMPS, ids=[c[0] for c in CMPS])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_compare_tensor(name, fn, dtype):
    # small integer-valued inputs so that ties (equal elements) happen often
    check_op(None, fn, vals=[
        np.random.default_rng(5).integers(-2, 3, (4, 5)).astype(dtype),
        np.random.default_rng(6).integers(-2, 3, (4, 5)).astype(dtype)])


@pytest.mark.parametrize("name,fn", CMPS, ids=[c[0] for c in CMPS])
def test_compare_broadcast_and_scalar(name, fn):
    v = np.array([[-1.0, 0.0, 1.0, 2.0]], np.float32)
    check_op(None, fn, vals=[v, np.array([[0.0], [1.0], [2.0]], np.float32)])
    check_op(None, lambda x: fn(x, 1.0), vals=[v])
    check_op(None, lambda x: fn(x, 1), vals=[v])
    check_op(None, lambda x: fn(1.0, x), vals=[v])


@pytest.mark.parametrize("name,fn", CMPS, ids=[c[0] for c in CMPS])
def test_compare_nan(name, fn):
    # every ordered comparison with NaN is False, != is True
    a = np.array([np.nan, np.nan, 1.0, np.inf, -np.inf, 0.0], np.float32)
    b = np.array([1.0, np.nan, np.nan, np.inf, np.inf, -0.0], np.float32)
    check_op(None, fn, vals=[a, b])


@pytest.mark.parametrize("name,fn", CMPS, ids=[c[0] for c in CMPS])
def test_compare_python(name, fn):
    check_op(None, fn, device="PYTHON", vals=[np.array([[1.0, 2.0], [3.0, 4.0]], np.float32),
                                              np.array([2.0, 2.0], np.float32)])


def test_compare_bool_tensors():
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    for _, fn in CMPS:
        check_op(None, fn, vals=[a, b])


def test_compare_method_names():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    check_op(None, lambda x: x.eq(2.0), vals=[a])
    check_op(None, lambda x: x.ne(2.0), vals=[a])


# ----- where -----

@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), (3, 4)), ((4,), (3, 4), ()),
                                    ((2, 3, 1), (3, 4), (1, 4))], ids=str)
def test_where(shapes):
    rng = np.random.default_rng(7)
    c = rng.random(shapes[0]) < 0.5
    x, y = rng.uniform(-2, 2, shapes[1]).astype(np.float32), rng.uniform(-2, 2, shapes[2]).astype(np.float32)
    check_op(None, lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y), vals=[c, x, y])


@pytest.mark.parametrize("device", DEVICES)
def test_where_scalar_branches(device):
    c = np.array([[True, False], [False, True]])
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    check_op(None, lambda c, x: torch.where(c, x, 0.0), lambda c, x: c.where(x, 0.0), vals=[c, x], device=device)
    check_op(None, lambda c, x: torch.where(c, -1.5, x), lambda c, x: c.where(-1.5, x), vals=[c, x], device=device)
    check_op(None, lambda c: torch.where(c, 1.0, 2.0), lambda c: c.where(1.0, 2.0), vals=[c], device=device)
    # Python ints make torch's default int64 and fusegrad's default int32
    check_op(None, lambda c: torch.where(c, 3, -4), lambda c: c.where(3, -4), vals=[c], device=device,
             out_dtype="int32")


def test_where_from_comparison():
    check_op([(3, 4), (3, 4)], lambda x, y: torch.where(x > y, x * 2, y - 1), lambda x, y: (x > y).where(x * 2, y - 1))


def test_where_int_branches():
    c = np.array([True, False, True])
    check_op(None, lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y),
             vals=[c, np.array([1, 2, 3], np.int32), np.array([-1, -2, -3], np.int32)])


def test_where_nan_in_unselected_branch():
    # NaN in the branch that is not selected must not leak into the value
    c = np.array([True, False])
    check_op(None, lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y),
             vals=[c, np.array([1.0, np.nan], np.float32), np.array([np.nan, 2.0], np.float32)])


# ----- cast -----

CAST_INPUT = np.array([-2.7, -1.5, -1.0, -0.5, -0.0, 0.0, 0.3, 1.0, 1.5, 2.9, 100.4], np.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("float32", "bool"), ("float32", "int64"),
                                     ("float32", "float64"), ("int32", "float32"), ("int32", "bool"),
                                     ("bool", "float32"), ("bool", "int32"), ("int32", "int64"), ("int64", "int32"),
                                     ("float32", "uint8"), ("int32", "int8"), ("float64", "float32")])
def test_cast(src, dst, device):
    if src.startswith("float"): v = CAST_INPUT.astype(src)
    elif src == "bool": v = np.array([True, False, True, False])
    else: v = np.array([-3, -1, 0, 1, 2, 7, 127], src)
    if dst == "uint8": v = np.abs(v)  # float -> uint8 of negative values is undefined in C and in torch
    check_op(None, lambda x: x.to(getattr(torch, dst)), lambda x: x.cast(dst), vals=[v], device=device)


@pytest.mark.parametrize("name", ["float", "int", "long", "bool", "double", "half"])
def test_cast_methods(name):
    v = np.array([-1.5, 0.0, 2.25, 3.0], np.float32)
    check_op(None, lambda x: getattr(x, name)(), vals=[v], forward_only=True)


def test_cast_by_dtype_object():
    v = np.array([1.7, -2.2], np.float32)
    check_op(None, lambda x: x.to(torch.int32), lambda x: x.cast(dtypes.int32), vals=[v])


def test_cast_same_dtype_is_noop_with_grad():
    check_op([(3,)], lambda x: x.float() * 2)


def test_cast_gradient_float64():
    # gradient flows through a float cast (and comes back in the input dtype)
    check_op([(3, 4)], lambda x: x.double() * 3, lambda x: x.double() * 3)
    check_op([(3, 4)], lambda x: (x.half() * 2).float(), rtol=1e-2, grad_rtol=1e-2, atol=1e-2)


def test_cast_to_int_stops_gradient():
    x = Tensor(np.array([1.5, 2.5], np.float32), requires_grad=True)
    y = x * x.int().float()
    y.sum().backward()
    # torch: d/dx (x * int(x)) = int(x); no gradient through the cast to int
    xt = torch.tensor([1.5, 2.5], requires_grad=True)
    (xt * xt.int().float()).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())


# ----- floor division -----

@pytest.mark.parametrize("device", DEVICES)
def test_floordiv_int_signs(device):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 1, -1, 9], np.int32)
    b = np.array([2, 2, -2, -2, 3, 3, 5, -3, 3, -9], np.int32)
    check_op(None, lambda x, y: x // y, vals=[a, b], device=device)


def test_floordiv_int_random():
    rng = np.random.default_rng(11)
    a = rng.integers(-50, 50, (6, 7)).astype(np.int32)
    b = rng.integers(1, 9, (6, 7)).astype(np.int32) * rng.choice([-1, 1], (6, 7)).astype(np.int32)
    check_op(None, lambda x, y: x // y, vals=[a, b])


@pytest.mark.parametrize("k", [2, 3, -2, -3, 1, -1])
def test_floordiv_int_scalar(k):
    check_op(None, lambda x: x // k, vals=[np.arange(-7, 8, dtype=np.int32)])


@pytest.mark.parametrize("k", [7, -7, 0])
def test_rfloordiv_int_scalar(k):
    check_op(None, lambda x: k // x, vals=[np.array([-3, -2, -1, 1, 2, 3, 4], np.int32)])


def test_floordiv_int64_and_broadcast():
    check_op(None, lambda x, y: x // y, vals=[np.arange(-6, 6, dtype=np.int64).reshape(3, 4),
                                              np.array([[2], [-3], [5]], np.int64)])


def test_floordiv_float():
    # float // is floor(a / b)
    check_op(None, lambda x, y: x // y, vals=[np.array([7.5, -7.5, 7.0, -1.0, 0.5], np.float32),
                                              np.array([2.0, 2.0, -2.0, 3.0, -0.25], np.float32)], forward_only=True)


# ----- dtype promotion with Python scalars and mixed tensors -----

PROMO = [
    ("int+1", np.int32, lambda x: x + 1), ("int*1.5", np.int32, lambda x: x * 1.5),
    ("int-2", np.int32, lambda x: x - 2), ("1-int", np.int32, lambda x: 1 - x), ("int*-3", np.int32, lambda x: x * -3),
    ("int/2", np.int32, lambda x: x / 2), ("int+0.5", np.int32, lambda x: x + 0.5),
    ("2.5*int", np.int32, lambda x: 2.5 * x), ("int+True", np.int32, lambda x: x + True),
    ("int64+1", np.int64, lambda x: x + 1), ("int64*0.5", np.int64, lambda x: x * 0.5),
    ("int8+1", np.int8, lambda x: x + 1), ("uint8*2", np.uint8, lambda x: x * 2),
    ("uint8+1.5", np.uint8, lambda x: x + 1.5), ("bool*1.5", np.bool_, lambda x: x * 1.5),
    ("float64*2", np.float64, lambda x: x * 2), ("float64+1.5", np.float64, lambda x: x + 1.5),
    ("float16*2.5", np.float16, lambda x: x * 2.5), ("float16+1", np.float16, lambda x: x + 1),
]


@pytest.mark.parametrize("name,dtype,fn", PROMO, ids=[p[0] for p in PROMO])
def test_scalar_promotion(name, dtype, fn):
    v = np.array([0, 1, 2, 3, 5], dtype) if dtype != np.bool_ else np.array([True, False, True])
    check_op(None, fn, vals=[v], atol=1e-3 if dtype == np.float16 else 1e-6)


PAIRS = [("bool", "int32"), ("int32", "float32"), ("int32", "int64"), ("int8", "uint8"), ("float32", "float64"),
         ("bool", "float32"), ("uint8", "int32"), ("int64", "float32"), ("float16", "float32"), ("bool", "bool")]


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_tensor_promotion(a, b):
    def arr(dt):
        return np.array([True, False, True]) if dt == "bool" else np.array([1, 2, 3], dt)
    check_op(None, lambda x, y: x + y, vals=[arr(a), arr(b)])
    check_op(None, lambda x, y: x * y, vals=[arr(b), arr(a)])


def test_bool_ops():
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    check_op(None, lambda x, y: x & y, vals=[a, b])
    check_op(None, lambda x, y: x | y, vals=[a, b])
    check_op(None, lambda x, y: x ^ y, vals=[a, b])
    check_op(None, lambda x, y: x + y, vals=[a, b])  # bool + bool stays bool (logical or) in torch
    check_op(None, lambda x, y: x * y, vals=[a, b])
    check_op(None, lambda x: x.logical_not(), vals=[a])


def test_int_bitwise():
    a, b = np.array([12, -5, 7, 0], np.int32), np.array([10, 3, -1, 9], np.int32)
    for fn in [lambda x, y: x & y, lambda x, y: x | y, lambda x, y: x ^ y]:
        check_op(None, fn, vals=[a, b])
    check_op(None, lambda x: x << 2, vals=[np.array([1, 3, 5], np.int32)])
    check_op(None, lambda x: x >> 1, vals=[np.array([8, 3, 5], np.int32)])


def test_int_arith_exact():
    rng = np.random.default_rng(12)
    a, b = rng.integers(-1000, 1000, (5, 6)).astype(np.int32), rng.integers(-1000, 1000, (5, 6)).astype(np.int32)
    for fn in [lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y, lambda x, y: x / y]:
        check_op(None, fn, vals=[a, np.where(b == 0, 1, b).astype(np.int32)])


def test_int32_overflow_wraps():
    a = np.array([2 ** 31 - 1, -2 ** 31, 65536], np.int32)
    check_op(None, lambda x: x + 1, vals=[a])
    check_op(None, lambda x: x * 65536, vals=[a])


# ----- non-contiguous inputs to elementwise ops -----

@pytest.mark.parametrize("name,view", [
    ("permute", lambda x: x.permute(1, 0)), ("flip", lambda x: x.flip(0)), ("T", lambda x: x.T),
    ("slice_step", lambda x: x[::2, 1:]),
])
def test_elementwise_on_views(name, view):
    check_op([(4, 6)], lambda x: view(x).exp() * view(x) + 1)


def test_elementwise_on_padded_view():
    check_op([(3, 4)], lambda x: torch.nn.functional.pad(x, (1, 1, 2, 0), value=0.5).sigmoid() * 2,
             lambda x: x.pad((1, 1, 2, 0), value=0.5).sigmoid() * 2)


def test_elementwise_view_and_base_mixed():
    check_op([(4, 4)], lambda x: x * x.T + x.flip(1) - x.permute(1, 0).flip(0))


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_on_expanded(device):
    check_op([(1, 3), (2, 1)], lambda x, y: x.expand(2, 3) * y.expand(2, 3).exp(), device=device)


# ----- empty tensors -----

@pytest.mark.parametrize("shapes", [((0,), (0,)), ((0, 4), (1, 4)), ((2, 0, 3), (3,))], ids=str)
def test_elementwise_empty(shapes):
    check_op(shapes, lambda x, y: (x * y + 1).exp())


def test_unary_empty():
    check_op([(0, 3)], lambda x: x.relu().sqrt() - x)
