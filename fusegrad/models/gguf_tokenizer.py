"""The tokenizer a GGUF file describes in its `tokenizer.ggml.*` metadata, with no other file: llama.cpp's `gpt2`
model (byte-level BPE from the stored merges, split first by the pattern `tokenizer.ggml.pre` names) and its `llama`
model (SentencePiece: pieces merged by score, spaces as U+2581, byte fallback to `<0xNN>` tokens). Control, unknown
and user-defined tokens are matched whole in the text; BOS/EOS are added as `add_bos_token` / `add_eos_token` say.
Ids follow transformers' GGUF tokenizer (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`). Pure Python.

    tok = GGUFTokenizer.from_gguf("model.gguf")      # or GGUFTokenizer(metadata) with gguf_load's metadata
    ids = tok.encode("Hello")                        # BOS first when the file asks for it
    text = tok.decode(ids)
"""
from __future__ import annotations

import codecs
import functools
import heapq
import pathlib
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fusegrad.models.tokenizer import bytes_to_unicode, gpt2_pre_tokenize
from fusegrad.nn.state import gguf_load

# llama.cpp's token types (tokenizer.ggml.token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# ---------------------------------------------------------------------------------------------------------------------
# pre-tokenizer patterns: written with \p{..} and \s as tokenizers' (Oniguruma) regexes are; translated for Python's re

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_C = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_C}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_C}|\p{{N}}{{1,3}}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> split pattern (the names transformers maps; any other name splits as GPT-2 does)
PRE_TOKENIZER_PATTERNS: dict[str, str] = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
    "tekken": _TEKKEN, **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O)}
# Unicode's White_Space property (what Oniguruma's \s is; Python's \s also takes U+001C..U+001F)
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))


@functools.cache
def _category_ranges() -> dict[str, str]:
    """General category (two letters, and the one-letter classes) -> a regex class body of ranges, from unicodedata."""
    runs: dict[str, list[list[int]]] = {}
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        for key in (cat, cat[0]):
            r = runs.setdefault(key, [])
            if r and r[-1][1] == cp - 1: r[-1][1] = cp
            else: r.append([cp, cp])

    def body(rs: list[list[int]]) -> str:
        return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in rs)
    return {k: body(v) for k, v in runs.items()}


def _translate(pattern: str) -> str:
    """An Oniguruma-style pattern (\\p{X}, \\s, \\S) in Python re syntax."""
    cats, ws = _category_ranges(), re.escape(_WHITESPACE)
    out, i, depth = [], 0, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and pattern[i + 1] == "p":
            end = pattern.index("}", i)
            body = cats[pattern[i + 3:end]]
            out.append(body if depth else f"[{body}]")
            i = end + 1
            continue
        if c == "\\" and pattern[i + 1] in "sS":
            out.append(ws if depth else (f"[{ws}]" if pattern[i + 1] == "s" else f"[^{ws}]"))
            i += 2
            continue
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        depth += c == "["
        depth -= c == "]" and depth > 0
        out.append(c)
        i += 1
    return "".join(out)


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]: return re.compile(_translate(pattern))


def split_pieces(text: str, pattern: str) -> list[str]:
    """Every match of `pattern` in `text`, and the text between matches, in order (tokenizers' 'isolated' split)."""
    out, at = [], 0
    for m in _compiled(pattern).finditer(text):
        if m.start() > at: out.append(text[at:m.start()])
        if m.end() > m.start(): out.append(m.group())
        at = m.end()
    if at < len(text): out.append(text[at:])
    return out


# ---------------------------------------------------------------------------------------------------------------------
# merging

def merge_pieces(parts: list[str], rank: Callable[[str, str], Any]) -> list[str]:
    """Merge adjacent pieces, best (lowest) rank first and leftmost among equals, until no pair has a rank (`rank`
    returns None for a pair that doesn't merge). A heap over a linked list: O(n log n) in the number of pieces."""
    n = len(parts)
    if n < 2: return parts
    nxt, prv, alive = list(range(1, n + 1)), list(range(-1, n - 1)), [True] * n
    heap = []
    for i in range(n - 1):
        r = rank(parts[i], parts[i + 1])
        if r is not None: heap.append((r, i, parts[i], parts[i + 1]))
    heapq.heapify(heap)
    while heap:
        _, i, left, right = heapq.heappop(heap)
        j = nxt[i] if alive[i] else n
        if j >= n or parts[i] != left or parts[j] != right: continue      # stale: a neighbour merged since
        parts[i] = left + right
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[i] < n: prv[nxt[i]] = i
        for a in (prv[i], i):
            if a >= 0 and nxt[a] < n:
                r = rank(parts[a], parts[nxt[a]])
                if r is not None: heapq.heappush(heap, (r, a, parts[a], parts[nxt[a]]))
    return [p for p, keep in zip(parts, alive) if keep]


