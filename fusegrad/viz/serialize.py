"""VIZ data as JSON: the recorder's contexts, passes, kernels and timeline -> one dict (what VIZ_SAVE writes and the
web server and terminal viewer read), and the timeline -> Chrome trace-event JSON (PROFILE).

A graph is a flat node table: each node is `[op, dtype, arg, [source ids]]`, sources before users, so a 10k-node
graph is a few hundred KB.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from collections import Counter
from typing import Any

from fusegrad.codegen import format_linear
from fusegrad.ir.ops import UOp
from fusegrad.ir.pattern import RewriteTrace
from fusegrad.viz.recorder import RECORDER, Event, KernelRecord, Recorder, VizContext

FORMAT_VERSION = 1
ARG_CHARS = 80    # longer args are cut (a PARAM's buffer, a long tuple)
MAX_MATCHES = 2000  # per pass: the rule counts always cover every match


def _arg(u: UOp) -> str:
    if u.arg is None: return ""
    s = repr(u.arg)
    return s if len(s) <= ARG_CHARS else s[:ARG_CHARS - 3] + "..."


class GraphTable:
    """Numbers the nodes of one or more graphs (shared nodes once) and emits them as rows."""
    def __init__(self) -> None:
        self.ids: dict[UOp, int] = {}
        self.rows: list[list[Any]] = []

    def add(self, root: UOp) -> int:
        for u in root.toposort():
            if u not in self.ids:
                self.ids[u] = len(self.rows)
                self.rows.append([u.op.name, str(u.dtype).removeprefix("dtypes."), _arg(u),
                                  [self.ids[s] for s in u.src]])
        return self.ids[root]


def graph_json(root: UOp) -> dict[str, Any]:
    t = GraphTable()
    r = t.add(root)
    return {"nodes": t.rows, "root": r}


def _loc(loc: tuple[str, int]) -> str: return f"{loc[0]}:{loc[1]}"


def pass_json(pid: int, ctx: int, tr: RewriteTrace) -> dict[str, Any]:
    """A pass: one node table for before and after; `removed`/`added` are the nodes only one side has, `made_by`
    names the rule that produced each added node."""
    t = GraphTable()
    before = t.add(tr.before)
    after = t.add(tr.after if tr.after is not None else tr.before)
    bset, aset = set(tr.before.toposort()), set((tr.after or tr.before).toposort())
    made_by: dict[int, str] = {}
    for loc, _, new in tr.matches:
        if new in aset: made_by[t.ids[new]] = _loc(loc)
    counts = Counter(_loc(loc) for loc, _, _ in tr.matches)
    return {"id": pid, "ctx": ctx, "name": tr.name, "nodes": t.rows, "before": before, "after": after,
            "n_before": len(bset), "n_after": len(aset),
            "removed": sorted(t.ids[u] for u in bset - aset), "added": sorted(t.ids[u] for u in aset - bset),
            "rules": [{"loc": loc, "count": n} for loc, n in counts.most_common()],
            "matches": [[_loc(loc), old.op.name, new.op.name] for loc, old, new in tr.matches[:MAX_MATCHES]],
            "made_by": {str(k): v for k, v in made_by.items()}}


def kernel_json(kid: int, ctx: int, k: KernelRecord) -> dict[str, Any]:
    return {"id": kid, "ctx": ctx, "name": k.name, "device": k.device, "renderer": k.renderer, "opts": k.opts,
            "src": k.src, "linear": format_linear(k.uops) if k.uops else "", "n_linear": len(k.uops),
            "ast": graph_json(k.ast)}


def event_json(e: Event) -> dict[str, Any]:
    return {"name": e.name, "cat": e.cat, "pid": e.pid, "tid": e.tid, "ts": e.ts_ns / 1e3, "dur": e.dur_ns / 1e3,
            "ctx": e.ctx, "args": e.args}


def _context_json(c: VizContext, pass_ids: list[int], kernel_id: int | None) -> dict[str, Any]:
    return {"id": c.id, "kind": c.kind, "name": c.name, "parent": c.parent, "children": list(c.children),
            "passes": pass_ids, "kernel": kernel_id, "start": c.start_ns / 1e3,
            "dur": max(c.end_ns - c.start_ns, 0) / 1e3 if c.end_ns else None}


def build_data(rec: Recorder = RECORDER) -> dict[str, Any]:
    """Everything recorded so far as one JSON-able dict: `index` (contexts, pass and kernel summaries), `passes`,
    `kernels` and `timeline`."""
    contexts: list[dict[str, Any]] = []
    passes: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    for c in list(rec.contexts):
        pids = []
        for tr in list(c.passes):
            pids.append(len(passes))
            passes.append(pass_json(len(passes), c.id, tr))
        kid = None
        if c.kernel is not None:
            kid = len(kernels)
            kernels.append(kernel_json(kid, c.id, c.kernel))
        contexts.append(_context_json(c, pids, kid))
    summary_keys = ("id", "ctx", "name", "n_before", "n_after")
    index = {"version": FORMAT_VERSION, "argv": sys.argv, "contexts": contexts,
             "passes": [{**{k: p[k] for k in summary_keys}, "n_rules": sum(r["count"] for r in p["rules"])}
                        for p in passes],
             "kernels": [{k: v for k, v in kr.items() if k in ("id", "ctx", "name", "device", "n_linear")}
                         for kr in kernels],
             "n_events": len(rec.events)}
    return {"index": index, "passes": passes, "kernels": kernels,
            "timeline": [event_json(e) for e in list(rec.events)]}


def write_json(path: str, obj: Any) -> str:
    """Write JSON through a fresh temporary file (mkstemp: O_EXCL, mode 0600) in the target's directory, renamed into
    place: a file or symlink planted at a predictable name is never opened or followed."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".fusegrad-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f: json.dump(obj, f, separators=(",", ":"))
        os.replace(tmp, path)   # rename replaces a symlink at `path` itself, never its target
    except BaseException:
        try: os.unlink(tmp)
        except OSError: pass
        raise
    return path


