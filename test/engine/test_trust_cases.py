"""Silently wrong results reported in issue 28, one test each: every one failed before its fix. The rule behind them
(docs/architecture.md, "Caches and captures: one rule"): a cached or captured value is used only while the memory it
read is unwritten, memory fusegrad can't see written is never cached, and fresh buffers are never shared by value."""
from __future__ import annotations

import gc
import os
import pathlib

import numpy as np
import pytest
import torch

from fusegrad import Tensor, TinyJit, dtypes, nn
from fusegrad.engine.jit import JitError


def test_jitted_eval_reads_the_weight_after_an_optimizer_step():
    """A conv weight relayout computed in the plain first call was captured as a constant (the README example's
    TinyJit eval: 69% instead of 81%)."""
    Tensor.manual_seed(0)
    c = nn.Conv2d(3, 8, 3)
    f = lambda x: c(x).sum(axis=(2, 3)).realize()   # noqa: E731
    fj = TinyJit(f)
    xs = [Tensor.randn(2, 3, 8, 8).realize() for _ in range(4)]
    fj(xs[0]); fj(xs[1])
    for step in range(2):
        c.weight.assign(c.weight * 2 + 1).realize()     # an optimizer step between replays
        np.testing.assert_allclose(fj(xs[2 + step]).numpy(), f(xs[2 + step]).numpy(), rtol=1e-5, atol=1e-4)


