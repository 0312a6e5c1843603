"""Random and creation functions: randint, randperm, normal, uniform, the initializers (scaled_uniform, glorot_uniform,
kaiming_uniform, kaiming_normal), multinomial, linspace and manual_seed determinism (also across CPU and PYTHON).
Statistical checks use sample sizes where the stated tolerance is > 5 standard errors."""
import math

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes


@pytest.fixture(autouse=True)
def _seed():
    Tensor.manual_seed(42)
    yield


# ----- randint -----

@pytest.mark.parametrize("low,high", [(0, 10), (-5, 5), (3, 4), (-100, -90), (0, 2)], ids=str)
def test_randint_range(low, high):
    t = Tensor.randint(4000, low=low, high=high)
    assert t.shape == (4000,) and t.dtype == dtypes.int32
    v = t.numpy()
    assert v.min() >= low and v.max() < high
    # every value shows up, with roughly equal frequency
    counts = np.bincount(v - low, minlength=high - low)
    assert len(counts) == high - low and counts.min() > 0
    expected = 4000 / (high - low)
    assert np.all(np.abs(counts - expected) < 6 * math.sqrt(expected) + 1), counts


@pytest.mark.parametrize("dtype", ["int64", "int8", "int16", "uint8", "int32"])
def test_randint_dtype(dtype):
    t = Tensor.randint(2, 3, 50, low=0, high=100, dtype=dtype)
    assert t.shape == (2, 3, 50) and t.dtype == getattr(dtypes, dtype)
    v = t.numpy()
    assert v.dtype == np.dtype(dtype) and v.min() >= 0 and v.max() < 100


def test_randint_bad_range_and_python():
    with pytest.raises(RuntimeError):
        Tensor.randint(3, low=5, high=5)
    v = Tensor.randint(50, low=-2, high=3, device="PYTHON").numpy()
    assert v.min() >= -2 and v.max() < 3


# ----- randperm -----

@pytest.mark.parametrize("n", [1, 2, 7, 64, 200])
def test_randperm_is_permutation(n):
    t = Tensor.randperm(n)
    assert t.shape == (n,) and t.dtype == dtypes.int32
    np.testing.assert_array_equal(np.sort(t.numpy()), np.arange(n))


def test_randperm_dtype_python_and_shuffles():
    t = Tensor.randperm(10, dtype="int64")
    assert t.dtype == dtypes.int64
    np.testing.assert_array_equal(np.sort(t.numpy()), np.arange(10))
    p = Tensor.randperm(6, device="PYTHON").numpy()
    np.testing.assert_array_equal(np.sort(p), np.arange(6))
    # not the identity, and different draws differ
    a, b = Tensor.randperm(100).numpy(), Tensor.randperm(100).numpy()
    assert not np.array_equal(a, np.arange(100)) and not np.array_equal(a, b)


def test_randperm_looks_random():
    # a uniformly random permutation of n: position and value are uncorrelated (|r| ~ 1/sqrt(n)), the number of fixed
    # points is ~Poisson(1), and the first half holds about half of the small values
    n = 2000
    p = Tensor.randperm(n).numpy().astype(np.float64)
    r = np.corrcoef(np.arange(n), p)[0, 1]
    assert abs(r) < 6 / math.sqrt(n), r
    assert (p == np.arange(n)).sum() < 8
    small_in_first_half = (p[: n // 2] < n // 2).sum()
    assert abs(small_in_first_half - n / 4) < 6 * math.sqrt(n / 16), small_in_first_half


# ----- normal / uniform -----

@pytest.mark.parametrize("mean,std", [(0.0, 1.0), (3.0, 0.5), (-2.0, 4.0)], ids=str)
def test_normal_statistics(mean, std):
    t = Tensor.normal(100, 200, mean=mean, std=std)
    assert t.shape == (100, 200) and t.dtype == dtypes.float32
    v = t.numpy().astype(np.float64)
    n = v.size
    assert abs(v.mean() - mean) < 6 * std / math.sqrt(n)
    assert abs(v.std() - std) < 0.02 * std
    # roughly normal: ~68.3% within one std, ~95.4% within two
    z = np.abs(v - mean) / std
    assert abs((z < 1).mean() - 0.6827) < 0.01 and abs((z < 2).mean() - 0.9545) < 0.006


def test_normal_dtype():
    t = Tensor.normal(8, 8, mean=1.0, std=2.0, dtype="float64")
    assert t.dtype == dtypes.float64 and t.shape == (8, 8)
    t = Tensor.normal(8, dtype="float16")
    assert t.dtype == dtypes.float16


@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-3.0, 2.0), (5.0, 5.5)], ids=str)
def test_uniform_statistics(low, high):
    v = Tensor.uniform(200, 100, low=low, high=high).numpy().astype(np.float64)
    assert v.min() >= low and v.max() < high
    w = high - low
    assert abs(v.mean() - (low + high) / 2) < 6 * w / math.sqrt(12 * v.size)
    assert abs(v.std() - w / math.sqrt(12)) < 0.02 * w
    hist = np.histogram(v, bins=10, range=(low, high))[0]
    assert np.all(np.abs(hist - v.size / 10) < 6 * math.sqrt(v.size / 10)), hist


