"""OnnxRunner rejects what onnxruntime rejects instead of computing something else: graph inputs fed a dtype other
than the declared one, and out-of-range indices to Gather, GatherElements, GatherND, Scatter, ScatterElements and
ScatterND (which would otherwise read 0 or drop the write). Valid cases are compared with onnxruntime value for
value."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from fusegrad import Tensor, TinyJit  # noqa: E402
from fusegrad.onnx import OnnxRunner  # noqa: E402


def _model(op, ins, attrs=None, opset=18, const_inputs=()):
    """A one-node model; inputs whose position is in const_inputs become initializers (known when the graph loads)."""
    names = [f"i{k}" for k in range(len(ins))]
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for k, (n, a) in enumerate(zip(names, ins))
        if k not in const_inputs
    ]
    inits = [onnx.numpy_helper.from_array(a, n) for k, (n, a) in enumerate(zip(names, ins)) if k in const_inputs]
    out_t = helper.np_dtype_to_tensor_dtype(ins[0].dtype)
    node = helper.make_node(op, names, ["o"], name=f"{op}_node", **(attrs or {}))
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("o", out_t, None)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 10)
    feed = {n: a for k, (n, a) in enumerate(zip(names, ins)) if k not in const_inputs}
    return m, feed


def _ort(m, feed):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]


# ---------------------------------------------------------------- input dtypes
def _div_model():
    f = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("Div", ["x", "y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", f, [2]), helper.make_tensor_value_info("y", f, [2])],
        [helper.make_tensor_value_info("z", f, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = min(m.ir_version, 10)
    return m


def test_int64_fed_to_float_input_raises_like_onnxruntime():
    m = _div_model()
    x, y = np.array([7, 8]), np.array([2, 3])
    with pytest.raises(Exception, match="INVALID_ARGUMENT"):
        _ort(m, {"x": x, "y": y})
    with pytest.raises(TypeError, match=r"input 'x' is declared float but was given int64"):
        OnnxRunner(m)({"x": x, "y": y})
    with pytest.raises(TypeError, match=r"input 'x' is declared float but was given"):
        OnnxRunner(m)({"x": Tensor(x), "y": Tensor(y)})  # a Tensor of the wrong dtype too
    with pytest.raises(TypeError, match=r"input 'y' is declared float but was given float64"):
        OnnxRunner(m)({"x": x.astype(np.float32), "y": y.astype(np.float64)})


def test_declared_dtype_feeds_match_onnxruntime():
    m = _div_model()
    x, y = np.array([7, 8], np.float32), np.array([2, 3], np.float32)
    np.testing.assert_array_equal(OnnxRunner(m)({"x": x, "y": y})["z"].numpy(), _ort(m, {"x": x, "y": y}))
    # Python values carry no dtype: they take the declared one (7 / 2 = 3.5, not integer division)
    out = OnnxRunner(m)({"x": 7, "y": 2})["z"].numpy()
    assert out.dtype == np.float32 and out == 3.5


# ---------------------------------------------------------------- index ranges
X = np.arange(12, dtype=np.float32).reshape(3, 4)
U1 = np.array([[100.0]], np.float32)
CASES = [  # (op, inputs, attrs, opset, valid): every index input is int64
    ("Gather", [X, np.array([0, 2, -3])], {}, 18, True),
    ("Gather", [X, np.array([1, 2])], {}, 18, True),  # a contiguous constant run (a slice in fusegrad)
    ("Gather", [X, np.array([2, 3])], {}, 18, False),
    ("Gather", [X, np.array(-4)], {}, 18, False),
    ("Gather", [X, np.array([[0, 4]])], {"axis": 1}, 18, False),
    ("GatherElements", [X, np.array([[0, -1], [3, 1]])], {"axis": 1}, 18, True),
    ("GatherElements", [X, np.array([[0, 4]])], {"axis": 1}, 18, False),
    ("GatherElements", [X, np.array([[-5, 0]])], {"axis": 1}, 18, False),
    ("GatherND", [X, np.array([[0, 3], [-1, -4]])], {}, 18, True),
    ("GatherND", [X, np.array([[0, 4]])], {}, 18, False),
    ("GatherND", [X, np.array([[3]])], {}, 18, False),
    ("ScatterElements", [X, np.array([[-1]]), U1], {"axis": 1}, 18, True),
    ("ScatterElements", [X, np.array([[5]]), U1], {"axis": 1}, 18, False),
    ("ScatterElements", [X, np.array([[3]]), U1], {"axis": 0}, 18, False),
    ("ScatterElements", [X, np.array([[1]]), U1], {"axis": 1, "reduction": "add"}, 18, True),
    ("ScatterElements", [X, np.array([[4]]), U1], {"axis": 1, "reduction": "add"}, 18, False),
    ("Scatter", [X, np.array([[5]]), U1], {"axis": 1}, 10, False),
    ("ScatterND", [X, np.array([[-1], [0]]), np.ones((2, 4), np.float32)], {}, 18, True),
    ("ScatterND", [X, np.array([[1, -1]]), np.float32([7])], {}, 18, True),
    ("ScatterND", [X, np.array([[3]]), np.ones((1, 4), np.float32)], {}, 18, False),
    ("ScatterND", [X, np.array([[0, -5]]), np.float32([7])], {}, 18, False),
]


@pytest.mark.parametrize("const", [False, True], ids=["runtime-indices", "initializer-indices"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}-{'ok' if c[4] else 'oob'}" for i, c in enumerate(CASES)])
def test_index_range_matches_onnxruntime(case, const):
    op, ins, attrs, opset, valid = case
    m, feed = _model(op, ins, attrs, opset, const_inputs=(1,) if const else ())
    if valid:
        np.testing.assert_array_equal(OnnxRunner(m)(feed)["o"].numpy(), _ort(m, feed))
    else:
        with pytest.raises(Exception, match="INVALID_ARGUMENT|FAIL"):
            _ort(m, feed)
        with pytest.raises(IndexError, match=rf"ONNX {op} node '{op}_node': index -?\d+ is out of range for axis \d"):
            OnnxRunner(m)(feed)["o"].numpy()


def test_index_computed_in_graph_is_checked():
    """Indices produced by another node (here Add) are realized and checked too."""
    i64 = TensorProto.INT64
    g = helper.make_graph(
        [helper.make_node("Add", ["i", "one"], ["j"]), helper.make_node("Gather", ["x", "j"], ["o"], name="g")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]), helper.make_tensor_value_info("i", i64, [2])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array(1), "one")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    r = OnnxRunner(m)
    np.testing.assert_array_equal(r({"x": X, "i": np.array([0, 1])})["o"].numpy(), X[[1, 2]])
    with pytest.raises(IndexError, match="index 3 is out of range for axis 0 of size 3"):
        r({"x": X, "i": np.array([0, 2])})


def test_tinyjit_capture_still_runs_gather():
    """Under a TinyJit capture the indices can't be read (the value would freeze), so the capture skips the check
    rather than raising; the plain first call still checks."""
    m, _ = _model("Gather", [X, np.array([0, 2])])
    r = OnnxRunner(m)
    fj = TinyJit(lambda x, i: r({"i0": x, "i1": i})["o"].realize())
    with pytest.raises(IndexError):
        fj(Tensor(X).realize(), Tensor(np.array([0, 3])).realize())
    for k in range(3):
        idx = np.array([k % 3, (k + 1) % 3])
        np.testing.assert_array_equal(fj(Tensor(X).realize(), Tensor(idx).realize()).numpy(), X[idx])
