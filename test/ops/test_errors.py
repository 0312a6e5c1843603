"""Bad input raises the exception type torch raises (checked by running torch too), with a message that names the
offending shapes / dims / indices / names."""
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Tensor

from .helpers import fg_tensor


def raises_like_torch(torch_fn, fg_fn):
    """Run both; they must raise, fusegrad an exception of torch's type (or a subclass of it, such as ShapeError, which
    is also tinygrad's ValueError). Returns fusegrad's message."""
    with pytest.raises(Exception) as te:
        torch_fn()
    with pytest.raises(Exception) as fe:
        fg_fn()
    assert issubclass(fe.type, te.type), \
        f"fusegrad raised {fe.type.__name__}({fe.value}), torch {te.type.__name__}({te.value})"
    return str(fe.value)


def names_shape(msg, shape):
    """The message names `shape`, as (2, 3), [2, 3], torch.Size([2, 3]) or 2x3."""
    s = tuple(shape)
    forms = [str(s), str(list(s)), "x".join(map(str, s)), f"torch.Size({list(s)})"]
    return any(f in msg for f in forms)


def pair(shape, seed=0):
    v = np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)
    return torch.tensor(v), fg_tensor(v, "CPU")  # (0-d arrays via a Python scalar, see helpers.fg_tensor)


# ----- broadcasting -----

@pytest.mark.parametrize("a,b", [((3, 4), (2, 4)), ((3,), (4,)), ((2, 3, 4), (3, 5)), ((5, 1), (2, 4, 3))], ids=str)
@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "maximum", "lt"])
def test_broadcast_mismatch(op, a, b):
    (ta, fa), (tb, fb) = pair(a), pair(b, 1)
    fns = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "sub": lambda x, y: x - y,
           "div": lambda x, y: x / y, "lt": lambda x, y: x < y}
    tf = fns.get(op, lambda x, y: torch.maximum(x, y))
    ff = fns.get(op, lambda x, y: x.maximum(y))
    msg = raises_like_torch(lambda: tf(ta, tb), lambda: ff(fa, fb))
    assert names_shape(msg, a) and names_shape(msg, b), msg


def test_where_broadcast_mismatch():
    c = np.array([True, False, True])
    msg = raises_like_torch(lambda: torch.where(torch.tensor(c), torch.ones(3), torch.ones(4)),
                            lambda: Tensor(c).where(Tensor.ones(3), Tensor.ones(4)))
    assert names_shape(msg, (3,)) and names_shape(msg, (4,)), msg


# ----- reshape / view -----

@pytest.mark.parametrize("shape,new", [((3, 4), (5, 3)), ((3, 4), (13,)), ((3, 4), (5, -1)), ((0, 3), (-1, 0)),
                                       ((2, 3), (2, 2)), ((6,), (-1, 4))], ids=str)
def test_reshape_wrong_size(shape, new):
    t, f = pair(shape)
    msg = raises_like_torch(lambda: t.reshape(new), lambda: f.reshape(new))
    assert names_shape(msg, new) and (names_shape(msg, shape) or str(int(np.prod(shape))) in msg), msg


def test_reshape_two_inferred_dims():
    t, f = pair((2, 6))
    msg = raises_like_torch(lambda: t.reshape(-1, -1), lambda: f.reshape(-1, -1))
    assert "one dimension" in msg or "-1" in msg


def test_reshape_negative_dim():
    t, f = pair((2, 6))
    raises_like_torch(lambda: t.reshape(-2, -6), lambda: f.reshape(-2, -6))


# ----- permute / transpose / expand -----

@pytest.mark.parametrize("order", [(0, 0), (0, 1, 2), (1,), (1, 1, 0)], ids=str)
def test_permute_bad_order(order):
    t, f = pair((3, 4))
    msg = raises_like_torch(lambda: t.permute(order), lambda: f.permute(order))
    assert names_shape(msg, order) and names_shape(msg, (3, 4)), msg


@pytest.mark.parametrize("order", [(0, 2), (-3, 0)], ids=str)
def test_permute_dim_out_of_range(order):
    t, f = pair((3, 4))
    msg = raises_like_torch(lambda: t.permute(order), lambda: f.permute(order))
    assert str([d for d in order if not -2 <= d <= 1][0]) in msg, msg


