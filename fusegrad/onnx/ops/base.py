"""The op registry (`OPS`, the `op` decorator, `UnsupportedOp`) and what every op module shares: ONNX dtype
mapping (exotic float8/float4/int4/int2 types included), numpy -> Tensor conversion and attribute decoding."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fusegrad.dtype import dtypes, from_np_dtype
from fusegrad.tensor import Tensor

OPS: dict[str, Callable] = {}


class UnsupportedOp(NotImplementedError):
    """An ONNX node fusegrad cannot run; the message names the op, the node and the opset."""

    def __init__(self, op: str, node: str, opset: int, domain: str = "ai.onnx", why: str = ""):
        self.op, self.node, self.opset = op, node, opset
        super().__init__(
            f"ONNX op {op!r} (domain {domain}, opset {opset}) in node {node!r} is not supported by fusegrad"
            + (f": {why}" if why else "")
        )


def op(*names: str):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn

    return deco


# ---------------------------------------------------------------- dtypes and attributes
def onnx_dtype(t: int):
    """ONNX TensorProto elem_type -> fusegrad dtype."""
    m = {
        1: dtypes.float32,
        2: dtypes.uint8,
        3: dtypes.int8,
        4: dtypes.uint16,
        5: dtypes.int16,
        6: dtypes.int32,
        7: dtypes.int64,
        9: dtypes.bool,
        10: dtypes.float16,
        11: dtypes.float64,
        12: dtypes.uint32,
        13: dtypes.uint64,
        16: dtypes.bfloat16,
    }
    if t not in m:
        raise NotImplementedError(f"ONNX elem_type {t} has no fusegrad dtype")
    return m[t]


def onnx_np_dtype(t: int) -> np.dtype:
    """ONNX TensorProto elem_type -> the numpy dtype onnx and onnxruntime use for it (ml_dtypes for exotic types)."""
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(t))


def check_input_dtype(name: str, elem_type: int, given: Any) -> None:
    """Raise TypeError when a graph input's value (numpy dtype or fusegrad dtype) is not the elem_type the model
    declares for it; onnxruntime rejects such a feed too (INVALID_ARGUMENT), and computing in the given dtype would
    change the results (an int64 feed to a FLOAT input turns Div into integer division)."""
    from onnx import TensorProto

    declared = TensorProto.DataType.Name(elem_type).lower() if elem_type in TensorProto.DataType.values() else elem_type
    if isinstance(given, np.dtype):
        ok = given.kind in "OSU" if elem_type == TensorProto.STRING else given == onnx_np_dtype(elem_type)
        shown = given.name
    else:  # a fusegrad dtype: exotic types are held in their storage dtype (see EXOTIC)
        if elem_type == TensorProto.STRING:
            ok = False
        elif elem_type in EXOTIC:
            ok = given == from_np_dtype(np.dtype(EXOTIC[elem_type]))
        else:
            ok = given == onnx_dtype(elem_type)
        shown = str(given)
    if not ok:
        raise TypeError(
            f"ONNX input {name!r} is declared {declared} but was given {shown}; convert it first (e.g. "
            f"arr.astype(np.{onnx_np_dtype(elem_type).name})), as onnxruntime requires too"
        )


# ONNX types fusegrad has no dtype for (float8/float4/int4/int2 ...): held as float32 / int8 / uint8 Tensors whose
# values are exactly representable in the ONNX type; Cast/QuantizeLinear round into them, outputs convert back
EXOTIC = {
    17: np.float32,
    18: np.float32,
    19: np.float32,
    20: np.float32,
    23: np.float32,
    24: np.float32,
    21: np.uint8,
    25: np.uint8,
    22: np.int8,
    26: np.int8,
}
EXOTIC_NAMES = {
    "float8_e4m3fn": 17,
    "float8_e4m3fnuz": 18,
    "float8_e5m2": 19,
    "float8_e5m2fnuz": 20,
    "uint4": 21,
    "int4": 22,
    "float4_e2m1fn": 23,
    "float8_e8m0fnu": 24,
    "uint2": 25,
    "int2": 26,
}


def to_exotic(x: Tensor, to: int, saturate: int = 1, clip_ints: bool = False) -> Tensor:
    """Round x into ONNX type `to` (eagerly, through ml_dtypes) and hold the result in its storage dtype."""
    from onnx import helper
    import ml_dtypes

    npdt = helper.tensor_dtype_to_np_dtype(to)
    a = x.cast(dtypes.float32).numpy() if x.dtype != dtypes.float64 else x.numpy()
    if EXOTIC[to] is np.float32:
        if saturate and to != 24:
            m = float(ml_dtypes.finfo(npdt).max)
            a = np.clip(a, -m, m)
        return Tensor(a.astype(npdt).astype(np.float32))
    v = np.rint(a)
    if clip_ints:
        v = np.clip(v, int(ml_dtypes.iinfo(npdt).min), int(ml_dtypes.iinfo(npdt).max))
    return Tensor(v.astype(npdt).astype(EXOTIC[to]))  # out-of-range casts follow ml_dtypes (the reference's choice)


def to_tensor(arr: np.ndarray, elem_type: int | None = None, device: str | None = None) -> Tensor:
    """numpy array (any ONNX dtype, bfloat16 from ml_dtypes included) -> Tensor."""
    arr = np.asarray(arr)
    if arr.dtype.name in EXOTIC_NAMES or elem_type in EXOTIC:
        et = EXOTIC_NAMES.get(arr.dtype.name, elem_type)
        return Tensor(np.array(arr.astype(EXOTIC[et]), order="C"), device=device)
    if arr.dtype.name == "bfloat16" or elem_type == 16:
        return Tensor(np.array(arr.astype(np.float32), order="C"), device=device).cast(dtypes.bfloat16)
    if arr.dtype == object or arr.dtype.kind in "SU":
        return arr.astype(object)  # strings stay numpy (ops/sequence.py, string ops)
    return Tensor(np.array(arr, order="C"), device=device)


def attr_value(a: Any) -> Any:
    from onnx import helper, numpy_helper, AttributeProto

    if a.type == AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == AttributeProto.GRAPH:
        return a.g
    if a.type == AttributeProto.STRING:
        return a.s.decode()
    if a.type == AttributeProto.STRINGS:
        return [s.decode() for s in a.strings]
    if a.type == AttributeProto.SPARSE_TENSOR:
        raise NotImplementedError("sparse tensor attributes are not supported")
    v = helper.get_attribute_value(a)
    return list(v) if isinstance(v, (list, tuple)) or type(v).__name__.startswith("Repeated") else v


def norm_axis(axis: int, ndim: int) -> int:
    return axis + ndim if axis < 0 else axis


def cast_like(x: Tensor, like: Tensor) -> Tensor:
    return x if x.dtype == like.dtype else x.cast(like.dtype)


# ---------------------------------------------------------------- strings (numpy object arrays, not Tensors)
def is_str_array(v: Any) -> bool:
    return isinstance(v, np.ndarray) and v.dtype.kind in "OSU"


def as_str_array(v: Any) -> np.ndarray:
    return np.asarray(v, dtype=object)
