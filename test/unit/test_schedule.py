"""Scheduler: how many kernels a program becomes, that realized results are reused, and memory planning."""
import numpy as np
import pytest

from fusegrad import GlobalCounters, Tensor
from fusegrad.engine.realize import run_schedule
from fusegrad.ir.ops import Ops
from fusegrad.schedule import create_schedule
from fusegrad.tensor import buffers

N = 8
rng = np.random.default_rng(1)
A_NP = rng.standard_normal((N, N)).astype(np.float32)
B_NP = rng.standard_normal((N, N)).astype(np.float32)
BIAS_NP = rng.standard_normal((N,)).astype(np.float32)


@pytest.fixture
def inputs():
    """Realized inputs (built from numpy), so only the computation under test is counted."""
    return Tensor(A_NP), Tensor(B_NP), Tensor(BIAS_NP)


def run_counted(*ts: Tensor) -> tuple[int, list[np.ndarray]]:
    GlobalCounters.reset()
    ts[0].realize(*ts[1:])
    kernels = GlobalCounters.kernel_count
    return kernels, [t.numpy() for t in ts]


def close(a, b): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def count_reduces(items) -> int:
    return sum(1 for si in items if not si.is_copy for n in si.ast.toposort() if n.op is Ops.REDUCE)


# ----- fusion ----------------------------------------------------------------------------------------------------------

def test_broadcast_multiply_sum_is_one_kernel(inputs):
    a, b, _ = inputs
    k, (out,) = run_counted((a.reshape(N, 1, N) * b.T.reshape(1, N, N)).sum(axis=2))
    assert k == 1
    close(out, A_NP @ B_NP)


def test_matmul_bias_relu_is_one_kernel(inputs):
    a, b, bias = inputs
    k, (out,) = run_counted((a @ b + bias).relu())
    assert k == 1
    close(out, np.maximum(A_NP @ B_NP + BIAS_NP, 0))


def test_softmax_is_at_most_two_kernels(inputs):
    x, _, _ = inputs
    e = (x - x.max(1, keepdim=True)).exp()
    k, (out,) = run_counted(e / e.sum(1, keepdim=True))
    assert k <= 2
    ref = np.exp(A_NP - A_NP.max(1, keepdims=True))
    close(out, ref / ref.sum(1, keepdims=True))


def test_softmax_is_one_kernel_today(inputs):
    x, _, _ = inputs
    e = (x - x.max(1, keepdim=True)).exp()
    assert len((e / e.sum(1, keepdim=True)).schedule()) == 1


def test_elementwise_chain_is_one_kernel(inputs):
    a, b, bias = inputs
    k, (out,) = run_counted((((a + 1) * 2 - b).exp() * bias * bias + 3).sqrt().maximum(b).reshape(N * N)[3:40])
    assert k == 1
    ref = np.maximum(np.sqrt(np.exp((A_NP + 1) * 2 - B_NP) * BIAS_NP * BIAS_NP + 3), B_NP).reshape(N * N)[3:40]
    close(out, ref)


def test_reduce_then_broadcast_over_reduced_axis_is_two_kernels(inputs):
    x, _, _ = inputs
    k, (out,) = run_counted(x - x.sum(0))
    assert k == 2
    close(out, A_NP - A_NP.sum(0))


def test_two_independent_reduces_fuse_in_one_output(inputs):
    a, b, _ = inputs
    k, (out,) = run_counted(a.sum(1) + b.max(1))
    assert k == 1
    close(out, A_NP.sum(1) + B_NP.max(1))


# ----- realized results are reused -------------------------------------------------------------------------------------

def test_realized_tensor_is_not_recomputed(inputs):
    a, _, _ = inputs
    b = (a + 1).realize()
    b_buf = buffers[b.uop.base]
    c = b * 2
    (si,) = c.schedule()
    assert "ADD" not in si.tensor_ops           # a+1 is not computed again...
    assert si.bufs[1] is b_buf and len(si.bufs) == 2  # ...its buffer is loaded
    assert sum(1 for n in si.ast.toposort() if n.op is Ops.LOAD) == 1
    k, (out,) = run_counted(c)
    assert k == 1
    close(out, (A_NP + 1) * 2)


def test_graph_built_before_realize_reads_the_result(inputs):
    a, _, _ = inputs
    b = (a + 1).exp()
    c = b * 2            # c's graph still holds b's lazy node
    k1, (bv,) = run_counted(b)
    (si,) = c.schedule()
    assert "EXP2" not in si.tensor_ops and si.bufs[1] is buffers[b.uop.base]
    k2, (cv,) = run_counted(c)
    assert (k1, k2) == (1, 1)
    close(bv, np.exp(A_NP + 1))
    close(cv, np.exp(A_NP + 1) * 2)


