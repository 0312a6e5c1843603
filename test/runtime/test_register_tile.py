"""Register tiles fit the machine (codegen/opt.py `register_tile`, runtime/machine.py): for an AVX2 target
(x86-64-v3, 16 vector registers) and an AVX-512 one (x86-64-v4, 32), the heuristic's matmul kernel is compiled to
assembly with the CPU device's own flags, and the innermost loop that does the FMAs must not touch the stack with a
vector register (a spill or a reload). The old fixed tile (8 x 2 vectors: 16 accumulators) on AVX2 is the positive
control: the same check finds its spills. The kernels run where the host can, exactly equal to NumPy (integer-valued
inputs make the sums exact)."""
import platform
import re

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.opt import Opt, apply_opt, apply_opts, clamped_upcast_ok, hand_coded_opts, register_tile, \
    tile_registers
from fusegrad.codegen.search import fits_registers
from fusegrad.device import Buffer
from fusegrad.dtype import dtypes
from fusegrad.ir.ops import Ops, UOp
from fusegrad.renderer.cstyle import TILE_LOOP_ACCUMULATORS, TILE_LOOP_UNROLL, ClangRenderer, tile_loop
from fusegrad.runtime import machine as machine_mod
from fusegrad.runtime.ops_cpu import CPUCompiler, CPUProgram, find_compiler

from asm_loops import hot_loop

X86 = platform.machine().lower() in ("x86_64", "amd64")
CC = find_compiler(raise_error=False)
pytestmark = pytest.mark.skipif(CC is None or not X86, reason="x86-64 levels need an x86 host with a C compiler")

VREG = re.compile(r"%[xyz]mm\d+")
STACK = re.compile(r"\(%r[sb]p")           # an address off the stack or frame pointer


def stack_vector_accesses(loop: list[str]) -> list[str]:
    """Instructions of the loop that move a vector register to or from the stack (spills, reloads, FMAs reading a
    spilled accumulator)."""
    return [ln.strip() for ln in loop if VREG.search(ln) and STACK.search(ln)]


# read before any test replaces `host_flags` (`target` does: with None the check passes everything, and AVX-512 code ran
# on an AVX2 host, killing the pytest worker with SIGILL)
HOST_FLAGS = machine_mod.host_flags()


def runnable(march: str) -> bool:
    """Whether this host has the instructions code built for `march` uses."""
    try: machine_mod.check_host(machine_mod.target_macros(CC, march), march, HOST_FLAGS)
    except RuntimeError: return False
    return True


def target(march: str, monkeypatch) -> tuple[CPUCompiler, ClangRenderer]:
    """The CPU device's compiler and renderer as they would be set up for CPU_MARCH=march (on any x86 host: the
    check that the host can run that code is off, `runnable` asks it)."""
    monkeypatch.setattr(machine_mod, "host_flags", lambda: None)
    comp = CPUCompiler(march)
    ren = ClangRenderer()
    ren.threads, ren.machine = 2, comp.machine
    ren.simd_bytes, ren.cache_bytes = comp.machine.vector_bytes, comp.machine.l2_bytes
    return comp, ren


def test_runnable_asks_the_host_even_after_target_replaced_its_flags(monkeypatch):
    """On an AVX2 host, x86-64-v4 code is not runnable, also once `target` has switched the device's check off."""
    target("x86-64-v4", monkeypatch)
    assert runnable("x86-64-v4") == (HOST_FLAGS is None or "avx512f" in HOST_FLAGS)
    assert runnable("x86-64-v3") == (HOST_FLAGS is None or "avx2" in HOST_FLAGS)


def matmul_ast(m: int, k: int, n: int):
    # (b needs a gradient: a large b is then read as it is, not as column panels, see Tensor.dot)
    a, b = Tensor.empty(m, k).realize(), Tensor.empty(k, n).realize()
    b.requires_grad = True
    (si,) = (a @ b).schedule()
    return si.ast


def run(comp: CPUCompiler, spec, arrays: list[np.ndarray], out_shape: tuple[int, ...]) -> np.ndarray:
    prg = CPUProgram(spec, comp.compile(spec.src))
    bufs = [Buffer("CPU", int(np.prod(out_shape)), dtypes.float32).ensure_allocated()]
    for arr in arrays: bufs.append(Buffer("CPU", arr.size, dtypes.float32).ensure_allocated().copyin(memoryview(arr)))
    args = [b.opaque for b in bufs]
    if spec.thread_size: prg.fxn(*args, 0, spec.thread_size)
    else: prg.fxn(*args)
    out = np.empty(out_shape, np.float32)
    bufs[0].copyout(memoryview(out).cast("B"))
    return out


