"""TinyJit: capture/replay correctness and every misuse either works or raises JitError (never a silent wrong result)."""
import numpy as np
import pytest

from fusegrad import Context, GlobalCounters, Tensor, TinyJit
from fusegrad.engine.jit import JitError


def rnd(*shape):
    return np.random.rand(*shape).astype(np.float32)


def test_replay_matches_eager_and_outputs_are_fresh():
    w = Tensor(rnd(4, 4)).realize()

    @TinyJit
    def f(x): return (x @ w + 1).relu().realize()
    got = []
    for _ in range(5):
        x = rnd(3, 4)
        got.append((f(Tensor(x)), x))
    assert f.cnt == 5 and f.captured is not None
    for o, x in got:  # every returned tensor still holds its own call's result
        np.testing.assert_allclose(o.numpy(), np.maximum(x @ w.numpy() + 1, 0), rtol=1e-5, atol=1e-6)


@Context(JIT_VERIFY=0)   # counts a replay's kernels: a verified replay runs the eager call too
def test_replay_runs_only_captured_kernels():
    @TinyJit
    def f(a, b): return ((a + b) * 2).sum(1).realize()
    for _ in range(2): f(Tensor(rnd(8, 8)), Tensor(rnd(8, 8)))
    a, b = rnd(8, 8), rnd(8, 8)
    GlobalCounters.reset()
    out = f(Tensor(a), Tensor(b))
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_allclose(out.numpy(), ((a + b) * 2).sum(1), rtol=1e-5)


def test_shape_dtype_device_count_mismatch_raise():
    @TinyJit
    def f(x): return (x * 2).realize()
    for _ in range(3): f(Tensor(rnd(2, 3)))
    with pytest.raises(JitError, match="inputs changed"): f(Tensor(rnd(3, 3)))
    with pytest.raises(JitError, match="inputs changed"): f(Tensor(np.ones((2, 3), np.int32)))
    with pytest.raises(JitError, match="inputs changed"): f(Tensor(rnd(2, 3), device="PYTHON"))
    with pytest.raises(JitError, match="inputs changed"): f(Tensor(rnd(2, 3)), Tensor(rnd(2, 3)))


def test_item_inside_capture_raises():
    @TinyJit
    def f(x): return Tensor([float((x * 2).sum().item())])
    f(Tensor([1.0]))  # the first call runs normally
    with pytest.raises(JitError, match="frozen"): f(Tensor([1.0]))


def test_changed_python_argument_raises():
    @TinyJit
    def f(x, k): return (x * k).realize()
    f(Tensor([1.0]), 2)
    f(Tensor([1.0]), 2)
    assert f(Tensor([3.0]), 2).tolist() == [6.0]
    with pytest.raises(JitError, match="non-Tensor arguments"): f(Tensor([1.0]), 3)


def test_returning_python_value_raises():
    @TinyJit
    def f(x): return 3
    f(Tensor([1.0]))
    with pytest.raises(JitError, match="must return Tensors"): f(Tensor([1.0]))


def test_duplicate_input_buffer_raises():
    @TinyJit
    def f(a, b): return (a + b).realize()
    x = Tensor([1.0]).realize()
    f(x, Tensor([2.0]))
    with pytest.raises(JitError, match="twice"): f(x, x)


def test_state_and_rng_advance_on_replay():
    p = Tensor([0.0, 0.0]).realize()

    @TinyJit
    def step(x):
        p.assign(p + x)
        return (p * 1).realize(), Tensor.rand(2)
    draws = []
    for i in range(5):
        out, r = step(Tensor([1.0, 2.0]))
        assert out.tolist() == [i + 1.0, 2.0 * (i + 1)]
        draws.append(tuple(r.tolist()))
    assert p.tolist() == [5.0, 10.0]
    assert len(set(draws)) == 5  # a new random draw every call


def test_nested_jit_raises():
    @TinyJit
    def inner(x): return (x + 1).realize()

    @TinyJit
    def outer(x): return inner(x)
    outer(Tensor([1.0]))
    with pytest.raises(JitError, match="nested"): outer(Tensor([1.0]))


def test_methods_get_one_capture_per_instance():
    class M:
        def __init__(self, k): self.k = Tensor([k]).realize()

        @TinyJit
        def __call__(self, x): return (x * self.k).realize()
    a, b = M(2.0), M(3.0)
    for _ in range(3):
        assert a(Tensor([1.0])).tolist() == [2.0]
        assert b(Tensor([1.0])).tolist() == [3.0]


def test_reset_recaptures():
    @TinyJit
    def f(x): return (x + 1).realize()
    for _ in range(3): f(Tensor(rnd(2)))
    f.reset()
    assert f(Tensor(rnd(3))).shape == (3,)


def test_jit_disabled_runs_function():
    from fusegrad import Context
    calls = []

    @TinyJit
    def f(x):
        calls.append(1)
        return (x + 1).realize()
    with Context(JIT=0):
        for _ in range(3): f(Tensor([1.0]))
    assert len(calls) == 3