def test_jitted_eval_with_a_realized_weight_after_an_update():
    Tensor.manual_seed(1)
    c = nn.Conv2d(3, 4, 3)
    Tensor.realize(c.weight, c.bias)
    fj = TinyJit(lambda x: c(x).realize())
    x = Tensor.randn(1, 3, 6, 6).realize()
    for _ in range(3): fj(x)
    c.weight.assign(c.weight - 0.5).realize()
    ref = torch.nn.functional.conv2d(torch.tensor(x.numpy()), torch.tensor(c.weight.numpy()),
                                     torch.tensor(c.bias.numpy()))
    np.testing.assert_allclose(fj(x).numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_fresh_buffers_realized_together_are_distinct():
    """Two Tensor.zeros(4).contiguous() are the same node; realized in one call they shared one buffer, so a write to
    one changed the other (Adam's two step counters in tinygrad's gradaccum example)."""
    a, b = Tensor.zeros(4).contiguous(), Tensor.zeros(4).contiguous()
    Tensor.realize(a, b)
    a.assign(a + 1).realize()
    assert b.tolist() == [0.0] * 4 and a.tolist() == [1.0] * 4
    b1, b2 = Tensor.ones((1,)).contiguous(), Tensor.ones((1,)).contiguous()
    Tensor.realize(b1, b2)
    b1 *= 0.9
    b2 *= 0.999
    Tensor.realize(b1, b2)
    assert b1.item() == pytest.approx(0.9) and b2.item() == pytest.approx(0.999)


def test_same_graph_realized_twice_gives_separate_tensors():
    """The second tensor with the same graph is served the first one's result; writing it must not change the first."""
    x = Tensor([1.0, 2.0]).realize()
    y1, y2 = x * 2, x * 2
    y1.realize(); y2.realize()
    y2 += 1
    assert y1.tolist() == [2.0, 4.0] and y2.tolist() == [3.0, 5.0]
    y1 += 10
    assert y1.tolist() == [12.0, 14.0] and y2.tolist() == [3.0, 5.0] and x.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("make", [
    lambda x: x.unsqueeze(0).sum(0), lambda x: x.unsqueeze(0).max(0), lambda x: x.unsqueeze(0).prod(0),
    lambda x: x.repeat(1), lambda x: x.repeat_interleave(1), lambda x: Tensor.cat(x), lambda x: x.pad(((0, 0),)),
], ids=["sum", "max", "prod", "repeat", "repeat_interleave", "cat", "pad0"])
@pytest.mark.parametrize("lazy", [False, True])
def test_new_tensors_that_are_only_a_reshape_are_not_views(make, lazy):
    """A reduce over size-1 axes is a reshape of its input, but a new tensor, as in torch: a write through it (or a
    view of it) must not reach the input, and the input's writes must not reach it."""
    x = Tensor([1.0, 2.0, 3.0])
    x = (x * 1.0) if lazy else x.realize()
    y = make(x)
    y[1:2].assign(Tensor([10.0])).realize()
    assert x.tolist() == [1.0, 2.0, 3.0] and y.tolist() == [1.0, 10.0, 3.0]
    z = make(x)
    x[0:1].assign(Tensor([-1.0])).realize()
    assert z.tolist() == [1.0, 2.0, 3.0]


def test_relayout_of_dlpack_memory_is_not_cached():
    """A conv weight shared with torch through DLPack and written by torch: the cached relayout went stale."""
    w_t = torch.randn(8, 3, 3, 3)
    w = Tensor.from_dlpack(w_t)
    x = Tensor.randn(16, 3, 8, 8).realize()
    a = x.conv2d(w).numpy()
    w_t.mul_(2)
    np.testing.assert_allclose(x.conv2d(w).numpy(), 2 * a, rtol=1e-5, atol=1e-4)


def test_tinyjit_compares_arrays_by_value():
    """A NumPy argument is baked into the capture: one with other values (the same array written in place, or a
    new one that CPython put at the freed one's id) must raise, not replay the old values."""
    @TinyJit
    def f(x, arr): return (x + Tensor(arr)).realize()
    x = Tensor([0.0, 0.0]).realize()
    a = np.array([1.0, 1.0], dtype=np.float32)
    for _ in range(3): assert f(x, a).tolist() == [1.0, 1.0]
    assert f(x, np.array([1.0, 1.0], dtype=np.float32)).tolist() == [1.0, 1.0]   # equal values: fine
    a[:] = 5
    with pytest.raises(JitError, match="non-Tensor"): f(x, a)


def test_tinyjit_compares_other_objects_by_identity_not_id():
    class Opt: pass
    @TinyJit
    def g(x, o): return (x + 1).realize()
    x = Tensor([0.0]).realize()
    o = Opt()
    for _ in range(3): g(x, o)
    del o
    gc.collect()
    others = [Opt() for _ in range(64)]   # one of them may well sit at the freed object's id
    for p in others:
        with pytest.raises(JitError, match="non-Tensor"): g(x, p)


def _disk(path: pathlib.Path) -> Tensor:
    return Tensor(path, dtype=dtypes.float32)


@pytest.mark.parametrize("how", ["same tensor", "other spelling", "symlink", "hard link"])
def test_lazy_read_of_a_file_keeps_its_bytes_across_a_write(tmp_path, how):
    p = tmp_path / "f.bin"
    p.write_bytes(np.zeros(4, np.float32).tobytes())
    other = {"same tensor": p, "other spelling": tmp_path / "." / "f.bin", "symlink": tmp_path / "link.bin",
             "hard link": tmp_path / "hard.bin"}[how]
    if how == "symlink": os.symlink(p, other)
    if how == "hard link": os.link(p, other)
    t = _disk(p)
    lazy = t.to("CPU") + 1
    _disk(other).assign(Tensor([5.0, 6.0, 7.0, 8.0]))
    assert lazy.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert (t.to("CPU") + 0).tolist() == [5.0, 6.0, 7.0, 8.0]   # a read built after the write sees it


def test_cached_read_of_a_file_sees_a_write_through_another_path(tmp_path):
    p = tmp_path / "g.bin"
    p.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink(p, tmp_path / "l.bin")
    t = _disk(p)
    assert (t.to("CPU") * 2).tolist() == [0.0, 2.0, 4.0, 6.0]
    _disk(tmp_path / "l.bin").assign(Tensor([1.0, 1.0, 1.0, 1.0]))
    assert (t.to("CPU") * 2).tolist() == [2.0, 2.0, 2.0, 2.0]


def test_sharded_pending_write_runs_once():
    t = Tensor([0.0, 0.0, 0.0, 0.0]).shard(("CPU", "CPU:1"), axis=0).realize()
    t += 1
    assert t.tolist() == [1.0] * 4
    t += 1
    assert t.tolist() == [2.0] * 4


def _gradaccum_program(steps: int = 3, acc: int = 3) -> tuple[list[float], list[float]]:
    """The shape of tinygrad's examples/gradaccum_mnist.py on synthetic data: a jitted micro-batch function returns
    the flat gradients, they are summed over micro-batches, a functional Adam whose state (two zeros, two ones,
    realized together) is updated with assign, and the parameters written with assign outside any jitted function;
    then a jitted evaluation. Returns (losses, evaluations)."""
    from fusegrad.nn.state import get_parameters
    Tensor.manual_seed(3)
    rng = np.random.default_rng(0)
    X = Tensor(rng.standard_normal((64, 1, 6, 6)).astype(np.float32))
    Y = Tensor(rng.integers(0, 4, 64).astype(np.int32))
    conv, lin = nn.Conv2d(1, 4, 3), nn.Linear(4 * 16, 4)
    model = lambda x: lin(conv(x).relu().flatten(1))   # noqa: E731
    params = get_parameters([conv, lin])
    for p in params: p.requires_grad_()
    sizes = [p.numel() for p in params]
    total = sum(sizes)
    m, v = Tensor.zeros(total).contiguous(), Tensor.zeros(total).contiguous()
    b1_t, b2_t = Tensor.ones((1,)).contiguous(), Tensor.ones((1,)).contiguous()
    Tensor.realize(m, v, b1_t, b2_t)

    @TinyJit
    def microbatch(i: Tensor) -> tuple[Tensor, Tensor]:
        with Tensor.train():
            for p in params: p.grad = None
            loss = model(X[i]).sparse_categorical_crossentropy(Y[i]).backward()
            return loss.realize(), Tensor.cat(*[p.grad.flatten() for p in params]).contiguous().realize()

    @TinyJit
    def evaluate() -> Tensor: return model(X).sum(1).realize()

    losses, evals = [], []
    for step in range(steps):
        grads = Tensor.zeros(total).contiguous()
        for k in range(acc):
            idx = Tensor(np.arange(8 * k + step, 8 * k + step + 8, dtype=np.int32))
            loss, g = microbatch(idx)
            grads = grads + g / acc
            Tensor.realize(loss, grads)
            losses.append(loss.item())
        b1_t *= 0.9
        b2_t *= 0.999
        m.assign(0.9 * m + 0.1 * grads)
        v.assign(0.999 * v + 0.001 * grads * grads)
        delta = 0.01 * (m / (1 - b1_t)) / ((v / (1 - b2_t)).sqrt() + 1e-6)
        at = 0
        for p, n in zip(params, sizes):
            p.assign(p.detach() - delta[at:at + n].reshape(p.shape))
            at += n
        Tensor.realize(*params, m, v, b1_t, b2_t)
        evals.append(evaluate().numpy().tolist())
    return losses, evals


def test_gradient_accumulation_across_jitted_functions_matches_eager():
    """tinygrad's gradaccum example went NaN, then didn't learn: the jitted micro-batch function kept reading the
    parameters another function updated with assign."""
    from fusegrad import Context
    jl, je = _gradaccum_program()
    with Context(JIT=0): el, ee = _gradaccum_program()
    np.testing.assert_allclose(jl, el, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(je, ee, rtol=1e-4, atol=1e-4)
    assert all(np.isfinite(jl)) and jl[-1] < jl[0]


def test_dlpack_export_of_a_shared_result_does_not_alias_the_other_tensor():
    """Two tensors with one graph realized together hold one buffer until either is written; exporting one through
    DLPack (then writing it from NumPy) must not change the other."""
    a, b = Tensor.zeros(3).contiguous(), Tensor.zeros(3).contiguous()
    Tensor.realize(a, b)
    arr = np.from_dlpack(b)
    arr[:] = 7
    assert a.tolist() == [0.0, 0.0, 0.0] and b.tolist() == [7.0, 7.0, 7.0]


def test_dlpack_export_by_the_owner_does_not_alias_a_tensor_served_its_result():
    x = Tensor([1.0, 2.0]).realize()
    y1, y2 = x * 2, x * 2
    y1.realize(); y2.realize()           # y2 is served y1's buffer
    arr = np.from_dlpack(y1)
    arr[:] = 0
    assert y2.tolist() == [2.0, 4.0] and y1.tolist() == [0.0, 0.0]


def test_view_of_a_whole_parameter_across_optimizer_steps():
    """A view spanning the whole parameter (w[0:3] is w's own node) recorded a history under w's key, so the second
    backward hung (then raised 'modified by an in-place operation'); torch trains on."""
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.1)
    v = w[0:3]
    wt = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    opt_t = torch.optim.SGD([wt], lr=0.1)
    c = [1.0, 2.0, 3.0]
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad(); (w * Tensor(c)).sum().backward(); opt.step()
            opt_t.zero_grad(); (wt * torch.tensor(c)).sum().backward(); opt_t.step()
    np.testing.assert_allclose(w.numpy(), wt.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), wt.detach().numpy(), rtol=1e-6)


