"""GPT-2 with Hugging Face parameter names (transformer.h.N.attn.c_attn, ...), loaded from model.safetensors,
pytorch_model.bin or a llama.cpp GGUF file (architecture 'gpt2'). HF's Conv1D layers store weights as (in, out), the
transpose of nn.Linear, so they are applied as x @ W + b. Generation (greedy or sampled) runs through decoding.Generator: a KV cache and TinyJit'd decode steps."""
from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from fusegrad import nn
from fusegrad.device import Device
from fusegrad.ir.ops import UOp
from fusegrad.models.activations import HF_ACTIVATIONS
from fusegrad.models.decoding import Generator, KVCache, causal_mask
from fusegrad.models.gguf_weights import GGUFWeights
from fusegrad.models.quantized import QuantizedEmbedding
from fusegrad.models.weights import (
    Namespace,
    WeightsMismatch,
    WeightsNotFound,
    fetch_files,
    load_weights,
    model_cache_dirs,
    read_checkpoint,
    read_config,
    strip_prefix,
    weight_file,
)
from fusegrad.nn.state import gguf_load
from fusegrad.tensor import Tensor


@dataclass(frozen=True)
class GPT2Config:
    """The fields of a Hugging Face GPT2Config the model uses (defaults: GPT-2 small, 124M)."""
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPT2Config:
        if d.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"config.json is for a {d['model_type']!r} model, not GPT-2")
        cfg = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        if cfg.activation_function not in HF_ACTIVATIONS:
            raise ValueError(f"activation_function {cfg.activation_function!r} is not supported "
                             f"({sorted(HF_ACTIVATIONS)})")
        return cfg




class Conv1D:
    """HF's GPT-2 projection: weight (in, out), bias (out,); y = x @ weight + bias."""

    def __init__(self, n_in: int, n_out: int):
        self.weight = Tensor.normal(n_in, n_out, std=0.02)
        self.bias = Tensor.zeros(n_out).contiguous()

    def __call__(self, x: Tensor) -> Tensor: return x @ self.weight + self.bias


