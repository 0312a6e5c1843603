"""Ops that had wrong results or missing forms next to tinygrad and PyTorch (issue 15): pow's special values and
gradients, sigmoid/softplus at the extremes, cummax/cummin indices, pooling indices, clamp at its bounds, losses and
attention edge cases, uint8 interpolation, fp16 matmul accuracy, the tinygrad argument forms (None in reshape/pad,
sequences in stack/cat, dtype names) and exception types. Every value is compared with PyTorch (CPU) or NumPy."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Tensor, dtypes
from fusegrad.dtype import UnknownDTypeError
from fusegrad.helpers import ShapeError

from .helpers import check_op


def raises_like_torch(torch_fn, fg_fn, also: type | None = None) -> str:
    """Both raise; fusegrad's exception is an instance of torch's type (and of `also`, tinygrad's type, if given)."""
    with pytest.raises(Exception) as te: torch_fn()
    with pytest.raises(Exception) as fe: fg_fn()
    assert isinstance(fe.value, te.type), f"fusegrad raised {fe.type.__name__}({fe.value}), torch {te.type.__name__}"
    if also is not None: assert isinstance(fe.value, also), f"{fe.type.__name__} is not a {also.__name__} (tinygrad)"
    return str(fe.value)


# ----- pow -----

SPECIAL = [-math.inf, -2.5, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, math.inf, math.nan]


def test_pow_tensor_tensor_special_values():
    # every base against every exponent: 0**0 == 1, negative ** fraction is nan, (-inf) ** 0.5 == inf, ...
    b, e = np.meshgrid(np.array(SPECIAL, np.float32), np.array(SPECIAL + [-1.5, 0.25], np.float32), indexing="ij")
    check_op(None, lambda x, y: x ** y, vals=[b, e], forward_only=True, atol=0, rtol=1e-6)


def test_pow_gradients_finite_grid():
    # torch's gradients, also at base 0 and exponent 0 (where a naive exp(y log x) gives NaN)
    vals = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0]
    b, e = np.meshgrid(np.array(vals, np.float32), np.array(vals + [1.5, 3.0], np.float32), indexing="ij")
    check_op(None, lambda x, y: x ** y, vals=[b, e], upstream="sum", rtol=1e-5)


@pytest.mark.parametrize("c", [0, 0.0, 1, 2, 3, -1, -2, 0.5, -0.5, 2.5, 1.5, 17, 1e-3])
def test_pow_scalar_exponent(c):
    x = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0], np.float32)
    check_op(None, lambda t: t ** c, vals=[x], upstream="sum", rtol=1e-5)


@pytest.mark.parametrize("c", [0, 0.0, 1, 2, 2.0, 0.5, -2.0, 3.5])
def test_pow_reversed(c):
    x = np.array([-2.0, -1.5, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0], np.float32)
    check_op(None, lambda t: c ** t, vals=[x], upstream="sum", rtol=1e-5)


def test_pow_x_to_zero_and_zero_to_x_grads_not_nan():
    x = np.array([0.0, 1.0, -1.0, 2.0], np.float32)
    check_op(None, lambda t: t ** 0, vals=[x], upstream="sum")
    check_op(None, lambda t: 0 ** t, vals=[np.abs(x)], upstream="sum")
    check_op(None, lambda t, u: t ** u, vals=[np.zeros(4, np.float32), np.abs(x)], upstream="sum")


def test_pow_int_dtypes():
    i = np.array([-3, -1, 0, 1, 2, 5], np.int32)
    check_op(None, lambda t: t ** 2, vals=[i])                        # int ** const int stays int
    check_op(None, lambda t: t ** 3, vals=[i])
    check_op(None, lambda t: t ** 0, vals=[i])
    check_op(None, lambda t: t ** 0.5, vals=[np.abs(i)])              # int ** float is float
    check_op(None, lambda t: t ** 2.0, vals=[i])                      # also an integral float
    check_op(None, lambda t: t.pow(-1.0), vals=[i[3:]])
    check_op(None, lambda t: 2 ** t, vals=[np.abs(i)])                # 2 ** int tensor stays int
    check_op(None, lambda t: 2.0 ** t, vals=[i])
    check_op(None, lambda t, u: t ** u, vals=[i, np.array([2, 3, 0, 4, 1, 2], np.int32)])
    raises_like_torch(lambda: torch.tensor([2]) ** -1, lambda: Tensor([2]) ** -1)


