"""A GGUF file's tensors under a model's own (Hugging Face) names, for `load_weights`: the weights a model keeps
quantized are served as the planes of their blocks (models/quantized.py), everything else dequantized to float32.
`Llama`, `Gemma3` and `GPT2`'s `from_gguf` build on it; a subclass adds what its architecture's file does differently
(`reorder_rows` for rows llama.cpp stored in another order, `value` for a float tensor it stored transformed).

Consumes gguf_load's lazy state dict (its `ggml_types`, `raw_bytes` and `release_bytes`); produces the modules to
build the model with (`quantized_linear`, `quantized_embedding`) and the Mapping that loads them."""
from __future__ import annotations

from typing import Any

import numpy as np

from fusegrad.models.quantized import (
    QUANTIZED_TYPES,
    QuantizedEmbedding,
    QuantizedLinear,
    block_planes,
    plane_names,
    plane_shape,
    scale_dtype,
)
from fusegrad.models.weights import Renamed
from fusegrad.tensor import Tensor


class BiasedQuantizedLinear(QuantizedLinear):
    """A QuantizedLinear plus a float32 bias (Qwen2's q/k/v projections, GPT-2's projections)."""

    def __init__(self, in_features: int, out_features: int, ggml_type: int):
        super().__init__(in_features, out_features, ggml_type)
        self.bias = Tensor.zeros(out_features).contiguous()

    def __call__(self, x: Tensor) -> Tensor: return super().__call__(x) + self.bias


class GGUFWeights(Renamed):
    """gguf_load's tensors seen under other names (`names`: model name -> GGUF name). With `quantized`, the model asks
    for its layers with `quantized_linear`/`quantized_embedding`: a weight stored in a type QUANTIZED_TYPES lists gets
    a quantized module, and its name `<prefix>weight` is served as that module's planes `<prefix>d`, `<prefix>qs`, ...
    (each tensor's blocks split once, its file pages handed back right after, the copies dropped once every plane is
    handed out); any other weight gets None, so the model builds its float module."""

    def __init__(self, tensors: Any, names: dict[str, str], quantized: bool = True):
        super().__init__(tensors, names)
        self.types: dict[str, int] = getattr(tensors, "ggml_types", {}) if quantized else {}
        self.planes: dict[str, tuple[str, int, str]] = {}   # "...q_proj.qs" -> (GGUF name, ggml type, plane)
        self._cache: dict[str, dict[str, np.ndarray]] = {}
        self._served: dict[str, set[str]] = {}

    def _quantized_type(self, weight: str) -> int | None:
        gtype = self.types.get(self.names.get(weight, ""))
        return gtype if gtype in QUANTIZED_TYPES else None

    def keep_quantized(self, weight: str, gtype: int, gg: str | None = None) -> None:
        """Serve `weight` (e.g. model.layers.0.self_attn.q_proj.weight) as QuantizedLinear's block planes, read from
        GGUF tensor `gg` (by default the one the name maps to)."""
        gg = self.names.pop(weight, None) or gg
        assert gg is not None, weight
        prefix = weight[:-len("weight")]
        for plane in plane_names(gtype):
            self.names[prefix + plane] = gg
            self.planes[prefix + plane] = (gg, gtype, plane)

    def quantized_linear(self, weight: str, n_in: int, n_out: int, bias: bool = False) -> QuantizedLinear | None:
        """A (Biased)QuantizedLinear for `weight` when the file stores it quantized (and its planes are then what this
        mapping serves under its name); None otherwise."""
        if (gtype := self._quantized_type(weight)) is None: return None
        self.keep_quantized(weight, gtype)
        return (BiasedQuantizedLinear if bias else QuantizedLinear)(n_in, n_out, gtype)

    def quantized_embedding(self, weight: str, vocab: int, dim: int) -> QuantizedEmbedding | None:
        """A QuantizedEmbedding (whose `project` is a tied head) for the table `weight`, as `quantized_linear`."""
        if (gtype := self._quantized_type(weight)) is None: return None
        self.keep_quantized(weight, gtype)
        return QuantizedEmbedding(vocab, dim, gtype)

    def reorder_rows(self, k: str, x: Any) -> Any:
        """The rows (first axis) of `x`, tensor `k`'s value (a Tensor) or one of its planes (an ndarray), in the
        model's order; by default the file's."""
        return x

    def value(self, k: str) -> Tensor:
        """Tensor `k` (not kept quantized) as the model holds it: dequantized to float32, rows in the model's order."""
        return self.reorder_rows(k, self.sd[self.names[k]].float())

    def shape_of(self, k: str) -> tuple[int, ...]:
        if k in self.planes:   # (from the header: decoding every weight's planes for a shape check held them all)
            gg, gtype, plane = self.planes[k]
            return plane_shape(gtype, plane, *self.sd.shape_of(gg))   # type: ignore[attr-defined]
        return super().shape_of(k)

    def _planes(self, k: str) -> dict[str, np.ndarray]:
        gg, gtype, _ = self.planes[k]
        if gg not in self._cache:
            rows, cols = self.sd.shape_of(gg)   # type: ignore[attr-defined]
            planes = block_planes(self.sd.raw_bytes[gg](), gtype, rows, cols,   # type: ignore[attr-defined]  # copies
                                  scale_dtype())
            self.sd.release_bytes[gg]()   # type: ignore[attr-defined]  # the file's pages and the copies: not both
            planes = {n: self.reorder_rows(k, p) for n, p in planes.items()}
            self._cache[gg] = planes
        return self._cache[gg]

    def __getitem__(self, k: str) -> Tensor:
        if k not in self.planes: return self.value(k)
        gg, _, name = self.planes[k]
        planes = self._planes(k)
        out = Tensor(planes[name])
        served = self._served.setdefault(gg, set())
        served.add(name)
        if len(served) == len(planes): del self._cache[gg], self._served[gg]   # all handed out: drop the copies
        return out


__all__ = ["BiasedQuantizedLinear", "GGUFWeights"]
