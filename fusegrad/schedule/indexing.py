"""Lower one kernel from the tensor graph: index propagation.

Starting from the loop indices of the kernel's output (one RANGE per axis), each tensor-level node is asked for "your
value at index (i0, i1, ...)". Movement ops rewrite the index (that is how views cost nothing), ALU ops ask their sources
at the same index, a REDUCE_AXIS opens fresh reduce RANGEs for its reduced axes, and realized nodes become LOADs. The
result is the kernel AST: SINK(STORE(INDEX(PARAM 0, flat index), value)).

While lowering, the indexer reports reduces that must not be fused (`violations`): a reduce that would be recomputed
inside another reduce's loop, at two different indices, or inside an output loop it doesn't depend on. The walk stops at
such a reduce (its value is a placeholder): the kernel is lowered again once the reduce has its own buffer, so nothing
below it is walked, and fresh reduce ranges can't multiply the walk (that made deep matmul chains exponential).

It also counts how often the kernel evaluates each fused node (`evals`), and with a `RecomputePolicy` reports a node
the kernel would recompute too often as a violation too (see recompute.py). The linearizer emits a node in the loop of the
deepest RANGE its index depends on, so a node at index `idx` runs once per iteration of the loop chain down to that
range: `(i, 0)` inside output loops `(i, j)` runs N times (hoisted out of `j`), an operand of a matmul's reduce runs
N*N*K times. The scheduler compares those counts with the node's size to find work recomputed across or within kernels.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Generator

from fusegrad.dtype import dtypes
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.symbolic import simplify
from fusegrad.ir.shape import all_static, smax, smul, sprod, strides_for, sym_eq
from fusegrad.schedule.recompute import RecomputePolicy
from fusegrad.schedule.reduce_order import order_reduce_loops

TRUE = UOp.const(dtypes.bool, True)
INDEX_MAX = 2**31 - 1
# The most ops one kernel fuses. A longer chain (100,000 lazy `x = x + 1`) is cut into kernels of this many ops: one
# kernel of them all would take a C compiler minutes, and the pieces of a uniform chain are one kernel compiled once.
# Far above what a model's fused kernels hold (a transformer block's fused backward: a few hundred).
MAX_KERNEL_OPS = 4096
# The most buffers one kernel reads: a kernel is a C function of one argument per buffer (ctypes takes at most
# 1,024; CUDA 4 KB of them). A kernel reaching it is cut at the innermost computing node being walked.
MAX_KERNEL_INPUTS = 128
Index = tuple[UOp, ...]


ZERO = UOp.const(dtypes.int32, 0)


# index math is pure (nodes are immutable), and the same views are indexed the same way in every kernel
@functools.lru_cache(maxsize=1 << 16)
def flat_index(idx: Index, shape: tuple[int, ...]) -> UOp:
    acc = ZERO
    for i, st, s in zip(idx, strides_for(shape), shape):
        if s != 1: acc = acc + i * st
    return simplify(acc)


@functools.lru_cache(maxsize=1 << 16)
def unflatten(flat: UOp, shape: tuple[int, ...]) -> Index:
    out = []
    for j, (st, s) in enumerate(zip(strides_for(shape), shape)):
        if s == 1: out.append(ZERO); continue
        e = flat // st if st != 1 else flat
        out.append(simplify(e % s if j != 0 else e))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 12)
def _kernel_const(x: UOp) -> UOp:
    # a symbolic constant (the value of a variable) reads the variable: an int argument of the kernel
    return x.arg.cast(x.dtype) if isinstance(x.arg, UOp) else UOp.const(x.dtype, x.arg)


def reshape_groups(shape: tuple[int, ...], src_shape: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """A reshape's axes matched in groups of equal size: (i0, i1, j0, j1) per group, shape[i0:i1] ~ src_shape[j0:j1].
    A group closes when its two products are (provably) equal; the side with the smaller (largest) product grows. With
    variables, what can't be matched becomes one last group, flattened whole: always correct, just more index math (a
    div/mod by a variable). Plain ints take the same walk with int arithmetic."""
    static = all_static(shape) and all_static(src_shape)
    eq, mul, big = (operator.eq, operator.mul, int) if static else (sym_eq, smul, smax)
    out = []
    i = j = 0
    while i < len(shape) or j < len(src_shape):
        i0, j0, pi, pj = i, j, 1, 1
        if i < len(shape): pi, i = shape[i], i + 1
        if j < len(src_shape): pj, j = src_shape[j], j + 1
        while not eq(pi, pj):
            if i < len(shape) and (j >= len(src_shape) or big(pi) <= big(pj)): pi, i = mul(pi, shape[i]), i + 1
            elif j < len(src_shape): pj, j = mul(pj, src_shape[j]), j + 1
            else: return out + [(i0, len(shape), j0, len(src_shape))]
        out.append((i0, i, j0, j))
    return out


@functools.lru_cache(maxsize=1 << 14)
def reshape_flat_size(shape: tuple[int, ...], src_shape: tuple[int, ...]) -> int:
    """The largest flat index a reshape's index math forms (0 when it only renames axes)."""
    if 0 in shape or 0 in src_shape: return 0
    return max((smax(sprod(shape[i0:i1])) for i0, i1, j0, j1 in reshape_groups(shape, src_shape)
                if shape[i0:i1] != src_shape[j0:j1]), default=0)


