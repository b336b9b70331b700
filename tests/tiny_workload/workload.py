"""The tiny workload: config, spec, model, loss and metric; everything else is the harness's."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from hpcbench.common.runconfig import DataConfig, RunConfig
from hpcbench.common.workload import Workload

from . import BENCHMARK
from .dataset import FEATURES, TARGETS, TinyData, verify, write
from .model import mlp


@dataclass
class TinyModel:
    hidden: int = 32


@dataclass
class TinyConfig(RunConfig):
    data: DataConfig = field(default_factory=DataConfig)
    model: TinyModel = field(default_factory=TinyModel)


class TinyWorkload(Workload[TinyConfig]):
    record = BENCHMARK
    config_cls = TinyConfig

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__(cfg)
        self._spec = TinyData()

    def dataset(self) -> TinyData:
        return self._spec

    def build_model(self) -> nn.Module:
        return mlp(FEATURES, self.cfg.model.hidden, TARGETS)

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return model(batch["x"])

    def loss(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return ((outputs.float() - batch["y"]) ** 2).sum()

    def loss_count(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return batch["y"].new_full((), float(batch["y"].numel()))

    def eval_sums(self, outputs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"abs": (outputs.float() - batch["y"]).abs().sum(), "n": batch["y"].new_full((), batch["y"].numel())}

    def metric(self, sums: Mapping[str, float]) -> float:
        return sums["abs"] / sums["n"]

    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--samples", type=int, default=512, help="training samples")
        parser.add_argument("--val-samples", type=int, default=128, help="validation samples")
        parser.add_argument("--quiet", action="store_true")

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        from hpcbench.common.data.datagen import FileJob, generate

        jobs = [FileJob(split, f"s{i:06d}.npy", (i,)) for split, n in (("train", args.samples),
                                                                         ("validation", args.val_samples))
                for i in range(n)]
        generate(args.out, jobs, partial(write, seed=args.seed), verify, workers=max(1, args.workers),
                 progress=not args.quiet, desc="tiny")
