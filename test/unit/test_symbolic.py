"""The symbolic (index arithmetic) rules, Before -> Expected.

Nodes are hash-consed, so "simplifies to the expected expression" is `simplify(before) is expected`: a test fails on any
structural difference, including an equivalent expression in a different form.
"""
import itertools

import pytest
from hypothesis import given, settings, strategies as st

from fusegrad.dtype import dtypes
from fusegrad.ir.alu import exec_alu
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite
from fusegrad.ir.symbolic import pm_symbolic, simplify

I32 = dtypes.int32


def c(v: int) -> UOp: return UOp.const(I32, v)
def cf(v: float) -> UOp: return UOp.const(dtypes.float32, v)


r4, r8, r10, r12 = UOp.range(4, 0), UOp.range(8, 1), UOp.range(10, 2), UOp.range(12, 3)
n = UOp.variable("n", -5, 5)  # a variable that can be negative (C division truncates toward zero)
# a float value the rules know nothing about
fload = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, dtypes.float32, (UOp(Ops.PARAM, dtypes.float32.ptr(4), (), 1), r4)),))


def evaluate(u: UOp, env: dict[UOp, int], memo: dict | None = None):
    """The value of an int/bool expression, leaves (RANGE, DEFINE_VAR) taken from env; ALU by the reference semantics."""
    memo = {} if memo is None else memo
    if u in memo: return memo[u]
    if u.op is Ops.CONST: ret = u.arg
    elif u.op in (Ops.RANGE, Ops.DEFINE_VAR): ret = env[u]
    elif u.op is Ops.CAST: ret = dtypes.as_const(evaluate(u.src[0], env, memo), u.dtype)
    else: ret = exec_alu(u.op, u.dtype, [evaluate(s, env, memo) for s in u.src])
    memo[u] = ret
    return ret


def leaves(u: UOp) -> list[UOp]:
    return sorted({x for x in u.toposort() if x.op in (Ops.RANGE, Ops.DEFINE_VAR)}, key=lambda x: str(x.arg))


def domain(x: UOp) -> range:
    return range(x.src[0].arg) if x.op is Ops.RANGE else range(x.arg[1], x.arg[2] + 1)


def assignments(*exprs: UOp):
    lv = sorted({x for e in exprs for x in leaves(e)}, key=lambda x: str(x.arg))
    for vals in itertools.product(*[domain(x) for x in lv]): yield dict(zip(lv, vals))


def assert_same_values(a: UOp, b: UOp) -> None:
    for env in assignments(a, b):
        assert evaluate(a, env) == evaluate(b, env), f"{a} != {b} at {({k.arg: v for k, v in env.items()})}"


