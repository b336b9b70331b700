"""CosmoFlow on the harness: the spec (data, model, loss, metric, target, MLPerf keys)."""
from __future__ import annotations

import argparse
from typing import ClassVar

from common.errors import ConfigError
from common.workload import Workload

from .config import CosmoFlowConfig


class CosmoFlowWorkload(Workload[CosmoFlowConfig]):
    name: ClassVar[str] = "cosmoflow"
    benchmark: ClassVar[str] = "cosmoflow"
    config_cls = CosmoFlowConfig
    metric_key: ClassVar[str] = "eval_error"
    higher_is_better: ClassVar[bool] = False

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
