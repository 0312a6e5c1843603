"""nn.state: state-dict walking and loading, safetensors round trips and laziness, and malformed-file errors."""
import collections
import json
import struct

import numpy as np
import pytest
import torch

from fusegrad import Tensor, dtypes, nn
from fusegrad.nn.state import (
    FormatError,
    LazyStateDict,
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
)

from .helpers import rand


class Block:
    def __init__(self):
        self.conv, self.bn = nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)
        self.layers = [nn.Linear(3, 4), nn.Linear(4, 2)]
        self.extra = {"scale": Tensor.ones(2).is_param_()}
        self.name, self.act = "block", Tensor.relu

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn(self.conv(x)).relu().mean((2, 3))
        return self.layers[1](self.layers[0](x).relu()) * self.extra["scale"]


def torch_block() -> torch.nn.Module:
    m = torch.nn.Module()
    m.conv, m.bn = torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3)
    m.layers = torch.nn.ModuleList([torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)])
    return m


# ---------------------------------------------------------------------------------------------------------------------
# get_state_dict / get_parameters / load_state_dict

def test_state_dict_keys_match_torch_layout():
    sd = get_state_dict(Block())
    expect = set(torch_block().state_dict()) | {"extra.scale"}
    assert set(sd) == expect
    assert sd["conv.weight"].shape == (3, 2, 3, 3) and sd["layers.1.bias"].shape == (2,)


def test_state_dict_walks_namedtuples_cycles_and_tied_weights():
    Pair = collections.namedtuple("Pair", ["a", "b"])
    w = Tensor.zeros(3).is_param_()
    obj = type("M", (), {})()
    obj.pair, obj.tied, obj.od = Pair(w, Tensor.ones(1)), w, collections.OrderedDict(x=Tensor.ones(2))
    obj.me = obj  # a cycle
    sd = get_state_dict(obj)
    assert set(sd) == {"pair.a", "pair.b", "tied", "od.x"}
    assert sd["tied"] is sd["pair.a"]
    assert len(get_parameters(obj)) == 3  # the tied tensor once


def test_load_state_dict_round_trip_between_models():
    a, b = Block(), Block()
    x = Tensor(rand(2, 2, 5, 5))
    loaded = load_state_dict(b, get_state_dict(a))
    assert len(loaded) == len(get_state_dict(b))
    np.testing.assert_allclose(b(x).numpy(), a(x).numpy(), rtol=1e-6)
    b(x).sum().backward()   # gradients reach b's own parameters, not a's
    assert b.conv.weight.grad is not None and a.conv.weight.grad is None


def test_load_state_dict_strict_errors():
    lin = nn.Linear(3, 2)
    with pytest.raises(KeyError, match="missing keys \\['bias'\\]"): load_state_dict(lin, {"weight": Tensor.zeros(2, 3)})
    with pytest.raises(KeyError, match="unexpected keys \\['extra'\\]"):
        load_state_dict(lin, {"weight": Tensor.zeros(2, 3), "bias": Tensor.zeros(2), "extra": Tensor.zeros(1)})
    with pytest.raises(ValueError, match=r"'weight'.*\(2, 3\).*\(3, 2\)"):
        load_state_dict(lin, {"weight": Tensor.zeros(3, 2), "bias": Tensor.zeros(2)})
    before = lin.weight.numpy()
    load_state_dict(lin, {"bias": Tensor([1.0, 2.0])}, strict=False, verbose=False)
    np.testing.assert_array_equal(lin.weight.numpy(), before)
    assert lin.bias.tolist() == [1.0, 2.0]


