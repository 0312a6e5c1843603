"""`python -m fusegrad.doctor`: what this machine gives fusegrad, and what to install for what is missing.

It prints the Python and fusegrad versions, runs a tiny kernel on every device (each in a child process with a time
limit, so a broken driver can't hang it), names the C compiler, checks the optional backends' libraries (with the
exact apt/pip package for each missing one), sizes the kernel cache and lists the fusegrad environment variables that
are set. It exits 1 when the default device doesn't work.
"""
from __future__ import annotations

import argparse
import ast
import ctypes.util
import glob
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field

import fusegrad
from fusegrad import diskcache
from fusegrad.device import Device
from fusegrad.helpers import CACHE_MAX_MB, cache_dir
from fusegrad.runtime.machine import machine
from fusegrad.runtime.ops_cpu import find_compiler
from fusegrad.runtime.ops_cuda import find_nvrtc

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent

# the child process of one device check: open the device, run (x*2+1) on three floats, compare, print one JSON line
PROBE = """
import json, sys, time
st = time.perf_counter()
from fusegrad import Device, Tensor
dev = Device[sys.argv[1]]
got = (Tensor([1.0, 2.0, 3.0], device=sys.argv[1]) * 2 + 1).tolist()
if got != [3.0, 5.0, 7.0]: raise RuntimeError(f"(x*2+1) on [1, 2, 3] gave {got}, expected [3.0, 5.0, 7.0]")
what = " ".join(str(x) for x in (type(dev.renderer).__name__, getattr(dev, "name", "")) if x)
print("PROBE " + json.dumps({"what": what, "seconds": time.perf_counter() - st}))
"""


@dataclass
class DeviceCheck:
    name: str
    works: bool = False
    detail: str = ""      # the renderer when it works, else the first line of the error


def _last_error_line(stderr: str) -> str:
    """The exception line of a child's traceback ("RuntimeError: ..."), else its last line."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith(("File ", "^", "~")) and ":" in ln and not ln.startswith("Traceback"): return ln
    return lines[-1] if lines else "no output"


def check_devices(names: list[str], timeout: float) -> dict[str, DeviceCheck]:
    """Run PROBE for every device at once (one child each); a child past `timeout` seconds is killed."""
    procs = {n: subprocess.Popen([sys.executable, "-c", PROBE, n], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=str(PACKAGE_DIR.parent)) for n in names}
    deadline, out = time.monotonic() + timeout, {}
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            out[name] = DeviceCheck(name, False, f"no result within {timeout:g} s (killed); a driver may be hanging")
            continue
        line = next((ln for ln in stdout.splitlines() if ln.startswith("PROBE ")), None)
        if p.returncode == 0 and line is not None:
            res = json.loads(line[6:])
            out[name] = DeviceCheck(name, True, f"{res['what']}, {res['seconds']:.1f} s")
        else: out[name] = DeviceCheck(name, False, _last_error_line(stderr))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# the C compiler and the optional backends' libraries

def compiler_line() -> tuple[str, bool]:
    """(what the CPU device would compile with, whether one was found)."""
    cc = find_compiler(raise_error=False)
    if cc is None and os.environ.get("CC"):
        return f"none: CC={os.environ['CC']!r} is not a program on PATH; fix: unset CC, or install it", False
    if cc is None: return "none of cc, gcc, clang is on PATH; fix: apt-get install gcc", False
    try:
        r = subprocess.run([*cc.split(), "--version"], capture_output=True, text=True, timeout=20, check=False)
        version = (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "?"
    except (OSError, subprocess.TimeoutExpired) as e:
        version = f"--version failed: {e}"
    return f"{cc}: {version}", True


def machine_line() -> str:
    """What the CPU device's kernels are built for (runtime/machine.py): ISA, vector width and registers, caches."""
    if (cc := find_compiler(raise_error=False)) is None: return "none (no C compiler)"
    try: return machine(cc).describe()
    except (RuntimeError, ValueError) as e: return f"unusable: {e}"


@dataclass
class Part:
    what: str
    found: str | None    # what was found (a path, a version), None when missing
    fix: str             # the package that provides it


