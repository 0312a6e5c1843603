"""Software prefetch of streamed rows (renderer/cstyle.py `prefetch_streams`): a CPU kernel whose outermost loop reads
one contiguous region of a buffer per trip (a matvec's rows of weights) prefetches the next trip's region at the top
of each trip. Checked: which buffers a matvec, a quantized matvec and a matmul stream, with their strides and offsets
worked out by hand; kernels that must not prefetch (no reduce, a variable in the index); the C the CPU renders; and
the results, equal to NumPy's, split over threads or not."""
import os
import subprocess
import sys

import numpy as np
import pytest

from fusegrad import Device, Tensor, Variable
from fusegrad.codegen import to_program
from fusegrad.ir.ops import Ops
from fusegrad.dtype import dtypes
from fusegrad.helpers import Context
from fusegrad.models.quantized import PLANES, QuantizedLinear
from fusegrad.renderer.cstyle import PREFETCH_MIN_STRIDE, prefetch_streams

pytestmark = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the prefetch is the CPU's C renderer's")
rng = np.random.default_rng(0)


def _to_np(dt):
    return {dtypes.uint8: np.uint8, dtypes.int8: np.int8, dtypes.float32: np.float32, dtypes.uint32: np.uint32,
            dtypes.float16: np.float16, dtypes.int32: np.int32}[dt]


def _program(t: Tensor):
    return to_program([si.ast for si in t.schedule() if not si.is_copy][-1], Device["CPU"].renderer)


def _streams(spec) -> dict[int, tuple[int, int, int]]:
    """buffer number -> (elements per trip, offset, bytes per trip) of the kernel's outermost loop."""
    first = next(i for i, u in enumerate(spec.uops) if u.op is Ops.RANGE)
    return {b.arg: (s, lo, n) for b, s, lo, n in prefetch_streams(spec.uops, first)}


def test_a_matvec_streams_its_weight_rows_and_not_its_vector():
    x, w = rng.standard_normal((1, 512)).astype(np.float32), rng.standard_normal((3000, 512)).astype(np.float32)
    out = Tensor(x) @ Tensor(w).T
    spec = _program(out)
    streams = _streams(spec)
    assert len(streams) == 1, streams                      # w's rows; x is the same every trip
    (s, lo, n), = streams.values()
    rows = s // 512
    assert s == rows * 512 and lo == 0 and n == s * 4 and n >= PREFETCH_MIN_STRIDE
    assert spec.src.count("__builtin_prefetch(") == 1 and f"+1)*{s}+0] + pf)" in spec.src
    np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ggml_type", [3, 8])   # Q4_1 (planes qs, d, m), Q8_0 (qs, d)
def test_a_quantized_matvec_streams_its_value_plane(ggml_type):
    """One row per trip (codegen/opt.py `quantized_matvec`): the row's values (288 or 576 bytes) are prefetched a trip
    ahead; its float16 scales, 36 bytes a row, are under PREFETCH_MIN_STRIDE and left to the hardware."""
    lin = QuantizedLinear(576, 1536, ggml_type)
    for name, (_, dt) in PLANES[ggml_type].items():
        p = getattr(lin, name)
        val = rng.integers(-100, 100, p.shape) if dtypes.is_int(dt) else rng.uniform(-0.01, 0.01, p.shape)
        setattr(lin, name, Tensor(val.astype(_to_np(dt))).realize())
    x = rng.standard_normal((1, 576)).astype(np.float32)
    with Context(Q8_ACTIVATIONS=0): out = lin(Tensor(x))   # float activations: x @ W.T to float32 rounding
    spec = _program(out)
    lines = [ln.strip() for ln in spec.src.splitlines() if "__builtin_prefetch(" in ln]
    assert len(lines) == 1 and f"pf < {288 if ggml_type == 3 else 576};" in lines[0], lines
    np.testing.assert_allclose(out.numpy(), x @ lin.dequantize().numpy().T, rtol=1e-4, atol=1e-4)


def test_no_prefetch_without_a_reduce_or_with_a_variable_index():
    a = Tensor(rng.standard_normal((300, 512)).astype(np.float32)).realize()
    assert "__builtin_prefetch" not in _program(a * 2 + 1).src                   # elementwise: no reduce
    v = Variable("v", 0, 100).bind(7)
    b = Tensor(rng.standard_normal((400, 512)).astype(np.float32)).realize()
    assert "__builtin_prefetch" not in _program(b[v:v + 300].sum(1)).src        # rows at a variable offset


def test_a_matmul_streams_the_rows_of_a_only():
    """A register-tiled matmul's outermost loop walks tiles of a's rows; b is read whole on every trip. (A b of
    256 x 256 keeps that plan from 256 KB to 2 MB of L2 per core; a 256 x 384 one got another plan, without this
    stream, where the L2 is 512 KB: an AMD EPYC.)"""
    a, b = rng.standard_normal((192, 256)).astype(np.float32), rng.standard_normal((256, 256)).astype(np.float32)
    out = Tensor(a) @ Tensor(b)
    streams = _streams(_program(out))
    assert list(streams) == [1], streams                     # data1 is a
    s, lo, n = streams[1]
    assert s % 256 == 0 and lo == 0 and n == 4 * s
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_prefetching_kernels_equal_numpy_across_threads(threads):
    """The last trip of each chunk prefetches past its chunk (and the last past the buffer): a prefetch never faults,
    and the values don't depend on it."""
    code = ("import numpy as np; from fusegrad import Tensor; r = np.random.default_rng(1); "
            "x = r.standard_normal((2, 768)).astype(np.float32); "
            "w = r.standard_normal((5000, 768)).astype(np.float32); "
            "o = (Tensor(x) @ Tensor(w).T).numpy(); print(float(np.abs(o - x @ w.T).max()))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CPU_THREADS": threads})
    assert p.returncode == 0 and float(p.stdout.strip()) < 1e-3, (p.stdout, p.stderr[-2000:])
