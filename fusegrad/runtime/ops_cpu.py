"""CPU device: C source from the C-style renderer, compiled by the system C compiler into a shared object, loaded
with ctypes. Compiled objects are cached on disk keyed by source + compiler identity + CPU.

Several new kernels are compiled as one translation unit into one shared object (`compile_batch`): each C compiler
run costs about 35 ms before it compiles anything (driver, assembler, linker), more than a typical kernel's own
compile. Each kernel's cache entry then holds a reference (`BATCH_REF`, the batch object's key, the kernel's symbol)
to the batch object, which is cached under its own key, so a warm process also loads one object per batch.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from fusegrad.device import Allocator, Compiled, CompileError, Compiler, diskcache_del, diskcache_get, diskcache_put
from fusegrad.helpers import DEBUG, hash_bytes
from fusegrad.renderer import ProgramSpec
from fusegrad.renderer.cstyle import ClangRenderer
from fusegrad.runtime import cpu_pool
from fusegrad.runtime.machine import Machine, cpu_march, host_machine, machine

CPU_POOL = int(os.getenv("CPU_POOL", "1"))   # 0: split kernels run their chunks through the Python thread pool
# 1: transparent huge pages for big buffers (off by default: little gain on two cores, and a first touch may wait for
# the kernel to compact memory; docs/performance.md, "Big buffers on huge pages")
CPU_HUGE_PAGES = int(os.getenv("CPU_HUGE_PAGES", "0"))
MADV_HUGEPAGE, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS = 14, 3, 0x22   # <sys/mman.h> on Linux

_CANDIDATES = ("cc", "gcc", "clang")


class CompileTimeoutError(CompileError):
    """The C compiler ran past COMPILE_TIMEOUT seconds and was killed."""


_warned: set[str] = set()


def find_compiler(raise_error: bool = True) -> str | None:
    """The C compiler to use: $CC, else the first of cc/gcc/clang on PATH. Without raise_error (choosing the default
    device), a CC that can't be used is reported once on stderr and None is returned."""
    tried = []
    if (cc := os.getenv("CC")) is not None and cc != "":
        why = "is blank" if not cc.strip() else None if shutil.which(cc.split()[0]) else "is not found on PATH"
        if why is None: return cc
        msg = (f"CC={cc!r} is set but {why}; unset CC to use cc/gcc/clang, or install it. "
               "DEV=PYTHON works without a compiler (slowly).")
        if raise_error: raise RuntimeError(msg)  # an explicit choice that doesn't work is an error
        if msg not in _warned:
            _warned.add(msg)
            print(f"fusegrad: {msg} The default device is PYTHON.", file=sys.stderr)
        return None
    for c in _CANDIDATES:
        tried.append(c)
        if shutil.which(c): return c
    if raise_error:
        raise RuntimeError(f"no C compiler found for the CPU device (tried {', '.join(tried)}). Install one "
                           "(e.g. `apt-get install gcc` or `apt-get install clang`) or set CC; "
                           "DEV=PYTHON works without a compiler (slowly).")
    return None


@functools.cache
def _cpu_identity() -> str:
    """What the binary depends on: machine, CPU model and flags (the -march of CPU_MARCH is among the compile flags)."""
    info = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")): info += line
                if line.strip() == "": break
    except OSError:
        info += platform.processor()
    return info