def test_uniform_dtype_and_python():
    t = Tensor.uniform(5, 5, low=-1, high=1, dtype="float64")
    assert t.dtype == dtypes.float64
    v = Tensor.uniform(20, low=2.0, high=3.0, device="PYTHON").numpy()
    assert v.min() >= 2.0 and v.max() < 3.0


# ----- initializers -----

@pytest.mark.parametrize("shape", [(64, 32), (16, 8, 3, 3), (500,)], ids=str)
def test_scaled_uniform(shape):
    v = Tensor.scaled_uniform(*shape).numpy()
    assert v.shape == shape
    bound = math.prod(shape) ** -0.5
    assert np.abs(v).max() <= bound * (1 + 1e-6)
    assert np.abs(v).max() > 0.9 * bound                     # it actually spans the range
    assert abs(v.std() - bound / math.sqrt(3)) < 0.1 * bound


@pytest.mark.parametrize("shape", [(64, 32), (16, 8, 3, 3), (100, 50)], ids=str)
def test_glorot_uniform(shape):
    v = Tensor.glorot_uniform(*shape).numpy()
    bound = math.sqrt(6 / (shape[0] + math.prod(shape[1:])))
    assert v.shape == shape and np.abs(v).max() <= bound * (1 + 1e-6) and np.abs(v).max() > 0.9 * bound
    assert abs(v.std() - bound / math.sqrt(3)) < 0.1 * bound


@pytest.mark.parametrize("shape,a", [((64, 32), 0.01), ((16, 8, 3, 3), 0.01), ((50, 40), math.sqrt(5))], ids=str)
def test_kaiming_uniform(shape, a):
    v = Tensor.kaiming_uniform(*shape, a=a).numpy()
    fan_in = math.prod(shape[1:])
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a * a)) / math.sqrt(fan_in)
    assert np.abs(v).max() <= bound * (1 + 1e-6) and np.abs(v).max() > 0.9 * bound
    # the same bound torch.nn.init.kaiming_uniform_ uses (fan_in mode, leaky_relu)
    w = torch.empty(shape)
    torch.nn.init.kaiming_uniform_(w, a=a)
    assert w.abs().max().item() <= bound * (1 + 1e-6)


@pytest.mark.parametrize("shape,a", [((128, 64), 0.01), ((32, 16, 3, 3), 0.0), ((200, 100), 1.0)], ids=str)
def test_kaiming_normal(shape, a):
    v = Tensor.kaiming_normal(*shape, a=a).numpy().astype(np.float64)
    std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(math.prod(shape[1:]))
    assert abs(v.std() - std) < 0.03 * std
    assert abs(v.mean()) < 6 * std / math.sqrt(v.size)
    w = torch.empty(shape)
    torch.nn.init.kaiming_normal_(w, a=a)
    assert abs(w.std().item() - std) < 0.05 * std


# ----- multinomial -----

def test_multinomial_with_replacement_distribution():
    p = np.array([0.1, 0.2, 0.0, 0.7], np.float32)
    s = Tensor(p).multinomial(20000, replacement=True)
    assert s.shape == (20000,) and s.dtype == dtypes.int32
    v = s.numpy()
    freq = np.bincount(v, minlength=4) / v.size
    assert freq[2] == 0
    np.testing.assert_allclose(freq, p, atol=0.015)


def test_multinomial_unnormalized_2d():
    w = np.array([[1.0, 1.0, 2.0], [0.0, 5.0, 5.0]], np.float32)
    s = Tensor(w).multinomial(6000, replacement=True).numpy()
    assert s.shape == (2, 6000)
    for row, wr in zip(s, w):
        np.testing.assert_allclose(np.bincount(row, minlength=3) / row.size, wr / wr.sum(), atol=0.025)


def test_multinomial_without_replacement():
    p = np.array([[0.05, 0.3, 0.0, 0.4, 0.25], [1.0, 1.0, 1.0, 1.0, 1.0]], np.float32)
    s = Tensor(p).multinomial(4, replacement=False).numpy()
    assert s.shape == (2, 4)
    for row in s: assert len(set(row.tolist())) == 4 and row.min() >= 0 and row.max() < 5
    assert 2 not in s[0]
    # all categories with positive weight, without replacement: a permutation of them
    s = Tensor(np.array([0.1, 0.6, 0.3], np.float32)).multinomial(3).numpy()
    assert sorted(s.tolist()) == [0, 1, 2]


