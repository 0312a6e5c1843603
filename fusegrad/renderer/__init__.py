"""Renderers: linear program -> source text for one target. `ProgramSpec` is what codegen hands to a runtime."""
from __future__ import annotations

from dataclasses import dataclass, field

from fusegrad.dtype import DType, dtypes
from fusegrad.ir.ops import Ops, UOp
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
    vector_math: bool = False     # exp2 and log2 of float32 vectors are whole-vector code (not a call per lane):
                                  # elementwise kernels evaluating them are worth VECTORIZE (opt.py, elementwise_opts)

    def supported_dtypes(self) -> list[DType]:
        """Every dtype kernels on this device can use (natively or emulated by codegen)."""
        return list(dtypes.all)

    def native_dtypes(self) -> list[DType]:
        """The dtypes the target language has; codegen emulates the others it supports."""
        return list(dtypes.all)

    def render(self, name: str, uops: list[UOp]) -> str:
        raise NotImplementedError

    def __repr__(self) -> str: return f"{type(self).__name__}()"


def uop_uses(uops: list[UOp]) -> dict[UOp, int]:
    cnt: dict[UOp, int] = {}
    for u in uops:
        for s in u.src: cnt[s] = cnt.get(s, 0) + 1
    return cnt


def is_pure(u: UOp) -> bool:
    from fusegrad.ir.ops import GroupOp
    return u.op in GroupOp.ALU or u.op in (Ops.CAST, Ops.BITCAST, Ops.CONST, Ops.INDEX)
