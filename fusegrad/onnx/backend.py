"""`onnx.backend.base.Backend` for fusegrad, so `onnx.backend.test.BackendTest` runs the ONNX conformance suite."""

from __future__ import annotations
from typing import Any
import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep
from fusegrad.tensor import Tensor
from fusegrad.dtype import dtypes
from fusegrad.onnx.runner import OnnxRunner
from fusegrad.onnx.ops import EXOTIC


def _to_numpy(v: Any) -> Any:
    if isinstance(v, Tensor) and v.dtype == dtypes.bfloat16:
        import ml_dtypes

        return v.float().numpy().astype(ml_dtypes.bfloat16)
    if isinstance(v, Tensor):
        return v.numpy()
    if isinstance(v, list):
        return [_to_numpy(x) for x in v]
    return v


class FusegradRep(BackendRep):
    """A prepared model: `run(inputs)` feeds graph inputs in order (list) or by name (dict), returns numpy outputs."""

    def __init__(self, runner: OnnxRunner):
        self.runner = runner
        inits = {i.name for i in runner.graph.initializer}
        self.input_names = [i.name for i in runner.graph.input if i.name not in inits]

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feed = dict(zip(self.input_names, inputs))
        outs = self.runner(feed)
        res = []
        for vi, v in zip(self.runner.graph.output, outs.values()):
            v = _to_numpy(v)
            et = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
            if et in EXOTIC and isinstance(v, np.ndarray):
                v = v.astype(onnx.helper.tensor_dtype_to_np_dtype(et))
            res.append(v)
        return tuple(res)


class FusegradBackend(Backend):
    """Runs ONNX models and single nodes with fusegrad on its default device (or `device` if given)."""

    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        return True

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> FusegradRep:
        super().prepare(model, device, **kwargs)
        return FusegradRep(OnnxRunner(model))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Any = None, **kwargs: Any) -> tuple:
        ins = [
            onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
            for n, v in zip(node.input, inputs)
            if n
        ]
        outs = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in node.output]
        graph = onnx.helper.make_graph([node], "run_node", ins, outs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        feed = {n: v for n, v in zip(node.input, inputs) if n}
        return FusegradRep(OnnxRunner(model)).run(feed)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"  # the onnx suite's device name; fusegrad runs on its own default device


prepare = FusegradBackend.prepare
run_model = FusegradBackend.run_model
run_node = FusegradBackend.run_node
supports_device = FusegradBackend.supports_device
