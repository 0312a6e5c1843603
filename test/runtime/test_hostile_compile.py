"""The CPU compiler and kernel cache against a hostile environment: hanging, missing, blank or silent compilers,
unusable cache entries, full disks and noexec temp directories. Each gives a clear error or repairs itself."""
import os
import subprocess
import sys
import time

import pytest

from fusegrad.device import CompileError, diskcache_put
from fusegrad.helpers import hash_bytes
from fusegrad.runtime import ops_cpu
from fusegrad.runtime.ops_cpu import CPUCompiler, find_compiler

SRC = "void k_add(float* a) { a[0] += 1.0f; }\n"


def fake_cc(tmp_path, body: str) -> str:
    fn = tmp_path / "fakecc"
    fn.write_text(f'#!/bin/sh\nif [ "$1" = "--version" ]; then echo fakecc 1.0; exit 0; fi\n{body}\n')
    fn.chmod(0o755)
    return str(fn)


def test_hanging_compiler_times_out(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", fake_cc(tmp_path, "sleep 60 & wait"))   # a child that holds the pipes too
    monkeypatch.setenv("COMPILE_TIMEOUT", "1")
    t0 = time.perf_counter()
    with pytest.raises(CompileError, match=r"fakecc.*k_add.*COMPILE_TIMEOUT=1"): CPUCompiler().compile(SRC)
    assert time.perf_counter() - t0 < 15


def test_silent_compiler_is_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", fake_cc(tmp_path, "echo 'no space for output' >&2; exit 0"))
    with pytest.raises(CompileError, match=r"(?s)wrote no output for kernel k_add.*no space for output"):
        CPUCompiler().compile(SRC)


def test_blank_cc(monkeypatch):
    monkeypatch.setenv("CC", "   ")
    with pytest.raises(RuntimeError, match="blank"): find_compiler()


def test_missing_cc_said_once(monkeypatch, capsys):
    monkeypatch.setenv("CC", "no-such-compiler-xyz")
    monkeypatch.setattr(ops_cpu, "_warned", set())
    assert find_compiler(raise_error=False) is None and find_compiler(raise_error=False) is None
    err = capsys.readouterr().err
    assert err.count("no-such-compiler-xyz") == 1 and "PYTHON" in err
    with pytest.raises(RuntimeError, match="not found on PATH"): find_compiler()


def run_child(env: dict) -> subprocess.CompletedProcess:
    code = "from fusegrad import Tensor\nprint((Tensor([1.0, 2.0]) * 3 + 1).tolist())"
    # without the flags that bypass the program cache (CI records process replay; VIZ/DEBUG>=3 run codegen)
    base = {k: v for k, v in os.environ.items() if k not in ("CAPTURE_PROCESS_REPLAY", "VIZ", "PROFILE", "DEBUG", "BEAM")}
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                          env={**base, "DEV": "CPU", **env})


def test_unusable_cache_entries_are_repaired(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert run_child(env).stdout.strip() == "[4.0, 7.0]"
    entries = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs if "cpu_" in r]
    programs = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs if r.endswith("program")]
    assert entries and programs
    for bad in (b"{not json", b'{"name": "x"}', b'[1, 2]'):   # the engine's rendered-program cache
        for e in programs:
            with open(e, "wb") as f: f.write(hash_bytes(bad).encode() + bad)
        for _ in range(2):
            r = run_child(env)
            assert r.stdout.strip() == "[4.0, 7.0]", r.stderr[-3000:]
    for bad in (b"not an ELF file", b"FUSEGRAD-BATCH-REF:x:y:z", b"FUSEGRAD-BATCH-REF:\xff"):
        for e in entries:   # checksums that match, contents that can't be loaded
            with open(e, "wb") as f: f.write(hash_bytes(bad).encode() + bad)
        for _ in range(2):  # the first run repairs the cache, the second uses the repaired entries
            r = run_child(env)
            assert r.stdout.strip() == "[4.0, 7.0]", r.stderr[-3000:]


def test_failed_cache_write_leaves_no_tmp_files(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    class Full:
        def __init__(self, fd, mode): os.close(fd)
        def __enter__(self): return self
        def __exit__(self, *a): return False
        def write(self, b): raise OSError(28, "No space left on device")
    monkeypatch.setattr("fusegrad.device.os.fdopen", Full)
    for i in range(5): diskcache_put("t", f"k{i}", b"payload")
    assert [f for _, _, fs in os.walk(tmp_path) for f in fs] == []


def test_noexec_tmpdir_says_what_to_change(monkeypatch):
    def cdll(*a, **k): raise OSError("/tmp/fusegrad-x.so: failed to map segment from shared object")
    monkeypatch.setattr(ops_cpu.ctypes, "CDLL", cdll)
    spec = type("Spec", (), {"name": "k_add", "src": SRC, "nbufs": 1, "vars": [], "thread_size": 0})()
    with pytest.raises(CompileError, match="noexec.*TMPDIR"): ops_cpu.CPUProgram(spec, b"\x7fELF")