def test_multinomial_without_replacement_first_draw_distribution():
    p = np.array([0.1, 0.6, 0.3], np.float32)
    firsts = Tensor(np.tile(p, (3000, 1))).multinomial(2, replacement=False).numpy()
    freq = np.bincount(firsts[:, 0], minlength=3) / 3000
    np.testing.assert_allclose(freq, p, atol=0.04)
    # second draw: P(second = j) = sum_i p_i p_j / (1 - p_i)
    second = np.array([sum(p[i] * p[j] / (1 - p[i]) for i in range(3) if i != j) for j in range(3)])
    np.testing.assert_allclose(np.bincount(firsts[:, 1], minlength=3) / 3000, second, atol=0.04)


def test_multinomial_errors():
    with pytest.raises(RuntimeError):
        Tensor([0.5, 0.5]).multinomial(3, replacement=False)
    with pytest.raises(RuntimeError):
        Tensor.ones(2, 2, 2).multinomial(1)


# ----- linspace -----

@pytest.mark.parametrize("start,stop,steps", [(0, 1, 5), (-2, 2, 9), (1, -1, 4), (3, 3, 3), (0, 10, 1), (0, 1, 0),
                                              (0.5, 100.25, 37), (-1e3, 1e3, 2)], ids=str)
def test_linspace(start, stop, steps):
    t = Tensor.linspace(start, stop, steps)
    ref = torch.linspace(start, stop, steps)
    assert t.shape == tuple(ref.shape) and t.dtype == dtypes.float32
    np.testing.assert_allclose(t.numpy(), ref.numpy(), rtol=1e-6, atol=1e-5)


def test_linspace_dtype_python_and_error():
    t = Tensor.linspace(0, 1, 11, dtype="float64")
    assert t.dtype == dtypes.float64
    np.testing.assert_allclose(t.numpy(), torch.linspace(0, 1, 11, dtype=torch.float64).numpy(), rtol=1e-7)
    np.testing.assert_allclose(Tensor.linspace(-1, 1, 5, device="PYTHON").numpy(), [-1, -0.5, 0, 0.5, 1])
    with pytest.raises(RuntimeError):
        Tensor.linspace(0, 1, -1)


# ----- manual_seed determinism -----

GENERATORS = [
    ("rand", lambda d: Tensor.rand(3, 5, device=d)),
    ("randn", lambda d: Tensor.randn(4, 3, device=d)),
    ("randint", lambda d: Tensor.randint(2, 7, low=-3, high=9, device=d)),
    ("randperm", lambda d: Tensor.randperm(9, device=d)),
    ("normal", lambda d: Tensor.normal(6, mean=2.0, std=3.0, device=d)),
    ("uniform", lambda d: Tensor.uniform(2, 4, low=-5.0, high=5.0, device=d)),
    ("kaiming_uniform", lambda d: Tensor.kaiming_uniform(4, 3, device=d)),
    ("multinomial", lambda d: Tensor([0.2, 0.3, 0.5], device=d).multinomial(8, replacement=True)),
    ("multinomial_norep", lambda d: Tensor([0.2, 0.3, 0.5, 0.1], device=d).multinomial(3)),
]


@pytest.mark.parametrize("name,gen", GENERATORS, ids=[g[0] for g in GENERATORS])
def test_manual_seed_determinism(name, gen):
    Tensor.manual_seed(7)
    a, b = gen("CPU").numpy(), gen("CPU").numpy()
    Tensor.manual_seed(7)
    a2, b2 = gen("CPU").numpy(), gen("CPU").numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    Tensor.manual_seed(8)
    c = gen("CPU").numpy()
    if name not in ("randperm", "multinomial_norep"):  # tiny outputs of those may coincide by chance
        assert not np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("name,gen", [g for g in GENERATORS if g[0] in ("rand", "randint", "randperm", "uniform")],
                         ids=["rand", "randint", "randperm", "uniform"])
def test_manual_seed_same_on_cpu_and_python(name, gen):
    Tensor.manual_seed(123)
    a = gen("CPU").numpy()
    Tensor.manual_seed(123)
    b = gen("PYTHON").numpy()
    np.testing.assert_array_equal(a, b)


def test_dropout_mask_is_seeded():
    x = Tensor.ones(8, 8)
    with Tensor.train():
        Tensor.manual_seed(5)
        a = x.dropout(0.5).numpy()
        Tensor.manual_seed(5)
        b = x.dropout(0.5).numpy()
    np.testing.assert_array_equal(a, b)
