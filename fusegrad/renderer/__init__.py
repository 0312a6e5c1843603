"""Renderers: linear program -> source text for one target. `ProgramSpec` is what codegen hands to a runtime.

Every renderer is a rule table over the linear program: `Renderer.rules` maps each op to a function
`rule(renderer, ctx, u) -> str` that renders one uop and returns its value (a name, or an expression its users inline).
One shared walk (`RenderContext.walk`) runs the rules in program order; `TextKernel` adds what the statement-based
targets (C and its dialects, WGSL) share: loop depth and indentation, inlining of single-use values, and naming. A
target extends or overrides its parent's table (`rules = {**Parent.rules, Ops.X: rule}`), so adding an op to a
backend is one table entry (docs/architecture.md, section 5).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

from fusegrad.dtype import DType, dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.runtime.machine import Machine


@dataclass
class ProgramSpec:
    """A compiled-to-source kernel: its name, source, and what a launch needs to know."""
    name: str
    src: str
    uops: list[UOp]
    nbufs: int
    ops: int = 0            # estimated ALU ops (for GFLOPS)
    mem: int = 0            # estimated bytes touched (for GB/s)
    global_size: tuple[int, ...] = (1, 1, 1)
    local_size: tuple[int, ...] = (1, 1, 1)
    vars: list[UOp] = field(default_factory=list)
    display_name: str = ""
    thread_size: int = 0    # >0: the kernel takes (core_start, core_end) and may be split over that many iterations

    def var_is_64bit(self, i: int) -> bool:
        """Whether the i-th variable argument is passed as a 64-bit int (a variable whose range needs 64 bits)."""
        v = self.vars[i] if i < len(self.vars) else None
        return getattr(getattr(v, "dtype", None), "itemsize", 4) == 8


class Renderer:
    """Base class: a target's name for the device it renders for, and which dtypes it supports."""
    device: str = ""
    has_local: bool = False
    global_max: tuple[int, ...] | None = None  # with has_local: the grid's size limit per dimension
    local_max: int = 1            # with has_local: the most work-items in one workgroup...
    local_dim_max: tuple[int, ...] = (1, 1, 1)  # ...and along each dimension
    has_shared: bool = False      # with has_local: workgroup shared memory and barriers (DEFINE_LOCAL, BARRIER: GROUP)
    group_max_outputs: int = 1024  # with has_shared: GROUP a long reduce when the kernel has at most this many outputs
    local_size_in_source: bool = False  # with has_local: the workgroup size is compiled in, render(name, uops, local_size)
    threads: int = 1              # >1: the runtime can split a kernel's outermost output loop over this many threads
    min_thread_work: int = 1 << 17  # loop iterations below which a kernel runs on one thread
    simd_bytes: int = 0           # width of the target's vector registers; 0: no vector types (no VECTORIZE)
    cache_bytes: int = 0          # per-core cache to block big inputs for (the TILE action); 0: no cache blocking
    machine: Machine | None = None  # CPU targets: the machine description (runtime/machine.py) the heuristics read
    masked_vector_loads: bool = False  # renders INDEX(buf, base, all, lanes): a vector load gated lane by lane
                                  # (codegen/vectorize.py), so VECTORIZE keeps a padded conv's input loads whole
    widen_narrow_vectors: bool = False  # casts and shifts of 8/16-bit integer vectors run in int32 lanes
                                  # (codegen/widen.py: the C compiler does them lane by lane otherwise)
    vector_math: bool = False     # exp2 and log2 of float32 vectors are whole-vector code (not a call per lane):
                                  # elementwise kernels evaluating them are worth VECTORIZE (opt.py, elementwise_opts)

    def dot4_lanes(self) -> tuple[int, ...]:
        """The int32 lane counts of the Ops.DOT4 (8-bit dot products) it renders as instructions (codegen/dot4.py
        makes them only for these); none by default."""
        return ()

    def dot4_max_unsigned(self) -> int:
        """The largest unsigned byte its DOT4 multiplies exactly (codegen/dot4.py checks the operand's bound)."""
        return 0

    def supported_dtypes(self) -> list[DType]:
        """Every dtype kernels on this device can use (natively or emulated by codegen)."""
        return list(dtypes.all)

    def native_dtypes(self) -> list[DType]:
        """The dtypes the target language has; codegen emulates the others it supports."""
        return list(dtypes.all)

    # op -> rule(renderer, ctx, u) -> the uop's rendered value (see the module docstring); empty: no rule table
    rules: dict[Ops, Rule] = {}

    def cant_render(self, op: Ops) -> str:
        """The message for an op this target has no rule for."""
        return f"{type(self).__name__} can't render {op}"

    def render(self, name: str, uops: list[UOp]) -> str:
        raise NotImplementedError

    def __repr__(self) -> str: return f"{type(self).__name__}()"


Rule = Callable[..., str]  # rule(renderer, ctx, u) -> the value of u as its users read it ('' for statements)
AluRule = Callable[..., str]  # an ALU table's rule(renderer or context, op, dtype, operands, src dtype) -> value


class TextRenderer(Renderer):
    """A statement-based target (the C family, WGSL): rendered by the TextKernel walk, whose hooks it supplies."""
    max_nest: int | None = None  # inlined expressions nested deeper than this get a variable (None: no limit)

    def names_operands_twice(self, u: UOp) -> bool:
        """Whether the template for u mentions an operand more than once (its operands then get variables)."""
        return False

    def render_let(self, name: str, dt: DType, expr: str) -> str:
        """The statement declaring variable `name` of dtype dt, holding expr."""
        raise NotImplementedError

    def render_alu(self, op: Ops, dt: DType, a: list[str], src_dtype: DType) -> str: raise NotImplementedError
    def render_cast(self, dt: DType, x: str, src_dt: DType) -> str: raise NotImplementedError
    def render_bitcast(self, dt: DType, x: str, src_dt: DType) -> str: raise NotImplementedError


