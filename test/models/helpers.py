"""Helpers for the model tests: randomize a torch reference's weights (batch-norm statistics included), save them as a
.pth, and compare logits."""
from __future__ import annotations

import pathlib

import numpy as np
import torch


def randomize_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every batch norm random statistics and affine parameters (torch's init leaves them at 0/1, which would
    hide a wrong mean/var/eps), then put the module in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                m.num_batches_tracked.fill_(int(torch.randint(0, 1000, (1,), generator=g)))
    return module.eval()


def save_state_dict(module: torch.nn.Module, path: pathlib.Path) -> pathlib.Path:
    torch.save(module.state_dict(), path)
    return path


def assert_logits_close(ours: np.ndarray, theirs: np.ndarray, rel: float = 1e-4) -> None:
    """Every logit within `rel` x the largest |logit| of the reference, and the same top-1 per row."""
    scale = float(np.abs(theirs).max())
    err = float(np.abs(ours - theirs).max())
    assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x max |logit| {scale:.3g}"
    np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))
