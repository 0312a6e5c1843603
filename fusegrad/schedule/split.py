"""Scheduler pass "split reduce": a long reduction into few outputs becomes two kernels.

A reduce is one loop per output. When there are few outputs and the loop is long (`x.sum()` of 16M floats, the
column sums of a tall matrix), that kernel can't use the device: the CPU thread pool splits only output loops, a GPU
gives each output one work-item (or one workgroup with GROUP), and Mesa's llvmpipe stops a work-item's loops after
65535 iterations. This pass rewrites such a `REDUCE_AXIS(op, axes)` of `x` into

    x' = x with the reduced axes first, flattened to one axis of length R:   (R, *kept)
    partial = CONTIGUOUS(REDUCE_AXIS(op, 1)(x'[:P*C].reshape(P, C, *kept)))  (P, 1, *kept)   kernel 1: P*outputs loops
    out = REDUCE_AXIS(op, 0)(partial.reshape(P, *kept))  op  REDUCE_AXIS(op, 0)(x'[P*C:])     kernel 2
    out.reshape(the original reduce's shape)

Chunk p reduces the contiguous elements [p*C, (p+1)*C) of the flattened reduce axis, so kernel 1 reads memory in
order. C is rounded down to a multiple of up to 256 (so kernel 1 vectorizes, or GROUPs on a GPU); the few elements left
over (the tail, fewer than P*256 and never more than an eighth of R) are reduced in kernel 2 next to the partials, so
no padding with the reduce's identity and no masked loads are needed. The partials keep the reduce's dtype, which is
its accumulator's dtype (sums of half and small ints already cast up before the reduce), so the result rounds like
the one-kernel reduce up to summation order. Everything fused into the reduce's source (`(a*b).sum()`, `mean`, the
`exp` of a softmax's sum) is fused into kernel 1.

P, the number of chunks, comes from the device (`split_plan`): CPUs want P*outputs to be a few times the thread
count (a multiple of it, so the thread pool's static chunks are equal) and only split reduces big enough to pay for
the second kernel (CPU_MIN_WORK); GPU-style devices want a few hundred workgroups; a device with a loop limit (`loop_limit` on the
device: lavapipe) also gets chunks short enough for it, whatever the number of outputs. Reduces with many outputs are
left alone (a matmul is still one kernel), as are reduces of a symbolic length. `SPLIT_REDUCE` is the shortest reduce
that is split (default 32768; 0 turns the pass off). A split's own reduces have either enough outputs or a short loop,
so the rewrite stops; a stage 2 that is itself long (millions of chunks on a loop-limited device) is split again.
"""
from __future__ import annotations

from dataclasses import dataclass

from fusegrad.device import Device
from fusegrad.helpers import DEBUG, SPLIT_REDUCE, SPLIT_REDUCEOP, prod
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.shape import all_static

MAX_PARTS = 4096         # at most this many chunks per output
TAIL_MAX = 8192          # the chunk length is rounded down to a multiple of up to 256 while the tail stays below this
CPU_PARTS_PER_THREAD = 8  # CPU: split when outputs < threads * this; then P*outputs >= threads * this
GPU_PARTS = 256          # GPU-style: split when outputs < this; then P*outputs >= this (workgroups)
GPU_MIN_CHUNK = 1024     # GPU-style: chunks at least this long
# CPU: split only reduces of at least this many elements in all. The second kernel costs about 0.2 ms of Python
# scheduling per realize (outside TinyJit) and a thread-pool handoff; below ~1M floats (a ~0.15 ms loop on one core)
# the second core saves less than that
CPU_MIN_WORK = 1 << 20


@dataclass(frozen=True)
class SplitTarget:
    """What a device wants from a split (see split_plan)."""
    want: int               # split when a reduce has fewer outputs than this; then P*outputs >= this
    multiple: int = 1       # P is a multiple of this (CPU: the thread count)
    min_work: int = 0       # don't split when R*outputs is below this (CPU: CPU_MIN_WORK)
    min_chunk: int = 2      # chunks at least this long
    cache_bytes: int = 0    # with several outputs, a chunk's input fits in half of this (it is read once per output)
    loop_limit: int | None = None   # loop iterations one work-item may run (lavapipe): chunks of at most half of it


