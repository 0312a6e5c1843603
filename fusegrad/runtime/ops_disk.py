"""DISK device: a file as tensor memory. `DISK:/path` names one file; a tensor on it holds bytes of that file.

Nothing is computed on DISK. The scheduler calls `lower_disk` (schedule/disk.py) first: a graph that reads a DISK
tensor reads, through a memory map, only the contiguous byte range its slices and reshapes select (a COPY of that range
to the device that computes), and the rest of the graph (casts, bitcasts to other sizes, math) runs there. Writing a
tensor to `DISK:/path` (`t.to("disk:/path")`) or into part of a DISK tensor (`disk_t[a:b].assign(x)`,
views.disk_assign) writes the file, creating or growing it as needed. Reads never go past the file's end: such a
read raises ValueError naming the range and size.

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


def disk_region(u: UOp) -> tuple[Buffer, int, UOp] | None:
    """(DISK buffer, byte offset, dtype node) of a view that is one contiguous byte range of a DISK buffer."""
    from fusegrad.storage import buffers
    if u.op is Ops.BUFFER: return (buffers[u], 0, u) if u in buffers else None
    if u.op not in (Ops.RESHAPE, Ops.SHRINK, Ops.BITCAST, Ops.DETACH, Ops.CONTIGUOUS) or not u.src: return None
    if u.op is Ops.BITCAST and u.dtype.itemsize != u.src[0].dtype.itemsize: return None
    if (r := disk_region(u.src[0])) is None: return None
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
