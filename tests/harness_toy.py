"""A tiny regression workload for the harness tests: an MLP with BatchNorm on in-memory data.

It claims the MLPerf benchmark "cosmoflow" (4 regression targets, ``eval_error`` = mean absolute
error, SGD keys) so the official compliance checker applies that benchmark's rules to its logs.
Run it through the CLI as ``hpcbench train tests.harness_toy:ToyWorkload``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcbench.common.benchmark import Benchmark, Target, upper_bound_only
from hpcbench.common.runconfig import DataConfig, RunConfig
from hpcbench.common.workload import DataShard, Workload


@dataclass
class ToyData(DataConfig):  # the shared data keys (root, node_local, threads, prefetch) + the toy's own
    train: int = 512
    eval: int = 128
    features: int = 16
    noise: float = 0.02


@dataclass
class ToyModel:
    hidden: int = 32
    batchnorm: bool = True


@dataclass
class ToyConfig(RunConfig):
    data: ToyData = field(default_factory=ToyData)
    model: ToyModel = field(default_factory=ToyModel)


def make_data(d: ToyData, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic inputs and targets y = tanh(x A) / 2 + noise (the same A for both splits)."""
    g = torch.Generator().manual_seed(1234)
    a = torch.randn(d.features, 4, generator=g) / d.features**0.5
    g.manual_seed(1 if split == "train" else 2)
    n = d.train if split == "train" else d.eval
    x = torch.randn(n, d.features, generator=g)
    y = torch.tanh(x @ a) / 2 + d.noise * torch.randn(n, 4, generator=g)
    return x, y


class ToyLoader:
    """This rank's batches: a per-epoch permutation of the split, strided over the ranks."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, shard: DataShard, shuffle: bool) -> None:
        self.x, self.y, self.shard, self.shuffle = x, y, shard, shuffle
        self.epoch = 0
        if shuffle:  # training: the same number of full batches on every rank
            self.batches = len(x) // shard.size // shard.local_batch_size
        else:  # evaluation: every sample exactly once, ranks may differ by a batch
            mine = len(range(shard.rank, len(x), shard.size))
            self.batches = -(-mine // shard.local_batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        n = len(self.x)
        if self.shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.shard.seed * 7919 + self.epoch))
        else:
            order = torch.arange(n)
        mine = order[self.shard.rank :: self.shard.size]
        b = self.shard.local_batch_size
        for i in range(self.batches):
            idx = mine[i * b : (i + 1) * b]
            if len(idx):
                yield {"x": self.x[idx].to(self.shard.device), "y": self.y[idx].to(self.shard.device)}


#: an out-of-tree workload declares its own record (on the class); the toy's claims cosmoflow's rules
TOY = Benchmark(name="toy", benchmark="cosmoflow", suite="hpc", target=Target("eval_error", 0.0, 0.124, False, True),
                higher_is_better=False, required_runs=10, summary="toy regression MLP for the harness tests")
#: the toy as a training-suite benchmark; ``epoch_num`` reporting as the claimed benchmark's
TOY_ACCURACY = Benchmark(name="toy", benchmark="cosmoflow", suite="training",
                         target=Target("eval_accuracy", 0.9, 1.0, True, False),
                         open_target=upper_bound_only("eval_accuracy", 1.0, inclusive=False),
                         higher_is_better=True, required_runs=5, summary="toy as a training-suite benchmark")


class ToyWorkload(Workload[ToyConfig]):
    record = TOY
    config_cls = ToyConfig

    @classmethod
    def presets_dir(cls) -> Path:
        return Path(__file__).parent / "harness_configs"

    def dataset_sizes(self) -> tuple[int, int]:
        return self.cfg.data.train, self.cfg.data.eval

    def train_loader(self, shard: DataShard) -> ToyLoader:
        return ToyLoader(*make_data(self.cfg.data, "train"), shard, shuffle=True)

    def eval_loader(self, shard: DataShard) -> ToyLoader:
        return ToyLoader(*make_data(self.cfg.data, "eval"), shard, shuffle=False)

    def build_model(self) -> nn.Module:
        d, m = self.cfg.data, self.cfg.model
        norm: nn.Module = nn.BatchNorm1d(m.hidden) if m.batchnorm else nn.Identity()
        return nn.Sequential(nn.Linear(d.features, m.hidden), norm, nn.ReLU(), nn.Linear(m.hidden, m.hidden),
                             nn.ReLU(), nn.Linear(m.hidden, 4))

    def forward(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return model(batch["x"])

    def loss(self, outputs: torch.Tensor, batch: Any) -> torch.Tensor:
        return nn.functional.mse_loss(outputs.float(), batch["y"])

    def eval_sums(self, outputs: torch.Tensor, batch: Any) -> Mapping[str, torch.Tensor]:
        err = (outputs.float() - batch["y"]).abs()
        return {"abs_error": err.sum(), "count": torch.tensor(float(err.numel()))}

    def metric(self, sums: Mapping[str, float]) -> float:
        return sums["abs_error"] / sums["count"]

    def hyperparameters(self) -> dict[str, Any]:
        o = self.cfg.optim
        return {
            "opt_name": o.name,
            "opt_base_learning_rate": o.lr,
            "opt_learning_rate_warmup_epochs": o.warmup,
            "opt_learning_rate_warmup_factor": o.warmup_factor,
            "opt_learning_rate_decay_boundary_epochs": list(o.milestones),
            "opt_learning_rate_decay_factor": o.decay_factor,
            "opt_weight_decay": o.weight_decay,
            "dropout": 0.0,
        }


class ToyAccuracyWorkload(ToyWorkload):
    """The toy as a training-suite benchmark: ``eval_accuracy`` = 1 - mean absolute error (below 1.0
    as the open-division checks want), so the training checker and its ``epoch_num`` rules apply."""

    record = TOY_ACCURACY

    def metric(self, sums: Mapping[str, float]) -> float:
        return 1.0 - sums["abs_error"] / sums["count"]


class ToyBert(ToyAccuracyWorkload):
    """Claims ``bert`` (training 5.0.0): ``epoch_num`` reported in training samples."""

    record = dataclasses.replace(TOY_ACCURACY, name="toy_bert", benchmark="bert", ruleset="5.0.0",
                                 epoch_reporting="samples")


class ToyDlrm(ToyAccuracyWorkload):
    """Claims ``dlrm_dcnv2`` (training 5.1.0): ``epoch_num`` reported in fractional epochs."""

    record = dataclasses.replace(TOY_ACCURACY, name="toy_dlrm", benchmark="dlrm_dcnv2", ruleset="5.1.0",
                                 epoch_reporting="fraction")


def toy_trainer(env: Any, cls: type[ToyWorkload], overrides: list[str], log: Path | None = None) -> Any:
    """A :class:`hpcbench.common.trainer.Trainer` of toy ``cls`` (its mini preset with ``overrides``) on
    ``env``, logging to ``log`` (None: no log), without progress output."""
    from hpcbench.common.mllog import MLPerfLogger
    from hpcbench.common.system import SystemDescription
    from hpcbench.common.trainer import Trainer

    cfg = cls.load_config("mini", overrides)
    return Trainer(cls(cfg), env, MLPerfLogger(log), SystemDescription(), progress=False)
