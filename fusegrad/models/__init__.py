"""Pretrained models built from fusegrad.nn layers and Tensors, with loaders for the weight files of their common
PyTorch / Hugging Face ports (read by fusegrad's own loaders, which never execute code).

Vision: `EfficientNet` (B0-B7, Lite0-4) and `ResNet` (18/34/50/101/152); `imagenet_labels()` names their outputs.
Text: `BertModel` / `SentenceEncoder` (sentence embeddings, e.g. all-MiniLM-L6-v2), `GPT2`, `Llama` (also Qwen2),
`Gemma3`, with the `WordPieceTokenizer` and byte-level `BPETokenizer`, and `GGUFTokenizer` (a GGUF file's own
tokenizer); `Generator` decodes with a KV cache under TinyJit (`Sampling`: temperature, top-k, top-p, repetition
penalty); `QuantizedLinear` keeps GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K weights in their blocks.
Weights (finding, reading, strict loading) are in `fusegrad.models.weights`.
"""
from fusegrad.models.bert import BertModel, SentenceEncoder
from fusegrad.models.decoding import Generator, KVCache, Sampling
from fusegrad.models.efficientnet import EfficientNet
from fusegrad.models.gemma3 import Gemma3
from fusegrad.models.gguf_tokenizer import GGUFTokenizer
from fusegrad.models.gpt2 import GPT2
from fusegrad.models.imagenet import imagenet_labels, preprocess
from fusegrad.models.llama import Llama
from fusegrad.models.quantized import QuantizedLinear
from fusegrad.models.resnet import ResNet
from fusegrad.models.tokenizer import BPETokenizer, WordPieceTokenizer
from fusegrad.models.weights import WeightsMismatch, WeightsNotFound, find_weights, load_weights, read_checkpoint

__all__ = [
           "GPT2",
           "BPETokenizer",
           "BertModel",
           "EfficientNet",
           "Gemma3",
           "GGUFTokenizer",
           "Generator",
           "KVCache",
           "Llama",
           "QuantizedLinear",
           "ResNet",
           "Sampling",
           "SentenceEncoder",
           "WeightsMismatch",
           "WeightsNotFound",
           "WordPieceTokenizer",
           "find_weights",
           "imagenet_labels",
           "load_weights",
           "preprocess",
           "read_checkpoint",
]
