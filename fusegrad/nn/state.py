"""Model state: finding a model's tensors (get_state_dict / get_parameters), loading values into them
(load_state_dict), and checkpoint files: safetensors (safe_save / safe_load), PyTorch .pth (torch_load, in pth.py) and
GGUF (gguf_load, in gguf.py); tar and zip archives as tensors (tar_extract, zip_extract, TensorIO, in archive.py).
Readers take a file name (or a DISK tensor of the file) and raise `FormatError` (a ValueError naming the file) for
malformed or truncated input.

>>> from fusegrad import nn
>>> sorted(nn.state.get_state_dict(nn.Linear(2, 3)))
['bias', 'weight']
"""
from __future__ import annotations

import functools
import json
import pathlib
import struct
import types
from collections.abc import Callable, Mapping
from typing import Any, cast

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod
from fusegrad.nn._io import (
    FormatError,
    LazyStateDict,
    Source,
    UnsafePickleError,
    atomic_write,
    check_shape,
    loader,
    tensor_bytes,
    tensor_from_bytes,
)
from fusegrad.nn.archive import TensorIO, accept_filename, tar_extract, zip_extract
from fusegrad.nn.gguf import ggml_data_to_tensor, gguf_load
from fusegrad.nn.pth import torch_load
from fusegrad.tensor import Tensor
from fusegrad.views import adopt

# ---------------------------------------------------------------------------------------------------------------------
# state dicts


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
    """Every tensor reachable from `obj`, keyed by its attribute path ("layers.0.weight"), like torch's state_dict().

    Walks attributes (`__dict__`), namedtuples, dicts and lists/tuples (keyed by index). A tensor reachable under two
    names (tied weights) appears under both; reference cycles are followed once.
    """
    out: dict[str, Tensor] = {}
    _walk(obj, prefix, tensor_type, out, set())
    return out


def _walk(obj: Any, prefix: str, tensor_type: type, out: dict[str, Tensor], seen: set[int]) -> None:
    if isinstance(obj, tensor_type):
        out[prefix.rstrip(".")] = cast(Tensor, obj)
        return
    if obj is None or isinstance(obj, (str, bytes, int, float, bool, complex, types.ModuleType, type)): return
    if id(obj) in seen: return
    seen.add(id(obj))
    if hasattr(obj, "_asdict") and isinstance(obj, tuple): items: Any = obj._asdict().items()  # type: ignore[attr-defined]   # namedtuple
    elif isinstance(obj, Mapping): items = obj.items()
    elif isinstance(obj, (list, tuple)): items = enumerate(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (types.FunctionType, types.MethodType)): items = vars(obj).items()
    else: return
    for k, v in items: _walk(v, f"{prefix}{k}.", tensor_type, out, seen)


def get_parameters(obj: Any) -> list[Tensor]:
    """The tensors of get_state_dict(obj), each once (what you hand to an optimizer)."""
    return list({id(t): t for t in get_state_dict(obj).values()}.values())


def _shapes_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return a == b or {a, b} <= {(), (1,)}


class StateDictMismatch(KeyError, ValueError):
    """A state dict that doesn't fit a model (missing, unexpected or wrongly shaped keys). The message names the first
    mismatched key in the model's order with both shapes, then counts the rest. A KeyError (missing / unexpected keys,
    as torch) and a ValueError (shapes) at once, so either `except` catches it."""
    def __str__(self) -> str: return str(self.args[0]) if self.args else ""


def _some(keys: list[str], n: int = 5) -> str:
    """The first n keys as a list, and how many more there are."""
    shown = ", ".join(repr(k) for k in keys[:n])
    return f"[{shown}]" if len(keys) <= n else f"[{shown}, ... and {len(keys) - n} more]"


def _shape_in(state_dict: Mapping[str, Any], k: str) -> tuple[int, ...]:
    """The shape of state_dict[k], without reading the tensor when the mapping can tell it (shape_of)."""
    shape_of = getattr(state_dict, "shape_of", None)
    if shape_of is not None: return tuple(shape_of(k))
    v = state_dict[k]
    if not isinstance(v, Tensor):
        raise TypeError(f"load_state_dict: value for {k!r} is a {type(v).__name__}, not a Tensor")
    return v.shape


