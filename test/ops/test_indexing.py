"""Movement and indexing ops against PyTorch: cat/stack/split/chunk, repeat/repeat_interleave, unfold, roll, rearrange,
unflatten, diagonal/diag, meshgrid, triu/tril, advanced __getitem__ (int tensors, lists, bool masks), __setitem__,
gather/scatter/scatter_reduce, masked_fill/masked_select, nonzero and one_hot.

Index tensors go to torch as int64 and to fusegrad as int32 (its default int); fusegrad returns indices (nonzero,
one_hot) as int32, which is asserted instead of torch's int64."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes

from .helpers import check_op


def rand(shape, lo=-2, hi=2, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def L(a):
    """An index array as a torch long tensor."""
    return torch.tensor(np.asarray(a), dtype=torch.long)


def I(a, device="CPU"):
    """An index array as a fusegrad int32 tensor."""
    return Tensor(np.asarray(a, dtype=np.int32), device=device)


# ----- cat / stack -----

@pytest.mark.parametrize("shapes,dim", [(((2, 3), (4, 3)), 0), (((2, 3), (2, 1), (2, 5)), 1), (((2, 3, 4),) * 3, -1),
                                        (((1, 3), (2, 3)), -2), (((2, 0), (2, 3)), 1), (((3,), (1,), (2,)), 0)],
                         ids=str)
def test_cat(shapes, dim):
    check_op(shapes, lambda *ts: torch.cat(ts, dim), lambda *ts: ts[0].cat(*ts[1:], dim=dim))


def test_cat_single_and_mixed_dtype():
    check_op([(2, 3)], lambda t: torch.cat([t], 0), lambda t: t.cat(dim=0))
    a, b = np.array([[1, 2]], np.int32), rand((1, 2))
    check_op(None, lambda x, y: torch.cat([x, y], 0), lambda x, y: x.cat(y, dim=0), vals=[a, b])
    c = np.array([[True, False]])
    check_op(None, lambda x, y: torch.cat([x, y], 1), lambda x, y: x.cat(y, dim=1), vals=[c, np.array([[3]], np.int8)])


def test_cat_noncontiguous_and_python():
    check_op([(3, 2), (2, 3)], lambda x, y: torch.cat([x.T, y.flip(0)], 1), lambda x, y: x.T.cat(y.flip(0), dim=1))
    check_op([(1, 2), (2, 2)], lambda x, y: torch.cat([x, y], 0), lambda x, y: x.cat(y, dim=0), device="PYTHON")


def test_cat_mismatch_raises():
    with pytest.raises(RuntimeError):
        Tensor.zeros(2, 3).cat(Tensor.zeros(3, 2), dim=0)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_stack(dim):
    check_op([(2, 3), (2, 3), (2, 3)], lambda *ts: torch.stack(ts, dim), lambda *ts: Tensor.stack(*ts, dim=dim))


def test_stack_list_0d_python():
    check_op([(3,), (3,)], lambda a, b: torch.stack([a, b]), lambda a, b: Tensor.stack([a, b]))
    check_op([(), ()], lambda a, b: torch.stack([a, b]), lambda a, b: Tensor.stack(a, b))
    check_op([(2,), (2,)], lambda a, b: torch.stack([a, b], 1), lambda a, b: Tensor.stack(a, b, dim=1),
             device="PYTHON")
    with pytest.raises(RuntimeError):
        Tensor.stack(Tensor.zeros(2), Tensor.zeros(3))


def test_stack_as_method_includes_self():
    # a.stack(b, c) stacks a too (it was a staticmethod that silently left a out)
    check_op([(2,), (2,), (2,)], lambda a, b, c: torch.stack([a, b, c]), lambda a, b, c: a.stack(b, c))
    check_op([(2,), (2,)], lambda a, b: torch.stack([a, b], 1), lambda a, b: a.stack(b, dim=1))


# ----- split / chunk -----

def pieces_match(x, tpieces, fpieces, device="CPU"):
    assert len(tpieces) == len(fpieces), f"{len(fpieces)} pieces, torch {len(tpieces)}"
    for i, (tp, fp) in enumerate(zip(tpieces, fpieces)):
        assert fp.shape == tuple(tp.shape), f"piece {i}: {fp.shape} vs {tuple(tp.shape)}"
        np.testing.assert_array_equal(fp.numpy(), tp.numpy())


@pytest.mark.parametrize("sizes,dim", [(2, 0), (3, 0), (1, 1), (4, 1), (10, 0), ([1, 2, 2], 0), ([3, 1], -1),
                                       ([0, 5], 0), ([4], 1)], ids=str)
def test_split(sizes, dim):
    x = rand((5, 4), seed=1)
    pieces_match(x, torch.tensor(x).split(sizes, dim), Tensor(x).split(sizes, dim))


@pytest.mark.parametrize("chunks,dim", [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (7, 0), (2, 1), (3, -1)], ids=str)
def test_chunk(chunks, dim):
    x = rand((6, 5), seed=2)
    pieces_match(x, torch.tensor(x).chunk(chunks, dim), Tensor(x).chunk(chunks, dim))


def test_split_chunk_grad():
    # gradients of the pieces go back to their slices
    check_op([(5, 3)], lambda t: torch.cat([p * (i + 1) for i, p in enumerate(t.split([2, 1, 2], 0))][::-1], 0),
             lambda t: _cat_list([p * (i + 1) for i, p in enumerate(t.split([2, 1, 2], 0))][::-1], 0))
    check_op([(4, 6)], lambda t: t.chunk(3, 1)[2] - t.chunk(3, 1)[0], lambda t: t.chunk(3, 1)[2] - t.chunk(3, 1)[0])


def _cat_list(ts, dim):
    return ts[0].cat(*ts[1:], dim=dim)


def test_split_bad_sizes():
    with pytest.raises(RuntimeError):
        Tensor.zeros(5).split([2, 2])


def test_split_python():
    x = rand((3, 2), seed=3)
    pieces_match(x, torch.tensor(x).split(2, 0), Tensor(x, device="PYTHON").split(2, 0))


# ----- repeat / repeat_interleave -----

@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 1)), ((2, 3), (1, 3)), ((2, 3), (2, 2, 2)), ((3,), (4,)),
                                        ((3,), (2, 3)), ((), (3,)), ((2, 1, 2), (1, 3, 1)), ((2, 3), (0, 2))],
                         ids=str)
def test_repeat(shape, reps):
    check_op([shape], lambda t: t.repeat(*reps), lambda t: t.repeat(reps))


def test_repeat_varargs_python():
    check_op([(2, 2)], lambda t: t.repeat(2, 1), lambda t: t.repeat(2, 1), device="PYTHON")


@pytest.mark.parametrize("shape,reps,dim", [((2, 3), 2, 0), ((2, 3), 3, 1), ((2, 3), 2, -1), ((2, 3), 2, None),
                                            ((4,), 3, 0), ((2, 3, 2), 2, 1), ((2, 3), 1, 0)], ids=str)
def test_repeat_interleave(shape, reps, dim):
    check_op([shape], lambda t: torch.repeat_interleave(t, reps, dim), lambda t: t.repeat_interleave(reps, dim))


# ----- unfold, roll, rearrange, unflatten -----

@pytest.mark.parametrize("shape,dim,size,step", [((8,), 0, 3, 1), ((8,), 0, 3, 2), ((8,), 0, 2, 3), ((3, 7), 1, 4, 2),
                                                 ((6, 4), 0, 2, 2), ((2, 5, 3), 1, 5, 1), ((2, 5, 3), -2, 1, 1),
                                                 ((5,), 0, 5, 10)], ids=str)
def test_unfold(shape, dim, size, step):
    check_op([shape], lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step))


def test_unfold_python_and_error():
    check_op([(5,)], lambda t: t.unfold(0, 2, 2), lambda t: t.unfold(0, 2, 2), device="PYTHON")
    with pytest.raises(RuntimeError):
        Tensor.zeros(3).unfold(0, 4, 1)


@pytest.mark.parametrize("shifts,dims", [(1, 0), (-1, 0), (2, 1), (5, 1), (-7, 1), ((1, 2), (0, 1)), ((1, -1), (1, 0)),
                                         (3, None), (-2, None), (0, 1), ((2, 2), (1, 1))], ids=str)
def test_roll(shifts, dims):
    check_op([(3, 4)], lambda t: torch.roll(t, shifts, dims), lambda t: t.roll(shifts, dims))


def test_roll_python_and_empty():
    check_op([(2, 3)], lambda t: torch.roll(t, 1, 1), lambda t: t.roll(1, 1), device="PYTHON")
    check_op([(0, 3)], lambda t: torch.roll(t, 1, 0), lambda t: t.roll(1, 0))


REARRANGES = [
    ("b (h w) c -> b c h w", {"h": 2}, (2, 6, 3),
     lambda t: t.reshape(2, 2, 3, 3).permute(0, 3, 1, 2)),
    ("a b c -> c a b", {}, (2, 3, 4), lambda t: t.permute(2, 0, 1)),
    ("a b c -> a (b c)", {}, (2, 3, 4), lambda t: t.reshape(2, 12)),
    ("a b c -> (c a) b", {}, (2, 3, 4), lambda t: t.permute(2, 0, 1).reshape(8, 3)),
    ("(a b) c -> b a c", {"b": 3}, (6, 2), lambda t: t.reshape(2, 3, 2).permute(1, 0, 2)),
    ("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", {"p1": 2, "p2": 2}, (1, 3, 4, 4),
     lambda t: t.reshape(1, 3, 2, 2, 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(1, 4, 12)),
]


@pytest.mark.parametrize("formula,sizes,shape,tf", REARRANGES, ids=[r[0] for r in REARRANGES])
def test_rearrange(formula, sizes, shape, tf):
    check_op([shape], tf, lambda t: t.rearrange(formula, **sizes))


def test_rearrange_errors():
    with pytest.raises(RuntimeError):
        Tensor.zeros(2, 3).rearrange("a b c -> a b c")
    with pytest.raises(RuntimeError):
        Tensor.zeros(2, 3).rearrange("a b -> a c")


@pytest.mark.parametrize("dim,sizes", [(0, (2, 3)), (1, (2, 2)), (-1, (4, 1)), (0, (-1, 3)), (1, (1, -1, 2))], ids=str)
def test_unflatten(dim, sizes):
    check_op([(6, 4)], lambda t: t.unflatten(dim, sizes), lambda t: t.unflatten(dim, sizes))


# ----- diagonal / diag / meshgrid / triu / tril -----

@pytest.mark.parametrize("shape,offset,d1,d2", [((4, 4), 0, 0, 1), ((3, 5), 1, 0, 1), ((3, 5), -1, 0, 1),
                                                ((5, 3), 2, 0, 1), ((3, 5), 4, 0, 1), ((3, 5), 7, 0, 1),
                                                ((2, 3, 4), 0, 1, 2), ((2, 3, 4), 1, 0, 2), ((2, 3, 4), -1, -1, 0),
                                                ((4, 4), 0, 1, 0)], ids=str)
def test_diagonal(shape, offset, d1, d2):
    check_op([shape], lambda t: torch.diagonal(t, offset, d1, d2), lambda t: t.diagonal(offset, d1, d2))


@pytest.mark.parametrize("shape", [(3,), (1,), (0,), (3, 3), (2, 4), (4, 2)], ids=str)
def test_diag(shape):
    check_op([shape], torch.diag, lambda t: t.diag())


def test_diag_python_and_error():
    check_op([(3,)], torch.diag, lambda t: t.diag(), device="PYTHON")
    check_op([(2, 2)], torch.diag, lambda t: t.diag(), device="PYTHON")
    with pytest.raises(RuntimeError):
        Tensor.zeros(2, 2, 2).diag()


@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("shapes", [((3,), (4,)), ((2,), (3,), (4,)), ((5,),), ((1,), (3,))], ids=str)
def test_meshgrid(shapes, indexing):
    for k in range(len(shapes)):
        check_op(shapes, lambda *ts: torch.meshgrid(*ts, indexing=indexing)[k] * 1.0,
                 lambda *ts: Tensor.meshgrid(*ts, indexing=indexing)[k] * 1.0)


def test_meshgrid_list_arg_and_error():
    a, b = Tensor([1, 2, 3]), Tensor([4, 5])
    ta, tb = torch.tensor([1, 2, 3]), torch.tensor([4, 5])
    for f, t in zip(Tensor.meshgrid([a, b], indexing="xy"), torch.meshgrid([ta, tb], indexing="xy")):
        np.testing.assert_array_equal(f.numpy(), t.numpy())
    with pytest.raises(RuntimeError):
        Tensor.meshgrid(a, b, indexing="yx")


@pytest.mark.parametrize("name", ["triu", "tril"])
@pytest.mark.parametrize("shape,diag", [((4, 4), 0), ((4, 4), 1), ((4, 4), -1), ((3, 5), 2), ((5, 3), -2),
                                        ((2, 3, 3), 0), ((3, 3), 5), ((3, 3), -5)], ids=str)
def test_triu_tril(name, shape, diag):
    check_op([shape], lambda t: getattr(torch, name)(t, diag), lambda t: getattr(t, name)(diag))


@pytest.mark.parametrize("name", ["triu", "tril"])
def test_triu_tril_int_bool_python(name):
    check_op(None, lambda t: getattr(torch, name)(t), lambda t: getattr(t, name)(),
             vals=[np.arange(9, dtype=np.int32).reshape(3, 3)])
    check_op(None, lambda t: getattr(torch, name)(t, 1), lambda t: getattr(t, name)(1),
             vals=[np.ones((3, 3), np.bool_)])
    check_op([(2, 3)], lambda t: getattr(torch, name)(t), lambda t: getattr(t, name)(), device="PYTHON")


# ----- advanced __getitem__ -----

ADV = [
    ("list", lambda T, d: [0, 2, 2, -1]),
    ("tensor1d", lambda T, d: T([1, 0, 2], d)),
    ("tensor2d", lambda T, d: T([[0, 1], [2, -3]], d)),
    ("tensor0d_like", lambda T, d: (T(1, d), T([0, 2], d))),
    ("two_broadcast", lambda T, d: (T([[0], [2]], d), T([1, 3, 0], d))),
    ("three", lambda T, d: (T([0, 1], d), T([2, 0], d), T([4, -1], d))),
    ("slice_then_tensor", lambda T, d: (slice(None), T([3, 0, 1], d))),
    ("slice_tensor_slice", lambda T, d: (slice(1, 3), T([[0, 1], [1, 2]], d), slice(None, None, 2))),
    ("adjacent_mid", lambda T, d: (slice(None), T([0, 2], d), T([1, 4], d))),
    ("nonadjacent", lambda T, d: (T([0, 1], d), slice(None), T([1, 4], d))),
    ("nonadjacent_bcast", lambda T, d: (T([[0], [1]], d), slice(1, 3), T([0, 2, 4], d))),
    ("int_and_tensor", lambda T, d: (1, T([3, 0], d))),
    ("int_between_tensors", lambda T, d: (T([0, 1], d), 2, T([1, 4], d))),
    ("tensor_int_slice", lambda T, d: (T([1, 0, 1], d), 0, slice(1, None))),
    ("none_and_tensor", lambda T, d: (None, T([1, 0], d))),
    ("tensor_none_tensor", lambda T, d: (T([0, 1], d), None, T([2, 3], d))),
    ("ellipsis_tensor", lambda T, d: (Ellipsis, T([4, 0, -5], d))),
    ("tensor_ellipsis", lambda T, d: (T([1], d), Ellipsis, 2)),
    ("negative_all", lambda T, d: (T([-1, -2], d), T([-4, -1], d), T([-5, -1], d))),
    ("repeated", lambda T, d: T([1, 1, 1, 0], d)),
    ("neg_step_slice_tensor", lambda T, d: (slice(None, None, -1), T([0, 2], d))),
]


def to_torch_index(idx):
    def conv(i):
        if isinstance(i, Tensor): return torch.tensor(i.numpy(), dtype=torch.long)
        if isinstance(i, slice) and i.step is not None and i.step < 0: return i
        return i
    return tuple(conv(i) for i in idx) if isinstance(idx, tuple) else conv(idx)


def torch_index(x, idx):
    """torch x[idx]; negative-step slices (unsupported by torch) become index_select first."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    out, dim = [], 0
    for i in idx:
        if isinstance(i, slice) and i.step is not None and i.step < 0:
            x = x.index_select(dim, torch.tensor(list(range(*i.indices(x.shape[dim])))))
            i = slice(None)
        out.append(i)
        if i is not None: dim += 1
    return x[tuple(out)]


