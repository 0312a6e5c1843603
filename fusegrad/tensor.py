"""The Tensor frontend: a PyTorch-style lazy tensor. Every op builds tensor-level IR nodes; nothing runs until
`realize()`, `numpy()`, `item()` or `tolist()`, which hand the graph to the scheduler (schedule/) and the engine (engine/).
"""
from __future__ import annotations

import contextlib
import pathlib
import struct
import threading
import weakref
from typing import Any, Callable, ClassVar, Sequence, cast  # noqa: F401 - tinygrad's tensor module exports cast

from fusegrad import autograd, sharding
from fusegrad.device import Buffer, Device, canonical_device as _canonical_device, single_device as _single_device
from fusegrad.dlpack import import_dlpack
from fusegrad.dtype import ConstType, DType, DTypeLike, dtypes, float_to_bf16_bits, float_to_fp8, from_np_dtype, \
    least_upper_dtype, strong_dtype, to_dtype, to_np_dtype, weak_dtype
from fusegrad.helpers import BoundsError, ShapeError, TRAINING, argfix, make_tuple, prod
from fusegrad.ir import build
from fusegrad.ir.ops import OpMixin, Ops, UOp, node_of_shape, sym_infer
from fusegrad.ir.pattern import substitute, substitute_memo
from fusegrad.ir.shape import all_static, broadcast_shape, canonical_shape, is_bound, is_sym_int as _is_sym_int, \
    shrink_bounds_error, shrink_bounds_known, smax, sprod, sym_eq, sym_value_dtype
from fusegrad.mixin.alu import ALUMixin
from fusegrad.mixin.creation import CreationMixin
from fusegrad.mixin.math import MathMixin
from fusegrad.mixin.movement import MovementMixin
from fusegrad.autograd import custom_grad
from fusegrad.mixin.nn import NNMixin
from fusegrad.mixin.realize import RealizeMixin
from fusegrad.mixin.reduce import ReduceMixin

# the buffer registry and result cache live below the frontend (storage.py); re-exported here for older imports
from fusegrad import storage  # noqa: E402
from fusegrad.storage import buffer_uop, buffer_view, buffers, is_contiguous_buffer, is_realized, lazy_of, leaf_of, \
    realized, unique_ids  # noqa: E402,F401
from fusegrad.views import VIEW_OPS, ViewRefs, assign_owner, mark_view, preserve_old_values, refresh_views, \
    substitute_outside_assigns, view_bases, view_chain, write_through  # noqa: E402,F401


def _with_history(u: UOp) -> tuple[UOp, dict[UOp, UOp]]:
    """`u` with realized nodes replaced by the lazy graphs that computed them, and the map back (_with_history_memo)."""
    root, _, back = _with_history_memo(u)
    return root, back


def _is_const(u: UOp) -> bool:
    """Whether `u` is a constant seen through reshapes and expands (`Tensor.zeros`, `full`): such nodes are shared by
    every equal constant, so a gradient of one would be every such tensor's."""
    while u.op in (Ops.RESHAPE, Ops.EXPAND): u = u.src[0]
    return u.op is Ops.CONST


def _back_to_originals(grads: dict[UOp, UOp], back: dict[UOp, UOp]) -> dict[UOp, UOp]:
    """The gradients with every node of the rebuilt graph that stands for a node of the original one (a history for its
    realized result, a pending write rebuilt on histories for that write) turned back into it. The gradient then reads
    the realized values, and a pending write stays one node: rebuilt, it would be a second write of the same memory,
    run again when the gradient is realized (or refused, once a later write has changed the memory its history read)."""
    if not back or not grads: return grads
    keys = list(grads)
    memo = substitute_memo(UOp(Ops.SINK, src=tuple(grads[k] for k in keys)), back)
    return {k: memo[grads[k]] for k in keys}


