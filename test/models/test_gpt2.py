"""GPT-2 against transformers on a small random-weight model saved with save_pretrained: logits, greedy generation token
for token (TinyJit'd decode steps with a symbolic start position, and eager), context errors, bad weights, and
examples/gpt2.py with a tokenizer trained here."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fusegrad import Tensor
from fusegrad.models.decoding import Generator
from fusegrad.models.gpt2 import GPT2, GPT2Config, find_gpt2_dir
from fusegrad.models.tokenizer import BPETokenizer
from fusegrad.models.weights import WeightsMismatch, WeightsNotFound

from .kquants import add_tensor, finish
from .test_tokenizer import train_bpe

torch = pytest.importorskip("torch", reason="the reference model runs in PyTorch")
transformers = pytest.importorskip("transformers", reason="the reference GPT-2 comes from transformers")
pytest.importorskip("tokenizers", reason="the test's tokenizer is trained with the tokenizers package")
ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 200, 3, 99, 42], [1], [250, 251, 252, 7, 7, 7, 7, 30, 31, 32, 33, 34]]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[pathlib.Path, object]:
    """A random 3-layer GPT-2 (initializer_range 0.3, so logits are well apart and greedy picks are not near-ties)
    saved with save_pretrained, next to a BPE tokenizer (vocab.json, merges.txt) of the same vocab size."""
    d = train_bpe(tmp_path_factory.mktemp("gpt2"), vocab_size=300)
    n_vocab = len(BPETokenizer.from_dir(d).vocab)
    cfg = transformers.GPT2Config(vocab_size=n_vocab, n_positions=48, n_embd=64, n_layer=3, n_head=4,
                                  initializer_range=0.3, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(d)
    return d, model


def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_logits_match(saved):
    d, ref = saved
    ours = GPT2.from_pretrained(d)
    for p in PROMPTS:
        with torch.no_grad(): want = ref(torch.tensor([p])).logits[0, -1].numpy()
        got = ours.forward(Tensor([p]), 0).numpy()[0]
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    # the cache continues a sequence: the first 4 tokens, then the rest at start_pos 4 (a causal mask with an offset)
    p = PROMPTS[2]
    with torch.no_grad(): want = ref(torch.tensor([p])).logits[0, -1].numpy()
    ours.forward(Tensor([p[:4]]), 0)
    got = ours.forward(Tensor([p[4:]]), 4).numpy()[0]
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_greedy_generation_matches_token_for_token(saved):
    from fusegrad.engine import realize
    d, ref = saved
    ours = GPT2.from_pretrained(d)
    gen = Generator(ours, jit=True)
    n = 24
    for p in PROMPTS: assert gen.generate(p, n).tokens == reference_greedy(ref, p, n), f"prompt {p}"
    # one capture served every decode step of every prompt (positions 1..35)
    assert gen._greedy.cnt == sum(n - 1 for _ in PROMPTS) and gen._greedy.captured is not None
    # another prompt of a length seen before compiles nothing at all: prefill kernels are cached, decode steps replay
    before = len(realize._programs)
    other = [9, 8, 7, 6, 5, 4]
    assert gen.generate(other, n).tokens == reference_greedy(ref, other, n)
    assert len(realize._programs) == before
    # a forward pass of another batch size reallocates the KV caches: the generator captures again instead of
    # replaying kernels that hold the old buffers
    ours.forward(Tensor([[1, 2], [3, 4]]), 0)
    assert gen.generate(PROMPTS[2], 8).tokens == reference_greedy(ref, PROMPTS[2], 8)
    assert Generator(ours, jit=False).generate(PROMPTS[0], 10).tokens == reference_greedy(ref, PROMPTS[0], 10)


def test_sampling(saved):
    d, _ = saved
    ours = GPT2.from_pretrained(d)
    greedy = ours.generate(PROMPTS[0], 12)
    Tensor.manual_seed(1)
    assert ours.generate(PROMPTS[0], 12, temperature=1e-4) == greedy   # a near-zero temperature samples the argmax
    Tensor.manual_seed(1)
    hot = ours.generate(PROMPTS[0], 12, temperature=5.0)
    assert len(hot) == 12 and all(0 <= t < ours.config.vocab_size for t in hot) and hot != greedy


def test_pytorch_bin_and_context_errors(saved, tmp_path):
    _, ref = saved
    ref.config.save_pretrained(tmp_path)
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    ours = GPT2.from_pretrained(tmp_path)
    with torch.no_grad(): want = ref(torch.tensor([PROMPTS[0]])).logits[0, -1].numpy()
    np.testing.assert_allclose(ours.forward(Tensor([PROMPTS[0]]), 0).numpy()[0], want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="the prompt has 49 tokens, longer than the model's context of 48 tokens"):
        ours.generate([1] * 49, 1)
    with pytest.raises(ValueError, match=r"plus 10 new tokens is longer .* ask for at most 8 new tokens"):
        ours.generate([1] * 40, 10)
    with pytest.raises(ValueError, match="longer than the model's context of 48"): ours.forward(Tensor([[1] * 49]), 0)


def test_wrong_weights(saved, tmp_path):
    d, _ = saved
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=48, n_embd=32, n_layer=3, n_head=4, bos_token_id=0,
                                  eos_token_id=0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((d / "config.json").read_text())       # config of the 64-wide model
    with pytest.raises(WeightsMismatch, match=r"doesn't hold weights for GPT-2 \(3 layers x 64\): .*first mismatch at "
                       r"'wte\.weight': model has \(300, 64\), state_dict has \(300, 32\)"):
        GPT2.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not GPT-2"): GPT2Config.from_dict({"model_type": "llama"})
    with pytest.raises(WeightsNotFound, match="no model.safetensors"): GPT2.from_pretrained(tmp_path / "nothing")


def run_example(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "gpt2.py"), *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, check=False, env=env)


def test_example(saved, tmp_path):
    d, ref = saved
    tok = BPETokenizer.from_dir(d)
    prompt = "The quick brown fox"
    r = run_example("--weights", str(d), "--prompt", prompt, "--max-new", "12")
    assert r.returncode == 0, r.stdout + r.stderr
    text, stats = r.stdout.splitlines()[:-1], r.stdout.splitlines()[-1]
    assert "\n".join(text) == prompt + tok.decode(reference_greedy(ref, tok.encode(prompt), 12))
    assert "tokens/s" in stats and "TinyJit" in stats
    r = run_example("--weights", str(d), "--prompt", prompt, "--max-new", "100")
    assert r.returncode == 2 and "ask for at most" in r.stderr and "new tokens" in r.stderr
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    r = run_example("--prompt", "hi", env=env)
    assert r.returncode == 2 and "pass --weights DIR" in r.stderr
    with pytest.raises(WeightsNotFound, match="pass --weights DIR"):
        os.environ["XDG_CACHE_HOME"], old = str(tmp_path), os.environ.get("XDG_CACHE_HOME")
        try: find_gpt2_dir()
        finally:
            if old is None: del os.environ["XDG_CACHE_HOME"]
            else: os.environ["XDG_CACHE_HOME"] = old


GGUF_GPT2_LAYER = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
                   "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}


def write_gpt2_gguf(path: pathlib.Path, model, quant: str | None = None) -> dict[str, np.ndarray]:
    """`model`'s weights as llama.cpp's converter writes a GPT-2: its names, the Conv1D weights transposed to (out, in),
    the tied embedding again as output.weight. Returns the HF state dict the file holds (dequantized)."""
    gguf = pytest.importorskip("gguf", reason="GGUF files are written with the gguf package")
    cfg = model.config
    sd = {k.removeprefix("transformer."): v.numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_context_length(cfg.n_positions)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(cfg.n_inner or 4 * cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    names = {"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight", "ln_f.weight": "output_norm.weight",
             "ln_f.bias": "output_norm.bias"}
    for i in range(cfg.n_layer):
        for hf, gg in GGUF_GPT2_LAYER.items():
            for part in ("weight", "bias"): names[f"h.{i}.{hf}.{part}"] = f"blk.{i}.{gg}.{part}"
    held = {}
    for hf, gg in list(names.items()) + [("wte.weight", "output.weight")]:
        conv = hf.endswith(".weight") and (".attn.c_" in hf or ".mlp.c_" in hf)
        arr = np.ascontiguousarray(sd[hf].T) if conv else sd[hf]
        arr = add_tensor(w, gg, arr, quant)
        if gg != "output.weight": held["transformer." + hf] = arr.T if conv else arr
    finish(w)
    return held


@pytest.mark.parametrize("quant", [None, "Q8_0", "Q4_1"])
def test_gguf(saved, tmp_path, quant):
    d, ref = saved
    held = write_gpt2_gguf(tmp_path / "g.gguf", ref, quant)
    ours = GPT2.from_pretrained(tmp_path / "g.gguf")
    assert ours.config.n_layer == 3 and ours.config.n_embd == 64 and ours.config.vocab_size == ref.config.vocab_size
    if quant:   # the reference runs on the weights the file really holds
        ref = transformers.GPT2LMHeadModel(ref.config).eval()
        ref.load_state_dict({k: torch.tensor(np.ascontiguousarray(v)) for k, v in held.items()}, strict=False)
        ref.tie_weights()
        # the projections (with their float32 biases) and the tied embedding stay in their blocks
        from fusegrad.models.quantized import QuantizedEmbedding, QuantizedLinear
        assert all(isinstance(m, QuantizedLinear) for b in ours.h for m in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc,
                                                                           b.mlp.c_proj))
        assert isinstance(ours.wte, QuantizedEmbedding)
        flt = GPT2.from_gguf(tmp_path / "g.gguf", quantized=False)
        assert not isinstance(flt.h[0].attn.c_attn, QuantizedLinear) and not isinstance(flt.wte, QuantizedEmbedding)
        np.testing.assert_allclose(ours.forward(Tensor([PROMPTS[0]]), 0).numpy(),
                                   flt.forward(Tensor([PROMPTS[0]]), 0).numpy(), rtol=1e-4, atol=1e-4)
    for p in PROMPTS:
        with torch.no_grad(): want = ref(torch.tensor([p])).logits[0, -1].numpy()
        got = ours.forward(Tensor([p]), 0).numpy()[0]
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    assert ours.generate(PROMPTS[0], 10) == reference_greedy(ref, PROMPTS[0], 10)
    from fusegrad.models.llama import Llama
    with pytest.raises(WeightsMismatch, match="general.architecture is 'gpt2', not one of llama, qwen2"):
        Llama.from_pretrained(tmp_path / "g.gguf")
