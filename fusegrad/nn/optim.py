"""Optimizers: read each parameter's `.grad`, build the update lazily and write it back with `assign`.

`step()` realizes the new parameters and the optimizer state together, so one training step is one schedule. The
learning rate lives in a Tensor (`opt.lr`), so changing it (`opt.lr.assign(Tensor([0.01]))`) reuses the compiled kernels.

`fused=True` (or `Context(FUSE_OPTIM=1)` / $FUSE_OPTIM when the optimizer is made; tinygrad's fused optimizer) keeps
each state as one flat tensor over all parameters and updates them as one concatenated vector, so each state is one
update instead of one per parameter. It applies to the elementwise updates (SGD, Adam, AdamW); LAMB's and LARS's trust
ratios and Muon's orthogonalization are per parameter, so those stay unfused (tinygrad computes them over the
concatenation, which changes the values). The values are the same as unfused.

>>> from fusegrad import Tensor, nn
>>> w = Tensor([1.0, -2.0], requires_grad=True)
>>> opt = nn.optim.SGD([w], lr=0.5)
>>> with Tensor.train():
...     _ = (w * w).sum().backward()
...     opt.step()
>>> w.tolist()
[0.0, 0.0]
"""
from __future__ import annotations

import math

from fusegrad.dtype import DType, dtypes, least_upper_dtype, to_dtype
from fusegrad.helpers import FUSE_OPTIM, TRAINING, dedup, getenv
from fusegrad.ir.ops import Ops
from fusegrad.tensor import Tensor


