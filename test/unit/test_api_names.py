"""Names tinygrad model code imports resolve in fusegrad with the same meaning (a port only changes the import)."""
import importlib
import itertools
import typing

import numpy as np
import pytest

import fusegrad
from fusegrad import Context, Tensor, dtypes
from fusegrad.dtype import can_lossless_cast, to_dtype

NAMES = {
    "": "Tensor TinyJit UOp Variable dtypes GlobalCounters Context getenv Device nn function",
    "tensor": "Tensor cast dtypes Device Variable",
    "dtype": "dtypes DType DTypeLike ConstType PyConst PtrDType least_upper_dtype least_upper_float sum_acc_dtype "
             "to_dtype DTYPES_DICT INVERSE_DTYPES_DICT _from_np_dtype _to_np_dtype truncate can_lossless_cast "
             "float_to_fp8 fp8_to_float to_storage_scalar from_storage_scalar storage_fmt_for_dtype",
    "helpers": "getenv Context ContextVar DEBUG prod dedup flatten fully_flatten argfix make_tuple round_up round_down "
               "all_same all_int colored Timing trange tqdm Profiling GlobalCounters partition unwrap "
               "get_single_element get_child ansistrip ansilen to_function_name strip_parens ceildiv next_power2 cdiv "
               "cmod getbits i2u merge_dicts pluralize polyN temp word_wrap time_to_str size_to_str OSX WIN CI BEAM "
               "NOOPT JIT SPEC VIZ PROFILE CACHELEVEL IGNORE_BEAM_CACHE CHECK_OOB lo32 hi32 data64 data64_le "
               "is_numpy_ndarray argsort fromimport flat_mv DEV",
    "nn": "Linear Conv1d Conv2d ConvTranspose1d ConvTranspose2d BatchNorm BatchNorm1d BatchNorm2d BatchNorm3d "
          "GroupNorm InstanceNorm LayerNorm LayerNorm2d RMSNorm Embedding LSTMCell optim state datasets",
    "nn.state": "safe_load safe_save get_state_dict get_parameters load_state_dict torch_load gguf_load "
                "safe_load_metadata ggml_data_to_tensor",
    "nn.optim": "Optimizer OptimizerGroup SGD Adam AdamW LAMB LARS Muon",
    "engine.jit": "TinyJit",
    "device": "Device Buffer Compiled Allocator is_dtype_supported",
}


@pytest.mark.parametrize("mod", list(NAMES))
def test_names_resolve(mod):
    m = importlib.import_module("fusegrad" + ("." + mod if mod else ""))
    missing = [n for n in NAMES[mod].split() if not hasattr(m, n)]
    assert not missing, f"fusegrad.{mod} lacks {missing}"


def test_same_objects():
    from fusegrad.tensor import Variable, cast
    assert cast is typing.cast and Variable == fusegrad.UOp.variable
    assert fusegrad.nn is importlib.import_module("fusegrad.nn")


def test_helpers_match_python_semantics():
    from fusegrad import helpers as h
    for x, y in itertools.product(range(-9, 10), [-4, -3, -1, 1, 2, 5]):
        assert h.cdiv(x, y) == int(x / y) and h.cmod(x, y) == x - int(x / y) * y   # C: toward zero
        assert h.round_down(x, abs(y)) == (x // abs(y)) * abs(y)
    assert [h.next_power2(x) for x in range(0, 10)] == [1, 1, 2, 4, 4, 8, 8, 8, 8, 16]
    assert h.fully_flatten([[1, [2, np.array([3, 4])]], np.array(5)]) == [1, 2, 3, 4, 5]
    assert h.i2u(8, -1) == 255 and h.getbits(0b101100, 2, 3) == 0b11
    assert h.merge_dicts([{"a": 1}, {"b": 2}, {"a": 1}]) == {"a": 1, "b": 2}
    with pytest.raises(RuntimeError): h.merge_dicts([{"a": 1}, {"a": 2}])
    with pytest.raises(ValueError): h.get_single_element([1, 2])
    assert h.polyN(2.0, [1.0, 2.0, 3.0]) == 11.0 and h.pluralize("kernel", 2) == "2 kernels"
    assert h.ansilen(h.colored("abc", "red")) == 3 and h.data64(0x1_0000_0002) == (1, 2)
    wrapped = h.word_wrap("x" * 25, 10)
    assert wrapped.split("\n") == ["x" * 10, "x" * 10, "x" * 5]


def test_to_dtype_python_types_and_foreign_names():
    assert to_dtype(int) == dtypes.int32 and to_dtype(float) == dtypes.float32 and to_dtype(bool) == dtypes.bool
    assert to_dtype(np.dtype("float16")) == dtypes.half and to_dtype("float8_e5m2") == dtypes.fp8e5m2
    assert Tensor.ones(3, dtype=int).dtype == dtypes.int32
    with pytest.raises(TypeError): to_dtype("float7")


def test_truncate_and_storage_helpers():
    from fusegrad.dtype import from_storage_scalar, storage_fmt_for_dtype, to_storage_scalar, truncate
    assert truncate[dtypes.uint8](300) == int(np.array([300]).astype(np.uint8)[0])
    assert truncate[dtypes.int8](200) == int(np.array([200]).astype(np.int8)[0])
    assert truncate[dtypes.half](1.1) == float(np.float16(1.1)) and truncate[dtypes.bool](3) is True
    ml = pytest.importorskip("ml_dtypes")
    assert truncate[dtypes.bfloat16](1.1) == float(ml.bfloat16(1.1))
    assert truncate[dtypes.fp8e4m3](0.1) == float(np.float32(0.1).astype(ml.float8_e4m3fn))
    bits = to_storage_scalar(0.1, dtypes.fp8e5m2)
    assert bits == int(np.array([0.1]).astype(ml.float8_e5m2).view(np.uint8)[0])
    assert from_storage_scalar(bits, dtypes.fp8e5m2) == float(np.array([0.1]).astype(ml.float8_e5m2)[0])
    assert [storage_fmt_for_dtype(d) for d in (dtypes.bfloat16, dtypes.fp8e4m3, dtypes.int32)] == ["H", "B", "i"]


LOSSLESS = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.float16, dtypes.bfloat16,
            dtypes.int32, dtypes.uint32, dtypes.float32, dtypes.float64, dtypes.int64]


