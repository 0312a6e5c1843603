#!/usr/bin/env python3
"""The CPU benchmark suite: fusegrad against NumPy and PyTorch, each library in worker processes of its own.

    python bench/run.py                     # everything (about 5 minutes on 2 cores)
    python bench/run.py --only matmul conv  # cases whose name starts with one of these
    python bench/run.py --quick             # 2 blocks of 3 calls, batch 64 (a smoke run, a few minutes)
    python bench/run.py --blocks 5 --runs 7 # more samples
    python bench/run.py --only beam         # how long BEAM=2 takes on two kernels, and what it finds
    python bench/run.py --markdown out.md   # also write the table as markdown
    python bench/run.py --plot              # also draw the time ratios as a bar chart (bench/results.png)
    CPU_MARCH=x86-64-v3 python bench/run.py # fusegrad's kernels built for AVX2 (OPENBLAS_CORETYPE=Haswell: NumPy's)

Every case builds the same computation in each library on the same seeded random inputs. Each (case, library) is
measured in a fresh worker process of that library alone (bench/_procs.py): a library's threads keep spinning after
its call and would slow whatever ran next in the same process. The workers run in blocks that rotate the library
order, so a slow phase of a shared machine hits every library alike. A worker warms up (compiles, captures), then
times `--runs` calls; the table shows the median over all blocks, the work rate (GFLOPS for compute-bound cases, GB/s
of the unavoidable memory traffic for memory-bound ones) and each library's time relative to NumPy's (or PyTorch's
where NumPy has no equivalent) in the same run. In the first block every worker also saves its output, which is
checked against the reference library's. PyTorch runs with 2 threads; NumPy's BLAS with what it finds. fusegrad
times are whole `realize()` calls on a fresh lazy graph (scheduling and launch overhead included), except the train
steps, which are TinyJit replays like a real training loop.
"""
from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import _procs

from fusegrad import Tensor, TinyJit, dtypes, nn
from fusegrad.nn.optim import Adam

LIBS = ["fusegrad", "numpy", "torch"]


@dataclass
class Case:
    group: str                                   # --only NAME selects a case by its name or its group's
    name: str
    libs: list[str]                              # the reference is numpy when it is here, else torch
    build: Callable[[str], Callable[[], Any]]    # library -> one call (returning the output to check); in a worker
    work: float = 0.0                            # flops (unit GFLOPS) or bytes (unit GB/s) per call
    unit: str = "GFLOPS"
    tol: float | None = 2e-3                     # largest error, relative to max(|reference|, 1); None: no check
    warmup: int = 2


def to_np(x: Any) -> np.ndarray:
    if isinstance(x, Tensor): return x.numpy()
    if hasattr(x, "detach"): return x.detach().float().numpy()   # a torch.Tensor (NumPy has no bfloat16)
    if isinstance(x, (list, tuple)): return np.concatenate([to_np(v).ravel() for v in x])
    return np.asarray(x)


def fg(build: Callable[[], Tensor | list[Tensor]]) -> Callable[[], Any]:
    def run() -> Any:
        out = build()
        for t in (out if isinstance(out, list) else [out]): t.realize()
        return out
    return run


