"""CUDA device: CUDA C++ from the CUDA renderer, compiled by NVRTC to a cubin for the GPU's architecture and launched
through the CUDA driver API, all through ctypes (libnvrtc from the `nvidia-cuda-nvrtc` wheel, libcuda.so.1 from the
NVIDIA driver). `CUDA` is GPU 0, `CUDA:1` the next. NVRTC alone (no GPU) is enough to compile: see nvrtc_compile.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import re
from typing import Any

from fusegrad.codegen.gpudims import fit_block
from fusegrad.device import Allocator, Compiled, CompileError, Compiler
from fusegrad.renderer import ProgramSpec
from fusegrad.renderer.cuda import FMAD_MARK, CUDARenderer

NVRTC_HINT = "install NVRTC with `pip install 'nvidia-cuda-nvrtc==13.0.*'`"
DRIVER_HINT = "the CUDA backend needs an NVIDIA GPU and its driver"

_H, _P = ctypes.c_void_p, ctypes.POINTER
_int, _uint, _size, _u64 = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_uint64

# ---------------------------------------------------------------------------------------------------------------------
# NVRTC: CUDA C++ -> PTX -> cubin, no GPU needed

_NVRTC_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "nvrtcVersion": (_int, [_P(_int), _P(_int)]),
    "nvrtcGetErrorString": (ctypes.c_char_p, [_int]),
    "nvrtcCreateProgram": (_int, [_P(_H), ctypes.c_char_p, ctypes.c_char_p, _int, _H, _H]),
    "nvrtcCompileProgram": (_int, [_H, _int, _P(ctypes.c_char_p)]),
    "nvrtcDestroyProgram": (_int, [_P(_H)]),
    **{f"nvrtcGet{what}Size": (_int, [_H, _P(_size)]) for what in ("ProgramLog", "PTX", "CUBIN")},
    **{f"nvrtcGet{what}": (_int, [_H, ctypes.c_char_p]) for what in ("ProgramLog", "PTX", "CUBIN")},
}


def find_nvrtc() -> str | None:
    """libnvrtc.so* from the `nvidia` pip packages (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), else the system's."""
    try:
        import nvidia  # type: ignore[import-not-found,import-untyped]  # the namespace package the NVIDIA wheels install into
        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    for root in roots:
        libs = sorted(p for p in glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*"))
                      if "builtins" not in p and ".alt." not in p)
        if libs: return libs[-1]
    return ctypes.util.find_library("nvrtc")


@functools.cache
def libnvrtc() -> ctypes.CDLL:
    path = find_nvrtc()
    if path is None: raise RuntimeError(f"CUDA: NVRTC (libnvrtc.so) not found; {NVRTC_HINT}")
    # libnvrtc dlopens libnvrtc-builtins by name: load the one beside it first so the wheel works without LD_LIBRARY_PATH
    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*"))):
        if ".alt." not in builtins: ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    try: lib = ctypes.CDLL(path)
    except OSError as e: raise RuntimeError(f"CUDA: can't load NVRTC {path} ({e}); {NVRTC_HINT}") from e
    for fn, (restype, argtypes) in _NVRTC_SIGNATURES.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = restype, argtypes
    return lib


def nvrtc_version() -> tuple[int, int]:
    major, minor = _int(), _int()
    libnvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _nvrtc_check(err: int, what: str) -> None:
    if err != 0: raise RuntimeError(f"NVRTC {what} failed: {libnvrtc().nvrtcGetErrorString(err).decode()}")


def _nvrtc_output(prog: Any, what: str) -> bytes:
    lib, size = libnvrtc(), _size()
    _nvrtc_check(getattr(lib, f"nvrtcGet{what}Size")(prog, ctypes.byref(size)), f"nvrtcGet{what}Size")
    buf = ctypes.create_string_buffer(size.value)
    _nvrtc_check(getattr(lib, f"nvrtcGet{what}")(prog, buf), f"nvrtcGet{what}")
    return buf.raw


