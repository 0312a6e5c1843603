"""The IR: the `Ops` enum (grouped by kind, with declared categories) and `UOp`, the one immutable, hash-consed node type.

The same node type serves every level: the lazy tensor graph, kernel ASTs and the linear program.
Because nodes are hash-consed, structural equality is identity: `UOp(...) is UOp(...)` for equal arguments.
"""
from __future__ import annotations

import enum
import functools
import hashlib
import math
import operator
import weakref
from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any, Callable, Iterator

from fusegrad.dtype import ConstType, DType, PtrDType, dtypes
from fusegrad.ir.shape import infer_shape, sprod   # (shape.py reaches this module only inside its functions)

if TYPE_CHECKING:
    _cached_property = functools.cached_property
else:
    class _cached_property:
        """functools.cached_property without its per-instance lock (Python 3.11 takes an RLock on every first
        access): a node's shape, device and bounds are computed once per node, for every node a graph builds."""
        def __init__(self, fn):
            self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

        def __get__(self, obj, cls=None):
            if obj is None: return self
            val = obj.__dict__[self.name] = self.fn(obj)
            return val


_nested = 0   # how many _cached_from_src computations are running (each one a source that lacked its value)


class _cached_from_src(_cached_property):
    """A cached property computed from the same property of the node's sources (shape, device, bounds, key). On a
    node whose sources don't have it yet (a graph built in one go by a rewrite or `substitute`), the computation
    recurses source by source. Past 64 levels, the nodes below that lack the value get theirs in one iterative walk
    instead, children before parents, so no depth of graph reaches Python's recursion limit. A node built by the
    frontend finds its sources' values there (or one or two levels down: a fresh constant) and pays for a counter."""
    def __get__(self, obj, cls=None):
        global _nested
        if obj is None: return self
        name, fn = self.name, self.fn
        if _nested > 64:
            for n in obj.toposort(gate=lambda n: name not in n.__dict__):
                if name not in n.__dict__: n.__dict__[name] = fn(n)
            return obj.__dict__[name]
        _nested += 1
        try: val = obj.__dict__[name] = fn(obj)
        finally: _nested -= 1
        return val


