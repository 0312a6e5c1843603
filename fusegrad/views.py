"""Views and writes in the frontend: which tensors share a base tensor's memory, how a write through a view becomes a
write of its base, and how tensors that still read memory about to be overwritten keep their values (a snapshot copy
scheduled before the write). docs/tensor/mutation.md states the rules; storage.py keeps the buffers and the cache.
"""
from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, Sequence

from fusegrad import storage
from fusegrad.dtype import dtypes
from fusegrad.helpers import prod
from fusegrad.ir import build
from fusegrad.ir.ops import Ops, UOp, live_assigns
from fusegrad.ir.shape import ssub, sym_eq
from fusegrad.device import Device
from fusegrad.runtime.ops_disk import disk_region, is_disk, region_of
from fusegrad.storage import is_realized, lazy_of, realized, unique_ids

if TYPE_CHECKING:
    from fusegrad.tensor import Tensor

# a pending ASSIGN -> the tensor it was made for (which takes the buffer once the write ran)
assign_owner: "weakref.WeakKeyDictionary[UOp, weakref.ref[Tensor]]" = weakref.WeakKeyDictionary()


VIEW_OPS = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.FLIP, Ops.BITCAST, Ops.DETACH}


def mark_view(t: Tensor, src: Tensor) -> None:
    """Record that `t` (whose node is view ops over src's node) is a view of src's base."""
    if src._view is not None and view_chain(src.uop, src._view[1]) is not None: base, b0 = src._view
    else: base, b0 = src, src.uop
    t._view = (base, b0)
    views = base._views
    if views is None: views = base._views = ViewRefs()
    views.append(weakref.ref(t))
    if len(views) > views.limit: views.prune()


class ViewRefs(list):
    """A base tensor's views, as weak references without callbacks (a WeakValueDictionary entry costs a Python-level
    keyed reference and a removal callback per view, and nearly every op makes a view). Dead references are dropped
    when the list has doubled since the last pruning, and skipped when the views are read."""
    __slots__ = ("limit",)

    def __init__(self) -> None:
        super().__init__()
        self.limit = 16

    def prune(self) -> None:
        self[:] = [r for r in self if r() is not None]
        self.limit = max(16, 2 * len(self))

    def live(self) -> list[Tensor]:
        """The live views, each once, oldest first."""
        out, seen = [], set()
        for r in self:
            if (v := r()) is not None and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out


def view_chain(u: UOp, b0: UOp) -> list[UOp] | None:
    """The view ops from `u` down to `b0`, outermost first (None when u is not a view of b0)."""
    ops = []
    while u is not b0:
        if (u.op not in VIEW_OPS and u.op is not Ops.PAD) or not u.src: return None
        ops.append(u)
        u = u.src[0]
    return ops


def refresh_views(base: Tensor, realized_now: bool = False) -> None:
    """After `base` got a new node (a write, a realize), its views are rebuilt on it, so they read the new value.
    After a realize (same value, now in a buffer) a view with autograd history keeps its lazy graph for backward."""
    if not base._views: return
    for v in base._views.live():
        if v._view is None or v._view[0] is not base: continue
        b0 = v._view[1]
        if b0 is base.uop: continue
        chain = view_chain(v.uop, b0)
        if chain is None:   # the view was given another value (realized into its own memory): it no longer aliases
            v._view = None
            continue
        out = base.uop
        for op in reversed(chain): out = op.replace(src=(out,) + op.src[1:])
        # (a view that is its whole base, w[0:n], is the base's own node: the base's history, not one of its own)
        if realized_now and v._derived and out not in lazy_of and out is not base.uop:
            storage.record_history(out, lazy_of.get(v.uop, v.uop))
        v.uop, v._view = out, (base, base.uop)


