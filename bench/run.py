#!/usr/bin/env python3
"""The CPU benchmark suite: fusegrad against NumPy and PyTorch, measured side by side in one run.

    python bench/run.py                     # everything (a few minutes on 2 cores)
    python bench/run.py --only matmul conv  # cases whose name starts with one of these
    python bench/run.py --quick             # fewer runs, smaller train step (a smoke run)
    python bench/run.py --only beam         # how long BEAM=2 takes on two kernels, and what it finds
    python bench/run.py --markdown out.md   # also write the table as markdown
    python bench/run.py --plot              # also draw the time ratios as a bar chart (bench/results.png)

Every case builds the same computation in each library on the same random inputs, checks that the results agree,
then times them interleaved (run 1 of each library, then run 2 of each, in rotating order) so a slow phase of a
shared machine hits all of them alike. The table shows the median time, the work rate (GFLOPS for compute-bound
cases, GB/s of the unavoidable memory traffic for memory-bound ones) and each library's time relative to NumPy
(or PyTorch where NumPy has no equivalent). PyTorch runs with 2 threads; NumPy's BLAS with what it finds.
fusegrad times are whole `realize()` calls on a fresh lazy graph (scheduling and launch overhead included),
except the train step, which is a TinyJit replay like a real training loop.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fusegrad import Tensor, TinyJit, dtypes, nn  # noqa: E402
from fusegrad.nn.optim import Adam  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(2)
except ImportError:
    torch = None


@dataclass
class Case:
    name: str
    impls: dict[str, Callable[[], object]]      # library -> one run (returns something to compare)
    work: float = 0.0                            # flops (unit GFLOPS) or bytes (unit GB/s)
    unit: str = "GFLOPS"
    check: Callable[[dict[str, object]], None] | None = None
    times: dict[str, list[float]] = field(default_factory=dict)


def to_np(x: object) -> np.ndarray:
    if isinstance(x, Tensor): return x.numpy()
    if torch is not None and isinstance(x, torch.Tensor): return x.detach().numpy()
    if isinstance(x, (list, tuple)): return np.concatenate([to_np(v).ravel() for v in x])
    return np.asarray(x)


def agree(rtol: float = 1e-3, atol: float = 1e-3) -> Callable[[dict[str, object]], None]:
    def check(outs: dict[str, object]) -> None:
        ref_name = "numpy" if "numpy" in outs else "torch"
        if ref_name not in outs: return
        ref = to_np(outs[ref_name]).astype(np.float64)
        for k, v in outs.items():
            got = to_np(v).astype(np.float64)
            scale = max(float(np.abs(ref).max()), 1.0)
            if got.shape != ref.shape or float(np.abs(got - ref).max()) > atol * scale + rtol * scale:
                raise RuntimeError(f"{k} disagrees with {ref_name} (max err {float(np.abs(got - ref).max()):.3g})")
    return check


def fg(build: Callable[[], Tensor | list[Tensor]]) -> Callable[[], object]:
    def run() -> object:
        out = build()
        for t in (out if isinstance(out, list) else [out]): t.realize()
        return out
    return run


rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return rng.standard_normal(shape, dtype=np.float32)


# ---------------------------------------------------------------------------------------------------------------------
# cases

def matmul_cases(sizes: list[int]) -> list[Case]:
    out = []
    for n in sizes:
        an, bn = rand(n, n), rand(n, n)
        a, b = Tensor(an).realize(), Tensor(bn).realize()
        impls = {"fusegrad": fg(lambda a=a, b=b: a @ b), "numpy": lambda an=an, bn=bn: an @ bn}
        if torch is not None:
            ta, tb = torch.from_numpy(an), torch.from_numpy(bn)
            impls["torch"] = lambda ta=ta, tb=tb: ta @ tb
        out.append(Case(f"matmul {n} fp32", impls, 2 * n ** 3, check=agree(1e-4, 1e-4)))
    return out


def bf16_matmul_case(n: int) -> list[Case]:
    """bfloat16 matmul where the CPU device supports it (emulated with float32 math on 16-bit storage)."""
    from fusegrad import Device
    if dtypes.bfloat16 not in Device["CPU"].renderer.supported_dtypes(): return []
    an, bn = rand(n, n), rand(n, n)
    a, b = Tensor(an).cast(dtypes.bfloat16).realize(), Tensor(bn).cast(dtypes.bfloat16).realize()
    impls: dict[str, Callable[[], object]] = {"fusegrad": fg(lambda: (a @ b).cast(dtypes.float32))}
    if torch is not None:
        ta, tb = torch.from_numpy(an).bfloat16(), torch.from_numpy(bn).bfloat16()
        impls["torch"] = lambda: (ta @ tb).float()
    return [Case(f"matmul {n} bf16", impls, 2 * n ** 3, check=agree(3e-2, 3e-2))]


def beam_rows() -> list[list[str]]:
    """How long BEAM=2 searches one kernel (no cache) and what it finds against the heuristic."""
    from fusegrad import Context
    from fusegrad.codegen import search
    rows = []
    a = Tensor(rand(512, 512)).realize()
    x, w = Tensor(rand(64, 32, 24, 24)).realize(), Tensor(rand(32, 32, 5, 5)).realize()
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


def conv_cases(bs: int) -> list[Case]:
    out = []
    for name, cin, cout, k, hw in MNIST_CONVS:
        xn, wn = rand(bs, cin, hw, hw), rand(cout, cin, k, k) * 0.1
        o = hw - k + 1
        flops = 2 * bs * cout * o * o * cin * k * k
        gn = rand(bs, cout, o, o)
        x, w, g = Tensor(xn).realize(), Tensor(wn).realize(), Tensor(gn).realize()
        fwd = {"fusegrad": fg(lambda x=x, w=w: x.conv2d(w))}

        def fg_bwd(xn=xn, wn=wn, g=g) -> object:
            xt, wt = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
            xt.conv2d(wt).backward(g)
            Tensor.realize(xt.grad, wt.grad)
            return [xt.grad, wt.grad]
        bwd = {"fusegrad": fg_bwd}
        if torch is not None:
            tx, tw, tg = torch.from_numpy(xn), torch.from_numpy(wn), torch.from_numpy(gn)
            fwd["torch"] = lambda tx=tx, tw=tw: F.conv2d(tx, tw)

            def torch_bwd(tx=tx, tw=tw, tg=tg) -> object:
                a, b = tx.clone().requires_grad_(), tw.clone().requires_grad_()
                F.conv2d(a, b).backward(tg)
                return [a.grad, b.grad]
            bwd["torch"] = torch_bwd
        out.append(Case(f"{name} fwd bs{bs}", fwd, flops, check=agree()))
        out.append(Case(f"{name} bwd bs{bs}", bwd, 2 * flops, check=agree()))
    return out


def memory_cases() -> list[Case]:
    n = 1 << 24
    an, bn, cn = rand(n), rand(n), rand(n)
    a, b, c = (Tensor(v).realize() for v in (an, bn, cn))
    cases = []
    triad = {"fusegrad": fg(lambda: a * b + c), "numpy": lambda: an * bn + cn}
    s = {"fusegrad": fg(lambda: a.sum()), "numpy": lambda: an.sum()}
    m = {"fusegrad": fg(lambda: a.max()), "numpy": lambda: an.max()}
    xn = rand(4096, 4096)
    x = Tensor(xn).realize()

    def np_softmax() -> np.ndarray:
        e = np.exp(xn - xn.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    sm = {"fusegrad": fg(lambda: x.softmax(1)), "numpy": np_softmax}
    ln_n = rand(4096, 1024)
    ln = Tensor(ln_n).realize()

    def np_layernorm() -> np.ndarray:
        mu = ln_n.mean(1, keepdims=True)
        return (ln_n - mu) / np.sqrt(ln_n.var(1, keepdims=True) + 1e-5)
    lnc = {"fusegrad": fg(lambda: ln.layernorm()), "numpy": np_layernorm}
    if torch is not None:
        ta, tb, tc, tx, tl = (torch.from_numpy(v) for v in (an, bn, cn, xn, ln_n))
        triad["torch"] = lambda: ta * tb + tc
        s["torch"] = lambda: ta.sum()
        m["torch"] = lambda: ta.max()
        sm["torch"] = lambda: torch.softmax(tx, 1)
        lnc["torch"] = lambda: F.layer_norm(tl, (1024,))
    cases.append(Case("a*b+c 16M fp32", triad, 16 * n, "GB/s", agree(1e-5, 1e-5)))
    cases.append(Case("sum 16M fp32", s, 4 * n, "GB/s", agree(1e-3, 1e-3)))
    cases.append(Case("max 16M fp32", m, 4 * n, "GB/s", agree(0, 0)))
    cases.append(Case("softmax 4096x4096", sm, 8 * 4096 * 4096, "GB/s", agree(1e-5, 1e-5)))
    cases.append(Case("layernorm 4096x1024", lnc, 8 * 4096 * 1024, "GB/s", agree(1e-4, 1e-4)))
    return cases


class FgModel:
    """beautiful_mnist's model (examples/beautiful_mnist.py), built here so the benchmark doesn't import the example."""
    def __init__(self) -> None:
        self.layers = [nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32),
                       Tensor.max_pool2d, nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu,
                       nn.BatchNorm(64), Tensor.max_pool2d, lambda x: x.flatten(1), nn.Linear(576, 10)]

    def __call__(self, x: Tensor) -> Tensor: return x.sequential(self.layers)


def train_step_case(bs: int) -> Case:
    xn = rng.integers(0, 255, (bs, 1, 28, 28)).astype(np.float32) / 255
    yn = rng.integers(0, 10, (bs,)).astype(np.int32)
    model = FgModel()
    opt = Adam(nn.state.get_parameters(model))
    X, Y = Tensor(xn).realize(), Tensor(yn).realize()

    @TinyJit
    @Tensor.train()
    def step() -> Tensor:
        opt.zero_grad()
        loss = model(X).sparse_categorical_crossentropy(Y).backward()
        return loss.realize(*opt.schedule_step())  # one schedule: the forward isn't computed twice
    impls: dict[str, Callable[[], object]] = {"fusegrad": lambda: step().item()}
    if torch is not None:
        tm = torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 5), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 5), torch.nn.ReLU(),
            torch.nn.BatchNorm2d(32), torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3), torch.nn.ReLU(), torch.nn.BatchNorm2d(64), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(576, 10))
        topt = torch.optim.Adam(tm.parameters())
        tx, ty = torch.from_numpy(xn), torch.from_numpy(yn).long()

        def torch_step() -> float:
            topt.zero_grad()
            loss = F.cross_entropy(tm(tx), ty)
            loss.backward()
            topt.step()
            return loss.item()
        impls["torch"] = torch_step
    flops = 0
    for _, cin, cout, k, hw in MNIST_CONVS:
        o = hw - k + 1
        flops += 3 * 2 * bs * cout * o * o * cin * k * k  # forward + two backward convs
    return Case(f"beautiful_mnist train step bs{bs}", impls, flops)


FIRST_STEP = """
import time, numpy as np
st = time.perf_counter()
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
sys.modules["torch"] = None  # run.py would import PyTorch (about 1 s), which a fusegrad program doesn't
from run import FgModel
from fusegrad import Tensor, nn
from fusegrad.nn.optim import Adam
model = FgModel(); opt = Adam(nn.state.get_parameters(model))
X = Tensor(np.random.rand({bs}, 1, 28, 28).astype(np.float32)); Y = Tensor(np.random.randint(0, 10, {bs}))
with Tensor.train():
    opt.zero_grad(); loss = model(X).sparse_categorical_crossentropy(Y).backward()
    loss.realize(*opt.schedule_step()).item()  # the loss with the update, as examples/beautiful_mnist.py does
