"""Every kernel of beautiful_mnist's training step (bs 512, device-sampled), as this checkout renders it and as another
checkout does, timed alternately in one process on one thread (process CPU time, the fastest of --runs), each times
its launches per step: an A/B of two heuristics that a busy machine disturbs less than timing two whole steps.

    CPU_MARCH=x86-64-v3 python bench/step_kernels.py --other /work/main

The other checkout only renders (a subprocess with its PYTHONPATH, given the captured kernel ASTs); both programs are
compiled and run here, with this checkout's compiler flags and runtime."""
from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import Counter

os.environ.setdefault("CPU_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from fusegrad import Device  # noqa: E402
from fusegrad.codegen import to_program  # noqa: E402
from fusegrad.codegen.merge import merge_ranges  # noqa: E402
from fusegrad.codegen.search import _Timer  # noqa: E402
from fusegrad.ir.pattern import graph_rewrite  # noqa: E402
from fusegrad.ir.symbolic import pm_symbolic  # noqa: E402


def capture() -> tuple[dict, Counter]:
    """The step's kernel ASTs by name, and how many times each runs per step (TinyJit's captured launches)."""
    from run import fg_train_step
    rng = np.random.default_rng(2)
    xn = rng.integers(0, 255, (4096, 1, 28, 28)).astype(np.float32) / 255
    yn = rng.integers(0, 10, (4096,)).astype(np.int32)
    step = fg_train_step(xn, yn, 512, True)
    for _ in range(3): step()
    jit = next(c.cell_contents for c in step.__closure__ if hasattr(c.cell_contents, "captured"))
    asts: dict = {}
    counts: Counter = Counter()
    for ln in jit.captured.launches:
        if ln.prg is None: continue
        name = ln.prg.spec.display_name.strip()
        asts.setdefault(name, ln.item.ast)
        counts[name] += 1
    return asts, counts


def render(asts: dict) -> dict:
    """Each kernel's program by this checkout's heuristic (without its linear program: it only has to compile)."""
    ren = Device["CPU"].renderer
    return {n: dataclasses.replace(to_program(merge_ranges(graph_rewrite(a, pm_symbolic)), ren), uops=[], vars=[])
            for n, a in asts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", help="the checkout to compare with (its root directory)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--render", nargs=2, metavar=("ASTS", "OUT"), help=argparse.SUPPRESS)  # the other side's job
    args = ap.parse_args()
    if args.render:
        with open(args.render[0], "rb") as f: asts = pickle.load(f)
        with open(args.render[1], "wb") as f: pickle.dump(render(asts), f)
        return
    if not args.other: ap.error("--other is required")
    asts, counts = capture()
    mine = render(asts)
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/asts.pkl", "wb") as f: pickle.dump(asts, f)
        env = {**os.environ, "PYTHONPATH": os.path.abspath(args.other)}
        subprocess.run([sys.executable, os.path.abspath(__file__), "--render", f"{tmp}/asts.pkl", f"{tmp}/other.pkl"],
                       env=env, check=True, cwd=args.other)
        with open(f"{tmp}/other.pkl", "rb") as f: other = pickle.load(f)
    dev = Device["CPU"]
    rows, total = [], [0.0, 0.0]
    for name, ast in asts.items():
        timer = _Timer(ast, "CPU")
        progs = [dev.runtime(s[name], dev.compiler.compile_cached(s[name].src)) for s in (other, mine)]
        bufs = [b.opaque for b in timer.bufs]
        best = [float("inf"), float("inf")]
        for _ in range(args.runs):
            for i, p in enumerate(progs):
                t = time.process_time()
                p(*bufs, wait=True)
                best[i] = min(best[i], time.process_time() - t)
        t_other, t_mine = best[0] * counts[name], best[1] * counts[name]
        total[0] += t_other
        total[1] += t_mine
        rows.append((t_other, t_mine, name))
    print(f"CPU_MARCH={os.environ.get('CPU_MARCH', 'native')}, load average {os.getloadavg()[0]:.2f}; ms per step, "
          f"one thread: {args.other} | this checkout")
    for a, b, n in sorted(rows, reverse=True)[:args.top]: print(f"{a * 1e3:9.2f} {b * 1e3:9.2f}  {b / a:5.2f}x  {n}")
    print(f"{total[0] * 1e3:9.2f} {total[1] * 1e3:9.2f}  {total[1] / total[0]:5.2f}x  all {len(rows)} kernels")


if __name__ == "__main__":
    main()
