"""BEAM search: results stay correct, the search respects its budget, and its choice is cached on disk."""
import time

import numpy as np
import pytest

from fusegrad import Context, Device, Tensor
from fusegrad.codegen import search
from fusegrad.engine import realize

rng = np.random.default_rng(3)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    realize._programs.clear()
    yield
    realize._programs.clear()


CASES = {
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, [(16, 32), (32, 24)]),
    "sum_max": (lambda a: a.sum(1) + a.max(0)[:8], lambda a: a.sum(1) + a.max(0)[:8], [(8, 48)]),
    "conv": (lambda x, w: x.conv2d(w, padding=1).relu(), None, [(2, 3, 8, 8), (4, 3, 3, 3)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_beam_results_match(name):
    f, ref, shapes = CASES[name]
    xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if ref is None:
        import torch
        expect = torch.nn.functional.conv2d(torch.tensor(xs[0]), torch.tensor(xs[1]), padding=1).relu().numpy()
    else: expect = ref(*xs)
    with Context(BEAM=2, BEAM_BUDGET=3, IGNORE_BEAM_CACHE=1):
        got = f(*[Tensor(x) for x in xs]).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)


def test_beam_budget_and_cache(monkeypatch):
    a = Tensor(rng.standard_normal((64, 64)).astype(np.float32)).realize()
    (si,) = (a @ a).schedule()
    calls = []
    orig = search._Timer.compile
    monkeypatch.setattr(search._Timer, "compile", lambda self, opts: calls.append(opts) or orig(self, opts))
    st = time.perf_counter()
    with Context(BEAM=2, BEAM_BUDGET=2):
        first = search.beam_search(si.ast, "CPU", 2)
    took = time.perf_counter() - st
    assert calls and took < 2 + 15  # stops soon after its budget (one compile batch may finish)
    n = len(calls)
    with Context(BEAM=2):
        assert search.beam_search(si.ast, "CPU", 2) == first  # from the sqlite cache: nothing compiled
    assert len(calls) == n
    with Context(BEAM=2, BEAM_BUDGET=1, IGNORE_BEAM_CACHE=1):
        search.beam_search(si.ast, "CPU", 2)
    assert len(calls) > n


def test_beam_never_slower_than_heuristic_choice():
    """The heuristic's opts are always a candidate: the pick is at most as slow as they are (on the timer's runs)."""
    a = Tensor(rng.standard_normal((32, 32)).astype(np.float32)).realize()
    (si,) = (a @ a + 1).schedule()
    # (a budget that a loaded machine also gets past its first few candidates in: it is a cap, not a wait)
    with Context(BEAM=1, BEAM_BUDGET=10, IGNORE_BEAM_CACHE=1):
        opts = search.beam_search(si.ast, "CPU", 1)
    rep = search.last_search
    assert tuple(opts) == rep["best"] and rep["heuristic"] in rep["tried"]
    assert rep["tried"][rep["best"]] <= rep["tried"][rep["heuristic"]]
    assert len(rep["tried"]) > 2


def test_ast_key_is_stable_and_distinguishes():
    a = Tensor(rng.standard_normal((8, 8)).astype(np.float32)).realize()
    (s1,) = (a @ a).schedule()
    (s2,) = (a @ a).schedule()
    (s3,) = (a @ a.T).schedule()
    assert search.ast_key(s1.ast) == search.ast_key(s2.ast) != search.ast_key(s3.ast)


def test_beam_on_python_backend_has_no_vectorize():
    a = Tensor(rng.standard_normal((8, 8)).astype(np.float32), device="PYTHON").realize()
    (si,) = (a @ a).schedule()
    from fusegrad.ir.pattern import graph_rewrite
    from fusegrad.ir.symbolic import pm_symbolic
    acts = search.actions(graph_rewrite(si.ast, pm_symbolic), Device["PYTHON"].renderer)
    assert acts and not any(o.op == "VECTORIZE" for o in acts)
