"""VIZ web server: the standard library's http.server on 127.0.0.1 serving the page in `assets/` and the VIZ data.

Endpoints: `/` (the page), `/assets/<file>`, `/api/index`, `/api/pass/<id>`, `/api/kernel/<id>`, `/api/timeline`,
`/api/all` (what VIZ_SAVE writes). Nothing is fetched from the internet: the page is plain HTML/JS/CSS.
"""
from __future__ import annotations

import errno
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css",
          ".svg": "image/svg+xml"}


def _local_host(host: str) -> bool:
    """Whether a Host header names this machine's loopback: localhost, 127.0.0.1 or [::1], with any port."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") and "]:" in host else host
    return name.lower() in ("localhost", "127.0.0.1", "[::1]")


def _handler(data: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    index = json.dumps(data["index"]).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None: pass  # quiet: the page makes many requests

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, obj: Any) -> None: self._send(200, json.dumps(obj).encode(), "application/json")

        def do_GET(self) -> None:
            # DNS rebinding: a page from evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example
            if not _local_host(self.headers.get("Host", "")):
                return self._send(403, b"VIZ only answers requests addressed to localhost or 127.0.0.1", "text/plain")
            path = self.path.split("?")[0]
            parts = [p for p in path.split("/") if p]
            if not parts: return self._asset("index.html")
            if parts[0] == "assets" and len(parts) == 2: return self._asset(parts[1])
            if parts[0] == "api":
                if parts[1:] == ["index"]: return self._send(200, index, "application/json")
                if parts[1:] == ["timeline"]: return self._json(data["timeline"])
                if parts[1:] == ["all"]: return self._json(data)
                if len(parts) == 3 and parts[1] in ("pass", "kernel"):
                    if not (parts[2].isascii() and parts[2].isdigit()):
                        return self._send(400, f"bad {parts[1]} id {parts[2][:40]!r}: expected an integer".encode(),
                                          "text/plain")
                    table = data["passes" if parts[1] == "pass" else "kernels"]
                    if int(parts[2]) < len(table): return self._json(table[int(parts[2])])
            self._send(404, f"not found: {path}".encode(), "text/plain")

        def _asset(self, name: str) -> None:
            # only the files shipped in assets/, by plain name (no path traversal)
            if name not in os.listdir(ASSETS): return self._send(404, b"no such asset", "text/plain")
            with open(os.path.join(ASSETS, name), "rb") as f: body = f.read()
            self._send(200, body, _TYPES.get(os.path.splitext(name)[1], "application/octet-stream"))

    return Handler


def make_server(data: dict[str, Any], port: int = 8000, tries: int = 20, quiet: bool = False) -> ThreadingHTTPServer:
    """Bind 127.0.0.1:`port` (0: any free port); when it is busy, try the next `tries - 1` ports and say so."""
    handler = _handler(data)
    for p in range(port, port + tries) if port else [0]:
        try:
            srv = ThreadingHTTPServer(("127.0.0.1", p), handler)
        except OSError as e:
            if e.errno != errno.EADDRINUSE: raise
            if not quiet: print(f"VIZ: port {p} is busy, trying {p + 1}")
            continue
        srv.daemon_threads = True
        return srv
    raise OSError(errno.EADDRINUSE, f"VIZ: ports {port}..{port + tries - 1} on 127.0.0.1 are all busy; set VIZ_PORT")


def url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/"


def serve_in_thread(data: dict[str, Any], port: int = 0) -> ThreadingHTTPServer:
    """Start serving in a daemon thread and return the server (`srv.shutdown()` stops it); for tests and notebooks."""
    srv = make_server(data, port, quiet=True)
    threading.Thread(target=srv.serve_forever, daemon=True, name="viz-server").start()
    return srv
