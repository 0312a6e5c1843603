"""Process replay, command line: record the kernels a command compiles, then render them again with other code and
report every kernel whose source changed.

    python -m fusegrad.replay record [--db PATH] -- python -m pytest -n 4 test/
    python -m fusegrad.replay compare [--db PATH] [--against REF | --against-path DIR] [--assert-no-change]
"""
from __future__ import annotations

import argparse
import base64
import difflib
import io
import json
import os
import pickle
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass

import fusegrad
from fusegrad.replay import connect, db_path
from fusegrad.replay import worker as worker_module

PACKAGE_DIR = os.path.dirname(os.path.abspath(fusegrad.__file__))


# ---------------------------------------------------------------------------------------------------------------------
# record

def record(db: str, cmd: list[str]) -> int:
    """Run `cmd` with capture on, into a fresh db. Returns the command's exit status."""
    db = os.path.abspath(db)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix): os.remove(db + suffix)
    conn = connect(db)
    conn.execute("INSERT INTO meta VALUES ('command', ?)", (json.dumps(cmd),))
    env = {**os.environ, "CAPTURE_PROCESS_REPLAY": "1", "PROCESS_REPLAY_DB": db}
    try: rc = subprocess.call(cmd, env=env)
    except OSError as e:
        print(f"process replay: can't run {cmd[0]!r}: {e}", file=sys.stderr)
        rc = 127
    n, tests = conn.execute("SELECT count(*), count(DISTINCT nullif(test, '')) FROM kernels").fetchone()
    conn.close()
    from_tests = f" from {tests} tests" if tests else ""
    print(f"process replay: recorded {n} kernels{from_tests} into {db} (command exited {rc})")
    return rc


# ---------------------------------------------------------------------------------------------------------------------
# the code to compare against

def _git(repo: str, *args: str) -> str:
    res = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
    if res.returncode != 0: raise RuntimeError(f"git {' '.join(args)}: {res.stderr.strip()}")
    return res.stdout.strip()


