"""ResNet 18/34/50/101/152 (and ResNeXt / wide variants) for image classification: (N, 3, H, W) normalized images ->
(N, classes) logits, with torchvision's state-dict names so its .pth files load as they are.
"""
from __future__ import annotations

import os
import pathlib

from fusegrad import nn
from fusegrad.models.weights import find_weights, load_weights
from fusegrad.tensor import Tensor

DEPTHS: dict[int, tuple[int, int, int, int]] = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3),
                                                101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
# torchvision's ImageNet weights (the original "IMAGENET1K_V1" training), as published on download.pytorch.org
TORCHVISION_FILES = {18: "resnet18-5c106cde.pth", 34: "resnet34-333f7ec4.pth", 50: "resnet50-19c8e357.pth",
                     101: "resnet101-5d3b4d8f.pth", 152: "resnet152-b121ed2d.pth"}
TORCHVISION_URL = "https://download.pytorch.org/models/"


class BasicBlock:
    """Two 3x3 convolutions (the first with the stride) and a residual; ResNet-18/34's block.

    >>> BasicBlock(64, 128, stride=2)(Tensor.zeros(1, 64, 8, 8)).shape
    (1, 128, 4, 4)
    """
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, groups: int = 1, base_width: int = 64):
        if groups != 1 or base_width != 64: raise ValueError("BasicBlock supports only groups=1, width_per_group=64")
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = _shortcut(cin, planes, stride)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.bn1(self.conv1(x)).relu()
        h = self.bn2(self.conv2(h))
        return (h + (x.sequential(self.downsample) if self.downsample else x)).relu()


class Bottleneck:
    """1x1 reduce, 3x3 (with the stride, torchvision's "v1.5" placement), 1x1 expand x4, and a residual; ResNet-50+.

    >>> Bottleneck(256, 128, stride=2)(Tensor.zeros(1, 256, 8, 8)).shape
    (1, 512, 4, 4)
    """
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, groups: int = 1, base_width: int = 64):
        width = int(planes * (base_width / 64.0)) * groups
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = _shortcut(cin, planes * 4, stride)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.bn1(self.conv1(x)).relu()
        h = self.bn2(self.conv2(h)).relu()
        h = self.bn3(self.conv3(h))
        return (h + (x.sequential(self.downsample) if self.downsample else x)).relu()


def _shortcut(cin: int, cout: int, stride: int) -> list:
    """torchvision's `downsample` (1x1 conv with the stride, then batch norm) where the shape changes, else []."""
    if stride == 1 and cin == cout: return []
    return [nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)]


class ResNet:
    """ResNet (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016) as torchvision builds it: 7x7
    stride-2 stem, 3x3 max pool, four stages of Basic (18, 34) or Bottleneck (50, 101, 152) blocks with the stride on
    the 3x3 convolution, global average pool, linear classifier. `groups` and `width_per_group` make ResNeXt
    (32, 4) and wide ResNets (1, 128). Input: (N, 3, H, W) float images normalized with ImageNet's mean and std
    (torchvision evaluates at 224 px after resizing the short side to 256: `preprocess(img, 224, resize=256)`).

    Weights: torchvision's ImageNet .pth files (`resnet50-19c8e357.pth`, ...) or any checkpoint with its names;
    `ResNet.from_pretrained` finds or downloads them.

    >>> ResNet(18)(Tensor.zeros(1, 3, 32, 32)).shape
    (1, 1000)
    """

    def __init__(self, num: int = 50, num_classes: int = 1000, groups: int = 1, width_per_group: int = 64):
        if num not in DEPTHS: raise ValueError(f"unknown ResNet depth {num!r}: expected one of {sorted(DEPTHS)}")
        self.num, self.groups, self.width_per_group = num, groups, width_per_group
        block = BasicBlock if num < 50 else Bottleneck
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        cin = 64
        stages: list[list[BasicBlock | Bottleneck]] = []
        for i, (planes, repeats) in enumerate(zip((64, 128, 256, 512), DEPTHS[num])):
            stage = []
            for r in range(repeats):
                stage.append(block(cin, planes, 2 if r == 0 and i > 0 else 1, groups, width_per_group))
                cin = planes * block.expansion
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cin, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """(N, 3, H, W) -> layer4's (N, C, H/32, W/32) feature map."""
        if x.ndim != 4 or x.shape[1] != 3: raise ValueError(f"ResNet expects (N, 3, H, W) images, got shape {x.shape}")
        x = self.bn1(self.conv1(x)).relu().max_pool2d(kernel_size=3, stride=2, padding=1)   # (N, 64, H/4, W/4)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in stage: x = block(x)
        return x

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x).mean((2, 3)))   # (N, classes)

    def load_from_pretrained(self, weights: str | os.PathLike | None = None, download: bool = True) -> ResNet:
        """Load ImageNet weights into this model (see `from_pretrained` for where they are looked for); returns it."""
        what = f"ResNet-{self.num}" + (f" (groups={self.groups}, width_per_group={self.width_per_group})"
                                       if (self.groups, self.width_per_group) != (1, 64) else "")
        plain = (self.groups, self.width_per_group) == (1, 64)
        filename = TORCHVISION_FILES[self.num] if plain else \
            f"resnet{self.num}-g{self.groups}-w{self.width_per_group}.pth"
        url = TORCHVISION_URL + filename if plain else None
        path = find_weights(what, weights, "resnet", filename, url=url, download=download)
        load_weights(self, path, what)
        self.weights_path = pathlib.Path(path)
        return self

    @classmethod
    def from_pretrained(cls, num: int = 50, weights: str | os.PathLike | None = None, download: bool = True,
                        **kwargs: int) -> ResNet:
        """A ResNet-`num` with ImageNet weights, taken from, in order: `weights` (a path or URL), fetch's cache
        (`~/.cache/fusegrad/downloads/resnet/resnet50-19c8e357.pth`, ...), and a download of torchvision's file when
        `download`. Raises WeightsNotFound saying where to put the file when none is there.

        >>> ResNet.from_pretrained(18).fc.weight.shape   # doctest: +SKIP
        (1000, 512)
        """
        with nn.skip_init(): model = cls(num, **kwargs)   # every weight is loaded next: don't compute random ones
        return model.load_from_pretrained(weights, download)


__all__ = ["BasicBlock", "Bottleneck", "ResNet"]
