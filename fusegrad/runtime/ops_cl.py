"""CL device: OpenCL C from the OpenCL renderer, built by the platform's OpenCL compiler and launched over a grid of
work-items, all through ctypes on the ICD loader libOpenCL.so.1 (PoCL on a CPU, or a GPU vendor's driver).
`CL` is the first device of the first platform that has one; `CL:1` the next, in the order the platforms list them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import re
from typing import Any

from fusegrad.device import Allocator, Compiled, CompileError, Compiler
from fusegrad.helpers import getenv
from fusegrad.renderer import ProgramSpec
from fusegrad.renderer.opencl import OpenCLRenderer

INSTALL_HINT = "install an OpenCL driver and the ICD loader, e.g. `apt-get install pocl-opencl-icd ocl-icd-libopencl1`"

# ---------------------------------------------------------------------------------------------------------------------
# the C API: constants from CL/cl.h, and the signature of every function used

CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_PLATFORM_NAME, CL_PLATFORM_VERSION = 0x0902, 0x0901
CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1005
CL_DEVICE_TYPE, CL_DEVICE_TYPE_CPU = 0x1000, 1 << 1
CL_DEVICE_MAX_WORK_GROUP_SIZE, CL_DEVICE_NAME, CL_DRIVER_VERSION, CL_DEVICE_EXTENSIONS = 0x1004, 0x102B, 0x102D, 0x1030
CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT = 0x100A
CL_QUEUE_PROFILING_ENABLE = 1 << 1
CL_MEM_READ_WRITE = 1 << 0
CL_PROGRAM_BINARY_SIZES, CL_PROGRAM_BINARIES, CL_PROGRAM_BUILD_LOG = 0x1165, 0x1166, 0x1183
CL_PROFILING_COMMAND_START, CL_PROFILING_COMMAND_END = 0x1282, 0x1283
ERRORS = {-1: "DEVICE_NOT_FOUND", -2: "DEVICE_NOT_AVAILABLE", -4: "MEM_OBJECT_ALLOCATION_FAILURE",
          -5: "OUT_OF_RESOURCES", -6: "OUT_OF_HOST_MEMORY", -11: "BUILD_PROGRAM_FAILURE", -30: "INVALID_VALUE",
          -33: "INVALID_DEVICE", -38: "INVALID_MEM_OBJECT", -42: "INVALID_BINARY", -46: "INVALID_KERNEL_NAME",
          -48: "INVALID_KERNEL", -49: "INVALID_ARG_INDEX", -51: "INVALID_ARG_SIZE", -52: "INVALID_KERNEL_ARGS",
          -54: "INVALID_WORK_GROUP_SIZE", -55: "INVALID_WORK_ITEM_SIZE", -61: "INVALID_BUFFER_SIZE",
          -1001: "PLATFORM_NOT_FOUND_KHR"}

_H, _P = ctypes.c_void_p, ctypes.POINTER
_int, _uint, _ulong, _size = ctypes.c_int32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t
_INFO = [_uint, _size, _H, _P(_size)]  # (param, value size, value, size returned) of every clGet*Info
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "clGetPlatformIDs": (_int, [_uint, _P(_H), _P(_uint)]),
    "clGetPlatformInfo": (_int, [_H, *_INFO]),
    "clGetDeviceIDs": (_int, [_H, _ulong, _uint, _P(_H), _P(_uint)]),
    "clGetDeviceInfo": (_int, [_H, *_INFO]),
    "clCreateContext": (_H, [_H, _uint, _P(_H), _H, _H, _P(_int)]),
    "clCreateCommandQueue": (_H, [_H, _H, _ulong, _P(_int)]),
    "clCreateBuffer": (_H, [_H, _ulong, _size, _H, _P(_int)]),
    "clEnqueueWriteBuffer": (_int, [_H, _H, _uint, _size, _size, _H, _uint, _H, _H]),
    "clEnqueueReadBuffer": (_int, [_H, _H, _uint, _size, _size, _H, _uint, _H, _H]),
    "clCreateProgramWithSource": (_H, [_H, _uint, _P(ctypes.c_char_p), _P(_size), _P(_int)]),
    "clCreateProgramWithBinary": (_H, [_H, _uint, _P(_H), _P(_size), _P(ctypes.c_char_p), _P(_int), _P(_int)]),
    "clBuildProgram": (_int, [_H, _uint, _P(_H), ctypes.c_char_p, _H, _H]),
    "clGetProgramBuildInfo": (_int, [_H, _H, *_INFO]),
    "clGetProgramInfo": (_int, [_H, *_INFO]),
    "clCreateKernel": (_H, [_H, ctypes.c_char_p, _P(_int)]),
    "clSetKernelArg": (_int, [_H, _uint, _size, _H]),
    "clEnqueueNDRangeKernel": (_int, [_H, _H, _uint, _H, _P(_size), _P(_size), _uint, _H, _P(_H)]),
    "clWaitForEvents": (_int, [_uint, _P(_H)]),
    "clGetEventProfilingInfo": (_int, [_H, *_INFO]),
    "clFinish": (_int, [_H]),
    **{f"clRelease{k}": (_int, [_H]) for k in ("MemObject", "Kernel", "Program", "CommandQueue", "Context", "Event")},
}


@functools.cache
def libcl() -> ctypes.CDLL:
    """The ICD loader with argtypes/restype set on every function we call; a clear error when it is missing."""
    name = ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"
    try: lib = ctypes.CDLL(name)
    except OSError as e: raise RuntimeError(f"CL device: can't load the OpenCL library ({e}); {INSTALL_HINT}") from e
    for fn, (restype, argtypes) in _SIGNATURES.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = restype, argtypes
    return lib


def check(err: int, what: str) -> None:
    if err != 0: raise RuntimeError(f"OpenCL {what} failed: CL_{ERRORS.get(err, err)}")


def checked(fn: str, *args: Any) -> Any:
    """Call a clCreate* function (its last argument is the error code) and check it."""
    err = _int()
    ret = getattr(libcl(), fn)(*args, ctypes.byref(err))
    check(err.value, fn)
    return ret


def _info(getter: Any, *handles: Any, param: int) -> bytes:
    size = _size()
    check(getter(*handles, param, 0, None, ctypes.byref(size)), getter.__name__)
    buf = ctypes.create_string_buffer(size.value)
    check(getter(*handles, param, size.value, buf, None), getter.__name__)
    return buf.raw


def info_str(getter: Any, *handles: Any, param: int) -> str:
    return _info(getter, *handles, param=param).rstrip(b"\0").decode(errors="replace")


def list_devices() -> list[tuple[Any, Any]]:
    """(platform, device) for every OpenCL device, platform by platform."""
    cl, n = libcl(), _uint()
    err = cl.clGetPlatformIDs(0, None, ctypes.byref(n))
    if err == -1001 or n.value == 0:
        raise RuntimeError(f"CL device: libOpenCL loaded but no OpenCL platform is installed; {INSTALL_HINT}")
    check(err, "clGetPlatformIDs")
    plats = (_H * n.value)()
    check(cl.clGetPlatformIDs(n.value, plats, None), "clGetPlatformIDs")
    out = []
    for p in plats:
        if cl.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, None, ctypes.byref(n)) != 0 or n.value == 0: continue
        devs = (_H * n.value)()
        check(cl.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n.value, devs, None), "clGetDeviceIDs")
        out += [(_H(p), _H(d)) for d in devs]
    return out


# ---------------------------------------------------------------------------------------------------------------------
# the four pieces

class CLAllocator(Allocator):
    """Device memory as cl_mem handles; copies are blocking reads/writes on the device's queue."""

    def __init__(self, dev: CLDevice):
        super().__init__()
        self.dev = dev

    def _alloc(self, nbytes: int) -> Any:
        err = _int()
        mem = libcl().clCreateBuffer(self.dev.context, CL_MEM_READ_WRITE, nbytes, None, ctypes.byref(err))
        if err.value in (-4, -5, -6, -61): raise MemoryError(f"CL allocation of {nbytes} bytes failed: {ERRORS[err.value]}")
        check(err.value, "clCreateBuffer")
        return _H(mem)

    def _free(self, opaque: Any, nbytes: int) -> None:
        libcl().clReleaseMemObject(opaque)

    def _copyin(self, dest: Any, src: memoryview) -> None:
        if not src.readonly: host: Any = (ctypes.c_char * src.nbytes).from_buffer(src)
        # a view of a whole bytes object (a Tensor made from bytes) is passed as it is; another read-only view is copied
        elif isinstance(src.obj, bytes) and src.c_contiguous and src.nbytes == len(src.obj): host = src.obj
        else: host = src.tobytes()
        check(libcl().clEnqueueWriteBuffer(self.dev.queue, dest, True, 0, src.nbytes, host, 0, None, None),
              "clEnqueueWriteBuffer")

    def _copyout(self, dest: memoryview, src: Any) -> None:
        host = (ctypes.c_char * dest.nbytes).from_buffer(dest)
        check(libcl().clEnqueueReadBuffer(self.dev.queue, src, True, 0, dest.nbytes, host, 0, None, None),
              "clEnqueueReadBuffer")

    def _offset(self, opaque: Any, offset: int, nbytes: int) -> Any:
        # the memory planner's views all start at offset 0: the same cl_mem, of which kernels use the first nbytes
        if offset != 0: raise NotImplementedError("CL buffer views at a nonzero offset (clCreateSubBuffer) aren't supported")
        return opaque


