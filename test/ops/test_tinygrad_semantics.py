"""tinygrad semantics that tinygrad code relies on (issue 30), each compared with NumPy or PyTorch: bool operands in
subtraction promote like ints, ..."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fusegrad import Tensor, dtypes
from fusegrad.dtype import to_np_dtype

# ----- bool promotes like an int in subtraction (tinygrad's `1.0 - mask`, BERT's attention mask) -----

OTHER = ["float32", "float16", "float64", "int8", "int32", "int64", "uint8", "uint32"]


@pytest.mark.parametrize("reverse", [False, True], ids=["mask-x", "x-mask"])
@pytest.mark.parametrize("dt", OTHER)
def test_bool_tensor_minus_tensor_promotes_like_numpy(dt, reverse):
    m = np.array([True, False, True, False])
    x = np.array([3, 1, 0, 2]).astype(dt)
    want = (x - m) if reverse else (m - x)
    out = (Tensor(x) - Tensor(m)) if reverse else (Tensor(m) - Tensor(x))
    assert to_np_dtype(out.dtype) == want.dtype, f"{out.dtype} != NumPy {want.dtype}"
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("scalar,dtype", [(1.0, "float32"), (0.5, "float32"), (1, "int32"), (-3, "int32")])
@pytest.mark.parametrize("reverse", [False, True], ids=["mask-s", "s-mask"])
def test_bool_tensor_minus_python_number(scalar, dtype, reverse):
    """A Python number keeps its kind and takes the default width: float32 (NumPy: float64), int32 (NumPy: int64)."""
    m = np.array([True, False, True])
    want = (scalar - m) if reverse else (m - scalar)
    out = (scalar - Tensor(m)) if reverse else (Tensor(m) - scalar)
    assert out.dtype == dtypes.from_py(scalar) and to_np_dtype(out.dtype) == np.dtype(dtype)
    np.testing.assert_array_equal(out.numpy(), want.astype(dtype))


def test_one_minus_mask_as_in_bert():
    """tinygrad's BERT: `(1.0 - mask) * -10000.0` on a bool mask; PyTorch refuses the subtraction."""
    m = np.array([[True, True, False]])
    with pytest.raises(RuntimeError): 1.0 - torch.tensor(m)
    out = (1.0 - Tensor(m)) * -10000.0
    assert out.dtype == dtypes.float32
    np.testing.assert_array_equal(out.numpy(), (1.0 - m.astype(np.float32)) * -10000.0)


def test_bool_minus_bool_raises_like_numpy_and_torch():
    m = np.array([True, False])
    with pytest.raises(TypeError): m - m
    with pytest.raises(RuntimeError): torch.tensor(m) - torch.tensor(m)
    for f in (lambda: Tensor(m) - Tensor(m), lambda: Tensor(m) - True, lambda: True - Tensor(m)):
        with pytest.raises(RuntimeError, match="two bools"): f()


def test_float_minus_mask_gradient():
    x, m = Tensor([1.0, 2.0, 3.0], requires_grad=True), Tensor([True, False, True])
    tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    ((x - m) * x).sum().backward()
    ((tx - torch.tensor([1.0, 0.0, 1.0])) * tx).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


# ----- setitem with a value of another dtype raises, as in tinygrad (PyTorch casts) -----

@pytest.mark.parametrize("index", [1, slice(0, 2), [0, 2]], ids=["int", "slice", "list"])
def test_setitem_dtype_mismatch_raises(index):
    t = Tensor.zeros(4).contiguous().realize()
    for v in (Tensor([7], dtype=dtypes.int32).reshape(()) if index == 1 else Tensor([7, 8], dtype=dtypes.int32),
              Tensor([7.0, 8.0], dtype=dtypes.float16) if index != 1 else Tensor(7.0, dtype=dtypes.float16)):
        with pytest.raises(RuntimeError, match="setitem dtype mismatch"): t[index] = v
    assert t.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_setitem_python_values_and_weak_scalars_convert():
    t, ref = Tensor.zeros(5).contiguous().realize(), torch.zeros(5)
    for idx, v in ((1, 3), (slice(2, 4), [1.5, 2.5]), (4, 9)):
        t[idx] = v
        ref[idx] = torch.tensor(v, dtype=torch.float32)
    t[0] = Tensor(6)                                  # a bare Python number's tensor is weakly typed: converted
    ref[0] = 6
    np.testing.assert_array_equal(t.numpy(), ref.numpy())
    i = Tensor([0, 0, 0], dtype=dtypes.int32).contiguous().realize()
    i[1] = Tensor([5], dtype=dtypes.int32)[0]
    assert i.tolist() == [0, 5, 0]


