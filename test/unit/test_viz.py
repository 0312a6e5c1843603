"""VIZ and PROFILE (fusegrad/viz): what the recorder records, that it records nothing when off, the saved file and the
terminal viewer, the web server's endpoints, and the Chrome trace-event JSON."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from fusegrad import Context, Device, Tensor
from fusegrad.dtype import dtypes
from fusegrad.engine import realize
from fusegrad.ir import pattern, symbolic
from fusegrad.ir.ops import UOp
from fusegrad.ir.pattern import RewriteTrace, graph_rewrite
from fusegrad.ir.symbolic import pm_symbolic
from fusegrad.viz import build_data, load
from fusegrad.viz.recorder import RECORDER, sync_hooks
from fusegrad.viz.serialize import chrome_trace, pass_json
from fusegrad.viz.server import make_server, serve_in_thread, url

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = """
import numpy as np
from fusegrad import Context, Tensor
from fusegrad.nn import Linear
from fusegrad.nn.optim import SGD
lin = Linear(4, 3)
opt = SGD([lin.weight, lin.bias], lr=0.1)
x, y = Tensor(np.ones((2, 4), np.float32)), Tensor(np.zeros((2, 3), np.float32))
with Context(TRAINING=1):
    opt.zero_grad()
    loss = ((lin(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
print("loss", loss.item())
"""


def rule_line(comment: str) -> str:
    """'ir/symbolic.py:<n>' for the rule whose algebra comment is `comment`."""
    with open(symbolic.__file__) as f: lines = f.read().splitlines()
    n = next(i + 1 for i, ln in enumerate(lines) if ln.rstrip().endswith(comment))
    return f"ir/symbolic.py:{n}"


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch):
    """An empty recorder and an empty in-process program cache (so kernels are compiled, and recorded, again)."""
    RECORDER.clear()
    monkeypatch.setattr(realize, "_programs", {})
    yield RECORDER
    pattern.rewrite_traces = None
    RECORDER.clear()


def run(env: dict[str, str], *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("VIZ", "PROFILE", "VIZ_SAVE", "VIZ_NO_SERVE")}
    return subprocess.run([sys.executable, *args], env={**full, **env}, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL, check=False)


# ----- the recorder ---------------------------------------------------------------------------------------------------

def test_symbolic_pass_records_rules_with_file_line(fresh):
    r0 = UOp.range(4, 0)
    before = (r0 * 1 + 0) * 2
    with Context(VIZ=1):
        sync_hooks()
        out = graph_rewrite(before, pm_symbolic, name="my symbolic")
    assert out is r0 * 2
    p = next(p for p in build_data()["passes"] if p["name"] == "my symbolic")
    locs = {r["loc"]: r["count"] for r in p["rules"]}
    assert locs == {rule_line("# x*1 -> x"): 1, rule_line("# x+0 -> x (floats: x+-0.0)"): 1}, locs
    assert p["n_before"] == len(before.toposort()) == 8 and p["n_after"] == len(out.toposort()) == 4
    nodes = p["nodes"]
    assert nodes[p["before"]][0] == "MUL" and nodes[p["after"]][0] == "MUL"
    assert sorted(nodes[i][0] for i in p["removed"]) == ["ADD", "CONST", "CONST", "MUL", "MUL"]
    # the node a rule returned (r0, by x*1 and then x+0), named by the last rule; the new MUL above it was rebuilt
    assert p["made_by"] == {str(nodes.index(["RANGE", "int", "(0, 'loop')", [0]])): rule_line("# x+0 -> x (floats: x+-0.0)")}


def test_realize_records_contexts_kernels_and_timeline(fresh):
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    with Context(VIZ=1): out = ((a * 1.0 + -0.0) * 2).sum(1).numpy()   # (x + -0.0 folds; x + 0.0 keeps -0.0 -> 0.0)
    np.testing.assert_allclose(out, (np.arange(12, dtype=np.float32).reshape(3, 4) * 2).sum(1))
    data = build_data()
    ctxs = data["index"]["contexts"]
    rz = [c for c in ctxs if c["kind"] == "realize"]
    assert len(rz) == 1 and "1 item(s)" in rz[0]["name"]
    (k,) = data["kernels"]
    assert k["name"] == "r_3_4" and k["device"] == Device.DEFAULT and ctxs[k["ctx"]]["parent"] == rz[0]["id"]
    assert "void r_3_4(" in k["src"] or k["device"] != "CPU"
    assert "STORE" in k["linear"] and "REDUCE" in {n[0] for n in k["ast"]["nodes"]}
    ks = next(data["passes"][i] for i in ctxs[k["ctx"]]["passes"] if data["passes"][i]["name"] == "kernel symbolic")
    assert {rule_line("# x*1 -> x"), rule_line("# x+0 -> x (floats: x+-0.0)")} <= {r["loc"] for r in ks["rules"]}
    assert ks["n_after"] < ks["n_before"]
    cats = {(e["cat"], e["pid"], e["tid"]) for e in data["timeline"]}
    assert ("schedule", "HOST", "python") in cats and ("kernel", Device.DEFAULT, "kernels") in cats
    assert any(c == "compile" for c, _, _ in cats) and any(c == "codegen" for c, _, _ in cats)
    launch = next(e for e in data["timeline"] if e["cat"] == "kernel")
    assert launch["dur"] >= 0 and ctxs[launch["args"]["kernel"]]["kernel"] == k["id"]


def test_kernel_record_source_is_the_compiled_source(fresh):
    from fusegrad.codegen import to_program
    t = Tensor(np.ones((5, 7), np.float32)) * 3 + 1
    (si,) = t.schedule()
    with Context(VIZ=1): t.realize()
    (k,) = build_data()["kernels"]
    assert k["src"] == to_program(si.ast, Device[Device.DEFAULT].renderer).src


def test_off_records_nothing_and_hooks_nothing(fresh):
    assert pattern.rewrite_traces is None
    (Tensor(np.ones(6, np.float32)) * 5).realize()
    assert pattern.rewrite_traces is None and len(RECORDER.contexts) == 1 and not RECORDER.events
    # a fresh process without VIZ/PROFILE never imports the recorder
    code = ("import sys, numpy as np; from fusegrad import Tensor; from fusegrad.ir import pattern\n"
            "(Tensor(np.ones(6, np.float32)) * 5).realize()\n"
            "print(pattern.rewrite_traces, any(m.startswith('fusegrad.viz') for m in sys.modules))")
    assert run({}, "-c", code).stdout.split() == ["None", "False"]


def test_turning_viz_off_unhooks(fresh):
    with Context(VIZ=1): (Tensor(np.ones(3, np.float32)) + 2).realize()
    assert pattern.rewrite_traces is RECORDER.router
    n, passes = len(RECORDER.contexts), sum(len(c.passes) for c in RECORDER.contexts)
    (Tensor(np.ones(3, np.float32)) + 4).realize()
    graph_rewrite(UOp.range(3, 0) + 0, pm_symbolic, name="after VIZ")  # the first pass with VIZ off unhooks
    assert pattern.rewrite_traces is None and len(RECORDER.contexts) == n
    assert sum(len(c.passes) for c in RECORDER.contexts) == passes


def test_profile_alone_records_no_graphs(fresh):
    with Context(PROFILE=1): (Tensor(np.ones(9, np.float32)) * 7).realize()
    assert pattern.rewrite_traces is None
    data = build_data()
    assert data["kernels"] == [] and data["passes"] == [] and any(e["cat"] == "kernel" for e in data["timeline"])


def test_jit_replays_are_on_the_timeline(fresh):
    from fusegrad import TinyJit
    f = TinyJit(lambda x: (x * 2 + 1).realize())
    with Context(PROFILE=1):
        outs = [f(Tensor(np.full(6, i, np.float32))).numpy() for i in range(4)]
    np.testing.assert_array_equal(outs[3], np.full(6, 7, np.float32))
    kernels = [e for e in RECORDER.events if e.cat == "kernel"]
    # (writes other tests left pending run before the capture: only f's kernel is counted)
    launches = [e for e in kernels if e.name == kernels[-1].name]
    assert len(launches) == 4  # calls 1-2 run, 3-4 replay
    assert all(e.dur_ns >= 0 for e in launches) and launches[-1].ts_ns >= launches[0].ts_ns


def test_viz_does_not_change_results(fresh):
    def step() -> list[np.ndarray]:
        from fusegrad.nn import Linear
        from fusegrad.nn.optim import SGD
        lin = Linear(5, 3)
        lin.weight.assign(Tensor(np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5))).realize()
        lin.bias.assign(Tensor(np.array([0.1, -0.2, 0.3], np.float32))).realize()
        opt = SGD([lin.weight, lin.bias], lr=0.1)
        x = Tensor(np.linspace(0, 1, 10, dtype=np.float32).reshape(2, 5))
        with Context(TRAINING=1):
            opt.zero_grad()
            loss = (lin(x).relu() - 0.5).square().mean()
            loss.backward()
            opt.step()
        return [loss.numpy(), lin.weight.numpy(), lin.bias.numpy()]
    off = step()
    realize._programs.clear()
    with Context(VIZ=1): on = step()
    assert len(RECORDER.contexts) > 3
    for a, b in zip(off, on): np.testing.assert_array_equal(a, b)


def test_big_graph_serializes_compactly():
    # a 10k-node graph: one pass's JSON stays small and quick to build
    x = UOp.range(10, 0)
    for i in range(5000): x = x + UOp.const(dtypes.int32, i % 7)
    tr = RewriteTrace("big", x, x, [])
    st = time.perf_counter()
    p = pass_json(0, 0, tr)
    s = json.dumps(p)
    assert len(p["nodes"]) == len(x.toposort()) >= 5000
    assert time.perf_counter() - st < 5 and len(s) < 60 * len(p["nodes"])


# ----- VIZ_SAVE, the terminal viewer, at-exit behaviour ---------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("viz") / "train.json")
    r = run({"VIZ": "1", "VIZ_SAVE": path, "VIZ_NO_SERVE": "1"}, "-c", TRAIN)
    assert r.returncode == 0, r.stderr
    assert f"VIZ: saved to {path}" in r.stdout and "not serving" not in r.stdout
    return path


def test_save_round_trip_through_terminal_viewer(saved):
    data = load(saved)
    names = [k["name"] for k in data["index"]["kernels"]]
    assert len(names) >= 5 and any(n.startswith("r_") for n in names)
    lst = run({}, "-m", "fusegrad.viz", "--list", "--file", saved)
    assert lst.returncode == 0, lst.stderr
    assert all(n in lst.stdout for n in names) and "[realize]" in lst.stdout and "pass #" in lst.stdout
    red = next(n for n in names if n.startswith("r_"))
    kern = run({}, "-m", "fusegrad.viz", "--kernel", red, "--file", saved)
    assert kern.returncode == 0, kern.stderr
    k = next(k for k in data["kernels"] if k["name"] == red)
    assert k["src"].strip() in kern.stdout and "--- linear program" in kern.stdout and "SINK" in kern.stdout
    ps = run({}, "-m", "fusegrad.viz", "--pass", "kernel symbolic", "--file", saved, "--graph", "list")
    assert ps.returncode == 0, ps.stderr
    fired = {r["loc"] for p in data["passes"] if p["name"] == "kernel symbolic" for r in p["rules"]}
    assert fired and all(loc in ps.stdout for loc in fired)
    # a shell that still exports VIZ=1 and VIZ_SAVE: the viewer must not overwrite the file with its own empty run
    with open(saved) as f: before = f.read()
    again = run({"VIZ": "1", "VIZ_SAVE": saved}, "-m", "fusegrad.viz", "--list")
    assert again.returncode == 0 and again.stdout == lst.stdout
    with open(saved) as f: assert f.read() == before
    bad = run({}, "-m", "fusegrad.viz", "--kernel", "no_such_kernel", "--file", saved)
    assert bad.returncode != 0 and "no kernel matches" in bad.stderr


def test_non_interactive_run_saves_instead_of_serving(tmp_path):
    r = run({"VIZ": "1", "TMPDIR": str(tmp_path)}, "-c", "from fusegrad import Tensor; (Tensor([1.0]) + 1).realize()",
            timeout=60)
    assert r.returncode == 0, r.stderr
    path = str(tmp_path / f"fusegrad-{os.getuid()}" / "fusegrad_viz.json")   # a private per-user directory
    assert "VIZ: not serving (not an interactive terminal)" in r.stdout and path in r.stdout
    assert load(path)["index"]["kernels"]


def test_viewer_without_a_file_says_how_to_make_one(tmp_path):
    r = run({}, "-m", "fusegrad.viz", "--list", "--file", str(tmp_path / "missing.json"))
    assert r.returncode != 0 and "VIZ_SAVE" in r.stderr


# ----- the web server -------------------------------------------------------------------------------------------------

def get(u: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(u, timeout=10) as r: return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_server_endpoints(saved):
    data = load(saved)
    srv = serve_in_thread(data)
    try:
        base = url(srv)
        assert srv.server_address[0] == "127.0.0.1"
        code, page = get(base)
        assert code == 200 and b"/assets/viz.js" in page
        assert get(base + "assets/viz.js")[0] == 200 and get(base + "assets/viz.css")[0] == 200
        code, body = get(base + "api/index")
        assert code == 200 and json.loads(body) == data["index"]
        assert json.loads(get(base + "api/pass/0")[1])["nodes"] == data["passes"][0]["nodes"]
        assert json.loads(get(base + "api/kernel/0")[1])["src"] == data["kernels"][0]["src"]
        assert len(json.loads(get(base + "api/timeline")[1])) == data["index"]["n_events"] > 0
        assert get(base + "api/pass/999999")[0] == 404
        assert get(base + "assets/..%2f__init__.py")[0] == 404 and get(base + "nothing")[0] == 404
    finally:
        srv.shutdown()
        srv.server_close()


def test_busy_port_moves_to_the_next(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        try:
            srv = make_server({"index": {}, "passes": [], "kernels": [], "timeline": []}, busy, tries=5)
        except OSError:
            pytest.skip("no free port right after the busy one")
        try:
            assert srv.server_address[1] != busy
            assert f"port {busy} is busy" in capsys.readouterr().out
        finally:
            srv.server_close()


# ----- PROFILE --------------------------------------------------------------------------------------------------------

def test_profile_writes_chrome_trace_events(tmp_path):
    path = str(tmp_path / "prof.json")
    r = run({"PROFILE": "1", "PROFILE_PATH": path}, "-c", TRAIN)
    assert r.returncode == 0, r.stderr
    assert f"to {path}" in r.stdout and not os.path.exists(str(tmp_path / "fusegrad_viz.json"))
    with open(path) as f: trace = json.load(f)
    evs = trace["traceEvents"]
    xs = [e for e in evs if e["ph"] == "X"]
    assert xs and all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and isinstance(e["pid"], int)
                      and isinstance(e["tid"], int) and e["name"] for e in xs)
    names = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"HOST", Device.DEFAULT} <= names and "kernels" in threads
    assert {e["cat"] for e in xs} >= {"schedule", "kernel", "compile"}
    # per (pid, tid) events must not partially overlap, or trace viewers draw them wrongly
    rows: dict = {}
    for e in xs: rows.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in rows.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-3 or b[1] <= a[1] for a, b in zip(spans, spans[1:])), spans


def test_chrome_trace_in_process(fresh):
    with Context(PROFILE=1): (Tensor(np.ones(4, np.float32)) * 2).realize()
    t = chrome_trace()
    assert any(e["ph"] == "X" and e["cat"] == "kernel" for e in t["traceEvents"])
    json.dumps(t)
