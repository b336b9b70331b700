"""The tiny workload's model: an MLP (plain torch, fp32; the harness sets precision and sharding)."""
from __future__ import annotations

from torch import nn


def mlp(features: int, hidden: int, targets: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, targets))