@pytest.mark.parametrize("name,mk", ADV, ids=[a[0] for a in ADV])
def test_getitem_advanced(name, mk):
    idx = mk(lambda v, d: Tensor(np.asarray(v, dtype=np.int32), device=d), "CPU")
    tidx = to_torch_index(idx)
    check_op([(3, 4, 5)], lambda t: torch_index(t, tidx), lambda t: t[idx])


PY_ADV = ["tensor2d", "two_broadcast", "nonadjacent", "int_between_tensors"]


@pytest.mark.parametrize("name,mk", [a for a in ADV if a[0] in PY_ADV], ids=PY_ADV)
def test_getitem_advanced_python(name, mk):
    idx = mk(lambda v, d: Tensor(np.asarray(v, dtype=np.int32), device=d), "PYTHON")
    tidx = to_torch_index(idx)
    check_op([(3, 4, 5)], lambda t: torch_index(t, tidx), lambda t: t[idx], device="PYTHON")


@pytest.mark.parametrize("npdt", ["int64", "int8", "uint8", "int16"])
def test_getitem_index_dtypes(npdt):
    ix = np.array([2, 0, 1, 2], npdt)
    check_op([(3, 4)], lambda t: t[torch.tensor(ix.astype(np.int64))], lambda t: t[Tensor(ix)])


