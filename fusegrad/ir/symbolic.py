"""Symbolic simplification of integer (index) arithmetic, written as rewrite rules.

`bounds(u)` gives the [vmin, vmax] of an int/bool expression from the bounds of its leaves (RANGE, DEFINE_VAR, ...);
the rules use it to drop mods, divs and comparisons that can't change a value. `pm_symbolic` is the rule table and
`simplify(u)` runs it. Every rule ends with its algebra as a comment.
"""
from __future__ import annotations

import functools
import math
import weakref
from typing import Any

from fusegrad.dtype import ConstType, dtypes
from fusegrad.ir.alu import cast_value, exec_alu
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import PatternMatcher, UPat, graph_rewrite

# ---------------------------------------------------------------------------------------------------------------------
# bounds


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def bounds(u: UOp) -> tuple[ConstType, ConstType]:
    """[vmin, vmax] of an int or bool expression (the dtype's range when nothing better is known)."""
    dt = u.dtype
    lo_d, hi_d = dtypes.min(dt.scalar()), dtypes.max(dt.scalar())
    if not (dtypes.is_int(dt) or dtypes.is_bool(dt)) or dt.count > 1: return lo_d, hi_d
    lo, hi = _bounds(u)
    if dtypes.is_bool(dt): return bool(lo), bool(hi)
    if lo < lo_d or hi > hi_d: return lo_d, hi_d  # may wrap: know nothing
    return lo, hi


def _bounds(u: UOp) -> tuple[Any, Any]:
    op, s = u.op, u.src
    full = dtypes.min(u.dtype.scalar()), dtypes.max(u.dtype.scalar())
    if op is Ops.CONST: return u.arg, u.arg
    if op in (Ops.RANGE, Ops.SPECIAL): return 0, max(int(s[0].vmax) - 1, 0)
    if op is Ops.DEFINE_VAR: return u.arg[1], u.arg[2]
    if op is Ops.BIND: return s[0].arg[1], s[0].arg[2]
    if op is Ops.ADD: return s[0].vmin + s[1].vmin, s[0].vmax + s[1].vmax
    if op is Ops.MUL:
        c = [a * b for a in (s[0].vmin, s[0].vmax) for b in (s[1].vmin, s[1].vmax)]
        return min(c), max(c)
    if op is Ops.IDIV and s[1].op is Ops.CONST and s[1].arg != 0:
        c = [_c_div(int(x), s[1].arg) for x in (s[0].vmin, s[0].vmax)]
        return min(c), max(c)
    if op is Ops.MOD and s[1].op is Ops.CONST and s[1].arg > 0:
        c, a = s[1].arg, s[0]
        if a.vmin >= 0: return (a.vmin, a.vmax) if a.vmax < c else (0, c - 1)
        return (-(c - 1), 0) if a.vmax <= 0 else (-(c - 1), c - 1)
    if op is Ops.MAX: return max(s[0].vmin, s[1].vmin), max(s[0].vmax, s[1].vmax)
    if op is Ops.CMPLT:
        if s[0].vmax < s[1].vmin: return True, True
        if s[0].vmin >= s[1].vmax: return False, False
        return False, True
    if op is Ops.CMPNE:
        if s[0].vmax < s[1].vmin or s[0].vmin > s[1].vmax: return True, True
        if s[0].vmin == s[0].vmax == s[1].vmin == s[1].vmax: return False, False
        return False, True
    if op is Ops.AND and dtypes.is_bool(u.dtype): return s[0].vmin and s[1].vmin, s[0].vmax and s[1].vmax
    if op is Ops.OR and dtypes.is_bool(u.dtype): return s[0].vmin or s[1].vmin, s[0].vmax or s[1].vmax
    if op is Ops.AND and s[1].op is Ops.CONST and s[1].arg >= 0 and s[0].vmin >= 0: return 0, min(s[1].arg, s[0].vmax)
    if op is Ops.SHR and s[1].op is Ops.CONST and s[0].vmin >= 0: return s[0].vmin >> s[1].arg, s[0].vmax >> s[1].arg
    if op is Ops.SHL and s[1].op is Ops.CONST and s[0].vmin >= 0: return s[0].vmin << s[1].arg, s[0].vmax << s[1].arg
    if op is Ops.WHERE:
        if s[0].vmin == s[0].vmax: return (s[1].vmin, s[1].vmax) if s[0].vmin else (s[2].vmin, s[2].vmax)
        return min(s[1].vmin, s[2].vmin), max(s[1].vmax, s[2].vmax)
    if op is Ops.CAST and (dtypes.is_int(s[0].dtype) or dtypes.is_bool(s[0].dtype)):
        lo, hi = int(s[0].vmin), int(s[0].vmax)
        if dtypes.is_bool(u.dtype): return (lo > 0 or hi < 0), (lo != 0 or hi != 0)  # True unless 0 is possible
        return lo, hi
    return full


