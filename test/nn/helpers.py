"""Helpers for the nn tests: copy a fusegrad layer's weights into the matching torch module and compare the two."""
from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fusegrad import Tensor
from fusegrad.nn.state import get_state_dict


def copy_to_torch(layer: Any, module: torch.nn.Module) -> None:
    """Copy every tensor of `layer` into `module`; the state-dict keys and shapes must be exactly torch's."""
    ours = get_state_dict(layer)
    theirs = module.state_dict()
    assert set(ours) == set(theirs), f"state dict keys {sorted(ours)} != torch's {sorted(theirs)}"
    for k, v in ours.items():
        assert v.shape == tuple(theirs[k].shape), f"{k}: shape {v.shape} != torch {tuple(theirs[k].shape)}"
    module.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v.numpy())) for k, v in ours.items()})


def compare_layer(layer: Any, module: torch.nn.Module, x: np.ndarray, *, atol: float = 1e-5, rtol: float = 1e-4,
                  input_grad: bool = True, fg_call: Callable[[Any, Tensor], Tensor] | None = None,
                  torch_call: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None,
                  seed: int = 0) -> None:
    """Forward and backward (random upstream gradients) on the same input; compare the output(s), the input gradient and
    every parameter gradient. The call hooks may return a tuple of outputs."""
    copy_to_torch(layer, module)
    xt = torch.tensor(x, requires_grad=input_grad)
    xf = Tensor(x, requires_grad=True if input_grad else None)
    out_t = torch_call(module, xt) if torch_call else module(xt)
    out_f = fg_call(layer, xf) if fg_call else layer(xf)
    outs_t = out_t if isinstance(out_t, tuple) else (out_t,)
    outs_f = out_f if isinstance(out_f, tuple) else (out_f,)
    rng = np.random.default_rng(seed)
    loss_t, loss_f = 0, 0
    for i, (of, ot) in enumerate(zip(outs_f, outs_t, strict=True)):
        np.testing.assert_allclose(of.numpy(), ot.detach().numpy(), atol=atol, rtol=rtol, err_msg=f"forward {i}")
        g = rng.standard_normal(ot.shape).astype(np.float32)
        loss_t, loss_f = loss_t + (ot * torch.from_numpy(g)).sum(), loss_f + (of * Tensor(g)).sum()
    loss_t.backward()
    loss_f.backward()
    if input_grad:
        np.testing.assert_allclose(xf.grad.numpy(), xt.grad.numpy(), atol=atol, rtol=rtol, err_msg="input grad")
    params = dict(module.named_parameters())
    for k, v in get_state_dict(layer).items():
        if k not in params: continue
        assert v.grad is not None, f"no gradient for {k}"
        np.testing.assert_allclose(v.grad.numpy(), params[k].grad.numpy(), atol=atol, rtol=rtol, err_msg=f"grad {k}")


def rand(*shape: int, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


class FakeResponse(io.BytesIO):
    """What urllib.request.urlopen returns, for bytes served by a test (a context manager with a Content-Length)."""
    def __init__(self, data: bytes):
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data))}
    def __enter__(self) -> "FakeResponse": return self
    def __exit__(self, *a: object) -> None: self.close()


def serve(monkeypatch: Any, module: Any, payload: Callable[[str], bytes]) -> list[str]:
    """Make `module`'s urllib.request.urlopen serve payload(url); returns the list of URLs asked for."""
    served: list[str] = []
    def fake_urlopen(url: str, timeout: Any = None) -> FakeResponse:
        served.append(url)
        return FakeResponse(payload(url))
    monkeypatch.setattr(module.urllib.request, "urlopen", fake_urlopen)
    return served
