"""VIZ/PROFILE recorder: the passes, kernels and timeline events a program produces, grouped into contexts.

The engine calls in here only when VIZ or PROFILE is on, so with both off the cost is one flag check. Graphs are kept
as UOps (immutable, so nothing is copied) and turned into JSON (`fusegrad/viz/serialize.py`) only when saved or served.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from fusegrad import codegen   # (codegen.to_program at call time: tests replace it)
from fusegrad.codegen import kernel_name
from fusegrad.helpers import VIZ
from fusegrad.ir import pattern
from fusegrad.ir.ops import UOp
from fusegrad.ir.pattern import RewriteTrace

T0_NS = time.perf_counter_ns()  # timeline origin


@dataclass
class KernelRecord:
    """One compiled kernel: its AST, linear program and rendered source."""
    name: str
    device: str
    renderer: str
    ast: UOp
    uops: list[UOp]
    src: str
    opts: str = ""


@dataclass
class VizContext:
    """A group of records: the whole program (id 0), one realize call, or one kernel's codegen."""
    id: int
    kind: str  # "program" | "realize" | "kernel"
    name: str
    parent: int | None
    start_ns: int
    end_ns: int = 0
    passes: list[RewriteTrace] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    kernel: KernelRecord | None = None


@dataclass
class Event:
    """One timeline span: `pid` is the device (or HOST), `tid` the stream on it; times in ns since T0_NS."""
    name: str
    cat: str
    pid: str
    tid: str
    ts_ns: int
    dur_ns: int
    ctx: int | None = None
    args: dict[str, Any] = field(default_factory=dict)


class _PassRouter(list):
    """Stands in for `pattern.rewrite_traces`: each finished pass goes to the context of the thread that ran it
    (kernels compile on worker threads, so a plain shared list couldn't tell their passes apart). The first pass
    after VIZ is turned off unhooks it, so graph_rewrite is back to its single `is not None` check."""
    def append(self, tr: RewriteTrace) -> None:
        if VIZ: RECORDER.add_pass(tr)
        elif pattern.rewrite_traces is self: pattern.rewrite_traces = None


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        self.contexts: list[VizContext] = [VizContext(0, "program", "outside realize", None, 0)]
        self.events: list[Event] = []
        self.realizing: list[int] = []  # open realize contexts (realize runs on the caller's thread)
        self.kernel_ctx: dict[tuple[UOp, str], int] = {}
        self.router = _PassRouter()
        self.n_realize = 0

    def clear(self) -> None:
        with self.lock:
            self.contexts[:] = [VizContext(0, "program", "outside realize", None, 0)]
            self.events.clear()
            self.kernel_ctx.clear()
            self.n_realize = 0

    # ----- contexts -----
    def current(self) -> int:
        stack = getattr(self.local, "stack", None)
        if stack: return stack[-1]
        return self.realizing[-1] if self.realizing else 0

    def new_context(self, kind: str, name: str) -> VizContext:
        with self.lock:
            parent = self.current()
            ctx = VizContext(len(self.contexts), kind, name, parent, now_ns())
            self.contexts.append(ctx)
            self.contexts[parent].children.append(ctx.id)
        return ctx

    def add_pass(self, tr: RewriteTrace) -> None:
        ctx = self.contexts[self.current()]
        ctx.passes.append(tr)

    def add_event(self, ev: Event) -> None:
        self.events.append(ev)


RECORDER = Recorder()


def now_ns() -> int: return time.perf_counter_ns() - T0_NS


def sync_hooks() -> None:
    """Point `pattern.rewrite_traces` at the recorder while VIZ is on, and back to None when it is turned off."""
    if VIZ and pattern.rewrite_traces is not RECORDER.router:
        if pattern.rewrite_traces is None: pattern.rewrite_traces = RECORDER.router
    elif not VIZ and pattern.rewrite_traces is RECORDER.router:
        pattern.rewrite_traces = None


