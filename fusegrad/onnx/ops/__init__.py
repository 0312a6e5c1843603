"""ONNX operators as fusegrad Tensor calls: one function per op_type, `fn(ctx, *inputs, **attributes)`, collected in `OPS`.

Each function returns a value or a tuple of values (one per node output). Inputs that fix shapes (Reshape's shape,
Slice's starts, ...) are read as numpy through `ctx.np(i)`; everything else stays lazy. The registry and shared helpers
live in `base`; importing each concept module below registers its ops.
"""

from fusegrad.onnx.ops import elementwise, image, nn, quant, reduce, sequence, signal, tensor  # noqa: F401  (registers ops)
from fusegrad.onnx.ops.base import (
    EXOTIC,
    EXOTIC_NAMES,
    OPS,
    UnsupportedOp,
    attr_value,
    check_input_dtype,
    onnx_dtype,
    onnx_np_dtype,
    op,
    to_exotic,
    to_tensor,
)

__all__ = [
    "EXOTIC", "EXOTIC_NAMES", "OPS", "UnsupportedOp", "attr_value", "check_input_dtype", "onnx_dtype", "onnx_np_dtype",
    "op", "to_exotic", "to_tensor",
]
