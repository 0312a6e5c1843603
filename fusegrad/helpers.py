"""Shared helpers used by every stage: environment flags (ContextVar/Context), counters, timing and small utilities.

Nothing here imports another fusegrad module, so every stage may use it.
"""
from __future__ import annotations

import cProfile
import contextlib
import contextvars
import functools
import getpass
import gzip
import hashlib
import importlib
import math
import os
import pathlib
import platform
import pstats
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")

OSX = platform.system() == "Darwin"
WIN = platform.system() == "Windows"
CI = os.getenv("CI", "") != ""


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """Read an environment variable converted to the type of `default` (cached).

    >>> getenv("SOME_UNSET_FLAG_FOR_DOCTEST", 3)
    3
    """
    return type(default)(os.getenv(key, default))


# ---------------------------------------------------------------------------------------------------------------------
# ContextVar / Context: flags that start from the environment and can be changed (per thread) for a `with` block.

class ContextVar:
    """A named flag whose value comes from the environment at import and can be overridden with `Context`.

    Overrides are per thread (a `contextvars.ContextVar` underneath): `with Context(DEV="PYTHON"):` or
    `X.value = v` in one thread doesn't change what other threads see; a new thread starts from the environment's
    value."""
    _cache: dict[str, "ContextVar"] = {}
    key: str

    def __init__(self, key: str, default: Any):
        if key in ContextVar._cache:
            raise RuntimeError(f"ContextVar {key!r} is defined twice")
        self.key, self.default = key, default
        self._env = getenv(key, default)
        self._var: contextvars.ContextVar[Any] = contextvars.ContextVar(f"fusegrad.{key}")
        ContextVar._cache[key] = self

    @property
    def value(self) -> Any: return self._var.get(self._env)

    @value.setter
    def value(self, v: Any) -> None: self._var.set(v)

    def __bool__(self) -> bool: return bool(self.value)
    def __eq__(self, other: object) -> bool: return bool(self.value == other)
    def __ge__(self, other: Any) -> bool: return bool(self.value >= other)
    def __gt__(self, other: Any) -> bool: return bool(self.value > other)
    def __lt__(self, other: Any) -> bool: return bool(self.value < other)
    def __le__(self, other: Any) -> bool: return bool(self.value <= other)
    def __hash__(self) -> int: return hash(self.key)
    def __repr__(self) -> str: return f"ContextVar({self.key}={self.value!r})"


class Context(contextlib.ContextDecorator):
    """Temporarily set ContextVars by name; usable as `with Context(DEBUG=2):` or as a decorator.

    >>> with Context(DEBUG=0): pass
    """
    def __init__(self, **kwargs: Any):
        unknown = [k for k in kwargs if k not in ContextVar._cache]
        if unknown:
            raise KeyError(f"unknown Context variable(s) {unknown}; known: {sorted(ContextVar._cache)}")
        self.kwargs = kwargs
        self.stack: list[dict[str, Any]] = []

    def __enter__(self) -> "Context":
        self.stack.append({k: ContextVar._cache[k].value for k in self.kwargs})
        for k, v in self.kwargs.items(): ContextVar._cache[k].value = v
        return self

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.stack.pop().items(): ContextVar._cache[k].value = v


