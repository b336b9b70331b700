"""ResNet-50 v1.5 in plain torch (torchvision does not load with the CPU build of torch 2.13).

The layout MLPerf trains (the reference TF2 ``resnet_model.py``, NVIDIA's submissions): a 7x7/2 stem
convolution with BatchNorm and ReLU, a 3x3/2 max pool, four stages of bottleneck blocks (3, 4, 6, 3)
of widths 64, 128, 256, 512 with expansion 4, global average pooling and a 2048 -> 1000 linear layer:
25,557,032 trainable parameters. **v1.5**: a stage's downsampling stride sits on the bottleneck's
3x3 convolution (v1 put it on the first 1x1, which throws away 3/4 of the input before looking at
it); the projection shortcut (1x1 convolution + BatchNorm) has the same stride. Convolutions carry
no bias (BatchNorm follows each one); BatchNorm uses eps 1e-5 and torch momentum 0.1 (TF's decay 0.9).
The reference pads TF-"same" (one extra row/column at the bottom/right for the stride-2 3x3 and the
max pool); torch pads symmetrically, as NVIDIA's PyTorch implementation does: the parameters and
output shapes are the same.

Initialisation: convolutions He-normal over fan-in, truncated at two standard deviations (Keras's
``he_normal`` of the reference); the classifier N(0, 0.01) with a zero bias; BatchNorm gamma 1 and
beta 0 (the reference's Keras defaults; NVIDIA's closed submissions log the same, their ``MLPerfInit``).
``zero_init_residual`` (off by default; NVIDIA's ``--bn-gamma-init0``, which their closed runs in
training_results_v4.0 do not pass) starts the last BatchNorm of every bottleneck at gamma 0, so each
block starts as the identity: an open-division choice, as the closed rules fix the reference's init.

**Channels-last friendly**: nothing reshapes an activation by ``view`` (pooling is a mean over H, W),
so a model and input in ``torch.channels_last`` stay in it end to end. **Fusion**: on a GPU the
BatchNorm + ReLU (+ residual add) after each convolution is where NVIDIA fuses kernels (cuDNN's
BN-add-ReLU / apex's ``bn_addrelu``); :class:`Bottleneck` keeps them as separate plain modules, the
seam being ``_bn_relu`` and the ``add + relu`` at the end of ``forward``, so a fused implementation
can replace exactly those two spots. On a CPU torch runs them as separate kernels either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

#: BatchNorm as the reference: TF decay 0.9 == torch momentum 0.1, eps 1e-5
BN_EPS = 1e-5
BN_MOMENTUM = 0.1
EXPANSION = 4
#: Keras's truncated-normal std correction: the std of a unit normal truncated at +-2
_TRUNC_STD = 0.87962566103423978


@dataclass(frozen=True)
class ModelConfig:
    """Defaults: ResNet-50 v1.5 for ImageNet-1k. ``width`` is the stem's and the first stage's
    bottleneck width (64); stage ``i`` has ``width * 2**i``, its output ``EXPANSION`` times that."""

    depths: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    num_classes: int = 1000
    in_channels: int = 3
    zero_init_residual: bool = False  # the reference: every gamma 1

    def __post_init__(self) -> None:
        if not self.depths or any(d < 1 for d in self.depths) or self.width < 1 or self.num_classes < 2:
            raise ValueError(f"ModelConfig: depths must be >= 1 each, width >= 1, num_classes >= 2; got {self}")

    @property
    def features(self) -> int:
        """Channels into the classifier (2048 for ResNet-50)."""
        return self.width * 2 ** (len(self.depths) - 1) * EXPANSION

    def param_count(self) -> int:
        """Trainable parameters by formula (convolutions without bias, 2 per BatchNorm channel)."""
        w = self.width
        total = self.in_channels * w * 49 + 2 * w  # stem conv + BN
        cin = w
        for i, depth in enumerate(self.depths):
            mid = w * 2**i
            out = mid * EXPANSION
            for b in range(depth):
                total += cin * mid + 2 * mid + mid * mid * 9 + 2 * mid + mid * out + 2 * out
                if b == 0:  # a stage's first block changes the channels (and stride): projection shortcut
                    total += cin * out + 2 * out
                cin = out
        return total + cin * self.num_classes + self.num_classes


#: the smallest useful shape, for tests and the ``mini`` preset (trains in seconds on 2 CPU cores)
TINY = ModelConfig(depths=(1, 1, 1, 1), width=16, num_classes=10)


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)


def _conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)


class Shortcut(nn.Module):
    """The projection shortcut of a stage's first block: 1x1 convolution (the block's stride) + BN."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, 1, stride)
        self.bn = _bn(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here: v1.5), 1x1 expand; each followed by BN; ReLU after the first
    two and after the residual add."""

    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        out = mid * EXPANSION
        self.conv1, self.bn1 = _conv(cin, mid, 1), _bn(mid)
        self.conv2, self.bn2 = _conv(mid, mid, 3, stride), _bn(mid)
        self.conv3, self.bn3 = _conv(mid, out, 1), _bn(out)
        self.shortcut = Shortcut(cin, out, stride) if (stride != 1 or cin != out) else None
        self.relu = nn.ReLU(inplace=True)

    def _bn_relu(self, x: torch.Tensor, bn: nn.BatchNorm2d) -> torch.Tensor:
        return self.relu(bn(x))  # the BN+ReLU a GPU build fuses

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        y = self._bn_relu(self.conv1(x), self.bn1)
        y = self._bn_relu(self.conv2(y), self.bn2)
        return self.relu(self.bn3(self.conv3(y)) + identity)  # the BN+add+ReLU a GPU build fuses


class ResNet(nn.Module):
    """ResNet v1.5 with bottleneck blocks; ``forward`` maps (N, C, H, W) images to (N, classes) logits."""

    def __init__(self, cfg: ModelConfig = ModelConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.conv1 = nn.Conv2d(cfg.in_channels, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = _bn(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Sequential] = []
        cin = w
        for i, depth in enumerate(cfg.depths):
            mid = w * 2**i
            blocks = []
            for b in range(depth):
                blocks.append(Bottleneck(cin, mid, stride=2 if (b == 0 and i > 0) else 1))
                cin = mid * EXPANSION
            stages.append(nn.Sequential(*blocks))
        self.layers = nn.ModuleList(stages)
        self.fc = nn.Linear(cfg.features, cfg.num_classes)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_in = m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
                std = math.sqrt(2.0 / fan_in) / _TRUNC_STD
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.fc.weight, std=0.01)
        nn.init.zeros_(self.fc.bias)
        if self.cfg.zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for stage in self.layers:
            x = stage(x)
        return self.fc(x.mean(dim=(2, 3)))  # global average pool; no view, so channels-last stays


def no_weight_decay(name: str) -> bool:
    """Parameters MLPerf's LARS leaves out of weight decay and trust-ratio scaling (the reference's
    ``skip_list = ['batch_normalization', 'bias', 'bn']``): every BatchNorm gamma/beta and every bias
    (here only the classifier's). Keyed by the names :class:`ResNet` gives its parameters
    (``...bn1.weight``, ``...shortcut.bn.bias``, ``fc.bias``)."""
    module, _, leaf = name.rpartition(".")
    return leaf == "bias" or module.rsplit(".", 1)[-1].startswith("bn")


def no_weight_decay_names(model: nn.Module) -> list[str]:
    """The same set found by module type (BatchNorm parameters and biases), for checking the
    name rule against a built model."""
    out: list[str] = []
    for mname, m in model.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            if isinstance(m, nn.modules.batchnorm._BatchNorm) or pname == "bias":
                out.append(f"{mname}.{pname}" if mname else pname)
    return out
