"""TinyJit's batched CPU replay (JIT_GRAPH, runtime/cpu_graph.py): runs of captured CPU kernels launched by one call
into C must give exactly what the launches one by one give (the same kernels: bit for bit), keep every piece of a
replay's bookkeeping (relayout skips, write versions, GlobalCounters), and match eager execution and PyTorch."""
import contextlib
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fusegrad import GlobalCounters, Tensor, TinyJit, Variable, nn
from fusegrad.device import Device
from fusegrad.helpers import Context
from fusegrad.runtime import cpu_graph
from fusegrad.runtime.ops_cpu import cpu_compiler, load_shared_object

pytestmark = pytest.mark.skipif(cpu_graph.runner() is None or not Device.DEFAULT.startswith("CPU"),
                                reason="the batched replay is the CPU device's, on targets whose ABI it knows")


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@contextlib.contextmanager
def counting():
    """Records the size of each batch run by a call into C."""
    seen: list[int] = []
    real = cpu_graph.Calls.run
    def run(self, words):
        seen.append(self.n)
        real(self, words)
    cpu_graph.Calls.run = run
    try: yield seen
    finally: cpu_graph.Calls.run = real


@pytest.fixture
def batches():
    with counting() as seen: yield seen


def modes(make, inputs, batches, exact_state=True):
    """make() -> (fn, state getter). The same program under TinyJit replayed batched (JIT_GRAPH=1) and launch by launch
    (JIT_GRAPH=0), and eagerly: outputs and state after each call are equal bit for bit between the two replays, and
    close to eager's. Returns the batched jit and its outputs."""
    (fb, sb), (fl, sl), (fe, se) = make(), make(), make()
    jb, jl = TinyJit(fb), TinyJit(fl)
    outs = []
    for i, args in enumerate(inputs):
        n = len(batches)
        with Context(JIT_GRAPH=1, JIT_VERIFY=0): ob = jb(*[Tensor(a) if isinstance(a, np.ndarray) else a for a in args])
        if i >= 2: assert len(batches) > n, f"call {i} (a replay) ran no batch"
        n = len(batches)
        with Context(JIT_GRAPH=0, JIT_VERIFY=0): ol = jl(*[Tensor(a) if isinstance(a, np.ndarray) else a for a in args])
        assert len(batches) == n, "JIT_GRAPH=0 ran a batch"
        oe = fe(*[Tensor(a) if isinstance(a, np.ndarray) else a for a in args])
        outs.append([o.numpy() for o in (ob if isinstance(ob, tuple) else (ob,))])
        for b, l, e in zip(*(o if isinstance(o, tuple) else (o,) for o in (ob, ol, oe))):
            np.testing.assert_array_equal(b.numpy(), l.numpy(), err_msg=f"call {i}")
            np.testing.assert_allclose(b.numpy(), e.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"call {i}")
        for b, l, e in zip(sb(), sl(), se()):
            np.testing.assert_array_equal(b, l, err_msg=f"state after call {i}")
            np.testing.assert_allclose(b, e, rtol=1e-5, atol=1e-5, err_msg=f"state after call {i}")
    assert jb.captured is not None and jb.captured.batched() > 0
    return jb, outs


def test_calls_pass_every_integer_argument_width():
    # the walker passes each argument in a 64-bit slot: int and long long arguments, in registers and on the stack
    # (past the 6th / 8th), a negative int, and the largest argument count it takes
    n = cpu_graph.MAX_ARGS
    params = ", ".join(["long long *out"] + [f"{'int' if i % 2 else 'long long'} a{i}" for i in range(1, n)])
    body = " ".join(f"out[{i - 1}] = (long long)a{i};" for i in range(1, n))
    lib = load_shared_object(cpu_compiler().compile(f"void many({params}) {{ {body} }}\n"
                                                    "void two(long long *out, int a) { out[0] = a * 2; }\n"))
    out = (ctypes.c_int64 * n)()
    vals = [(-i if i % 3 == 0 else i * 1000003) if i % 2 else (1 << 40) + i for i in range(1, n)]
    calls = cpu_graph.CallList()
    at = calls.add(ctypes.cast(lib.many, ctypes.c_void_p).value, [ctypes.addressof(out), *vals])
    skip = calls.add(ctypes.cast(lib.two, ctypes.c_void_p).value, [ctypes.addressof(out), 7])
    done = calls.build()
    words = done.fresh()
    words[skip] = 1                      # skipped: out[0] keeps many's value
    done.run(words)
    assert list(out)[:n - 1] == vals and at == 0
    words = done.fresh()                 # a fresh copy of the template: nothing skipped; a9 (an int on the stack)
    words[at + cpu_graph.HEADER + 9] = -5
    done.run(words)
    assert out[0] == 14 and out[8] == -5 and list(out)[1:8] == vals[1:8]
    with pytest.raises(ValueError, match="at most"): calls.add(0, [0] * (n + 1))


