"""DISK device: a file as tensor memory. `DISK:/path` names one file; a tensor on it holds bytes of that file.

Nothing is computed on DISK. The scheduler calls `lower_disk` first: a graph that reads a DISK tensor reads, through a
memory map, only the contiguous byte range its slices and reshapes select (a COPY of that range to the device that
computes), and the rest of the graph (casts, bitcasts to other sizes, math) runs there. Writing a tensor to
`DISK:/path` (`t.to("disk:/path")`) or into part of a DISK tensor (`disk_t[a:b].assign(x)`) writes the file, creating
or growing it as needed. Reads never go past the file's end: such a read raises ValueError naming the range and size.

>>> import os, tempfile
>>> from fusegrad import Tensor, dtypes
>>> fn = os.path.join(tempfile.mkdtemp(), "w.bin")
>>> _ = Tensor([1, 2, 3, 4], dtype=dtypes.int16).to(f"disk:{fn}").realize()
>>> Tensor.empty(8, dtype=dtypes.uint8, device=f"disk:{fn}")[2:6].bitcast(dtypes.int16).to("CPU").tolist()
[2, 3]
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

from fusegrad.device import Allocator, Buffer, Compiled, Compiler, Device
from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.ir.ops import Ops, UOp
from fusegrad.renderer import Renderer


@dataclass(frozen=True)
class DiskRegion:
    """`nbytes` bytes of the device's file from byte `offset` (the opaque handle of a DISK buffer)."""
    device: "DiskDevice"
    offset: int
    nbytes: int


class DiskAllocator(Allocator):
    def __init__(self, dev: "DiskDevice"):
        super().__init__()
        self.dev = dev

    def alloc(self, nbytes: int) -> DiskRegion: return DiskRegion(self.dev, 0, nbytes)   # the file is the memory
    def free(self, opaque: Any, nbytes: int) -> None: pass
    def _copyin(self, dest: DiskRegion, src: memoryview) -> None: dest.device.write(dest.offset, src)
    def _copyout(self, dest: memoryview, src: DiskRegion) -> None: dest[:] = src.device.read(src.offset, dest.nbytes)


class _NoRenderer(Renderer):
    device = "DISK"

    def supported_dtypes(self) -> list[Any]: return list(dtypes.all)

    def render(self, name: str, uops: list[UOp]) -> str:
        raise RuntimeError("DISK can't run kernels; computing on a DISK tensor should read it to a compute device "
                           "first (this is a fusegrad bug if you see it)")


# set once a DISK device is opened: only then does the scheduler look for DISK reads to lower (lower_disk)
opened = False


class DiskDevice(Compiled):
    """One file. Reads go through a read-only memory map (remade when the file grows); writes use pwrite."""

    def __init__(self, device: str):
        global opened
        opened = True
        name, _, path = device.partition(":")
        if not path:
            raise RuntimeError("DISK needs a file path: device='disk:/path/to/file' (it is no compute device)")
        self.path = path
        self._map: mmap.mmap | None = None
        self._map_size = -1
        super().__init__(device, DiskAllocator(self), _NoRenderer(), Compiler(None), _no_program)

    def size(self) -> int:
        """The file's size in bytes (FileNotFoundError, naming the device, if it doesn't exist)."""
        try: return os.stat(self.path).st_size
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.device}: no such file {self.path!r}") from None

    def read(self, offset: int, nbytes: int) -> memoryview:
        size = self.size()
        if offset < 0 or offset + nbytes > size:
            raise ValueError(f"{self.device}: reading bytes [{offset}, {offset + nbytes}) past the end of the "
                             f"{size}-byte file")
        if nbytes == 0: return memoryview(b"")
        if self._map is None or self._map_size != size:
            with open(self.path, "rb") as f: self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._map_size = size
        return memoryview(self._map)[offset:offset + nbytes]

    def write(self, offset: int, data: memoryview) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < offset + data.nbytes: os.ftruncate(fd, offset + data.nbytes)
            done = 0
            while done < data.nbytes: done += os.pwrite(fd, data[done:], offset + done)
        finally:
            os.close(fd)
        self._map, self._map_size = None, -1


