"""Extended elementwise math against PyTorch: trig/hyperbolic/rounding functions, activations, predicates (isinf,
isnan, isfinite), lerp/clamp/sign, and the binary ops mod/fmod/bitwise/shifts/pow/copysign/logaddexp. Forward values,
dtypes and gradients on random inputs (chosen away from kinks and domain edges), plus special values, 0-d,
non-contiguous inputs and a PYTHON-backend subset."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Tensor

from .helpers import check_op


def rand(shape, lo, hi, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def away_from(shape, points, lo, hi, gap=0.05, seed=0):
    """Random floats in [lo, hi) at least `gap` away from each of `points` (kinks of piecewise functions)."""
    x = rand(shape, lo, hi, seed)
    for p in points:
        near = np.abs(x - p) < gap
        x[near] = p + np.where(x[near] >= p, gap, -gap) * 2
    return x.astype(np.float32)


# ----- unary math and activations: (name, torch fn, fusegrad fn, input range, kinks to avoid, extra kwargs) -----

UNARY = [
    ("log10", torch.log10, lambda x: x.log10(), (0.1, 5), [], {}),
    ("tan", torch.tan, lambda x: x.tan(), (-1.2, 1.2), [], {"rtol": 2e-3}),
    ("atan", torch.atan, lambda x: x.atan(), (-6, 6), [], {}),
    ("asin", torch.asin, lambda x: x.asin(), (-0.95, 0.95), [], {}),
    ("acos", torch.acos, lambda x: x.acos(), (-0.95, 0.95), [], {}),
    ("ceil", torch.ceil, lambda x: x.ceil(), (-4, 4), [], {}),
    ("round", torch.round, lambda x: x.round(), (-4, 4), [-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5], {}),
    ("sign", torch.sign, lambda x: x.sign(), (-3, 3), [0], {}),
    ("logsigmoid", F.logsigmoid, lambda x: x.logsigmoid(), (-8, 8), [], {}),
    ("hardsigmoid", F.hardsigmoid, lambda x: x.hardsigmoid(), (-5, 5), [-3, 3], {}),
    ("elu", F.elu, lambda x: x.elu(), (-3, 3), [0], {}),
    ("elu_alpha", lambda x: F.elu(x, alpha=0.5), lambda x: x.elu(alpha=0.5), (-3, 3), [0], {}),
    ("celu", F.celu, lambda x: x.celu(), (-3, 3), [0], {}),
    ("celu_alpha", lambda x: F.celu(x, alpha=2.0), lambda x: x.celu(alpha=2.0), (-3, 3), [0], {}),
    ("selu", F.selu, lambda x: x.selu(), (-3, 3), [0], {}),
    ("swish", F.silu, lambda x: x.swish(), (-6, 6), [], {}),
    ("silu", F.silu, lambda x: x.silu(), (-6, 6), [], {}),
    ("relu6", F.relu6, lambda x: x.relu6(), (-3, 9), [0, 6], {}),
    ("hardswish", F.hardswish, lambda x: x.hardswish(), (-5, 5), [-3, 3], {}),
    ("sinh", torch.sinh, lambda x: x.sinh(), (-4, 4), [], {}),
    ("cosh", torch.cosh, lambda x: x.cosh(), (-4, 4), [], {}),
    ("tanh_hyp_atanh", torch.atanh, lambda x: x.atanh(), (-0.95, 0.95), [], {}),
    ("asinh", torch.asinh, lambda x: x.asinh(), (-5, 5), [0], {}),
    ("acosh", torch.acosh, lambda x: x.acosh(), (1.1, 6), [], {}),
    ("hardtanh", F.hardtanh, lambda x: x.hardtanh(), (-3, 3), [-1, 1], {}),
    ("hardtanh_range", lambda x: F.hardtanh(x, -0.5, 2.0), lambda x: x.hardtanh(-0.5, 2.0), (-3, 3), [-0.5, 2], {}),
    ("erf", torch.erf, lambda x: x.erf(), (-3, 3), [], {"atol": 1e-6}),
    ("gelu", lambda x: F.gelu(x, approximate="tanh"), lambda x: x.gelu(), (-4, 4), [], {}),   # tinygrad's default
    ("gelu_none", lambda x: F.gelu(x, approximate="none"), lambda x: x.gelu(approximate="none"), (-4, 4), [], {}),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), lambda x: x.gelu(approximate="tanh"), (-4, 4), [], {}),
    ("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x), lambda x: x.quick_gelu(), (-4, 4), [], {}),
    ("leaky_relu", F.leaky_relu, lambda x: x.leaky_relu(), (-3, 3), [0], {}),
    ("leaky_relu_slope", lambda x: F.leaky_relu(x, 0.2), lambda x: x.leaky_relu(0.2), (-3, 3), [0], {}),
    ("mish", F.mish, lambda x: x.mish(), (-5, 5), [], {}),
    ("softplus", F.softplus, lambda x: x.softplus(), (-8, 8), [], {}),
    ("softplus_beta", lambda x: F.softplus(x, beta=2.0), lambda x: x.softplus(beta=2.0), (-6, 6), [], {}),
    ("softplus_thresh", lambda x: F.softplus(x, beta=1.5, threshold=2.0), lambda x: x.softplus(beta=1.5, threshold=2.0),
     (-4, 4), [2.0 / 1.5], {}),
    ("softsign", F.softsign, lambda x: x.softsign(), (-4, 4), [0], {}),
]


@pytest.mark.parametrize("name,tf,ff,rng,kinks,kw", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ext(name, tf, ff, rng, kinks, kw):
    check_op(None, tf, ff, vals=[away_from((4, 5), kinks, *rng)], **kw)


@pytest.mark.parametrize("name,tf,ff,rng,kinks,kw", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ext_0d(name, tf, ff, rng, kinks, kw):
    check_op(None, tf, ff, vals=[away_from((), kinks, *rng, seed=3)], **kw)


@pytest.mark.parametrize("name,tf,ff,rng,kinks,kw", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ext_noncontiguous(name, tf, ff, rng, kinks, kw):
    # a permuted and flipped view as the input
    check_op(None, lambda x: tf(x.permute(1, 0).flip(0)), lambda x: ff(x.permute(1, 0).flip(0)),
             vals=[away_from((3, 4), kinks, *rng, seed=5)], **kw)


def test_unary_ext_empty():
    for _, tf, ff, _, _, _ in UNARY:
        check_op([(0, 3)], tf, ff)


PY_UNARY = ["log10", "atan", "asin", "round", "elu", "hardswish", "erf", "gelu_tanh", "mish", "softplus_thresh"]


@pytest.mark.parametrize("name,tf,ff,rng,kinks,kw", [u for u in UNARY if u[0] in PY_UNARY], ids=PY_UNARY)
def test_unary_ext_python(name, tf, ff, rng, kinks, kw):
    check_op(None, tf, ff, vals=[away_from((2, 3), kinks, *rng, seed=7)], device="PYTHON", **kw)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-7, -1e-7, 30.0, -30.0, np.inf, -np.inf, np.nan], np.float32)

# functions defined on all of R (so torch's special-value behaviour is well-defined and reproducible)
SPECIAL_FNS = ["atan", "ceil", "round", "logsigmoid", "hardsigmoid", "elu", "celu", "selu", "swish", "relu6",
               "hardswish", "sinh", "cosh", "asinh", "hardtanh", "erf", "gelu", "gelu_tanh", "leaky_relu", "mish",
               "softplus", "softsign", "quick_gelu"]


@pytest.mark.parametrize("name,tf,ff,rng,kinks,kw", [u for u in UNARY if u[0] in SPECIAL_FNS], ids=SPECIAL_FNS)
def test_unary_ext_special_values(name, tf, ff, rng, kinks, kw):
    if name == "gelu":  # torch's vectorized float32 gelu gives NaN at +inf; its scalar and float64 paths give inf
        tf = lambda x, f=tf: f(x.double()).float()
    check_op(None, tf, ff, vals=[SPECIAL], forward_only=True, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name,tf,ff", [
    ("asin", torch.asin, lambda x: x.asin()), ("acos", torch.acos, lambda x: x.acos()),
    ("atanh", torch.atanh, lambda x: x.atanh()), ("acosh", torch.acosh, lambda x: x.acosh()),
    ("log10", torch.log10, lambda x: x.log10()), ("tan", torch.tan, lambda x: x.tan())])
def test_domain_edges(name, tf, ff):
    # outside the domain -> NaN, at the edge -> +-inf or exact values, like torch
    v = np.array([-2.0, -1.0, 0.0, 1.0, 2.0, np.nan, np.inf, -np.inf], np.float32)
    check_op(None, tf, ff, vals=[v], forward_only=True, atol=1e-6)


def test_atan_large_and_small():
    v = np.array([1e-6, -1e-6, 0.4142, 0.4143, 0.99, 1.0, 1.01, 1e3, -1e3, 1e20, -1e20], np.float32)
    check_op(None, torch.atan, lambda x: x.atan(), vals=[v], upstream="sum", atol=1e-6)


def test_round_half_to_even():
    v = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 0.49999997, -0.49999997, 2.5000002, 1e7 + 1,
                  8388609.0, -8388609.0], np.float32)
    out = check_op(None, torch.round, lambda x: x.round(), vals=[v], forward_only=True, atol=0, rtol=0)[0]
    np.testing.assert_array_equal(out.numpy()[:9], [-4, -2, -2, -0, 0, 2, 2, 4, 4])


def test_ceil_exact():
    v = np.array([-2.0, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 1e-30, -1e-30, 8388609.0], np.float32)
    check_op(None, torch.ceil, lambda x: x.ceil(), vals=[v], forward_only=True, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["ceil", "round", "sign"])
def test_rounding_grad_is_zero(name):
    check_op(None, getattr(torch, name), lambda x: getattr(x, name)(), vals=[np.array([-1.3, 0.7, 2.2], np.float32)])


@pytest.mark.parametrize("npdt", ["int32", "int8", "int64", "uint8"])
@pytest.mark.parametrize("name", ["ceil", "round", "sign"])
def test_rounding_int_is_identity_like(name, npdt):
    v = np.array([0, 1, 5, 7, 100], npdt) if npdt == "uint8" else np.array([-5, -1, 0, 1, 7, 100], npdt)
    check_op(None, getattr(torch, name), lambda x: getattr(x, name)(), vals=[v])


def test_sign_bool():
    check_op(None, torch.sign, lambda x: x.sign(), vals=[np.array([True, False, True])])


def test_sign_special_values():
    # torch.sign: sign(+-0) = 0, sign(+-inf) = +-1, sign(NaN) = 0
    check_op(None, torch.sign, lambda x: x.sign(), vals=[np.array([-0.0, 0.0, -np.inf, np.inf, 1e-30, np.nan],
                                                                  np.float32)], forward_only=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_isinf_isnan_isfinite(dtype):
    v = np.array([0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 65504.0, -65504.0], dtype)
    for tf, ff in [(torch.isinf, lambda x: x.isinf()), (torch.isnan, lambda x: x.isnan()),
                   (torch.isfinite, lambda x: x.isfinite()), (torch.isposinf, lambda x: x.isinf(True, False)),
                   (torch.isneginf, lambda x: x.isinf(False, True))]:
        check_op(None, tf, ff, vals=[v], forward_only=True)


@pytest.mark.parametrize("npdt", ["int32", "bool", "uint8"])
def test_isinf_isnan_isfinite_int(npdt):
    v = np.array([0, 1, 1, 0], npdt)
    for tf, ff in [(torch.isinf, lambda x: x.isinf()), (torch.isnan, lambda x: x.isnan()),
                   (torch.isfinite, lambda x: x.isfinite())]:
        check_op(None, tf, ff, vals=[v])


def test_isnan_python():
    v = np.array([np.nan, 1.0, np.inf, -np.inf], np.float32)
    check_op(None, torch.isnan, lambda x: x.isnan(), vals=[v], device="PYTHON")
    check_op(None, torch.isfinite, lambda x: x.isfinite(), vals=[v], device="PYTHON")


# ----- lerp, clamp, clip -----

@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), (4,)), ((2, 3), (2, 3), ())], ids=str)
def test_lerp_tensor_weight(shapes):
    check_op(shapes, torch.lerp, lambda a, b, w: a.lerp(b, w))


@pytest.mark.parametrize("w", [0.0, 0.25, 1.0, 1.5])
def test_lerp_scalar_weight(w):
    check_op([(3, 4), (3, 4)], lambda a, b: torch.lerp(a, b, w), lambda a, b: a.lerp(b, w))


def test_lerp_python():
    check_op([(2, 2), (2, 2), (2, 2)], torch.lerp, lambda a, b, w: a.lerp(b, w), device="PYTHON")


CLAMPS = [(-0.5, 0.5), (None, 0.3), (-0.3, None), (0, 0), (1.0, -1.0), (-1, 1)]


@pytest.mark.parametrize("lo,hi", CLAMPS, ids=str)
def test_clamp(lo, hi):
    x = away_from((4, 5), [v for v in (lo, hi) if v is not None], -2, 2)
    check_op(None, lambda t: torch.clamp(t, lo, hi), lambda t: t.clamp(lo, hi), vals=[x])
    check_op(None, lambda t: torch.clip(t, lo, hi), lambda t: t.clip(lo, hi), vals=[x])


@pytest.mark.parametrize("lo,hi", [(-3, 4), (None, 2), (0, None)], ids=str)
def test_clamp_int(lo, hi):
    check_op([(4, 5)], lambda t: torch.clamp(t, lo, hi), lambda t: t.clamp(lo, hi), dtype=np.int32, low=-10, high=10)


def test_clamp_tensor_bounds():
    lo, hi = rand((1, 5), -1, 0, 1), rand((4, 1), 0, 1, 2)
    x = rand((4, 5), -2, 2, 3)
    check_op(None, lambda t, a, b: torch.clamp(t, a, b), lambda t, a, b: t.clamp(a, b), vals=[x, lo, hi])


def test_clamp_needs_a_bound():
    with pytest.raises(RuntimeError):
        Tensor([1.0, 2.0]).clamp()


def test_clamp_nan():
    v = np.array([np.nan, -np.inf, np.inf, 0.0], np.float32)
    check_op(None, lambda t: torch.clamp(t, -1, 1), lambda t: t.clamp(-1, 1), vals=[v], forward_only=True)


def test_clamp_python():
    check_op(None, lambda t: torch.clamp(t, None, 0.5), lambda t: t.clamp(None, 0.5),
             vals=[away_from((2, 3), [0.5], -2, 2)], device="PYTHON")


# ----- mod / fmod -----

def nonzero_ints(shape, lo, hi, seed):
    v = np.random.default_rng(seed).integers(lo, hi, size=shape)
    v[v == 0] = 1
    return v


@pytest.mark.parametrize("npdt", ["int32", "int64", "int8", "int16"])
def test_mod_int_python_semantics(npdt):
    a = np.random.default_rng(0).integers(-20, 20, (5, 6)).astype(npdt)
    b = nonzero_ints((5, 6), -7, 8, 1).astype(npdt)
    check_op(None, lambda x, y: x % y, vals=[a, b])
    check_op(None, torch.remainder, lambda x, y: x.mod(y), vals=[a, b])


@pytest.mark.parametrize("npdt", ["int32", "int64", "int8"])
def test_fmod_int(npdt):
    a = np.random.default_rng(0).integers(-20, 20, (5, 6)).astype(npdt)
    b = nonzero_ints((5, 6), -7, 8, 1).astype(npdt)
    check_op(None, torch.fmod, lambda x, y: x.fmod(y), vals=[a, b])


def test_mod_uint():
    a = np.random.default_rng(0).integers(0, 250, (4, 5)).astype(np.uint8)
    b = np.random.default_rng(1).integers(1, 20, (4, 5)).astype(np.uint8)
    check_op(None, lambda x, y: x % y, vals=[a, b])
    check_op(None, torch.fmod, lambda x, y: x.fmod(y), vals=[a, b])


@pytest.mark.parametrize("s", [3, -3, 7, -1])
def test_mod_int_scalar(s):
    a = np.arange(-10, 10, dtype=np.int32)
    check_op(None, lambda x: x % s, vals=[a])
    check_op(None, lambda x: torch.fmod(x, s), lambda x: x.fmod(s), vals=[a])


@pytest.mark.parametrize("s", [3, -3, 7])
def test_rmod_int(s):
    b = nonzero_ints((12,), -6, 7, 4).astype(np.int32)
    check_op(None, lambda x: s % x, vals=[b])


def test_mod_float():
    a = rand((5, 6), -5, 5, 0)
    b = rand((5, 6), 0.5, 2, 1) * np.random.default_rng(2).choice([-1, 1], (5, 6)).astype(np.float32)
    check_op(None, lambda x, y: x % y, vals=[a, b], atol=1e-5)
    check_op(None, torch.fmod, lambda x, y: x.fmod(y), vals=[a, b], atol=1e-5)


@pytest.mark.parametrize("s", [1.5, -1.5, 0.7])
def test_mod_float_scalar(s):
    a = rand((4, 5), -5, 5, 3)
    check_op(None, lambda x: x % s, vals=[a], atol=1e-5)
    check_op(None, lambda x: torch.fmod(x, s), lambda x: x.fmod(s), vals=[a], atol=1e-5)


def test_rmod_float():
    # torch has no derivative for remainder(scalar, tensor): forward only
    b = rand((4, 5), 0.5, 2, 1) * np.random.default_rng(2).choice([-1, 1], (4, 5)).astype(np.float32)
    check_op(None, lambda x: 2.5 % x, vals=[b], atol=1e-5, forward_only=True)


def test_mod_float_special():
    a = np.array([np.inf, -np.inf, np.nan, 1.0, 0.0, -7.5], np.float32)
    b = np.array([2.0, 2.0, 2.0, np.nan, 3.0, -2.0], np.float32)
    check_op(None, torch.fmod, lambda x, y: x.fmod(y), vals=[a, b], forward_only=True)
    check_op(None, torch.remainder, lambda x, y: x % y, vals=[a, b], forward_only=True)


def test_fmod_by_inf():
    # C fmod: a finite dividend modulo +-inf is the dividend itself (torch.fmod(5, inf) == 5)
    a = np.array([5.0, -5.0, 0.5], np.float32)
    b = np.array([np.inf, np.inf, -np.inf], np.float32)
    check_op(None, torch.fmod, lambda x, y: x.fmod(y), vals=[a, b], forward_only=True)


def test_mod_python():
    a = np.array([-7, -3, 0, 3, 7, 8], np.int32)
    b = np.array([3, -3, 5, -2, -4, 3], np.int32)
    check_op(None, lambda x, y: x % y, vals=[a, b], device="PYTHON")
    check_op(None, torch.fmod, lambda x, y: x.fmod(y), vals=[a, b], device="PYTHON")
    check_op(None, lambda x: x % 1.5, vals=[rand((2, 3), -3, 3, 5)], device="PYTHON", atol=1e-5)


# ----- bitwise and shifts -----

BITWISE = [("and", lambda x, y: x & y, lambda x, y: x.bitwise_and(y)),
           ("or", lambda x, y: x | y, lambda x, y: x.bitwise_or(y)),
           ("xor", lambda x, y: x ^ y, lambda x, y: x.bitwise_xor(y))]


@pytest.mark.parametrize("npdt", ["int32", "int64", "int8", "uint8", "int16", "uint16", "bool"])
@pytest.mark.parametrize("name,op,meth", BITWISE, ids=[b[0] for b in BITWISE])
def test_bitwise(name, op, meth, npdt):
    lo, hi = (0, 2) if npdt == "bool" else (0, 200) if npdt.startswith("u") else (-100, 100)
    check_op([(3, 4), (3, 4)], op, dtype=npdt, low=lo, high=hi)
    check_op([(3, 4), (1, 4)], op, meth, dtype=npdt, low=lo, high=hi, seed=1)


@pytest.mark.parametrize("name,op,meth", BITWISE, ids=[b[0] for b in BITWISE])
def test_bitwise_scalar_and_reversed(name, op, meth):
    v = np.array([-7, -1, 0, 1, 5, 12, 255], np.int32)
    check_op(None, lambda x: op(x, 6), vals=[v])
    check_op(None, lambda x: op(6, x), vals=[v])
    check_op(None, lambda x: op(x, True), vals=[np.array([True, False])])


@pytest.mark.parametrize("npdt", ["int32", "int64", "int8", "uint8", "bool"])
def test_bitwise_not(npdt):
    v = np.array([True, False, True]) if npdt == "bool" else np.array([0, 1, 5, 100, 127], npdt) if npdt == "uint8" \
        else np.array([-100, -1, 0, 1, 5, 100], npdt)
    check_op(None, torch.bitwise_not, lambda x: x.bitwise_not(), vals=[v])
    check_op(None, lambda x: ~x, vals=[v])


def test_bitwise_float_raises():
    with pytest.raises(RuntimeError):
        Tensor([1.0]) & Tensor([2.0])
    with pytest.raises(RuntimeError):
        Tensor([1.0]).bitwise_not()


def test_bitwise_python():
    a = np.array([[-5, 3], [12, 0]], np.int32)
    b = np.array([[6, -1], [10, 7]], np.int32)
    for _, op, _ in BITWISE:
        check_op(None, op, vals=[a, b], device="PYTHON")
    check_op(None, lambda x: ~x, vals=[a], device="PYTHON")


@pytest.mark.parametrize("npdt", ["int32", "int64", "uint8", "int16"])  # torch has no uint32 shifts
@pytest.mark.parametrize("s", [0, 1, 3, 7])
def test_shifts(s, npdt):
    v = np.array([0, 1, 3, 5, 64, 100, 127], npdt)
    check_op(None, lambda x: x << s, vals=[v])
    check_op(None, lambda x: x >> s, vals=[v])
    check_op(None, lambda x: x << s, lambda x: x.lshift(s), vals=[v])
    check_op(None, lambda x: x >> s, lambda x: x.rshift(s), vals=[v])


def test_shift_negative_values():
    # torch: arithmetic right shift of signed ints, left shift of negative values wraps like two's complement
    v = np.array([-1, -2, -7, -128, -1000, 1000], np.int32)
    check_op(None, lambda x: x >> 2, vals=[v])
    check_op(None, lambda x: x << 3, vals=[v])


def test_shift_by_tensor():
    v = np.array([1, 5, 100, 7], np.int32)
    s = np.array([0, 1, 2, 3], np.int32)
    check_op(None, lambda x, y: x << y, vals=[v, s])
    check_op(None, lambda x, y: x >> y, vals=[v, s])


def test_shifts_python():
    v = np.array([1, 5, -8, 100], np.int32)
    check_op(None, lambda x: (x << 2) + (x >> 1), vals=[v], device="PYTHON")


# ----- pow -----

@pytest.mark.parametrize("e", [2, 3, 1, -1, -2, 0.5, 1.5, -0.5, 2.0, 17, 2.7])
def test_pow_scalar_exponent_positive_base(e):
    check_op(None, lambda x: x ** e, vals=[rand((3, 4), 0.2, 2.0, 1)], rtol=2e-3)


@pytest.mark.parametrize("e", [2, 3, -1, -3, 2.0, 3.0, -2.0])
def test_pow_negative_base_integer_exponent(e):
    check_op(None, lambda x: x ** e, vals=[-rand((3, 4), 0.3, 2.0, 2)], rtol=2e-3)


@pytest.mark.parametrize("e", [0.5, 1.5, -0.5, 2.7])
def test_pow_negative_base_fractional_exponent_is_nan(e):
    check_op(None, lambda x: x ** e, vals=[np.array([-2.0, -0.5, 1.5], np.float32)], forward_only=True)


def test_pow_mixed_sign_base_scalar():
    v = np.array([-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0], np.float32)
    for e in [2, 3, -1, -2, 4.0, 5.0]:
        check_op(None, lambda x: x ** e, vals=[v], rtol=2e-3)


@pytest.mark.parametrize("e", [0, 0.0])
def test_pow_zero_exponent(e):
    # x ** 0 is ones; torch keeps it in the graph (requires_grad, and x.grad is zeros)
    check_op(None, lambda x: x ** e, vals=[np.array([-2.0, 0.0, 1.5], np.float32)])


def test_pow_zero_base():
    v = np.array([0.0, -0.0, 1.0], np.float32)
    for e in [0, 0.0, 2, 2.5, -1, -2.5]:
        check_op(None, lambda x: x ** e, vals=[v], forward_only=True)


def test_pow_tensor_exponent():
    check_op(None, torch.pow, lambda x, y: x.pow(y), vals=[rand((3, 4), 0.2, 3.0, 1), rand((3, 4), -2, 2, 2)],
             rtol=2e-3)
    check_op(None, lambda x, y: x ** y, vals=[rand((3, 1), 0.2, 3.0, 3), rand((1, 4), -2, 2, 4)], rtol=2e-3)


def test_pow_tensor_exponent_negative_base_forward():
    b = np.array([-2.0, -2.0, -2.0, -3.0, 2.0, -0.5, -1.0], np.float32)
    e = np.array([2.0, 3.0, 0.5, -1.0, -1.5, 0.0, 1e9], np.float32)
    check_op(None, torch.pow, lambda x, y: x.pow(y), vals=[b, e], forward_only=True)


@pytest.mark.parametrize("b", [2, 2.0, 0.5, 3.5, 10])
def test_rpow(b):
    check_op(None, lambda x: b ** x, vals=[rand((3, 4), -2, 2, 6)], rtol=2e-3)


def test_rpow_negative_base():
    check_op(None, lambda x: (-2) ** x, vals=[np.array([0.0, 1.0, 2.0, 3.0, 0.5], np.float32)], forward_only=True)


@pytest.mark.parametrize("e", [0, 1, 2, 3, 5])
def test_pow_int_tensor(e):
    v = np.array([-3, -2, -1, 0, 1, 2, 3, 7], np.int32)
    check_op(None, lambda x: x ** e, vals=[v])


def test_pow_int_tensor_int_exponent_tensor():
    b = np.array([-3, -2, 2, 3, 5, 0, 1], np.int32)
    e = np.array([2, 3, 5, 0, 3, 4, 7], np.int32)
    check_op(None, torch.pow, lambda x, y: x.pow(y), vals=[b, e])


def test_pow_int_tensor_float_exponent():
    v = np.array([1, 2, 3, 4, 9], np.int32)
    check_op(None, lambda x: x ** 0.5, vals=[v])
    check_op(None, lambda x: x ** 2.5, vals=[v])
    check_op(None, lambda x: 2.0 ** x, vals=[v])


def test_pow_large_integer_exponent():
    check_op(None, lambda x: x ** 20, vals=[rand((5,), 0.5, 1.5, 9)], rtol=2e-3)
    check_op(None, lambda x: x ** -20, vals=[rand((5,), 0.5, 1.5, 9)], rtol=2e-3)


def test_pow_python():
    check_op(None, lambda x: x ** 3 + x ** 0.5, vals=[rand((2, 3), 0.2, 2, 1)], device="PYTHON", rtol=2e-3)
    check_op(None, lambda x: x ** -2, vals=[-rand((2, 3), 0.3, 2, 2)], device="PYTHON", rtol=2e-3)


# ----- copysign, logaddexp -----

def test_copysign():
    a = rand((4, 5), -3, 3, 0)
    b = np.random.default_rng(1).choice([-2.0, -0.0, 0.0, 1.0, 3.5, np.inf, -np.inf], (4, 5)).astype(np.float32)
    check_op(None, torch.copysign, lambda x, y: x.copysign(y), vals=[a, b], forward_only=True)
    # gradient w.r.t. the magnitude input (the sign input is a constant here)
    check_op(None, lambda x: torch.copysign(x, torch.tensor(b)), lambda x: x.copysign(Tensor(b)), vals=[a])


def test_copysign_grad_of_sign_input_is_zero():
    # the result doesn't depend smoothly on the sign input: torch gives zeros; fusegrad may give zeros or nothing
    a, b = Tensor([1.0, -2.0, 3.0], requires_grad=True), Tensor([-1.0, 2.0, 0.5], requires_grad=True)
    a.copysign(b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [-1.0, -1.0, 1.0])  # d|a|/da * sign(b)
    assert b.grad is None or not np.any(b.grad.numpy())


def test_copysign_scalar_and_int():
    a = rand((3, 4), -3, 3, 2)
    check_op(None, lambda x: torch.copysign(x, -1.0), lambda x: x.copysign(-1.0), vals=[a])
    check_op(None, lambda x: torch.copysign(x, 2.0), lambda x: x.copysign(2.0), vals=[a])
    ints = np.array([-3, 0, 2, -1], np.int32)
    check_op(None, lambda x, y: torch.copysign(x, y), lambda x, y: x.copysign(y),
             vals=[ints, np.array([1.0, -1.0, -0.0, 0.0], np.float32)], forward_only=True)


def test_copysign_nan_magnitude():
    a = np.array([np.nan, np.inf, 0.0, -0.0], np.float32)
    b = np.array([-1.0, -1.0, -1.0, 1.0], np.float32)
    out = Tensor(a).copysign(Tensor(b)).numpy()
    ref = torch.copysign(torch.tensor(a), torch.tensor(b)).numpy()
    assert np.isnan(out[0]) and np.array_equal(np.signbit(out[1:]), np.signbit(ref[1:]))
    np.testing.assert_array_equal(out[1:], ref[1:])


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (4,)), ((), (2, 3))], ids=str)
def test_logaddexp(shapes):
    check_op(shapes, torch.logaddexp, lambda x, y: x.logaddexp(y), low=-5, high=5)


def test_logaddexp_extremes():
    a = np.array([100.0, -100.0, 0.0, 50.0, 88.0, -np.inf], np.float32)
    b = np.array([100.0, -101.0, -np.inf, -50.0, 89.0, 3.0], np.float32)
    check_op(None, torch.logaddexp, lambda x, y: x.logaddexp(y), vals=[a, b], forward_only=True, rtol=1e-5)
    check_op(None, torch.logaddexp, lambda x, y: x.logaddexp(y), vals=[a[:2], b[:2] + 0.5], rtol=1e-5)


def test_logaddexp_both_neg_inf():
    # log(exp(-inf) + exp(-inf)) = -inf in torch
    check_op(None, torch.logaddexp, lambda x, y: x.logaddexp(y),
             vals=[np.array([-np.inf, np.inf], np.float32), np.array([-np.inf, np.inf], np.float32)], forward_only=True)


def test_logaddexp_scalar_and_python():
    check_op(None, lambda x: torch.logaddexp(x, torch.tensor(1.5)), lambda x: x.logaddexp(1.5),
             vals=[rand((3, 3), -3, 3, 1)])
    check_op([(2, 3), (2, 3)], torch.logaddexp, lambda x, y: x.logaddexp(y), device="PYTHON")
    b = rand((2, 3), -2, 2, 2)
    check_op(None, lambda x: torch.copysign(x, torch.tensor(b)), lambda x: x.copysign(Tensor(b, device="PYTHON")),
             vals=[rand((2, 3), -2, 2, 1)], device="PYTHON")


# ----- compositions: several of the new ops together, gradients through all of them -----

def test_activation_chain():
    check_op([(3, 4)], lambda x: F.gelu(F.silu(x) + F.softplus(x)).atan() * F.mish(x) - F.elu(x).sinh(),
             lambda x: (x.silu() + x.softplus()).gelu("none").atan() * x.mish() - x.elu().sinh(), rtol=2e-3)


def test_float64_activations():
    for tf, ff in [(F.gelu, lambda x: x.gelu("none")), (torch.erf, lambda x: x.erf()), (torch.atan, lambda x: x.atan()),
                   (F.mish, lambda x: x.mish()), (torch.asinh, lambda x: x.asinh())]:
        check_op([(3, 4)], tf, ff, dtype=np.float64, atol=1e-6)


def test_float16_activations():
    for tf, ff in [(F.gelu, lambda x: x.gelu("none")), (F.silu, lambda x: x.silu()), (F.softplus, lambda x: x.softplus()),
                   (torch.atan, lambda x: x.atan())]:
        check_op([(3, 4)], tf, ff, dtype=np.float16, atol=2e-3, rtol=1e-2, grad_atol=5e-3, grad_rtol=1e-2)


def test_int_input_promotes_to_float():
    v = np.array([-2, -1, 0, 1, 2], np.int32)
    for tf, ff in [(torch.atan, lambda x: x.atan()), (torch.erf, lambda x: x.erf()), (torch.log10, lambda x: x.log10()),
                   (torch.sinh, lambda x: x.sinh()), (torch.tan, lambda x: x.tan())]:
        check_op(None, tf, ff, vals=[v], atol=1e-6)
