"""One rank of the MPI tests (test_mpi.py launches it under mpirun): `python mpi_worker.py MODE`; prints one JSON
line per result, prefixed with `RESULT `."""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from fusegrad import Tensor
from fusegrad import distributed as dist


def emit(**kw: object) -> None:
    print("RESULT " + json.dumps({"rank": dist.rank(), **kw}), flush=True)


def collectives() -> None:
    r = dist.rank()
    base = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0
    x = Tensor(base * (r + 1))
    for op in ("sum", "mean", "max", "min"): emit(op=op, value=dist.allreduce(x, op).numpy().tolist())
    emit(op="int_sum", value=dist.allreduce(Tensor([r, 10 * r], dtype="int32"), "sum").tolist())
    emit(op="broadcast", value=dist.broadcast(Tensor([[r + 0.5, -r]]), root=1).tolist())
    dist.barrier()
    emit(op="done", value=None)


def dead(mode: str) -> None:
    if dist.rank() == 1:
        if mode == "exit": os._exit(3)
        if mode == "hang": time.sleep(120)
        if mode == "raise": raise ValueError("rank 1 failed on purpose")
    emit(op="allreduce", value=dist.allreduce(Tensor([1.0])).tolist())


def mismatch() -> None:
    r = dist.rank()
    for what, t in (("shape", Tensor.ones(2, 3 + r)), ("dtype", Tensor.ones(4, dtype="float32" if r else "int32"))):
        try:
            dist.allreduce(t)
            emit(op=what, raised=None)
        except dist.DistributedError as e:
            emit(op=what, raised=str(e))
    # the job is still usable afterwards: a matching call succeeds
    emit(op="after", value=dist.allreduce(Tensor([1.0])).tolist())


def overlap() -> None:
    """Three layers, a bucket each: the first bucket's allreduce must start before the backward schedule ends, and the
    averaged gradients must be the mean of both ranks' (each rank's input differs)."""
    from fusegrad import nn
    Tensor.manual_seed(0)
    layers = [nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 4)]
    params = [t for lin in layers for t in (lin.weight, lin.bias)]
    dp = dist.DataParallel(params, bucket_mb=0.01)
    x = Tensor(np.full((8, 32), dist.rank() + 1.0, np.float32))
    for lin in layers: x = lin(x).relu()
    x.sum().backward()
    local = [p.grad.numpy() for p in params]
    dp.sync_grads()
    emit(op="overlap", buckets=len(dp.buckets), started=dp.overlap, items=dp.items,
         local_w0=local[0].tolist(), avg_w0=params[0].grad.numpy().tolist())


if __name__ == "__main__":
    dist.init()
    mode = sys.argv[1]
    if mode == "collectives": collectives()
    elif mode == "mismatch": mismatch()
    elif mode == "overlap": overlap()
    else: dead(mode)
