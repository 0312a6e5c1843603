"""CPU backend: compiler discovery, the on-disk compile cache (one SQLite file: corrupt entries, size cap, a damaged
file), device selection."""
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from fusegrad import Context, Device, Tensor, diskcache
from fusegrad.device import diskcache_get, diskcache_put
from fusegrad.runtime.ops_cpu import CPUCompiler, find_compiler

SRC = "void add1(float* restrict a) { a[0] = a[0] + 1.0f; }\n"


def test_find_compiler_prefers_cc_env(monkeypatch):
    monkeypatch.setenv("CC", "gcc")
    assert find_compiler() == "gcc"


def test_no_compiler_clear_error(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError) as e:
        find_compiler()
    msg = str(e.value)
    assert "cc" in msg and "gcc" in msg and "clang" in msg and "DEV=PYTHON" in msg
    assert find_compiler(raise_error=False) is None


def test_missing_cc_env_is_an_error(monkeypatch):
    monkeypatch.setenv("CC", "definitely-not-a-compiler")
    with pytest.raises(RuntimeError, match="definitely-not-a-compiler"):
        find_compiler()


def _db(tmp_path):
    return sqlite3.connect(str(tmp_path / "fusegrad" / "cache.db"))


def test_cache_roundtrip_and_corruption(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    diskcache_put("t", "k", b"payload")
    assert sorted(f.name for f in (tmp_path / "fusegrad").iterdir() if not f.name.startswith("cache.db-")) == \
        ["cache.db"]   # one file (and SQLite's write-ahead log beside it), not a file per entry
    assert diskcache_get("t", "k") == b"payload"
    with _db(tmp_path) as db: db.execute("UPDATE entries SET payload=? WHERE key='k'", (b"garbage",))
    assert diskcache_get("t", "k") is None   # corrupt -> miss (and evicted), so the caller recompiles
    with _db(tmp_path) as db: assert db.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 0


def test_compile_cached_recompiles_corrupt_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    comp = CPUCompiler()
    lib = comp.compile_cached(SRC)
    with _db(tmp_path) as db:
        (key, payload), = db.execute("SELECT key, payload FROM entries WHERE tbl=?", (comp.cachekey,)).fetchall()
        db.execute("UPDATE entries SET payload=? WHERE key=?", (payload[:100], key))   # a truncated write
    lib2 = comp.compile_cached(SRC)
    assert lib2 == lib  # recompiled and identical
    assert diskcache_get(comp.cachekey, key) == lib


def test_cache_size_cap_evicts_least_recently_used(tmp_path, monkeypatch):
    """CACHE_MAX_MB caps the cache: past it, the entries used longest ago go first."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(diskcache, "_TOUCH_S", 0.0)   # every read marks its entry used
    with Context(CACHE_MAX_MB=1):
        blob = bytes(100_000)
        diskcache_put("t", "keep", blob)
        for i in range(40):
            diskcache_put("t", f"k{i}", blob)
            assert diskcache_get("t", "keep") == blob   # used all along: never the least recently used
        n, size, _ = diskcache.stats()
        assert size <= (1 << 20) + 32 * len(blob) and n < 41
        assert diskcache_get("t", "k0") is None and diskcache_get("t", "keep") == blob


def test_unreadable_cache_file_is_moved_aside(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "fusegrad").mkdir()
    (tmp_path / "fusegrad" / "cache.db").write_bytes(b"this is not an SQLite database" * 100)
    diskcache.close_all()
    diskcache_put("t", "k", b"v")
    assert diskcache_get("t", "k") == b"v"
    assert any(f.name.startswith("cache.db.corrupt-") for f in (tmp_path / "fusegrad").iterdir())


def test_locked_cache_file_is_not_moved_aside(tmp_path, monkeypatch):
    """A database another process keeps locked past the busy timeout is healthy: this process runs without the cache
    and leaves the file (and every other process's entries) where it is (before: it was taken for a damaged file)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    diskcache.close_all()
    diskcache_put("t", "k", b"v")
    diskcache.close_all()
    real = diskcache._open
    def locked(path):
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(diskcache, "_open", locked)
    assert diskcache_get("t", "k") is None   # no cache in this process
    diskcache_put("t", "k2", b"w")
    assert [f.name for f in (tmp_path / "fusegrad").iterdir() if f.name.startswith("cache.db.corrupt")] == []
    monkeypatch.setattr(diskcache, "_open", real)
    diskcache.close_all()
    assert diskcache_get("t", "k") == b"v"


def test_cache_key_includes_compiler_and_cpu():
    comp = CPUCompiler()
    assert comp.cachekey.startswith("cpu_") and len(comp.cachekey) > 8


def test_concurrent_processes_share_cache(tmp_path):
    """Two processes compiling the same kernels at once both get correct results (atomic cache writes)."""
    code = ("import numpy as np; from fusegrad import Tensor; x = np.arange(64, dtype=np.float32);"
            "r = (Tensor(x).reshape(8, 8) * 3 + 1).sum(1).numpy(); "
            "assert np.allclose(r, (x.reshape(8, 8) * 3 + 1).sum(1)), r; print('ok')")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        assert out.decode().strip() == "ok"


def test_dev_env_selects_python():
    code = "from fusegrad import Tensor, Device; t = Tensor([1.0, 2.0]) * 2; print(Device.DEFAULT, t.device, t.tolist())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DEV": "PYTHON"}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["PYTHON", "PYTHON", "[2.0,", "4.0]"]


def test_device_canonicalize_and_errors():
    assert Device.canonicalize("cpu") == "CPU" and Device.canonicalize("cpu:0") == "CPU"
    assert Device.canonicalize("cpu:1") == "CPU:1"
    assert Device["cpu"] is Device["CPU"]
    with pytest.raises(RuntimeError, match="unknown device 'TPU9'"):
        Device["TPU9"]
    with pytest.raises(AttributeError):
        Device.DEFAULT = "PYTHON"


def test_copy_between_devices():
    x = np.random.rand(5, 3).astype(np.float32)
    a = Tensor(x)
    b = (a.to("PYTHON") * 2).to("CPU") + 1
    assert b.device == "CPU"
    np.testing.assert_allclose(b.numpy(), x * 2 + 1, rtol=1e-6)


def test_compile_error_is_clear():
    from fusegrad.device import CompileError
    with pytest.raises(CompileError, match="C compile failed"):
        CPUCompiler().compile("this is not C")


def test_program_cache_is_keyed_by_the_renderer_configuration(monkeypatch):
    # a program rendered for CPU_THREADS=1 (no thread split) must not be handed to a process with 2 threads
    from fusegrad.engine import realize
    ast = (Tensor.rand(64, 64) @ Tensor.rand(64, 64)).schedule()[-1].ast
    r = Device["CPU"].renderer
    k1, _ = realize._load_spec(ast, "CPU", 0)
    monkeypatch.setattr(r, "threads", r.threads + 1)
    k2, _ = realize._load_spec(ast, "CPU", 0)
    monkeypatch.setattr(r, "simd_bytes", 16)
    k3, _ = realize._load_spec(ast, "CPU", 0)
    assert len({k1, k2, k3}) == 3 and all((k1, k2, k3))


def test_program_cache_keeps_a_symbolic_kernels_variables(tmp_path, monkeypatch):
    """A kernel with a variable size (Tensor.rand's, or a user's) is rendered once: a later process state loads its
    program from the disk cache, variables included, runs no codegen, and launches it with the value bound now.
    (CAPTURE_PROCESS_REPLAY, which CI sets to record every kernel, bypasses that cache: off here.)"""
    from fusegrad import Context, Variable, codegen
    from fusegrad.engine import realize
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with Context(CAPTURE_PROCESS_REPLAY=0):
        x = Tensor.arange(10).contiguous().realize()
        n = Variable("n", 1, 10)
        assert (x[:n.bind(4)] * 3).sum().item() == 18
        rendered = []
        real = codegen.to_program
        monkeypatch.setattr(codegen, "to_program", lambda *a, **k: rendered.append(a) or real(*a, **k))
        monkeypatch.setattr(realize, "_programs", {})   # as in a new process: no program loaded
        assert (x[:n.bind(7)] * 3).sum().item() == 63 and rendered == []


def _run_add(lib: bytes, name: str, nbufs: int = 1, extra: float = 0.0) -> float:
    from fusegrad.renderer import ProgramSpec
    from fusegrad.runtime.ops_cpu import CPUProgram
    a = np.array([1.0], dtype=np.float32)
    CPUProgram(ProgramSpec(name, "", [], nbufs), lib)(a.ctypes.data)
    return float(a[0])


BATCH_SRCS = [  # two kernels with the same name and the same static helper, as the renderer emits them
    ("k", "static inline float fg_h(float x) { return x + 1.0f; }\nvoid k(float* restrict a) { a[0] = fg_h(a[0]); }\n"),
    ("k", "static inline float fg_h(float x) { return x * 10.0f; }\nvoid k(float* restrict a) { a[0] = fg_h(a[0]); }\n"),
    ("add1", SRC),
]


def test_compile_batch_one_object_for_several_kernels(tmp_path, monkeypatch):
    """Kernels compiled together keep their own functions and helpers, their cache entries point into one shared
    object, and a fresh process state (nothing loaded) finds them through the disk cache."""
    from fusegrad.helpers import hash_bytes
    from fusegrad.runtime import ops_cpu
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    comp = CPUCompiler()
    calls = []
    real_compile = comp.compile
    monkeypatch.setattr(comp, "compile", lambda src: calls.append(src) or real_compile(src))
    libs = comp.compile_batch(BATCH_SRCS)
    assert len(calls) == 1 and all(lib.startswith(ops_cpu.BATCH_REF) for lib in libs)
    assert [_run_add(lib, name) for lib, (name, _) in zip(libs, BATCH_SRCS)] == [2.0, 10.0, 2.0]
    assert {lib.split(b":")[1] for lib in libs} == {lib.split(b":")[1] for lib in libs[:1]}  # one batch object
    # another process: nothing loaded, everything from the disk cache, no compiler run
    monkeypatch.setattr(ops_cpu, "_batch_libs", {})
    monkeypatch.setattr(ops_cpu, "_batch_objs", {})
    assert comp.compile_batch(BATCH_SRCS) == libs and len(calls) == 1
    assert _run_add(comp.compile_cached(BATCH_SRCS[1][1]), "k") == 10.0
    # the batch object evicted: the kernel compiles alone
    monkeypatch.setattr(ops_cpu, "_batch_libs", {})
    monkeypatch.setattr(ops_cpu, "_batch_objs", {})
    bkey = libs[0][len(ops_cpu.BATCH_REF):].split(b":")[0].decode()
    diskcache.delete(comp.cachekey, bkey)
    lib = comp.compile_cached(BATCH_SRCS[0][1])
    assert not lib.startswith(ops_cpu.BATCH_REF) and _run_add(lib, "k") == 2.0
    assert diskcache_get(comp.cachekey, hash_bytes(BATCH_SRCS[0][1])) == lib


def test_compile_batch_error_names_the_kernel(tmp_path, monkeypatch):
    from fusegrad.device import CompileError
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bad = ("bad_kernel", "void bad_kernel(float* restrict a) { a[0] = undefined_thing; }\n")
    with pytest.raises(CompileError, match="undefined_thing"):
        CPUCompiler().compile_batch([BATCH_SRCS[2], bad])


def _chunked_program(calls):
    """A CPUProgram whose 'kernel' is a Python function, split into two chunks (the second runs on a worker)."""
    from fusegrad.runtime.ops_cpu import CPUProgram
    prg = object.__new__(CPUProgram)
    prg.fxn, prg.chunks = (lambda *args: calls.append(args)), [(0, 4), (4, 8)]
    return prg


def test_chunked_launch_runs_every_chunk_and_raises_a_worker_error():
    calls = []
    _chunked_program(calls)(7, wait=True)
    assert sorted(calls) == [(7, 0, 4), (7, 4, 8)]
    from fusegrad.runtime.ops_cpu import CPUProgram
    prg = object.__new__(CPUProgram)

    def fxn(*args):
        if args[-1] == 8: raise ValueError("chunk 2 failed")
    prg.fxn, prg.chunks = fxn, [(0, 4), (4, 8)]
    with pytest.raises(ValueError, match="chunk 2 failed"): prg(1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_chunked_launch_after_fork():
    # the parent's worker threads do not exist in a forked child: the child's first chunked launch used to wait forever
    calls = []
    prg = _chunked_program(calls)
    prg(1)   # the parent's workers are started
    pid = os.fork()
    if pid == 0:   # child: exits 0 only if the launch completes (SIGALRM kills it otherwise)
        import signal
        signal.alarm(10)
        prg(2)
        os._exit(0 if (2, 4, 8) in calls else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"


@pytest.mark.parametrize("phase", [0, 9, 10, 20])
def test_cache_size_cap_holds_wherever_the_write_count_stands(phase, tmp_path, monkeypatch):
    """The cap held only if a size check happened to fall after the cap was passed: with the process's write count at
    10 (mod 32) when the test began, 41 entries of 100 kB stayed (4.1 MB under a 1 MB cap). Checks also come every
    eighth of the cap written."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(diskcache, "_puts", phase)
    monkeypatch.setattr(diskcache, "_unchecked", 0)
    with Context(CACHE_MAX_MB=1):
        blob = bytes(100_000)
        for i in range(41): diskcache_put("t", f"k{i}", blob)
        n, size, _ = diskcache.stats()
        assert size <= (1 << 20) + 2 * len(blob) and n <= 12
