"""`fusegrad.function` (tinygrad's `@function`): values and gradients against plain calls and PyTorch, implicit
inputs, custom gradients (`grad_fxn`), precompile options, methods."""
import numpy as np
import pytest
import torch

from fusegrad import Tensor, function, nn
from fusegrad.function import FunctionCall
from fusegrad.nn.state import get_parameters


def _mlp(x, w1, b1, w2):
    return ((x @ w1 + b1).relu() @ w2).log_softmax(-1)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((4, 5), (5, 6), (6,), (6, 3))]


@pytest.mark.parametrize("opts", [{}, {"precompile": True}, {"precompile_backward": True},
                                  {"precompile": True, "precompile_backward": True}])
def test_values_and_gradients_match_plain_call_and_torch(opts):
    arrs = _data()
    f = function(**opts)(_mlp)
    ts = [Tensor(a, requires_grad=True) for a in arrs]
    out = f(*ts)
    (out * out).sum().backward()
    plain = [Tensor(a, requires_grad=True) for a in arrs]
    ref = _mlp(*plain)
    (ref * ref).sum().backward()
    tt = [torch.tensor(a, requires_grad=True) for a in arrs]
    tout = ((tt[0] @ tt[1] + tt[2]).relu() @ tt[3]).log_softmax(-1)
    (tout * tout).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-5)
    for t, p, q in zip(ts, plain, tt):
        np.testing.assert_allclose(t.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(t.grad.numpy(), q.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_called_again_with_new_values():
    f = function(lambda x, y: (x * y).sum(1))
    for seed in range(3):
        a, b = np.random.default_rng(seed).standard_normal((2, 3, 4)).astype(np.float32)
        np.testing.assert_allclose(f(Tensor(a), Tensor(b)).numpy(), (a * b).sum(1), rtol=1e-6)


def test_precompile_materializes_outputs():
    x = Tensor([1.0, 2.0, 3.0]).realize()
    out = function(precompile=True)(lambda x: x * 2)(x)
    assert out.uop.op.name == "CONTIGUOUS"
    assert out.tolist() == [2.0, 4.0, 6.0]


def test_tuple_outputs_and_kwargs():
    @function
    def f(x, *, scale):
        return x + 1, x * scale["s"]
    x = Tensor([1.0, 2.0], requires_grad=True)
    s = Tensor([3.0, 4.0], requires_grad=True)
    a, b = f(x, scale={"s": s})
    (a.sum() + (b * b).sum()).backward()
    assert a.tolist() == [2.0, 3.0] and b.tolist() == [3.0, 8.0]
    # d/dx: 1 + 2*(x*s)*s ; d/ds: 2*(x*s)*x
    np.testing.assert_allclose(x.grad.numpy(), [1 + 2 * 3 * 3, 1 + 2 * 8 * 4])
    np.testing.assert_allclose(s.grad.numpy(), [2 * 3 * 1, 2 * 8 * 2])


def test_implicit_input_raises_unless_allowed():
    w = Tensor([1.0, 2.0]).realize()
    with pytest.raises(RuntimeError, match="1 implicit buffer"):
        function(lambda x: x * w)(Tensor([1.0, 1.0]))
    assert function(allow_implicit=True)(lambda x: x * w)(Tensor([3.0, 3.0])).tolist() == [3.0, 6.0]


def test_tensors_made_in_the_body_are_not_implicit():
    @function
    def f(x): return x + Tensor([10.0, 20.0]) + Tensor.ones(2)
    assert f(Tensor([1.0, 2.0])).tolist() == [12.0, 23.0]


def test_non_tensor_result_raises():
    with pytest.raises(RuntimeError, match="must return a Tensor"):
        function(lambda x: 3)(Tensor([1.0]))


def test_method_with_model_weights_as_inputs():
    """As tinygrad's beautiful_mnist: `@function` on `__call__`, the weights reached through `self`."""
    class Model:
        def __init__(self):
            self.l1, self.l2 = nn.Linear(5, 8), nn.Linear(8, 3)
        @function
        def __call__(self, x): return self.l2(self.l1(x).relu())
        def plain(self, x): return self.l2(self.l1(x).relu())
    Tensor.manual_seed(1)
    m = Model()
    x = Tensor(_data()[0])
    out = m(x)
    out.sum().backward()
    grads = [p.grad.numpy() for p in get_parameters(m)]
    for p in get_parameters(m): p.grad = None
    ref = m.plain(x)
    ref.sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
    for g, p in zip(grads, get_parameters(m)): np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_grad_fxn_replaces_the_gradient():
    seen = []
    def grad_fxn(g, call):
        seen.append(call)
        x, y = (Tensor(u) for u in call.src[1:])
        return (g * 10).uop, None          # a made-up gradient for x, none for y
    f = function(grad_fxn=grad_fxn)(lambda x, y: x * y)
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = Tensor([3.0, 4.0], requires_grad=True)
    out = f(x, y)
    assert out.tolist() == [3.0, 8.0]
    out.sum().backward()
    assert x.grad.tolist() == [10.0, 10.0]
    assert y.grad.tolist() == [0.0, 0.0]        # in the graph, no gradient sent: zeros (as tinygrad)
    assert isinstance(seen[0], FunctionCall) and len(seen[0].inputs) == 2


def test_grad_fxn_tuple_outputs_get_one_gradient_each():
    def grad_fxn(d0, d1, call):     # f(u1, u2) = (u1 + 1, u2 * 2): the true gradients
        return d0, d1 * 2
    f = function(grad_fxn=grad_fxn)(lambda u1, u2: (u1 + 1, u2 * 2))
    x = Tensor([1.0, 1.0, 1.0], requires_grad=True)
    y = Tensor([1.0, 1.0, 1.0], requires_grad=True)
    t1, t2 = f(x, y)
    (t1 * 3 + t2).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0, 3.0] and y.grad.tolist() == [2.0, 2.0, 2.0]


def test_grad_fxn_matching_torch_custom_function():
    """A hand-written gradient for a straight-through estimator, against torch.autograd.Function doing the same."""
    class STE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x): return x.round()
        @staticmethod
        def backward(ctx, g): return g
    f = function(grad_fxn=lambda g, call: (g,))(lambda x: x.round())
    a = np.array([0.2, 1.7, -2.6, 3.5], dtype=np.float32)
    x, tx = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    (f(x) * Tensor(a)).sum().backward()
    (STE.apply(tx) * torch.tensor(a)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


def test_grad_fxn_wrong_count_or_shape_raises():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="returned 2 gradient"):
        function(grad_fxn=lambda g, call: (g, g))(lambda x: x * 2)(x).sum().backward()
    with pytest.raises(RuntimeError, match="shape"):
        function(grad_fxn=lambda g, call: (g.sum(),))(lambda x: x * 2)(x).sum().backward()