def _overlaps(chain: list[UOp], b0: UOp) -> bool:
    """Whether two elements of the view `chain` (outermost first) over `b0` are the same memory location (an expanded
    axis it selects more than one element of). Decided on the positions themselves: the chain applied to an iota."""
    assert b0.shape is not None
    n = prod(b0.shape)
    iota = UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, arg=b0.device),), n)
    pos = build.reshape(build.alu(Ops.ADD, iota, build.const(1, dtypes.int32, b0.device, (n,))), b0.shape)
    for op in reversed(chain):
        pos = op.replace(dtype=dtypes.int32, src=(pos,) + op.src[1:]) if op.op is not Ops.BITCAST else pos
    vals = storage.tensor_class(UOp(Ops.CONTIGUOUS, dtypes.int32, (pos,))).tolist()
    flat = vals if isinstance(vals, list) else [vals]
    while flat and isinstance(flat[0], list): flat = [x for row in flat for x in row]
    flat = [x for x in flat if x]   # 0: padding (a strided slice's), not memory
    return len(set(flat)) != len(flat)


def write_through(chain: list[UOp], val: UOp, b0: UOp, what: tuple[int, ...]) -> UOp:
    """The base's new value after writing `val` through the view `chain` (outermost first) over base node `b0`: each
    view op is undone on (value, written-mask), and the base keeps its old value where the mask is False."""
    mask = build.const(True, dtypes.bool, val.device, val.shape)
    for op in chain:
        src = op.src[0]
        ss = src.shape
        assert ss is not None and op.shape is not None
        if op.op is Ops.RESHAPE: val, mask = build.reshape(val, ss), build.reshape(mask, ss)
        elif op.op is Ops.PERMUTE:
            inv = build.inverse_permute(op.arg)
            val, mask = build.permute(val, inv), build.permute(mask, inv)
        elif op.op is Ops.SHRINK:
            pads = [(b, ssub(s, e)) for (b, e), s in zip(op.arg, ss)]
            val, mask = build.pad(val, pads), build.pad(mask, pads)
        elif op.op is Ops.PAD:
            keep = [(b, b + s) for (b, _), s in zip(op.arg, ss)]
            val, mask = build.shrink(val, keep), build.shrink(mask, keep)
        elif op.op is Ops.FLIP: val, mask = build.flip(val, op.arg), build.flip(mask, op.arg)
        elif op.op is Ops.EXPAND:
            if any(not sym_eq(a, b) for a, b in zip(ss, op.shape)) and _overlaps(chain, b0):
                raise RuntimeError(f"unsupported operation: the view of shape {what} is expanded from {ss}, so more "
                                   "than one of its elements refers to a single memory location; clone() it before "
                                   "writing to it")
            # each written element maps to its own source element: sum the (bits of the) values back over the
            # expanded axes, where every other element contributes 0
            axes = tuple(i for i, (a, b) in enumerate(zip(ss, op.shape)) if not sym_eq(a, b))
            ut = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[val.dtype.itemsize]
            bits = build.cast(val, ut) if val.dtype == dtypes.bool else UOp(Ops.BITCAST, ut, (val,))
            bits = build.alu(Ops.WHERE, mask, bits, build.const(0, ut, val.device, op.shape))
            bits = build.reshape(build.reduce_axis(bits, Ops.ADD, axes), ss)
            val = build.cast(bits, dtypes.bool) if val.dtype == dtypes.bool else UOp(Ops.BITCAST, val.dtype, (bits,))
            hits = build.reduce_axis(build.cast(mask, dtypes.int32), Ops.ADD, axes)
            mask = build.alu(Ops.CMPLT, build.const(0, dtypes.int32, val.device, ss), build.reshape(hits, ss))
        elif op.op is Ops.BITCAST: val = UOp(Ops.BITCAST, src.dtype, (val,))
    return build.alu(Ops.WHERE, mask, val, b0)


def view_bases(todo: Sequence[Tensor]) -> list[Tensor]:
    """Realizing a view realizes its base (the view stays a view of the base's memory)."""
    out = []
    for t in todo:
        if t._view is not None and view_chain(t.uop, t._view[1]) is not None:
            if not is_realized(t._view[0].uop): out.append(t._view[0])
        else: out.append(t)
    return out