def nvrtc_compile(src: str, arch: str = "sm_90") -> tuple[str, bytes, str]:
    """CUDA C++ -> (PTX text, cubin for `arch`, compile log). A failed compile is a CompileError with the log."""
    lib = libnvrtc()
    name = m.group(1) if (m := re.search(r"__global__ void (\w+)", src)) else "kernel"
    prog = _H()
    _nvrtc_check(lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None),
                 "nvrtcCreateProgram")
    try:
        # IEEE semantics (denormals, correctly rounded / and sqrt); FMA contraction only in float reduce kernels
        opts = [f"--gpu-architecture={arch}", "--std=c++17", f"--fmad={'true' if FMAD_MARK in src else 'false'}"]
        err = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
        log = _nvrtc_output(prog, "ProgramLog").rstrip(b"\0").decode(errors="replace").strip()
        if err != 0:
            raise CompileError(f"NVRTC compile of kernel {name} for {arch} failed "
                               f"({lib.nvrtcGetErrorString(err).decode()}):\n{log}\n--- source ---\n{src}")
        ptx = _nvrtc_output(prog, "PTX").rstrip(b"\0").decode()
        return ptx, _nvrtc_output(prog, "CUBIN"), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


class CUDACompiler(Compiler):
    """CUDA C++ -> cubin for one architecture (cached on disk per architecture and NVRTC version)."""

    def __init__(self, arch: str = "sm_90"):
        self.arch = arch
        super().__init__(f"cuda_{arch}_nvrtc{'.'.join(map(str, nvrtc_version()))}")

    def compile(self, src: str) -> bytes:
        return nvrtc_compile(src, self.arch)[1]


# ---------------------------------------------------------------------------------------------------------------------
# the driver API (libcuda.so.1): only on a machine with an NVIDIA GPU and driver

_DRIVER_SIGNATURES: dict[str, list[Any]] = {  # every function returns a CUresult (int)
    "cuInit": [_uint], "cuDeviceGetCount": [_P(_int)], "cuDeviceGet": [_P(_int), _int],
    "cuDeviceGetName": [ctypes.c_char_p, _int, _int], "cuDeviceGetAttribute": [_P(_int), _int, _int],
    "cuDevicePrimaryCtxRetain": [_P(_H), _int], "cuCtxSetCurrent": [_H], "cuCtxSynchronize": [],
    "cuStreamCreate": [_P(_H), _uint], "cuStreamSynchronize": [_H],
    "cuMemAlloc_v2": [_P(_u64), _size], "cuMemFree_v2": [_u64],
    "cuMemcpyHtoDAsync_v2": [_u64, _H, _size, _H], "cuMemcpyDtoHAsync_v2": [_H, _u64, _size, _H],
    "cuModuleLoadData": [_P(_H), _H], "cuModuleUnload": [_H], "cuModuleGetFunction": [_P(_H), _H, ctypes.c_char_p],
    "cuFuncGetAttribute": [_P(_int), _int, _H],
    "cuLaunchKernel": [_H, _uint, _uint, _uint, _uint, _uint, _uint, _uint, _H, _P(_H), _P(_H)],
    "cuEventCreate": [_P(_H), _uint], "cuEventRecord": [_H, _H], "cuEventSynchronize": [_H],
    "cuEventElapsedTime": [_P(ctypes.c_float), _H, _H], "cuEventDestroy_v2": [_H],
    "cuGetErrorName": [_int, _P(ctypes.c_char_p)],
    # CUDA graphs (CUDAGraph below)
    "cuStreamBeginCapture_v2": [_H, _int], "cuStreamEndCapture": [_H, _P(_H)],
    "cuGraphInstantiateWithFlags": [_P(_H), _H, ctypes.c_ulonglong], "cuGraphLaunch": [_H, _H],
    "cuGraphExecDestroy": [_H], "cuGraphDestroy": [_H],
}
CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 1, 2   # Y, Z: 3, 4
CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5                                                 # Y, Z: 6, 7
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_STREAM_NON_BLOCKING = 1
CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_NO_DEVICE = 2, 100


@functools.cache
def libcuda() -> ctypes.CDLL:
    try: lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"CUDA: no NVIDIA driver (libcuda.so.1) on this machine ({e}); {DRIVER_HINT}") from e
    for fn, argtypes in _DRIVER_SIGNATURES.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = _int, argtypes
    return lib