print("FIRST_STEP", time.perf_counter() - st)
"""


def first_step(bs: int) -> list[list[str]]:
    """Wall time of a fresh process's first training step: cold (empty kernel cache) and warm (cache filled by the
    cold run). Includes importing fusegrad and building the model, not importing PyTorch."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = FIRST_STEP.format(root=root, bench=os.path.dirname(os.path.abspath(__file__)), bs=bs)
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        for label in ("cold", "warm"):
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
            if out.returncode != 0: raise RuntimeError(out.stderr[-2000:])
            t = float(out.stdout.split("FIRST_STEP")[1])
            rows.append([f"first train step bs{bs} ({label} cache)", "fusegrad", f"{t * 1e3:.0f}", "-", "-"])
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# running

def run_case(case: Case, runs: int, warmup: int) -> None:
    outs = {}
    for lib, f in case.impls.items():
        for _ in range(warmup): outs[lib] = f()
    if case.check is not None: case.check(outs)
    # drop the warm-up results: a live fusegrad result of the same graph would be served from the result cache, and
    # the timed runs would measure a cache lookup instead of the computation
    outs.clear()
    libs = list(case.impls)
    for r in range(runs):
        k = r % len(libs)
        for lib in libs[k:] + libs[:k]:
            gc.collect()
            st = time.perf_counter()
            case.impls[lib]()
            case.times.setdefault(lib, []).append(time.perf_counter() - st)