def _with_history_memo(u: UOp) -> tuple[UOp, dict[UOp, UOp], dict[UOp, UOp]]:
    """`u` with realized nodes replaced by the lazy graphs that computed them, so gradients reach the leaves. A history
    may read other realized nodes with histories of their own: each is expanded once, by an iterative walk over the
    histories. A node met again inside its own expansion (the history of a write that read the memory it wrote, where
    `storage.record_history` found no earlier history) stays a leaf there: the memory's contents before that write.
    Also returns what each node of `u` became (a pending write of a leaf, whose target has a history, is rebuilt on
    it: backward() finds the tensor holding that write there), and the map back from each rebuilt node and expanded
    history to the node it stands for (`_back_to_originals`)."""
    keys = [n for n in autograd.graph_nodes(u) if n in lazy_of]   # (no gradient flows below a plain DETACH)
    if not keys: return u, {}, {}
    done: dict[UOp, UOp] = {}            # history key -> its history with the histories it reads expanded
    active: set[UOp] = set()
    stack: list[tuple[UOp, list[UOp] | None]] = [(k, None) for k in reversed(keys)]
    while stack:
        n, inner = stack.pop()
        if n in done: continue
        if inner is None:                # first visit: expand the histories this one reads, then come back
            storage.check_history(n)
            active.add(n)
            inner = [m for m in autograd.graph_nodes(lazy_of[n]) if m in lazy_of and m is not n and m not in active]
            stack.append((n, inner))
            stack.extend((m, None) for m in reversed(inner) if m not in done)
            continue
        active.discard(n)
        done[n] = substitute(lazy_of[n], {m: done[m] for m in inner if m in done})
    memo = substitute_memo(u, {k: done[k] for k in keys})
    back = {h: k for k, h in done.items() if h is not k}
    back.update((new, n) for n, new in memo.items() if new is not n)
    return memo[u], memo, back


Variable = UOp.variable  # `from fusegrad.tensor import Variable` as in tinygrad

# every live tensor: backward() fills .grad for those in the graph that require a gradient
_all_tensors = storage.live_tensors   # every live Tensor (weakly)
_CONTIGUOUS = Ops.CONTIGUOUS   # (bound once: a global instead of an attribute lookup per use)


def _make_unique(u: UOp) -> UOp:
    """Nodes are hash-consed, so two Tensor.zeros(3) share a node (and would share a gradient). A tensor that asks for
    its own gradient gets a node of its own: a CONTIGUOUS with a unique tag (it is materialized on first use)."""
    if u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER) or is_contiguous_buffer(u): return u
    if u.op is Ops.CONTIGUOUS and isinstance(u.arg, int): return u  # already unique
    return UOp(Ops.CONTIGUOUS, u.dtype, (u,), next(unique_ids))


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


# ml_dtypes (numpy extension) dtype name -> ours: such arrays are read as their raw bytes
_ML_DTYPES = {"bfloat16": dtypes.bfloat16, "float8_e4m3fn": dtypes.fp8e4m3, "float8_e5m2": dtypes.fp8e5m2}


def _pack(values: list[Any], dtype: DType) -> bytes:
    if dtype in dtypes.fp8s:
        return bytes(float_to_fp8(float(v), dtype) for v in values)
    if dtype == dtypes.bfloat16:
        return struct.pack(f"{len(values)}H", *(float_to_bf16_bits(float(v)) for v in values))
    assert dtype.fmt is not None
    return struct.pack(f"{len(values)}{dtype.fmt}", *(dtypes.as_const(v, dtype) for v in values))


class _TensorMeta(type):
    """`Tensor.training` is the TRAINING flag seen as a bool: one value, per thread (TRAINING is a per-thread
    ContextVar), so `with Tensor.train():` in one thread doesn't turn on dropout in another."""
    @property
    def training(cls) -> bool: return bool(TRAINING.value)

    @training.setter
    def training(cls, v: bool) -> None: TRAINING.value = int(bool(v))


