"""The machine description: what the CPU target gives a kernel (vector width, vector registers, FMA pipes, caches).

The CPU device compiles with `-march=$CPU_MARCH` (default `native`); the description is read from what that compiler
target enables (`cc -march=... -dM -E`: `__AVX512F__`, `__AVX2__`, `__FMA__`, `__ARM_NEON`, ...) and from the cache
sizes in sysfs, so `CPU_MARCH=x86-64-v3` on an AVX-512 machine describes (and builds for) an AVX2 one. Each number
can be overridden (`CPU_VECTOR_BYTES`, `CPU_VECTOR_REGISTERS`, `CPU_FMA_PIPES`, `CPU_L1_BYTES`, `CPU_L2_BYTES`,
`CPU_L3_BYTES`). Codegen's heuristics (`codegen/opt.py`: vector width, register tile, cache blocking) and BEAM search
read it from `renderer.machine` instead of constants. `python -m fusegrad.runtime.machine` (or `python -m
fusegrad.doctor`) prints it; docs/performance.md says how to describe a new CPU.
"""
from __future__ import annotations

import functools
import os
import platform
import signal
import subprocess
from dataclasses import dataclass

from fusegrad.dtype import DType
from fusegrad.helpers import CACHELEVEL, DEBUG, cache_dir, hash_bytes

# target macro -> the /proc/cpuinfo flag the host needs for code built with it (x86)
_HOST_FLAGS = {"__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512DQ__": "avx512dq",
               "__AVX512VL__": "avx512vl", "__AVX2__": "avx2", "__AVX__": "avx", "__FMA__": "fma", "__F16C__": "f16c",
               "__BMI2__": "bmi2", "__SSE4_2__": "sse4_2", "__AVX512VNNI__": "avx512_vnni",
               "__AVXVNNI__": "avx_vnni"}
# the features worth showing (the compiler target's macros without underscores)
_SHOWN = ("AVX512F", "AVX512BW", "AVX512VL", "AVX512VNNI", "AVXVNNI", "AVX512FP16", "AVX2", "AVX", "FMA", "F16C",
          "SSE4_2", "SSE2", "ARM_NEON",
          "ARM_FEATURE_FMA", "ARM_FEATURE_SVE", "ARM_FEATURE_FP16_VECTOR_ARITHMETIC")
_OVERRIDES = {"vector_bytes": "CPU_VECTOR_BYTES", "vector_registers": "CPU_VECTOR_REGISTERS",
              "fma_pipes": "CPU_FMA_PIPES", "l1_bytes": "CPU_L1_BYTES", "l2_bytes": "CPU_L2_BYTES",
              "l3_bytes": "CPU_L3_BYTES"}


