"""Split reduce (schedule/split.py): a long reduction into few outputs runs as two kernels, a partial per chunk and a
reduce of the partials. Kernel counts and plans first, then values against numpy on every device that is here."""
import numpy as np
import pytest

from fusegrad import Device, GlobalCounters, Tensor, Variable, dtypes
from fusegrad.helpers import Context
from fusegrad.ir.ops import Ops
from fusegrad.schedule.split import SplitTarget, split_plan

RNG = np.random.default_rng(5)


def n_kernels(t: Tensor) -> int:
    return sum(1 for si in t.schedule() if not si.is_copy)


def reduce_node(t: Tensor):
    return next(n for n in t.uop.toposort() if n.op is Ops.REDUCE_AXIS)


# ---- which reduces are split, and how

def test_long_sum_is_two_kernels_short_sum_one():
    assert n_kernels(Tensor.empty(1 << 24).sum()) == 2
    assert n_kernels(Tensor.empty(1 << 24).max()) == 2
    assert n_kernels(Tensor.empty(1000).sum()) == 1
    with Context(SPLIT_REDUCE=0): assert n_kernels(Tensor.empty(1 << 24).sum()) == 1


def test_many_outputs_and_matmul_stay_one_kernel():
    a, b = Tensor.empty(64, 1 << 15), Tensor.empty(1 << 15, 64)
    assert n_kernels((a.reshape(64, 1, 1 << 15) * b.T.reshape(1, 64, 1 << 15)).sum(2)) == 1
    assert n_kernels(a @ b) == 1
    assert n_kernels(Tensor.empty(4096, 1 << 15).sum(1)) == 1


def test_split_partials_are_chunks_of_the_flattened_reduce():
    """16M into one output, 2 threads: 16 chunks of 1M (a multiple of the thread count, each vectorizable)."""
    cpu = SplitTarget(want=16, multiple=2, min_work=1 << 20, cache_bytes=1 << 20)
    assert split_plan(reduce_node(Tensor.empty(1 << 24).sum()), cpu) == (16, 1 << 20)
    # an odd length: the chunk is a multiple of 256 and the tail (reduced in kernel 2) stays small
    p, c = split_plan(reduce_node(Tensor.empty(2_000_003).sum()), cpu)
    assert p == 16 and c % 256 == 0 and 0 < 2_000_003 - p * c < p * 256
    # 3 columns: P*3 >= 16 in a multiple of 2, and a chunk of the 12 MB matrix fits in half the cache
    p, c = split_plan(reduce_node(Tensor.empty(1_000_000, 3).sum(0)), cpu)
    assert p % 2 == 0 and p * 3 >= 16 and c * 3 * 4 <= 1 << 19
    assert split_plan(reduce_node(Tensor.empty(64, 1 << 20).sum(1)), cpu) is None         # enough outputs
    assert split_plan(reduce_node(Tensor.empty(1 << 19).sum()), cpu) is None              # too small to pay
    # a loop limit splits whatever the outputs, into chunks of at most half of it
    lim = SplitTarget(want=256, min_chunk=1024, loop_limit=65535)
    p, c = split_plan(reduce_node(Tensor.empty(4096, 300_000).sum(1)), lim)
    assert c <= 32767 and p * c <= 300_000 < p * c + 8192


def test_symbolic_length_is_not_split():
    x = Tensor(np.ones(100_000, np.float32))
    n = Variable("n", 1, 100_000).bind(70_000)
    assert n_kernels(x[:n].sum()) == 1
    assert x[:n].sum().item() == 70_000


def test_split_of_a_fused_producer_and_its_consumer():
    """(a*b).sum() fuses the product into the partial kernel; x - x.mean() fuses the reduce of the partials (a
    few values, hoisted out of the output loop) into the elementwise kernel."""
    a, b = Tensor.empty(1 << 20), Tensor.empty(1 << 20)
    (k1, k2) = [si for si in (a * b).sum().schedule() if not si.is_copy]
    assert "MUL" in k1.tensor_ops and len(k1.bufs) == 3 and len(k2.bufs) == 2
    assert n_kernels(a - a.mean()) == 2


# ---- values, on every device here

def _here(dev: str) -> bool:
    try: Device[dev]
    except Exception:  # noqa: BLE001 - no driver, no library: not here
        return False
    return True


def _devices() -> list[str]:
    return [d for d in ("CPU", "LLVM", "CL", "WEBGPU") if _here(d)]