def test_decorator_forms_and_name():
    @function(precompile=True)
    def named(x): return x + 1
    assert named.name.endswith("named") and named(Tensor([1.0])).tolist() == [2.0]
    assert function(named.fxn)(Tensor([2.0])).tolist() == [3.0]


def test_training_with_function_tinyjit_and_batchnorm_matches_plain():
    """tinygrad's beautiful_mnist pattern: `@function` on `__call__` (BatchNorm updating its running statistics inside),
    a TinyJit train step, Adam. Same losses, weights and running statistics as the same model without `@function`."""
    from fusegrad import Context, TinyJit

    class Model:
        def __init__(self):
            self.layers = [nn.Conv2d(1, 4, 3), Tensor.relu, nn.BatchNorm(4), Tensor.max_pool2d,
                           lambda x: x.flatten(1), nn.Linear(4 * 3 * 3, 10)]
        def plain(self, x): return x.sequential(self.layers)
        @function
        def __call__(self, x): return x.sequential(self.layers)

    def train(use_function):
        Tensor.manual_seed(3)
        m = Model()
        opt = nn.optim.Adam(get_parameters(m))
        X, Y = Tensor.randn(32, 1, 8, 8).realize(), Tensor.randint(32, high=10).realize()

        @TinyJit
        @Context(TRAINING=1)
        def step(xb, yb):
            opt.zero_grad()
            loss = (m(xb) if use_function else m.plain(xb)).sparse_categorical_crossentropy(yb).backward()
            return loss.realize(*opt.schedule_step())
        batches = [(X[i * 8:(i + 1) * 8].contiguous().realize(), Y[i * 8:(i + 1) * 8].contiguous().realize())
                   for i in range(4)]
        losses = [step(*batches[i % 4]).item() for i in range(5)]
        return losses, [p.numpy() for p in get_parameters(m)]
    (la, pa), (lb, pb) = train(True), train(False)
    np.testing.assert_allclose(la, lb, rtol=1e-5)
    for a, b in zip(pa, pb): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opts", [{}, {"precompile_backward": True}])
def test_unset_inputs_as_a_plain_call(opts):
    """An input whose requires_grad is unset gets the plain call's gradient (backward fills unset tensors, as
    tinygrad's does), and so does a flagged one."""
    a, b = _data()[0], _data()[1]
    x, w = Tensor(a), Tensor(b, requires_grad=True)
    function(**opts)(lambda x, w: (x @ w).tanh())(x, w).sum().backward()
    x2, w2 = Tensor(a), Tensor(b, requires_grad=True)
    (x2 @ w2).tanh().sum().backward()
    assert x.grad is not None and x2.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), x2.grad.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w.grad.numpy(), w2.grad.numpy(), rtol=1e-6, atol=1e-7)


def test_implicit_buffer_inside_a_captured_lazy_tensor():
    """A captured tensor that is still lazy (its realized base no longer held by any tensor) is implicit too."""
    w = Tensor([1.0, 2.0]).realize() * 2
    with pytest.raises(RuntimeError, match="1 implicit buffer"):
        function(lambda x: x + w)(Tensor([1.0, 1.0]))
    assert function(lambda x, w: x + w)(Tensor([1.0, 1.0]), w).tolist() == [3.0, 5.0]
