"""DLPack both ways with NumPy and PyTorch: dtypes and shapes survive, host memory is shared (writes show on both sides,
and fusegrad never serves a result computed before such a write), everything else is copied, lifetimes are right, and
`Tensor(x)` takes torch tensors and names the type it can't take."""
from __future__ import annotations

import collections
import gc
import weakref

import numpy as np
import pytest

from fusegrad import Tensor, dlpack, dtypes

torch = pytest.importorskip("torch", reason="the PyTorch half of these tests needs torch (pip install torch)")

DTYPES = [(np.float32, dtypes.float32), (np.float16, dtypes.float16), (np.int64, dtypes.int64),
          (np.bool_, dtypes.bool), (np.uint8, dtypes.uint8), (np.int32, dtypes.int32), (np.float64, dtypes.float64)]


def sample(np_dtype, shape=(2, 3)) -> np.ndarray:
    return (np.arange(int(np.prod(shape))).reshape(shape) % 3 == 1 if np_dtype is np.bool_
            else (np.arange(int(np.prod(shape))).reshape(shape) * 3 - 4).astype(np_dtype))


# ----- NumPy -> fusegrad -----

@pytest.mark.parametrize("np_dtype,dtype", DTYPES)
def test_numpy_in_keeps_dtype_and_shape_and_shares(np_dtype, dtype):
    a = sample(np_dtype)
    t = Tensor.from_dlpack(a, device="CPU")
    assert t.dtype == dtype and t.shape == (2, 3) and t.device == "CPU"
    np.testing.assert_array_equal(t.numpy(), a)
    a[1, 2] = a[0, 0] if np_dtype is not np.bool_ else not a[1, 2]
    np.testing.assert_array_equal(t.numpy(), a)              # zero-copy: the write shows


def test_numpy_writes_are_never_served_stale():
    a = np.arange(4, dtype=np.float32)
    t = Tensor.from_dlpack(a, device="CPU")
    first = (t * 2).realize()                               # a result computed from the shared memory, still alive
    assert first.tolist() == [0.0, 2.0, 4.0, 6.0]
    a[:] = 10.0
    assert (t * 2).tolist() == [20.0] * 4                    # the same graph again: computed anew, not the cached one
    assert first.tolist() == [0.0, 2.0, 4.0, 6.0]            # a realized result is a value, not a view


def test_fusegrad_writes_into_numpy_memory():
    a = np.zeros(3, dtype=np.float32)
    t = Tensor.from_dlpack(a, device="CPU")
    t.assign(Tensor([1.0, 2.0, 3.0], device="CPU")).realize()
    assert a.tolist() == [1.0, 2.0, 3.0]


def test_numpy_copies_when_it_must():
    strided = np.arange(12, dtype=np.float32).reshape(3, 4).T      # not row-major
    backwards = np.arange(6, dtype=np.int64)[::-2]                 # negative stride
    readonly = np.frombuffer(np.arange(3, dtype=np.float32).tobytes(), dtype=np.float32)
    for src in (strided, backwards, readonly):
        t = Tensor.from_dlpack(src, device="CPU")
        np.testing.assert_array_equal(t.numpy(), src)
    strided[0, 0] = 99.0
    assert Tensor.from_dlpack(strided, device="CPU").numpy()[0, 0] == 99.0
    t = Tensor.from_dlpack(strided, device="CPU")
    strided[0, 1] = -1.0
    assert t.numpy()[0, 1] == 4.0                            # a copy: the later write doesn't show
    with pytest.raises(BufferError, match="copy=False.*can't be shared"):
        Tensor.from_dlpack(strided, device="CPU", copy=False)
    a = np.ones(2, dtype=np.float32)
    c = Tensor.from_dlpack(a, device="CPU", copy=True)
    a[0] = 5.0
    assert c.tolist() == [1.0, 1.0]


def test_numpy_to_a_device_without_host_memory_is_copied():
    a = np.arange(3, dtype=np.float32)
    t = Tensor.from_dlpack(a, device="PYTHON")
    a[0] = 9.0
    assert t.device == "PYTHON" and t.tolist() == [0.0, 1.0, 2.0]


def test_scalars_and_empty_arrays():
    t = Tensor.from_dlpack(np.array(2.5, dtype=np.float32), device="CPU")
    assert t.shape == () and t.item() == 2.5
    e = Tensor.from_dlpack(np.zeros((0, 4), dtype=np.int32), device="CPU")
    assert e.shape == (0, 4) and e.dtype == dtypes.int32 and e.tolist() == []


# ----- fusegrad -> NumPy -----

