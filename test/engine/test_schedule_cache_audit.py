"""Audit of the schedule cache (schedule/cache.py) and the relayout reuse (storage.py relayout_get/put): programs that
repeat one graph structure while the memory under it changes (writes through views, shared memory, TinyJit, optimizer
steps, DISK, several devices, bound variables, RNG, flags) give what NumPy / torch doing the same steps give, and what
the same program gives with SCHEDULE_CACHE=0. AUDIT_EXAMPLES raises the number of hypothesis examples."""
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusegrad import Context, Tensor, TinyJit, Variable, dtypes
from fusegrad.schedule.cache import schedule_cache

N_EXAMPLES = int(os.environ.get("AUDIT_EXAMPLES", "40"))
D2 = ("CPU", "CPU:1")
rng = np.random.default_rng(0)


def rand(*shape):
    return rng.standard_normal(shape, dtype=np.float32)


def ints(*shape, lo=-4, hi=5):
    """Small integers as float32: sums and products stay exact, so results compare exactly."""
    return rng.integers(lo, hi, shape).astype(np.float32)


# ----- property test: one set of graph structures over changing memory -----

def _compute(kind, a, b):
    """The same graph structures, over our tensors or NumPy arrays (exact for small integers)."""
    if kind == "axpy": return a * 2 + b
    if kind == "relayout": return a.T.contiguous() if isinstance(a, Tensor) else a.T.copy()
    if kind == "relayout_add": return (a.T.contiguous() if isinstance(a, Tensor) else a.T.copy()) + b.T
    if kind == "sum": return (a + b).sum(1)
    if kind == "matmul": return a @ b.T
    if kind == "self": return a * a + a   # one buffer read twice
    raise AssertionError(kind)


def _view(t, n, kind, k):
    """The same view of our tensor and of its NumPy mirror (both write through to their base)."""
    if kind == "row": return t[k % 3], n[k % 3]
    if kind == "col": return t[:, k % 4], n[:, k % 4]
    if kind == "slice": return t[1:], n[1:]
    if kind == "T": return t.T, n.T
    if kind == "flat": return t.reshape(12), n.reshape(12)
    if kind == "detach": return t.detach(), n
    if kind == "step": return t[::2], n[::2]
    raise AssertionError(kind)


structures = ["axpy", "relayout", "relayout_add", "sum", "matmul", "self"]
step_st = st.one_of(
    st.tuples(st.just("compute"), st.integers(0, 2), st.integers(0, 2), st.sampled_from(structures), st.booleans()),
    st.tuples(st.just("write"), st.integers(0, 2), st.sampled_from(["row", "col", "slice", "T", "flat", "detach",
                                                                    "step", "whole"]),
              st.sampled_from(["assign", "iadd", "setitem"]), st.integers(-3, 3)),
    st.tuples(st.just("bitcast"), st.integers(0, 2), st.integers(0, 2), st.just(""), st.integers(-3, 3)),
    st.tuples(st.just("off"), st.integers(0, 2), st.integers(0, 2), st.sampled_from(structures), st.booleans()),
    st.tuples(st.just("realize"), st.integers(0, 99), st.just(0), st.just(""), st.booleans()),
)


def _write(t, n, view, how, k):
    if view != "whole": t, n = _view(t, n, view, k)
    if how == "assign":
        t.assign(t * 2 - k).realize() if k % 2 else t.assign(t * 2 - k)
        n[...] = n * 2 - k
    elif how == "iadd":
        t += k
        n += k
    else:
        t[0] = float(k)
        n[0] = k


@settings(max_examples=N_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step_st, min_size=1, max_size=12))
def test_property_interleaved_writes_and_repeated_structures(steps):
    """Random interleavings of the same structures over three tensors (cache hits on other buffers), writes through
    views between them, bitcast writes, and the same structure scheduled with the cache off."""
    start = [ints(3, 4) for _ in range(3)]
    pool = [Tensor(a).contiguous().realize() for a in start]
    mirror = [a.copy() for a in start]
    reads = []   # (our lazy or realized tensor, NumPy's value at the time it was built)
    for op, i, j, kind, flag in steps:
        if op == "compute":
            t = _compute(kind, pool[i], pool[j])
            if flag: t.realize()
            reads.append((t, _compute(kind, mirror[i], mirror[j]).copy()))
        elif op == "write":
            _write(pool[i], mirror[i], j, kind, flag)
        elif op == "bitcast":   # float bits written through an int32 view of the same memory
            val = np.full((3, 4), float(flag), np.float32)
            pool[i].bitcast(dtypes.int32).assign(Tensor(val.view(np.int32))).realize()
            mirror[i][...] = val
        elif op == "off":
            on = _compute(kind, pool[i], pool[j]).numpy()
            with Context(SCHEDULE_CACHE=0): off = _compute(kind, pool[i], pool[j]).numpy()
            np.testing.assert_array_equal(on, off)
            np.testing.assert_array_equal(on, _compute(kind, mirror[i], mirror[j]))
        elif op == "realize" and reads:
            reads[i % len(reads)][0].realize()
    for t, n in reads: np.testing.assert_array_equal(t.numpy(), n)
    for t, n in zip(pool, mirror): np.testing.assert_array_equal(t.numpy(), n)


