"""Multi-device lowering, the scheduler's first pass: a tensor graph with MULTI nodes (one tensor on several devices)
-> one ordinary graph per device, joined by COPY nodes (and the ALU kernels of an allreduce).

The frontend builds graphs on *logical* shapes: a sharded tensor is `MULTI(shard_0, ..., shard_n-1, arg=axis)`, and
every op on it is an ordinary node whose device is the tuple of devices. This pass walks such a graph once, children
first, and gives every node a lowered value: a single-device node, or `Sharded(parts, axis)` (one node per device).
Elementwise ops and movement ops that keep the sharded axis run per shard; a reduce over the sharded axis reduces each
shard and then allreduces the partial results (`allreduce`: ring or tree, built from COPY and ALU nodes, so every
step is a scheduled copy or kernel that DEBUG=2 prints with its time); anything that can't stay sharded (a reshape that
moves the shard boundaries, a pad or flip of the sharded axis) is computed on the gathered, replicated tensor.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from fusegrad import device
from fusegrad.dtype import dtypes
from fusegrad.ir import build
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.shape import all_static

ALLREDUCE_ALGOS = ("ring", "tree")


@dataclass(frozen=True)
class Sharded:
    """A lowered value on several devices: parts[i] on devices[i]; `axis` is the axis the parts split (None: each part
    holds the whole tensor)."""
    parts: tuple[UOp, ...]
    axis: int | None

    @property
    def devices(self) -> tuple[str, ...]: return tuple(str(p.device) for p in self.parts)

    def bounds(self) -> list[tuple[int, int]]:
        """(begin, end) of each part along the sharded axis."""
        assert self.axis is not None
        out, b = [], 0
        for p in self.parts:
            n = int(_dims(p)[self.axis])
            out.append((b, b + n))
            b += n
        return out


Value = UOp | Sharded


def _dims(u: UOp) -> tuple[Any, ...]:
    """The shape of a tensor-level node (never None here)."""
    assert u.shape is not None
    return u.shape


def has_multi(root: UOp) -> bool:
    """Whether a graph holds anything on several devices (only then does the pass run)."""
    return device.multi_device_seen and any(_multi_here(n) for n in root.toposort(gate=lambda u: u.op is not Ops.BUFFER))


def _multi_here(n: UOp) -> bool:
    return n.op is Ops.MULTI or (n.op in (Ops.DEVICE, Ops.COPY) and isinstance(n.arg, tuple))


def lower_multi(targets: list[UOp], assigns: dict[UOp, Value] | None = None) -> list[Value]:
    """The lowered value of each target (and, into `assigns`, of each ASSIGN in their graphs)."""
    sink = UOp(Ops.SINK, src=tuple(targets))
    low: dict[UOp, Value] = {}
    multi: dict[UOp, bool] = {}
    for n in sink.toposort(gate=lambda u: u.op is not Ops.BUFFER):
        if n.op is Ops.SINK: continue
        multi[n] = _multi_here(n) or any(multi.get(s, False) for s in n.src)
        low[n] = _lower(n, [low[s] for s in n.src]) if multi[n] else n
        if assigns is not None and n.op is Ops.ASSIGN: assigns[n] = low[n]
    return [low[t] for t in targets]


# ---------------------------------------------------------------------------------------------------------------------
# moving values between the two forms

def _cat(pieces: list[UOp], axis: int) -> UOp:
    """Concatenate same-device pieces along `axis` (pad each to the full size and add: one fused kernel)."""
    if len(pieces) == 1: return pieces[0]
    total = sum(int(_dims(p)[axis]) for p in pieces)
    out, b = None, 0
    for p in pieces:
        n = int(_dims(p)[axis])
        padded = build.pad(p, [(b, total - b - n) if i == axis else (0, 0) for i in range(len(_dims(p)))])
        out = padded if out is None else build.alu(Ops.OR if p.dtype == dtypes.bool else Ops.ADD, out, padded)
        b += n
    assert out is not None
    return out


def _copy(x: UOp, device: str) -> UOp:
    return x if x.device == device else UOp(Ops.COPY, x.dtype, (x,), device)


def gather(v: Sharded, device: str) -> UOp:
    """The whole tensor on `device` (its shards copied there and concatenated)."""
    if v.axis is None:
        return next((p for p in v.parts if p.device == device), None) or _copy(v.parts[0], device)
    return _cat([_copy(p, device) for p in v.parts], v.axis)


def replicate(v: Value, devices: tuple[str, ...]) -> Sharded:
    """The whole tensor on every device of `devices`."""
    if isinstance(v, UOp): return Sharded(tuple(_copy(v, d) for d in devices), None)
    if v.axis is None and v.devices == devices: return v
    return Sharded(tuple(gather(v, d) for d in devices), None)


def _shard_like(v: Sharded, like: Sharded) -> Sharded:
    """A replicated value split like `like` (each device keeps its own slice: no communication)."""
    assert v.axis is None and like.axis is not None
    ax = like.axis
    return Sharded(tuple(build.shrink(p, [(b, e) if i == ax else (0, s) for i, s in enumerate(_dims(p))])
                         for p, (b, e) in zip(v.parts, like.bounds())), ax)


def align(vals: list[Value]) -> list[Sharded]:
    """Operands of one elementwise op, all split the same way over the same devices."""
    shards = [v for v in vals if isinstance(v, Sharded)]
    devices = shards[0].devices
    if any(s.devices != devices for s in shards):
        raise RuntimeError(f"an op mixes tensors on different device tuples: {sorted({s.devices for s in shards})}")
    axes = {s.axis for s in shards if s.axis is not None}
    like = next((s for s in shards if s.axis is not None), None)
    if len(axes) > 1 or (like is not None and any(
            s.axis is not None and s.bounds() != like.bounds() for s in shards)):   # sharded differently: gather all
        return [replicate(v, devices) for v in vals]
    out = []
    for v in vals:
        r = replicate(v, devices) if isinstance(v, UOp) else v
        out.append(_shard_like(r, like) if like is not None and r.axis is None else r)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# allreduce

def allreduce_algo(n_elems: int, n_dev: int) -> str:
    """ALLREDUCE=ring|tree picks; by default ring (each device sends 2(N-1)/N of the data), tree when the tensor has
    fewer elements than devices (a ring chunk would be empty)."""
    algo = os.environ.get("ALLREDUCE", "ring")
    if algo not in ALLREDUCE_ALGOS: raise ValueError(f"ALLREDUCE={algo!r}: choose one of {ALLREDUCE_ALGOS}")
    return "tree" if n_elems < n_dev else algo


def allreduce(parts: tuple[UOp, ...], op: Ops) -> Sharded:
    """Every device gets `op` over all parts (same shape, one per device)."""
    shape = parts[0].shape
    assert shape is not None
    n = 1
    for s in shape: n *= int(s)
    if len(parts) == 1: return Sharded(parts, None)
    if allreduce_algo(n, len(parts)) == "tree": return Sharded(_tree(parts, op), None)
    flat = [build.reshape(p, (n,)) for p in parts]
    return Sharded(tuple(build.reshape(x, shape) for x in _ring(flat, op, n)), None)


def _tree(parts: tuple[UOp, ...], op: Ops) -> tuple[UOp, ...]:
    """Reduce up a binary tree to device 0 (log2 N rounds of copy + op), then copy the result down the same tree."""
    vals, devs, stride = list(parts), [str(p.device) for p in parts], 1
    while stride < len(vals):
        for i in range(0, len(vals), 2 * stride):
            if i + stride < len(vals): vals[i] = build.alu(op, vals[i], _copy(vals[i + stride], devs[i]))
        stride *= 2
    out: list[UOp | None] = [vals[0]] + [None] * (len(vals) - 1)
    while stride > 1:
        stride //= 2
        for i in range(0, len(vals), 2 * stride):
            if i + stride < len(vals) and (src := out[i]) is not None: out[i + stride] = _copy(src, devs[i + stride])
    return tuple(o for o in out if o is not None)


def _ring(flat: list[UOp], op: Ops, n: int) -> list[UOp]:
    """Ring allreduce of 1-d parts: N chunks; N-1 steps of reduce-scatter (each device passes one chunk to the next,
    which combines it with its own) leave chunk (i+1) % N complete on device i; N-1 steps of allgather pass the
    complete chunks around the ring. Each device sends 2(N-1) chunks of n/N elements."""
    N, devs = len(flat), [str(p.device) for p in flat]
    cuts = [n * j // N for j in range(N + 1)]
    acc = [[build.shrink(p, [(cuts[j], cuts[j + 1])]) for j in range(N)] for p in flat]
    for s in range(N - 1):                                            # reduce-scatter
        nxt = [row[:] for row in acc]
        for i in range(N):
            j, dst = (i - s) % N, (i + 1) % N
            nxt[dst][j] = build.alu(op, acc[dst][j], _copy(acc[i][j], devs[dst]))
        acc = nxt
    have: list[list[UOp | None]] = [[None] * N for _ in range(N)]
    for j in range(N):                                                # allgather: chunk j starts on device j-1
        o = (j - 1) % N
        have[o][j] = acc[o][j]
        for step in range(1, N):
            src, dst = (o + step - 1) % N, (o + step) % N
            prev = have[src][j]
            assert prev is not None
            have[dst][j] = _copy(prev, devs[dst])
    return [_cat([c for c in row if c is not None], 0) for row in have]


# ---------------------------------------------------------------------------------------------------------------------
# the rules

def _lower(n: UOp, srcs: list[Value]) -> Value:
    if n.op is Ops.DEVICE: return Sharded(tuple(UOp(Ops.DEVICE, arg=d) for d in n.arg), None)
    if n.op is Ops.MULTI:
        if any(isinstance(s, Sharded) for s in srcs): raise RuntimeError("MULTI of multi-device tensors")
        return Sharded(tuple(s for s in srcs if isinstance(s, UOp)), n.arg)
    if n.op is Ops.COPY:
        x = srcs[0]
        if isinstance(n.arg, tuple): return replicate(x, n.arg)
        return _copy(x, n.arg) if isinstance(x, UOp) else gather(x, n.arg)
    if all(isinstance(s, UOp) for s in srcs):   # e.g. a shard picked out of a multi tensor, then used on its device
        return n.replace(src=tuple(s for s in srcs if isinstance(s, UOp)))
    if n.op is Ops.DETACH:   # a custom-gradient DETACH also holds its backward's inputs: only the value is computed
        v = srcs[0]
        return UOp(Ops.DETACH, n.dtype, (v,)) if isinstance(v, UOp) else \
            Sharded(tuple(UOp(Ops.DETACH, n.dtype, (p,)) for p in v.parts), v.axis)
    if n.op in GroupOp.Movement: return _movement(n, srcs[0])
    if n.op is Ops.REDUCE_AXIS: return _reduce(n, srcs[0])
    if n.op is Ops.GATHER: return _gather_op(n, srcs)
    if n.op is Ops.ASSIGN:
        target = srcs[0]
        if not isinstance(target, Sharded): raise RuntimeError("assign of a multi-device value to a one-device tensor")
        val = align([target, srcs[1]])[1]
        if val.axis != target.axis: val = _shard_like(replicate(val, target.devices), target) \
            if target.axis is not None else replicate(val, target.devices)
        return Sharded(tuple(n.replace(src=(t, v)) for t, v in zip(target.parts, val.parts)), target.axis)
    # elementwise: ALU, CAST, BITCAST, CONTIGUOUS, DETACH; IOTA and CONST have one DEVICE source
    ops = align(srcs)
    return Sharded(tuple(n.replace(src=tuple(o.parts[i] for o in ops)) for i in range(len(ops[0].parts))), ops[0].axis)


def _rebuild(n: UOp, src: UOp, arg: object) -> UOp:
    """`n` on one part, through the checked builders (a shard may make the op a no-op: a reduce over a size-1 axis)."""
    if n.op is Ops.REDUCE_AXIS: return build.reduce_axis(src, n.arg[0], n.arg[1])
    builders = {Ops.RESHAPE: build.reshape, Ops.EXPAND: build.expand, Ops.PAD: build.pad, Ops.SHRINK: build.shrink,
                Ops.PERMUTE: build.permute, Ops.FLIP: build.flip}
    return builders[n.op](src, arg) if n.op in builders else n.replace(src=(src,), arg=arg)  # type: ignore[operator]


def _per_part(n: UOp, v: Sharded, args: list[object] | None = None, axis: int | None = None) -> Sharded:
    return Sharded(tuple(_rebuild(n, p, a) for p, a in zip(v.parts, args or [n.arg] * len(v.parts))), axis)


def _movement(n: UOp, x: Value) -> Value:
    assert isinstance(x, Sharded)
    ax = x.axis
    if ax is None: return _per_part(n, x)
    shapes = [_dims(p) for p in x.parts]
    if n.op is Ops.PERMUTE: return _per_part(n, x, axis=list(n.arg).index(ax))
    if n.op is Ops.EXPAND:
        return _per_part(n, x, [tuple(s[ax] if i == ax else a for i, a in enumerate(n.arg)) for s in shapes], ax)
    if n.op is Ops.PAD and n.arg[ax] == (0, 0): return _per_part(n, x, axis=ax)
    if n.op is Ops.FLIP and not n.arg[ax]: return _per_part(n, x, axis=ax)
    if n.op is Ops.SHRINK:
        b, e = n.arg[ax]
        bounds = x.bounds()
        if (b, e) == (0, bounds[-1][1]):
            whole = [tuple((0, s[ax]) if i == ax else a for i, a in enumerate(n.arg)) for s in shapes]
            return _per_part(n, x, whole, ax)
        for k, (pb, pe) in enumerate(bounds):   # exactly one shard: that device's part, a one-device value
            if (b, e) == (pb, pe):
                return build.shrink(x.parts[k], tuple((0, pe - pb) if i == ax else a for i, a in enumerate(n.arg)))
    if n.op is Ops.RESHAPE and (new_ax := _reshape_axis(x, n.arg)) is not None:
        total = sum(int(s[ax]) for s in shapes)
        return _per_part(n, x, [tuple(a * int(s[ax]) // total if i == new_ax else a
                                      for i, a in enumerate(n.arg)) for s in shapes], new_ax)
    return _per_part(n, replicate(x, x.devices))   # the shard boundaries don't survive this op: compute it whole


def _reshape_axis(x: Sharded, new: tuple) -> int | None:
    """The axis of the new shape that carries the shards, if every shard stays one contiguous block along it."""
    ax = x.axis
    assert ax is not None
    logical = list(_dims(x.parts[0]))
    logical[ax] = x.bounds()[-1][1]
    if not all_static(tuple(logical)) or not all_static(tuple(new)): return None
    before, inner = 1, 1
    for s in logical[:ax]: before *= s
    for s in logical[ax + 1:]: inner *= s
    acc = 1
    for k, d in enumerate(new):
        if acc == before and d != 1:
            rest = 1
            for s in new[k + 1:]: rest *= s
            if all((b * inner) % rest == 0 and (e * inner) % rest == 0 for b, e in x.bounds()) and \
               d * rest == logical[ax] * inner: return k
            if d * rest < logical[ax] * inner: return None
        acc *= d
        if acc > before: return None
    return None


def _reduce(n: UOp, x: Value) -> Value:
    assert isinstance(x, Sharded)
    if x.axis is None or x.axis not in n.arg[1]: return _per_part(n, x, axis=x.axis)
    partial = _per_part(n, x)
    return allreduce(partial.parts, n.arg[0])


def _gather_op(n: UOp, srcs: list[Value]) -> Value:
    """GATHER per device when both operands can be split on the same axis (not the gathered one), else whole."""
    ax = next((s.axis for s in srcs if isinstance(s, Sharded) and s.axis is not None), None)
    xs, ids = n.src[0].shape, n.src[1].shape
    assert xs is not None and ids is not None
    if ax is not None and (ax == n.arg or xs[ax] != ids[ax]):
        devices = next(s for s in srcs if isinstance(s, Sharded)).devices
        srcs = [replicate(s, devices) for s in srcs]
    x, idx = align(srcs)
    return Sharded(tuple(n.replace(src=(a, b)) for a, b in zip(x.parts, idx.parts)), x.axis)
