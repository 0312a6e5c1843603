"""LLaMA against transformers' LlamaForCausalLM on tiny random-weight models saved with save_pretrained (GQA, RoPE,
SwiGLU, RMSNorm): logits within 1e-4 relative, greedy tokens equal (TinyJit and eager), tied embeddings, shards, GGUF
files written from the same weights with the `gguf` package (float32, and Q8_0 against the dequantized weights), and
clear errors for wrong weights and over-long prompts."""
from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.models.llama import Llama, LlamaConfig
from fusegrad.models.weights import WeightsMismatch, WeightsNotFound

from .kquants import add_tensor, finish

torch = pytest.importorskip("torch", reason="the reference model runs in PyTorch")
transformers = pytest.importorskip("transformers", reason="the reference LLaMA comes from transformers")
PROMPTS = [[5, 17, 200, 3, 99, 42], [1], [250, 251, 252, 7, 7, 7, 7, 30, 31, 32, 33, 34]]


def tiny_llama(tie: bool = False, seed: int = 0, hidden: int = 64, intermediate: int = 128):
    """4 query heads sharing 2 key/value heads, head_dim 16 (hidden 64); initializer_range 0.3 keeps greedy picks off
    near-ties."""
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=48, rope_theta=500.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=tie, initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    model = tiny_llama()
    model.save_pretrained(d)
    return d, model


def ref_logits(model, prompt: list[int]) -> np.ndarray:
    with torch.no_grad(): return model(torch.tensor([prompt])).logits[0, -1].numpy()


def ref_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    return out[0, len(prompt):].tolist()


def assert_logits(ours: Llama, ref, prompts=PROMPTS, rel: float = 1e-4) -> None:
    for p in prompts:
        want, got = ref_logits(ref, p), ours.forward(Tensor([p]), 0).numpy()[0]
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < rel, f"prompt {p}: max relative error {err:.2e}"


def test_logits_and_greedy_tokens(saved):
    d, ref = saved
    ours = Llama.from_pretrained(d)
    assert ours.config.kv_heads == 2 and ours.config.rope_theta == 500.0
    assert_logits(ours, ref)
    for p in PROMPTS: assert ours.generate(p, 20) == ref_greedy(ref, p, 20), f"prompt {p}"
    assert ours.generate(PROMPTS[0], 8, jit=False) == ref_greedy(ref, PROMPTS[0], 8)


