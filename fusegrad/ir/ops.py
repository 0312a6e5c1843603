"""The IR: the `Ops` enum (grouped by kind, with declared categories) and `UOp`, the one immutable, hash-consed node type.

The same node type serves every level: the lazy tensor graph, kernel ASTs and the linear program.
Because nodes are hash-consed, structural equality is identity: `UOp(...) is UOp(...)` for equal arguments.

`OpMixin` holds the math that a `Tensor` and a tensor-level node share: each method is written once against a few
primitives (`_pair`: two operands broadcast to one shape and dtype; `_alu`: one ALU node; `_binop`: both in one step;
`cast`, `where`, `detach`, `_reduce`) that `Tensor` (with its dtype promotion, checks and autograd) and `UOp`
(tensor-level nodes of one dtype; a Python number takes that dtype, as the Tensor frontend promotes it) each
implement. A composite such as softmax then runs on the nodes of one float tensor and makes the very graph the Tensor steps would make, without a
Tensor per step (the frontend wraps only the result: mixin/alu.py `on_nodes`).
"""
from __future__ import annotations

import functools
import hashlib
import math
import operator
import weakref
from itertools import islice
from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from fusegrad.dtype import ConstType, DType, DTypeLike, PtrDType, dtypes, least_upper_float, reduce_acc_dtype, to_dtype
from fusegrad.ir.shape import broadcast_shape, canonical_shape, infer_shape, sprod   # (shape.py: no module-level
                                                                                    # import of this one)

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


class _Auto:
    """A member of `Ops` still to be made (`auto()` in the class body; numbered in order, from 1)."""


def auto() -> Any: return _Auto()


class OpsType(type):
    """`Ops`' metaclass: an enumeration like `enum.Enum` (iteration, `Ops["ADD"]`, `Ops(value)`, `len`, members
    that are instances, singletons and read-only), whose members are plain class attributes. On Python 3.11,
    `enum.EnumType` defines `__getattr__`, which turns every class attribute lookup such as `Ops.ADD` into a
    Python-level call (~120 ns against ~20 ns): graph building, scheduling and codegen make hundreds of thousands of
    them (an eager MiniLM call spent about a quarter of its time there)."""
    def __new__(mcs, name: str, bases: tuple, ns: dict[str, Any]) -> "OpsType":
        cls = super().__new__(mcs, name, bases, ns)
        members: dict[str, Any] = {}
        for key, v in ns.items():
            if isinstance(v, _Auto):
                m = object.__new__(cls)
                object.__setattr__(m, "name", key)
                object.__setattr__(m, "value", len(members) + 1)
                members[key] = m
                type.__setattr__(cls, key, m)
        type.__setattr__(cls, "_members", members)
        type.__setattr__(cls, "_by_value", {m.value: m for m in members.values()})
        return cls

    def __iter__(cls) -> Iterator[Any]: return iter(cls._members.values())
    def __len__(cls) -> int: return len(cls._members)
    def __contains__(cls, x: Any) -> bool: return isinstance(x, cls)
    def __getitem__(cls, name: str) -> Any: return cls._members[name]
    def __call__(cls, value: Any) -> Any:
        if isinstance(value, cls): return value
        try: return cls._by_value[value]
        except (KeyError, TypeError): raise ValueError(f"{value!r} is not a valid {cls.__name__}") from None
    def __setattr__(cls, key: str, value: Any) -> None:
        if key in cls.__dict__.get("_members", ()): raise AttributeError(f"cannot reassign member {key!r}")
        super().__setattr__(key, value)
    def __delattr__(cls, key: str) -> None:
        if key in cls.__dict__.get("_members", ()): raise AttributeError(f"cannot delete member {key!r}")
        super().__delattr__(key)