@pytest.mark.parametrize("np_dtype,dtype", DTYPES)
def test_numpy_out_shares_a_realized_buffer(np_dtype, dtype):
    t = Tensor(sample(np_dtype), device="CPU").realize()
    a = np.from_dlpack(t)
    assert a.dtype == np_dtype and a.shape == (2, 3)
    np.testing.assert_array_equal(a, sample(np_dtype))
    a[0, 1] = a[1, 0]
    np.testing.assert_array_equal(t.numpy(), a)              # numpy wrote fusegrad's memory


def test_numpy_out_writes_invalidate_cached_results():
    t = Tensor([1.0, 2.0, 3.0], device="CPU").realize()
    doubled = (t * 2).realize()
    a = np.from_dlpack(t)
    a[:] = 0.0
    assert (t * 2).tolist() == [0.0, 0.0, 0.0] and doubled.tolist() == [2.0, 4.0, 6.0]
    assert (t + 1).tolist() == [1.0, 1.0, 1.0]
    a[0] = 4.0
    assert (t + 1).tolist() == [5.0, 1.0, 1.0]               # computed after the share: never cached either


def test_lazy_readers_built_before_an_export_keep_their_values():
    """A lazy tensor built from memory that is then exported and written from outside has the value of when it was
    built, as in torch (eager) and as an in-place write inside fusegrad leaves it (fuzzer seed 42243: a parameter
    doubled lazily, then written through np.from_dlpack, then the double read: it had the new values). Lazy views of
    the memory see the write, as views do."""
    for lazy_init in (False, True):
        w = Tensor.rand(4, 3) if lazy_init else Tensor(np.arange(12, dtype=np.float32).reshape(4, 3)).realize()
        doubled, row = w * 2, w[1]
        before = w.numpy().copy() if not lazy_init else None
        a = np.from_dlpack(w.realize())
        if before is None: before = a.copy()
        a[3] += -0.5
        np.testing.assert_array_equal(doubled.numpy(), before * 2)
        np.testing.assert_array_equal(row.numpy(), a[1])
        np.testing.assert_array_equal((w * 2).numpy(), a * 2)    # built after the write: the new values
    t = torch.arange(6, dtype=torch.float32)
    x = Tensor(np.arange(6, dtype=np.float32)).realize()
    y = x + 1
    tx = torch.from_dlpack(x)
    tx.mul_(10)
    np.testing.assert_array_equal(y.numpy(), (t + 1).numpy())
    np.testing.assert_array_equal(x.numpy(), (t * 10).numpy())


def test_numpy_out_copies_lazy_views_constants_and_other_devices():
    base = Tensor.arange(6, device="CPU").reshape(2, 3).realize()
    cases = {"lazy": (base + 1, [[1, 2, 3], [4, 5, 6]]), "view": (base[:, 1], [1, 4]),
             "constant": (Tensor.full((2,), 7, device="CPU"), [7, 7]),
             "PYTHON device": (Tensor([1, 2], device="PYTHON"), [1, 2])}
    for name, (t, want) in cases.items():
        assert np.from_dlpack(t).tolist() == want, name
    view = base[:, 1]
    a = np.from_dlpack(view)
    a[0] = 100
    assert base.tolist() == [[0, 1, 2], [3, 4, 5]]          # a view is exported as a copy
    with pytest.raises(BufferError, match="copy=False.*isn't one whole realized buffer"):
        view.__dlpack__(copy=False)
    with pytest.raises(BufferError, match="stream must be None"):
        base.__dlpack__(stream=1)
    assert base.__dlpack_device__() == (1, 0)


# ----- PyTorch, both ways -----

TORCH_DTYPES = [(torch.float32, dtypes.float32), (torch.float16, dtypes.float16), (torch.bfloat16, dtypes.bfloat16),
                (torch.int64, dtypes.int64), (torch.bool, dtypes.bool), (torch.int8, dtypes.int8)]


@pytest.mark.parametrize("tdtype,dtype", TORCH_DTYPES)
def test_torch_round_trip(tdtype, dtype):
    x = (torch.arange(6).reshape(3, 2) - 2).to(tdtype)
    t = Tensor.from_dlpack(x, device="CPU")
    assert t.dtype == dtype and t.shape == (3, 2)
    assert t.tolist() == x.tolist()
    x[0, 0] = x[2, 1]                                        # shared
    assert t.tolist() == x.tolist()
    y = torch.from_dlpack(t)
    assert y.dtype == tdtype and y.shape == (3, 2) and y.tolist() == x.tolist()
    y[1, 1] = y[0, 1]                                        # torch -> fusegrad -> torch: still the same memory
    assert x[1, 1].item() == y[0, 1].item() and t.tolist() == x.tolist()