def load_torch() -> Any:
    import torch
    torch.set_num_threads(2)
    return torch


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray: return rng.standard_normal(shape, dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# cases: each builds its inputs and one library's call only when a worker asks for it

def array_case(group: str, name: str, shapes: Sequence[tuple[int, ...]], fns: dict[str, Callable[..., Any]],
               work: float, unit: str = "GB/s", tol: float = 2e-3, scales: tuple[float, ...] = ()) -> Case:
    """A case whose call is `fns[lib](*inputs)` on float32 inputs of `shapes` (NumPy arrays, realized Tensors or
    torch tensors sharing the arrays' memory), each times its entry in `scales` (default 1)."""
    def build(lib: str) -> Callable[[], Any]:
        rng = np.random.default_rng(zlib.crc32(name.encode()))   # the same inputs in every worker
        arrays = [rand(rng, *s) * (scales[i] if i < len(scales) else 1) for i, s in enumerate(shapes)]
        fn = fns[lib]
        if lib == "numpy": return lambda: fn(*arrays)
        if lib == "torch":
            ts = [load_torch().from_numpy(a) for a in arrays]
            return lambda: fn(*ts)
        tensors = [Tensor(a).realize() for a in arrays]
        return fg(lambda: fn(*tensors))
    return Case(group, name, list(fns), build, work, unit, tol)


def same(fn: Callable[..., Any], libs: list[str] = LIBS) -> dict[str, Callable[..., Any]]:
    return {lib: fn for lib in libs}


def matmul_cases(sizes: list[int]) -> list[Case]:
    return [array_case("matmul", f"matmul {n} fp32", [(n, n), (n, n)], same(lambda a, b: a @ b), 2 * n ** 3,
                       "GFLOPS", 2e-4) for n in sizes]


def half_matmul_case(n: int, dt_name: str) -> list[Case]:
    """A float16 / bfloat16 matmul (16-bit inputs, float32 accumulation, a 16-bit result) where the CPU device has the
    dtype (bfloat16 is emulated with float32 math on 16-bit storage); the output is checked as float32."""
    from fusegrad import Device
    dt = getattr(dtypes, dt_name)
    if dt not in Device["CPU"].renderer.supported_dtypes(): return []

    def build(lib: str) -> Callable[[], Any]:
        rng = np.random.default_rng(n)
        an, bn = rand(rng, n, n), rand(rng, n, n)
        if lib == "torch":
            torch = load_torch()
            ta, tb = (torch.from_numpy(v).to(getattr(torch, dt_name)) for v in (an, bn))
            return lambda: (ta @ tb).float()
        a, b = (Tensor(v).cast(dt).realize() for v in (an, bn))
        return fg(lambda: (a @ b).cast(dtypes.float32))
    short = "bf16" if dt == dtypes.bfloat16 else "fp16"
    return [Case("matmul", f"matmul {n} {short}", ["fusegrad", "torch"], build, 2 * n ** 3, tol=6e-2)]


def cast_cases() -> list[Case]:
    """Elementwise conversions of 16M values between float32 and float16 / bfloat16 (memory-bound: GB/s counts the
    bytes read and written)."""
    n = 1 << 24
    out = []
    for dt_name, short in (("float16", "fp16"), ("bfloat16", "bf16")):
        dt = getattr(dtypes, dt_name)

        def build(lib: str, dt: Any = dt, dt_name: str = dt_name, narrow: bool = True) -> Callable[[], Any]:
            x = rand(np.random.default_rng(3), n)
            if lib == "torch":
                torch = load_torch()
                tx = torch.from_numpy(x)
                if narrow: return lambda: tx.to(getattr(torch, dt_name))
                th = tx.to(getattr(torch, dt_name))
                return lambda: th.float()
            if narrow:
                t = Tensor(x).realize()
                return fg(lambda: t.cast(dt))
            h = Tensor(x).cast(dt).realize()
            return fg(lambda: h.cast(dtypes.float32))
        for narrow in (True, False):
            name = f"cast 16M fp32->{short}" if narrow else f"cast 16M {short}->fp32"
            out.append(Case("cast", name, ["fusegrad", "torch"],
                            lambda lib, b=build, nw=narrow: b(lib, narrow=nw), 6 * n, "GB/s", tol=1e-2))
    return out


def beam_rows() -> list[list[str]]:
    """How long BEAM=2 searches one kernel (no cache) and what it finds against the heuristic."""
    from fusegrad import Context
    from fusegrad.codegen import search
    rows = []
    rng = np.random.default_rng(0)
    a = Tensor(rand(rng, 512, 512)).realize()
    x, w = Tensor(rand(rng, 64, 32, 24, 24)).realize(), Tensor(rand(rng, 32, 32, 5, 5)).realize()
    for name, t in (("matmul 512", a @ a), ("conv2 fwd bs64", x.conv2d(w))):
        si = t.schedule()[-1]  # the conv's own kernel (a weight layout copy may come first)
        with Context(BEAM=2, IGNORE_BEAM_CACHE=1): search.beam_search(si.ast, "CPU", 2, name)
        rep = search.last_search
        best, heur = rep["tried"][rep["best"]], rep["tried"].get(rep["heuristic"], float("nan"))
        rows.append([f"BEAM=2 search: {name}", "fusegrad", f"{rep['seconds'] * 1e3:.0f}",
                     f"{len(rep['tried'])} candidates", f"best {best * 1e3:.2f} ms / heuristic {heur * 1e3:.2f} ms"])
    return rows


MNIST_CONVS = [("conv1 1->32 k5 28x28", 1, 32, 5, 28), ("conv2 32->32 k5 24x24", 32, 32, 5, 24),
               ("conv3 32->64 k3 10x10", 32, 64, 3, 10), ("conv4 64->64 k3 8x8", 64, 64, 3, 8)]


def torch_conv2d(x: Any, w: Any) -> Any:
    import torch.nn.functional as F  # the worker imported torch already: a dictionary lookup
    return F.conv2d(x, w)


def conv_bwd_case(name: str, shapes: Sequence[tuple[int, ...]], flops: int) -> Case:
    """The input and weight gradients of a convolution for a given output gradient."""
    def build(lib: str) -> Callable[[], Any]:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        xn, wn, gn = rand(rng, *shapes[0]), rand(rng, *shapes[1]) * 0.1, rand(rng, *shapes[2])
        if lib == "fusegrad":
            g = Tensor(gn).realize()

            def fg_bwd() -> Any:
                x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
                x.conv2d(w).backward(g)
                Tensor.realize(x.grad, w.grad)
                return [x.grad, w.grad]
            return fg_bwd
        torch = load_torch()
        tx, tw, tg = torch.from_numpy(xn), torch.from_numpy(wn), torch.from_numpy(gn)

        def torch_bwd() -> Any:
            a, b = tx.clone().requires_grad_(), tw.clone().requires_grad_()
            torch_conv2d(a, b).backward(tg)
            return [a.grad, b.grad]
        return torch_bwd
    return Case("conv", name, ["fusegrad", "torch"], build, flops)


def conv_cases(bs: int) -> list[Case]:
    out = []
    for name, cin, cout, k, hw in MNIST_CONVS:
        o = hw - k + 1
        flops = 2 * bs * cout * o * o * cin * k * k
        shapes = [(bs, cin, hw, hw), (cout, cin, k, k)]
        fwd = {"fusegrad": lambda x, w: x.conv2d(w), "torch": torch_conv2d}
        out.append(array_case("conv", f"{name} fwd bs{bs}", shapes, fwd, flops, "GFLOPS", scales=(1, 0.1)))
        out.append(conv_bwd_case(f"{name} bwd bs{bs}", shapes + [(bs, cout, o, o)], 2 * flops))
    return out


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def np_layernorm(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)


def torch_layernorm(x: Any) -> Any:
    import torch.nn.functional as F
    return F.layer_norm(x, (x.shape[-1],))


def memory_cases() -> list[Case]:
    n = 1 << 24
    softmax = {"fusegrad": lambda x: x.softmax(1), "numpy": np_softmax, "torch": lambda x: x.softmax(1)}
    layernorm = {"fusegrad": lambda x: x.layernorm(), "numpy": np_layernorm, "torch": torch_layernorm}
    return [array_case("a*b+c", "a*b+c 16M fp32", [(n,)] * 3, same(lambda a, b, c: a * b + c), 16 * n, tol=2e-5),
            array_case("a*b+c", "sum 16M fp32", [(n,)], same(lambda a: a.sum()), 4 * n),
            array_case("a*b+c", "max 16M fp32", [(n,)], same(lambda a: a.max()), 4 * n, tol=0.0),
            array_case("a*b+c", "softmax 4096x4096", [(4096, 4096)], softmax, 8 * 4096 * 4096, tol=2e-5),
            array_case("a*b+c", "layernorm 4096x1024", [(4096, 1024)], layernorm, 8 * 4096 * 1024, tol=2e-4)]


class FgModel:
    """beautiful_mnist's model (examples/beautiful_mnist.py), built here so the benchmark doesn't import the example."""
    def __init__(self) -> None:
        self.layers = [nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32),
                       Tensor.max_pool2d, nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu,
                       nn.BatchNorm(64), Tensor.max_pool2d, lambda x: x.flatten(1), nn.Linear(576, 10)]

    def __call__(self, x: Tensor) -> Tensor: return x.sequential(self.layers)


