"""A LLaMA-style decoder (RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU MLP) with Hugging Face
LlamaForCausalLM parameter names, loaded from safetensors (one file or shards) or from a GGUF file (llama.cpp's names,
its q/k row order undone). The same decoder with biases on the q/k/v projections is Qwen2 (Qwen2ForCausalLM, GGUF
architecture 'qwen2'); RoPE may be plain, linearly scaled or Llama 3.1's (`rope_inv_freq`). Generation runs through
decoding.Generator: a KV cache and TinyJit'd decode steps."""
from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from fusegrad import nn
from fusegrad.device import Device
from fusegrad.ir.ops import UOp
from fusegrad.models.decoding import Generator, KVCache, causal_mask
from fusegrad.models.gguf_weights import GGUFWeights
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

# (in_features, out_features, "self_attn.q_proj", bias) -> a linear module
LinearFactory = Callable[[int, int, str, bool], Any]
# the architectures this decoder is: transformers' model_type, and the same names in GGUF's general.architecture
ARCHITECTURES = ("llama", "qwen2")


@dataclass(frozen=True)
class LlamaConfig:
    """The fields of a Hugging Face LlamaConfig the model uses."""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    qkv_bias: bool = False            # biases on q_proj, k_proj, v_proj (Qwen2; LLaMA's attention_bias)
    o_bias: bool = False              # a bias on o_proj (LLaMA's attention_bias)
    # RoPE scaling as (key, value) pairs of HF's rope_scaling: rope_type "linear" (factor) or "llama3" (factor,
    # low_freq_factor, high_freq_factor, original_max_position_embeddings); None for plain RoPE
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    # per-frequency divisors of the rotary inverse frequencies (a GGUF file's rope_freqs.weight: Llama 3.1's scaling
    # as llama.cpp stores it), applied after rope_scaling
    rope_freq_factors: tuple[float, ...] | None = None
    model_type: str = "llama"

    @property
    def kv_heads(self) -> int: return self.num_key_value_heads or self.num_attention_heads
    @property
    def dim_per_head(self) -> int: return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaConfig:
        """From config.json of a LLaMA or Qwen2 model (transformers 4 keeps rope_theta and rope_scaling at the top,
        5 both in rope_parameters)."""
        kind = d.get("model_type", "llama")
        if kind not in ARCHITECTURES:
            raise ValueError(f"config.json is for a {kind!r} model, not one of {', '.join(ARCHITECTURES)}")
        d = dict(d)
        rope = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
        if "rope_theta" in rope: d.setdefault("rope_theta", rope["rope_theta"])
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "type")}
        scaling["rope_type"] = rope.get("rope_type", rope.get("type", "default"))
        d["rope_scaling"] = None if scaling["rope_type"] == "default" else tuple(sorted(scaling.items()))
        if d["rope_scaling"] is not None: rope_inv_freq(8, 10000.0, d["rope_scaling"])   # refuses other kinds now
        if d.get("hidden_act", "silu") != "silu": raise ValueError(f"hidden_act {d['hidden_act']!r} is not supported")
        if d.get("mlp_bias"): raise ValueError("mlp_bias is not supported")
        if kind == "qwen2":
            if d.get("use_sliding_window"): raise ValueError("Qwen2 with use_sliding_window is not supported")
            d["qkv_bias"] = True
        elif d.get("attention_bias"): d["qkv_bias"] = d["o_bias"] = True
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d and d[f.name] is not None})


def rope_inv_freq(head_dim: int, theta: float, scaling: tuple[tuple[str, Any], ...] | None = None,
                  freq_factors: tuple[float, ...] | None = None) -> np.ndarray:
    """The rotary inverse frequencies theta^(-2i/d) (float64, head_dim/2 of them), scaled as HF's rope_scaling says:
    "linear" divides all by `factor`; "llama3" (Llama 3.1) divides the low frequencies (wavelength past
    original_max_position_embeddings / low_freq_factor) by `factor`, keeps the high ones (wavelength under
    original_max_position_embeddings / high_freq_factor) and blends in between. `freq_factors` divide them further
    (GGUF's rope_freqs.weight). Other kinds (yarn, dynamic, longrope) raise ValueError."""
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    sc = dict(scaling or ())
    kind = sc.get("rope_type", "default")
    if kind == "linear": inv = inv / float(sc["factor"])
    elif kind == "llama3":
        try:
            factor, lo, hi = float(sc["factor"]), float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
            old = float(sc["original_max_position_embeddings"])
        except KeyError as e: raise ValueError(f"llama3 RoPE scaling {sc} lacks {e.args[0]!r}") from None
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * inv / factor + smooth * inv
        inv = np.where(wavelen > old / lo, inv / factor, np.where(wavelen < old / hi, inv, blended))
    elif kind != "default":
        raise ValueError(f"RoPE scaling {sc} is not supported (rope_type 'default', 'linear' or 'llama3')")
    if freq_factors is not None:
        if len(freq_factors) != len(inv):
            raise ValueError(f"{len(freq_factors)} RoPE frequency factors for {len(inv)} frequencies")
        inv = inv / np.asarray(freq_factors, dtype=np.float64)
    return inv


