#!/usr/bin/env python3
"""Per-kernel Python overhead: a chain of tiny kernels (16 floats each, so the kernels themselves take ~1 us).

    python bench/overhead.py            # eager realize and TinyJit replay, microseconds per kernel (medians)
    python bench/overhead.py --kernels 200 --runs 30

`eager` times `realize()` of a freshly built chain (graph building, schedule (a schedule cache hit after warmup),
launches); `jit` times a TinyJit replay of the same chain; `kernel` is the engine's own kernel time
(GlobalCounters.time_sum_s) in the eager run. Each per kernel, in CPU time of this process (time.process_time):
on a shared machine that counts our own work, not the time other processes held the cores.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fusegrad import GlobalCounters, Tensor, TinyJit


def chain(x: Tensor, n: int) -> Tensor:
    for i in range(n): x = (x * 1.0001 + i).contiguous()   # one kernel each
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=100)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    n = a.kernels
    data = np.ones(16, np.float32)
    jit = TinyJit(lambda x: chain(x, n).realize())
    eager, kern, replay = [], [], []
    for i in range(a.runs + 3):
        x = Tensor(data).realize()
        GlobalCounters.reset()
        t0 = time.process_time()
        chain(x, n).realize()
        t1 = time.process_time()
        ks = GlobalCounters.time_sum_s
        assert GlobalCounters.kernel_count == n
        t2 = time.process_time()
        jit(x)
        t3 = time.process_time()
        if i >= 3: eager.append(t1 - t0); kern.append(ks); replay.append(t3 - t2)
    med = lambda v: statistics.median(v) / n * 1e6
    print(f"eager {med(eager):7.1f} us/kernel   (kernel time {med(kern):5.1f} us/kernel)   "
          f"TinyJit replay {med(replay):6.1f} us/kernel   [{n} kernels, median of {a.runs}]")


if __name__ == "__main__":
    main()
