"""`python -m fusegrad.doctor`: a working machine exits 0 and lists CPU as working; a default device that can't work
(DEV=CPU with a C compiler that doesn't exist) exits 1 and says why; a device check that hangs is killed."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from fusegrad import doctor

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_doctor(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DEV", "CC")}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "fusegrad.doctor", "--timeout", "120"], capture_output=True,
                          text=True, timeout=300, env={**base, **env}, cwd=ROOT, check=False)


def test_doctor_on_this_machine():
    r = run_doctor()
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"^  CPU +works +default ", out, re.MULTILINE), out
    assert re.search(r"^  PYTHON +works ", out, re.MULTILINE), out
    assert f"python     {sys.version.split()[0]}" in out and "fusegrad   " in out
    assert re.search(r"^  target: \S+ \(-march=\S+\): .*vector registers", out, re.MULTILINE), out   # machine.py
    for section in ("C compiler", "optional backends", "caches  ", "environment variables"):
        assert section in out, f"no {section!r} section:\n{out}"
    for backend in ("OpenCL (CL)", "Vulkan/WebGPU (WEBGPU)", "CUDA (CUDA)", "LLVM (LLVM)"): assert backend in out
    assert out.rstrip().endswith("the default device CPU works")


def test_doctor_with_a_broken_default_device():
    r = run_doctor(DEV="CPU", CC="/nonexistent/cc", FUSEGRAD_DOCTOR_TEST="1")
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert re.search(r"^  CPU +FAILS +default +RuntimeError: CC='/nonexistent/cc' is set but", out, re.MULTILINE), out
    assert "the default device CPU does NOT work: RuntimeError: CC='/nonexistent/cc'" in out
    assert "fix: unset CC, or install it" in out
    assert re.search(r"^  PYTHON +works ", out, re.MULTILINE), out   # the other devices are still checked
    assert "  DEV=CPU" in out and "  CC=/nonexistent/cc" in out        # the fusegrad variables that are set
    assert "FUSEGRAD_DOCTOR_TEST" not in out                          # a variable fusegrad doesn't read isn't listed


def test_a_hanging_device_check_is_killed(monkeypatch):
    monkeypatch.setattr(doctor, "PROBE", "import time; time.sleep(120)")
    checks = doctor.check_devices(["CPU", "PYTHON"], timeout=1.0)
    assert [c.works for c in checks.values()] == [False, False]
    assert all("no result within 1 s (killed)" in c.detail for c in checks.values())


def test_missing_parts_name_their_package():
    fixes = {p.what: p.fix for b in doctor.backends() for p in b.parts}
    assert fixes["ICD loader libOpenCL"] == "apt-get install ocl-icd-libopencl1"
    assert fixes["OpenCL driver (ICD)"] == "apt-get install pocl-opencl-icd"
    assert fixes["Vulkan driver"] == "apt-get install mesa-vulkan-drivers"
    assert fixes["Vulkan loader libvulkan"] == "apt-get install libvulkan1"
    assert fixes["Python package wgpu"].startswith("pip install wgpu")
    assert fixes["Python package llvmlite"] == "pip install llvmlite"
    assert fixes["NVRTC (the CUDA compiler)"].startswith("pip install 'nvidia-cuda-nvrtc")


def test_fixes_match_what_ci_installs():
    """Every apt package the doctor suggests is one .ci/run installs, every pip one is in the testing extra."""
    ci, pyproject = (ROOT / ".ci" / "run").read_text(), (ROOT / "pyproject.toml").read_text()
    apt_pkgs = set(re.search(r'^PKGS="([^"]*)"', ci, re.MULTILINE).group(1).split())
    for b in doctor.backends():
        for p in b.parts:
            if p.fix.startswith("apt-get install "): assert set(p.fix.split()[2:]) <= apt_pkgs, p.fix
            if p.fix.startswith("pip install "): assert f'"{p.fix.split()[2].strip(chr(39))}"' in pyproject, p.fix
