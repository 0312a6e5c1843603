"""torch_load on hostile files: every pickle here is assembled opcode by opcode by the test itself. Each must load
(what torch would give) or raise FormatError quickly: never read outside a storage, crash, blow up memory or time, or
change state that a later load sees."""
import io
import struct
import subprocess
import sys
import time
import zipfile
import zlib

import pytest

from fusegrad import Tensor
from fusegrad.nn.state import FormatError, torch_load

# ---------------------------------------------------------------------------------------------------------------------
# a tiny pickle assembler (protocol 2 opcodes)

PROTO, STOP, MARK, TUPLE, REDUCE, BUILD, BINPERSID = b"\x80\x02", b".", b"(", b"t", b"R", b"b", b"Q"
EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, SETITEM, APPEND, FALSE = b"}", b"]", b")", b"s", b"a", b"\x89"


def s(x: str) -> bytes: return b"X" + struct.pack("<I", len(x.encode())) + x.encode()
def i(n: int) -> bytes: return b"J" + struct.pack("<i", n)
def glob(mod: str, name: str) -> bytes: return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"
def put(k: int) -> bytes: return b"r" + struct.pack("<I", k)
def get(k: int) -> bytes: return b"j" + struct.pack("<I", k)
def tup(*xs: bytes) -> bytes: return MARK + b"".join(xs) + TUPLE


def storage(key: str, numel: int, kind: str = "FloatStorage") -> bytes:
    return tup(s("storage"), glob("torch", kind), s(key), s("cpu"), i(numel)) + BINPERSID


def tensor(st: bytes, offset: int, size: tuple, stride: tuple) -> bytes:
    return glob("torch._utils", "_rebuild_tensor_v2") + tup(
        st, i(offset), tup(*map(i, size)), tup(*map(i, stride)), FALSE, glob("collections", "OrderedDict") + EMPTY_TUPLE
        + REDUCE) + REDUCE


def state_dict(**items: bytes) -> bytes:
    return PROTO + EMPTY_DICT + b"".join(s(k) + v + SETITEM for k, v in items.items()) + STOP