def test_write_through_a_view_after_a_step_keeps_the_parameter_in_autograd():
    """`v += 1` (no_grad) through a view of a weight after opt.step() left the weight's node a pending write rebuilt
    on its history, so the next backward gave its .grad None."""
    w = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    wt = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    opt, opt_t = nn.optim.SGD([w], lr=0.1), torch.optim.SGD([wt], lr=0.1)
    x, xt = Tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.0]])
    v, vt = w[1:2], wt[1:2]
    with Tensor.train():
        (x @ w.T).sum().backward(); opt.step()
        (xt @ wt.T).sum().backward(); opt_t.step()
        with _no_grad(): v += 1.0
        with torch.no_grad(): vt += 1.0
        opt.zero_grad(); opt_t.zero_grad()
        (x @ w.T).sum().backward(); (xt @ wt.T).sum().backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy())
    np.testing.assert_allclose(w.numpy(), wt.detach().numpy(), rtol=1e-6)


class _no_grad:
    """Tensor.no_grad for a block (what torch.no_grad() is to torch)."""
    def __enter__(self) -> None: self.prev, Tensor.no_grad = Tensor.no_grad, True
    def __exit__(self, *a: object) -> None: Tensor.no_grad = self.prev


def test_a_write_that_failed_to_schedule_is_not_run_by_a_later_capture(monkeypatch):
    """The program fuzzer's finding 7: a realize that raised left its pending write registered, and TinyJit, which
    runs every live tensor's pending writes before a capture, raised the same error in the next, unrelated programs."""
    import fusegrad.schedule as sched
    w = Tensor([1.0, 2.0]).contiguous().realize()
    w += 1
    bad, real = w.uop, sched.create_schedule
    def schedule(uops):   # this one write can't be scheduled (as one reading a value a later write destroyed)
        if bad in uops: raise RuntimeError("cannot schedule this write")
        return real(uops)
    monkeypatch.setattr(sched, "create_schedule", schedule)
    with pytest.raises(RuntimeError, match="cannot schedule"): w.realize()
    f = TinyJit(lambda x: (x * 2).realize())
    x = Tensor([1.0, 3.0]).realize()
    assert [f(x).tolist() for _ in range(3)][-1] == [2.0, 6.0]
    with pytest.raises(RuntimeError, match="cannot schedule"): w.tolist()   # reading it still raises


