"""The Tensor frontend: a PyTorch-style lazy tensor. Every op builds tensor-level IR nodes; nothing runs until
`realize()`, `numpy()`, `item()` or `tolist()`, which hand the graph to the scheduler (schedule/) and the engine (engine/).
"""
from __future__ import annotations

import contextlib
import math
import pathlib
import struct
import threading
import weakref
from typing import Any, Callable, ClassVar, Sequence

from fusegrad import autograd
from fusegrad.device import Buffer, Device
from fusegrad.dtype import ConstType, DType, DTypeLike, dtypes, least_upper_dtype, least_upper_float, \
    strong_dtype, sum_acc_dtype, to_dtype, weak_dtype
from fusegrad.helpers import PROFILE, TRAINING, VIZ, argfix, dedup, make_tuple, prod
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp, ssimplify, sym_infer
from fusegrad.ir.shape import all_static, sle, smax, sprod, ssub, sym_eq
from fusegrad.mixin.math import MathMixin
from fusegrad.mixin.movement import MovementMixin
from fusegrad.mixin.nn import NNMixin
from fusegrad.mixin.reduce import ReduceMixin

# the buffer registry and result cache live below the frontend (storage.py); re-exported here for older imports
from fusegrad import storage  # noqa: E402
from fusegrad.storage import buffer_uop, buffer_view, buffers, lazy_of, leaf_of, realized  # noqa: E402,F401
from fusegrad.views import _VIEW_OPS, _assign_owner, _mark_view, _preserve_old_values, _refresh_views, \
    _substitute_outside_assigns, _view_bases, _view_chain, _write_through  # noqa: E402,F401


def _with_history(u: UOp) -> UOp:
    """`u` with realized nodes replaced by the lazy graphs that computed them, so gradients reach the leaves."""
    from fusegrad.ir.pattern import substitute
    for _ in range(10000):
        mapping = {n: lazy_of[n] for n in u.toposort() if n in lazy_of}
        if not mapping: return u
        for n in mapping: storage.check_history(n)
        u = substitute(u, mapping)
    raise RuntimeError("autograd history too deep")


# every live tensor: backward() fills .grad for those in the graph that require a gradient
_all_tensors: "weakref.WeakSet[Tensor]" = weakref.WeakSet()
_unique_ids = iter(range(1, 1 << 62))


def _single_device(device: Any, what: str) -> Any:
    """`device` itself; a tuple/list of devices (tinygrad's sharded tensors) raises NotImplementedError."""
    if isinstance(device, (tuple, list)):
        raise NotImplementedError(f"{what}(): a tuple of devices {tuple(device)}: fusegrad has no multi-device "
                                  "(sharded) tensors; pass one device")
    return device


def _canonical_device(device: Any, what: str = "Tensor") -> str:
    return Device.canonicalize(_single_device(device, what))


def _half_memoryview() -> bool:
    """Whether memoryview.cast accepts float16 ('e'): Python 3.12 and later."""
    try:
        memoryview(bytes(2)).cast("e")
        return True
    except ValueError:
        return False


_HALF_MEMORYVIEW = _half_memoryview()


def _make_unique(u: UOp) -> UOp:
    """Nodes are hash-consed, so two Tensor.zeros(3) share a node (and would share a gradient). A tensor that asks for
    its own gradient gets a node of its own: a CONTIGUOUS with a unique tag (it is materialized on first use)."""
    if u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER): return u
    if u.op is Ops.CONTIGUOUS and isinstance(u.arg, int): return u  # already unique
    return UOp(Ops.CONTIGUOUS, u.dtype, (u,), next(_unique_ids))


def _flatten_list(data: Any) -> tuple[list[Any], tuple[int, ...]]:
    """Nested Python lists -> (flat values, shape); ragged lists raise ValueError."""
    if not isinstance(data, (list, tuple)): return [data], ()
    if len(data) == 0: return [], (0,)
    parts = [_flatten_list(d) for d in data]
    shape = parts[0][1]
    if any(p[1] != shape for p in parts):
        raise ValueError(f"expected a rectangular nested list, got sub-shapes {sorted({p[1] for p in parts})}")
    return [v for p in parts for v in p[0]], (len(data),) + shape


def _int_width(values: list[Any], hi: int = 2**63) -> DType | None:
    """int64 for Python ints that don't fit the default int (they wrapped: [2**40] became [0]), None otherwise. Ints
    that fit no 64-bit integer raise OverflowError (torch refuses them too) instead of wrapping ([2**64 + 5] -> [5])."""
    big = [v for v in values if v.__class__ is int and not -2**31 <= v < 2**31]
    if not big: return None
    for v in big:
        if not -2**63 <= v < hi: raise OverflowError(f"Overflow when unpacking long long: {v} doesn't fit in 64 bits")
    return dtypes.int64 if all(v.__class__ in (int, bool) for v in values) else None


def _shift(a: "Tensor", b: "Tensor", op: Ops) -> "Tensor":
    """a << b, a >> b with one rule on every backend (C, OpenCL, LLVM and WGSL each do something else, or nothing
    defined, for amounts outside [0, bits)): such a left shift gives 0, such a right shift 0, or -1 for negative signed
    a (all bits shifted out, as torch CPU gives). Only amounts in range reach the device."""
    bits = a.dtype.itemsize * 8
    signed = not dtypes.is_unsigned(a.dtype)
    in_range = (b < bits) if dtypes.is_unsigned(b.dtype) else (b >= 0) & (b < bits)
    if op is Ops.SHR and signed:   # shifting by bits - 1 fills with the sign bit: 0 or -1
        return a._alu(op, in_range.where(b, bits - 1))
    return in_range.where(a._alu(op, in_range.where(b, 0)), 0)


def _float_to_int(x: "Tensor", dt: DType) -> "Tensor":
    """float -> int with one rule on every backend (torch CPU's on x86; C leaves out-of-range conversions undefined):
    truncate toward zero; NaN, +-inf and values outside int32 / int64 give that type's minimum; narrower types go
    through int32 and uint64 through int64, then keep the low bits; uint32 keeps [-2**31, 2**32) modulo 2**32 and
    gives 0 for anything else (docs/tensor/dtypes.md)."""
    if x.dtype.itemsize < 4: x = x.cast(dtypes.float32)   # the bounds +-2**31 are inf in half
    if dt.scalar() == dtypes.uint32:   # without int64 (WebGPU has none): [0, 2**32) direct, [-2**31, 0) through int32
        pos = (x >= 0) & (x < 2**32)
        direct = pos.where(x, 0)._apply(lambda u: build.cast(u, dt))
        neg = ((x >= -2**31) & (x < 0)).where(x, 0)._apply(lambda u: build.cast(u, dtypes.int32))
        return pos.where(direct, neg._apply(lambda u: build.cast(u, dt)))
    wide = dtypes.int64 if dt.itemsize == 8 else dtypes.int32
    lo = -2 ** (wide.itemsize * 8 - 1)
    ok = (x >= lo) & (x < -lo)                             # False for NaN
    safe = ok.where(x, lo)._apply(lambda u: build.cast(u, wide))
    return safe if wide == dt else safe._apply(lambda u: build.cast(u, dt))


def _pack(values: list[Any], dtype: DType) -> bytes:
    if dtype == dtypes.bfloat16:
        from fusegrad.dtype import float_to_bf16_bits
        return struct.pack(f"{len(values)}H", *(float_to_bf16_bits(float(v)) for v in values))
    assert dtype.fmt is not None
    return struct.pack(f"{len(values)}{dtype.fmt}", *(dtypes.as_const(v, dtype) for v in values))


def _unpack(data: bytes, dtype: DType) -> list[Any]:
    if dtype == dtypes.bfloat16:
        from fusegrad.dtype import bf16_to_float
        return [bf16_to_float(v) for v in struct.unpack(f"{len(data) // 2}H", data)]
    assert dtype.fmt is not None
    return list(struct.unpack(f"{len(data) // dtype.itemsize}{dtype.fmt}", data))


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + s for s in shapes]
    out = []
    for i, dims in enumerate(zip(*padded)):
        non1 = {d for d in dims if d != 1}
        if len(non1) > 1:
            a, b = [d for d in dims if d != 1][:2]
            raise RuntimeError(f"The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton "
                               f"dimension {i}: shapes {' and '.join(str(s) for s in shapes)} can't broadcast")
        out.append(non1.pop() if non1 else 1)
    return tuple(out)


class _TensorMeta(type):
    """`Tensor.training` is the TRAINING flag seen as a bool: one value, per thread (TRAINING is a per-thread
    ContextVar), so `with Tensor.train():` in one thread doesn't turn on dropout in another."""
    @property
    def training(cls) -> bool: return bool(TRAINING.value)

    @training.setter
    def training(cls, v: bool) -> None: TRAINING.value = int(bool(v))