# ---------------------------------------------------------------------------------------------------------------------
# helpers for the rules

def _is_int(u: UOp) -> bool: return dtypes.is_int(u.dtype) and u.dtype.count == 1


def _no_wrap(u: UOp) -> bool:
    """Whether the int expression `u` can't overflow its dtype, so its value is the exact integer. Sums and products
    reassociate under wraparound too, but division, modulo and comparisons don't: (int8 x * 100) < 1 is not x < 1."""
    lo, hi = _bounds(u)
    return dtypes.min(u.dtype.scalar()) <= lo and hi <= dtypes.max(u.dtype.scalar())


def split_terms(u: UOp) -> tuple[dict[UOp, int], int]:
    """x*3 + y + 5 -> ({x: 3, y: 1}, 5): an integer sum as term -> coefficient plus a constant."""
    terms: dict[UOp, int] = {}
    const = 0
    stack = [(u, 1)]
    while stack:
        x, k = stack.pop()
        if x.op is Ops.ADD:
            stack.extend((s, k) for s in reversed(x.src))
        elif x.op is Ops.CONST:
            const += k * x.arg
        elif x.op is Ops.MUL and x.src[1].op is Ops.CONST:
            stack.append((x.src[0], k * x.src[1].arg))
        elif x.op is Ops.MUL and x.src[0].op is Ops.CONST:
            stack.append((x.src[1], k * x.src[0].arg))
        else:
            terms[x] = terms.get(x, 0) + k
    return {t: c for t, c in terms.items() if c != 0}, const


def build_sum(terms: dict[UOp, int], const: int, dtype: Any) -> UOp:
    """The inverse of split_terms: terms in a stable order, the constant last."""
    out: UOp | None = None
    for t, c in terms.items():
        term = t if c == 1 else UOp(Ops.MUL, dtype, (t, UOp.const(dtype, c)))
        out = term if out is None else UOp(Ops.ADD, dtype, (out, term))
    if out is None: return UOp.const(dtype, const)
    return out if const == 0 else UOp(Ops.ADD, dtype, (out, UOp.const(dtype, const)))


_order_keys: "weakref.WeakKeyDictionary[UOp, tuple]" = weakref.WeakKeyDictionary()
_range_free: "weakref.WeakKeyDictionary[UOp, bool]" = weakref.WeakKeyDictionary()


def _memo_walk(u: UOp, memo: Any, fn: Any) -> Any:
    """fn(node) for u and every node under it not in memo yet, children first (iterative: a deep chain doesn't
    recurse); fn reads its children's results from memo."""
    if (r := memo.get(u)) is not None: return r
    for n in u.toposort(gate=lambda n: n not in memo):
        if n not in memo: memo[n] = fn(n)
    return memo[u]


def order_key(u: UOp) -> tuple:
    """A total order on expressions, used to put the operands of sums and products of sizes in one canonical order
    (variables by name), so `i + j` and `j + i` simplify to the same node."""
    return _memo_walk(u, _order_keys, lambda n: (n.op.value, repr(n.arg), tuple(_order_keys[s] for s in n.src)))


def range_free(u: UOp) -> bool:
    """Whether `u` is a size expression (no loop index in it). Only those are reordered: index math keeps the order
    that codegen built it in."""
    return _memo_walk(u, _range_free,
                      lambda n: n.op not in (Ops.RANGE, Ops.SPECIAL) and all(_range_free[s] for s in n.src))


