"""Devices and memory: `Device[name]` opens a backend from `runtime/ops_<name>.py`; `Buffer` is device memory.

The backend contract (see docs/runtime.md): an `Allocator` (alloc/free/copyin/copyout), a `Compiler` (source -> binary,
cached on disk), a `Program` (launch a binary on buffers) and a `Renderer` (linear program -> source).
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import pkgutil
from typing import Any, Callable

from fusegrad.dtype import DType, dtypes
from fusegrad import diskcache
from fusegrad.helpers import DEBUG, DEV, GlobalCounters, hash_bytes


class _Device:
    """Registry of backends. `Device["CPU"]` opens (once) and returns the device; `Device.DEFAULT` is the default."""

    @functools.cached_property
    def _devices(self) -> list[str]:
        import fusegrad.runtime
        return sorted(m.name[4:].upper() for m in pkgutil.iter_modules(fusegrad.runtime.__path__)
                      if m.name.startswith("ops_"))

    def canonicalize(self, device: str | None) -> str:
        """'cpu' -> 'CPU', 'cpu:0' -> 'CPU', 'cpu:1' -> 'CPU:1'; None -> the default device."""
        if device is None: return self.DEFAULT
        if not isinstance(device, str): raise TypeError(f"device must be a string, got {type(device).__name__}")
        parts = device.split(":", 1)
        name = parts[0].upper()
        if name not in self._devices:
            raise RuntimeError(f"unknown device {device!r}; known devices: {', '.join(self._devices)}")
        if len(parts) == 2 and parts[1] not in ("", "0"): return f"{name}:{parts[1]}"
        return name

    def __getitem__(self, device: str) -> "Compiled":
        # by the name as given, once it was opened: every buffer allocation and kernel launch asks (canonicalize is
        # a pure function of a name; None, the default device, is not kept: DEV may change it)
        if device.__class__ is not str: return self._open(self.canonicalize(device))
        if (d := self._by_name.get(device)) is None: d = self._by_name[device] = self._open(self.canonicalize(device))
        return d

    @functools.cached_property
    def _by_name(self) -> dict[str, "Compiled"]: return {}

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one device object per name for the process
    def _open(self, device: str) -> "Compiled":
        mod = importlib.import_module(f"fusegrad.runtime.ops_{device.split(':')[0].lower()}")
        cls = next(v for k, v in mod.__dict__.items() if k.lower() == device.split(":")[0].lower() + "device")
        ret = cls(device)
        if DEBUG >= 1: print(f"opened device {device} from pid:{os.getpid()}")
        return ret

    @property
    def DEFAULT(self) -> str:
        if DEV.value: return self.canonicalize(DEV.value)
        return self._default

    @DEFAULT.setter
    def DEFAULT(self, value: str) -> None:
        raise AttributeError("Device.DEFAULT can't be assigned; use Context(DEV=...) or the DEV environment variable")

    @functools.cached_property
    def _default(self) -> str:
        from fusegrad.runtime.ops_cpu import find_compiler
        return "CPU" if find_compiler(raise_error=False) is not None else "PYTHON"

    def get_available_devices(self) -> list[str]:
        out = []
        for d in self._devices:
            try:
                self[d]
                out.append(d)
            except Exception:
                pass
        return out


Device = _Device()


# set once a tuple of devices was used: until then no graph can hold a multi-device node, and the scheduler skips the
# walk that looks for them (schedule/multi.py)
multi_device_seen = False


def canonical_devices(devices: Any, what: str) -> tuple[str, ...]:
    """A tuple/list of device names -> canonical names; at least one, no repeats."""
    global multi_device_seen
    out = tuple(Device.canonicalize(d) for d in devices)
    if not out: raise ValueError(f"{what}: an empty tuple of devices")
    if len(set(out)) != len(out): raise ValueError(f"{what}: a device appears twice in {out}")
    multi_device_seen = True
    return out


def single_device(device: Any, what: str) -> Any:
    """`device` itself, or a tuple/list of devices (a tensor on several devices, fusegrad/sharding.py) canonicalized."""
    if isinstance(device, (tuple, list)): return canonical_devices(device, what)
    return device


def canonical_device(device: Any, what: str = "Tensor") -> Any:
    """The canonical name of one device (None: the default device), or a tuple of them."""
    d = single_device(device, what)
    return d if isinstance(d, tuple) else Device.canonicalize(d)


# ---------------------------------------------------------------------------------------------------------------------
# memory

class Allocator:
    """Backend memory. Subclasses implement _alloc/_free/_copyin/_copyout; freed buffers are kept for reuse (LRU)."""

    def __init__(self) -> None:
        self.cache: dict[int, list[Any]] = {}

    def alloc(self, nbytes: int) -> Any:
        if (c := self.cache.get(nbytes)): return c.pop()
        try:
            return self._alloc(nbytes)
        except MemoryError:
            self.free_cache()
            return self._alloc(nbytes)

    def free(self, opaque: Any, nbytes: int) -> None:
        if LRU_CACHE: self.cache.setdefault(nbytes, []).append(opaque)
        else: self._free(opaque, nbytes)

    def free_cache(self) -> None:
        for nbytes, opaques in self.cache.items():
            for o in opaques: self._free(o, nbytes)
        self.cache.clear()

    def _alloc(self, nbytes: int) -> Any: raise NotImplementedError
    def _free(self, opaque: Any, nbytes: int) -> None: pass
    def _copyin(self, dest: Any, src: memoryview) -> None: raise NotImplementedError
    def _copyout(self, dest: memoryview, src: Any) -> None: raise NotImplementedError
    def _offset(self, opaque: Any, offset: int, nbytes: int) -> Any: raise NotImplementedError  # optional: views


LRU_CACHE = int(os.getenv("LRU", "1"))


class Buffer:
    """`size` elements of `dtype` on `device`, allocated on first use."""

    def __init__(self, device: str, size: int, dtype: DType, opaque: Any = None, base: "Buffer | None" = None):
        if size < 0: raise ValueError(f"negative buffer size {size}")
        self.device, self.size, self.dtype, self.base = device, size, dtype, base
        self._opaque = opaque
        if opaque is not None and base is None: self._count_alloc(1)

    @staticmethod
    def supports_views(device: str) -> bool:
        return type(Device[device].allocator)._offset is not Allocator._offset

    def view(self, size: int, dtype: DType) -> "Buffer":
        """A buffer sharing this one's memory (from offset 0); keeps this one alive."""
        assert size * dtype.itemsize <= self.nbytes, "view larger than its base"
        return Buffer(self.device, size, dtype, base=self)

    @property
    def nbytes(self) -> int: return self.size * self.dtype.itemsize

    @property
    def allocator(self) -> Allocator: return Device[self.device].allocator

    def is_allocated(self) -> bool: return self._opaque is not None

    def ensure_allocated(self) -> "Buffer":
        if self._opaque is None and self.base is not None:
            self._opaque = self.allocator._offset(self.base.opaque, 0, self.nbytes)
        elif self._opaque is None:
            self._opaque = self.allocator.alloc(max(self.nbytes, 1))
            self._count_alloc(1)
        return self

    @property
    def opaque(self) -> Any:
        return self.ensure_allocated()._opaque

    def _count_alloc(self, sign: int) -> None:
        GlobalCounters.mem_used += sign * self.nbytes
        d = GlobalCounters.mem_used_per_device
        d[self.device] = d.get(self.device, 0) + sign * self.nbytes

    def __del__(self) -> None:
        if getattr(self, "_opaque", None) is None or getattr(self, "base", None) is not None: return
        try:
            self._count_alloc(-1)
            self.allocator.free(self._opaque, max(self.nbytes, 1))
        except Exception:  # interpreter shutdown
            pass

    def copyin(self, data: memoryview | bytes) -> "Buffer":
        mv = memoryview(data).cast("B")
        if mv.nbytes != self.nbytes:
            raise ValueError(f"copyin of {mv.nbytes} bytes into a buffer of {self.nbytes} bytes")
        if self.nbytes: self.allocator._copyin(self.opaque, mv)
        return self

    def copyout(self, dest: memoryview) -> memoryview:
        dest = memoryview(dest).cast("B")
        if dest.nbytes != self.nbytes: raise ValueError(f"copyout of {self.nbytes} bytes into {dest.nbytes} bytes")
        if self.nbytes:
            Device[self.device].synchronize()
            self.allocator._copyout(dest, self.opaque)
        return dest

    def copy_from(self, src: "Buffer") -> "Buffer":
        """Copy another buffer's contents here (any two devices) through one writable host staging buffer: as_bytes()
        would add a zeroed bytes() copy, and a read-only view costs the CPU allocator one more (64 MiB: ~300 -> ~55 ms)."""
        return self.copyin(src.copyout(memoryview(bytearray(src.nbytes))))

    def as_bytes(self) -> bytes:
        out = bytearray(self.nbytes)
        self.copyout(memoryview(out))
        return bytes(out)

    def __repr__(self) -> str:
        return f"<buf {self.device} size:{self.size} dtype:{self.dtype}{' unallocated' if self._opaque is None else ''}>"


