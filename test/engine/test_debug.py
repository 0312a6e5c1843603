"""DEBUG levels and GlobalCounters: each level prints what it promises (run in a subprocess to read its output)."""
import os
import subprocess
import sys

import numpy as np

from fusegrad import GlobalCounters, Tensor

PROG = ("import numpy as np; from fusegrad import Tensor; a = Tensor(np.ones((4, 4), np.float32)); "
        "b = Tensor(np.ones((4, 4), np.float32)); print('RESULT', (a.reshape(4, 1, 4) * b.T.reshape(1, 4, 4)).sum(2).numpy().sum())")


def run(debug: int) -> str:
    out = subprocess.run([sys.executable, "-c", PROG], env={**os.environ, "DEBUG": str(debug)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RESULT 64.0" in out.stdout
    return out.stdout


def test_debug_0_silent():
    assert run(0).strip() == "RESULT 64.0"


def test_debug_1_counts():
    out = run(1)
    assert "realized 1 items (1 kernels) in" in out and "***" not in out


def test_debug_2_kernel_line():
    lines = [ln for ln in run(2).splitlines() if ln.startswith("***")]
    assert len(lines) == 1
    assert "r_4_4_4" in lines[0] and "GFLOPS" in lines[0] and "GB/s" in lines[0] and " us " in lines[0]


def test_debug_3_schedule():
    out = run(3)
    assert "schedule item 0: kernel <- tensor ops" in out and "REDUCE_AXIS(ADD)" in out and "MUL" in out


def test_debug_4_source():
    out = run(4)
    assert "void r_4_4_4(float* restrict data0" in out and "data0[" in out and "data1[" in out and "data2[" in out


def test_debug_5_ast_and_linear():
    out = run(5)
    assert "kernel AST:" in out and "REDUCE" in out and "linear program of r_4_4_4:" in out
    assert "RANGE" in out and "STORE" in out and "LOAD" in out


def test_global_counters():
    a = Tensor(np.random.rand(16, 16).astype(np.float32)).realize()
    GlobalCounters.reset()
    (a * 2 + 1).sum(1).realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.global_ops >= 16 * 16          # at least one op per element
    assert GlobalCounters.global_mem >= 16 * 16 * 4      # read the input once
    assert GlobalCounters.time_sum_s > 0
    assert GlobalCounters.mem_used > 0
