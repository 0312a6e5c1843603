"""Convolution tiles on AVX2 (codegen/opt.py `window_tile`) and unrolled reduces added in the loop's own order
(codegen/linearize.py `unrolled_parts`): the heuristic's choice for beautiful_mnist's 5x5 convolution and its
gradients on an x86-64-v3 target (16 vector registers) and an x86-64-v4 one (unchanged), the absence of spills where
the old unrolled tile spilled, exact results of whole forward and backward passes with AVX2's tiles (integer-valued
inputs: every partial sum is exact in float32) against PyTorch over random convolution shapes, and a ReLU gradient's
reduce whose compare masks become bool vectors as whole vectors on AVX2 (renderer/cstyle.py `bools_narrow_c`)."""
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fusegrad import Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.opt import Opt, hand_coded_opts
from fusegrad.device import Device
from fusegrad.engine import realize as realize_mod
from fusegrad.ir.ops import Ops

from asm_loops import hot_loop
from test_register_tile import CC, X86, matmul_ast, run, runnable, stack_vector_accesses, target

pytestmark = pytest.mark.skipif(CC is None or not X86, reason="x86-64 levels need an x86 host with a C compiler")


def conv_asts(n: int = 8, cin: int = 32, cout: int = 32, hw: int = 24, k: int = 5) -> dict[str, object]:
    """The kernels of a convolution's forward pass and of its two gradients (beautiful_mnist's second convolution by
    default), each the schedule's kernel with a reduce that writes a buffer of that shape."""
    x, w = Tensor.empty(n, cin, hw, hw).realize(), Tensor.empty(cout, cin, k, k).realize()
    x.requires_grad = w.requires_grad = True
    out = x.conv2d(w)
    (fwd,) = [si.ast for si in out.schedule() if any(u.op is Ops.REDUCE for u in si.ast.toposort())]
    out.sum().backward()
    def grad_kernel(t: Tensor) -> object:
        return next(si.ast for si in t.schedule() if si.bufs[0].size == t.numel() and
                    any(u.op is Ops.REDUCE for u in si.ast.toposort()))
    return {"forward": fwd, "input": grad_kernel(x.grad), "weight": grad_kernel(w.grad)}


def test_avx2_convolution_tiles(monkeypatch):
    """AVX2: the forward pass takes 2 images x 5 output columns (10 accumulators) and unrolls its 5 taps (the columns
    share 9 loads of the input per row of taps, not 25); the input gradient takes 4 channels x 3 vectors of a row and
    doesn't unroll (unrolled, its 4 x 3 tile needs 28 registers); the weight gradient 5 taps x 2 vectors. With one
    image the usual tile stays (window_tile is for batches); AVX-512 keeps the tiles it had (8 x 2, unrolled)."""
    asts = conv_asts()
    _, ren = target("x86-64-v3", monkeypatch)
    fwd = hand_coded_opts(asts["forward"], ren)
    assert [(o.op, o.amount) for o in fwd] == [("VECTORIZE", 8), ("UPCAST", 2), ("UPCAST", 5), ("UNROLL", 5)]
    grad_in = hand_coded_opts(asts["input"], ren)
    assert sorted(o.amount for o in grad_in if o.op == "UPCAST") == [3, 4]
    assert not any(o.op == "UNROLL" for o in grad_in)
    assert sorted(o.amount for o in hand_coded_opts(asts["weight"], ren) if o.op == "UPCAST") == [2, 5]
    one = conv_asts(n=1)   # one image (EfficientNet-Lite0 bs1): the usual tile, its window unrolled
    assert [(o.op, o.amount) for o in hand_coded_opts(one["input"], ren)] == \
        [("VECTORIZE", 8), ("UPCAST", 4), ("UPCAST", 3), ("UNROLL", 5)]
    _, ren = target("x86-64-v4", monkeypatch)
    assert [(o.op, o.amount) for o in hand_coded_opts(asts["forward"], ren)] == \
        [("VECTORIZE", 16), ("UPCAST", 8), ("UPCAST", 2), ("UNROLL", 5)]