class Optimizer:
    """Base class. `params` are the tensors it updates (requires_grad not False; each is marked `is_param`), `buffers`
    the others passed in (e.g. BatchNorm running statistics), realized alongside so their lazy updates don't pile up."""

    def __init__(self, params: list[Tensor], lr: float, device: str | None = None, fused: bool | None = None):
        params = list(params)
        if not params: raise ValueError("optimizer got an empty parameter list")
        for t in params:
            if not isinstance(t, Tensor): raise TypeError(f"optimizer params must be Tensors, got {type(t).__name__}")
            if t.requires_grad is not False and not t.is_param: t.is_param_()
        self.params: list[Tensor] = dedup([t for t in params if t.requires_grad is not False])
        self.buffers: list[Tensor] = dedup([t for t in params if t.requires_grad is False])
        if not self.params: raise ValueError("optimizer got no trainable parameters (every tensor has requires_grad=False)")
        self.device = device if device is not None else self.params[0].device
        self.fused = bool(FUSE_OPTIM) if fused is None else bool(fused)
        self._flat = False    # set by a subclass whose update is elementwise, when fused
        self.state_dtype = to_dtype(getenv("OPTIM_DTYPE", "float32"))
        lr_dtype = least_upper_dtype(self.state_dtype, dtypes.float32)
        self.lr = _state(Tensor([lr], dtype=lr_dtype, device=self.device))

    def zero_grad(self) -> None:
        """Drop the gradients (sets `.grad = None`), so the next backward() starts fresh."""
        for t in self.params: t.grad = None

    def step(self) -> None:
        """Apply one update and compute it now."""
        Tensor.realize(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """Build the update lazily and return every tensor that must be realized for it (params, state, buffers)."""
        if not (Tensor.training or TRAINING):
            raise RuntimeError("optimizer step outside training mode: wrap the training step in `with Tensor.train():` "
                               "or `with Context(TRAINING=1):` (BatchNorm and dropout also look at this flag)")
        prev = Tensor.no_grad
        Tensor.no_grad = True  # the update itself must record no autograd history on the parameters
        try:
            state = self._apply_updates()
        finally:
            Tensor.no_grad = prev
        return self.params + self.buffers + state

    def _apply_updates(self) -> list[Tensor]:
        """Assign the new values to the params; return the state tensors that changed."""
        raise NotImplementedError

    def _with_grads(self) -> list[tuple[int, Tensor, Tensor]]:
        """(index, param, grad) for the params that got a gradient (like torch, params without one are skipped)."""
        out = []
        for i, t in enumerate(self.params):
            if t.grad is None: continue
            if t.grad.shape != t.shape:
                raise RuntimeError(f"param {i} has shape {t.shape} but its grad has shape {t.grad.shape}")
            out.append((i, t, t.grad.detach().cast(self.state_dtype)))
        return out

    def _updates(self) -> list[tuple[int, Tensor, Tensor, "_Writer"]]:
        """(state index, value w, grad g, writer) per update: one per param with a gradient, or, fused, one for all
        params concatenated (flat), where params without a gradient keep their value and their state."""
        items = self._with_grads()
        if not self._flat:
            return [(i, t.detach().cast(self.state_dtype), g, _Writer([t], None)) for i, t, g in items]
        if not items: return []
        have = {i for i, _, _ in items}
        grads = {i: g for i, _, g in items}
        w = Tensor.cat(*[t.detach().cast(self.state_dtype).flatten() for t in self.params])
        g = Tensor.cat(*[(grads[i] if i in have else t.zeros_like().cast(self.state_dtype)).flatten()
                         for i, t in enumerate(self.params)])
        keep = None if len(have) == len(self.params) else Tensor.cat(*[
            Tensor.full((t.numel(),), i in have, dtype=dtypes.bool, device=self.device)
            for i, t in enumerate(self.params)])
        return [(0, w, g, _Writer(self.params, keep))]

    def _set(self, state: Tensor, new: Tensor, writer: "_Writer") -> None:
        """state.assign(new); fused, the entries of params without a gradient keep their value."""
        state.assign(new if writer.keep is None else writer.keep.where(new, state))

    def _zeros_like_params(self) -> list[Tensor]:
        """Zeroed state for every parameter (fused, one flat tensor for all of them), lazy as in tinygrad: a broadcast
        zero that the first step's update reads inside its kernel and writes into a buffer of its own (no kernel
        runs here, and none is spent filling zeros)."""
        if self._flat:
            flat = Tensor.zeros(sum(t.numel() for t in self.params), dtype=self.state_dtype, device=self.device)
            flat.requires_grad = False
            return [flat]
        states = [_zeros_like(t, self.state_dtype) for t in self.params]
        for t in states: t.requires_grad = False
        return states


def _zeros_like(t: Tensor, dtype: DType) -> Tensor:
    """Zeros shaped like a parameter; for a sharded one, split the same way (its update then needs no gather)."""
    if isinstance(t.device, tuple) and t.uop.op is Ops.MULTI and t.uop.arg is not None:
        return Tensor.zeros(*t.shape, dtype=dtype, device=t.device[0]).contiguous().shard_like(t).contiguous()
    return Tensor.zeros(*t.shape, dtype=dtype, device=t.device)


def _state(t: Tensor) -> Tensor:
    """Optimizer state: a tensor of its own (made from data: a buffer already, no kernel runs) that takes no part in
    autograd."""
    t = t.contiguous()
    t.requires_grad = False
    return t


def _write(t: Tensor, new: Tensor) -> None:
    """Replace a parameter's value (cast back to its dtype)."""
    t.assign(new.cast(t.dtype))


class _Writer:
    """Writes an update's new value back: to its one parameter, or (fused) split over every parameter, where `keep`
    (a flat bool mask, None when all params had a gradient) leaves params without a gradient unchanged."""
    def __init__(self, params: list[Tensor], keep: Tensor | None): self.params, self.keep = params, keep

    def __call__(self, new: Tensor) -> None:
        if len(self.params) == 1 and self.keep is None and new.shape == self.params[0].shape:
            _write(self.params[0], new)
            return
        off = 0
        for t in self.params:
            n = t.numel()
            part = new[off:off + n]
            if self.keep is not None:
                part = self.keep[off:off + n].where(part, t.detach().flatten().cast(part.dtype))
            _write(t, part.reshape(t.shape))
            off += n


class OptimizerGroup(Optimizer):
    """Several optimizers stepped together (e.g. Muon for matrices and AdamW for the rest)."""

    def __init__(self, *optimizers: Optimizer):
        self.optimizers = list(optimizers)
        self.params = [p for o in self.optimizers for p in o.params]
        self.buffers = [b for o in self.optimizers for b in o.buffers]

    def __getitem__(self, i: int) -> Optimizer: return self.optimizers[i]
    def __len__(self) -> int: return len(self.optimizers)
    def zero_grad(self) -> None:
        for o in self.optimizers: o.zero_grad()
    def schedule_step(self) -> list[Tensor]: return [t for o in self.optimizers for t in o.schedule_step()]


# ---------------------------------------------------------------------------------------------------------------------
# momentum family: SGD, LARS, Muon

class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You et al., 2017) with optional Newton-Schulz orthogonalization.

    Per parameter w with gradient g:
      trust = tcoef * |w| / (|g| + wd * |w|)  (1 when tcoef is 0 or a norm is 0)
      u = trust * (g + wd * w)                (weight decay before momentum when pre_wd)
      classic:  v = momentum * v + lr * u;  step = v (+ momentum * v with nesterov, the current u added)
      else:     v = momentum * v + u;       step = lr * (v, or u + momentum * v with nesterov)
      w = w - step
    With `ns_steps` the momentum output is orthogonalized (`Tensor.newton_schulz`) before the step; with pre_wd=False
    the weight decay is applied decoupled, after it.
    """

    def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 1e-4,
                 ns_steps: int = 0, ns_coefficients: tuple[float, ...] | None = None, nesterov: bool = False,
                 classic: bool = True, pre_wd: bool = True, tcoef: float = 0.001, device: str | None = None,
                 fused: bool | None = None):
        super().__init__(params, lr, device, fused)
        if momentum < 0 or weight_decay < 0: raise ValueError(f"momentum ({momentum}) and weight_decay ({weight_decay}) "
                                                             "must be non-negative")
        if nesterov and momentum <= 0: raise ValueError("nesterov momentum needs momentum > 0")
        self.momentum, self.wd, self.nesterov, self.classic, self.pre_wd, self.tcoef = \
            momentum, weight_decay, nesterov, classic, pre_wd, tcoef
        self.ns_steps, self.ns_coefficients = ns_steps, ns_coefficients
        if ns_steps and ns_coefficients is None: raise ValueError("ns_steps needs ns_coefficients")
        self._flat = self.fused and not tcoef and not ns_steps   # elementwise: SGD
        self.b = self._zeros_like_params() if momentum else []

    def _trust_ratio(self, w: Tensor, g: Tensor) -> Tensor | float:
        if not self.tcoef: return 1.0
        wn, gn = w.square().sum().sqrt(), g.square().sum().sqrt()
        ratio = self.tcoef * wn / (gn + self.wd * wn)
        return ((wn > 0) & (gn > 0)).where(ratio, 1.0)

    def _apply_updates(self) -> list[Tensor]:
        lr = self.lr.reshape(()).cast(self.state_dtype)
        changed = []
        for i, w, g, write in self._updates():
            trust = self._trust_ratio(w, g)
            if self.pre_wd and self.wd: g = g + self.wd * w
            g = g * trust
            if self.classic: g = g * lr
            if self.momentum:
                b = self.b[i]
                self._set(b, self.momentum * b + g, write)
                changed.append(b)
                g = g + self.momentum * b if self.nesterov else b
            if self.ns_steps:
                assert self.ns_coefficients is not None
                g = _orthogonalize(g, self.ns_steps, self.ns_coefficients)
            if not self.pre_wd and self.wd: g = g + (self.wd * lr * w if self.classic else self.wd * w)
            write(w - (g if self.classic else lr * g))
        return changed


def _orthogonalize(g: Tensor, steps: int, coefficients: tuple[float, ...], eps: float = 1e-7) -> Tensor:
    """Newton-Schulz orthogonalization of a matrix (higher ranks fold into columns), scaled by sqrt(max(1, rows/cols)).

    Iterates x <- a*x + (b*A + c*A@A) @ x with A = x @ x.T from x = g / max(|g|, eps), on the wide orientation of g.
    Each iterate is materialized: fused across iterations the chained matmuls grow without bound.
    """
    if g.ndim < 2: return g
    m = g.reshape(g.shape[0], -1)
    a, b, c = coefficients
    x = m.T if m.shape[0] > m.shape[1] else m
    x = (x / x.square().sum().sqrt().maximum(eps)).contiguous()
    for _ in range(steps):
        gram = x.matmul(x.T).contiguous()
        x = (a * x + (b * gram + c * gram.matmul(gram)).matmul(x)).contiguous()
    x = x.T if m.shape[0] > m.shape[1] else x
    return (x * math.sqrt(max(1.0, m.shape[0] / m.shape[1]))).reshape(g.shape)


def SGD(params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
        classic: bool = False, device: str | None = None, fused: bool | None = None) -> LARS:
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight decay (as torch.optim.SGD).

    >>> SGD([Tensor([1.0], requires_grad=True)], lr=0.1, momentum=0.9).momentum
    0.9
    """
    return LARS(params, lr, momentum, weight_decay, 0, None, nesterov, classic=classic, pre_wd=True, tcoef=0.0,
                device=device, fused=fused)