class Ops(enum.Enum):
    # --- tensor graph (never reach a kernel) ---
    SINK = enum.auto()          # groups roots: src = roots
    DEVICE = enum.auto()        # arg = device name; source of a BUFFER/CONST/IOTA on the tensor level
    BUFFER = enum.auto()        # a 1-d buffer of arg[1] elements: arg = (unique id, size), src = (DEVICE,)
    COPY = enum.auto()          # copy src to device arg
    CONTIGUOUS = enum.auto()    # ask for src to be materialized
    DETACH = enum.auto()        # stop gradients
    IOTA = enum.auto()          # 0, 1, ..., arg-1 (the tensor-level view of an index); src = (DEVICE,)
    REDUCE_AXIS = enum.auto()   # arg = (reduce op, axes); reduced axes keep size 1
    ASSIGN = enum.auto()        # src = (target buffer view, value), arg = unique id: write value into target's memory
    GATHER = enum.auto()        # src = (x, idx), arg = axis: out[I] = x[I with I[axis] = idx[I]]; 0 where out of range
    MULTI = enum.auto()         # one tensor on several devices: src = one shard per device, arg = the sharded axis
                                # (None: every src holds the whole tensor); schedule/multi.py lowers it per device

    # --- movement: views, folded into index math at codegen ---
    RESHAPE = enum.auto()
    PERMUTE = enum.auto()
    EXPAND = enum.auto()
    PAD = enum.auto()
    SHRINK = enum.auto()
    FLIP = enum.auto()

    # --- kernel structure ---
    PARAM = enum.auto()         # kernel argument buffer; arg = slot
    DEFINE_VAR = enum.auto()    # a symbolic integer; arg = (name, min, max)
    BIND = enum.auto()          # a variable bound to a value, in tensor shapes: src = (DEFINE_VAR, CONST value)
    DEFINE_REG = enum.auto()    # a register array (accumulators); arg = id
    DEFINE_LOCAL = enum.auto()  # workgroup-shared memory; arg = id
    RANGE = enum.auto()         # a loop index; src = (size,), arg = (id, kind)
    SPECIAL = enum.auto()       # a hardware index (thread/group id); src = (size,), arg = name
    REDUCE = enum.auto()        # src = (value, *ranges), arg = the ALU op that accumulates
    INDEX = enum.auto()         # src = (buffer, index) or (buffer, index, gate): the address of one element
    LOAD = enum.auto()          # src = (INDEX,) [, alt value when gated]
    STORE = enum.auto()         # src = (INDEX, value)
    END = enum.auto()           # closes the RANGE in src[1] (linear program)
    IF = enum.auto()
    ENDIF = enum.auto()
    BARRIER = enum.auto()
    VECTORIZE = enum.auto()     # build a vector from scalars
    GEP = enum.auto()           # get element arg of a vector

    # --- values ---
    CONST = enum.auto()
    CAST = enum.auto()
    BITCAST = enum.auto()

    # --- ALU: the primitive math every backend renders ---
    NEG = enum.auto()
    RECIPROCAL = enum.auto()
    SQRT = enum.auto()
    EXP2 = enum.auto()
    LOG2 = enum.auto()
    SIN = enum.auto()
    TRUNC = enum.auto()
    ADD = enum.auto()
    MUL = enum.auto()
    IDIV = enum.auto()          # integer division, truncating toward zero (C semantics)
    MOD = enum.auto()           # integer remainder with the sign of the dividend (C semantics)
    MAX = enum.auto()           # NaN-propagating maximum
    CMPLT = enum.auto()
    CMPNE = enum.auto()
    AND = enum.auto()
    OR = enum.auto()
    XOR = enum.auto()
    SHL = enum.auto()
    SHR = enum.auto()
    WHERE = enum.auto()
    MULACC = enum.auto()        # a*b+c

    def __repr__(self) -> str: return f"Ops.{self.name}"
    # hashed by identity (each member is a singleton), in C: Enum's own __hash__ is a Python call, and every graph
    # operation looks ops up in the GroupOp sets and in rule tables
    __hash__ = object.__hash__
    # pickled by name, not by the auto() number, so a pickle stays valid when ops are added or reordered
    def __reduce_ex__(self, protocol: Any) -> tuple: return getattr, (self.__class__, self._name_)


class GroupOp:
    """Declared categories of ops. A new op joins the sets it belongs to here."""
    Unary = {Ops.NEG, Ops.RECIPROCAL, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC}
    Binary = {Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL,
              Ops.SHR}
    Ternary = {Ops.WHERE, Ops.MULACC}
    ALU = Unary | Binary | Ternary
    Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
    Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
    Associative = {Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX}
    Comparison = {Ops.CMPLT, Ops.CMPNE}
    Reduce = {Ops.ADD, Ops.MUL, Ops.MAX}  # the ALU ops a reduction may use
    TensorOnly = {Ops.SINK, Ops.DEVICE, Ops.BUFFER, Ops.COPY, Ops.CONTIGUOUS, Ops.DETACH, Ops.IOTA, Ops.REDUCE_AXIS,
                  Ops.GATHER, Ops.ASSIGN, Ops.BIND, Ops.MULTI} | Movement
    # ops of the linear program (the backend contract); see docs/runtime.md
    Linear = {Ops.PARAM, Ops.DEFINE_VAR, Ops.DEFINE_REG, Ops.DEFINE_LOCAL, Ops.RANGE, Ops.END, Ops.IF, Ops.ENDIF,
              Ops.BARRIER, Ops.SPECIAL, Ops.INDEX, Ops.LOAD, Ops.STORE, Ops.CONST, Ops.CAST, Ops.BITCAST, Ops.VECTORIZE,
              Ops.GEP} | ALU


# ---------------------------------------------------------------------------------------------------------------------

# (op, dtype, src, arg) -> a weak reference to the live node; a node's reference drops its entry when the node dies.
# A plain dict of plain references (weakref.WeakValueDictionary does the same with Python-level get, set and keyed
# references: a quarter of the cost of building a node). Never iterated, so removal needs no iteration guard.
_ucache: dict[tuple, "weakref.ref[UOp]"] = {}
# every live ASSIGN node: a realize with none pending anywhere skips looking for writes in its graph (views.py)
live_assigns: "weakref.WeakSet[UOp]" = weakref.WeakSet()