def test_avx2_input_gradient_tile_does_not_spill_where_the_unrolled_one_did(monkeypatch):
    """The input gradient's reduce loop on AVX2: the heuristic's tile keeps its operands in registers; the tile it took
    before (4 channels x 3 rows, its 5 taps unrolled: 12 accumulators and 15 vectors of the row) spills (the positive
    control of the check)."""
    comp, ren = target("x86-64-v3", monkeypatch)
    ast = conv_asts(n=2)["input"]
    spec = to_program(ast, ren)
    assert stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name)) == []
    # ranges: 0 images, 1 input channels, 2 rows, 3 columns; reduce 4 output channels, 5 and 6 the taps
    spec = to_program(ast, ren, [Opt("VECTORIZE", 3, 8), Opt("UPCAST", 1, 4), Opt("UPCAST", 2, 3), Opt("UNROLL", 6, 5)])
    assert len(stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name))) >= 10


def test_unrolled_copies_add_in_the_loop_order(monkeypatch):
    """UNROLL(k) adds its k products to the accumulator one by one, in the order the loop had: the result is the
    unoptimized kernel's bit for bit (float inputs, so any other order rounds differently), and each add is an FMA."""
    comp, ren = target("x86-64-v3", monkeypatch)
    ast = matmul_ast(8, 512, 8)
    red = next(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == "reduce")
    plain, unrolled = to_program(ast, ren, []), to_program(ast, ren, [Opt("UNROLL", red, 8)])
    loop = hot_loop(comp.assembly(unrolled.src), unrolled.name)
    assert sum("vfmadd" in ln for ln in loop) == 8 and not any(ln.split()[0] in ("vmulss", "vaddss") for ln in loop)
    if not runnable("x86-64-v3"): pytest.skip("this host can't run x86-64-v3 code (the assembly was checked)")
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((8, 512)).astype(np.float32), rng.standard_normal((512, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(comp, unrolled, [a, b], (8, 8)), run(comp, plain, [a, b], (8, 8)))


def test_unroll_sum_adds_the_copies_sum_to_the_accumulator_once(monkeypatch):
    """UNROLL_SUM(k) combines its k products first and adds the result to the accumulator once per trip (a single
    accumulator's chain of dependent adds is k times shorter): the loop holds one add into the accumulator and the
    k products' sum beside it; the result is the product's (a reassociated float sum: close, not bit for bit)."""
    comp, ren = target("x86-64-v3", monkeypatch)
    ast = matmul_ast(8, 512, 8)
    red = next(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == "reduce")
    spec = to_program(ast, ren, [Opt("UNROLL_SUM", red, 8)])
    (acc,) = [u for u in spec.uops if u.op is Ops.DEFINE_REG]
    updates = [u.src[1] for u in spec.uops if u.op is Ops.STORE and u.src[0].src[0] is acc and
               not (u.src[1].op is Ops.CONST)]
    assert len(updates) == 1 and updates[0].op is Ops.ADD
    inner = [s for s in updates[0].src if not (s.op is Ops.LOAD and s.src[0].src[0] is acc)]
    assert len(inner) == 1 and not any(n.op is Ops.LOAD and n.src[0].src[0] is acc for n in inner[0].toposort())
    # the 8 copies' products, summed off the accumulator's chain
    assert sum(n.op is Ops.MUL and n.dtype == inner[0].dtype for n in inner[0].toposort()) == 8
    with pytest.raises(ValueError, match="UNROLL_SUM needs a reduce range"):
        to_program(ast, ren, [Opt("UNROLL_SUM", next(r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE), 2)])
    if not runnable("x86-64-v3"): pytest.skip("this host can't run x86-64-v3 code (the program was checked)")
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((8, 512)).astype(np.float32), rng.standard_normal((512, 8)).astype(np.float32)
    np.testing.assert_allclose(run(comp, spec, [a, b], (8, 8)), a @ b, rtol=1e-4, atol=1e-4)


def avx2_device(mp: pytest.MonkeyPatch) -> object:
    """This process's CPU device told it has AVX2's 8-lane vectors and 16 registers (the heuristic then picks AVX2's
    tiles; the code runs on any x86 host, it only uses fewer registers), with no program built before reused."""
    comp, _ = target("x86-64-v3", mp)
    ren = Device["CPU"].renderer
    mp.setattr(ren, "machine", comp.machine)
    mp.setattr(ren, "simd_bytes", comp.machine.vector_bytes)
    mp.setattr(realize_mod, "_programs", {})
    return comp


def test_relu_gradient_reduce_narrows_its_masks_as_whole_vectors(monkeypatch):
    """A ReLU gradient's bias reduce (sum of g where x + b > 0, over images and pixels) on AVX2: the compare's mask
    becomes the bool vector through one byte shuffle, not lane by lane (GCC 12's __builtin_convertvector there: a
    vpextrd and a movzbl per lane, the positive control), and the result is exact."""
    comp, ren = target("x86-64-v3", monkeypatch)
    x, b, g = Tensor.empty(16, 8, 12, 12).realize(), Tensor.empty(1, 8, 1, 1).realize(), \
        Tensor.empty(16, 8, 12, 12).realize()
    (si,) = ((x + b) > 0).where(g, 0).sum((0, 2, 3)).schedule()
    spec = to_program(si.ast, ren)
    lane_by_lane = re.compile(r"^\s+(vpextr[bwdq]|movzb\w)\s")
    assert "fg_bools4_x8(" in spec.src
    assert not [ln for ln in hot_loop(comp.assembly(spec.src), spec.name) if lane_by_lane.match(ln)]
    old = re.sub(r"typedef unsigned char b .*?\n  return __builtin_shufflevector\(.*?\);",
                 "return __builtin_convertvector(m, unsigned_char_x8);", spec.src, flags=re.S)
    assert old != spec.src and [ln for ln in hot_loop(comp.assembly(old), spec.name) if lane_by_lane.match(ln)]
    rng = np.random.default_rng(4)
    xn, bn, gn = (rng.integers(-3, 4, s).astype(np.float32) for s in ((16, 8, 12, 12), (1, 8, 1, 1), (16, 8, 12, 12)))
    with pytest.MonkeyPatch.context() as mp:
        avx2_device(mp)
        got = ((Tensor(xn) + Tensor(bn)) > 0).where(Tensor(gn), 0).sum((0, 2, 3)).numpy()
    np.testing.assert_array_equal(got, np.where(xn + bn > 0, gn, 0).sum((0, 2, 3)))


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 4), cin=st.integers(1, 6), cout=st.sampled_from([8, 16, 24]), hw=st.integers(5, 13),
       k=st.integers(1, 5), pad=st.integers(0, 2))