def test_mlp_training_step(batches):
    def make():
        Tensor.manual_seed(7)
        model = [nn.Linear(6, 16), nn.Linear(16, 3)]
        params = nn.state.get_parameters(model)
        opt = nn.optim.Adam(params, lr=0.01)
        def step(x, y):
            with Tensor.train():
                opt.zero_grad()
                loss = (model[1](model[0](x).relu()) - y).square().mean()
                loss.backward()
                opt.step()
                return loss.realize()
        return step, lambda: [p.numpy() for p in params]
    modes(make, [(rnd(4, 6, seed=i), rnd(4, 3, seed=10 + i)) for i in range(6)], batches)


def test_kv_cache_decode_with_symbolic_start_pos(batches):
    L, D = 12, 8
    pos_var = Variable("start_pos", 0, L - 1)
    wn = rnd(D, D, seed=1)

    def make():
        cache = Tensor.zeros(L, D).contiguous().realize()
        w = Tensor(wn).realize()
        def step(x, pos):
            cache[pos:pos + 1] = x @ w
            keys = cache[:pos + 1]
            return ((x @ keys.T).softmax(-1) @ keys).realize()
        return step, lambda: [cache.numpy()]
    xs = rnd(L, 1, D, seed=2)
    jb, _ = modes(make, [(xs[p], pos_var.bind(p)) for p in range(9)], batches)
    assert any(len(ln.prg.spec.vars) for ln in jb.captured.launches)   # the variable went through the batch's words
    ref = np.zeros((L, D), np.float32)
    for p in range(9): ref[p] = xs[p] @ wn
    out = jb(Tensor(xs[9]), pos_var.bind(9))
    ref[9] = xs[9] @ wn
    s = xs[9] @ ref[:10].T
    a = np.exp(s - s.max())
    np.testing.assert_allclose(out.numpy(), (a / a.sum()) @ ref[:10], rtol=1e-5, atol=1e-5)


def test_in_place_writes_are_seen_after_the_replay(batches):
    # the replay's in-place write moves the state's version: a result computed from it before is not served again
    # (a cached result held alive, and a relayout of the state, which the relayout cache keeps by version)
    a = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4)).realize()
    f = TinyJit(lambda: a.assign(a + 1).realize())
    for i in range(5):
        before = (a * 2).realize()
        before_t = a.T.contiguous().realize()
        f()
        want = np.arange(16).reshape(4, 4) + i
        np.testing.assert_array_equal(before.numpy(), want * 2)
        np.testing.assert_array_equal(before_t.numpy(), want.T)
        np.testing.assert_array_equal((a * 2).numpy(), (want + 1) * 2)
        np.testing.assert_array_equal(a.T.contiguous().numpy(), (want + 1).T)
    assert len(batches) == 3


@Context(JIT_VERIFY=0)
def test_relayout_skip_and_counters_match_launch_by_launch(batches):
    # a conv whose weight is re-laid out: replays after the first skip the copy (in the batch: its skip word), the
    # copy runs again once the weight is written; GlobalCounters count what ran, as launch by launch
    x = rnd(1, 16, 6, 6)
    wn = rnd(32, 16, 3, 3, seed=3)
    wb, wl = Tensor(wn).realize(), Tensor(wn.copy()).realize()   # (each its own relayout)
    fb, fl = TinyJit(lambda t: t.conv2d(wb).realize()), TinyJit(lambda t: t.conv2d(wl).realize())
    def counts(f, w, mode):
        GlobalCounters.reset()
        with Context(JIT_GRAPH=mode): out = f(Tensor(x)).numpy()
        ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w.numpy())).numpy()
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        return out, (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem)
    got = []
    for i in range(6):
        if i == 4:
            new = rnd(32, 16, 3, 3, seed=4)
            wb.assign(Tensor(new)).realize()
            wl.assign(Tensor(new)).realize()
        (ob, cb), (ol, cl) = counts(fb, wb, 1), counts(fl, wl, 0)
        np.testing.assert_array_equal(ob, ol)
        assert cb == cl, f"call {i}"
        got.append(cb[0])
    assert fb.captured is not None and any(ln.relayout is not None for ln in fb.captured.launches)
    assert got[3] == got[2] - 1 and got[4] == got[2] and got[5] == got[3]


def test_relayout_after_an_in_place_write_of_its_source_in_the_same_replay(batches):
    # the function writes the weight, then re-lays it out: on every replay the write comes first (in the batch's
    # bookkeeping too), so the copy is never skipped
    def make():
        w = Tensor(rnd(8, 4, 3, 3, seed=5)).realize()
        def f(t):
            w.assign(w * 0.5 + 0.25).realize()
            return t.conv2d(w).realize()
        return f, lambda: [w.numpy()]
    modes(make, [(rnd(1, 4, 5, 5, seed=i),) for i in range(6)], batches)


def test_copies_between_devices_break_the_batch(batches):
    # a copy to another device and back inside the capture runs between two batches
    def make():
        s = Tensor.zeros(5).contiguous().realize()
        def f(x):
            y = (x * 3).to("PYTHON") + 1
            s.assign(s + y.to(Device.DEFAULT) * 2).realize()
            return (s - 1).realize()
        return f, lambda: [s.numpy()]
    jb, _ = modes(make, [(rnd(5, seed=i),) for i in range(5)], batches)
    kinds = [type(p).__name__ for p in jb.captured.plan()]
    assert "_Launch" in kinds and kinds.count("_Batch") >= 2


