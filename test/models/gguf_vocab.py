"""GGUF files with tokenizer metadata for the GGUF tokenizer tests: vocabularies trained here with the `tokenizers`
package on a varied text corpus (SentencePiece-style BPE with byte fallback for llama.cpp's 'llama' model, byte-level
BPE with merges for its 'gpt2' model), written with the `gguf` package, and the texts to tokenize."""
from __future__ import annotations

import pathlib
import random

from .sentences import sentences

CODE = ["def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { a[i] += b[i] * 3.5f; }\n",
        "    if x == 10:\n\t\tprint('ten')\n", "SELECT id, name FROM users WHERE age >= 21 ORDER BY 2 DESC;",
        "fn main() {\n    let v: Vec<u8> = vec![1, 2, 3];\n}\n", "x = [i**2 for i in range(100) if i % 3 == 0]",
        "<div class=\"a\">&nbsp;</div>", "#include <stdio.h>\nint main(void){return 0;}", "0x1F 0b1010 1e-9 3.14159",
        "a\t\tb\n\n\nc    d     e", "12345678901234567890", "2024-12-06T13:52:14Z", "€100.00 / £5 / ¥1000"]
EMOJI = ["😀", "🚀", "👍🏽", "🇫🇷", "👨‍👩‍👧", "🤖", "❤️", "✅", "🎉🎉🎉", "🧠"]


def texts(n: int = 1000, specials: tuple[str, ...] = (), seed: int = 1) -> list[str]:
    """`n` texts: the shared sentence generator's, code, emoji runs, digit runs, whitespace runs, and (when given)
    special tokens written inside the text."""
    rng = random.Random(seed)
    out = list(CODE) + ["", " ", "  ", "\n", " \n\n ", "\t", "1", " 1", "  12", "999999", "a  b", "hello world"]
    base = sentences(n, seed)
    while len(out) < n:
        s = rng.choice(base)
        kind = rng.random()
        if kind < 0.15: s = s + rng.choice(EMOJI) * rng.randint(1, 3)
        elif kind < 0.25: s = f"{s} {rng.randint(0, 10 ** rng.randint(1, 12))}"
        elif kind < 0.35: s = s.replace(" ", " " * rng.randint(2, 6))
        elif kind < 0.45: s = rng.choice(CODE) + s
        elif kind < 0.6 and specials: s = rng.choice(specials) + s + rng.choice(specials) + rng.choice([" x", "", "\n"])
        out.append(s)
    return out


def corpus() -> list[str]:
    docs = pathlib.Path(__file__).resolve().parents[2] / "docs"
    text = [p.read_text(encoding="utf-8") for p in sorted(docs.glob("*.md"))[:12]]
    return text + texts(2000, seed=7) + CODE * 20 + EMOJI * 5


def spm_gguf(path: pathlib.Path, add_bos: bool | None = True, add_eos: bool = False) -> pathlib.Path:
    """A GGUF file holding only add_spm_tokenizer's tokenizer."""
    return write_only(path, lambda w: add_spm_tokenizer(w, add_bos=add_bos, add_eos=add_eos))


def write_only(path: pathlib.Path, add) -> pathlib.Path:
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    add(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_spm_tokenizer(w, vocab_size: int = 1500, add_bos: bool | None = True, add_eos: bool = False,
                      user_defined: tuple[str, ...] = ("<think>",)) -> int:
    """Put a 'llama' (SentencePiece) tokenizer like LLaMA's in GGUFWriter `w`: <unk>, <s>, </s>, the 256 <0xNN> byte
    tokens, then pieces with descending scores (spaces as U+2581), a control token <|eot|>, and `user_defined`
    tokens. Returns the number of tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    # limit_alphabet leaves the rarer characters (emoji, most CJK) out of the vocab: they fall back to byte tokens
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, max_token_length=12, limit_alphabet=120,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus(), trainer)
    learned = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]) if t not in ("<unk>", "<s>", "</s>")]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for i, t in enumerate(learned):
        tokens.append(t)
        types.append(1)
        scores.append(-float(i))
    for t, ty in [("<|eot|>", 3), *((u, 4) for u in user_defined)]:
        tokens.append(t)
        types.append(ty)
        scores.append(0.0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_bos is not None: w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    return len(tokens)


def bpe_gguf(path: pathlib.Path, pre: str) -> pathlib.Path:
    """A GGUF file holding only add_bpe_tokenizer's tokenizer."""
    return write_only(path, lambda w: add_bpe_tokenizer(w, pre))


def add_bpe_tokenizer(w, pre: str, vocab_size: int = 1500) -> int:
    """Put a 'gpt2' (byte-level BPE) tokenizer with merges in GGUFWriter `w`, split by the pattern `pre` names, with
    control tokens <|endoftext|> (BOS and EOS), <|im_start|>, <|im_end|> and a user-defined <tool>, and a chat
    template. Returns the number of tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, max_token_length=12,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    import json
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])] + ["<tool>"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>") else 1 for t in tokens[:-1]] + [4]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return len(tokens)
