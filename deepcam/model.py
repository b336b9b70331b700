"""DeepLabv3+ with the modified aligned-Xception encoder, as in the MLPerf HPC DeepCAM reference.

Structure (output stride 16): a strided stem (conv 3x3/2, conv 3x3), an entry flow of three
residual blocks of separable convolutions (the first one's output is the decoder's low-level
feature at 1/4 resolution), a middle flow of ``middle_blocks`` identical residual blocks (16 in
the reference), an exit flow (one block and three separable convolutions up to 2048 channels),
ASPP with rates 1/6/12/18 plus an image-pooling branch (1x1 conv and a per-channel affine, no BN),
and the reference's transposed-convolution decoder that fuses the 48-channel low-level projection.

``width`` scales every encoder/decoder width by the same factor and ``middle_blocks`` sets the
depth, so the small presets run the same code. At width 1 with 16 middle blocks, 16 input channels
and 3 classes the network has exactly 56,454,720 trainable parameters.

Initialisation as in the reference (``architecture/deeplab_xception.py``), module by module: the Xception
encoder and each ASPP atrous branch initialise themselves at the end of their constructors
(:func:`kaiming_init`: ``kaiming_normal_`` on every ``Conv2d`` weight, BatchNorm weight 1 and bias 0, as the
reference's ``Xception.__init_weight`` and ``ASPP_module.__init_weight``); everything else keeps torch's
default initialisation: the image-pooling 1x1 conv (its affine at 1 and 0), the ASPP projection, the
low-level 1x1 projection and the whole decoder (transposed convs, 3x3 convs and the biased 1x1 conv),
whose ``__init_weight`` the reference's ``DeconvUpsampler`` and ``DeepLabv3_plus`` define but never call.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

Norm = Callable[[int], nn.Module]
M = TypeVar("M", bound=nn.Module)

#: total downsampling of the encoder; the decoder's fixed 2x transposed convolutions restore
#: exactly this, so a grid's height and width must be multiples of it (the reference takes 768x1152)
OUTPUT_STRIDE = 16


@dataclass
class ModelConfig:
    in_channels: int = 16
    num_classes: int = 3
    width: float = 1.0  # multiplier on every channel count of the reference network
    middle_blocks: int = 16

    def ch(self, reference: int) -> int:
        return max(4, int(round(reference * self.width)))


class SepConv(nn.Sequential):
    """Depthwise k x k (dilated, 'same' padding) followed by a pointwise 1x1; no bias."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dilation: int = 1) -> None:
        super().__init__(
            nn.Conv2d(cin, cin, 3, stride, padding=dilation, dilation=dilation, groups=cin, bias=False),
            nn.Conv2d(cin, cout, 1, bias=False),
        )


class StridedPointwise(nn.Conv2d):
    """1x1 convolution with stride. On the CPU it subsamples first and convolves with stride 1 (the
    same maths): torch 2.13's oneDNN weight-gradient of a strided 1x1 channels-last convolution with
    few channels crashes the process."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__(cin, cout, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stride[0]
        if s == 1 or x.device.type != "cpu":
            return super().forward(x)
        return F.conv2d(x[:, :, ::s, ::s], self.weight)


class XBlock(nn.Module):
    """Residual block: ``reps`` separable convs with BN (ReLU between them), optional extra
    separable conv (strided for downsampling, or unstrided when it closes a flow), plus a 1x1
    projection shortcut with BN when the shape changes."""

    def __init__(self, cin: int, cout: int, reps: int, norm: Norm, stride: int = 1, dilation: int = 1,
                 grow_first: bool = True, closing: bool = False, relu_out: bool = True) -> None:
        super().__init__()
        widths = [cin] + [cout] * reps if grow_first else [cin] * reps + [cout]
        layers: list[nn.Module] = []
        for i in range(reps):
            if i:
                layers.append(nn.ReLU(inplace=True))
            layers += [SepConv(widths[i], widths[i + 1], dilation=dilation), norm(widths[i + 1])]
        if stride != 1 or closing:
            layers.append(SepConv(cout, cout, stride=stride))
        self.body = nn.Sequential(*layers)
        self.shortcut = (nn.Sequential(StridedPointwise(cin, cout, stride), norm(cout))
                         if cin != cout or stride != 1 else nn.Identity())
        self.relu_out = relu_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x) + self.shortcut(x)
        return F.relu(y) if self.relu_out else y


def conv_bn_relu(cin: int, cout: int, norm: Norm, k: int = 3, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    pad = dilation * (k - 1) // 2
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, pad, dilation, bias=False), norm(cout), nn.ReLU(inplace=True))


class Xception(nn.Module):
    """Modified aligned Xception at output stride 16; returns (features, low-level features)."""

    def __init__(self, cfg: ModelConfig, norm: Norm) -> None:
        super().__init__()
        c = cfg.ch
        self.stem = nn.Sequential(conv_bn_relu(cfg.in_channels, c(32), norm, stride=2), conv_bn_relu(c(32), c(64), norm))
        self.entry1 = XBlock(c(64), c(128), 2, norm, stride=2, relu_out=False)
        self.entry2 = XBlock(c(128), c(256), 2, norm, stride=2)
        self.entry3 = XBlock(c(256), c(728), 2, norm, stride=2, closing=True)
        self.middle = nn.Sequential(*(XBlock(c(728), c(728), 3, norm) for _ in range(cfg.middle_blocks)))
        self.exit_block = XBlock(c(728), c(1024), 2, norm, grow_first=False, closing=True, relu_out=False)
        self.exit_convs = nn.Sequential(*(
            nn.Sequential(SepConv(a, b, dilation=2), norm(b), nn.ReLU(inplace=True))
            for a, b in ((c(1024), c(1536)), (c(1536), c(1536)), (c(1536), c(2048)))
        ))
        kaiming_init(self)  # the reference's Xception.__init_weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = self.entry1(self.stem(x))
        x = self.entry3(self.entry2(F.relu(low)))
        x = self.exit_convs(self.exit_block(self.middle(x)))
        return x, low


class ImagePool(nn.Module):
    """ASPP image-level branch: global average, 1x1 conv, per-channel affine (no BN), ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)
        self.scale = nn.Parameter(torch.ones(1, cout, 1, 1))
        self.shift = nn.Parameter(torch.zeros(1, cout, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x.mean(dim=(2, 3), keepdim=True)) * self.scale + self.shift)
        return y.expand(-1, -1, x.shape[2], x.shape[3])