class GPT2Block:
    """Pre-LayerNorm block: x + attn(ln_1(x)), then + mlp(ln_2(x)); the attention keeps a KV cache."""

    def __init__(self, cfg: GPT2Config, max_context: int, linear: Callable[[int, int, str], Any] | None = None):
        C, I = cfg.n_embd, cfg.n_inner or 4 * cfg.n_embd
        self.heads, self.act = cfg.n_head, HF_ACTIVATIONS[cfg.activation_function]
        self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=cfg.layer_norm_epsilon), nn.LayerNorm(C, eps=cfg.layer_norm_epsilon)
        # linear(in_features, out_features, "attn.c_attn") -> a module with a bias (a BiasedQuantizedLinear, say);
        # default Conv1D
        lin = linear or (lambda i, o, name: Conv1D(i, o))
        self.attn = Namespace()
        self.attn.c_attn, self.attn.c_proj = lin(C, 3 * C, "attn.c_attn"), lin(C, C, "attn.c_proj")
        self.mlp = Namespace()
        self.mlp.c_fc, self.mlp.c_proj = lin(C, I, "mlp.c_fc"), lin(I, C, "mlp.c_proj")
        self._cache = KVCache(max_context)

    def attention(self, x: Tensor, start_pos: int | UOp, mask: Tensor | None) -> Tensor:
        B, T, C = x.shape                                                        # x: (B, T, C)
        H = self.heads
        q, k, v = self.attn.c_attn(x).reshape(B, T, 3, H, C // H).permute(2, 0, 1, 3, 4)   # each (B, T, H, D)
        keys, values = self._cache.update(k, v, start_pos)                     # (B, S, H, D), S = start_pos + T
        scores = q.transpose(1, 2) @ keys.permute(0, 2, 3, 1) * (1 / math.sqrt(C // H))     # (B, H, T, S)
        if mask is not None: scores = scores + mask
        out = scores.softmax(-1) @ values.transpose(1, 2)                      # (B, H, T, D)
        return self.attn.c_proj(out.transpose(1, 2).reshape(B, T, C))

    def __call__(self, x: Tensor, start_pos: int | UOp, mask: Tensor | None) -> Tensor:
        x = x + self.attention(self.ln_1(x), start_pos, mask)
        return x + self.mlp.c_proj(self.act(self.mlp.c_fc(self.ln_2(x))))


class GPT2:
    """GPT-2 (HF names without the "transformer." prefix: wte, wpe, h.N.*, ln_f); the LM head is wte (tied).

    `forward(tokens (B, T), start_pos)` returns the logits (B, V) of the last position and caches keys/values, so the
    next call passes only the new token with start_pos = tokens so far.

    >>> m = GPT2(GPT2Config(vocab_size=11, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    >>> m.forward(Tensor([[1, 2, 3]]), 0).shape
    (1, 11)
    """

    def __init__(self, cfg: GPT2Config, max_context: int | None = None,
                 linear: Callable[[int], Callable[[int, int, str], Any]] | None = None, embed: Any | None = None):
        self.config = cfg
        self.max_context = min(max_context or cfg.n_positions, cfg.n_positions)
        # `embed`: a module for the token lookup (a QuantizedEmbedding, whose `project` is then the tied head)
        self.wte = embed if embed is not None else nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        # linear(i) makes block i's projections (GPT2Block's `linear`); default Conv1D
        self.h = [GPT2Block(cfg, self.max_context, linear(i) if linear else None) for i in range(cfg.n_layer)]
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self._generator: Generator | None = None

    def hidden(self, tokens: Tensor, start_pos: int | UOp = 0) -> Tensor:
        """The final hidden states (B, T, C) of tokens at positions start_pos.., updating the KV caches."""
        T = tokens.shape[1]
        if isinstance(start_pos, int) and start_pos + T > self.max_context:
            raise ValueError(f"{start_pos + T} tokens is longer than the model's context of {self.max_context}")
        x = self.wte(tokens) + self.wpe.weight[start_pos:start_pos + T]          # (B, T, C)
        mask = causal_mask(T, start_pos) if isinstance(start_pos, int) else None
        for block in self.h: x = block(x, start_pos, mask)
        return self.ln_f(x)

    def forward(self, tokens: Tensor, start_pos: int | UOp = 0) -> Tensor:
        """Logits (B, V) of the last token."""
        x = self.hidden(tokens, start_pos)[:, -1, :]
        return self.wte.project(x) if isinstance(self.wte, QuantizedEmbedding) else x @ self.wte.weight.T

    def generate(self, prompt: list[int], max_new: int, temperature: float = 0.0, jit: bool = True) -> list[int]:
        """New token ids after `prompt` (greedy when temperature is 0). Raises ValueError when the prompt (or the prompt
        plus max_new) is longer than the context."""
        if self._generator is None or self._generator.jit != jit: self._generator = Generator(self, jit=jit)
        return self._generator.generate(prompt, max_new, temperature).tokens

    @classmethod
    def from_pretrained(cls, path: str | pathlib.Path, max_context: int | None = None) -> GPT2:
        """Load a folder written by transformers' save_pretrained (config.json + model.safetensors or
        pytorch_model.bin). max_context caps the KV cache (default: the config's n_positions)."""
        d = pathlib.Path(path)
        if d.suffix == ".gguf": return cls.from_gguf(d, max_context)
        if d.is_file(): d = d.parent
        wf = weight_file(d) if d.is_dir() else None
        if wf is None:
            raise WeightsNotFound(f"{path}: no model.safetensors or pytorch_model.bin there (GPT-2 weights can't be "
                                  "downloaded by fusegrad: pass a folder saved with transformers' save_pretrained)")
        cfg = GPT2Config.from_dict(read_config(d))
        model = cls(cfg, max_context)
        load_weights(model, wf, f"GPT-2 ({cfg.n_layer} layers x {cfg.n_embd})",
                     sd=strip_prefix(read_checkpoint(wf), "transformer."),
                     ignore=lambda k: k == "lm_head.weight" or k.endswith((".attn.bias", ".attn.masked_bias")))
        return model


    @classmethod
    def from_gguf(cls, path: str | pathlib.Path, max_context: int | None = None, quantized: bool = True) -> GPT2:
        """Load a llama.cpp GGUF file of architecture 'gpt2': the config from its `gpt2.*` metadata, llama.cpp's names
        (`token_embd`, `position_embd`, `blk.N.attn_qkv`, ...) mapped to HF's, its projection weights (stored as
        (out, in), like nn.Linear) transposed back to Conv1D's (in, out). Every tensor type gguf_load reads works. With
        `quantized` (the default) the projections stored in a type models/quantized.py keeps stay in their blocks
        (BiasedQuantizedLinear: x @ W.T + b, W as the file stores it) and so does the embedding table (its `project`
        is the tied head), as in `Llama.from_gguf`; the rest, and everything with quantized=False, is dequantized to
        float32 when loaded. The file's `output.weight` is the tied embedding again and is not read."""
        meta, tensors = gguf_load(path)
        if (arch := meta.get("general.architecture")) != "gpt2":
            raise WeightsMismatch(f"{path}: general.architecture is {arch!r}, not 'gpt2'")

        def get(k: str) -> Any:
            if f"gpt2.{k}" not in meta: raise WeightsMismatch(f"{path}: metadata gpt2.{k} is missing")
            return meta[f"gpt2.{k}"]
        C = get("embedding_length")
        cfg = GPT2Config(vocab_size=tensors.shape_of("token_embd.weight")[0], n_positions=get("context_length"),
                         n_embd=C, n_layer=get("block_count"), n_head=get("attention.head_count"),
                         n_inner=get("feed_forward_length"), layer_norm_epsilon=get("attention.layer_norm_epsilon"))
        names = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
                 "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}
        for i in range(cfg.n_layer):
            for hf, gg in _GGUF_GPT2_LAYER.items():
                for part in ("weight", "bias"): names[f"h.{i}.{hf}.{part}"] = f"blk.{i}.{gg}.{part}"
        sd = _GGUFConv1D(tensors, names, quantized)

        def linear(i: int) -> Callable[[int, int, str], Any]:
            def make(n_in: int, n_out: int, name: str) -> Any:
                q = sd.quantized_linear(f"h.{i}.{name}.weight", n_in, n_out, bias=True)
                return q if q is not None else Conv1D(n_in, n_out)
            return make
        embed = sd.quantized_embedding("wte.weight", cfg.vocab_size, C)
        model = cls(cfg, max_context, linear=linear, embed=embed)
        load_weights(model, path, f"GPT-2 ({cfg.n_layer} layers x {C})", sd=sd)
        Device[Device.DEFAULT].allocator.free_cache()   # the loading's temporaries (see Llama.from_gguf)
        return model


# HF GPT-2 module -> llama.cpp's GGUF name (each with .weight and .bias)
_GGUF_GPT2_LAYER = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
                    "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


class _GGUFConv1D(GGUFWeights):
    """A GPT-2 GGUF file's tensors under HF's names, the 2-D projection weights not kept quantized transposed to
    Conv1D's (in, out)."""

    def _conv(self, k: str) -> bool: return k.endswith(".weight") and (".attn.c_" in k or ".mlp.c_" in k)

    def value(self, k: str) -> Tensor:
        t = super().value(k)
        return t.T.contiguous() if self._conv(k) else t

    def shape_of(self, k: str) -> tuple[int, ...]:
        s = super().shape_of(k)
        return s[::-1] if self._conv(k) else s


GPT2_NAMES = ("openai-community/gpt2", "gpt2")


def find_gpt2_dir(path: str | pathlib.Path | None = None) -> pathlib.Path:
    """The folder with GPT-2's weights and tokenizer: `path` when given, else fusegrad's download cache (or a download
    with fusegrad.helpers.fetch where fusegrad has it). Raises WeightsNotFound saying what to pass."""
    if path is not None:
        d = pathlib.Path(path).expanduser()
        if d.is_file(): d = d.parent
        if not d.is_dir() or weight_file(d) is None:
            raise WeightsNotFound(f"{path}: no model.safetensors or pytorch_model.bin there")
        return d
    looked = []
    for name in GPT2_NAMES:
        for d in model_cache_dirs(name):
            looked.append(str(d))
            if weight_file(d) is not None: return d
    got = fetch_files(GPT2_NAMES[0], ["config.json", "model.safetensors", "vocab.json", "merges.txt"])
    if got is not None: return got
    raise WeightsNotFound("no GPT-2 weights found" + (f" (looked in {', '.join(looked)})" if looked else "") +
                          ": pass --weights DIR, a folder written by transformers' save_pretrained that also holds "
                          "the tokenizer's vocab.json and merges.txt")


__all__ = ["GPT2", "GPT2Config", "find_gpt2_dir"]
