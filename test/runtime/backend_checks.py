"""One check shared by the backend tests: every ALU op of a dtype on a device agrees with the PYTHON backend (the
reference semantics, ir/alu.py), including NaN compares (CMPNE is unordered) and negative int division."""
from __future__ import annotations

import numpy as np

from fusegrad import Tensor, dtypes
from fusegrad.dtype import DType
from fusegrad.ir.ops import Ops


def alu_exprs(x: Tensor, y: Tensor, dt: DType) -> list[Tensor]:
    out = [x + y, x * y, x.maximum(y), x < y, x != y, (x < y).where(x, y)]
    if dtypes.is_float(dt): out += [-x, x.reciprocal(), x.trunc(), x.abs().sqrt(), (x * 0.01).exp2(), x.abs().log2(),
                                    x.sin(), (x.sum() * y.max())[None]]
    elif dtypes.is_int(dt):
        nz = (y == 0).where(y + 1, y)  # truncating division and modulo (y == 0 has its own tests)
        out += [-x, x._alu(Ops.IDIV, nz), x._alu(Ops.MOD, nz), x & y, x | y, x ^ y, x << 2, x >> 1, x.sum()[None]]
    else: out += [x & y, x | y, x ^ y, x.logical_not()]
    return out


def check_alu_matches_python(device: str, dt: DType, n: int, float_rtol: float, seed: int = 0) -> None:
    """`n` random operands in [-40, 40) with NaN, negatives and sign mixes first; floats to `float_rtol` (the
    device's math builtins may differ from Python's in the last bits; half to 2e-3), everything else exactly."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-40, 40, n).astype(np.float64)
    a[:3] = [float("nan"), -7, 7] if dtypes.is_float(dt) else [5, -7, 7]
    b = rng.uniform(-40, 40, n).astype(np.float64)
    b[:3] = [1.0, 2, -2]

    def run(dev: str) -> list[np.ndarray]:
        x, y = (Tensor(v, device=dev).cast(dtypes.int64).cast(dt) if not dtypes.is_float(dt) else
                Tensor(v, device=dev).cast(dt) for v in (a, b))
        if dt == dtypes.bool: x, y = Tensor(a > 0, device=dev), Tensor(b > 0, device=dev)
        return [e.numpy() for e in alu_exprs(x, y, dt)]
    for i, (got, want) in enumerate(zip(run(device), run("PYTHON"))):
        if dtypes.is_float(dt) and got.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=2e-3 if dt == dtypes.float16 else float_rtol, equal_nan=True,
                                       err_msg=f"expr {i}")
        else: np.testing.assert_array_equal(got, want, err_msg=f"expr {i}")


def check_matmul_and_grad(device: str, n: int, k: int, m: int, seed: int = 0) -> None:
    """(n, k) @ (k, m) on `device` and the gradient of relu(out).sum() for the right operand, against numpy."""
    rng = np.random.default_rng(seed)
    a, w = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal((k, m)).astype(np.float32)
    x, wt = Tensor(a, device=device), Tensor(w, device=device, requires_grad=True)
    out = x @ wt
    np.testing.assert_allclose(out.numpy(), a @ w, rtol=1e-4, atol=1e-4)
    out.relu().sum().backward()
    np.testing.assert_allclose(wt.grad.numpy(), a.T @ (a @ w > 0).astype(np.float32), rtol=1e-4, atol=1e-4)


def defined_edge_exprs(device: str, target: str) -> list[Tensor]:
    """Values C and friends leave undefined, with one documented rule (docs/tensor/dtypes.md): float -> int of NaN,
    inf and out-of-range values, shifts by amounts outside [0, bits), abs and negation of the int minimum."""
    from fusegrad.device import is_dtype_supported
    f = Tensor(EDGE_FLOATS, device=device)
    x = Tensor(EDGE_INTS, dtype=dtypes.int32, device=device)
    s = Tensor(EDGE_SHIFTS, dtype=dtypes.int32, device=device)
    u = Tensor([1, 2**32 - 1, 5, 2**31, 7], dtype=dtypes.uint32, device=device)
    out = [f.cast(dtypes.int32), f.cast(dtypes.int16), f.cast(dtypes.int8), f.cast(dtypes.uint8), f.cast(dtypes.uint16),
           f.cast(dtypes.uint32), x << 40, x >> 40, x << s, x >> s, x << 31, x >> -1, u << s.cast(dtypes.uint32),
           u >> 32, x.abs(), -x]
    # the dtypes the device under test (`target`) has, so both sides build the same list
    if is_dtype_supported(dtypes.int64, target): out += [f.cast(dtypes.int64), f.cast(dtypes.uint64)]
    if is_dtype_supported(dtypes.half, target): out += [f.cast(dtypes.half).cast(dtypes.int32)]
    return out


EDGE_FLOATS = [float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 2.7, -2.7, 2147483647.0, -2147483648.0, 1e20]
EDGE_INTS = [1, -1, 5, -2**31, 7]
EDGE_SHIFTS = [40, 33, -1, 32, 31]


def check_defined_edges_match_python(device: str) -> None:
    """Every backend gives exactly what the PYTHON backend gives for `defined_edge_exprs`."""
    got, want = defined_edge_exprs(device, device), defined_edge_exprs("PYTHON", device)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g.numpy(), w.numpy(), err_msg=f"edge expr {i} on {device}")