dtype_pairs = [(dtypes.float32, np.float32), (dtypes.int32, np.int32), (dtypes.float16, np.float16),
               (dtypes.int8, np.int8), (dtypes.uint8, np.uint8), (dtypes.int64, np.int64)]


@settings(max_examples=N_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(range(len(dtype_pairs))), st.integers(-3, 3)), min_size=1, max_size=8))
def test_property_same_shapes_other_dtypes(seq):
    """The same structure in several dtypes (the key holds each node's dtype): exact against NumPy."""
    for d, k in seq:
        dt, nt = dtype_pairs[d]
        a = (np.arange(12) % 5 + (k if nt is not np.uint8 else abs(k))).astype(nt).reshape(3, 4)
        b = (np.arange(12)[::-1] % 3).astype(nt).reshape(3, 4)
        got = (Tensor(a) * 2 + Tensor(b).T.contiguous().T).sum(1)
        want = (a * nt(2) + b).sum(1)   # (small values: no overflow in any accumulator dtype)
        np.testing.assert_array_equal(got.numpy(), want)
        assert (Tensor(a) * 2 + Tensor(b)).dtype == dt


# ----- targeted -----

def test_realize_write_input_realize_again():
    a, b = ints(4, 5), ints(4, 5)
    ta, tb = Tensor(a).contiguous().realize(), Tensor(b).contiguous().realize()
    for k in range(4):
        r = ((ta * tb).sum(0) + ta[0]).numpy()
        np.testing.assert_array_equal(r, (a * b).sum(0) + a[0])
        ta[k % 4] = float(k + 1)
        a[k % 4] = k + 1
        tb.T[1:3] += 2.0
        b.T[1:3] += 2
    with Context(SCHEDULE_CACHE=0): np.testing.assert_array_equal(((ta * tb).sum(0) + ta[0]).numpy(),
                                                                  (a * b).sum(0) + a[0])


def test_two_tensors_sharing_memory():
    base = Tensor(ints(8)).contiguous().realize()
    n = base.numpy().copy()
    lo, hi = base[:4], base[4:]
    for k in range(3):
        np.testing.assert_array_equal((lo * 3 + hi).numpy(), n[:4] * 3 + n[4:])
        np.testing.assert_array_equal(lo.reshape(2, 2).T.contiguous().numpy(), n[:4].reshape(2, 2).T)
        hi += float(k)
        n[4:] += k
        base.reshape(2, 4)[0, 1] = -float(k)
        n[1] = -k
    np.testing.assert_array_equal(base.numpy(), n)


def test_relayout_reused_then_written_through_views():
    wn = ints(3, 4)
    w = Tensor(wn).contiguous().realize()
    for k, write in enumerate([lambda t: t.__setitem__(1, 7.0), lambda t: t.T[2].assign(Tensor.ones(3)).realize(),
                               lambda t: t.detach().reshape(12)[5:7].assign(Tensor([3.0, 4.0])).realize(),
                               lambda t: t.bitcast(dtypes.int32)[0].assign(Tensor(np.full(4, 9.0, np.float32)
                                                                                  .view(np.int32))).realize()]):
        c1 = w.T.contiguous().realize()
        c2 = w.T.contiguous().realize()            # served from the relayout cache
        np.testing.assert_array_equal(c2.numpy(), wn.T)
        write(w)
        [lambda n: n.__setitem__(1, 7.0), lambda n: n.T.__setitem__(2, 1.0),
         lambda n: n.reshape(12).__setitem__(slice(5, 7), [3.0, 4.0]), lambda n: n.__setitem__(0, 9.0)][k](wn)
        np.testing.assert_array_equal(w.T.contiguous().numpy(), wn.T)
        np.testing.assert_array_equal(c1.numpy(), c2.numpy())   # earlier copies keep their value