class Tensor(MathMixin, ReduceMixin, MovementMixin, NNMixin, metaclass=_TensorMeta):
    """A lazy n-dimensional array with autograd.

    >>> (Tensor([1.0, 2.0]) * 3).tolist()
    [3.0, 6.0]
    """
    __slots__ = ("uop", "grad", "requires_grad", "_derived", "_used", "is_param", "_weak", "_no_graph", "_view", "_views",
                 "__weakref__")
    no_grad: ClassVar[bool] = False
    _seed: ClassVar[int] = 0
    _rng_states: ClassVar[dict[str, "Tensor"]] = {}

    def __init__(self, data: Any, device: str | None = None, dtype: DTypeLike | None = None,
                 requires_grad: bool | None = None):
        dt = to_dtype(dtype) if dtype is not None else None
        dev = _canonical_device(device)
        if isinstance(data, UOp) and data.shape is None and dtypes.is_int(data.dtype) and data.op is not Ops.CONST:
            self.uop = build.const(data, dt or dtypes.default_int, dev)   # a symbolic int: a 0-d tensor of its value
        elif isinstance(data, UOp):
            self.uop = data
        elif data is None or isinstance(data, (int, float, bool)):
            d = dt or _int_width([data]) or dtypes.from_py(0.0 if data is None else data)
            self.uop = build.const(0.0 if data is None else data, d, dev)
        elif isinstance(data, (bytes, pathlib.PurePath)):
            # a path: the file's bytes, read now (tinygrad maps the file as a DISK device; fusegrad has none)
            raw = pathlib.Path(data).read_bytes() if isinstance(data, pathlib.PurePath) else data
            self.uop = self._from_bytes(raw, dt or dtypes.uint8, (len(raw) // (dt or dtypes.uint8).itemsize,), dev)
        elif isinstance(data, (list, tuple)):
            flat, shape = _flatten_list(data)
            d = dt or _int_width(flat) or (dtypes.from_py(flat) if flat else dtypes.default_float)
            if dt is not None and dtypes.is_int(dt): _int_width(flat, 2**64 if dt == dtypes.uint64 else 2**63)
            for v in flat:
                if not isinstance(v, (int, float, bool)) and not hasattr(v, "item"):
                    raise TypeError(f"can't make a Tensor from a list containing {type(v).__name__}")
            self.uop = self._from_bytes(_pack(flat, d), d, shape, dev)
        elif type(data).__module__ == "numpy" and hasattr(data, "shape"):
            import numpy as np
            from fusegrad.dtype import from_np_dtype, to_np_dtype
            arr = np.asarray(data)
            d = dt or from_np_dtype(arr.dtype)
            arr = np.ascontiguousarray(arr.astype(to_np_dtype(d)) if d != dtypes.bfloat16 else arr).reshape(arr.shape)
            self.uop = self._from_bytes(arr.tobytes(), d, arr.shape, dev)
        else:
            raise TypeError(f"can't create a Tensor from {type(data).__name__}")
        if dt is not None and self.uop.dtype != dt: self.uop = build.cast(self.uop, dt)
        self.grad: Tensor | None = None
        self.requires_grad: bool | None = requires_grad
        self._derived = False  # True when computed from tensors that require grad (has autograd history)
        self._used = False     # True once another tensor was computed from this one (its node is in that graph)
        self.is_param = False
        # a 0-d tensor made from a bare Python scalar (no dtype given) is weakly typed in promotion, like the scalar
        self._no_graph = False
        self._view: tuple[Tensor, UOp] | None = None   # (base tensor, its node this view's movement ops start from)
        self._views: weakref.WeakValueDictionary[int, Tensor] | None = None   # live views (they see its writes)
        self._weak = dt is None and isinstance(data, (int, float)) and not isinstance(data, bool)
        if requires_grad: self.uop = _make_unique(self.uop)
        _all_tensors.add(self)

    @staticmethod
    def _from_bytes(data: bytes, dtype: DType, shape: tuple[int, ...], device: str) -> UOp:
        n = prod(shape)
        if len(data) != n * dtype.itemsize: raise ValueError(f"{len(data)} bytes don't make {n} elements of {dtype}")
        buf = Buffer(device, n, dtype).copyin(data)
        return build.reshape(buffer_uop(buf), shape)

    @staticmethod
    def _wrap(u: UOp, *parents: "Tensor") -> "Tensor":
        t = Tensor.__new__(Tensor)
        if Tensor.no_grad and not (u.op is Ops.DETACH and u.arg is None) and any(p.requires_grad for p in parents):
            # computed under no_grad from tensors that need a gradient: a constant for autograd (torch too), so a
            # later graph that uses it alongside those tensors sends no gradient back through it
            u = UOp(Ops.DETACH, u.dtype, (u,))
        t.uop, t.grad, t.is_param = u, None, False
        t.requires_grad = True if not Tensor.no_grad and any(p.requires_grad for p in parents) else None
        t._derived, t._used, t._weak = bool(t.requires_grad), False, False
        # computed under Tensor.no_grad from tensors that need a gradient (or from such a tensor): no autograd graph
        t._no_graph = (Tensor.no_grad and any(p.requires_grad for p in parents)) or \
            (not t.requires_grad and any(p._no_graph for p in parents))
        for p in parents: p._used = True
        t._view, t._views = None, None
        # a movement op (or a same-size bitcast) of one tensor is a view of it: writes through it reach the base, and
        # it sees the base's writes (PAD is not a view: padding makes new elements)
        if len(parents) == 1:
            mv = u.src[0] if u.op is Ops.DETACH and u.src else u
            if mv.op in _VIEW_OPS and mv.src[0] is parents[0].uop: _mark_view(t, parents[0])
        _all_tensors.add(t)
        return t

    # ----- properties -----
    @property
    def shape(self) -> tuple[int, ...]:
        s = self.uop.shape
        assert s is not None
        return s

    @property
    def dtype(self) -> DType: return self.uop.dtype

    @property
    def device(self) -> str:
        d = self.uop.device
        assert d is not None
        return d

    @property
    def ndim(self) -> int: return len(self.shape)

    def numel(self) -> Any: return sprod(self.shape)

    @property
    def max_shape(self) -> tuple[int, ...]:
        """The shape with each symbolic size at its largest value (the shape itself when it is static)."""
        return tuple(smax(s) for s in self.shape)

    def max_numel(self) -> int: return prod(self.max_shape)

    def _concrete_shape(self) -> tuple[int, ...]:
        """The shape with every bound variable replaced by its value (ValueError for an unbound one)."""
        return tuple(sym_infer(s) for s in self.shape)
    def element_size(self) -> int: return self.dtype.itemsize
    def nbytes(self) -> int: return self.numel() * self.element_size()
    def is_floating_point(self) -> bool: return dtypes.is_float(self.dtype)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self.shape[self._axis(dim)]

    def __len__(self) -> int:
        if not self.shape: raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a Tensor is ambiguous; use .item(), .any() or .all()")

    def __hash__(self) -> int: return id(self)

    def __repr__(self) -> str:
        return f"<Tensor {self.uop.op.name} {self.shape} {self.dtype} on {self.device} with grad " \
               f"{self.grad.uop.op.name if self.grad is not None else None}>"

    def is_param_(self, is_param: bool = True) -> "Tensor":
        """Mark as a parameter (what optimizers update); like `requires_grad_(True)` it only sets flags on this tensor.

        >>> w = Tensor.zeros(2).is_param_()
        >>> (w.is_param, w.requires_grad)
        (True, True)
        """
        self.is_param = is_param
        if is_param and self.requires_grad is None: self.requires_grad_(True)
        return self

    def to_(self, device: str | None) -> "Tensor":
        """Move this tensor to `device` in place."""
        _single_device(device, "to_")
        self.uop = self.to(device).uop
        return self

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Set the flag on this tensor; graphs already built from it stay connected to it.

        Identical constants share one graph node, so a fresh leaf (say `Tensor.zeros(3)`) that asks for a gradient
        gets a node of its own. That happens only while no other tensor was computed from it: once it was used, the
        node stays, so an earlier `loss` still sends its gradient here (as the flag change does in tinygrad).

        >>> x = Tensor.zeros(3)
        >>> loss = (x * Tensor([1.0, 2.0, 3.0])).sum()
        >>> _ = x.requires_grad_()           # after x was used: only the flag changes
        >>> _ = loss.backward()
        >>> x.grad.tolist()
        [1.0, 2.0, 3.0]
        """
        if requires_grad and not self.requires_grad and not self._derived and not self._used:
            self.uop = _make_unique(self.uop)
        self.requires_grad = requires_grad
        return self

    # ----- realize and data access -----
    def schedule(self, *lst: "Tensor") -> list[Any]:
        """The kernels realize() would run, without running them."""
        from fusegrad.schedule import create_schedule
        return create_schedule([t.uop for t in (self,) + lst])[0]

    def schedule_linear(self, *lst: "Tensor") -> list[Any]:
        """The kernels (in run order) that realize() would run for this tensor and `lst`, without running them."""
        return self.schedule(*lst)

    def linear_with_vars(self, *lst: "Tensor") -> tuple[list[Any], dict[Any, int]]:
        """`(schedule_linear(*lst), {variable: bound value})` for the bound Variables the graphs use."""
        items = self.schedule(*lst)
        return items, {v: val for si in items for v, val in si.var_vals.items()}

    def realize(self, *lst: "Tensor", do_update_stats: bool = True) -> "Tensor":
        """Compute this tensor (and `lst`) now; later uses read the stored result. (`do_update_stats` is accepted
        for tinygrad compatibility; fusegrad always counts kernels.)"""
        Tensor._realize_all([self, *lst])
        return self

    @staticmethod
    def _realize_all(tensors: Sequence["Tensor"]) -> None:
        todo = [t for t in tensors if not _is_realized(t.uop)]
        if not todo: return
        if VIZ or PROFILE:  # fusegrad/viz records this realize as one context (schedule, kernels, timeline)
            from fusegrad.viz.recorder import realize_context
            with realize_context(len(todo)): return Tensor._realize_todo(todo, traced=True)
        Tensor._realize_todo(todo)

    @staticmethod
    def _realize_todo(todo: list["Tensor"], traced: bool = False) -> None:
        from fusegrad.engine.realize import run_schedule
        from fusegrad.schedule import create_schedule
        todo = _view_bases(todo)
        if not todo: return
        # tensors that read memory this realize overwrites keep the value they were built with (as in eager execution)
        readers: list[Tensor] = []
        snaps = _preserve_old_values(todo, readers)
        uops = dedup([t.uop for t in todo] + snaps)
        # (custom backward rules are stripped by the scheduler: schedule/cache.py)
        if traced:
            from fusegrad.viz.recorder import traced_schedule
            sched, results = traced_schedule(create_schedule, uops)
        else: sched, results = create_schedule(uops)
        run_schedule(sched)
        written = {id(si.bufs[0]): si.bufs[0] for si in sched if si.inplace}
        for b in written.values(): storage.written(b)   # cached results computed from the old contents are void
        written_now = {storage.memory_of(b) for b in written.values()}
        snap_ids = {id(u) for u in snaps}
        # an ASSIGN overwritten by a later one in the same schedule is done, but its value is gone
        superseded = {n.src[0].base for n in results if n.op is Ops.ASSIGN}
        for old, new in results.items():
            if old in superseded: storage.executed.add(old)
            else: storage.cache_result(old, new, None if id(old) in snap_ids else written_now)
            if old.op is Ops.CONTIGUOUS and (src := storage.relayout_source(old)) is not None and \
               storage.memory_of(storage.buffers[src[0]]) not in written_now:
                storage.relayout_put(old, new)   # a relayout of an unchanged buffer: reused until it is written
        for t in todo:
            old = t.uop
            new = results[old]
            if t._derived: storage.record_history(new, old)  # keep the history for backward()
            elif old.op is Ops.CONTIGUOUS and isinstance(old.arg, int): leaf_of.setdefault(new, old)
            t.uop = new
        for t in todo: _refresh_views(t, realized_now=True)
        # readers of a snapshot hold its buffer itself (a cached result lives only while some tensor holds it)
        if snaps:
            done = {s: results[s] for s in snaps}
            for t in readers:
                if not _is_contiguous_buffer(t.uop): t.uop = _substitute_outside_assigns(t.uop, done)
        # a tensor whose pending write ran as part of another graph now holds its buffer (the ASSIGN is done)
        for old, new in results.items():
            if old.op is Ops.ASSIGN and (ref := _assign_owner.pop(old, None)) is not None and \
               (t := ref()) is not None and t.uop is old:
                t.uop = new
                _refresh_views(t)

    def _buffer(self) -> Buffer:
        """The realized, contiguous buffer holding this tensor's data."""
        from fusegrad.engine.jit import JitError, capturing
        if capturing:
            raise JitError("reading tensor data (.item()/.numpy()/.tolist()) inside a TinyJit function: the value "
                           "would be frozen into the capture. Return the tensor instead and read it outside")
        self.realize()
        t = self if _is_contiguous_buffer(self.uop) else Tensor._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))
        t.realize()
        buf = buffers[t.uop.base]
        if all_static(self.shape): return buf
        # a symbolic shape lives in a prefix of a buffer allocated at its largest size
        n = prod(self._concrete_shape())
        if Buffer.supports_views(buf.device): return buf.view(n, buf.dtype)
        return Buffer(buf.device, n, buf.dtype).copyin(buf.as_bytes()[:n * buf.dtype.itemsize])

    def data(self) -> memoryview:
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

    def numpy(self) -> Any:
        """A NumPy copy of the data."""
        import numpy as np
        from fusegrad.dtype import to_np_dtype
        if self.dtype == dtypes.bfloat16: return self.float().numpy()
        out = np.empty(self._concrete_shape(), dtype=to_np_dtype(self.dtype))
        if out.size: self._buffer().copyout(memoryview(out.reshape(-1).view(np.uint8)))
        return out

    def tolist(self) -> Any:
        shape = self._concrete_shape()
        vals = _unpack(self._buffer().as_bytes(), self.dtype) if prod(shape) else []
        if dtypes.is_bool(self.dtype): vals = [bool(v) for v in vals]
        if not shape: return vals[0]

        def nest(flat: list[Any], shape: tuple[int, ...]) -> list[Any]:
            if len(shape) == 1: return flat
            step = prod(shape[1:])
            return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
        return nest(vals, shape)

    def item(self) -> ConstType:
        if prod(self._concrete_shape()) != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to a Python scalar")
        return self.reshape(()).tolist()

    def contiguous(self, **kwargs: Any) -> "Tensor":
        """A tensor whose data is materialized in row-major order (a realize point for the scheduler).
        Keyword arguments (tinygrad's kernel options) are accepted and ignored."""
        if _is_contiguous_buffer(self.uop): return self
        return Tensor._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)), self)

    def detach(self) -> "Tensor":
        """The same values with no autograd history. Like torch, it shares the memory: writes through it reach self."""
        t = Tensor._wrap(UOp(Ops.DETACH, self.dtype, (self.uop,)))
        _mark_view(t, self)
        return t

    def contiguous_backward(self) -> "Tensor":
        """The same values; its gradient is made contiguous (materialized) on the way back."""
        from fusegrad.mixin.nn import _custom_grad
        return _custom_grad(self.detach(), [self], lambda g, x: (g.contiguous(),), "contiguous_backward")

    def shard(self, devices: Any, axis: int | None = None) -> "Tensor":
        raise NotImplementedError("shard: fusegrad has no multi-device (sharded) tensors; use .to(device)")
    def shard_(self, devices: Any, axis: int | None = None) -> "Tensor":
        raise NotImplementedError("shard_: fusegrad has no multi-device (sharded) tensors; use .to_(device)")
    def shard_like(self, y: "Tensor") -> "Tensor":
        raise NotImplementedError("shard_like: fusegrad has no multi-device (sharded) tensors; use .to(y.device)")

    def replace(self, x: "Tensor") -> "Tensor":
        """Make this tensor compute what `x` computes (its graph node is swapped for x's); shapes must match."""
        if not isinstance(x, Tensor): raise TypeError(f"replace needs a Tensor, got {type(x).__name__}")
        if x.shape != self.shape: raise RuntimeError(f"replace: shape {x.shape} doesn't match {self.shape}")
        self.uop = x.uop
        return self

    def to(self, device: str | None) -> "Tensor":
        device = Device.canonicalize(_single_device(device, "to"))
        if device == self.device: return self
        return Tensor._wrap(UOp(Ops.COPY, self.dtype, (self.uop,), device), self)

    def clone(self, device: str | None = None) -> "Tensor":
        _single_device(device, "clone")
        # a clone is a new tensor with an identity of its own: two clones of equal constants (hash-consed to one node)
        # made trainable must not share a gradient
        return self.to(device) if device is not None and Device.canonicalize(device) != self.device \
            else Tensor._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), next(_unique_ids)), self)

    # ----- creation -----
    @staticmethod
    def _shape_arg(shape: tuple[Any, ...]) -> tuple[int, ...]:
        s = argfix(*shape)
        if not all(isinstance(x, int) or _is_sym_int(x) for x in s): raise TypeError(f"shape must be ints, got {s}")
        if any(x < 0 if isinstance(x, int) else x.vmin < 0 for x in s):
            raise RuntimeError(f"invalid shape {s}: dimension sizes must be non-negative")
        return tuple(s)

    @classmethod
    def empty(cls, *shape: Any, device: str | None = None, dtype: DTypeLike | None = None) -> "Tensor":
        s = cls._shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return Tensor(buffer_view(buffer_uop(Buffer(_canonical_device(device), smax(sprod(s)), dt)), s))

    @classmethod
    def full(cls, shape: tuple[int, ...] | int, fill_value: ConstType, dtype: DTypeLike | None = None,
             device: str | None = None, requires_grad: bool | None = None, buffer: bool = True) -> "Tensor":
        """A tensor of `shape` filled with `fill_value`. fusegrad keeps it a broadcast constant until it is used
        (no buffer is allocated either way); `buffer` is accepted for tinygrad compatibility."""
        s = cls._shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        return Tensor(build.const(fill_value, dt, _canonical_device(device), s), requires_grad=requires_grad)

    @classmethod
    def invalids(cls, *shape: Any, device: str | None = None, dtype: DTypeLike | None = None) -> "Tensor":
        """A tensor whose contents don't matter (tinygrad fills it with Invalid); here: uninitialized, like empty()."""
        return cls.empty(*shape, device=device, dtype=dtype)

    @staticmethod
    def const(b: ConstType, dtype: DType | None = None, device: str | None = None) -> "Tensor":
        """A 0-d constant tensor of `b` (dtype inferred from the Python value when not given)."""
        return Tensor(b, device=device, dtype=dtype)

    @staticmethod
    def from_blob(ptr: int, shape: tuple[int, ...], **kwargs: Any) -> "Tensor":
        """A tensor holding a copy of the memory at address `ptr` (an int or ctypes pointer), read as `shape` of
        `dtype` (default float32)."""
        import ctypes
        dt = to_dtype(kwargs.pop("dtype", None) or dtypes.default_float)
        s = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value if not isinstance(ptr, int) else ptr
        if not addr: raise ValueError("from_blob: null pointer")
        data = ctypes.string_at(addr, prod(s) * dt.itemsize)
        return Tensor(Tensor._from_bytes(data, dt, s, _canonical_device(kwargs.pop("device", None))), **kwargs)

    @staticmethod
    def from_url(url: str, gunzip: bool = False, **kwargs: Any) -> "Tensor":
        """The bytes at `url` as a uint8 tensor (gunzipped first if asked). Needs network access."""
        import gzip, urllib.error, urllib.request
        try:
            with urllib.request.urlopen(url, timeout=30) as r: data = r.read()
        except (urllib.error.URLError, OSError) as e:
            raise ConnectionError(f"from_url: can't fetch {url}: {e}") from e
        return Tensor(gzip.decompress(data) if gunzip else data, **kwargs)

    @classmethod
    def zeros(cls, *shape: Any, **kwargs: Any) -> "Tensor":
        return cls.full(cls._shape_arg(shape), 0.0, **{"dtype": dtypes.default_float, **kwargs})

    @classmethod
    def ones(cls, *shape: Any, **kwargs: Any) -> "Tensor":
        return cls.full(cls._shape_arg(shape), 1.0, **{"dtype": dtypes.default_float, **kwargs})

    def full_like(self, fill_value: ConstType, **kwargs: Any) -> "Tensor":
        return Tensor.full(self.shape, fill_value, **{"dtype": self.dtype, "device": self.device, **kwargs})

    def zeros_like(self, **kwargs: Any) -> "Tensor": return self.full_like(0, **kwargs)
    def ones_like(self, **kwargs: Any) -> "Tensor": return self.full_like(1, **kwargs)

    @classmethod
    def arange(cls, start: int | float, stop: int | float | None = None, step: int | float = 1,
               dtype: DTypeLike | None = None, device: str | None = None) -> "Tensor":
        """Values start, start+step, ... < stop (like torch.arange)."""
        if stop is None: start, stop = 0, start
        if step == 0: raise RuntimeError("arange step must be nonzero")
        if isinstance(start, UOp) or isinstance(stop, UOp):   # symbolic bounds: n = stop - start values
            if step != 1: raise NotImplementedError(f"arange with symbolic bounds needs step 1, got {step}")
            dev = _canonical_device(device)
            n = ssub(stop, start)
            iota = Tensor(UOp(Ops.IOTA, to_dtype(dtype) if dtype is not None else dtypes.default_int,
                              (UOp(Ops.DEVICE, arg=dev),), n))
            return iota + start if not (isinstance(start, int) and start == 0) else iota
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(math.ceil((stop - start) / step), 0)
        dev = _canonical_device(device)
        iota = UOp(Ops.IOTA, dt, (UOp(Ops.DEVICE, arg=dev),), n)
        return Tensor(iota) * step + start if (step, start) != (1, 0) else Tensor(iota)

    @classmethod
    def eye(cls, n: int, m: int | None = None, dtype: DTypeLike | None = None, device: str | None = None,
            requires_grad: bool | None = None) -> "Tensor":
        m = n if m is None else m
        if n < 0 or m < 0: raise ValueError(f"eye of negative size {(n, m)}")
        rows = Tensor.arange(n, device=device).reshape(n, 1)
        cols = Tensor.arange(m, device=device).reshape(1, m)
        out = (rows == cols).cast(to_dtype(dtype) if dtype is not None else dtypes.default_float)
        return Tensor(out.uop, requires_grad=requires_grad)

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        """Seed the counter-based RNG: the same seed gives the same numbers on every backend."""
        Tensor._seed = int(seed)
        for dev, st in list(Tensor._rng_states.items()):  # reset in place, so captured TinyJit kernels see it too
            st.assign(Tensor([0, Tensor._seed & 0xFFFFFFFF], dtype=dtypes.uint32, device=dev)).realize()

    @classmethod
    def _random_bits(cls, n: int, device: str) -> "Tensor":
        """n uint32 values hashed from (seed, counter). The counter lives in a small device buffer that each call
        advances in place, so a TinyJit replay keeps drawing new numbers."""
        st = Tensor._rng_states.get(device)
        if st is None:
            st = Tensor._rng_states[device] = Tensor([0, Tensor._seed & 0xFFFFFFFF], dtype=dtypes.uint32,
                                                     device=device).realize()
        first = Tensor(UOp(Ops.IOTA, dtypes.uint32, (UOp(Ops.DEVICE, arg=device),), 2)) == 0
        st.assign(st + first.where(n & 0xFFFFFFFF, 0).cast(dtypes.uint32))
        start = st[0:1] - (n & 0xFFFFFFFF)
        ctr = Tensor(UOp(Ops.IOTA, dtypes.uint32, (UOp(Ops.DEVICE, arg=device),), n)) + start.expand(n)
        x = _mix32(ctr ^ _mix32(st[1:2].expand(n) + 0x632BE5AB))
        return _mix32(x + 0x85157AF5)

    @classmethod
    def random_bits(cls, key: "Tensor", counter: "Tensor", num: int) -> "Tensor":
        """`num` pseudo-random uint32 values, a pure function of the uint32 tensors `key` and `counter` (their
        elements are folded into one seed each); no global RNG state is used or advanced."""
        def fold(t: "Tensor") -> "Tensor":
            t = t.cast(dtypes.uint32).flatten()
            h = Tensor([0x9E3779B9], dtype=dtypes.uint32, device=t.device)
            for i in range(t.shape[0]): h = _mix32(h ^ t[i:i + 1] + i)
            return h
        k, c = fold(key), fold(counter.to(key.device))
        ctr = Tensor(UOp(Ops.IOTA, dtypes.uint32, (UOp(Ops.DEVICE, arg=key.device),), num)) + c.expand(num)
        return _mix32(_mix32(ctr ^ k.expand(num)) + 0x85157AF5)

    @classmethod
    def rand(cls, *shape: Any, device: str | None = None, dtype: DTypeLike | None = None,
             requires_grad: bool | None = None, contiguous: bool = True) -> "Tensor":
        """Uniform samples in [0, 1). (`contiguous` is accepted for tinygrad compatibility: fusegrad always draws the
        samples at the call, into their own buffer.)"""
        s = cls._shape_arg(shape)
        dev = _canonical_device(device)
        bits = cls._random_bits(prod(s), dev)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        # as many random bits as the dtype's significand holds, so every sample is exact in it: 24 bits rounded to
        # half or bfloat16 gave exactly 1.0 for values just under 1 (rand's range is [0, 1))
        digits = {dtypes.float16: 11, dtypes.bfloat16: 8}.get(dt, 24)
        out = (bits >> (32 - digits)).cast(dtypes.float32) * (2.0 ** -digits)
        # realized now, together with the counter update: the draw happens at the call, like torch
        ret = out.reshape(s).cast(dt).contiguous()
        Tensor.realize(ret, Tensor._rng_states[dev])
        return Tensor(ret.uop, requires_grad=requires_grad)

    @classmethod
    def randn(cls, *shape: Any, device: str | None = None, dtype: DTypeLike | None = None,
              requires_grad: bool | None = None) -> "Tensor":
        """Standard normal samples (Box-Muller on two uniform draws)."""
        s = cls._shape_arg(shape)
        u = Tensor.rand(2, prod(s), device=device)
        r = (-2.0 * (1.0 - u[0:1]).log()).sqrt()
        z = r * (u[1:2] * (2 * math.pi)).cos()
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return Tensor(z.reshape(s).cast(dt).contiguous().uop, requires_grad=requires_grad)

    @classmethod
    def _rand_like(cls, t: "Tensor", **kwargs: Any) -> "Tensor":
        return cls.rand(*t.shape, **{"device": t.device, "dtype": t.dtype if dtypes.is_float(t.dtype) else None, **kwargs})

    def rand_like(self, **kwargs: Any) -> "Tensor": return Tensor._rand_like(self, **kwargs)

    def randn_like(self, dtype: DTypeLike | None = None, **kwargs: Any) -> "Tensor":
        return Tensor.randn(*self.shape, **{"device": self.device, "dtype": dtype or self.dtype, **kwargs})

    @classmethod
    def randint(cls, *shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32,
                device: str | None = None) -> "Tensor":
        """Uniform integers in [low, high)."""
        if high <= low: raise RuntimeError(f"randint: high ({high}) must be greater than low ({low})")
        u = Tensor.rand(*cls._shape_arg(shape), device=device)
        return ((u * (high - low)).floor() + low).cast(to_dtype(dtype))

    @classmethod
    def randperm(cls, n: int, device: str | None = None, dtype: DTypeLike = dtypes.int32) -> "Tensor":
        return Tensor.rand(n, device=device).argsort().cast(to_dtype(dtype))

    @classmethod
    def normal(cls, *shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> "Tensor":
        return (std * Tensor.randn(*shape, **kwargs) + mean).cast(to_dtype(kwargs.get("dtype") or dtypes.default_float))

    @classmethod
    def uniform(cls, *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None,
                **kwargs: Any) -> "Tensor":
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return ((high - low) * Tensor.rand(*shape, **kwargs) + low).cast(dt)

    @classmethod
    def scaled_uniform(cls, *shape: Any, **kwargs: Any) -> "Tensor":
        return Tensor.uniform(*shape, low=-1.0, high=1.0, **kwargs).mul(prod(cls._shape_arg(shape)) ** -0.5)

    @classmethod
    def glorot_uniform(cls, *shape: Any, **kwargs: Any) -> "Tensor":
        s = cls._shape_arg(shape)
        return Tensor.uniform(*s, low=-1.0, high=1.0, **kwargs).mul((6 / (s[0] + prod(s[1:]))) ** 0.5)

    @classmethod
    def kaiming_uniform(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> "Tensor":
        s = cls._shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(s[1:]))
        return Tensor.uniform(*s, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls, *shape: Any, a: float = 0.01, **kwargs: Any) -> "Tensor":
        s = cls._shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(s[1:]))
        return Tensor.normal(*s, mean=0.0, std=std, **kwargs)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> "Tensor":
        """Sample indices from the (unnormalized) probabilities in the last axis (1-d or 2-d)."""
        if self.ndim not in (1, 2): raise RuntimeError(f"multinomial expects a 1-d or 2-d tensor, got {self.shape}")
        if not replacement and num_samples > self.shape[-1]:
            raise RuntimeError(f"cannot take {num_samples} samples without replacement from {self.shape[-1]} categories")
        p = self.unsqueeze(0) if self.ndim == 1 else self
        if replacement:
            cdf = (p / p.sum(-1, keepdim=True)).cumsum(-1)                       # (B, C)
            u = Tensor.rand(p.shape[0], num_samples, 1, device=self.device)
            out = (u >= cdf.unsqueeze(1)).cast(dtypes.int32).sum(-1).minimum(p.shape[-1] - 1)
        else:  # Gumbel top-k: the k largest of log p + Gumbel noise are a sample without replacement
            g = -(-(Tensor.rand(*p.shape, device=self.device) + 1e-20).log() + 1e-20).log()
            out = (p.log() + g).topk(num_samples, -1)[1]
        return (out.squeeze(0) if self.ndim == 1 else out).cast(dtypes.int32)

    @classmethod
    def linspace(cls, start: float, stop: float, steps: int, dtype: DTypeLike | None = None,
                 device: str | None = None) -> "Tensor":
        if steps < 0: raise RuntimeError("number of steps must be non-negative")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if steps == 1: return Tensor([start], dtype=dt, device=device)
        i = Tensor.arange(steps, device=device, dtype=dtypes.float32)
        return (start + i * ((stop - start) / (steps - 1))).cast(dt)

    def empty_like(self, dtype: DTypeLike | None = None, device: str | None = None) -> "Tensor":
        return Tensor.empty(*self.shape, dtype=dtype or self.dtype, device=device or self.device)

    def const_like(self, b: ConstType, dtype: DType | None = None) -> "Tensor":
        return Tensor._wrap(self._const(b, dtype))

    # ----- internal helpers -----
    def _axis(self, axis: int, ndim: int | None = None) -> int:
        n = self.ndim if ndim is None else ndim
        lo, hi = (-max(n, 1), max(n, 1) - 1)
        if not isinstance(axis, int) or not lo <= axis <= hi:
            raise IndexError(f"Dimension out of range (expected to be in range of [{lo}, {hi}], but got {axis})")
        return axis + n if axis < 0 else axis

    def _const(self, val: ConstType, dtype: DType | None = None, shape: tuple[int, ...] | None = None) -> UOp:
        return build.const(val, dtype or self.dtype, self.device, self.shape if shape is None else shape)

    def _apply(self, fn: Callable[..., UOp], *others: "Tensor") -> "Tensor":
        return Tensor._wrap(fn(self.uop, *[o.uop for o in others]), self, *others)

    def _view_apply(self, fn: Callable[[UOp], UOp]) -> "Tensor":
        """A movement op: the result is a view of self, also when the op changes nothing (a reshape to the same
        shape, a full slice), as in torch."""
        t = self._apply(fn)
        if t._view is None: _mark_view(t, self)
        return t

    def _broadcasted(self, y: "Tensor | ConstType", reverse: bool = False,
                     match_dtype: bool = True) -> tuple["Tensor", "Tensor"]:
        """Both operands broadcast to one shape and (if match_dtype) promoted to one dtype; scalars are weak."""
        x = self
        if isinstance(y, UOp) and y.shape is None and dtypes.is_int(y.dtype):   # a symbolic int: a weak int scalar
            dt = strong_dtype(least_upper_dtype(x.dtype, dtypes.weakint)) if match_dtype else dtypes.default_int
            y = Tensor._wrap(build.const(y, dt, x.device))
        if not isinstance(y, Tensor):
            if not isinstance(y, (int, float, bool)): raise TypeError(f"unsupported operand type {type(y).__name__}")
            weak = dtypes.weakfloat if isinstance(y, float) else dtypes.bool if isinstance(y, bool) else dtypes.weakint
            dt = strong_dtype(least_upper_dtype(x.dtype, weak)) if match_dtype else dtypes.from_py(y)
            if isinstance(y, bool) and match_dtype: dt = x.dtype
            yt = Tensor._wrap(build.const(y, dt, x.device))
        else:
            yt = y
            if yt.device != x.device:
                raise RuntimeError(f"Expected all tensors to be on the same device, but found {x.device} and {yt.device}")
            if match_dtype and (x._weak != yt._weak):  # a 0-d tensor from a Python scalar yields like the scalar
                w, s = (x, yt) if x._weak else (yt, x)
                dt = strong_dtype(least_upper_dtype(s.dtype, weak_dtype(w.dtype)))
                x, yt = x.cast(dt), yt.cast(dt)
        if match_dtype:
            dt = least_upper_dtype(x.dtype, yt.dtype)
            x, yt = x.cast(dt), yt.cast(dt)
        if reverse: x, yt = yt, x
        shape = _broadcast_shape(x.shape, yt.shape)
        return x._broadcast_to(shape), yt._broadcast_to(shape)

    def _broadcast_to(self, shape: tuple[int, ...]) -> "Tensor":
        if self.shape == shape: return self
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if self.ndim < len(shape) else self
        return x.expand(shape)

    def _alu(self, op: Ops, *others: "Tensor") -> "Tensor":
        return self._apply(lambda *us: build.alu(op, *us), *others)

    # ----- movement (views) -----
    def reshape(self, shape: Any, *args: int) -> "Tensor":
        """A view with a new shape; one dimension may be -1."""
        new = argfix(shape, *args)
        if any(not isinstance(s, int) and not _is_sym_int(s) for s in new):
            raise TypeError(f"reshape takes ints, got {new}")
        if new.count(-1) > 1: raise RuntimeError("only one dimension can be inferred")
        if -1 in new and not (all_static(new) and all_static(self.shape)):
            raise NotImplementedError(f"reshape to {new}: -1 with a symbolic shape ({self.shape}); give every size")
        if -1 in new:
            rest = prod(s for s in new if s != -1)
            if rest == 0 or self.numel() % rest:
                raise RuntimeError(f"shape '{list(new)}' is invalid for input of size {self.numel()}")
            new = tuple(self.numel() // rest if s == -1 else s for s in new)
        if any(isinstance(s, int) and s < 0 for s in new) or not sym_eq(sprod(new), self.numel()):
            raise RuntimeError(f"shape '{list(new)}' is invalid for input of size {self.numel()} (shape {self.shape})")
        return self._view_apply(lambda u: build.reshape(u, new))

    def view(self, shape: Any, *args: int) -> "Tensor": return self.reshape(shape, *args)

    def permute(self, order: Any, *args: int) -> "Tensor":
        o = argfix(order, *args)
        if len(o) != self.ndim:
            raise RuntimeError(f"permute: number of dims don't match: order {o} for shape {self.shape}")
        o = tuple(self._axis(a) for a in o)
        if sorted(o) != list(range(self.ndim)): raise RuntimeError(f"permute: repeated dim in order {o} for shape {self.shape}")
        return self._view_apply(lambda u: build.permute(u, o))

    def expand(self, shape: Any, *args: int) -> "Tensor":
        new = argfix(shape, *args)
        if len(new) < self.ndim:
            raise RuntimeError(f"expand: the number of sizes provided ({len(new)}) must be greater or equal to the "
                               f"number of dimensions in the tensor ({self.ndim}), shape {self.shape}")
        old = (1,) * (len(new) - self.ndim) + self.shape
        new = tuple(o if n == -1 else n for o, n in zip(old, new))
        for o, n in zip(old, new):
            if o != n and o != 1:
                raise RuntimeError(f"The expanded size of the tensor ({n}) must match the existing size ({o}) at "
                                   f"non-singleton dimension: shape {self.shape} to {new}")
        return self.reshape(old)._apply(lambda u: build.expand(u, new)) if old != self.shape else \
            self._view_apply(lambda u: build.expand(u, new))

    def pad(self, padding: Sequence[int] | Sequence[tuple[int, int] | None], mode: str = "constant",
            value: float = 0.0) -> "Tensor":
        """Pad the tensor. `padding` is per-axis (before, after) pairs, or torch's flat form from the last axis.

        `mode` is "constant" (fill with `value`), "reflect" (mirror without the edge), "replicate" (repeat the edge) or
        "circular" (wrap around), as in torch.nn.functional.pad. A number in place of `mode` is taken as `value`."""
        if not isinstance(mode, str): mode, value = "constant", mode
        if mode not in ("constant", "reflect", "replicate", "circular"):
            raise NotImplementedError(f"pad mode {mode!r}: use 'constant', 'reflect', 'replicate' or 'circular'")
        if all(isinstance(p, int) for p in padding):
            flat = list(padding)
            if len(flat) % 2: raise RuntimeError(f"Padding length must be divisible by 2, got {padding} for shape {self.shape}")
            if len(flat) // 2 > self.ndim:
                raise RuntimeError(f"Padding length {len(flat)} is more than two times the {self.ndim} dims of {self.shape}")
            pairs = [(0, 0)] * self.ndim
            for i in range(len(flat) // 2): pairs[self.ndim - 1 - i] = (flat[2 * i], flat[2 * i + 1])
        else:
            if len(padding) != self.ndim: raise RuntimeError(f"padding {padding} needs one entry per axis of {self.shape}")
            pairs = [(0, 0) if p is None else tuple(p) for p in padding]  # type: ignore[misc]
        if any(isinstance(v, int) and v < 0 for p in pairs for v in p):  # negative padding crops
            x = self.shrink([(-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape)])
            return x.pad([(max(b, 0), max(a, 0)) for b, a in pairs], mode, value)
        if mode != "constant":
            if value != 0: raise ValueError(f"padding mode {mode!r} doesn't take a value (got {value})")
            return self._pad_mode(pairs, mode)
        out = self._apply(lambda u: build.pad(u, pairs))
        if self.numel() == 0 and out.numel():
            # padding nothing is all padding: kernels see a constant (they must not read the empty source), while
            # autograd still sees the PAD, so the empty source gets its (empty) gradient
            realized[out.uop] = build.const(0, out.dtype, out.device, out.shape)
        if value == 0: return out
        mask = Tensor.ones(self.shape, dtype=dtypes.bool, device=self.device)._apply(lambda u: build.pad(u, pairs))
        return mask.where(out, value)

    def _pad_mode(self, pairs: Sequence[tuple[int, int]], mode: str) -> "Tensor":
        """Non-constant padding, one axis at a time, built from slices of the input (so gradients flow back)."""
        x = self
        for i, (b, a) in enumerate(pairs):
            if b == 0 and a == 0: continue
            n = x.shape[i]
            if mode == "reflect" and (b >= n or a >= n):
                raise RuntimeError(f"reflect padding ({b}, {a}) must be smaller than the size {n} of axis {i} of {x.shape}")
            if mode == "circular" and (b > n or a > n):
                raise RuntimeError(f"circular padding ({b}, {a}) can't be larger than the size {n} of axis {i} of {x.shape}")
            if n == 0: raise RuntimeError(f"can't {mode}-pad axis {i} of size 0 (shape {x.shape})")
            def part(lo: int, hi: int, flip: bool = False) -> "Tensor":
                p = x.shrink([(lo, hi) if j == i else None for j in range(x.ndim)])
                return p.flip(i) if flip else p
            if mode == "reflect": left, right = part(1, b + 1, True), part(n - 1 - a, n - 1, True)
            elif mode == "circular": left, right = part(n - b, n), part(0, a)
            else:
                left = part(0, 1).expand(*[b if j == i else s for j, s in enumerate(x.shape)])
                right = part(n - 1, n).expand(*[a if j == i else s for j, s in enumerate(x.shape)])
            x = Tensor.cat(*[t for t in (left, x, right) if t.shape[i]], dim=i)
        return x

    def shrink(self, arg: Sequence[tuple[int, int] | None]) -> "Tensor":
        if len(arg) != self.ndim: raise ValueError(f"shrink {arg} needs one entry per axis of {self.shape}")
        a = [(0, s) if x is None else x for x, s in zip(arg, self.shape)]
        for (b, e), s in zip(a, self.shape):
            if not (sle(0, b) and sle(b, e) and sle(e, s)):
                raise IndexError(f"shrink {arg} out of bounds for shape {self.shape}")
        return self._view_apply(lambda u: build.shrink(u, a))

    def flip(self, axis: Any, *args: int) -> "Tensor":
        axes = {self._axis(a) for a in argfix(axis, *args)}
        return self._view_apply(lambda u: build.flip(u, [i in axes for i in range(self.ndim)]))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> "Tensor":
        order = list(range(self.ndim))
        d0, d1 = self._axis(dim0), self._axis(dim1)
        order[d0], order[d1] = order[d1], order[d0]
        return self.permute(order)

    @property
    def T(self) -> "Tensor":
        return self.permute(list(range(self.ndim))[::-1])

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.ndim == 0: return self.reshape(1)
        s, e = self._axis(start_dim), self._axis(end_dim)
        return self.reshape(self.shape[:s] + (sprod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def unsqueeze(self, dim: int) -> "Tensor":
        d = self._axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim: "int | Sequence[int] | None" = None) -> "Tensor":
        """Drop size-1 axes: all of them, or those of `dim` (an int or, as in torch 2, a tuple); others stay."""
        if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
        axes = {self._axis(d) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes or s != 1))

    # ----- elementwise -----
    def cast(self, dtype: DTypeLike) -> "Tensor":
        dt = to_dtype(dtype)
        if self.dtype == dt: return self
        if dtypes.is_float(self.dtype) and dt.scalar() in dtypes.ints: return _float_to_int(self, dt)
        return self._apply(lambda u: build.cast(u, dt))

    def bitcast(self, dtype: DTypeLike) -> "Tensor":
        """Reinterpret the bits. Same itemsize: elementwise; otherwise the last axis grows or shrinks (little endian)."""
        dt = to_dtype(dtype)
        if dt.itemsize == self.dtype.itemsize:
            return self if dt == self.dtype else self._apply(lambda u: UOp(Ops.BITCAST, dt, (u,)))
        if self.ndim == 0: raise RuntimeError(f"bitcast from {self.dtype} to {dt} needs at least one axis")
        uint = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}
        src_u, dst_u = uint[self.dtype.itemsize], uint[dt.itemsize]
        bits = self.bitcast(src_u)
        if dt.itemsize < self.dtype.itemsize:  # split each element into r pieces along the last axis
            r = self.dtype.itemsize // dt.itemsize
            shifts = Tensor([8 * dt.itemsize * i for i in range(r)], dtype=src_u, device=self.device)
            parts = (bits.unsqueeze(-1) >> shifts) & ((1 << (8 * dt.itemsize)) - 1)
            return parts.cast(dst_u).flatten(-2).bitcast(dt)
        r = dt.itemsize // self.dtype.itemsize
        if self.shape[-1] % r: raise RuntimeError(f"bitcast to {dt}: last axis {self.shape[-1]} must divide by {r}")
        groups = bits.cast(dst_u).unflatten(-1, (self.shape[-1] // r, r))
        shifts = Tensor([8 * self.dtype.itemsize * i for i in range(r)], dtype=dst_u, device=self.device)
        return (groups << shifts).sum(-1, dtype=dst_u).bitcast(dt)

    def float(self) -> "Tensor": return self.cast(dtypes.float32)
    def bfloat16(self) -> "Tensor": return self.cast(dtypes.bfloat16)
    def short(self) -> "Tensor": return self.cast(dtypes.int16)
    def half(self) -> "Tensor": return self.cast(dtypes.float16)
    def int(self) -> "Tensor": return self.cast(dtypes.int32)
    def long(self) -> "Tensor": return self.cast(dtypes.int64)
    def bool(self) -> "Tensor": return self.cast(dtypes.bool)
    def double(self) -> "Tensor": return self.cast(dtypes.float64)

    def _float_or_self(self) -> "Tensor":
        return self.cast(least_upper_float(self.dtype)) if not dtypes.is_float(self.dtype) else self

    def add(self, x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b)

    def sub(self, x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        if dtypes.is_bool(self.dtype) or isinstance(x, bool) or (isinstance(x, Tensor) and dtypes.is_bool(x.dtype)):
            raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported (as in torch); "
                               "to invert a mask use `~` or logical_not(), or cast to an int dtype first")
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.ADD, b.neg())

    def mul(self, x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(x, reverse)
        return a._alu(Ops.MUL, b)

    def div(self, x: "Tensor | ConstType", reverse: bool = False, rounding_mode: str | None = None) -> "Tensor":
        """True division (ints promote to float), like torch's `/`. rounding_mode="trunc" rounds the quotient toward
        zero, "floor" toward -inf (both keep int dtypes, as torch.div does)."""
        if rounding_mode in ("trunc", "floor"):
            a, b = self._broadcasted(x, reverse)
            if not dtypes.is_float(a.dtype): return a._alu(Ops.IDIV, b) if rounding_mode == "trunc" else a.floordiv(b)
            q = (a.detach() / b.detach()).trunc() if rounding_mode == "trunc" else a.detach().floordiv(b.detach())
            if not (a.requires_grad or b.requires_grad): return q
            # a rounded quotient is piecewise constant: zero gradient for both operands (torch too), never the NaN
            # that differentiating through a / b would give where b == 0
            from fusegrad.mixin.nn import _custom_grad
            return _custom_grad(q, [a, b], lambda g, a_, b_: (a_.zeros_like(), b_.zeros_like()), f"div_{rounding_mode}")
        if rounding_mode is not None:
            raise ValueError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found {rounding_mode!r}")
        a, b = self._broadcasted(x, reverse)
        a, b = a._float_or_self(), b._float_or_self()
        return a._alu(Ops.MUL, b.reciprocal())

    def floordiv(self, x: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype): return (a / b).floor()
        q = a._alu(Ops.IDIV, b)  # truncates; step down when the signs differ and there is a remainder
        fix = ((a._alu(Ops.MOD, b) != 0) & ((a < 0) != (b < 0))).cast(q.dtype)
        return q - fix

    def neg(self) -> "Tensor":
        if dtypes.is_bool(self.dtype): raise RuntimeError("negation of a bool tensor is not supported; use logical_not")
        return self * -1 if dtypes.is_int(self.dtype) else self._alu(Ops.NEG)

    def reciprocal(self) -> "Tensor": return self._float_or_self()._alu(Ops.RECIPROCAL)
    def sqrt(self) -> "Tensor": return self._float_or_self()._alu(Ops.SQRT)
    def rsqrt(self) -> "Tensor": return self.sqrt().reciprocal()
    def exp2(self) -> "Tensor": return self._float_or_self()._alu(Ops.EXP2)
    def log2(self) -> "Tensor": return self._float_or_self()._alu(Ops.LOG2)
    def exp(self) -> "Tensor": return (self._float_or_self() * (1 / math.log(2))).exp2()
    def log(self) -> "Tensor": return self.log2() * math.log(2)
    def sin(self) -> "Tensor": return self._float_or_self()._alu(Ops.SIN)
    def cos(self) -> "Tensor": return ((math.pi / 2) - self._float_or_self()).sin()
    def square(self) -> "Tensor": return self * self
    def trunc(self) -> "Tensor": return self._alu(Ops.TRUNC) if dtypes.is_float(self.dtype) else self

    def floor(self) -> "Tensor":
        if not dtypes.is_float(self.dtype): return self
        t = self.trunc()
        return t - ((self < t).cast(self.dtype))

    def relu(self) -> "Tensor":
        keep = (self > 0) | self.isnan() if dtypes.is_float(self.dtype) else self > 0   # relu(NaN) is NaN, relu'(0)=0
        return keep.where(self, 0)

    def sigmoid(self) -> "Tensor":
        # each branch only sees inputs where its exp can't overflow, so values and gradients never meet inf*0
        x = self._float_or_self()
        pos = x >= 0
        ep, en = (-pos.where(x, 0)).exp(), pos.where(0, x).exp()
        return pos.where(1 / (1 + ep), en / (1 + en))

    def tanh(self) -> "Tensor":
        return 2.0 * (2.0 * self._float_or_self()).sigmoid() - 1.0

    def abs(self) -> "Tensor":
        if dtypes.is_unsigned(self.dtype) or dtypes.is_bool(self.dtype): return self
        # ints: the negation wraps at the minimum, so abs(INT32_MIN) is INT32_MIN as in torch (relu sums gave 0)
        if dtypes.is_int(self.dtype): return (self < 0).where(-self, self)
        return self.relu() + (-self).relu()

    def maximum(self, x: "Tensor | ConstType") -> "Tensor":
        a, b = self._broadcasted(x)
        if dtypes.is_bool(a.dtype): return a | b
        return a._alu(Ops.MAX, b)

    def minimum(self, x: "Tensor | ConstType") -> "Tensor":
        a, b = self._broadcasted(x)
        if dtypes.is_bool(a.dtype): return a & b
        return ~((~a).maximum(~b)) if dtypes.is_int(a.dtype) else -((-a).maximum(-b))   # ~: see min()

    def where(self, x: "Tensor | ConstType", y: "Tensor | ConstType") -> "Tensor":
        """`x` where self is true, else `y` (self is cast to bool)."""
        if isinstance(x, Tensor): xb, yb = x._broadcasted(y)
        elif isinstance(y, Tensor): yb, xb = y._broadcasted(x)
        else:
            dt = dtypes.from_py(x) if type(x) is type(y) else least_upper_dtype(dtypes.from_py(x), dtypes.from_py(y))
            xb, yb = Tensor(x, device=self.device, dtype=dt), Tensor(y, device=self.device, dtype=dt)
        cond, xb = self.cast(dtypes.bool)._broadcasted(xb, match_dtype=False)
        cond, yb = cond._broadcasted(yb, match_dtype=False)
        xb, yb = xb._broadcast_to(cond.shape), yb._broadcast_to(cond.shape)
        return cond._alu(Ops.WHERE, xb, yb)

    # comparisons return bool tensors
    def __lt__(self, x: "Tensor | ConstType") -> "Tensor": return Tensor._cmp(*self._broadcasted(x), Ops.CMPLT)
    def __gt__(self, x: "Tensor | ConstType") -> "Tensor": return Tensor._cmp(*self._broadcasted(x, True), Ops.CMPLT)
    def __ge__(self, x: "Tensor | ConstType") -> "Tensor": return (self > x) | (self == x)  # NaN compares False
    def __le__(self, x: "Tensor | ConstType") -> "Tensor": return (self < x) | (self == x)
    def __ne__(self, x: "Tensor | ConstType") -> "Tensor": return Tensor._cmp(*self._broadcasted(x), Ops.CMPNE)  # type: ignore[override]
    def __eq__(self, x: "Tensor | ConstType") -> "Tensor": return (self != x).logical_not()  # type: ignore[override]
    def eq(self, x: "Tensor | ConstType") -> "Tensor": return self == x
    def ne(self, x: "Tensor | ConstType") -> "Tensor": return self != x

    @staticmethod
    def _cmp(a: "Tensor", b: "Tensor", op: Ops) -> "Tensor":
        return a._alu(op, b)

    def logical_not(self) -> "Tensor":
        return self.cast(dtypes.bool)._alu(Ops.CMPNE, Tensor._wrap(self._const(True, dtypes.bool)))

    def _bitwise(self, x: "Tensor | ConstType", op: Ops, reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(x, reverse)
        if dtypes.is_float(a.dtype): raise RuntimeError(f"bitwise op {op.name} needs int or bool tensors, got {a.dtype}")
        if op in (Ops.SHL, Ops.SHR) and dtypes.is_int(a.dtype): return _shift(a, b, op)
        return a._alu(op, b)

    def __and__(self, x: "Tensor | ConstType") -> "Tensor": return self._bitwise(x, Ops.AND)
    def __or__(self, x: "Tensor | ConstType") -> "Tensor": return self._bitwise(x, Ops.OR)
    def __xor__(self, x: "Tensor | ConstType") -> "Tensor": return self._bitwise(x, Ops.XOR)
    def __lshift__(self, x: int) -> "Tensor": return self._bitwise(x, Ops.SHL)
    def __rshift__(self, x: int) -> "Tensor": return self._bitwise(x, Ops.SHR)

    def __add__(self, x: "Tensor | ConstType") -> "Tensor": return self.add(x)
    def __radd__(self, x: "Tensor | ConstType") -> "Tensor": return self.add(x, True)
    def __sub__(self, x: "Tensor | ConstType") -> "Tensor": return self.sub(x)
    def __rsub__(self, x: "Tensor | ConstType") -> "Tensor": return self.sub(x, True)
    def __mul__(self, x: "Tensor | ConstType") -> "Tensor": return self.mul(x)
    def __rmul__(self, x: "Tensor | ConstType") -> "Tensor": return self.mul(x, True)
    def __truediv__(self, x: "Tensor | ConstType") -> "Tensor": return self.div(x)
    def __rtruediv__(self, x: "Tensor | ConstType") -> "Tensor": return self.div(x, True)
    def __floordiv__(self, x: "Tensor | ConstType") -> "Tensor": return self.floordiv(x)
    def __rfloordiv__(self, x: "Tensor | ConstType") -> "Tensor": return self.floordiv(x, True)
    def __neg__(self) -> "Tensor": return self.neg()
    # in-place operators update the tensor itself (through assign), so other references see the new value
    def __iadd__(self, x: Any) -> "Tensor": return self.assign(self + x)
    def __isub__(self, x: Any) -> "Tensor": return self.assign(self - x)
    def __imul__(self, x: Any) -> "Tensor": return self.assign(self * x)
    def __itruediv__(self, x: Any) -> "Tensor": return self.assign(self / x)
    def __ifloordiv__(self, x: Any) -> "Tensor": return self.assign(self // x)
    def __ipow__(self, x: Any) -> "Tensor": return self.assign(self ** x)
    def __iand__(self, x: Any) -> "Tensor": return self.assign(self & x)
    def __ior__(self, x: Any) -> "Tensor": return self.assign(self | x)
    def __ixor__(self, x: Any) -> "Tensor": return self.assign(self ^ x)
    def __ilshift__(self, x: Any) -> "Tensor": return self.assign(self << x)
    def __irshift__(self, x: Any) -> "Tensor": return self.assign(self >> x)
    def __imatmul__(self, x: Any) -> "Tensor": return self.assign(self @ x)
    def __rlshift__(self, x: Any) -> "Tensor": return self._bitwise(x, Ops.SHL, True)
    def __rrshift__(self, x: Any) -> "Tensor": return self._bitwise(x, Ops.SHR, True)

    def __delitem__(self, idx: Any) -> None:
        raise TypeError("Tensor does not support deleting items")
    def __matmul__(self, x: "Tensor") -> "Tensor": return self.matmul(x)
    def __rmatmul__(self, x: "Tensor") -> "Tensor": return x.matmul(self)

    # ----- reductions -----
    def _reduce(self, op: Ops, axis: int | Sequence[int] | None, keepdim: bool) -> "Tensor":
        axes = tuple(range(self.ndim)) if axis is None else \
            tuple(self._axis(a) for a in ((axis,) if isinstance(axis, int) else axis))
        from fusegrad.mixin.reduce import _no_repeated_axes
        _no_repeated_axes(axes)
        if self.ndim == 0: axes = ()
        if op is Ops.MAX and axis is None and self.numel() == 0:
            raise RuntimeError(f"max/min of an empty tensor (shape {self.shape}) needs an explicit axis")
        if op is Ops.MAX and any(self.shape[a] == 0 for a in axes):
            raise IndexError(f"max/min: Expected reduction dims {axes} to have non-zero size, shape {self.shape}")
        x = self
        if any(self.shape[a] == 0 for a in axes):  # reducing nothing: pad with the identity (keeps the graph link)
            ident = 0 if op is Ops.ADD else 1
            x = x.pad([(0, 1) if i in axes and s == 0 else (0, 0) for i, s in enumerate(self.shape)], value=ident)
        # reducing nothing still gives a new tensor (not a view of self: a later write to self doesn't change it)
        out = x._apply(lambda u: build.reduce_axis(u, op, axes)) if any(x.shape[a] != 1 for a in axes) else \
            Tensor._wrap(x.uop, x)
        return out if keepdim else out.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def sum(self, axis: int | Sequence[int] | None = None, keepdim: bool = False,
            dtype: DTypeLike | None = None) -> "Tensor":
        x = self.cast(to_dtype(dtype) if dtype is not None else sum_acc_dtype(self.dtype))
        out = x._reduce(Ops.ADD, axis, keepdim)
        # half/bfloat16 accumulate in float32 but return their own dtype, like torch
        return out.cast(self.dtype) if dtype is None and dtypes.is_float(self.dtype) else out

    def max(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        if dtypes.is_bool(self.dtype): return self.cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
        return self._exact_for_max_grad()._reduce(Ops.MAX, axis, keepdim)

    def _exact_for_max_grad(self) -> "Tensor":
        """self, stored first when max's gradient will compare it with the max and a recomputation could round
        differently (see `_fma_hazard`)."""
        if self.requires_grad and not Tensor.no_grad and dtypes.is_float(self.dtype) and _fma_hazard(self.uop):
            return self.contiguous()
        return self

    def min(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        if dtypes.is_bool(self.dtype): return self.logical_not().max(axis, keepdim).logical_not()
        # ints: ~x = -x-1 reverses the order without overflowing (-x does at the most negative value)
        if dtypes.is_int(self.dtype): return ~((~self).max(axis, keepdim))
        return -((-self).max(axis, keepdim))

    def mean(self, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> "Tensor":
        x = self._float_or_self()
        s = x.sum(axis, keepdim, dtype=sum_acc_dtype(x.dtype))   # divide before rounding back to half
        if not all_static(self.shape):   # a symbolic count: divide by a tensor of its value (the kernel reads it)
            per = sprod(s.shape)
            cnt = ssimplify(sprod(self.shape) // (max(per, 1) if isinstance(per, int) else per))
            div = cnt.arg if cnt.op is Ops.CONST else Tensor._wrap(build.const(cnt, s.dtype, s.device))
            return (s / div).cast(x.dtype)
        n = prod(self.shape) // max(prod(s.shape), 1) if self.numel() else 0
        return (s * (1 / n if n else math.nan)).cast(x.dtype)

    # ----- matmul -----
    def dot(self, w: "Tensor", dtype: DTypeLike | None = None) -> "Tensor":
        """Matrix product with broadcasting over batch dims, as a broadcast multiply and a sum (one kernel)."""
        x = self
        if x.ndim == 0 or w.ndim == 0:
            raise RuntimeError(f"both arguments to matmul need at least 1 dimension, got {x.shape} and {w.shape}")
        k_x, k_w = x.shape[-1], w.shape[-min(w.ndim, 2)]
        if k_x != k_w:
            xs = "x".join(map(str, x.shape))
            ws = "x".join(map(str, w.shape))
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({xs} and {ws})")
        bx, bw = x.shape[:-2], w.shape[:-2]
        if any(a != b and a != 1 and b != 1 for a, b in zip(bx[::-1], bw[::-1])):
            raise RuntimeError(f"matmul: batch dims can't broadcast for shapes {x.shape} and {w.shape}")
        # an operand whose reduce axis merges axes that a permute separated in memory (`a.transpose(1, 2).reshape(B,
        # T, H)`: heads back into the hidden axis) would be read with div/mod index math and strides inside the reduce
        # loop; a contiguous copy costs one pass (usually none: the copy is the store of the kernel computing `a`)
        if _merges_permuted(x.uop): x = x.contiguous()
        if w.ndim == 1:
            out = (x * w).sum(-1, dtype=dtype)                                       # (...,)
        else:
            xx = x.reshape(1, k_x) if x.ndim == 1 else x
            xr = xx.reshape(xx.shape[:-1] + (1, k_x))                                # (..., n, 1, k)
            wr = w.transpose(-1, -2).reshape(w.shape[:-2] + (1, w.shape[-1], k_x))   # (..., 1, m, k)
            out = (xr * wr).sum(-1, dtype=dtype)                                     # (..., n, m)
            if x.ndim == 1: out = out.squeeze(-2)
        return out.cast(least_upper_dtype(x.dtype, w.dtype)) if dtype is None else out

    def matmul(self, x: "Tensor", reverse: bool = False, dtype: DTypeLike | None = None) -> "Tensor":
        return x.dot(self, dtype) if reverse else self.dot(x, dtype)

    # ----- autograd -----
    def backward(self, gradient: "Tensor | None" = None) -> "Tensor":
        """Fill `.grad` of every live float tensor this one depends on whose requires_grad is True (as in torch).

        Gradients accumulate into an existing `.grad`. Use requires_grad=True on tensors made by factories like
        `Tensor.zeros` so each gets its own gradient (identical constants otherwise share one graph node)."""
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"grad can be implicitly created only for scalar outputs, got shape {self.shape}")
            gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        if gradient.shape != self.shape:
            raise RuntimeError(f"gradient shape {gradient.shape} doesn't match tensor shape {self.shape}")
        self._check_has_graph()
        root = _with_history(self.uop)
        targets = {t: lazy_of.get(t.uop, t.uop) for t in list(_all_tensors)
                   if t.requires_grad and dtypes.is_float(t.dtype) and t is not gradient}
        grads = autograd.compute_gradient(root, gradient.uop, set(targets.values()) | {t.uop for t in targets} |
                                          {leaf_of[t.uop] for t in targets if t.uop in leaf_of})
        for t, u in targets.items():
            found = [grads[x] for x in dict.fromkeys((u, t.uop, leaf_of.get(t.uop, u))) if x in grads]
            if not found: continue
            g = Tensor._wrap(found[0] if len(found) == 1 else build.alu(Ops.ADD, *found))
            if g.dtype != t.dtype: g = g.cast(t.dtype)
            t.grad = g if t.grad is None else (t.grad + g)
        return self

    def gradient(self, *targets: "Tensor", gradient: "Tensor | None" = None) -> list["Tensor"]:
        """Gradients of self with respect to each target (without touching .grad)."""
        g = gradient if gradient is not None else Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        self._check_has_graph()
        root = _with_history(self.uop)
        tu = [lazy_of.get(t.uop, t.uop) for t in targets]
        grads = autograd.compute_gradient(root, g.uop, set(tu))
        # the targets and self are the parents: a gradient of a tensor that requires grad has autograd history itself,
        # so it can be realized and differentiated again (second order)
        return [Tensor._wrap(grads[u], self, t, g) if u in grads else t.zeros_like() for t, u in zip(targets, tu)]

    def _check_has_graph(self) -> None:
        if self._no_graph:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn: this tensor "
                               "was computed under Tensor.no_grad, so it has no autograd graph")

    # train/test mode: tinygrad's old and new spellings
    class train(contextlib.ContextDecorator):
        """`with Tensor.train():` or `@Tensor.train()` sets Tensor.training (and the TRAINING flag) for the block."""
        def __init__(self, mode: bool = True): self.mode, self.prev = mode, threading.local()
        def __enter__(self) -> None:
            # the previous value per thread: one decorated function may run in several threads at once
            stack = self.prev.__dict__.setdefault("stack", [])
            stack.append(TRAINING.value)
            Tensor.training = self.mode
        def __exit__(self, *exc: Any) -> None:
            TRAINING.value = self.prev.stack.pop()

    class test(train):
        def __init__(self) -> None: super().__init__(False)


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer hash finalizer (xor-shift-multiply), applied elementwise."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


def _is_contiguous_buffer(u: UOp) -> bool:
    while u.op is Ops.RESHAPE: u = u.src[0]
    if u.op is Ops.SHRINK and u.src[0].op is Ops.BUFFER and u.arg[0][0] == 0 and isinstance(u.arg[0][1], UOp):
        return True  # a symbolic shape: a prefix of a buffer allocated at its largest size
    return u.op is Ops.BUFFER


def _is_sym_int(x: Any) -> bool:
    """A symbolic size: an int-typed UOp (a bound Variable, or an expression of one)."""
    return isinstance(x, UOp) and dtypes.is_int(x.dtype)


def _fma_hazard(u: UOp, limit: int = 4096) -> bool:
    """Whether the float expression `u` (up to stored buffers) has a multiply feeding an add. Reduce kernels compile
    with fused multiply-add contraction and elementwise kernels without, so such an expression recomputed in both can
    round differently: max's gradient, which finds the maximal elements by comparing the input with the result
    (`x == max`), would then find none of them (a 0/0 share). Its input is stored first when this can happen."""
    seen, stack = {u}, [u]
    while stack:
        x = stack.pop()
        if x.op in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.CONST, Ops.DEVICE): continue
        if x.op is Ops.MULACC: return True
        if x.op is Ops.ADD and dtypes.is_float(x.dtype) and any(s.op is Ops.MUL for s in x.src): return True
        if len(seen) > limit: return True   # too big to tell: store it
        for s in x.src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False


def _merges_permuted(u: UOp) -> bool:
    """u is a reshape of a permute whose last axis merges several axes of the permute's output that aren't adjacent
    in the permute's source, in order (so a matmul's reduce over it would stride through memory)."""
    if u.op is not Ops.RESHAPE or u.src[0].op is not Ops.PERMUTE: return False
    p, shape = u.src[0], u.shape
    ps = p.shape
    if shape is None or ps is None or not shape or not all_static(shape) or not all_static(ps): return False
    # the trailing axes of the permute's output that the reshape merges into the last axis
    k, n, i = shape[-1], 1, len(ps)
    while i > 0 and n < k:
        i -= 1
        n *= ps[i]
    if n != k: return False
    merged = [a for a in range(i, len(ps)) if ps[a] != 1]
    order = [p.arg[a] for a in merged]
    return len(merged) > 1 and order != list(range(order[0], order[0] + len(order)))


def _is_realized(u: UOp) -> bool:
    """Already computed: a whole buffer, or a constant broadcast to a shape (never materialized)."""
    if _is_contiguous_buffer(u): return True
    # stops at the first other op (a lazy graph's root, usually): no walk of the whole graph on every realize
    stack, seen = [u], {u}
    while stack:
        x = stack.pop()
        if x.op not in (Ops.RESHAPE, Ops.EXPAND, Ops.CONST, Ops.DEVICE): return False
        for s in x.src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return True


__all__ = ["Tensor", "make_tuple"]
