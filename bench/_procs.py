"""Benchmark workers: every measurement in a fresh process of one library, in blocks that rotate the library order.

A library's worker threads (OpenMP, OpenBLAS) keep spinning for a while after its call and slow whatever runs next
in the same process, so no two libraries share one. Block 1 measures every (case, library) once, then block 2, ...;
each case starts its libraries one further along than the case before and than in the block before, so a slow phase
of a shared machine hits all of them alike. Used by bench/run.py and bench/models.py.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's fusegrad
from fusegrad.runtime.machine import machine  # noqa: E402
from fusegrad.runtime.ops_cpu import find_compiler  # noqa: E402


# CPU_MARCH levels below AVX-512 -> what tells the reference libraries to stay at that level too: PyTorch's own kernels
# (ATEN_CPU_CAPABILITY), its oneDNN convolutions (ONEDNN_MAX_CPU_ISA), MKL (MKL_ENABLE_INSTRUCTIONS) and NumPy's
# OpenBLAS (OPENBLAS_CORETYPE). With CPU_MARCH=x86-64-v3 on an AVX-512 machine every library then runs AVX2 code, as on
# an AVX2 machine; without them PyTorch and NumPy kept their AVX-512 kernels and the comparison was across ISAs.
REFERENCE_ISA_ENV = {
    "x86-64-v3": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                  "OPENBLAS_CORETYPE": "Haswell"},
    "haswell": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                "OPENBLAS_CORETYPE": "Haswell"}}


def reference_env() -> dict[str, str]:
    """The variables that hold the reference libraries at CPU_MARCH's level (REFERENCE_ISA_ENV; none for native or
    AVX-512, and none that the caller set already). REFERENCE_ISA=native turns it off."""
    if os.environ.get("REFERENCE_ISA") == "native": return {}
    want = REFERENCE_ISA_ENV.get(os.environ.get("CPU_MARCH", "native").lower(), {})
    return {k: v for k, v in want.items() if k not in os.environ}


def machine_line() -> str:
    """What the workers' CPU kernels are built for (CPU_MARCH; runtime/machine.py), the level the reference libraries
    are held at (reference_env, or OPENBLAS_CORETYPE when set), and the load average now: the first line of a result
    table."""
    cc = find_compiler(raise_error=False)
    isa = machine(cc).describe() if cc is not None else "no C compiler"
    env = {**reference_env(), **{k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "OPENBLAS_CORETYPE")
                                 if k in os.environ}}
    refs = f"; references held at {', '.join(f'{k}={v}' for k, v in sorted(env.items()))}" if env else \
        "; references at their own best ISA"
    return f"fusegrad CPU target: {isa}{refs}; load average {os.getloadavg()[0]:.2f}"


class WorkerFailed(RuntimeError):
    """A worker process exited with an error: its exit status (negative: killed by that signal) and its stderr."""
    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.returncode, self.stderr = returncode, stderr
        self.status = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
        super().__init__(f"worker {' '.join(argv[1:])} failed ({self.status}):\n{stderr[-3000:]}")

    @property
    def reason(self) -> str:
        """One line: the exit status and stderr's last line, or for a crash that faulthandler reported, its first line
        and the innermost Python frame."""
        lines = [ln.strip() for ln in self.stderr.strip().splitlines() if ln.strip()]
        fatal = next((i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")), None)
        if fatal is not None:
            frame = next((ln for ln in lines[fatal:] if ln.startswith("File ")), "")
            return f"{self.status}: {lines[fatal]} {frame}"[:400]
        return self.status + (f": {lines[-1][:300]}" if lines else " (nothing on stderr)")


def spawn(argv: list[str], env: dict[str, str] | None = None, timeout: float = 3600,
          python: str | None = None) -> Any:
    """Run `python *argv` in a new process (this Python, or `python`) and return the JSON value on the last line of
    its stdout."""
    out = subprocess.run([python or sys.executable, *argv], capture_output=True, text=True,
                         env={**os.environ, **reference_env(), **(env or {})}, check=False, timeout=timeout)
    if out.returncode != 0: raise WorkerFailed(argv, out.returncode, out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def rotated(items: list[str], k: int) -> list[str]:
    k %= len(items)
    return items[k:] + items[:k]


def run_blocks(cases: dict[str, list[str]], blocks: int, measure: Callable[[int, str, str], list[float]],
               check: Callable[[str], None] | None = None) -> tuple[dict[tuple[str, str], list[float]], dict[str, str]]:
    """Time every case's libraries (`cases`: case -> libraries) in `blocks` rotating blocks.

    `measure(block, case, lib)` runs one worker and returns its times; `check(case)` runs after the first block's
    workers of a case. Returns the times per (case, library) over all blocks, and the cases that failed (case -> the
    error), which are not run again."""
    times: dict[tuple[str, str], list[float]] = {}
    failed: dict[str, str] = {}
    for b in range(blocks):
        for i, (case, libs) in enumerate(cases.items()):
            if case in failed: continue
            try:
                for lib in rotated(libs, b + i):
                    got = measure(b, case, lib)
                    times.setdefault((case, lib), []).extend(got)
                    print(f"block {b + 1}/{blocks}  {case:40s} {lib:13s} median so far "
                          f"{statistics.median(times[case, lib]) * 1e3:9.2f} ms", file=sys.stderr, flush=True)
                if b == 0 and check is not None: check(case)
            except Exception as e:  # one failing case shouldn't hide the rest of the table
                failed[case] = f"{type(e).__name__}: {e}"
                print(f"block {b + 1}/{blocks}  {case} FAILED: {failed[case][-2000:]}", file=sys.stderr, flush=True)
    return times, failed
