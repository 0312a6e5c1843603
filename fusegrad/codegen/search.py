"""BEAM search: find a kernel's optimizations by compiling and timing candidates, over the same `Opt` actions the
hand-coded heuristic uses.

`BEAM=N` keeps the N fastest candidates each round; a round tries every single action on top of each of them
(compiled in parallel, each timed on scratch buffers). The search stops when a round finds nothing faster, after
BEAM_ROUNDS rounds, or when the per-kernel time budget BEAM_BUDGET (seconds) is spent. The heuristic's own choice is
always a candidate, so BEAM never picks something slower than the default. Results are cached on disk (sqlite) by
kernel and device; IGNORE_BEAM_CACHE=1 searches again. JITBEAM=N searches only kernels captured by TinyJit.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fusegrad import codegen   # (codegen.to_program at call time: tests replace it)
from fusegrad.codegen.opt import Opt, apply_opts, hand_coded_opts
from fusegrad.device import Buffer, Device
from fusegrad.helpers import BEAM_BUDGET, BEAM_ROUNDS, DEBUG, IGNORE_BEAM_CACHE, cache_dir, getenv, tqdm
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite
from fusegrad.ir.symbolic import pm_symbolic


def ast_key(ast: UOp) -> str:
    """A stable hash of a kernel AST (the same kernel in another process gets the same key)."""
    num: dict[UOp, int] = {}
    lines = []
    for i, u in enumerate(ast.toposort()):
        num[u] = i
        lines.append(f"{u.op.name} {u.dtype!r} {[num[s] for s in u.src]} {u.arg!r}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ----- the disk cache -----

def _db() -> sqlite3.Connection:
    os.makedirs(cache_dir(), exist_ok=True)
    conn = sqlite3.connect(os.path.join(cache_dir(), "beam.sqlite"), timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS beam (key TEXT PRIMARY KEY, opts TEXT)")
    return conn


def _cache_key(ast: UOp, device: str, amt: int) -> str:
    """Kernel + device + the compiler's identity (for CPU: compiler version, CPU model and flags) + beam width."""
    return f"{ast_key(ast)}:{device}:{Device[device].compiler.cachekey}:{amt}"


def cache_get(key: str) -> list[Opt] | None:
    with _db() as conn:
        row = conn.execute("SELECT opts FROM beam WHERE key = ?", (key,)).fetchone()
    return [Opt(*o) for o in json.loads(row[0])] if row else None


def cache_put(key: str, opts: list[Opt]) -> None:
    with _db() as conn:
        conn.execute("INSERT OR REPLACE INTO beam VALUES (?, ?)", (key, json.dumps([[o.op, o.axis, o.amount] for o in opts])))


# ----- the action space -----

def actions(ast: UOp, renderer: Any) -> list[Opt]:
    """Every single action that applies to this (already partly optimized) kernel."""
    out = []
    item = max((n.dtype.scalar().itemsize for n in ast.toposort() if n.op is Ops.LOAD), default=4)
    vec_ok = renderer.simd_bytes and not any(n.dtype.count > 1 for n in ast.toposort())  # one VECTORIZE per kernel
    # ranges of symbolic size (variables) get no actions: an amount must divide the size for every value
    rngs = sorted({n for n in ast.toposort() if n.op is Ops.RANGE and n.src[0].op is Ops.CONST}, key=lambda r: r.arg[0])
    glob = [r for r in rngs if r.arg[1] == "global"]
    out += [Opt("SWAP", a.arg[0], b.arg[0]) for a, b in zip(glob, glob[1:])]  # loop order
    # GPU-style targets with shared memory: a workgroup shares a reduce (one GROUP per kernel, on a reduce's last range)
    if getattr(renderer, "has_shared", False) and not any(r.arg[1] == "local" for r in rngs):
        lasts = {n.src[-1] for n in ast.toposort() if n.op is Ops.REDUCE}
        out += [Opt("GROUP", r.arg[0], k) for r in rngs if r in lasts for k in (16, 32, 64, 128, 256)
                if int(r.src[0].arg) % k == 0 and k <= renderer.local_max]
    for r in rngs:
        size = int(r.src[0].arg)
        if r.arg[1] == "local": continue  # a GROUP's lanes
        if r.arg[1] != "reduce":
            out += [Opt("UPCAST", r.arg[0], k) for k in (2, 3, 4, 5, 8) if size % k == 0 and k < size or k == size <= 8]
            if r is (glob[0] if glob else None):  # cache blocking of the outermost loop
                out += [Opt("TILE", r.arg[0], k) for k in (4, 8, 16, 32) if size % k == 0 and k < size]
        else:
            out += [Opt("UNROLL", r.arg[0], k) for k in (2, 4, 8) if size % k == 0 and k <= size]
            if 1 < size <= 16 and size not in (2, 4, 8): out.append(Opt("UNROLL", r.arg[0], size))
            out += [Opt("UNROLL_SUM", r.arg[0], k) for k in (2, 3, 4, 6) if size % k == 0 and k < size]
        if vec_ok:
            out += [Opt("VECTORIZE", r.arg[0], w) for w in (4, 8, 16) if size % w == 0 and w * item <= renderer.simd_bytes]
    return out


