"""METAL device: Metal Shading Language from the Metal renderer, compiled by the Metal framework at load time
(newLibraryWithSource) and dispatched on the system's default GPU, through the Objective-C runtime with ctypes
(libobjc's objc_msgSend; no PyObjC). macOS only.

UNTESTED: written from Apple's documented API on Linux, where it can't run; only the renderer is tested here.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any

from fusegrad.codegen.gpudims import fit_block
from fusegrad.device import Allocator, Compiled, CompileError, Compiler
from fusegrad.renderer import ProgramSpec
from fusegrad.renderer.metal import MetalRenderer

_H, _U = ctypes.c_void_p, ctypes.c_ulong  # id / SEL / pointers, NSUInteger (64 bits on every Metal Mac)
MTLResourceStorageModeShared = 0            # CPU and GPU see the same memory: copies are memmoves
MTLCommandBufferStatusError = 5


class MTLSize(ctypes.Structure):
    _fields_ = [("width", _U), ("height", _U), ("depth", _U)]


# ---------------------------------------------------------------------------------------------------------------------
# the Objective-C runtime: objc_msgSend called through a prototype per signature (required on arm64)

@functools.cache
def libobjc() -> ctypes.CDLL:
    if sys.platform != "darwin":
        raise RuntimeError(f"METAL needs macOS with a Metal GPU (this is {sys.platform})")
    lib = ctypes.CDLL(ctypes.util.find_library("objc") or "/usr/lib/libobjc.A.dylib")
    lib.objc_getClass.restype, lib.objc_getClass.argtypes = _H, [ctypes.c_char_p]
    lib.sel_registerName.restype, lib.sel_registerName.argtypes = _H, [ctypes.c_char_p]
    lib.objc_autoreleasePoolPush.restype, lib.objc_autoreleasePoolPop.argtypes = _H, [_H]
    return lib


@functools.cache
def _sender(restype: Any, argtypes: tuple[Any, ...]) -> Any:
    addr = ctypes.cast(libobjc().objc_msgSend, _H).value or 0
    return ctypes.CFUNCTYPE(restype, _H, _H, *argtypes)(addr)


def msg(obj: Any, selector: str, *args: tuple[Any, Any], restype: Any = _H) -> Any:
    """[obj selector:args...]; each argument is (value, ctypes type)."""
    sel = libobjc().sel_registerName(selector.encode())
    return _sender(restype, tuple(t for _, t in args))(obj, sel, *(v for v, _ in args))


def objc_class(name: str) -> Any: return libobjc().objc_getClass(name.encode())


def nsstring(s: str) -> Any:
    return msg(objc_class("NSString"), "stringWithUTF8String:", (s.encode(), ctypes.c_char_p))


def pystring(ns: Any) -> str:
    return (msg(ns, "UTF8String", restype=ctypes.c_char_p) or b"").decode() if ns else ""


def error_text(err: Any) -> str:
    return pystring(msg(err, "localizedDescription")) if err else "unknown error"


def release(obj: Any) -> None:
    if obj: msg(obj, "release", restype=None)


# ---------------------------------------------------------------------------------------------------------------------
# the four pieces

class MetalAllocator(Allocator):
    """MTLBuffers in shared storage; copies are memmoves on [buffer contents] after waiting for queued kernels."""

    def __init__(self, dev: MetalDevice):
        super().__init__()
        self.dev = dev

    def _alloc(self, nbytes: int) -> Any:
        buf = msg(self.dev.device, "newBufferWithLength:options:", (nbytes, _U), (MTLResourceStorageModeShared, _U))
        if not buf: raise MemoryError(f"METAL allocation of {nbytes} bytes failed")
        return buf

    def _free(self, opaque: Any, nbytes: int) -> None:
        release(opaque)

    def _copyin(self, dest: Any, src: memoryview) -> None:
        self.dev.synchronize()  # a queued kernel may still read this memory (the allocator reuses freed buffers)
        ctypes.memmove(msg(dest, "contents"), src.tobytes() if src.readonly else
                       (ctypes.c_char * src.nbytes).from_buffer(src), src.nbytes)

    def _copyout(self, dest: memoryview, src: Any) -> None:
        self.dev.synchronize()
        ctypes.memmove((ctypes.c_char * dest.nbytes).from_buffer(dest), msg(src, "contents"), dest.nbytes)


class MetalProgram:
    """A compute pipeline built from source. `prg(*mtl_buffers, vals=ints)` encodes one dispatch in its own command
    buffer and commits it; with wait=True it waits and returns the GPU time in seconds."""

    def __init__(self, dev: MetalDevice, spec: ProgramSpec, lib: bytes):
        self.dev, self.spec, self.name = dev, spec, spec.name
        options = msg(msg(objc_class("MTLCompileOptions"), "alloc"), "init")
        msg(options, "setFastMathEnabled:", (False, ctypes.c_bool), restype=None)  # IEEE NaN/inf, no reassociation
        err = _H()
        self.library = msg(dev.device, "newLibraryWithSource:options:error:", (nsstring(lib.decode()), _H),
                           (options, _H), (ctypes.byref(err), ctypes.POINTER(_H)))
        release(options)
        if not self.library:
            raise CompileError(f"Metal compile of kernel {self.name} failed:\n{error_text(err)}\n--- source ---\n{spec.src}")
        self.function = msg(self.library, "newFunctionWithName:", (nsstring(spec.name), _H))
        self.pipeline = msg(dev.device, "newComputePipelineStateWithFunction:error:", (self.function, _H),
                            (ctypes.byref(err), ctypes.POINTER(_H)))
        if not self.pipeline: raise RuntimeError(f"METAL pipeline for kernel {self.name}: {error_text(err)}")
        max_threads = msg(self.pipeline, "maxTotalThreadsPerThreadgroup", restype=_U)
        local = fit_block(tuple(spec.local_size) + (1,) * (3 - len(spec.local_size)), max_threads)
        glob_ = tuple(spec.global_size) + (1,) * (3 - len(spec.global_size))
        self.threads, self.groups = MTLSize(*local), MTLSize(*(g // l for g, l in zip(glob_, local)))

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        pool = libobjc().objc_autoreleasePoolPush()  # the command buffer and encoder are autoreleased objects
        try:
            cb = msg(self.dev.queue, "commandBuffer")
            enc = msg(cb, "computeCommandEncoder")
            msg(enc, "setComputePipelineState:", (self.pipeline, _H), restype=None)
            for i, b in enumerate(bufs): msg(enc, "setBuffer:offset:atIndex:", (b, _H), (0, _U), (i, _U), restype=None)
            for j, v in enumerate(vals):
                arg = ctypes.c_int64(v) if self.spec.var_is_64bit(j) else ctypes.c_int32(v)   # 64-bit: `constant long&`
                msg(enc, "setBytes:length:atIndex:", (ctypes.byref(arg), _H), (ctypes.sizeof(arg), _U),
                    (len(bufs) + j, _U), restype=None)
            msg(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (self.groups, MTLSize), (self.threads, MTLSize),
                restype=None)
            msg(enc, "endEncoding", restype=None)
            msg(cb, "commit", restype=None)
            self.dev.track(cb)
            if not wait: return None
            self.dev.synchronize()
            start = msg(cb, "GPUStartTime", restype=ctypes.c_double)
            return msg(cb, "GPUEndTime", restype=ctypes.c_double) - start
        finally:
            libobjc().objc_autoreleasePoolPop(pool)

    def __del__(self) -> None:
        try:
            for obj in (self.pipeline, self.function, self.library): release(obj)
        except Exception:
            pass


class MetalDevice(Compiled):
    def __init__(self, device: str):
        libobjc()  # raises on anything but macOS
        metal = ctypes.CDLL("/System/Library/Frameworks/Metal.framework/Metal")
        metal.MTLCreateSystemDefaultDevice.restype = _H
        self.device = metal.MTLCreateSystemDefaultDevice()
        if not self.device: raise RuntimeError("METAL: this Mac has no Metal GPU (MTLCreateSystemDefaultDevice is nil)")
        self.name = pystring(msg(self.device, "name"))
        self.queue = msg(self.device, "newCommandQueue")
        self.last: Any = None  # the newest committed command buffer, retained; a queue runs them in order
        # the source is the binary: the framework compiles it when the program loads (no disk cache)
        super().__init__(device, MetalAllocator(self), MetalRenderer(), Compiler(None),
                         functools.partial(MetalProgram, self))

    def track(self, cb: Any) -> None:
        release(self.last)
        self.last = msg(cb, "retain")

    def synchronize(self) -> None:
        if not self.last: return
        msg(self.last, "waitUntilCompleted", restype=None)
        failed = msg(self.last, "status", restype=_U) == MTLCommandBufferStatusError
        err = error_text(msg(self.last, "error")) if failed else ""
        release(self.last)
        self.last = None
        if failed: raise RuntimeError(f"METAL command buffer failed: {err}")
