"""Neural-network layers: plain Python objects holding parameter Tensors, called like functions.

There is no Module base class: a model is any object, and `nn.state.get_parameters(model)` finds its tensors by walking
attributes, lists and dicts. Parameter names, shapes and initialisation follow PyTorch's, so `state_dict` layouts match
and checkpoints load with `nn.state.load_state_dict`. Trainable weights are marked with `is_param_()` (they get their own
graph node and a gradient); running statistics are buffers with `requires_grad=False`.

>>> from fusegrad import Tensor, nn
>>> layer = nn.Linear(4, 2)
>>> layer(Tensor.ones(3, 4)).shape
(3, 2)
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

from fusegrad.dtype import dtypes, least_upper_dtype, reduce_acc_dtype
from fusegrad.helpers import TRAINING, make_tuple, prod
from fusegrad.autograd import custom_grad
from fusegrad.nn import datasets, optim, state
from fusegrad.tensor import Tensor


def _param(t: Tensor) -> Tensor:
    """A trainable weight. is_param_ gives it a graph node of its own (identical constants would otherwise share one,
    and so share a gradient); it is computed on first use."""
    return t.is_param_()


def _buffer(t: Tensor) -> Tensor:
    """A non-trainable tensor that belongs to the state dict (running statistics, counters)."""
    t.requires_grad = False
    return t


_SKIP_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar("fusegrad.nn.skip_init", default=False)


@contextlib.contextmanager
def skip_init() -> Iterator[None]:
    """Layers made inside this block get uninitialized (`Tensor.empty`) weights instead of random ones: for a model
    whose weights are loaded right after, this skips computing values that would be overwritten.

    >>> with skip_init(): big = Linear(1024, 1024)
    >>> big.weight.shape
    (1024, 1024)
    """
    token = _SKIP_INIT.set(True)
    try:
        yield
    finally:
        _SKIP_INIT.reset(token)


def _uniform(*shape: int, bound: float) -> Tensor:
    if _SKIP_INIT.get(): return _param(Tensor.empty(*shape))
    return _param(Tensor.uniform(*shape, low=-bound, high=bound))


def is_training() -> bool:
    """Training mode: `Tensor.training` (set by `with Tensor.train():`) or the TRAINING context flag."""
    return bool(Tensor.training) or bool(TRAINING)


# ---------------------------------------------------------------------------------------------------------------------
# dense and convolutional layers

class Linear:
    """y = x @ weight.T + bias, weight (out_features, in_features), both uniform(-1/sqrt(in), 1/sqrt(in)).

    >>> Linear(3, 5).weight.shape
    (5, 3)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform(out_features, in_features, bound=bound)
        self.bias = _uniform(out_features, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight.transpose(), self.bias)


class Conv2d:
    """N-d convolution (the kernel's length sets N): x (N, Cin, *S) -> (N, Cout, *O).

    weight (out_channels, in_channels/groups, *kernel_size) and bias (out_channels,) are uniform(-s, s) with
    s = 1/sqrt(in_channels * prod(kernel_size)). `padding` is an int, one int per spatial dim, 2 per dim in torch's flat
    order, or 'same'/'valid' ('same' needs stride 1).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: Any = 1,
                 padding: int | tuple[int, ...] | str = 0, dilation: Any = 1, groups: int = 1, bias: bool = True):
        self.kernel_size = make_tuple(kernel_size, 2)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must divide by groups ({groups})")
        if isinstance(padding, str):
            if padding not in ("same", "valid"): raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}")
            if padding == "same" and any(s != 1 for s in make_tuple(stride, len(self.kernel_size))):
                raise ValueError("padding='same' is not supported for strided convolutions")
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        bound = 1 / math.sqrt(in_channels * prod(self.kernel_size))
        self.weight = _uniform(out_channels, in_channels // groups, *self.kernel_size, bound=bound)
        self.bias = _uniform(out_channels, bound=bound) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation,
                        padding=self.padding)


def Conv1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int | str = 0,
           dilation: int = 1, groups: int = 1, bias: bool = True) -> Conv2d:
    """1-d convolution over (N, Cin, L): a Conv2d with a one-element kernel tuple."""
    return Conv2d(in_channels, out_channels, (kernel_size,), stride, padding, dilation, groups, bias)


class ConvTranspose2d(Conv2d):
    """Transposed convolution; weight is (in_channels, out_channels/groups, *kernel_size), as in PyTorch."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: Any = 1,
                 padding: Any = 0, output_padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
        bound = 1 / math.sqrt(in_channels * prod(self.kernel_size))
        self.weight = _uniform(in_channels, out_channels // groups, *self.kernel_size, bound=bound)
        self.output_padding = output_padding

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride,
                                  dilation=self.dilation, padding=self.padding, output_padding=self.output_padding)


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                    output_padding: int = 0, dilation: int = 1, groups: int = 1, bias: bool = True) -> ConvTranspose2d:
    """1-d transposed convolution: a ConvTranspose2d with a one-element kernel tuple."""
    return ConvTranspose2d(in_channels, out_channels, (kernel_size,), stride, padding, output_padding, dilation, groups,
                           bias)


