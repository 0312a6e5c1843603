"""DLPack interop (frontend): `Tensor.from_dlpack(x)` and `Tensor.__dlpack__()`, written with ctypes against the
DLPack C ABI (DLTensor, DLManagedTensor, DLManagedTensorVersioned) that NumPy, PyTorch, JAX and CuPy read and write.

Memory is shared (zero-copy) when both sides can address it from the host: a fusegrad tensor on a host-memory device
(CPU, LLVM) that is a whole realized buffer, and a foreign array in CPU memory that is compact row-major, aligned to its
element size and writable. Everything else is copied: lazy tensors are realized first, views/broadcasts/constants are
made contiguous into a new buffer, other devices' memory is copied to the host, and foreign arrays that are strided,
read-only or headed for a device without host memory are copied into a new buffer. fusegrad doesn't see writes made
through shared memory as writes, so it never caches a result computed from (or held in) memory it shares.
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import TYPE_CHECKING, Any

from fusegrad import storage
from fusegrad.device import Buffer, Device
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod
from fusegrad.runtime.ops_cpu import CPUAllocator
from fusegrad.views import realize_readers, sole_holder

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

KDL_CPU = 1                                  # DLDeviceType: host memory
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_BOOL = 0, 1, 2, 4, 6   # DLDataTypeCode
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2        # DLManagedTensorVersioned.flags
DLPACK_VERSION = (1, 0)
DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan", 8: "kDLMetal",
                10: "kDLROCM", 13: "kDLCUDAManaged", 14: "kDLOneAPI"}

# (code, bits) <-> fusegrad dtype; lanes is always 1
_CODES: dict[DType, tuple[int, int]] = {
    dtypes.bool: (KDL_BOOL, 8), dtypes.int8: (KDL_INT, 8), dtypes.int16: (KDL_INT, 16), dtypes.int32: (KDL_INT, 32),
    dtypes.int64: (KDL_INT, 64), dtypes.uint8: (KDL_UINT, 8), dtypes.uint16: (KDL_UINT, 16),
    dtypes.uint32: (KDL_UINT, 32), dtypes.uint64: (KDL_UINT, 64), dtypes.float16: (KDL_FLOAT, 16),
    dtypes.float32: (KDL_FLOAT, 32), dtypes.float64: (KDL_FLOAT, 64), dtypes.bfloat16: (KDL_BFLOAT, 16)}
_DTYPES = {v: k for k, v in _CODES.items()}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):       # DLPack < 1.0, capsule "dltensor"
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):   # DLPack >= 1.0, capsule "dltensor_versioned"
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


# the capsule API, on our own function objects (setting argtypes on ctypes.pythonapi's would change them for everyone)
_api = ctypes.PyDLL("python", handle=ctypes.pythonapi._handle)
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype, _api.PyCapsule_New.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                             _DESTRUCTOR]
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype, _api.PyCapsule_GetPointer.argtypes = ctypes.c_void_p, [ctypes.py_object,
                                                                                          ctypes.c_char_p]
_api.PyCapsule_SetName.restype, _api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
# the destructor gets a capsule that is being freed: it is only ever handled as an address, never as an object
_raw_is_valid = ctypes.PyDLL("python", handle=ctypes.pythonapi._handle).PyCapsule_IsValid
_raw_is_valid.restype, _raw_is_valid.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]
_raw_get_pointer = ctypes.PyDLL("python", handle=ctypes.pythonapi._handle).PyCapsule_GetPointer
_raw_get_pointer.restype, _raw_get_pointer.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
# capsule names live as long as the module: a capsule keeps the pointer, not a copy
_LEGACY, _LEGACY_USED = b"dltensor", b"used_dltensor"
_VERSIONED, _VERSIONED_USED = b"dltensor_versioned", b"used_dltensor_versioned"
_CALL_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


# ---------------------------------------------------------------------------------------------------------------------
# export: a fusegrad buffer -> a capsule

# address of a managed struct we made -> what must live until its deleter runs. No lock: a single dict store or pop is
# atomic under the GIL, and a lock could deadlock when the garbage collector frees a capsule while this thread holds it
_exports: dict[int, tuple[Any, ...]] = {}


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _deleter(address: int) -> None:
    """The consumer is done (or the capsule was never consumed): let go of the struct and the memory behind it."""
    _exports.pop(address, None)


@_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    """A capsule freed without being consumed still owns its tensor (a consumer renames the capsule "used_...")."""
    for name in (_VERSIONED, _LEGACY):
        if _raw_is_valid(capsule, name):
            _deleter(_raw_get_pointer(capsule, name))


def dtype_code(dtype: DType) -> tuple[int, int]:
    if dtype not in _CODES: raise BufferError(f"DLPack has no type for fusegrad's {dtype}")
    return _CODES[dtype]


def make_capsule(address: int, shape: tuple[int, ...], dtype: DType, keepalive: tuple[Any, ...], versioned: bool,
                 copied: bool) -> Any:
    """A DLPack capsule for `shape` elements of `dtype` at host `address`, holding `keepalive` until it is deleted."""
    n = len(shape)
    shape_arr = (ctypes.c_int64 * max(n, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(n, 1))(*[prod(shape[i + 1:]) for i in range(n)])   # row-major, elements
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    code, bits = dtype_code(dtype)
    managed.dl_tensor = DLTensor(address, DLDevice(KDL_CPU, 0), n, DLDataType(code, bits, 1),
                                 ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)),
                                 ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)), 0)
    managed.deleter = ctypes.cast(_deleter, ctypes.c_void_p).value
    if isinstance(managed, DLManagedTensorVersioned):
        managed.version = DLPackVersion(*DLPACK_VERSION)
        managed.flags = FLAG_IS_COPIED if copied else 0
    addr = ctypes.addressof(managed)
    _exports[addr] = (managed, shape_arr, strides_arr, *keepalive)
    return _api.PyCapsule_New(addr, _VERSIONED if versioned else _LEGACY, _capsule_destructor)


def host_address(buf: Buffer) -> int | None:
    """The host address of `buf`'s memory when its device keeps buffers in host memory (CPU, LLVM), else None."""
    return buf.opaque if isinstance(Device[buf.device].allocator, CPUAllocator) else None