def check_state_dict(model_sd: Mapping[str, Tensor], state_dict: Mapping[str, Any], strict: bool = True) -> None:
    """Raise StateDictMismatch unless `state_dict` fits `model_sd` (a model's get_state_dict): same shapes for the
    keys both have and, if strict, the same keys. The message leads with the first mismatch in the model's order.

    >>> from fusegrad import nn
    >>> check_state_dict(get_state_dict(nn.Linear(2, 3)), {"weight": Tensor.zeros(3, 2), "bias": Tensor.zeros(3)})

    A lazy state dict with `shape_of(k)` (safe_load's) is checked without reading its tensors.
    """
    missing = [k for k in model_sd if k not in state_dict] if strict else []
    unexpected = [k for k in state_dict if k not in model_sd] if strict else []
    shapes: list[str] = []
    first = None
    for k, t in model_sd.items():
        if k not in state_dict:
            if strict and first is None: first = f"at {k!r}: model has {t.shape}, state_dict has no such key"
            continue
        got = _shape_in(state_dict, k)
        if not _shapes_match(t.shape, got):
            shapes.append(k)
            if first is None: first = f"at {k!r}: model has {t.shape}, state_dict has {got}"
    if first is None and unexpected:
        first = f"at {unexpected[0]!r}: model has no such key, state_dict has {_shape_in(state_dict, unexpected[0])}"
    if first is None: return
    counts = [f"shape mismatches {_some(shapes)}"] if len(shapes) > 1 else []
    if missing: counts.append(f"missing keys {_some(missing)}")
    if unexpected: counts.append(f"unexpected keys {_some(unexpected)}")
    raise StateDictMismatch(f"load_state_dict{' (strict)' if strict else ''}: the state dict doesn't fit the model: "
                            f"first mismatch {first}" + (f"; in all: {', '.join(counts)}" if counts else ""))


def load_state_dict(model: Any, state_dict: Mapping[str, Tensor], strict: bool = True, verbose: bool = True,
                    consume: bool = False, realize: bool = True) -> list[Tensor]:
    """Copy `state_dict` values into the model's tensors (cast to each tensor's dtype and device); returns them.

    strict: every model tensor must be present and every key used (as torch); otherwise missing ones are reported
    (if verbose) and skipped. Shapes must match, except that () and (1,) are interchangeable. A state dict that doesn't
    fit raises StateDictMismatch (a KeyError and a ValueError) naming the first mismatched key and both shapes.
    consume: delete each key from `state_dict` once loaded (frees memory while loading big checkpoints). realize:
    compute the tensors now.
    """
    model_sd = get_state_dict(model)
    check_state_dict(model_sd, state_dict, strict)
    missing = [k for k in model_sd if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_sd]
    if verbose and (missing or unexpected):
        print(f"load_state_dict: skipped missing keys {missing}; ignored unexpected keys {unexpected}")
    loaded, taken = [], set()
    for k, t in model_sd.items():
        if k not in state_dict: continue
        v = state_dict[k]
        v = v.detach().cast(t.dtype).reshape(t.shape)   # detach: no autograd link to the source
        # a fresh layer's lazy initial weights take a loaded buffer as it is, instead of a kernel copying it in
        if not adopt(t, v, taken):
            t.assign(v.shard_like(t) if isinstance(t.device, tuple) else v.to(t.device))  # sharded: each its slice
        loaded.append(t)
        if consume:
            del state_dict[k]  # type: ignore[attr-defined]
            if realize: t.realize()   # one at a time, so each source tensor can be freed as it is copied
    # otherwise all in one realize: each realize scans the live tensors, so one per tensor is quadratic in model size
    if realize and not consume and loaded: Tensor.realize(*loaded)
    return loaded


# ---------------------------------------------------------------------------------------------------------------------
# safetensors: u64 little-endian header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {}},
# then the tensors' raw little-endian bytes (offsets relative to the end of the header)

SAFETENSORS_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool, "U8": dtypes.uint8, "I8": dtypes.int8, "U16": dtypes.uint16, "I16": dtypes.int16,
    "U32": dtypes.uint32, "I32": dtypes.int32, "U64": dtypes.uint64, "I64": dtypes.int64,
    "F16": dtypes.float16, "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64}
_SAFETENSORS_NAMES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
_MAX_HEADER = 100 << 20


def safe_save(tensors: Mapping[str, Tensor], fn: str | pathlib.Path, metadata: dict[str, str] | None = None) -> None:
    """Write tensors to a .safetensors file (atomically: a crash mid-write leaves any old file intact).

    >>> import tempfile, os
    >>> fn = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> safe_save({"w": Tensor([1.0, 2.0])}, fn)
    >>> safe_load(fn)["w"].tolist()
    [1.0, 2.0]
    """
    header: dict[str, Any] = {}
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for k, t in tensors.items():
        if not isinstance(t, Tensor): raise TypeError(f"safe_save: {k!r} is a {type(t).__name__}, not a Tensor")
        if k == "__metadata__": raise ValueError("'__metadata__' is reserved in safetensors and can't name a tensor")
        if t.dtype not in _SAFETENSORS_NAMES: raise ValueError(f"safe_save: {k!r} has dtype {t.dtype}, not storable")
        header[k] = {"dtype": _SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes()]}
        offset += t.nbytes()
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)   # the data starts 8-byte aligned

    def write(f: Any) -> None:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors.values(): f.write(tensor_bytes(t))
    atomic_write(fn, write)