def test_load_state_dict_scalar_shapes_cast_and_consume():
    bn = nn.BatchNorm(2)
    sd = {"weight": Tensor([2.0, 3.0]), "bias": Tensor([0.0, 1.0]), "running_mean": Tensor([0.5, 0.5]),
          "running_var": Tensor([4.0, 4.0]), "num_batches_tracked": Tensor([7], dtype=dtypes.int32)}  # (1,) int32
    load_state_dict(bn, sd, consume=True)
    assert sd == {}
    assert bn.num_batches_tracked.shape == () and bn.num_batches_tracked.dtype == dtypes.int64
    assert bn.num_batches_tracked.item() == 7
    np.testing.assert_allclose(bn(Tensor([[0.5, 2.5]])).numpy(), [[0.0, 1.0 + 3.0 * 2 / np.sqrt(4 + 1e-5)]], rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------------
# safetensors

DTYPE_CASES = [("F32", np.float32, dtypes.float32), ("F16", np.float16, dtypes.float16), ("I64", np.int64, dtypes.int64),
               ("I8", np.int8, dtypes.int8), ("U8", np.uint8, dtypes.uint8), ("F64", np.float64, dtypes.float64),
               ("I32", np.int32, dtypes.int32), ("BOOL", np.bool_, dtypes.bool), ("U16", np.uint16, dtypes.uint16)]


def write_safetensors(path, arrays: dict, metadata=None, pad_to: int = 8):
    """An independent writer (straight from the format description) to check safe_load against."""
    header, blobs, off = {}, [], 0
    for k, (code, a) in arrays.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[k] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata: header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % pad_to)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_safe_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {f"t_{code}": (rng.standard_normal((3, 4)) * 50).astype(npdt) for code, npdt, _ in DTYPE_CASES}
    tensors = {k: Tensor(v) for k, v in arrays.items()}
    tensors["scalar"], tensors["empty"] = Tensor(3.5, dtype=dtypes.float32), Tensor.zeros(0, 3)
    tensors["bf16"] = Tensor([1.5, -2.0, 3.25]).cast(dtypes.bfloat16)
    tensors["view"] = Tensor(arrays["t_F32"]).T[1:3]        # a non-contiguous view is saved row-major
    fn = tmp_path / "m.safetensors"
    safe_save(tensors, fn, metadata={"format": "pt", "note": "hi"})
    # the bytes follow the spec: parse them independently
    raw = fn.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert (8 + n) % 8 == 0 and header["__metadata__"] == {"format": "pt", "note": "hi"}
    assert header["t_F16"]["dtype"] == "F16" and header["scalar"]["shape"] == []
    s, e = header["t_I64"]["data_offsets"]
    np.testing.assert_array_equal(np.frombuffer(raw[8 + n + s:8 + n + e], np.int64).reshape(3, 4), arrays["t_I64"])
    # and safe_load reads them back
    loaded = safe_load(fn)
    assert isinstance(loaded, LazyStateDict) and loaded.metadata["note"] == "hi"
    for code, npdt, fdt in DTYPE_CASES:
        t = loaded[f"t_{code}"]
        assert t.dtype == fdt and t.shape == (3, 4)
        np.testing.assert_array_equal(t.numpy(), arrays[f"t_{code}"])
    assert loaded["scalar"].shape == () and loaded["scalar"].item() == 3.5
    assert loaded["empty"].shape == (0, 3)
    assert loaded["bf16"].dtype == dtypes.bfloat16 and loaded["bf16"].float().tolist() == [1.5, -2.0, 3.25]
    np.testing.assert_array_equal(loaded["view"].numpy(), arrays["t_F32"].T[1:3])
    _, hlen, hdr = safe_load_metadata(fn)
    assert hlen == n and hdr["__metadata__"]["format"] == "pt"


def test_safe_load_reads_an_independent_writers_file(tmp_path):
    a, b = rand(2, 3), np.arange(5, dtype=np.int32)
    fn = tmp_path / "x.safetensors"
    write_safetensors(fn, {"a": ("F32", a), "b": ("I32", b)}, pad_to=1)  # no padding: allowed by the format
    sd = safe_load(str(fn))
    np.testing.assert_array_equal(sd["a"].numpy(), a)
    np.testing.assert_array_equal(sd["b"].numpy(), b)


def test_safe_load_is_lazy_and_memory_mapped(tmp_path):
    fn = tmp_path / "big.safetensors"
    safe_save({"a": Tensor(rand(64, 64)), "b": Tensor(rand(8, seed=1))}, fn)
    sd = safe_load(fn)
    assert sd._loaded == {} and sd.shape_of("a") == (64, 64) and list(sd) == ["a", "b"] and "b" in sd
    src = sd._entries["b"][1].args[0]
    assert src._mm is not None  # backed by an mmap of the file, not a read() copy
    np.testing.assert_allclose(sd["b"].numpy(), rand(8, seed=1))
    assert set(sd._loaded) == {"b"}     # only what was used has been copied out
    # saving over the file while it is mapped replaces it atomically: the old mapping stays valid
    safe_save({"a": Tensor.zeros(1)}, fn)
    np.testing.assert_allclose(sd["a"].numpy(), rand(64, 64))


def test_safe_load_into_model(tmp_path):
    a, b = Block(), Block()
    fn = tmp_path / "block.safetensors"
    safe_save(get_state_dict(a), fn)
    load_state_dict(b, safe_load(fn))
    x = Tensor(rand(1, 2, 4, 4))
    np.testing.assert_allclose(b(x).numpy(), a(x).numpy(), rtol=1e-6)


@pytest.mark.parametrize("case", ["empty", "short", "huge_header", "bad_json", "not_object", "bad_dtype", "bad_shape",
                                  "size_mismatch", "truncated_data", "missing_field"])
