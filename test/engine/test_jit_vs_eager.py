"""TinyJit replays equal eager execution call by call, or raise JitError saying why. Each pattern runs the same
function eagerly (JIT=0 semantics: the undecorated function) and under TinyJit on fresh state, and compares every
call's outputs and the state afterwards."""
import numpy as np
import pytest

from fusegrad import Tensor, TinyJit, Variable, nn
from fusegrad.engine.jit import JitError

CALLS = 6


def both(make, inputs, check_state=None):
    """make() -> (fn, state getter); run it eagerly and jitted on the same inputs and compare call by call."""
    fe, state_e = make()
    fj, state_j = make()
    jit = TinyJit(fj)
    for i, args in enumerate(inputs):
        oe = fe(*[Tensor(a) if isinstance(a, np.ndarray) else a for a in args])
        oj = jit(*[Tensor(a) if isinstance(a, np.ndarray) else a for a in args])
        for a, b in zip(oe if isinstance(oe, tuple) else (oe,), oj if isinstance(oj, tuple) else (oj,)):
            if a is None: continue
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6, atol=1e-6, err_msg=f"call {i}")
        np.testing.assert_allclose(state_j(), state_e(), rtol=1e-6, atol=1e-6, err_msg=f"state after call {i}")
    assert jit.cnt == len(inputs) and jit.captured is not None


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_batchnorm_training_state_and_output():
    def make():
        bn = nn.BatchNorm(4)
        def f(x):
            with Tensor.train(): return bn(x).realize()
        return f, lambda: np.concatenate([bn.running_mean.numpy(), bn.running_var.numpy(),
                                          [float(bn.num_batches_tracked.item())]])
    both(make, [(rnd(3, 4, seed=i) + i,) for i in range(CALLS)])


def test_unrealized_closure_assign():
    def make():
        x, y = Tensor([1.0]).realize(), Tensor([1.0]).realize()
        def f():
            nonlocal x
            x += y
        return f, lambda: x.numpy()
    both(make, [() for _ in range(CALLS)])


def test_assign_into_fresh_empty_like():
    def make():
        def f(a):
            b = a.empty_like()
            b.assign(a + 1)
            return b.realize()
        return f, lambda: np.zeros(1)
    both(make, [(np.array([float(i)], np.float32),) for i in range(CALLS)])


def test_returned_input_is_this_calls_input():
    jit = TinyJit(lambda a: a)
    outs = [jit(Tensor([float(i)])) for i in range(CALLS)]
    assert [o.item() for o in outs] == [float(i) for i in range(CALLS)]


def test_train_eval_switch_raises():
    def f(x): return x.dropout(0.5).realize()
    jit = TinyJit(f)
    with Tensor.train():
        for _ in range(3): jit(Tensor.ones(8).contiguous().realize())
    with pytest.raises(JitError, match="training"): jit(Tensor.ones(8).contiguous().realize())


def test_python_scalar_argument_change_raises():
    jit = TinyJit(lambda x, s: (x * s).realize())
    jit(Tensor([1.0]), 2.0)
    jit(Tensor([1.0]), 2.0)
    assert jit(Tensor([3.0]), 2.0).item() == 6.0
    with pytest.raises(JitError, match="baked"): jit(Tensor([1.0]), 3.0)


def test_aliased_inputs_kwargs_and_views():
    jit = TinyJit(lambda a, b: (a + b).realize())
    for _ in range(3): jit(Tensor([1.0, 2.0]), Tensor([3.0, 4.0]))
    t = Tensor([1.0, 2.0]).realize()
    with pytest.raises(JitError, match="twice"): jit(t, t)
    jk = TinyJit(lambda a, **kw: (a + kw.get("b", 0)).realize())
    for _ in range(3): jk(Tensor([1.0]))
    with pytest.raises(JitError): jk(Tensor([1.0]), b=Tensor([5.0]))
    # a view input is copied into the input slot each call: another offset gives that offset's values
    base = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    jv = TinyJit(lambda a: (a * 2).realize())
    for _ in range(3): jv(base[0:2])
    assert jv(base[2:4]).tolist() == [6.0, 8.0]
    v = base[1:3]
    jv(v)
    base[1] = 10.0                                   # the caller's view is still a view after the call
    assert v.tolist() == [10.0, 3.0]


def test_write_to_view_input_raises():
    base = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    def f(a):
        a += 1
        return (a * 1).realize()
    jit = TinyJit(f)
    jit(base[0:2])
    with pytest.raises(JitError, match="view"): jit(base[0:2])


def test_kv_cache_variable_replays_without_recapture():
    def make():
        cache = Tensor.zeros(16).contiguous().realize()
        def f(x, p):
            cache[p:p + 1].assign(x)
            return cache[0:p + 1].sum().realize()
        return f, lambda: cache.numpy()
    pos = Variable("pos", 0, 15)
    fe, se = make()
    fj, sj = make()
    jit = TinyJit(fj)
    for i in range(CALLS):
        oe, oj = fe(Tensor([i + 1.0]), pos.bind(i)), jit(Tensor([i + 1.0]), pos.bind(i))
        assert oe.item() == oj.item() == sum(range(1, i + 2))
        np.testing.assert_array_equal(sj(), se())
    assert jit.cnt == CALLS


def test_optimizer_step_matches_eager():
    def make():
        Tensor.manual_seed(1)
        lin = nn.Linear(3, 2)
        opt = nn.optim.Adam(nn.state.get_parameters(lin), lr=0.1)
        def f(x, y):
            with Tensor.train():
                opt.zero_grad()
                loss = ((lin(x) - y) ** 2).mean()
                loss.backward()
                opt.step()
                return loss.realize()
        return f, lambda: np.concatenate([lin.weight.numpy().ravel(), lin.bias.numpy()])
    both(make, [(rnd(4, 3, seed=i), rnd(4, 2, seed=10 + i)) for i in range(CALLS)])
