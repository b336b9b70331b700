"""The MLPerf 3D U-Net (KiTS19), single-device, built only from plain modules.

As the reference (``image_segmentation/pytorch/model``): every block is Conv3d(k3, no bias) ->
InstanceNorm3d(affine) -> ReLU (or LeakyReLU 0.01); an input block of two such convolutions at
``channels[0]``; one down block per step of ``channels`` (first convolution stride 2) and a
bottleneck down block at ``channels[-1]``; the decoder mirrors it with a ConvTranspose3d (k2, s2,
bias) followed by concatenation with the skip and two convolutions; a 1x1x1 output convolution
(bias) to ``n_class`` logits. The reference's channels are 32, 64, 128, 256, 320 (five halvings:
the input must be a multiple of 32 per axis). Every convolution is an ``nn.Conv3d`` or
``nn.ConvTranspose3d`` module (no functional calls) so that spatial parallelism can wrap them.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .config import UNetModelConfig


def conv_block(c_in: int, c_out: int, stride: int, norm: str, activation: str) -> nn.Sequential:
    """Conv3d(k3, p1) -> norm -> activation; the convolution has a bias only without a norm (as the reference)."""
    conv = nn.Conv3d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=norm == "none")
    return nn.Sequential(conv, _norm(norm, c_out), _activation(activation))


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "instancenorm":
        return nn.InstanceNorm3d(channels, affine=True)
    if kind == "batchnorm":
        return nn.BatchNorm3d(channels)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"model.norm: expected 'instancenorm', 'batchnorm' or 'none', got {kind!r}")


def _activation(kind: str) -> nn.Module:
    if kind == "relu":
        return nn.ReLU()
    if kind == "leaky_relu":
        return nn.LeakyReLU(0.01)
    raise ValueError(f"model.activation: expected 'relu' or 'leaky_relu', got {kind!r}")


class DownBlock(nn.Module):
    """Halves every spatial axis (first convolution stride 2), then one more convolution."""

    def __init__(self, c_in: int, c_out: int, norm: str, activation: str) -> None:
        super().__init__()
        self.conv1 = conv_block(c_in, c_out, 2, norm, activation)
        self.conv2 = conv_block(c_out, c_out, 1, norm, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class UpBlock(nn.Module):
    """Doubles every spatial axis with a transposed convolution, joins the skip, two convolutions."""

    def __init__(self, c_in: int, c_out: int, norm: str, activation: str) -> None:
        super().__init__()
        self.upsample = nn.ConvTranspose3d(c_in, c_out, kernel_size=2, stride=2, padding=0, bias=True)
        self.conv1 = conv_block(2 * c_out, c_out, 1, norm, activation)
        self.conv2 = conv_block(c_out, c_out, 1, norm, activation)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = torch.cat((self.upsample(x), skip), dim=1)
        return self.conv2(self.conv1(x))


class UNet3D(nn.Module):
    """Input (N, in_channels, D, H, W) with D, H, W multiples of :func:`divisor`; output (N, n_class, D, H, W) logits."""

    def __init__(self, cfg: UNetModelConfig) -> None:
        super().__init__()
        ch: Sequence[int] = tuple(cfg.channels)
        self.channels = ch
        self.input_block = nn.Sequential(conv_block(cfg.in_channels, ch[0], 1, cfg.norm, cfg.activation),
                                         conv_block(ch[0], ch[0], 1, cfg.norm, cfg.activation))
        self.down = nn.ModuleList(DownBlock(i, o, cfg.norm, cfg.activation) for i, o in zip(ch[:-1], ch[1:]))
        self.bottleneck = DownBlock(ch[-1], ch[-1], cfg.norm, cfg.activation)
        ups = [UpBlock(ch[-1], ch[-1], cfg.norm, cfg.activation)]
        ups += [UpBlock(i, o, cfg.norm, cfg.activation) for i, o in zip(reversed(ch[1:]), reversed(ch[:-1]))]
        self.up = nn.ModuleList(ups)
        self.output = nn.Conv3d(ch[0], cfg.n_class, kernel_size=1, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_block(x)
        skips = [x]
        for block in self.down:
            x = block(x)
            skips.append(x)
        x = self.bottleneck(x)
        for block, skip in zip(self.up, reversed(skips)):
            x = block(x, skip)
        return self.output(x)


def divisor(cfg: UNetModelConfig) -> int:
    """Every spatial size the model takes must be a multiple of this (one halving per channel step + bottleneck)."""
    return 2 ** len(cfg.channels)


def param_count(cfg: UNetModelConfig) -> int:
    """Parameters by formula (checks the module tree against the reference layout)."""
    def conv(c_in: int, c_out: int, k: int, bias: bool) -> int:
        return c_in * c_out * k**3 + (c_out if bias else 0)

    def block(c_in: int, c_out: int) -> int:  # conv without bias (with a norm) + affine norm
        has_norm = cfg.norm != "none"
        norm = 2 * c_out if cfg.norm in ("instancenorm", "batchnorm") else 0
        return conv(c_in, c_out, 3, not has_norm) + norm

    ch = tuple(cfg.channels)
    n = block(cfg.in_channels, ch[0]) + block(ch[0], ch[0])
    for i, o in zip(ch[:-1], ch[1:]):
        n += block(i, o) + block(o, o)
    n += 2 * block(ch[-1], ch[-1])
    for i, o in [(ch[-1], ch[-1]), *zip(reversed(ch[1:]), reversed(ch[:-1]))]:
        n += conv(i, o, 2, True) + block(2 * o, o) + block(o, o)
    return n + conv(ch[0], cfg.n_class, 1, True)
