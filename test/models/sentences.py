"""Varied test sentences for the tokenizer tests: words, punctuation, accents, numbers, CJK, emoji, Greek, Cyrillic,
control characters and whitespace runs, from a seeded generator (the same on every run)."""
from __future__ import annotations

import random

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokenization", "unbelievably", "don't",
         "it's", "we'll", "they're", "I've", "she'd", "I'm", "naïve", "café", "Ångström", "résumé", "Straße", "façade",
         "ÉCOLE", "ΟΔΟΣ", "Σίσυφος", "Москва", "привет", "東京", "北京大学", "日本語", "한국어", "สวัสดี", "مرحبا",
         "עברית", "😀", "🚀🚀", "👍🏽", "e-mail", "U.S.A.", "C++", "x86_64", "3.14159", "1,000,000", "42", "007",
         "½", "²", "Ⅻ", "٣", "#hashtag", "@user", "http://example.com/a?b=c&d=e", "$100", "50%", "a+b=c", "<tag>",
         "(paren)", "[bracket]", "{brace}", "quote\"s", "'single'", "back\\slash", "tab\tbed", "non\u00a0break",
         "zero\u200bwidth", "soft\u00adhyphen", "ﬁne", "Ⓐ", "İstanbul", "ǅemal", "ß", "Ω", "µ", "…", "—", "–", "«»",
         "¿qué?", "¡hola!", "supercalifragilisticexpialidocious", "A" * 120, "ARRAY[i]", "snake_case", "CamelCase"]
SEPARATORS = [" ", " ", " ", "  ", "\n", "\t", " \n ", "   ", "\r\n", "\u3000", "\u2003", ", ", ". ", "! ", "? ", "; ",
              "... ", " - ", "\x0b", "\x85", "\x1f", "\u2028"]


def sentences(n: int = 300, seed: int = 0) -> list[str]:
    """`n` sentences of 1-14 random words joined by random separators, some with leading/trailing whitespace."""
    rng = random.Random(seed)
    out = ["", " ", "Hello, world!", "  leading and trailing  ", "a\x00b\ufffdc", "multiple     spaces"]
    while len(out) < n:
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 14))]
        s = words[0]
        for w in words[1:]: s += rng.choice(SEPARATORS) + w
        if rng.random() < 0.2: s = rng.choice(SEPARATORS) + s
        if rng.random() < 0.2: s += rng.choice(SEPARATORS)
        if rng.random() < 0.3: s = s.capitalize()
        out.append(s)
    return out
