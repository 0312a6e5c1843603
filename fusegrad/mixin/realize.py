"""Realize and data access: hand a tensor's graph to the scheduler (schedule/) and the engine (engine/), then read
the result back (`numpy`, `tolist`, `item`, `data`) or share it through DLPack.

Mixed into `Tensor`; `realize()` is the one place the frontend calls into the lower stages.
"""
from __future__ import annotations

import gc
import struct
from typing import Any, Sequence, TYPE_CHECKING

import fusegrad.schedule as scheduler
from fusegrad import storage
from fusegrad.device import Buffer, canonical_device as _canonical_device
from fusegrad.dlpack import export, import_dlpack
from fusegrad.dtype import ConstType, DType, bf16_to_float, dtypes, fp8_to_float, to_np_dtype
from fusegrad.engine.capture import JitError, capturing, note_relayout
from fusegrad.engine import realize as engine   # (engine.run_schedule, scheduler.create_schedule at call time:
                                               # tests replace them)
from fusegrad.helpers import PROFILE, VIZ, dedup, prod
from fusegrad.ir.ops import Ops, UOp, VarVals
from fusegrad.ir.shape import all_static
from fusegrad.storage import buffers, is_contiguous_buffer, is_realized, leaf_of
from fusegrad.views import assign_owner, preserve_old_values, refresh_views, substitute_outside_assigns, view_bases

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


def _half_memoryview() -> bool:
    """Whether memoryview.cast accepts float16 ('e'): Python 3.12 and later."""
    try:
        memoryview(bytes(2)).cast("e")
        return True
    except ValueError:
        return False


_HALF_MEMORYVIEW = _half_memoryview()


def _unpack(data: bytes, dtype: DType) -> list[Any]:
    if dtype in dtypes.fp8s:
        return [fp8_to_float(b, dtype) for b in data]
    if dtype == dtypes.bfloat16:
        return [bf16_to_float(v) for v in struct.unpack(f"{len(data) // 2}H", data)]
    assert dtype.fmt is not None
    return list(struct.unpack(f"{len(data) // dtype.itemsize}{dtype.fmt}", data))