# ---------------------------------------------------------------------------------------------------------------------
# normalization

class BatchNorm:
    """Batch normalization over axis 1 of (N, C, *): inputs of any rank (BatchNorm1d/2d/3d in one class).

    In training mode (`with Tensor.train():` or `Context(TRAINING=1)`) it normalizes with the batch statistics and
    updates `running_mean`, `running_var` (unbiased) and `num_batches_tracked`; otherwise it uses the running statistics.
    With `track_running_stats=False` it always uses batch statistics and keeps no buffers.
    """

    def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
                 momentum: float = 0.1):
        self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
        self.weight: Tensor | None = _param(Tensor.ones(sz)) if affine else None
        self.bias: Tensor | None = _param(Tensor.zeros(sz)) if affine else None
        self.num_batches_tracked: Tensor | None = None
        self.running_mean: Tensor | None = None
        self.running_var: Tensor | None = None
        if track_running_stats:
            self.running_mean, self.running_var = _buffer(Tensor.zeros(sz)), _buffer(Tensor.ones(sz))
            self.num_batches_tracked = _buffer(Tensor.zeros((), dtype=dtypes.int64))

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(mean, 1/sqrt(var + eps)) over every axis but 1: the batch's in training mode, else the running ones."""
        if is_training() or self.running_mean is None or self.running_var is None:
            mean, var = _batch_mean_var(x)
            return mean, (var + self.eps).rsqrt()
        return self.running_mean, (self.running_var + self.eps).rsqrt()

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2: raise ValueError(f"BatchNorm expects (N, C, ...) input, got shape {x.shape}")
        if is_training() or self.running_mean is None or self.running_var is None: return self._batch_stats(x)
        mean, invstd = self.calc_stats(x)
        return x.batchnorm(self.weight, self.bias, mean, invstd)

    def _batch_stats(self, x: Tensor) -> Tensor:
        """Normalize with the batch's statistics, with the closed-form gradient: per channel, with xhat the
        normalized input and n the elements per channel, dx = weight * invstd / n * (n g - sum(g) - xhat sum(g xhat)),
        dweight = sum(g xhat), dbias = sum(g). Two reductions backward, where differentiating through mean and var
        takes five (and their elementwise kernels).
        float16 and bfloat16 inputs are normalized, and their gradient computed, in float32 (`reduce_acc_dtype`, as
        torch does) and rounded once: in half, n g overflowed past 65504 (n = 65536 elements per channel gave NaN)."""
        axes = tuple(a for a in range(x.ndim) if a != 1)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        n = x.numel() // x.shape[1]
        params = [p for p in (self.weight, self.bias) if p is not None]
        out_dtype = least_upper_dtype(x.dtype, *[p.dtype for p in params])
        xd = x.detach().cast(reduce_acc_dtype(x.dtype))
        mean, var = _batch_mean_var(xd)
        invstd = (var + self.eps).rsqrt()
        if is_training() and self.running_mean is not None and self.running_var is not None:
            self._update_running_stats(mean, var * (n / max(n - 1, 1)))
        value = xd.batchnorm(*[p.detach() if p is not None else None for p in (self.weight, self.bias)], mean,
                             invstd).cast(out_dtype)
        if not (x.requires_grad or any(p.requires_grad for p in params)): return value
        w, has_bias = self.weight, self.bias is not None

        def backward(g: Tensor, *_: Tensor) -> list[Tensor]:
            # the incoming gradient is often a fused expression (max_pool2d's backward, with its window permute) that
            # both sums and dx would each recompute with strided loads: compute it once (bs512 step: ~4 x 12 ms -> 3 ms)
            g = g.contiguous().cast(reduce_acc_dtype(g.dtype))
            xhat = (xd - mean.reshape(shape)) * invstd.reshape(shape)
            gsum, gxhat = g.sum(axes), (g * xhat).sum(axes)
            scale = invstd if w is None else invstd * w.detach()
            dx = (g * n - gsum.reshape(shape) - xhat * gxhat.reshape(shape)) * (scale / n).reshape(shape)
            return [dx.cast(x.dtype)] + ([gxhat.cast(w.dtype)] if w is not None else []) + \
                ([gsum.cast(self.bias.dtype)] if has_bias else [])
        return custom_grad(value, [x] + params, backward, "batchnorm")

    def _update_running_stats(self, mean: Tensor, var_unbiased: Tensor) -> None:
        assert self.running_mean is not None and self.running_var is not None and self.num_batches_tracked is not None
        m = self.momentum
        rm, rv = self.running_mean, self.running_var
        rm.assign(((1 - m) * rm + m * mean.detach()).cast(rm.dtype))
        rv.assign(((1 - m) * rv + m * var_unbiased.detach()).cast(rv.dtype))
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        for b in (self.running_mean, self.running_var, self.num_batches_tracked): b.requires_grad = False


