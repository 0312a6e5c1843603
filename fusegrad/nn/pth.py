"""PyTorch checkpoint reader (`torch_load`): .pth/.pt files in the zip format (torch >= 1.6) and the legacy pickle
format (`_use_new_zipfile_serialization=False`), without importing torch.

A checkpoint is a pickle whose tensors point at raw storages (zip entries `<name>/data/<key>`, or a block after the
pickle in the legacy format). The pickle is read by a restricted Unpickler: only the few globals a state dict needs are
resolved, to stand-ins defined here; any other global (a class of the saving program, `os.system`, ...) is refused
before anything is called.

Hostile files: the unpickler is the pure-Python one (its memo is a dict, so a huge memo index can't allocate), BUILD
is only allowed on OrderedDicts (it can't retarget a storage or touch a module-level object), dict/set keys must be
plain values (hashing a shared-tuple DAG would take exponential time), objects shared in the pickle stay shared,
every view is checked against its storage's real byte count when it is read, stride-0 (expanded) dimensions stay
expanded views, compressed zip entries are size-checked before inflating, and the bytes copied out of storages are
bounded by the file's size.
"""
from __future__ import annotations

import io
import mmap
import pathlib
import pickle
import reprlib
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod
from fusegrad.ir.shape import strides_for
from fusegrad.nn._io import MAX_DIM, FormatError, Source, UnsafePickleError, tensor_from_bytes
from fusegrad.tensor import Tensor

