"""nn.datasets.cifar: the CIFAR-10 binary files or archive from data_dir, $CIFAR_DIR and the cache; the download
(served by a fake urlopen: this machine has no network); a clear error offline. Values checked byte for byte against
the records written."""
import io
import tarfile
import urllib.error

import numpy as np
import pytest

from fusegrad import dtypes
from fusegrad.nn import datasets
from fusegrad.nn.datasets import DatasetNotFound, cifar

from .helpers import serve


def fake_batches(n_per_batch=4, n_test=3, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name in datasets.CIFAR_FILES["train"] + datasets.CIFAR_FILES["test"]:
        n = n_test if name == "test_batch.bin" else n_per_batch
        out[name] = (rng.integers(0, 10, n, dtype=np.uint8), rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8))
    return out


def record_bytes(labels, images):
    return b"".join(bytes([lab]) + img.tobytes() for lab, img in zip(labels, images))


def write_bins(d, batches):
    d.mkdir(parents=True, exist_ok=True)
    for name, (lab, img) in batches.items(): (d / name).write_bytes(record_bytes(lab, img))


def archive_bytes(batches):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, (lab, img) in batches.items():
            data = record_bytes(lab, img)
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def check(out, batches):
    xtr, ytr, xte, yte = out
    assert all(t.dtype == dtypes.uint8 for t in out)
    train = [batches[n] for n in datasets.CIFAR_FILES["train"]]
    np.testing.assert_array_equal(xtr.numpy(), np.concatenate([img for _, img in train]))
    np.testing.assert_array_equal(ytr.numpy(), np.concatenate([lab for lab, _ in train]))
    np.testing.assert_array_equal(xte.numpy(), batches["test_batch.bin"][1])
    np.testing.assert_array_equal(yte.numpy(), batches["test_batch.bin"][0])
    assert xtr.shape == (20, 3, 32, 32) and xte.shape == (3, 3, 32, 32)


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("CIFAR_DIR", raising=False)
    monkeypatch.delenv("CIFAR_URL", raising=False)
    monkeypatch.setattr(datasets, "cache_dir", lambda: str(tmp_path / "cache"))

    def offline(*a, **k): raise urllib.error.URLError("network is unreachable (test)")
    monkeypatch.setattr(datasets.urllib.request, "urlopen", offline)
    return tmp_path


def test_data_dir_bin_files(isolated, capsys):
    b = fake_batches()
    write_bins(isolated / "mine" / "cifar-10-batches-bin", b)
    check(cifar(data_dir=isolated / "mine"), b)
    assert f"cifar: cifar-10, 20 train / 3 test images from {isolated / 'mine'}" in capsys.readouterr().err


def test_env_var_archive(isolated, monkeypatch):
    b = fake_batches(seed=1)
    (isolated / "env").mkdir()
    (isolated / "env" / datasets.CIFAR_ARCHIVE).write_bytes(archive_bytes(b))
    monkeypatch.setenv("CIFAR_DIR", str(isolated / "env"))
    check(cifar(), b)


def test_cache(isolated):
    b = fake_batches(seed=2)
    write_bins(isolated / "cache" / "datasets" / "cifar-10", b)
    check(cifar(), b)


def test_download_into_cache(isolated, monkeypatch, capsys):
    b = fake_batches(seed=3)
    served = serve(monkeypatch, datasets, lambda url: archive_bytes(b))
    check(cifar(), b)
    assert served == [datasets.CIFAR_URL]
    assert "downloaded from" in capsys.readouterr().err
    check(cifar(), b)                 # the second call reads the cached archive
    assert served == [datasets.CIFAR_URL]


def test_offline_error_says_how_to_get_it(isolated):
    with pytest.raises(DatasetNotFound) as e: cifar()
    msg = str(e.value)
    assert "network is unreachable" in msg and "CIFAR_DIR" in msg and str(isolated / "cache") in msg
    assert datasets.CIFAR_URL in msg


def test_bad_inputs(isolated):
    (isolated / "empty").mkdir()
    with pytest.raises(DatasetNotFound, match="neither the six CIFAR-10 binary files"):
        cifar(data_dir=isolated / "empty")
    b = fake_batches(seed=4)
    write_bins(isolated / "trunc", b)
    (isolated / "trunc" / "data_batch_3.bin").write_bytes(record_bytes(*b["data_batch_3.bin"])[:-5])
    with pytest.raises(ValueError, match="not a whole number"): cifar(data_dir=isolated / "trunc")
    write_bins(isolated / "label", b)
    raw = bytearray(record_bytes(*b["test_batch.bin"]))
    raw[0] = 42
    (isolated / "label" / "test_batch.bin").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="label 42"): cifar(data_dir=isolated / "label")
    (isolated / "arch").mkdir()
    (isolated / "arch" / datasets.CIFAR_ARCHIVE).write_bytes(b"not a tar")
    with pytest.raises(ValueError, match="not a readable CIFAR-10 archive"): cifar(data_dir=isolated / "arch")
