#!/usr/bin/env python3
"""Benchmark the README demo matmul: fusegrad against NumPy and PyTorch, fp32, square N x N matrices.

    python bench/matmul.py                       # N = 128 256 512
    python bench/matmul.py --sizes 64 1024       # other sizes
    python bench/matmul.py --markdown            # print the table as markdown
    python bench/matmul.py --markdown out.md     # ... or write the markdown table to a file
    python bench/matmul.py --cpu-time            # one thread each, CPU time of the calling thread (a busy machine)
    CPU_MARCH=x86-64-v3 OPENBLAS_CORETYPE=Haswell python bench/matmul.py   # AVX2 code on both sides

Rows per size:
  fusegrad bcast   (a.reshape(N,1,N) * b.T.reshape(1,N,N)).sum(axis=2)   (the README demo)
  fusegrad a@b     a @ b
  numpy            an @ bn
  torch            ta @ tb  (torch.set_num_threads(2))

For fusegrad the inputs are realized once, then every run builds a fresh lazy graph (not timed) and times
`c.realize()` alone: scheduling + index propagation in Python, a lookup of the already compiled kernel, and the kernel.
The `kernel ms` column is the engine's own kernel timing (GlobalCounters.time_sum_s) for the same runs.
The three libraries are measured interleaved (run 1 of each, then run 2 of each, ...), in a rotating order, so a
slow phase of the machine hits all of them alike. Reported: the median over the runs after warmup.
See bench/README.md.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from typing import Callable


def _blas_threads_from_argv() -> None:
    """--blas-threads (and --cpu-time, one thread for everyone) must take effect before NumPy loads OpenBLAS/MKL and
    fusegrad opens its CPU device, so they are read here, ahead of the imports."""
    argv = sys.argv[1:]
    if "--cpu-time" in argv:
        argv = argv + ["--blas-threads=1"]
        os.environ["CPU_THREADS"] = "1"
    for i, a in enumerate(argv):
        val = a.split("=", 1)[1] if a.startswith("--blas-threads=") else \
            argv[i + 1] if a == "--blas-threads" and i + 1 < len(argv) else None
        if val is not None:
            for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"): os.environ[k] = val


_blas_threads_from_argv()
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout without install
from fusegrad import Device, GlobalCounters, Tensor  # noqa: E402

try:
    import torch
except ImportError:  # the table just loses its torch row
    torch = None


def gflops(n: int, seconds: float) -> float:
    return 2 * n ** 3 / seconds * 1e-9 if seconds > 0 else float("nan")


class Impl:
    """One row of the table: `run()` does one timed matmul and returns (wall seconds, kernel seconds or None)."""

    def __init__(self, name: str, run: Callable[[], tuple[float, float | None]], result: Callable[[], np.ndarray]):
        self.name, self.run, self.result = name, run, result
        self.wall: list[float] = []
        self.kernel: list[float] = []


# wall time, or with --cpu-time the calling thread's CPU time (everything then runs in that thread): what another
# process on the same cores takes from a run doesn't count
clock = time.thread_time if "--cpu-time" in sys.argv else time.perf_counter


def fusegrad_impl(name: str, build: Callable[[], Tensor]) -> Impl:
    last: list[Tensor] = []

    def run() -> tuple[float, float | None]:
        c = build()                    # a fresh lazy graph every time (not timed)
        GlobalCounters.reset()
        st = clock()
        c.realize()
        et = clock() - st
        # the first a @ b of a large b also copies b into column panels (mixin/reduce.py, kept for later calls)
        if GlobalCounters.kernel_count != 1 and not (not last and GlobalCounters.kernel_count == 2):
            raise RuntimeError(f"{name}: expected one kernel, the engine ran {GlobalCounters.kernel_count}")
        last[:] = [c]
        return et, GlobalCounters.time_sum_s

    return Impl(name, run, lambda: last[0].numpy())


def make_impls(n: int, rng: np.random.Generator) -> tuple[list[Impl], np.ndarray]:
    an = rng.random((n, n), dtype=np.float32)
    bn = rng.random((n, n), dtype=np.float32)
    a, b = Tensor(an).realize(), Tensor(bn).realize()   # inputs live on the device before any timing
    impls = [
        fusegrad_impl("fusegrad bcast", lambda: (a.reshape(n, 1, n) * b.T.reshape(1, n, n)).sum(axis=2)),
        fusegrad_impl("fusegrad a@b", lambda: a @ b),
    ]

    np_out: list[np.ndarray] = []

    def run_numpy() -> tuple[float, float | None]:
        st = clock()
        out = an @ bn
        et = clock() - st
        np_out[:] = [out]
        return et, None
    impls.append(Impl("numpy", run_numpy, lambda: np_out[0]))

    if torch is not None:
        ta, tb = torch.from_numpy(an), torch.from_numpy(bn)
        t_out: list[torch.Tensor] = []

        def run_torch() -> tuple[float, float | None]:
            st = clock()
            out = ta @ tb
            et = clock() - st
            t_out[:] = [out]
            return et, None
        impls.append(Impl("torch", run_torch, lambda: t_out[0].numpy()))
    return impls, an.astype(np.float64) @ bn.astype(np.float64)


def bench_size(n: int, runs: int, warmup: int, rng: np.random.Generator) -> list[Impl]:
    impls, ref = make_impls(n, rng)
    for impl in impls:  # warmup: compiles (or loads from the disk cache) the fusegrad kernels
        for _ in range(warmup): impl.run()
        err = float(np.abs(impl.result().astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1.0))
        if err > 1e-5: raise RuntimeError(f"N={n} {impl.name}: relative error {err:.2e} against float64")
    for r in range(runs):
        k = r % len(impls)
        for impl in impls[k:] + impls[:k]:  # rotate who goes first
            gc.collect()
            wall, kern = impl.run()
            impl.wall.append(wall)
            if kern is not None: impl.kernel.append(kern)
    return impls


def table_rows(n: int, impls: list[Impl]) -> list[list[str]]:
    t_np = statistics.median(next(i for i in impls if i.name == "numpy").wall)
    rows = []
    for impl in impls:
        t = statistics.median(impl.wall)
        tk = statistics.median(impl.kernel) if impl.kernel else None
        rows.append([str(n), impl.name, f"{t * 1e3:.3f}", f"{gflops(n, t):.2f}", f"{t / t_np:.2f}x",
                     f"{tk * 1e3:.3f}" if tk is not None else "-", f"{gflops(n, tk):.2f}" if tk is not None else "-"])
    return rows


HEADER = ["N", "impl", "median ms", "GFLOPS", "time/numpy", "kernel ms", "kernel GFLOPS"]


def format_text(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [HEADER] + rows) for i in range(len(HEADER))]
    right = [True, False, True, True, True, True, True]

    def fmt(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if rj else c.ljust(w) for c, w, rj in zip(r, widths, right))
    lines = [fmt(HEADER), "  ".join("-" * w for w in widths)]
    prev = None
    for r in rows:
        if prev is not None and r[0] != prev: lines.append("")
        lines.append(fmt(r))
        prev = r[0]
    return "\n".join(lines)


def format_markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---:", ":---"] + ["---:"] * (len(HEADER) - 2)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def environment() -> str:
    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    target = Device["CPU"].renderer.machine if Device.DEFAULT == "CPU" else None
    coretype = os.environ.get("OPENBLAS_CORETYPE")
    parts = [f"fusegrad device {Device.DEFAULT}" + (f" ({target.describe()})" if target is not None else ""),
             f"numpy {np.__version__}" + (f" ({blas} BLAS threads)" if blas else "") +
             (f" (OPENBLAS_CORETYPE={coretype})" if coretype else ""),
             f"torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch is not None else "torch missing",
             f"{os.cpu_count()} CPUs", platform.machine()]
    if hasattr(os, "getloadavg"): parts.append(f"load avg {os.getloadavg()[0]:.2f}")  # > 0 means others share the CPUs
    return ", ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description="fusegrad demo-matmul benchmark (fp32) against NumPy and PyTorch")
    p.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512], help="matrix sizes N (default 128 256 512)")
    p.add_argument("--runs", type=int, default=9, help="timed runs per implementation and size (default 9)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    p.add_argument("--markdown", nargs="?", const="-", metavar="FILE",
                   help="print the table as markdown, or write it to FILE")
    p.add_argument("--blas-threads", type=int, default=None, metavar="T",
                   help="threads for NumPy's BLAS (default: the library's own choice); torch: 2 (1 with --cpu-time)")
    p.add_argument("--cpu-time", action="store_true",
                   help="one thread for every library (CPU_THREADS=1, 1 BLAS thread, torch 1) and time the calling "
                        "thread's CPU time instead of wall time: numbers that hold on a busy shared machine")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.runs < 1 or args.warmup < 1: p.error("--runs and --warmup must be at least 1")

    if torch is not None: torch.set_num_threads(1 if args.cpu_time else 2)
    if Device.DEFAULT != "CPU":
        print(f"warning: the default device is {Device.DEFAULT}; the PYTHON interpreter takes minutes at these sizes",
              file=sys.stderr)
    rng = np.random.default_rng(args.seed)
    st = time.perf_counter()
    rows: list[list[str]] = []
    for n in args.sizes:
        rows += table_rows(n, bench_size(n, args.runs, args.warmup, rng))

    print(f"matmul fp32, median of {args.runs} runs after {args.warmup} warmup; {environment()}")
    if args.markdown == "-": print("\n" + format_markdown(rows))
    else: print(format_text(rows))
    if args.markdown not in (None, "-"):
        with open(args.markdown, "w") as f:
            f.write(f"matmul fp32, median of {args.runs} runs after {args.warmup} warmup; {environment()}\n\n")
            f.write(format_markdown(rows) + "\n")
        print(f"markdown table written to {args.markdown}")
    print(f"(benchmark took {time.perf_counter() - st:.1f} s)")


if __name__ == "__main__":
    main()