class UOpMetaClass(type):
    """Hash-consing: constructing a UOp with the same (op, dtype, src, arg) returns the existing node."""

    def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple["UOp", ...] = (), arg: Any = None) -> "UOp":
        key = (op, dtype, src, arg) if op is not Ops.CONST else (op, dtype, src, arg, zero_signs(arg))
        if (ref := _ucache.get(key)) is not None and (ret := ref()) is not None: return ret
        ret = super().__call__(op, dtype, src, arg)
        _ucache[key] = weakref.ref(ret, functools.partial(_drop_node, key))
        if op is Ops.ASSIGN: live_assigns.add(ret)
        return ret


def zero_signs(arg: Any) -> Any:
    """What an equality test can't see in a constant: -0.0 == 0.0 in Python, so a key of (op, dtype, src, arg) alone
    made `x * 0.0` the very node of a live `x * -0.0` (and `1 / that` -inf instead of inf). None for most constants;
    for a float zero (or a tuple of constants holding one) the signs of its zeros."""
    if arg.__class__ is float: return None if arg != 0.0 else math.copysign(1.0, arg) < 0
    if arg.__class__ is tuple and any(a.__class__ is float and a == 0.0 for a in arg):
        return tuple(a.__class__ is float and a == 0.0 and math.copysign(1.0, a) < 0 for a in arg)
    return None


def _drop_node(key: tuple, ref: "weakref.ref[UOp]", _remove: Any = _remove_dead_weakref,
               _cache: dict = _ucache) -> None:
    _remove(_cache, key)   # only if the entry is still a dead reference (not a newer node's); bound early for shutdown


class BindError(ValueError, AssertionError):
    """A Variable bound to a value outside its range. A ValueError; also an AssertionError, since tinygrad's bind
    asserts, so ported code catching either works."""


def _is_pyint(x: Any) -> bool:
    """An int, or an int-like scalar (numpy's), but not a bool."""
    if isinstance(x, (bool, UOp)) or type(x).__name__ == "bool_": return False
    try: operator.index(x)
    except TypeError: return False
    return True


def _as_uop(x: "UOp | ConstType", dtype: DType) -> "UOp":
    return x if isinstance(x, UOp) else UOp.const(dtype, x)