def device_target(device: str) -> SplitTarget | None:
    try: dev = Device[device]
    except Exception: return None   # noqa: BLE001 - a device that can't open has no kernels to split for
    r = dev.renderer
    limit = getattr(dev, "loop_limit", None)
    if r.has_local:
        # with GROUP each partial is a workgroup; without it (no shared memory, or a CPU OpenCL that turns GROUP off)
        # partials are work-items, packed local_max to a workgroup: ask for several workgroups
        grouped = r.has_shared and r.group_max_outputs >= GPU_PARTS
        want = GPU_PARTS if grouped else GPU_PARTS * max(min(r.local_max, 256) // 32, 1)
        return SplitTarget(want, min_chunk=GPU_MIN_CHUNK, loop_limit=limit)
    t = max(r.threads, 1)
    return SplitTarget(CPU_PARTS_PER_THREAD * t, t, max(r.min_thread_work, CPU_MIN_WORK) if t > 1 else 0, 2,
                       r.cache_bytes, limit)


def split_plan(red: UOp, tgt: SplitTarget | None = None) -> tuple[int, int] | None:
    """(P, C): reduce P chunks of C elements in a first kernel, or None to leave the reduce alone."""
    threshold = int(SPLIT_REDUCE.value)
    src = red.src[0]
    axes = red.arg[1]
    if threshold <= 0 or src.shape is None or red.shape is None or not all_static(src.shape): return None
    R, O = prod(src.shape[a] for a in axes), prod(red.shape)
    if R < max(threshold, 4) or O == 0: return None
    if tgt is None and (not isinstance(red.device, str) or (tgt := device_target(red.device)) is None): return None
    chunk_max = tgt.loop_limit // 2 if tgt.loop_limit else 0
    must = -(-R // chunk_max) if chunk_max and R > chunk_max else 0   # chunks the loop limit needs
    if not must and (O >= tgt.want or R * O < tgt.min_work): return None
    P = max(-(-tgt.want // O), must, 2)
    if O > 1 and tgt.cache_bytes:   # each output rereads the chunk (a column of a tall matrix): keep it in cache
        P = max(P, -(-R * O * red.dtype.itemsize // max(tgt.cache_bytes // 2, 1)))
    P = -(-P // tgt.multiple) * tgt.multiple
    if not must: P = min(P, R // tgt.min_chunk, MAX_PARTS)
    if P < 2: return None
    C = R // P
    for a in (256, 64, 16, 4):
        if C >= a and P * a <= min(TAIL_MAX, R // 8):
            C = C // a * a
            break
    return P, C


def split_reduce(red: UOp, P: int, C: int) -> UOp:
    """The two-stage form of `red` (see the module docstring). Its stage 2 and tail reduces are split again when
    they are long themselves (only on a loop-limited device, with millions of chunks)."""
    op, axes = red.arg
    src = red.src[0]
    assert src.shape is not None and red.shape is not None
    keep = [i for i in range(len(src.shape)) if i not in axes]
    ks = tuple(src.shape[i] for i in keep)
    R, main = prod(src.shape[a] for a in axes), P * C
    xp = build.permute(src, tuple(axes) + tuple(keep))
    x = build.reshape(xp, (R,) + ks) if main != R else xp   # without a tail: one reshape, straight to (P, C, *kept)
    body = x if main == R else build.shrink(x, ((0, main),) + tuple((0, s) for s in ks))
    part = build.reduce_axis(build.reshape(body, (P, C) + ks), op, (1,))
    part = UOp(Ops.CONTIGUOUS, red.dtype, (part,))
    out = _split_again(build.reduce_axis(build.reshape(part, (P,) + ks), op, (0,)))
    if main != R:
        tail = build.reduce_axis(build.shrink(x, ((main, R),) + tuple((0, s) for s in ks)), op, (0,))
        out = build.alu(op, out, _split_again(tail))
    return build.reshape(out, red.shape)


def _split_again(r: UOp) -> UOp:
    if r.op is not Ops.REDUCE_AXIS or (plan := split_plan(r)) is None: return r
    return split_reduce(r, *plan)


def split_reduces(sink: UOp, topo: list[UOp]) -> tuple[UOp, dict[UOp, UOp]]:
    """The pass: the graph with every long, few-output reduce split in two, and old node -> new node for every node
    that changed. `topo` is the graph's nodes, children first (the scheduler's walk); when no reduce is split (the
    common case) this only looks at the reduces."""
    if not SPLIT_REDUCE.value or not SPLIT_REDUCEOP.value: return sink, {}
    plans = {n: p for n in topo if n.op is Ops.REDUCE_AXIS and (p := split_plan(n)) is not None}
    if not plans: return sink, {}
    # rebuild bottom-up: a reduce inside another one's source (a variance's mean) is split before its consumer is
    memo: dict[UOp, UOp] = {}
    for n in topo:
        new_src = tuple(memo.get(s, s) for s in n.src)
        cur = n if all(a is b for a, b in zip(new_src, n.src)) else n.replace(src=new_src)
        if cur.op is Ops.REDUCE_AXIS:
            plan = plans.get(n) if cur is n else split_plan(cur)
            if plan is not None: cur = split_reduce(cur, *plan)
        if cur is not n: memo[n] = cur
    if DEBUG >= 3: print(f"scheduler: split {len(plans)} long reduce{'s' * (len(plans) > 1)} in two (split.py)")
    return memo.get(sink, sink), memo
