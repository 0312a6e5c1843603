"""tar_extract, zip_extract and TensorIO compared with Python's tarfile/zipfile reading the same archives; malformed
and truncated archives raise FormatError, members never reach past the archive."""
import io
import pathlib
import tarfile
import zipfile

import pytest

from fusegrad import Tensor
from fusegrad.nn.state import FormatError, TensorIO, tar_extract, zip_extract

FILES = {"a.txt": b"hello", "dir/b.bin": bytes(range(256)) * 3, "empty": b""}


def _tar(path):
    with tarfile.open(path, "w") as tar:
        for k, v in FILES.items():
            ti = tarfile.TarInfo(k)
            ti.size = len(v)
            tar.addfile(ti, io.BytesIO(v))
    return path


def _zip(path, compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a.txt", FILES["a.txt"], compress_type=zipfile.ZIP_STORED)
        z.writestr("dir/b.bin", FILES["dir/b.bin"], compress_type=compression)
    return path


@pytest.mark.parametrize("as_", ["name", "path", "disk", "memory"])
def test_tar_extract(tmp_path, as_):
    fn = _tar(tmp_path / "x.tar")
    src = {"name": str(fn), "path": fn, "disk": Tensor(pathlib.Path(fn)), "memory": Tensor(fn.read_bytes())}[as_]
    out = tar_extract(src)
    with tarfile.open(fn) as tar:
        want = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}
    assert {k: bytes(v.data()) for k, v in out.items()} == want
    if as_ != "memory": assert out["a.txt"].device.startswith("DISK:")   # slices of the file, read when used


@pytest.mark.parametrize("as_", ["path", "memory"])
def test_zip_extract(tmp_path, as_):
    fn = _zip(tmp_path / "x.zip")
    out = zip_extract(fn if as_ == "path" else Tensor(fn.read_bytes()))
    with zipfile.ZipFile(fn) as z: want = {n: z.read(n) for n in z.namelist()}
    assert {k: bytes(v.data()) for k, v in out.items()} == want


def test_zip_unsupported_compression(tmp_path):
    fn = _zip(tmp_path / "x.zip", zipfile.ZIP_BZIP2)
    with pytest.raises(NotImplementedError, match="compression"): zip_extract(fn)


def test_tensorio_like_bytesio():
    data = bytes(range(100))
    f, ref = TensorIO(Tensor(data)), io.BytesIO(data)
    for op in [lambda x: x.read(10), lambda x: x.seek(5, io.SEEK_CUR), lambda x: x.read(), lambda x: x.seek(-7, 2),
               lambda x: x.read(3), lambda x: x.tell(), lambda x: x.seek(0), lambda x: x.read(1000)]:
        assert op(f) == op(ref)
    assert f.seek(200) == 100 and f.read(5) == b""   # as tinygrad's TensorIO: seeking clamps to the end
    assert f.readable() and f.seekable() and not f.writable()
    with pytest.raises(ValueError): TensorIO(Tensor([1.0, 2.0]))
    with pytest.raises(Exception): f.write(b"x")


def test_hostile_archives(tmp_path):
    for fn in (tar_extract, zip_extract):
        with pytest.raises(FormatError): fn(Tensor(b"PK\x03\x04 garbage" * 40))
    # a truncated archive: its directory (zip) or a member (tar) points past the end
    z = _zip(tmp_path / "x.zip", zipfile.ZIP_STORED).read_bytes()
    with pytest.raises(FormatError): zip_extract(Tensor(z[: len(z) // 2]))
    t = _tar(tmp_path / "x.tar").read_bytes()
    with pytest.raises(FormatError): tar_extract(Tensor(t[:1536 + 100]))   # b.bin's data is cut
    with pytest.raises(TypeError): tar_extract(123)
