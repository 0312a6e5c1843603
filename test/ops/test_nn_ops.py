"""nn-style ops against torch.nn.functional: convolutions (1/2/3-d, groups, stride, dilation, padding) and transposed
convolutions, pooling (avg/max, ceil_mode, indices, unpool), scaled dot-product attention, linear, layernorm, batchnorm,
dropout, normalize, the losses, einsum, interpolate and qr. Forward values and gradients of every float input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fusegrad import Tensor

from .helpers import check_op


def rand(shape, lo=-1, hi=1, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def L(a):
    return torch.tensor(np.asarray(a), dtype=torch.long)


def I(a, device="CPU"):
    return Tensor(np.asarray(a, dtype=np.int32), device=device)


# ----- conv2d -----

# (x shape, w shape, kwargs for both)
CONV2D = [
    ((1, 1, 5, 5), (1, 1, 3, 3), {}),
    ((2, 3, 6, 5), (4, 3, 3, 2), {}),
    ((2, 3, 6, 6), (4, 3, 3, 3), {"padding": 1}),
    ((1, 2, 7, 6), (3, 2, 3, 3), {"padding": (2, 0)}),
    ((1, 2, 7, 7), (3, 2, 3, 3), {"stride": 2}),
    ((1, 2, 8, 7), (3, 2, 2, 3), {"stride": (2, 3), "padding": 1}),
    ((1, 2, 7, 7), (2, 2, 3, 3), {"dilation": 2}),
    ((1, 2, 9, 8), (2, 2, 3, 2), {"dilation": (2, 3), "padding": (2, 1), "stride": (1, 2)}),
    ((2, 4, 5, 5), (4, 2, 3, 3), {"groups": 2}),
    ((1, 4, 5, 5), (4, 1, 3, 3), {"groups": 4, "padding": 1}),           # depthwise
    ((1, 6, 6, 6), (9, 2, 2, 2), {"groups": 3, "stride": 2}),
    ((1, 3, 5, 6), (2, 3, 3, 3), {"padding": "same"}),
    ((1, 3, 6, 6), (2, 3, 4, 2), {"padding": "same"}),                    # even kernel: asymmetric padding
    ((1, 2, 7, 7), (2, 2, 3, 3), {"padding": "same", "dilation": 2}),
    ((1, 2, 5, 5), (3, 2, 3, 3), {"padding": "valid"}),
    ((1, 1, 3, 3), (2, 1, 1, 1), {}),
    ((1, 2, 4, 4), (3, 2, 4, 4), {}),                                      # kernel covers the input: 1x1 output
]


def conv_kwargs_torch(kw):
    return {k: v for k, v in kw.items()}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,kw", CONV2D, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CONV2D])
def test_conv2d(xs, ws, kw, bias):
    shapes = [xs, ws] + ([(ws[0],)] if bias else [])
    check_op(shapes, lambda x, w, *b: F.conv2d(x, w, b[0] if b else None, **kw),
             lambda x, w, *b: x.conv2d(w, b[0] if b else None, **kw), atol=1e-5, grad_atol=1e-4)


@pytest.mark.parametrize("kw", [{}, {"groups": 2, "stride": 2, "padding": 1}])
def test_conv2d_weight_grad_grouped_batches(kw):
    # a batch large enough that the weight gradient sums groups of samples first (mixin/nn.py _samples_per_group)
    from fusegrad.mixin.nn import _samples_per_group
    assert _samples_per_group(16, 8 * 64 * 64 * 4, 8 * 8 * 9 * 4) < 16
    check_op([(16, 8, 64, 64), (8, 8 // kw.get("groups", 1), 3, 3)], lambda x, w: F.conv2d(x, w, **kw),
             lambda x, w: x.conv2d(w, **kw), atol=1e-4, grad_atol=1e-3)


def test_conv2d_python():
    check_op([(1, 2, 4, 4), (2, 2, 2, 2), (2,)], lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
             lambda x, w, b: x.conv2d(w, b, stride=2, padding=1), device="PYTHON", atol=1e-5)


def test_conv2d_flat_padding():
    # fusegrad also takes torch's F.pad-style 4-tuple (left, right, top, bottom)
    check_op([(1, 2, 5, 5), (2, 2, 3, 3)], lambda x, w: F.conv2d(F.pad(x, (1, 0, 2, 1)), w),
             lambda x, w: x.conv2d(w, padding=(1, 0, 2, 1)), atol=1e-5)


def test_conv2d_noncontiguous_input():
    check_op([(1, 5, 5, 2), (3, 2, 3, 3)], lambda x, w: F.conv2d(x.permute(0, 3, 2, 1).flip(3), w),
             lambda x, w: x.permute(0, 3, 2, 1).flip(3).conv2d(w), atol=1e-5)


def test_conv2d_errors():
    with pytest.raises(RuntimeError):
        Tensor.zeros(1, 3, 5, 5).conv2d(Tensor.zeros(2, 2, 3, 3))
    with pytest.raises(ValueError):
        Tensor.zeros(1, 2, 5, 5).conv2d(Tensor.zeros(2, 2, 3, 3), stride=2, padding="same")


CONV1D = [((2, 3, 10), (4, 3, 3), {}), ((1, 2, 9), (2, 2, 4), {"stride": 2, "padding": 1}),
          ((1, 4, 8), (4, 2, 3), {"groups": 2, "dilation": 2}), ((1, 2, 7), (3, 2, 3), {"padding": "same"})]


@pytest.mark.parametrize("xs,ws,kw", CONV1D, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CONV1D])
def test_conv1d(xs, ws, kw):
    check_op([xs, ws, (ws[0],)], lambda x, w, b: F.conv1d(x, w, b, **kw), lambda x, w, b: x.conv2d(w, b, **kw),
             atol=1e-5)


CONV3D = [((1, 2, 4, 4, 4), (2, 2, 2, 2, 2), {}), ((1, 2, 5, 4, 5), (3, 2, 3, 2, 3), {"padding": 1, "stride": 2}),
          ((1, 4, 4, 5, 4), (2, 2, 2, 3, 2), {"groups": 2, "dilation": (1, 2, 1)})]


@pytest.mark.parametrize("xs,ws,kw", CONV3D, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CONV3D])
def test_conv3d(xs, ws, kw):
    check_op([xs, ws, (ws[0],)], lambda x, w, b: F.conv3d(x, w, b, **kw), lambda x, w, b: x.conv2d(w, b, **kw),
             atol=1e-5)


# ----- conv_transpose -----

CONVT = [
    ((1, 2, 4, 4), (2, 3, 3, 3), {}),
    ((2, 3, 3, 4), (3, 2, 2, 3), {"stride": 2}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((1, 2, 3, 5), (2, 2, 3, 2), {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2)}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"dilation": 2}),
    ((1, 2, 5, 4), (2, 1, 3, 3), {"dilation": (2, 1), "stride": 2, "padding": 2, "output_padding": 1}),
    ((1, 4, 3, 3), (4, 2, 3, 3), {"groups": 2}),
    ((2, 6, 3, 3), (6, 1, 2, 2), {"groups": 3, "stride": 2}),
    ((1, 4, 3, 3), (4, 1, 3, 3), {"groups": 4, "padding": 1}),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,kw", CONVT, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CONVT])
def test_conv_transpose2d(xs, ws, kw, bias):
    cout = ws[1] * kw.get("groups", 1)
    shapes = [xs, ws] + ([(cout,)] if bias else [])
    check_op(shapes, lambda x, w, *b: F.conv_transpose2d(x, w, b[0] if b else None, **kw),
             lambda x, w, *b: x.conv_transpose2d(w, b[0] if b else None, **kw), atol=1e-5)


def test_conv_transpose1d_3d_python():
    check_op([(1, 2, 5), (2, 3, 3), (3,)], lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1),
             lambda x, w, b: x.conv_transpose2d(w, b, stride=2, padding=1), atol=1e-5)
    check_op([(1, 1, 2, 2, 2), (1, 1, 2, 2, 2)], lambda x, w: F.conv_transpose3d(x, w, stride=2),
             lambda x, w: x.conv_transpose2d(w, stride=2), atol=1e-5)
    check_op([(1, 1, 2, 2), (1, 2, 2, 2)], lambda x, w: F.conv_transpose2d(x, w, stride=2),
             lambda x, w: x.conv_transpose2d(w, stride=2), device="PYTHON", atol=1e-5)


# ----- pooling -----

AVG = [
    ((1, 1, 4, 4), {"kernel_size": 2}),
    ((2, 3, 6, 5), {"kernel_size": (3, 2)}),
    ((1, 2, 7, 7), {"kernel_size": 3, "stride": 2}),
    ((1, 2, 6, 6), {"kernel_size": 3, "stride": 1, "padding": 1}),
    ((1, 2, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    ((1, 2, 7, 5), {"kernel_size": 2, "ceil_mode": True}),
    ((1, 2, 7, 6), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    ((1, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((1, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False}),
    ((1, 1, 5, 8), {"kernel_size": (2, 4), "stride": (1, 3), "padding": (1, 2)}),
    ((3, 6, 6), {"kernel_size": 2}),                                       # unbatched
]


@pytest.mark.parametrize("xs,kw", AVG, ids=[f"{a[0]}-{a[1]}" for a in AVG])
def test_avg_pool2d(xs, kw):
    check_op([xs], lambda x: F.avg_pool2d(x, **kw), lambda x: x.avg_pool2d(**kw))


MAX = [
    ((1, 1, 4, 4), {"kernel_size": 2}),
    ((2, 3, 6, 5), {"kernel_size": (3, 2)}),
    ((1, 2, 7, 7), {"kernel_size": 3, "stride": 2}),
    ((1, 2, 6, 6), {"kernel_size": 3, "stride": 1, "padding": 1}),
    ((1, 2, 8, 8), {"kernel_size": 3, "stride": 2, "dilation": 2}),
    ((1, 2, 9, 8), {"kernel_size": 2, "stride": 2, "dilation": (2, 3), "padding": 1}),
    ((1, 2, 7, 5), {"kernel_size": 2, "ceil_mode": True}),
    ((1, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ((3, 5, 5), {"kernel_size": 2, "stride": 1}),
]


@pytest.mark.parametrize("xs,kw", MAX, ids=[f"{a[0]}-{a[1]}" for a in MAX])
def test_max_pool2d(xs, kw):
    check_op([xs], lambda x: F.max_pool2d(x, **kw), lambda x: x.max_pool2d(**kw))


@pytest.mark.parametrize("xs,kw", MAX, ids=[f"{a[0]}-{a[1]}" for a in MAX])
def test_max_pool2d_indices(xs, kw):
    check_op([xs], lambda x: F.max_pool2d(x, return_indices=True, **kw)[1],
             lambda x: x.max_pool2d(return_indices=True, **kw)[1], forward_only=True)


def test_max_pool2d_int_and_neg_inf_padding():
    v = np.random.default_rng(0).integers(-50, 50, (1, 1, 5, 5)).astype(np.int32)
    check_op(None, lambda x: F.max_pool2d(x.float(), 3, 2, 1).int(), lambda x: x.max_pool2d(3, 2, padding=1), vals=[v])
    # all-negative input: padding must not win
    check_op(None, lambda x: F.max_pool2d(x, 2, 2, 1), lambda x: x.max_pool2d(2, 2, padding=1),
             vals=[rand((1, 1, 4, 4), -5, -1)])


def test_pooling_python():
    check_op([(1, 1, 4, 4)], lambda x: F.max_pool2d(x, 2), lambda x: x.max_pool2d(2), device="PYTHON")
    check_op([(1, 1, 5, 5)], lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
             lambda x: x.avg_pool2d(3, 2, padding=1, count_include_pad=False), device="PYTHON")


UNPOOL = [((1, 2, 6, 6), {"kernel_size": 2}, None), ((2, 1, 7, 7), {"kernel_size": 3, "stride": 3}, (7, 7)),
          ((1, 1, 7, 7), {"kernel_size": 3, "stride": 2}, None),
          ((1, 1, 7, 7), {"kernel_size": 3, "stride": 2}, (7, 7)),
          ((2, 2, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1}, (6, 6))]


@pytest.mark.parametrize("xs,kw,osz", UNPOOL, ids=[f"{u[0]}-{u[1]}-{u[2]}" for u in UNPOOL])
def test_max_unpool2d(xs, kw, osz):
    x = rand(xs, seed=3)
    tv, ti = F.max_pool2d(torch.tensor(x), return_indices=True, **kw)
    fv, fi = Tensor(x).max_pool2d(return_indices=True, **kw)
    # overlapping windows can pick the same input twice (duplicate indices): values are still well-defined;
    # gradients are compared in test_max_unpool2d_grad
    check_op(None, lambda v: F.max_unpool2d(v, ti, output_size=osz, **kw),
             lambda v: v.max_unpool2d(fi, output_size=osz, **kw), vals=[tv.numpy()], forward_only=True)
    # the round trip through fusegrad's own pool output
    out = fv.max_unpool2d(fi, output_size=osz, **kw)
    np.testing.assert_allclose(out.numpy(), F.max_unpool2d(tv, ti, output_size=osz, **kw).numpy(), rtol=1e-6)


@pytest.mark.parametrize("xs,kw,osz", [UNPOOL[0], UNPOOL[1], UNPOOL[3]], ids=["k2", "k3s3", "k3s2_overlap"])
def test_max_unpool2d_grad(xs, kw, osz):
    # torch's backward is a gather from the output gradient at each index, so with duplicate indices (overlapping
    # windows, last case) every pooled element that points at a position receives that position's gradient
    x = rand(xs, seed=3)
    tv, ti = F.max_pool2d(torch.tensor(x), return_indices=True, **kw)
    fi = Tensor(x).max_pool2d(return_indices=True, **kw)[1]
    check_op(None, lambda v: F.max_unpool2d(v, ti, output_size=osz, **kw),
             lambda v: v.max_unpool2d(fi, output_size=osz, **kw), vals=[tv.numpy()])


# ----- attention -----

SDPA = [
    ((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6), {}),
    ((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), {"is_causal": True}),
    ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), {"is_causal": True}),                  # L != S
    ((4, 8), (6, 8), (6, 3), {}),                                                       # no batch
    ((1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"enable_gqa": True}),
    ((2, 6, 3, 4), (2, 2, 3, 4), (2, 2, 3, 4), {"enable_gqa": True, "is_causal": True}),
]


@pytest.mark.parametrize("qs,ks,vs,kw", SDPA, ids=[f"{s[0]}-{s[1]}-{s[2]}-{s[3]}" for s in SDPA])
def test_sdpa(qs, ks, vs, kw):
    check_op([qs, ks, vs], lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw),
             lambda q, k, v: q.scaled_dot_product_attention(k, v, **kw), atol=1e-5)


def test_sdpa_bool_mask():
    m = np.random.default_rng(0).random((4, 5)) < 0.7
    m[:, 0] = True                                             # every row keeps at least one key
    check_op([(2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8)],
             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(m)),
             lambda q, k, v: q.scaled_dot_product_attention(k, v, attn_mask=Tensor(m)), atol=1e-5)


def test_sdpa_float_mask():
    check_op([(2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8), (2, 1, 4, 5)],
             lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
             lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m), atol=1e-5)


def test_sdpa_python():
    check_op([(1, 2, 4), (1, 3, 4), (1, 3, 2)], lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True), device="PYTHON", atol=1e-5)


# ----- linear, layernorm, batchnorm, normalize, dropout -----

@pytest.mark.parametrize("xs,ins,outs", [((3, 4), 4, 5), ((2, 3, 4), 4, 2), ((4,), 4, 3)], ids=str)
@pytest.mark.parametrize("bias", [False, True])
def test_linear(xs, ins, outs, bias):
    # fusegrad's weight is (in, out) (x @ w); torch's is (out, in)
    shapes = [xs, (ins, outs)] + ([(outs,)] if bias else [])
    check_op(shapes, lambda x, w, *b: F.linear(x, w.T, b[0] if b else None),
             lambda x, w, *b: x.linear(w, b[0] if b else None), atol=1e-5)


def test_linear_1d_weight_and_python():
    check_op([(3, 4), (4,)], lambda x, w: x * w, lambda x, w: x.linear(w))
    check_op([(2, 3), (3, 2), (2,)], lambda x, w, b: F.linear(x, w.T, b), lambda x, w, b: x.linear(w, b),
             device="PYTHON", atol=1e-5)


@pytest.mark.parametrize("xs,axis,eps", [((3, 8), -1, 1e-5), ((2, 3, 6), -1, 1e-5), ((2, 3, 4), (-2, -1), 1e-5),
                                         ((4, 5), -1, 0.1), ((2, 1), -1, 1e-5)], ids=str)
def test_layernorm(xs, axis, eps):
    ns = xs[-1:] if isinstance(axis, int) else xs[-len(axis):]
    check_op([xs], lambda x: F.layer_norm(x, ns, eps=eps), lambda x: x.layernorm(axis, eps), atol=1e-5, grad_atol=1e-3)


def test_layernorm_python_constant_row():
    check_op([(2, 4)], lambda x: F.layer_norm(x, (4,)), lambda x: x.layernorm(), device="PYTHON", atol=1e-5)
    check_op(None, lambda x: F.layer_norm(x, (3,)), lambda x: x.layernorm(),
             vals=[np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]], np.float32)], atol=1e-5)


@pytest.mark.parametrize("with_affine", [True, False])
@pytest.mark.parametrize("xs", [(2, 3, 4, 4), (4, 3), (2, 3, 5)], ids=str)
def test_batchnorm(xs, with_affine):
    c = xs[1]
    shp = (1, c) + (1,) * (len(xs) - 2)

    def tf(x, mean, invstd, *wb):
        out = (x - mean.reshape(shp)) * invstd.reshape(shp)
        return out * wb[0].reshape(shp) + wb[1].reshape(shp) if wb else out

    def ff(x, mean, invstd, *wb):
        return x.batchnorm(wb[0] if wb else None, wb[1] if wb else None, mean, invstd)
    vals = [rand(xs, -2, 2, 1), rand((c,), -0.5, 0.5, 2), rand((c,), 0.5, 2, 3)]
    if with_affine: vals += [rand((c,), 0.5, 1.5, 4), rand((c,), -1, 1, 5)]
    check_op(None, tf, ff, vals=vals, atol=1e-5)


def test_batchnorm_matches_torch_eval():
    x, mean, var = rand((2, 3, 4, 4), seed=1), rand((3,), seed=2), rand((3,), 0.5, 2, seed=3)
    w, b = rand((3,), seed=4), rand((3,), seed=5)
    ref = F.batch_norm(torch.tensor(x), torch.tensor(mean), torch.tensor(var), torch.tensor(w), torch.tensor(b),
                       training=False, eps=1e-5)
    out = Tensor(x).batchnorm(Tensor(w), Tensor(b), Tensor(mean), (Tensor(var) + 1e-5).rsqrt())
    np.testing.assert_allclose(out.numpy(), ref.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 1), (2.0, 0), (3.0, -1), (2.0, 2)], ids=str)
def test_normalize(p, dim):
    check_op([(2, 3, 4)], lambda x: F.normalize(x, p, dim), lambda x: x.normalize(p, dim), atol=1e-5)


def test_normalize_zero_vector():
    check_op(None, lambda x: F.normalize(x, dim=1), lambda x: x.normalize(dim=1),
             vals=[np.array([[0.0, 0.0], [3.0, 4.0]], np.float32)], forward_only=True)


def test_dropout_eval_is_identity():
    x = Tensor(rand((4, 5)))
    assert not Tensor.training
    np.testing.assert_array_equal(x.dropout(0.5).numpy(), x.numpy())
    check_op([(3, 4)], lambda t: F.dropout(t, 0.3, training=False), lambda t: t.dropout(0.3))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_train(p):
    Tensor.manual_seed(1234)
    xv = rand((64, 64), 1, 2, seed=7)
    x = Tensor(xv, requires_grad=True)
    with Tensor.train():
        y = x.dropout(p)
        out = y.numpy()
        (y * 2).sum().backward()
    assert not Tensor.training
    kept = out != 0
    frac_dropped = 1 - kept.mean()
    assert abs(frac_dropped - p) < 0.03, f"dropped {frac_dropped}, expected about {p}"
    np.testing.assert_allclose(out[kept], xv[kept] / (1 - p), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, 2 / (1 - p), 0), rtol=1e-6)


def test_dropout_follows_the_training_flag():
    # Context(TRAINING=1) turns dropout on, as it does BatchNorm's batch statistics and the optimizers
    from fusegrad import Context
    x = Tensor.ones(4096)
    with Context(TRAINING=1):
        assert 0.4 < (x.dropout(0.5) == 0).float().mean().item() < 0.6
    assert (x.dropout(0.5) == 1).all().item()


def test_dropout_train_edges():
    x = Tensor(rand((3, 4), 1, 2))
    with Tensor.train():
        np.testing.assert_array_equal(x.dropout(0.0).numpy(), x.numpy())
        np.testing.assert_array_equal(x.dropout(1.0).numpy(), np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError):
        x.dropout(1.5)


# ----- losses -----

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(reduction):
    y = rand((4, 5), 0, 1, 9)
    check_op(None, lambda p: F.binary_cross_entropy(p, torch.tensor(y), reduction=reduction),
             lambda p: p.binary_crossentropy(Tensor(y), reduction=reduction), vals=[rand((4, 5), 0.05, 0.95, 1)],
             atol=1e-5)


def test_binary_crossentropy_clamps_log():
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.5], np.float32)
    y = np.array([0.0, 1.0, 1.0, 0.0, 1.0], np.float32)
    check_op(None, lambda a: F.binary_cross_entropy(a, torch.tensor(y), reduction="none"),
             lambda a: a.binary_crossentropy(Tensor(y), reduction="none"), vals=[p], forward_only=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("pos_weight", [None, "vec"])
def test_binary_crossentropy_logits(reduction, pos_weight):
    y = (np.random.default_rng(3).random((4, 5)) < 0.5).astype(np.float32)
    pw = rand((5,), 0.5, 3, 4) if pos_weight else None
    check_op(None, lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor(y), reduction=reduction,
                                                                pos_weight=None if pw is None else torch.tensor(pw)),
             lambda x: x.binary_crossentropy_logits(Tensor(y), reduction=reduction,
                                                    pos_weight=None if pw is None else Tensor(pw)),
             vals=[rand((4, 5), -4, 4, 2)], atol=1e-5)


def test_binary_crossentropy_logits_extreme():
    x = np.array([-100.0, 100.0, -30.0, 30.0, 0.0], np.float32)
    y = np.array([1.0, 0.0, 0.0, 1.0, 0.5], np.float32)
    check_op(None, lambda a: F.binary_cross_entropy_with_logits(a, torch.tensor(y), reduction="none"),
             lambda a: a.binary_crossentropy_logits(Tensor(y), reduction="none"), vals=[x], atol=1e-5)


SCE = [(-100, 0.0, "mean"), (-100, 0.0, "sum"), (-100, 0.0, "none"), (2, 0.0, "mean"), (-1, 0.1, "mean"),
       (1, 0.2, "sum"), (3, 0.3, "none")]


@pytest.mark.parametrize("ignore_index,ls,reduction", SCE, ids=str)
def test_sparse_categorical_crossentropy(ignore_index, ls, reduction):
    y = np.array([0, 2, 1, 3, 2, 1])
    if ignore_index == -1: y[1] = -1
    check_op([(6, 4)], lambda x: F.cross_entropy(x, L(y), ignore_index=ignore_index, label_smoothing=ls,
                                                 reduction=reduction),
             lambda x: x.sparse_categorical_crossentropy(I(y), ignore_index=ignore_index, label_smoothing=ls,
                                                         reduction=reduction), atol=1e-5)


def test_sparse_categorical_crossentropy_3d_and_python():
    y = np.array([[0, 2, 1], [1, 1, 0]])
    check_op([(2, 3, 4)], lambda x: F.cross_entropy(x.permute(0, 2, 1), L(y)),
             lambda x: x.sparse_categorical_crossentropy(I(y)), atol=1e-5)
    check_op([(3, 3)], lambda x: F.cross_entropy(x, L([0, 2, 1])),
             lambda x: x.sparse_categorical_crossentropy(I([0, 2, 1], "PYTHON")), device="PYTHON", atol=1e-5)


CE_IDX = [((5, 4), "mean", 0.0), ((5, 4), "sum", 0.1), ((5, 4), "none", 0.0), ((2, 4, 3), "mean", 0.0),
          ((2, 4, 3, 2), "none", 0.2), ((4,), "mean", 0.0), ((4,), "none", 0.1)]


@pytest.mark.parametrize("xs,reduction,ls", CE_IDX, ids=str)
def test_cross_entropy_indices(xs, reduction, ls):
    ys = (xs[0],) + xs[2:] if len(xs) > 1 else ()
    y = np.random.default_rng(5).integers(0, xs[1] if len(xs) > 1 else xs[0], ys)
    check_op([xs], lambda x: F.cross_entropy(x, L(y), reduction=reduction, label_smoothing=ls),
             lambda x: x.cross_entropy(I(y), reduction=reduction, label_smoothing=ls), atol=1e-5)


def test_cross_entropy_ignore_default():
    y = np.array([0, -100, 2, 1])
    check_op([(4, 3)], lambda x: F.cross_entropy(x, L(y)), lambda x: x.cross_entropy(I(y)), atol=1e-5)


@pytest.mark.parametrize("xs,reduction,ls", [((5, 4), "mean", 0.0), ((5, 4), "sum", 0.1), ((2, 4, 3), "none", 0.0),
                                             ((4,), "mean", 0.2)], ids=str)
def test_cross_entropy_probabilities(xs, reduction, ls):
    p = torch.softmax(torch.tensor(rand(xs, -2, 2, 8)), 1 if len(xs) > 1 else 0).numpy()
    check_op([xs], lambda x: F.cross_entropy(x, torch.tensor(p), reduction=reduction, label_smoothing=ls),
             lambda x: x.cross_entropy(Tensor(p), reduction=reduction, label_smoothing=ls), atol=1e-5)


NLL = [(None, None, "mean"), (None, None, "sum"), (None, None, "none"), ("w", None, "mean"), ("w", None, "sum"),
       (None, 1, "mean"), ("w", 2, "mean"), ("w", 0, "none")]


@pytest.mark.parametrize("weight,ignore_index,reduction", NLL, ids=str)
def test_nll_loss(weight, ignore_index, reduction):
    y = np.array([0, 2, 1, 3, 2, 1])
    w = rand((4,), 0.5, 2, 6) if weight else None
    tkw = {"weight": None if w is None else torch.tensor(w), "reduction": reduction}
    if ignore_index is not None: tkw["ignore_index"] = ignore_index
    check_op([(6, 4)], lambda x: F.nll_loss(torch.log_softmax(x, 1), L(y), **tkw),
             lambda x: x.log_softmax(1).nll_loss(I(y), weight=None if w is None else Tensor(w),
                                                 ignore_index=ignore_index, reduction=reduction), atol=1e-5)


def test_nll_loss_1d_and_spatial():
    check_op([(4,)], lambda x: F.nll_loss(x, torch.tensor(2)), lambda x: x.nll_loss(Tensor(2)))
    y = np.array([[0, 2, 1], [1, 1, 0]])
    check_op([(2, 3, 3)], lambda x: F.nll_loss(x, L(y)), lambda x: x.nll_loss(I(y)))


# ----- einsum -----

EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ii->", [(4, 4)]),
    ("ii->i", [(4, 4)]), ("i,j->ij", [(3,), (4,)]), ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]),
    ("ij,ij->ij", [(3, 4)] * 2),
    ("i,i->", [(5,), (5,)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]), ("...ij->...ji", [(2, 2, 3, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ij,jk", [(3, 4), (4, 5)]), ("ba", [(3, 4)]), ("iij->ij", [(3, 3, 2)]), ("i...->...", [(3, 2, 4)]),
    ("bi,i->b", [(3, 4), (4,)]),
]


@pytest.mark.parametrize("formula,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(formula, shapes):
    check_op(shapes, lambda *ts: torch.einsum(formula, *ts), lambda *ts: Tensor.einsum(formula, *ts), atol=1e-5)


def test_einsum_list_python_and_broadcast():
    check_op([(2, 3), (3, 2)], lambda a, b: torch.einsum("ij,jk->ik", [a, b]),
             lambda a, b: Tensor.einsum("ij,jk->ik", [a, b]), device="PYTHON", atol=1e-5)
    check_op([(1, 3, 4), (2, 4, 5)], lambda a, b: torch.einsum("bij,bjk->bik", a, b),
             lambda a, b: Tensor.einsum("bij,bjk->bik", a, b), atol=1e-5)
    with pytest.raises(ValueError):
        Tensor.einsum("ij,jk->ik", Tensor.zeros(2, 3))


# ----- interpolate -----

INTERP = [
    ((1, 2, 4, 5), (8, 10), "linear", False), ((1, 2, 4, 5), (8, 10), "linear", True),
    ((1, 1, 6, 6), (3, 4), "linear", False), ((1, 1, 6, 6), (3, 4), "linear", True),
    ((2, 3, 5), (9,), "linear", False), ((2, 3, 5), (9,), "linear", True), ((2, 3, 5), (1,), "linear", True),
    ((1, 1, 3, 2, 4), (5, 3, 6), "linear", False),
    ((1, 2, 4, 5), (7, 3), "nearest", False), ((1, 2, 3, 3), (6, 9), "nearest", False),
    ((2, 3, 7), (4,), "nearest", False),
    ((1, 2, 4, 5), (7, 3), "nearest-exact", False), ((1, 2, 5, 3), (3, 8), "nearest-exact", False),
]
TORCH_MODE = {3: "linear", 4: "bilinear", 5: "trilinear"}


@pytest.mark.parametrize("xs,size,mode,ac", INTERP, ids=str)
def test_interpolate(xs, size, mode, ac):
    tmode = TORCH_MODE[len(xs)] if mode == "linear" else mode
    tkw = {"align_corners": ac} if mode == "linear" else {}
    check_op([xs], lambda x: F.interpolate(x, size=size, mode=tmode, **tkw),
             lambda x: x.interpolate(size, mode=mode, align_corners=ac), atol=1e-5)


def test_interpolate_python_and_error():
    check_op([(1, 1, 2, 3)], lambda x: F.interpolate(x, size=(4, 4), mode="bilinear", align_corners=False),
             lambda x: x.interpolate((4, 4)), device="PYTHON", atol=1e-5)
    with pytest.raises(ValueError):
        Tensor.zeros(1, 1, 2, 2).interpolate((3, 3), mode="cubic")


# ----- qr -----

@pytest.mark.parametrize("shape", [(3, 3), (4, 3), (3, 5), (2, 3, 3), (1, 1), (5, 2)], ids=str)
def test_qr(shape):
    a = rand(shape, -2, 2, 11)
    q, r = Tensor(a).qr()
    m = shape[-2]
    assert q.shape == shape[:-2] + (m, m) and r.shape == shape
    qn, rn = q.numpy(), r.numpy()
    np.testing.assert_allclose(qn @ rn, a, atol=1e-5)
    np.testing.assert_allclose(np.swapaxes(qn, -1, -2) @ qn, np.broadcast_to(np.eye(m), qn.shape), atol=1e-5)
    np.testing.assert_allclose(np.tril(rn, -1), 0, atol=1e-5)
    # complete QR is unique up to the signs of R's rows (for the full-rank leading block): compare magnitudes
    tr = torch.linalg.qr(torch.tensor(a), mode="complete").R.numpy()
    k = min(shape[-2], shape[-1])
    np.testing.assert_allclose(np.abs(rn[..., :k, :]), np.abs(tr[..., :k, :]), atol=1e-4)


def test_qr_rank_deficient_python():
    a = np.array([[1.0, 2.0], [2.0, 4.0], [0.0, 0.0]], np.float32)
    q, r = Tensor(a).qr()
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-5)
    np.testing.assert_allclose(q.numpy().T @ q.numpy(), np.eye(3), atol=1e-5)
    b = rand((2, 2), seed=1)
    q, r = Tensor(b, device="PYTHON").qr()
    np.testing.assert_allclose(q.numpy() @ r.numpy(), b, atol=1e-5)


# ----- edge cases: empty batch, non-contiguous inputs, NaN propagation -----

def test_conv_and_pool_empty_batch():
    check_op([(0, 2, 5, 5), (3, 2, 3, 3)], lambda x, w: F.conv2d(x, w, padding=1), lambda x, w: x.conv2d(w, padding=1))
    check_op([(0, 2, 4, 4)], lambda x: F.max_pool2d(x, 2), lambda x: x.max_pool2d(2))
    check_op([(0, 2, 4, 4)], lambda x: F.avg_pool2d(x, 2), lambda x: x.avg_pool2d(2))


def test_pool_noncontiguous_input():
    check_op([(1, 5, 6, 2)], lambda x: F.max_pool2d(x.permute(0, 3, 1, 2).flip(2), 2),
             lambda x: x.permute(0, 3, 1, 2).flip(2).max_pool2d(2))
    check_op([(1, 5, 6, 2)], lambda x: F.avg_pool2d(x.permute(0, 3, 2, 1), 3, 1, 1),
             lambda x: x.permute(0, 3, 2, 1).avg_pool2d(3, 1, padding=1))


def test_nan_propagates_through_conv_pool_softmax_losses():
    x = rand((1, 1, 4, 4), seed=2)
    x[0, 0, 1, 1] = np.nan
    check_op(None, lambda t: F.max_pool2d(t, 2), lambda t: t.max_pool2d(2), vals=[x], forward_only=True)
    check_op(None, lambda t: F.avg_pool2d(t, 2), lambda t: t.avg_pool2d(2), vals=[x], forward_only=True)
    w = rand((1, 1, 2, 2), seed=3)
    check_op(None, lambda t: F.conv2d(t, torch.tensor(w)), lambda t: t.conv2d(Tensor(w)), vals=[x], forward_only=True)
    logits = np.array([[1.0, np.nan, 0.0], [1.0, 2.0, 3.0]], np.float32)
    check_op(None, lambda t: F.cross_entropy(t, L([0, 1]), reduction="none"),
             lambda t: t.cross_entropy(I([0, 1]), reduction="none"), vals=[logits], forward_only=True)


def test_einsum_empty():
    check_op([(0, 3), (3, 4)], lambda a, b: torch.einsum("ij,jk->ik", a, b),
             lambda a, b: Tensor.einsum("ij,jk->ik", a, b))
    check_op([(3, 0), (0, 4)], lambda a, b: torch.einsum("ij,jk->ik", a, b),
             lambda a, b: Tensor.einsum("ij,jk->ik", a, b))


def test_layernorm_noncontiguous():
    check_op([(5, 3)], lambda x: F.layer_norm(x.T.flip(1), (5,)), lambda x: x.T.flip(1).layernorm(), atol=1e-5,
             grad_atol=1e-3)