class Ops(metaclass=OpsType):
    # --- tensor graph (never reach a kernel) ---
    SINK = auto()               # groups roots: src = roots
    DEVICE = auto()             # arg = device name; source of a BUFFER/CONST/IOTA on the tensor level
    BUFFER = auto()             # a 1-d buffer of arg[1] elements: arg = (unique id, size), src = (DEVICE,)
    COPY = auto()               # copy src to device arg
    CONTIGUOUS = auto()         # ask for src to be materialized
    DETACH = auto()             # stop gradients
    IOTA = auto()               # 0, 1, ..., arg-1 (the tensor-level view of an index); src = (DEVICE,)
    REDUCE_AXIS = auto()        # arg = (reduce op, axes); reduced axes keep size 1
    ASSIGN = auto()             # src = (target buffer view, value), arg = unique id: write value into target's memory
    GATHER = auto()             # src = (x, idx), arg = axis: out[I] = x[I with I[axis] = idx[I]]; 0 where out of range
    MULTI = auto()              # one tensor on several devices: src = one shard per device, arg = the sharded axis
                                # (None: every src holds the whole tensor); schedule/multi.py lowers it per device

    # --- movement: views, folded into index math at codegen ---
    RESHAPE = auto()
    PERMUTE = auto()
    EXPAND = auto()
    PAD = auto()
    SHRINK = auto()
    FLIP = auto()

    # --- kernel structure ---
    PARAM = auto()              # kernel argument buffer; arg = slot
    DEFINE_VAR = auto()         # a symbolic integer; arg = (name, min, max)
    BIND = auto()               # a variable bound to a value, in tensor shapes: src = (DEFINE_VAR, CONST value)
    DEFINE_REG = auto()         # a register array (accumulators); arg = id
    DEFINE_LOCAL = auto()       # workgroup-shared memory; arg = id
    RANGE = auto()              # a loop index; src = (size,), arg = (id, kind)
    SPECIAL = auto()            # a hardware index (thread/group id); src = (size,), arg = name
    REDUCE = auto()             # src = (value, *ranges), arg = the ALU op that accumulates
    INDEX = auto()              # src = (buffer, index) or (buffer, index, gate): the address of one element
    LOAD = auto()               # src = (INDEX,) [, alt value when gated]
    STORE = auto()              # src = (INDEX, value)
    END = auto()                # closes the RANGE in src[1] (linear program)
    IF = auto()
    ENDIF = auto()
    BARRIER = auto()
    VECTORIZE = auto()          # build a vector from scalars
    GEP = auto()                # get element arg of a vector

    # --- values ---
    CONST = auto()
    CAST = auto()
    BITCAST = auto()

    # --- ALU: the primitive math every backend renders ---
    NEG = auto()
    RECIPROCAL = auto()
    SQRT = auto()
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    TRUNC = auto()
    ADD = auto()
    MUL = auto()
    IDIV = auto()               # integer division, truncating toward zero (C semantics)
    MOD = auto()                # integer remainder with the sign of the dividend (C semantics)
    MAX = auto()                # NaN-propagating maximum
    CMPLT = auto()
    CMPNE = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()
    WHERE = auto()
    MULACC = auto()             # a*b+c
    # 8-bit dot products (codegen/dot4.py makes them, only for a renderer that has them: `Renderer.dot4_lanes`):
    # src = (acc int32 x n, a uint8 x 4n, b int8 x 4n); lane i = acc[i] + sum over k < 4 of a[4i+k] * b[4i+k]
    DOT4 = auto()

    __slots__ = ("name", "value")

    def __repr__(self) -> str: return f"Ops.{self.name}"
    __str__ = __repr__
    def __setattr__(self, key: str, value: Any) -> None: raise AttributeError(f"Ops.{self.name} is read-only")
    # hashed and compared by identity (each member is a singleton), in C: every graph operation looks ops up in the
    # GroupOp sets and in rule tables
    # pickled by name, not by the auto() number, so a pickle stays valid when ops are added or reordered
    def __reduce_ex__(self, protocol: Any) -> tuple: return getattr, (Ops, self.name)
    def __copy__(self) -> "Ops": return self
    def __deepcopy__(self, memo: Any) -> "Ops": return self


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
              Ops.GEP, Ops.DOT4} | ALU


