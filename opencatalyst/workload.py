"""The OC20 S2EF workload spec: data, DimeNet++ with forces, force-L1 loss, force MAE metric."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from common.errors import ConfigError
from common.runconfig import RunConfig
from common.workload import DataShard, EpochLoader, Workload

from .model import DimeNetPPConfig


@dataclass
class OC20DataConfig:
    root: str = ""  # folder with train/ and validation/ (data.NNNN.lmdb + metadata.npz)
    trust_pickle: bool = False  # read original pickled OC20 LMDBs (unpickling runs code from the file)
    preload: bool = True  # decode the whole split into host memory before training
    preload_workers: int = 4
    balance: Literal["edges", "triplets", "none"] = "edges"  # cost for the per-rank partition


@dataclass
class OC20ModelConfig(DimeNetPPConfig):
    energy_weight: float = 0.0  # loss = force L1 + energy_weight * energy L1 (reference: 0)


@dataclass
class OC20Config(RunConfig):
    data: OC20DataConfig = field(default_factory=OC20DataConfig)
    model: OC20ModelConfig = field(default_factory=OC20ModelConfig)


@dataclass
class Outputs:
    energy: torch.Tensor  # [G]
    forces: torch.Tensor  # [N, 3]
    free_total: torch.Tensor  # global count of free atoms (after ``wait``)
    handle: Any = None  # pending all-reduce of free_total

    def wait(self) -> torch.Tensor:
        if self.handle is not None:
            self.handle.wait()
            self.handle = None
        return self.free_total


class OC20Workload(Workload[OC20Config]):
    name = "oc20"
    benchmark = "oc20"
    config_cls = OC20Config
    metric_key = "eval_error"
    higher_is_better = False
    static_shapes = False  # graphs change size every batch
    eval_needs_grad = True  # forces are -dE/dpos

    def __init__(self, cfg: OC20Config) -> None:
        super().__init__(cfg)
        self._splits: dict[str, Any] = {}
        if cfg.optim.name != "adamw":
            raise ConfigError(f"config key 'optim.name': oc20 uses AdamW (MLPerf rule), got {cfg.optim.name!r}")

    # data ---------------------------------------------------------------------------------
    def _split(self, name: str) -> Any:
        from .lmdbio import SplitDataset

        if name not in self._splits:
            if not self.cfg.data.root:
                raise ConfigError("config key 'data.root': set the OC20 data folder (--data DIR)")
            ds = SplitDataset(Path(self.cfg.data.root) / name, trust_pickle=self.cfg.data.trust_pickle)
            if self.cfg.data.preload:
                ds.preload(self.cfg.data.preload_workers)
            self._splits[name] = ds
        return self._splits[name]

    def dataset_sizes(self) -> tuple[int, int]:
        return len(self._split("train")), len(self._split("validation"))

    def _loader(self, split: str, shard: DataShard, train: bool) -> EpochLoader:
        from .batch import GraphLoader
        from .sampler import BalancedBatchSampler

        ds = self._split(split)
        sizes = ds.sizes()
        balance = self.cfg.data.balance
        costs = sizes["triplets" if balance == "triplets" else "neighbors"]
        sampler = BalancedBatchSampler(costs, shard.local_batch_size * shard.size, shard.rank, shard.size,
                                       shard.seed, shuffle=train, drop_last=train, balanced=balance != "none")
        return GraphLoader(ds, sampler, shard.device, workers=self.cfg.train.loader_workers)

    def train_loader(self, shard: DataShard) -> EpochLoader:
        return self._loader("train", shard, train=True)

    def eval_loader(self, shard: DataShard) -> EpochLoader:
        return self._loader("validation", shard, train=False)

    def batch_size(self, batch: Any) -> int:
        return int(batch.num_graphs)

    # model and maths ----------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        from dataclasses import fields as dc_fields

        from .cpualloc import keep_freed_memory
        from .model import DimeNetPP

        keep_freed_memory()  # the step's large per-triplet temporaries: reuse pages, no re-faulting
        m = self.cfg.model
        return DimeNetPP(DimeNetPPConfig(**{f.name: getattr(m, f.name) for f in dc_fields(DimeNetPPConfig)}))

    def forward(self, model: torch.nn.Module, batch: Any) -> Outputs:
        from .model import energy_and_forces

        # start the instance-wide free-atom count now; it completes while the model runs
        free_total = batch.free.sum().to(torch.float32)
        handle = None
        # (training only: every rank runs the same number of training steps; eval batches may differ)
        if model.training and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            handle = torch.distributed.all_reduce(free_total, async_op=True)
        energy, forces = energy_and_forces(model, batch.z, batch.pos, batch.edge_index, batch.shift, batch.idx_kj,
                                           batch.idx_ji, batch.batch, batch.num_graphs,
                                           create_graph=model.training)
        return Outputs(energy, forces, free_total, handle)

    def loss(self, outputs: Outputs, batch: Any) -> torch.Tensor:
        """Force L1 summed over this rank's free atoms, divided by the instance-wide number of free
        atoms (x3 components) and multiplied by the ranks, so the harness's gradient average gives
        the exact global mean whatever the per-rank atom counts."""
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        err = (outputs.forces - batch.force).abs()[batch.free].sum()
        loss = err * world / (3.0 * outputs.wait().clamp(min=1.0))
        if self.cfg.model.energy_weight:
            loss = loss + self.cfg.model.energy_weight * (outputs.energy - batch.energy).abs().mean()
        return loss

    def eval_sums(self, outputs: Outputs, batch: Any) -> Mapping[str, torch.Tensor]:
        outputs.wait()
        free = batch.free
        return {"force_abs_err": (outputs.forces.detach() - batch.force).abs()[free].sum(),
                "force_components": free.sum() * 3.0}

    def metric(self, sums: Mapping[str, float]) -> float:
        return float(sums["force_abs_err"]) / max(1.0, float(sums["force_components"]))

    def hyperparameters(self) -> dict[str, Any]:
        o = self.cfg.optim
        if o.schedule != "multistep" or o.unit != "steps":
            raise ConfigError("config keys 'optim.schedule'/'optim.unit': oc20 uses warmup + multistep in steps")
        return {
            "opt_name": "AdamW",
            "opt_base_learning_rate": o.lr,
            "opt_learning_rate_warmup_steps": int(o.warmup),
            "opt_learning_rate_warmup_factor": o.warmup_factor,
            "opt_learning_rate_decay_boundary_steps": [int(m) for m in o.milestones],
            "opt_learning_rate_decay_factor": o.decay_factor,
        }

    # synthetic data -----------------------------------------------------------------------
    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        from . import datagen

        datagen.add_args(parser)

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--train", "320", "--val", "64", "--size", "2,2,3", "--metals", "Cu,Pt",
                "--adsorbates", "O,H,N,C", "--relax-steps", "150", "--rattle", "0.018", "--cutoff", "4",
                "--max-neighbors", "12"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        from . import datagen

        datagen.run(args)
