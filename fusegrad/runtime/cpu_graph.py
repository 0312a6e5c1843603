"""The CPU device's call lists: a run of compiled CPU kernels launched by ONE call into C instead of one ctypes call
per kernel (a TinyJit replay's "graph", engine/jit.py).

A ctypes call costs a few microseconds of Python (argument conversion, releasing and taking the GIL); a decoded token
of a small LLM is ~500 kernel launches, so that was 1.5-2 ms of a ~15 ms token. Here the launches are one flat array
of 64-bit words, per call `[skip, function address, argument count k, a_0 .. a_k-1]`, that `fg_calls_run` walks,
calling each function whose skip word is 0 with its k arguments. The caller copies the array's template, patches the
words that change per run (the addresses of per-call buffers, the values of symbolic variables, the skip words of
relayouts that need not run again), and makes the one call.

Every kernel argument is an integer or a pointer (buffer addresses, `int`/`long long` variables, a split kernel's
chunk bounds or its pool trampoline's arguments, ops_cpu.CPUProgram.c_entry), so the walker passes each as a 64-bit
integer. On x86-64 (System V and Windows) and on non-Apple AArch64 an integer argument narrower than 64 bits occupies
a full 64-bit register or stack slot whose low bits are its value, so this calls each function exactly as its own
prototype would. Apple's AArch64 packs narrow stack arguments, and 32-bit targets have 32-bit slots: there (or without
a C compiler) `runner()` is None and the caller launches kernels one by one.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import threading
from typing import Any, Sequence

from fusegrad.runtime.ops_cpu import CPUProgram, cpu_compiler, load_shared_object

MAX_ARGS = 64   # kernels with more arguments are launched one by one

HEADER = 3      # words before a call's arguments: skip, function, argument count


def _walker_c() -> str:
    cases = []
    for k in range(MAX_ARGS + 1):
        params = ", ".join(["fg_word"] * k) or "void"
        args = ", ".join(f"a[{i}]" for i in range(k))
        cases.append(f"      case {k}: ((void (*)({params}))f)({args}); break;")
    body = "\n".join(cases)
    return f"""#include <stdint.h>
typedef long long fg_word;
/* run n calls laid out as [skip, function, k, a_0 .. a_k-1]; a call whose skip word is not 0 is passed over */
void fg_calls_run(const fg_word *p, int n) {{
  for (int c = 0; c < n; c++) {{
    const fg_word *a = p + {HEADER};
    void (*f)(void) = (void (*)(void))(intptr_t)p[1];
    int k = (int)p[2];
    if (!p[0]) switch (k) {{
{body}
      default: break;
    }}
    p += {HEADER} + k;
  }}
}}
"""


def abi_ok() -> bool:
    """Whether every integer argument of a kernel can be passed in a 64-bit slot here (module docstring)."""
    if ctypes.sizeof(ctypes.c_void_p) != 8: return False
    arch = platform.machine().lower()
    if arch in ("x86_64", "amd64"): return True
    return arch in ("aarch64", "arm64") and platform.system() != "Darwin"


_lock = threading.Lock()


def runner() -> Any:
    """fg_calls_run (compiled on first use, cached on disk like kernels), or None where it can't be used here."""
    with _lock: return _runner()


@functools.cache
def _runner() -> Any:
    if not abi_ok(): return None
    try:
        lib = load_shared_object(cpu_compiler().compile_cached(_walker_c()))
    except Exception:   # no compiler, a noexec temp dir: kernels are launched one by one
        return None
    fn = lib.fg_calls_run
    fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int], None
    _keep.append(lib)
    return fn


_keep: list[Any] = []   # the loaded library stays loaded


def c_entry(prg: Any) -> tuple[int, tuple[int, ...]] | None:
    """(function address, trailing arguments) that launch `prg` from C as f(*bufs, *vals, *trailing), the way its
    __call__ does; None when it is no CPU program or can't be launched from C (chunks run through the Python pool)."""
    return prg.c_entry() if isinstance(prg, CPUProgram) else None


class CallList:
    """Calls being gathered for a Calls object: `add` returns the word index of a call's skip word; its arguments are
    the words that follow the header."""

    def __init__(self) -> None:
        self.words: list[int] = []
        self.n = 0

    def add(self, fn: int, args: Sequence[int]) -> int:
        if len(args) > MAX_ARGS: raise ValueError(f"a call in a call list takes at most {MAX_ARGS} arguments, not "
                                                  f"{len(args)}")
        at = len(self.words)
        self.words += [0, fn, len(args), *args]
        self.n += 1
        return at

    def build(self) -> "Calls":
        return Calls(self.words, self.n)


class Calls:
    """A finished call list: `fresh()` gives a copy of its words to patch, `run(words)` makes the calls."""

    def __init__(self, words: list[int], n: int):
        if (run := runner()) is None: raise RuntimeError("fg_calls_run is not available here (cpu_graph.runner())")
        self.run_fn, self.n = run, n
        self.type = ctypes.c_int64 * len(words)
        self.template = bytes(self.type(*words))

    def fresh(self) -> Any:
        return self.type.from_buffer_copy(self.template)

    def run(self, words: Any) -> None:
        self.run_fn(words, self.n)
