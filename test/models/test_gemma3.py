"""Gemma 3's text decoder against transformers' Gemma3ForCausalLM on tiny random-weight models (sliding-window and
full-attention layers, q/k norms, (1 + w) RMSNorm, the scaled embedding, GELU-gated MLP, GQA): logits within 1e-4
relative, greedy tokens equal with TinyJit on and off, a context longer than the sliding window (so the window's mask
is used in the prefill and in the jitted decode steps), linear RoPE scaling on the full layers, and GGUF files as
llama.cpp's converter writes them (norms stored plus 1) in float32 and Q8_0."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.models.gemma3 import Gemma3, Gemma3Config
from fusegrad.models.weights import WeightsMismatch

from .kquants import add_tensor, finish

torch = pytest.importorskip("torch", reason="the reference model runs in PyTorch")
transformers = pytest.importorskip("transformers", reason="the reference Gemma 3 comes from transformers")
PROMPTS = [[5, 17, 200, 3, 99, 42], [1], [250, 251, 252, 7, 7, 7, 7, 30, 31, 32, 33, 34, 8, 9, 10, 11, 12, 13]]


def tiny_gemma3(seed: int = 0, **kw):
    """3 layers: sliding, sliding, full (pattern 3); window 5 so the prompts and generations run past it."""
    args = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=48, rms_norm_eps=1e-6,
                query_pre_attn_scalar=16, sliding_window=5, layer_types=["sliding_attention", "sliding_attention",
                                                                          "full_attention"],
                initializer_range=0.3, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    args.update(kw)
    cfg = transformers.Gemma3TextConfig(**args)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    m = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():   # norm weights are zeros when initialized: make them count
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"): p.normal_(0, 0.3)
    return m


def ref_logits(model, prompt: list[int]) -> np.ndarray:
    with torch.no_grad(): return model(torch.tensor([prompt])).logits[0, -1].numpy()


def ref_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():   # no KV cache: each step recomputes the whole sequence (the plainest reference)
        seq = list(prompt)
        for _ in range(n): seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def assert_logits(ours: Gemma3, ref, prompts=PROMPTS, rel: float = 1e-4) -> None:
    for p in prompts:
        want, got = ref_logits(ref, p), ours.forward(Tensor([p]), 0).numpy()[0]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < rel, f"prompt {p}: max relative error {err:.2e}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma3")
    model = tiny_gemma3()
    model.save_pretrained(d)
    return d, model


def test_logits_and_greedy_tokens(saved):
    d, ref = saved
    ours = Gemma3.from_pretrained(d)
    assert ours.config.layer_types == ("sliding_attention", "sliding_attention", "full_attention")
    assert ours.config.sliding_window == 5
    assert_logits(ours, ref)
    for jit in (True, False):
        for p in PROMPTS: assert ours.generate(p, 12, jit=jit) == ref_greedy(ref, p, 12), (p, jit)


def test_the_window_matters(saved):
    """The same weights without the window (every layer full attention) give other logits for a long prompt: the
    sliding-window mask is really applied."""
    d, ref = saved
    ours = Gemma3.from_pretrained(d)
    wide = Gemma3(Gemma3Config(**{**ours.config.__dict__, "sliding_window": 48}))
    from fusegrad.nn.state import get_state_dict, load_state_dict
    load_state_dict(wide, get_state_dict(ours))
    a, b = ours.forward(Tensor([PROMPTS[2]]), 0).numpy(), wide.forward(Tensor([PROMPTS[2]]), 0).numpy()
    assert np.abs(a - b).max() > 1e-3


def test_linear_rope_scaling_on_full_layers(tmp_path):
    ref = tiny_gemma3(seed=1, rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                  "rope_theta": 1000.0},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})
    ref.save_pretrained(tmp_path)
    ours = Gemma3.from_pretrained(tmp_path)
    assert dict(ours.config.rope_scaling) == {"factor": 4.0, "rope_type": "linear"}
    assert ours.config.rope_theta == 1000.0 and ours.config.rope_local_base_freq == 100.0
    assert_logits(ours, ref)


GGUF_NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
              "pre_feedforward_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "post_feedforward_layernorm": "post_ffw_norm"}


def write_gemma3_gguf(path: pathlib.Path, model, quant: str | None = None, extra=None) -> dict[str, np.ndarray]:
    """`model` as llama.cpp's converter writes a Gemma 3 (its names; each norm weight plus 1); extra(writer) adds more
    metadata (a tokenizer). Only a model whose layers follow llama.cpp's fixed pattern (every 6th full) and whose local
    RoPE base is 10000 round-trips."""
    gguf = pytest.importorskip("gguf", reason="GGUF files are written with the gguf package")
    cfg = model.config
    sd = {k: v.numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_sliding_window(cfg.sliding_window)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in GGUF_NAMES.items(): names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    held = {}
    for hf, gg in names.items():
        arr = sd[hf] + 1 if hf.endswith("norm.weight") else sd[hf]
        arr = add_tensor(w, gg, arr, quant)
        held[hf] = arr - 1 if hf.endswith("norm.weight") else arr
    if extra is not None: extra(w)
    finish(w)
    return held


@pytest.mark.parametrize("quant", [None, "Q8_0", "Q4_1"])
def test_gguf(tmp_path, quant):
    # 6 layers (llama.cpp's pattern: the 6th is full attention), local RoPE base 10000 as llama.cpp assumes
    kw = dict(num_hidden_layers=6, layer_types=None, sliding_window_pattern=6, query_pre_attn_scalar=16,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    ref = tiny_gemma3(seed=2, **kw)
    held = write_gemma3_gguf(tmp_path / "g.gguf", ref, quant)
    ours = Gemma3.from_pretrained(tmp_path / "g.gguf")
    assert list(ours.config.layer_types) == list(ref.config.layer_types) == ["sliding_attention"] * 5 + \
        ["full_attention"]
    if quant:
        ref = tiny_gemma3(seed=2, **kw)
        ref.load_state_dict({k: torch.tensor(v) for k, v in held.items()}, strict=False)
        # the projections and the tied embedding stay in their blocks; quantized=False gives the float32 modules
        from fusegrad.models.quantized import QuantizedEmbedding, QuantizedLinear
        a = ours.model.layers[0].self_attn
        assert isinstance(a.q_proj, QuantizedLinear) and isinstance(ours.model.layers[5].mlp.down_proj, QuantizedLinear)
        assert isinstance(ours.model.embed_tokens, QuantizedEmbedding)
        flt = Gemma3.from_gguf(tmp_path / "g.gguf", quantized=False)
        assert not isinstance(flt.model.layers[0].self_attn.q_proj, QuantizedLinear)
        assert_logits(flt, ref, PROMPTS[:1])
    assert_logits(ours, ref, PROMPTS)
    assert ours.generate(PROMPTS[2], 8) == ref_greedy(ref, PROMPTS[2], 8)


def test_errors(saved, tmp_path):
    with pytest.raises(ValueError, match="not Gemma 3"): Gemma3Config.from_dict({"model_type": "llama"})
    with pytest.raises(ValueError, match="layer_types"):
        Gemma3Config(num_hidden_layers=2, layer_types=("sliding_attention",))
    with pytest.raises(ValueError, match="RoPE scaling .* on sliding-window layers"):
        Gemma3Config.from_dict({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}})
    from .test_llama import tiny_llama, write_gguf
    write_gguf(tmp_path / "l.gguf", tiny_llama())
    with pytest.raises(WeightsMismatch, match="general.architecture is 'llama', not 'gemma3'"):
        Gemma3.from_pretrained(tmp_path / "l.gguf")