def test_shared_reduce_is_computed_once(inputs):
    x, _, _ = inputs
    s = x.sum(1)
    o1, o2 = s + 1, s * 2
    items, _ = create_schedule([o1.uop, o2.uop])
    assert count_reduces(items) == 1
    k, (v1, v2) = run_counted(o1, o2)
    assert k <= 3
    close(v1, A_NP.sum(1) + 1)
    close(v2, A_NP.sum(1) * 2)


def test_realizing_the_same_tensor_twice_runs_nothing(inputs):
    a, _, _ = inputs
    t = (a * 3).realize()
    k, (out,) = run_counted(t)
    assert k == 0
    close(out, A_NP * 3)


# ----- memory planning -------------------------------------------------------------------------------------------------

def root(buf):
    while buf.base is not None: buf = buf.base
    return buf


def assert_no_live_buffer_clobbered(items):
    """Every read sees the value written for it: no other write into the same memory between the write and the read."""
    writer: dict[int, tuple[int, object]] = {}  # id(root) -> (item index, buffer written)
    for i, si in enumerate(items):
        for b in si.bufs[1:]:
            if id(root(b)) in writer:
                assert writer[id(root(b))][1] is b, f"item {i} reads {b} but its memory was overwritten"
        writer[id(root(si.bufs[0]))] = (i, si.bufs[0])


def test_intermediates_with_disjoint_lifetimes_share_memory():
    x_np = rng.standard_normal((64,)).astype(np.float32)
    x = Tensor(x_np)
    t1 = (x + 1).contiguous()
    t2 = (t1 * 2).contiguous()
    t3 = (t2 + 3).contiguous()   # t1 is dead once t2 is written: t3 can live in t1's memory
    t4 = (t3 * 4).contiguous()   # and t4 in t2's
    out = t4 - 1
    items, results = create_schedule([out.uop])
    assert len(items) == 5
    w = [si.bufs[0] for si in items]
    assert root(w[2]) is root(w[0]) and root(w[3]) is root(w[1])
    assert root(w[0]) is not root(w[1])
    assert all(root(w[4]) is not root(b) for b in w[:4])  # the result the caller keeps is never shared
    assert_no_live_buffer_clobbered(items)
    run_schedule(items)
    got = np.frombuffer(buffers[results[out.uop].base].as_bytes(), dtype=np.float32)
    close(got, (((x_np + 1) * 2 + 3) * 4) - 1)


def test_intermediates_with_overlapping_lifetimes_do_not_share():
    x_np = rng.standard_normal((64,)).astype(np.float32)
    x = Tensor(x_np)
    t1 = (x + 1).contiguous()
    t2 = (t1 * 2).contiguous()
    t3 = (t2 + 3).contiguous()
    out = t3 * t1                # t1 lives until the end
    items, results = create_schedule([out.uop])
    w = [si.bufs[0] for si in items]
    assert root(w[2]) is not root(w[0])
    assert_no_live_buffer_clobbered(items)
    run_schedule(items)
    got = np.frombuffer(buffers[results[out.uop].base].as_bytes(), dtype=np.float32)
    close(got, ((x_np + 1) * 2 + 3) * (x_np + 1))


def test_memory_planned_program_through_tensor_api():
    x_np = rng.standard_normal((16, 16)).astype(np.float32)
    x = Tensor(x_np)
    h = x
    for i in range(6): h = (h @ x * 0.1 + i).contiguous()
    items = h.schedule()
    assert len({id(root(si.bufs[0])) for si in items}) < len(items)  # some memory is reused
    assert_no_live_buffer_clobbered(items)
    ref = x_np
    for i in range(6): ref = ref @ x_np * np.float32(0.1) + i
    np.testing.assert_allclose(h.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_conv_train_step_never_stores_a_broadcast_product():
    """A node a reduce re-reads is stored (recompute.py), but not one that is a broadcast: the unfold times the weight
    inside a conv, before its sum, is (N, Cout, H, W, Cin, kh, kw). beautiful_mnist's train step re-reads that product
    of its third conv from the pool's backward; storing it wrote 943M floats per step at batch 512 (1 s, 3.8 GB)."""
    from fusegrad import nn
    Tensor.manual_seed(0)
    layers = [nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32), Tensor.max_pool2d,
              nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, nn.BatchNorm(64), Tensor.max_pool2d,
              lambda x: x.flatten(1), nn.Linear(576, 10)]
    x, y = Tensor.randn(8, 1, 28, 28), Tensor.randint(8, high=10)
    with Tensor.train():
        loss = x.sequential(layers).sparse_categorical_crossentropy(y)
        loss.backward()
        items = Tensor.schedule(loss, *[t.grad for t in nn.state.get_parameters(layers) if t.grad is not None])
    biggest_activation = 8 * 32 * 24 * 24
    sizes = sorted(b.size for si in items for b in si.bufs[:1])
    assert sizes[-1] <= 4 * biggest_activation, sizes[-3:]