def reshape_index(idx: Index, shape: tuple[int, ...], src_shape: tuple[int, ...]) -> Index:
    """The source index of a reshape. Axes are matched in groups of equal size (a reshape that splits, merges or adds
    axes only touches its own group) and each group is flattened and unflattened on its own: much smaller index
    expressions than flattening the whole index, so much less work for the simplifier."""
    if 0 in shape or 0 in src_shape: return unflatten(flat_index(idx, shape), src_shape)
    out: list[UOp] = []
    for i0, i, j0, j in reshape_groups(shape, src_shape):
        if shape[i0:i] == src_shape[j0:j]: out.extend(idx[i0:i])
        else: out.extend(unflatten(flat_index(idx[i0:i], shape[i0:i]), src_shape[j0:j]))
    return tuple(out)


def check_index_range(kernels: dict[UOp, KernelBuild]) -> None:
    """Index math is 32-bit. Only flat indices can grow past a dimension's size: into buffers, into a kernel's output,
    and across a reshape (within the group of axes it splits or merges). Broadcasts, permutes, pads and reduces index
    per dimension, so a (512, 32, 400, 32, 25) product feeding a reduce is fine as long as those three stay below
    2**31; refuse rather than overflow. Checked once per schedule over every node some kernel computes or loads."""
    nodes: set[UOp] = set(kernels)
    for kb in kernels.values(): nodes |= kb.walked
    for n in nodes:
        if n.shape is None: continue
        if n.op is Ops.RESHAPE and n.src[0].shape is not None: big = reshape_flat_size(n.shape, n.src[0].shape)
        else: big = smax(n.size) if n.op is Ops.BUFFER or n in kernels else 0
        if big > INDEX_MAX:
            raise RuntimeError(f"tensor of shape {n.shape} has more than {INDEX_MAX} elements; "
                               "kernels index with 32-bit integers for now")


def range_leaves(idx: Index) -> set[UOp]:
    return {n for i in idx for n in i.toposort() if n.op is Ops.RANGE}


@dataclass
class KernelBuild:
    ast: UOp
    inputs: list[UOp]                       # tensor-level nodes loaded, in PARAM slot order (slot 0 is the output)
    tensor_ops: list[str] = field(default_factory=list)
    walked: set[UOp] = field(default_factory=set)       # tensor-level nodes computed inline (fused) by this kernel
    evals: dict[UOp, int] = field(default_factory=dict)  # fused non-movement node -> times the kernel evaluates it


