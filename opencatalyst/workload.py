"""The OC20 S2EF workload spec: data, DimeNet++ with forces, force-L1 loss, force MAE metric."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from hpcbench.common.errors import ConfigError
from hpcbench.common.runconfig import DataConfig, RunConfig
from hpcbench.common.workload import DataShard, EpochLoader, Workload

from . import BENCHMARK
from .datagen import OC20Datagen
from .dataset import OC20Data
from .labels import (REFERENCE_GRAD_TARGET_MEAN, REFERENCE_GRAD_TARGET_STD, REFERENCE_TARGET_MEAN,
                     REFERENCE_TARGET_STD, label_normalizers)
from .model import DimeNetPPConfig

SIMULATED_BATCHES = 2048  # training batches (whole epochs, at least one) the bucket choice looks at


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
    # pad every batch to one of a few bucket sizes (atoms, edges, triplets; opencatalyst/static.py) so the
    # step has a few fixed shapes (static compilation, a CUDA graph per bucket): true, false, or "auto"
    # (on for a CUDA device, where the step is launch-bound; off on a CPU, where padding is only extra work)
    static_shapes: bool | Literal["auto"] = "auto"
    # bucket sizes per dimension (atoms, edges, triplets), chosen from the split's stored per-sample sizes and
    # the batches the sampler forms; 0: per dimension the fewest with at most 8% padding (at most 16)
    shape_buckets: int = 0

    def validate(self) -> None:
        super().validate()
        if self.static_shapes not in (True, False, "auto"):
            raise ConfigError(f"config key 'data.static_shapes': {self.static_shapes!r}; expected true, false "
                              "or \"auto\"")
        if not 0 <= self.shape_buckets <= 16:
            raise ConfigError(f"config key 'data.shape_buckets': {self.shape_buckets}; expected 1 to 16 bucket "
                              "sizes per dimension, or 0 (per dimension the fewest with at most 8% padding)")


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

    def validate(self) -> None:
        """hpc_training_rules.adoc: what its OpenCatalyst rows do not name must match the reference
        (``AdamW(params, lr)``: torch's betas, eps and weight decay 0.01), and the warmup factor is in [0, 1]."""
        o = self.optim
        self.require_closed([
            ("optim.betas", tuple(o.betas), (0.9, 0.999), "the reference's AdamW(params, lr): torch's defaults"),
            ("optim.eps", o.eps, 1e-8, "torch's AdamW default"),
            ("optim.weight_decay", o.weight_decay, 0.01, "torch's AdamW default, on every parameter"),
            ("optim.warmup_factor", o.warmup_factor, lambda f: 0.0 <= f <= 1.0,
             "in [0, 1], the rules' opt_learning_rate_warmup_factor: the start rate lr x factor"),
            ("optim.decay_factor", o.decay_factor, lambda f: 0.0 <= f <= 1.0,
             "in [0, 1], the rules' opt_learning_rate_decay_factor"),
            ("data.last_batch", self.data.last_batch, "pad",
             "every sample each epoch, as the reference's padded DistributedSampler; only DLRMv2 may drop")])


@dataclass
class Outputs:
    energy: torch.Tensor  # [G]
    forces: torch.Tensor  # [N, 3]


class OC20Workload(OC20Datagen, Workload[OC20Config]):
    record = BENCHMARK
    config_cls = OC20Config
    # graphs change size every batch; with data.static_shapes on a device the loaders set these two per
    # instance: batches are padded to a few shapes (static_shape_count of them over the simulated epochs)
    static_shapes = False
    static_shape_count = 1
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
        return int(batch.size)  # real graphs (a padded batch also has empty and padding slots)

    def train_loader(self, shard: DataShard) -> EpochLoader:
        loader = super().train_loader(shard)
        self._plan_static_shapes(shard, loader, "train")
        return loader

    def eval_loader(self, shard: DataShard) -> EpochLoader:
        loader = super().eval_loader(shard)
        self._plan_static_shapes(shard, loader, "eval")
        return loader

    def _plan_static_shapes(self, shard: DataShard, loader: EpochLoader, which: str) -> None:
        """With ``data.static_shapes`` on for this device: the batches this loader will form (its sampler
        over the run's first epochs, as it forms them) join the bucket choice of the dataset spec."""
        d = self.cfg.data
        on = d.static_shapes is True or (d.static_shapes == "auto" and torch.device(shard.device).type == "cuda")
        if not on:
            return
        import copy
        import math

        from .static import sampler_totals

        sampler = copy.copy(loader.sampler)  # type: ignore[attr-defined]
        per_epoch = max(1, len(sampler))
        epochs = 1 if which == "eval" else max(1, min(self.cfg.train.max_epochs,
                                                       math.ceil(SIMULATED_BATCHES / per_epoch)))
        source = self.source(self._dataset.train_split if which == "train" else self._dataset.eval_split)
        sizes = source.sizes()  # type: ignore[attr-defined]
        table = np.stack([sizes["natoms"], sizes["edges"], sizes["triplets"]], axis=1)
        totals = sampler_totals(sampler, table, 0, epochs)
        count = self._dataset.plan_static(which, totals, d.shape_buckets, 2.0 * self.cfg.model.cutoff)
        self.static_shapes, self.static_shape_count = True, count

    # model and maths ----------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        from dataclasses import fields as dc_fields

        from .cpualloc import keep_freed_memory
        from .model import DimeNetPP

        keep_freed_memory()  # the step's large per-triplet temporaries: reuse pages, no re-faulting
        m = self.cfg.model
        return DimeNetPP(DimeNetPPConfig(**{f.name: getattr(m, f.name) for f in dc_fields(DimeNetPPConfig)}))

    def on_device(self, device: torch.device) -> None:
        """On the CPU: build or load the C loops now (triplet.py, act.py, basis.py, edge_sum.py), before ``run_start``, not inside the
        first timed step; where they cannot be built the reason is logged once and the torch path runs."""
        if device.type == "cpu":
            from .act import prepare as prepare_silu
            from .basis import prepare as prepare_radial
            from .edge_sum import prepare as prepare_edge_sum
            from .triplet import prepare as prepare_triplet

            prepare_triplet()
            prepare_silu()
            prepare_radial()
            prepare_edge_sum()

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
        # masks by torch.where, not boolean indexing: no data-dependent shape (no sync, capturable), and the
        # padding rows of a padded batch (not free; graph_mask False) add exactly 0
        err = (outputs.forces - labels.force.norm(batch.force)).abs()
        loss = m.force_coefficient * torch.where(batch.free[:, None], err, 0.0).sum()
        if m.energy_coefficient > 0:
            e_err = (outputs.energy - labels.energy.norm(batch.energy)).abs()
            if batch.graph_mask is not None:
                e_err = torch.where(batch.graph_mask, e_err, 0.0)
            loss = loss + m.energy_coefficient * e_err.sum()
        return loss

    def loss_count(self, batch: Any) -> torch.Tensor:
        """This rank's free atoms, on the batch's device (the reference's mean is per atom, not component)."""
        return batch.free.sum().to(torch.float32)

    def eval_sums(self, outputs: Outputs, batch: Any) -> Mapping[str, torch.Tensor]:
        """Absolute errors of the de-normalised force components of the free atoms (eV/A), and their count."""
        free = batch.free
        forces = self.labels.force.denorm(outputs.forces.detach())
        return {"force_abs_err": torch.where(free[:, None], (forces - batch.force).abs(), 0.0).sum(),
                "force_components": free.sum() * 3.0}

    def metric(self, sums: Mapping[str, float]) -> float:
        return float(sums["force_abs_err"]) / max(1.0, float(sums["force_components"]))

    def hyperparameters(self) -> dict[str, Any]:
        o = self.cfg.optim
        if o.schedule != "multistep" or o.unit != "steps":
            raise ConfigError("config keys 'optim.schedule'/'optim.unit': oc20 uses warmup + multistep in steps")
        return super().hyperparameters()