# ---------------------------------------------------------------------------------------------------------------------
# compile cache: one SQLite file per cache directory (diskcache.py), entries checked by checksum on read

class CompileError(Exception):
    pass


def diskcache_del(table: str, key: str) -> None:
    """Evict an entry (one that passed its checksum but turned out unusable); missing is fine."""
    diskcache.delete(table, key)


def diskcache_get(table: str, key: str) -> bytes | None:
    """The cached payload, or None (missing, damaged, or unusable for `table`: then evicted, so it is redone)."""
    return diskcache.get(table, key, CACHE_VALIDATORS.get(table))


def _valid_program(payload: bytes) -> bool:
    """A "program" cache entry (the engine's rendered ProgramSpec) is a JSON object with these fields."""
    try: d = json.loads(payload)
    except ValueError: return False
    want = {"name": str, "src": str, "nbufs": int, "ops": int, "mem": int, "global_size": list, "local_size": list,
            "display_name": str, "thread_size": int}
    return isinstance(d, dict) and all(isinstance(d.get(k), t) for k, t in want.items())


# table -> a check that a checksummed entry is usable; an entry that fails it is evicted and reads as missing
CACHE_VALIDATORS: dict[str, Callable[[bytes], bool]] = {"program": _valid_program}


def diskcache_put(table: str, key: str, payload: bytes) -> None:
    diskcache.put(table, key, payload)