def test_tied_embeddings_and_shards(tmp_path):
    ref = tiny_llama(tie=True, seed=1)
    ref.save_pretrained(tmp_path / "tied")
    ours = Llama.from_pretrained(tmp_path / "tied")
    assert ours.config.tie_word_embeddings and not hasattr(ours, "lm_head")
    assert_logits(ours, ref, PROMPTS[:1])
    ref = tiny_llama(seed=2)
    ref.save_pretrained(tmp_path / "sharded", max_shard_size="60KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert_logits(Llama.from_pretrained(tmp_path / "sharded"), ref, PROMPTS[:1])


def to_llama_cpp_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter order for q/k rows: each head's two rotary halves interleaved."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


GGUF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_gguf(path: pathlib.Path, model, quant: str | Callable[[str], str | None] | None = None,
               arch: str = "llama", extra: Callable[[Any], Any] | None = None) -> dict[str, np.ndarray]:
    """Write `model`'s weights as llama.cpp names them; quant="Q8_0" quantizes the 2-D weights (the K types with
    kquants.py's encoder), or quant(gguf_name) picks each one's type (None: float32); extra(writer) adds more
    metadata (a tokenizer). Returns the HF state dict the file holds (dequantized), for the reference."""
    gguf = pytest.importorskip("gguf", reason="GGUF files are written with the gguf package")
    cfg = model.config
    sd = {k: v.numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if "lm_head.weight" in sd and not getattr(cfg, "tie_word_embeddings", False):   # tied: the head reads token_embd
        names["lm_head.weight"] = "output.weight"
    for i in range(cfg.num_hidden_layers):
        for hf, gg in GGUF_LAYER.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
            if f"model.layers.{i}.{hf}.bias" in sd: names[f"model.layers.{i}.{hf}.bias"] = f"blk.{i}.{gg}.bias"
    interleave = arch == "llama"   # llama.cpp's converter reorders q/k rows for 'llama' only (not for 'qwen2')
    held = {}
    for hf, gg in names.items():
        arr = sd[hf]
        if interleave and hf.endswith("q_proj.weight"): arr = to_llama_cpp_rows(arr, cfg.num_attention_heads)
        if interleave and hf.endswith("k_proj.weight"): arr = to_llama_cpp_rows(arr, cfg.num_key_value_heads)
        arr = add_tensor(w, gg, arr, quant(gg) if callable(quant) else quant)
        if interleave and hf.endswith(("q_proj.weight", "k_proj.weight")):   # back to HF's order for the reference
            heads = cfg.num_attention_heads if hf.endswith("q_proj.weight") else cfg.num_key_value_heads
            rows, cols = arr.shape
            arr = arr.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
        held[hf] = arr
    if extra is not None: extra(w)
    finish(w)
    return held


@pytest.mark.parametrize("quant", [None, "Q8_0"])
def test_gguf(saved, tmp_path, quant):
    _, ref = saved
    held = write_gguf(tmp_path / "tiny.gguf", ref, quant)
    ours = Llama.from_pretrained(tmp_path / "tiny.gguf")
    assert ours.config.num_key_value_heads == 2 and ours.config.vocab_size == 256
    if quant:   # the reference runs on the weights the file really holds (quantized and dequantized)
        ref = tiny_llama()
        ref.load_state_dict({k: torch.tensor(v) for k, v in held.items()})
    assert_logits(ours, ref, PROMPTS[:2])
    assert ours.generate(PROMPTS[0], 10) == ref_greedy(ref, PROMPTS[0], 10)


def test_errors(saved, tmp_path):
    d, _ = saved
    ours = Llama.from_pretrained(d)
    with pytest.raises(ValueError, match="the prompt has 49 tokens, longer than the model's context of 48 tokens"):
        ours.generate([1] * 49, 1)
    with pytest.raises(ValueError, match="ask for at most 8 new tokens"): ours.generate([1] * 40, 9)
    with pytest.raises(ValueError, match="the prompt is empty"): ours.generate([], 3)
    gcfg = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=256, n_positions=48)
    transformers.GPT2LMHeadModel(gcfg).save_pretrained(tmp_path / "gpt2")
    (tmp_path / "gpt2" / "config.json").write_text((d / "config.json").read_text())
    with pytest.raises(WeightsMismatch, match=r"first mismatch at 'model\.embed_tokens\.weight': model has "
                       r"\(256, 64\), state_dict has no such key"):
        Llama.from_pretrained(tmp_path / "gpt2")
    write_gguf(tmp_path / "other.gguf", tiny_llama(), arch="gemma3")
    with pytest.raises(WeightsMismatch, match="general.architecture is 'gemma3', not one of llama, qwen2"):
        Llama.from_pretrained(tmp_path / "other.gguf")
    with pytest.raises(WeightsNotFound): Llama.from_pretrained(tmp_path / "nothing")
    with pytest.raises(ValueError, match="lacks 'low_freq_factor'"):
        LlamaConfig.from_dict({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="RoPE scaling .* is not supported"):
        LlamaConfig.from_dict({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="'mistral' model, not one of llama, qwen2"):
        LlamaConfig.from_dict({"model_type": "mistral"})


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


def tiny_llama3(seed: int = 0):
    """Llama 3.1's RoPE scaling on a tiny model: with theta 500, head_dim 16 and an original context of 64, the 8
    frequencies fall in all three of its bands (kept, blended, divided by the factor)."""
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                                   rope_theta=500.0, rms_norm_eps=1e-5, initializer_range=0.3,
                                   rope_scaling=dict(LLAMA3_ROPE), bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_rope_inverse_frequencies_equal_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from fusegrad.models.llama import rope_inv_freq
    for kind, extra in (("llama3", LLAMA3_ROPE), ("linear", {"rope_type": "linear", "factor": 3.0})):
        cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=500.0,
                                       rope_scaling=dict(extra))
        want, _ = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
        got = rope_inv_freq(16, 500.0, tuple(sorted(extra.items())))
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
        assert not np.allclose(got, rope_inv_freq(16, 500.0))   # the scaling changes something
    # the three bands of llama3 are all present in this configuration
    ratio = rope_inv_freq(16, 500.0) / rope_inv_freq(16, 500.0, tuple(sorted(LLAMA3_ROPE.items())))
    assert np.isclose(ratio, 1).any() and np.isclose(ratio, 8).any() and ((ratio > 1.01) & (ratio < 7.99)).any()


def llama_cpp_rope_factors(rope: dict, head_dim: int, theta: float) -> np.ndarray:
    """The rope_freqs.weight llama.cpp's converter writes for Llama 3.1 scaling: per frequency, how much it is divided."""
    from fusegrad.models.llama import rope_inv_freq
    return (rope_inv_freq(head_dim, theta) / rope_inv_freq(head_dim, theta, tuple(sorted(rope.items())))).astype(
        np.float32)


def test_llama3_rope_scaling(tmp_path):
    ref = tiny_llama3()
    ref.save_pretrained(tmp_path / "hf")
    ours = Llama.from_pretrained(tmp_path / "hf")
    assert dict(ours.config.rope_scaling)["rope_type"] == "llama3"
    assert_logits(ours, ref)
    assert ours.generate(PROMPTS[2], 12) == ref_greedy(ref, PROMPTS[2], 12)
    # GGUF: the scaling travels as the rope_freqs.weight tensor, as llama.cpp writes it
    factors = llama_cpp_rope_factors(LLAMA3_ROPE, 16, 500.0)
    write_gguf(tmp_path / "l3.gguf", ref, extra=lambda w: w.add_tensor("rope_freqs.weight", factors))
    g = Llama.from_pretrained(tmp_path / "l3.gguf")
    assert g.config.rope_freq_factors is not None and g.config.rope_scaling is None
    assert_logits(g, ref)
    assert g.generate(PROMPTS[2], 12) == ref_greedy(ref, PROMPTS[2], 12)


def tiny_qwen2(seed: int = 0, tie: bool = True):
    cfg = transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48,
                                   rope_theta=1000.0, rms_norm_eps=1e-6, tie_word_embeddings=tie,
                                   initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    m = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():   # q/k/v biases are zero when initialized: make them count
        for layer in m.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.bias.normal_(0, 0.5)
    return m


@pytest.mark.parametrize("tie", [True, False])
def test_qwen2(tmp_path, tie):
    ref = tiny_qwen2(tie=tie)
    ref.save_pretrained(tmp_path / "hf")
    ours = Llama.from_pretrained(tmp_path / "hf")
    assert ours.config.qkv_bias and not ours.config.o_bias and ours.config.model_type == "qwen2"
    assert_logits(ours, ref)
    assert ours.generate(PROMPTS[0], 10) == ref_greedy(ref, PROMPTS[0], 10)
    for quant in (None, "Q8_0"):
        held = write_gguf(tmp_path / f"q{quant}.gguf", ref, quant, arch="qwen2")
        g = Llama.from_pretrained(tmp_path / f"q{quant}.gguf")
        assert g.config.model_type == "qwen2" and g.config.qkv_bias
        r = ref
        if quant:
            r = tiny_qwen2(tie=tie)
            r.load_state_dict({k: torch.tensor(v) for k, v in held.items()}, strict=False)
        assert_logits(g, r, PROMPTS[:2])
        assert g.generate(PROMPTS[0], 10) == ref_greedy(r, PROMPTS[0], 10)


@pytest.mark.parametrize("jit", [True, False])
def test_batched_generation_equals_one_prompt_at_a_time(saved, jit):
    """Prompts of different lengths in one batch (no padding: each row reads its prompt, then its own tokens): every
    row's greedy tokens equal that prompt run alone and transformers' greedy decoding."""
    from fusegrad.models.decoding import Generator, Sampling
    d, ref = saved
    ours = Llama.from_pretrained(d)
    gen = Generator(ours, jit=jit)
    prompts = [PROMPTS[2], PROMPTS[0], PROMPTS[1], PROMPTS[0][:3]]
    batch = gen.generate_batch(prompts, 8)
    assert batch == [ref_greedy(ref, p, 8) for p in prompts]
    assert batch == [gen.generate(p, 8).tokens for p in prompts]
    # a row stops at its own stop token; the others go on
    first = batch[1][2]
    cut = gen.generate_batch(prompts, 8, stop=lambda t: t == first)
    for row, want in zip(cut, batch):
        assert row == (want[:want.index(first) + 1] if first in want else want)
    # host sampling: reproducible with a seed, top_k=1 is greedy
    s = Sampling(temperature=0.7, top_k=5, seed=3)
    assert gen.generate_batch(prompts, 6, sampling=s) == gen.generate_batch(prompts, 6, sampling=s)
    assert gen.generate_batch(prompts, 6, sampling=Sampling(temperature=1.0, top_k=1)) == [b[:6] for b in batch]
    with pytest.raises(ValueError, match="longer than the model's context"): gen.generate_batch([[1] * 45, [1]], 4)


def test_gguf_load_decodes_each_quantized_weight_once_and_copies_none_with_a_kernel(saved, tmp_path, monkeypatch):
    """Loading keeps memory and time down: the shape check reads shapes from the header (it used to decode every
    weight's planes at once, holding a second copy of the model), each weight's blocks are split into planes once,
    and the planes become the model's buffers as they are (no kernel copying them in)."""
    import fusegrad.models.gguf_weights as llama_mod
    from fusegrad import GlobalCounters
    from fusegrad.models.quantized import QuantizedLinear
    _, ref = saved
    write_gguf(tmp_path / "tiny.gguf", ref, "Q8_0")
    import fusegrad.nn.state as state_mod
    calls, phase = [], ["load"]
    real, real_check = llama_mod.block_planes, state_mod.check_state_dict
    monkeypatch.setattr(llama_mod, "block_planes", lambda *a: calls.append(phase[0]) or real(*a))

    def check(*a, **k):
        phase[0] = "check"
        real_check(*a, **k)
        phase[0] = "load"
    monkeypatch.setattr(state_mod, "check_state_dict", check)
    GlobalCounters.reset()
    ours = Llama.from_gguf(tmp_path / "tiny.gguf")
    quantized = [x for x in _modules(ours) if isinstance(x, QuantizedLinear)]
    assert calls == ["load"] * len(quantized) and quantized
    n_planes = sum(len(q._planes()) for q in quantized)
    assert GlobalCounters.kernel_count < n_planes   # (the float32 norms are converted by kernels; no plane is copied)
    assert ours.generate(PROMPTS[0], 4) == Llama.from_gguf(tmp_path / "tiny.gguf").generate(PROMPTS[0], 4)


def _modules(obj, seen=None):
    seen = set() if seen is None else seen
    if id(obj) in seen: return
    seen.add(id(obj))
    yield obj
    for v in (vars(obj).values() if hasattr(obj, "__dict__") else obj if isinstance(obj, (list, tuple)) else ()):
        if hasattr(v, "__dict__") or isinstance(v, (list, tuple)): yield from _modules(v, seen)


def test_attention_hands_o_proj_a_buffer_of_the_attention_shape(saved):
    """LlamaLayer.attention: o_proj's input is a view of a buffer shaped (B, KV, G, T, D). An 8-bit o_proj copies its
    input (models/quantized.py quantize_q8); a copy through the (B, T, H * D) reshape merged G and D into one range,
    a scalar loop down V's columns (SmolLM2 on AVX2: 70-90 us per layer and token, against ~15 vectorized)."""
    from fusegrad.ir.ops import Ops
    d, ref = saved
    ours = Llama.from_pretrained(d)
    layer, seen = ours.model.layers[0], []
    o_proj = layer.self_attn.o_proj
    layer.self_attn.o_proj = lambda x: (seen.append(x), o_proj(x))[1]
    got = ours.forward(Tensor([PROMPTS[0]]), 0).numpy()[0]
    base = seen[0].uop.base
    assert base.op is Ops.CONTIGUOUS and base.shape == (1, 2, 2, len(PROMPTS[0]), 16), (base.op, base.shape)
    want = ref_logits(ref, PROMPTS[0])
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
