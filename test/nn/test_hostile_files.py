"""safetensors and GGUF readers on hostile files (built here): deep nesting, files truncated while loaded."""
import json
import os
import struct
import subprocess
import sys

import pytest

from fusegrad import Tensor
from fusegrad.nn.state import FormatError, gguf_load, safe_load, safe_load_metadata, safe_save


def safetensors_with_header(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_deep_safetensors_header_is_format_error(tmp_path, opener):
    fn = tmp_path / "deep.safetensors"
    fn.write_bytes(safetensors_with_header(b"{\"x\":" + opener.encode() * 100_000 + b"1" + b"}"))
    for load in (safe_load, safe_load_metadata):
        with pytest.raises(FormatError, match=r"deep\.safetensors.*nests too deeply \(at byte \d+\)"): load(fn)


def test_odd_safetensors_values_are_format_errors(tmp_path):
    for i, header in enumerate([{"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}},
                                {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4]}},
                                {"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}]):
        fn = tmp_path / f"odd{i}.safetensors"
        fn.write_bytes(safetensors_with_header(json.dumps(header).encode()) + b"\0" * 4)
        with pytest.raises(FormatError, match=f"odd{i}"): safe_load(fn)


def gguf_nested_arrays(depth: int) -> bytes:
    value = struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)  # array of array of ... of 0 u32s
    key = b"k"
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 9) + value


def test_deep_gguf_arrays_are_format_error(tmp_path):
    fn = tmp_path / "deep.gguf"
    fn.write_bytes(gguf_nested_arrays(100_000))
    with pytest.raises(FormatError, match=r"deep\.gguf.*nest more than \d+ deep at byte \d+"): gguf_load(fn)
    fn.write_bytes(gguf_nested_arrays(5))
    kv, _ = gguf_load(fn)
    assert kv["k"] == [[[[[[]]]]]]


def test_truncated_after_load_raises_not_sigbus(tmp_path):
    """Truncating a mapped file and then reading a tensor used to kill the process with SIGBUS: run in a child."""
    fn = tmp_path / "w.safetensors"
    safe_save({"a": Tensor.arange(1 << 16).float(), "b": Tensor.arange(1 << 16).float()}, fn)
    code = f"""import os, sys
from fusegrad.nn.state import safe_load, FormatError
sd = safe_load({str(fn)!r})
private = safe_load({str(fn)!r}, mmap=False)
os.truncate({str(fn)!r}, 4096)
assert private["b"][-1].item() == 65535.0, "mmap=False keeps a private copy"
try: sd["b"].numpy()
except FormatError as e: print("FormatError", e); sys.exit(0)
sys.exit(3)
"""
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                       cwd=os.getcwd())
    assert r.returncode == 0 and "truncated to 4096 bytes" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])


def test_every_loader_takes_mmap_false(tmp_path):
    fn = tmp_path / "w.safetensors"
    safe_save({"a": Tensor([1.0, 2.0])}, fn)
    assert safe_load(fn, mmap=False)["a"].tolist() == [1.0, 2.0]
    assert safe_load_metadata(fn, mmap=False)[1] > 0
    g = tmp_path / "deep.gguf"
    g.write_bytes(gguf_nested_arrays(1))
    assert gguf_load(g, mmap=False)[0]["k"] == [[]]
    torch = pytest.importorskip("torch")
    p = tmp_path / "legacy.pth"
    torch.save({"a": torch.arange(3.0)}, p, _use_new_zipfile_serialization=False)
    from fusegrad.nn.state import torch_load
    assert torch_load(p, mmap=False)["a"].tolist() == [0.0, 1.0, 2.0]


def test_empty_tensor_with_absurd_dimension_is_format_error(tmp_path):
    """Found by the GGUF fuzzer: dims (0, 0xFFFF000000000004) hold no bytes, load, and break numpy on read."""
    huge = 0xFFFF000000000004
    name = b"t"
    g = tmp_path / "dims.gguf"
    g.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", len(name)) + name
                  + struct.pack("<I", 2) + struct.pack("<2Q", huge, 0) + struct.pack("<IQ", 0, 0) + b"\0" * 32)
    with pytest.raises(FormatError, match=r"dims\.gguf.*2\*\*48"): gguf_load(g)
    s = tmp_path / "dims.safetensors"
    s.write_bytes(safetensors_with_header(json.dumps({"t": {"dtype": "F32", "shape": [0, 2**60],
                                                            "data_offsets": [0, 0]}}).encode()))
    with pytest.raises(FormatError, match=r"dims\.safetensors.*2\*\*48"): safe_load(s)
