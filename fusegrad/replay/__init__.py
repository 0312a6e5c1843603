"""Process replay, capture side: with CAPTURE_PROCESS_REPLAY=1 the engine hands every kernel it compiles to
`capture_kernel`, which stores the kernel AST, the renderer, the codegen flags and the rendered source in an sqlite db.

`python -m fusegrad.replay compare` later renders every recorded AST again with other code and shows which sources
changed (docs/debugging.md, "Process replay"). Nothing here is imported unless the flag is on.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import sqlite3
import sys
import threading
import time
from typing import Any

import fusegrad.codegen as codegen
from fusegrad.helpers import BEAM, NOOPT, cache_dir
from fusegrad.ir.ops import UOp
from fusegrad.replay.worker import AST_FORMAT, loads_ast

SCHEMA = """
CREATE TABLE IF NOT EXISTS kernels (
  id INTEGER PRIMARY KEY,
  key TEXT UNIQUE,         -- sha256 of everything that determines the source, and the source
  name TEXT, device TEXT,
  renderer TEXT,           -- module:qualname of the renderer class
  renderer_state BLOB,     -- pickle of the renderer's instance attributes
  ast BLOB,                -- dumps_ast(kernel AST); NULL when it couldn't be recorded (see error)
  noopt INTEGER, beam INTEGER,
  opts TEXT,               -- JSON [[op, axis, amount], ...] from BEAM, NULL for the hand-coded heuristic
  src TEXT, test TEXT, origin TEXT, pid INTEGER,
  error TEXT,              -- why the kernel couldn't be recorded (compare reports it as couldn't replay)
  skipped TEXT);           -- why replaying it would prove nothing (compare counts it apart)
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
"""


def db_path() -> str:
    """$PROCESS_REPLAY_DB, else process_replay.db in fusegrad's cache directory (read on every capture)."""
    return os.getenv("PROCESS_REPLAY_DB") or os.path.join(cache_dir(), "process_replay.db")


def dumps_ast(ast: UOp) -> bytes:
    """A kernel AST as a flat pickle: one (op, dtype, source indices, arg) per node in toposort order. Unlike
    pickling the root (UOp.__reduce__ recurses), any depth works; `loads_ast` rebuilds through the constructor."""
    nodes = list(ast.toposort())
    num = {n: i for i, n in enumerate(nodes)}
    return pickle.dumps((AST_FORMAT, [(n.op, n.dtype, tuple(num[s] for s in n.src), n.arg) for n in nodes]))


def renderer_state(renderer: Any) -> bytes:
    """The renderer's instance attributes (what the device set on it), each kept only if it pickles."""
    keep = {}
    for k, v in getattr(renderer, "__dict__", {}).items():
        try: pickle.dumps(v)
        except Exception: continue
        keep[k] = v
    return pickle.dumps(keep)


def connect(path: str) -> sqlite3.Connection:
    """Open (creating if needed) a replay db in WAL mode, which lets several processes (pytest-xdist) write."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    conn = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    _retry(lambda: conn.execute("PRAGMA journal_mode=WAL"))
    _retry(lambda: conn.executescript(SCHEMA))
    return conn


def _retry(fn: Any, tries: int = 20) -> Any:
    """sqlite's busy timeout covers most contention; a few more tries cover the rest (WAL setup, checkpoints)."""
    for i in range(tries):
        try: return fn()
        except sqlite3.OperationalError as e:
            if i == tries - 1 or ("locked" not in str(e) and "busy" not in str(e)): raise
            time.sleep(0.05 * (i + 1))


_lock = threading.Lock()  # kernels are compiled on a thread pool (engine/realize.py)
_conns: dict[tuple[int, str], sqlite3.Connection] = {}


def _test_name() -> str:
    """The pytest test that is running ("path::test (call)" without the phase), or ""."""
    name = os.environ.get("PYTEST_CURRENT_TEST", "")
    return name.rsplit(" (", 1)[0] if name.endswith(")") else name


def _patched_codegen() -> str | None:
    """A test that replaces `codegen.to_program` (to force opts) compiles kernels replay can't reproduce."""
    code = getattr(codegen.to_program, "__code__", None)
    if code is not None and code.co_name == "to_program" and code.co_filename == codegen.__file__: return None
    return f"compiled through a replaced codegen.to_program ({getattr(codegen.to_program, '__qualname__', '?')})"


def capture_kernel(ast: UOp, device: str, renderer: Any, opts: list | None, spec: Any) -> None:
    """Record one compiled kernel. A kernel whose AST can't be serialized is still recorded, with the error, so
    `compare` reports it instead of silently proving nothing about it."""
    row: dict[str, Any] = {"name": spec.display_name or spec.name, "device": device, "src": spec.src,
                           "renderer": f"{type(renderer).__module__}:{type(renderer).__qualname__}",
                           "noopt": int(bool(NOOPT.value)), "beam": int(BEAM.value or 0), "test": _test_name(),
                           "origin": " ".join(sys.argv)[:300], "pid": os.getpid(), "error": None,
                           "skipped": _patched_codegen(),
                           "opts": None if opts is None else json.dumps([list(dataclasses.astuple(o)) for o in opts])}
    try: row["ast"], row["renderer_state"] = dumps_ast(ast), renderer_state(renderer)
    except Exception as e: row["ast"], row["renderer_state"], row["error"] = None, None, f"{type(e).__name__}: {e}"
    h = hashlib.sha256()  # the same kernel compiled again (another process, another test) is stored once
    for k in ("ast", "device", "renderer", "renderer_state", "noopt", "opts", "src", "error", "skipped"):
        h.update(row[k] if isinstance(row[k], bytes) else repr(row[k]).encode())
    row["key"] = h.hexdigest()
    where = (os.getpid(), db_path())  # per process: a connection must not cross a fork
    with _lock:
        if where not in _conns: _conns[where] = connect(where[1])
        conn = _conns[where]
        _retry(lambda: conn.execute(f"INSERT OR IGNORE INTO kernels ({', '.join(row)}) VALUES "
                                    f"({', '.join('?' * len(row))})", tuple(row.values())))


__all__ = ["capture_kernel", "connect", "db_path", "dumps_ast", "loads_ast"]
