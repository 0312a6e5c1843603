"""Symbolic sizes below the frontend: size arithmetic (ir/shape.py), stripping bound variables from the tensor graph
(schedule/variables.py), reshape index groups with variables, and the kernel argument order (codegen)."""
import pytest

from fusegrad import Tensor, Variable
from fusegrad.codegen import to_program
from fusegrad.device import Device
from fusegrad.ir.ops import Ops
from fusegrad.ir.shape import shrink_bounds_error, shrink_bounds_known, sle, smax, sprod, sym_eq
from fusegrad.schedule.indexing import reshape_groups
from fusegrad.schedule.variables import strip_binds


def test_size_arithmetic():
    n = Variable("n", 1, 10)
    assert sprod((2, 3)) == 6 and sprod((n, 1)) is n and sprod((0, n)) == 0
    assert sym_eq(sprod((2, n, 4)), sprod((n, 8))) and not sym_eq(n, 10)
    assert smax(sprod((n, 4))) == 40 and smax(7) == 7
    assert sle(n, 10) and not sle(n, 9) and sle(n, n) and sle(0, n)


def test_shrink_bounds_known():
    """True for every value, False for none, None when the values decide (checked then: shrink_bounds_error)."""
    v, a = Variable("v", 1, 10), Variable("a", 0, 8)
    assert shrink_bounds_known(0, v, 10) is True and shrink_bounds_known(v - 1, v, 10) is True
    assert shrink_bounds_known(0, v, 6) is None and shrink_bounds_known(a, v, 10) is None
    assert shrink_bounds_known(0, Variable("w", 7, 9), 6) is False and shrink_bounds_known(v + 20, v + 21, 20) is False
    assert shrink_bounds_known(2, 1, 6) is False and shrink_bounds_known(0, 6, 6) is True
    assert shrink_bounds_error([(0, 0, v, 6)], {v: 6}) is None
    assert shrink_bounds_error([(1, a, v, 6)], {v: 3, a: 3}) is None
    assert shrink_bounds_error([(1, a, v, 6)], {v: 3, a: 4}) == \
        "slice bounds (a, v) = (4, 3) are out of range for dimension 1 of size 6"
    assert "(0, 7)" in shrink_bounds_error([(0, 0, v.bind(7), 6)])


def test_reshape_groups_with_a_variable():
    n = Variable("n", 1, 10)
    assert reshape_groups((n, 4), (sprod((n, 4)),)) == [(0, 2, 0, 1)]
    assert reshape_groups((2, n, 4), (2, sprod((n, 4)))) == [(0, 1, 0, 1), (1, 3, 1, 2)]
    assert reshape_groups((n, 1, 3), (n, 3)) == [(0, 1, 0, 1), (1, 3, 1, 2)]
    # sizes that can't be proven equal group by group: one group, flattened whole
    assert reshape_groups((n, 4), (4, n)) == [(0, 2, 0, 2)]


def test_strip_binds_gives_one_graph_for_every_value():
    n = Variable("n", 1, 10)
    x = Tensor.empty(10, 4)
    graphs = []
    for k in (2, 7):
        t = (x[:n.bind(k)] * 2).sum(1)
        sink, mapping, var_vals = strip_binds(t.uop)
        assert var_vals == {n: k}
        assert not any(u.op is Ops.BIND for node in sink.toposort() for u in _arg_uops(node.arg))
        graphs.append(sink)
    assert graphs[0] is graphs[1]


def _arg_uops(arg):
    from fusegrad.ir.ops import UOp
    if isinstance(arg, UOp): return list(arg.toposort())
    if isinstance(arg, tuple): return [u for a in arg for u in _arg_uops(a)]
    return []


def test_strip_binds_errors():
    m = Variable("m", 1, 10)
    with pytest.raises(ValueError, match="'m'.*not bound"): strip_binds((Tensor.ones(m) * 2).uop)


def test_strip_binds_gives_each_further_value_an_alias():
    """One variable bound to 2 and 3 in one graph: 2 stays `n`, 3 gets `n__1` (same range), and the two slices become
    different nodes; a user variable named like the alias, with another range, is aliased in turn (`n__1__1`, its own
    range): one name is one kernel argument."""
    n, user = Variable("n", 1, 10), Variable("n__1", 0, 5)
    x = Tensor.empty(10)
    _, _, var_vals = strip_binds((x[:n.bind(2)].sum() + x[:n.bind(3)].sum() + x[:user.bind(4)].sum()).uop)
    alias, user_alias = Variable("n__1", 1, 10), Variable("n__1__1", 0, 5)
    assert var_vals == {n: 2, alias: 3, user_alias: 4}
    _, _, var_vals = strip_binds((x[:n.bind(5)].sum() + x[:n.bind(5)].sum(0)).uop)
    assert var_vals == {n: 5}


def test_variables_are_int_arguments_after_the_buffers_in_name_order():
    a, b = Variable("a", 1, 8), Variable("b", 1, 8)
    t = Tensor.empty(8, 8)[:b.bind(3), :a.bind(5)].sum(1)
    ast = next(si.ast for si in t.schedule())
    spec = to_program(ast, Device["CPU"].renderer)
    assert spec.vars == [a, b]
    assert "float* restrict data1, const int a, const int b)" in spec.src
    assert spec.thread_size == 0   # a symbolic outer loop isn't split across threads


