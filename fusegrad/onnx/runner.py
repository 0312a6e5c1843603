"""OnnxRunner: walk an ONNX graph and turn every node into lazy fusegrad Tensor calls.

Values in the graph are Tensors, Python lists (ONNX sequences) or None (absent optional inputs). Values that only
depend on initializers and Constant nodes are folded once, on the first run, and kept as numpy arrays too, so shape
arithmetic (Shape -> Gather -> Concat -> Reshape chains from exporters) costs nothing on later runs.
"""

from __future__ import annotations
from typing import Any
import numpy as np
from fusegrad.onnx.ops import EXOTIC
from fusegrad.tensor import Tensor
from fusegrad.engine.capture import capturing, not_capturing
from fusegrad.onnx.ops import OPS, attr_value, UnsupportedOp, to_tensor, onnx_dtype, check_input_dtype, onnx_np_dtype


def read_constant(t: Tensor) -> np.ndarray:
    """Read a Tensor computed only from constants and static shapes. Inside a TinyJit capture the value is the same on
    every replay (TinyJit checks input shapes), so the read runs outside the capture instead of raising."""
    with not_capturing():
        return t.numpy()


FOLD_LIMIT = 4096  # constant-only results up to this many elements are kept as numpy (cheap shape arithmetic)


class Ctx:
    """What an op sees besides its inputs: the node, the opset, the runner (for subgraphs) and numpy views of inputs."""

    def __init__(self, runner: "OnnxRunner", node: Any, opset: int, scope: dict, npscope: dict):
        self.runner, self.node, self.opset, self.scope, self.npscope = runner, node, opset, scope, npscope

    def np(self, i: int) -> np.ndarray | None:
        """The value of input i as a numpy array (realizing it if it is not a known constant); None when absent."""
        if i >= len(self.node.input) or self.node.input[i] == "":
            return None
        name = self.node.input[i]
        if name in self.npscope:
            return self.npscope[name]
        v = self.scope[name]
        return None if v is None else v.numpy()

    def index_values(self, i: int) -> np.ndarray | None:
        """Input i (an index tensor) as numpy, for a range check: free for a constant; a runtime tensor is realized
        (one sync and a copy of the indices to the host). None while a TinyJit captures, where reading would freeze
        the value into the capture (docs/onnx.md: replays do not check)."""

        if self.node.input[i] not in self.npscope and capturing:
            return None
        return self.np(i)

    def ints(self, i: int) -> list[int] | None:
        v = self.np(i)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


