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
