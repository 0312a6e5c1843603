"""Tensor creation against PyTorch / NumPy: from lists, scalars, ndarrays and bytes; empty, zeros, ones, full, arange,
eye; rand/randn checked statistically and for reproducibility across seeds and backends."""
import struct

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes

from .helpers import DEVICES, fg_dtype_of


def same(t: Tensor, ref: np.ndarray, dtype=None):
    """Exact comparison of shape, dtype and values."""
    assert t.shape == ref.shape, f"shape {t.shape} != {ref.shape}"
    assert t.dtype == (dtype or fg_dtype_of(torch.from_numpy(np.ascontiguousarray(ref)))), t.dtype
    np.testing.assert_array_equal(t.numpy(), ref)


# ----- Tensor(...) -----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("data", [[1.0, 2.5, -3.0], [[1.5, 2.0], [3.0, 4.0]], [[[1.0], [2.0]], [[3.0], [4.0]]],
                                  [1.0, 2, 3], [True, 2.5]], ids=str)
def test_from_float_list(data, device):
    t = Tensor(data, device=device)
    ref = torch.tensor(data)
    assert t.device == device and t.dtype == dtypes.float32 and t.shape == tuple(ref.shape)
    np.testing.assert_array_equal(t.numpy(), ref.numpy())
    assert t.tolist() == ref.tolist()


@pytest.mark.parametrize("data", [[1, 2, 3], [[-1, 0], [5, 7]], [True, 3]], ids=str)
def test_from_int_list(data):
    # ints default to int32 in fusegrad (torch: int64); values and shape as torch
    t = Tensor(data)
    assert t.dtype == dtypes.int32
    assert t.shape == tuple(torch.tensor(data).shape)
    assert t.tolist() == torch.tensor(data).tolist()


def test_from_bool_list():
    t = Tensor([[True, False], [False, True]])
    assert t.dtype == dtypes.bool and t.shape == (2, 2)
    assert t.tolist() == [[True, False], [False, True]]
    np.testing.assert_array_equal(t.numpy(), np.array([[True, False], [False, True]]))


def test_from_list_with_dtype():
    t = Tensor([1, 2, 3], dtype=dtypes.float32)
    assert t.dtype == dtypes.float32 and t.tolist() == [1.0, 2.0, 3.0]
    t = Tensor([1.7, -2.7], dtype="int32")
    assert t.dtype == dtypes.int32 and t.tolist() == torch.tensor([1.7, -2.7]).to(torch.int32).tolist()
    t = Tensor([0, 2, 0], dtype="bool")
    assert t.tolist() == [False, True, False]


def test_from_empty_list():
    t = Tensor([])
    assert t.shape == (0,) and t.dtype == dtypes.float32 and t.tolist() == [] and t.numpy().shape == (0,)


def test_from_tuple():
    assert Tensor((1.0, 2.0)).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("val,dtype", [(3.5, dtypes.float32), (-2, dtypes.int32), (True, dtypes.bool),
                                       (0.0, dtypes.float32)])
def test_from_scalar(val, dtype, device):
    t = Tensor(val, device=device)
    assert t.shape == () and t.ndim == 0 and t.dtype == dtype and t.numel() == 1
    assert t.item() == val and t.tolist() == val
    assert t.numpy().shape == () and t.numpy() == val


@pytest.mark.parametrize("npdt", ["float32", "float64", "float16", "int8", "uint8", "int16", "int32", "int64", "uint16",
                                  "uint32", "bool"])
def test_from_ndarray_dtypes(npdt):
    rng = np.random.default_rng(0)
    arr = (rng.random((3, 4)) < 0.5) if npdt == "bool" else (rng.uniform(-50, 50, (3, 4)) if "float" in npdt or
                                                             npdt.startswith("int") else rng.uniform(0, 100, (3, 4)))
    arr = arr.astype(npdt)
    t = Tensor(arr)
    assert t.dtype == fg_dtype_of(torch.from_numpy(arr))
    same(t, arr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 1, 3), (1,), (0,), (2, 0, 3)], ids=str)
def test_from_ndarray_shapes(shape, device):
    arr = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = Tensor(arr, device=device)
    same(t, arr)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("npdt", ["float32", "int32", "bool"])
def test_from_0d_ndarray(npdt, device):
    # a 0-d array makes a 0-d tensor, as torch.from_numpy / torch.tensor do
    arr = np.array(3, dtype=npdt)
    t = Tensor(arr, device=device)
    ref = torch.tensor(arr)
    assert t.shape == tuple(ref.shape) == ()
    assert t.dtype == fg_dtype_of(ref)
    assert t.item() == ref.item()