class OpMixin:
    """The ops `Tensor` and `UOp` share, each written once against the primitives listed in the module docstring.
    `Tensor` overrides the primitives and the few ops it checks or promotes further (add, mul, comparisons, where,
    reductions, ...); the composites below (sigmoid, tanh, relu, relu6, GELU, softmax, layernorm, exp, log, ...) are
    inherited as they are, so the graph they build is the same on either."""
    __slots__ = ()

    # ----- elementwise arithmetic -----
    def add(self, y: Any, reverse: bool = False) -> Any: return self._binop(Ops.ADD, y, reverse)  # type: ignore
    def mul(self, y: Any, reverse: bool = False) -> Any: return self._binop(Ops.MUL, y, reverse)  # type: ignore
    def sub(self, y: Any, reverse: bool = False) -> Any:
        a, b = self._pair(y, reverse)  # type: ignore[attr-defined]
        return a._alu(Ops.ADD, b.neg())
    def div(self, y: Any, reverse: bool = False) -> Any:
        a, b = self._pair(y, reverse)  # type: ignore[attr-defined]
        if not dtypes.is_float(a.dtype): a, b = a._float_or_self(), b._float_or_self()
        return a._alu(Ops.MUL, b._alu(Ops.RECIPROCAL))
    def neg(self) -> Any: return self._alu(Ops.NEG)  # type: ignore[attr-defined]
    def __add__(self, y: Any) -> Any: return self.add(y)
    def __radd__(self, y: Any) -> Any: return self.add(y, True)
    def __sub__(self, y: Any) -> Any: return self.sub(y)
    def __rsub__(self, y: Any) -> Any: return self.sub(y, True)
    def __mul__(self, y: Any) -> Any: return self.mul(y)
    def __rmul__(self, y: Any) -> Any: return self.mul(y, True)
    def __truediv__(self, y: Any) -> Any: return self.div(y)
    def __rtruediv__(self, y: Any) -> Any: return self.div(y, True)
    def __neg__(self) -> Any: return self.neg()

    # ----- comparisons and masks (named: `==` on a node is identity) -----
    def lt(self, y: Any) -> Any: return self._binop(Ops.CMPLT, y)  # type: ignore[attr-defined]
    def gt(self, y: Any) -> Any: return self._binop(Ops.CMPLT, y, True)  # type: ignore[attr-defined]
    def ne(self, y: Any) -> Any: return self._binop(Ops.CMPNE, y)  # type: ignore[attr-defined]
    def eq(self, y: Any) -> Any: return self.ne(y).logical_not()
    def ge(self, y: Any) -> Any: return self.gt(y) | self.eq(y)   # NaN compares False
    def le(self, y: Any) -> Any: return self.lt(y) | self.eq(y)
    def logical_not(self) -> Any: return self._binop(Ops.CMPNE, True)  # type: ignore[attr-defined]
    def __or__(self, y: Any) -> Any: return self._binop(Ops.OR, y)  # type: ignore[attr-defined]
    def isnan(self) -> Any: return self.ne(self)

    # ----- unary math -----
    def _float_or_self(self) -> Any:
        dt = self.dtype  # type: ignore[attr-defined]
        return self if dtypes.is_float(dt) else self.cast(least_upper_float(dt))  # type: ignore[attr-defined]
    def reciprocal(self) -> Any: return self._float_or_self()._alu(Ops.RECIPROCAL)
    def sqrt(self) -> Any: return self._float_or_self()._alu(Ops.SQRT)
    def rsqrt(self) -> Any: return self.sqrt().reciprocal()
    def exp2(self) -> Any: return self._float_or_self()._alu(Ops.EXP2)
    def log2(self) -> Any: return self._float_or_self()._alu(Ops.LOG2)
    def exp(self) -> Any: return (self._float_or_self() * (1 / math.log(2))).exp2()
    def log(self) -> Any: return self.log2() * math.log(2)
    def sin(self) -> Any: return self._float_or_self()._alu(Ops.SIN)
    def cos(self) -> Any: return ((math.pi / 2) - self._float_or_self()).sin()
    def square(self) -> Any: return self * self

    # ----- reductions (over `_reduce`) -----
    def sum(self, axis: Any = None, keepdim: bool = False) -> Any:
        return self._reduce(Ops.ADD, axis, keepdim)  # type: ignore[attr-defined]
    def max(self, axis: Any = None, keepdim: bool = False) -> Any:
        return self._reduce(Ops.MAX, axis, keepdim)  # type: ignore[attr-defined]
    def mean(self, axis: Any = None, keepdim: bool = False) -> Any:
        s = self.sum(axis, keepdim)
        return s * (1 / (sprod(self.shape) // max(sprod(s.shape), 1)))  # type: ignore[attr-defined,operator]

    # ----- composites -----
    def relu(self) -> Any:
        """max(x, 0) of a float: relu(NaN) is NaN, relu'(0) = 0."""
        return (self.gt(0) | self.ne(self)).where(self, 0)  # type: ignore[attr-defined]

    def relu6(self) -> Any: return self.ge(6).where(6, self.relu())

    def sigmoid(self) -> Any:
        # one exp of -|x| (it can't overflow, so values and gradients never meet inf*0): 1 / (1 + e) for x >= 0 and
        # e / (1 + e) below, the same roundings as an exp and a division per branch (SiLU's kernels did both branches'
        # exps and divisions for every value)
        x = self._float_or_self()
        pos = x.ge(0)
        e = pos.where(-x, x).exp()
        return pos.where(1, e) / (1 + e)

    def tanh(self) -> Any: return 2.0 * (2.0 * self._float_or_self()).sigmoid() - 1.0

    def _gelu_tanh(self) -> Any:
        return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())

    def _layernorm(self, axis: Any, eps: float) -> Any:
        y = self - self.mean(axis, keepdim=True)
        return y.mul((y * y).mean(axis, keepdim=True).add(eps).rsqrt())

    def _softmax_parts(self, axis: int, dtype: DTypeLike | None) -> Any:
        x = self.cast(to_dtype(dtype)) if dtype is not None else self._float_or_self()  # type: ignore[attr-defined]
        m = x - x.max(axis=axis, keepdim=True).detach()
        e = m.exp()
        return m, e, e.sum(axis=axis, keepdim=True)

    def _softmax(self, axis: int, dtype: DTypeLike | None) -> Any:
        _, e, ss = self._softmax_parts(axis, dtype)
        return e.div(ss)

    def _log_softmax(self, axis: int, dtype: DTypeLike | None) -> Any:
        m, _, ss = self._softmax_parts(axis, dtype)
        return m - ss.log()


# ---------------------------------------------------------------------------------------------------------------------

# (op, dtype, arg, ids of src...) -> a weak reference to the node (the key: UOpMetaClass.__call__). A plain dict of plain
# references, without callbacks: weakref.WeakValueDictionary costs a quarter of building a node (Python-level get, set
# and keyed references), and a callback per reference that drops its entry costs a Python call per node that dies
# (every node of every eager graph, after its realize) and a partial per node made. An entry whose node died stays
# until a sweep (`_sweep`), and a lookup that finds it dead makes the node anew. A dead entry is harmless: its key
# holds no node (see the metaclass), and the ids in it are of nodes that died too, so an id reused by a new node gives
# a new node.
_ucache: dict[tuple, "weakref.ref[UOp]"] = {}
_UCACHE_MIN = 1 << 14   # new entries between two sweeps (and the size of the middle generation, see `_sweep`)
_ucache_limit = _UCACHE_MIN
_gen = {"swept": 0, "middle": 0, "old_added": 0, "old_live": 0}   # `_sweep`'s generation sizes
# (ops the per-node paths test, bound once: a global instead of a global and an attribute lookup per test)
_CONST, _DETACH, _ASSIGN, _DEVICE, _COPY, _MULTI = Ops.CONST, Ops.DETACH, Ops.ASSIGN, Ops.DEVICE, Ops.COPY, Ops.MULTI
_RESHAPE, _EXPAND = Ops.RESHAPE, Ops.EXPAND
_new, _ref = object.__new__, weakref.ref
_CUSTOM = object()   # in a custom backward's key (a DETACH with a GradFn) where a plain DETACH has its arg, None
# every live ASSIGN node: a realize with none pending anywhere skips looking for writes in its graph (views.py)
live_assigns: "weakref.WeakSet[UOp]" = weakref.WeakSet()


class UOpMetaClass(type):
    """Hash-consing: constructing a UOp with the same (op, dtype, src, arg) returns the existing node."""

    def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple["UOp", ...] = (), arg: Any = None) -> "UOp":
        # The key holds no node and no custom backward: the sources by identity (the live node holds them, so their
        # ids are theirs while the entry exists) and a custom backward (DETACH's arg) by identity too. A key holding
        # them would keep them alive from this global, and through them anything they reach: a custom backward's
        # closure holds tensors (a BatchNorm module, its weight), whose graphs (an optimizer step's pending write)
        # hold the nodes above it, and so on, so a whole finished training program stayed in memory.
        # The sources' ids are the key's last items (their count is the key's length less 3: less 4 for a CONST, which
        # has the signs of its zeros, and for a custom backward, its id), not a tuple of their own: one object fewer
        # per node made, for the allocator and for the garbage collector, which counts every tuple until a
        # collection finds it holds no container. (Spelled out for the usual one or two sources.)
        if op is _CONST: key = (op, dtype, arg, zero_signs(arg), *map(id, src))
        elif op is _DETACH and arg is not None: key = (op, dtype, _CUSTOM, id(arg), *map(id, src))
        elif (ns := len(src)) == 1: key = (op, dtype, arg, id(src[0]))
        elif ns == 2: key = (op, dtype, arg, id(src[0]), id(src[1]))
        else: key = (op, dtype, arg, *map(id, src))
        if (ref := _ucache.get(key)) is not None and (ret := ref()) is not None: return ret
        # (UOp.__init__'s work without its Python frame: one per node built)
        ret = _new(cls)
        ret.op, ret.dtype, ret.src, ret.arg = op, dtype, src, arg
        _ucache[key] = _ref(ret)
        if len(_ucache) > _ucache_limit: _sweep()
        if op is _ASSIGN: live_assigns.add(ret)
        return ret


