"""The 8-bit activation path of QuantizedLinear (models/quantized.py `quantize_q8`, `_q8_call`) and the 8-bit dot
products it compiles to (codegen/dot4.py, Ops.DOT4 rendered as x86 VNNI `vpdpbusd`): the activation's q8 form
against NumPy bit for bit, the matvec exact where every value is an integer, close to the float path otherwise, the
same on the PYTHON backend, and the hot loop's instructions per x86 level."""
from __future__ import annotations

import pathlib
import platform
import subprocess
import sys

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.opt import hand_coded_opts
from fusegrad.dtype import dtypes
from fusegrad.helpers import Context
from fusegrad.ir.ops import Ops, UOp
from fusegrad.models.quantized import PLANES, Q8_OFFSET, QuantizedLinear, quantize_q8

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "runtime"))
from asm_loops import hot_loop

NP = {dtypes.uint8: np.uint8, dtypes.int8: np.int8, dtypes.uint32: np.uint32, dtypes.float32: np.float32,
      dtypes.float16: np.float16}


def q8_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The q8 scheme in NumPy float32: dx = max|x|/127 per block of 32, q = round-half-even(x * (1/dx)),
    sx = dx*sum(q)."""
    xb = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    dx = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(dx > 0, np.float32(1) / dx, np.float32(0)).astype(np.float32)
    q = np.round(xb * inv[..., None]).astype(np.int8)
    return q, dx, (dx * q.astype(np.int32).sum(-1).astype(np.float32)).astype(np.float32)


def test_quantize_q8_exact():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 128)) * 3).astype(np.float32)
    x[1, 32:64] = 0                                  # an all-zero block: dx 0, q 0
    x[2, :32] = np.arange(-16, 16) * 0.5             # ties (x * inv exactly .5): half to even
    q, dx, sx = quantize_q8(Tensor(x))
    rq, rdx, rsx = q8_reference(x)
    assert q.dtype == dtypes.int8
    np.testing.assert_array_equal(q.numpy(), rq)
    np.testing.assert_array_equal(dx.numpy(), rdx)
    np.testing.assert_array_equal(sx.numpy(), rsx)


def random_layer(t: int, n_in: int, n_out: int, rng, int_scales: bool) -> QuantizedLinear:
    """A QuantizedLinear of type t with random block bytes; scales 1 and integer minimums (exact arithmetic) or
    random float ones."""
    lin = QuantizedLinear(n_in, n_out, t)
    for name, (shape, dt) in PLANES[t].items():
        full = (n_out, n_in // 32, *shape)
        if dtypes.is_float(dt):
            if int_scales:
                v = np.ones(full, np.float32) if name == "d" else rng.integers(-9, 9, full).astype(np.float32)
            else: v = (rng.random(full) * 0.02 - (0.01 if name == "m" else 0)).astype(np.float32)
            v = v.astype(NP[dt])
        else: v = rng.integers(0, 1 << (8 * dt.itemsize), full, dtype=np.uint64).astype(NP[dt])
        setattr(lin, name, Tensor(v.view(NP[dt]) if not dtypes.is_float(dt) else v).contiguous().realize())
    return lin


@pytest.mark.parametrize("t", sorted(Q8_OFFSET))
def test_q8_matvec_exact_on_integers(t):
    """Scales 1, integer minimums and activations whose blocks each reach +-127: dx = 1, q = x, and every product,
    block sum and row sum is an integer float32 holds exactly, so the q8 matvec must equal NumPy's integer W @ x."""
    rng = np.random.default_rng(t)
    lin = random_layer(t, 128, 40, rng, int_scales=True)
    x = rng.integers(-127, 128, (2, 128)).astype(np.float32)
    x[:, ::32] = 127 * np.sign(rng.standard_normal((2, 4)) + 0.1)     # each block's max |x| is 127
    w = lin.dequantize().numpy().astype(np.int64)
    with Context(Q8_ACTIVATIONS=1): y = lin(Tensor(x)).numpy()
    np.testing.assert_array_equal(y, (x.astype(np.int64) @ w.T).astype(np.float32))