def _no_program(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("DISK can't run kernels")


def is_disk(device: str | None) -> bool:
    return device is not None and device.split(":", 1)[0] == "DISK"


# ---------------------------------------------------------------------------------------------------------------------
# reading: the byte range a view of a DISK buffer selects

def _shrink_offset(shape: tuple[int, ...], arg: tuple[tuple[int, int], ...]) -> int | None:
    """The element offset of a SHRINK of a row-major block, or None when the result isn't one contiguous range."""
    new = [e - s for s, e in arg]
    k = next((i for i in range(len(shape)) if new[i] != shape[i]), None)
    if k is None: return 0
    if any(n != 1 for n in new[:k]) or any(n != s for n, s in zip(new[k + 1:], shape[k + 1:])): return None
    strides = [prod(shape[i + 1:]) for i in range(len(shape))]
    return sum(s * st for (s, _), st in zip(arg, strides))


def _region(u: UOp) -> tuple[Buffer, int, UOp] | None:
    """(DISK buffer, byte offset, dtype node) of a view that is one contiguous byte range of a DISK buffer."""
    from fusegrad.storage import buffers
    if u.op is Ops.BUFFER: return (buffers[u], 0, u) if u in buffers else None
    if u.op not in (Ops.RESHAPE, Ops.SHRINK, Ops.BITCAST, Ops.DETACH, Ops.CONTIGUOUS) or not u.src: return None
    if u.op is Ops.BITCAST and u.dtype.itemsize != u.src[0].dtype.itemsize: return None
    if (r := _region(u.src[0])) is None: return None
    buf, off, _ = r
    if u.op is Ops.SHRINK:
        assert u.src[0].shape is not None
        if (eo := _shrink_offset(u.src[0].shape, u.arg)) is None: return None
        off += eo * u.dtype.itemsize
    return buf, off, u


def region_of(buf: Buffer) -> DiskRegion:
    """The file range a DISK buffer stands for, without allocating it (allocating counts its size as memory used)."""
    if isinstance(buf._opaque, DiskRegion): return buf._opaque
    dev = Device[buf.device]
    assert isinstance(dev, DiskDevice), f"{buf.device} is no DISK device"
    return DiskRegion(dev, 0, buf.nbytes)


def _read_region(buf: Buffer, offset: int, u: UOp) -> UOp:
    """A new DISK buffer node for `prod(u.shape)` elements of `u.dtype` at byte `offset` of `buf`, shaped like u."""
    from fusegrad.storage import buffer_uop, buffer_view
    assert u.shape is not None
    n = prod(u.shape)
    base = region_of(buf)
    view = Buffer(buf.device, n, u.dtype, base=buf)
    view._opaque = DiskRegion(base.device, base.offset + offset, n * u.dtype.itemsize)
    return buffer_view(buffer_uop(view), u.shape)


def lower_disk(sink: UOp) -> UOp:
    """Rewrite every use of a DISK tensor into a COPY of the byte range it reads (to the device that consumes it, or
    the default device), so that no kernel runs on DISK. Graphs without DISK nodes come back unchanged."""
    from fusegrad.ir.pattern import substitute
    if not any(n.op is Ops.DEVICE and is_disk(n.arg) for n in sink.toposort()): return sink
    memo: dict[tuple[UOp, str], UOp] = {}

    def move(u: UOp, dev: str) -> UOp:
        """`u` (a DISK graph) recomputed on `dev`, reading DISK memory by COPYs of the ranges it selects."""
        if (u, dev) in memo: return memo[(u, dev)]
        if u.op is Ops.DEVICE: out = UOp(Ops.DEVICE, arg=dev) if is_disk(u.arg) else u
        elif not is_disk(u.device): out = u
        elif u.op is Ops.COPY: out = move(u.src[0], dev)   # a value bound for DISK is used where it was made
        elif (r := _region(u)) is not None: out = UOp(Ops.COPY, u.dtype, (_read_region(*r),), dev)
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
        mapping[t] = _read_region(*r) if (r := _region(t)) is not None else move(t, compute)
    return substitute(sink, mapping) if mapping else sink


def _is_plain_buffer(u: UOp) -> bool:
    while u.op is Ops.RESHAPE: u = u.src[0]
    return u.op is Ops.BUFFER


# ---------------------------------------------------------------------------------------------------------------------
# writing into part of a DISK tensor

def disk_assign(target: Any, x: Any) -> Any:
    """`target.assign(x)` for a DISK tensor: x is computed on its device and its bytes written into the file range
    `target` views (one contiguous range: a slice of whole rows, a reshape). Cached reads of the file are dropped."""
    from fusegrad import storage
    from fusegrad.tensor import Tensor
    if not isinstance(x, Tensor): x = Tensor(x, dtype=target.dtype)
    if x.shape != target.shape: x = x.expand(target.shape) if x.ndim <= target.ndim else x
    if x.shape != target.shape: raise RuntimeError(f"assign shape mismatch {x.shape} != {target.shape}")
    if (r := _region(target.uop)) is None:
        raise RuntimeError(f"assign into {target.device}: the target must be one contiguous byte range of the file "
                           "(a slice of whole rows, a reshape), not a strided view")
    buf, offset, _ = r
    src = x.cast(target.dtype)
    if is_disk(src.device): src = src.to(Device.DEFAULT)
    data = src.contiguous()._buffer().as_bytes()
    region = region_of(buf)
    region.device.write(region.offset + offset, memoryview(data))
    storage.written(buf)
    return target
