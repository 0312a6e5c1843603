"""The CPU device's C worker pool (runtime/cpu_pool.py): kernels split across threads start their chunks from C.
Checked: split kernels are right against NumPy through the pool; several Python threads launching at once (the pool
takes one launch at a time, the others run their chunks themselves); a forked child (whose workers don't exist);
the Python pool (CPU_POOL=0) still works; and an idle process's workers sleep instead of spinning."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from fusegrad import Device, Tensor
from fusegrad.engine import realize
from fusegrad.runtime import cpu_pool

pytestmark = pytest.mark.skipif(Device.DEFAULT != "CPU" or cpu_pool.pool_run() is None,
                                reason="the C worker pool is the CPU device's, and needs a C compiler with pthreads")
rng = np.random.default_rng(0)


def _split_matmul(m=64, k=256, n=512):
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    return a, b, Tensor(a) @ Tensor(b)


def test_split_kernels_go_through_the_pool():
    a, b, out = _split_matmul()
    prg = realize.get_runner(out.schedule()[-1].ast, "CPU")
    if len(prg.chunks) < 2: pytest.skip("one CPU thread")
    assert prg.mt is not None and prg.spec.name + "_mt(" in prg.spec.src
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)


def test_python_threads_launching_at_once():
    """Four Python threads run split kernels concurrently: every result right, nobody waits forever."""
    results, errors = {}, []

    def work(i: int) -> None:
        try:
            for j in range(20):
                a, b, out = _split_matmul(32 + 8 * (i % 2), 128, 256)
                np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)
            results[i] = True
        except Exception as e:   # reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join(timeout=120)
    assert not errors, errors
    assert len(results) == 4 and not any(t.is_alive() for t in threads)


CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from fusegrad import Tensor
    a = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((256, 512)).astype(np.float32)
    want = a @ b
    assert np.allclose((Tensor(a) @ Tensor(b)).numpy(), want, rtol=1e-4, atol=1e-3)   # the parent's workers start
    pid = os.fork()
    if pid == 0:   # the child has no workers: its first split kernel must start its own, not wait for the parent's
        ok = np.allclose((Tensor(a) @ Tensor(b) * 2).numpy(), want * 2, rtol=1e-4, atol=1e-3)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
""")


def test_a_forked_child_runs_split_kernels():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "child 0" in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])


def test_python_pool_still_works():
    code = "import numpy as np; from fusegrad import Tensor; a = np.ones((64, 256), np.float32); " \
           "print((Tensor(a) @ Tensor(a.T.copy())).numpy()[0, 0])"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CPU_POOL": "0"})
    assert p.returncode == 0 and p.stdout.strip() == "256.0", (p.stdout, p.stderr[-2000:])


def test_idle_workers_sleep():
    """After the last launch the workers stop spinning: the process uses (almost) no CPU while it waits."""
    a, b, out = _split_matmul()
    out.numpy()
    time.sleep(0.05)   # past the spin time
    t0, c0 = time.perf_counter(), time.process_time()
    time.sleep(0.3)
    used = (time.process_time() - c0) / (time.perf_counter() - t0)
    assert used < 0.2, f"{used:.0%} of a core while idle"


def test_split_kernels_compiled_in_one_batch_use_the_pool():
    """compile_batch renames each kernel's functions with a suffix; the trampolines are renamed alike and found."""
    from fusegrad.runtime.ops_cpu import CPUProgram, cpu_compiler
    from fusegrad.codegen import to_program
    ren = Device["CPU"].renderer
    if ren.threads < 2: pytest.skip("one CPU thread")
    outs = [_split_matmul(64, 256 + 8 * i, 512)[2] for i in range(3)]
    specs = [to_program(o.schedule()[-1].ast, ren) for o in outs]
    libs = cpu_compiler().compile_batch([(s.name, s.src + f"\n/* {time.time()} {i} */") for i, s in enumerate(specs)])
    for s, lib in zip(specs, libs):
        assert lib.startswith(b"FUSEGRAD-BATCH-REF:")
        assert CPUProgram(s, lib).mt is not None


