"""Buffer identity: which device memory a BUFFER node names, which lazy nodes were computed into which buffer, and what
an in-place write invalidates. The Tensor frontend, the scheduler, the engine and TinyJit all read and write this one
registry, so "which memory does this graph read, and is a cached result still valid" has one answer.

A BUFFER node names a piece of memory and stands for its *current* contents. The result cache (`realized`) maps a lazy
node to the node of the buffer holding its value; every entry remembers the buffers its value was computed from, and
`written(buffer)` (called after every in-place write: a realize that ran an ASSIGN, a TinyJit replay) drops the
entries that read or hold that buffer, so no later graph is ever served a value computed from older contents.

Every cache and capture follows one rule, stated in docs/architecture.md ("Caches and captures: one rule"): write
versions per memory (`written`, `read_versions`, `still_valid`), nothing cached from memory written outside fusegrad,
fresh buffers never shared by value (`claim`/`owns`), no derived value captured by TinyJit (`derived_off`).
"""
from __future__ import annotations

import os
import weakref
from typing import Any

from fusegrad.device import Buffer
from fusegrad.helpers import REFERENCE
from fusegrad.ir import build
from fusegrad.ir.ops import GroupOp, Ops, UOp
from fusegrad.ir.pattern import substitute
from fusegrad.ir.shape import all_static, sprod
from fusegrad.runtime import ops_disk

_buffer_ids = iter(range(1, 1 << 62))
# BUFFER node -> its device memory; an entry lives as long as some graph references the node
buffers: "weakref.WeakKeyDictionary[UOp, Buffer]" = weakref.WeakKeyDictionary()
class ResultCache:
    """lazy node -> the node of the buffer holding its value. Both sides are weak: an entry lives while the lazy node
    is in some graph and its result is held by some tensor. (A strong value would make a cycle with `lazy_of`, which
    maps the result back to the lazy graph: every realized tensor with autograd history, and every buffer its graph
    read, would be kept forever.) A value that is no buffer (a constant) is held strongly: it owns no memory."""

    def __init__(self) -> None:
        self._d: "weakref.WeakKeyDictionary[UOp, Any]" = weakref.WeakKeyDictionary()
        # the dict under it (keyed by weak references to the nodes): a lookup per node of every graph realized reads
        # it directly, one Python call less than WeakKeyDictionary.get
        self._data: dict[Any, Any] = self._d.data  # type: ignore[attr-defined]

    def get(self, key: UOp, default: Any = None) -> Any:
        v = self._data.get(weakref.ref(key))
        if v is None: return default
        if isinstance(v, weakref.ref):
            if (v := v()) is None: return default
        return v

    def __contains__(self, key: UOp) -> bool: return self.get(key) is not None
    def __getitem__(self, key: UOp) -> UOp:
        if (v := self.get(key)) is None: raise KeyError(key)
        return v
    def __setitem__(self, key: UOp, value: UOp) -> None:
        # a multi-device result (MULTI of buffers) owns memory too: held weakly like a buffer
        self._d[key] = weakref.ref(value) if value.base.op in (Ops.BUFFER, Ops.MULTI) else value
    def hold(self, key: UOp) -> None:
        """Keep `key`'s result for as long as the node lives, though no tensor holds it: a unique node's value (a
        parameter's lazy initial value) computed inside another graph, while a pending write of the parameter still
        reads it. (No cycle: the result's node doesn't lead back to the key.)"""
        if (v := self.get(key)) is not None: self._d[key] = v

    def pop(self, key: UOp, default: Any = None) -> Any:
        v = self.get(key, default)
        self._d.pop(key, None)
        return v
    def __len__(self) -> int: return len(self._d)