def _build(dev: CLDevice, prg: Any, name: str, src: str) -> None:
    """clBuildProgram; on failure a CompileError naming the kernel, with the build log and the source."""
    if libcl().clBuildProgram(prg, 1, ctypes.byref(dev.device_id), None, None, None) == 0: return
    log = info_str(libcl().clGetProgramBuildInfo, prg, dev.device_id, param=CL_PROGRAM_BUILD_LOG)
    libcl().clReleaseProgram(prg)
    raise CompileError(f"OpenCL build of kernel {name} failed on {dev.name}:\n{log}\n--- source ---\n{src}")


class CLCompiler(Compiler):
    """OpenCL C -> the driver's program binary (cached on disk per platform, device and driver version)."""

    def __init__(self, dev: CLDevice):
        self.dev = dev
        ident = f"{dev.platform_version}|{dev.name}|{dev.driver_version}"
        super().__init__(f"cl_{hashlib.sha256(ident.encode()).hexdigest()[:16]}")

    def compile(self, src: str) -> bytes:
        name = m.group(1) if (m := re.search(r"__kernel void (\w+)", src)) else "?"
        text = ctypes.c_char_p(src.encode())
        prg = checked("clCreateProgramWithSource", self.dev.context, 1, ctypes.byref(text), None)
        _build(self.dev, prg, name, src)
        try:
            size = _size()
            check(libcl().clGetProgramInfo(prg, CL_PROGRAM_BINARY_SIZES, ctypes.sizeof(size), ctypes.byref(size), None),
                  "clGetProgramInfo")
            binary = ctypes.create_string_buffer(size.value)
            ptr = ctypes.c_char_p(ctypes.addressof(binary))
            check(libcl().clGetProgramInfo(prg, CL_PROGRAM_BINARIES, ctypes.sizeof(ptr), ctypes.byref(ptr), None),
                  "clGetProgramInfo")
            return binary.raw
        finally:
            libcl().clReleaseProgram(prg)


