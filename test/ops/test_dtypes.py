"""Every dtype through elementwise ops, casts between all pairs, bitcasts, bfloat16, and type promotion (strong dtype
pairs vs torch.promote_types; weak Python scalars and weak 0-d tensors made from them), bfloat16()/short(), and the
wrap-around of 8/16-bit arithmetic under a fused widening cast. torch is the reference where it implements the op;
for the unsigned 16/32/64-bit types, where torch has no add/compare kernels, NumPy (same wrap-around semantics) is."""
import numpy as np
import pytest
import torch

from fusegrad import Device, Tensor, dtypes
from fusegrad.dtype import least_upper_dtype, to_dtype, to_np_dtype

from .helpers import DEVICES, check_op

ALL = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
       "float64"]
TORCH_LACKS_ARITH = ("uint16", "uint32", "uint64")


def sample(dt, seed=0, shape=(3, 4)):
    rng = np.random.default_rng(seed)
    if dt == "bool": return rng.random(shape) < 0.5
    if dt.startswith("float"): return rng.uniform(-8, 8, shape).astype(dt)
    info = np.iinfo(dt)
    lo, hi = max(info.min, -100), min(info.max, 100)
    return rng.integers(lo, hi, shape).astype(dt)


# ----- elementwise ops on every dtype -----

# (name, torch fn, fusegrad fn, numpy fn)
ELEMENTWISE = [("add", lambda a, b: a + b, lambda a, b: a + b, lambda a, b: a + b),
               ("mul", lambda a, b: a * b, lambda a, b: a * b, lambda a, b: a * b),
               ("lt", lambda a, b: a < b, lambda a, b: a < b, lambda a, b: a < b),
               ("eq", lambda a, b: a == b, lambda a, b: a == b, lambda a, b: a == b),
               ("ne", lambda a, b: a != b, lambda a, b: a != b, lambda a, b: a != b),
               ("maximum", torch.maximum, lambda a, b: a.maximum(b), np.maximum)]


@pytest.mark.parametrize("dt", ALL)
@pytest.mark.parametrize("name,tf,ff,nf", ELEMENTWISE, ids=[e[0] for e in ELEMENTWISE])
def test_elementwise_dtype(name, tf, ff, nf, dt):
    a, b = sample(dt, 1), sample(dt, 2)
    if dt in TORCH_LACKS_ARITH and name in ("add", "lt", "maximum"):
        out = ff(Tensor(a), Tensor(b))
        assert out.dtype == to_dtype("bool" if name == "lt" else dt)
        np.testing.assert_array_equal(out.numpy(), nf(a, b))
        return
    check_op(None, tf, ff, vals=[a, b], forward_only=True)


@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "int32", "uint16", "uint32"])
def test_int_overflow_wraps(dt):
    info = np.iinfo(dt)
    a = np.array([info.max, info.min, info.max - 1], dt)
    b = np.array([1, -1, 2] if info.min < 0 else [1, 1, 2], dt)
    with np.errstate(over="ignore"):
        ref_add, ref_mul = (a + b), (a * np.array(2, dt))
    out = (Tensor(a) + Tensor(b))
    assert out.dtype == to_dtype(dt)
    np.testing.assert_array_equal(out.numpy(), ref_add)
    np.testing.assert_array_equal((Tensor(a) * 2).numpy(), ref_mul)


@pytest.mark.parametrize("dt", ["int64", "uint64"])
def test_64bit_extremes(dt):
    info = np.iinfo(dt)
    a = np.array([info.max, info.min, 2 ** 40 + 7, 3], dt)
    b = np.array([0, 0, 2 ** 33, 5], dt)
    np.testing.assert_array_equal((Tensor(a) + Tensor(b)).numpy(), a + b)
    np.testing.assert_array_equal((Tensor(a) < Tensor(b)).numpy(), a < b)
    np.testing.assert_array_equal(Tensor(a).numpy(), a)
    np.testing.assert_array_equal(Tensor(a).max().numpy(), a.max())


