"""Parser fuzzers: mutated valid files and generated headers for safetensors, .pth (zip and legacy) and GGUF. Every
case must load (and then every tensor must read) or raise FormatError, within a time bound, never anything else and
never a crash. Inputs are built here from scratch; the memory bound is checked on the whole run (max RSS growth)."""
import io
import json
import os
import resource
import struct
import time
import zipfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fusegrad import Tensor
from fusegrad.nn.state import FormatError, gguf_load, safe_load, safe_save, torch_load

from .conftest import fuzz_settings

FUZZ = fuzz_settings(300)
PER_CASE_S = 5.0
READ_S = 60.0
MAX_RSS_GROWTH = 1 << 30
COUNTS: dict[str, list] = {}


def exercise(name: str, load, data: bytes) -> None:
    """Load `data` and read every tensor (shape only for views bigger than 1M elements), or see a FormatError. The
    load itself must take under PER_CASE_S of CPU time; reading the tensors may compile kernels (slow on a busy machine), so it
    gets READ_S."""
    t0, c0 = time.perf_counter(), time.process_time()
    c1 = None
    try:
        out = load(data)
        c1 = time.process_time()
        if isinstance(out, tuple): out = out[1]
        items = out.values() if hasattr(out, "values") else out if isinstance(out, list) else [out]
        for v in list(items)[:64]:
            if isinstance(v, Tensor) and v.numel() <= 1 << 20: v.numpy()
        outcome = "ok"
    except FormatError:
        outcome = "FormatError"
    t2 = time.perf_counter()
    dt = (c1 or time.process_time()) - c0   # CPU time: a busy machine's stalls don't count
    c = COUNTS.setdefault(name, [0, 0, 0.0])
    c[0] += 1
    c[1] += outcome == "ok"
    c[2] = max(c[2], dt)
    assert dt < PER_CASE_S, f"{name}: loading a case took {dt:.1f} s"
    assert t2 - t0 < READ_S, f"{name}: loading and reading a case took {t2 - t0:.1f} s"


@pytest.fixture(scope="module", autouse=True)
def report():
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    yield
    grow = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    for k, (n, ok, worst) in COUNTS.items():
        print(f"\nfuzz {k}: {n} cases, {ok} loaded, {n - ok} FormatError, slowest load {worst:.2f} s")
    assert grow < MAX_RSS_GROWTH, f"max RSS grew by {grow >> 20} MiB"


# ---------------------------------------------------------------------------------------------------------------------
# mutations

@st.composite
def mutated(draw, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "byte", "cut", "insert", "dup", "int"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data: data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and data: data[at] = draw(st.integers(0, 255))
        elif kind == "cut": del data[at:at + draw(st.integers(1, 64)) if draw(st.booleans()) else len(data)]
        elif kind == "insert": data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "dup": data[at:at] = data[at:at + draw(st.integers(1, 64))]
        elif kind == "int" and len(data) >= at + 8:   # an interesting length/offset value
            v = draw(st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, 255, 65535]))
            w = draw(st.sampled_from([1, 2, 4, 8]))
            data[at:at + w] = (v % (1 << (8 * w))).to_bytes(w, "little")
    return bytes(data)


# ---------------------------------------------------------------------------------------------------------------------
# safetensors

def safetensors_bytes() -> bytes:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        fn = os.path.join(d, "x.safetensors")
        safe_save({"a": Tensor.arange(6).float().reshape(2, 3), "b": Tensor.arange(3).cast("int16"),
                   "c": Tensor([True, False])}, fn, metadata={"k": "v"})
        with open(fn, "rb") as f: return f.read()


SAFE = safetensors_bytes()


@FUZZ
@given(mutated(SAFE))
def test_fuzz_safetensors_mutated(data):
    exercise("safetensors mutated", safe_load, data)


json_leaf = st.one_of(st.integers(-2**64, 2**64), st.floats(allow_nan=False), st.text(max_size=8), st.booleans(),
                      st.none())
