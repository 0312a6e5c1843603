"""codegen/merge.py: adjacent loops that every access walks contiguously become one loop; anything else is left."""
import numpy as np
import pytest

from fusegrad import Context, Tensor
from fusegrad.codegen import to_program
from fusegrad.device import Device

RNG = np.random.default_rng(7)


def test_batchnorm_statistic_loops_merge():
    x = Tensor.empty(8, 4, 5, 5)
    with Context(MERGE_RANGES=0): before = to_program(x.sum((0, 2, 3)).schedule()[-1].ast, Device["CPU"].renderer).name
    after = to_program(x.sum((0, 2, 3)).schedule()[-1].ast, Device["CPU"].renderer).name
    assert before == "r_4_8_5_5" and after == "r_4_8_25"   # n can't join: the channel axis sits between n and h*w


def test_elementwise_of_a_contiguous_tensor_is_one_loop():
    assert to_program((Tensor.empty(4, 6, 10) + 1).schedule()[-1].ast, Device["CPU"].renderer).name == "E_240"


@pytest.mark.parametrize("name,build,ref", [
    ("sum_inner", lambda a: a.sum((0, 2, 3)), lambda a: a.sum((0, 2, 3))),
    ("mean_keepdim", lambda a: a - a.mean((2, 3), keepdim=True), lambda a: a - a.mean((2, 3), keepdims=True)),
    ("permuted", lambda a: a.permute(0, 2, 3, 1) * 2, lambda a: a.transpose(0, 2, 3, 1) * 2),
    ("shrunk", lambda a: a[:, :, 1:4, :].sum(3), lambda a: a[:, :, 1:4, :].sum(3)),
    ("padded", lambda a: a.pad(((0, 0), (0, 0), (1, 1), (0, 0))).sum((2, 3)),
     lambda a: np.pad(a, ((0, 0), (0, 0), (1, 1), (0, 0))).sum((2, 3))),
    ("conv", lambda a: a.conv2d(Tensor(np.ones((2, 3, 3, 3), np.float32))), None),
])
def test_values_match_numpy(name, build, ref):
    a = RNG.standard_normal((2, 3, 6, 5)).astype(np.float32)
    got = build(Tensor(a)).numpy()
    with Context(MERGE_RANGES=0): plain = build(Tensor(a)).numpy()
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)
    if ref is not None: np.testing.assert_allclose(got, ref(a), rtol=1e-5, atol=1e-5)


def test_matmul_and_conv_loops_stay():
    a, b = Tensor.empty(16, 32), Tensor.empty(32, 8)
    assert to_program((a @ b).schedule()[-1].ast, Device["CPU"].renderer).name == "r_16_8_32"
    x, w = Tensor.empty(2, 3, 6, 6), Tensor.empty(4, 3, 3, 3)
    assert to_program(x.conv2d(w).schedule()[-1].ast, Device["CPU"].renderer).name == "r_2_4_4_4_3_3_3"


def _panel_product(m: int, k: int, n: int, width: int, wp: Tensor | None = None, x: Tensor | None = None,
                   b: Tensor | None = None) -> Tensor:
    """x (m, k) times a weight stored as (n / width, k, width) column panels, plus a bias of n: the sum is indexed
    by the n columns, so the panel's address is (j // width) * width*k + r*width + j % width."""
    x = Tensor.empty(m, k) if x is None else x
    wp = Tensor.empty(n // width, k, width) if wp is None else wp
    b = Tensor.empty(n) if b is None else b
    return (x.reshape(m, 1, k, 1) * wp).sum(-2).reshape(m, n) + b


def test_a_column_loop_read_as_panels_splits():
    """codegen/merge.py split_ranges: j read as j // 32 and j % 32 becomes (j_o, j_i) of 48 x 32, and no division or
    modulo is left in the kernel (the heuristic can then vectorize and tile it: it left it scalar)."""
    from fusegrad.ir.ops import Ops
    ast = _panel_product(26, 384, 1536, 32).schedule()[-1].ast
    with Context(MERGE_RANGES=0): assert to_program(ast, Device["CPU"].renderer).name == "r_26_1536_384"
    spec = to_program(ast, Device["CPU"].renderer)
    assert spec.name == "r_26_48_32_384"
    assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in spec.uops), spec.src


def test_split_values_match_numpy():
    m, k, n, width = 5, 12, 24, 8
    xn = RNG.integers(-4, 5, (m, k)).astype(np.float32)
    wn = RNG.integers(-4, 5, (k, n)).astype(np.float32)
    bn = RNG.integers(-4, 5, n).astype(np.float32)
    wp = np.ascontiguousarray(wn.reshape(k, n // width, width).transpose(1, 0, 2))
    got = _panel_product(m, k, n, width, Tensor(wp), Tensor(xn), Tensor(bn))
    np.testing.assert_array_equal(got.numpy(), xn @ wn + bn)


def test_elementwise_division_and_modulo_stay():
    # an elementwise kernel keeps its single loop (GCC vectorizes it); a range read only as j // 2 isn't split either
    a = Tensor.empty(4, 6, 8)
    assert to_program((a.permute(0, 2, 1) + 1).schedule()[-1].ast, Device["CPU"].renderer).name.startswith("E_")
    up = Tensor.empty(16, 32).reshape(16, 32, 1).expand(16, 32, 2).reshape(16, 64).sum(0)
    assert to_program(up.schedule()[-1].ast, Device["CPU"].renderer).name == "r_64_16"