class CLProgram:
    """A built kernel. `prg(*cl_mems, vals=ints)` enqueues it over spec.global_size work-items (workgroups of
    spec.local_size, or the driver's choice when that is None); with wait=True it returns the device time in seconds."""

    def __init__(self, dev: CLDevice, spec: ProgramSpec, lib: bytes):
        self.dev, self.spec, self.name = dev, spec, spec.name
        cl = libcl()
        status, size, data = _int(), _size(len(lib)), ctypes.c_char_p(lib)
        self.prg = checked("clCreateProgramWithBinary", dev.context, 1, ctypes.byref(dev.device_id), ctypes.byref(size),
                           ctypes.byref(data), ctypes.byref(status))
        check(status.value, "clCreateProgramWithBinary")
        _build(dev, self.prg, spec.name, spec.src)
        self.kernel = checked("clCreateKernel", self.prg, spec.name.encode())
        dims = len(spec.global_size)
        self.global_size = (_size * dims)(*spec.global_size)
        self.local_size = (_size * dims)(*spec.local_size) if spec.local_size is not None else None
        self._release = (cl.clReleaseKernel, cl.clReleaseProgram)

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        cl = libcl()
        for i, b in enumerate(bufs): check(cl.clSetKernelArg(self.kernel, i, ctypes.sizeof(_H), ctypes.byref(b)),
                                           f"clSetKernelArg({self.name}, {i})")
        for j, v in enumerate(vals):
            arg = ctypes.c_int64(v) if self.spec.var_is_64bit(j) else _int(v)   # a 64-bit variable is a `long` arg
            check(cl.clSetKernelArg(self.kernel, len(bufs) + j, ctypes.sizeof(arg), ctypes.byref(arg)),
                  f"clSetKernelArg({self.name}, {len(bufs) + j})")
        event = _H()
        check(cl.clEnqueueNDRangeKernel(self.dev.queue, self.kernel, len(self.global_size), None, self.global_size,
                                        self.local_size, 0, None, ctypes.byref(event) if wait else None),
              f"clEnqueueNDRangeKernel({self.name})")
        if not wait: return None
        try:
            check(cl.clWaitForEvents(1, ctypes.byref(event)), "clWaitForEvents")
            start, end = _ulong(), _ulong()
            for param, t in ((CL_PROFILING_COMMAND_START, start), (CL_PROFILING_COMMAND_END, end)):
                check(cl.clGetEventProfilingInfo(event, param, 8, ctypes.byref(t), None), "clGetEventProfilingInfo")
            return (end.value - start.value) * 1e-9
        finally:
            cl.clReleaseEvent(event)

    def __del__(self) -> None:
        try:
            self._release[0](self.kernel)
            self._release[1](self.prg)
        except Exception:  # interpreter shutdown, or __init__ failed part way
            pass


