"""The bookkeeping structures made cheap for eager calls (docs/performance.md, "Per-call overhead") keep their
meaning: hash-consing drops dead nodes, a base's view list stays bounded and still reaches live views, the memoized
dtype promotion follows a changed default float, and the one-step broadcast makes the same nodes as reshape+expand."""
from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fusegrad import Tensor, dtypes
from fusegrad.dtype import least_upper_dtype
from fusegrad.ir import ops as ir_ops
from fusegrad.ir.ops import Ops, UOp


def test_hash_consing_returns_one_node_and_forgets_dead_ones():
    gc.collect()
    a = UOp(Ops.DEVICE, arg="test-eager-overhead")
    assert UOp(Ops.DEVICE, arg="test-eager-overhead") is a
    key = (Ops.DEVICE, dtypes.void, "test-eager-overhead")   # (op, dtype, arg, ids of the sources...)
    assert ir_ops._ucache[key]() is a
    ida = id(a)
    del a
    gc.collect()
    ir_ops._sweep(whole=True)   # (sweeps come every _UCACHE_MIN new entries: dead entries go then)
    assert key not in ir_ops._ucache
    b = UOp(Ops.DEVICE, arg="test-eager-overhead")   # made anew, and cached again
    assert UOp(Ops.DEVICE, arg="test-eager-overhead") is b and ir_ops._ucache[key]() is b
    del b, ida


def test_hash_consing_table_stays_bounded_and_a_dead_entry_gives_a_new_node():
    gc.collect()
    ir_ops._sweep(whole=True)
    live = len(ir_ops._ucache)
    x = UOp(Ops.DEVICE, arg="test-bounded")
    for i in range(3 * ir_ops._UCACHE_MIN): UOp(Ops.CONST, dtypes.int32, (x,), i)   # each dies at once
    assert len(ir_ops._ucache) <= live + 1 + 2 * ir_ops._UCACHE_MIN   # (a young and a middle generation at most)
    # a dead entry (not swept yet) is never handed out: the same structure is a new, live node with its own fields
    c = UOp(Ops.CONST, dtypes.int32, (x,), 3 * ir_ops._UCACHE_MIN - 1)
    assert c.op is Ops.CONST and c.src == (x,) and c.arg == 3 * ir_ops._UCACHE_MIN - 1
    assert UOp(Ops.CONST, dtypes.int32, (x,), 3 * ir_ops._UCACHE_MIN - 1) is c


def test_dead_entries_stay_bounded_while_many_nodes_are_live():
    """The dead entries the table holds are bounded by a constant, not by the live nodes: with 4 * _UCACHE_MIN nodes
    alive (as caches hold them in a long process), a loop of nodes that die at once left up to as many dead entries as
    live ones (the table was swept when it had doubled), and an eager training loop's RSS grew by 10 MB."""
    gc.collect()
    ir_ops._sweep(whole=True)
    x = UOp(Ops.DEVICE, arg="test-many-live")
    held = [UOp(Ops.CONST, dtypes.int32, (x,), -1 - i) for i in range(4 * ir_ops._UCACHE_MIN)]
    live = len(ir_ops._ucache)
    most = 0
    for i in range(6 * ir_ops._UCACHE_MIN):
        UOp(Ops.CONST, dtypes.int32, (x,), i)   # each dies at once
        if i % 512 == 0: most = max(most, len(ir_ops._ucache))
    assert most <= live + 2 * ir_ops._UCACHE_MIN + 1, (most, live)
    # nodes that outlived many sweeps (now in the old generation) are still the ones handed out
    assert all(UOp(Ops.CONST, dtypes.int32, (x,), -1 - i) is held[i] for i in range(0, len(held), 97))
    del held
    gc.collect()
    ir_ops._sweep(whole=True)
    assert len(ir_ops._ucache) < live - 3 * ir_ops._UCACHE_MIN   # and dropped once they died


