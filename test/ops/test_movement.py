"""Movement ops (views) against PyTorch, with gradients: reshape (incl. -1), permute, expand, pad (torch's flat form
and per-axis pairs, with a value, negative pads), shrink, flip, T, transpose, squeeze, unsqueeze, flatten, and basic
indexing with ints, slices (incl. steps and negative steps), None and Ellipsis; chains of views."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from .helpers import DEVICES, check_op

# ----- reshape -----

RESHAPES = [((2, 3, 4), (6, 4)), ((2, 3, 4), (4, -1)), ((2, 3, 4), (-1,)), ((2, 3, 4), (1, 2, 3, 4)),
            ((2, 3, 4), (3, 2, 4)), ((2, 3, 4), (24, 1)), ((2, 3, 4), (2, -1, 2)), ((6,), (3, 2)), ((1,), ()),
            ((), (1, 1)), ((), (-1,)), ((4, 1), (4,)), ((0, 3), (3, 0)), ((0, 3), (-1, 3)), ((2, 0), (0,))]


@pytest.mark.parametrize("shape,new", RESHAPES, ids=str)
def test_reshape(shape, new):
    check_op([shape], lambda x: x.reshape(new) * 2)


def test_reshape_varargs_and_view():
    check_op([(2, 6)], lambda x: x.reshape(3, 4))
    check_op([(2, 6)], lambda x: x.reshape(-1, 3))
    check_op([(2, 6)], lambda x: x.view(4, 3))


def test_reshape_of_permuted():
    # a reshape of a non-contiguous view must read the data in the view's logical order
    check_op([(3, 4)], lambda x: x.permute(1, 0).reshape(2, 6))
    check_op([(2, 3, 4)], lambda x: x.permute(2, 0, 1).reshape(4, 6).flip(0).reshape(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_small(device):
    check_op([(2, 3)], lambda x: x.reshape(3, 2) * x.reshape(-1).reshape(3, 2), device=device)


# ----- permute / T / transpose -----

@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0), (-1, 0, 1), (0, -1, -2)], ids=str)
def test_permute(order):
    check_op([(2, 3, 4)], lambda x: x.permute(order) + 0)


def test_permute_4d_and_varargs():
    check_op([(2, 3, 4, 5)], lambda x: x.permute(3, 1, 0, 2) * 1.5)
    check_op([(2, 3)], lambda x: x.permute(1, 0))


def test_permute_twice():
    check_op([(2, 3, 4)], lambda x: x.permute(1, 2, 0).permute(2, 1, 0))


@pytest.mark.parametrize("device", DEVICES)
def test_T(device):
    check_op([(2, 3)], lambda x: x.T * 2, device=device)


def test_T_other_ranks():
    check_op([(4,)], lambda x: x.permute(0), lambda x: x.T)
    check_op([(2, 3, 4)], lambda x: x.permute(2, 1, 0), lambda x: x.T)


@pytest.mark.parametrize("d0,d1", [(0, 2), (-1, -2), (1, 1), (2, 0), (0, -1)], ids=str)
def test_transpose(d0, d1):
    check_op([(2, 3, 4)], lambda x: x.transpose(d0, d1))


def test_transpose_default_args():
    # fusegrad's transpose() defaults to swapping dims 1 and 0
    check_op([(2, 3)], lambda x: x.transpose(1, 0), lambda x: x.transpose())


# ----- expand -----

EXPANDS = [((3, 1), (3, 4)), ((1,), (2, 3)), ((3,), (2, 3)), ((3, 1), (-1, 4)), ((2, 1, 3), (2, 5, 3)),
           ((1, 1), (4, 5)), ((), (2, 2)), ((2, 3), (2, 3)), ((1, 3), (2, 2, -1)), ((1, 3), (0, 3))]


@pytest.mark.parametrize("shape,new", EXPANDS, ids=str)
def test_expand(shape, new):
    check_op([shape], lambda x: x.expand(new) * 1)


def test_expand_varargs():
    check_op([(3, 1)], lambda x: x.expand(3, 4))


@pytest.mark.parametrize("device", DEVICES)
def test_expand_small(device):
    check_op([(1, 3)], lambda x: x.expand(2, 3).exp(), device=device)


# ----- pad -----

FLAT_PADS = [((3, 4), (1, 2), 0.0), ((3, 4), (1, 2, 0, 1), 0.0), ((3, 4), (0, 0, 2, 1), 1.5), ((2, 3, 4), (1, 1, 1, 1, 1, 1), -2.0),
             ((3, 4), (2, 0), -1.0), ((3, 4), (-1, 2), 0.0), ((3, 4), (1, -2, -1, 1), 3.0), ((4,), (3, 3), 0.5),
             ((3, 4), (0, 0), 0.0), ((0, 2), (1, 1, 1, 0), 7.0)]


@pytest.mark.parametrize("shape,pad,value", FLAT_PADS, ids=str)
def test_pad_flat(shape, pad, value):
    check_op([shape], lambda x: F.pad(x, pad, value=value), lambda x: x.pad(pad, value=value))


def pairs_to_flat(pairs):
    """fusegrad's per-axis pairs (first axis first) -> torch's flat form (last axis first)."""
    flat = []
    for p in reversed(pairs): flat += list(p) if p is not None else [0, 0]
    return tuple(flat)


PAIR_PADS = [((3, 4), ((1, 0), (0, 2)), 0.0), ((3, 4), (None, (1, 1)), 2.5), ((3, 4), ((2, 2), None), -1.0),
             ((2, 3, 4), ((0, 1), (1, 0), (2, 2)), 0.0), ((3, 4), ((0, 0), (0, 0)), 1.0), ((3, 4), ((-1, 1), (0, -2)), 0.0)]


@pytest.mark.parametrize("shape,pad,value", PAIR_PADS, ids=str)
def test_pad_pairs(shape, pad, value):
    check_op([shape], lambda x: F.pad(x, pairs_to_flat(pad), value=value), lambda x: x.pad(pad, value=value))


@pytest.mark.parametrize("device", DEVICES)
def test_pad_small(device):
    check_op([(2, 2)], lambda x: F.pad(x, (1, 0, 0, 1), value=-0.5) * 2, lambda x: x.pad((1, 0, 0, 1), value=-0.5) * 2,
             device=device)


def test_pad_int_and_bool():
    check_op(None, lambda x: F.pad(x, (1, 1), value=7), lambda x: x.pad((1, 1), value=7),
             vals=[np.array([[1, 2], [3, 4]], np.int32)])
    check_op(None, lambda x: F.pad(x, (1, 1)), lambda x: x.pad((1, 1)), vals=[np.array([[True, False]])])


def test_pad_with_inf_value():
    check_op([(2, 3)], lambda x: F.pad(x, (1, 1), value=float("-inf")), lambda x: x.pad((1, 1), value=float("-inf")))


def test_pad_of_view_and_pad_twice():
    check_op([(3, 4)], lambda x: F.pad(F.pad(x.T, (1, 0)), (0, 2, 1, 1), value=1.0),
             lambda x: x.T.pad((1, 0)).pad((0, 2, 1, 1), value=1.0))


# ----- shrink -----

SHRINKS = [((4, 5), ((1, 3), (0, 2))), ((4, 5), (None, (1, 4))), ((4, 5), ((0, 4), (0, 5))), ((4, 5), ((2, 2), None)),
           ((4, 5), ((3, 4), (4, 5))), ((2, 3, 4), ((0, 1), None, (1, 3)))]


def shrink_torch(x, arg):
    return x[tuple(slice(None) if a is None else slice(a[0], a[1]) for a in arg)]


@pytest.mark.parametrize("shape,arg", SHRINKS, ids=str)
def test_shrink(shape, arg):
    check_op([shape], lambda x: shrink_torch(x, arg) * 3, lambda x: x.shrink(arg) * 3)


@pytest.mark.parametrize("device", DEVICES)
def test_shrink_small(device):
    check_op([(3, 3)], lambda x: x[1:3, 0:2], lambda x: x.shrink(((1, 3), (0, 2))), device=device)


def test_shrink_of_pad_roundtrip():
    check_op([(3, 4)], lambda x: F.pad(x, (1, 1, 2, 2), value=9.0)[2:5, 1:5],
             lambda x: x.pad((1, 1, 2, 2), value=9.0).shrink(((2, 5), (1, 5))))


# ----- flip -----

@pytest.mark.parametrize("axis", [0, 1, -1, (0, 1), (2, 0), (0, 1, 2)], ids=str)
def test_flip(axis):
    dims = axis if isinstance(axis, tuple) else (axis,)
    check_op([(2, 3, 4)], lambda x: torch.flip(x, dims) + 0, lambda x: x.flip(axis) + 0)


def test_flip_varargs_and_twice():
    check_op([(3, 4)], lambda x: x.flip(0, 1))
    check_op([(3, 4)], lambda x: x.flip(0).flip(0) * x.flip(1))


@pytest.mark.parametrize("device", DEVICES)
def test_flip_small(device):
    check_op([(2, 3)], lambda x: x.flip(1) - x, device=device)


# ----- squeeze / unsqueeze / flatten -----

@pytest.mark.parametrize("dim", [None, 0, 1, 3, -1, -3, 2], ids=str)
def test_squeeze(dim):
    check_op([(1, 3, 1, 4)] if dim != 3 else [(2, 3, 4, 1)], lambda x: x.squeeze() if dim is None else x.squeeze(dim))


@pytest.mark.parametrize("dims", [(0, 2), (0, 1), (-1, -2), (), [2]], ids=str)
def test_squeeze_tuple_of_dims(dims):
    # torch >= 2.0 takes a tuple of dims; the ones that aren't size 1 stay
    check_op([(1, 3, 1, 1)], lambda x: x.squeeze(tuple(dims)) if isinstance(dims, tuple) else x.squeeze(dims))


def test_squeeze_0d_and_all_ones():
    check_op([()], lambda x: x.squeeze())
    check_op([(1, 1)], lambda x: x.squeeze())
    check_op([(1, 1)], lambda x: x.squeeze(0))


@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -2, -4], ids=str)
def test_unsqueeze(dim):
    check_op([(2, 3, 4)], lambda x: x.unsqueeze(dim))


def test_unsqueeze_0d():
    check_op([()], lambda x: x.unsqueeze(0))
    check_op([()], lambda x: x.unsqueeze(-1))


@pytest.mark.parametrize("args", [(), (1,), (0, 1), (1, -1), (-2, -1), (0, 0), (2, 3)], ids=str)
def test_flatten(args):
    check_op([(2, 3, 4, 5)], lambda x: x.flatten(*args))


def test_flatten_0d_and_1d():
    check_op([()], lambda x: x.flatten())
    check_op([(5,)], lambda x: x.flatten())


@pytest.mark.parametrize("device", DEVICES)
def test_squeeze_unsqueeze_flatten_small(device):
    check_op([(1, 2, 2)], lambda x: x.squeeze(0).unsqueeze(-1).flatten(), device=device)


# ----- __getitem__ -----

def torch_getitem(x, idx):
    """x[idx] in torch, where slices with negative steps (unsupported by torch) become index_select."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    if any(i is Ellipsis for i in idx):
        k = idx.index(Ellipsis)
        n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
        idx = idx[:k] + (slice(None),) * (x.ndim - n_real) + idx[k + 1:]
    out, dim = [], 0
    for i in idx:
        if i is None:
            out.append(None)
            continue
        if isinstance(i, slice) and i.step is not None and i.step < 0:
            x = x.index_select(dim, torch.tensor(list(range(*i.indices(x.shape[dim]))), dtype=torch.long))
            out.append(slice(None))
        else:
            out.append(i)
        dim += 1
    return x[tuple(out)]


