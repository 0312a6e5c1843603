"""Tensor creation: constants, ranges, uninitialized buffers and the counter-based random number generator.

Mixed into `Tensor`; every function builds a lazy graph, random draws included (as in tinygrad): a draw advances the
RNG counter with a pending in-place write, so the numbers depend on the order of the calls, never on when (or in which
order) the results are realized.
"""
from __future__ import annotations

import ctypes
import gzip, urllib.error, urllib.request
import math
import struct
from typing import TYPE_CHECKING, Any

from fusegrad.device import Buffer, canonical_device
from fusegrad.dtype import ConstType, DType, DTypeLike, dtypes, to_dtype
from fusegrad.helpers import ShapeError, argfix, prod
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.shape import canonical, canonical_shape, is_sym_int, smax, sprod, ssub, sym_value_dtype
from fusegrad.sharding import empty
from fusegrad.storage import buffer_uop, buffer_view, written

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor


def _mix32(x: "Tensor") -> "Tensor":
    """A 32-bit integer hash finalizer (xor-shift-multiply), applied elementwise."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


class CreationMixin:
    __slots__ = ()
    @classmethod
    def _shape_arg(cls: "type[Tensor]", shape: tuple[Any, ...]) -> tuple[Any, ...]:
        s = argfix(*shape)
        if not all(isinstance(x, int) or is_sym_int(x) for x in s): raise TypeError(f"shape must be ints, got {s}")
        if any(x < 0 if isinstance(x, int) else x.vmin < 0 for x in s):
            raise ShapeError(f"invalid shape {s}: dimension sizes must be non-negative")
        return canonical_shape(s)

    @classmethod
    def empty(cls: "type[Tensor]", *shape: Any, device: str | None = None, dtype: DTypeLike | None = None) -> "Tensor":
        s = cls._shape_arg(shape)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if isinstance(dev := canonical_device(device), tuple):   # one buffer per device (sharding.py)
            return cls(empty(s, dt, dev))
        return cls(buffer_view(buffer_uop(Buffer(dev, smax(sprod(s)), dt)), s))

    @classmethod
    def full(cls: "type[Tensor]", shape: tuple[Any, ...] | int, fill_value: "ConstType | UOp",
             dtype: DTypeLike | None = None, device: str | None = None, requires_grad: bool | None = None,
             buffer: bool = True) -> "Tensor":
        """A tensor of `shape` filled with `fill_value`. fusegrad keeps it a broadcast constant until it is used
        (no buffer is allocated either way); `buffer` is accepted for tinygrad compatibility. `fill_value` may be a
        bound Variable (or an expression of one): the kernel reads its value.

        >>> from fusegrad import Tensor, Variable
        >>> Tensor.full((2,), Variable("n", 1, 9).bind(4)).tolist()
        [4, 4]
        """
        s = cls._shape_arg((shape,) if isinstance(shape, int) else tuple(shape))
        if dtype is not None: dt = to_dtype(dtype)
        elif isinstance(fill_value, UOp) and is_sym_int(fill_value): dt = sym_value_dtype(fill_value)
        else: dt = dtypes.from_py(fill_value)
        return cls(build.const(fill_value, dt, canonical_device(device), s), requires_grad=requires_grad)

    @classmethod
    def invalids(cls: "type[Tensor]", *shape: Any, device: str | None = None,
                 dtype: DTypeLike | None = None) -> "Tensor":
        """A tensor whose contents don't matter (tinygrad fills it with Invalid); here: uninitialized, like empty()."""
        return cls.empty(*shape, device=device, dtype=dtype)

    @classmethod
    def const(cls: "type[Tensor]", b: ConstType, dtype: DType | None = None, device: str | None = None) -> "Tensor":
        """A 0-d constant tensor of `b` (dtype inferred from the Python value when not given)."""
        return cls(b, device=device, dtype=dtype)

    @classmethod
    def from_blob(cls: "type[Tensor]", ptr: int, shape: tuple[int, ...], **kwargs: Any) -> "Tensor":
        """A tensor holding a copy of the memory at address `ptr` (an int or ctypes pointer), read as `shape` of
        `dtype` (default float32)."""
        dt = to_dtype(kwargs.pop("dtype", None) or dtypes.default_float)
        s = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        addr = ctypes.cast(ptr, ctypes.c_void_p).value if not isinstance(ptr, int) else ptr
        if not addr: raise ValueError("from_blob: null pointer")
        data = ctypes.string_at(addr, prod(s) * dt.itemsize)
        return cls(cls._from_bytes(data, dt, s, canonical_device(kwargs.pop("device", None))), **kwargs)

    @classmethod
    def from_url(cls: "type[Tensor]", url: str, gunzip: bool = False, **kwargs: Any) -> "Tensor":
        """The bytes at `url` as a uint8 tensor (gunzipped first if asked). Needs network access."""
        try:
            with urllib.request.urlopen(url, timeout=30) as r: data = r.read()
        except (urllib.error.URLError, OSError) as e:
            raise ConnectionError(f"from_url: can't fetch {url}: {e}") from e
        return cls(gzip.decompress(data) if gunzip else data, **kwargs)

    @classmethod
    def zeros(cls: "type[Tensor]", *shape: Any, **kwargs: Any) -> "Tensor":
        return cls.full(cls._shape_arg(shape), 0.0, **{"dtype": dtypes.default_float, **kwargs})

    @classmethod
    def ones(cls: "type[Tensor]", *shape: Any, **kwargs: Any) -> "Tensor":
        return cls.full(cls._shape_arg(shape), 1.0, **{"dtype": dtypes.default_float, **kwargs})

    def full_like(self: "Tensor", fill_value: ConstType, **kwargs: Any) -> "Tensor":
        return type(self).full(self.shape, fill_value, **{"dtype": self.dtype, "device": self.device, **kwargs})

    def zeros_like(self: "Tensor", **kwargs: Any) -> "Tensor": return self.full_like(0, **kwargs)
    def ones_like(self: "Tensor", **kwargs: Any) -> "Tensor": return self.full_like(1, **kwargs)

    @classmethod
    def arange(cls: "type[Tensor]", start: int | float, stop: int | float | None = None, step: int | float = 1,
               dtype: DTypeLike | None = None, device: str | None = None) -> "Tensor":
        """Values start, start+step, ... < stop (like torch.arange)."""
        if stop is None: start, stop = 0, start
        if step == 0: raise RuntimeError("arange step must be nonzero")
        if isinstance(start, UOp) or isinstance(stop, UOp):   # symbolic bounds: n = stop - start values
            if step != 1: raise NotImplementedError(f"arange with symbolic bounds needs step 1, got {step}")
            dev = canonical_device(device)
            n = canonical(ssub(stop, start))
            iota = cls(UOp(Ops.IOTA, to_dtype(dtype) if dtype is not None else dtypes.default_int,
                              (UOp(Ops.DEVICE, arg=dev),), n))
            return iota + start if not (isinstance(start, int) and start == 0) else iota
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(math.ceil((stop - start) / step), 0)
        if n and all(isinstance(v, int) for v in (start, stop, step)) and dtypes.is_int(dt):
            lo, hi = sorted((start, start + (n - 1) * step))
            if dtype is None and dt == dtypes.default_int and not (dt.min <= lo and hi <= dt.max):
                dt = dtypes.int64   # values past int32 (torch's default int64 holds them; wrapping would be silent)
            if not (dt.min <= lo and hi <= dt.max):
                raise OverflowError(f"arange({start}, {stop}, {step}) has values outside the range of {dt}")
        dev = canonical_device(device)
        iota = UOp(Ops.IOTA, dt, (UOp(Ops.DEVICE, arg=dev),), n)
        return cls(iota) * step + start if (step, start) != (1, 0) else cls(iota)

    @classmethod
    def eye(cls: "type[Tensor]", n: int, m: int | None = None, dtype: DTypeLike | None = None,
            device: str | None = None, requires_grad: bool | None = None) -> "Tensor":
        m = n if m is None else m
        if n < 0 or m < 0: raise ShapeError(f"eye of negative size {(n, m)}")
        rows = cls.arange(n, device=device).reshape(n, 1)
        cols = cls.arange(m, device=device).reshape(1, m)
        out = (rows == cols).cast(to_dtype(dtype) if dtype is not None else dtypes.default_float)
        return cls(out.uop, requires_grad=requires_grad)

    @classmethod
    def manual_seed(cls: "type[Tensor]", seed: int = 0) -> None:
        """Seed the counter-based RNG: the same seed gives the same numbers on every backend. Lazy: the reset is a
        pending write of each device's RNG state (in place, so captured TinyJit kernels see it too), ordered after
        the draws made before it, which keep their numbers."""
        cls._seed = int(seed)
        data = [0, cls._seed & 0xFFFFFFFF]
        for dev, st in list(cls._rng_states.items()):
            reset = cls._rng_resets.get(dev)
            if reset is not None and st.uop is reset[0]:
                # the previous reset is still pending and no draw read it: it takes this seed (seeding in a loop
                # doesn't pile up writes). Its data buffer is read by that pending write only.
                buf = reset[1]._buffer()
                buf.copyin(struct.pack("=2I", *data))
                written(buf)
                continue
            new = cls(data, dtype=dtypes.uint32, device=dev)
            st.assign(new)
            cls._rng_resets[dev] = (st.uop, new)

    @classmethod
    def _random_bits(cls: "type[Tensor]", n: int, device: str) -> "Tensor":
        """n uint32 values hashed from (seed, counter). The counter lives in a small device buffer that each call
        advances in place (a pending write: nothing runs until a result is realized), so a TinyJit replay keeps
        drawing new numbers."""
        st = cls._rng_states.get(device)
        if st is None:   # (from data: a buffer already, no kernel)
            st = cls._rng_states[device] = cls([0, cls._seed & 0xFFFFFFFF], dtype=dtypes.uint32, device=device)
            st.requires_grad = False
        step = n & 0xFFFFFFFF
        first = cls(UOp(Ops.IOTA, dtypes.uint32, (UOp(Ops.DEVICE, arg=device),), 2)) == 0
        st.assign(st + first.where(step, 0).cast(dtypes.uint32))
        start = st[0:1] - step
        ctr = cls(UOp(Ops.IOTA, dtypes.uint32, (UOp(Ops.DEVICE, arg=device),), n)) + start.expand(n)
        x = _mix32(ctr ^ _mix32(st[1:2].expand(n) + 0x632BE5AB))
        return _mix32(x + 0x85157AF5)

    @classmethod
    def random_bits(cls: "type[Tensor]", key: "Tensor", counter: "Tensor", num: int) -> "Tensor":
        """`num` pseudo-random uint32 values, a pure function of the uint32 tensors `key` and `counter` (their
        elements are folded into one seed each); no global RNG state is used or advanced."""
        def fold(t: "Tensor") -> "Tensor":
            t = t.cast(dtypes.uint32).flatten()
            h = cls([0x9E3779B9], dtype=dtypes.uint32, device=t.device)
            for i in range(t.shape[0]): h = _mix32(h ^ t[i:i + 1] + i)
            return h
        k, c = fold(key), fold(counter.to(key.device))
        ctr = cls(UOp(Ops.IOTA, dtypes.uint32, (UOp(Ops.DEVICE, arg=key.device),), num)) + c.expand(num)
        return _mix32(_mix32(ctr ^ k.expand(num)) + 0x85157AF5)

    @classmethod
    def _rand_symbolic(cls: "type[Tensor]", draw: Any, s: tuple[Any, ...], device: str | None, dtype: DTypeLike | None,
                       requires_grad: bool | None) -> "Tensor":
        """Samples of a symbolic shape: drawn at the largest shape its variables allow (so the RNG counter advances by
        the same amount for every bound value, and a TinyJit replay draws like the capture) and shrunk to the
        bound sizes."""
        full = draw(*[smax(x) for x in s], device=device, dtype=dtype)
        return cls(full.shrink(tuple((0, x) for x in s)).uop, requires_grad=requires_grad)

    @classmethod
    def rand(cls: "type[Tensor]", *shape: Any, device: str | None = None, dtype: DTypeLike | None = None,
             requires_grad: bool | None = None, contiguous: bool = True) -> "Tensor":
        """Uniform samples in [0, 1), lazy: the counter advances now, the samples are computed when realized (into
        a buffer of their own, computed once; `contiguous=False` leaves them fused into their consumers)."""
        s = cls._shape_arg(shape)
        if not all(isinstance(x, int) for x in s): return cls._rand_symbolic(cls.rand, s, device, dtype, requires_grad)
        dev, n = canonical_device(device), prod(s)
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        bits = cls._random_bits(n, dev)
        # as many random bits as the dtype's significand holds, so every sample is exact in it: 24 bits rounded to
        # half or bfloat16 gave exactly 1.0 for values just under 1 (rand's range is [0, 1))
        digits = {dtypes.float16: 11, dtypes.bfloat16: 8}.get(dt, 24)
        out = ((bits >> (32 - digits)).cast(dtypes.float32) * (2.0 ** -digits)).cast(dt)
        # (requires_grad gives it a unique CONTIGUOUS of its own: that one stores it)
        return cls(build.reshape((out.contiguous() if contiguous and not requires_grad else out).uop, s),
                   requires_grad=requires_grad)

    @classmethod
    def randn(cls: "type[Tensor]", *shape: Any, device: str | None = None, dtype: DTypeLike | None = None,
              requires_grad: bool | None = None, contiguous: bool = True) -> "Tensor":
        """Standard normal samples (Box-Muller on two uniform draws); `contiguous` as in `rand`."""
        s = cls._shape_arg(shape)
        if not all(isinstance(x, int) for x in s): return cls._rand_symbolic(cls.randn, s, device, dtype, requires_grad)
        u = cls.rand(2, prod(s), device=device)
        r = (-2.0 * (1.0 - u[0:1]).log()).sqrt()
        z = r * (u[1:2] * (2 * math.pi)).cos()
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        z = z.reshape(s).cast(dt)
        return cls((z if requires_grad else z.contiguous()).uop, requires_grad=requires_grad)

    @classmethod
    def _rand_like(cls: "type[Tensor]", t: "Tensor", **kwargs: Any) -> "Tensor":
        return cls.rand(*t.shape, **{"device": t.device, "dtype": t.dtype if dtypes.is_float(t.dtype) else None, **kwargs})

    def rand_like(self: "Tensor", **kwargs: Any) -> "Tensor": return type(self)._rand_like(self, **kwargs)

    def randn_like(self: "Tensor", dtype: DTypeLike | None = None, **kwargs: Any) -> "Tensor":
        return type(self).randn(*self.shape, **{"device": self.device, "dtype": dtype or self.dtype, **kwargs})

    @classmethod
    def randint(cls: "type[Tensor]", *shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32,
                device: str | None = None, contiguous: bool = True) -> "Tensor":
        """Uniform integers in [low, high); `contiguous` as in `rand`."""
        if high <= low: raise RuntimeError(f"randint: high ({high}) must be greater than low ({low})")
        u = cls.rand(*cls._shape_arg(shape), device=device)
        return ((u * (high - low)).floor() + low).cast(to_dtype(dtype))

    @classmethod
    def randperm(cls: "type[Tensor]", n: int, device: str | None = None, dtype: DTypeLike = dtypes.int32,
                 contiguous: bool = True) -> "Tensor":
        """A random permutation of 0..n-1; `contiguous` as in `rand`."""
        return cls.rand(n, device=device).argsort().cast(to_dtype(dtype))

    @classmethod
    def normal(cls: "type[Tensor]", *shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> "Tensor":
        return (std * cls.randn(*shape, **kwargs) + mean).cast(to_dtype(kwargs.get("dtype") or dtypes.default_float))

    @classmethod
    def uniform(cls: "type[Tensor]", *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None,
                **kwargs: Any) -> "Tensor":
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        return ((high - low) * cls.rand(*shape, **kwargs) + low).cast(dt)

    @classmethod
    def scaled_uniform(cls: "type[Tensor]", *shape: Any, **kwargs: Any) -> "Tensor":
        return cls.uniform(*shape, low=-1.0, high=1.0, **kwargs).mul(prod(cls._shape_arg(shape)) ** -0.5)

    @classmethod
    def glorot_uniform(cls: "type[Tensor]", *shape: Any, **kwargs: Any) -> "Tensor":
        s = cls._shape_arg(shape)
        return cls.uniform(*s, low=-1.0, high=1.0, **kwargs).mul((6 / (s[0] + prod(s[1:]))) ** 0.5)

    @classmethod
    def kaiming_uniform(cls: "type[Tensor]", *shape: Any, a: float = 0.01, **kwargs: Any) -> "Tensor":
        s = cls._shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(s[1:]))
        return cls.uniform(*s, low=-bound, high=bound, **kwargs)

    @classmethod
    def kaiming_normal(cls: "type[Tensor]", *shape: Any, a: float = 0.01, **kwargs: Any) -> "Tensor":
        s = cls._shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(s[1:]))
        return cls.normal(*s, mean=0.0, std=std, **kwargs)

    def multinomial(self: "Tensor", num_samples: int = 1, replacement: bool = False) -> "Tensor":
        """Sample indices from the (unnormalized) probabilities in the last axis (1-d or 2-d)."""
        if self.ndim not in (1, 2): raise RuntimeError(f"multinomial expects a 1-d or 2-d tensor, got {self.shape}")
        if not replacement and num_samples > self.shape[-1]:
            raise RuntimeError(f"cannot take {num_samples} samples without replacement from {self.shape[-1]} categories")
        p = self.unsqueeze(0) if self.ndim == 1 else self
        if replacement:
            cdf = (p / p.sum(-1, keepdim=True)).cumsum(-1)                       # (B, C)
            u = type(self).rand(p.shape[0], num_samples, 1, device=self.device)
            out = (u >= cdf.unsqueeze(1)).cast(dtypes.int32).sum(-1).minimum(p.shape[-1] - 1)
        else:  # Gumbel top-k: the k largest of log p + Gumbel noise are a sample without replacement
            g = -(-(type(self).rand(*p.shape, device=self.device) + 1e-20).log() + 1e-20).log()
            out = (p.log() + g).topk(num_samples, -1)[1]
        return (out.squeeze(0) if self.ndim == 1 else out).cast(dtypes.int32)

    @classmethod
    def linspace(cls: "type[Tensor]", start: float, stop: float, steps: int, dtype: DTypeLike | None = None,
                 device: str | None = None) -> "Tensor":
        if steps < 0: raise ShapeError("number of steps must be non-negative")
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
        if steps == 1: return cls([start], dtype=dt, device=device)
        i = cls.arange(steps, device=device, dtype=dtypes.float32)
        return (start + i * ((stop - start) / (steps - 1))).cast(dt)

    def empty_like(self: "Tensor", dtype: DTypeLike | None = None, device: str | None = None) -> "Tensor":
        return type(self).empty(*self.shape, dtype=dtype or self.dtype, device=device or self.device)

    def const_like(self: "Tensor", b: ConstType, dtype: DType | None = None) -> "Tensor":
        return type(self)._wrap(self._const(b, dtype))
