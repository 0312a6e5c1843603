"""Extended reductions against PyTorch: prod, any/all, isclose/allclose, var/std (+ _mean variants), the softmax family,
logsumexp/logcumsumexp, argmax/argmin, scans (cumsum/cumprod/cummax/cummin), sort/argsort and topk.

fusegrad's deliberate differences from torch are asserted as such: index results (argmax, sort, topk) are int32, and
int sums/products/scans accumulate in int32 (torch: int64)."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor

from .helpers import check_op


def rand(shape, lo=-2, hi=2, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def ints_as_float(shape, lo=-2, hi=3, seed=0):
    """Small integer-valued floats: lots of ties."""
    return np.random.default_rng(seed).integers(lo, hi, size=shape).astype(np.float32)


AXES_KEEP = [(None, False), (0, False), (1, True), (-1, False), (2, True), (-3, True)]

# ----- prod -----


@pytest.mark.parametrize("axis,keepdim", AXES_KEEP, ids=str)
def test_prod(axis, keepdim):
    x = rand((2, 3, 4), 0.5, 1.5, 1) * np.random.default_rng(2).choice([-1, 1], (2, 3, 4)).astype(np.float32)
    tf = (lambda t: torch.prod(t)) if axis is None else (lambda t: torch.prod(t, axis, keepdim=keepdim))
    if axis is None and keepdim: tf = lambda t: torch.prod(t).reshape(1, 1, 1)
    check_op(None, tf, lambda t: t.prod(axis, keepdim=keepdim), vals=[x])


def test_prod_multi_axis():
    x = rand((2, 3, 4), 0.5, 1.5, 3)
    check_op(None, lambda t: t.prod(2).prod(0), lambda t: t.prod((0, 2)), vals=[x])


def test_prod_with_zeros_grad():
    # torch's prod gradient handles zeros exactly: one zero -> only that position gets a nonzero grad
    x = np.array([[1.5, 0.0, 2.0], [0.0, 0.0, 3.0], [1.0, -2.0, 0.5]], np.float32)
    check_op(None, lambda t: torch.prod(t, 1), lambda t: t.prod(1), vals=[x])


def test_prod_all_with_zero_grad():
    check_op(None, torch.prod, lambda t: t.prod(), vals=[np.array([2.0, 0.0, 3.0, -1.0], np.float32)])


@pytest.mark.parametrize("npdt,want", [("int32", "int32"), ("int8", "int32"), ("int64", "int64"), ("bool", "int32"),
                                       ("uint8", "uint32")])
def test_prod_int(npdt, want):
    # fusegrad's int products accumulate in int32 (uint32 for unsigned), torch's in int64
    v = np.random.default_rng(0).integers(0 if npdt in ("bool", "uint8") else -3, 2 if npdt == "bool" else 4,
                                          (3, 4)).astype(npdt)
    check_op(None, lambda t: torch.prod(t, 1), lambda t: t.prod(1), vals=[v], out_dtype=want)


def test_prod_dtype_arg():
    check_op(None, lambda t: torch.prod(t, 0, dtype=torch.float64), lambda t: t.prod(0, dtype="float64"),
             vals=[rand((3, 4), 0.5, 1.5)])


def test_prod_empty_and_0d():
    check_op([(0, 3)], lambda t: torch.prod(t, 0), lambda t: t.prod(0))
    check_op([(3, 0)], lambda t: torch.prod(t), lambda t: t.prod())
    check_op([()], torch.prod, lambda t: t.prod())


def test_empty_reduce_fused_with_other_inputs():
    # a reduce over an empty axis (and the gradient of an empty slice) in a kernel that also reads other buffers:
    # the empty source must not be read, nor shift the other inputs' buffers
    check_op([(2, 0), (2,)], lambda a, b: a.sum(1) + b)
    check_op([(2, 0), (2,)], lambda a, b: b * a.prod(1))
    check_op([(2, 3), (2, 3)], lambda a, b: a[:, 1:1].sum(1) + (a * b).sum(1))


def test_prod_noncontiguous_python():
    check_op(None, lambda t: torch.prod(t.T.flip(0), 1), lambda t: t.T.flip(0).prod(1), vals=[rand((2, 3), 0.5, 2)],
             device="PYTHON")


# ----- any / all -----

@pytest.mark.parametrize("name", ["any", "all"])
@pytest.mark.parametrize("axis,keepdim", AXES_KEEP, ids=str)
def test_any_all(name, axis, keepdim):
    v = np.random.default_rng(1).random((2, 3, 4)) < 0.7
    tf = (lambda t: getattr(torch, name)(t)) if axis is None else (lambda t: getattr(torch, name)(t, axis, keepdim))
    if axis is None and keepdim: tf = lambda t: getattr(torch, name)(t).reshape(1, 1, 1)
    check_op(None, tf, lambda t: getattr(t, name)(axis, keepdim), vals=[v])


@pytest.mark.parametrize("name", ["any", "all"])
@pytest.mark.parametrize("npdt", ["float32", "int32", "uint8"])
def test_any_all_non_bool(name, npdt):
    # torch keeps uint8 for uint8 inputs (a legacy quirk); fusegrad always returns bool
    v = np.array([[0, 1, 2], [0, 0, 0], [3, 4, 5]], npdt)
    check_op(None, lambda t: getattr(torch, name)(t, 1), lambda t: getattr(t, name)(1), vals=[v], forward_only=True,
             out_dtype="bool")
    check_op(None, lambda t: getattr(torch, name)(t), lambda t: getattr(t, name)(), vals=[v], forward_only=True,
             out_dtype="bool")


@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all_nan_and_empty(name):
    check_op(None, getattr(torch, name), lambda t: getattr(t, name)(), vals=[np.array([np.nan, 0.0], np.float32)],
             forward_only=True)
    check_op([(0,)], getattr(torch, name), lambda t: getattr(t, name)(), dtype=np.bool_)
    check_op([(2, 0)], lambda t: getattr(torch, name)(t, 1), lambda t: getattr(t, name)(1), dtype=np.bool_)


@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all_python(name):
    v = np.array([[True, False], [True, True]])
    check_op(None, lambda t: getattr(torch, name)(t, 0), lambda t: getattr(t, name)(0), vals=[v], device="PYTHON")


# ----- isclose / allclose -----

@pytest.mark.parametrize("rtol,atol,equal_nan", [(1e-5, 1e-8, False), (1e-2, 0.0, False), (0.0, 0.1, True),
                                                 (1e-3, 1e-3, True)], ids=str)
def test_isclose(rtol, atol, equal_nan):
    a = np.array([1.0, 1.0, 1.0, 0.0, np.nan, np.nan, 100.0, -1.0, 2.0], np.float32)
    b = np.array([1.0, 1.00001, 1.05, 0.05, np.nan, 1.0, 100.5, -1.0005, -2.0], np.float32)
    check_op(None, lambda x, y: torch.isclose(x, y, rtol, atol, equal_nan),
             lambda x, y: x.isclose(y, rtol, atol, equal_nan), vals=[a, b], forward_only=True)


def test_isclose_inf():
    # +inf only matches +inf; -inf vs +inf is never close (the difference is inf, not <= atol + rtol*inf)
    a = np.array([np.inf, np.inf, -np.inf, -np.inf, 1.0], np.float32)
    b = np.array([np.inf, -np.inf, -np.inf, np.inf, np.inf], np.float32)
    check_op(None, torch.isclose, lambda x, y: x.isclose(y), vals=[a, b], forward_only=True)


def test_isclose_broadcast():
    check_op([(3, 1), (4,)], lambda x, y: torch.isclose(x, y, atol=0.5), lambda x, y: x.isclose(y, atol=0.5),
             forward_only=True)


def test_allclose():
    a = Tensor([1.0, 2.0, 3.0])
    assert a.allclose(Tensor([1.0, 2.0, 3.0000001])) is True
    assert a.allclose(Tensor([1.0, 2.0, 3.1])) is False
    assert a.allclose(Tensor([1.0, 2.0, 3.1]), atol=0.2) is True
    assert Tensor([np.nan]).allclose(Tensor([np.nan])) is False
    assert Tensor([np.nan]).allclose(Tensor([np.nan]), equal_nan=True) is True
    for x, y in [([1.0, 2.0], [1.0, 2.001]), ([0.0], [1e-9])]:
        assert Tensor(x).allclose(Tensor(y)) == torch.allclose(torch.tensor(x), torch.tensor(y))


# ----- var / std -----

VAR_ARGS = [(None, False, 1), (None, False, 0), (0, False, 1), (1, True, 0), (-1, False, 1), ((0, 2), True, 1),
            ((1, 2), False, 0), (2, True, 2)]


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("axis,keepdim,correction", VAR_ARGS, ids=str)
def test_var_std(name, axis, keepdim, correction):
    check_op([(2, 3, 4)], lambda t: getattr(torch, name)(t, axis, correction=correction, keepdim=keepdim),
             lambda t: getattr(t, name)(axis, keepdim, correction))


@pytest.mark.parametrize("name", ["var_mean", "std_mean"])
@pytest.mark.parametrize("axis,keepdim,correction", VAR_ARGS[:5], ids=str)
def test_var_std_mean(name, axis, keepdim, correction):
    def tf(t):
        a, b = getattr(torch, name)(t, axis, correction=correction, keepdim=keepdim)
        return torch.stack([a, b])

    def ff(t):
        a, b = getattr(t, name)(axis, keepdim, correction)
        return Tensor.stack(a, b)
    check_op([(3, 4, 2)], tf, ff)


def test_var_too_few_elements():
    # n - correction <= 0: torch gives NaN (with a warning) or inf
    check_op([(1, 3)], lambda t: torch.var(t, 0), lambda t: t.var(0), forward_only=True)
    check_op([(1,)], lambda t: torch.std(t), lambda t: t.std(), forward_only=True)


def test_var_int_input():
    check_op(None, lambda t: torch.var(t.float(), 1), lambda t: t.var(1),
             vals=[np.array([[1, 2, 3, 4], [5, 5, 5, 5]], np.int32)], out_dtype="float32")


def test_var_constant_and_python():
    check_op(None, lambda t: torch.var(t, 0), lambda t: t.var(0), vals=[np.full((4, 3), 2.5, np.float32)])
    check_op([(2, 3)], lambda t: torch.std(t, 1, keepdim=True), lambda t: t.std(1, keepdim=True), device="PYTHON")


# ----- softmax family -----

SOFTMAX = [("softmax", torch.softmax, lambda t, a: t.softmax(a)),
           ("log_softmax", torch.log_softmax, lambda t, a: t.log_softmax(a)),
           ("softmin", lambda t, a: torch.nn.functional.softmin(t, a), lambda t, a: t.softmin(a))]


@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("name,tf,ff", SOFTMAX, ids=[s[0] for s in SOFTMAX])
def test_softmax_family(name, tf, ff, axis):
    check_op([(2, 3, 4)], lambda t: tf(t, axis), lambda t: ff(t, axis), low=-4, high=4)


@pytest.mark.parametrize("name,tf,ff", SOFTMAX, ids=[s[0] for s in SOFTMAX])
def test_softmax_family_large_values(name, tf, ff):
    v = np.array([[1000.0, 0.0, -1000.0], [-50.0, -50.0, -50.0], [88.0, 89.0, 90.0]], np.float32)
    check_op(None, lambda t: tf(t, -1), lambda t: ff(t, -1), vals=[v], atol=1e-5)


@pytest.mark.parametrize("name,tf,ff", SOFTMAX, ids=[s[0] for s in SOFTMAX])
def test_softmax_family_neg_inf(name, tf, ff):
    v = np.array([[-np.inf, 0.0, 1.0], [2.0, -np.inf, -np.inf]], np.float32)
    if name == "softmin": v = -v
    check_op(None, lambda t: tf(t, -1), lambda t: ff(t, -1), vals=[v], forward_only=True)


@pytest.mark.parametrize("name,tf,ff", SOFTMAX, ids=[s[0] for s in SOFTMAX])
def test_softmax_family_python_and_0d(name, tf, ff):
    check_op([(2, 3)], lambda t: tf(t, 1), lambda t: ff(t, 1), device="PYTHON")
    check_op([()], lambda t: tf(t, 0), lambda t: ff(t, 0))


def test_softmax_dtype_and_int_input():
    check_op([(3, 4)], lambda t: torch.softmax(t, -1, dtype=torch.float64), lambda t: t.softmax(-1, dtype="float64"))
    check_op(None, lambda t: torch.softmax(t.float(), -1), lambda t: t.softmax(-1),
             vals=[np.array([[1, 2, 3], [0, 0, 5]], np.int32)], out_dtype="float32")


def test_softmax_noncontiguous_and_empty():
    check_op([(4, 3)], lambda t: torch.softmax(t.T.flip(1), 0), lambda t: t.T.flip(1).softmax(0))
    check_op([(0, 3)], lambda t: torch.log_softmax(t, 1), lambda t: t.log_softmax(1))


@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, False), (1, True), (-1, False), ((0, 2), True),
                                          ((1, 2), False)], ids=str)
def test_logsumexp(axis, keepdim):
    ax = tuple(range(3)) if axis is None else axis
    tf = lambda t: torch.logsumexp(t, ax, keepdim=keepdim)
    check_op([(2, 3, 4)], tf, lambda t: t.logsumexp(axis, keepdim), low=-5, high=5)


def test_logsumexp_extremes():
    v = np.array([[1000.0, 1000.0], [-1000.0, -1001.0], [-np.inf, -np.inf], [np.inf, 1.0], [-np.inf, 3.0]], np.float32)
    check_op(None, lambda t: torch.logsumexp(t, 1), lambda t: t.logsumexp(1), vals=[v], forward_only=True)
    check_op(None, lambda t: torch.logsumexp(t, 1), lambda t: t.logsumexp(1), vals=[v[:2]])


def test_logsumexp_python():
    check_op([(2, 3)], lambda t: torch.logsumexp(t, 0), lambda t: t.logsumexp(0), device="PYTHON")


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_logcumsumexp(axis):
    check_op([(3, 4)], lambda t: torch.logcumsumexp(t, axis), lambda t: t.logcumsumexp(axis), low=-5, high=5)


def test_logcumsumexp_extremes():
    v = np.array([[-np.inf, 0.0, -np.inf, 2.0], [500.0, 501.0, -500.0, 502.0]], np.float32)
    check_op(None, lambda t: torch.logcumsumexp(t, 1), lambda t: t.logcumsumexp(1), vals=[v], forward_only=True,
             atol=1e-5)


def test_logcumsumexp_wide_range():
    # values far below the row max must not underflow to -inf (torch keeps them exact)
    v = np.array([[-200.0, -150.0, 0.0, 100.0]], np.float32)
    check_op(None, lambda t: torch.logcumsumexp(t, 1), lambda t: t.logcumsumexp(1), vals=[v], forward_only=True,
             atol=1e-5)


# ----- argmax / argmin -----

@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis,keepdim", AXES_KEEP, ids=str)
def test_argmax_argmin(name, axis, keepdim):
    tf = lambda t: getattr(torch, name)(t, axis, keepdim=keepdim)
    check_op([(2, 3, 4)], tf, lambda t: getattr(t, name)(axis, keepdim), out_dtype="int32")


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_argmax_argmin_ties_first_index(name, axis):
    v = ints_as_float((5, 6), -1, 2, seed=4)
    check_op(None, lambda t: getattr(torch, name)(t, axis), lambda t: getattr(t, name)(axis), vals=[v],
             out_dtype="int32")
    check_op(None, lambda t: getattr(torch, name)(t, axis), lambda t: getattr(t, name)(axis),
             vals=[np.zeros((3, 4), np.float32)], out_dtype="int32")


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("npdt", ["int32", "int8", "uint8", "int64", "bool", "float16", "float64"])
def test_argmax_argmin_dtypes(name, npdt):
    if npdt == "bool": v = np.random.default_rng(1).random((4, 5)) < 0.5
    else: v = np.random.default_rng(1).integers(0 if npdt == "uint8" else -5, 250 if npdt == "uint8" else 5,
                                                (4, 5)).astype(npdt)
    # torch has no argmax/argmin for bool: compare with its uint8 result
    cv = (lambda t: t.to(torch.uint8)) if npdt == "bool" else (lambda t: t)
    check_op(None, lambda t: getattr(torch, name)(cv(t), 1), lambda t: getattr(t, name)(1), vals=[v], out_dtype="int32")
    check_op(None, lambda t: getattr(torch, name)(cv(t)), lambda t: getattr(t, name)(), vals=[v], out_dtype="int32")


def test_argmax_argmin_extreme_ints():
    v = np.array([[0, 255, 255, 3], [0, 0, 0, 0]], np.uint8)
    check_op(None, lambda t: torch.argmin(t, 1), lambda t: t.argmin(1), vals=[v], out_dtype="int32")
    check_op(None, lambda t: torch.argmax(t, 1), lambda t: t.argmax(1), vals=[v], out_dtype="int32")
    w = np.array([[-2 ** 31, 2 ** 31 - 1, 5], [7, -2 ** 31, -2 ** 31]], np.int32)
    check_op(None, lambda t: torch.argmin(t, 1), lambda t: t.argmin(1), vals=[w], out_dtype="int32")
    check_op(None, lambda t: torch.argmax(t, 1), lambda t: t.argmax(1), vals=[w], out_dtype="int32")


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_nan_inf(name):
    v = np.array([[1.0, np.nan, 3.0, np.nan], [np.inf, -np.inf, np.inf, 0.0], [-np.inf, -np.inf, 2.0, -np.inf]],
                 np.float32)
    check_op(None, lambda t: getattr(torch, name)(t, 1), lambda t: getattr(t, name)(1), vals=[v], out_dtype="int32")


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_python_noncontig_0d(name):
    check_op(None, lambda t: getattr(torch, name)(t, 0), lambda t: getattr(t, name)(0),
             vals=[ints_as_float((3, 2), seed=2)], device="PYTHON", out_dtype="int32")
    check_op([(3, 4)], lambda t: getattr(torch, name)(t.T.flip(0), 1), lambda t: getattr(t.T.flip(0), name)(1),
             out_dtype="int32")
    check_op([()], lambda t: getattr(torch, name)(t), lambda t: getattr(t, name)(), out_dtype="int32")


def test_argmax_empty_raises():
    with pytest.raises((IndexError, RuntimeError)):
        Tensor.zeros(0, 3).argmax(0)


# ----- scans -----

SCANS = [("cumsum", lambda t, a: torch.cumsum(t, a), lambda t, a: t.cumsum(a)),
         ("cumprod", lambda t, a: torch.cumprod(t, a), lambda t, a: t.cumprod(a)),
         ("cummax", lambda t, a: torch.cummax(t, a).values, lambda t, a: t.cummax(a)[0]),
         ("cummin", lambda t, a: torch.cummin(t, a).values, lambda t, a: t.cummin(a)[0])]


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("name,tf,ff", SCANS, ids=[s[0] for s in SCANS])
def test_scans(name, tf, ff, axis):
    lo, hi = (0.5, 1.5) if name == "cumprod" else (-2, 2)
    check_op([(2, 3, 4)], lambda t: tf(t, axis), lambda t: ff(t, axis), low=lo, high=hi)


@pytest.mark.parametrize("name,tf,ff", SCANS, ids=[s[0] for s in SCANS])
def test_scans_long_axis(name, tf, ff):
    x = rand((2, 40), 0.9, 1.1, 3) if name == "cumprod" else rand((2, 40), -2, 2, 3)
    check_op(None, lambda t: tf(t, 1), lambda t: ff(t, 1), vals=[x], atol=1e-5)


@pytest.mark.parametrize("name,tf,ff", SCANS, ids=[s[0] for s in SCANS])
@pytest.mark.parametrize("npdt", ["int32", "int8", "uint8", "int64"])
def test_scans_int(name, tf, ff, npdt):
    v = np.random.default_rng(2).integers(0 if npdt == "uint8" else -3, 4, (3, 5)).astype(npdt)
    # like sum() and prod(), cumsum/cumprod accumulate small ints in int32 (uint32 for unsigned; int64 stays) in
    # fusegrad; torch always gives int64. cummax/cummin keep the dtype in both.
    want = None
    if name in ("cumsum", "cumprod") and npdt != "int64": want = "uint32" if npdt == "uint8" else "int32"
    check_op(None, lambda t: tf(t, 1), lambda t: ff(t, 1), vals=[v], out_dtype=want)


@pytest.mark.parametrize("name,tf,ff", SCANS, ids=[s[0] for s in SCANS])
def test_scans_special(name, tf, ff):
    v = np.array([[1.0, np.nan, 2.0, 0.5], [np.inf, 1.0, -np.inf, 3.0], [0.0, -1.0, 0.0, 2.0]], np.float32)
    check_op(None, lambda t: tf(t, 1), lambda t: ff(t, 1), vals=[v], forward_only=True)


@pytest.mark.parametrize("name,tf,ff", SCANS, ids=[s[0] for s in SCANS])
def test_scans_python_and_empty(name, tf, ff):
    check_op([(2, 3)], lambda t: tf(t, 1), lambda t: ff(t, 1), device="PYTHON", low=0.5, high=1.5)
    check_op([(0, 3)], lambda t: tf(t, 0), lambda t: ff(t, 0))
    check_op([(3, 0)], lambda t: tf(t, 0), lambda t: ff(t, 0))


@pytest.mark.parametrize("name,tf,ff", SCANS, ids=[s[0] for s in SCANS])
def test_scans_0d(name, tf, ff):
    # torch: a scan of a 0-d tensor along dim 0 (or -1) is the tensor itself
    check_op([()], lambda t: tf(t, 0), lambda t: ff(t, 0), low=0.5, high=1.5)


def test_cumprod_with_zero_grad():
    check_op(None, lambda t: torch.cumprod(t, 0), lambda t: t.cumprod(0),
             vals=[np.array([2.0, 0.0, 3.0, -1.5], np.float32)])


def test_cummax_ties_grad():
    # ties: torch routes each output's gradient to the single (latest) index attaining the running max
    v = np.array([1.0, 3.0, 3.0, 2.0, 3.0, 4.0], np.float32)
    check_op(None, lambda t: torch.cummax(t, 0).values, lambda t: t.cummax(0)[0], vals=[v], upstream="sum")


def test_cumsum_default_axis():
    check_op([(3, 4)], lambda t: torch.cumsum(t, 0), lambda t: t.cumsum())


# ----- sort / argsort / topk -----

@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_sort_values_and_indices(dim, descending):
    x = rand((3, 4, 5), seed=dim + 7)
    check_op(None, lambda t: torch.sort(t, dim=dim, descending=descending, stable=True).values,
             lambda t: t.sort(dim, descending)[0], vals=[x])
    check_op(None, lambda t: torch.sort(t, dim=dim, descending=descending, stable=True).indices,
             lambda t: t.sort(dim, descending)[1], vals=[x], out_dtype="int32")


@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_ties(descending):
    x = ints_as_float((4, 9), -2, 3, seed=8)
    check_op(None, lambda t: torch.sort(t, dim=-1, descending=descending, stable=True).indices,
             lambda t: t.sort(-1, descending)[1], vals=[x], out_dtype="int32")
    check_op(None, lambda t: torch.sort(t, dim=-1, descending=descending, stable=True).values,
             lambda t: t.sort(-1, descending)[0], vals=[x], upstream="random")
    check_op(None, lambda t: torch.argsort(t, dim=-1, descending=descending, stable=True),
             lambda t: t.argsort(-1, descending), vals=[x], out_dtype="int32")


@pytest.mark.parametrize("descending", [False, True])
def test_sort_nan_inf(descending):
    x = np.array([[np.nan, 1.0, -np.inf, np.inf, 0.0, np.nan, -1.0]], np.float32)
    check_op(None, lambda t: torch.sort(t, dim=-1, descending=descending, stable=True).values,
             lambda t: t.sort(-1, descending)[0], vals=[x], forward_only=True)
    check_op(None, lambda t: torch.sort(t, dim=-1, descending=descending, stable=True).indices,
             lambda t: t.sort(-1, descending)[1], vals=[x], forward_only=True, out_dtype="int32")


@pytest.mark.parametrize("npdt", ["int32", "int8", "uint8", "int64", "bool", "float16", "float64"])
def test_sort_dtypes(npdt):
    if npdt == "bool": v = np.random.default_rng(3).random((3, 6)) < 0.5
    else: v = np.random.default_rng(3).integers(0 if npdt == "uint8" else -50, 200 if npdt == "uint8" else 50,
                                                (3, 6)).astype(npdt)
    for desc in (False, True):
        check_op(None, lambda t: torch.sort(t, dim=1, descending=desc, stable=True).values,
                 lambda t: t.sort(1, desc)[0], vals=[v],
                 forward_only=True)
        check_op(None, lambda t: torch.sort(t, dim=1, descending=desc, stable=True).indices,
                 lambda t: t.sort(1, desc)[1], vals=[v],
                 out_dtype="int32", forward_only=True)


def test_sort_python_noncontig_empty():
    check_op([(2, 4)], lambda t: torch.sort(t, dim=1, stable=True).values, lambda t: t.sort(1)[0], device="PYTHON")
    check_op([(4, 3)], lambda t: torch.sort(t.T.flip(1), dim=0, descending=True, stable=True).values,
             lambda t: t.T.flip(1).sort(0, True)[0])
    check_op([(2, 0)], lambda t: torch.sort(t, 1).values, lambda t: t.sort(1)[0])


def test_sort_topk_0d():
    # torch: sorting a 0-d tensor returns it (index 0); topk(1) likewise
    check_op([()], lambda t: torch.sort(t, 0).values, lambda t: t.sort(0)[0])
    check_op([()], lambda t: torch.topk(t, 1).values, lambda t: t.topk(1)[0])


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k,dim", [(1, -1), (3, -1), (5, -1), (2, 0), (0, 1)], ids=str)
def test_topk(k, dim, largest):
    x = rand((3, 5), seed=k + 11)
    check_op(None, lambda t: torch.topk(t, k, dim, largest).values, lambda t: t.topk(k, dim, largest)[0], vals=[x])
    check_op(None, lambda t: torch.topk(t, k, dim, largest).indices, lambda t: t.topk(k, dim, largest)[1], vals=[x],
             out_dtype="int32")


def test_topk_3d_python_and_errors():
    x = rand((2, 3, 4), seed=5)
    check_op(None, lambda t: torch.topk(t, 2, 1).values, lambda t: t.topk(2, 1)[0], vals=[x])
    check_op(None, lambda t: torch.topk(t, 2, -1, False).values, lambda t: t.topk(2, -1, False)[0],
             vals=[rand((2, 3), seed=6)], device="PYTHON")
    with pytest.raises(RuntimeError):
        Tensor(x).topk(5, -1)


def test_topk_int():
    v = np.array([[5, 1, 9, 3], [-4, 8, 0, 2]], np.int32)
    check_op(None, lambda t: torch.topk(t, 2).values, lambda t: t.topk(2)[0], vals=[v])
    check_op(None, lambda t: torch.topk(t, 2, largest=False).indices, lambda t: t.topk(2, largest=False)[1], vals=[v],
             out_dtype="int32")
