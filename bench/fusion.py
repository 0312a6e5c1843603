#!/usr/bin/env python3
"""Fusion cost model benchmark: transcendental elementwise ops (GELU, softmax, LayerNorm), GELU fused before, after
and between matmuls (a BERT FFN), and matmuls whose inputs the reduce reads with a stride (x.T @ y, x @ y.T, an
einsum, attention's merged heads, a convolution of a channels-last input).

    python bench/fusion.py                  # everything, 3 blocks x 5 calls per library
    python bench/fusion.py --only gelu ffn  # cases whose name starts with one of these
    python bench/fusion.py --blocks 2 --runs 3
    python bench/fusion.py --base ../main   # also time fusegrad of another checkout ("base") in the same blocks

Like bench/run.py (whose cases, workers and table this reuses): each (case, library) runs in a fresh worker process
of its own, in blocks that rotate the library order (bench/_procs.py); outputs of the first block are checked against
the reference library (NumPy, else PyTorch); the table gives medians over the blocks and each library's time against
the reference's in the same run. fusegrad times are whole realize() calls on a fresh lazy graph. `DEBUG=2` in front
of a `--worker` line shows the kernels of one case: `DEBUG=2 python bench/fusion.py --worker "gelu erf 1024x1536"
fusegrad --runs 1`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if os.environ.get("FUSION_BASE"):   # a "base" worker: fusegrad from another checkout (imported before run.py's own)
    sys.path.insert(0, os.environ["FUSION_BASE"])
    import fusegrad  # noqa: F401
import _procs
from run import LIBS, Case, array_case, check_outputs, load_torch, measure, print_table, rows_of, same


def tf() -> Any: return load_torch().nn.functional


def np_gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def np_layernorm(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)


def elementwise_cases() -> list[Case]:
    n, m = 1024, 1536
    b = 4 * 2 * n * m   # read and write each element once
    return [
        array_case("gelu", f"relu {n}x{m}", [(n, m)], same(lambda x: x.relu() if not isinstance(x, np.ndarray)
                                                            else np.maximum(x, 0)), b),
        array_case("gelu", f"gelu erf {n}x{m}", [(n, m)], {"fusegrad": lambda x: x.gelu("none"),
                                                         "torch": lambda x: tf().gelu(x)}, b, tol=2e-5),
        array_case("gelu", f"gelu tanh {n}x{m}", [(n, m)], {"fusegrad": lambda x: x.gelu("tanh"), "numpy": np_gelu_tanh,
                                                          "torch": lambda x: tf().gelu(x, approximate="tanh")}, b,
                   tol=2e-5),
        array_case("gelu", f"sigmoid {n}x{m}", [(n, m)], {"fusegrad": lambda x: x.sigmoid(),
                                                        "numpy": lambda x: 1 / (1 + np.exp(-x)),
                                                        "torch": lambda x: x.sigmoid()}, b, tol=2e-5),
        array_case("softmax", f"softmax {n}x{m}", [(n, m)], {"fusegrad": lambda x: x.softmax(1), "numpy": np_softmax,
                                                           "torch": lambda x: x.softmax(1)}, b, tol=2e-5),
        array_case("layernorm", f"layernorm {n}x{m}", [(n, m)], {"fusegrad": lambda x: x.layernorm(),
                                                               "numpy": np_layernorm,
                                                               "torch": lambda x: tf().layer_norm(x, (m,))}, b,
                   tol=2e-4)]


def ffn_cases() -> list[Case]:
    """GELU as a matmul epilogue, prologue, and between two matmuls (a BERT FFN: hidden 384, intermediate 1536)."""
    h, f = 384, 1536
    cases = []
    for t in (256, 1024):
        shapes = [(t, h), (h, f), (f,), (f, h)]
        flops = 2 * t * h * f * 2
        cases += [
            array_case("ffn", f"ffn gelu(x@W1+b)@W2 {t}", shapes,
                       {"fusegrad": lambda x, w1, b1, w2: (x @ w1 + b1).gelu("none") @ w2,
                        "torch": lambda x, w1, b1, w2: tf().gelu(x @ w1 + b1) @ w2}, flops, "GFLOPS", 2e-4),
            array_case("ffn", f"ffn relu(x@W1+b)@W2 {t}", shapes, same(
                lambda x, w1, b1, w2: np.maximum(x @ w1 + b1, 0) @ w2 if isinstance(x, np.ndarray)
                else (x @ w1 + b1).relu() @ w2), flops, "GFLOPS", 2e-4)]
    t = 1024
    cases += [
        array_case("epilogue", f"matmul+bias {t}x{h}@{h}x{f}", [(t, h), (h, f), (f,)], same(lambda x, w, b: x @ w + b),
                   2 * t * h * f, "GFLOPS", 2e-4),
        array_case("epilogue", f"matmul+bias+gelu {t}x{h}@{h}x{f}", [(t, h), (h, f), (f,)],
                   {"fusegrad": lambda x, w, b: (x @ w + b).gelu("none"), "torch": lambda x, w, b: tf().gelu(x @ w + b)},
                   2 * t * h * f, "GFLOPS", 2e-4),
        array_case("prologue", f"gelu(x)@W {t}x{f}@{f}x{h}", [(t, f), (f, h)],
                   {"fusegrad": lambda x, w: x.gelu("none") @ w, "torch": lambda x, w: tf().gelu(x) @ w},
                   2 * t * h * f, "GFLOPS", 2e-4)]
    return cases


def strided_cases() -> list[Case]:
    """Matmuls whose reduce reads an input with a stride, against the same product of contiguous inputs."""
    n = 1024
    mm = lambda fn: array_case("strided", fn.__doc__ or "", [(n, n), (n, n)], same(fn), 2 * n ** 3, "GFLOPS", 2e-4)

    def ab(a: Any, b: Any) -> Any:
        """a@b 1024"""
        return a @ b

    def aTb(a: Any, b: Any) -> Any:
        """a.T@b 1024"""
        return a.T @ b

    def abT(a: Any, b: Any) -> Any:
        """a@b.T 1024"""
        return a @ b.T

    def aTbT(a: Any, b: Any) -> Any:
        """a.T@b.T 1024"""
        return a.T @ b.T
    B, T, H, D = 8, 128, 12, 32
    heads = {"fusegrad": lambda a, w: a.permute(0, 2, 1, 3).reshape(B, T, H * D) @ w,
             "numpy": lambda a, w: a.transpose(0, 2, 1, 3).reshape(B, T, H * D) @ w,
             "torch": lambda a, w: a.permute(0, 2, 1, 3).reshape(B, T, H * D) @ w}
    einsum = {"fusegrad": lambda a, w: __import__("fusegrad").Tensor.einsum("bhtd,hdk->btk", a, w),
              "numpy": lambda a, w: np.einsum("bhtd,hdk->btk", a, w, optimize=True),
              "torch": lambda a, w: load_torch().einsum("bhtd,hdk->btk", a, w)}
    conv = {"fusegrad": lambda x, w: x.permute(0, 3, 1, 2).conv2d(w, padding=1),
            "torch": lambda x, w: tf().conv2d(x.permute(0, 3, 1, 2), w, padding=1)}
    t, h, f = 1024, 384, 1536
    linear = array_case("strided", f"linear x@w.T {t}x{h}@({f}x{h}).T", [(t, h), (f, h)], same(lambda x, w: x @ w.T),
                        2 * t * h * f, "GFLOPS", 2e-4)
    return [mm(ab), mm(aTb), mm(abT), mm(aTbT), linear,
            array_case("strided", f"heads merged @ Wo {B}x{H}x{T}x{D}", [(B, H, T, D), (H * D, H * D)], heads,
                       2 * B * T * (H * D) ** 2, "GFLOPS", 2e-4),
            array_case("strided", "einsum bhtd,hdk->btk", [(B, H, T, D), (H, D, H * D)], einsum,
                       2 * B * T * (H * D) ** 2, "GFLOPS", 2e-4),
            array_case("strided", "conv3x3 of NHWC.permute 32x32x32x32", [(32, 32, 32, 32), (32, 32, 3, 3)], conv,
                       2 * 32 * 32 * 32 * 32 * 32 * 9, "GFLOPS", 2e-4)]


def all_cases() -> list[Case]: return elementwise_cases() + ffn_cases() + strided_cases()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help="run only cases whose name or group starts with these")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--base", default=None, help="another fusegrad checkout to time as library 'base'")
    ap.add_argument("--markdown", default=None, help="also write the table as markdown to this path")
    ap.add_argument("--worker", nargs=2, default=None, metavar=("CASE", "LIB"), help="run one worker here")
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        case = next(c for c in all_cases() if c.name == args.worker[0])
        lib = "fusegrad" if args.worker[1] == "base" else args.worker[1]
        print(json.dumps(measure(case, lib, args.runs, args.save)))
        return
    have = [lib for lib in LIBS if lib != "torch" or importlib.util.find_spec("torch") is not None]
    want = lambda s: args.only is None or any(s.startswith(o) for o in args.only)
    cases = [c for c in all_cases() if want(c.name) or want(c.group)]
    for c in cases: c.libs = [lib for lib in c.libs if lib in have] + (["base"] if args.base else [])
    by_name = {c.name: c for c in cases}
    st, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as outdir:
        def path(name: str) -> Callable[[str], str]:
            return lambda lib: os.path.join(outdir, f"{list(by_name).index(name)}-{lib}.npy")

        def spawn(block: int, name: str, lib: str) -> list[float]:
            argv = [os.path.abspath(__file__), "--worker", name, lib, "--runs", str(args.runs)]
            env = {"FUSION_BASE": os.path.abspath(args.base)} if lib == "base" else None
            return _procs.spawn(argv + (["--save", path(name)(lib)] if block == 0 else []), env)
        times, failed = _procs.run_blocks({c.name: c.libs for c in cases}, args.blocks, spawn,
                                          lambda name: check_outputs(by_name[name], path(name)))
    rows = []
    for c in cases:
        if c.name in failed: rows.append([c.name, "FAILED", "-", failed[c.name].strip().splitlines()[-1][:80], "-"])
        else: rows += rows_of(c, {lib: times[c.name, lib] for lib in c.libs})
    print(f"\n{len(rows)} rows, {time.perf_counter() - st:.0f} s, {args.blocks} blocks x {args.runs} calls, load "
          f"average {load:.2f} at the start and {os.getloadavg()[0]:.2f} at the end\n")
    print_table(rows, args.markdown)


if __name__ == "__main__":
    main()