def test_from_noncontiguous_ndarray():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    same(Tensor(arr.T), arr.T)
    same(Tensor(arr[:, ::2]), arr[:, ::2])
    same(Tensor(arr[::-1]), arr[::-1])


def test_from_ndarray_is_a_copy():
    arr = np.ones(3, np.float32)
    t = Tensor(arr).realize()
    arr[0] = 5
    assert t.tolist() == [1.0, 1.0, 1.0]


def test_from_ndarray_with_dtype():
    t = Tensor(np.array([1.5, -2.5]), dtype="float32")
    assert t.dtype == dtypes.float32 and t.tolist() == [1.5, -2.5]


@pytest.mark.parametrize("device", DEVICES)
def test_from_bytes(device):
    data = bytes([0, 1, 2, 127, 128, 255])
    t = Tensor(data, device=device)
    ref = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    assert t.dtype == dtypes.uint8 and t.shape == tuple(ref.shape)
    assert t.tolist() == ref.tolist()


def test_from_bytes_with_dtype():
    vals = [1.5, -2.0, 3.25]
    data = struct.pack("3f", *vals)
    t = Tensor(data, dtype=dtypes.float32)
    assert t.shape == (3,) and t.dtype == dtypes.float32 and t.tolist() == vals
    assert Tensor(b"").shape == (0,)


@pytest.mark.parametrize("bad", [[[1, 2], [3]], [[[1.0], [2.0]], [[3.0]]]], ids=str)
def test_ragged_list_raises_like_torch(bad):
    with pytest.raises(ValueError):
        torch.tensor(bad)
    with pytest.raises(ValueError):
        Tensor(bad)


def test_requires_grad_flag():
    assert Tensor([1.0], requires_grad=True).requires_grad is True
    assert not Tensor([1.0]).requires_grad


# ----- empty / zeros / ones / full -----

@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    t = Tensor.empty(2, 3, device=device)
    assert t.shape == (2, 3) and t.dtype == dtypes.float32 and t.device == device
    assert t.numpy().shape == (2, 3)
    t = Tensor.empty((4,), dtype=dtypes.int32)
    assert t.shape == (4,) and t.dtype == dtypes.int32
    assert Tensor.empty(0, 3).numpy().shape == (0, 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(3,), (2, 3), (2, 1, 4), (), (0, 2)], ids=str)
@pytest.mark.parametrize("fn", ["zeros", "ones"])
def test_zeros_ones(fn, shape, device):
    ref = getattr(torch, fn)(shape)
    t = getattr(Tensor, fn)(shape, device=device)  # the tuple form
    assert t.device == device
    same(t, ref.numpy())
    if shape: same(getattr(Tensor, fn)(*shape, device=device), ref.numpy())  # the varargs form


@pytest.mark.parametrize("dtype", ["int32", "bool", "float64", "int64", "uint8"])
@pytest.mark.parametrize("fn", ["zeros", "ones"])
def test_zeros_ones_dtype(fn, dtype):
    t = getattr(Tensor, fn)(2, 3, dtype=dtype)
    same(t, getattr(torch, fn)(2, 3, dtype=getattr(torch, dtype)).numpy())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value,shape", [(2.5, (2, 3)), (-1.0, (4,)), (True, (2, 2)), (0.0, ()), (float("inf"), (2,)),
                                         (float("nan"), (2,))], ids=str)
def test_full(value, shape, device):
    t = Tensor.full(shape, value, device=device)
    ref = torch.full(shape, value)
    assert t.shape == tuple(ref.shape) and t.dtype == fg_dtype_of(ref)
    np.testing.assert_array_equal(t.numpy(), ref.numpy())


def test_full_int_and_dtype():
    t = Tensor.full((2, 3), 7)
    assert t.dtype == dtypes.int32 and t.tolist() == [[7] * 3] * 2  # torch: int64
    t = Tensor.full(3, 7, dtype="float32")
    assert t.dtype == dtypes.float32 and t.tolist() == [7.0] * 3
    t = Tensor.full((2,), 1.9, dtype=dtypes.int32)
    assert t.tolist() == torch.full((2,), 1.9).to(torch.int32).tolist()


