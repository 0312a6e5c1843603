"""Scheduler: the tensor graph to realize -> an ordered list of kernels and copies (ScheduleItems) with their buffers.

Fusion is decided by *realize points*: the nodes that get a buffer. Everything between realize points is fused into the
kernel of the realize point that consumes it. Realize points are the requested tensors, CONTIGUOUS, COPY and its source,
any reduce the indexer reports as unsafe to fuse (see indexing.py), a reduce consumed by several kernels, and an
expensive subgraph that fusing would recompute many times (see recompute.py). Before that, a long reduce into few
outputs is split into two (split.py: its partial sums are a CONTIGUOUS, so a realize point).
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

from fusegrad.device import Buffer
from fusegrad.helpers import DEBUG, REFERENCE, SCHEDULE_CACHE, SPEC
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute_memo
from fusegrad.ir import spec   # (spec.verify_tensor_graph at call time: tests count the calls)
from fusegrad.runtime import ops_disk
from fusegrad.schedule.cache import ASSIGNED, SAME, Slot, Template, fill_slots, flags_key, leaf_index, new_slot, \
    normalize, schedule_cache
from fusegrad.schedule.disk import lower_disk
from fusegrad.schedule.indexing import check_index_range, lower_kernel
from fusegrad.schedule.memory import plan_memory
from fusegrad.schedule.multi import has_multi, lower_multi
from fusegrad.schedule.recompute import RecomputePolicy
from fusegrad.schedule.split import split_reduces
from fusegrad.ir.shape import smax
from fusegrad.storage import CACHED_VALUE_FILTER, buffer_uop, buffer_view, buffers, cached_value, executed, \
    realized, relayout_source, target_buffer


_COPY = Ops.COPY   # (bound once: asked per item of every schedule)


@dataclass(slots=True)   # (slots: one made per kernel of every realize, and its fields read per launch)
class ScheduleItem:
    """One kernel (ast is a SINK) or copy (ast is a COPY node); bufs[0] is written, the rest are read."""
    ast: UOp
    bufs: list[Buffer]
    tensor_ops: list[str] = field(default_factory=list)
    inplace: bool = False   # writes into an existing buffer (an ASSIGN)
    var_vals: dict[UOp, int] = field(default_factory=dict)  # values of the variables in symbolic shapes
    checks: tuple[tuple, ...] = ()   # slice bounds that hold for some values only (variables.py): a replay checks them
    aliases: dict[UOp, UOp] = field(default_factory=dict)  # a variable standing for another's further value -> that one

    @property
    def is_copy(self) -> bool: return self.ast.op is _COPY


class ScheduleResults(dict):
    """create_schedule's second value: per target, the node of the buffer holding its result. `reads`: per target,
    when the scheduler's walk saw its whole graph as it is (one target, nothing cached, no custom backward or ASSIGN
    in it), the buffers that graph reads, as `storage.reads_split` gives them (all, direct): the realize needs them for
    the result cache and autograd history, and they come free with the key walk instead of a second walk."""
    __slots__ = ("reads",)

    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[UOp, tuple[list[Buffer], list[Buffer]]] = {}


def _is_buffer_view(u: UOp) -> bool:
    while u.op is Ops.RESHAPE: u = u.src[0]
    return u.op is Ops.BUFFER


def create_schedule(targets: list[UOp]) -> tuple[list[ScheduleItem], ScheduleResults]:
    """Schedule the computation of `targets`. Returns the items in execution order and, per target, the node of the
    buffer holding its result (BUFFER reshaped to the target's shape; MULTI of those for a multi-device target).
    Graphs on several devices are first lowered to one graph per device (multi.py), graphs that read DISK tensors to
    copies of the byte ranges they read (disk.py); a graph with the structure of an earlier one reuses
    its schedule (cache.py)."""
    sink = UOp(Ops.SINK, src=tuple(targets))
    if not has_multi(sink): return _schedule_disk(targets)
    memo = substitute_memo(sink, {n: realized[n] for n in sink.toposort() if n in realized})
    assigns: dict[UOp, Any] = {}
    lowered = lower_multi(list(memo[sink].src), assigns)
    # a pending write on several devices runs on all of them or none: a graph reading only one device's part (a
    # replicated tensor read on its first device) still runs the others, else the write would be half done
    whole = [p for lv in assigns.values() if not isinstance(lv, UOp) for p in lv.parts]
    flat = list(dict.fromkeys([p for lv in lowered for p in ((lv,) if isinstance(lv, UOp) else lv.parts)] + whole))
    items, res = _schedule_disk(flat)
    results = ScheduleResults()
    for orig, lv in zip(targets, lowered):
        if isinstance(lv, UOp): results[orig] = res[lv]
        else: results[orig] = UOp(Ops.MULTI, orig.dtype, tuple(res[p] for p in lv.parts), lv.axis)
    # a write that ran inside the graphs is done on every device: a later graph holding it must not run it again. (The
    # lowering saw the graph with cached results substituted: a write above one is recorded as the node it came from.)
    back = {memo[n]: n for n in memo if n.op is Ops.ASSIGN and memo[n] is not n}
    for a, lv in assigns.items():
        a = back.get(a, a)
        if a in results: continue
        parts = (lv,) if isinstance(lv, UOp) else lv.parts
        if all(p in res for p in parts):
            results[a] = res[lv] if isinstance(lv, UOp) else UOp(Ops.MULTI, a.dtype, tuple(res[p] for p in parts),
                                                                   lv.axis)
    return items, results


def _schedule_disk(targets: list[UOp]) -> tuple[list[ScheduleItem], ScheduleResults]:
    """create_schedule for graphs on one device each: reads of DISK tensors become copies of their byte ranges first
    (only once a DISK device was opened in this process: no extra walk otherwise)."""
    if not ops_disk.opened: return _schedule(targets)
    sink = UOp(Ops.SINK, src=tuple(targets))
    memo = substitute_memo(sink, {n: realized[n] for n in sink.toposort() if n in realized})
    lowered = lower_disk(memo[sink])
    if lowered is memo[sink]: return _schedule(targets)
    items, res = _schedule(list(dict.fromkeys(lowered.src)))
    results = ScheduleResults()
    results.update((orig, res[new]) for orig, new in zip(targets, lowered.src))
    return items, results


def _schedule(targets: list[UOp]) -> tuple[list[ScheduleItem], ScheduleResults]:
    """create_schedule for graphs on one device and without DISK reads: the schedule cache's path."""
    st = time.perf_counter()
    # one walk: nodes computed by an earlier realize are read from their buffers, custom backwards stripped, variables
    # unbound, buffers made placeholders (cache.py)
    nz = normalize(UOp(Ops.SINK, src=tuple(targets)), cached_value, executed, CACHED_VALUE_FILTER)
    leaves, var_vals = nz.leaves, nz.var_vals
    key = (nz.key, flags_key())
    use_cache = SCHEDULE_CACHE and not REFERENCE
    tpl = schedule_cache.get(key) if use_cache else None
    hit = tpl is not None
    if tpl is None:
        tpl = _plan(nz.graph())
        if use_cache: schedule_cache.put(key, tpl)
    bufs = fill_slots(tpl.slots, leaves)
    pick = bufs.__getitem__   # (`map` of it: no list comprehension's frame per item)
    items = [ScheduleItem(ast, list(map(pick, slots)), list(ops), inplace, var_vals, nz.checks, nz.aliases)
             for ast, slots, ops, inplace in tpl.items]
    if DEBUG >= 1 and items:
        print(f"scheduled {len(items)} items in {(time.perf_counter() - st) * 1e3:.2f} ms "
              f"(schedule cache {'hit' if hit else 'miss' if use_cache else 'off'})")
    if DEBUG >= 3:
        for i, it in enumerate(items):
            print(f"schedule item {i}: {'copy' if it.is_copy else 'kernel'} <- tensor ops {', '.join(it.tensor_ops)}")

    results = ScheduleResults()
    if nz.as_is and len(targets) == 1:   # the walk saw the whole graph: its leaves are what it reads (cache.py)
        got = buffers.get
        read = [b for n in leaves if (b := got(n)) is not None]
        results.reads[targets[0]] = (read, read)
    for orig, slot in zip(targets, tpl.results):
        if slot == SAME: results[orig] = _read_cached(orig)
        elif slot == ASSIGNED:   # the target's buffer now holds the value
            results[orig] = buffer_view(target_buffer(_value(orig)), orig.shape)
        else:
            assert orig.shape is not None
            results[orig] = buffer_view(buffer_uop(bufs[slot]), orig.shape)
    # every assign that ran is done: later graphs holding it must read the buffer, not run it again
    for a in nz.assigns:
        if a not in results and nz.pos[a] in tpl.done_assigns:
            results[a] = buffer_view(target_buffer(a), a.shape)
    # relayouts of buffers and unique nodes got buffers of their own: the caller keeps them for later graphs
    # (storage.relayout_put; mixin/realize.py hands a unique node's buffer to the tensor holding it)
    if tpl.relayouts:
        want = dict(tpl.relayouts)
        for n, i in nz.pos.items():
            if i in want and n.op is Ops.CONTIGUOUS and n not in results:
                results[n] = buffer_view(buffer_uop(bufs[want[i]]), n.shape)
    return items, results


def _value(u: UOp) -> UOp:
    """A node without the custom backwards on top of it."""
    while u.op is Ops.DETACH and u.arg is not None: u = u.src[0]
    return u


def _read_cached(u: UOp) -> UOp:
    """A target that needs no kernel (a view of a buffer, a constant) with what earlier realizes computed below it
    read from their buffers, and custom backwards stripped."""
    mapping: dict[UOp, UOp] = {}
    for n in u.toposort(gate=lambda x: x.op is not Ops.BUFFER and cached_value(x) is None):
        if (r := cached_value(n)) is not None: mapping[n] = r
        elif n.op is Ops.DETACH and n.arg is not None: mapping[n] = mapping.get(n.src[0], n.src[0])
        elif any(s in mapping for s in n.src): mapping[n] = n.replace(src=tuple(mapping.get(s, s) for s in n.src))
    return mapping.get(u, u)


def _plan(nodes: list[UOp]) -> Template:
    """The schedule of a normalized graph (cache.py: its nodes in key order, the SINK last): kernels, their order and
    the memory plan, with buffers as slots. Depends on nothing but the graph and the flags."""
    sink = nodes[-1]
    topo = list(sink.toposort(gate=lambda u: u.op is not Ops.BUFFER))
    sink, split = split_reduces(sink, topo)   # long reduces into few outputs: two kernels (split.py)
    if split: topo = list(sink.toposort(gate=lambda u: u.op is not Ops.BUFFER))
    if SPEC:
        spec.verify_tensor_graph(sink)

    rp: set[UOp] = {t for t in sink.src if not _is_buffer_view(t) and t.op is not Ops.CONST}
    for n in topo:
        if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN): rp.add(n)
        if n.op is Ops.COPY and not _is_buffer_view(n.src[0]): rp.add(n.src[0])
    kernels = _lower_all(topo, rp)
    check_index_range(kernels)

    order = _order(topo, rp, kernels)
    # relayouts of a buffer (a conv weight made contiguous in another order) keep their buffer: storage.py reuses it
    relayouts = {r for r in rp if relayout_source(r, structural=True) is not None}
    # so do the nodes of their own (a unique CONTIGUOUS: a parameter's initial value computed inside a larger graph):
    # the tensor holding one takes its buffer (mixin/realize.py), so it is computed once, and later writes to it (an
    # optimizer step) go into the memory that graphs computed with it read (a TinyJit capture)
    relayouts |= {r for r in rp if r.op is Ops.CONTIGUOUS and type(r.arg) is int}
    held = set(sink.src) | {r for r in rp if r.op is Ops.ASSIGN} | relayouts
    slots: list[Slot] = []
    leaf_slot: dict[UOp, int] = {}

    def leaf(n: UOp) -> int:   # the slot of a placeholder's buffer
        if n not in leaf_slot:
            slots.append(("leaf", leaf_index(n)))
            leaf_slot[n] = len(slots) - 1
        return leaf_slot[n]

    out_slot: dict[UOp, int] = {}
    for r in order:
        assert isinstance(r.device, str), "a multi-device node reached the one-device scheduler"
        if r.op is Ops.ASSIGN: out_slot[r] = leaf(target_buffer(r))
        elif r in held: out_slot[r] = new_slot(slots, r.device, smax(r.size), r.dtype)  # symbolic: the largest size
    plan_memory(order, kernels, held, out_slot, slots)

    def slot_of(n: UOp) -> int:
        return leaf(n) if n.op is Ops.BUFFER else out_slot[n] if n in out_slot else leaf(n.base)

    items: list[tuple[UOp, tuple[int, ...], tuple[str, ...], bool]] = []
    for r in order:
        if r.size == 0: continue
        if r.op is Ops.COPY:   # (a COPY node of its own: the template must not keep the tensor graph alive)
            items.append((UOp(Ops.COPY, r.dtype, (), r.arg), (out_slot[r], slot_of(r.src[0])), ("COPY",), False))
        else:
            kb = kernels[r]
            items.append((kb.ast, (out_slot[r], *(slot_of(i) for i in kb.inputs)), tuple(kb.tensor_ops),
                          r.op is Ops.ASSIGN))
    res = []
    for t in sink.src:
        res.append(SAME if _is_buffer_view(t) or t.op is Ops.CONST else ASSIGNED if t.op is Ops.ASSIGN
                   else out_slot[t])
    done = frozenset(i for i, n in enumerate(nodes) if n.op is Ops.ASSIGN and split.get(n, n) in rp)
    keep = tuple((i, out_slot[n]) for i, n in enumerate(nodes) if n in relayouts and n.size != 0)
    return Template(tuple(slots), tuple(items), tuple(res), done, keep)


