"""Tensors sharded over several devices in one process (fusegrad/sharding.py, schedule/multi.py): every result and
gradient must equal the single-device run. Devices: two CPU instances (CPU, CPU:1), three for the general ring, and
CPU + PYTHON / CPU + LLVM for mixed backends."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fusegrad import Context, Device, GlobalCounters, Tensor, nn
from fusegrad.nn.state import get_parameters, get_state_dict, load_state_dict

D2 = ("CPU", "CPU:1")
D3 = ("CPU", "CPU:1", "CPU:2")


def _available(dev: str) -> bool:
    try:
        Device[dev]
        return True
    except Exception:  # noqa: BLE001 - any failure to open means "not here"
        return False


def compare(fn: Callable[..., Tensor], arrays: list[np.ndarray], axes: list[int | None],
            devices: tuple[str, ...] = D2, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """fn on single-device inputs vs fn on the same inputs sharded (`axes[i]` for input i): outputs and the gradients
    of a weighted sum of the output must agree. Half the inputs are sharded leaves (their grad is a sharded tensor),
    half are single-device leaves sharded inside the graph (their grad flows back through the shard)."""
    ref_in = [Tensor(a, requires_grad=True) for a in arrays]
    ref = fn(*ref_in)
    weights = np.random.default_rng(1).standard_normal(ref.shape).astype(np.float32)
    (ref * Tensor(weights, device=ref.device)).sum().backward()
    leaves, sharded = [], []
    for i, (a, ax) in enumerate(zip(arrays, axes)):
        if i % 2 == 0:
            t = Tensor(a).shard(devices, ax).requires_grad_()
            leaves.append(t)
            sharded.append(t)
        else:
            t = Tensor(a, requires_grad=True)
            leaves.append(t)
            sharded.append(t.shard(devices, ax))
    out = fn(*sharded)
    assert out.shape == ref.shape
    (out * Tensor(weights).to(out.device)).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=rtol, atol=atol)
    for i, (r, s) in enumerate(zip(ref_in, leaves)):
        assert r.grad is not None and s.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(s.grad.numpy(), r.grad.numpy(), rtol=rtol, atol=atol, err_msg=f"grad of input {i}")


def rnd(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


def test_shard_values_and_devices():
    a = rnd(5, 3)
    t = Tensor(a).shard(D2, axis=0)
    assert t.device == D2 and t.shape == (5, 3)
    assert [p.shape for p in t.uop.src] == [(3, 3), (2, 3)]   # uneven: the first shard one larger
    np.testing.assert_array_equal(t.numpy(), a)
    r = Tensor(a, device=D2)
    assert r.device == D2 and r.uop.arg is None
    np.testing.assert_array_equal((r + t).numpy(), 2 * a)
    np.testing.assert_array_equal(Tensor(a).to(D2).to("CPU:1").numpy(), a)
    s = Tensor(a)
    s.shard_(D2, axis=1)
    assert s.device == D2 and s.uop.arg == 1
    np.testing.assert_array_equal(Tensor.zeros(3, 2).shard_like(s).numpy(), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="twice"): Tensor(a).shard(("CPU", "cpu:0"))
    with pytest.raises(ValueError, match="can't be split"): Tensor(a).shard(D3 + ("CPU:3", "CPU:4", "CPU:5"), axis=1)


@pytest.mark.parametrize("axes", [(0, 0), (1, 1), (0, None), (None, 1)])
def test_elementwise(axes: tuple[int | None, int | None]):
    compare(lambda x, y: (x * y + x.exp()).relu() - y / 3, [rnd(4, 6), rnd(4, 6, seed=1)], list(axes))


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_reduce(axis: int, algo: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ALLREDUCE", algo)
    compare(lambda x: x.sum(0) * 2 + x.max(1).reshape(4, 1).sum(), [rnd(4, 6)], [axis])
    compare(lambda x: x.mean() + x.sum(), [rnd(4, 6)], [axis])


@pytest.mark.parametrize("algo", ["ring", "tree"])
def test_three_devices(algo: str, monkeypatch: pytest.MonkeyPatch):
    """The ring's general case (3 chunks, 2 reduce-scatter and 2 allgather steps) and an uneven tree."""
    monkeypatch.setenv("ALLREDUCE", algo)
    compare(lambda x, w: (x @ w).sum(1), [rnd(7, 5), rnd(5, 4, seed=2)], [1, 0], devices=D3)