def _safetensors_header(src: Source) -> tuple[int, dict[str, Any]]:
    if len(src) < 8: raise src.error(f"too short for a safetensors file ({len(src)} bytes, the header length alone is 8)")
    (n,) = struct.unpack("<Q", src.read(0, 8))
    if n > _MAX_HEADER: raise src.error(f"safetensors header length {n} is implausible: not a safetensors file?")
    raw = bytes(src.read(8, 8 + n, "the safetensors header"))
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise src.error(f"safetensors header is not valid JSON: {e}") from None
    except RecursionError:
        raise src.error(f"safetensors header JSON nests too deeply (at byte {8 + _too_deep_at(raw)})") from None
    if not isinstance(header, dict): raise src.error("safetensors header must be a JSON object")
    return n, header


def _too_deep_at(raw: bytes, limit: int = 200) -> int:
    """The offset in a JSON text where bracket nesting first passes `limit` (brackets in strings don't count)."""
    depth, in_str, esc = 0, False, False
    for i, c in enumerate(raw):
        if in_str:
            if esc: esc = False
            elif c == 0x5C: esc = True
            elif c == 0x22: in_str = False
        elif c == 0x22: in_str = True
        elif c in b"[{":
            depth += 1
            if depth > limit: return i
        elif c in b"]}": depth -= 1
    return 0


@loader
def safe_load_metadata(fn: Tensor | str | pathlib.Path, mmap: bool = True) -> tuple[memoryview, int, dict[str, Any]]:
    """(the file's bytes as a read-only memoryview, the header length, the parsed JSON header incl. "__metadata__")."""
    src = Source(fn, mmap=mmap)
    n, header = _safetensors_header(src)
    return src.buf, n, header


@loader
def safe_load(fn: Tensor | str | pathlib.Path, mmap: bool = True) -> LazyStateDict:
    """Open a .safetensors file: returns name -> Tensor, each copied out of the memory-mapped file when first used.

    Each read checks the file's current size (a file truncated after opening raises FormatError); mmap=False reads the
    whole file into memory now instead, for files that another process may change."""
    src = Source(fn, mmap=mmap)
    n, header = _safetensors_header(src)
    data_start, data_len = 8 + n, len(src) - 8 - n
    entries: dict[str, tuple[tuple[int, ...], Callable[[], Tensor]]] = {}
    for k, info in header.items():
        if k == "__metadata__": continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise src.error(f"safetensors entry {k!r} needs dtype, shape and data_offsets, got {info!r}")
        if type(info["dtype"]) is not str or info["dtype"] not in SAFETENSORS_DTYPES:
            raise src.error(f"tensor {k!r} has unsupported dtype {info['dtype']!r} (supported: {sorted(SAFETENSORS_DTYPES)})")
        dt, shape, offs = SAFETENSORS_DTYPES[info["dtype"]], info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
            raise src.error(f"tensor {k!r} has an invalid shape {shape!r}")
        check_shape(src, k, shape)
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)
                and 0 <= offs[0] <= offs[1]):
            raise src.error(f"tensor {k!r} has invalid data_offsets {offs!r}")
        if offs[1] - offs[0] != prod(shape) * dt.itemsize:
            raise src.error(f"tensor {k!r}: data_offsets {offs} hold {offs[1] - offs[0]} bytes, but {info['dtype']} "
                            f"shape {shape} needs {prod(shape) * dt.itemsize}")
        if offs[1] > data_len:
            raise src.error(f"tensor {k!r} ends at byte {offs[1]} of the data, but the file holds only {data_len} bytes "
                            "after the header: the file is truncated")
        entries[k] = (tuple(shape), functools.partial(_read_tensor, src, k, dt, tuple(shape),
                                                      data_start + offs[0], data_start + offs[1]))
    meta = header.get("__metadata__", {})
    return LazyStateDict(src.name, entries, meta if isinstance(meta, dict) else {})


def _read_tensor(src: Source, name: str, dt: DType, shape: tuple[int, ...], start: int, end: int) -> Tensor:
    return tensor_from_bytes(src.read(start, end, f"tensor {name!r}"), dt, shape)


__all__ = [
    "FormatError",
    "LazyStateDict",
    "StateDictMismatch",
    "TensorIO",
    "accept_filename",
    "tar_extract",
    "zip_extract",
    "UnsafePickleError",
    "check_state_dict",
    "get_parameters",
    "get_state_dict",
    "ggml_data_to_tensor",
    "gguf_load",
    "load_state_dict",
    "safe_load",
    "safe_load_metadata",
    "safe_save",
    "torch_load",
]
