"""fusegrad: a small, hackable deep learning framework. Lazy tensors -> one IR -> fused kernels -> many backends."""
import warnings
# `python -m fusegrad.device` (the backend listing) runs device.py again as __main__, after this package imported it
warnings.filterwarnings("ignore", message="'fusegrad.device' found in sys.modules", category=RuntimeWarning)
from fusegrad.tensor import Tensor  # noqa: E402
from fusegrad.dtype import dtypes
from fusegrad.device import Device
from fusegrad.helpers import Context, GlobalCounters, getenv
from fusegrad.ir.ops import UOp
from fusegrad.engine.jit import TinyJit

Variable = UOp.variable

__all__ = ["Tensor", "dtypes", "Device", "Context", "GlobalCounters", "getenv", "UOp", "Variable", "TinyJit"]
