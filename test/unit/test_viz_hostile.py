"""VIZ/PROFILE against a hostile machine: symlinks planted in the shared temp dir, DNS-rebinding Host headers and
malformed API paths."""
import os
import socket

import pytest

from fusegrad.viz import default_profile_path, default_save_path
from fusegrad.viz.serialize import save, write_profile
from fusegrad.viz.server import serve_in_thread

DATA = {"index": {"version": 0, "kernels": []}, "passes": [{"nodes": []}], "kernels": [], "timeline": []}


def test_planted_symlinks_are_not_followed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("PROFILE_PATH", raising=False)
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    # the old fixed names in the shared temp dir, and the .tmp names next to the targets
    for name in ("fusegrad_viz.json.tmp", "fusegrad_profile.json.tmp", "fusegrad_viz.json", "fusegrad_profile.json"):
        os.symlink(victim, tmp_path / name)
    for p in (default_save_path(), default_profile_path()):
        assert os.path.dirname(p) != str(tmp_path) and (os.stat(os.path.dirname(p)).st_mode & 0o777) == 0o700
        os.symlink(victim, p + ".tmp")
    save(default_save_path(), DATA)
    write_profile(default_profile_path())
    save(str(tmp_path / "fusegrad_viz.json"), DATA)   # an explicit path that is a symlink: replaced, not followed
    assert victim.read_text() == "precious"
    assert not os.path.islink(tmp_path / "fusegrad_viz.json")


def test_private_dir_planted_by_someone_else_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / f"fusegrad-{os.getuid()}")
    with pytest.raises(PermissionError, match="not a private directory"): default_save_path()


def request(srv, path: str, host: str) -> tuple[int, bytes]:
    """A raw request (http.client would refuse the non-ASCII paths): the status code and the whole response."""
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10) as s:
        s.sendall(b"GET " + path.encode("latin-1") + b" HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
        out = b""
        while (chunk := s.recv(65536)): out += chunk
    return int(out.split()[1]), out


def test_server_checks_host_and_ids():
    srv = serve_in_thread(DATA)
    port = srv.server_address[1]
    try:
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
            assert request(srv, "/api/pass/0", host)[0] == 200, host
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", ""):
            assert request(srv, "/api/pass/0", host)[0] == 403, host
        for bad in ("/api/pass/x", "/api/pass/%C2%B2", "/api/kernel/-1", "/api/pass/\u00b2", "/api/kernel/\u00b2"):
            assert request(srv, bad, "localhost")[0] == 400, bad
    finally:
        srv.shutdown()
        srv.server_close()