def _batch_mean_var(x: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and biased variance (as torch normalizes) over every axis but 1."""
    axes = tuple(a for a in range(x.ndim) if a != 1)
    mean = x.mean(axes)
    return mean, (x - mean.reshape((1, -1) + (1,) * (x.ndim - 2))).square().mean(axes)


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class GroupNorm:
    """Normalize each of `num_groups` channel groups of (N, C, *) over its channels and spatial positions."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_channels % num_groups:
            raise ValueError(f"num_channels ({num_channels}) must divide by num_groups ({num_groups})")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = _param(Tensor.ones(num_channels)) if affine else None
        self.bias = _param(Tensor.zeros(num_channels)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        y = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
        return _channel_affine(y, self.weight, self.bias)


class InstanceNorm:
    """Normalize each channel of each sample of (N, C, *) over its spatial positions (affine by default)."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        self.num_features, self.eps = num_features, eps
        self.weight = _param(Tensor.ones(num_features)) if affine else None
        self.bias = _param(Tensor.zeros(num_features)) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        y = x.reshape(x.shape[0], x.shape[1], -1).layernorm(eps=self.eps).reshape(x.shape)
        return _channel_affine(y, self.weight, self.bias)


def _channel_affine(y: Tensor, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    shape = (1, y.shape[1]) + (1,) * (y.ndim - 2)
    if weight is not None: y = y * weight.reshape(shape)
    if bias is not None: y = y + bias.reshape(shape)
    return y


class LayerNorm:
    """Normalize over the trailing `normalized_shape` axes, then scale by `weight` and shift by `bias`."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = _param(Tensor.ones(*self.normalized_shape)) if elementwise_affine else None
        self.bias = _param(Tensor.zeros(*self.normalized_shape)) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[-len(self.normalized_shape):] != self.normalized_shape:
            raise ValueError(f"LayerNorm{self.normalized_shape}: last dims of input shape {x.shape} don't match")
        y = x.layernorm(eps=self.eps, axis=self.axis)
        if self.weight is None or self.bias is None: return y
        return y * self.weight + self.bias


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channel axis of NCHW input."""

    def __call__(self, x: Tensor) -> Tensor:
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RMSNorm:
    """x / sqrt(mean(x^2 over the last axis) + eps) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
        self.eps = eps
        self.weight = _param(Tensor.ones(dim)) if elementwise_affine else None

    def _norm(self, x: Tensor) -> Tensor:
        return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()

    def __call__(self, x: Tensor) -> Tensor:
        y = self._norm(x.float()).cast(x.dtype)
        return y if self.weight is None else y * self.weight


# ---------------------------------------------------------------------------------------------------------------------
# embeddings and recurrent cells

class Embedding:
    """A lookup table: integer indices of any shape -> rows of `weight` (vocab_size, embed_size), glorot-uniform."""

    def __init__(self, vocab_size: int, embed_size: int):
        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        self.weight = _param(Tensor.empty(vocab_size, embed_size) if _SKIP_INIT.get() else
                             Tensor.glorot_uniform(vocab_size, embed_size))

    def __call__(self, idx: Tensor) -> Tensor:
        if not dtypes.is_int(idx.dtype): raise TypeError(f"Embedding expects integer indices, got {idx.dtype}")
        return self.weight[idx]


class LSTMCell:
    """One LSTM step: (x (B, in), (h, c) each (B, hidden)) -> (h', c'), PyTorch's gate order i, f, g, o.

    Weights `weight_ih` (4*hidden, in), `weight_hh` (4*hidden, hidden) and biases are uniform(-1/sqrt(hidden), ...).
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        bound = 1 / math.sqrt(hidden_size)
        self.hidden_size = hidden_size
        self.weight_ih = _uniform(4 * hidden_size, input_size, bound=bound)
        self.weight_hh = _uniform(4 * hidden_size, hidden_size, bound=bound)
        self.bias_ih = _uniform(4 * hidden_size, bound=bound) if bias else None
        self.bias_hh = _uniform(4 * hidden_size, bound=bound) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if hc is None:
            z = Tensor.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            hc = (z, z)
        h, c = hc
        # materializing the gates and the cell state keeps each kernel (and the backward graph through many steps) small
        gates = x.linear(self.weight_ih.transpose(), self.bias_ih) + h.linear(self.weight_hh.transpose(), self.bias_hh)
        i, f, g, o = gates.contiguous().chunk(4, dim=1)                      # each (B, hidden)
        c_new = (f.sigmoid() * c + i.sigmoid() * g.tanh()).contiguous()
        h_new = o.sigmoid() * c_new.tanh()
        return h_new, c_new


__all__ = [
    "BatchNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Conv1d",
    "Conv2d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "Embedding",
    "GroupNorm",
    "InstanceNorm",
    "LSTMCell",
    "LayerNorm",
    "LayerNorm2d",
    "Linear",
    "RMSNorm",
    "datasets",
    "optim",
    "skip_init",
    "state",
]