@pytest.mark.parametrize("march,registers", [("x86-64-v3", 16), ("x86-64-v4", 32)])
@pytest.mark.parametrize("m", [64, 96])   # 64 rows: a 4 x 2 tile on AVX2; 96: 6 x 2 (BLIS's 6x16)
def test_matmul_tile_does_not_spill(march, registers, m, monkeypatch):
    comp, ren = target(march, monkeypatch)
    assert comp.machine.vector_registers == registers and f"-march={march}" in comp.flags
    spec = to_program(matmul_ast(m, 256, 256), ren)
    spills = stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name))
    assert spills == [], f"{march}: the reduce loop of {spec.name} spills:\n" + "\n".join(spills)
    rng = np.random.default_rng(m)
    a, b = (rng.integers(-4, 5, s).astype(np.float32) for s in ((m, 256), (256, 256)))
    if not runnable(march): pytest.skip(f"this host can't run {march} code (the assembly was checked)")
    np.testing.assert_array_equal(run(comp, spec, [a, b], (m, 256)), a @ b)


def test_the_check_finds_the_spills_of_the_old_avx2_tile(monkeypatch):
    """8 rows x 2 vectors of 8 (16 accumulators): every ymm register, so GCC keeps accumulators on the stack; the
    same check must see it (else the test above proves nothing)."""
    comp, ren = target("x86-64-v3", monkeypatch)
    ast = matmul_ast(64, 256, 256)
    spec = to_program(ast, ren, [Opt("VECTORIZE", 1, 8), Opt("UPCAST", 0, 8), Opt("UPCAST", 1, 2)])
    assert len(stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name))) >= 4
    rng = np.random.default_rng(1)
    a, b = (rng.integers(-4, 5, s).astype(np.float32) for s in ((64, 256), (256, 256)))
    if runnable("x86-64-v3"): np.testing.assert_array_equal(run(comp, spec, [a, b], (64, 256)), a @ b)  # still right


@pytest.mark.parametrize("sizes,registers,want", [
    ([64, 32], 32, [8, 2]),    # AVX-512: the tile as it always was
    ([64, 32], 16, [4, 2]),    # AVX2: 8 x 2 needs 19 registers; 4 x 2 (11) beats 2 x 4 (13) and 8 x 1 on loads per step
    ([96, 32], 16, [6, 2]),    # 6 x 2 (BLIS's 6x16): 12 accumulators, 2 vectors of b, one broadcast at a time
    ([96], 16, [8]),           # one axis: 8 accumulators, one vector and one broadcast
    ([8, 6], 16, [4, 3]),      # 12 accumulators: 4 x 3 (7 loads per step) before 6 x 2 (8)
    ([8, 6], 32, [8, 2]),      # AVX-512 keeps its old tile
    ([1024, 128], 16, [4, 2]),   # powers of two: no 12-accumulator tile divides them
    ([3, 3], 16, [3, 3]),
])
def test_register_tile(sizes, registers, want):
    got = register_tile(sizes, registers)
    assert got == want and tile_registers(got) <= registers


@pytest.mark.parametrize("opts,spills", [
    ([Opt("UPCAST", 0, 8), Opt("UPCAST", 1, 2)], True), ([Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 4)], True),
    ([Opt("UPCAST", 0, 2), Opt("UPCAST", 1, 8)], True), ([Opt("UPCAST", 0, 6), Opt("UPCAST", 1, 2)], False),
    ([Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 3)], False), ([Opt("UPCAST", 0, 8)], False),
    ([Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 2)], False), ([Opt("UPCAST", 0, 2), Opt("UPCAST", 1, 4)], False),
    ([Opt("UPCAST", 0, 3), Opt("UPCAST", 1, 2)], False)])
def test_tile_registers_predicts_avx2_spills(opts, spills, monkeypatch):
    """The register model against GCC on AVX2: a tile spills exactly when tile_registers says it doesn't fit
    (checked on the tiles the heuristic may pick)."""
    comp, ren = target("x86-64-v3", monkeypatch)
    spec = to_program(matmul_ast(96, 256, 384), ren, [Opt("VECTORIZE", 1, 8)] + opts)
    assert bool(stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name))) == spills
    assert (tile_registers([o.amount for o in opts]) > 16) == spills