def preserve_old_values(todo: Sequence[Tensor], readers: list[Tensor]) -> list[UOp]:
    """Before memory is overwritten by an ASSIGN in `todo`, every live tensor that reads its current contents (a lazy
    tensor built before the write, one sharing the memory without being a view of it, or a graph in `todo` that reads
    it outside the ASSIGN itself) is pointed at a snapshot of them: a copy scheduled before the write. Views are left
    alone (they see the write). Returns the snapshot nodes, to be realized with `todo`; the tensors pointed at them
    are appended to `readers`."""
    # what the scheduler reads instead of computing a node: the result cache, but while TinyJit captures only identities
    # (storage.derived_off): a snapshot of a derived value cached before the capture would make the capture copy that
    # old buffer on every replay
    done = storage.cached_value if storage.derived_off else realized.get
    # no write pending anywhere (every ASSIGN alive has run): nothing to look for in the graphs
    if all(n in realized for n in list(live_assigns)): return []
    # the writes still to run (an ASSIGN computed before is just its buffer now)
    in_todo: dict[UOp, Any] = {}   # every node the graphs being realized compute -> its place in walk order
    for t in todo: in_todo.update(t.uop.toposort(gate=lambda x: done(x) is None and x not in in_todo))
    for i, n in enumerate(in_todo): in_todo[n] = i
    overwritten = {n.src[0].base for n in in_todo if n.op is Ops.ASSIGN and done(n) is None}
    if not overwritten: return []
    whole: list[UOp] = []   # readers' own nodes, realized whole (below)
    snaps: dict[UOp, UOp] = {}
    # node -> whether its value reads overwritten contents; one walk shared by every tensor (graphs overlap a lot: the
    # gradients of one model all contain its forward graph)
    reach: dict[UOp, bool] = {}

    mems = {storage.memory_of(storage.buffers[b]) for o in overwritten
            if (b := storage.target_buffer(o)) in storage.buffers}

    def is_old(n: UOp) -> bool:
        # an overwritten version, a node computed earlier into overwritten memory, or one computed earlier *from* it
        # (directly: a read through an ASSIGN is of the version it wrote, storage.cache_result): the write drops that
        # cached result (storage.written), and a tensor still holding the lazy node (another
        # tensor built the same node: nodes are hash-consed) would compute it again from the new contents
        r = done(n)
        return n in overwritten or (r is not None and (r.base in overwritten or any(
            storage.memory_of(b) in mems for b in storage.buffers_read(n, past_assigns=False))))

    def reads_old(u: UOp) -> bool:
        # an ASSIGN's own reads are part of the write; below a computed node is only how it was computed
        stop = lambda x: x.op is Ops.ASSIGN or done(x) is not None   # noqa: E731
        for n in u.toposort(gate=lambda x: x not in reach and not stop(x)):
            if n in reach: continue
            reach[n] = is_old(n) or (not stop(n) and any(reach[x] for x in n.src))
        return reach[u]

    def snapshot(n: UOp) -> UOp:
        if n not in snaps:
            r = done(n)
            snaps[n] = UOp(Ops.CONTIGUOUS, n.dtype, (r if r is not None else n,), next(unique_ids))
        return snaps[n]

    for t in list(storage.live_tensors):
        u = t.uop
        if t._view is not None and view_chain(u, t._view[1]) is not None: continue   # a view sees the write
        if u.op is Ops.ASSIGN:
            # the write itself reads its own target in place; a value that reads another version this schedule
            # overwrites first (w += 1 then w.assign(a value built before)) reads a snapshot
            # (reads of other memory that this schedule overwrites are ordered before those writes instead)
            own, val = u.src[0].base, u.src[1]
            if not reads_old(val): continue
            mem = storage.target_buffer(own)
            mapping = {n: snapshot(n) for n in val.toposort(gate=lambda x: reach.get(x, False) and not is_old(x))
                       if reach.get(n, False) and is_old(n) and n is not own and storage.target_buffer(
                           done(n) or n) is mem}
            if not mapping: continue
            t.uop = UOp(Ops.ASSIGN, u.dtype, (u.src[0], substitute_outside_assigns(val, mapping, done)), u.arg)
            if (ref := assign_owner.pop(u, None)) is not None: assign_owner[t.uop] = ref
            refresh_views(t)
            continue
        if not reads_old(u): continue
        # (a gradient nobody asked for is dropped instead; refs: minus the list, this loop's `t` and the argument `t`
        # already on the stack)
        if storage.drop_unrequested(t, sys.getrefcount(t) - 3): continue
        if u in in_todo and done(u) is None and not is_old(u.base):
            # a node the graphs being realized compute anyway (an activation that a custom backward's closure holds,
            # such as batchnorm's input during the optimizer step): realized with them, as one more target, instead
            # of being pointed at copies of the old memory, which made it a second graph computing the same values
            # again (a train step's forward convolutions ran twice); its views are rebuilt on the result afterwards
            whole.append(u)
            readers.append(t)
            continue
        mapping = {n: snapshot(n) for n in u.toposort(gate=lambda x: reach.get(x, False) and not is_old(x))
                   if reach.get(n, False) and is_old(n)}
        t.uop = substitute_outside_assigns(u, mapping, done)
        refresh_views(t)   # its views (`x.sum(1)` is a reshape of a reduce) read the snapshot too
        readers.append(t)
    # in an order that depends on the graphs, not on where the live tensors happen to sit in memory (the order of
    # storage.live_tensors): the targets are part of the schedule cache's key, and every eager train step missed it
    def rank(n: UOp) -> tuple:
        if n in in_todo: return (0, in_todo[n], ())
        return (1, n.op.value, (n.arg if n.op is Ops.BUFFER else (), str(n.shape)))
    return [snaps[n] for n in sorted(snaps, key=rank)] + sorted(dict.fromkeys(whole), key=rank)