def checkpoint(pkl: bytes, storages: dict[str, bytes], compress: int = zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        for k, v in storages.items(): z.writestr(f"archive/data/{k}", v, compress_type=compress)
    return out.getvalue()


def write(tmp_path, data: bytes, name: str = "x.pth"):
    fn = tmp_path / name
    fn.write_bytes(data)
    return fn


def test_assembler_makes_valid_checkpoints(tmp_path):
    fn = write(tmp_path, checkpoint(state_dict(w=tensor(storage("0", 4), 1, (3,), (1,))),
                                    {"0": struct.pack("<4f", 1, 2, 3, 4)}))
    assert torch_load(fn)["w"].tolist() == [2.0, 3.0, 4.0]


# ---------------------------------------------------------------------------------------------------------------------
# out-of-bounds reads

def build_numel_after_rebuild(numel: int, size: int) -> bytes:
    """A tensor checked against a storage of `numel` elements, then BUILD {'numel': 1} on that storage."""
    body = (EMPTY_DICT + s("w") + tensor(storage("0", numel) + put(1), 0, (size,), (1,)) + SETITEM
            + get(1) + EMPTY_DICT + s("numel") + i(1) + SETITEM + BUILD + b"0")   # b"0" = POP
    return checkpoint(PROTO + body + STOP, {"0": b"\0\0\0\0"})


def test_build_on_storage_cannot_shrink_it(tmp_path):
    with pytest.raises(FormatError, match="BUILD"): torch_load(write(tmp_path, build_numel_after_rebuild(64, 64)))


def test_build_on_storage_big_variant_no_crash(tmp_path):
    """The variant that reads far outside the storage: run in a child process so a crash can't take the tests down."""
    fn = write(tmp_path, build_numel_after_rebuild(1 << 26, 1 << 26))
    code = ("import sys\nfrom fusegrad.nn.state import torch_load, FormatError\n"
            f"try: torch_load({str(fn)!r})\nexcept FormatError as e: print('FormatError', e); sys.exit(0)\nsys.exit(3)")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "FormatError" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_view_checked_against_real_bytes(tmp_path):
    """The zip entry is shorter than the storage the pickle declares: caught, with the file named."""
    fn = write(tmp_path, checkpoint(state_dict(w=tensor(storage("0", 64), 0, (64,), (1,))), {"0": b"\0" * 4}))
    with pytest.raises(FormatError, match=r"x\.pth.*storage 0"): torch_load(fn)


# ---------------------------------------------------------------------------------------------------------------------
# poisoned state

def test_build_on_storage_type_does_not_poison_later_loads(tmp_path):
    evil = PROTO + glob("torch", "FloatStorage") + EMPTY_DICT + s("dtype") + i(7) + SETITEM + BUILD + STOP
    with pytest.raises(FormatError): torch_load(write(tmp_path, checkpoint(evil, {}), "evil.pth"))
    slots = PROTO + glob("torch._utils", "_rebuild_tensor_v2") + tup(b"N", EMPTY_DICT + s("__defaults__")
                                                                     + EMPTY_TUPLE + SETITEM) + BUILD + STOP
    with pytest.raises(FormatError): torch_load(write(tmp_path, checkpoint(slots, {}), "evil2.pth"))
    ok = checkpoint(state_dict(w=tensor(storage("0", 2), 0, (2,), (1,))), {"0": struct.pack("<2f", 5, 6)})
    assert torch_load(write(tmp_path, ok, "ok.pth"))["w"].tolist() == [5.0, 6.0]


# ---------------------------------------------------------------------------------------------------------------------
# memory and time blow-ups

def test_shared_list_dag_stays_shared(tmp_path):
    """60 levels of [prev, prev]: 2**60 leaves if expanded; loads instantly, sharing kept."""
    body = EMPTY_LIST + tensor(storage("0", 1), 0, (), ()) + APPEND + put(0) + b"0"   # b"0" = POP
    for k in range(1, 61): body += EMPTY_LIST + get(k - 1) + APPEND + get(k - 1) + APPEND + put(k) + b"0"
    body += get(60)
    fn = write(tmp_path, checkpoint(PROTO + EMPTY_DICT + s("x") + body + SETITEM + STOP, {"0": struct.pack("<f", 7)}))
    t0 = time.perf_counter()
    out = torch_load(fn)["x"]
    assert time.perf_counter() - t0 < 5
    assert out[0] is out[1]
    leaf = out
    while isinstance(leaf, list): leaf = leaf[0]
    assert isinstance(leaf, Tensor) and leaf.item() == 7.0


def test_cyclic_list_loads(tmp_path):
    body = EMPTY_LIST + put(0) + get(0) + APPEND
    out = torch_load(write(tmp_path, checkpoint(PROTO + body + STOP, {})))
    assert out[0] is out


def test_dag_tuple_as_dict_key_refused(tmp_path):
    """Hashing a 60-level shared-tuple DAG takes 2**60 steps: keys must be plain values."""
    body = EMPTY_TUPLE + put(0) + b"0"
    for k in range(1, 61): body += tup(get(k - 1), get(k - 1)) + put(k) + b"0"
    body += get(60)
    fn = write(tmp_path, checkpoint(PROTO + EMPTY_DICT + body + i(1) + SETITEM + STOP, {}))
    t0 = time.perf_counter()
    with pytest.raises(FormatError, match="key"): torch_load(fn)
    assert time.perf_counter() - t0 < 5


def test_stride0_view_stays_a_view(tmp_path):
    """A (2**16, 2**15) float32 tensor with stride 0 over a one-element storage: 8 GiB if materialized."""
    fn = write(tmp_path, checkpoint(state_dict(w=tensor(storage("0", 1), 0, (1 << 16, 1 << 15), (0, 0))),
                                    {"0": struct.pack("<f", 3)}))
    assert fn.stat().st_size < 2048
    t0 = time.perf_counter()
    w = torch_load(fn)["w"]
    assert w.shape == (1 << 16, 1 << 15) and w[5, :3].tolist() == [3.0, 3.0, 3.0]
    assert time.perf_counter() - t0 < 10


def test_overlapping_views_bounded(tmp_path):
    """A sliding-window view (stride (1, 1)) of 2**40 elements over a tiny storage is refused, not copied."""
    fn = write(tmp_path, checkpoint(state_dict(w=tensor(storage("0", 1 << 21), 0, (1 << 20, 1 << 20), (1, 1))),
                                    {"0": b"\0" * (4 << 21)}, compress=zipfile.ZIP_DEFLATED))
    with pytest.raises(FormatError, match="overlapping views"): torch_load(fn)


def test_many_views_of_one_storage_bounded(tmp_path):
    """300 distinct, nearly full views of one 4 MiB storage would copy 1.2 GB out of a ~20 KB file."""
    n = 1 << 20
    views = {f"v{k}": tensor(storage("0", n) if k == 0 else get(1), k, (n - 300,), (1,)) for k in range(300)}
    views["v0"] = tensor(storage("0", n) + put(1), 0, (n - 300,), (1,))
    fn = write(tmp_path, checkpoint(state_dict(**views), {"0": b"\0" * (4 * n)}, compress=zipfile.ZIP_DEFLATED))
    assert fn.stat().st_size < 100_000
    t0 = time.perf_counter()
    with pytest.raises(FormatError, match="overlapping views"): torch_load(fn)
    assert time.perf_counter() - t0 < 20


def test_deflated_entry_size_checked_before_inflating(tmp_path):
    """A ~80 KB deflated entry that inflates to 80 MiB is refused before it is inflated."""
    n = 20 << 20
    data = checkpoint(state_dict(w=tensor(storage("0", n), 0, (n,), (1,))), {"0": b"\0" * (4 * n)},
                      compress=zipfile.ZIP_DEFLATED)
    assert len(data) < 200_000
    with pytest.raises(FormatError, match="inflate"): torch_load(write(tmp_path, data))


def test_huge_memo_index_is_cheap(tmp_path):
    body = EMPTY_LIST + put(0xFFFFFFF0) + get(0xFFFFFFF0) + b"0"
    assert torch_load(write(tmp_path, checkpoint(PROTO + body + STOP, {}))) == []


def test_deep_nesting_is_a_format_error(tmp_path):
    pkl = PROTO + EMPTY_LIST * 100_000 + APPEND * 99_999 + STOP
    with pytest.raises(FormatError, match=r"x\.pth"): torch_load(write(tmp_path, checkpoint(pkl, {})))


def test_compressed_pickle_too(tmp_path):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("archive/data.pkl", PROTO + b"N" + b"0" * ((80 << 20) - 1) + STOP,
                   compress_type=zipfile.ZIP_DEFLATED)
    assert len(zlib.compress(b"0" * 1000)) < 100
    with pytest.raises(FormatError, match="inflate"): torch_load(write(tmp_path, out.getvalue()))


def test_long_text_line_in_legacy_pickle_is_fast():
    """A protocol-0 INT opcode whose line runs 40 MB: the line is found in C, not byte by byte in Python."""
    t0 = time.perf_counter()
    with pytest.raises(FormatError, match="<bytes>"): torch_load(b"\x80\x02I" + b"1" * (40 << 20))
    assert time.perf_counter() - t0 < 4


def test_empty_tensor_with_absurd_dimension(tmp_path):
    """Size (0, 2**60): no bytes, so the storage can't bound it; refused like the GGUF case the fuzzer found."""
    long1 = b"\x8a\x08" + (2**60).to_bytes(8, "little")      # LONG1: an 8-byte int
    body = glob("torch._utils", "_rebuild_tensor_v2") + tup(
        storage("0", 1), i(0), tup(i(0), long1), tup(i(1), i(1)), FALSE,
        glob("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE) + REDUCE
    fn = write(tmp_path, checkpoint(state_dict(w=body), {"0": b"\0" * 4}))
    with pytest.raises(FormatError, match=r"2\*\*48"): torch_load(fn)
