"""Laziness as in tinygrad: random initialization, layer and optimizer creation run no kernels; the numbers depend on the
order of creation only, never on when or in which order they are realized; a whole training run (every step bound to
one Variable, as tinygrad's examples/stunning_mnist.py does) is scheduled without running a kernel and gives the values
of the same steps run one at a time."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad import GlobalCounters, Tensor, TinyJit, Variable, nn
from fusegrad.nn.state import get_parameters

CREATORS = {
    "rand": lambda: Tensor.rand(3, 4),
    "randn": lambda: Tensor.randn(5),
    "randint": lambda: Tensor.randint(2, 3, high=10),
    "uniform": lambda: Tensor.uniform(4, low=-2.0, high=3.0),
    "normal": lambda: Tensor.normal(2, 2, mean=1.0, std=0.5),
    "scaled_uniform": lambda: Tensor.scaled_uniform(3, 3),
    "glorot_uniform": lambda: Tensor.glorot_uniform(4, 6),
    "kaiming_uniform": lambda: Tensor.kaiming_uniform(4, 6),
    "kaiming_normal": lambda: Tensor.kaiming_normal(4, 6),
    "rand_like": lambda: Tensor.ones(2, 2).rand_like(),
    "randperm": lambda: Tensor.randperm(6),
    "Linear": lambda: nn.Linear(6, 3),
    "Conv2d": lambda: nn.Conv2d(2, 4, 3),
    "BatchNorm": lambda: nn.BatchNorm(4),
    "Embedding": lambda: nn.Embedding(10, 4),
    "LayerNorm": lambda: nn.LayerNorm(4),
}


@pytest.mark.parametrize("name", list(CREATORS))
def test_creation_runs_no_kernels(name):
    GlobalCounters.reset()
    CREATORS[name]()
    assert GlobalCounters.kernel_count == 0, f"{name} ran {GlobalCounters.kernel_count} kernels at creation"


@pytest.mark.parametrize("opt", ["SGD", "SGD_momentum", "Adam", "AdamW", "LAMB", "LARS", "Muon", "Adam_fused"])
def test_optimizer_creation_runs_no_kernels(opt):
    params = get_parameters(nn.Linear(4, 3))
    make = {"SGD": lambda: nn.optim.SGD(params), "SGD_momentum": lambda: nn.optim.SGD(params, momentum=0.9),
            "Adam": lambda: nn.optim.Adam(params), "AdamW": lambda: nn.optim.AdamW(params),
            "LAMB": lambda: nn.optim.LAMB(params), "LARS": lambda: nn.optim.LARS(params),
            "Muon": lambda: nn.optim.Muon(params), "Adam_fused": lambda: nn.optim.Adam(params, fused=True)}[opt]
    GlobalCounters.reset()
    make()
    Tensor.manual_seed(3)
    assert GlobalCounters.kernel_count == 0


def _draw(kind: str, n: int) -> Tensor:
    return {"rand": lambda: Tensor.rand(n), "randn": lambda: Tensor.randn(n),
            "randint": lambda: Tensor.randint(n, low=-5, high=7)}[kind]()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rand", "randn", "randint"]), st.integers(1, 40)), min_size=1, max_size=6),
       st.randoms(use_true_random=False), st.integers(0, 2**32 - 1))
def test_numbers_depend_on_creation_order_only(draws, rnd, seed):
    """Seeded, drawn lazily and realized in any order (one at a time or together) = drawn and realized one by one."""
    Tensor.manual_seed(seed)
    want = [_draw(k, n).numpy() for k, n in draws]
    Tensor.manual_seed(seed)
    lazy = [_draw(k, n) for k, n in draws]
    order = list(range(len(lazy)))
    rnd.shuffle(order)
    split = rnd.randint(0, len(order))
    Tensor.realize(*[lazy[i] for i in order[:split]]) if split else None
    for i in order[split:]: lazy[i].realize()
    for w, t in zip(want, lazy): np.testing.assert_array_equal(t.numpy(), w)
    # and the next draw continues the sequence, lazy or not
    nxt = Tensor.rand(3)
    Tensor.manual_seed(seed)
    for k, n in draws: _draw(k, n).realize()
    np.testing.assert_array_equal(nxt.numpy(), Tensor.rand(3).numpy())


def test_seed_between_lazy_draws():
    """A draw made before manual_seed keeps the old seed's numbers, even when realized after the reseed."""
    Tensor.manual_seed(1)
    a1 = Tensor.rand(4).numpy()
    Tensor.manual_seed(2)
    b1 = Tensor.rand(4).numpy()
    Tensor.manual_seed(1)
    a = Tensor.rand(4)
    Tensor.manual_seed(2)
    b = Tensor.rand(4)
    np.testing.assert_array_equal(b.numpy(), b1)
    np.testing.assert_array_equal(a.numpy(), a1)


def test_seeding_in_a_loop_keeps_one_pending_reset():
    """manual_seed with no draw since the last one replaces that pending reset instead of adding a write: 50 seeds
    and a draw run the reset, the counter update and the draw, with the last seed's numbers."""
    Tensor.rand(2).realize()
    Tensor.manual_seed(49)
    want = Tensor.rand(5).numpy()
    for s in range(50): Tensor.manual_seed(s)
    GlobalCounters.reset()
    got = Tensor.rand(5).numpy()
    assert GlobalCounters.kernel_count <= 3
    np.testing.assert_array_equal(got, want)
    Tensor.manual_seed(3)
    a = Tensor.rand(4)            # read the reset: the next seed is a write of its own, after this draw
    Tensor.manual_seed(4)
    b = Tensor.rand(4)
    Tensor.manual_seed(3)
    np.testing.assert_array_equal(a.numpy(), Tensor.rand(4).numpy())
    Tensor.manual_seed(4)
    np.testing.assert_array_equal(b.numpy(), Tensor.rand(4).numpy())


