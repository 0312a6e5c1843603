"""High-level movement and indexing for Tensor: cat/stack/split, repeat, windows (`_pool`), torch-style `__getitem__`
with advanced (tensor) indexing, `__setitem__`, gather/scatter and masks. All views are free: they become index math.
Data-dependent lookups use the GATHER op, which costs O(output) (no one-hot over the source).
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Sequence, TYPE_CHECKING

from fusegrad import storage
from fusegrad.device import Buffer
from fusegrad.dtype import dtypes, least_upper_dtype
from fusegrad.engine.capture import note_assign
from fusegrad.helpers import CHECK_OOB, JoinShapeError, ShapeError, argfix, prod
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.shape import broadcast_shape, canonical, sadd, smax, sprod, ssub
from fusegrad.mixin.rearrange import rearrange
from fusegrad.sharding import empty_like
from fusegrad.storage import buffer_uop, buffer_view, is_contiguous_buffer
from fusegrad.views import assign_owner, disk_assign, mark_view, refresh_views, view_chain, write_through

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


def pool_uop(u: Any, k_: tuple[int, ...], st: tuple[int, ...], dl: tuple[int, ...]) -> tuple[Any, bool]:
    """The node of `Tensor._pool` over the last len(k_) axes of node `u`, and whether it pads (so is not a view)."""
    base, padded = len(u.shape) - len(k_), False

    def move(u, src: int, dst: int):
        order = list(range(len(u.shape)))
        order.insert(dst, order.pop(src))
        return build.permute(u, order)
    for j, (k, s, d) in enumerate(zip(k_, st, dl)):
        ax = base + j
        xt = move(u, ax, len(u.shape) - 1)                              # (lead..., i)
        lead, i = xt.shape[:-1], xt.shape[-1]
        o = (i - d * (k - 1) - 1) // s + 1
        if o <= 0: raise RuntimeError(f"window {k} (dilation {d}) is larger than the input size {i}")
        keep = [(0, v) for v in lead]
        if d == 1 and s >= k:
            # windows that don't overlap (max_pool2d's default stride == kernel): a reshape into rows of s, each
            # cut to its first k. No repeated copy, so the gradient is a plain reshape too (no masked re-reads)
            if o * s > i: xt, padded = build.pad(xt, [(0, 0)] * len(lead) + [(0, o * s - i)]), True
            else: xt = build.shrink(xt, keep + [(0, o * s)])
            w = build.reshape(xt, lead + (o, s))
            if s > k: w = build.shrink(w, keep + [(0, o), (0, k)])
            u = move(w, len(w.shape) - 2, ax)
            continue
        extra = max(0, o * s - i - d)                                  # so that row length i+d covers o*s
        if extra: xt, padded = build.pad(xt, [(0, 0)] * len(lead) + [(0, extra)]), True
        i2 = i + extra
        w = build.reshape(build.expand(build.reshape(xt, lead + (1, i2)), lead + (k, i2)), lead + (k * i2,))
        w = build.reshape(build.pad(w, [(0, 0)] * len(lead) + [(0, k * d)]), lead + (k, i2 + d))
        padded = True
        w = build.reshape(build.shrink(w, keep + [(0, k), (0, o * s)]), lead + (k, o, s))
        w = build.reshape(build.shrink(w, keep + [(0, k), (0, o), (0, 1)]), lead + (k, o))
        w = move(w, len(w.shape) - 1, len(w.shape) - 2)                  # (lead..., o, k)
        u = move(w, len(w.shape) - 2, ax)                               # o back in place, windows stay last
    return u, padded


class MovementMixin:
    __slots__ = ()

    # ----- combining and splitting -----
    def cat(self: Any, *args: "Tensor", dim: int = 0) -> "Tensor":
        """Join tensors along axis `dim`: `a.cat(b, c)`, `Tensor.cat(a, b, c)`, or torch's `Tensor.cat([a, b, c])`
        (any list, tuple or generator of tensors).

        ```python
        Tensor.cat([Tensor([1]), Tensor([2, 3])]).tolist()   # [1, 2, 3]
        ```
        """
        ts = _tensor_list(self, args, "cat")
        self = ts[0]
        ax = self._axis(dim)
        for t in ts:
            if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != ax):
                raise JoinShapeError(f"Sizes of tensors must match except in dimension {ax}: got {self.shape} and "
                                     f"{t.shape}")
        dt = least_upper_dtype(*[t.dtype for t in ts])
        total = functools.reduce(sadd, [t.shape[ax] for t in ts], 0)
        out, off = None, 0
        for t in ts:
            pads = [(0, 0)] * self.ndim
            pads[ax] = (off, ssub(ssub(total, off), t.shape[ax]))
            p = t.cast(dt).pad(pads)
            out = p if out is None else out + p
            off = sadd(off, t.shape[ax])
        assert out is not None
        return out

    def stack(self: Any = None, *args: "Tensor", dim: int = 0) -> "Tensor":
        """Join tensors of one shape along a new axis `dim`: `a.stack(b, c)`, `Tensor.stack(a, b, c)` or
        `Tensor.stack([a, b, c])` (any list, tuple or generator; a method, as in tinygrad: `a.stack(b)` includes a).

        ```python
        Tensor.stack(Tensor([i, i]) for i in range(3)).shape   # (3, 2)
        ```
        """
        ts = _tensor_list(self, args, "stack")
        if any(t.shape != ts[0].shape for t in ts):
            raise JoinShapeError(f"stack expects each tensor to be equal size, got {[t.shape for t in ts]}")
        ax = ts[0]._axis(dim, ts[0].ndim + 1)
        return ts[0].unsqueeze(ax).cat(*[t.unsqueeze(ax) for t in ts[1:]], dim=ax)

    def split(self: "Tensor", sizes: int | Sequence[int], dim: int = 0) -> "tuple[Tensor, ...]":
        ax = self._axis(dim)
        n = self.shape[ax]
        if isinstance(sizes, int):
            if sizes <= 0: raise RuntimeError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, max(n, 1), sizes)] if n else [0]
        if sum(sizes) != n: raise RuntimeError(f"split sizes {list(sizes)} don't sum to dimension {ax} of size {n}")
        out, off = [], 0
        for s in sizes:
            sl = [(0, d) for d in self.shape]
            sl[ax] = (off, off + s)
            out.append(self.shrink(sl))
            off += s
        return tuple(out)

    def chunk(self: "Tensor", chunks: int, dim: int = 0) -> "tuple[Tensor, ...]":
        if chunks <= 0: raise RuntimeError(f"chunk expects a positive number of chunks, got {chunks}")
        n = self.shape[self._axis(dim)]
        if n == 0: return self.split([0] * chunks, dim)   # `chunks` empty pieces, as torch and tinygrad give
        return self.split(-(-n // chunks), dim)

    def repeat(self: "Tensor", repeats: Any, *args: int) -> "Tensor":
        """Tile the tensor `repeats[i]` times along axis i. Fewer repeats than axes repeat the last axes (the others
        once), as tinygrad and `np.tile` do (PyTorch raises); more add leading axes. A negative repeat raises."""
        reps = tuple(argfix(repeats, *args))
        if any(not isinstance(r, UOp) and (not hasattr(r, "__index__") or r < 0) for r in reps):
            raise ShapeError(f"repeats must be non-negative ints, got {reps}")
        reps = (1,) * (self.ndim - len(reps)) + tuple(r if isinstance(r, UOp) else int(r) for r in reps)
        x = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
        shape = x.shape
        x = x.reshape(tuple(v for s in shape for v in (1, s)))
        x = x.expand(tuple(v for r, s in zip(reps, shape) for v in (r, s)))
        # built from views, but a new tensor (as in torch): a write to it must not reach self
        return type(self)._wrap(x.reshape(tuple(r * s for r, s in zip(reps, shape))).uop, self)

    def repeat_interleave(self: "Tensor", repeats: int, dim: int | None = None) -> "Tensor":
        x = self.flatten() if dim is None else self
        ax = 0 if dim is None else x._axis(dim)
        s = x.shape
        x = x.unsqueeze(ax + 1).expand(s[:ax + 1] + (repeats,) + s[ax + 1:])
        return type(self)._wrap(x.reshape(s[:ax] + (s[ax] * repeats,) + s[ax + 1:]).uop, self)   # a new tensor

    def unflatten(self: "Tensor", dim: int, sizes: tuple[int, ...]) -> "Tensor":
        ax = self._axis(dim)
        sizes = tuple(sizes)
        if -1 in sizes:
            rest = prod(s for s in sizes if s != -1)
            sizes = tuple(self.shape[ax] // rest if s == -1 else s for s in sizes)
        return self.reshape(self.shape[:ax] + sizes + self.shape[ax + 1:])

    def shrink_to(self: "Tensor", shape: Any, *args: int) -> "Tensor":
        """Keep the first `shape[i]` elements of each axis (None keeps the axis whole, as in tinygrad).

        ```python
        Tensor.zeros(4, 5).shrink_to(None, 2).shape   # (4, 2)
        ```
        """
        new = argfix(shape, *args)
        if len(new) != self.ndim: raise ShapeError(f"shrink_to {new} needs one size per axis of {self.shape}")
        return self.shrink([None if s is None else (0, s) for s in new])

    def pad_to(self: "Tensor", shape: Any, *args: int, value: float = 0) -> "Tensor":
        """Pad each axis at its end up to `shape[i]` (None keeps the axis as is, as in tinygrad).

        ```python
        Tensor.ones(2, 3).pad_to(None, 5).shape   # (2, 5)
        ```
        """
        new = argfix(shape, *args)
        if len(new) != self.ndim: raise ShapeError(f"pad_to {new} needs one size per axis of {self.shape}")
        return self.pad([(0, 0 if n is None else n - s) for s, n in zip(self.shape, new)], value=value)

    def roll(self: "Tensor", shifts: int | tuple[int, ...], dims: int | tuple[int, ...] | None = None) -> "Tensor":
        if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
        sh = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        ds = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(sh) != len(ds): raise RuntimeError(f"roll: shifts {sh} and dims {ds} must have the same length")
        x = self
        for s, d in zip(sh, ds):
            ax = x._axis(d)
            n = x.shape[ax]
            if n == 0: continue
            s %= n
            if s == 0: continue
            a, b = x.split([n - s, s], ax)
            x = b.cat(a, dim=ax)
        return x

    def diagonal(self: "Tensor", offset: int = 0, dim1: int = 0, dim2: int = 1) -> "Tensor":
        d1, d2 = self._axis(dim1), self._axis(dim2)
        if d1 == d2: raise RuntimeError(f"diagonal dimensions cannot be identical, got {dim1} and {dim2}")
        order = [i for i in range(self.ndim) if i not in (d1, d2)] + [d1, d2]
        x = self.permute(order)
        n1, n2 = x.shape[-2], x.shape[-1]
        if offset >= 0: x = x.shrink([(0, s) for s in x.shape[:-1]] + [(min(offset, n2), n2)])
        else: x = x.shrink([(0, s) for s in x.shape[:-2]] + [(min(-offset, n1), n1), (0, n2)])
        n = min(x.shape[-2], x.shape[-1])
        x = x.shrink([(0, s) for s in x.shape[:-2]] + [(0, n), (0, n)])
        # take the diagonal of an n x n block: flatten, pad by n, reshape (n, n+1), keep column 0
        lead = x.shape[:-2]
        flat = x.reshape(lead + (n * n,)).pad([(0, 0)] * len(lead) + [(0, n)])
        return flat.reshape(lead + (n, n + 1)).shrink([(0, s) for s in lead] + [(0, n), (0, 1)]).reshape(lead + (n,))

    def diag(self: "Tensor") -> "Tensor":
        if self.ndim == 1:
            n = self.shape[0]
            return self.unsqueeze(1).pad([(0, 0), (0, n)]).flatten().shrink([(0, n * n)]).reshape(n, n) \
                if n else self.reshape(0, 0)
        if self.ndim == 2: return self.diagonal()
        raise RuntimeError(f"diag expects a 1-d or 2-d tensor, got shape {self.shape}")

    def meshgrid(self: Any, *args: "Tensor", indexing: str = "ij") -> "tuple[Tensor, ...]":
        """Coordinate grids from 1-d tensors: `Tensor.meshgrid(x, y)`, `x.meshgrid(y)` (tinygrad's method form) or
        `Tensor.meshgrid([x, y])`. `indexing="xy"` swaps the first two axes.

        ```python
        gx, gy = Tensor([1, 2]).meshgrid(Tensor([3, 4, 5]))   # both (2, 3)
        ```
        """
        if indexing not in ("ij", "xy"): raise RuntimeError(f"indexing must be 'ij' or 'xy', got {indexing!r}")
        ts = _tensor_list(self, args, "meshgrid")
        # 'xy' is 'ij' with the first two inputs swapped (so the first axis runs along the second input), and their
        # outputs swapped back
        swap = indexing == "xy" and len(ts) >= 2
        if swap: ts[0], ts[1] = ts[1], ts[0]
        shape = tuple(t.numel() for t in ts)
        out = [t.reshape(tuple(-1 if i == k else 1 for i in range(len(ts)))).expand(shape) for k, t in enumerate(ts)]
        if swap: out[0], out[1] = out[1], out[0]
        return tuple(out)

    def unfold(self: "Tensor", dim: int, size: int, step: int) -> "Tensor":
        ax = self._axis(dim)
        if size > self.shape[ax]: raise RuntimeError(f"unfold size {size} exceeds dimension {ax} of size {self.shape[ax]}")
        x = self.transpose(ax, -1) if ax != self.ndim - 1 else self
        w = x._pool((size,), step)                                     # (..., n_windows, size)
        return w.transpose(ax, -2) if ax != self.ndim - 1 else w

    def _pool(self: "Tensor", k_: tuple[int, ...], stride: int | tuple[int, ...] = 1,
              dilation: int | tuple[int, ...] = 1) -> "Tensor":
        """Sliding windows over the last len(k_) axes: (..., *spatial) -> (..., *out_spatial, *k_), all as views.

        For one axis of size i, window k, stride s, dilation d, out o = (i - d(k-1) - 1)//s + 1 and
        w[kk, oo] = x[oo*s + kk*d]: repeat x k times, then re-read the flat copy with rows of length i+d, so row kk
        starts kk*d further along; columns oo*s then pick the stride. Windows that don't overlap (d == 1, s >= k) are
        a reshape into rows of s instead."""
        n = len(k_)
        st = (stride,) * n if isinstance(stride, int) else tuple(stride)
        dl = (dilation,) * n if isinstance(dilation, int) else tuple(dilation)
        # built on the graph nodes directly (one Tensor for the result, not one per step: a conv's unfold took a
        # third of an eager EfficientNet call's graph building); autograd works on the nodes alike
        u, padded = pool_uop(self.uop, k_, st, dl)
        t = type(self)._wrap(u, self)
        if not padded and t._view is None:   # only view ops: a view of self, as the step-by-step form made it
            mark_view(t, self)
        return t

    def _move_axis(self: "Tensor", src: int, dst: int) -> "Tensor":
        order = list(range(self.ndim))
        order.insert(dst, order.pop(src))
        return self.permute(order) if order != list(range(self.ndim)) else self

    # ----- data-dependent indexing -----
    def gather(self: "Tensor", dim: int, index: "Tensor") -> "Tensor":
        """out[i][j] = self[index[i][j]][j] (dim=0), as torch.gather."""
        ax = self._axis(dim)
        if index.ndim != self.ndim:
            raise RuntimeError(f"Index tensor must have the same number of dimensions as input tensor: {index.shape} vs {self.shape}")
        if not dtypes.is_int(index.dtype): raise RuntimeError(f"gather(): Expected dtype int64 for index, got {index.dtype}")
        if index.device != self.device:   # (the kernel would get another device's memory: a ctypes error, or worse)
            raise RuntimeError(f"gather(): Expected all tensors to be on the same device, but found {self.device} and "
                               f"{index.device} (index)")
        for d, (i, s) in enumerate(zip(index.shape, self.shape)):
            if d != ax and i > s: raise RuntimeError(f"Size does not match at dimension {d} expected index {index.shape} to be no larger than self {self.shape} apart from dimension {ax}")
        _check_oob(index, self.shape[ax], ax)
        idx = _wrap_negative(index, self.shape[ax])
        return self._wrap(UOp(Ops.GATHER, self.dtype, (self.uop, idx.uop), ax), self)

    def _index_tensor(self: "Tensor", ax: int, idx: "Tensor") -> "Tensor":
        """self with axis `ax` replaced by the dims of `idx` (each value picks a position along ax)."""
        pre, n, post = self.shape[:ax], self.shape[ax], self.shape[ax + 1:]
        bs = idx.shape if idx.ndim else (1,)
        x2 = self.reshape(pre + (n,) + (1,) * (len(bs) - 1) + post).expand(pre + (n,) + bs[1:] + post)
        i2 = idx.reshape((1,) * len(pre) + bs + (1,) * len(post)).expand(pre + bs + post)
        out = x2.gather(ax, i2)
        return out if idx.ndim else out.reshape(pre + post)

    def __getitem__(self: "Tensor", indices: Any) -> "Tensor":
        """torch-style indexing: ints, slices (any step), None, Ellipsis, and int/bool tensors or lists (advanced)."""
        Tensor = type(self)
        idx = list(indices) if isinstance(indices, tuple) else [indices]
        # normalize: lists -> tensors, bool tensors -> their nonzero positions
        norm: list[Any] = []
        for i in idx:
            if isinstance(i, (list, tuple)) or (type(i).__module__ == "numpy" and hasattr(i, "shape")):
                i = Tensor(i, device=self.device) if len(i) else Tensor([], dtype=dtypes.int32, device=self.device)
                if dtypes.is_float(i.dtype) and i.numel(): raise IndexError("tensors used as indices must be long, int or bool")
                if i.numel() == 0: i = i.cast(dtypes.int32)
            # an index tensor on another device is read from this one (torch takes CPU indices for any device)
            if isinstance(i, Tensor) and i.device != self.device: i = i.to(self.device)
            if isinstance(i, Tensor) and dtypes.is_bool(i.dtype):
                nz = i.nonzero()
                norm.extend(nz[:, k] for k in range(i.ndim))
                continue
            if isinstance(i, Tensor) and dtypes.is_float(i.dtype):
                raise IndexError("tensors used as indices must be long, int or bool")
            if isinstance(i, bool): i = int(i)
            norm.append(i)
        n_real = sum(1 for i in norm if i is not None and i is not Ellipsis)
        if sum(1 for i in norm if i is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
        if n_real > self.ndim: raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
        if any(i is Ellipsis for i in norm):
            k = next(j for j, i in enumerate(norm) if i is Ellipsis)
            norm = norm[:k] + [slice(None)] * (self.ndim - n_real) + norm[k + 1:]
        else:
            norm += [slice(None)] * (self.ndim - n_real)
        # basic indexing first, keeping tensor-indexed axes whole; remember where every output axis came from
        basic = [slice(None) if isinstance(i, Tensor) else i for i in norm]
        x = self._basic_index(basic)
        tens, out_ax = [], 0
        for i in norm:
            if isinstance(i, int): continue
            if isinstance(i, Tensor): tens.append((out_ax, i))
            out_ax += 1
        if not tens: return x
        # advanced: broadcast the index tensors, merge their axes into one flat index
        shapes = [t.shape for _, t in tens]
        bshape = broadcast_shape(*shapes)
        axes = [a for a, _ in tens]
        adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
        order = axes + [a for a in range(x.ndim) if a not in axes]
        xp = x.permute(order) if order != list(range(x.ndim)) else x
        sizes = [x.shape[a] for a in axes]
        # each index is checked against its own axis before the merge: flattened, [0, 5] into a (3, 4) would read row 1
        # with a 64-bit index the flat math stays 64-bit, so no index is truncated to 32 bits
        idt = dtypes.int64 if any(t.dtype.itemsize > 4 or t.dtype == dtypes.uint32 for _, t in tens) else dtypes.int32
        flat, bad = None, None
        for (a, t), n in zip(tens, sizes):
            _check_oob(t, n, a)
            ti = t.cast(idt) if t.dtype != idt else t
            out_of_range = (ti < -n) | (ti >= n)
            ti = _wrap_negative(ti, n)._broadcast_to(bshape)
            out_of_range = out_of_range._broadcast_to(bshape)
            flat = ti if flat is None else flat * n + ti
            bad = out_of_range if bad is None else bad | out_of_range
        assert flat is not None and bad is not None
        # any axis out of range: a flat index past the end, which gathers 0 (and which _setitem_advanced drops)
        flat = bad.where(prod(sizes), flat)
        xm = xp.reshape((prod(sizes),) + xp.shape[len(axes):])
        out = xm._index_tensor(0, flat)                       # bshape + rest
        if adjacent and axes[0] != 0:
            nb = len(bshape)
            rest_before = axes[0]
            perm = list(range(nb, nb + rest_before)) + list(range(nb)) + list(range(nb + rest_before, out.ndim))
            out = out.permute(perm)
        return out

    def _basic_index(self: "Tensor", idx: list[Any]) -> "Tensor":
        """Ints, slices and None only (len(idx) covers every axis plus the Nones)."""
        bounds, flips, squeeze, steps = [], [], [], []
        ax = 0
        for i in idx:
            if i is None: continue
            s = self.shape[ax]
            if _symbolic_index(i, s):
                bounds.append(_symbolic_bounds(i, s, ax)); flips.append(False); steps.append(1)
                if not isinstance(i, slice): squeeze.append(ax)
            elif isinstance(i, int):
                if not -s <= i < s: raise IndexError(f"index {i} is out of bounds for dimension {ax} with size {s}")
                i = i + s if i < 0 else i
                bounds.append((i, i + 1)); squeeze.append(ax); steps.append(1); flips.append(False)
            elif isinstance(i, slice):
                start, stop, step = i.indices(s)
                n = len(range(start, stop, step))
                if step < 0:
                    lo = start + (n - 1) * step if n else 0
                    bounds.append((lo, lo + (n - 1) * -step + 1) if n else (0, 0)); flips.append(True); steps.append(-step)
                else:
                    bounds.append((start, start + (n - 1) * step + 1) if n else (0, 0)); flips.append(False)
                    steps.append(step)
            else:
                raise IndexError(f"unsupported index type {type(i).__name__}")
            ax += 1
        x = self.shrink(bounds)
        if any(flips): x = x.flip([a for a, f in enumerate(flips) if f])
        if any(st != 1 for st in steps):  # stride: pad to a multiple of the step, split, keep index 0
            ns = [-(-s // st) for s, st in zip(x.shape, steps)]
            x = x.pad([(0, n * st - s) for s, st, n in zip(x.shape, steps, ns)])
            x = x.reshape(tuple(v for n, st in zip(ns, steps) for v in (n, st)))
            x = x.shrink([p for n in ns for p in ((0, n), (0, 1))]).reshape(ns)
        kept = [s for a, s in enumerate(x.shape) if a not in squeeze]
        out_shape, k = [], 0
        ax = 0
        for i in idx:
            if i is None: out_shape.append(1)
            elif not isinstance(i, slice): ax += 1   # an int (or a symbolic int) index drops its axis
            else:
                out_shape.append(kept[k]); k += 1; ax += 1
        out = x.reshape(out_shape + kept[k:])
        # a strided slice pads before it reshapes, and a pad alone is no view: the whole selection still is one
        if view_chain(out.uop, self.uop) is not None: mark_view(out, self)
        return out

    def __setitem__(self: "Tensor", indices: Any, v: Any) -> None:
        """In-place assignment through an index, like torch. Basic indices (ints, slices of any step, None, ...) write
        through the view they select; tensor or list indices scatter into the selected positions.

        A Tensor value must have self's dtype, as in tinygrad (`RuntimeError` otherwise; PyTorch casts silently); a
        Python number, a list or a 0-d tensor made from a bare Python number is converted to self's dtype."""
        if isinstance(v, type(self)) and v.dtype != self.dtype and not v._weak:
            raise RuntimeError(f"setitem dtype mismatch: self.dtype={self.dtype} != v.dtype={v.dtype} (cast the value "
                               "first)")
        if _is_basic(indices): self[indices].assign(v)
        else: self._setitem_advanced(indices, v)

    def _setitem_advanced(self: "Tensor", indices: Any, v: Any) -> None:
        """Assignment through any index, advanced (tensor/list) indices included: a scatter of the flat positions."""
        Tensor = type(self)
        numel = self.numel()
        # positions count from 1 so that an out-of-range index (which reads 0) becomes -1: moved to numel, past the
        # end, where scatter drops the write instead of landing on element 0
        pdt = dtypes.int64 if numel >= 2**31 - 1 else dtypes.int32
        pos = Tensor.arange(1, numel + 1, device=self.device, dtype=pdt).reshape(self.shape)
        sel = pos[indices] - 1                               # flat positions of the selected elements
        sel = (sel < 0).where(numel, sel)
        vals = v if isinstance(v, Tensor) else Tensor(v, device=self.device, dtype=self.dtype)
        vals = vals.cast(self.dtype)._broadcast_to(sel.shape) if vals.shape != sel.shape else vals.cast(self.dtype)
        flat = self.flatten()
        new = flat.scatter(0, sel.flatten(), vals.flatten())
        self.assign(new.reshape(self.shape))

    def assign(self: "Tensor", x: Any) -> "Tensor":
        """Write `x` into this tensor (in place, like torch's `copy_`): every reference to it, and every view of its
        memory, sees the new value; lazy tensors built before keep the value they were built with. Writing to a view
        (a slice, transpose, reshape, flip, detach or same-size bitcast of another tensor) writes into that tensor."""
        Tensor = type(self)
        if isinstance(self.device, str) and self.device.startswith("DISK:"):   # a write into a file: views.disk_assign
            return disk_assign(self, x)
        if not isinstance(x, Tensor): x = Tensor(x, device=self.device, dtype=self.dtype)
        if x.shape != self.shape: x = x._broadcast_to(self.shape) if x.ndim <= self.ndim else x
        if x.shape != self.shape: raise RuntimeError(f"assign shape mismatch {x.shape} != {self.shape}")
        if x.device != self.device: raise RuntimeError(f"assign device mismatch {x.device} != {self.device}")
        val = x.cast(self.dtype)
        if self._view is not None and (chain := view_chain(self.uop, self._view[1])) is not None:
            base, b0 = self._view
            if base.uop is b0:   # a write through a view: the base takes the new values where the view maps
                base.assign(Tensor._wrap(write_through(chain, val.uop, b0, self.shape), base, val) if chain else val)
                return self
        if val.uop is self.uop: return self
        # write into this tensor's own memory (after any pending write), so every holder of it and a TinyJit replay
        # see the new value. A tensor without memory yet (a constant, a lazy value) gets some: like a torch tensor,
        # it then has storage that later writes (and replays of them) update
        # a tensor of its own (a parameter's initial value) computed as part of another graph holds that memory: the
        # graphs that read it there (a TinyJit capture) see the write
        if self.uop.op is Ops.CONTIGUOUS and type(self.uop.arg) is int and \
           (done := storage.realized.get(self.uop)) is not None and done.base.op is Ops.BUFFER:
            self.uop = done
            storage.claim(self)
        # (memory another tensor owns, which this one only reads, is not written: this tensor gets memory of its own)
        if self.uop.op is Ops.ASSIGN or (is_contiguous_buffer(self.uop) and storage.owns(self)): target = self.uop
        else:
            if isinstance(self.device, tuple):   # on several devices: a buffer on each (fusegrad/sharding.py)
                target = empty_like(self.uop)
            else: target = buffer_view(buffer_uop(Buffer(self.device, smax(sprod(self.shape)), self.dtype)), self.shape)
        self.uop = UOp(Ops.ASSIGN, self.dtype, (target, val.uop), next(storage.unique_ids))
        storage.claim(self)
        assign_owner[self.uop] = weakref.ref(self)
        note_assign(self)
        # a leaf that requires grad stays a leaf, its gradient taken at its new value (torch's `with no_grad(): w -= ...`;
        # an optimizer step written without detach must not make the next backward() differentiate through it)
        self._derived = x._derived and not (self.requires_grad and not self._derived)
        refresh_views(self)
        return self

    def scatter(self: "Tensor", dim: int, index: "Tensor", src: Any, reduce: str | None = None) -> "Tensor":
        """out[index[i][j]][j] = src[i][j] (dim=0); with reduce='add'/'multiply' combine instead of replace."""
        Tensor = type(self)
        ax = self._axis(dim)
        if reduce not in (None, "add", "multiply"):
            raise RuntimeError(f"reduce argument must be 'add' or 'multiply', got {reduce!r}")
        srct = src if isinstance(src, Tensor) else Tensor.full(index.shape, src, dtype=self.dtype, device=self.device)
        _check_scatter_args("scatter", self, ax, index, srct)
        srct = srct.shrink([(0, s) for s in index.shape]) if srct.shape != index.shape else srct
        n = self.shape[ax]
        _check_oob(index, n, ax)
        idx = _wrap_negative(index, n)      # full width: out-of-range indices hit no position, so writes are dropped
        # hit[..., i, j] (i over index positions along ax, j over self positions along ax)
        it, st = idx.unsqueeze(-1), srct.cast(self.dtype).unsqueeze(-1)
        jt = Tensor.arange(n, device=self.device)
        it_m = it.transpose(ax, -2) if ax != self.ndim - 1 else it         # (..., i, 1)
        st_m = st.transpose(ax, -2) if ax != self.ndim - 1 else st
        hit = it_m == jt                                                   # (..., i, j)
        pads = [(0, s - i) for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != ax]
        moved_self = self.transpose(ax, -1) if ax != self.ndim - 1 else self  # (..., j)
        lead = moved_self.shape[:-1]
        if reduce is None:
            # last writer wins: pick the value of the largest i that hits j
            m = hit.shape[-2]
            iv = Tensor.arange(1, m + 1, device=self.device).reshape(m, 1)
            win = hit.where(iv, 0).max(-2, keepdim=True)                    # (..., 1, j)
            chosen = (hit & (iv == win)).where(st_m, 0).sum(-2)               # (..., j)
            any_hit = (win > 0).squeeze(-2)
            chosen, any_hit = _pad_lead(chosen, pads, lead), _pad_lead(any_hit, pads, lead)
            out = any_hit.where(chosen.cast(self.dtype), moved_self)
        elif reduce == "add":
            out = moved_self + _pad_lead(hit.where(st_m, 0).sum(-2).cast(self.dtype), pads, lead)
        elif reduce == "multiply":
            out = moved_self * _pad_lead(hit.where(st_m, 1).prod(-2).cast(self.dtype), pads, lead, value=1)
        return out.transpose(ax, -1) if ax != self.ndim - 1 else out

    def scatter_reduce(self: "Tensor", dim: int, index: "Tensor", src: "Tensor", reduce: str,
                       include_self: bool = True) -> "Tensor":
        Tensor = type(self)
        ax = self._axis(dim)
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise RuntimeError(f"reduce argument must be one of sum, prod, mean, amax, amin, got {reduce!r}")
        if not isinstance(src, Tensor): raise TypeError(f"scatter_reduce takes a Tensor src, got {type(src).__name__}")
        _check_scatter_args("scatter_reduce", self, ax, index, src)
        n = self.shape[ax]
        _check_oob(index, n, ax)
        idx = _wrap_negative(index, n)
        it = idx.unsqueeze(-1)
        it_m = it.transpose(ax, -2) if ax != self.ndim - 1 else it
        st = src.shrink([(0, s) for s in index.shape]).cast(self.dtype).unsqueeze(-1)
        st_m = st.transpose(ax, -2) if ax != self.ndim - 1 else st
        hit = it_m == Tensor.arange(n, device=self.device)
        ms = self.transpose(ax, -1) if ax != self.ndim - 1 else self
        lead = ms.shape[:-1]
        pads = [(0, s - i) for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != ax]
        cnt = _pad_lead(hit.cast(dtypes.int32).sum(-2), pads, lead)
        has = cnt > 0
        if reduce in ("sum", "mean"):
            tot = _pad_lead(hit.where(st_m, 0).sum(-2).cast(self.dtype), pads, lead)
            if include_self: tot = tot + ms
            if reduce == "sum": out = tot if include_self else has.where(tot, ms)
            else:
                c = cnt + (1 if include_self else 0)
                out = has.where(tot / c.maximum(1).cast(tot.dtype), ms)
                if dtypes.is_int(self.dtype): out = has.where((tot // c.maximum(1)).cast(self.dtype), ms)
        elif reduce == "prod":
            p = _pad_lead(hit.where(st_m, 1).prod(-2).cast(self.dtype), pads, lead, value=1)
            out = p * ms if include_self else has.where(p, ms)
        elif reduce in ("amax", "amin"):
            big = dtypes.min(self.dtype) if reduce == "amax" else dtypes.max(self.dtype)
            sv = st_m if reduce == "amax" else -st_m
            r = hit.where(sv, big if reduce == "amax" else -big).max(-2)
            r = _pad_lead(r if reduce == "amax" else -r, pads, lead, value=big)
            out = (r.maximum(ms) if reduce == "amax" else r.minimum(ms)) if include_self else has.where(r, ms)
        else: raise AssertionError(reduce)   # checked above
        out = out.cast(self.dtype)
        return out.transpose(ax, -1) if ax != self.ndim - 1 else out

    def masked_fill(self: "Tensor", mask: "Tensor", value: Any) -> "Tensor":
        return mask.where(value, self)

    def nonzero(self: "Tensor", size: int | None = None, fill_value: int = 0) -> "Tensor":
        """Indices of nonzero elements, (count, ndim). The count is data-dependent, so this realizes."""
        Tensor = type(self)
        flags = (self != 0).flatten().cast(dtypes.int32)
        total = int(flags.sum().item()) if size is None else size
        if self.numel() == 0 or total == 0:
            return Tensor.full((total, self.ndim), fill_value, dtype=dtypes.int32, device=self.device) if total else \
                Tensor.zeros(0, self.ndim, dtype=dtypes.int32, device=self.device)
        if self.ndim == 0: return Tensor.zeros(total, 0, dtype=dtypes.int32, device=self.device)
        pos = flags.cumsum(0) - 1                                # output slot of each nonzero element
        k = Tensor.arange(total, device=self.device).reshape(total, 1)
        hit = (pos.reshape(1, -1) == k) & (flags.reshape(1, -1) == 1)   # (total, numel)
        flat_idx = hit.where(Tensor.arange(self.numel(), device=self.device).reshape(1, -1), 0).sum(1)
        found = hit.any(1)
        cols = []
        for d in range(self.ndim):
            stride = prod(self.shape[d + 1:])
            cols.append((flat_idx // stride) % self.shape[d])
        out = Tensor.stack(*cols, dim=1) if cols else flat_idx.reshape(total, 0)
        return found.unsqueeze(1).where(out, fill_value).cast(dtypes.int32)

    def masked_select(self: "Tensor", mask: "Tensor", size: int | None = None, fill_value: Any = 0) -> "Tensor":
        if not dtypes.is_bool(mask.dtype): raise RuntimeError(f"masked_select: expected a bool mask, got {mask.dtype}")
        shape = broadcast_shape(self.shape, mask.shape)
        x, m = self._broadcast_to(shape), mask._broadcast_to(shape)
        idx = m.flatten().nonzero(size=size)
        if idx.shape[0] == 0: return x.flatten().shrink([(0, 0)])
        vals = x.flatten()[idx[:, 0]]
        if size is not None:
            valid = type(self).arange(size, device=self.device) < m.cast(dtypes.int32).sum()
            vals = valid.where(vals, fill_value)
        return vals

    def one_hot(self: "Tensor", num_classes: int = -1) -> "Tensor":
        """int32 one-hot vectors along a new last axis; num_classes=-1 (torch's default) takes max + 1. A float
        index raises RuntimeError; a value outside [0, num_classes) gives an all-zero row (tinygrad's behaviour; torch
        raises).

        ```python
        Tensor([0, 2]).one_hot(3).tolist()   # [[1, 0, 0], [0, 0, 1]]
        ```
        """
        Tensor = type(self)
        if not dtypes.is_int(self.dtype): raise RuntimeError(f"one_hot expects an integer tensor, got {self.dtype}")
        if not isinstance(num_classes, int) or num_classes < -1:   # ValueError (tinygrad) and RuntimeError (torch)
            raise ShapeError(f"num_classes must be a non-negative int (or -1), got {num_classes!r}")
        if num_classes == -1 and self.numel() == 0:
            raise RuntimeError("one_hot: can't infer num_classes of an empty tensor")
        if num_classes == -1: num_classes = int(self.max().item()) + 1
        return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).cast(dtypes.int32)

    def triu(self: "Tensor", diagonal: int = 0) -> "Tensor":
        Tensor = type(self)
        r, c = self.shape[-2], self.shape[-1]
        keep = Tensor.arange(r, device=self.device).reshape(r, 1) + diagonal <= Tensor.arange(c, device=self.device)
        return keep.where(self, self.zeros_like())

    def tril(self: "Tensor", diagonal: int = 0) -> "Tensor":
        Tensor = type(self)
        r, c = self.shape[-2], self.shape[-1]
        keep = Tensor.arange(r, device=self.device).reshape(r, 1) + diagonal >= Tensor.arange(c, device=self.device)
        return keep.where(self, self.zeros_like())

    def rearrange(self: "Tensor", formula: str, **sizes: int) -> "Tensor":
        """einops-style rearrange: 'b (h w) c -> b c h w' (h=2 gives the split), '... (j two) -> ... j two',
        'b c 1 1 -> b c', 'b ... -> b (...)'. Bad patterns raise RearrangeError (a ValueError) saying why.

        >>> from fusegrad import Tensor
        >>> Tensor.zeros(2, 6, 3).rearrange("b (h w) c -> b c h w", h=2).shape
        (2, 3, 2, 3)
        """
        return rearrange(self, formula, **sizes)


def _is_basic(indices: Any) -> bool:
    """Only ints, slices, None and Ellipsis (an index that selects a view, not a copy)."""
    idx = indices if isinstance(indices, tuple) else (indices,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) or _is_sym_int_index(i) for i in idx)


def _is_sym_int_index(i: Any) -> bool:
    return isinstance(i, UOp)


def _wrap_negative(index: "Tensor", n: Any) -> "Tensor":
    """Count a negative index from the end only when it is valid (-n <= i < 0): anything below -n stays out of range
    instead of wrapping onto another element."""
    return ((index < 0) & (index >= -n)).where(index + n, index)


def _check_oob(index: "Tensor", n: Any, ax: int) -> None:
    """CHECK_OOB=1 (a debug flag): realize the index and check it on the host, raising like torch does. Without the
    flag an out-of-range index reads 0 and its writes are dropped (docs/tensor/indexing.md)."""
    if not CHECK_OOB or not isinstance(n, int) or index.numel() == 0: return
    vals = index.numpy().reshape(-1)
    bad = (vals < -n) | (vals >= n)
    if bad.any(): raise IndexError(f"index {int(vals[bad][0])} is out of bounds for dimension {ax} with size {n}")


def _tensor_list(first: Any, rest: tuple, name: str) -> list:
    """The tensors of cat/stack: `first, *rest`, or a list/tuple/generator of tensors passed as `first`."""
    T = storage.tensor_class
    if first is None: ts = list(rest)
    elif isinstance(first, T): ts = [first, *rest]
    else:
        try: ts = list(first) + list(rest)
        except TypeError: raise TypeError(f"{name} takes tensors, got {type(first).__name__}") from None
    if not ts: raise RuntimeError(f"{name} expects a non-empty list of tensors")
    if any(not isinstance(t, T) for t in ts):
        raise TypeError(f"{name} takes tensors, got {[type(t).__name__ for t in ts if not isinstance(t, T)][0]}")
    return ts


def _check_scatter_args(name: str, x: "Tensor", ax: int, index: "Tensor", src: "Tensor") -> None:
    """torch's argument checks for scatter/scatter_reduce (RuntimeError, as torch and tinygrad raise)."""
    if not dtypes.is_int(index.dtype): raise RuntimeError(f"{name}(): Expected an integer index, got {index.dtype}")
    if not (index.ndim == x.ndim == src.ndim):
        raise RuntimeError(f"{name}(): index {index.shape}, self {x.shape} and src {src.shape} need the same ndim")
    for d, (i, s, r) in enumerate(zip(index.shape, x.shape, src.shape)):
        if (d != ax and i > s) or i > r:
            raise RuntimeError(f"{name}(): index {index.shape} must be no larger than src {src.shape} in every dim and "
                               f"than self {x.shape} apart from dim {ax}")
    if index.device != x.device or src.device != x.device:
        raise RuntimeError(f"{name}(): index, self and src must be on one device, got {index.device}, {x.device}, "
                           f"{src.device}")


def _pad_lead(t: "Tensor", pads: list[tuple[int, int]], lead: tuple[int, ...], value: Any = 0) -> "Tensor":
    """Pad the leading (non-scatter) axes of t from the index shape up to self's shape."""
    if not pads or all(p == (0, 0) for p in pads): return t
    return t.pad(list(pads) + [(0, 0)], value=value)


__all__ = ["MovementMixin"]


def _symbolic_index(i: Any, size: Any) -> bool:
    """An index or slice that involves a symbolic int (a bound Variable), or any index into a symbolic axis."""
    if isinstance(i, slice): return any(isinstance(v, UOp) for v in (i.start, i.stop, i.step, size))
    return isinstance(i, UOp) or (isinstance(i, int) and isinstance(size, UOp))


def _symbolic_bounds(i: Any, size: Any, ax: int) -> tuple[Any, Any]:
    """(begin, end) of a symbolic index or step-1 slice (negative ints count from a static end). Nothing is clamped:
    `shrink` checks the bounds, for the bound values when they depend on them (as tinygrad, a bound whose range
    passes the axis is allowed; a value past it raises IndexError)."""
    if isinstance(i, slice):
        if i.step not in (None, 1): raise NotImplementedError(f"slice step {i.step} with a symbolic shape or bound")
        b = 0 if i.start is None else canonical(i.start)
        e = size if i.stop is None else canonical(i.stop)
    else: b, e = canonical(i), sadd(canonical(i), 1)
    if isinstance(i, slice) and isinstance(size, int):  # t[-3:n] counts from the end of a static axis
        if isinstance(b, int) and b < 0: b += size
        if isinstance(e, int) and e < 0: e += size
    return b, e