@pytest.mark.parametrize("dt", ["int32", "int64", "uint8", "int16"])
def test_pow_int_tensor_exact(dt):
    # exact integers (a float exp2/log2 path gave 7 ** 10 = 282475264), wrapping on overflow like torch
    signed = dt != "uint8"
    b = np.array([2, 1, 3, 0, 7, 5, 3, 2] + ([-1, -1, -3, -2] if signed else [1, 2, 3, 4]), dt)
    e = np.array([3, 0, 2, 3, 10, 9, 20, 31] + ([5, 4, 5, 7] if signed else [2, 7, 5, 3]), dt)
    check_op(None, lambda x, y: x ** y, vals=[b, e])
    check_op(None, lambda x, y: x ** y, vals=[b, e], device="PYTHON")
    if signed:   # a negative exponent truncates 1 / b ** |e|: 0 unless |b| == 1
        check_op(None, lambda x, y: x ** y,
                 vals=[np.array([2, 1, -1, -1, 3, -3], dt), np.array([-1, -1, -1, -2, -2, -1], dt)])


def test_pow_int_base_float_tensor_exponent():
    check_op(None, lambda x, y: x ** y,
             vals=[np.array([1, 2, 3, 0], np.int32), np.array([0.5, -1.0, 2.5, 0.0], np.float32)])


def test_pow_negative_infinity_fractional():
    b = np.full(6, -np.inf, np.float32)
    e = np.array([0.5, -0.5, 3.0, -3.0, 2.0, 0.0], np.float32)
    check_op(None, lambda x, y: x ** y, vals=[b, e], forward_only=True)
    # torch turns a constant 0.5 / -0.5 exponent into sqrt / rsqrt (nan at -inf); fusegrad keeps pow's C semantics
    # for constants too, as torch does for a tensor exponent
    check_op(None, lambda x: x ** torch.tensor(0.5), lambda x: x ** 0.5, vals=[b], forward_only=True)
    check_op(None, lambda x: x ** torch.tensor(-0.5), lambda x: x ** -0.5, vals=[b], forward_only=True)


# ----- activations at the extremes -----

EXTREME = np.array([-1e4, -1000.0, -100.0, -30.0, -20.0, -1.0, 0.0, 1.0, 20.0, 30.0, 100.0, 1000.0, 1e4], np.float32)


@pytest.mark.parametrize("name,tf,ff", [
    ("sigmoid", torch.sigmoid, lambda x: x.sigmoid()),
    ("softplus", F.softplus, lambda x: x.softplus()),
    ("logsigmoid", F.logsigmoid, lambda x: x.logsigmoid()),
    ("softplus_beta", lambda x: F.softplus(x, beta=2.0, threshold=10.0), lambda x: x.softplus(2.0, 10.0)),
    ("softplus_small_beta", lambda x: F.softplus(x, beta=0.5), lambda x: x.softplus(beta=0.5)),
    ("tanh", torch.tanh, lambda x: x.tanh()),
    ("silu", F.silu, lambda x: x.silu()),
    ("mish", F.mish, lambda x: x.mish())])
def test_activation_extremes_finite(name, tf, ff):
    out, _ = check_op(None, tf, ff, vals=[EXTREME], atol=1e-5, grad_atol=1e-5)
    assert np.isfinite(out.numpy()).all()


def test_softplus_threshold_keyword():
    x = np.array([-3.0, 1.0, 4.9, 5.1, 30.0], np.float32)
    check_op(None, lambda t: F.softplus(t, beta=1.0, threshold=5.0), lambda t: t.softplus(threshold=5.0), vals=[x])


# ----- cummax / cummin: (values, indices) -----

