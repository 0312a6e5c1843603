"""Data-parallel step time of the MNIST convnet (examples/mnist_dist.py): 1 and 2 processes (MPI), 1 and 2 devices in
one process (sharding), with the communication time split out, plus the MPI allreduce bandwidth.

  python bench/distributed.py                   # all rows; launches mpirun -n 2 for the MPI rows
  python bench/distributed.py --bs 64 --steps 8 --markdown

Rows (global batch --bs, Adam; the median of the steps after the first two, after the first three with TinyJit):
  1 process, 1 device       the whole batch on CPU
  1 process, 1 device, BS/2 half the batch: the compute each worker does in the 2-way rows
  2 processes (MPI)         mpirun -n 2, each rank BS/2, fusegrad.distributed.DataParallel; comm = gradient host copies
                            + allreduce (DataParallel.comm_s)
  1 process, 2 devices      params replicated on (CPU, CPU:1), batch sharded on axis 0; comm = the copies between
                            the devices (GlobalCounters.copy_time_s: batch shards, allreduce chunks)
  ..., TinyJit              the same step captured and replayed (the batch sharded inside the jitted function); for
                            MPI two captures, gradients then update, around the host allreduce (DataParallel.average)
The allreduce rows time `Iallreduce` of float32 buffers between the 2 ranks (median of 10) -> bus bandwidth
2(N-1)/N * bytes / time.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _example() -> Any:
    """examples/mnist_dist.py as a module: its ConvNet and its TinyJit'd data-parallel step are what is timed."""
    spec = importlib.util.spec_from_file_location("mnist_dist", ROOT / "examples" / "mnist_dist.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_steps(bs: int, steps: int, devices: tuple[str, ...] | None, dp: Any = None, rank: int = 0, world: int = 1,
              jit: bool = False) -> dict[str, float]:
    """Train `steps` steps; returns the median step and communication seconds (steps after the first two; with `jit`,
    after the first three: TinyJit runs, captures, then replays)."""
    from fusegrad import GlobalCounters, Tensor, TinyJit, nn
    Tensor.manual_seed(0)
    example = _example()
    model = example.ConvNet()
    params = nn.state.get_parameters(model)
    if devices is not None:
        for p in params: p.shard_(devices)
    if dp is not None: dp = dp(params)
    opt = nn.optim.Adam(params, lr=1e-3)

    def step(xt: Tensor, yt: Tensor) -> Tensor:
        if devices is not None: xt, yt = xt.shard(devices, 0), yt.shard(devices, 0)
        with Tensor.train():
            opt.zero_grad()
            loss = model(xt).sparse_categorical_crossentropy(yt).backward()
            if dp is not None:
                dp.sync_grads(loss)
                opt.step()
                return loss
            loss = loss.to("CPU") if devices is not None else loss   # TinyJit returns one-device tensors
            return loss.realize(*opt.schedule_step())   # the loss with the update: no second forward

    # MPI + TinyJit: the example's two captures around the host allreduce
    run = (example.jit_dp_step(model, opt, params, dp) if dp is not None else TinyJit(step)) if jit else step
    rng = np.random.default_rng(0)
    local = bs // world
    step_s, comm_s = [], []
    for _ in range(steps):
        x = rng.standard_normal((bs, 1, 28, 28)).astype(np.float32)[rank * local:(rank + 1) * local]
        y = rng.integers(0, 10, bs).astype(np.int32)[rank * local:(rank + 1) * local]
        GlobalCounters.reset()
        c0 = dp.comm_s if dp is not None else 0.0
        st = time.perf_counter()
        run(Tensor(x), Tensor(y)).item()
        step_s.append(time.perf_counter() - st)
        comm_s.append(dp.comm_s - c0 if dp is not None else GlobalCounters.copy_time_s)
    skip = 3 if jit else 2
    return {"step_ms": 1e3 * statistics.median(step_s[skip:]), "comm_ms": 1e3 * statistics.median(comm_s[skip:])}


