"""nn layers against torch.nn: same state-dict names and shapes, same outputs, same input and parameter gradients."""
import math

import numpy as np
import pytest
import torch

from fusegrad import Context, Tensor, dtypes, nn
from fusegrad.nn.state import get_state_dict

from .helpers import compare_layer, copy_to_torch, rand


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    compare_layer(nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias), rand(4, 5))


def test_linear_batched_input():
    compare_layer(nn.Linear(6, 2), torch.nn.Linear(6, 2), rand(2, 3, 6, seed=1))


@pytest.mark.parametrize("kw", [{"stride": 2, "padding": 1, "groups": 2}, {"padding": "same", "dilation": 2},
                                {"padding": (1, 0), "bias": False}, {"kernel_size": (2, 3), "stride": (1, 2)}])
def test_conv2d(kw):
    kw = {"kernel_size": 3, **kw}
    compare_layer(nn.Conv2d(4, 6, **kw), torch.nn.Conv2d(4, 6, **kw), rand(2, 4, 7, 8, seed=2), atol=1e-4)


def test_conv1d():
    compare_layer(nn.Conv1d(3, 4, 3, padding=1, stride=2), torch.nn.Conv1d(3, 4, 3, padding=1, stride=2),
                  rand(2, 3, 9, seed=3), atol=1e-4)


def test_conv_transpose2d():
    kw = {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}
    compare_layer(nn.ConvTranspose2d(4, 6, 3, **kw), torch.nn.ConvTranspose2d(4, 6, 3, **kw), rand(2, 4, 5, 4, seed=4),
                  atol=1e-4)


def test_conv_transpose1d():
    compare_layer(nn.ConvTranspose1d(3, 2, 4, stride=2), torch.nn.ConvTranspose1d(3, 2, 4, stride=2),
                  rand(2, 3, 6, seed=5), atol=1e-4)


def test_conv_init_matches_spec():
    conv = nn.Conv2d(8, 16, 3)
    w = conv.weight.numpy()
    bound = 1 / math.sqrt(8 * 9)
    assert w.shape == (16, 8, 3, 3) and conv.bias.shape == (16,)
    assert np.abs(w).max() <= bound and np.abs(conv.bias.numpy()).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.15 * bound   # uniform(-b, b) has std b/sqrt(3)
    assert nn.ConvTranspose2d(8, 4, 3, groups=2).weight.shape == (8, 2, 3, 3)


def test_linear_init_matches_torch_distribution():
    lin = nn.Linear(64, 32)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    bound = 1 / 8
    assert w.shape == (32, 64) and b.shape == (32,)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound
    assert lin.weight.is_param and lin.weight.requires_grad


def test_params_have_separate_gradients():
    """Two layers initialised to the same constants must not share a graph node (and so a gradient)."""
    a, b = nn.LayerNorm(3), nn.LayerNorm(3)
    x = Tensor(rand(2, 3))
    (a(x).sum() * 2 + (b(x) * Tensor([[1.0, 2.0, 3.0]])).sum()).backward()
    np.testing.assert_allclose(a.bias.grad.numpy(), [4.0, 4.0, 4.0])
    np.testing.assert_allclose(b.bias.grad.numpy(), [2.0, 4.0, 6.0])


# ---------------------------------------------------------------------------------------------------------------------
# normalization

def test_batchnorm_eval_uses_running_stats():
    bn, tbn = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    bn.running_mean.assign(Tensor([0.5, -1.0, 2.0]))
    bn.running_var.assign(Tensor([2.0, 0.5, 1.5]))
    bn.weight.assign(Tensor([1.5, -0.5, 2.0]))
    bn.bias.assign(Tensor([0.1, 0.2, 0.3]))
    tbn.eval()
    compare_layer(bn, tbn, rand(4, 3, 5, 5, seed=6))


