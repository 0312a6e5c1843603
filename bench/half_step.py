#!/usr/bin/env python3
"""A small conv-net training step in float16 against float32 on the CPU (beautiful_cifar's layer pattern: conv ->
max pool -> BatchNorm on float32 -> quick GELU, SGD with nesterov momentum and weight decay), TinyJit replays.

    python bench/half_step.py                        # 3 rounds, each a float32 and a float16 process, alternating
    python bench/half_step.py --rounds 2 --bs 64 --depth 32 --steps 6
    python bench/half_step.py --root ../main         # the same with another checkout's fusegrad

Each (round, dtype) is a fresh process (compiles come from the disk cache after the first round); it times `--steps`
jitted steps after two warm-up steps and reports the median wall time of a step. The table gives the median over
rounds of each dtype and the ratio float16 / float32; the load average is printed with it (a shared machine is noisy).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(bs: int, depth: int, steps: int) -> None:
    import numpy as np
    from fusegrad import Tensor, TinyJit, dtypes, nn
    dt = dtypes.default_float

    class Group:
        def __init__(self, cin: int, cout: int):
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.norm1 = nn.BatchNorm(cout, track_running_stats=False)
            self.norm2 = nn.BatchNorm(cout, track_running_stats=False)

        def __call__(self, x: Tensor) -> Tensor:
            x = self.norm1(self.conv1(x).max_pool2d().float()).cast(dt).quick_gelu()
            return self.norm2(self.conv2(x).float()).cast(dt).quick_gelu()

    class Net:
        def __init__(self):
            self.stem = nn.Conv2d(3, 24, 2, bias=False)
            self.groups = [Group(24, depth), Group(depth, 4 * depth), Group(4 * depth, 8 * depth)]
            self.head = nn.Linear(8 * depth, 10, bias=False)

        def __call__(self, x: Tensor) -> Tensor:
            return self.head(self.stem(x).quick_gelu().sequential(self.groups).max(axis=(2, 3))) * (1 / 9)

    Tensor.manual_seed(0)
    net = Net()
    opt = nn.optim.SGD(nn.state.get_parameters(net), lr=1e-3, momentum=0.85, nesterov=True, weight_decay=5e-4)
    rng = np.random.default_rng(0)
    xs = [Tensor(rng.normal(size=(bs, 3, 32, 32)).astype(np.float32)).realize() for _ in range(steps + 2)]
    ys = [Tensor(rng.integers(0, 10, bs).astype(np.int32)).realize() for _ in range(steps + 2)]

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            loss = net(x.cast(dt)).cross_entropy(y, label_smoothing=0.2)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return loss.float().realize()

    times, losses = [], []
    for x, y in zip(xs, ys):
        st = time.perf_counter()
        losses.append(step(x, y).item())
        times.append(time.perf_counter() - st)
    print(json.dumps({"step_s": statistics.median(times[2:]), "losses": losses}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--root", default=HERE, help="the checkout whose fusegrad runs (default: this one)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child: return child(a.bs, a.depth, a.steps)
    res: dict[str, list[float]] = {"float32": [], "half": []}
    for r in range(a.rounds):
        for dt in (("float32", "half") if r % 2 == 0 else ("half", "float32")):
            env = {**os.environ, "PYTHONPATH": os.path.abspath(a.root), "DEFAULT_FLOAT": dt}
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--bs", str(a.bs), "--depth",
                                  str(a.depth), "--steps", str(a.steps)], env=env, capture_output=True, text=True)
            if out.returncode: raise SystemExit(f"{dt} run failed:\n{out.stderr[-3000:]}")
            d = json.loads(out.stdout.strip().splitlines()[-1])
            if not all(map(lambda v: v == v and abs(v) != float("inf"), d["losses"])):
                raise SystemExit(f"{dt}: a loss is not finite: {d['losses']}")
            res[dt].append(d["step_s"])
            print(f"round {r} {dt:8s} step {d['step_s'] * 1e3:8.1f} ms  losses {[round(v, 3) for v in d['losses']]}")
    f32, f16 = statistics.median(res["float32"]), statistics.median(res["half"])
    with open("/proc/loadavg") as f: load = f.read().split()[:3]
    print(f"bs {a.bs} depth {a.depth}: float32 {f32 * 1e3:.1f} ms, float16 {f16 * 1e3:.1f} ms, float16/float32 "
          f"{f16 / f32:.2f}x (medians of {a.rounds} rounds; load average {' '.join(load)})")


if __name__ == "__main__":
    main()