class Tensor(CreationMixin, ALUMixin, MathMixin, ReduceMixin, MovementMixin, NNMixin, RealizeMixin, OpMixin,
             metaclass=_TensorMeta):
    """A lazy n-dimensional array with autograd.

    >>> (Tensor([1.0, 2.0]) * 3).tolist()
    [3.0, 6.0]
    """
    __slots__ = ("uop", "grad", "requires_grad", "_derived", "_used", "is_param", "_weak", "_no_graph", "_view", "_views",
                 "_settled", "__weakref__")
    no_grad: ClassVar[bool] = False
    _seed: ClassVar[int] = 0
    _rng_states: ClassVar[dict[str, "Tensor"]] = {}
    _rng_resets: ClassVar[dict[str, tuple[Any, "Tensor"]]] = {}   # device -> (pending reset's node, its seed data)

    def __init__(self, data: Any, device: str | None = None, dtype: DTypeLike | None = None,
                 requires_grad: bool | None = None):
        dt = to_dtype(dtype) if dtype is not None else None
        dev = _canonical_device(device)
        if isinstance(data, UOp) and data.shape is None and dtypes.is_int(data.dtype) and data.op is not Ops.CONST:
            self.uop = build.const(data, dt or sym_value_dtype(data), dev)   # a symbolic int: a 0-d tensor of its value
        elif isinstance(data, UOp):
            self.uop = data
        elif data is None or isinstance(data, (int, float, bool)):
            d = dt or _int_width([data]) or dtypes.from_py(0.0 if data is None else data)
            self.uop = build.const(0.0 if data is None else data, d, dev)
        elif isinstance(data, pathlib.PurePath):
            # a path: the file as a DISK tensor of `dtype` (uint8 by default), read lazily (runtime/ops_disk.py)
            d = dt or dtypes.uint8
            disk = f"DISK:{pathlib.Path(data).resolve()}"
            n = Device[disk].size() // d.itemsize   # type: ignore[attr-defined]   # FileNotFoundError if missing
            self.uop = build.reshape(buffer_uop(Buffer(disk, n, d)), (n,))
            if device is not None and dev != disk: self.uop = UOp(Ops.COPY, d, (self.uop,), dev)
        elif isinstance(data, bytes):
            self.uop = self._from_bytes(data, dt or dtypes.uint8, (len(data) // (dt or dtypes.uint8).itemsize,), dev)
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
            arr = np.asarray(data)
            if (own := _ML_DTYPES.get(arr.dtype.name)) is not None:  # an ml_dtypes array (bfloat16, fp8): its bytes
                arr, d = arr.view(f"u{own.itemsize}"), own
            else:  # a dtype numpy lacks (bfloat16, fp8) is reached by the cast below, from the array's own dtype
                d = dt if dt is not None and dt.fmt is not None else from_np_dtype(arr.dtype)
                arr = arr.astype(to_np_dtype(d), copy=False)   # (copied once below, into the buffer)
            arr = np.ascontiguousarray(arr).reshape(arr.shape)
            # (the array's own memory, copied once into the buffer; a memoryview can't describe an empty array)
            raw = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size and isinstance(dev, str) else arr.tobytes()
            self.uop = self._from_bytes(raw, d, arr.shape, dev)
        elif hasattr(data, "__dlpack__") and not isinstance(data, Tensor):   # torch.Tensor, jax arrays, ...: a copy
            if getattr(data, "requires_grad", False) and hasattr(data, "detach"): data = data.detach()
            if hasattr(data, "__dlpack_device__") and int(data.__dlpack_device__()[0]) != 1 and hasattr(data, "cpu"):
                data = data.cpu()   # kDLCPU is 1; a GPU array comes through host memory
            self.uop = import_dlpack(data, dev, copy=True).uop
        else:
            what = type(data).__qualname__ if type(data).__module__ == "builtins" else \
                f"{type(data).__module__}.{type(data).__qualname__}"
            hint = " (use t.clone(), or t.detach() without its gradient)" if isinstance(data, Tensor) else ""
            raise TypeError(f"can't create a Tensor from {what}{hint}; Tensor() takes a Python scalar or (nested) "
                            "list, bytes, a path, a NumPy array or anything with __dlpack__ (torch.Tensor, ...)")
        if dt is not None and self.uop.dtype != dt: self.uop = build.cast(self.uop, dt)
        self.grad: Tensor | None = None
        self.requires_grad: bool | None = requires_grad
        self._derived = False  # True when computed from tensors that require grad (has autograd history)
        self._used = False     # True once another tensor was computed from this one (its node is in that graph)
        self.is_param = False
        # a 0-d tensor made from a bare Python scalar (no dtype given) is weakly typed in promotion, like the scalar
        self._no_graph = False
        self._view: tuple[Tensor, UOp] | None = None   # (base tensor, its node this view's movement ops start from)
        self._views: ViewRefs | None = None   # live views (they see its writes)
        self._settled: UOp | None = None   # views.realize_readers: the node it last found to be a plain buffer view
        self._weak = dt is None and isinstance(data, (int, float)) and not isinstance(data, bool)
        if requires_grad: self.uop = _make_unique(self.uop)
        _all_tensors.add(self)
        if self.uop.base.op is Ops.BUFFER: storage.claim(self)   # made from data: it owns its memory

    @staticmethod
    def _from_bytes(data: bytes | memoryview, dtype: DType, shape: tuple[int, ...], device: Any) -> UOp:
        n = prod(shape)
        if len(data) != n * dtype.itemsize: raise ValueError(f"{len(data)} bytes don't make {n} elements of {dtype}")
        if isinstance(device, tuple):   # one copy per device
            return sharding.from_bytes(data, dtype, shape, device)
        if device.startswith("DISK:"):   # data for a file: written (by a COPY) only if it is realized there
            return UOp(Ops.COPY, dtype, (Tensor._from_bytes(data, dtype, shape, Device.DEFAULT),), device)
        buf = Buffer(device, n, dtype).copyin(data)
        return build.reshape(buffer_uop(buf), shape)

    @staticmethod
    def _wrap(u: UOp, *parents: "Tensor") -> "Tensor":
        t = Tensor.__new__(Tensor)
        needs_grad = has_no_graph = False
        for p in parents:
            p._used = True
            if p.requires_grad: needs_grad = True
            if p._no_graph: has_no_graph = True
        if needs_grad and Tensor.no_grad:
            # computed under no_grad from tensors that need a gradient: a constant for autograd (torch too), so a
            # later graph that uses it alongside those tensors sends no gradient back through it; no autograd graph
            if not (u.op is Ops.DETACH and u.arg is None): u = UOp(Ops.DETACH, u.dtype, (u,))
            t.requires_grad, t._derived, t._no_graph = None, False, True
        elif needs_grad: t.requires_grad, t._derived, t._no_graph = True, True, False
        # (computed from a tensor without an autograd graph: none either)
        else: t.requires_grad, t._derived, t._no_graph = None, False, has_no_graph
        t.uop, t.grad, t.is_param, t._weak, t._used, t._view, t._views, t._settled = \
            u, None, False, False, False, None, None, None
        # (a view is marked by the movement method that makes it, `_view_apply`: an op whose result merely happens to
        # be a movement of its input, such as a sum over size-1 axes, makes a new tensor, as in torch)
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
    def device(self) -> Any:
        """The device name (a str), or a tuple of names for a tensor on several devices (fusegrad/sharding.py)."""
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

    # by identity (`==` is elementwise), in C: every new tensor is hashed once (_all_tensors)
    __hash__ = object.__hash__

    def __reduce__(self) -> tuple:
        """Pickle by value: the data is realized and stored with dtype, shape, device and the autograd flags (the
        graph is not kept). An unpickled tensor is a fresh leaf on the same device (a DISK tensor's data comes back on
        the default device: unpickling never writes a file).

        >>> import pickle
        >>> pickle.loads(pickle.dumps(Tensor([1, 2]) + 1)).tolist()
        [2, 3]
        """
        shape = self._concrete_shape()
        data = self._buffer().as_bytes()[:prod(shape) * self.dtype.itemsize]
        device = Device.DEFAULT if isinstance(self.device, str) and self.device.startswith("DISK:") else self.device
        return _unpickle_tensor, (data, self.dtype, shape, device, self.requires_grad, self.is_param)

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

    # ----- materializing, copies and devices (realize and data access: mixin/realize.py) -----
    def contiguous(self, **kwargs: Any) -> "Tensor":
        """A tensor whose data is materialized in row-major order (a realize point for the scheduler).
        Keyword arguments (tinygrad's kernel options) are accepted and ignored."""
        if is_contiguous_buffer(u := self.uop): return self
        return Tensor._wrap(node_of_shape(_CONTIGUOUS, u.dtype, (u,), None, u.shape, u.device), self)

    def detach(self) -> "Tensor":
        """The same values with no autograd history. Like torch, it shares the memory: writes through it reach self."""
        t = Tensor._wrap(UOp(Ops.DETACH, self.dtype, (self.uop,)))
        mark_view(t, self)
        return t

    def contiguous_backward(self) -> "Tensor":
        """The same values; its gradient is made contiguous (materialized) on the way back."""
        return custom_grad(self.detach(), [self], lambda g, x: (g.contiguous(),), "contiguous_backward")

    def shard(self, devices: Any, axis: int | None = None) -> "Tensor":
        """This tensor on several devices: split along `axis` into one slice per device, or whole on each (None).

        >>> t = Tensor([[1, 2], [3, 4]]).shard(("CPU", "CPU:1"), axis=0)
        >>> (t.device, (t + 1).tolist())
        (('CPU', 'CPU:1'), [[2, 3], [4, 5]])
        """
        return sharding.shard(self, devices, axis)
    def shard_(self, devices: Any, axis: int | None = None) -> "Tensor":
        """`shard` in place: this tensor now lives on `devices`."""
        self.uop = self.shard(devices, axis).uop
        return self
    def shard_like(self, y: "Tensor") -> "Tensor":
        """Shard like `y` (its devices and axis); a one-device `y` means `.to(y.device)`."""
        if not isinstance(y.device, tuple): return self.to(y.device)
        return self.shard(y.device, y.uop.arg if y.uop.op is Ops.MULTI else None)

    def replace(self, x: "Tensor") -> "Tensor":
        """Make this tensor compute what `x` computes (its graph node is swapped for x's); shapes must match."""
        if not isinstance(x, Tensor): raise TypeError(f"replace needs a Tensor, got {type(x).__name__}")
        if x.shape != self.shape: raise RuntimeError(f"replace: shape {x.shape} doesn't match {self.shape}")
        self.uop = x.uop
        return self

    def to(self, device: str | tuple[str, ...] | None) -> "Tensor":
        """This tensor on `device`; a tuple of devices puts a whole copy on each (see `shard` to split it).

        >>> Tensor([1, 2]).to(("CPU", "CPU:1")).device
        ('CPU', 'CPU:1')
        """
        device = _canonical_device(device, "to")
        if device == self.device: return self
        return Tensor._wrap(UOp(Ops.COPY, self.dtype, (self.uop,), device), self)

    def clone(self, device: str | None = None) -> "Tensor":
        device = _canonical_device(device, "clone") if device is not None else None
        # a clone is a new tensor with an identity of its own: two clones of equal constants (hash-consed to one node)
        # made trainable must not share a gradient
        return self.to(device) if device is not None and device != self.device \
            else Tensor._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,), next(unique_ids)), self)

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
        if t._view is None: mark_view(t, self)
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
            if match_dtype:   # the common case in one step: the constant made at x's shape (one tensor, not three)
                dt = least_upper_dtype(x.dtype, dt)
                x = x.cast(dt)
                yt = Tensor._wrap(build.const(y, dt, x.device, x.shape))
                return (yt, x) if reverse else (x, yt)
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
        shape = broadcast_shape(x.shape, yt.shape)
        return x._broadcast_to(shape), yt._broadcast_to(shape)

    _pair = _broadcasted   # (OpMixin's primitives: two operands, broadcast and promoted; and the ALU op of them)

    def _binop(self, op: Ops, y: "Tensor | ConstType", reverse: bool = False) -> "Tensor":
        a, b = self._broadcasted(y, reverse)
        return a._alu(op, b)

    def _broadcast_to(self, shape: tuple[int, ...]) -> "Tensor":
        s = self.shape
        if s == shape: return self
        if len(s) <= len(shape) and not (Tensor.no_grad and self.requires_grad):
            # the common case in one step (every elementwise op with a broadcast operand comes here): one new tensor
            # for the reshape and expand together; what reshape() then expand() would check and record, for less
            old = (1,) * (len(shape) - len(s)) + s
            if all(o.__class__ is int and n.__class__ is int and (o == n or o == 1) for o, n in zip(old, shape)):
                t = Tensor._wrap(self.uop.broadcast_to(shape), self)
                if t._view is None: mark_view(t, self)
                return t
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if self.ndim < len(shape) else self
        return x.expand(shape)

    def _alu(self, op: Ops, *others: "Tensor") -> "Tensor":
        return self._apply(lambda *us: build.alu(op, *us), *others)

    # ----- movement (views) -----
    def reshape(self, shape: Any, *args: int) -> "Tensor":
        """A view with a new shape; one dimension may be -1, and None keeps that axis's size (tinygrad's form).
        A size that doesn't match raises `ShapeError` (a ValueError, as in tinygrad, and a RuntimeError, as in torch).

        ```python
        Tensor.zeros(2, 3, 36).reshape(None, None, 6, 6).shape   # (2, 3, 6, 6)
        ```
        """
        new = argfix(shape, *args)
        if any(s is None for s in new):
            if len(new) > self.ndim and any(s is None for s in new[self.ndim:]):
                raise ShapeError(f"reshape {new}: None keeps an existing axis, but {self.shape} has only {self.ndim}")
            new = tuple(self.shape[i] if s is None else s for i, s in enumerate(new))
        if any(not isinstance(s, int) and not _is_sym_int(s) for s in new):
            raise TypeError(f"reshape takes ints, got {new}")
        new = canonical_shape(new)
        if new.count(-1) > 1: raise RuntimeError("only one dimension can be inferred")
        if -1 in new and not (all_static(new) and all_static(self.shape)):
            raise NotImplementedError(f"reshape to {new}: -1 with a symbolic shape ({self.shape}); give every size")
        if -1 in new:
            rest = prod(s for s in new if s != -1)
            if rest == 0 or self.numel() % rest:
                raise ShapeError(f"shape '{list(new)}' is invalid for input of size {self.numel()}")
            new = tuple(self.numel() // rest if s == -1 else s for s in new)
        if any(isinstance(s, int) and s < 0 for s in new) or not sym_eq(sprod(new), self.numel()):
            raise ShapeError(f"shape '{list(new)}' is invalid for input of size {self.numel()} (shape {self.shape})")
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
        new = tuple(o if n == -1 or n is None else n for o, n in zip(old, new))   # None: keep (tinygrad's form)
        for o, n in zip(old, new):
            if o != n and o != 1:
                raise ShapeError(f"The expanded size of the tensor ({n}) must match the existing size ({o}) at "
                                   f"non-singleton dimension: shape {self.shape} to {new}")
        return self.reshape(old)._view_apply(lambda u: build.expand(u, new)) if old != self.shape else \
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
            if len(flat) % 2:
                raise ShapeError(f"Padding length must be divisible by 2, got {padding} for shape {self.shape}")
            if len(flat) // 2 > self.ndim:
                raise ShapeError(f"Padding length {len(flat)} is more than two times the {self.ndim} dims of "
                                 f"{self.shape}")
            pairs = [(0, 0)] * self.ndim
            for i in range(len(flat) // 2): pairs[self.ndim - 1 - i] = (flat[2 * i], flat[2 * i + 1])
        else:
            if len(padding) != self.ndim:
                raise ShapeError(f"padding {padding} needs one entry per axis of {self.shape}")
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
        for ax, ((b, e), s) in enumerate(zip(a, self.shape)):
            if (known := shrink_bounds_known(b, e, s)): continue
            if known is False or all_static((b, e)):   # (an int bound on a symbolic axis must fit every size)
                raise BoundsError(f"shrink {arg} out of bounds for shape {self.shape}: ({b}, {e}) on dimension {ax}")
            # a symbolic bound in range for some values only (`t[:v]`, v's maximum past the axis): checked here when
            # its variables are bound, and for the values of every realize and TinyJit replay (schedule/variables.py)
            if is_bound(b) and is_bound(e) and is_bound(s) and (err := shrink_bounds_error([(ax, b, e, s)])):
                raise BoundsError(err)
        return self._view_apply(lambda u: build.shrink(u, a))

    def flip(self, axis: Any, *args: int) -> "Tensor":
        axes_list = [self._axis(a) for a in argfix(axis, *args)]
        if len(set(axes_list)) != len(axes_list):
            raise RuntimeError(f"dim can appear at most once in flip, got {axes_list}")
        axes = set(axes_list)
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

    # ----- autograd -----
    def backward(self, gradient: "Tensor | None" = None) -> "Tensor":
        """Fill `.grad` of every live float tensor in this one's graph, as tinygrad does: those with requires_grad
        True, and those with it unset (None; not False, and not a constant such as an unrealized `Tensor.zeros`, which
        shares its graph node with every equal constant). Gradients accumulate into an existing `.grad`. One in the
        graph that no gradient reaches (it only feeds a comparison, say) gets zeros, as in tinygrad.

        A gradient of a tensor whose requires_grad is unset is lazy like any result, but nobody asked for it: if it
        is still uncomputed when memory it reads is overwritten (an optimizer step writing the weights), it is dropped
        and that tensor's `.grad` becomes None, unless you hold it (`g = x.grad`), which keeps its value. Realize it
        first, or set requires_grad=True, to keep it past the step (docs/porting.md).

        >>> x, w = Tensor([1.0, 2.0]), Tensor([3.0, 4.0], requires_grad=True)
        >>> _ = (x * w).sum().backward()
        >>> x.grad.tolist(), w.grad.tolist()
        ([3.0, 4.0], [1.0, 2.0])
        """
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"grad can be implicitly created only for scalar outputs, got shape {self.shape}")
            gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        if gradient.shape != self.shape:
            raise RuntimeError(f"gradient shape {gradient.shape} doesn't match tensor shape {self.shape}")
        self._check_has_graph()
        root, rebuilt, back = _with_history_memo(self.uop)
        topo = autograd.graph_nodes(root)
        in_graph = set(topo)
        targets: dict[Tensor, UOp] = {}
        unrequested: set[Tensor] = set()
        for t in list(_all_tensors):
            if t.requires_grad is False or not dtypes.is_float(t.dtype) or t is gradient: continue
            u = lazy_of.get(t.uop, t.uop)
            if t.requires_grad is None:   # unset: only if it is in this graph, and not a constant (shared by value)
                if not (u in in_graph or t.uop in in_graph or leaf_of.get(t.uop) in in_graph) or _is_const(u): continue
                unrequested.add(t)
            targets[t] = u
        also = {rebuilt[t.uop] for t in targets if t.uop in rebuilt}   # (a pending write rebuilt on a history)
        grads = autograd.compute_gradient(root, gradient.uop, set(targets.values()) | {t.uop for t in targets} |
                                          {leaf_of[t.uop] for t in targets if t.uop in leaf_of} | also, topo)
        grads = _back_to_originals(grads, back)
        for t, u in targets.items():
            nodes = dict.fromkeys((u, t.uop, leaf_of.get(t.uop, u), rebuilt.get(t.uop, u)))
            found = [grads[x] for x in nodes if x in grads]
            if not found:
                if not any(x in in_graph for x in nodes): continue   # not in this graph: .grad stays as it was
                g = t.zeros_like()                                   # in the graph, but no gradient reaches it
            else: g = Tensor._wrap(found[0] if len(found) == 1 else build.alu(Ops.ADD, *found))
            if g.dtype != t.dtype: g = g.cast(t.dtype)
            t.grad = g if t.grad is None else (t.grad + g)
            if t in unrequested: storage.note_unrequested(t.grad, t)
        return self

    def gradient(self, *targets: "Tensor", gradient: "Tensor | None" = None) -> list["Tensor"]:
        """Gradients of self with respect to each target (without touching .grad)."""
        g = gradient if gradient is not None else Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        self._check_has_graph()
        root, back = _with_history(self.uop)
        tu = [lazy_of.get(t.uop, t.uop) for t in targets]
        grads = _back_to_originals(autograd.compute_gradient(root, g.uop, set(tu)), back)
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


storage.register_tensor_class(Tensor)   # (lower modules make tensors through storage.tensor_class)


def wrap_node(u: UOp, *parents: Tensor) -> Tensor:
    """A new Tensor for node `u` computed from `parents` (its autograd flags follow theirs, as for any op)."""
    return Tensor._wrap(u, *parents)


def _unpickle_tensor(data: bytes, dtype: DType, shape: tuple[int, ...], device: str, requires_grad: bool | None,
                     is_param: bool) -> Tensor:
    """Rebuild a pickled Tensor (see Tensor.__reduce__); the byte count is checked against dtype and shape."""
    t = Tensor._wrap(Tensor._from_bytes(bytes(data), dtype, tuple(shape), Device.canonicalize(device)))
    t.requires_grad, t.is_param = requires_grad, bool(is_param)
    if requires_grad: t.uop = _make_unique(t.uop)
    return t


__all__ = ["Tensor", "make_tuple", "wrap_node"]