class CLDevice(Compiled):
    def __init__(self, device: str):
        index = int(device.split(":")[1]) if ":" in device else 0
        devices = list_devices()
        if index >= len(devices):
            raise RuntimeError(f"{device}: {len(devices)} OpenCL device(s) here" + ("" if devices else f"; {INSTALL_HINT}"))
        self.platform_id, self.device_id = devices[index]
        cl = libcl()
        self.name = info_str(cl.clGetDeviceInfo, self.device_id, param=CL_DEVICE_NAME)
        self.driver_version = info_str(cl.clGetDeviceInfo, self.device_id, param=CL_DRIVER_VERSION)
        self.platform_version = info_str(cl.clGetPlatformInfo, self.platform_id, param=CL_PLATFORM_VERSION)
        extensions = info_str(cl.clGetDeviceInfo, self.device_id, param=CL_DEVICE_EXTENSIONS).split()
        max_wg = _size.from_buffer_copy(_info(cl.clGetDeviceInfo, self.device_id, param=CL_DEVICE_MAX_WORK_GROUP_SIZE))
        raw = _info(cl.clGetDeviceInfo, self.device_id, param=CL_DEVICE_MAX_WORK_ITEM_SIZES)
        max_items = tuple((_size * (len(raw) // ctypes.sizeof(_size))).from_buffer_copy(raw))
        self.context = _H(checked("clCreateContext", None, 1, ctypes.byref(self.device_id), None, None))
        self.queue = _H(checked("clCreateCommandQueue", self.context, self.device_id, CL_QUEUE_PROFILING_ENABLE))
        renderer = OpenCLRenderer(fp16="cl_khr_fp16" in extensions, fp64="cl_khr_fp64" in extensions)
        # workgroups of at most 256: a common GPU sweet spot, and it leaves a CPU device many workgroups to share out
        renderer.local_max, renderer.local_dim_max = min(max_wg.value, 256), max_items
        # a CPU device runs a workgroup's work-items in turn on one core: sharing a reduce among them (GROUP) only
        # adds strided reads and a barrier there, so the heuristic leaves GROUP to GPUs (explicit opts still work)
        dev_type = ctypes.c_uint64.from_buffer_copy(_info(cl.clGetDeviceInfo, self.device_id, param=CL_DEVICE_TYPE))
        self.is_cpu = bool(dev_type.value & CL_DEVICE_TYPE_CPU)
        if self.is_cpu: renderer.group_max_outputs = 0
        # vector types (VECTORIZE): the device's preferred float vector width in bytes, 16 to 64 (OpenCL's widest
        # vector is 16 lanes); CL_SIMD_BYTES overrides it (0: no vectors)
        pref = _uint.from_buffer_copy(_info(cl.clGetDeviceInfo, self.device_id, param=CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT))
        renderer.simd_bytes = getenv("CL_SIMD_BYTES", min(max(4 * pref.value, 16), 64))
        super().__init__(device, CLAllocator(self), renderer, CLCompiler(self), functools.partial(CLProgram, self))

    def synchronize(self) -> None:
        check(libcl().clFinish(self.queue), "clFinish")
