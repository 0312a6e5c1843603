"""File plumbing shared by the checkpoint readers and writers in nn.state: opening a source as bytes (memory-mapped when
it is a file), the errors a malformed file raises, and moving raw bytes in and out of Tensors.
"""
from __future__ import annotations

import functools
import mmap as _mmap
import os
import pathlib
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from fusegrad.device import Device
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod
from fusegrad.runtime.ops_disk import disk_region, is_disk, region_of
from fusegrad.tensor import Tensor


class FormatError(ValueError):
    """A checkpoint file is malformed, truncated or uses something this reader does not support."""


class UnsafePickleError(FormatError):
    """A pickle asked for a Python global outside the allow-list; nothing from it was executed."""


class Source:
    """The bytes of a file (memory-mapped, read-only) or of an in-memory buffer, with a name for error messages.

    A mapped file is checked against its current size on every read, so one truncated in place while in use raises
    FormatError instead of crashing the process (the check and the copy are not atomic: for files another process may
    truncate, pass mmap=False, which reads the whole file into memory once). Replacing a file, as safe_save does, is
    always safe: the mapping keeps the old file."""

    def __init__(self, fn: Any, mmap: bool = True):
        self._mm: Any = None
        self._f: Any = None
        self.path: str | None = None
        if isinstance(fn, Tensor) and (path := _disk_file(fn)) is not None: fn = path   # the file itself, mapped
        if isinstance(fn, Tensor):
            self.name = "<tensor>"
            self.buf: memoryview = memoryview(tensor_bytes(fn))
        elif isinstance(fn, (bytes, bytearray, memoryview)):
            self.name, self.buf = "<bytes>", memoryview(fn).cast("B")
        elif isinstance(fn, (str, pathlib.Path)):
            self.name = self.path = str(fn)
            try:
                f = open(fn, "rb")  # noqa: SIM115 - kept open: each read checks the file's current size
                try:
                    size = os.fstat(f.fileno()).st_size
                    if not mmap: self.buf = memoryview(f.read())
                    elif size:
                        self._mm, self._f = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ), f
                        self.buf = memoryview(self._mm)
                    else: self.buf = memoryview(b"")
                finally:
                    if self._f is None: f.close()
            except OSError as e:  # keep the kind (FileNotFoundError, IsADirectoryError, ...) and name the file
                raise type(e)(e.errno, f"{fn}: {e.strerror or e}") from e
        else:
            raise TypeError(f"expected a file name, Path, bytes or uint8 Tensor, got {type(fn).__name__}")

    def __len__(self) -> int: return self.buf.nbytes

    def read(self, start: int, end: int, what: str = "data") -> memoryview:
        """Bytes [start, end), or a FormatError naming the file when they are not all there."""
        if not 0 <= start <= end <= self.buf.nbytes:
            raise FormatError(f"{self.name}: {what} at bytes [{start}, {end}) is outside the file "
                              f"({self.buf.nbytes} bytes): the file is truncated or corrupt")
        if self._f is not None and end > (now := os.fstat(self._f.fileno()).st_size):
            raise FormatError(f"{self.name}: {what} at bytes [{start}, {end}) is past the file's end: it was truncated "
                              f"to {now} bytes after it was opened (load with mmap=False to read a private copy)")
        return self.buf[start:end]

    def release(self, start: int, end: int) -> None:
        """Done with bytes [start, end) for now: a mapped file's whole pages in the range leave this process's resident
        memory (madvise DONTNEED; the mapping is read-only, so a later read faults them in again from the page cache,
        unchanged). A loader that copies each tensor out of the file calls this after the copy, so the file's pages
        and the copies are not resident together. Nothing happens for an in-memory buffer."""
        if self._mm is None or not hasattr(_mmap, "MADV_DONTNEED"): return
        lo, hi = -(-start // _mmap.PAGESIZE) * _mmap.PAGESIZE, end // _mmap.PAGESIZE * _mmap.PAGESIZE
        if lo < hi <= len(self._mm): self._mm.madvise(_mmap.MADV_DONTNEED, lo, hi - lo)

    def readable_end(self) -> int:
        """How many bytes can be read now: the buffer's size, or less when the mapped file was truncated since it was
        opened (a loop of many small reads checks against this once instead of asking the file system each time)."""
        if self._f is None: return self.buf.nbytes
        return min(self.buf.nbytes, os.fstat(self._f.fileno()).st_size)

    def error(self, msg: str) -> FormatError:
        return FormatError(f"{self.name}: {msg}")


def _disk_file(t: Tensor) -> str | None:
    """The path of the file a DISK tensor is, whole (`Tensor(pathlib.Path(fn))`); None for anything else."""
    if not is_disk(t.device) or t.dtype != dtypes.uint8 or (r := disk_region(t.uop)) is None: return None
    buf, off, _ = r
    dev = region_of(buf).device
    return dev.path if off == 0 and buf.base is None and t.numel() == dev.size() else None


def loader(fn: Callable) -> Callable:
    """Every failure of the wrapped file reader is a FormatError (or an OSError for I/O) naming the file."""
    @functools.wraps(fn)
    def wrapper(src: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(src, (str, pathlib.Path, bytes, bytearray, memoryview, Tensor)):
            raise TypeError(f"expected a file name, Path, bytes or uint8 Tensor, got {type(src).__name__}")
        try:
            return fn(src, *args, **kwargs)
        except (FormatError, OSError):
            raise
        except RecursionError:
            raise FormatError(f"{_name(src)}: the file nests too deeply") from None
        except Exception as e:  # noqa: BLE001 - anything else a malformed file can provoke
            raise FormatError(f"{_name(src)}: malformed file: {type(e).__name__}: {str(e)[:300]}") from None
    return wrapper


def _name(src: Any) -> str:
    return str(src) if isinstance(src, (str, pathlib.Path)) else f"<{type(src).__name__}>"


MAX_DIM = 1 << 48   # no real tensor has a dimension this long; an empty one claiming it would break index math


def check_shape(src: Source, name: str, shape: Any) -> None:
    """A FormatError unless every dimension is below MAX_DIM (a shape with a 0 holds no bytes, so the file size doesn't
    bound its other dimensions)."""
    if any(d >= MAX_DIM for d in shape):
        raise src.error(f"tensor {name!r} has shape {tuple(shape)}: dimensions must be below 2**48")


def tensor_bytes(t: Tensor) -> bytes:
    """The raw little-endian bytes of a tensor, row-major."""
    if not t.numel(): return b""
    if t.dtype == dtypes.float16: t = t.bitcast(dtypes.uint16)   # Tensor.data() can't cast to 'e' before Python 3.12
    return bytes(t.contiguous().data())


def tensor_from_bytes(data: memoryview | bytes, dtype: DType, shape: tuple[int, ...], device: str | None = None) -> Tensor:
    """A new tensor holding a copy of `data`: one copy, straight from (possibly memory-mapped) bytes to the device."""
    n = prod(shape)
    mv = memoryview(data).cast("B")
    if mv.nbytes != n * dtype.itemsize:
        raise ValueError(f"{mv.nbytes} bytes don't make a {dtype} tensor of shape {shape}")
    if hasattr(Tensor, "_from_bytes"):
        # _from_bytes copies with Buffer.copyin, which takes any bytes-like object: no intermediate bytes copy
        return Tensor(Tensor._from_bytes(mv, dtype, tuple(shape), Device.canonicalize(device)))  # type: ignore[arg-type]
    t = Tensor(bytes(mv), dtype=dtypes.uint8, device=device)   # fallback: public constructor and a bitcast
    return (t.reshape(n, dtype.itemsize).bitcast(dtype) if dtype.itemsize > 1 else t.bitcast(dtype)).reshape(shape)


def atomic_write(fn: str | pathlib.Path, write: Callable[[Any], None]) -> None:
    """Write a file through a temporary one and rename it into place: a reader (or an mmap of the old file) never sees a
    half-written file, and a failed save leaves the old one intact."""
    path = pathlib.Path(fn)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f: write(f)
        os.replace(tmp, path)
    except BaseException:
        try: os.unlink(tmp)
        except OSError: pass
        raise


class LazyStateDict(MutableMapping):
    """name -> Tensor over a checkpoint file: each tensor is read (copied out of the memory-mapped file) the first time
    it is looked up, so loading a model reads only what it uses. `metadata` holds the file's metadata, `shape_of(k)`
    a tensor's shape without reading it."""

    def __init__(self, name: str, entries: dict[str, tuple[tuple[int, ...], Callable[[], Tensor]]],
                 metadata: dict[str, Any] | None = None):
        self.name, self._entries, self.metadata = name, dict(entries), metadata or {}
        self._loaded: dict[str, Tensor] = {}
        self._order = list(entries)

    def __getitem__(self, k: str) -> Tensor:
        if k not in self._loaded:
            if k not in self._entries: raise KeyError(k)
            self._loaded[k] = self._entries.pop(k)[1]()
        return self._loaded[k]

    def __setitem__(self, k: str, v: Tensor) -> None:
        if k not in self: self._order.append(k)
        self._entries.pop(k, None)
        self._loaded[k] = v

    def __delitem__(self, k: str) -> None:
        if k not in self: raise KeyError(k)
        self._loaded.pop(k, None)
        self._entries.pop(k, None)
        self._order.remove(k)

    def __iter__(self) -> Iterator[str]: return iter(list(self._order))
    def __len__(self) -> int: return len(self._order)
    def __contains__(self, k: object) -> bool: return k in self._loaded or k in self._entries
    def __repr__(self) -> str:
        more = ", ..." if len(self) > 8 else ""
        return f"<LazyStateDict {self.name}: {len(self)} tensors ({', '.join(self._order[:8])}{more})>"

    def shape_of(self, k: str) -> tuple[int, ...]:
        return self._entries[k][0] if k in self._entries else self[k].shape