DEBUG = ContextVar("DEBUG", 0)
TRAINING = ContextVar("TRAINING", 0)
NOOPT = ContextVar("NOOPT", 0)
BEAM = ContextVar("BEAM", 0)
JITBEAM = ContextVar("JITBEAM", 0)
IGNORE_BEAM_CACHE = ContextVar("IGNORE_BEAM_CACHE", 0)
BEAM_BUDGET = ContextVar("BEAM_BUDGET", 20.0)  # seconds of search per kernel
BEAM_ROUNDS = ContextVar("BEAM_ROUNDS", 4)
JIT = ContextVar("JIT", 1)
JIT_VERIFY = ContextVar("JIT_VERIFY", 0)  # N: each of a TinyJit's first N replays also runs eagerly, and must agree
JIT_GRAPH = ContextVar("JIT_GRAPH", 1)  # 1: a replay runs each run of CPU kernels with one call into C
DEV = ContextVar("DEV", "")
SPEC = ContextVar("SPEC", 0)
CACHELEVEL = ContextVar("CACHELEVEL", 2)
CACHE_MAX_MB = ContextVar("CACHE_MAX_MB", 1024)  # the compile cache's size cap (diskcache.py): LRU eviction past it
# 1: reference mode, every cache that could serve a stale value off (TinyJit runs the function each call; no schedule,
# result or relayout cache): the slow, trustworthy baseline the program fuzzer compares with (docs/debugging.md)
REFERENCE = ContextVar("REFERENCE", 0)
SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1)  # 0: schedule every graph from scratch (schedule/cache.py)
SPLIT_REDUCE = ContextVar("SPLIT_REDUCE", 32768)  # shortest reduce split into two kernels (schedule/split.py); 0: off
SPLIT_REDUCEOP = ContextVar("SPLIT_REDUCEOP", 1)  # tinygrad's switch for the same: 0 turns the split off
# tinygrad's flag to fuse arange into its consumers; taken and ignored: fusegrad always does (an IOTA node in the
# kernel)
FUSE_ARANGE = ContextVar("FUSE_ARANGE", 0)
MERGE_RANGES = ContextVar("MERGE_RANGES", 1)   # 0: keep every loop of a kernel as its shape gives it (codegen/merge.py)
VIZ = ContextVar("VIZ", 0)
CHECK_OOB = ContextVar("CHECK_OOB", 0)  # debug aid: realize tensor indices, raise IndexError for out-of-range ones
Q8_ACTIVATIONS = ContextVar("Q8_ACTIVATIONS", -1)  # quantized matvecs on 8-bit activations: 1 on, 0 off (float
                                                  # activations, transformers' numerics), -1 (default) where the
                                                  # device has 8-bit dot products (models/quantized.py)
PROFILE = ContextVar("PROFILE", 0)  # write the timeline as Chrome trace-event JSON (fusegrad/viz)
FUSE_OPTIM = ContextVar("FUSE_OPTIM", 0)  # the optimizers' `fused=` default: one flat update over all parameters
CAPTURE_PROCESS_REPLAY = ContextVar("CAPTURE_PROCESS_REPLAY", 0)  # record every compiled kernel (fusegrad/replay)


class GlobalCounters:
    """Process-wide counters updated by the engine (reset with `GlobalCounters.reset()`)."""
    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0
    kernel_count: int = 0
    copy_time_s: float = 0.0   # the part of time_sum_s spent in copies between devices (and their byte count)
    copy_bytes: int = 0
    mem_used: int = 0
    mem_used_per_device: dict[str, int] = {}

    @staticmethod
    def reset() -> None:
        GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0
        GlobalCounters.time_sum_s, GlobalCounters.kernel_count = 0.0, 0
        GlobalCounters.copy_time_s, GlobalCounters.copy_bytes = 0.0, 0


# ---------------------------------------------------------------------------------------------------------------------
# small utilities

def prod(xs: Iterable[Any], start: Any = 1) -> Any:
    return functools.reduce(lambda a, b: a * b, xs, start)


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
    return [x for xs in xss for x in xs]


def dedup(xs: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(xs))


def argfix(*x: Any) -> tuple:
    """Accept both f(1, 2) and f((1, 2)) / f([1, 2])."""
    if x and x[0].__class__ in (tuple, list):
        if len(x) != 1:
            raise ValueError(f"bad arguments {x}: pass either a sequence or separate values")
        return tuple(x[0])
    return x


def all_int(t: Sequence[Any]) -> bool:
    return all(isinstance(s, int) for s in t)


def all_same(items: Sequence[Any]) -> bool:
    return all(x == items[0] for x in items)


def make_tuple(x: int | Sequence[int], cnt: int) -> tuple[int, ...]:
    return (x,) * cnt if isinstance(x, int) else tuple(x)


