"""3D U-Net on the harness (training suite, ruleset training 4.0.0): KiTS19 cases, the reference
model, Dice + cross-entropy, sliding-window evaluation, the MLPerf keys of closed_unet3d.yaml.

Training batches are random patches (``data.patch``, foreground oversampling ``data.oversampling``)
of the training cases, one per case per epoch as the reference's loader gives them; evaluation runs
on whole validation cases, one per batch, with overlapping Gaussian-weighted windows
(``data.roi``, ``data.overlap``; :mod:`.inference`). ``eval_accuracy`` is the mean over cases of
the kidney and tumour Dice averaged (the reference's ``mean_dice``), from additive per-case sums.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import DataShard, EpochLoader, Workload

from . import BENCHMARK
from .config import UNetConfig
from .dataset import Batch, KiTSData

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

    from hpcbench.common.parallel import Degrees, Parallel


#: the reference aborts a run whose evaluation's mean Dice falls below this (runtime/training.py)
DIVERGED_DICE = 1e-6


class UNet3DWorkload(Workload[UNetConfig]):
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

    # synthetic data -------------------------------------------------------------------------
    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cases", type=int, default=210, help="cases in all (KiTS19: 210)")
        parser.add_argument("--eval-cases", type=int, default=0,
                            help="of which validation cases, the first ids of the reference's evaluation list "
                                 "(0: 42 with 210 cases, else a fifth)")
        parser.add_argument("--min-shape", default="128,128,128", help="smallest D,H,W of a case (reference: >= 128)")
        parser.add_argument("--max-shape", default="256,224,224", help="largest D,H,W of a case")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml)."""
        return ["--cases", "40", "--eval-cases", "8", "--min-shape", "32,32,32", "--max-shape", "48,48,48"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        from functools import partial

        from hpcbench.common.data.datagen import FileJob, generate

        from .format import image_name
        from .synth import ShapeRange, case_ids

        low, high = parse_shape(args.min_shape, "--min-shape"), parse_shape(args.max_shape, "--max-shape")
        if any(lo > hi for lo, hi in zip(low, high)):
            raise ConfigError(f"--min-shape {args.min_shape} must not exceed --max-shape {args.max_shape}")
        eval_cases = args.eval_cases or (42 if args.cases == 210 else max(1, round(args.cases / 5)))
        try:
            ids = case_ids(args.cases, eval_cases)
        except ValueError as exc:
            raise ConfigError(f"--cases/--eval-cases: {exc}") from None
        jobs = [FileJob("", image_name(c), (c,)) for c in ids]
        shapes = ShapeRange(low, high)
        generate(args.out, jobs, partial(write_case_job, args.seed, shapes), verify_case_job,
                 workers=max(1, args.workers), progress=not args.quiet, desc="unet3d datagen")
        print(f"wrote {len(ids)} synthetic KiTS19 cases ({eval_cases} validation, {len(ids) - eval_cases} training) "
              f"of D,H,W in {low}..{high} to {args.out}")


def parse_shape(text: str, option: str) -> tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise ConfigError(f"{option}: expected three sizes D,H,W >= 1, got {text!r}")
    return values  # type: ignore[return-value]


def write_case_job(seed: int, shapes: Any, job: Any, tmp: Any) -> None:
    """Make one case; its label file is written (verified, renamed) first, its image to the driver's ``tmp``."""
    import numpy as np

    from .format import label_name, write_array
    from .synth import make_case

    case = job.indices[0]
    image, label = make_case(seed, case, shapes)
    write_array(tmp.parent / label_name(case), label)
    with open(tmp, "wb") as fh:
        np.lib.format.write_array(fh, np.ascontiguousarray(image, dtype=np.float32), allow_pickle=False)


def verify_case_job(tmp: Any, job: Any) -> None:
    import numpy as np

    from .format import label_name, read_header, verify_array

    shape = read_header(tmp.parent / label_name(job.indices[0]), np.dtype("u1"))
    verify_array(tmp, shape, np.dtype("<f4"))