def rope_tables(head_dim: int, max_len: int, theta: float, scaling: tuple[tuple[str, Any], ...] | None = None,
                freq_factors: tuple[float, ...] | None = None) -> tuple[Tensor, Tensor]:
    """cos and sin (max_len, head_dim) of HF's RoPE: angle p * inv_freq_i (`rope_inv_freq`), the half-dim table
    repeated twice."""
    inv = rope_inv_freq(head_dim, theta, scaling, freq_factors)
    ang = np.outer(np.arange(max_len, dtype=np.float64), inv)                 # (L, D/2)
    ang = np.concatenate([ang, ang], axis=1).astype(np.float32)              # (L, D)
    return Tensor(np.cos(ang)).realize(), Tensor(np.sin(ang)).realize()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, T, H, D) rotated by position: x * cos + rotate_half(x) * sin, rotate_half(a, b) = (-b, a)."""
    half = x.shape[-1] // 2
    rotated = (-x[..., half:]).cat(x[..., :half], dim=-1)
    return x * cos + rotated * sin                                           # cos, sin: (1, T, 1, D)


class RopeTables:
    """cos and sin tables of RoPE; slotted, so get_state_dict doesn't count them as weights."""
    __slots__ = ("cos", "sin")

    def __init__(self, cos: Tensor, sin: Tensor):
        self.cos, self.sin = cos, sin


