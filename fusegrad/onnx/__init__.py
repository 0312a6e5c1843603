"""Run ONNX models with fusegrad: `OnnxRunner(model_or_path)(inputs) -> {output name: Tensor}` (needs the `onnx` extra).

`fusegrad.onnx.backend` implements `onnx.backend.base.Backend` for the onnx package's conformance tests.
"""

from fusegrad.onnx.runner import OnnxRunner, run_onnx
from fusegrad.onnx.ops import UnsupportedOp, OPS

__all__ = ["OnnxRunner", "run_onnx", "UnsupportedOp", "OPS"]