def _cum(name):
    tf = getattr(torch, name)
    return (lambda t, a: tf(t, a).values, lambda t, a: getattr(t, name)(a)[0],
            lambda t, a: tf(t, a).indices.to(torch.int32), lambda t, a: getattr(t, name)(a)[1])


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_cum_extreme_values_and_indices(name, axis):
    tv, fv, ti, fi = _cum(name)
    ints = np.random.default_rng(axis + 5).integers(-2, 3, (2, 3, 4)).astype(np.float32)   # many ties
    check_op(None, lambda t: tv(t, axis), lambda t: fv(t, axis), vals=[ints], upstream="sum")
    check_op(None, lambda t: ti(t, axis), lambda t: fi(t, axis), vals=[ints], forward_only=True)
    check_op(None, lambda t: ti(t, axis), lambda t: fi(t, axis), vals=[ints.astype(np.int32)])


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("shape,axis", [((0,), 0), ((0, 3), 0), ((0, 3), 1), ((3, 0), 0), ((3, 0), -1), ((), 0)])
def test_cum_extreme_empty_and_0d(name, shape, axis):
    tv, fv, ti, fi = _cum(name)
    check_op([shape], lambda t: tv(t, axis), lambda t: fv(t, axis))
    check_op([shape], lambda t: ti(t, axis), lambda t: fi(t, axis), forward_only=True)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("dt", ["bool", "uint8", "int8", "int64"])
def test_cum_extreme_small_dtypes(name, dt):
    tv, fv, ti, fi = _cum(name)
    v = np.array([[0, 1, 0, 1, 1], [1, 0, 0, 1, 0]]).astype(dt)
    check_op(None, lambda t: tv(t, 1), lambda t: fv(t, 1), vals=[v])
    check_op(None, lambda t: ti(t, 1), lambda t: fi(t, 1), vals=[v])


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cum_extreme_nan_inf(name):
    tv, fv, ti, fi = _cum(name)
    v = np.array([[1.0, np.nan, 2.0, np.nan, 0.5], [-np.inf, -np.inf, np.inf, 1.0, np.inf]], np.float32)
    check_op(None, lambda t: tv(t, 1), lambda t: fv(t, 1), vals=[v], forward_only=True)
    check_op(None, lambda t: ti(t, 1), lambda t: fi(t, 1), vals=[v], forward_only=True)


# ----- max_pool2d indices and max_unpool2d -----

POOLS = [((1, 2, 6, 6), {"kernel_size": 2}), ((2, 1, 7, 5), {"kernel_size": 3, "stride": 2, "padding": 1}),
         ((1, 1, 7, 7), {"kernel_size": 2, "stride": 2, "ceil_mode": True}),
         ((1, 2, 8, 8), {"kernel_size": 3, "stride": 1, "dilation": 2})]


@pytest.mark.parametrize("shape,kw", POOLS, ids=[str(p) for p in POOLS])
def test_max_pool2d_indices_with_ties(shape, kw):
    x = np.random.default_rng(0).integers(0, 3, shape).astype(np.float32)   # many ties: first in the window wins
    x.flat[3] = np.nan
    check_op(None, lambda t: F.max_pool2d(t, return_indices=True, **kw)[1],
             lambda t: t.max_pool2d(return_indices=True, **kw)[1], vals=[x], forward_only=True)


@pytest.mark.parametrize("shape,kw", POOLS[:2], ids=[str(p) for p in POOLS[:2]])
def test_max_unpool2d_roundtrip(shape, kw):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    pool = {k: v for k, v in kw.items() if k != "ceil_mode"}

    def tf(t):
        v, i = F.max_pool2d(t, return_indices=True, **pool)
        return F.max_unpool2d(v, i, output_size=t.shape[-2:], **{k: w for k, w in pool.items() if k != "dilation"})

    def ff(t):
        v, i = t.max_pool2d(return_indices=True, **pool)
        return v.max_unpool2d(i, output_size=t.shape[-2:], **pool)
    check_op(None, tf, ff, vals=[x])


# ----- clamp at its bounds, normalize, var/std over one element -----

def test_clamp_gradient_at_bounds():
    x = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, np.nan], np.float32)
    check_op(None, lambda t: t.clamp(-1.0, 1.0), vals=[x], upstream="sum")
    check_op(None, lambda t: t.clip(min=-1.0), lambda t: t.clip(min_=-1.0), vals=[x], upstream="sum")
    check_op(None, lambda t: t.clamp(max=1.0), lambda t: t.clamp(max_=1.0), vals=[x], upstream="sum")
    check_op(None, lambda t: t.clamp(1.0, -1.0), vals=[x], upstream="sum")          # min > max gives max
    lo, hi = np.full(8, -1.0, np.float32), np.array([1.0, 1.0, -0.5, 0.0, 0.5, 2.0, 1.0, 1.0], np.float32)
    check_op(None, lambda t, a, b: t.clamp(a, b), vals=[x, lo, hi], upstream="sum")


