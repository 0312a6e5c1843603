"""TinyJit: run a function once normally, capture the kernels of its second call, replay them on later calls.

Replay skips the frontend, scheduler and compiler: it launches the captured kernels with the new input buffers.
Everything that would make a replay silently wrong is checked and raises JitError instead:
  - inputs with other shapes, dtypes, devices or a different count than at capture (a bound Variable in a shape, or
    passed as an argument, may change value: shapes are compared with it unbound and each call's value is passed to
    the kernels);
  - non-Tensor arguments that differ from the captured ones (their values are baked into the kernels);
  - reading tensor data (.item(), .numpy(), .tolist()) while capturing (the value would be frozen);
  - the same buffer passed twice, or nested TinyJit calls.
A slice bound that holds only for some values of its variable (`t[:, :v]`, v's maximum past the axis) is checked for
each replay's values: a value past the axis raises BoundsError (an IndexError) before anything runs.
Outputs get fresh buffers on every replay, so a tensor returned earlier is never overwritten by a later call.
A capture holds no derived value as a constant (docs/architecture.md, "Caches and captures: one rule"), and
`verify=N` / JIT_VERIFY=N checks the first N replays against eager calls.
State updated in place (assign: optimizer parameters, BatchNorm running stats, the RNG counter) advances on every replay.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import functools
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, TypeVar

from fusegrad import storage
from fusegrad.device import Buffer
from fusegrad.engine.capture import JitError, capturing, not_capturing, note_assign, note_relayout  # noqa: F401
from fusegrad.engine.realize import get_runner
from fusegrad.helpers import DEBUG, JIT, JIT_GRAPH, JIT_VERIFY, BoundsError, PROFILE, REFERENCE, VIZ, GlobalCounters
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute
from fusegrad.ir.shape import all_static, shrink_bounds_error
from fusegrad.runtime import cpu_graph
from fusegrad.schedule import ScheduleItem
from fusegrad.storage import buffer_uop, buffer_view, buffers
from fusegrad.storage import is_contiguous_buffer, is_realized
from fusegrad.views import assign_owner, realize_readers

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

ReturnType = TypeVar("ReturnType")


def _collect(args: tuple, kwargs: dict) -> tuple[list[Any], list[Any]]:
    """(tensors, the non-Tensor values) in the arguments, one level into lists, tuples and dicts."""
    tensors: list[Tensor] = []
    others: list[Any] = []

    def visit(x: Any, depth: int) -> None:
        if isinstance(x, storage.tensor_class): tensors.append(x)
        elif depth == 0 and isinstance(x, (list, tuple)):
            for v in x: visit(v, 1)
        elif depth == 0 and isinstance(x, dict):
            for k in sorted(x): visit(x[k], 1)
        else: others.append(x)
    for a in args: visit(a, 0)
    for k in sorted(kwargs): visit(kwargs[k], 0)
    return tensors, others


def _swap(x: Any, copies: dict[int, Any]) -> Any:
    """args (a tuple) or kwargs (a dict) with the tensors in `copies` replaced, one level into lists, tuples, dicts."""
    if not copies: return x
    def one(v: Any, depth: int) -> Any:
        if id(v) in copies: return copies[id(v)]
        if depth == 0 and isinstance(v, (list, tuple)): return type(v)(one(e, 1) for e in v)
        if depth == 0 and isinstance(v, dict): return {k: one(e, 1) for k, e in v.items()}
        return v
    if isinstance(x, dict): return {k: one(v, 0) for k, v in x.items()}
    return tuple(one(v, 0) for v in x)


def _unbind(x: Any, var_vals: dict[Any, int]) -> Any:
    """A shape entry (or bound-variable argument) with its bound variables unbound; their values go to var_vals."""
    if not isinstance(x, UOp): return x
    binds = {n: n.src[0] for n in x.toposort() if n.op is Ops.BIND}
    for b, var in binds.items():
        val = int(b.src[1].arg)
        if var_vals.setdefault(var, val) != val:
            raise JitError(f"variable {var.arg[0]!r} is bound to both {var_vals[var]} and {val} in one TinyJit call")
    return substitute(x, binds)


def _signature(t: Any, var_vals: dict[Any, int]) -> tuple:
    """What must match the capture: shape (with variables unbound: their values may change), dtype, device."""
    return (tuple(_unbind(s, var_vals) for s in t.shape), t.dtype, t.device)


def _frozen(v: Any, var_vals: dict[Any, int]) -> Any:
    """A comparable form of a non-Tensor argument (identity for objects we can't compare by value). A bound Variable
    compares as its variable: its value is passed to the kernels on every call."""
    if isinstance(v, UOp) and v.op is Ops.BIND: return ("var", _unbind(v, var_vals))
    if isinstance(v, (int, float, bool, str, bytes, type(None))): return v
    if isinstance(v, (tuple, list)): return tuple(_frozen(x, var_vals) for x in v)
    if type(v).__module__ == "numpy" and hasattr(v, "tobytes") and hasattr(v, "dtype"):
        # an array (or NumPy scalar) is baked in by value: compared by value, never by id() (CPython reuses ids, so
        # a new array of other values in the memory of a freed one would replay the old values)
        data = v.tobytes()
        return ("ndarray", v.dtype.str, getattr(v, "shape", ()),
                data if len(data) <= 256 else hashlib.blake2b(data, digest_size=32).digest())
    return _Same(v)


class _Same:
    """Any other object: the same object as at capture, compared by identity through a reference held to it (a weak one
    where the object allows it: a dead one matches nothing), never by id(), which CPython reuses."""
    __slots__ = ("ref", "name")

    def __init__(self, v: Any) -> None:
        try: self.ref: Callable[[], Any] = weakref.ref(v)
        except TypeError: self.ref = lambda: v   # (no weak references to it: held)
        self.name = type(v).__qualname__

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Same) and (obj := self.ref()) is not None and obj is other.ref()

    def __hash__(self) -> int: return hash(self.name)
    def __repr__(self) -> str: return f"<{self.name} object>"


@dataclass
class _Launch:
    prg: Any
    args: list[Any]            # buffer opaques, with None where a per-call buffer goes
    slots: list[tuple[int, int]]  # (argument position, index into the per-call buffer list)
    item: ScheduleItem
    relayout: tuple[Buffer, Buffer] | None = None   # (source, copy) when the launch only re-lays-out a fixed buffer
    done: storage.Reads | None = None   # (source, copy) and their write versions right after the copy last ran
    bump: Buffer | None = None   # a fixed buffer this launch computes afresh: its version moves on every run
    follow: dict[UOp, UOp] = field(default_factory=dict)   # kernel variable -> the argument variable giving its value

    def skipped(self) -> bool:
        """A relayout whose source and copy are unwritten since it last ran: this run passes it over."""
        return self.relayout is not None and self.done is not None and storage.still_valid(self.done)

    def ran(self, per_call: list[Buffer]) -> storage.Reads | None:
        """What follows a kernel launch (one not skipped): the memory it wrote in place moves to a new version, as
        does a named fixed buffer it computed afresh. A relayout gets the versions it copied, for its `done` once the
        copy has run."""
        if self.item.inplace: storage.written(per_call[self.slots[0][1]] if self.slots and self.slots[0][0] == 0
                                              else self.item.bufs[0])   # cached results read the old contents
        if self.bump is not None: storage.written(self.bump)
        return storage.read_versions(self.relayout) if self.relayout is not None else None

    def values(self, var_vals: dict[Any, int] | None) -> tuple[int, ...]:
        """This call's values of the kernel's variables (one that follows no argument keeps its captured value)."""
        new = _values(self.follow, var_vals)
        return tuple(new.get(v, self.item.var_vals.get(v, 0)) for v in self.prg.spec.vars)


@dataclass
class _Batch:
    """Consecutive kernel launches run by one call into C (runtime/cpu_graph.py, JIT_GRAPH). Before the call, the
    bookkeeping of the launches is done in their order (relayout skips, versions: nothing reads them in between);
    then the per-call words are patched in and the kernels run."""
    calls: cpu_graph.Calls
    launches: list[_Launch]
    bufs: list[tuple[int, int]]        # (word, index into the per-call buffers)
    vars: list[tuple[int, UOp, int]]   # (word, argument variable whose value goes there, value when it has none)
    book: list[tuple[int, _Launch]]    # (skip word, launch) of the launches with bookkeeping
    ops: int
    mem: int


class CapturedJit:
    """The kernels of one captured call, ready to replay with new input (and fresh output) buffers."""

    def __init__(self, items: list[ScheduleItem], inputs: list[Buffer], outputs: list[Buffer], ret_struct: Any,
                 relayouts: list[tuple[Buffer, Buffer]] | None = None, arg_vals: dict[Any, int] | None = None):
        self.items, self.ret_struct = items, ret_struct
        # slice bounds the replay's values must keep in range, and the captured values of the variables
        self.checks = tuple(dict.fromkeys(c for it in items for c in it.checks))
        self.var_vals = {v: x for it in items for v, x in it.var_vals.items()}
        self.follow = _follow(items, arg_vals or {})
        self.inputs, self.outputs = inputs, outputs
        per_call = {id(b): i for i, b in enumerate(inputs)}
        for j, b in enumerate(outputs): per_call.setdefault(id(b), len(inputs) + j)
        self.launches: list[_Launch] = []
        for it in items:
            if it.is_copy:
                self.launches.append(_Launch(None, list(it.bufs), [(k, per_call[id(b)]) for k, b in enumerate(it.bufs)
                                                                  if id(b) in per_call], it))
                continue
            prg = get_runner(it.ast, it.bufs[0].device)
            slots = [(k, per_call[id(b)]) for k, b in enumerate(it.bufs) if id(b) in per_call]
            args = [None if id(b) in per_call else b.opaque for b in it.bufs]
            self.launches.append(_Launch(prg, args, slots, it, follow=_follow([it], arg_vals or {})))
        # A relayout of a buffer (a weight's copy in another layout) whose source is unchanged since the copy last ran
        # is skipped on replay. Conditions: no other launch writes the copy's memory; neither buffer is a per-call
        # one; the capture writes the source only in place (in-place writes, eager or replayed, bump its version);
        # the source isn't shared with code outside fusegrad (DLPack writes aren't seen). A fixed buffer a replay
        # computes afresh gets its version bumped when something outside the capture can read it (a node still names
        # its memory now; none can later), so a relayout of it elsewhere is never served stale.
        writes: dict[int, int] = {}
        for it in items: writes[m] = writes.get(m := storage.memory_of(it.bufs[0]), 0) + 1
        computed = {storage.memory_of(it.bufs[0]) for it in items if not it.inplace}
        pairs = {id(c): (s, c) for s, c in relayouts or ()}
        named = {storage.memory_of(b) for b in list(storage.buffers.values())}
        for ln in self.launches:
            it = ln.item
            if not it.inplace and id(it.bufs[0]) not in per_call and storage.memory_of(it.bufs[0]) in named:
                ln.bump = it.bufs[0]
            if ln.prg is None: continue
            if ln.prg.spec.vars or id(it.bufs[0]) not in pairs or it.inplace: continue
            s, c = pairs[id(it.bufs[0])]
            if c is it.bufs[0] and len(it.bufs) == 2 and it.bufs[1] is s and id(s) not in per_call and \
               id(c) not in per_call and writes[storage.memory_of(c)] == 1 and \
               storage.memory_of(s) not in computed and not storage.is_shared(s):
                ln.relayout = (s, c)

        # the memory a replay writes, other than the fresh outputs: state written in place (an input's buffer is this
        # call's), and the intermediates -- the same buffers on every replay, so a tensor still reading one (a lazy
        # read of a snapshot taken during the capture) would see the next call's contents
        self._written_inputs = sorted({per_call[id(it.bufs[0])] for it in items if id(it.bufs[0]) in per_call
                                       and per_call[id(it.bufs[0])] < len(inputs)})
        self._written_fixed = {storage.memory_of(it.bufs[0]) for it in items if id(it.bufs[0]) not in per_call}
        self._plan: list[_Launch | _Batch] | None = None   # the launches with runs of CPU kernels batched (JIT_GRAPH)

    def plan(self) -> list[_Launch | _Batch]:
        """The launches, each run of consecutive kernels that C can launch (cpu_graph.c_entry) made one _Batch;
        copies between devices and other kernels stay single launches between them."""
        if self._plan is not None: return self._plan
        out: list[_Launch | _Batch] = []
        run: list[tuple[_Launch, int, tuple[int, ...]]] = []
        usable = cpu_graph.runner() is not None
        for ln in self.launches:
            entry = cpu_graph.c_entry(ln.prg) if usable and ln.prg is not None else None
            if entry is not None and len(ln.args) + len(ln.prg.spec.vars) + len(entry[1]) <= cpu_graph.MAX_ARGS:
                run.append((ln, *entry))
                continue
            if run: out.append(_batch(run))
            run = []
            out.append(ln)
        if run: out.append(_batch(run))
        self._plan = out
        return out

    def batched(self) -> int:
        """How many of the launches a replay under JIT_GRAPH runs inside batches (one call into C for each batch)."""
        return sum(len(p.launches) for p in self.plan() if type(p) is _Batch)

    def written_memory(self, in_bufs: list[Buffer]) -> set[int]:
        """The memory (storage.memory_of) a replay with these input buffers writes, fresh outputs aside."""
        return self._written_fixed | {storage.memory_of(in_bufs[i]) for i in self._written_inputs}

    def replay(self, in_bufs: list[Buffer], var_vals: dict[Any, int] | None = None) -> list[Buffer]:
        if self.checks and \
                (err := shrink_bounds_error(self.checks, {**self.var_vals, **_values(self.follow, var_vals)})):
            raise BoundsError(f"TinyJit replay: {err}")
        outs = [Buffer(b.device, b.size, b.dtype) for b in self.outputs]
        per_call = in_bufs + outs
        traced = bool(VIZ.value or PROFILE.value)  # fusegrad/viz: time each replayed launch for the timeline
        for ln in self.plan() if JIT_GRAPH.value and not traced else self.launches:
            if type(ln) is _Batch:
                _run_batch(ln, per_call, var_vals)
                continue
            if ln.prg is None:  # copy between devices
                bufs = list(ln.args)
                for k, i in ln.slots: bufs[k] = per_call[i]
                t0 = time.perf_counter()
                bufs[0].copy_from(bufs[1])
                GlobalCounters.copy_time_s += time.perf_counter() - t0
                GlobalCounters.copy_bytes += bufs[1].nbytes
                if ln.bump is not None: storage.written(ln.bump)
                continue
            if ln.skipped(): continue
            args = list(ln.args)
            for k, i in ln.slots: args[k] = per_call[i].opaque
            if ln.prg.spec.vars:  # symbolic sizes: this call's values (variables not in the inputs keep theirs)
                et = ln.prg(*args, vals=ln.values(var_vals), wait=traced)
            else: et = ln.prg(*args, wait=traced)
            if traced:
                from fusegrad.viz.recorder import record_item
                record_item(ln.item, et or 0.0, ln.prg.spec.display_name, ln.prg.spec.ops, ln.prg.spec.mem)
            if (done := ln.ran(per_call)) is not None: ln.done = done
            GlobalCounters.kernel_count += 1
            GlobalCounters.global_ops += ln.prg.spec.ops
            GlobalCounters.global_mem += ln.prg.spec.mem
        return outs


def _batch(run: list[tuple[_Launch, int, tuple[int, ...]]]) -> _Batch:
    """A _Batch of launches with their C entries (address, trailing arguments)."""
    calls = cpu_graph.CallList()
    bufs: list[tuple[int, int]] = []
    var_words: list[tuple[int, UOp, int]] = []
    book: list[tuple[int, _Launch]] = []
    for ln, fn, trailing in run:
        # a variable that follows no argument keeps its captured value (_Launch.values): in the template
        fixed = ln.values(None)
        at = calls.add(fn, [a or 0 for a in ln.args] + list(fixed) + list(trailing))
        first = at + cpu_graph.HEADER
        bufs += [(first + k, i) for k, i in ln.slots]
        var_words += [(first + len(ln.args) + j, ln.follow[v], fixed[j]) for j, v in enumerate(ln.prg.spec.vars)
                      if v in ln.follow]
        if ln.relayout is not None or ln.item.inplace or ln.bump is not None: book.append((at, ln))
    lns = [r[0] for r in run]
    return _Batch(calls.build(), lns, bufs, var_words, book, sum(ln.prg.spec.ops for ln in lns),
                  sum(ln.prg.spec.mem for ln in lns))


def _run_batch(b: _Batch, per_call: list[Buffer], var_vals: dict[Any, int] | None) -> None:
    """One replay of a _Batch: the per-call words (the fresh outputs are allocated first: nothing raises after the
    bookkeeping), the launches' bookkeeping in their order, one call into C; a relayout counts as done after it."""
    words = b.calls.fresh()
    for w, i in b.bufs: words[w] = per_call[i].opaque
    if b.vars and var_vals:
        for w, a, d in b.vars: words[w] = var_vals.get(a, d)
    n, ops, mem = len(b.launches), b.ops, b.mem
    copied: list[tuple[_Launch, storage.Reads]] = []
    for at, ln in b.book:
        if ln.skipped():
            words[at] = 1
            n, ops, mem = n - 1, ops - ln.prg.spec.ops, mem - ln.prg.spec.mem
        elif (done := ln.ran(per_call)) is not None: copied.append((ln, done))
    b.calls.run(words)
    for ln, done in copied: ln.done = done
    GlobalCounters.kernel_count += n
    GlobalCounters.global_ops += ops
    GlobalCounters.global_mem += mem


def _follow(items: list[ScheduleItem], arg_vals: dict[Any, int]) -> dict[UOp, UOp]:
    """Which kernel variables take an argument's value on replay: a variable of the arguments (or an alias the
    scheduler made for it, variables.py) whose captured value was the argument's. One the function bound to another
    value itself (`x[:v.bind(3)]` inside, or realized inside with another value) keeps its captured value, like any
    Python value baked in at capture."""
    out: dict[UOp, UOp] = {}
    for it in items:
        for v, x in it.var_vals.items():
            base = it.aliases.get(v, v)
            if base in arg_vals and arg_vals[base] == x: out[v] = base
    return out


def _values(follow: dict[UOp, UOp], var_vals: dict[Any, int] | None) -> dict[UOp, int]:
    """This replay's values of the kernel variables that follow an argument."""
    if not var_vals: return {}
    return {v: var_vals[a] for v, a in follow.items() if a in var_vals}


class TinyJit(Generic[ReturnType]):
    """Decorator: `@TinyJit def step(x): ...`. Call 1 runs normally, call 2 captures, calls 3+ replay.

    >>> from fusegrad import Tensor
    >>> f = TinyJit(lambda x: (x * 2).realize())
    >>> [f(Tensor([1.0, 2.0])).tolist() for _ in range(3)][-1]
    [2.0, 4.0]
    """

    def __init__(self, fxn: Callable[..., ReturnType] | None = None, *, prune: bool = False,
                 verify: int | None = None):
        self.fxn, self.prune, self.verify = fxn, prune, verify
        self.reset()
        self._per_instance: "weakref.WeakKeyDictionary[Any, TinyJit]" = weakref.WeakKeyDictionary()
        if fxn is not None: functools.update_wrapper(self, fxn)  # type: ignore[arg-type]

    def reset(self) -> None:
        """Forget the capture: the next call runs normally again."""
        self.cnt = 0
        self.verified = 0   # replays checked against an eager call so far (verify=N)
        self.captured: CapturedJit | None = None
        self._state: list[Any] = []   # weak references to the tensors the captured call writes in place
        self.expected: tuple | None = None
        self.expected_others: Any = None

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None: return self
        # one capture per instance: two models sharing a method must not share kernels
        jit = self._per_instance.get(obj)
        if jit is None:
            jit = self._per_instance[obj] = TinyJit(functools.partial(self.fxn, obj), prune=self.prune,  # type: ignore
                                                    verify=self.verify)
        return jit

    def _check(self, tensors: list[Any], others: list[Any]) -> dict[Any, int]:
        """Check the inputs against the capture; returns the values of the variables bound in their shapes."""
        var_vals: dict[Any, int] = {}
        sig = tuple(_signature(t, var_vals) for t in tensors)
        if self.expected is not None and sig != self.expected:
            raise JitError(f"TinyJit inputs changed since capture: expected {self.expected}, got {sig} "
                           "(shapes, dtypes and devices must stay the same; call .reset() to recapture)")
        T = storage.tensor_class
        frozen = (_frozen(others, var_vals), ("training", bool(T.training)), ("no_grad", bool(T.no_grad)))
        if self.expected_others is not None and frozen != self.expected_others:
            raise JitError(f"TinyJit non-Tensor arguments or the mode (Tensor.training, Tensor.no_grad) changed since "
                           f"capture ({self.expected_others} -> {frozen}); they are baked into the captured kernels. "
                           "Pass values as Tensors, or call .reset() to capture again")
        self.expected, self.expected_others = sig, frozen
        return var_vals

    def _prepare_inputs(self, tensors: list[Any]) -> list[Buffer]:
        """The buffer each input tensor's data is in. An input that is not a whole buffer (a view, a lazy value) is
        copied into one; the caller's tensor stays what it was (a view stays a view of its base)."""
        if (multi := [t for t in tensors if isinstance(t.device, tuple)]):
            raise JitError(f"TinyJit inputs on several devices ({multi[0].device}) are not supported yet: pass the "
                           "one-device tensor and shard it inside the function, or run the step without TinyJit")
        storage.tensor_class.realize(*tensors) if tensors else None
        whole = [t if is_contiguous_buffer(t.uop) else t.contiguous() for t in tensors]
        storage.tensor_class.realize(*whole) if whole else None
        self._whole = whole
        bufs = [buffers[t.uop.base] for t in whole]
        if len({id(b) for b in bufs}) != len(bufs):
            raise JitError("the same buffer is passed to TinyJit twice; pass distinct tensors (e.g. x.clone())")
        return bufs

    def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
        assert self.fxn is not None, "TinyJit needs a function"
        if not JIT or REFERENCE: return self.fxn(*args, **kwargs)   # (reference mode: no capture either)
        if capturing: raise JitError("nested TinyJit: a jitted function can't call another one while capturing")
        tensors, others = _collect(args, kwargs)
        var_vals = self._check(tensors, others)
        if self.cnt == 0:
            self.cnt = 1
            return self.fxn(*args, **kwargs)
        if self.cnt == 1:
            _realize_pending(collect=True)   # writes still pending from before (the first call's, the caller's)
            in_bufs = self._prepare_inputs(tensors)
            copies = {id(t): w for t, w in zip(tensors, self._whole) if w is not t}
            items: list[ScheduleItem] = []
            # (held while capturing, so no tensor made during the call can take one's id)
            before = list(storage.live_tensors) if (self.verify or JIT_VERIFY.value) else []
            before_ids = {id(t) for t in before}
            capturing.append(items)
            storage.derived_off += 1
            try:
                # an input that is a view (or lazy) is passed as its copy in a buffer of its own, the buffer that
                # each replay fills with that call's input
                ret = self.fxn(*_swap(args, copies), **_swap(kwargs, copies))
                if any(id(r()) in {id(w) for w in copies.values()} for r in capturing.assigns[-1]):
                    raise JitError("the function writes to an input that is a view of another tensor (or not yet "
                                   "computed): TinyJit passes it as a copy, so the write would be lost. Pass a "
                                   "realized, whole tensor (.contiguous().realize())")
                out_tensors = _flatten_ret(ret)
                if (multi := [t for t in out_tensors if isinstance(t.device, tuple)]):
                    raise JitError(f"TinyJit outputs on several devices ({multi[0].device}) are not supported yet: "
                                   "return a one-device tensor (e.g. .to(device)), or run the step without TinyJit")
                # writes the function left pending (x += y, BatchNorm's running stats) are part of what it does
                # state: tensors that lived before the call (one the function makes and writes is an output)
                self._state = [r for r in capturing.assigns[-1] if id(r()) in before_ids]
                written = [t for r in capturing.assigns[-1] if (t := r()) is not None]
                if out_tensors or written: storage.tensor_class.realize(*out_tensors, *written)
                for t in out_tensors:  # outputs must own plain buffers (a view of an input is copied)
                    if not is_contiguous_buffer(t.uop): t.uop = t.contiguous().realize().uop
            finally:
                relayouts = capturing.relayouts[-1]
                capturing.pop()
                storage.derived_off -= 1
            outs = [buffers[t.uop.base] for t in out_tensors]
            written_in_place = {id(it.bufs[0]) for it in items if it.inplace}
            fresh = [b for b in outs if id(b) not in written_in_place and id(b) not in {id(x) for x in in_bufs}]
            self.captured = CapturedJit(items, in_bufs, _dedup_bufs(fresh), ret, relayouts, var_vals)
            self._ret_map = [(t, buffers[t.uop.base]) for t in out_tensors]
            # a returned input is returned as this call's input, not as the tensor passed at capture
            self._ret_input = {id(t): i for t in out_tensors for i, (x, w) in enumerate(zip(tensors, self._whole))
                               if x is t or w is t}
            self.cnt = 2
            if DEBUG >= 1: print(f"TinyJit captured {len(items)} kernels with {len(in_bufs)} inputs")
            return ret
        assert self.captured is not None
        _realize_pending()   # a replay reads memory as it is now: a pending `w += 1` on a tensor it reads runs first
        in_bufs = self._prepare_inputs(tensors)
        # lazy tensors built before this call that read memory the replay writes keep the value they were built with
        # (as the eager call's realize keeps it: views.py preserve_old_values)
        realize_readers(self.captured.written_memory(in_bufs))
        if self.verified < (self.verify if self.verify is not None else JIT_VERIFY.value):
            self.verified += 1
            return self._verified_replay(args, kwargs, tensors, in_bufs, var_vals)
        outs = self.captured.replay(in_bufs, var_vals)
        self.cnt += 1
        return self._rebuild(outs, var_vals, tensors)

    def _verified_replay(self, args: tuple, kwargs: dict, tensors: list[Any], in_bufs: list[Buffer],
                         var_vals: dict[Any, int]) -> Any:
        """Replay, then put back the memory the replay wrote and run the function eagerly on the same inputs and
        state: its outputs and the state it writes must agree with the replay's (NaN where NaN, float32 rounding
        aside), or JitError names the first that differs. The eager call's results are the ones kept."""
        assert self.captured is not None
        import numpy as np
        state = [t for r in self._state if (t := r()) is not None and is_contiguous_buffer(t.uop)]
        mems = self.captured.written_memory(in_bufs) | {storage.memory_of(buffers[t.uop.base]) for t in state}
        written = {storage.memory_of(b): b for b in [*in_bufs, *(it.bufs[0] for it in self.captured.items)]
                   if storage.memory_of(b) in mems}
        written.update({storage.memory_of(b): b for t in state if (b := buffers[t.uop.base]) is not None})
        before = {m: b.as_bytes() for m, b in written.items()}
        replayed = self._rebuild(self.captured.replay(in_bufs, var_vals), var_vals, tensors)
        got = [t.numpy() for t in _flatten_ret(replayed)] + [t.numpy() for t in state]
        for m, b in written.items():   # back to the memory as it was before the call
            b.copyin(before[m])
            storage.written(b)
        self.cnt += 1
        with not_capturing():
            ret = self.fxn(*args, **kwargs)
            outs = _flatten_ret(ret)
            storage.tensor_class.realize(*outs, *state) if outs or state else None
        want = [t.numpy() for t in outs] + [t.numpy() for t in state]
        names = [f"output {i}" for i in range(len(outs))] + \
                [f"state tensor {i} {tuple(t.shape)} written in place" for i, t in enumerate(state)]
        if len(got) != len(want):
            raise JitError(f"TinyJit verify: the replay returned {len(got)} values, the eager call {len(want)}")
        for name, a, b in zip(names, got, want):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise JitError(f"TinyJit verify (replay {self.verified}): {name} is {a.dtype}{a.shape} replayed but "
                               f"{b.dtype}{b.shape} eagerly")
            exact = not np.issubdtype(a.dtype, np.floating)
            ok = np.array_equal(a, b) if exact else np.allclose(a.astype(np.float64), b.astype(np.float64),
                                                                  rtol=1e-4, atol=1e-5, equal_nan=True)
            if not ok:
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
                at = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.where(np.isnan(diff), np.inf, diff))),
                                                             a.shape)) if a.size else ()
                raise JitError(f"TinyJit verify (replay {self.verified}): {name} differs from the eager call: "
                               f"replayed {a[at] if a.size else a} vs eager {b[at] if b.size else b} at index {at}. "
                               "The capture reads something that changed since (see docs/tensor/mutation.md, "
                               "TinyJit's capture rules), or the function's behaviour depends on Python state")
        return ret

    def _rebuild(self, outs: list[Buffer], var_vals: dict[Any, int], tensors: list[Any]) -> Any:
        """The captured return structure with each fresh output tensor pointing at this call's buffer."""
        assert self.captured is not None
        fresh = {id(b): outs[i] for i, b in enumerate(self.captured.outputs)}
        mapping: dict[int, Tensor] = {}
        for t, b in self._ret_map:
            nb = fresh.get(id(b))
            if id(t) in self._ret_input: mapping[id(t)] = tensors[self._ret_input[id(t)]]
            elif nb is None: mapping[id(t)] = t
            else:
                mapping[id(t)] = storage.tensor_class._wrap(buffer_view(buffer_uop(nb), _rebind(t.shape, var_vals)))
        return _map_ret(self.captured.ret_struct, mapping)