def round_up(num: int, amt: int) -> int: return (num + amt - 1) // amt * amt
def round_down(num: int, amt: int) -> int: return num // amt * amt
def ceildiv(num: int, amt: int) -> int: return -(-num // amt)


def next_power2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1).

    >>> [next_power2(x) for x in (0, 1, 5, 8)]
    [1, 1, 8, 8]
    """
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def cdiv(x: int, y: int) -> int:
    """C-style integer division (rounds toward zero); 0 when y == 0, as tinygrad's helper.

    >>> cdiv(-7, 2), cmod(-7, 2)
    (-3, -1)
    """
    return abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) if y != 0 else 0


def cmod(x: int, y: int) -> int: return x - cdiv(x, y) * y
def lo32(x: Any) -> Any: return x & 0xFFFFFFFF
def hi32(x: Any) -> Any: return x >> 32
def data64(x: Any) -> tuple[Any, Any]: return (x >> 32, x & 0xFFFFFFFF)
def data64_le(x: Any) -> tuple[Any, Any]: return (x & 0xFFFFFFFF, x >> 32)


def getbits(value: int, start: int, end: int) -> int:
    """Bits start..end (inclusive) of value: getbits(0b101100, 2, 3) == 0b11."""
    return (value >> start) & ((1 << (end - start + 1)) - 1)


def i2u(bits: int, value: int) -> int:
    """A signed value as the unsigned integer of the same `bits` bits: i2u(8, -1) == 255."""
    return value if value >= 0 else (1 << bits) + value


def fully_flatten(x: Any) -> list[Any]:
    """Every leaf of nested sequences (and of array-likes with .shape), in order.

    >>> fully_flatten([[1, [2, 3]], (4,)])
    [1, 2, 3, 4]
    """
    if not (hasattr(x, "__len__") and hasattr(x, "__getitem__")) or isinstance(x, (str, bytes)): return [x]
    if getattr(x, "shape", None) == (): return [x[()]]
    return [y for xi in x for y in fully_flatten(xi)]


def get_single_element(xs: Sequence[T]) -> T:
    if len(xs) != 1: raise ValueError(f"expected exactly one element, got {len(xs)}: {xs}")
    return xs[0]


def merge_dicts(ds: Iterable[dict[Any, Any]]) -> dict[Any, Any]:
    """One dict from many; a key given two different values raises RuntimeError."""
    out: dict[Any, Any] = {}
    for d in ds:
        for k, v in d.items():
            if k in out and out[k] != v: raise RuntimeError(f"merge_dicts: key {k!r} has values {out[k]!r} and {v!r}")
            out[k] = v
    return out


def pluralize(word: str, cnt: int) -> str:
    """'1 kernel', '3 kernels'."""
    return f"{cnt} {word}" + ("" if cnt == 1 else "s")


def polyN(x: Any, coeffs: Sequence[float]) -> Any:
    """Horner's rule: coeffs[0]*x**(n-1) + ... + coeffs[-1] (works on Tensors too)."""
    return functools.reduce(lambda acc, c: acc * x + c, coeffs, 0.0)


def temp(name: str, append_user: bool = False) -> str:
    """A path in the system temp dir (optionally suffixed with the user name)."""
    return os.path.join(tempfile.gettempdir(), f"{name}.{getpass.getuser()}" if append_user else name)


def is_numpy_ndarray(x: Any) -> bool: return type(x).__module__ == "numpy" and type(x).__name__ == "ndarray"


def fromimport(mod: str, frm: str) -> Any:
    return getattr(importlib.import_module(mod), frm)


def flat_mv(mv: memoryview) -> memoryview:
    """A memoryview seen as flat bytes."""
    return mv if len(mv) == 0 else mv.cast("B", shape=(mv.nbytes,))


def partition(xs: Iterable[T], pred: Callable[[T], bool]) -> tuple[list[T], list[T]]:
    a: list[T] = []
    b: list[T] = []
    for x in xs: (a if pred(x) else b).append(x)
    return a, b


def unwrap(x: T | None) -> T:
    assert x is not None
    return x