def test_64bit_variable_is_a_64bit_kernel_argument():
    """A variable whose range needs 64 bits is declared as a 64-bit argument by every C-style renderer (the runtimes
    pass it as int64); one inside int32 stays `int`."""
    from fusegrad.renderer.cuda import CUDARenderer
    from fusegrad.renderer.metal import MetalRenderer
    from fusegrad.renderer.opencl import OpenCLRenderer
    from fusegrad.renderer.wgsl import WGSLRenderer
    big, small = Variable("big", 0, 2**40), Variable("small", 0, 100)
    assert str(big.dtype) in ("dtypes.long", "dtypes.int64") and small.dtype == Tensor([1], dtype="int32").dtype

    def ast_of(v):
        return [si.ast for si in (Tensor([1.0, 2.0]) + v.bind(7)).schedule() if not si.is_copy][0]
    for r, arg64 in ((Device["CPU"].renderer, "const long long big"), (CUDARenderer(), "const long long big"),
                     (MetalRenderer(), "constant long& big"), (OpenCLRenderer(), "const long big")):
        assert arg64 in to_program(ast_of(big), r).src
        assert f"{r.arg_int_prefix} small" in to_program(ast_of(small), r).src
    with pytest.raises((NotImplementedError, RuntimeError), match="64"): to_program(ast_of(big), WGSLRenderer())


def test_canonical_sizes():
    """Sums and products of variables have one normal form (terms ordered by variable name, products multiplied
    out), so sizes equal as polynomials are the same node; each form is checked on every value against Python ints."""
    import itertools

    from fusegrad.ir.ops import sym_infer
    from fusegrad.ir.shape import canonical
    i, j, k = Variable("i", 1, 4), Variable("j", 0, 3), Variable("k", 2, 5)
    pairs = [(i + j, j + i), (i * j, j * i), (k * (j * i), i * (k * j)), (2 * j + i * 3, i * 3 + j * 2),
             (i * (j + 1), i * j + i), ((i + j) * (i - j), i * i - j * j),
             ((i + 1) * (k + 2) * 3, 3 * i * k + 6 * i + 3 * k + 6)]
    for a, b in pairs:
        assert canonical(a) is canonical(b) and sym_eq(a, b), (a, b)
        for vi, vj, vk in itertools.product(range(1, 5), range(0, 4), range(2, 6)):
            env = {i: vi, j: vj, k: vk}
            assert sym_infer(canonical(a), env) == sym_infer(a, env) == sym_infer(b, env)
    assert not sym_eq(i + j, i + k) and not sym_eq(i * j, i * k)
    assert canonical(i * j * 0) == 0 and canonical(i - i) == 0


def test_two_variables_of_one_name_with_other_ranges():
    """Two different variables named `i` (ranges 0..10 and 0..15) in one kernel: the second is aliased (`i__1`), so the
    kernel has one argument per name (it failed in the C compiler: "redefinition of parameter"), with NumPy's
    values, bound to one value or to two, eagerly and through TinyJit replays with new values."""
    import numpy as np
    from fusegrad import TinyJit
    a = Tensor(np.arange(20, dtype=np.float32)).realize()
    i1, i2 = Variable("i", 0, 10), Variable("i", 0, 15)
    for x, y in ((3, 3), (2, 7)):
        out = (a[i1.bind(x):i1.bind(x) + 2] + a[i2.bind(y):i2.bind(y) + 2]).numpy()
        np.testing.assert_array_equal(out, np.arange(x, x + 2) + np.arange(y, y + 2))
    step = TinyJit(lambda u, v: (a[u:u + 2] * 10 + a[v:v + 2]).realize())
    for x, y in ((1, 2), (4, 9), (10, 15), (0, 0)):
        want = np.arange(x, x + 2) * 10 + np.arange(y, y + 2)
        np.testing.assert_array_equal(step(i1.bind(x), i2.bind(y)).numpy(), want)


def test_a_clash_reaching_codegen_is_a_clear_error():
    """Two variables of one name in a kernel AST (here made by hand: the scheduler aliases them) is a ValueError naming
    them, not a C compile error."""
    from fusegrad.dtype import dtypes
    from fusegrad.ir.ops import UOp
    from fusegrad.ir.pattern import substitute
    ast = [si.ast for si in (Tensor([1.0, 2.0]) + Variable("i", 0, 10).bind(1) + Variable("j", 0, 3).bind(2)).schedule()
           if not si.is_copy][0]
    j = next(u for u in ast.toposort() if u.op is Ops.DEFINE_VAR and u.arg[0] == "j")
    clash = substitute(ast, {j: UOp(Ops.DEFINE_VAR, dtypes.int, (), ("i", 0, 15))})
    with pytest.raises(ValueError, match="two different variables named 'i'"):
        to_program(clash, Device["CPU"].renderer)
