"""VIZ and PROFILE: see every pass, kernel and timeline of a run in a browser or a terminal (docs/debugging.md).

`VIZ=1` records every named graph_rewrite pass, every compiled kernel and a timeline; at exit it serves them on
127.0.0.1 (interactive terminals only) or saves them. `PROFILE=1` writes the timeline as Chrome trace-event JSON.
From Python:

    >>> from fusegrad import Context, Tensor
    >>> import fusegrad.viz as viz
    >>> with Context(VIZ=1): _ = (Tensor([1.0, 2.0]) * 3).realize()
    >>> any(k["name"].startswith("E_") for k in viz.build_data()["kernels"])
    True
"""
from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from fusegrad.helpers import PROFILE, VIZ
from fusegrad.viz.recorder import RECORDER, sync_hooks
from fusegrad.viz.serialize import build_data, load, private_dir, save, write_profile
from fusegrad.viz.server import make_server, serve_in_thread, url

__all__ = ["build_data", "save", "load", "write_profile", "serve", "serve_in_thread", "clear", "default_save_path",
           "default_profile_path"]


def default_save_path() -> str: return os.path.join(private_dir(), "fusegrad_viz.json")
def default_profile_path() -> str:
    return os.getenv("PROFILE_PATH") or os.path.join(private_dir(), "fusegrad_profile.json")


def clear() -> None:
    """Forget everything recorded so far."""
    RECORDER.clear()


def serve(data: dict[str, Any] | None = None, port: int | None = None, block: bool = True) -> Any:
    """Serve the VIZ page on 127.0.0.1 (`VIZ_PORT`, default 8000, or the next free port) and print its URL.

    With `block=True` it serves until Ctrl-C; otherwise it returns the running server (call `.shutdown()`)."""
    data = build_data() if data is None else data
    port = int(os.getenv("VIZ_PORT", "8000")) if port is None else port
    if not block:
        srv = serve_in_thread(data, port)
        print(f"VIZ: serving at {url(srv)}")
        return srv
    srv = make_server(data, port)
    print(f"VIZ: serving at {url(srv)} (Ctrl-C to stop)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return None


def _interactive() -> bool:
    return sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty()


def at_exit() -> None:
    """VIZ/PROFILE set in the environment: write the profile, save the VIZ data, and serve it when a person is
    watching (an interactive terminal, and VIZ_NO_SERVE unset); otherwise say where the data went."""
    if PROFILE.value and RECORDER.events:
        print(f"PROFILE: wrote {len(RECORDER.events)} timeline events to {write_profile(default_profile_path())} "
              "(open it in https://ui.perfetto.dev or chrome://tracing)")
    if not VIZ.value: return
    data = build_data()
    path = os.getenv("VIZ_SAVE")
    if path: print(f"VIZ: saved to {save(path, data)}")
    if os.getenv("VIZ_NO_SERVE", "") not in ("", "0"): return
    if not _interactive():
        if not path: path = save(default_save_path(), data)
        print(f"VIZ: not serving (not an interactive terminal); view the data with "
              f"`python -m fusegrad.viz --serve --file {path}` or `python -m fusegrad.viz --list --file {path}`")
        return
    serve(data)


def start_from_env() -> None:
    """Called when fusegrad is imported with VIZ or PROFILE set: record from now on, show or save at exit."""
    sync_hooks()
    atexit.register(at_exit)