@pytest.mark.parametrize("march,fits", [("x86-64-v3", False), ("x86-64-v4", True)])
def test_beam_rejects_tiles_that_do_not_fit(march, fits, monkeypatch):
    """BEAM's candidates stay within the machine's registers: the 8 x 2 tile (16 accumulators) is dropped before
    compiling on AVX2 and kept on AVX-512; the heuristic's own tile always fits."""
    _, ren = target(march, monkeypatch)
    ast = matmul_ast(64, 256, 256)
    w = ren.machine.lanes(dtypes.float32)
    assert fits_registers(apply_opts(ast, ren, [Opt("VECTORIZE", 1, w), Opt("UPCAST", 0, 8), Opt("UPCAST", 1, 2)]),
                          ren) == fits
    assert fits_registers(apply_opts(ast, ren), ren)


@pytest.mark.parametrize("m,k,n", [(77, 77, 77), (96, 256, 384), (1000, 1000, 1000), (1023, 1023, 1023),
                                   (1000, 1024, 1024), (1152, 96, 1024), (6, 1023, 24)])
def test_matmul_exact_at_sizes_the_tiles_do_not_divide(m, k, n):
    """Through the whole pipeline on this process's CPU target (the README's test command runs under CPU_MARCH=native
    and x86-64-v3): sizes the register tile, the vector width or the column panels don't divide (a remainder), and
    ones that take the 12-accumulator AVX2 tiles (rows divisible by 6, vectors by 3), equal NumPy exactly
    (integer-valued inputs: every partial sum is exact in float32)."""
    rng = np.random.default_rng(m * 7 + n)
    a, b = (rng.integers(-4, 5, s).astype(np.float32) for s in ((m, k), (k, n)))
    # a large realized weight without a gradient (1024 x 1024 here) is read as column panels (Tensor.dot)
    np.testing.assert_array_equal((Tensor(a) @ Tensor(b)).numpy(), a @ b)


@pytest.mark.parametrize("m,opts", [
    (100, [Opt("VECTORIZE", 1, 8), Opt("UPCAST", 0, 6), Opt("UPCAST", 1, 2)]),   # 17 trips, the last one 4 rows
    (77, [Opt("VECTORIZE", 1, 8), Opt("UPCAST", 0, 8)]),
    (2048, [Opt("VECTORIZE", 1, 8), Opt("UPCAST", 0, 6), Opt("UPCAST", 1, 2), Opt("TILE", 0, 19)]),
    (1024, [Opt("VECTORIZE", 1, 8), Opt("UPCAST", 0, 6), Opt("UPCAST", 1, 2), Opt("TILE", 0, 29)]),  # 6 x 29 trips
    (100, [Opt("VECTORIZE", 1, 8), Opt("UPCAST", 1, 2), Opt("TILE", 0, 7)])])   # a TILE alone: 15 blocks, 5 clamped
def test_upcast_with_a_remainder_clamps_the_last_trip(m, opts, monkeypatch):
    """An UPCAST (or TILE) amount that doesn't divide its range: the last trip's (block's) rows past the end compute
    (and store) the last row again, so every output is right and nothing outside the buffers is touched; the reduce
    loop still doesn't spill on AVX2."""
    comp, ren = target("x86-64-v3", monkeypatch)
    spec = to_program(matmul_ast(m, 64, 256), ren, opts)
    assert stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name)) == []
    rng = np.random.default_rng(m)
    a, b = (rng.integers(-4, 5, s).astype(np.float32) for s in ((m, 64), (64, 256)))
    if not runnable("x86-64-v3"): pytest.skip("this host can't run x86-64-v3 code (the assembly was checked)")
    np.testing.assert_array_equal(run(comp, spec, [a, b], (m, 256)), a @ b)


def test_upcast_with_a_remainder_is_refused_where_a_kernel_reads_what_it_writes():
    """In place, a duplicated row would read the value its own copy already wrote: such a kernel needs an amount that
    divides (and the heuristic never asks otherwise)."""
    t = Tensor.empty(10, 16).realize()
    ast = t.assign(t * 2 + 1).schedule()[-1].ast
    assert not clamped_upcast_ok(ast)
    with pytest.raises(ValueError, match="reads what it writes"): apply_opt(ast, Opt("UPCAST", 0, 3))
    with pytest.raises(ValueError, match="reads what it writes"): apply_opt(ast, Opt("TILE", 0, 3))
    assert clamped_upcast_ok(matmul_ast(10, 16, 16))