class OnnxRunner:
    """Run an ONNX ModelProto (or a path to one) with fusegrad: `OnnxRunner(model)({"x": array}) -> {name: Tensor}`."""

    def __init__(self, model: Any, device: str | None = None):
        import onnx

        if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
            model = onnx.load(model)
        self.model, self.device = model, device
        self.opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
        self.opset = self.opsets.get("ai.onnx", onnx.defs.onnx_opset_version())
        self.graph = model.graph
        self.consts: dict[str, Tensor | None] = {}
        self.npconsts: dict[str, np.ndarray] = {}
        self._load_initializers(self.graph, self.consts, self.npconsts)
        self.folded = False
        self.logical: dict[str, int] = {}  # value name -> ONNX elem_type, for types held in a wider storage dtype

        for vi in list(self.graph.input) + list(self.graph.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in EXOTIC:
                self.logical[vi.name] = vi.type.tensor_type.elem_type
        for init in self.graph.initializer:
            if init.data_type in EXOTIC:
                self.logical[init.name] = init.data_type

    def _load_initializers(self, graph: Any, scope: dict, npscope: dict) -> None:
        from onnx import numpy_helper

        for init in graph.initializer:
            arr = numpy_helper.to_array(init)
            npscope[init.name] = arr
            scope[init.name] = to_tensor(arr, init.data_type, self.device)  # string initializers stay numpy
        for sp in graph.sparse_initializer:
            raise UnsupportedOp("sparse_initializer", sp.values.name, self.opset)

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        scope: dict[str, Any] = dict(self.consts)
        npscope: dict[str, np.ndarray] = dict(self.npconsts)
        init_names = {i.name for i in self.graph.initializer}
        for inp in self.graph.input:
            if inp.name in inputs:
                scope[inp.name] = self._input_value(inputs[inp.name], inp)
            elif inp.name not in init_names:
                raise ValueError(f"ONNX: missing input {inp.name!r}")
            else:
                npscope.pop(inp.name, None) if inp.name in inputs else None
        for name, v in inputs.items():
            if name not in scope:
                scope[name] = self._input_value(v, None)
        outs = self.run_graph(self.graph, scope, npscope, fold=not self.folded)
        self.folded = True
        return outs

    def _input_value(self, v: Any, vinfo: Any) -> Any:
        dt = vinfo.type.tensor_type.elem_type if vinfo is not None and vinfo.type.HasField("tensor_type") else None
        if isinstance(v, Tensor) and dt:
            check_input_dtype(vinfo.name, dt, v.dtype)
        if v is None or isinstance(v, Tensor):
            return v
        if isinstance(v, list):
            return [self._input_value(x, None) for x in v]
        arr = np.asarray(v)
        if dt and isinstance(v, np.ndarray | np.generic):
            check_input_dtype(vinfo.name, dt, arr.dtype)
        if arr.dtype.kind in "OSU":
            return arr.astype(object)
        if dt and not isinstance(v, np.ndarray | np.generic) and dt != 8:
            arr = np.asarray(v, dtype=onnx_np_dtype(dt))  # a Python scalar or list has no dtype: take the declared one
        return to_tensor(arr, dt, self.device)

    def run_graph(self, graph: Any, scope: dict, npscope: dict, fold: bool = False) -> dict[str, Any]:
        """Run the nodes of `graph` in order on `scope` (names -> values); return the graph outputs by name."""
        for node in graph.node:
            if node.output and all(o == "" or o in self.consts for o in node.output):
                continue  # folded on the first run: its outputs are already in scope
            self.run_node(node, scope, npscope, fold)
        return {o.name: scope[o.name] for o in graph.output}

    def run_node(self, node: Any, scope: dict, npscope: dict, fold: bool = False) -> None:
        domain = node.domain or "ai.onnx"
        opset = self.opsets.get(domain, self.opset)
        fn = OPS.get(node.op_type) if domain in ("ai.onnx", "ai.onnx.ml") else None
        if fn is None:
            raise UnsupportedOp(node.op_type, node.name, opset, domain)
        for i in node.input:
            if i and i not in scope:
                raise ValueError(f"ONNX: node {node.name!r} ({node.op_type}) reads undefined value {i!r}")
        args = [scope[i] if i else None for i in node.input]
        attrs = {a.name: attr_value(a) for a in node.attribute}
        ctx = Ctx(self, node, opset, scope, npscope)
        try:
            res = fn(ctx, *args, **attrs)
        except UnsupportedOp:
            raise
        except NotImplementedError as e:
            raise UnsupportedOp(node.op_type, node.name, opset, domain, str(e)) from e
        if not isinstance(res, tuple):
            res = (res,)
        all_const = all(i == "" or i in npscope for i in node.input) and node.op_type not in NONDETERMINISTIC
        for name, val in zip(node.output, res):
            if not name:
                continue
            scope[name] = val
            if name in npscope:
                continue  # the op filled it in (Shape, Size)
            if isinstance(val, Tensor) and all_const and val.numel() <= FOLD_LIMIT:
                arr = read_constant(val)
                npscope[name] = arr
                if fold and scope is not None and node.input and all(i == "" or i in self.npconsts for i in node.input):
                    self.npconsts[name], self.consts[name] = arr, val
        # Constant nodes with no inputs fold on the first run
        if fold and not node.input and node.op_type not in NONDETERMINISTIC:
            for name, val in zip(node.output, res):
                if isinstance(val, Tensor) and name in npscope:
                    self.npconsts[name], self.consts[name] = npscope[name], val


NONDETERMINISTIC = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}


def run_onnx(model: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """One-shot helper: load `model`, run it on `inputs`, return numpy outputs."""
    out = OnnxRunner(model)(inputs)
    return {k: (v.numpy() if isinstance(v, Tensor) else v) for k, v in out.items()}


__all__ = ["OnnxRunner", "run_onnx", "UnsupportedOp", "onnx_dtype"]