def cu_check(err: int, what: str) -> None:
    """Turn a CUresult into an exception naming the call (and, for launches, the kernel)."""
    if err == 0: return
    name = ctypes.c_char_p()
    libcuda().cuGetErrorName(err, ctypes.byref(name))
    msg = f"CUDA {what} failed: {name.value.decode() if name.value else f'CUresult {err}'}"
    raise MemoryError(msg) if err == CUDA_ERROR_OUT_OF_MEMORY else RuntimeError(msg)


def cu(fn: str, *args: Any, what: str = "") -> None:
    cu_check(getattr(libcuda(), fn)(*args), what or fn)


class CUDAAllocator(Allocator):
    """Device memory as CUdeviceptr integers; copies go through the device's stream and wait for it."""

    def __init__(self, dev: CUDADevice):
        super().__init__()
        self.dev = dev

    def _alloc(self, nbytes: int) -> int:
        self.dev.bind()
        ptr = _u64()
        cu("cuMemAlloc_v2", ctypes.byref(ptr), nbytes, what=f"cuMemAlloc of {nbytes} bytes")
        return ptr.value

    def _free(self, opaque: int, nbytes: int) -> None:
        self.dev.bind()
        cu("cuMemFree_v2", opaque)

    def _copyin(self, dest: int, src: memoryview) -> None:
        self.dev.bind()
        host = src.tobytes() if src.readonly else (ctypes.c_char * src.nbytes).from_buffer(src)
        cu("cuMemcpyHtoDAsync_v2", dest, host, src.nbytes, self.dev.stream)
        cu("cuStreamSynchronize", self.dev.stream)  # the host memory may go away once we return

    def _copyout(self, dest: memoryview, src: int) -> None:
        self.dev.bind()
        cu("cuMemcpyDtoHAsync_v2", (ctypes.c_char * dest.nbytes).from_buffer(dest), src, dest.nbytes, self.dev.stream)
        cu("cuStreamSynchronize", self.dev.stream)

    def _offset(self, opaque: int, offset: int, nbytes: int) -> int:
        return opaque + offset  # device pointers are plain addresses


