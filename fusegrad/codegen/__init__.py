"""Codegen: kernel AST -> simplified index math -> optimizations -> linear program -> rendered source.

`to_program` is the one entry point; each step is a named pass so DEBUG/VIZ can show it.
"""
from __future__ import annotations

from fusegrad.helpers import DEBUG, MERGE_RANGES, NOOPT, SPEC, colored
from fusegrad.ir.ops import Ops, UOp, print_tree
from fusegrad.ir.pattern import graph_rewrite
from fusegrad.ir import spec   # (spec.verify_* at call time: tests count the calls)
from fusegrad.ir.symbolic import pm_symbolic
from fusegrad.codegen.decompose import decompose_dtypes
from fusegrad.codegen.dot4 import contract_dot4
from fusegrad.codegen.gpudims import add_gpudims
from fusegrad.codegen.safediv import guard_int_division
from fusegrad.codegen.linearize import linearize, trip_count
from fusegrad.codegen.merge import merge_ranges, split_ranges
from fusegrad.codegen.narrow import narrow_inplace_ranges
from fusegrad.codegen.opt import apply_opts
from fusegrad.codegen.widen import widen_narrow_vectors
from fusegrad.renderer import ProgramSpec, Renderer


def kernel_name(ast: UOp) -> str:
    """E_<output sizes> for elementwise kernels, r_<output sizes>_<reduce sizes> for kernels with a reduce."""
    rngs = sorted({n for n in ast.toposort() if n.op is Ops.RANGE}, key=lambda r: r.arg[0])
    glob = [_size_name(r.src[0]) for r in rngs if r.arg[1] != "reduce"]
    red = [_size_name(r.src[0]) for r in rngs if r.arg[1] == "reduce"]
    prefix = "r" if any(n.op is Ops.REDUCE for n in ast.toposort()) else "E"
    return "_".join([prefix] + (glob or ["1"]) + red)


def _size_name(size: UOp) -> str:
    """A loop size in a kernel name: the number, or the variable names of a symbolic size (`n`, `nx4`)."""
    if size.op is Ops.CONST: return str(size.arg)
    if size.op is Ops.DEFINE_VAR: return size.arg[0]
    if size.op is Ops.MUL and size.src[1].op is Ops.CONST: return f"{_size_name(size.src[0])}x{size.src[1].arg}"
    return "".join(n.arg[0] for n in size.toposort() if n.op is Ops.DEFINE_VAR)


def format_linear(uops: list[UOp]) -> str:
    """One numbered line per op of a linear program: op, dtype, sources by number, arg."""
    num = {u: i for i, u in enumerate(uops)}
    return "\n".join(f"{i:4d} {u.op.name:<11} {str(u.dtype):<22} {' '.join(f'%{num[s]}' for s in u.src if s in num):<16}"
                     f" {'' if u.arg is None else repr(u.arg)}" for i, u in enumerate(uops))


THREAD_OPS_PER_STEP = 8   # ALU ops worth one loop step of the trip-count measure (a step of scalar code does a few)


