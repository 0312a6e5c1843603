"""Linearizer: loops placed from data dependencies, reduce accumulators around their loops, invariant work hoisted."""
import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.linearize import linearize
from fusegrad.codegen.opt import Opt
from fusegrad.device import Device
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import graph_rewrite
from fusegrad.ir.spec import verify_linear
from fusegrad.ir.symbolic import pm_symbolic

M, K, N = 8, 16, 4
rng = np.random.default_rng(2)
A_NP = rng.standard_normal((M, K)).astype(np.float32)
B_NP = rng.standard_normal((K, N)).astype(np.float32)
C_NP = rng.standard_normal((M,)).astype(np.float32)


def linear(t: Tensor, opt: bool) -> list[UOp]:
    """The linear program of the single kernel computing t: with the heuristic's reduce unrolling or without any opts
    (upcasts change the loop structure; test_upcast_* covers them)."""
    (si,) = t.schedule()
    if opt: return to_program(si.ast, Device[Device.DEFAULT].renderer, unroll_opts(si.ast)).uops
    return linearize(graph_rewrite(si.ast, pm_symbolic))[0]


def unroll_opts(ast: UOp) -> list[Opt]:
    """Unroll every reduce range by 4."""
    return [Opt("UNROLL", n.arg[0], 4) for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "reduce"]


def open_loops(uops: list[UOp]) -> dict[int, tuple[UOp, ...]]:
    """For each position, the RANGEs open there (outermost first); asserts RANGE/END nest properly and all close."""
    stack: list[UOp] = []
    out = {}
    for i, u in enumerate(uops):
        if u.op is Ops.END:
            assert stack and stack[-1] is u.src[0], f"END at {i} doesn't close the innermost RANGE"
            stack.pop()
        out[i] = tuple(stack)
        if u.op is Ops.RANGE: stack.append(u)
    assert not stack, "unclosed RANGE"
    return out


def ranges(uops, kind):
    return [u for u in uops if u.op is Ops.RANGE and u.arg[1] == kind]


def loads_from(uops, slot):
    return [i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.PARAM
            and u.src[0].src[0].arg == slot]


@pytest.fixture
def matmul_scaled():
    a, b, c = Tensor(A_NP), Tensor(B_NP), Tensor(C_NP)
    return (a @ b) * c.reshape(M, 1)   # out[i, j] = c[i] * sum_k a[i, k] * b[k, j]