# ----- constant folding -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("before,expected", [
    (c(3) + c(4), c(7)),
    (c(3) * c(-4), c(-12)),
    (c(7) // c(-2), c(-3)),              # C division truncates toward zero
    (c(-7) // c(2), c(-3)),
    (c(-7) % c(2), c(-1)),               # C remainder has the sign of the dividend
    (c(3).lt(c(4)), UOp.const(dtypes.bool, True)),
    (c(3).ne(c(3)), UOp.const(dtypes.bool, False)),
    (c(3).maximum(c(-9)), c(3)),
    (cf(1.5) * cf(2.0), cf(3.0)),
    ((c(2) + c(3)) * (c(10) // c(3)), c(15)),  # nested
])
def test_constant_folding(before, expected):
    assert simplify(before) is expected


def test_int_overflow_wraps_like_int32():
    assert simplify(c(2**31 - 1) + c(1)) is c(-2**31)


# ----- identities ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("before,expected", [
    (r4 * 1, r4),
    (r4 + 0, r4),
    (r4 * 0, c(0)),
    (c(0) * r4, c(0)),
    (r4 // 1, r4),
    (r4 % 1, c(0)),
    (n * 0, c(0)),
    (fload * cf(1.0), fload),
    (fload + cf(-0.0), fload),           # x + -0.0 is x for every float x (x + +0.0 is not: see below)
])
def test_identities(before, expected):
    assert simplify(before) is expected


def test_float_plus_positive_zero_is_not_folded():
    # -0.0 + 0.0 is +0.0 (IEEE, torch), so x + 0.0 -> x would keep a -0.0; ints still fold
    assert simplify(fload + cf(0.0)) is not fload
    assert simplify(cf(0.0) + fload) is not fload
    assert simplify(r4 + 0) is r4


def test_float_times_zero_is_not_folded():
    # NaN * 0 and inf * 0 are NaN: x*0 -> 0 is only legal for ints
    before = fload * cf(0.0)
    assert simplify(before) is before


# ----- division and modulo ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("before,expected", [
    ((r4 * 4) // 4, r4),                          # (x*c)//c -> x
    ((r4 * 12) // 4, r4 * 3),                     # (x*k*c)//c -> x*k
    ((r4 * 8 + r8) // 8, r4),                     # (a*N+b)//N -> a when 0 <= b < N
    ((r4 * 8 + r8) % 8, r8),                      # (a*N+b)%N -> b when 0 <= b < N
    ((r4 * 8 + r10) // 8, r4 + r10 // 8),         # b may reach N: keep b//N
    ((r4 * 8 + r10) % 8, r10 % 8),
    ((r4 * 8 + r8 + 16) // 8, r4 + 2),            # constants split into quotient and remainder
    (r8 // 8, c(0)),                              # 0 <= x < c: x//c -> 0
    (r8 % 8, r8),                                 # 0 <= x < c: x%c -> x
    ((r12 // 3) // 2, r12 // 6),                  # (x//a)//b -> x//(a*b)
    ((r12 % 4) % 2, r12 % 2),                     # (x%(k*c))%c -> x%c
    ((r4 * 4 + 2) // 8, (r4 * 2 + 1) // 4),       # common factors divide out
    ((r4 * 2) % 8, r4 * 2),                       # 0 <= 2*r4 <= 6 < 8
])
def test_div_mod(before, expected):
    assert simplify(before) is expected
    assert_same_values(before, expected)


@pytest.mark.parametrize("before", [
    (r4 * 8 - 1) // 8,        # the remainder can be negative: C truncation differs from floor
    (r4 * 8 - 1) % 8,
    (r12 % 6) % 4,            # 6 is not a multiple of 4: (7%6)%4 == 1 but 7%4 == 3
    n // 4,                   # n may be negative
    n % 4,
    (n * 4 + 1) // 4,
    (n + 5) // 5 * 5 + n % 5,
    (n // 2) % 3 * 2 + n % 2,  # n may be negative: C's % of a negative is negative
])
def test_div_mod_not_folded_when_unsafe(before):
    after = simplify(before)
    assert_same_values(before, after)


def test_mod_of_mod_not_multiple_is_kept():
    before = (r12 % 6) % 4
    assert simplify(before) is before


# ----- sums ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("before,expected", [
    ((r12 // 4) * 4 + r12 % 4, r12),                        # (x//c)*c + x%c -> x
    (r12 % 4 + (r12 // 4) * 4, r12),                        # in either order
    ((r12 % 4) * 3 + (r12 // 4) * 12, r12 * 3),             # times a common factor
    ((r12 // 2) % 3 * 2 + r12 % 2, r12 % 6),                 # ((x//c)%c2)*c + x%c -> x%(c*c2)
    ((r12 // 6) * 6 + (r12 // 2) % 3 * 2 + r12 % 2, r12),    # and on to x: an index split as (group, head, dim)
    (((r12 // 2) % 3) * 8 + (r12 % 2) * 4, (r12 % 6) * 4),   # times a common factor
    (r4 * 2 + r8 + r4 * 3 + 1 + 2, r4 * 5 + r8 + 3),        # like terms combine, constants go last
    (r4 + r4, r4 * 2),
    (r4 - r4, c(0)),
    (r4 + 3 - 3, r4),
    ((r4 + 3) * 2, r4 * 2 + 6),                             # (x+c)*c2 -> x*c2 + c*c2
    ((r4 * 3) * 2, r4 * 6),                                 # (x*c)*c2 -> x*(c*c2)
])
def test_sums(before, expected):
    assert simplify(before) is expected
    assert_same_values(before, expected)


# ----- comparisons and selection ---------------------------------------------------------------------------------------

T, F = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False)


@pytest.mark.parametrize("before,expected", [
    (r4.lt(4), T),                      # 0 <= r4 <= 3
    (r4.lt(100), T),
    (r4.lt(0), F),
    (c(-1).lt(r4), T),
    (r4.ne(5), T),
    (r4.ne(-1), T),
    ((r4 * 2).lt(5), r4.lt(3)),         # x*k < c -> x < ceil(c/k)
    ((r4 + 2).lt(3), r4.lt(1)),         # x+d < c -> x < c-d
    (c(1).lt(r4 + 1), c(0).lt(r4)),     # c < x+d -> c-d < x
    (r4.maximum(c(5)), c(5)),           # decided by bounds
    (r4.maximum(c(-1)), r4),
    (r4.lt(2).where(r8, r8), r8),       # where(c, x, x) -> x
    (T.where(r4, r8), r4),
    (F.where(r4, r8), r8),
])
def test_comparisons(before, expected):
    assert simplify(before) is expected


def test_undecided_comparison_is_kept():
    before = r4.lt(3)
    assert simplify(before) is before
    before = n.lt(0)
    assert simplify(before) is before


# ----- ranges ----------------------------------------------------------------------------------------------------------

def test_range_of_size_one_folds_to_zero():
    r1 = UOp.range(1, 9)
    assert graph_rewrite(r1, pm_symbolic) is c(0)
    assert simplify(r1 + r4) is r4
    assert simplify(r1 * 7 + r4) is r4
    assert simplify(r1) is c(0)


def test_range_of_larger_size_is_kept():
    assert simplify(r4) is r4
    assert simplify(r4 + 0) is r4


# ----- bounds ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("u,lo,hi", [
    (r4, 0, 3),
    (UOp.range(1, 9), 0, 0),
    (n, -5, 5),
    (c(7), 7, 7),
    (r4 + r8, 0, 10),
    (r4 + 5, 5, 8),
    (r4 * r8, 0, 21),
    (r4 * -2, -6, 0),
    (n * 3, -15, 15),
    (n * r4, -15, 15),
    (r12 // 3, 0, 3),
    (r12 // -3, -3, 0),
    (n // 2, -2, 2),
    (r12 % 5, 0, 4),
    (r4 % 8, 0, 3),                 # below the modulus: the bounds of x
    (n % 3, -2, 2),                 # C remainder follows the dividend's sign
    ((n - 5) % 3, -2, 0),
    (r4.maximum(n), 0, 5),
    (r4.lt(2), False, True),
    (r4.lt(4), True, True),
])
def test_bounds(u, lo, hi):
    assert (u.vmin, u.vmax) == (lo, hi)
    # and the bounds really bound the expression
    vals = [evaluate(u, env) for env in assignments(u)]
    assert lo <= min(vals) and max(vals) <= hi


def test_bounds_that_may_overflow_are_the_full_range():
    big = UOp.range(2**20, 0)
    assert (big * big).vmin_vmax == (dtypes.min(I32), dtypes.max(I32))


def test_cast_int_to_bool_is_not_folded_when_zero_is_possible():
    # bool(x) for x in [-1, 1] is False at 0: the cast must not fold to True
    for x in [UOp.variable("m", -1, 1), UOp.variable("m", -3, 0), UOp.variable("m", 0, 3)]:
        b = x.cast(dtypes.bool)
        assert b.vmin_vmax == (False, True), x.arg
        assert simplify(b) is b
    assert simplify(UOp.variable("m", 1, 3).cast(dtypes.bool)) is T
    assert simplify(UOp.variable("m", -3, -1).cast(dtypes.bool)) is T


def test_tensor_int_to_bool_cast():
    # end-to-end consequence of the bound above: a loaded int has the full int32 range, which includes 0
    from fusegrad import Tensor
    assert Tensor([0, 1, -1, 2]).bool().tolist() == [False, True, True, True]


# ----- property test: simplification preserves values ------------------------------------------------------------------

R_A, R_B, V = UOp.range(4, 10), UOp.range(6, 11), UOp.variable("v", -4, 4)
_leaf = st.one_of(st.sampled_from([R_A, R_B, V]), st.integers(-8, 8).map(c))


def _extend(kids):
    return st.one_of(
        st.tuples(kids, kids).map(lambda t: t[0] + t[1]),
        st.tuples(kids, kids).map(lambda t: t[0] * t[1]),
        st.tuples(kids, st.integers(-4, 4)).map(lambda t: t[0] * t[1]),
        st.tuples(kids, st.integers(-6, 6).filter(lambda d: d != 0)).map(lambda t: t[0] // t[1]),
        st.tuples(kids, st.integers(-6, 6).filter(lambda d: d != 0)).map(lambda t: t[0] % t[1]),
        st.tuples(kids, kids).map(lambda t: t[0].maximum(t[1])),
        st.tuples(kids, kids, kids, kids).map(lambda t: t[0].lt(t[1]).where(t[2], t[3])),
        st.tuples(kids, kids, kids, kids).map(lambda t: t[0].ne(t[1]).where(t[2], t[3])),
        st.tuples(kids, kids, kids).map(lambda t: t[0].cast(dtypes.bool).where(t[1], t[2])),  # nonzero test
        st.tuples(kids, kids).map(lambda t: t[0].lt(t[1]).cast(I32)),                        # bool -> 0/1
    )


int_exprs = st.recursive(_leaf, _extend, max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(int_exprs)
def test_simplify_preserves_values(e):
    s = simplify(e)
    assert s.dtype == e.dtype
    for env in itertools.product(range(4), range(6), range(-4, 5)):
        env_d = dict(zip([R_A, R_B, V], env))
        assert evaluate(s, env_d) == evaluate(e, env_d), f"{e} -> {s} at {env}"


@settings(max_examples=200, deadline=None)
@given(int_exprs)
def test_bounds_hold(e):
    lo, hi = e.vmin_vmax
    for env in itertools.product(range(4), range(6), range(-4, 5)):
        assert lo <= evaluate(e, dict(zip([R_A, R_B, V], env))) <= hi
