"""Speed of the text models: fusegrad eager, fusegrad under TinyJit and PyTorch (transformers / sentence-transformers)
in the same run, on this machine's CPU (or DEV=...).

    python bench/text_models.py                 # MiniLM embeddings, GPT-2 small and a small LLaMA (random weights)
    python bench/text_models.py --only bert     # one of: bert gpt2 llama
    python bench/text_models.py --new 32 --runs 5

MiniLM uses the real all-MiniLM-L6-v2 weights (found as examples/embed.py finds them). GPT-2 small (124M) and the
LLaMA (8 layers, 512 wide, GQA 8/4 heads, 32k vocab) have random weights, saved with save_pretrained and loaded with
from_pretrained: speed doesn't depend on the values. Each number is the best of --runs runs after warm-up runs (which
compile the kernels and, for TinyJit, capture them); decode speed counts the decode steps after the first token.
"""
from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import numpy as np
import torch

from fusegrad import Tensor
from fusegrad.models.decoding import Generator

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
             "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums."]


THREADS = (2, 1)


@contextlib.contextmanager
def torch_threads(n: int):
    """torch with n intra-op threads (on a busy machine one thread can beat two that wait for each other)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try: yield
    finally: torch.set_num_threads(old)


def best_ms(fn, runs: int, warmup: int = 2) -> float:
    """The fastest of `runs` timed calls after `warmup` untimed ones, in ms (on a shared machine the fastest run is
    the one least disturbed by other processes)."""
    for _ in range(warmup): fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1000


def bench_bert(runs: int) -> list[tuple[str, str]]:
    from fusegrad.models.bert import SentenceEncoder, find_model_dir
    d = find_model_dir()
    enc = SentenceEncoder.from_pretrained(d)
    ids, mask = enc.tokenizer(SENTENCES)
    shape = tuple(ids.shape)
    eager = best_ms(lambda: enc.embed(ids, mask).realize(), runs)
    jit = best_ms(lambda: enc.encode(SENTENCES, jit=True), runs, warmup=3)
    import transformers
    ref = transformers.BertModel.from_pretrained(str(d)).eval()
    tids, tmask = torch.tensor(ids.numpy()).long(), torch.tensor(mask.numpy()).long()

    def torch_embed() -> None:
        with torch.no_grad():
            h = ref(input_ids=tids, attention_mask=tmask).last_hidden_state
            m = tmask.unsqueeze(-1).float()
            torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=1)
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(str(d), device="cpu")
    rows = [(f"MiniLM-L6 embeddings, batch {shape[0]}x{shape[1]} tokens, fusegrad eager", f"{eager:.1f} ms/batch"),
            ("  fusegrad TinyJit (encode(jit=True), incl. tokenizing)", f"{jit:.1f} ms/batch")]
    for threads in THREADS:
        with torch_threads(threads):
            tt = best_ms(torch_embed, runs)
            stt = best_ms(lambda: st.encode(SENTENCES, batch_size=len(SENTENCES)), runs)
        rows += [(f"  transformers BertModel + mean pool (torch, {threads} threads)", f"{tt:.1f} ms/batch"),
                 (f"  sentence-transformers encode (incl. tokenizing, {threads} threads)", f"{stt:.1f} ms/batch")]
    return rows


def bench_decoder(name: str, ref, ours, new: int, runs: int) -> list[tuple[str, str]]:
    prompt = list(range(10, 26))                                             # 16 tokens
    rows = []
    for jit in (False, True):
        gen = Generator(ours, jit=jit)
        gen.generate(prompt, 4)                                              # compile (and capture) first
        # eager steps take about a second each (Python scheduling): fewer and shorter runs
        rates = [gen.generate(prompt, new if jit else min(new, 12)).tokens_per_s for _ in range(runs if jit else 2)]
        rows.append((f"  fusegrad {'TinyJit' if jit else 'eager'}", f"{max(rates):.1f} tokens/s"))
    for threads in THREADS:
        torch_rates = []
        with torch.no_grad(), torch_threads(threads):
            x = torch.tensor([prompt])
            ref.generate(x, max_new_tokens=4, do_sample=False, pad_token_id=0)
            for _ in range(runs):
                t = time.perf_counter()
                ref.generate(x, max_new_tokens=1, do_sample=False, pad_token_id=0)
                one = time.perf_counter() - t
                t = time.perf_counter()
                ref.generate(x, max_new_tokens=new, do_sample=False, pad_token_id=0, min_new_tokens=new)
                torch_rates.append((new - 1) / (time.perf_counter() - t - one))     # decode steps only, as ours
        rows.append((f"  transformers generate (torch, KV cache, {threads} threads)",
                     f"{max(torch_rates):.1f} tokens/s"))
        rows.append((f"  torch forward loop (past_key_values, argmax; {threads} threads)",
                     f"{torch_loop(ref, prompt, new, runs, threads):.1f} tokens/s"))
    return [(f"{name}: 16-token prompt, {new} new tokens, decode speed", ""), *rows]


def torch_loop(ref, prompt: list[int], new: int, runs: int, threads: int) -> float:
    """Greedy decoding by calling the torch model step by step with its KV cache (no generate() bookkeeping).
    transformers 5 calls the cache `cache`, 4 `past_key_values`."""
    rates = []
    with torch.no_grad(), torch_threads(threads):
        for _ in range(runs + 1):
            out = ref(torch.tensor([prompt]), use_cache=True)
            tok, past = out.logits[:, -1:].argmax(-1), out.get("cache", out.get("past_key_values"))
            t = time.perf_counter()
            for _ in range(new - 1):
                out = ref(tok, use_cache=True, **{"cache" if "cache" in out else "past_key_values": past})
                tok, past = out.logits[:, -1:].argmax(-1), out.get("cache", out.get("past_key_values"))
            rates.append((new - 1) / (time.perf_counter() - t))
    return max(rates[1:])


def params(model) -> str:
    return f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params"


def bench_gpt2(new: int, runs: int) -> list[tuple[str, str]]:
    import transformers

    from fusegrad.models.gpt2 import GPT2
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        ours = GPT2.from_pretrained(d, max_context=128)
    return bench_decoder(f"GPT-2 small ({params(ref)}, random weights)", ref, ours, new, runs)


def bench_llama(new: int, runs: int) -> list[tuple[str, str]]:
    import transformers

    from fusegrad.models.llama import Llama
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        ref.save_pretrained(d)
        ours = Llama.from_pretrained(d, max_context=128)
    return bench_decoder(f"LLaMA (8 layers, 512 wide, GQA 8/4, {params(ref)}, random weights)", ref, ours, new, runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["bert", "gpt2", "llama"], action="append")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--new", type=int, default=32, help="new tokens per generation (default 32)")
    args = ap.parse_args()
    print(f"torch threads {torch.get_num_threads()}, numpy {np.__version__}, device {Tensor([1]).device}")
    for which in args.only or ["bert", "gpt2", "llama"]:
        start = time.perf_counter()
        rows = bench_bert(args.runs) if which == "bert" else bench_gpt2(args.new, args.runs) if which == "gpt2" \
            else bench_llama(args.new, args.runs)
        for k, v in rows: print(f"{k:<64} {v}")
        print(f"  ({time.perf_counter() - start:.0f} s in all, with loading and compiling)")


if __name__ == "__main__":
    main()
