"""Variable (symbolic ints) in shapes and slices: results against NumPy for several bound values, one compiled kernel
for every value of a variable, and clear errors for out-of-range and unbound variables."""
import numpy as np
import pytest

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
    with pytest.raises(IndexError): Tensor(A)[:Variable("big", 1, 9).bind(2)]   # not provably inside 6 rows
    with pytest.raises(NotImplementedError): Tensor(A)[:n.bind(2)].reshape(-1)
    with pytest.raises(NotImplementedError): Tensor(A)[:n.bind(2):2]
    with pytest.raises(ValueError, match="bound to both"):
        (Tensor(A)[:n.bind(2)].sum() + Tensor(A)[:n.bind(3)].sum()).realize()


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
