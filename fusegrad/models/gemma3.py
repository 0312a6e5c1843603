"""Gemma 3's text decoder with Hugging Face Gemma3ForCausalLM parameter names, loaded from safetensors or from a
llama.cpp GGUF file (architecture 'gemma3'). It differs from LLaMA (models/llama.py, whose RoPE tables and KV cache it
uses) in: the embedding scaled by sqrt(hidden_size); RMSNorm scaling by (1 + weight); a norm after attention and
after the MLP besides the two before them; RMSNorm over each head's queries and keys before RoPE; attention scaled by
query_pre_attn_scalar^-0.5; a GELU-gated MLP; and layers of two kinds: sliding-window layers (each query sees the
last `sliding_window` keys, RoPE base rope_local_base_freq) and full-attention layers (every 6th by default, RoPE base
rope_theta, which RoPE scaling applies to)."""
from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fusegrad import nn
from fusegrad.device import Device
from fusegrad.dtype import dtypes
from fusegrad.ir.ops import UOp
from fusegrad.models.decoding import Generator, KVCache, causal_mask
from fusegrad.models.gguf_weights import GGUFWeights
from fusegrad.models.llama import RopeTables, apply_rope, rope_tables
from fusegrad.models.quantized import QuantizedEmbedding
from fusegrad.models.weights import (
    Namespace,
    Renamed,
    WeightsMismatch,
    WeightsNotFound,
    load_weights,
    read_checkpoint,
    read_config,
    weight_file,
)
from fusegrad.nn.state import gguf_load
from fusegrad.tensor import Tensor

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Gemma3Config:
    """The fields of a Hugging Face Gemma3TextConfig the model uses (defaults: transformers' defaults)."""
    vocab_size: int = 262208
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 26
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 256
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0           # full-attention layers
    rope_local_base_freq: float = 10_000.0    # sliding-window layers
    rope_scaling: tuple[tuple[str, Any], ...] | None = None   # full-attention layers only (HF's rope_scaling items)
    query_pre_attn_scalar: float = 256
    sliding_window: int = 4096
    layer_types: tuple[str, ...] = ()
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    hidden_activation: str = "gelu_pytorch_tanh"

    def __post_init__(self) -> None:
        if not self.layer_types:   # every 6th layer sees every key, the others a sliding window (HF's default)
            object.__setattr__(self, "layer_types", tuple(FULL if (i + 1) % 6 == 0 else SLIDING
                                                          for i in range(self.num_hidden_layers)))
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {SLIDING, FULL}:
            raise ValueError(f"layer_types {self.layer_types} must name {SLIDING!r} or {FULL!r} for each of the "
                             f"{self.num_hidden_layers} layers")
        if self.hidden_activation not in ("gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"hidden_activation {self.hidden_activation!r} is not supported")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.num_attention_heads} attention heads can't be shared by "
                             f"{self.num_key_value_heads} key/value heads")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Gemma3Config:
        """From config.json of a Gemma3ForCausalLM (`gemma3_text`), or the text part of a Gemma3ForConditionalGeneration
        (`gemma3`, its `text_config`). transformers 4 keeps rope_theta, rope_local_base_freq and rope_scaling at the
        top; 5 keeps them per layer kind in rope_parameters."""
        if d.get("model_type") == "gemma3" and "text_config" in d: d = d["text_config"]
        if d.get("model_type", "gemma3_text") not in ("gemma3_text", "gemma3"):
            raise ValueError(f"config.json is for a {d['model_type']!r} model, not Gemma 3")
        d = dict(d)
        rope = d.get("rope_parameters") or {}
        if FULL in rope or SLIDING in rope:
            full, local = dict(rope.get(FULL) or {}), dict(rope.get(SLIDING) or {})
            if "rope_theta" in full: d["rope_theta"] = full["rope_theta"]
            if "rope_theta" in local: d["rope_local_base_freq"] = local["rope_theta"]
            if local.get("rope_type", "default") != "default":
                raise ValueError(f"RoPE scaling {local} on sliding-window layers is not supported")
        else: full = dict(d.get("rope_scaling") or {})
        kind = full.get("rope_type", full.get("type", "default"))
        if kind != "default":
            d["rope_scaling"] = tuple(sorted({**{k: v for k, v in full.items() if k not in ("rope_theta", "type")},
                                              "rope_type": kind}.items()))
        else: d["rope_scaling"] = None
        if d.get("attention_bias"): raise ValueError("attention_bias is not supported")
        if d.get("use_bidirectional_attention"): raise ValueError("use_bidirectional_attention is not supported")
        if d.get("layer_types") is not None: d["layer_types"] = tuple(d["layer_types"])
        elif d.get("sliding_window_pattern"):
            n = int(d["sliding_window_pattern"])
            d["layer_types"] = tuple(FULL if (i + 1) % n == 0 else SLIDING for i in range(d["num_hidden_layers"]))
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d and d[f.name] is not None})


