"""How new kernels are grouped into compiler runs (engine/realize.py batch_full, CPUCompiler.compile_batch): tiny
kernels share one run, groups shrink towards the end of a realize, results stay right."""
import numpy as np

from fusegrad import Tensor
from fusegrad.engine.realize import BATCH_MIN_CHARS, batch_full
from fusegrad.runtime.ops_cpu import CPUCompiler


def test_batch_full_tiny_kernels_wait_for_company():
    assert not batch_full(1, 300, 1, 2) and not batch_full(3, 900, 5, 2)
    assert batch_full(1, 300, 0, 2)   # the last kernel flushes whatever is pending


def test_batch_full_groups_shrink_towards_the_end():
    big = BATCH_MIN_CHARS
    assert not batch_full(15, 16 * big, 100, 2) and batch_full(16, 16 * big, 100, 2)   # at most 16 a group
    assert not batch_full(3, 4 * big, 8, 2) and batch_full(4, 4 * big, 8, 2)           # 8 left: 4 a group
    assert batch_full(1, big, 1, 2) and batch_full(1, big, 3, 4)                       # 1 or 2 near the end


def _sizes(total: int, cores: int, chars: int) -> list[int]:
    out, n = [], 0
    for i in range(total):
        n += 1
        if batch_full(n, n * chars, total - 1 - i, cores): out.append(n); n = 0
    return out


def test_batch_plan_covers_every_kernel():
    for total in (1, 2, 7, 50, 125):
        for cores in (1, 2, 16):
            for chars in (200, 5000):
                sizes = _sizes(total, cores, chars)
                assert sum(sizes) == total and max(sizes) <= max(16, -(-BATCH_MIN_CHARS // chars))
                if chars >= BATCH_MIN_CHARS and total > 1: assert sizes[-1] <= 2


def test_tiny_kernels_of_one_realize_share_one_compiler_run(tmp_path, monkeypatch):
    """Six small new kernels in one realize: one compiler run (before: three runs of two), every result right."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    runs = []
    real = CPUCompiler.compile
    monkeypatch.setattr(CPUCompiler, "compile", lambda self, src: runs.append(src) or real(self, src))
    rng = np.random.default_rng()
    xs = [rng.standard_normal((i + 2, 3)).astype(np.float32) for i in range(6)]
    cs = [float(c) for c in rng.uniform(1, 2, 6)]   # fresh constants: kernels no earlier test compiled
    outs = [(Tensor(x) * c + 0.25).realize() for x, c in zip(xs, cs)]   # inputs realized, one kernel each below
    outs = [(Tensor(x) * c - 0.5) for x, c in zip(xs, cs)]
    runs.clear()
    Tensor.realize(*outs)
    assert len(runs) == 1
    for o, x, c in zip(outs, xs, cs): np.testing.assert_allclose(o.numpy(), x * np.float32(c) - 0.5, rtol=1e-6)


PROC = """
import sys, numpy as np
from fusegrad import Tensor
from fusegrad.runtime.ops_cpu import CPUCompiler
runs = []
real = CPUCompiler.compile
CPUCompiler.compile = lambda self, src: (runs.append(src) if "fg_pool_run" not in src else None) or real(self, src)
which = [int(i) for i in sys.argv[1].split(",")]
xs = [np.arange(3 * (i + 2), dtype=np.float32).reshape(i + 2, 3) for i in range(6)]
ins = [Tensor(x).realize() for x in xs]
runs.clear()
outs = [ins[i] * (1.5 + i) - 0.75 for i in which]
Tensor.realize(*outs)
for o, i in zip(outs, which): assert np.array_equal(o.numpy(), xs[i] * np.float32(1.5 + i) - 0.75), (i, o.numpy())
print(len(runs))
"""


def test_processes_batching_overlapping_kernel_sets_share_the_cache(tmp_path):
    """Processes running at once compile overlapping sets of kernels in different groups (so a kernel's cache entry
    may point into either process's batch object); every result is right, and a later process finds every kernel in
    the cache and runs the compiler not once."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    sets = ["0,1,2,3", "2,3,4,5", "1,3,5", "0,4"]
    procs = [subprocess.Popen([sys.executable, "-c", PROC, s], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for s in sets]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    out = subprocess.run([sys.executable, "-c", PROC, "0,1,2,3,4,5"], env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "0"


POOL_PROC = """
import sys
from fusegrad import Device
from fusegrad.runtime import cpu_pool
from fusegrad.runtime.ops_cpu import CPUCompiler
runs = []
real = CPUCompiler.compile
CPUCompiler.compile = lambda self, src: runs.append(src) or real(self, src)
Device["CPU"]   # starts the pool's compile in the background
if sys.argv[1] == "use": assert cpu_pool.pool_run() is not None
print(len(runs))
"""


def test_a_process_that_ends_at_once_still_caches_the_worker_pool(tmp_path):
    """The CPU device compiles its worker pool in a background thread; a process that exits right away waits for it,
    so the pool reaches the disk cache (before: the daemon thread died half-way, and every short process compiled the
    pool again)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "CPU_THREADS": "2", "CPU_POOL": "1"}
    first = subprocess.run([sys.executable, "-c", POOL_PROC, "exit"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    second = subprocess.run([sys.executable, "-c", POOL_PROC, "use"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.strip() == "0"
