#!/usr/bin/env python3
"""Whole-model inference: fusegrad (eager and TinyJit) against PyTorch eager, each library in its own process.

    python bench/models.py                        # every case, 3 blocks of 5 timed calls per library
    python bench/models.py --only eff             # cases whose name starts with these (eff, minilm)
    python bench/models.py --blocks 5 --runs 7    # more samples
    python bench/models.py --no-first             # skip the first-call (cold / warm kernel cache) rows
    python bench/models.py --markdown out.md      # also write the table as markdown
    CPU_MARCH=x86-64-v3 python bench/models.py    # fusegrad's kernels built for AVX2 (the first line names the target)
    python bench/models.py --cpu-time             # one thread each (CPU_THREADS=1, torch 1 thread), CPU time of the
                                                  # calling thread: comparable on a busy machine, where 2 threads aren't

Models (bench/_models.py): EfficientNet-Lite0 at batch 1 and 8 (224x224; batch 1 also with float16 weights and
activations in both libraries: eff-b1-half), and a MiniLM-like BERT encoder (6 layers, 384 hidden, 12 heads, 1536 FFN)
at batch 2 x 13 tokens and 8 x 128, with random weights of the real shapes; the fusegrad models carry the torch models'
weights, and every worker checks its output against PyTorch's first.

Each measurement runs in a fresh worker process (`--worker`), so one library's threads, allocator and caches never
slow another. Workers run in blocks: block 1 runs every (case, library) once in rotating order, then block 2, ...;
a slow phase of a shared machine hits all of them alike. A worker warms up (TinyJit: captures), then times `--runs`
calls; the table shows the median over all blocks. fusegrad calls time everything a user waits for: building the
lazy graph from a fresh input tensor, scheduling, and the kernels (`realize()`); TinyJit calls are replays. PyTorch
runs `torch.no_grad()` with 2 threads. `first call` rows time a new process's first call (graph, schedule, codegen,
compile): `cold` with an empty on-disk kernel cache (a fresh XDG_CACHE_HOME), `warm` with the cache the cold run left.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import _procs

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {"eff-b1": ("eff", 1), "eff-b1-half": ("eff-half", 1), "eff-b8": ("eff", 8),
         "minilm-2x13": ("minilm", (2, 13)), "minilm-8x128": ("minilm", (8, 128))}
LIBS = ["fusegrad", "fusegrad-jit", "torch"]


def _setup(case: str):
    """(torch model, fusegrad model, the torch call, the fusegrad call building a fresh input tensor)."""
    import numpy as np
    import torch
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.dirname(HERE))
    import _models

    from fusegrad import Tensor
    kind, size = CASES[case]
    rng = np.random.default_rng(0)
    if kind == "eff":
        tm = _models.torch_efficientnet_lite0()
        fm = _models.EfficientNetLite0(tm)
        x = rng.standard_normal((size, 3, 224, 224), dtype=np.float32)
        tx = torch.from_numpy(x)
        return tm, fm, (lambda: tm(tx)), (lambda f: f(Tensor(x)))
    if kind == "eff-half":   # weights and activations float16 in both libraries (the float32 model's weights, cast)
        from fusegrad import dtypes, nn
        tm = _models.torch_efficientnet_lite0()
        fm = _models.EfficientNetLite0(tm)
        for t in nn.state.get_state_dict(fm).values(): t.replace(t.cast(dtypes.float16).realize())
        tm = tm.half()
        x = rng.standard_normal((size, 3, 224, 224), dtype=np.float32).astype(np.float16)
        tx = torch.from_numpy(x)
        return tm, fm, (lambda: tm(tx).float()), (lambda f: f(Tensor(x)).cast(dtypes.float32))
    tm = _models.torch_minilm()
    fm = _models.MiniLM(tm)
    B, T = size
    ids = rng.integers(0, 30522, (B, T)).astype(np.int32)
    att = np.ones((B, T), np.float32)
    tids, tatt = torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(att).long()
    return tm, fm, (lambda: tm(tids, attention_mask=tatt).last_hidden_state), \
        (lambda f: f(Tensor(ids), Tensor(att)))


def worker(case: str, lib: str, runs: int) -> list[float]:
    """Times of `runs` warm calls (or of the first call, lib 'first'). BENCH_CPU_TIME=1 (`--cpu-time`): one thread
    (fusegrad's CPU_THREADS is set to 1 by the parent), each call's CPU time of the calling thread."""
    import torch
    torch.set_num_threads(1 if os.environ.get("BENCH_CPU_TIME") == "1" else 2)
    if lib == "first":
        _, fm, _, fcall = _setup(case)
        t0 = time.perf_counter()
        fcall(fm).realize()
        return [time.perf_counter() - t0]
    tm, fm, tcall, fcall = _setup(case)
    with torch.no_grad(): ref = tcall().numpy()
    if lib == "torch":
        fn = tcall
        with torch.no_grad():
            for _ in range(2): fn()
            return _time(fn, runs)
    from fusegrad import TinyJit
    if lib == "fusegrad":
        def fn() -> object: return fcall(fm).realize()
    else:
        jit = TinyJit(lambda *a: fm(*a).realize())
        def fn() -> object: return fcall(jit)
    out = None
    for _ in range(3): out = fn()   # TinyJit: run, capture, replay
    import numpy as np
    tol = 2e-3 if "half" not in case else 3e-2 * float(np.abs(ref).max())   # float16: ~3 digits through 60 layers
    np.testing.assert_allclose(out.numpy(), ref, rtol=2e-3, atol=tol)   # type: ignore[union-attr]
    return _time(fn, runs)


def _time(fn, runs: int) -> list[float]:
    clock = time.thread_time if os.environ.get("BENCH_CPU_TIME") == "1" else time.perf_counter
    ts = []
    for _ in range(runs):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return ts


def spawn(case: str, lib: str, runs: int, env: dict[str, str] | None = None) -> list[float]:
    return _procs.spawn([os.path.abspath(__file__), "--worker", case, lib, str(runs)], env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-first", action="store_true")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--cpu-time", action="store_true", help="one thread each, CPU time of the calling thread")
    ap.add_argument("--worker", nargs=3, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], a.worker[1], int(a.worker[2]))))
        return
    cases = [c for c in CASES if not a.only or any(c.startswith(o) for o in a.only)]
    env = {"BENCH_CPU_TIME": "1", "CPU_THREADS": "1"} if a.cpu_time else None
    times, failed = _procs.run_blocks({case: LIBS for case in cases}, a.blocks,
                                      lambda b, case, lib: spawn(case, lib, a.runs, env))
    if failed: raise RuntimeError("\n".join(failed.values()))
    first: dict[tuple[str, str], float] = {}
    if not a.no_first:
        for case in cases:
            with tempfile.TemporaryDirectory() as d:
                first[case, "cold"] = spawn(case, "first", 1, {"XDG_CACHE_HOME": d})[0]
                first[case, "warm"] = spawn(case, "first", 1, {"XDG_CACHE_HOME": d})[0]
    line = _procs.machine_line() + ("; one thread each, CPU time (--cpu-time)" if a.cpu_time else "")
    print(line)
    rows = [["case", "library", "median ms", "/ torch"]]
    for case in cases:
        ref = statistics.median(times[case, "torch"])
        for lib in LIBS:
            m = statistics.median(times[case, lib])
            rows.append([case, lib, f"{m * 1e3:.1f}", f"{m / ref:.2f}x"])
        for kind in ("cold", "warm"):
            if (case, kind) in first:
                rows.append([case, f"fusegrad first call, {kind} kernel cache", f"{first[case, kind] * 1e3:.0f}", ""])
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows: print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(line + "\n\n| " + " | ".join(rows[0]) + " |\n|" + "---|" * 4 + "\n")
            for r in rows[1:]: f.write("| " + " | ".join(r) + " |\n")


if __name__ == "__main__":
    main()