def export(t: Tensor, max_version: tuple[int, int] | None, copy: bool | None) -> Any:
    """`t.__dlpack__(...)`: share `t`'s buffer when it is a whole realized buffer in host memory, else a copy."""
    whole = storage.is_contiguous_buffer(t.realize().uop)
    if whole and copy is not True: sole_holder(t)
    buf = t._buffer()
    shape = t._concrete_shape()
    versioned = max_version is not None and max_version[0] >= 1
    address = host_address(buf)
    if copy is not True and whole and address is not None:
        storage.share(buf)
        # the holder may write it from now on, unseen: lazy tensors built from it keep the value they were built with
        # (as a write inside fusegrad leaves them)
        realize_readers({storage.memory_of(buf)})
        return make_capsule(address, shape, t.dtype, (buf,), versioned, copied=False)
    if copy is False:
        why = "it isn't one whole realized buffer" if not whole else f"{buf.device} memory isn't host memory"
        raise BufferError(f"__dlpack__(copy=False): this tensor can't be shared without a copy ({why})")
    host = (ctypes.c_char * max(buf.nbytes, 1))()
    if buf.nbytes: buf.copyout(memoryview(host).cast("B")[:buf.nbytes])
    return make_capsule(ctypes.addressof(host), shape, t.dtype, (host,), versioned, copied=True)


# ---------------------------------------------------------------------------------------------------------------------
# import: an object with __dlpack__ -> a fusegrad buffer

class ForeignBuffer(Buffer):
    """Host memory another library owns, seen through DLPack. fusegrad never frees it; when the last reference goes,
    the producer's deleter runs (so the producer may free it)."""

    def __init__(self, device: str, size: int, dtype: DType, address: int, release: Any):
        super().__init__(device, size, dtype, opaque=address)
        self._release = release

    def __del__(self) -> None:
        if getattr(self, "_opaque", None) is None: return
        with contextlib.suppress(Exception): self._count_alloc(-1)   # (fails only at interpreter shutdown)
        release, self._release = self._release, None
        if release is not None: release()


class _Imported:
    """A consumed capsule: the DLTensor, whether the memory may be written, and the deleter to call once."""

    def __init__(self, obj: Any):
        capsule = _get_capsule(obj)
        self.versioned = bool(_api.PyCapsule_IsValid(capsule, _VERSIONED))
        if not self.versioned and not _api.PyCapsule_IsValid(capsule, _LEGACY):
            raise BufferError(f"{_type_name(obj)}.__dlpack__() returned {_type_name(capsule)}, not a DLPack capsule")
        name = _VERSIONED if self.versioned else _LEGACY
        self.address = _api.PyCapsule_GetPointer(capsule, name)
        _api.PyCapsule_SetName(capsule, _VERSIONED_USED if self.versioned else _LEGACY_USED)   # it is ours now
        self.managed: Any = (DLManagedTensorVersioned if self.versioned else DLManagedTensor).from_address(self.address)
        self._done = False
        if self.versioned and self.managed.version.major != DLPACK_VERSION[0]:
            major = self.managed.version.major
            self.release()
            raise BufferError(f"DLPack major version {major} from {_type_name(obj)}; fusegrad reads version 1")
        self.tensor: DLTensor = self.managed.dl_tensor
        self.read_only = self.versioned and bool(self.managed.flags & FLAG_READ_ONLY)

    def release(self) -> None:
        if self._done: return
        self._done = True
        if self.managed.deleter: _CALL_DELETER(self.managed.deleter)(self.address)