@dataclass(frozen=True)
class Machine:
    """One CPU target as the kernel heuristics see it.

    isa: a name for the vector level (`avx512`, `avx2`, `sse2`, `neon`, or the architecture when none);
    march: the `-march` the kernels are compiled with; vector_bytes: the width of a vector register (0: no vectors);
    vector_registers: how many there are (they hold a register tile's accumulators and operands); fma_pipes: fused
    multiply-adds issued per cycle (0: no FMA); l1_bytes/l2_bytes/l3_bytes: the data caches one core sees;
    features: the compiler target's feature macros that matter here.
    """
    isa: str
    march: str
    vector_bytes: int
    vector_registers: int
    fma_pipes: int
    l1_bytes: int
    l2_bytes: int
    l3_bytes: int
    features: tuple[str, ...] = ()

    def lanes(self, dtype: DType) -> int:
        """Elements of `dtype` in one vector register (1 without vectors)."""
        return max(self.vector_bytes // dtype.itemsize, 1) if self.vector_bytes else 1

    def registers_for(self, dtype: DType, count: int = 1) -> int:
        """Vector registers a value of `count` elements of `dtype` occupies (a scalar takes one)."""
        if not self.vector_bytes: return count
        return max(-(-count * dtype.itemsize // self.vector_bytes), 1)

    def half_vectors(self, lanes: int) -> bool:
        """Whether float16 <-> float32 conversions of `lanes`-wide vectors are vector instructions on this target:
        x86 F16C (`vcvtph2ps` / `vcvtps2ph`; 16 lanes also need AVX-512F), or ARM NEON (`fcvtl` / `fcvtn`). Without
        them the compiler converts one lane at a time, and vectorizing float16 elementwise code gains nothing."""
        if self.isa == "neon": return True
        return "F16C" in self.features and (lanes <= 8 or "AVX512F" in self.features)

    def dot4_lanes(self) -> tuple[int, ...]:
        """The int32 lane counts of the 8-bit dot products this target does in a few instructions: lane i of the result
        adds the 4 products of unsigned bytes 4i..4i+3 of one operand and signed bytes of the other. x86 VNNI's
        `vpdpbusd` (16 lanes with AVX512-VNNI, 8 and 4 with its VL forms or with AVX-VNNI), else AVX2's `vpmaddubsw`
        then `vpmaddwd` (8 and 4 lanes; exact only for unsigned bytes up to `dot4_max_unsigned`); () without them."""
        if "AVX512VNNI" in self.features and "AVX512VL" in self.features: return (16, 8, 4)
        if "AVX512VNNI" in self.features: return (16,)
        if "AVXVNNI" in self.features or "AVX2" in self.features: return (8, 4)
        return ()

    def dot4_max_unsigned(self) -> int:
        """The largest unsigned byte value the 8-bit dot product takes exactly: 255 with VNNI (it adds in int32),
        127 with AVX2's `vpmaddubsw`, whose pairs of products saturate at int16 (127 * 128 * 2 doesn't)."""
        return 255 if "AVX512VNNI" in self.features or "AVXVNNI" in self.features else 127

    def vnni(self) -> bool:
        """Whether the dot products are VNNI's `vpdpbusd` (else AVX2's two-instruction form)."""
        return "AVX512VNNI" in self.features or "AVXVNNI" in self.features

    def describe(self) -> str:
        """A few lines for people: `python -m fusegrad.runtime.machine`, the doctor, the benchmarks."""
        kib = lambda n: f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"  # noqa: E731
        vec = f"{self.vector_bytes * 8}-bit vectors ({self.vector_bytes // 4} float32 lanes)" if self.vector_bytes \
            else "no vector types"
        fma = f"{self.fma_pipes} FMA pipe{'s' * (self.fma_pipes != 1)}" if self.fma_pipes else "no FMA"
        return (f"{self.isa} (-march={self.march}): {vec}, {self.vector_registers} vector registers, {fma}; "
                f"L1d {kib(self.l1_bytes)}, L2 {kib(self.l2_bytes)}, L3 {kib(self.l3_bytes)}"
                + (f"; {' '.join(self.features)}" if self.features else ""))

    def label(self) -> str:
        """A short tag for result tables: `avx2 (x86-64-v3)`."""
        return f"{self.isa} ({self.march})"


def cpu_march() -> str:
    """CPU_MARCH, the compiler's -march for CPU kernels (default `native`: this machine's own features)."""
    march = os.getenv("CPU_MARCH", "").strip() or "native"
    if not all(c.isalnum() or c in "-_.+" for c in march):
        raise ValueError(f"CPU_MARCH={march!r} is not a -march value (letters, digits, '-', '_', '.', '+')")
    return march


def _parse_macros(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) >= 2 and parts[0] == "#define": out[parts[1]] = parts[2] if len(parts) > 2 else ""
    return out


@functools.cache
def target_macros(cc: str, march: str, identity: str = "") -> dict[str, str]:
    """The predefined macros of `cc -march=<march>` (its target's features), e.g. {'__AVX2__': '1', ...}. With an
    `identity` (the compiler's version and the CPU's model and flags) the answer is kept in the cache directory, so a
    process start doesn't pay the 10-50 ms compiler run again."""
    path = os.path.join(cache_dir(), "machine", hash_bytes(cc, "\0", march, "\0", identity)[:32]) \
        if identity and CACHELEVEL >= 1 else None
    if path is not None:
        try:
            with open(path) as f: return _parse_macros(f.read())
        except OSError: pass
    timeout = min(60.0, float(os.getenv("COMPILE_TIMEOUT", "600")))
    # own process group: on a timeout the whole compiler is killed, also a child of it that holds the pipes
    proc = None
    try:
        proc = subprocess.Popen([*cc.split(), f"-march={march}", "-dM", "-E", "-x", "c", "-"], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        stdout, stderr = proc.communicate("", timeout=timeout)
    except subprocess.TimeoutExpired:
        assert proc is not None
        try: os.killpg(proc.pid, signal.SIGKILL)
        except OSError: pass
        proc.communicate()
        # no answer in time: a generic description (the compiler's own errors say the rest when a kernel compiles)
        if DEBUG >= 1: print(f"the C compiler {cc!r} did not say its -march={march} features within {timeout:g} s")
        return {}
    except OSError as e:
        raise RuntimeError(f"could not run the C compiler {cc!r} to read the features of -march={march}: {e}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the C compiler {cc!r} rejects -march={march} (CPU_MARCH): {stderr.strip()[:500]}")
    p = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if path is not None and "#define" in p.stdout:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f: f.write(p.stdout)
            os.replace(tmp, path)   # atomic: a reader sees the whole file or none
        except OSError: pass
    return _parse_macros(p.stdout)


def _cache_sizes() -> dict[int, int]:
    """Data/unified cache bytes per level for cpu0 from sysfs ({} when it can't be read)."""
    root, out = "/sys/devices/system/cpu/cpu0/cache", {}
    try:
        for idx in sorted(os.listdir(root)):
            if not idx.startswith("index"): continue
            d = os.path.join(root, idx)
            with open(f"{d}/type") as f:
                if f.read().strip() == "Instruction": continue
            with open(f"{d}/level") as f: level = int(f.read())
            with open(f"{d}/size") as f: size = f.read().strip()
            out[level] = int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[size[-1]] \
                if size[-1] in "KMG" else int(size)
    except (OSError, ValueError, KeyError): pass
    return out


def host_flags() -> set[str] | None:
    """The host CPU's /proc/cpuinfo flags (None where there is no such file)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")): return set(line.split(":", 1)[1].split())
    except OSError: pass
    return None


def describe_target(macros: dict[str, str], march: str, caches: dict[int, int]) -> Machine:
    """The description a compiler target's macros and the cache sizes give (before env overrides)."""
    has = macros.__contains__
    x86, arm = has("__x86_64__") or has("__i386__"), has("__aarch64__") or has("__arm__")
    isa = "avx512" if has("__AVX512F__") else "avx2" if has("__AVX2__") else "avx" if has("__AVX__") else \
        "sse4.2" if has("__SSE4_2__") else "sse2" if has("__SSE2__") else "neon" if has("__ARM_NEON") else \
        (platform.machine() or "cpu").lower()
    # AVX without AVX2 has 256-bit float math but not integer math: 128-bit vectors keep both whole
    vector_bytes = 64 if has("__AVX512F__") else 32 if has("__AVX2__") else \
        16 if has("__SSE2__") or has("__ARM_NEON") else 0
    registers = 32 if has("__AVX512F__") or has("__aarch64__") else 8 if has("__i386__") else 16
    fma = has("__FMA__") or has("__ARM_FEATURE_FMA") or (arm and has("__aarch64__"))
    return Machine(isa=isa, march=march, vector_bytes=vector_bytes, vector_registers=registers,
                   fma_pipes=2 if fma else 0, l1_bytes=caches.get(1, 32 << 10), l2_bytes=caches.get(2, 1 << 20),
                   l3_bytes=caches.get(3, 0),
                   features=tuple(f for f in _SHOWN if x86 or arm if has(f"__{f}__") or has(f"__{f}")))


def override_values() -> dict[str, str]:
    """The override env vars as set now, by field ('' where unset)."""
    return {"vector_bytes": os.getenv("CPU_VECTOR_BYTES", ""),
            "vector_registers": os.getenv("CPU_VECTOR_REGISTERS", ""), "fma_pipes": os.getenv("CPU_FMA_PIPES", ""), "l1_bytes": os.getenv("CPU_L1_BYTES", ""),
            "l2_bytes": os.getenv("CPU_L2_BYTES", ""), "l3_bytes": os.getenv("CPU_L3_BYTES", "")}


def _override(m: Machine, values: dict[str, str] | None = None) -> Machine:
    """Env overrides (CPU_VECTOR_BYTES, ...): each a non-negative integer; vector bytes 0 or a power of two >= 8,
    vector registers at least 4."""
    kw = {}
    for field, v in (values if values is not None else override_values()).items():
        if (v := v.strip()) == "": continue
        var = _OVERRIDES[field]
        try: n = int(v, 0)
        except ValueError: raise ValueError(f"{var}={v!r} is not an integer") from None
        if n < 0 or (field == "vector_bytes" and n and (n < 8 or n & (n - 1))) or \
                (field == "vector_registers" and n < 4):
            raise ValueError(f"{var}={v!r} is out of range" + (" (0 or a power of two >= 8)" if field == "vector_bytes"
                                                              else " (at least 4)" if field == "vector_registers" else
                                                              " (must be >= 0)"))
        kw[field] = n
    return m if not kw else Machine(**{**m.__dict__, **kw})


def check_host(macros: dict[str, str], march: str, flags: set[str] | None) -> None:
    """Raise when code built for `march` would use instructions this host lacks (it would die of SIGILL)."""
    if flags is None or march == "native" or not ("__x86_64__" in macros or "__i386__" in macros): return
    missing = sorted(f for m, f in _HOST_FLAGS.items() if m in macros and f not in flags)
    if missing:
        raise RuntimeError(f"CPU_MARCH={march} builds kernels with {', '.join(missing)}, which this CPU lacks: unset "
                           "CPU_MARCH or pick a level this CPU has (x86-64-v3: AVX2, x86-64-v2: SSE4.2)")


@functools.cache
def host_machine() -> Machine:
    """This host as /proc/cpuinfo describes it, without asking a compiler (for the LLVM device, which builds for the
    host CPU whatever CPU_MARCH says)."""
    arch, flags = platform.machine().lower(), host_flags() or set()
    macros = {m: "1" for m, f in _HOST_FLAGS.items() if f in flags}
    if arch in ("x86_64", "amd64"): macros.update(__x86_64__="1", __SSE2__="1")
    elif arch in ("aarch64", "arm64"): macros.update(__aarch64__="1", __ARM_NEON="1")
    return _override(describe_target(macros, "native", _cache_sizes()))


@functools.cache
def _machine(cc: str, march: str, overrides: tuple[tuple[str, str], ...], identity: str) -> Machine:
    macros = target_macros(cc, march, identity)
    check_host(macros, march, host_flags())
    return _override(describe_target(macros, march, _cache_sizes()), dict(overrides))


def machine(cc: str, march: str | None = None, identity: str = "") -> Machine:
    """The description of the CPU target of C compiler `cc` at `march` (default CPU_MARCH), with the env overrides.
    Read once per process for each (compiler, march, overrides); with `identity` (see target_macros) from the disk
    cache after the first process."""
    return _machine(cc, march or cpu_march(), tuple(override_values().items()), identity)


if __name__ == "__main__":
    from fusegrad.runtime.ops_cpu import find_compiler
    print(machine(find_compiler() or "cc").describe())