def test_matmul_batch_sharded_and_contracted_axis():
    compare(lambda x, w: (x @ w).tanh(), [rnd(6, 5), rnd(5, 3, seed=3)], [0, None])      # data parallel
    compare(lambda x, w: x @ w, [rnd(6, 5), rnd(5, 3, seed=3)], [1, 0])                  # contracted: allreduce
    compare(lambda x, w: x @ w, [rnd(6, 4), rnd(4, 8, seed=3)], [None, 1])               # output axis sharded


def test_conv2d_batch_sharded():
    compare(lambda x, w: x.conv2d(w, padding=1).relu().max_pool2d(),
            [rnd(4, 2, 6, 6), rnd(3, 2, 3, 3, seed=4)], [0, None], rtol=1e-4, atol=1e-4)


def test_batchnorm_uses_global_statistics():
    """A batch sharded on axis 0: BatchNorm's mean and variance reduce over the sharded axis, so they are allreduced
    and equal the whole batch's (unlike per-process data parallelism)."""
    bn_ref, bn = nn.BatchNorm(3), nn.BatchNorm(3)
    for t in get_parameters(bn) + [bn.running_mean, bn.running_var, bn.num_batches_tracked]: t.to_(D2)
    with Tensor.train():
        compare(lambda x: bn_ref(x) if x.device == "CPU" else bn(x), [rnd(4, 3, 5, 5)], [0], rtol=1e-4, atol=1e-4)
    assert bn.running_mean is not None and bn_ref.running_mean is not None and bn.running_var is not None
    np.testing.assert_allclose(bn.running_mean.numpy(), bn_ref.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), bn_ref.running_var.numpy(), rtol=1e-5, atol=1e-6)


def test_shard_then_gather_to_another_device():
    compare(lambda x: x.to("CPU:1") * 2, [rnd(4, 3)], [0])


@pytest.mark.parametrize("other", ["PYTHON", "LLVM"])
def test_mixed_backends(other: str):
    if not _available(other): pytest.skip(f"{other} does not open here")
    compare(lambda x, y: (x * y).sum(0) + 1, [rnd(4, 3), rnd(4, 3, seed=5)], [0, 0], devices=("CPU", other))


class _MLP:
    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(12, 16), nn.Linear(16, 4)

    def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x).relu())


def _train(model: _MLP, x: np.ndarray, y: np.ndarray, shard: Callable[[Tensor], Tensor], steps: int = 3) -> list[float]:
    opt = nn.optim.Adam(get_parameters(model), lr=0.01)
    losses = []
    with Tensor.train():
        for _ in range(steps):
            opt.zero_grad()
            loss = model(shard(Tensor(x))).sparse_categorical_crossentropy(shard(Tensor(y))).backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_data_parallel_training_equals_single_device():
    """Replicated model, batch sharded on axis 0: the gradients of the replicated weights reduce over the batch,
    which the lowering turns into an allreduce; 3 Adam steps match one device."""
    x, y = rnd(8, 12), np.arange(8, dtype=np.int32) % 4
    Tensor.manual_seed(0)
    ref = _MLP()
    Tensor.manual_seed(0)
    dp = _MLP()
    for p in get_parameters(dp): p.shard_(D2)
    l_ref = _train(ref, x, y, lambda t: t)
    l_dp = _train(dp, x, y, lambda t: t.shard(D2, axis=0))
    np.testing.assert_allclose(l_dp, l_ref, rtol=1e-5)
    for a, b in zip(get_parameters(dp), get_parameters(ref)):
        assert a.device == D2
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)


