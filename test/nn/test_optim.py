"""Optimizers against torch.optim (SGD, Adam, AdamW, Muon) and against reference implementations of the published
update rules (LAMB, LARS), over 12 steps of a small two-layer model trained on fixed data."""
import math

import numpy as np
import pytest
import torch

from fusegrad import Context, Tensor, nn
from fusegrad.nn.state import get_parameters

from .helpers import copy_to_torch, rand

STEPS = 12


class Net:
    def __init__(self, bias: bool = True):
        Tensor.manual_seed(1234)   # the same init whatever ran before in this process
        self.l1, self.l2 = nn.Linear(4, 6, bias=bias), nn.Linear(6, 3, bias=bias)

    def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x).relu())


def torch_net(net: Net) -> torch.nn.Sequential:
    tn = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=net.l1.bias is not None), torch.nn.ReLU(),
                             torch.nn.Linear(6, 3, bias=net.l2.bias is not None))
    copy_to_torch(net.l1, tn[0])
    copy_to_torch(net.l2, tn[2])
    return tn


X, T = rand(8, 4, seed=1, low=-2, high=2), rand(8, 3, seed=2)


def fg_loss(net: Net) -> Tensor: return (net(Tensor(X)) - Tensor(T)).square().mean()
def torch_loss(tn: torch.nn.Module) -> torch.Tensor: return (tn(torch.tensor(X)) - torch.tensor(T)).square().mean()


def torch_params(tn: torch.nn.Sequential) -> list[torch.Tensor]:
    return [p for m in (tn[0], tn[2]) for p in (m.weight, m.bias) if p is not None]


def run_and_compare(make_fg, torch_step, bias: bool = True, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """Train both for STEPS steps; `torch_step(params)` updates the torch params given their .grad."""
    net = Net(bias)
    tn = torch_net(net)
    params = [t for lyr in (net.l1, net.l2) for t in (lyr.weight, lyr.bias) if t is not None]
    opt = make_fg(params)
    tparams = torch_params(tn)
    with Tensor.train():
        for step in range(STEPS):
            opt.zero_grad()
            loss = fg_loss(net)
            loss.backward()
            opt.step()
            for p in tparams: p.grad = None
            tl = torch_loss(tn)
            tl.backward()
            torch_step(tparams)
            np.testing.assert_allclose(loss.item(), tl.item(), rtol=rtol, err_msg=f"loss at step {step}")
            for i, (p, tp) in enumerate(zip(params, tparams)):
                np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), atol=atol, rtol=rtol,
                                           err_msg=f"param {i} after step {step}")


def torch_opt(cls, **kw):
    state = {}

    def step(tparams):
        if "opt" not in state: state["opt"] = cls(tparams, **kw)
        state["opt"].step()
    return step


@pytest.mark.parametrize("kw", [{"lr": 0.1}, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
                                {"lr": 0.05, "momentum": 0.8, "nesterov": True}])
def test_sgd(kw):
    run_and_compare(lambda ps: nn.optim.SGD(ps, **kw), torch_opt(torch.optim.SGD, **kw))


def test_adam():
    run_and_compare(lambda ps: nn.optim.Adam(ps, lr=0.01, b1=0.8, b2=0.99),
                    torch_opt(torch.optim.Adam, lr=0.01, betas=(0.8, 0.99)))


def test_adamw():
    run_and_compare(lambda ps: nn.optim.AdamW(ps, lr=0.02, weight_decay=0.1),
                    torch_opt(torch.optim.AdamW, lr=0.02, weight_decay=0.1))


def lamb_reference(lr, b1, b2, eps, wd):
    """LAMB (You et al. 2019, Algorithm 2) with Adam's bias correction, written out in torch ops."""
    st = {"t": 0, "m": None, "v": None}

    @torch.no_grad()
    def step(ps):
        if st["m"] is None: st["m"], st["v"] = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
        st["t"] += 1
        for p, m, v in zip(ps, st["m"], st["v"]):
            m.mul_(b1).add_((1 - b1) * p.grad)
            v.mul_(b2).add_((1 - b2) * p.grad ** 2)
            r = (m / (1 - b1 ** st["t"])) / ((v / (1 - b2 ** st["t"])).sqrt() + eps)
            u = r + wd * p
            wn, un = p.norm(), u.norm()
            trust = wn / un if wn > 0 and un > 0 else 1.0
            p.sub_(lr * trust * u)
    return step