# ----- arange past int32: int64 values, as torch (wrapping to int32 was silently wrong) -----

@pytest.mark.parametrize("args", [(2**31, 2**31 + 4), (2**31 - 2, 2**31 + 2), (0, 2**33, 2**31),
                                  (-2**31 - 2, -2**31 + 2), (2**40, 2**40 - 6, -2)], ids=str)
def test_arange_past_int32_is_int64(args):
    t, ref = Tensor.arange(*args), torch.arange(*args)
    assert t.dtype == dtypes.int64 and ref.dtype == torch.int64
    assert t.tolist() == ref.tolist()


def test_arange_int32_when_it_fits_and_explicit_dtype_overflow_raises():
    assert Tensor.arange(2**31 - 3, 2**31).dtype == dtypes.int32
    assert Tensor.arange(2**31 - 3, 2**31).tolist() == torch.arange(2**31 - 3, 2**31).tolist()
    with pytest.raises(OverflowError, match="outside the range"): Tensor.arange(2**31, 2**31 + 2, dtype=dtypes.int32)
    with pytest.raises(OverflowError): Tensor.arange(250, 260, dtype=dtypes.uint8)
    assert Tensor.arange(250, 256, dtype=dtypes.uint8).tolist() == list(range(250, 256))


# ----- error types of one_hot, repeat, stack/cat: PyTorch's type, and tinygrad's too where it differs -----

def test_one_hot_errors():
    with pytest.raises(RuntimeError): torch.nn.functional.one_hot(torch.tensor([1.0]), 3)
    with pytest.raises(RuntimeError, match="integer"): Tensor([1.0]).one_hot(3)
    with pytest.raises(RuntimeError): torch.nn.functional.one_hot(torch.tensor([1]), -2)
    for t in (RuntimeError, ValueError):   # torch's type and tinygrad's
        with pytest.raises(t, match="num_classes"): Tensor([1]).one_hot(-2)
    np.testing.assert_array_equal(Tensor([0, 2]).one_hot(-1).numpy(),
                                  torch.nn.functional.one_hot(torch.tensor([0, 2]), -1).numpy())


@pytest.mark.parametrize("shape,reps", [((2, 3), (2,)), ((2, 3, 4), (3, 1)), ((2, 3), (2, 1, 2)), ((3,), (0,)),
                                        ((2, 3), (2, 2))], ids=str)
def test_repeat_tiles_like_numpy(shape, reps):
    """Fewer repeats than axes repeat the last axes, as tinygrad and np.tile (PyTorch raises)."""
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(Tensor(a).repeat(*reps).numpy(), np.tile(a, reps))
    if len(reps) >= len(shape): np.testing.assert_array_equal(Tensor(a).repeat(reps).numpy(),
                                                              torch.tensor(a).repeat(*reps).numpy())


def test_repeat_negative_raises():
    with pytest.raises(RuntimeError): torch.ones(2, 3).repeat(2, -1)
    for t in (RuntimeError, ValueError):
        with pytest.raises(t, match="non-negative"): Tensor.ones(2, 3).repeat(2, -1)


@pytest.mark.parametrize("fn", [lambda T, a, b: T.stack([a, b]), lambda T, a, b: T.cat([a, b], dim=1)],
                         ids=["stack", "cat"])
def test_join_shape_mismatch_error_types(fn):
    """torch raises RuntimeError; tinygrad's check is an assert (AssertionError); fusegrad's error is both (and a
    ValueError, like its other shape errors)."""
    with pytest.raises(RuntimeError): fn(torch, torch.ones(2, 3), torch.ones(3, 3))
    for t in (RuntimeError, AssertionError, ValueError):
        with pytest.raises(t): fn(Tensor, Tensor.ones(2, 3), Tensor.ones(3, 3))
    with pytest.raises(IndexError): torch.stack([torch.ones(2), torch.ones(2)], dim=3)
    with pytest.raises(IndexError): Tensor.stack(Tensor.ones(2), Tensor.ones(2), dim=3)
    with pytest.raises(RuntimeError): Tensor.stack()


# ----- backward fills .grad of tensors whose requires_grad is unset, as tinygrad does (docs/porting.md) -----

