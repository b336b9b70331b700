"""`hpcbench datagen WORKLOAD --out DIR ...`: synthetic data in the workload's real format."""
from __future__ import annotations

import argparse
import os

from hpcbench import registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", help=f"one of: {', '.join(registry.names())}")
    parser.add_argument("rest", nargs=argparse.REMAINDER,
                        help="workload options; see `hpcbench datagen WORKLOAD --help`")


def workload_parser(name: str) -> argparse.ArgumentParser:
    cls = registry.datagen(name)
    p = argparse.ArgumentParser(prog=f"hpcbench datagen {name}",
                                description=f"Write synthetic {name} data in the real on-disk format.")
    p.add_argument("--out", required=True, help="output directory; the workload's dataset layout is created in it (see docs/<workload>.md)")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same files")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes to use")
    cls.add_datagen_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    cls = registry.datagen(args.workload)
    ns = workload_parser(args.workload).parse_args(args.rest)
    cls.datagen(ns)
    return 0
