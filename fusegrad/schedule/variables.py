"""Scheduler, first step for symbolic shapes: bound variables in the tensor graph -> unbound ones plus their values.

A shape may hold a bound variable (`Ops.BIND`: DEFINE_VAR and its value) or an expression of one, in the args of
movement ops. `strip_binds` rewrites those args to mention only the DEFINE_VAR and collects `var_vals`. Kernel ASTs
are then the same for every value of a variable, so one compiled kernel serves them all; the values ride along on the
ScheduleItems and are passed to the program at launch (`prg(*bufs, vals=...)`). A variable bound to several values in
one realize keeps its first value; each further value gets an alias, a variable of its own with the same range (named
`alias_name(name, k)`), so `x[:v.bind(2)]` and `x[:v.bind(3)]` become different nodes read by different kernel
arguments; so does a second variable of the same name with another range (a kernel argument per name). The aliases
are made in walk order, so the same graph structure gives the same aliases (the schedule cache key holds them).

A symbolic slice bound may hold only for some values of its variables (`t[:, :v]` with v's maximum past the axis, as
tinygrad allows): the Unbinder checks such bounds against this realize's values (BoundsError, an IndexError and
ValueError, before anything runs) and keeps them, unbound, in `checks`; the ScheduleItems carry them so that a TinyJit
replay checks its own values too.
"""
from __future__ import annotations

import functools
from typing import Any

from fusegrad.helpers import BoundsError
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import substitute
from fusegrad.ir.shape import sadd, shrink_bounds_error, shrink_bounds_known


def has_uop(arg: Any) -> bool:
    """Whether a node's arg mentions a UOp (a symbolic size), at any depth of its tuples."""
    try: return _has_uop_cached(arg)
    except TypeError: return _has_uop(arg)   # unhashable


@functools.lru_cache(maxsize=1 << 14)
def _has_uop_cached(arg: Any) -> bool: return _has_uop(arg)


def _has_uop(arg: Any) -> bool:
    if isinstance(arg, UOp): return True
    return isinstance(arg, tuple) and any(_has_uop(a) for a in arg)


def alias_name(name: str, k: int) -> str:
    """The name of the k-th extra value (k >= 1) of variable `name` in one realize (a C identifier, like the name)."""
    return f"{name}__{k}"


class Unbinder:
    def __init__(self) -> None:
        self.var_vals: dict[UOp, int] = {}
        self.aliases: dict[tuple[UOp, int], UOp] = {}   # (variable, a second value) -> the variable standing for it
        self.names: dict[str, UOp] = {}   # variable name -> the variable that has it in this realize
        self.memo: dict[UOp, UOp] = {}
        self.used: set[UOp] = set()   # every DEFINE_VAR a shape mentions (each must be bound somewhere)
        self.checks: dict[tuple, None] = {}   # (axis, begin, end, size), unbound: shrink bounds true for some values

    def node_arg(self, n: UOp) -> Any:
        """The arg of a node whose arg mentions a UOp, unbound (a SHRINK's bounds that need checking noted)."""
        arg = self.arg(n.arg)
        if n.op is Ops.SHRINK or n.op is Ops.PAD:   # (keyed by the unbound arg and shape: one proof serves every value)
            for c in value_dependent_bounds(n.op is Ops.PAD, arg, self.arg(n.src[0].shape)): self.checks[c] = None
        return arg

    def expr(self, e: UOp) -> UOp:
        if (ret := self.memo.get(e)) is not None: return ret
        binds = {}
        for n in e.toposort():
            if n.op is Ops.BIND:
                binds[n] = self.variable(*n.unbind())
            elif n.op is Ops.DEFINE_VAR: self.used.add(n)
        ret = self.memo[e] = substitute(e, binds) if binds else e
        return ret

    def variable(self, var: UOp, val: int) -> UOp:
        """The variable that stands for `var` bound to `val` in this realize: `var` itself for its first value, an
        alias (a variable of its own, named `alias_name(name, k)`, with var's range) for each further value, so the
        kernels reading `x[:v.bind(2)]` and `x[:v.bind(3)]` take their own argument. A second variable of the same
        name (another range or dtype) is aliased too: one name is one kernel argument."""
        owner = self.names.setdefault(var.arg[0], var)
        if owner is var and self.var_vals.setdefault(var, val) == val: return var
        if (alias := self.aliases.get((var, val))) is not None: return alias
        k = sum(1 for v, _ in self.aliases if v.arg[0] == var.arg[0])
        while True:   # (a user variable of the alias's name would be another argument of that name: skip its name)
            k += 1
            alias = UOp(var.op, var.dtype, var.src, (alias_name(var.arg[0], k), *var.arg[1:]))
            if alias.arg[0] not in self.names and not any(u.arg[0] == alias.arg[0] for u in self.used): break
        self.aliases[(var, val)] = alias
        self.names[alias.arg[0]] = alias
        self.var_vals[alias] = val
        return alias

    def arg(self, a: Any) -> Any:
        if isinstance(a, UOp): return self.expr(a)
        if isinstance(a, tuple): return tuple(self.arg(x) for x in a)
        return a

    def check_bound(self) -> None:
        """Raise for a variable some shape uses that no shape binds, and for slice bounds out of range for the values
        bound (BoundsError)."""
        aliased = {v for v, _ in self.aliases}
        unbound = sorted(v.arg[0] for v in self.used if v not in self.var_vals and v not in aliased)
        if unbound:
            raise ValueError(f"variable {unbound[0]!r} is used in a shape or as a value but not bound to a value; "
                             f"use {unbound[0]}.bind(value)")
        if self.checks and (err := shrink_bounds_error(list(self.checks), self.var_vals)) is not None:
            raise BoundsError(err)


@functools.lru_cache(maxsize=1 << 12)
def value_dependent_bounds(pad: bool, arg: tuple, shape: tuple) -> tuple[tuple[int, Any, Any, Any], ...]:
    """The axes of a SHRINK (or PAD) with `arg` of `shape` whose bounds hold for some values of the variables only, as
    (axis, begin, end, size). A pad by (b, a) is checked as the slice it undoes, (b, b + size) of the padded axis: a
    write through `t[:v]` pads the value by (0, size - v), negative for v past the axis."""
    if pad:
        arg, shape = tuple((b, sadd(b, s)) for (b, _), s in zip(arg, shape)), \
            tuple(sadd(sadd(b, s), a) for (b, a), s in zip(arg, shape))
    return tuple((ax, b, e, s) for ax, ((b, e), s) in enumerate(zip(arg, shape))
                 if shrink_bounds_known(b, e, s) is None)


def strip_binds(sink: UOp) -> tuple[UOp, dict[UOp, UOp], dict[UOp, int]]:
    """(the graph with unbound shapes, old node -> new node for every changed node, variable -> value)."""
    ub = Unbinder()
    mapping: dict[UOp, UOp] = {}
    for n in sink.toposort():
        new_src = tuple(mapping.get(s, s) for s in n.src)
        symbolic_arg = (n.op in GroupOp.Movement or n.op in (Ops.CONST, Ops.IOTA)) and has_uop(n.arg)
        new_arg = ub.node_arg(n) if symbolic_arg else n.arg
        if new_arg is not n.arg or any(a is not b for a, b in zip(new_src, n.src)):
            mapping[n] = UOp(n.op, n.dtype, new_src, new_arg)
    ub.check_bound()
    return mapping.get(sink, sink), mapping, ub.var_vals