@dataclass
class Backend:
    name: str
    devices: str
    parts: list[Part] = field(default_factory=list)


def _pip_version(dist: str, module: str) -> str | None:
    if importlib.util.find_spec(module) is None: return None
    try: return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError: return module


def _files(*patterns: str) -> str | None:
    found = sorted(os.path.basename(f) for p in patterns for f in glob.glob(p))
    return ", ".join(found) if found else None


def backends() -> list[Backend]:
    """Each optional backend's pieces: found or missing, and the package that provides it."""
    return [
        Backend("OpenCL", "CL", [
            Part("ICD loader libOpenCL", ctypes.util.find_library("OpenCL"), "apt-get install ocl-icd-libopencl1"),
            Part("OpenCL driver (ICD)", _files("/etc/OpenCL/vendors/*.icd"), "apt-get install pocl-opencl-icd")]),
        Backend("Vulkan/WebGPU", "WEBGPU", [
            Part("Python package wgpu", _pip_version("wgpu", "wgpu"), "pip install wgpu==0.32.0"),
            Part("Vulkan loader libvulkan", ctypes.util.find_library("vulkan"), "apt-get install libvulkan1"),
            Part("Vulkan driver", _files("/usr/share/vulkan/icd.d/*.json", "/etc/vulkan/icd.d/*.json"),
                 "apt-get install mesa-vulkan-drivers")]),
        Backend("CUDA", "CUDA", [
            Part("NVRTC (the CUDA compiler)", find_nvrtc(), "pip install 'nvidia-cuda-nvrtc==13.0.*'"),
            Part("NVIDIA driver libcuda", ctypes.util.find_library("cuda"),
                 "an NVIDIA GPU and its driver (from NVIDIA, not pip); without one NVRTC still compiles")]),
        Backend("LLVM", "LLVM", [Part("Python package llvmlite", _pip_version("llvmlite", "llvmlite"),
                                      "pip install llvmlite")]),
    ]


# ---------------------------------------------------------------------------------------------------------------------
# the kernel cache and the environment variables

def cache_usage(root: str) -> list[tuple[str, int, int]]:
    """(subdirectory, files, bytes) for each directory under the cache root, biggest first."""
    rows = []
    for d in sorted(pathlib.Path(root).iterdir()) if os.path.isdir(root) else []:
        if not d.is_dir(): continue
        n = size = 0
        for dirpath, _, files in os.walk(d):
            for f in files:
                try: size += os.stat(os.path.join(dirpath, f)).st_size
                except OSError: continue
                n += 1
        rows.append((d.name, n, size))
    return sorted(rows, key=lambda r: -r[2])


def _is_os_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def _str_arg(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def env_reads(source: str) -> tuple[list[tuple[str, int]], list[int]]:
    """The environment variables a module reads: ([(name, line)], [lines of reads whose name isn't a literal]).

    A read is `getenv("X")` / `os.getenv("X")`, `ContextVar("X", ...)`, `os.environ["X"]`, `os.environ.get("X")`
    or `"X" in os.environ`; writes (`os.environ["X"] = ...`) and strings in docstrings don't count.

    >>> env_reads('import os\\nA = os.getenv("FOO", "1")\\nB = "BAR" in os.environ')
    ([('FOO', 2), ('BAR', 3)], [])
    """
    names: list[tuple[str, int]] = []
    dynamic: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            environ_get = fname == "get" and isinstance(fn, ast.Attribute) and _is_os_environ(fn.value)
            # fusegrad's ContextVar (a bare name), not contextvars.ContextVar (whose name isn't an env var)
            is_read = fname == "getenv" or (fname == "ContextVar" and isinstance(fn, ast.Name)) or environ_get
            if is_read and (name := _str_arg(node)) is not None: names.append((name, node.lineno))
            elif is_read: dynamic.append(node.lineno)
        elif isinstance(node, ast.Subscript) and _is_os_environ(node.value) and isinstance(node.ctx, ast.Load):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.append((node.slice.value, node.lineno))
            else: dynamic.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(_is_os_environ(c) for c in node.comparators):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):   # "X" in os.environ
                names.append((node.left.value, node.lineno))
            else: dynamic.append(node.lineno)
    return sorted(names, key=lambda x: x[1]), dynamic