def test_jitted_train_step_after_an_eager_conv_call_replays_the_new_weights():
    """An eager conv call between the first TinyJit call and the capture filled the relayout cache; the capture's
    read-order snapshot (the loss, realized after opt.step) copied that cached relayout, so every replay read the
    weights of capture time (the program fuzzer's seeds 2028, 3020, 3176: replay loss off by ~1e-3 to 2e-2)."""
    def run(jit: bool) -> list[float]:
        Tensor.manual_seed(0)
        rng = np.random.default_rng(0)
        xs = [Tensor(rng.standard_normal((4, 3, 6, 6)).astype(np.float32)) for _ in range(4)]
        ys = [Tensor(rng.integers(0, 5, 4).astype(np.int32)) for _ in range(4)]
        conv, fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)
        opt = nn.optim.SGD([conv.weight, conv.bias, fc.weight, fc.bias], lr=0.1, weight_decay=0.01)
        def train(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            loss = fc(conv(x).relu().mean((2, 3))).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            return loss.realize()
        step = TinyJit(train) if jit else train
        with Tensor.train(): out = [step(xs[0], ys[0]).item()]
        kept = conv(xs[1]).realize()   # an eager call whose output stays alive
        with Tensor.train(): out += [step(xs[i], ys[i]).item() for i in (1, 3, 2, 0)]
        assert kept.shape == (4, 8, 6, 6)
        return out
    np.testing.assert_allclose(run(True), run(False), rtol=1e-5, atol=1e-6)


# ----- found by the program fuzzer (test/fuzz/programs.py), after the cases above were fixed -----

def test_gradient_accumulated_with_assign_after_a_write_through_an_old_view():
    """backward() built the gradient on a rebuilt copy of the parameter's pending write (its history expanded), so
    realizing the gradient ran that write again, or raised that its memory had changed (fuzzer seed 1001)."""
    w = Tensor.ones(5, 8).contiguous().realize()
    w.requires_grad = True
    acc = Tensor.zeros(5, 8).contiguous().realize()
    v = w[1:2]                                       # a view kept across the steps
    W, A = np.ones((5, 8), np.float32), np.zeros((5, 8), np.float32)
    for _ in range(3):
        w.grad = None
        loss = (w * w).sum()
        loss.backward()
        acc.assign(acc + w.grad)
        loss.realize()
        A += 2 * W
        w.assign(w.detach() - 0.01 * acc).realize()
        W -= 0.01 * A
        prev, Tensor.no_grad = Tensor.no_grad, True   # (as torch requires for a leaf's view)
        try: v += -0.5                               # written through the old view: a pending write of w
        finally: Tensor.no_grad = prev
        W[1:2] += -0.5
    w.grad = None
    (w * w).sum().backward()
    acc.assign(acc + w.grad)
    np.testing.assert_allclose(acc.numpy(), A + 2 * W, rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), W, rtol=1e-6)