class Muon(Optimizer):
    """MomentUm Orthogonalized by Newton-schulz, as torch.optim.Muon (for 2-d weight matrices).

    v = momentum * v + (1 - momentum) * g;  u = (1 - momentum) * g + momentum * v with nesterov, else v
    u = newton_schulz(u) * sqrt(max(1, rows/cols));  w = w * (1 - lr * wd) - lr * u
    Parameters of other ranks: higher ranks are folded to (shape[0], -1); 0-d and 1-d ones skip the orthogonalization.
    """

    def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.95, weight_decay: float = 0.1,
                 ns_steps: int = 5, ns_coefficients: tuple[float, ...] = (3.4445, -4.775, 2.0315), nesterov: bool = True,
                 device: str | None = None, fused: bool | None = None):
        super().__init__(params, lr, device, fused)
        if not 0 <= momentum < 1: raise ValueError(f"Muon momentum must be in [0, 1), got {momentum}")
        self.momentum, self.wd, self.ns_steps, self.ns_coefficients, self.nesterov = \
            momentum, weight_decay, ns_steps, tuple(ns_coefficients), nesterov
        self.b = self._zeros_like_params()

    def _apply_updates(self) -> list[Tensor]:
        lr = self.lr.reshape(()).cast(self.state_dtype)
        changed = []
        for i, t, g in self._with_grads():
            w, b = t.detach().cast(self.state_dtype), self.b[i]
            b.assign(self.momentum * b + (1 - self.momentum) * g)
            changed.append(b)
            u = (1 - self.momentum) * g + self.momentum * b if self.nesterov else b
            u = _orthogonalize(u, self.ns_steps, self.ns_coefficients)
            _write(t, w * (1 - lr * self.wd) - lr * u)
        return changed


