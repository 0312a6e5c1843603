"""ResNet against a reference written here in plain torch with torchvision's state-dict names (torchvision itself can't
be installed beside this torch): random weights saved with torch.save and loaded by our loader. Layouts are also checked
against torchvision's documented parameter counts."""
from __future__ import annotations

import pathlib
import urllib.error

import numpy as np
import pytest
import torch
from torch import nn as tnn

from fusegrad import Tensor
from fusegrad.models import ResNet, WeightsNotFound
from fusegrad.nn import skip_init
from fusegrad.nn.state import StateDictMismatch, get_state_dict

from .helpers import assert_logits_close, randomize_, save_state_dict

# num_params of torchvision's resnet18 ... resnet152, resnext50_32x4d and wide_resnet50_2 (its model docs)
TORCHVISION_PARAMS = {(18, 1, 64): 11_689_512, (34, 1, 64): 21_797_672, (50, 1, 64): 25_557_032,
                      (101, 1, 64): 44_549_160, (152, 1, 64): 60_192_808, (50, 32, 4): 25_028_904,
                      (50, 1, 128): 68_883_240}


class RefBlock(tnn.Module):
    """Basic (two 3x3) or bottleneck (1x1, 3x3 with the stride, 1x1 x4) residual block, named as torchvision's."""

    def __init__(self, cin: int, planes: int, stride: int, bottleneck: bool, groups: int = 1, base_width: int = 64):
        super().__init__()
        self.bottleneck = bottleneck
        cout = planes * 4 if bottleneck else planes
        if bottleneck:
            width = int(planes * base_width / 64) * groups
            self.conv1, self.bn1 = tnn.Conv2d(cin, width, 1, bias=False), tnn.BatchNorm2d(width)
            self.conv2 = tnn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
            self.bn2 = tnn.BatchNorm2d(width)
            self.conv3, self.bn3 = tnn.Conv2d(width, cout, 1, bias=False), tnn.BatchNorm2d(cout)
        else:
            self.conv1, self.bn1 = tnn.Conv2d(cin, planes, 3, stride, 1, bias=False), tnn.BatchNorm2d(planes)
            self.conv2, self.bn2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False), tnn.BatchNorm2d(planes)
        self.downsample = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        if self.bottleneck: h = self.bn3(self.conv3(torch.relu(h)))
        return torch.relu(h + (self.downsample(x) if self.downsample is not None else x))


class RefResNet(tnn.Module):
    def __init__(self, depths: tuple[int, ...], bottleneck: bool, groups: int = 1, width: int = 64):
        super().__init__()
        self.conv1, self.bn1 = tnn.Conv2d(3, 64, 7, 2, 3, bias=False), tnn.BatchNorm2d(64)
        cin = 64
        for i, (planes, n) in enumerate(zip((64, 128, 256, 512), depths)):
            blocks = []
            for r in range(n):
                blocks.append(RefBlock(cin, planes, 2 if r == 0 and i > 0 else 1, bottleneck, groups, width))
                cin = planes * (4 if bottleneck else 1)
            setattr(self, f"layer{i + 1}", tnn.Sequential(*blocks))
        self.fc = tnn.Linear(cin, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = tnn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for i in range(1, 5): x = getattr(self, f"layer{i}")(x)
        return self.fc(x.mean((2, 3)))


REF_DEPTHS = {18: ((2, 2, 2, 2), False), 34: ((3, 4, 6, 3), False), 50: ((3, 4, 6, 3), True),
              101: ((3, 4, 23, 3), True), 152: ((3, 8, 36, 3), True)}


@pytest.mark.parametrize("num, groups, width", list(TORCHVISION_PARAMS))
def test_layout_matches_torchvision_and_the_reference(num: int, groups: int, width: int) -> None:
    with skip_init(): ours = get_state_dict(ResNet(num, groups=groups, width_per_group=width))
    params = sum(int(np.prod(v.shape)) for k, v in ours.items()
                 if not k.endswith(("running_mean", "running_var", "num_batches_tracked")))
    assert params == TORCHVISION_PARAMS[(num, groups, width)]
    ref = RefResNet(*REF_DEPTHS[num], groups, width).state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: tuple(v.shape) for k, v in ref.items()}


@pytest.mark.parametrize("num", [18, 50])
def test_random_weights_match_the_reference(num: int, tmp_path: pathlib.Path) -> None:
    """63 px: odd sizes through every stride-2 stage (63 -> 32 -> 16 ...), padding and max pool edges included."""
    ref = randomize_(RefResNet(*REF_DEPTHS[num]), seed=num)
    model = ResNet.from_pretrained(num, weights=save_state_dict(ref, tmp_path / f"resnet{num}.pth"))
    x = np.random.default_rng(num).standard_normal((2, 3, 63, 63)).astype(np.float32)
    with torch.no_grad(): theirs = ref(torch.from_numpy(x)).numpy()
    assert_logits_close(model(Tensor(x)).numpy(), theirs)


def test_errors(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown ResNet depth 20"): ResNet(20)
    path = save_state_dict(RefResNet(*REF_DEPTHS[34]), tmp_path / "resnet34.pth")
    with pytest.raises(StateDictMismatch, match=r"resnet34.pth doesn't hold weights for ResNet-18: .*first mismatch at "
                       r"'layer1.2.conv1.weight': model has no such key, state_dict has \(64, 64, 3, 3\)"):
        ResNet.from_pretrained(18, weights=path)
    path = save_state_dict(RefResNet(*REF_DEPTHS[18]), tmp_path / "resnet18.pth")
    with pytest.raises(StateDictMismatch, match=r"first mismatch at 'layer1.0.conv1.weight': model has "
                       r"\(64, 64, 1, 1\), state_dict has \(64, 64, 3, 3\)"):
        ResNet.from_pretrained(50, weights=path)
    cache = str(tmp_path / "cache")
    monkeypatch.setattr("fusegrad.helpers.cache_dir", lambda: cache)
    monkeypatch.setattr("fusegrad.models.weights.cache_dir", lambda: cache)

    def offline(*a: object, **k: object) -> None: raise urllib.error.URLError("network is unreachable (test)")
    monkeypatch.setattr("urllib.request.urlopen", offline)
    with pytest.raises(WeightsNotFound, match=r"no weights for ResNet-50 \(the download of "
                       r"https://download.pytorch.org/models/resnet50-19c8e357.pth failed: network is unreachable"):
        ResNet.from_pretrained(50)
