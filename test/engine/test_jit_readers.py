"""Tensors built before a TinyJit call that writes memory in place keep the value they had when built (lazy ones are
computed before the replay overwrites what they read), while views of that memory see the write -- exactly what
PyTorch eager does with the same steps. A hypothesis program mixes jitted steps (which update state in place),
eager writes, lazy reads, views and reads, and compares every read with torch. JIT_READERS_EXAMPLES raises the number
of programs (default 40)."""
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad import Tensor, TinyJit

N = 6


def _adder():
    """A state tensor w = arange(N) and a jitted step adding its input to w in place."""
    w = Tensor(np.arange(N, dtype=np.float32)).contiguous().realize()

    @TinyJit
    def step(x):
        w.assign(w + x).realize()
        return (w * 1).realize()
    return w, step


def test_lazy_read_before_replay_keeps_its_value():
    w, step = _adder()
    expect = np.arange(N, dtype=np.float32)
    for _ in range(5):
        before, total = w * 10, w.sum()   # lazy: built before the call that overwrites w
        step(Tensor(np.ones(N, np.float32)))
        np.testing.assert_array_equal(before.numpy(), expect * 10)
        assert total.item() == expect.sum()
        expect = expect + 1


def test_view_before_replay_sees_the_write():
    w, step = _adder()
    expect = np.arange(N, dtype=np.float32)
    for _ in range(5):
        view, lazy = w[1:4], w[1:4] * 1
        step(Tensor(np.ones(N, np.float32)))
        np.testing.assert_array_equal(lazy.numpy(), expect[1:4])
        expect = expect + 1
        np.testing.assert_array_equal(view.numpy(), expect[1:4])   # a view reads w's memory as it is now


def test_lazy_read_of_an_input_written_in_place():
    # the replay writes into its input buffer; a lazy read of that input made before the call keeps the old value
    @TinyJit
    def step(x):
        x.assign(x * 2).realize()
        return (x + 0).realize()
    for i in range(5):
        x = Tensor(np.full(N, i + 1.0, np.float32)).contiguous().realize()
        before = x - 1
        out = step(x)
        np.testing.assert_array_equal(out.numpy(), np.full(N, 2.0 * (i + 1)))
        np.testing.assert_array_equal(before.numpy(), np.full(N, i + 0.0))
        np.testing.assert_array_equal(x.numpy(), np.full(N, 2.0 * (i + 1)))


# one program step: (kind, a, b, k)
_steps = st.lists(st.tuples(st.sampled_from(["call", "call", "lazy", "view", "read", "eager_write", "realize"]),
                            st.integers(0, N - 1), st.integers(1, N), st.integers(-3, 3)), min_size=1, max_size=24)


def _bodies(w, m, tw, tm):
    """The jitted function and the same steps in torch, by name."""
    def opt(x):   # an optimizer-like update: two state tensors written in place, a fresh output
        m.assign(m * 0.5 + x)
        w.assign(w - m * 0.25)
        return (w * 2 + m).realize()

    def t_opt(x):
        tm.mul_(0.5).add_(x)
        tw.sub_(tm * 0.25)
        return tw * 2 + tm

    def view_write(x):   # a write through a view of the state
        w[1:4] += x[1:4]
        return (w * m).sum().realize()

    def t_view_write(x):
        tw[1:4] += x[1:4]
        return (tw * tm).sum()

    def reads_only(x):   # no writes: reads state the program writes eagerly between calls
        return (x * w + m.sum()).realize()

    def t_reads_only(x):
        return x * tw + tm.sum()
    return {"opt": (opt, t_opt), "view_write": (view_write, t_view_write), "reads_only": (reads_only, t_reads_only)}


@settings(max_examples=int(os.environ.get("JIT_READERS_EXAMPLES", "40")), deadline=None)
@given(st.sampled_from(["opt", "view_write", "reads_only"]), _steps)
def test_jit_calls_interleaved_with_lazy_reads_match_torch(body, program):
    rng = np.random.default_rng(0)
    w0, m0 = rng.integers(-4, 5, N).astype(np.float32), rng.integers(-4, 5, N).astype(np.float32)
    w, m = Tensor(w0).contiguous().realize(), Tensor(m0).contiguous().realize()
    tw, tm = torch.tensor(w0), torch.tensor(m0)
    fn, t_fn = _bodies(w, m, tw, tm)[body]
    step = TinyJit(fn)

    held: list[tuple[Tensor, torch.Tensor, bool]] = []   # (ours, torch's, is a view)
    outs: list[tuple[Tensor, torch.Tensor]] = []
    for i, (kind, a, b, k) in enumerate(program):
        lo, hi = min(a, b - 1), max(a + 1, b)
        if kind == "call":
            x = rng.integers(-4, 5, N).astype(np.float32)
            outs.append((step(Tensor(x)), t_fn(torch.tensor(x))))
        elif kind == "lazy":
            src, tsrc = (w, tw) if k >= 0 else (m, tm)
            held.append((src[lo:hi] * k + src.sum(), tsrc[lo:hi] * k + tsrc.sum(), False))
        elif kind == "view":
            src, tsrc = (w, tw) if k >= 0 else (m, tm)
            held.append((src[lo:hi], tsrc[lo:hi], True))
        elif kind == "eager_write":
            (w if k >= 0 else m)[lo:hi] += k
            (tw if k >= 0 else tm)[lo:hi] += k
        elif kind == "realize" and held:
            held[a % len(held)][0].realize()
        elif kind == "read" and held:
            ours, theirs, _ = held[a % len(held)]
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6,
                                       err_msg=f"{body} step {i}: {program[:i + 1]}")
    for ours, theirs, _ in held:
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, err_msg=f"{body}: {program}")
    for o, to in outs:
        np.testing.assert_allclose(o.numpy(), to.numpy(), rtol=1e-6, err_msg=f"{body}: {program}")
    np.testing.assert_allclose(w.numpy(), tw.numpy(), rtol=1e-6)
    np.testing.assert_allclose(m.numpy(), tm.numpy(), rtol=1e-6)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
