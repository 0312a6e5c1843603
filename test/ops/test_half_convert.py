"""float16 and bfloat16 <-> float32 conversions compared bit for bit with NumPy (float16) and ml_dtypes (bfloat16):
round to nearest even, -0.0, subnormals, values that round to inf, inf, and NaN (a NaN stays a NaN of its sign; its
payload is the hardware's, so only NaN-ness and sign are compared). Each C-rendering backend runs the casts twice:
as the heuristic compiles them (scalar elementwise loops) and with every kernel forced to VECTORIZE its innermost
range, so the whole-vector conversions (F16C on x86, shifts for bfloat16) run too."""
import numpy as np
import pytest

from fusegrad import Context, Device, Tensor, dtypes
from fusegrad.device import is_dtype_supported

from .helpers import DEVICES

ml_dtypes = pytest.importorskip("ml_dtypes")

HALVES = [(dtypes.float16, np.float16), (dtypes.bfloat16, ml_dtypes.bfloat16)]
IDS = ["float16", "bfloat16"]
INF16 = {dtypes.float16: 0x7C00, dtypes.bfloat16: 0x7F80}


def _probe_f32(np_dt) -> np.ndarray:
    """Every 16-bit value's float32 neighbours and the midpoints between neighbours (ties), float32 specials, and
    random values across both formats' ranges; a multiple of 16 long, so 4/8/16-lane vectors cover all of it."""
    vals = np.arange(1 << 16, dtype=np.uint16).view(np_dt).astype(np.float32)
    fin = np.unique(vals[np.isfinite(vals)])
    mids = ((fin[1:].astype(np.float64) + fin[:-1]) / 2).astype(np.float32)
    up, down = np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))
    rng = np.random.default_rng(0)
    rand = np.concatenate([rng.standard_normal(4096) * s for s in (1e-40, 1e-6, 1.0, 6e4, 1e37)]).astype(np.float32)
    bits = np.array([0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7FA00000, 0x7F7FFFFF, 0xFF7FFFFF,
                     0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x80000000], np.uint32).view(np.float32)
    specials = np.array([np.inf, -np.inf, 0.0, -0.0, 65504, 65519.996, 65520, -65520, 2 ** -24, 2 ** -25,
                         3 * 2 ** -25, 2 ** -26], np.float32)
    out = np.concatenate([fin, mids, up, down, rand, bits, specials]).astype(np.float32)
    return np.concatenate([out, np.zeros(-len(out) % 16, np.float32)])


def _assert_bits_equal(got: np.ndarray, want: np.ndarray, is_nan: np.ndarray, inf_bits: int, what: str) -> None:
    """Equal bit patterns where the reference is not NaN; where it is, any NaN (exponent all ones, mantissa not zero:
    payload and sign of a NaN are the hardware's)."""
    magnitude = got & np.array(inf_bits | (inf_bits - 1) | (inf_bits >> 1), got.dtype)  # all but the sign bit
    ok = np.where(is_nan, magnitude > inf_bits, got == want)
    bad = np.flatnonzero(~ok)
    assert len(bad) == 0, f"{what}: {len(bad)} wrong, e.g. " + ", ".join(f"{hex(int(want[i]))} -> {hex(int(got[i]))}"
                                                                         for i in bad[:6])


@pytest.fixture(params=["scalar", "vector16", "vector8"])
def lanes(request, monkeypatch):
    """'vectorN': every kernel gets VECTORIZE(N) on its innermost constant range that N divides (the heuristic
    vectorizes reduce kernels only, so elementwise casts would otherwise only run lane by lane)."""
    if request.param == "scalar":
        yield request.param
        return
    from fusegrad import codegen
    from fusegrad.codegen.opt import Opt
    from fusegrad.engine import realize
    from fusegrad.ir.ops import Ops
    from fusegrad.ir.pattern import graph_rewrite
    from fusegrad.ir.symbolic import pm_symbolic
    width, orig = int(request.param[len("vector"):]), codegen.to_program

    def forced(ast, ren, opts=None):
        if opts is not None or ren.has_local: return orig(ast, ren, opts)
        rngs = [n for n in graph_rewrite(ast, pm_symbolic).toposort() if n.op is Ops.RANGE and n.src[0].op is Ops.CONST
                and n.src[0].arg % width == 0]
        return orig(ast, ren, [Opt("VECTORIZE", max(r.arg[0] for r in rngs), width)] if rngs else None)
    monkeypatch.setattr(codegen, "to_program", forced)
    realize._programs.clear()
    with Context(CACHELEVEL=0): yield request.param  # no program cache: it would hand back the unforced program
    realize._programs.clear()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,np_dt", HALVES, ids=IDS)