@pytest.mark.parametrize("dt", ["float16", "float32", "float64"])
def test_float_dtype_div_and_grad(dt):
    tol = {"float16": 5e-3, "float32": 1e-6, "float64": 1e-12}[dt]
    b = np.random.default_rng(3).uniform(0.5, 2, (3, 4)).astype(dt)
    check_op(None, lambda x, y: x / y + x * y, vals=[sample(dt, 4), b], atol=tol * 10, rtol=tol,
             grad_atol=tol * 10, grad_rtol=tol)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_sum_keeps_dtype(dt):
    # torch: sum of a half/bfloat16 tensor is half/bfloat16 (accumulated in float32 internally)
    v = np.random.default_rng(5).uniform(-1, 1, (4, 8)).astype(np.float32)
    tt = torch.tensor(v).to(getattr(torch, dt))
    ft = Tensor(v).cast(dt)
    for t_out, f_out in [(tt.sum(), ft.sum()), (tt.sum(1), ft.sum(1))]:
        assert f_out.dtype == to_dtype(dt), f"{f_out.dtype} != {dt}"
        np.testing.assert_allclose(f_out.float().numpy(), t_out.float().numpy(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dt", ALL)
def test_dtype_python_backend(dt):
    a, b = sample(dt, 6, (2, 3)), sample(dt, 7, (2, 3))
    fa, fb = Tensor(a, device="PYTHON"), Tensor(b, device="PYTHON")
    np.testing.assert_array_equal((fa * fb).numpy(), Tensor(a).mul(Tensor(b)).numpy())
    np.testing.assert_array_equal((fa == fb).numpy(), a == b)
    np.testing.assert_array_equal(fa.cast("float32").numpy(), a.astype(np.float32))


# ----- casts between all pairs -----

def cast_values(src, dst):
    """A few values whose conversion is defined in C, torch and numpy alike (no out-of-range float->int)."""
    if src == "bool": return np.array([True, False, True], np.bool_)
    vals = [0, 1, 2, 7, 100]
    if src.startswith("float"):
        vals += [0.5, 2.7, 99.9]
        if not dst.startswith("uint") and dst != "uint8": vals += [-1.5, -3.0, -0.7]
        if dst.startswith("float") or dst == "bool": vals += [-100.25, 1e-3]
    elif not src.startswith("uint"):
        vals += [-1, -2, -100]   # int -> unsigned wraps modulo 2^bits, like torch and numpy
    return np.array(vals).astype(src)


@pytest.mark.parametrize("dst", ALL)
@pytest.mark.parametrize("src", ALL)
def test_cast_pairs(src, dst):
    v = cast_values(src, dst)
    out = Tensor(v).cast(dst)
    assert out.dtype == to_dtype(dst) and out.shape == v.shape
    ref = torch.tensor(v).to(getattr(torch, dst)).numpy()
    np.testing.assert_array_equal(out.numpy(), ref, err_msg=f"{src} -> {dst}: {v}")


@pytest.mark.parametrize("dst", ["int32", "bool", "float16", "uint8", "float64"])
@pytest.mark.parametrize("src", ["float32", "int64", "bool"])
def test_cast_python(src, dst):
    v = cast_values(src, dst)
    out = Tensor(v, device="PYTHON").cast(dst)
    np.testing.assert_array_equal(out.numpy(), torch.tensor(v).to(getattr(torch, dst)).numpy())


def test_cast_float_specials():
    v = np.array([np.inf, -np.inf, np.nan, 65520.0, -70000.0, 1e-8, 6e-8, 3e38], np.float32)
    for dst in ["float16", "float64", "bool"]:
        np.testing.assert_array_equal(Tensor(v).cast(dst).numpy(), torch.tensor(v).to(getattr(torch, dst)).numpy())
    w = np.array([np.inf, -np.inf, np.nan, 1e300, -1e300, 1e-300], np.float64)
    np.testing.assert_array_equal(Tensor(w).cast("float32").numpy(), torch.tensor(w).float().numpy())


def test_cast_rounds_to_nearest_even_half():
    # float32 -> float16 rounds to nearest even (2049 is halfway between 2048 and 2050)
    v = np.array([2049.0, 2051.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 0.1], np.float32)
    np.testing.assert_array_equal(Tensor(v).half().numpy(), torch.tensor(v).half().numpy())


def test_cast_grad_through_float_dtypes():
    check_op([(3, 4)], lambda x: (x.double() * 2).half().float() * x, lambda x: (x.double() * 2).half().float() * x,
             atol=1e-2, rtol=1e-3, grad_atol=1e-2)


# ----- bitcast -----

SAME_SIZE = [("float32", "int32"), ("float32", "uint32"), ("int32", "float32"), ("uint32", "int32"),
             ("float16", "int16"), ("float16", "uint16"), ("int16", "float16"), ("float64", "int64"),
             ("int64", "float64"), ("uint64", "int64"), ("int8", "uint8"), ("uint8", "int8"), ("int64", "uint64")]


@pytest.mark.parametrize("src,dst", SAME_SIZE, ids=str)
def test_bitcast_same_size(src, dst):
    if src.startswith("float"): v = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 1e-3, 65504 if src ==
                                              "float16" else 3.4e38], src)
    else:
        info = np.iinfo(src)
        v = np.array([0, 1, -1 if info.min < 0 else info.max, info.min, info.max, 12345 % (info.max + 1)], src)
    out = Tensor(v).bitcast(dst)
    assert out.dtype == to_dtype(dst)
    np.testing.assert_array_equal(out.numpy().view(np.uint8), v.view(dst).view(np.uint8))


