"""Fused optimizers (tinygrad's FUSE_OPTIM): one flat state over all parameters. Same values as unfused and as
torch.optim, over several steps, with a parameter that gets no gradient; `Context(FUSE_OPTIM=1)` selects it."""
import numpy as np
import pytest
import torch

from fusegrad import Context, Tensor, nn

SHAPES = [(3, 4), (4,), (2, 2, 3)]


def _run(make_opt, fused, steps=4, skip=2):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    xs = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    ps = [Tensor(a, requires_grad=True) for a in init]
    opt = make_opt(nn.optim, ps, fused)
    with Tensor.train():
        for step in range(steps):
            opt.zero_grad()
            # param `skip` gets no gradient every second step
            used = [p for i, p in enumerate(ps) if not (i == skip and step % 2)]
            sum(((p * Tensor(x)).sum() ** 2 for p, x in zip(ps, xs) if any(p is u for u in used))).backward()
            opt.step()
    tps = [torch.tensor(a, requires_grad=True) for a in init]
    topt = make_opt(torch.optim, tps, None)
    for step in range(steps):
        topt.zero_grad(set_to_none=True)
        loss = sum(((p * torch.tensor(x)).sum() ** 2 for i, (p, x) in enumerate(zip(tps, xs))
                    if not (i == skip and step % 2)))
        loss.backward()
        topt.step()
    return opt, [p.numpy() for p in ps], [p.detach().numpy() for p in tps]


OPTS = {
    "sgd": lambda m, ps, f: m.SGD(ps, lr=0.01) if m is torch.optim else m.SGD(ps, lr=0.01, fused=f),
    "sgd_momentum_nesterov_wd": lambda m, ps, f: m.SGD(ps, lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                       **({} if m is torch.optim else {"fused": f})),
    "adam": lambda m, ps, f: m.Adam(ps, lr=0.01, **({} if m is torch.optim else {"fused": f})),
    "adamw": lambda m, ps, f: m.AdamW(ps, lr=0.01, weight_decay=0.1, **({} if m is torch.optim else {"fused": f})),
}


@pytest.mark.parametrize("name", list(OPTS))
def test_fused_matches_unfused_and_torch(name):
    opt_f, fused, _ = _run(OPTS[name], True)
    _, unfused, _ = _run(OPTS[name], False)
    assert opt_f._flat and len(getattr(opt_f, "m", getattr(opt_f, "b", [None]))) <= 1   # one flat state tensor
    for a, b in zip(fused, unfused): np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # every param with a gradient every step: as torch.optim (torch's Adam counts steps per parameter, so a skipped
    # gradient would make it differ from both)
    _, fused_all, ref = _run(OPTS[name], True, skip=99)
    for a, r in zip(fused_all, ref): np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)


def test_context_selects_fused_and_per_parameter_rules_stay_unfused():
    ps = [Tensor.ones(2, requires_grad=True)]
    with Context(FUSE_OPTIM=1):
        adam, lamb, plain_sgd = nn.optim.Adam(ps), nn.optim.LAMB(ps), nn.optim.SGD(ps, fused=False)
    assert adam.fused and adam._flat and not plain_sgd.fused
    assert lamb.fused and not lamb._flat              # trust ratio per parameter: values as unfused
    assert not nn.optim.Adam(ps).fused
    _, fused, _ = _run(lambda m, ps, f: m.LAMB(ps, lr=0.01, fused=f) if m is not torch.optim else
                       m.Adam(ps, lr=0.01), True, steps=2, skip=99)
    _, unfused, _ = _run(lambda m, ps, f: m.LAMB(ps, lr=0.01, fused=f) if m is not torch.optim else
                         m.Adam(ps, lr=0.01), False, steps=2, skip=99)
    for a, b in zip(fused, unfused): np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=15, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 3)), min_size=1, max_size=3),
       kind=st.sampled_from(["sgd", "adam", "adamw"]), lr=st.sampled_from([0.1, 0.01]), steps=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_fused_steps_match_torch(shapes, kind, lr, steps, seed):
    """Random parameter shapes and step counts: fused updates equal torch.optim doing the same steps."""
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(steps)]
    ps, tps = [Tensor(a, requires_grad=True) for a in init], [torch.tensor(a, requires_grad=True) for a in init]
    make = {"sgd": lambda m, p, **k: m.SGD(p, lr=lr, momentum=0.9, **k),
            "adam": lambda m, p, **k: m.Adam(p, lr=lr, **k),
            "adamw": lambda m, p, **k: m.AdamW(p, lr=lr, weight_decay=0.05, **k)}[kind]
    opt, topt = make(nn.optim, ps, fused=True), make(torch.optim, tps)
    with Tensor.train():
        for gs in grads:
            opt.zero_grad()
            sum((p * Tensor(g)).sum() for p, g in zip(ps, gs)).backward()
            opt.step()
            topt.zero_grad()
            sum((p * torch.tensor(g)).sum() for p, g in zip(tps, gs)).backward()
            topt.step()
    for p, tp in zip(ps, tps): np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-5)
