"""The DISK device: files as tensors. Reads of slices come from the file's bytes (compared with NumPy reading the
same file), writes land in the file, and bad paths or ranges past the end raise clear errors."""
import os
import pathlib

import numpy as np
import pytest

from fusegrad import Device, Tensor, dtypes


@pytest.fixture
def int16_file(tmp_path):
    fn = tmp_path / "a.bin"
    np.arange(64, dtype=np.int16).tofile(fn)
    return fn


def test_found_by_name(int16_file):
    dev = Device[f"disk:{int16_file}"]
    assert type(dev).__module__ == "fusegrad.runtime.ops_disk" and dev.size() == 128
    with pytest.raises(RuntimeError, match="path"): Device["DISK"]


def test_path_tensor_and_slices(int16_file):
    ref = np.fromfile(int16_file, np.uint8)
    t = Tensor(pathlib.Path(int16_file))
    assert t.device == f"DISK:{int16_file.resolve()}" and t.dtype == dtypes.uint8 and t.shape == (128,)
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(t[10:30].numpy(), ref[10:30])
    np.testing.assert_array_equal(t[10:30].to("CPU").numpy(), ref[10:30])
    got = Tensor.empty(128, dtype=dtypes.uint8, device=f"disk:{int16_file}")[6:22].bitcast(dtypes.int16).to("CPU")
    np.testing.assert_array_equal(got.numpy(), ref[6:22].view(np.int16))
    typed = Tensor(pathlib.Path(int16_file), dtype=dtypes.int16)
    ref16 = ref.view(np.int16)
    np.testing.assert_array_equal(typed.reshape(8, 8)[2:5].to("CPU").numpy(), ref16.reshape(8, 8)[2:5])
    np.testing.assert_array_equal(typed.reshape(8, 8)[:, 1:3].to("CPU").numpy(), ref16.reshape(8, 8)[:, 1:3])
    np.testing.assert_array_equal((typed[3:9].to("CPU") * 2 + 1).numpy(), ref16[3:9] * 2 + 1)
    np.testing.assert_array_equal(typed[3:9].float().numpy(), ref16[3:9].astype(np.float32))  # computed: off DISK


def test_reads_only_the_range_used(int16_file):
    """A slice reads its bytes only: a file shorter than the DISK tensor still serves the slices inside it."""
    t = Tensor.empty(10_000, dtype=dtypes.uint8, device=f"disk:{int16_file}")
    np.testing.assert_array_equal(t[100:120].to("CPU").numpy(), np.fromfile(int16_file, np.uint8)[100:120])
    with pytest.raises(ValueError, match="past the end"): t[120:140].to("CPU").numpy()


def test_write_to_disk(tmp_path):
    fn = tmp_path / "out.bin"
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    d = Tensor(x).to(f"disk:{fn}").realize()
    assert d.device == f"DISK:{fn}"
    np.testing.assert_array_equal(np.fromfile(fn, np.float32).reshape(3, 5), x)
    np.testing.assert_array_equal(d.numpy(), x)
    # assign into part of the file
    d[1:2].assign(Tensor(np.full((1, 5), 7.0, np.float32)))
    x[1] = 7.0
    np.testing.assert_array_equal(np.fromfile(fn, np.float32).reshape(3, 5), x)
    np.testing.assert_array_equal(d.to("CPU").numpy(), x)
    # a new file through Tensor.empty + assign
    fn2 = tmp_path / "new.bin"
    e = Tensor.empty(4, dtype=dtypes.int32, device=f"disk:{fn2}")
    e.assign(Tensor([1, 2, 3, 4], dtype=dtypes.int32))
    np.testing.assert_array_equal(np.fromfile(fn2, np.int32), [1, 2, 3, 4])
    with pytest.raises(RuntimeError, match="contiguous"): d[:, 1:3].assign(Tensor.zeros(3, 2))


def test_constants_made_for_disk_do_not_touch_the_file(int16_file):
    before = int16_file.read_bytes()
    t = Tensor(pathlib.Path(int16_file))
    _ = t[0:8].bitcast(dtypes.int32).to("CPU").numpy()   # bitcast to a wider dtype makes helper constants
    assert int16_file.read_bytes() == before


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"): Tensor(pathlib.Path(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        Tensor.empty(4, dtype=dtypes.uint8, device=f"disk:{tmp_path}/missing").numpy()
    fn = tmp_path / "small.bin"
    fn.write_bytes(b"abc")
    with pytest.raises(ValueError, match=r"\[0, 8\) past the end of the 3-byte file"):
        Tensor.empty(8, dtype=dtypes.uint8, device=f"disk:{fn}").numpy()
    assert fn.read_bytes() == b"abc" and os.path.getsize(fn) == 3


def test_big_file_slice_reads_little(tmp_path):
    """A slice of a large sparse file: only its bytes are read, and the file's size isn't counted as memory in use."""
    from fusegrad.helpers import GlobalCounters
    fn = tmp_path / "big.bin"
    with open(fn, "wb") as f:
        f.truncate(1 << 30)   # 1 GiB, sparse
        f.seek(123456)
        f.write(b"\x01\x02\x03")
    before = GlobalCounters.mem_used
    t = Tensor(pathlib.Path(fn))
    assert t[123455:123460].to("CPU").tolist() == [0, 1, 2, 3, 0]
    assert GlobalCounters.mem_used - before < 1 << 20


def test_loaders_take_disk_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    from fusegrad.nn.state import safe_load, safe_save, torch_load
    fn = tmp_path / "m.pth"
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}, fn)
    np.testing.assert_array_equal(torch_load(Tensor(pathlib.Path(fn)))["w"].numpy(), np.arange(6).reshape(2, 3))
    sfn = tmp_path / "m.safetensors"
    safe_save({"a": Tensor([1, 2, 3], dtype=dtypes.int16)}, sfn)
    assert safe_load(Tensor(pathlib.Path(sfn)))["a"].tolist() == [1, 2, 3]