DIFF_SIZE = [("float32", "uint8", (2, 3)), ("uint8", "float32", (2, 8)), ("int16", "int32", (3, 4)),
             ("int32", "int16", (3,)), ("float64", "float32", (2, 2)), ("float32", "float64", (4,)),
             ("uint32", "uint16", (2, 2)), ("uint8", "uint64", (1, 16)), ("float16", "uint8", (5,)),
             ("int64", "int8", (2,))]


@pytest.mark.parametrize("src,dst,shape", DIFF_SIZE, ids=str)
def test_bitcast_different_size(src, dst, shape):
    rng = np.random.default_rng(8)
    v = rng.integers(0, 256, int(np.prod(shape)) * np.dtype(src).itemsize, dtype=np.uint8).view(src).reshape(shape)
    if src.startswith("float"): v = np.where(np.isfinite(v), v, 1.0).astype(src)   # keep NaN payloads out of it
    out = Tensor(v).bitcast(dst)
    ref = v.view(dst)   # numpy: the last axis grows or shrinks (little endian)
    assert out.dtype == to_dtype(dst) and out.shape == ref.shape
    np.testing.assert_array_equal(out.numpy().view(np.uint8), ref.view(np.uint8))


def test_bitcast_errors_and_python():
    with pytest.raises(RuntimeError):
        Tensor(np.zeros(3, np.uint8)).bitcast("float32")      # 3 bytes don't make a float32
    v = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(Tensor(v, device="PYTHON").bitcast("int32").numpy(), v.view(np.int32))
    np.testing.assert_array_equal(Tensor(v, device="PYTHON").bitcast("uint8").numpy(), v.view(np.uint8))


def test_bitcast_of_computed_value():
    v = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal((Tensor(v) * 2).bitcast("int32").numpy(), (v * 2).view(np.int32))


# ----- bfloat16 -----

BF = torch.bfloat16


def bf_vals(seed, shape=(3, 5)):
    return np.random.default_rng(seed).uniform(-4, 4, shape).astype(np.float32)