class GemmaRMSNorm:
    """x / rms(x) * (1 + weight), in float32 (Gemma's form: the weight is an offset from 1, zeros at init)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        self.eps, self.weight = eps, Tensor.zeros(dim).contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * (xf.square().mean(-1, keepdim=True) + self.eps).rsqrt() * (1 + self.weight)).cast(x.dtype)


def _softcap(x: Tensor, cap: float | None) -> Tensor: return x if cap is None else (x / cap).tanh() * cap


def sliding_mask(T: int, start_pos: int | UOp, window: int, max_context: int) -> Tensor | None:
    """The additive mask (1, 1, T, start_pos + T) of a sliding-window layer: query i (at position start_pos + i) sees
    keys j with start_pos + i - window < j <= start_pos + i. None when no query can have a key outside its window (the
    context fits in the window). With a symbolic start_pos (a decode step, T == 1) the mask reads the variable."""
    if max_context <= window: return causal_mask(T, start_pos) if isinstance(start_pos, int) else None
    if isinstance(start_pos, int):
        q = np.arange(start_pos, start_pos + T)[:, None]
        k = np.arange(start_pos + T)[None, :]
        m = np.where((k <= q) & (k > q - window), 0.0, -np.inf).astype(np.float32)
        return Tensor(m.reshape(1, 1, T, start_pos + T))
    assert T == 1, "a symbolic start_pos is a decode step of one token"
    keys = Tensor.arange(max_context, dtype=dtypes.int32)[:start_pos + 1]              # (start_pos + 1,)
    return (keys > start_pos - window).where(0.0, -math.inf).reshape(1, 1, 1, start_pos + 1)


class Gemma3Layer:
    """x + post_attention_layernorm(attn(input_layernorm(x))), then + post_feedforward_layernorm(mlp(
    pre_feedforward_layernorm(x))); attention keeps a KV cache."""

    def __init__(self, cfg: Gemma3Config, kind: str, max_context: int,
                 linear: Callable[[int, int, str], Any] | None = None):
        C, H, KV, D = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.H, self.KV, self.D, self.kind, self.cfg = H, KV, D, kind, cfg
        # linear(in_features, out_features, "self_attn.q_proj") -> a module (a QuantizedLinear, say); default nn.Linear
        lin = linear or (lambda i, o, name: nn.Linear(i, o, bias=False))
        self.self_attn = Namespace()
        a = self.self_attn
        a.q_proj, a.k_proj = lin(C, H * D, "self_attn.q_proj"), lin(C, KV * D, "self_attn.k_proj")
        a.v_proj, a.o_proj = lin(C, KV * D, "self_attn.v_proj"), lin(H * D, C, "self_attn.o_proj")
        a.q_norm, a.k_norm = GemmaRMSNorm(D, cfg.rms_norm_eps), GemmaRMSNorm(D, cfg.rms_norm_eps)
        self.mlp = Namespace()
        I = cfg.intermediate_size
        self.mlp.gate_proj, self.mlp.up_proj = lin(C, I, "mlp.gate_proj"), lin(C, I, "mlp.up_proj")
        self.mlp.down_proj = lin(I, C, "mlp.down_proj")
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            setattr(self, n, GemmaRMSNorm(C, cfg.rms_norm_eps))
        self._cache = KVCache(max_context)

    def attention(self, x: Tensor, cos: Tensor, sin: Tensor, start_pos: int | UOp, mask: Tensor | None) -> Tensor:
        B, T, _ = x.shape
        H, KV, D, a = self.H, self.KV, self.D, self.self_attn
        q = apply_rope(a.q_norm(a.q_proj(x).reshape(B, T, H, D)), cos, sin)
        k = apply_rope(a.k_norm(a.k_proj(x).reshape(B, T, KV, D)), cos, sin)
        keys, values = self._cache.update(k, a.v_proj(x).reshape(B, T, KV, D), start_pos)   # (B, S, KV, D)
        q = q.permute(0, 2, 1, 3).reshape(B, KV, H // KV, T, D)                           # (B, KV, G, T, D)
        scores = q @ keys.permute(0, 2, 3, 1).unsqueeze(2) * self.cfg.query_pre_attn_scalar ** -0.5
        scores = _softcap(scores, self.cfg.attn_logit_softcapping)
        if mask is not None: scores = scores + mask.unsqueeze(1)
        out = scores.softmax(-1) @ values.permute(0, 2, 1, 3).unsqueeze(2)                 # (B, KV, G, T, D)
        return a.o_proj(out.reshape(B, H, T, D).permute(0, 2, 1, 3).reshape(B, T, H * D))

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, start_pos: int | UOp, mask: Tensor | None) -> Tensor:
        x = x + self.post_attention_layernorm(self.attention(self.input_layernorm(x), cos, sin, start_pos, mask))
        h = self.pre_feedforward_layernorm(x)
        act = self.mlp.gate_proj(h).gelu() if self.cfg.hidden_activation == "gelu_pytorch_tanh" else \
            self.mlp.gate_proj(h).gelu(approximate="none")
        return x + self.post_feedforward_layernorm(self.mlp.down_proj(act * self.mlp.up_proj(h)))


class Gemma3:
    """Gemma3ForCausalLM: model.embed_tokens, model.layers.N.*, model.norm; the output head is the embedding (tied).
    `forward(tokens (B, T), start_pos)` -> logits (B, V) of the last token, caching keys/values.

    >>> m = Gemma3(Gemma3Config(vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
    ...                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, sliding_window=4,
    ...                         max_position_embeddings=8))
    >>> m.forward(Tensor([[1, 2, 3]]), 0).shape
    (1, 11)
    """

    def __init__(self, cfg: Gemma3Config, max_context: int | None = None,
                 linear: Callable[[int], Callable[[int, int, str], Any]] | None = None, embed: Any | None = None):
        self.config = cfg
        self.max_context = min(max_context or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.model = Namespace()
        # `embed`: a module for the token lookup (a QuantizedEmbedding, whose `project` is then the head)
        self.model.embed_tokens = embed if embed is not None else nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # linear(i) makes layer i's projections (Gemma3Layer's `linear`); default nn.Linear
        self.model.layers = [Gemma3Layer(cfg, kind, self.max_context, linear(i) if linear else None)
                             for i, kind in enumerate(cfg.layer_types)]
        self.model.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        D = cfg.head_dim
        self._rope = {FULL: RopeTables(*rope_tables(D, self.max_context, cfg.rope_theta, cfg.rope_scaling)),
                      SLIDING: RopeTables(*rope_tables(D, self.max_context, cfg.rope_local_base_freq))}
        self._generator: Generator | None = None

    def forward(self, tokens: Tensor, start_pos: int | UOp = 0) -> Tensor:
        """Logits (B, V) of the last token of `tokens` (B, T) at positions start_pos..start_pos + T - 1."""
        T, cfg = tokens.shape[1], self.config
        if isinstance(start_pos, int) and start_pos + T > self.max_context:
            raise ValueError(f"{start_pos + T} tokens is longer than the model's context of {self.max_context}")
        D = cfg.head_dim
        tables = {k: (r.cos[start_pos:start_pos + T].reshape(1, T, 1, D), r.sin[start_pos:start_pos + T].reshape(
            1, T, 1, D)) for k, r in self._rope.items()}
        masks = {FULL: causal_mask(T, start_pos) if isinstance(start_pos, int) else None,
                 SLIDING: sliding_mask(T, start_pos, cfg.sliding_window, self.max_context)}
        x = self.model.embed_tokens(tokens) * math.sqrt(cfg.hidden_size)                  # (B, T, C)
        for layer in self.model.layers: x = layer(x, *tables[layer.kind], start_pos, masks[layer.kind])
        x = self.model.norm(x[:, -1, :])                                                     # (B, C)
        emb = self.model.embed_tokens
        logits = emb.project(x) if isinstance(emb, QuantizedEmbedding) else x @ emb.weight.T
        return _softcap(logits, cfg.final_logit_softcapping)                                  # (B, V)

    def generate(self, prompt: list[int], max_new: int, temperature: float = 0.0, jit: bool = True) -> list[int]:
        """New token ids after `prompt` (greedy when temperature is 0)."""
        if self._generator is None or self._generator.jit != jit: self._generator = Generator(self, jit=jit)
        return self._generator.generate(prompt, max_new, temperature).tokens

    @classmethod
    def from_pretrained(cls, path: str | pathlib.Path, max_context: int | None = None) -> Gemma3:
        """Load a folder written by save_pretrained (config.json + model.safetensors or pytorch_model.bin), or a .gguf
        file. The weights of a Gemma3ForConditionalGeneration's language model (`model.language_model.*`) load too; its
        vision tower is not read."""
        p = pathlib.Path(path)
        if p.suffix == ".gguf": return cls.from_gguf(p, max_context)
        d = p.parent if p.is_file() else p
        wf = weight_file(d) if d.is_dir() else None
        if wf is None: raise WeightsNotFound(f"{path}: no model.safetensors, pytorch_model.bin or .gguf file there")
        cfg = Gemma3Config.from_dict(read_config(d))
        model = cls(cfg, max_context)
        sd = read_checkpoint(wf)
        names = {}
        for k in sd:
            if k.startswith("model.language_model."): names["model." + k[len("model.language_model."):]] = k
            elif k.startswith(("model.vision_tower.", "model.multi_modal_projector.")) or k == "lm_head.weight": continue
            else: names[k] = k
        load_weights(model, wf, _what(cfg), sd=Renamed(sd, names))
        return model

    @classmethod
    def from_gguf(cls, path: str | pathlib.Path, max_context: int | None = None, quantized: bool = True) -> Gemma3:
        """Load a llama.cpp GGUF file of architecture 'gemma3'. llama.cpp's converter stores each norm weight plus 1
        (its RMSNorm multiplies by the weight); 1 is taken off again. What the file doesn't say is llama.cpp's too:
        every 6th layer full attention, the sliding-window layers' RoPE base 10000, query_pre_attn_scalar = head_dim
        (hidden_size / heads for the 62-layer 27B model, whose config says so and whose head_dim differs).
        Every tensor type gguf_load reads works. With `quantized` (the default) the projections and the embedding
        table (the head too: it is tied) stored in a type models/quantized.py keeps stay in their blocks, as in
        `Llama.from_gguf`; the rest, and everything with quantized=False, is dequantized to float32 when loaded."""
        meta, tensors = gguf_load(path)
        if (arch := meta.get("general.architecture")) != "gemma3":
            raise WeightsMismatch(f"{path}: general.architecture is {arch!r}, not 'gemma3'")

        def get(k: str, default: Any = None) -> Any:
            if f"gemma3.{k}" not in meta and default is None:
                raise WeightsMismatch(f"{path}: metadata gemma3.{k} is missing")
            return meta.get(f"gemma3.{k}", default)
        heads, D = get("attention.head_count"), get("attention.key_length")
        scaling = None
        if (kind := get("rope.scaling.type", "none")) == "linear":
            scaling = (("factor", float(get("rope.scaling.factor"))), ("rope_type", "linear"))
        elif kind != "none": raise WeightsMismatch(f"{path}: RoPE scaling {kind!r} is not supported")
        cfg = Gemma3Config(vocab_size=tensors.shape_of("token_embd.weight")[0], hidden_size=get("embedding_length"),
                           intermediate_size=get("feed_forward_length"), num_hidden_layers=get("block_count"),
                           num_attention_heads=heads, num_key_value_heads=get("attention.head_count_kv", heads),
                           head_dim=D, max_position_embeddings=get("context_length"),
                           rms_norm_eps=get("attention.layer_norm_rms_epsilon"),
                           rope_theta=get("rope.freq_base", 1_000_000.0), rope_scaling=scaling,
                           query_pre_attn_scalar=_gguf_query_scalar(get) or D,
                           sliding_window=get("attention.sliding_window"),
                           final_logit_softcapping=get("final_logit_softcapping", 0.0) or None)
        names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
        for i in range(cfg.num_hidden_layers):
            for hf, gg in _GGUF_LAYER.items(): names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
        sd = _GGUFNorms(tensors, names, quantized)

        def linear(i: int) -> Callable[[int, int, str], Any]:
            def make(n_in: int, n_out: int, name: str) -> Any:
                q = sd.quantized_linear(f"model.layers.{i}.{name}.weight", n_in, n_out)
                return q if q is not None else nn.Linear(n_in, n_out, bias=False)
            return make
        embed = sd.quantized_embedding("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size)
        model = cls(cfg, max_context, linear=linear, embed=embed)
        load_weights(model, path, _what(cfg), sd=sd)
        Device[Device.DEFAULT].allocator.free_cache()   # the loading's temporaries (see Llama.from_gguf)
        return model


def _gguf_query_scalar(get: Any) -> float | None:
    """Gemma 3 27B's query_pre_attn_scalar (hidden_size / heads), which its GGUF file doesn't record; llama.cpp knows the
    model by its 62 layers. None for the other sizes (their scalar is the head size)."""
    return get("embedding_length") / get("attention.head_count") if get("block_count") == 62 else None


def _what(cfg: Gemma3Config) -> str: return f"Gemma 3 ({cfg.num_hidden_layers} layers x {cfg.hidden_size})"


# HF module -> llama.cpp's GGUF name (both with .weight)
_GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "post_feedforward_layernorm": "post_ffw_norm"}


class _GGUFNorms(GGUFWeights):
    """A Gemma 3 GGUF file's tensors under HF's names, each norm weight with llama.cpp's +1 taken off."""

    def value(self, k: str) -> Tensor:
        t = super().value(k)
        return t - 1 if k.endswith("norm.weight") else t


__all__ = ["Gemma3", "Gemma3Config", "GemmaRMSNorm", "sliding_mask"]
