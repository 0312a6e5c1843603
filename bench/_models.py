"""Benchmark models built with fusegrad's Tensor API, with random weights of the real shapes, each next to the PyTorch
model it mirrors (the same weights, so the two outputs can be compared).

- EfficientNet-Lite0: the architecture of the `efficientnet-lite-pytorch` package (`EfficientNet.from_name`), read
  module by module from its torch model (stem, 16 MBConv blocks with ReLU6 and no squeeze-excitation, head, fc).
- MiniLM: a BERT encoder of 6 layers, 384 hidden, 12 heads, 1536 FFN (transformers' `BertModel` as the torch side).
Both run in inference mode (BatchNorm with running statistics, no dropout).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fusegrad import Tensor


def _t(p: Any) -> Tensor:
    return Tensor(p.detach().cpu().numpy().astype(np.float32).copy()).realize()


# ----- EfficientNet-Lite0 ---------------------------------------------------------------------------------------------

class _ConvBN:
    """Conv2dStaticSamePadding (zero pad, then conv) + BatchNorm2d in eval mode, optionally ReLU6."""

    def __init__(self, conv: Any, bn: Any, act: bool):
        self.w = _t(conv.weight)
        self.stride, self.groups = tuple(conv.stride), conv.groups
        pad = getattr(conv.static_padding, "padding", (0, 0, 0, 0))
        self.pad = tuple(pad) if isinstance(pad, (tuple, list)) else (pad,) * 4   # (left, right, top, bottom)
        self.scale = _t(bn.weight / (bn.running_var + bn.eps).sqrt()).reshape(1, -1, 1, 1)
        self.shift = _t(bn.bias - bn.running_mean * bn.weight / (bn.running_var + bn.eps).sqrt()).reshape(1, -1, 1, 1)
        self.act = act

    def __call__(self, x: Tensor) -> Tensor:
        if any(self.pad): x = x.pad(self.pad)
        x = x.conv2d(self.w, groups=self.groups, stride=self.stride) * self.scale + self.shift
        return x.relu6() if self.act else x


class _MBConv:
    def __init__(self, blk: Any):
        a = blk._block_args
        self.expand = _ConvBN(blk._expand_conv, blk._bn0, True) if a.expand_ratio != 1 else None
        self.dw = _ConvBN(blk._depthwise_conv, blk._bn1, True)
        self.project = _ConvBN(blk._project_conv, blk._bn2, False)
        self.skip = blk.id_skip and a.stride in (1, [1, 1], (1, 1)) and a.input_filters == a.output_filters

    def __call__(self, x: Tensor) -> Tensor:
        y = self.expand(x) if self.expand is not None else x
        y = self.project(self.dw(y))
        return y + x if self.skip else y


class EfficientNetLite0:
    """fusegrad's EfficientNet-Lite0, with the weights of `torch_model` (from `torch_efficientnet_lite0`)."""

    def __init__(self, torch_model: Any):
        m = torch_model
        assert not m._global_params.use_se and m._global_params.relu_fn == "relu6"
        self.stem = _ConvBN(m._conv_stem, m._bn0, True)
        self.blocks = [_MBConv(b) for b in m._blocks]
        self.head = _ConvBN(m._conv_head, m._bn1, True)
        self.fc_w, self.fc_b = _t(m._fc.weight), _t(m._fc.bias)

    def __call__(self, x: Tensor) -> Tensor:   # (B, 3, 224, 224) -> (B, 1000)
        x = self.stem(x)
        for b in self.blocks: x = b(x)
        x = self.head(x).mean((2, 3))
        return x.linear(self.fc_w.T, self.fc_b)


def torch_efficientnet_lite0(seed: int = 0) -> Any:
    import torch
    from efficientnet_lite_pytorch import EfficientNet
    torch.manual_seed(seed)
    m = EfficientNet.from_name("efficientnet-lite0")
    with torch.no_grad():   # random running statistics, so BatchNorm isn't the identity
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


# ----- MiniLM (BERT encoder) ------------------------------------------------------------------------------------------

class _BertLayer:
    def __init__(self, layer: Any, heads: int):
        att = layer.attention
        self.q, self.qb = _t(att.self.query.weight).T, _t(att.self.query.bias)
        self.k, self.kb = _t(att.self.key.weight).T, _t(att.self.key.bias)
        self.v, self.vb = _t(att.self.value.weight).T, _t(att.self.value.bias)
        self.o, self.ob = _t(att.output.dense.weight).T, _t(att.output.dense.bias)
        self.ln1 = (_t(att.output.LayerNorm.weight), _t(att.output.LayerNorm.bias), att.output.LayerNorm.eps)
        self.i, self.ib = _t(layer.intermediate.dense.weight).T, _t(layer.intermediate.dense.bias)
        self.f, self.fb = _t(layer.output.dense.weight).T, _t(layer.output.dense.bias)
        self.ln2 = (_t(layer.output.LayerNorm.weight), _t(layer.output.LayerNorm.bias), layer.output.LayerNorm.eps)
        self.heads = heads

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor:   # x (B, T, H), mask (B, 1, 1, T) additive
        B, T, H = x.shape
        nh, hd = self.heads, H // self.heads

        def split(t: Tensor) -> Tensor: return t.reshape(B, T, nh, hd).transpose(1, 2)   # (B, nh, T, hd)
        q, k, v = split(x.linear(self.q, self.qb)), split(x.linear(self.k, self.kb)), split(x.linear(self.v, self.vb))
        att = ((q @ k.transpose(2, 3)) * (1.0 / hd ** 0.5) + mask).softmax(-1)
        ctx = (att @ v).transpose(1, 2).reshape(B, T, H)
        w, b, eps = self.ln1
        x = (ctx.linear(self.o, self.ob) + x).layernorm(eps=eps) * w + b
        h = x.linear(self.i, self.ib).gelu()
        w, b, eps = self.ln2
        return (h.linear(self.f, self.fb) + x).layernorm(eps=eps) * w + b


class MiniLM:
    """fusegrad's BERT encoder with the weights of `torch_model` (from `torch_minilm`): embeddings + 6 layers."""

    def __init__(self, torch_model: Any):
        e = torch_model.embeddings
        self.word, self.pos, self.typ = _t(e.word_embeddings.weight), _t(e.position_embeddings.weight), \
            _t(e.token_type_embeddings.weight)
        self.ln = (_t(e.LayerNorm.weight), _t(e.LayerNorm.bias), e.LayerNorm.eps)
        heads = torch_model.config.num_attention_heads
        self.layers = [_BertLayer(layer, heads) for layer in torch_model.encoder.layer]

    def __call__(self, ids: Tensor, attn: Tensor) -> Tensor:   # ids (B, T) int, attn (B, T) float of 0/1
        B, T = ids.shape
        x = self.word[ids] + self.pos[:T].reshape(1, T, -1) + self.typ[0].reshape(1, 1, -1)
        w, b, eps = self.ln
        x = x.layernorm(eps=eps) * w + b
        mask = ((1.0 - attn) * -1e4).reshape(B, 1, 1, T)
        for layer in self.layers: x = layer(x, mask)
        return x


def torch_minilm(seed: int = 0) -> Any:
    import torch
    from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, max_position_embeddings=512, attn_implementation="eager")
    return BertModel(cfg, add_pooling_layer=False).eval()