@pytest.mark.parametrize("shape,new", [((3, 2), (3, 4)), ((3,), (2, 4)), ((2, 3), (3,))], ids=str)
def test_expand_bad_shape(shape, new):
    t, f = pair(shape)
    msg = raises_like_torch(lambda: t.expand(new), lambda: f.expand(new))
    assert names_shape(msg, shape), msg


# ----- matmul -----

@pytest.mark.parametrize("a,b", [((3, 4), (5, 6)), ((4,), (5,)), ((3, 4), (3,)), ((2, 3, 4), (5, 2)), ((5,), (4, 3))],
                         ids=str)
def test_matmul_incompatible(a, b):
    (ta, fa), (tb, fb) = pair(a), pair(b, 1)
    msg = raises_like_torch(lambda: ta @ tb, lambda: fa @ fb)
    assert names_shape(msg, a) and names_shape(msg, b), msg
    raises_like_torch(lambda: ta.matmul(tb), lambda: fa.dot(fb))


def test_matmul_batch_mismatch():
    (ta, fa), (tb, fb) = pair((2, 3, 4)), pair((3, 4, 5), 1)
    msg = raises_like_torch(lambda: ta @ tb, lambda: fa @ fb)
    assert names_shape(msg, (2, 3, 4)) and names_shape(msg, (3, 4, 5)), msg


def test_matmul_0d():
    (ta, fa), (tb, fb) = pair(()), pair((3,), 1)
    msg = raises_like_torch(lambda: ta @ tb, lambda: fa @ fb)
    assert names_shape(msg, (3,)), msg


# ----- devices and dtypes -----

@pytest.mark.parametrize("dev", ["FOO", "gpu9", "notadevice:0"])
def test_unknown_device(dev):
    msg = raises_like_torch(lambda: torch.tensor([1.0], device=dev.lower()), lambda: Tensor([1.0], device=dev))
    assert dev.split(":")[0].lower() in msg.lower(), msg
    raises_like_torch(lambda: torch.zeros(2, device=dev.lower()), lambda: Tensor.zeros(2, device=dev))


def test_unknown_device_in_to():
    raises_like_torch(lambda: torch.ones(2).to("nodev"), lambda: Tensor.ones(2).to("nodev"))


@pytest.mark.parametrize("name", ["flaot32", "int33", "complex1024", ""])
def test_unknown_dtype_string(name):
    msg = raises_like_torch(lambda: torch.tensor([1.0], dtype=name), lambda: Tensor([1.0], dtype=name))
    assert repr(name) in msg or name in msg
    raises_like_torch(lambda: torch.ones(2).to(dtype=name), lambda: Tensor.ones(2).cast(name))
    raises_like_torch(lambda: torch.zeros(2, dtype=name), lambda: Tensor.zeros(2, dtype=name))


# ----- dims out of range -----

DIM_CASES = [
    ("sum", lambda x: x.sum(dim=2), lambda x: x.sum(axis=2), 2),
    ("sum_tuple", lambda x: x.sum(dim=(0, -3)), lambda x: x.sum(axis=(0, -3)), -3),
    ("max", lambda x: x.amax(dim=-3), lambda x: x.max(axis=-3), -3),
    ("mean", lambda x: x.mean(dim=5), lambda x: x.mean(axis=5), 5),
    ("unsqueeze", lambda x: x.unsqueeze(3), lambda x: x.unsqueeze(3), 3),
    ("unsqueeze_neg", lambda x: x.unsqueeze(-4), lambda x: x.unsqueeze(-4), -4),
    ("squeeze", lambda x: x.squeeze(2), lambda x: x.squeeze(2), 2),
    ("transpose", lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2), 2),
    ("flip", lambda x: x.flip(3), lambda x: x.flip(3), 3),
    ("flatten", lambda x: x.flatten(0, 2), lambda x: x.flatten(0, 2), 2),
    ("size", lambda x: x.size(2), lambda x: x.size(2), 2),
]


@pytest.mark.parametrize("name,tf,ff,dim", DIM_CASES, ids=[c[0] for c in DIM_CASES])
def test_dim_out_of_range(name, tf, ff, dim):
    t, f = pair((3, 4))
    msg = raises_like_torch(lambda: tf(t), lambda: ff(f))
    assert str(dim) in msg and "range" in msg, msg


def test_dim_on_0d():
    t, f = pair(())
    raises_like_torch(lambda: t.sum(dim=1), lambda: f.sum(axis=1))


# ----- indexing out of bounds -----

