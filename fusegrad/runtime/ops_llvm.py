"""LLVM device: LLVM IR from the LLVM renderer, optimized at -O2 and compiled to an object file for the host CPU by
llvmlite (LLVM in-process, no system compiler), then loaded by an MCJIT engine and called through ctypes. Memory is
host memory from the CPU backend's allocator. Object files are cached on disk keyed by IR + LLVM version + CPU.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import struct
import threading
from typing import Any

from fusegrad.device import Compiled, CompileError, Compiler
from fusegrad.renderer import ProgramSpec
from fusegrad.renderer.llvmir import LLVMRenderer
from fusegrad.runtime.ops_cpu import CPUAllocator, CPUProgram, cpu_threads, simd_bytes, var_ctypes

INSTALL_HINT = "`pip install llvmlite` (it bundles LLVM; nothing else to install)"
_lock = threading.Lock()  # llvmlite locks each call, but a compile or a load is a sequence of calls


@functools.cache
def llvm() -> Any:
    """llvmlite.binding, with the host target initialized; a clear error when llvmlite is missing."""
    try:
        from llvmlite import binding  # type: ignore[import-untyped]
    except ImportError as e:
        raise RuntimeError(f"LLVM device: llvmlite is not installed ({e}); {INSTALL_HINT}") from e
    binding.initialize_native_target()
    binding.initialize_native_asmprinter()
    return binding


@functools.cache
def host_target() -> tuple[str, str, str]:
    """(triple, cpu name, cpu features) of this machine: code is built for exactly this CPU, like -march=native."""
    b = llvm()
    return b.get_process_triple(), b.get_host_cpu_name(), b.get_host_cpu_features().flatten()


def target_machine() -> Any:
    """A fresh -O2 target machine for the host (an MCJIT engine takes ownership of the one it is given)."""
    triple, cpu, features = host_target()
    return llvm().Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=2,
                                                                  codemodel="jitdefault", jit=True)


class LLVMCompiler(Compiler):
    """LLVM IR -> an object file for the host CPU: parse, verify, run LLVM's standard -O2 pipeline, emit."""

    def __init__(self) -> None:
        b = llvm()
        self.tm = target_machine()
        ident = f"{b.llvm_version_info}|{'|'.join(host_target())}|O2"
        super().__init__(f"llvm_{hashlib.sha256(ident.encode()).hexdigest()[:16]}")

    def compile(self, src: str) -> bytes:
        b = llvm()
        name = m.group(1) if (m := re.search(r"define void @\"?([\w.]+)", src)) else "?"
        with _lock:
            try:
                mod = b.parse_assembly(src, context=b.create_context())
                mod.verify()
            except RuntimeError as e:
                raise CompileError(f"LLVM rejected the IR of kernel {name}:\n{e}\n--- source ---\n{src}") from e
            mod.triple, mod.data_layout = self.tm.triple, str(self.tm.target_data)
            pto = b.create_pipeline_tuning_options(speed_level=2)
            pto.slp_vectorization = True  # as clang -O2 does (llvmlite leaves it off): packs unrolled scalar math
            pb = b.create_pass_builder(self.tm, pto)
            pb.getModulePassManager().run(mod, pb)
            return bytes(self.tm.emit_object(mod))


class LLVMProgram(CPUProgram):
    """A kernel loaded from its object file into its own MCJIT engine (kernel names repeat across kernels). Called like
    a CPU program: buffer addresses, then int vars, then (core_start, core_end) when it is split over threads."""

    def __init__(self, spec: ProgramSpec, lib: bytes):  # not super().__init__: that one loads a shared object
        self.name, self.spec = spec.name, spec
        b = llvm()
        with _lock:
            self.engine = b.create_mcjit_compiler(b.parse_assembly("", context=b.create_context()), target_machine())
            # a symbol MCJIT can't find becomes a null call target: refuse the kernel instead of crashing in it
            if (missing := [s for s in undefined_symbols(lib) if b.address_of_symbol(s) is None]):
                raise CompileError(f"kernel {spec.name} calls {', '.join(missing)}, which this process doesn't have")
            self.engine.add_object_file(b.ObjectFileRef.from_data(lib))
            self.engine.finalize_object()
            addr = self.engine.get_function_address(spec.name)
        if not addr: raise CompileError(f"kernel {spec.name} missing from its compiled object")
        argtypes = [ctypes.c_void_p] * spec.nbufs + var_ctypes(spec) + \
            ([ctypes.c_int, ctypes.c_int] if spec.thread_size else [])
        self.fxn = ctypes.CFUNCTYPE(None, *argtypes)(addr)  # a CFUNCTYPE call releases the GIL, so threads overlap
        n = spec.thread_size
        t = min(cpu_threads(), n) if n else 1
        self.chunks = [(n * i // t, n * (i + 1) // t) for i in range(t)] if n else []
        self.mt = None   # no trampoline in LLVM IR: split kernels use the Python pool


def undefined_symbols(obj: bytes) -> list[str]:
    """The external functions a little-endian ELF64 object calls (its undefined symbols); [] for other formats."""
    if obj[:6] != b"\x7fELF\x02\x01": return []
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _, kind, _, _, off, size, link, _, _, entsize in sections:
        if kind != 2: continue  # SHT_SYMTAB
        strtab = sections[link][4]
        for j in range(size // entsize):
            name, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", obj, off + j * entsize)
            if shndx == 0 and name: out.append(obj[strtab + name:obj.index(b"\0", strtab + name)].decode())
    return out


class LlvmDevice(Compiled):
    def __init__(self, device: str):
        renderer = LLVMRenderer()
        triple, cpu, features = host_target()
        renderer.fp16 = not triple.startswith(("x86_64", "i386", "i686")) or "+f16c" in features.split(",")
        renderer.threads = cpu_threads()
        renderer.simd_bytes = simd_bytes()  # the host's vector registers, as for the CPU device
        self.name = f"LLVM {'.'.join(map(str, llvm().llvm_version_info))}, {cpu}"
        super().__init__(device, CPUAllocator(), renderer, LLVMCompiler(), LLVMProgram)


__all__ = ["LLVMCompiler", "LLVMProgram", "LlvmDevice", "host_target", "llvm", "undefined_symbols"]