class UOp(metaclass=UOpMetaClass):
    """An IR node. Immutable; identity is structure (hash-consed), so nodes are usable as dict keys."""
    __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")

    def __init__(self, op: Ops, dtype: DType = dtypes.void, src: tuple["UOp", ...] = (), arg: Any = None):
        self.op, self.dtype, self.src, self.arg = op, dtype, src, arg

    def __reduce__(self) -> tuple:
        return (UOp, (self.op, self.dtype, self.src, self.arg))

    def replace(self, **kwargs: Any) -> "UOp":
        args = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg}
        args.update(kwargs)
        return UOp(args["op"], args["dtype"], tuple(args["src"]), args["arg"])

    # ----- graph walking -----
    def toposort(self, gate: Callable[["UOp"], bool] | None = None) -> dict["UOp", None]:
        """All nodes reachable from self, children before parents (iterative: deep graphs don't recurse).

        `gate(node) -> False` stops the walk below that node (the node itself is still included)."""
        out: dict[UOp, None] = {}
        stack: list[tuple[UOp, bool]] = [(self, False)]
        while stack:
            node, visited = stack.pop()
            if node in out: continue
            if visited:
                out[node] = None
                continue
            stack.append((node, True))
            if gate is None or gate(node):
                for s in reversed(node.src):
                    if s not in out: stack.append((s, False))
        return out

    @_cached_from_src
    def key(self) -> bytes:
        """A structural hash stable across processes (for disk caches and process replay)."""
        h = hashlib.sha256(f"{self.op}|{self.dtype}|{self.arg!r}".encode())
        for s in self.src: h.update(s.key)
        return h.digest()

    def __repr__(self) -> str:
        return pretty(self)

    # ----- tensor-level properties -----
    @_cached_from_src
    def shape(self) -> tuple[int, ...] | None: return infer_shape(self)

    @property
    def size(self) -> "int | UOp":
        """The number of elements: an int, or a symbolic int when the shape has variables in it."""
        assert self.shape is not None
        return sprod(self.shape)

    @_cached_from_src
    def device(self) -> str | tuple[str, ...] | None:
        """The device name; a tuple of names for a tensor on several devices (MULTI, or a constant made for them)."""
        if self.op is Ops.DEVICE: return self.arg
        if self.op is Ops.COPY: return self.arg
        if self.op is Ops.MULTI: return tuple(str(s.device) for s in self.src)
        for s in self.src:
            if (d := s.device) is not None: return d
        return None

    @property
    def base(self) -> "UOp":
        """The node under any movement ops."""
        x = self
        while x.op in GroupOp.Movement: x = x.src[0]
        return x

    # ----- constructors -----
    @staticmethod
    def const(dtype: DType, val: ConstType) -> "UOp":
        """A kernel-level scalar constant (wrapped to dtype's range)."""
        return UOp(Ops.CONST, dtype, (), dtypes.as_const(val, dtype))

    @staticmethod
    def range(size: "int | UOp", rid: int, kind: str = "loop") -> "UOp":
        return UOp(Ops.RANGE, dtypes.int32, (_as_uop(size, dtypes.int32),), (rid, kind))

    @staticmethod
    def variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.weakint, multiple_of: int = 1,
                 param: bool = False) -> "UOp":
        """A symbolic integer in [min_val, max_val] (`fusegrad.Variable`). Bind it to use it in a shape.

        `dtype` stays `weakint` (the default) to let the range choose: int32, or int64 when the range needs it. With
        `multiple_of=k` every bound value must be a multiple of k.

        >>> from fusegrad import Tensor, Variable
        >>> n = Variable("n", 1, 10)
        >>> Tensor.arange(10)[:n.bind(3)].tolist()
        [0, 1, 2]
        """
        if not (isinstance(name, str) and _is_pyint(min_val) and _is_pyint(max_val)):
            raise TypeError(f"Variable(name: str, min_val: int, max_val: int), got {name!r}, {min_val!r}, {max_val!r}")
        if min_val > max_val:
            raise ValueError(f"Variable {name!r}: need min_val <= max_val, got [{min_val}, {max_val}]")
        if not _is_pyint(multiple_of) or multiple_of < 1:
            raise ValueError(f"Variable {name!r}: multiple_of must be a positive int, got {multiple_of!r}")
        if param: raise NotImplementedError("Variable(param=True) (a kernel PARAM variable) isn't supported")
        if dtype == dtypes.weakint: dtype = dtypes.int32 if -2**31 <= min_val and max_val < 2**31 else dtypes.int64
        if not dtypes.is_int(dtype) or dtype.count != 1:
            raise TypeError(f"Variable {name!r}: dtype must be an int dtype, got {dtype}")
        if min_val < dtypes.min(dtype) or max_val > dtypes.max(dtype):
            raise ValueError(f"Variable {name!r}: range [{min_val}, {max_val}] doesn't fit {dtype}")
        arg = (name, min_val, max_val) if multiple_of == 1 else (name, min_val, max_val, multiple_of)
        return UOp(Ops.DEFINE_VAR, dtype, (), arg)

    def bind(self, val: "int | UOp") -> "UOp":
        """This variable bound to `val`: usable in shapes and slices (`t[:n.bind(3)]`, `Tensor.ones(n.bind(3), 4)`).
        Kernels are compiled for the variable, so every value of it shares one compiled kernel. A value outside the
        range (or not a multiple of `multiple_of`) raises `BindError`, both a ValueError and (like tinygrad's
        assert) an AssertionError."""
        if self.op is not Ops.DEFINE_VAR: raise TypeError(f"only a Variable can be bound, not {self.op}")
        name, lo, hi = self.arg[:3]
        raw: Any = val.arg if isinstance(val, UOp) and val.op is Ops.CONST else val
        if not _is_pyint(raw):
            raise TypeError(f"Variable {name!r} must be bound to an int, got {type(raw).__name__}")
        v = operator.index(raw)
        if not lo <= v <= hi: raise BindError(f"Variable {name!r} bound to {v}, outside its range [{lo}, {hi}]")
        if len(self.arg) > 3 and v % self.arg[3]:
            raise BindError(f"Variable {name!r}: bind {v} not divisible by {self.arg[3]}")
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, v)))

    def unbind(self) -> tuple["UOp", int]:
        """(variable, value) of a bound variable."""
        if self.op is not Ops.BIND: raise TypeError(f"unbind needs a bound variable, got {self.op}")
        return self.src[0], int(self.src[1].arg)

    @property
    def val(self) -> int:
        """The value of a bound variable (`n.bind(3).val == 3`)."""
        return self.unbind()[1]

    def unbind_all(self) -> tuple["UOp", dict["UOp", int]]:
        """(this expression with every bound variable unbound, {variable: value})."""
        binds = {n: n.src[0] for n in self.toposort() if n.op is Ops.BIND}
        vals: dict[UOp, int] = {}
        for b, var in binds.items():
            if vals.setdefault(var, b.val) != b.val:
                raise ValueError(f"variable {var.arg[0]!r} is bound to both {vals[var]} and {b.val}")
        if not binds: return self, vals
        from fusegrad.ir.pattern import substitute
        return substitute(self, binds), vals

    def variables(self) -> list["UOp"]:
        """The (unbound) variables this expression uses, sorted by name."""
        found = {n.src[0] if n.op is Ops.BIND else n for n in self.toposort() if n.op in (Ops.BIND, Ops.DEFINE_VAR)}
        return sorted(found, key=lambda v: v.arg)

    @property
    def expr(self) -> str:
        """The variable's name (tinygrad spelling)."""
        return (self.src[0] if self.op is Ops.BIND else self).arg[0]

    def simplify(self) -> "UOp":
        """This int expression simplified to canonical form (`(j + i).simplify() is (i + j).simplify()`)."""
        from fusegrad.ir.symbolic import simplify
        return simplify(self)

    def sym_infer(self, var_vals: "dict[UOp, int] | dict[str, int] | None" = None) -> int:
        """The value of this int expression, with `var_vals` giving variables' values (by Variable or by name)."""
        return sym_infer(self, var_vals)

    def alu(self, op: Ops, *srcs: "UOp | ConstType") -> "UOp":
        out_dtype = dtypes.bool if op in GroupOp.Comparison else self.dtype
        return UOp(op, out_dtype, (self,) + tuple(_as_uop(s, self.dtype) for s in srcs))

    def cast(self, dtype: DType) -> "UOp":
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> "UOp":
        return UOp(Ops.BITCAST, dtype, (self,))

    def where(self, a: "UOp | ConstType", b: "UOp | ConstType") -> "UOp":
        av = _as_uop(a, b.dtype if isinstance(b, UOp) else dtypes.int32)
        return UOp(Ops.WHERE, av.dtype, (self, av, _as_uop(b, av.dtype)))

    # arithmetic sugar, used by symbolic index math and by rules (`x * 2 + y`)
    def __add__(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.ADD, x)
    def __radd__(self, x: "UOp | ConstType") -> "UOp": return _as_uop(x, self.dtype).alu(Ops.ADD, self)
    def __mul__(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.MUL, x)
    def __rmul__(self, x: "UOp | ConstType") -> "UOp": return _as_uop(x, self.dtype).alu(Ops.MUL, self)
    def __sub__(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.ADD, -x if not isinstance(x, UOp) else x.neg())
    def __rsub__(self, x: "UOp | ConstType") -> "UOp": return _as_uop(x, self.dtype).alu(Ops.ADD, self.neg())
    def __floordiv__(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.IDIV, x)
    def __mod__(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.MOD, x)
    def __neg__(self) -> "UOp": return self.neg()
    def neg(self) -> "UOp":
        return self.alu(Ops.MUL, -1) if dtypes.is_int(self.dtype) else self.alu(Ops.NEG)
    def lt(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.CMPLT, x)
    def ne(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.CMPNE, x)
    def maximum(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.MAX, x)
    def logical_and(self, x: "UOp") -> "UOp": return self.alu(Ops.AND, x)

    # ----- symbolic bounds (integers and bools) -----
    @_cached_from_src
    def vmin_vmax(self) -> tuple[ConstType, ConstType]:
        from fusegrad.ir.symbolic import bounds
        return bounds(self)

    @property
    def vmin(self) -> ConstType: return self.vmin_vmax[0]

    @property
    def vmax(self) -> ConstType: return self.vmin_vmax[1]

    @property
    def const_arg(self) -> ConstType | None:
        return self.arg if self.op is Ops.CONST else None