def test_clamp_int_with_float_bound():
    check_op(None, lambda t: t.clamp(0.5, 2.5), vals=[np.array([0, 1, 2, 3], np.int32)])


def test_normalize_zero_vector():
    x = np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]], np.float32)
    check_op(None, lambda t: F.normalize(t, dim=1), lambda t: t.normalize(dim=1), vals=[x], grad_rtol=1e-4)
    check_op(None, lambda t: F.normalize(t, p=1.0, dim=0), lambda t: t.normalize(p=1.0, dim=0), vals=[x])


@pytest.mark.parametrize("fn", ["var", "std"])
@pytest.mark.parametrize("correction", [0, 1])
def test_var_std_over_size_one_axis(fn, correction):
    check_op([(3, 1)], lambda t: getattr(t, fn)(1, correction=correction),
             lambda t: getattr(t, fn)(1, correction=correction), forward_only=correction == 1)
    check_op([(1,)], lambda t: getattr(t, fn)(correction=correction), lambda t: getattr(t, fn)(correction=correction),
             forward_only=correction == 1)


# ----- cross_entropy with class indices -----

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls", [0.0, 0.1])
@pytest.mark.parametrize("ignore", [None, 1, -100])
def test_cross_entropy_indices(reduction, ls, ignore):
    y = np.array([0, 2, 1, -100, 1], np.int64) if ignore == -100 else np.array([0, 2, 1, 1, 3], np.int64)
    kw = {} if ignore is None else {"ignore_index": ignore}
    logits = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    check_op(None, lambda x: F.cross_entropy(x, torch.tensor(y), reduction=reduction, label_smoothing=ls, **kw),
             lambda x: x.cross_entropy(Tensor(y.astype(np.int32)), reduction=reduction, label_smoothing=ls, **kw),
             vals=[logits])


def test_cross_entropy_spatial_and_1d():
    y = np.random.default_rng(1).integers(0, 3, (2, 4, 5))
    check_op([(2, 3, 4, 5)], lambda x: F.cross_entropy(x, torch.tensor(y), ignore_index=2, label_smoothing=0.2),
             lambda x: x.cross_entropy(Tensor(y.astype(np.int32)), ignore_index=2, label_smoothing=0.2))
    check_op([(4,)], lambda x: F.cross_entropy(x, torch.tensor(2)), lambda x: x.cross_entropy(Tensor(2)))


def test_cross_entropy_errors():
    raises_like_torch(lambda: F.cross_entropy(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long)),
                      lambda: Tensor.zeros(3, 4).cross_entropy(Tensor.zeros(2, dtype=dtypes.int32)))
    raises_like_torch(lambda: F.cross_entropy(torch.zeros(3, 4), torch.zeros(3, 5)),
                      lambda: Tensor.zeros(3, 4).cross_entropy(Tensor.zeros(3, 5)))


# ----- attention with fully masked rows -----

def test_sdpa_fully_masked_rows():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)])
    m = np.ones((4, 5), bool)
    m[1] = False
    check_op(None, lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=torch.tensor(m)),
             lambda a, b, c: a.scaled_dot_product_attention(b, c, attn_mask=Tensor(m)), vals=[q, k, v], atol=1e-5)
    fm = np.where(m, 0.0, -np.inf).astype(np.float32)
    check_op(None, lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=torch.tensor(fm)),
             lambda a, b, c: a.scaled_dot_product_attention(b, c, attn_mask=Tensor(fm)), vals=[q, k, v], atol=1e-5)


@pytest.mark.parametrize("L,S", [(4, 4), (6, 3), (3, 6)])
def test_sdpa_causal_shapes(L, S):
    check_op([(2, 1, L, 8), (2, 1, S, 8), (2, 1, S, 8)],
             lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
             lambda a, b, c: a.scaled_dot_product_attention(b, c, is_causal=True), atol=1e-5)


# ----- interpolate on uint8, fp16 matmul accuracy -----