class Indexer:
    def __init__(self, root: UOp, realize_points: set[UOp], policy: RecomputePolicy | None = None):
        self.root, self.rp, self.policy = root, realize_points, policy
        self.params: dict[UOp, UOp] = {}
        self.inputs: list[UOp] = []
        self.memo: dict[tuple[UOp, Index, UOp], UOp] = {}
        self.n_ranges = 0
        self.reduce_seen: dict[UOp, tuple[Index, UOp]] = {}
        self.violations: set[UOp] = set()
        self.ops_seen: dict[str, None] = {}
        # an ASSIGN writes into its target's buffer; loads of that buffer go through the output param (slot 0)
        self.alias = root.src[0].base if root.op is Ops.ASSIGN else None
        self.alias_reads: list[tuple[UOp, UOp]] = []
        self.walked: set[UOp] = set()
        self.evals: dict[UOp, int] = {}
        self.loop_vol: dict[UOp, int] = {}    # RANGE -> iterations of its loop chain (outer loops included)
        self.vol_memo: dict[UOp, int] = {}    # index expression -> loop_vol of the deepest RANGE it depends on
        self.live: dict[UOp, float] = {TRUE: 1.0}  # validity mask -> the fraction of elements it lets through (PAD)

    def new_range(self, size: int, kind: str) -> UOp:
        r = UOp.range(size, self.n_ranges, kind)
        self.n_ranges += 1
        return r

    def param(self, node: UOp) -> UOp:
        if node is self.alias: return self.out_param
        if node not in self.params:
            slot = len(self.params) + 1
            self.params[node] = UOp(Ops.PARAM, node.dtype.ptr(smax(node.size)), (), slot)  # symbolic: the largest
            self.inputs.append(node)
        return self.params[node]

    def build(self) -> KernelBuild:
        shape = self.root.shape
        assert shape is not None
        out_idx = tuple(self.new_range(s, "global") if s != 1 else ZERO for s in shape)
        self.global_order = [i for i in out_idx if i.op is Ops.RANGE]
        vol = 1
        for r in self.global_order:
            vol *= smax(r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0])
            self.loop_vol[r] = vol
        value_node = self.root.src[0] if self.root.op is Ops.CONTIGUOUS else \
            self.root.src[1] if self.root.op is Ops.ASSIGN else self.root
        out = self.out_param = UOp(Ops.PARAM, self.root.dtype.ptr(smax(sprod(shape))), (), 0)
        val = self.index(value_node, out_idx, TRUE)
        out_flat = flat_index(out_idx, shape)
        # in place is safe only if every element reads its own old value: otherwise compute the value first
        if any(f is not out_flat or v is not TRUE for f, v in self.alias_reads): self.violations.add(value_node)
        store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, self.root.dtype, (out, out_flat)), val))
        ast = UOp(Ops.SINK, dtypes.void, (store,))
        return KernelBuild(ast, self.inputs, list(self.ops_seen), self.walked, self.evals)

    def volume(self, exprs: Index) -> int:
        """How many times a value indexed by `exprs` is computed: the iterations of the loop chain down to the deepest
        RANGE the expressions use (1 when they use none)."""
        best = 1
        for e in exprs:
            if (v := self.vol_memo.get(e)) is None:
                for n in e.toposort():
                    if n in self.vol_memo: continue
                    self.vol_memo[n] = self.loop_vol.get(n, 1) if n.op is Ops.RANGE else \
                        max((self.vol_memo[s] for s in n.src), default=1)
                v = self.vol_memo[e]
            best = max(best, v)
        return best

    def index(self, x: UOp, idx: Index, valid: UOp) -> UOp:
        """x's value at `idx` (masked by `valid`). The walk is iterative: each node that needs its sources' values is
        a generator that yields (node, idx, valid) requests and gets their values sent back; this loop keeps the
        frames on a list instead of Python's stack, so a fused chain of 100,000 ops lowers like a short one. Sources
        are visited in the same order as a recursive walk would, so PARAM slots and RANGE ids are unchanged."""
        ret = self._enter(x, idx, valid)
        if ret.__class__ is UOp: return ret   # type: ignore[return-value]
        stack: list = [ret]
        val: UOp | None = None
        while True:
            gen, key = stack[-1]
            try: req = gen.send(val)
            except StopIteration as stop:
                stack.pop()
                val = self.memo[key] = stop.value
                if not stack: return val
                continue
            nxt = self._enter(*req)
            if nxt.__class__ is UOp:
                val = nxt   # type: ignore[assignment]
                if len(self.params) == MAX_KERNEL_INPUTS and not self.violations: self._cut_inputs(stack)
            else:
                stack.append(nxt)
                val = None

    def _cut_inputs(self, stack: list) -> None:
        """The kernel reads MAX_KERNEL_INPUTS buffers (a cat of 1,000 tensors): the innermost computing node being
        walked gets a buffer of its own, so this kernel and that one each read fewer."""
        for _, (x, _, _) in reversed(stack):
            if x is self.root: return
            if x.op not in GroupOp.Movement and x.op not in (Ops.DETACH, Ops.CONTIGUOUS, Ops.REDUCE_AXIS):
                self.violations.add(x)
                return

    def _enter(self, x: UOp, idx: Index, valid: UOp) -> "UOp | tuple":
        """x's value at idx when it needs no source's value (memoized, a load, a constant); otherwise (a generator
        computing it, its memo key) for `index` to run."""
        key = (x, idx, valid)
        if (ret := self.memo.get(key)) is not None: return ret
        op = x.op
        if x not in self.rp or x is self.root:
            self.walked.add(x)
            # pass-through nodes are not counted: realizing a DETACH over a PAD would store the padded tensor (its
            # zeros computed by the producer kernel); the node under the movement ops is the one worth a buffer
            if op not in GroupOp.Movement and op not in (Ops.BUFFER, Ops.CONST, Ops.DETACH, Ops.CONTIGUOUS):
                ev = self.evals[x] = self.evals.get(x, 0) + int(self.volume(idx + (valid,)) * self.live.get(valid, 1.0))
                # recomputed so often in this kernel that it is worth a buffer: report it, don't walk below it again
                # or the kernel is already as big as a kernel gets (MAX_KERNEL_OPS): a longer chain is cut here
                if x is not self.root and op is not Ops.REDUCE_AXIS and (len(self.evals) > MAX_KERNEL_OPS or
                   self.policy is not None and self.policy.worth_realizing(x, ev)):
                    self.violations.add(x)
                    return UOp.const(x.dtype, 0)
        if op is Ops.BUFFER: ret = self._load(x, idx[0], valid)
        elif x in self.rp and x is not self.root:
            assert x.shape is not None
            ret = self._load(x, flat_index(idx, x.shape), valid)
        else:
            self.ops_seen[op.name if op is not Ops.REDUCE_AXIS else f"REDUCE_AXIS({x.arg[0].name})"] = None
            if op is Ops.CONST: ret = _kernel_const(x)
            elif op is Ops.IOTA: ret = idx[0].cast(x.dtype)
            else: return self._compute(x, idx, valid), key
        self.memo[key] = ret
        return ret

    def _compute(self, x: UOp, idx: Index, valid: UOp) -> Generator:
        op = x.op
        if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
            srcs = []
            for s in x.src: srcs.append((yield s, idx, valid))
            return UOp(op, x.dtype, tuple(srcs), None)
        if op in (Ops.DETACH, Ops.CONTIGUOUS): return (yield x.src[0], idx, valid)
        if op in GroupOp.Movement: return (yield from self._movement(x, idx, valid))
        if op is Ops.REDUCE_AXIS: return (yield from self._reduce(x, idx, valid))
        if op is Ops.GATHER: return (yield from self._gather(x, idx, valid))
        raise RuntimeError(f"can't lower {op} inside a kernel")

    def _load(self, node: UOp, flat: UOp, valid: UOp) -> UOp:
        if node is self.alias: self.alias_reads.append((flat, valid))
        p = self.param(node)
        srcs = (p, flat) if valid is TRUE else (p, flat, valid)
        return UOp(Ops.LOAD, node.dtype, (UOp(Ops.INDEX, node.dtype, srcs),))

    def _movement(self, x: UOp, idx: Index, valid: UOp) -> Generator:
        src = x.src[0]
        ss, arg = src.shape, x.arg
        assert ss is not None and x.shape is not None
        zero = ZERO
        if x.op is Ops.RESHAPE:
            new = reshape_index(idx, x.shape, ss)
        elif x.op is Ops.PERMUTE:
            new_l = [zero] * len(ss)
            for i, a in enumerate(arg): new_l[a] = idx[i]
            new = tuple(new_l)
        elif x.op is Ops.EXPAND:
            new = tuple(zero if s == 1 else i for i, s in zip(idx, ss))
        elif x.op is Ops.SHRINK:
            new = tuple(simplify(i + b) if b else i for i, (b, _) in zip(idx, arg))
        elif x.op is Ops.FLIP:
            new = tuple(simplify((s - 1) - i) if f else i for i, s, f in zip(idx, ss, arg))
        else:  # PAD: outside the source's extent the value is 0 and its loads are masked off
            conds = []
            new_l = []
            for ix, s, (b, _) in zip(idx, ss, arg):
                j = simplify(ix - b) if b else ix
                new_l.append(j)
                conds += [UOp.const(dtypes.int32, -1).lt(j), j.lt(s)]
            new = tuple(new_l)
            in_range = TRUE
            for c in conds: in_range = in_range.logical_and(c)
            in_range = simplify(in_range)
            if in_range is TRUE: return (yield src, new, valid)
            inner_valid = simplify(valid.logical_and(in_range))
            # masked-off elements are not counted as work (a concatenation pads every piece to the full extent)
            frac = smax(sprod(ss)) / max(smax(sprod(x.shape)), 1)
            self.live.setdefault(inner_valid, self.live.get(valid, 1.0) * frac)
            inner = (yield src, new, inner_valid)
            return UOp(Ops.WHERE, x.dtype, (in_range, inner, UOp.const(x.dtype, 0)))
        return (yield src, new, valid)

    def _gather(self, x: UOp, idx: Index, valid: UOp) -> Generator:
        """x at idx with idx[axis] replaced by the *value* of the index tensor there (a data-dependent load)."""
        src, ind, ax = x.src[0], x.src[1], x.arg
        assert src.shape is not None
        raw = (yield ind, idx, valid)
        # range-check at the index's own width: narrowed first, 2**32 + 1 would read element 1
        n = src.shape[ax]
        hi = raw.lt(UOp.const(raw.dtype, n) if isinstance(n, int) else n.cast(raw.dtype) if n.dtype != raw.dtype else n)
        in_range = simplify(hi if dtypes.is_unsigned(raw.dtype) else UOp.const(raw.dtype, -1).lt(raw).logical_and(hi))
        v = raw.cast(dtypes.int32) if raw.dtype != dtypes.int32 else raw
        new = list(idx)
        new[ax] = v
        inner = (yield src, tuple(new), simplify(valid.logical_and(in_range)))
        return UOp(Ops.WHERE, x.dtype, (in_range, inner, UOp.const(x.dtype, 0)))

    def _reduce(self, x: UOp, idx: Index, valid: UOp) -> Generator:
        op, axes = x.arg
        src = x.src[0]
        assert src.shape is not None
        leaves = range_leaves(idx + (valid,))
        # fusing is only safe when this reduce runs once per iteration of an outer prefix of the output loops
        if any(r.arg[1] != "global" for r in leaves) or \
           leaves != set(self.global_order[:len(leaves)]) or \
           (x in self.reduce_seen and self.reduce_seen[x] != (idx, valid)):
            # it gets a buffer and this kernel is lowered again: don't walk below it now
            self.violations.add(x)
            return UOp.const(x.dtype, 0)
        self.reduce_seen[x] = (idx, valid)
        new = list(idx)
        rngs = []
        vol = self.volume(idx + (valid,))   # a reduce's loops nest under the deepest loop its index uses
        for a in axes:
            r = self.new_range(src.shape[a], "reduce")
            vol *= smax(src.shape[a])
            self.loop_vol[r] = vol
            rngs.append(r)
            new[a] = r
        inner = (yield src, tuple(new), valid)
        return UOp(Ops.REDUCE, x.dtype, (inner, *rngs), op)


def lower_kernel(root: UOp, realize_points: set[UOp], policy: RecomputePolicy | None = None) \
        -> tuple[KernelBuild, set[UOp]]:
    """The kernel AST computing `root`, plus the nodes that must be realized first (empty when fusion is fine): unsafe
    reduces, and with a `policy`, nodes this kernel alone would recompute too often."""
    ix = Indexer(root, realize_points, policy)
    kb = ix.build()
    if not ix.violations: kb.ast = order_reduce_loops(kb.ast)
    return kb, ix.violations
