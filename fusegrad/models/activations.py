"""The activation functions Hugging Face configs name (`hidden_act`, `activation_function`), shared by the text
models. HF's "gelu" is the exact (erf) GELU; `Tensor.gelu()` defaults to tinygrad's tanh form, so it is spelled out."""
from __future__ import annotations

from typing import Callable

from fusegrad.tensor import Tensor

HF_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": lambda x: x.gelu(approximate="none"),
    "gelu_new": lambda x: x.gelu(approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: x.gelu(approximate="tanh"),
    "relu": lambda x: x.relu(),
}