def fold_sum(x: UOp) -> UOp | None:
    """Combine like terms of an integer sum and fold (a//c)*c + a%c -> a and ((a//c)%c2)*c + a%c -> a%(c*c2); rebuild
    it in canonical order."""
    if not _is_int(x): return None
    terms, const = split_terms(x)
    if range_free(x): terms = dict(sorted(terms.items(), key=lambda tc: order_key(tc[0])))
    # (a//c)*(k*c) + a%c*k -> a*k
    changed = True
    while changed:
        changed = False
        for t, k in list(terms.items()):
            if t.op is Ops.MOD and t.src[1].op is Ops.CONST and t in terms and t.src[0].vmin >= 0:
                a, c = t.src[0], t.src[1].arg
                d = UOp(Ops.IDIV, x.dtype, (a, t.src[1]))
                if terms.get(d, 0) == k * c:
                    del terms[t], terms[d]
                    terms[a] = terms.get(a, 0) + k
                    terms = {tt: cc for tt, cc in terms.items() if cc != 0}
                    changed = True
                    break
                # ((a//c) % c2)*(k*c) + (a%c)*k -> (a % (c*c2))*k (a >= 0): a head index split as (group, head, dim)
                outer = next((u for u, kk in terms.items() if kk == k * c and u.op is Ops.MOD and
                              u.src[1].op is Ops.CONST and u.src[1].arg > 0 and u.src[0] is d), None)
                if outer is not None:
                    del terms[t], terms[outer]
                    m = UOp(Ops.MOD, x.dtype, (a, UOp.const(x.dtype, c * outer.src[1].arg)))
                    terms[m] = terms.get(m, 0) + k
                    terms = {tt: cc for tt, cc in terms.items() if cc != 0}
                    changed = True
                    break
    ret = build_sum(terms, const, x.dtype)
    return ret if ret is not x else None


def fold_prod(x: UOp) -> UOp | None:
    """A product of sizes in canonical order, constant last: j*(i*2) -> (i*j)*2 (so i*j and j*i are one node)."""
    if not _is_int(x) or not range_free(x): return None
    factors, const, stack = [], 1, [x]
    while stack:
        f = stack.pop()
        if f.op is Ops.MUL: stack.extend(f.src)
        elif f.op is Ops.CONST: const *= f.arg
        else: factors.append(f)
    if len(factors) < 2: return None   # x*c: the sum rules own it
    if const == 0: return UOp.const(x.dtype, 0)
    if any(f.op is Ops.ADD for f in factors): return _distribute(factors, const, x.dtype)
    out = _monomial(factors, x.dtype)
    if const != 1: out = UOp(Ops.MUL, x.dtype, (out, UOp.const(x.dtype, const)))
    return out if out is not x else None


def _monomial(factors: list[UOp], dtype: Any) -> UOp:
    """A product of non-constant factors in canonical order."""
    fs = sorted(factors, key=order_key)
    out = fs[0]
    for f in fs[1:]: out = UOp(Ops.MUL, dtype, (out, f))
    return out


def _distribute(factors: list[UOp], const: int, dtype: Any, limit: int = 32) -> UOp | None:
    """A product of sums of sizes multiplied out into a sum of monomials, i*(j+1) -> i*j + i, so that polynomials in
    the variables have one normal form (None past `limit` terms: the product stays as it is)."""
    expanded: list[tuple[tuple[UOp, ...], int]] = [((), const)]
    for f in factors:
        terms, c = split_terms(f) if f.op is Ops.ADD else ({f: 1}, 0)
        parts = list(terms.items()) + ([(None, c)] if c else [])
        expanded = [(m + ((t,) if t is not None else ()), k * kt) for m, k in expanded for t, kt in parts]
        if len(expanded) > limit: return None
    out: dict[UOp, int] = {}
    total = 0
    for m, k in expanded:
        if not m: total += k
        else:
            mono = _monomial(list(m), dtype)
            out[mono] = out.get(mono, 0) + k
    return build_sum({t: k for t, k in out.items() if k}, total, dtype)