def test_symbolic_length_replays_the_same_kernels():
    from fusegrad import Variable
    from fusegrad.engine import realize
    n = Variable("n", 1, 16)
    xn, wn = rnd(16, 4), rnd(4, 3)
    x, w = Tensor(xn).realize(), Tensor(wn).realize()

    @TinyJit
    def f(a): return ((a @ w).relu() * 2).sum(1).realize()
    before = len(realize._programs)
    outs = []
    for k in (3, 5, 7, 2, 16):   # call 1 runs, call 2 captures, the rest replay with new lengths
        outs.append((k, f(x[:n.bind(k)])))
    assert f.cnt == 5 and f.captured is not None
    compiled = len(realize._programs) - before
    for k, o in outs:
        assert o.shape[0].unbind() == (n, k)
        np.testing.assert_allclose(o.numpy(), (np.maximum(xn[:k] @ wn, 0) * 2).sum(1), rtol=1e-5, atol=1e-5)
    f(x[:n.bind(11)])
    assert len(realize._programs) - before == compiled, "a new length compiled a new kernel"
    with pytest.raises(JitError, match="inputs changed"): f(x[:4])   # a static shape the variable doesn't explain


def test_symbolic_bound_variable_argument():
    from fusegrad import Variable
    n = Variable("n", 1, 8)
    xn = rnd(8, 2)
    x = Tensor(xn).realize()

    @TinyJit
    def f(a, b): return (a[:b] + 1).sum(0).realize()
    for k in (2, 4, 6, 8):
        np.testing.assert_allclose(f(x, n.bind(k)).numpy(), (xn[:k] + 1).sum(0), rtol=1e-5)
    assert f.cnt == 4


def test_symbolic_kv_cache_decode_step():
    """A decode step that writes the cache at a symbolic position and attends over the first pos+1 entries."""
    from fusegrad import Variable
    from fusegrad.engine import realize
    L, D = 12, 4
    cache = Tensor.zeros(L, D).contiguous().realize()
    pos_var = Variable("start_pos", 0, L - 1)
    wn = rnd(D, D)
    w = Tensor(wn).realize()

    @TinyJit
    def step(x, pos):
        cache[pos:pos + 1] = x @ w
        keys = cache[:pos + 1]
        return ((x @ keys.T).softmax(-1) @ keys).realize()
    xs = rnd(L, 1, D)
    ref_cache = np.zeros((L, D), np.float32)
    for p in range(8):
        if p == 3: compiled = len(realize._programs)
        out = step(Tensor(xs[p]), pos_var.bind(p))
        ref_cache[p] = xs[p] @ wn
        s = xs[p] @ ref_cache[:p + 1].T
        a = np.exp(s - s.max())
        np.testing.assert_allclose(out.numpy(), (a / a.sum()) @ ref_cache[:p + 1], rtol=1e-5, atol=1e-5)
    assert step.cnt == 8 and len(realize._programs) == compiled   # replays compile nothing
    np.testing.assert_allclose(cache.numpy(), ref_cache, rtol=1e-5, atol=1e-6)


# ----- TinyJit(verify=N) / JIT_VERIFY=N: replays checked against the eager call -----

def test_verify_raises_on_a_function_that_depends_on_python_state():
    k = [0]
    def f(x):
        k[0] += 1
        return (x * k[0]).realize()
    jit = TinyJit(f, verify=2)
    x = Tensor([1.0, 2.0]).realize()
    jit(x); jit(x)
    with pytest.raises(JitError, match=r"verify \(replay 1\): output 0 differs"): jit(x)


def test_verify_names_the_state_tensor_that_differs():
    w = Tensor([0.0, 0.0]).realize()
    k = [0]
    def f(x):
        k[0] += 1
        w.assign(w + k[0])
        return (x + 1).realize()
    jit = TinyJit(f, verify=1)
    x = Tensor([1.0, 2.0]).realize()
    jit(x); jit(x)
    with pytest.raises(JitError, match=r"state tensor 0 \(2,\) written in place differs"): jit(x)


def test_verify_passes_a_training_step_and_leaves_the_eager_state():
    """A train step (BatchNorm running stats, Adam state, sampling on the device) verified on every replay: the same
    losses and weights as without TinyJit. (It also caught a stale cache entry: a loss realized as a reader of the
    weights the step overwrites was cached as a snapshot, so the verifying eager call read an old loss.)"""
    from fusegrad import nn
    def run(jit: bool, verify: int) -> tuple[list[float], list[float]]:
        Tensor.manual_seed(2)
        X = Tensor(np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32))
        Y = (X.sum(1) > 0).cast("int32")
        lin, bn = nn.Linear(3, 4), nn.BatchNorm(4)
        opt = nn.optim.Adam(nn.state.get_parameters([lin, bn]), lr=0.05)
        def step():
            with Tensor.train():
                opt.zero_grad()
                i = Tensor.randint(8, high=32)
                loss = bn(lin(X[i])).sparse_categorical_crossentropy(Y[i]).backward()
                return loss.realize(*opt.schedule_step())
        f = TinyJit(step, verify=verify) if jit else step
        losses = [f().item() for _ in range(6)]
        return losses, lin.weight.flatten().tolist() + bn.running_mean.tolist()
    (l1, w1), (l2, w2) = run(False, 0), run(True, 10)
    np.testing.assert_allclose(l2, l1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w2, w1, rtol=1e-5, atol=1e-6)


def test_jit_verify_flag():
    k = [0]
    def f(x):
        k[0] += 1
        return (x * k[0]).realize()
    with Context(JIT_VERIFY=1):
        jit = TinyJit(f)
        x = Tensor([1.0]).realize()
        jit(x); jit(x)
        with pytest.raises(JitError, match="verify"): jit(x)
