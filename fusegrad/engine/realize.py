"""Engine: run a schedule item by item. Kernels are compiled once per (AST, device) and cached in-process (the
compiler caches binaries on disk). Updates GlobalCounters and prints the DEBUG=1/2 lines.
"""
from __future__ import annotations

import contextvars
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fusegrad import codegen   # (codegen.to_program at call time: tests replace it)
from fusegrad.codegen import kernel_name
from fusegrad.codegen.search import ast_key, beam_search
from fusegrad.device import Device, diskcache_get, diskcache_put
from fusegrad.renderer import ProgramSpec
from fusegrad.helpers import BEAM, CACHELEVEL, DEBUG, JITBEAM, MERGE_RANGES, NOOPT, PROFILE, SPEC, VIZ, GlobalCounters, \
    colored
from fusegrad.helpers import CAPTURE_PROCESS_REPLAY  # process replay (fusegrad/replay)
from fusegrad.dtype import dtypes
from fusegrad.engine.capture import capturing
from fusegrad.ir.ops import Ops, UOp
from fusegrad.replay import capture_kernel
from fusegrad.schedule import ScheduleItem

_programs: dict[tuple[UOp, str], Any] = {}


@functools.cache
def _code_version() -> str:
    """A hash of fusegrad's own source: a cached program is reused only by the code that generated it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(d, f), "rb") as fh: h.update(fh.read())
    return h.hexdigest()[:16]


def _renderer_state(r: Any) -> str:
    """What a renderer was configured with on this machine (thread count, SIMD width, workgroup limits, ...): codegen
    depends on it, so CPU_THREADS=1 must not hand its single-threaded programs to a later 2-thread process."""
    return type(r).__name__ + repr(sorted(vars(r).items(), key=lambda kv: kv[0]))


def _load_spec(ast: UOp, device: str, amt: int) -> tuple[str, ProgramSpec | None]:
    """The rendered program from the disk cache (keyed by kernel, device, compiler, optimization mode and code
    version), so a warm process skips codegen as well as compilation."""
    dev = Device[device]
    if dev.compiler.cachekey is None or not CACHELEVEL or DEBUG >= 3 or SPEC: return "", None  # run codegen to show/check it
    key = hashlib.sha256(f"{ast_key(ast)}:{device}:{dev.compiler.cachekey}:{amt}:{int(NOOPT.value)}:{int(MERGE_RANGES.value)}:"
                         f"{_renderer_state(dev.renderer)}:{_code_version()}".encode()).hexdigest()
    if (raw := diskcache_get("program", key)) is None: return key, None
    d = json.loads(raw)
    variables = [UOp(Ops.DEFINE_VAR, getattr(dtypes, dt), (), tuple(arg)) for dt, arg in d.get("vars", [])]
    return key, ProgramSpec(d["name"], d["src"], [], d["nbufs"], d["ops"], d["mem"], tuple(d["global_size"]),
                            tuple(d["local_size"]), vars=variables, display_name=d["display_name"],
                            thread_size=d["thread_size"])


def _vars_json(spec: ProgramSpec) -> list | None:
    """A program's variables (DEFINE_VAR nodes: dtype, (name, min, max, ...)) as JSON, or None when one doesn't fit
    (the program is then not cached: a loaded program must name the very nodes the schedule binds)."""
    out = []
    for v in spec.vars:
        if getattr(dtypes, v.dtype.name, None) != v.dtype or v.src or not isinstance(v.arg, tuple) or \
                not all(type(a) in (str, int) for a in v.arg): return None
        out.append([v.dtype.name, list(v.arg)])
    return out


def _get_spec(ast: UOp, device: str) -> ProgramSpec:
    """The rendered program of a kernel: from the program disk cache, else by codegen (BEAM search first when asked)."""
    dev = Device[device]
    opts = None
    amt = int(BEAM.value) or (int(JITBEAM.value) if capturing else 0)
    # process replay (fusegrad/replay): when capturing, always run codegen, so the opts used are known
    # VIZ (fusegrad/viz) also runs codegen, so the kernel's passes and linear program are recorded
    dkey, spec = ("", None) if CAPTURE_PROCESS_REPLAY or VIZ else _load_spec(ast, device, amt)
    if spec is None:
        if amt and not NOOPT:
            opts = beam_search(ast, device, amt, kernel_name(ast))
        if VIZ.value or PROFILE.value:
            from fusegrad.viz.recorder import traced_to_program   # (VIZ only: unset, the recorder is never imported)
            spec = traced_to_program(ast, device, dev.renderer, opts)
        else: spec = codegen.to_program(ast, dev.renderer, opts)
        if dkey and (variables := _vars_json(spec)) is not None:
            diskcache_put("program", dkey, json.dumps({**{k: getattr(spec, k) for k in (
                "name", "src", "nbufs", "ops", "mem", "global_size", "local_size", "display_name",
                "thread_size")}, "vars": variables}).encode())
        if CAPTURE_PROCESS_REPLAY:  # process replay: record the AST, renderer, flags and source
            capture_kernel(ast, device, dev.renderer, opts, spec)
    return spec


def get_runner(ast: UOp, device: str) -> Any:
    """The loaded program for a kernel AST on a device (render + compile on first use)."""
    key = (ast, device)
    if (prg := _programs.get(key)) is None:
        dev = Device[device]
        spec = _get_spec(ast, device)
        if VIZ.value or PROFILE.value:
            from fusegrad.viz.recorder import traced_compile
            lib = traced_compile(dev.compiler.compile_cached, spec.src, spec.name, device, ast)
        else: lib = dev.compiler.compile_cached(spec.src)
        prg = _programs[key] = dev.runtime(spec, lib)
    return prg


# a compiler run costs about 25 ms of CPU before it compiles anything, about as much as compiling 3000 characters of
# kernel source: a group smaller than this waits for more kernels (unless no more come)
BATCH_MIN_CHARS = 4000


def batch_full(n: int, chars: int, remaining: int, cores: int) -> bool:
    """Whether a group of n new kernels (chars characters of source) goes to the compiler now, with `remaining` kernels
    still to render after it. At most 16 kernels a group, and at most remaining / cores, so groups shrink towards the
    end and the compile of the last group, which nothing overlaps, is short; tiny kernels wait for company."""
    if remaining == 0: return True
    return chars >= BATCH_MIN_CHARS and n >= max(1, min(16, -(-remaining // cores)))


def _prepare_runners(new: list[tuple[UOp, str]]) -> None:
    """Load or build the programs of several new kernels. Kernels whose compiler can compile a batch
    (CPUCompiler.compile_batch: one compiler run for many kernels) go to a thread pool in groups as codegen produces
    them (sized by batch_full), so the compiler runs on the other cores while codegen continues here; the rest compile
    in the pool one by one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    pending: dict[str, list[tuple[tuple[UOp, str], ProgramSpec]]] = {}
    futs = []

    def build(dev: Any, group: list[tuple[tuple[UOp, str], ProgramSpec]]) -> None:
        libs = dev.compiler.compile_batch([(spec.name, spec.src) for _, spec in group])
        for (key, spec), lib in zip(group, libs): _programs[key] = dev.runtime(spec, lib)

    def submit(fn: Any, *args: Any) -> Any:
        # flags (Context) are per thread: each task runs in a copy of this thread's, so it sees the caller's overrides
        return pool.submit(contextvars.copy_context().run, fn, *args)

    with ThreadPoolExecutor(max_workers=min(len(new), cores + 1)) as pool:
        for i, key in enumerate(new):
            dev = Device[key[1]]
            if not hasattr(dev.compiler, "compile_batch") or VIZ.value or PROFILE.value:
                futs.append(submit(get_runner, *key))
                continue
            (group := pending.setdefault(key[1], [])).append((key, _get_spec(*key)))
            if batch_full(len(group), sum(len(spec.src) for _, spec in group), len(new) - 1 - i, cores):
                futs.append(submit(build, dev, pending.pop(key[1])))
        futs += [submit(build, Device[d], group) for d, group in pending.items()]
        for f in futs: f.result()


