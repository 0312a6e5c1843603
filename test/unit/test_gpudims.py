"""GPU-style launch (codegen/gpudims.py): output ranges -> work-item ids, grouped into at most 3 grid dimensions within
the renderer's limits, and the OpenCL source that results. Needs no OpenCL device: the renderer is pure."""
import numpy as np

from fusegrad import Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.gpudims import add_gpudims, group_dims, local_dims
from fusegrad.ir.ops import Ops, UOp
from fusegrad.ir.spec import verify_linear
from fusegrad.renderer.cstyle import ClangRenderer
from fusegrad.renderer.opencl import OpenCLRenderer


def ranges(*sizes: int) -> list[UOp]:
    return [UOp.range(s, i, "global") for i, s in enumerate(sizes)]


def test_innermost_range_is_dim0_and_extra_ranges_merge_into_the_last_dim():
    r = ranges(2, 3, 4, 5)
    assert group_dims(r, (2**31 - 1,) * 3) == [[r[3]], [r[2]], [r[0], r[1]]]
    assert group_dims(r[:2], (2**31 - 1,) * 3) == [[r[1]], [r[0]]]


def test_ranges_over_the_limit_stay_loops():
    r = ranges(2, 3, 4, 5)
    assert group_dims(r, (5, 4, 5)) == [[r[3]], [r[2]], [r[1]]]  # 2*3 > 5: r0 stays a loop around the grid
    assert group_dims(r, (4, 4, 4)) == []                          # the innermost doesn't fit: no grid at all


def test_local_size_divides_the_grid():
    assert local_dims((128, 512), 256) == (128, 2)
    assert local_dims((1000,), 256) == (250,)
    assert local_dims((7, 3), 256) == (7, 3)
    assert local_dims((1, 1, 1024), 1024, (1024, 1024, 64)) == (1, 1, 64)  # each dimension's own limit
    for g, l in zip((96, 10, 6), local_dims((96, 10, 6), 64)): assert g % l == 0
    assert np.prod(local_dims((96, 10, 6), 64)) <= 64


def kernel(t: Tensor) -> UOp:
    (si,) = t.schedule()
    return si.ast


def test_merged_dim_recovers_each_range():
    """A 4-d output: 3 grid dims, the outer two ranges recovered from gid2 by div/mod, no output loops left."""
    x = Tensor(np.zeros((2, 3, 4, 5), np.float32))
    ast, gsz, lsz = add_gpudims(kernel(x.permute(3, 2, 1, 0) + 1), OpenCLRenderer())
    assert gsz == (2, 3, 20) and all(g % l == 0 for g, l in zip(gsz, lsz))
    nodes = list(ast.toposort())
    assert not [n for n in nodes if n.op is Ops.RANGE]
    assert sorted(n.arg for n in nodes if n.op is Ops.SPECIAL) == ["gid0", "gid1", "gid2"]


def test_opencl_source_and_estimates():
    """The rendered kernel reads its indices from get_global_id, keeps the reduce loop, and counts the grid's work in
    its op estimate exactly as the CPU loops do."""
    a, b = Tensor(np.ones((8, 16), np.float32)), Tensor(np.ones((16, 4), np.float32))
    ast = kernel(a @ b)
    spec = to_program(ast, OpenCLRenderer(), [])
    verify_linear(spec.uops)
    assert spec.src.startswith("#pragma") and "__kernel void r_8_4_16(__global float* restrict data0" in spec.src
    assert "get_global_id(0)" in spec.src and "get_global_id(1)" in spec.src and "for (int gidx" not in spec.src
    assert "for (int ridx" in spec.src and spec.global_size == (4, 8)
    assert spec.ops == to_program(ast, ClangRenderer(), []).ops == 2 * 8 * 4 * 16


def test_scalar_output_runs_on_one_work_item():
    spec = to_program(kernel(Tensor(np.ones((8,), np.float32)).sum()), OpenCLRenderer(), [])
    assert spec.global_size == (1,) and "get_global_id" not in spec.src


def test_opencl_types_and_constants():
    r = OpenCLRenderer(fp16=False, fp64=True)
    from fusegrad.dtype import dtypes
    assert dtypes.float16 not in r.supported_dtypes() and dtypes.bfloat16 in r.supported_dtypes()
    assert dtypes.float16 in OpenCLRenderer(fp16=True).supported_dtypes()
    assert r.render_const(-2**63, dtypes.int64) == "(-9223372036854775807l-1)"
    assert r.render_const(2**64 - 1, dtypes.uint64) == "18446744073709551615ul"
    assert r.render_const(float("-inf"), dtypes.float32) == "-INFINITY" and r.render_const(float("nan"), dtypes.float32) == "NAN"
    assert r.render_bitcast(dtypes.uint32, "x", dtypes.float32) == "as_uint(x)"
    assert r.buffer_type(dtypes.bool) == "uchar"