def test_a_survivor_of_the_young_sweep_dying_later_is_swept_with_the_middle_generation():
    gc.collect()
    ir_ops._sweep(whole=True)
    x = UOp(Ops.DEVICE, arg="test-middle")
    kept = [UOp(Ops.CONST, dtypes.int32, (x,), -1 - i) for i in range(1000)]
    key = (Ops.CONST, dtypes.int32, -1, None, id(x))
    assert ir_ops._ucache[key]() is kept[0]
    for i in range(ir_ops._UCACHE_MIN + 10): UOp(Ops.CONST, dtypes.int32, (x,), i)   # a young sweep: kept survives
    assert key in ir_ops._ucache
    del kept
    gc.collect()
    for i in range(3 * ir_ops._UCACHE_MIN): UOp(Ops.CONST, dtypes.int32, (x,), i)   # the middle generation's check
    assert key not in ir_ops._ucache


def test_a_sweep_survives_nodes_made_while_it_iterates():
    """The items a sweep iterates are tuples it makes, which can start a garbage collection, whose callbacks may make
    nodes (the WebGPU tests' did: "dictionary changed size during iteration" from inside UOp())."""
    x = UOp(Ops.DEVICE, arg="test-sweep-gc")
    made: list[UOp] = []
    def make_one(phase, info):
        if phase == "start" and len(made) < 200: made.append(UOp(Ops.CONST, dtypes.int32, (x,), 10**6 + len(made)))
    for i in range(2000): UOp(Ops.CONST, dtypes.int32, (x,), i)   # dead entries for the sweep to find
    old = gc.get_threshold()
    gc.callbacks.append(make_one)
    gc.set_threshold(1)
    try:
        ir_ops._sweep(whole=True)
        ir_ops._sweep()
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(make_one)
    assert made and all(UOp(Ops.CONST, dtypes.int32, (x,), 10**6 + i) is m for i, m in enumerate(made))


def test_view_list_is_pruned_and_live_views_still_see_writes():
    base = Tensor.zeros(4).contiguous().realize()
    kept = base.reshape(2, 2)
    for _ in range(200): base.reshape(4, 1)   # views that die at once
    gc.collect()
    assert base._views is not None and len(base._views) <= 2 * base._views.limit
    base[1:3] = 5.0
    assert kept.tolist() == [[0.0, 5.0], [5.0, 0.0]]


def test_promotion_memo_follows_the_default_float():
    x = Tensor([1, 2], dtype=dtypes.int32)
    assert (x * 1.5).dtype == dtypes.float32
    old = dtypes.default_float
    try:
        dtypes.default_float = dtypes.float16
        assert (x * 1.5).dtype == dtypes.float16
    finally: dtypes.default_float = old
    assert (x * 1.5).dtype == dtypes.float32


@pytest.mark.parametrize("shapes", [((3,), (2, 3)), ((2, 1), (2, 3)), ((1, 3), (4, 2, 3)), ((), (2, 2))])
def test_one_step_broadcast_builds_reshape_then_expand(shapes):
    xs, ys = shapes
    x, y = Tensor.ones(*xs).contiguous(), Tensor.ones(*ys).contiguous()
    out = (x + y).uop
    bx = out.src[0]
    assert bx.op is Ops.EXPAND and bx.arg == ys
    inner = bx.src[0]
    if len(xs) < len(ys): assert inner.op is Ops.RESHAPE and inner.src[0] is x.uop
    else: assert inner is x.uop
    np.testing.assert_equal((x + y).numpy(), np.ones(xs) + np.ones(ys))


def test_broadcast_under_no_grad_keeps_the_result_off_the_graph():
    w = Tensor([1.0, 2.0], requires_grad=True)
    Tensor.no_grad = True
    try: y = w + Tensor.ones(3, 2)
    finally: Tensor.no_grad = False
    assert not y.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"): y.sum().backward()


def test_alu_of_mismatched_shapes_is_refused_by_shape_inference():
    a, b = Tensor.ones(2, 3), Tensor.ones(3, 2)
    with pytest.raises(ValueError, match="mismatched shapes"): UOp(Ops.ADD, a.dtype, (a.uop, b.uop)).shape


def _relu_composed(x: Tensor) -> Tensor: return ((x > 0) | x.isnan()).where(x, 0)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.float64])
def test_relu_and_relu6_on_nodes_build_the_composed_graph(dt):
    x = Tensor([[-1.0, 0.0, 3.0], [6.0, 7.0, float("nan")]], dtype=dt)
    assert x.relu().uop is _relu_composed(x).uop
    assert x.relu6().uop is (x >= 6).where(6, _relu_composed(x)).uop
    np.testing.assert_equal(x.relu6().numpy(), np.array([[0, 0, 3], [6, 6, np.nan]], dtype=np.float64).astype(dt.name))


