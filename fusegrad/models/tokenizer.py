"""Tokenizers for the text models: WordPiece for BERT (uncased: lowercasing, accent stripping, punctuation and CJK
splitting) and byte-level BPE for GPT-2. Text in, token ids out; the `tokenizers` package does the work when it is
installed, and a pure-Python path that gives the same ids runs otherwise (or with backend="python")."""
from __future__ import annotations

import heapq
import json
import pathlib
import unicodedata
from collections.abc import Sequence
from typing import Any

from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor

# Unicode's White_Space property (what Rust's char::is_whitespace and the regex \s that `tokenizers` uses accept)
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" +
                        "".join(chr(c) for c in range(0x2000, 0x200B)))
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _has_tokenizers() -> bool:
    try:
        import tokenizers  # noqa: F401
        return True
    except ImportError:
        return False


def _pick_backend(backend: str) -> str:
    if backend not in ("auto", "tokenizers", "python"):
        raise ValueError(f"backend must be 'auto', 'tokenizers' or 'python', got {backend!r}")
    if backend == "tokenizers" and not _has_tokenizers():
        raise ImportError("backend='tokenizers' needs the tokenizers package: pip install tokenizers")
    return ("tokenizers" if _has_tokenizers() else "python") if backend == "auto" else backend


# ---------------------------------------------------------------------------------------------------------------------
# WordPiece (BERT)

def _is_control(c: str) -> bool:
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def _is_punctuation(c: str) -> bool:
    o = ord(c)
    return 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or unicodedata.category(c).startswith("P")


def _is_cjk(c: str) -> bool:
    o = ord(c)
    return any(lo <= o <= hi for lo, hi in _CJK)


def bert_normalize(text: str, lowercase: bool = True, strip_accents: bool | None = None) -> str:
    """BERT's text cleanup: drop NUL, U+FFFD and control characters, turn whitespace into spaces, put spaces around CJK
    ideographs, strip accents (NFD, then drop nonspacing marks; by default when lowercasing), lowercase."""
    out = []
    for c in text:
        if c in ("\0", "\ufffd") or _is_control(c): continue
        if c in _WHITESPACE: out.append(" ")
        elif _is_cjk(c): out.append(f" {c} ")
        else: out.append(c)
    s = "".join(out)
    if strip_accents if strip_accents is not None else lowercase:
        s = "".join(c for c in unicodedata.normalize("NFD", s) if unicodedata.category(c) != "Mn")
    return "".join(c.lower() for c in s) if lowercase else s   # per character: no final-sigma rule, as tokenizers


def bert_pre_tokenize(text: str) -> list[str]:
    """Split on whitespace, and make every punctuation character a word of its own."""
    words: list[str] = []
    cur: list[str] = []
    for c in text:
        if c in _WHITESPACE or _is_punctuation(c):
            if cur: words.append("".join(cur))
            cur = []
            if c not in _WHITESPACE: words.append(c)
        else: cur.append(c)
    if cur: words.append("".join(cur))
    return words


