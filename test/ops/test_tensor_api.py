"""Data access and graph helpers: realize, numpy, item, tolist, contiguous, detach (stops the gradient), properties,
backward with an explicit gradient, gradient accumulation over two backward passes. Then the rest of the Tensor API vs
torch / NumPy: div(rounding_mode=), reverse shifts, const / invalids / from_blob / from_url / random_bits, max_shape,
schedule_linear / linear_with_vars, replace, creation on a tuple of devices, contiguous_backward, backward of
a no_grad result, second-order gradients, and pad-mode gradients."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes
from fusegrad.dtype import to_dtype

from .helpers import DEVICES, check_op


@pytest.mark.parametrize("device", DEVICES)
def test_realize_returns_self_and_keeps_values(device):
    a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device=device)
    b = a * 2 + 1
    assert b.realize() is b
    np.testing.assert_array_equal(b.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) * 2 + 1)
    np.testing.assert_array_equal(b.numpy(), b.numpy())
    c = (b - 1).realize()
    np.testing.assert_array_equal(c.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) * 2)


def test_realize_many():
    a = Tensor([1.0, 2.0])
    b, c = a + 1, a * 3
    b.realize(c)
    assert b.tolist() == [2.0, 3.0] and c.tolist() == [3.0, 6.0]


@pytest.mark.parametrize("npdt", ["float32", "float64", "int32", "int64", "uint8", "bool", "float16"])
def test_numpy_dtype_and_shape(npdt):
    v = (np.arange(6) % 2 == 0) if npdt == "bool" else np.arange(-3, 3).astype(npdt)
    v = v.reshape(2, 3)
    out = (Tensor(v) * 1 if npdt != "bool" else Tensor(v).logical_not().logical_not()).numpy()
    assert isinstance(out, np.ndarray) and out.dtype == v.dtype and out.shape == v.shape
    np.testing.assert_array_equal(out, v)


def test_numpy_of_views():
    v = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = Tensor(v)
    np.testing.assert_array_equal(t.permute(2, 0, 1).numpy(), v.transpose(2, 0, 1))
    np.testing.assert_array_equal(t[:, ::-1, 1::2].numpy(), v[:, ::-1, 1::2])
    np.testing.assert_array_equal(t[1].numpy(), v[1])
    np.testing.assert_array_equal(t[0:1, 0:1, 0:1].reshape(()).numpy(), v[0, 0, 0])


def test_numpy_is_a_copy():
    t = Tensor([1.0, 2.0]).realize()
    out = t.numpy()
    out[0] = 100
    assert t.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("device", DEVICES)
def test_item(device):
    assert Tensor(np.array([[2.5]], np.float32), device=device).item() == 2.5
    x = Tensor([1.0, 2.0, 3.0], device=device)
    assert x.sum().item() == torch.tensor([1.0, 2.0, 3.0]).sum().item()
    assert x[1].item() == 2.0
    assert isinstance(Tensor([3]).sum().item(), int) and Tensor([3]).sum().item() == 3
    assert Tensor([True]).item() is True
    assert isinstance(Tensor([1.5]).item(), float)


@pytest.mark.parametrize("device", DEVICES)
def test_tolist(device):
    v = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    t = Tensor(v, device=device)
    assert t.tolist() == torch.tensor(v).tolist()
    assert t.T.tolist() == torch.tensor(v).T.tolist()
    assert t[0].tolist() == v[0].tolist()
    assert t.sum().tolist() == float(v.sum())
    assert Tensor(np.zeros((2, 0), np.float32)).tolist() == torch.zeros(2, 0).tolist()
    assert Tensor(np.array([[1, -2]], np.int32)).tolist() == [[1, -2]]
    assert (Tensor([1.0, 2.0]) > 1.5).tolist() == [False, True]


def test_tolist_nested_3d():
    v = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    assert Tensor(v).tolist() == v.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_contiguous(device):
    check_op([(3, 4)], lambda x: x.T.contiguous() * 2, device=device)
    check_op([(3, 4)], lambda x: x.flip(0).contiguous().reshape(2, 6), device=device)
    check_op([(3, 4)], lambda x: x.contiguous())


def test_contiguous_of_realized_is_self():
    t = Tensor([1.0, 2.0]).realize()
    assert t.contiguous() is t


def test_detach_values_and_flags():
    x = Tensor([1.0, 2.0], requires_grad=True)
    d = x.detach()
    assert d.tolist() == [1.0, 2.0]
    assert not d.requires_grad
    assert (x * 2).requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_detach_stops_gradient(device):
    # d/dx (x * detach(x)) = detach(x), not 2x
    check_op([(3, 4)], lambda x: x * x.detach(), device=device)
    check_op([(3, 4)], lambda x: (x.detach() * 3).exp() + x)


def test_detach_only_path_gives_no_grad():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = Tensor([3.0, 4.0], requires_grad=True)
    (x.detach() * y).sum().backward()
    assert x.grad is None or x.grad.tolist() == [0.0, 0.0]
    assert y.grad.tolist() == [1.0, 2.0]


def test_backward_explicit_gradient():
    g = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    x = Tensor(np.ones((2, 2), np.float32), requires_grad=True)
    xt = torch.ones(2, 2, requires_grad=True)
    (x * 3).backward(Tensor(g))
    (xt * 3).backward(torch.tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())


def test_backward_accumulates():
    # a second backward adds to .grad, like torch
    x = Tensor([1.0, 2.0], requires_grad=True)
    xt = torch.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        (x * x).sum().backward()
        (xt * xt).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())


def test_backward_through_realized_intermediate():
    x = Tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    y = (x * x).realize()
    (y * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0, 12.0])


def test_grad_of_intermediate_with_requires_grad():
    x = Tensor([2.0, 3.0], requires_grad=True)
    (x.exp() * 0 + x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 6.0])


def test_properties():
    t = Tensor(np.zeros((2, 3, 4), np.float32))
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.numel() == 24 and t.dtype == dtypes.float32
    assert t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert len(t) == 2 and t.element_size() == 4 and t.nbytes() == 96
    assert t.is_floating_point() and not Tensor([1]).is_floating_point()
    assert t.device == "CPU" and Tensor([1.0], device="python").device == "PYTHON"


def test_to_device_copy():
    v = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = Tensor(v, device="CPU")
    b = a.to("PYTHON")
    assert b.device == "PYTHON"
    np.testing.assert_array_equal((b * 2).numpy(), v * 2)
    np.testing.assert_array_equal(b.to("CPU").numpy(), v)


def test_to_device_gradient():
    x = Tensor(np.array([1.0, 2.0], np.float32), device="CPU", requires_grad=True)
    (x.to("PYTHON") * 3).sum().backward()
    assert x.grad.device == "CPU"
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_laziness_no_compute_before_realize():
    from fusegrad import GlobalCounters
    a = Tensor(np.ones((4, 4), np.float32))
    GlobalCounters.reset()
    b = (a * 2 + 1).sum(axis=0)
    assert GlobalCounters.kernel_count == 0
    np.testing.assert_array_equal(b.numpy(), np.full(4, 12.0, np.float32))
    assert GlobalCounters.kernel_count >= 1


# ----- div(rounding_mode=) vs torch.div -----

DIV_A = [-7, 7, -8, 8, 0, -1, 1, 9, -9, 100, -100, 5]
DIV_B = [2, -2, 3, -3, 5, 4, -4, 3, 3, -7, 7, 1]


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dt", ["int8", "int16", "int32", "int64", "uint8"])
def test_div_rounding_mode_ints(mode, dt):
    a, b = np.array(DIV_A), np.array(DIV_B)
    if dt == "uint8": a, b = np.abs(a), np.abs(b)
    a, b = a.astype(dt), b.astype(dt)
    # check_op compares values exactly and the dtype with torch's (ints keep their dtype)
    check_op([], lambda x, y: torch.div(x, y, rounding_mode=mode), lambda x, y: x.div(y, rounding_mode=mode),
             vals=[a, b])
    # a Python-number divisor, and the reverse form (number / tensor)
    check_op([], lambda x: torch.div(x, 3, rounding_mode=mode), lambda x: x.div(3, rounding_mode=mode), vals=[a])
    nz = b[b != 0]
    check_op([], lambda y: torch.div(torch.tensor(50, dtype=y.dtype), y, rounding_mode=mode),
             lambda y: y.div(50, reverse=True, rounding_mode=mode), vals=[nz])


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dt", ["float32", "float64", "float16"])
def test_div_rounding_mode_floats(mode, dt):
    # exact quotients, halves, negative operands, signed zeros, x/0 -> +-inf / nan; gradients are zero like torch's
    a = np.array(DIV_A + [-7.5, 7.5, 0.0, -0.0, 1.0, -1.0, 0.0, 3.25], dt)
    b = np.array(DIV_B + [2.0, -2.0, -3.0, 3.0, 0.0, 0.0, 0.0, -0.5], dt)
    check_op([], lambda x, y: torch.div(x, y, rounding_mode=mode), lambda x, y: x.div(y, rounding_mode=mode),
             vals=[a, b], atol=0, rtol=0)
    # random operands (seeded), tensor / number and number / tensor
    check_op([(4, 5), (4, 5)], lambda x, y: torch.div(x, y, rounding_mode=mode),
             lambda x, y: x.div(y, rounding_mode=mode), low=-20, high=20, atol=0, rtol=0)
    check_op([(6,)], lambda x: torch.div(x, -2.5, rounding_mode=mode), lambda x: x.div(-2.5, rounding_mode=mode),
             low=-20, high=20, atol=0, rtol=0)
    check_op([(6,)], lambda x: torch.div(7.0, x, rounding_mode=mode),
             lambda x: x.div(7.0, reverse=True, rounding_mode=mode), low=-20, high=20, atol=0, rtol=0)


def test_div_rounding_mode_promotion_and_errors():
    # int tensor with a float divisor: float32 result (torch too); None is true division
    i = np.array([-7, 7, 3], np.int32)
    for mode in ("trunc", "floor", None):
        out, ref = Tensor(i).div(2.5, rounding_mode=mode), torch.div(torch.tensor(i), 2.5, rounding_mode=mode)
        assert out.dtype == dtypes.float32 and ref.dtype == torch.float32
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
    assert Tensor(i).div(2).dtype == dtypes.float32 and torch.div(torch.tensor(i), 2).dtype == torch.float32
    with pytest.raises(RuntimeError, match="rounding_mode") as e_fg: Tensor(i).div(2, rounding_mode="round")
    with pytest.raises(Exception) as e_t: torch.div(torch.tensor(i), 2, rounding_mode="round")
    assert "rounding_mode" in str(e_t.value) and "rounding_mode" in str(e_fg.value)


# ----- lshift / rshift with reverse= -----

@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"])
def test_shifts_reverse(dt):
    s = np.array([0, 1, 2, 5, 7], dt)
    t = Tensor(s)
    signed = np.issubdtype(np.dtype(dt), np.signedinteger)
    v = np.array([-128, -7, 5, 127, 64] if signed else [200, 7, 5, 127, 64], dt)
    # NumPy with a Python int keeps the array's dtype (NEP 50), as fusegrad's weak scalars do
    for got, want in [(t.lshift(3, reverse=True), np.left_shift(3, s)),
                      (t.rshift(100, reverse=True), np.right_shift(100, s)),
                      (t.lshift(2), np.left_shift(s, 2)), (t.rshift(1), np.right_shift(s, 1)),
                      (Tensor(v).rshift(2), np.right_shift(v, 2)), (Tensor(v).lshift(1), np.left_shift(v, 1)),
                      (t.lshift(Tensor(v), reverse=True), np.left_shift(v, s)),
                      (t.rshift(Tensor(v), reverse=True), np.right_shift(v, s))]:
        assert got.numpy().dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got.numpy(), want)
    # Python's own operators on a scalar agree element by element (wrapped to the dtype's width)
    assert t.lshift(3, reverse=True).tolist() == [int(np.array(3 << int(k)).astype(dt)) for k in s]
    assert t.rshift(100, reverse=True).tolist() == [100 >> int(k) for k in s]
    if dt in ("int8", "uint8", "int16", "int32", "int64"):  # torch's operators on the dtypes it has shift kernels for
        ts = torch.tensor(s)
        np.testing.assert_array_equal(t.lshift(3, reverse=True).numpy(), torch.bitwise_left_shift(3, ts).numpy())
        np.testing.assert_array_equal(t.rshift(100, reverse=True).numpy(), torch.bitwise_right_shift(100, ts).numpy())


# ----- creation: const, invalids, from_blob, from_url, random_bits, full(buffer=) -----

def test_const():
    for b, dt in [(3, None), (2.5, None), (True, None), (7, "int8"), (1.5, "float16")]:
        t, ref = Tensor.const(b, dtype=dt), torch.tensor(b, dtype=getattr(torch, dt) if dt else None)
        assert t.shape == tuple(ref.shape) == ()
        assert t.item() == ref.item()
        want = str(ref.dtype).replace("torch.", "")
        assert t.dtype == to_dtype("int32" if want == "int64" else want)   # fusegrad's default int is int32
    assert Tensor.const(3).dtype == dtypes.int32 and Tensor.const(7, dtypes.int8).dtype == dtypes.int8
    assert Tensor.const(2, device="PYTHON").device == "PYTHON"
    # a const from a bare number is weak like the number (torch's 0-d rule): int8 stays int8
    i8 = np.array([1, 2], np.int8)
    assert (Tensor(i8) * Tensor.const(3)).numpy().dtype == (torch.tensor(i8) * torch.tensor(3)).numpy().dtype


def test_invalids_shape_dtype_and_overwrite():
    t = Tensor.invalids(2, 3, dtype="int16")
    assert t.shape == (2, 3) and t.dtype == dtypes.int16 and t.numpy().shape == (2, 3)
    t.assign(Tensor(np.arange(6, dtype=np.int16).reshape(2, 3))).realize()
    np.testing.assert_array_equal(t.numpy(), torch.arange(6, dtype=torch.int16).reshape(2, 3).numpy())
    assert Tensor.invalids((4,)).dtype == dtypes.float32 and Tensor.invalids(4, device="PYTHON").device == "PYTHON"


@pytest.mark.parametrize("npdt", ["float32", "float64", "int16", "uint8", "int64"])
def test_from_blob(npdt):
    import ctypes
    a = np.arange(-6, 6).astype(npdt).reshape(3, 4)
    dt = dtypes.float32 if npdt == "float32" else npdt
    t = Tensor.from_blob(a.ctypes.data, (3, 4), dtype=dt)
    assert t.shape == (3, 4) and t.numpy().dtype == a.dtype
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.numpy(), torch.from_numpy(a).numpy())
    # a ctypes pointer works too; the tensor holds a copy (later writes to the array don't show)
    t2 = Tensor.from_blob(a.ctypes.data_as(ctypes.c_void_p), (12,), dtype=dt, device="PYTHON")
    a[0, 0] = 1
    assert t2.device == "PYTHON" and t2.tolist() == np.arange(-6, 6).astype(npdt).tolist()
    assert Tensor.from_blob(a.ctypes.data, (2, 2), dtype=dt).tolist() == a.reshape(-1)[:4].reshape(2, 2).tolist()


def test_from_blob_default_dtype_and_null():
    a = np.array([1.5, -2.0, 3.25], np.float32)
    assert Tensor.from_blob(a.ctypes.data, (3,)).dtype == dtypes.float32
    assert Tensor.from_blob(a.ctypes.data, (3,)).tolist() == a.tolist()
    with pytest.raises(ValueError): Tensor.from_blob(0, (3,))


def test_from_url_file_and_gunzip(tmp_path):
    import gzip
    raw = np.arange(256, dtype=np.uint8).tobytes() * 3
    (tmp_path / "x.bin").write_bytes(raw)
    (tmp_path / "x.gz").write_bytes(gzip.compress(raw))
    t = Tensor.from_url((tmp_path / "x.bin").as_uri())
    assert t.dtype == dtypes.uint8 and t.shape == (768,)
    np.testing.assert_array_equal(t.numpy(), np.frombuffer(raw, np.uint8))
    np.testing.assert_array_equal(Tensor.from_url((tmp_path / "x.gz").as_uri(), gunzip=True).numpy(),
                                  np.frombuffer(raw, np.uint8))
    with pytest.raises(ConnectionError): Tensor.from_url((tmp_path / "missing.bin").as_uri())


def _u32(*v): return Tensor(list(v), dtype=dtypes.uint32)


def test_random_bits_deterministic_and_key_counter_dependent():
    a = Tensor.random_bits(_u32(1), _u32(0), 64)
    assert a.dtype == dtypes.uint32 and a.shape == (64,) and a.numpy().dtype == np.uint32
    assert a.tolist() == Tensor.random_bits(_u32(1), _u32(0), 64).tolist()   # a pure function of key and counter
    # the first k of num values don't depend on num
    assert Tensor.random_bits(_u32(1), _u32(0), 10).tolist() == a.tolist()[:10]
    others = [Tensor.random_bits(k, c, 64).numpy() for k, c in [(_u32(2), _u32(0)), (_u32(1), _u32(1)),
                                                                 (_u32(1, 0), _u32(0)), (_u32(0), _u32(1))]]
    for o in others: assert (o != a.numpy()).mean() > 0.95
    assert len({tuple(o.tolist()) for o in others}) == len(others)
    # the global generator is neither used nor advanced (Tensor.rand after it is what it would have been)
    Tensor.manual_seed(5)
    r1 = Tensor.rand(8).numpy()
    Tensor.manual_seed(5)
    Tensor.random_bits(_u32(3), _u32(4), 100).realize()
    np.testing.assert_array_equal(Tensor.rand(8).numpy(), r1)


def test_random_bits_uniform():
    bits = Tensor.random_bits(_u32(12345), _u32(0), 1 << 16).numpy()
    assert len(np.unique(bits)) > 0.99 * bits.size
    # each of the 32 bit positions is set about half the time (binomial sd 0.002 at 65536 draws)
    frac = ((bits[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(0)
    assert np.all(np.abs(frac - 0.5) < 0.015), frac
    u = bits.astype(np.float64) / 2 ** 32
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    # 16 equal buckets: chi-square with 15 degrees of freedom stays far below 60
    hist = np.bincount((u * 16).astype(int), minlength=16)
    assert ((hist - bits.size / 16) ** 2 / (bits.size / 16)).sum() < 60


def test_full_buffer_flag_and_rand_contiguous():
    for buffer in (True, False):
        t = Tensor.full((2, 3), 7, buffer=buffer)
        np.testing.assert_array_equal(t.numpy(), torch.full((2, 3), 7).numpy().astype(np.int32))
        assert Tensor.ones(2).full_like(2.5, buffer=buffer).tolist() == torch.full_like(torch.ones(2), 2.5).tolist()
    Tensor.manual_seed(3)
    a = Tensor.rand(5, contiguous=False).numpy()
    Tensor.manual_seed(3)
    np.testing.assert_array_equal(Tensor.rand(5).numpy(), a)
    assert ((a >= 0) & (a < 1)).all()


# ----- shapes, scheduling and graph helpers -----

def test_max_shape_and_max_numel():
    from fusegrad import Variable
    v = np.arange(24, dtype=np.float32).reshape(6, 4)
    A = Tensor(v)
    assert A.max_shape == (6, 4) == tuple(torch.tensor(v).shape) and A.max_numel() == 24 == torch.tensor(v).numel()
    n = Variable("n", 1, 6)
    t = A[:n.bind(3)]
    assert t.max_shape == (6, 4) and t.max_numel() == 24
    np.testing.assert_array_equal(t.numpy(), v[:3])


def test_schedule_linear_and_linear_with_vars():
    from fusegrad import Variable
    A = Tensor(np.arange(24, dtype=np.float32).reshape(6, 4))
    n = Variable("n", 1, 6)
    t = A[:n.bind(3)] * 2
    sched, binds = t.linear_with_vars()
    assert len(sched) == len(t.schedule_linear()) >= 1
    assert binds == {n: 3}
    assert (A * 2).linear_with_vars()[1] == {}
    np.testing.assert_array_equal(t.realize(do_update_stats=False).numpy(),
                                  np.arange(12, dtype=np.float32).reshape(3, 4) * 2)
    np.testing.assert_array_equal(A.T.contiguous(some_option=1).numpy(), torch.arange(24.).reshape(6, 4).T.numpy())


def test_replace():
    a = Tensor([1.0, 2.0])
    b = a * 3
    c = b + 1                      # computed before the replace: keeps b's old value
    assert b.replace(Tensor([5.0, 6.0])) is b
    assert b.tolist() == [5.0, 6.0] and c.tolist() == [4.0, 7.0]
    np.testing.assert_array_equal((b * 2).numpy(), (torch.tensor([5.0, 6.0]) * 2).numpy())
    x = Tensor(np.zeros((2, 2), np.float32))
    x.replace(Tensor(np.eye(2, dtype=np.float32)) * 4)
    np.testing.assert_array_equal(x.numpy(), (torch.eye(2) * 4).numpy())
    with pytest.raises(RuntimeError, match="shape"): a.replace(Tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError): a.replace([1.0, 2.0])


def test_multi_device_creation():
    """Every constructor takes a tuple of devices: a whole copy on each (docs/distributed.md), equal on every device
    (random ones too: each device hashes the same counters). A device named twice is a ValueError."""
    d2 = ("CPU", "CPU:1")
    t = Tensor([1.0, 2.0])
    made = {"list": (Tensor([1.0], device=d2), [1.0]), "zeros": (Tensor.zeros(2, device=d2), [0.0, 0.0]),
            "full": (Tensor.full((2,), 1, device=d2), [1, 1]), "arange": (Tensor.arange(3, device=d2), [0, 1, 2]),
            "full_like": (t.full_like(3.0, device=d2), [3.0, 3.0]), "clone": (t.clone(d2), [1.0, 2.0]),
            "to": (t.to(list(d2)), [1.0, 2.0]), "rand": (Tensor.rand(2, device=d2), None),
            "randn": (Tensor.randn(2, device=d2), None)}
    for name, (x, want) in made.items():
        assert x.device == d2, name
        on0, on1 = x.to("CPU").tolist(), x.to("CPU:1").tolist()
        assert on0 == on1, name
        if want is not None: assert on0 == want, name
    for x in (Tensor.empty(2, device=d2), Tensor.invalids(2, device=d2), t.empty_like(device=d2)):
        assert x.device == d2 and x.shape == (2,)
    u = Tensor([5.0])
    u.to_(d2)
    assert u.device == d2 and u.tolist() == [5.0]
    for fn in (lambda: t.shard(("CPU", "CPU")), lambda: t.to(("CPU", "cpu:0")),
               lambda: Tensor([1.0], device=("CPU", "CPU"))):
        with pytest.raises(ValueError, match="twice"): fn()
    assert t.tolist() == [1.0, 2.0] and t.device == "CPU"   # untouched
    assert t.clone("PYTHON").device == "PYTHON" and t.to("CPU") is t


# ----- autograd: contiguous_backward, no_grad results, second order -----

def test_contiguous_backward():
    check_op([(3, 4)], lambda x: (x * x).exp(), lambda x: (x * x).contiguous_backward().exp())
    check_op([(3, 4), (4, 3)], lambda x, w: (x.T * w).sum(0), lambda x, w: (x.T.contiguous_backward() * w).sum(0))
    # the same gradient as without it
    v = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    x1, x2 = Tensor(v, requires_grad=True), Tensor(v, requires_grad=True)
    (x1.permute(1, 0).contiguous_backward() ** 2).sum().backward()
    (x2.permute(1, 0) ** 2).sum().backward()
    np.testing.assert_array_equal(x1.grad.numpy(), x2.grad.numpy())
    assert x1.contiguous_backward().requires_grad and x1.contiguous_backward().tolist() == v.tolist()


def _under_no_grad(fn):
    Tensor.no_grad = True
    try: return fn()
    finally: Tensor.no_grad = False


def test_backward_of_no_grad_result_raises_like_torch():
    xv = np.array([1.0, 2.0], np.float32)
    x, xt = Tensor(xv, requires_grad=True), torch.tensor(xv, requires_grad=True)
    y = _under_no_grad(lambda: (x * 2).sum())
    with torch.no_grad(): yt = (xt * 2).sum()
    assert not y.requires_grad and not yt.requires_grad
    with pytest.raises(RuntimeError) as e_t: yt.backward()
    with pytest.raises(type(e_t.value), match="does not require grad"): y.backward()
    with pytest.raises(RuntimeError, match="does not require grad"): y.gradient(x)
    # a tensor computed from it outside no_grad still has no graph (torch too) ...
    with pytest.raises(RuntimeError): (yt * 3).backward()
    with pytest.raises(RuntimeError, match="does not require grad"): (y * 3).backward()
    # ... unless a tensor that requires grad joins in: its gradient flows, the no_grad part is a constant
    (y * x).sum().backward()
    (yt * xt).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), xt.grad.numpy())
    # ops with their own backward rule (contiguous_backward, log_softmax, ...) are constants under no_grad too
    x3, xt3 = Tensor(xv, requires_grad=True), torch.tensor(xv, requires_grad=True)
    c = _under_no_grad(lambda: x3.contiguous_backward().sum() + x3.log_softmax(0).sum())
    with torch.no_grad(): ct = xt3.sum() + xt3.log_softmax(0).sum()
    (c * x3 + x3.relu()).sum().backward()
    (ct * xt3 + xt3.relu()).sum().backward()
    np.testing.assert_allclose(x3.grad.numpy(), xt3.grad.numpy(), rtol=1e-6)
    # outside no_grad everything works again
    x2 = Tensor(xv, requires_grad=True)
    (x2 * 2).sum().backward()
    assert x2.grad.tolist() == [2.0, 2.0]


def test_second_order_gradient():
    xv = np.array([1.0, 2.0, -3.0, 0.5], np.float32)
    x, xt = Tensor(xv, requires_grad=True), torch.tensor(xv, requires_grad=True)
    (g,) = (x ** 3).sum().gradient(x)
    (gt,) = torch.autograd.grad((xt ** 3).sum(), xt, create_graph=True)
    np.testing.assert_allclose(g.numpy(), gt.detach().numpy())
    g.realize()   # realizing the first gradient keeps its graph
    (g2,) = g.sum().gradient(x)
    (g2t,) = torch.autograd.grad(gt.sum(), xt, create_graph=True)
    np.testing.assert_allclose(g2.numpy(), g2t.detach().numpy())
    (g3,) = g2.sum().gradient(x)
    (g3t,) = torch.autograd.grad(g2t.sum(), xt)
    np.testing.assert_allclose(g3.numpy(), g3t.numpy())


def test_second_order_backward_and_hessian_vector_product():
    rng = np.random.default_rng(0)
    W, xv, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3,), (3,)))
    # backward() of a gradient fills .grad with the second derivative, like torch with create_graph=True
    x, xt = Tensor(xv, requires_grad=True), torch.tensor(xv, requires_grad=True)
    (g,) = (x.sin() * x).sum().gradient(x)
    (gt,) = torch.autograd.grad((xt.sin() * xt).sum(), xt, create_graph=True)
    g.sum().backward()
    gt.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    # Hessian-vector product through a matmul and tanh
    x, xt = Tensor(xv, requires_grad=True), torch.tensor(xv, requires_grad=True)
    (g,) = (Tensor(W) @ x).tanh().square().sum().gradient(x)
    (gt,) = torch.autograd.grad((torch.tensor(W) @ xt).tanh().square().sum(), xt, create_graph=True)
    (hv,) = (g.realize() * Tensor(v)).sum().gradient(x)
    (hvt,) = torch.autograd.grad((gt * torch.tensor(v)).sum(), xt)
    np.testing.assert_allclose(hv.numpy(), hvt.numpy(), rtol=1e-4, atol=1e-5)


# ----- pad modes: gradients and dtypes vs torch -----

@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_mode_gradients(mode):
    import torch.nn.functional as F
    pads = (2, 1, 1, 2)
    kw = {"value": 1.5} if mode == "constant" else {}
    # torch wants a batch axis in front for the non-constant modes; the sum upstream counts repeated elements
    check_op([(2, 3, 4)], lambda x: F.pad(x, pads, mode=mode, **kw), lambda x: x.pad(pads, mode=mode, **kw),
             upstream="sum")
    check_op([(2, 3, 4)], lambda x: F.pad(x, pads, mode=mode, **kw).exp(),
             lambda x: x.pad(pads, mode=mode, **kw).exp())
    # the pad of a computed (non-leaf) tensor, an int tensor (forward only), and NumPy's np.pad for the 1-d case
    check_op([(1, 4, 5)], lambda x: F.pad(x * x, (3, 0, 0, 3), mode=mode),
             lambda x: (x * x).pad((3, 0, 0, 3), mode=mode))
    check_op([(1, 3, 4)], lambda x: F.pad(x, pads, mode=mode), lambda x: x.pad(pads, mode=mode), dtype=np.int32,
             low=-50, high=50)
    v = np.arange(5, dtype=np.int32) * 3 - 4
    np_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    np.testing.assert_array_equal(Tensor(v).pad((3, 2), mode=mode).numpy(), np.pad(v, (3, 2), mode=np_mode))


def test_tensor_from_path(tmp_path):
    a = np.arange(-3, 5, dtype=np.float32)
    f = tmp_path / "w.bin"
    a.tofile(f)
    t = Tensor(f)
    assert t.dtype == dtypes.uint8 and t.shape == (a.nbytes,)
    np.testing.assert_array_equal(t.numpy(), np.fromfile(f, np.uint8))
    np.testing.assert_array_equal(Tensor(f, dtype=dtypes.float32).numpy(), np.fromfile(f, np.float32))
    np.testing.assert_array_equal(Tensor(f).bitcast(dtypes.float32).numpy(), torch.from_file(str(f), size=8).numpy())
    assert Tensor(f, device="PYTHON").device == "PYTHON"
    with pytest.raises(FileNotFoundError): Tensor(tmp_path / "missing.bin")
