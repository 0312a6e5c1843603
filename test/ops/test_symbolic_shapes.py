"""Variable (symbolic ints) in shapes and slices: results against NumPy for several bound values, one compiled kernel
for every value of a variable, and clear errors for out-of-range and unbound variables."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad import Tensor, Variable
from fusegrad.engine import realize
from fusegrad.ir.ops import Ops
from .helpers import _optional_device

# WEBGPU's runtime doesn't pass int kernel arguments yet
DEVICES = ["CPU", "PYTHON"] + [_optional_device(d) for d in ("CL", "LLVM", "WEBGPU")]
VALUES = (1, 3, 6)
rng = np.random.default_rng(0)
A = rng.standard_normal((6, 4)).astype(np.float32)
B = rng.standard_normal((4, 5)).astype(np.float32)


def kernel_asts(t: Tensor) -> list:
    return [si.ast for si in t.schedule() if not si.is_copy]


def check_all_values(fn, ref, device):
    """fn(bound variable, device) -> Tensor must equal ref(k) for every value, through the same kernel ASTs (so the
    same compiled programs: the engine caches programs by AST) and with at most that many new compiles."""
    n = Variable("n", 1, 6)
    asts = set()
    before = len(realize._programs)
    for k in VALUES:
        t = fn(n.bind(k), device)
        asts.add(tuple(kernel_asts(t)))
        np.testing.assert_allclose(t.numpy(), ref(k), rtol=1e-5, atol=1e-5)
    assert len(asts) == 1, "a different value of the variable gave a different kernel"
    assert len(realize._programs) - before <= len(next(iter(asts)))


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise_slice(device):
    check_all_values(lambda b, d: (Tensor(A, device=d)[:b] * 2 + 1).relu(), lambda k: np.maximum(A[:k] * 2 + 1, 0),
                     device)


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_over_symbolic_axis(device):
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].sum(0), lambda k: A[:k].sum(0), device)
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].max(0), lambda k: A[:k].max(0), device)


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_keeping_symbolic_axis(device):
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].sum(1), lambda k: A[:k].sum(1), device)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_matmul_symbolic_rows_and_inner(device):
    check_all_values(lambda b, d: Tensor(A, device=d)[:b] @ Tensor(B, device=d), lambda k: A[:k] @ B, device)
    # the reduce axis symbolic: (4, n) @ (n, 4)
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].T @ Tensor(A, device=d)[:b], lambda k: A[:k].T @ A[:k],
                     device)


def test_reshape_symbolic():
    flat = A.reshape(-1)
    check_all_values(lambda b, d: Tensor(flat, device=d)[:b * 4].reshape(b, 4), lambda k: A[:k], "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].reshape(b * 4), lambda k: A[:k].reshape(-1), "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].reshape(b, 2, 2).sum(2), lambda k: A[:k].reshape(k, 2, 2)
                     .sum(2), "CPU")


def test_cat_along_symbolic_axis():
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].cat(Tensor(A, device=d), dim=0),
                     lambda k: np.concatenate([A[:k], A]), "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].cat(Tensor(A, device=d)[:b] * 2, dim=0),
                     lambda k: np.concatenate([A[:k], A[:k] * 2]), "CPU")


def test_creation_and_shape():
    n = Variable("n", 1, 10)
    b = n.bind(3)
    assert b.unbind() == (n, 3)
    e = Tensor.empty(2, b, 4)
    assert e.shape == (2, b, 4) and e.numpy().shape == (2, 3, 4)
    o = Tensor.ones(b, 4)
    assert o.shape == (b, 4)
    np.testing.assert_equal(o.numpy(), np.ones((3, 4), np.float32))
    np.testing.assert_equal((Tensor.full((b,), 7) + Tensor.arange(10)[:b]).tolist(), [7, 8, 9])
    # a realized symbolic tensor is read back by later kernels
    c = (Tensor(A)[:Variable("m", 1, 6).bind(3)] + 1).realize()
    np.testing.assert_allclose((c * c).sum(0).numpy(), ((A[:3] + 1) ** 2).sum(0), rtol=1e-5)


def test_kernel_takes_the_variable_as_an_argument():
    n = Variable("n", 1, 6)
    ast = kernel_asts(Tensor(A)[:n.bind(4)].sum(0))[0]
    assert any(u.op is Ops.DEFINE_VAR for u in ast.toposort())
    assert not any(u.op is Ops.BIND for u in ast.toposort())
    prg = realize.get_runner(ast, "CPU")
    assert prg.spec.vars == [n] and "int n" in prg.spec.src


def test_errors():
    n = Variable("n", 1, 6)
    with pytest.raises(ValueError, match="'n'.*outside"): n.bind(7)
    with pytest.raises(ValueError, match="'n'.*outside"): n.bind(0)
    with pytest.raises(TypeError): n.bind(2.5)
    with pytest.raises(ValueError, match="min_val <= max_val"): Variable("m", 5, 2)
    t = Tensor.ones(n, 4)   # an unbound variable in a shape: fine lazily, an error when run
    with pytest.raises(ValueError, match="'n'.*not bound"): (t * 2).realize()
    with pytest.raises(ValueError, match="'n'.*not bound"): t.numpy()
    with pytest.raises(IndexError): Tensor(A)[:Variable("big", 7, 9).bind(8)]   # past A's 6 rows for every value
    with pytest.raises(ValueError): Tensor(A)[:Variable("big", 7, 9).bind(8)]   # (tinygrad's "invalid shrink" type)
    with pytest.raises(ValueError): Tensor(A).shrink(((0, 7), None))
    with pytest.raises(IndexError, match=r"\(0, big\) = \(0, 8\).*size 6"): Tensor(A)[:Variable("big", 1, 9).bind(8)]
    with pytest.raises(NotImplementedError): Tensor(A)[:n.bind(2)].reshape(-1)
    with pytest.raises(NotImplementedError): Tensor(A)[:n.bind(2):2]


def test_movement_on_symbolic_axes():
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].pad(((1, 2), (0, 1))),
                     lambda k: np.pad(A[:k], ((1, 2), (0, 1))), "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].min(0), lambda k: A[:k].min(0), "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b, :1].expand(b, 5),
                     lambda k: np.broadcast_to(A[:k, :1], (k, 5)), "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].permute(1, 0) + 1, lambda k: A[:k].T + 1, "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:, :2][:b], lambda k: A[:k, :2], "CPU")
    i = Variable("i", 0, 5)
    for k in (0, 2, 5):   # a symbolic int index drops its axis
        np.testing.assert_allclose(Tensor(A)[i.bind(k)].numpy(), A[k])


def test_symbolic_count_as_a_value():
    """mean/var/std divide by a symbolic count: the kernel reads the variable's value."""
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].mean(0), lambda k: A[:k].mean(0), "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].mean(), lambda k: A[:k].mean(), "CPU")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].std(1), lambda k: A[:k].std(1, ddof=1), "PYTHON")
    check_all_values(lambda b, d: Tensor(A, device=d)[:b] + b, lambda k: A[:k] + k, "CPU")
    check_all_values(lambda b, d: Tensor(b, device=d) * 2, lambda k: np.int32(2 * k), "CPU")
    n = Variable("n", 1, 6)
    assert np.isnan(Tensor(A)[:n.bind(1)].var(0).numpy()).all()   # n - 1 == 0: 0/0, like torch