def test_backward_fills_unset_tensors_as_torch_computes_them():
    rng = np.random.default_rng(0)
    xa, wa = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    x, w = Tensor(xa), Tensor(wa, requires_grad=True)            # x: flag unset, as a data batch
    tx, tw = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
    h = x @ w
    th = tx @ tw
    th.retain_grad()
    ((h.relu() ** 2).sum()).backward()
    ((th.relu() ** 2).sum()).backward()
    assert x.requires_grad is None
    for ours, ref in ((x, tx), (w, tw), (h, th)):              # a leaf, a parameter and an intermediate
        np.testing.assert_allclose(ours.grad.numpy(), ref.grad.numpy(), rtol=1e-5, atol=1e-6)


def _step_kernels(data_flag):
    from fusegrad import GlobalCounters
    from fusegrad.nn.optim import SGD
    data = Tensor(np.arange(12, dtype=np.float32).reshape(6, 2), requires_grad=data_flag).realize()
    w = Tensor([[1.0], [2.0]], requires_grad=True)
    opt = SGD([w], lr=0.01)
    counts = []
    with Tensor.train():
        for step in range(4):
            opt.zero_grad()
            (data[Tensor([step % 6, (step + 1) % 6])] @ w).sum().backward()
            assert (data.grad is None) == (data_flag is False)
            GlobalCounters.reset()
            opt.step()
            counts.append(GlobalCounters.kernel_count)
    return data, w, counts


def test_unrequested_gradient_is_dropped_by_the_optimizer_step_and_costs_no_kernels():
    """The no-leak rule: a dataset indexed every step gets a gradient, but the step that overwrites the weights it reads
    drops it (nobody zeroes a dataset's gradient: kept, it would be a chain of copies of old weights, one per step);
    the step runs as many kernels as with requires_grad=False."""
    data, w, counts = _step_kernels(None)
    assert data.grad is None
    _, w_off, counts_off = _step_kernels(False)
    assert counts == counts_off
    np.testing.assert_array_equal(w.numpy(), w_off.numpy())


def test_unrequested_gradient_that_is_held_keeps_its_value_across_the_step():
    from fusegrad.nn.optim import SGD
    x = Tensor([1.0, 2.0, 3.0])
    w = Tensor([4.0, 5.0, 6.0], requires_grad=True)
    opt = SGD([w], lr=0.5)
    with Tensor.train():
        (x * w).sum().backward()
        held = x.grad                                            # dx = w before the step
        opt.step()
    assert x.grad is held and held.tolist() == [4.0, 5.0, 6.0]
    assert w.tolist() == [3.5, 4.0, 4.5]
    y = Tensor([1.0, 1.0])
    v = Tensor([2.0, 3.0], requires_grad=True)
    with Tensor.train():
        (y * v).sum().backward()
        y.grad.realize()                                         # computed before the step: kept as well
        SGD([v], lr=1.0).step()
    assert y.grad.tolist() == [2.0, 3.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["backward", "hold", "release", "step", "check"]), min_size=1, max_size=12))
def test_unrequested_gradients_follow_torch_or_are_dropped(steps):
    """Property: after any sequence of backward / optimizer steps / holding the gradient / reading it, an unset
    tensor's `.grad` is what torch accumulates for the same tensor with requires_grad=True since fusegrad last dropped
    it, or None: a step dropped it because it overwrote the weights the gradient read while the gradient was
    uncomputed and nobody held it. Reading it (check) computes it, so a later step keeps it."""
    from fusegrad.nn.optim import SGD
    xa, wa = np.array([1.0, -2.0, 3.0], np.float32), np.array([0.5, 1.5, -1.0], np.float32)
    x, w = Tensor(xa), Tensor(wa, requires_grad=True)
    tx, tw = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
    opt, topt = SGD([w], lr=0.25), torch.optim.SGD([tw], lr=0.25)
    held, lazy = None, False           # lazy: x.grad reads weights and was not computed
    with Tensor.train():
        for s in steps:
            if s == "backward":
                (x * w * w).sum().backward()
                (tx * tw * tw).sum().backward()
                lazy = True
            elif s == "hold": held = x.grad
            elif s == "release": held = None
            elif s == "step":
                opt.step()
                topt.step()
                if lazy and (held is None or held is not x.grad):   # uncomputed and not held: dropped
                    assert x.grad is None
                    tx.grad = None
                lazy = False   # (kept: it now reads a copy of the old weights, which no step overwrites)
            elif s == "check":
                if tx.grad is None: assert x.grad is None
                else: np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6)
                lazy = False
            np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6)
            lazy = lazy and x.grad is not None