_STORAGE_DTYPES: dict[str, DType] = {
    "FloatStorage": dtypes.float32, "DoubleStorage": dtypes.float64, "HalfStorage": dtypes.float16,
    "BFloat16Storage": dtypes.bfloat16, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
    "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


_MAX_INFLATE = 64 << 20     # compressed zip entries may inflate to max(this, 8 x the archive's size) bytes in all
_MAX_COPY = 64 << 20        # bytes copied out of storages into tensors: at most 2 x the storages' bytes + this
_short = reprlib.Repr()
_short.maxlevel, _short.maxstring, _short.maxother = 3, 60, 60


def _r(x: Any) -> str:
    """A bounded repr for error messages (a pickle can make objects whose full repr is exponentially long)."""
    return _short.repr(x)


class _StorageType:
    """Stands in for torch.FloatStorage etc. inside a pickle: only carries the element dtype (read-only)."""
    __slots__ = ("dtype", "name")

    def __init__(self, name: str):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dtype", _STORAGE_DTYPES[name])
    def __setattr__(self, k: str, v: Any) -> None: raise AttributeError(f"torch.{self.name} is read-only")
    def __repr__(self) -> str: return f"torch.{self.name}"


class _Storage:
    """A flat run of `numel` elements; its bytes are filled in after the pickle is read."""
    __slots__ = ("data", "dtype", "key", "numel")

    def __init__(self, key: str, dtype: DType, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel
        self.data: bytes | memoryview | None = None


class _PendingTensor:
    """A tensor view of a storage, made into a Tensor once the storage bytes are known."""
    __slots__ = ("offset", "size", "storage", "stride")

    def __init__(self, storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...]):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


def _int_tuple(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, (tuple, list)) or len(x) > 64 or not all(type(v) is int and v >= 0 for v in x):
        raise ValueError(f"_rebuild_tensor_v2: {what} must be a tuple of at most 64 non-negative ints, got {_r(x)}")
    return tuple(x)


def _last_index(offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    return offset + sum((s - 1) * st for s, st in zip(size, stride))


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, *_rest: Any) -> _PendingTensor:
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])."""
    if not isinstance(storage, _Storage):
        raise TypeError(f"_rebuild_tensor_v2: expected a storage, got {type(storage).__name__}")
    if type(storage_offset) is not int or storage_offset < 0:
        raise ValueError(f"_rebuild_tensor_v2: bad storage offset {_r(storage_offset)}")
    shape, strides = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if any(d >= MAX_DIM for d in shape):
        raise ValueError(f"_rebuild_tensor_v2: size {shape} has a dimension >= 2**48")
    if len(shape) != len(strides): raise ValueError(f"_rebuild_tensor_v2: size {shape} and stride {strides} differ in rank")
    if prod(shape) and _last_index(storage_offset, shape, strides) >= storage.numel:
        raise ValueError(f"_rebuild_tensor_v2: a tensor of size {shape}, stride {strides} at offset {storage_offset} "
                         f"reaches past its storage of {storage.numel} elements")
    return _PendingTensor(storage, storage_offset, shape, strides)


def _rebuild_parameter(data: Any, *_rest: Any) -> Any:
    """torch._utils._rebuild_parameter(data, requires_grad, hooks[, state]): a parameter loads as its data."""
    return data


def _plain_key(k: Any) -> bool:
    """A dict/set key whose hash is cheap: a scalar, or a flat tuple of scalars."""
    if k is None or type(k) in (str, bytes, int, float, bool): return True
    return type(k) is tuple and len(k) <= 64 and all(v is None or type(v) in (str, bytes, int, float, bool) for v in k)


def _check_keys(keys: Any) -> None:
    for k in keys:
        if not _plain_key(k): raise ValueError(f"dict or set key {_r(k)} is not a plain value (str, int, ...)")


def _ordered_dict(*args: Any) -> OrderedDict:
    """collections.OrderedDict(), or OrderedDict(list of (key, value) pairs) with plain keys."""
    if len(args) > 1: raise ValueError("OrderedDict takes at most one argument")
    if args:
        pairs = args[0]
        if not isinstance(pairs, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
            raise ValueError(f"OrderedDict({_r(args[0])}): expected a list of (key, value) pairs")
        _check_keys(p[0] for p in args[0])
    return OrderedDict(*args)


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    **{("torch", name): _StorageType(name) for name in _STORAGE_DTYPES},
}


class RestrictedUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """An Unpickler that resolves only the globals in `_ALLOWED_GLOBALS` and turns storage references into `_Storage`s.

    It is the pure-Python unpickler with a few opcodes tightened (see the module docstring): nothing in a pickle can
    change state outside the objects this load creates."""
    dispatch: ClassVar[dict] = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, file: Any, name: str, legacy: bool = False):
        super().__init__(file, encoding="utf-8")
        self.name, self.legacy = name, legacy
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS: return _ALLOWED_GLOBALS[(module, name)]
        raise UnsafePickleError(f"{self.name}: the pickle asks for the global '{module}.{name}', which is not allowed: "
                                "torch_load only reads tensors, containers and plain values (state dicts). Nothing "
                                "was executed. If you trust the file, load it with torch and save its state_dict().")

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        # torch pickles an OrderedDict's attributes (its `_metadata`) with BUILD; nothing else may be modified
        if type(inst) is not OrderedDict or not isinstance(state, dict) or not all(type(k) is str for k in state):
            raise ValueError(f"the pickle modifies a {type(inst).__name__} with BUILD, which is not allowed")
        inst.__dict__.update(state)

    def load_setitem(self) -> None:
        _check_keys(self.stack[-2:-1])
        super().load_setitem()

    def load_setitems(self) -> None:   # after MARK, self.stack holds just the key, value, ... run
        _check_keys(self.stack[0::2])
        super().load_setitems()

    def load_dict(self) -> None:
        _check_keys(self.stack[0::2])
        super().load_dict()

    def load_set_items(self) -> None:  # ADDITEMS and FROZENSET
        _check_keys(self.stack)

    def persistent_load(self, pid: Any) -> Any:
        if not (type(pid) is tuple and len(pid) in (5, 6) and pid[0] == "storage"):
            raise ValueError(f"unsupported persistent id {_r(pid)}")
        stype, key, _location, numel = pid[1:5]
        if not isinstance(stype, _StorageType) or type(key) is not str or type(numel) is not int or numel < 0:
            raise ValueError(f"malformed storage reference {_r(pid)}")
        if len(pid) == 6 and pid[5] is not None:
            raise ValueError(f"storage views (persistent id {_r(pid)}) from torch < 0.4 are not supported")
        st = self.storages.get(key)
        if st is None: st = self.storages[key] = _Storage(key, stype.dtype, numel)
        elif st.dtype != stype.dtype or st.numel != numel:
            raise ValueError(f"storage {key} is referenced as both {st.numel} x {st.dtype} and {numel} x {stype.dtype}")
        return st


_D = RestrictedUnpickler.dispatch
_D[pickle.BUILD[0]] = RestrictedUnpickler.load_build
_D[pickle.SETITEM[0]] = RestrictedUnpickler.load_setitem
_D[pickle.SETITEMS[0]] = RestrictedUnpickler.load_setitems
_D[pickle.DICT[0]] = RestrictedUnpickler.load_dict
_D[pickle.ADDITEMS[0]] = lambda self: (self.load_set_items(), pickle._Unpickler.load_additems(self))  # type: ignore
_D[pickle.FROZENSET[0]] = lambda self: (self.load_set_items(), pickle._Unpickler.load_frozenset(self))  # type: ignore


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


class _Materializer:
    """Turns the pending tensors of an unpickled object into Tensors: each view is checked against the bytes its storage
    really has, stride-0 dims become expand()s, identical views give the same Tensor, shared containers stay shared,
    and the bytes copied for strided views are bounded (a small file can't ask for unbounded copies)."""

    def __init__(self, src: Source, storages: dict[str, _Storage]):
        self.src = src
        total = sum(len(memoryview(st.data).cast("B")) for st in storages.values() if st.data is not None)
        self.budget = 2 * total + _MAX_COPY
        self.views: dict[tuple, Tensor] = {}
        self.done: dict[int, Any] = {}

    def tensor(self, p: _PendingTensor) -> Tensor:
        st, isz, src = p.storage, p.storage.dtype.itemsize, self.src
        if st.data is None: raise src.error(f"storage {st.key} has no data in the file")
        key = (id(st), p.offset, p.size, p.stride)
        if key in self.views: return self.views[key]
        data = memoryview(st.data).cast("B")
        if prod(p.size) == 0: out = Tensor.empty(*p.size, dtype=st.dtype)
        else:
            # the real byte count, now: whatever the pickle claimed about the storage earlier
            if (last := _last_index(p.offset, p.size, p.stride)) >= min(st.numel, data.nbytes // isz):
                raise src.error(f"a tensor of size {p.size}, stride {p.stride} at offset {p.offset} reaches element "
                                f"{last} of storage {st.key}, which holds {min(st.numel, data.nbytes // isz)}")
            # stride-0 dims stay broadcast (expand), size-1 dims need no stride: copy only the distinct elements
            size = tuple(1 if st_ == 0 else s for s, st_ in zip(p.size, p.stride))
            stride = tuple(0 if s == 1 else st_ for s, st_ in zip(size, p.stride))
            n = prod(size)
            if n * isz > self.budget:   # distinct views of one storage could otherwise copy it over and over
                raise src.error(f"the tensor views copy more than twice the storages' bytes plus {_MAX_COPY >> 20} MiB: "
                                "overlapping views this large are not supported")
            self.budget -= n * isz
            if all(st_ == c for s, st_, c in zip(size, stride, strides_for(size)) if s != 1):
                raw: Any = data[p.offset * isz:(p.offset + n) * isz]
            else: raw = _strided_bytes(data, isz, p.offset, size, stride)
            out = tensor_from_bytes(raw, st.dtype, size)
            if size != p.size: out = out.expand(p.size)
        self.views[key] = out
        return out

    def replace(self, obj: Any) -> Any:
        """obj with its pending tensors replaced: lists and dicts in place (they are this load's own objects), tuples
        rebuilt once; each object is visited once, however often the pickle shares it."""
        if isinstance(obj, _PendingTensor): return self.tensor(obj)
        if not isinstance(obj, (list, dict, tuple)): return obj
        if id(obj) in self.done: return self.done[id(obj)]
        self.done[id(obj)] = obj   # a cycle back to obj sees obj itself
        if isinstance(obj, list):
            for i, v in enumerate(obj): obj[i] = self.replace(v)
        elif isinstance(obj, dict):
            for k, v in obj.items(): obj[k] = self.replace(v)
        else:
            new = tuple(self.replace(v) for v in obj)
            if any(a is not b for a, b in zip(new, obj)): self.done[id(obj)] = obj = new
        return obj


# ---------------------------------------------------------------------------------------------------------------------
# the two container formats

def _load_zip(src: Source) -> tuple[Any, dict[str, _Storage]]:
    zf = zipfile.ZipFile(src.path if src.path is not None else io.BytesIO(bytes(src.buf)))
    names = set(zf.namelist())
    pkls = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") <= 1]
    if not pkls: raise src.error("zip file has no data.pkl: not a PyTorch checkpoint")
    prefix = pkls[0][:-len("data.pkl")]
    inflate_left = max(_MAX_INFLATE, 8 * len(src))

    def read(entry: str, need: int | None = None, cap: int | None = None) -> bytes:
        """An entry's bytes (exactly the first `need`, or at most `cap`), its declared size checked before anything
        is inflated."""
        nonlocal inflate_left
        info = zf.getinfo(entry)
        size = min(info.file_size, need if need is not None else cap if cap is not None else info.file_size)
        if need is not None and info.file_size < need:
            raise src.error(f"zip entry {entry!r} holds {info.file_size} bytes, but {need} are needed: "
                            "the file is truncated or corrupt")
        if info.compress_type != zipfile.ZIP_STORED:
            if size > inflate_left:
                raise src.error(f"compressed zip entry {entry!r} would inflate to {size} bytes, more than this "
                                f"{len(src)}-byte file may ask for (torch stores checkpoints uncompressed)")
            inflate_left -= size
        elif info.compress_size < size:
            raise src.error(f"zip entry {entry!r} claims {size} bytes but stores {info.compress_size}")
        with zf.open(info) as f: data = f.read(size)
        if len(data) != size: raise src.error(f"zip entry {entry!r} is truncated")
        return data

    if prefix + "byteorder" in names and read(prefix + "byteorder", cap=64).strip() != b"little":
        raise src.error("big-endian checkpoints are not supported")
    up = RestrictedUnpickler(io.BytesIO(read(pkls[0])), src.name)
    obj = up.load()
    for key, st in up.storages.items():
        entry = f"{prefix}data/{key}"
        if entry not in names: raise src.error(f"storage {key} is missing (no zip entry {entry!r})")
        try:
            st.data = read(entry, st.numel * st.dtype.itemsize)
        except FormatError as e:
            raise src.error(f"storage {key} ({st.numel} x {st.dtype}): {str(e)[len(src.name) + 2:]}") from None
    return obj, up.storages


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
        obj = self.buf.obj
        if isinstance(obj, (bytes, mmap.mmap)) and len(obj) == self.buf.nbytes:   # the whole file: search in C
            end = obj.find(b"\n", self.pos)
            end = self.buf.nbytes - 1 if end < 0 else end
        else:
            end = self.pos
            while end < self.buf.nbytes and self.buf[end] != 10: end += 1
        return self.read(end + 1 - self.pos)


def _load_legacy(src: Source) -> tuple[Any, dict[str, _Storage]]:
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
        raise src.error(f"malformed storage key list {_r(keys)}")
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
    if missing: raise src.error(f"storages {_r(missing)} are used by tensors but missing from the data block")
    return obj, up.storages


def torch_load(fn: Tensor | str | pathlib.Path, mmap: bool = True) -> Any:
    """Read a PyTorch checkpoint (`torch.save` output) without torch: returns what was saved, usually a state dict of
    name -> Tensor (nested dicts/lists of tensors and plain values work too).

    Both the zip format and the legacy format (`_use_new_zipfile_serialization=False`) are read. Only tensors,
    parameters, OrderedDicts and plain Python values are allowed in the pickle; anything else raises
    `UnsafePickleError` without being executed. Malformed or truncated files raise `FormatError` naming the file.
    mmap=False reads the file into memory first (for files another process may truncate while they load).
    """
    src = Source(fn, mmap=mmap)
    head = bytes(src.buf[:512])
    loader: Callable[[Source], tuple[Any, dict[str, _Storage]]]
    if head[:4] == b"PK\x03\x04": loader = _load_zip
    elif len(head) > 262 and head[257:262] == b"ustar":
        raise src.error("tar-format checkpoints (PyTorch < 0.4) are not supported: re-save the file with a newer torch")
    elif head[:1] == b"\x80": loader = _load_legacy
    elif not head: raise src.error("the file is empty")
    else: raise src.error("not a PyTorch checkpoint (neither a zip archive nor a pickle)")
    try:
        obj, storages = loader(src)
        return _Materializer(src, storages).replace(obj)
    except FormatError:
        raise
    except RecursionError:
        raise src.error("the pickle nests too deeply") from None
    except Exception as e:  # noqa: BLE001 - pickle and zip readers raise many kinds of errors on bad input
        raise src.error(f"not a valid PyTorch checkpoint: {type(e).__name__}: {str(e)[:300]}") from None


__all__ = ["RestrictedUnpickler", "torch_load"]