S = slice
INDICES = [
    1, -1, (1, 2), (-1, -2), (0, 0, 0), (-3, 3, -5), S(1, 3), S(None, None, 2), S(None, None, -1), S(2, 0, -1),
    S(-2, None), S(10, 20), S(2, 2), S(-100, 100), (S(None), 2), (S(None), S(None), -1), (None, 1), (1, None),
    (None, None), (Ellipsis, 1), (1, Ellipsis), (Ellipsis, None), (None, Ellipsis, None), (Ellipsis,), (1, Ellipsis, 2),
    (S(1, None), None, S(None, None, -2)), (S(None, None, 3), S(1, 4, 2)), (S(None), S(3, 0, -2), S(None, None, -3)),
    (S(0, 3, 2), 1, S(4, None, -1)), (2, S(None, None, -1), 4), (S(None, None, -1), S(None, None, -1), S(None, None, -1)),
    (S(1, 2), S(1, 2), S(1, 2)), (Ellipsis, S(None, None, 2)), (0, None, S(1, 3), None),
]


@pytest.mark.parametrize("idx", INDICES, ids=str)
def test_getitem(idx):
    check_op([(3, 4, 5)], lambda x: torch_getitem(x, idx) * 2, lambda x: x[idx] * 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("idx", [1, (S(None), -1), S(None, None, -1), (None, S(1, None)), (Ellipsis, 0),
                                 (S(None, None, 2), S(None, None, -2))], ids=str)
def test_getitem_small(idx, device):
    check_op([(3, 3)], lambda x: torch_getitem(x, idx), lambda x: x[idx], device=device)


def test_getitem_1d_and_0d():
    check_op([(6,)], lambda x: torch_getitem(x, S(None, None, -2)), lambda x: x[::-2])
    check_op([(6,)], lambda x: x[3])
    check_op([()], lambda x: x[None])
    check_op([()], lambda x: x[...])


def test_getitem_int_tensor():
    check_op(None, lambda x: torch_getitem(x, (S(None, None, -1), 1)), lambda x: x[::-1, 1],
             vals=[np.arange(12, dtype=np.int32).reshape(4, 3)])


def test_getitem_of_view():
    check_op([(3, 4, 5)], lambda x: torch_getitem(x.permute(2, 0, 1), (S(1, None, 2), -1, S(None, None, -1))),
             lambda x: x.permute(2, 0, 1)[1::2, -1, ::-1])


def test_getitem_same_element_twice():
    # two views of the same input: their gradients add up
    check_op([(4, 4)], lambda x: x[1:3, 1:3] * x[:2, 2:] + x[0, 0])


def test_getitem_on_broadcast_result():
    check_op([(3, 1), (1, 4)], lambda x, y: torch_getitem(x + y, (S(None, None, -1), S(1, None, 2))),
             lambda x, y: (x + y)[::-1, 1::2])


# ----- chains of views -----

def test_view_chain():
    check_op([(2, 3, 4)], lambda x: torch.flip(F.pad(x.permute(1, 0, 2).reshape(3, 8)[1:, ::2], (1, 1), value=2.0), (0,))
             .T.unsqueeze(0).expand(2, 6, 2).flatten(0, 1),
             lambda x: x.permute(1, 0, 2).reshape(3, 8)[1:, ::2].pad((1, 1), value=2.0).flip(0)
             .T.unsqueeze(0).expand(2, 6, 2).flatten(0, 1))


def test_view_chain_python():
    check_op([(2, 3)], lambda x: torch.flip(F.pad(x.T, (0, 1)), (1,)).reshape(-1)[1::2],
             lambda x: x.T.pad((0, 1)).flip(1).reshape(-1)[1::2], device="PYTHON")


def test_views_do_not_alias_after_realize():
    from fusegrad import Tensor
    a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = a.T.realize()
    c = (a + 1).realize()
    np.testing.assert_array_equal(b.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3).T)
    np.testing.assert_array_equal(c.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) + 1)


