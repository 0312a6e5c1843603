"""WEBGPU device: WGSL compute shaders from the WGSL renderer, run through wgpu-py (wgpu-native) on whatever adapter it
finds: a GPU's Vulkan/Metal/D3D12 driver, or Mesa's lavapipe (Vulkan on the CPU) in CI. Buffers are storage buffers;
a kernel is one compute pipeline (cached by source) dispatched over spec.global_size / spec.local_size workgroups.
"""
from __future__ import annotations

import functools
import math
import os
import struct
import tempfile
import time
from typing import Any

from fusegrad.device import Allocator, Compiled, CompileError, Compiler
from fusegrad.ir.ops import Ops
from fusegrad.renderer import ProgramSpec
from fusegrad.renderer.wgsl import WGSLRenderer

INSTALL_HINT = "`pip install wgpu` and a WebGPU-capable driver (on Linux without a GPU: " \
               "`apt-get install mesa-vulkan-drivers libvulkan1`, Mesa's lavapipe)"


def _wgpu() -> Any:
    try:
        import wgpu  # type: ignore[import-untyped]
    except ImportError as e:
        raise RuntimeError(f"WEBGPU device: can't import wgpu ({e}); {INSTALL_HINT}") from e
    return wgpu


def loop_iterations(uops: list[Any]) -> int:
    """Loop iterations one work-item runs, counting each loop entry as one more (what llvmpipe's limiter counts)."""
    total, trips = 0, [1]
    for u in uops:
        if u.op is Ops.RANGE:
            size = u.src[0]
            n = int(size.arg) if size.op is Ops.CONST else int(size.vmax)  # a symbolic size: at its largest value
            total += trips[-1] * (n + 1)
            trips.append(trips[-1] * n)
        elif u.op is Ops.END: trips.pop()
    return total


def _request_adapter(wgpu: Any) -> Any:
    """The high-performance adapter; a RuntimeError with the install hint when there is none."""
    unset = "XDG_RUNTIME_DIR" not in os.environ
    if unset: os.environ["XDG_RUNTIME_DIR"] = tempfile.gettempdir()  # else Mesa's WSI prints an error on stderr
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        # wgpu falls back to OpenGL, whose integer division and modulo of negative numbers don't follow WGSL
        gl_only = adapter is not None and adapter.info.get("backend_type") == "OpenGL"
        if gl_only:
            adapter = next((a for a in wgpu.gpu.enumerate_adapters_sync() if a.info.get("backend_type") != "OpenGL"),
                           None)
    except Exception as e:
        raise RuntimeError(f"WEBGPU device: no adapter ({str(e).splitlines()[0]}); {INSTALL_HINT}") from e
    finally:
        if unset: del os.environ["XDG_RUNTIME_DIR"]
    if adapter is None:
        why = "only an OpenGL adapter, whose integer ops differ from WGSL's" if gl_only else "no adapter found"
        raise RuntimeError(f"WEBGPU device: {why}; {INSTALL_HINT}")
    return adapter