def pretty(u: UOp, max_depth: int = 3) -> str:
    """Render index math as an expression (`((r0*16)+r1)`), any other node as UOp(op, dtype, src, arg)."""
    if u.op is Ops.CONST: return repr(u.arg)
    if u.op is Ops.RANGE: return f"r{u.arg[0]}"
    if u.op is Ops.DEFINE_VAR: return u.arg[0]
    if u.op is Ops.BIND: return f"{u.src[0].arg[0]}={u.src[1].arg}"
    if u.op is Ops.SPECIAL: return u.arg
    syms = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.AND: "&",
            Ops.OR: "|", Ops.XOR: "^"}
    if u.op in syms and max_depth > 0:
        return f"({pretty(u.src[0], max_depth - 1)}{syms[u.op]}{pretty(u.src[1], max_depth - 1)})"
    if u.op is Ops.MAX and max_depth > 0:
        return f"max({pretty(u.src[0], max_depth - 1)}, {pretty(u.src[1], max_depth - 1)})"
    if max_depth <= 0: return f"UOp({u.op.name}, ...)"
    srcs = ", ".join(pretty(s, max_depth - 1) for s in u.src)
    return f"UOp({u.op}, {u.dtype}, ({srcs}), {u.arg!r})"


def print_tree(u: UOp) -> str:
    """A multi-line listing of the graph under `u`, one numbered node per line (DEBUG=5)."""
    nodes = list(u.toposort())
    num = {n: i for i, n in enumerate(nodes)}
    lines = []
    for n in nodes:
        srcs = ", ".join(f"%{num[s]}" for s in n.src)
        arg = "" if n.arg is None else f" {n.arg!r}" if not isinstance(n.arg, tuple) or len(repr(n.arg)) < 60 \
            else f" {repr(n.arg)[:60]}..."
        lines.append(f"%{num[n]:<4} {n.op.name:<12} {str(n.dtype):<18} [{srcs}]{arg}")
    return "\n".join(lines)