def value_rule(ren: TextRenderer, k: TextKernel, u: UOp) -> str:
    """ALU ops, CAST and BITCAST on the text targets: the target's render_alu/render_cast/render_bitcast expression of
    the operands' values, inlined into its user or bound to a variable (TextKernel.value)."""
    a = [k.r[s] for s in u.src]
    if u.op is Ops.CAST: expr = ren.render_cast(u.dtype, a[0], u.src[0].dtype)
    elif u.op is Ops.BITCAST: expr = ren.render_bitcast(u.dtype, a[0], u.src[0].dtype)
    else: expr = ren.render_alu(u.op, u.dtype, a, u.src[-1].dtype)
    return k.value(u, expr)


def alu_rules(rule: Rule | None = None) -> dict[Ops, Rule]:
    """One rule (default: value_rule) for every ALU op, CAST and BITCAST."""
    return {op: rule or value_rule for op in GroupOp.ALU | {Ops.CAST, Ops.BITCAST}}


def close_block(ren: TextRenderer, k: TextKernel, u: UOp) -> str:
    """END on the brace-block targets: the loop's closing brace."""
    k.line("}")
    return ""


def range_name(u: UOp) -> str:
    """A loop counter's name: ridxN for a reduce loop, gidxN for the others (N: the RANGE's axis number)."""
    return f"{'r' if u.arg[1] == 'reduce' else 'g'}idx{u.arg[0]}"


class RenderContext:
    """The shared walk: the state of rendering one kernel, and the loop that applies the renderer's rule to each uop
    in program order, keeping the value each returns in `r` (what later uops read for their operands)."""

    def __init__(self, renderer: Renderer, name: str, uops: list[UOp]):
        self.ren, self.name, self.uops = renderer, name, uops
        self.r: dict[UOp, str] = {}
        self.i, self.u = 0, uops[0] if uops else None  # the uop being rendered, and its position

    def walk(self) -> Self:
        rules, ren = self.ren.rules, self.ren
        for i, u in enumerate(self.uops):
            self.i, self.u = i, u
            rule = rules.get(u.op)
            if rule is None: raise RuntimeError(ren.cant_render(u.op))
            self.r[u] = rule(ren, self, u)
        return self


class TextKernel(RenderContext):
    """The walk of the statement-based targets (C-style, WGSL): a kernel is a list of lines, loops nest by RANGE/END,
    and an ALU value used once, at its own loop depth, is written into its user's expression instead of a variable.

    The renderer (a TextRenderer) supplies `render_let(name, dtype, expr)` (a variable declaration),
    `names_operands_twice(u)` (its template for u mentions an operand twice, so operands get variables) and
    `max_nest`."""

    def __init__(self, renderer: TextRenderer, name: str, uops: list[UOp]):
        super().__init__(renderer, name, uops)
        self.ren: TextRenderer = renderer
        self.uses = uop_uses(uops)
        self.depth_of: dict[UOp, int] = {}
        self.use_depth: dict[UOp, int] = {}
        self.repeated: set[UOp] = set()  # operands a template mentions more than once: they get a variable
        d = 0
        for u in uops:
            if u.op is Ops.END: d -= 1
            self.depth_of[u] = d
            for s in u.src: self.use_depth[s] = d
            if renderer.names_operands_twice(u): self.repeated.update(u.src)
            if u.op is Ops.RANGE: d += 1
        self.args: list[str] = []    # kernel arguments (C-style) or module declarations (WGSL)
        self.body: list[str] = []
        self.counters: dict[str, int] = {}
        self.nest: dict[UOp, int] = {}  # an operation inlined into its user's expression -> how deep it nests
        self.needs: set = set()      # what the kernel's head must define (target-specific: helper functions...)

    def new_name(self, prefix: str) -> str:
        """prefix0, prefix1, ...: a fresh variable name."""
        self.counters[prefix] = self.counters.get(prefix, 0) + 1
        return f"{prefix}{self.counters[prefix] - 1}"

    def line(self, s: str) -> None:
        """A statement at the loop depth of the uop being rendered."""
        self.body.append("  " * (self.depth_of[self.u] + 1) + s)

    def bind(self, expr: str, dt: DType, prefix: str = "alu") -> str:
        """A new variable holding expr; returns its name."""
        nm = self.new_name(prefix)
        self.line(self.ren.render_let(nm, dt, expr))
        return nm

    def single_use(self, u: UOp) -> bool:
        """u is read once, at its own loop depth, and no template mentions it twice: it may be inlined."""
        return self.uses.get(u, 0) == 1 and self.use_depth.get(u) == self.depth_of[u] and u not in self.repeated

    def value(self, u: UOp, expr: str) -> str:
        """The value of ALU-like u: expr itself when it can be inlined (and the expression isn't nested deeper than
        the renderer's max_nest), else a new `alu` variable."""
        n = 1 + max((self.nest.get(s, 0) for s in u.src), default=0)
        limit = self.ren.max_nest
        if self.single_use(u) and (limit is None or n <= limit):
            self.nest[u] = n
            return expr
        return self.bind(expr, u.dtype)


def uop_uses(uops: list[UOp]) -> dict[UOp, int]:
    cnt: dict[UOp, int] = {}
    for u in uops:
        for s in u.src: cnt[s] = cnt.get(s, 0) + 1
    return cnt


def is_pure(u: UOp) -> bool:
    return u.op in GroupOp.ALU or u.op in (Ops.CAST, Ops.BITCAST, Ops.CONST, Ops.INDEX)
