"""bench/run.py runs a case in worker processes (one library each) and prints the table; only that it runs and what
it prints is checked here, never a time."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_run_quick_one_case():
    pytest.importorskip("numpy", reason="bench/run.py needs numpy")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", "matmul 256", "--blocks", "1",
            "--runs", "1"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.split()[:5] == ["case", "library", "median", "ms", "rate"] for line in lines), out.stdout
    rows = [line for line in lines if line.startswith("matmul 256 fp32")]
    assert [r.split()[3] for r in rows][:2] == ["fusegrad", "numpy"], out.stdout
    assert all(r.rstrip().endswith("x") for r in rows), out.stdout     # a time ratio against NumPy in every row
    assert "FAILED" not in out.stdout


def test_fusion_bench_one_case_with_base():
    # bench/fusion.py: one case, fusegrad and numpy (and torch when installed) plus the same checkout as "base"
    pytest.importorskip("numpy", reason="bench/fusion.py needs numpy")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "bench" / "fusion.py"), "--only", "sigmoid", "--blocks", "1", "--runs", "1",
            "--base", str(ROOT)]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("sigmoid 1024x1536")]
    assert {"fusegrad", "numpy", "base"} <= {r[2] for r in rows}, out.stdout
    assert "FAILED" not in out.stdout


def test_workers_for_an_avx2_target_hold_the_reference_libraries_at_avx2(monkeypatch):
    """CPU_MARCH=x86-64-v3 on an AVX-512 machine stands for an AVX2 machine: PyTorch's kernels, oneDNN, MKL and NumPy's
    OpenBLAS are told to stay at AVX2 in every worker (before, PyTorch kept its AVX-512 kernels); native leaves them."""
    sys.path.insert(0, str(ROOT))
    from bench import _procs
    probe = ["-c", "import json, os, torch; print(json.dumps([torch.backends.cpu.get_cpu_capability(), "
                   "os.environ.get('OPENBLAS_CORETYPE')]))"]
    for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE",
              "REFERENCE_ISA"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("CPU_MARCH", "x86-64-v3")
    pytest.importorskip("torch", reason="PyTorch is the reference library here")
    assert _procs.spawn(probe) == ["AVX2", "Haswell"]
    assert "ATEN_CPU_CAPABILITY=avx2" in _procs.machine_line()
    monkeypatch.setenv("REFERENCE_ISA", "native")
    assert _procs.reference_env() == {}
    monkeypatch.setenv("CPU_MARCH", "native")
    monkeypatch.delenv("REFERENCE_ISA")
    assert _procs.reference_env() == {} and "references at their own best ISA" in _procs.machine_line()