@contextlib.contextmanager
def realize_context(n_tensors: int) -> Iterator[VizContext]:
    """One context per realize call; the engine's timeline events and newly compiled kernels land in it."""
    sync_hooks()
    RECORDER.n_realize += 1
    ctx = RECORDER.new_context("realize", f"realize {RECORDER.n_realize}: {n_tensors} tensor(s)")
    RECORDER.realizing.append(ctx.id)
    try:
        yield ctx
    finally:
        RECORDER.realizing.pop()
        ctx.end_ns = now_ns()


def traced_schedule(fn: Any, *args: Any) -> Any:
    """Run the scheduler and record how long it took (HOST timeline)."""
    t0 = now_ns()
    out = fn(*args)
    items = out[0]
    add_event("schedule", "schedule", "HOST", "python", t0, now_ns() - t0, items=len(items))
    contexts = RECORDER.contexts
    if RECORDER.realizing: contexts[RECORDER.realizing[-1]].name += f", {len(items)} item(s)"
    return out


def traced_to_program(ast: UOp, device: str, renderer: Any, opts: list | None) -> Any:
    """`to_program` inside a kernel context: its passes, linear program and source are recorded (VIZ) and its time
    goes on the device's compile stream (PROFILE)."""
    sync_hooks()
    ctx = RECORDER.new_context("kernel", f"{kernel_name(ast)} on {device}")
    stack = RECORDER.local.__dict__.setdefault("stack", [])
    stack.append(ctx.id)
    try:
        spec = codegen.to_program(ast, renderer, opts)
    finally:
        stack.pop()
        ctx.end_ns = now_ns()
    ctx.name = f"{spec.name} on {device}"
    if VIZ:
        ctx.kernel = KernelRecord(spec.name, device, type(renderer).__name__, ast, list(spec.uops), spec.src,
                                  "" if opts is None else " ".join(map(str, opts)))
    RECORDER.kernel_ctx[(ast, device)] = ctx.id
    add_event(f"codegen {spec.name}", "codegen", device, _compile_stream(), ctx.start_ns, ctx.end_ns - ctx.start_ns,
              kernel=ctx.id)
    return spec


def _compile_stream() -> str:
    """The timeline row of codegen/compile: the main thread, or the lane of a compile pool's worker
    ("ThreadPoolExecutor-3_1" -> "compile 1"), so successive pools share rows."""
    t = threading.current_thread()
    return "compile" if t is threading.main_thread() else f"compile {t.name.rsplit('_', 1)[-1]}"


def traced_compile(fn: Any, src: str, name: str, device: str, ast: UOp) -> Any:
    t0 = now_ns()
    lib = fn(src)
    add_event(f"compile {name}", "compile", device, _compile_stream(), t0, now_ns() - t0,
              kernel=RECORDER.kernel_ctx.get((ast, device)))
    return lib


def add_event(name: str, cat: str, pid: str, tid: str, ts_ns: int, dur_ns: int, **args: Any) -> None:
    """One timeline span, in the current context; `kernel=<context id>` in args links it to that kernel."""
    RECORDER.add_event(Event(name, cat, pid, tid, ts_ns, dur_ns, RECORDER.current(), args))


def record_item(si: Any, et: float, name: str, ops: int, mem: int) -> None:
    """A kernel launch or copy from run_schedule that just finished, `et` seconds long (as measured by the runtime;
    the span ends now, so a compile before the launch isn't counted in it)."""
    ts = now_ns() - int(et * 1e9)
    dev = si.bufs[0].device
    if si.is_copy: add_event(name.strip(), "copy", dev, "copies", ts, int(et * 1e9), bytes=mem, src=si.bufs[1].device)
    else:
        add_event(name, "kernel", dev, "kernels", ts, int(et * 1e9), kernel=RECORDER.kernel_ctx.get((si.ast, dev)),
                  ops=ops, mem=mem, bufs=len(si.bufs))