class WebgpuAllocator(Allocator):
    """Storage buffers. WebGPU copies and bindings work in 4-byte units, so sizes are rounded up to 4 (packed 1- and
    2-byte dtypes use whole u32 words); copies move exactly the bytes asked for."""

    def __init__(self, dev: WebgpuDevice):
        super().__init__()
        self.dev = dev

    def _alloc(self, nbytes: int) -> Any:
        limit = self.dev.max_binding
        if nbytes > limit:
            raise RuntimeError(f"WEBGPU buffer of {nbytes} bytes ({nbytes / 2**20:.1f} MiB) exceeds this device's "
                               f"max_storage_buffer_binding_size of {limit} bytes ({limit / 2**20:.0f} MiB) on "
                               f"{self.dev.name}")
        usage = self.dev.wgpu.BufferUsage
        return self.dev.gpu.create_buffer(size=(nbytes + 3) & ~3, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)

    def _free(self, opaque: Any, nbytes: int) -> None:
        opaque.destroy()

    def _copyin(self, dest: Any, src: memoryview) -> None:
        data = src.tobytes()
        if len(data) % 4:  # the tail word: keep the bytes past the end as they are
            tail = len(data) & ~3
            old = self.dev.gpu.queue.read_buffer(dest, tail, 4).tobytes()
            data = data + old[len(data) - tail:]
        self.dev.gpu.queue.write_buffer(dest, 0, data)

    def _copyout(self, dest: memoryview, src: Any) -> None:
        out = self.dev.gpu.queue.read_buffer(src, 0, (dest.nbytes + 3) & ~3)
        dest[:] = memoryview(out).cast("B")[:dest.nbytes]

    def _offset(self, opaque: Any, offset: int, nbytes: int) -> Any:
        # the memory planner's views all start at offset 0: the same buffer, of which kernels use the first nbytes
        if offset != 0: raise NotImplementedError("WEBGPU buffer views at a nonzero offset aren't supported")
        return opaque


class WebgpuCompiler(Compiler):
    """WGSL is what the device takes: compiling validates it (a CompileError with the message and the source) and the
    'binary' is the source itself. The driver's pipeline is built per program, so there is no disk cache."""

    def __init__(self, dev: WebgpuDevice):
        super().__init__(None)
        self.dev = dev

    def compile(self, src: str) -> bytes:
        self.dev.shader(src)
        return src.encode()


