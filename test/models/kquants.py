"""A NumPy encoder for ggml's K-quant blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), which the `gguf` package can decode
(gguf.quants.dequantize) but not write. It is a plain round-to-nearest encoder (per sub-block range, then the 4-,
6- or 8-bit sub-block scales against one float16 super-scale), not llama.cpp's search for the best scales: valid blocks
with reasonable error are all the tests and benchmarks need, and the reference values are always the gguf package's
dequantization of the bytes written. `quantize(arr, name)` also passes the other types to gguf.quants.quantize;
`add_tensor` and `finish` are the steps every test's GGUF writer shares."""
from __future__ import annotations

from typing import Any

import numpy as np

K_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def _f16(x: np.ndarray) -> np.ndarray:
    """Non-negative float32 -> the float16 bytes (n, 2) and the float16 value back as float32 (n, 1)."""
    h = x.astype(np.float16)
    return h.reshape(-1, 1).view(np.uint8), h.astype(np.float32).reshape(-1, 1)


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros_like(a), where=b != 0)


def _q4_5_k(x: np.ndarray, bits: int) -> np.ndarray:
    n = x.shape[0]
    top = (1 << bits) - 1
    sub = x.reshape(n, 8, 32)
    mn_raw = np.maximum(0.0, -sub.min(-1))                                    # value = scale * q - min
    sc_raw = (sub.max(-1) + mn_raw) / top
    d_b, d = _f16(sc_raw.max(-1) / 63)
    m_b, dmin = _f16(mn_raw.max(-1) / 63)
    sc = np.clip(np.rint(_ratio(sc_raw, d)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_ratio(mn_raw, dmin)), 0, 63).astype(np.uint8)
    ds, dm = (d * sc.astype(np.float32))[..., None], (dmin * mn.astype(np.float32))[..., None]
    q = np.clip(np.rint(_ratio(sub + dm, np.broadcast_to(ds, sub.shape))), 0, top).astype(np.uint8)   # (n, 8, 32)
    scales = np.concatenate([(sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6), (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
                             (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)], axis=1)
    low = q & 15
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(n, 128)                # group g: sub-blocks 2g (low), 2g+1
    parts = [d_b, m_b, scales]
    if bits == 5:
        hi = (q >> 4).astype(np.uint8)                                        # bit j of qh[l]: sub-block j's value l
        parts.append(np.bitwise_or.reduce(hi << np.arange(8, dtype=np.uint8).reshape(1, 8, 1), axis=1))
    return np.concatenate(parts + [qs], axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    sc_raw = np.abs(sub).max(-1) / 31
    d_b, d = _f16(sc_raw.max(-1) / 127)
    sc = np.clip(np.rint(_ratio(sc_raw, d)), -128, 127).astype(np.int8)
    ds = (d * sc.astype(np.float32))[..., None]
    q = (np.clip(np.rint(_ratio(sub, np.broadcast_to(ds, sub.shape))), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, 2, 4, 32)                                                # (half, quarter k, value l)
    ql = np.zeros((n, 2, 2, 32), np.uint8)                                    # (half, l or l + 32, l)
    qh = np.zeros((n, 2, 32), np.uint8)
    for k in range(4):
        ql[:, :, k % 2] |= (q[:, :, k] & 15) << (4 * (k // 2))
        qh |= (q[:, :, k] >> 4) << (2 * k)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d_b], axis=1)


def _pack_2bit(q: np.ndarray) -> np.ndarray:
    """2-bit values (n, 256) -> Q2_K's/Q3_K's qs (n, 64): value 128h + 32j + l in bits 2j of byte 32h + l."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    return np.bitwise_or.reduce(q << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1), axis=2).reshape(-1, 64)


def _q2_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    mn_raw = np.maximum(0.0, -sub.min(-1))                                    # value = (d sc) q - (dmin mn)
    sc_raw = (sub.max(-1) + mn_raw) / 3
    d_b, d = _f16(sc_raw.max(-1) / 15)
    m_b, dmin = _f16(mn_raw.max(-1) / 15)
    sc = np.clip(np.rint(_ratio(sc_raw, d)), 0, 15).astype(np.uint8)
    mn = np.clip(np.rint(_ratio(mn_raw, dmin)), 0, 15).astype(np.uint8)
    ds, dm = (d * sc.astype(np.float32))[..., None], (dmin * mn.astype(np.float32))[..., None]
    q = np.clip(np.rint(_ratio(sub + dm, np.broadcast_to(ds, sub.shape))), 0, 3)
    return np.concatenate([sc | (mn << 4), _pack_2bit(q), d_b, m_b], axis=1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    sc_raw = np.abs(sub).max(-1) / 4                                          # value = (d sc) q, q in [-4, 3]
    d_b, d = _f16(sc_raw.max(-1) / 31)
    sc = np.clip(np.rint(_ratio(sc_raw, d)), -32, 31).astype(np.int16)
    ds = (d * sc.astype(np.float32))[..., None]
    q = (np.clip(np.rint(_ratio(sub, np.broadcast_to(ds, sub.shape))), -4, 3) + 4).astype(np.uint8).reshape(n, 256)
    hmask = np.bitwise_or.reduce((q >> 2).reshape(n, 8, 32) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1), axis=1)
    s6 = (sc + 32).astype(np.uint8)                                           # 6 bits: nibbles, then 2-bit tops
    low = s6[:, :8] & 15 | ((s6[:, 8:] & 15) << 4)
    top = np.bitwise_or.reduce((s6 >> 4).reshape(n, 4, 4) << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1),
                               axis=1)
    return np.concatenate([hmask, _pack_2bit(q & 3), low, top, d_b], axis=1)


def quantize(arr: np.ndarray, name: str) -> np.ndarray:
    """`arr` (..., cols) float32 as ggml type `name`'s blocks: uint8 (..., cols // 256 * bytes per block) for the K
    types (cols a multiple of 256), gguf.quants.quantize's result for the others."""
    if name not in K_BYTES:
        import gguf
        return gguf.quants.quantize(arr, gguf.GGMLQuantizationType[name])
    if arr.shape[-1] % 256: raise ValueError(f"{arr.shape[-1]} columns are not whole {name} blocks of 256")
    blocks = np.asarray(arr, dtype=np.float32).reshape(-1, 256)
    out = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q6_K": _q6_k}.get(name, lambda b: _q4_5_k(b, 4 if name == "Q4_K" else 5))(
        blocks)
    return out.reshape(*arr.shape[:-1], arr.shape[-1] // 256 * K_BYTES[name])


def add_tensor(w: Any, name: str, arr: np.ndarray, quant: str | None = None) -> np.ndarray:
    """Add `arr` to the gguf.GGUFWriter `w` as tensor `name`, in ggml type `quant` when given and `arr` is 2-D (else as
    it is); returns the values the file holds (the dequantized blocks), for the reference model."""
    if not quant or arr.ndim != 2:
        w.add_tensor(name, arr)
        return arr
    import gguf
    qt = gguf.GGMLQuantizationType[quant]
    q = quantize(arr, quant)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
    return gguf.quants.dequantize(q, qt).reshape(arr.shape)


def finish(w: Any) -> None:
    """Write the header, metadata and tensors of the gguf.GGUFWriter `w` and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