def zero_signs(arg: Any) -> Any:
    """What an equality test can't see in a constant: -0.0 == 0.0 in Python, so a key of (op, dtype, src, arg) alone
    made `x * 0.0` the very node of a live `x * -0.0` (and `1 / that` -inf instead of inf). None for most constants;
    for a float zero (or a tuple of constants holding one) the signs of its zeros."""
    if arg.__class__ is float: return None if arg != 0.0 else math.copysign(1.0, arg) < 0
    if arg.__class__ is tuple and any(a.__class__ is float and a == 0.0 for a in arg):
        return tuple(a.__class__ is float and a == 0.0 and math.copysign(1.0, a) < 0 for a in arg)
    return None


def _sweep(whole: bool = False, _remove: Any = _remove_dead_weakref) -> None:
    """Drop the entries of dead nodes from the hash-consing table, by generation, so that the dead entries it holds
    are bounded by a constant and not by the number of live nodes (a table that was swept when it had doubled held as
    many dead entries as live ones: in a process holding a million nodes in caches, an eager training loop grew RSS by
    10 MB before the next sweep).

    The dict keeps insertion order and nothing else deletes, so the newest entries are its tail: the entries made since
    the last sweep (the young generation, `_UCACHE_MIN` of them) come last, before them the middle generation (entries
    that outlived one sweep), before that the old ones. Each sweep checks the young tail; survivors join the middle
    generation, which is checked once it holds `_UCACHE_MIN` entries (most nodes of an eager step are dead by then);
    its survivors join the old generation, checked whole once as many entries joined it as were alive at its last
    check (amortized O(1) per node made, and rare: few nodes outlive two sweeps). A dead entry overwritten in place by
    its key's new node stays where it was, in whichever generation that is: swept with it.

    The dead ones are found by reading the keys and the values as two lists (`_last_entries`), which hashes nothing.
    Nodes may be made meanwhile, by other threads (codegen in the compile pool) or by this one (a list made can start
    a garbage collection, which runs callbacks and finalizers): a read that sees the table change starts over on a
    copy, and `_remove_dead_weakref` deletes an entry only while it is still a dead reference (not a newer node's).
    `whole=True` checks every entry now."""
    global _ucache_limit
    young = len(_ucache) - _gen["swept"]
    tail = young + _gen["middle"] if _gen["middle"] + young > _UCACHE_MIN else young
    whole = whole or _gen["old_added"] > max(_gen["old_live"], _UCACHE_MIN)
    n = len(_ucache) if whole else tail
    try:
        size = len(_ucache)
        keys, refs = _last_entries(_ucache, n)
        if len(_ucache) != size: raise RuntimeError("changed between the two passes")
    except RuntimeError:   # the table changed size during the iteration: check a copy (dict.copy runs no Python code)
        keys, refs = _last_entries(_ucache.copy(), n)
    dead = [k for k, r in zip(keys, refs) if r() is None]
    for k in dead: _remove(_ucache, k)
    survivors = len(keys) - len(dead)
    if whole: _gen.update(middle=0, old_added=0, old_live=len(_ucache))
    elif tail > young: _gen.update(middle=0, old_added=_gen["old_added"] + survivors)
    else: _gen["middle"] += survivors
    _gen["swept"] = len(_ucache)
    _ucache_limit = len(_ucache) + _UCACHE_MIN