@pytest.mark.parametrize("m,threads,rows,block", [(2048, 2, 6, 19), (1024, 2, 6, 29), (1024, 1, 6, 19),
                                                 (1152, 2, 6, 32), (64, 2, 4, 4), (256, 2, 5, 13)])
def test_avx2_heuristic_takes_a_remainder_where_its_blocks_split_evenly(m, threads, rows, block, monkeypatch):
    """AVX2 (16 registers): 6 x 2 (12 accumulators) where 6 divides the rows, or leaves at most 1/64 of them over
    and the trips fall into cache blocks of 8 or more that split evenly over the threads: 2048 rows, 342 trips in 18
    blocks of 19; 1024 rows, 171 trips, in 6 blocks of 29 on 2 threads (the last one clamped; 9 blocks of 19 would
    give one thread 5); 256 rows: 43 trips make no such blocks on 2 threads, 5 x 2 does. Else 4 x 2. AVX-512 keeps
    8 x 2."""
    _, ren = target("x86-64-v3", monkeypatch)
    ren.threads = threads
    opts = hand_coded_opts(matmul_ast(m, 1024, 1024), ren)
    assert [o.amount for o in opts if o.op == "UPCAST"] == [rows, 2]
    assert [o.amount for o in opts if o.op == "TILE"] == [block]
    _, ren = target("x86-64-v4", monkeypatch)
    assert [o.amount for o in hand_coded_opts(matmul_ast(m, 1024, 1024), ren) if o.op == "UPCAST"] == [8, 2]


@pytest.mark.parametrize("march,registers", [("x86-64-v3", 16), ("x86-64-v4", 32)])
@pytest.mark.parametrize("m,rows", [(26, 13), (24, 12), (13, 13)])
def test_skinny_products_tile_many_rows_and_put_the_columns_outermost(march, registers, m, rows, monkeypatch):
    """A few rows against a large w (MiniLM's 26 tokens @ 384 x 1536): as many rows as the registers hold in one
    block, the column loop outermost (split over the threads), no spills, exact results. The old 2 x 8 tile read all
    of w once per pair of rows, from L2 (2x slower at 26 rows)."""
    comp, ren = target(march, monkeypatch)
    ast = matmul_ast(m, 384, 1536)
    opts = hand_coded_opts(ast, ren)
    ups = {o.axis: o.amount for o in opts if o.op == "UPCAST"}
    assert ups.get(0) == rows, opts
    assert any(o.op == "SWAP" for o in opts) == (rows < m), opts   # all rows in one block: the column loop is alone
    spec = to_program(ast, ren)
    spills = stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name))
    assert spills == [], f"{march}: the reduce loop of {spec.name} spills:\n" + "\n".join(spills)
    if not runnable(march): pytest.skip(f"this host can't run {march} code (the assembly was checked)")
    rng = np.random.default_rng(m)
    a, b = rng.integers(-4, 5, (m, 384)).astype(np.float32), rng.integers(-4, 5, (384, 1536)).astype(np.float32)
    np.testing.assert_array_equal(run(comp, spec, [a, b], (m, 1536)), a @ b)