POOL = 4096   # images the device-sampled train step draws its batch from


def fg_train_step(xn: np.ndarray, yn: np.ndarray, bs: int, sampled: bool) -> Callable[[], float]:
    model = FgModel()
    opt = Adam(nn.state.get_parameters(model))
    X, Y = Tensor(xn).realize(), Tensor(yn).realize()

    @TinyJit
    @Tensor.train()
    def step() -> Tensor:
        opt.zero_grad()
        if sampled:
            idx = Tensor.randint(bs, high=POOL)   # the batch is drawn on the device, as examples/beautiful_mnist.py
            x, y = X[idx], Y[idx]
        else:
            x, y = X, Y
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())  # one schedule: the forward isn't computed twice
    return lambda: step().item()


def torch_train_step(xn: np.ndarray, yn: np.ndarray, bs: int, sampled: bool) -> Callable[[], float]:
    torch = load_torch()
    tnn = torch.nn
    model = tnn.Sequential(
        tnn.Conv2d(1, 32, 5), tnn.ReLU(), tnn.Conv2d(32, 32, 5), tnn.ReLU(), tnn.BatchNorm2d(32), tnn.MaxPool2d(2),
        tnn.Conv2d(32, 64, 3), tnn.ReLU(), tnn.Conv2d(64, 64, 3), tnn.ReLU(), tnn.BatchNorm2d(64), tnn.MaxPool2d(2),
        tnn.Flatten(), tnn.Linear(576, 10))
    opt = torch.optim.Adam(model.parameters())
    X, Y = torch.from_numpy(xn), torch.from_numpy(yn).long()

    def step() -> float:
        if sampled:
            idx = torch.randint(POOL, (bs,))
            x, y = X[idx], Y[idx]
        else:
            x, y = X, Y
        opt.zero_grad()
        loss = tnn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def train_step_case(bs: int, sampled: bool) -> Case:
    def build(lib: str) -> Callable[[], float]:
        rng = np.random.default_rng(2)
        n = POOL if sampled else bs
        xn = rng.integers(0, 255, (n, 1, 28, 28)).astype(np.float32) / 255
        yn = rng.integers(0, 10, (n,)).astype(np.int32)
        return (fg_train_step if lib == "fusegrad" else torch_train_step)(xn, yn, bs, sampled)
    flops = 0
    for _, cin, cout, k, hw in MNIST_CONVS:
        o = hw - k + 1
        flops += 3 * 2 * bs * cout * o * o * cin * k * k  # forward + two backward convs
    name = f"beautiful_mnist train step bs{bs}" + (", device-sampled" if sampled else "")
    return Case("beautiful_mnist", name, ["fusegrad", "torch"], build, flops, tol=None, warmup=3)