def test_split_kernels_through_the_pool_trampoline():
    # with several threads, split kernels run through their _mt trampolines inside a batch (a child process: the
    # thread count is fixed when the CPU device is made)
    code = """
import numpy as np
from fusegrad import Tensor, TinyJit, Variable
from fusegrad.helpers import Context
from fusegrad.runtime import cpu_graph
pos_var = Variable("p", 0, 63)
outs = {}
for mode in (1, 0):
    cache = Tensor.zeros(64, 256).contiguous().realize()
    w = Tensor(np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)).realize()
    f = TinyJit(lambda x, p: (cache.__setitem__(slice(p, p + 1), x @ w), (cache[:p + 1] @ w).sum(0).realize())[1])
    res = []
    with Context(JIT_GRAPH=mode):
        for p in range(8): res.append(f(Tensor(np.full((1, 256), p / 7, np.float32)), pos_var.bind(p)).numpy())
    res.append(cache.numpy())
    outs[mode] = res
    if mode == 1:
        entries = [cpu_graph.c_entry(ln.prg) for ln in f.captured.launches]
        assert f.captured.batched() == len(entries) and any(e and len(e[1]) == 3 for e in entries), entries
for a, b in zip(outs[1], outs[0]): assert np.array_equal(a, b)
print("ok")
"""
    env = {**os.environ, "CPU_THREADS": "3", "JIT_VERIFY": "0"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


OPS = ["add", "mul", "relu", "sum0", "exp", "where", "inplace", "matmul"]


def program(ops, x, y, state, where, assign):
    """The random program's steps, on fusegrad or torch values (`where`, `assign`: the library's forms)."""
    z = x
    for op in ops:
        if op == "add": z = z + y
        elif op == "mul": z = z * 0.5
        elif op == "relu": z = z.relu()
        elif op == "sum0": z = z.sum(0, keepdim=True).expand(4, 4)
        elif op == "exp": z = (z * 0.1).exp()
        elif op == "where": z = where(z > 0, z, y)
        elif op == "matmul": z = z @ y
        elif op == "inplace":
            state = assign(state, state * 0.5 + z)
            z = z + state
    return z, state


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from(OPS), min_size=1, max_size=6), st.integers(0, 2**16))
def test_random_programs_match_eager_and_torch(ops, seed):
    # random small programs with state written in place: batched replays equal launch-by-launch ones bit for bit,
    # eager calls, and PyTorch doing the same steps
    rng = np.random.default_rng(seed)
    s0 = rng.standard_normal((4, 4)).astype(np.float32)
    inputs = [(rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((4, 4)).astype(np.float32))
              for _ in range(5)]
    def make():
        state = Tensor(s0).realize()
        def f(x, y):
            return program(ops, x, y, state, lambda c, a, b: c.where(a, b), lambda t, v: t.assign(v).realize())[0] \
                .realize()
        return f, lambda: [state.numpy()]
    with counting() as seen: _, outs = modes(make, inputs, seen)
    s = torch.tensor(s0)
    for (x, y), got in zip(inputs, outs):
        z, s = program(ops, torch.tensor(x), torch.tensor(y), s, torch.where, lambda t, v: v)
        np.testing.assert_allclose(got[0], z.numpy(), rtol=1e-4, atol=1e-4)


def test_llvm_device_kernels_are_batched_too(batches):
    pytest.importorskip("llvmlite")
    def make():
        s = Tensor.zeros(16, device="LLVM").contiguous().realize()
        def f(x):
            x = x.to("LLVM")   # (a copy between devices, then the LLVM kernels)
            return s.assign(s * 0.5 + (x @ x.T).sum(0)).realize()
        return f, lambda: [s.numpy()]
    jb, _ = modes(make, [(rnd(16, 16, seed=i),) for i in range(5)], batches)
    assert jb.captured.batched() >= 2 and any(ln.prg is None for ln in jb.captured.launches)


def test_a_kernel_with_more_arguments_than_the_walker_takes_runs_alone(batches):
    # 70 inputs summed in one kernel (71 buffers, past cpu_graph.MAX_ARGS): launched by itself between batches
    def make():
        s = Tensor.zeros(8).contiguous().realize()
        def f(*xs):
            y = (xs[0] * 2).realize()
            total = y
            for x in xs[1:]: total = total + x
            s.assign(s + total).realize()
            return (s * 3).realize()
        return f, lambda: [s.numpy()]
    jb, _ = modes(make, [tuple(rnd(8, seed=100 * c + i) for i in range(70)) for c in range(4)], batches)
    single = [p for p in jb.captured.plan() if type(p).__name__ == "_Launch"]
    assert single and all(ln.prg is not None and len(ln.args) > cpu_graph.MAX_ARGS for ln in single)