@functools.cache
def _compiler_identity(cc: str) -> str:
    try: return subprocess.run([*cc.split(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError): return cc


class CPUCompiler(Compiler):
    # -ffp-contract=off: no silent fused multiply-adds in elementwise math, so results round like the reference (and
    # inf-inf stays NaN); float reduce kernels opt in to FMA through the renderer (see ClangRenderer.reduce_prefix).
    # -fvect-cost-model=cheap: GCC 12's -O2 default ("very cheap") vectorizes no loop whose trip count it can't prove
    # a multiple of the vector width, which is every elementwise loop split across threads (core_start..core_end);
    # vectorizing them changes no result (no reassociation without -ffast-math) and makes them 2-20x faster.
    # -march=$CPU_MARCH (runtime/machine.py) goes in after -O2.
    flags = ["-O2", "-shared", "-fPIC", "-fno-math-errno", "-fno-strict-aliasing", "-ffp-contract=off",
             "-fvect-cost-model=cheap"]

    def __init__(self, march: str | None = None) -> None:
        self.cc = find_compiler()
        assert self.cc is not None
        self.machine: Machine = machine(self.cc, march or cpu_march(), _compiler_identity(self.cc) + _cpu_identity())
        self.flags = [*self.flags[:1], f"-march={self.machine.march}", *self.flags[1:]]
        ident = hashlib.sha256((_compiler_identity(self.cc) + _cpu_identity() + " ".join(self.flags)).encode())
        # "b1": entries may be BATCH_REF pointers, which an older fusegrad would try to load as shared objects
        self.table = f"cpu_b1_{ident.hexdigest()[:16]}"
        super().__init__(self.table)

    def compile(self, src: str) -> bytes:
        kernels = ", ".join(_KERNEL_FN.findall(src)[:8]) or "?"
        timeout = float(os.getenv("COMPILE_TIMEOUT", "600"))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "k.so")
            # own process group: on a timeout the whole compiler (driver, cc1, as, ld) is killed, not just the driver
            proc = subprocess.Popen([*self.cc.split(), *self.flags, "-x", "c", "-", "-o", out, "-lm"], text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            try: _, stderr = proc.communicate(src, timeout=timeout)
            except subprocess.TimeoutExpired:
                try: os.killpg(proc.pid, signal.SIGKILL)
                except OSError: pass
                proc.communicate()
                raise CompileTimeoutError(f"C compiler {self.cc!r} did not finish compiling kernel {kernels} within "
                                          f"COMPILE_TIMEOUT={timeout:g} s; killed it. Raise COMPILE_TIMEOUT or check "
                                          "CC.") from None
            if proc.returncode != 0:
                raise CompileError(f"C compile failed ({self.cc}):\n{stderr}\n--- source ---\n{src}")
            try:
                with open(out, "rb") as f: return f.read()
            except OSError:
                raise CompileError(f"C compiler {self.cc!r} exited 0 but wrote no output for kernel {kernels}; its "
                                   f"stderr:\n{stderr or '(empty)'}") from None

    def assembly(self, src: str) -> str:
        """The assembly the compiler makes of `src` with the kernels' flags (-S): to read what a kernel became (a
        register tile that spills, say)."""
        flags = [f for f in self.flags if f not in ("-shared", "-fPIC")]
        p = subprocess.run([*self.cc.split(), *flags, "-S", "-x", "c", "-", "-o", "-"], input=src, text=True,
                           capture_output=True, timeout=float(os.getenv("COMPILE_TIMEOUT", "600")))
        if p.returncode != 0: raise CompileError(f"C compile failed ({self.cc}):\n{p.stderr}")
        return p.stdout

    def _lookup(self, src: str) -> bytes | None:
        """The cached binary of a source, or None. A reference into a batch object counts only while that object is
        loaded or in the disk cache (its bytes are then kept for CPUProgram)."""
        if (lib := diskcache_get(self.table, hash_bytes(src))) is None or not lib.startswith(BATCH_REF): return lib
        try: bkey, _sym = lib[len(BATCH_REF):].decode().split(":")
        except ValueError:  # a malformed reference (UnicodeDecodeError is a ValueError too): evict, compile again
            diskcache_del(self.table, hash_bytes(src))
            return None
        with _batch_lock:
            if bkey in _batch_libs or bkey in _batch_objs: return lib
        if (obj := diskcache_get(self.table, bkey)) is None: return None  # evicted or corrupt: compile again
        with _batch_lock: _batch_objs.setdefault(bkey, obj)
        return lib

    def compile_cached(self, src: str) -> bytes:
        if (lib := self._lookup(src)) is None:
            lib = self.compile(src)
            diskcache_put(self.table, hash_bytes(src), lib)
        return lib

    def compile_batch(self, kernels: list[tuple[str, str]]) -> list[bytes]:
        """Binaries for (function name, source) pairs: cached ones from the disk cache, the rest compiled by one
        compiler run into one shared object. In the joined source each kernel's function and static helpers get a
        per-kernel suffix (names repeat across kernels); the identical typedefs that repeat are valid C11."""
        libs = [self._lookup(src) for _, src in kernels]
        todo = [i for i, lib in enumerate(libs) if lib is None]
        if len(todo) == 1: libs[todo[0]] = self.compile_cached(kernels[todo[0]][1])
        if len(todo) <= 1: return [lib for lib in libs if lib is not None]
        parts, syms = [], {}
        for i in todo:
            name, src = kernels[i]
            trampoline = [name + t for t in ("_mt", "_task", "_args") if f"{name}_mt(" in src]   # cstyle.py
            names = list(dict.fromkeys([name, *trampoline, *_STATIC_FN.findall(src)]))
            parts += [f"#define {n} {n}__fg{i}" for n in names] + [src] + [f"#undef {n}" for n in names]
            syms[i] = f"{name}__fg{i}"
        unit = "\n".join(parts)
        try: obj = self.compile(unit)
        except CompileTimeoutError: raise   # one by one would time out once per kernel
        except CompileError:  # compile them one by one, so the error names the kernel that fails
            return [lib if lib is not None else self.compile_cached(src) for lib, (_, src) in zip(libs, kernels)]
        bkey = f"batch_{hash_bytes(unit)}"
        diskcache_put(self.table, bkey, obj)
        with _batch_lock: _batch_objs.setdefault(bkey, obj)
        for i, sym in syms.items():
            libs[i] = ref = BATCH_REF + f"{bkey}:{sym}".encode()
            diskcache_put(self.table, hash_bytes(kernels[i][1]), ref)
        return [lib for lib in libs if lib is not None]


_KERNEL_FN = re.compile(r"^(?:void|int) (\w+)\(", re.MULTILINE)

# a compile-cache entry that points into a batch object: BATCH_REF + b"<batch key>:<symbol>"
BATCH_REF = b"FUSEGRAD-BATCH-REF:"
_STATIC_FN = re.compile(r"^static inline [^(=;]*?\b(\w+)\(", re.MULTILINE)
_batch_objs: dict[str, bytes] = {}          # batch key -> shared object not yet loaded in this process
_batch_libs: dict[str, ctypes.CDLL] = {}    # batch key -> the loaded shared object
_batch_lock = threading.Lock()


def _batch_lib(bkey: str) -> ctypes.CDLL:
    with _batch_lock:
        if (lib := _batch_libs.get(bkey)) is None:
            if (obj := _batch_objs.pop(bkey, None)) is None:
                raise CompileError(f"batch object {bkey} is not loaded (compile_cached or compile_batch loads it)")
            lib = _batch_libs[bkey] = load_shared_object(obj)
        return lib


def simd_bytes() -> int:
    """This host's vector register width (64 with AVX-512, 32 with AVX2, else 16), for the LLVM device, which builds
    for the host CPU whatever CPU_MARCH says."""
    return host_machine().vector_bytes or 16


def cpu_threads() -> int:
    """CPU_THREADS, else the cores this process may run on."""
    if (n := os.getenv("CPU_THREADS")): return max(int(n), 1)
    try: return len(os.sched_getaffinity(0))
    except AttributeError: return os.cpu_count() or 1


def _work(inbox: "queue.SimpleQueue[Any]") -> None:
    while True:
        fxn, args, done = inbox.get()
        try: fxn(*args)
        except BaseException as e:   # handed to the launching thread, which raises it
            done.put(e)
            continue
        done.put(None)


@functools.cache
def _workers(n: int) -> list["queue.SimpleQueue[Any]"]:
    """The inboxes of n persistent worker threads for kernel chunks. Idle workers block on their queue (no spinning);
    ctypes calls release the GIL, so chunks run truly in parallel. A chunk is (function, args, done queue): lighter
    than a ThreadPoolExecutor, whose Future, lock and condition per task cost about as much as launching the kernel."""
    inboxes: list[queue.SimpleQueue[Any]] = []
    for i in range(n):
        inboxes.append(q := queue.SimpleQueue())
        threading.Thread(target=_work, args=(q,), name=f"fusegrad-cpu-{i}", daemon=True).start()
    return inboxes


# a forked child has none of the parent's threads: it starts its own workers
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_workers.cache_clear)


def var_ctypes(spec: ProgramSpec) -> list[Any]:
    """The C types the variables are passed as: int, or long long for one whose range needs 64 bits."""
    return [ctypes.c_int64 if spec.var_is_64bit(i) else ctypes.c_int for i in range(len(spec.vars))]


class CPUProgram:
    """A loaded kernel. Call with buffer addresses; returns the time in seconds when wait=True. A kernel rendered
    with a thread loop takes (core_start, core_end) and is split into one contiguous chunk per thread."""
    mt: Any = None   # the kernel's trampoline into the C worker pool (runtime/cpu_pool.py), when it has one

    def __init__(self, spec: ProgramSpec, lib: bytes):
        self.name, self.spec = spec.name, spec
        try: self.lib, self.fxn = self._load(lib, spec.name)
        except (OSError, ValueError, UnicodeDecodeError, CompileError) as e:
            # a cache entry can pass its checksum and still be unusable (written by another build, a bad batch
            # reference, ...): evict it and compile afresh, so the cache repairs itself instead of failing every run
            if _noexec(e): raise _noexec_error(e) from None
            if DEBUG >= 1: print(f"unusable compiled kernel {spec.name} ({e}); evicting and recompiling")
            comp = cpu_compiler()
            diskcache_del(comp.table, hash_bytes(spec.src))
            if lib.startswith(BATCH_REF):
                diskcache_del(comp.table, lib[len(BATCH_REF):].split(b":")[0].decode(errors="replace"))
            lib = comp.compile(spec.src)
            try: self.lib, self.fxn = self._load(lib, spec.name)
            except OSError as e2:
                raise (_noexec_error(e2) if _noexec(e2) else CompileError(f"kernel {spec.name}: {e2}")) from None
            diskcache_put(comp.table, hash_bytes(spec.src), lib)
        self.fxn.argtypes = [ctypes.c_void_p] * spec.nbufs + var_ctypes(spec) + \
            ([ctypes.c_int, ctypes.c_int] if spec.thread_size else [])
        self.fxn.restype = None
        n = spec.thread_size
        t = min(cpu_threads(), n) if n else 1
        self.chunks = [(n * i // t, n * (i + 1) // t) for i in range(t)] if n else []
        # split kernels start their chunks from C (runtime/cpu_pool.py) when the pool and the kernel's trampoline exist
        if len(self.chunks) > 1 and CPU_POOL and (run := cpu_pool.pool_run()) is not None:
            # in a batch object every name of the kernel's source got the kernel's suffix (compile_batch)
            suffix = lib[len(BATCH_REF):].decode().split(":")[1][len(spec.name):] if lib.startswith(BATCH_REF) else ""
            if (mt := getattr(self.lib, f"{spec.name}_mt{suffix}", None)) is not None:
                mt.argtypes = self.fxn.argtypes[:-2] + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
                mt.restype = None
                self.mt, self.run = mt, run
                self.bounds = (ctypes.c_int * (t + 1))(*[c[0] for c in self.chunks], self.chunks[-1][1])

    def c_entry(self) -> tuple[int, tuple[int, ...]] | None:
        """How C code launches this kernel as __call__ does: call the address with (*bufs, *vals, *trailing); returns
        (address, trailing), or None when __call__ hands the chunks to the Python pool (runtime/cpu_graph.py)."""
        if not self.chunks: return _address(self.fxn), ()
        if len(self.chunks) == 1: return _address(self.fxn), self.chunks[0]
        if self.mt is not None: return _address(self.mt), (self.run, len(self.chunks), ctypes.addressof(self.bounds))
        return None

    @staticmethod
    def _load(lib: bytes, name: str) -> tuple[ctypes.CDLL, Any]:
        sym = name
        if lib.startswith(BATCH_REF):  # a kernel inside a batch object (CPUCompiler.compile_batch)
            bkey, sym = lib[len(BATCH_REF):].decode().split(":")
            so = _batch_lib(bkey)
        else: so = load_shared_object(lib)
        try: return so, getattr(so, sym)
        except AttributeError as e: raise CompileError(f"kernel {name} missing from its compiled object") from e

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
        st = time.perf_counter()
        if not self.chunks: self.fxn(*bufs, *vals)
        elif len(self.chunks) == 1: self.fxn(*bufs, *vals, *self.chunks[0])
        elif self.mt is not None: self.mt(*bufs, *vals, self.run, len(self.chunks), self.bounds)
        else:
            done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()   # (one per launch: launches from
            for inbox, c in zip(_workers(len(self.chunks) - 1), self.chunks[1:]):  # several threads stay apart)
                inbox.put((self.fxn, (*bufs, *vals, *c), done))
            self.fxn(*bufs, *vals, *self.chunks[0])
            for _ in self.chunks[1:]:
                if (e := done.get()) is not None: raise e
        return time.perf_counter() - st if wait else None


def _address(fn: Any) -> int:
    """The address of a ctypes function (a symbol of a loaded library or a CFUNCTYPE object)."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


@functools.cache
def cpu_compiler() -> CPUCompiler: return CPUCompiler()


def _noexec(e: BaseException) -> bool:
    return "failed to map segment" in str(e) or "operation not permitted" in str(e).lower()


def _noexec_error(e: BaseException) -> CompileError:
    return CompileError(f"could not load a compiled kernel from {tempfile.gettempdir()}: {e}. That directory is "
                        "probably on a filesystem mounted noexec: set TMPDIR to a directory where programs may run "
                        "(e.g. TMPDIR=$HOME/.cache/tmp), or use DEV=PYTHON.")


def load_shared_object(lib: bytes) -> ctypes.CDLL:
    # a fresh random file name each time: the dynamic loader returns an already-loaded library for a reused name
    with tempfile.NamedTemporaryFile(suffix=".so", prefix="fusegrad-", delete=False) as f:
        f.write(lib)
    try: return ctypes.CDLL(f.name)
    finally: os.unlink(f.name)


@functools.cache
def huge_page_bytes(root: str = "/sys/kernel/mm/transparent_hugepage") -> int:
    """The size of a transparent huge page where the OS hands them out on request (Linux THP `madvise` or `always`),
    else 0 (THP `never`, another OS). The allocator uses them only with CPU_HUGE_PAGES=1."""
    try:
        with open(os.path.join(root, "enabled")) as f: mode = f.read()
        with open(os.path.join(root, "hpage_pmd_size")) as f: size = int(f.read())
    except (OSError, ValueError): return 0
    return size if "[never]" not in mode and size > 0 and size & (size - 1) == 0 else 0


class CPUAllocator(Allocator):
    """Host memory from the C library (64-byte aligned); buffers are raw addresses. A buffer of at least two huge
    pages (`huge_page_bytes`, 2 MiB on x86-64 Linux) is a mapping of its own, aligned to a huge page, that asks for
    them (madvise MADV_HUGEPAGE, as NumPy does from 4 MiB): a 2048 x 2048 matmul's loop touches more 4 KiB pages (a
    panel of b 8 KiB per row, six rows of a) than the first-level TLB holds, and with 4 KiB pages it ran 10-15%
    slower. A mapping of its own, unmapped when freed: advice given to the C library's heap outlives the buffer,
    and the kernel's khugepaged may later fill those heap ranges into whole huge pages. Opt-in (CPU_HUGE_PAGES=1)."""

    def __init__(self, huge_page: int | None = None) -> None:
        super().__init__()
        self.libc = ctypes.CDLL(None)
        self.libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.trim = getattr(self.libc, "malloc_trim", None)   # glibc only
        self.huge_page = (huge_page_bytes() if CPU_HUGE_PAGES else 0) if huge_page is None else huge_page
        fns = [getattr(self.libc, f, None) for f in ("mmap", "munmap", "madvise")] if self.huge_page else []
        self.madvise = fns[2] if fns and all(f is not None for f in fns) else None
        if self.madvise is not None:
            self.mmap, self.munmap = fns[0], fns[1]
            self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            self.mmap.restype = ctypes.c_void_p
            self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.mapped: dict[int, int] = {}   # a huge-page buffer's address -> its mapping's length

    def free_cache(self) -> None:
        """Free the cached buffers, then ask glibc to hand its free heap pages back to the system: it keeps them
        otherwise (a GGUF model's loading left 130 MB of freed temporaries resident next to 79 MB of weights)."""
        super().free_cache()
        if self.trim is not None: self.trim(0)

    def _alloc(self, nbytes: int) -> int:
        if self.madvise is not None and nbytes >= 2 * self.huge_page: return self._alloc_huge(nbytes)
        ptr = ctypes.c_void_p()
        if self.libc.posix_memalign(ctypes.byref(ptr), 64, nbytes) != 0 or not ptr.value:
            raise MemoryError(f"CPU allocation of {nbytes} bytes failed")
        return ptr.value

    def _alloc_huge(self, nbytes: int) -> int:
        """An anonymous mapping of nbytes (whole 4 KiB pages) at a huge-page boundary: one huge page more is mapped,
        and the parts before the boundary and after the end are unmapped again. Only the huge pages the buffer fills
        whole get the advice: with khugepaged's default `max_ptes_none` (511) a partly used one would be filled in
        (a 4 MiB + 100 B buffer's last 100 B grew into 2 MiB of RSS)."""
        hp = self.huge_page
        length = -(-nbytes // 4096) * 4096
        raw = self.mmap(None, length + hp, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)
        if raw is None or raw == ctypes.c_void_p(-1).value:
            raise MemoryError(f"CPU allocation of {nbytes} bytes failed")
        start = -(-raw // hp) * hp
        if start > raw: self.munmap(raw, start - raw)
        self.munmap(start + length, raw + hp - start)   # (start < raw + hp: the mapping's tail is never empty)
        self.madvise(start, nbytes // hp * hp, MADV_HUGEPAGE)   # (advice only: where the OS refuses, small pages stay)
        self.mapped[start] = length
        return start

    def _free(self, opaque: int, nbytes: int) -> None:
        if (length := self.mapped.pop(opaque, None)) is not None: self.munmap(opaque, length)
        else: self.libc.free(opaque)

    def _copyin(self, dest: int, src: memoryview) -> None:
        # (ctypes passes a bytes object's own memory; only a read-only view of part of one is copied first)
        if src.readonly: ctypes.memmove(dest, src.obj if type(src.obj) is bytes and len(src.obj) == src.nbytes
                                        and src.c_contiguous else src.tobytes(), src.nbytes)
        else: ctypes.memmove(dest, (ctypes.c_char * src.nbytes).from_buffer(src), src.nbytes)

    def _copyout(self, dest: memoryview, src: int) -> None:
        ctypes.memmove((ctypes.c_char * dest.nbytes).from_buffer(dest), src, dest.nbytes)

    def _offset(self, opaque: int, offset: int, nbytes: int) -> int:
        return opaque + offset


class CPUDevice(Compiled):
    def __init__(self, device: str):
        renderer, compiler = ClangRenderer(), CPUCompiler()
        renderer.threads = cpu_threads()
        # the C pool launches a split kernel in about a microsecond: smaller kernels are worth splitting than through
        # the Python pool (cpu_pool.MIN_WORK)
        if renderer.threads > 1 and CPU_POOL: renderer.min_thread_work = cpu_pool.MIN_WORK
        # what the kernels are built for (runtime/machine.py): codegen's heuristics read it
        renderer.machine = compiler.machine
        renderer.simd_bytes = compiler.machine.vector_bytes
        renderer.cache_bytes = compiler.machine.l2_bytes
        super().__init__(device, CPUAllocator(), renderer, compiler, CPUProgram)
        # the worker pool's library compiles (or loads from the disk cache) while the first graph is scheduled and
        # rendered, instead of in front of the first split kernel
        if renderer.threads > 1 and CPU_POOL: cpu_pool.prepare()