def all_cases(bs: int) -> list[Case]:
    return (matmul_cases([256, 512, 1024, 2048]) + [c for n in (512, 1024) for d in ("bfloat16", "float16")
                                                    for c in half_matmul_case(n, d)] + conv_cases(bs) + memory_cases()
            + cast_cases()
            + [train_step_case(bs, sampled=False), train_step_case(bs, sampled=True)])


FIRST_STEP = """
import time, json, numpy as np
st = time.perf_counter()
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
from run import FgModel
from fusegrad import Tensor, nn
from fusegrad.nn.optim import Adam
model = FgModel(); opt = Adam(nn.state.get_parameters(model))
X = Tensor(np.random.rand({n}, 1, 28, 28).astype(np.float32)); Y = Tensor(np.random.randint(0, 10, {n}))
with Tensor.train():
    opt.zero_grad()
    idx = Tensor.randint({bs}, high={n}) if {sampled} else None
    x, y = (X[idx], Y[idx]) if {sampled} else (X, Y)
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    loss.realize(*opt.schedule_step()).item()  # the loss with the update, as examples/beautiful_mnist.py does
print(json.dumps(time.perf_counter() - st))
"""


def first_step(bs: int) -> list[list[str]]:
    """Wall time of a fresh process's first training step: cold (empty kernel cache) and warm (cache filled by the
    cold run), with a fixed batch and with a batch sampled on the device. Includes importing fusegrad and building
    the model."""
    rows = []
    for sampled in (False, True):
        code = FIRST_STEP.format(root=os.path.dirname(HERE), bench=HERE, n=POOL if sampled else bs, bs=bs,
                                 sampled=sampled)
        what = f"first train step bs{bs}" + (", device-sampled" if sampled else "")
        with tempfile.TemporaryDirectory() as cache:
            for label in ("cold", "warm"):
                t = _procs.spawn(["-c", code], {"XDG_CACHE_HOME": cache}, timeout=1800)
                rows.append([f"{what} ({label} cache)", "fusegrad", f"{t * 1e3:.0f}", "-", "-"])
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# a worker: one library, one case