def test_getitem_numpy_array_and_empty_list():
    ix = np.array([[0, 2], [1, 1]])
    check_op([(3, 4)], lambda t: t[:, torch.tensor(ix)], lambda t: t[:, ix])
    check_op([(3, 4)], lambda t: t[[]], lambda t: t[[]])


def test_getitem_float_index_raises():
    with pytest.raises(IndexError):
        Tensor.zeros(3)[Tensor([0.0, 1.0])]


def test_getitem_int_and_bool_data():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    check_op(None, lambda t: t[L([2, 0]), L([1, 3])], lambda t: t[I([2, 0]), I([1, 3])], vals=[x])
    b = np.random.default_rng(0).random((3, 4)) < 0.5
    check_op(None, lambda t: t[:, L([3, 3, 0])], lambda t: t[:, I([3, 3, 0])], vals=[b])


MASKS = [np.array([True, False, True]), np.array([[True, False, False, True], [False, False, False, False],
                                                  [True, True, True, True]]), np.zeros(3, np.bool_),
         np.ones((3, 4, 5), np.bool_)]


@pytest.mark.parametrize("mi", range(len(MASKS)))
def test_getitem_bool_mask(mi):
    m = MASKS[mi]
    check_op([(3, 4, 5)], lambda t: t[torch.tensor(m)], lambda t: t[Tensor(m)])


