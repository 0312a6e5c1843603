"""Schedule cache: a graph structurally identical to an earlier one reuses its schedule.

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

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from fusegrad.device import Buffer
from fusegrad.dtype import DType
from fusegrad.helpers import ContextVar
from fusegrad.ir.ops import Ops, UOp

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
    done_assigns: frozenset[UOp]       # normalized ASSIGN nodes the schedule runs


SAME, ASSIGNED = -1, -2


def normalize(sink: UOp) -> tuple[UOp, list[UOp], dict[UOp, UOp]]:
    """(the normalized SINK, the real BUFFER node of each placeholder, real node -> normalized node)."""
    norm: dict[UOp, UOp] = {}
    leaves: list[UOp] = []
    uniq = 0
    for n in sink.toposort(gate=lambda u: u.op is not Ops.BUFFER):
        if n.op is Ops.BUFFER:
            norm[n] = UOp(Ops.BUFFER, n.dtype, n.src, (-1 - len(leaves), n.arg[1]))
            leaves.append(n)
            continue
        src = tuple(norm[s] for s in n.src)
        arg = n.arg
        if n.op is Ops.ASSIGN or (n.op is Ops.CONTIGUOUS and type(arg) is int):
            uniq += 1
            arg = -uniq
        norm[n] = n if arg is n.arg and all(a is b for a, b in zip(src, n.src)) else UOp(n.op, n.dtype, src, arg)
    return norm[sink], leaves, norm


def leaf_index(placeholder: UOp) -> int:
    return -1 - placeholder.arg[0]


def flags_key() -> tuple:
    """Every flag's current value: scheduling (SPLIT_REDUCE, SPEC, DEBUG output) may depend on them."""
    return tuple(v.value for v in ContextVar._cache.values())


class ScheduleCache:
    """normalized SINK + flags -> Template, least recently used dropped past CACHE_SIZE."""

    def __init__(self) -> None:
        self._d: OrderedDict[tuple, Template] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple) -> Template | None:
        if (t := self._d.get(key)) is not None:
            self._d.move_to_end(key)
            self.hits += 1
        else: self.misses += 1
        return t

    def put(self, key: tuple, t: Template) -> None:
        self._d[key] = t
        if len(self._d) > CACHE_SIZE: self._d.popitem(last=False)

    def clear(self) -> None: self._d.clear()
    def __len__(self) -> int: return len(self._d)


schedule_cache = ScheduleCache()


def fill_slots(slots: tuple[Slot, ...], leaves: list[UOp]) -> list[Buffer]:
    """This call's buffer for every slot of a template."""
    from fusegrad.storage import buffers
    out: list[Buffer] = []
    for s in slots:
        if s[0] == "leaf": out.append(buffers[leaves[s[1]]])
        elif s[0] == "new": out.append(Buffer(s[1], s[2], s[3]))
        else: out.append(out[s[1]].view(s[2], s[3]))
    return out


def new_slot(slots: list[Slot], device: str, size: int, dtype: DType) -> int:
    slots.append(("new", device, size, dtype))
    return len(slots) - 1