def test_softmax_and_attention_over_symbolic_length():
    import torch
    check_all_values(lambda b, d: Tensor(A, device=d)[:b].softmax(0), lambda k: torch.tensor(A[:k]).softmax(0).numpy(),
                     "CPU")
    q = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)

    def ref(k):
        t = torch.tensor(q[:, :, :k])
        return torch.nn.functional.scaled_dot_product_attention(t, t, t).numpy()
    check_all_values(lambda b, d: (t := Tensor(q, device=d)[:, :, :b]).scaled_dot_product_attention(t, t), ref, "CPU")


def test_gradient_through_symbolic_slice():
    n = Variable("n", 1, 6)
    for k in VALUES:
        x = Tensor(A, requires_grad=True)
        (x[:n.bind(k)] * 3).relu().sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), np.where((np.arange(6) < k)[:, None] & (A > 0), 3.0, 0.0))


@pytest.mark.parametrize("device", DEVICES)
def test_symbolic_sizes_under_tinyjit(device):
    """A variable size is an int argument of the kernel (WEBGPU: a small uniform buffer after the data buffers): one
    captured kernel serves every bound value, also outside the JIT."""
    from fusegrad import TinyJit
    n = Variable("n", 1, 16)
    xn = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32)
    x = Tensor(xn, device=device).realize()

    @TinyJit
    def f(a): return (a * 2 + 1).sum(0).realize()
    for k in (3, 5, 16, 2):
        np.testing.assert_allclose(f(x[:n.bind(k)]).numpy(), (xn[:k] * 2 + 1).sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((x[:n.bind(7)] * 3).numpy(), xn[:7] * 3)


# ----- canonical sizes, creation, slicing, 64-bit values, the Variable API --------------------------------------------

def test_commutative_sizes_are_one_size():
    """i + j and j + i (and i * j, j * i) are the same size: shapes compare equal and broadcast, cat and reshape
    accept them; the values are NumPy's on the bound values."""
    from fusegrad.ir.shape import sym_eq
    i, j = Variable("i", 1, 4), Variable("j", 1, 4)
    assert sym_eq(i + j, j + i) and sym_eq(i * j, j * i) and sym_eq(2 * i + j, j + i + i) and not sym_eq(i, j)
    for ki, kj in ((1, 2), (3, 1), (4, 4)):
        bi, bj = i.bind(ki), j.bind(kj)
        a, b = Tensor.ones(bi + bj, 2), Tensor.full((bj + bi, 2), 2.0)
        assert a.shape == b.shape
        np.testing.assert_equal((a + b).numpy(), np.full((ki + kj, 2), 3.0, np.float32))
        x = Tensor(A)[:bi].cat(Tensor(A)[:bj])              # (i + j, 4)
        y = Tensor(A)[:bj].cat(Tensor(A)[:bi]) * 10         # (j + i, 4)
        np.testing.assert_allclose((x + y).numpy(), np.concatenate([A[:ki], A[:kj]]) +
                                   10 * np.concatenate([A[:kj], A[:ki]]), rtol=1e-6)
        flat = Tensor(np.arange(16, dtype=np.float32))[:bi * bj]
        np.testing.assert_equal(flat.reshape(bj, bi).numpy(), np.arange(ki * kj, dtype=np.float32).reshape(kj, ki))
        assert flat.reshape(bj, bi).reshape(bj * bi).shape == flat.shape
        np.testing.assert_equal((Tensor.ones(bi, bj).flatten() + Tensor.arange(bj * bi)).numpy(),
                                np.arange(ki * kj) + 1)
        assert Tensor.ones(1 + bi).shape == Tensor.ones(bi + 1).shape


def test_full_with_a_variable_value():
    """Tensor.full(shape, v) with a bound Variable v: the kernel reads v's value (one kernel for every value)."""
    check_all_values(lambda b, d: Tensor.full((2, 3), b, device=d), lambda k: np.full((2, 3), k, np.int32), "CPU")
    check_all_values(lambda b, d: Tensor.full((b, 2), b, device=d) * 2 + Tensor(A, device=d)[:b, :2],
                     lambda k: np.full((k, 2), 2 * k, np.float32) + A[:k, :2], "CPU")
    check_all_values(lambda b, d: Tensor.full((), b + 1, dtype="float32", device=d) / 2,
                     lambda k: np.float32((k + 1) / 2), "PYTHON")
    assert Tensor.full((2,), Variable("n", 1, 6).bind(2)).dtype == Tensor([1]).dtype   # the default int


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_creation_with_symbolic_sizes(device):
    check_all_values(lambda b, d: Tensor.zeros(b, 3, device=d), lambda k: np.zeros((k, 3), np.float32), device)
    check_all_values(lambda b, d: Tensor.ones((2, b), device=d, dtype="int32"), lambda k: np.ones((2, k), np.int32),
                     device)
    check_all_values(lambda b, d: Tensor.full((b,), 7, device=d) + Tensor.arange(6, device=d)[:b],
                     lambda k: 7 + np.arange(k), device)
    n = Variable("n", 1, 6)
    for k in VALUES:
        assert Tensor.empty(n.bind(k), 3, device=device).numpy().shape == (k, 3)
        assert Tensor.zeros_like(Tensor(A, device=device)[:n.bind(k)]).numpy().shape == (k, 4)


def test_rand_with_symbolic_sizes():
    """rand/randn of a symbolic shape draw the largest shape and keep the bound part: the same numbers as the
    static draw of the largest shape under the same seed, for every bound value."""
    n = Variable("n", 1, 6)
    for k in VALUES:
        Tensor.manual_seed(3)
        r = Tensor.rand(n.bind(k), 3)
        Tensor.manual_seed(3)
        ref = Tensor.rand(6, 3).numpy()
        assert r.shape[0].unbind() == (n, k)
        np.testing.assert_equal(r.numpy(), ref[:k])
        Tensor.manual_seed(4)
        z = Tensor.randn(2, n.bind(k)).numpy()
        Tensor.manual_seed(4)
        np.testing.assert_equal(z, Tensor.randn(2, 6).numpy()[:, :k])
    # under TinyJit the replays draw the same numbers as eager calls (the counter advances by the largest size)
    from fusegrad import TinyJit
    ks = (2, 4, 1, 6, 3)
    Tensor.manual_seed(5)
    eager = [Tensor.rand(n.bind(k), 2).numpy() for k in ks]
    f = TinyJit(lambda v: (Tensor.rand(v, 2) * 1).realize())
    Tensor.manual_seed(5)
    for k, ref in zip(ks, eager): np.testing.assert_equal(f(n.bind(k)).numpy(), ref)


@pytest.mark.parametrize("device", DEVICES[:-1])   # WEBGPU: no int kernel arguments
def test_slices_with_symbolic_bounds(device):
    """t[:i], t[i:i+2], t[i:j], shrink with symbolic bounds: NumPy's rows, one kernel for every value."""
    s = Variable("s", 0, 4)   # s + 2 <= 6: provably inside A's 6 rows
    x = Tensor(A, device=device)
    for k in (0, 2, 4):
        b = s.bind(k)
        np.testing.assert_equal(x[b:b + 2].numpy(), A[k:k + 2])
        np.testing.assert_equal(x.shrink(((b, b + 2), None)).numpy(), A[k:k + 2])
        np.testing.assert_equal(x[:, None][b:b + 2, 0, 1:3].numpy(), A[k:k + 2, 1:3])
    check_all_values(lambda b, d: Tensor(A, device=d).shrink(((0, b), None)), lambda k: A[:k], device)
    check_all_values(lambda b, d: Tensor(A, device=d).shrink((None, (0, 4))).shrink(((0, b), (1, 3))),
                     lambda k: A[:k, 1:3], device)
    check_all_values(lambda b, d: Tensor(A, device=d)[6 - b:], lambda k: A[6 - k:], device)
    lo, hi = Variable("lo", 0, 3), Variable("hi", 3, 6)
    for a, z in ((0, 3), (1, 5), (3, 6)):
        np.testing.assert_equal(x[lo.bind(a):hi.bind(z)].sum(0).numpy(), A[a:z].sum(0))


def test_reduce_matmul_cat_pad_over_symbolic_axes():
    i, j = Variable("i", 1, 6), Variable("j", 1, 5)
    for ki, kj in ((1, 5), (4, 2), (6, 1)):
        bi, bj = i.bind(ki), j.bind(kj)
        x, w = Tensor(A)[:bi], Tensor(B)[:, :bj]
        np.testing.assert_allclose((x @ w).numpy(), A[:ki] @ B[:, :kj], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(x.mean(1).numpy(), A[:ki].mean(1), rtol=1e-6)
        np.testing.assert_allclose(x.max().numpy(), A[:ki].max())
        np.testing.assert_allclose(w.sum().numpy(), B[:, :kj].sum(), rtol=1e-5)
        np.testing.assert_allclose(x.T.cat(w, dim=1).numpy(), np.concatenate([A[:ki].T, B[:, :kj]], 1))
        np.testing.assert_allclose(x.pad(((bj, 1), (0, bi))).numpy(), np.pad(A[:ki], ((kj, 1), (0, ki))))
        np.testing.assert_allclose(x.pad(((bj, 1), None)).sum(0).numpy(), A[:ki].sum(0), rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES[:-1])   # WEBGPU: no int kernel arguments
def test_slice_bound_past_the_axis(device):
    """As in tinygrad, a symbolic slice bound may range past the axis (v in [1, 10] slicing A's 6 rows or 4 columns):
    NumPy's values for every bound value in range, through one set of kernels."""
    v, w, a, i = Variable("v", 1, 10), Variable("w", 1, 9), Variable("a", 0, 8), Variable("i", 0, 9)
    x, y = Tensor(A, device=device), Tensor(B, device=device)
    asts = set()
    for k in (1, 4, 6):
        b, c = v.bind(k), w.bind(min(k, 4))
        t = x[:, :c] @ y[:c]
        asts.add(tuple(kernel_asts(t)))
        np.testing.assert_allclose(t.numpy(), A[:, :min(k, 4)] @ B[:min(k, 4)], rtol=1e-5, atol=1e-5)
        assert t.shape == (6, 5) and x[:, :c].shape == (6, c)
        np.testing.assert_allclose(x[:b].sum(0).numpy(), A[:k].sum(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_equal(x.shrink(((0, b), None)).numpy(), A[:k])
        np.testing.assert_equal(x[:b].pad(((1, 2), None)).flip(0).numpy(), np.pad(A[:k], ((1, 2), (0, 0)))[::-1])
        np.testing.assert_equal(x[:b].cat(x[:2]).numpy(), np.concatenate([A[:k], A[:2]]))
        np.testing.assert_equal(x[i.bind(k - 1)].numpy(), A[k - 1])
        for j in (0, k // 2, k):
            np.testing.assert_allclose(x[a.bind(j):b].sum(0).numpy(), A[j:k].sum(0), rtol=1e-5, atol=1e-6)
    assert len(asts) == 1, "another value of the variable gave another kernel"


def test_slice_bound_past_the_axis_gradient_and_writes():
    """Gradients through t[:v] and writes through t[:v] / t[:, :v] (setitem, assign) with v's maximum past the axis:
    NumPy's values; a value past the axis raises IndexError and writes nothing."""
    v, c = Variable("v", 1, 10), Variable("c", 1, 9)
    for k in (1, 4, 6):
        t = Tensor(A, requires_grad=True)
        (t[:v.bind(k)] * 3).sum().backward()
        want = np.zeros_like(A)
        want[:k] = 3
        np.testing.assert_equal(t.grad.numpy(), want)
        kc = min(k, 4)
        z = Tensor(A).contiguous().realize()
        z[:, :c.bind(kc)] = Tensor.full((6, c.bind(kc)), -1.0)
        z[:v.bind(k)] += 10
        z[v.bind(k) - 1:v.bind(k)].assign(Tensor.zeros(1, 4))
        want = A.copy()
        want[:, :kc] = -1
        want[:k] += 10
        want[k - 1] = 0
        np.testing.assert_equal(z.numpy(), want)
    z = Tensor(A).contiguous().realize()
    with pytest.raises(IndexError, match=r"\(0, v\) = \(0, 7\) are out of range for dimension 0 of size 6"):
        z[:v.bind(7)] = 1.0
    with pytest.raises(IndexError, match="dimension 1 of size 4"): z[:, :c.bind(5)]
    np.testing.assert_equal(z.numpy(), A)


def test_slice_bound_past_the_axis_checked_at_realize():
    """The scheduler checks a value-dependent bound for the values bound in the graph, whatever built the slice (here
    the IR below the frontend's own check): IndexError before any kernel runs, never an out-of-range read."""
    from fusegrad.ir import build
    v = Variable("v", 1, 10)
    x = Tensor(A).realize()
    ok = Tensor._wrap(build.shrink(x.uop, ((0, v.bind(5)), (0, 4))))
    np.testing.assert_equal(ok.numpy(), A[:5])
    bad = Tensor._wrap(build.shrink(x.uop, ((0, v.bind(8)), (0, 4))))
    with pytest.raises(IndexError, match=r"\(0, v\) = \(0, 8\).*size 6"): bad.numpy()
    padded = Tensor._wrap(build.pad(Tensor.ones(v.bind(9), 4).uop, ((0, 6 - v.bind(9)), (0, 0))))  # a negative pad
    with pytest.raises(IndexError, match=r"\(0, v\) = \(0, 9\).*size 6"): padded.numpy()


def test_slice_bound_past_the_axis_tinyjit():
    """TinyJit replays a capture over x[:, :v] (v's maximum past the axis) with each call's value: NumPy's values, a
    value past the axis raises IndexError before any kernel runs (reads and KV-cache-style writes), and the capture
    stays usable."""
    from fusegrad import TinyJit
    v = Variable("v", 1, 10)
    x, y = Tensor(A).realize(), Tensor(B).realize()

    @TinyJit
    def read(t: Tensor, n) -> Tensor: return (t[:, :n] @ y[:n]).sum(1).realize()

    @TinyJit
    def write(buf: Tensor, n, val: Tensor) -> Tensor:
        buf[:n] = val
        return buf.sum(1).realize()
    buf = Tensor.zeros(6, 4).contiguous().realize()
    want_buf = np.zeros((6, 4), np.float32)
    for k in (2, 3, 4, 1, 3):
        np.testing.assert_allclose(read(x, v.bind(k)).numpy(), (A[:, :k] @ B[:k]).sum(1), rtol=1e-5, atol=1e-5)
    for k in (2, 3, 6, 1, 5):
        np.testing.assert_equal(write(buf, v.bind(k), Tensor.full((v.bind(k), 4), float(k)).contiguous()).numpy(),
                                (want_buf := np.concatenate([np.full((k, 4), k, np.float32), want_buf[k:]])).sum(1))
    assert read.captured is not None and write.captured is not None and read.cnt == write.cnt == 5
    with pytest.raises(IndexError, match=r"TinyJit replay: .*\(0, v\) = \(0, 5\).*dimension 1 of size 4"):
        read(x, v.bind(5))
    with pytest.raises(IndexError, match=r"TinyJit replay: .*\(0, v\) = \(0, 9\).*dimension 0 of size 6"):
        write(buf, v.bind(9), Tensor.full((v.bind(9), 4), 9.0).contiguous())
    np.testing.assert_equal(buf.numpy(), want_buf)   # nothing written
    np.testing.assert_allclose(read(x, v.bind(4)).numpy(), (A[:, :4] @ B).sum(1), rtol=1e-5, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_slice_bound_past_the_axis_steps_vs_numpy(ks, seed):
    """A write and a read through buf[:, :v] (v in [1, 10], buf 6 columns) for a sequence of values, eagerly and
    under TinyJit, against NumPy doing the same steps: values past the axis raise IndexError and change nothing, the
    others update the buffer and return the same sums."""
    from fusegrad import TinyJit
    v = Variable("v", 1, 10)
    r = np.random.default_rng(seed)

    def step(buf: Tensor, n, src: Tensor) -> Tensor:
        buf[:, :n] += src[:, :n]
        return buf[:, :n].sum(1).realize()
    jitted = TinyJit(step)
    bufs = [Tensor.zeros(4, 6).contiguous().realize() for _ in range(2)]
    want = np.zeros((4, 6), np.float32)
    for k in [2, 3] + ks:   # (two valid calls first: TinyJit runs, captures, then replays the steps drawn)
        src = r.integers(-8, 8, (4, 10)).astype(np.float32)
        for fn, buf in zip((step, jitted), bufs):
            if k > 6:
                with pytest.raises(IndexError, match=f"\\(0, {k}\\).*size 6"): fn(buf, v.bind(k), Tensor(src))
            else:
                np.testing.assert_equal(fn(buf, v.bind(k), Tensor(src)).numpy(), (want[:, :k] + src[:, :k]).sum(1))
        if k <= 6: want[:, :k] += src[:, :k]
        for buf in bufs: np.testing.assert_equal(buf.numpy(), want)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"] + [_optional_device(d) for d in ("CL", "LLVM", "CUDA", "METAL")])
def test_variable_past_int32(device):
    """A Variable whose range needs 64 bits is an int64 kernel argument: its value reads back exactly."""
    v = Variable("big", 0, 2**40)
    assert v.dtype == np.int64 or str(v.dtype) in ("dtypes.long", "dtypes.int64")
    for val in (2**31, 2**33 + 5, 2**40):
        b = v.bind(val)
        t = Tensor.full((), b, device=device)
        assert t.item() == val and t.dtype == Tensor([1], dtype="int64").dtype
        assert (Tensor(b, device=device) * 3 - 1).item() == 3 * val - 1
        ints = np.array([1, -2**35, 7], np.int64)
        np.testing.assert_equal((Tensor(ints, device=device) + b).numpy(), ints + val)
        np.testing.assert_allclose((Tensor.ones(2, device=device) * b).numpy(), np.ones(2, np.float32) * val)


def test_variable_past_int32_errors():
    v = Variable("big", 0, 2**40)
    with pytest.raises(ValueError, match="64-bit variable 'big'"): Tensor.empty(v.bind(3), 2)
    with pytest.raises(ValueError, match="64-bit"): Tensor.zeros(4, 4).reshape(v.bind(16))
    with pytest.raises(ValueError): Variable("huge", 0, 2**64)   # past int64
    with pytest.raises(ValueError, match="doesn't fit"): Variable("n", 0, 2**31, dtype=Tensor([1]).dtype)
    assert Variable("n", 0, 2**31 - 1).dtype == Tensor([1], dtype="int32").dtype


def test_variable_api():
    """bind / unbind / val / variables / unbind_all / sym_infer, and tinygrad's exceptions for bad binds."""
    from fusegrad.ir.ops import BindError
    n, m = Variable("n", 1, 10), Variable("m", 0, 8, multiple_of=4)
    b = n.bind(3)
    assert b.val == 3 and b.unbind() == (n, 3) and b.expr == n.expr == "n"
    assert m.bind(8).val == 8 and (b + m.bind(4)).variables() == [m, n]
    expr, vals = (b * 2 + m.bind(4)).unbind_all()
    assert vals == {n: 3, m: 4} and expr.variables() == [m, n] and expr.sym_infer(vals) == 10
    assert (n * 2 + m).sym_infer({"n": 5, "m": 4}) == 14 and (b + 1).sym_infer() == 4
    for bad in (lambda: n.bind(11), lambda: n.bind(0), lambda: m.bind(6)):
        with pytest.raises(AssertionError): bad()   # tinygrad's bind asserts
        with pytest.raises(ValueError): bad()
        with pytest.raises(BindError): bad()
    with pytest.raises(TypeError): n.bind(True)
    with pytest.raises(TypeError): b.bind(3)
    with pytest.raises(TypeError): Tensor.ones(3).uop.unbind()
    assert n.bind(np.int64(4)).val == 4
    from fusegrad import Context
    with Context(SPEC=2):   # a variable with multiple_of passes the IR checks and runs
        for k in (0, 4, 8):
            np.testing.assert_equal(Tensor(A.reshape(-1))[:m.bind(k)].sum().numpy(), A.reshape(-1)[:k].sum())
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    t = Tensor(rows)[:b] * 2
    var_vals = t.linear_with_vars()[1]
    assert var_vals == {n: 3} and var_vals[n] == var_vals["n"] == 3 and "n" in var_vals and var_vals.get("m") is None
    np.testing.assert_equal(t.numpy(), rows[:3] * 2)


def test_tinyjit_one_capture_for_every_value():
    """A jitted function over x[:i] and x[s:s+2] inputs runs its Python body twice (run, capture), then replays the
    captured kernels for every new bound value: no new compile, NumPy's values."""
    from fusegrad import TinyJit
    from fusegrad.engine import realize
    n, s = Variable("n", 1, 6), Variable("s", 0, 4)
    x, w = Tensor(A).realize(), Tensor(B).realize()
    traced = []

    @TinyJit
    def f(a: Tensor, c: Tensor) -> Tensor:
        traced.append(1)
        return ((a @ w).sum(0) + c.sum()).realize()
    outs, compiled = [], None
    for k, p in ((2, 0), (5, 3), (1, 4), (6, 1), (3, 2)):
        if len(traced) == 2 and compiled is None: compiled = len(realize._programs)
        outs.append((k, p, f(x[:n.bind(k)], x[s.bind(p):s.bind(p) + 2]).numpy()))
    assert len(traced) == 2 and f.cnt == 5 and f.captured is not None
    assert len(realize._programs) == compiled, "a replay with a new value compiled a kernel"
    for k, p, o in outs:
        np.testing.assert_allclose(o, (A[:k] @ B).sum(0) + A[p:p + 2].sum(), rtol=1e-5, atol=1e-5)


def test_tinyjit_variable_values_and_int64():
    """Bound variables passed to a jitted function as values (an add, a fill, a 64-bit fill, a symbolic size) replay
    with each call's values."""
    from fusegrad import TinyJit
    n, big = Variable("n", 1, 6), Variable("big", 0, 2**40)
    x = Tensor(A).realize()

    @TinyJit
    def f(a: Tensor, v, w) -> tuple[Tensor, Tensor, Tensor]:
        return (a + v).sum(0).realize(), (Tensor.full((2,), w) * 2).realize(), Tensor.full((v, 2), 1.5).sum().realize()
    for k in (1, 3, 5, 2, 6):
        val = 2**33 + k
        o1, o2, o3 = f(x[:n.bind(k)], n.bind(k), big.bind(val))
        np.testing.assert_allclose(o1.numpy(), (A[:k] + k).sum(0), rtol=1e-5)
        np.testing.assert_equal(o2.numpy(), np.full(2, 2 * val, np.int64))
        assert o3.item() == 1.5 * 2 * k
    assert f.cnt == 5 and f.captured is not None


@pytest.mark.parametrize("device", DEVICES)
def test_one_variable_several_values_in_one_realize(device):
    """One Variable bound to several values in one realize (tinygrad's stunning_mnist binds its step variable to two
    steps in one graph): each bound slice reads its own value, in separate results and fused into one."""
    n = Variable("n", 1, 6)
    x = Tensor(A, device=device)
    a, b, c = x[:n.bind(2)].sum(), x[:n.bind(3)].sum(0), x[:n.bind(2)].max(1)
    Tensor.realize(a, b, c)
    np.testing.assert_allclose(a.numpy(), A[:2].sum(), rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), A[:3].sum(0), rtol=1e-5)
    np.testing.assert_allclose(c.numpy(), A[:2].max(1), rtol=1e-5)
    assert a.shape == () and b.shape == (4,) and c.shape[0].val == 2
    d = x[:n.bind(1)].sum(0) * 10 + x[:n.bind(4)].sum(0) - x[n.bind(5):n.bind(5) + 1].sum(0)
    np.testing.assert_allclose(d.numpy(), A[:1].sum(0) * 10 + A[:4].sum(0) - A[5:6].sum(0), rtol=1e-5, atol=1e-5)
    # the same structure with other values reuses the schedule (and its kernels) with this call's values
    e, f = x[:n.bind(6)].sum(), x[:n.bind(1)].sum(0)
    Tensor.realize(e, f)
    np.testing.assert_allclose(e.numpy(), A.sum(), rtol=1e-5)
    np.testing.assert_allclose(f.numpy(), A[:1].sum(0), rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_several_values_property(ks):
    """Any values, repeated or not, of one variable in one realize match NumPy, and so does their sum."""
    n = Variable("n", 1, 6)
    x = Tensor(A)
    outs = [x[:n.bind(k)].sum(0) for k in ks]
    total = sum(outs[1:], outs[0])
    Tensor.realize(total, *outs)
    for k, o in zip(ks, outs): np.testing.assert_allclose(o.numpy(), A[:k].sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total.numpy(), sum(A[:k].sum(0) for k in ks), rtol=1e-5, atol=1e-5)


def test_several_values_tinyjit():
    """Under TinyJit a variable passed as an argument takes each call's value, while the same variable bound inside
    the function to a constant keeps it (as any Python value baked in at capture), in one realize or in two."""
    from fusegrad import TinyJit
    n = Variable("n", 1, 6)
    x = Tensor(A)

    @TinyJit
    def f(t, m):
        return (t[:m].sum(0) * 10 + t[:n.bind(4)].sum(0)).realize()

    @TinyJit
    def g(t, m):
        inner = t[:n.bind(5)].sum(0).realize()   # a realize of its own, with the other value
        return (t[:m].sum(0) + inner).realize()

    for k in (1, 2, 6, 3, 1):   # captured at k=2 (neither 4 nor 5)
        np.testing.assert_allclose(f(x, n.bind(k)).numpy(), A[:k].sum(0) * 10 + A[:4].sum(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g(x, n.bind(k)).numpy(), A[:k].sum(0) + A[:5].sum(0), rtol=1e-5, atol=1e-5)
    assert f.cnt > 2 and g.cnt > 2   # replayed