class WordPieceTokenizer:
    """BERT's uncased WordPiece tokenizer: `encode(text)` gives [CLS] ids [SEP]; calling it on a list of texts gives
    (input_ids, attention_mask) int32 Tensors (B, T) padded with [PAD] to the longest text.

    >>> tok = WordPieceTokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "!": 6})
    >>> tok.encode("Hello, World!")
    [2, 4, 1, 5, 6, 3]
    """

    def __init__(self, vocab: dict[str, int], lowercase: bool = True, strip_accents: bool | None = None,
                 max_input_chars_per_word: int = 100, backend: str = "auto", unk_token: str = "[UNK]",
                 cls_token: str = "[CLS]", sep_token: str = "[SEP]", pad_token: str = "[PAD]"):
        for t in (unk_token, cls_token, sep_token, pad_token):
            if t not in vocab: raise ValueError(f"the WordPiece vocab has no {t!r} token")
        self.vocab, self.lowercase, self.strip_accents = vocab, lowercase, strip_accents
        self.max_chars = max_input_chars_per_word
        self.unk_id, self.cls_id, self.sep_id, self.pad_id = (vocab[unk_token], vocab[cls_token], vocab[sep_token],
                                                               vocab[pad_token])
        self.unk_token = unk_token
        self.inverse = {i: t for t, i in vocab.items()}
        self.backend = _pick_backend(backend)
        self._fast: Any = self._build_fast() if self.backend == "tokenizers" else None

    @classmethod
    def from_dir(cls, path: str | pathlib.Path, backend: str = "auto") -> WordPieceTokenizer:
        """Read vocab.txt (or the vocab inside tokenizer.json) from a model folder (or take a vocab.txt /
        tokenizer.json file directly). Lowercasing and accent stripping come from tokenizer.json's BertNormalizer
        when there is one, else from tokenizer_config.json (do_lower_case, strip_accents)."""
        p = pathlib.Path(path)
        d = p if p.is_dir() else p.parent
        cfg: dict[str, Any] = {}
        if (d / "tokenizer_config.json").is_file(): cfg = json.loads((d / "tokenizer_config.json").read_text())
        lowercase, strip = cfg.get("do_lower_case", True), cfg.get("strip_accents")
        tj = p if p.is_file() and p.suffix == ".json" else d / "tokenizer.json"
        full = json.loads(tj.read_text(encoding="utf-8")) if tj.is_file() else None
        norm = (full or {}).get("normalizer") or {}
        if norm.get("type") == "BertNormalizer":
            lowercase, strip = norm.get("lowercase", True), norm.get("strip_accents")
        if p.is_file() and p.suffix == ".txt" or (p.is_dir() and (p / "vocab.txt").is_file()):
            lines = (p if p.is_file() else p / "vocab.txt").read_text(encoding="utf-8").split("\n")
            if lines and lines[-1] == "": lines.pop()
            vocab = {t: i for i, t in enumerate(lines)}
        elif full is not None:
            model = full.get("model", {})
            if model.get("type") != "WordPiece":
                raise ValueError(f"{tj}: not a WordPiece tokenizer ({model.get('type')})")
            vocab = model["vocab"]
        else:
            raise FileNotFoundError(f"{path}: no vocab.txt or tokenizer.json for a WordPiece tokenizer")
        return cls(vocab, lowercase=lowercase, strip_accents=strip, backend=backend)

    def _build_fast(self) -> Any:
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
        tok = Tokenizer(models.WordPiece(self.vocab, unk_token=self.unk_token,
                                         max_input_chars_per_word=self.max_chars))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=self.strip_accents, lowercase=self.lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tok

    def _wordpiece(self, word: str) -> list[int]:
        """Greedy longest-match-first pieces ('##' marks a piece inside a word); a word with an unmatched part, or
        longer than max_input_chars_per_word characters, becomes [UNK]."""
        if len(word) > self.max_chars: return [self.unk_id]
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab: break
                end -= 1
            if end == start: return [self.unk_id]
            ids.append(self.vocab[piece])
            start = end
        return ids

    def tokenize_ids(self, text: str) -> list[int]:
        """The ids of a text without [CLS]/[SEP], from the pure-Python path (whatever the backend)."""
        norm = bert_normalize(text, self.lowercase, self.strip_accents)
        return [i for w in bert_pre_tokenize(norm) for i in self._wordpiece(w)]

    def _plain(self, texts: Sequence[str]) -> list[list[int]]:
        if self._fast is not None:
            return [e.ids for e in self._fast.encode_batch(list(texts), add_special_tokens=False)]
        return [self.tokenize_ids(t) for t in texts]

    def encode(self, text: str, add_special_tokens: bool = True, max_length: int | None = None) -> list[int]:
        """Token ids of one text; with special tokens [CLS] ... [SEP], cut to max_length ids in all."""
        return self._finish(self._plain([text])[0], add_special_tokens, max_length)

    def _finish(self, ids: list[int], special: bool, max_length: int | None) -> list[int]:
        if max_length is not None:
            keep = max_length - (2 if special else 0)
            if keep < 0: raise ValueError(f"max_length {max_length} leaves no room for [CLS] and [SEP]")
            ids = ids[:keep]
        return [self.cls_id, *ids, self.sep_id] if special else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Pieces joined back into text ('##' pieces glued to the previous one; special tokens dropped)."""
        special = {self.cls_id, self.sep_id, self.pad_id}
        words: list[str] = []
        for i in ids:
            if i in special: continue
            t = self.inverse.get(int(i), self.unk_token)
            if t.startswith("##") and words: words[-1] += t[2:]
            else: words.append(t)
        return " ".join(words)

    def batch(self, texts: Sequence[str], max_length: int | None = None) -> tuple[list[list[int]], list[list[int]]]:
        """(ids, mask) as Python lists, each text [CLS] ... [SEP], padded with [PAD] (mask 0) to the longest."""
        if isinstance(texts, str): raise TypeError("batch() takes a list of texts; use encode() for one text")
        seqs = [self._finish(ids, True, max_length) for ids in self._plain(texts)]
        T = max((len(s) for s in seqs), default=0)
        return [s + [self.pad_id] * (T - len(s)) for s in seqs], [[1] * len(s) + [0] * (T - len(s)) for s in seqs]

    def __call__(self, texts: Sequence[str], max_length: int | None = None) -> tuple[Tensor, Tensor]:
        """(input_ids, attention_mask), int32 Tensors (B, T)."""
        ids, mask = self.batch(texts, max_length)
        return Tensor(ids, dtype=dtypes.int32), Tensor(mask, dtype=dtypes.int32)


# ---------------------------------------------------------------------------------------------------------------------
# byte-level BPE (GPT-2)

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable characters: printable Latin-1 bytes map to themselves, the
    rest to U+0100 upward in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep: table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _kind(c: str) -> str:
    """'s' whitespace, 'L' letter, 'N' number, 'o' anything else (the classes of GPT-2's split pattern)."""
    if c in _WHITESPACE: return "s"
    cat = unicodedata.category(c)
    return "L" if cat[0] == "L" else "N" if cat[0] == "N" else "o"


_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")


def gpt2_pre_tokenize(text: str) -> list[str]:
    """Split text as GPT-2's pattern does: contractions ('s 't 're 've 'm 'll 'd), an optional space followed by a run
    of letters, of digits or of other symbols, and whitespace runs (a run before a word leaves its last space to it)."""
    out, i, n = [], 0, len(text)
    kinds = [_kind(c) for c in text]
    while i < n:
        if text[i] == "'":
            m = next((c for c in _CONTRACTIONS if text.startswith(c, i)), None)
            if m:
                out.append(m)
                i += len(m)
                continue
        j = i + 1 if text[i] == " " and i + 1 < n and kinds[i + 1] != "s" else i
        k = kinds[j]
        if k != "s":   # ' ?' + a run of one class
            e = j + 1
            while e < n and kinds[e] == k: e += 1
            out.append(text[i:e])
            i = e
            continue
        e = i
        while e < n and kinds[e] == "s": e += 1
        if e < n and e - i > 1: e -= 1            # \s+(?!\S): leave the last space for the word after it
        out.append(text[i:e])
        i = e
    return out


def bpe_merge(parts: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Apply BPE merges to a list of symbols: repeatedly join the adjacent pair with the lowest rank in `ranks` (the
    leftmost such pair on ties) until no adjacent pair has a rank. Near-linear: a heap of candidate pairs ordered by
    (rank, left position) and a doubly linked list of the live symbols."""
    n = len(parts)
    if n < 2: return parts
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))   # nxt[i] == n: no symbol after i
    heap = [(r, i) for i in range(n - 1) if (r := ranks.get((parts[i], parts[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        r, i = heapq.heappop(heap)
        j = nxt[i]
        if parts[i] is None or j >= n or ranks.get((parts[i], parts[j])) != r: continue   # stale entry
        parts[i], parts[j] = parts[i] + parts[j], None
        nxt[i] = k = nxt[j]
        if k < n: prv[k] = i
        if (p := prv[i]) >= 0 and (rp := ranks.get((parts[p], parts[i]))) is not None: heapq.heappush(heap, (rp, p))
        if k < n and (rk := ranks.get((parts[i], parts[k]))) is not None: heapq.heappush(heap, (rk, i))
    return [p for p in parts if p is not None]


class BPETokenizer:
    """GPT-2's byte-level BPE from vocab.json and merges.txt: `encode(text) -> ids`, `decode(ids) -> text`.

    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(["h", "i", "Ġ", "hi", "Ġhi"])}))
    >>> _ = (d / "merges.txt").write_text("#version: 0.2\\nh i\\nĠ hi\\n")
    >>> BPETokenizer.from_dir(d).encode("hi hi")
    [3, 4]
    """

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], backend: str = "auto",
                 eos_token: str = "<|endoftext|>"):
        self.vocab, self.merges = vocab, merges
        self.ranks = {m: r for r, m in enumerate(merges)}
        self.inverse = {i: t for t, i in vocab.items()}
        self.byte_map = bytes_to_unicode()
        self.unbyte = {c: b for b, c in self.byte_map.items()}
        self.eos_id = vocab.get(eos_token)
        self.backend = _pick_backend(backend)
        self._fast: Any = self._build_fast() if self.backend == "tokenizers" else None
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_dir(cls, path: str | pathlib.Path, backend: str = "auto") -> BPETokenizer:
        """Read vocab.json and merges.txt from a folder."""
        d = pathlib.Path(path)
        if not (d / "vocab.json").is_file() or not (d / "merges.txt").is_file():
            raise FileNotFoundError(f"{d}: a GPT-2 tokenizer needs vocab.json and merges.txt there")
        vocab = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
        merges = []
        for ln in (d / "merges.txt").read_text(encoding="utf-8").split("\n"):
            if not ln or ln.startswith("#version"): continue
            a, _, b = ln.partition(" ")
            if not b: raise ValueError(f"{d / 'merges.txt'}: bad merge line {ln!r} (expected two tokens)")
            merges.append((a, b))
        return cls(vocab, merges, backend=backend)

    def _build_fast(self) -> Any:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        tok = Tokenizer(models.BPE(self.vocab, self.merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok

    def _bpe(self, word: str) -> list[int]:
        """Merge the lowest-ranked adjacent pair (leftmost first) until no pair has a merge.

        O(n log n) in the word's length: candidate pairs wait in a heap keyed by (rank, position of the left symbol)
        and the symbols form a linked list, so a merge touches only its two neighbours. An entry whose pair has since
        changed (a neighbour merged away) is recognised when popped and dropped."""
        if word in self._cache: return self._cache[word]
        parts = bpe_merge(list(word), self.ranks)
        try:
            ids = [self.vocab[p] for p in parts]
        except KeyError as e:
            raise ValueError(f"BPE piece {e.args[0]!r} is not in the vocab (vocab.json and merges.txt don't "
                             "match)") from None
        if len(self._cache) < 100_000: self._cache[word] = ids
        return ids

    def tokenize_ids(self, text: str) -> list[int]:
        """The ids from the pure-Python path (whatever the backend)."""
        return [i for w in gpt2_pre_tokenize(text)
                for i in self._bpe("".join(self.byte_map[b] for b in w.encode("utf-8")))]

    def encode(self, text: str) -> list[int]:
        """Token ids of a text (no special tokens added)."""
        if self._fast is not None: return self._fast.encode(text, add_special_tokens=False).ids
        return self.tokenize_ids(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids (bytes that don't form valid UTF-8 become U+FFFD)."""
        for i in ids:
            if int(i) not in self.inverse:
                raise ValueError(f"token id {int(i)} is not in the vocab ({len(self.vocab)} ids)")
        chars = "".join(self.inverse[int(i)] for i in ids)
        return bytes(self.unbyte[c] for c in chars if c in self.unbyte).decode("utf-8", errors="replace")
