#!/usr/bin/env python3
"""The same N x N float32 matmul on every backend that opens here: ms (second-best of the runs, after a first run
that compiles), GFLOPS and the error against NumPy. Backends that don't open are listed with the reason.

    python bench/backends.py            # N = 1024
    python bench/backends.py --n 512

PoCL caches compiled kernels on disk; POCL_KERNEL_CACHE=0 (set here unless given) keeps the timing honest.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("POCL_KERNEL_CACHE", "0")

import numpy as np  # noqa: E402

from fusegrad import Device, Tensor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--devices", nargs="*", default=["CPU", "LLVM", "CL", "WEBGPU", "CUDA", "METAL"])
    args = ap.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    ref = a @ b
    print(f"{'device':8s} {'ms':>9s} {'GFLOPS':>8s}  max rel. error")
    for dev in args.devices:
        try: Device[dev]
        except Exception as e:  # noqa: BLE001 - any reason a backend doesn't open is reported, not raised
            print(f"{dev:8s} unavailable: {str(e).splitlines()[0][:90]}")
            continue
        x, y = Tensor(a, device=dev).realize(), Tensor(b, device=dev).realize()
        (x @ y).realize()   # compile
        ts = []
        for _ in range(args.runs):
            out = x @ y
            st = time.perf_counter()
            out.realize()
            Device[dev].synchronize()
            ts.append(time.perf_counter() - st)
        best = sorted(ts)[1] if len(ts) > 1 else ts[0]
        err = float(np.abs(out.numpy() - ref).max() / np.abs(ref).max())
        print(f"{dev:8s} {best * 1e3:9.1f} {2 * n ** 3 / best / 1e9:8.1f}  {err:.1e}")


if __name__ == "__main__":
    main()
