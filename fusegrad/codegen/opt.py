"""Kernel optimizations as explicit actions (`Opt`) on the kernel AST, and the hand-coded heuristic that picks them.

UPCAST(r, k): split output range r into n/k iterations of k copies of every store (a register tile).
SWAP(r, s): output ranges r and s trade places in the loop nest (loop order for cache reuse).
TILE(r, k): cache blocking: output range r -> an outer loop of n/k in r's place and an inner loop of k innermost
among the output loops, so k of r's iterations reuse what the loops between them loaded.
VECTORIZE(r, w): w consecutive iterations of r become the lanes of SIMD vectors (see vectorize.py).
UNROLL(r, k): split reduce range r of size n into an outer range of n/k and k unrolled copies of the body, combined
with the reduce op, so each loop iteration does k accumulations.
UNROLL_SUM(r, k): UNROLL whose k copies are combined first and their result added to the accumulator once: one
dependent add per loop trip instead of k (for a kernel with a single accumulator, whose chain of adds is its latency).
A factor every copy of a sum multiplies by (one that doesn't depend on r: a quantized block's scale) multiplies their
sum once instead (`common_factor`).
GROUP(r, k): GPU-style targets only: k work-items of a workgroup share reduce range r, combining their partial results
through shared memory (see group.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from fusegrad.codegen.dot4 import dot_product_kernel
from fusegrad.codegen.group import group_opt, group_reduce
from fusegrad.codegen.linearize import UNROLLED
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import graph_rewrite, substitute, substitute_each
from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.ir.symbolic import pm_symbolic, split_terms
from fusegrad.renderer import Renderer
from fusegrad.codegen.vectorize import close_reduce, interval_gate, vectorize_range


@dataclass(frozen=True)
class Opt:
    op: str          # "UPCAST" (output range), "UNROLL", "UNROLL_SUM" (reduce range), "VECTORIZE" (any range: SIMD
                     # lanes), "SWAP", "TILE",
                     # "GROUP" (reduce range, GPU-style targets)
    axis: int        # which range, by its id
    amount: int


def unroll_reduces(ast: UOp, ranges: tuple[UOp, ...], rng: UOp, amount: int, next_id: int, fold: bool = True) -> UOp:
    """Every REDUCE(v(r), ..., r) over `ranges` -> REDUCE(v(ro*k+0) op ... op v(ro*k+k-1), ..., ro), ro of size n/k.
    `fold`: the copies' combining nodes are marked UNROLLED, so the linearizer adds them to the accumulator one by one
    (UNROLL); else they are plain nodes and the accumulator takes their result (UNROLL_SUM)."""
    size = int(rng.src[0].arg)
    assert size % amount == 0
    outer = UOp.range(size // amount, next_id, "reduce") if size // amount > 1 else None
    base = outer * amount if outer is not None else UOp.const(rng.dtype, 0)
    new_rngs = tuple(r for r in ranges if r is not rng) + ((outer,) if outer is not None else ())
    mapping = {}
    for red in ast.toposort():
        if red.op is not Ops.REDUCE or red.src[1:] != ranges: continue
        parts = substitute_each(red.src[0], rng, [base + i for i in range(amount)])
        if not fold and red.arg is Ops.ADD and (factored := common_factor(parts)) is not None: acc = factored
        else:
            acc = parts[0]
            for p in parts[1:]: acc = UOp(red.arg, red.dtype, (acc, p), UNROLLED if fold else None)   # (linearize.py)
        mapping[red] = UOp(Ops.REDUCE, red.dtype, (acc,) + new_rngs, red.arg) if new_rngs else \
            close_reduce(red.arg, acc)   # no loop accumulator left
    return substitute(ast, mapping)


def _factors(x: UOp) -> list[UOp]:
    """The operands of a product tree (MULs), left to right."""
    return _factors(x.src[0]) + _factors(x.src[1]) if x.op is Ops.MUL else [x]


def _addends(x: UOp) -> list[UOp]:
    """The operands of a sum tree (ADDs), left to right."""
    return _addends(x.src[0]) + _addends(x.src[1]) if x.op is Ops.ADD else [x]


def common_factor(parts: list[UOp]) -> UOp | None:
    """sum(parts) with shared factors pulled out: addends (of every part) that are products with the same operand f
    (the same node: a quantized block's scale, the same for each of its values and nibble halves) become f * (their
    sum without f), the factor shared by the most addends first; None when no two addends share one. One multiply
    per group instead of one per addend (SmolLM2's 49152 x 576 Q8_0 head: 4 per block of 32 values before). Rounds
    as a reassociated sum does."""
    left = [(a, _factors(a)) for p in parts for a in _addends(p)]
    groups: list[UOp] = []
    while len(left) > 1:
        counts: dict[UOp, int] = {}
        for _, fl in left:
            for f in dict.fromkeys(fl):
                if len(fl) > 1: counts[f] = counts.get(f, 0) + 1
        f = max(counts, key=lambda g: counts[g], default=None)
        if f is None or counts[f] < 2: break
        total = None
        for a, fl in [x for x in left if len(x[1]) > 1 and any(g is f for g in x[1])]:
            rest = list(fl)
            rest.pop(next(i for i, g in enumerate(rest) if g is f))
            term = rest[0]
            for g in rest[1:]: term = UOp(Ops.MUL, term.dtype, (term, g))
            total = term if total is None else UOp(Ops.ADD, term.dtype, (total, term))
        left = [x for x in left if not (len(x[1]) > 1 and any(g is f for g in x[1]))]
        groups.append(UOp(Ops.MUL, total.dtype, (f, total)))
    if not groups: return None
    out = groups[0]
    for g in groups[1:] + [a for a, _ in left]: out = UOp(Ops.ADD, out.dtype, (out, g))
    return out


def upcast_global(ast: UOp, rng: UOp, amount: int) -> UOp:
    """UPCAST(r, k): output range r of size n -> a range of ceil(n/k) and k copies of every store (constants 0..k-1 in
    place of the split-off part). Reduces over the same ranges then share one loop nest with k accumulators, and
    loads that don't depend on r are shared. When k doesn't divide n, a copy whose row can pass the end computes and
    stores row n-1 instead (min(r*k+i, n-1)): the last trip recomputes the last row a few times and writes the same
    value to it (only for kernels that read no buffer they write: see `clamped_upcast_ok`)."""
    size = int(rng.src[0].arg)
    trips = -(-size // amount)
    outer = UOp.range(trips, rng.arg[0], rng.arg[1]) if trips > 1 else None
    base = outer * amount if outer is not None else UOp.const(rng.dtype, 0)
    # copy i passes the end only on the last trip, and only when i >= the rows left there
    left = size - (trips - 1) * amount
    rows = [base + i if i < left else (base + i).lt(size).where(base + i, size - 1) for i in range(amount)]
    stores = []
    for st in ast.src:
        copies = substitute_each(st, rng, rows)
        if copies[0] is st: stores.append(st)   # doesn't depend on rng
        else: stores.extend(copies)
    return ast.replace(src=tuple(stores))


def clamped_upcast_ok(ast: UOp) -> bool:
    """Whether an UPCAST that doesn't divide its range may clamp (upcast_global): the duplicated last row is written
    several times, which is harmless only when no store's buffer is also read (an in-place update would read a value
    its own copy already wrote)."""
    stored = {n.src[0].src[0] for n in ast.src if n.op is Ops.STORE}
    return not any(n.op is Ops.LOAD and n.src[0].src[0] in stored for n in ast.toposort())


def _range(ast: UOp, axis: int) -> UOp:
    rng = next((n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[0] == axis), None)
    if rng is None: raise ValueError(f"no range with id {axis} in this kernel")
    return rng


def apply_opt(ast: UOp, opt: Opt, masked_loads: bool = False) -> UOp:
    """One action on the kernel. UPCAST needs an output range, UNROLL a reduce range; the amount must divide it, except
    that UPCAST and TILE of an output range may leave a remainder in a kernel that reads no buffer it writes: the last
    trip or block then clamps its indices to the range's last (`upcast_global`), computing that row again.
    `masked_loads`: the target renders masked vector loads (VECTORIZE makes them of loads gated along the lanes)."""
    rng = _range(ast, opt.axis)
    if rng.src[0].op is not Ops.CONST: raise ValueError(f"{opt}: range {opt.axis} has a symbolic size")
    size = int(rng.src[0].arg)
    if opt.op in ("UPCAST", "TILE") and 1 < opt.amount < size and size % opt.amount and rng.arg[1] == "global":
        # an amount that doesn't divide: the last trip (block) clamps its rows to n-1, where that is safe
        if not clamped_upcast_ok(ast):
            raise ValueError(f"{opt}: amount must divide the range size {size} in a kernel that reads what it writes")
        if opt.op == "UPCAST": return upcast_global(ast, rng, opt.amount)
        next_id = max(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE) + 1
        idx = UOp.range(-(-size // opt.amount), rng.arg[0], "global") * opt.amount + \
            UOp.range(opt.amount, next_id, "global")
        return substitute(ast, {rng: idx.lt(size).where(idx, size - 1)})
    if opt.op != "SWAP" and (opt.amount < 1 or size % opt.amount):
        raise ValueError(f"{opt}: amount must divide the range size {size}")
    if opt.op == "UPCAST":
        if rng.arg[1] == "reduce": raise ValueError(f"{opt}: UPCAST needs an output range, {opt.axis} is a reduce")
        return upcast_global(ast, rng, opt.amount)
    if opt.op == "TILE":  # cache blocking: r -> outer (keeps r's place) * k + inner, inner the innermost output loop
        if rng.arg[1] != "global": raise ValueError(f"{opt}: TILE needs an output range, {opt.axis} is a {rng.arg[1]}")
        if opt.amount in (1, size): raise ValueError(f"{opt}: the amount must split the range (1 < k < {size})")
        next_id = max(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE) + 1
        outer = UOp.range(size // opt.amount, rng.arg[0], "global")
        inner = UOp.range(opt.amount, next_id, "global")
        return substitute(ast, {rng: outer * opt.amount + inner})
    if opt.op == "SWAP":  # amount names the other output range: their loops trade places (ranges nest by id)
        other = _range(ast, opt.amount)
        if rng.arg[1] == "reduce" or other.arg[1] == "reduce" or rng is other:
            raise ValueError(f"{opt}: SWAP needs two different output ranges")
        return substitute(ast, {rng: UOp.range(rng.src[0], other.arg[0], other.arg[1]),
                                other: UOp.range(other.src[0], rng.arg[0], rng.arg[1])})
    if opt.op == "VECTORIZE":
        if opt.amount & (opt.amount - 1) or opt.amount < 2: raise ValueError(f"{opt}: the width must be a power of two")
        return vectorize_range(ast, rng, opt.amount, masked_loads)
    if opt.op == "GROUP":  # GPU-style targets: the workgroup's lanes share the reduce (codegen/group.py)
        if rng.arg[1] != "reduce": raise ValueError(f"{opt}: GROUP needs a reduce range, {opt.axis} is an output")
        return group_reduce(ast, rng, opt.amount)
    if opt.op in ("UNROLL", "UNROLL_SUM"):
        if rng.arg[1] != "reduce": raise ValueError(f"{opt}: {opt.op} needs a reduce range, {opt.axis} is an output")
        next_id = max(n.arg[0] for n in ast.toposort() if n.op is Ops.RANGE) + 1
        for key in dict.fromkeys(n.src[1:] for n in ast.toposort() if n.op is Ops.REDUCE and rng in n.src[1:]):
            ast = unroll_reduces(ast, key, rng, opt.amount, next_id, fold=opt.op == "UNROLL")
        return ast
    raise ValueError(f"unknown optimization {opt.op!r}")


def _stride(idx: UOp, rng: UOp) -> int | None:
    """How an address moves with rng: 0 (doesn't depend on it), its coefficient when rng is a plain term of the sum,
    None when it's buried in other math (a div, a mod, a gate)."""
    if rng not in idx.toposort(): return 0
    terms, _ = split_terms(idx)
    c = terms.get(rng)
    return c if c is not None and all(rng not in t.toposort() for t in terms if t is not rng) else None


def _vector_score(accesses: list[UOp], rng: UOp, weights: dict[UOp, int] | None = None,
                  masked: set[UOp] = frozenset()) -> int:
    """+w for every access a vector over rng makes one contiguous access, -w for every one it makes a gather/scatter;
    w is the access's weight (a load in the reduce loop counts more than the store that runs once per output).
    `masked`: loads the target reads as masked vector loads, so a gate along rng that is an interval doesn't count."""
    score = 0
    for idx in accesses:
        gate_dep = len(idx.src) > 2 and rng in idx.src[2].toposort() and \
            not (idx in masked and interval_gate(idx.src[2], rng))
        st = _stride(idx.src[1], rng)
        if st == 2 and idx in masked: st = 1   # two vector loads and a permute (vectorize.py)
        score += (-1 if gate_dep or (st not in (0, 1)) else st) * (weights or {}).get(idx, 1)
    return score


def _masked_loads(nodes: list[UOp], renderer: Renderer | None) -> set[UOp]:
    """The loads' addresses, when the target has masked vector loads (vectorize.py: gated along the lanes, or every
    second element); else none."""
    if renderer is None or not renderer.masked_vector_loads: return set()
    return {n.src[0] for n in nodes if n.op is Ops.LOAD}


# 16-bit floats (and uint16, bfloat16's storage once codegen/decompose.py emulates it) compute in float32 vectors: the
# renderer converts whole vectors at the loads and stores (ClangRenderer.render_cast)
VECTOR_DTYPES = {dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.bool, dtypes.float16,
                 dtypes.uint16}
# 8-bit integers (a quantized weight's bytes) too where the target computes them in int32 lanes (codegen/widen.py): the
# C compiler converts and shifts them lane by lane otherwise, slower than scalar code
NARROW_VECTOR_DTYPES = {dtypes.uint8, dtypes.int8}


def vector_dtypes(renderer: Renderer | None) -> set:
    """The dtypes a kernel may hold for the heuristic to VECTORIZE it on this target."""
    return VECTOR_DTYPES | NARROW_VECTOR_DTYPES if renderer is not None and renderer.widen_narrow_vectors else \
        VECTOR_DTYPES


def elementwise_opts(nodes: list[UOp], renderer: Renderer | None) -> list[Opt]:
    """Elementwise kernels are left to the C compiler's vectorizer, except two kinds that it leaves scalar:
    - those that evaluate exp2 or log2 (exp, sigmoid, tanh, erf, GELU, log, softplus) where the renderer has them for
      whole vectors: GCC -O2 doesn't vectorize a loop whose bounds are a thread's chunk, so each element ran the scalar
      fg_exp2f and the selects around it one by one (GELU over 1024x1536: 7.5 ms);
    - those that load or store float16, where the machine converts whole vectors (`Machine.half_vectors`): GCC 12
      converts each _Float16 on its own, so a half `x * y` ran at a fifth of float32's speed. Vectorized, the renderer
      converts each load and store as one vector (F16C) and computes in float32 vectors.
    VECTORIZE the range along which the loads and stores are contiguous, at the float32 SIMD width (or half, or a
    quarter, when that doesn't divide it)."""
    if renderer is None or not renderer.vector_math or not renderer.simd_bytes: return []
    kinds = {n.dtype.scalar() for n in nodes if n.op not in (Ops.STORE, Ops.PARAM, Ops.INDEX, Ops.SINK)}
    if not kinds <= {dtypes.float32, dtypes.int32, dtypes.bool, dtypes.float16}: return []
    half = dtypes.float16 in kinds
    if not half and not any(n.op in (Ops.EXP2, Ops.LOG2) for n in nodes): return []
    sizes = {n: int(n.src[0].arg) for n in nodes if n.op is Ops.RANGE and n.src[0].op is Ops.CONST}
    accesses = [n.src[0] for n in nodes if n.op in (Ops.LOAD, Ops.STORE) and n.src[0].src[0].op is Ops.PARAM]
    best, pick = 0, None
    for r in sorted(sizes, key=lambda r: -r.arg[0]):  # ties: the innermost range
        w = next((w for w in (renderer.simd_bytes // 4 >> k for k in range(3)) if w >= 4 and sizes[r] % w == 0 and
                  (not half or (renderer.machine is not None and renderer.machine.half_vectors(w)))), 0)
        if w and (sc := _vector_score(accesses, r, masked=_masked_loads(nodes, renderer)) * w) > best:
            best, pick = sc, Opt("VECTORIZE", r.arg[0], w)
    return [pick] if pick is not None else []


MAX_ACCUMULATORS = 16   # a register tile holds at most this many accumulators (vectors, or scalars without SIMD)
MIN_ACCUMULATORS = 8    # and window_tile's at least this many: FMA latency (4 cycles) x 2 pipes of independent sums


def vector_registers(renderer: Renderer | None) -> int:
    """The vector registers a register tile may use: the machine description's (runtime/machine.py); 32 for a target
    without one (the interpreter, GPUs: any tile of MAX_ACCUMULATORS fits)."""
    return renderer.machine.vector_registers if renderer is not None and renderer.machine is not None else 32


def tile_registers(tile: list[int]) -> int:
    """Vector registers a k1 x k2 register tile keeps live in its reduce loop: k1*k2 accumulators, the k2 operands
    shared along the first axis (loaded once per step, used by every row) and one operand of the first axis at a time.
    The linearizer updates each accumulator right after its product (codegen/linearize.py), so a row's broadcast is
    dead after its k2 FMAs: on AVX2 a 6 x 2 tile needs 15 of the 16 registers and GCC keeps it off the stack (before
    that order, all six broadcasts were live at once and it spilled). A 1-axis tile k is k x 1."""
    k1, k2 = (list(tile) + [1, 1])[:2]
    return k1 * k2 + k2 + 1


def register_tile(sizes: list[int], registers: int, clamp_threads: int = 0) -> list[int]:
    """The UPCAST amounts (at most 8 each) of up to two output ranges of these sizes (the first the better to share):
    the first gets the largest divisor <= 8, the second what is left of MAX_ACCUMULATORS. When that tile doesn't fit
    (tile_registers <= registers; AVX2's 16 registers and an 8 x 2 tile: 19), the tile with the most accumulators that
    does, then one whose amounts divide, then the fewest operand loads per step (6 x 2 when the rows divide by 6, 4 x 3
    when the vectors divide by 3, else 4 x 2 before 8 x 1). AVX-512's 32 registers hold every tile of up to 16
    accumulators. `clamp_threads` > 0: the first amount may also leave a remainder (upcast_global clamps the last
    trip) when that wastes at most 1/64 of the rows and the trips fall into cache blocks (`cache_block`, which may
    clamp the last block too) of at least 8 trips that split evenly over that many threads (AVX2, 2 threads: 2048 rows
    6 x 2, 342 trips in 18 blocks of 19; 1024 rows 6 x 2, 171 trips in 6 blocks of 29; 256 rows: 6 makes 43 trips,
    no such blocks, so 5 x 2, 52 trips in 4 blocks of 13)."""
    def divisors(n: int, cap: int) -> list[int]: return [a for a in range(min(cap, 8), 0, -1) if n % a == 0]
    if not sizes: return []
    first = divisors(sizes[0], MAX_ACCUMULATORS // 2 if len(sizes) > 1 else MAX_ACCUMULATORS)[0]
    tile = [first] + ([divisors(sizes[1], MAX_ACCUMULATORS // first)[0]] if len(sizes) > 1 else [])
    if tile_registers(tile) <= registers: return tile
    firsts = divisors(sizes[0], 8)
    if clamp_threads:
        def blocks_split(trips: int) -> bool:   # TILE's blocks of at least 8 trips, as many per thread
            return (k := cache_block(trips, clamp_threads, True)) >= 8 and -(-trips // k) % clamp_threads == 0
        n = sizes[0]
        firsts += [a for a in range(2, min(n, 8) + 1) if n % a and (-n) % a * 64 <= n and blocks_split(-(-n // a))]
    cands = [[a] + ([b] if len(sizes) > 1 else []) for a in firsts
             for b in (divisors(sizes[1], 8) if len(sizes) > 1 else [1])
             if a * b <= MAX_ACCUMULATORS and tile_registers([a, b]) <= registers]
    return max(cands, key=lambda t: (prod(t), sizes[0] % t[0] == 0, -sum(t), t[0]), default=[1] * len(sizes))


SKINNY_ROWS = 2 * MAX_ACCUMULATORS   # a product with at most this many rows (of x in x @ w) is "skinny"
SKINNY_CACHE_SHARE = 4               # ... and takes the skinny tile when w is larger than this share of the cache
SWAP_ROW_BLOCKS = 64                 # the column loop goes outermost when the rows make at most this many blocks


QUANTIZED_BLOCK = 32   # the values of ggml's smallest quantized block
QUANTIZED_UNROLL = 6   # a quantized matvec's block loops sum up to this many blocks per trip (UNROLL_SUM; 3 and 9 were
                       # within a few % of 6, 1 was 8-25% slower)


def quantized_matvec(glob: list[UOp], vec_rng: UOp | None, loads: list[UOp], reduce_len: int) -> bool:
    """Whether a kernel is one output row's dot products against a weight stored in bytes: one output range (of more
    than one iteration), vectorized along a reduce of at least QUANTIZED_BLOCK values (`reduce_len`: a bitcast of
    bytes to words sums 4), and a 1-byte buffer read along that output range."""
    return len(glob) == 1 and vec_rng is not None and vec_rng.arg[1] == "reduce" and reduce_len >= QUANTIZED_BLOCK \
        and any(a.src[0].dtype.itemsize == 1 and _stride(a.src[1], glob[0]) not in (0, None) for a in loads)


def _param_bytes(access: UOp) -> int:
    """The bytes of the buffer an INDEX reads (its PARAM: dtype.size elements)."""
    return access.src[0].dtype.size * access.src[0].dtype.itemsize


def skinny_bytes(cache_bytes: int) -> int:
    """A skinny product's w takes the skinny tile (and Tensor.dot's one-vector panels) when it is larger than this: a
    quarter of the cache (MiniLM's 590 KB 384 x 384 weights on a 2 MB L2; 26 rows, one core, read from memory: AVX2
    240 -> 110 us, AVX-512 101-127 -> 61-79 us with the panels; half the cache left them out)."""
    return cache_bytes // SKINNY_CACHE_SHARE


def skinny_tile(picked: list[UOp], sizes: dict[UOp, int], loads: list[UOp], renderer: Renderer | None,
                registers: int) -> tuple[UOp, UOp, list[int] | None, bool] | None:
    """(rows, columns, tile, big) of a product x @ w, or None for any other kernel: the rows are the picked range
    along which w (the inputs that don't move along it, at least twice the bytes of those that do; a square product
    has none) is re-read; `big`: w is more than half the cache. Every block of rows reads all of w, so fewer blocks
    read it fewer times: with at most SKINNY_ROWS rows (MiniLM's 26 tokens) and a big w, the tile takes as many rows
    as fit (a divisor of the rows up to MAX_ACCUMULATORS: 13 of 26), then what is left of the accumulators along the
    columns (26 x 384 @ 384 x 1536: 2 x 8, 13 reads of w, becomes 13 x 1 on AVX-512 and AVX2); otherwise the tile is
    None (the usual one). The caller puts the column loop outermost (SWAP) when the rows make few blocks."""
    if len(picked) != 2 or renderer is None or not renderer.cache_bytes or not loads: return None
    for rows in picked:   # bytes of the inputs that don't move along `rows`, and of those that do
        still = {a.src[0]: _param_bytes(a) for a in loads if _stride(a.src[1], rows) == 0}
        moving = {a.src[0]: _param_bytes(a) for a in loads if a.src[0] not in still}
        if sum(still.values()) >= 2 * max(sum(moving.values()), 1): break
    else: return None
    cols = picked[1] if rows is picked[0] else picked[0]
    big = sum(still.values()) > renderer.cache_bytes // 2
    n = sizes[rows]
    d = next((d for d in range(min(n, MAX_ACCUMULATORS), 1, -1) if n % d == 0 and tile_registers([d, 1]) <= registers),
             None)
    if n > SKINNY_ROWS or d is None or sum(still.values()) <= skinny_bytes(renderer.cache_bytes):
        return rows, cols, None, big
    b = next(b for b in range(MAX_ACCUMULATORS // d, 0, -1)
             if sizes[cols] % b == 0 and tile_registers([d, b]) <= registers)
    return rows, cols, [d, b], big



def _copies(access: UOp, axes: list[tuple[UOp, int, int]]) -> int:
    """How many different addresses `access` takes over the copies of a register tile and an unroll: `axes` lists
    (range, amount, step), copy i of a range moving the address by i * step * its stride. Two ranges with the same
    stride share addresses (a convolution's x + kx: 2 columns x 5 taps read 6 addresses, not 10); a range the
    address can't be read along (a div, a gate) makes every copy its own."""
    steps, own = [], []
    for rng, amount, step in axes:
        gated = len(access.src) > 2 and rng in access.src[2].toposort()
        st = None if gated else _stride(access.src[1], rng)
        if st is None: own.append(amount)
        elif st: steps.append((st * step, amount))
    offsets = {0}
    for st, amount in steps: offsets = {o + st * i for o in offsets for i in range(amount)}
    return len(offsets) * prod(own)


def window_tile(glob: list[UOp], sizes: dict[UOp, int], loads: list[UOp], vec_rng: UOp, width: int,
                window: UOp | None, registers: int) -> tuple[list[UOp], list[int], bool] | None:
    """The register tile of a convolution on a target with fewer than 32 vector registers (AVX2's 16): up to two
    output ranges and amounts (MIN_ACCUMULATORS to MAX_ACCUMULATORS accumulators) and whether to unroll the short
    reduce `window` (a convolution's kx, which the heuristic otherwise unrolls fully): the fewest loads per FMA among
    the tiles that fit the registers, then the fewest registers. The rule is `tile_registers`' counted on the copies:
    the accumulators of the first range's copy i come one after another (codegen/linearize.py), so what stays live
    is the accumulators, the copies (along the second range and the window's taps) of the loads that don't move
    along the first range, and one more. Unrolling the window shares the loads of overlapping taps (x + kx along an
    upcast x: 5 columns x 5 taps read 9 addresses, not 25) but multiplies what stays live: a 4 x 3 tile of an input
    gradient unrolled by 5 needs 28 registers, and spilled a third of its loads. A range whose loads overlap the
    window's is never the first (its taps would stay live across all its copies); one that overlaps another reduce
    range (y + ky) is the first only where nothing else does as well (GCC carried its taps across loop trips and
    spilled: 5-10% slower). At least MIN_ACCUMULATORS, since each adds an unrolled window's taps one after another
    (a 2 x 3 tile unrolled by 8 waited on its FMAs: 20% slower than 8 x 1). None (the usual tile) where a load is
    neither a vector along `vec_rng` nor a broadcast, for kernels that read no input at an output index plus a
    reduce index (not a convolution: a batched product keeps `register_tile`'s tile), or where the window has more
    taps than an output range it overlaps (a weight gradient's 8 output columns against 3 taps: it lost 12-25%)."""
    if any(_stride(a.src[1], vec_rng) not in (0, 1) for a in loads): return None
    def divisors(n: int) -> list[int]: return [k for k in range(2, min(n, 8) + 1) if n % k == 0]
    reduces = [r for r in dict.fromkeys(n for a in loads for n in a.src[1].toposort() if n.op is Ops.RANGE)
               if r.arg[1] == "reduce"]
    def overlaps(r: UOp, others: list[UOp]) -> bool:   # some load moves along r and one of `others` by one stride
        return any((st := _stride(a.src[1], r)) and any(st == _stride(a.src[1], o) for o in others) for a in loads)
    if not any(overlaps(r, reduces) for r in glob): return None   # no input read at x + kx: not a convolution
    if window is not None and \
            any(sizes[r] * (width if r is vec_rng else 1) < sizes[window] for r in glob if overlaps(r, [window])):
        return None
    best, pick = None, None
    for x in glob:
        for y in [None] + [g for g in glob if g is not x]:
            for ka in divisors(sizes[x]):
                for kb in (divisors(sizes[y]) if y is not None else [1]):
                    if not MIN_ACCUMULATORS <= ka * kb <= MAX_ACCUMULATORS: continue
                    for u in [1] + ([sizes[window]] if window is not None and not overlaps(x, [window]) else []):
                        steps = {x: width if x is vec_rng else 1, y: width if y is vec_rng else 1, window: 1}
                        axes = [(r, k, steps[r]) for r, k in ((x, ka), (y, kb), (window, u)) if r is not None]
                        n = sum(_copies(a, axes) for a in loads)
                        live = sum(_copies(a, axes[1:]) for a in loads if _stride(a.src[1], x) == 0 and
                                   not (len(a.src) > 2 and x in a.src[2].toposort()))
                        regs = ka * kb + live + 1
                        if regs > registers: continue
                        key = (n / (ka * kb * u), regs, overlaps(x, reduces), -ka * kb)
                        if best is None or key < best:
                            best, pick = key, ([x] + ([y] if y is not None else []),
                                               [ka] + ([kb] if y is not None else []), u > 1)
    return pick


def cache_block(trips: int, threads: int, clamp: bool = False) -> int:
    """TILE's amount for an outer loop of `trips` iterations: its largest divisor up to 32 that leaves every thread at
    least two blocks (1: none). `clamp` (the kernel allows a remainder, see apply_opt): when that divisor is below 8 or
    its blocks don't split evenly over the threads, the largest k of 8..32 whose ceil(trips/k) blocks do, wasting at
    most 1/32 of the trips (171 trips on 2 threads: 6 blocks of 29, not 9 of 19)."""
    threads = max(threads, 1)
    cap = min(32, trips // threads // 2)
    k = next((k for k in range(cap, 1, -1) if trips % k == 0), 1)
    if clamp and (k < 8 or trips // k % threads):
        k = next((c for c in range(cap, 7, -1) if -(-trips // c) % threads == 0 and (-trips) % c * 32 <= trips), k)
    return k


def hand_coded_opts(ast: UOp, renderer: Renderer | None = None) -> list[Opt]:
    """The heuristic, for kernels with a reduce (elementwise kernels are left to the C compiler's vectorizer):
    1. VECTORIZE the range along which most loads/stores are contiguous (an output axis, or the reduce axis when the
       inputs are contiguous in it: x @ w.T), at the target's SIMD width: loads in the reduce loop weigh 4x the final
       store, and the score scales with the vector width (16 lanes across a conv's output channels beat 4 along a
       20-wide row);
    2. UPCAST up to two output ranges along which some input doesn't move (its loads are then shared): a register
       tile of accumulators that fits the machine's vector registers (`register_tile`), at most 16;
    3. UNROLL short reduce ranges fully (<= 8), and long ones by 4 when nothing was vectorized."""
    opts: list[Opt] = []
    nodes = list(ast.toposort())
    if not any(n.op is Ops.REDUCE for n in nodes): return elementwise_opts(nodes, renderer)
    if renderer is not None and renderer.has_local:
        if (g := group_opt(ast, renderer)) is not None: return [Opt("GROUP", *g)]
    # ranges of symbolic size (variables) are left alone: amounts must divide the size for every value
    sizes = {n: int(n.src[0].arg) for n in nodes if n.op is Ops.RANGE and n.src[0].op is Ops.CONST}
    accesses = [n.src[0] for n in nodes if n.op in (Ops.LOAD, Ops.STORE) and n.src[0].src[0].op is Ops.PARAM]
    vec_rng, width = None, 1
    simd = renderer.simd_bytes if renderer is not None else 0
    kernel_dts = {n.dtype.scalar() for n in nodes if n.op not in (Ops.SINK, Ops.STORE, Ops.PARAM, Ops.INDEX)}
    # loads inside a reduce run once per reduce step, the store once per output: weigh them so (a conv whose weight is
    # contiguous along the output channels vectorizes along them, scattering its few stores)
    in_reduce = {n.src[0] for n in nodes if n.op is Ops.LOAD and any(r.arg[1] == "reduce" for r in n.src[0].src[1].toposort()
                                                                     if r.op is Ops.RANGE)}
    weights = {a: 4 if a in in_reduce else 1 for a in accesses}
    masked = _masked_loads(nodes, renderer)
    if simd and kernel_dts <= vector_dtypes(renderer) | {dtypes.void}:
        item = max(d.itemsize for d in kernel_dts if d not in (dtypes.bool, dtypes.void))
        # byte products that dot4.py contracts into 8-bit dot products: along a reduce, vectors of up to 32 bytes
        # (8 int32 lanes of dot products, which every target with them has)
        dot4 = renderer is not None and bool(renderer.dot4_lanes()) and dot_product_kernel(nodes)
        best = 0
        for r in sorted(sizes, key=lambda r: (r.arg[1] == "reduce", -r.arg[0])):  # ties: innermost output axis
            widths = (32, 16, 8) if dot4 and r.arg[1] == "reduce" else \
                (simd // item, simd // item // 2, simd // item // 4)
            w = next((w for w in widths if w >= 4 and sizes[r] % w == 0), None)
            if w is None: continue
            sc = _vector_score(accesses, r, weights, masked) * w  # wider vectors do more per instruction
            if sc > best: vec_rng, width, best = r, w, sc
    if vec_rng is not None:
        opts.append(Opt("VECTORIZE", vec_rng.arg[0], width))
        sizes[vec_rng] //= width
    # register tile: output axes that some input doesn't move along; an input that is a vector load counts `width`
    # times (sharing it saves a whole vector load), a scalar one once. Up to 8 on the best axis, 16 accumulators in all.
    loads = [a for a in accesses if any(n.op is Ops.LOAD and n.src[0] is a for n in nodes)]
    glob = sorted((r for r in sizes if r.arg[1] == "global" and sizes[r] > 1), key=lambda r: -r.arg[0])

    def reuse_score(r: UOp) -> int:
        return sum((width if vec_rng is not None and _stride(a.src[1], vec_rng) == 1 else 1)
                   for a in loads if _stride(a.src[1], r) == 0)
    def amount(r: UOp, cap: int) -> int: return next((a for a in range(min(cap, 8), 1, -1) if sizes[r] % a == 0), 1)
    # loads saved per step ~ reuse score x the tile size the axis allows: a row of 5 shares less than a block of 8
    picked = sorted((r for r in glob if reuse_score(r) > 0), key=lambda r: -reuse_score(r) * amount(r, 8))[:2]
    regs = vector_registers(renderer)
    # a first amount that leaves a remainder (the last trip clamped) where it is safe: see register_tile
    clamp = max(renderer.threads, 1) if renderer is not None and picked and clamped_upcast_ok(ast) else 0
    tile = register_tile([sizes[r] for r in picked], regs, clamp)
    # the vectorized range in place of an equal second axis that gets the same amount and whose loads it moves lie far
    # apart: the vectors loaded along it are then adjacent (a 32-float panel row: one or two cache lines, not two
    # panels 128 KiB apart; 2048 matmul +5-10%)
    if len(picked) == 2 and vec_rng in glob and vec_rng not in picked and \
            reuse_score(vec_rng) == reuse_score(picked[1]) and \
            register_tile([sizes[picked[0]], sizes[vec_rng]], regs, clamp) == tile and \
            all((st := _stride(a.src[1], picked[1])) == 0 or (st is not None and abs(st) >= 64 * width) for a in loads):
        picked[1] = vec_rng
    # a convolution over a batch (images, channels, rows and columns all > 1) on a small register file (AVX2): the tile,
    # and whether to unroll its window, by loads per FMA. (With one image, EfficientNet-Lite0's convolutions lost up
    # to 1.5x with it: their short unrolled windows pay off more than the model counts, so they keep the usual tile)
    window = next((k[-1] for k in dict.fromkeys(n.src[1:] for n in nodes if n.op is Ops.REDUCE)
                   if k[-1] is not vec_rng and 1 < sizes.get(k[-1], 0) <= 8), None)
    unroll_window = True
    batched = sum(r.arg[1] == "global" and int(r.src[0].arg) > 1 for r in sizes) > 3
    if regs < 32 and batched and vec_rng is not None and vec_rng.arg[1] == "global" and \
            sum(n.op is Ops.REDUCE for n in nodes) == 1 and \
            (wt := window_tile(glob, sizes, loads, vec_rng, width, window, regs)) is not None:
        picked, tile, unroll_window = wt
    skinny = skinny_tile(picked, sizes, loads, renderer, regs) if len(glob) == 2 else None   # (a plain 2-D product)
    skinny_applied = False
    if skinny is not None:
        rows, cols, sk, big_w = skinny
        if sk is not None and sk[0] > dict(zip(picked, tile)).get(rows, 1):
            picked, tile, skinny_applied = [rows, cols], sk, True
    # one row against a weight of bytes (a decoded token's quantized matvec, x @ w.T read along the reduce): no register
    # tile. A tile of 8 rows reads w as 8 strands a row apart, which the hardware prefetchers streamed slower than one
    # row at a time (SmolLM2's 49152 x 576 Q8_0 head 5.8 against 3.7 ms, its 1536 x 576 Q4_1 matvecs 103 against
    # 93 us on AVX2, docs/performance.md); the row's x, the shared input, stays in L1 either way. (Untiled, a float32
    # w's matvecs went both ways, so its tile stays.)
    reduce_len = width * prod(n for r, n in sizes.items() if r.arg[1] == "reduce")
    qmv = quantized_matvec(glob, vec_rng, loads, reduce_len)
    if qmv: picked, tile = [], []
    for r, k in zip(picked, tile):
        if k > 1:
            opts.append(Opt("UPCAST", r.arg[0], k))
            sizes[r] = -(-sizes[r] // k)
    budget = MAX_ACCUMULATORS // prod(tile)
    # cache blocking: an input that each iteration of the outermost output loop reads in full (b in a @ b) and that
    # doesn't fit in the cache is read in blocks: the outermost loop is TILEd, so a block of its iterations runs
    # against one cache-resident panel of that input (2048 matmul: 3-4x)
    outs = sorted((r for r in sizes if r.arg[1] == "global" and sizes[r] > 1), key=lambda r: r.arg[0])
    red_size = max((prod(sizes.get(r, 1) for r in n.src[1:]) for n in nodes if n.op is Ops.REDUCE), default=1)
    if renderer is not None and renderer.cache_bytes and len(outs) >= 2 and red_size >= 256:
        o = outs[0]
        big = [a for a in loads if _stride(a.src[1], o) == 0 and _param_bytes(a) > renderer.cache_bytes]
        if big and (k := cache_block(sizes[o], renderer.threads, clamp > 0)) > 1: opts.append(Opt("TILE", o.arg[0], k))
    # rows reading all of w: the column loop goes outermost, so the threads split w's columns and each streams its
    # part of w once while the rows stay in cache (rows outermost read all of w once per row block). Where w is large
    # (more than half the cache) and the rows make at most SWAP_ROW_BLOCKS blocks, or at any number of rows where the
    # kernel is a dot product along the reduce (vectorized there: a quantized weight's blocks, x @ w.T read as it
    # is), which pays most for re-reading w (2-3x from 32 to 1024 rows of a quantized weight). Not for a dot product
    # whose rows already make a few big blocks (the skinny tile): there the swap cost 15-25% on both ISAs. A float
    # product that took the skinny tile (a w over a quarter of the cache) swaps too: its panels split over the threads
    dot = vec_rng is not None and vec_rng.arg[1] == "reduce"
    if skinny is not None and not (dot and skinny_applied) and (dot or big_w or skinny_applied) and \
            1 < sizes[rows] and \
            (dot or sizes[rows] <= SWAP_ROW_BLOCKS) and \
            sizes[cols] >= 2 * max(renderer.threads if renderer is not None else 1, 1):
        opts.append(Opt("SWAP", rows.arg[0], cols.arg[0]))
    # the quantized matvec's one row has one accumulator per sum (the dot products', and the 8-bit path's minimums
    # times the activation's block sums): a chain of dependent adds, one per block, that was its time. Its block
    # loops sum QUANTIZED_UNROLL blocks first and add the result to the accumulator once (UNROLL_SUM). On AVX2,
    # in one process: the SmolLM2 49152 x 576 Q8_0 head (float path) 3.7-4.0 -> 2.8-3.1 ms, 1536 x 576 Q4_1 (8-bit
    # path) 70-88 -> 64-79 us (docs/performance.md)
    # A block's values left after the vectors (a float-path Q8_0 block of 32: 4 vectors of 8) are summed first, so the
    # block's scale multiplies their sum once (common_factor), not each vector (the head: 2.1 -> 1.75 ms in a C harness
    # at 2 threads)
    if qmv:
        if 1 < sizes[vec_rng] <= QUANTIZED_UNROLL: opts.append(Opt("UNROLL_SUM", vec_rng.arg[0], sizes[vec_rng]))
        for key in dict.fromkeys(n.src[1:] for n in nodes if n.op is Ops.REDUCE):
            for r in key:
                if r is vec_rng or sizes.get(r, 1) <= 1 or any(o.axis == r.arg[0] for o in opts): continue
                k = max(d for d in range(1, QUANTIZED_UNROLL + 1) if sizes[r] % d == 0)
                if k > 1: opts.append(Opt("UNROLL_SUM", r.arg[0], k))
    for key in dict.fromkeys(n.src[1:] for n in nodes if n.op is Ops.REDUCE):
        r = key[-1]
        if r is vec_rng or r not in sizes or sizes[r] <= 1 or (r is window and not unroll_window): continue
        unroll = sizes[r] if sizes[r] <= 8 else 4 if sizes[r] % 4 == 0 and vec_rng is None and budget > 4 else 1
        if unroll > 1 and not any(o.op in ("UNROLL", "UNROLL_SUM") and o.axis == r.arg[0] for o in opts):
            opts.append(Opt("UNROLL", r.arg[0], unroll))
    return opts


def apply_opts(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> UOp:
    """Apply `opts` (default: the hand-coded heuristic) in order, then re-simplify the index math."""
    opts = hand_coded_opts(ast, renderer) if opts is None else opts
    for o in opts: ast = apply_opt(ast, o, renderer.masked_vector_loads)
    return graph_rewrite(ast, pm_symbolic, name="opts " + " ".join(f"{o.op}({o.axis},{o.amount})" for o in opts)) \
        if opts else ast
