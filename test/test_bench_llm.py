"""bench/llm.py: the speeds, medians, ratios against llama.cpp, token agreement lines and the table from known worker
results (no llama.cpp needed), finding llama-cpp-python's Python (absent: the table says why), and one end-to-end run
on a tiny GGUF file. Never a time is asserted, only what is computed from given times and what is printed."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import llm


def run(times: list[float], tokens: list[int], load: float = 1.0, rss: float = 100.0, **extra) -> dict:
    """A worker's result with the given second-generation times."""
    return {"import_s": 0.5, "load_s": load, "cold_times": [9.0] + times[1:], "times": times, "tokens": tokens,
            "rss_import_mb": 50.0, "rss_load_mb": rss, "rss_end_mb": rss + 10, "peak_rss_mb": rss + 20, **extra}


def test_speeds_leave_out_the_first_two_decode_steps():
    pre, dec = llm.speeds(10, [0.5, 9.0, 9.0, 0.1, 0.1, 0.2])   # the two slow steps (compiles) don't count
    assert pre == pytest.approx(20.0) and dec == pytest.approx(3 / 0.4)
    with pytest.raises(ValueError, match=">= 4"): llm.speeds(10, [0.5, 0.1, 0.1])
    with pytest.raises(ValueError, match="positive"): llm.speeds(10, [0.5, 0.1, 0.0, 0.1])


def test_summarize_medians_and_ratios_against_llama_cpp():
    ours = llm.summarize([run([1.0, 1, 1, 0.1, 0.1], [1], load=3.0), run([2.0, 1, 1, 0.2, 0.2], [1], load=5.0),
                          run([4.0, 1, 1, 0.1, 0.1], [1], load=4.0)], n_prompt=8)
    assert ours["prefill_tok_s"] == pytest.approx(4.0) and ours["decode_tok_s"] == pytest.approx(10.0)
    assert ours["decode_median_tok_s"] == pytest.approx(10.0)
    one = llm.summarize([run([1.0, 1, 1, 0.1, 0.1, 0.9], [1])], n_prompt=8)    # one preempted step
    assert one["decode_tok_s"] == pytest.approx(3 / 1.1) and one["decode_median_tok_s"] == pytest.approx(10.0)
    assert ours["load_s"] == 4.0 and ours["cold_first_s"] == 9.0 and ours["rss_end_mb"] == 110.0
    ref = llm.summarize([run([0.5, 1, 1, 0.05, 0.05], [1], load=0.5)], n_prompt=8)
    r = llm.ratios(ours, ref)
    assert r == pytest.approx({"decode": 0.5, "prefill": 0.25, "load": 8.0})
    assert llm.ratios(ours, None) == {}
    with pytest.raises(ValueError, match="no runs"): llm.summarize([], 8)


def test_first_difference():
    assert llm.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert llm.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert llm.first_difference([1, 2], [1, 2, 3]) == 2


def test_agreement_lines():
    ids = [5, 6, 7]
    results = {"fusegrad-q": [run([1.0] * 4, [1, 2, 3, 4]), run([1.0] * 4, [1, 2, 3, 4])],
               "transformers": [run([1.0] * 4, [1, 2, 9, 9])],
               "llama.cpp": [run([1.0] * 4, [1, 2, 3, 4], own_ids=[5, 6, 8])]}
    lines = llm.agreement(results, ids)
    assert "fusegrad-q: greedy tokens equal to llama.cpp's (all 4)" in lines
    assert any(ln.startswith("transformers: greedy tokens differ from llama.cpp's from token 2 on") for ln in lines)
    assert any(ln.startswith("prompt: llama.cpp's tokenizer gives 3 ids, fusegrad's 3, first different at 2")
               for ln in lines)
    results["llama.cpp"][0]["own_ids"] = ids
    results["fusegrad-q"][1]["tokens"] = [1, 2, 3, 5]
    lines = llm.agreement(results, ids)
    assert "prompt: llama.cpp's tokenizer gives the same 3 ids as fusegrad's" in lines
    assert "fusegrad-q: greedy tokens differ between its own blocks" in lines
    # without llama.cpp the first library is the reference
    del results["llama.cpp"]
    lines = llm.agreement(results, ids)
    assert any(ln.startswith("transformers: greedy tokens differ from fusegrad-q's") for ln in lines), lines


def test_table_ratios_targets_and_missing_llama_cpp():
    meds = {"fusegrad-q": llm.summarize([run([1.0, 1, 1, 0.1, 0.1], [1], load=2.0, rss=190.0)], 8),
            "llama.cpp": llm.summarize([run([0.5, 1, 1, 0.05, 0.05], [1], load=0.5)], 8)}
    out = llm.table(meds, 100.0, {})
    row = next(ln for ln in out.splitlines() if ln.startswith("| fusegrad-q |"))
    assert row.endswith("| 2.00 | 0.50x | 0.50x | 4.00x |"), row     # RSS end 200 MB / 100 MB; decode, prefill, load
    assert out.splitlines()[0].count("|") == out.splitlines()[1].count("|") == row.count("|")
    t = llm.targets(meds, 100.0)
    assert t is not None and "decode 0.50x llama.cpp (>= 1.0x) NOT met" in t and "prefill 0.50x (>= 0.5x) met" in t
    assert "load 2.00 s per 100 MB (<= 1.0 s) NOT met" in t
    assert "resident 2.00x the file (<= 1.3x; 1.50x without the 50 MB" in t and t.endswith("imports) NOT met"), t
    del meds["llama.cpp"]
    out = llm.table(meds, 100.0, {"llama.cpp": "no Python with llama-cpp-python"})
    assert "| fusegrad-q |" in out
    assert out.rstrip().endswith("| llama.cpp | not measured: no Python with llama-cpp-python |"), out
    assert "| - | - | - |" in out and llm.targets(meds, 100.0) is None