def _realize_pending(collect: bool = False) -> None:
    """Run the in-place writes still pending on any tensor (`w += 1` is lazy), so the kernels that follow read the
    memory they would read eagerly. `collect` (before a capture): garbage is collected first, so the pending write of
    a tensor nothing reaches any more (kept alive by a reference cycle: one left behind by an earlier realize that
    raised) is not run here, where its error would be blamed on this function."""
    if not assign_owner: return
    if collect: gc.collect()
    pending = [t for r in list(assign_owner.values()) if (t := r()) is not None and t.uop.op is Ops.ASSIGN]
    if pending: storage.tensor_class.realize(*pending)


def _rebind(shape: tuple[Any, ...], var_vals: dict[Any, int]) -> tuple[Any, ...]:
    """A captured output shape with its variables bound to this call's values."""
    if all_static(shape) or not var_vals: return shape
    def rebind(s: Any) -> Any:
        if not isinstance(s, UOp): return s
        binds = {n: n.src[0].bind(var_vals[n.src[0]]) for n in s.toposort()
                 if n.op is Ops.BIND and n.src[0] in var_vals}
        return substitute(s, binds)
    return tuple(rebind(s) for s in shape)


def _dedup_bufs(bufs: list[Buffer]) -> list[Buffer]:
    seen: set[int] = set()
    out = []
    for b in bufs:
        if id(b) not in seen:
            seen.add(id(b))
            out.append(b)
    return out


def _flatten_ret(ret: Any) -> list[Any]:
    if ret is None: return []
    if isinstance(ret, storage.tensor_class): return [ret]
    if isinstance(ret, (list, tuple)): return [t for r in ret for t in _flatten_ret(r)]
    if isinstance(ret, dict): return [t for k in sorted(ret) for t in _flatten_ret(ret[k])]
    if isinstance(ret, (int, float, bool, str)):
        raise JitError(f"TinyJit functions must return Tensors (or lists/dicts of them), got {type(ret).__name__}: "
                       "a Python value would be frozen at capture")
    raise JitError(f"TinyJit can't return {type(ret).__name__}")


def _map_ret(ret: Any, mapping: dict[int, Any]) -> Any:
    if ret is None: return None
    if isinstance(ret, storage.tensor_class): return mapping[id(ret)]
    if isinstance(ret, tuple): return tuple(_map_ret(r, mapping) for r in ret)
    if isinstance(ret, list): return [_map_ret(r, mapping) for r in ret]
    if isinstance(ret, dict): return {k: _map_ret(v, mapping) for k, v in ret.items()}
    return ret