# a lazy node that was computed -> the node of its buffer, so no graph computes it twice
realized = ResultCache()
# the lazy graph a realized tensor with autograd history was computed from (for backward through realize)
lazy_of: "weakref.WeakKeyDictionary[UOp, UOp]" = weakref.WeakKeyDictionary()
# lazy_of's key -> the write count of each memory its lazy graph read, when it was computed
_history_versions: "weakref.WeakKeyDictionary[UOp, Reads]" = weakref.WeakKeyDictionary()
# realized buffer of a leaf -> the unique node graphs built before the realize refer to (gradients still reach it)
leaf_of: "weakref.WeakKeyDictionary[UOp, UOp]" = weakref.WeakKeyDictionary()
# id(memory) -> the cached results (weak refs to `realized` keys) that read or hold that memory
_cache_deps: dict[int, list["weakref.ref[UOp]"]] = {}
# id(memory) -> how many in-place writes it has had (a Tensor can check that a view's memory is unchanged)
_versions: dict[int, int] = {}


class LiveTensors:
    """A weak set of the frontend's tensors (which of them hold which memory is asked of it now and then).
    weakref.WeakSet's add is a Python call per tensor made; here it is a C-level reference whose callback (the set's
    own discard) drops it. A reference hashes as its tensor (by id), so two live tensors never collide and their
    elementwise `==` never runs."""
    def __init__(self) -> None:
        self.refs: set[weakref.ref[Any]] = set()
        self._discard = self.refs.discard

    def add(self, t: Any) -> None: self.refs.add(weakref.ref(t, self._discard))

    def __iter__(self) -> Any: return iter([t for r in list(self.refs) if (t := r()) is not None])


live_tensors = LiveTensors()
# the frontend's Tensor class, registered by tensor.py as it is defined (`register_tensor_class`): the modules below the
# frontend that make or realize tensors (views, sharding, dlpack, TinyJit) reach it here instead of importing tensor.py
tensor_class: Any = None
# tags for CONTIGUOUS nodes that hash-consing must not share (a trainable leaf, a clone, a snapshot before a write)
unique_ids = iter(range(1, 1 << 62))


def register_tensor_class(cls: type) -> None:
    global tensor_class
    tensor_class = cls


def buffer_uop(buf: Buffer) -> UOp:
    """A new BUFFER node backed by `buf`."""
    u = UOp(Ops.BUFFER, buf.dtype, (UOp(Ops.DEVICE, arg=buf.device),), (next(_buffer_ids), buf.size))
    buffers[u] = buf
    return u


def buffer_view(bu: UOp, shape: tuple[Any, ...]) -> UOp:
    """A BUFFER node seen as `shape`. A symbolic shape is a prefix of a buffer allocated at the shape's largest size:
    SHRINK to the (symbolic) element count, then RESHAPE."""
    if all_static(shape): return build.reshape(bu, shape)
    flat = build.shrink(bu, ((0, sprod(shape)),))
    return flat if len(shape) == 1 else build.reshape(flat, shape)


def is_contiguous_buffer(u: UOp, _multi: Ops = Ops.MULTI, _reshape: Ops = Ops.RESHAPE, _shrink: Ops = Ops.SHRINK,
                         _buffer: Ops = Ops.BUFFER) -> bool:
    """A whole buffer (under reshapes), or one per device: reading it needs no kernel. (Asked of every new tensor's
    node: the ops are bound as defaults, locals instead of an attribute lookup per test.)"""
    if (op := u.op) is _multi: return all(is_contiguous_buffer(s) for s in u.src)   # one buffer per device
    while op is _reshape: op = (u := u.src[0]).op
    if op is _shrink and u.src[0].op is _buffer and u.arg[0][0] == 0 and isinstance(u.arg[0][1], UOp):
        return True  # a symbolic shape: a prefix of a buffer allocated at its largest size
    return op is _buffer


def is_realized(u: UOp) -> bool:
    """Already computed: a whole buffer, or a constant broadcast to a shape (never materialized)."""
    if is_contiguous_buffer(u): return True
    # stops at the first other op (a lazy graph's root, usually): no walk of the whole graph on every realize
    stack, seen = [u], {u}
    while stack:
        x = stack.pop()
        if x.op not in (Ops.RESHAPE, Ops.EXPAND, Ops.CONST, Ops.DEVICE): return False
        for s in x.src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return True