def test_backward_opt_out_constants_and_other_graphs():
    c = Tensor([1.0, 2.0], requires_grad=False)
    z = Tensor.zeros(2)                                # a constant node shared by every zeros(2): none
    other = Tensor([5.0, 5.0])
    other.grad = Tensor([7.0, 7.0])
    i = Tensor([1, 2])
    x = Tensor([3.0, 4.0], requires_grad=True)
    (x * c + z + i).sum().backward()
    assert c.grad is None and z.grad is None and i.grad is None
    assert other.grad.tolist() == [7.0, 7.0]           # not in this graph: untouched
    assert x.grad.tolist() == [1.0, 2.0]


def test_comparison_gradients_are_zero():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    x, y = Tensor(a, requires_grad=True), Tensor(a[::-1].copy(), requires_grad=True)
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(a[::-1].copy(), requires_grad=True)
    ((x < y).where(x, y * 2) + (x == y).float() * 5).sum().backward()
    (torch.where(tx < ty, tx, ty * 2) + (tx == ty).float() * 5).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_array_equal(y.grad.numpy(), ty.grad.numpy())
    # a tensor reached only through a comparison is in the graph with a zero gradient (torch can't backward this)
    u = Tensor(a, requires_grad=True)
    (u > 1.5).sum().backward()
    assert u.grad.tolist() == [0.0, 0.0, 0.0]
    for cmp in (lambda t: t < 2, lambda t: t >= 2, lambda t: t != 2):
        v = Tensor(a, requires_grad=True)
        g, = cmp(v).float().sum().gradient(v)
        assert g.tolist() == [0.0, 0.0, 0.0]


def test_repeat_symbolic_count_still_works():
    from fusegrad import Variable
    v = Variable("rep", 1, 4).bind(3)
    out = Tensor([1.0, 2.0]).repeat(v)
    assert out.sum().item() == 9.0 and out.numpy().tolist() == [1.0, 2.0] * 3


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_with_an_int_one_hot_target(smoothing):
    """tinygrad decides by shape: an int target shaped like the logits (`Y.one_hot(10)`, as beautiful_cifar passes it)
    is class probabilities, the same loss as its float one-hot and as torch's with the class indices."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 10)).astype(np.float32)
    labels = rng.integers(0, 10, 6)
    got = Tensor(logits).cross_entropy(Tensor(labels).one_hot(10), label_smoothing=smoothing)
    assert dtypes.is_int(Tensor(labels).one_hot(10).dtype)
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels), label_smoothing=smoothing)
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-6)
    # index targets are unchanged
    np.testing.assert_allclose(Tensor(logits).cross_entropy(Tensor(labels), label_smoothing=smoothing).item(),
                               want.item(), rtol=1e-6)


def test_tinygrad_context_flags_of_beautiful_cifar():
    """`Context(SPLIT_REDUCEOP=..., FUSE_ARANGE=...)` (tinygrad's flags) is accepted: SPLIT_REDUCEOP=0 turns the split
    of long reduces off, FUSE_ARANGE changes nothing (arange is always fused); results are the same."""
    from fusegrad import Context
    x = Tensor(np.arange(1 << 20, dtype=np.float32) % 7).realize()   # long enough to be split on a CPU
    with Context(SPLIT_REDUCEOP=1, FUSE_ARANGE=1): split = x.sum().schedule()
    with Context(SPLIT_REDUCEOP=0, FUSE_ARANGE=1):
        whole = x.sum().schedule()
        v = x.sum().item()
    assert len(split) == 2 and len(whole) == 1
    assert v == float((np.arange(1 << 20) % 7).sum())


def test_unrequested_gradients_across_tinyjit_replays_are_dropped_or_keep_their_value():
    """A TinyJit replay that overwrites memory an unrequested gradient reads (views.realize_readers): held, the
    gradient keeps the value it was built with; not held, it is dropped. Checked on every call: plain, capture and
    replays."""
    from fusegrad import TinyJit
    w = Tensor([1.0, 2.0, 3.0]).contiguous().realize()
    double = TinyJit(lambda: w.assign(w * 2).realize())
    want = np.array([1.0, 2.0, 3.0], np.float32)
    for call in range(5):
        x = Tensor([1.0, 1.0, 1.0])
        (x * w).sum().backward()
        held = x.grad if call % 2 else None
        double()
        if held is None: assert x.grad is None, call
        else: np.testing.assert_array_equal(held.numpy(), want)
        want = want * 2
        np.testing.assert_array_equal(w.numpy(), want)
