"""8- and 16-bit integer vectors on the CPU (codegen/widen.py, renderer/cstyle.py `widen_convert_c`): a vectorized
reduce that converts uint8/int8/uint16/int16 lanes to float, or shifts and masks them (a quantized weight's nibbles),
compiles for AVX2 (x86-64-v3) and AVX-512 (x86-64-v4) to whole-vector code: the innermost loop has no scalar
conversion (`vcvtusi2ssl`, `vcvtsi2ssl`), no byte-by-byte loads (`movzbl`, `movsbl`, ...) and no lane inserts
or extracts (`vpinsrb/w/d`, `vpextrb/w/d`), which is what GCC 12 made of `__builtin_convertvector(uchar16 -> float16)`
and of 8-bit vector shifts. The same kernels with the pass off are the positive control (the check finds those
instructions there). The results are exactly NumPy's, a narrow sum or left shift that wraps included; and every
quantized block type's matvec (models/quantized.py) is vectorized by the heuristic into such code."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad import Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.opt import Opt, hand_coded_opts
from fusegrad.device import Buffer
from fusegrad.dtype import dtypes
from fusegrad.helpers import Context
from fusegrad.ir.ops import Ops
from fusegrad.models.quantized import PLANES, QUANTIZED_TYPES, QuantizedLinear
from fusegrad.runtime.ops_cpu import CPUProgram
from asm_loops import hot_loop
from test_register_tile import CC, X86, runnable, target

pytestmark = pytest.mark.skipif(CC is None or not X86, reason="x86-64 levels need an x86 host with a C compiler")

LANE_BY_LANE = re.compile(r"^\s+(vcvtu?si2s[sd]\w*|movzb\w|movsb\w|movzw\w|movsw\w|vpinsr[bwdq]|vpextr[bwdq])\s")
R, K = 32, 64
NP = {dtypes.uint8: np.uint8, dtypes.int8: np.int8, dtypes.uint16: np.uint16, dtypes.int16: np.int16,
      dtypes.float32: np.float32}


def lane_by_lane(asm: str, fn: str) -> list[str]:
    return [ln.strip() for ln in hot_loop(asm, fn) if LANE_BY_LANE.match(ln)]


# name -> (input dtype, the narrow expression of q (R, K) that is converted to float)
CASES = {
    "uint8_to_float": (dtypes.uint8, lambda q: q),
    "int8_to_float": (dtypes.int8, lambda q: q),
    "uint16_to_float": (dtypes.uint16, lambda q: q),
    "int16_to_float": (dtypes.int16, lambda q: q),
    "nibbles": (dtypes.uint8, lambda q: ((q >> 4) & 15) | ((q & 3) << 4)),
    "int8_shift": (dtypes.int8, lambda q: (q >> 2) ^ 5),
    "wrapping_shift": (dtypes.uint8, lambda q: q << 4),        # wraps in uint8: stays narrow, widened as a whole
    "wrapping_sum": (dtypes.uint8, lambda q: q + q),
}


def kernel(name: str):
    dt, f = CASES[name]
    q, x = Tensor.empty(R, K, dtype=dt).realize(), Tensor.empty(R, K).realize()
    (si,) = (f(q).float() * x).sum(-1).schedule()
    return si.ast


def reference(name: str, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    _, f = CASES[name]
    return (f(q).astype(np.float64) * x.astype(np.float64)).sum(-1).astype(np.float32)


def compile_case(name: str, march: str, monkeypatch, widen: bool = True):
    comp, ren = target(march, monkeypatch)
    ren.widen_narrow_vectors = widen
    ast = kernel(name)
    red = next(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "reduce")
    out = next(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "global")
    lanes = comp.machine.vector_bytes // 4
    return comp, to_program(ast, ren, [Opt("VECTORIZE", red, lanes), Opt("UPCAST", out, 4)])


def run(comp, spec, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    prg = CPUProgram(spec, comp.compile(spec.src))
    out = Buffer("CPU", R, dtypes.float32).ensure_allocated()
    bq = Buffer("CPU", q.size, CASES_DT[q.dtype.type]).ensure_allocated().copyin(memoryview(q).cast("B"))
    bx = Buffer("CPU", x.size, dtypes.float32).ensure_allocated().copyin(memoryview(x).cast("B"))
    # the buffers in the kernel's argument order: output, then the inputs as the kernel reads them
    params = sorted((u for u in spec.uops if u.op is Ops.PARAM), key=lambda u: u.arg)
    args = [out.opaque] + [(bx if u.dtype.base == dtypes.float32 else bq).opaque for u in params[1:]]
    if spec.thread_size: prg.fxn(*args, 0, spec.thread_size)
    else: prg.fxn(*args)
    res = np.empty(R, np.float32)
    out.copyout(memoryview(res).cast("B"))
    return res


CASES_DT = {v: k for k, v in NP.items()}


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("name", list(CASES))
def test_whole_vector_code_and_exact(name, march, monkeypatch):
    comp, spec = compile_case(name, march, monkeypatch)
    assert lane_by_lane(comp.assembly(spec.src), spec.name) == []
    if not runnable(march): pytest.skip(f"this host can't run {march} code (the assembly was checked)")
    rng = np.random.default_rng(7)
    dt = NP[CASES[name][0]]
    info = np.iinfo(dt)
    q = rng.integers(info.min, info.max + 1, (R, K)).astype(dt)
    x = rng.integers(-3, 4, (R, K)).astype(np.float32)        # integer products: the sums are exact
    np.testing.assert_array_equal(run(comp, spec, q, x), reference(name, q, x))


@pytest.mark.parametrize("name", ["uint8_to_float", "int8_to_float", "nibbles"])
def test_the_check_finds_lane_by_lane_code_without_the_pass(name, monkeypatch):
    """Positive control: GCC's own code for the narrow vectors converts or shifts one lane at a time."""
    comp, spec = compile_case(name, "x86-64-v4", monkeypatch, widen=False)
    assert len(lane_by_lane(comp.assembly(spec.src), spec.name)) >= 8


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("ggml_type", sorted(QUANTIZED_TYPES))
def test_quantized_matvec_vectorizes(ggml_type, march, monkeypatch):
    """The heuristic vectorizes a QuantizedLinear's matvec (models/quantized.py) of every block type, along a block's
    contiguous values, into whole-vector code: the reduce loop converts whole vectors (the numbers:
    test/models/test_quantized.py)."""
    comp, ren = target(march, monkeypatch)
    block = QUANTIZED_TYPES[ggml_type][1]
    lin = QuantizedLinear(2 * block if block == 256 else 4 * block, 64, ggml_type)
    for name in PLANES[ggml_type]: getattr(lin, name).realize()
    with Context(Q8_ACTIVATIONS=0):   # the float path's kernel (the 8-bit one: test/models/test_q8.py)
        (si,) = lin(Tensor.empty(1, lin.in_features).realize()).schedule()
    opts = hand_coded_opts(si.ast, ren)
    assert any(o.op == "VECTORIZE" and o.amount >= comp.machine.vector_bytes // 8 for o in opts), opts
    spec = to_program(si.ast, ren, opts)
    loop = hot_loop(comp.assembly(spec.src), spec.name)
    scalar = [ln.strip() for ln in loop if LANE_BY_LANE.match(ln)]
    # a per-sub-block scale (Q6_K's and Q3_K's int8 `sc`) is one scalar conversion per 16 values and row: at most as
    # many as the vector conversions (Q2_K: twice, its byte holds a scale and a minimum); lane-by-lane code has one per
    # value (and no scale needs a lane insert or extract). A float16 block scale is loaded by an insert into lane 0
    # from memory (`vpinsrw $0, (mem)`: how GCC puts 16 bits in a register for vcvtph2ps), not lane-by-lane code.
    half_load = re.compile(r"vpinsrw\s+\$0,\s*-?\w*\(")
    assert not any(("vpinsr" in ln and not half_load.match(ln)) or "vpextr" in ln for ln in scalar), scalar
    assert sum(bool(half_load.match(ln)) for ln in scalar) <= sum("vcvtph2ps" in ln for ln in loop), scalar
    vector_cvts = sum(bool(re.match(r"\s+vcvtu?dq2ps", ln)) for ln in loop)
    assert sum("si2s" in ln for ln in scalar) <= (2 if ggml_type == 10 else 1) * vector_cvts, scalar


OPS = {"and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b, "add": lambda a, b: a + b,
       "mul": lambda a, b: a * b}


@st.composite
def narrow_expr(draw, depth: int = 3):
    """A random expression of q (uint8 or int8 lanes): masks, shifts by constants, sums and products that may wrap, as
    (fusegrad builder, NumPy builder) over the same tree."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.booleans()): return (lambda q: q), (lambda q: q)
        c = draw(st.integers(0, 127))
        return (lambda q: q & c), (lambda q: q & q.dtype.type(c))
    kind = draw(st.sampled_from(["shr", "shl", *OPS]))
    a_f, a_n = draw(narrow_expr(depth - 1))
    if kind in ("shr", "shl"):
        k = draw(st.integers(0, 7))
        if kind == "shr": return (lambda q: a_f(q) >> k), (lambda q: a_n(q) >> q.dtype.type(k))
        return (lambda q: a_f(q) << k), (lambda q: a_n(q) << q.dtype.type(k))
    b_f, b_n = draw(narrow_expr(depth - 1))
    op = OPS[kind]
    return (lambda q: op(a_f(q), b_f(q))), (lambda q: op(a_n(q), b_n(q)))


@settings(max_examples=25, deadline=None)
@given(dt=st.sampled_from([dtypes.uint8, dtypes.int8]), expr=narrow_expr(), seed=st.integers(0, 2 ** 16))
def test_random_narrow_expressions_exact(dt, expr, seed):
    """On the host (its own -march=native target), a vectorized reduce over any such expression converted to float
    equals NumPy's wrapped narrow arithmetic exactly."""
    f, ref = expr
    rng = np.random.default_rng(seed)
    info = np.iinfo(NP[dt])
    q = rng.integers(info.min, info.max + 1, (R, K)).astype(NP[dt])
    x = rng.integers(-3, 4, (R, K)).astype(np.float32)
    with np.errstate(over="ignore"):
        want = (ref(q).astype(np.float64) * x).sum(-1).astype(np.float32)
    got = (f(Tensor(q)).float() * Tensor(x)).sum(-1).numpy()
    np.testing.assert_array_equal(got, want)
