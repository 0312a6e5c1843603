"""Opt-in (CUDA_COMPILE_ALL=1): every kernel the op suite produces, rendered by the CUDA renderer and compiled by NVRTC
to PTX and an sm_90 cubin, and rendered by the METAL renderer. No GPU is needed.

The kernels come from a process replay recording (fusegrad/replay, docs/debugging.md) of `python -m pytest test/ops`
on the default device (CPU; the op suite's small subsets on other devices are recorded too). That takes minutes, so
COMPILE_ALL_DB=PATH reuses a recording: an existing db is read, a missing one is written there first. Each distinct
kernel AST is rendered again from scratch with `to_program(ast, CUDARenderer())` (the CUDA renderer's own launch
dims and heuristic opts) and its source compiled once. COMPILE_ALL_REPORT=PATH writes the counts as JSON.

Outcomes per kernel: compiled; rejected (the renderer refuses a dtype the target lacks, with its message); failed
(any other exception while rendering or compiling: a renderer bug). The test fails on any failure.
"""
import collections
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from fusegrad.codegen import to_program
from fusegrad.device import CompileError
from fusegrad.renderer.cuda import CUDARenderer
from fusegrad.renderer.metal import MetalRenderer
from fusegrad.replay.worker import loads_ast
from fusegrad.runtime import ops_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(os.getenv("CUDA_COMPILE_ALL", "0") in ("", "0"),
                                reason="opt-in: set CUDA_COMPILE_ALL=1 (records the op suite, then minutes of NVRTC)")


def _rejects_dtype(e: Exception) -> bool:
    """The renderer's refusal of a dtype the target doesn't have (an expected outcome, not a bug)."""
    msg = str(e)
    return isinstance(e, RuntimeError) and ("has no type for" in msg or "has no 64-bit float" in msg or
                                            "is not supported on" in msg)


@pytest.fixture(scope="module")
def asts(tmp_path_factory) -> list[tuple[str, object]]:
    """(label, AST) for every distinct kernel AST in the recording (recording first when there is none)."""
    db = os.getenv("COMPILE_ALL_DB") or str(tmp_path_factory.mktemp("compile_all") / "ops.db")
    if not os.path.exists(db):
        env = {k: v for k, v in os.environ.items() if k not in ("DEV", "CUDA_COMPILE_ALL")}
        cmd = [sys.executable, "-m", "fusegrad.replay", "record", "--db", db, "--", sys.executable, "-m", "pytest",
               "-q", "-p", "no:cacheprovider", os.path.join(ROOT, "test", "ops")]
        subprocess.run(cmd, cwd=ROOT, env=env, check=False, timeout=3600, stdout=subprocess.DEVNULL)
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT name, device, test, ast FROM kernels WHERE ast IS NOT NULL ORDER BY id").fetchall()
    conn.close()
    seen, out = set(), []
    for name, device, test, blob in rows:
        if (h := hashlib.sha256(blob).hexdigest()) in seen: continue
        seen.add(h)
        out.append((f"{name} on {device} from {test or 'outside pytest'}", loads_ast(blob)))
    assert out, f"no kernels recorded in {db}"
    return out


def _report(target: str, counts: dict, reasons: collections.Counter, failures: list[str], extra: dict) -> None:
    summary = {"target": target, **counts, "rejected_by_reason": dict(reasons), "failures": failures[:50], **extra}
    print(f"\n{target}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) +
          "".join(f"\n  rejected ({n}): {r}" for r, n in reasons.items()) + "".join(f"\n  FAILED {f}" for f in failures[:20]))
    if path := os.getenv("COMPILE_ALL_REPORT"):
        old = {}
        if os.path.exists(path):
            with open(path) as f: old = json.load(f)
        with open(path, "w") as f: json.dump({**old, target: summary}, f, indent=1)


def _render_all(asts, renderer_cls) -> tuple[dict[str, str], collections.Counter, list[str]]:
    """{source: label} of the distinct sources, the rejections by reason, and the render failures."""
    sources: dict[str, str] = {}
    reasons: collections.Counter = collections.Counter()
    failures: list[str] = []
    for label, ast in asts:
        try: src = to_program(ast, renderer_cls()).src
        except Exception as e:
            if _rejects_dtype(e): reasons[str(e).splitlines()[0][:160]] += 1
            else: failures.append(f"{label}: render: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            continue
        sources.setdefault(src, label)
    return sources, reasons, failures


def test_every_op_suite_kernel_compiles_for_sm90(asts):
    try: ops_cuda.libnvrtc()
    except RuntimeError as e: pytest.skip(f"NVRTC unavailable: {e}")
    t0 = time.perf_counter()
    sources, reasons, failures = _render_all(asts, CUDARenderer)
    t_render = time.perf_counter() - t0
    compiled = warned = 0
    for src, label in sources.items():
        try: ptx, cubin, log = ops_cuda.nvrtc_compile(src, "sm_90")
        except CompileError as e:
            failures.append(f"{label}: NVRTC: {str(e).splitlines()[1][:300] if len(str(e).splitlines()) > 1 else e}")
            continue
        if cubin[:4] != b"\x7fELF" or ".target sm_90" not in ptx:
            failures.append(f"{label}: NVRTC gave no sm_90 cubin")
            continue
        compiled += 1
        warned += log != ""
    counts = {"kernel ASTs": len(asts), "distinct sources": len(sources), "compiled": compiled,
              "compiled with warnings": warned, "rejected": sum(reasons.values()), "failed": len(failures)}
    _report("CUDA sm_90 (NVRTC)", counts, reasons, failures,
            {"render_s": round(t_render, 1), "total_s": round(time.perf_counter() - t0, 1)})
    assert not failures, "\n".join(failures[:20])


def test_every_op_suite_kernel_renders_for_metal(asts):
    t0 = time.perf_counter()
    sources, reasons, failures = _render_all(asts, MetalRenderer)
    counts = {"kernel ASTs": len(asts), "distinct sources": len(sources), "rendered": len(asts) - sum(reasons.values())
              - len(failures), "rejected": sum(reasons.values()), "failed": len(failures)}
    _report("METAL (render only)", counts, reasons, failures, {"total_s": round(time.perf_counter() - t0, 1)})
    assert not failures, "\n".join(failures[:20])
