"""REFERENCE=1 (reference mode): every cache that could serve a stale value is off. Each test checks one cache really is
off in reference mode, and on by default (so the check can fail)."""
import numpy as np
import pytest

from fusegrad import Context, Tensor, TinyJit, storage
from fusegrad.helpers import GlobalCounters
from fusegrad.schedule.cache import schedule_cache


@pytest.mark.parametrize("ref", [0, 1])
@Context(JIT_VERIFY=0)   # counts the body's runs: a verified replay runs it too
def test_tinyjit_runs_the_body_every_call(ref):
    calls = []

    def f(x):
        calls.append(1)
        return (x * 2).realize()

    with Context(REFERENCE=ref):
        fj = TinyJit(f)
        for i in range(4): np.testing.assert_equal(fj(Tensor([float(i)])).numpy(), [2.0 * i])
    assert len(calls) == (4 if ref else 2)   # by default: a plain call, the capture, then replays
    assert (fj.captured is None) == bool(ref)


@pytest.mark.parametrize("ref", [0, 1])
def test_schedule_cache_off(ref):
    with Context(REFERENCE=ref):
        a = Tensor([1.0, 2.0, 3.0]).realize()
        (a * 3 + 1).realize()
        hits, misses = schedule_cache.hits, schedule_cache.misses
        np.testing.assert_equal((a * 3 + 1).numpy(), [4.0, 7.0, 10.0])   # the same structure again
    assert (schedule_cache.hits, schedule_cache.misses) == ((hits, misses) if ref else (hits + 1, misses))


@pytest.mark.parametrize("ref", [0, 1])
def test_result_cache_off(ref):
    with Context(REFERENCE=ref):
        a = Tensor([1.0, 2.0]).realize()
        b = a + 1
        lazy = b.uop
        b.realize()
        served = storage.realized.get(lazy)
        c = Tensor(lazy) * 2   # a graph holding the node b was computed from
        GlobalCounters.reset()
        np.testing.assert_equal(c.numpy(), [4.0, 6.0])
    assert (served is None) == bool(ref)
    # reference mode computes a + 1 again, fused into c's kernel; by default c reads b's buffer: one kernel either way
    assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize("ref", [0, 1])
def test_writes_stay_recorded(ref):
    # an assign that ran is a record, not a cache: a graph still holding it reads the buffer, never runs it again
    with Context(REFERENCE=ref):
        w = Tensor([1.0, 2.0]).realize()
        w.assign(w + 1)
        v = w * 1   # holds the ASSIGN
        w.realize()
        np.testing.assert_equal(v.numpy(), [2.0, 3.0])
        np.testing.assert_equal(w.numpy(), [2.0, 3.0])


@pytest.mark.parametrize("ref", [0, 1])
def test_relayout_cache_off(ref):
    with Context(REFERENCE=ref):
        w = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize()
        r = w.permute(1, 0).contiguous()
        node = r.uop
        r.realize()
        hit = storage.relayout_get(node)
        GlobalCounters.reset()
        again = w.permute(1, 0).contiguous().realize()
        kernels = GlobalCounters.kernel_count
        np.testing.assert_equal(again.numpy(), np.arange(12).reshape(3, 4).T)
    assert (hit is None) == bool(ref)
    assert kernels == (1 if ref else 0)
