"""The OC20 S2EF workload spec: data, DimeNet++ with forces, force-L1 loss, force MAE metric."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig
from hpcbench.common.workload import Workload

from . import BENCHMARK
from .dataset import OC20Data
from .labels import (REFERENCE_GRAD_TARGET_MEAN, REFERENCE_GRAD_TARGET_STD, REFERENCE_TARGET_MEAN,
                     REFERENCE_TARGET_STD, label_normalizers)
from .model import DimeNetPPConfig


@dataclass
class OC20DataConfig(DataConfig):
    """``root`` holds train/ and validation/ folders of data.NNNN.lmdb files."""

    trust_pickle: bool = False  # read original pickled OC20 LMDBs (unpickling runs code from the file)
    preload: bool = True  # decode the split into host memory before training (data.threads at a time)
    balance: Literal["edges", "triplets", "none"] = "edges"  # per-sample cost of the per-rank partition
    # the reference's label normalisation (its config's dataset entry; labels.py): the model learns
    # (y - target_mean) / target_std and (F - grad_target_mean) / grad_target_std, de-normalised for the metric
    normalize_labels: bool = True
    target_mean: float = REFERENCE_TARGET_MEAN
    target_std: float = REFERENCE_TARGET_STD
    grad_target_mean: float = REFERENCE_GRAD_TARGET_MEAN
    grad_target_std: float = REFERENCE_GRAD_TARGET_STD


@dataclass
class OC20ModelConfig(DimeNetPPConfig):
    # loss = force_coefficient * force L1 + energy_coefficient * energy L1, on normalised labels (the
    # reference's optim.force_coefficient 50 and optim.energy_coefficient 0)
    force_coefficient: float = 50.0
    energy_coefficient: float = 0.0


@dataclass
class OC20Config(RunConfig):
    data: OC20DataConfig = field(default_factory=OC20DataConfig)
    model: OC20ModelConfig = field(default_factory=OC20ModelConfig)


@dataclass
class Outputs:
    energy: torch.Tensor  # [G]
    forces: torch.Tensor  # [N, 3]


class OC20Workload(Workload[OC20Config]):
    record = BENCHMARK
    config_cls = OC20Config
    static_shapes = False  # graphs change size every batch
    eval_needs_grad = True  # forces are -dE/dpos

    def __init__(self, cfg: OC20Config) -> None:
        super().__init__(cfg)
        self._dataset = OC20Data(cfg.data)
        d, m = cfg.data, cfg.model
        self.labels = label_normalizers(d.normalize_labels, d.target_mean, d.target_std, d.grad_target_mean,
                                        d.grad_target_std)
        for key in ("force_coefficient", "energy_coefficient"):
            value = getattr(m, key)
            if not (value >= 0 and value < float("inf")):
                raise ConfigError(f"config key 'model.{key}': {value!r}; expected a finite weight >= 0")
        if m.force_coefficient == 0 and m.energy_coefficient == 0:
            raise ConfigError("config keys 'model.force_coefficient'/'model.energy_coefficient': both 0, "
                              "nothing to train on")

    # data ---------------------------------------------------------------------------------
    def dataset(self) -> OC20Data:
        return self._dataset

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

        energy, forces = energy_and_forces(model, batch.z, batch.pos, batch.edge_index, batch.shift, batch.idx_kj,
                                           batch.idx_ji, batch.batch, batch.num_graphs,
                                           create_graph=model.training)
        return Outputs(energy, forces)

    def loss(self, outputs: Outputs, batch: Any) -> torch.Tensor:
        """The reference's loss as its distributed ``DDPLoss`` computes it: ``force_coefficient`` times the
        L1 of the normalised forces summed over this rank's free atoms' components, plus
        ``energy_coefficient`` times the L1 of the normalised energies summed over its graphs; the harness
        divides by the instance-wide count of free atoms (:meth:`loss_count`; the reference divides its
        force sum by the global free-atom count, ``input.shape[0]`` of the [atoms, 3] forces, and its energy
        sum by the graph count: with an energy coefficient > 0 ours uses the atom count for both)."""
        m, labels = self.cfg.model, self.labels
        loss = m.force_coefficient * (outputs.forces - labels.force.norm(batch.force)).abs()[batch.free].sum()
        if m.energy_coefficient > 0:
            loss = loss + m.energy_coefficient * (outputs.energy - labels.energy.norm(batch.energy)).abs().sum()
        return loss

    def loss_count(self, batch: Any) -> torch.Tensor:
        """This rank's free atoms, on the batch's device (the reference's mean is per atom, not component)."""
        return batch.free.sum().to(torch.float32)

    def eval_sums(self, outputs: Outputs, batch: Any) -> Mapping[str, torch.Tensor]:
        """Absolute errors of the de-normalised force components of the free atoms (eV/A), and their count."""
        free = batch.free
        forces = self.labels.force.denorm(outputs.forces.detach())
        return {"force_abs_err": (forces - batch.force).abs()[free].sum(),
                "force_components": free.sum() * 3.0}

    def metric(self, sums: Mapping[str, float]) -> float:
        return float(sums["force_abs_err"]) / max(1.0, float(sums["force_components"]))

    def hyperparameters(self) -> dict[str, Any]:
        o = self.cfg.optim
        if o.schedule != "multistep" or o.unit != "steps":
            raise ConfigError("config keys 'optim.schedule'/'optim.unit': oc20 uses warmup + multistep in steps")
        return super().hyperparameters()

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
