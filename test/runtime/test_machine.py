"""The machine description (runtime/machine.py): read from the compiler target of CPU_MARCH and sysfs, overridable
by env vars, checked against the host (code the CPU can't run is refused with a clear error), part of the compile
cache key, and what the CPU device's renderer hands the heuristics."""
import os
import platform
import subprocess
import sys

import pytest

from fusegrad.dtype import dtypes
from fusegrad.runtime import machine as M
from fusegrad.runtime.ops_cpu import CPUCompiler, find_compiler

CC = find_compiler(raise_error=False)
X86 = platform.machine().lower() in ("x86_64", "amd64")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_x86_cc = pytest.mark.skipif(CC is None or not X86, reason="x86-64 levels need an x86 host with a C compiler")


@pytest.mark.parametrize("macros,isa,vbytes,regs,fma", [
    ({"__x86_64__", "__SSE2__", "__AVX__", "__AVX2__", "__FMA__", "__AVX512F__"}, "avx512", 64, 32, 2),
    ({"__x86_64__", "__SSE2__", "__AVX__", "__AVX2__", "__FMA__"}, "avx2", 32, 16, 2),
    ({"__x86_64__", "__SSE2__", "__AVX__"}, "avx", 16, 16, 0),    # AVX without AVX2: no 256-bit integer math
    ({"__x86_64__", "__SSE2__"}, "sse2", 16, 16, 0),
    ({"__aarch64__", "__ARM_NEON"}, "neon", 16, 32, 2),
])
def test_describe_target(macros, isa, vbytes, regs, fma):
    m = M.describe_target(dict.fromkeys(macros, "1"), "x", {1: 32 << 10, 2: 1 << 20, 3: 8 << 20})
    assert (m.isa, m.vector_bytes, m.vector_registers, m.fma_pipes) == (isa, vbytes, regs, fma)
    assert (m.l1_bytes, m.l2_bytes, m.l3_bytes) == (32 << 10, 1 << 20, 8 << 20)
    assert m.lanes(dtypes.float32) == vbytes // 4 and m.lanes(dtypes.float64) == vbytes // 8
    assert m.registers_for(dtypes.float32, vbytes // 4 * 2) == 2 and isa in m.describe()


@needs_x86_cc
@pytest.mark.parametrize("march,isa,vbytes,regs", [("x86-64-v3", "avx2", 32, 16), ("x86-64-v4", "avx512", 64, 32),
                                                   ("x86-64-v2", "sse4.2", 16, 16)])
def test_x86_levels_from_the_compiler(march, isa, vbytes, regs, monkeypatch):
    monkeypatch.setattr(M, "host_flags", lambda: None)   # describe the level even where this CPU can't run it
    m = M.machine(CC, march)
    assert (m.isa, m.march, m.vector_bytes, m.vector_registers) == (isa, march, vbytes, regs)
    assert ("AVX512F" in m.features) == (isa == "avx512") and ("FMA" in m.features) == (march != "x86-64-v2")


def test_host_check_refuses_code_the_cpu_cannot_run():
    macros = {"__x86_64__": "1", "__AVX2__": "1", "__AVX512F__": "1", "__FMA__": "1"}
    with pytest.raises(RuntimeError, match=r"CPU_MARCH=x86-64-v4 builds kernels with avx512f, which this CPU lacks"):
        M.check_host(macros, "x86-64-v4", {"avx2", "fma", "avx"})
    M.check_host(macros, "x86-64-v4", {"avx2", "fma", "avx", "avx512f"})   # has them: fine
    M.check_host(macros, "native", set())                                   # native is the host itself


def test_overrides_and_bad_values(monkeypatch):
    base = M.describe_target({"__x86_64__": "1", "__SSE2__": "1", "__AVX2__": "1"}, "x86-64-v3", {})
    monkeypatch.setenv("CPU_VECTOR_REGISTERS", "8")
    monkeypatch.setenv("CPU_L2_BYTES", "0x80000")
    m = M._override(base)
    assert (m.vector_registers, m.l2_bytes, m.vector_bytes) == (8, 1 << 19, 32)
    for var, val in (("CPU_VECTOR_BYTES", "24"), ("CPU_VECTOR_REGISTERS", "2"), ("CPU_FMA_PIPES", "two"),
                     ("CPU_L1_BYTES", "-1")):
        monkeypatch.setenv(var, val)
        with pytest.raises(ValueError, match=var):
            M._override(base)
        monkeypatch.delenv(var)


def test_bad_cpu_march(monkeypatch):
    monkeypatch.setenv("CPU_MARCH", "native; rm -rf /")
    with pytest.raises(ValueError, match="CPU_MARCH"):
        M.cpu_march()
    monkeypatch.setenv("CPU_MARCH", " ")
    assert M.cpu_march() == "native"
    if CC is not None:
        with pytest.raises(RuntimeError, match="rejects -march=no-such-cpu"):
            M.machine(CC, "no-such-cpu")


@needs_x86_cc
def test_march_is_in_the_compile_cache_key(monkeypatch):
    """Binaries built for one level must never be loaded for another: -march is in the flags and the table name."""
    monkeypatch.setattr(M, "host_flags", lambda: None)
    v3, v4 = CPUCompiler("x86-64-v3"), CPUCompiler("x86-64-v4")
    assert "-march=x86-64-v3" in v3.flags and "-march=x86-64-v4" in v4.flags and v3.table != v4.table
    assert v3.flags.count("-O2") == 1 and v3.flags[:2] == ["-O2", "-march=x86-64-v3"]


@needs_x86_cc
def test_cpu_device_builds_for_cpu_march():
    """CPU_MARCH=x86-64-v3: the device's renderer describes AVX2, kernels use 8-lane vectors and stay exact."""
    code = ("import numpy as np\nfrom fusegrad import Device, Tensor\n"
            "r = Device['CPU'].renderer\n"
            "assert (r.machine.isa, r.simd_bytes, r.machine.vector_registers) == ('avx2', 32, 16), r.machine\n"
            "a = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) % 7 - 3\n"
            "b = np.arange(48 * 80, dtype=np.float32).reshape(48, 80) % 5 - 2\n"
            "assert np.array_equal((Tensor(a) @ Tensor(b)).numpy(), a @ b)\n"
            "print('ok')\n")
    env = {**os.environ, "CPU_MARCH": "x86-64-v3", "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    if p.returncode != 0 and "which this CPU lacks" in p.stderr: pytest.skip("this CPU has no AVX2")
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_target_macros_are_cached_on_disk(tmp_path, monkeypatch):
    """With an identity (compiler version, CPU), the compiler's macros are kept in the cache directory: a later
    process reads them without running the compiler; another identity runs it again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    M.target_macros.cache_clear()
    first = M.target_macros(CC, "native", "id-1")
    assert first and len(list((tmp_path / "fusegrad" / "machine").iterdir())) == 1
    M.target_macros.cache_clear()
    ran = []
    real_popen = subprocess.Popen
    monkeypatch.setattr(M.subprocess, "Popen", lambda *a, **k: ran.append(a) or real_popen(*a, **k))
    assert M.target_macros(CC, "native", "id-1") == first and ran == []
    M.target_macros(CC, "native", "id-2")
    assert len(ran) == 1
    M.target_macros.cache_clear()
