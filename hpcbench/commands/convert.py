"""`hpcbench convert FORMAT --src DIR --out DIR --trust-pickle [--replace]`: a workload's original dataset files to
the project's safe encoding (oc20: pickled LMDBs to pickle-free values with per-sample size metadata,
the periodic graph built where the originals carry none).
The formats are the registry's workloads that have a converter."""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from hpcbench import registry
from hpcbench.common.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=registry.converter_names(), help="dataset format to convert")
    parser.add_argument("--src", required=True, help="oc20: folder of data.NNNN.lmdb files, or a root with split "
                        "folders; bert: train/ and eval/ of TFRecords, or the reference's part-* and eval* files")
    parser.add_argument("--out", required=True, help="output folder (same layout, pickle-free values)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow unpickling the source values (runs code from the files: trusted sources only)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="processes converting files in parallel (oc20: building a missing graph costs CPU)")
    parser.add_argument("--replace", action="store_true",
                        help="write into an --out folder that holds files: the converter's own earlier outputs "
                             "(data.*.lmdb) there are removed once the new ones are written; other files stay")
    parser.add_argument("--layout", choices=("packed", "padded"), default=None,
                        help="bert: the training shards' layout (default packed; the eval shard is always padded)")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    convert = registry.converter(args.format)
    extra = {}
    if args.layout:
        if "layout" not in inspect.signature(convert).parameters:
            raise ConfigError(f"--layout: the {args.format} converter has no layout choice")
        extra["layout"] = args.layout
    counts = convert(Path(args.src), Path(args.out), args.trust_pickle, not args.no_progress, max(1, args.workers),
                     args.replace, **extra)
    for split, n in counts.items():
        print(f"converted {split}: {n} samples -> {Path(args.out)}")
    return 0