@pytest.mark.parametrize("opt", [False, True])
def test_matmul_loop_structure(matmul_scaled, opt):
    uops = linear(matmul_scaled, opt)
    verify_linear(uops)
    loops = open_loops(uops)
    (gi, gj), (rk,) = ranges(uops, "global"), ranges(uops, "reduce")
    assert (gi.src[0].arg, gj.src[0].arg) == (M, N)
    assert rk.src[0].arg == (K if not opt else K // 4)  # unrolled by 4 with optimizations
    pos = {u: i for i, u in enumerate(uops)}
    assert loops[pos[rk]] == (gi, gj)  # the reduce loop is the innermost, inside both output loops


@pytest.mark.parametrize("opt", [False, True])
def test_reduce_accumulator_wraps_the_reduce_loop(matmul_scaled, opt):
    uops = linear(matmul_scaled, opt)
    loops = open_loops(uops)
    (rk,) = ranges(uops, "reduce")
    pos = {u: i for i, u in enumerate(uops)}
    start, end = pos[rk], next(i for i, u in enumerate(uops) if u.op is Ops.END and u.src[0] is rk)
    (acc,) = [u for u in uops if u.op is Ops.DEFINE_REG]
    acc_stores = [i for i, u in enumerate(uops) if u.op is Ops.STORE and u.src[0].src[0] is acc]
    acc_loads = [i for i, u in enumerate(uops) if u.op is Ops.LOAD and u.src[0].src[0] is acc]
    # defined and initialized (to 0) before the loop, outside it
    assert pos[acc] < start and rk not in loops[pos[acc]]
    init = acc_stores[0]
    assert init < start and uops[init].src[1].op is Ops.CONST and uops[init].src[1].arg == 0
    # updated once per iteration inside the loop: load, add, store
    inner = [i for i in acc_stores if start < i < end]
    assert len(inner) == 1 and loops[inner[0]][-1] is rk
    # acc + v (acc + v0 + v1 + v2 + v3 with UNROLL(4): one add per copy, in the loop's own order)
    update, adds = uops[inner[0]].src[1], 1
    while update.op is Ops.ADD and not (update.src[0].op is Ops.LOAD and update.src[0].src[0].src[0] is acc):
        update, adds = update.src[0], adds + 1
    assert update.op is Ops.ADD and adds == (4 if opt else 1)
    # read after the loop, and that value is what the output gets
    final = [i for i in acc_loads if i > end]
    assert len(final) == 1 and rk not in loops[final[0]]
    (out_store,) = [i for i, u in enumerate(uops) if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]
    assert out_store > final[0] and rk not in loops[out_store] and len(loops[out_store]) == 2


@pytest.mark.parametrize("opt", [False, True])
def test_loop_invariant_load_is_hoisted(matmul_scaled, opt):
    uops = linear(matmul_scaled, opt)
    loops = open_loops(uops)
    gi, gj = ranges(uops, "global")
    (rk,) = ranges(uops, "reduce")
    pos = {u: i for i, u in enumerate(uops)}
    # c[i] depends on the outer output loop only: loaded once per i, before the j loop starts
    (c_load,) = loads_from(uops, 3)
    assert loops[c_load] == (gi,) and c_load < pos[gj]
    # a[i, k] and b[k, j] depend on k: they stay inside the reduce loop
    for i in loads_from(uops, 1) + loads_from(uops, 2): assert loops[i][-1] is rk
    # index math invariant in k (i*K, the row offset of a) is computed outside the reduce loop
    row_offsets = [i for i, u in enumerate(uops) if u.op is Ops.MUL and gi in u.src and
                   any(s.op is Ops.CONST and s.arg == K for s in u.src)]
    assert row_offsets and all(rk not in loops[i] for i in row_offsets)


def _softmax():
    x = Tensor(A_NP)
    e = (x - x.max(1, keepdim=True)).exp()
    return e / e.sum(1, keepdim=True)


@pytest.mark.parametrize("opt", [False, True])
@pytest.mark.parametrize("prog", ["matmul", "softmax"])
def test_every_node_sits_in_its_deepest_loop(matmul_scaled, prog, opt):
    """Nothing is emitted inside a loop it doesn't depend on (fully hoisted), and nothing outside one it does."""
    uops = linear(matmul_scaled if prog == "matmul" else _softmax(), opt)
    loops = open_loops(uops)
    pos = {u: i for i, u in enumerate(uops)}
    deps: dict[UOp, frozenset] = {}  # the loop indices each value depends on
    for i, u in enumerate(uops):
        if u.op is Ops.END:  # a loop's result depends on what its body depends on, except the loops closed here
            body = uops[pos[u.src[0]]:i]
            deps[u] = frozenset().union(*[deps[x] for x in body]) - {x for x in body if x.op is Ops.RANGE}
        else:
            own = frozenset([u]) if u.op is Ops.RANGE else frozenset()
            deps[u] = own.union(*[deps[s] for s in u.src])
    for i, u in enumerate(uops):
        if u.op not in GroupOp.ALU | {Ops.LOAD, Ops.INDEX} or u.dtype.scalar() != u.dtype: continue
        if any(s.op is Ops.DEFINE_REG or (s.op is Ops.INDEX and s.src[0].op is Ops.DEFINE_REG) for s in u.src):
            continue  # accumulator traffic belongs to the reduce loop by construction
        need = {r for r in deps[u] if r.op is Ops.RANGE}
        assert need <= set(loops[i]), f"{u.op} at {i} is outside a loop it uses"
        if need: assert loops[i][-1] in need, f"{u.op} at {i} could be hoisted out of {loops[i][-1].arg}"
        else: assert loops[i] == (), f"{u.op} at {i} depends on no loop but is inside one"


def test_softmax_row_reductions_are_hoisted_out_of_the_column_loop():
    uops = linear(_softmax(), False)
    loops = open_loops(uops)
    pos = {u: i for i, u in enumerate(uops)}
    gi, gj = ranges(uops, "global")
    reds = ranges(uops, "reduce")
    assert len(reds) == 2
    for r in reds:  # max and sum over a row run once per row, not once per output element
        assert loops[pos[r]] == (gi,) and pos[r] < pos[gj]
    (out_store,) = [i for i, u in enumerate(uops) if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM]
    assert loops[out_store] == (gi, gj)


@pytest.mark.parametrize("opt", [False, True])
def test_estimated_ops_count_loop_trips(matmul_scaled, opt):
    (si,) = matmul_scaled.schedule()
    if opt: ops = to_program(si.ast, Device[Device.DEFAULT].renderer, unroll_opts(si.ast)).ops
    else: ops = linearize(graph_rewrite(si.ast, pm_symbolic))[1].ops
    assert ops == 2 * M * N * K + M * N  # a multiply and an add per (i, j, k), the scale per (i, j)


def test_linearized_matmul_computes_the_right_values(matmul_scaled):
    np.testing.assert_allclose(matmul_scaled.numpy(), (A_NP @ B_NP) * C_NP[:, None], rtol=1e-5, atol=1e-5)


def test_upcast_tiles_the_output_with_one_accumulator_each(matmul_scaled):
    """Upcasting both output axes (8 -> 2x4, 4 -> 1x4): 16 accumulators share one reduce loop, each updated
    once per iteration, and every a/b load in the loop is shared by the 4 outputs that use it."""
    (si,) = matmul_scaled.schedule()
    opts = [Opt("UPCAST", 0, 4), Opt("UPCAST", 1, 4), Opt("UNROLL", 2, 4)]
    uops = to_program(si.ast, Device[Device.DEFAULT].renderer, opts).uops
    verify_linear(uops)
    accs = [u for u in uops if u.op is Ops.DEFINE_REG]
    assert len(accs) == 16
    (rk,) = ranges(uops, "reduce")
    pos = {u: i for i, u in enumerate(uops)}
    start = pos[rk]
    end = next(i for i, u in enumerate(uops) if u.op is Ops.END and u.src[0] is rk)
    updates = [i for i, u in enumerate(uops) if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_REG
               and start < i < end]
    assert len(updates) == 16
    loads_in_loop = [i for i in loads_from(uops, 1) + loads_from(uops, 2) if start < i < end]
    assert len(loads_in_loop) == (4 + 4) * (K // rk.src[0].arg)  # 4 rows of a and 4 columns of b per k step
    np.testing.assert_allclose(matmul_scaled.numpy(), (A_NP @ B_NP) * C_NP[:, None], rtol=1e-5, atol=1e-5)


def test_bad_opts_raise():
    (si,) = Tensor(A_NP).sum(1).schedule()
    ast = graph_rewrite(si.ast, pm_symbolic)
    glob = next(n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "global")
    red = next(n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "reduce")
    dev = Device[Device.DEFAULT].renderer
    # (an amount below the size that doesn't divide it clamps the last trip: test/runtime/test_register_tile.py)
    with pytest.raises(ValueError, match="must divide"): to_program(si.ast, dev, [Opt("UPCAST", glob.arg[0], 1 << 20)])
    with pytest.raises(ValueError, match="must divide"): to_program(si.ast, dev, [Opt("UNROLL", red.arg[0], 3)])
    with pytest.raises(ValueError, match="needs a reduce range"): to_program(si.ast, dev, [Opt("UNROLL", glob.arg[0], 2)])
    with pytest.raises(ValueError, match="needs an output range"): to_program(si.ast, dev, [Opt("UPCAST", red.arg[0], 2)])
    with pytest.raises(ValueError, match="no range"): to_program(si.ast, dev, [Opt("UNROLL", 99, 2)])


def test_upcast_reduce_masked_out_by_a_pad_shares_its_siblings_loop():
    """A right-padded stride-2 conv whose upcast output columns include one that reads only padding: that copy of the
    reduce depends on fewer ranges than its siblings, yet all of them share one loop nest, which must nest where the
    siblings need it (it was placed by the first one found: a KeyError while linearizing)."""
    import torch
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 1, 5, 8)).astype(np.float32)
    w = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    got = Tensor(x).pad((0, 3, 0, 0)).conv2d(Tensor(w), stride=2).numpy()
    want = torch.nn.functional.conv2d(torch.nn.functional.pad(torch.tensor(x), (0, 3, 0, 0)), torch.tensor(w),
                                      stride=2).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_register_tiled_matmul_splits_across_threads():
    """The threads get a kernel by its work, and a register-tiled step is 16 vector FMAs: MiniLM's FFN matmul at
    2 x 13 tokens (26 x 384 @ 384 x 1536, 60k innermost steps, 31M flops) ran on one core by the step count."""
    ren = Device["CPU"].renderer
    if ren.threads < 2: pytest.skip("one CPU thread")
    a, b = Tensor.empty(26, 384).realize(), Tensor.empty(384, 1536).realize()
    assert to_program((a @ b).schedule()[-1].ast, ren).thread_size > 1
    small = Tensor.empty(64).realize()
    assert to_program((small + 1).schedule()[-1].ast, ren).thread_size == 0


def test_loops_side_by_side_add_up_for_threading():
    """A layernorm over 26 x 384 has two reduce loops after one another in each row's iteration: 10k steps of work,
    not 13 x 384 x 384 (their product) as the thread split used to count; it stays on one thread (the split cost
    ~200 us for 10 us of work in MiniLM at 2 x 13 tokens)."""
    ren = Device["CPU"].renderer
    x = Tensor.empty(26, 384).realize()
    assert to_program(x.layernorm().schedule()[-1].ast, ren).thread_size == 0
    big = Tensor.empty(1024, 1024).realize()
    assert ren.threads < 2 or to_program(big.layernorm().schedule()[-1].ast, ren).thread_size > 1
