"""bench/llm.py's worker: one library's measurement of a GGUF LLM in this process, printed as one JSON line.

    python bench/_llm_worker.py LIB MODEL.gguf --ids 1,2,3 --new 32 --threads 2

LIB is fusegrad-q, fusegrad-f32, transformers or llama.cpp. Every library runs the same steps: import, load the file
(timed: the model object's construction, everything it reads or maps included), then two greedy generations of
`--new` tokens from the same prompt ids, each timed per token (times[0]: the prompt's forward pass and the argmax of
its last logits, which gives the first new token; times[i]: one decode step, a forward pass of one token and its
argmax). The first generation is the cold one (fusegrad compiles its kernels there); bench/llm.py takes the prefill
and decode speeds from the second. Memory is read from /proc/self/status: resident set after the imports, after the
load and after both generations, and the peak (VmHWM).

Only the standard library is imported at the top: llama.cpp's worker runs in llama-cpp-python's own venv, which has
neither fusegrad nor torch (it has NumPy, a dependency of llama-cpp-python).
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

LIBS = ("fusegrad-q", "fusegrad-f32", "transformers", "llama.cpp")
# each library's (load() -> model, generate(model) -> (tokens, per-token times))
Runner = tuple[Callable[[], Any], Callable[[Any], tuple[list[int], list[float]]]]


def memory_mb() -> dict[str, float]:
    """Resident set size now and its peak so far (VmRSS, VmHWM), in MB (2**20 bytes)."""
    got: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"): got[key] = int(rest.split()[0]) / 1024   # kB
    return {"rss_mb": got["VmRSS"], "peak_rss_mb": got["VmHWM"]}


def timed_greedy(prefill: Callable[[list[int]], int], step: Callable[[int], int], ids: list[int],
                 n_new: int) -> tuple[list[int], list[float]]:
    """n_new tokens: prefill(ids) gives the first, step(previous token) each next one. Returns the tokens and the time
    of each call (the shape of fusegrad's Generation.times)."""
    tokens: list[int] = []
    times: list[float] = []
    t0 = time.perf_counter()
    tok = prefill(ids)
    times.append(time.perf_counter() - t0)
    tokens.append(tok)
    while len(tokens) < n_new:
        t0 = time.perf_counter()
        tok = step(tok)
        times.append(time.perf_counter() - t0)
        tokens.append(tok)
    return tokens, times


def run_fusegrad(path: str, ids: list[int], n_new: int, quantized: bool) -> Runner:
    """fusegrad's Llama and Generator (its threads: CPU_THREADS, which bench/llm.py sets)."""
    from fusegrad.models.decoding import Generator
    from fusegrad.models.llama import Llama

    def load() -> Any:
        return Generator(Llama.from_gguf(path, max_context=len(ids) + n_new + 2, quantized=quantized))

    def generate(gen) -> tuple[list[int], list[float]]:
        g = gen.generate(ids, n_new)          # greedy; the same per-token times as timed_greedy's
        return g.tokens, g.times
    return load, generate


def run_transformers(path: str, ids: list[int], n_new: int, threads: int) -> Runner:
    import torch
    import transformers
    torch.set_num_threads(threads)
    p = pathlib.Path(path)

    def load() -> Any:
        return transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name).eval()

    def generate(model) -> tuple[list[int], list[float]]:
        state: dict[str, object] = {}

        def forward(x: list[list[int]]) -> int:
            out = model(torch.tensor(x), past_key_values=state.get("past"), use_cache=True)
            state["past"] = out.past_key_values
            return int(out.logits[0, -1].argmax())
        with torch.no_grad():
            return timed_greedy(lambda p: forward([p]), lambda t: forward([[t]]), ids, n_new)
    return load, generate


def run_llamacpp(path: str, ids: list[int], n_new: int, threads: int, text: str,
                 info: dict[str, object]) -> Runner:
    import llama_cpp
    import numpy as np
    info["version"] = llama_cpp.__version__
    info["system_info"] = llama_cpp.llama_print_system_info().decode(errors="replace").strip()

    def load() -> Any:
        llm = llama_cpp.Llama(model_path=path, n_ctx=len(ids) + n_new + 2, n_batch=max(512, len(ids)),
                              n_threads=threads, n_threads_batch=threads, use_mmap=True, verbose=False)
        # llama.cpp's own tokenizer of the same file, to compare with the ids every library is given
        info["own_ids"] = llm.tokenize(text.encode(), add_bos=True, special=False) if text else None
        return llm

    def generate(llm) -> tuple[list[int], list[float]]:
        n_vocab = llm.n_vocab()

        def argmax_last() -> int:   # the logits of the batch's last token (the only one it asks logits for)
            return int(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,)).argmax())

        def prefill(p: list[int]) -> int:
            llm.reset()                       # n_tokens = 0: eval drops the KV cache from position 0 on
            llm.eval(p)
            return argmax_last()

        def step(t: int) -> int:
            llm.eval([t])
            return argmax_last()
        return timed_greedy(prefill, step, ids, n_new)
    return load, generate


def measure(lib: str, path: str, ids: list[int], n_new: int, threads: int, text: str = "") -> dict[str, object]:
    """Import, load and generate twice (module docstring); the JSON-able result."""
    info: dict[str, object] = {"lib": lib, "pid": os.getpid()}
    t0 = time.perf_counter()
    if lib in ("fusegrad-q", "fusegrad-f32"): load, generate = run_fusegrad(path, ids, n_new, lib == "fusegrad-q")
    elif lib == "transformers": load, generate = run_transformers(path, ids, n_new, threads)
    elif lib == "llama.cpp": load, generate = run_llamacpp(path, ids, n_new, threads, text, info)
    else: raise ValueError(f"unknown library {lib!r}; choose from {LIBS}")
    info["import_s"] = time.perf_counter() - t0
    info["rss_import_mb"] = memory_mb()["rss_mb"]
    t0 = time.perf_counter()
    model = load()
    info["load_s"] = time.perf_counter() - t0
    info["rss_load_mb"] = memory_mb()["rss_mb"]
    info["cold_tokens"], info["cold_times"] = generate(model)
    info["tokens"], info["times"] = generate(model)
    mem = memory_mb()
    info["rss_end_mb"], info["peak_rss_mb"] = mem["rss_mb"], mem["peak_rss_mb"]
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib", choices=LIBS)
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="the prompt's token ids, comma-separated")
    ap.add_argument("--text", default="", help="the prompt's text (llama.cpp tokenizes it too, for comparison)")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    faulthandler.enable()     # a crash in a library's native code (a signal) leaves a Python traceback on stderr
    ids = [int(x) for x in args.ids.split(",") if x]
    if not ids: ap.error("--ids is empty")
    if args.new < 4: ap.error("--new must be at least 4 (decode speed counts the steps after the first two)")
    print(json.dumps(measure(args.lib, args.model, ids, args.new, args.threads, args.text)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # this checkout's fusegrad (not llama.cpp's)
    sys.exit(main())