def _last_entries(table: dict, n: int) -> tuple[list, list]:
    """The keys and the values of the last n entries of `table` (newest first), as two lists of the objects the table
    holds: no (key, value) tuple per entry. A tuple per entry made 16k container objects per sweep, each counted
    toward the next garbage collection: 200 eager MiniLM 2x13 calls with torch imported spent 1.04 s in sweeps, two
    full collections (0.73 s) among it; 0.24 s and none without the tuples."""
    if n >= len(table): return list(table), list(table.values())
    return list(islice(reversed(table), n)), list(islice(reversed(table.values()), n))


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


class UOp(OpMixin, metaclass=UOpMetaClass):
    """An IR node. Immutable; identity is structure (hash-consed), so nodes are usable as dict keys."""
    __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")

    # (no __init__: the metaclass sets the four fields of a new node itself)

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
        if (op := self.op) is _DEVICE or op is _COPY: return self.arg
        if op is _MULTI: return tuple(str(s.device) for s in self.src)
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

    # ----- OpMixin's primitives: arithmetic on nodes (`x * 2 + y` in index math and rules; composites on tensor nodes)
    def _pair(self, y: "UOp | ConstType", reverse: bool = False) -> tuple["UOp", "UOp"]:
        """(self, y) as two operands of one ALU node (swapped if `reverse`). A Python number becomes a constant of
        self's dtype: a scalar for a kernel-level or symbolic value (shape None), else a tensor constant on self's
        device at self's shape, as the Tensor frontend makes it. Two tensor-level nodes of one dtype broadcast to one
        shape (`broadcast_shape`); nodes don't promote dtypes (a Tensor does)."""
        s, cls = self.shape, y.__class__
        if cls is UOp:
            b: UOp = y  # type: ignore[assignment]
            if s is not None and (bs := b.shape) != s:
                if b.dtype != self.dtype: raise TypeError(f"node operands of {self.dtype} and {b.dtype}: cast first")
                if bs is None: raise TypeError(f"a tensor-level node of shape {s} with a scalar node {b.op}")
                shape = broadcast_shape(bs, s) if reverse else broadcast_shape(s, bs)
                return (b.broadcast_to(shape), self.broadcast_to(shape)) if reverse else \
                    (self.broadcast_to(shape), b.broadcast_to(shape))
        elif s is None: b = UOp.const(self.dtype, y)  # type: ignore[arg-type]
        elif cls is float or cls is int or cls is bool: b = tensor_const(y, self.dtype, self.device, s)  # type: ignore
        else: raise TypeError(f"unsupported operand type {type(y).__name__} for a node")
        return (b, self) if reverse else (self, b)

    def _alu(self, op: Ops, *srcs: "UOp", _cmp: frozenset = frozenset(GroupOp.Comparison)) -> "UOp":
        n = UOp(op, dtypes.bool if op in _cmp else self.dtype, (self,) + srcs)
        # a tensor-level node of operands of one shape (OpMixin's: after `_pair`) gets its shape and device now
        if (s := self.shape) is not None and "shape" not in (d := n.__dict__) and (dev := self.device) is not None:
            for x in srcs:
                if (xs := x.shape) is not s and xs != s: break
            else: d["shape"], d["device"] = s, dev
        return n

    def _binop(self, op: Ops, y: "UOp | ConstType", reverse: bool = False,
               _cmp: frozenset = frozenset(GroupOp.Comparison)) -> "UOp":
        """`_alu(op)` of the `_pair` (one step: most node arithmetic is this). The common tensor-level cases, a number
        or a node of the same shape, without the `_pair` call."""
        if (s := self.shape) is not None and ((cls := y.__class__) is float or cls is int or cls is bool):
            b = tensor_const(y, self.dtype, dev := self.device, s)  # type: ignore[arg-type]
            return node_of_shape(op, dtypes.bool if op in _cmp else self.dtype, (b, self) if reverse else (self, b),
                                 None, s, dev)
        a, b = self._pair(y, reverse)
        if s is not None and (dev := a.device) is not None:   # (a tensor-level pair: broadcast to one shape)
            return node_of_shape(op, dtypes.bool if op in _cmp else a.dtype, (a, b), None, a.shape, dev)
        return UOp(op, dtypes.bool if op in _cmp else a.dtype, (a, b))

    def __sub__(self, x: "UOp | ConstType") -> "UOp":
        # a kernel-level value minus a number adds its negation (one constant, as index math has always built it)
        return self.alu(Ops.ADD, -x) if self.shape is None and not isinstance(x, UOp) else self.sub(x)
    def __floordiv__(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.IDIV, x)
    def __mod__(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.MOD, x)
    def neg(self) -> "UOp": return self * -1 if dtypes.is_int(self.dtype) else self._alu(Ops.NEG)
    def maximum(self, x: "UOp | ConstType") -> "UOp": return self.alu(Ops.MAX, x)
    def logical_and(self, x: "UOp") -> "UOp": return self.alu(Ops.AND, x)

    def where(self, a: "UOp | ConstType", b: "UOp | ConstType") -> "UOp":
        if self.shape is None:   # kernel level
            av = _as_uop(a, b.dtype if isinstance(b, UOp) else dtypes.int32)
            return UOp(Ops.WHERE, av.dtype, (self, av, _as_uop(b, av.dtype)))
        if self.dtype != dtypes.bool: raise TypeError(f"where needs a bool condition node, got {self.dtype}")
        if a.__class__ is UOp: a, b = a._pair(b)  # type: ignore[union-attr]
        elif b.__class__ is UOp: b, a = b._pair(a)  # type: ignore[union-attr]
        else: raise TypeError("a tensor-level where needs a node for a or b")
        if (s := self.shape) != (xs := a.shape):  # type: ignore[union-attr]
            s = broadcast_shape(s, xs)  # type: ignore[arg-type]
            return UOp(Ops.WHERE, b.dtype, (self.broadcast_to(s), a.broadcast_to(s), b.broadcast_to(s)))  # type: ignore
        if (dev := self.device) is None: return UOp(Ops.WHERE, b.dtype, (self, a, b))  # type: ignore[union-attr]
        return node_of_shape(Ops.WHERE, b.dtype, (self, a, b), None, s, dev)  # type: ignore[union-attr,arg-type]

    def detach(self) -> "UOp": return UOp(Ops.DETACH, self.dtype, (self,))

    def _reduce(self, op: Ops, axis: Any, keepdim: bool) -> "UOp":
        """A reduction as the Tensor frontend makes it for a float of one dtype: reducing only size-1 axes is a new
        value (x + 0.0 for a sum: a sum starts from +0.0), and axes that are gone unless `keepdim`."""
        s = self.shape
        assert s is not None, "reduce of a kernel-level node"
        n = len(s)
        if axis is None: axes: tuple = tuple(range(n))
        else:
            axes = tuple(a + n if a.__class__ is int and -n <= a < 0 else a for a in ((axis,) if axis.__class__ is int
                                                                                      else axis))
            if n == 0 and axes in ((0,), (-1,)): axes = ()
            if any(a.__class__ is not int or not 0 <= a < n for a in axes) or len(set(axes)) != len(axes):
                raise IndexError(f"reduce axes {axis} for shape {s}")
        if any(s[a] == 0 for a in axes): raise ValueError(f"reduce over an empty axis of {s}")
        if any(s[a] != 1 for a in axes): out = self.reduce_axis(op, axes)
        elif op is Ops.ADD and dtypes.is_float(self.dtype): out = self + 0.0
        else: out = self
        return out if keepdim else out.reshape(tuple(d for i, d in enumerate(s) if i not in axes))

    # ----- tensor-level constructors (ir/build.py names them for the frontend and the gradient rules) -----
    def reshape(self, shape: "Sequence[int | UOp]") -> "UOp":
        shape = canonical_shape(shape)
        return self if self.shape == shape else UOp(Ops.RESHAPE, self.dtype, (self,), shape)

    def expand(self, shape: "Sequence[int | UOp]") -> "UOp":
        shape = canonical_shape(shape)
        return self if self.shape == shape else UOp(Ops.EXPAND, self.dtype, (self,), shape)

    def broadcast_to(self, shape: tuple) -> "UOp":
        """This node reshaped to the rank of `shape` (leading 1s), then expanded to it."""
        s = self.shape
        if s == shape: return self
        return self.reshape((1,) * (len(shape) - len(s)) + s).expand(shape)  # type: ignore[arg-type,operator]

    def reduce_axis(self, op: Ops, axes: "Sequence[int]") -> "UOp":
        """Reduce `axes` with `op`. A sum or product of a float narrower than float32 accumulates in float32 and is
        rounded back once (`reduce_acc_dtype`): every tensor-graph reduce is made here, so the gradient of a broadcast
        (a bias's: the sum over the batch), a split reduce's partials and a convolution's weight gradient all follow
        the rule that sum() does."""
        assert op in GroupOp.Reduce and self.shape is not None
        shape = self.shape
        axes = tuple(sorted(a for a in axes if shape[a] != 1))
        if not axes: return self
        if op is not Ops.MAX and (acc := reduce_acc_dtype(self.dtype)) != self.dtype:
            return self.cast(acc).reduce_axis(op, axes).cast(self.dtype)
        if any(shape[a] == 0 for a in axes):  # reducing nothing gives the identity
            assert self.device is not None
            ident = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(self.dtype)}[op]
            kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
            return tensor_const(ident, self.dtype, self.device, kept)
        return UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes))

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