def var_values(spec: ProgramSpec, var_vals: dict[UOp, int]) -> tuple[int, ...]:
    """The int arguments of a kernel with symbolic sizes: the values of its variables, in spec.vars order."""
    if not spec.vars: return ()
    try: return tuple(var_vals[v] for v in spec.vars)
    except KeyError as e: raise ValueError(f"kernel {spec.name} needs a value for variable {e.args[0].arg[0]!r}") from None


# called with each ScheduleItem right after it ran (eager runs only, not TinyJit replays): lets fusegrad.distributed
# start a gradient bucket's allreduce while the rest of the backward pass still runs
item_hooks: list[Callable[[ScheduleItem], None]] = []


def run_schedule(items: list[ScheduleItem]) -> None:
    if capturing: capturing[-1].extend(items)
    st = time.perf_counter()
    kernels = 0
    traced = VIZ.value or PROFILE.value  # fusegrad/viz: put each launch and copy on the timeline
    # build every new kernel first, several at a time: the C compiler runs in parallel with the next codegen
    copy_op = Ops.COPY
    new = list(dict.fromkeys(k for si in items if si.ast.op is not copy_op
                             and (k := (si.ast, si.bufs[0].device)) not in _programs))
    if len(new) > 1: _prepare_runners(new)
    show = DEBUG >= 2   # (flags read once, not per item: each read is a Python call)
    # the counters are added up here and moved to GlobalCounters once (each `GlobalCounters.x += v` is a class
    # attribute read and write per item), also when an item raises
    n_ops = n_mem = 0
    n_time = 0.0
    try:
        for si in items:
            bufs = si.bufs
            dev = bufs[0].device
            if (is_copy := si.ast.op is copy_op):
                t0 = time.perf_counter()
                dst, src = bufs
                dst.copy_from(src)
                et = time.perf_counter() - t0
                name, ops, mem = f"copy {src.nbytes:8d} bytes {src.device} -> {dst.device}", 0, src.nbytes
                GlobalCounters.copy_time_s += et
                GlobalCounters.copy_bytes += src.nbytes
            else:
                if (prg := _programs.get((si.ast, dev))) is None: prg = get_runner(si.ast, dev)
                spec = prg.spec
                # an allocated buffer's address without the `opaque` property's two calls (most items have a buffer
                # allocated here, on first use: their output)
                et = prg(*[b._opaque if b._opaque is not None else b.opaque for b in bufs],
                         vals=var_values(spec, si.var_vals) if spec.vars else (), wait=True) or 0.0
                name, ops, mem = spec.display_name, spec.ops, spec.mem
                kernels += 1
            if traced:
                from fusegrad.viz.recorder import record_item
                record_item(si, et, name, ops, mem)
            n_ops += ops
            n_mem += mem
            n_time += et
            for hook in item_hooks: hook(si)
            if show:
                gflops = ops / et * 1e-9 if et > 0 else 0
                gbs = mem / et * 1e-9 if et > 0 else 0
                label = colored(f'{name:30s}', 'green' if is_copy else None)
                print(f"*** {dev:7s} {GlobalCounters.kernel_count + kernels:4d} {label} bufs {len(bufs):2d}  "
                      f"tm {et * 1e6:9.2f} us  {gflops:8.2f} GFLOPS  {gbs:7.2f} GB/s")
    finally:
        GlobalCounters.kernel_count += kernels
        GlobalCounters.global_ops += n_ops
        GlobalCounters.global_mem += n_mem
        GlobalCounters.time_sum_s += n_time
    if DEBUG >= 1 and items:
        print(f"realized {len(items)} items ({kernels} kernels) in {(time.perf_counter() - st) * 1e3:.2f} ms")