def env_vars_read(package_dir: pathlib.Path = PACKAGE_DIR) -> dict[str, list[str]]:
    """Every environment variable the package's source reads -> where ("fusegrad/helpers.py:96", ...).

    >>> "DEBUG" in env_vars_read()
    True
    """
    out: dict[str, list[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).as_posix()
        for name, line in env_reads(path.read_text(encoding="utf-8"))[0]:
            out.setdefault(name, []).append(f"{rel}:{line}")
    return out


# ---------------------------------------------------------------------------------------------------------------------

def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB": return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def report(timeout: float) -> int:
    """Print the report; 0 when the default device works, else 1."""
    try: version = importlib.metadata.version("fusegrad")
    except importlib.metadata.PackageNotFoundError: version = "not installed (imported from source)"
    print(f"fusegrad   {version} ({pathlib.Path(fusegrad.__file__).parent})")
    print(f"python     {platform.python_version()} ({sys.executable})")
    print(f"platform   {platform.platform()}, {os.cpu_count()} CPUs")
    try: default, default_err = Device.DEFAULT, ""
    except RuntimeError as e: default, default_err = "", str(e)
    print(f"\ndevices (each runs (x*2+1) on 3 floats in a child process, {timeout:g} s limit)")
    checks = check_devices(Device._devices, timeout)
    for name, c in checks.items():
        tag = "default" if name == default else ""
        print(f"  {name:7s} {'works' if c.works else 'FAILS':6s} {tag:8s} {c.detail}")
    cc, _ = compiler_line()
    print(f"\nC compiler (the CPU device)\n  {cc}\n  target: {machine_line()}")
    print("\noptional backends")
    for b in backends():
        missing = [p for p in b.parts if p.found is None]
        print(f"  {b.name} ({b.devices}): {'all found' if not missing else 'missing ' + str(len(missing))}")
        for p in b.parts:
            print(f"    {'ok  ' if p.found else 'MISS'} {p.what}: " + (p.found if p.found else f"fix: {p.fix}"))
    root = cache_dir()
    usage = cache_usage(root)
    db = diskcache.stats()
    db_bytes = os.path.getsize(diskcache.db_path()) if db is not None else 0
    print(f"\ncaches  {root}  {_size(sum(u[2] for u in usage) + db_bytes)}")
    cap = int(CACHE_MAX_MB.value)
    if db is not None:
        print(f"  compile cache {diskcache.DB_NAME}: {db[0]} entries, {_size(db[1])} of the {cap} MB cap "
              "(CACHE_MAX_MB; least recently used entries go past it; delete the file to clear it)")
        for table, (n, size) in sorted(db[2].items(), key=lambda kv: -kv[1][1]):
            print(f"    {table:26s} {n:7d} entries {_size(size):>9s}")
    else: print(f"  compile cache {diskcache.DB_NAME}: none yet (cap {cap} MB, CACHE_MAX_MB)")
    if usage: print("  other folders (datasets, downloads; a kernel folder is the old one-file-per-entry cache, unused "
                    "now: delete it)")
    for name, n, size in usage: print(f"  {name:28s} {n:7d} files  {_size(size):>9s}")
    known = env_vars_read()
    set_here = sorted(k for k in known if k in os.environ)
    print("\nfusegrad environment variables set here" + ("" if set_here else ": none (docs/env_vars.md lists them)"))
    for k in set_here: print(f"  {k}={os.environ[k]}")
    if default_err or not checks[default].works:
        why = default_err or checks[default].detail
        print(f"\nthe default device {default or '(none)'} does NOT work: {why}")
        return 1
    print(f"\nthe default device {default} works")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusegrad.doctor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds each device check may take (default 60)")
    args = ap.parse_args(argv)
    if not args.timeout > 0: ap.error("--timeout must be positive")
    return report(args.timeout)


if __name__ == "__main__":
    sys.exit(main())