def _type_name(obj: Any) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _get_capsule(obj: Any) -> Any:
    """obj.__dlpack__(), asking for a versioned capsule; producers that predate DLPack 1.0 don't take max_version."""
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack needs an object with __dlpack__ (a NumPy array, a torch.Tensor, ...), "
                        f"got {_type_name(obj)}")
    if hasattr(obj, "__dlpack_device__"):
        dev_type, dev_id = obj.__dlpack_device__()
        if int(dev_type) != KDL_CPU:
            raise BufferError(f"{_type_name(obj)} lives on {DEVICE_NAMES.get(int(dev_type), int(dev_type))}:{dev_id}; "
                              "fusegrad imports host (kDLCPU) memory: move it to the CPU first (e.g. x.cpu())")
    try:
        return obj.__dlpack__(max_version=DLPACK_VERSION)
    except TypeError:
        return obj.__dlpack__()


def _layout(t: DLTensor) -> tuple[tuple[int, ...], tuple[int, ...], DType]:
    """(shape, strides in elements, dtype) of a DLTensor; raises BufferError for what fusegrad can't hold."""
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if lanes != 1 or (code, bits) not in _DTYPES:
        raise BufferError(f"fusegrad has no dtype for DLPack type code {code} with {bits} bits x {lanes} lanes")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else \
        tuple(prod(shape[i + 1:]) for i in range(t.ndim))
    return shape, strides, _DTYPES[(code, bits)]


def _is_compact(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    expect = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect: return False
        expect *= n
    return True


def import_dlpack(obj: Any, device: str, copy: bool | None) -> Tensor:
    """The Tensor for `Tensor.from_dlpack(obj, device, copy)` (see the module docstring for when it shares memory)."""
    Tensor = storage.tensor_class
    imp, shared = _Imported(obj), False
    try:
        shape, strides, dtype = _layout(imp.tensor)
        address = (imp.tensor.data or 0) + imp.tensor.byte_offset
        n = prod(shape)
        shareable = n > 0 and _is_compact(shape, strides) and address % dtype.itemsize == 0 and not imp.read_only \
            and isinstance(Device[device].allocator, _cpu_allocator())
        if copy is False and not shareable:
            raise BufferError(f"from_dlpack(copy=False): {_type_name(obj)} can't be shared: it must be compact "
                              f"row-major, writable, aligned, non-empty and go to a host-memory device (not {device})")
        if shareable and copy is not True:
            buf = ForeignBuffer(device, n, dtype, address, imp.release)   # calls the deleter when it goes
            shared = True
            storage.share(buf)
            return Tensor(storage.buffer_view(storage.buffer_uop(buf), shape))
        return _copy_strided(address, shape, strides, dtype, device)
    finally:
        if not shared: imp.release()


def _cpu_allocator() -> type:
    return CPUAllocator


def _copy_strided(address: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType,
                  device: str) -> Tensor:
    """A new buffer holding the elements; a strided source is read as the span it covers and gathered by a kernel."""
    Tensor = storage.tensor_class
    n = prod(shape)
    if n == 0: return Tensor.empty(*shape, dtype=dtype, device=device)
    lo = sum(s * (d - 1) for d, s in zip(shape, strides) if s < 0)
    hi = sum(s * (d - 1) for d, s in zip(shape, strides) if s > 0) + 1
    raw = ctypes.string_at(address + lo * dtype.itemsize, (hi - lo) * dtype.itemsize)
    flat = Tensor(Tensor._from_bytes(raw, dtype, (hi - lo,), device))
    if _is_compact(shape, strides): return flat.reshape(shape)
    index: Any = Tensor.full(shape, -lo, dtype=dtypes.int64 if hi - lo >= 2**31 else dtypes.int32, device=device)
    for axis, (d, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[axis] = d
        index = index + Tensor.arange(d, device=device, dtype=index.dtype).reshape(view) * s
    return flat[index.flatten()].reshape(shape).contiguous().realize()
