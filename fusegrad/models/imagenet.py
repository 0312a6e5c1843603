"""ImageNet-1k helpers for the vision models: the 1000 class names in class-index order, and turning a picture (a file,
a PIL image or an (H, W, 3) uint8 array) into the normalized (1, 3, S, S) float32 input the models expect.

imagenet_classes.txt ("wnid<TAB>WordNet lemmas", one class per line, index order) was built from the files
timm/data/_info/imagenet_synsets.txt and imagenet_synset_to_lemma.txt of the PyPI package timm 1.0.29.
"""
from __future__ import annotations

import functools
import os
import pathlib
from typing import Any

MEAN = (0.485, 0.456, 0.406)   # ImageNet's per-channel RGB mean and std, for pixels scaled to [0, 1]
STD = (0.229, 0.224, 0.225)


@functools.cache
def imagenet_classes() -> tuple[tuple[str, str], ...]:
    """The 1000 ImageNet-1k classes as (WordNet id, names) pairs, in the models' output order.

    >>> imagenet_classes()[281]
    ('n02123045', 'tabby, tabby cat')
    """
    path = pathlib.Path(__file__).with_name("imagenet_classes.txt")
    rows = tuple(tuple(line.split("\t", 1)) for line in path.read_text(encoding="utf-8").splitlines() if line)
    if len(rows) != 1000 or any(len(r) != 2 for r in rows):
        raise RuntimeError(f"{path} is damaged: expected 1000 'wnid<TAB>names' lines, found {len(rows)}")
    return rows  # type: ignore[return-value]


def imagenet_labels() -> list[str]:
    """The 1000 class names, index i = output logit i.

    >>> imagenet_labels()[0]
    'tench, Tinca tinca'
    """
    return [names for _, names in imagenet_classes()]


def load_image(image: str | os.PathLike | Any) -> Any:
    """A PIL RGB image from a file path, a PIL image or an (H, W, 3) / (H, W) uint8 array. Needs Pillow
    (`pip install pillow`, or fusegrad's `models` extra); a file that isn't an image raises ValueError naming it."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ImportError("reading images needs Pillow: pip install pillow (or 'fusegrad[models]')") from None
    if isinstance(image, Image.Image): return image.convert("RGB")
    if isinstance(image, (str, os.PathLike)):
        try:
            with Image.open(image) as im: return im.convert("RGB")
        except UnidentifiedImageError:
            raise ValueError(f"{image} is not an image file Pillow can read") from None
    import numpy as np
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (3, 4)):
        raise ValueError(f"expected an (H, W, 3) uint8 image array, got dtype {arr.dtype} shape {arr.shape}")
    return Image.fromarray(arr).convert("RGB")


def preprocess(image: str | os.PathLike | Any, size: int = 224, resize: int | None = None,
               mean: tuple[float, ...] = MEAN, std: tuple[float, ...] = STD) -> Any:
    """An image -> a (1, 3, size, size) float32 numpy array: the short side resized to `resize` (default `size`;
    bilinear), the center `size` x `size` crop, pixels scaled to [0, 1], then (x - mean) / std per channel.
    EfficientNet's ports resize to their resolution (and skip the crop); torchvision's ResNets use resize=256, size=224.

    >>> import numpy as np
    >>> preprocess(np.zeros((300, 400, 3), np.uint8)).shape
    (1, 3, 224, 224)
    """
    import numpy as np
    from PIL import Image
    img = load_image(image)
    w, h = img.size
    short = size if resize is None else resize
    if short < size: raise ValueError(f"resize ({short}) must be at least the crop size ({size})")
    scale = short / min(w, h)
    img = img.resize((max(short, round(w * scale)), max(short, round(h * scale))), Image.Resampling.BILINEAR)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    pixels = np.asarray(img.crop((left, top, left + size, top + size)), dtype=np.float32) / 255.0   # (S, S, 3)
    x = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])                                         # (1, 3, S, S)


__all__ = ["MEAN", "STD", "imagenet_classes", "imagenet_labels", "load_image", "preprocess"]