def argsort(x: Sequence[Any]) -> list[int]:
    return sorted(range(len(x)), key=x.__getitem__)


def get_child(obj: Any, key: str) -> Any:
    for k in key.split("."):
        obj = obj[int(k)] if k.isnumeric() else (obj[k] if isinstance(obj, dict) else getattr(obj, k))
    return obj


def colored(st: str, color: str | None, background: bool = False) -> str:
    """Wrap `st` in an ANSI color code (no-op for color=None)."""
    if color is None: return st
    colors = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]
    return f"\u001b[{10*background + 60*(color.upper() == color) + 30 + colors.index(color.lower())}m{st}\u001b[0m"


def ansistrip(s: str) -> str:
    return re.sub(r"\x1b\[(K|.*?m)", "", s)


def ansilen(s: str) -> int: return len(ansistrip(s))


def word_wrap(s: str, wrap: int = 80) -> str:
    """Break lines longer than `wrap` visible characters (ANSI color codes don't count)."""
    out = []
    for line in s.splitlines() or [""]:
        while ansilen(line) > wrap:
            i = 0
            while ansilen(line[:i]) < wrap: i += 1
            out.append(line[:i])
            line = line[i:]
        out.append(line)
    return "\n".join(out)


def to_function_name(s: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else f"{ord(c):02X}" for c in ansistrip(s))


def hash_bytes(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts: h.update(p.encode() if isinstance(p, str) else p)
    return h.hexdigest()


def cache_dir() -> str:
    """Where fusegrad keeps on-disk caches: $XDG_CACHE_HOME/fusegrad or ~/.cache/fusegrad."""
    base = os.getenv("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fusegrad")


def time_to_str(t: float, w: int = 8) -> str:
    return next((f"{t * d:{w}.2f}{pr}" for d, pr in [(1, "s "), (1e3, "ms")] if t > 10 / d), f"{t * 1e6:{w}.2f}us")


def size_to_str(n: float) -> str:
    for unit in ["B", "KB", "MB", "GB"]:
        if abs(n) < 1024: return f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TB"


class Timing(contextlib.ContextDecorator):
    """Print how long a block took: `with Timing("step: "): ...`."""
    def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True):
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled

    def __enter__(self) -> "Timing":
        self.st = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.et = time.perf_counter_ns() - self.st
        if self.enabled:
            print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


class Profiling(contextlib.ContextDecorator):
    """cProfile the block and print the top functions by `sort`."""
    def __init__(self, enabled: bool = True, sort: str = "cumtime", frac: float = 0.2, fn: str | None = None, ts: int = 1):
        self.enabled, self.sort, self.frac, self.fn, self.ts = enabled, sort, frac, fn, ts

    def __enter__(self) -> "Profiling":
        self.pr = cProfile.Profile()
        if self.enabled: self.pr.enable()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled: return
        self.pr.disable()
        if self.fn: self.pr.dump_stats(self.fn)
        stats = pstats.Stats(self.pr).strip_dirs().sort_stats(self.sort)
        stats.print_stats(self.frac)


