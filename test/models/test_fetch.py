"""fusegrad.fetch against a real HTTP server on 127.0.0.1: download, cache hits, sha256, HTTP errors, gunzip, paths."""
from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import pathlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import fusegrad
from fusegrad.helpers import DownloadError, fetch

FILES = {"/weights.bin": os.urandom(200_000), "/data.gz": gzip.compress(b"hello gunzip " * 1000),
         "/notgzip.gz": b"plain bytes, not gzip"}


class Server:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.agents: list[str | None] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                outer.agents.append(self.headers.get("X-Test"))
                body = FILES.get(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None: pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> Iterator[Server]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DISABLE_HTTP_CACHE", raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"): monkeypatch.delenv(var, raising=False)
    s = Server()
    yield s
    s.close()


def test_exported() -> None:
    assert fusegrad.fetch is fetch


def test_download_then_cache_hit(server: Server, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = fetch(server.url + "/weights.bin")
    assert p.read_bytes() == FILES["/weights.bin"]
    assert p.parent == tmp_path / "xdg" / "fusegrad" / "downloads" and p.name.endswith("-weights.bin")
    assert "weights.bin: [" in capsys.readouterr().err          # progress bar (the size was known)
    assert [f.name for f in p.parent.iterdir()] == [p.name]      # no temporary file left behind
    assert fetch(server.url + "/weights.bin") == p
    assert server.requests == ["/weights.bin"]                   # the second call was a cache hit
    fetch(server.url + "/weights.bin", allow_caching=False)
    assert server.requests == ["/weights.bin"] * 2


def test_headers_and_disable_http_cache(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    fetch(server.url + "/weights.bin", headers={"X-Test": "hello"})
    monkeypatch.setenv("DISABLE_HTTP_CACHE", "1")
    fetch(server.url + "/weights.bin")
    assert server.requests == ["/weights.bin"] * 2 and server.agents == ["hello", None]


def test_name_and_subdir(server: Server, tmp_path: pathlib.Path) -> None:
    p = fetch(server.url + "/weights.bin", name="w.bin", subdir="models")
    assert p == tmp_path / "xdg" / "fusegrad" / "downloads" / "models" / "w.bin"
    q = fetch(server.url + "/weights.bin", name=tmp_path / "elsewhere" / "x.bin")   # a Path: the whole destination
    assert q == tmp_path / "elsewhere" / "x.bin" and q.read_bytes() == FILES["/weights.bin"]


def test_sha256_ok_and_mismatch(server: Server) -> None:
    good = hashlib.sha256(FILES["/weights.bin"]).hexdigest()
    assert fetch(server.url + "/weights.bin", sha256=good.upper()).read_bytes() == FILES["/weights.bin"]
    with pytest.raises(ValueError, match="sha256 mismatch.*expected 0{64}.*deleted"):
        fetch(server.url + "/weights.bin", name="bad.bin", sha256="0" * 64)
    downloads = pathlib.Path(fusegrad.helpers.cache_dir()) / "downloads"
    assert not (downloads / "bad.bin").exists() and not list(downloads.glob(".*"))   # nor a temporary file


def test_cached_file_failing_sha256_is_downloaded_again(server: Server) -> None:
    p = fetch(server.url + "/weights.bin", name="w.bin")
    p.write_bytes(b"stale")
    good = hashlib.sha256(FILES["/weights.bin"]).hexdigest()
    assert fetch(server.url + "/weights.bin", name="w.bin", sha256=good).read_bytes() == FILES["/weights.bin"]
    assert server.requests == ["/weights.bin"] * 2


def test_404_says_url_and_where_to_put_the_file(server: Server) -> None:
    url = server.url + "/missing.pth"
    with pytest.raises(DownloadError) as e: fetch(url, name="missing.pth")
    msg = str(e.value)
    assert url in msg and "HTTP 404" in msg and str(pathlib.Path(fusegrad.helpers.cache_dir(), "downloads",
                                                                 "missing.pth")) in msg
    assert e.value.reason.startswith("HTTP 404")
    assert not any(pathlib.Path(fusegrad.helpers.cache_dir(), "downloads").iterdir())   # nothing half-written


def test_offline_error(server: Server) -> None:
    server.close()   # nothing listens on the port any more
    with pytest.raises(DownloadError, match=r"could not download http://127\.0\.0\.1:\d+/weights\.bin"):
        fetch(server.url + "/weights.bin", timeout=5)


def test_a_silent_server_costs_the_timeout(server: Server) -> None:
    """A server that accepts the connection and never answers: the error comes after about `timeout` seconds."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/weights.bin"
    try:
        st = time.monotonic()
        with pytest.raises(DownloadError, match="timed out|within 1 s"): fetch(url, timeout=1)
        assert time.monotonic() - st < 10
    finally:
        listener.close()


def test_a_hanging_name_lookup_costs_the_timeout(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """urlopen's timeout doesn't bound the name lookup; fetch's deadline does (here urlopen just never returns)."""
    release = threading.Event()
    monkeypatch.setattr("urllib.request.urlopen", lambda *a, **k: release.wait(30))
    st = time.monotonic()
    try:
        with pytest.raises(DownloadError, match=r"no answer from weights\.invalid within 1 s"):
            fetch("http://weights.invalid/w.pth", timeout=1)
        assert time.monotonic() - st < 10
    finally:
        release.set()


def test_gunzip(server: Server) -> None:
    p = fetch(server.url + "/data.gz", gunzip=True)
    assert p.read_bytes() == gzip.decompress(FILES["/data.gz"]) and p.name.endswith(".gunzip")
    assert fetch(server.url + "/data.gz", gunzip=True) == p and server.requests == ["/data.gz"]
    assert fetch(server.url + "/data.gz", gunzip=False).read_bytes() == FILES["/data.gz"]   # a separate cache entry
    with pytest.raises(ValueError, match="not valid gzip data"): fetch(server.url + "/notgzip.gz", gunzip=True)
    assert sorted(f.name for f in p.parent.iterdir() if "notgzip" in f.name) == []


def test_local_paths_pass_through(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    f = tmp_path / "model.pth"
    f.write_bytes(b"weights")
    assert fetch(f) == f and fetch(str(f)) == f and fetch(f.as_uri()) == f
    assert fetch(f, sha256=hashlib.sha256(b"weights").hexdigest()) == f
    with pytest.raises(ValueError, match="sha256 mismatch"): fetch(f, sha256="1" * 64)
    assert f.read_bytes() == b"weights"        # a user's own file is never deleted
    with pytest.raises(FileNotFoundError, match="nope.pth is not a file"): fetch(tmp_path / "nope.pth")
    g = tmp_path / "x.gz"
    g.write_bytes(gzip.compress(b"abc"))
    out = fetch(g, gunzip=True)
    assert out.read_bytes() == b"abc" and out.parent == tmp_path / "xdg" / "fusegrad" / "downloads"
    with pytest.raises(TypeError, match="expected a URL or a path"): fetch(3)  # type: ignore[arg-type]


def _all_files(root: pathlib.Path) -> set[pathlib.Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("kw", [{"subdir": "../.."}, {"subdir": ".."}, {"subdir": "a/../../b"}, {"name": ".."},
                                {"name": "."}, {"subdir": "/tmp"}, {"subdir": "ok", "name": ".."}])
def test_paths_stay_inside_the_cache(server: Server, tmp_path: pathlib.Path, kw: dict) -> None:
    """subdir/name can't lead out of cache_dir()/downloads: ValueError naming the argument, nothing requested or
    written anywhere under tmp_path (the cache lives there)."""
    before = _all_files(tmp_path)
    key = next(iter(kw)) if len(kw) == 1 else "name"
    with pytest.raises(ValueError, match=rf"fetch: {key}=.* would leave the cache folder"):
        fetch(server.url + "/weights.bin", **kw)
    assert server.requests == [] and _all_files(tmp_path) == before


def test_file_url_with_escaping_subdir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    g = tmp_path / "x.gz"
    g.write_bytes(gzip.compress(b"abc"))
    with pytest.raises(ValueError, match=r"fetch: subdir='\.\./\.\.' would leave the cache folder"):
        fetch(g.as_uri(), subdir="../..", gunzip=True)


def test_symlink_below_the_cache_leading_out(server: Server, tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    downloads = tmp_path / "xdg" / "fusegrad" / "downloads"
    downloads.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (downloads / "link").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the cache folder"):
        fetch(server.url + "/weights.bin", subdir="link", name="w.bin")
    assert list(outside.iterdir()) == [] and server.requests == []
    # a symlinked cache root is fine (the containment check resolves both sides)
    real = tmp_path / "real_cache"
    real.mkdir()
    (tmp_path / "xdg2").symlink_to(real)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg2"))
    p = fetch(server.url + "/weights.bin", subdir="nested/dir", name="w.bin")
    assert p.read_bytes() == FILES["/weights.bin"] and p.resolve().is_relative_to(real)
