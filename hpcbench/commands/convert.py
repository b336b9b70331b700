"""`hpcbench convert oc20 --src DIR --out DIR --trust-pickle`: original pickled OC20 LMDBs to the
project's pickle-free encoding (with per-sample size metadata)."""
from __future__ import annotations

import argparse
from pathlib import Path

from common.errors import ConfigError

FORMATS = ("oc20",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", choices=FORMATS, help="dataset format to convert")
    parser.add_argument("--src", required=True, help="folder of data.NNNN.lmdb files, or a root with split folders")
    parser.add_argument("--out", required=True, help="output folder (same layout, pickle-free values)")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow unpickling the source values (runs code from the files: trusted sources only)")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.format != "oc20":  # pragma: no cover - argparse restricts choices
        raise ConfigError(f"unknown format {args.format!r}")
    from opencatalyst.convert import convert

    counts = convert(Path(args.src), Path(args.out), args.trust_pickle, progress=not args.no_progress)
    for split, n in counts.items():
        print(f"converted {split}: {n} samples -> {Path(args.out)}")
    return 0