def test_getitem_bool_mask_with_slice_and_computed():
    m = np.array([False, True, True, False, True])
    check_op([(3, 4, 5)], lambda t: t[1:, :, torch.tensor(m)], lambda t: t[1:, :, Tensor(m)])
    check_op([(4, 3)], lambda t: t[t > 0], lambda t: t[t > 0])
    check_op([(2, 3)], lambda t: t[t[:, 0] > -5], lambda t: t[t[:, 0] > -5], device="PYTHON")


# ----- __setitem__ -----

SETS = [
    ("int", lambda: 1, 5.0), ("neg_int", lambda: -1, -2.5), ("slice", lambda: slice(1, 3), 0.0),
    ("step_slice", lambda: (slice(None), slice(None, None, 2)), 7.0),
    ("int_slice", lambda: (0, slice(1, 3)), 1.5), ("ellipsis_int", lambda: (Ellipsis, 2), -1.0),
    ("tensor_value", lambda: slice(0, 2), "tensor"), ("row_broadcast", lambda: (slice(None), 1), "row"),
    ("neg_step", lambda: slice(None, None, -2), 3.0), ("all", lambda: Ellipsis, 0.5),
    ("advanced", lambda: ([0, 2], [1, 3]), 9.0),
]


@pytest.mark.parametrize("name,mk,val", SETS, ids=[s[0] for s in SETS])
def test_setitem(name, mk, val):
    x = rand((3, 4), seed=4)
    idx = mk()
    ref = torch.tensor(x)
    tidx = idx
    if name == "advanced": tidx = (L(idx[0]), L(idx[1]))
    if name == "neg_step": tidx = torch.arange(2, -1, -2)
    target_shape = ref[tidx].shape
    if val == "tensor": v = rand(tuple(target_shape), seed=5)
    elif val == "row": v = rand((3,), seed=6)
    else: v = val
    ref[tidx] = torch.tensor(v) if isinstance(v, np.ndarray) else v
    t = Tensor(x)
    t[idx] = Tensor(v) if isinstance(v, np.ndarray) else v
    assert t.shape == (3, 4) and t.dtype == dtypes.float32
    np.testing.assert_array_equal(t.numpy(), ref.numpy())