def _conv_train(opt_name, steps, x, y, w0, b0):
    from fusegrad.nn import Conv2d, optim
    conv = Conv2d(3, 4, 3)
    conv.weight.assign(Tensor(w0)).realize()
    conv.bias.assign(Tensor(b0)).realize()
    params = [conv.weight, conv.bias]
    opt = optim.SGD(params, lr=0.05, momentum=0.9) if opt_name == "sgd" else optim.Adam(params, lr=0.01)
    losses = []
    with Tensor.train():
        for _ in range(steps):
            opt.zero_grad()
            out = conv(Tensor(x)).relu()
            loss = ((out.mean((2, 3)) - Tensor(y)) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            conv(Tensor(x)).realize()   # an eager forward between steps: the weight's relayout is reused
    return losses, conv.weight.numpy()


def _conv_train_torch(opt_name, steps, x, y, w0, b0):
    conv = torch.nn.Conv2d(3, 4, 3)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(w0))
        conv.bias.copy_(torch.tensor(b0))
    opt = torch.optim.SGD(conv.parameters(), lr=0.05, momentum=0.9) if opt_name == "sgd" else \
        torch.optim.Adam(conv.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((conv(torch.tensor(x)).relu().mean((2, 3)) - torch.tensor(y)) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, conv.weight.detach().numpy()


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_conv_weight_relayout_across_optimizer_steps(opt_name):
    x, y, w0, b0 = rand(2, 3, 7, 7), rand(2, 4), rand(4, 3, 3, 3) * 0.3, rand(4) * 0.1
    on, w_on = _conv_train(opt_name, 5, x, y, w0, b0)
    with Context(SCHEDULE_CACHE=0): off, w_off = _conv_train(opt_name, 5, x, y, w0, b0)
    ref, w_ref = _conv_train_torch(opt_name, 5, x, y, w0, b0)
    np.testing.assert_allclose(on, off, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w_on, w_off, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(on, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w_on, w_ref, rtol=1e-4, atol=1e-5)
    assert len(set(on)) == len(on)   # the steps changed the weight


def test_tinyjit_capture_then_eager_same_structure():
    wn = rand(4, 3, 3, 3)
    w = Tensor(wn).contiguous().realize()
    f = TinyJit(lambda t: (t.conv2d(w) * 2).realize())
    for k in range(6):
        x = rand(1, 3, 6, 6)
        got = f(Tensor(x)).numpy()
        eager = (Tensor(x).conv2d(w) * 2).numpy()   # the structure the capture scheduled, run eagerly
        ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(wn)).numpy() * 2
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(eager, ref, rtol=1e-4, atol=1e-4)
        if k % 2:
            w += 0.5
            wn = wn + 0.5


def test_tinyjit_replay_runs_a_pending_write_first():
    # bug: `w += 0.5` on a closure tensor is lazy; a replay ran the captured kernels on w's buffer without running the
    # pending write, so every other call used the old weight (with or without the schedule cache)
    wn = rand(6, 4)
    w = Tensor(wn).contiguous().realize()
    f = TinyJit(lambda t: (t @ w.T).realize())
    for _ in range(5):
        x = rand(3, 4)
        np.testing.assert_allclose(f(Tensor(x)).numpy(), (torch.tensor(x) @ torch.tensor(wn).T).numpy(), rtol=1e-5,
                                   atol=1e-5)
        w += 0.5                                    # pending until something realizes it
        wn = wn + 0.5


def test_tinyjit_writes_weight_eager_reads_between():
    wn = ints(3, 4)
    w = Tensor(wn).contiguous().realize()

    @TinyJit
    def step(x):
        out = (x @ w.T.contiguous()).realize()
        w.assign(w + 1.0).realize()
        return out
    for _ in range(5):
        x = ints(2, 4)
        np.testing.assert_array_equal(step(Tensor(x)).numpy(), x @ wn.T)
        wn = wn + 1
        np.testing.assert_array_equal((Tensor(x) @ w.T.contiguous()).numpy(), x @ wn.T)
        np.testing.assert_array_equal(w.T.contiguous().numpy(), wn.T)


def test_bound_variables_several_values():
    n = ints(10, 3)
    base = Tensor(n).contiguous().realize()
    v = Variable("i", 1, 10)
    for i in [3, 7, 3, 10, 1, 7]:
        np.testing.assert_array_equal((base[:v.bind(i)] * 2).sum(0).numpy(), (n[:i] * 2).sum(0))
        np.testing.assert_array_equal(base[:v.bind(i)].T.contiguous().sum(1).numpy(), n[:i].T.sum(1))
        np.testing.assert_array_equal(base[v.bind(i) - 1:v.bind(i)].T.contiguous().numpy(), n[i - 1:i].T)
        base[i - 1] = float(i)
        n[i - 1] = i


def test_sharded_computed_twice_with_other_data():
    for _ in range(3):
        a, b = ints(4, 6), ints(4, 6)
        sa, sb = Tensor(a).shard(D2, axis=0), Tensor(b).shard(D2, axis=0)
        np.testing.assert_array_equal((sa * 2 + sb).sum(1).numpy(), (a * 2 + b).sum(1))
    s = Tensor(ints(4, 2)).shard(D2, axis=0).realize()
    for k in range(3):
        first = (s * 3).numpy()
        s.assign(Tensor(np.full((4, 2), float(k), np.float32)).shard(D2, axis=0)).realize()
        np.testing.assert_array_equal((s * 3).numpy(), np.full((4, 2), 3.0 * k, np.float32))
        assert not np.array_equal(first, (s * 3).numpy()) or k == 0


def test_disk_read_twice_after_write(tmp_path):
    fn = tmp_path / "audit.bin"
    x = ints(4, 5)
    d = Tensor(x).to(f"disk:{fn}").realize()
    for k in range(3):
        np.testing.assert_array_equal((d.to("CPU") * 2 + 1).numpy(), x * 2 + 1)
        x = ints(4, 5)
        d.assign(Tensor(x)).realize()
        np.testing.assert_array_equal((d.to("CPU") * 2 + 1).numpy(), x * 2 + 1)
        e = Tensor.empty(4, 5, dtype=dtypes.float32, device=f"disk:{fn}")
        np.testing.assert_array_equal(e.to("CPU").T.contiguous().numpy(), x.T)


def test_rand_twice_differs_and_matches_cache_off():
    def draws():
        Tensor.manual_seed(7)
        return [Tensor.rand(3, 4).numpy(), Tensor.rand(3, 4).numpy(), (Tensor.rand(3, 4) * 2).numpy(),
                (Tensor.rand(3, 4) * 2).numpy()]
    on = draws()
    with Context(SCHEDULE_CACHE=0): off = draws()
    for a, b in zip(on, off): np.testing.assert_array_equal(a, b)
    assert not np.array_equal(on[0], on[1]) and not np.array_equal(on[2], on[3])


def test_training_and_no_grad_flips():
    x = Tensor(np.ones((64, 64), np.float32))
    Tensor.manual_seed(1)
    with Tensor.train(): a = x.dropout(0.5).numpy()
    b = x.dropout(0.5).numpy()
    with Tensor.train(): c = x.dropout(0.5).numpy()
    assert 0.3 < (a == 0).mean() < 0.7 and (b == 1).all() and not np.array_equal(a, c)
    w = Tensor(ints(3, 3), requires_grad=True)
    for ng in [False, True, False]:
        Tensor.no_grad = ng
        try: out = (w.T.contiguous() * 2).sum()
        finally: Tensor.no_grad = False
        assert out.item() == w.numpy().sum() * 2
        if not ng:
            out.backward()
            np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 3), 2.0, np.float32))
            w.grad = None