def measure(case: Case, lib: str, runs: int, save: str | None) -> list[float]:
    """Warm up (at least `case.warmup` calls and 50 ms), save the output to `save` (a .npy file) when given, then
    time `runs` calls."""
    fn = case.build(lib)
    out, calls, st = None, 0, time.perf_counter()
    while calls < case.warmup or (time.perf_counter() - st < 0.05 and calls < 100):  # fast calls: 50 ms of warm-up
        out = None   # a live result would serve the next call of the same graph from fusegrad's result cache
        out = fn()
        calls += 1
    if save: np.save(save, to_np(out))
    del out          # ... and so would make the timed calls cache lookups
    times = []
    for _ in range(runs):
        gc.collect()
        st = time.perf_counter()
        fn()
        times.append(time.perf_counter() - st)
    return times


def worker(name: str, lib: str, bs: int, runs: int, save: str | None) -> Any:
    if name == "beam": return beam_rows()
    case = next(c for c in all_cases(bs) if c.name == name)
    return measure(case, lib, runs, save)


# ---------------------------------------------------------------------------------------------------------------------
# running the workers

def check_outputs(case: Case, path: Callable[[str], str]) -> None:
    """Compare the outputs the first block's workers saved with the reference library's."""
    if case.tol is None or not os.path.exists(path(case.libs[0])): return
    ref_lib = "numpy" if "numpy" in case.libs else "torch" if "torch" in case.libs else None
    if ref_lib is None: return
    ref = np.load(path(ref_lib)).astype(np.float64)
    scale = max(float(np.abs(ref).max()), 1.0)
    for lib in case.libs:
        got = np.load(path(lib)).astype(np.float64)
        err = float(np.abs(got - ref).max()) if got.shape == ref.shape else float("inf")
        if err > case.tol * scale: raise RuntimeError(f"{lib} disagrees with {ref_lib} (max err {err:.3g})")
    for lib in case.libs: os.remove(path(lib))


def run_cases(cases: list[Case], blocks: int, runs: int, bs: int) -> list[list[str]]:
    """Measure every case in worker processes (`blocks` rotating blocks of `runs` calls each) and return its rows."""
    by_name = {c.name: c for c in cases}
    with tempfile.TemporaryDirectory() as outdir:
        def path(name: str) -> Callable[[str], str]:
            return lambda lib: os.path.join(outdir, f"{list(by_name).index(name)}-{lib}.npy")

        def spawn(block: int, name: str, lib: str) -> list[float]:
            argv = [os.path.abspath(__file__), "--worker", name, lib, "--bs", str(bs), "--runs", str(runs)]
            return _procs.spawn(argv + (["--save", path(name)(lib)] if block == 0 else []))
        times, failed = _procs.run_blocks({c.name: c.libs for c in cases}, blocks, spawn,
                                          lambda name: check_outputs(by_name[name], path(name)))
    rows = []
    for case in cases:
        if case.name in failed:
            error = failed[case.name]
            rows.append([case.name, "FAILED", error.split(":")[0], error.strip().splitlines()[-1][:80], "-"])
        else:
            rows += rows_of(case, {lib: times[case.name, lib] for lib in case.libs})
    return rows


def rows_of(case: Case, times: dict[str, list[float]]) -> list[list[str]]:
    med = {lib: statistics.median(t) for lib, t in times.items()}
    ref = "numpy" if "numpy" in med else "torch" if "torch" in med else None
    rows = []
    for lib, t in med.items():
        rate = f"{case.work / t * 1e-9:.1f} {case.unit}" if case.work else "-"
        ratio = f"{t / med[ref]:.2f}x" if ref is not None else "-"
        rows.append([case.name, lib, f"{t * 1e3:.2f}", rate, ratio])
    return rows


HEADER = ["case", "library", "median ms", "rate", "time / " + "ref"]