def test_relu6_under_no_grad_detaches_like_the_composition(monkeypatch):
    x = Tensor([-1.0, 2.0, 8.0], requires_grad=True)
    monkeypatch.setattr(Tensor, "no_grad", True)
    out, ref = x.relu6(), (x >= 6).where(6, _relu_composed(x))
    assert out.uop is ref.uop and out._no_graph and out.requires_grad is None


@pytest.mark.parametrize("xs,ws,kw", [
    ((1, 4, 9, 9), (8, 4, 3, 3), {}), ((2, 8, 10, 7), (8, 1, 3, 3), dict(groups=8, stride=2)),
    ((1, 16, 6, 6), (16, 16, 1, 1), {}), ((1, 3, 11, 11), (4, 3, 3, 3), dict(padding=1, dilation=2)),
    ((2, 4, 12), (8, 4, 5), dict(stride=3))])
def test_conv_on_nodes_builds_the_tensor_level_graph(xs, ws, kw, monkeypatch):
    from fusegrad.mixin import nn as nn_mixin
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal(xs, dtype=np.float32), requires_grad=True)
    w = Tensor(rng.standard_normal(ws, dtype=np.float32), requires_grad=True)
    fast = x.conv2d(w, **kw)
    monkeypatch.setattr(nn_mixin, "all_static", lambda shape: False)   # the step-by-step Tensor form instead
    slow = x.conv2d(w, **kw)
    assert fast.uop.src == slow.uop.src and fast.requires_grad and fast.dtype == slow.dtype
    gx, gw = fast.sum().gradient(x, w)
    sx, sw = slow.sum().gradient(x, w)
    np.testing.assert_allclose(fast.numpy(), slow.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gx.numpy(), sx.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw.numpy(), sw.numpy(), rtol=1e-5, atol=1e-5)


def _dot_composed(x: Tensor, w: Tensor) -> Tensor:
    xx = x.reshape(1, x.shape[-1]) if x.ndim == 1 else x
    xr = xx.reshape(xx.shape[:-1] + (1, x.shape[-1]))
    wr = w.transpose(-1, -2).reshape(w.shape[:-2] + (1, w.shape[-1], x.shape[-1]))
    out = (xr * wr).sum(-1)
    return (out.squeeze(-2) if x.ndim == 1 else out).cast(least_upper_dtype(x.dtype, w.dtype))


@pytest.mark.parametrize("xs,ws,dt", [((3, 4), (4, 5), dtypes.float32), ((4,), (4, 5), dtypes.float32),
                                      ((2, 3, 3, 4), (3, 4, 2), dtypes.float32), ((1, 2, 3), (5, 3, 2), dtypes.int8)])
def test_dot_on_nodes_builds_the_composed_graph(xs, ws, dt):
    rng = np.random.default_rng(0)
    x = Tensor(rng.integers(-3, 3, xs).astype(np.float32)).cast(dt)
    w = Tensor(rng.integers(-3, 3, ws).astype(np.float32)).cast(dt)
    out, ref = x @ w, _dot_composed(x, w)
    assert out.uop is ref.uop and out.dtype == ref.dtype
    assert (out._view is None) == (ref._view is None)   # a view (or not) as sum() makes it
    np.testing.assert_equal(out.numpy(), x.numpy() @ w.numpy())


# composites built on nodes (OpMixin in ir/ops.py, written once; mixin/alu.py on_nodes): the same graph as the
# Tensor-level steps, node for node
_COMPOSITES = {
    "gelu": lambda x: x.gelu(), "sigmoid": lambda x: x.sigmoid(), "tanh": lambda x: x.tanh(),
    "layernorm": lambda x: x.layernorm(eps=1e-12), "layernorm_axes": lambda x: x.layernorm(axis=(1, 2)),
    "layernorm_affine": lambda x: x.layernorm() * 2.0 + 0.5, "softmax": lambda x: x.softmax(-1),
    "softmax0": lambda x: x.softmax(0), "log_softmax": lambda x: x.log_softmax(1), "relu": lambda x: x.relu(),
    "relu6": lambda x: x.relu6(),
}