# ---------------------------------------------------------------------------------------------------------------------
# adaptive family: LAMB, Adam, AdamW

class LAMB(Optimizer):
    """Layer-wise adaptive moments (You et al., 2019); with adam=True it is AdamW (no trust ratio).

      m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g^2
      u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w
      trust = |w| / |u| (1 when either norm is 0, or with adam=True);   w = w - lr * trust * u
    """

    def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                 weight_decay: float = 0.0, adam: bool = False, device: str | None = None, fused: bool | None = None):
        super().__init__(params, lr, device, fused)
        if not (0 <= b1 < 1 and 0 <= b2 < 1): raise ValueError(f"betas must be in [0, 1), got {(b1, b2)}")
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        # b1^t and b2^t live in tensors so the bias correction never bakes a new constant into the kernels
        self.b1_t = _state(Tensor([1.0], dtype=dtypes.float32, device=self.device))
        self.b2_t = _state(Tensor([1.0], dtype=dtypes.float32, device=self.device))
        self._flat = self.fused and adam   # elementwise: Adam, AdamW
        self.m = self._zeros_like_params()
        self.v = self._zeros_like_params()

    def _apply_updates(self) -> list[Tensor]:
        self.b1_t.assign(self.b1_t * self.b1)
        self.b2_t.assign(self.b2_t * self.b2)
        lr = self.lr.reshape(()).cast(self.state_dtype)
        c1, c2 = (1 - self.b1_t.reshape(())).cast(self.state_dtype), (1 - self.b2_t.reshape(())).cast(self.state_dtype)
        changed = [self.b1_t, self.b2_t]
        for i, w, g, write in self._updates():
            m, v = self.m[i], self.v[i]
            self._set(m, self.b1 * m + (1 - self.b1) * g, write)
            self._set(v, self.b2 * v + (1 - self.b2) * g.square(), write)
            changed += [m, v]
            u = (m / c1) / ((v / c2).sqrt() + self.eps)
            if self.wd: u = u + self.wd * w
            if not self.adam:
                wn, un = w.square().sum().sqrt(), u.square().sum().sqrt()
                u = u * ((wn > 0) & (un > 0)).where(wn / un, 1.0)
            write(w - lr * u)
        return changed


def AdamW(params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01, device: str | None = None, fused: bool | None = None) -> LAMB:
    """Adam with decoupled weight decay (as torch.optim.AdamW)."""
    return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, device=device, fused=fused)


def Adam(params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         device: str | None = None, fused: bool | None = None) -> LAMB:
    """Adam (as torch.optim.Adam with weight_decay=0)."""
    return LAMB(params, lr, b1, b2, eps, 0.0, adam=True, device=device, fused=fused)


__all__ = ["LAMB", "LARS", "SGD", "Adam", "AdamW", "Muon", "Optimizer", "OptimizerGroup"]