def ssimplify(u: UOp) -> UOp:
    from fusegrad.ir.symbolic import simplify
    return simplify(u)


class VarVals(dict):
    """`{Variable: value}`, as `Tensor.linear_with_vars()` returns it. A lookup also takes the variable's name, the
    key tinygrad's newer releases use: `var_vals[n] == var_vals["n"]`."""
    def _key(self, k: Any) -> Any:
        if isinstance(k, str) and not super().__contains__(k):
            return next((v for v in self if isinstance(v, UOp) and v.arg[0] == k), k)
        return k
    def __getitem__(self, k: Any) -> int: return super().__getitem__(self._key(k))
    def __contains__(self, k: Any) -> bool: return super().__contains__(self._key(k))
    def get(self, k: Any, default: Any = None) -> Any: return super().get(self._key(k), default)


def sym_infer(u: UOp | int, var_vals: "dict[UOp, int] | dict[str, int] | None" = None) -> int:
    """Evaluate an integer expression given values for its variables (bound variables carry their own value)."""
    if isinstance(u, int): return u
    from fusegrad.ir.alu import exec_alu
    if u.op is Ops.CONST: return int(u.arg)
    if u.op is Ops.BIND: return int(u.src[1].arg)
    if u.op is Ops.DEFINE_VAR:
        if var_vals is not None and u in var_vals: return int(var_vals[u])   # type: ignore[index]
        if var_vals is not None and u.arg[0] in var_vals: return int(var_vals[u.arg[0]])   # type: ignore[index]
        raise ValueError(f"variable {u.arg[0]!r} is not bound to a value")
    return int(exec_alu(u.op, u.dtype, [sym_infer(s, var_vals) for s in u.src]))


def iter_nodes(roots: list[UOp]) -> Iterator[UOp]:
    seen: set[UOp] = set()
    for r in roots:
        for n in r.toposort():
            if n not in seen:
                seen.add(n)
                yield n


__all__ = ["Ops", "GroupOp", "UOp", "BindError", "VarVals", "PtrDType", "print_tree", "pretty", "sym_infer", "math"]
