"""Scheduler, first step for symbolic shapes: bound variables in the tensor graph -> unbound ones plus their values.

A shape may hold a bound variable (`Ops.BIND`: DEFINE_VAR and its value) or an expression of one, in the args of
movement ops. `strip_binds` rewrites those args to mention only the DEFINE_VAR and collects `var_vals`. Kernel ASTs
are then the same for every value of a variable, so one compiled kernel serves them all; the values ride along on the
ScheduleItems and are passed to the program at launch (`prg(*bufs, vals=...)`).
"""
from __future__ import annotations

import functools
from typing import Any

from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import substitute


def has_uop(arg: Any) -> bool:
    """Whether a node's arg mentions a UOp (a symbolic size), at any depth of its tuples."""
    try: return _has_uop_cached(arg)
    except TypeError: return _has_uop(arg)   # unhashable


@functools.lru_cache(maxsize=1 << 14)
def _has_uop_cached(arg: Any) -> bool: return _has_uop(arg)


def _has_uop(arg: Any) -> bool:
    if isinstance(arg, UOp): return True
    return isinstance(arg, tuple) and any(_has_uop(a) for a in arg)


class Unbinder:
    def __init__(self) -> None:
        self.var_vals: dict[UOp, int] = {}
        self.memo: dict[UOp, UOp] = {}
        self.used: set[UOp] = set()   # every DEFINE_VAR a shape mentions (each must be bound somewhere)

    def expr(self, e: UOp) -> UOp:
        if (ret := self.memo.get(e)) is not None: return ret
        binds = {}
        for n in e.toposort():
            if n.op is Ops.BIND:
                var, val = n.unbind()
                if self.var_vals.setdefault(var, val) != val:
                    raise ValueError(f"variable {var.arg[0]!r} is bound to both {self.var_vals[var]} and {val} in one "
                                     "realize; realize them separately")
                binds[n] = var
            elif n.op is Ops.DEFINE_VAR: self.used.add(n)
        ret = self.memo[e] = substitute(e, binds) if binds else e
        return ret

    def arg(self, a: Any) -> Any:
        if isinstance(a, UOp): return self.expr(a)
        if isinstance(a, tuple): return tuple(self.arg(x) for x in a)
        return a

    def check_bound(self) -> None:
        """Raise for a variable some shape uses that no shape binds."""
        unbound = sorted(v.arg[0] for v in self.used if v not in self.var_vals)
        if unbound:
            raise ValueError(f"variable {unbound[0]!r} is used in a shape or as a value but not bound to a value; "
                             f"use {unbound[0]}.bind(value)")


def strip_binds(sink: UOp) -> tuple[UOp, dict[UOp, UOp], dict[UOp, int]]:
    """(the graph with unbound shapes, old node -> new node for every changed node, variable -> value)."""
    ub = Unbinder()
    mapping: dict[UOp, UOp] = {}
    for n in sink.toposort():
        new_src = tuple(mapping.get(s, s) for s in n.src)
        symbolic_arg = (n.op in GroupOp.Movement or n.op in (Ops.CONST, Ops.IOTA)) and has_uop(n.arg)
        new_arg = ub.arg(n.arg) if symbolic_arg else n.arg
        if new_arg is not n.arg or any(a is not b for a, b in zip(new_src, n.src)):
            mapping[n] = UOp(n.op, n.dtype, new_src, new_arg)
    ub.check_bound()
    return mapping.get(sink, sink), mapping, ub.var_vals