def print_table(rows: list[list[str]], markdown_path: str | None, machine: str = "") -> None:
    """The table on stdout, and as markdown (after a line naming the machine) when markdown_path is given."""
    widths = [max(len(r[i]) for r in rows + [HEADER]) for i in range(len(HEADER))]
    print("  ".join(h.ljust(w) for h, w in zip(HEADER, widths)))
    print("  ".join("-" * w for w in widths))
    last = None
    for r in rows:
        if last is not None and r[0] != last: print()
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        last = r[0]
    if markdown_path:
        md = ([machine, ""] if machine else []) + ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        md += ["| " + " | ".join(r) + " |" for r in rows]
        with open(markdown_path, "w") as f: f.write("\n".join(md) + "\n")
        print(f"\nwrote {markdown_path}")


def plot_ratios(rows: list[list[str]], path: str) -> str | None:
    """A horizontal bar chart of each case's time ratio per library (log scale, 1x marked) saved as `path`; returns
    the path, or None (saying why) when matplotlib isn't installed or no row has a ratio."""
    bars = [(f"{r[0]} [{r[1]}]", float(r[4][:-1]), r[1]) for r in rows if r[4].endswith("x") and r[1] != "FAILED"]
    if not bars:
        print("no plot: no case has a time ratio")
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")   # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib isn't installed (pip install matplotlib, or pip install -e '.[examples]')")
        return None
    libs = list(dict.fromkeys(lib for _, _, lib in bars))
    colors = {lib: f"C{i}" for i, lib in enumerate(libs)}
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(bars) + 1.2), dpi=80)
    ys = range(len(bars))[::-1]
    ax.barh(list(ys), [b[1] for b in bars], color=[colors[b[2]] for b in bars])
    ax.set_yticks(list(ys), [b[0] for b in bars], fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("median time / the reference library's (NumPy, else PyTorch); lower is faster")
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=colors[lib], label=lib) for lib in libs], fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help="run only cases whose name starts with one of these")
    ap.add_argument("--quick", action="store_true", help="2 blocks of 3 calls, train step and conv at batch 64")
    ap.add_argument("--blocks", type=int, default=None, help="worker blocks (default 3, --quick 2)")
    ap.add_argument("--runs", type=int, default=None, help="timed calls per worker (default 5, --quick 3)")
    ap.add_argument("--markdown", nargs="?", const="bench/results.md", default=None)
    ap.add_argument("--plot", nargs="?", const="bench/results.png", default=None, metavar="PATH",
                    help="also save a bar chart of the time ratios (default path: bench/results.png)")
    ap.add_argument("--worker", nargs=2, default=None, metavar=("CASE", "LIB"), help=argparse.SUPPRESS)
    ap.add_argument("--bs", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 5)
    bs = args.bs or (64 if args.quick else 512)
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], bs, runs, args.save)))
        return
    blocks = args.blocks or (2 if args.quick else 3)
    have = [lib for lib in LIBS if lib != "torch" or importlib.util.find_spec("torch") is not None]
    want = lambda name: args.only is None or any(name.startswith(o) for o in args.only)
    cases = [c for c in all_cases(bs) if want(c.name) or want(c.group)]
    for c in cases: c.libs = [lib for lib in c.libs if lib in have]
    st, load = time.perf_counter(), os.getloadavg()[0]
    rows = run_cases(cases, blocks, runs, bs)
    if want("first"): rows += first_step(bs)
    if want("BEAM") or want("beam"): rows += _procs.spawn([os.path.abspath(__file__), "--worker", "beam", "fusegrad"])
    versions = {lib: importlib.metadata.version(lib) for lib in have if lib != "fusegrad"}
    print("\n" + _procs.machine_line())
    print(f"{len(rows)} rows, {time.perf_counter() - st:.0f} s, {blocks} blocks x {runs} calls per library, load "
          f"average {load:.2f} at the start and {os.getloadavg()[0]:.2f} at the end, python {sys.version.split()[0]}, "
          + ", ".join(f"{k} {v}" for k, v in versions.items()) + f", {os.cpu_count()} cpus\n")
    print_table(rows, args.markdown, _procs.machine_line())
    if args.plot and (saved := plot_ratios(rows, args.plot)) is not None:
        print(f"\nbar chart saved to {os.path.abspath(saved)}")


if __name__ == "__main__":
    main()
