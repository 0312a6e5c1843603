"""Scheduling reads of DISK tensors: every use of a file-backed tensor becomes a COPY of the byte range it selects
(a view of the file, runtime/ops_disk.py) to the device that consumes it, so no kernel runs on DISK.
"""
from __future__ import annotations

from fusegrad.device import Buffer, Device
from fusegrad.helpers import prod
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute
from fusegrad.runtime.ops_disk import DiskRegion, disk_region, is_disk, region_of
from fusegrad.storage import buffer_uop, buffer_view


def _read_region(buf: Buffer, offset: int, u: UOp) -> UOp:
    """A new DISK buffer node for `prod(u.shape)` elements of `u.dtype` at byte `offset` of `buf`, shaped like u."""
    assert u.shape is not None
    n = prod(u.shape)
    base = region_of(buf)
    view = Buffer(buf.device, n, u.dtype, base=buf)
    view._opaque = DiskRegion(base.device, base.offset + offset, n * u.dtype.itemsize)
    return buffer_view(buffer_uop(view), u.shape)


def lower_disk(sink: UOp) -> UOp:
    """Rewrite every use of a DISK tensor into a COPY of the byte range it reads (to the device that consumes it, or
    the default device), so that no kernel runs on DISK. Graphs without DISK nodes come back unchanged."""
    if not any(n.op is Ops.DEVICE and is_disk(n.arg) for n in sink.toposort()): return sink
    memo: dict[tuple[UOp, str], UOp] = {}

    def move(u: UOp, dev: str) -> UOp:
        """`u` (a DISK graph) recomputed on `dev`, reading DISK memory by COPYs of the ranges it selects."""
        if (u, dev) in memo: return memo[(u, dev)]
        if u.op is Ops.DEVICE: out = UOp(Ops.DEVICE, arg=dev) if is_disk(u.arg) else u
        elif not is_disk(u.device): out = u
        elif u.op is Ops.COPY: out = move(u.src[0], dev)   # a value bound for DISK is used where it was made
        elif (r := disk_region(u)) is not None: out = UOp(Ops.COPY, u.dtype, (_read_region(*r),), dev)
        elif u.op in (Ops.BUFFER, Ops.ASSIGN):
            raise RuntimeError(f"can't read {u.op.name} on {u.device} here; realize the DISK tensor first")
        else: out = u.replace(src=tuple(move(s, dev) for s in u.src))
        memo[(u, dev)] = out
        return out

    compute = Device.DEFAULT
    mapping: dict[UOp, UOp] = {}
    for n in sink.toposort():
        if n.op is not Ops.COPY or not is_disk(n.src[0].device) or _is_plain_buffer(n.src[0]): continue
        # DISK -> DISK goes through the compute device; DISK -> dev reads the selected range (and computes on dev)
        mapping[n] = n.replace(src=(move(n.src[0], compute),)) if is_disk(n.arg) else move(n.src[0], n.arg)
    for t in sink.src:   # a DISK tensor realized for its own sake (numpy() of a slice)
        if not is_disk(t.device) or t.op is Ops.COPY or _is_plain_buffer(t) or t in mapping: continue
        # a contiguous range stays a DISK tensor (a view of the file); anything computed is computed on the default
        mapping[t] = _read_region(*r) if (r := disk_region(t)) is not None else move(t, compute)
    return substitute(sink, mapping) if mapping else sink


def _is_plain_buffer(u: UOp) -> bool:
    while u.op is Ops.RESHAPE: u = u.src[0]
    return u.op is Ops.BUFFER