def _tensor_level(monkeypatch, f, x):
    import fusegrad.mixin.alu as alu_m
    with monkeypatch.context() as m:
        m.setattr(alu_m, "nodes_ok", lambda *_: False)   # every composite takes its Tensor steps
        return f(x)


@pytest.mark.parametrize("name", list(_COMPOSITES))
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64, dtypes.float16])
@pytest.mark.parametrize("grad", [False, True])
def test_composites_on_nodes_build_the_tensor_level_graph(monkeypatch, name, dt, grad):
    f = _COMPOSITES[name]
    xn = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32) * 4
    x = Tensor(xn, dtype=dt, requires_grad=grad)
    fast, slow = f(x), _tensor_level(monkeypatch, f, x)
    assert fast.uop is slow.uop
    assert fast.requires_grad == slow.requires_grad and fast.dtype == slow.dtype
    if grad:
        fast.sum().backward()
        g1 = x.grad.numpy()
        x.grad = None
        slow.sum().backward()
        np.testing.assert_array_equal(g1, x.grad.numpy())


def test_composites_on_nodes_under_no_grad_keep_the_result_off_the_graph():
    x = Tensor([[1.0, -2.0, 3.0]], requires_grad=True)
    Tensor.no_grad = True
    try: ys = [x.gelu(), x.softmax(-1), x.layernorm(), x.sigmoid()]
    finally: Tensor.no_grad = False
    for y in ys:
        assert not y.requires_grad
        with pytest.raises(RuntimeError, match="does not require grad"): y.sum().backward()


@pytest.mark.parametrize("shape", [(4, 1), (3, 0), (1, 1)])
def test_composites_on_nodes_fall_back_where_the_formula_does_something_else(shape):
    # a reduce over size-1 or empty axes is no REDUCE node: the Tensor-level formula runs (and matches torch)
    import torch
    xn = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 1
    cases = [(lambda x: x.layernorm(), lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:], eps=1e-5))]
    if 0 not in shape: cases.append((lambda x: x.softmax(-1), lambda t: t.softmax(-1)))   # (empty: see below)
    for f, tf in cases:
        np.testing.assert_allclose(f(Tensor(xn)).numpy(), tf(torch.tensor(xn)).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "radd", "rsub", "rmul", "rdiv"])
@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((3,), (2, 3)), ((2, 1), (1, 3)), ((4, 1, 3), (2, 3))])
@pytest.mark.parametrize("grad", [False, True])
def test_binary_ops_of_two_tensors_build_the_broadcast_graph(monkeypatch, op, shapes, grad):
    # the one-step path (no Tensors for the broadcast operands) makes the nodes _broadcasted's Tensors make
    from fusegrad.mixin.alu import ALUMixin
    xs, ys = shapes
    x = Tensor(np.arange(1, 1 + np.prod(xs), dtype=np.float32).reshape(xs), requires_grad=grad)
    y = Tensor(np.arange(2, 2 + np.prod(ys), dtype=np.float32).reshape(ys))
    rev = op.startswith("r")
    name = op[1:] if rev else op
    fast = getattr(x, name)(y, rev)
    with monkeypatch.context() as m:
        m.setattr(ALUMixin, "_node_operand", lambda *a: None)
        slow = getattr(x, name)(y, rev)
    assert fast.uop is slow.uop and fast.requires_grad == slow.requires_grad
    a, b = (y.numpy(), x.numpy()) if rev else (x.numpy(), y.numpy())
    np.testing.assert_allclose(fast.numpy(), {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                                              "div": np.divide}[name](a, b), rtol=1e-6)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "radd", "rsub", "rmul", "rdiv"])