class RealizeMixin:
    __slots__ = ()

    def schedule(self: "Tensor", *lst: "Tensor") -> list[Any]:
        """The kernels realize() would run, without running them."""
        return scheduler.create_schedule([t.uop for t in (self,) + lst])[0]

    def schedule_linear(self: "Tensor", *lst: "Tensor") -> list[Any]:
        """The kernels (in run order) that realize() would run for this tensor and `lst`, without running them."""
        return self.schedule(*lst)

    def linear_with_vars(self: "Tensor", *lst: "Tensor") -> tuple[list[Any], dict[Any, int]]:
        """`(schedule_linear(*lst), {variable: bound value})` for the bound Variables the graphs use (a `VarVals`:
        a lookup also takes the variable's name, `var_vals["n"]`, like tinygrad's newer releases)."""
        items = self.schedule(*lst)
        return items, VarVals({v: val for si in items for v, val in si.var_vals.items()})

    def realize(self: "Tensor", *lst: "Tensor", do_update_stats: bool = True) -> "Tensor":
        """Compute this tensor (and `lst`) now; later uses read the stored result. (`do_update_stats` is accepted
        for tinygrad compatibility; fusegrad always counts kernels.)"""
        type(self)._realize_all([self, *lst])
        return self

    @classmethod
    def _realize_all(cls: "type[Tensor]", tensors: Sequence["Tensor"]) -> None:
        # no garbage collection while scheduling and running (tinygrad's realize does the same): the temporaries of a
        # realize die by reference counting before it returns, but a collection in the middle finds them alive with
        # the graph they walk and moves them all to an older generation, where they count toward the next full
        # collection (0.3 s with torch imported). Eager MiniLM 2x13, 150 calls: 795 -> 661 young and 4 -> 3 full
        # collections. Nothing is lost: a cycle made meanwhile is collected after.
        if not gc.isenabled(): return cls._realize_some(tensors)
        gc.disable()
        try: cls._realize_some(tensors)
        finally: gc.enable()

    @classmethod
    def _realize_some(cls: "type[Tensor]", tensors: Sequence["Tensor"]) -> None:
        todo = [t for t in tensors if not is_realized(t.uop)]
        if not todo: return
        if VIZ or PROFILE:  # fusegrad/viz records this realize as one context (schedule, kernels, timeline)
            from fusegrad.viz.recorder import realize_context
            with realize_context(len(todo)): return cls._realize_todo(todo, traced=True)
        cls._realize_todo(todo)

    @classmethod
    def _realize_todo(cls: "type[Tensor]", todo: list["Tensor"], traced: bool = False) -> None:
        # each tensor once (realize(a, a), two views of one lazy base): a second visit would find it realized already
        todo = list({id(t): t for t in view_bases(todo)}.values())
        if not todo: return
        # tensors that read memory this realize overwrites keep the value they were built with (as in eager execution)
        readers: list[Tensor] = []
        snaps = preserve_old_values(todo, readers)
        uops = dedup([t.uop for t in todo] + snaps)
        # (custom backward rules are stripped by the scheduler: schedule/cache.py)
        try:
            if traced:
                from fusegrad.viz.recorder import traced_schedule
                sched, results = traced_schedule(scheduler.create_schedule, uops)
            else: sched, results = scheduler.create_schedule(uops)
        except Exception:
            # nothing ran; a pending write that can't be scheduled (it reads a value a later write destroyed) raises
            # again when its tensor is read, but is no longer run on behalf of other code (TinyJit runs every live
            # tensor's pending writes before a capture, and would blame this error on an unrelated function)
            for t in todo: assign_owner.pop(t.uop, None)
            raise
        # (the snapshots proper: a reader realized whole is an ordinary result, valid only until what it read is written)
        snap_ids = {id(u) for u in snaps if u.op is Ops.CONTIGUOUS and type(u.arg) is int}
        # the buffers each target's graph reads (for the result cache and autograd history), walked now: after the
        # kernels ran, the graph is out of the CPU caches and the same walk takes about twice as long
        # (all of them for autograd histories; the direct ones, not through an ASSIGN, for the result cache)
        # (the scheduler's walk gives them for a graph it saw whole: ScheduleResults.reads)
        known = results.reads
        split = {id(u): known[u] if u in known else storage.reads_split(u)
                 for u in uops if u.op is not Ops.ASSIGN and id(u) not in snap_ids}
        reads = {k: v[0] for k, v in split.items()}
        direct = {k: v[1] for k, v in split.items()}
        engine.run_schedule(sched)
        written = {id(si.bufs[0]): si.bufs[0] for si in sched if si.inplace}
        for b in written.values(): storage.written(b)   # cached results computed from the old contents are void
        written_now = {storage.memory_of(b) for b in written.values()}
        # an ASSIGN overwritten by a later one in the same schedule is done, but its value is gone
        superseded = {n.src[0].base for n in results if n.op is Ops.ASSIGN}
        for old, new in results.items():
            if old in superseded: storage.executed.add(old)
            else: storage.cache_result(old, new, None if id(old) in snap_ids else written_now, direct.get(id(old)))
            if old.op is Ops.CONTIGUOUS and (src := storage.relayout_source(old)) is not None:
                note_relayout(storage.buffers[src[0]], storage.buffers[new.base])   # TinyJit replays may skip it
                if storage.memory_of(storage.buffers[src[0]]) not in written_now:
                    storage.relayout_put(old, new)   # a relayout of an unchanged buffer: reused until it is written
        for t in todo:
            old = t.uop
            new = results[old]
            if t._derived: storage.record_history(new, old, reads.get(id(old)))  # keep the history for backward()
            elif old.op is Ops.CONTIGUOUS and isinstance(old.arg, int): leaf_of.setdefault(new, old)
            t.uop = new
            storage.claim(t)   # the memory computed for it is its own (unless a live tensor owns it already)
        for t in todo: refresh_views(t, realized_now=True)
        # readers of a snapshot hold its buffer itself (a cached result lives only while some tensor holds it)
        if snaps:
            done = {s: results[s] for s in snaps}
            for t in readers:
                if is_contiguous_buffer(t.uop): continue
                if t.uop in done:   # realized whole (views.py): its views are rebuilt on the result
                    t.uop = done[t.uop]
                    refresh_views(t)
                else: t.uop = substitute_outside_assigns(t.uop, done)
        # a tensor of its own (a parameter's initial value: a unique CONTIGUOUS) computed as part of another graph now
        # holds that memory, like a target: a later write to it (an optimizer step) goes into the memory the graphs
        # computed with it read, and a TinyJit capture that read it sees the write. (Rare: a first step computing the
        # parameters; only then the live tensors are looked through.)
        uniq = {old: new for old, new in results.items() if old.op is Ops.CONTIGUOUS and type(old.arg) is int and
                old not in snaps and new.base.op is Ops.BUFFER}
        if uniq:
            for u in todo: uniq.pop(u.uop, None)
            claimed = set()
            for t in storage.live_tensors:
                if (new := uniq.get(t.uop)) is not None:
                    if not t._derived: leaf_of.setdefault(new, t.uop)
                    claimed.add(t.uop)
                    t.uop = new
                    storage.claim(t)
                    refresh_views(t)
            # one no tensor holds any more (a parameter whose update is pending: the update reads its initial value)
            # stays cached while graphs hold its node, else a later graph would compute it again from memory
            # (the RNG state) that has moved on
            for old in uniq.keys() - claimed: storage.realized.hold(old)
        # a tensor whose pending write ran as part of another graph now holds its buffer (the ASSIGN is done)
        for old, new in results.items():
            if old.op is Ops.ASSIGN and (ref := assign_owner.pop(old, None)) is not None and \
               (t := ref()) is not None and t.uop is old:
                t.uop = new
                refresh_views(t)

    def _buffer(self: "Tensor") -> Buffer:
        """The realized, contiguous buffer holding this tensor's data."""
        if capturing:
            raise JitError("reading tensor data (.item()/.numpy()/.tolist()) inside a TinyJit function: the value "
                           "would be frozen into the capture. Return the tensor instead and read it outside")
        if isinstance(self.device, tuple): return self.to(self.device[0])._buffer()   # gathered on the first device
        self.realize()
        t = self if is_contiguous_buffer(self.uop) else self._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))
        t.realize()
        buf = buffers[t.uop.base]
        if all_static(self.shape): return buf
        # a symbolic shape lives in a prefix of a buffer allocated at its largest size
        n = prod(self._concrete_shape())
        if Buffer.supports_views(buf.device): return buf.view(n, buf.dtype)
        return Buffer(buf.device, n, buf.dtype).copyin(buf.as_bytes()[:n * buf.dtype.itemsize])

    def data(self: "Tensor") -> memoryview:
        """The data as a memoryview in the dtype's struct format, shaped like the tensor.

        float16 ('e') views need Python 3.12; on older versions a float16 tensor comes back as its bit patterns in
        format 'H' (uint16), which `numpy.frombuffer(t.data(), numpy.float16)` reads on any version. Dtypes without
        a struct format (bfloat16, fp8) come back as flat bytes ('B').

        >>> Tensor([[1, 2], [3, 4]]).data().tolist()
        [[1, 2], [3, 4]]
        """
        mv = memoryview(self._buffer().as_bytes())
        if self.dtype.fmt is None: return mv
        fmt = self.dtype.fmt if self.dtype.fmt != "e" or _HALF_MEMORYVIEW else "H"
        shape = self._concrete_shape()
        return mv.cast(fmt, shape) if shape and 0 not in shape else mv.cast(fmt)

    def numpy(self: "Tensor") -> Any:
        """A NumPy copy of the data."""
        import numpy as np
        if self.dtype == dtypes.bfloat16 or self.dtype in dtypes.fp8s: return self.float().numpy()
        out = np.empty(self._concrete_shape(), dtype=to_np_dtype(self.dtype))
        if out.size: self._buffer().copyout(memoryview(out.reshape(-1).view(np.uint8)))
        return out

    # ----- interop -----
    @staticmethod
    def from_dlpack(x: Any, device: str | None = None, copy: bool | None = None) -> "Tensor":
        """A tensor of `x`'s data, for any `x` with `__dlpack__` (NumPy arrays, torch tensors, ...), keeping its dtype
        and shape. Shares `x`'s memory (writes show on both sides) when `x` is compact row-major host memory, writable
        and aligned, and `device` keeps buffers in host memory (CPU, LLVM); copies otherwise. `copy=True` always
        copies; `copy=False` raises BufferError instead of copying. See docs/interop.md.

        >>> import numpy as np
        >>> a = np.arange(3, dtype=np.float32)
        >>> t = Tensor.from_dlpack(a, device="CPU")
        >>> a[0] = 7.0; t.tolist()
        [7.0, 1.0, 2.0]
        """
        return import_dlpack(x, _canonical_device(device), copy)

    def __dlpack__(self: "Tensor", *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of this tensor (what `numpy.from_dlpack(t)` and `torch.from_dlpack(t)` call). A whole
        realized buffer on a host-memory device (CPU, LLVM) is shared; a lazy tensor is realized first, and a view,
        a constant or a tensor on another device is copied to host memory. `copy=False` raises BufferError instead.

        >>> import numpy as np
        >>> t = Tensor([1.0, 2.0], device="CPU").realize()
        >>> a = np.from_dlpack(t); a[1] = 5.0; t.tolist()
        [1.0, 5.0]
        """
        if stream is not None: raise BufferError(f"fusegrad hands out host memory: stream must be None, not {stream!r}")
        if dl_device is not None and tuple(int(x) for x in dl_device) != (1, 0):
            raise BufferError(f"fusegrad exports to the host (kDLCPU, 0) only, not dl_device={tuple(dl_device)}")
        return export(self, max_version, copy)

    def __dlpack_device__(self: "Tensor") -> tuple[int, int]:
        """(kDLCPU, 0): `__dlpack__` always hands out host memory (a copy from a device without host memory)."""
        return (1, 0)

    def tolist(self: "Tensor") -> Any:
        shape = self._concrete_shape()
        vals = _unpack(self._buffer().as_bytes(), self.dtype) if prod(shape) else []
        if dtypes.is_bool(self.dtype): vals = [bool(v) for v in vals]
        if not shape: return vals[0]

        def nest(flat: list[Any], shape: tuple[int, ...]) -> list[Any]:
            if len(shape) == 1: return flat
            step = prod(shape[1:])
            return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
        return nest(vals, shape)

    def item(self: "Tensor") -> ConstType:
        if prod(self._concrete_shape()) != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to a Python scalar")
        return self.reshape(()).tolist()