def test_optimizer_step_doesnt_compute_the_forward_twice():
    """From the second step on, the optimizer's writes overwrite weights that live lazy tensors still read: batchnorm's
    custom backward holds its input (the previous conv's activation) in a closure. Those tensors were pointed at copies
    of the old weights, a second graph that computed the convolutions again in the same schedule (beautiful_mnist's
    step: 164 kernels, 60.7 GFLOP, against 140 and 47 in its first step). Realized with the step instead (views.py),
    a later step does about the work of the first (copies of small weights that closures hold remain)."""
    from fusegrad import GlobalCounters, nn
    from fusegrad.nn.optim import Adam
    Tensor.manual_seed(0)
    layers = [nn.Conv2d(1, 8, 3), Tensor.relu, nn.BatchNorm(8), Tensor.max_pool2d, lambda x: x.flatten(1),
              nn.Linear(8 * 13 * 13, 10)]
    opt = Adam(nn.state.get_parameters(layers))
    X, Y = Tensor.randn(16, 1, 28, 28).realize(), Tensor.randint(16, high=10).realize()
    ops, losses = [], []
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad()
            loss = X.sequential(layers).sparse_categorical_crossentropy(Y).backward()
            GlobalCounters.reset()
            losses.append(loss.realize(*opt.schedule_step()).item())
            ops.append(GlobalCounters.global_ops)
    assert ops[1] <= ops[0] * 1.1 and ops[2] <= ops[0] * 1.1, ops   # (without: 1.5x)
    assert losses[2] < losses[0]


def test_reader_computed_by_the_realize_keeps_its_value_and_views():
    # a lazy tensor (and its view) that a graph being realized computes, reading memory the same realize overwrites
    import torch
    w, rw = Tensor([1.0, 2.0, 3.0]).contiguous().realize(), torch.tensor([1.0, 2.0, 3.0])
    a, ra = w * 2, rw * 2
    v, rv = a.reshape(3, 1), ra.reshape(3, 1)
    total, rtotal = a.sum() + 1, ra.sum() + 1
    w.assign(w + 10)
    rw.add_(10)
    Tensor.realize(total, w)
    np.testing.assert_array_equal(total.numpy(), rtotal.numpy())
    np.testing.assert_array_equal(a.numpy(), ra.numpy())
    np.testing.assert_array_equal(v.numpy(), rv.numpy())
    np.testing.assert_array_equal(w.numpy(), rw.numpy())
    np.testing.assert_array_equal((a + w).numpy(), (ra + rw).numpy())


def test_eager_train_steps_hit_the_schedule_cache():
    # the optimizer step's snapshot targets came in the order of the live-tensor set (memory addresses), so the
    # schedule cache's key changed every step and each eager step was scheduled from scratch. (Initialization is lazy:
    # step 0 computes the parameters, and step 1 still snapshots the RNG state that step 0's activations, kept by
    # BatchNorm's backward, read; from step 2 on every step has one structure.)
    from fusegrad import nn
    from fusegrad.nn.optim import Adam
    from fusegrad.schedule.cache import schedule_cache
    Tensor.manual_seed(0)
    layers = [nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32), Tensor.max_pool2d,
              nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, nn.BatchNorm(64), Tensor.max_pool2d,
              lambda x: x.flatten(1), nn.Linear(576, 10)]
    opt = Adam(nn.state.get_parameters(layers))
    X, Y = Tensor.randn(32, 1, 28, 28).realize(), Tensor.randint(32, high=10).realize()
    misses = []
    with Tensor.train():
        for _ in range(6):
            m = schedule_cache.misses
            opt.zero_grad()
            idx = Tensor.randint(4, high=32)
            X[idx].sequential(layers).sparse_categorical_crossentropy(Y[idx]).backward().realize(*opt.schedule_step())
            misses.append(schedule_cache.misses - m)
    assert misses[3:] == [0, 0, 0], misses