def test_setitem_int_tensor_and_cast():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    t, ref = Tensor(x), torch.tensor(x)
    t[1, :] = 2.7   # float value into an int tensor: truncated like torch
    ref[1, :] = 2.7
    t[:, 0] = Tensor([7, 8, 9])
    ref[:, 0] = torch.tensor([7, 8, 9], dtype=torch.int32)
    assert t.dtype == dtypes.int32
    np.testing.assert_array_equal(t.numpy(), ref.numpy())


def test_setitem_is_visible_and_python():
    t = Tensor.zeros(2, 3, device="PYTHON").contiguous()
    t[0, 1] = 4.0
    t[1] = Tensor([1.0, 2.0, 3.0], device="PYTHON")
    np.testing.assert_array_equal(t.numpy(), [[0, 4, 0], [1, 2, 3]])


# ----- gather -----

GATHERS = [
    (0, [[0, 1, 2, 0], [2, 2, 1, 0]]), (1, [[0, 3, 3], [1, 0, 2], [3, 3, 3]]), (1, [[1], [0], [2]]),
    (-1, [[-1, 0], [1, -2], [0, 0]]), (0, [[2, 1, 0, 1]]),
]


@pytest.mark.parametrize("dim,idx", GATHERS, ids=str)
def test_gather(dim, idx):
    ix = np.array(idx)
    tix = np.where(ix < 0, ix + 4 if dim in (1, -1) else ix + 3, ix)   # torch needs non-negative indices
    check_op([(3, 4)], lambda t: torch.gather(t, dim, L(tix)), lambda t: t.gather(dim, I(ix)))


