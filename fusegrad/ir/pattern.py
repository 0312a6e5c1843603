"""The one rewrite engine: `UPat` patterns, `PatternMatcher` rule tables and `graph_rewrite` named passes.

A rule is `(UPat, fn)`: when the pattern matches a node, `fn(**captures)` (plus `ctx=` if it takes one) returns the
replacement node, or None for "no change". Each rule remembers the file:line where its pattern was written, so DEBUG and
VIZ can say which rule changed a node.
"""
from __future__ import annotations

import inspect
import itertools
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from fusegrad.dtype import DType
from fusegrad.ir.ops import GroupOp, Ops, UOp

_ANY = object()  # sentinel: arg not constrained
_THIS_FILE = os.path.abspath(__file__)


def _caller_location() -> tuple[str, int]:
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename) == _THIS_FILE: f = f.f_back  # type: ignore
    if f is None: return ("?", 0)
    return (os.path.relpath(f.f_code.co_filename, os.path.dirname(os.path.dirname(_THIS_FILE))), f.f_lineno)


class UPat:
    """A structural pattern over UOps.

    `src` as a tuple matches sources in order; as a list, in any order (for commutative ops); as a single UPat, every
    source. `name` binds the matched node; a name used twice must bind the same node.
    """
    __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len", "location")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                 src: "tuple[UPat, ...] | list[UPat] | UPat | None" = None, arg: Any = _ANY, name: str | None = None,
                 allow_any_len: bool = False):
        self.op = None if op is None else (frozenset([op]) if isinstance(op, Ops) else frozenset(op))
        self.dtype = None if dtype is None else (frozenset([dtype]) if isinstance(dtype, DType) else frozenset(dtype))
        self.src, self.arg, self.name, self.allow_any_len = src, arg, name, allow_any_len
        self.location = _caller_location()

    # ----- constructors -----
    @staticmethod
    def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> "UPat":
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> "UPat":
        return UPat(Ops.CONST, dtype=dtype, name=name)

    @staticmethod
    def const(dtype: DType | Iterable[DType] | None, value: Any) -> "UPat":
        return UPat(Ops.CONST, dtype=dtype, arg=value)

    # ----- arithmetic sugar: UPat.var("x") * UPat.cvar("c") -----
    def _alu(self, op: Ops, *others: "UPat | int | float") -> "UPat":
        srcs = [self] + [o if isinstance(o, UPat) else UPat(Ops.CONST, arg=o) for o in others]
        return UPat(op, src=srcs if op in GroupOp.Commutative else tuple(srcs))

    def __add__(self, x: "UPat | int | float") -> "UPat": return self._alu(Ops.ADD, x)
    def __mul__(self, x: "UPat | int | float") -> "UPat": return self._alu(Ops.MUL, x)
    def __floordiv__(self, x: "UPat | int | float") -> "UPat": return self._alu(Ops.IDIV, x)
    def __mod__(self, x: "UPat | int | float") -> "UPat": return self._alu(Ops.MOD, x)
    def lt(self, x: "UPat | int | float") -> "UPat": return self._alu(Ops.CMPLT, x)
    def ne(self, x: "UPat | int | float") -> "UPat": return self._alu(Ops.CMPNE, x)
    def maximum(self, x: "UPat | int | float") -> "UPat": return self._alu(Ops.MAX, x)
    def named(self, name: str) -> "UPat":
        self.name = name
        return self

    def __repr__(self) -> str:
        ops = "any" if self.op is None else "|".join(sorted(o.name for o in self.op))
        return f"UPat({ops}{', name=' + self.name if self.name else ''})"

    # ----- matching -----
    def match(self, u: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
        """All ways `u` matches, each as a dict of captures (empty list: no match)."""
        if self.op is not None and u.op not in self.op: return []
        if self.dtype is not None and u.dtype not in self.dtype and u.dtype.scalar() not in self.dtype: return []
        if self.arg is not _ANY and u.arg != self.arg: return []
        if self.name is not None:
            if self.name in store:
                if store[self.name] is not u: return []
            else:
                store = {**store, self.name: u}
        if self.src is None: return [store]
        if isinstance(self.src, UPat):
            stores = [store]
            for s in u.src:
                stores = [m for st in stores for m in self.src.match(s, st)]
                if not stores: return []
            return stores
        pats: list[tuple[UPat, ...]] = list(itertools.permutations(self.src)) if isinstance(self.src, list) \
            else [self.src]
        out: list[dict[str, UOp]] = []
        for perm in pats:
            if len(perm) != len(u.src) and not (self.allow_any_len and len(perm) <= len(u.src)): continue
            stores = [store]
            for p, s in zip(perm, u.src):
                stores = [m for st in stores for m in p.match(s, st)]
                if not stores: break
            out.extend(stores)
        return out


@dataclass
class Rule:
    pat: UPat
    fn: Callable[..., UOp | None]
    takes_ctx: bool
    location: tuple[str, int]

    def __repr__(self) -> str: return f"Rule({self.location[0]}:{self.location[1]})"


class PatternMatcher:
    """An ordered table of rules, indexed by the op they match. `pm1 + pm2` concatenates tables."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., UOp | None]]]):
        self.rules = [r if isinstance(r, Rule) else
                      Rule(r[0], r[1], "ctx" in inspect.signature(r[1]).parameters, r[0].location) for r in rules]
        self.by_op: dict[Ops, list[Rule]] = {}
        self.any_op: list[Rule] = []
        for r in self.rules:
            if r.pat.op is None: self.any_op.append(r)
        for op in Ops:
            self.by_op[op] = [r for r in self.rules if r.pat.op is None or op in r.pat.op]

    def __add__(self, other: "PatternMatcher") -> "PatternMatcher":
        return PatternMatcher(self.rules + other.rules)  # type: ignore[arg-type]

    def rewrite(self, u: UOp, ctx: Any = None, trace: list | None = None) -> UOp | None:
        for rule in self.by_op[u.op]:
            for captures in rule.pat.match(u, {}):
                ret = rule.fn(ctx=ctx, **captures) if rule.takes_ctx else rule.fn(**captures)
                if ret is not None and ret is not u:
                    if trace is not None: trace.append((rule.location, u, ret))
                    return ret
        return None


# ---------------------------------------------------------------------------------------------------------------------
# graph_rewrite: rewrite a whole graph to a fixed point with one matcher. Iterative, so deep graphs don't recurse.

@dataclass
class RewriteTrace:
    """What one named pass did: its input, output and every rule that fired (for DEBUG/VIZ)."""
    name: str
    before: UOp
    after: UOp | None = None
    matches: list[tuple[tuple[str, int], UOp, UOp]] = field(default_factory=list)


# when not None, every graph_rewrite appends a RewriteTrace here (VIZ=1 and tests turn this on)
rewrite_traces: list[RewriteTrace] | None = None
REWRITE_LIMIT = 1_000_000


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, name: str | None = None,
                  bottom_up: bool = False) -> UOp:
    """Apply `pm` to every node under `root` until nothing matches; returns the new root.

    Default order: a node's sources are rewritten first, then the node itself, and whatever a rule returns is rewritten
    again. With `bottom_up=True` the matcher is applied to a node before its sources are visited.
    """
    tr = RewriteTrace(name or "graph_rewrite", root) if rewrite_traces is not None else None
    trace = tr.matches if tr is not None else None
    replace: dict[UOp, UOp] = {}
    stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
    steps = 0
    while stack:
        n, stage, extra = stack.pop()
        if n in replace and stage != 2: continue
        steps += 1
        if steps > REWRITE_LIMIT: raise RuntimeError(f"graph_rewrite {name!r} did not converge (infinite rewrite loop?)")
        if stage == 0:
            if bottom_up:
                new = _fixed_point(n, pm, ctx, trace)
                if new is not n:
                    stack.append((n, 2, new))
                    stack.append((new, 0, None))
                    continue
            stack.append((n, 1, None))
            stack.extend((s, 0, None) for s in reversed(n.src) if s not in replace)
        elif stage == 1:
            new_src = tuple(replace[s] for s in n.src)
            cur = n if all(a is b for a, b in zip(new_src, n.src)) else n.replace(src=new_src)
            ret = pm.rewrite(cur, ctx, trace) if not bottom_up or cur is not n else None
            if ret is None:
                replace[n] = cur
                if cur is not n and cur not in replace:
                    # the rebuilt node may itself match in bottom-up mode; in top-down mode it was just tried
                    replace[cur] = cur
            else:
                stack.append((n, 2, ret))
                stack.append((ret, 0, None))
        else:
            assert extra is not None
            replace[n] = replace[extra]
    out = replace[root]
    if tr is not None and rewrite_traces is not None:
        tr.after = out
        rewrite_traces.append(tr)
    return out


def _fixed_point(n: UOp, pm: PatternMatcher, ctx: Any, trace: list | None) -> UOp:
    for _ in range(1000):
        ret = pm.rewrite(n, ctx, trace)
        if ret is None: return n
        n = ret
    raise RuntimeError("infinite loop in bottom-up rewrite")


def substitute(root: UOp, mapping: dict[UOp, UOp], name: str = "substitute") -> UOp:
    """Replace nodes by the mapping everywhere under root (no further rewriting of the replacements)."""
    return substitute_memo(root, mapping)[root] if mapping else root


def substitute_each(root: UOp, old: UOp, news: Sequence[UOp]) -> list[UOp]:
    """[substitute(root, {old: new}) for new in news], walking root once and rebuilding only the nodes above `old`
    (an upcast's or an unroll's copies of a store share everything that doesn't depend on the split range)."""
    above: list[UOp] = []   # the nodes that depend on old, children first
    dep = {old}
    for n in root.toposort():
        if n is not old and any(s in dep for s in n.src):
            dep.add(n)
            above.append(n)
    if root not in dep: return [root] * len(news)
    out = []
    for new in news:
        memo = {old: new}
        for n in above: memo[n] = n.replace(src=tuple(memo.get(s, s) for s in n.src))
        out.append(memo[root])
    return out


def substitute_memo(root: UOp, mapping: dict[UOp, UOp]) -> dict[UOp, UOp]:
    """Like substitute, returning the new node of every node under root."""
    memo: dict[UOp, UOp] = {}
    for n in root.toposort():
        if n in mapping: memo[n] = mapping[n]
        else:
            new_src = tuple(memo[s] for s in n.src)
            memo[n] = n if all(a is b for a, b in zip(new_src, n.src)) else n.replace(src=new_src)
    return memo