@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "uint8", "int64", "bool"])
@pytest.mark.parametrize("y", [2, -3, 0.5, -0.0, float("inf"), True])
@pytest.mark.parametrize("grad", [False, True])
def test_binary_ops_with_a_python_number_build_the_tensor_path_graph(monkeypatch, op, dt, y, grad):
    # the one-step path for `tensor op number` makes the nodes _broadcasted's Tensors make (or leaves the case to it),
    # and the same dtype, requires_grad and values, eager and under no_grad
    from fusegrad.mixin.alu import ALUMixin
    rev = op.startswith("r")
    name = op[1:] if rev else op
    dtype = getattr(dtypes, dt)
    if grad and not dtypes.is_float(dtype): return
    xn = np.array([[1, 2, 3], [4, 5, 7]]).astype(dt)
    for no_grad in (False, True):
        x = Tensor(xn, requires_grad=grad)
        prev, Tensor.no_grad = Tensor.no_grad, no_grad
        try:
            try: fast = getattr(x, name)(y, rev)
            except RuntimeError as e: fast = e
            with monkeypatch.context() as m:
                m.setattr(ALUMixin, "_node_operand", lambda *a: None)
                try: slow = getattr(x, name)(y, rev)
                except RuntimeError as e: slow = e
        finally: Tensor.no_grad = prev
        if isinstance(slow, Exception):
            assert type(fast) is type(slow)
            continue
        assert fast.uop is slow.uop and fast.dtype == slow.dtype and fast.requires_grad == slow.requires_grad
        with np.errstate(all="ignore"): np.testing.assert_array_equal(fast.numpy(), slow.numpy())


def test_binary_ops_one_step_path_leaves_errors_and_promotion_to_the_tensor_path():
    from fusegrad.helpers import ShapeError
    with pytest.raises(ShapeError): Tensor.ones(2, 3) + Tensor.ones(3, 2)
    assert (Tensor.ones(2, dtype=dtypes.int32) + Tensor.ones(2)).dtype == dtypes.float32
    assert (Tensor.ones(2, dtype=dtypes.int32) - Tensor.ones(2, dtype=dtypes.int32)).tolist() == [0, 0]
    assert (Tensor.ones(2, dtype=dtypes.int32) / Tensor.ones(2, dtype=dtypes.int32)).dtype == dtypes.float32


@pytest.mark.parametrize("name", ["gelu", "sigmoid", "tanh", "layernorm", "softmax", "log_softmax", "relu", "relu6"])
@pytest.mark.parametrize("grad", [False, True])
def test_composites_on_nodes_make_one_tensor(monkeypatch, name, grad):
    # the node path is taken (not the Tensor steps after a refused node step): one Tensor, the result
    x = Tensor(np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32), requires_grad=grad)
    made = []
    wrap = Tensor._wrap
    monkeypatch.setattr(Tensor, "_wrap", staticmethod(lambda u, *p: made.append(u) or wrap(u, *p)))
    out = _COMPOSITES[name](x)
    assert made == [out.uop]


def test_composites_run_on_a_bare_node():
    # OpMixin's composites are the node's own methods: the graph a Tensor's method makes from the same node
    x = Tensor(np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32))
    u = x.uop
    assert u.sigmoid() is x.sigmoid().uop and u.tanh() is x.tanh().uop and u.relu6() is x.relu6().uop
    assert u.exp() is x.exp().uop and u.log() is x.log().uop and u.rsqrt() is x.rsqrt().uop
    assert u.sum(1, keepdim=True) is x.sum(1, keepdim=True).uop and u.max(0) is x.max(0).uop
    assert u.mean() is x.mean().uop and (u * 2 + 1).sub(u, True) is (u * 2 + 1).__rsub__(u)
    assert (1 - u) is (1 - x).uop and (u / 3) is (x / 3).uop and u.ge(0) is (x >= 0).uop
    np.testing.assert_allclose(Tensor(u.sigmoid()).numpy(), 1 / (1 + np.exp(-x.numpy())), rtol=1e-6)


def test_node_arithmetic_by_level():
    # kernel-level and symbolic values keep scalar constants (index math); tensor-level nodes get tensor constants
    r = UOp.range(8, 0)
    assert (r + 1).src[1] is UOp.const(r.dtype, 1) and (r - 1).src[1] is UOp.const(r.dtype, -1)
    assert (r * 2).op is Ops.MUL and (2 * r).src[0] is UOp.const(r.dtype, 2)
    t = Tensor.ones(2, 3).contiguous().uop
    c = (t + 1).src[1]
    assert c.op is Ops.EXPAND and c.shape == (2, 3) and c.base.op is Ops.CONST and c.base.src[0].op is Ops.DEVICE
    with pytest.raises(TypeError, match="cast first"): t + Tensor.ones(3, dtype=dtypes.int32).uop
    with pytest.raises(ValueError): t + Tensor.ones(3, 2).contiguous().uop   # shapes that don't broadcast


