"""Linear layers whose weights stay in ggml's block-quantized form (Q4_0, Q4_1, Q8_0) in memory: the packed values and
the per-block scales are kept, and every call dequantizes them inside the matmul kernel. The reduction runs over the
block structure (blocks x values, a 4-bit block's low and high nibbles as two terms of one sum), so the unpacking is a
constant mask or shift and the whole product is one fused kernel that reads about a quarter of the float32 bytes.

Consumes the raw blocks of a GGUF tensor (nn/gguf.py's `GGUFFile.blocks`); produces a module `QuantizedLinear` with
the same call as nn.Linear (no bias)."""
from __future__ import annotations

import numpy as np

from fusegrad.dtype import dtypes
from fusegrad.tensor import Tensor

# ggml type id -> (name, values per block, bytes per block); only these stay quantized
QUANTIZED_TYPES: dict[int, tuple[str, int, int]] = {2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34)}


def block_planes(raw: np.ndarray, ggml_type: int, rows: int, cols: int) -> dict[str, np.ndarray]:
    """The blocks of a (rows, cols) weight, `raw` uint8 bytes in ggml's layout, split into planes: `d` (rows, nb)
    float32 scales, `m` (rows, nb) float32 minimums (Q4_1), `qs` (rows, nb, 16) uint8 nibble pairs (Q4_0, Q4_1) or
    (rows, nb, 32) int8 values (Q8_0). The float16 scales become float32 exactly."""
    if ggml_type not in QUANTIZED_TYPES: raise ValueError(f"ggml type {ggml_type} has no quantized kernel")
    name, block, nbytes = QUANTIZED_TYPES[ggml_type]
    if cols % block: raise ValueError(f"{cols} columns are not whole {name} blocks of {block}")
    nb = cols // block
    b = np.frombuffer(raw, dtype=np.uint8)
    if b.size != rows * nb * nbytes: raise ValueError(f"{b.size} bytes don't hold a ({rows}, {cols}) {name} weight")
    b = b.reshape(rows, nb, nbytes)
    f16 = lambda at: b[:, :, at:at + 2].copy().view(np.float16)[..., 0].astype(np.float32)   # noqa: E731
    if ggml_type == 8: return {"d": f16(0), "qs": b[:, :, 2:34].copy().view(np.int8)}
    if ggml_type == 2: return {"d": f16(0), "qs": b[:, :, 2:18].copy()}
    return {"d": f16(0), "m": f16(2), "qs": b[:, :, 4:20].copy()}


class QuantizedLinear:
    """y = x @ W.T with W (out_features, in_features) held as ggml blocks: `qs`, `d` (and `m` for Q4_1) tensors, loaded
    like any weights (get_state_dict sees them). W's value j of block b is d*(q-8) (Q4_0), d*q+m (Q4_1), d*q (Q8_0);
    a 4-bit block keeps its first 16 values in the low nibbles and the next 16 in the high ones.

    >>> lin = QuantizedLinear(64, 3, ggml_type=8)
    >>> lin(Tensor.ones(2, 64)).shape
    (2, 3)
    """

    def __init__(self, in_features: int, out_features: int, ggml_type: int):
        if ggml_type not in QUANTIZED_TYPES: raise ValueError(f"ggml type {ggml_type} has no quantized kernel")
        self.ggml_type, self.in_features, self.out_features = ggml_type, in_features, out_features
        name, block, _ = QUANTIZED_TYPES[ggml_type]
        if in_features % block: raise ValueError(f"{in_features} inputs are not whole {name} blocks of {block}")
        nb = in_features // block
        self.d = Tensor.zeros(out_features, nb).contiguous()
        if ggml_type == 3: self.m = Tensor.zeros(out_features, nb).contiguous()
        self.qs = Tensor.zeros(out_features, nb, 32 if ggml_type == 8 else 16,
                               dtype=dtypes.int8 if ggml_type == 8 else dtypes.uint8).contiguous()

    def _values(self) -> list[Tensor]:
        """The dequantized weight as (out, nb, values) pieces: Q8_0's 32 values, or a 4-bit block's low-nibble and
        high-nibble halves (kept apart, so no kernel has to pick a nibble per element)."""
        O, nb = self.d.shape
        d = self.d.reshape(O, nb, 1)
        if self.ggml_type == 8: return [d * self.qs.float()]
        halves = [(self.qs & 15).float(), (self.qs >> 4).float()]
        if self.ggml_type == 2: return [d * (q - 8) for q in halves]
        m = self.m.reshape(O, nb, 1)
        return [d * q + m for q in halves]

    def dequantize(self) -> Tensor:
        """W (out_features, in_features) in float32."""
        parts = self._values()
        O, nb, per = parts[0].shape
        return parts[0].unsqueeze(2).cat(*(p.unsqueeze(2) for p in parts[1:]), dim=2).reshape(O, nb * len(parts) * per)

    def __call__(self, x: Tensor) -> Tensor:
        parts = self._values()
        _, nb, per = parts[0].shape
        xs = x.reshape(*x.shape[:-1], 1, nb, len(parts), per)                  # (..., 1, nb, halves, values)
        prod = sum((xs[..., h, :] * w for h, w in enumerate(parts[1:], 1)), xs[..., 0, :] * parts[0])
        # contiguous: a kernel of its own, so a consumer that writes a bigger buffer (the KV cache update) doesn't
        # recompute the product for every element it writes
        return prod.sum((-2, -1)).contiguous()


__all__ = ["QUANTIZED_TYPES", "QuantizedLinear", "block_planes"]
