"""The onnx package's backend node tests (onnx.backend.test.BackendTest) run against fusegrad.onnx.backend.

Every test passes except those in node_expected_failures.txt, which are strict expected failures: a listed test
that starts passing fails this file until it is removed from the list (tools: test/onnx/update_node_report.py).
"""

import pathlib
import pytest

pytest.importorskip("onnx")
import onnx.backend.test  # noqa: E402
from fusegrad.onnx.backend import FusegradBackend  # noqa: E402

EXPECTED = pathlib.Path(__file__).with_name("node_expected_failures.txt")


def expected_failures() -> dict[str, str]:
    out = {}
    for line in EXPECTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, why = line.partition(" ")
            out[name] = why.strip()
    return out


_bt = onnx.backend.test.BackendTest(FusegradBackend, __name__)
for _name in expected_failures():
    _bt.xfail(f"^{_name}$")
OnnxBackendNodeModelTest = _bt.test_cases["OnnxBackendNodeModelTest"]  # the only TestCase class pytest collects here


def test_expected_failures_exist():
    names = {n for n in dir(OnnxBackendNodeModelTest) if n.startswith("test_")}
    missing = [n for n in expected_failures() if n not in names]
    assert not missing, f"node_expected_failures.txt lists tests the onnx package no longer has: {missing[:10]}"