def _inferred(n: UOp) -> tuple:
    """n's shape and device as the properties compute them (without what a builder stored on the node)."""
    from fusegrad.ir.shape import infer_shape
    fresh = {k: v for k, v in n.__dict__.items() if k not in ("shape", "device")}
    try:
        n.__dict__.clear()
        return infer_shape(n), type(n).device.fn(n)   # (sources keep whatever they hold: checked one by one below)
    finally: n.__dict__.update(fresh)


@pytest.mark.parametrize("shape", [(), (1,), (5,), (2, 3), (2, 1, 4), (0, 3)])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.float16])
def test_shapes_stored_by_builders_are_the_inferred_ones(shape, dtype):
    # node_of_shape stores the shape and device the frontend knows (constants, x op y, contiguous): the very values
    # the properties would compute, for every node of the graphs built
    x = Tensor.ones(*shape, dtype=dtype).contiguous()
    y = Tensor.full(shape, 3, dtype=dtype).contiguous()
    outs = [x * 2, 2 * x, x + 1, 1 + x, x * y, x + y, y * x, (x * 1.5 if dtypes.is_float(dtype) else x * 3),
            (x + y).contiguous(), Tensor.full(shape, 7, dtype=dtype) * x, (x > 1).where(x, y), x - y, x / y]
    if dtypes.is_float(dtype) and shape:   # OpMixin's composites on nodes (UOp._binop, _alu, where)
        outs += [x.gelu(), x.sigmoid(), x.tanh(), x.relu6(), x.softmax(-1), x.log_softmax(-1), x.layernorm(-1),
                 x.exp(), x.rsqrt(), (x * y.reshape(*shape[:-1], 1, shape[-1])[..., 0, :] if len(shape) > 1 else x)]
    for o in outs:
        for n in o.uop.toposort():
            stored = (n.__dict__.get("shape", "unset"), n.__dict__.get("device", "unset"))
            want = _inferred(n)
            assert stored[0] == "unset" or stored[0] == want[0], (n.op, stored, want)
            assert stored[1] == "unset" or stored[1] == want[1], (n.op, stored, want)
    np.testing.assert_equal((x * y + 1).numpy(), np.full(shape, 4, dtype=np.float32).astype(x.numpy().dtype))


def test_equal_dtypes_are_one_object_however_made():
    """DTypes are interned (equality is identity, hashing is C-level): every way of making a dtype gives the one
    object, so identity-based equality never calls two equal dtypes different."""
    import copy
    import pickle
    import threading
    from fusegrad.dtype import DType, PtrDType
    v = dtypes.float32.vec(4)
    assert dtypes.float32.vec(4) is v and v == dtypes.float32.vec(4) and hash(v) == hash(dtypes.float32.vec(4))
    assert DType(13, 4, "float", "f") is dtypes.float32
    assert pickle.loads(pickle.dumps(v)) is v and copy.deepcopy(v) is v and copy.copy(dtypes.half) is dtypes.half
    p = dtypes.int8.ptr(123, "local")
    assert dtypes.int8.ptr(123, "local") is p and pickle.loads(pickle.dumps(p)) is p
    assert isinstance(p, PtrDType) and p != dtypes.int8.ptr(123) and p != dtypes.int8.ptr(124, "local")
    assert dtypes.float32 != dtypes.int32 and dtypes.float32.vec(4) != dtypes.float32.vec(8)
    assert dtypes.float32 != np.float32 and dtypes.float32 != "float"   # no other type is asked
    made: list = []
    ts = [threading.Thread(target=lambda: made.extend(dtypes.uint16.vec(k) for k in range(2, 40))) for _ in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert all(d is dtypes.uint16.vec(d.count) for d in made)


_held: list = []


def _realized_below(a: Tensor, b: Tensor) -> Tensor:
    x = a * 3
    y = (x + b).sum()   # holds x's node, which the result cache serves once x is realized
    x.realize()
    _held.append(x)   # (the cache keeps a result while a tensor holds it)
    return y


def _reads_cases() -> list:
    a, b = Tensor([1.0, 2.0, 3.0, 4.0]).realize(), Tensor([5.0, 6.0, 7.0, 8.0]).realize()
    c = (a * 2).realize()
    w = Tensor([1.0, 1.0, 1.0, 1.0]).contiguous().realize()
    return [("two buffers", lambda: (a + b) * a), ("one buffer read twice", lambda: a * a + a.reshape(2, 2).sum()),
            ("a constant", lambda: Tensor.ones(4).contiguous() + 1),
            ("a cached value below", lambda: _realized_below(a, b)),   # not a plain walk
            ("a pending write below", lambda: w.assign(w + a) * 3), ("custom backward", lambda: c.relu() + b),
            ("copied", lambda: c.to("PYTHON").to(c.device) + b)]


@pytest.mark.parametrize("i", range(7))
def test_reads_from_the_key_walk_are_the_reads_walk(i):
    """The buffers the schedule's key walk hands the realize (ScheduleResults.reads: one target, nothing cached, no
    write or custom backward in the graph) are those `storage.reads_split` finds; elsewhere none are handed over."""
    from fusegrad import schedule, storage
    name, make = _reads_cases()[i]
    t = make()
    _, results = schedule.create_schedule([t.uop])
    want = storage.reads_split(t.uop)
    if (got := results.reads.get(t.uop)) is None:
        assert name in ("a cached value below", "a pending write below"), name
        return
    assert name not in ("a cached value below", "a pending write below"), name
    assert {id(b) for b in got[0]} == {id(b) for b in want[0]} and len(got[0]) == len(want[0])
    assert {id(b) for b in got[1]} == {id(b) for b in want[1]} and len(got[1]) == len(want[1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "mul", "relu", "sum", "flip", "realize", "cached", "assign"]),
                          st.integers(0, 3)), min_size=1, max_size=8))