class tqdm:
    """A small dependency-free progress bar with the tqdm interface used by examples (`tqdm(it)`, `trange(n)`)."""
    def __init__(self, iterable: Iterable[Any] | None = None, desc: str = "", disable: bool = False, unit: str = "it",
                 unit_scale: bool = False, total: int | None = None, rate: int = 100):
        self.iterable, self.disable, self.unit, self.unit_scale, self.rate = iterable, disable, unit, unit_scale, rate
        self.st, self.i, self.n, self.skip = time.perf_counter(), -1, 0, 1
        self.t = getattr(iterable, "__len__", lambda: 0)() if total is None else total
        self.set_description(desc)
        self.update(0)

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None, "need an iterable to iterate"
        for item in self.iterable:
            yield item
            self.update(1)
        self.update(close=True)

    def __enter__(self) -> "tqdm": return self
    def __exit__(self, *exc: Any) -> None: self.update(close=True)
    def set_description(self, desc: str) -> None: self.desc = f"{desc}: " if desc else ""

    @classmethod
    def write(cls, s: str) -> None:
        print(f"\r\033[K{s}", flush=True, file=sys.stderr)

    def update(self, n: int = 0, close: bool = False) -> None:
        self.n, self.i = self.n + n, self.i + 1
        if self.disable or (not close and self.i % self.skip != 0): return
        prog, elapsed = self.n / self.t if self.t else 0, time.perf_counter() - self.st
        if elapsed and self.i / elapsed > self.rate and self.i: self.skip = max(int(self.i / elapsed) // self.rate, 1)
        rate = self.n / elapsed if elapsed else 0
        bar = ""
        if self.t:
            w = 20
            filled = int(w * prog)
            bar = f"{100 * prog:3.0f}%|{'█' * filled}{' ' * (w - filled)}| "
        total = f"/{self.t}" if self.t else ""
        print(f"\r\033[K{self.desc}{bar}{self.n}{total} [{elapsed:.1f}s, {rate:.2f}{self.unit}/s]",
              end="\n" if close else "", flush=True, file=sys.stderr)


class trange(tqdm):
    def __init__(self, n: int, **kwargs: Any):
        super().__init__(iterable=range(n), total=n, **kwargs)


def strip_parens(s: str) -> str:
    return s[1:-1] if s[0] == "(" and s[-1] == ")" and s[1:-1].find("(") <= s[1:-1].find(")") else s


def is_finite_number(x: float) -> bool:
    return not (math.isinf(x) or math.isnan(x))


# ---------------------------------------------------------------------------------------------------------------------
# fetch: a URL -> a file in the cache (downloaded once, atomically, optionally checked and gunzipped)

class DownloadError(OSError):
    """fetch could not download a URL. The message names the URL and where to put the file by hand; `reason` is why."""
    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _is_url(s: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", s) is not None


def _local_path(url: str | os.PathLike) -> pathlib.Path | None:
    """The path `url` names on this machine (a path, or a file:// URL), or None for a URL to download."""
    if isinstance(url, os.PathLike): return pathlib.Path(url)
    if not isinstance(url, str): raise TypeError(f"fetch: expected a URL or a path, got {type(url).__name__}")
    if url.startswith("file://"):
        return pathlib.Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    return None if _is_url(url) else pathlib.Path(url)


def _download_progress(label: str, done: int, total: int, final: bool = False, width: int = 30) -> None:
    if total:
        filled = width * min(done, total) // total
        line = f"{label}: [{'#' * filled}{'.' * (width - filled)}] {done / 1e6:.1f}/{total / 1e6:.1f} MB"
    else:
        line = f"{label}: {done / 1e6:.1f} MB"
    sys.stderr.write(f"\r{line}" + ("\n" if final else ""))
    sys.stderr.flush()


def _check_sha256(actual: str, expected: str, what: str) -> None:
    if actual.lower() != expected.lower():
        raise ValueError(f"fetch: sha256 mismatch for {what}: expected {expected.lower()}, got {actual}")


def _file_sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20): h.update(chunk)
    return h.hexdigest()


def _gunzip_to(src: pathlib.Path, dest: pathlib.Path, what: str) -> None:
    """Decompress `src` into `dest` through a temporary file next to it."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(src, "rb") as f: shutil.copyfileobj(f, out, 1 << 20)
        os.replace(tmp, dest)
    except (OSError, EOFError, zlib.error) as e:
        os.unlink(tmp)
        if isinstance(e, (gzip.BadGzipFile, EOFError, zlib.error)):
            raise ValueError(f"fetch: {what} is not valid gzip data ({e}), but gunzip=True was passed") from None
        raise


def _open_within(request: Any, timeout: float) -> Any:
    """urlopen(request) that gives up after `timeout` seconds in all. urlopen's own timeout bounds each socket
    operation but not the name lookup, which can block for minutes on a machine with no DNS server answering; so the
    opening runs in a thread that is abandoned (and closes what it opened, if it ever gets an answer) at the deadline."""
    result: dict[str, Any] = {}
    gave_up = threading.Event()

    def opener() -> None:
        try:
            result["response"] = urllib.request.urlopen(request, timeout=timeout)
            if gave_up.is_set(): result["response"].close()
        except Exception as e:  # noqa: BLE001 - raised again in the caller's thread
            result["error"] = e
    worker = threading.Thread(target=opener, name="fusegrad-fetch", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        gave_up.set()
        url = request if isinstance(request, str) else request.full_url
        raise urllib.error.URLError(f"no answer from {urllib.parse.urlsplit(url).netloc} within {timeout:g} s")
    if "error" in result: raise result["error"]
    return result["response"]


def _stream_to(url: str, dest: pathlib.Path, label: str, headers: dict[str, str] | None, timeout: float,
               sha256: str | None) -> None:
    """Download `url` into `dest` through a temporary file in the same folder, renamed into place only once complete
    (and, given `sha256`, checked)."""
    h = hashlib.sha256()
    with _open_within(urllib.request.Request(url, headers=headers) if headers else url, timeout) as r:
        total = int(r.headers.get("Content-Length") or 0)
        show = bool(total) or sys.stderr.isatty()
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                done, last = 0, 0.0
                while chunk := r.read(1 << 16):
                    f.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    if show and time.monotonic() - last > 0.1:
                        _download_progress(label, done, total)
                        last = time.monotonic()
            if show: _download_progress(label, done, total, final=True)
            if total and done != total: raise OSError(f"the connection closed after {done} of {total} bytes")
            if sha256 is not None and h.hexdigest() != sha256.lower():
                raise ValueError(f"fetch: sha256 mismatch for {url}: expected {sha256.lower()}, got {h.hexdigest()}; "
                                 "the download was deleted")
            os.replace(tmp, dest)
        except BaseException:
            os.unlink(tmp)
            raise


def fetch(url: str | os.PathLike, name: str | os.PathLike | None = None, subdir: str | None = None,
          gunzip: bool = False, allow_caching: bool | None = None, headers: dict[str, str] | None = None,
          sha256: str | None = None, timeout: float = 60.0) -> pathlib.Path:
    """Download `url` once into fusegrad's cache and return the file's path (tinygrad's `fetch` signature).

    The file goes to `cache_dir()/downloads/[subdir/]name` ($XDG_CACHE_HOME/fusegrad or ~/.cache/fusegrad); `name`
    defaults to a hash of the URL and its last path part. A `name` that is a Path or holds a "/" is the whole
    destination; otherwise the path must stay inside the downloads folder (ValueError for an absolute `subdir`, a
    `..`, or a symlink below the folder leading out). A later call finds the file there and doesn't download again
    (unless allow_caching=False or $DISABLE_HTTP_CACHE is set). Downloads are written to a temporary file, then
    renamed into place, with a progress bar on stderr. `sha256` (hex) checks the bytes as served: a mismatch removes
    the file and raises ValueError (a cached file is checked too, and downloaded again if it fails, except a
    gunzipped one, checked only on download).
    `gunzip` stores the decompressed data. A local path (or a file:// URL) is returned as it is (gunzip=True
    decompresses it into the cache instead). `timeout` (seconds) bounds the whole opening, name lookup included, and
    each read. A failed download raises DownloadError naming the URL and where to put the file by hand.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp(), "w.bin"); _ = p.write_bytes(b"hi")
    >>> fetch(p) == p
    True
    """
    whole = name is not None and (isinstance(name, os.PathLike) or "/" in name or os.sep in name)
    _check_cache_parts(subdir, None if whole else (name or None))
    local = _local_path(url)
    if allow_caching is None: allow_caching = not os.getenv("DISABLE_HTTP_CACHE")
    if local is not None: return _fetch_local(local, gunzip, sha256)
    assert isinstance(url, str)
    last = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if whole:
        fp = pathlib.Path(name).expanduser()
    else:
        default = f"{hash_bytes(url)[:16]}-{last or 'download'}" + (".gunzip" if gunzip else "")
        fp = _download_path(subdir, name or default)
    if allow_caching and fp.is_file():
        if sha256 is None or gunzip: return fp
        try:  # a cached file that fails the check (an older version, a hand-copied file) is downloaded again
            _check_sha256(_file_sha256(fp), sha256, f"the cached {fp}")
            return fp
        except ValueError:
            fp.unlink()
    fp.parent.mkdir(parents=True, exist_ok=True)
    raw = fp.with_name(f".{fp.name}.gz") if gunzip else fp
    try:
        _stream_to(url, raw, fp.name if name is not None else last, headers, timeout, sha256)
    except OSError as e:
        why = f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError) else str(getattr(e, "reason", e))
        raise DownloadError(f"fetch: could not download {url} ({why}). If you have the file, pass its path instead of "
                            f"the URL, or put it at {fp}", why) from None
    if gunzip:
        try:
            _gunzip_to(raw, fp, url)
        finally:
            raw.unlink(missing_ok=True)
    return fp


def _check_cache_parts(subdir: str | None, name: str | None) -> None:
    """ValueError for a `subdir` or plain `name` of fetch that would lead out of (or onto) the downloads folder."""
    for what, part in (("subdir", subdir), ("name", name)):
        if part is None: continue
        pp = pathlib.PurePath(part)
        if pp.is_absolute() or ".." in pp.parts or (what == "name" and pp.name in ("", ".")):
            raise ValueError(f"fetch: {what}={str(part)!r} would leave the cache folder "
                             f"{pathlib.Path(cache_dir(), 'downloads')}; pass a plain relative "
                             f"{'folder' if what == 'subdir' else 'file name'} without '..' (or a Path as name to "
                             "choose the whole destination)")


def _download_path(subdir: str | None, name: str) -> pathlib.Path:
    """`cache_dir()/downloads/[subdir/]name`, checked to stay inside that folder: ValueError for an absolute subdir,
    a `..` part, a name that is empty, `.` or `..`, or a symlink below the folder that leads out of it."""
    _check_cache_parts(subdir, name)
    root = pathlib.Path(cache_dir(), "downloads")
    fp = root / (subdir or "") / name
    real_root, real = root.resolve(), fp.resolve()
    if real == real_root or not real.is_relative_to(real_root):
        raise ValueError(f"fetch: {fp} resolves to {real}, outside the cache folder {real_root} (a symlink below it "
                         "leads out); remove the link or pass a Path as name to choose the destination")
    return fp


def _fetch_local(path: pathlib.Path, gunzip: bool, sha256: str | None) -> pathlib.Path:
    if not path.is_file(): raise FileNotFoundError(f"fetch: {path} is not a file")
    if sha256 is not None: _check_sha256(_file_sha256(path), sha256, str(path))
    if not gunzip: return path
    st = path.stat()
    key = hash_bytes(str(path.resolve()), str(st.st_size), str(st.st_mtime_ns))[:16]
    dest = pathlib.Path(cache_dir(), "downloads", f"{key}-{path.name}.gunzip")
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        _gunzip_to(path, dest, str(path))
    return dest


class ShapeError(RuntimeError, ValueError):
    """A shape that doesn't fit (reshape to another size, a broadcast or expand that can't be done, malformed padding).

    tinygrad raises ValueError for these and torch RuntimeError; this is both, so porting code that catches either
    keeps working.

    ```python
    try: Tensor.ones(2, 3).reshape(4, 2)
    except ValueError: pass
    ```
    """


class BoundsError(IndexError, ValueError):
    """A slice or shrink bound outside its axis (for a symbolic bound: for the value bound). torch raises IndexError for
    indices out of range and tinygrad ValueError ("invalid shrink"); this is both."""


class JoinShapeError(ShapeError, AssertionError):
    """Tensors to `cat` or `stack` whose shapes don't fit together: a ShapeError (RuntimeError, torch's type, and
    ValueError) that is also an AssertionError, the type tinygrad's shape check raises."""