@pytest.mark.parametrize("size,ac", [((11, 5), False), ((8, 8), True), ((3, 7), False)])
def test_interpolate_bilinear_uint8(size, ac):
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 7, 9)).astype(np.uint8)
    out = Tensor(x).interpolate(size, mode="linear", align_corners=ac)
    ref = F.interpolate(torch.tensor(x), size=size, mode="bilinear", align_corners=ac)
    assert out.dtype == dtypes.uint8 and out.shape == tuple(ref.shape)
    # torch's uint8 kernel uses fixed-point weights: within 1 of it, and exactly the float result rounded to nearest
    assert np.abs(out.numpy().astype(int) - ref.numpy().astype(int)).max() <= 1
    exact = F.interpolate(torch.tensor(x).float(), size=size, mode="bilinear", align_corners=ac).numpy()
    np.testing.assert_array_equal(out.numpy(), np.clip(np.round(exact), 0, 255).astype(np.uint8))


@pytest.mark.parametrize("n", [256, 512])
def test_fp16_matmul_accumulates_in_float32(n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((n, n)).astype(np.float16), rng.standard_normal((n, n)).astype(np.float16)
    ref = (torch.tensor(a).float() @ torch.tensor(b).float()).half().numpy().astype(np.float32)
    out = (Tensor(a) @ Tensor(b))
    assert out.dtype == dtypes.float16
    got = out.numpy().astype(np.float32)
    # one float32 sum rounded once to half: at most one half ulp from torch's float32 result plus float32 summation
    # error (another summation order; it only shows where terms cancel to a small result), and mostly identical
    ulp = np.spacing(np.maximum(np.abs(ref), np.abs(got)).astype(np.float16)).astype(np.float32)
    f32_err = 1e-6 * (np.abs(a).astype(np.float32) @ np.abs(b).astype(np.float32))
    assert (np.abs(got - ref) <= ulp + f32_err).all()
    assert (got != ref).mean() < 0.01


# ----- tinygrad argument forms -----

def test_reshape_and_pad_accept_none():
    check_op([(2, 3, 36)], lambda t: t.reshape(2, 3, 6, 6), lambda t: t.reshape(None, None, 6, 6))
    check_op([(2, 3, 36)], lambda t: t.reshape(2, -1, 6), lambda t: t.reshape((None, -1, 6)))
    check_op([(2, 3, 4)], lambda t: F.pad(t, (3, 0, 0, 1)), lambda t: t.pad((None, (0, 1), (3, 0))))
    with pytest.raises(ValueError): Tensor.zeros(2, 3).reshape(None, None, None)


def test_expand_none_and_chunk_empty():
    check_op([(1, 3)], lambda t: t.expand(4, 2, 3), lambda t: t.expand(4, 2, None))
    check_op([(2, 1)], lambda t: t.expand(2, 5), lambda t: t.expand(None, 5))
    for shape, chunks, dim in [((0,), 3, 0), ((0, 2), 2, 0), ((3, 0), 4, 1), ((5,), 3, 0)]:
        ref, out = torch.zeros(shape).chunk(chunks, dim), Tensor.zeros(shape).chunk(chunks, dim)
        assert [tuple(r.shape) for r in ref] == [o.shape for o in out]


def test_repeat_more_repeats_than_dims():
    check_op([(2, 3)], lambda t: t.repeat(2, 1, 2))
    check_op([(3,)], lambda t: t.repeat(2, 2, 1, 3))
    check_op([()], lambda t: t.repeat(2, 3))


def test_stack_and_cat_take_any_sequence():
    a, b = np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)
    check_op(None, lambda x, y: torch.stack([x, y], 1), lambda x, y: Tensor.stack([x, y], dim=1), vals=[a, b])
    check_op(None, lambda x, y: torch.stack((x, y)), lambda x, y: Tensor.stack((x, y)), vals=[a, b])
    check_op(None, lambda x, y: torch.stack([x, y]), lambda x, y: Tensor.stack(t for t in (x, y)), vals=[a, b])
    check_op(None, lambda x, y: torch.stack([x, y, x]), lambda x, y: x.stack(y, x), vals=[a, b])
    check_op(None, lambda x, y: torch.cat([x, y], 1), lambda x, y: Tensor.cat([x, y], dim=1), vals=[a, b])
    check_op(None, lambda x, y: torch.cat((x, y)), lambda x, y: x.cat(y), vals=[a, b])
    raises_like_torch(lambda: torch.stack([]), lambda: Tensor.stack([]))
    raises_like_torch(lambda: torch.cat([torch.ones(1), 2]), lambda: Tensor.cat([Tensor.ones(1), 2]))


