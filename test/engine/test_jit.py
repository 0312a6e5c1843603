"""TinyJit: capture/replay correctness and every misuse either works or raises JitError (never a silent wrong result)."""
import numpy as np
import pytest

from fusegrad import GlobalCounters, Tensor, TinyJit
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
    with pytest.raises(JitError, match="non-Tensor arguments changed"): f(Tensor([1.0]), 3)


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