def test_bfloat16_roundtrip_cast():
    v = np.array([1.0, 1.00390625, 1.01171875, -3.14159, 1e30, -1e-30, 65504.0, 3.3895e38, np.inf, -np.inf], np.float32)
    out = Tensor(v).cast("bfloat16")
    assert out.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(out.float().numpy(), torch.tensor(v).to(BF).float().numpy())
    np.testing.assert_array_equal(out.numpy(), torch.tensor(v).to(BF).float().numpy())
    assert np.isnan(Tensor([np.nan]).cast("bfloat16").float().numpy()[0])


@pytest.mark.parametrize("name,fn", [("add", lambda a, b: a + b), ("mul", lambda a, b: a * b),
                                     ("sub", lambda a, b: a - b), ("div", lambda a, b: a / b)])
def test_bfloat16_arith(name, fn):
    a, b = bf_vals(1), np.abs(bf_vals(2)) + 0.5
    out = fn(Tensor(a).cast("bfloat16"), Tensor(b).cast("bfloat16"))
    ref = fn(torch.tensor(a).to(BF), torch.tensor(b).to(BF))
    assert out.dtype == dtypes.bfloat16
    # torch rounds each op's result to bfloat16 once: add/sub/mul must match exactly. fusegrad divides as a * (1/b),
    # two roundings, so a division may be one bfloat16 ulp (2^-7 relative) off
    if name == "div": np.testing.assert_allclose(out.float().numpy(), ref.float().numpy(), rtol=2 ** -7, atol=0)
    else: np.testing.assert_array_equal(out.float().numpy(), ref.float().numpy())


def test_bfloat16_sum_and_scalar():
    a = bf_vals(3, (4, 16))
    ta, fa = torch.tensor(a).to(BF), Tensor(a).cast("bfloat16")
    np.testing.assert_allclose(fa.sum(1).float().numpy(), ta.sum(1).float().numpy(), rtol=8e-3, atol=1e-2)
    out = fa * 2.5
    assert out.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(out.float().numpy(), (ta * 2.5).float().numpy())


@pytest.mark.parametrize("dst", ["float32", "float16", "int32", "int8", "bool", "float64", "uint8"])
def test_bfloat16_cast_to(dst):
    v = np.array([0.0, 1.0, 2.5, -3.75, 100.0, 0.125], np.float32)
    if dst == "uint8": v = np.abs(v)
    out = Tensor(v).cast("bfloat16").cast(dst)
    np.testing.assert_array_equal(out.numpy(), torch.tensor(v).to(BF).to(getattr(torch, dst)).numpy())


def test_bfloat16_from_ints_and_compare_python():
    v = np.array([1, 257, -1000, 12345], np.int32)
    np.testing.assert_array_equal(Tensor(v).cast("bfloat16").float().numpy(), torch.tensor(v).to(BF).float().numpy())
    a, b = bf_vals(4, (2, 3)), bf_vals(5, (2, 3))
    fa, fb = Tensor(a, device="PYTHON").cast("bfloat16"), Tensor(b, device="PYTHON").cast("bfloat16")
    np.testing.assert_array_equal((fa < fb).numpy(), (torch.tensor(a).to(BF) < torch.tensor(b).to(BF)).numpy())
    np.testing.assert_array_equal((fa + fb).float().numpy(), (torch.tensor(a).to(BF) + torch.tensor(b).to(BF))
                                  .float().numpy())


# ----- promotion -----

PROMO_DTYPES = ALL + ["bfloat16"]


@pytest.mark.parametrize("b", PROMO_DTYPES)
@pytest.mark.parametrize("a", PROMO_DTYPES)
def test_least_upper_dtype_vs_torch(a, b):
    try:
        want = torch.promote_types(getattr(torch, a), getattr(torch, b))
    except RuntimeError:
        want = None   # torch doesn't promote uint16/32/64 with other types
    got = least_upper_dtype(to_dtype(a), to_dtype(b))
    assert least_upper_dtype(to_dtype(b), to_dtype(a)) == got, "promotion must be symmetric"
    if want is not None:
        assert got == to_dtype(str(want).replace("torch.", "")), f"{a} + {b}: {got} vs torch {want}"
    else:
        assert got in (to_dtype(a), to_dtype(b)) or dtypes.is_float(got) or got in dtypes.ints