def test_convolutions_with_avx2_tiles_are_exact(n, cin, cout, hw, k, pad):
    """Forward and both gradients of a convolution, with the heuristic choosing AVX2's tiles (`avx2_device`), equal
    PyTorch's exactly on integer-valued inputs."""
    if k > hw + 2 * pad: return
    with pytest.MonkeyPatch.context() as mp:
        avx2_device(mp)
        rng = np.random.default_rng(n * 1000 + cin * 100 + hw * 10 + k)
        xn = rng.integers(-3, 4, (n, cin, hw, hw)).astype(np.float32)
        wn = rng.integers(-3, 4, (cout, cin, k, k)).astype(np.float32)
        gn = rng.integers(-2, 3, (n, cout, hw + 2 * pad - k + 1, hw + 2 * pad - k + 1)).astype(np.float32)
        x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
        out = x.conv2d(w, padding=pad)
        (out * Tensor(gn)).sum().backward()
        got = out.numpy(), x.grad.numpy(), w.grad.numpy()
    tx, tw = torch.tensor(xn, dtype=torch.float64, requires_grad=True), torch.tensor(wn, dtype=torch.float64,
                                                                                     requires_grad=True)
    tout = torch.nn.functional.conv2d(tx, tw, padding=pad)
    (tout * torch.tensor(gn, dtype=torch.float64)).sum().backward()
    for g, want in zip(got, (tout, tx.grad, tw.grad)): np.testing.assert_array_equal(g, want.detach().numpy())
