"""Shared helper for the op comparison suite: run one function on fusegrad and on PyTorch (CPU) with the same random
inputs and compare forward values, shape, dtype and (for float inputs) the gradient of every input."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pytest
import torch

from fusegrad import Device, Tensor
from fusegrad.device import is_dtype_supported
from fusegrad.dtype import DType, to_dtype


def _optional_device(name: str) -> Any:
    """The device's name if it opens here, else a parameter skipped with the reason (a missing driver, say)."""
    try:
        Device[name]
        return name
    except Exception as e:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"{name} unavailable: {str(e).splitlines()[0]}"))


# the backends under test; the ones other than CPU only get a small, representative subset with tiny shapes
DEVICES = ["CPU", "PYTHON"] + [_optional_device(d) for d in ("CL", "LLVM", "WEBGPU", "CUDA", "METAL")]


def fg_dtype_of(t: torch.Tensor | torch.dtype) -> DType:
    """The fusegrad dtype with the same meaning as a torch dtype."""
    dt = t.dtype if isinstance(t, torch.Tensor) else t
    return to_dtype(str(dt).replace("torch.", ""))


def make_input(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator, low: float, high: float) -> np.ndarray:
    """A random array: uniform floats in [low, high), integers in [low, high), or random bools."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_: return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer): return rng.integers(int(low), int(high), size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def fg_tensor(a: np.ndarray, device: str, requires_grad: bool | None = None) -> Tensor:
    """`Tensor(a, device=device)`. 0-d arrays are built from a Python scalar with the array's dtype instead:
    Tensor(0-d ndarray) is checked on its own in test_creation.py, so a bug there doesn't hide the op under test."""
    if a.ndim: return Tensor(a, device=device, requires_grad=requires_grad)
    dt = fg_dtype_of(torch.from_numpy(np.array(a, ndmin=1)).dtype)
    return Tensor(a.item(), device=device, dtype=dt, requires_grad=requires_grad)


def assert_values(fg_val: np.ndarray, torch_val: np.ndarray, atol: float, rtol: float, what: str) -> None:
    """Exact for bool/int results, allclose (NaN == NaN, inf == inf) for floats."""
    assert fg_val.shape == torch_val.shape, f"{what}: shape {fg_val.shape} != torch {torch_val.shape}"
    if fg_val.dtype == np.bool_ or np.issubdtype(fg_val.dtype, np.integer):
        np.testing.assert_array_equal(fg_val, torch_val, err_msg=what)
    else:
        np.testing.assert_allclose(fg_val.astype(np.float64), torch_val.astype(np.float64), atol=atol, rtol=rtol,
                                   equal_nan=True, err_msg=what)


def check_op(shapes: Sequence[tuple[int, ...]], torch_fn: Callable[..., torch.Tensor],
             fg_fn: Callable[..., Tensor] | None = None, *, device: str = "CPU", atol: float = 1e-6,
             rtol: float = 1e-3, grad_atol: float = 1e-4, grad_rtol: float = 1e-3, forward_only: bool = False,
             low: float = -2, high: float = 2, dtype: Any = np.float32, vals: Sequence[Any] | None = None,
             upstream: str = "random", seed: int = 0,
             out_dtype: Any = None) -> tuple[Tensor, torch.Tensor]:
    """Compare `fg_fn(*fusegrad inputs)` with `torch_fn(*torch inputs)`.

    Inputs are random (seeded) arrays of `shapes` and `dtype` in [low, high), or the given `vals` (arrays or lists; a
    val's own numpy dtype wins). Float inputs get requires_grad unless forward_only. After the forward comparison
    (values, shape, dtype) the backward pass is seeded with `.sum()` (upstream="sum") or with a random upstream gradient
    (upstream="random") in both frameworks, and every input's `.grad` is compared. `out_dtype` overrides the
    expected output dtype where fusegrad deliberately differs from torch (its default int is int32, torch's int64).
    """
    fg_fn = torch_fn if fg_fn is None else fg_fn
    rng = np.random.default_rng(seed)
    if vals is None: arrays = [make_input(tuple(s), dtype, rng, low, high) for s in shapes]
    else: arrays = [np.array(v, dtype=dtype) if not isinstance(v, np.ndarray) else v for v in vals]

    def wants_grad(a: np.ndarray) -> bool: return not forward_only and np.issubdtype(a.dtype, np.floating)
    tt = [torch.tensor(a, requires_grad=wants_grad(a)) for a in arrays]
    ft = [fg_tensor(a, device, wants_grad(a) or None) for a in arrays]

    t_out = torch_fn(*tt)
    for dt in [fg_dtype_of(t) for t in tt] + [fg_dtype_of(t_out) if out_dtype is None else to_dtype(out_dtype)]:
        if not is_dtype_supported(dt, device): pytest.skip(f"{dt} is not supported on {device}")
    f_out = fg_fn(*ft)
    assert isinstance(f_out, Tensor), f"fusegrad returned {type(f_out).__name__}, not a Tensor"
    assert f_out.device == device, f"output on {f_out.device}, expected {device}"
    assert f_out.shape == tuple(t_out.shape), f"shape {f_out.shape} != torch {tuple(t_out.shape)}"
    want = fg_dtype_of(t_out) if out_dtype is None else to_dtype(out_dtype)
    assert f_out.dtype == want, f"dtype {f_out.dtype} != expected {want} (torch: {t_out.dtype})"
    assert_values(f_out.numpy(), t_out.detach().numpy(), atol, rtol, "forward")

    if forward_only or not t_out.requires_grad: return f_out, t_out
    assert f_out.requires_grad, "fusegrad output should require grad"
    if upstream == "sum":
        t_out.sum().backward()
        f_out.sum().backward()
    else:
        g = rng.uniform(-1, 1, size=tuple(t_out.shape)).astype(np.float32)
        t_out.backward(gradient=torch.tensor(g, dtype=t_out.dtype))
        f_out.backward(gradient=fg_tensor(g, device).cast(f_out.dtype))
    for i, (t_in, f_in) in enumerate(zip(tt, ft)):
        if not t_in.requires_grad: continue
        if t_in.grad is None:  # torch found no path: fusegrad may leave it unset or give zeros
            assert f_in.grad is None or not np.any(f_in.grad.numpy()), f"input {i}: unexpected nonzero grad"
            continue
        assert f_in.grad is not None, f"input {i}: fusegrad computed no gradient"
        assert f_in.grad.shape == f_in.shape, f"input {i}: grad shape {f_in.grad.shape} != {f_in.shape}"
        assert f_in.grad.dtype == f_in.dtype, f"input {i}: grad dtype {f_in.grad.dtype} != {f_in.dtype}"
        assert_values(f_in.grad.numpy(), t_in.grad.numpy(), grad_atol, grad_rtol, f"grad of input {i}")
    return f_out, t_out
