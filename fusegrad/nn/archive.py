"""Archives as tensors: `TensorIO` (a read-only, seekable file object over a uint8 tensor), `tar_extract` and
`zip_extract` (name -> a uint8 tensor of each member's bytes). Over a DISK tensor (`Tensor(pathlib.Path(fn))`, or a file
name) nothing is read but the archive's directory: each member is a slice of the file, read when used. Malformed
archives raise FormatError; a member's bytes never reach past the archive.

>>> import io, tarfile
>>> from fusegrad import Tensor
>>> buf = io.BytesIO()
>>> with tarfile.open(fileobj=buf, mode="w") as tar:
...     info = tarfile.TarInfo("a.txt"); info.size = 3; tar.addfile(info, io.BytesIO(b"abc"))
>>> bytes(tar_extract(Tensor(buf.getvalue()))["a.txt"].data())
b'abc'
"""
from __future__ import annotations

import functools
import io
import pathlib
import tarfile
import zipfile
import zlib
from typing import Any, Callable, TypeVar

from fusegrad.device import Device
from fusegrad.dtype import dtypes
from fusegrad.nn._io import FormatError
from fusegrad.runtime.ops_disk import disk_region, is_disk, region_of
from fusegrad.tensor import Tensor

T = TypeVar("T")


class TensorIO(io.RawIOBase):
    """A read-only, seekable binary file over a 1-d uint8 tensor (for `tarfile`, `zipfile`, `pickle`, ...).

    A DISK tensor is read straight from the file's memory map, a range at a time; any other tensor is realized once.

    >>> f = TensorIO(Tensor(b"hello"))
    >>> f.seek(1), f.read(3), f.tell()
    (1, b'ell', 4)
    """

    def __init__(self, t: Tensor):
        super().__init__()
        if not isinstance(t, Tensor) or t.ndim != 1 or t.dtype != dtypes.uint8:
            raise ValueError(f"TensorIO needs a 1-d uint8 Tensor, got {t!r}")
        self._t, self._pos, self._size = t, 0, t.shape[0]
        self._read_at: Callable[[int, int], memoryview] = self._reader(t)

    @staticmethod
    def _reader(t: Tensor) -> Callable[[int, int], memoryview]:
        if is_disk(t.device) and (r := disk_region(t.uop)) is not None:
            buf, off, _ = r
            region = region_of(buf)
            return lambda start, n: region.device.read(region.offset + off + start, n)
        src = t.to(Device.DEFAULT) if is_disk(t.device) else t
        data = memoryview(src.contiguous()._buffer().as_bytes())
        return lambda start, n: data[start:start + n]

    def readable(self) -> bool: return True
    def seekable(self) -> bool: return True
    def writable(self) -> bool: return False

    def readinto(self, buffer: Any) -> int:
        mv = memoryview(buffer).cast("B")
        n = max(0, min(mv.nbytes, self._size - self._pos))
        if n: mv[:n] = self._read_at(self._pos, n)
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence)
        if base is None: raise ValueError(f"invalid whence {whence}")
        self._pos = min(self._size, max(0, base + offset))
        return self._pos

    def tell(self) -> int: return self._pos


def accept_filename(fn: Callable[[Tensor], T]) -> Callable[[Tensor | str | pathlib.Path], T]:
    """Let a reader of a uint8 tensor take a file name or Path too (opened as a DISK tensor, read lazily)."""
    @functools.wraps(fn)
    def wrapper(src: Tensor | str | pathlib.Path) -> T:
        if isinstance(src, (str, pathlib.PurePath)): src = Tensor(pathlib.Path(src))
        if not isinstance(src, Tensor):
            raise TypeError(f"expected a file name, Path or uint8 Tensor, got {type(src).__name__}")
        return fn(src)
    return wrapper


def _member(t: Tensor, name: str, start: int, size: int) -> Tensor:
    if start < 0 or size < 0 or start + size > t.shape[0]:
        raise FormatError(f"archive member {name!r} at bytes [{start}, {start + size}) reaches past the end of the "
                          f"{t.shape[0]}-byte archive")
    return t[start:start + size]


@accept_filename
def tar_extract(t: Tensor) -> dict[str, Tensor]:
    """name -> uint8 tensor of each regular file in a tar archive (slices of `t`: nothing is copied until used)."""
    try:
        with tarfile.open(fileobj=TensorIO(t), mode="r:") as tar:
            members = [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]
    except tarfile.TarError as e:
        raise FormatError(f"not a readable (uncompressed) tar archive: {e}") from None
    return {name: _member(t, name, off, size) for name, off, size in members}


_MAX_INFLATE = 1 << 34   # a deflated member claiming more than 16 GiB is refused (zip bombs)


@accept_filename
def zip_extract(t: Tensor) -> dict[str, Tensor]:
    """name -> uint8 tensor of each member of a zip archive: a slice of `t` for stored members, the inflated bytes
    (checked against the size the directory records) for deflated ones; other compressions raise NotImplementedError."""
    f = TensorIO(t)
    try:
        with zipfile.ZipFile(f, "r") as z: infos = list(z.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as e:
        raise FormatError(f"not a readable zip archive: {e}") from None
    out: dict[str, Tensor] = {}
    for zi in infos:
        if zi.is_dir(): continue
        # the data follows a 30-byte local header, the file name and an extra field whose length only that header has
        head = bytes(_member(t, zi.filename, zi.header_offset, 30).data())
        if head[:4] != b"PK\x03\x04": raise FormatError(f"zip member {zi.filename!r}: bad local header")
        start = zi.header_offset + 30 + int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")
        data = _member(t, zi.filename, start, zi.compress_size)
        if zi.compress_type == zipfile.ZIP_STORED:
            if zi.compress_size != zi.file_size: raise FormatError(f"zip member {zi.filename!r}: stored sizes differ")
            out[zi.filename] = data
        elif zi.compress_type == zipfile.ZIP_DEFLATED:
            if zi.file_size > _MAX_INFLATE: raise FormatError(f"zip member {zi.filename!r} claims {zi.file_size} bytes")
            d = zlib.decompressobj(-15)
            try: raw = d.decompress(bytes(data.data()), zi.file_size + 1)
            except zlib.error as e: raise FormatError(f"zip member {zi.filename!r}: {e}") from None
            if len(raw) != zi.file_size:
                raise FormatError(f"zip member {zi.filename!r} inflates to {len(raw)}+ bytes, not {zi.file_size}")
            out[zi.filename] = Tensor(raw)
        else:
            raise NotImplementedError(f"zip member {zi.filename!r}: compression {zi.compress_type} is not supported")
    return out


__all__ = ["TensorIO", "accept_filename", "tar_extract", "zip_extract"]
