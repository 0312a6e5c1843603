"""TinyJit replay overhead: microseconds of Python per kernel launch when replaying a captured function.

A chain of K tiny elementwise kernels (each realized separately so they stay separate kernels) is captured, then
replayed; (replay wall time - kernel time) / K is the per-launch overhead.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=50)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    from fusegrad import GlobalCounters, Tensor, TinyJit

    @TinyJit
    def chain(x: Tensor) -> Tensor:
        for _ in range(args.kernels): x = (x * 1.0001 + 0.5).realize()
        return x

    x = Tensor(np.ones(16, np.float32)).realize()
    for _ in range(3): chain(x)
    walls, kern = [], []
    for _ in range(args.runs):
        GlobalCounters.reset()
        st = time.perf_counter()
        chain(x)
        walls.append(time.perf_counter() - st)
        kern.append(GlobalCounters.kernel_count)
    assert kern[0] == args.kernels, f"expected {args.kernels} kernels per replay, got {kern[0]}"
    # eager (non-jitted) for comparison: schedule + lookup + launch per kernel
    eager = []
    for _ in range(5):
        st = time.perf_counter()
        y = x
        for _ in range(args.kernels): y = (y * 1.0001 + 0.5).realize()
        eager.append(time.perf_counter() - st)
    w = statistics.median(walls)
    e = statistics.median(eager)
    print(f"{args.kernels} kernels of 16 floats each, median of {args.runs} replays")
    print(f"{'mode':12s} {'total ms':>10s} {'us/kernel':>10s}")
    print(f"{'TinyJit':12s} {w * 1e3:10.3f} {w / args.kernels * 1e6:10.2f}")
    print(f"{'eager':12s} {e * 1e3:10.3f} {e / args.kernels * 1e6:10.2f}")


if __name__ == "__main__":
    main()
