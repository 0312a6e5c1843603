"""Process replay: capture records each compiled kernel, ASTs survive pickling as the same hash-consed nodes, and
`compare` finds exactly the kernels whose source other code renders differently."""
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fusegrad
from fusegrad import Context, Tensor, dtypes
from fusegrad.engine import realize
from fusegrad.ir.ops import Ops, UOp
from fusegrad import replay
from fusegrad.replay.__main__ import main as replay_main

PACKAGE = os.path.dirname(fusegrad.__file__)


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = str(tmp_path / "replay.db")
    monkeypatch.setenv("PROCESS_REPLAY_DB", path)
    realize._programs.clear()  # kernels already compiled in this process would not be compiled (or captured) again
    yield path
    realize._programs.clear()
    for conn in replay._conns.values(): conn.close()
    replay._conns.clear()


def program() -> np.ndarray:
    """Two kernels: a column sum (r_8_4), then that sum broadcast over the rows plus y (E_4_8)."""
    x = Tensor(np.arange(32, dtype=np.float32).reshape(4, 8))
    y = Tensor(np.ones((4, 8), dtype=np.float32))
    return (x.sum(0, keepdim=True).expand(4, 8) + y).numpy()


def recorded(path: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT name, test, error, skipped FROM kernels ORDER BY id").fetchall()
    conn.close()
    return rows


def test_records_the_kernels_of_a_program(db):
    with Context(CAPTURE_PROCESS_REPLAY=1): program()
    rows = recorded(db)
    assert sorted(r[0] for r in rows) == ["E_4_8", "r_8_4"]
    assert all(r[1] == "test/unit/test_replay.py::test_records_the_kernels_of_a_program" for r in rows)
    assert all(r[2] is None and r[3] is None for r in rows)


def test_nothing_recorded_when_off(db):
    with Context(CAPTURE_PROCESS_REPLAY=0): program()  # (the suite itself may run under `replay record`)
    assert not os.path.exists(db)


def test_pickle_round_trip_gives_the_same_nodes():
    (si,) = (Tensor(np.ones((8, 8), dtype=np.float32)) * 2).sum(1).schedule()
    assert pickle.loads(pickle.dumps(si.ast)) is si.ast
    assert replay.loads_ast(replay.dumps_ast(si.ast)) is si.ast
    # the flat format doesn't recurse: a chain far deeper than pickle's recursion limit
    deep = UOp(Ops.CONST, dtypes.int32, (), 0)
    for i in range(3000): deep = UOp(Ops.ADD, dtypes.int32, (deep, UOp(Ops.CONST, dtypes.int32, (), i)))
    assert replay.loads_ast(replay.dumps_ast(deep)) is deep


def test_pickles_load_in_another_process(tmp_path):
    # a DType caches a hash of its (str) fields, which differs between processes: it must be rebuilt on load
    (tmp_path / "x.pkl").write_bytes(pickle.dumps((dtypes.float32.ptr(16), dtypes.half.vec(4), Ops.REDUCE)))
    check = ("import pickle, sys; from fusegrad.dtype import dtypes; from fusegrad.ir.ops import Ops\n"
             "p, v, op = pickle.load(open(sys.argv[1], 'rb'))\n"
             "assert p == dtypes.float32.ptr(16) and v == dtypes.half.vec(4) and op is Ops.REDUCE, (p, v, op)")
    subprocess.run([sys.executable, "-c", check, str(tmp_path / "x.pkl")], check=True)


@pytest.mark.parametrize("dev", ["", "PYTHON"])  # PYTHON: its source holds a pickle, compared decoded
def test_compare_with_this_checkout_finds_no_change(db, capsys, dev):
    with Context(CAPTURE_PROCESS_REPLAY=1, **({"DEV": dev} if dev else {})): program()
    assert replay_main(["compare", "--db", db, "--assert-no-change"]) == 0
    assert "2 kernels: 2 unchanged, 0 changed, 0 couldn't replay" in capsys.readouterr().out


# appended to a copy of fusegrad/codegen/__init__.py: reduce kernels get a comment, elementwise kernels fail
TWEAK = textwrap.dedent("""
    _real_to_program = to_program
    def to_program(ast, renderer, opts=None):
        spec = _real_to_program(ast, renderer, opts)
        if spec.name.startswith("E_"): raise RuntimeError("this version can't render " + spec.name)
        spec.src = "// tweaked\\n" + spec.src
        return spec
""")


def tweaked_copy(root) -> str:
    shutil.copytree(PACKAGE, root / "fusegrad", ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "fusegrad" / "codegen" / "__init__.py", "a") as f: f.write(TWEAK)
    return str(root)


def test_compare_reports_changed_and_unreplayable_kernels(db, tmp_path, capsys):
    with Context(CAPTURE_PROCESS_REPLAY=1): program()
    other = tweaked_copy(tmp_path / "other")
    assert replay_main(["compare", "--db", db, "--against-path", other]) == 0  # a report, no verdict
    out = capsys.readouterr().out
    assert "changed: r_8_4 on " in out and "test_compare_reports_changed_and_unreplayable_kernels" in out
    assert "-// tweaked\n" in out  # the diff: the other code's line is missing from the recording
    assert "couldn't replay: E_4_8" in out and "RuntimeError: this version can't render E_4_8" in out
    assert "2 kernels: 0 unchanged, 1 changed, 1 couldn't replay" in out
    assert replay_main(["compare", "--db", db, "--against-path", other, "--assert-no-change"]) == 1
    assert replay_main(["compare", "--db", db, "--against-path", other, "--assert-no-change",
                        "--allow-unreplayable"]) == 1  # still changed


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_compare_against_a_git_ref(db, tmp_path, capsys):
    with Context(CAPTURE_PROCESS_REPLAY=1): program()
    repo = tmp_path / "repo"
    tweaked_copy(repo)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tweak"], ["tag", "tweaked"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    assert replay_main(["compare", "--db", db, "--repo", str(repo), "--against", "tweaked", "--assert-no-change"]) == 1
    out = capsys.readouterr().out
    assert "rendered again by tweaked (" in out and "1 changed, 1 couldn't replay" in out
    assert replay_main(["compare", "--db", db, "--repo", str(repo), "--against", "no-such-ref"]) == 2


def test_record_runs_a_command_into_a_fresh_db(tmp_path):
    db = str(tmp_path / "rec.db")
    prog = ("import numpy as np; from fusegrad import Tensor\n"
            "(Tensor(np.ones((4, 8), dtype=np.float32)).sum(0) * 3).numpy()")
    for _ in range(2):  # the second run starts from an empty db
        assert replay_main(["record", "--db", db, "--", sys.executable, "-c", prog]) == 0
        assert [r[0] for r in recorded(db)] == ["r_8_4"]
    assert replay_main(["record", "--db", db, "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3


def test_several_processes_write_one_db(tmp_path):
    # what pytest-xdist does: processes capturing into one db at the same time
    db = str(tmp_path / "multi.db")
    writer = textwrap.dedent("""
        import sys, types
        from fusegrad.dtype import dtypes
        from fusegrad.ir.ops import Ops, UOp
        from fusegrad.renderer import Renderer
        from fusegrad.replay import capture_kernel
        for i in range(25):
            ast = UOp(Ops.SINK, dtypes.void, (UOp(Ops.CONST, dtypes.int32, (), int(sys.argv[1]) * 100 + i),))
            capture_kernel(ast, "CPU", Renderer(), None, types.SimpleNamespace(name="k", display_name="k", src=str(i)))
    """)
    env = {**os.environ, "PROCESS_REPLAY_DB": db}
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(w)], env=env) for w in range(4)]
    assert [p.wait() for p in procs] == [0] * 4
    assert len(recorded(db)) == 100