def private_dir() -> str:
    """A per-user directory under the temp dir for the default VIZ/PROFILE files: created 0700, and refused unless it
    is a real directory owned by this user that nobody else can write (another user may have planted it)."""
    d = os.path.join(tempfile.gettempdir(), f"fusegrad-{os.getuid() if hasattr(os, 'getuid') else 'user'}")
    try: os.mkdir(d, 0o700)
    except FileExistsError: pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o022:
        raise PermissionError(f"{d} is not a private directory of this user (a symlink, another user's, or writable "
                              "by others): remove it, or set VIZ_SAVE / PROFILE_PATH")
    return d


def save(path: str, data: dict[str, Any] | None = None) -> str:
    """Write the VIZ data to `path` (what `VIZ_SAVE=path` does at exit); returns the path."""
    return write_json(path, build_data() if data is None else data)


def load(path: str) -> dict[str, Any]:
    with open(path) as f: data = json.load(f)
    if not isinstance(data, dict) or "index" not in data or data["index"].get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a fusegrad VIZ file (format version {FORMAT_VERSION})")
    return data


# ---------------------------------------------------------------------------------------------------------------------
# PROFILE: Chrome trace-event JSON (Perfetto, chrome://tracing): complete events ("X") with ts/dur in microseconds,
# one pid per device, one tid per stream, named by metadata ("M") events.

def chrome_trace(rec: Recorder = RECORDER) -> dict[str, Any]:
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    out: list[dict[str, Any]] = []
    for e in list(rec.events):
        if e.pid not in pids:
            pids[e.pid] = len(pids) + 1
            out.append({"ph": "M", "name": "process_name", "pid": pids[e.pid], "tid": 0, "args": {"name": e.pid}})
        if (e.pid, e.tid) not in tids:
            tids[(e.pid, e.tid)] = len(tids) + 1
            out.append({"ph": "M", "name": "thread_name", "pid": pids[e.pid], "tid": tids[(e.pid, e.tid)],
                        "args": {"name": e.tid}})
        out.append({"ph": "X", "name": e.name, "cat": e.cat, "pid": pids[e.pid], "tid": tids[(e.pid, e.tid)],
                    "ts": e.ts_ns / 1e3, "dur": e.dur_ns / 1e3, "args": e.args})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_profile(path: str, rec: Recorder = RECORDER) -> str:
    return write_json(path, chrome_trace(rec))
