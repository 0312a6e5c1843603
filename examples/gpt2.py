#!/usr/bin/env python3
"""Generate text with GPT-2 (greedy, or sampled with --temperature) and print the speed.

    python examples/gpt2.py --weights DIR --prompt "The meaning of life is" --max-new 40

DIR is a folder written by transformers' save_pretrained (config.json, model.safetensors or pytorch_model.bin) that
also holds the tokenizer's vocab.json and merges.txt. fusegrad can't download GPT-2 here; without --weights the
folder is looked up in fusegrad's download cache (models/openai-community--gpt2).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from fusegrad.models.decoding import Generator
from fusegrad.models.gpt2 import GPT2, find_gpt2_dir
from fusegrad.models.tokenizer import BPETokenizer
from fusegrad.models.weights import WeightsNotFound


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", default=None, help="model folder (config, weights, vocab.json, merges.txt)")
    ap.add_argument("--prompt", required=True, help="text to continue")
    ap.add_argument("--max-new", type=int, default=32, help="tokens to generate (default 32)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sample")
    ap.add_argument("--no-jit", action="store_true", help="run the decode steps eagerly instead of under TinyJit")
    args = ap.parse_args(argv)
    try:
        d = find_gpt2_dir(args.weights)
        tok = BPETokenizer.from_dir(d)
        model = GPT2.from_pretrained(d)
    except (WeightsNotFound, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prompt = tok.encode(args.prompt)
    try:
        gen = Generator(model, jit=not args.no_jit).generate(prompt, args.max_new, args.temperature,
                                                             stop=lambda t: t == tok.eos_id)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(args.prompt + tok.decode(gen.tokens))
    mode = "eager" if args.no_jit else "TinyJit"
    steady = "" if args.no_jit else \
        f" ({gen.steady_tokens_per_s:.1f} tokens/s after the first two steps, which compile and capture)"
    print(f"--- {len(prompt)} prompt tokens, {len(gen.tokens)} new ({mode}): prefill + first token "
          f"{gen.prefill_s * 1000:.0f} ms, then {gen.tokens_per_s:.1f} tokens/s{steady}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
