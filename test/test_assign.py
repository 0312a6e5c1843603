"""assign writes into the tensor's own memory; readers of the old value keep seeing it; hazards are handled."""
import numpy as np

from fusegrad import GlobalCounters, Tensor
from fusegrad.tensor import buffers


def buf(t: Tensor):
    return buffers[t.uop.base]


def test_assign_in_place_same_buffer():
    w = Tensor([1.0, 2.0, 3.0]).realize()
    b0 = buf(w)
    w.assign(w * 2 + 1).realize()
    assert w.tolist() == [3.0, 5.0, 7.0] and buf(w) is b0
    GlobalCounters.reset()
    w += 1
    w.realize()
    assert GlobalCounters.kernel_count == 1 and w.tolist() == [4.0, 6.0, 8.0] and buf(w) is b0


def test_chained_pending_assigns():
    w = Tensor([1.0, 2.0]).realize()
    b0 = buf(w)
    w += 1
    w *= 3
    assert w.tolist() == [6.0, 9.0] and buf(w) is b0


def test_assign_hazard_reads_other_elements():
    x = np.random.rand(7).astype(np.float32)
    w = Tensor(x).realize()
    b0 = buf(w)
    w.assign(w.flip(0) + w).realize()       # every element reads another one: computed first, then copied in
    np.testing.assert_allclose(w.numpy(), x[::-1] + x)
    assert buf(w) is b0


def test_readers_of_old_value_realized_together():
    w = Tensor([1.0, 2.0]).realize()
    y = w * 10
    w.assign(w + 100)
    Tensor.realize(w, y)
    assert y.tolist() == [10.0, 20.0] and w.tolist() == [101.0, 102.0]


def test_lazy_reader_keeps_old_value():
    x = Tensor([1.0, 2.0]).realize()
    z = x.sum()                             # lazy, reads x's memory
    x.assign(x * 0).realize()               # overwrites that memory
    assert z.item() == 3.0 and x.tolist() == [0.0, 0.0]


def test_assign_to_lazy_tensor_is_functional():
    a = Tensor([1.0, 2.0]) + 1               # not realized: assign just replaces the value
    a.assign(Tensor([5.0, 6.0]))
    assert a.tolist() == [5.0, 6.0]


def test_setitem_in_place():
    w = Tensor(np.zeros((3, 4), np.float32)).realize()
    b0 = buf(w)
    w[1, 1:3] = 7.0
    ref = np.zeros((3, 4), np.float32)
    ref[1, 1:3] = 7.0
    np.testing.assert_array_equal(w.numpy(), ref)
    assert buf(w) is b0