def _order(topo: list[UOp], rp: set[UOp], kernels: dict[UOp, Any]) -> list[UOp]:
    """Realize points in an order that respects data flow, and runs every reader of a buffer's old contents before
    the ASSIGN that overwrites it. Among the ready ones, the earliest in the graph's topological order goes first."""
    pos = {n: i for i, n in enumerate(topo)}
    reads: dict[UOp, list[UOp]] = {r: ([r.src[0]] if r.op is Ops.COPY else kernels[r].inputs if r in kernels else [])
                                   for r in rp}
    deps: dict[UOp, set[UOp]] = {r: {i for i in reads[r] if i in rp} for r in rp}
    readers: dict[UOp, list[UOp]] = {}
    for r in rp:
        for i in reads[r]: readers.setdefault(i, []).append(r)
    for w in rp:
        if w.op is not Ops.ASSIGN: continue
        prev = w.src[0].base   # the version it overwrites: the buffer, or a pending ASSIGN that runs first
        if prev in rp: deps[w].add(prev)
        for r in readers.get(prev, ()):
            if r is not w and w not in deps[r]: deps[w].add(r)
    users: dict[UOp, list[UOp]] = {}
    for r, ds in deps.items():
        for d in ds: users.setdefault(d, []).append(r)
    waiting = {r: len(ds) for r, ds in deps.items()}
    ready = [(pos[r], id(r), r) for r, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    out: list[UOp] = []
    while ready:
        r = heapq.heappop(ready)[2]
        out.append(r)
        for u in users.get(r, ()):
            waiting[u] -= 1
            if waiting[u] == 0: heapq.heappush(ready, (pos[u], id(u), u))
    if len(out) != len(rp): raise RuntimeError("cycle in the schedule (an assign depends on its own readers)")
    return out


def _lower_all(topo: list[UOp], rp: set[UOp]) -> dict[UOp, Any]:
    """Lower every realize point to a kernel, adding realize points (to `rp`, in place) until no kernel fuses work it
    must not: a reduce the indexer reports as unsafe to fuse, a reduce computed by two kernels, or an expensive
    subgraph computed many times (recompute.py). Only kernels affected by a new realize point are lowered again."""
    pos = {n: i for i, n in enumerate(topo)}
    kernels: dict[UOp, Any] = {}
    fused_in: dict[UOp, set[UOp]] = {}   # tensor node -> the kernels that compute it inline
    work: set[UOp] = set()
    policy = RecomputePolicy(rp)
    heap: list[tuple[int, int, UOp]] = []  # consumers first: the reduces they report are their producers' roots

    def push(r: UOp) -> None:
        if r not in work:
            work.add(r)
            heapq.heappush(heap, (-pos.get(r, -1), id(r), r))

    def add(new: set[UOp], why: str) -> None:
        policy.realize(new)
        for n in new:
            if DEBUG >= 3: print(f"scheduler: realize {n.op.name} {n.shape}: {why}")
            push(n)
            for k in fused_in.get(n, ()): push(k)

    for r in rp: push(r)
    while True:
        while heap:
            r = heapq.heappop(heap)[2]
            if r not in work: continue
            work.discard(r)
            if r.op is Ops.COPY or r.size == 0: continue
            if (old := kernels.pop(r, None)) is not None:
                for n in old.walked: fused_in[n].discard(r)
            while True:
                kb, bad = lower_kernel(r, rp, policy)
                if not bad: break
                if bad <= rp: raise RuntimeError("scheduler did not converge")
                add(bad, f"not fusable into the kernel of {r.op.name} {r.shape}")
                work.discard(r)
            kernels[r] = kb
            for n in kb.walked: fused_in.setdefault(n, set()).add(r)
        if not (new := _recomputed(kernels, rp, pos, policy)): return kernels
        add(new, "recomputed across kernels")


def _recomputed(kernels: dict[UOp, Any], rp: set[UOp], pos: dict[UOp, int], policy: RecomputePolicy) -> set[UOp]:
    """Fused nodes that the kernels together evaluate too often (see recompute.py): a reduce computed by two kernels,
    an expensive subgraph computed by several. Of nested candidates only the outermost is taken: whatever it fuses is
    then computed once, in its kernel (a node below it that is still recomputed shows up in the next round)."""
    evals: dict[UOp, int] = {}
    for kb in kernels.values():
        for n, c in kb.evals.items(): evals[n] = evals.get(n, 0) + c
    cands = sorted((n for n, c in evals.items() if n not in rp and c >= 2 * smax(n.size)),
                   key=lambda u: -pos.get(u, -1))
    out: set[UOp] = set()
    covered: set[UOp] = set()
    for n in cands:
        if n in covered or not policy.worth_realizing(n, evals[n]): continue
        out.add(n)
        stack = [n]
        while stack:
            for x in stack.pop().src:
                if x not in covered and x not in rp and x.op is not Ops.BUFFER:
                    covered.add(x)
                    stack.append(x)
    return out
