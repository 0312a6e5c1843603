"""Data parallel training over MPI: the same model on every rank, each rank a shard of every global batch.

Consumes the parameters' lazy gradients after `backward()`; produces `.grad` averaged over all ranks. Gradients are
packed into buckets (one flat float32 host buffer each, in reverse parameter order: the order backward produces them),
each bucket's non-blocking Iallreduce starts as soon as that bucket is on the host, and all are polled against the
`FUSEGRAD_DIST_TIMEOUT` deadline.
"""
from __future__ import annotations

import time
import zlib
from typing import Any

import numpy as np

from fusegrad.distributed import mpi
from fusegrad.dtype import dtypes
from fusegrad.engine import realize as engine
from fusegrad.storage import buffers
from fusegrad.tensor import Tensor


class DataParallel:
    """Keep `params` identical on every rank: rank 0's initial values are broadcast, and `sync_grads()` replaces each
    `.grad` with its average over the ranks.

    >>> from fusegrad import Tensor, nn, distributed as dist
    >>> w = Tensor([1.0, 2.0], requires_grad=True)
    >>> dp = dist.DataParallel([w])                # with 1 process: nothing to exchange
    >>> _ = (w * w).sum().backward()
    >>> dp.sync_grads()
    >>> w.grad.tolist()
    [2.0, 4.0]

    `bucket_mb` caps a bucket's size (a parameter larger than it gets a bucket of its own). `comm_s` accumulates the
    seconds spent in host copies and communication (the bench splits it out of the step time).
    """

    def __init__(self, params: list[Tensor], bucket_mb: float = 25.0, broadcast_params: bool = True):
        self.params = [p for p in params if p.requires_grad is not False]
        if not self.params: raise ValueError("DataParallel got no trainable parameters")
        cap = max(1, int(bucket_mb * 2**20) // 4)     # float32 elements
        self.buckets: list[list[int]] = [[]]          # parameter indices, last parameter first
        size = 0
        for i in reversed(range(len(self.params))):
            n = int(self.params[i].numel())
            if self.buckets[-1] and size + n > cap:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(i)
            size += n
        self.comm_s = 0.0
        self.sizes = [sum(int(self.params[i].numel()) for i in b) for b in self.buckets]
        # one check up front that every rank has the same parameter list (shapes and order)
        shapes_crc = zlib.crc32(repr([tuple(p.shape) for p in self.params]).encode())
        mpi.check_metadata("DataParallel(params): (count, crc of the shapes)", "sum", dtypes.int64,
                           (len(self.params), shapes_crc))
        if broadcast_params: self.broadcast_params()

    def _pack(self, bucket: list[int], srcs: list[Tensor]) -> np.ndarray:
        """One flat host buffer for a bucket, filled by each (realized) tensor's copy-out. Packing on the host, not
        with a device-side cat: a cat of lazy gradients would fuse every gradient's reduce into one kernel."""
        flat = np.empty(self.sizes[self.buckets.index(bucket)], np.float32)
        off = 0
        for i in bucket:
            n = int(self.params[i].numel())
            flat[off:off + n] = srcs[i].numpy().reshape(-1)
            off += n
        return flat

    def _unflat(self, bucket: list[int], arr: np.ndarray, grads: bool) -> list[Tensor]:
        out, off = [], 0
        for i in bucket:
            p = self.params[i]
            n = int(p.numel())
            val = Tensor(arr[off:off + n].reshape(p.shape), device=p.device).cast(p.dtype)
            off += n
            if grads: p.grad = val
            else: out.append(p.assign(val))
        return out

    def broadcast_params(self, root: int = 0) -> None:
        """Overwrite every rank's parameters with rank `root`'s."""
        srcs = [p.detach().cast(dtypes.float32).contiguous() for p in self.params]
        Tensor.realize(*srcs)
        arrs = [self._pack(b, srcs) for b in self.buckets]
        if mpi.world_size() > 1:
            for arr in arrs: mpi.check_metadata("broadcast_params", f"root{root}", dtypes.float32, arr.shape)
            mpi.wait([mpi.init().Ibcast(a, root=root) for a in arrs], f"broadcast of the parameters from rank {root}")
        Tensor.realize(*[t for b, a in zip(self.buckets, arrs) for t in self._unflat(b, a, grads=False)])

    def average(self, tensors: list[Tensor]) -> list[Tensor]:
        """The average over the ranks of one tensor per parameter (shaped like it), e.g. the gradients a TinyJit'd
        step returned: packed into the same buckets, one Iallreduce each (started as each bucket is packed). There is
        no overlap with backward here (the tensors are already computed); `sync_grads` has it.

        >>> from fusegrad import Tensor, distributed as dist
        >>> w = Tensor([1.0, 2.0], requires_grad=True)
        >>> dist.DataParallel([w]).average([Tensor([3.0, 4.0])])[0].tolist()   # 1 process: unchanged
        [3.0, 4.0]
        """
        if len(tensors) != len(self.params) or any(t.shape != p.shape for t, p in zip(tensors, self.params)):
            raise ValueError("average() needs one tensor per parameter, shaped like it")
        srcs = [t.detach().cast(dtypes.float32).contiguous() for t in tensors]
        Tensor.realize(*srcs)
        st, world = time.perf_counter(), mpi.world_size()
        if world > 1: mpi.check_metadata("average", "mean", dtypes.float32, (len(self.buckets), sum(self.sizes)))
        arrs, reqs = [], []
        for b in self.buckets:
            arrs.append(self._pack(b, srcs))
            if world > 1: reqs.append(mpi.iallreduce(arrs[-1], "sum"))
        if reqs: mpi.wait(reqs, f"allreduce of {len(reqs)} buckets ({sum(self.sizes)} floats)")
        out: list[Tensor | None] = [None] * len(self.params)
        for b, arr in zip(self.buckets, arrs):
            if world > 1: arr *= np.float32(1.0 / world)
            off = 0
            for i in b:
                n = int(self.params[i].numel())
                out[i] = Tensor(arr[off:off + n].reshape(self.params[i].shape), device=tensors[i].device)\
                    .cast(tensors[i].dtype)
                off += n
        self.comm_s += time.perf_counter() - st
        return [t for t in out if t is not None]

    def _grad_buffers(self) -> list[Tensor]:
        """One persistent float32 buffer per parameter that the gradient is written into (the engine's item hook
        recognizes a finished gradient by its buffer)."""
        if not hasattr(self, "_dst"):
            self._dst = [Tensor.empty(int(p.numel()), dtype=dtypes.float32, device=p.device).realize()
                         for p in self.params]
        return self._dst

    def sync_grads(self, *also_realize: Tensor) -> None:
        """Average the gradients over the ranks.

        The gradients (and `also_realize`, e.g. the loss) are computed in one realize, so backward stays one fused
        schedule. Each gradient is written into a buffer of its own; an engine hook sees the kernel that finishes the
        last gradient of a bucket, packs that bucket on the host and starts its Iallreduce while the remaining backward
        kernels run (and polls the started requests after every kernel: Open MPI advances them only inside MPI calls).
        `overlap` records, per bucket, the schedule item it started after and the number of items in all."""
        world = mpi.world_size()
        if world > 1: mpi.check_metadata("sync_grads", "mean", dtypes.float32, (len(self.buckets), sum(self.sizes)))
        dst = self._grad_buffers()
        for t, p in zip(dst, self.params):
            g = p.grad if p.grad is not None else Tensor.zeros(*p.shape, device=p.device)
            t.assign(g.detach().cast(dtypes.float32).reshape(-1))
        bufs = [buffers[t.uop.src[0].base] for t in dst]           # the ASSIGN's target: the persistent buffer
        pending = [{id(bufs[i]) for i in b} for b in self.buckets]
        arrs: list[Any] = [None] * len(self.buckets)
        reqs: list[Any] = []
        self.overlap: list[tuple[int, int]] = []
        count = [0]
        comm = [0.0]

        def start(k: int) -> None:
            st = time.perf_counter()
            flat, off = np.empty(self.sizes[k], np.float32), 0
            for i in self.buckets[k]:
                n = int(self.params[i].numel())
                bufs[i].copyout(flat[off:off + n].data)
                off += n
            arrs[k] = flat
            if world > 1: reqs.append(mpi.iallreduce(flat, "sum"))
            self.overlap.append((k, count[0]))
            comm[0] += time.perf_counter() - st

        def hook(si: Any) -> None:
            count[0] += 1
            for k, left in enumerate(pending):
                if left and id(si.bufs[0]) in left:
                    left.discard(id(si.bufs[0]))
                    if not left: start(k)
            if reqs: mpi.poll(reqs)

        engine.item_hooks.append(hook)
        try: Tensor.realize(*also_realize, *dst)
        finally: engine.item_hooks.remove(hook)
        st = time.perf_counter()
        for k, left in enumerate(pending):   # a gradient that needed no kernel (a constant) is copied out now
            if arrs[k] is None: start(k)
        if reqs: mpi.wait(reqs, f"gradient allreduce ({len(reqs)} buckets, {sum(self.sizes)} floats)")
        for b, arr in zip(self.buckets, arrs):
            if world > 1: arr *= np.float32(1.0 / world)
            self._unflat(b, arr, grads=True)
        self.items = count[0]
        self.comm_s += comm[0] + time.perf_counter() - st
