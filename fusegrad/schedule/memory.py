"""Memory planning: intermediate buffers of a schedule whose lifetimes don't overlap share one allocation.

Buffers the caller keeps (the realized targets) are never shared. An intermediate lives from the item that writes it to
the last item that reads it; a later intermediate of the same device may reuse its memory once it is dead. The plan is
made of slots (schedule/cache.py), so a cached schedule allocates the same plan again for every call.
"""
from __future__ import annotations

from typing import Any

from fusegrad.device import Buffer
from fusegrad.helpers import DEBUG
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.shape import smax
from fusegrad.schedule.cache import Slot, new_slot


def plan_memory(order: list[UOp], kernels: dict[UOp, Any], held: set[UOp], out_slot: dict[UOp, int],
                slots: list[Slot]) -> None:
    """Give every realize point in `order` that isn't held a slot (in `out_slot`, appended to `slots`), reusing dead
    buffers' memory."""
    pos = {r: i for i, r in enumerate(order)}
    last_use: dict[UOp, int] = {r: pos[r] for r in order}
    for r in order:
        reads = [r.src[0]] if r.op is Ops.COPY else (kernels[r].inputs if r in kernels else [])
        for src in reads:
            if src in last_use: last_use[src] = max(last_use[src], pos[r])
    pool: list[tuple[int, int, int]] = []  # (base slot, its bytes, index of the item after which it is free)
    planned = total = 0
    for r in order:
        if r in held: continue
        assert isinstance(r.device, str), "a multi-device node reached the memory planner"
        size = smax(r.size)   # a symbolic size is allocated at its largest value
        nbytes = size * r.dtype.itemsize
        total += nbytes
        fits = [(nb, k) for k, (b, nb, free_at) in enumerate(pool)
                if free_at < pos[r] and slots[b][1] == r.device and nb >= nbytes]
        if fits and Buffer.supports_views(r.device):
            _, k = min(fits)
            base, nb, _ = pool[k]
            pool[k] = (base, nb, last_use[r])
            slots.append(("view", base, size, r.dtype))
            out_slot[r] = len(slots) - 1
        else:
            out_slot[r] = new_slot(slots, r.device, size, r.dtype)
            planned += nbytes
            pool.append((out_slot[r], nbytes, last_use[r]))
    if DEBUG >= 2 and total and planned < total:
        print(f"memory planner: intermediates need {total / 1e6:.2f} MB, allocated {planned / 1e6:.2f} MB")
