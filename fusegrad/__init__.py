"""fusegrad: a small, hackable deep learning framework. Lazy tensors -> one IR -> fused kernels -> many backends."""
from fusegrad.tensor import Tensor
from fusegrad.dtype import dtypes
from fusegrad.device import Device
from fusegrad.helpers import Context, GlobalCounters, getenv
from fusegrad.ir.ops import UOp
from fusegrad.engine.jit import TinyJit

Variable = UOp.variable

__all__ = ["Tensor", "dtypes", "Device", "Context", "GlobalCounters", "getenv", "UOp", "Variable", "TinyJit"]
