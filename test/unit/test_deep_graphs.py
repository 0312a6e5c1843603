"""Deep graphs and histories: schedule, shape inference, autograd and realize walk graphs iteratively (no
RecursionError on a 100,000-op lazy chain or a 1,000-iteration ONNX Loop), and backward() after assign ends.

The hang cases run in a subprocess with a timeout, so a regression fails the test instead of stalling the suite.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from fusegrad import Tensor
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.pattern import substitute


def test_chain_100k_realizes():
    y = Tensor([1.0, 2.0, 3.0])
    for _ in range(100_000): y = y + 1
    np.testing.assert_array_equal(y.numpy(), np.array([1.0, 2.0, 3.0], np.float32) + 100_000)


def test_mixed_chain_with_movement_and_reductions():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    y, ref = Tensor(x), x.copy()
    for i in range(1_200):
        k = i % 4
        if k == 0: y, ref = y * 0.5 + 1, ref * np.float32(0.5) + np.float32(1)
        elif k == 1: y, ref = y.permute(1, 0).reshape(3, 4).reshape(4, 3).permute(1, 0), ref
        elif k == 2: y, ref = y.flip(1).flip(1) - 0.25, ref - np.float32(0.25)
        else: y, ref = y.pad(((1, 1), (0, 2)))[1:-1, :4] * 1.5, ref * np.float32(1.5)
        if i % 400 == 399:
            y, ref = y - y.mean(axis=1, keepdim=True), ref - ref.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_chain_backward():
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = w
    for _ in range(5000): y = y * 1.0001 + 0.001
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full(3, 1.0001 ** 5000, np.float32), rtol=1e-4)


def test_shape_of_a_deep_graph_made_in_one_go():
    # a rewrite builds every node of a deep graph at once: none of them has its shape, device or key yet
    y = Tensor([1.0, 2.0, 3.0])
    for _ in range(20_000): y = y * 2
    leaf = next(iter(y.uop.toposort()))
    new = substitute(y.uop, {leaf: UOp(Ops.RESHAPE, leaf.dtype, (Tensor([4.0, 5.0, 6.0]).uop,), (3,))})
    assert new is not y.uop and "shape" not in new.__dict__
    assert new.shape == (3,) and new.device == y.device and len(new.key) == 32


def test_deep_chain_through_assign():
    # every write through a view makes the lazy reader `b` keep the old contents (views.py, read order): b is a chain
    # of 1,500 reads of successive versions of a's memory
    a, b = Tensor.zeros(4).contiguous().realize(), Tensor.zeros(4)
    for _ in range(1500):
        a[1:3] += 1
        b = b * 1.0 + a
    np.testing.assert_array_equal(a.numpy(), np.array([0, 1500, 1500, 0], np.float32))
    np.testing.assert_array_equal(b.numpy(), np.array([0, 1500 * 1501 // 2, 1500 * 1501 // 2, 0], np.float32))


def test_onnx_loop_1000_iterations():
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    from fusegrad.onnx import run_onnx
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["iter"], ["it_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["v_in", "c"], ["vm"]),
         helper.make_node("Add", ["vm", "it_f"], ["v_out"]),
         helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0)],
        "body",
        [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [helper.make_tensor("c", TensorProto.FLOAT, [], [0.999])])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "cond", "v0"], ["v_final", "s_all"], body=body)], "g",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v0", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("v_final", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("s_all", TensorProto.FLOAT, [None])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"M": np.array(1000, np.int64), "cond": np.array(True), "v0": np.array([1.0, -2.0, 0.5], np.float32)}
    out = run_onnx(m, inputs)
    ref = ort.InferenceSession(m.SerializeToString()).run(None, inputs)
    np.testing.assert_allclose(np.asarray(out["v_final"]), ref[0], rtol=1e-5)
    # the scan output stacks 1,000 buffers: one kernel taking them all passed ctypes 2,002 arguments (1,024 at most)
    assert np.asarray(out["s_all"]).shape == (1000,)
    np.testing.assert_allclose(np.asarray(out["s_all"]), ref[1], rtol=1e-5)


def _run(code: str, timeout: int = 60) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


SGD_STEPS = """
    import numpy as np
    from fusegrad import Tensor
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = Tensor([0.5, -1.0, 2.0])
    for step in range(4):
        loss = ((w * x).sum() - 1) ** 2 + (w * w).sum()
        loss.backward()
        print(list(w.grad.numpy()))
        w.assign(w - 0.1 * w.grad)
        w.grad = None
        print(list(w.numpy()))
"""


def test_backward_after_assign_to_a_leaf_matches_torch():
    got = [eval(line) for line in _run(SGD_STEPS).splitlines()]
    w, x, want = torch.tensor([1.0, 2.0, 3.0], requires_grad=True), torch.tensor([0.5, -1.0, 2.0]), []
    for _ in range(4):
        loss = ((w * x).sum() - 1) ** 2 + (w * w).sum()
        loss.backward()
        want.append(w.grad.tolist())
        with torch.no_grad(): w -= 0.1 * w.grad
        w.grad = None
        want.append(w.tolist())
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5)


KV_CACHE = """
    import numpy as np
    from fusegrad import Tensor
    rng = np.random.default_rng(0)
    wk = Tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    cache = Tensor.zeros(3, 4).contiguous().realize()
    xs = rng.standard_normal((3, 1, 4)).astype(np.float32)
    for pos in range(3):
        x = Tensor(xs[pos])
        cache[pos:pos + 1] = x @ wk
        cache.realize()
        (x @ cache[:pos + 1].T).sum().backward()
        print(wk.grad.numpy().tolist())
        wk.grad = None
"""


def test_backward_through_kv_cache_written_with_assign_matches_torch():
    got = [eval(line) for line in _run(KV_CACHE).splitlines()]
    rng = np.random.default_rng(0)
    wk = torch.tensor(rng.standard_normal((4, 4)).astype(np.float32), requires_grad=True)
    cache, xs, want = torch.zeros(3, 4), rng.standard_normal((3, 1, 4)).astype(np.float32), []
    for pos in range(3):
        x = torch.tensor(xs[pos])
        cache[pos:pos + 1] = x @ wk
        (x @ cache[:pos + 1].T).sum().backward(retain_graph=True)
        want.append(wk.grad.tolist())
        wk.grad = None
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)