def test_lamb():
    run_and_compare(lambda ps: nn.optim.LAMB(ps, lr=0.01, weight_decay=0.05),
                    lamb_reference(0.01, 0.9, 0.999, 1e-6, 0.05))


def lars_reference(lr, momentum, wd, tcoef):
    """LARS (You et al. 2017, Algorithm 1): local lr = tcoef*|w|/(|g| + wd*|w|); v = m*v + lr*local*(g + wd*w);
    w -= v."""
    st = {"v": None}

    @torch.no_grad()
    def step(ps):
        if st["v"] is None: st["v"] = [torch.zeros_like(p) for p in ps]
        for p, v in zip(ps, st["v"]):
            wn, gn = p.norm(), p.grad.norm()
            local = tcoef * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0
            v.mul_(momentum).add_(lr * local * (p.grad + wd * p))
            p.sub_(v)
    return step


def test_lars():
    run_and_compare(lambda ps: nn.optim.LARS(ps, lr=0.5, momentum=0.9, weight_decay=1e-3, tcoef=0.02),
                    lars_reference(0.5, 0.9, 1e-3, 0.02))


def muon_reference(lr, momentum, wd, steps, coeffs, eps=1e-7):
    """torch.optim.Muon's update (nesterov) in float32 (torch runs the Newton-Schulz iteration in bfloat16)."""
    st = {"b": None}
    a, b, c = coeffs

    @torch.no_grad()
    def step(ps):
        if st["b"] is None: st["b"] = [torch.zeros_like(p) for p in ps]
        for p, buf in zip(ps, st["b"]):
            buf.lerp_(p.grad, 1 - momentum)
            u = p.grad.lerp(buf, momentum)
            x = u.T if u.shape[0] > u.shape[1] else u
            x = x / x.norm().clamp(min=eps)
            for _ in range(steps):
                gram = x @ x.T
                x = a * x + (b * gram + c * gram @ gram) @ x
            x = x.T if u.shape[0] > u.shape[1] else x
            p.mul_(1 - lr * wd)
            p.sub_(lr * math.sqrt(max(1, p.shape[0] / p.shape[1])) * x)
    return step


def test_muon_matches_float32_reference():
    coeffs = (3.4445, -4.775, 2.0315)
    run_and_compare(lambda ps: nn.optim.Muon(ps, lr=0.02, weight_decay=0.1), muon_reference(0.02, 0.95, 0.1, 5, coeffs),
                    bias=False, atol=1e-4, rtol=1e-3)


def test_muon_close_to_torch_muon():
    """torch.optim.Muon orthogonalizes in bfloat16, so agreement is only to bfloat16 precision (a few 1e-3 per step,
    compounding); test_muon_matches_float32_reference is the exact check of the same update rule."""
    run_and_compare(lambda ps: nn.optim.Muon(ps, lr=0.02, weight_decay=0.1),
                    torch_opt(torch.optim.Muon, lr=0.02, weight_decay=0.1), bias=False, atol=1.5e-2, rtol=3e-2)


# ---------------------------------------------------------------------------------------------------------------------
# behaviour

def test_step_requires_training_mode():
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.1)
    (w * w).sum().backward()
    with pytest.raises(RuntimeError, match="training mode"): opt.step()
    with Context(TRAINING=1): opt.step()
    np.testing.assert_allclose(w.numpy(), [0.8, 1.6], rtol=1e-6)