json_val = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                                         max_size=4), max_leaves=12)
entry = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "X", "f32"]) | json_val,
    "shape": st.lists(st.integers(-2, 2**40), max_size=5) | json_val,
    "data_offsets": st.lists(st.integers(-8, 2**64), min_size=0, max_size=3) | json_val})


@FUZZ
@given(st.dictionaries(st.text(max_size=8), entry | json_val, max_size=5), st.binary(max_size=256),
       st.integers(-16, 16))
def test_fuzz_safetensors_generated_headers(header, body, skew):
    raw = json.dumps(header).encode()
    exercise("safetensors headers", safe_load, struct.pack("<Q", max(len(raw) + skew, 0)) + raw + body)


# ---------------------------------------------------------------------------------------------------------------------
# .pth: zip and legacy, made by torch.save (skipped without torch)

torch = pytest.importorskip("torch")


def pth_bytes(**kw) -> bytes:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 4, generator=g)
    sd = {"w": base, "t": base.t(), "row": base[1], "e": torch.zeros(1).expand(5), "i": torch.arange(4),
          "h": torch.ones(2, dtype=torch.float16), "meta": {"epoch": 3, "lr": [0.1, (1, "x")]}}
    f = io.BytesIO()
    torch.save(sd, f, **kw)
    return f.getvalue()


ZIP, LEGACY = pth_bytes(), pth_bytes(_use_new_zipfile_serialization=False)
with zipfile.ZipFile(io.BytesIO(ZIP)) as _z: ZIP_ENTRIES = {i.filename: _z.read(i.filename) for i in _z.infolist()}
PKL_NAME = next(n for n in ZIP_ENTRIES if n.endswith("data.pkl"))


def rezip(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for k, v in entries.items(): z.writestr(k, v)
    return out.getvalue()


@FUZZ
@given(mutated(ZIP))
def test_fuzz_pth_zip_mutated(data):
    exercise("pth zip mutated", torch_load, data)


@FUZZ
@given(mutated(ZIP_ENTRIES[PKL_NAME]))
def test_fuzz_pth_pickle_mutated(pkl):
    """Mutations of the pickle itself inside a well-formed zip: the restricted unpickler's inputs."""
    exercise("pth pickle mutated", torch_load, rezip({**ZIP_ENTRIES, PKL_NAME: pkl}))


@FUZZ
@given(mutated(LEGACY))
def test_fuzz_pth_legacy_mutated(data):
    exercise("pth legacy mutated", torch_load, data)


# ---------------------------------------------------------------------------------------------------------------------
# GGUF, written here

def gguf_str(s: bytes) -> bytes: return struct.pack("<Q", len(s)) + s


def gguf_bytes() -> bytes:
    kv = [(b"general.architecture", 8, gguf_str(b"llama")), (b"n", 4, struct.pack("<I", 7)),
          (b"arr", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 1, 2, 3)),
          (b"strs", 9, struct.pack("<IQ", 8, 2) + gguf_str(b"a") + gguf_str(b"bc"))]
    tensors = [(b"f32", [4, 2], 0, struct.pack("<8f", *range(8))), (b"q8", [32], 8, b"\x00\x3c" + bytes(range(32)))]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, t, v in kv: out += gguf_str(k) + struct.pack("<I", t) + v
    data, offs = b"", []
    for *_, raw in tensors:
        data += b"\0" * (-len(data) % 32)
        offs.append(len(data))
        data += raw
    for (name, dims, gt, _), off in zip(tensors, offs):
        out += gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", gt, off)
    return out + b"\0" * (-len(out) % 32) + data


GGUF = gguf_bytes()


def test_gguf_seed_is_valid():
    kv, ts = gguf_load(GGUF)
    assert kv["n"] == 7 and ts["f32"].shape == (2, 4) and ts["q8"].numpy()[1] == 1.0


@FUZZ
@given(mutated(GGUF))
def test_fuzz_gguf_mutated(data):
    exercise("gguf mutated", gguf_load, data)
