"""Schedule cache: a graph structurally identical to an earlier one reuses its schedule. (It keeps no values, so the
one rule of caches, docs/architecture.md "Caches and captures: one rule", holds trivially: buffers are placeholders.)

The scheduler's work (splitting reduces, lowering every kernel by index propagation, ordering, memory planning) depends
only on the graph's structure, never on which memory its BUFFER nodes name or on the values of bound variables. So
`create_schedule` first rewrites the graph into a *normalized* form and schedules that:

- every BUFFER node becomes a placeholder BUFFER with the same dtype, size and device and the id `-1 - k`, k counting
  the distinct buffers in walk order (two reads of one buffer stay one placeholder, two buffers stay two);
- the unique ids of ASSIGN and tagged CONTIGUOUS nodes are renumbered the same way;
- bound variables were already unbound (variables.py), their values travel next to the schedule.

Normalized nodes are hash-consed, so two graphs with the same structure give the very same normalized SINK: that node
(plus every flag's value) is the cache key, compared by identity, so there are no hash collisions to fear. The cached
`Template` names buffers by slot (a placeholder's buffer, a fresh output, a view into a planned intermediate), and
`instantiate` fills the slots with this call's buffers. A hit and a miss therefore run the same instantiation of the
same template: the cache can't serve a schedule that a miss would not have built. What a graph reads from earlier
realizes (cached results, the stale-assign check) is resolved *before* normalizing, on the real graph, every call.
`SCHEDULE_CACHE=0` turns the cache off.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fusegrad.device import Buffer
from fusegrad.dtype import DType
from fusegrad.helpers import ContextVar
from fusegrad.ir.ops import GroupOp, Ops, UOp, zero_signs
from fusegrad.schedule.variables import Unbinder, has_uop
from fusegrad.storage import buffers

CACHE_SIZE = 1024   # templates kept (least recently used dropped first)

# a slot: ("leaf", k) the buffer of placeholder k; ("new", device, size, dtype) a fresh buffer;
# ("view", base slot, size, dtype) a view at offset 0 of an earlier slot's buffer (memory planning)
Slot = tuple[Any, ...]


@dataclass(frozen=True)
class Template:
    """A schedule with its buffers as slots (see module docstring)."""
    slots: tuple[Slot, ...]
    items: tuple[tuple[UOp, tuple[int, ...], tuple[str, ...], bool], ...]  # (ast, slot per buffer, tensor ops, inplace)
    results: tuple[int, ...]           # per target: a slot holding its value, SAME (it is a view already), ASSIGNED
    done_assigns: frozenset[int]       # positions (in the key) of the ASSIGN nodes the schedule runs
    relayouts: tuple[tuple[int, int], ...] = ()   # (position, slot): relayouts of buffers, kept (storage.py)


SAME, ASSIGNED = -1, -2
BUFFER = Ops.BUFFER.value   # ops are keyed by their number: plain data like the rest of the key (see normalize)


@dataclass
class Normalized:
    key: tuple     # the normalized graph as plain data: per node (op's value, dtype, arg, source positions)
    leaves: list[UOp]              # the real BUFFER node of each placeholder
    pos: dict[UOp, int]            # real node -> its position in `key`, for every node walked
    var_vals: dict[UOp, int]       # the values of the bound variables
    aliases: dict[UOp, UOp]        # a variable standing for a further value of another -> that one (variables.py)
    checks: tuple[tuple, ...]      # slice bounds that hold for some values only (variables.py), unbound
    assigns: list[UOp]             # the real ASSIGN nodes the graph still has to run
    # the walk read the graph as it is: no node replaced by a value computed before, no custom backward stripped, no
    # ASSIGN. Then the real BUFFER nodes below the SINK are exactly `leaves` (what storage.reads_split walks for)
    as_is: bool = True

    def graph(self) -> list[UOp]:
        """The normalized graph's nodes in key order, the SINK last (built on a miss only; see `normalize` for why
        the key is not nodes)."""
        nodes: list[UOp] = []
        for opv, dtype, arg, src, *_ in self.key:   # (a fifth item: the signs of a constant's zeros, in `arg` already)
            op = Ops(opv)
            if op is Ops.BUFFER:   # arg: (placeholder id, size, device)
                n = UOp(Ops.BUFFER, dtype, (UOp(Ops.DEVICE, arg=arg[2]),), arg[:2])
            else: n = UOp(op, dtype, tuple(nodes[i] for i in src), arg)
            n.shape, n.device   # noqa: B018 - children first: a deep new graph must not recurse on its first use
            nodes.append(n)
        return nodes


# ops whose arg `one` rewrites (unique ids renumbered, variables unbound): not taken by normalize's inline path
_SPECIAL_ARGS = {Ops.ASSIGN, Ops.CONTIGUOUS, Ops.CONST, Ops.IOTA}
# movement args seen to hold no UOp (plain ints): skips has_uop for the same arg next time. Only such args go in (a
# symbolic one could keep its variables alive); cleared when full, so it stays small. The key holds the one object
# stored here for each value: a cache hit compares this call's key with the stored one, which after the kernels ran is
# out of the CPU caches, and the same arg object on both sides is equal without reading its items
_plain_args: dict = {}
_PLAIN_ARGS_MAX = 1 << 14


_PLAIN_CONSTS = frozenset({int, bool})   # constant classes the key takes as they are (a float unless it is a zero)


def _not_buffer(u: UOp) -> bool: return u.op is not Ops.BUFFER
def _always(_: Any) -> bool: return True


_ALL_OPS = frozenset(Ops)
_EXPANDED = object()   # normalize's stack marker: the node below it has had its sources pushed
# ops whose arg the key takes as it is (normalize's last branch): none of the kinds the walk looks at more closely
_ARG_AS_IS = _ALL_OPS - GroupOp.Movement - _SPECIAL_ARGS - {Ops.BUFFER, Ops.DETACH}


def normalize(sink: UOp, cached: Callable[[UOp], UOp | None], executed: Any,
              maybe_cached: tuple[Callable[[Any], Any], frozenset[Ops], frozenset[Ops]] | None = None) -> Normalized:
    """One walk over the graph to realize, stopping at BUFFERs and at nodes computed before (`cached(n)`: the buffer
    view holding n's value, read instead). It writes down the normalized graph (module docstring) as a tuple of
    (op, dtype, arg, source positions), children first, and on the way strips custom backwards (DETACH with a GradFn is
    its forward value; its other sources are not walked) and unbinds variables (variables.py). Raises when the graph
    would run an ASSIGN again (`executed`) whose result was dropped from the cache because its memory was written since.
    `maybe_cached` (storage.CACHED_VALUE_FILTER): a lookup by weak reference and two sets of ops such that `cached(n)`
    is None wherever the lookup gives None and n's op is not in the first set or its first source's op not in the
    second (a relayout reads movement ops of a buffer); it saves a Python call per node.

    The key is plain data, not nodes, on purpose: a normalized node without buffers below it (a constant's
    `.contiguous()`) *is* the real node, and a key that kept it alive would keep its entry in the result cache alive,
    so the next `Tensor.zeros(n).contiguous()` would be handed the earlier one's memory."""
    ub = Unbinder()
    pos: dict[UOp, int] = {}
    enc: list[tuple] = []
    leaves: list[UOp] = []
    assigns: list[UOp] = []
    uniq = 0
    as_is = True

    def one(x: UOp) -> None:   # x's sources have positions already
        nonlocal uniq, as_is
        if x.op is Ops.BUFFER:
            pos[x] = len(enc)
            enc.append((BUFFER, x.dtype, (-1 - len(leaves), x.arg[1], x.src[0].arg), ()))
            leaves.append(x)
            return
        if x.op is Ops.DETACH and x.arg is not None:   # a custom backward: only its value is computed
            pos[x] = pos[x.src[0]]
            as_is = False
            return
        arg = x.arg
        if x.op is Ops.ASSIGN or (x.op is Ops.CONTIGUOUS and type(arg) is int):
            uniq += 1
            arg = -uniq
        elif (x.op in GroupOp.Movement or x.op in (Ops.CONST, Ops.IOTA)) and has_uop(arg): arg = ub.node_arg(x)
        pos[x] = len(enc)
        if x.op is Ops.CONST and (signs := zero_signs(arg)) is not None:   # -0.0 == 0.0: the sign goes in the key too
            enc.append((x.op.value, x.dtype, arg, tuple(pos[s] for s in x.src), signs))
        else: enc.append((x.op.value, x.dtype, arg, tuple(pos[s] for s in x.src)))

    # the loop below runs for every node of every graph realized: locals instead of globals and attribute lookups,
    # and the common node kinds encoded inline (`one` keeps the rare ones)
    movement, buffer_op, detach_op, assign_op, special = GroupOp.Movement, Ops.BUFFER, Ops.DETACH, Ops.ASSIGN, \
        _SPECIAL_ARGS
    plain, gate = _plain_args, _not_buffer
    plain_get = plain.get
    rget, cached_ops, cached_src_ops, wref = \
        (maybe_cached if maybe_cached is not None else (_always, _ALL_OPS, _ALL_OPS)) + (weakref.ref,)
    contiguous_op, const_op, plain_consts, as_they_are = Ops.CONTIGUOUS, Ops.CONST, _PLAIN_CONSTS, _ARG_AS_IS
    # the stack holds nodes to visit; a node whose sources were pushed sits below the marker `_EXPANDED`, so when the
    # marker comes back up its sources have positions and the node is encoded (no (node, flag) tuple made and unpacked
    # per push)
    expanded_mark = _EXPANDED
    push, pop, append = (stack := [sink]).append, stack.pop, enc.append
    while stack:
        if (n := pop()) is expanded_mark:   # (a DAG: a node is expanded once, and nothing below it gives it a position)
            n = pop()
            op, src = n.op, n.src
            if op in as_they_are: arg = n.arg   # (the most common kinds: ALU ops, reduces, casts, ... one set lookup)
            elif op in movement:
                if (arg := plain_get(n.arg)) is None:   # (a hash of ints, in C; has_uop is a Python call per node)
                    if has_uop(arg := n.arg):
                        one(n)
                        continue
                    if len(plain) >= _PLAIN_ARGS_MAX: plain.clear()
                    plain[arg] = arg
            elif op is contiguous_op and n.arg is None: arg = None   # (a tagged one is renumbered by `one`)
            # a number with nothing hidden from ==: no symbolic value to unbind, no zero whose sign to key
            elif op is const_op and ((arg := n.arg).__class__ in plain_consts or (arg.__class__ is float and arg)): pass
            elif op is buffer_op or op is detach_op or op in special:
                one(n)
                continue
            else: arg = n.arg
            pos[n] = len(enc)
            # (one and two sources spelled out: a list comprehension is a frame of its own in Python 3.11)
            append((op.value, n.dtype, arg, (pos[src[0]],) if (ns := len(src)) == 1 else
                    (pos[src[0]], pos[src[1]]) if ns == 2 else tuple([pos[s] for s in src])))
            continue
        if n in pos: continue
        op, src = n.op, n.src
        # computed before: read its buffer. (`cached` is called only where `maybe_cached` can't rule a node out)
        if n is not sink and (rget(wref(n)) is not None or (op in cached_ops and src[0].op in cached_src_ops)) \
                and (r := cached(n)) is not None:
            as_is = False
            for x in r.toposort(gate=gate):
                if x not in pos: one(x)
            pos[n] = pos[r]
            continue
        if op is buffer_op:   # a leaf: nothing below it to walk
            one(n)
            continue
        if op is assign_op:
            if n in executed:
                raise RuntimeError(f"a graph reads the result of an assign (ASSIGN #{n.arg}) whose memory a later "
                                   "in-place write has changed since: its old value is gone. Realize (or .clone()) a "
                                   "value before writing to the memory it depends on")
            assigns.append(n)
            as_is = False
        push(n)
        push(expanded_mark)
        # (one and two sources spelled out: no iterator made for them)
        if (ns := len(src)) == 1:
            if (s := src[0]) not in pos: push(s)
        elif ns == 2 and op is not detach_op:   # (a custom backward's DETACH walks its first source only)
            if (s := src[1]) not in pos: push(s)
            if (s := src[0]) not in pos: push(s)
        else:
            for s in reversed(src[:1] if op is detach_op and n.arg is not None else src):
                if s not in pos: push(s)
    ub.check_bound()
    return Normalized(tuple(enc), leaves, pos, ub.var_vals, {a: v for (v, _), a in ub.aliases.items()},
                      tuple(ub.checks), assigns, as_is)


def leaf_index(placeholder: UOp) -> int:
    return -1 - placeholder.arg[0]


def flags_key() -> tuple:
    """Every flag's current value: scheduling (SPLIT_REDUCE, SPEC, DEBUG output) may depend on them."""
    return tuple(v.value for v in ContextVar._cache.values())


class _Key:
    """A cache key that hashes its tuple once: a lookup and the LRU move would each hash the whole graph again (a tuple
    does not keep its hash). Equal when the tuples are."""
    __slots__ = ("t", "h")

    def __init__(self, t: tuple) -> None: self.t, self.h = t, hash(t)
    def __hash__(self) -> int: return self.h
    def __eq__(self, other: object) -> bool:
        return self is other or (type(other) is _Key and self.h == other.h and self.t == other.t)


class ScheduleCache:
    """normalized SINK + flags -> Template, least recently used dropped past CACHE_SIZE."""

    def __init__(self) -> None:
        # each entry holds its own key too: moving it to the end by that very object skips a second deep compare
        self._d: OrderedDict[_Key, tuple[_Key, Template]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple) -> Template | None:
        if (e := self._d.get(_Key(key))) is None:
            self.misses += 1
            return None
        self._d.move_to_end(e[0])
        self.hits += 1
        return e[1]

    def put(self, key: tuple, t: Template) -> None:
        k = _Key(key)
        self._d[k] = (k, t)
        if len(self._d) > CACHE_SIZE: self._d.popitem(last=False)

    def clear(self) -> None: self._d.clear()
    def __len__(self) -> int: return len(self._d)


schedule_cache = ScheduleCache()


def fill_slots(slots: tuple[Slot, ...], leaves: list[UOp]) -> list[Buffer]:
    """This call's buffer for every slot of a template."""
    out: list[Buffer] = []
    for s in slots:
        if s[0] == "leaf": out.append(buffers[leaves[s[1]]])
        elif s[0] == "new": out.append(Buffer(s[1], s[2], s[3]))
        else: out.append(out[s[1]].view(s[2], s[3]))
    return out


def new_slot(slots: list[Slot], device: str, size: int, dtype: DType) -> int:
    slots.append(("new", device, size, dtype))
    return len(slots) - 1