def test_lazy_draws_under_tinyjit():
    """A jitted function drawing random numbers draws new ones on every replay: the same sequence as eager calls."""
    def f(x: Tensor) -> Tensor: return (x + Tensor.rand(4)).realize()
    jf = TinyJit(f)
    x = Tensor.zeros(4).contiguous().realize()
    Tensor.manual_seed(5)
    eager = [f(x).numpy() for _ in range(4)]
    Tensor.manual_seed(5)
    jitted = [jf(x).numpy() for _ in range(4)]
    for e, j in zip(eager, jitted): np.testing.assert_array_equal(j, e)
    assert len({tuple(e) for e in eager}) == 4
    Tensor.manual_seed(5)   # a lazy reseed reaches the captured kernels: it runs before the replay reads the state
    replayed = [jf(x).numpy() for _ in range(3)]
    assert jf.cnt > 4
    for e, j in zip(eager, replayed): np.testing.assert_array_equal(j, e)


class _Model:
    """beautiful_mnist's layers, small: conv, BatchNorm (running statistics written in place), pooling, linear."""
    def __init__(self):
        self.layers = [nn.Conv2d(1, 4, 3), Tensor.relu, nn.BatchNorm(4), Tensor.max_pool2d,
                       lambda x: x.flatten(1), nn.Linear(4 * 3 * 3, 10)]

    def __call__(self, x: Tensor) -> Tensor: return x.sequential(self.layers)


STEPS, BS = 4, 8
_rng = np.random.default_rng(0)
XTR, YTR = _rng.standard_normal((40, 1, 8, 8)).astype(np.float32), _rng.integers(0, 10, 40).astype(np.int32)
XTE, YTE = _rng.standard_normal((16, 1, 8, 8)).astype(np.float32), _rng.integers(0, 10, 16).astype(np.int32)


def _setup():
    Tensor.manual_seed(11)
    X_train, Y_train, X_test, Y_test = Tensor(XTR), Tensor(YTR), Tensor(XTE), Tensor(YTE)
    model = _Model()
    opt = nn.optim.Adam(get_parameters(model))
    samples = Tensor.randint(STEPS, BS, high=X_train.shape[0])
    return model, opt, X_train[samples], Y_train[samples], X_test, Y_test


def _eager():
    """The same training run, one step at a time with a plain int step index, every step realized at once."""
    model, opt, X_samp, Y_samp, X_test, Y_test = _setup()
    losses = []
    with Tensor.train():
        for i in range(STEPS):
            opt.zero_grad()
            loss = model(X_samp[i]).sparse_categorical_crossentropy(Y_samp[i]).backward()
            opt.step()
            losses.append(loss.item())
    acc = ((model(X_test).argmax(axis=1) == Y_test).mean() * 100).item()
    return losses, acc, [p.numpy() for p in get_parameters(model)]


def _scheduled():
    """tinygrad's stunning_mnist.py: the whole run built as one lazy graph, each step's index a binding of one
    Variable; nothing runs until the values are read."""
    GlobalCounters.reset()
    model, opt, X_samp, Y_samp, X_test, Y_test = _setup()
    with Tensor.train():
        vi = Variable("i", 0, STEPS - 1)
        losses = []
        for i in range(STEPS):
            vib = vi.bind(i)
            opt.zero_grad()
            losses.append(model(X_samp[vib]).sparse_categorical_crossentropy(Y_samp[vib]).backward())
            opt.schedule_step()
    test_acc = (model(X_test).argmax(axis=1) == Y_test).mean() * 100
    assert GlobalCounters.kernel_count == 0, "kernels were run during scheduling"
    return model, losses, test_acc


@pytest.fixture(scope="module")
def eager_run():
    Tensor.manual_seed(0)
    return _eager()


def test_whole_training_run_scheduled_at_once(eager_run):
    want_losses, want_acc, want_params = eager_run
    model, losses, test_acc = _scheduled()
    got = [t.item() for t in losses]   # in step order: each realize runs the previous step's update too
    np.testing.assert_allclose(got, want_losses, rtol=1e-5, atol=1e-6)
    assert test_acc.item() == pytest.approx(want_acc)
    for p, w in zip(get_parameters(model), want_params): np.testing.assert_allclose(p.numpy(), w, rtol=1e-4, atol=1e-6)


def test_whole_training_run_realized_in_another_order(eager_run):
    """The test accuracy first (one realize of every step, the step Variable bound to all its values), then the
    losses, last first: same values."""
    want_losses, want_acc, want_params = eager_run
    model, losses, test_acc = _scheduled()
    assert test_acc.item() == pytest.approx(want_acc)
    got = [t.item() for t in reversed(losses)][::-1]
    np.testing.assert_allclose(got, want_losses, rtol=1e-5, atol=1e-6)
    for p, w in zip(get_parameters(model), want_params): np.testing.assert_allclose(p.numpy(), w, rtol=1e-4, atol=1e-6)