def test_torch_out_of_a_computed_tensor():
    t = (Tensor.arange(4, device="CPU").float() * 0.5).realize()
    y = torch.from_dlpack(t)
    assert y.dtype == torch.float32 and y.tolist() == [0.0, 0.5, 1.0, 1.5]
    y.mul_(2)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_tensor_constructor_takes_torch_tensors_as_copies():
    for tdtype, dtype in TORCH_DTYPES:
        x = torch.ones(2, 3, dtype=tdtype)
        t = Tensor(x)
        assert t.dtype == dtype and t.shape == (2, 3) and t.tolist() == x.tolist()
    x = torch.arange(4.0)
    t = Tensor(x)
    x[0] = 50.0
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]                # Tensor() copies, like Tensor(np_array)
    assert Tensor(torch.ones(2, requires_grad=True)).tolist() == [1.0, 1.0]
    assert Tensor(torch.arange(6).reshape(2, 3).T).tolist() == [[0, 3], [1, 4], [2, 5]]
    assert Tensor(torch.ones(2), dtype=dtypes.int32).dtype == dtypes.int32
    a = np.arange(6, dtype=np.int16).reshape(3, 2)
    assert Tensor(a).dtype == dtypes.int16 and Tensor(a).shape == (3, 2)


def test_unsupported_inputs_say_what_they_are():
    with pytest.raises(TypeError, match=r"can't create a Tensor from collections\.deque"):
        Tensor(collections.deque([1, 2]))
    with pytest.raises(TypeError, match=r"can't create a Tensor from fusegrad\.tensor\.Tensor \(use t\.clone\(\)"):
        Tensor(Tensor([1]))
    with pytest.raises(BufferError, match="type code 5"):           # complex
        Tensor.from_dlpack(np.ones(2, dtype=np.complex64))
    with pytest.raises(TypeError, match="needs an object with __dlpack__.*got dict"):
        Tensor.from_dlpack({})

    class OnGPU:
        def __dlpack_device__(self): return (2, 0)
        def __dlpack__(self, **kwargs): raise AssertionError("not called")
    with pytest.raises(BufferError, match=r"lives on kDLCUDA:0.*move it to the CPU"):
        Tensor.from_dlpack(OnGPU())


# ----- the pre-1.0 protocol, and lifetimes -----

class Legacy:
    """A producer from before DLPack 1.0: __dlpack__ takes no max_version and returns a "dltensor" capsule."""
    def __init__(self, inner): self.inner = inner
    def __dlpack__(self, stream=None): return self.inner.__dlpack__()
    def __dlpack_device__(self): return self.inner.__dlpack_device__()


def test_legacy_capsules_both_ways():
    a = np.arange(3, dtype=np.float32)
    t = Tensor.from_dlpack(Legacy(a), device="CPU")
    a[2] = 8.0
    assert t.tolist() == [0.0, 1.0, 8.0]
    b = np.from_dlpack(Legacy(t))            # numpy retries without max_version: our legacy capsule
    assert b.tolist() == [0.0, 1.0, 8.0]     # (numpy marks arrays from pre-1.0 capsules read-only)
    assert b.__array_interface__["data"][0] == dlpack.host_address(t._buffer())   # the same memory


def test_lifetimes():
    a = np.arange(3.0)
    alive = weakref.ref(a)
    t = Tensor.from_dlpack(a, device="CPU")
    del a
    gc.collect()
    assert alive() is not None and t.tolist() == [0.0, 1.0, 2.0]   # the tensor keeps the producer's memory
    del t
    gc.collect()
    assert alive() is None                                         # ... and lets go of it (the deleter ran)
    u = Tensor([1.0, 2.0], device="CPU").realize()
    before = len(dlpack._exports)
    unused = u.__dlpack__()
    assert len(dlpack._exports) == before + 1
    del unused                                                     # never consumed: the capsule's destructor frees it
    gc.collect()
    assert len(dlpack._exports) == before

    def dropped_while_raising(t: Tensor):
        capsule = t.__dlpack__()                                   # freed while the exception unwinds the frame
        raise ValueError(f"after {capsule!r}")
    with pytest.raises(ValueError): dropped_while_raising(u)
    gc.collect()
    assert len(dlpack._exports) == before
    b = np.from_dlpack(u)
    del u
    gc.collect()
    assert b.tolist() == [1.0, 2.0]                                # the array keeps fusegrad's buffer alive
    del b
    gc.collect()
    assert len(dlpack._exports) == before
