"""Scheduler pass "reduce loop order" (schedule/reduce_order.py): a multi-axis reduce whose innermost loop strides
through memory gets a contiguous range innermost; results match torch."""
import numpy as np
import torch

from fusegrad import Tensor
from fusegrad.ir.ops import Ops
from fusegrad.schedule.reduce_order import order_reduce_loops

rng = np.random.default_rng(5)


def reduce_ranges(t: Tensor) -> list[list[int]]:
    """Sizes of each multi-axis reduce's ranges, outermost first, in the last kernel of t's schedule."""
    ast = t.schedule()[-1].ast
    return [[int(r.src[0].arg) for r in n.src[1:]] for n in ast.toposort() if n.op is Ops.REDUCE and len(n.src) > 2]


def test_einsum_reduces_along_the_contiguous_axis_innermost():
    a, w = rng.standard_normal((2, 12, 16, 32), dtype=np.float32), rng.standard_normal((12, 32, 24), dtype=np.float32)
    t = Tensor.einsum("bhtd,hdk->btk", Tensor(a), Tensor(w))
    assert reduce_ranges(t) == [[12, 32]]   # (d, h) in axis order: h (stride 16*32 and 32*24) was innermost
    np.testing.assert_allclose(t.numpy(), torch.einsum("bhtd,hdk->btk", torch.tensor(a), torch.tensor(w)).numpy(),
                               rtol=1e-4, atol=1e-4)


def test_reduce_order_leaves_contiguous_and_short_inner_loops():
    x = rng.standard_normal((4, 8, 10, 10), dtype=np.float32)
    assert reduce_ranges(Tensor(x).sum((0, 2, 3))) == [[4, 10, 10]]           # w is contiguous already
    xc, wc = rng.standard_normal((2, 6, 6, 16), dtype=np.float32), rng.standard_normal((8, 16, 3, 3), dtype=np.float32)
    conv = Tensor(xc).permute(0, 3, 1, 2).conv2d(Tensor(wc), padding=1)     # kx (3) is unrolled whole by codegen
    assert reduce_ranges(conv)[0][-1] == 3
    ref = torch.nn.functional.conv2d(torch.tensor(xc).permute(0, 3, 1, 2), torch.tensor(wc), padding=1)
    np.testing.assert_allclose(conv.numpy(), ref.numpy(), rtol=1e-4, atol=1e-4)


def test_reduce_order_is_a_renaming():
    # a strided sum over two axes: the reordered AST sums the same elements (ids still grow inward)
    x = rng.standard_normal((24, 16, 20), dtype=np.float32)
    t = Tensor(x).permute(2, 1, 0).sum((1, 2))      # reduce (16, 24): the inner 24 step 320 floats, the 16 step 20
    ast = t.schedule()[-1].ast
    assert order_reduce_loops(ast) is ast            # neither range reads contiguously: nothing to gain
    np.testing.assert_allclose(t.numpy(), x.sum((0, 1)), rtol=1e-4, atol=1e-4)
    y = rng.standard_normal((16, 40, 12), dtype=np.float32)
    t4 = Tensor(y).permute(1, 2, 0).sum((1, 2))      # reduce (12, 16): 16 innermost steps 480 floats, 12 steps 1
    assert reduce_ranges(t4) == [[16, 12]]
    np.testing.assert_allclose(t4.numpy(), y.sum((0, 2)), rtol=1e-4, atol=1e-4)