def substitute_outside_assigns(root: UOp, mapping: dict[UOp, UOp], done: Any = None) -> UOp:
    """substitute(), leaving ASSIGN nodes (their target and value) and computed nodes (`done`, the result cache's get
    by default) as they are."""
    if done is None: done = realized.get
    memo: dict[UOp, UOp] = {}
    for n in root.toposort(gate=lambda x: x.op is not Ops.ASSIGN and x not in mapping and done(x) is None):
        if n in mapping: memo[n] = mapping[n]
        elif n.op is Ops.ASSIGN or done(n) is not None: memo[n] = n
        else:
            src = tuple(memo[x] for x in n.src)
            memo[n] = n if all(a is b for a, b in zip(src, n.src)) else n.replace(src=src)
    return memo[root]


def sole_holder(t: "Tensor") -> None:
    """Before `t`'s memory is shared outside fusegrad (DLPack), where writes can't be seen: every other live tensor
    holding the same memory without being a view of `t` (the same result served to two tensors) gets a copy of its
    own, so a write from outside reaches `t` and its views only. `t` then owns the memory."""
    mem = storage.held_memory(t.uop)
    if mem is None: return
    others = []
    for o in storage.live_tensors:
        if o is t or storage.held_memory(o.uop) is not mem: continue
        if o._view is not None and view_chain(o.uop, o._view[1]) is not None: continue   # follows its base
        others.append(o)
    for o in others:
        o.uop = o.clone().realize().uop
        storage.claim(o)
        refresh_views(o)
    storage.claim(t)


