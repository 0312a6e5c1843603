"""Linear layers whose weights stay in ggml's block-quantized form (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K types
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) in memory: the packed values and the per-block scales are kept, and every call
dequantizes them inside the matmul kernel. The reduction runs over the block structure (blocks x values, the pieces
of a block that unpack with different constant masks and shifts, a 4-bit block's low and high nibbles say, as separate
terms of one sum), so every unpacking is a constant mask or shift and the whole product is one fused kernel that reads
about a quarter of the float32 bytes.

Consumes the raw blocks of a GGUF tensor (nn/gguf.py's `GGUFFile.blocks`); produces the modules `QuantizedLinear`,
with the same call as nn.Linear (no bias), and `QuantizedEmbedding`, a lookup table that dequantizes only the rows it
gathers."""
from __future__ import annotations

import numpy as np

from fusegrad.device import Device, is_dtype_supported
from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import Q8_ACTIVATIONS
from fusegrad.mixin.reduce import merges_permuted
from fusegrad.tensor import Tensor

# ggml type id -> (name, values per block, bytes per block); only these stay quantized
QUANTIZED_TYPES: dict[int, tuple[str, int, int]] = {2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
                                                     7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
                                                     10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
                                                     12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
                                                     14: ("Q6_K", 256, 210)}

# ggml type id -> its planes: name -> (shape per block, dtype). A plane of shape () is (rows, blocks); the others are
# (rows, blocks, *shape). The scales stay the file's float16 (a Q4_1 block is its 20 bytes, not 24 with float32
# scales: 17% less memory and less to read per token); the kernels convert them to float32, exactly, as they load them.
PLANES: dict[int, dict[str, tuple[tuple[int, ...], DType]]] = {
    2: {"d": ((), dtypes.float16), "qs": ((16,), dtypes.uint8)},
    3: {"d": ((), dtypes.float16), "m": ((), dtypes.float16), "qs": ((16,), dtypes.uint8)},
    6: {"d": ((), dtypes.float16), "qh": ((), dtypes.uint32), "qs": ((16,), dtypes.uint8)},
    7: {"d": ((), dtypes.float16), "m": ((), dtypes.float16), "qh": ((), dtypes.uint32), "qs": ((16,), dtypes.uint8)},
    8: {"d": ((), dtypes.float16), "qs": ((32,), dtypes.int8)},
    10: {"d": ((), dtypes.float16), "dmin": ((), dtypes.float16), "sc": ((16,), dtypes.uint8),
         "qs": ((2, 32), dtypes.uint8)},
    11: {"d": ((), dtypes.float16), "sc": ((16,), dtypes.int8), "qh": ((32,), dtypes.uint8),
         "qs": ((2, 32), dtypes.uint8)},
    12: {"d": ((), dtypes.float16), "dmin": ((), dtypes.float16), "sc": ((8,), dtypes.uint8),
         "mn": ((8,), dtypes.uint8), "qs": ((4, 32), dtypes.uint8)},
    13: {"d": ((), dtypes.float16), "dmin": ((), dtypes.float16), "sc": ((8,), dtypes.uint8),
         "mn": ((8,), dtypes.uint8), "qh": ((32,), dtypes.uint8), "qs": ((4, 32), dtypes.uint8)},
    14: {"d": ((), dtypes.float16), "sc": ((16,), dtypes.int8), "ql": ((2, 2, 32), dtypes.uint8),
         "qh": ((2, 32), dtypes.uint8)}}

# ggml type id -> (pre, terms, post): a block's values in ggml's order, seen as (*pre, terms, *post); the kernel sums
# `terms` products of shape (*pre, *post), each unpacked with its own constant shifts and masks
LAYOUT: dict[int, tuple[tuple[int, ...], int, tuple[int, ...]]] = {
    2: ((), 2, (16,)), 3: ((), 2, (16,)), 8: ((), 1, (32,)),
    6: ((), 2, (16,)), 7: ((), 2, (16,)),     # value 16h + l: nibble h of qs[l], bit 16h + l of the 32-bit qh
    10: ((), 8, (2, 16)),         # value 32k + l: bits 2(k % 4) of qs[k // 4, l], sub-block 2k + l // 16
    11: ((), 8, (2, 16)),         # as Q2_K, plus bit k of qh[l] (a set bit adds 4: q - 4 without it)
    12: ((4,), 2, (32,)),         # 4 groups of 32 bytes: low nibbles are sub-block 2g, high nibbles 2g+1
    13: ((), 8, (32,)),           # as Q4_K, plus bit j of qh[l] as value l's fifth bit in sub-block j
    14: ((2,), 4, (2, 16))}       # 2 halves of 128 x 4 quarters (the shift pairs of ql/qh) x 32 values (2 scales)