def test_from_float32_bits(dt, np_dt, device, lanes):
    """float32 -> 16 bits: one round to nearest even, overflow to inf, NaN stays NaN."""
    if not is_dtype_supported(dt, device): pytest.skip(f"{dt} unsupported on {device}")
    if lanes != "scalar" and device == "PYTHON": pytest.skip("the PYTHON reference has no vectors")
    x = _probe_f32(np_dt)
    with np.errstate(over="ignore", invalid="ignore"): want = x.astype(np_dt).view(np.uint16)
    got = Tensor(x, device=device).cast(dt).bitcast(dtypes.uint16).numpy()
    _assert_bits_equal(got, want, np.isnan(x), INF16[dt], f"float32 -> {dt.name} on {device} ({lanes})")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt,np_dt", HALVES, ids=IDS)
def test_to_float32_bits(dt, np_dt, device, lanes):
    """16 bits -> float32 for all 65536 patterns: exact (every 16-bit value is a float32), NaN stays NaN."""
    if not is_dtype_supported(dt, device): pytest.skip(f"{dt} unsupported on {device}")
    if lanes != "scalar" and device == "PYTHON": pytest.skip("the PYTHON reference has no vectors")
    bits = np.arange(1 << 16, dtype=np.uint16)
    want = bits.view(np_dt).astype(np.float32).view(np.uint32)
    got = Tensor(bits, device=device).bitcast(dt).cast(dtypes.float32).bitcast(dtypes.uint32).numpy()
    _assert_bits_equal(got, want, np.isnan(bits.view(np_dt).astype(np.float32)), 0x7F800000,
                       f"{dt.name} -> float32 on {device} ({lanes})")


@pytest.mark.parametrize("dt,np_dt", HALVES, ids=IDS)
def test_reduce_stores_rounded_once(dt, np_dt):
    """A reduce kernel with a 16-bit output (the heuristic vectorizes it) accumulates in float32 and rounds once at
    the store: a max over [x, -inf] is x, then the one rounding; and a 16-bit matmul sums products in float32."""
    x = _probe_f32(np_dt)[:4096 * 4].reshape(-1, 16)
    pad = np.full_like(x, -np.inf)
    got = Tensor(np.stack([x, pad], -1)).max(-1).cast(dt).bitcast(dtypes.uint16).numpy()
    with np.errstate(over="ignore", invalid="ignore"): want = x.astype(np_dt).view(np.uint16)
    _assert_bits_equal(got.ravel(), want.ravel(), np.isnan(x).ravel(), INF16[dt], f"max -> {dt.name}")
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((64, 64)).astype(np_dt) for _ in range(2))
    out = (Tensor(a.view(np.uint16)).bitcast(dt) @ Tensor(b.view(np.uint16)).bitcast(dt)).cast(dtypes.float32).numpy()
    ref = (a.astype(np.float32) @ b.astype(np.float32)).astype(np_dt).astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=2 ** -7 if dt == dtypes.bfloat16 else 2 ** -10, atol=1e-3)


def test_cpu_kernels_use_whole_vector_conversions():
    """A float16 / bfloat16 matmul on CPU vectorizes (as float32 does) and converts whole vectors: F16C's
    vcvtph2ps/vcvtps2ph through fg_h2f/fg_f2h for float16, a vector shift for bfloat16."""
    if Device.DEFAULT != "CPU": pytest.skip("CPU source")
    from fusegrad.codegen import to_program
    rng = np.random.default_rng(2)
    for dt, conv in ((dtypes.float16, "fg_h2f_x"), (dtypes.bfloat16, "<<")):
        a, b = (Tensor(rng.standard_normal((64, 64)).astype(np.float32)).cast(dt).realize() for _ in range(2))
        src = to_program((a @ b).schedule()[-1].ast, Device["CPU"].renderer).src
        assert "float_x" in src and conv in src, src


HALF_OPS = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
            "maximum": lambda a, b: a.maximum(b), "lt": lambda a, b: a < b, "sqrt": lambda a, b: a.abs().sqrt()}


@pytest.mark.parametrize("name", list(HALF_OPS))
def test_float16_vector_math_rounds_like_torch(name, lanes):
    """One float16 op on whole vectors (computed in float32, rounded once) gives torch's float16 result bit for bit,
    specials included; scalar lanes too."""
    import torch
    x = _probe_f32(np.float16)
    a = x.astype(np.float16)
    b = np.roll(a, 7)
    fn = HALF_OPS[name]
    got = fn(Tensor(a), Tensor(b)).numpy()
    want = fn(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    if got.dtype == np.bool_: np.testing.assert_array_equal(got, want)
    else: _assert_bits_equal(got.view(np.uint16), want.view(np.uint16), np.isnan(want), 0x7C00, f"{name} ({lanes})")
