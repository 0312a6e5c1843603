"""Tensors pickle by value: realized or lazy, in this process or another; dtype, shape, device and flags are kept."""
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fusegrad import Tensor, dtypes, nn
from fusegrad.nn.state import get_state_dict


def _roundtrip(t: Tensor) -> Tensor:
    return pickle.loads(pickle.dumps(t))


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int16, dtypes.uint8, dtypes.bool, dtypes.float16, dtypes.int64])
def test_realized_roundtrip(dt):
    arr = (np.arange(12).reshape(3, 4) % 5).astype(np.float64)
    t = Tensor(arr, dtype=dt).realize()
    u = _roundtrip(t)
    assert (u.shape, u.dtype, u.device) == (t.shape, t.dtype, t.device)
    np.testing.assert_array_equal(u.numpy(), t.numpy())


def test_lazy_is_realized_on_pickle():
    t = Tensor([[1.0, 2.0], [3.0, 4.0]]).T * 3 + 1
    u = _roundtrip(t)
    np.testing.assert_array_equal(u.numpy(), np.array([[1.0, 2.0], [3.0, 4.0]]).T * 3 + 1)


def test_bfloat16_and_scalar():
    t = Tensor([1.5, -2.25, 3.0], dtype=dtypes.bfloat16)
    u = _roundtrip(t)
    assert u.dtype == dtypes.bfloat16 and u.tolist() == t.tolist()
    s = _roundtrip(Tensor(7))
    assert s.shape == () and s.item() == 7


def test_flags_kept():
    w = Tensor([1.0, 2.0]).is_param_()
    u = _roundtrip(w)
    assert u.requires_grad is True and u.is_param is True
    (u * u).sum().backward()
    np.testing.assert_allclose(u.grad.numpy(), [2.0, 4.0])
    assert _roundtrip(Tensor([1.0])).requires_grad is None


def test_state_dict_and_model_pickle():
    model = nn.Linear(3, 2)
    sd = pickle.loads(pickle.dumps(get_state_dict(model)))
    for k, v in get_state_dict(model).items(): np.testing.assert_array_equal(sd[k].numpy(), v.numpy())
    m2 = pickle.loads(pickle.dumps(model))
    x = Tensor([[1.0, 2.0, 3.0]])
    np.testing.assert_allclose(m2(x).numpy(), model(x).numpy())


def test_other_process():
    """The bytes are in the pickle: a fresh process (no shared buffer registry) reads the values back."""
    blob = pickle.dumps({"a": Tensor([[1, 2], [3, 4]]) * 5, "b": Tensor([0.5, 1.5], dtype=dtypes.float16)})
    code = textwrap.dedent("""
        import pickle, sys
        d = pickle.loads(sys.stdin.buffer.read())
        print(d["a"].tolist(), d["a"].dtype, d["b"].tolist(), d["b"].dtype)
    """)
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, timeout=300, check=True)
    assert out.stdout.decode().strip() == "[[5, 10], [15, 20]] dtypes.int [0.5, 1.5] dtypes.half"


def test_corrupt_pickle_payload_raises():
    fn, args = Tensor([1.0, 2.0]).__reduce__()
    with pytest.raises(ValueError):
        fn(args[0][:-1], *args[1:])


def test_disk_tensor_pickles_to_default_device(tmp_path):
    import pathlib
    from fusegrad import Device
    fn = tmp_path / "x.bin"
    fn.write_bytes(bytes(range(10)))
    u = _roundtrip(Tensor(pathlib.Path(fn))[2:5])
    assert u.device == Device.DEFAULT and u.tolist() == [2, 3, 4]
    assert fn.read_bytes() == bytes(range(10))
