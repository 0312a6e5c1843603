"""GGUF reader (llama.cpp's model format): `gguf_load(fn) -> (metadata, tensors)`, with the dequantization of ggml's
block formats written as Tensor ops (so it runs on the device, lazily, when a tensor is used).

File layout (little endian): b"GGUF", u32 version (2 or 3), u64 tensor count, u64 key/value count, the key/values
(string key, u32 type, value), the tensor infos (string name, u32 n_dims, u64 dims[n_dims] fastest-varying first,
u32 ggml type, u64 offset), padding to `general.alignment` (default 32), then the tensor data at those offsets.
"""
from __future__ import annotations

import functools
import pathlib
import struct
from collections.abc import Callable
from typing import Any

from fusegrad.dtype import DType, dtypes
from fusegrad.helpers import prod
from fusegrad.nn._io import FormatError, LazyStateDict, Source, check_shape, loader, tensor_from_bytes
from fusegrad.tensor import Tensor

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 24: ("I8", 1, 1),
    25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2)}
_PLAIN: dict[int, DType] = {0: dtypes.float32, 1: dtypes.float16, 24: dtypes.int8, 25: dtypes.int16, 26: dtypes.int32,
                            27: dtypes.int64, 28: dtypes.float64, 30: dtypes.bfloat16}
_KNOWN_UNSUPPORTED = {9: "Q8_1", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
                      18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M",
                      34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}

# ---------------------------------------------------------------------------------------------------------------------
# dequantization: `blocks` is (n_blocks, bytes_per_block) uint8; each returns (n_blocks, elements_per_block) float32


