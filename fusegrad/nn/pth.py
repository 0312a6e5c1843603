"""PyTorch checkpoint reader (`torch_load`): .pth/.pt files in the zip format (torch >= 1.6) and the legacy pickle
format (`_use_new_zipfile_serialization=False`), without importing torch.

A checkpoint is a pickle whose tensors point at raw storages (zip entries `<name>/data/<key>`, or a block after the
pickle in the legacy format). The pickle is read by a restricted Unpickler: only the few globals a state dict needs are
resolved, to stand-ins defined here; any other global (a class of the saving program, `os.system`, ...) is refused
before anything is called.
"""
from __future__ import annotations

import io
import pathlib
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod
from fusegrad.nn._io import FormatError, Source, UnsafePickleError, tensor_from_bytes
from fusegrad.tensor import Tensor

_STORAGE_DTYPES: dict[str, DType] = {
    "FloatStorage": dtypes.float32, "DoubleStorage": dtypes.float64, "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


class _StorageType:
    """Stands in for torch.FloatStorage etc. inside a pickle: only carries the element dtype."""

    def __init__(self, name: str): self.name, self.dtype = name, _STORAGE_DTYPES[name]
    def __repr__(self) -> str: return f"torch.{self.name}"


class _Storage:
    """A flat run of `numel` elements; its bytes are filled in after the pickle is read."""

    def __init__(self, key: str, dtype: DType, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.data: bytes | memoryview | None = None


class _PendingTensor:
    """A tensor view of a storage, made into a Tensor once the storage bytes are known."""

    def __init__(self, storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...]):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


def _int_tuple(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, (tuple, list)) or not all(isinstance(v, int) and v >= 0 for v in x):
        raise ValueError(f"_rebuild_tensor_v2: {what} must be a tuple of non-negative ints, got {x!r}")
    return tuple(x)


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, *_rest: Any) -> _PendingTensor:
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])."""
    if not isinstance(storage, _Storage): raise TypeError(f"_rebuild_tensor_v2: expected a storage, got {type(storage).__name__}")
    if not isinstance(storage_offset, int) or storage_offset < 0:
        raise ValueError(f"_rebuild_tensor_v2: bad storage offset {storage_offset!r}")
    shape, strides = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if len(shape) != len(strides): raise ValueError(f"_rebuild_tensor_v2: size {shape} and stride {strides} differ in rank")
    if prod(shape) and storage_offset + sum((s - 1) * st for s, st in zip(shape, strides)) >= storage.numel:
        raise ValueError(f"_rebuild_tensor_v2: a tensor of size {shape}, stride {strides} at offset {storage_offset} "
                         f"reaches past its storage of {storage.numel} elements")
    return _PendingTensor(storage, storage_offset, shape, strides)


def _rebuild_parameter(data: Any, *_rest: Any) -> Any:
    """torch._utils._rebuild_parameter(data, requires_grad, hooks[, state]): a parameter loads as its data."""
    return data


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    **{("torch", name): _StorageType(name) for name in _STORAGE_DTYPES},
}


class RestrictedUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only the globals in `_ALLOWED_GLOBALS` and turns storage references into `_Storage`s."""

    def __init__(self, file: Any, name: str, legacy: bool = False):
        super().__init__(file, encoding="utf-8")
        self.name, self.legacy = name, legacy
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS: return _ALLOWED_GLOBALS[(module, name)]
        raise UnsafePickleError(f"{self.name}: the pickle asks for the global '{module}.{name}', which is not allowed: "
                                "torch_load only reads tensors, containers and plain values (state dicts). Nothing "
                                "was executed. If you trust the file, load it with torch and save its state_dict().")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise ValueError(f"unsupported persistent id {pid!r}")
        stype, key, _location, numel = pid[1:5]
        if not isinstance(stype, _StorageType) or not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise ValueError(f"malformed storage reference {pid!r}")
        if len(pid) == 6 and pid[5] is not None:
            raise ValueError(f"storage views (persistent id {pid!r}) from torch < 0.4 are not supported")
        st = self.storages.get(key)
        if st is None: st = self.storages[key] = _Storage(key, stype.dtype, numel)
        elif st.dtype != stype.dtype or st.numel != numel:
            raise ValueError(f"storage {key} is referenced as both {st.numel} x {st.dtype} and {numel} x {stype.dtype}")
        return st


# ---------------------------------------------------------------------------------------------------------------------
# turning pending tensors into Tensors