def test_busy_note():
    assert llm.busy_note(0.3, 2, 1) is None and llm.busy_note(1.4, 2, 1) is None and llm.busy_note(0.4, 2, 2) is None
    note = llm.busy_note(4.2, 2, 2)
    assert note is not None and note.startswith("note: load average 4.2 at the start on 2 cores, 2 threads per library")
    assert "--threads 1" in note
    one = llm.busy_note(1.6, 2, 1)
    assert one is not None and "1 thread per library" in one and "--threads 1" not in one


def test_a_failed_worker_says_why_in_one_line():
    from bench._procs import WorkerFailed, spawn
    with pytest.raises(WorkerFailed) as e:
        spawn(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert e.value.reason == f"killed by signal {int(signal.SIGSEGV)} (nothing on stderr)"
    with pytest.raises(WorkerFailed) as e:
        spawn(["-c", "import sys; sys.exit('no model here')"])
    assert e.value.reason == "exit status 1: no model here"
    with pytest.raises(WorkerFailed) as e:
        spawn(["-c", "import faulthandler, os, signal; faulthandler.enable(); os.kill(os.getpid(), signal.SIGSEGV)"])
    assert e.value.reason.startswith(f"killed by signal {int(signal.SIGSEGV)}: Fatal Python error: Segmentation fault "
                                     'File "<string>", line 1'), e.value.reason


def test_find_llama_python_says_why_not(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_CPP_PYTHON", raising=False)
    path, why = llm.find_llama_python(str(tmp_path / "no-python"))
    assert path is None and "can't be run" in why
    monkeypatch.setenv("LLAMA_CPP_PYTHON", str(tmp_path / "no-python"))
    assert llm.find_llama_python(None)[0] is None
    if subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True, check=False).returncode == 0:
        pytest.skip("llama_cpp is importable in fusegrad's own Python (it belongs in a venv of its own)")
    path, why = llm.find_llama_python(sys.executable)
    assert path is None and "can't import llama_cpp" in why


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A 2-layer random LLaMA in Q8_0 with a SentencePiece tokenizer (test_examples.py's, written the same way)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from models.gguf_vocab import add_spm_tokenizer
    from models.test_llama import write_gguf

    class Counter:
        def __getattr__(self, name): return lambda *a, **k: None
    cfg = transformers.LlamaConfig(vocab_size=add_spm_tokenizer(Counter()), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.3,
                                   bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("bench_llm") / "tiny.gguf"
    write_gguf(path, transformers.LlamaForCausalLM(cfg).eval(), "Q8_0", extra=add_spm_tokenizer)
    return path


def bench(path: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "bench" / "llm.py"), str(path), "--blocks", "1", "--new", "5", "--prompt",
            "hello world", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)


def test_runs_without_llama_cpp(tiny_gguf, tmp_path):
    out = bench(tiny_gguf, "--only", "fusegrad-q,llama.cpp", "--llama-python", str(tmp_path / "none"))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("tiny.gguf (") and "2 threads" in lines[0] and "5 new tokens" in lines[0], lines[0]
    row = next(ln for ln in lines if ln.startswith("| fusegrad-q |")).split("|")
    assert len(row) == 16 and float(row[6]) > 0 and row[-4:-1] == [" - ", " - ", " - "], row   # decode; no ratios
    assert any(ln.startswith("| llama.cpp | not measured:") and "can't be run" in ln for ln in lines), out.stdout


def test_llama_cpp_column_when_installed(tiny_gguf):
    """With llama-cpp-python in a venv of its own (bench/README.md; CI doesn't build it), llama.cpp's row has the
    ratios, its greedy tokens equal fusegrad's, and its tokenizer gives fusegrad's prompt ids."""
    python, why = llm.find_llama_python(None)
    if python is None: pytest.skip(f"llama.cpp not installed: {why}")
    out = bench(tiny_gguf, "--only", "fusegrad-q,llama.cpp", "--llama-python", python)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(ln.startswith("llama.cpp: llama-cpp-python ") for ln in lines), out.stdout
    row = next(ln for ln in lines if ln.startswith("| llama.cpp |")).split("|")
    assert row[-4:-1] == [" 1.00x ", " 1.00x ", " 1.00x "], row
    # the agreement is reported either way: llama.cpp quantizes activations to 8 bits, which can flip a pick of this
    # random model (it did on 2026-12-07: [1107, ...] against fusegrad's [608, ...], which are transformers' tokens for
    # the same file; test_examples.py and test_llama.py hold fusegrad to transformers)
    assert any(ln.startswith("fusegrad-q: greedy tokens ") for ln in lines), out.stdout
    assert any(ln.startswith("prompt: llama.cpp's tokenizer gives the same") for ln in lines), out.stdout