def test_like_constructors():
    x = Tensor(np.ones((2, 3), np.int32))
    for t, v in [(x.zeros_like(), 0), (x.ones_like(), 1), (x.full_like(4), 4)]:
        assert t.shape == (2, 3) and t.dtype == dtypes.int32 and t.tolist() == [[v] * 3] * 2
    assert x.full_like(2.5, dtype="float32").tolist() == [[2.5] * 3] * 2


def test_constant_tensors_grad():
    # a full() tensor with requires_grad gets a gradient like torch
    w = Tensor.full((2, 2), 3.0, requires_grad=True)
    wt = torch.full((2, 2), 3.0, requires_grad=True)
    (w * w).sum().backward()
    (wt * wt).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy())


# ----- arange -----

ARANGES = [(5,), (0,), (1,), (2, 10), (2, 10, 3), (10, 0, -2), (-3, 3), (5, 5), (0, -7, -3), (-10, -2, 4),
           (0.0, 1.0, 0.25), (1.0, -1.0, -0.3), (0.5, 3), (-2.5, 2.5, 0.5), (3.0,), (0, 1, 0.1)]


@pytest.mark.parametrize("args", ARANGES, ids=str)
def test_arange(args):
    t = Tensor.arange(*args)
    ref = torch.arange(*args)
    assert t.shape == tuple(ref.shape), f"{t.shape} != {tuple(ref.shape)}"
    if ref.dtype == torch.int64:
        assert t.dtype == dtypes.int32  # fusegrad's default int (torch: int64)
        assert t.tolist() == ref.tolist()
    else:
        assert t.dtype == fg_dtype_of(ref)
        np.testing.assert_allclose(t.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_arange_small(device):
    assert Tensor.arange(4, device=device).tolist() == [0, 1, 2, 3]
    assert Tensor.arange(6, 0, -2, device=device).tolist() == [6, 4, 2]
    np.testing.assert_allclose(Tensor.arange(0, 1, 0.25, device=device).numpy(), [0, 0.25, 0.5, 0.75])


@pytest.mark.parametrize("dtype", ["float32", "int64", "int16", "float64"])
def test_arange_dtype(dtype):
    t = Tensor.arange(1, 7, 2, dtype=dtype)
    ref = torch.arange(1, 7, 2, dtype=getattr(torch, dtype))
    same(t, ref.numpy())


def test_arange_used_in_arith():
    np.testing.assert_array_equal((Tensor.arange(6).reshape(2, 3) * 2 + 1).numpy(),
                                  (torch.arange(6, dtype=torch.int32).reshape(2, 3) * 2 + 1).numpy())


# ----- eye -----

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args", [(3,), (1,), (2, 4), (4, 2), (0,), (3, 0)], ids=str)
def test_eye(args, device):
    same(Tensor.eye(*args, device=device), torch.eye(*args).numpy())


@pytest.mark.parametrize("dtype", ["int32", "bool", "float64"])
def test_eye_dtype(dtype):
    same(Tensor.eye(3, dtype=dtype), torch.eye(3, dtype=getattr(torch, dtype)).numpy())


def test_eye_requires_grad():
    x = Tensor.eye(3, requires_grad=True)
    y = Tensor(np.arange(9, dtype=np.float32).reshape(3, 3))
    (x * y).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.arange(9, dtype=np.float32).reshape(3, 3))


# ----- rand / randn / manual_seed -----

def test_rand_statistics():
    Tensor.manual_seed(1234)
    t = Tensor.rand(200, 100)
    assert t.shape == (200, 100) and t.dtype == dtypes.float32
    v = t.numpy()
    assert v.min() >= 0.0 and v.max() < 1.0
    # uniform [0, 1): mean 1/2, std 1/sqrt(12); the standard error of the mean over 20000 samples is ~0.002
    assert abs(v.mean() - 0.5) < 0.01
    assert abs(v.std() - 12 ** -0.5) < 0.01
    # every tenth of [0, 1) gets about 10% of the samples
    hist, _ = np.histogram(v, bins=10, range=(0, 1))
    assert np.all(np.abs(hist / v.size - 0.1) < 0.01), hist
    # neighbours are uncorrelated
    flat = v.reshape(-1)
    assert abs(np.corrcoef(flat[:-1], flat[1:])[0, 1]) < 0.03


def test_randn_statistics():
    Tensor.manual_seed(99)
    t = Tensor.randn(20000)
    assert t.shape == (20000,) and t.dtype == dtypes.float32
    v = t.numpy()
    assert np.all(np.isfinite(v))
    assert abs(v.mean()) < 0.03
    assert abs(v.std() - 1.0) < 0.03
    # about 68.3% within one standard deviation, 95.4% within two
    assert abs(np.mean(np.abs(v) < 1) - 0.683) < 0.02
    assert abs(np.mean(np.abs(v) < 2) - 0.954) < 0.01


