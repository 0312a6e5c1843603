"""fusegrad: a small, hackable deep learning framework. Lazy tensors -> one IR -> fused kernels -> many backends."""
import warnings
# `python -m fusegrad.device` (the backend listing) runs device.py again as __main__, after this package imported it
warnings.filterwarnings("ignore", message="'fusegrad.device' found in sys.modules", category=RuntimeWarning)
from fusegrad.tensor import Tensor  # noqa: E402
from fusegrad.dtype import dtypes
from fusegrad.device import Device
from fusegrad.helpers import Context, GlobalCounters, fetch, getenv
from fusegrad.ir.ops import UOp
from fusegrad.engine.jit import TinyJit
from fusegrad.function import function
from fusegrad import nn  # noqa: E402 - `fusegrad.nn` after `import fusegrad`, as tinygrad code expects

Variable = UOp.variable

__all__ = ["Tensor", "dtypes", "Device", "Context", "GlobalCounters", "fetch", "getenv", "UOp", "Variable", "TinyJit",
           "function", "nn"]

from fusegrad.helpers import PROFILE as _PROFILE, VIZ as _VIZ  # noqa: E402
if _VIZ or _PROFILE:  # VIZ=1 / PROFILE=1 in the environment: record from now on, show or save at exit (fusegrad/viz)
    from fusegrad.viz import start_from_env as _start_viz
    _start_viz()
