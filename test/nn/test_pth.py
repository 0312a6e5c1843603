"""torch_load: PyTorch checkpoints written by torch.save (zip and legacy formats) read without torch, the restricted
unpickler's refusal of arbitrary globals, and clear errors for malformed files."""
import io
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes, nn
from fusegrad.nn.state import FormatError, UnsafePickleError, load_state_dict, torch_load

from .helpers import rand

FORMATS = {"zip": {}, "legacy": {"_use_new_zipfile_serialization": False}}
TORCH_TO_FG = {torch.float32: dtypes.float32, torch.float16: dtypes.float16, torch.bfloat16: dtypes.bfloat16,
               torch.float64: dtypes.float64, torch.int64: dtypes.int64, torch.int32: dtypes.int32,
               torch.int16: dtypes.int16, torch.int8: dtypes.int8, torch.uint8: dtypes.uint8, torch.bool: dtypes.bool}


def varied_state() -> dict:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    sd = {f"x_{str(dt).split('.')[-1]}": (torch.randn(3, 5, generator=g) * 20).to(dt) for dt in TORCH_TO_FG}
    sd.update({"transposed": base.t(),                      # non-contiguous strides
               "row": base[2],                              # a view at a storage offset
               "strided": base[:, ::2],                     # a strided view sharing base's storage
               "base": base, "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
               "param": torch.nn.Parameter(torch.ones(2, 2))})
    return sd


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_load_matches_torch(tmp_path, fmt):
    sd = varied_state()
    fn = tmp_path / f"{fmt}.pth"
    torch.save(sd, fn, **FORMATS[fmt])
    ours = torch_load(fn)
    assert list(ours) == list(sd)
    for k, v in sd.items():
        t = ours[k]
        assert isinstance(t, Tensor) and t.shape == tuple(v.shape) and t.dtype == TORCH_TO_FG[v.dtype], k
        expect = v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
        got = t.float().numpy() if v.dtype == torch.bfloat16 else t.numpy()
        np.testing.assert_array_equal(got, expect, err_msg=k)


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_checkpoint_into_fusegrad_model(tmp_path, fmt):
    """A torch model's state_dict, saved by torch and loaded here, gives the same eval outputs."""
    tm = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.Flatten(),
                             torch.nn.Linear(4 * 4 * 4, 3))
    tm.train()
    for _ in range(2): tm(torch.randn(5, 2, 6, 6))    # move the running stats away from their init
    tm.eval()
    fn = tmp_path / "model.pth"
    torch.save({"model": tm.state_dict(), "epoch": 3, "lr": [0.1, 0.01]}, fn, **FORMATS[fmt])

    class Model:
        def __init__(self):
            self.layers = [nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), None, None, nn.Linear(4 * 4 * 4, 3)]

        def __call__(self, x):
            x = self.layers[1](self.layers[0](x)).relu()
            return self.layers[4](x.flatten(1))
    ckpt = torch_load(fn)
    assert ckpt["epoch"] == 3 and ckpt["lr"] == [0.1, 0.01]
    m = Model()
    load_state_dict(m, {f"layers.{k}": v for k, v in ckpt["model"].items()})
    assert m.layers[1].num_batches_tracked.item() == 2
    x = rand(3, 2, 6, 6, seed=5)
    np.testing.assert_allclose(m(Tensor(x)).numpy(), tm(torch.tensor(x)).detach().numpy(), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------------
# the restricted unpickler

class Evil:
    def __init__(self, path): self.path = path
    def __reduce__(self): return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("fmt", FORMATS)
def test_rejects_os_system(tmp_path, fmt):
    marker = tmp_path / "pwned"
    fn = tmp_path / "evil.pth"
    torch.save({"weight": torch.ones(2), "payload": Evil(marker)}, fn, **FORMATS[fmt])
    with pytest.raises(UnsafePickleError, match=r"evil\.pth.*'(posix|os)\.system'.*not allowed"):
        torch_load(fn)
    assert not marker.exists()


@pytest.mark.parametrize("module,name", [("builtins", "eval"), ("builtins", "getattr"), ("subprocess", "Popen"),
                                         ("torch._utils", "_rebuild_tensor"), ("torch", "load")])
def test_rejects_other_globals(tmp_path, module, name):
    # a hand-made protocol-2 pickle: GLOBAL module.name, a string arg, REDUCE, STOP, inside a valid zip checkpoint
    payload = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X\x04\x00\x00\x001+1=\x85R."
    fn = tmp_path / "g.pth"
    with zipfile.ZipFile(fn, "w") as z: z.writestr("g/data.pkl", payload)
    with pytest.raises(UnsafePickleError, match=f"'{module}.{name}'"): torch_load(fn)
    assert issubclass(UnsafePickleError, ValueError)


def test_rejects_whole_pickled_module(tmp_path):
    """Saving a whole nn.Module (not its state_dict) needs torch's classes: refused with a hint."""
    fn = tmp_path / "full.pth"
    torch.save(torch.nn.Linear(2, 2), fn)
    with pytest.raises(UnsafePickleError, match="state_dict"): torch_load(fn)


# ---------------------------------------------------------------------------------------------------------------------
# malformed files

def zip_bytes(tmp_path) -> bytes:
    fn = tmp_path / "ok.pth"
    torch.save({"a": torch.arange(100, dtype=torch.float32)}, fn)
    return fn.read_bytes()


def legacy_bytes(tmp_path) -> bytes:
    fn = tmp_path / "ok_legacy.pth"
    torch.save({"a": torch.arange(100, dtype=torch.float32)}, fn, _use_new_zipfile_serialization=False)
    return fn.read_bytes()


def rewrite_zip(data: bytes, drop: str | None = None, replace: dict | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            if drop and info.filename.endswith(drop): continue
            body = zin.read(info.filename)
            for suffix, new in (replace or {}).items():
                if info.filename.endswith(suffix): body = new
            zout.writestr(info.filename, body)
    return out.getvalue()


def past_storage_pickle(z: bytes) -> bytes:
    """The checkpoint's data.pkl with the tensor's size changed from (100,) to (200,): more than its storage holds."""
    with zipfile.ZipFile(io.BytesIO(z)) as zf:
        pkl = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    size_100 = b"QK\x00Kd\x85"          # BINPERSID, offset 0, BININT1 100, TUPLE1
    assert pkl.count(size_100) == 1
    return pkl.replace(size_100, b"QK\x00K\xc8\x85")


@pytest.mark.parametrize("case", ["empty", "garbage", "zip_truncated", "legacy_truncated", "legacy_cut_pickle",
                                  "no_data_pkl", "missing_storage", "short_storage", "bad_pickle", "tar",
                                  "bad_magic", "bad_persistent_id", "tensor_past_storage"])
def test_malformed_checkpoints(tmp_path, case):
    z, lg = zip_bytes(tmp_path), legacy_bytes(tmp_path)
    bad_pid = b"\x80\x02(X\x07\x00\x00\x00storageq\x00tQ."              # persistent id ('storage',) only
    blobs = {
        "empty": b"", "garbage": os.urandom(64).replace(b"P", b"Q").replace(b"\x80", b"\x81"),
        "zip_truncated": z[:len(z) // 2], "legacy_truncated": lg[:-40], "legacy_cut_pickle": lg[:60],
        "no_data_pkl": rewrite_zip(z, drop="data.pkl"), "missing_storage": rewrite_zip(z, drop="data/0"),
        "short_storage": rewrite_zip(z, replace={"data/0": b"\0" * 12}),
        "bad_pickle": rewrite_zip(z, replace={"data.pkl": b"\x80\x02}q\x00(X\x01"}),
        "tar": b"\0" * 257 + b"ustar" + b"\0" * 250,
        "bad_magic": pickle.dumps(12345, protocol=2) + pickle.dumps(1001, protocol=2),
        "bad_persistent_id": rewrite_zip(z, replace={"data.pkl": bad_pid}),
        "tensor_past_storage": rewrite_zip(z, replace={"data.pkl": past_storage_pickle(z)}),
    }
    fn = tmp_path / f"{case}.pth"
    fn.write_bytes(blobs[case])
    with pytest.raises(FormatError, match=str(fn).replace(".", r"\.")):
        torch_load(fn)


def test_legacy_storage_sizes_checked(tmp_path):
    lg = bytearray(legacy_bytes(tmp_path))
    # the data block starts with the storage's element count: make it disagree with the pickle
    at = len(lg) - 100 * 4 - 8
    assert struct.unpack("<q", lg[at:at + 8])[0] == 100
    lg[at:at + 8] = struct.pack("<q", 99)
    fn = tmp_path / "sizes.pth"
    fn.write_bytes(bytes(lg))
    with pytest.raises(FormatError, match="99 elements"): torch_load(fn)
