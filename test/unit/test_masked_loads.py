"""Masked vector loads (codegen/vectorize.py): a load gated lane by lane (a padded conv's input near the border) or
reading every second element (a stride-2 conv) stays one vector access on the CPU: whole when every lane is in, lane
by lane otherwise. Checked against PyTorch on convolutions whose windows cross every border, with the heuristic and
with VECTORIZE forced on each range; the source is checked to use the masked forms; and a stride-2 read that ends at
an unmapped page shows that no element past the buffer is read."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fusegrad import Device, Tensor
from fusegrad.codegen import to_program
from fusegrad.codegen.opt import Opt
from fusegrad.codegen.vectorize import interval_gate
from fusegrad.ir.ops import Ops, UOp
from fusegrad.dtype import dtypes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_vectorize import ranges_of, run_forced  # noqa: E402

torch = pytest.importorskip("torch")
CPU = Device.DEFAULT == "CPU"


def _conv(x, w, groups, stride, pad):
    return (Tensor(x).pad(pad).conv2d(Tensor(w), groups=groups, stride=stride) * 0.5 + 1).relu6()


def _conv_ref(x, w, groups, stride, pad):
    t = torch.nn.functional.pad(torch.tensor(x), pad)
    return (torch.nn.functional.conv2d(t, torch.tensor(w), groups=groups, stride=stride) * 0.5 + 1).clamp(0, 6).numpy()


@settings(max_examples=int(os.environ.get("MASKED_LOAD_EXAMPLES", "25")), deadline=None)
@given(c=st.sampled_from([1, 3, 8]), depthwise=st.booleans(), h=st.integers(5, 20), w=st.sampled_from([8, 16, 17, 32]),
       k=st.sampled_from([1, 3, 5]), stride=st.sampled_from([1, 2]),
       pad=st.tuples(*[st.integers(0, 3)] * 4), seed=st.integers(0, 2 ** 16))
def test_padded_convs_match_torch(c, depthwise, h, w, k, stride, pad, seed):
    """The heuristic's kernels (masked loads wherever it vectorizes along a padded row) against PyTorch."""
    rng = np.random.default_rng(seed)
    if h + pad[2] + pad[3] < k or w + pad[0] + pad[1] < k: return
    cout, groups = (c, c) if depthwise else (4, 1)
    x = rng.standard_normal((2, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((cout, c // groups, k, k)).astype(np.float32)
    np.testing.assert_allclose(_conv(x, wt, groups, stride, pad).numpy(), _conv_ref(x, wt, groups, stride, pad),
                               rtol=1e-4, atol=1e-4)


X = np.random.default_rng(3).standard_normal((1, 4, 15, 32)).astype(np.float32)
WD = np.random.default_rng(4).standard_normal((4, 1, 3, 3)).astype(np.float32)


@pytest.mark.parametrize("stride", [1, 2])
def test_every_range_vectorizes_a_padded_depthwise_conv(monkeypatch, stride):
    """VECTORIZE forced on each range of a padded depthwise conv, at every width that divides it."""
    pad = (1, 1, 2, 1)
    def make(): return _conv(X, WD, 4, stride, pad)
    want = _conv_ref(X, WD, 4, stride, pad)
    tried = 0
    for rid, (size, _) in ranges_of(make()).items():
        for wd in (4, 8, 16):
            if size % wd: continue
            got = run_forced(monkeypatch, make, [Opt("VECTORIZE", rid, wd)])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"range {rid} width {wd}")
            tried += 1
    assert tried >= 2


@pytest.mark.skipif(not CPU, reason="checks the CPU renderer's source")
def test_padded_and_strided_depthwise_convs_use_masked_vector_loads():
    """Along a padded 112-wide row the heuristic vectorizes with masked loads (vmload1), and with stride 2 it reads
    pairs of vectors (vload2 / vmload2) instead of gathering lane by lane. The widths are the machine's (16 float32
    lanes with AVX-512, 8 with AVX2; a 56-wide row takes the widest of 1, 1/2 or 1/4 of that which divides 56)."""
    x = Tensor.empty(1, 32, 112, 112).realize()
    w = Tensor.empty(32, 1, 3, 3).realize()
    lanes = Device["CPU"].renderer.machine.lanes(dtypes.float32)
    def width(n: int) -> int: return next(w for w in (lanes, lanes // 2, lanes // 4) if w >= 4 and n % w == 0)
    for stride, forms in ((1, (f"vmload1_float_x{width(112)}",)),
                          (2, (f"vload2_float_x{width(56)}", f"vmload2_float_x{width(56)}"))):
        ast = x.pad((1, 1, 1, 1)).conv2d(w, groups=32, stride=stride).schedule()[-1].ast
        src = to_program(ast, Device["CPU"].renderer).src
        for f in forms: assert f + "(" in src, (stride, f)


def test_interval_gate():
    """AND of comparisons of addresses affine in the range: an interval; a mod or a != is not."""
    r = UOp.range(16, 0, "global")
    o = UOp.range(4, 1, "global")
    lo = UOp(Ops.CMPLT, dtypes.bool, (UOp.const(dtypes.int32, 0), r * 2 + o))
    hi = UOp(Ops.CMPLT, dtypes.bool, (r + o * 3, UOp.const(dtypes.int32, 20)))
    assert interval_gate(UOp(Ops.AND, dtypes.bool, (lo, hi)), r)
    assert interval_gate(lo, o)
    assert not interval_gate(UOp(Ops.CMPLT, dtypes.bool, (r % 4, UOp.const(dtypes.int32, 2))), r)
    assert not interval_gate(UOp(Ops.CMPNE, dtypes.bool, (r, UOp.const(dtypes.int32, 2))), r)


GUARD_SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np
    from fusegrad import Tensor
    rows, cols = 4, 31
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 2 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + page, page, 0) == 0   # the page after the data: any read of it is a segfault
    a = np.frombuffer(m, np.float32, count=rows * cols, offset=page - rows * cols * 4)
    a[:] = np.arange(rows * cols, dtype=np.float32)
    t = Tensor.from_dlpack(a, copy=False)
    got = (t.reshape(rows, cols)[:, ::2] * 2).sum(0).numpy()   # columns 0, 2, ..., 30: the last row's vector pair
    want = (a.reshape(rows, cols)[:, ::2] * 2).sum(0)          # would end one element past the buffer
    assert np.array_equal(got, want), (got, want)
    print("ok")
""")


@pytest.mark.skipif(not CPU, reason="CPU kernels read host memory directly")
def test_stride_two_loads_never_read_past_the_buffer():
    """The data ends where an unmapped page begins; reading every second element with pairs of vectors would touch
    it on the last row (base + 31 is one past the end), so the last row must take the lane-by-lane side."""
    p = subprocess.run([sys.executable, "-c", GUARD_SCRIPT], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