class Compiler:
    """Turns rendered source into a binary. `cachekey` names the disk-cache table (None disables caching)."""

    def __init__(self, cachekey: str | None = None):
        self.cachekey = cachekey

    def compile(self, src: str) -> bytes:
        return src.encode()

    def compile_cached(self, src: str) -> bytes:
        if self.cachekey is None: return self.compile(src)
        key = hash_bytes(src)
        if (lib := diskcache_get(self.cachekey, key)) is not None: return lib
        lib = self.compile(src)
        diskcache_put(self.cachekey, key, lib)
        return lib


class Compiled:
    """An opened device: the four pieces of the backend contract."""

    def __init__(self, device: str, allocator: Allocator, renderer: Any, compiler: Compiler,
                 runtime: Callable[..., Any]):
        self.device, self.allocator, self.renderer, self.compiler, self.runtime = \
            device, allocator, renderer, compiler, runtime

    def synchronize(self) -> None:
        """Wait for all queued work (devices here run synchronously unless they override this)."""


def is_dtype_supported(dtype: DType, device: str | None = None) -> bool:
    return dtype in Device[Device.canonicalize(device)].renderer.supported_dtypes()


__all__ = ["Device", "Buffer", "Allocator", "Compiler", "Compiled", "CompileError", "dtypes", "is_dtype_supported"]


# backends that have no runtime/ops_<name>.py yet, and what each will need
PLANNED: dict[str, str] = {}

if __name__ == "__main__":  # python -m fusegrad.device: every backend, and whether it opens here
    from fusegrad.device import Device as _registry  # the imported module's registry, not this __main__ copy
    for _name in _registry._devices + [p for p in PLANNED if p not in _registry._devices]:
        if _name not in _registry._devices: _status, _why = "unavailable", f"not built yet; {PLANNED[_name]}"
        else:
            try:
                _dev = _registry[_name]
                _status, _why = "available", f"{type(_dev.renderer).__name__} {getattr(_dev, 'name', '')}".strip()
            except Exception as e:  # the backend's own message says what is missing and how to install it
                _status, _why = "unavailable", str(e).splitlines()[0]
        print(f"{_name:7s} {_status:11s} {'default' if _name == _registry.DEFAULT else '':7s}  {_why}")