def test_safe_load_malformed(tmp_path, case):
    fn = tmp_path / f"{case}.safetensors"
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}

    def make(header, data=b"\0" * 16):
        h = json.dumps(header).encode() if not isinstance(header, bytes) else header
        return struct.pack("<Q", len(h)) + h + data
    blobs = {
        "empty": b"", "short": b"\x01\x02", "huge_header": struct.pack("<Q", 1 << 40) + b"{}",
        "bad_json": make(b"{not json"), "not_object": make([1, 2]),
        "bad_dtype": make({"w": {**good["w"], "dtype": "F99"}}),
        "bad_shape": make({"w": {**good["w"], "shape": [2, -2]}}),
        "size_mismatch": make({"w": {**good["w"], "shape": [3, 2]}}),
        "truncated_data": make(good, b"\0" * 10),
        "missing_field": make({"w": {"dtype": "F32", "shape": [2, 2]}})}
    fn.write_bytes(blobs[case])
    with pytest.raises(FormatError, match=str(fn).replace(".", r"\.")):
        safe_load(fn)


def test_safe_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors"): safe_load(tmp_path / "nope.safetensors")


def test_safe_save_rejects_bad_input(tmp_path):
    with pytest.raises(TypeError): safe_save({"a": [1, 2]}, tmp_path / "a.safetensors")
    with pytest.raises(TypeError): safe_save({"a": Tensor([1.0])}, tmp_path / "a.safetensors", metadata={"k": 1})
    assert not (tmp_path / "a.safetensors").exists()


def test_load_state_dict_takes_loaded_buffers_without_copy_kernels_and_never_aliases_writes():
    """A fresh model's lazy initial weights take a computed state dict's buffers as they are (no copy kernel), and the
    two tensors still behave as copies: a write to either is not seen by the other (as torch's copy_ gives)."""
    from fusegrad import GlobalCounters
    from fusegrad.nn.state import get_state_dict, load_state_dict
    rng = np.random.default_rng(0)
    sd = {"weight": Tensor(rng.standard_normal((3, 4)).astype(np.float32)),
          "bias": Tensor(rng.standard_normal(3).astype(np.float32))}
    want = {k: v.numpy().copy() for k, v in sd.items()}
    model = nn.Linear(4, 3)
    GlobalCounters.reset()
    load_state_dict(model, sd)
    assert GlobalCounters.kernel_count == 0
    assert model.weight.tolist() == want["weight"].tolist() and model.bias.tolist() == want["bias"].tolist()
    model.weight.assign(model.weight * 2).realize()      # the model's write: the state dict keeps its values
    np.testing.assert_array_equal(sd["weight"].numpy(), want["weight"])
    np.testing.assert_array_equal(model.weight.numpy(), want["weight"] * 2)
    sd["bias"].assign(sd["bias"] + 1).realize()          # the state dict's write: the model keeps its values
    np.testing.assert_array_equal(model.bias.numpy(), want["bias"])
    # a realized model weight is copied into (its buffer may be captured by TinyJit or viewed): one kernel each
    GlobalCounters.reset()
    load_state_dict(model, {k: Tensor(v) for k, v in want.items()})
    assert GlobalCounters.kernel_count >= 1 and model.weight.tolist() == want["weight"].tolist()


def test_load_state_dict_gives_two_weights_loaded_from_one_tensor_their_own_gradients():
    """One tensor loaded into two parameters: the second gets a copy, so their gradients stay apart (sharing the
    buffer node would give each the sum of both), as torch's load_state_dict into two Linears."""
    from fusegrad.nn.state import load_state_dict
    w = Tensor([[1.0, 2.0]])
    class Two:
        def __init__(self): self.a, self.b = nn.Linear(2, 1, bias=False), nn.Linear(2, 1, bias=False)
    m = Two()
    load_state_dict(m, {"a.weight": w, "b.weight": w})
    assert m.a.weight.uop is not m.b.weight.uop
    x = Tensor([[1.0, 1.0]])
    for p in (m.a.weight, m.b.weight): p.requires_grad_()
    (m.a(x) * 3 + m.b(x) * 5).sum().backward()
    assert m.a.weight.grad.tolist() == [[3.0, 3.0]] and m.b.weight.grad.tolist() == [[5.0, 5.0]]


def test_load_state_dict_into_a_lazy_random_layer_leaves_later_random_numbers_unchanged():
    """Taking the loaded buffers drops the layer's pending random draws: the numbers drawn after it stay the ones a
    run without the load draws (they depend on the order of creation only)."""
    from fusegrad.nn.state import load_state_dict

    def run(load):
        Tensor.manual_seed(3)
        a, b = nn.Linear(4, 3), nn.Linear(4, 3)
        if load:
            load_state_dict(a, {"weight": Tensor(np.ones((3, 4), np.float32)), "bias": Tensor(np.ones(3, np.float32))})
        return b.weight.numpy(), Tensor.rand(5).numpy(), a.weight.numpy()
    plain, loaded = run(False), run(True)
    np.testing.assert_array_equal(plain[0], loaded[0])
    np.testing.assert_array_equal(plain[1], loaded[1])
    assert (loaded[2] == 1).all()
