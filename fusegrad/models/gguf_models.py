"""The decoder a llama.cpp GGUF file holds, by its `general.architecture`: 'llama' and 'qwen2' (`Llama`), 'gemma3'
(`Gemma3`), 'gpt2' (`GPT2`). `load_gguf(path)` reads the file once and builds the model; examples/llama.py runs it."""
from __future__ import annotations

import pathlib
from typing import Any

from fusegrad.models.gemma3 import Gemma3
from fusegrad.models.gpt2 import GPT2
from fusegrad.models.llama import Llama
from fusegrad.models.weights import WeightsMismatch
from fusegrad.nn.state import gguf_load

# architecture -> the class whose from_gguf reads it
GGUF_ARCHITECTURES: dict[str, Any] = {"llama": Llama, "qwen2": Llama, "gemma3": Gemma3, "gpt2": GPT2}


def load_gguf(path: str | pathlib.Path, max_context: int | None = None, quantized: bool = True) -> Any:
    """The model in a GGUF file, of the class its architecture names. `quantized` keeps the projections and the
    embedding table in their blocks where the file stores them in a type models/quantized.py has kernels for (every
    architecture's `from_gguf`). Another architecture raises WeightsMismatch naming it and the ones supported.

    >>> sorted(GGUF_ARCHITECTURES)
    ['gemma3', 'gpt2', 'llama', 'qwen2']
    """
    arch = gguf_load(path)[0].get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise WeightsMismatch(f"{path}: general.architecture is {arch!r}; fusegrad runs "
                              f"{', '.join(sorted(GGUF_ARCHITECTURES))}")
    return GGUF_ARCHITECTURES[arch].from_gguf(path, max_context, quantized=quantized)


__all__ = ["GGUF_ARCHITECTURES", "load_gguf"]