def mark_thread_loop(uops: list[UOp], renderer: Renderer, ops: int = 0) -> int:
    """Let the runtime split a big kernel's outermost output loop across threads: that loop's RANGE becomes kind
    'thread' (iterations are independent). Returns its size, or 0 when the kernel stays on one thread. The work is
    the loop iterations, or the kernel's ALU ops (`ops`, vector lanes counted) over THREAD_OPS_PER_STEP
    when that is more: a register-tiled matmul does 16 vector FMAs per innermost step (26x384 @ 384x1536, MiniLM's
    FFN at batch 2 x 13 tokens: 60k steps, 31M flops, ran on one core)."""
    if renderer.threads <= 1: return 0
    first = next((i for i, u in enumerate(uops) if u.op is Ops.RANGE), None)
    if first is None or uops[first].arg[1] == "reduce": return 0
    if any(u.op in (Ops.DEFINE_REG, Ops.STORE) for u in uops[:first]): return 0  # work before the loop
    if uops[first].src[0].op is not Ops.CONST: return 0  # a symbolic loop: its chunks aren't known at compile time
    size = int(uops[first].src[0].arg)
    # loop iterations, a cheap proxy for the work: each loop's trip count times those of the loops around it, summed
    # (loops side by side add up: a layernorm's two 384-long reduces over 13 rows are 10k steps, not 13 x 384 x 384)
    work, nest = 0, [1]
    for u in uops[first:]:
        if u.op is Ops.RANGE:
            nest.append(nest[-1] * max(trip_count(u), 1))
            work += nest[-1]
        elif u.op is Ops.END: nest.pop()
    if not any(u.op is Ops.RANGE and u.arg[1] == "reduce" for u in uops):  # a vectorized elementwise loop: each trip
        work *= max((u.dtype.count for u in uops if u.op is Ops.LOAD), default=1)  # does w elements' work
    work = max(work, ops // THREAD_OPS_PER_STEP)
    if size < 2 or work < renderer.min_thread_work: return 0
    old = uops[first]
    new = UOp(Ops.RANGE, old.dtype, old.src, (old.arg[0], "thread"))
    mapping = {old: new}
    for i in range(first, len(uops)):
        u = uops[i]
        if any(s in mapping for s in u.src): mapping[u] = u.replace(src=tuple(mapping.get(s, s) for s in u.src))
        uops[i] = mapping.get(u, u)
    return size


def to_program(ast: UOp, renderer: Renderer, opts: list | None = None) -> ProgramSpec:
    """Kernel AST -> ProgramSpec. `opts` overrides the hand-coded optimizations (a list of `Opt`; [] for none)."""
    if SPEC:
        spec.verify_kernel(ast)
    if DEBUG >= 5: print(colored("kernel AST:", "cyan") + "\n" + print_tree(ast))
    sink = graph_rewrite(ast, pm_symbolic, name="kernel symbolic")
    if opts is None and not NOOPT:   # (explicit opts name the AST's own axes and sizes)
        sink = narrow_inplace_ranges(sink)   # an in-place write through a slice visits the slice only (narrow.py)
        if MERGE_RANGES: sink = merge_ranges(split_ranges(sink))
    name = kernel_name(sink)
    sink = decompose_dtypes(sink, renderer.native_dtypes())
    sink = guard_int_division(sink)  # x // 0 must not kill the process (codegen/safediv.py)
    if not NOOPT or opts: sink = apply_opts(sink, renderer, opts)
    sink = contract_dot4(sink, renderer)   # 8-bit dot products where the target has them (dot4.py)
    if renderer.widen_narrow_vectors: sink = widen_narrow_vectors(sink)   # 8/16-bit lanes in int32 (widen.py)
    # GPU-style targets only (renderer.has_local): the output loops become the grid of work-items
    global_size: tuple[int, ...] = (1, 1, 1)
    local_size: tuple[int, ...] = (1, 1, 1)
    if renderer.has_local: sink, global_size, local_size = add_gpudims(sink, renderer)
    uops, est = linearize(sink)
    # a buffer whose every read simplified away (a pad of an empty tensor) still takes its argument slot: the runtime
    # passes buffers by position
    have = {u.arg for u in uops if u.op is Ops.PARAM}
    lost = [p for p in ast.toposort() if p.op is Ops.PARAM and p.arg not in have]
    if lost:
        params = sorted(lost + [u for u in uops if u.op is Ops.PARAM], key=lambda p: p.arg)
        uops = params + [u for u in uops if u.op is not Ops.PARAM]
    # variables (symbolic sizes) are int arguments after the buffers, in name order: runtimes pass spec.vars' values
    variables = sorted((u for u in uops if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0])
    for a, b in zip(variables, variables[1:]):   # one name is one kernel argument
        if a.arg[0] == b.arg[0]:
            kinds = f"{a.arg[1]}..{a.arg[2]} {a.dtype} and {b.arg[1]}..{b.arg[2]} {b.dtype}"
            raise ValueError(f"kernel {name}: two different variables named {a.arg[0]!r} ({kinds}); "
                             "give them different names")
    if variables:
        n_params = sum(1 for u in uops if u.op is Ops.PARAM)
        rest = [u for u in uops if u.op is not Ops.DEFINE_VAR]
        uops = rest[:n_params] + variables + rest[n_params:]
    thread_size = mark_thread_loop(uops, renderer, est.ops)
    if SPEC:
        spec.verify_linear(uops)
    if DEBUG >= 5:
        print(colored(f"linear program of {name}:", "cyan"))
        print(format_linear(uops))
    # a target that compiles the workgroup size into the kernel (WGSL's @workgroup_size) renders it from the launch shape
    src = renderer.render(name, uops, local_size) if renderer.local_size_in_source else renderer.render(name, uops)
    if DEBUG >= 4: print(src)
    nbufs = sum(1 for u in uops if u.op is Ops.PARAM)
    return ProgramSpec(name, src, uops, nbufs, est.ops, est.mem, global_size, local_size, vars=variables,
                       display_name=name, thread_size=thread_size)
