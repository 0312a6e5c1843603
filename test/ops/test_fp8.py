"""fp8 dtypes (e4m3 "fn" and e5m2): storage, casts and math compared bit-exactly with ml_dtypes' float8_e4m3fn and
float8_e5m2 (round to nearest even; e4m3 turns inf/overflow into NaN, e5m2 into inf), on the C backend (emulated in
float32 by codegen: CPU, LLVM, CL, WEBGPU, ... as available) and the PYTHON reference backend."""
import math

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.device import is_dtype_supported
from fusegrad.dtype import float_to_fp8, fp8_to_float, least_upper_dtype

from .helpers import DEVICES

ml_dtypes = pytest.importorskip("ml_dtypes")

FP8 = [(dtypes.fp8e4m3, ml_dtypes.float8_e4m3fn), (dtypes.fp8e5m2, ml_dtypes.float8_e5m2)]
IDS = ["e4m3", "e5m2"]


def _probe_values(ml, n_random: int) -> np.ndarray:
    """Every finite fp8 value, the midpoints between neighbours (ties) and their float32 neighbours, specials and
    random values across the range."""
    vals = np.unique(np.arange(256, dtype=np.uint8).view(ml).astype(np.float32))
    fin = vals[np.isfinite(vals)]
    mids = ((fin[1:].astype(np.float64) + fin[:-1]) / 2).astype(np.float32)
    rng = np.random.default_rng(0)
    rand = np.concatenate([rng.standard_normal(n_random) * s for s in (1e-3, 1.0, 30.0, 3e4)]).astype(np.float32)
    specials = np.array([np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1e-30, -1e-30, 3e38, 1e6, -1e6], np.float32)
    return np.concatenate([fin, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                           rand, specials]).astype(np.float32)


@pytest.mark.parametrize("dt,ml", FP8, ids=IDS)
def test_scalar_conversions_exact(dt, ml):
    """The Python reference conversions (used for constants and by the PYTHON backend) match ml_dtypes bit for bit."""
    for b in range(256):
        want = float(np.array([b], np.uint8).view(ml)[0])
        got = fp8_to_float(b, dt)
        same_zero_sign = math.copysign(1, got) == math.copysign(1, want)
        assert (math.isnan(want) and math.isnan(got)) or (got == want and same_zero_sign)
    x = _probe_values(ml, 500).astype(np.float64)
    got = np.array([float_to_fp8(float(v), dt) for v in x], np.uint8)
    np.testing.assert_array_equal(got, x.astype(ml).view(np.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,ml", FP8, ids=IDS)
def test_cast_to_fp8_bits(dt, ml, device):
    x = _probe_values(ml, 5000 if device == "CPU" else 40)
    got = Tensor(x, device=device).cast(dt).bitcast(dtypes.uint8).numpy()
    np.testing.assert_array_equal(got, x.astype(ml).view(np.uint8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,ml", FP8, ids=IDS)
def test_decode_every_pattern(dt, ml, device):
    bits = np.arange(256, dtype=np.uint8)
    got = Tensor(bits, device=device).bitcast(dt).float().numpy()
    np.testing.assert_array_equal(got, bits.view(ml).astype(np.float32))
    # casts out of fp8 into ints and halves go through the value
    if is_dtype_supported(dtypes.half, device):   # PoCL's CL has no half
        halves = Tensor(bits, device=device).bitcast(dt).half().numpy()
        np.testing.assert_array_equal(halves, bits.view(ml).astype(np.float16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,ml", FP8, ids=IDS)
def test_math_rounds_like_ml_dtypes(dt, ml, device):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(64) * 4).astype(ml), (rng.standard_normal(64) * 4).astype(ml)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    assert ta.dtype == dt
    for got, want in ((ta + tb, a + b), (ta * tb, a * b), (ta - tb, a - b), (ta * 2.5, a * ml(2.5)),
                      (ta.maximum(tb), np.maximum(a, b))):
        assert got.dtype == dt
        np.testing.assert_array_equal(got.bitcast(dtypes.uint8).numpy(), want.view(np.uint8))
    np.testing.assert_array_equal((ta < tb).numpy(), a < b)


@pytest.mark.parametrize("dt,ml", FP8, ids=IDS)
def test_creation_and_readback(dt, ml):
    vals = [0.1, -1.7, 3.3, 1000.0]
    t = Tensor(vals, dtype=dt)
    assert t.dtype == dt and t.nbytes() == 4
    want = np.array(vals).astype(ml).astype(np.float32)
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(np.array(t.tolist(), np.float32), want)
    np.testing.assert_array_equal(Tensor(np.array(vals, np.float32), dtype=dt).numpy(), want)
    np.testing.assert_array_equal(Tensor(np.array(vals).astype(ml)).numpy(), want)   # an ml_dtypes array: its bytes
    # sum accumulates in float32 and rounds once to fp8 at the end
    np.testing.assert_array_equal(t.sum().numpy(), want.sum().astype(ml).astype(np.float32))


def test_promotion():
    e4, e5 = dtypes.fp8e4m3, dtypes.fp8e5m2
    assert least_upper_dtype(e4, e5) == dtypes.float16
    assert least_upper_dtype(e4, dtypes.int32) == e4 and least_upper_dtype(e5, dtypes.uint64) == e5
    assert least_upper_dtype(e4, dtypes.bfloat16) == dtypes.bfloat16
    assert (Tensor([1.0], dtype=e4) + 2.5).dtype == e4
    assert (Tensor([1.0], dtype=e4) + Tensor([1], dtype=dtypes.int8)).dtype == e4
    assert dtypes.is_float(e4) and dtypes.finfo(e4) == (4, 3) and dtypes.finfo(e5) == (5, 2)