@pytest.mark.parametrize("fn", ["rand", "randn"])
def test_random_shapes_and_dtypes(fn):
    for shape in [(3,), (2, 3, 4), (1,)]:
        t = getattr(Tensor, fn)(*shape)
        assert t.shape == shape and t.numpy().shape == shape
    assert getattr(Tensor, fn)((2, 2)).shape == (2, 2)
    t = getattr(Tensor, fn)(4, dtype="float64")
    assert t.dtype == dtypes.float64 and t.numpy().dtype == np.float64
    assert getattr(Tensor, fn)(0, 3).numpy().shape == (0, 3)


@pytest.mark.parametrize("fn", ["rand", "randn"])
def test_manual_seed_reproducible(fn):
    Tensor.manual_seed(7)
    a, b = getattr(Tensor, fn)(5, 6).numpy(), getattr(Tensor, fn)(5, 6).numpy()
    Tensor.manual_seed(7)
    a2, b2 = getattr(Tensor, fn)(5, 6).numpy(), getattr(Tensor, fn)(5, 6).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert not np.array_equal(a, b)  # the stream moves on between calls
    Tensor.manual_seed(8)
    assert not np.array_equal(getattr(Tensor, fn)(5, 6).numpy(), a)
    assert len(np.unique(a)) == a.size  # no repeated values in one draw


def test_rand_same_on_cpu_and_python():
    Tensor.manual_seed(42)
    cpu = Tensor.rand(3, 4, device="CPU").numpy()
    Tensor.manual_seed(42)
    py = Tensor.rand(3, 4, device="PYTHON").numpy()
    np.testing.assert_array_equal(cpu, py)
    assert cpu.min() >= 0 and cpu.max() < 1


def _mix32_np(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> 16)
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def test_rand_matches_a_numpy_reference_of_the_counter_hash():
    """Draws of several sizes (1, where the count is a constant in the kernels, and more, where it is a variable)
    advance the counter by their size and hash it the same way (creation.py's `_random_bits`)."""
    Tensor.manual_seed(1234)
    counter = 0
    for shape in [(3, 5), (1,), (800,), (2, 16), (7,)]:
        got = Tensor.rand(*shape).numpy()
        n = int(np.prod(shape))
        with np.errstate(over="ignore"):
            key = _mix32_np(np.array([1234], dtype=np.uint32) + np.uint32(0x632BE5AB))
            ctr = np.arange(counter, counter + n, dtype=np.uint32)
            bits = _mix32_np(_mix32_np(ctr ^ key) + np.uint32(0x85157AF5))
        want = (bits >> 8).astype(np.float32) * np.float32(2.0 ** -24)
        np.testing.assert_array_equal(got, want.reshape(shape))
        counter += n


def test_rand_keeps_its_threads(monkeypatch):
    """A big draw is split across CPU threads."""
    import fusegrad.engine.realize as er
    from fusegrad import Device
    if Device["CPU"].renderer.threads <= 1: pytest.skip("one CPU thread: nothing is split")
    real, specs = er._get_spec, []
    monkeypatch.setattr(er, "_get_spec", lambda ast, device: specs.append(real(ast, device)) or specs[-1])
    Tensor.rand((1 << 17) + 3, device="CPU").realize()   # a size no other test draws (programs are kept per AST)
    assert any(s.thread_size and not s.vars for s in specs), "a big draw lost its thread split"


def test_randn_close_on_cpu_and_python():
    Tensor.manual_seed(3)
    cpu = Tensor.randn(2, 3, device="CPU").numpy()
    Tensor.manual_seed(3)
    py = Tensor.randn(2, 3, device="PYTHON").numpy()
    np.testing.assert_allclose(cpu, py, rtol=1e-5, atol=1e-5)


def test_rand_requires_grad():
    Tensor.manual_seed(0)
    w = Tensor.rand(3, requires_grad=True)
    (w * 2).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0, 2.0])


def test_rand_realized_once():
    # a realized random tensor keeps its values; reading it twice gives the same numbers
    t = Tensor.rand(4, 4)
    np.testing.assert_array_equal(t.numpy(), t.numpy())
    np.testing.assert_array_equal((t + 0).numpy(), t.numpy())