@pytest.mark.parametrize("formula,shapes", [("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
                                            ("...ij,jk", [(2, 3, 4), (4, 5)]), ("i...->...", [(3, 2, 4)]),
                                            ("bi...,bj...->bij", [(2, 3, 4), (2, 5, 4)]),
                                            ("...,...->...", [(3,), (3,)])])
def test_einsum_ellipsis(formula, shapes):
    check_op(shapes, lambda *ts: torch.einsum(formula, *ts), lambda *ts: Tensor.einsum(formula, *ts), atol=1e-5)


def test_einsum_shape_errors():
    for formula, shapes in [("ij,jk->ik", [(3, 4), (5, 5)]), ("ij,jk->ik", [(2, 2)]), ("ijk,jk->ik", [(2, 2), (2, 2)])]:
        raises_like_torch(lambda f=formula, ss=shapes: torch.einsum(f, *[torch.ones(s) for s in ss]),
                          lambda f=formula, ss=shapes: Tensor.einsum(f, *[Tensor.ones(s) for s in ss]), also=ValueError)


def test_one_hot_forms_and_errors():
    i = np.array([[0, 2], [1, 3]], np.int32)
    check_op(None, lambda t: F.one_hot(t.long(), 5).int(), lambda t: t.one_hot(5), vals=[i])
    check_op(None, lambda t: F.one_hot(t.long()).int(), lambda t: t.one_hot(), vals=[i])
    raises_like_torch(lambda: F.one_hot(torch.tensor([1.5]), 3), lambda: Tensor([1.5]).one_hot(3))
    with pytest.raises(ValueError): Tensor([1]).one_hot(-2)


@pytest.mark.parametrize("fn", ["sum", "prod"])
@pytest.mark.parametrize("dt", ["float32", "float16", "int64", "int32"])
def test_reduce_dtype_by_name_or_dtype(fn, dt):
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    for fg_dt in (dt, getattr(dtypes, dt)):
        check_op(None, lambda t: getattr(t, fn)(1, dtype=getattr(torch, dt)),
                 lambda t, d=fg_dt: getattr(t, fn)(1, dtype=d), vals=[x])


def test_isclose_with_scalars():
    x = np.array([1.0, 1.0 + 1e-6, 1.1, np.nan, np.inf], np.float32)
    check_op(None, lambda t: torch.isclose(t, torch.tensor(1.0)), lambda t: t.isclose(1.0), vals=[x])
    check_op(None, lambda t: torch.isclose(t, torch.tensor(1.0), atol=0.2), lambda t: t.isclose(1.0, atol=0.2),
             vals=[x])
    check_op(None, lambda t: torch.isclose(t, torch.tensor(math.inf)), lambda t: t.isclose(math.inf), vals=[x])
    check_op(None, lambda t: torch.isclose(t, t, equal_nan=True), lambda t: t.isclose(t, equal_nan=True), vals=[x])


@pytest.mark.parametrize("args,dt", [((0, 1, 5), None), ((0, 10, 5), "int32"), ((-1, 1, 4), "float16"),
                                     ((2, 2, 1), None), ((0, 1, 0), None)])
def test_linspace_dtypes(args, dt):
    ref = torch.linspace(*args, dtype=None if dt is None else getattr(torch, dt))
    out = Tensor.linspace(*args, dtype=dt)
    assert out.dtype == (dtypes.float32 if dt is None else getattr(dtypes, dt))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-3)


@pytest.mark.parametrize("args,dt", [((5,), None), ((0, 1, 0.25), None), ((1, 7, 2), "float16"), ((5.5,), None),
                                     ((-3, 3), "int64"), ((10, 0, -3), None)])