def test_gather_3d_and_int64_index():
    ix = np.random.default_rng(0).integers(0, 4, (2, 3, 5))
    check_op([(2, 4, 5)], lambda t: torch.gather(t, 1, L(ix)), lambda t: t.gather(1, I(ix)))
    check_op([(2, 4, 5)], lambda t: torch.gather(t, 1, L(ix)), lambda t: t.gather(1, Tensor(ix.astype(np.int64))))


def test_gather_python_and_noncontig():
    ix = np.array([[1, 0], [0, 0]])
    check_op([(2, 3)], lambda t: torch.gather(t, 1, L(ix)), lambda t: t.gather(1, I(ix, "PYTHON")), device="PYTHON")
    check_op([(3, 4)], lambda t: torch.gather(t.T, 0, L(ix)), lambda t: t.T.gather(0, I(ix)))


def test_gather_errors():
    with pytest.raises(RuntimeError):
        Tensor.zeros(3, 4).gather(0, I([0, 1]))
    with pytest.raises(RuntimeError):
        Tensor.zeros(3, 4).gather(0, Tensor([[0.0]]))


# ----- scatter / scatter_reduce -----

# (2, 4), scattered into (3, 4) along dim 0, no duplicates per column
SC_INDEX = np.array([[0, 1, 2, 0], [2, 0, 1, 1]])


@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
def test_scatter_src(reduce):
    kw = {} if reduce is None else {"reduce": reduce}
    check_op([(3, 4), (2, 4)], lambda t, s: torch.scatter(t, 0, L(SC_INDEX), s, **kw),
             lambda t, s: t.scatter(0, I(SC_INDEX), s, **kw), forward_only=reduce is not None)


@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
def test_scatter_scalar(reduce):
    kw = {} if reduce is None else {"reduce": reduce}
    check_op([(3, 4)], lambda t: torch.scatter(t, 0, L(SC_INDEX), 2.5, **kw),
             lambda t: t.scatter(0, I(SC_INDEX), 2.5, **kw), forward_only=reduce is not None)


def test_scatter_dim1_duplicates_add_and_larger_src():
    ix = np.array([[0, 0, 2], [1, 3, 3]])
    src = rand((2, 5), seed=9)
    check_op(None, lambda t, s: torch.scatter(t, 1, L(ix), s, reduce="add"),
             lambda t, s: t.scatter(1, I(ix), s, reduce="add"), vals=[rand((3, 4)), src], forward_only=True)
    # torch.scatter_add is differentiable
    check_op(None, lambda t, s: torch.scatter_add(t, 1, L(ix), s[:, :3]),
             lambda t, s: t.scatter(1, I(ix), s[:, :3], reduce="add"), vals=[rand((3, 4)), src])


def test_scatter_int_and_python():
    x = np.zeros((3, 3), np.int32)
    check_op(None, lambda t: torch.scatter(t, 1, L([[2], [0], [1]]), 7), lambda t: t.scatter(1, I([[2], [0], [1]]), 7),
             vals=[x])
    check_op([(2, 3), (2, 3)], lambda t, s: torch.scatter(t, 1, L([[2, 1, 0], [0, 2, 1]]), s),
             lambda t, s: t.scatter(1, I([[2, 1, 0], [0, 2, 1]], "PYTHON"), s), device="PYTHON")


SR_INDEX = np.array([[0, 1, 0, 2], [1, 1, 0, 0], [2, 0, 2, 2]])   # duplicates: several src rows hit one target


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
def test_scatter_reduce(reduce, include_self):
    x, src = rand((3, 4), seed=1), rand((3, 4), 0.5, 2, seed=2)
    check_op(None, lambda t, s: torch.scatter_reduce(t, 0, L(SR_INDEX), s, reduce, include_self=include_self),
             lambda t, s: t.scatter_reduce(0, I(SR_INDEX), s, reduce, include_self=include_self), vals=[x, src],
             forward_only=True)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin", "prod"])