def adopt(target: "Tensor", source: "Tensor", taken: set[int]) -> bool:
    """Point `target` at `source`'s computed memory instead of copying it in (load_state_dict's fast path), when that
    is the same as the copy: `target` is a fresh, still uncomputed tensor (a layer's lazy initial weights) and is
    neither a view nor viewed, and `source` is computed, same shape, dtype and device, and not given to
    another target in this load (`taken`, ids of nodes: two parameters sharing one node would share one gradient).
    The memory stays `source`'s while `source` is alive: a write to `target` then goes to memory of its own
    (storage.owns), so the two never see each other's writes. Returns whether it adopted."""
    u, v = target.uop, source.uop
    while v.op is Ops.DETACH and v.arg is None: v = v.src[0]   # (a plain detach: the same values)
    if target.shape != source.shape or target.dtype != source.dtype or target.device != source.device: return False
    if not isinstance(target.device, str) or is_disk(target.device) or not is_realized(v) or id(v) in taken:
        return False
    if is_realized(u) or u.op is Ops.ASSIGN or target._view is not None or target._views: return False
    # (its graph may read memory, a random init reads the generator's state; a write it goes through stays pending
    # on the tensor that owns it, so dropping this read changes nothing else)
    taken.add(id(v))
    target.uop = v
    return True


# ----- writing into part of a DISK tensor (a file: runtime/ops_disk.py) -----

def realize_readers(mems: set[int]) -> None:
    """Realize the live lazy tensors that read memory in `mems` (storage.memory_of: what a TinyJit replay or a write
    into a file is about to overwrite, where no schedule orders the reads first), so they keep the value they were built
    with, as a realize's write leaves them (preserve_old_values). Views of that memory are left alone: they see the
    write. One pass over the live tensors: the common realized ones cost one test."""
    if not mems: return
    lazy = []
    buffer, reshape = Ops.BUFFER, Ops.RESHAPE   # (bound once: a model has hundreds of live tensors, and TinyJit
    for t in storage.live_tensors:              # replays of an LLM's decode step ask this on every token)
        u = t.uop
        # a tensor whose node is the one found to be a plain buffer view before is one still (nodes are immutable):
        # no read of the node. (Right after an LLM's kernels streamed their weights through the caches, each node and
        # source read was a cache miss: the walk over ~775 tensors took 0.5-0.6 ms a decode step, 0.1 ms warm)
        if u is t._settled: continue
        if (op := u.op) is buffer or (op is reshape and u.src[0].op is buffer):
            t._settled = u
            continue
        if is_realized(u) or (t._view is not None and view_chain(u, t._view[1]) is not None): continue
        if any(storage.memory_of(b) in mems for b in storage.buffers_read(u)):
            # (a gradient nobody asked for is dropped instead: storage.drop_unrequested; refs: minus the iterated
            # list, this loop's `t` and the argument `t` already on the stack)
            if not storage.drop_unrequested(t, sys.getrefcount(t) - 3): lazy.append(t)
    if lazy: lazy[0].realize(*lazy[1:])


def disk_assign(target: "Tensor", x: Any) -> "Tensor":
    """`target.assign(x)` for a DISK tensor: x is computed on its device and its bytes written into the file range
    `target` views (one contiguous range: a slice of whole rows, a reshape). Cached reads of the file are dropped."""
    if not isinstance(x, type(target)): x = type(target)(x, dtype=target.dtype)
    if x.shape != target.shape: x = x.expand(target.shape) if x.ndim <= target.ndim else x
    if x.shape != target.shape: raise RuntimeError(f"assign shape mismatch {x.shape} != {target.shape}")
    if (r := disk_region(target.uop)) is None:
        raise RuntimeError(f"assign into {target.device}: the target must be one contiguous byte range of the file "
                           "(a slice of whole rows, a reshape), not a strided view")
    buf, offset, _ = r
    src = x.cast(target.dtype)
    if is_disk(src.device): src = src.to(Device.DEFAULT)
    data = src.contiguous()._buffer().as_bytes()
    realize_readers({storage.memory_of(buf)})   # lazy reads of the file keep their bytes
    region = region_of(buf)
    region.device.write(region.offset + offset, memoryview(data))
    storage.written(buf)
    return target
