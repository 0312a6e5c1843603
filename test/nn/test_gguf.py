"""gguf_load against GGUF files written here from the format description: metadata of every value type, plain and
quantized tensors (checked against scalar reference dequantizers written from ggml's block layouts), malformed files."""
import struct

import numpy as np
import pytest

from fusegrad import Tensor, dtypes
from fusegrad.nn.state import FormatError, ggml_data_to_tensor, gguf_load

# ---------------------------------------------------------------------------------------------------------------------
# a GGUF writer


def gguf_string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_value(vtype: int, v) -> bytes:
    if vtype in SCALAR_FMT: return struct.pack(SCALAR_FMT[vtype], v)
    if vtype == 8: return gguf_string(v)
    etype, items = v
    return struct.pack("<IQ", etype, len(items)) + b"".join(gguf_value(etype, x) for x in items)


def write_gguf(path, kv: list, tensors: list, version: int = 3, alignment: int = 32) -> None:
    """kv: [(key, type, value)]; tensors: [(name, torch-order shape, ggml type, raw bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vtype, v in kv: out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, v)
    data, offsets = b"", []
    for _, _, _, raw in tensors:
        data += b"\0" * (-len(data) % alignment)
        offsets.append(len(data))
        data += raw
    for (name, shape, gtype, _), off in zip(tensors, offsets):
        dims = list(reversed(shape))
        out += gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", gtype, off)
    out += b"\0" * (-len(out) % alignment)
    path.write_bytes(out + data)


# ---------------------------------------------------------------------------------------------------------------------
# quantizers (numpy, per ggml's block layouts) and scalar reference dequantizers

def f16(x) -> bytes: return np.float16(x).tobytes()
def rf16(b: bytes, at: int) -> float: return float(np.frombuffer(b[at:at + 2], np.float16)[0])


def quant_q8_0(x: np.ndarray) -> bytes:
    out = b""
    for blk in x.reshape(-1, 32):
        d = np.abs(blk).max() / 127
        q = np.round(blk / d).astype(np.int8) if d else np.zeros(32, np.int8)
        out += f16(d) + q.tobytes()
    return out


def quant_q4_0(x: np.ndarray) -> bytes:
    out = b""
    for blk in x.reshape(-1, 32):
        amax = blk[np.argmax(np.abs(blk))]
        d = amax / -8
        q = np.clip(np.round(blk / d) + 8, 0, 15).astype(np.uint8) if d else np.full(32, 8, np.uint8)
        out += f16(d) + (q[:16] | (q[16:] << 4)).astype(np.uint8).tobytes()
    return out


def quant_q4_1(x: np.ndarray) -> bytes:
    out = b""
    for blk in x.reshape(-1, 32):
        lo, hi = blk.min(), blk.max()
        d = (hi - lo) / 15
        q = np.clip(np.round((blk - lo) / d), 0, 15).astype(np.uint8)
        out += f16(d) + f16(lo) + (q[:16] | (q[16:] << 4)).astype(np.uint8).tobytes()
    return out


def quant_q5(x: np.ndarray, with_min: bool) -> bytes:
    out = b""
    for blk in x.reshape(-1, 32):
        if with_min:
            lo = blk.min()
            d = (blk.max() - lo) / 31
            q = np.clip(np.round((blk - lo) / d), 0, 31).astype(np.uint32)
            head = f16(d) + f16(lo)
        else:
            d = blk[np.argmax(np.abs(blk))] / -16
            q = np.clip(np.round(blk / d) + 16, 0, 31).astype(np.uint32)
            head = f16(d)
        qh = sum(int((q[j] >> 4) & 1) << j for j in range(32))
        out += head + struct.pack("<I", qh) + ((q[:16] & 0xF) | ((q[16:] & 0xF) << 4)).astype(np.uint8).tobytes()
    return out


def deq_q4_0(b: bytes) -> list:
    d, qs = rf16(b, 0), b[2:18]
    return [((qs[j] & 0xF) - 8) * d for j in range(16)] + [((qs[j] >> 4) - 8) * d for j in range(16)]


def deq_q4_1(b: bytes) -> list:
    d, m, qs = rf16(b, 0), rf16(b, 2), b[4:20]
    return [(qs[j] & 0xF) * d + m for j in range(16)] + [(qs[j] >> 4) * d + m for j in range(16)]


def deq_q5_0(b: bytes) -> list:
    d, qh, qs = rf16(b, 0), struct.unpack("<I", b[2:6])[0], b[6:22]
    lo = [(((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) - 16) * d for j in range(16)]
    hi = [(((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16) * d for j in range(16)]
    return lo + hi


def deq_q5_1(b: bytes) -> list:
    d, m, qh, qs = rf16(b, 0), rf16(b, 2), struct.unpack("<I", b[4:8])[0], b[8:24]
    lo = [((qs[j] & 0xF) | (((qh >> j) << 4) & 0x10)) * d + m for j in range(16)]
    hi = [((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) * d + m for j in range(16)]
    return lo + hi


def deq_q8_0(b: bytes) -> list:
    d = rf16(b, 0)
    return [v * d for v in np.frombuffer(b[2:34], np.int8).tolist()]


def deq_q4_k(b: bytes) -> list:
    d, dmin, sc, qs = rf16(b, 0), rf16(b, 2), b[4:16], b[16:144]

    def scale_min(j):
        if j < 4: return sc[j] & 63, sc[j + 4] & 63
        return (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4)
    y = []
    for chunk in range(4):
        s1, m1 = scale_min(2 * chunk)
        s2, m2 = scale_min(2 * chunk + 1)
        q = qs[32 * chunk:32 * chunk + 32]
        y += [d * s1 * (v & 0xF) - dmin * m1 for v in q] + [d * s2 * (v >> 4) - dmin * m2 for v in q]
    return y


def deq_q6_k(b: bytes) -> list:
    ql, qh, sc, d = b[0:128], b[128:192], np.frombuffer(b[192:208], np.int8).tolist(), rf16(b, 208)
    y = [0.0] * 256
    for half in range(2):
        L, H, S, base = ql[64 * half:], qh[32 * half:], sc[8 * half:], 128 * half
        for l in range(32):
            i = l // 16
            q1 = ((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32
            q2 = ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32
            q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
            q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
            y[base + l], y[base + l + 32] = d * S[i] * q1, d * S[i + 2] * q2
            y[base + l + 64], y[base + l + 96] = d * S[i + 4] * q3, d * S[i + 6] * q4
    return y


QUANT = {  # ggml type: (block elems, block bytes, quantizer or None for random blocks, reference dequantizer)
    8: (32, 34, quant_q8_0, deq_q8_0), 2: (32, 18, quant_q4_0, deq_q4_0), 3: (32, 20, quant_q4_1, deq_q4_1),
    6: (32, 22, lambda x: quant_q5(x, False), deq_q5_0), 7: (32, 24, lambda x: quant_q5(x, True), deq_q5_1),
    12: (256, 144, None, deq_q4_k), 14: (256, 210, None, deq_q6_k)}


def random_blocks(n_blocks: int, nbytes: int, seed: int) -> bytes:
    """Random block bytes with small, finite float16 scales in the first bytes (and at the end for Q6_K)."""
    rng = np.random.default_rng(seed)
    raw = bytearray(rng.integers(0, 256, n_blocks * nbytes, dtype=np.uint8).tobytes())
    for i in range(n_blocks):
        for at in ((0, 2) if nbytes == 144 else (nbytes - 2,)):
            raw[i * nbytes + at:i * nbytes + at + 2] = f16(rng.uniform(0.01, 0.1))
    return bytes(raw)


def reference(gtype: int, raw: bytes) -> np.ndarray:
    _, nbytes, _, deq = QUANT[gtype]
    return np.array([v for i in range(0, len(raw), nbytes) for v in deq(raw[i:i + nbytes])], np.float32)


# ---------------------------------------------------------------------------------------------------------------------

def test_metadata_of_every_type(tmp_path):
    kv = [("u8", 0, 200), ("i8", 1, -5), ("u16", 2, 60000), ("i16", 3, -300), ("u32", 4, 4_000_000_000),
          ("i32", 5, -7), ("f32", 6, 1.5), ("bool", 7, True), ("str", 8, "llama ü"), ("u64", 10, 2 ** 60),
          ("i64", 11, -2 ** 40), ("f64", 12, 0.1), ("arr", 9, (5, [1, 2, 3])), ("strs", 9, (8, ["a", "bc"])),
          ("nested", 9, (9, [(6, [1.0]), (6, [2.0, 3.0])])), ("general.alignment", 4, 64)]
    fn = tmp_path / "kv.gguf"
    write_gguf(fn, kv, [("w", (2, 3), 0, np.arange(6, dtype=np.float32).tobytes())], alignment=64)
    meta, tensors = gguf_load(fn)
    expect = {k: v for k, _, v in kv}
    expect.update(arr=[1, 2, 3], strs=["a", "bc"], nested=[[1.0], [2.0, 3.0]])
    assert meta == expect
    np.testing.assert_array_equal(tensors["w"].numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("version", [2, 3])
def test_plain_tensors(tmp_path, version):
    rng = np.random.default_rng(1)
    arrays = {"f32": (0, rng.standard_normal((3, 4, 2)).astype(np.float32)),
              "f16": (1, rng.standard_normal((5, 3)).astype(np.float16)),
              "i8": (24, rng.integers(-100, 100, (7,)).astype(np.int8)),
              "i32": (26, rng.integers(-1e6, 1e6, (2, 2)).astype(np.int32)),
              "f64": (28, rng.standard_normal((4,)))}
    fn = tmp_path / "plain.gguf"
    write_gguf(fn, [], [(k, a.shape, g, a.tobytes()) for k, (g, a) in arrays.items()], version=version)
    _, tensors = gguf_load(fn)
    for k, (_, a) in arrays.items():
        assert tensors[k].shape == a.shape
        np.testing.assert_array_equal(tensors[k].numpy(), a)
    assert tensors["f16"].dtype == dtypes.float16 and tensors["i8"].dtype == dtypes.int8
    bf = np.array([1.5, -2.0, 0.15625], np.float32)
    write_gguf(fn, [], [("bf", (3,), 30, (bf.view(np.uint32) >> 16).astype(np.uint16).tobytes())])
    assert gguf_load(fn)[1]["bf"].float().tolist() == [1.5, -2.0, 0.15625]


@pytest.mark.parametrize("gtype", [8, 2, 3, 6, 7])
def test_quantized_round_trip(tmp_path, gtype):
    """Quantize real values, load: equal to the reference dequantization, and close to the original values."""
    x = np.random.default_rng(gtype).standard_normal((4, 64)).astype(np.float32)
    raw = QUANT[gtype][2](x)
    fn = tmp_path / f"q{gtype}.gguf"
    write_gguf(fn, [("general.name", 8, "tiny")], [("blk.0.w", x.shape, gtype, raw), ("bias", (3,), 0,
                                                                                       np.ones(3, np.float32).tobytes())])
    meta, tensors = gguf_load(fn)
    assert meta["general.name"] == "tiny" and list(tensors) == ["blk.0.w", "bias"]
    got = tensors["blk.0.w"].numpy()
    assert got.shape == (4, 64) and got.dtype == np.float32
    np.testing.assert_allclose(got, reference(gtype, raw).reshape(4, 64), rtol=1e-6, atol=1e-7)
    step = {8: 1 / 127, 2: 1 / 7, 3: 1 / 15, 6: 1 / 15, 7: 1 / 31}[gtype]
    assert np.abs(got - x).max() <= step * np.abs(x).max() * 1.01


@pytest.mark.parametrize("gtype", [12, 14])
def test_k_quants_against_reference(tmp_path, gtype):
    block, nbytes = QUANT[gtype][:2]
    raw = random_blocks(3, nbytes, seed=gtype)
    fn = tmp_path / f"k{gtype}.gguf"
    write_gguf(fn, [], [("w", (3, block), gtype, raw)])
    got = gguf_load(fn)[1]["w"].numpy()
    np.testing.assert_allclose(got, reference(gtype, raw).reshape(3, block), rtol=1e-5, atol=1e-6)


def test_ggml_data_to_tensor_direct():
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    raw = quant_q8_0(x)
    out = ggml_data_to_tensor(Tensor(raw), 64, 8)
    np.testing.assert_allclose(out.numpy(), reference(8, raw), rtol=1e-6)
    with pytest.raises(ValueError, match="IQ2_XXS is not supported"): ggml_data_to_tensor(Tensor(raw), 64, 16)


def test_tensors_load_lazily(tmp_path):
    fn = tmp_path / "lazy.gguf"
    write_gguf(fn, [], [("a", (4,), 0, np.ones(4, np.float32).tobytes()), ("b", (2,), 0, np.zeros(2, np.float32).tobytes())])
    _, tensors = gguf_load(fn)
    assert tensors._loaded == {} and tensors.shape_of("a") == (4,)
    assert tensors["b"].tolist() == [0.0, 0.0] and set(tensors._loaded) == {"b"}


@pytest.mark.parametrize("case", ["empty", "magic", "version", "truncated_kv", "huge_count", "bad_utf8", "bad_vtype",
                                  "truncated_data", "unsupported_type", "partial_block", "bad_alignment",
                                  "truncated_string_array", "bad_utf8_in_string_array", "truncated_int_array"])
def test_malformed(tmp_path, case):
    fn = tmp_path / f"{case}.gguf"
    good = tmp_path / "good.gguf"
    write_gguf(good, [("k", 8, "value")], [("w", (2, 32), 8, quant_q8_0(np.ones(64, np.float32)))])
    g = good.read_bytes()
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    blobs = {
        "empty": b"", "magic": b"GGML" + g[4:], "version": g[:4] + struct.pack("<I", 9) + g[8:],
        "truncated_kv": g[:30], "huge_count": b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 0),
        "bad_utf8": header + struct.pack("<Q", 2) + b"\xff\xfe" + struct.pack("<I", 4) + b"\0" * 4,
        "bad_vtype": header + gguf_string("k") + struct.pack("<I", 77) + b"\0" * 8,
        "truncated_data": g[:-10],
        # (arrays of strings and of numbers are read in one loop / one unpack: the same checks must hold)
        "truncated_string_array": header + gguf_string("k") + struct.pack("<II", 9, 8) + struct.pack("<Q", 3) +
        gguf_string("a") + gguf_string("bc")[:-1],
        "bad_utf8_in_string_array": header + gguf_string("k") + struct.pack("<II", 9, 8) + struct.pack("<Q", 2) +
        gguf_string("a") + struct.pack("<Q", 2) + b"\xff\xfe",
        "truncated_int_array": header + gguf_string("k") + struct.pack("<II", 9, 5) + struct.pack("<Q", 4) +
        struct.pack("<3i", 1, 2, 3),
        "unsupported_type": None, "partial_block": None, "bad_alignment": None}
    if case == "unsupported_type": write_gguf(fn, [], [("w", (256,), 16, b"\0" * 66)])   # IQ2_XXS
    elif case == "partial_block": write_gguf(fn, [], [("w", (40,), 8, b"\0" * 68)])
    elif case == "bad_alignment": write_gguf(fn, [("general.alignment", 5, -4)], [])
    else: fn.write_bytes(blobs[case])
    with pytest.raises(FormatError, match=str(fn).replace(".", r"\.")):
        gguf_load(fn)


# ---------------------------------------------------------------------------------------------------------------------
# every block type bit-exact against the gguf package's NumPy dequantization, on files the gguf package writes

F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82], "Q3_K": [108],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


@pytest.mark.parametrize("name", list(F16_FIELDS))
def test_dequantization_bit_exact_vs_gguf_package(tmp_path, name):
    """Random blocks (finite float16 scales, every other byte random: all bit patterns of the packed values) and,
    for the types the gguf package can quantize, real values quantized by it; written with GGUFWriter, read with
    gguf_load, compared bit for bit with gguf.quants.dequantize."""
    gguf = pytest.importorskip("gguf", reason="the reference is the gguf package")
    qt = gguf.GGMLQuantizationType[name]
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(int(qt))
    raw = rng.integers(0, 256, size=(24, nbytes), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        raw[:, at:at + 2] = (rng.standard_normal((24, 1)) * 0.05).astype(np.float16).view(np.uint8)
    arrays = {"random": raw.reshape(3, 8 * nbytes)}
    try:
        x = (rng.standard_normal((3, 8 * block)) * rng.uniform(0.01, 10, (3, 1))).astype(np.float32)
        arrays["quantized"] = gguf.quants.quantize(x, qt)
    except NotImplementedError: pass                      # gguf-py has no quantizer for the K types
    fn = tmp_path / f"{name}.gguf"
    w = gguf.GGUFWriter(str(fn), "llama")
    for k, a in arrays.items(): w.add_tensor(k, a, raw_shape=a.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _, tensors = gguf_load(fn)
    for k, a in arrays.items():
        want = gguf.quants.dequantize(a, qt).astype(np.float32)
        got = tensors[k].numpy()
        assert got.shape == want.shape == (3, 8 * block), (got.shape, want.shape)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
            f"{name} {k}: {np.count_nonzero(got != want)} values differ, max {np.abs(got - want).max()}"
    if name in ("Q2_K", "Q3_K", "Q5_K") or "quantized" not in arrays: return
    assert np.abs(tensors["quantized"].numpy() - x).max() <= 0.1 * np.abs(x).max()


def _mapped_rss_kb(path) -> int:
    """This process's resident kB of the mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"): inside = line.rstrip().endswith(str(path))
            elif inside and head[0] == "Rss:": total += int(head[1])
    return total


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_DONTNEED"), reason="no madvise on this platform")
def test_release_drops_mapped_pages_and_keeps_the_bytes(tmp_path):
    """Source.release (what the quantized GGUF loader calls after copying a tensor's blocks): the mapped file's pages
    of the range leave the resident set, and reading them again gives the same bytes."""
    from fusegrad.nn._io import Source
    data = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8)
    fn = tmp_path / "blob.bin"
    fn.write_bytes(data.tobytes())
    src = Source(fn)
    assert int(np.frombuffer(src.read(0, data.size), np.uint8).sum()) == int(data.sum())   # every page touched
    assert _mapped_rss_kb(fn) >= 8 << 10
    src.release(100, data.size)            # all whole pages after byte 100: the first page stays
    assert _mapped_rss_kb(fn) <= 8, _mapped_rss_kb(fn)
    assert bytes(src.read(0, data.size)) == data.tobytes()
    Source(data.tobytes()).release(0, data.size)   # an in-memory buffer: nothing to do