def target_buffer(u: UOp) -> UOp:
    """The BUFFER node an ASSIGN (or a chain of pending ASSIGNs, or a view of either) writes into."""
    while u.op is Ops.ASSIGN or u.op in GroupOp.Movement: u = u.src[0]
    return u


def memory_of(buf: Buffer) -> int:
    """The identity of a buffer's memory (a planner view shares its base's; a DISK buffer's is its file's)."""
    while buf.base is not None: buf = buf.base
    if buf.device.__class__ is str and buf.device.startswith("DISK:"): return file_key(buf)
    return id(buf)


# (st_dev, st_ino) of a file -> its memory identity: negative, so never an id() of a buffer in host memory
_file_ids: dict[tuple[int, int], int] = {}
_disk_keys: "weakref.WeakKeyDictionary[Buffer, int]" = weakref.WeakKeyDictionary()


def file_key(buf: Buffer) -> int:
    """The memory identity of a DISK buffer: its file, by device and inode, so two paths to one file (another spelling,
    a symbolic or hard link) are one memory: a write through either is a write of both."""
    if (k := _disk_keys.get(buf)) is not None: return k
    path = buf.device[len("DISK:"):]
    try:
        st = os.stat(path)
        ident = (st.st_dev, st.st_ino)
    except OSError:   # not made yet: by its resolved path until it exists
        return -(abs(hash(os.path.realpath(path))) % (1 << 61)) - (1 << 61)
    k = _disk_keys[buf] = _file_ids.setdefault(ident, -1 - len(_file_ids))
    return k


def is_disk(buf: Buffer) -> bool:
    return buf.device.__class__ is str and buf.device.startswith("DISK:")


def buffers_read(u: UOp, past_assigns: bool = True) -> list[Buffer]:
    """The buffers a lazy graph reads (stops at BUFFER nodes), each once. (A plain walk, not a toposort: the order is
    not needed, and every realize walks its whole graph here.) `past_assigns=False`: only the direct reads, not what
    it reads through an ASSIGN below it (the value that write left: one version of the memory, see `cache_result`)."""
    if not past_assigns: return reads_split(u)[1]
    out: list[Buffer] = []
    seen, stack, buffer_op, get = {u}, [u], Ops.BUFFER, buffers.get
    while stack:
        x = stack.pop()
        if x.op is buffer_op:
            if (b := get(x)) is not None: out.append(b)
            continue
        for s in x.src:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return out


def reads_split(u: UOp) -> tuple[list[Buffer], list[Buffer]]:
    """(every buffer the graph reads, the ones it reads directly: not only through an ASSIGN below it), in one walk."""
    direct: dict[UOp, bool] = {u: True}   # node -> reached other than through an ASSIGN
    stack, buffer_op, assign_op, get = [u], Ops.BUFFER, Ops.ASSIGN, buffers.get
    while stack:
        x = stack.pop()
        if x.op is buffer_op: continue
        d = direct[x] and (x.op is not assign_op or x is u)
        for s in x.src:
            if (old := direct.get(s)) is None or (d and not old):
                direct[s] = d
                stack.append(s)
    allb, dirb = [], []
    for n, d in direct.items():
        if n.op is buffer_op and (b := get(n)) is not None:
            allb.append(b)
            if d: dirb.append(b)
    return allb, dirb


# memory that code outside fusegrad can also read and write (DLPack exports and imports): results computed from it are
# never cached, since a write from outside can't call written(); share() drops the results cached in it until then
_shared: "weakref.WeakSet[Buffer]" = weakref.WeakSet()


def _base(buf: Buffer) -> Buffer:
    while buf.base is not None: buf = buf.base
    return buf


def share(buf: Buffer) -> None:
    """`buf`'s memory is now reachable from outside fusegrad too: forget what was cached from it, cache nothing more."""
    written(_base(buf))
    _shared.add(_base(buf))


def is_shared(buf: Buffer) -> bool:
    return bool(_shared) and _base(buf) in _shared