@pytest.mark.parametrize("t", sorted(Q8_OFFSET))
def test_q8_matvec_vs_reference_and_float_path(t):
    """Random scales: the q8 matvec equals the NumPy q8 scheme (per block (a*dx)*dot + c*sx, summed in float64) to
    float32 rounding, and the float path (x unquantized) within the activation's quantization error."""
    rng = np.random.default_rng(10 + t)
    lin = random_layer(t, 256, 48, rng, int_scales=False)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    with Context(Q8_ACTIVATIONS=1): y = lin(Tensor(x)).numpy()
    with Context(Q8_ACTIVATIONS=0): yf = lin(Tensor(x)).numpy()
    q, dx, sx = q8_reference(x)
    w = lin.dequantize().numpy().astype(np.float64)                  # a*u + c per value
    d = lin.d.numpy().astype(np.float64)
    c = lin.m.numpy().astype(np.float64) if Q8_OFFSET[t] is None else -Q8_OFFSET[t] * d
    u = (w - np.repeat(c, 32, axis=1)) / np.repeat(d, 32, axis=1)     # the unsigned bytes (exact: small integers)
    dots = (u.reshape(48, 8, 32) * q[0].astype(np.float64)).sum(-1)   # (rows, blocks), integers
    ref = ((d * dx[0]) * dots + c * sx[0]).sum(-1)
    np.testing.assert_allclose(y[0], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert np.abs(y - yf).max() <= 0.02 * np.abs(yf).max()


def test_q8_on_python_backend():
    """The same kernels without 8-bit dot products (the PYTHON backend renders no DOT4): the same exact integers."""
    rng = np.random.default_rng(3)
    lin = random_layer(3, 64, 8, rng, int_scales=True)
    for name in PLANES[3]: setattr(lin, name, getattr(lin, name).to("PYTHON").realize())
    x = rng.integers(-127, 128, (1, 64)).astype(np.float32)
    x[:, ::32] = 127
    w = lin.dequantize().numpy().astype(np.int64)
    with Context(Q8_ACTIVATIONS=1): y = lin(Tensor(x, device="PYTHON")).numpy()
    np.testing.assert_array_equal(y, (x.astype(np.int64) @ w.T).astype(np.float32))


X86 = platform.machine().lower() in ("x86_64", "amd64")


@pytest.mark.skipif(not X86, reason="x86 levels")
@pytest.mark.parametrize("march,vnni", [("icelake-server", True), ("alderlake", True), ("x86-64-v4", False),
                                        ("x86-64-v3", False)])
@pytest.mark.parametrize("t", [3, 8])
def test_q8_hot_loop_instructions(march, vnni, t, monkeypatch):
    """With AVX512-VNNI (icelake-server) or AVX-VNNI (alderlake) the matvec multiplies the bytes with vpdpbusd, for
    Q4_1's nibbles and Q8_0's bytes alike; with AVX2 alone (x86-64-v3; x86-64-v4 adds AVX-512 without VNNI) with
    vpmaddubsw + vpmaddwd for Q4_1 (nibbles <= 15: the int16 pairs can't saturate) and not for Q8_0 (bytes up to
    255 could): no DOT4 there, the int32 products. No value is converted to float one by one."""
    from test_register_tile import CC, target
    if CC is None: pytest.skip("no C compiler")
    comp, ren = target(march, monkeypatch)
    assert ren.dot4_lanes() and ren.dot4_max_unsigned() == (255 if vnni else 127)
    lin = random_layer(t, 576, 64, np.random.default_rng(0), int_scales=False)
    with Context(Q8_ACTIVATIONS=1): out = lin(Tensor.empty(1, 576).realize())
    ast = out.schedule()[-1].ast
    spec = to_program(ast, ren, hand_coded_opts(ast, ren))
    dot4 = vnni or t == 3
    assert any(u.op is Ops.DOT4 for u in spec.uops) == dot4
    asm = comp.assembly(spec.src)
    lines = asm.splitlines()
    start = lines.index(f"{spec.name}:")
    body = lines[start:next(i for i in range(start, len(lines)) if ".cfi_endproc" in lines[i])]
    hot_loop(asm, spec.name)   # (it has a vector loop)
    def count(op: str) -> int: return sum(op in ln for ln in body)
    assert count("vcvtsi2ss") == 0, "\n".join(body)
    if vnni: assert count("vpdpbusd") >= 1 and count("vpmulld") == 0, "\n".join(body)
    elif dot4: assert count("vpmaddubsw") >= 1 and count("vpmaddwd") >= 1 and count("vpdpbusd") == 0, "\n".join(body)
    else: assert count("vpdpbusd") == 0 and count("vpmaddubsw") == 0
    if t == 3:   # a block's low and high nibbles side by side: one 256-bit dot product per block, not two 128-bit ones
        dots = [ln for ln in body if "vpdpbusd" in ln or "vpmaddubsw" in ln]
        assert all("%ymm" in ln for ln in dots), "\n".join(body)
        # ... whose activation bytes, adjacent in memory, are one 32-byte load (dot4._adjacent_loads), not two
        # 16-byte loads and a shuffle (10% of the kernel on AVX2)
        acts = [u.src[2] for u in spec.uops if u.op is Ops.DOT4]
        assert acts and all(a.op is Ops.LOAD and a.dtype.count == 32 for a in acts), [a.op for a in acts]


@pytest.mark.parametrize("t", [3, 8])
def test_q8_block_pairs_concatenated_in_one_dot(t, monkeypatch):
    """codegen/dot4.py: a block's two 16-byte halves (Q4_1's nibbles) become one 32-byte DOT4 operand (a VECTORIZE of
    both halves' lanes, rendered as one shuffle); Q8_0's 32 bytes are one operand already. Exact either way
    (test_q8_matvec_exact_on_integers)."""
    from test_register_tile import CC, target
    if CC is None: pytest.skip("no C compiler")
    _, ren = target("alderlake", monkeypatch)    # AVX-VNNI: DOT4 of 4 and 8 lanes for both types
    lin = random_layer(t, 576, 64, np.random.default_rng(0), int_scales=False)
    with Context(Q8_ACTIVATIONS=1): out = lin(Tensor.empty(1, 576).realize())
    ast = out.schedule()[-1].ast
    spec = to_program(ast, ren, hand_coded_opts(ast, ren))
    dots = [u for u in spec.uops if u.op is Ops.DOT4]
    assert dots and all(u.dtype.count == 8 for u in dots)
    pairs = [u.src[1] for u in dots if u.src[1].op is Ops.VECTORIZE and all(s.op is Ops.GEP for s in u.src[1].src)]
    assert bool(pairs) == (t == 3)
    if t == 3: assert "__builtin_shufflevector" in spec.src


@pytest.mark.parametrize("t", [3, 8])
def test_a_quantized_matvec_reads_one_row_at_a_time(t):
    """codegen/opt.py `quantized_matvec`: one row against a weight of bytes gets no register tile (its rows would be
    read as 8 strands at once, slower to stream), on both paths; a float32 weight's matvec keeps its tile."""
    from fusegrad.device import Device
    ren = Device["CPU"].renderer
    lin = random_layer(t, 576, 64, np.random.default_rng(0), int_scales=False)
    for q8 in (0, 1):
        with Context(Q8_ACTIVATIONS=q8): out = lin(Tensor.empty(1, 576).realize())
        ast = out.schedule()[-1].ast
        assert not any(o.op == "UPCAST" for o in hand_coded_opts(ast, ren)), (q8, hand_coded_opts(ast, ren))
    ast = (Tensor.empty(1, 576) @ Tensor.empty(64, 576).T).schedule()[-1].ast
    assert any(o.op == "UPCAST" for o in hand_coded_opts(ast, ren))
    # bytes summed 4 at a time into words (a bitcast uint8 -> float32) are no quantized block: they keep the tile
    (si,) = Tensor(np.arange(64, dtype=np.uint8)).realize().bitcast(dtypes.float32).schedule()
    assert any(o.op == "UPCAST" for o in hand_coded_opts(si.ast, ren)), hand_coded_opts(si.ast, ren)


@pytest.mark.parametrize("t", [3, 8])
def test_a_quantized_matvec_sums_blocks_before_its_accumulator(t):
    """codegen/opt.py: a quantized matvec's block loops (18 blocks of 32 here) take UNROLL_SUM(6), on both paths, so
    each loop trip adds one sum of 6 blocks to its accumulator: in the linear program every accumulator update inside
    a loop is acc + x with x not reading an accumulator (one dependent add per trip, not 6)."""
    from fusegrad.device import Device
    ren = Device["CPU"].renderer
    lin = random_layer(t, 576, 64, np.random.default_rng(0), int_scales=False)
    for q8 in (0, 1):
        with Context(Q8_ACTIVATIONS=q8): out = lin(Tensor.empty(1, 576).realize())
        ast = out.schedule()[-1].ast
        opts = hand_coded_opts(ast, ren)
        sums = [o for o in opts if o.op == "UNROLL_SUM"]
        vec = next(o for o in opts if o.op == "VECTORIZE")
        # the block loop by 6; a block's vectors left after VECTORIZE (the float path's) all at once, first
        assert [o.amount for o in sums if o.axis != vec.axis] == [6] * (1 + q8), (q8, opts)
        assert all(o.amount * vec.amount * (2 if t == 3 else 1) == 32 for o in sums if o.axis == vec.axis), opts
        assert not any(o.op == "UNROLL" for o in opts), (q8, opts)
        uops = to_program(ast, ren, opts).uops
        regs = {u for u in uops if u.op is Ops.DEFINE_REG}
        def reads_acc(x: UOp) -> bool:
            return any(n.op is Ops.LOAD and n.src[0].src[0] in regs for n in x.toposort())
        depth, updates = 0, 0
        for u in uops:
            depth += (u.op is Ops.RANGE) - (u.op is Ops.END)
            if u.op is Ops.STORE and u.src[0].src[0] in regs and depth > 1:   # inside the row loop and a block loop
                v = u.src[1]
                assert v.op is Ops.ADD and sum(reads_acc(s) for s in v.src) == 1, (q8, v)
                assert not reads_acc(next(s for s in v.src if not (s.op is Ops.LOAD and s.src[0].src[0] in regs)))
                updates += 1
        assert updates == 1 + q8, (q8, updates)   # the dot products' (and the 8-bit path's minimums')


@pytest.mark.parametrize("t", [2, 8, 14])
def test_a_float_path_matvec_scales_each_block_once(t):
    """codegen/opt.py common_factor: on the float path (a tied head's), a block's vectors are summed first and its
    scale multiplies that sum once: in the linear program every multiply by a broadcast scalar reads a sum, and there
    are as many per loop trip as blocks (Q4_0 (d * (q - 8)), Q8_0 (d * q), Q6_K ((d * sc) * (q - 32)): pure products
    of the scale). Before, each of a block's vectors was multiplied by it. Values against NumPy's float64 product."""
    from fusegrad.device import Device
    ren = Device["CPU"].renderer
    rng = np.random.default_rng(t)
    n_in = 512 if t == 14 else 576
    lin = random_layer(t, n_in, 64, rng, int_scales=False) if t != 14 else None
    if lin is None:   # a K block is 256 values (random_layer's planes are blocks of 32)
        lin = QuantizedLinear(n_in, 64, t)
        for name, (shape, dt) in PLANES[t].items():
            full = (64, n_in // 256, *shape)
            v = (rng.random(full) * 0.02).astype(np.float32) if dtypes.is_float(dt) else \
                rng.integers(0, 1 << (8 * dt.itemsize), full, dtype=np.uint64).astype(NP[dt])
            setattr(lin, name, Tensor(v).contiguous().realize())
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    with Context(Q8_ACTIVATIONS=0):
        out = lin(Tensor(x))
        ast = out.schedule()[-1].ast
        y = out.numpy()
    ref = x.astype(np.float64) @ lin.dequantize().numpy().astype(np.float64).T
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    opts = hand_coded_opts(ast, ren)
    vec = next(o for o in opts if o.op == "VECTORIZE")
    assert any(o.op == "UNROLL_SUM" and o.axis == vec.axis for o in opts), opts
    uops = to_program(ast, ren, opts).uops
    def broadcast(u: UOp) -> bool: return u.op is Ops.VECTORIZE and len(set(u.src)) == 1 and u.src[0].op is not Ops.CONST
    def const_vec(u: UOp) -> bool: return u.op is Ops.VECTORIZE and all(s.op is Ops.CONST for s in u.src)
    scaled = [u for u in uops if u.op is Ops.MUL and u.dtype.count > 1 and any(broadcast(s) for s in u.src)]
    assert scaled and all(any(s.op is Ops.ADD and not any(const_vec(a) for a in s.src) for s in u.src)
                          for u in scaled), "a scale multiplies a single vector"
    blocks = [o.amount for o in opts if o.op == "UNROLL_SUM" and o.axis != vec.axis]
    if t != 14: assert len(scaled) == blocks[0], (len(scaled), opts)


@pytest.mark.parametrize("march", ["x86-64-v3", "native"])
@pytest.mark.parametrize("t", sorted(Q8_OFFSET))
def test_q8_exact_per_march(march, t, monkeypatch):
    """The exact-integer check in a process built for CPU_MARCH (AVX2's vpmaddubsw form; this host's own)."""
    from test_register_tile import runnable
    if march != "native" and (not X86 or not runnable(march)): pytest.skip(f"this host can't run {march}")
    monkeypatch.setenv("CPU_MARCH", march)
    code = ("import sys; sys.path.insert(0, 'test/models'); import test_q8 as m; "
            f"m.test_q8_matvec_exact_on_integers({t}); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False,
                       cwd=str(pathlib.Path(__file__).resolve().parents[2]))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize("t", [3, 8])
def test_a_prompts_merged_heads_reach_the_product_as_a_contiguous_copy(t):
    """QuantizedLinear: an input whose features merge axes a permute separated (a prompt's attention output, (B, H, T,
    D) read as (B, T, H * D)) is copied first, as Tensor.dot does: read as it is, the product's index math divided
    and its loop was scalar (SmolLM2's prefill o_proj 9.0 against 1.1 ms). One row (a decode step) needs no copy: its
    T axis has size 1, and the view reads memory in order."""
    rng = np.random.default_rng(1)
    lin = random_layer(t, 128, 40, rng, int_scales=False)
    w = lin.dequantize().numpy()
    for T in (5, 1):
        att = rng.standard_normal((1, 4, T, 32)).astype(np.float32)   # (B, H, T, D), H * D = 128
        x = Tensor(att).realize().permute(0, 2, 1, 3).reshape(1, T, 128)
        with Context(Q8_ACTIVATIONS=0):
            out = lin(x)
            plain = len(lin(Tensor(att.transpose(0, 2, 1, 3).reshape(1, T, 128).copy()).realize()).schedule())
        sched = out.schedule()
        idx_math = [n for n in sched[-1].ast.toposort() if n.op in (Ops.IDIV, Ops.MOD)]
        assert not idx_math, (T, [n.op for n in idx_math])
        assert len(sched) == plain + (T > 1), (T, len(sched), plain)   # the copy, then the product's kernels
        ref = att.transpose(0, 2, 1, 3).reshape(1, T, 128) @ w.T
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)
