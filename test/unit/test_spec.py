"""The SPEC=1 verifiers: real programs pass every stage, hand-built illegal graphs fail at the right one."""
import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.device import Device
from fusegrad.dtype import dtypes
from fusegrad.engine import realize
from fusegrad.helpers import Context
from fusegrad.ir import spec
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.spec import verify_kernel, verify_linear, verify_tensor_graph

F32, I32 = dtypes.float32, dtypes.int32
rng = np.random.default_rng(0)
A = rng.standard_normal((4, 6)).astype(np.float32)
B = rng.standard_normal((6, 5)).astype(np.float32)
M = rng.standard_normal((64, 64)).astype(np.float32)
N = rng.integers(-10, 10, (4, 6)).astype(np.int32)


def softmax(x):
    e = (x - x.max(1, keepdim=True)).exp()
    return e / e.sum(1, keepdim=True)


PROGRAMS = {
    "elementwise": (lambda: Tensor(A) * 2 + 1, lambda: A * 2 + 1),
    "matmul_bias_relu": (lambda: (Tensor(A) @ Tensor(B) + Tensor(B[0])).relu(), lambda: np.maximum(A @ B + B[0], 0)),
    "softmax": (lambda: softmax(Tensor(A)), lambda: np.exp(A - A.max(1, keepdims=True)) /
                np.exp(A - A.max(1, keepdims=True)).sum(1, keepdims=True)),
    "x_minus_sum": (lambda: Tensor(A) - Tensor(A).sum(0), lambda: A - A.sum(0)),
    "movement": (lambda: Tensor(A).pad(((1, 1), (2, 0)))[1:4, ::2].flip(0).T + 1,
                 lambda: np.pad(A, ((1, 1), (2, 0)))[1:4, ::2][::-1].T + 1),
    "int_ops": (lambda: (Tensor(N) // 3) + (Tensor(N) << 1) + (Tensor(N) & 3) + Tensor(N).maximum(2),
                lambda: (N // 3) + (N << 1) + (N & 3) + np.maximum(N, 2)),
    "compare_where_cast": (lambda: (Tensor(A) < 0).where(Tensor(A), 0.5) + (Tensor(A) != 1).float(),
                           lambda: np.where(A < 0, A, 0.5) + (A != 1).astype(np.float32)),
    "reductions": (lambda: Tensor(A).sum() + Tensor(A).max() + Tensor(A).mean(), lambda: A.sum() + A.max() + A.mean()),
    "arange": (lambda: Tensor.arange(12).reshape(3, 4).sum(1) * 2, lambda: np.arange(12).reshape(3, 4).sum(1) * 2),
    "gather": (lambda: Tensor(A).gather(1, Tensor(np.array([[0, 5], [1, 1], [2, 0], [3, 4]], dtype=np.int32))) * 2,
               lambda: np.take_along_axis(A, np.array([[0, 5], [1, 1], [2, 0], [3, 4]]), 1) * 2),
    "bitcast": (lambda: Tensor(A).bitcast(dtypes.int32) & 0xFF, lambda: A.view(np.int32) & 0xFF),
    "assign": (lambda: (lambda t: t.assign(t * 2 + 1))(Tensor(A).contiguous().realize()), lambda: A * 2 + 1),
    # big enough for the VECTORIZE/UPCAST actions: vector INDEX/LOAD/STORE, VECTORIZE and GEP in the linear program
    "vectorized matmul": (lambda: Tensor(M) @ Tensor(M).T + 1, lambda: M @ M.T + 1),
    "vectorized softmax": (lambda: Tensor(M).softmax(1), lambda: np.exp(M - M.max(1, keepdims=True)) /
                           np.exp(M - M.max(1, keepdims=True)).sum(1, keepdims=True)),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_real_programs_pass_all_stages(name, monkeypatch):
    build, ref = PROGRAMS[name]
    calls = {"tensor": 0, "kernel": 0, "linear": 0}

    def counting(stage, fn):
        def wrapped(x):
            calls[stage] += 1
            return fn(x)
        return wrapped
    monkeypatch.setattr(spec, "verify_tensor_graph", counting("tensor", verify_tensor_graph))
    monkeypatch.setattr(spec, "verify_kernel", counting("kernel", verify_kernel))
    monkeypatch.setattr(spec, "verify_linear", counting("linear", verify_linear))
    monkeypatch.setattr(realize, "_programs", {})  # compile again so codegen runs (and verifies) every kernel
    with Context(SPEC=1):
        out = build().numpy()
    np.testing.assert_allclose(out, ref(), rtol=1e-5, atol=1e-5)
    assert calls["tensor"] >= 1 and calls["kernel"] >= 1 and calls["kernel"] == calls["linear"]


def test_real_program_stages_directly():
    from fusegrad.codegen import to_program
    t = (Tensor(A) @ Tensor(B)).relu().sum(0)
    verify_tensor_graph(UOp(Ops.SINK, src=(t.uop,)))
    for si in t.schedule():
        verify_kernel(si.ast)
        verify_linear(to_program(si.ast, Device[Device.DEFAULT].renderer).uops)


def test_backward_graph_passes():
    x = Tensor(A, requires_grad=True)
    with Context(SPEC=1):
        (x @ Tensor(B)).relu().sum().backward()
        g = x.grad.numpy()
    np.testing.assert_allclose(g, ((A @ B) > 0).astype(np.float32) @ B.T, rtol=1e-5, atol=1e-5)


# ----- tensor stage ----------------------------------------------------------------------------------------------------

DEV = UOp(Ops.DEVICE, arg="CPU")
BUF = UOp(Ops.BUFFER, F32, (DEV,), (10**9, 16))
BUF_I = UOp(Ops.BUFFER, I32, (DEV,), (10**9 + 1, 16))
X44 = UOp(Ops.RESHAPE, F32, (BUF,), (4, 4))
X28 = UOp(Ops.RESHAPE, F32, (BUF,), (2, 8))
I44 = UOp(Ops.RESHAPE, I32, (BUF_I,), (4, 4))


def sink(*xs): return UOp(Ops.SINK, src=xs)


def test_tensor_stage_accepts_hand_built_valid_graph():
    verify_tensor_graph(sink(UOp(Ops.REDUCE_AXIS, F32, (UOp(Ops.ADD, F32, (X44, X44)),), (Ops.ADD, (1,)))))


@pytest.mark.parametrize("bad,op", [
    (UOp(Ops.ADD, F32, (X44, X28)), "ADD"),                                          # shapes differ
    (UOp(Ops.ADD, F32, (X44, I44)), "ADD"),                                          # dtypes differ
    (UOp(Ops.WHERE, F32, (X44, X44, X44)), "WHERE"),                                 # condition not bool
    (UOp(Ops.CMPLT, F32, (X44, X44)), "CMPLT"),                                      # comparison not bool
    (UOp(Ops.REDUCE_AXIS, F32, (X44,), (Ops.IDIV, (1,))), "REDUCE_AXIS"),             # not a reduce op
    (UOp(Ops.REDUCE_AXIS, F32, (X44,), (Ops.ADD, (2,))), "REDUCE_AXIS"),              # axis out of range
    (UOp(Ops.REDUCE_AXIS, F32, (X44,), Ops.ADD), "REDUCE_AXIS"),                     # arg not (op, axes)
    (UOp(Ops.RESHAPE, F32, (BUF,), (3, 5)), "RESHAPE"),                              # wrong element count
    (UOp(Ops.PERMUTE, F32, (X44,), (0, 0)), "PERMUTE"),                              # not a permutation
    (UOp(Ops.EXPAND, I32, (X44,), (4, 4)), "EXPAND"),                                # changes the dtype
    (UOp(Ops.LOAD, F32, (UOp(Ops.INDEX, F32, (UOp(Ops.PARAM, F32.ptr(16), (), 1), UOp.const(I32, 0))),)),
     "PARAM"),                                                                        # kernel-level ops
    (UOp(Ops.ADD, F32, (X44, UOp.const(F32, 1.0))), "CONST"),                        # CONST without a DEVICE
    (UOp(Ops.BITCAST, dtypes.float64, (X44,)), "BITCAST"),                           # bit widths differ
    (UOp(Ops.GATHER, F32, (X44, X44), 1), "GATHER"),                                 # float index
    (UOp(Ops.GATHER, F32, (X44, I44), 2), "GATHER"),                                 # axis out of range
    (UOp(Ops.ASSIGN, F32, (UOp(Ops.ADD, F32, (X44, X44)), X44), 7), "ASSIGN"),        # target has no buffer
    (UOp(Ops.ASSIGN, F32, (X44, UOp(Ops.CAST, F32, (X28,))), 7), "ASSIGN"),           # shapes differ
])
def test_tensor_stage_rejects(bad, op):
    with pytest.raises(RuntimeError, match=rf"SPEC tensor stage.*Ops\.{op}"):
        verify_tensor_graph(sink(bad))


def test_tensor_stage_root_must_be_sink():
    with pytest.raises(RuntimeError, match="SPEC tensor stage.*SINK"):
        verify_tensor_graph(X44)


def test_scheduler_runs_the_tensor_spec():
    from fusegrad.schedule import create_schedule
    bad = UOp(Ops.WHERE, F32, (X44, X44, X44))
    with Context(SPEC=1), pytest.raises(RuntimeError, match="SPEC tensor stage"):
        create_schedule([bad])


# ----- kernel stage ----------------------------------------------------------------------------------------------------

OUT = UOp(Ops.PARAM, F32.ptr(16), (), 0)
IN = UOp(Ops.PARAM, F32.ptr(16), (), 1)
R = UOp.range(16, 0, "global")
RR = UOp.range(4, 1, "reduce")


def store(val, idx=R, buf=OUT):
    return sink(UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, buf.dtype.base, (buf, idx)), val)))


def load(buf=IN, idx=R):
    return UOp(Ops.LOAD, buf.dtype.base, (UOp(Ops.INDEX, buf.dtype.base, (buf, idx)),))


def test_kernel_stage_accepts_hand_built_valid_kernel():
    verify_kernel(store(UOp(Ops.REDUCE, F32, (load(idx=R // 4 * 4 + RR) * 2.0, RR), Ops.ADD) + 1.0))
    # a loop of symbolic size: a variable (a Variable in a shape), or an expression of one
    n = UOp.variable("n", 1, 4)
    verify_kernel(store(load(idx=UOp(Ops.RANGE, I32, (n * 4,), (0, "global")))))


@pytest.mark.parametrize("bad,op", [
    (store(UOp(Ops.RESHAPE, F32, (load(),), (16,))), "RESHAPE"),                     # tensor op left over
    (store(UOp(Ops.REDUCE_AXIS, F32, (load(),), (Ops.ADD, (0,)))), "REDUCE_AXIS"),
    (store(load(buf=UOp(Ops.BUFFER, F32.ptr(16), (), (1, 16)))), "BUFFER"),           # loads a BUFFER
    (store(load(idx=UOp(Ops.RANGE, I32, (load(buf=UOp(Ops.PARAM, I32.ptr(16), (), 2)),), (0, "global")))),
     "RANGE"),                                                  # size read from memory (neither const nor a variable)
    (store(load(idx=UOp(Ops.RANGE, I32, (UOp.const(I32, 0),), (0, "global")))), "RANGE"),      # empty loop
    (store(UOp(Ops.REDUCE, F32, (load(), UOp.const(I32, 4)), Ops.ADD)), "REDUCE"),  # src not a RANGE
    (store(UOp(Ops.REDUCE, F32, (load(),), Ops.ADD)), "REDUCE"),                    # no RANGE at all
    (store(UOp(Ops.REDUCE, F32, (load(), RR), Ops.IDIV)), "REDUCE"),                # not a reduce op
    (store(UOp(Ops.REDUCE, I32, (load(), RR), Ops.ADD)), "REDUCE"),                 # dtype changes
    (store(UOp.const(I32, 1)), "STORE"),                                              # int into a float buffer
    (store(UOp(Ops.ADD, F32, (load(), UOp.const(I32, 1)))), "ADD"),                   # mixed dtypes
    (store(UOp(Ops.SQRT, I32, (UOp.const(I32, 4),))), "SQRT"),                        # transcendental on ints
    (store(load(idx=UOp.const(F32, 1.0))), "INDEX"),                                  # float index
    (sink(UOp(Ops.STORE, dtypes.void, (load(), load()))), "STORE"),                     # target not an INDEX
    (sink(load()), "SINK"),                                                           # SINK of a non-STORE
    (store(load(buf=UOp(Ops.PARAM, I32.ptr(16), (), 0)).cast(F32)), "PARAM"),       # two PARAM 0
])
def test_kernel_stage_rejects(bad, op):
    with pytest.raises(RuntimeError, match=rf"SPEC kernel stage.*Ops\.{op}"):
        verify_kernel(bad)


def test_codegen_runs_the_kernel_spec():
    from fusegrad.codegen import to_program
    with Context(SPEC=1), pytest.raises(RuntimeError, match="SPEC kernel stage"):
        to_program(store(UOp(Ops.RESHAPE, F32, (load(),), (16,))), Device[Device.DEFAULT].renderer)


# ----- linear stage ----------------------------------------------------------------------------------------------------

def _linear_program():
    """for r in 16: out[r] = in[r] * 2"""
    two = UOp.const(F32, 2.0)
    size = UOp.const(I32, 16)
    rng_ = UOp(Ops.RANGE, I32, (size,), (0, "global"))
    idx_in = UOp(Ops.INDEX, F32, (IN, rng_))
    ld = UOp(Ops.LOAD, F32, (idx_in,))
    mul = UOp(Ops.MUL, F32, (ld, two))
    idx_out = UOp(Ops.INDEX, F32, (OUT, rng_))
    st = UOp(Ops.STORE, dtypes.void, (idx_out, mul))
    end = UOp(Ops.END, dtypes.void, (rng_,))
    return [OUT, IN, two, size, rng_, idx_in, ld, mul, idx_out, st, end]


def test_linear_stage_accepts_hand_built_program():
    verify_linear(_linear_program())


def _mutations():
    p = _linear_program()
    OUT_, IN_, two, size, rng_, idx_in, ld, mul, idx_out, st, end = p
    r2 = UOp(Ops.RANGE, I32, (size,), (1, "global"))
    yield "REDUCE", p[:7] + [UOp(Ops.REDUCE, F32, (ld, rng_), Ops.ADD)] + p[7:]           # not a linear op
    yield "MUL", [OUT_, IN_, two, size, rng_, idx_in, mul, ld, idx_out, st, end]           # used before defined
    yield "RANGE", p[:-1]                                                                   # RANGE never closed
    yield "END", p + [end]                                                                  # a second END
    yield "END", p[:5] + [r2] + p[5:] + [UOp(Ops.END, dtypes.void, (r2,))]                 # ENDs out of order
    yield "STORE", p[:9] + [UOp(Ops.STORE, dtypes.void, (ld, mul))] + p[10:]              # target not an INDEX
    yield "STORE", p[:9] + [UOp.const(I32, 1), UOp(Ops.STORE, dtypes.void, (idx_out, UOp.const(I32, 1)))] + p[10:]
    yield "ADD", p + [UOp(Ops.ADD, F32, (mul, two))]                                        # mul is out of scope
    yield "RANGE", [OUT_, IN_, two, UOp(Ops.RANGE, I32, (two,), (0, "global"))]             # float loop bound


@pytest.mark.parametrize("bad,op", [(b, op) for op, b in _mutations()])
def test_linear_stage_rejects(bad, op):
    with pytest.raises(RuntimeError, match=rf"SPEC linear.*Ops\.{op}"):
        verify_linear(bad)


def test_linear_stage_accepts_real_programs_and_rejects_their_mutations():
    from fusegrad.codegen import to_program
    t = softmax(Tensor(A))
    (si,) = t.schedule()
    uops = to_program(si.ast, Device[Device.DEFAULT].renderer).uops
    verify_linear(uops)
    ends = [i for i, u in enumerate(uops) if u.op is Ops.END]
    with pytest.raises(RuntimeError, match="SPEC linear"):
        verify_linear(uops[:ends[-1]] + uops[ends[-1] + 1:])  # drop the last END
    with pytest.raises(RuntimeError, match="SPEC linear"):
        verify_linear(uops[::-1])