def test_cache_actually_hits():
    # the audit above is only meaningful if the structures repeat: check that a repeat is a hit
    a, b = Tensor(ints(3, 4)).realize(), Tensor(ints(3, 4)).realize()
    (a * 2 + b).realize()
    before = schedule_cache.hits
    (b * 2 + a).realize()
    assert schedule_cache.hits > before


def test_tinyjit_replay_write_keeps_old_value_of_earlier_lazy_reads():
    # bug: a replay that writes memory in place left lazy tensors built before it reading that memory, so they were
    # computed from the new contents (the eager call's realize keeps their old value, as torch does)
    wn = np.arange(6, dtype=np.float32)
    w = Tensor(wn).contiguous().realize()

    @TinyJit
    def step(x):
        w.assign(w + x).realize()
        return (w * 1).realize()
    for _ in range(4):
        before = w * 10                             # built before the step: torch would hold its value already
        step(Tensor(np.ones(6, np.float32)))
        np.testing.assert_array_equal(before.numpy(), wn * 10)
        wn = wn + 1


def test_tinyjit_replay_keeps_old_values_of_a_tensor_made_lazy_after_a_replay_saw_it_realized():
    # views.realize_readers remembers the node of a tensor it found to be a plain buffer view (`_settled`) and skips
    # it while the node is the same: a tensor that becomes lazy again afterwards (an assign, a replace) has another
    # node, so the next replay still realizes it first and it keeps the value it was built with
    wn = np.arange(6, dtype=np.float32)
    w = Tensor(wn).contiguous().realize()
    held = Tensor(np.zeros(6, np.float32)).contiguous().realize()   # realized: the replays below settle it

    @TinyJit
    def step(x):
        w.assign(w + x).realize()
        return (w * 1).realize()
    for i in range(5):
        step(Tensor(np.ones(6, np.float32)))
        wn = wn + 1
        if i % 2: held.assign(w * 10)                 # lazy again, reading w, which the next replay writes
        else: held.replace(w * 10)
        step(Tensor(np.ones(6, np.float32)))
        np.testing.assert_array_equal(held.numpy(), wn * 10)
        wn = wn + 1
