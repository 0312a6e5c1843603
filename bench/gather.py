"""Embedding-style lookups: 4096 indices into a 50,000 x 512 float32 table, fusegrad vs NumPy vs PyTorch.

A lookup must cost O(rows looked up), not O(lookups * vocab): fusegrad lowers `table[idx]` to a GATHER, i.e. a load
at a data-dependent address, so the kernel touches 4096*512 table elements. Prints a table (median of runs, ms, GB/s).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def bench(fn, warmup: int = 2, runs: int = 10) -> float:
    for _ in range(warmup): fn()
    ts = []
    for _ in range(runs):
        st = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - st)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    import torch
    from fusegrad import GlobalCounters, Tensor
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((args.vocab, args.dim), dtype=np.float32)
    idx = rng.integers(0, args.vocab, args.n).astype(np.int32)
    t_table, t_idx = Tensor(table).realize(), Tensor(idx).realize()
    th_table, th_idx = torch.from_numpy(table), torch.from_numpy(idx.astype(np.int64))

    def fg() -> None: t_table[t_idx].realize()
    def fg_kernel() -> float:
        GlobalCounters.reset()
        t_table[t_idx].realize()
        return GlobalCounters.time_sum_s
    assert np.array_equal(t_table[t_idx].numpy(), table[idx]), "fusegrad lookup is wrong"
    rows = {}
    rows["fusegrad"] = bench(fg)
    rows["fusegrad (kernel only)"] = statistics.median([fg_kernel() for _ in range(10)])
    rows["numpy"] = bench(lambda: table[idx])
    rows["torch"] = bench(lambda: th_table[th_idx])
    nbytes = args.n * args.dim * 4 * 2 + args.n * 4
    ref = rows["torch"]
    lines = [f"| impl | ms | GB/s | ratio vs torch |", "|---|---|---|---|"] if args.markdown else \
        [f"{'impl':24s} {'ms':>9s} {'GB/s':>8s} {'vs torch':>9s}"]
    for k, v in rows.items():
        lines.append(f"| {k} | {v * 1e3:.3f} | {nbytes / v * 1e-9:.2f} | {ref / v:.2f}x |" if args.markdown else
                     f"{k:24s} {v * 1e3:9.3f} {nbytes / v * 1e-9:8.2f} {ref / v:8.2f}x")
    print(f"gather: {args.n} lookups into a {args.vocab} x {args.dim} float32 table")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