@pytest.mark.parametrize("a,b", [("int8", "uint8"), ("bool", "float16"), ("int32", "float32"), ("uint8", "int64"),
                                 ("float16", "bfloat16"), ("int64", "float16"), ("bool", "int8"), ("int16", "uint16")],
                         ids=str)
def test_binary_op_result_dtype(a, b):
    x, y = Tensor([1, 0, 1]).cast(a), Tensor([1, 1, 0]).cast(b)
    want = least_upper_dtype(to_dtype(a), to_dtype(b))
    for out in (x + y, x * y, y * x, x.maximum(y)):
        assert out.dtype == want, f"{a} op {b}: {out.dtype} != {want}"
    assert (x < y).dtype == dtypes.bool
    if a not in TORCH_LACKS_ARITH and b not in TORCH_LACKS_ARITH and a != "bfloat16" and b != "bfloat16":
        tx, ty = torch.tensor([1, 0, 1]).to(getattr(torch, a)), torch.tensor([1, 1, 0]).to(getattr(torch, b))
        np.testing.assert_array_equal((x + y).numpy(), (tx + ty).numpy())


SCALAR_PROMO = [
    ("int32", lambda t: t * 2.5, "float32"), ("int8", lambda t: t * 2.5, "float32"),
    ("uint8", lambda t: t + 1.0, "float32"),
    ("float16", lambda t: t * 2.5, "float16"), ("bfloat16", lambda t: t * 2.5, "bfloat16"),
    ("float64", lambda t: t + 1, "float64"), ("float16", lambda t: t + 3, "float16"),
    ("int8", lambda t: t + 1, "int8"), ("uint8", lambda t: t * 3, "uint8"), ("int16", lambda t: 2 - t, "int16"),
    ("int64", lambda t: t + 1, "int64"), ("int32", lambda t: t + True, "int32"),
    ("bool", lambda t: t + 1, "int32"), ("bool", lambda t: t * 2.5, "float32"), ("bool", lambda t: t & True, "bool"),
    ("bool", lambda t: t + True, "bool"), ("float32", lambda t: t * True, "float32"),
    ("int32", lambda t: t / 2, "float32"), ("int8", lambda t: t / 2, "float32"),
    ("float16", lambda t: t / 3, "float16"),
    ("uint16", lambda t: t + 1, "uint16"), ("int32", lambda t: t ** 2, "int32"), ("int32", lambda t: t // 2, "int32"),
    ("int32", lambda t: 2.5 * t, "float32"), ("uint8", lambda t: t - 1.5, "float32"),
]


@pytest.mark.parametrize("dt,fn,want", SCALAR_PROMO, ids=[f"{s[0]}-{i}" for i, s in enumerate(SCALAR_PROMO)])
def test_scalar_weak_promotion(dt, fn, want):
    v = np.array([0, 1, 2, 3], np.float32)
    out = fn(Tensor(v).cast(dt))
    assert out.dtype == to_dtype(want), f"{dt}: {out.dtype} != {want}"
    # values match torch (torch's bool + int is int64: compare values only)
    tdt = getattr(torch, dt)
    if dt not in TORCH_LACKS_ARITH:
        ref = fn(torch.tensor(v).to(tdt))
        if dt != "bool" or want != "int32": assert str(ref.dtype).replace("torch.", "") == want
        np.testing.assert_allclose(out.float().numpy(), ref.float().numpy(), rtol=1e-3)


# ----- the renderer advertises them all -----

def test_cpu_supported_dtypes():
    sup = Device["CPU"].renderer.supported_dtypes()
    for name in ALL + ["bfloat16"]:
        assert to_dtype(name) in sup, f"CPU renderer doesn't list {name}"


def test_python_supported_dtypes():
    sup = Device["PYTHON"].renderer.supported_dtypes()
    for name in ALL:
        assert to_dtype(name) in sup


# ----- edge shapes per dtype -----

@pytest.mark.parametrize("dt", ["int8", "uint32", "float16", "bool", "int64"])
def test_empty_and_0d_per_dtype(dt):
    e = Tensor(np.zeros((0, 3), dt))
    assert e.dtype == to_dtype(dt) and (e + e).shape == (0, 3) and (e * e).numpy().dtype == np.dtype(dt)
    z = Tensor(np.array(1, dt))
    assert z.shape == () and z.dtype == to_dtype(dt)
    np.testing.assert_array_equal((z == z).numpy(), np.array(True))
    assert z.cast("float32").item() == 1.0


def test_bitcast_out_of_emulated_bfloat16():
    """bfloat16 -> a 16-bit type keeps the bf16 bits (CPU emulates bf16 in float32; the bits are its top half)."""
    v = np.array([1.0, 2.0, -3.5, 1e-3, -np.inf], np.float32)
    ref = torch.tensor(v).to(torch.bfloat16)
    for dev in ("CPU", "PYTHON"):
        for dst, tdt in (("uint16", torch.int16), ("int16", torch.int16), ("float16", torch.float16)):
            out = Tensor(v, device=dev).cast("bfloat16").bitcast(dst)
            if dev == "PYTHON" and dst == "float16":  # the interpreter holds floats as Python floats: NaN payloads go
                np.testing.assert_array_equal(out.numpy(), ref.view(tdt).numpy())
            else: np.testing.assert_array_equal(out.numpy().view(np.uint16), ref.view(tdt).numpy().view(np.uint16))
        # and back: 16 bits -> bfloat16
        back = Tensor(ref.view(torch.int16).numpy().view(np.uint16), device=dev).bitcast("bfloat16").float().numpy()
        np.testing.assert_array_equal(back, ref.float().numpy())


# ----- 0-d tensors made from Python numbers promote weakly (like the numbers themselves; torch's 0-d rule) -----

WEAK_DTYPES = ALL + ["bfloat16"]
# (name, fn on fusegrad or torch tensors, the same on NumPy arrays)
WEAK_OPS = [("add", lambda a, s: a + s, np.add), ("radd", lambda a, s: s + a, lambda a, s: s + a),
            ("mul", lambda a, s: a * s, np.multiply), ("rsub", lambda a, s: s - a, lambda a, s: s - a),
            ("maximum", lambda a, s: a.maximum(s) if isinstance(a, Tensor) else torch.maximum(a, s), np.maximum),
            ("lt", lambda a, s: a < s, np.less), ("eq", lambda a, s: a == s, np.equal),
            ("where", lambda a, s: (a > 1).where(a, s) if isinstance(a, Tensor) else torch.where(a > 1, a, s),
             lambda a, s: np.where(a > 1, a, s))]


def _weak_reference(dt, v, sv, fn, nfn):
    """The result (values, torch dtype) of `fn(dimensioned tensor of dt, torch.tensor(sv))` in torch. torch has no
    arithmetic kernels for uint16/32/64: there the dtype is torch.result_type's and the values are NumPy's with both
    operands in that dtype (the same wrap-around arithmetic)."""
    tt, ts = torch.tensor(v).to(getattr(torch, dt)), torch.tensor(sv)
    if dt not in TORCH_LACKS_ARITH:
        ref = fn(tt, ts)
        return ref.double().numpy(), ref.dtype
    ct = torch.result_type(tt, ts)
    npct = str(ct).replace("torch.", "")
    with np.errstate(over="ignore"):
        ref = nfn(v.astype(dt).astype(npct), np.array(sv).astype(npct))
    return ref.astype(np.float64), torch.bool if ref.dtype == np.bool_ else ct


@pytest.mark.parametrize("sv", [3, -2, 2.5, True], ids=["int", "negint", "float", "bool"])
@pytest.mark.parametrize("op,fn,nfn", WEAK_OPS, ids=[o[0] for o in WEAK_OPS])
@pytest.mark.parametrize("dt", WEAK_DTYPES)
def test_weak_0d_python_number_tensor(dt, op, fn, nfn, sv):
    """`x OP Tensor(python number)` has torch's `x OP torch.tensor(python number)` dtype and values, for every dtype
    of x (torch's int64 default int is fusegrad's int32 where the number decides the dtype)."""
    v = np.array([0, 1, 2, 3], np.float32)
    if op == "rsub" and (dt == "bool" or sv is True):   # torch refuses any bool subtraction
        with pytest.raises(RuntimeError, match="Subtraction"): fn(torch.tensor(v).to(getattr(torch, dt)), torch.tensor(sv))
        if dt == "bool" and sv is True:   # bool - bool: NumPy refuses it too, and so does fusegrad
            with pytest.raises(RuntimeError, match="Subtraction"): fn(Tensor(v).cast(dt), Tensor(sv))
            return
        # one bool side: it counts as an int 0/1, as in tinygrad and NumPy; the dtype is addition's
        out, like = fn(Tensor(v).cast(dt), Tensor(sv)), Tensor(sv) + Tensor(v).cast(dt)
        assert out.dtype == like.dtype
        want = float(sv) - v.astype(dt).astype(np.float64) if dt != "bfloat16" else float(sv) - v
        if dtypes.is_int(out.dtype): want = want.astype(np.int64).astype(to_np_dtype(out.dtype)).astype(np.float64)
        np.testing.assert_allclose(out.numpy().astype(np.float64), want, rtol=1e-2 if dt == "bfloat16" else 1e-6)
        return
    out = fn(Tensor(v).cast(dt), Tensor(sv))
    want_vals, want_dt = _weak_reference(dt, v, sv, fn, nfn)
    want = str(want_dt).replace("torch.", "")
    if want == "int64" and dt != "int64": want = "int32"
    assert out.dtype == to_dtype(want), f"{dt} {op} Tensor({sv!r}): {out.dtype} != torch {want_dt}"
    np.testing.assert_allclose(out.numpy().astype(np.float64), want_vals, rtol=1e-2 if dt == "bfloat16" else 1e-6)


def test_weak_0d_tensor_dtypes_and_strong_forms():
    # the tensor itself keeps the default dtypes
    assert Tensor(3).dtype == dtypes.int32 and Tensor(2.5).dtype == dtypes.float32 and Tensor(True).dtype == dtypes.bool
    i8 = Tensor(np.array([1, -2, 3], np.int8))
    assert (i8 + Tensor(3)).dtype == dtypes.int8 and (Tensor(3) * i8).dtype == dtypes.int8
    np.testing.assert_array_equal((i8 + Tensor(3)).numpy(), np.array([1, -2, 3], np.int8) + 3)
    # an explicit dtype makes it strong, like a 0-d NumPy array under NEP 50
    for dt in ("int32", "int64", "float16"):
        a, b = np.array([1, -2, 3], np.int8), np.array(3, dt)
        out = i8 + Tensor(3, dtype=dt)
        assert out.dtype == to_dtype(str((a + b).dtype)), dt
        np.testing.assert_array_equal(out.numpy(), a + b)
    # two weak 0-d tensors: the default dtypes (torch: int64 / float32)
    assert (Tensor(3) + Tensor(4)).dtype == dtypes.int32 and (Tensor(3) + Tensor(4)).item() == 7
    ref = torch.tensor(3) * torch.tensor(2.5)
    assert (Tensor(3) * Tensor(2.5)).dtype == dtypes.float32 == to_dtype(str(ref.dtype)[6:])
    # a float16 tensor times a weak float: float16 (torch too); a weak int with an int: the int's dtype
    h = Tensor(np.array([1.5, 2.0], np.float16))
    assert (h * Tensor(2.5)).dtype == dtypes.float16 == to_dtype(str((torch.tensor([1.5, 2.0], dtype=torch.float16)
                                                                      * torch.tensor(2.5)).dtype)[6:])
    np.testing.assert_array_equal((h * Tensor(2.5)).numpy(), np.array([3.75, 5.0], np.float16))


def test_weak_0d_gradient():
    # a weak float 0-d tensor that requires grad: the result keeps x's float16 dtype, both get gradients like torch
    xv = np.array([1.0, -2.0, 0.5], np.float16)
    x, s = Tensor(xv, requires_grad=True), Tensor(2.5, requires_grad=True)
    xt, st = torch.tensor(xv, requires_grad=True), torch.tensor(2.5, requires_grad=True)
    out, ref = x * s, xt * st
    assert out.dtype == dtypes.float16 and ref.dtype == torch.float16
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())
    assert s.grad.dtype == dtypes.float32 and st.grad.dtype == torch.float32
    np.testing.assert_allclose(s.grad.numpy(), st.grad.numpy())


