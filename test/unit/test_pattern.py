"""UPat matching, PatternMatcher rule tables and the graph_rewrite engine."""
import os
import sys

import pytest

from fusegrad.dtype import dtypes
from fusegrad.ir import pattern
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import PatternMatcher, UPat, graph_rewrite, substitute, substitute_each
from fusegrad.ir.symbolic import pm_symbolic

I32 = dtypes.int32
r0, r1 = UOp.range(4, 0), UOp.range(8, 1)
c1, c2 = UOp.const(I32, 1), UOp.const(I32, 2)
fparam = UOp(Ops.PARAM, dtypes.float32.ptr(8), (), 1)


def matches(p: UPat, u: UOp) -> list[dict]:
    return p.match(u, {})


# ----- UPat ------------------------------------------------------------------------------------------------------------

def test_op_and_arg_filters():
    assert matches(UPat(Ops.RANGE), r0)
    assert not matches(UPat(Ops.CONST), r0)
    assert matches(UPat((Ops.CONST, Ops.RANGE)), r0)
    assert matches(UPat(Ops.CONST, arg=1), c1)
    assert not matches(UPat(Ops.CONST, arg=2), c1)
    assert matches(UPat(), r0)  # no constraint at all


def test_ordered_src():
    p = UPat(Ops.ADD, src=(UPat(Ops.RANGE, name="r"), UPat(Ops.CONST, name="c")))
    assert matches(p, r0 + c1) == [{"r": r0, "c": c1}]
    assert not matches(p, UOp(Ops.ADD, I32, (c1, r0)))  # a tuple is order-sensitive


def test_commutative_list_src_matches_either_order():
    p = UPat(Ops.ADD, src=[UPat(Ops.RANGE, name="r"), UPat(Ops.CONST, name="c")])
    assert matches(p, r0 + c1) == [{"r": r0, "c": c1}]
    assert matches(p, UOp(Ops.ADD, I32, (c1, r0))) == [{"r": r0, "c": c1}]
    assert not matches(p, r0 + r1)


def test_commutative_list_yields_every_binding():
    p = UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")])
    got = matches(p, r0 + r1)
    assert {"x": r0, "y": r1} in got and {"x": r1, "y": r0} in got


def test_single_upat_src_matches_every_source():
    p = UPat(Ops.ADD, src=UPat(Ops.CONST))
    assert matches(p, UOp(Ops.ADD, I32, (c1, c2)))
    assert not matches(p, r0 + c1)


def test_repeated_name_binds_the_same_node():
    p = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
    assert matches(p, r0 + r0) == [{"x": r0}]
    assert not matches(p, r0 + r1)
    # also across nesting levels
    q = UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar())), UPat.var("x")))
    assert matches(q, (r0 + 1) * r0)
    assert not matches(q, (r0 + 1) * r1)


def test_dtype_filter():
    f = UOp.const(dtypes.float32, 1.0)
    assert matches(UPat(dtype=dtypes.float32), f)
    assert not matches(UPat(dtype=dtypes.float32), c1)
    assert matches(UPat(dtype=(dtypes.float32, dtypes.int32)), c1)
    assert matches(UPat.cvar("c", dtype=I32), c1)
    assert not matches(UPat.cvar("c", dtype=dtypes.float32), c1)
    # a vector dtype matches a pattern for its scalar
    v = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (f, f))
    assert matches(UPat(Ops.VECTORIZE, dtype=dtypes.float32), v)


def test_allow_any_len():
    idx2 = UOp(Ops.INDEX, dtypes.float32, (fparam, r0))
    idx3 = UOp(Ops.INDEX, dtypes.float32, (fparam, r0, r0.lt(2)))
    strict = UPat(Ops.INDEX, src=(UPat(Ops.PARAM), UPat.var("i")))
    loose = UPat(Ops.INDEX, src=(UPat(Ops.PARAM), UPat.var("i")), allow_any_len=True)
    assert matches(strict, idx2) and not matches(strict, idx3)
    assert matches(loose, idx2) and matches(loose, idx3)
    # allow_any_len still needs at least the listed sources
    assert not matches(UPat(Ops.INDEX, src=(UPat(), UPat(), UPat(), UPat()), allow_any_len=True), idx3)