class WebgpuProgram:
    """One compute pipeline. `prg(*buffers)` binds the buffers in order (binding i = data i) and dispatches
    global_size / local_size workgroups; with wait=True it waits for the queue and returns the wall time in seconds."""

    def __init__(self, dev: WebgpuDevice, spec: ProgramSpec, lib: bytes):
        self.dev, self.spec, self.name = dev, spec, spec.name
        src = lib.decode()
        # the shader numbers its workgroups flat (renderer/wgsl.py): dispatch that count as (<= max, rows, 1)
        total = math.prod(g // l for g, l in zip(spec.global_size, spec.local_size))
        rows = -(-total // dev.max_groups)
        if rows > dev.max_groups: raise RuntimeError(f"{spec.name}: {total} workgroups are more than WebGPU can dispatch")
        self.groups = (min(total, dev.max_groups), rows, 1)
        if dev.loop_limit is not None and (n := loop_iterations(spec.uops)) > dev.loop_limit:
            raise RuntimeError(f"{spec.name}: each work-item would run {n} loop iterations, but {dev.name} stops a "
                               f"work-item's loops after {dev.loop_limit} in all (llvmpipe's loop limiter); the "
                               "result would be silently wrong. Long reduces of a constant length are split to fit "
                               "(SPLIT_REDUCE, schedule/split.py); this loop is not one of them: use a shorter one, "
                               "or another device")
        written = {u.src[0].src[0].arg for u in spec.uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.PARAM}
        self.nbufs = sum(1 for u in spec.uops if u.op is Ops.PARAM)
        if self.nbufs + bool(spec.vars) > dev.max_bindings:
            raise RuntimeError(f"{spec.name} takes {self.nbufs + bool(spec.vars)} buffers, more than the "
                               f"{dev.max_bindings} storage buffers per shader of {dev.name}")
        self.layout, self.pipeline = dev.pipeline(src, spec.name, list(range(self.nbufs + bool(spec.vars))), written)
        # symbolic sizes: their values go in a small buffer bound after the buffers, rewritten before each launch
        self.var_buf = dev.gpu.create_buffer(size=4 * len(spec.vars), usage=dev.wgpu.BufferUsage.STORAGE |
                                             dev.wgpu.BufferUsage.COPY_DST) if spec.vars else None

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        dev = self.dev.gpu
        if self.var_buf is not None:
            dev.queue.write_buffer(self.var_buf, 0, struct.pack(f"<{len(vals)}i", *vals))  # ordered before the submit
            bufs = (*bufs, self.var_buf)
        group = dev.create_bind_group(layout=self.layout, entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(bufs)])
        encoder = dev.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        cpass.set_pipeline(self.pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(*self.groups)
        cpass.end()
        st = time.perf_counter()
        dev.queue.submit([encoder.finish()])
        if not wait: return None
        self.dev.synchronize()
        return time.perf_counter() - st


class WebgpuDevice(Compiled):
    def __init__(self, device: str):
        if ":" in device and device.split(":")[1] not in ("", "0"):
            raise RuntimeError(f"{device}: WEBGPU opens one adapter, the high-performance one; use WEBGPU")
        self.wgpu = wgpu = _wgpu()
        adapter = _request_adapter(wgpu)
        info = adapter.info
        self.name = f"{info.get('device', '?')} ({info.get('backend_type', '?')}, {info.get('description', '')})"
        fp16 = "shader-f16" in adapter.features
        limits = adapter.limits
        want = {k: limits[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                       "max-storage-buffers-per-shader-stage", "max-compute-invocations-per-workgroup",
                                       "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
                                       "max-compute-workgroup-size-z", "max-compute-workgroups-per-dimension")}
        self.gpu = adapter.request_device_sync(required_features=["shader-f16"] * fp16, required_limits=want)
        lim = self.gpu.limits
        self.max_binding = min(lim["max-storage-buffer-binding-size"], lim["max-buffer-size"])
        self.max_groups = lim["max-compute-workgroups-per-dimension"]
        self.max_bindings = lim["max-storage-buffers-per-shader-stage"]
        # Mesa's llvmpipe (lavapipe) ends a shader invocation's loops after 65535 iterations in all, silently
        self.loop_limit = 65535 if info.get("vendor") == "llvmpipe" or "llvmpipe" in info.get("device", "") else None
        renderer = WGSLRenderer(f16=fp16)
        # workgroups of at most 256 items, as on CL; the grid itself has no per-dimension cap (see WebgpuProgram)
        renderer.local_max = min(lim["max-compute-invocations-per-workgroup"], 256)
        renderer.local_dim_max = tuple(lim[f"max-compute-workgroup-size-{a}"] for a in "xyz")
        self._fence = self.gpu.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
        self._shaders: dict[str, Any] = {}
        self._pipelines: dict[str, tuple[Any, Any]] = {}
        super().__init__(device, WebgpuAllocator(self), renderer, WebgpuCompiler(self),
                         functools.partial(WebgpuProgram, self))

    def shader(self, src: str) -> Any:
        """The shader module of `src` (validated once); a CompileError with the compiler's message otherwise."""
        if src not in self._shaders:
            try: self._shaders[src] = self.gpu.create_shader_module(code=src)
            except Exception as e:
                raise CompileError(f"WGSL compile failed on {self.name}:\n{e}\n--- source ---\n{src}") from e
        return self._shaders[src]

    def pipeline(self, src: str, entry: str, params: list[int], written: set[int]) -> tuple[Any, Any]:
        """(bind group layout, compute pipeline) of a kernel, built once per source. The layout is explicit: "auto"
        would drop the bindings of buffers the shader never reads, and the runtime binds buffers by position."""
        if src not in self._pipelines:
            layout = self.gpu.create_bind_group_layout(entries=[
                {"binding": i, "visibility": self.wgpu.ShaderStage.COMPUTE,
                 "buffer": {"type": "storage" if i in written else "read-only-storage"}} for i in params])
            pipe = self.gpu.create_compute_pipeline(
                layout=self.gpu.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": self.shader(src), "entry_point": entry})
            self._pipelines[src] = (layout, pipe)
        return self._pipelines[src]

    def synchronize(self) -> None:
        # reading a buffer waits for the queue (wgpu-py 0.32's on_submitted_work_done_sync fails on its own ctypes)
        self.gpu.queue.read_buffer(self._fence, 0, 4)