def test_model_parallel_linear():
    """Linear weights (out, in) and biases sharded on the output axis; each device computes its slice of the outputs."""
    x, y = rnd(8, 12), np.arange(8, dtype=np.int32) % 4
    Tensor.manual_seed(0)
    ref = _MLP()
    Tensor.manual_seed(0)
    mp = _MLP()
    for lin in (mp.l1, mp.l2):
        lin.weight.shard_(D2, axis=0)
        assert lin.bias is not None
        lin.bias.shard_(D2, axis=0)
    l_ref = _train(ref, x, y, lambda t: t)
    l_mp = _train(mp, x, y, lambda t: t.to(D2))
    np.testing.assert_allclose(l_mp, l_ref, rtol=1e-5)
    assert mp.l1.weight.uop.arg == 0 and [s.shape for s in mp.l1.weight.uop.src] == [(8, 12), (8, 12)]
    np.testing.assert_allclose(mp.l1.weight.numpy(), ref.l1.weight.numpy(), rtol=1e-4, atol=1e-6)


def test_load_state_dict_into_sharded_model():
    Tensor.manual_seed(0)
    src = _MLP()
    Tensor.manual_seed(1)
    dst = _MLP()
    dst.l1.weight.shard_(D2, axis=0)
    for p in (dst.l1.bias, dst.l2.weight, dst.l2.bias):
        assert p is not None
        p.shard_(D2)
    load_state_dict(dst, get_state_dict(src))
    assert dst.l1.weight.device == D2 and dst.l1.weight.uop.arg == 0
    for k, v in get_state_dict(src).items(): np.testing.assert_array_equal(get_state_dict(dst)[k].numpy(), v.numpy())
    x = rnd(3, 12)
    np.testing.assert_allclose(dst(Tensor(x).to(D2)).numpy(), src(Tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_allreduce_is_scheduled_copies_and_kernels(capsys: pytest.CaptureFixture[str]):
    """The allreduce is ordinary schedule items: DEBUG=2 prints each copy between the devices with its time."""
    t = Tensor(rnd(4, 6)).shard(D2, axis=1)
    GlobalCounters.reset()
    with Context(DEBUG=2): t.sum(1).realize()
    out = capsys.readouterr().out
    assert "CPU -> CPU:1" in out and "CPU:1 -> CPU" in out


def test_tinyjit_with_sharding_inside():
    """TinyJit replays a step that shards inside (one-device inputs and outputs); multi-device inputs or outputs
    raise a JitError that says what to do instead."""
    from fusegrad import TinyJit
    from fusegrad.engine.jit import JitError
    w = Tensor(rnd(4, 3)).to(D2).realize()
    step = TinyJit(lambda x: (x.shard(D2, 0) @ w).sum(0).to("CPU").realize())
    for i in range(4):
        x = rnd(6, 4, seed=i)
        np.testing.assert_allclose(step(Tensor(x)).numpy(), (x @ w.numpy()).sum(0), rtol=1e-5)
    with pytest.raises(JitError, match="inputs on several devices"):
        bad = TinyJit(lambda x: (x * 2).realize())
        for _ in range(2): bad(Tensor(rnd(4, 2)).shard(D2, 0))
    with pytest.raises(JitError, match="outputs on several devices"):
        bad2 = TinyJit(lambda x: (x.to(D2) * 2).realize())
        for _ in range(2): bad2(Tensor(rnd(4, 2)))


@pytest.mark.parametrize("name,axis,fn", [
    ("permute", 0, lambda x: x.permute(1, 0, 2) * 2),
    ("reshape keeps shards", 0, lambda x: x.reshape(4, 15).exp()),
    ("reshape splits the sharded axis", 0, lambda x: x.reshape(2, 2, 3, 5).sum(1)),
    ("reshape merges it with the next axis", 0, lambda x: x.permute(1, 0, 2).reshape(3, 20) + 1),
    ("reshape merges it with the previous axis (gathered)", 1, lambda x: x.reshape(12, 5) + 1),
    ("pad the sharded axis (gathered)", 0, lambda x: x.pad(((1, 2), None, None)) * 3),
    ("flip the sharded axis (gathered)", 0, lambda x: x.flip(0) - x),
    ("shrink one shard", 0, lambda x: x[0:2] * 5),
    ("shrink across shards", 0, lambda x: x[1:3].sum(0)),
    ("expand", 0, lambda x: x[:, :1].expand(4, 3, 5) + x),
    ("cat on the sharded axis", 0, lambda x: x.cat(x * 2, dim=0).sum(1)),
])
def test_movement_rules(name: str, axis: int, fn: Callable[[Tensor], Tensor]):
    """Movement ops that keep the split run per device; the others run on the gathered tensor: same values."""
    compare(fn, [rnd(4, 3, 5)], [axis])


def test_which_ops_stay_split():
    """The lowering keeps the split where each shard stays one block, and gathers otherwise."""
    from fusegrad.schedule.multi import Sharded, lower_multi
    x = Tensor(rnd(4, 3, 5)).shard(D2, 0)
    cases = {"permute": (x.permute(1, 0, 2), 1), "reshape": (x.reshape(4, 15), 0), "split": (x.reshape(2, 2, 3, 5), 0),
             "flat": (x.reshape(60), 0), "merge next": (x.permute(1, 0, 2).reshape(3, 20), 1),
             "pad": (x.pad(((1, 2), None, None)), None), "reduce": (x.sum(0), None), "other reduce": (x.sum(2), 0)}
    for name, (t, axis) in cases.items():
        lv = lower_multi([t.uop])[0]
        assert isinstance(lv, Sharded) and lv.axis == axis, (name, lv)
    one = lower_multi([x[2:4].uop])[0]    # exactly the second shard: a one-device value on CPU:1
    assert not isinstance(one, Sharded) and one.device == "CPU:1"


def test_data_parallel_training_under_tinyjit():
    """The data-parallel step jitted (the batch sharded inside, the loss returned on one device): 5 replays of Adam
    steps give the one-device losses."""
    from fusegrad import TinyJit

    def run(devices: tuple[str, ...] | None) -> list[float]:
        Tensor.manual_seed(0)
        model = _MLP()
        if devices:
            for p in get_parameters(model): p.shard_(devices)
        opt = nn.optim.Adam(get_parameters(model), lr=0.01)

        @TinyJit
        def step(x: Tensor, y: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                if devices: x, y = x.shard(devices, 0), y.shard(devices, 0)
                loss = model(x).sparse_categorical_crossentropy(y).backward()
                return (loss.to("CPU") if devices else loss).realize(*opt.schedule_step())
        return [step(Tensor(rnd(8, 12, seed=i)), Tensor(np.arange(8, dtype=np.int32) % 4)).item() for i in range(5)]
    np.testing.assert_allclose(run(D2), run(None), rtol=1e-5)


def test_writes_to_sharded_memory_invalidate_cached_results():
    """A realized multi-device result is cached like a buffer: writing its shards, or the shards it was computed from,
    makes the same expression compute again."""
    a = Tensor(np.ones((4, 2), np.float32)).shard(D2, 0).realize()
    s = (a * 2).realize()
    assert s.numpy().sum() == 16
    s.assign(Tensor(np.zeros((4, 2), np.float32)).shard(D2, 0)).realize()
    assert (a * 2).numpy().sum() == 16 and s.numpy().sum() == 0
    a.assign(a + 1).realize()
    assert (a * 2).numpy().sum() == 32 and a.device == D2 and a.uop.arg == 0