# memory -> the tensor that owns it: the one a realize computed it for, or that was made from data or wrote into it.
# Another tensor holding the same memory without being a view of the owner (a second tensor with the same graph,
# served the first one's cached result; a reduce over size-1 axes, which is only a reshape of its input) reads it, but
# a write to it goes into memory of its own (as in torch, where the two are separate tensors). Keyed weakly by the
# memory (a Buffer), so an entry goes with the memory it names.
_owners: "weakref.WeakKeyDictionary[Buffer, weakref.ref[Any]]" = weakref.WeakKeyDictionary()


def held_memory(u: UOp) -> Buffer | None:
    """The memory a tensor node holds or writes into: its (first) buffer under movement ops and pending writes."""
    if u.op is Ops.MULTI: u = u.src[0]
    if (b := buffers.get(target_buffer(u))) is None: return None
    return _base(b)


def claim(t: Any) -> None:
    """`t` owns the memory its node holds, unless a live tensor that still holds it owns it already."""
    if (m := held_memory(t.uop)) is None: return
    if (r := _owners.get(m)) is not None and (o := r()) is not None and o is not t and held_memory(o.uop) is m: return
    _owners[m] = weakref.ref(t)


def owns(t: Any) -> bool:
    """Whether a write to tensor `t` (not a view) may go into the memory its node holds: `t` owns it (unowned memory is
    claimed by its first writer)."""
    if (m := held_memory(t.uop)) is None: return False
    if (r := _owners.get(m)) is not None and (o := r()) is not None and o is not t and held_memory(o.uop) is m:
        return False
    _owners[m] = weakref.ref(t)
    return True


# gradients backward() made for tensors whose requires_grad is unset (tinygrad fills those too): gradient -> its owner,
# weakly. Nobody asked for them, so one still lazy when memory it reads is about to be overwritten (an optimizer step
# writing the weights) is dropped, the owner's `.grad` set back to None, instead of being given copies of the old
# memory (views.py preserve_old_values): a data tensor's gradient would otherwise cost copies every step, and one that
# accumulates over steps (nothing zeroes it) would hold a chain of them. One that is held elsewhere (`g = x.grad`) is
# kept like any lazy tensor.
_unrequested: dict[int, tuple[weakref.ref[Any], weakref.ref[Any]]] = {}   # id(gradient) -> (gradient, owner), weakly


def note_unrequested(grad: Any, owner: Any) -> None:
    """Record `grad` as a gradient backward() made for `owner`, whose requires_grad is unset."""
    key = id(grad)
    _unrequested[key] = (weakref.ref(grad, lambda _, k=key: _unrequested.pop(k, None)), weakref.ref(owner))


def drop_unrequested(t: Any, refs: int) -> bool:
    """Drop `t` if it is an unrequested gradient (above) that only its owner's `.grad` holds: `refs` is
    sys.getrefcount(t) minus the caller's own references. Returns whether it was dropped."""
    e = _unrequested.get(id(t))
    if e is None or e[0]() is not t or (owner := e[1]()) is None or owner.grad is not t or refs > 2: return False
    owner.grad = None   # (the count: the owner's slot and getrefcount's argument)
    del _unrequested[id(t)]
    return True


# ASSIGN nodes that ran: one must never run twice (a graph that still holds one after its entry was dropped reads
# memory that a later write changed, and raises instead)
executed: "weakref.WeakSet[UOp]" = weakref.WeakSet()
_recorded = 0


