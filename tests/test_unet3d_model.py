"""3D U-Net model: the reference parameter count on the meta device, the module layout the spatial
parallel wrapper relies on (plain Conv3d / ConvTranspose3d / InstanceNorm3d), and shapes."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcbench.workloads.mlperf_training.unet3d.config import UNetModelConfig
from hpcbench.workloads.mlperf_training.unet3d.model import UNet3D, divisor, param_count

# Measured on the reference's own Unet3D(1, 3, "instancenorm", "relu") (image_segmentation/pytorch/model).
REFERENCE_PARAMS = 31_190_243


def test_reference_parameter_count_on_meta() -> None:
    cfg = UNetModelConfig()
    with torch.device("meta"):
        model = UNet3D(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg) == REFERENCE_PARAMS
    assert divisor(cfg) == 32  # five halvings: 128 -> 4 at the bottleneck


def test_layout_is_plain_modules_with_reference_biases() -> None:
    model = UNet3D(UNetModelConfig())
    convs = [m for m in model.modules() if type(m) is nn.Conv3d]
    ups = [m for m in model.modules() if type(m) is nn.ConvTranspose3d]
    norms = [m for m in model.modules() if isinstance(m, nn.InstanceNorm3d)]
    assert len(convs) == 2 + 2 * 4 + 2 + 2 * 5 + 1 and len(ups) == 5 and len(norms) == len(convs) - 1
    assert all(m.affine for m in norms)
    assert [c.bias is None for c in convs].count(False) == 1  # only the 1x1x1 output convolution has a bias
    assert all(u.bias is not None and u.kernel_size == (2, 2, 2) and u.stride == (2, 2, 2) for u in ups)
    assert [m.out_channels for m in ups] == [320, 256, 128, 64, 32]
    assert sum(1 for m in convs if m.stride == (2, 2, 2)) == 5


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_small_model_keeps_the_volume_shape_and_trains(act: str) -> None:
    cfg = UNetModelConfig(channels=(4, 8, 8), activation=act)
    torch.manual_seed(0)
    model = UNet3D(cfg)
    x = torch.randn(2, 1, 16, 24, 8)  # multiples of 8 = divisor
    out = model(x)
    assert out.shape == (2, 3, 16, 24, 8)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    want = nn.LeakyReLU if act == "leaky_relu" else nn.ReLU
    assert any(type(m) is want for m in model.modules())
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)