N = (1 << 20) + 7    # odd: a tail after the chunks; long enough to split on a CPU (CPU_MIN_WORK)
N_GPU = 300_001      # GPU-style devices split shorter reduces (and lavapipe is slow)
X = RNG.standard_normal(N).astype(np.float32)
M3 = RNG.standard_normal((1_000_000, 3)).astype(np.float32)


def check_values(dev: str, x_np: np.ndarray, m3_np: np.ndarray) -> None:
    n = len(x_np)
    x = Tensor(x_np, device=dev)
    GlobalCounters.reset()
    s = x.sum().item()
    assert GlobalCounters.kernel_count == 2, GlobalCounters.kernel_count
    np.testing.assert_allclose(s, x_np.sum(dtype=np.float64), rtol=1e-4, atol=1e-2)
    assert x.max().item() == x_np.max() and x.min().item() == x_np.min()
    np.testing.assert_allclose(x.mean().item(), x_np.mean(dtype=np.float64), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(x.var().item(), x_np.astype(np.float64).var(ddof=1), rtol=1e-4)
    assert x.argmax().item() == x_np.argmax() and x.argmin().item() == x_np.argmin()
    y_np = RNG.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose((x * Tensor(y_np, device=dev)).sum().item(), (x_np.astype(np.float64) * y_np).sum(),
                               rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(x.softmax(0).numpy(), np.exp(x_np - x_np.max()) / np.exp(x_np - x_np.max()).sum(),
                               rtol=1e-4, atol=1e-9)
    p_np = np.ones(n, np.float32)   # powers of two: exact in any order (float32 products of values near 1 are not)
    p_np[RNG.choice(n, 40, replace=False)] = np.array([2.0] * 25 + [0.5] * 10 + [-1.0] * 5, np.float32)
    assert Tensor(p_np, device=dev).prod().item() == -(2.0 ** 15)
    # ints: wrapping sums and products are exact in any order
    i_np = RNG.integers(-2**31, 2**31 - 1, n, dtype=np.int32)
    assert Tensor(i_np, device=dev).sum().item() == int(i_np.sum(dtype=np.int32))
    assert Tensor(i_np, device=dev).max().item() == i_np.max() and Tensor(i_np, device=dev).min().item() == i_np.min()
    s_np = RNG.choice(np.array([1, -1, 3], np.int32), n)
    assert Tensor(s_np, device=dev).prod().item() == int(np.prod(s_np, dtype=np.int32))
    u_np = RNG.integers(0, 256, n, dtype=np.uint8)
    got = Tensor(u_np, device=dev).sum()
    assert got.dtype == dtypes.uint32 and got.item() == int(u_np.sum())
    assert Tensor(u_np == 7, device=dev).any().item() and not Tensor(u_np == 7, device=dev).all().item()
    # a tall matrix with 3 columns, reduced over its rows, and a reduce over two axes keeping the middle one
    m = Tensor(m3_np, device=dev)
    np.testing.assert_allclose(m.sum(0).numpy(), m3_np.astype(np.float64).sum(0), rtol=1e-4, atol=1e-2)
    np.testing.assert_array_equal(m.max(0).numpy(), m3_np.max(0))
    t_np = x_np[: (n // 300) * 300].reshape(-1, 3, 100)
    np.testing.assert_allclose(Tensor(t_np, device=dev).sum((0, 2)).numpy(),
                               t_np.astype(np.float64).sum((0, 2)), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("dev", _devices())
def test_values_against_numpy(dev):
    check_values(dev, X if dev in ("CPU", "LLVM") else X[:N_GPU], M3)


def test_values_against_numpy_python_backend():
    """The reference backend is slow: small sizes, with the split threshold lowered to match."""
    with Context(SPLIT_REDUCE=64):
        check_values("PYTHON", X[:1001], M3[:1001])


def test_half_sum_accumulates_in_float():
    h = (RNG.standard_normal(1 << 20) * 0.001 + 0.01).astype(np.float16)   # a sum of 10500: fits in half
    got = Tensor(h).sum()
    assert got.dtype == dtypes.float16 and n_kernels(Tensor(h).sum()) == 2
    np.testing.assert_allclose(float(got.item()), float(h.astype(np.float64).sum()), rtol=2e-3)
    np.testing.assert_allclose(float(Tensor(h).mean().item()), float(h.astype(np.float64).mean()), rtol=2e-3)
