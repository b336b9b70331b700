"""3D U-Net on the harness (training suite, ruleset training 4.0.0): KiTS19 cases, the reference
model, Dice + cross-entropy, sliding-window evaluation, the MLPerf keys of closed_unet3d.yaml.

Training batches are random patches (``data.patch``, foreground oversampling ``data.oversampling``)
of the training cases, one per case per epoch as the reference's loader gives them; evaluation runs
on whole validation cases, one per batch, with overlapping Gaussian-weighted windows
(``data.roi``, ``data.overlap``; :mod:`.inference`). ``eval_accuracy`` is the mean over cases of
the kidney and tumour Dice averaged (the reference's ``mean_dice``), from additive per-case sums.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcbench.common.workload import DataShard, EpochLoader, Workload

from . import BENCHMARK
from .config import UNetConfig
from .dataset import Batch, KiTSData
from .synth import UNet3DDatagen

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from hpcbench.common.parallel import Degrees, Parallel


#: the reference aborts a run whose evaluation's mean Dice falls below this (runtime/training.py)
DIVERGED_DICE = 1e-6


class UNet3DWorkload(UNet3DDatagen, Workload[UNetConfig]):
    record = BENCHMARK
    config_cls = UNetConfig

    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__(cfg)
        d = cfg.data
        self._spec = KiTSData(d.patch, d.oversampling, d.flips, cfg.train.seed, d.intensity_augment, d.roi)
        self._spatial: Any = None  # this rank's SpatialGroup once distribute() split the model (spatial_group > 1)

    def dataset(self) -> KiTSData:
        return self._spec

    def train_loader(self, shard: DataShard) -> EpochLoader:
        self.source(self._spec.train_split).stream = shard.rank  # type: ignore[attr-defined]
        return super().train_loader(shard)

    def eval_loader(self, shard: DataShard) -> EpochLoader:
        """One whole case per batch (cases differ in size), every case once over the ranks."""
        return super().eval_loader(dataclasses.replace(shard, local_batch_size=1))

    # model ----------------------------------------------------------------------------------
    def build_model(self) -> "nn.Module":
        from .model import UNet3D

        return UNet3D(self.cfg.model)

    # spatial parallelism (model.spatial_group = S > 1, .spatial): S ranks read the same samples, each
    # computes one depth slab; the harness sums the partial gradients (docs/unet3d.md)
    def parallel_degrees(self) -> "Degrees":
        from hpcbench.common.parallel import Degrees

        return Degrees(spatial=self.cfg.model.spatial_group, spatial_key="model.spatial_group")

    def distribute(self, model: "nn.Module", parallel: "Parallel") -> "nn.Module":
        if self.cfg.model.spatial_group == 1:
            return model
        from .config import SPATIAL_AXES
        from .spatial import SpatialGroup, spatial_parallel

        m, place = self.cfg.model, parallel.spatial
        self._spatial = SpatialGroup(place.group, place.size, place.index, axis=2 + SPATIAL_AXES.index(m.spatial_axis))
        return spatial_parallel(model, self._spatial)

    def _slab(self, t: "torch.Tensor") -> "torch.Tensor":
        from .model import divisor
        from .spatial import take_slab

        return take_slab(t, self._spatial, divisor(self.cfg.model))

    def _spatial_model(self, model: "nn.Module") -> Any:
        """The whole-volume model of the group: each rank runs its slab, every rank gets all logits."""
        from .spatial import gather_slabs

        return lambda x: gather_slabs(model(self._slab(x)), self._spatial)

    def forward(self, model: "nn.Module", batch: Batch) -> Any:
        """Training: logits of the patches (of this rank's slab with spatial parallelism). Evaluation
        (``model.eval()``): the sliding-window logits of the batch's one case and its label, both
        trimmed as the reference trims them (each window's slabs gathered with spatial parallelism)."""
        image = batch[0]
        if model.training:
            return model(image if self._spatial is None else self._slab(image))
        from .inference import sliding_window

        d = self.cfg.data
        run = model if self._spatial is None else self._spatial_model(model)
        return sliding_window(run, image, batch[1], d.roi, d.overlap, d.padding_value, self.cfg.model.n_class,
                              batch=d.window_batch)

    def loss(self, outputs: "torch.Tensor", batch: Batch) -> "torch.Tensor":
        """Sum over the batch's patches of the reference's Dice + cross-entropy loss of each."""
        from .loss import dice_ce_per_sample

        if self._spatial is not None:  # the whole patches' loss from every slab's partial sums
            from .spatial import dice_ce_loss

            return dice_ce_loss(outputs, self._slab(batch[1]), self._spatial).sum()
        return dice_ce_per_sample(outputs, batch[1]).sum()

    def loss_count(self, batch: Batch) -> "torch.Tensor":
        import torch

        return torch.full((), float(batch[1].shape[0]), dtype=torch.float32, device=batch[1].device)

    # evaluation -----------------------------------------------------------------------------
    def eval_sums(self, outputs: Any, batch: Batch) -> Mapping[str, "torch.Tensor"]:
        import torch

        from .loss import dice_score

        logits, label = outputs
        scores = dice_score(logits, label)  # (cases, 2): kidney, tumour
        # every rank of a spatial group scored the same case: its first rank counts it
        once = 0.0 if self._spatial is not None and self._spatial.index else 1.0
        return {"dice_kidney": once * scores[:, 0].sum(), "dice_tumour": once * scores[:, 1].sum(),
                "cases": torch.tensor(once * scores.shape[0], device=scores.device)}

    def diverged(self, value: float) -> bool:
        """The reference's stop in a closed run: mean Dice below 1e-6 ("MODEL DIVERGED. ABORTING.",
        runtime/training.py), whose evaluations start at epoch 1000; an open run (the mini evaluates from epoch
        3, where a Dice of 0 is where training starts) is not stopped by it."""
        return self.cfg.train.division == "closed" and value < DIVERGED_DICE

    def metric(self, sums: Mapping[str, float]) -> float:
        cases = sums.get("cases", 0.0)
        if cases <= 0:
            return 0.0
        return (sums["dice_kidney"] + sums["dice_tumour"]) / (2.0 * cases)

    def hyperparameters(self) -> dict[str, Any]:
        """The keys training 4.0.0's closed_unet3d.yaml requires: the record's (SGD; warmup and decay in
        epochs) and the data shapes."""
        d = self.cfg.data
        return {
            **super().hyperparameters(),
            "oversampling": d.oversampling,
            "training_input_shape": list(d.patch),
            "validation_input_shape": list(d.roi),
            "validation_overlap": d.overlap,
        }