# (value, its type, the sign of a float zero, dtype, device, shape) -> the constant's node: plain numbers at static
# shapes, the constants of every elementwise op with a Python scalar (three nodes each, built again on every eager
# call otherwise). The entries keep their nodes alive; cleared when full, so it stays small
_consts: dict[tuple, UOp] = {}
_CONSTS_MAX = 4096


def tensor_const(val: "ConstType | UOp", dtype: DType, device: str | tuple[str, ...], shape: tuple = ()) -> UOp:
    """A tensor constant broadcast to `shape` (`build.const`). `val` may be a symbolic int (a bound Variable, or an
    expression of one): the kernel then reads the variable's value. A tuple of devices makes it for each of them."""
    if ((cls := val.__class__) is float or cls is int or cls is bool) and shape.__class__ is tuple:
        key = (val, cls, cls is float and val == 0.0 and math.copysign(1.0, val) < 0, dtype, device, shape)
        if (ret := _consts.get(key)) is not None: return ret
        if all(s.__class__ is int for s in shape):
            ret = _tensor_const(val, dtype, device, shape)
            if len(_consts) >= _CONSTS_MAX: _consts.clear()
            _consts[key] = ret
            return ret
    return _tensor_const(val, dtype, device, shape)


def _tensor_const(val: "ConstType | UOp", dtype: DType, device: str | tuple[str, ...], shape: tuple) -> UOp:
    arg = val if isinstance(val, UOp) else dtypes.as_const(val, dtype)
    if not all(d.__class__ is int for d in shape):
        c = UOp(Ops.CONST, dtype, (UOp(Ops.DEVICE, arg=device),), arg)
        return c.reshape((1,) * len(shape)).expand(shape) if shape else c
    # a static shape: the nodes `reshape` and `expand` make, with the shapes their checks would pass
    c = node_of_shape(_CONST, dtype, (UOp(_DEVICE, arg=device),), arg, (), device)
    if not shape: return c
    r = node_of_shape(_RESHAPE, dtype, (c,), ones := (1,) * len(shape), ones, device)
    return r if ones == shape else node_of_shape(_EXPAND, dtype, (r,), shape, shape, device)


def node_of_shape(op: Ops, dtype: DType, src: tuple[UOp, ...], arg: Any, shape: tuple | None,
                  device: str | tuple[str, ...] | None) -> UOp:
    """UOp(op, dtype, src, arg) for a caller that knows the node's shape and device, which are stored with it: the
    values the `shape` and `device` properties would compute on first use (about 1 us a node). Only where they are
    sure: an elementwise node of operands of that one shape, a constant's reshape and expand of a static shape."""
    n = UOp(op, dtype, src, arg)
    if "shape" not in (d := n.__dict__): d["shape"], d["device"] = shape, device
    return n


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


__all__ = ["Ops", "GroupOp", "OpMixin", "UOp", "tensor_const", "node_of_shape", "BindError", "VarVals", "PtrDType",
           "print_tree", "pretty", "sym_infer", "math"]