def test_arange_dtypes(args, dt):
    ref = torch.arange(*args, dtype=None if dt is None else getattr(torch, dt))
    out = Tensor.arange(*args, dtype=dt)
    want = {torch.int64: dtypes.int32, torch.float32: dtypes.float32}[ref.dtype] if dt is None else getattr(dtypes, dt)
    assert out.dtype == want   # fusegrad's (and tinygrad's) default int is int32, torch's int64
    np.testing.assert_allclose(out.numpy(), ref.numpy())


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_indexing(indexing):
    a, b, c = np.arange(2, dtype=np.float32), np.arange(3, dtype=np.float32), np.arange(4, dtype=np.float32)
    for i in range(3):
        check_op(None, lambda x, y, z, i=i: torch.meshgrid(x, y, z, indexing=indexing)[i],
                 lambda x, y, z, i=i: Tensor.meshgrid(x, y, z, indexing=indexing)[i], vals=[a, b, c])
    check_op(None, lambda x, y: torch.meshgrid(x, y, indexing=indexing)[1],
             lambda x, y: x.meshgrid(y, indexing=indexing)[1], vals=[a, b])          # tinygrad's method form
    assert isinstance(Tensor.meshgrid([Tensor(a), Tensor(b)]), tuple)
    raises_like_torch(lambda: torch.meshgrid(torch.ones(2), indexing="zz"),
                      lambda: Tensor.meshgrid(Tensor.ones(2), indexing="zz"))


def test_roll_flip_bad_dims():
    t, f = torch.ones(2, 3), Tensor.ones(2, 3)
    raises_like_torch(lambda: t.roll(1, 5), lambda: f.roll(1, 5))
    raises_like_torch(lambda: t.roll((1, 2), (0,)), lambda: f.roll((1, 2), (0,)))
    raises_like_torch(lambda: t.flip(5), lambda: f.flip(5))
    raises_like_torch(lambda: t.flip((0, 0)), lambda: f.flip((0, 0)))
    raises_like_torch(lambda: t.flip((0, -2)), lambda: f.flip((0, -2)))


def test_scatter_argument_errors():
    t, f = torch.zeros(3, 4), Tensor.zeros(3, 4)
    ti, fi = torch.tensor([[0, 1]]), Tensor([[0, 1]])
    src_t, src_f = torch.ones(3, 4), Tensor.ones(3, 4)
    raises_like_torch(lambda: t.scatter(0, ti.float(), src_t), lambda: f.scatter(0, fi.float(), src_f))
    raises_like_torch(lambda: t.scatter(0, ti[0], src_t), lambda: f.scatter(0, fi[0], src_f))
    raises_like_torch(lambda: t.scatter(0, torch.zeros(4, 4, dtype=torch.long), src_t),
                      lambda: f.scatter(0, Tensor.zeros(4, 4, dtype=dtypes.int32), src_f))
    raises_like_torch(lambda: t.scatter(0, ti, src_t, reduce="max"), lambda: f.scatter(0, fi, src_f, reduce="max"))
    raises_like_torch(lambda: t.scatter(5, ti, src_t), lambda: f.scatter(5, fi, src_f))
    raises_like_torch(lambda: t.scatter_reduce(0, ti, src_t, reduce="median"),
                      lambda: f.scatter_reduce(0, fi, src_f, reduce="median"))
    raises_like_torch(lambda: t.scatter_reduce(0, ti.float(), src_t, reduce="sum"),
                      lambda: f.scatter_reduce(0, fi.float(), src_f, reduce="sum"))


def test_div_rounding_mode_validation():
    raises_like_torch(lambda: torch.div(torch.ones(2), 2, rounding_mode="round"),
                      lambda: Tensor.ones(2).div(2, rounding_mode="round"), also=RuntimeError)


@pytest.mark.parametrize("name,tf,ff", [
    ("zeros", lambda: torch.zeros(-1, 2), lambda: Tensor.zeros(-1, 2)),
    ("ones", lambda: torch.ones(2, -3), lambda: Tensor.ones(2, -3)),
    ("full", lambda: torch.full((-2,), 1.0), lambda: Tensor.full((-2,), 1.0)),
    ("empty", lambda: torch.empty(-1), lambda: Tensor.empty(-1)),
    ("rand", lambda: torch.rand(-1), lambda: Tensor.rand(-1)),
    ("randn", lambda: torch.randn(3, -1), lambda: Tensor.randn(3, -1)),
    ("eye", lambda: torch.eye(-1), lambda: Tensor.eye(-1)),
    ("linspace", lambda: torch.linspace(0, 1, -1), lambda: Tensor.linspace(0, 1, -1))])