def div_mod_fold(x: UOp, c: int, is_mod: bool, dtype: Any) -> UOp | None:
    """(q*c + r) // c -> q + r//c and (q*c + r) % c -> r % c, valid when x >= 0 and r >= 0; also divides out gcds."""
    if c <= 0 or x.vmin < 0: return None
    terms, const = split_terms(x)
    # first try reducing every coefficient mod c: (13*a + b) % 12 -> a + b when that sum stays below 12
    if any(k % c != k for k in terms.values()) and all(t.vmin >= 0 for t in terms):
        q_all = {t: k // c for t, k in terms.items() if k // c}
        r_all = {t: k % c for t, k in terms.items() if k % c}
        r = build_sum(r_all, const % c, dtype)
        if r.vmin >= 0 and r.vmax < c:
            return r if is_mod else build_sum(q_all, const // c, dtype)
    quot: dict[UOp, int] = {}
    rem: dict[UOp, int] = {}
    for t, k in terms.items():
        if k % c == 0: quot[t] = k // c
        else: rem[t] = k
    qc, rc = const // c, const % c
    r = build_sum(rem, rc, dtype)
    if r.vmin < 0: return None
    if not is_mod:
        # gcd trick: (4*a + 2) // 8 -> (2*a + 1) // 4
        g = math.gcd(c, rc, *rem.values()) if rem or rc else c
        if g > 1 and not quot and qc == 0 and g != c:
            return UOp(Ops.IDIV, dtype, (build_sum({t: k // g for t, k in rem.items()}, rc // g, dtype),
                                         UOp.const(dtype, c // g)))
        if not quot and qc == 0:
            return UOp.const(dtype, 0) if r.vmax < c else None
        q = build_sum(quot, qc, dtype)
        if r.vmax < c: return q
        return UOp(Ops.ADD, dtype, (q, UOp(Ops.IDIV, dtype, (r, UOp.const(dtype, c)))))
    if r.vmax < c: return r
    if not quot and qc == 0:
        g = math.gcd(c, rc, *rem.values())
        if g > 1 and g != c:  # (2*a) % 8 -> ((a % 4) * 2)
            inner = UOp(Ops.MOD, dtype, (build_sum({t: k // g for t, k in rem.items()}, rc // g, dtype),
                                         UOp.const(dtype, c // g)))
            return UOp(Ops.MUL, dtype, (inner, UOp.const(dtype, g)))
        return None
    return UOp(Ops.MOD, dtype, (r, UOp.const(dtype, c)))


def const_fold(x: UOp) -> UOp | None:
    if not all(s.op is Ops.CONST for s in x.src): return None
    if x.op is Ops.CAST: return UOp.const(x.dtype, cast_value(x.src[0].arg, x.dtype))
    try: val = exec_alu(x.op, x.dtype, [s.arg for s in x.src])
    except (ZeroDivisionError, ValueError, OverflowError): return None
    return UOp.const(x.dtype, val)


def bounds_fold(x: UOp) -> UOp | None:
    if x.op is Ops.CONST or not (dtypes.is_int(x.dtype) or dtypes.is_bool(x.dtype)) or x.dtype.count > 1: return None
    lo, hi = x.vmin_vmax
    return UOp.const(x.dtype, lo) if lo == hi else None


def _lt_fold(x: UOp, c: UOp) -> UOp | None:
    """x*k + d < c -> x < ceil((c - d)/k) for k > 0 (ints)."""
    if not _is_int(x) or not _no_wrap(x): return None
    terms, const = split_terms(x)
    if len(terms) != 1: return (x - const).lt(c.arg - const) if const else None
    (t, k), = terms.items()
    if k <= 0 or (k == 1 and const == 0): return None
    return UOp(Ops.CMPLT, dtypes.bool, (t, UOp.const(t.dtype, -((const - c.arg) // k))))


def _gt_fold(c: UOp, x: UOp) -> UOp | None:
    """c < x + d -> c - d < x (ints)."""
    if not _is_int(x) or x.op is not Ops.ADD or x.src[1].op is not Ops.CONST or not _no_wrap(x): return None
    return UOp(Ops.CMPLT, dtypes.bool, (UOp.const(x.dtype, c.arg - x.src[1].arg), x.src[0]))


def _add_zero(x: UOp, c: UOp) -> UOp | None:
    """x + 0 -> x, for floats only when the zero is -0.0: x + +0.0 is +0.0 for x = -0.0 (IEEE, and torch), so folding
    it would turn -0.0 + 0.0 (and 0.0 - x at x = +0.0, built as 0.0 + -x) into -0.0."""
    if isinstance(c.arg, tuple) or c.arg != 0: return None
    if dtypes.is_float(c.dtype) and not math.copysign(1.0, c.arg) < 0: return None
    return x


x_, y_, c_, c2_ = UPat.var("x"), UPat.var("y"), UPat.cvar("c"), UPat.cvar("c2")

pm_symbolic = PatternMatcher([
    # constant folding and folding by bounds
    (UPat(GroupOp.ALU | {Ops.CAST}, name="x", src=UPat(Ops.CONST)), const_fold),  # op(c1, c2) -> c3
    (UPat(GroupOp.ALU | {Ops.CAST, Ops.RANGE, Ops.SPECIAL}, name="x"), bounds_fold),  # vmin == vmax -> const
    # identities
    (x_ + c_, _add_zero),                                                             # x+0 -> x (floats: x+-0.0)
    (x_ * 1, lambda x: x),                                                            # x*1 -> x
    (x_ * 0, lambda x: UOp.const(x.dtype, 0) if _is_int(x) else None),               # x*0 -> 0 (ints only: NaN*0)
    (x_ // 1, lambda x: x),                                                           # x//1 -> x
    (x_ % 1, lambda x: UOp.const(x.dtype, 0)),                                        # x%1 -> 0
    (UPat(Ops.XOR, src=[x_, UPat.const(None, 0)]), lambda x: x),                      # x^0 -> x
    (UPat(Ops.OR, src=[x_, UPat.const(None, 0)]), lambda x: x),                       # x|0 -> x
    (UPat(Ops.AND, dtype=dtypes.bool, src=[x_, UPat.const(dtypes.bool, True)]), lambda x: x),   # x&True -> x
    (UPat(Ops.AND, dtype=dtypes.bool, src=[x_, UPat.const(dtypes.bool, False)]),
     lambda x: UOp.const(dtypes.bool, False)),                                        # x&False -> False
    (UPat(Ops.OR, dtype=dtypes.bool, src=[x_, UPat.const(dtypes.bool, False)]), lambda x: x),   # x|False -> x
    (UPat((Ops.AND, Ops.OR, Ops.MAX), src=(x_, x_)), lambda x: x),                   # x&x -> x, max(x,x) -> x
    (UPat(Ops.WHERE, src=(UPat.var(), x_, x_)), lambda x: x),                         # where(c, x, x) -> x
    (UPat(Ops.WHERE, src=(c_, x_, y_)), lambda c, x, y: x if c.arg else y),           # where(True, x, y) -> x
    (UPat(Ops.MAX, src=[x_, y_]), lambda x, y: x if _is_int(x) and x.vmin >= y.vmax else None),  # max(x,y) -> x if x>=y
    # integer sums: combine like terms and reassociate constants
    (UPat(Ops.ADD, name="x"), fold_sum),                                              # x*2+y+x*3+1+2 -> x*5+y+3
    (UPat(Ops.MUL, name="x"), fold_prod),                                              # j*(i*2) -> (i*j)*2
    ((x_ + c_) * c2_, lambda x, c, c2: x * c2.arg + c.arg * c2.arg if _is_int(x) else None),  # (x+c)*c2 -> x*c2+c*c2
    ((x_ * c_) * c2_, lambda x, c, c2: x * (c.arg * c2.arg) if _is_int(x) else None),  # (x*c)*c2 -> x*(c*c2)
    # division and modulo by constants
    (UPat(Ops.IDIV, src=(x_, c_)), lambda x, c: div_mod_fold(x, c.arg, False, x.dtype) if _is_int(x) and _no_wrap(x)
     else None),
    (UPat(Ops.MOD, src=(x_, c_)), lambda x, c: div_mod_fold(x, c.arg, True, x.dtype) if _is_int(x) and _no_wrap(x)
     else None),
    ((x_ // c_) // c2_, lambda x, c, c2: x // (c.arg * c2.arg)
     if _is_int(x) and x.vmin >= 0 and c.arg > 0 and c2.arg > 0 else None),           # (x//a)//b -> x//(a*b)
    ((x_ % c_) % c2_, lambda x, c, c2: x % c2.arg
     if _is_int(x) and x.vmin >= 0 and c2.arg > 0 and c.arg % c2.arg == 0 else None),  # (x%(k*c))%c -> x%c
    # comparisons
    (UPat(Ops.CMPLT, src=(x_, c_)), _lt_fold),                                        # x*k+d < c -> x < ceil((c-d)/k)
    (UPat(Ops.CMPLT, src=(c_, x_)), _gt_fold),                                        # c < x+d -> c-d < x
])


@functools.lru_cache(maxsize=1 << 16)
def simplify(u: UOp) -> UOp:
    """Run the symbolic rules to a fixed point (memoized: nodes are immutable, so the answer never changes)."""
    if u.op is Ops.CONST or (u.op is Ops.RANGE and u.vmax != 0): return u
    return graph_rewrite(u, pm_symbolic, name="symbolic")
