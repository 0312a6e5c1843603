"""float16 training: reduces accumulate in float32 (a bias's gradient, the sum over the batch, included), and a small
conv + BatchNorm + Linear net trained in half follows PyTorch's float32 training of the same net from the same start."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes, nn
from fusegrad.nn.state import get_state_dict

HALF_ULP = 2.0 ** -10   # float16's relative spacing: results rounded once differ from torch's by at most this


def test_broadcast_gradient_sums_in_float32():
    """A bias's gradient is the sum of the output gradient over the batch (the adjoint of the broadcast). Summed in
    float16, the running sum stops growing once its spacing passes the terms (2048 for terms below 1): 8192 rows of
    [0, 1) summed to 2048 where torch, summing in float32 and rounding once, gives ~4100."""
    w = np.random.default_rng(0).uniform(0, 1, (8192, 64)).astype(np.float16)
    b = Tensor.zeros(64, dtype=dtypes.half, requires_grad=True)
    (Tensor(w) * 1.0 + b).sum().backward()
    tb = torch.zeros(64, dtype=torch.half, requires_grad=True)
    (torch.tensor(w) * 1.0 + tb).sum().backward()
    assert b.grad is not None and b.grad.dtype == dtypes.half
    np.testing.assert_allclose(b.grad.numpy().astype(np.float32), tb.grad.numpy().astype(np.float32), rtol=HALF_ULP)


def test_broadcast_gradient_partial_sums_do_not_overflow():
    """Partial sums past float16's largest value (65504) must not turn a finite gradient into inf: +-40000 terms whose
    sum is 0 (torch: 0)."""
    g = np.tile(np.repeat(np.array([[4e4], [-4e4]], np.float16), 32, axis=0), (1, 16))   # 32 rows of each
    x = Tensor.zeros(1, 16, dtype=dtypes.half, requires_grad=True)
    (x.expand(64, 16) * Tensor(g)).sum().backward()
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), np.zeros((1, 16), np.float16))


@pytest.mark.parametrize("dt", [dtypes.half, dtypes.bfloat16])
def test_gradient_of_expand_matches_torch(dt):
    """The adjoint of expand over several axes, in 16-bit floats, against torch (which sums in float32)."""
    rng = np.random.default_rng(1)
    g = rng.uniform(-1, 1, (32, 3, 40, 40)).astype(np.float32)
    tdt = torch.half if dt == dtypes.half else torch.bfloat16
    x = Tensor.zeros(1, 3, 1, 1, dtype=dt, requires_grad=True)
    (x.expand(32, 3, 40, 40) * Tensor(g).cast(dt)).sum().backward()
    tx = torch.zeros(1, 3, 1, 1, dtype=tdt, requires_grad=True)
    (tx.expand(32, 3, 40, 40) * torch.tensor(g).to(tdt)).sum().backward()
    assert x.grad is not None
    ulp = HALF_ULP if dt == dtypes.half else 2.0 ** -7
    np.testing.assert_allclose(x.grad.float().numpy(), tx.grad.float().numpy(), rtol=ulp, atol=1e-3)


class HalfNet:
    """conv (with bias) -> quick GELU -> BatchNorm -> max pool -> linear (with bias), in the default float."""

    def __init__(self):
        Tensor.manual_seed(7)
        self.conv, self.bn, self.lin = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm(8), nn.Linear(8 * 8 * 8, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.lin(self.bn(self.conv(x).quick_gelu()).max_pool2d().flatten(1))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.lin = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), \
            torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.lin(torch.nn.functional.max_pool2d(self.bn(y * torch.sigmoid(1.702 * y)), 2).flatten(1))


def _torch_run(state: dict, dt: torch.dtype, xs: np.ndarray, ys: np.ndarray) -> tuple[list[float], dict]:
    net = TorchNet()
    net.load_state_dict({k: torch.from_numpy(v).float() if v.dtype.kind == "f" else torch.from_numpy(v).long()
                         for k, v in state.items()})
    net = net.to(dt)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9, nesterov=True, weight_decay=1e-3)
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.tensor(x).to(dt)), torch.tensor(y).long())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.float().numpy() for k, v in net.state_dict().items()}


LR = 0.02


def test_half_conv_net_trains_like_torch():
    """Six SGD steps (momentum, nesterov, weight decay) of a conv + BatchNorm + Linear net in float16, batch 32 at
    16x16 (8192 terms in each conv-bias gradient), against torch training the same net from the same float16 weights
    on the same float16 data in float16 and in float32: every loss finite and within 1% of torch's float16 losses, and
    each weight no further from torch's float32 result than torch's float16 one is (twice that, plus 1e-3 of the
    weight's magnitude). With float16 sums, the conv bias drifted 10x further than torch's."""
    steps, rng = 6, np.random.default_rng(3)
    xs = rng.normal(0, 1, (steps, 32, 3, 16, 16)).astype(np.float16)
    ys = rng.integers(0, 10, (steps, 32)).astype(np.int32)
    old = dtypes.default_float
    dtypes.default_float = dtypes.half
    try:
        net = HalfNet()
        params = nn.state.get_parameters(net)
        assert all(p.dtype == dtypes.half for p in params if dtypes.is_float(p.dtype))
        start = {k: v.numpy() for k, v in get_state_dict(net).items()}
        opt = nn.optim.SGD(params, lr=LR, momentum=0.9, nesterov=True, weight_decay=1e-3)
        ours = []
        with Tensor.train():
            for x, y in zip(xs, ys):
                loss = net(Tensor(x)).cross_entropy(Tensor(y))
                opt.zero_grad()
                loss.backward()
                opt.step()
                ours.append(loss.float().item())
    finally:
        dtypes.default_float = old
    half_losses, half_state = _torch_run(start, torch.half, xs, ys)
    _, ref_state = _torch_run(start, torch.float32, xs, ys)
    assert np.isfinite(ours).all(), ours
    np.testing.assert_allclose(ours, half_losses, rtol=1e-2)
    for k, v in get_state_dict(net).items():
        ref, torch_err = ref_state[k], np.abs(half_state[k] - ref_state[k]).max()
        err = np.abs(v.float().numpy() - ref).max()
        assert err <= 2 * torch_err + 1e-3 * np.abs(ref).max(), f"{k}: {err} from float32, torch's float16 {torch_err}"


def test_half_batchnorm_many_elements_per_channel():
    """BatchNorm over 65536 float16 elements per channel (64 x 32 x 32): the closed-form gradient's n * g passed
    float16's largest value and the input gradient came out NaN. Output and gradients against torch in float32 (which
    is what torch computes half BatchNorm in), within float16 rounding."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (64, 4, 32, 32)).astype(np.float16)
    g = rng.uniform(-1, 1, x.shape).astype(np.float16)
    old = dtypes.default_float
    dtypes.default_float = dtypes.half
    try:
        bn, xt = nn.BatchNorm(4), Tensor(x, requires_grad=True)
        with Tensor.train():
            out = bn(xt)
            (out * Tensor(g)).sum().backward()
    finally:
        dtypes.default_float = old
    tbn, tx = torch.nn.BatchNorm2d(4), torch.tensor(x).float().requires_grad_()
    tout = tbn(tx)
    (tout * torch.tensor(g).float()).sum().backward()
    assert out.dtype == dtypes.half and xt.grad is not None and xt.grad.dtype == dtypes.half
    np.testing.assert_allclose(out.numpy().astype(np.float32), tout.detach().numpy(), rtol=HALF_ULP, atol=HALF_ULP)
    np.testing.assert_allclose(xt.grad.numpy().astype(np.float32), tx.grad.numpy(), rtol=2 * HALF_ULP, atol=1e-3)
    for ours, theirs in ((bn.weight, tbn.weight), (bn.bias, tbn.bias)):
        assert ours.grad is not None
        np.testing.assert_allclose(ours.grad.numpy().astype(np.float32), theirs.grad.numpy(), rtol=HALF_ULP)
    np.testing.assert_allclose(bn.running_var.numpy().astype(np.float32), tbn.running_var.numpy(), rtol=HALF_ULP)


