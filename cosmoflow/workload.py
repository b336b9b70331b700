"""CosmoFlow on the harness: the spec (data, model, loss, metric, target, MLPerf keys)."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcbench.common.errors import ConfigError
from hpcbench.common.workload import Workload

from . import BENCHMARK
from .config import CosmoFlowConfig
from .dataset import CosmoFlowData

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

Batch = tuple["torch.Tensor", "torch.Tensor"]


class CosmoFlowWorkload(Workload[CosmoFlowConfig]):
    record = BENCHMARK
    config_cls = CosmoFlowConfig

    def __init__(self, cfg: CosmoFlowConfig) -> None:
        super().__init__(cfg)
        d = cfg.data
        self._spec = CosmoFlowData(d.size, d.n_train, d.n_eval, cfg.train.channels_last is True)

    # synthetic data -----------------------------------------------------------------------
    @classmethod
    def add_datagen_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--samples", type=int, default=256, help="training samples (files in train/)")
        parser.add_argument("--val-samples", type=int, default=None,
                            help="validation samples (default: samples/8, at least 1)")
        parser.add_argument("--size", type=int, default=128, help="cube edge S of int16 [S,S,S,4] (MLPerf: 128)")
        parser.add_argument("--plain", action="store_true",
                            help="write uncompressed TFRecords (default: gzip, like the v1.0+ dataset)")
        parser.add_argument("--gzip-level", type=int, default=6, choices=range(1, 10), metavar="1-9",
                            help="gzip level (6 = zlib/TensorFlow default; 1 is ~8x faster, ~25%% larger)")
        parser.add_argument("--quiet", action="store_true", help="no progress bar")

    @classmethod
    def embedded_datagen_args(cls) -> list[str]:
        """The dataset the ``mini`` preset is tuned on (see configs/mini.toml). Uncompressed records,
        so that ``pack`` shows what zstd gains on raw counts (gzip-in-zstd gains nothing)."""
        return ["--samples", "4096", "--val-samples", "512", "--size", "16", "--plain"]

    @classmethod
    def datagen(cls, args: argparse.Namespace) -> None:
        from .synth import generate

        n_val = args.val_samples if args.val_samples is not None else max(1, args.samples // 8)
        if args.samples < 1 or n_val < 0:
            raise ConfigError("--samples must be >= 1 and --val-samples >= 0")
        if args.size < 2:
            raise ConfigError(f"--size must be >= 2, got {args.size}")
        nbytes = generate(args.out, args.samples, n_val, args.size, seed=args.seed,
                          workers=max(1, args.workers), compress=not args.plain, level=args.gzip_level, progress=not args.quiet)
        print(f"wrote {args.samples} train + {n_val} validation CosmoFlow samples "
              f"({args.size}^3 x 4 int16, {nbytes / 2**20:.1f} MiB uncompressed) to {args.out}")

    # data ---------------------------------------------------------------------------------
    def dataset(self) -> CosmoFlowData:
        return self._spec

    # model and maths ----------------------------------------------------------------------
    def build_model(self) -> "nn.Module":
        from .model import CosmoFlowNet

        return CosmoFlowNet(self.cfg.model, self.cfg.data.size)

    def no_weight_decay(self, name: str) -> bool:
        """Every tensor but the hidden Dense kernels: the reference's l2 regularizer is on those alone."""
        from .model import decayed_names

        return name not in decayed_names(self.cfg.model)

    def forward(self, model: "nn.Module", batch: Batch) -> "torch.Tensor":
        return model(batch[0])

    def loss(self, outputs: "torch.Tensor", batch: Batch) -> "torch.Tensor":
        """Sum of squared errors over the batch's samples and parameters, in float32."""
        return (outputs.float() - batch[1]).square().sum()

    def loss_count(self, batch: Batch) -> "torch.Tensor":
        """The number of target values, made on the targets' device (no host copy)."""
        import torch

        y = batch[1]
        return y.new_full((), float(y.numel()), dtype=torch.float32)

    def eval_sums(self, outputs: "torch.Tensor", batch: Batch) -> Mapping[str, "torch.Tensor"]:
        err = (outputs.float() - batch[1]).abs()
        return {"abs_error": err.sum(), "count": err.new_full((), float(err.numel()))}

    def metric(self, sums: Mapping[str, float]) -> float:
        """Mean absolute error over every validation sample and all 4 parameters."""
        return float(sums["abs_error"]) / max(float(sums["count"]), 1.0)

    def hyperparameters(self) -> dict[str, Any]:
        return {**super().hyperparameters(), "dropout": self.cfg.model.dropout}