@pytest.mark.parametrize("idx", [3, -4, (0, 4), (1, -5), (Ellipsis, 4), (None, 3)], ids=str)
def test_index_out_of_bounds(idx):
    t, f = pair((3, 4))
    msg = raises_like_torch(lambda: t[idx], lambda: f[idx])
    bad = [i for i in (idx if isinstance(idx, tuple) else (idx,)) if isinstance(i, int) and i not in (0, 1)][0]
    assert str(bad) in msg and ("size 3" in msg or "size 4" in msg), msg


def test_too_many_indices():
    t, f = pair((3, 4))
    msg = raises_like_torch(lambda: t[0, 0, 0], lambda: f[0, 0, 0])
    assert "2" in msg, msg


def test_index_0d():
    t, f = pair(())
    raises_like_torch(lambda: t[0], lambda: f[0])


# ----- other bad input -----

def test_item_of_many_elements():
    t, f = pair((2, 3))
    msg = raises_like_torch(lambda: t.item(), lambda: f.item())
    assert "6" in msg, msg


def test_backward_of_non_scalar_without_gradient():
    v = np.ones((2, 3), np.float32)
    t, f = torch.tensor(v, requires_grad=True), Tensor(v, requires_grad=True)
    raises_like_torch(lambda: (t * 2).backward(), lambda: (f * 2).backward())


def test_backward_gradient_shape_mismatch():
    v = np.ones((2, 3), np.float32)
    t, f = torch.tensor(v, requires_grad=True), Tensor(v, requires_grad=True)
    msg = raises_like_torch(lambda: (t * 2).backward(torch.ones(3, 2)), lambda: (f * 2).backward(Tensor.ones(3, 2)))
    assert names_shape(msg, (2, 3)) and names_shape(msg, (3, 2)), msg


def test_ragged_list():
    raises_like_torch(lambda: torch.tensor([[1.0, 2.0], [3.0]]), lambda: Tensor([[1.0, 2.0], [3.0]]))


def test_bool_subtraction():
    a = np.array([True, False])
    raises_like_torch(lambda: torch.tensor(a) - torch.tensor(a), lambda: Tensor(a) - Tensor(a))


def test_bool_negation():
    a = np.array([True, False])
    raises_like_torch(lambda: -torch.tensor(a), lambda: -Tensor(a))


@pytest.mark.parametrize("pad", [(1,), (1, 1, 1, 1, 1, 1)], ids=str)
def test_pad_bad_length(pad):
    t, f = pair((3, 4))
    raises_like_torch(lambda: F.pad(t, pad), lambda: f.pad(pad))


def test_arange_zero_step():
    raises_like_torch(lambda: torch.arange(0, 5, 0), lambda: Tensor.arange(0, 5, 0))


def test_negative_shape():
    raises_like_torch(lambda: torch.zeros(2, -1), lambda: Tensor.zeros(2, -1))
    raises_like_torch(lambda: torch.empty(-3), lambda: Tensor.empty(-3))


def test_max_of_empty():
    t, f = pair((0, 3))
    raises_like_torch(lambda: t.amax(), lambda: f.max())
    raises_like_torch(lambda: t.amax(dim=0), lambda: f.max(axis=0))


def test_unsupported_operand():
    t, f = pair((2,))
    raises_like_torch(lambda: t + "a", lambda: f + "a")


def test_len_of_0d():
    t, f = pair(())
    raises_like_torch(lambda: len(t), lambda: len(f))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint32"])
@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_integer_division_by_zero_is_zero_not_a_crash(dtype, device):
    # C/LLVM integer division by 0 (or of INT_MIN by -1) raises SIGFPE/SIGILL and would kill the process;
    # codegen/safediv.py makes x // 0 and x % 0 zero on every backend (as NumPy does; torch raises)
    lo = int(np.iinfo(np.dtype(dtype)).min)
    a = np.array([7, 5, -3, lo, lo + 1, 9] if lo < 0 else [7, 5, 3, 0, 1, 9], dtype=np.dtype(dtype))
    b = np.array([0, -1, 2, -1, 0, 4] if lo < 0 else [0, 1, 2, 0, 3, 4], dtype=np.dtype(dtype))
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((ta // tb).numpy(), a // b)
        np.testing.assert_array_equal((ta % tb).numpy(), a % b)
        np.testing.assert_array_equal(ta.fmod(tb).numpy(), np.fmod(a, b))
    assert ((ta // 0).numpy() == 0).all() and ((ta % 0).numpy() == 0).all()