def cache_result(key: UOp, value: UOp, written_now: set[int] | None, reads: list[Buffer] | None = None) -> None:
    """Remember that `key` was computed into `value` (a buffer node, maybe reshaped); the entry is dropped when any
    buffer it read, or the buffer holding it, is written in place. An ASSIGN depends only on the memory it wrote. A
    result that read memory the same schedule wrote (`written_now`) is not cached: a later graph naming that buffer
    means its new contents. Reads through an ASSIGN don't count there: they read the value that write left, which a
    later write doesn't change (a parameter's lazy initial value read the RNG state through the draw's counter update:
    it stays the value computed), so they are not what a write drops it for either. `written_now=None`: a snapshot of
    memory taken before a write, which stays valid. `reads`: `buffers_read(key, past_assigns=False)` when the caller
    has it already."""
    global _recorded
    if key is value: return
    if key.op is Ops.ASSIGN or written_now is None:   # a write, or a snapshot taken before one: valid until its
        if key.op is Ops.ASSIGN: executed.add(key)    # own memory is written
        mems = set()
    else:
        if REFERENCE: return   # reference mode: no computed value is served again (writes and snapshots are records)
        if reads is None: reads = buffers_read(key, past_assigns=False)
        mems = {memory_of(b) for b in reads}
        if written_now and mems & written_now: return
        # memory written from outside (DLPack, a file another program may write): never cached
        if (_shared or ops_disk.opened) and any(is_shared(b) or is_disk(b) for b in reads): return
    realized[key] = value
    ref = weakref.ref(key)
    for held in (value.src if value.op is Ops.MULTI else (value,)):   # a multi-device result holds one per device
        if held.base.op is Ops.BUFFER and held.base in buffers: mems.add(memory_of(buffers[held.base]))
    for m in mems: _cache_deps.setdefault(m, []).append(ref)
    _recorded += 1
    if _recorded % 4096 == 0: prune()


def written(buf: Buffer) -> None:
    """`buf`'s memory was just written in place: forget every cached result computed from (or held in) it."""
    m = memory_of(buf)
    _versions[m] = _versions.get(m, 0) + 1
    for ref in _cache_deps.pop(m, ()):
        if (k := ref()) is not None: realized.pop(k, None)


def version(buf: Buffer) -> int:
    """How many in-place writes `buf`'s memory has had."""
    return _versions.get(memory_of(buf), 0)


# The one rule of every cache and capture (docs/architecture.md, "Caches and captures: one rule"): what a cached value
# read is recorded as (memory, write version) pairs, and the value is used only while they all still hold. `written`
# is the one place a version moves. (The result cache applies the rule eagerly: `written` drops its entries at once.)
Reads = tuple[tuple[int, int], ...]


def read_versions(bufs: "list[Buffer] | tuple[Buffer, ...]") -> Reads:
    """The (memory, write version) pairs of `bufs`, for a value computed from them now."""
    return tuple((m, _versions.get(m, 0)) for m in dict.fromkeys(memory_of(b) for b in bufs))


def still_valid(reads: Reads) -> bool:
    """Whether none of the memory in `reads` was written since they were recorded."""
    return all(_versions.get(m, 0) == v for m, v in reads)


def record_history(new: UOp, old: UOp, reads: list[Buffer] | None = None) -> None:
    """`new` (a realized result) was computed by the lazy graph `old`: backward() differentiates through it. (`reads`:
    `buffers_read(old)` when the caller has it already.)"""
    versions = {memory_of(b): version(b) for b in (buffers_read(old) if reads is None else reads)}
    if (buf := buffers.get(new.base)) is not None and (own := memory_of(buf)) in versions and \
       (prev := lazy_of.get(new)) is not None:
        # a write that read the memory it wrote (`cache[i] = k`, realized, and again): `new` inside `old` stands for
        # the contents before this write, which the previous history computed. (Left in place, the history would
        # contain its own key; without a previous history the old contents stay a leaf, see tensor._with_history.)
        old = substitute(old, {new: prev})
        versions.update((m, v) for m, v in _history_versions.get(new, ()) if m != own)
    lazy_of[new] = old
    _history_versions[new] = tuple(versions.items())


def check_history(new: UOp) -> None:
    """Raise if memory the history of `new` read was written since (its gradient would use the new values)."""
    if not still_valid(_history_versions.get(new, ())):
        raise RuntimeError("one of the tensors needed for gradient computation has been modified by an in-place "
                           "operation (assign, +=, an optimizer step) since the result was computed: call "
                           "backward() before changing them, as in torch")


def prune() -> None:
    """Drop bookkeeping of results that no longer exist (called now and then, so long runs don't grow it)."""
    for m in list(_cache_deps):
        live = [r for r in _cache_deps[m] if r() is not None]
        if live: _cache_deps[m] = live
        else: del _cache_deps[m]


