"""Tensors on several devices (the frontend half; schedule/multi.py lowers the graphs): `Tensor.shard`, `.to(tuple)`
and `Tensor(data, device=(d0, d1))` build a MULTI node, one shard per device.

A sharded tensor is one lazy Tensor whose node is `MULTI(shard_0, ..., arg=axis)`; its shape is the whole (logical)
shape and its device the tuple of devices. Every op on it builds ordinary nodes on the logical shape, so autograd and
the mixins need nothing special; the scheduler splits the graph per device.

>>> from fusegrad import Tensor
>>> t = Tensor.arange(8).reshape(4, 2).shard(("CPU", "CPU:1"), axis=0)
>>> t.device, t.shape, (t * 10).sum(0).tolist()
(('CPU', 'CPU:1'), (4, 2), [120, 160])
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusegrad.device import Buffer, canonical_devices
from fusegrad.dtype import DType
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp
from fusegrad.storage import buffer_uop

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


def split_sizes(n: int, parts: int) -> list[int]:
    """How `shard` splits an axis of n: as evenly as possible, the first shards one larger."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def shard(t: Tensor, devices: Any, axis: int | None = None) -> Tensor:
    """`t` on every device of `devices`: whole (axis None) or split along `axis` into one slice per device."""
    devs = canonical_devices(devices, "shard")
    if isinstance(t.device, tuple): t = t.to(t.device[0])     # resharding: gather first
    if axis is None:
        return t._wrap(UOp(Ops.MULTI, t.dtype, tuple(_copy(t.uop, d) for d in devs), None), t)
    ax = t._axis(axis)
    size = t.shape[ax]
    if not isinstance(size, int): raise TypeError("shard: a symbolic axis can't be sharded")
    if size < len(devs): raise ValueError(f"shard: axis {ax} of size {size} can't be split over {len(devs)} devices")
    parts, b = [], 0
    for d, n in zip(devs, split_sizes(size, len(devs))):
        piece = build.shrink(t.uop, [(b, b + n) if i == ax else (0, s) for i, s in enumerate(t.shape)])
        parts.append(_copy(piece, d))
        b += n
    return t._wrap(UOp(Ops.MULTI, t.dtype, tuple(parts), ax), t)


def _copy(u: UOp, device: str) -> UOp:
    return u if u.device == device else UOp(Ops.COPY, u.dtype, (u,), device)


def from_bytes(data: bytes, dtype: DType, shape: tuple[int, ...], devices: tuple[str, ...]) -> UOp:
    """A replicated tensor made from host data: one buffer per device."""
    n = len(data) // dtype.itemsize
    return UOp(Ops.MULTI, dtype, tuple(build.reshape(buffer_uop(Buffer(d, n, dtype).copyin(data)), shape)
                                       for d in devices), None)


def empty(shape: tuple[int, ...], dtype: DType, devices: tuple[str, ...]) -> UOp:
    n = 1
    for s in shape: n *= s
    return UOp(Ops.MULTI, dtype, tuple(build.reshape(buffer_uop(Buffer(d, n, dtype)), shape) for d in devices), None)


def empty_like(u: UOp) -> UOp:
    """New memory for a multi-device value: a buffer per shard, split like `u` (a MULTI) or whole on each device."""
    assert u.shape is not None and isinstance(u.device, tuple)
    if u.op is not Ops.MULTI: return empty(tuple(int(s) for s in u.shape), u.dtype, u.device)
    parts = []
    for s in u.src:
        assert s.shape is not None and isinstance(s.device, str)
        n = 1
        for d in s.shape: n *= int(d)
        parts.append(build.reshape(buffer_uop(Buffer(s.device, n, s.dtype)), s.shape))
    return UOp(Ops.MULTI, u.dtype, tuple(parts), u.arg)


def multi_grad(ret: UOp, ctx: UOp) -> tuple[UOp | None, ...]:
    """Gradient rule of MULTI: shard i gets its slice of the gradient, on its device (a replicated MULTI sends the whole
    gradient to shard 0: the replicas are one value)."""
    out: list[UOp | None] = []
    b = 0
    for i, s in enumerate(ret.src):
        assert s.shape is not None and ctx.shape is not None
        if ret.arg is None:
            out.append(UOp(Ops.COPY, ctx.dtype, (ctx,), s.device) if i == 0 else None)
            continue
        n = s.shape[ret.arg]
        piece = build.shrink(ctx, [(b, b + n) if k == ret.arg else (0, d) for k, d in enumerate(ctx.shape)])
        out.append(UOp(Ops.COPY, ctx.dtype, (piece,), s.device))
        b += n
    return tuple(out)