def test_arithmetic_sugar():
    p = UPat.var("x") * UPat.cvar("c") + UPat.var("y")
    assert matches(p, r1 + r0 * 4)  # ADD and MUL are commutative: any order
    assert not matches(UPat.var("x") // UPat.cvar("c"), UOp(Ops.IDIV, I32, (c1, r0)))  # IDIV is not


# ----- PatternMatcher --------------------------------------------------------------------------------------------------

def test_first_matching_rule_wins():
    pm = PatternMatcher([
        (UPat(Ops.ADD, name="x"), lambda x: c1),
        (UPat(Ops.ADD, name="x"), lambda x: c2),
    ])
    assert pm.rewrite(r0 + r1) is c1
    assert (pm + PatternMatcher([(UPat(Ops.RANGE), lambda: c2)])).rewrite(r0) is c2  # `+` appends
    swapped = PatternMatcher(pm.rules[::-1])
    assert swapped.rewrite(r0 + r1) is c2


def test_rule_returning_none_falls_through():
    pm = PatternMatcher([
        (UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")]), lambda x, y: x if x.op is Ops.CONST else None),
        (UPat(Ops.ADD), lambda: c2),
    ])
    assert pm.rewrite(UOp(Ops.ADD, I32, (r0, c1))) is c1  # the second binding (x=c1) of the first rule fires
    assert pm.rewrite(r0 + r1) is c2                       # first rule always None: next rule
    assert pm.rewrite(r0) is None                          # nothing for RANGE


def test_rule_returning_the_same_node_is_no_change():
    pm = PatternMatcher([(UPat(Ops.ADD, name="x"), lambda x: x)])
    assert pm.rewrite(r0 + r1) is None
    assert graph_rewrite(r0 + r1, pm) is r0 + r1


def test_ctx_is_passed_to_rules_that_ask_for_it():
    seen = []
    pm = PatternMatcher([
        (UPat(Ops.RANGE, name="r"), lambda ctx, r: ctx.append(r.arg[0])),
        (UPat(Ops.CONST, name="c"), lambda c: None),  # no ctx parameter: called without it
    ])
    graph_rewrite(r0 + r1 + 3, pm, ctx=seen)
    assert sorted(seen) == [0, 1]


# ----- graph_rewrite ---------------------------------------------------------------------------------------------------

def _countdown(c):
    return UOp.const(c.dtype, c.arg - 1) if c.arg > 0 else None


def test_rewrites_to_a_fixed_point():
    pm = PatternMatcher([(UPat(Ops.CONST, name="c"), _countdown)])
    assert graph_rewrite(UOp.const(I32, 10), pm) is UOp.const(I32, 0)
    # every constant in the graph counts down, including the RANGE's size: parents are rebuilt on the new sources
    assert graph_rewrite(r0 + 10, pm) is UOp.range(0, 0) + 0


def test_replacements_are_rewritten_again_and_parents_rebuilt():
    # MUL(x, 2) -> ADD(x, x); ADD(x, x) -> SHL(x, 1): the rule's output is itself rewritten
    pm = PatternMatcher([
        (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 2))), lambda x: UOp(Ops.ADD, x.dtype, (x, x))),
        (UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: UOp(Ops.SHL, x.dtype, (x, UOp.const(x.dtype, 1)))),
    ])
    out = graph_rewrite((r0 * 2).lt(5), pm)
    assert out is UOp(Ops.SHL, I32, (r0, c1)).lt(5)


def test_symbolic_pass_simplifies_whole_graph():
    expr = ((r0 * 8 + r1) // 8) * 2 + ((r0 * 8 + r1) % 8) * 0
    assert graph_rewrite(expr, pm_symbolic) is r0 * 2


def test_bottom_up_applies_rules_to_parents_first():
    def rules(log):
        return PatternMatcher([
            (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), lambda x: (log.append("double"), x)[1]),
            (UPat(Ops.NEG, src=(UPat.cvar("c"),)), lambda c: (log.append("const"), UOp.const(c.dtype, -c.arg))[1]),
        ])
    f = UOp.const(dtypes.float32, 5.0)
    g = UOp(Ops.NEG, dtypes.float32, (UOp(Ops.NEG, dtypes.float32, (f,)),))
    log_td, log_bu = [], []
    assert graph_rewrite(g, rules(log_td)) is f
    assert graph_rewrite(g, rules(log_bu), bottom_up=True) is f
    assert log_td == ["const", "const"]   # sources first: the inner NEG folds, then the outer
    assert log_bu == ["double"]           # parent first: the double negation goes in one step