@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 6), (4, 3, 5, 5), (2, 3, 3, 4, 2)])
def test_batchnorm_training_matches_torch(shape):
    bn, tbn = nn.BatchNorm(3, momentum=0.2), torch.nn.BatchNorm3d(3, momentum=0.2)
    copy_to_torch(bn, tbn)
    tbn.train()
    with Tensor.train():
        for step in range(3):
            x = rand(*shape, seed=10 + step, low=-2, high=3)
            xt, xf = torch.tensor(x, requires_grad=True), Tensor(x, requires_grad=True)
            out_t = tbn(xt) if len(shape) == 5 else torch.nn.functional.batch_norm(
                xt, tbn.running_mean, tbn.running_var, tbn.weight, tbn.bias, True, 0.2, tbn.eps)
            if len(shape) != 5: tbn.num_batches_tracked += 1
            out_f = bn(xf)
            np.testing.assert_allclose(out_f.numpy(), out_t.detach().numpy(), atol=1e-5, rtol=1e-4)
            g = rand(*shape, seed=20 + step)
            (out_t * torch.from_numpy(g)).sum().backward()
            (out_f * Tensor(g)).sum().backward()
            np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), atol=1e-4, rtol=1e-4)
            np.testing.assert_allclose(bn.running_mean.numpy(), tbn.running_mean.numpy(), atol=1e-6, rtol=1e-5)
            np.testing.assert_allclose(bn.running_var.numpy(), tbn.running_var.numpy(), atol=1e-6, rtol=1e-5)
            assert bn.num_batches_tracked.item() == tbn.num_batches_tracked.item() == step + 1
        np.testing.assert_allclose(bn.weight.grad.numpy(), tbn.weight.grad.numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(bn.bias.grad.numpy(), tbn.bias.grad.numpy(), atol=1e-4, rtol=1e-4)
    # after training, eval mode normalizes with the running statistics
    tbn.eval()
    x = rand(*shape, seed=99)
    expect = torch.nn.functional.batch_norm(torch.tensor(x), tbn.running_mean, tbn.running_var, tbn.weight, tbn.bias,
                                            False, 0.0, tbn.eps).detach().numpy()
    np.testing.assert_allclose(bn(Tensor(x)).numpy(), expect, atol=1e-5, rtol=1e-4)


def test_batchnorm_training_flag_spellings():
    """Running stats move under Context(TRAINING=1) and Tensor.training, and not in eval mode."""
    x = Tensor(rand(4, 2, 3, seed=7) + 1)
    bn = nn.BatchNorm(2)
    bn(x).realize()
    assert bn.num_batches_tracked.item() == 0 and bn.running_mean.tolist() == [0.0, 0.0]
    with Context(TRAINING=1): bn(x).realize()
    assert bn.num_batches_tracked.item() == 1
    Tensor.training = True
    try:
        bn(x).realize()
    finally:
        Tensor.training = False
    assert bn.num_batches_tracked.item() == 2
    expect = x.numpy().mean(axis=(0, 2)) * (1 - 0.9 ** 2)
    np.testing.assert_allclose(bn.running_mean.numpy(), expect, rtol=1e-5)


def test_batchnorm_state_dict_layout():
    assert {k: v.shape for k, v in get_state_dict(nn.BatchNorm2d(5)).items()} == \
        {k: tuple(v.shape) for k, v in torch.nn.BatchNorm2d(5).state_dict().items()}
    bn = nn.BatchNorm(5)
    assert bn.num_batches_tracked.dtype == dtypes.int64 and bn.running_var.requires_grad is False
    assert not bn.running_mean.is_param and bn.weight.is_param


def test_batchnorm_without_running_stats_or_affine():
    bn, tbn = nn.BatchNorm(3, affine=False, track_running_stats=False), \
        torch.nn.BatchNorm1d(3, affine=False, track_running_stats=False)
    assert get_state_dict(bn) == {}
    tbn.eval()  # without running stats torch normalizes with batch statistics even in eval mode
    compare_layer(bn, tbn, rand(6, 3, seed=8))


def test_groupnorm():
    gn, tgn = nn.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6)
    gn.weight.assign(Tensor(rand(6, seed=1)))
    gn.bias.assign(Tensor(rand(6, seed=2)))
    compare_layer(gn, tgn, rand(3, 6, 4, 5, seed=9))


def test_instancenorm():
    inn, tinn = nn.InstanceNorm(4), torch.nn.InstanceNorm2d(4, affine=True)
    inn.weight.assign(Tensor(rand(4, seed=3)))
    compare_layer(inn, tinn, rand(2, 4, 5, 6, seed=10))


@pytest.mark.parametrize("shape", [8, (4, 5)])
def test_layernorm(shape):
    ln, tln = nn.LayerNorm(shape), torch.nn.LayerNorm(shape)
    ln.weight.assign(Tensor(rand(*ln.normalized_shape, seed=4)))
    ln.bias.assign(Tensor(rand(*ln.normalized_shape, seed=5)))
    x = rand(3, *ln.normalized_shape, seed=11)
    compare_layer(ln, tln, x)


def test_layernorm_no_affine():
    ln = nn.LayerNorm(6, elementwise_affine=False)
    assert get_state_dict(ln) == {}
    x = rand(2, 6, seed=12)
    expect = torch.nn.functional.layer_norm(torch.tensor(x), (6,)).numpy()
    np.testing.assert_allclose(ln(Tensor(x)).numpy(), expect, atol=1e-5)


