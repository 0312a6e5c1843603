"""GROUP: a reduce shared by a workgroup's lanes through shared memory (codegen/group.py), on the CL backend.

PoCL runs on the CPU, where the heuristic leaves GROUP off (renderer.group_max_outputs = 0); these tests turn it on
so every eligible reduce is grouped, and check the results against NumPy."""
import numpy as np
import pytest

from fusegrad import Context, Device, Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.group import group_opt
from fusegrad.codegen.opt import Opt, apply_opt
from fusegrad.engine import realize
from fusegrad.ir.ops import Ops

try:
    Device["CL"]
    CL_REASON = ""
except Exception as e:  # no OpenCL driver here
    CL_REASON = f"CL unavailable: {str(e).splitlines()[0]}"
pytestmark = pytest.mark.skipif(bool(CL_REASON), reason=CL_REASON)
rng = np.random.default_rng(11)


@pytest.fixture
def grouping(monkeypatch):
    monkeypatch.setattr(Device["CL"].renderer, "group_max_outputs", 1 << 30)
    realize._programs.clear()
    # no program cache: it would hand back an ungrouped program; no split reduce (schedule/split.py): these tests
    # group the one-kernel form of a long reduce
    with Context(CACHELEVEL=0, SPLIT_REDUCE=0):
        yield
    realize._programs.clear()


CASES = [
    ("sum all", (1 << 16,), lambda t: t.sum(), lambda a: a.sum()),
    ("max rows", (4, 4096), lambda t: t.max(1), lambda a: a.max(1)),
    ("sum cols", (512, 6), lambda t: t.sum(0), lambda a: a.sum(0)),
    ("mean two axes", (3, 32, 64), lambda t: t.mean((1, 2)), lambda a: a.mean((1, 2))),
    ("min", (2, 2048), lambda t: t.min(1), lambda a: a.min(1)),
    ("reduce then elementwise", (2, 1024), lambda t: (t.exp().sum(1).log() * 2 + 1), lambda a: np.log(np.exp(a).sum(1)) * 2 + 1),
    ("matmul small output", (4, 1024), lambda t: t @ t.T, lambda a: a @ a.T),
    ("int sum", (3, 4096), lambda t: (t * 100).cast("int32").sum(1), lambda a: (a * 100).astype(np.int32).sum(1)),
]


@pytest.mark.parametrize("name,shape,fg,ref", CASES, ids=[c[0] for c in CASES])
def test_grouped_reduce_matches_numpy(grouping, name, shape, fg, ref):
    a = rng.standard_normal(shape).astype(np.float32)
    t = Tensor(a, device="CL")
    ast = fg(t).schedule()[-1].ast
    assert group_opt(ast, Device["CL"].renderer) is not None, "the case should be grouped"
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in to_program(ast, Device["CL"].renderer).src
    out = fg(t).numpy()
    np.testing.assert_allclose(out, ref(a), rtol=2e-5, atol=2e-4 * np.sqrt(a.size / out.size))


def test_group_source_and_launch(grouping):
    ast = Tensor(rng.standard_normal((3, 4096)).astype(np.float32), device="CL").sum(1).schedule()[-1].ast
    spec = to_program(ast, Device["CL"].renderer)
    assert "__local float smem0[256];" in spec.src and "get_local_id(0)" in spec.src
    assert spec.global_size[0] == spec.local_size[0] == 256 and spec.global_size[1] == 3


def test_group_needs_a_reduce_range():
    ast = Tensor.ones(4, 256, device="CL").sum(1).schedule()[-1].ast
    out = next(n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] != "reduce")
    with pytest.raises(ValueError, match="GROUP needs a reduce range"):
        apply_opt(ast, Opt("GROUP", out.arg[0], 4))
    red = next(n for n in ast.toposort() if n.op is Ops.RANGE and n.arg[1] == "reduce")
    with pytest.raises(ValueError, match="must divide"):
        apply_opt(ast, Opt("GROUP", red.arg[0], 3))


def test_heuristic_leaves_cpu_devices_and_small_reduces_alone():
    r = Device["CL"].renderer
    with Context(SPLIT_REDUCE=0): big = Tensor.ones(1 << 16, device="CL").sum().schedule()[-1].ast  # one kernel
    small = Tensor.ones(4, 100, device="CL").sum(1).schedule()[-1].ast
    if Device["CL"].is_cpu: assert group_opt(big, r) is None
    assert group_opt(small, type(r)()) is None            # a reduce of 100 stays one work-item's loop
    assert group_opt(big, type(r)()) == (next(n.arg[0] for n in big.toposort() if n.op is Ops.RANGE), 256)


def test_beam_action_space_has_group_once():
    from fusegrad.codegen.search import actions
    r = Device["CL"].renderer
    ast = Tensor.ones(2, 4096, device="CL").sum(1).schedule()[-1].ast
    groups = [o for o in actions(ast, r) if o.op == "GROUP"]
    assert {o.amount for o in groups} == {16, 32, 64, 128, 256}
    grouped = apply_opt(ast, groups[-1])
    assert not any(o.op in ("GROUP", "UPCAST") and o.axis == groups[-1].axis for o in actions(grouped, r))
    assert all(o.op != "GROUP" for o in actions(grouped, r))


def test_split_reduce_partials_are_grouped(grouping):
    """A long sum split in two (schedule/split.py): on a GPU-style device its partial kernel has a few hundred
    outputs, each grouped over a workgroup."""
    a = rng.standard_normal(1 << 20).astype(np.float32)
    with Context(SPLIT_REDUCE=32768):
        t = Tensor(a, device="CL")
        k1, _ = t.sum().schedule()
        assert group_opt(k1.ast, Device["CL"].renderer) is not None
        np.testing.assert_allclose(t.sum().item(), a.sum(dtype=np.float64), rtol=1e-5, atol=1e-2)
        np.testing.assert_array_equal(t.max().item(), a.max())