def test_scatter_reduce_grad(reduce, include_self):
    # no duplicate indices: every target gets at most one source, so torch's gradient routing is unambiguous
    ix = np.array([[2, 0, 1, 0], [0, 2, 2, 1]])
    x, src = rand((3, 4), seed=3), rand((2, 4), seed=4)
    check_op(None, lambda t, s: torch.scatter_reduce(t, 0, L(ix), s, reduce, include_self=include_self),
             lambda t, s: t.scatter_reduce(0, I(ix), s, reduce, include_self=include_self), vals=[x, src])


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin", "prod"])
def test_scatter_reduce_int(reduce):
    x = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    src = np.array([[7, -3, 2], [5, 9, -8]], np.int32)
    ix = np.array([[0, 2, 2], [1, 1, 0]])
    for inc in (True, False):
        check_op(None, lambda t, s: torch.scatter_reduce(t, 1, L(ix), s, reduce, include_self=inc),
                 lambda t, s: t.scatter_reduce(1, I(ix), s, reduce, include_self=inc), vals=[x, src])


def test_scatter_reduce_dim1_python():
    ix = np.array([[0, 0], [1, 0]])
    check_op([(2, 3), (2, 2)], lambda t, s: torch.scatter_reduce(t, 1, L(ix), s, "sum"),
             lambda t, s: t.scatter_reduce(1, I(ix, "PYTHON"), s, "sum"), device="PYTHON")


# ----- masks, nonzero, one_hot -----

@pytest.mark.parametrize("value", [0.0, -1.5, float("inf"), float("nan")])
def test_masked_fill(value):
    m = np.random.default_rng(0).random((3, 4)) < 0.5
    check_op([(3, 4)], lambda t: t.masked_fill(torch.tensor(m), value), lambda t: t.masked_fill(Tensor(m), value))


def test_masked_fill_broadcast_int_python():
    m = np.array([True, False, True, False])
    check_op([(3, 4)], lambda t: t.masked_fill(torch.tensor(m), 2.0), lambda t: t.masked_fill(Tensor(m), 2.0))
    check_op(None, lambda t: t.masked_fill(torch.tensor(m), 9), lambda t: t.masked_fill(Tensor(m), 9),
             vals=[np.arange(8, dtype=np.int32).reshape(2, 4)])
    check_op([(2, 4)], lambda t: t.masked_fill(torch.tensor(m), 0.5),
             lambda t: t.masked_fill(Tensor(m, device="PYTHON"), 0.5), device="PYTHON")


@pytest.mark.parametrize("mshape", [(3, 4), (4,), (3, 1)], ids=str)
def test_masked_select(mshape):
    m = np.random.default_rng(1).random(mshape) < 0.5
    check_op([(3, 4)], lambda t: torch.masked_select(t, torch.tensor(m)), lambda t: t.masked_select(Tensor(m)))


def test_masked_select_empty_and_all():
    check_op([(2, 3)], lambda t: torch.masked_select(t, torch.zeros(2, 3, dtype=torch.bool)),
             lambda t: t.masked_select(Tensor.zeros(2, 3, dtype="bool")))
    check_op([(2, 3)], lambda t: torch.masked_select(t, torch.ones(2, 3, dtype=torch.bool)),
             lambda t: t.masked_select(Tensor.ones(2, 3, dtype="bool")))


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 2), (), (0, 3)], ids=str)
def test_nonzero(shape):
    v = (np.random.default_rng(2).random(shape) < 0.4).astype(np.float32) * 3.0
    check_op(None, torch.nonzero, lambda t: t.nonzero(), vals=[v], forward_only=True, out_dtype="int32")


def test_nonzero_types_and_python():
    v = np.array([[0, 1, 0], [2, 0, -3]], np.int32)
    check_op(None, torch.nonzero, lambda t: t.nonzero(), vals=[v], out_dtype="int32")
    check_op(None, torch.nonzero, lambda t: t.nonzero(), vals=[v != 0], out_dtype="int32")
    check_op(None, torch.nonzero, lambda t: t.nonzero(), vals=[np.array([0.0, np.nan, -0.0, 1.0], np.float32)],
             forward_only=True, out_dtype="int32")
    check_op(None, torch.nonzero, lambda t: t.nonzero(), vals=[v], device="PYTHON", out_dtype="int32")
    check_op(None, torch.nonzero, lambda t: t.nonzero(), vals=[np.zeros((2, 2), np.int32)], out_dtype="int32")