def fits_registers(ast: UOp, renderer: Any) -> bool:
    """Whether a candidate's accumulators (one per REDUCE, in vector registers) leave at least two of the machine's
    vector registers for operands (runtime/machine.py: 13 accumulators on AVX2, 29 on AVX-512); at most 32 on a target
    without a machine description. Past that the reduce loop spills to the stack."""
    reds = [n for n in ast.toposort() if n.op is Ops.REDUCE]
    if (m := getattr(renderer, "machine", None)) is None: return len(reds) <= 32
    return sum(m.registers_for(n.dtype.scalar(), n.dtype.count) for n in reds) + 2 < m.vector_registers


# ----- timing -----

class _Timer:
    """Compiles candidates and times them on zero-filled scratch buffers of the kernel's parameter sizes."""

    def __init__(self, ast: UOp, device: str):
        self.ast, self.dev = ast, Device[device]
        params = sorted((n for n in ast.toposort() if n.op is Ops.PARAM), key=lambda p: p.arg)
        self.bufs = []
        for p in params:
            b = Buffer(device, max(p.dtype.size, 1), p.dtype.base).ensure_allocated()
            b.copyin(memoryview(bytearray(b.nbytes)))
            self.bufs.append(b)

    def compile(self, opts: list[Opt]) -> Any:
        spec = codegen.to_program(self.ast, self.dev.renderer, opts)
        return self.dev.runtime(spec, self.dev.compiler.compile_cached(spec.src))

    def time(self, prg: Any, best: float, runs: int = 3) -> float:
        """The fastest of `runs` launches; a candidate clearly slower than `best` isn't run again."""
        args = [b.opaque for b in self.bufs]
        vals = tuple(int(v.arg[2]) for v in prg.spec.vars)   # variables at their largest value (buffers are that big)
        t = prg(*args, vals=vals, wait=True)
        for _ in range(runs - 1):
            if t > 1.5 * best: break
            t = min(t, prg(*args, vals=vals, wait=True))
        return t


def beam_search(ast: UOp, device: str, amt: int, name: str = "") -> list[Opt]:
    """The fastest optimization list found for this kernel (cached on disk)."""
    key = _cache_key(ast, device, amt)
    if not IGNORE_BEAM_CACHE and (hit := cache_get(key)) is not None: return hit
    st = time.perf_counter()
    renderer = Device_renderer(device)
    base = graph_rewrite(ast, pm_symbolic, name="beam symbolic")
    timer = _Timer(ast, device)
    tried: dict[tuple[Opt, ...], float] = {}
    pool = ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 1))

    def evaluate(cands: list[tuple[Opt, ...]], bar: tqdm) -> None:
        def build(c: tuple[Opt, ...]) -> Any:
            try:
                applied = apply_opts(base, renderer, list(c))
                if not fits_registers(applied, renderer): return None  # registers would spill
                return timer.compile(list(c))
            except (ValueError, AssertionError, RuntimeError): return None  # an action that doesn't apply here
        for c, prg in zip(cands, pool.map(build, cands)):  # compile in parallel, time one at a time
            if time.perf_counter() - st > float(BEAM_BUDGET.value) and tried: break  # out of time: keep what we have
            tried[c] = timer.time(prg, min(tried.values(), default=float("inf"))) if prg is not None else float("inf")
            bar.update(1)

    heur = tuple(hand_coded_opts(base, renderer))
    bar = tqdm(desc=f"BEAM {name or ast_key(ast)[:8]}", disable=DEBUG < 1 and not getenv("BEAM_PROGRESS", 0), unit=" kernels")
    evaluate([heur, ()] if heur else [()], bar)
    beam = [()] + ([heur] if heur else [])  # grow from nothing too: the best tile may not contain the heuristic's

    for _ in range(int(BEAM_ROUNDS.value)):
        if time.perf_counter() - st > float(BEAM_BUDGET.value): break
        cands = []
        for b in beam:
            cur = apply_opts(base, renderer, list(b))
            for a in actions(cur, renderer):
                c = b + (a,)
                if c not in tried and c not in cands: cands.append(c)
        if not cands: break
        best_before = min(tried.values())
        evaluate(cands, bar)
        beam = sorted(tried, key=tried.get)[:amt]
        if min(tried.values()) >= best_before * 0.98: break  # nothing meaningfully faster: stop
    bar.update(close=True)
    pool.shutdown(wait=True, cancel_futures=True)  # out of time: drop queued compiles, let running ones finish
    best = list(min(tried, key=tried.get))
    if DEBUG >= 1:
        print(f"BEAM {name}: {len(tried)} candidates in {time.perf_counter() - st:.2f} s; "
              f"{tried[tuple(best)] * 1e6:.1f} us (heuristic {tried.get(heur, float('nan')) * 1e6:.1f} us) with {best}")
    cache_put(key, best)
    last_search.clear()
    last_search.update(tried=tried, heuristic=heur, best=tuple(best), seconds=time.perf_counter() - st)
    return best


last_search: dict[str, Any] = {}  # the latest search's candidates and times (for tests and debugging)


def Device_renderer(device: str) -> Any:
    return Device[device].renderer