def test_half_conv2d_rounds_once():
    """A float16 convolution multiplies in float32 and sums in float32, then rounds once (torch's CPU half conv and a
    GEMM do the same): nearly every output and weight-gradient element is the float64 result rounded to float16
    (the rest within float32 summation error). Products rounded to half first left 42% of the outputs off."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (8, 32, 16, 16)).astype(np.float16)
    w = rng.normal(0, 0.2, (64, 32, 3, 3)).astype(np.float16)
    g = rng.normal(0, 1, (8, 64, 16, 16)).astype(np.float16)
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = xt.conv2d(wt, padding=1)
    (out * Tensor(g)).sum().backward()
    tx, tw = torch.tensor(x).double().requires_grad_(), torch.tensor(w).double().requires_grad_()
    ref = torch.nn.functional.conv2d(tx, tw, padding=1)
    (ref * torch.tensor(g).double()).sum().backward()
    assert out.dtype == dtypes.half and wt.grad is not None and xt.grad is not None
    for name, ours, theirs in (("output", out, ref.detach()), ("weight grad", wt.grad, tw.grad),
                               ("input grad", xt.grad, tx.grad)):
        exact = ours.numpy() == theirs.numpy().astype(np.float16)
        assert exact.mean() > 0.99, f"{name}: only {exact.mean():.3f} of the elements rounded once"


@pytest.mark.parametrize("name", ["elu", "celu", "selu"])
@pytest.mark.parametrize("dt", [dtypes.half, dtypes.float32])
def test_exp_activations_have_finite_gradients(name, dt):
    """elu/celu/selu evaluated exp(x) for every x and masked it: past x = 11 in float16 (88 in float32) exp is inf
    and the masked gradient 0 * inf was NaN; torch gives 1 (selu: its scale). Values and gradients against torch."""
    v = np.array([-20, -12, -7, -1, -0.5, 0.5, 1, 7, 12, 20, 100], np.float32)   # (the kink at 0: tested elsewhere)
    if dt == dtypes.half: v = v[:-1]   # 100 is fine in half too, but keep the inputs representable
    x = Tensor(v, dtype=dt, requires_grad=True)
    y = getattr(x, name)()
    y.sum().backward()
    tx = torch.tensor(v, dtype=torch.float32, requires_grad=True)
    ty = getattr(torch.nn.functional, name)(tx)
    ty.sum().backward()
    assert x.grad is not None and np.isfinite(x.grad.float().numpy()).all(), x.grad.float().numpy()
    tol = 2 * HALF_ULP if dt == dtypes.half else 1e-5   # (selu: torch's constants have more digits)
    np.testing.assert_allclose(y.float().numpy(), ty.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(x.grad.float().numpy(), tx.grad.numpy(), rtol=max(tol, 1e-5), atol=tol)