def _f16(blocks: Tensor, at: int) -> Tensor:
    """The little-endian float16 at byte `at` of each block, as float32 (n_blocks, 1)."""
    return blocks[:, at:at + 2].bitcast(dtypes.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """(..., k) bytes -> (..., 2k) 4-bit values: all low nibbles, then all high nibbles (ggml's order)."""
    q = qs.cast(dtypes.int32)
    return (q & 0xF).cat(q >> 4, dim=-1)


def _bits(b: Tensor) -> Tensor:
    """(n, k) bytes -> (n, 8k) bits, least significant bit of byte 0 first."""
    shifts = Tensor.arange(8, device=b.device).reshape(1, 1, 8)
    return ((b.cast(dtypes.int32).unsqueeze(-1) >> shifts) & 1).reshape(b.shape[0], -1)


def _q4_0(b: Tensor) -> Tensor: return _f16(b, 0) * (_nibbles(b[:, 2:18]) - 8).float()
def _q4_1(b: Tensor) -> Tensor: return _f16(b, 0) * _nibbles(b[:, 4:20]).float() + _f16(b, 2)
def _q8_0(b: Tensor) -> Tensor: return _f16(b, 0) * b[:, 2:34].bitcast(dtypes.int8).float()
def _q5_0(b: Tensor) -> Tensor: return _f16(b, 0) * ((_nibbles(b[:, 6:22]) | (_bits(b[:, 2:6]) << 4)) - 16).float()


def _q5_1(b: Tensor) -> Tensor:
    return _f16(b, 0) * (_nibbles(b[:, 8:24]) | (_bits(b[:, 4:8]) << 4)).float() + _f16(b, 2)


def _shifted(q: Tensor, shifts: range) -> Tensor:
    """(n, g, 1, k) ints -> (n, g, len(shifts), k): each shifted right by every one of `shifts`."""
    return q >> Tensor(list(shifts), device=q.device).reshape(1, 1, len(shifts), 1)


def _k_scale_min(s: Tensor) -> tuple[Tensor, Tensor]:
    """The 8 six-bit scales and 8 six-bit mins packed in 12 bytes (Q4_K, Q5_K): (n, 8) each, float32."""
    s = s.cast(dtypes.int32)
    sc = (s[:, 0:4] & 63).cat((s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4), dim=1)
    mn = (s[:, 4:8] & 63).cat((s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4), dim=1)
    return sc.float(), mn.float()


def _q2_k(b: Tensor) -> Tensor:
    """256 2-bit values in 16 sub-blocks of 16, each with a 4-bit scale and 4-bit min; d and dmin float16 last."""
    n = b.shape[0]
    sc = b[:, 0:16].cast(dtypes.int32)
    dl = (_f16(b, 80) * (sc & 0xF).float()).reshape(n, 16, 1)
    ml = (_f16(b, 82) * (sc >> 4).float()).reshape(n, 16, 1)
    q = (_shifted(b[:, 16:80].cast(dtypes.int32).reshape(n, 2, 1, 32), range(0, 8, 2)) & 3).reshape(n, 16, 16)
    return (dl * q.float() - ml).reshape(n, 256)


def _q3_k(b: Tensor) -> Tensor:
    """256 3-bit values: low 2 bits in qs[64], the high bit inverted in hmask[32], 16 six-bit scales (offset 32)."""
    n = b.shape[0]
    s = b[:, 96:108].cast(dtypes.int32)
    low = _shifted(s[:, 0:8].reshape(n, 1, 1, 8), range(0, 8, 4)).reshape(n, 16)
    high = _shifted(s[:, 8:12].reshape(n, 1, 1, 4), range(0, 8, 2)).reshape(n, 16)
    scales = ((low & 0xF) | ((high & 3) << 4)) - 32
    dl = (_f16(b, 108) * scales.float()).reshape(n, 16, 1)
    ql = (_shifted(b[:, 32:96].cast(dtypes.int32).reshape(n, 2, 1, 32), range(0, 8, 2)) & 3).reshape(n, 16, 16)
    qh = (_shifted(b[:, 0:32].cast(dtypes.int32).reshape(n, 1, 1, 32), range(8)) & 1).reshape(n, 16, 16)
    return (dl * (ql - ((qh ^ 1) << 2)).float()).reshape(n, 256)


def _q4_k(b: Tensor) -> Tensor:
    """256 values in 8 sub-blocks of 32, each with a 6-bit scale and min packed into 12 bytes."""
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    qs = b[:, 16:144].cast(dtypes.int32).reshape(n, 4, 1, 32)
    q = (qs & 0xF).cat(qs >> 4, dim=2).reshape(n, 8, 32)                                  # sub-block 2j low, 2j+1 high
    y = (_f16(b, 0) * sc).unsqueeze(-1) * q.float() - (_f16(b, 2) * mn).unsqueeze(-1)
    return y.reshape(n, 256)


def _q5_k(b: Tensor) -> Tensor:
    """Q4_K's layout with a fifth bit per value in qh[32] (bit j of byte i: value i of sub-block j)."""
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    ql = (_shifted(b[:, 48:176].cast(dtypes.int32).reshape(n, 4, 1, 32), range(0, 8, 4)) & 0xF).reshape(n, 8, 32)
    qh = (_shifted(b[:, 16:48].cast(dtypes.int32).reshape(n, 1, 1, 32), range(8)) & 1).reshape(n, 8, 32)
    y = (_f16(b, 0) * sc).unsqueeze(-1) * (ql | (qh << 4)).float() - (_f16(b, 2) * mn).unsqueeze(-1)
    return y.reshape(n, 256)


def _q6_k(b: Tensor) -> Tensor:
    """256 6-bit values: low 4 bits in ql[128], high 2 bits in qh[64], int8 scales per 16, one float16 scale."""
    n = b.shape[0]
    halves = []
    for h in range(2):
        ql = b[:, 64 * h:64 * h + 64].cast(dtypes.int32).reshape(n, 1, 2, 32)
        qh = b[:, 128 + 32 * h:160 + 32 * h].cast(dtypes.int32).reshape(n, 1, 32)
        low = (ql & 0xF).cat(ql >> 4, dim=1).reshape(n, 4, 32)                           # q1..q4 of ggml's loop
        high = (qh >> Tensor.arange(0, 8, 2, device=b.device).reshape(1, 4, 1)) & 3       # (n, 4, 32)
        halves.append((low | (high << 4)).reshape(n, 128) - 32)
    q = halves[0].cat(halves[1], dim=1).reshape(n, 16, 16).float()
    scales = b[:, 192:208].bitcast(dtypes.int8).float().reshape(n, 16, 1)
    return (_f16(b, 208).reshape(n, 1, 1) * scales * q).reshape(n, 256)


_DEQUANT: dict[int, Callable[[Tensor], Tensor]] = {2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0, 10: _q2_k,
                                                   11: _q3_k, 12: _q4_k, 13: _q5_k, 14: _q6_k}


def ggml_data_to_tensor(t: Tensor, n: int, ggml_type: int) -> Tensor:
    """The first `n` values stored in uint8 tensor `t` in ggml type `ggml_type`, as a flat tensor (float32 for the
    quantized types, the native dtype for plain ones)."""
    if ggml_type in _PLAIN:
        dt = _PLAIN[ggml_type]
        raw = t[:n * dt.itemsize]
        return raw.reshape(n, dt.itemsize).bitcast(dt).reshape(n) if dt.itemsize > 1 else raw.bitcast(dt)
    if ggml_type not in _DEQUANT:
        name = GGML_TYPES.get(ggml_type, (_KNOWN_UNSUPPORTED.get(ggml_type, f"type {ggml_type}"),))[0]
        raise ValueError(f"ggml type {name} is not supported (supported: "
                         f"{', '.join(GGML_TYPES[k][0] for k in sorted(GGML_TYPES))})")
    _, block, nbytes = GGML_TYPES[ggml_type]
    if n % block: raise ValueError(f"{n} values don't fill whole {GGML_TYPES[ggml_type][0]} blocks of {block}")
    blocks = t[:n // block * nbytes].reshape(n // block, nbytes)
    return _DEQUANT[ggml_type](blocks).reshape(n)


# ---------------------------------------------------------------------------------------------------------------------
# the container

_MAX_ARRAY_DEPTH = 32
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _Cursor:
    """Sequential reads from a Source with bounds checks (truncation -> FormatError naming the file)."""

    def __init__(self, src: Source, version: int):
        self.src, self.pos, self.version = src, 0, version

    def take(self, n: int, what: str) -> memoryview:
        out = self.src.read(self.pos, self.pos + n, what)
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, per_item: int = 1) -> int:
        """A length field; it can't promise more items than there are bytes left."""
        n = self.unpack("<I" if self.version == 1 else "<Q", what)
        if n * per_item > len(self.src) - self.pos:
            raise self.src.error(f"{what} is {n}, more than the {len(self.src) - self.pos} bytes left: corrupt file")
        return n

    def string(self, what: str) -> str:
        raw = bytes(self.take(self.count(f"length of {what}"), what))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.src.error(f"{what} is not valid UTF-8") from None

    def strings(self, n: int, what: str) -> list[str]:
        """n strings in a row (a vocabulary, its merges: ~100k of them), each checked against the readable end as
        `string` does, without a call per field."""
        buf, pos, end, out = self.src.buf, self.pos, self.src.readable_end(), []
        lfmt = "<I" if self.version == 1 else "<Q"
        lsize = struct.calcsize(lfmt)
        for i in range(n):
            if pos + lsize > end: break
            k = struct.unpack_from(lfmt, buf, pos)[0]
            if pos + lsize + k > end: break
            try: out.append(str(buf[pos + lsize:pos + lsize + k], "utf-8"))
            except UnicodeDecodeError: raise self.src.error(f"{what} (item {i}) is not valid UTF-8") from None
            pos += lsize + k
        else:
            self.pos = pos
            return out
        self.pos = pos
        self.string(f"{what} (item {len(out)})")   # past the end: raises the truncation error, naming the bytes
        raise AssertionError("unreachable")   # pragma: no cover

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS: return self.unpack(_SCALARS[vtype], what)
        if vtype == 8: return self.string(what)
        if vtype == 9:
            if depth >= _MAX_ARRAY_DEPTH:
                raise self.src.error(f"{what}: arrays nest more than {_MAX_ARRAY_DEPTH} deep at byte {self.pos}")
            etype = self.unpack("<I", f"element type of {what}")
            n = self.count(f"length of {what}")
            if etype in _SCALARS:   # (a token-type or score array: one unpack for all of it)
                fmt = _SCALARS[etype]
                return list(struct.unpack(f"<{n}{fmt[1]}", self.take(n * struct.calcsize(fmt), what)))
            if etype == 8: return self.strings(n, what)
            return [self.value(etype, what, depth + 1) for _ in range(n)]
        raise self.src.error(f"{what} has unknown value type {vtype}")


@loader
def gguf_load(fn: Tensor | str | pathlib.Path, mmap: bool = True) -> tuple[dict[str, Any], LazyStateDict]:
    """Read a .gguf file: (metadata key -> value, tensor name -> Tensor). Tensors are read and dequantized on first use;
    shapes are in PyTorch order (GGUF's dims reversed). mmap=False reads the whole file into memory now (see
    safe_load). The returned dict also has `ggml_types` (name -> ggml type id) and `raw_bytes` (name -> a function
    giving the tensor's bytes as stored, for layers that keep the blocks quantized) and `release_bytes` (name -> a function
    that takes a mapped file's pages of that tensor out of the resident memory once they have been copied)."""
    src = Source(fn, mmap=mmap)
    if len(src) < 4 or bytes(src.buf[:4]) != b"GGUF": raise src.error("not a GGUF file (missing the 'GGUF' magic)")
    if len(src) < 8: raise src.error("truncated GGUF header")
    version = struct.unpack("<I", src.buf[4:8])[0]
    if version not in (2, 3): raise src.error(f"unsupported GGUF version {version} (supported: 2, 3)")
    cur = _Cursor(src, version)
    cur.pos = 8
    n_tensors, n_kv = cur.count("tensor count", 8), cur.count("metadata count", 8)
    kv: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        kv[key] = cur.value(cur.unpack("<I", f"type of {key!r}"), f"metadata {key!r}")
    infos = []
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        n_dims = cur.unpack("<I", f"rank of {name!r}")
        if n_dims > 8: raise src.error(f"tensor {name!r} has {n_dims} dims (GGUF allows at most 4)")
        dims = [cur.unpack("<Q", f"shape of {name!r}") for _ in range(n_dims)]
        infos.append((name, dims, cur.unpack("<I", f"type of {name!r}"), cur.unpack("<Q", f"offset of {name!r}")))
    align = kv.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0: raise src.error(f"invalid general.alignment {align!r}")
    data_start = -(-cur.pos // align) * align
    entries: dict[str, tuple[tuple[int, ...], Callable[[], Tensor]]] = {}
    for name, dims, gtype, offset in infos:
        if gtype not in GGML_TYPES:
            raise src.error(f"tensor {name!r} has ggml type "
                            f"{_KNOWN_UNSUPPORTED.get(gtype, gtype)}, which this reader does not support")
        _, block, bpb = GGML_TYPES[gtype]
        n = prod(dims)
        if n % block: raise src.error(f"tensor {name!r} has {n} values, not a whole number of blocks of {block}")
        start, end = data_start + offset, data_start + offset + n // block * bpb
        if end > len(src): raise src.error(f"tensor {name!r} ends at byte {end} but the file has {len(src)}: truncated")
        shape = tuple(reversed(dims))
        check_shape(src, name, shape)
        entries[name] = (shape, functools.partial(_read_tensor, src, name, gtype, shape, start, end))
    sd = LazyStateDict(src.name, entries, kv)
    # what stays-quantized layers read instead of the dequantized tensor: each tensor's ggml type, and its raw bytes
    # (a view of the memory-mapped file) on demand
    sd.ggml_types = {name: gtype for name, _, gtype, _ in infos}
    span = {name: (data_start + off, data_start + off + prod(dims) // GGML_TYPES[gt][1] * GGML_TYPES[gt][2])
            for name, dims, gt, off in infos}
    sd.raw_bytes = {name: functools.partial(src.read, *span[name], f"tensor {name!r}") for name in span}
    sd.release_bytes = {name: functools.partial(src.release, *span[name]) for name in span}
    return kv, sd


def _read_tensor(src: Source, name: str, gtype: int, shape: tuple[int, ...], start: int, end: int) -> Tensor:
    raw = tensor_from_bytes(src.read(start, end, f"tensor {name!r}"), dtypes.uint8, (end - start,))
    try:
        return ggml_data_to_tensor(raw, prod(shape), gtype).reshape(shape)
    except ValueError as e:
        raise FormatError(f"{src.name}: tensor {name!r}: {e}") from None


__all__ = ["GGML_TYPES", "ggml_data_to_tensor", "gguf_load"]