def test_layernorm2d():
    ln, tln = nn.LayerNorm2d(4), torch.nn.LayerNorm(4)
    ln.weight.assign(Tensor(rand(4, seed=6)))
    compare_layer(ln, tln, rand(2, 4, 3, 5, seed=13),
                  torch_call=lambda m, x: m(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))


def test_rmsnorm():
    rms, trms = nn.RMSNorm(8), torch.nn.RMSNorm(8, eps=1e-6)
    rms.weight.assign(Tensor(rand(8, seed=7)))
    compare_layer(rms, trms, rand(2, 3, 8, seed=14))


# ---------------------------------------------------------------------------------------------------------------------
# embedding and LSTM

def test_embedding():
    emb, temb = nn.Embedding(10, 4), torch.nn.Embedding(10, 4)
    assert emb.weight.shape == (10, 4)
    bound = math.sqrt(6 / (10 + 4))   # glorot uniform
    assert np.abs(emb.weight.numpy()).max() <= bound
    idx = np.array([[0, 3, 3], [9, 1, 0]], dtype=np.int32)
    copy_to_torch(emb, temb)
    compare_layer(emb, temb, idx, input_grad=False, torch_call=lambda m, x: m(x.long()))


def test_lstm_cell():
    cell, tcell = nn.LSTMCell(5, 7), torch.nn.LSTMCell(5, 7)
    bound = 1 / math.sqrt(7)
    assert np.abs(cell.weight_hh.numpy()).max() <= bound
    h0, c0 = rand(3, 7, seed=1), rand(3, 7, seed=2)

    def run_fg(layer, x):
        h, c = layer(x, (Tensor(h0), Tensor(c0)))
        return layer(x, (h, c))          # a second step feeding the state back

    def run_torch(m, x):
        h, c = m(x, (torch.tensor(h0), torch.tensor(c0)))
        return m(x, (h, c))
    compare_layer(cell, tcell, rand(3, 5, seed=15), fg_call=run_fg, torch_call=run_torch)


def test_lstm_cell_default_state_and_no_bias():
    cell, tcell = nn.LSTMCell(4, 3, bias=False), torch.nn.LSTMCell(4, 3, bias=False)
    assert cell.bias_ih is None and cell.bias_hh is None
    compare_layer(cell, tcell, rand(2, 4, seed=16), fg_call=lambda m, x: m(x), torch_call=lambda m, x: m(x))


def test_nn_namespace():
    import fusegrad.nn as nn2
    assert nn2.optim.SGD and nn2.state.safe_load and nn2.datasets.mnist
    assert nn.BatchNorm2d is nn.BatchNorm and nn.BatchNorm3d is nn.BatchNorm
    with pytest.raises(ValueError, match="strided"): nn.Conv2d(2, 2, 3, stride=2, padding="same")


def test_conv_batchnorm_maxpool_gradients_match_torch():
    """BatchNorm's output (a multiply-add) feeds max_pool2d: max's gradient compares the input with the max, and
    a recomputation that rounds differently (reduce kernels contract a*b+c into an FMA, elementwise ones don't) found
    no maximal element in some windows, a 0/0 NaN gradient. The pool's input is stored first; gradients match torch."""
    x = rand(16, 1, 28, 28, seed=31)
    c1, c2, bn = nn.Conv2d(1, 32, 5), nn.Conv2d(32, 32, 5), nn.BatchNorm(32)
    t1, t2, tbn = torch.nn.Conv2d(1, 32, 5), torch.nn.Conv2d(32, 32, 5), torch.nn.BatchNorm2d(32)
    for a, b in ((c1, t1), (c2, t2)):
        with torch.no_grad():
            b.weight.copy_(torch.from_numpy(a.weight.numpy()))
            b.bias.copy_(torch.from_numpy(a.bias.numpy()))
    with Tensor.train():
        out = bn(c2(c1(Tensor(x)).relu()).relu()).max_pool2d()
        (out * 0.5).sum().backward()
    tout = torch.nn.functional.max_pool2d(tbn(t2(t1(torch.from_numpy(x)).relu()).relu()), 2)
    (tout * 0.5).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), atol=1e-4, rtol=1e-4)
    for p, tp in ((c1.weight, t1.weight), (c2.bias, t2.bias), (bn.weight, tbn.weight), (bn.bias, tbn.bias)):
        g = p.grad.numpy()
        assert np.isfinite(g).all(), f"non-finite gradient entries: {np.count_nonzero(~np.isfinite(g))}"
        ref = tp.grad.numpy()   # float32 sums over 16x24x24 terms in another order: error relative to the scale
        np.testing.assert_allclose(g, ref, atol=1e-4 * float(np.abs(ref).max()), rtol=2e-3)