def _strided_bytes(data: memoryview, itemsize: int, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> bytes:
    """The elements of a strided view, packed row-major."""
    try:
        import numpy as np
        flat = np.frombuffer(data, dtype=np.dtype(f"<u{itemsize}"))
        view = np.lib.stride_tricks.as_strided(flat[offset:], shape=size, strides=[s * itemsize for s in stride])
        return np.ascontiguousarray(view).tobytes()
    except ImportError:
        out = bytearray()
        idx = [0] * len(size)
        for _ in range(prod(size)):
            pos = (offset + sum(i * s for i, s in zip(idx, stride))) * itemsize
            out += data[pos:pos + itemsize]
            for ax in reversed(range(len(size))):  # odometer increment
                idx[ax] += 1
                if idx[ax] < size[ax]: break
                idx[ax] = 0
        return bytes(out)


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(size):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _materialize(p: _PendingTensor, src: Source) -> Tensor:
    st, isz = p.storage, p.storage.dtype.itemsize
    if st.data is None: raise src.error(f"storage {st.key} has no data in the file")
    data = memoryview(st.data).cast("B")
    n = prod(p.size)
    if n == 0: return Tensor.empty(*p.size, dtype=st.dtype)
    if all(st_ == c for s, st_, c in zip(p.size, p.stride, _contiguous_strides(p.size)) if s != 1):
        raw: Any = data[p.offset * isz:(p.offset + n) * isz]
    else:
        raw = _strided_bytes(data, isz, p.offset, p.size, p.stride)
    return tensor_from_bytes(raw, st.dtype, p.size)


def _replace_pending(obj: Any, src: Source) -> Any:
    if isinstance(obj, _PendingTensor): return _materialize(obj, src)
    if isinstance(obj, OrderedDict): return OrderedDict((k, _replace_pending(v, src)) for k, v in obj.items())
    if isinstance(obj, dict): return {k: _replace_pending(v, src) for k, v in obj.items()}
    if isinstance(obj, list): return [_replace_pending(v, src) for v in obj]
    if isinstance(obj, tuple): return tuple(_replace_pending(v, src) for v in obj)
    return obj


# ---------------------------------------------------------------------------------------------------------------------
# the two container formats

def _load_zip(src: Source) -> Any:
    zf = zipfile.ZipFile(src.path if src.path is not None else io.BytesIO(bytes(src.buf)))
    pkls = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") <= 1]
    if not pkls: raise src.error("zip file has no data.pkl: not a PyTorch checkpoint")
    prefix = pkls[0][:-len("data.pkl")]
    if prefix + "byteorder" in zf.namelist() and zf.read(prefix + "byteorder").strip() != b"little":
        raise src.error("big-endian checkpoints are not supported")
    up = RestrictedUnpickler(io.BytesIO(zf.read(pkls[0])), src.name)
    obj = up.load()
    names = set(zf.namelist())
    for key, st in up.storages.items():
        entry = f"{prefix}data/{key}"
        if entry not in names: raise src.error(f"storage {key} is missing (no zip entry {entry!r})")
        data = zf.read(entry)
        if len(data) < st.numel * st.dtype.itemsize:
            raise src.error(f"storage {key} holds {len(data)} bytes, but {st.numel} x {st.dtype} need "
                            f"{st.numel * st.dtype.itemsize}: the file is truncated or corrupt")
        st.data = data
    return obj


class _Reader:
    """A read-only file over a memoryview (no copy of the whole file, unlike io.BytesIO)."""

    def __init__(self, buf: memoryview): self.buf, self.pos = buf, 0
    def tell(self) -> int: return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.buf.nbytes if n is None or n < 0 else min(self.pos + n, self.buf.nbytes)
        out = bytes(self.buf[self.pos:end])
        self.pos = end
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(memoryview(b).cast("B")))
        memoryview(b).cast("B")[:len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        end = self.pos
        while end < self.buf.nbytes and self.buf[end] != 10: end += 1
        return self.read(end + 1 - self.pos)


def _load_legacy(src: Source) -> Any:
    f = _Reader(src.buf)

    def plain() -> Any:
        return RestrictedUnpickler(f, src.name, legacy=True).load()
    if plain() != _LEGACY_MAGIC: raise src.error("not a PyTorch checkpoint (bad magic number)")
    if (proto := plain()) != _LEGACY_PROTOCOL: raise src.error(f"unsupported legacy checkpoint protocol {proto!r}")
    sys_info = plain()
    if isinstance(sys_info, dict) and sys_info.get("little_endian") is False:
        raise src.error("big-endian checkpoints are not supported")
    up = RestrictedUnpickler(f, src.name, legacy=True)
    obj = up.load()
    keys = plain()
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise src.error(f"malformed storage key list {keys!r}")
    pos = f.tell()
    for key in keys:
        (numel,) = struct.unpack("<q", src.read(pos, pos + 8, f"the size of storage {key}"))
        st = up.storages.get(key)
        if st is None: raise src.error(f"storage {key} is in the data block but no tensor uses it")
        if numel != st.numel: raise src.error(f"storage {key} has {numel} elements in the data block, {st.numel} in the pickle")
        nbytes = numel * st.dtype.itemsize
        st.data = src.read(pos + 8, pos + 8 + nbytes, f"storage {key}")
        pos += 8 + nbytes
    missing = [k for k in up.storages if k not in keys]
    if missing: raise src.error(f"storages {missing} are used by tensors but missing from the data block")
    return obj


def torch_load(fn: Tensor | str | pathlib.Path) -> Any:
    """Read a PyTorch checkpoint (`torch.save` output) without torch: returns what was saved, usually a state dict of
    name -> Tensor (nested dicts/lists of tensors and plain values work too).

    Both the zip format and the legacy format (`_use_new_zipfile_serialization=False`) are read. Only tensors,
    parameters, OrderedDicts and plain Python values are allowed in the pickle; anything else raises
    `UnsafePickleError` without being executed. Malformed or truncated files raise `FormatError` naming the file.
    """
    src = Source(fn)
    head = bytes(src.buf[:512])
    loader: Callable[[Source], Any]
    if head[:4] == b"PK\x03\x04": loader = _load_zip
    elif len(head) > 262 and head[257:262] == b"ustar":
        raise src.error("tar-format checkpoints (PyTorch < 0.4) are not supported: re-save the file with a newer torch")
    elif head[:1] == b"\x80": loader = _load_legacy
    elif not head: raise src.error("the file is empty")
    else: raise src.error("not a PyTorch checkpoint (neither a zip archive nor a pickle)")
    try:
        return _replace_pending(loader(src), src)
    except FormatError:
        raise
    except RecursionError:
        raise src.error("the pickle nests too deeply") from None
    except Exception as e:  # noqa: BLE001 - pickle and zip readers raise many kinds of errors on bad input
        raise src.error(f"not a valid PyTorch checkpoint: {type(e).__name__}: {e}") from None


__all__ = ["RestrictedUnpickler", "torch_load"]