def allreduce_bandwidth(sizes_mb: list[float]) -> list[dict[str, float]]:
    from mpi4py import MPI

    from fusegrad.distributed import mpi
    comm, out = mpi.init(), []
    for mb in sizes_mb:
        arr = np.ones(int(mb * 2**20) // 4, np.float32)
        times = []
        for _ in range(12):
            mpi.barrier()
            st = time.perf_counter()
            mpi.wait([comm.Iallreduce(MPI.IN_PLACE, arr, op=MPI.SUM)], "bench allreduce")
            times.append(time.perf_counter() - st)
        t = statistics.median(times[2:])
        n = comm.Get_size()
        out.append({"mb": mb, "ms": 1e3 * t, "busbw_gbs": 2 * (n - 1) / n * arr.nbytes / t / 1e9})
    return out


def worker_mpi(bs: int, steps: int) -> None:
    from fusegrad import distributed as dist
    dist.init()
    row = run_steps(bs, steps, None, dp=dist.DataParallel, rank=dist.rank(), world=dist.world_size())
    row_jit = run_steps(bs, steps + 1, None, dp=dist.DataParallel, rank=dist.rank(), world=dist.world_size(), jit=True)
    bw = allreduce_bandwidth([0.004, 0.35, 4.0, 32.0])
    if dist.rank() == 0: print("RESULT " + json.dumps({"row": row, "row_jit": row_jit, "bw": bw}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--worker", choices=["mpi"], default=None)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.worker == "mpi": return worker_mpi(args.bs, args.steps)
    rows = [("1 process, 1 device", run_steps(args.bs, args.steps, None)),
            (f"1 process, 1 device, BS/2={args.bs // 2}", run_steps(args.bs // 2, args.steps, None))]
    mpirun = pathlib.Path(sys.executable).parent / "mpirun"
    mpirun_cmd = str(mpirun) if mpirun.exists() else shutil.which("mpirun")
    bw: list[dict[str, float]] = []
    mpi_jit_row: tuple[str, dict[str, float]] | None = None
    if mpirun_cmd is None: print("no mpirun: skipping the MPI rows (pip install 'fusegrad[dist]')")
    else:
        r = subprocess.run([mpirun_cmd, "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, __file__,
                            "--worker", "mpi", "--bs", str(args.bs), "--steps", str(args.steps)], capture_output=True,
                           text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
        res = [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode or not res: print(f"the MPI run failed:\n{r.stdout}\n{r.stderr}")
        else:
            rows.append(("2 processes (MPI), BS/2 each", res[0]["row"]))
            mpi_jit_row = ("2 processes (MPI), BS/2 each, TinyJit", res[0]["row_jit"])
            bw = res[0]["bw"]
    rows.append(("1 process, 2 devices (CPU, CPU:1)", run_steps(args.bs, args.steps, ("CPU", "CPU:1"))))
    rows.append(("1 process, 1 device, TinyJit", run_steps(args.bs, args.steps + 1, None, jit=True)))
    rows.append(("1 process, 2 devices, TinyJit", run_steps(args.bs, args.steps + 1, ("CPU", "CPU:1"), jit=True)))
    if mpi_jit_row is not None: rows.append(mpi_jit_row)
    sep = "|" if args.markdown else " "
    print(f"MNIST convnet, global batch {args.bs}, median of {args.steps - 2} steps")
    if args.markdown: print("| setup | step ms | comm ms | compute ms |\n|---|---|---|---|")
    for name, r in rows:
        compute = r["step_ms"] - r["comm_ms"]
        line = f"{name:40s} {sep} {r['step_ms']:8.1f} {sep} {r['comm_ms']:8.1f} {sep} {compute:8.1f}"
        print(f"| {line} |" if args.markdown else line)
    for b in bw: print(f"MPI allreduce {b['mb']:6.3f} MB: {b['ms']:8.2f} ms, bus bandwidth {b['busbw_gbs']:.2f} GB/s")


if __name__ == "__main__":
    main()