def test_a_small_w_or_many_rows_keep_the_usual_tile(monkeypatch):
    """Only a product whose rows read a large w changes: up to 16 row blocks swap the column loop outermost with the
    usual tile (64 and 128 rows: 1.3-2x); a w of at most a quarter of the L2 (256 KB of a 2 MB L2) and 1024 rows are
    left as they were. (26 rows against MiniLM's 590 KB 384 x 384 weights take the skinny tile and the swap, below.)"""
    _, ren = target("x86-64-v4", monkeypatch)
    small = int((ren.cache_bytes // 4 // 4) ** 0.5) // 16 * 16   # a square w of at most a quarter of the cache
    for m, k, n, swap in ((26, small, small, False), (64, 384, 1536, True), (128, 384, 1536, True),
                          (1024, 384, 1536, False)):
        opts = hand_coded_opts(matmul_ast(m, k, n), ren)
        assert any(o.op == "SWAP" for o in opts) == swap, (m, k, n, opts)
        assert all(o.amount <= 8 for o in opts if o.op == "UPCAST"), opts


@pytest.mark.parametrize("m", [64, 128, 100])
def test_swapped_products_with_many_rows_are_exact(m):
    rng = np.random.default_rng(m)
    a, w = rng.integers(-4, 5, (m, 384)).astype(np.float32), rng.integers(-4, 5, (1536, 384)).astype(np.float32)
    np.testing.assert_array_equal((Tensor(a) @ Tensor(w).T).numpy(), a @ w.T)


@pytest.mark.parametrize("m", [26, 82, 256])
def test_a_quantized_product_with_many_rows_puts_the_columns_outermost_and_stays_exact(m, monkeypatch):
    """A prompt's rows against a quantized weight are a dot product along the blocks (vectorized along the reduce):
    reading all of w once per 2-row block cost 2-3x at 32 to 1024 rows (82 rows x Q4_1 576 -> 1536: 2.4 -> 0.8 ms),
    so the column loop goes outermost from 32 rows on (26 rows take the skinny tile instead: two blocks of 13). Exact
    against NumPy on integer-valued data."""
    from fusegrad.models.quantized import QuantizedLinear
    _, ren = target("x86-64-v4", monkeypatch)
    rng = np.random.default_rng(m)
    q = QuantizedLinear(64, 96, ggml_type=3)
    q.d, q.m = Tensor(np.ones((96, 2), np.float32)), Tensor(np.full((96, 2), -8.0, np.float32))
    q.qs = Tensor(rng.integers(0, 256, (96, 2, 16)).astype(np.uint8))
    x = rng.integers(-3, 4, (m, 64)).astype(np.float32)
    big = QuantizedLinear(576, 1536, ggml_type=3)
    opts = hand_coded_opts(big(Tensor.empty(m, 576)).schedule()[-1].ast, ren)
    # (26 rows make two blocks of 13 with the skinny tile: the swap cost 15-25% there, so it is left out)
    assert any(o.op == "SWAP" for o in opts) == (m != 26), opts
    np.testing.assert_array_equal(q(Tensor(x)).numpy(), x @ q.dequantize().numpy().T)


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v4"])
def test_a_quarter_of_the_cache_takes_the_skinny_tile(march, monkeypatch):
    """26 rows against a w of more than a quarter of the L2 (MiniLM's 384 x 384 projections, 590 KB: on one core,
    read from memory, AVX2 240 -> 110 us and AVX-512 101-127 -> 61-79 us as panels with this tile) take the skinny tile
    and the column loop outermost; exactly a quarter keeps the usual tile."""
    from fusegrad.codegen.opt import skinny_bytes
    _, ren = target(march, monkeypatch)
    n = int((skinny_bytes(ren.cache_bytes) // 4) ** 0.5)   # n x n float32 of exactly a quarter of the cache
    opts = hand_coded_opts(matmul_ast(26, 384, 384), ren)
    assert Opt("UPCAST", 0, 13) in opts and Opt("SWAP", 0, 1) in opts, opts
    if n * n * 4 == skinny_bytes(ren.cache_bytes):
        opts = hand_coded_opts(matmul_ast(26, n, n), ren)
        assert Opt("UPCAST", 0, 13) not in opts and not any(o.op == "SWAP" for o in opts), opts


@pytest.mark.parametrize("march,lanes", [("x86-64-v3", 8), ("x86-64-v4", 16)])
def test_skinny_products_read_one_vector_panels_with_the_skinny_tile(march, lanes, monkeypatch):
    """26 rows against a 384 x 1536 weight stored as one-vector panels (Tensor.dot: (1536 / lanes, 384, lanes)) plus
    a bias: the column loop splits into panels (codegen/merge.py), the panel's lanes are the vector, the rows take
    the skinny tile (13) and the panel loop goes outermost, so each thread streams its panels once, sequentially;
    no spills, exact results."""
    comp, ren = target(march, monkeypatch)
    x, wp, b = Tensor.empty(26, 384), Tensor.empty(1536 // lanes, 384, lanes), Tensor.empty(1536)
    ast = ((x.reshape(26, 1, 384, 1) * wp).sum(-2).reshape(26, 1536) + b).schedule()[-1].ast
    spec = to_program(ast, ren)
    assert spec.name == f"r_26_{1536 // lanes}_{lanes}_384"
    from fusegrad.codegen.merge import merge_ranges, split_ranges
    opts = hand_coded_opts(merge_ranges(split_ranges(ast)), ren)
    assert Opt("VECTORIZE", 2, lanes) in opts and Opt("UPCAST", 0, 13) in opts and Opt("SWAP", 0, 1) in opts, opts
    spills = stack_vector_accesses(hot_loop(comp.assembly(spec.src), spec.name))
    assert spills == [], f"{march}: the reduce loop of {spec.name} spills:\n" + "\n".join(spills)
    if not runnable(march): pytest.skip(f"this host can't run {march} code (the assembly was checked)")
    rng = np.random.default_rng(5)
    xn, wn = rng.integers(-4, 5, (26, 384)).astype(np.float32), rng.integers(-4, 5, (384, 1536)).astype(np.float32)
    bn = rng.integers(-4, 5, 1536).astype(np.float32)
    wpn = np.ascontiguousarray(wn.reshape(384, 1536 // lanes, lanes).transpose(1, 0, 2))
    np.testing.assert_array_equal(run(comp, spec, [xn, wpn, bn], (26, 1536)), xn @ wn + bn)


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64-v4"])
def test_tile_loop_is_unrolled_without_spills(march, monkeypatch):
    """The register tile's reduce loop carries `#pragma GCC unroll` (renderer/cstyle.py `tile_loop`): GCC's innermost
    FMA loop then holds TILE_LOOP_UNROLL trips of the tile's FMAs, still without a stack access, and the result is
    exact. A reduce with one accumulator (a row sum) gets no pragma."""
    comp, ren = target(march, monkeypatch)
    spec = to_program(matmul_ast(96, 256, 256), ren)
    accs = spec.src.count("[0] = acc")   # the accumulator updates in the loop body
    assert f"#pragma GCC unroll {TILE_LOOP_UNROLL}\n" in spec.src and accs >= TILE_LOOP_ACCUMULATORS
    loop = hot_loop(comp.assembly(spec.src), spec.name)
    assert sum("vfmadd" in ln for ln in loop) == TILE_LOOP_UNROLL * accs
    assert stack_vector_accesses(loop) == []
    (si,) = Tensor.empty(64, 256).realize().sum(axis=1).schedule()
    assert "#pragma" not in to_program(si.ast, ren).src
    rng = np.random.default_rng(7)
    a, b = (rng.integers(-4, 5, s).astype(np.float32) for s in ((96, 256), (256, 256)))
    if not runnable(march): pytest.skip(f"this host can't run {march} code (the assembly was checked)")
    np.testing.assert_array_equal(run(comp, spec, [a, b], (96, 256)), a @ b)


@pytest.mark.parametrize("trips,accs,nested,want", [(256, 12, False, True), (7, 12, False, False),
                                                     (256, 4, False, False), (256, 12, True, False)])
def test_tile_loop_rule(trips, accs, nested, want):
    """tile_loop on hand-built programs: enough trips, enough vector accumulators, and no loop inside."""
    f8 = dtypes.float32.vec(8)
    r = UOp.range(trips, 1, "reduce")
    body = [r] + ([UOp.range(4, 2, "reduce")] if nested else [])
    for i in range(accs):
        slot = UOp(Ops.INDEX, f8, (UOp(Ops.DEFINE_REG, f8.ptr(1, "reg"), (), i), UOp.const(dtypes.int32, 0)))
        body.append(UOp(Ops.STORE, dtypes.void, (slot, UOp.const(f8, 1.0))))
    body.append(UOp(Ops.END, dtypes.void, (r,)))
    assert tile_loop(body, 0) == want


@pytest.mark.parametrize("outer,want", [("global", True), ("reduce", False)])
def test_tile_loop_rule_inside_another_reduce(outer, want):
    """A tile loop inside another reduce loop (a conv weight gradient's 20-trip loop inside its 5 x 5 window's) is not
    unrolled: unrolled, that kernel ran 1.7x slower on AVX2. Inside an output loop it is."""
    f8 = dtypes.float32.vec(8)
    o, r = UOp.range(5, 3, outer), UOp.range(256, 1, "reduce")
    body = [o, r]
    for i in range(12):
        slot = UOp(Ops.INDEX, f8, (UOp(Ops.DEFINE_REG, f8.ptr(1, "reg"), (), i), UOp.const(dtypes.int32, 0)))
        body.append(UOp(Ops.STORE, dtypes.void, (slot, UOp.const(f8, 1.0))))
    body += [UOp(Ops.END, dtypes.void, (r,)), UOp(Ops.END, dtypes.void, (o,))]
    assert tile_loop(body, 1) == want
