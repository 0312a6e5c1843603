"""bench/first_profile.py runs a cold and a warm process and prints its breakdown; only that it runs and what it
prints is checked here, never a time."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_first_profile_small_batch():
    pytest.importorskip("numpy", reason="bench/first_profile.py needs numpy")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "bench" / "first_profile.py"), "--fixed", "--bs", "8"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    cold, warm = (re.search(rf"^{k}: .* (\d+) compiler runs \((\d+) in init", out.stdout, re.MULTILINE)
                  for k in ("cold", "warm"))
    assert cold and warm, out.stdout
    # an empty cache compiles in the step; init runs no kernel (random initialization and optimizer state are lazy)
    assert int(cold[1]) > 0 and int(cold[2]) == 0, out.stdout
    assert int(warm[1]) == 0, out.stdout                        # the cache the cold process left serves everything
