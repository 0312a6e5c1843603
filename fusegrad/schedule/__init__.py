"""Scheduler: the tensor graph to realize -> an ordered list of kernels and copies (ScheduleItems) with their buffers.

Fusion is decided by *realize points*: the nodes that get a buffer. Everything between realize points is fused into the
kernel of the realize point that consumes it. Realize points are the requested tensors, CONTIGUOUS, COPY and its source,
a reduce consumed by several kernels, and any reduce the indexer reports as unsafe to fuse (see indexing.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fusegrad.device import Buffer
from fusegrad.helpers import DEBUG, SPEC
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute_memo
from fusegrad.schedule.indexing import lower_kernel
from fusegrad.schedule.memory import plan_memory


@dataclass
class ScheduleItem:
    """One kernel (ast is a SINK) or copy (ast is a COPY node); bufs[0] is written, the rest are read."""
    ast: UOp
    bufs: list[Buffer]
    tensor_ops: list[str] = field(default_factory=list)
    inplace: bool = False   # writes into an existing buffer (an ASSIGN)

    @property
    def is_copy(self) -> bool: return self.ast.op is Ops.COPY


def _is_buffer_view(u: UOp) -> bool:
    return u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER)


def create_schedule(targets: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Schedule the computation of `targets`. Returns the items in execution order and, per target, the node of the
    buffer holding its result (BUFFER reshaped to the target's shape)."""
    from fusegrad.tensor import buffer_uop, buffers, realized
    # graphs may contain nodes computed by an earlier realize: read their buffers instead of recomputing
    sink = UOp(Ops.SINK, src=tuple(targets))
    memo = substitute_memo(sink, {n: realized[n] for n in sink.toposort() if n in realized})
    sink = memo[sink]
    new_targets = dict(zip(targets, sink.src))
    if SPEC:
        from fusegrad.ir.spec import verify_tensor_graph
        verify_tensor_graph(sink)

    topo = list(sink.toposort(gate=lambda u: u.op is not Ops.BUFFER))
    rp: set[UOp] = {t for t in sink.src if not _is_buffer_view(t) and t.op is not Ops.CONST}
    for n in topo:
        if n.op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN): rp.add(n)
        if n.op is Ops.COPY and not _is_buffer_view(n.src[0]): rp.add(n.src[0])
    rp |= _shared_reduces(topo, rp)

    # lower every realize point; a reported unsafe reduce becomes a realize point and we lower again
    kernels: dict[UOp, Any] = {}
    for _ in range(1000):
        kernels.clear()
        violations: set[UOp] = set()
        for r in rp:
            if r.op is Ops.COPY or r.size == 0: continue
            kb, bad = lower_kernel(r, rp)
            kernels[r] = kb
            violations |= bad
        if not violations: break
        rp |= violations
    else:
        raise RuntimeError("scheduler did not converge")

    order = _order(topo, rp, kernels)
    held = set(new_targets.values()) | {r for r in rp if r.op is Ops.ASSIGN}
    out_bufs: dict[UOp, Buffer] = {}
    for r in order:
        assert r.device is not None
        if r.op is Ops.ASSIGN: out_bufs[r] = buffers[r.src[0].base]
        elif r in held: out_bufs[r] = Buffer(r.device, r.size, r.dtype)
    plan_memory(order, kernels, held, out_bufs)

    def buf_of(n: UOp) -> Buffer:
        return buffers[n] if n.op is Ops.BUFFER else out_bufs[n] if n in out_bufs else buffers[n.src[0]]

    items: list[ScheduleItem] = []
    for r in order:
        if r.size == 0: continue
        if r.op is Ops.COPY:
            items.append(ScheduleItem(r, [out_bufs[r], buf_of(r.src[0])], ["COPY"]))
        else:
            kb = kernels[r]
            items.append(ScheduleItem(kb.ast, [out_bufs[r]] + [buf_of(i) for i in kb.inputs], kb.tensor_ops,
                                      r.op is Ops.ASSIGN))
    if DEBUG >= 3:
        for i, it in enumerate(items):
            print(f"schedule item {i}: {'copy' if it.is_copy else 'kernel'} <- tensor ops {', '.join(it.tensor_ops)}")

    results: dict[UOp, UOp] = {}
    for orig, t in new_targets.items():
        if _is_buffer_view(t) or t.op is Ops.CONST: results[orig] = t
        elif t.op is Ops.ASSIGN: results[orig] = t.src[0]   # the target's buffer now holds the value
        else:
            assert t.shape is not None
            bu = buffer_uop(out_bufs[t])
            results[orig] = bu if bu.shape == t.shape else UOp(Ops.RESHAPE, t.dtype, (bu,), t.shape)
    # every assign that ran is done: later graphs holding it must read the buffer, not run it again
    for orig, new in memo.items():
        if new.op is Ops.ASSIGN and new in rp and orig not in results: results[orig] = new.src[0]
    return items, results


def _order(topo: list[UOp], rp: set[UOp], kernels: dict[UOp, Any]) -> list[UOp]:
    """Realize points in an order that respects data flow, and runs every reader of a buffer's old contents before
    the ASSIGN that overwrites it."""
    pos = {n: i for i, n in enumerate(topo)}
    reads: dict[UOp, list[UOp]] = {r: ([r.src[0]] if r.op is Ops.COPY else kernels[r].inputs if r in kernels else [])
                                   for r in rp}
    deps: dict[UOp, set[UOp]] = {r: {i for i in reads[r] if i in rp} for r in rp}
    for w in rp:
        if w.op is not Ops.ASSIGN: continue
        target = w.src[0].base
        for r in rp:
            if r is not w and target in reads[r] and w not in deps[r]: deps[w].add(r)
    out: list[UOp] = []
    done: set[UOp] = set()
    ready = sorted((r for r in rp if not deps[r]), key=pos.__getitem__)
    while ready:
        r = ready.pop(0)
        out.append(r)
        done.add(r)
        for k in rp:
            if k not in done and k not in out and k not in ready and deps[k] <= done: ready.append(k)
        ready.sort(key=pos.__getitem__)
    if len(out) != len(rp): raise RuntimeError("cycle in the schedule (an assign depends on its own readers)")
    return out


def _shared_reduces(topo: list[UOp], rp: set[UOp]) -> set[UOp]:
    """Reduces reached from two or more realize points would be computed twice: realize them once instead."""
    users: dict[UOp, set[UOp]] = {}
    for r in rp:
        for n in r.toposort(gate=lambda u: u is r or u not in rp):
            if n.op is Ops.REDUCE_AXIS and n is not r: users.setdefault(n, set()).add(r)
    return {n for n, us in users.items() if len(us) > 1}
