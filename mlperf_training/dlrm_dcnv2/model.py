"""DLRM with a DCNv2 interaction (the MLPerf ``dlrm_dcnv2`` model), single-device, plain torch.

As the reference (torchrec ``DLRM_DCN`` with the MLPerf arguments): one sum-pooled embedding bag
per categorical feature (dim 128); a bottom MLP 13-512-256-128 with ReLU after every layer; the
bottom output and the 26 pooled embeddings concatenated to (26 + 1) * 128 = 3456 features; a
low-rank cross network (3 layers, rank 512: x_{l+1} = x_0 * (W_l V_l x_l + b_l) + x_l); a top MLP
1024-1024-512-256-1 with ReLU between layers and none after the last, giving one logit per sample.
Initialisation as torchrec: embedding rows uniform(+-sqrt(1 / rows)), Linear layers torch's
default, cross kernels Xavier-normal, cross biases 0. Model parallelism is beside it (``hybrid``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .criteo import CARDINALITIES, MULTI_HOT_SIZES, NUM_DENSE


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the model; the defaults are the MLPerf reference's."""

    cardinalities: tuple[int, ...] = CARDINALITIES
    bag_sizes: tuple[int, ...] = MULTI_HOT_SIZES  # not part of the weights: what the inputs hold
    embedding_dim: int = 128
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    dcn_layers: int = 3
    dcn_low_rank: int = 512
    num_dense: int = NUM_DENSE
    sparse_grads: bool = False  # sparse embedding gradients (torch Adagrad supports them); needed at full size

    def __post_init__(self) -> None:
        if len(self.cardinalities) != len(self.bag_sizes):
            raise ValueError(f"model: {len(self.cardinalities)} cardinalities but {len(self.bag_sizes)} bag sizes")
        if self.bottom_mlp[-1] != self.embedding_dim:
            raise ValueError(f"model: the bottom MLP must end at embedding_dim {self.embedding_dim}, "
                             f"got {self.bottom_mlp}")
        if self.top_mlp[-1] != 1:
            raise ValueError(f"model: the top MLP must end with one logit, got {self.top_mlp}")

    @property
    def interaction_features(self) -> int:
        return (len(self.cardinalities) + 1) * self.embedding_dim


def param_count(cfg: ModelConfig) -> int:
    """Parameters of the model by formula (embeddings + MLPs + cross network)."""
    def mlp(n_in: int, sizes: Sequence[int]) -> int:
        total = 0
        for n_out in sizes:
            total += n_in * n_out + n_out
            n_in = n_out
        return total

    n = cfg.interaction_features
    return (sum(cfg.cardinalities) * cfg.embedding_dim + mlp(cfg.num_dense, cfg.bottom_mlp)
            + cfg.dcn_layers * (2 * n * cfg.dcn_low_rank + n) + mlp(n, cfg.top_mlp))


class EmbeddingBags(nn.Module):
    """One sum-pooled bag per feature: a list of (B, h_k) id tensors -> (B, F, D)."""

    def __init__(self, cardinalities: Sequence[int], dim: int, sparse: bool = False,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.bags = nn.ModuleList(make_bag(rows, dim, sparse, device) for rows in cardinalities)

    def forward(self, sparse: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(sparse) != len(self.bags):
            raise ValueError(f"expected {len(self.bags)} sparse features, got {len(sparse)}")
        return torch.stack([bag(ids) for bag, ids in zip(self.bags, sparse)], dim=1)


def make_bag(rows: int, dim: int, sparse: bool, device: torch.device | str | None = None) -> nn.EmbeddingBag:
    bag = nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse, device=device)
    if bag.weight.device.type != "meta":
        bound = math.sqrt(1.0 / rows)
        nn.init.uniform_(bag.weight, -bound, bound)
    return bag


def mlp(n_in: int, sizes: Sequence[int], relu_last: bool, device: torch.device | str | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, n_out in enumerate(sizes):
        layers.append(nn.Linear(n_in, n_out, device=device))
        if relu_last or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        n_in = n_out
    return nn.Sequential(*layers)


class LowRankCrossNet(nn.Module):
    """DCNv2 cross layers with low-rank kernels: x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l."""

    def __init__(self, features: int, layers: int, rank: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.v = nn.ParameterList(nn.Parameter(torch.empty(rank, features, device=device)) for _ in range(layers))
        self.w = nn.ParameterList(nn.Parameter(torch.empty(features, rank, device=device)) for _ in range(layers))
        self.b = nn.ParameterList(nn.Parameter(torch.zeros(features, device=device)) for _ in range(layers))
        if torch.device(device or "cpu").type != "meta":
            for p in (*self.v, *self.w):
                nn.init.xavier_normal_(p)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for v, w, b in zip(self.v, self.w, self.b):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w, b)) + x
        return x


class DLRMDCNv2(nn.Module):
    """forward(dense (B, 13) float, sparse: 26 x (B, h_k) int) -> logits (B,)."""

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.bottom = mlp(cfg.num_dense, cfg.bottom_mlp, relu_last=True, device=device)
        self.sparse_arch: nn.Module = EmbeddingBags(cfg.cardinalities, cfg.embedding_dim, cfg.sparse_grads, device)
        self.cross = LowRankCrossNet(cfg.interaction_features, cfg.dcn_layers, cfg.dcn_low_rank, device)
        self.top = mlp(cfg.interaction_features, cfg.top_mlp, relu_last=False, device=device)

    def forward(self, dense: torch.Tensor, sparse: Sequence[torch.Tensor]) -> torch.Tensor:
        bottom = self.bottom(dense)
        pooled = self.sparse_arch(sparse)
        x = torch.cat([bottom.unsqueeze(1), pooled], dim=1).reshape(dense.shape[0], -1)
        return self.top(self.cross(x)).squeeze(-1)