def export_ref(repo: str, ref: str, dest: str) -> tuple[str, str]:
    """Write the fusegrad package as it is at `ref` into `dest` with `git archive` (read-only: no worktree, nothing
    in the repository changes, nothing to clean up but `dest`). Returns (the folder to put on PYTHONPATH, a label)."""
    top = _git(repo, "rev-parse", "--show-toplevel")
    try: commit = _git(top, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except RuntimeError: raise RuntimeError(f"{ref!r} is not a commit in the git repository {top}") from None
    inside = os.path.realpath(PACKAGE_DIR).startswith(os.path.realpath(top) + os.sep)
    prefix = os.path.relpath(os.path.realpath(PACKAGE_DIR), os.path.realpath(top)) if inside else "fusegrad"
    res = subprocess.run(["git", "-C", top, "archive", "--format=tar", commit, "--", prefix], capture_output=True)
    if res.returncode != 0: raise RuntimeError(f"git archive {ref}: {res.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
        if hasattr(tarfile, "data_filter"): tar.extractall(dest, filter="data")
        else: tar.extractall(dest)  # noqa: S202 (our own repository's content)
    return os.path.join(dest, os.path.dirname(prefix)), f"{ref} ({commit[:10]})"


# ---------------------------------------------------------------------------------------------------------------------
# regenerate and compare

@dataclass
class Kernel:
    id: int
    name: str
    device: str
    renderer: str
    test: str
    src: str
    error: str | None    # set when capture couldn't serialize the kernel
    skipped: str | None  # set when the kernel came from patched codegen


def regenerate(db: str, root: str, ids: list[int], jobs: int) -> dict[int, tuple[str, str]]:
    """{id: ("src", source) or ("error", why)} for every recorded kernel, rendered by the fusegrad under `root`.
    Runs `jobs` worker processes; a worker that dies leaves its remaining kernels with the reason."""
    with open(worker_module.__file__) as f: code = f.read()
    env = {k: v for k, v in os.environ.items() if k not in ("CAPTURE_PROCESS_REPLAY", "DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    out: dict[int, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="fusegrad_replay_") as tmp:
        procs = []
        for i in range(jobs):
            err = open(os.path.join(tmp, f"err{i}"), "wb")
            procs.append((subprocess.Popen([sys.executable, "-c", code, db, os.path.join(tmp, f"out{i}"), root, str(i),
                                            str(jobs)], cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=err), err))
        for i, (p, err) in enumerate(procs):
            rc = p.wait()
            err.close()
            fatal = None
            if os.path.exists(path := os.path.join(tmp, f"out{i}")):
                with open(path) as f:
                    for line in f:
                        try: res = json.loads(line)
                        except json.JSONDecodeError: continue  # the last line of a worker that was killed
                        if "fatal" in res: fatal = res["fatal"]
                        else: out[res["id"]] = ("src", res["src"]) if "src" in res else ("error", res["error"])
            if fatal is None and rc != 0:
                with open(os.path.join(tmp, f"err{i}"), errors="replace") as f: tail = f.read().strip()[-400:]
                fatal = f"replay worker exited with {rc}: {tail}"
            for rid in ids:
                if rid % jobs == i and rid not in out: out[rid] = ("error", fatal or "no result from the replay worker")
    return out


def load_kernels(db: str) -> tuple[list[Kernel], str]:
    """The recorded kernels, and the command `record` ran ("" when capture was switched on by hand)."""
    if not os.path.exists(db): raise FileNotFoundError(f"no replay db at {db}; run `python -m fusegrad.replay record`")
    conn = sqlite3.connect(db, timeout=60)
    rows = conn.execute("SELECT id, name, device, renderer, test, src, error, skipped FROM kernels "
                        "ORDER BY id").fetchall()
    cmd = conn.execute("SELECT v FROM meta WHERE k = 'command'").fetchone()
    conn.close()
    return [Kernel(*r) for r in rows], " ".join(json.loads(cmd[0])) if cmd else ""


def canonical_source(src: str) -> str:
    """The source with the PYTHON backend's `#PICKLE <base64>` line decoded into a listing. The pickle's bytes depend
    on object identity (which equal strings share a memo entry), so one program pickles differently in two processes;
    decoded, equal programs give equal text. Any other source is returned as it is."""
    head, sep, tail = src.partition("\n#PICKLE ")
    if not sep: return src
    payload, _, rest = tail.partition("\n")
    try: uops = pickle.loads(base64.b64decode(payload))
    except Exception: return src  # noqa: BLE001 (left as recorded: compared byte for byte)
    num = {u: i for i, u in enumerate(uops)}
    lines = [f"#   {i} {u.op.name} {u.dtype!r} {[num.get(x, '?') for x in u.src]} {u.arg!r}"
             for i, u in enumerate(uops)]
    return head + "\n#PICKLE (decoded)\n" + "\n".join(lines) + "\n" + rest


def source_diff(replayed: str, recorded: str, label: str) -> str | None:
    """A unified diff from the replayed source to the recorded one, or None when they are the same program."""
    if replayed == recorded: return None
    new, old = canonical_source(replayed), canonical_source(recorded)
    if new == old: return None
    lines = [(s if s.endswith("\n") else s + "\n").splitlines(keepends=True) for s in (new, old)]
    return "".join(difflib.unified_diff(*lines, fromfile=label, tofile="recorded"))


def _where(k: Kernel) -> str:
    return f"{k.name} on {k.device} ({k.renderer.rpartition(':')[2]}) from {k.test or 'outside pytest'}"


def compare(db: str, root: str, label: str, jobs: int, max_diffs: int) -> tuple[int, int, int]:
    """Print a diff for each kernel whose source `root`'s code renders differently, then a summary.
    Returns (unchanged, changed, couldn't replay)."""
    kernels, command = load_kernels(db)
    live = [k for k in kernels if k.error is None and k.skipped is None]
    jobs = max(1, min(jobs, len(live) // 50 + 1))
    got = regenerate(db, root, [k.id for k in live], jobs) if live else {}
    print(f"process replay: {len(kernels)} kernels in {db}{f' (from `{command}`)' if command else ''}, "
          f"rendered again by {label}")
    if skipped := [k for k in kernels if k.skipped is not None]:
        print(f"skipped {len(skipped)} kernels that can't be reproduced, e.g. {_where(skipped[0])}: "
              f"{skipped[0].skipped}")
    same, changed, failed = 0, 0, 0
    for k in kernels:
        if k.skipped is not None: continue
        kind, text = ("error", f"not recorded: {k.error}") if k.error is not None else got[k.id]
        if kind == "error":
            failed += 1
            if failed <= max_diffs: print(f"couldn't replay: {_where(k)}: {text}")
        elif (diff := source_diff(text, k.src, label)) is None: same += 1
        else:
            changed += 1
            if changed <= max_diffs: print(f"changed: {_where(k)}\n{diff}")
    if changed > max_diffs or failed > max_diffs: print(f"(only the first {max_diffs} of each are shown: --max-diffs)")
    print(f"process replay: {len(kernels)} kernels: {same} unchanged, {changed} changed, {failed} couldn't replay"
          + (f", {len(skipped)} skipped" if skipped else ""))
    return same, changed, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusegrad.replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run a command with CAPTURE_PROCESS_REPLAY=1 into a fresh db")
    rec.add_argument("--db", default=None, help="the db (default: $PROCESS_REPLAY_DB or the cache directory)")
    rec.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    cmp = sub.add_parser("compare", help="render every recorded kernel again and report changed sources")
    cmp.add_argument("--db", default=None, help="the db (default: $PROCESS_REPLAY_DB or the cache directory)")
    src = cmp.add_mutually_exclusive_group()
    src.add_argument("--against", metavar="REF", help="a git ref; default: this checkout's working tree")
    src.add_argument("--against-path", metavar="DIR", help="a folder that holds another fusegrad package")
    cmp.add_argument("--repo", default=PACKAGE_DIR, help="the git repository REF is in (default: this checkout's)")
    cmp.add_argument("--assert-no-change", action="store_true",
                     help="exit 1 when a kernel changed or couldn't be replayed, or nothing was recorded")
    cmp.add_argument("--allow-unreplayable", action="store_true", help="with --assert-no-change: only changes fail")
    cmp.add_argument("-j", "--jobs", type=int, default=min(os.cpu_count() or 1, 8), help="worker processes")
    cmp.add_argument("--max-diffs", type=int, default=20, help="print at most this many diffs (and errors)")
    args = ap.parse_args(argv)
    db = os.path.abspath(args.db or db_path())
    if args.cmd == "record":
        cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not cmd: ap.error("record needs a command after --")
        return record(db, cmd)
    with tempfile.TemporaryDirectory(prefix="fusegrad_ref_") as tmp:
        try:
            if args.against: root, label = export_ref(args.repo, args.against, tmp)
            elif args.against_path:
                root = os.path.abspath(args.against_path)
                if not os.path.exists(os.path.join(root, "fusegrad", "__init__.py")) and \
                        os.path.exists(os.path.join(root, "__init__.py")): root = os.path.dirname(root)  # the package
                label = f"the code in {root}"
            else: root, label = os.path.dirname(PACKAGE_DIR), "this checkout"
            same, changed, failed = compare(db, root, label, args.jobs, args.max_diffs)
        except (RuntimeError, FileNotFoundError) as e:
            print(f"process replay: {e}", file=sys.stderr)
            return 2
    if not args.assert_no_change: return 0
    return int(changed > 0 or (failed > 0 and not args.allow_unreplayable) or same + changed + failed == 0)


if __name__ == "__main__":
    sys.exit(main())