def test_sharded_write_after_a_realized_slice_write_runs_once():
    """A write to a sharded copy, realized as part of another graph after the graph below it was cached, was recorded
    under the lowering's rebuilt node: the tensor kept its pending write, ran it again later, and then raised (fuzzer
    seed 3006, through safe_save and load_state_dict)."""
    b = Tensor([1.0, 2.0, 3.0]).contiguous().realize()
    b.requires_grad = True
    prev, Tensor.no_grad = Tensor.no_grad, True
    try:
        b[2:3] += -0.5
        s = b.shard(("CPU", "CPU:1"), axis=0)
        s += -0.5
        np.testing.assert_equal(s.numpy(), [0.5, 1.5, 2.0])
        s += 1.0
        b.assign(s.to("CPU"))
        np.testing.assert_equal(b.contiguous().numpy(), [1.5, 2.5, 3.0])
        np.testing.assert_equal(s.numpy(), [1.5, 2.5, 3.0])
        b.assign(Tensor([7.0, 8.0, 9.0]))
        np.testing.assert_equal(b.numpy(), [7.0, 8.0, 9.0])
    finally:
        Tensor.no_grad = prev


def test_backward_ignores_the_stale_history_of_a_view_written_under_no_grad():
    """A kept view of a parameter, written under no_grad after jitted gradient-accumulation steps, left its old history
    in the parameter's graph below a DETACH; backward() expanded it anyway and refused the next step as "modified by an
    in-place operation" (fuzzer seed 4161). No gradient flows below a DETACH, so its history isn't needed."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4)).astype(np.float32)
    xs, ys = rng.standard_normal((4, 4, 4)).astype(np.float32), rng.standard_normal((4, 4, 3)).astype(np.float32)
    w, b = Tensor(w0).contiguous().realize(), Tensor.zeros(3).contiguous().realize()
    w.requires_grad = b.requires_grad = True
    params = [w, b]
    opt = nn.optim.SGD(params, lr=0.01)
    acc = [Tensor.zeros(*p.shape).contiguous().realize() for p in params]
    tw, tb = torch.tensor(w0, requires_grad=True), torch.zeros(3, requires_grad=True)
    topt = torch.optim.SGD([tw, tb], lr=0.01)
    tacc = [torch.zeros(3, 4), torch.zeros(3)]

    def micro(x: Tensor, y: Tensor) -> Tensor:
        for p in params: p.grad = None
        loss = ((x @ w.T + b - y) ** 2).mean()
        loss.backward()
        for a, p in zip(acc, params): a.assign(a + p.grad)
        return loss.realize()

    def apply() -> None:
        for a, p in zip(acc, params): p.grad = a * 0.5
        opt.step()
        for a in acc: a.assign(a * 0)

    def train(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = ((x @ w.T + b - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.realize()

    def tloss(i: int) -> torch.Tensor: return ((torch.tensor(xs[i]) @ tw.T + tb - torch.tensor(ys[i])) ** 2).mean()
    micro_j, apply_j, train_j = TinyJit(micro), TinyJit(apply), TinyJit(train)
    v = b[2:3]
    with Tensor.train():
        for r in range(2):
            for i in (2 * r, 2 * r + 1):
                got = micro_j(Tensor(xs[i]), Tensor(ys[i])).item()
                tw.grad = tb.grad = None
                loss = tloss(i)
                loss.backward()
                tacc[0] += tw.grad
                tacc[1] += tb.grad
                np.testing.assert_allclose(got, loss.item(), rtol=1e-5)
            apply_j()
            tw.grad, tb.grad = tacc[0] * 0.5, tacc[1] * 0.5
            topt.step()
            tacc = [torch.zeros(3, 4), torch.zeros(3)]
        prev, Tensor.no_grad = Tensor.no_grad, True
        try: v += 1.0
        finally: Tensor.no_grad = prev
        with torch.no_grad(): tb[2:3] += 1.0
        got = train_j(Tensor(xs[3]), Tensor(ys[3])).item()
        topt.zero_grad()
        loss = tloss(3)
        loss.backward()
        topt.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_finished_training_program_is_freed():
    """The node cache's keys held each node's sources, and a custom backward (BatchNorm's) held the module whose
    weight's pending write holds the nodes above it: the cache, a global, kept every finished program alive (the fuzzer
    grew by a model per program). Now nothing outlives the program."""
    import weakref

    def program() -> list[weakref.ref]:
        Tensor.manual_seed(0)
        conv, bn, fc = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2)
        params = nn.state.get_parameters([conv, bn, fc])
        opt = nn.optim.SGD(params, lr=0.1)
        x, y = Tensor.randn(2, 3, 6, 6), Tensor([0, 1])
        with Tensor.train():
            for _ in range(2):
                opt.zero_grad()
                fc(bn(conv(x)).relu().mean((2, 3))).sparse_categorical_crossentropy(y).backward()
                opt.step()
        return [weakref.ref(t) for t in params + [bn.running_mean, bn.running_var]]

    refs = program()
    gc.collect()
    assert [r for r in refs if r() is not None] == []
