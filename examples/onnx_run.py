#!/usr/bin/env python3
"""Run an ONNX model with fusegrad on random (or given .npy) inputs.

    python examples/onnx_run.py MODEL.onnx                      # random inputs, dynamic dims set to 1
    python examples/onnx_run.py MODEL.onnx --input x=img.npy     # a given input
    python examples/onnx_run.py MODEL.onnx --runs 10 --dim batch=4

Prints every output's shape and dtype, the time per run (after one warm-up run that compiles the kernels) and, when
onnxruntime is installed, the largest absolute difference from onnxruntime's outputs.
"""

from __future__ import annotations
import argparse
import pathlib
import sys
import time
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import onnx  # noqa: E402
from onnx import helper  # noqa: E402
from fusegrad import Tensor  # noqa: E402
from fusegrad.onnx import OnnxRunner  # noqa: E402


def random_inputs(model: onnx.ModelProto, given: dict[str, np.ndarray], dims: dict[str, int], seed: int = 0):
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feed = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.name in given:
            feed[vi.name] = given[vi.name]
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1) for d in tt.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dt == np.bool_:
            feed[vi.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dt, np.integer):
            feed[vi.name] = rng.integers(0, 100, shape).astype(dt)
        else:
            feed[vi.name] = rng.standard_normal(shape).astype(dt)
    return feed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--input", action="append", default=[], help="NAME=FILE.npy")
    ap.add_argument("--dim", action="append", default=[], help="DIM_PARAM=SIZE for dynamic dimensions (default 1)")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    model = onnx.load(args.model)
    given = {k: np.load(v) for k, v in (s.split("=", 1) for s in args.input)}
    dims = {k: int(v) for k, v in (s.split("=", 1) for s in args.dim)}
    feed = random_inputs(model, given, dims)
    runner = OnnxRunner(model)
    tensors = {k: Tensor(v) for k, v in feed.items()}
    for t in tensors.values():
        t.realize()

    def run():
        outs = runner(tensors)
        for v in outs.values():
            if isinstance(v, Tensor):
                v.realize()
        return outs

    outs = run()
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    res = {k: (v.numpy() if isinstance(v, Tensor) else v) for k, v in outs.items()}
    for k, v in res.items():
        print(f"output {k}: shape {tuple(np.shape(v))} dtype {getattr(v, 'dtype', type(v).__name__)}")
    print(f"time per run: {1e3 * float(np.median(times)):.2f} ms (median of {args.runs})")
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime not installed: no comparison")
        return 0
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feed)
    for (k, v), r in zip(res.items(), ref):
        diff = float(np.max(np.abs(np.asarray(v, np.float64) - np.asarray(r, np.float64)))) if np.size(r) else 0.0
        print(f"max |fusegrad - onnxruntime| for {k}: {diff:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