def test_update_leaves_no_autograd_history_and_lr_tensor():
    w = Tensor([1.0, -1.0], requires_grad=True)
    opt = nn.optim.Adam([w], lr=0.1)
    assert isinstance(opt.lr, Tensor) and opt.lr.requires_grad is False
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad()
            assert w.grad is None
            (w * w).sum().backward()
            opt.step()
            assert not w._derived and w.requires_grad and w.is_param
        # the next gradient is of the new value only (no history through earlier updates)
        opt.zero_grad()
        (w * 3).sum().backward()
        np.testing.assert_allclose(w.grad.numpy(), [3.0, 3.0])
        before = w.numpy()
        opt.lr.assign(Tensor([0.0]))   # a new learning rate without rebuilding the optimizer
        opt.step()
        np.testing.assert_allclose(w.numpy(), before)


def test_buffers_and_params_split():
    bn = nn.BatchNorm(3)
    opt = nn.optim.SGD(get_parameters(bn), lr=0.1)
    assert {id(t) for t in opt.params} == {id(bn.weight), id(bn.bias)}
    assert {id(t) for t in opt.buffers} == {id(bn.running_mean), id(bn.running_var), id(bn.num_batches_tracked)}
    with Tensor.train():
        bn(Tensor(rand(4, 3, 2))).sum().backward()
        todo = opt.schedule_step()
        assert all(any(t is x for x in todo) for t in opt.buffers + opt.params)
        Tensor.realize(*todo)
    assert bn.num_batches_tracked.item() == 1


def test_optimizer_group():
    a, b = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0], requires_grad=True)
    group = nn.optim.OptimizerGroup(nn.optim.SGD([a], lr=0.5), nn.optim.SGD([b], lr=0.1))
    assert group[1].params[0] is b and len(group.params) == 2
    with Tensor.train():
        group.zero_grad()
        ((a * a).sum() + (b * b).sum()).backward()
        group.step()
    np.testing.assert_allclose(a.numpy(), [0.0, 0.0])
    np.testing.assert_allclose(b.numpy(), [2.4], rtol=1e-6)


def test_params_without_grad_are_skipped():
    a, b = Tensor([1.0], requires_grad=True), Tensor([5.0], requires_grad=True)
    opt = nn.optim.SGD([a, b], lr=0.5, momentum=0.9)
    with Tensor.train():
        (a * a).sum().backward()
        opt.step()
    np.testing.assert_allclose(a.numpy(), [0.0])
    np.testing.assert_allclose(b.numpy(), [5.0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="empty"): nn.optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="no trainable"): nn.optim.SGD([Tensor([1.0], requires_grad=False)])
    with pytest.raises(ValueError, match="nesterov"): nn.optim.SGD([Tensor([1.0], requires_grad=True)], nesterov=True)


def test_zeroed_state_is_lazy_for_all_shapes(monkeypatch):
    """Adam's moments for parameters of several shapes are lazy zeros (as in tinygrad: nothing is scheduled when the
    optimizer is made; the first step writes them), zero and outside autograd, and the first step is one schedule."""
    import fusegrad.engine.realize as er
    real, schedules = er.run_schedule, []
    def spy(items):
        schedules.append(len(items))
        return real(items)
    monkeypatch.setattr(er, "run_schedule", spy)
    params = [Tensor.ones(n, 3, requires_grad=True).contiguous().realize() for n in (5, 7, 11)]
    schedules.clear()
    opt = nn.optim.Adam(params)
    assert schedules == [], schedules   # (b1^t, b2^t come from host lists: no kernel either)
    with Tensor.train():
        sum((p * p).sum() for p in params).backward()
        opt.step()
    assert len(schedules) == 1, schedules
    for t, m, v in zip(params, opt.m, opt.v):
        assert m.shape == v.shape == t.shape and not m.requires_grad and not v.requires_grad
        np.testing.assert_allclose(m.numpy(), 0.1 * 2 * np.ones(t.shape, np.float32), rtol=1e-6)   # (1 - b1) g
        np.testing.assert_allclose(v.numpy(), 0.001 * 4 * np.ones(t.shape, np.float32), rtol=1e-6)   # (1 - b2) g^2
