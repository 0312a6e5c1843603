"""Process replay, regenerate side: rebuild each recorded kernel AST and render it with *another* checkout's code.

The parent (`fusegrad/replay/__main__.py`) runs this file's text with `python -c` and that checkout first on
PYTHONPATH: `python -c <text> DB OUT ROOT SHARD NSHARDS`. It writes one JSON line per kernel to OUT, either
`{"id": .., "src": ..}` or `{"id": .., "error": ..}`. Only the standard library is imported at module level, and of
fusegrad only long-stable names (`UOp`, `Context`, `to_program`, `Opt`), so it also runs against old checkouts.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import sqlite3
import sys
import traceback
from typing import Any

AST_FORMAT = 1  # (AST_FORMAT, [(op, dtype, source indices, arg), ...]) in toposort order, the root last


def loads_ast(blob: bytes) -> Any:
    """Rebuild a kernel AST through the UOp constructor, so equal nodes come back as the hash-consed originals."""
    from fusegrad.ir.ops import UOp
    fmt, nodes = pickle.loads(blob)
    if fmt != AST_FORMAT: raise ValueError(f"AST format {fmt}, this reader knows {AST_FORMAT}")
    built: list[Any] = []
    for op, dtype, srcs, arg in nodes: built.append(UOp(op, dtype, tuple(built[i] for i in srcs), arg))
    return built[-1]


def make_renderer(path: str, state: bytes) -> Any:
    """The renderer class named `module:qualname`, default-constructed where it can be, with the recorded instance
    attributes on top (CPU threads, SIMD width, OpenCL extensions...): the recording machine's renderer, no device."""
    mod, _, qualname = path.partition(":")
    cls: Any = importlib.import_module(mod)
    for part in qualname.split("."): cls = getattr(cls, part)
    renderer = cls.__new__(cls)
    try: cls.__init__(renderer)
    except TypeError: pass  # needs arguments: the recorded attributes stand in for what it would set
    renderer.__dict__.update(pickle.loads(state))
    return renderer


def replay_row(ast: bytes, renderer: str, renderer_state: bytes, noopt: int, opts: str | None) -> str:
    from fusegrad.codegen import to_program
    from fusegrad.helpers import Context
    opt_list = None
    if opts is not None:
        from fusegrad.codegen.opt import Opt
        opt_list = [Opt(*o) for o in json.loads(opts)]
    args = (loads_ast(ast), make_renderer(renderer, renderer_state)) + (() if opt_list is None else (opt_list,))
    with Context(NOOPT=noopt):
        return str(to_program(*args).src)


def describe(e: BaseException) -> str:
    """`Type: message (file:line)` of the innermost frame outside importlib, short enough for a report line."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<frozen") and f"{os.sep}importlib{os.sep}" not in f.filename]
    where = ""
    if frames:
        fn = "replay worker" if frames[-1].filename == "<string>" else os.path.basename(frames[-1].filename)
        where = f" ({fn}:{frames[-1].lineno})"
    msg = f"{type(e).__name__}: {e}"
    return (msg if len(msg) <= 400 else msg[:400] + "...") + where


def main(argv: list[str]) -> int:
    db, out, root, shard, nshards = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    with open(out, "w") as f:
        try:
            import fusegrad
            got = os.path.realpath(os.path.dirname(os.path.dirname(fusegrad.__file__)))
            if got != os.path.realpath(root): raise ImportError(f"fusegrad was imported from {got}, not from {root}")
        except Exception as e:
            f.write(json.dumps({"fatal": describe(e)}) + "\n")
            return 0
        conn = sqlite3.connect(db, timeout=60)
        rows = conn.execute("SELECT id, ast, renderer, renderer_state, noopt, opts FROM kernels "
                            "WHERE ast IS NOT NULL AND skipped IS NULL AND id % ? = ? ORDER BY id",
                            (nshards, shard)).fetchall()
        for rid, ast, renderer, state, noopt, opts in rows:
            try: res = {"id": rid, "src": replay_row(ast, renderer, state, noopt, opts)}
            except Exception as e: res = {"id": rid, "error": describe(e)}
            f.write(json.dumps(res) + "\n")
            f.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