# ggml type id -> the weight's values as unsigned bytes u and the block's offset o: value = d * (u - o) (Q4_0: 8,
# Q5_0: 16, Q8_0: 128, its int8 value + 128) or d * u + m (Q4_1, Q5_1: o None); the types the 8-bit path takes
Q8_OFFSET: dict[int, int | None] = {2: 8, 3: None, 6: 16, 7: None, 8: 128}
# the 8-bit path is for decoding (a few rows): a prompt's rows were slower on it (SmolLM2 Q4_1 prefill 45-59 against
# 78-80 tok/s, docs/performance.md), its kernels not tuned for many rows
Q8_MAX_ROWS = 8


def quantize_q8(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x (..., n) -> its 8-bit form per block of 32 values, as llama.cpp's q8_1: q int8 (..., n/32, 32) =
    round(x / dx) (half to even), dx = max |x| / 127 over the block (q = 0 where the block is all zero), and
    sx = dx * sum(q) (..., n/32). x is computed once (a buffer), then two kernels: dx and sx (q recomputed inside the
    sum), and q. The rounding adds 1.5 * 2**23 (exact half-to-even rounding of |v| <= 2**22 in float32, here at most
    127) and reads the integer from the sum's low bits: whole-vector code, where round() and a float -> int8 cast
    were lane by lane."""
    if x.shape[-1] % 32: raise ValueError(f"{x.shape[-1]} features are not whole blocks of 32")
    xb = x.float().contiguous().reshape(*x.shape[:-1], x.shape[-1] // 32, 32)

    def q(d: Tensor) -> Tensor:   # int32
        return (xb * (d > 0).where(1 / d, 0).unsqueeze(-1) + _ROUND).bitcast(dtypes.int32) - _ROUND_BITS
    dx = xb.abs().max(-1) / 127
    stats = dx.stack(dx * q(dx).sum(-1).float(), dim=-1).contiguous()
    return q(stats[..., 0]).cast(dtypes.int8).contiguous(), stats[..., 0], stats[..., 1]


_ROUND, _ROUND_BITS = 12582912.0, 0x4B400000   # 1.5 * 2**23 and its float32 bits


def q8_enabled(device: str | tuple[str, ...], ggml_type: int = 2) -> bool:
    """Whether quantized matvecs of `ggml_type` on `device` take the 8-bit path: Q8_ACTIVATIONS=1/0, else (-1) where
    the device's renderer has 8-bit dot products for the type's unsigned bytes (codegen/dot4.py: x86 VNNI for all of
    them, AVX2 for the 4- and 5-bit types; Q8_0's bytes, up to 255, would saturate its pairs)."""
    if Q8_ACTIVATIONS.value >= 0: return bool(Q8_ACTIVATIONS.value)
    need = {2: 15, 3: 15, 6: 31, 7: 31, 8: 255}.get(ggml_type, 255)
    if not isinstance(device, str): return False   # a tensor on several devices (sharded) takes the float path
    ren = Device[device].renderer                  # (x lives there: the device is open)
    return bool(ren.dot4_lanes()) and ren.dot4_max_unsigned() >= need


def plane_names(ggml_type: int) -> tuple[str, ...]:
    """The names of the tensors a QuantizedLinear of this type holds (besides nothing else), in load order."""
    if ggml_type not in PLANES: raise ValueError(f"ggml type {ggml_type} has no quantized kernel")
    return tuple(PLANES[ggml_type])


def plane_shape(ggml_type: int, plane: str, rows: int, cols: int) -> tuple[int, ...]:
    """The shape of plane `plane` of a (rows, cols) weight (what block_planes gives it), without reading the blocks."""
    if ggml_type not in PLANES: raise ValueError(f"ggml type {ggml_type} has no quantized kernel")
    return (rows, cols // QUANTIZED_TYPES[ggml_type][1], *PLANES[ggml_type][plane][0])


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's/Q5_K's 12 bytes (..., 12) -> the 8 six-bit scales and 8 six-bit minimums (..., 8) uint8 each."""
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, mn


def _k3_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K's 12 bytes (..., 12) -> its 16 signed sub-block scales (..., 16) int8: the low 4 bits are the nibbles of
    bytes 0-7 (low nibbles for sub-blocks 0-7, high for 8-15), the top 2 bits sit in bytes 8-11 (sub-block i in byte
    8 + i % 4 at bit 2 * (i // 4)); the 6-bit value is stored plus 32."""
    low = np.concatenate([s[..., :8] & 15, s[..., :8] >> 4], axis=-1)
    high = (np.tile(s[..., 8:12], 4) >> np.repeat(np.arange(0, 8, 2, dtype=np.uint8), 4)) & 3
    return ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8)


def scale_dtype(device: str | None = None) -> DType:
    """The dtype the planes hold the float16 block scales in on `device` (default: the default device): float16 where
    the device computes with it, else float32 (exact too; PoCL's OpenCL has no cl_khr_fp16). `QuantizedLinear` makes
    its planes so, and `block_planes(..., scales=)` gives them so."""
    return dtypes.float16 if is_dtype_supported(dtypes.float16, device) else dtypes.float32


def block_planes(raw: np.ndarray | bytes, ggml_type: int, rows: int, cols: int,
                 scales: DType = dtypes.float16) -> dict[str, np.ndarray]:
    """The blocks of a (rows, cols) weight, `raw` uint8 bytes in ggml's layout, split into the planes PLANES lists:
    the float16 scales stay float16 (`d`, Q4_1's `m`, the K types' `dmin`; `scales=dtypes.float32`: converted,
    exactly, for a device without float16, see scale_dtype), Q4_K/Q5_K's packed 6-bit sub-block scales and minimums
    become bytes (`sc`, `mn`), and the packed values keep their bytes (`qs`, `ql`, `qh`)."""
    if ggml_type not in QUANTIZED_TYPES: raise ValueError(f"ggml type {ggml_type} has no quantized kernel")
    name, block, nbytes = QUANTIZED_TYPES[ggml_type]
    if cols % block: raise ValueError(f"{cols} columns are not whole {name} blocks of {block}")
    nb = cols // block
    b = np.frombuffer(raw, dtype=np.uint8)
    if b.size != rows * nb * nbytes: raise ValueError(f"{b.size} bytes don't hold a ({rows}, {cols}) {name} weight")
    b = b.reshape(rows, nb, nbytes)
    if scales not in (dtypes.float16, dtypes.float32):
        raise ValueError(f"scales={scales}: the block scales are kept as float16 or float32")
    sdt = np.float32 if scales == dtypes.float32 else np.float16
    f16 = lambda at: b[:, :, at:at + 2].copy().view(np.float16)[..., 0].astype(sdt, copy=False)
    if ggml_type == 8: return {"d": f16(0), "qs": b[:, :, 2:34].copy().view(np.int8)}
    if ggml_type == 2: return {"d": f16(0), "qs": b[:, :, 2:18].copy()}
    if ggml_type == 3: return {"d": f16(0), "m": f16(2), "qs": b[:, :, 4:20].copy()}
    if ggml_type in (6, 7):
        at = 2 if ggml_type == 6 else 4
        out = {"d": f16(0)} if ggml_type == 6 else {"d": f16(0), "m": f16(2)}
        return {**out, "qh": b[:, :, at:at + 4].copy().view("<u4")[..., 0].astype(np.uint32),
                "qs": b[:, :, at + 4:at + 20].copy()}
    if ggml_type == 10:
        return {"d": f16(80), "dmin": f16(82), "sc": b[:, :, 0:16].copy(),
                "qs": b[:, :, 16:80].reshape(rows, nb, 2, 32).copy()}
    if ggml_type == 11:
        return {"d": f16(108), "sc": _k3_scales(b[:, :, 96:108]), "qh": b[:, :, 0:32].copy(),
                "qs": b[:, :, 32:96].reshape(rows, nb, 2, 32).copy()}
    if ggml_type == 14:
        return {"d": f16(208), "sc": b[:, :, 192:208].copy().view(np.int8),
                "ql": b[:, :, 0:128].reshape(rows, nb, 2, 2, 32).copy(),
                "qh": b[:, :, 128:192].reshape(rows, nb, 2, 32).copy()}
    sc, mn = _k_scale_min(b[:, :, 4:16])
    out = {"d": f16(0), "dmin": f16(2), "sc": sc, "mn": mn}
    if ggml_type == 13: out["qh"] = b[:, :, 16:48].copy()
    out["qs"] = b[:, :, nbytes - 128:nbytes].reshape(rows, nb, 4, 32).copy()
    return out


class QuantizedLinear:
    """y = x @ W.T with W (out_features, in_features) held as ggml blocks, one tensor per plane (PLANES), loaded like
    any weights (get_state_dict sees them). W's value j of block b is d*(q-8) (Q4_0), d*q+m (Q4_1), d*(q-16) (Q5_0),
    d*q+m (Q5_1), d*q (Q8_0); a 4- or 5-bit block keeps its first 16 values in the low nibbles and the next 16 in the
    high ones, and a 5-bit block value j's fifth bit in bit j of qh. A K block holds 256
    values: (d*sc)*q - dmin*mn in sub-blocks of 32 (Q4_K, Q5_K: 4-bit q, and a fifth bit from qh), (d*sc)*(q-32) in
    sub-blocks of 16 (Q6_K: low 4 bits in ql, high 2 in qh), (d*sc)*q - dmin*mn in sub-blocks of 16 with 2-bit q and
    4-bit sc, mn (Q2_K: one byte holds both), (d*sc)*(q-4) in sub-blocks of 16 with 3-bit q (Q3_K: low 2 bits in qs,
    the third in qh) and 6-bit signed sc, the float operations in the order of the gguf package's
    NumPy dequantization, so the values are bit for bit the same.

    >>> lin = QuantizedLinear(64, 3, ggml_type=8)
    >>> lin(Tensor.ones(2, 64)).shape
    (2, 3)
    """

    def __init__(self, in_features: int, out_features: int, ggml_type: int, q8: bool = True):
        if ggml_type not in QUANTIZED_TYPES: raise ValueError(f"ggml type {ggml_type} has no quantized kernel")
        self.ggml_type, self.in_features, self.out_features = ggml_type, in_features, out_features
        self.q8 = q8   # may take the 8-bit activation path (`__call__`); an output head doesn't (Llama.from_gguf)
        name, block, _ = QUANTIZED_TYPES[ggml_type]
        if in_features % block: raise ValueError(f"{in_features} inputs are not whole {name} blocks of {block}")
        nb = in_features // block
        for plane, (shape, dt) in PLANES[ggml_type].items():
            if dt == dtypes.float16: dt = scale_dtype()   # (float32 on a device without float16)
            setattr(self, plane, Tensor.zeros(out_features, nb, *shape, dtype=dt).contiguous())

    def _planes(self, rows: Tensor | None = None) -> dict[str, Tensor]:
        """The planes, or only the rows `rows` (int (N,)) of each; the float16 scales as float32 (a cast the kernel
        does as it loads them: exact, so every product is the one float32 scales gave)."""
        out = {k: getattr(self, k) if rows is None else getattr(self, k)[rows] for k in PLANES[self.ggml_type]}
        return {k: v.float() if v.dtype == dtypes.float16 else v for k, v in out.items()}

    def _terms(self, p: dict[str, Tensor]) -> list[Tensor]:
        """The dequantized weight (rows of planes `p`) as LAYOUT's terms, each (rows, nb, *pre, *post): Q8_0's 32
        values, a 4-bit block's low-nibble and high-nibble halves, a K block's pieces (kept apart, so no kernel picks a
        nibble or a shift per element)."""
        t = self.ggml_type
        O, nb = p["d"].shape
        d = p["d"].reshape(O, nb, *(1,) * (len(LAYOUT[t][0]) + len(LAYOUT[t][2])))
        if t == 8: return [d * p["qs"].float()]
        if t in (2, 3):
            halves = [(p["qs"] & 15).float(), (p["qs"] >> 4).float()]
            if t == 2: return [d * (q - 8) for q in halves]
            m = p["m"].reshape(O, nb, 1)
            return [d * q + m for q in halves]
        if t in (6, 7):   # term h: nibble h of qs, the fifth bit of value 16h + l from bit 16h + l of qh (uint32 math)
            bit = Tensor.arange(16, device=p["qh"].device, dtype=dtypes.uint32).reshape(1, 1, 16)
            qs, qh = p["qs"].cast(dtypes.uint32), p["qh"].reshape(O, nb, 1)
            q5 = [(((qs >> (4 * h)) & 15) | (((qh >> (bit + 16 * h)) & 1) << 4)).cast(dtypes.int32) for h in range(2)]
            if t == 6: return [d * (q.float() - 16) for q in q5]
            return [d * q.float() + p["m"].reshape(d.shape) for q in q5]
        if t in (10, 11):   # term k: bits 2(k % 4) of qs half k // 4, scales (k, 2) of the sub-blocks of 16
            sc = p["sc"].reshape(O, nb, 8, 2, 1)
            out = []
            for k in range(8):
                low = ((p["qs"][:, :, k // 4] >> (2 * (k % 4))) & 3).reshape(O, nb, 2, 16)
                if t == 10:
                    dl, ml = d * (sc[:, :, k] & 15).float(), p["dmin"].reshape(d.shape) * (sc[:, :, k] >> 4).float()
                    out.append(dl * low.float() - ml)
                else:
                    high = ((p["qh"] >> k) & 1).reshape(O, nb, 2, 16)
                    q = low.cast(dtypes.int32) + (high.cast(dtypes.int32) << 2) - 4
                    out.append((d * sc[:, :, k].float()) * q.float())
            return out
        if t == 14:   # term k: ql[h, k % 2] shifted by 4 * (k // 2), qh[h] shifted by 2k; scales (h, k, 2)
            sc = p["sc"].reshape(O, nb, 2, 4, 2, 1).float()
            out = []
            for k in range(4):
                low = (p["ql"][:, :, :, k % 2] >> (4 * (k // 2))) & 15
                q = (low | (((p["qh"] >> (2 * k)) & 3) << 4)).reshape(O, nb, 2, 2, 16)
                out.append((d * sc[:, :, :, k]) * (q.float() - 32))
            return out
        dmin, qs = p["dmin"].reshape(d.shape), p["qs"]
        if t == 12:   # term hi: nibble hi of the 4 groups, sub-blocks 2g + hi
            sc, mn = p["sc"].reshape(O, nb, 4, 2).float(), p["mn"].reshape(O, nb, 4, 2).float()
            return [(d * sc[:, :, :, hi:hi + 1]) * ((qs >> (4 * hi)) & 15).float() - dmin * mn[:, :, :, hi:hi + 1]
                    for hi in range(2)]
        sc, mn, qh = p["sc"].float(), p["mn"].float(), p["qh"]   # Q5_K, term j: sub-block j, group j // 2
        return [(d * sc[:, :, j:j + 1]) * (((qs[:, :, j // 2] >> (4 * (j % 2))) & 15) | (((qh >> j) & 1) << 4)).float()
                - dmin * mn[:, :, j:j + 1] for j in range(8)]

    def _join(self, parts: list[Tensor]) -> Tensor:
        """LAYOUT's terms (rows, nb, *pre, *post) -> the weight's rows (rows, in_features) in ggml's order."""
        return parts[0].stack(*parts[1:], dim=2 + len(LAYOUT[self.ggml_type][0])).reshape(-1, self.in_features)

    def dequantize(self) -> Tensor:
        """W (out_features, in_features) in float32."""
        return self._join(self._terms(self._planes()))

    def _q8_terms(self) -> tuple[list[Tensor], Tensor, Tensor]:
        """The weight for the 8-bit path: LAYOUT's terms as unsigned bytes u (rows, nb, *post), and per block the
        factor a and the addend c of value = a*u + c (models/quantized.py Q8_OFFSET)."""
        t, p = self.ggml_type, self._planes()
        if t == 8: u = [p["qs"].bitcast(dtypes.uint8) ^ 128]
        elif t in (2, 3): u = [p["qs"] & 15, p["qs"] >> 4]
        else:
            bit = Tensor.arange(16, device=p["qh"].device, dtype=dtypes.uint32).reshape(1, 1, 16)
            qs, qh = p["qs"].cast(dtypes.uint32), p["qh"].reshape(*p["qh"].shape, 1)
            u = [(((qs >> (4 * h)) & 15) | (((qh >> (bit + 16 * h)) & 1) << 4)).cast(dtypes.uint8) for h in range(2)]
        off = Q8_OFFSET[t]
        return u, p["d"], p["m"] if off is None else p["d"] * -off

    def _q8_call(self, x: Tensor) -> Tensor:
        """x @ W.T on x quantized to 8 bits per block of 32 (quantize_q8): per row and block, the integer dot product
        of the weight's bytes u with q (int32, exact), times a*dx, plus c*sx; the C renderer does the products
        with 8-bit dot-product instructions (codegen/dot4.py)."""
        u, a, c = self._q8_terms()
        q, dx, sx = quantize_q8(x)
        lead, nb, n_terms = x.shape[:-1], self.in_features // 32, len(u)
        qt = q.reshape(*lead, 1, nb, n_terms, 32 // n_terms).cast(dtypes.int32)
        dot = sum((qt[..., i, :] * w.cast(dtypes.int32) for i, w in enumerate(u[1:], 1)),
                  qt[..., 0, :] * u[0].cast(dtypes.int32))
        dx, sx = dx.reshape(*lead, 1, nb), sx.reshape(*lead, 1, nb)
        return ((a * dx).unsqueeze(-1) * dot.float()).sum((-2, -1)) + (c * sx).sum(-1)

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, the layer takes {self.in_features}")
        # an input whose features merge axes that a permute separated (a prompt's attention output, heads back into
        # the hidden axis) is copied first, as Tensor.dot does: read as it is, the reduce's index math is divisions and
        # the product scalar (SmolLM2's o_proj on an 82-token prompt: 9.0 against 1.1 ms for q_proj's same shape)
        if merges_permuted(x.uop): x = x.contiguous()
        rows = int(np.prod(x.shape[:-1])) if all(isinstance(d, int) for d in x.shape) else Q8_MAX_ROWS + 1
        if self.q8 and self.ggml_type in Q8_OFFSET and rows <= Q8_MAX_ROWS and q8_enabled(x.device, self.ggml_type):
            return self._q8_call(x).contiguous()
        pre, n_terms, post = LAYOUT[self.ggml_type]
        parts = self._terms(self._planes())
        nb = parts[0].shape[1]
        xs = x.reshape(*x.shape[:-1], 1, nb, *pre, n_terms, *post)             # (..., 1, nb, *pre, terms, *post)
        pick = lambda i: xs[(..., i) + (slice(None),) * len(post)]
        prod_ = sum((pick(i) * w for i, w in enumerate(parts[1:], 1)), pick(0) * parts[0])
        # contiguous: a kernel of its own, so a consumer that writes a bigger buffer (the KV cache update) doesn't
        # recompute the product for every element it writes
        return prod_.sum(tuple(range(-1 - len(pre) - len(post), 0))).contiguous()


class QuantizedEmbedding(QuantizedLinear):
    """An embedding table (vocab_size, embed_size) held as ggml blocks: `emb(idx)` gathers the blocks of the rows it
    needs and dequantizes only those, so no float32 table is kept; `emb.project(x)` is x @ table.T (a tied output
    head reading the same blocks).

    >>> emb = QuantizedEmbedding(5, 32, ggml_type=8)
    >>> emb(Tensor([[0, 4, 4]])).shape
    (1, 3, 32)
    """

    def __init__(self, vocab_size: int, embed_size: int, ggml_type: int):
        super().__init__(embed_size, vocab_size, ggml_type, q8=False)   # a tied head's logits: the float path

    def __call__(self, idx: Tensor) -> Tensor:   # type: ignore[override]
        if not dtypes.is_int(idx.dtype): raise TypeError(f"embedding indices must be integers, got {idx.dtype}")
        return self._join(self._terms(self._planes(idx.reshape(-1)))).reshape(*idx.shape, self.in_features)

    def project(self, x: Tensor) -> Tensor:
        """x (..., embed_size) @ table.T -> (..., vocab_size), dequantized inside the kernel as QuantizedLinear's."""
        return super().__call__(x)


__all__ = ["LAYOUT", "PLANES", "Q8_OFFSET", "QUANTIZED_TYPES", "QuantizedEmbedding", "QuantizedLinear", "block_planes",
           "plane_names", "plane_shape", "q8_enabled", "quantize_q8", "scale_dtype"]