@pytest.mark.parametrize("num_classes", [-1, 5, 8])
def test_one_hot(num_classes):
    v = np.array([[0, 3, 1], [4, 4, 2]], np.int32)
    check_op(None, lambda t: torch.nn.functional.one_hot(t.long(), num_classes), lambda t: t.one_hot(num_classes),
             vals=[v], out_dtype="int32")


def test_one_hot_0d_python():
    check_op(None, lambda t: torch.nn.functional.one_hot(t.long(), 3), lambda t: t.one_hot(3),
             vals=[np.array(2, np.int32)], out_dtype="int32")
    check_op(None, lambda t: torch.nn.functional.one_hot(t.long(), 4), lambda t: t.one_hot(4),
             vals=[np.array([3, 0, 1], np.int32)], device="PYTHON", out_dtype="int32")


# ----- rearrange: every einops form, compared with the einops package -----

EINOPS_CASES = [
    ("b (h w) c -> b h w c", {"h": 2}, (2, 6, 3)),
    ("i ... (j alpha) -> i j ... alpha", {"alpha": 2}, (2, 3, 4, 6)),
    ("i ... (j alpha) -> (i j) ... alpha", {"j": 3}, (2, 5, 6)),
    ("b c 1 1 -> b c", {}, (2, 3, 1, 1)),
    ("b c -> b 1 c ()", {}, (2, 3)),
    ("b ... -> b (...)", {}, (2, 3, 4, 5)),
    ("... c -> c ...", {}, (3,)),
    ("... -> ...", {}, ()),
    ("(a b) (c d) -> (d a) (b c)", {"a": 2, "c": 3}, (4, 6)),
    ("b h w c -> (b h) (w c)", {"b": 2, "c": 3}, (2, 2, 2, 3)),
]


@pytest.mark.parametrize("formula,sizes,shape", EINOPS_CASES, ids=[c[0] for c in EINOPS_CASES])
def test_rearrange_vs_einops(formula, sizes, shape):
    einops = pytest.importorskip("einops")
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    want = einops.rearrange(x, formula, **sizes)
    got = Tensor(x).rearrange(formula, **sizes).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("formula,sizes,shape", [
    ("a b -> a", {}, (2, 3)), ("a b", {}, (2, 3)), ("a (b -> a b", {}, (2, 3)), ("a b) -> a b", {}, (2, 3)),
    ("((a b)) -> a b", {}, (6,)), ("a a -> a", {}, (2, 2)), ("a 2 -> a", {}, (3, 2)), ("a b -> a b", {"c": 2}, (2, 3)),
    ("(a b) -> a b", {}, (6,)), ("(a b) -> a b", {"a": 4}, (6,)), ("a 1 -> a", {}, (2, 3)), ("(a ...) -> a ...", {}, (6,)),
    ("a ... -> a", {}, (2, 3)), ("a b c -> a b c", {}, (2, 3)), ("a b -> a b", {"a": 5}, (2, 3)), ("a-b -> a", {}, (2,)),
], ids=str)
def test_rearrange_bad_patterns(formula, sizes, shape):
    einops = pytest.importorskip("einops")
    x = np.zeros(shape, np.float32)
    with pytest.raises((einops.EinopsError, ValueError)): einops.rearrange(x, formula, **sizes)   # einops too
    with pytest.raises(ValueError): Tensor(x).rearrange(formula, **sizes)


def test_an_index_tensor_on_another_device_is_read_from_the_tensors_device():
    """t[idx] with idx on another device (PYTHON against CPU) works as torch's CPU indices do for any device; before,
    the CPU kernel was handed the other device's memory and ctypes raised 'wrong type'. gather/masked_fill with an
    index or mask elsewhere raise torch's same-device error."""
    t = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="CPU")
    idx, mask = Tensor([2, 0], device="PYTHON"), Tensor([True, False, True], device="PYTHON")
    np.testing.assert_array_equal(t[idx].numpy(), np.arange(12).reshape(3, 4)[[2, 0]])
    np.testing.assert_array_equal(t[mask].numpy(), np.arange(12).reshape(3, 4)[[0, 2]])
    np.testing.assert_array_equal(t[:, idx].numpy(), np.arange(12).reshape(3, 4)[:, [2, 0]])
    with pytest.raises(RuntimeError, match="same device"): t.gather(0, Tensor([[0, 1, 2, 0]], device="PYTHON"))
    with pytest.raises(RuntimeError, match="same device"): t.masked_fill(Tensor([[True] * 4] * 3, device="PYTHON"), 0)