class ASPP(nn.Module):
    def __init__(self, cin: int, cout: int, norm: Norm, rates: tuple[int, ...] = (1, 6, 12, 18)) -> None:
        super().__init__()
        # each branch initialises itself as the reference's ASPP_module does; the pool and projection keep torch's
        self.branches = nn.ModuleList(
            kaiming_init(conv_bn_relu(cin, cout, norm, k=1 if r == 1 else 3, dilation=r)) for r in rates
        )
        self.pool = ImagePool(cin, cout)
        self.project = conv_bn_relu(cout * (len(rates) + 1), cout, norm, k=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(torch.cat([b(x) for b in self.branches] + [self.pool(x)], dim=1))


def up2(cin: int, cout: int) -> nn.ConvTranspose2d:
    """Exact 2x upsampling transposed conv (3x3, stride 2, padding 1, output padding 1)."""
    return nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1, bias=False)


class Decoder(nn.Module):
    """Reference DeepCAM decoder: 4x up, fuse low-level features, two 3x3 + 1x1 convs, 2x up, 2x up."""

    def __init__(self, cin: int, low: int, mid: int, num_classes: int, norm: Norm) -> None:
        super().__init__()
        self.up_a = nn.Sequential(up2(cin, mid), norm(mid), nn.ReLU(inplace=True),
                                  up2(mid, mid), norm(mid), nn.ReLU(inplace=True))
        self.fuse = nn.Sequential(conv_bn_relu(mid + low, mid, norm), conv_bn_relu(mid, mid, norm),
                                  nn.Conv2d(mid, mid, 1))
        self.up_b = nn.Sequential(up2(mid, mid), norm(mid), nn.ReLU(inplace=True), up2(mid, num_classes))

    def forward(self, x: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
        x = self.fuse(torch.cat([self.up_a(x), low], dim=1))
        return self.up_b(x)


class DeepLabV3Plus(nn.Module):
    def __init__(self, cfg: ModelConfig, norm: Norm = nn.BatchNorm2d) -> None:
        super().__init__()
        c = cfg.ch
        self.encoder = Xception(cfg, norm)
        self.aspp = ASPP(c(2048), c(256), norm)
        self.low_proj = conv_bn_relu(c(128), c(48), norm, k=1)
        self.decoder = Decoder(c(256), c(48), c(256), cfg.num_classes, norm)
        # no initialisation here: low_proj and the decoder keep torch's defaults, as in the reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats, low = self.encoder(x)
        return self.decoder(self.aspp(feats), self.low_proj(low))


def kaiming_init(module: M) -> M:
    """The reference encoder's and ASPP branches' ``__init_weight``: ``kaiming_normal_`` (fan in, gain sqrt 2)
    on every ``Conv2d`` weight (none of them has a bias), BatchNorm weight 1 and bias 0; returns ``module``."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return module


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