def test_reads_from_the_key_walk_match_the_reads_walk_and_torch(steps):
    """Random programs over a few realized buffers (some steps realize an intermediate and keep it, so later graphs
    are served it from the result cache; some write a buffer in place): whenever the key walk hands the realize the
    buffers a graph reads, they are the ones `storage.reads_split` finds, and every value equals torch's."""
    import torch
    from fusegrad import schedule, storage
    init = [np.arange(4, dtype=np.float32) + 4 * k for k in range(4)]
    bufs = [Tensor(v).contiguous().realize() for v in init]
    ref = [torch.tensor(v) for v in init]
    cur, tcur, held = bufs[0] * 1, ref[0] * 1, []
    for op, k in steps:
        if op == "add": cur, tcur = cur + bufs[k], tcur + ref[k]
        elif op == "mul": cur, tcur = cur * bufs[k], tcur * ref[k]
        elif op == "relu": cur, tcur = cur.relu(), tcur.relu()
        elif op == "sum": cur, tcur = cur.sum().reshape(1).expand(4) + bufs[k], tcur.sum().reshape(1).expand(4) + ref[k]
        elif op == "flip": cur, tcur = cur.flip(0), tcur.flip(0)
        elif op == "realize": cur.realize()
        elif op == "cached":   # an intermediate realized on its own and kept: later graphs read its buffer
            part = cur * 2
            cur, tcur = part + 1, tcur * 2 + 1
            part.realize()
            held.append(part)
        else:   # a pending write of a buffer that later graphs read
            bufs[k].assign(bufs[k] + 1)
            ref[k] = ref[k] + 1
        _, results = schedule.create_schedule([cur.uop])
        if (got := results.reads.get(cur.uop)) is not None:
            want = storage.reads_split(cur.uop)
            assert sorted(map(id, got[0])) == sorted(map(id, want[0]))
            assert sorted(map(id, got[1])) == sorted(map(id, want[1]))
        np.testing.assert_allclose(cur.numpy(), tcur.numpy(), rtol=1e-6)
    for b, r in zip(bufs, ref): np.testing.assert_allclose(b.numpy(), r.numpy(), rtol=1e-6)


@pytest.mark.parametrize("n_inputs", [1, 2])
def test_key_walk_does_not_walk_a_custom_backwards_inputs(n_inputs):
    """A custom backward (DETACH with a GradFn) is its forward value: the key walk reads its first source only, also
    when it has exactly two (the walk spells out one and two sources), so buffers only its backward's inputs read are
    no placeholders of the key."""
    from fusegrad.autograd import custom_grad
    from fusegrad.schedule.cache import normalize
    from fusegrad.storage import CACHED_VALUE_FILTER, cached_value, executed
    a = Tensor([1.0, 2.0]).realize()
    others = [Tensor([3.0, 4.0]).realize() * (k + 2) for k in range(n_inputs)]
    y = custom_grad(a * 5, others, lambda g, *xs: [g for _ in xs], "test") + 1
    assert len(y.uop.src[0].src) == 1 + n_inputs
    nz = normalize(UOp(Ops.SINK, src=(y.uop,)), cached_value, executed, CACHED_VALUE_FILTER)
    assert nz.leaves == [a.uop.base] and not nz.as_is
    assert y.tolist() == [6.0, 11.0]


