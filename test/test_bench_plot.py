"""bench/run.py --plot: the bar chart of time ratios is drawn from the table's rows (rows without a ratio and failed
cases are left out), and a missing matplotlib is reported instead of raised."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROWS = [["matmul 256 fp32", "fusegrad", "1.20", "28.0 GFLOPS", "1.50x"],
        ["matmul 256 fp32", "numpy", "0.80", "42.0 GFLOPS", "1.00x"],
        ["conv", "FAILED", "RuntimeError", "boom", "-"],
        ["first train step bs64 (cold cache)", "fusegrad", "3000", "-", "-"]]


def load_bench() -> ModuleType:
    pytest.importorskip("numpy", reason="bench/run.py needs numpy")
    if "bench_run" in sys.modules: return sys.modules["bench_run"]
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_plot_ratios(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install matplotlib)")
    bench = load_bench()
    path = tmp_path / "ratios.png"
    assert bench.plot_ratios(ROWS, str(path)) == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bench.plot_ratios(ROWS[2:], str(tmp_path / "none.png")) is None      # nothing has a ratio
    assert not (tmp_path / "none.png").exists()


def test_plot_ratios_without_matplotlib(tmp_path, monkeypatch, capsys):
    bench = load_bench()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert bench.plot_ratios(ROWS, str(tmp_path / "x.png")) is None
    assert "pip install matplotlib" in capsys.readouterr().out
