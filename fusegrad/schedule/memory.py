"""Memory planning: intermediate buffers of a schedule whose lifetimes don't overlap share one allocation.

Buffers the caller keeps (the realized targets) are never shared. An intermediate lives from the item that writes it to
the last item that reads it; a later intermediate of the same device may reuse its memory once it is dead.
"""
from __future__ import annotations

from typing import Any

from fusegrad.device import Buffer
from fusegrad.helpers import DEBUG
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.shape import smax


def plan_memory(order: list[UOp], kernels: dict[UOp, Any], held: set[UOp], out_bufs: dict[UOp, Buffer]) -> None:
    """Fill `out_bufs` for every realize point in `order` that isn't held, reusing dead buffers' memory."""
    pos = {r: i for i, r in enumerate(order)}
    last_use: dict[UOp, int] = {r: pos[r] for r in order}
    for r in order:
        reads = [r.src[0]] if r.op is Ops.COPY else (kernels[r].inputs if r in kernels else [])
        for src in reads:
            if src in last_use: last_use[src] = max(last_use[src], pos[r])
    pool: list[tuple[Buffer, int]] = []  # (base buffer, index of the item after which it is free)
    planned = total = 0
    for r in order:
        if r in held: continue
        assert isinstance(r.device, str), "a multi-device node reached the memory planner"
        size = smax(r.size)   # a symbolic size is allocated at its largest value
        nbytes = size * r.dtype.itemsize
        total += nbytes
        fits = [(b.nbytes, k) for k, (b, free_at) in enumerate(pool)
                if free_at < pos[r] and b.device == r.device and b.nbytes >= nbytes]
        base: Buffer | None = None
        if fits and Buffer.supports_views(r.device):
            _, k = min(fits)
            base = pool[k][0]
            pool[k] = (base, last_use[r])
            out_bufs[r] = base.view(size, r.dtype)
        else:
            out_bufs[r] = Buffer(r.device, size, r.dtype)
            planned += nbytes
            pool.append((out_bufs[r], last_use[r]))
    if DEBUG >= 2 and total and planned < total:
        print(f"memory planner: intermediates need {total / 1e6:.2f} MB, allocated {planned / 1e6:.2f} MB")
