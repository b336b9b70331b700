"""The CosmoFlow reference network (MLPerf HPC), single-device code.

``conv_layers`` blocks of [Conv3d k3 'same' -> LeakyReLU -> MaxPool3d(2)] with ``conv_channels``
doubling per block (32 ... 512 in the reference), then flatten -> Dense 128 -> Dense 64 -> Dense 4,
LeakyReLU and dropout after the hidden dense layers, and ``tanh(x) * 1.2`` on the output. For a
128^3 x 4 input this has 8,907,556 parameters. Input is NCDHW float (``log1p`` of the counts); the
model works unchanged in ``torch.channels_last_3d`` memory format and under bf16 autocast.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import CosmoModelConfig
from .data import N_CHANNELS, N_TARGETS


class CosmoFlowNet(nn.Module):
    def __init__(self, cfg: CosmoModelConfig, size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = N_CHANNELS
        for i in range(cfg.conv_layers):
            out_ch = cfg.conv_channels * 2 ** i
            layers += [nn.Conv3d(in_ch, out_ch, kernel_size=3, padding=1),
                       nn.LeakyReLU(cfg.leaky_slope), nn.MaxPool3d(2)]
            in_ch = out_ch
        self.features = nn.Sequential(*layers)
        edge = size // 2 ** cfg.conv_layers
        head: list[nn.Module] = [nn.Flatten()]
        width = in_ch * edge ** 3
        for hidden in cfg.fc_sizes:
            head += [nn.Linear(width, hidden), nn.LeakyReLU(cfg.leaky_slope), nn.Dropout(cfg.dropout)]
            width = hidden
        head.append(nn.Linear(width, N_TARGETS))
        self.head = nn.Sequential(*head)
        self.output_scale = cfg.output_scale
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Keras defaults, as in the reference: Glorot-uniform weights, zero biases."""
        for m in self.modules():
            if isinstance(m, (nn.Conv3d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        # flatten in (D, H, W, C) order like the reference Keras model, so its dense weights map
        # one to one; for channels_last_3d activations the permuted view is already contiguous
        h = h.permute(0, 2, 3, 4, 1).contiguous()
        return torch.tanh(self.head(h)) * self.output_scale


def decayed_names(cfg: CosmoModelConfig) -> frozenset[str]:
    """The parameters the reference's weight decay reaches: the kernels of the hidden Dense layers, which
    alone carry ``kernel_regularizer=l2(l2)`` (mlcommons/hpc cosmoflow/models/cosmoflow.py); not the convolutions,
    the biases or the output layer. Named as :class:`CosmoFlowNet` names them (``head.1.weight``, ``head.4.weight``:
    after the flatten, each hidden layer is a Linear, a LeakyReLU and a Dropout)."""
    return frozenset(f"head.{1 + 3 * i}.weight" for i in range(len(cfg.fc_sizes)))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def conv_flops_per_sample(cfg: CosmoModelConfig, size: int) -> float:
    """Forward multiply-add FLOPs (2 per MAC) of one sample: convs + dense layers."""
    flops, in_ch, edge = 0.0, N_CHANNELS, size
    for i in range(cfg.conv_layers):
        out_ch = cfg.conv_channels * 2 ** i
        flops += 2.0 * edge ** 3 * out_ch * in_ch * 27
        in_ch, edge = out_ch, edge // 2
    width = in_ch * edge ** 3
    for hidden in (*cfg.fc_sizes, N_TARGETS):
        flops += 2.0 * width * hidden
        width = hidden
    return flops
