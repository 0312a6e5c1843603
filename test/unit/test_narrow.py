"""codegen/narrow.py: an in-place write through a slice visits the slice's positions only (a KV-cache update of one
token no longer rewrites the whole cache), with the values of a write of the whole buffer."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fusegrad import Tensor, Variable
from fusegrad.codegen import to_program
from fusegrad.device import Device
from fusegrad.ir.ops import Ops


def _write_kernel_work(t: Tensor) -> tuple[str, int]:
    """The name and loop iterations (product of the loop sizes) of the kernel that realizes `t`'s pending write."""
    si = t.schedule()[-1]
    spec = to_program(si.ast, Device["CPU"].renderer)
    trips = 1
    for u in spec.uops:
        if u.op is Ops.RANGE: trips *= int(u.src[0].arg)
    return spec.name, trips


def test_kv_cache_update_writes_one_position():
    """cache[:, p:p + 1] = k with a bound variable p: the kernel's loops cover the 3 x 64 values written, not the
    200 x 3 x 64 of the cache, and the cache holds what NumPy's does."""
    ref = np.random.default_rng(0).standard_normal((1, 200, 3, 64)).astype(np.float32)
    cache = Tensor(ref.copy()).contiguous().realize()
    k = np.random.default_rng(1).standard_normal((1, 1, 3, 64)).astype(np.float32)
    p = Variable("p", 0, 199).bind(117)
    cache[:, p:p + 1] = Tensor(k).realize()
    name, trips = _write_kernel_work(cache)
    assert trips == 3 * 64, (name, trips)
    cache.realize()
    ref[:, 117:118] = k
    np.testing.assert_array_equal(cache.numpy(), ref)


@pytest.mark.parametrize("pos", [0, 117, 199])
def test_a_variable_bounded_past_the_cache_still_narrows(pos):
    """A decode step's start_pos is bounded by the model's context (here 0..4095), not by the cache (200 positions):
    the write still visits one position (clamped into the cache), with NumPy's values at the first, a middle and the
    last position."""
    ref = np.random.default_rng(0).standard_normal((1, 200, 3, 64)).astype(np.float32)
    cache = Tensor(ref.copy()).contiguous().realize()
    k = np.random.default_rng(1).standard_normal((1, 1, 3, 64)).astype(np.float32)
    p = Variable("p", 0, 4095).bind(pos)
    cache[:, p:p + 1] = Tensor(k).realize()
    name, trips = _write_kernel_work(cache)
    assert trips == 3 * 64, (name, trips)
    cache.realize()
    ref[:, pos:pos + 1] = k
    np.testing.assert_array_equal(cache.numpy(), ref)


def test_an_int_index_and_a_slice_narrow_both_loops():
    c = Tensor(np.zeros((5, 6, 7), np.float32)).contiguous().realize()
    c[1:3, 5] = Tensor.full((2, 7), -3.0).contiguous().realize()
    assert _write_kernel_work(c)[1] == 2 * 7


def test_a_strided_slice_keeps_the_whole_loop_and_the_values():
    """`c[::2] = v` selects every other position (a modulo, no interval): left as it was, still exact."""
    ref = np.arange(30, dtype=np.float32).reshape(5, 6)
    c = Tensor(ref.copy()).contiguous().realize()
    c[::2] = Tensor.full((3, 6), -1.0).contiguous().realize()
    assert _write_kernel_work(c)[1] == 30
    ref[::2] = -1
    np.testing.assert_array_equal(c.numpy(), ref)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_slice_writes_equal_numpy(data):
    """Random shapes, slices (start/stop/step, ints) and a bound variable start on one axis (its bounds the axis's or
    past them): every write, narrowed or not, leaves the buffer equal to NumPy's after the same writes in the same
    order."""
    nd = data.draw(st.integers(1, 3))
    shape = tuple(data.draw(st.integers(1, 6)) for _ in range(nd))
    ref = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = Tensor(ref.copy()).contiguous().realize()
    for w in range(data.draw(st.integers(1, 3))):
        idx = []
        for ax, n in enumerate(shape):
            kind = data.draw(st.sampled_from(["slice", "int", "all", "var"]))
            if kind == "int": idx.append(data.draw(st.integers(0, n - 1)))
            elif kind == "all": idx.append(slice(None))
            elif kind == "var":
                length = data.draw(st.integers(1, n))
                start = data.draw(st.integers(0, n - length))
                past = data.draw(st.sampled_from([0, 0, 3]))   # bounds past the axis, as a decode's start_pos
                idx.append((Variable(f"s{ax}", 0, n - length + past).bind(start), start, length))
            else:
                a = data.draw(st.integers(0, n - 1))
                b = data.draw(st.integers(a + 1, n))
                idx.append(slice(a, b, data.draw(st.sampled_from([1, 1, 2]))))
        ours = tuple(slice(i[0], i[0] + i[2]) if isinstance(i, tuple) else i for i in idx)
        theirs = tuple(slice(i[1], i[1] + i[2]) if isinstance(i, tuple) else i for i in idx)
        sel_shape = ref[theirs].shape
        val = np.full(sel_shape, -1.0 - w, np.float32)
        t[ours] = Tensor(val).contiguous().realize() if sel_shape else Tensor(val).realize()
        ref[theirs] = val
        np.testing.assert_array_equal(t.numpy(), ref)


def test_not_in_place_is_left_alone():
    """A WHERE over another buffer's values is no in-place write: nothing to skip."""
    a, b = Tensor.arange(12).float().realize(), Tensor.zeros(12).contiguous().realize()
    out = (Tensor.arange(12) < 4).where(a, b)
    assert _write_kernel_work(out)[1] == 12
    np.testing.assert_array_equal(out.numpy(), np.where(np.arange(12) < 4, np.arange(12), 0))


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