# ----- bfloat16() / short() -----

def test_bfloat16_and_short_methods():
    v = np.array([1.0, -2.7, 3.3, 70000.5, -40000.0], np.float32)
    b = Tensor(v).bfloat16()
    assert b.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(b.float().numpy(), torch.tensor(v).bfloat16().float().numpy())
    iv = np.array([1.9, -2.7, 3.3, 32767.0, -32768.0], np.float32)
    s = Tensor(iv).short()
    assert s.dtype == dtypes.int16 == to_dtype(str(torch.tensor(iv).short().dtype)[6:])
    np.testing.assert_array_equal(s.numpy(), torch.tensor(iv).short().numpy())
    np.testing.assert_array_equal(Tensor(np.array([70000, -5], np.int32)).short().numpy(),
                                  torch.tensor([70000, -5], dtype=torch.int32).short().numpy())



@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "uint16"])
def test_narrow_int_wraps_before_a_fused_widening_cast(dt, device):
    """`(x OP c).cast(wider)` wraps in x's dtype first (torch's `(x * 100).int()` of int8 x; NumPy the same), also when
    a cast to a wider type, a comparison or a reduction is fused into the same kernel: C's integer promotion would
    widen the 8/16-bit arithmetic (the C renderer narrows each result back), and the symbolic comparison/division
    folds must not treat a product that can wrap as its exact value ((x * 100) < 1 is not x < 1)."""
    from fusegrad.device import is_dtype_supported
    for need in (dt, "int64", "float64"):
        if not is_dtype_supported(to_dtype(need), device): pytest.skip(f"{need} is not supported on {device}")
    v = np.array([0, 1, 2, 3, 100, -100 if dt.startswith("int") else 200], dt)
    def c(k): return np.array(k).astype(dt)   # the constant in x's dtype, wrapped like torch's
    k, top = (100 if np.dtype(dt).itemsize == 1 else 1000), int(np.iinfo(dt).max) - 1
    with np.errstate(over="ignore"):
        cases = [((lambda a: (a * k).cast("int32")), (v * c(k)).astype(np.int32)),
                 ((lambda a: (a + top).cast("float64")), (v + c(top)).astype(np.float64)),
                 ((lambda a: (3 - a).cast("int64")), (c(3) - v).astype(np.int64)),
                 ((lambda a: (a * k) < 1), (v * c(k)) < 1),                         # comparisons see the wrapped value
                 ((lambda a: (a * k).sum().cast("int64")), np.array((v * c(k)).astype(np.int64).sum()))]
    if dt == "int8":  # and torch agrees where it has the dtype
        assert (torch.tensor(v) * 100).int().tolist() == cases[0][1].tolist()
        assert ((torch.tensor(v) * 100) < 1).tolist() == cases[3][1].tolist()
        assert (torch.tensor(v) * 100).sum().item() == cases[4][1].item()
    got = [fn(Tensor(v, device=device)).numpy() for fn, _ in cases]
    for g, (_, want) in zip(got, cases): np.testing.assert_array_equal(g, want)