def rows_of(case: Case) -> list[list[str]]:
    med = {lib: statistics.median(t) for lib, t in case.times.items()}
    ref = "numpy" if "numpy" in med else "torch" if "torch" in med else None
    rows = []
    for lib, t in med.items():
        rate = f"{case.work / t * 1e-9:.1f} {case.unit}" if case.work else "-"
        ratio = f"{t / med[ref]:.2f}x" if ref is not None else "-"
        rows.append([case.name, lib, f"{t * 1e3:.2f}", rate, ratio])
    return rows


HEADER = ["case", "library", "median ms", "rate", "time / " + "ref"]


def print_table(rows: list[list[str]], markdown_path: str | None) -> None:
    widths = [max(len(r[i]) for r in rows + [HEADER]) for i in range(len(HEADER))]
    print("  ".join(h.ljust(w) for h, w in zip(HEADER, widths)))
    print("  ".join("-" * w for w in widths))
    last = None
    for r in rows:
        if last is not None and r[0] != last: print()
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        last = r[0]
    if markdown_path:
        md = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
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
    ap.add_argument("--quick", action="store_true", help="3 runs, train step at batch 64, conv at batch 64")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--markdown", nargs="?", const="bench/results.md", default=None)
    ap.add_argument("--plot", nargs="?", const="bench/results.png", default=None, metavar="PATH",
                    help="also save a bar chart of the time ratios (default path: bench/results.png)")
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 7)
    bs = 64 if args.quick else 512
    groups: list[tuple[str, Callable[[], list[Case]]]] = [
        ("matmul", lambda: matmul_cases([256, 512, 1024, 2048]) + bf16_matmul_case(512)),
        ("conv", lambda: conv_cases(bs)),
        ("a*b+c", memory_cases), ("beautiful_mnist", lambda: [train_step_case(bs)])]
    want = lambda name: args.only is None or any(name.startswith(o) for o in args.only)  # noqa: E731
    rows: list[list[str]] = []
    st = time.perf_counter()
    for gname, make in groups:
        cases = [c for c in make() if want(c.name) or want(gname)]
        for case in cases:
            print(f"running {case.name} ...", file=sys.stderr, flush=True)
            try:
                run_case(case, runs if "train" not in case.name else max(runs, 5), warmup=2)
                rows += rows_of(case)
            except Exception as e:  # one failing case shouldn't hide the rest of the table
                rows.append([case.name, "FAILED", type(e).__name__, str(e)[:80], "-"])
    if want("first"): rows += first_step(bs)
    if want("BEAM") or want("beam"): rows += beam_rows()
    print(f"\n{len(rows)} rows, {time.perf_counter() - st:.0f} s, python {sys.version.split()[0]}, numpy {np.__version__}"
          f", torch {torch.__version__ if torch else '-'}, {os.cpu_count()} cpus\n")
    print_table(rows, args.markdown)
    if args.plot and (saved := plot_ratios(rows, args.plot)) is not None:
        print(f"\nbar chart saved to {os.path.abspath(saved)}")


if __name__ == "__main__":
    main()
