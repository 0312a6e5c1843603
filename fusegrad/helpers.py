"""Shared helpers used by every stage: environment flags (ContextVar/Context), counters, timing and small utilities.

Nothing here imports another fusegrad module, so every stage may use it.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import math
import os
import platform
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")

OSX = platform.system() == "Darwin"
WIN = platform.system() == "Windows"


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
DEV = ContextVar("DEV", "")
SPEC = ContextVar("SPEC", 0)
CACHELEVEL = ContextVar("CACHELEVEL", 2)
SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1)  # 0: schedule every graph from scratch (schedule/cache.py)
SPLIT_REDUCE = ContextVar("SPLIT_REDUCE", 32768)  # shortest reduce split into two kernels (schedule/split.py); 0: off
MERGE_RANGES = ContextVar("MERGE_RANGES", 1)   # 0: keep every loop of a kernel as its shape gives it (codegen/merge.py)
VIZ = ContextVar("VIZ", 0)
CHECK_OOB = ContextVar("CHECK_OOB", 0)  # debug aid: realize tensor indices, raise IndexError for out-of-range ones
PROFILE = ContextVar("PROFILE", 0)  # write the timeline as Chrome trace-event JSON (fusegrad/viz)
CAPTURE_PROCESS_REPLAY = ContextVar("CAPTURE_PROCESS_REPLAY", 0)  # record every compiled kernel (fusegrad/replay)


class GlobalCounters:
    """Process-wide counters updated by the engine (reset with `GlobalCounters.reset()`)."""
    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0
    kernel_count: int = 0
    mem_used: int = 0
    mem_used_per_device: dict[str, int] = {}

    @staticmethod
    def reset() -> None:
        GlobalCounters.global_ops, GlobalCounters.global_mem = 0, 0
        GlobalCounters.time_sum_s, GlobalCounters.kernel_count = 0.0, 0


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
def ceildiv(num: int, amt: int) -> int: return -(-num // amt)


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
    import re
    return re.sub(r"\x1b\[(K|.*?m)", "", s)


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
        import cProfile
        self.pr = cProfile.Profile()
        if self.enabled: self.pr.enable()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled: return
        self.pr.disable()
        if self.fn: self.pr.dump_stats(self.fn)
        import pstats
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