class LlamaLayer:
    """x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(x)); attention keeps a KV cache."""

    def __init__(self, cfg: LlamaConfig, max_context: int, linear: LinearFactory | None = None):
        C, H, KV, D = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_heads, cfg.dim_per_head
        lin = linear or (lambda i, o, name, bias: nn.Linear(i, o, bias=bias))
        if H % KV: raise ValueError(f"{H} attention heads can't be shared by {KV} key/value heads")
        self.H, self.KV, self.D = H, KV, D
        self.self_attn = Namespace()
        a, qkv = self.self_attn, cfg.qkv_bias
        a.q_proj, a.k_proj = lin(C, H * D, "self_attn.q_proj", qkv), lin(C, KV * D, "self_attn.k_proj", qkv)
        a.v_proj, a.o_proj = lin(C, KV * D, "self_attn.v_proj", qkv), lin(H * D, C, "self_attn.o_proj", cfg.o_bias)
        self.mlp = Namespace()
        I = cfg.intermediate_size
        self.mlp.gate_proj, self.mlp.up_proj = lin(C, I, "mlp.gate_proj", False), lin(C, I, "mlp.up_proj", False)
        self.mlp.down_proj = lin(I, C, "mlp.down_proj", False)
        self.input_layernorm = nn.RMSNorm(C, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(C, eps=cfg.rms_norm_eps)
        self._cache = KVCache(max_context)

    def attention(self, x: Tensor, cos: Tensor, sin: Tensor, start_pos: int | UOp, mask: Tensor | None) -> Tensor:
        B, T, _ = x.shape                                                     # x: (B, T, C)
        H, KV, D, a = self.H, self.KV, self.D, self.self_attn
        q = apply_rope(a.q_proj(x).reshape(B, T, H, D), cos, sin)
        k = apply_rope(a.k_proj(x).reshape(B, T, KV, D), cos, sin)
        keys, values = self._cache.update(k, a.v_proj(x).reshape(B, T, KV, D), start_pos)   # (B, S, KV, D)
        # grouped-query attention: query head h reads key/value head h // (H // KV), without copying keys
        q = q.permute(0, 2, 1, 3).reshape(B, KV, H // KV, T, D)                           # (B, KV, G, T, D)
        kt = keys.permute(0, 2, 3, 1).unsqueeze(2)                                         # (B, KV, 1, D, S)
        scores = q @ kt * (1 / math.sqrt(D))                                               # (B, KV, G, T, S)
        if mask is not None: scores = scores + mask.unsqueeze(1)
        out = scores.softmax(-1) @ values.permute(0, 2, 1, 3).unsqueeze(2)                 # (B, KV, G, T, D)
        # a buffer of this shape: an 8-bit o_proj (models/quantized.py) copies its input, and a copy through the
        # reshape below would merge (G, D) into one range the kernel can't vectorize (a scalar loop down V's
        # columns: 70-90 us a decoded token per layer of SmolLM2 on AVX2, against ~15)
        out = out.contiguous()
        return a.o_proj(out.reshape(B, H, T, D).permute(0, 2, 1, 3).reshape(B, T, H * D))

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, start_pos: int | UOp, mask: Tensor | None) -> Tensor:
        x = x + self.attention(self.input_layernorm(x), cos, sin, start_pos, mask)
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(self.mlp.gate_proj(h).silu() * self.mlp.up_proj(h))


class Llama:
    """LlamaForCausalLM: model.embed_tokens, model.layers.N.*, model.norm, lm_head (tied to the embedding when the
    config says so). `forward(tokens (B, T), start_pos)` -> logits (B, V) of the last token, caching keys/values.

    >>> m = Llama(LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
    ...                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8))
    >>> m.forward(Tensor([[1, 2, 3]]), 0).shape
    (1, 11)
    """

    def __init__(self, cfg: LlamaConfig, max_context: int | None = None,
                 linear: Callable[[int], LinearFactory] | None = None, head: Any | None = None,
                 embed: Any | None = None):
        self.config = cfg
        self.max_context = min(max_context or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.model = Namespace()
        # `embed`: a module for the token lookup (a QuantizedEmbedding, whose `project` is then the tied head)
        self.model.embed_tokens = embed if embed is not None else nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # linear(i) makes layer i's projections (in_features, out_features, name) -> module; default nn.Linear
        self.model.layers = [LlamaLayer(cfg, self.max_context, linear(i) if linear else None)
                             for i in range(cfg.num_hidden_layers)]
        self.model.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        # `head`: a module for the output projection (a QuantizedLinear over the tied embedding's blocks, say)
        if head is not None: self.lm_head = head
        elif not cfg.tie_word_embeddings: self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._rope = RopeTables(*rope_tables(cfg.dim_per_head, self.max_context, cfg.rope_theta, cfg.rope_scaling,
                                        cfg.rope_freq_factors))
        self._generator: Generator | None = None

    def forward(self, tokens: Tensor, start_pos: int | UOp = 0) -> Tensor:
        """Logits (B, V) of the last token of `tokens` (B, T) at positions start_pos..start_pos + T - 1."""
        T = tokens.shape[1]
        if isinstance(start_pos, int) and start_pos + T > self.max_context:
            raise ValueError(f"{start_pos + T} tokens is longer than the model's context of {self.max_context}")
        D = self.config.dim_per_head
        cos = self._rope.cos[start_pos:start_pos + T].reshape(1, T, 1, D)     # (1, T, 1, D)
        sin = self._rope.sin[start_pos:start_pos + T].reshape(1, T, 1, D)
        mask = causal_mask(T, start_pos) if isinstance(start_pos, int) else None
        x = self.model.embed_tokens(tokens)                                  # (B, T, C)
        for layer in self.model.layers: x = layer(x, cos, sin, start_pos, mask)
        x = self.model.norm(x[:, -1, :])                                     # (B, C)
        if "lm_head" in vars(self): return self.lm_head(x)                   # (B, V)
        emb = self.model.embed_tokens
        return emb.project(x) if isinstance(emb, QuantizedEmbedding) else x @ emb.weight.T

    def generate(self, prompt: list[int], max_new: int, temperature: float = 0.0, jit: bool = True) -> list[int]:
        """New token ids after `prompt` (greedy when temperature is 0). Raises ValueError when the prompt (or the prompt
        plus max_new) is longer than the context."""
        if self._generator is None or self._generator.jit != jit: self._generator = Generator(self, jit=jit)
        return self._generator.generate(prompt, max_new, temperature).tokens

    @classmethod
    def from_pretrained(cls, path: str | pathlib.Path, max_context: int | None = None) -> Llama:
        """Load a folder written by save_pretrained (config.json + model.safetensors, shards with
        model.safetensors.index.json, or pytorch_model.bin), or a .gguf file. max_context caps the KV cache."""
        p = pathlib.Path(path)
        if p.suffix == ".gguf": return cls.from_gguf(p, max_context)
        d = p.parent if p.is_file() else p
        index = d / "model.safetensors.index.json"
        wf = weight_file(d) if d.is_dir() else None
        if wf is None and not index.is_file():
            raise WeightsNotFound(f"{path}: no model.safetensors(.index.json), pytorch_model.bin or .gguf file there")
        cfg = LlamaConfig.from_dict(read_config(d))
        model = cls(cfg, max_context)
        sd = read_sharded(index) if wf is None else read_checkpoint(wf)
        load_weights(model, wf or index, _what(cfg), sd=sd,
                     ignore=lambda k: k.endswith("rotary_emb.inv_freq") or (k == "lm_head.weight" and
                                                                            model.config.tie_word_embeddings))
        return model

    @classmethod
    def from_gguf(cls, path: str | pathlib.Path, max_context: int | None = None, quantized: bool = True) -> Llama:
        """Load a llama.cpp GGUF file (architecture 'llama' or 'qwen2'; any tensor type fusegrad's gguf_load reads).
        With `quantized` (the default), the layers' projections, the output head and the embedding table stored in Q4_0,
        Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K stay in their blocks (QuantizedLinear, dequantized inside the matmul
        kernel; QuantizedEmbedding, which dequantizes the rows a lookup gathers and is the head too when it is tied);
        the norms, biases and the other types, and everything with quantized=False, are dequantized to float32 when
        loaded."""
        model = cls._from_gguf(path, max_context, quantized)
        # the loading's temporaries (each tensor's copy before it is copied into the model's buffer) wait in the
        # allocator's cache of freed buffers, where nothing of their sizes will ask for them again: give them back
        Device[Device.DEFAULT].allocator.free_cache()
        return model

    @classmethod
    def _from_gguf(cls, path: str | pathlib.Path, max_context: int | None, quantized: bool) -> Llama:
        meta, tensors = gguf_load(path)
        if (arch := meta.get("general.architecture")) not in ARCHITECTURES:
            raise WeightsMismatch(f"{path}: general.architecture is {arch!r}, not one of {', '.join(ARCHITECTURES)}")
        cfg = config_from_gguf(meta, tensors, str(path))
        names = GGUFNames(tensors, cfg, quantized)

        def linear(i: int) -> LinearFactory:
            def make(n_in: int, n_out: int, name: str, bias: bool) -> Any:
                q = names.quantized_linear(f"model.layers.{i}.{name}.weight", n_in, n_out, bias)
                return q if q is not None else nn.Linear(n_in, n_out, bias=bias)
            return make
        head = names.quantized_linear("lm_head.weight", cfg.hidden_size, cfg.vocab_size)
        # the head stays on float activations: its logits decide greedy picks (8-bit ones flipped a near-tie of
        # SmolLM2's against transformers'), and its memory-bound kernel gained nothing from them
        if head is not None: head.q8 = False
        # tied: the embedding's `project` is the head
        embed = names.quantized_embedding("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size)
        model = cls(cfg, max_context, linear=linear, head=head, embed=embed)
        load_weights(model, path, _what(cfg), sd=names)
        return model


def _what(cfg: LlamaConfig) -> str:
    return f"{'Qwen2' if cfg.model_type == 'qwen2' else 'LLaMA'} ({cfg.num_hidden_layers} layers x {cfg.hidden_size})"


def config_from_gguf(meta: dict[str, Any], tensors: Any, source: str) -> LlamaConfig:
    """A LlamaConfig from GGUF metadata (`<architecture>.*` keys) and which tensors the file has (biases, Llama 3.1's
    rope_freqs.weight)."""
    arch = meta.get("general.architecture", "llama")

    def get(k: str, default: Any = None) -> Any:
        if f"{arch}.{k}" not in meta and default is None:
            raise WeightsMismatch(f"{source}: metadata {arch}.{k} is missing")
        return meta.get(f"{arch}.{k}", default)
    heads = get("attention.head_count")
    n_vocab = get("vocab_size", 0) or tensors.shape_of("token_embd.weight")[0]
    scaling = None
    if (kind := get("rope.scaling.type", "none")) == "linear":
        scaling = (("factor", float(get("rope.scaling.factor"))), ("rope_type", "linear"))
    elif kind != "none":
        raise WeightsMismatch(f"{source}: RoPE scaling {kind!r} is not supported ('linear', or Llama 3.1's "
                              "rope_freqs.weight)")
    factors = None
    if "rope_freqs.weight" in tensors:
        factors = tuple(float(f) for f in tensors["rope_freqs.weight"].float().numpy().reshape(-1))
    return LlamaConfig(vocab_size=n_vocab, hidden_size=get("embedding_length"),
                       intermediate_size=get("feed_forward_length"), num_hidden_layers=get("block_count"),
                       num_attention_heads=heads, num_key_value_heads=get("attention.head_count_kv", heads),
                       head_dim=get("attention.key_length", 0) or None,
                       max_position_embeddings=get("context_length"),
                       rms_norm_eps=get("attention.layer_norm_rms_epsilon"), rope_theta=get("rope.freq_base", 10000.0),
                       tie_word_embeddings="output.weight" not in tensors,
                       qkv_bias="blk.0.attn_q.bias" in tensors, o_bias="blk.0.attn_output.bias" in tensors,
                       rope_scaling=scaling, rope_freq_factors=factors, model_type=arch)


_GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
               "self_attn.o_proj.weight": "attn_output.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}
_GGUF_BIAS = {"self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
              "self_attn.v_proj.bias": "attn_v.bias"}
# GGUF tensors read into the config, not weights of the model
_GGUF_CONFIG_TENSORS = {"rope_freqs.weight"}


class GGUFNames(GGUFWeights):
    """A GGUF file's tensors under HF's names (GGUFWeights: with `quantized`, the projections stored in blocks are
    served as planes). In a 'llama' file llama.cpp stores q/k projection rows with each head's two rotary halves
    interleaved (for its RoPE); they are put back in HF's half-split order here. A 'qwen2' file keeps HF's order
    (llama.cpp rotates Qwen2's halves as HF does)."""

    def __init__(self, tensors: Any, cfg: LlamaConfig, quantized: bool = True):
        names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
        if "output.weight" in tensors: names["lm_head.weight"] = "output.weight"
        layer = {**_GGUF_LAYER, **(_GGUF_BIAS if cfg.qkv_bias else {}),
                 **({"self_attn.o_proj.bias": "attn_output.bias"} if cfg.o_bias else {})}
        for i in range(cfg.num_hidden_layers):
            for hf, gg in layer.items(): names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{gg}"
        known = set(names.values()) | _GGUF_CONFIG_TENSORS
        names.update({k: k for k in tensors if k not in known})   # unknown extras
        super().__init__(tensors, names, quantized)
        self.cfg, self.interleaved = cfg, cfg.model_type == "llama"

    def _heads(self, k: str) -> int | None:
        if not self.interleaved: return None
        if ".q_proj." in k: return self.cfg.num_attention_heads
        if ".k_proj." in k: return self.cfg.kv_heads
        return None

    def reorder_rows(self, k: str, x: Any) -> Any:
        if (heads := self._heads(k)) is None: return x   # (a bias's rows too)
        rows, rest = x.shape[0], tuple(x.shape[1:])
        x = x.reshape(heads, rows // heads // 2, 2, *rest)
        x = np.ascontiguousarray(x.swapaxes(1, 2)) if isinstance(x, np.ndarray) else x.transpose(1, 2)
        return x.reshape(rows, *rest)


def read_sharded(index: pathlib.Path) -> Mapping[str, Tensor]:
    """The tensors of a sharded safetensors checkpoint (model.safetensors.index.json's weight_map), read lazily."""
    weight_map = json.loads(index.read_text()).get("weight_map")
    if not isinstance(weight_map, dict): raise WeightsMismatch(f"{index}: no weight_map")
    shards = {f: read_checkpoint(index.parent / f) for f in sorted(set(weight_map.values()))}
    merged: dict[str, Any] = {}
    for name, f in weight_map.items(): merged[name] = (shards[f], name)
    return _Sharded(merged)


class _Sharded(Renamed):
    def __init__(self, merged: dict[str, tuple[Mapping[str, Tensor], str]]):
        self.merged = merged
        self.names = {k: k for k in merged}

    def __getitem__(self, k: str) -> Tensor:
        sd, name = self.merged[k]
        return sd[name]

    def shape_of(self, k: str) -> tuple[int, ...]:
        sd, name = self.merged[k]
        return tuple(sd.shape_of(name)) if hasattr(sd, "shape_of") else tuple(sd[name].shape)


__all__ = ["ARCHITECTURES", "Llama", "LlamaConfig", "RopeTables", "apply_rope",
           "rope_inv_freq", "rope_tables"]