# ---------------------------------------------------------------------------------------------------------------------
# the tokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class GGUFTokenizer:
    """Text <-> ids from GGUF metadata. `encode(text, add_special=True)` puts BOS (and EOS) around the ids as the file
    says; special tokens written in the text (e.g. `<|im_start|>`) become their ids. `decode(ids)` gives the text back
    (special tokens as their text unless skip_special=True).

    >>> meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["h", "i", "Ġ", "hi", "Ġhi", "<|end|>"],
    ...         "tokenizer.ggml.merges": ["h i", "Ġ hi"], "tokenizer.ggml.token_type": [1, 1, 1, 1, 1, 3]}
    >>> tok = GGUFTokenizer(meta)
    >>> tok.encode("hi hi<|end|>"), tok.decode([3, 4, 5])
    ([3, 4, 5], 'hi hi<|end|>')
    """

    def __init__(self, meta: dict[str, Any]):
        self.model = meta.get("tokenizer.ggml.model")
        if self.model not in ("gpt2", "llama"):
            raise ValueError(f"tokenizer.ggml.model {self.model!r} is not supported (supported: 'gpt2' byte-level "
                             "BPE, 'llama' SentencePiece)" if self.model else "the file has no tokenizer.ggml.model")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens: raise ValueError("the file has no tokenizer.ggml.tokens")
        self.tokens: list[str] = list(tokens)
        types = meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
        if len(types) != len(tokens):
            raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
        self.types: list[int] = list(types)
        self.pre = meta.get("tokenizer.ggml.pre", "default")
        self.chat_template: str | None = meta.get("tokenizer.chat_template")

        def special_id(key: str) -> int | None:
            v = meta.get(f"tokenizer.ggml.{key}_token_id")
            if v is not None and not 0 <= v < len(tokens):
                raise ValueError(f"tokenizer.ggml.{key}_token_id {v} is outside the vocab of {len(tokens)} tokens")
            return v
        self.bos_id, self.eos_id = special_id("bos"), special_id("eos")
        self.unk_id, self.pad_id = special_id("unknown"), special_id("padding")
        self.eot_id = special_id("eot")
        spm = self.model == "llama"
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", spm))    # llama.cpp's default for SentencePiece
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        self.byte_map = bytes_to_unicode()
        self.unbyte = {c: b for b, c in self.byte_map.items()}
        if spm: self._init_spm(meta)
        else: self._init_bpe(meta)
        self._init_added()

    @classmethod
    def from_gguf(cls, path: str | pathlib.Path) -> GGUFTokenizer:
        """The tokenizer of a .gguf file (its metadata only; no tensor is read)."""
        return cls(gguf_load(path)[0])

    # ----- construction

    def _init_bpe(self, meta: dict[str, Any]) -> None:
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None: raise ValueError("a 'gpt2' tokenizer needs tokenizer.ggml.merges; the file has none")
        alphabet = set(self.byte_map.values())
        # a token spelled outside the byte alphabet (a mislabelled added token) is looked up by its bytes' spelling
        self.vocab = {(t if set(t) <= alphabet else "".join(self.byte_map[b] for b in t.encode("utf-8"))): i
                      for i, t in enumerate(self.tokens)}
        # a merge's rank keyed by its two pieces' ids, as one int (id(a) * vocab size + id(b)): a pair of strings and
        # a tuple per merge took 12 of the tokenizer's 20 MB for a 49k-merge vocab, the ints take 5
        n, ids = len(self.tokens), self.vocab
        self.ranks: dict[int, int] = {}
        self.other_ranks: dict[tuple[str, str], int] = {}   # merges of pieces that aren't tokens (kept, never merged to)
        for r, m in enumerate(merges):
            a, sep, b = m.partition(" ")
            if not sep: raise ValueError(f"tokenizer.ggml.merges[{r}] is {m!r}, not two tokens joined by a space")
            ia, ib = ids.get(a), ids.get(b)
            if ia is None or ib is None: self.other_ranks.setdefault((a, b), r)
            else: self.ranks.setdefault(ia * n + ib, r)
        self.pattern = PRE_TOKENIZER_PATTERNS.get(self.pre)
        self.add_prefix = False

    def _init_spm(self, meta: dict[str, Any]) -> None:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(self.tokens):
            raise ValueError("a 'llama' tokenizer needs tokenizer.ggml.scores, one per token")
        self.vocab = {t: i for i, t in enumerate(self.tokens)}
        self.scores = [float(s) for s in scores]
        self.byte_ids = {}
        for i, t in enumerate(self.tokens):
            m = _BYTE_TOKEN.fullmatch(t)
            if m: self.byte_ids.setdefault(int(m.group(1), 16), i)
        # transformers' GGUF LlamaTokenizer puts U+2581 before a text that doesn't start with a space (whatever the
        # file's add_space_prefix says), and strips one leading space when decoding
        self.add_prefix = True

    def _init_added(self) -> None:
        """Tokens matched whole in the text: control ones (in a byte-level vocab only those spelled in its alphabet),
        user-defined ones, and the BOS/EOS/unknown/padding tokens."""
        alphabet = set(self.byte_map.values())
        added: dict[str, int] = {}
        for i, (t, ty) in enumerate(zip(self.tokens, self.types)):
            if ty == CONTROL and (self.model == "llama" or set(t) <= alphabet): added.setdefault(t, i)
            elif ty == USER_DEFINED and t in self.vocab: added.setdefault(t, i)
        for i in (self.bos_id, self.eos_id, self.unk_id, self.pad_id):
            if i is not None: added.setdefault(self.tokens[i], i)
        self.added = {t: self.vocab.get(t, i) for t, i in added.items() if t}
        self.special_ids = {i for i, ty in enumerate(self.types) if ty == CONTROL} | \
            {i for i in (self.bos_id, self.eos_id, self.unk_id, self.pad_id) if i is not None}
        alts = sorted(self.added, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, alts))) if alts else None

    # ----- encoding

    def _split_added(self, text: str) -> list[str | int]:
        """Text pieces and the ids of the added tokens between them (leftmost, then longest, match first)."""
        if self._added_re is None: return [text] if text else []
        out: list[str | int] = []
        at = 0
        for m in self._added_re.finditer(text):   # alternatives sorted longest first: leftmost-longest
            if m.start() > at: out.append(text[at:m.start()])
            out.append(self.added[m.group()])
            at = m.end()
        if at < len(text): out.append(text[at:])
        return out

    def _bpe_rank(self, a: str, b: str) -> int | None:
        """The rank of merging pieces a and b (lower first), None if the merges don't list them."""
        ia, ib = self.vocab.get(a), self.vocab.get(b)
        if ia is None or ib is None: return self.other_ranks.get((a, b)) if self.other_ranks else None
        return self.ranks.get(ia * len(self.tokens) + ib)

    def _bpe_ids(self, piece: str) -> list[int]:
        word = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
        parts = merge_pieces(list(word), self._bpe_rank)
        ids = []
        for p in parts:
            if p not in self.vocab: raise ValueError(f"BPE piece {p!r} is not in the vocab (merges don't match tokens)")
            ids.append(self.vocab[p])
        return ids

    def _spm_rank(self, a: str, b: str) -> Any:
        """A merge's rank: the merged piece's score (higher first), then transformers' order among equal scores
        (longer left part, longer right part, the merged piece's id, the parts' ids)."""
        m = self.vocab.get(a + b)
        if m is None or a not in self.vocab or b not in self.vocab: return None
        return (-self.scores[m], -len(a), -len(b), m, self.vocab[a], self.vocab[b])

    def _spm_ids(self, piece: str, first: bool) -> list[int]:
        text = piece.replace(" ", "\u2581")
        if first and self.add_prefix and not text.startswith("\u2581"): text = "\u2581" + text
        symbols: list[str] = []
        for c in text:   # characters not in the vocab fall back to their UTF-8 bytes
            if c in self.vocab: symbols.append(c)
            else: symbols.extend(f"\0{b}" for b in c.encode("utf-8"))
        ids: list[int] = []
        for p in merge_pieces(symbols, self._spm_rank):
            if p.startswith("\0"):
                i = self.byte_ids.get(int(p[1:]), self.unk_id)
            else: i = self.vocab[p]
            if i is None: raise ValueError(f"{p!r} is not in the vocab, which has no byte tokens or unknown token")
            if i == self.unk_id and ids and ids[-1] == self.unk_id: continue       # consecutive unknowns fuse
            ids.append(i)
        return ids

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of `text`; with add_special, BOS first / EOS last when the file's flags say so."""
        ids: list[int] = []
        for k, part in enumerate(self._split_added(text)):
            if isinstance(part, int): ids.append(part)
            elif self.model == "llama": ids.extend(self._spm_ids(part, k == 0))
            else:
                pieces = gpt2_pre_tokenize(part) if self.pattern is None else split_pieces(part, self.pattern)
                for p in pieces: ids.extend(self._bpe_ids(p))
        if add_special and self.add_bos and self.bos_id is not None: ids.insert(0, self.bos_id)
        if add_special and self.add_eos and self.eos_id is not None: ids.append(self.eos_id)
        return ids

    # ----- decoding

    def token_bytes(self, i: int) -> bytes:
        """The bytes token `i` stands for (its text for added and special tokens)."""
        if not 0 <= i < len(self.tokens): raise ValueError(f"token id {i} is not in the vocab ({len(self.tokens)} ids)")
        t = self.tokens[i]
        if t in self.added and self.added[t] == i: return t.encode("utf-8")
        if self.model == "llama":
            m = _BYTE_TOKEN.fullmatch(t)
            return bytes([int(m.group(1), 16)]) if m else t.replace("\u2581", " ").encode("utf-8")
        if all(c in self.unbyte for c in t): return bytes(self.unbyte[c] for c in t)
        return t.encode("utf-8")

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """The text of `ids` (invalid UTF-8 becomes U+FFFD; a SentencePiece text loses the space put before it)."""
        ids = [int(i) for i in ids]
        data = b"".join(self.token_bytes(i) for i in ids if not (skip_special and i in self.special_ids))
        text = data.decode("utf-8", errors="replace")
        if self.add_prefix and text.startswith(" "): text = text[1:]
        return text

    def stream_decoder(self) -> StreamDecoder:
        """An incremental decoder for generated tokens (see StreamDecoder)."""
        return StreamDecoder(self)

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for chat `messages` ([{"role": ..., "content": ...}]), rendered with the file's
        tokenizer.chat_template (Jinja2, an optional dependency)."""
        if not self.chat_template: raise ValueError("the file has no tokenizer.chat_template")
        try:
            import jinja2
            import jinja2.sandbox
        except ImportError:
            raise ImportError("chat templates need jinja2: pip install jinja2") from None

        def raise_exception(msg: str) -> None: raise jinja2.exceptions.TemplateError(msg)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        tpl = env.from_string(self.chat_template)
        tok = lambda i: self.tokens[i] if i is not None else ""   # noqa: E731
        return tpl.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                          bos_token=tok(self.bos_id), eos_token=tok(self.eos_id))

    def is_end(self, i: int) -> bool:
        """Whether token `i` ends a generation (EOS, end-of-turn)."""
        return i in (self.eos_id, self.eot_id)

    def __len__(self) -> int: return len(self.tokens)


class StreamDecoder:
    """Text of generated tokens as they come: `add(id) -> str` returns what can be printed now; a character whose
    UTF-8 bytes are split across tokens waits until its last byte arrives. `flush()` returns what is left."""

    def __init__(self, tok: GGUFTokenizer):
        self.tok = tok
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, i: int) -> str: return self._dec.decode(self.tok.token_bytes(int(i)))
    def flush(self) -> str: return self._dec.decode(b"", final=True)


__all__ = ["GGUFTokenizer", "PRE_TOKENIZER_PATTERNS", "StreamDecoder", "merge_pieces", "split_pieces"]