def test_realize_runs_no_garbage_collection_and_leaves_the_collector_as_it_found_it():
    phases: list[str] = []
    cb = lambda phase, info: phases.append(phase)   # noqa: E731
    old = gc.get_threshold()
    gc.callbacks.append(cb)
    try:
        gc.set_threshold(1)   # a collection at nearly every allocation of a container (dozens in a realize)
        x = (Tensor(np.arange(12.0, dtype=np.float32).reshape(3, 4)) * 2 + 1).sum(1)
        phases.clear()
        x.realize()   # (realize's own argument list may start one, before it turns the collector off)
        assert len(phases) <= 2 and gc.isenabled(), phases
        y = Tensor(np.arange(5.0, dtype=np.float32)) * 3
        y.realize()
        assert gc.isenabled()
        gc.disable()   # a caller that turned it off keeps it off
        (Tensor([1.0]) + 1).realize()
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.set_threshold(*old)
        gc.callbacks.remove(cb)
    np.testing.assert_allclose(x.numpy(), (np.arange(12.0).reshape(3, 4) * 2 + 1).sum(1))


def test_a_sweep_allocates_no_object_per_entry():
    """The sweep reads the table as two lists, not a (key, value) tuple per entry: 16k tuples per sweep started garbage
    collections (a full one, 0.3 s with torch imported, every few sweeps)."""
    phases: list[str] = []
    cb = lambda phase, info: phases.append(phase)   # noqa: E731
    keep = [UOp.const(dtypes.int32, i) for i in range(20_000, 20_100)]
    for i in range(30_000): UOp.const(dtypes.float32, float(i) + 0.5)   # dead at once
    old = gc.get_threshold()
    gc.callbacks.append(cb)
    try:
        gc.set_threshold(100)   # a tuple per entry: hundreds of collections
        ir_ops._sweep(whole=True)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(cb)
    assert len(phases) <= 2 * 4, phases
    assert all(UOp.const(dtypes.int32, 20_000 + i) is k for i, k in enumerate(keep))


def test_ops_members_are_plain_class_attributes():
    # `Ops.X` is looked up hundreds of thousands of times per model call: no Python-level hook on the class's
    # attribute lookup (enum.EnumType's __getattr__ made each one a Python call on Python 3.11)
    for klass in type(Ops).__mro__:
        assert "__getattr__" not in vars(klass) and ("__getattribute__" not in vars(klass) or klass is type
                                                     or klass is object)
    assert vars(Ops)["ADD"] is Ops.ADD


def test_ops_behaves_as_an_enumeration():
    import copy
    import pickle
    members = list(Ops)
    assert len(members) == len(Ops) == len({m.name for m in members}) and members[0] is Ops.SINK
    assert [m.value for m in members] == list(range(1, len(members) + 1))   # numbered in order, as enum.auto()
    for m in members:
        assert isinstance(m, Ops) and m in Ops and Ops[m.name] is m and Ops(m.value) is m and Ops(m) is m
        assert getattr(Ops, m.name) is m and repr(m) == str(m) == f"Ops.{m.name}"
        assert pickle.loads(pickle.dumps(m)) is m and copy.copy(m) is m and copy.deepcopy(m) is m
    assert {Ops.ADD: 1}[Ops.ADD] == 1 and Ops.ADD is not Ops.MUL and Ops.ADD != Ops.MUL
    with pytest.raises(ValueError, match="not a valid Ops"): Ops(10 ** 6)
    with pytest.raises(KeyError): Ops["NOT_AN_OP"]
    with pytest.raises(AttributeError, match="reassign"): Ops.ADD = Ops.MUL
    with pytest.raises(AttributeError, match="delete"): del Ops.ADD
    with pytest.raises(AttributeError, match="read-only"): Ops.ADD.name = "MUL"
    assert Ops.ADD.name == "ADD"