CLAIM_CHILD = textwrap.dedent(r"""
    import ctypes, os, threading, time
    from fusegrad.runtime import cpu_pool
    from fusegrad.runtime.ops_cpu import cpu_compiler, load_shared_object
    src = (
        "#include <sys/syscall.h>\n#include <unistd.h>\nlong who[8];\n"
        "void task(void *ctx, int start, int end) {\n"
        "  for (int i = start; i < end; i++) who[i] = syscall(SYS_gettid);\n}\n")
    lib = load_shared_object(cpu_compiler().compile_cached(src))
    run = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)(
        cpu_pool.pool_run())
    task, who = ctypes.cast(lib.task, ctypes.c_void_p), (ctypes.c_long * 8).in_dll(lib, "who")
    bounds = (ctypes.c_int * 3)(0, 1, 2)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # this thread, and the worker it starts, on one core
    before = set(os.listdir("/proc/self/task"))
    assert run(task, None, 2, bounds) == 1                     # starts the worker
    workers = set(os.listdir("/proc/self/task")) - before
    assert len(workers) == 1, workers
    # the worker runs only when this thread doesn't: it can wake only after the launch, however fast the OS wakes it
    os.sched_setscheduler(int(workers.pop()), os.SCHED_IDLE, os.sched_param(0))
    mine = 0
    for _ in range(20):
        time.sleep(0.02)                                       # past the spin time: the worker sleeps
        who[0] = who[1] = 0
        assert run(task, None, 2, bounds) == 1
        assert who[0] and who[1]                               # both chunks ran
        mine += who[0] == who[1] == threading.get_native_id()
    print("mine", mine, "last chunks run by", who[0], who[1], "caller", threading.get_native_id())
""")


def test_a_launch_does_not_wait_for_a_sleeping_worker():
    """A sleeping worker (idle past the spin time) takes tens of microseconds to wake on a busy machine; the caller
    claims the chunks it hasn't, so a launch never waits for the wake. Made deterministic: the worker shares the
    caller's core at the idle scheduling class, so it can't run before the launch ends, and every launch must finish
    on the caller's thread. When chunk i was worker i's, the caller waited for it, and it ran chunk 1 of each."""
    p = subprocess.run([sys.executable, "-c", CLAIM_CHILD], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "mine " in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
    assert int(p.stdout.split("mine ")[1].split()[0]) >= 15, p.stdout[-2000:]   # (20 in every run seen)


def test_small_kernels_split_when_the_c_pool_launches_them():
    """A launch through the C pool costs about a microsecond, so kernels from cpu_pool.MIN_WORK (2^14) loop steps are
    split (the Python pool's 2^17 kept SmolLM2's 576 x 576 decode matvec, 2^16 steps, 30 us, on one core); with
    CPU_POOL=0 the threshold stays 2^17. Values against NumPy."""
    from fusegrad.codegen import to_program
    from fusegrad.renderer import Renderer
    ren = Device["CPU"].renderer
    if ren.threads < 2: pytest.skip("one CPU thread here (CPU_THREADS or the machine): nothing is split")
    assert ren.min_thread_work == cpu_pool.MIN_WORK < Renderer.min_thread_work
    w = rng.standard_normal((576, 576)).astype(np.float32)
    x = rng.standard_normal((1, 576)).astype(np.float32)
    out = Tensor(x) @ Tensor(w).T
    spec = to_program(out.schedule()[-1].ast, ren)
    assert spec.thread_size > 1, spec.src[:2000]
    np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)
    code = "from fusegrad import Device; from fusegrad.renderer import Renderer; " \
           "print(Device['CPU'].renderer.min_thread_work == Renderer.min_thread_work)"
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CPU_POOL": "0"}, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.stdout.strip() == "True", r.stderr[-2000:]