class CUDAProgram:
    """A loaded cubin. `prg(*device_ptrs, vals=ints)` launches spec.global_size threads in blocks of spec.local_size on
    the device's stream; with wait=True it waits and returns the kernel's time in seconds (from CUDA events)."""

    def __init__(self, dev: CUDADevice, spec: ProgramSpec, lib: bytes):
        self.dev, self.spec, self.name = dev, spec, spec.name
        dev.bind()
        self.module, self.func = _H(), _H()
        cu("cuModuleLoadData", ctypes.byref(self.module), lib, what=f"cuModuleLoadData({self.name})")
        cu("cuModuleGetFunction", ctypes.byref(self.func), self.module, spec.name.encode(),
           what=f"cuModuleGetFunction({self.name})")
        max_threads = _int()
        cu("cuFuncGetAttribute", ctypes.byref(max_threads), CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, self.func)
        # a kernel using many registers may allow fewer threads per block than the device's limit
        local = fit_block(tuple(spec.local_size) + (1,) * (3 - len(spec.local_size)), max_threads.value)
        glob_ = tuple(spec.global_size) + (1,) * (3 - len(spec.global_size))
        self.block, self.grid = local, tuple(g // l for g, l in zip(glob_, local))

    def __call__(self, *bufs: int, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        self.dev.bind()
        args = [_u64(b) for b in bufs] + [ctypes.c_int64(v) if self.spec.var_is_64bit(j) else ctypes.c_int32(v)
                                          for j, v in enumerate(vals)]
        params = (_H * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
        start, end = (self.dev.events if wait else (None, None))
        if wait: cu("cuEventRecord", start, self.dev.stream)
        cu("cuLaunchKernel", self.func, *self.grid, *self.block, 0, self.dev.stream, params, None,
           what=f"cuLaunchKernel({self.name}, grid={self.grid}, block={self.block})")
        if not wait: return None
        cu("cuEventRecord", end, self.dev.stream)
        cu("cuEventSynchronize", end, what=f"running kernel {self.name}")
        ms = ctypes.c_float()
        cu("cuEventElapsedTime", ctypes.byref(ms), start, end)
        return ms.value * 1e-3

    def __del__(self) -> None:
        try:
            self.dev.bind()
            libcuda().cuModuleUnload(self.module)
        except Exception:  # interpreter shutdown, or __init__ failed part way
            pass


class CUDADevice(Compiled):
    def __init__(self, device: str):
        index = int(device.split(":")[1]) if ":" in device else 0
        lib = libcuda()
        err = lib.cuInit(0)
        if err == CUDA_ERROR_NO_DEVICE: raise RuntimeError(f"CUDA: the NVIDIA driver sees no GPU; {DRIVER_HINT}")
        cu_check(err, "cuInit")
        count = _int()
        cu("cuDeviceGetCount", ctypes.byref(count))
        if index >= count.value: raise RuntimeError(f"{device}: {count.value} CUDA GPU(s) here")
        self.cu_device = _int()
        cu("cuDeviceGet", ctypes.byref(self.cu_device), index)
        name = ctypes.create_string_buffer(256)
        cu("cuDeviceGetName", name, 256, self.cu_device)
        self.name = name.value.decode()
        attr = self.attribute
        self.arch = f"sm_{attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)}{attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)}"
        self.context = _H()
        cu("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.cu_device)
        self.bind()
        self.stream = _H()  # one non-blocking stream: kernels run in order on it (CUDA graphs need a non-default one)
        cu("cuStreamCreate", ctypes.byref(self.stream), CU_STREAM_NON_BLOCKING)
        self.events = (_H(), _H())
        for e in self.events: cu("cuEventCreate", ctypes.byref(e), 0)
        renderer = CUDARenderer(self.arch)
        renderer.local_max = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        renderer.local_dim_max = tuple(attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + i) for i in range(3))
        renderer.global_max = tuple(min(attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X + i), 2**31 - 1) for i in range(3))
        super().__init__(device, CUDAAllocator(self), renderer, CUDACompiler(self.arch),
                         functools.partial(CUDAProgram, self))

    def attribute(self, attr: int) -> int:
        out = _int()
        cu("cuDeviceGetAttribute", ctypes.byref(out), attr, self.cu_device)
        return out.value

    def bind(self) -> None:
        """Make this GPU's context current on the calling thread (the engine compiles and loads on worker threads)."""
        cu("cuCtxSetCurrent", self.context)

    def synchronize(self) -> None:
        self.bind()
        cu("cuCtxSynchronize")


# ---------------------------------------------------------------------------------------------------------------------
# CUDA graphs: UNTESTED (written without a GPU) and not used by TinyJit yet, which has no per-device replay hook

class CUDAGraph:
    """A fixed sequence of launches recorded once by stream capture and replayed with one cuGraphLaunch. The buffers
    and int values are baked in at capture: replay recomputes the same kernels on the same memory."""

    def __init__(self, dev: CUDADevice, launches: list[tuple[CUDAProgram, list[int], tuple[int, ...]]]):
        self.dev, self.graph, self.exec = dev, _H(), _H()
        dev.bind()
        cu("cuStreamBeginCapture_v2", dev.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        try:
            for prg, bufs, vals in launches: prg(*bufs, vals=vals)
        finally:  # always end the capture, or the stream stays unusable
            cu("cuStreamEndCapture", dev.stream, ctypes.byref(self.graph))
        cu("cuGraphInstantiateWithFlags", ctypes.byref(self.exec), self.graph, 0)

    def __call__(self, wait: bool = False) -> None:
        self.dev.bind()
        cu("cuGraphLaunch", self.exec, self.dev.stream)
        if wait: cu("cuStreamSynchronize", self.dev.stream, what="running a CUDA graph")

    def __del__(self) -> None:
        try:
            libcuda().cuGraphExecDestroy(self.exec)
            libcuda().cuGraphDestroy(self.graph)
        except Exception:
            pass