# ----- pad modes (torch.nn.functional.pad semantics, with gradients) -----

PAD_MODES = [((5,), (2, 3), "reflect"), ((3, 4), (1, 2, 2, 1), "reflect"), ((3, 4), (3, 0), "replicate"),
             ((2, 3, 4), (1, 2, 2, 1), "replicate"), ((4,), (4, 2), "circular"), ((2, 3, 5), (2, 1, 0, 3), "circular"),
             ((1, 6), (-1, 2), "reflect"), ((1, 6), (2, -2), "circular")]


@pytest.mark.parametrize("shape,pads,mode", PAD_MODES)
def test_pad_modes(shape, pads, mode):
    # torch wants a batch axis in front of the padded ones for these modes
    torch_fn = (lambda x: F.pad(x, pads, mode=mode)) if len(shape) > len(pads) // 2 else \
        (lambda x: F.pad(x[None], pads, mode=mode)[0])
    check_op([shape], torch_fn, lambda x: x.pad(pads, mode=mode))


def test_pad_mode_per_axis_pairs():
    check_op([(3, 4)], lambda x: F.pad(x[None], (2, 1, 1, 2), mode="replicate")[0],
             lambda x: x.pad([(1, 2), (2, 1)], mode="replicate"))


@pytest.mark.parametrize("device", DEVICES)
def test_pad_reflect_backends(device):
    check_op([(2, 5)], lambda x: F.pad(x, (2, 2), mode="reflect"), lambda x: x.pad((2, 2), "reflect"),
             device=device)


def test_pad_mode_errors():
    from fusegrad import Tensor
    with pytest.raises(RuntimeError, match="reflect"): Tensor.ones(3).pad((3, 0), mode="reflect")
    with pytest.raises(RuntimeError, match="circular"): Tensor.ones(3).pad((4, 0), mode="circular")
    with pytest.raises(NotImplementedError, match="mode"): Tensor.ones(3).pad((1, 0), mode="wrap")
    with pytest.raises(ValueError, match="value"): Tensor.ones(3).pad((1, 0), mode="replicate", value=2.0)
    assert Tensor.ones(2).pad((1, 1), 5.0).tolist() == [5.0, 1.0, 1.0, 5.0]  # value in mode's place still works
