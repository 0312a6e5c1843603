"""The CPU compiler and kernel cache against a hostile environment: hanging, missing, blank or silent compilers,
unusable cache entries, full disks and noexec temp directories. Each gives a clear error or repairs itself."""
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from fusegrad import diskcache
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


def _set_payloads(tmp_path, where: str, payload: bytes) -> int:
    """Overwrite every cache entry of the tables matching `where` with `payload` and a checksum that matches it."""
    with sqlite3.connect(str(tmp_path / "fusegrad" / "cache.db")) as db:
        return db.execute(f"UPDATE entries SET payload=?, digest=?, size=? WHERE {where}",
                          (payload, hash_bytes(payload), len(payload))).rowcount


def test_unusable_cache_entries_are_repaired(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert run_child(env).stdout.strip() == "[4.0, 7.0]"
    for bad in (b"{not json", b'{"name": "x"}', b'[1, 2]'):   # the engine's rendered-program cache
        assert _set_payloads(tmp_path, "tbl = 'program'", bad)
        for _ in range(2):
            r = run_child(env)
            assert r.stdout.strip() == "[4.0, 7.0]", r.stderr[-3000:]
    for bad in (b"not an ELF file", b"FUSEGRAD-BATCH-REF:x:y:z", b"FUSEGRAD-BATCH-REF:\xff"):
        # checksums that match, contents that can't be loaded
        assert _set_payloads(tmp_path, "tbl LIKE 'cpu_%'", bad)
        for _ in range(2):  # the first run repairs the cache, the second uses the repaired entries
            r = run_child(env)
            assert r.stdout.strip() == "[4.0, 7.0]", r.stderr[-3000:]


def test_unwritable_cache_is_skipped(tmp_path, monkeypatch):
    """A cache directory that can't be made (a file stands where it should be) means no cache, not an error."""
    (tmp_path / "fusegrad").write_text("a file, not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    diskcache.close_all()
    for i in range(5): diskcache_put("t", f"k{i}", b"payload")
    assert diskcache.get("t", "k0") is None
    assert CPUCompiler().compile_cached(SRC)   # compiles all the same


def test_noexec_tmpdir_says_what_to_change(monkeypatch):
    def cdll(*a, **k): raise OSError("/tmp/fusegrad-x.so: failed to map segment from shared object")
    monkeypatch.setattr(ops_cpu.ctypes, "CDLL", cdll)
    spec = type("Spec", (), {"name": "k_add", "src": SRC, "nbufs": 1, "vars": [], "thread_size": 0})()
    with pytest.raises(CompileError, match="noexec.*TMPDIR"): ops_cpu.CPUProgram(spec, b"\x7fELF")