# ----- relayouts of realized buffers -----
# A copy of a realized buffer into another layout (`w.permute(...).contiguous()`: a conv weight made contiguous in
# its output channels) is computed once per buffer version and reused until the buffer is written. The result cache
# can't keep it: its entries live only while the lazy node does, and each call builds that node anew. Entries are
# keyed weakly by the source BUFFER node (they go when it does) and then by the movement ops as plain data, so the
# cache holds no lazy node; an entry remembers the source's write count and is void once that changes.
_relayouts: "weakref.WeakKeyDictionary[UOp, dict[tuple, tuple[UOp, Reads]]]" = weakref.WeakKeyDictionary()
# > 0 while TinyJit captures: the scheduler is served no derived value (a cached result or relayout: anything computed
# from buffers), only identities (an executed write is its buffer; a unique node, such as a snapshot or a parameter's
# initial value, is computed once). A capture must contain every kernel computing its results from its inputs and
# state, so that a replay computes them from the buffers' contents of its time (a weight written by an optimizer step
# between replays) instead of reading a copy made before the capture.
derived_off = 0


def relayout_source(u: UOp, structural: bool = False) -> tuple[UOp, tuple] | None:
    """For CONTIGUOUS(movement ops (and detaches) of a BUFFER) with static shapes: (that BUFFER node, the ops as
    data). `structural`: also for a BUFFER without memory (the scheduler's placeholders)."""
    if u.op is not Ops.CONTIGUOUS or u.arg is not None: return None
    chain = []
    x = u.src[0]
    while x.op in GroupOp.Movement or (x.op is Ops.DETACH and x.arg is None):   # (detach: no-op going forward)
        if x.shape is None or not all_static(x.shape): return None
        chain.append((x.op.value, x.arg))
        x = x.src[0]
    if x.op is not Ops.BUFFER or not chain or (not structural and x not in buffers): return None
    return x, (u.dtype, tuple(chain))


def relayout_get(u: UOp) -> UOp | None:
    """The buffer view holding a relayout computed before from the same, unwritten, buffer."""
    if REFERENCE: return None   # reference mode: every relayout is computed again
    if (src := relayout_source(u)) is None or (d := _relayouts.get(src[0])) is None: return None
    if (hit := d.get(src[1])) is None: return None
    # void once the source or the copy itself (a tensor holding it, written in place) was written
    if not still_valid(hit[1]):
        del d[src[1]]
        return None
    return hit[0]


def relayout_put(u: UOp, value: UOp) -> None:
    """Remember that relayout `u` (see relayout_source) is held in `value` (a view of a buffer of its own). Not for
    memory written from outside fusegrad (DLPack, a file), whose writes no version counts."""
    if (src := relayout_source(u)) is not None and not is_shared(buffers[src[0]]) and not is_disk(buffers[src[0]]):
        _relayouts.setdefault(src[0], {})[src[1]] = (value, read_versions([buffers[src[0]], buffers[value.base]]))


# cached_value(u) is None wherever the first gives None for a weak reference to u and u's op is not in the second or
# its first source's op not in the third (relayout_source): the scheduler's walk tests these inline and calls
# cached_value only for the nodes they leave (schedule/cache.py)
CACHED_VALUE_FILTER = (realized._data.get, frozenset({Ops.CONTIGUOUS}), frozenset(GroupOp.Movement | {Ops.DETACH}))


def cached_value(u: UOp, _get: Any = realized._data.get, _ref: Any = weakref.ref,
                 _reftype: Any = weakref.ReferenceType) -> UOp | None:
    """What the scheduler reads instead of computing `u`: a cached result, or a cached relayout. (ResultCache.get,
    inline: the scheduler asks this for every node of every graph it is given.)"""
    if (r := _get(_ref(u))) is not None:
        if type(r) is not _reftype or (r := r()) is not None:
            if not derived_off or u.op is Ops.ASSIGN or (u.op is Ops.CONTIGUOUS and type(u.arg) is int): return r
            return None
    return None if u.op is not Ops.CONTIGUOUS or derived_off else relayout_get(u)