def test_bottom_up_rewrites_sources_of_the_result():
    pm = PatternMatcher([(UPat(Ops.CONST, name="c"), _countdown)])
    assert graph_rewrite(r0 + 3, pm, bottom_up=True) is UOp.range(0, 0) + 0


def test_deep_chain_does_not_recurse():
    n = 5000
    x = r0
    for _ in range(n): x = x + 1
    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(I32, 1))), lambda x: x + 2)])
    limit = sys.getrecursionlimit()
    out = graph_rewrite(x, pm)
    assert sys.getrecursionlimit() == limit
    depth, y = 0, out
    while y.op is Ops.ADD:
        assert y.src[1] is c2
        y, depth = y.src[0], depth + 1
    assert depth == n and y is r0
    out_bu = graph_rewrite(x, pm, bottom_up=True)
    assert out_bu is out
    assert len(out.toposort()) == n + 3  # n ADDs, r0, its size, the constant 2
    assert substitute(out, {r0: r1}).src[1] is c2


def test_infinite_rewrite_is_reported():
    # x -> x+0 -> x+0+0 ... never stops
    pm = PatternMatcher([(UPat(Ops.RANGE, name="r"), lambda r: UOp(Ops.ADD, I32, (r, UOp.const(I32, 0))))])
    old = pattern.REWRITE_LIMIT
    pattern.REWRITE_LIMIT = 10_000
    try:
        with pytest.raises(RuntimeError):
            graph_rewrite(r0, pm, name="loop")
    finally:
        pattern.REWRITE_LIMIT = old


# ----- rule locations and traces ---------------------------------------------------------------------------------------

def test_rule_location_points_at_the_pattern():
    line = sys._getframe().f_lineno + 1
    p = UPat(Ops.ADD, name="x")
    sugar = UPat.var("x") + UPat.cvar("c")  # built inside pattern.py's helpers, but written here
    pm = PatternMatcher([(p, lambda x: None)])
    for loc in (p.location, sugar.location, pm.rules[0].location):
        assert os.path.basename(loc[0]) == "test_pattern.py"
    assert p.location[1] == line and sugar.location[1] == line + 1


def test_symbolic_rule_locations_point_into_symbolic_py():
    import fusegrad.ir.symbolic as sym
    path = os.path.abspath(sym.__file__)
    lines = open(path).read().splitlines()
    for rule in pm_symbolic.rules:
        assert os.path.basename(rule.location[0]) == "symbolic.py"
        src_line = lines[rule.location[1] - 1]
        assert "UPat" in src_line or "x_" in src_line, (rule, src_line)


def test_rewrite_traces_record_a_pass(monkeypatch):
    traces = []
    monkeypatch.setattr(pattern, "rewrite_traces", traces)
    line = sys._getframe().f_lineno + 1
    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(I32, 1))), lambda x: x)])
    before = (r0 * 1) + (r1 * 1)
    out = graph_rewrite(before, pm, name="drop ones")
    assert out is r0 + r1
    assert len(traces) == 1
    tr = traces[0]
    assert tr.name == "drop ones" and tr.before is before and tr.after is out
    assert [(m[1], m[2]) for m in tr.matches] == [(r0 * 1, r0), (r1 * 1, r1)]
    assert all(os.path.basename(m[0][0]) == "test_pattern.py" and m[0][1] == line for m in tr.matches)


def test_rewrite_traces_off_by_default():
    assert pattern.rewrite_traces is None
    graph_rewrite(r0 * 1, pm_symbolic)
    assert pattern.rewrite_traces is None


def test_substitute_each_is_substitute_per_value():
    """substitute_each(root, old, news) gives substitute(root, {old: new}) for each new: the same (hash-consed) nodes,
    root itself where it doesn't depend on old, and the replacement where root is old."""
    r, s = UOp.range(8, 0), UOp.range(4, 1)
    free = s * 3 + 1                                   # doesn't depend on r
    root = UOp(Ops.SINK, dtypes.void, ((r * 4 + free) // 2, free, r))
    news = [UOp.range(2, 2) * 4 + i for i in range(4)]
    assert substitute_each(root, r, news) == [substitute(root, {r: n}) for n in news]
    assert substitute_each(free, r, news) == [free] * 4
    assert substitute_each(r, r, news) == news