def test_negative_sizes_in_creation(name, tf, ff):
    raises_like_torch(tf, ff, also=ValueError)   # torch: RuntimeError; tinygrad: ValueError


def test_exception_types_porting_code_catches():
    # tinygrad raises ValueError for a reshape/expand/broadcast that can't be done, torch RuntimeError: both work
    raises_like_torch(lambda: torch.ones(2, 3).reshape(4, 2), lambda: Tensor.ones(2, 3).reshape(4, 2), also=ValueError)
    raises_like_torch(lambda: torch.ones(2, 3).expand(4, 3), lambda: Tensor.ones(2, 3).expand(4, 3), also=ValueError)
    raises_like_torch(lambda: torch.ones(2, 3) + torch.ones(4, 3), lambda: Tensor.ones(2, 3) + Tensor.ones(4, 3),
                      also=ValueError)
    raises_like_torch(lambda: F.pad(torch.ones(2, 3), (1,)), lambda: Tensor.ones(2, 3).pad((1,)), also=ValueError)
    assert issubclass(ShapeError, ValueError) and issubclass(ShapeError, RuntimeError)
    # an unknown dtype name: torch TypeError, tinygrad AttributeError (it looks the name up on `dtypes`)
    raises_like_torch(lambda: torch.zeros(2, dtype="floaty"), lambda: Tensor.zeros(2, dtype="floaty"),
                      also=AttributeError)
    with pytest.raises(UnknownDTypeError): Tensor([1]).cast("floaty")
    # a dim out of range is IndexError in all three
    raises_like_torch(lambda: torch.ones(2).sum(3), lambda: Tensor.ones(2).sum(3), also=IndexError)


# ----- the PYTHON backend (the reference semantics) on the new paths -----

def test_reference_backend_paths():
    b = np.array([-np.inf, -2.0, -1.0, 0.0, 0.0, 2.0], np.float32)
    e = np.array([0.5, 0.5, 2.0, 0.0, 1.0, -1.5], np.float32)
    check_op(None, lambda x, y: x ** y, vals=[b, e], device="PYTHON", forward_only=True)
    check_op(None, lambda x, y: x ** y, vals=[b[1:], e[1:]], device="PYTHON", upstream="sum")
    v = np.array([[1.0, 3.0, 3.0, np.nan], [2.0, 2.0, 1.0, 5.0]], np.float32)
    check_op(None, lambda t: torch.cummax(t, 1).indices.to(torch.int32), lambda t: t.cummax(1)[1], vals=[v],
             device="PYTHON", forward_only=True)
    check_op(None, lambda t: t.clamp(-1.0, 1.0), vals=[np.array([-2.0, -1.0, 0.0, 1.0, np.nan], np.float32)],
             device="PYTHON", upstream="sum")
    m = np.array([[True, False], [False, False]])
    check_op([(1, 2, 4), (1, 2, 4), (1, 2, 4)],
             lambda q, k, w: F.scaled_dot_product_attention(q, k, w, attn_mask=torch.tensor(m)),
             lambda q, k, w: q.scaled_dot_product_attention(k, w, attn_mask=Tensor(m, device="PYTHON")),
             device="PYTHON", atol=1e-5)
    x = np.random.default_rng(3).integers(0, 256, (1, 1, 3, 3)).astype(np.uint8)
    out = Tensor(x, device="PYTHON").interpolate((4, 5)).numpy()
    exact = F.interpolate(torch.tensor(x).float(), size=(4, 5), mode="bilinear").numpy()
    np.testing.assert_array_equal(out, np.clip(np.round(exact), 0, 255).astype(np.uint8))


def test_more_argument_errors():
    t, f = torch.ones(2, 3), Tensor.ones(2, 3)
    raises_like_torch(lambda: t.topk(5), lambda: f.topk(5), also=ValueError)          # tinygrad: ValueError
    raises_like_torch(lambda: t.diagonal(0, 1, 1), lambda: f.diagonal(0, 1, 1))
    raises_like_torch(lambda: t.masked_select(torch.ones(2, 3, dtype=torch.int32)),
                      lambda: f.masked_select(Tensor.ones(2, 3, dtype=dtypes.int32)))
    raises_like_torch(lambda: F.gelu(t, approximate="erf"), lambda: f.gelu(approximate="erf"))