def _np(dt):
    if dt == dtypes.bfloat16: return pytest.importorskip("ml_dtypes").bfloat16
    return np.dtype(dt.fmt)


@pytest.mark.parametrize("src", LOSSLESS[:7], ids=str)
def test_can_lossless_cast_by_enumeration(src):
    """For every source dtype small enough to enumerate, the answer equals "every value is exactly a dst value"."""
    if src == dtypes.bool: vals = np.array([False, True])
    elif src in (dtypes.float16, dtypes.bfloat16): vals = np.arange(1 << 16, dtype=np.uint16).view(_np(src))
    else: vals = np.arange(np.iinfo(_np(src)).min, np.iinfo(_np(src)).max + 1).astype(_np(src))
    with np.errstate(all="ignore"):
        if src in (dtypes.float16, dtypes.bfloat16): vals = vals[np.isfinite(vals.astype(np.float64))]
        for dst in LOSSLESS:
            exact = bool(np.array_equal(vals.astype(_np(dst)).astype(np.float64), vals.astype(np.float64)))
            assert can_lossless_cast(src, dst) == exact, f"{src} -> {dst}: expected {exact}"


def test_default_float_context():
    assert dtypes.default_float == dtypes.float32
    with Context(DEFAULT_FLOAT="HALF"):
        assert dtypes.default_float == dtypes.float16
        assert Tensor([1.5]).dtype == dtypes.float16 and Tensor.rand(2).dtype == dtypes.float16
        assert (Tensor([1, 2]) / 2).dtype == dtypes.float16
    assert Tensor([1.5]).dtype == dtypes.float32
    with Context(DEFAULT_FLOAT=dtypes.bfloat16): assert Tensor(2.5).numpy().dtype == np.float32  # bf16 reads as f32
    with pytest.raises(ValueError): dtypes.default_float = dtypes.int32
    old = dtypes.default_float
    try:
        dtypes.default_float = dtypes.float64   # tinygrad code assigns it directly
        assert Tensor([0.1]).dtype == dtypes.float64
    finally:
        dtypes.default_float = old


def test_weak_float_promotion():
    """An int tensor + a Python float is a tensor of the default float (torch agrees; see docs/tensor/dtypes.md)."""
    torch = pytest.importorskip("torch")
    out = Tensor.ones(3, dtype=dtypes.int32) + 2.3
    ref = torch.ones(3, dtype=torch.int32) + 2.3
    assert out.dtype == dtypes.float32 and str(ref.dtype) == "torch.float32"
    np.testing.assert_array_equal(out.numpy(), ref.numpy())
    with Context(DEFAULT_FLOAT="float16"): assert (Tensor.ones(3, dtype=dtypes.int32) + 2.3).dtype == dtypes.float16


def test_numpy_float32_into_bfloat16():
    x = np.array([1.1, -2.7, 3e38, 1e-40], np.float32)
    ml = pytest.importorskip("ml_dtypes")
    t = Tensor(x, dtype=dtypes.bfloat16)
    assert t.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(t.numpy(), x.astype(ml.bfloat16).astype(np.float32))
    np.testing.assert_array_equal(Tensor(x.astype(ml.bfloat16)).numpy(), x.astype(ml.bfloat16).astype(np.float32))
